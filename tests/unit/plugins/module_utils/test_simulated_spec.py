"""Unit tests of the simulated-GPU spec reader (docs/simulated-gpus.md)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._simulated_spec import (
    MOCK_NVML_READINGS,
    SpecError,
    mock_nvml_state_text,
    parse_spec,
)


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
        "pci_device_id": None,
        "brand": "Nvidia",
        "pcie_root": None,
        "readings": MOCK_NVML_READINGS,
    }
    assert "nvswitches" not in result


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


# The mock NVML library's state (tests/mock_nvml): MIG devices a spec declares, placed as the library serves them.
def a100(**extra):
    return gpu(1, name="NVIDIA A100-SXM4-40GB", memory_mib=40960, compute_capability="8.0", **extra)


def mig(n, profile, memory_mib=4864):
    return {"uuid": f"MIG-0000000{n}", "profile": profile, "memory_mib": memory_mib}


def state_of(data):
    from ansible_collections.gpuops.k8s.plugins.module_utils._simulated_spec import mock_nvml_state_text

    return mock_nvml_state_text(parse_spec(data, "lab.yaml"), "lab.yaml").splitlines()


def test_declared_mig_devices_take_the_lowest_free_placement_of_their_profile_in_order():
    devices = [mig(1, "1g.5gb"), mig(2, "3g.20gb", 19968), mig(3, "1c.2g.10gb", 9856)]
    lines = state_of(spec(a100(mig_mode="enabled", mig_devices=devices)))
    # mig UUID MEMORY_MIB PROFILE GI_INDEX GI_START CI_INDEX CI_START
    assert [line for line in lines if line.startswith("mig ")] == [
        "mig MIG-00000001 4864 1g.5gb 0 0 0 0",
        "mig MIG-00000002 19968 3g.20gb 2 4 2 0",
        "mig MIG-00000003 9856 1c.2g.10gb 1 2 0 0",
    ]
    assert "gi_profile 2 9 3g.20gb 3 2 19968 42 3 2 0 0 0 4 0,4" in lines
    assert "ci_profile 4 2 3 2 42 0,4" in lines  # a 3c in a 7g.40gb: at 0 or 4


def test_the_mig_seed_names_the_declared_layout_only():
    base = state_of(spec(a100(mig_mode="enabled", mig_devices=[mig(1, "1g.5gb")])))
    elsewhere = state_of(spec(a100(mig_mode="enabled", numa_node=1, mig_devices=[mig(1, "1g.5gb")])))
    other = state_of(spec(a100(mig_mode="enabled", mig_devices=[mig(1, "1g.5gb"), mig(2, "1g.5gb")])))
    seeds = [[line for line in lines if line.startswith("mig_seed ")] for lines in (base, elsewhere, other)]
    assert seeds[0] == seeds[1] != seeds[2]


@pytest.mark.parametrize(
    ("gpu_data", "message"),
    [
        (
            a100(mig_mode="enabled", mig_devices=[mig(1, "1g.6gb")]),
            r"^Simulated-GPU spec lab\.yaml, GPU 0 \(GPU-00000001\): MIG device 0 has profile 1g\.6gb, "
            r"which an NVIDIA A100-SXM4-40GB "
            r"does not offer \(it offers 1g\.5gb, 1g\.5gb\+me, 1g\.10gb, 2g\.10gb, 3g\.20gb, 4g\.20gb, 7g\.40gb\)\.$",
        ),
        (
            a100(mig_mode="enabled", mig_devices=[mig(1, "3c.3g.20gb")]),
            r"MIG device 0 has profile 3c\.3g\.20gb, which an NVIDIA A100-SXM4-40GB does not offer",
        ),
        (
            a100(mig_mode="enabled", mig_devices=[mig(1, "4g.20gb"), mig(2, "1g.5gb"), mig(3, "4g.20gb")]),
            r"GPU 0 \(GPU-00000001\): MIG device 2 \(4g\.20gb\) does not fit on the NVIDIA A100-SXM4-40GB beside "
            r"the MIG devices listed before it\.$",
        ),
        (
            a100(mig_mode="enabled", mig_devices=[mig(1, "1g.5gb+me"), mig(2, "1g.5gb+me")]),
            r"MIG device 1 \(1g\.5gb\+me\) does not fit",
        ),
        (
            gpu(1, mig_mode="enabled", mig_devices=[mig(1, "1g.6gb")]),
            r"GPU 0 \(GPU-00000001\): the mock NVML library models MIG on NVIDIA A100 80GB PCIe, .*NVIDIA H200 only, "
            r"not on NVIDIA L4\.$",
        ),
    ],
    ids=["profile", "named-compute-instance", "full", "one-media-extension", "product"],
)
def test_a_declared_mig_layout_the_product_cannot_hold_is_one_sentence(gpu_data, message):
    with pytest.raises(SpecError, match=message):
        state_of(spec(gpu_data))


def test_a_kernel_module_of_another_version_is_a_driver_library_mismatch_in_the_mock_state():
    """kernel_module_version: the loaded module's version, where it is not the library's (driver_version); the mock
    library's state carries it only then, and its nvmlInit answers NVML_ERROR_LIB_RM_VERSION_MISMATCH."""
    same = parse_spec(spec(gpu(1), kernel_module_version="580.95.05"), "lab.yaml")
    assert "kernel_module_version" not in same
    assert "kernel_module_version" not in mock_nvml_state_text(same)
    other = parse_spec(spec(gpu(1), kernel_module_version="580.82.07"), "lab.yaml")
    assert other["kernel_module_version"] == "580.82.07"
    assert "\nkernel_module_version 580.82.07\n" in mock_nvml_state_text(other)
    with pytest.raises(SpecError, match=r"^Simulated-GPU spec lab.yaml: kernel_module_version must be a non-empty"):
        parse_spec(spec(gpu(1), kernel_module_version=580), "lab.yaml")


