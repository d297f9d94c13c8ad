# Copyright: gpuops.k8s contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)

"""Edits of container runtime configuration files for the nvidia runtime (private to gpuops.k8s).

Everything here works on text in and text out, so the module, the unit and property tests and the
benchmark share one implementation, and the module alone owns the file system.

TOML files are edited with tomlkit, not parsed into plain dicts and dumped again: tomlkit keeps
comments, key order, quoting and indentation of everything it is not asked to change, and an
operator's hand-written containerd config is mostly comments. tomlkit >= 0.11 is required (Debian 12
ships 0.11.7); older releases lack ``unwrap()`` and explicit super tables.

Where the previous default runtime is remembered: in TOML files, as a comment on the default-runtime
line that ``present`` writes (``# gpuops.k8s.nvidia_runtime: previous default "runc"``), which
``absent`` reads back. JSON has no comments and Docker rejects unknown keys, so for Docker the same
facts live in a small state document that the module keeps next to daemon.json.
"""

from __future__ import annotations

import copy
import json
import re
import traceback

try:
    import tomlkit
    from tomlkit.exceptions import ParseError as TomlParseError
    from tomlkit.items import AoT, InlineTable, Table

    HAS_TOMLKIT = True
    TOMLKIT_IMPORT_ERROR = None
    TOMLKIT_VERSION = getattr(tomlkit, "__version__", "0")
except ImportError:
    HAS_TOMLKIT = False
    TOMLKIT_IMPORT_ERROR = traceback.format_exc()
    TOMLKIT_VERSION = None

MIN_TOMLKIT = (0, 11)
MARKER = "gpuops.k8s.nvidia_runtime"
RUNC_SHIM = "io.containerd.runc.v2"
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
MINIMAL_CONTAINERD_CONFIG = "version = 2\n"

_MARKER_RE = re.compile(
    r"gpuops\.k8s\.nvidia_runtime: previous default (?P<value>\"(?:[^\"\\]|\\.)*\"|unset)(?P<added>; table added)?"
)
_PARSE_POSITION_RE = re.compile(r"\s+at line \d+ col \d+\s*$")


class ConfigError(Exception):
    """The input cannot be edited safely; the message is one sentence for the user."""


class EditResult:
    """The outcome of one edit: the new text and what the nvidia runtime looks like in it."""

    def __init__(self, text, changed, runtime_entry, default_runtime, config_version=None, state_doc=None):
        self.text = text
        self.changed = changed
        self.runtime_entry = runtime_entry
        self.default_runtime = default_runtime
        self.config_version = config_version
        # Docker only: the state document kept next to daemon.json (None: there should be none).
        self.state_doc = state_doc


def tomlkit_too_old():
    """True when the importable tomlkit predates the features this code relies on."""
    if not HAS_TOMLKIT:
        return False
    parts = []
    for piece in str(TOMLKIT_VERSION).split(".")[:2]:
        digits = re.match(r"\d+", piece)
        parts.append(int(digits.group(0)) if digits else 0)
    return tuple(parts) < MIN_TOMLKIT


# ---------------------------------------------------------------------------------------------
# TOML helpers


def parse_toml(text, source):
    try:
        return tomlkit.parse(text)
    except TomlParseError as exc:
        reason = _PARSE_POSITION_RE.sub("", str(exc))
        raise ConfigError(
            "{0} is not valid TOML: line {1}, column {2}: {3}.".format(source, exc.line, exc.col, reason)
        ) from None


def _plain(item):
    """A plain Python value (dicts, lists, scalars) for a tomlkit item or container."""
    if hasattr(item, "unwrap"):
        return item.unwrap()
    return item


def _dotted(parts):
    return ".".join(json.dumps(p) if not re.match(r"^[A-Za-z0-9_-]+$", p) else p for p in parts)


def _is_table(value):
    return isinstance(value, (dict, Table, InlineTable)) or type(value).__name__ == "OutOfOrderTableProxy"


def _child_table(parent, key, create, explicit, source, path_parts):
    """The sub-table ``key`` of ``parent``; created (a super table unless ``explicit``) when asked."""
    if key in parent:
        value = parent[key]
        if not _is_table(value) or isinstance(value, AoT):
            raise ConfigError(
                "{0}: {1} is a {2}, but a table was expected there.".format(
                    source, _dotted(path_parts), type(_plain(value)).__name__
                )
            )
        return value, False
    if not create:
        return None, False
    if isinstance(parent, InlineTable):
        table = tomlkit.inline_table()
    else:
        table = tomlkit.table(not explicit)
    parent[key] = table
    return parent[key], True


