# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the nvidia_driver role decides from its one read of a node (vars/main.yml: __nvidia_driver_todo and the
facts around it), for reads a node with a GPU could return: converged, and each thing the role manages drifted.

The role's real vars files are rendered with Ansible's own templar (test_node_package_selection.RoleVars), given a
gpuops.k8s.node_state result built here. Molecule's default scenario runs the role on a container, where neither the
kernel module nor Secure Boot can be shown; this covers those decisions, and molecule the role's runs.
"""

from __future__ import annotations

import copy
import hashlib
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import init_plugin_loader
from ansible_collections.gpuops.k8s.tests.unit.roles import test_node_package_selection
from ansible_collections.gpuops.k8s.tests.unit.roles.test_node_package_selection import KERNEL, RoleVars

# The record's key reads cuda_repository's files with the file and fileglob lookups.
init_plugin_loader()

ROLES = Path(__file__).resolve().parents[3] / "roles"
GPU_SCAN = {"source": "sysfs", "pci_devices": [{"bus_id": "0000:18:00.0"}], "nvswitch_devices": []}
ABSENT = {"type": "absent"}
DIRECTORY = {"type": "directory", "mode": "0755", "owner": "root", "group": "root"}
PREF = "/etc/apt/preferences.d/gpuops-nvidia-driver.pref"
UNATTENDED = "/etc/apt/apt.conf.d/51gpuops-nvidia-driver-unattended-upgrades"
BLACKLIST = "/etc/modprobe.d/gpuops-blacklist-nouveau.conf"
OPTIONS = "/etc/modprobe.d/gpuops-nouveau-options.conf"
PERSISTENCED = "/lib/systemd/system/nvidia-persistenced.service"
LOADED_VERSION = "/sys/module/nvidia/version"
HEADERS = f"linux-headers-{KERNEL}"
HEADERS_FOLLOW = "linux-headers-amd64"
# What the read's boot_kernel command prints on a node whose next kernel is the running one, with the driver's module.
BOOT_CONVERGED = f"kernel={KERNEL}\nmodule=/lib/modules/{KERNEL}/updates/dkms/nvidia.ko\nversion=535.247.01\n"
DEBIAN_PACKAGES = ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "nvidia-persistenced"]


def written(text: str, mode: str = "0644") -> dict:
    """node_state's description of a file the role wrote with TEXT."""
    return {
        "type": "file",
        "mode": mode,
        "owner": "root",
        "group": "root",
        "checksum": hashlib.sha1(text.encode()).hexdigest(),
    }


def wanted_text(name: str, **inventory) -> str:
    return RoleVars("nvidia_driver", "debian12", **inventory).get(name)


