# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""TOML edited as text: spans of the statements an edit owns, judged by a strict parser (private).

Why not a round-tripping TOML library: tomlkit, the only maintained one for Python, re-renders what
it is given. On real configs that cost more than layout: on a file that sets CRI keys with dotted
keys (``containerd.runtimes.runc.runtime_type = ...`` under ``[plugins."io.containerd.grpc.v1.cri"]``)
it wrote the new runtime under a top-level ``[containerd.runtimes.nvidia]`` table (a different
meaning, which containerd ignores) and a second run produced a file that no longer parsed; a CRI-O
drop-in with a blank line between two tables stopped it with an internal error; a UTF-8 BOM made it
refuse the file. So the edits here work on the text itself, in three steps, one file each:

- ``_toml_scan``: ``scan`` finds where each statement (table header, key/value pair) stands, with the
  absolute key path it defines. Only the lexical structure is needed for that (strings, arrays, inline
  tables, comments), not values.
- this file: a ``Document`` is the text and its statements. An edit replaces a value span, inserts
  whole lines, or removes the lines of a statement; every byte outside those spans stays as it was
  (comments, blank lines, tabs, CRLF line ends, a BOM).
- ``_toml_values``: the caller states what the file must mean afterwards (plain data); ``verify``
  parses the new text with a strict parser (``tomllib``, ``tomli``, or tomlkit's parser on old
  Pythons) and refuses the edit, writing nothing, when the meaning differs in any key. It also writes
  the TOML for the values an edit puts in (``value_text``, ``dotted``).

