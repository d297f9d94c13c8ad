# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the nvidia_driver role decides on RHEL / Rocky 9 from its one read (vars/main.yml: __nvidia_driver_todo and the
DNF module stream facts), for reads a Rocky 9 node with a GPU could return: converged, and each drift of the stream,
the packages and the CUDA repository's record. The role's real vars files are rendered with Ansible's templar
(test_node_package_selection.RoleVars), given a gpuops.k8s.node_state result built here. Molecule's rhel scenario runs
the role with real dnf; this covers the decisions on a node with a GPU and a loaded module, which a container is not.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import init_plugin_loader
from ansible_collections.gpuops.k8s.tests.unit.roles.test_node_package_selection import KERNEL, RoleVars

# The record's key reads cuda_repository's files with the file and fileglob lookups.
init_plugin_loader()

ROLES = Path(__file__).resolve().parents[3] / "roles"
GPU_SCAN = {"source": "sysfs", "pci_devices": [{"bus_id": "0000:18:00.0"}], "nvswitch_devices": []}
ABSENT = {"type": "absent"}
DIRECTORY = {"type": "directory", "mode": "0755", "owner": "root", "group": "root"}
MODULE_FILE = "/etc/dnf/modules.d/nvidia-driver.module"
BLACKLIST = "/etc/modprobe.d/gpuops-blacklist-nouveau.conf"
OPTIONS = "/etc/modprobe.d/gpuops-nouveau-options.conf"
PERSISTENCED = "/lib/systemd/system/nvidia-persistenced.service"
LOADED_VERSION = "/sys/module/nvidia/version"


def module_record(stream: str, state: str = "enabled") -> str:
    """/etc/dnf/modules.d/nvidia-driver.module as DNF 4 writes it."""
    return f"[nvidia-driver]\nname=nvidia-driver\nstream={stream}\nprofiles=default\nstate={state}\n"


def written(text: str) -> dict:
    return {
        "type": "file",
        "mode": "0644",
        "owner": "root",
        "group": "root",
        "checksum": hashlib.sha1(text.encode()).hexdigest(),
    }


def role(node: dict | None = None, **inventory) -> RoleVars:
    extra = {} if node is None else {"__nvidia_driver_node": node}
    # RHEL has no pynvml package and pip is asked on every run (__nvidia_driver_todo.pynvml): left out here.
    inventory.setdefault("nvidia_driver_pynvml", False)
    return RoleVars(
        "nvidia_driver",
        "rocky9",
        nvidia_driver_gpu_info=GPU_SCAN,
        inventory_hostname="gpu-1",
        role_path=str(ROLES / "nvidia_driver"),
        **extra,
        **inventory,
    )


def converged(**inventory) -> dict:
    """What node_state reads on a Rocky 9 machine with a GPU where the role converged on branch 580 (open modules):
    the stream enabled, its profile installed from it (rpm's VERSION-RELEASE), the module loaded, the CUDA
    repository's files as recorded, the role's files as it writes them."""
    wanted = role(**inventory)
    paths = {path: ABSENT for path in wanted.get("__nvidia_driver_read_paths")}
    paths.update(
        {
            f"/lib/modules/{KERNEL}/kernel": DIRECTORY,
            "/sys/module/nvidia": DIRECTORY,
            BLACKLIST: written("blacklist nouveau\nblacklist lbm-nouveau\n"),
            OPTIONS: written(wanted.get("__nvidia_driver_nouveau_options")),
            PERSISTENCED: written("[Unit]\n"),
        }
    )
    packages = {name: {"version": None, "held": None} for name in wanted.get("__nvidia_driver_read_packages")}
    for name in ["nvidia-driver", "kmod-nvidia-open-dkms", "nvidia-persistenced"]:
        packages[name] = {"version": "580.105.08-1.el9", "held": None}
    packages["dkms"] = {"version": "3.2.1-1.el9", "held": None}
    packages[f"kernel-devel-{KERNEL}"] = {"version": "5.14.0-570.el9", "held": None}
    packages["kernel-devel-matched"] = {"version": "5.14.0-570.el9", "held": None}
    return {
        "changed": False,
        "paths": paths,
        "contents": {
            "/proc/1/cgroup": "0::/init.scope\n",
            "/run/systemd/container": None,
            BLACKLIST: "blacklist nouveau\nblacklist lbm-nouveau\n",
            LOADED_VERSION: "580.105.08\n",
            MODULE_FILE: module_record("580-open"),
        },
        "packages": packages,
        "units": {
            "nvidia-persistenced.service": {
                "load_state": "loaded",
                "active_state": "active",
                "unit_file_state": "enabled",
            }
        },
        "systemd": True,
        "commands": {"mokutil": None},
        "record": {"current": True, "differs": [], "key": wanted.get("__nvidia_driver_cuda_repository_record_key")},
    }


def drifted(change, **inventory) -> dict:
    node = copy.deepcopy(converged(**inventory))
    change(node)
    return node


def todo(node: dict, **inventory) -> set[str]:
    return {name for name, due in role(node, **inventory).get("__nvidia_driver_todo").items() if due}