def converged(**inventory) -> dict:
    """What node_state reads on a Debian 12 machine with a GPU (not a container) where the role converged: the
    driver installed and loaded, its files as the role writes them, nvidia-persistenced enabled and running."""
    paths = {
        "/run/.containerenv": ABSENT,
        "/.dockerenv": ABSENT,
        "/.dockerinit": ABSENT,
        "/proc/vz": ABSENT,
        "/proc/lve": ABSENT,
        "/proc/bc": ABSENT,
        f"/lib/modules/{KERNEL}/kernel": DIRECTORY,
        "/sys/firmware/efi": ABSENT,
        "/sys/module/nvidia": DIRECTORY,
        "/sys/module/nouveau": ABSENT,
        "/etc/apt/keyrings": DIRECTORY,
        "/etc/apt/sources.list.d/gpuops-debian-non-free.sources": ABSENT,
        PREF: written(wanted_text("__nvidia_driver_pref", **inventory)),
        UNATTENDED: written(wanted_text("__nvidia_driver_unattended_upgrades", **inventory)),
        BLACKLIST: written("blacklist nouveau\nblacklist lbm-nouveau\n"),
        OPTIONS: written(wanted_text("__nvidia_driver_nouveau_options", **inventory)),
        PERSISTENCED: written("[Unit]\n"),
    }
    installed = {name: {"version": "535.247.01-1~deb12u1", "held": False} for name in DEBIAN_PACKAGES}
    installed[HEADERS] = {"version": "6.1.140-1", "held": False}
    installed[HEADERS_FOLLOW] = {"version": "6.1.140-1", "held": False}
    installed["python3-pynvml"] = {"version": "12.535.133-1", "held": False}
    return {
        "changed": False,
        "paths": paths,
        "contents": {
            "/proc/1/cgroup": "0::/init.scope\n",
            "/run/systemd/container": None,
            BLACKLIST: "blacklist nouveau\nblacklist lbm-nouveau\n",
            LOADED_VERSION: "535.247.01\n",
        },
        "packages": installed,
        "units": {
            "nvidia-persistenced.service": {
                "load_state": "loaded",
                "active_state": "active",
                "unit_file_state": "enabled",
            }
        },
        "systemd": True,
        "commands": {
            "headers": {"rc": 0, "stdout": f"Package: {HEADERS}\n", "stderr": ""},
            "headers_follow": {"rc": 0, "stdout": f"Package: {HEADERS_FOLLOW}\n", "stderr": ""},
            "mokutil": None,
            "boot_kernel": {"rc": 0, "stdout": BOOT_CONVERGED, "stderr": ""},
        },
    }


def decide(node: dict, **inventory) -> RoleVars:
    return RoleVars(
        "nvidia_driver",
        "debian12",
        __nvidia_driver_node=node,
        nvidia_driver_gpu_info=GPU_SCAN,
        inventory_hostname="gpu-1",
        role_path=str(ROLES / "nvidia_driver"),
        **inventory,
    )


def todo(node: dict, **inventory) -> set[str]:
    """The steps the role would run: the entries of __nvidia_driver_todo that are true."""
    return {name for name, due in decide(node, **inventory).get("__nvidia_driver_todo").items() if due}


def test_a_converged_node_with_a_gpu_has_nothing_to_do():
    role = decide(converged())
    assert role.get("__nvidia_driver_in_container") is False
    assert role.get("__nvidia_driver_module_possible") is True
    assert role.get("__nvidia_driver_secure_boot_refusal") == ""
    assert todo(converged()) == set()


def drifted(change) -> dict:
    node = copy.deepcopy(converged())
    change(node)
    return node


@pytest.mark.parametrize(
    ("what", "change", "steps"),
    [
        ("the hold's content", lambda n: n["paths"][PREF].update(checksum="0" * 40), {"hold"}),
        ("the hold's mode", lambda n: n["paths"][PREF].update(mode="0600"), {"hold"}),
        ("the hold's owner", lambda n: n["paths"][PREF].update(owner="nobody"), {"hold"}),
        ("the unattended-upgrades drop-in removed", lambda n: n["paths"].update({UNATTENDED: ABSENT}),
         {"unattended_upgrades"}),
        ("the nouveau options' content", lambda n: n["paths"][OPTIONS].update(checksum="0" * 40), {"nouveau_options"}),
        ("a name gone from the blacklist", lambda n: n["contents"].update({BLACKLIST: "blacklist nouveau\n"}),
         {"blacklist"}),
        ("the blacklist removed", lambda n: n["contents"].update({BLACKLIST: None}), {"blacklist"}),
        ("a driver package removed", lambda n: n["packages"]["nvidia-smi"].update(version=None), {"install"}),
        ("pynvml removed", lambda n: n["packages"]["python3-pynvml"].update(version=None), {"pynvml"}),
        ("the headers removed", lambda n: n["packages"][HEADERS].update(version=None), {"headers"}),
        ("the headers metapackage removed", lambda n: n["packages"][HEADERS_FOLLOW].update(version=None), {"headers"}),
        ("the daemon disabled", lambda n: n["units"]["nvidia-persistenced.service"].update(unit_file_state="disabled"),
         {"services"}),
        ("the daemon stopped", lambda n: n["units"]["nvidia-persistenced.service"].update(active_state="inactive"),
         {"services"}),
        ("the module unloaded", lambda n: n["paths"].update({"/sys/module/nvidia": ABSENT}), {"load"}),
        ("the keyring directory's mode", lambda n: n["paths"]["/etc/apt/keyrings"].update(mode="0700"), set()),
    ],
)  # fmt: skip
def test_each_drift_is_the_step_that_repairs_it(what, change, steps):
    assert todo(drifted(change)) == steps, what


