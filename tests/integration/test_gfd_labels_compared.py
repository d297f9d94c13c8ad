"""NVIDIA's GPU Feature Discovery beside the gpu_node_labels role, on the same simulated GPUs (docs/compared-labels.md).

Real peers: NVIDIA's `gpu-feature-discovery` v0.19.0, built from its Go module by
scripts/build-nvidia-device-plugin.sh (cached); the real pynvml bindings in gpuops.k8s.nvidia_gpu_info; etcd and a
kube-apiserver built by tests/e2e/build-kubernetes.sh (cached), on which the role writes the labels it computes.

Test doubles, named: the mock libnvidia-ml.so.1 (tests/mock_nvml) stands in for the driver's library, serving
each shape's simulated-GPU spec to both sides; a PCI tree in a temporary directory (vendor, device, class,
numa_node, resource and a 256-byte config space per GPU) stands in for /sys/bus/pci/devices; a file stands in
for /sys/class/dmi/id/product_name (GFD's --machine-type-file). GFD reads the PCI tree at the fixed path
/sys/bus/pci/devices (GPU mode, vGPU detection), so it runs in a private mount namespace (`unshare --mount`,
as root) with the temporary tree bind-mounted there; this machine's /sys is never changed. GFD reads nothing
under /proc/driver/nvidia for its labels (MIG devices and profiles come from NVML), so no capabilities tree
is needed.

Our side runs the way playbooks/site.yml runs it: one ansible-playbook run discovers each node's GPUs with
gpuops.k8s.nvidia_gpu_info (on the mock library and the same PCI tree) and registers gpuops_gpu_info, then the
role gpuops.k8s.gpu_node_labels labels the Node objects; the labels compared are read back from the API.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from local_api import token_admin_api_server

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "tests/fixtures/simulated"
TOKEN = "gpuops-gfd-compared-admin-token"
GFD_VERSION = "v0.19.0"

# NVIDIA's config file (version v1) for the time-sliced node: GFD reads it, and the role reads it as the
# host's device_plugin_config.
TIME_SLICING_CONFIG = {
    "version": "v1",
    "flags": {"migStrategy": "none"},
    "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
}


def _mig_strategy(strategy: str) -> dict:
    """NVIDIA's config file (version v1) with a MIG strategy: GFD reads it, and the role reads it as the host's
    device_plugin_config (flags.migStrategy)."""
    return {"version": "v1", "flags": {"migStrategy": strategy}}


@dataclass
class Shape:
    spec: str
    machine: str  # stand-in for /sys/class/dmi/id/product_name
    gfd_flags: list[str] = field(default_factory=list)
    device_plugin_config: dict | None = None
    gpu_changes: dict = field(default_factory=dict)  # set on every GPU of a copy of the spec
    # Every GPU of a copy of the spec in MIG mode with these MIG devices: (profile, MiB) each.
    mig_layout: list[tuple[str, int]] = field(default_factory=list)


SHAPES = {
    "h100x8": Shape("h100x8.yaml", "PowerEdge XE9680"),
    "t4x1": Shape("t4x1.yaml", "Google Compute Engine"),
    # a100-mig.yaml is mixed: GPU 0 in MIG mode (3g.20gb + 2 x 1g.5gb), GPU 1 whole.
    "a100-mig-mixed": Shape("a100-mig.yaml", "DGX A100", device_plugin_config=_mig_strategy("mixed")),
    # The same node under the single strategy, which it does not fit (a whole GPU, two profiles): GFD's INVALID.
    "a100-mig-single-invalid": Shape("a100-mig.yaml", "DGX A100", device_plugin_config=_mig_strategy("single")),
    # Every GPU of the H100 node in mig-parted's all-1g.10gb (seven 1g.10gb, 9984 MiB each on an H100 80GB):
    # under the single strategy the 56 MIG devices are the node's nvidia.com/gpu.
    "h100-mig-single": Shape(
        "h100x8.yaml",
        "PowerEdge XE9680",
        device_plugin_config=_mig_strategy("single"),
        mig_layout=[("1g.10gb", 9984)] * 7,
    ),
    # The T4 node again, its GPU time-sliced four ways, and without MIG as a real T4 answers (NOT_SUPPORTED;
    # t4x1.yaml leaves mig_mode at the spec's default, disabled).
    "t4x1-time-sliced": Shape(
        "t4x1.yaml",
        "Google Compute Engine",
        device_plugin_config=TIME_SLICING_CONFIG,
        gpu_changes={"mig_mode": "unsupported"},
    ),
}

# PCI device IDs of the simulated models (from the PCI ID database), for the stand-in PCI tree.
PCI_DEVICE_IDS = {
    "NVIDIA H100 80GB HBM3": "0x2330",
    "Tesla T4": "0x1eb8",
    "NVIDIA A100-SXM4-40GB": "0x20b0",
}

# Label names both write: on every shape both must have them, with GFD's value unless DIFFERENCES says otherwise.
SHARED = (
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/gpu.compute.minor",
    "nvidia.com/gpu.replicas",
    "nvidia.com/gpu.sharing-strategy",
    "nvidia.com/gpu.mode",
    "nvidia.com/mig.capable",
    "nvidia.com/cuda.driver-version.full",
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
    "nvidia.com/cuda.runtime-version.full",
    "nvidia.com/cuda.runtime-version.major",
    "nvidia.com/cuda.runtime-version.minor",
    "nvidia.com/cuda.runtime.major",
    "nvidia.com/cuda.runtime.minor",
)

# Label names both write where the node has what they describe (patterns over the whole name): the MIG strategy,
# each MIG profile's labels (mixed), and a MIG device's attributes under nvidia.com/gpu (single). On a shape where
# either side writes one, both must, with GFD's value unless DIFFERENCES says otherwise.
SHARED_WHERE_WRITTEN = (
    r"nvidia\.com/mig\.strategy",
    r"nvidia\.com/mig-[0-9a-z.]+\.(count|product|memory|multiprocessors|replicas|sharing-strategy"
    r"|slices\.(gi|ci)|engines\.(copy|decoder|encoder|jpeg|ofa))",
    r"nvidia\.com/gpu\.(multiprocessors|slices\.(gi|ci)|engines\.(copy|decoder|encoder|jpeg|ofa))",
)

# Shared names whose values differ, per shape: (GFD's value, ours). Reasons in docs/compared-labels.md.
DIFFERENCES: dict[str, dict[str, tuple[str, str]]] = {name: {} for name in SHAPES}

# GFD's labels we do not write (patterns over the whole name). Reasons in docs/compared-labels.md.
GFD_ONLY = (
    r"nvidia\.com/gpu\.machine",
    r"nvidia\.com/mps\.capable",
    r"nvidia\.com/vgpu\.present",
)
# Our nvidia.com/ labels GFD does not write.
OURS_ONLY = ("nvidia.com/gpu.present",)


def _run(argv, **kwargs):
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, f"{argv[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def binaries():
    """NVIDIA's GFD (a failed build fails the test) and the mock NVML library's directory."""
    gfd_dir = _run([str(ROOT / "scripts/build-nvidia-device-plugin.sh")], timeout=3600).strip()
    mock_dir = _run([str(ROOT / "scripts/build-mock-nvml.sh")], timeout=600).strip()
    gfd = Path(gfd_dir) / "gpu-feature-discovery"
    assert _run([str(gfd), "--version"]).split()[-1] == GFD_VERSION
    return {"gfd": gfd, "mock_nvml": mock_dir}


def _pci_tree(spec: dict, root: Path) -> Path:
    """The stand-in for /sys/bus/pci/devices: one directory per GPU with what GFD and nvidia_gpu_info read."""
    devices = root / "sys/bus/pci/devices"
    for gpu in spec["gpus"]:
        device = devices / gpu["pci_bus_id"]
        device.mkdir(parents=True)
        device_id = PCI_DEVICE_IDS[gpu["name"]]
        (device / "vendor").write_text("0x10de\n")
        (device / "device").write_text(device_id + "\n")
        # 3D controller: a data-centre GPU in compute mode (GFD: gpu.mode=compute).
        (device / "class").write_text("0x030200\n")
        numa = gpu.get("numa_node")
        (device / "numa_node").write_text(f"{-1 if numa is None else numa}\n")
        (device / "resource").write_text("0x0000000000000000 0x0000000000000000 0x0000000000000000\n")
        # Config space: vendor and device ID, no capability list (status bit 4 clear), so no vGPU signature.
        config_space = bytearray(256)
        config_space[0:2] = (0x10DE).to_bytes(2, "little")
        config_space[2:4] = int(device_id, 16).to_bytes(2, "little")
        (device / "config").write_bytes(bytes(config_space))
    return devices


@pytest.fixture(scope="module")
def nodes(binaries, tmp_path_factory):
    """Per shape: the mock NVML state, the PCI tree and machine file, NVIDIA's config file when there is one."""
    prepared = {}
    for name, shape in SHAPES.items():
        work = tmp_path_factory.mktemp(name)
        spec_path = SPECS / shape.spec
        spec = yaml.safe_load(spec_path.read_text())
        if shape.gpu_changes or shape.mig_layout:
            for gpu in spec["gpus"]:
                gpu.update(shape.gpu_changes)
                if shape.mig_layout:
                    gpu["mig_mode"] = "enabled"
                    gpu["mig_devices"] = [
                        {"uuid": f"MIG-{gpu['uuid'][4:]}-{n}", "profile": profile, "memory_mib": memory}
                        for n, (profile, memory) in enumerate(shape.mig_layout)
                    ]
            spec_path = work / shape.spec
            spec_path.write_text(yaml.safe_dump(spec))
        state = work / "nvml.state"
        _run([sys.executable, str(ROOT / "tests/mock_nvml/nvml_state.py"), str(spec_path), str(state)])
        pci = _pci_tree(spec, work)
        machine = work / "product_name"
        machine.write_text(shape.machine + "\n")
        config_file = None
        if shape.device_plugin_config is not None:
            config_file = work / "config.yaml"
            config_file.write_text(yaml.safe_dump(shape.device_plugin_config))
        prepared[name] = {"work": work, "state": state, "pci": pci, "machine": machine, "config": config_file}
    return prepared


