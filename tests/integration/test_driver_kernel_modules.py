"""The nvidia_driver role stops, before it reads or installs anything, where no kernel module flavour drives the
node's GPUs, and passes this machine's platform (Debian 12) through its platform check. The role runs for real with
ansible-playbook against this machine, in check mode, given the PCI scan gpuops.k8s.nvidia_gpu_info would return
for real device IDs (nvidia_driver_gpu_info: the play's scan; this machine has no NVIDIA GPU)."""

from __future__ import annotations

import pytest
from test_driver_branch import run_role


def scan(*devices):
    """The sysfs scan of a node with these (device ID, architecture) GPU functions."""
    return {
        "source": "sysfs",
        "nvswitch_devices": [],
        "pci_devices": [
            {
                "bus_id": f"0000:{0x18 + 0x11 * position:02x}:00.0",
                "vendor_id": "0x10de",
                "device_id": device_id,
                "class": "0x030200",
                "numa_node": 0,
                "driver": None,
                "architecture": architecture,
            }
            for position, (device_id, architecture) in enumerate(devices)
        ],
    }


@pytest.mark.parametrize(
    ("devices", "settings", "message"),
    [
        (
            [("0x2901", "blackwell")],
            {"nvidia_driver_branch": "560"},
            "localhost has Blackwell GPUs (0000:18:00.0), which driver branch 560 does not support: set"
            " nvidia_driver_branch to 570 or later (the cuda source, nvidia_driver_source=cuda, has them).",
        ),
        (
            [("0x15f8", "pascal"), ("0x1db4", "volta")],
            {"nvidia_driver_branch": "580", "nvidia_driver_kernel_modules": "open"},
            "localhost has GPUs older than Turing (pascal at 0000:18:00.0, volta at 0000:29:00.0), which the open"
            " kernel modules cannot drive: set nvidia_driver_kernel_modules to proprietary or auto.",
        ),
    ],
)
def test_gpus_no_flavour_drives_stop_the_role_before_the_read(tmp_path, devices, settings, message):
    rc, tasks = run_role(tmp_path, nvidia_driver_gpu_info=scan(*devices), **settings)
    assert rc != 0
    names = [name for name, _result in tasks]
    assert names[-1] == "Check that the kernel modules can drive the node's GPUs"
    assert tasks[-1][1]["msg"] == message
    assert dict(tasks)["Check that the role supports this platform"].get("failed") is not True
    assert not any(name.startswith(("Read", "Install", "Configure", "Bring")) for name in names)
