"""Unit tests of gpuops.k8s.nvidia_gpu_info.

There is no NVIDIA GPU where these run, so NVML is played by NvmlTestDouble (nvml_test_double.py), a
test double of pynvml built on the real nvidia-ml-py error classes and structs. sysfs is a real file
tree built in tmp_path. The module runs through its real entry point (main) with real module
arguments; its JSON result is read from stdout as Ansible would read it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import pynvml as real_pynvml
import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpuops.k8s.plugins.module_utils import _simulated_spec
from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_generations import open_modules_branch
from ansible_collections.gpuops.k8s.plugins.modules import nvidia_gpu_info
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.fake_sysfs import (
    NVIDIA_HOST_GPUS,
    NVIDIA_HOST_NVSWITCHES,
    nvidia_host,
)
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.nvml_test_double import (
    DoubleGpu,
    DoubleMigDevice,
    DoubleNvLink,
    NvmlTestDouble,
)

COLLECTION_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
SIMULATED_FIXTURES = sorted(glob.glob(os.path.join(COLLECTION_ROOT, "tests", "fixtures", "simulated", "*.yaml")))
INVALID_FIXTURES = sorted(
    glob.glob(os.path.join(COLLECTION_ROOT, "tests", "unit", "fixtures", "simulated-invalid", "*.yaml"))
)

UUID0 = "GPU-6f1c0a3e-0000-4000-8000-000000000001"
UUID1 = "GPU-6f1c0a3e-0000-4000-8000-000000000002"
UUID2 = "GPU-7e570000-0000-4000-8000-0000000000f4"
MIG0 = "MIG-8a2b0000-0000-4000-8000-0000000000a1"
MIG1 = "MIG-8a2b0000-0000-4000-8000-0000000000a2"
# What the module returns for fake_sysfs's GPU functions: the architecture of each device ID (0x2330 H100, 0x1eb8 T4),
# neither of which runs only the open kernel modules.
HOST_GPUS_RETURNED = [
    dict(NVIDIA_HOST_GPUS[0], architecture="hopper", open_modules_branch=None),
    dict(NVIDIA_HOST_GPUS[1], architecture="hopper", open_modules_branch=None),
    dict(NVIDIA_HOST_GPUS[2], architecture="turing", open_modules_branch=None),
]
# And for its NVSwitch (0x22a3, HGX H100's): the generation; the fabric of H100 GPUs with NVSwitches on the host.
HOST_NVSWITCHES_RETURNED = [dict(NVIDIA_HOST_NVSWITCHES[0], generation=3)]
HOST_FABRIC = {"shape": "nvswitch", "services": ["fabricmanager"]}
FABRIC_FIXTURES = os.path.join(COLLECTION_ROOT, "tests", "fixtures", "simulated", "fabric")


# nvmlDeviceGetAttributes_v2 of an H100's 3g.40gb MIG device (`nvidia-smi mig -lgip`: 60 SMs, 3 copy engines,
# 3 decoders, 3 JPEG engines, no encoder or OFA).
H100_3G_ATTRIBUTES = {
    "multiprocessorCount": 60,
    "sharedCopyEngineCount": 3,
    "sharedDecoderCount": 3,
    "sharedEncoderCount": 0,
    "sharedJpegCount": 3,
    "sharedOfaCount": 0,
    "gpuInstanceSliceCount": 3,
    "computeInstanceSliceCount": 3,
    "memorySizeMB": 40192,
}
NO_ATTRIBUTES = dict.fromkeys(
    (
        "multiprocessors",
        "gpu_instance_slices",
        "compute_instance_slices",
        "copy_engines",
        "decoders",
        "encoders",
        "jpeg_engines",
        "ofa_engines",
        "gpu_instance_profile_id",
        "placement_start",
        "placement_size",
    )
)


def host_gpus():
    """Three GPUs that between them exercise every field and every fallback."""
    return [
        DoubleGpu(
            uuid=UUID0,
            bus_id="00000000:18:00.0",
            numa_node=0,
            persistence_mode=1,
            minor_number=0,
            nvlinks=[DoubleNvLink("00000000:2A:00.0"), DoubleNvLink("00000000:3B:00.0", active=False)],
        ),
        DoubleGpu(
            uuid=UUID1,
            bus_id="00000000:2A:00.0",
            numa_node=None,  # NVML: not supported; sysfs says 1
            persistence_mode=0,
            minor_number=1,
            mig_mode="enabled",
            mig_devices=[
                # GPU instance 2, profile 9 (3g.40gb) on memory slices 4-7.
                DoubleMigDevice(
                    MIG0,
                    "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                    40192,
                    slot=0,
                    attributes=H100_3G_ATTRIBUTES,
                    gpu_instance=(2, 9, 4, 4),
                ),
                # A driver that does not give this MIG device's attributes: they are null.
                DoubleMigDevice(MIG1, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9856, slot=3),
            ],
            nvlinks=[DoubleNvLink("00000000:18:00.0")],
        ),
        DoubleGpu(
            uuid=UUID2,
            name="Tesla T4",
            bus_id="00000000:3B:00.0",
            memory_mib=15360,
            compute_capability=(7, 5),
            brand=real_pynvml.NVML_BRAND_TESLA,
            numa_node=None,  # NVML: not supported; sysfs says -1
            persistence_mode=None,
            minor_number=None,
            mig_mode="unsupported",
            nvlinks=None,
        ),
    ]


EXPECTED_GPUS = [
    {
        "index": 0,
        "uuid": UUID0,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "0000:18:00.0",
        "memory_total_mib": 81559,
        "compute_capability": "9.0",
        "architecture": "hopper",
        "brand": "Nvidia",
        "numa_node": 0,
        "persistence_mode": True,
        "mig_mode": "disabled",
        "mig_devices": [],
        "minor_number": 0,
        "nvlink_peers": [UUID1],
        # The double does not answer nvmlDeviceGetTopologyCommonAncestor; XIDs come as events.
        "pcie_switch": None,
        "pcie_root": "pci0000:00",
        "xid": None,
        "lost": False,
    },
    {
        "index": 1,
        "uuid": UUID1,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "0000:2a:00.0",
        "memory_total_mib": 81559,
        "compute_capability": "9.0",
        "architecture": "hopper",
        "brand": "Nvidia",
        "numa_node": 1,
        "persistence_mode": False,
        "mig_mode": "enabled",
        "mig_devices": [
            {
                "index": 0,
                "uuid": MIG0,
                "profile": "3g.40gb",
                "memory_mib": 40192,
                "multiprocessors": 60,
                "gpu_instance_slices": 3,
                "compute_instance_slices": 3,
                "copy_engines": 3,
                "decoders": 3,
                "encoders": 0,
                "jpeg_engines": 3,
                "ofa_engines": 0,
                "gpu_instance_profile_id": 9,
                "placement_start": 4,
                "placement_size": 4,
            },
            {"index": 1, "uuid": MIG1, "profile": "1g.10gb", "memory_mib": 9856, **NO_ATTRIBUTES},
        ],
        "minor_number": 1,
        "nvlink_peers": [UUID0],
        # The double does not answer nvmlDeviceGetTopologyCommonAncestor; XIDs come as events.
        "pcie_switch": None,
        "pcie_root": "pci0000:00",
        "xid": None,
        "lost": False,
    },
    {
        "index": 2,
        "uuid": UUID2,
        "name": "Tesla T4",
        "pci_bus_id": "0000:3b:00.0",
        "memory_total_mib": 15360,
        "compute_capability": "7.5",
        "architecture": "turing",
        "brand": "Tesla",
        "numa_node": None,
        "persistence_mode": None,
        "mig_mode": "unsupported",
        "mig_devices": [],
        "minor_number": None,
        "nvlink_peers": [],
        # The double does not answer nvmlDeviceGetTopologyCommonAncestor; XIDs come as events.
        "pcie_switch": None,
        "pcie_root": "pci0000:00",
        "xid": None,
        "lost": False,
    },
]


def run_module(monkeypatch, capsys, nvml, **args):
    """Run the module's main() as Ansible does; return (exit code, result dict)."""
    monkeypatch.setattr(nvidia_gpu_info, "pynvml", nvml)
    with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
        nvidia_gpu_info.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out)


