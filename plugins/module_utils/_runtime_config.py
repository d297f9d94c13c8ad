# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

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
import glob
import json
import os
import re
import traceback

try:
    import tomlkit
    from tomlkit.exceptions import ParseError as TomlParseError
    from tomlkit.items import AoT, InlineTable, Null, String, StringType, Table, Whitespace

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
RUNC_MARKER = MARKER + ": containerd's built-in runc, listed so that it stays"

_MARKER_RE = re.compile(
    r"gpuops\.k8s\.nvidia_runtime: previous default (?P<value>\"(?:[^\"\\]|\\.)*\"|unset)(?P<added>; table added)?"
)
_PARSE_POSITION_RE = re.compile(r"\s+at line \d+ col \d+\s*$")


class ConfigError(Exception):
    """The input cannot be edited safely; the message is one sentence for the user."""


class EditResult:
    """The outcome of one edit: the new text and what the nvidia runtime looks like in it."""

    def __init__(
        self, text, changed, runtime_entry, default_runtime, config_version=None, state_doc=None, imports=None
    ):
        self.text = text
        self.imports = imports  # containerd: the file's imports list, if any
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
            f"{source} could not be parsed as TOML: line {exc.line}, column {exc.col}: {reason}."
        ) from None
    except Exception as exc:  # tomlkit raises other errors on some layouts it cannot represent
        raise ConfigError(f"{source} could not be parsed as TOML: {exc}.") from None


def _finish_toml(doc, text, before, after):
    """The new text, and whether the meaning changed.

    tomlkit reproduces nearly every file verbatim, but not all (e.g. indented sibling headers under
    an implicit parent gain indentation). A run that changes no key or value therefore returns the
    original text untouched instead of tomlkit's rendering, which keeps second runs idempotent.
    """
    if after == before:
        return text, False
    return tomlkit.dumps(doc), True


def _dotted(parts):
    return ".".join(json.dumps(p) if not re.match(r"^[A-Za-z0-9_-]+$", p) else p for p in parts)


def _parts(value):
    """The concrete tables behind a table value, or None when the value is not a table.

    A table whose sub-tables are spread over the file (``[a.b]``, then ``[c]``, then ``[a.d]``) comes
    back from tomlkit as one merged view that is meant for reading; writes have to go to the real
    table that holds (or should hold) the key, so every lookup here works on the list of those.
    """
    if isinstance(value, (Table, InlineTable)):
        return [value]
    if type(value).__name__ == "OutOfOrderTableProxy":
        return list(value._tables)
    return None


class _Node:
    """A concrete table and where it hangs (to remove it again)."""

    def __init__(self, table, parent=None, key=None):
        self.table = table
        self.parent = parent
        self.key = key


def _descend(nodes, key, source, path_parts):
    found = []
    for node in nodes:
        if key not in node.table:
            continue
        parts = _parts(node.table[key])
        if parts is None:
            raise ConfigError(
                f"{source}: {_dotted(path_parts)} is a {type(_plain(node.table[key])).__name__}, "
                "but a table was expected there."
            )
        found.extend(_Node(part, node, key) for part in parts)
    return found


def _create(node, key, explicit):
    table = tomlkit.inline_table() if isinstance(node.table, InlineTable) else tomlkit.table(not explicit)
    node.table[key] = table
    created = node.table[key]
    if _is_super(created):
        # tomlkit gives a table added after other items a newline of its own; one without a header
        # would write it in front of the first table under it, which gets its own lead (_lead).
        created.trivia.indent = ""
    return _Node(created, node, key)


def _holding(nodes, key):
    """The node among ``nodes`` that holds ``key``, else None."""
    for node in nodes:
        if key in node.table:
            return node
    return None


def _set_value(nodes, key, value):
    """Set ``key`` where it already is (or in the first table); True when something changed."""
    node = _holding(nodes, key) or nodes[0]
    if key in node.table and _plain(node.table[key]) == value:
        return False
    node.table[key] = value
    return True


def _plain(item):
    """A plain Python value (dicts, lists, scalars) for a tomlkit item or container."""
    if hasattr(item, "unwrap"):
        return item.unwrap()
    return item


def _plain_at(data, parts):
    """The value at ``parts`` in plain data (unwrapped once per edit: unwrapping a large document is slow)."""
    node = data
    for key in parts:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _new_table(parent):
    return tomlkit.inline_table() if isinstance(parent, InlineTable) else tomlkit.table()


