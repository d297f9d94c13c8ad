# Property tests of the runtime config edits: for generated configs of every format (extra keys,
# tables, arrays, comments, tables out of order), `present` keeps everything else, a second
# `present` changes nothing, and `absent` after `present` gives back what the file meant before.
# tomllib (the standard library's parser, independent of tomlkit) judges what a TOML text means.
from __future__ import annotations

import copy
import json
import re

import pytest
import tomlkit
import tomllib
from ansible_collections.gpuops.k8s.plugins.module_utils import _runtime_config as rc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

RUNTIME = "/usr/bin/nvidia-container-runtime"
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CRI = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}

names = st.from_regex(r"\Ax_[a-z][a-z0-9_]{0,6}\Z")
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 -_./:", max_size=12)
scalars = st.one_of(st.integers(-10_000, 10_000), st.booleans(), words)
values = st.one_of(scalars, st.lists(st.integers(0, 99), max_size=3), st.lists(words, max_size=3))
comment_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ,.", min_size=1, max_size=20)
comments = st.lists(comment_text, max_size=2)


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


@st.composite
def toml_table(draw, header, fixed=(), indent=""):
    """Lines of one table: an optional comment, the header, fixed keys, random keys."""
    lines = [f"{indent}# {text}" for text in draw(comments)]
    if header is not None:
        trailing = draw(st.one_of(st.none(), comment_text))
        lines.append(f"{indent}[{header}]" + (f"  # {trailing}" if trailing else ""))
    # At least one key per table: tomlkit fails to parse some out-of-order layouts that have an
    # empty table among them (valid TOML that the module then reports as unparsable).
    extra = draw(st.dictionaries(names, values, min_size=0 if fixed or header is None else 1, max_size=3))
    for key, value in [*fixed, *extra.items()]:
        lines.append(f"{indent}  {key} = {toml_value(value)}")
    return lines


def lines_of(text):
    # Stripped: tomlkit re-indents some headers in layouts it cannot reproduce verbatim.
    return [line.strip() for line in text.splitlines() if line.strip()]


def keeps_lines(result, original):
    """Every line of ``original`` is in ``result``, in order; anything extra is a table header.

    (A table that had no header of its own keeps the one it got when `present` put the default key
    in it; that changes no meaning.)
    """
    extra = []
    remaining = iter(lines_of(result))
    for line in lines_of(original):
        for candidate in remaining:
            if candidate == line:
                break
            extra.append(candidate)
        else:
            return False
    extra.extend(remaining)
    return all(line.startswith("[") for line in extra)


def comment_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


@st.composite
def containerd_configs(draw):
    version = draw(st.sampled_from([2, 3]))
    cri = f'plugins."{CRI[version]}"'
    blocks = [[f"version = {version}", *draw(toml_table(None))]]
    tables = []
    if draw(st.booleans()):
        tables.append(draw(toml_table("debug", [("level", "info")])))
    tables.append(draw(toml_table('plugins."io.containerd.x_other.v1"')))
    if draw(st.booleans()):
        tables.append(draw(toml_table(cri)))
    has_runc = draw(st.booleans())
    containerd_keys = [("snapshotter", "overlayfs")]
    default = draw(st.sampled_from([None, "runc", "kata"]))
    if default == "runc" and not has_runc:
        default = None
    if default:
        containerd_keys.insert(0, ("default_runtime_name", default))
    if draw(st.booleans()) or default:
        tables.append(draw(toml_table(f"{cri}.containerd", containerd_keys, indent="  ")))
    if has_runc:
        # runc and its options stay together, parent first: tomlkit cannot parse every order of
        # nested headers (a sub-table before its parent, among out-of-order tables).
        runc = draw(toml_table(f"{cri}.containerd.runtimes.runc", [("runtime_type", "io.containerd.runc.v2")], "    "))
        options = [("SystemdCgroup", draw(st.booleans()))]
        if draw(st.booleans()):
            options.append(("BinaryName", "/usr/sbin/runc"))
        tables.append(runc + draw(toml_table(f"{cri}.containerd.runtimes.runc.options", options, "      ")))
    if default == "kata" or draw(st.booleans()):
        tables.append(
            draw(toml_table(f"{cri}.containerd.runtimes.kata", [("runtime_type", "io.containerd.kata.v2")], "    "))
        )
    if draw(st.booleans()):
        tables.append(draw(toml_table(f'{cri}.registry.mirrors."docker.io"', [("endpoint", ["https://m.example"])])))
    # Shuffled tables give out-of-order layouts; the CRI tables keep parent-before-child order
    # among themselves (tomlkit cannot parse a sub-table before its parent among split tables).
    shuffled = draw(st.permutations(range(len(tables))))
    chain = [i for i in range(len(tables)) if tables[i][-1] and cri in "\n".join(tables[i])]
    slots = iter(sorted(p for p, i in enumerate(shuffled) if i in chain))
    order = list(shuffled)
    for index in chain:
        order[next(slots)] = index
    blocks.extend(tables[i] for i in order)
    return version, "\n".join(line for block in blocks for line in block) + "\n"