@pytest.fixture
def sysfs(tmp_path):
    return nvidia_host(tmp_path / "sys")


# -- NVML ------------------------------------------------------------------------------------


@pytest.mark.parametrize("check_mode", [False, True])
def test_nvml_reports_every_field(monkeypatch, capsys, sysfs, check_mode):
    nvml = NvmlTestDouble(host_gpus(), driver_version="580.95.05", cuda_version=13000)
    code, result = run_module(monkeypatch, capsys, nvml, sysfs_root=sysfs, _ansible_check_mode=check_mode)
    assert code == 0
    assert result["changed"] is False
    assert result["source"] == "nvml"
    assert result["nvml_available"] is True
    assert "nvml_unavailable_reason" not in result
    assert result["driver_version"] == "580.95.05"
    assert result["cuda_driver_version"] == "13.0"
    assert result["gpu_count"] == 3
    assert result["gpus"] == EXPECTED_GPUS
    assert result["pci_devices"] == HOST_GPUS_RETURNED
    assert result["nvswitch_devices"] == HOST_NVSWITCHES_RETURNED
    assert result["nvlink_fabric"] == HOST_FABRIC


def test_nvml_is_initialised_once_and_shut_down_once(monkeypatch, capsys, sysfs):
    nvml = NvmlTestDouble(host_gpus())
    run_module(monkeypatch, capsys, nvml, sysfs_root=sysfs)
    assert nvml.count("nvmlInit") == 1
    assert nvml.count("nvmlShutdown") == 1
    assert nvml.initialised == 0
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls[-1] == "nvmlShutdown"