def _marker_comment(previous, table_added):
    value = "unset" if previous is None else json.dumps(previous)
    return "{}: previous default {}{}".format(MARKER, value, "; table added" if table_added else "")


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


def _edit_toml_runtime(
    doc, data, source, parent_parts, default_key, name, state, set_as_default, entry_ops, blank_lines
):
    """Shared edit of ``<parent_parts>.runtimes.<name>`` and ``<parent_parts>.<default_key>``.

    ``entry_ops`` supplies the runtime-specific pieces: ``check(entry)`` raises ConfigError when an
    existing entry belongs to something else, ``build(template, inline)`` returns a new entry, and
    ``update(entry_nodes, template)`` brings an existing compatible entry up to date. Implicit tables
    that end up empty need no pruning: tomlkit writes nothing for them.
    """
    present = state == "present"
    nodes = [_Node(doc)]
    created_parent = False
    created_table = None
    for depth, key in enumerate(parent_parts):
        found = _descend(nodes, key, source, parent_parts[: depth + 1])
        if not found:
            if not present:
                return
            explicit = depth == len(parent_parts) - 1 and set_as_default
            found = [_create(nodes[0], key, explicit)]
            created_parent = explicit
            created_table = found[0].table if explicit else None
            if explicit:
                _plain_blank_lines(found[0].table, blank_lines, _after_blank(doc, found[0].table))
        nodes = found
    parent_nodes = nodes

    runtimes_path = [*parent_parts, "runtimes"]
    runtimes_nodes = _descend(parent_nodes, "runtimes", source, runtimes_path)
    entry_path = [*runtimes_path, name]
    entry_nodes = _descend(runtimes_nodes, name, source, entry_path)
    entry = _plain_at(data, entry_path)
    if entry is not None:
        entry_ops.check(entry)
    template = _plain_at(data, [*runtimes_path, entry_ops.template_name])
    template = template if isinstance(template, dict) else {}
    default_node = _holding(parent_nodes, default_key)
    current_default = _plain(default_node.table[default_key]) if default_node else None

    if present:
        if entry is None:
            if not runtimes_nodes:
                runtimes_nodes = [_create(_holding(parent_nodes, default_key) or parent_nodes[0], "runtimes", False)]
            home = (entry_ops.template_name and _holding(runtimes_nodes, entry_ops.template_name)) or runtimes_nodes[0]
            home.table[name] = entry_ops.build(template, isinstance(home.table, InlineTable))
            model = _layout_model(home.table, name, entry_ops.template_name)
            if isinstance(home.table[name], Table):
                after_blank = _after_blank(doc, home.table[name])
                if model is not None:
                    _layout_like(home.table[name], model, blank_lines, after_blank)
                else:
                    _plain_blank_lines(home.table[name], blank_lines, after_blank)
            added = home.table[name]
        else:
            added = None
            entry_ops.update(entry_nodes, template)
        if set_as_default and current_default != name:
            if default_node is None:
                default_node = next((n for n in parent_nodes if not _is_super(n.table)), parent_nodes[0])
            user_comment = _comment_without_marker(default_node.table[default_key]) if current_default else ""
            quoting = default_node.table[default_key] if current_default is not None else None
            # A key added in front of sub-tables makes tomlkit put a blank line before the next
            # one; the file's own tables keep their layout.
            layout = [(t, t.trivia.indent) for t in _in_order(default_node.table) if isinstance(t, Table)]
            default_node.table[default_key] = _string_like(name, quoting)
            for table, indent in layout:
                table.trivia.indent = indent
            item = default_node.table[default_key]
            if current_default is None:
                _indent_like_siblings(default_node.table, item)
            marker = _marker_comment(current_default, created_parent)
            if user_comment:
                # Keep the operator's own comment on that line; the marker goes after it.
                item.trivia.comment = f"{user_comment} # {marker}"
            elif hasattr(item, "comment"):
                item.comment(marker)
        if isinstance(added, Table):
            _end_like_start(doc, created_table if created_table is not None else added, added)
        return

    # Whether the block `present` added (the table it created for the default, or the entry alone)
    # ends with a blank line: decided before the entry goes, as the block's end is the entry's end.
    table_ends_blank = None
    if current_default == name:
        holder_table = default_node.parent.table[default_node.key] if default_node.parent else None
        if isinstance(holder_table, Table):
            table_ends_blank = _ends_blank(holder_table)
    for node in runtimes_nodes:
        if name in node.table:
            _drop_separator(doc, node.table[name])
            del node.table[name]
    if current_default == name:
        found, previous, table_added = _read_marker(default_node.table[default_key])
        if not found:
            # Set by someone else: fall back to the runtime's built-in default rather than leave
            # the default pointing at a runtime that no longer exists.
            previous = None
        if previous is None:
            del default_node.table[default_key]
            holder = default_node.parent
            if table_added and _holds_nothing(default_node.table) and len(_parts(holder.table[default_node.key])) == 1:
                _drop_separator(doc, holder.table[default_node.key], table_ends_blank)
                del holder.table[default_node.key]
        else:
            default_node.table[default_key] = _string_like(previous, default_node.table[default_key])
            item = default_node.table[default_key]
            user_comment = _comment_without_marker(item)
            item.trivia.comment = user_comment
            if not user_comment:
                item.trivia.comment_ws = ""


