"""Unit tests of the discovery helpers: PCI bus IDs, CUDA versions, the GPU fact shape (architecture,
spec to facts, PCIe switch groups), and the sysfs scan on a real tree."""

from __future__ import annotations

import os

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_discovery import (
    GPU_FACT_KEYS,
    MIG_ATTRIBUTE_KEYS,
    MIG_PLACEMENT_KEYS,
    DiscoveryError,
    _pcie_switch_groups,
    brand_name,
    facts_from_spec,
    format_cuda_version,
    gpu_architecture,
    gpu_fact,
    normalize_bus_id,
    scan_pci,
    sysfs_numa_node,
    sysfs_pcie_root,
    to_text,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._simulated_spec import MIG_ATTRIBUTE_KEYS as SPEC_MIG_KEYS
from ansible_collections.gpuops.k8s.plugins.module_utils._simulated_spec import (
    mig_device_attributes,
    parse_spec,
)
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.fake_sysfs import (
    NVIDIA_HOST_GPUS,
    NVIDIA_HOST_NVSWITCHES,
    add_pci_device,
    nvidia_host,
)


@pytest.mark.parametrize(
    ("nvml_form", "sysfs_form"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        (b"00000000:AB:00.0", "0000:ab:00.0"),
        ("0000:3B:00.1", "0000:3b:00.1"),
        ("00000001:C0:00.0", "0001:c0:00.0"),
        ("18:00.0", "0000:18:00.0"),
    ],
)
def test_normalize_bus_id(nvml_form, sysfs_form):
    assert normalize_bus_id(nvml_form) == sysfs_form


@pytest.mark.parametrize(("encoded", "text"), [(12080, "12.8"), (13000, "13.0"), (11020, "11.2"), (10010, "10.1")])
def test_format_cuda_version(encoded, text):
    assert format_cuda_version(encoded) == text


def test_to_text():
    assert to_text(b"NVIDIA A100\x00") == "NVIDIA A100"
    assert to_text("NVIDIA A100") == "NVIDIA A100"


def test_scan_pci_finds_gpus_and_nvswitches_only(tmp_path):
    root = nvidia_host(tmp_path / "sys")
    gpus, nvswitches = scan_pci(root)
    assert gpus == NVIDIA_HOST_GPUS
    assert nvswitches == NVIDIA_HOST_NVSWITCHES


def test_scan_pci_without_numa_file(tmp_path):
    root = str(tmp_path / "sys")
    add_pci_device(root, "0000:01:00.0", "0x10de", "0x1db6", "0x030200")
    gpus, nvswitches = scan_pci(root)
    assert gpus == [
        {
            "bus_id": "0000:01:00.0",
            "vendor_id": "0x10de",
            "device_id": "0x1db6",
            "class": "0x030200",
            "numa_node": None,
            "driver": None,
        }
    ]
    assert nvswitches == []


def test_scan_pci_without_a_pci_bus(tmp_path):
    root = tmp_path / "sys"
    root.mkdir()
    assert scan_pci(str(root)) == ([], [])


def test_scan_pci_rejects_a_missing_root(tmp_path):
    with pytest.raises(DiscoveryError, match="is not a directory"):
        scan_pci(str(tmp_path / "absent"))


def test_sysfs_numa_node(tmp_path):
    root = nvidia_host(tmp_path / "sys")
    assert sysfs_numa_node(root, "0000:2a:00.0") == 1
    assert sysfs_numa_node(root, "0000:3b:00.0") is None
    assert sysfs_numa_node(root, "0000:99:00.0") is None


def test_sysfs_pcie_root_is_the_root_complex_the_device_link_leads_to(tmp_path):
    root = nvidia_host(tmp_path / "sys")
    assert sysfs_pcie_root(root, "0000:2a:00.0") == "pci0000:00"
    assert sysfs_pcie_root(root, "0000:99:00.0") is None


def test_the_pcie_root_of_a_real_device_is_what_its_sysfs_path_starts_with():
    """On this host's real /sys, as Kubernetes' deviceattribute helper reads the standard pcieRoot attribute."""
    names = sorted(os.listdir("/sys/bus/pci/devices"))
    assert names, "this host has a PCI bus"
    for name in names:
        target = os.path.realpath(os.path.join("/sys/bus/pci/devices", name))
        assert target.startswith("/sys/devices/pci")
        assert sysfs_pcie_root("/sys", name) == target.split("/")[3]


@pytest.mark.parametrize(
    ("value", "name"), [(2, "Tesla"), (14, "Nvidia"), (0, "Unknown"), (16, "TitanRTX"), (19, "Unknown"), (None, None)]
)
def test_nvml_brands_are_named_as_nvidia_s_go_nvlib_names_them(value, name):
    assert brand_name(value) == name


@pytest.mark.skipif(not os.path.isdir("/sys/bus/pci/devices"), reason="this host has no PCI bus in sysfs")
def test_scan_pci_reads_the_real_sysfs():
    """Against this host's real /sys: every device reported is an NVIDIA GPU or NVSwitch function."""
    gpus, nvswitches = scan_pci("/sys")
    for device in gpus + nvswitches:
        assert device["vendor_id"] == "0x10de"
        with open(os.path.join("/sys/bus/pci/devices", device["bus_id"], "class")) as handle:
            assert handle.read().strip() == device["class"]
    expected = 0
    for name in os.listdir("/sys/bus/pci/devices"):
        with open(os.path.join("/sys/bus/pci/devices", name, "vendor")) as handle:
            vendor = handle.read().strip()
        with open(os.path.join("/sys/bus/pci/devices", name, "class")) as handle:
            pci_class = handle.read().strip()
        if vendor == "0x10de" and pci_class[:6] in ("0x0300", "0x0302", "0x0680"):
            expected += 1
    assert len(gpus) + len(nvswitches) == expected


@pytest.mark.parametrize(
    ("capability", "architecture"),
    [
        ("7.0", "volta"),
        ("7.5", "turing"),
        ("8.0", "ampere"),
        ("8.9", "ada-lovelace"),
        ("9.0", "hopper"),
        ("10.0", "blackwell"),
        ("12.0", "blackwell"),
        ("6.1", "pascal"),
        ("4.0", "undefined"),
        ("nine", "undefined"),
        (None, "undefined"),
    ],
)
def test_gpu_architecture(capability, architecture):
    assert gpu_architecture(capability) == architecture


def test_gpu_fact_has_every_key_and_derives_the_architecture():
    fact = gpu_fact(
        uuid="GPU-1", compute_capability="8.0", mig_devices=[{"uuid": "MIG-1", "profile": "1g.5gb", "memory_mib": 4864}]
    )
    assert tuple(fact) == GPU_FACT_KEYS
    assert fact["architecture"] == "ampere"
    # The MIG attributes NVML gives are null where the source does not know them.
    assert fact["mig_devices"] == [
        {
            "index": 0,
            "uuid": "MIG-1",
            "profile": "1g.5gb",
            "memory_mib": 4864,
            **dict.fromkeys(MIG_ATTRIBUTE_KEYS + MIG_PLACEMENT_KEYS),
        }
    ]
    assert (fact["nvlink_peers"], fact["lost"], fact["xid"], fact["pcie_switch"]) == ([], False, None, None)
    with pytest.raises(ValueError, match="unknown GPU fact"):
        gpu_fact(uuid="GPU-1", colour="green")


def test_facts_from_spec_keeps_every_key_of_the_format():
    spec = parse_spec(
        {
            "driver_version": "580.95.05",
            "cuda_driver_version": "13.0",
            "gpus": [
                {
                    "uuid": "GPU-1",
                    "name": "NVIDIA A100-SXM4-40GB",
                    "memory_mib": 40960,
                    "pci_bus_id": "0000:07:00.0",
                    "compute_capability": "8.0",
                    "numa_node": 1,
                    "pcie_switch": "plx0",
                    "persistence_mode": False,
                    "minor_number": 4,
                    "xid": 79,
                    "lost": True,
                    "mig_mode": "enabled",
                    "mig_devices": [{"uuid": "MIG-1", "profile": "1g.5gb", "memory_mib": 4864}],
                }
            ],
        },
        "lab.yaml",
    )
    facts = facts_from_spec(spec)
    assert (facts["driver_version"], facts["cuda_driver_version"]) == ("580.95.05", "13.0")
    assert facts["gpus"] == [
        {
            "index": 0,
            "uuid": "GPU-1",
            "name": "NVIDIA A100-SXM4-40GB",
            "pci_bus_id": "0000:07:00.0",
            "memory_total_mib": 40960,
            "compute_capability": "8.0",
            "architecture": "ampere",
            "brand": "Nvidia",
            "numa_node": 1,
            "persistence_mode": False,
            "mig_mode": "enabled",
            # An A100 40GB's 1g.5gb as the mock NVML library models it: 14 SMs, one slice, one copy engine, GPU-instance
            # profile 19 on the first memory slice.
            "mig_devices": [
                {
                    "index": 0,
                    "uuid": "MIG-1",
                    "profile": "1g.5gb",
                    "memory_mib": 4864,
                    "multiprocessors": 14,
                    "gpu_instance_slices": 1,
                    "compute_instance_slices": 1,
                    "copy_engines": 1,
                    "decoders": 0,
                    "encoders": 0,
                    "jpeg_engines": 0,
                    "ofa_engines": 0,
                    "gpu_instance_profile_id": 19,
                    "placement_start": 0,
                    "placement_size": 1,
                }
            ],
            "minor_number": 4,
            "nvlink_peers": [],
            "pcie_switch": "plx0",
            "pcie_root": None,
            "xid": 79,
            "lost": True,
        }
    ]


class TopologyDouble:
    """A test double of the two pynvml names _pcie_switch_groups reads: GPUs on the same switch answer
    NVML_TOPOLOGY_MULTIPLE (20) or closer, others NVML_TOPOLOGY_NODE (40)."""

    class NVMLError(Exception):
        pass

    NVML_TOPOLOGY_MULTIPLE = 20

    def __init__(self, switch_of):
        self.switch_of = switch_of

    def nvmlDeviceGetTopologyCommonAncestor(self, first, second):
        if self.switch_of[first] is None or self.switch_of[second] is None:
            raise self.NVMLError("Not Supported")
        return 10 if self.switch_of[first] == self.switch_of[second] else 40


def test_pcie_switch_groups_are_named_in_index_order():
    nvml = TopologyDouble(["b", "a", "b", "c", "a", None])
    assert _pcie_switch_groups(nvml, list(range(6))) == ["sw0", "sw1", "sw0", None, "sw1", None]


def test_pcie_switch_groups_without_the_topology_call():
    assert _pcie_switch_groups(object(), [0, 1]) == [None, None]


def test_the_spec_reader_names_the_mig_attributes_as_the_facts_do():
    # Two files (the daemon carries each apart), one list of names.
    assert SPEC_MIG_KEYS == MIG_ATTRIBUTE_KEYS


@pytest.mark.parametrize(
    "gpu, profile, attributes",
    [
        # H100 80GB, `nvidia-smi mig -lgip`: 1g.10gb has 16 SMs, a copy engine, a decoder and a JPEG engine.
        ("NVIDIA H100 80GB HBM3", "1g.10gb", (16, 1, 1, 1, 1, 0, 1, 0)),
        # The +me profile adds the OFA engine.
        ("NVIDIA H100 80GB HBM3", "1g.10gb+me", (16, 1, 1, 1, 1, 0, 1, 1)),
        ("NVIDIA H100 80GB HBM3", "7g.80gb", (132, 7, 7, 8, 7, 0, 7, 1)),
        # A compute instance of one slice in a 3-slice GPU instance: the 1-slice SMs, the GPU instance's engines.
        ("NVIDIA A100-SXM4-40GB", "1c.3g.20gb", (14, 3, 1, 3, 2, 0, 0, 0)),
    ],
)
def test_a_mig_devices_attributes_are_what_the_mock_library_answers(gpu, profile, attributes):
    assert tuple(mig_device_attributes(gpu, profile).values()) == attributes


@pytest.mark.parametrize(
    "gpu, profile",
    [("Tesla T4", "1g.5gb"), ("NVIDIA H100 80GB HBM3", "1g.5gb"), ("NVIDIA A100-SXM4-40GB", "3c.4g.20gb")],
)
def test_a_mig_device_the_mock_library_does_not_model_has_no_attributes(gpu, profile):
    assert mig_device_attributes(gpu, profile) == dict.fromkeys(MIG_ATTRIBUTE_KEYS)
