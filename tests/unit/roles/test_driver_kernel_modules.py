# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Open or proprietary kernel modules by the node's GPUs (roles/nvidia_driver/vars/main.yml: __nvidia_driver_open and
__nvidia_driver_modules_refusal), for real PCI device IDs x driver branches x nvidia_driver_kernel_modules.

The role's real vars are rendered with Ansible's templar (test_node_package_selection.RoleVars), given the PCI scan
gpuops.k8s.nvidia_gpu_info returns: each device's architecture is the module's own classification of its device ID.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_generations import gpu_family, open_modules_branch
from ansible_collections.gpuops.k8s.tests.unit.roles.test_node_package_selection import RoleVars

TASKS = Path(__file__).resolve().parents[3] / "roles" / "nvidia_driver" / "tasks" / "main.yml"
HOST = "gpu-node-1"

# Real PCI device IDs (PCI ID database; NVIDIA's open-gpu-kernel-modules README for Turing and later).
P100 = "0x15f8"
V100 = "0x1db4"
T4 = "0x1eb8"
A100 = "0x20b0"
L4 = "0x27b8"
H100 = "0x2330"
B200 = "0x2901"
UNKNOWN = "0x3000"  # GR100, reserved: in no block of the table

OPEN = "open"
PROPRIETARY = "proprietary"
BRANCHES = ("535", "560", "570", "580")
# Per device, per setting: what each branch of BRANCHES gets, a module flavour or a refusal (its words).
OLDER_THAN_TURING = "older than Turing"
BLACKWELL_ONLY_OPEN = "run only the open kernel modules: set nvidia_driver_kernel_modules to open or auto"
BLACKWELL_BRANCH = "does not support: set nvidia_driver_branch to 570 or later"
EXPECTED = {
    "pre-turing": {
        "auto": (PROPRIETARY, PROPRIETARY, PROPRIETARY, PROPRIETARY),
        "open": (OLDER_THAN_TURING,) * 4,
        "proprietary": (PROPRIETARY, PROPRIETARY, PROPRIETARY, PROPRIETARY),
    },
    "turing-to-hopper": {
        "auto": (PROPRIETARY, OPEN, OPEN, OPEN),
        "open": (OPEN, OPEN, OPEN, OPEN),
        "proprietary": (PROPRIETARY, PROPRIETARY, PROPRIETARY, PROPRIETARY),
    },
    "blackwell": {
        "auto": (BLACKWELL_BRANCH, BLACKWELL_BRANCH, OPEN, OPEN),
        "open": (BLACKWELL_BRANCH, BLACKWELL_BRANCH, OPEN, OPEN),
        "proprietary": (BLACKWELL_ONLY_OPEN,) * 4,
    },
}
DEVICES = {
    P100: "pre-turing",
    V100: "pre-turing",
    T4: "turing-to-hopper",
    A100: "turing-to-hopper",
    L4: "turing-to-hopper",
    H100: "turing-to-hopper",
    B200: "blackwell",
}
CASES = [
    pytest.param(device, branch, setting, EXPECTED[group][setting][position], id=f"{device}-{branch}-{setting}")
    for device, group in DEVICES.items()
    for setting in ("auto", "open", "proprietary")
    for position, branch in enumerate(BRANCHES)
]


def scan(*device_ids: str) -> dict:
    """What gpuops.k8s.nvidia_gpu_info returns for a node whose PCI bus holds these GPU functions."""
    devices = [
        {
            "bus_id": f"0000:{0x18 + 0x11 * position:02x}:00.0",
            "vendor_id": "0x10de",
            "device_id": device_id,
            "class": "0x030200",
            "numa_node": 0,
            "driver": None,
            "architecture": gpu_family(device_id),
            "open_modules_branch": open_modules_branch(device_id),
        }
        for position, device_id in enumerate(device_ids)
    ]
    return {"source": "sysfs", "pci_devices": devices, "nvswitch_devices": []}


def role(*device_ids: str, platform: str = "ubuntu2404", **inventory) -> RoleVars:
    return RoleVars(
        "nvidia_driver", platform, inventory_hostname=HOST, nvidia_driver_gpu_info=scan(*device_ids), **inventory
    )


@pytest.mark.parametrize(("device", "branch", "setting", "expected"), CASES)
def test_kernel_modules_by_gpu_branch_and_setting(device, branch, setting, expected):
    decided = role(device, nvidia_driver_branch=branch, nvidia_driver_kernel_modules=setting)
    refusal = decided.get("__nvidia_driver_modules_refusal")
    if expected in (OPEN, PROPRIETARY):
        assert refusal == ""
        assert decided.get("__nvidia_driver_open") is (expected == OPEN)
        flavour = "-open" if expected == OPEN else ""
        # Canonical's name for the driver the packages are chosen by (nvidia-headless-no-dkms-<flavour>, ...).
        assert decided.get("__nvidia_driver_ubuntu_flavour") == f"{branch}-server{flavour}"
    else:
        assert expected in refusal
        assert refusal.startswith(HOST + " has ")
        assert "0000:18:00.0" in refusal


