"""The device_plugin role under NVIDIA's DRA driver name: the DeviceClasses it keeps, and how it sees a DRA node whose
driver is to change its name (the record it writes beside the allocation record)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.tests.unit.roles.test_device_plugin_fault_settings import RoleVars

RECORD = "/var/lib/gpuops/dra-driver-name"
ALLOCATION = "/var/lib/gpuops/allocation-mode"


def role(**inventory):
    return RoleVars(**inventory)


def test_our_name_keeps_one_class_for_whole_gpus():
    values = role(device_plugin_allocation_mode="dra")
    assert values.get("__device_plugin_dra_classes") == [
        {"name": "gpu.gpuops.k8s", "type": "gpu", "extended": "nvidia.com/gpu"}
    ]
    assert values.get("__device_plugin_nvidia_names") is False


def test_nvidia_s_name_keeps_nvidia_s_two_classes_whatever_the_class_name_says():
    values = role(
        device_plugin_allocation_mode="dra",
        device_plugin_dra_driver_name="gpu.nvidia.com",
        device_plugin_dra_device_class_name="my-gpus",
    )
    assert values.get("__device_plugin_dra_classes") == [
        {"name": "gpu.nvidia.com", "type": "gpu", "extended": "nvidia.com/gpu"},
        {"name": "mig.nvidia.com", "type": "mig", "extended": ""},
    ]
    # The selector NVIDIA's chart gives its class of whole GPUs.
    assert values.get("__device_plugin_dra_class_selector") == (
        'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"'
    )


def test_the_mig_class_selects_mig_devices():
    values = RoleVars(
        device_plugin_allocation_mode="dra",
        device_plugin_dra_driver_name="gpu.nvidia.com",
        __device_plugin_class_type="mig",
    )
    assert values.get("__device_plugin_dra_class_selector") == (
        'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"'
    )


def probe(allocation, record):
    return {"contents": {ALLOCATION: allocation, RECORD: record}}


@pytest.mark.parametrize(
    ("allocation", "record", "wanted_mode", "renamed_from"),
    [
        # A DRA node whose record names another driver: it is renamed.
        ("dra\n", "gpu.gpuops.k8s\n", "dra", "gpu.gpuops.k8s"),
        # Converged: the record names the wanted one.
        ("dra\n", "gpu.nvidia.com\n", "dra", ""),
        # No record (an earlier release converged it): it runs under the name wanted.
        ("dra\n", None, "dra", ""),
        # Not in dra mode now (device plugin, or no allocation record): nothing of an old driver to leave.
        ("device_plugin\n", "gpu.gpuops.k8s\n", "dra", ""),
        (None, "gpu.gpuops.k8s\n", "dra", ""),
        # Not to be a DRA node: the allocation switch takes it out of dra, not a rename.
        ("dra\n", "gpu.gpuops.k8s\n", "device_plugin", ""),
    ],
)
def test_a_rename_is_seen_only_on_a_dra_node_staying_in_dra_under_another_name(
    allocation, record, wanted_mode, renamed_from
):
    values = role(
        device_plugin_allocation_mode=wanted_mode,
        device_plugin_dra_driver_name="gpu.nvidia.com",
        device_plugin_state_dir="/var/lib/gpuops",
        __device_plugin_probe=probe(allocation, record),
    )
    assert values.get("__device_plugin_dra_renamed_from") == renamed_from


@pytest.mark.parametrize(("record", "now"), [("gpu.nvidia.com\n", "gpu.nvidia.com"), (None, "gpu.gpuops.k8s")])
def test_the_slices_a_move_to_the_device_plugin_deletes_are_those_of_the_name_the_node_runs_under(record, now):
    values = role(
        device_plugin_allocation_mode="device_plugin",
        device_plugin_state_dir="/var/lib/gpuops",
        __device_plugin_probe=probe("dra\n", record),
    )
    assert values.get("__device_plugin_dra_driver_now") == now