def _parse_gfd_output(text: str) -> dict[str, str]:
    labels = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        assert sep, f"GFD wrote a line that is not KEY=VALUE: {line!r}"
        labels[key] = value
    return labels


@pytest.fixture(scope="module")
def gfd_labels(binaries, nodes):
    """What `gpu-feature-discovery --oneshot` writes for each shape."""
    assert os.geteuid() == 0, "GFD runs in a private mount namespace here, which needs root"
    found = {}
    for name, shape in SHAPES.items():
        node = nodes[name]
        output = node["work"] / "gfd-labels"
        argv = [
            str(binaries["gfd"]),
            "--oneshot",
            f"--output-file={output}",
            "--no-timestamp",
            "--use-node-feature-api=false",
            f"--machine-type-file={node['machine']}",
            *shape.gfd_flags,
        ]
        if node["config"] is not None:
            argv.append(f"--config-file={node['config']}")
        env = dict(os.environ, LD_LIBRARY_PATH=binaries["mock_nvml"], GPUOPS_MOCK_NVML_STATE=str(node["state"]))
        # The PCI tree is bind-mounted over /sys/bus/pci/devices in a mount namespace of GFD's own.
        _run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount --bind "$1" /sys/bus/pci/devices && shift && exec "$@"',
                "sh",
                str(node["pci"]),
                *argv,
            ],
            env=env,
            timeout=120,
        )
        found[name] = _parse_gfd_output(output.read_text())
    return found