Callers import this module only: it names what the other two provide.
"""

from __future__ import annotations

from ansible_collections.gpuops.k8s.plugins.module_utils._toml_scan import (
    Lexer,
    Statement,
    header_spelling,
    scan,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._toml_values import (
    BOM,
    HAS_TOML_PARSER,
    TOML_PARSER,
    TomlTextError,
    basic_string,
    dotted,
    key_text,
    literal_string,
    loads,
    value_text,
    verify,
)

__all__ = (
    "BOM",
    "HAS_TOML_PARSER",
    "TOML_PARSER",
    "Document",
    "Statement",
    "TomlTextError",
    "basic_string",
    "dotted",
    "header_spelling",
    "key_text",
    "literal_string",
    "loads",
    "scan",
    "value_text",
    "verify",
)


class Document:
    """A TOML text with its statements; edits return nothing and re-scan the text."""

    def __init__(self, text):
        self.text = text
        self.newline = "\r\n" if "\r\n" in text else "\n"
        self.statements = scan(text)

    def _replace(self, start, end, new):
        self.text = self.text[:start] + new + self.text[end:]
        self.statements = scan(self.text)

    # -- lookups ---------------------------------------------------------------------------

    def header(self, path):
        """The header statement that opens table ``path`` (not in an array of tables), else None."""
        for statement in self.statements:
            if statement.kind == "table" and statement.path == tuple(path) and not statement.in_array:
                return statement
        return None

    def keyval(self, path):
        for statement in self.statements:
            if statement.kind == "keyval" and statement.path == tuple(path) and not statement.in_array:
                return statement
        return None

    def owner(self, path):
        """The key/value statement whose value holds ``path`` (an inline table, or a non-table), else None."""
        path = tuple(path)
        for statement in self.statements:
            if statement.kind == "keyval" and not statement.in_array and path[: len(statement.path)] == statement.path:
                return statement
        return None

    def section_end(self, header):
        """Where the section of ``header`` ends: after its last key/value line (before what leads into the next)."""
        index = self.statements.index(header)
        end = header.end
        for statement in self.statements[index + 1 :]:
            if statement.kind != "keyval":
                break
            end = statement.end
        return end

    def block_end(self, path):
        """After the last statement of table ``path`` and its sub-tables, if they stand together, else None."""
        path = tuple(path)
        last = None
        for statement in self.statements:
            if statement.path[: len(path)] == path and not statement.in_array:
                last = statement
        return last.end if last else None

    def sections_under(self, path):
        """Header statements of ``path`` and of every table below it."""
        path = tuple(path)
        return [
            s
            for s in self.statements
            if s.kind in ("table", "array") and s.path[: len(path)] == path and not s.in_array
        ]

    def dotted_under(self, path):
        """Key/value statements that define ``path`` or keys below it with dotted keys from an outer table."""
        path = tuple(path)
        return [
            s
            for s in self.statements
            if s.kind == "keyval" and len(s.table) < len(path) and s.path[: len(path)] == path and not s.in_array
        ]

    def key_indent(self, table_path, header_indent=""):
        """The indent of keys in table ``table_path``'s section, or the header's plus the file's step."""
        for statement in self.statements:
            if statement.kind == "keyval" and statement.table == tuple(table_path):
                return statement.indent
        return header_indent + self.indent_step()

    def indent_step(self):
        """Two spaces (or a tab) when the file indents the keys of a section deeper than its header."""
        for index, statement in enumerate(self.statements[:-1]):
            following = self.statements[index + 1]
            if (
                statement.kind == "table"
                and following.kind == "keyval"
                and len(following.indent) > len(statement.indent)
                and following.indent.startswith(statement.indent)
            ):
                return following.indent[len(statement.indent) :]
        return ""

    def header_indent(self, path):
        """The indent a new header for ``path`` gets: a sibling's, else its closest ancestor's plus the file's step."""
        path = tuple(path)
        headers = [s for s in self.statements if s.kind == "table" and not s.in_array]
        for header in headers:
            if len(header.path) == len(path) and header.path[:-1] == path[:-1]:
                return header.indent
        step = ""
        for header in headers:
            parent = next((h for h in headers if h.path == header.path[:-1]), None)
            if parent is not None and header.indent.startswith(parent.indent) and header.indent != parent.indent:
                step = header.indent[len(parent.indent) :]
                break
        for depth in range(len(path) - 1, 0, -1):
            ancestor = next((h for h in headers if h.path == path[:depth]), None)
            if ancestor is not None:
                return ancestor.indent + step
        return ""

    def blank_before_headers(self):
        """Whether the file separates table headers with blank lines."""
        lines = self.text.splitlines()
        headers = [i for i, line in enumerate(lines) if line.lstrip(" \t" + BOM).startswith("[")]
        if len(headers) < 2:
            return bool(headers) and headers[0] > 0 and not lines[headers[0] - 1].strip(BOM + " \t")
        blank = sum(1 for i in headers[1:] if not lines[i - 1].strip())
        return blank * 2 >= len(headers) - 1

    # -- edits -----------------------------------------------------------------------------

    def set_value(self, statement, new_value, comment=None):
        """Replace a key/value statement's value; ``comment`` (when given) replaces the line's comment."""
        if comment is None:
            self._replace(statement.value_start, statement.value_end, new_value)
            return
        tail_start = statement.value_end
        eol = statement.eol
        if statement.comment_start is not None:
            gap = self.text[tail_start : statement.comment_start]
        else:
            gap = self.text[tail_start:eol]  # trailing white space becomes the gap before a new comment
        # Without a comment: a single space was the gap a comment was given; more was the line's own.
        new_tail = (gap or " ") + "# " + comment if comment else ("" if gap in ("", " ") else gap)
        self._replace(statement.value_start, eol, new_value + new_tail)

    def comment_of(self, statement):
        if statement.comment_start is None:
            return ""
        return self.text[statement.comment_start + 1 : statement.eol].strip()

    def insert_lines(self, at, lines):
        """Insert whole lines at offset ``at`` (the start of a line, or the end of the text)."""
        text = self.text
        prefix = ""
        if at == len(text) and text and not text.endswith("\n"):
            prefix = self.newline
        self._replace(at, at, prefix + "".join(line + self.newline for line in lines))

    def remove_lines(self, start, end, separator=True):
        """Remove the lines ``start``..``end``; with ``separator`` also one blank line that only set them apart.

        A block that ``insert_block`` added after a blank line, in a file that separates blocks with
        blank lines, is followed by one: removing the block then leaves two in a row (or one at the
        end of the file). One of them goes with the block, so that adding and removing again gives
        back the same bytes.
        """
        text = self.text
        if separator and start > 0:
            previous_start = text.rfind("\n", 0, start - 1) + 1
            previous_blank = not text[previous_start:start].strip(" \t\r\n" + BOM)
            following_blank = end >= len(text) or not text[end : self._line_end(end)].strip(" \t\r\n")
            if previous_blank and following_blank:
                start = previous_start
        self._replace(start, end, "")

    def _line_end(self, at):
        end = self.text.find("\n", at)
        return len(self.text) if end < 0 else end + 1

    def insert_block(self, at, lines, blank):
        """Insert a block of lines at ``at``, after a blank line where ``blank`` (and none is there)."""
        text = self.text
        previous_blank = at == 0 or text[:at].endswith("\n\n") or text[:at].endswith("\r\n\r\n")
        lead = [""] if blank and not previous_blank else []
        self.insert_lines(at, lead + list(lines))

    # -- inline tables -----------------------------------------------------------------------

    def inline_members(self, start):
        """The members of the inline table opening at ``start``, and where it closes.

        Each member is (key parts, key start, value start, value end).
        """
        lexer = Lexer(self.text)
        members = []
        i = lexer.skip_ws_comments_newlines(start + 1)
        while i < lexer.n and self.text[i] != "}":
            key_start = i
            parts, i = lexer.key(i)
            i = lexer.skip_ws(i)
            value_start = lexer.skip_ws(i + 1)
            value_end = lexer.value(value_start)
            members.append((parts, key_start, value_start, value_end))
            i = lexer.skip_ws_comments_newlines(value_end)
            if i < lexer.n and self.text[i] == ",":
                i = lexer.skip_ws_comments_newlines(i + 1)
        return members, i

    def inline_locate(self, statement, path):
        """Descend from an inline-table statement to ``path``: (table start, remaining parts)."""
        start = statement.value_start
        rest = tuple(path[len(statement.path) :])
        while rest:
            if self.text[start] != "{":
                return start, rest
            members, _close = self.inline_members(start)
            for parts, _ks, value_start, _ve in members:
                if rest[: len(parts)] == parts and len(parts) < len(rest):
                    start, rest = value_start, rest[len(parts) :]
                    break
            else:
                return start, rest
        return start, rest

    def inline_set(self, statement, path, value):
        """Set ``path`` (below ``statement``'s inline table) to the TOML value text ``value``."""
        start, rest = self.inline_locate(statement, path)
        if self.text[start] != "{":
            raise TomlTextError(f"{dotted(path[: len(path) - len(rest)])} is not a table")
        members, close = self.inline_members(start)
        for parts, _ks, value_start, value_end in members:
            if parts == rest:
                self._replace(value_start, value_end, value)
                return
        member = f"{dotted(rest)} = {value}"
        if members:
            self._replace(members[-1][3], members[-1][3], ", " + member)
        else:
            inner = self.text[start + 1 : close]
            self._replace(start + 1, close, " " + member + " " if not inner.strip() else inner + member)

    def inline_remove(self, statement, path):
        """Remove the member ``path`` of an inline table below ``statement``; False when it is not there."""
        start, rest = self.inline_locate(statement, path)
        if self.text[start] != "{":
            return False
        members, close = self.inline_members(start)
        for index, (parts, key_start, _vs, value_end) in enumerate(members):
            if parts != rest:
                continue
            if len(members) == 1:
                inner = self.text[start + 1 : close]
                self._replace(start + 1, close, "" if not inner.strip(" ") else " " if inner.startswith(" ") else "")
            elif index > 0:
                self._replace(members[index - 1][3], value_end, "")
            else:
                self._replace(key_start, members[1][1], "")
            return True
        return False