@pytest.mark.parametrize(
    ("encoded", "expected"),
    [(12080, "12.8"), (13000, "13.0"), (11040, "11.4"), (12020, "12.2")],
)
def test_cuda_driver_version_is_decoded(monkeypatch, capsys, sysfs, encoded, expected):
    code, result = run_module(monkeypatch, capsys, NvmlTestDouble([], cuda_version=encoded), sysfs_root=sysfs)
    assert code == 0
    assert result["cuda_driver_version"] == expected
    assert result["gpus"] == []
    assert result["gpu_count"] == 0


def test_older_pynvml_returning_bytes_gives_the_same_result(monkeypatch, capsys, sysfs):
    nvml = NvmlTestDouble(host_gpus(), legacy=True)
    code, result = run_module(monkeypatch, capsys, nvml, sysfs_root=sysfs)
    assert code == 0
    assert result["gpus"] == EXPECTED_GPUS
    assert result["driver_version"] == "580.95.05"
    # An older pynvml has neither _v2 nor _v3: the module falls back to the plain calls.
    assert nvml.count("nvmlSystemGetCudaDriverVersion") == 1
    assert nvml.count("nvmlDeviceGetPciInfo") == 3
    assert nvml.count("nvmlDeviceGetPciInfo_v3") == 0


def test_the_double_really_returns_bytes_in_legacy_mode():
    nvml = NvmlTestDouble(host_gpus(), legacy=True)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetUUID(handle) == UUID0.encode()
    assert nvml.nvmlDeviceGetPciInfo(handle).busId == b"00000000:18:00.0"
    assert not hasattr(nvml, "nvmlSystemGetCudaDriverVersion_v2")


def test_mig_off_and_mig_on(monkeypatch, capsys, sysfs):
    nvml = NvmlTestDouble(host_gpus())
    code, result = run_module(monkeypatch, capsys, nvml, sysfs_root=sysfs)
    assert code == 0
    off, on, unsupported = result["gpus"]
    assert (off["mig_mode"], off["mig_devices"]) == ("disabled", [])
    assert on["mig_mode"] == "enabled"
    assert [mig["profile"] for mig in on["mig_devices"]] == ["3g.40gb", "1g.10gb"]
    assert (unsupported["mig_mode"], unsupported["mig_devices"]) == ("unsupported", [])
    # Seven MIG slots on the enabled GPU, two of them used; the empty ones answer NOT_FOUND.
    assert nvml.count("nvmlDeviceGetMigDeviceHandleByIndex") == 7


def test_numa_node_from_nvml_then_sysfs_then_unknown(monkeypatch, capsys, sysfs):
    code, result = run_module(monkeypatch, capsys, NvmlTestDouble(host_gpus()), sysfs_root=sysfs)
    assert code == 0
    assert [gpu["numa_node"] for gpu in result["gpus"]] == [0, 1, None]


