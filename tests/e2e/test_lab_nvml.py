"""A lab node given a simulated-GPU spec looks like a node with NVIDIA's driver installed (docs/lab.md): the
mock libnvidia-ml.so.1 (a TEST DOUBLE, tests/mock_nvml) where the driver installs its library, the device
nodes the driver makes, and NVML answering from the spec through the real bindings (Debian's
python3-pynvml), following every edit of the spec on this machine.

The collection's discovery module reads the node through NVML and must report what its simulated source
reports from the same spec.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab, run_lab, write_in_place
from gpuops_lab.config import NODE_SPEC_PATH, LabConfig
from gpuops_lab.inventory import inventory_text
from playbook_run import COLLECTIONS, REPO, mirror_collection

SPECS = REPO / "tests" / "fixtures" / "simulated"
LIB = "/usr/lib/x86_64-linux-gnu"
STATE_LINK = f"{LIB}/gpuops-mock-nvml.state"
STATE_TARGET = "../../../etc/gpuops-lab/simulated/mock-nvml.state"
# How long an edit of the spec on this machine may take to show in the node's NVML.
PROPAGATION_SECONDS = 2.0

# Run in the node: of the node's /, the library's directory and the state's (the role's
# device_plugin_driver_extra_dirs in the lab) mounted at their paths under DIR in a mount namespace of its own, as a
# DaemonSet pod sees them under /driver-root; where the library found there takes its state from, and the GPU count
# NVML answers when loaded from there.
FROM_DRIVER_ROOT = f"""set -eu
root=$(mktemp -d)
mkdir -p "$root{LIB}" "$root/etc/gpuops-lab/simulated"
unshare -m sh -euc '
mount --rbind {LIB} "$1{LIB}"
mount --rbind /etc/gpuops-lab/simulated "$1/etc/gpuops-lab/simulated"
readlink -f "$1{STATE_LINK}"
python3 -c "
import ctypes, sys
nvml = ctypes.CDLL(sys.argv[1])
count = ctypes.c_uint()
assert nvml.nvmlInit_v2() == 0 and nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
print(count.value)
" "$1{LIB}/libnvidia-ml.so.1"
' sh "$root"
find "$root" -depth -type d -exec rmdir {{}} +
"""

# Run in the node: NVML's name of GPU 0 (old bindings return bytes).
GPU0_NAME = """
import pynvml
pynvml.nvmlInit()
name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
print(name.decode() if isinstance(name, bytes) else name)
pynvml.nvmlShutdown()
"""

# Run in the node: one NVML session, kept open as a daemon keeps it, polling GPU 0's name until it is
# argv[1]; prints "ready" once initialised, then "seen <time>" (the node shares this machine's clock).
WATCH_GPU0_NAME = """
import sys, time, pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
print("ready", flush=True)
deadline = time.time() + 60
while time.time() < deadline:
    name = pynvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    if name == sys.argv[1]:
        print("seen", repr(time.time()), flush=True)
        break
    time.sleep(0.01)
else:
    print("still", name, flush=True)