# -- NVSwitches and PCI device IDs (docs/simulated-gpus.md, docs/nvlink-fabric.md) ------------------------------


def test_gpu_pci_device_ids_and_nvswitches_are_read_in_lower_case():
    result = parse_spec(
        spec(
            gpu(1, pci_device_id="0x2330"),
            gpu(2),
            nvswitches=[
                {"pci_bus_id": "0000:C0:00.0", "device_id": "0x22A3", "numa_node": 1},
                {"pci_bus_id": "0000:c1:00.0", "device_id": "0x22a3"},
            ],
        ),
        "hgx.yaml",
    )
    assert [g["pci_device_id"] for g in result["gpus"]] == ["0x2330", None]
    assert result["nvswitches"] == [
        {"pci_bus_id": "0000:c0:00.0", "device_id": "0x22a3", "numa_node": 1},
        {"pci_bus_id": "0000:c1:00.0", "device_id": "0x22a3", "numa_node": None},
    ]


def test_an_empty_nvswitch_list_is_no_nvswitch():
    assert "nvswitches" not in parse_spec(spec(gpu(1), nvswitches=[]), "lab.yaml")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            spec(gpu(1, pci_device_id="2330")),
            'Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): pci_device_id must be a string "0xNNNN" (four hex '
            "digits), not '2330'.",
        ),
        (
            spec(gpu(1, pci_device_id=0x2330)),
            'Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): pci_device_id must be a string "0xNNNN" (four hex '
            "digits), not 9008.",
        ),
        (spec(gpu(1), nvswitches={}), "Simulated-GPU spec lab.yaml: nvswitches must be a list."),
        (
            spec(gpu(1), nvswitches=["0000:c0:00.0"]),
            "Simulated-GPU spec lab.yaml, NVSwitch 0: each entry of nvswitches must be a mapping.",
        ),
        (
            spec(gpu(1), nvswitches=[{"pci_bus_id": "0000:c0:00.0"}]),
            "Simulated-GPU spec lab.yaml, NVSwitch 0: the required key 'device_id' is missing.",
        ),
        (
            spec(gpu(1), nvswitches=[{"pci_bus_id": "0000:c0:00.0", "device_id": "0x22a3", "generation": 3}]),
            "Simulated-GPU spec lab.yaml, NVSwitch 0: unknown key 'generation'.",
        ),
        (
            spec(gpu(1), nvswitches=[{"pci_bus_id": "c0:00.0", "device_id": "0x22a3"}]),
            "Simulated-GPU spec lab.yaml, NVSwitch 0: pci_bus_id must be a string DDDD:BB:DD.F, not 'c0:00.0'.",
        ),
        (
            spec(gpu(1), nvswitches=[{"pci_bus_id": "0000:01:00.0", "device_id": "0x22a3"}]),
            "Simulated-GPU spec lab.yaml, NVSwitch 0: pci_bus_id 0000:01:00.0 is already used by GPU 0.",
        ),
        (
            spec(
                gpu(1),
                nvswitches=[
                    {"pci_bus_id": "0000:c0:00.0", "device_id": "0x22a3"},
                    {"pci_bus_id": "0000:C0:00.0", "device_id": "0x22a3"},
                ],
            ),
            "Simulated-GPU spec lab.yaml, NVSwitch 1: pci_bus_id 0000:c0:00.0 is already used by NVSwitch 0.",
        ),
        (
            spec(gpu(1), nvswitches=[{"pci_bus_id": "0000:c0:00.0", "device_id": "22a3"}]),
            'Simulated-GPU spec lab.yaml, NVSwitch 0: device_id must be a string "0xNNNN" (four hex digits), not '
            "'22a3'.",
        ),
        (
            spec(gpu(1), nvswitches=[{"pci_bus_id": "0000:c0:00.0", "device_id": "0x22a3", "numa_node": "1"}]),
            "Simulated-GPU spec lab.yaml, NVSwitch 0: numa_node must be an integer or null.",
        ),
    ],
)
def test_nvswitch_and_device_id_rule_violations(data, message):
    with pytest.raises(SpecError) as raised:
        parse_spec(data, "lab.yaml")
    assert str(raised.value) == message