def test_the_read_asks_for_dnfs_record_of_the_stream_and_the_profiles_packages():
    wanted = role()
    assert MODULE_FILE in wanted.get("__nvidia_driver_read_contents")
    assert {"nvidia-driver", "kmod-nvidia-open-dkms", "nvidia-persistenced", "dkms"} <= set(
        wanted.get("__nvidia_driver_read_packages")
    )
    assert wanted.get("__nvidia_driver_cuda_repository_files") == [
        "/etc/yum.repos.d/cuda-rhel9-x86_64.repo",
        "/etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-cuda",
    ]


def test_a_converged_rocky_node_has_nothing_to_do():
    node = converged()
    assert todo(node) == set()
    assert role(node).get("__nvidia_driver_dnf_stream_enabled") == "580-open"
    assert role(node).get("__nvidia_driver_dnf_stream_switch") is False


@pytest.mark.parametrize(
    ("what", "change", "steps", "switch"),
    [
        ("another branch's stream enabled", lambda n: n["contents"].update({MODULE_FILE: module_record("570-open")}),
         {"install"}, True),
        ("the proprietary flavour's stream enabled",
         lambda n: n["contents"].update({MODULE_FILE: module_record("580-dkms")}), {"install"}, True),
        ("the module reset", lambda n: n["contents"].update({MODULE_FILE: module_record("", state="")}), {"install"},
         False),
        ("the module disabled", lambda n: n["contents"].update({MODULE_FILE: module_record("580-open", "disabled")}),
         {"install"}, False),
        ("no record of the module", lambda n: n["contents"].update({MODULE_FILE: None}), {"install"}, False),
        ("the kernel module package removed", lambda n: n["packages"]["kmod-nvidia-open-dkms"].update(version=None),
         {"install"}, False),
        ("the daemon's package removed", lambda n: n["packages"]["nvidia-persistenced"].update(version=None),
         {"install"}, False),
        ("another branch's driver under the stream",
         lambda n: n["packages"]["nvidia-driver"].update(version="570.195.03-1.el9"), {"install", "module"}, False),
        ("the CUDA repository's file edited", lambda n: n["record"].update(current=False), {"cuda_repository"}, False),
        ("the headers removed", lambda n: n["packages"][f"kernel-devel-{KERNEL}"].update(version=None), {"index"},
         False),
        ("the headers metapackage removed", lambda n: n["packages"]["kernel-devel-matched"].update(version=None),
         {"headers"}, False),
    ],
)  # fmt: skip
def test_each_drift_is_the_step_that_repairs_it(what, change, steps, switch):
    node = drifted(change)
    assert todo(node) == steps, what
    assert role(node).get("__nvidia_driver_dnf_stream_switch") is switch, what


def test_spaces_around_the_records_equals_signs_are_read():
    node = drifted(
        lambda n: n["contents"].update({MODULE_FILE: "[nvidia-driver]\nstream = 580-open\nstate = enabled\n"})
    )
    assert todo(node) == set()


@pytest.mark.parametrize(
    ("inventory", "stream"),
    [
        ({"nvidia_driver_branch": "570"}, "570-open"),
        ({"nvidia_driver_kernel_modules": "proprietary"}, "580-dkms"),
        ({"nvidia_driver_branch": "570", "nvidia_driver_kernel_modules": "proprietary"}, "570-dkms"),
    ],
)
def test_another_branch_or_flavour_switches_the_enabled_stream_and_drains_first(inventory, stream):
    """The read's stream is not the wanted one: the stream is switched (install-dnf.yml), and with the module loaded
    and nvidia_driver_reboot the node is drained first without asking dnf's preview, which cannot install a profile
    of another stream while one is enabled."""
    decided = role(converged(), nvidia_driver_reboot=True, **inventory)
    assert decided.get("__nvidia_driver_dnf_stream_wanted") == stream
    assert decided.get("__nvidia_driver_dnf_stream_switch") is True
    assert decided.get("__nvidia_driver_todo")["install"] is True
    assert decided.get("__nvidia_driver_drain_before_install") is True


def test_a_node_without_an_enabled_stream_is_installed_not_switched():
    node = drifted(lambda n: n["contents"].update({MODULE_FILE: None}))
    decided = role(node, nvidia_driver_branch="570")
    assert decided.get("__nvidia_driver_todo")["install"] is True
    assert decided.get("__nvidia_driver_dnf_stream_switch") is False


def tasks(name: str) -> list[dict]:
    return yaml.safe_load((ROLES / "nvidia_driver" / "tasks" / name).read_text())


def test_dkms_is_checked_before_any_package_is_installed_and_the_stream_is_switched_before_the_install():
    steps = tasks("install-dnf.yml")
    names = [task["name"] for task in steps]
    installs = [i for i, task in enumerate(steps) if "ansible.builtin.dnf" in task and not task.get("check_mode")]
    stop = names.index("Stop where no repository has dkms")
    switch = next(i for i, task in enumerate(steps) if "switch-to" in str(task.get("ansible.builtin.command", "")))
    assert stop < min(installs)
    assert switch < names.index("Install the driver from its module stream")
    drain = names.index("Drain the node, or stop, before the driver changes under its loaded module")
    assert drain < switch
    assert "__nvidia_driver_dnf_stream_switch" in " ".join(steps[drain]["when"])


def test_the_refusal_without_dkms_is_one_sentence_naming_epel():
    fail = next(task for task in tasks("install-dnf.yml") if task["name"] == "Stop where no repository has dkms")
    text = fail["ansible.builtin.fail"]["msg"].strip()
    assert "EPEL" in text
    assert text.endswith(".") and text.count(". ") == 0