def without_ours(new, original, path, default_key, name):
    """``new`` with what `present` added taken out again (to compare with ``original``)."""
    new = copy.deepcopy(new)
    node, orig = new, original
    for key in path:
        if key not in orig:
            del node[key]
            return new
        node, orig = node[key], orig[key]
    if default_key in orig:
        node[default_key] = orig[default_key]
    else:
        node.pop(default_key, None)
    if "runtimes" not in orig:
        del node["runtimes"]
    else:
        del node["runtimes"][name]
    return new


@SETTINGS
@given(containerd_configs(), st.booleans())
def test_containerd_present_keeps_everything_and_absent_restores(config, set_as_default):
    version, text = config
    original = tomllib.loads(text)
    path = ["plugins", CRI[version], "containerd"]

    try:
        present = rc.edit_containerd(text, "config.toml", "nvidia", RUNTIME, set_as_default, "present")
    except rc.ConfigError as err:
        # Some valid out-of-order layouts are beyond tomlkit's parser; the module's contract there
        # is one sentence and no edit. Anything else is a failure of this test.
        assert "could not be parsed as TOML" in str(err)
        with pytest.raises(Exception):  # noqa: B017 - tomlkit raises several kinds here
            tomlkit.parse(text)
        return
    edited = tomllib.loads(present.text)
    assert present.changed
    assert without_ours(edited, original, path, "default_runtime_name", "nvidia") == original
    section = edited["plugins"][CRI[version]]["containerd"]
    runc_options = original.get("plugins", {}).get(CRI[version], {}).get("containerd", {})
    runc_options = runc_options.get("runtimes", {}).get("runc", {}).get("options", {})
    assert section["runtimes"]["nvidia"]["options"] == {**runc_options, "BinaryName": RUNTIME}
    assert section["runtimes"]["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    if set_as_default:
        assert section["default_runtime_name"] == "nvidia"
    for comment in comment_lines(text):
        assert comment in present.text

    again = rc.edit_containerd(present.text, "config.toml", "nvidia", RUNTIME, set_as_default, "present")
    assert not again.changed
    assert again.text == present.text

    absent = rc.edit_containerd(present.text, "config.toml", "nvidia", RUNTIME, set_as_default, "absent")
    assert tomllib.loads(absent.text) == original
    assert keeps_lines(absent.text, text)
    # Byte for byte, unless the default went into a table that had no header of its own (it keeps
    # the header it got) or tomlkit cannot write the file back verbatim at all (some out-of-order
    # layouts: sibling headers under an implicit parent gain indentation).
    # Debian's tomlkit 0.11 also re-indents out-of-order tables once the document has been edited, so
    # byte identity is only asked of files whose tables are in order; their meaning and every line's
    # text are checked above in every case.
    verbatim = tomlkit.dumps(tomlkit.parse(text)) == text and tables_in_order(text)
    if verbatim and (not set_as_default or f'[plugins."{CRI[version]}".containerd]' in text):
        assert absent.text == text


def header_path(line):
    """The dotted key of a table header line, as a tuple of key parts."""
    return tuple(part.strip('"') for part in re.findall(r'"[^"]*"|[^.\s"]+', line.strip().strip("[]")))


def tables_in_order(text):
    """True when, for every key prefix, the headers under it form one contiguous run."""
    paths = [header_path(line) for line in text.splitlines() if line.strip().startswith("[")]
    for path in paths:
        for length in range(1, len(path) + 1):
            prefix = path[:length]
            runs = [i for i, other in enumerate(paths) if other[:length] == prefix]
            if runs != list(range(runs[0], runs[-1] + 1)):
                return False
    return True


def test_tables_in_order_tells_split_tables_apart():
    assert tables_in_order("[a]\nx = 1\n[a.b]\ny = 2\n[c]\n")
    assert not tables_in_order("[a]\n[c]\n[a.b]\n")
    assert not tables_in_order('[plugins."x.y"]\n[plugins.other]\n  [plugins."x.y".runtimes.kata]\n')


@st.composite
def crio_configs(draw):
    tables = [draw(toml_table("crio.image", [("pause_image", "registry.k8s.io/pause:3.9")]))]
    runtime_keys = []
    default = draw(st.sampled_from([None, "crun", "runc"]))
    if default:
        runtime_keys.append(("default_runtime", default))
    if default or draw(st.booleans()):
        tables.append(draw(toml_table("crio.runtime", runtime_keys)))
    if draw(st.booleans()):
        tables.append(draw(toml_table("crio.runtime.runtimes.crun", [("runtime_path", "/usr/bin/crun")])))
    head = draw(toml_table(None)) if draw(st.booleans()) else []
    return "\n".join(line for block in [head, *draw(st.permutations(tables))] for line in block) + "\n"


@SETTINGS
@given(crio_configs(), st.booleans())
def test_crio_present_keeps_everything_and_absent_restores(text, set_as_default):
    original = tomllib.loads(text)
    present = rc.edit_crio(text, "99-nvidia.toml", "nvidia", RUNTIME, set_as_default, "present")
    edited = tomllib.loads(present.text)
    assert without_ours(edited, original, ["crio", "runtime"], "default_runtime", "nvidia") == original
    assert edited["crio"]["runtime"]["runtimes"]["nvidia"] == {"runtime_path": RUNTIME, "runtime_type": "oci"}
    for comment in comment_lines(text):
        assert comment in present.text
    assert not rc.edit_crio(present.text, "99-nvidia.toml", "nvidia", RUNTIME, set_as_default, "present").changed
    absent = rc.edit_crio(present.text, "99-nvidia.toml", "nvidia", RUNTIME, set_as_default, "absent")
    assert tomllib.loads(absent.text) == original
    assert keeps_lines(absent.text, text)


json_leaves = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), words)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(words, inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def docker_configs(draw):
    data = draw(st.dictionaries(names, json_values, max_size=5))
    if draw(st.booleans()):
        data["runtimes"] = {"crun": {"path": "/usr/bin/crun"}} if draw(st.booleans()) else {}
    default = draw(st.sampled_from([None, "runc", "crun"]))
    if default:
        data["default-runtime"] = default
    keys = draw(st.permutations(list(data)))
    ordered = {key: data[key] for key in keys}
    style = draw(st.sampled_from(["compact", "spaced", "2", "4", "tabs", "inline-arrays"]))
    return ordered, docker_text(ordered, style) + draw(st.sampled_from(["", "\n"]))


def docker_text(data, style):
    """daemon.json as people write it: compact, one line, indented by 2/4/tab, or indented with inline arrays."""
    if style == "compact":
        return json.dumps(data, separators=(",", ":"))
    if style == "spaced":
        return json.dumps(data)
    if style == "inline-arrays":
        # Top-level members on their own lines, every value (arrays included) on one line.
        members = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in data.items()]
        return "{\n" + ",\n".join(members) + "\n}" if members else "{}"
    return json.dumps(data, indent={"2": 2, "4": 4, "tabs": "\t"}[style])