def test_comments_and_other_lines_in_the_blacklist_are_left_alone():
    node = drifted(
        lambda n: n["contents"].update(
            {BLACKLIST: "# mine\nblacklist other\n  blacklist nouveau \nblacklist lbm-nouveau\n"}
        )
    )
    assert todo(node) == set()
    node = drifted(lambda n: n["contents"].update({BLACKLIST: "#blacklist nouveau\nblacklist lbm-nouveau\n"}))
    assert todo(node) == {"blacklist"}


def test_an_unloaded_module_is_not_loaded_over_nouveau_and_nouveau_asks_for_the_reboot_on_every_run():
    def change(node):
        node["paths"].update({"/sys/module/nvidia": ABSENT, "/sys/module/nouveau": DIRECTORY})
        node["contents"][LOADED_VERSION] = None

    assert todo(drifted(change)) == {"module"}
    assert decide(drifted(change)).get("__nvidia_driver_gpu_module_loaded") is True
    # Where the role does not blacklist nouveau, a reboot would bring nouveau back: nothing to do.
    assert todo(drifted(change), nvidia_driver_blacklist_nouveau=False) == set()


def test_a_loaded_module_that_is_not_the_installed_driver_asks_for_the_reboot_on_every_run():
    """The state after an install whose drain was refused or whose reboot failed: new packages over the old module.
    Nothing is to install, and still the role has work on every run until the node runs the installed driver."""
    old = drifted(lambda n: n["contents"].update({LOADED_VERSION: "535.216.01\n"}))
    role = decide(old)
    assert role.get("__nvidia_driver_loaded_version") == "535.216.01"
    assert role.get("__nvidia_driver_package_driver_version") == "535.247.01"
    assert todo(old) == {"module"}
    # In a container the kernel is the host's: no reboot is asked for.
    inside = drifted(
        lambda n: n["contents"].update({LOADED_VERSION: "535.216.01\n", "/proc/1/cgroup": "0::/docker/1\n"})
    )
    assert todo(inside) == set()
    # An epoch in the package's version is no difference.
    epoch = drifted(lambda n: n["packages"]["nvidia-smi"].update(version="1:535.247.01-1~deb12u1"))
    assert todo(epoch) == set()


@pytest.mark.parametrize(
    ("what", "change", "reboot", "drain_first"),
    [
        ("a branch change with the old module loaded, rebooting", lambda n: None, True, True),
        ("a branch change with the old module loaded, not rebooting", lambda n: None, False, False),
        ("a branch change with no module loaded", lambda n: n["paths"].update({"/sys/module/nvidia": ABSENT}), True,
         False),
        ("a branch change in a container", lambda n: n["contents"].update({"/proc/1/cgroup": "0::/docker/1\n"}), True,
         False),
    ],
)  # fmt: skip
def test_a_driver_change_under_a_loaded_module_is_drained_for_before_the_install(what, change, reboot, drain_first):
    """Branch 580 from the CUDA repository wanted while Debian's 535 is installed and loaded: the new branch's packages
    are missing (todo install), and whether the node must be drained (or the run stop) is known from the read, before
    apt or dnf runs (tasks/install-*.yml include node_drain ahead of the install on
    __nvidia_driver_drain_before_install)."""
    node = drifted(change)
    node["record"] = {"key": "", "current": False, "differs": []}
    node["packages"]["nvidia-open-580"] = {"version": None, "held": False}
    role = decide(node, nvidia_driver_source="cuda", nvidia_driver_branch="580", nvidia_driver_reboot=reboot)
    assert role.get("__nvidia_driver_todo")["install"] is True, what
    assert role.get("__nvidia_driver_drain_before_install") is drain_first, what


