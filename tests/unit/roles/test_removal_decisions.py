# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the absent states decide from their reads of the node, rendered with Ansible's templar from the roles' real
vars files (test_node_package_selection.RoleVars), given gpuops.k8s.node_state results built here:

- container_toolkit (tasks/absent.yml): which of the role's files go, and which stay with a sentence because someone
  changed them since (a file that no longer begins with the role's line; a key neither the role's record nor the
  pinned fingerprint names);
- device_plugin (tasks/os_packages_absent.yml): the recorded packages go only where apt's simulated removal would take
  nothing else.

The e2e tier (tests/e2e/test_site.py) runs playbooks/remove.yml on a lab node converged by site.yml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.gpuops.k8s.tests.unit.roles.rendering import role_file
from ansible_collections.gpuops.k8s.tests.unit.roles.test_node_package_selection import RoleVars

ROLES = Path(__file__).resolve().parents[3] / "roles"

SOURCES = "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"
PREF = "/etc/apt/preferences.d/gpuops-nvidia-container-toolkit.pref"
UNATTENDED = "/etc/apt/apt.conf.d/51gpuops-container-toolkit-unattended-upgrades"
KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit.asc"
CDI = "/var/run/cdi/nvidia.yaml"
RECORD = "/var/lib/gpuops/container-toolkit-key.json"
REPO_FILE = "/etc/yum.repos.d/nvidia-container-toolkit.repo"
RPM_KEY = "/etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit"
FILE = {"type": "file", "mode": "0644", "owner": "root", "group": "root", "checksum": "0" * 40}
ABSENT = {"type": "absent"}
KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"


def converged_debian(**changed: str) -> dict:
    """A node_state result of a Debian node the role converged (the files as the role writes them, the key its record
    names), with CHANGED's paths holding other text."""
    contents = {
        SOURCES: "# Managed by gpuops.k8s.container_toolkit\nTypes: deb\n",
        PREF: "# Managed by gpuops.k8s.container_toolkit: keeps the toolkit at 1.18.1-1.\nPackage: x\n",
        UNATTENDED: "// Managed by gpuops.k8s.container_toolkit: unattended-upgrades leaves ...\n",
        KEYRING: "-----BEGIN PGP PUBLIC KEY BLOCK-----\n",
    }
    contents.update(changed)
    return {
        "paths": {path: FILE for path in (SOURCES, PREF, UNATTENDED, KEYRING, CDI, RECORD)},
        "contents": contents,
        "packages": {},
        "record": {"current": True, "key": KEY_URL, "differs": []},
    }


def toolkit(node: dict, platform: str = "debian12", **inventory) -> RoleVars:
    return RoleVars("container_toolkit", platform, __container_toolkit_node=node, **inventory)


def test_a_converged_node_loses_every_file_of_the_role_and_keeps_nothing_to_say():
    role = toolkit(converged_debian())
    assert role.get("__container_toolkit_absent_remove") == [SOURCES, PREF, UNATTENDED, KEYRING, CDI, RECORD]
    assert role.get("__container_toolkit_absent_left") == []


@pytest.mark.parametrize("path", [SOURCES, PREF, UNATTENDED])
def test_a_file_someone_rewrote_stays_and_is_named(path):
    role = toolkit(converged_debian(**{path: "deb http://mirror.example.com/nvidia /\n"}))
    assert path not in role.get("__container_toolkit_absent_remove")
    (left,) = role.get("__container_toolkit_absent_left")
    assert left.startswith(f"{path} does not begin with the line the role writes")
    assert left.endswith("someone changed or wrote it, so it stays")


def test_a_key_the_record_no_longer_names_stays_and_is_named():
    node = converged_debian()
    node["record"] = {"current": False, "key": KEY_URL, "differs": [KEYRING]}
    role = toolkit(node)
    assert KEYRING not in role.get("__container_toolkit_absent_remove")
    assert role.get("__container_toolkit_absent_left") == [
        f"{KEYRING} is not the key the role installed (its record, or the pinned fingerprint, names another): it stays"
    ]


@pytest.mark.parametrize(("fingerprint_read", "goes"), [(FINGERPRINT, True), ("0" * 40, False)])
def test_with_a_pinned_fingerprint_the_key_goes_only_where_it_is_that_key(fingerprint_read, goes):
    node = converged_debian()
    node["record"] = {"current": False, "key": None, "differs": []}  # no record: the role records no pinned key
    gpg = {"stdout": f"pub:-:4096:1:DDCAE044F796ECB0:1:::-:::scESC::::::23::0:\nfpr:::::::::{fingerprint_read}:\n"}
    role = toolkit(node, container_toolkit_repo_key_fingerprint=FINGERPRINT, __container_toolkit_installed_key=gpg)
    assert (KEYRING in role.get("__container_toolkit_absent_remove")) is goes
    assert (role.get("__container_toolkit_absent_left") == []) is goes


