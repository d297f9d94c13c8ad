# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""TOML's lexical structure: where each statement of a text stands (private).

Part of the text editing described in ``_toml_text``: this file owns reading the layout. ``scan`` walks a
text once and returns a ``Statement`` for every table header and key/value pair, with the absolute key path
it defines and the offsets of its lines, value and comment. Only the lexical structure is needed for that
(strings, arrays, inline tables, comments), not values: the ``Lexer`` skips over a value without decoding
it. ``header_spelling`` spells a new table's header the way a neighbouring header spells its keys.
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpuops.k8s.plugins.module_utils._toml_values import (
    BARE_KEY,
    BOM,
    TomlTextError,
    basic_string,
    literal_string,
)

_BARE_CHARS = re.compile(r"[A-Za-z0-9_-]")


class Statement:
    """One line-level statement: a table header or a key/value pair, with its spans in the text.

    ``path``: for a header the table it opens; for a key/value pair the absolute path of the key.
    ``table``: the table a key/value pair belongs to (its section's header path).
    ``start``/``end``: the whole lines it occupies (``end`` after the line break, or the text's end).
    ``value_start``/``value_end``: the value's span (key/value pairs only).
    ``comment_start``: where the comment on its (last) line starts, else None; ``eol``: where that
    line's break starts.
    """

    __slots__ = (
        "comment_start",
        "end",
        "eol",
        "in_array",
        "indent",
        "kind",
        "path",
        "start",
        "table",
        "value_end",
        "value_start",
    )

    def __init__(self, kind, path, table, start, end, indent, in_array=False):
        self.kind = kind  # "table", "array" (array of tables), "keyval"
        self.path = path
        self.table = table
        self.start = start
        self.end = end
        self.indent = indent
        self.value_start = self.value_end = None
        self.comment_start = None
        self.eol = None
        self.in_array = in_array

    def __repr__(self):  # pragma: no cover - debugging aid
        return f"Statement({self.kind}, {self.path}, {self.start}-{self.end})"


def scan(text):
    """Every table header and key/value pair of ``text``, in order."""
    lexer = Lexer(text)
    statements = []
    table = ()
    in_array = False
    at = 1 if text.startswith(BOM) else 0
    while at < lexer.n:
        line_start = at
        at = lexer.skip_ws(at)
        indent = text[line_start:at]
        if at >= lexer.n:
            break
        if text[at] in "\r\n#":  # a blank or comment line
            at = lexer.after_break(at)
            continue
        if text[at] == "[":
            statement, after = _header(lexer, at, line_start, indent, statements)
            table, in_array = statement.path, statement.in_array
        else:
            statement, after = _keyval(lexer, at, line_start, indent, table, in_array)
        _finish_line(lexer, statement, after)
        statements.append(statement)
        at = statement.end
    return statements


def _header(lexer, at, line_start, indent, statements):
    """The table header (``[a.b]`` or ``[[a.b]]``) at ``at``, and the offset after it."""
    text = lexer.text
    array = text.startswith("[[", at)
    parts, after = lexer.key(at + (2 if array else 1))
    after = lexer.skip_ws(after)
    closing = "]]" if array else "]"
    if not text.startswith(closing, after):
        lexer.error(after, "a table header is not closed")
    after += len(closing)
    in_array = array or any(s.kind == "array" and parts[: len(s.path)] == s.path for s in statements)
    return Statement("array" if array else "table", parts, parts, line_start, None, indent, in_array), after


def _keyval(lexer, at, line_start, indent, table, in_array):
    """The key/value pair at ``at`` in section ``table``, and the offset after its value."""
    parts, after = lexer.key(at)
    after = lexer.skip_ws(after)
    if after >= lexer.n or lexer.text[after] != "=":
        lexer.error(after, "'=' was expected after a key")
    value_start = lexer.skip_ws(after + 1)
    value_end = lexer.value(value_start)
    statement = Statement("keyval", table + parts, table, line_start, None, indent, in_array)
    statement.value_start, statement.value_end = value_start, value_end
    return statement, value_end


def _finish_line(lexer, statement, after):
    """Record the statement's comment and line end; anything else after it on the line is an error."""
    text = lexer.text
    after = lexer.skip_ws(after)
    if after < lexer.n and text[after] == "#":
        statement.comment_start = after
        after = lexer.line_break(after)
    elif after < lexer.n and text[after] not in "\r\n":
        lexer.error(after, "the line goes on after a complete statement")
    statement.eol = lexer.line_break(after)
    statement.end = lexer.after_break(after)


