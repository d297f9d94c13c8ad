# Unit tests of the TOML text engine: where statements stand, edits that touch only their spans,
# and the parser's verdict that stops an edit whose result would mean something else.
from __future__ import annotations

import pytest
import tomllib
from ansible_collections.gpuops.k8s.plugins.module_utils import _toml_text as tt
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import ConfigError, TomlEdit

TRICKY = '''\ufeff# a comment with [brackets] and = signs
title = "a [not a header] # not a comment"
multi = """
[not.a.header]
key = "still the string" \\""" """
lit = \'\'\'x = 1
[nor.this]\'\'\'
arr = [
  1, # comment inside
  [2, 3],
  { a = "}" },
]
when = 1979-05-27 07:32:00Z
[a."b.c".d] # header comment
x.y = 1
'x z' = 2
[[list]]
k = 1
[[list]]
k = 2
[list.sub]
v = 3
'''


def test_scan_finds_statements_not_lookalikes_inside_values():
    statements = tt.scan(TRICKY)
    assert [(s.kind, s.path) for s in statements] == [
        ("keyval", ("title",)),
        ("keyval", ("multi",)),
        ("keyval", ("lit",)),
        ("keyval", ("arr",)),
        ("keyval", ("when",)),
        ("table", ("a", "b.c", "d")),
        ("keyval", ("a", "b.c", "d", "x", "y")),
        ("keyval", ("a", "b.c", "d", "x z")),
        ("array", ("list",)),
        ("keyval", ("list", "k")),
        ("array", ("list",)),
        ("keyval", ("list", "k")),
        ("table", ("list", "sub")),
        ("keyval", ("list", "sub", "v")),
    ]
    when = statements[4]
    assert TRICKY[when.value_start : when.value_end] == "1979-05-27 07:32:00Z"
    header = statements[5]
    assert TRICKY[header.comment_start : header.eol] == "# header comment"
    # Tables inside an array of tables are never taken for tables of the same name elsewhere.
    assert all(s.in_array for s in statements[8:])


def test_crlf_and_bom_spans():
    text = '\ufeffversion = 2\r\n[x]\r\n  k = "v" # c\r\n'
    version, _header, key = tt.scan(text)
    assert text[version.start : version.end] == "version = 2\r\n"
    assert version.start == 1  # after the BOM
    assert text[key.value_start : key.value_end] == '"v"'
    assert text[key.comment_start : key.eol] == "# c"
    assert text[key.eol : key.end] == "\r\n"
    assert tt.loads(text) == {"version": 2, "x": {"k": "v"}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a = [1, 2\n", "line 1, column 5: an array is not closed"),
        ('a = "x\n', "line 1, column 5: a string is not closed"),
        ("[a\n", "line 1, column 3: a table header is not closed"),
        ('a = "x" b\n', "line 1, column 9: the line goes on after a complete statement"),
    ],
)
def test_scan_errors_name_line_and_column(text, message):
    with pytest.raises(tt.TomlTextError) as err:
        tt.scan(text)
    assert str(err.value) == message


def test_loads_error_names_line_and_column():
    with pytest.raises(tt.TomlTextError) as err:
        tt.loads("[a]\nx = 1\nx = 2\n")
    assert str(err.value).startswith("line 3, column ")


@pytest.mark.parametrize(
    ("value", "literal", "expected"),
    [
        (True, False, "true"),
        (7, False, "7"),
        (1.5, False, "1.5"),
        (float("inf"), False, "inf"),
        ('a"b\x7f', False, '"a\\"b\\u007f"'),
        ("/usr/bin/x", True, "'/usr/bin/x'"),
        ("it's", True, '"it\'s"'),
        (["a", 1], False, '["a", 1]'),
        ({"a b": {"c": False}}, False, '{ "a b" = { c = false } }'),
    ],
)
def test_value_text_is_toml_that_reads_back(value, literal, expected):
    rendered = tt.value_text(value, literal)
    assert rendered == expected
    assert tomllib.loads(f"v = {rendered}")["v"] == value


def test_header_spelling_follows_the_neighbour():
    text = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n"
    header = tt.scan(text)[0]
    spelled = tt.header_spelling(text, header, ("plugins", "io.containerd.cri.v1.runtime", "containerd", "x y"))
    assert spelled == "plugins.'io.containerd.cri.v1.runtime'.containerd.'x y'"


def test_verify_refuses_an_edit_that_means_something_else():
    edit = TomlEdit("[a]\nx = 1\n", "f.toml")
    edit.after["a"]["y"] = 2  # the data says y, but the text never got it
    with pytest.raises(ConfigError) as err:
        edit.finish()
    assert str(err.value) == "f.toml: the edited text would not mean what was intended; nothing was written."


def test_keys_go_where_the_table_is_defined():
    # A header section, dotted keys from a parent, an inline table, and no table at all.
    cases = {
        "[t]\nk = 1\n\n[u]\n": ("t", "new"),
        "[p]\nt.k = 1\nother = 2\n": ("p", "t", "new"),
        "t = { k = 1 }\n": ("t", "new"),
        "[u]\n": ("t", "new"),
    }
    for text, parts in cases.items():
        edit = TomlEdit(text, "f.toml")
        edit.set_key(parts, "v")
        new, changed = edit.finish()
        assert changed
        data = tomllib.loads(new)
        node = data
        for key in parts[:-1]:
            node = node[key]
        assert node["new"] == "v", new
        for line in text.splitlines():
            if "{" not in line:
                assert line in new.splitlines(), (line, new)


def test_removing_what_was_added_gives_back_the_bytes():
    text = "# head\n[a]\nx = 1\n\n[b]\ny = 2\n"
    edit = TomlEdit(text, "f.toml")
    edit.add_table(("a", "t"), {"k": 1, "opts": {"o": True}}, after=("a",), model=("a",))
    added, _changed = edit.finish()
    assert "[a.t]\nk = 1\n\n[a.t.opts]\no = true\n" in added
    edit = TomlEdit(added, "f.toml")
    edit.remove(("a", "t"))
    assert edit.finish() == (text, True)
