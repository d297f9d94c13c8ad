"""NVIDIA's `nvidia-ctk runtime configure` beside the collection's nvidia_runtime module, on the tier's configs.

Each side edits its own copy of the same config with the same settings (runtime name nvidia, binary
/usr/bin/nvidia-container-runtime, default or not, CDI or not). Then the configuration each leaves is read the
way the runtime reads it, and the two are compared key by key:

- containerd: `containerd --config FILE config dump` of the main file (which pulls in any drop-in), with real
  containerd 1.6 (Debian), 1.7, 2.1 and 2.4 (scripts/build-containerd*.sh);
- Docker: daemon.json parsed as JSON (dockerd does not run here);
- CRI-O: crio.conf plus crio.conf.d merged by tests/integration/crio_merge, the test double of CRI-O's config
  loading.

Every difference is asserted exactly, so a test fails when the set changes; docs/compared-runtime-config.md
names each one and its reason. nvidia-ctk is NVIDIA's own, v1.18.1, built from its Go module by
scripts/build-toolkit-repo.sh and run from that repository's bin/ (nothing is installed). It writes to the copy
it is given: its --dry-run prints the drop-in and the main file one after the other on stdout, with their
names only in the log, so copies are what can be loaded by containerd.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import tomllib
from conftest import CONFIGS, REPO, built_containerd, config_dump, containerd_default, go_tool

RUNTIME = "/usr/bin/nvidia-container-runtime"
CRI2 = "plugins.io.containerd.grpc.v1.cri"
UNSET = "<unset>"


@pytest.fixture(scope="session")
def nvidia_ctk():
    """NVIDIA's nvidia-ctk 1.18.1 (built on the first call, then cached in $GPUOPS_CACHE/toolkit-repo)."""
    proc = subprocess.run(
        [str(REPO / "scripts" / "build-toolkit-repo.sh")],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
        env=dict(os.environ, GPUOPS_TOOLKIT_VERSION="1.18.1"),
    )
    assert proc.returncode == 0, proc.stderr
    binary = os.path.join(proc.stdout.strip().splitlines()[-1], "bin", "nvidia-ctk")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    assert "version 1.18.1" in version, version
    return binary


@pytest.fixture(scope="session")
def containerd24():
    return built_containerd("build-containerd24.sh", " 2.4.")


@pytest.fixture(scope="session")
def crio_merge():
    return go_tool("crio_merge", ("main.go", "go.mod", "go.sum"))


def ctk(binary, *args):
    return subprocess.run(
        [binary, "runtime", "configure", *args], capture_output=True, text=True, timeout=60, check=False
    )


def ctk_configure(binary, runtime, config, set_as_default, cdi=False, drop_in=None, extra=()):
    """nvidia-ctk with the settings the module gets; the drop-in where 1.18 puts it, relative to ``config``."""
    args = [f"--runtime={runtime}", f"--config={config}", f"--nvidia-runtime-path={RUNTIME}"]
    if drop_in is not None:
        args += ["--drop-in-config", str(drop_in)]
    if set_as_default:
        args.append("--set-as-default")
    if cdi:
        args.append("--cdi.enabled")
    proc = ctk(binary, *args, *extra)
    assert proc.returncode == 0, proc.stderr
    return proc


def differences(nvidia, ours, prefix=""):
    """{dotted key: (NVIDIA's value, ours)} for every key whose value differs; a table one side lacks is one entry."""
    found = {}
    for key in sorted(set(nvidia) | set(ours)):
        left, right = nvidia.get(key, UNSET), ours.get(key, UNSET)
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(left, dict) and isinstance(right, dict):
            found.update(differences(left, right, path))
        elif left != right:
            found[path] = (left, right)
    return found


def flatten(data, prefix=""):
    """{dotted key: value} of every leaf of ``data``."""
    flat = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


def relative(data, root):
    """``data`` with the temporary directory ``root`` written as <dir>, so paths compare across the two copies."""
    return json.loads(json.dumps(data).replace(str(root), "<dir>"))


STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'')


def comment_lines(text):
    """The lines that hold a TOML comment (a '#' outside quoted strings), stripped."""
    return [line.strip() for line in text.splitlines() if "#" in STRING.sub("", line)]


def kept(original, text):
    """How many of the original's comment lines ``text`` still has."""
    lines = {line.strip() for line in text.splitlines()}
    return sum(1 for line in comment_lines(original) if line in lines)


