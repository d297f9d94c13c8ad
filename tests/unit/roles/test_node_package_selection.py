# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Package and repository selection of the node roles, for every supported platform.

The roles' real files are rendered with Ansible's own templar: defaults/main.yml, vars/main.yml and
the platform file that the role's first_found list picks, with faked facts for each platform. The
values asserted here are what the tasks hand to apt, dnf, deb822_repository and get_url.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.gpuops.k8s.tests.unit.roles.rendering import role_file

ROLES = Path(__file__).resolve().parents[3] / "roles"
KERNEL = "6.1.0-28-amd64"

FACTS = {
    "ubuntu2204": {
        "distribution": "Ubuntu",
        "distribution_version": "22.04",
        "distribution_major_version": "22",
        "distribution_release": "jammy",
        "os_family": "Debian",
    },
    "ubuntu2404": {
        "distribution": "Ubuntu",
        "distribution_version": "24.04",
        "distribution_major_version": "24",
        "distribution_release": "noble",
        "os_family": "Debian",
    },
    "debian12": {
        "distribution": "Debian",
        "distribution_version": "12.8",
        "distribution_major_version": "12",
        "distribution_release": "bookworm",
        "os_family": "Debian",
    },
    "rocky9": {
        "distribution": "Rocky",
        "distribution_version": "9.5",
        "distribution_major_version": "9",
        "distribution_release": "Blue Onyx",
        "os_family": "RedHat",
    },
}


class RoleVars:
    """A role's variables as a play would see them, for one platform and the given inventory values."""

    def __init__(self, role: str, platform: str, arch: str = "x86_64", **inventory: object) -> None:
        loader = DataLoader()
        role_dir = ROLES / role
        facts = dict(FACTS[platform], architecture=arch, kernel=KERNEL)
        # role_path as a play sets it, for the vars that read the role's files.
        variables: dict = {"role_path": str(role_dir)}
        variables.update(role_file(role_dir / "defaults" / "main.yml"))
        variables.update(inventory)
        variables.update(role_file(role_dir / "vars" / "main.yml"))
        variables["ansible_facts"] = facts
        self._templar = Templar(loader=loader, variables=variables)
        # The same choice the role's first_found lookup makes.
        candidates = self.get(f"__{role}_vars_candidates")
        found = [role_dir / "vars" / name for name in candidates if (role_dir / "vars" / name).is_file()]
        assert found, f"no vars file for {platform} in {role}"
        self.vars_file = found[0].name
        variables.update(role_file(found[0]))
        self._templar = Templar(loader=loader, variables=variables)

    def get(self, name: str):
        return self._templar.template(trust_as_template("{{ " + name + " }}"))


# --- nvidia_driver ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("platform", "vars_file", "source", "branch"),
    [
        ("ubuntu2204", "Ubuntu.yml", "distro", "580"),
        ("ubuntu2404", "Ubuntu.yml", "distro", "580"),
        ("debian12", "Debian.yml", "distro", "535"),
        ("rocky9", "RedHat.yml", "cuda", "580"),
    ],
)
def test_driver_default_source_and_branch(platform, vars_file, source, branch):
    role = RoleVars("nvidia_driver", platform)
    assert role.vars_file == vars_file
    assert role.get("__nvidia_driver_source") == source
    assert role.get("__nvidia_driver_branch") == branch


@pytest.mark.parametrize(
    ("platform", "dist"),
    [("ubuntu2204", "ubuntu2204"), ("ubuntu2404", "ubuntu2404"), ("debian12", "debian12")],
)
def test_driver_cuda_repository_on_apt_platforms(platform, dist):
    role = RoleVars("nvidia_driver", platform, nvidia_driver_source="cuda", nvidia_driver_kernel_modules="proprietary")
    repository = RoleVars("cuda_repository", platform)
    base = "https://developer.download.nvidia.com/compute/cuda/repos"
    assert repository.get("__cuda_repository_url") == f"{base}/{dist}/x86_64"
    assert repository.get("__cuda_repository_key_url") == f"{base}/{dist}/x86_64/3bf863cc.pub"
    assert repository.get("__cuda_repository_keyring") == "/etc/apt/keyrings/nvidia-cuda.asc"
    assert role.get("__nvidia_driver_packages") == ["cuda-drivers-580"]
    assert role.get("__nvidia_driver_src")["repository"] is True