def test_a_stopped_daemon_is_only_enabled_where_the_module_cannot_be_loaded():
    stopped = drifted(lambda n: n["units"]["nvidia-persistenced.service"].update(active_state="inactive"))
    stopped["paths"][f"/lib/modules/{KERNEL}/kernel"] = ABSENT
    assert decide(stopped).get("__nvidia_driver_module_possible") is False
    assert todo(stopped) == set()


def test_headers_the_index_does_not_have_make_the_role_refresh_it_and_ask_again():
    def change(node):
        node["packages"][HEADERS]["version"] = None
        node["commands"]["headers"] = {"rc": 100, "stdout": "", "stderr": "E: No packages found\n"}

    role = decide(drifted(change))
    assert role.get("__nvidia_driver_module_possible") is False
    assert todo(drifted(change)) == {"index"}
    # Where the refreshed index has them (tasks/index.yml registers its answer), the headers are installed.
    answered = decide(drifted(change), __nvidia_driver_headers_probe={"rc": 0, "stdout": f"Package: {HEADERS}\n"})
    assert {name for name, due in answered.get("__nvidia_driver_todo").items() if due} == {"headers"}


@pytest.mark.parametrize(
    ("what", "change", "inside"),
    [
        ("podman's marker", lambda n: n["paths"].update({"/run/.containerenv": written("")}), True),
        ("docker in PID 1's cgroup", lambda n: n["contents"].update({"/proc/1/cgroup": "0::/docker/0123abcd\n"}), True),
        ("LXC by systemd", lambda n: n["contents"].update({"/run/systemd/container": "lxc\n"}), True),
        ("an OpenVZ guest", lambda n: n["paths"].update({"/proc/vz": DIRECTORY}), True),
        ("an OpenVZ host", lambda n: n["paths"].update({"/proc/vz": DIRECTORY, "/proc/bc": DIRECTORY}), False),
        ("WSL by systemd", lambda n: n["contents"].update({"/run/systemd/container": "wsl\n"}), False),
    ],
)  # fmt: skip
def test_a_container_is_seen_as_the_virtualization_facts_see_it(what, change, inside):
    role = decide(drifted(change))
    assert role.get("__nvidia_driver_in_container") is inside, what
    assert role.get("__nvidia_driver_module_possible") is not inside, what


def test_secure_boot_stops_the_role_unless_the_modules_are_signed():
    def change(node):
        node["paths"]["/sys/firmware/efi"] = DIRECTORY
        node["commands"]["mokutil"] = {"rc": 0, "stdout": "SecureBoot enabled\n", "stderr": ""}

    assert (
        decide(drifted(change))
        .get("__nvidia_driver_secure_boot_refusal")
        .startswith("Secure Boot is enabled on gpu-1 and would refuse to load unsigned NVIDIA kernel modules.")
    )
    signed = decide(drifted(change), nvidia_driver_secure_boot_signed_modules=True)
    assert signed.get("__nvidia_driver_secure_boot_refusal") == ""
    without_mokutil = decide(drifted(lambda n: n["paths"].update({"/sys/firmware/efi": DIRECTORY})))
    assert without_mokutil.get("__nvidia_driver_secure_boot_refusal").startswith(
        "gpu-1 boots with EFI but has no mokutil"
    )


def test_pinning_and_unattended_upgrades_turned_off_want_the_files_gone():
    off = {"nvidia_driver_pin": False, "nvidia_driver_unattended_upgrades_exclude": False}
    assert todo(converged(), **off) == {"hold", "unattended_upgrades"}
    node = drifted(lambda n: n["paths"].update({PREF: ABSENT, UNATTENDED: ABSENT}))
    assert todo(node, **off) == set()


