"""Builds a sysfs-shaped tree of PCI devices under a test's tmp_path.

The layout follows Linux: the device directories live under devices/pci0000:00/, bus/pci/devices/ holds
relative symlinks to them, and a bound device's ``driver`` is a symlink into bus/pci/drivers/.
"""

from __future__ import annotations

import os


def add_pci_device(root, bus_id, vendor, device, pci_class, numa_node=None, driver=None):
    """Add one PCI function; numa_node None leaves the numa_node file out, as some kernels do."""
    real_dir = os.path.join(root, "devices", "pci0000:00", bus_id)
    os.makedirs(real_dir)
    attributes = {"vendor": vendor, "device": device, "class": pci_class}
    if numa_node is not None:
        attributes["numa_node"] = str(numa_node)
    for name, value in attributes.items():
        with open(os.path.join(real_dir, name), "w") as handle:
            handle.write(value + "\n")
    links_dir = os.path.join(root, "bus", "pci", "devices")
    os.makedirs(links_dir, exist_ok=True)
    os.symlink(os.path.join("..", "..", "..", "devices", "pci0000:00", bus_id), os.path.join(links_dir, bus_id))
    if driver is not None:
        drivers_dir = os.path.join(root, "bus", "pci", "drivers", driver)
        os.makedirs(drivers_dir, exist_ok=True)
        os.symlink(
            os.path.join("..", "..", "..", "bus", "pci", "drivers", driver),
            os.path.join(real_dir, "driver"),
        )
    return real_dir


def nvidia_host(root):
    """A host with two NVIDIA GPUs (one bound to nvidia), an NVSwitch, and functions that are not GPUs."""
    root = str(root)
    add_pci_device(root, "0000:18:00.0", "0x10de", "0x2330", "0x030200", numa_node=0, driver="nvidia")
    add_pci_device(root, "0000:2a:00.0", "0x10de", "0x2330", "0x030200", numa_node=1, driver="nvidia")
    add_pci_device(root, "0000:3b:00.0", "0x10de", "0x1eb8", "0x030000", numa_node=-1)
    add_pci_device(root, "0000:3b:00.1", "0x10de", "0x10f8", "0x040300", numa_node=-1, driver="snd_hda_intel")
    add_pci_device(root, "0000:c0:00.0", "0x10de", "0x22a3", "0x068000", numa_node=1, driver="nvidia-nvswitch")
    add_pci_device(root, "0000:00:02.0", "0x8086", "0x4680", "0x030000", numa_node=0, driver="i915")
    add_pci_device(root, "0000:00:1f.0", "0x8086", "0x7a06", "0x060100")
    return root


NVIDIA_HOST_GPUS = [
    {
        "bus_id": "0000:18:00.0",
        "vendor_id": "0x10de",
        "device_id": "0x2330",
        "class": "0x030200",
        "numa_node": 0,
        "driver": "nvidia",
    },
    {
        "bus_id": "0000:2a:00.0",
        "vendor_id": "0x10de",
        "device_id": "0x2330",
        "class": "0x030200",
        "numa_node": 1,
        "driver": "nvidia",
    },
    {
        "bus_id": "0000:3b:00.0",
        "vendor_id": "0x10de",
        "device_id": "0x1eb8",
        "class": "0x030000",
        "numa_node": None,
        "driver": None,
    },
]

NVIDIA_HOST_NVSWITCHES = [
    {
        "bus_id": "0000:c0:00.0",
        "vendor_id": "0x10de",
        "device_id": "0x22a3",
        "class": "0x068000",
        "numa_node": 1,
        "driver": "nvidia-nvswitch",
    },
]
