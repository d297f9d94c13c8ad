"""The nvidia_driver role stops with one sentence, before it reads or installs anything, on a Grace Hopper node set to
the proprietary kernel modules and on IMEX peers that are not addresses. The role runs for real with
ansible-playbook against this machine (Debian 12), in check mode, given the PCI scan gpuops.k8s.nvidia_gpu_info
would return for real device IDs (nvidia_driver_gpu_info: the play's scan; this machine has no NVIDIA GPU)."""

from __future__ import annotations

from test_driver_branch import run_role


def scan(device_id, architecture, open_modules_branch, fabric=None):
    """The sysfs scan of a node with two GPU functions of DEVICE_ID."""
    return {
        "source": "sysfs",
        "nvswitch_devices": [],
        "nvlink_fabric": fabric or {"shape": "none", "services": []},
        "pci_devices": [
            {
                "bus_id": f"0009:{position + 1:02x}:00.0",
                "vendor_id": "0x10de",
                "device_id": device_id,
                "class": "0x030200",
                "numa_node": 0,
                "driver": None,
                "architecture": architecture,
                "open_modules_branch": open_modules_branch,
            }
            for position in range(2)
        ],
    }


def stops_before_the_read(tasks, task):
    names = [name for name, _result in tasks]
    assert names[-1] == task
    assert dict(tasks)["Check that the role supports this platform"].get("failed") is not True
    assert not any(name.startswith(("Read", "Install", "Configure", "Bring")) for name in names)
    return tasks[-1][1]["msg"]


def test_grace_hopper_with_the_proprietary_modules_stops_the_role(tmp_path):
    rc, tasks = run_role(
        tmp_path,
        nvidia_driver_gpu_info=scan("0x2342", "hopper", 535),
        nvidia_driver_branch="580",
        nvidia_driver_kernel_modules="proprietary",
    )
    assert rc != 0
    assert stops_before_the_read(tasks, "Check that the kernel modules can drive the node's Grace Hopper GPUs") == (
        "localhost has Grace Hopper GPUs (0009:01:00.0, 0009:02:00.0), which run only the open kernel modules: set"
        " nvidia_driver_kernel_modules to open or auto."
    )


def test_imex_peers_that_are_not_addresses_stop_the_role(tmp_path):
    rc, tasks = run_role(
        tmp_path,
        nvidia_driver_gpu_info=scan("0x2941", "blackwell", 570, {"shape": "nvlink5-rack", "services": ["imex"]}),
        nvidia_driver_source="cuda",
        nvidia_driver_imex_peers=["10.114.0.11", "tray-02"],
    )
    assert rc != 0
    assert stops_before_the_read(tasks, "Check IMEX's peers") == (
        'nvidia_driver_imex_peers has "tray-02", which is not an IPv4 or IPv6 address: give each compute tray of the'
        " NVLink domain by its address, one address an entry."
    )