def test_the_cuda_repository_is_included_where_the_record_does_not_hold():
    cuda = {"nvidia_driver_source": "cuda"}
    role = decide(converged(), **cuda)
    key = role.get("__nvidia_driver_cuda_repository_record_key")
    node = converged(**cuda)
    node["packages"] = {
        "nvidia-open-580": {"version": "580.95.05-1", "held": False},
        HEADERS: {"version": "6.1.140-1", "held": False},
        HEADERS_FOLLOW: {"version": "6.1.140-1", "held": False},
        "python3-pynvml": {"version": "12.535.133-1", "held": False},
    }
    node["record"] = {"key": key, "current": True, "differs": []}
    assert todo(node, **cuda) == set()
    for record in ({"key": key, "current": False, "differs": ["/etc/apt/sources.list.d/nvidia-cuda.sources"]},
                   {"key": "another", "current": True, "differs": []}):  # fmt: skip
        node["record"] = record
        assert todo(node, **cuda) == {"cuda_repository"}
    # Another mirror is another key: the record made with the first does not hold.
    assert (
        decide(converged(), cuda_repository_base_url="http://mirror.invalid", **cuda).get(
            "__nvidia_driver_cuda_repository_record_key"
        )
        != key
    )


@pytest.mark.parametrize(
    ("tasks_file", "install_task"),
    [
        ("install-apt.yml", "Install the driver packages"),
        ("install-dnf.yml", "Install the driver from its module stream"),
    ],
)
def test_the_drain_is_decided_before_the_packages_change(tasks_file, install_task):
    """The order of the role's own tasks: node_drain (which stops the run where it may not drain) comes before the
    task that installs the driver, and runs on the decision above."""
    tasks = yaml.safe_load((ROLES / "nvidia_driver" / "tasks" / tasks_file).read_text())
    names = [task.get("name") for task in tasks]
    drain = next(
        i
        for i, task in enumerate(tasks)
        if (task.get("ansible.builtin.include_role") or {}).get("name") == "gpuops.k8s.node_drain"
    )
    assert drain < names.index(install_task)
    conditions = " ".join(str(task.get("when", "")) for task in tasks[: drain + 1])
    assert "__nvidia_driver_drain_before_install" in conditions


def test_the_reboot_and_its_warning_follow_the_loaded_module_not_this_runs_install():
    """tasks/module.yml decides from the state (__nvidia_driver_module_stale), so a run after a refused drain or a
    failed reboot, which installs nothing, still drains and reboots, or says the node needs it."""
    tasks = yaml.safe_load((ROLES / "nvidia_driver" / "tasks" / "module.yml").read_text())
    by_name = {task["name"]: task for task in tasks}
    for name in (
        "Drain the node before rebooting it for the installed driver",
        "Ask for a reboot to replace the loaded module",
    ):
        when = str(by_name[name]["when"])
        assert "__nvidia_driver_module_stale" in when and "is changed" not in when, name


@pytest.mark.parametrize(
    ("platform", "kernel", "package", "spec"),
    [
        ("debian12", "6.1.0-28-amd64", "linux-headers-amd64", "linux-headers-amd64"),
        ("debian12", "6.1.0-28-cloud-amd64", "linux-headers-cloud-amd64", "linux-headers-cloud-amd64"),
        ("debian12", "6.1.0-28-rt-amd64", "linux-headers-rt-amd64", "linux-headers-rt-amd64"),
        ("debian12", "6.1.0-28-arm64", "linux-headers-arm64", "linux-headers-arm64"),
        ("debian12", "6.12.12+bpo-amd64", "linux-headers-amd64", "linux-headers-amd64"),
        # A kernel built locally has no flavour Debian packages headers for.
        ("debian12", "6.6.0", "", ""),
        ("rocky9", "5.14.0-427.13.1.el9_4.x86_64", "kernel-devel-matched",
         "kernel-devel-matched-5.14.0-427.13.1.el9_4.x86_64"),
        ("ubuntu2404", "6.8.0-45-generic", "", ""),
    ],
)  # fmt: skip
def test_the_headers_metapackage_is_the_running_kernels_flavour(monkeypatch, platform, kernel, package, spec):
    monkeypatch.setattr(test_node_package_selection, "KERNEL", kernel)
    role = RoleVars("nvidia_driver", platform)
    assert role.get("__nvidia_driver_headers_follow_package") == package
    assert role.get("__nvidia_driver_headers_follow_spec") == spec
    assert (package in role.get("__nvidia_driver_read_packages")) is bool(package)


