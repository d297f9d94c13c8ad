"""The module's containerd edits, judged by real containerd.

Every edited file goes through `containerd --config FILE config dump` (containerd 1.6 from Debian for
version 2 files, containerd 2.x built by scripts/build-containerd2.sh for version 3 files): the
effective config must hold every original setting plus the nvidia runtime, and `state: absent`
must give back the original effective config.
"""

from __future__ import annotations

import functools
import shutil

import pytest
import tomllib
from conftest import CONFIGS, built_containerd, config_dump, containerd_default

RUNTIME = "/usr/bin/nvidia-container-runtime"
CRI = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}


def flatten(node, prefix=()):
    flat = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, (*prefix, key)))
        elif (*prefix, key) == ("imports",):
            flat[("imports",)] = sorted(value)  # containerd lists the loaded files in no fixed order
        else:
            flat[(*prefix, key)] = value
    return flat


def effective(options, key):
    """An option as the runc shim sees it: a missing option is its zero value."""
    return options.get(key, ZERO.get(type(RUNC_DEFAULTS.get(key))))


ZERO = {str: "", int: 0, bool: False, list: []}
# The option types of containerd's runc shim (its default config lists them all with zero values).
RUNC_DEFAULTS = {
    "BinaryName": "",
    "CriuImagePath": "",
    "CriuPath": "",
    "CriuWorkPath": "",
    "IoGid": 0,
    "IoUid": 0,
    "NoNewKeyring": False,
    "NoPivotRoot": False,
    "Root": "",
    "ShimCgroup": "",
    "SystemdCgroup": False,
}


def comment_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


def prepare(name, tmp_path, binary):
    """The config under test in tmp_path: a sample file, or containerd's own default."""
    path = tmp_path / "config.toml"
    if name == "default":
        path.write_text(containerd_default(binary))
    else:
        text = (CONFIGS / name).read_text()
        if "@CONFD@" in text:
            confd = tmp_path / "conf.d"
            confd.mkdir()
            shutil.copy(CONFIGS / "v2-imports.conf.d.toml", confd / "10-site.toml")
            text = text.replace("@CONFD@", str(confd))
        path.write_text(text)
    return path