def test_numa_node_unknown_without_sysfs_entry(monkeypatch, capsys, tmp_path):
    empty_sys = tmp_path / "sys"
    empty_sys.mkdir()
    gpu = DoubleGpu(uuid=UUID0, numa_node=None)
    code, result = run_module(monkeypatch, capsys, NvmlTestDouble([gpu]), sysfs_root=str(empty_sys))
    assert code == 0
    assert result["gpus"][0]["numa_node"] is None
    assert result["pci_devices"] == []


def test_nvswitch_fabric_makes_every_gpu_a_peer(monkeypatch, capsys, sysfs):
    switch = real_pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    gpus = [
        DoubleGpu(
            uuid=f"GPU-0000000{index}-0000-4000-8000-000000000000",
            bus_id=f"00000000:{0x18 + index:02X}:00.0",
            nvlinks=[DoubleNvLink(f"00000000:C{link}:00.0", remote_type=switch) for link in range(4)],
        )
        for index in range(4)
    ]
    gpus.append(DoubleGpu(uuid="GPU-00000009-0000-4000-8000-000000000000", bus_id="00000000:90:00.0"))
    code, result = run_module(monkeypatch, capsys, NvmlTestDouble(gpus), sysfs_root=sysfs)
    assert code == 0
    uuids = [gpu.uuid for gpu in gpus]
    for index in range(4):
        assert result["gpus"][index]["nvlink_peers"] == [u for u in uuids[:4] if u != uuids[index]]
    assert result["gpus"][4]["nvlink_peers"] == []


def test_nvlink_to_one_side_is_symmetric(monkeypatch, capsys, sysfs):
    gpus = [
        DoubleGpu(uuid=UUID0, bus_id="00000000:18:00.0", nvlinks=[DoubleNvLink("00000000:2A:00.0")]),
        DoubleGpu(uuid=UUID1, bus_id="00000000:2A:00.0", nvlinks=[]),
    ]
    code, result = run_module(monkeypatch, capsys, NvmlTestDouble(gpus), sysfs_root=sysfs)
    assert code == 0
    assert [gpu["nvlink_peers"] for gpu in result["gpus"]] == [[UUID1], [UUID0]]


@pytest.mark.parametrize(
    ("call", "gpu_index", "error", "message"),
    [
        (
            "nvmlDeviceGetMemoryInfo",
            1,
            real_pynvml.NVML_ERROR_GPU_IS_LOST,
            f"NVML call nvmlDeviceGetMemoryInfo failed for GPU index 1 ({UUID1}): GPU is lost.",
        ),
        (
            "nvmlDeviceGetHandleByIndex",
            2,
            real_pynvml.NVML_ERROR_UNKNOWN,
            "NVML call nvmlDeviceGetHandleByIndex failed for GPU index 2: Unknown Error.",
        ),
        (
            "nvmlDeviceGetNumaNodeId",
            0,
            real_pynvml.NVML_ERROR_NO_PERMISSION,
            f"NVML call nvmlDeviceGetNumaNodeId failed for GPU index 0 ({UUID0}): Insufficient Permissions.",
        ),
        (
            "nvmlDeviceGetMigDeviceHandleByIndex",
            1,
            real_pynvml.NVML_ERROR_RESET_REQUIRED,
            f"NVML call nvmlDeviceGetMigDeviceHandleByIndex failed for GPU index 1 ({UUID1}), MIG slot 0: "
            "GPU requires restart.",
        ),
        (
            "nvmlDeviceGetNvLinkState",
            0,
            real_pynvml.NVML_ERROR_GPU_IS_LOST,
            f"NVML call nvmlDeviceGetNvLinkState failed for GPU index 0 ({UUID0}), link 0: GPU is lost.",
        ),
        (
            "nvmlSystemGetDriverVersion",
            None,
            real_pynvml.NVML_ERROR_UNKNOWN,
            "NVML call nvmlSystemGetDriverVersion failed for the system: Unknown Error.",
        ),
    ],
)
def test_nvml_error_during_enumeration_fails_with_one_sentence(
    monkeypatch, capsys, sysfs, call, gpu_index, error, message
):
    nvml = NvmlTestDouble(host_gpus(), fail_on={(call, gpu_index): error})
    code, result = run_module(monkeypatch, capsys, nvml, sysfs_root=sysfs)
    assert code == 1
    assert result["failed"] is True
    assert result["msg"] == message
    assert "Traceback" not in json.dumps(result)
    # Even when enumeration fails, NVML is shut down once.
    assert nvml.count("nvmlInit") == 1
    assert nvml.count("nvmlShutdown") == 1


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (real_pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
        (real_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (
            real_pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            "RM has detected an NVML/RM version mismatch: Driver/library version mismatch, the loaded NVIDIA kernel"
            " module is not the installed driver library's version; reboot the node to load the installed driver",
        ),
    ],
)
def test_nvml_init_failure_falls_back_to_sysfs(monkeypatch, capsys, sysfs, error, words):
    nvml = NvmlTestDouble(host_gpus(), init_error=error)
    code, result = run_module(monkeypatch, capsys, nvml, sysfs_root=sysfs)
    assert code == 0
    assert "failed" not in result
    assert result["source"] == "sysfs"
    assert result["nvml_available"] is False
    assert result["nvml_unavailable_reason"] == (
        f"NVML could not be initialised ({words}), so the GPUs were read from the PCI bus in sysfs."
    )
    assert result["driver_version"] is None
    assert result["cuda_driver_version"] is None
    assert result["gpus"] == []
    assert result["pci_devices"] == HOST_GPUS_RETURNED
    assert result["nvswitch_devices"] == HOST_NVSWITCHES_RETURNED
    assert result["nvlink_fabric"] == HOST_FABRIC
    assert result["gpu_count"] == 3
    assert nvml.calls == ["nvmlInit"]