def _holds_nothing(table):
    """True when a table has no keys other than implicit tables that are themselves empty."""
    return all(_is_super(value) and _holds_nothing(value) for value in table.values())


def _indent_like_siblings(table, item):
    """Give a new key the indentation of the table's other keys (cosmetic; containerd indents)."""
    for _key, value in table.value.body:
        trivia = getattr(value, "trivia", None)
        if value is not item and trivia is not None and not isinstance(value, (Table, AoT)) and trivia.indent:
            item.trivia.indent = trivia.indent
            return


def _is_literal(item):
    """True for a single-quoted string item (tomlkit 0.11 keeps the kind in ``_t``, later ones in ``type``)."""
    kind = getattr(item, "type", None) or getattr(item, "_t", None)
    return isinstance(item, String) and kind == StringType.SLL


def _string_like(value, model):
    """``value`` quoted the way the string item ``model`` is (containerd 2.x writes 'single quotes')."""
    literal = _is_literal(model)
    if literal and isinstance(value, str) and all(c.isprintable() and c != "'" for c in value):
        return String.from_raw(value, StringType.SLL)
    return value


def _horizontal(indent):
    """The part of an indent on the item's own line (what precedes it may hold blank lines)."""
    return indent[indent.rfind("\n") + 1 :]


def _layout_model(runtimes, name, template_name):
    """The existing runtime table a new one should look like: the template (runc), else a sibling."""
    candidates = [template_name] if template_name else []
    candidates += [key for key in runtimes if key != name]
    for key in candidates:
        if key in runtimes and isinstance(runtimes[key], Table):
            return runtimes[key]
    return None


def _blank_before_tables(text):
    """Whether the file puts a blank line before table headers at a given indent (a function of it)."""

    def blank_before(indent):
        return re.search(r"\n[ \t]*\n" + re.escape(indent) + r"\[", text) is not None

    return blank_before


def _ends_blank(table):
    """True when the last thing a table (with its sub-tables) writes is a blank line."""
    written = [item for _key, item in table.value.body if not _writes_nothing(item)]
    last = written[-1] if written else None
    if isinstance(last, Table):
        return _ends_blank(last)
    return isinstance(last, Whitespace)


def _in_order(container):
    """Every item of a document or table, in the order tomlkit writes them (sub-tables in place)."""
    for _key, item in container.value.body if isinstance(container, Table) else container.body:
        yield item
        if isinstance(item, Table):
            yield from _in_order(item)


def _last_table(table):
    """The table a table's block ends with: itself, or its last sub-table's last sub-table, and so on."""
    while table.value.body and isinstance(table.value.body[-1][1], Table):
        table = table.value.body[-1][1]
    return table


def _end_like_start(doc, first, last):
    """Give a block of new tables (``first`` .. ``last``) a blank line at its end when one precedes it.

    tomlkit puts the new block right after that blank line, which separated what precedes from
    what follows; ending the block with one keeps what follows separated, and ``absent`` (see
    ``_drop_separator``) then removes exactly the block again.
    """
    previous = _previous_item(doc, first)
    if not (isinstance(previous, Whitespace) and previous.as_string().endswith("\n")):
        return
    last = _last_table(last)
    if not (last.value.body and isinstance(last.value.body[-1][1], Whitespace)):
        last.value.append(None, tomlkit.ws("\n"))


def _previous_item(doc, target):
    """The item written just before ``target`` (implicit tables write nothing themselves)."""
    previous = None
    for item in _in_order(doc):
        if item is target:
            return previous
        if not _is_super(item) and not _writes_nothing(item):
            previous = item
    return None


def _writes_nothing(item):
    """What a deleted item leaves behind, and whitespace that _drop_separator emptied."""
    return isinstance(item, Null) or (isinstance(item, Whitespace) and not item.as_string())