CRI_OVERRIDE = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  max_container_log_line_size = 32768\n'


def stage(name, where, binary=None):
    """``where``/config.toml: a sample of the tier (its @CONFD@ pointed at ``where``/conf.d) or containerd's default.

    ``v2-imports.toml+20-cri``: v2-imports.toml with a second imported file that sets the CRI plugin section.
    """
    where.mkdir(parents=True)
    name, _plus, extra = name.partition("+")
    if name == "default":
        text = containerd_default(binary)
    else:
        text = (CONFIGS / name).read_text()
        if "@CONFD@" in text:
            (where / "conf.d").mkdir()
            shutil.copy(CONFIGS / "v2-imports.conf.d.toml", where / "conf.d" / "10-site.toml")
            text = text.replace("@CONFD@", str(where / "conf.d"))
    if extra == "20-cri":
        (where / "conf.d" / "20-cri.toml").write_text(CRI_OVERRIDE)
    (where / "config.toml").write_text(text)
    return where / "config.toml"


# ---------------------------------------------------------------------------------------------- containerd

# (config, containerd that loads it, --cdi.enabled / enable_cdi)
CONTAINERD_CASES = {
    "v2-debian-package-1.6": ("v2-debian-package.toml", "containerd16", False),
    "v2-mirrors-comments-1.6": ("v2-mirrors-comments.toml", "containerd16", False),
    "v2-mirrors-comments-1.7-cdi": ("v2-mirrors-comments.toml", "containerd17", True),
    "v3-node-2.1-cdi": ("v3-node.toml", "containerd2", True),
    "v2-imports-1.6": ("v2-imports.toml", "containerd16", False),
    "v2-imports-cri-override-1.6": ("v2-imports.toml+20-cri", "containerd16", False),
    "v2-existing-nvidia-1.6": ("v2-existing-nvidia.toml", "containerd16", False),
    "default-v4-2.4": ("default", "containerd24", False),
}

RUNC_LISTED = f"{CRI2}.containerd.runtimes.runc"
CRI_SYSTEMD = f"{CRI2}.containerd.runtimes.runc.options.SystemdCgroup"
CRI_LOG_LINE = f"{CRI2}.max_container_log_line_size"
VALUES = {CRI_SYSTEMD: (True, UNSET), CRI_LOG_LINE: (16384, 32768)}
# NVIDIA's 1.18 writes a drop-in by default; the module's auto mode writes the main file unless it already imports
# a drop-in directory (v2-imports). Compared with the module in drop_in mode (same drop-in path) and in its default.
EXPECTED = {
    # Debian's config lists no runtime. containerd 1.x takes a listed runtimes table as the whole list, so the
    # runtime NVIDIA's adds alone replaces the built-in runc; the module lists runc beside it.
    ("v2-debian-package-1.6", "drop_in"): {RUNC_LISTED},
    ("v2-debian-package-1.6", "auto"): {RUNC_LISTED, "imports"},
    ("v2-mirrors-comments-1.6", "drop_in"): set(),
    ("v2-mirrors-comments-1.6", "auto"): {"imports"},
    ("v2-mirrors-comments-1.7-cdi", "drop_in"): set(),
    ("v2-mirrors-comments-1.7-cdi", "auto"): {"imports"},
    ("v3-node-2.1-cdi", "drop_in"): set(),
    ("v3-node-2.1-cdi", "auto"): {"imports"},
    ("v2-imports-1.6", "drop_in"): set(),
    ("v2-imports-1.6", "auto"): set(),  # auto is a drop-in here
    # containerd 1.x lets a later import replace the whole CRI section. NVIDIA's drop-in (read last) carries the main
    # file's CRI section, so it undoes what 20-cri.toml set and brings back what it had dropped; the module's
    # carries the section containerd runs with. Values below (NVIDIA's, ours = the effective value before the edit;
    # an option left out is false to the runc shim).
    ("v2-imports-cri-override-1.6", "drop_in"): {CRI_SYSTEMD, CRI_LOG_LINE},
    ("v2-imports-cri-override-1.6", "auto"): {CRI_SYSTEMD, CRI_LOG_LINE},
    ("v2-existing-nvidia-1.6", "drop_in"): set(),
    ("v2-existing-nvidia-1.6", "auto"): {"imports"},
    ("default-v4-2.4", "drop_in"): set(),
    ("default-v4-2.4", "auto"): set(),  # containerd 2.4's default imports /etc/containerd/conf.d/*.toml: a drop-in
}
DEFAULT_NAME = f"{CRI2}.containerd.default_runtime_name"
# Without --set-as-default NVIDIA's removes a default_runtime_name that names its runtime (containerd falls back to
# runc); the module with set_as_default false leaves the default as it found it.
EXPECTED_NOT_DEFAULT = {"v2-existing-nvidia-1.6": {DEFAULT_NAME: ("runc", "nvidia")}}