# The control_plane fixture's API server (conftest.py): RBAC alone, the default admission plugins, and an
# administrator with a bearer token.
API_SERVER = token_admin_api_server(TOKEN)


@pytest.fixture(scope="module")
def apiserver(control_plane):
    """The control plane's API server, with one Node object per shape (no kubelet)."""
    work = control_plane.work
    kubeconfig = control_plane.kubeconfig(work / "kubeconfig", token=TOKEN)
    core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    for name in SHAPES:
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    return {"kubeconfig": str(kubeconfig), "core": core, "work": work}


@pytest.fixture(scope="module")
def our_labels(binaries, nodes, apiserver):
    """The nvidia.com/ labels the role writes on each shape's Node, after site.yml's discovery and the role."""
    work = apiserver["work"]
    hosts = {}
    for name, shape in SHAPES.items():
        host = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "mock_nvml_state": str(nodes[name]["state"]),
            "stand_in_sysfs": str(nodes[name]["work"] / "sys"),
        }
        if shape.device_plugin_config is not None:
            # The host's device-plugin config, as an inventory sets it for the device_plugin role; the labels
            # role reads its sharing section from there.
            host["device_plugin_config"] = shape.device_plugin_config
        hosts[name] = host
    inventory = work / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": hosts,
                    "vars": {"gpu_node_labels_kubeconfig": apiserver["kubeconfig"], "mock_nvml": binaries["mock_nvml"]},
                }
            }
        )
    )
    playbook = work / "site-labels.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Discover the GPUs and label the nodes, as playbooks/site.yml does",
                    "hosts": "all",
                    "gather_facts": False,
                    "pre_tasks": [
                        {
                            "name": "Discover the GPUs of the node",
                            "gpuops.k8s.nvidia_gpu_info": {"sysfs_root": "{{ stand_in_sysfs }}"},
                            "environment": {
                                "LD_LIBRARY_PATH": "{{ mock_nvml }}",
                                "GPUOPS_MOCK_NVML_STATE": "{{ mock_nvml_state }}",
                            },
                            "register": "gpuops_gpu_info",
                        }
                    ],
                    "roles": [
                        {
                            "role": "gpuops.k8s.gpu_node_labels",
                            "vars": {"gpu_node_labels_gpu_info_var": "gpuops_gpu_info"},
                        }
                    ],
                }
            ]
        )
    )
    collections = _run([str(ROOT / "scripts/collection-tree.sh")]).strip()
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(Path(collections).parents[2]),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_FORKS="4",
    )
    report = json.loads(_run(["ansible-playbook", "-i", str(inventory), str(playbook)], env=env, timeout=600))
    for host in SHAPES:
        assert report["stats"][host]["failures"] == 0, report["stats"]
    found = {}
    for name in SHAPES:
        labels = apiserver["core"].read_node(name).metadata.labels or {}
        found[name] = {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}
    return found


