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
refuse the file. So the edits here work on the text itself:

- ``scan`` finds where each statement (table header, key/value pair) stands, with the absolute key
  path it defines. Only the lexical structure is needed for that (strings, arrays, inline tables,
  comments), not values.
- An edit replaces a value span, inserts whole lines, or removes the lines of a statement; every byte
  outside those spans stays as it was (comments, blank lines, tabs, CRLF line ends, a BOM).
- The caller states what the file must mean afterwards (plain data); ``verify`` parses the new text
  with a strict parser (``tomllib``, ``tomli``, or tomlkit's parser on old Pythons) and refuses the
  edit, writing nothing, when the meaning differs in any key.
"""

from __future__ import annotations

import datetime
import json
import math
import re

try:  # Python 3.11+
    import tomllib as _toml_parser

    TOML_PARSER = "tomllib"
except ImportError:  # pragma: no cover - depends on the target's Python
    try:
        import tomli as _toml_parser

        TOML_PARSER = "tomli"
    except ImportError:
        _toml_parser = None
        TOML_PARSER = None

try:
    import tomlkit as _tomlkit
except ImportError:  # pragma: no cover - depends on the target
    _tomlkit = None

if TOML_PARSER is None and _tomlkit is not None:  # pragma: no cover - old Pythons only
    TOML_PARSER = "tomlkit"

HAS_TOML_PARSER = TOML_PARSER is not None
BOM = "\ufeff"
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
_BARE_CHARS = re.compile(r"[A-Za-z0-9_-]")
_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


class TomlTextError(Exception):
    """The text cannot be read or edited safely; the message is one sentence without the file name."""


# ---------------------------------------------------------------------------------------------
# Meaning


def loads(text):
    """Plain data of a TOML text (a leading BOM is allowed, as containerd and CRI-O allow it)."""
    if text.startswith(BOM):
        text = text[1:]
    if _toml_parser is not None:
        try:
            return _toml_parser.loads(text)
        except Exception as exc:
            message = str(exc)
            match = _POSITION.search(message)
            if match:
                reason = message[: match.start()].rstrip(".")
                raise TomlTextError(f"line {match.group(1)}, column {match.group(2)}: {reason}") from None
            raise TomlTextError(message.rstrip(".")) from None
    if _tomlkit is None:  # pragma: no cover
        raise TomlTextError("no TOML parser is available")
    try:  # pragma: no cover - old Pythons only
        return _tomlkit.parse(text).unwrap()
    except Exception as exc:  # pragma: no cover
        raise TomlTextError(str(exc).rstrip(".")) from None


def dotted(parts):
    """A key path as TOML writes it (quoted where a part is not a bare key)."""
    return ".".join(key_text(part) for part in parts)


def key_text(key):
    return key if _BARE.match(key) else basic_string(key)


def basic_string(value):
    # json escapes what TOML basic strings must escape, except DEL.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def literal_string(value):
    """``value`` in 'single quotes' where that can hold it, else None."""
    if "'" in value or any((ord(c) < 32 and c != "\t") or c == "\x7f" for c in value):
        return None
    return "'" + value + "'"


def value_text(value, literal=False):
    """A TOML value for plain data (strings quoted like the file, where ``literal`` says so)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return (literal and literal_string(value)) or basic_string(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(value_text(item, literal) for item in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{key_text(k)} = {value_text(v, literal)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


# ---------------------------------------------------------------------------------------------
# Where statements stand


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


class _Lexer:
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
            i = at + 3
            while i < self.n:
                if text[i] == "\\":
                    i += 2
                    continue
                if text.startswith('"""', i):
                    j = i + 3
                    while j < self.n and j < i + 5 and text[j] == '"':
                        j += 1
                    return j
                i += 1
            self.error(at, "a multi-line string is not closed")
        if text.startswith("'''", at):
            i = text.find("'''", at + 3)
            if i < 0:
                self.error(at, "a multi-line string is not closed")
            j = i + 3
            while j < self.n and j < i + 5 and text[j] == "'":
                j += 1
            return j
        c = text[at] if at < self.n else ""
        if c == '"':
            return self.basic_end(at)
        if c == "'":
            end = text.find("'", at + 1)
            if end < 0 or "\n" in text[at:end]:
                self.error(at, "a string is not closed")
            return end + 1
        if c == "[":
            i = self.skip_ws_comments_newlines(at + 1)
            while i < self.n and text[i] != "]":
                i = self.value(i)
                i = self.skip_ws_comments_newlines(i)
                if i < self.n and text[i] == ",":
                    i = self.skip_ws_comments_newlines(i + 1)
            if i >= self.n:
                self.error(at, "an array is not closed")
            return i + 1
        if c == "{":
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
        # A number, boolean or date-time: up to a comment, a separator or the line's end.
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
    lexer = _Lexer(text)
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
        if _BARE.match(part):
            rest.append(part)
        else:
            rest.append((literal and literal_string(part)) or basic_string(part))
    return ".".join(raw[:shared] + rest)


def _decode_basic(body):
    try:
        return json.loads('"' + re.sub(r"\\U([0-9A-Fa-f]{8})", lambda m: chr(int(m.group(1), 16)), body) + '"')
    except (ValueError, OverflowError):
        return body


def scan(text):
    """Every table header and key/value pair of ``text``, in order."""
    lexer = _Lexer(text)
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
        c = text[at]
        if c in "\r\n":
            at = lexer.after_break(at)
            continue
        if c == "#":
            at = lexer.after_break(at)
            continue
        if c == "[":
            array = text.startswith("[[", at)
            parts, after = lexer.key(at + (2 if array else 1))
            after = lexer.skip_ws(after)
            closing = "]]" if array else "]"
            if not text.startswith(closing, after):
                lexer.error(after, "a table header is not closed")
            after += len(closing)
            table = parts
            in_array = array or any(s.kind == "array" and parts[: len(s.path)] == s.path for s in statements)
            statement = Statement("array" if array else "table", parts, parts, line_start, None, indent, in_array)
        else:
            parts, after = lexer.key(at)
            after = lexer.skip_ws(after)
            if after >= lexer.n or text[after] != "=":
                lexer.error(after, "'=' was expected after a key")
            value_start = lexer.skip_ws(after + 1)
            value_end = lexer.value(value_start)
            statement = Statement("keyval", table + parts, table, line_start, None, indent, in_array)
            statement.value_start, statement.value_end = value_start, value_end
            after = value_end
        after = lexer.skip_ws(after)
        if after < lexer.n and text[after] == "#":
            statement.comment_start = after
            after = lexer.line_break(after)
        elif after < lexer.n and text[after] not in "\r\n":
            lexer.error(after, "the line goes on after a complete statement")
        statement.eol = lexer.line_break(after)
        statement.end = lexer.after_break(after)
        statements.append(statement)
        at = statement.end
    return statements


# ---------------------------------------------------------------------------------------------
# A document: the text, its statements, and the edits made to it


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
        lexer = _Lexer(self.text)
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


def verify(text, expected, source_label):
    """Raise TomlTextError unless ``text`` parses to exactly ``expected``."""
    try:
        data = loads(text)
    except TomlTextError as exc:
        raise TomlTextError(f"the edited text would not parse ({exc}); {source_label}") from None
    if data != expected:
        raise TomlTextError(f"the edited text would not mean what was intended; {source_label}")