def _new_table(parent):
    return tomlkit.inline_table() if isinstance(parent, InlineTable) else tomlkit.table()


def _marker_comment(previous, table_added):
    value = "unset" if previous is None else json.dumps(previous)
    return "{0}: previous default {1}{2}".format(MARKER, value, "; table added" if table_added else "")


def _read_marker(item):
    """(found, previous default or None, table added) from the comment on a default-runtime line."""
    trivia = getattr(item, "trivia", None)
    comment = getattr(trivia, "comment", "") or ""
    match = _MARKER_RE.search(comment)
    if not match:
        return False, None, False
    value = match.group("value")
    previous = None if value == "unset" else json.loads(value)
    return True, previous, bool(match.group("added"))


def _comment_without_marker(item):
    """The comment on an item's line with this module's marker (and what follows it) taken out."""
    trivia = getattr(item, "trivia", None)
    comment = getattr(trivia, "comment", "") or ""
    at = comment.find(MARKER)
    if at < 0:
        return comment
    kept = comment[:at].rstrip()
    if kept.endswith("#"):
        kept = kept[:-1].rstrip()
    return kept


def _prune_empty_super_tables(chain):
    """Remove tables on ``chain`` (parent, key) pairs, deepest first, that are empty and implicit.

    An implicit ("super") table has no header of its own in the file, so once empty it stands for
    nothing; tables with their own header are the user's and stay.
    """
    for parent, key in reversed(chain):
        table = parent[key]
        if isinstance(table, Table) and len(table) == 0 and table.is_super_table():
            del parent[key]
        else:
            break


def _edit_toml_runtime(doc, source, parent_parts, default_key, name, state, set_as_default, entry_ops):
    """Shared edit of ``<parent_parts>.runtimes.<name>`` and ``<parent_parts>.<default_key>``.

    ``entry_ops`` supplies the runtime-specific pieces: ``check(entry)`` raises ConfigError when an
    existing entry belongs to something else, ``build(runtimes)`` returns a new entry, and
    ``update(entry, runtimes)`` brings an existing compatible entry up to date.
    """
    create = state == "present"
    chain = []
    parent = doc
    parent_created = False
    for depth, key in enumerate(parent_parts):
        is_last = depth == len(parent_parts) - 1
        table, created = _child_table(
            parent, key, create, explicit=is_last and set_as_default, source=source, path_parts=parent_parts[: depth + 1]
        )
        if table is None:
            return  # absent: nothing of ours can be there
        chain.append((parent, key))
        parent = table
        parent_created = created
    runtime_parent = parent

    runtimes, _ = _child_table(
        runtime_parent, "runtimes", create, explicit=False, source=source, path_parts=[*parent_parts, "runtimes"]
    )
    entry = runtimes.get(name) if runtimes is not None else None
    entry_path = [*parent_parts, "runtimes", name]
    if entry is not None:
        if not _is_table(entry):
            raise ConfigError("{0}: {1} is not a table.".format(source, _dotted(entry_path)))
        entry_ops.check(_plain(entry))

    current_default = _plain(runtime_parent.get(default_key)) if default_key in runtime_parent else None

    if state == "present":
        if entry is None:
            runtimes[name] = entry_ops.build(runtimes)
        else:
            entry_ops.update(entry, runtimes)
        if set_as_default and current_default != name:
            user_comment = ""
            if default_key in runtime_parent:
                user_comment = _comment_without_marker(runtime_parent[default_key])
            runtime_parent[default_key] = name
            item = runtime_parent[default_key]
            marker = _marker_comment(current_default, parent_created)
            if user_comment:
                # Keep the operator's own comment on that line; the marker goes after it.
                item.trivia.comment = "{0} # {1}".format(user_comment, marker)
            else:
                item.comment(marker)
        return

    # absent
    if runtimes is not None and name in runtimes:
        del runtimes[name]
        _prune_empty_super_tables([*chain, (runtime_parent, "runtimes")])
    if current_default == name:
        found, previous, table_added = _read_marker(runtime_parent[default_key])
        if not found:
            # Set by someone else: fall back to the runtime every install has rather than leave
            # the default pointing at a runtime that no longer exists.
            previous = entry_ops.fallback_default
        if previous is None:
            del runtime_parent[default_key]
            if table_added and len(runtime_parent) == 0:
                grand_parent, key = chain[-1]
                del grand_parent[key]
                _prune_empty_super_tables(chain[:-1])
        else:
            runtime_parent[default_key] = previous
            item = runtime_parent[default_key]
            user_comment = _comment_without_marker(item)
            item.trivia.comment = user_comment
            if not user_comment:
                item.trivia.comment_ws = ""