pynvml.nvmlShutdown()
"""


def spec_data(name: str) -> dict[str, Any]:
    return yaml.safe_load((SPECS / f"{name}.yaml").read_text(encoding="utf-8"))


def minors(spec: dict[str, Any]) -> list[int]:
    return [gpu.get("minor_number", index) for index, gpu in enumerate(spec["gpus"])]


def expected_devices(spec: dict[str, Any]) -> dict[str, str]:
    """/dev path -> 'TYPE MODE MAJOR:MINOR' (hex numbers, as stat's %t:%T prints them)."""
    devices = {
        "/dev/nvidiactl": "c3:ff",
        "/dev/nvidia-uvm": "1ff:0",  # 511:0, the lab's choice for the dynamic major
        "/dev/nvidia-uvm-tools": "1ff:1",
    }
    devices.update({f"/dev/nvidia{minor}": f"c3:{minor:x}" for minor in minors(spec)})
    return {path: f"character special file 666 {numbers}" for path, numbers in devices.items()}


def node_devices(lab: Lab, node: str) -> dict[str, str]:
    """The node's NVIDIA device nodes, as stat sees them."""
    script = (
        "for f in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia[0-9]*;"
        ' do [ -e "$f" ] && stat -c \'%n|%F %a %t:%T\' "$f"; done; true'
    )
    lines = lab.node_exec(node, "sh", "-c", script).stdout.splitlines()
    return dict(line.split("|", 1) for line in lines)


def gpu0_name(lab: Lab, node: str) -> str:
    return lab.node_exec(node, "python3", "-c", GPU0_NAME).stdout.strip()


@pytest.fixture(scope="module")
def node(lab: Lab) -> Iterator[str]:
    """The first lab node, given the h100x8 spec (and every other node too) with its mock driver."""
    run_lab("simulate", "h100x8")
    yield lab.nodes[0]


def test_driver_library_state_link_and_device_nodes(lab: Lab, node: str) -> None:
    spec = spec_data("h100x8")
    version = spec["driver_version"]
    library = f"{LIB}/libnvidia-ml.so.{version}"
    built = subprocess.run(
        [str(REPO / "scripts" / "build-mock-nvml.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()

    listing = lab.node_exec(
        node,
        "sh",
        "-c",
        f"stat -c '%F %a %U:%G' {library}; readlink {LIB}/libnvidia-ml.so.1; readlink {STATE_LINK};"
        f" realpath {STATE_LINK}; ls {LIB} | grep '^libnvidia-ml'; sha256sum < {library}",
    ).stdout.splitlines()
    assert listing[:4] == [
        "regular file 644 root:root",
        f"libnvidia-ml.so.{version}",
        STATE_TARGET,
        "/etc/gpuops-lab/simulated/mock-nvml.state",
    ]
    assert listing[4:-1] == ["libnvidia-ml.so.1", f"libnvidia-ml.so.{version}"]
    mock_sha = hashlib.sha256((Path(built) / "libnvidia-ml.so.1").read_bytes()).hexdigest()
    assert listing[-1].split()[0] == mock_sha, "the node's libnvidia-ml is not the mock library built here"

    # The dynamic loader finds it by its soname, as NVML's clients load it.
    found = re.search(r"libnvidia-ml\.so\.1 \(libc6,x86-64\) => (\S+)", lab.node_exec(node, "ldconfig", "-p").stdout)
    assert found, f"ldconfig's cache in {node} has no libnvidia-ml.so.1"
    assert lab.node_exec(node, "realpath", found.group(1)).stdout.strip() == library

    assert node_devices(lab, node) == expected_devices(spec)

    # The state link is relative, so the library loaded from a driver root finds the state inside that root.
    root_state, count = lab.node_exec(node, "sh", "-c", FROM_DRIVER_ROOT).stdout.split()
    assert root_state.startswith("/tmp/") and root_state.endswith("/etc/gpuops-lab/simulated/mock-nvml.state")
    assert int(count) == len(spec["gpus"])


def test_a_spec_with_fewer_gpus_leaves_fewer_device_nodes(lab: Lab, node: str) -> None:
    t4 = spec_data("t4x1")
    try:
        run_lab("simulate", "t4x1")
        assert node_devices(lab, node) == expected_devices(t4)
        libraries = lab.node_exec(node, "sh", "-c", f"ls {LIB} | grep '^libnvidia-ml'").stdout.split()
        assert libraries == ["libnvidia-ml.so.1", f"libnvidia-ml.so.{t4['driver_version']}"]
        assert gpu0_name(lab, node) == t4["gpus"][0]["name"]
    finally:
        run_lab("simulate", "h100x8")
    assert node_devices(lab, node) == expected_devices(spec_data("h100x8"))


def adhoc_module(inventory: Path, node: str, *module_args: str) -> dict[str, Any]:
    """``ansible NODE -m gpuops.k8s.nvidia_gpu_info [-a ARGS]`` over the lab inventory's SSH login; the result."""
    mirror_collection()
    argv = ["ansible", "-i", str(inventory), node, "-m", "gpuops.k8s.nvidia_gpu_info"]
    if module_args:
        argv += ["-a", " ".join(module_args)]
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    # The ad-hoc output: "NODE | SUCCESS => {...}".
    head, _sep, body = done.stdout.partition(" => ")
    assert done.returncode == 0 and head.endswith("| SUCCESS"), f"{' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
    return json.loads(body)


def test_discovery_through_nvml_matches_the_simulated_source(lab: Lab, node: str, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(inventory_text(LabConfig.from_env(), len(lab.nodes)))
    nvml = adhoc_module(inventory, node)
    simulated = adhoc_module(inventory, node, f"simulate_from={NODE_SPEC_PATH}")

    assert nvml["source"] == "nvml", nvml.get("nvml_unavailable_reason")
    assert nvml["nvml_available"] is True
    assert simulated["source"] == "simulated"
    for key in ("driver_version", "cuda_driver_version", "gpu_count"):
        assert (key, nvml[key]) == (key, simulated[key])
    assert simulated["gpu_count"] == len(spec_data("h100x8")["gpus"])
    # Bindings without nvmlDeviceGetNumaNodeId (Debian 12's python3-pynvml 11.525.112) make the module read
    # the NUMA node from the GPU's PCI device in sysfs, and this machine's sysfs has no such device.
    numa_from_nvml = lab.node_exec(
        node, "python3", "-c", "import pynvml; print(hasattr(pynvml, 'nvmlDeviceGetNumaNodeId'))"
    ).stdout.strip()
    skipped = {"xid"} if numa_from_nvml == "True" else {"xid", "numa_node"}
    if "numa_node" in skipped:
        assert [gpu["numa_node"] for gpu in nvml["gpus"]] == [None] * len(nvml["gpus"])
    differences = []
    for got, want in zip(nvml["gpus"], simulated["gpus"]):
        # XIDs reach NVML's clients as events, never as a fact of the GPU.
        for key in sorted((got.keys() | want.keys()) - skipped):
            if got.get(key, "<missing>") != want.get(key, "<missing>"):
                differences.append(f"GPU {want['index']} {key}: nvml {got.get(key)!r}, simulated {want.get(key)!r}")
    assert differences == []
    assert len(nvml["gpus"]) == len(simulated["gpus"])
    # The PCI scan reads the node's sysfs, which is this machine's: it has no NVIDIA device.
    assert nvml["pci_devices"] == []


def test_an_edit_of_the_spec_shows_in_the_nodes_nvml(lab: Lab, node: str) -> None:
    spec_path = Path(run_lab("spec-path", "1").strip())
    original = spec_path.read_text(encoding="utf-8")
    before = yaml.safe_load(original)["gpus"][0]["name"]
    renamed = f"{before} (renamed)"
    edited = original.replace(f"name: {before}", f"name: {renamed}", 1)
    assert yaml.safe_load(edited)["gpus"][0]["name"] == renamed
    assert gpu0_name(lab, node) == before

    watcher = subprocess.Popen(
        ["podman", "exec", node, "python3", "-c", WATCH_GPU0_NAME, renamed],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        ready = watcher.stdout.readline().strip()
        assert ready == "ready", f"the NVML session in {node} did not start: {ready} {watcher.stderr.read()}"
        written = time.time()
        write_in_place(spec_path, edited)
        out, err = watcher.communicate(timeout=90)
        word, _sep, when = out.strip().partition(" ")
        assert word == "seen", f"{node}'s NVML never reported {renamed!r}: {out} {err}"
        took = float(when) - written
        assert took <= PROPAGATION_SECONDS, f"the edit took {took:.2f}s to reach {node}'s NVML"
        # A process that starts now reads the new state too.
        assert gpu0_name(lab, node) == renamed
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        write_in_place(spec_path, original)
    lab.wait_until(f"{node}'s NVML back at {before!r}", lambda: gpu0_name(lab, node) == before, timeout=30)