def assert_present_and_absent(run_module, binary, path, version):
    run_module = functools.partial(run_module, config_mode="file")
    original = path.read_bytes()
    before = config_dump(binary, path)
    cri = ("plugins", CRI[version], "containerd")

    checked = run_module(runtime="containerd", config_path=str(path), check=True, diff=True)
    assert checked["changed"] is True
    assert path.read_bytes() == original, "check mode wrote the file"

    result = run_module(runtime="containerd", config_path=str(path), backup=True)
    assert result["changed"] is True
    assert result["config_version"] == version
    assert result["default_runtime"] == "nvidia"
    assert path.read_text() == checked["diff"]["after"], "check mode announced something else"
    with open(result["backup_file"], "rb") as handle:
        assert handle.read() == original
    for comment in comment_lines(original.decode()):
        assert comment in path.read_text()
    again = run_module(runtime="containerd", config_path=str(path))
    assert again["changed"] is False

    after = config_dump(binary, path)
    flat_before, flat_after = flatten(before), flatten(after)
    for key, value in flat_before.items():
        if key == (*cri, "default_runtime_name"):
            continue
        assert flat_after.get(key, "<missing>") == value, "containerd lost {}".format(".".join(key))
    for key in set(flat_after) - set(flat_before):
        assert key[: len(cri) + 2] == (*cri, "runtimes", "nvidia"), f"unexpected new setting {key}"

    section = after
    for key in cri:
        section = section[key]
    assert section["default_runtime_name"] == "nvidia"
    nvidia, runc = section["runtimes"]["nvidia"], section["runtimes"]["runc"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == RUNTIME
    # containerd fills in runc's defaults from its built-in config; nvidia gets what the file says.
    # Either way the shim sees the same values.
    for key, value in runc.get("options", {}).items():
        if key != "BinaryName":
            assert effective(nvidia["options"], key) == value, f"nvidia did not inherit runc's {key}"
    for key, value in runc.items():
        if key not in ("options", "runtime_type"):
            assert nvidia.get(key) == value, f"nvidia did not inherit runc's {key}"
    assert result["runtime_entry"]["options"]["BinaryName"] == RUNTIME

    assert_laid_out_like_runc(path.read_text())

    removed = run_module(runtime="containerd", config_path=str(path), state="absent")
    assert removed["changed"] is True
    assert config_dump(binary, path) == before
    assert path.read_bytes() == original, "absent after present did not give back the original bytes"
    assert run_module(runtime="containerd", config_path=str(path), state="absent")["changed"] is False
    return after


def indent_of(lines, suffix):
    """The indentation of the header line ending in ``suffix`` and of the first key under it."""
    at = next(i for i, line in enumerate(lines) if line.rstrip().endswith(suffix))
    key = next(line for line in lines[at + 1 :] if line.strip() and not line.strip().startswith("#"))
    return lines[at][: len(lines[at]) - len(lines[at].lstrip())], key[: len(key) - len(key.lstrip())]


def assert_laid_out_like_runc(text):
    """The nvidia tables and their keys sit at the indentation of runc's."""
    lines = text.splitlines()
    assert indent_of(lines, ".runtimes.nvidia]") == indent_of(lines, ".runtimes.runc]")
    if any(line.rstrip().endswith(".runtimes.runc.options]") for line in lines):
        assert indent_of(lines, ".runtimes.nvidia.options]") == indent_of(lines, ".runtimes.runc.options]")


SAMPLES = sorted(path.name for path in CONFIGS.glob("*.toml") if path.name != "v2-existing-nvidia.toml")


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("set_as_default", [True, False])
def test_present_then_absent_gives_back_the_sample_bytes(name, set_as_default, tmp_path, run_module):
    # Every sample config without an nvidia runtime of its own (v2-existing-nvidia.toml has one).
    path = tmp_path / name
    original = (CONFIGS / name).read_bytes()
    path.write_bytes(original)
    runtime = "crio" if name.startswith("crio") else "containerd"
    args = {"runtime": runtime, "config_path": str(path), "set_as_default": set_as_default}
    if runtime == "containerd":
        args["config_mode"] = "file"  # v2-imports.toml imports a directory: auto would choose a drop-in
    assert run_module(**args)["changed"] is True
    assert path.read_bytes() != original
    assert run_module(state="absent", **args)["changed"] is True
    assert path.read_bytes() == original


@pytest.mark.parametrize("name", ["default", "v2-mirrors-comments.toml", "v2-imports.toml"])
def test_version2_configs_with_containerd_16(name, tmp_path, run_module, containerd16):
    path = prepare(name, tmp_path, containerd16)
    after = assert_present_and_absent(run_module, containerd16, path, 2)
    if name == "v2-mirrors-comments.toml":
        nvidia = after["plugins"][CRI[2]]["containerd"]["runtimes"]["nvidia"]
        assert nvidia["options"]["SystemdCgroup"] is True
        assert nvidia["privileged_without_host_devices"] is True
        mirrors = after["plugins"][CRI[2]]["registry"]["mirrors"]
        assert mirrors["docker.io"]["endpoint"][0] == "https://mirror.example.internal"
    if name == "v2-imports.toml":
        assert after["plugins"]["io.containerd.gc.v1.scheduler"]["pause_threshold"] == 0.05  # from the import
        assert after["debug"]["level"] == "warn"


@pytest.mark.parametrize("name", ["default", "v3-node.toml"])
def test_version3_configs_with_containerd_2(name, tmp_path, run_module, containerd2):
    path = prepare(name, tmp_path, containerd2)
    assert tomllib.loads(path.read_text())["version"] == 3
    after = assert_present_and_absent(run_module, containerd2, path, 3)
    assert "runtimes" not in after["plugins"].get(CRI[2], {}).get("containerd", {})


@pytest.mark.parametrize("set_as_default", [True, False])
def test_debian_packaged_config_keeps_runc_with_containerd_16(set_as_default, tmp_path, run_module, containerd16):
    # Debian's config.toml lists no runtime, so containerd 1.6 serves its built-in runc. A file that
    # lists nvidia alone would lose it (containerd 1.x takes the file's runtimes table as the whole
    # list): pods asking for runc would fail, and a default left at runc stops the CRI plugin.
    path = prepare("v2-debian-package.toml", tmp_path, containerd16)
    original = path.read_bytes()
    before = config_dump(containerd16, path)["plugins"][CRI[2]]["containerd"]
    assert set(before["runtimes"]) == {"runc"}
    run_module(runtime="containerd", config_path=str(path), set_as_default=set_as_default)
    section = config_dump(containerd16, path)["plugins"][CRI[2]]["containerd"]
    assert set(section["runtimes"]) == {"nvidia", "runc"}
    assert section["runtimes"]["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert "BinaryName" not in section["runtimes"]["runc"].get("options", {})
    assert section["default_runtime_name"] == ("nvidia" if set_as_default else "runc")
    assert run_module(runtime="containerd", config_path=str(path), set_as_default=set_as_default)["changed"] is False
    run_module(runtime="containerd", config_path=str(path), set_as_default=set_as_default, state="absent")
    assert path.read_bytes() == original
    assert config_dump(containerd16, path)["plugins"][CRI[2]]["containerd"] == before


@pytest.fixture(scope="session")
def containerd24():
    return built_containerd("build-containerd24.sh", " 2.4.")


@pytest.mark.parametrize("name", ["default", "v3-node.toml"])
def test_configs_with_containerd_24(name, tmp_path, run_module, containerd24):
    """containerd 2.4, the newest 2.x: its own default config (version 4) and a version 3 file it migrates."""
    path = prepare(name, tmp_path, containerd24)
    version = tomllib.loads(path.read_text())["version"]
    assert version == (4 if name == "default" else 3)
    assert_present_and_absent(run_module, containerd24, path, version)


def test_version2_file_read_by_containerd_2(tmp_path, run_module, containerd2):
    # containerd 2.x migrates version 2 files on load: the edit must survive that too.
    path = prepare("v2-mirrors-comments.toml", tmp_path, containerd2)
    run_module(runtime="containerd", config_path=str(path))
    section = config_dump(containerd2, path)["plugins"][CRI[3]]["containerd"]
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME
    assert section["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True


def test_config_with_an_nvidia_runtime_already(tmp_path, run_module, containerd16):
    path = prepare("v2-existing-nvidia.toml", tmp_path, containerd16)
    before = config_dump(containerd16, path)
    result = run_module(runtime="containerd", config_path=str(path), diff=True)
    # The existing entry is ours to keep; only its cgroup driver follows runc's.
    assert result["changed"] is True
    diff_lines = [
        line
        for line in __import__("difflib").unified_diff(
            result["diff"]["before"].splitlines(), result["diff"]["after"].splitlines(), lineterm="", n=0
        )
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert diff_lines == ["-            SystemdCgroup = false", "+            SystemdCgroup = true"]
    after = config_dump(containerd16, path)
    runtimes = after["plugins"][CRI[2]]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    assert flatten(before).keys() == flatten(after).keys()
    assert run_module(runtime="containerd", config_path=str(path))["changed"] is False
    # Without a record of an earlier default, absent falls back to containerd's own (runc).
    run_module(runtime="containerd", config_path=str(path), state="absent")
    section = config_dump(containerd16, path)["plugins"][CRI[2]]["containerd"]
    assert section["default_runtime_name"] == "runc"
    assert "nvidia" not in section["runtimes"]


def test_missing_file_is_created_from_containerd_config_default(tmp_path, run_module, containerd16):
    path = tmp_path / "etc" / "containerd" / "config.toml"
    result = run_module(runtime="containerd", config_path=str(path))
    assert result["changed"] is True
    text = path.read_text()
    assert text.startswith(containerd_default(containerd16).splitlines()[0])
    section = config_dump(containerd16, path)["plugins"][CRI[2]]["containerd"]
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME


def test_unparsable_file_is_left_alone(tmp_path, run_module):
    path = tmp_path / "config.toml"
    path.write_bytes(b'version = 2\n[plugins."io.containerd.grpc.v1.cri"\n')
    result = run_module(runtime="containerd", config_path=str(path), expect_failure=True)
    assert result["msg"].startswith(f"{path} could not be parsed as TOML: line 2")
    assert path.read_bytes() == b'version = 2\n[plugins."io.containerd.grpc.v1.cri"\n'


def test_an_import_that_carries_the_cri_section_wins_in_containerd_1(tmp_path, run_module, containerd16, containerd2):
    # containerd 1.6 replaces a whole plugin section with an imported one; 2.x merges key by key.
    path = prepare("v2-imports.toml", tmp_path, containerd16)
    override = tmp_path / "conf.d" / "20-cri.toml"
    override.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  max_container_log_line_size = 32768\n')
    original = path.read_text()
    result = run_module(runtime="containerd", config_path=str(path), config_mode="file")
    assert result["changed"] is True
    assert len(result["warnings"]) == 1
    warning = result["warnings"][0]
    if isinstance(warning, dict):  # ansible-core 2.19 sends warnings as structured summaries
        warning = warning["event"]["msg"]
    assert warning.startswith(f"{override} also configures the plugin io.containerd.grpc.v1.cri")
    old = config_dump(containerd16, path)["plugins"][CRI[2]]
    assert old["containerd"]["default_runtime_name"] == "runc"  # what the warning is about
    assert "nvidia" not in old["containerd"]["runtimes"]
    new = config_dump(containerd2, path)["plugins"][CRI[3]]["containerd"]
    assert new["default_runtime_name"] == "nvidia"

    # The mode that works there: a main file that imports a directory gets a drop-in (auto), which
    # sorts last and carries the CRI section containerd 1.6 runs with (the override's) plus the runtime.
    path.write_text(original)
    result = run_module(runtime="containerd", config_path=str(path))
    assert result["config_mode"] == "drop_in"
    assert result["config_path"] == str(tmp_path / "conf.d" / "99-nvidia.toml")
    assert path.read_text() == original  # it imports the directory already
    cri = config_dump(containerd16, path)["plugins"][CRI[2]]
    assert cri["max_container_log_line_size"] == 32768
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    assert set(cri["containerd"]["runtimes"]) == {"nvidia", "runc"}