def _toml_effective(doc, parent_parts, default_key, name):
    node = _plain(doc)
    for key in parent_parts:
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return None, None
    runtimes = node.get("runtimes")
    entry = runtimes.get(name) if isinstance(runtimes, dict) else None
    return entry, node.get(default_key)


# ---------------------------------------------------------------------------------------------
# containerd


class _ContainerdEntry:
    fallback_default = None  # containerd's own default runtime name is "runc"

    def __init__(self, source, name, runtime_path, entry_path):
        self.source = source
        self.name = name
        self.runtime_path = runtime_path
        self.entry_path = entry_path

    def check(self, entry):
        runtime_type = entry.get("runtime_type")
        options = entry.get("options") if isinstance(entry.get("options"), dict) else {}
        binary = options.get("BinaryName")
        if runtime_type not in (None, "", RUNC_SHIM) or binary not in (None, "", self.runtime_path):
            raise ConfigError(
                "{0} already has a runtime {1} with runtime_type {2} and BinaryName {3}, which is not the "
                "nvidia runtime at {4}; choose another runtime_name or remove that entry first.".format(
                    self.source, _dotted(self.entry_path), json.dumps(runtime_type), json.dumps(binary),
                    self.runtime_path,
                )
            )

    @staticmethod
    def _runc(runtimes):
        runc = runtimes.get("runc") if runtimes is not None else None
        return _plain(runc) if _is_table(runc) else {}

    def build(self, runtimes):
        runc = self._runc(runtimes)
        entry = _new_table(runtimes)
        entry["runtime_type"] = RUNC_SHIM
        # Inherit everything runc is configured with (privileged_without_host_devices, base spec,
        # cgroup driver...) so GPU pods behave like every other pod on the node.
        for key, value in runc.items():
            if key not in ("runtime_type", "options"):
                entry[key] = copy.deepcopy(value)
        options = _new_table(entry)
        runc_options = runc.get("options") if isinstance(runc.get("options"), dict) else {}
        for key, value in runc_options.items():
            if key != "BinaryName":
                options[key] = copy.deepcopy(value)
        options["BinaryName"] = self.runtime_path
        entry["options"] = options
        return entry

    def update(self, entry, runtimes):
        if _plain(entry.get("runtime_type")) != RUNC_SHIM:
            entry["runtime_type"] = RUNC_SHIM
        options = entry.get("options")
        if options is None:
            entry["options"] = _new_table(entry)
            options = entry["options"]
        if _plain(options.get("BinaryName")) != self.runtime_path:
            options["BinaryName"] = self.runtime_path
        # The cgroup driver has to match the kubelet's: follow runc when it says which one.
        runc_options = self._runc(runtimes).get("options")
        if isinstance(runc_options, dict) and "SystemdCgroup" in runc_options:
            if _plain(options.get("SystemdCgroup")) != runc_options["SystemdCgroup"]:
                options["SystemdCgroup"] = runc_options["SystemdCgroup"]


def containerd_version(doc, source):
    if "version" not in doc:
        raise ConfigError(
            "{0} has no top-level version key, which containerd reads as config version 1; "
            "this module edits versions 2 and 3 only (convert it with `containerd config migrate`).".format(source)
        )
    version = _plain(doc["version"])
    if isinstance(version, bool) or version not in CRI_PLUGIN:
        raise ConfigError(
            "{0} declares containerd config version {1}; this module edits versions 2 and 3 only.".format(
                source, json.dumps(version)
            )
        )
    return version


def edit_containerd(text, source, name, runtime_path, set_as_default, state):
    doc = parse_toml(text, source)
    version = containerd_version(doc, source)
    parent_parts = ["plugins", CRI_PLUGIN[version], "containerd"]
    ops = _ContainerdEntry(source, name, runtime_path, [*parent_parts, "runtimes", name])
    _edit_toml_runtime(doc, source, parent_parts, "default_runtime_name", name, state, set_as_default, ops)
    new_text = tomlkit.dumps(doc)
    entry, default = _toml_effective(doc, parent_parts, "default_runtime_name", name)
    return EditResult(new_text, new_text != text, entry, default or "runc", config_version=version)


# ---------------------------------------------------------------------------------------------
# CRI-O