def _drop_separator(doc, table, ends_blank=None):
    """Before ``table`` goes: drop the blank line that only separated it from what precedes it.

    A table added after others in a file that separates tables by blank lines starts with one;
    read back, tomlkit files that blank line under whatever precedes the table, so deleting the
    table alone would leave it behind. When the table does not itself end with a blank line (then
    the one before it separated it from what came first), one blank line before it goes with it.
    """
    if not isinstance(table, Table) or (_ends_blank(table) if ends_blank is None else ends_blank):
        return
    previous = _previous_item(doc, table)
    if isinstance(previous, Whitespace) and previous.as_string().endswith("\n"):
        # Shortened in place: taking the item out of its container would shift tomlkit's key index.
        previous._s = previous.as_string()[:-1]


def _after_blank(doc, table):
    """True when a blank line is written just before ``table``."""
    previous = _previous_item(doc, table)
    return isinstance(previous, Whitespace) and previous.as_string().endswith("\n")


def _lead(header, blank_lines, after_blank):
    """A new header's indent: a blank line first where the file has them at that indent (once)."""
    return ("\n" if blank_lines(header) and not after_blank else "") + header


def _plain_blank_lines(table, blank_lines, after_blank):
    """A new table without a model: blank lines before its headers as the file has them."""
    table.trivia.indent = _lead(_horizontal(table.trivia.indent), blank_lines, after_blank)
    for _key, item in table.value.body:
        if isinstance(item, Table):
            _plain_blank_lines(item, blank_lines, False)


def _layout_like(new, model, blank_lines, after_blank, quoting=None):
    """Lay a new table out like ``model``: header and key indentation, blank lines, quoting.

    tomlkit writes a new table's header and keys at column 0 and knows nothing of the file's habits,
    so containerd's own configs (which indent each nesting level by two spaces) would get a block at
    column 0 between indented siblings. Setting the items' trivia here, rather than post-processing
    the rendered text, keeps tomlkit the only writer of TOML syntax; ``Table.indent()`` is not used
    because it only knows spaces and adds to the existing indent instead of setting it.
    """
    header = _horizontal(model.trivia.indent)
    # tomlkit starts a new table with a newline (0.15: unless a blank line precedes it; 0.11:
    # always); decided here instead, by what the file does at this indent.
    new.trivia.indent = _lead(header, blank_lines, after_blank)
    model_items = [(key, value) for key, value in model.value.body if key is not None]
    key_indent = next((_horizontal(v.trivia.indent) for _k, v in model_items if not isinstance(v, (Table, AoT))), None)
    if key_indent is None:
        key_indent = header + "  " if header else ""
    model_by_key = {str(key): value for key, value in model_items}
    # New strings are quoted like the model's (or, without strings there, like its parent's).
    quoting = next((v for _k, v in model_items if isinstance(v, String)), quoting)
    for key, value in list(new.value.body):
        if key is None or isinstance(value, Whitespace):
            continue
        if isinstance(value, Table):
            sub_model = model_by_key.get(str(key))
            if not isinstance(sub_model, Table):
                # No such table in the model: one level deeper than the model's keys.
                step = key_indent[len(header) :] if key_indent.startswith(header) else ""
                sub_model = _FakeModel(key_indent, key_indent + step)
            _layout_like(value, sub_model, blank_lines, False, quoting)
            continue
        if isinstance(value, AoT):
            continue
        value.trivia.indent = key_indent
        like = model_by_key.get(str(key))
        if not isinstance(like, String):
            like = quoting
        if isinstance(value, String) and _is_literal(like):
            replacement = _string_like(str(value), like)
            if isinstance(replacement, String):
                new[str(key)] = replacement  # replaced where it stands
                new[str(key)].trivia.indent = key_indent


class _FakeModel:
    """Stands in for a model table that does not exist (its layout only: header and key indent)."""

    def __init__(self, header, key_indent):
        self.trivia = type("Trivia", (), {"indent": header})()
        item = tomlkit.item(0)  # not a string: says nothing about quoting
        item.trivia.indent = key_indent
        self.value = type("Body", (), {"body": [("x", item)]})()


def _is_super(table):
    return isinstance(table, Table) and table.is_super_table()


def _toml_effective(data, parent_parts, default_key, name):
    node = _plain_at(data, parent_parts)
    if not isinstance(node, dict):
        return None, None
    runtimes = node.get("runtimes")
    entry = runtimes.get(name) if isinstance(runtimes, dict) else None
    return entry, node.get(default_key)