# Comments in the main file, as (lines with a comment in the original, of those kept by NVIDIA's, kept by the
# module in drop_in mode, kept by the module in auto mode, and the comments the module added in auto mode with and
# without set_as_default: its record of the previous default, and its mark on the runc it lists).
COMMENTS = {
    "v2-debian-package-1.6": (0, 0, 0, 0, (2, 1)),
    "v2-mirrors-comments-1.6": (6, 0, 6, 6, (1, 0)),
    "v2-mirrors-comments-1.7-cdi": (6, 0, 6, 6, (1, 0)),
    "v3-node-2.1-cdi": (3, 0, 3, 3, (1, 0)),
    "v2-imports-1.6": (1, 0, 1, 1, (0, 0)),
    "default-v4-2.4": (0, 0, 0, 0, (0, 0)),
    "v2-existing-nvidia-1.6": (1, 0, 1, 1, (0, 0)),
    "v2-imports-cri-override-1.6": (1, 0, 1, 1, (0, 0)),
}


def runtimes_section(dump):
    cri = dump["plugins"].get("io.containerd.cri.v1.runtime") or dump["plugins"]["io.containerd.grpc.v1.cri"]
    return cri, cri["containerd"]


@pytest.mark.parametrize("set_as_default", [True, False], ids=["default", "not-default"])
@pytest.mark.parametrize("case", sorted(CONTAINERD_CASES))
def test_containerd_effective_configs(case, set_as_default, tmp_path, nvidia_ctk, run_module, request):
    name, peer, cdi = CONTAINERD_CASES[case]
    binary = request.getfixturevalue(peer)
    theirs = stage(name, tmp_path / "nvidia", binary)
    original, original_dump = theirs.read_text(), config_dump(binary, theirs)
    drop_in = theirs.parent / "conf.d" / "99-nvidia.toml"
    ctk_configure(nvidia_ctk, "containerd", theirs, set_as_default, cdi, drop_in=drop_in)
    first = theirs.read_bytes(), drop_in.read_bytes()
    ctk_configure(nvidia_ctk, "containerd", theirs, set_as_default, cdi, drop_in=drop_in)
    assert (theirs.read_bytes(), drop_in.read_bytes()) == first  # a second run writes the same bytes again
    nvidia = relative(config_dump(binary, theirs), theirs.parent)

    comments = [len(comment_lines(original)), kept(original, theirs.read_text())]
    for mode in ("drop_in", "auto"):
        path = stage(name, tmp_path / f"ours-{mode}", binary)
        args = {"runtime": "containerd", "config_path": str(path), "set_as_default": set_as_default}
        args.update(enable_cdi=cdi, config_mode=mode, drop_in_path=str(path.parent / "conf.d" / "99-nvidia.toml"))
        assert run_module(**args)["changed"] is True
        assert run_module(**args)["changed"] is False
        ours = relative(config_dump(binary, path), path.parent)
        comments.append(kept(original.replace(str(theirs.parent), str(path.parent)), path.read_text()))
        if mode == "auto":
            comments.append(len(comment_lines(path.read_text())) - comments[-1])

        found = differences(nvidia, ours)
        unset_default = {} if set_as_default else EXPECTED_NOT_DEFAULT.get(case, {})
        assert set(found) == EXPECTED[(case, mode)] | set(unset_default), found
        assert {key: found[key] for key in unset_default} == unset_default
        for key in set(found) & set(VALUES):
            assert found[key] == VALUES[key]
            before = flatten(original_dump).get(key, UNSET)
            assert before in (found[key][1], False if found[key][1] == UNSET else before), "ours changed containerd's"
        if RUNC_LISTED in found:
            assert found[RUNC_LISTED][0] == UNSET and found[RUNC_LISTED][1]["runtime_type"] == "io.containerd.runc.v2"
        if "imports" in found:  # where the runtime lives: NVIDIA's drop-in, or the main file itself
            assert any("conf.d/99-nvidia.toml" in entry or "conf.d/*.toml" in entry for entry in found["imports"][0])
            assert not any("99-nvidia.toml" in entry for entry in found["imports"][1])

        # What both leave, in the terms of the comparison's table.
        for dump, side in ((nvidia, "nvidia"), (ours, "ours")):
            cri, section = runtimes_section(dump)
            entry = section["runtimes"]["nvidia"]
            assert entry["runtime_type"] == "io.containerd.runc.v2"
            assert entry["options"]["BinaryName"] == RUNTIME
            runc = section["runtimes"].get("runc", {}).get("options", {})
            systemd = entry["options"].get("SystemdCgroup", False), runc.get("SystemdCgroup", False)
            if case == "v2-imports-cri-override-1.6" and side == "ours":
                # The module's nvidia follows runc as the files state it (merged key by key, as containerd 2.x reads
                # them); containerd 1.6 runs runc without it here, as it did before the edit.
                assert systemd == (True, False)
            else:
                assert systemd[0] == systemd[1]
            default = "nvidia" if set_as_default else runtimes_section(original_dump)[1]["default_runtime_name"]
            if side == "nvidia" and not set_as_default and default == "nvidia":
                default = "runc"
            assert section["default_runtime_name"] == default
            if cdi:
                assert cri["enable_cdi"] is True
    *counts, added = COMMENTS[case]
    assert tuple(comments) == (*counts, added[0] if set_as_default else added[1])