class _CrioEntry:
    fallback_default = None  # CRI-O's built-in default (crun or runc, per build) applies

    def __init__(self, source, name, runtime_path, entry_path):
        self.source = source
        self.name = name
        self.runtime_path = runtime_path
        self.entry_path = entry_path

    def check(self, entry):
        runtime_type = entry.get("runtime_type")
        path = entry.get("runtime_path")
        if runtime_type not in (None, "", "oci") or path not in (None, "", self.runtime_path):
            raise ConfigError(
                "{0} already has a runtime {1} with runtime_type {2} and runtime_path {3}, which is not the "
                "nvidia runtime at {4}; choose another runtime_name or remove that entry first.".format(
                    self.source, _dotted(self.entry_path), json.dumps(runtime_type), json.dumps(path),
                    self.runtime_path,
                )
            )

    def build(self, runtimes):
        entry = _new_table(runtimes)
        entry["runtime_path"] = self.runtime_path
        entry["runtime_type"] = "oci"
        return entry

    def update(self, entry, runtimes):
        if _plain(entry.get("runtime_path")) != self.runtime_path:
            entry["runtime_path"] = self.runtime_path
        if _plain(entry.get("runtime_type")) != "oci":
            entry["runtime_type"] = "oci"


def edit_crio(text, source, name, runtime_path, set_as_default, state):
    doc = parse_toml(text, source)
    parent_parts = ["crio", "runtime"]
    ops = _CrioEntry(source, name, runtime_path, [*parent_parts, "runtimes", name])
    _edit_toml_runtime(doc, source, parent_parts, "default_runtime", name, state, set_as_default, ops)
    new_text = tomlkit.dumps(doc)
    entry, default = _toml_effective(doc, parent_parts, "default_runtime", name)
    return EditResult(new_text, new_text != text, entry, default)


# ---------------------------------------------------------------------------------------------
# Docker


def detect_json_indent(text):
    """The indentation unit of a pretty-printed JSON document, or None when there is none to see."""
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and stripped != line:
            lead = line[: len(line) - len(stripped)]
            return "\t" if lead.startswith("\t") else " " * len(lead)
    return None


def dump_docker(data, indent):
    return json.dumps(data, indent=indent if indent is not None else 4, ensure_ascii=False) + "\n"


def parse_docker(text, source):
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        line = getattr(exc, "lineno", "?")
        column = getattr(exc, "colno", "?")
        reason = getattr(exc, "msg", str(exc))
        raise ConfigError(
            "{0} is not valid JSON: line {1}, column {2}: {3}.".format(source, line, column, reason)
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            "{0} must hold a JSON object at the top level, but it holds a {1}.".format(
                source, {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(data), "number")
            )
        )
    return data


def edit_docker(text, source, name, runtime_path, set_as_default, state, state_doc=None):
    """Edit daemon.json. ``state_doc`` is what the module remembered from its last ``present``."""
    data = parse_docker(text, source)
    new = copy.deepcopy(data)
    memo = dict(state_doc or {})
    runtimes = new.get("runtimes")
    if runtimes is not None and not isinstance(runtimes, dict):
        raise ConfigError("{0}: the runtimes key must be a JSON object.".format(source))
    entry = runtimes.get(name) if runtimes else None
    if entry is not None:
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or path not in (None, "", runtime_path):
            raise ConfigError(
                "{0} already has a runtime runtimes.{1} with path {2}, which is not the nvidia runtime at {3}; "
                "choose another runtime_name or remove that entry first.".format(
                    source, name, json.dumps(path), runtime_path
                )
            )
    current_default = new.get("default-runtime")

    if state == "present":
        if runtimes is None:
            new["runtimes"] = runtimes = {}
            memo["added_runtimes"] = True
        if entry is None:
            # "args" is the key nvidia-ctk writes, so entries it made compare equal to ours.
            runtimes[name] = {"path": runtime_path, "args": []}
        elif entry.get("path") != runtime_path:
            entry["path"] = runtime_path
        if set_as_default and current_default != name:
            memo["previous_default_runtime"] = current_default
            new["default-runtime"] = name
    else:
        if runtimes is not None and name in runtimes:
            del runtimes[name]
            if not runtimes and memo.get("added_runtimes"):
                del new["runtimes"]
        if current_default == name:
            previous = memo.get("previous_default_runtime")
            if previous is None:
                del new["default-runtime"]
            else:
                new["default-runtime"] = previous
        memo = {}

    new_state_doc = memo or None
    if new == data:
        new_text = text
    else:
        new_text = dump_docker(new, detect_json_indent(text))
    effective_entry = (new.get("runtimes") or {}).get(name)
    return EditResult(
        new_text,
        new_text != text,
        effective_entry,
        new.get("default-runtime", "runc"),
        state_doc=new_state_doc,
    )


EDITORS = {"containerd": edit_containerd, "crio": edit_crio}
