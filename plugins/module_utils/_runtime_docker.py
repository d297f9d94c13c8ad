# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Docker's rules for the nvidia runtime: ``runtimes`` and ``default-runtime`` in daemon.json (private).

JSON has no comments and Docker rejects unknown keys, so what ``present`` must remember (the replaced
default runtime, whether it added the ``runtimes`` object) lives in a small state document that the
module keeps next to daemon.json.
"""

from __future__ import annotations

import copy
import json

from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import (
    NVIDIA_VARIANTS,
    ConfigError,
    EditResult,
    adoption_error,
    cdi_dirs,
    foreign_entry_error,
    is_nvidia_binary,
    variant_binary,
)


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


class _DaemonJsonEdit:
    """daemon.json changed twice in step: as data (what it must mean) and as text (only our members' bytes)."""

    def __init__(self, body, source):
        self.source = source
        self.body = body
        self.before = parse_docker(body, source)
        self.data = copy.deepcopy(self.before)
        self.text = body

    def set(self, path, value):
        """Set the member at ``path`` (a list of keys), creating the last one if needed."""
        parent = self.data
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
        self.text = _json_set(self.text, path, value)

    def delete(self, path):
        """Remove the member at ``path`` (a list of keys)."""
        parent = self.data
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        self.text = _json_delete(self.text, path)

    def finish(self):
        """The new text: unchanged bytes when the meaning is, else the text edit (or, should it ever
        disagree with the data, the data written out whole: the file is never wrong, only reformatted)."""
        if self.data == self.before:
            return self.body
        if json.loads(self.text) != self.data:
            return dump_docker(self.data, detect_json_indent(self.body))
        return self.text


def _converge_entries(edit, name, runtime_path, adopt_existing, adopted):
    """Point the nvidia entry and the variants other installers left at our binaries (or refuse)."""
    runtimes = edit.data.get("runtimes") or {}
    for variant in NVIDIA_VARIANTS:
        key = name + variant
        entry = runtimes.get(key)
        if entry is None:
            continue
        path = entry.get("path") if isinstance(entry, dict) else None
        wanted = variant_binary(runtime_path, variant)
        theirs = is_nvidia_binary(path, runtime_path)
        if variant and not theirs:
            continue
        if not isinstance(entry, dict) or not (path in (None, "", wanted) or theirs):
            raise foreign_entry_error(edit.source, f"runtimes.{key}", f"path {json.dumps(path)}", runtime_path)
        if path in (None, "", wanted) and (variant or path == wanted):
            continue
        if path not in (None, "", wanted):
            if not adopt_existing:
                raise adoption_error(edit.source, f"runtimes.{key}", path, wanted)
            adopted.append({"entry": f"runtimes.{key}", "from": path, "to": wanted})
        edit.set(["runtimes", key, "path"], wanted)


def _present(edit, memo, name, runtime_path, set_as_default, adopt_existing, adopted):
    """The nvidia entry listed (with its variants converged) and, where asked, the default runtime."""
    _converge_entries(edit, name, runtime_path, adopt_existing, adopted)
    runtimes = edit.data.get("runtimes")
    if runtimes is None:
        edit.data["runtimes"] = runtimes = {}
        memo["added_runtimes"] = True
    if runtimes.get(name) is None:
        # "args" is the key nvidia-ctk writes, so entries it made compare equal to ours.
        entry = {"path": runtime_path, "args": []}
        if memo.get("added_runtimes") and "runtimes" not in edit.before:
            edit.set(["runtimes"], {name: entry})
        else:
            edit.set(["runtimes", name], entry)
    if set_as_default and edit.data.get("default-runtime") != name:
        memo["previous_default_runtime"] = edit.data.get("default-runtime")
        edit.set(["default-runtime"], name)


def _enable_cdi(edit, cdi_spec_dirs):
    """Docker's CDI feature on, and the spec directories where they are not Docker's own default."""
    features = edit.data.get("features")
    if features is not None and not isinstance(features, dict):
        raise ConfigError(f"{edit.source}: the features key must be a JSON object.")
    if features is None:
        edit.set(["features"], {"cdi": True})
    elif features.get("cdi") is not True:
        edit.set(["features", "cdi"], True)
    # Docker's own default directories are ours; other ones are written out.
    dirs = cdi_dirs(cdi_spec_dirs)
    if edit.data.get("cdi-spec-dirs", cdi_dirs(None)) != dirs:
        edit.set(["cdi-spec-dirs"], dirs)


def _absent(edit, memo, name, runtime_path):
    """The nvidia entry gone (refused when it runs another binary), and the default runtime given back."""
    runtimes = edit.data.get("runtimes") or {}
    entry = runtimes.get(name)
    if entry is not None:
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not (
            path in (None, "", runtime_path) or is_nvidia_binary(path, runtime_path)
        ):
            raise foreign_entry_error(edit.source, f"runtimes.{name}", f"path {json.dumps(path)}", runtime_path)
        if set(runtimes) == {name} and memo.get("added_runtimes"):
            edit.delete(["runtimes"])
        else:
            edit.delete(["runtimes", name])
    if edit.data.get("default-runtime") == name:
        previous = memo.get("previous_default_runtime")
        if previous is None:
            edit.delete(["default-runtime"])
        else:
            edit.set(["default-runtime"], previous)


def edit_docker(
    text,
    source,
    name,
    runtime_path,
    set_as_default,
    state,
    state_doc=None,
    adopt_existing=True,
    enable_cdi=False,
    cdi_spec_dirs=None,
):
    """Edit daemon.json. ``state_doc`` is what the module remembered from its last ``present``.

    The edit is worked out twice: on the parsed data (what the file should mean) and on the text
    (only the members this module owns change bytes). The text must parse to the data; should it
    ever not, the data is written out whole instead, so the file is never wrong, only reformatted.
    """
    bom = text.startswith("\ufeff")
    edit = _DaemonJsonEdit(text[1:] if bom else text, source)
    memo = dict(state_doc or {})
    adopted = []
    runtimes = edit.data.get("runtimes")
    if "runtimes" in edit.data and not isinstance(runtimes, dict):
        raise ConfigError(f"{source}: the runtimes key must be a JSON object, not {json.dumps(runtimes)}.")
    if state == "present":
        _present(edit, memo, name, runtime_path, set_as_default, adopt_existing, adopted)
        if enable_cdi:
            _enable_cdi(edit, cdi_spec_dirs)
    else:
        _absent(edit, memo, name, runtime_path)
        memo = {}
    new_text = edit.finish()
    if bom:
        new_text = "\ufeff" + new_text
    return EditResult(
        new_text,
        new_text != text,
        (edit.data.get("runtimes") or {}).get(name),
        edit.data.get("default-runtime", "runc"),
        state_doc=memo or None,
        adopted=adopted,
    )
