# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nvidia_driver role's package choice on Ubuntu and from NVIDIA's CUDA repository, from its one read of a node:
Canonical's precompiled modules or the DKMS fallback, Secure Boot, a driver version within the branch, Fabric
Manager's version and the branch-free names of 590 and later (docs/ubuntu-driver-packages.md has the facts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import init_plugin_loader
from ansible.template import trust_as_template
from ansible_collections.gpuops.k8s.tests.unit.roles.test_node_package_selection import RoleVars

init_plugin_loader()

KERNEL = "6.8.0-45-generic"
ABSENT = {"type": "absent"}
DIRECTORY = {"type": "directory", "mode": "0755", "owner": "root", "group": "root"}
GPU_SCAN = {"source": "sysfs", "pci_devices": [{"bus_id": "0000:18:00.0"}], "nvswitch_devices": []}
NVSWITCH_SCAN = dict(GPU_SCAN, nvswitch_devices=[{"bus_id": "0000:05:00.0"}])


class Absent(dict):
    """node_state's paths: those the test does not name are absent."""

    def __missing__(self, key):
        return ABSENT


def answer(stdout: str, rc: int = 0) -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": ""}


def node(
    index: list[str] | None = None,
    dpkg: str = "installed linux-image-generic 6.8.0-45.45\ninstalled linux-image-6.8.0-45-generic 6.8.0-45.45\n",
    installed: dict | None = None,
    secure_boot: bool = False,
    policy: str = "",
    madison: str = "",
    boot: str | None = None,
) -> dict:
    """What node_state reads on an Ubuntu machine with a GPU (not a container): INDEX is what `apt-cache pkgnames
    linux-modules-nvidia-580-server-open-` answers, DPKG what dpkg-query lists of linux-image-* and
    linux-modules-nvidia-*, INSTALLED the driver's packages (name: version), BOOT what files/boot-kernel.sh prints."""
    index = (
        [f"linux-modules-nvidia-580-server-open-{KERNEL}", "linux-modules-nvidia-580-server-open-generic"]
        if (index is None)
        else index
    )
    absent = ["/run/.containerenv", "/.dockerenv", "/.dockerinit", "/proc/vz", "/proc/lve", "/proc/bc",
              "/sys/module/nvidia", "/sys/module/nouveau"]  # fmt: skip
    paths = Absent({p: ABSENT for p in absent})
    paths[f"/lib/modules/{KERNEL}/kernel"] = DIRECTORY
    paths["/sys/firmware/efi"] = DIRECTORY if secure_boot else ABSENT
    # node_state answers for every package the read names, None where it is not installed.
    read = ["nvidia-headless-no-dkms-580-server-open", "nvidia-headless-580-server-open", "nvidia-utils-580-server",
            "nvidia-headless-no-dkms-580-server", "nvidia-headless-580-server", "nvidia-fabricmanager-580",
            f"linux-headers-{KERNEL}", "python3-pynvml"]  # fmt: skip
    packages = {name: {"version": None, "held": False} for name in read}
    packages.update({name: {"version": version, "held": False} for name, version in (installed or {}).items()})
    commands = {"boot_kernel": answer(boot)} if boot is not None else {}
    return {
        "paths": paths,
        "contents": {
            "/proc/1/cgroup": "0::/init.scope\n",
            "/run/systemd/container": None,
            "/etc/modprobe.d/gpuops-blacklist-nouveau.conf": None,
            "/sys/module/nvidia/version": None,
        },
        "packages": packages,
        "units": {},
        "systemd": True,
        "record": {"key": "", "current": False, "differs": []},
        "commands": {
            "headers": answer("", 100),
            "mokutil": answer("SecureBoot enabled\n" if secure_boot else "SecureBoot disabled\n"),
            "dpkg": answer(dpkg),
            "modules": answer("\n".join(index) + "\n"),
            "policy": answer(policy),
            "madison": answer(madison),
            **commands,
        },
    }