def test_refusals_name_the_gpus_and_are_one_sentence():
    older = role(P100, V100, nvidia_driver_branch="580", nvidia_driver_kernel_modules="open")
    assert older.get("__nvidia_driver_modules_refusal") == (
        "gpu-node-1 has GPUs older than Turing (pascal at 0000:18:00.0, volta at 0000:29:00.0), which the open kernel"
        " modules cannot drive: set nvidia_driver_kernel_modules to proprietary or auto."
    )
    blackwell = role(B200, B200, nvidia_driver_branch="560")
    assert blackwell.get("__nvidia_driver_modules_refusal") == (
        "gpu-node-1 has Blackwell GPUs (0000:18:00.0, 0000:29:00.0), which driver branch 560 does not support: set"
        " nvidia_driver_branch to 570 or later (the cuda source, nvidia_driver_source=cuda, has them)."
    )


@pytest.mark.parametrize("setting", ["auto", "open", "proprietary"])
@pytest.mark.parametrize("older", [P100, V100])
def test_blackwell_beside_pascal_or_volta_is_refused_whatever_the_setting(setting, older):
    refusal = role(B200, older, nvidia_driver_branch="580", nvidia_driver_kernel_modules=setting).get(
        "__nvidia_driver_modules_refusal"
    )
    assert refusal.startswith("gpu-node-1 has Blackwell GPUs (0000:18:00.0), which run only the open kernel modules,")
    assert f"older GPUs ({gpu_family(older)} at 0000:29:00.0)" in refusal
    assert refusal.endswith("put them in separate nodes.")


@pytest.mark.parametrize(("devices", "open_modules"), [((T4, P100), False), ((H100, B200), True), ((A100, L4), True)])
def test_mixed_nodes_under_auto(devices, open_modules):
    decided = role(*devices, nvidia_driver_branch="580")
    assert decided.get("__nvidia_driver_modules_refusal") == ""
    assert decided.get("__nvidia_driver_open") is open_modules


@pytest.mark.parametrize(
    ("devices", "branch", "open_modules"), [((UNKNOWN,), "550", False), ((UNKNOWN, T4), "580", True)]
)
def test_unknown_device_ids_leave_the_choice_to_the_branch(devices, branch, open_modules):
    decided = role(*devices, nvidia_driver_branch=branch)
    assert decided.get("__nvidia_driver_modules_refusal") == ""
    assert decided.get("__nvidia_driver_open") is open_modules
    assert decided.get("__nvidia_driver_gpus_undefined") == [["0000:18:00.0", "undefined"]]


@pytest.mark.parametrize(("branch", "open_modules"), [("535", False), ("580", True)])
def test_without_gpus_the_branch_decides_as_before(branch, open_modules):
    """nvidia_driver_install_without_gpu on a node with no NVIDIA PCI device, and a scan without architectures."""
    for decided in (
        role(nvidia_driver_branch=branch, nvidia_driver_install_without_gpu=True),
        RoleVars("nvidia_driver", "ubuntu2404", nvidia_driver_branch=branch),
        RoleVars(
            "nvidia_driver",
            "ubuntu2404",
            nvidia_driver_branch=branch,
            nvidia_driver_gpu_info={
                "source": "sysfs",
                "pci_devices": [{"bus_id": "0000:18:00.0"}],
                "nvswitch_devices": [],
            },
        ),
    ):
        assert decided.get("__nvidia_driver_modules_refusal") == ""
        assert decided.get("__nvidia_driver_open") is open_modules


def test_simulated_gpus_decide_by_the_real_bus():
    """With simulate_from, the role reads the real PCI bus the module returns beside the simulated GPUs."""
    simulated = scan(P100)
    simulated.update(source="simulated", host_pci={"pci_devices": scan(B200)["pci_devices"], "nvswitch_devices": []})
    decided = RoleVars(
        "nvidia_driver",
        "ubuntu2404",
        inventory_hostname=HOST,
        nvidia_driver_gpu_info=simulated,
        nvidia_driver_branch="580",
    )
    assert decided.get("__nvidia_driver_modules_refusal") == ""
    assert decided.get("__nvidia_driver_open") is True