def test_debian_package_config_loses_runc_with_nvidia_ctk(tmp_path, nvidia_ctk, run_module, containerd16):
    """What the runc difference means to a running containerd 1.6: its CRI plugin loads, or not."""
    seen = {}
    for set_as_default in (False, True):
        theirs = stage("v2-debian-package.toml", tmp_path / f"nvidia-{set_as_default}")
        ctk_configure(
            nvidia_ctk, "containerd", theirs, set_as_default, drop_in=theirs.parent / "conf.d" / "99-nvidia.toml"
        )
        ours = stage("v2-debian-package.toml", tmp_path / f"ours-{set_as_default}")
        run_module(runtime="containerd", config_path=str(ours), set_as_default=set_as_default)
        for side, path in (("nvidia", theirs), ("ours", ours)):
            section = runtimes_section(config_dump(containerd16, path))[1]
            seen[(side, set_as_default)] = (sorted(section["runtimes"]), cri_plugin(containerd16, path))
    # Read from containerd's own dump instead (--config-source=command), NVIDIA's keeps runc: the dump lists it, and
    # the drop-in then carries the dump's whole CRI section, every default spelled out.
    dumped = stage("v2-debian-package.toml", tmp_path / "nvidia-command")
    ctk_configure(
        nvidia_ctk,
        "containerd",
        dumped,
        False,
        drop_in=dumped.parent / "conf.d" / "99-nvidia.toml",
        extra=("--config-source=command", f"--executable-path={containerd16}"),
    )
    section = runtimes_section(config_dump(containerd16, dumped))[1]
    assert sorted(section["runtimes"]) == ["nvidia", "runc"]
    assert len((dumped.parent / "conf.d" / "99-nvidia.toml").read_text().splitlines()) > 100
    assert cri_plugin(containerd16, dumped) == ("ok", None)
    no_runc = (
        'no corresponding runtime configured in `containerd.runtimes` for `containerd` `default_runtime_name = "runc"'
    )
    assert seen == {
        ("nvidia", False): (["nvidia"], ("error", no_runc)),
        ("ours", False): (["nvidia", "runc"], ("ok", None)),
        ("nvidia", True): (["nvidia"], ("ok", None)),  # but a pod asking for runc by RuntimeClass finds none
        ("ours", True): (["nvidia", "runc"], ("ok", None)),
    }