def role(read: dict | None, platform: str = "ubuntu2404", **inventory) -> RoleVars:
    given = dict(nvidia_driver_gpu_info=GPU_SCAN, inventory_hostname="gpu-1")
    given.update(inventory)
    if read is not None:
        given["__nvidia_driver_node"] = read
    vars_ = RoleVars("nvidia_driver", platform, **given)
    variables = vars_._templar.available_variables
    variables["ansible_facts"] = dict(variables["ansible_facts"], kernel=KERNEL)
    vars_._templar.available_variables = variables
    return vars_


def test_ubuntu_installs_canonicals_precompiled_module_for_the_kernel_flavour():
    chosen = role(node())
    assert chosen.get("__nvidia_driver_precompiled") is True
    assert chosen.get("__nvidia_driver_packages") == [
        "linux-modules-nvidia-580-server-open-generic",
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server",
    ]
    # No headers and no compiler: the module is loadable without them.
    assert chosen.get("__nvidia_driver_module_possible") is True
    assert chosen.get("__nvidia_driver_todo")["headers"] is False
    assert chosen.get("__nvidia_driver_todo")["index"] is False


def test_the_metapackage_follows_the_installed_kernel_metapackage():
    """A 22.04 node on the HWE kernel: linux-image-generic-hwe-22.04 is installed, so the module's metapackage is the
    one that follows it (not -generic, which would pull the GA kernel)."""
    dpkg = "installed linux-image-generic-hwe-22.04 6.8.0-45.45~22.04.1\ninstalled linux-image-6.8.0-45-generic x\n"
    index = [f"linux-modules-nvidia-580-server-{KERNEL}", "linux-modules-nvidia-580-server-generic-hwe-22.04"]
    chosen = role(node(index=index, dpkg=dpkg), "ubuntu2204", nvidia_driver_kernel_modules="proprietary")
    assert chosen.get("__nvidia_driver_packages")[0] == "linux-modules-nvidia-580-server-generic-hwe-22.04"
    assert chosen.get("__nvidia_driver_precompiled") is True
    # The read asks the index for that branch and module type's names.
    assert chosen.get("__nvidia_driver_read_commands")["modules"] == [
        "apt-cache", "pkgnames", "linux-modules-nvidia-580-server-"]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "index"),
    [
        ("no module package for the running kernel's ABI", ["linux-modules-nvidia-580-server-open-generic"]),
        ("no module package at all", []),
    ],
)
def test_without_a_precompiled_module_for_the_running_kernel_the_module_is_built_with_dkms(what, index):
    installed = {"linux-headers-" + KERNEL: "6.8.0-45.45"}
    chosen = role(node(index=index, installed=installed))
    assert chosen.get("__nvidia_driver_precompiled") is False, what
    assert chosen.get("__nvidia_driver_packages") == ["nvidia-headless-580-server-open", "nvidia-utils-580-server"]
    # Nothing installed yet: index.yml asks the refreshed index again before the DKMS packages are installed.
    assert chosen.get("__nvidia_driver_todo")["index"] is True, what
    # With the refreshed index's answer the decision stands, and is said.
    probed = role(node(index=index, installed=installed), __nvidia_driver_modules_probe=answer("\n".join(index)))
    assert probed.get("__nvidia_driver_precompiled") is False


def test_an_installed_precompiled_module_stays_the_choice():
    dpkg = ("installed linux-image-generic 6.8.0-45.45\n"
            "installed linux-modules-nvidia-580-server-open-generic 6.8.0-45.45+1\n")  # fmt: skip
    installed = {"nvidia-headless-no-dkms-580-server-open": "580.95.05-0ubuntu0.24.04.1",
                 "nvidia-utils-580-server": "580.95.05-0ubuntu0.24.04.1"}  # fmt: skip
    converged = role(node(index=[], dpkg=dpkg, installed=installed))
    assert converged.get("__nvidia_driver_precompiled") is True
    assert converged.get("__nvidia_driver_todo")["install"] is False


def test_secure_boot_does_not_stop_canonicals_signed_module_but_stops_the_dkms_fallback():
    signed = role(node(secure_boot=True))
    assert signed.get("__nvidia_driver_secure_boot_refusal") == ""
    installed = {"linux-headers-" + KERNEL: "6.8.0-45.45"}
    dkms = role(node(index=[], installed=installed, secure_boot=True))
    assert dkms.get("__nvidia_driver_secure_boot_refusal").startswith("Secure Boot is enabled on gpu-1")