def test_without_pynvml_falls_back_to_sysfs(monkeypatch, capsys, sysfs):
    code, result = run_module(monkeypatch, capsys, None, sysfs_root=sysfs)
    assert code == 0
    assert result["source"] == "sysfs"
    assert result["nvml_available"] is False
    assert result["nvml_unavailable_reason"] == nvidia_gpu_info.NO_PYNVML_REASON
    assert result["pci_devices"] == HOST_GPUS_RETURNED
    assert result["gpu_count"] == 3


def test_sysfs_root_that_does_not_exist_fails(monkeypatch, capsys, tmp_path):
    missing = str(tmp_path / "nope")
    code, result = run_module(monkeypatch, capsys, None, sysfs_root=missing)
    assert code == 1
    assert result["msg"] == f"sysfs_root {missing} is not a directory."


# -- simulate_from -----------------------------------------------------------------------------


def test_there_are_simulated_fixtures():
    assert len(SIMULATED_FIXTURES) >= 3
    assert len(INVALID_FIXTURES) >= 10


@pytest.mark.parametrize("spec_path", SIMULATED_FIXTURES, ids=os.path.basename)
@pytest.mark.parametrize("check_mode", [False, True])
def test_simulated_fixture(monkeypatch, capsys, spec_path, check_mode):
    with open(spec_path) as handle:
        raw = yaml.safe_load(handle)
    # NVML must not be touched at all: a double that fails any call proves it.
    nvml = NvmlTestDouble([], init_error=real_pynvml.NVML_ERROR_UNKNOWN)
    code, result = run_module(monkeypatch, capsys, nvml, simulate_from=spec_path, _ansible_check_mode=check_mode)
    assert code == 0
    assert nvml.calls == []
    assert result["changed"] is False
    assert result["source"] == "simulated"
    assert result["nvml_available"] is False
    assert result["driver_version"] == raw["driver_version"]
    assert result["cuda_driver_version"] == raw["cuda_driver_version"]
    assert result["gpu_count"] == len(raw["gpus"])
    assert result["nvswitch_devices"] == []
    assert result["nvlink_fabric"] == {"shape": "none", "services": []}
    for index, (gpu, source) in enumerate(zip(result["gpus"], raw["gpus"])):
        assert gpu["index"] == index
        assert gpu["uuid"] == source["uuid"]
        assert gpu["name"] == source["name"]
        assert gpu["pci_bus_id"] == source["pci_bus_id"]
        assert gpu["memory_total_mib"] == source["memory_mib"]
        assert gpu["compute_capability"] == source["compute_capability"]
        assert gpu["numa_node"] == source.get("numa_node")
        assert gpu["persistence_mode"] == source.get("persistence_mode", True)
        assert gpu["minor_number"] == source.get("minor_number", index)
        assert gpu["mig_mode"] == source.get("mig_mode", "disabled")
        # The spec's keys, in NVML's order: by GPU instance ID, which follows from the placement (the whole GPU 0,
        # halves 1-2, quarters 3-6, eighths 7-14 of 8 memory slices); the attributes NVML would give come from the
        # mock library's model (below).
        ids = {
            m["uuid"]: 8 // m["placement_size"] - 1 + m["placement_start"] // m["placement_size"]
            for m in gpu["mig_devices"]
        }
        in_nvml_order = sorted(source.get("mig_devices", []), key=lambda mig, ids=ids: ids[mig["uuid"]])
        assert [{k: m[k] for k in ("index", "uuid", "profile", "memory_mib")} for m in gpu["mig_devices"]] == [
            dict(mig, index=position) for position, mig in enumerate(in_nvml_order)
        ]
        assert gpu["pcie_switch"] == source.get("pcie_switch")
        assert gpu["xid"] == source.get("xid")
        assert gpu["lost"] == source.get("lost", False)
        assert gpu["architecture"] in ("turing", "ampere", "hopper")
        assert set(source.get("nvlink_peers", [])) <= set(gpu["nvlink_peers"])
        assert result["pci_devices"][index]["bus_id"] == source["pci_bus_id"]
        assert result["pci_devices"][index]["numa_node"] == source.get("numa_node")
        assert result["pci_devices"][index]["architecture"] == gpu["architecture"]
        assert result["pci_devices"][index]["open_modules_branch"] == open_modules_branch(source.get("pci_device_id"))


