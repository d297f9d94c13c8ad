"""NVIDIA's DRA driver v0.5.0 and ours, side by side: the ResourceSlices each publishes for the same GPUs
(docs/compared-dra.md, "What ran").

For each shape (tests/fixtures/simulated/h100x8.yaml, t4x1.yaml, a100-mig.yaml) both drivers read one NVML state
through one mock libnvidia-ml.so.1 (a TEST DOUBLE of the driver's library, tests/mock_nvml) and publish to one real
kube-apiserver (the `control_plane` fixture's), each for its own Node object (`nvidia-<shape>`, `ours-<shape>`), so
the two pools of the driver gpu.nvidia.com never meet. NVIDIA's side is the real program, `gpu-kubelet-plugin`
built from its Go module (scripts/build-nvidia-dra-driver.sh), one process per shape, all three at once, killed
once their slices are read. Ours is the daemon's own code in this process: the nvml backend
(gpu_device_plugin.discovery.NvmlBackend) on the real pynvml bound to the mock library, the device numbers
(dra.names.DeviceNumbers) and the publisher (dra.slices.ResourceSlices) with the node's credentials, as the
daemon's DRA mode runs them. What stands in for a GPU node, per shape, under one temporary directory:

- the mock library's state, written from the spec (tests/mock_nvml/nvml_state.py), named to both by
  $GPUOPS_MOCK_NVML_STATE;
- a driver root for NVIDIA's `--container-driver-root`: usr/lib64/libnvidia-ml.so.<driver version> (a copy of the
  mock library our side loads), libcuda.so.<driver version> (of the empty one built beside it), their .so.1 links
  (NVIDIA's CDI spec for a claim looks for both by version) and usr/bin/nvidia-smi, a stub that exits 1;
- a sysfs double: devices/pci<domain>:<bus>/<bus id>/numa_node (the spec's NUMA node, -1 where it has none) and
  the link bus/pci/devices/<bus id> to it. NVIDIA's driver reads the NUMA node and the PCIe root from it
  ($NVIDIA_DRA_SYSFS_ROOT); ours reads the PCIe root from it (NvmlBackend's sysfs root) and the NUMA node from
  NVML's nvmlDeviceGetNumaNodeId, which the mock answers from the same spec.

The slices are compared device by device: names, every attribute (name, type, value) and every capacity, and the
slice's own fields but the node and pool names. The differences must be exactly the ones docs/compared-dra.md
names; any other fails the test with its place.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from local_api import ApiServerSettings

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT / "files/device_plugin/src", ROOT / "tests/mock_nvml"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gpu_device_plugin.discovery import NvmlBackend  # noqa: E402
from gpu_device_plugin.dra.devices import dra_devices  # noqa: E402
from gpu_device_plugin.dra.kubeapi import KubeApi  # noqa: E402
from gpu_device_plugin.dra.names import DeviceNumbers  # noqa: E402
from gpu_device_plugin.dra.slices import ResourceSlices  # noqa: E402
from nvml_state import write_state  # noqa: E402

SHAPES = ("h100x8", "t4x1", "a100-mig")
FIXTURES = ROOT / "tests/fixtures/simulated"
# NVIDIA's driver name, which ours takes when a site sets device_plugin_dra_driver_name to it (its default is
# gpu.gpuops.k8s): then a claim written for NVIDIA's driver selects ours the same way.
DRIVER = "gpu.nvidia.com"
GROUP = "resource.k8s.io"
STATE_VARIABLE = "GPUOPS_MOCK_NVML_STATE"
ADMIN_TOKEN = "gpuops-dra-compared-admin"


def node_token(shape: str) -> str:
    return f"gpuops-dra-compared-{shape}"


# The lab's API server (the Node and RBAC authorizers, NodeRestriction), an administrator for NVIDIA's driver (a
# cluster gives it a service account with its chart's RBAC) and one node identity per shape for ours.
API_SERVER = ApiServerSettings(
    tokens=(
        (ADMIN_TOKEN, "gpuops-admin", "system:masters"),
        *((node_token(s), f"system:node:ours-{s}", "system:nodes") for s in SHAPES),
    )
)

NVIDIA_SMI_STUB = '#!/bin/sh\necho "nvidia-smi stub of the test: no driver here" >&2\nexit 1\n'


@cache
def mock_library_dir() -> Path:
    out = subprocess.run([str(ROOT / "scripts/build-mock-nvml.sh")], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip())


@cache
def nvidia_plugin() -> Path:
    out = subprocess.run(
        [str(ROOT / "scripts/build-nvidia-dra-driver.sh")], capture_output=True, text=True, timeout=3600, check=False
    )
    assert out.returncode == 0, f"scripts/build-nvidia-dra-driver.sh failed:\n{out.stderr[-3000:]}"
    return Path(out.stdout.strip().splitlines()[-1]) / "gpu-kubelet-plugin"


def real_pynvml() -> Any:
    """The real pynvml, bound to the mock library: loaded by path first, so that pynvml's own dlopen of
    libnvidia-ml.so.1 finds it by its soname (files/device_plugin/tests/mock_nvml.py does the same)."""
    ctypes.CDLL(str(mock_library_dir() / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
    import pynvml

    return pynvml


def pcie_root(bus_id: str) -> str:
    """The root complex the sysfs double hangs a GPU off: its own domain and bus."""
    return "pci" + bus_id[: bus_id.rindex(":")]


class GpuNode:
    """The stand-in GPU node of one shape (see the module's docstring)."""

    def __init__(self, shape: str, directory: Path) -> None:
        self.shape, self.dir = shape, directory
        self.spec_path = FIXTURES / f"{shape}.yaml"
        self.spec: dict[str, Any] = yaml.safe_load(self.spec_path.read_text())
        self.state = directory / "nvml.state"
        write_state(self.spec_path, self.state)
        self.driver_root = directory / "driver-root"
        lib = self.driver_root / "usr/lib64"
        lib.mkdir(parents=True)
        version = self.spec["driver_version"]
        for name in ("libnvidia-ml.so", "libcuda.so"):
            # Copies: NVIDIA's library locator follows links and reads the version from the file's own name.
            shutil.copyfile(mock_library_dir() / f"{name}.1", lib / f"{name}.{version}")
            (lib / f"{name}.1").symlink_to(f"{name}.{version}")
        smi = self.driver_root / "usr/bin/nvidia-smi"
        smi.parent.mkdir(parents=True)
        smi.write_text(NVIDIA_SMI_STUB)
        smi.chmod(0o755)
        self.sysfs = directory / "sysfs"
        (self.sysfs / "bus/pci/devices").mkdir(parents=True)
        for gpu in self.spec["gpus"]:
            bus_id = gpu["pci_bus_id"].lower()
            device = self.sysfs / "devices" / pcie_root(bus_id) / bus_id
            device.mkdir(parents=True)
            numa = gpu.get("numa_node")
            (device / "numa_node").write_text(f"{-1 if numa is None else numa}\n")
            (self.sysfs / "bus/pci/devices" / bus_id).symlink_to(f"../../../devices/{pcie_root(bus_id)}/{bus_id}")


class NvidiaPlugin:
    """NVIDIA's gpu-kubelet-plugin for one node, in its own process group."""

    def __init__(self, node: GpuNode, kubeconfig: str, flags: tuple[str, ...] = ()) -> None:
        self.node_name = f"nvidia-{node.shape}"
        run = node.dir / "nvidia"
        for sub in ("plugins", "registry", "cdi", "host-root"):
            (run / sub).mkdir(parents=True)
        self.log = run / "log"
        env = dict(os.environ, NVIDIA_DRA_SYSFS_ROOT=str(node.sysfs), **{STATE_VARIABLE: str(node.state)})
        command = [
            str(nvidia_plugin()),
            f"--node-name={self.node_name}",
            f"--kubeconfig={kubeconfig}",
            f"--container-driver-root={node.driver_root}",
            f"--host-root={run / 'host-root'}",
            f"--cdi-root={run / 'cdi'}",
            "--nvidia-cdi-hook-path=/bin/true",
            f"--kubelet-plugins-directory-path={run / 'plugins'}",
            f"--kubelet-registrar-directory-path={run / 'registry'}",
            "--image-name=dra-compared.invalid/none:v0",  # required; used only for MPS daemons' pods
            *flags,
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """Killed outright: the slices are read already, and its SIGTERM shutdown takes seconds."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def publish_ours(node: GpuNode, kubeconfig: str) -> None:
    """The daemon's DRA publishing for `ours-<shape>`: NVML through the mock, numbers, slices."""
    previous = os.environ.get(STATE_VARIABLE)
    os.environ[STATE_VARIABLE] = str(node.state)
    try:
        backend = NvmlBackend(real_pynvml(), sysfs=str(node.sysfs))
        backend.init()
        inventory = backend.snapshot()
        backend.stop()
    finally:
        if previous is None:
            os.environ.pop(STATE_VARIABLE, None)
        else:
            os.environ[STATE_VARIABLE] = previous
    numbers = DeviceNumbers(str(node.dir / "ours"))
    numbers.load({})
    api = KubeApi(kubeconfig)
    try:
        ResourceSlices(api, f"ours-{node.shape}", DRIVER).publish(
            dra_devices(inventory, numbers.numbers(inventory)), frozenset(), inventory
        )
    finally:
        api.close()


def pool(custom: client.CustomObjectsApi, node_name: str) -> list[dict[str, Any]]:
    """The node's slices of the driver once the pool is complete (every slice of its generation), else []."""
    items = custom.list_cluster_custom_object(
        GROUP, "v1", "resourceslices", field_selector=f"spec.nodeName={node_name}"
    )["items"]
    items = [i for i in items if i["spec"]["driver"] == DRIVER]
    if not items:
        return []
    generation = max(i["spec"]["pool"]["generation"] for i in items)
    current = [i for i in items if i["spec"]["pool"]["generation"] == generation]
    return current if len(current) == current[0]["spec"]["pool"]["resourceSliceCount"] else []


@pytest.fixture(scope="module")
def published(control_plane, tmp_path_factory):
    """{shape: {"nvidia": [slices], "ours": [slices], "node": GpuNode}}, from one run of each side per shape."""
    admin_kubeconfig = str(control_plane.kubeconfig(control_plane.work / "dra-compared-admin.conf", token=ADMIN_TOKEN))
    admin = config.new_client_from_config(admin_kubeconfig)
    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    nodes = {s: GpuNode(s, tmp_path_factory.mktemp(f"dra-{s}")) for s in SHAPES}
    for shape in SHAPES:
        for name in (f"nvidia-{shape}", f"ours-{shape}"):
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    plugins = {s: NvidiaPlugin(nodes[s], admin_kubeconfig) for s in SHAPES}
    try:
        for shape, node in nodes.items():
            kubeconfig = control_plane.kubeconfig(control_plane.work / f"ours-{shape}.conf", token=node_token(shape))
            publish_ours(node, str(kubeconfig))
        found: dict[str, list[dict[str, Any]]] = {}
        deadline = time.monotonic() + 60
        while len(found) < len(SHAPES):
            for shape, plugin in plugins.items():
                if shape in found:
                    continue
                assert plugin.process.poll() is None, f"NVIDIA's plugin for {shape} exited:\n{plugin.log_tail()}"
                slices = pool(custom, plugin.node_name)
                if slices:
                    found[shape] = slices
            missing = sorted(set(SHAPES) - set(found))
            assert time.monotonic() < deadline, "NVIDIA's plugin published no complete pool for " + ", ".join(
                f"{s}:\n{plugins[s].log_tail()}" for s in missing
            )
            if missing:
                time.sleep(0.2)
    finally:
        for plugin in plugins.values():
            plugin.kill()
    yield {s: {"nvidia": found[s], "ours": pool(custom, f"ours-{s}"), "node": nodes[s]} for s in SHAPES}
    admin.close()


# -- the comparison ----------------------------------------------------------------------------------------------
def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    named = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    assert len(named) == sum(len(s["spec"].get("devices", [])) for s in slices), "a device name twice in one pool"
    return named


def slice_fields(item: dict[str, Any]) -> dict[str, Any]:
    """A slice's spec without its devices and the names that differ by construction (node, pool)."""
    spec = {k: v for k, v in item["spec"].items() if k not in ("devices", "nodeName")}
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "name"}
    return spec


def differences(nvidia: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[str]:
    """Every difference between two pools, one line each, in a fixed order."""
    out: list[str] = []
    if len(nvidia) != len(ours):
        out.append(f"slices: {len(nvidia)} from NVIDIA's, {len(ours)} from ours")
    for theirs, mine in zip(nvidia, ours):
        if slice_fields(theirs) != slice_fields(mine):
            out.append(f"slice fields: NVIDIA's {slice_fields(theirs)}, ours {slice_fields(mine)}")
        labels = (theirs["metadata"].get("labels") or {}, mine["metadata"].get("labels") or {})
        for key in sorted(set(labels[0]) | set(labels[1])):
            if labels[0].get(key) != labels[1].get(key):
                out.append(f"slice label {key}: NVIDIA's {labels[0].get(key)!r}, ours {labels[1].get(key)!r}")
    theirs_by_name, mine_by_name = devices(nvidia), devices(ours)
    for name in sorted(set(theirs_by_name) | set(mine_by_name)):
        if name not in mine_by_name:
            out.append(f"{name}: only NVIDIA's")
            continue
        if name not in theirs_by_name:
            out.append(f"{name}: only ours")
            continue
        theirs, mine = theirs_by_name[name], mine_by_name[name]
        for field in ("attributes", "capacity"):
            a, b = theirs.get(field, {}), mine.get(field, {})
            for key in sorted(set(a) | set(b)):
                if key not in b:
                    out.append(f"{name}: {field} {key} only NVIDIA's")
                elif key not in a:
                    out.append(f"{name}: {field} {key} only ours")
                elif a[key] != b[key]:
                    out.append(f"{name}: {field} {key}: NVIDIA's {a[key]}, ours {b[key]}")
        rest = sorted((set(theirs) | set(mine)) - {"name", "attributes", "capacity"})
        for key in rest:
            if theirs.get(key) != mine.get(key):
                out.append(f"{name}: {key}: NVIDIA's {theirs.get(key)}, ours {mine.get(key)}")
    return out


def expected_names(spec: dict[str, Any]) -> list[str]:
    """The device names both drivers give, from the spec: gpu-<minor> (the minor numbers follow the GPUs' order
    when the spec gives none), a MIG device's from its profile and placement."""
    names = []
    for index, gpu in enumerate(spec["gpus"]):
        minor = gpu.get("minor_number", index)
        if gpu.get("mig_mode") == "enabled" and gpu.get("mig_devices"):
            names += [f"gpu-{minor}-mig-{name}" for name in MIG_NAMES[gpu["uuid"]]]
        else:
            names.append(f"gpu-{minor}")
    return sorted(names)


# The A100 of a100-mig.yaml: its MIG devices' <profile>-<GPU-instance profile ID>-<first memory slice>, as the
# mock places them (the spec gives the profiles, the mock the placements: docs/mock-nvml.md#mig).
MIG_NAMES = {"GPU-0a5e1c00-0000-4000-8000-00000000a100": ["3g20gb-9-0", "1g5gb-19-4", "1g5gb-19-5"]}


@pytest.mark.parametrize("shape", SHAPES)
def test_both_drivers_publish_the_same_devices_and_ours_adds_health_only(published, shape):
    nvidia, ours = published[shape]["nvidia"], published[shape]["ours"]
    names = expected_names(published[shape]["node"].spec)
    assert sorted(devices(nvidia)) == names
    assert sorted(devices(ours)) == names
    # The differences docs/compared-dra.md names, and no other (slice fields included): ours labels its slices (so
    # that the role tells them from NVIDIA's driver's), and adds `health` to every device, a string, Healthy on a
    # healthy GPU.
    assert differences(nvidia, ours) == [
        "slice label app.kubernetes.io/managed-by: NVIDIA's None, ours 'gpuops.k8s'" for _slice in ours
    ] + [f"{name}: attributes health only ours" for name in names]
    assert all(devices(ours)[n]["attributes"]["health"] == {"string": "Healthy"} for n in names)


@pytest.mark.parametrize("shape", SHAPES)
def test_nvidia_read_the_sysfs_double_so_numa_and_pcie_root_are_compared(published, shape):
    # The comparison of these two attributes means something only where NVIDIA's driver found them as ours did:
    # every device (a MIG device as its parent GPU) carries its GPU's PCIe root, and its NUMA node where it has one.
    gpus = {g["pci_bus_id"].lower(): g for g in published[shape]["node"].spec["gpus"]}
    for name, device in devices(published[shape]["nvidia"]).items():
        attributes = device["attributes"]
        gpu = gpus[attributes["resource.kubernetes.io/pciBusID"]["string"]]
        assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": pcie_root(gpu["pci_bus_id"].lower())}, name
        numa = None if gpu.get("numa_node") is None else {"int": gpu["numa_node"]}
        assert attributes.get("resource.kubernetes.io/numaNode") == numa, name