def test_driver_cuda_repository_mirror_and_arm():
    role = RoleVars(
        "nvidia_driver",
        "ubuntu2404",
        arch="aarch64",
        nvidia_driver_source="cuda",
        nvidia_driver_cuda_repo_base_url="http://mirror.example.internal/cuda/repos/",
    )
    repository = RoleVars(
        "cuda_repository",
        "ubuntu2404",
        arch="aarch64",
        nvidia_driver_cuda_repo_base_url="http://mirror.example.internal/cuda/repos/",
    )
    assert repository.get("__cuda_repository_url") == "http://mirror.example.internal/cuda/repos/ubuntu2404/sbsa"
    assert role.get("__nvidia_driver_packages") == ["nvidia-open-580"]


def test_driver_debian_own_packages():
    role = RoleVars("nvidia_driver", "debian12")
    assert role.get("__nvidia_driver_open") is False
    expected = ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1"]
    assert role.get("__nvidia_driver_packages") == expected
    assert role.get("__nvidia_driver_src")["persistenced_packages"] == ["nvidia-persistenced"]
    assert role.get("__nvidia_driver_pynvml_package") == "python3-pynvml"
    # Debian does not package Fabric Manager: the role refuses NVSwitch systems on this source.
    assert role.get("__nvidia_driver_fabricmanager_package") == ""


def test_driver_debian_open_modules():
    role = RoleVars("nvidia_driver", "debian12", nvidia_driver_kernel_modules="open")
    assert "nvidia-open-kernel-dkms" in role.get("__nvidia_driver_packages")
    assert "nvidia-kernel-dkms" not in role.get("__nvidia_driver_packages")


@pytest.mark.parametrize(("modules", "stream"), [("open", "580-open"), ("proprietary", "580-dkms")])
def test_driver_rocky_module_streams(modules, stream):
    role = RoleVars("nvidia_driver", "rocky9", nvidia_driver_kernel_modules=modules)
    assert role.get("__nvidia_driver_packages") == [f"@nvidia-driver:{stream}"]
    assert role.get("__nvidia_driver_src")["module_stream"] == f"nvidia-driver:{stream}"
    base = "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64"
    repository = RoleVars("cuda_repository", "rocky9")
    assert repository.get("__cuda_repository_url") == base
    assert repository.get("__cuda_repository_key_url") == f"{base}/D42D0685.pub"
    assert role.get("__nvidia_driver_headers_package") == f"kernel-devel-{KERNEL}"
    # Fabric Manager's RPM lost its dash with branch 580.
    assert role.get("__nvidia_driver_fabricmanager_package") == "nvidia-fabricmanager"
    older = RoleVars("nvidia_driver", "rocky9", nvidia_driver_kernel_modules=modules, nvidia_driver_branch="570")
    assert older.get("__nvidia_driver_fabricmanager_package") == "nvidia-fabric-manager"
    # No distro pynvml on RHEL: pip is used instead.
    assert role.get("__nvidia_driver_pynvml_package") == ""


def test_driver_rocky_has_no_distro_source():
    role = RoleVars("nvidia_driver", "rocky9")
    assert list(role.get("__nvidia_driver_sources")) == ["cuda"]


def pci_scan(source: str, gpus: int, nvswitches: int) -> dict:
    """An nvidia_gpu_info result with that many NVIDIA GPUs and NVSwitches on the PCI bus."""
    device = {"bus_id": "0000:00:00.0", "vendor_id": "0x10de", "device_id": "0x2330"}
    return {
        "source": source,
        "changed": False,
        "pci_devices": [device] * gpus,
        "nvswitch_devices": [device] * nvswitches,
    }