# ---------------------------------------------------------------------------------------------
# containerd


class _ContainerdEntry:
    template_name = "runc"

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
                f"{self.source} already has a runtime {_dotted(self.entry_path)} with runtime_type "
                f"{json.dumps(runtime_type)} and BinaryName {json.dumps(binary)}, which is not the "
                f"nvidia runtime at {self.runtime_path}; choose another runtime_name or remove that entry first."
            )

    def build(self, runc, inline):
        entry = tomlkit.inline_table() if inline else tomlkit.table()
        entry["runtime_type"] = RUNC_SHIM
        # Inherit everything runc is configured with (privileged_without_host_devices, base spec,
        # sandboxer...) so GPU pods behave like every other pod on the node.
        for key, value in runc.items():
            if key not in ("runtime_type", "options"):
                entry[key] = copy.deepcopy(value)
        options = tomlkit.inline_table() if inline else tomlkit.table()
        runc_options = runc.get("options") if isinstance(runc.get("options"), dict) else {}
        for key, value in runc_options.items():
            if key != "BinaryName":
                options[key] = copy.deepcopy(value)
        options["BinaryName"] = self.runtime_path
        entry["options"] = options
        return entry

    def update(self, entry_nodes, runc):
        _set_value(entry_nodes, "runtime_type", RUNC_SHIM)
        options_nodes = _descend(entry_nodes, "options", self.source, [*self.entry_path, "options"])
        if not options_nodes:
            options_nodes = [_create(entry_nodes[0], "options", True)]
        _set_value(options_nodes, "BinaryName", self.runtime_path)
        # The cgroup driver has to match the kubelet's: follow runc when it says which one.
        runc_options = runc.get("options")
        if isinstance(runc_options, dict) and "SystemdCgroup" in runc_options:
            _set_value(options_nodes, "SystemdCgroup", runc_options["SystemdCgroup"])


def containerd_version(doc, source):
    if "version" not in doc:
        raise ConfigError(
            f"{source} has no top-level version key, which containerd reads as config version 1; "
            "this module edits versions 2 and 3 only (convert it with `containerd config migrate`)."
        )
    version = _plain(doc["version"])
    if isinstance(version, bool) or version not in CRI_PLUGIN:
        raise ConfigError(
            f"{source} declares containerd config version {json.dumps(version)}; "
            "this module edits versions 2 and 3 only."
        )
    return version


class _BuiltinRuncEntry:
    """containerd's built-in runc, written out so that a version 2 file keeps it (see below)."""

    template_name = None

    def check(self, entry):
        """Only added where no runc is listed, so there is never an existing entry to check."""

    def build(self, _template, inline):
        entry = tomlkit.inline_table() if inline else tomlkit.table()
        entry["runtime_type"] = RUNC_SHIM
        return entry


def _keep_builtin_runc(doc, source, parent_parts, name, blank_lines):
    """List containerd's built-in runc in a version 2 file that listed no runtime before the edit.

    containerd 1.x reads a version 2 file's ``runtimes`` table in place of its built-in one, so the
    first runtime a file lists makes runc disappear: pods and RuntimeClasses asking for runc fail,
    and a default left at runc stops the CRI plugin from loading. The entry added here is what
    containerd had built in (the runc shim with its default options), right after ``name``'s and
    marked, so that ``absent`` takes it out again while it is the only other runtime listed.
    """
    runtimes_path = [*parent_parts, "runtimes"]
    entry = _holding(_runtime_nodes(doc, source, runtimes_path), name)
    entry = entry.table[name] if entry else None
    blank = None
    if isinstance(entry, Table):
        # The blank line that ends the new block moves behind runc, which joins the block.
        last = _last_table(entry)
        if last.value.body and isinstance(last.value.body[-1][1], Whitespace):
            blank = last.value.body.pop()[1]  # the last item: no key after it whose index could shift
    _edit_toml_runtime(
        doc,
        _plain(doc),
        source,
        parent_parts,
        "default_runtime_name",
        "runc",
        "present",
        False,
        _BuiltinRuncEntry(),
        blank_lines,
    )
    runc = _holding(_runtime_nodes(doc, source, runtimes_path), "runc").table["runc"]
    if blank is not None and isinstance(runc, Table):
        _last_table(runc).value.append(None, tomlkit.ws(blank.as_string()))
    if "runtime_type" in runc and hasattr(runc["runtime_type"], "comment"):
        runc["runtime_type"].comment(RUNC_MARKER)