@pytest.fixture(scope="module")
def compared(gfd_labels, our_labels):
    """Both sides per shape; GPUOPS_COMPARED_LABELS=FILE also writes them as JSON (for docs/compared-labels.md)."""
    both = {shape: {"gfd": gfd_labels[shape], "ours": our_labels[shape]} for shape in SHAPES}
    if os.environ.get("GPUOPS_COMPARED_LABELS"):
        Path(os.environ["GPUOPS_COMPARED_LABELS"]).write_text(json.dumps(both, indent=1, sort_keys=True))
    return both


def _gfd_only(name: str) -> bool:
    return any(re.fullmatch(pattern, name) for pattern in GFD_ONLY)


def _shared_where_written(name: str) -> bool:
    return any(re.fullmatch(pattern, name) for pattern in SHARED_WHERE_WRITTEN)


def _shared_names(gfd: dict[str, str], ours: dict[str, str]) -> list[str]:
    """SHARED, and the names of SHARED_WHERE_WRITTEN that either side writes on this shape."""
    return list(SHARED) + sorted(n for n in set(gfd) | set(ours) if _shared_where_written(n))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_shared_labels_have_gfds_values(shape, compared):
    gfd, ours = compared[shape]["gfd"], compared[shape]["ours"]
    shared = _shared_names(gfd, ours)
    missing = {"GFD": [n for n in shared if n not in gfd], "ours": [n for n in shared if n not in ours]}
    assert missing == {"GFD": [], "ours": []}, f"{shape}: a shared label name is missing"
    differences = {n: (gfd[n], ours[n]) for n in shared if gfd[n] != ours[n]}
    assert differences == DIFFERENCES[shape]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_labels_only_one_side_writes_are_the_documented_ones(shape, compared):
    gfd, ours = compared[shape]["gfd"], compared[shape]["ours"]
    shared = set(_shared_names(gfd, ours))
    unlisted_gfd = sorted(n for n in set(gfd) - shared if not _gfd_only(n))
    assert unlisted_gfd == [], f"{shape}: GFD writes labels this comparison does not account for"
    unlisted_ours = sorted(set(ours) - shared - set(OURS_ONLY))
    assert unlisted_ours == [], f"{shape}: we write nvidia.com/ labels this comparison does not account for"
    assert sorted(n for n in OURS_ONLY if n in gfd) == [], f"{shape}: GFD now writes a label we listed as ours only"
    assert all(n in ours for n in OURS_ONLY)


def test_each_shape_shows_what_it_is_there_for(gfd_labels, our_labels):
    """The shapes exercise what they are named for, on GFD's side, so a broken stand-in cannot pass unnoticed."""
    assert gfd_labels["h100x8"]["nvidia.com/gpu.count"] == "8"
    mixed = gfd_labels["a100-mig-mixed"]
    assert mixed["nvidia.com/mig.strategy"] == "mixed"
    assert mixed["nvidia.com/mig-1g.5gb.count"] == "2"
    # Both profiles with all 13 labels each, so that the comparison of their values has something to compare.
    assert len([n for n in mixed if n.startswith(("nvidia.com/mig-1g.5gb.", "nvidia.com/mig-3g.20gb."))]) == 26
    invalid = gfd_labels["a100-mig-single-invalid"]
    assert (invalid["nvidia.com/mig.strategy"], invalid["nvidia.com/gpu.count"]) == ("single", "0")
    assert invalid["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    single = gfd_labels["h100-mig-single"]
    assert (single["nvidia.com/mig.strategy"], single["nvidia.com/gpu.count"]) == ("single", "56")
    assert single["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert len([n for n in single if re.fullmatch(SHARED_WHERE_WRITTEN[2], n)]) == 8
    for shape in ("h100x8", "t4x1", "t4x1-time-sliced"):
        assert not [n for n in gfd_labels[shape] if _shared_where_written(n)], shape
    assert gfd_labels["t4x1-time-sliced"]["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert gfd_labels["t4x1-time-sliced"]["nvidia.com/gpu.replicas"] == "4"
    assert gfd_labels["t4x1-time-sliced"]["nvidia.com/mig.capable"] == "false"
    for shape in SHAPES:
        # The stand-in PCI tree was read: a 3D controller is compute mode, and no vGPU signature was found.
        assert gfd_labels[shape]["nvidia.com/gpu.mode"] == "compute", shape
        assert gfd_labels[shape]["nvidia.com/vgpu.present"] == "false", shape
        assert gfd_labels[shape]["nvidia.com/gpu.machine"] == SHAPES[shape].machine.replace(" ", "-"), shape