@pytest.mark.parametrize(
    ("setting", "nvswitch", "wanted"),
    [("auto", True, True), ("auto", False, False), ("always", False, True), ("never", True, False)],
)
@pytest.mark.parametrize(("scan_from", "source"), [("role", "sysfs"), ("play", "sysfs"), ("play", "nvml")])
def test_driver_fabricmanager_choice(setting, nvswitch, wanted, scan_from, source):
    scan = pci_scan(source, 8, 4 if nvswitch else 0)
    given = {"nvidia_driver_gpu_info": scan} if scan_from == "play" else {"__nvidia_driver_gpu_info": scan}
    role = RoleVars("nvidia_driver", "ubuntu2404", nvidia_driver_fabricmanager=setting, **given)
    assert role.get("__nvidia_driver_given_scan") is (scan_from == "play")
    assert role.get("__nvidia_driver_gpu_present") is True
    assert role.get("__nvidia_driver_fabricmanager_wanted") is wanted


@pytest.mark.parametrize("source", ["simulated", None])
def test_driver_reads_its_own_scan_where_the_plays_is_simulated_or_missing(source):
    # The play's result claims 8 GPUs and NVSwitches; the role's own scan of the node found none.
    given = pci_scan(source, 8, 4) if source else {}
    role = RoleVars(
        "nvidia_driver", "ubuntu2404", nvidia_driver_gpu_info=given, __nvidia_driver_gpu_info=pci_scan("sysfs", 0, 0)
    )
    assert role.get("__nvidia_driver_given_scan") is False
    assert role.get("__nvidia_driver_gpu_present") is False
    assert role.get("__nvidia_driver_nvswitch_present") is False


def test_driver_apt_pin_covers_the_driver_packages():
    role = RoleVars("nvidia_driver", "debian12")
    patterns = role.get("__nvidia_driver_apt_pin_packages").split()
    for package in ["nvidia-driver", "nvidia-kernel-dkms", "libnvidia-ml1", "firmware-nvidia-gsp"]:
        assert any(Path(package).match(p) for p in patterns), package


# --- container_toolkit -----------------------------------------------------------------------------

TOOLKIT_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]


@pytest.mark.parametrize("platform", ["ubuntu2204", "ubuntu2404", "debian12"])
def test_toolkit_apt_repository_and_pinned_packages(platform):
    role = RoleVars("container_toolkit", platform)
    assert role.vars_file == "Debian.yml"
    assert role.get("__container_toolkit_pkg_mgr") == "apt"
    assert role.get("__container_toolkit_packages") == [f"{p}=1.18.1-1" for p in TOOLKIT_PACKAGES]
    assert role.get("__container_toolkit_repo_uri") == "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
    assert role.get("container_toolkit_gpg_key_url") == "https://nvidia.github.io/libnvidia-container/gpgkey"
    assert role.get("__container_toolkit_keyring") == "/etc/apt/keyrings/nvidia-container-toolkit.asc"


def test_toolkit_rocky_repository_and_packages():
    role = RoleVars("container_toolkit", "rocky9", container_toolkit_version="1.18.0")
    assert role.vars_file == "RedHat.yml"
    assert role.get("__container_toolkit_pkg_mgr") == "dnf"
    assert role.get("__container_toolkit_packages") == [f"{p}-1.18.0-1" for p in TOOLKIT_PACKAGES]
    assert (
        role.get("__container_toolkit_repo_uri") == "https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch"
    )


