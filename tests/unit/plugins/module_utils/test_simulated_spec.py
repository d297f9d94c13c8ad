"""Unit tests of the simulated-GPU spec reader (docs/simulated-gpus.md)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._simulated_spec import SpecError, parse_spec


def spec(*gpus, **top):
    data = {"driver_version": "580.95.05", "cuda_driver_version": "13.0", "gpus": list(gpus)}
    data.update(top)
    return data


def gpu(n, **extra):
    data = {
        "uuid": f"GPU-0000000{n}",
        "name": "NVIDIA L4",
        "memory_mib": 23034,
        "pci_bus_id": f"0000:0{n}:00.0",
        "compute_capability": "8.9",
    }
    data.update(extra)
    return data


def test_defaults():
    result = parse_spec(spec(gpu(1), gpu(2)), "lab.yaml")
    second = result["gpus"][1]
    assert second == {
        "index": 1,
        "uuid": "GPU-00000002",
        "name": "NVIDIA L4",
        "pci_bus_id": "0000:02:00.0",
        "memory_mib": 23034,
        "compute_capability": "8.9",
        "numa_node": None,
        "persistence_mode": True,
        "mig_mode": "disabled",
        "mig_devices": [],
        "minor_number": 1,
        "nvlink_peers": [],
        "pcie_switch": None,
        "xid": None,
        "lost": False,
    }


def test_empty_gpu_list_is_valid():
    assert parse_spec(spec(), "empty.yaml")["gpus"] == []


def test_peers_listed_on_one_side_are_symmetric():
    result = parse_spec(spec(gpu(1, nvlink_peers=["GPU-00000003"]), gpu(2), gpu(3)), "lab.yaml")
    assert [g["nvlink_peers"] for g in result["gpus"]] == [["GPU-00000003"], [], ["GPU-00000001"]]


def test_bus_ids_compare_case_insensitively():
    with pytest.raises(SpecError, match=r"pci_bus_id 0000:0a:00\.0 is already used by GPU 0"):
        parse_spec(spec(gpu(1, pci_bus_id="0000:0a:00.0"), gpu(2, pci_bus_id="0000:0A:00.0")), "lab.yaml")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "Simulated-GPU spec lab.yaml must be a YAML mapping at the top level."),
        (spec(gpus=None), "Simulated-GPU spec lab.yaml: gpus must be a list."),
        ({"gpus": []}, "Simulated-GPU spec lab.yaml lacks the required key 'driver_version'."),
        (spec(driver_version=580), "Simulated-GPU spec lab.yaml: driver_version must be a non-empty string."),
        (
            spec(gpu(1, nvlink_peers=["GPU-00000001"])),
            "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): nvlink_peers names the GPU itself.",
        ),
        (
            spec(gpu(1, numa_node="0")),
            "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): numa_node must be an integer or null.",
        ),
        (
            spec(gpu(1, memory_mib=True)),
            "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): memory_mib must be a positive integer.",
        ),
        (
            spec(gpu(1, persistence_mode="yes")),
            "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): persistence_mode must be true or false.",
        ),
        (
            spec(gpu(1, minor_number=-1)),
            "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): minor_number must be a non-negative integer.",
        ),
        (spec(gpu(1, xid="79")), "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): xid must be a positive integer."),
        (spec(gpu(1, xid=0)), "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): xid must be a positive integer."),
        (spec(gpu(1, lost=1)), "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): lost must be true or false."),
        (spec("GPU-1"), "Simulated-GPU spec lab.yaml, GPU 0: each entry of gpus must be a mapping."),
        (
            spec(gpu(1, compute_capability=9.0)),
            'Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): compute_capability must be a string "MAJOR.MINOR", '
            "not 9.0.",
        ),
        (
            spec(
                gpu(
                    1,
                    mig_mode="enabled",
                    mig_devices=[{"uuid": "GPU-00000001", "profile": "1g.5gb", "memory_mib": 4864}],
                )
            ),
            "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): MIG device 0: "
            'uuid must be a string starting with "MIG-".',
        ),
        (
            spec(
                gpu(
                    1,
                    mig_mode="enabled",
                    mig_devices=[
                        {"uuid": "MIG-1", "profile": "1g.5gb", "memory_mib": 4864},
                        {"uuid": "MIG-1", "profile": "1g.5gb", "memory_mib": 4864},
                    ],
                )
            ),
            "Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): MIG device 1: uuid MIG-1 is already used by "
            "GPU 0 MIG device 0.",
        ),
    ],
)
def test_rule_violations(data, message):
    with pytest.raises(SpecError) as error:
        parse_spec(data, "lab.yaml")
    assert str(error.value) == message
