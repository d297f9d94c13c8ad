# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The shared core of the runtime config edits (private to gpuops.k8s).

Each runtime's rules live in their own file (``_runtime_containerd``, ``_runtime_crio``,
``_runtime_docker``); what they share is here: the error and result types, the NVIDIA runtime entries
that other installers write and that an edit may adopt, the marker comment that remembers a replaced
default runtime, and the table-level edits of a TOML text (``TomlEdit``), which change the text and
the plain data it must mean in step, so that every edit is checked against a strict parser before
anything is written (see ``_toml_text``).

Everything works on text in and text out; the module alone owns the file system.
"""

from __future__ import annotations

import copy
import json
import os
import re

from ansible_collections.gpuops.k8s.plugins.module_utils import _toml_text as tt

MARKER = "gpuops.k8s.nvidia_runtime"
RUNTIME_BASENAME = "nvidia-container-runtime"
# The entries the GPU Operator, nvidia-ctk and k3s write, by suffix of the runtime name: nvidia-ctk and the
# GPU Operator write -cdi and -legacy (binaries nvidia-container-runtime.cdi, .legacy); k3s writes -cdi and
# -experimental, the latter with the binary nvidia-container-runtime-experimental (a hyphen), never -legacy.
NVIDIA_VARIANTS = ("", "-cdi", "-legacy", "-experimental")
VARIANT_BINARIES = {
    "": RUNTIME_BASENAME,
    "-cdi": RUNTIME_BASENAME + ".cdi",
    "-legacy": RUNTIME_BASENAME + ".legacy",
    "-experimental": RUNTIME_BASENAME + "-experimental",
}
# Where those installers put the runtime binary: the GPU Operator's toolkit directory, or the host's; k3s
# searches /usr/local/nvidia/toolkit, /opt/kwasm/bin and then its PATH.
FOREIGN_TOOLKIT_DIRS = ("/usr/local/nvidia/toolkit", "/opt/kwasm/bin", "/usr/local/bin", "/usr/bin")
DEFAULT_CDI_SPEC_DIRS = ["/etc/cdi", "/var/run/cdi"]

_MARKER_RE = re.compile(
    r"gpuops\.k8s\.nvidia_runtime: previous default (?P<value>\"(?:[^\"\\]|\\.)*\"|unset)(?P<added>; table added)?"
)


class ConfigError(Exception):
    """The input cannot be edited safely; the message is one sentence for the user."""


class EditResult:
    """The outcome of one edit: the new text and what the nvidia runtime looks like in it."""

    def __init__(self, text, changed, runtime_entry, default_runtime, config_version=None, state_doc=None, **extra):
        self.text = text
        self.changed = changed
        self.runtime_entry = runtime_entry
        self.default_runtime = default_runtime
        self.config_version = config_version
        # Docker only: the state document kept next to daemon.json (None: there should be none).
        self.state_doc = state_doc
        self.imports = extra.get("imports")  # containerd: the file's imports list, if any
        self.adopted = extra.get("adopted", [])  # entries of other installers brought to our binary
        self.notes = extra.get("notes", [])  # what the module should tell the user (warnings)


# ---------------------------------------------------------------------------------------------
# NVIDIA entries written by other installers


def variant_binary(runtime_path, variant):
    """The binary of a variant entry (``-cdi`` ...) next to the configured runtime."""
    if not variant:
        return runtime_path
    return os.path.join(os.path.dirname(runtime_path), VARIANT_BINARIES[variant])


def is_nvidia_binary(binary, runtime_path):
    """True for a runtime binary that NVIDIA's installers put in a place we know."""
    if not isinstance(binary, str) or not binary:
        return False
    directory, base = os.path.split(binary)
    if base not in VARIANT_BINARIES.values():
        return False
    return directory in (*FOREIGN_TOOLKIT_DIRS, os.path.dirname(runtime_path))