class Lexer:
    """Skips over keys, values, white space and comments of one text; errors name the line and column."""

    def __init__(self, text):
        self.text = text
        self.n = len(text)

    def error(self, at, what):
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        raise TomlTextError(f"line {line}, column {column}: {what}")

    def skip_ws(self, at):
        while at < self.n and self.text[at] in " \t":
            at += 1
        return at

    def skip_ws_comments_newlines(self, at):
        while at < self.n:
            c = self.text[at]
            if c in " \t\r\n":
                at += 1
            elif c == "#":
                at = self.line_break(at)
            else:
                break
        return at

    def line_break(self, at):
        """Offset of the line break (``\\r\\n`` or ``\\n``) at or after ``at``, else the end."""
        end = self.text.find("\n", at)
        if end < 0:
            return self.n
        return end - 1 if end > 0 and self.text[end - 1] == "\r" else end

    def after_break(self, at):
        end = self.text.find("\n", at)
        return self.n if end < 0 else end + 1

    def key(self, at):
        """A dotted key starting at ``at``: (parts, offset after it)."""
        parts = []
        while True:
            at = self.skip_ws(at)
            if at >= self.n:
                self.error(at, "a key was expected")
            c = self.text[at]
            if c == '"':
                end = self.basic_end(at)
                parts.append(_decode_basic(self.text[at + 1 : end - 1]))
                at = end
            elif c == "'":
                end = self.text.find("'", at + 1)
                if end < 0 or "\n" in self.text[at:end]:
                    self.error(at, "a literal key is not closed")
                parts.append(self.text[at + 1 : end])
                at = end + 1
            else:
                start = at
                while at < self.n and _BARE_CHARS.match(self.text[at]):
                    at += 1
                if at == start:
                    self.error(at, "a key was expected")
                parts.append(self.text[start:at])
            after = self.skip_ws(at)
            if after < self.n and self.text[after] == ".":
                at = after + 1
                continue
            return tuple(parts), at

    def basic_end(self, at):
        """Offset after the closing quote of the basic string opening at ``at`` (one line)."""
        i = at + 1
        while i < self.n:
            c = self.text[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                return i + 1
            if c == "\n":
                break
            i += 1
        self.error(at, "a string is not closed")

    def value(self, at):
        """Offset after the value starting at ``at``."""
        text = self.text
        if text.startswith('"""', at):
            return self._multiline_basic_end(at)
        if text.startswith("'''", at):
            return self._multiline_literal_end(at)
        c = text[at] if at < self.n else ""
        if c == '"':
            return self.basic_end(at)
        if c == "'":
            end = text.find("'", at + 1)
            if end < 0 or "\n" in text[at:end]:
                self.error(at, "a string is not closed")
            return end + 1
        if c == "[":
            return self._array_end(at)
        if c == "{":
            return self._inline_table_end(at)
        return self._scalar_end(at)

    def _multiline_basic_end(self, at):
        text = self.text
        i = at + 3
        while i < self.n:
            if text[i] == "\\":
                i += 2
                continue
            if text.startswith('"""', i):
                # Up to two quotes right before the closing three belong to the string.
                j = i + 3
                while j < self.n and j < i + 5 and text[j] == '"':
                    j += 1
                return j
            i += 1
        self.error(at, "a multi-line string is not closed")

    def _multiline_literal_end(self, at):
        text = self.text
        i = text.find("'''", at + 3)
        if i < 0:
            self.error(at, "a multi-line string is not closed")
        j = i + 3
        while j < self.n and j < i + 5 and text[j] == "'":
            j += 1
        return j

    def _array_end(self, at):
        text = self.text
        i = self.skip_ws_comments_newlines(at + 1)
        while i < self.n and text[i] != "]":
            i = self.value(i)
            i = self.skip_ws_comments_newlines(i)
            if i < self.n and text[i] == ",":
                i = self.skip_ws_comments_newlines(i + 1)
        if i >= self.n:
            self.error(at, "an array is not closed")
        return i + 1

    def _inline_table_end(self, at):
        text = self.text
        i = self.skip_ws_comments_newlines(at + 1)
        while i < self.n and text[i] != "}":
            _parts, i = self.key(i)
            i = self.skip_ws(i)
            if i >= self.n or text[i] != "=":
                self.error(i, "'=' was expected in an inline table")
            i = self.value(self.skip_ws(i + 1))
            i = self.skip_ws_comments_newlines(i)
            if i < self.n and text[i] == ",":
                i = self.skip_ws_comments_newlines(i + 1)
        if i >= self.n:
            self.error(at, "an inline table is not closed")
        return i + 1

    def _scalar_end(self, at):
        """A number, boolean or date-time: up to a comment, a separator or the line's end."""
        text = self.text
        i = at
        while i < self.n and text[i] not in "#,]}\r\n":
            i += 1
        end = i
        while end > at and text[end - 1] in " \t":
            end -= 1
        if end == at:
            self.error(at, "a value was expected")
        return end


def header_spelling(text, header, path):
    """``path`` spelled the way ``header`` spells its keys: its own raw text for the parts they share.

    The parts beyond the shared ones are quoted the way the header quotes (containerd 2.x writes
    'single quotes'), so a new table's header reads like its neighbour's.
    """
    lexer = Lexer(text)
    at = header.start + len(header.indent) + (2 if header.kind == "array" else 1)
    raw = []
    for _part in header.path:
        at = lexer.skip_ws(at)
        start = at
        if text[at] == '"':
            at = lexer.basic_end(at)
        elif text[at] == "'":
            at = text.find("'", at + 1) + 1
        else:
            while at < lexer.n and _BARE_CHARS.match(text[at]):
                at += 1
        raw.append(text[start:at])
        at = lexer.skip_ws(at)
        if at < lexer.n and text[at] == ".":
            at += 1
    shared = 0
    while shared < min(len(path), len(header.path)) and path[shared] == header.path[shared]:
        shared += 1
    literal = any(piece.startswith("'") for piece in raw)
    rest = []
    for part in path[shared:]:
        if BARE_KEY.match(part):
            rest.append(part)
        else:
            rest.append((literal and literal_string(part)) or basic_string(part))
    return ".".join(raw[:shared] + rest)


def _decode_basic(body):
    try:
        return json.loads('"' + re.sub(r"\\U([0-9A-Fa-f]{8})", lambda m: chr(int(m.group(1), 16)), body) + '"')
    except (ValueError, OverflowError):
        return body