def test_the_headers_metapackage_is_installed_where_the_index_has_it():
    missing = drifted(lambda n: n["packages"][HEADERS_FOLLOW].update(version=None))
    assert decide(missing).get("__nvidia_driver_headers_follow_todo") is True
    assert todo(missing) == {"headers"}
    # Not in the index (a kernel flavour without a metapackage in the node's sources): nothing to install.
    missing["commands"]["headers_follow"] = {"rc": 100, "stdout": "", "stderr": "E: No packages found\n"}
    assert todo(missing) == set()
    # Where the refreshed index has it (tasks/index.yml registers its answer), it is installed.
    answered = decide(missing, __nvidia_driver_headers_follow_probe={"rc": 0, "stdout": f"Package: {HEADERS_FOLLOW}\n"})
    assert answered.get("__nvidia_driver_headers_follow_todo") is True
    # Without the kernel headers wanted, or in a container, neither.
    assert todo(drifted(lambda n: n["packages"][HEADERS_FOLLOW].update(version=None)),
                nvidia_driver_kernel_headers=False) == set()  # fmt: skip


def boot(stdout: str) -> str:
    """The refusal the role would give for the read's boot_kernel answer STDOUT, on a node whose loaded module is not
    the installed driver and that may reboot."""
    node = drifted(lambda n: n["contents"].update({LOADED_VERSION: "535.216.01\n"}))
    node["commands"]["boot_kernel"] = {"rc": 0, "stdout": stdout, "stderr": ""}
    role = decide(node, nvidia_driver_reboot=True)
    assert role.get("__nvidia_driver_module_stale") is True
    return role.get("__nvidia_driver_boot_refusal")


NEXT = "6.1.0-31-amd64"


@pytest.mark.parametrize(
    ("what", "stdout", "refusal"),
    [
        ("the running kernel with the installed driver's module", BOOT_CONVERGED, ""),
        ("a newer kernel with the installed driver's module, compressed, where DKMS puts it",
         f"kernel={NEXT}\nmodule=/lib/modules/{NEXT}/updates/dkms/nvidia.ko.xz\nversion=535.247.01\n", ""),
        ("a module file where modinfo is not installed", f"kernel={NEXT}\nmodule=/lib/modules/{NEXT}/extra/nvidia.ko\n",
         ""),
        ("a newer kernel without a module", f"kernel={NEXT}\nversion=\n",
         f"gpu-1 boots kernel {NEXT} next, which has no NVIDIA kernel module (no nvidia.ko under /lib/modules/{NEXT}),"
         " so it is not rebooted; build the module for that kernel (install its headers, then dkms autoinstall -k"
         f" {NEXT}) and run again."),
        ("a newer kernel with the old driver's module",
         f"kernel={NEXT}\nmodule=/lib/modules/{NEXT}/updates/dkms/nvidia.ko\nversion=535.216.01\n",
         f"gpu-1 boots kernel {NEXT} next, whose NVIDIA kernel module is 535.216.01, not the installed driver"
         f" 535.247.01, so it is not rebooted; rebuild the module for that kernel (dkms autoinstall -k {NEXT}, then"
         " depmod) and run again."),
        ("a module file depmod has not indexed",
         f"kernel={NEXT}\nmodule=/lib/modules/{NEXT}/extra/nvidia.ko\nversion=\n",
         f"gpu-1 boots kernel {NEXT} next, whose NVIDIA kernel module is not one modinfo finds, not the installed"
         f" driver 535.247.01, so it is not rebooted; rebuild the module for that kernel (dkms autoinstall -k {NEXT},"
         " then depmod) and run again."),
        ("no kernel found", "",
         "gpu-1 would reboot, but the role cannot tell which kernel it boots next (no /boot/vmlinuz-*), so it is not"
         " rebooted; fix the boot loader or reboot it yourself."),
    ],
)  # fmt: skip
def test_a_reboot_is_refused_where_the_next_kernel_has_no_module_of_the_installed_driver(what, stdout, refusal):
    assert boot(stdout) == refusal, what