def member_texts(text):
    """Each top-level member's exact text (key through value) as json's own decoder finds it."""
    decoder = json.JSONDecoder()
    found = {}
    at = text.index("{") + 1
    while True:
        while text[at] in " \t\r\n,":
            at += 1
        if text[at] == "}":
            return found
        key, end = json.decoder.scanstring(text, at + 1)
        start = end
        while text[start] in " \t\r\n:":
            start += 1
        _value, end = decoder.raw_decode(text, start)
        found[key] = text[at:end]
        at = end


@SETTINGS
@given(docker_configs(), st.booleans())
def test_docker_present_keeps_everything_and_absent_restores(config, set_as_default):
    original, text = config
    present = rc.edit_docker(text, "daemon.json", "nvidia", RUNTIME, set_as_default, "present", None)
    edited = json.loads(present.text)
    assert present.text.endswith("\n") == text.endswith("\n")
    # Bytes: every member the edit does not own keeps its exact text, and the text around them stays.
    before, after = member_texts(text), member_texts(present.text)
    for key, member in before.items():
        if key not in ("runtimes", "default-runtime"):
            assert after[key] == member
    if original.get("runtimes"):
        for runtime in original["runtimes"]:
            assert member_texts(before["runtimes"].split(":", 1)[1])[runtime] in after["runtimes"]
    assert edited["runtimes"]["nvidia"] == {"path": RUNTIME, "args": []}
    assert [key for key in edited if key in original] == list(original)
    rest = {k: v for k, v in edited.items() if k not in ("runtimes", "default-runtime")}
    assert rest == {k: v for k, v in original.items() if k not in ("runtimes", "default-runtime")}
    assert {k: v for k, v in edited["runtimes"].items() if k != "nvidia"} == original.get("runtimes", {})
    if set_as_default:
        assert edited["default-runtime"] == "nvidia"
    else:
        assert edited.get("default-runtime") == original.get("default-runtime")

    again = rc.edit_docker(present.text, "daemon.json", "nvidia", RUNTIME, set_as_default, "present", present.state_doc)
    assert not again.changed
    assert again.state_doc == present.state_doc

    absent = rc.edit_docker(present.text, "daemon.json", "nvidia", RUNTIME, set_as_default, "absent", present.state_doc)
    assert json.loads(absent.text) == original
    assert absent.state_doc is None
    # Byte for byte, whether or not the file had runtimes or a default before.
    assert absent.text == text