def test_toolkit_mirror():
    role = RoleVars(
        "container_toolkit",
        "debian12",
        container_toolkit_repo_base_url="http://127.0.0.1:38917/",
        container_toolkit_repo_channel="experimental",
    )
    assert role.get("__container_toolkit_repo_uri") == "http://127.0.0.1:38917/experimental/deb/$(ARCH)"
    assert role.get("container_toolkit_gpg_key_url") == "http://127.0.0.1:38917/gpgkey"


@pytest.mark.parametrize(
    ("inventory", "wanted"),
    [
        ({}, False),
        ({"container_toolkit_runtime_mode": "cdi"}, True),
        ({"device_plugin_device_list_strategy": "cdi-cri"}, True),
        # A DRA node: its driver hands claimed devices over as this specification's devices too (docs/dra.md).
        ({"gpu_allocation_mode": "dra"}, True),
        ({"gpu_allocation_mode": "device_plugin"}, False),
    ],
)
def test_toolkit_cdi_specification_by_default(inventory, wanted):
    assert RoleVars("container_toolkit", "debian12", **inventory).get("container_toolkit_cdi") is wanted


# --- cuda_toolkit ----------------------------------------------------------------------------------


def test_cuda_debian_own_toolkit():
    role = RoleVars("cuda_toolkit", "debian12")
    assert role.get("__cuda_toolkit_source") == "distro"
    assert role.get("__cuda_toolkit_version") == "11.8"
    assert role.get("__cuda_toolkit_packages") == ["nvidia-cuda-toolkit"]
    assert role.get("__cuda_toolkit_src")["pin_version"] == "11.8.*"
    assert role.get("__cuda_toolkit_home") == "/usr/lib/nvidia-cuda-toolkit"


@pytest.mark.parametrize(
    ("platform", "dist", "key"),
    [
        ("ubuntu2204", "ubuntu2204", "3bf863cc.pub"),
        ("ubuntu2404", "ubuntu2404", "3bf863cc.pub"),
        ("debian12", "debian12", "3bf863cc.pub"),
        ("rocky9", "rhel9", "D42D0685.pub"),
    ],
)
def test_cuda_repository_toolkit(platform, dist, key):
    role = RoleVars("cuda_toolkit", platform, cuda_toolkit_source="cuda", cuda_toolkit_version="12.4")
    base = f"https://developer.download.nvidia.com/compute/cuda/repos/{dist}/x86_64"
    assert role.get("__cuda_toolkit_packages") == ["cuda-toolkit-12-4"]
    assert role.get("__cuda_toolkit_home") == "/usr/local/cuda-12.4"
    repository = RoleVars("cuda_repository", platform)
    assert repository.get("__cuda_repository_url") == base
    assert repository.get("__cuda_repository_key_url") == f"{base}/{key}"


@pytest.mark.parametrize("platform", ["ubuntu2204", "ubuntu2404", "rocky9"])
def test_cuda_default_version_from_repository(platform):
    role = RoleVars("cuda_toolkit", platform)
    assert role.get("__cuda_toolkit_source") == "cuda"
    assert role.get("__cuda_toolkit_packages") == ["cuda-toolkit-12-9"]


# --- unattended-upgrades blacklists -----------------------------------------------------------------
# unattended-upgrades excludes a package when re.match(entry, name) matches (its Package-Blacklist entries are
# regular expressions matched at the start of the name).


def _blacklisted(entries, name):
    return any(re.match(entry, name) for entry in entries)


def test_driver_blacklist_covers_debians_driver_packages_and_not_others():
    entries = RoleVars("nvidia_driver", "debian12").get("__nvidia_driver_unattended_upgrades_blacklist")
    for name in (
        "nvidia-driver",
        "nvidia-kernel-dkms",
        "nvidia-smi",
        "libnvidia-ml1",
        "nvidia-persistenced",
        "libegl-nvidia0",
        "libgl1-nvidia-glvnd-glx",
        "xserver-xorg-video-nvidia",
        "firmware-nvidia-gsp",
        "libcuda1",
        "libnvcuvid1",
        "cuda-drivers-580",
        "nvidia-open-580",
        "libnvidia-compute-580",
    ):
        assert _blacklisted(entries, name), name
    for name in ("linux-headers-amd64", "python3-pynvml", "containerd", "libc6"):
        assert not _blacklisted(entries, name), name