def _runtime_nodes(doc, source, runtimes_path):
    nodes = [_Node(doc)]
    for depth, key in enumerate(runtimes_path):
        nodes = _descend(nodes, key, source, runtimes_path[: depth + 1])
    return nodes


def _drop_builtin_runc(doc, data, source, parent_parts, name):
    """Take out the runc entry ``_keep_builtin_runc`` added when, besides ``name``, it is the only runtime listed."""
    runtimes_path = [*parent_parts, "runtimes"]
    listed = _plain_at(data, runtimes_path)
    others = {key: value for key, value in listed.items() if key != name} if isinstance(listed, dict) else None
    if others != {"runc": {"runtime_type": RUNC_SHIM}}:
        return
    nodes = _runtime_nodes(doc, source, runtimes_path)
    runc = _holding(nodes, "runc").table["runc"]
    comment = getattr(getattr(runc["runtime_type"], "trivia", None), "comment", "") or ""
    if RUNC_MARKER not in comment:
        return
    _drop_separator(doc, runc)
    for node in nodes:
        if "runc" in node.table:
            del node.table["runc"]


def edit_containerd(text, source, name, runtime_path, set_as_default, state):
    doc = parse_toml(text, source)
    before = _plain(doc)
    version = containerd_version(doc, source)
    parent_parts = ["plugins", CRI_PLUGIN[version], "containerd"]
    ops = _ContainerdEntry(source, name, runtime_path, [*parent_parts, "runtimes", name])
    blank_lines = _blank_before_tables(text)
    listed = _plain_at(before, [*parent_parts, "runtimes"])
    # containerd 2.x (version 3) keeps its built-in runc next to the runtimes a file lists; 1.x does not.
    builtin_runc = version == 2 and name != "runc"
    if builtin_runc and state == "absent":
        _drop_builtin_runc(doc, before, source, parent_parts, name)
    _edit_toml_runtime(
        doc,
        before,
        source,
        parent_parts,
        "default_runtime_name",
        name,
        state,
        set_as_default,
        ops,
        blank_lines,
    )
    if builtin_runc and state == "present" and not listed:
        _keep_builtin_runc(doc, source, parent_parts, name, blank_lines)
    after = _plain(doc)
    new_text, changed = _finish_toml(doc, text, before, after)
    entry, default = _toml_effective(after, parent_parts, "default_runtime_name", name)
    imports = after.get("imports") if isinstance(after, dict) else None
    return EditResult(new_text, changed, entry, default or "runc", config_version=version, imports=imports)


def imports_overriding_cri(imports, config_version, config_path):
    """Imported files that define the version 2 CRI plugin section themselves.

    containerd 1.x merges an imported file's plugin sections over the main file's by replacing each
    whole section, so a runtime added to the main file has no effect when an import also carries
    ``plugins."io.containerd.grpc.v1.cri"``. (containerd 2.x merges them key by key.)
    """
    if config_version != 2 or not isinstance(imports, list):
        return []
    patterns = imports
    base = os.path.dirname(os.path.abspath(config_path))
    found = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            continue
        for imported in sorted(glob.glob(pattern if os.path.isabs(pattern) else os.path.join(base, pattern))):
            if os.path.abspath(imported) == os.path.abspath(config_path):
                continue
            try:
                with open(imported) as handle:
                    imported_data = _plain(tomlkit.parse(handle.read()))
            except Exception:
                continue
            plugins = imported_data.get("plugins")
            if isinstance(plugins, dict) and CRI_PLUGIN[2] in plugins:
                found.append(imported)
    return found


# ---------------------------------------------------------------------------------------------
# CRI-O


class _CrioEntry:
    template_name = None

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
                f"{self.source} already has a runtime {_dotted(self.entry_path)} with runtime_type "
                f"{json.dumps(runtime_type)} and runtime_path {json.dumps(path)}, which is not the "
                f"nvidia runtime at {self.runtime_path}; choose another runtime_name or remove that entry first."
            )

    def build(self, template, inline):
        entry = tomlkit.inline_table() if inline else tomlkit.table()
        entry["runtime_path"] = self.runtime_path
        entry["runtime_type"] = "oci"
        return entry

    def update(self, entry_nodes, template):
        _set_value(entry_nodes, "runtime_path", self.runtime_path)
        _set_value(entry_nodes, "runtime_type", "oci")