def adoption_error(source, entry_path, binary, wanted):
    return ConfigError(
        f"{source} already has a runtime {entry_path} whose binary is {json.dumps(binary)} (as the GPU Operator, "
        f"nvidia-ctk or k3s write it), not {wanted}; set adopt_existing to true to point it at {wanted}, "
        "or remove that entry first."
    )


def foreign_entry_error(source, entry_path, description, runtime_path):
    return ConfigError(
        f"{source} already has a runtime {entry_path} with {description}, which is not the nvidia runtime at "
        f"{runtime_path}; choose another runtime_name or remove that entry first."
    )


# ---------------------------------------------------------------------------------------------
# The marker comment on a default-runtime line


def marker_comment(previous, table_added=False):
    value = "unset" if previous is None else json.dumps(previous)
    return "{}: previous default {}{}".format(MARKER, value, "; table added" if table_added else "")


def read_marker(comment):
    """(found, previous default or None, table added) from the comment on a default-runtime line."""
    match = _MARKER_RE.search(comment or "")
    if not match:
        return False, None, False
    value = match.group("value")
    previous = None if value == "unset" else json.loads(value)
    return True, previous, bool(match.group("added"))


def comment_without_marker(comment):
    """A line's comment with this module's marker (and what follows it) taken out."""
    comment = comment or ""
    at = comment.find(MARKER)
    if at < 0:
        return comment
    kept = comment[:at].rstrip()
    if kept.endswith("#"):
        kept = kept[:-1].rstrip()
    return kept


# ---------------------------------------------------------------------------------------------
# Plain data


def plain_at(data, parts):
    node = data
    for key in parts:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _set_data(data, parts, value):
    node = data
    for key in parts[:-1]:
        node = node.setdefault(key, {})
    node[parts[-1]] = copy.deepcopy(value)


def _del_data(data, parts):
    node = plain_at(data, parts[:-1])
    if isinstance(node, dict):
        node.pop(parts[-1], None)


# ---------------------------------------------------------------------------------------------
# TOML edits: the text and the data it must mean, changed in step


