# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""TOML meaning and spelling: what a text means, and how a value or key is written (private).

Part of the text editing described in ``_toml_text``: this file owns the two ends of an edit that do not
look at the text's layout. ``loads`` and ``verify`` give a text's meaning with a strict parser
(``tomllib``, ``tomli``, or tomlkit's parser on old Pythons) and judge an edit by it; ``value_text``,
``dotted`` and the string helpers write the TOML for plain data that an edit puts into the text.
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
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


class TomlTextError(Exception):
    """The text cannot be read or edited safely; the message is one sentence without the file name."""


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
    return key if BARE_KEY.match(key) else basic_string(key)


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


def verify(text, expected, source_label):
    """Raise TomlTextError unless ``text`` parses to exactly ``expected``."""
    try:
        data = loads(text)
    except TomlTextError as exc:
        raise TomlTextError(f"the edited text would not parse ({exc}); {source_label}") from None
    if data != expected:
        raise TomlTextError(f"the edited text would not mean what was intended; {source_label}")