def test_a_kernel_update_brings_the_precompiled_module_of_the_kernel_the_node_boots_next():
    """linux-image-generic moved to 6.8.0-50-generic: once the index has that kernel's module, the role installs it
    with the flavour metapackage, and not before; then the node is converged again."""
    new_kernel = "6.8.0-50-generic"
    dpkg = ("installed linux-image-generic 6.8.0-50.50\n"
            f"installed linux-image-{KERNEL} 6.8.0-45.45\ninstalled linux-image-{new_kernel} 6.8.0-50.50\n"
            "installed linux-modules-nvidia-580-server-open-generic 6.8.0-45.45+1\n"
            f"installed linux-modules-nvidia-580-server-open-{KERNEL} 6.8.0-45.45+1\n")  # fmt: skip
    index = [f"linux-modules-nvidia-580-server-open-{KERNEL}", "linux-modules-nvidia-580-server-open-generic"]
    boot = f"kernel={new_kernel}\nversion=\n"
    installed = {"nvidia-headless-no-dkms-580-server-open": "580.95.05-0ubuntu0.24.04.1",
                 "nvidia-utils-580-server": "580.95.05-0ubuntu0.24.04.1"}  # fmt: skip
    unpublished = role(node(index=index, dpkg=dpkg, installed=installed, boot=boot))
    assert unpublished.get("__nvidia_driver_todo")["boot_module"] is False
    published = role(node(index=[*index, f"linux-modules-nvidia-580-server-open-{new_kernel}"], dpkg=dpkg,
                          installed=installed, boot=boot))  # fmt: skip
    assert published.get("__nvidia_driver_boot_modules_abi_package") == (
        f"linux-modules-nvidia-580-server-open-{new_kernel}")  # fmt: skip
    assert published.get("__nvidia_driver_todo")["boot_module"] is True
    assert published.get("__nvidia_driver_todo")["install"] is False
    assert published.get("__nvidia_driver_todo_packages") is True
    converged = role(node(index=[*index, f"linux-modules-nvidia-580-server-open-{new_kernel}"],
                          dpkg=dpkg + f"installed linux-modules-nvidia-580-server-open-{new_kernel} 6.8.0-50.50+1\n",
                          installed=installed, boot=boot))  # fmt: skip
    assert converged.get("__nvidia_driver_todo")["boot_module"] is False
    # The DKMS fallback has no such package to follow the kernel with.
    dkms = role(node(index=[f"linux-modules-nvidia-580-server-open-{new_kernel}"], boot=boot,
                     installed={"linux-headers-" + KERNEL: "6.8.0-45.45"}))  # fmt: skip
    assert dkms.get("__nvidia_driver_todo")["boot_module"] is False


CONVERGED_580 = {"nvidia-headless-no-dkms-580-server-open": "580.95.05-0ubuntu0.24.04.1",
                 "nvidia-utils-580-server": "580.95.05-0ubuntu0.24.04.1"}  # fmt: skip
WITH_MODULE = ("installed linux-image-generic 6.8.0-45.45\n"
               "installed linux-modules-nvidia-580-server-open-generic 6.8.0-45.45+1\n")  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "candidate", "todo", "names"),
    [
        ("", "580.105.08-0ubuntu0.24.04.1", False, None),
        ("latest", "580.95.05-0ubuntu0.24.04.1", False, None),
        ("latest", "580.105.08-0ubuntu0.24.04.1", True, "580.105.08*"),
        ("580.95.05", "580.105.08-0ubuntu0.24.04.1", False, None),
        ("580.82.07", "580.105.08-0ubuntu0.24.04.1", True, "580.82.07*"),
    ],
)  # fmt: skip
def test_a_driver_version_within_the_branch(setting, candidate, todo, names):
    policy = f"nvidia-utils-580-server:\n  Installed: 580.95.05-0ubuntu0.24.04.1\n  Candidate: {candidate}\n"
    read = node(index=[], dpkg=WITH_MODULE, installed=CONVERGED_580, policy=policy)
    chosen = role(read, nvidia_driver_version=setting)
    assert chosen.get("__nvidia_driver_todo")["install"] is todo
    if names:
        assert chosen.get("__nvidia_driver_install_names") == [
            "linux-modules-nvidia-580-server-open-generic",
            f"nvidia-headless-no-dkms-580-server-open={names}",
            f"nvidia-utils-580-server={names}",
        ]
    assert ("policy" in chosen.get("__nvidia_driver_read_commands")) is (setting == "latest")