class TomlEdit:
    """One TOML file being edited: ``doc`` (the text), ``before`` (what it meant), ``after`` (what it must mean)."""

    def __init__(self, text, source):
        self.source = source
        self.original = text
        try:
            self.before = tt.loads(text)
            self.doc = tt.Document(text)
        except tt.TomlTextError as exc:
            raise ConfigError(f"{source} could not be parsed as TOML: {exc}.") from None
        self.after = copy.deepcopy(self.before)
        self.blank = self.doc.blank_before_headers()

    def value(self, parts):
        return plain_at(self.after, parts)

    def _check_tables(self, parts):
        """Every proper prefix of ``parts`` is a table (or absent) in the data."""
        node = self.after
        for depth, key in enumerate(parts[:-1]):
            node = node.get(key) if isinstance(node, dict) else None
            if node is not None and not isinstance(node, dict):
                raise ConfigError(
                    f"{self.source}: {tt.dotted(parts[: depth + 1])} is a {type(node).__name__}, "
                    "but a table was expected there."
                )

    def literal_quotes(self, parts):
        """Whether the string at ``parts`` is written in 'single quotes' (containerd 2.x writes them so)."""
        statement = self.doc.keyval(parts)
        return bool(statement) and self.doc.text[statement.value_start] == "'"

    def set_key(self, parts, value, comment=None, literal=False):
        """Set the key ``parts`` to ``value``; ``comment`` replaces the comment on its line ('' drops it)."""
        parts = tuple(parts)
        self._check_tables(parts)
        rendered = tt.value_text(value, literal)
        doc = self.doc
        statement = doc.keyval(parts)
        if statement is not None:
            if doc.text[statement.value_start : statement.value_end] != rendered or comment is not None:
                doc.set_value(statement, rendered, comment)
        else:
            owner = doc.owner(parts)
            if owner is not None:
                doc.inline_set(owner, parts, rendered)
            else:
                self._insert_key(parts, rendered, comment)
        _set_data(self.after, parts, value)

    def _insert_key(self, parts, rendered, comment):
        doc = self.doc
        table, key = parts[:-1], parts[-1]
        tail = f" # {comment}" if comment else ""
        header = doc.header(table)
        if header is not None:
            indent = doc.key_indent(table, header.indent)
            doc.insert_lines(doc.section_end(header), [f"{indent}{tt.key_text(key)} = {rendered}{tail}"])
            return
        dotted = doc.dotted_under(table)
        if dotted:
            outer = dotted[0].table
            last = [s for s in dotted if s.table == outer][-1]
            doc.insert_lines(last.end, [f"{last.indent}{tt.dotted(parts[len(outer) :])} = {rendered}{tail}"])
            return
        # No table of that name yet: a header of its own, before the first table below it (if any).
        under = doc.sections_under(table)
        indent = under[0].indent if under else doc.header_indent(table)
        like = under[0] if under else next((s for s in doc.statements if s.kind == "table"), None)
        spelled = tt.header_spelling(doc.text, like, table) if like is not None else tt.dotted(table)
        lines = [f"{indent}[{spelled}]", f"{indent}{doc.indent_step()}{tt.key_text(key)} = {rendered}{tail}"]
        if under:
            doc.insert_lines(self._before_comments(under[0]), lines + ([""] if self.blank else []))
        else:
            doc.insert_block(self._table_position(table, None), lines, self.blank)

    def _before_comments(self, statement):
        """The start of the comment lines directly above ``statement`` (they belong to it)."""
        text = self.doc.text
        at = statement.start
        while at > 0:
            previous = text.rfind("\n", 0, at - 1) + 1
            line = text[previous:at].strip(" \t\r\n" + tt.BOM)
            if not line.startswith("#"):
                break
            at = previous
        return at

    def _end_of_text(self):
        """Where a new block goes at the end: after the last statement (trailing comments stay last)."""
        statements = self.doc.statements
        return statements[-1].end if statements else len(self.doc.text)

    def add_table(self, parts, entry, after=None, model=None, literal=False):
        """Add the table ``parts`` holding ``entry`` (plain data: keys, and sub-tables as dicts).

        ``after``: the table whose block the new one follows, when the file has it as a header;
        ``model``: the table whose header and key indentation the new one copies.
        """
        parts = tuple(parts)
        self._check_tables(parts)
        doc = self.doc
        owner = doc.owner(parts)
        if owner is not None:
            doc.inline_set(owner, parts, tt.value_text(entry, literal))
        else:
            lines = self._table_lines(parts, entry, model, literal)
            doc.insert_block(self._table_position(parts, after), lines, self.blank)
        _set_data(self.after, parts, entry)

    def _table_lines(self, parts, entry, model, literal, header_indent=None, key_indent=None):
        """The lines of a new table (and its sub-tables), laid out like ``model`` where the file has it."""
        doc = self.doc
        header = doc.header(model) if model else None
        if header is not None:
            header_indent = header.indent
            key_indent = doc.key_indent(model, header_indent)
            spelled = tt.header_spelling(doc.text, header, parts)
        else:
            header_indent = header_indent if header_indent is not None else doc.header_indent(parts)
            key_indent = key_indent if key_indent is not None else header_indent + doc.indent_step()
            like = next((s for s in doc.statements if s.kind == "table"), None)
            spelled = tt.header_spelling(doc.text, like, parts) if like is not None else tt.dotted(parts)
        lines = [f"{header_indent}[{spelled}]"]
        tables = []
        for key, value in entry.items():
            if isinstance(value, dict):
                tables.append((key, value))
            else:
                lines.append(f"{key_indent}{tt.key_text(key)} = {tt.value_text(value, literal)}")
        step = key_indent[len(header_indent) :] if key_indent.startswith(header_indent) else ""
        for key, value in tables:
            sub_model = (*model, key) if model and doc.header((*model, key)) else None
            if self.blank:
                lines.append("")
            lines.extend(
                self._table_lines((*parts, key), value, sub_model, literal, header_indent + step, key_indent + step)
            )
        return lines

    def _table_position(self, parts, after):
        """A section boundary for a new table: after ``after``'s block, else after its parent's, else the end."""
        doc = self.doc
        candidates = [after] if after else []
        candidates += [parts[:depth] for depth in range(len(parts) - 1, 0, -1)]
        for candidate in candidates:
            if not doc.sections_under(candidate):
                continue
            end = doc.block_end(candidate)
            return self._section_boundary(end)
        return self._end_of_text()

    def _section_boundary(self, offset):
        """After the last key/value line of the section that holds the statement ending at ``offset``."""
        statements = self.doc.statements
        index = max(i for i, s in enumerate(statements) if s.end <= offset) if statements else -1
        while index + 1 < len(statements) and statements[index + 1].kind == "keyval":
            index += 1
        return statements[index].end if index >= 0 else 0

    def remove(self, parts):
        """Remove the key or table ``parts`` (its header sections, dotted keys or inline member)."""
        parts = tuple(parts)
        doc = self.doc
        owner = doc.owner(parts)
        if owner is not None and owner.path != parts:
            doc.inline_remove(owner, parts)
        else:
            sections = doc.sections_under(parts)
            singles = [s for s in doc.statements if s.kind == "keyval" and s.path[: len(parts)] == parts]
            singles = [s for s in singles if not any(s.table[: len(h.path)] == h.path for h in sections)]
            spans = [(s.start, s.end, False) for s in singles]
            spans += [(h.start, doc.section_end(h), True) for h in sections]
            for start, end, separator in sorted(spans, reverse=True):
                doc.remove_lines(start, end, separator)
        _del_data(self.after, parts)
        self._forget_vanished(parts[:-1])

    def _forget_vanished(self, parts):
        """Drop empty tables from the data that no statement of the text defines any more."""
        for depth in range(len(parts), 0, -1):
            table = tuple(parts[:depth])
            if plain_at(self.after, table) != {}:
                return
            if any(s.path[:depth] == table for s in self.doc.statements):
                return
            _del_data(self.after, table)

    def drop_empty_header(self, parts):
        """Remove the header of table ``parts`` when its section holds no key (a header `present` wrote)."""
        header = self.doc.header(parts)
        if header is None or self.doc.section_end(header) != header.end:
            return
        self.doc.remove_lines(header.start, header.end, True)
        self._forget_vanished(tuple(parts))

    def defined(self, parts):
        """Whether the text defines table ``parts`` itself (a header, dotted keys, or an inline value)."""
        doc = self.doc
        return doc.header(parts) is not None or bool(doc.dotted_under(parts)) or doc.owner(parts) is not None

    def prune_empty(self, parts):
        """Remove the tables along ``parts`` (deepest first) that are now empty and have nothing but a header."""
        for depth in range(len(parts), 0, -1):
            table = tuple(parts[:depth])
            if plain_at(self.after, table) != {} or self.doc.keyval(table) is not None or self.doc.owner(table):
                return
            header = self.doc.header(table)
            if header is not None:
                self.doc.remove_lines(header.start, header.end, True)
            self._forget_vanished(table)

    def comment(self, parts):
        statement = self.doc.keyval(parts)
        return self.doc.comment_of(statement) if statement else ""

    def finish(self):
        """The new text and whether it changed; the text is verified to mean ``after`` first."""
        if self.after == self.before:
            return self.original, False
        try:
            tt.verify(self.doc.text, self.after, "nothing was written")
        except tt.TomlTextError as exc:
            raise ConfigError(f"{self.source}: {exc}.") from None
        return self.doc.text, self.doc.text != self.original


def cdi_dirs(value):
    return list(value) if value else list(DEFAULT_CDI_SPEC_DIRS)