# -- readings: what the mock NVML library answers (docs/simulated-gpus.md) ---------------------------------------


def test_readings_set_in_the_spec_reach_the_state_and_the_rest_stay_idle():
    busy = {"power_mw": 412000, "gpu_utilization_pct": 97, "memory_temperature_c": 83, "remap_failure": 1}
    busy.update(nvlink_tx_kib_per_s=250000, nvlink_rx_kib_per_s=150000)
    lines = state_of(spec(gpu(1, readings=busy), gpu(2)))
    first, second = lines.index("gpu 0"), lines.index("gpu 1")
    one, two = lines[first:second], lines[second:]
    assert "power_mw 412000 700000" in one and "utilization 97 0" in one and "memory_temperature_c 83" in one
    assert "remapped_rows 0 0 0 1" in one and "nvlink_kib_per_s 250000 150000" in one
    assert "power_mw 68000 700000" in two and "utilization 0 0" in two and "nvlink_kib_per_s 0 0" in two
    # No memory sensor unless the spec gives one: the library then answers not supported for the field.
    assert not [line for line in two if line.startswith("memory_temperature_c")]
    assert parse_spec(spec(gpu(1, readings={"energy_mj": 5})), "lab.yaml")["gpus"][0]["readings"] == dict(
        MOCK_NVML_READINGS, energy_mj=5
    )


@pytest.mark.parametrize(
    ("readings", "message"),
    [
        ([1], "readings must be a mapping"),
        ({"fan_pct": 1}, "readings has unknown key 'fan_pct'"),
        ({"power_mw": -1}, "readings.power_mw must be a non-negative integer"),
        ({"power_mw": True}, "readings.power_mw must be a non-negative integer"),
        ({"gpu_utilization_pct": 101}, "readings.gpu_utilization_pct is a percentage, at most 100"),
        ({"remap_pending": 2}, "readings.remap_pending must be 0 or 1"),
        (
            {"memory_used_mib": 23000, "memory_reserved_mib": 100},
            "readings.memory_used_mib and memory_reserved_mib together exceed memory_mib",
        ),
    ],
)
def test_bad_readings_are_one_sentence(readings, message):
    with pytest.raises(SpecError) as error:
        parse_spec(spec(gpu(1, readings=readings)), "lab.yaml")
    assert str(error.value) == f"Simulated-GPU spec lab.yaml, GPU 0 (GPU-00000001): {message}."