def test_the_refusal_comes_before_anything_is_installed():
    names = [task["name"] for task in yaml.safe_load(TASKS.read_text())]
    refusal = names.index("Check that the kernel modules can drive the node's GPUs")
    assert refusal < names.index(
        "Read the environment, the package sources, the packages, the daemons and the loaded modules"
    )
    assert refusal < names.index("Bring the node to the wanted driver, sources, blacklist, daemons and loaded module")
    assert refusal > names.index("Look for NVIDIA PCI devices")


# Grace Hopper (GH200): Hopper GPUs that run only the open kernel modules, 0x2342 from branch 535 and 0x2348 from 565
# (the open modules' README lists them from 535.43.19 and 565.57.01; docs/gpu-generations.md).
GH200 = "0x2342"
GH200_144G = "0x2348"


@pytest.mark.parametrize(
    ("device", "branch", "setting", "expected"),
    [
        (GH200, "535", "auto", OPEN),
        (GH200, "580", "auto", OPEN),
        (GH200, "535", "open", OPEN),
        (GH200_144G, "570", "auto", OPEN),
        (GH200_144G, "580", "open", OPEN),
        (
            GH200,
            "580",
            "proprietary",
            "run only the open kernel modules: set nvidia_driver_kernel_modules to open or auto",
        ),
        (GH200_144G, "535", "proprietary", "set nvidia_driver_kernel_modules to open or auto"),
        (GH200_144G, "535", "auto", "driver branch 535 does not have: set nvidia_driver_branch to 565 or later"),
        (GH200_144G, "560", "open", "driver branch 560 does not have: set nvidia_driver_branch to 565 or later"),
    ],
)
def test_grace_hopper_runs_only_the_open_modules(device, branch, setting, expected):
    decided = role(device, nvidia_driver_branch=branch, nvidia_driver_kernel_modules=setting)
    assert decided.get("__nvidia_driver_modules_refusal") == ""
    refusal = decided.get("__nvidia_driver_grace_hopper_refusal")
    if expected == OPEN:
        assert refusal == ""
        assert decided.get("__nvidia_driver_open") is True
        assert decided.get("__nvidia_driver_ubuntu_flavour") == f"{branch}-server-open"
    else:
        assert expected in refusal
        assert refusal.startswith(HOST + " has Grace Hopper GPUs (0000:18:00.0)")


def test_grace_hopper_refusals_are_one_sentence():
    proprietary = role(GH200, GH200, nvidia_driver_branch="580", nvidia_driver_kernel_modules="proprietary")
    assert proprietary.get("__nvidia_driver_grace_hopper_refusal") == (
        "gpu-node-1 has Grace Hopper GPUs (0000:18:00.0, 0000:29:00.0), which run only the open kernel modules: set"
        " nvidia_driver_kernel_modules to open or auto."
    )
    older = role(GH200, GH200_144G, nvidia_driver_branch="550")
    assert older.get("__nvidia_driver_grace_hopper_refusal") == (
        "gpu-node-1 has Grace Hopper GPUs (0000:18:00.0, 0000:29:00.0), whose open kernel modules driver branch 550"
        " does not have: set nvidia_driver_branch to 565 or later."
    )
    beside = role(GH200, V100, nvidia_driver_branch="580")
    assert beside.get("__nvidia_driver_grace_hopper_refusal") == (
        "gpu-node-1 has Grace Hopper GPUs (0000:18:00.0), which run only the open kernel modules, beside older GPUs"
        " (volta at 0000:29:00.0), which cannot run them: no driver drives both, so put them in separate nodes."
    )


def test_other_hopper_gpus_still_go_by_the_branch():
    decided = role(H100, nvidia_driver_branch="535")
    assert decided.get("__nvidia_driver_gpus_grace_hopper") == []
    assert decided.get("__nvidia_driver_grace_hopper_refusal") == ""
    assert decided.get("__nvidia_driver_open") is False


def test_a_scan_without_open_modules_branch_keeps_the_branch_rule():
    """A scan of another collection version has no open_modules_branch: GH200 is a Hopper GPU there, as before."""
    older = scan(GH200)
    for device in older["pci_devices"]:
        del device["open_modules_branch"]
    decided = RoleVars(
        "nvidia_driver", "ubuntu2404", inventory_hostname=HOST, nvidia_driver_gpu_info=older, nvidia_driver_branch="535"
    )
    assert decided.get("__nvidia_driver_grace_hopper_refusal") == ""
    assert decided.get("__nvidia_driver_open") is False


def test_the_grace_hopper_refusal_comes_before_anything_is_installed():
    names = [task["name"] for task in yaml.safe_load(TASKS.read_text())]
    refusal = names.index("Check that the kernel modules can drive the node's Grace Hopper GPUs")
    assert names.index("Look for NVIDIA PCI devices") < refusal
    assert refusal < names.index(
        "Read the environment, the package sources, the packages, the daemons and the loaded modules"
    )