def test_a_node_the_role_never_touched_has_nothing_to_remove():
    node = {
        "paths": {path: ABSENT for path in (SOURCES, PREF, UNATTENDED, KEYRING, CDI, RECORD)},
        "contents": {path: None for path in (SOURCES, PREF, UNATTENDED, KEYRING)},
        "packages": {name: {"version": None, "held": False} for name in ("nvidia-container-toolkit",)},
        "record": {"current": False, "key": None, "differs": []},
    }
    role = toolkit(node)
    assert role.get("__container_toolkit_absent_remove") == []
    assert role.get("__container_toolkit_absent_left") == []
    assert role.get("__container_toolkit_installed") == []


def test_on_rhel_the_repository_file_yum_repository_wrote_goes():
    node = {
        "paths": {REPO_FILE: FILE, RPM_KEY: ABSENT, CDI: ABSENT, RECORD: ABSENT},
        "contents": {REPO_FILE: "[nvidia-container-toolkit]\nbaseurl = https://x\n", RPM_KEY: None},
        "packages": {"nvidia-container-toolkit": {"version": "1.18.1-1", "held": None}},
        "record": {"current": False, "key": None, "differs": []},
    }
    role = toolkit(node, "rocky9")
    assert role.get("__container_toolkit_absent_remove") == [REPO_FILE]
    assert role.get("__container_toolkit_installed") == ["nvidia-container-toolkit"]


RECORDED = "python3-pip\npython3-pip-whl\npython3-venv\npython3.11-venv\n"


def plugin(simulated: str):
    """The device_plugin role's variables (its defaults and vars/main.yml) after its read found RECORDED and apt's
    simulated removal printed SIMULATED."""
    variables = role_file(ROLES / "device_plugin" / "defaults" / "main.yml")
    variables["__device_plugin_probe"] = {"contents": {"/var/lib/gpuops/device-plugin-os-packages": RECORDED}}
    variables["__device_plugin_os_simulated"] = {"stdout": simulated}
    variables.update(role_file(ROLES / "device_plugin" / "vars" / "main.yml"))
    templar = Templar(loader=DataLoader(), variables=variables)
    return lambda name: templar.template(trust_as_template("{{ " + name + " }}"))


def test_the_recorded_packages_go_where_apt_would_take_nothing_else():
    get = plugin("Purg python3-pip [23.0.1+dfsg-1]\nPurg python3-venv [3.11.2-1+b1]\n")
    assert get("__device_plugin_os_recorded") == ["python3-pip", "python3-pip-whl", "python3-venv", "python3.11-venv"]
    assert get("__device_plugin_os_going") == ["python3-pip", "python3-venv"]
    assert get("__device_plugin_os_others") == []


def test_a_package_installed_since_that_needs_them_keeps_them():
    get = plugin("Purg python3-pip [23.0.1+dfsg-1]\nPurg python3-someones-tool [1.0]\n")
    assert get("__device_plugin_os_others") == ["python3-someones-tool"]


CONTAINERD_CONFIG = "/etc/containerd/config.toml"
WRITTEN_RECORD = "/var/lib/gpuops/containerd-config-written.json"


def runtime(record: str | None, checksum: str | None):
    """The nvidia_runtime role's variables after absent read the record of the containerd config it wrote (RECORD's
    text, or none) and the config (its checksum, or absent)."""
    variables = role_file(ROLES / "nvidia_runtime" / "defaults" / "main.yml")
    config = {"type": "absent"} if checksum is None else dict(FILE, checksum=checksum)
    variables["__nvidia_runtime_written"] = {
        "paths": {CONTAINERD_CONFIG: config},
        "contents": {WRITTEN_RECORD: record},
    }
    variables.update(role_file(ROLES / "nvidia_runtime" / "vars" / "main.yml"))
    templar = Templar(loader=DataLoader(), variables=variables)
    return lambda name: templar.template(trust_as_template("{{ " + name + " }}"))


def written(path: str = CONTAINERD_CONFIG, checksum: str = "a" * 40) -> str:
    return json.dumps({"path": path, "checksum": checksum})


@pytest.mark.parametrize(
    ("record", "checksum", "goes"),
    [
        (written(), "a" * 40, True),  # as containerd's default wrote it: it goes
        (written(), "b" * 40, False),  # changed since: it stays
        (written(path="/etc/containerd/other.toml"), "a" * 40, False),  # the record is of another file
        (None, "a" * 40, False),  # no record: the node had its config before the role
        (written(), None, False),  # gone already
    ],
)
def test_the_containerd_config_the_role_wrote_goes_only_as_it_was_written(record, checksum, goes):
    get = runtime(record, checksum)
    assert get("__nvidia_runtime_containerd_as_written") is goes