def test_simulated_gpus_come_with_the_real_pci_bus(monkeypatch, capsys, sysfs, tmp_path):
    """A lab node's driver role decides from the real bus in the same module run as the simulated GPUs."""
    spec = os.path.join(COLLECTION_ROOT, "tests", "fixtures", "simulated", "h100x8.yaml")
    nvml = NvmlTestDouble([], init_error=real_pynvml.NVML_ERROR_UNKNOWN)
    code, result = run_module(monkeypatch, capsys, nvml, simulate_from=spec, sysfs_root=str(sysfs))
    assert code == 0
    assert result["gpu_count"] == 8
    assert result["host_pci"] == {
        "pci_devices": HOST_GPUS_RETURNED,
        "nvswitch_devices": HOST_NVSWITCHES_RETURNED,
        "nvlink_fabric": HOST_FABRIC,
    }
    empty = tmp_path / "empty-sys"
    (empty / "bus" / "pci" / "devices").mkdir(parents=True)
    code, result = run_module(monkeypatch, capsys, nvml, simulate_from=spec, sysfs_root=str(empty))
    assert result["host_pci"] == {
        "pci_devices": [],
        "nvswitch_devices": [],
        "nvlink_fabric": {"shape": "none", "services": []},
    }
    assert len(result["pci_devices"]) == 8


@pytest.mark.parametrize(
    ("name", "gpus", "device_id", "nvswitches", "fabric"),
    [
        ("hgx-h100.yaml", 8, "0x2330", 4, {"shape": "nvswitch", "services": ["fabricmanager"]}),
        ("hgx-b200.yaml", 8, "0x2901", 0, {"shape": "nvlink5-hgx", "services": ["nvlsm", "fabricmanager"]}),
        ("gb200-nvl.yaml", 4, "0x2941", 0, {"shape": "nvlink5-rack", "services": ["imex"]}),
    ],
)
def test_simulated_fabric_shapes_come_back_as_the_sysfs_scan_would(
    monkeypatch, capsys, name, gpus, device_id, nvswitches, fabric
):
    code, result = run_module(monkeypatch, capsys, None, simulate_from=os.path.join(FABRIC_FIXTURES, name))
    assert code == 0
    assert [device["device_id"] for device in result["pci_devices"]] == [device_id] * gpus
    assert len(result["nvswitch_devices"]) == nvswitches
    for switch in result["nvswitch_devices"]:
        assert {k: switch[k] for k in ("vendor_id", "device_id", "class", "driver", "generation")} == {
            "vendor_id": "0x10de",
            "device_id": "0x22a3",
            "class": "0x068000",
            "driver": "nvidia-nvswitch",
            "generation": 3,
        }
    assert result["nvlink_fabric"] == fabric