def test_toolkit_blacklist_names_its_four_packages_exactly():
    entries = RoleVars("container_toolkit", "debian12").get("__container_toolkit_unattended_upgrades")
    names = re.findall(r'"([^"]+)";', entries)
    for name in (
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
    ):
        assert _blacklisted(names, name), name
    assert not _blacklisted(names, "nvidia-container-toolkit-operator-extensions")


def test_cuda_blacklist_follows_the_hold_on_debian_and_the_repository_elsewhere():
    debian = RoleVars("cuda_toolkit", "debian12").get("__cuda_toolkit_unattended_upgrades_blacklist")
    assert "nvidia-cuda-toolkit$" in debian
    for name in ("nvidia-cuda-toolkit", "nvidia-cuda-dev", "libcudart11.0", "libcublas11", "libnvjpeg11"):
        assert _blacklisted(debian, name), name
    assert not _blacklisted(debian, "nvidia-cuda-toolkit-doc")
    ubuntu = RoleVars("cuda_toolkit", "ubuntu2404").get("__cuda_toolkit_unattended_upgrades_blacklist")
    for name in ("cuda-toolkit-12-9", "cuda-nvcc-12-9", "libcublas-12-9", "libnpp-12-9", "libnvjitlink-12-9"):
        assert _blacklisted(ubuntu, name), name


@pytest.mark.parametrize("role", ["nvidia_driver", "cuda_toolkit", "container_toolkit"])
def test_transient_apt_failures_are_told_from_others(role):
    pattern = RoleVars(role, "debian12").get(f"__{role}_apt_transient")
    assert re.search(pattern, "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 42 (python3)")
    assert re.search(pattern, "E: Failed to fetch http://deb.debian.org/debian/pool/x.deb  503  Service Unavailable")
    assert not re.search(pattern, "No package matching 'nvidia-driver' is available")


# --- every role ------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["nvidia_driver", "cuda_toolkit", "container_toolkit"])
def test_argument_specs_document_every_default(role):
    loader = DataLoader()
    defaults = loader.load_from_file(str(ROLES / role / "defaults" / "main.yml"), trusted_as_template=True)
    specs = loader.load_from_file(str(ROLES / role / "meta" / "argument_specs.yml"), trusted_as_template=True)
    spec = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(spec)
    for name, value in defaults.items():
        if "default" in spec[name]:
            assert spec[name]["default"] == value, name


# --- cuda_repository: the CUDA repository has one owner, and the repository key check exists once ------------
# nvidia_driver and cuda_toolkit both need NVIDIA's CUDA repository. When each wrote the source file from its own
# base URL variable, a mirror set for one role only made the file flip between the mirror and NVIDIA's servers on
# every run. These tests hold the agreement: one task file writes the file, every spelling of the base URL and of
# the key fingerprint reaches the same value, and differing spellings stop the play.

CUDA_NVIDIA = "https://developer.download.nvidia.com/compute/cuda/repos"
CUDA_MIRROR = "http://mirror.example.internal/cuda/repos"
CUDA_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"


def task_files_with(text: str) -> list[str]:
    return sorted(str(path.relative_to(ROLES)) for path in ROLES.glob("*/tasks/*.yml") if text in path.read_text())


def test_one_task_file_writes_the_cuda_apt_source():
    assert task_files_with("/etc/apt/sources.list.d/nvidia-cuda.sources") == ["cuda_repository/tasks/apt.yml"]


def test_one_task_file_writes_the_cuda_dnf_repository():
    assert task_files_with("NVIDIA CUDA {{") == ["cuda_repository/tasks/dnf.yml"]