def test_the_boot_kernel_is_refused_before_the_drain():
    """tasks/module.yml: the refusal comes before node_drain, on the same conditions as the reboot."""
    tasks = yaml.safe_load((ROLES / "nvidia_driver" / "tasks" / "module.yml").read_text())
    names = [task["name"] for task in tasks]
    refuse = names.index("Refuse a reboot into a kernel without the installed driver's module")
    assert refuse < names.index("Drain the node before rebooting it for the installed driver")
    when = " ".join(tasks[refuse]["when"])
    assert "__nvidia_driver_module_stale" in when and "nvidia_driver_reboot" in when
    assert tasks[refuse]["ansible.builtin.fail"]["msg"] == "{{ __nvidia_driver_boot_refusal }}"


def run_boot_kernel_script(tmp_path: Path, method: str, programs: dict[str, str]) -> str:
    """The read's boot_kernel command, run here with stand-ins (TEST DOUBLES) for the programs that read the node's
    /boot, boot loader and module index: each of PROGRAMS is a shell script put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in programs.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    argv = decide(converged()).get("__nvidia_driver_read_commands")["boot_kernel"]
    argv = [argv[0], argv[1], argv[2], argv[3], method]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout


def test_the_next_kernel_is_the_newest_in_version_order_as_grub_mkconfig_sorts_them(tmp_path):
    listing = [
        "System.map-6.1.0-9-amd64", "config-6.1.0-10-amd64", "initrd.img-6.1.0-10-amd64", "vmlinuz-6.1.0-9-amd64",
        "vmlinuz-6.1.0-10-amd64", "vmlinuz-6.1.0-28-amd64.dpkg-tmp", "vmlinuz-6.1.0-30-amd64.old",
    ]  # fmt: skip
    out = run_boot_kernel_script(
        tmp_path,
        "grub",
        {
            "ls": f"[ \"$2\" = /boot ] && printf '%s\\n' {' '.join(listing)}\n",
            "find": '[ "$1" = /lib/modules/6.1.0-10-amd64 ] && echo "$1/updates/dkms/nvidia.ko.zst"\n',
            "modinfo": "[ \"$1 $2 $3 $4 $5\" = '-k 6.1.0-10-amd64 -F version nvidia' ] && echo 535.247.01\n",
        },
    )
    assert out == (
        "kernel=6.1.0-10-amd64\nmodule=/lib/modules/6.1.0-10-amd64/updates/dkms/nvidia.ko.zst\nversion=535.247.01\n"
    )


def test_the_next_kernel_on_rhel_is_grubbys_default(tmp_path):
    kernel = "5.14.0-503.14.1.el9_5.x86_64"
    out = run_boot_kernel_script(
        tmp_path,
        "grubby",
        {"grubby": f"[ \"$1\" = --default-kernel ] && echo /boot/vmlinuz-{kernel}\n", "find": "exit 0\n",
         "modinfo": "exit 1\n"},
    )  # fmt: skip
    assert out == f"kernel={kernel}\nversion=\n"
    # No kernel found (a container's empty /boot): no kernel line.
    assert run_boot_kernel_script(tmp_path / "none", "grub", {"ls": "exit 2\n"}) == ""