def test_simulated_h100x8_topology(monkeypatch, capsys):
    spec = os.path.join(COLLECTION_ROOT, "tests", "fixtures", "simulated", "h100x8.yaml")
    code, result = run_module(monkeypatch, capsys, None, simulate_from=spec)
    assert code == 0
    uuids = [gpu["uuid"] for gpu in result["gpus"]]
    assert result["gpus"][0]["nvlink_peers"] == uuids[1:4]
    assert result["gpus"][5]["nvlink_peers"] == [uuids[4], uuids[6], uuids[7]]
    assert [gpu["numa_node"] for gpu in result["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [gpu["pcie_switch"] for gpu in result["gpus"]] == ["sw0", "sw0", "sw1", "sw1", "sw2", "sw2", "sw3", "sw3"]


def test_simulated_a100_mig(monkeypatch, capsys):
    spec = os.path.join(COLLECTION_ROOT, "tests", "fixtures", "simulated", "a100-mig.yaml")
    code, result = run_module(monkeypatch, capsys, None, simulate_from=spec)
    assert code == 0
    assert result["gpus"][0]["mig_mode"] == "enabled"
    assert [m["profile"] for m in result["gpus"][0]["mig_devices"]] == ["3g.20gb", "1g.5gb", "1g.5gb"]
    # What the lab's mock NVML library answers as these devices' attributes (an A100 40GB's profiles as
    # `nvidia-smi mig -lgip` lists them): SMs, slices, copy engines, decoders, encoders, JPEG, OFA.
    keys = ("multiprocessors", "gpu_instance_slices", "compute_instance_slices", "copy_engines", "decoders")
    keys += ("encoders", "jpeg_engines", "ofa_engines")
    assert [tuple(m[k] for k in keys) for m in result["gpus"][0]["mig_devices"]] == [
        (42, 3, 3, 3, 2, 0, 0, 0),
        (14, 1, 1, 1, 0, 0, 0, 0),
        (14, 1, 1, 1, 0, 0, 0, 0),
    ]
    assert result["gpus"][1]["mig_devices"] == []
    assert result["gpus"][1]["numa_node"] is None


def _expected_fragments(path):
    with open(path) as handle:
        for line in handle:
            if line.startswith("# expect:"):
                return [part.strip() for part in line[len("# expect:") :].split("|")]
    raise AssertionError(f"{path} has no '# expect:' line")


@pytest.mark.parametrize("spec_path", INVALID_FIXTURES, ids=os.path.basename)
def test_invalid_simulated_spec_fails_with_one_sentence(monkeypatch, capsys, spec_path):
    code, result = run_module(monkeypatch, capsys, None, simulate_from=spec_path)
    assert code == 1
    assert result["failed"] is True
    message = result["msg"]
    assert message.startswith(f"Simulated-GPU spec {spec_path}")
    assert message.endswith(".")
    assert "\n" not in message
    for fragment in _expected_fragments(spec_path):
        assert fragment in message


def test_invalid_spec_names_the_gpu(monkeypatch, capsys):
    spec = os.path.join(COLLECTION_ROOT, "tests", "unit", "fixtures", "simulated-invalid", "duplicate-uuid.yaml")
    code, result = run_module(monkeypatch, capsys, None, simulate_from=spec)
    assert code == 1
    assert result["msg"] == (
        f"Simulated-GPU spec {spec}, GPU 1 (GPU-1a2b0000-0000-4000-8000-000000000001): "
        "uuid GPU-1a2b0000-0000-4000-8000-000000000001 is already used by GPU 0."
    )


def test_simulate_from_missing_file(monkeypatch, capsys, tmp_path):
    missing = str(tmp_path / "absent.yaml")
    code, result = run_module(monkeypatch, capsys, None, simulate_from=missing)
    assert code == 1
    assert result["msg"] == f"Simulated-GPU spec {missing} cannot be read: No such file or directory."


def test_simulate_from_invalid_yaml(monkeypatch, capsys, tmp_path):
    spec = tmp_path / "broken.yaml"
    spec.write_text("gpus: [\n  - uuid: x\n")
    code, result = run_module(monkeypatch, capsys, None, simulate_from=str(spec))
    assert code == 1
    assert result["msg"].startswith(f"Simulated-GPU spec {spec} is not valid YAML at line")


def test_simulate_from_without_pyyaml_fails_with_missing_required_lib(monkeypatch, capsys, tmp_path):
    spec = tmp_path / "t4.yaml"
    shutil.copy(SIMULATED_FIXTURES[-1], str(spec))
    monkeypatch.setattr(_simulated_spec, "HAS_YAML", False)
    monkeypatch.setattr(_simulated_spec, "YAML_IMPORT_ERROR", ImportError("No module named 'yaml'"))
    code, result = run_module(monkeypatch, capsys, None, simulate_from=str(spec))
    assert code == 1
    assert "PyYAML" in result["msg"]
    assert "Failed to import the required Python library" in result["msg"]


# -- documentation -----------------------------------------------------------------------------


def test_every_returned_key_is_documented(monkeypatch, capsys, sysfs):
    documented = yaml.safe_load(nvidia_gpu_info.RETURN)
    options = yaml.safe_load(nvidia_gpu_info.DOCUMENTATION)["options"]
    assert set(options) == {"sysfs_root", "simulate_from"}
    nvml_result = run_module(monkeypatch, capsys, NvmlTestDouble(host_gpus()), sysfs_root=sysfs)[1]
    sysfs_result = run_module(monkeypatch, capsys, None, sysfs_root=sysfs)[1]
    simulated = os.path.join(COLLECTION_ROOT, "tests", "fixtures", "simulated", "a100-mig.yaml")
    simulated_result = run_module(monkeypatch, capsys, None, simulate_from=simulated)[1]
    common = {"changed", "invocation"}
    returned = set(nvml_result) | set(sysfs_result) | set(simulated_result)
    assert returned - common == set(documented)
    gpu_keys = set(documented["gpus"]["contains"])
    assert set(nvml_result["gpus"][0]) | {"pcie_switch"} == gpu_keys
    assert set(simulated_result["gpus"][0]) == gpu_keys
    assert set(documented["gpus"]["contains"]["mig_devices"]["contains"]) == set(
        simulated_result["gpus"][0]["mig_devices"][0]
    )
    assert set(documented["pci_devices"]["contains"]) == set(sysfs_result["pci_devices"][0])


def test_a_simulated_driver_library_mismatch_is_what_nvml_reports(monkeypatch, capsys, tmp_path):
    """A spec whose kernel_module_version is not its driver_version: NVML would not initialise, so the result is the
    sysfs fallback with NVML's reason, the spec's PCI devices kept for the driver role."""
    with open(os.path.join(COLLECTION_ROOT, "tests", "fixtures", "simulated", "h100x8.yaml")) as source:
        text = source.read()
    spec = tmp_path / "mismatch.yaml"
    spec.write_text(text + "\nkernel_module_version: 1.0.0\n")
    code, result = run_module(monkeypatch, capsys, None, simulate_from=str(spec))
    assert code == 0
    assert (result["source"], result["nvml_available"], result["gpus"]) == ("sysfs", False, [])
    assert result["nvml_unavailable_reason"] == (
        "NVML could not be initialised (RM has detected an NVML/RM version mismatch: Driver/library version mismatch,"
        " the loaded NVIDIA kernel module is not the installed driver library's version; reboot the node to load the"
        " installed driver), so the GPUs were read from the PCI bus in sysfs."
    )
    assert len(result["pci_devices"]) == 8


@pytest.mark.parametrize(
    ("device_id", "architecture", "branch"),
    [("0x2342", "hopper", 535), ("0x2348", "hopper", 565), ("0x2330", "hopper", None), ("0x2901", "blackwell", 570)],
)
def test_each_pci_gpu_says_whether_it_runs_only_the_open_modules(device_id, architecture, branch):
    """Grace Hopper's GPU (GH200) is a Hopper GPU that runs only the open kernel modules, as Blackwell's do."""
    device = {"bus_id": "0009:01:00.0", "vendor_id": "0x10de", "device_id": device_id}
    assert nvidia_gpu_info._with_architecture([device]) == [
        dict(device, architecture=architecture, open_modules_branch=branch)
    ]