def edit_crio(text, source, name, runtime_path, set_as_default, state):
    doc = parse_toml(text, source)
    before = _plain(doc)
    parent_parts = ["crio", "runtime"]
    ops = _CrioEntry(source, name, runtime_path, [*parent_parts, "runtimes", name])
    _edit_toml_runtime(
        doc,
        before,
        source,
        parent_parts,
        "default_runtime",
        name,
        state,
        set_as_default,
        ops,
        _blank_before_tables(text),
    )
    after = _plain(doc)
    new_text, changed = _finish_toml(doc, text, before, after)
    entry, default = _toml_effective(after, parent_parts, "default_runtime", name)
    return EditResult(new_text, changed, entry, default)


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
        raise ConfigError(f"{source} is not valid JSON: line {line}, column {column}: {reason}.") from None
    if not isinstance(data, dict):
        raise ConfigError(
            "{} must hold a JSON object at the top level, but it holds a {}.".format(
                source, {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(data), "number")
            )
        )
    return data


# Docker's daemon.json is edited as text: json parses and validates it, and the edits below touch
# only the bytes of the members this module owns, so every other member keeps its exact spelling
# (inline arrays, spacing, key order, indentation, trailing newline).

_JSON_WS = " \t\n\r"


def _skip_ws(text, at):
    while at < len(text) and text[at] in _JSON_WS:
        at += 1
    return at


class _JsonObject:
    """Where an object's members sit in the text: (key, key start, value start, value end) each."""

    def __init__(self, text, start):
        self.start = start  # offset of "{"
        self.members = []
        decoder = json.JSONDecoder()
        at = _skip_ws(text, start + 1)
        if text[at] == "}":
            self.end = at + 1
            return
        while True:
            key, key_end = json.decoder.scanstring(text, at + 1)
            value_start = _skip_ws(text, _skip_ws(text, key_end) + 1)
            _value, value_end = decoder.raw_decode(text, value_start)
            self.members.append((key, at, value_start, value_end))
            at = _skip_ws(text, value_end)
            if text[at] == "}":
                self.end = at + 1
                return
            at = _skip_ws(text, at + 1)

    def find(self, key):
        """The last member named ``key`` (the one json reads), else None."""
        found = [member for member in self.members if member[0] == key]
        return found[-1] if found else None


def _line_indent(text, at):
    line_start = text.rfind("\n", 0, at) + 1
    line = text[line_start:at]
    return line[: len(line) - len(line.lstrip(" \t"))]


class _JsonStyle:
    """The file's own layout: indentation unit and separators, read from its top-level object."""

    def __init__(self, text, top):
        self.unit = detect_json_indent(text) or "    "
        self.kv_sep = ": "
        self.item_sep = ", "
        if top.members:
            _key, key_start, value_start, _value_end = top.members[0]
            key_end = json.decoder.scanstring(text, key_start + 1)[1]
            self.kv_sep = text[key_end:value_start]
            if len(top.members) > 1:
                self.item_sep = text[top.members[0][3] : top.members[1][1]]
                if "\n" in self.item_sep:
                    self.item_sep = ", " if " " in self.kv_sep else ","
            elif " " not in self.kv_sep:
                self.item_sep = ","

    def render(self, value, indent, multiline):
        if not multiline:
            return json.dumps(value, separators=(self.item_sep, self.kv_sep), ensure_ascii=False)
        rendered = json.dumps(value, indent=self.unit, separators=(",", self.kv_sep), ensure_ascii=False)
        return rendered.replace("\n", "\n" + indent)


def _json_insert(text, obj, key, value, style, own_indent):
    """Text with member ``key`` appended to the object ``obj`` (which lacks it)."""
    if obj.members:
        first_start, last_end = obj.members[0][1], obj.members[-1][3]
        multiline = "\n" in text[obj.start : first_start]
        if multiline:
            indent = _line_indent(text, first_start)
            lead = ",\n" + indent
        else:
            indent = ""
            lead = style.item_sep
        member = lead + json.dumps(key, ensure_ascii=False) + style.kv_sep + style.render(value, indent, multiline)
        return text[:last_end] + member + text[last_end:]
    multiline = "\n" in text or not text.strip() or text.strip() == "{}"
    if multiline:
        indent = own_indent + style.unit
        body = "\n" + indent + json.dumps(key, ensure_ascii=False) + style.kv_sep
        body += style.render(value, indent, True) + "\n" + own_indent
    else:
        body = json.dumps(key, ensure_ascii=False) + style.kv_sep + style.render(value, "", False)
    return text[: obj.start + 1] + body + text[obj.end - 1 :]


