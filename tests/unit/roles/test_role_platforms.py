# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roles with platform data stop on a platform they do not support, before they load that data, and what they
support is what their meta/main.yml says.

Each role's real check (the assert task of tasks/main.yml) is rendered with Ansible's templar over the role's
defaults and vars/main.yml and the facts a machine of each platform gathers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLES_DIR = Path(__file__).resolve().parents[3] / "roles"
ROLES = ["nvidia_driver", "container_toolkit", "cuda_repository", "cuda_toolkit", "nvidia_runtime"]
CHECK = "Check that the role supports this platform"
HOST = "gpu-node-1"

# Galaxy's names in meta/main.yml, as the platforms the checks name: EL 9 is RHEL's and Rocky Linux's 9.
META_PLATFORMS = {
    ("Debian", "bookworm"): ["Debian 12"],
    ("Ubuntu", "jammy"): ["Ubuntu 22.04"],
    ("Ubuntu", "noble"): ["Ubuntu 24.04"],
    ("EL", "9"): ["RedHat 9", "Rocky 9"],
}


def facts(distribution: str, version: str, os_family: str) -> dict:
    """What ansible.builtin.setup's min subset says of a machine of this release."""
    return {
        "distribution": distribution,
        "distribution_version": version,
        "distribution_major_version": version.split(".")[0],
        "os_family": os_family,
    }


SUPPORTED = {
    "debian12": facts("Debian", "12.8", "Debian"),
    "ubuntu2204": facts("Ubuntu", "22.04", "Debian"),
    "ubuntu2404": facts("Ubuntu", "24.04", "Debian"),
    "rhel9": facts("RedHat", "9.5", "RedHat"),
    "rocky9": facts("Rocky", "9.5", "RedHat"),
}
UNSUPPORTED = {
    "debian13": (facts("Debian", "13.1", "Debian"), "Debian 13"),
    "debian11": (facts("Debian", "11.11", "Debian"), "Debian 11"),
    "ubuntu2604": (facts("Ubuntu", "26.04", "Debian"), "Ubuntu 26.04"),
    "ubuntu2210": (facts("Ubuntu", "22.10", "Debian"), "Ubuntu 22.10"),
    "rhel8": (facts("RedHat", "8.10", "RedHat"), "RedHat 8"),
    "rhel10": (facts("RedHat", "10.0", "RedHat"), "RedHat 10"),
    "amazon2023": (facts("Amazon", "2023", "RedHat"), "Amazon 2023"),
}


def load(path: Path) -> dict:
    return DataLoader().load_from_file(str(path), trusted_as_template=True)


def check_task(role: str) -> tuple[int, dict]:
    tasks = yaml.safe_load((ROLES_DIR / role / "tasks" / "main.yml").read_text())
    positions = [position for position, task in enumerate(tasks) if task.get("name") == CHECK]
    assert len(positions) == 1, f"{role}: one platform check in tasks/main.yml"
    return positions[0], tasks[positions[0]]


def checked(role: str, node_facts: dict) -> tuple[bool, str]:
    """Whether the role's platform check passes on a machine with these facts, and its message."""
    variables: dict = {}
    defaults = ROLES_DIR / role / "defaults" / "main.yml"
    if defaults.is_file():
        variables.update(load(defaults))
    variables.update(load(ROLES_DIR / role / "vars" / "main.yml"))
    variables.update(ansible_facts=dict(node_facts, architecture="x86_64"), inventory_hostname=HOST)
    templar = Templar(loader=DataLoader(), variables=variables)
    task = check_task(role)[1]["ansible.builtin.assert"]
    assert task["quiet"] is True
    passed = templar.template(trust_as_template("{{ " + task["that"] + " }}"))
    return passed, templar.template(trust_as_template(task["fail_msg"]))


@pytest.mark.parametrize("role", ROLES)
def test_supported_platforms_are_those_of_meta_main(role):
    meta = yaml.safe_load((ROLES_DIR / role / "meta" / "main.yml").read_text())
    claimed = sorted(
        name
        for platform in meta["galaxy_info"]["platforms"]
        for version in platform["versions"]
        for name in META_PLATFORMS[(platform["name"], str(version))]
    )
    supported = yaml.safe_load((ROLES_DIR / role / "vars" / "main.yml").read_text())[f"__{role}_platforms"]
    assert sorted(supported) == claimed
    nodes = SUPPORTED.values()
    ubuntu = [f"Ubuntu {node['distribution_version']}" for node in nodes if node["distribution"] == "Ubuntu"]
    others = [
        f"{node['distribution']} {node['distribution_major_version']}"
        for node in SUPPORTED.values()
        if node["distribution"] != "Ubuntu"
    ]
    assert sorted(supported) == sorted(ubuntu + others)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("platform", sorted(SUPPORTED))
def test_supported_platforms_pass(role, platform):
    assert checked(role, SUPPORTED[platform])[0] is True


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("platform", sorted(UNSUPPORTED))
def test_unsupported_platforms_stop_with_one_sentence(role, platform):
    node_facts, named = UNSUPPORTED[platform]
    passed, message = checked(role, node_facts)
    assert passed is False
    assert message == (
        f"gpuops.k8s.{role} does not support {named} (on {HOST}); it supports"
        " Debian 12, Ubuntu 22.04, Ubuntu 24.04, RedHat 9, Rocky 9."
    )


@pytest.mark.parametrize("role", ROLES)
def test_the_check_comes_before_the_platform_data(role):
    tasks = yaml.safe_load((ROLES_DIR / role / "tasks" / "main.yml").read_text())
    loads = [position for position, task in enumerate(tasks) if "ansible.builtin.include_vars" in task]
    assert loads, f"{role} loads platform data"
    assert check_task(role)[0] < min(loads)