def cri_plugin(binary, config):
    """(status, why) of the CRI plugin when containerd starts on ``config`` (its own root, state and socket)."""
    run = config.parent / "run"
    run.mkdir()
    # A socket path must fit in 108 bytes with containerd's ".ttrpc" beside it, which a test's own directory under
    # pytest-xdist's worker directories may not.
    short = Path(tempfile.mkdtemp(prefix="ctrd-"))
    socket = short / "containerd.sock"
    log = (run / "log").open("w")
    args = [binary, "--config", str(config), "--root", str(run / "root"), "--state", str(run / "state")]
    daemon = subprocess.Popen([*args, "--address", str(socket)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            assert daemon.poll() is None and time.monotonic() < deadline, (run / "log").read_text()
            time.sleep(0.05)
        ctr = shutil.which("ctr") or os.path.join(os.path.dirname(binary), "ctr")
        listing = subprocess.run(
            [ctr, "--address", str(socket), "plugins", "ls"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()
        shutil.rmtree(short, ignore_errors=True)
    status = next(
        line.split()[-1] for line in listing.splitlines() if line.split()[:2] == ["io.containerd.grpc.v1", "cri"]
    )
    why = re.search(
        r'failed to load plugin io\.containerd\.grpc\.v1\.cri" error="invalid plugin config: (.*)"$',
        (run / "log").read_text(),
        re.M,
    )
    return status, why.group(1).replace('\\"', '"') if why else None


def test_nvidia_ctk_writes_the_main_file_in_drop_in_mode(tmp_path, nvidia_ctk, run_module):
    """NVIDIA's rewrites the main file through its TOML library even when the import is there already."""
    theirs = stage("v2-imports.toml", tmp_path / "nvidia")
    original = theirs.read_text()
    dry = ctk(
        nvidia_ctk,
        "--runtime=containerd",
        f"--config={theirs}",
        "--drop-in-config",
        str(theirs.parent / "conf.d" / "99-nvidia.toml"),
        "--dry-run",
    )
    assert dry.returncode == 0 and theirs.read_text() == original
    assert not (theirs.parent / "conf.d" / "99-nvidia.toml").exists()
    ctk_configure(nvidia_ctk, "containerd", theirs, True, drop_in=theirs.parent / "conf.d" / "99-nvidia.toml")
    after = theirs.read_text()
    assert tomllib.loads(after) == tomllib.loads(original)  # the same settings: the import was there already
    assert after != original and len(comment_lines(original)) == 1 and comment_lines(after) == []
    ours = stage("v2-imports.toml", tmp_path / "ours")
    original = ours.read_text()
    result = run_module(runtime="containerd", config_path=str(ours))
    assert result["config_mode"] == "drop_in" and result["changed_files"] == [
        str(ours.parent / "conf.d" / "99-nvidia.toml")
    ]
    assert ours.read_text() == original


def test_nvidia_ctk_without_a_drop_in_keeps_no_runtime(tmp_path, nvidia_ctk, containerd16):
    """--drop-in-config "" (the way back to editing the main file) in 1.18.1: the runtime is written, then overwritten.

    containerd's engine always pairs the main file with a drop-in; asked for no drop-in, it saves the drop-in to
    the main file's path and then saves the main file over it, with an import of the main file's own directory.
    """
    theirs = stage("v2-mirrors-comments.toml", tmp_path / "nvidia")
    before = config_dump(containerd16, theirs)
    proc = ctk(
        nvidia_ctk,
        "--runtime=containerd",
        f"--config={theirs}",
        "--drop-in-config",
        "",
        f"--nvidia-runtime-path={RUNTIME}",
        "--set-as-default",
    )
    assert proc.returncode == 0 and f"Wrote updated config to {theirs}" in proc.stderr
    assert tomllib.loads(theirs.read_text())["imports"] == [f"{theirs.parent}/*.toml"]
    after = config_dump(containerd16, theirs)
    assert after == before  # containerd loads the file once, whatever imports it; nothing NVIDIA's added stayed


# ---------------------------------------------------------------------------------------------- Docker

FEATURES = dict(json.loads((CONFIGS / "daemon-kubeadm.json").read_text()), features={"buildkit": True})


@pytest.mark.parametrize("cdi", [False, True], ids=["no-cdi", "cdi"])
@pytest.mark.parametrize("set_as_default", [True, False], ids=["default", "not-default"])
@pytest.mark.parametrize("name", ["daemon-kubeadm.json", "daemon-tabs.json", "daemon-features.json"])
def test_docker_daemon_json(name, set_as_default, cdi, tmp_path, nvidia_ctk, run_module):
    # daemon-features.json: daemon-kubeadm.json with a feature of its own
    text = json.dumps(FEATURES, indent=2) + "\n" if name == "daemon-features.json" else (CONFIGS / name).read_text()
    theirs, ours = tmp_path / "nvidia.json", tmp_path / "ours.json"
    theirs.write_text(text)
    ours.write_text(text)
    ctk_configure(nvidia_ctk, "docker", theirs, set_as_default, cdi)
    args = {"runtime": "docker", "config_path": str(ours), "set_as_default": set_as_default, "enable_cdi": cdi}
    assert run_module(**args)["changed"] is True
    assert run_module(**args)["changed"] is False
    nvidia, mine = json.loads(theirs.read_text()), json.loads(ours.read_text())

    found = differences(nvidia, mine)
    if name == "daemon-features.json" and cdi:
        # NVIDIA's replaces the features object unless it parsed as map[string]bool, which JSON never gives it.
        assert found == {"features.buildkit": (UNSET, True)}
    else:
        assert found == {}
    for data in (nvidia, mine):
        assert data["runtimes"]["nvidia"] == {"path": RUNTIME, "args": []}
        assert data.get("default-runtime") == ("nvidia" if set_as_default else json.loads(text).get("default-runtime"))
        assert data.get("features", {}).get("cdi") == (True if cdi else None)

    # The file itself: NVIDIA's re-marshals (keys sorted, four spaces, no final newline); ours keeps order and indent.
    original = json.loads(text)
    indent = "\t" if "\t" in text else "  "
    assert list(nvidia) == sorted(nvidia)
    assert theirs.read_text().startswith('{\n    "') and not theirs.read_text().endswith("\n")
    assert list(mine)[: len(original)] == list(original)
    assert ours.read_text().startswith("{\n" + indent + '"') and ours.read_text().endswith("}\n")


# ---------------------------------------------------------------------------------------------- CRI-O


@pytest.mark.parametrize("cdi", [False, True], ids=["no-cdi", "cdi"])
@pytest.mark.parametrize("set_as_default", [True, False], ids=["default", "not-default"])
def test_crio_merged_view(set_as_default, cdi, tmp_path, nvidia_ctk, run_module, crio_merge):
    merged = {}
    for side in ("nvidia", "ours"):
        etc = tmp_path / side
        (etc / "crio.conf.d").mkdir(parents=True)
        shutil.copy(CONFIGS / "crio-site.toml", etc / "crio.conf")
        drop_in = etc / "crio.conf.d" / "99-nvidia.toml"
        if side == "nvidia":
            proc = ctk_configure(nvidia_ctk, "crio", etc / "crio.conf", set_as_default, cdi, drop_in=drop_in)
            assert ("Ignoring cdi.enabled flag for crio" in proc.stderr) is cdi
        else:
            args = {"runtime": "crio", "config_path": str(drop_in), "set_as_default": set_as_default, "enable_cdi": cdi}
            assert run_module(**args)["changed"] is True
            assert run_module(**args)["changed"] is False
        assert (etc / "crio.conf").read_bytes() == (CONFIGS / "crio-site.toml").read_bytes()
        proc = subprocess.run(
            [crio_merge, str(etc / "crio.conf"), str(etc / "crio.conf.d")], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stderr
        merged[side] = json.loads(proc.stdout)["runtime"]

    expected = {"runtimes.nvidia.runtime_root": ("/run/crun", UNSET)}  # NVIDIA's copies the default runtime's entry
    if cdi:  # CRI-O reads CDI always; NVIDIA's ignores the flag, ours names the directories
        expected["cdi_spec_dirs"] = (UNSET, ["/etc/cdi", "/var/run/cdi"])
    assert differences(merged["nvidia"], merged["ours"]) == expected
    for view in merged.values():
        assert view["default_runtime"] == ("nvidia" if set_as_default else "crun")
        assert view["runtimes"]["nvidia"]["runtime_path"] == RUNTIME
        assert view["runtimes"]["nvidia"]["runtime_type"] == "oci"


# ---------------------------------------------------------------------------------------------- bad input

CONTAINERD_V1_PACKAGED = (
    '#   Copyright 2018-2022 Docker Inc.\ndisabled_plugins = ["cri"]\n#root = "/var/lib/containerd"\n'
)

# name: (runtime, file name, content, NVIDIA's exit code, what NVIDIA's says or does, (the file NVIDIA's leaves as it
# was, NVIDIA's drop-in written), the start of the module's message)
BAD = {
    "toml-syntax": (
        "containerd",
        "config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"\n',
        1,
        "unable to load config for runtime containerd: failed to load config: (2, 2): unexpected token unclosed table",
        (True, False),
        "{path} could not be parsed as TOML: line 2, column 37",
    ),
    "version-string": (
        "containerd",
        "config.toml",
        'version = "2"\n',
        1,
        "unable to load config for runtime containerd: failed to parse config version: unsupported type for version",
        (True, False),
        '{path} declares containerd config version "2"',
    ),
    "runtimes-not-a-table": (
        "containerd",
        "config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\nruntimes = "x"\n',
        0,
        "Wrote updated config to {dir}/conf.d/99-nvidia.toml",
        (False, True),
        '{path}: plugins."io.containerd.grpc.v1.cri".containerd.runtimes is a str, but a table was expected there.',
    ),
    "version-1-packaged": (
        "containerd",
        "config.toml",
        CONTAINERD_V1_PACKAGED,
        0,
        "Wrote updated config to {dir}/conf.d/99-nvidia.toml",
        (True, True),
        "{path} has no top-level version key, which containerd reads as config version 1",
    ),
    "json-syntax": (
        "docker",
        "daemon.json",
        '{"log-driver": "json-file",,}',
        1,
        "unable to load config for runtime docker: invalid character ','",
        (True, False),
        "{path} is not valid JSON: line 1, column 28",
    ),
    "runtimes-not-an-object": (
        "docker",
        "daemon.json",
        '{"runtimes": []}',
        2,
        "panic: interface conversion: interface {} is []interface {}, not map[string]interface {}",
        (True, False),
        "{path}: the runtimes key must be a JSON object, not [].",
    ),
    "crio-toml-syntax": (
        "crio",
        "crio.conf",
        "[crio.runtime\n",
        1,
        "unable to load config for runtime crio: (1, 2): unexpected token unclosed table key",
        (True, False),
        "{path} could not be parsed as TOML: line 1, column 14",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input(case, tmp_path, nvidia_ctk, run_module, containerd16):
    runtime, file_name, content, rc, theirs_says, nvidia_leaves, ours_says = BAD[case]
    results = {}
    for side in ("nvidia", "ours"):
        where = tmp_path / side
        where.mkdir()
        path = where / file_name
        path.write_text(content)
        drop_in = where / ("crio.conf.d" if runtime == "crio" else "conf.d") / "99-nvidia.toml"
        if side == "nvidia":
            args = [f"--runtime={runtime}", f"--config={path}", f"--nvidia-runtime-path={RUNTIME}", "--set-as-default"]
            if runtime != "docker":
                args += ["--drop-in-config", str(drop_in)]
            proc = ctk(nvidia_ctk, *args)
            assert proc.returncode == rc, proc.stderr
            assert theirs_says.replace("{dir}", str(where)) in proc.stderr, proc.stderr
            assert ("goroutine 1 [running]" in proc.stderr) is (rc == 2)  # a Go panic, with its stack trace
        else:
            if runtime == "crio":  # the module writes the drop-in, after reading crio.conf beside its directory
                (where / "crio.conf.d").mkdir()
            result = run_module(
                expect_failure=True, runtime=runtime, config_path=str(drop_in if runtime == "crio" else path)
            )
            message = result["msg"]
            assert message.startswith(ours_says.replace("{path}", str(path))), message
            assert "Traceback" not in message and "\n" not in message
            assert not drop_in.exists()
        results[side] = (path.read_text() == content, drop_in.exists())
    assert results == {"nvidia": nvidia_leaves, "ours": (True, False)}
    if case == "version-1-packaged":
        # Valid for containerd 1.6, and loaded: the drop-in NVIDIA's wrote is imported by nothing.
        dump = config_dump(containerd16, tmp_path / "nvidia" / file_name)
        assert dump["imports"] == [str(tmp_path / "nvidia" / file_name)] and dump["disabled_plugins"] == ["cri"]
        assert "nvidia" not in json.dumps(dump).replace(str(tmp_path / "nvidia"), "<dir>")
    if case == "runtimes-not-a-table":
        # containerd refuses the original already; NVIDIA's drop-in puts the runtime at containerd.nvidia, beside the
        # string, where containerd would not look for a runtime.
        drop_in = tomllib.loads((tmp_path / "nvidia" / "conf.d" / "99-nvidia.toml").read_text())
        assert (
            drop_in["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["nvidia"]["options"]["BinaryName"] == RUNTIME
        )
