"""The NVLink fabric a node is part of, from its PCI devices (plugins/module_utils/_nvlink_fabric.py)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils import _nvlink_fabric as nf


@pytest.mark.parametrize(
    ("device_id", "generation"),
    [
        ("0x1af1", 2),  # GA100 [A100 NVSwitch], PCI ID database
        ("0x1ae8", 2),
        ("0x22a3", 3),  # GH100 [H100 NVSwitch], PCI ID database
        ("0x22AF", 3),
        ("22a0", 3),
        ("0x22b0", None),
        ("0x2330", None),  # a GPU, not a switch
        (None, None),
        ("nvswitch", None),
    ],
)
def test_nvswitch_generation_from_the_device_id(device_id, generation):
    assert nf.nvswitch_generation(device_id) == generation


def gpus(device_id, count):
    return [{"bus_id": f"0000:{i:02x}:00.0", "device_id": device_id} for i in range(count)]


SWITCHES = [{"bus_id": "0000:c0:00.0", "device_id": "0x22a3"}] * 4


@pytest.mark.parametrize(
    ("pci_devices", "nvswitch_devices", "shape", "services"),
    [
        ([], [], "none", []),
        (gpus("0x27b8", 2), [], "none", []),  # L4
        (gpus("0x2331", 1), [], "none", []),  # H100 PCIe
        (gpus("0x20b0", 8), SWITCHES, "nvswitch", ["fabricmanager"]),  # HGX A100
        (gpus("0x2330", 8), SWITCHES, "nvswitch", ["fabricmanager"]),  # HGX H100
        (gpus("0x2335", 8), SWITCHES, "nvswitch", ["fabricmanager"]),  # HGX H200
        (gpus("0x2901", 8), [], "nvlink5-hgx", ["nvlsm", "fabricmanager"]),  # HGX B200
        (gpus("0x2909", 8), [], "nvlink5-hgx", ["nvlsm", "fabricmanager"]),
        (gpus("0x3182", 8), [], "nvlink5-hgx", ["nvlsm", "fabricmanager"]),  # HGX B300
        (gpus("0x2941", 4), [], "nvlink5-rack", ["imex"]),  # GB200
        (gpus("0x31c2", 4), [], "nvlink5-rack", ["imex"]),  # GB300
        # A rack's node never runs Fabric Manager, whatever else the bus holds.
        (gpus("0x2941", 4), SWITCHES, "nvlink5-rack", ["imex"]),
        (gpus("0x2901", 8), SWITCHES, "nvlink5-hgx", ["nvlsm", "fabricmanager"]),
        (gpus(None, 2), [], "none", []),
    ],
)
def test_the_fabric_and_its_services(pci_devices, nvswitch_devices, shape, services):
    assert nf.nvlink_fabric(pci_devices, nvswitch_devices) == {"shape": shape, "services": services}


def test_every_shape_names_known_services_in_their_order():
    for services in nf.SHAPE_SERVICES.values():
        assert list(services) == [s for s in nf.SERVICES if s in services]


def test_with_generation_adds_the_key_and_keeps_the_rest():
    devices = [{"bus_id": "0000:c0:00.0", "device_id": "0x22a3", "driver": "nvidia-nvswitch"}]
    assert nf.with_generation(devices) == [dict(devices[0], generation=3)]
    assert "generation" not in devices[0]