def test_fabric_manager_matches_the_drivers_upstream_version_not_its_debian_revision():
    madison = (" nvidia-utils-580-server | 580.95.05-0ubuntu0.24.04.1 | file:/srv/repo ./ Packages\n"
               " nvidia-fabricmanager-580 | 580.105.08-1 | file:/srv/repo ./ Packages\n"
               " nvidia-fabricmanager-580 | 580.95.05-1 | file:/srv/repo ./ Packages\n")  # fmt: skip
    read = node(index=[], dpkg=WITH_MODULE, installed=CONVERGED_580, madison=madison)
    chosen = role(read, nvidia_driver_gpu_info=NVSWITCH_SCAN)
    assert chosen.get("__nvidia_driver_fabricmanager_version") == "580.95.05-1"
    assert chosen.get("__nvidia_driver_todo")["fabricmanager"] is True
    read["packages"]["nvidia-fabricmanager-580"] = {"version": "580.95.05-1", "held": False}
    assert role(read, nvidia_driver_gpu_info=NVSWITCH_SCAN).get("__nvidia_driver_todo")["fabricmanager"] is False


@pytest.mark.parametrize("platform", ["ubuntu2404", "ubuntu2204", "debian12"])
@pytest.mark.parametrize(
    ("branch", "modules", "packages", "version_package", "fabricmanager"),
    [
        ("580", "open", ["nvidia-open-580"], "nvidia-compute-utils-580", "nvidia-fabricmanager-580"),
        ("580", "proprietary", ["cuda-drivers-580"], "nvidia-compute-utils-580", "nvidia-fabricmanager-580"),
        ("590", "open", ["nvidia-driver-pinning-590", "nvidia-open"], "nvidia-compute-utils", "nvidia-fabricmanager"),
        ("595", "proprietary", ["nvidia-driver-pinning-595", "cuda-drivers"], "nvidia-compute-utils",
         "nvidia-fabricmanager"),
    ],
)  # fmt: skip
def test_the_cuda_repositorys_names_by_branch(platform, branch, modules, packages, version_package, fabricmanager):
    chosen = role(None, platform, nvidia_driver_source="cuda", nvidia_driver_branch=branch,
                  nvidia_driver_kernel_modules=modules)  # fmt: skip
    assert chosen.get("__nvidia_driver_packages") == packages
    assert chosen.get("__nvidia_driver_src")["version_package"] == version_package
    assert chosen.get("__nvidia_driver_fabricmanager_package") == fabricmanager
    # The branch hold still keeps the branch-free names on the branch.
    assert f"Pin: version {branch}.*" in chosen.get("__nvidia_driver_pref")


@pytest.mark.parametrize("setting", ["580", "590.48.01", "latest-1", "580.95.05; rm"])
def test_a_version_that_is_not_of_the_branch_is_refused_with_one_sentence(setting):
    """tasks/main.yml's first check, before anything is written: its conditions and its message, rendered."""
    tasks = yaml.safe_load((Path(__file__).resolve().parents[3] / "roles/nvidia_driver/tasks/main.yml").read_text())
    check = next(t for t in tasks if t["name"] == "Check the source for this platform and the driver branch")
    chosen = role(None, nvidia_driver_version=setting)
    render = chosen._templar.template
    assert render(trust_as_template("{{ " + check["ansible.builtin.assert"]["that"][-1] + " }}")) is False
    message = render(trust_as_template(check["ansible.builtin.assert"]["fail_msg"]))
    assert message.startswith(f'nvidia_driver_version="{setting}" is not a version of driver branch 580')
