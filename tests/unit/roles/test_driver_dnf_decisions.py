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
import subprocess
import sys
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
    # RHEL has no pynvml package (pip's, read from its metadata): left out here, tested on its own below.
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


# --- Fabric Manager, the NVLink Subnet Manager and IMEX, and pip's pynvml: decided from the same read ---------------
FABRIC = {"nvidia_driver_fabricmanager": "always", "nvidia_driver_nvlsm": "always", "nvidia_driver_imex": "always"}
FABRICMANAGER_UNIT = "/lib/systemd/system/nvidia-fabricmanager.service"
# The NVLink Subnet Manager's ib_umad at boot, as the role writes it.
NVLSM_MODULES = "/etc/modules-load.d/gpuops-nvlsm.conf"
NVLSM_MODULES_TEXT = "# Managed by gpuops.k8s.nvidia_driver: the NVLink Subnet Manager needs ib_umad.\nib_umad\n"
IMEX_UNIT = "/lib/systemd/system/nvidia-imex.service"
ENABLED = {"load_state": "loaded", "active_state": "active", "unit_file_state": "enabled"}


def converged_fabric(**inventory) -> dict:
    """The converged node with Fabric Manager and IMEX at the driver's version, nvlsm with infiniband-diags and ib_umad
    loaded and at boot, and their units enabled."""
    node = converged(**FABRIC, **inventory)
    node["packages"]["nvidia-fabricmanager"] = {"version": "580.105.08-1.el9", "held": None}
    node["packages"]["nvidia-imex"] = {"version": "580.105.08-1.el9", "held": None}
    node["packages"]["nvlsm"] = {"version": "2025.06.10-1", "held": None}
    node["packages"]["infiniband-diags"] = {"version": "51.0-1.el9", "held": None}
    node["paths"]["/sys/module/ib_umad"] = DIRECTORY
    node["paths"][NVLSM_MODULES] = written(NVLSM_MODULES_TEXT)
    node["paths"][FABRICMANAGER_UNIT] = written("[Unit]\n")
    node["paths"][IMEX_UNIT] = written("[Unit]\n")
    node["units"]["nvidia-fabricmanager.service"] = dict(ENABLED)
    node["units"]["nvidia-imex.service"] = dict(ENABLED)
    return node


def test_the_read_asks_rpm_for_the_fabric_services_packages():
    assert {"nvidia-fabricmanager", "nvidia-imex", "nvlsm"} <= set(role(**FABRIC).get("__nvidia_driver_read_packages"))


def test_a_converged_rocky_node_with_its_fabric_services_has_nothing_to_do():
    assert todo(converged_fabric(), **FABRIC) == set()


@pytest.mark.parametrize(
    ("what", "change", "steps"),
    [
        ("Fabric Manager removed", lambda n: n["packages"]["nvidia-fabricmanager"].update(version=None),
         {"fabricmanager"}),
        ("Fabric Manager of an older driver", lambda n: n["packages"]["nvidia-fabricmanager"].update(
            version="580.95.05-1.el9"), {"fabricmanager"}),
        ("the NVLink Subnet Manager removed", lambda n: n["packages"]["nvlsm"].update(version=None), {"fabric"}),
        ("IMEX removed", lambda n: n["packages"]["nvidia-imex"].update(version=None), {"fabric"}),
        ("IMEX of an older driver", lambda n: n["packages"]["nvidia-imex"].update(version="580.95.05-1.el9"),
         {"fabric"}),
        ("Fabric Manager's unit disabled", lambda n: n["units"]["nvidia-fabricmanager.service"].update(
            unit_file_state="disabled"), {"services"}),
    ],
)  # fmt: skip
def test_each_fabric_drift_is_the_step_that_repairs_it(what, change, steps):
    node = copy.deepcopy(converged_fabric())
    change(node)
    assert todo(node, **FABRIC) == steps, what


def test_fabric_manager_waits_for_the_driver():
    node = copy.deepcopy(converged_fabric())
    node["packages"]["nvidia-driver"].update(version=None)
    node["packages"]["nvidia-fabricmanager"].update(version=None)
    assert "fabricmanager" not in todo(node, **FABRIC)
    assert "install" in todo(node, **FABRIC)


PYNVML = {"nvidia_driver_pynvml": True}


def pynvml_read(answer) -> dict:
    """The converged node with the read's answer to the pynvml command: (rc, stdout), or None (no python3)."""
    node = copy.deepcopy(converged(**PYNVML))
    node["commands"]["pynvml"] = None if answer is None else {"rc": answer[0], "stdout": answer[1], "stderr": ""}
    return node


def test_the_read_asks_pythons_metadata_for_pips_pynvml_and_nothing_without_it():
    command = role(**PYNVML).get("__nvidia_driver_read_commands")["pynvml"]
    assert command[0] == "python3"
    assert command[-1] == "nvidia-ml-py"
    assert "importlib.metadata" in command[2]
    assert "pynvml" not in role().get("__nvidia_driver_read_commands")


def test_the_read_command_prints_the_installed_distributions_version(tmp_path):
    """The command's program, run here against a distribution's metadata made for it (a double of pip's install)."""
    dist = tmp_path / "nvidia_ml_py-13.615.71.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-ml-py\nVersion: 13.615.71\n")
    command = role(**PYNVML).get("__nvidia_driver_read_commands")["pynvml"]
    env = {"PYTHONPATH": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    found = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, env=env, check=False)
    assert (found.returncode, found.stdout) == (0, "13.615.71\n")
    missing = subprocess.run(
        [sys.executable, *command[1:-1], "gpuops-no-such-distribution"], capture_output=True, text=True, check=False
    )
    assert missing.returncode != 0


@pytest.mark.parametrize(
    ("what", "answer", "due"),
    [
        ("the pinned version installed", (0, "13.615.71\n"), False),
        ("not installed", (1, ""), True),
        ("another version installed", (0, "12.570.86\n"), True),
        ("no python3", None, True),
    ],
)
def test_pips_pynvml_is_installed_where_the_read_finds_it_missing_or_of_another_version(what, answer, due):
    node = pynvml_read(answer)
    assert todo(node, **PYNVML) == ({"pynvml"} if due else set()), what


def test_another_pinned_version_is_installed():
    node = pynvml_read((0, "13.615.71\n"))
    assert todo(node, nvidia_driver_pynvml=True, nvidia_driver_pynvml_pip_version="13.580.82") == {"pynvml"}


def test_fabric_managers_unit_is_read_again_after_its_install_for_the_services_step():
    steps = tasks("install-dnf.yml")
    names = [task["name"] for task in steps]
    install = names.index("Install Fabric Manager matching the driver version exactly")
    reads = [
        i for i, task in enumerate(steps) if task.get("ansible.builtin.include_tasks") == "read.yml" and i > install
    ]
    assert reads, "no read after Fabric Manager's install"
    assert "__nvidia_driver_fabricmanager_install is changed" in steps[reads[0]]["when"]