def test_one_task_file_checks_a_fetched_repository_key():
    # Fetch the key, read its fingerprint, install it only if it matches: the refusal's words mark the check.
    # (container_toolkit's apt.yml also reads the key already on the node, to decide whether to fetch it again.)
    assert task_files_with("so it was not installed") == ["cuda_repository/tasks/key.yml"]


@pytest.mark.parametrize(
    "spelling", ["cuda_repository_base_url", "nvidia_driver_cuda_repo_base_url", "cuda_toolkit_repo_base_url"]
)
@pytest.mark.parametrize(("platform", "dist"), [("ubuntu2404", "ubuntu2404"), ("rocky9", "rhel9")])
def test_a_mirror_set_once_is_the_one_url(spelling, platform, dist):
    role = RoleVars("cuda_repository", platform, **{spelling: CUDA_MIRROR + "/"})
    assert role.get("__cuda_repository_conflict") == []
    assert role.get("__cuda_repository_url") == f"{CUDA_MIRROR}/{dist}/x86_64"


def test_nvidias_repository_when_nothing_is_set():
    role = RoleVars("cuda_repository", "debian12", arch="aarch64")
    assert role.get("__cuda_repository_url") == f"{CUDA_NVIDIA}/debian12/sbsa"
    assert role.get("__cuda_repository_key_url") == f"{CUDA_NVIDIA}/debian12/sbsa/3bf863cc.pub"
    assert role.get("__cuda_repository_key_fingerprint") == ""


def test_the_same_mirror_in_both_old_spellings_is_no_conflict():
    role = RoleVars(
        "cuda_repository",
        "ubuntu2204",
        nvidia_driver_cuda_repo_base_url=CUDA_MIRROR,
        cuda_toolkit_repo_base_url=CUDA_MIRROR + "/",
    )
    assert role.get("__cuda_repository_conflict") == []
    assert role.get("__cuda_repository_url") == f"{CUDA_MIRROR}/ubuntu2204/x86_64"


def test_differing_base_urls_are_one_sentence_naming_both():
    role = RoleVars(
        "cuda_repository",
        "ubuntu2204",
        nvidia_driver_cuda_repo_base_url=CUDA_MIRROR,
        cuda_toolkit_repo_base_url=CUDA_NVIDIA,
    )
    message = role.get("__cuda_repository_conflict_message")
    assert message.count(". ") == 0 and message.endswith(".")
    assert f"nvidia_driver_cuda_repo_base_url is {CUDA_MIRROR}" in message
    assert f"cuda_toolkit_repo_base_url is {CUDA_NVIDIA}" in message


def test_differing_fingerprints_are_one_sentence_naming_both():
    role = RoleVars(
        "cuda_repository",
        "rocky9",
        nvidia_driver_repo_key_fingerprint=CUDA_FINGERPRINT,
        cuda_toolkit_repo_key_fingerprint="0123456789ABCDEF0123456789ABCDEF01234567",
    )
    message = role.get("__cuda_repository_conflict_message")
    assert "nvidia_driver_repo_key_fingerprint" in message and "cuda_toolkit_repo_key_fingerprint" in message


@pytest.mark.parametrize(
    "spelling",
    ["cuda_repository_key_fingerprint", "nvidia_driver_repo_key_fingerprint", "cuda_toolkit_repo_key_fingerprint"],
)
def test_a_fingerprint_set_once_is_the_one_fingerprint_and_its_name(spelling):
    spaced = " ".join(CUDA_FINGERPRINT[i : i + 4] for i in range(0, 40, 4)).lower()
    role = RoleVars("cuda_repository", "ubuntu2404", **{spelling: spaced})
    assert role.get("__cuda_repository_conflict") == []
    assert role.get("__cuda_repository_key_fingerprint") == CUDA_FINGERPRINT
    # The key check's refusal names the variable the inventory set.
    assert role.get("__cuda_repository_key_fingerprint_name") == spelling