def _json_remove(text, obj, key):
    """Text without member ``key`` of ``obj``: the member and the comma that joined it go."""
    index = max(i for i, member in enumerate(obj.members) if member[0] == key)
    _key, key_start, _value_start, value_end = obj.members[index]
    if len(obj.members) == 1:
        return text[: obj.start + 1] + text[obj.end - 1 :]
    if index > 0:
        return text[: obj.members[index - 1][3]] + text[value_end:]
    return text[:key_start] + text[obj.members[1][1] :]


def _json_replace(text, obj, key, value, style):
    _key, key_start, value_start, value_end = obj.find(key)
    multiline = "\n" in text[value_start:value_end]
    return text[:value_start] + style.render(value, _line_indent(text, key_start), multiline) + text[value_end:]


def _json_top(text):
    """The top-level object of ``text`` (an empty or blank text reads as ``{}``)."""
    if not text.strip():
        text = "{}\n"
    return text, _JsonObject(text, _skip_ws(text, 0))


def _json_set(text, path, value):
    """Text with the value at ``path`` (a list of keys) set, creating the last member if needed."""
    text, top = _json_top(text)
    style = _JsonStyle(text, top)
    obj, own_indent = top, _line_indent(text, top.start)
    for key in path[:-1]:
        member = obj.find(key)
        own_indent = _line_indent(text, member[1])
        obj = _JsonObject(text, member[2])
    if obj.find(path[-1]) is not None:
        return _json_replace(text, obj, path[-1], value, style)
    return _json_insert(text, obj, path[-1], value, style, own_indent)


def _json_delete(text, path):
    text, top = _json_top(text)
    obj = top
    for key in path[:-1]:
        obj = _JsonObject(text, obj.find(key)[2])
    return _json_remove(text, obj, path[-1])


def edit_docker(text, source, name, runtime_path, set_as_default, state, state_doc=None):
    """Edit daemon.json. ``state_doc`` is what the module remembered from its last ``present``.

    The edit is worked out twice: on the parsed data (what the file should mean) and on the text
    (only the members this module owns change bytes). The text must parse to the data; should it
    ever not, the data is written out whole instead, so the file is never wrong, only reformatted.
    """
    data = parse_docker(text, source)
    new = copy.deepcopy(data)
    new_text = text
    memo = dict(state_doc or {})
    runtimes = new.get("runtimes")
    if runtimes is not None and not isinstance(runtimes, dict):
        raise ConfigError(f"{source}: the runtimes key must be a JSON object.")
    entry = runtimes.get(name) if runtimes else None
    if entry is not None:
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or path not in (None, "", runtime_path):
            raise ConfigError(
                f"{source} already has a runtime runtimes.{name} with path {json.dumps(path)}, "
                f"which is not the nvidia runtime at {runtime_path}; "
                "choose another runtime_name or remove that entry first."
            )
    current_default = new.get("default-runtime")

    if state == "present":
        if runtimes is None:
            new["runtimes"] = runtimes = {}
            memo["added_runtimes"] = True
        if entry is None:
            # "args" is the key nvidia-ctk writes, so entries it made compare equal to ours.
            runtimes[name] = {"path": runtime_path, "args": []}
            if memo.get("added_runtimes") and "runtimes" not in data:
                new_text = _json_set(new_text, ["runtimes"], {name: runtimes[name]})
            else:
                new_text = _json_set(new_text, ["runtimes", name], runtimes[name])
        elif entry.get("path") != runtime_path:
            entry["path"] = runtime_path
            new_text = _json_set(new_text, ["runtimes", name, "path"], runtime_path)
        if set_as_default and current_default != name:
            memo["previous_default_runtime"] = current_default
            new["default-runtime"] = name
            new_text = _json_set(new_text, ["default-runtime"], name)
    else:
        if runtimes is not None and name in runtimes:
            del runtimes[name]
            if not runtimes and memo.get("added_runtimes"):
                del new["runtimes"]
                new_text = _json_delete(new_text, ["runtimes"])
            else:
                new_text = _json_delete(new_text, ["runtimes", name])
        if current_default == name:
            previous = memo.get("previous_default_runtime")
            if previous is None:
                del new["default-runtime"]
                new_text = _json_delete(new_text, ["default-runtime"])
            else:
                new["default-runtime"] = previous
                new_text = _json_set(new_text, ["default-runtime"], previous)
        memo = {}

    new_state_doc = memo or None
    if new == data:
        new_text = text
    elif json.loads(new_text) != new:
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
