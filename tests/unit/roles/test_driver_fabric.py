# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVLink fabric services of the nvidia_driver role (vars/main.yml: __nvidia_driver_fabric and the
__nvidia_driver_*_wanted decisions, the packages of vars/<platform>.yml, __nvidia_driver_todo.fabric), for the
fabric shapes a node can have x nvidia_driver_fabricmanager / _nvlsm / _imex.

The role's real vars are rendered with Ansible's templar (test_node_package_selection.RoleVars), given the PCI scan
gpuops.k8s.nvidia_gpu_info returns for real PCI device IDs: the fabric is the module's own decision from them
(plugins/module_utils/_nvlink_fabric.py; docs/nvlink-fabric.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.template import trust_as_template
from ansible_collections.gpuops.k8s.plugins.module_utils._nvlink_fabric import nvlink_fabric, with_generation
from ansible_collections.gpuops.k8s.tests.unit.roles.test_node_package_selection import RoleVars

# Real PCI device IDs (PCI ID database; the NVSwitch IDs of the nvidia module's NVSwitch driver).
H100_SXM = "0x2330"
H100_NVSWITCH = "0x22a3"
B200 = "0x2901"
GB200 = "0x2941"
L4 = "0x27b8"

FM = "nvidia-fabricmanager.service"
IMEX = "nvidia-imex.service"


def scan(gpu_id: str, gpus: int, nvswitches: int = 0, fabric: bool = True) -> dict:
    """nvidia_gpu_info's result (sysfs) for GPUS GPUs of GPU_ID and NVSWITCHES NVSwitches of the H100 board."""
    pci = [{"bus_id": f"0000:{0x18 + i:02x}:00.0", "vendor_id": "0x10de", "device_id": gpu_id} for i in range(gpus)]
    switches = with_generation(
        [
            {"bus_id": f"0000:{0xC0 + i:02x}:00.0", "vendor_id": "0x10de", "device_id": H100_NVSWITCH}
            for i in range(nvswitches)
        ]
    )
    result = {"source": "sysfs", "changed": False, "pci_devices": pci, "nvswitch_devices": switches}
    if fabric:
        result["nvlink_fabric"] = nvlink_fabric(pci, switches)
    return result


SHAPES = {
    "no-nvswitch": scan(L4, 2),
    "hgx-h100": scan(H100_SXM, 8, nvswitches=4),
    "hgx-b200": scan(B200, 8),
    "gb200-nvl": scan(GB200, 4),
    # A scan of another collection version, without nvlink_fabric: Fabric Manager where it found NVSwitches.
    "hgx-h100-older-scan": scan(H100_SXM, 8, nvswitches=4, fabric=False),
}
# Per shape, with every setting auto: (Fabric Manager, NVLink Subnet Manager, IMEX).
AUTO = {
    "no-nvswitch": (False, False, False),
    "hgx-h100": (True, False, False),
    "hgx-b200": (True, True, False),
    "gb200-nvl": (False, False, True),
    "hgx-h100-older-scan": (True, False, False),
}
SETTINGS = ("nvidia_driver_fabricmanager", "nvidia_driver_nvlsm", "nvidia_driver_imex")
WANTED = ("__nvidia_driver_fabricmanager_wanted", "__nvidia_driver_nvlsm_wanted", "__nvidia_driver_imex_wanted")


def role(shape: str, platform: str = "ubuntu2404", **inventory) -> RoleVars:
    return RoleVars("nvidia_driver", platform, nvidia_driver_gpu_info=SHAPES[shape], **inventory)


@pytest.mark.parametrize("shape", sorted(AUTO))
def test_auto_installs_the_services_the_nodes_fabric_needs(shape):
    decided = role(shape)
    assert decided.get("__nvidia_driver_given_scan") is True
    assert tuple(decided.get(name) for name in WANTED) == AUTO[shape]
    units = decided.get("__nvidia_driver_units_wanted")
    assert (FM in units, IMEX in units) == (AUTO[shape][0], AUTO[shape][2])


@pytest.mark.parametrize("shape", sorted(AUTO))
@pytest.mark.parametrize("index", range(3), ids=SETTINGS)
@pytest.mark.parametrize("setting", ["always", "never"])
def test_always_and_never_force_each_service_whatever_the_fabric(shape, index, setting):
    decided = role(shape, **{SETTINGS[index]: setting})
    expected = list(AUTO[shape])
    expected[index] = setting == "always"
    assert tuple(decided.get(name) for name in WANTED) == tuple(expected)


def test_the_fabric_shape_is_the_scans():
    assert role("gb200-nvl").get("__nvidia_driver_fabric") == {"shape": "nvlink5-rack", "services": ["imex"]}
    assert role("hgx-h100-older-scan").get("__nvidia_driver_fabric") == {
        "shape": "nvswitch",
        "services": ["fabricmanager"],
    }
    assert role("no-nvswitch").get("__nvidia_driver_fabric")["services"] == []


@pytest.mark.parametrize(
    ("platform", "inventory", "nvlsm", "imex"),
    [
        ("ubuntu2404", {}, "", "nvidia-imex-580"),
        ("ubuntu2204", {"nvidia_driver_branch": "570"}, "", "nvidia-imex-570"),
        ("ubuntu2404", {"nvidia_driver_source": "cuda"}, "nvlsm", "nvidia-imex"),
        ("ubuntu2404", {"nvidia_driver_source": "cuda", "nvidia_driver_branch": "570"}, "nvlsm", "nvidia-imex-570"),
        ("debian12", {}, "", ""),
        ("debian12", {"nvidia_driver_source": "cuda"}, "nvlsm", "nvidia-imex"),
        ("rocky9", {}, "nvlsm", "nvidia-imex"),
        ("rocky9", {"nvidia_driver_branch": "570"}, "nvlsm", "nvidia-imex-570"),
    ],
)
def test_packages_per_platform_and_source(platform, inventory, nvlsm, imex):
    decided = role("no-nvswitch", platform, **inventory)
    assert decided.get("__nvidia_driver_nvlsm_package") == nvlsm
    assert decided.get("__nvidia_driver_imex_package") == imex


@pytest.mark.parametrize(
    ("shape", "platform", "inventory", "unpackaged"),
    [
        ("hgx-b200", "ubuntu2404", {}, ["the NVLink Subnet Manager (nvidia_driver_nvlsm)"]),
        ("hgx-b200", "ubuntu2404", {"nvidia_driver_source": "cuda"}, []),
        ("gb200-nvl", "ubuntu2404", {}, []),
        ("gb200-nvl", "debian12", {}, ["IMEX (nvidia_driver_imex)"]),
        ("gb200-nvl", "debian12", {"nvidia_driver_source": "cuda"}, []),
        ("hgx-h100", "debian12", {"nvidia_driver_imex": "always"}, ["IMEX (nvidia_driver_imex)"]),
        ("no-nvswitch", "debian12", {}, []),
    ],
)
def test_the_role_stops_where_the_source_lacks_a_wanted_fabric_service(shape, platform, inventory, unpackaged):
    assert role(shape, platform, **inventory).get("__nvidia_driver_fabric_unpackaged") == unpackaged


def node(packages: dict) -> dict:
    """The part of node_state's read that the fabric step decides from."""
    return {
        "packages": {name: {"version": version, "held": False} for name, version in packages.items()},
        "commands": {},
    }


CUDA_DRIVER = {"nvidia-compute-utils-580": "580.95.05-1"}


@pytest.mark.parametrize(
    ("shape", "packages", "due"),
    [
        ("hgx-b200", dict(CUDA_DRIVER, nvlsm="2025.06.10-1", **{"infiniband-diags": "44.0-2"}), False),
        ("hgx-b200", dict(CUDA_DRIVER, nvlsm="2025.06.10-1"), True),
        ("hgx-b200", CUDA_DRIVER, True),
        ("gb200-nvl", dict(CUDA_DRIVER, **{"nvidia-imex": "580.95.05-1"}), False),
        ("gb200-nvl", CUDA_DRIVER, True),
        ("gb200-nvl", dict(CUDA_DRIVER, **{"nvidia-imex": "580.82.07-1"}), True),
        # Before the driver is installed, IMEX waits for its version.
        ("gb200-nvl", {}, False),
        ("hgx-h100", CUDA_DRIVER, False),
        ("no-nvswitch", CUDA_DRIVER, False),
    ],
)
def test_the_fabric_step_runs_where_the_read_finds_a_package_missing_or_imex_of_another_version(shape, packages, due):
    decided = role(shape, nvidia_driver_source="cuda", __nvidia_driver_node=node(packages))
    assert decided.get("__nvidia_driver_todo.fabric") is due


TASKS = Path(__file__).resolve().parents[3] / "roles" / "nvidia_driver" / "tasks" / "main.yml"


def assertion(name: str) -> dict:
    return next(task["ansible.builtin.assert"] for task in yaml.safe_load(TASKS.read_text()) if task["name"] == name)


@pytest.mark.parametrize(
    ("task", "shape", "words"),
    [
        (
            "Check that Fabric Manager can be installed where NVSwitch needs it",
            "hgx-b200",
            "gpu-1 needs NVIDIA Fabric Manager (its NVLink fabric is nvlink5-hgx, or nvidia_driver_fabricmanager is"
            " set), but the distro source on Debian does not package it. Use nvidia_driver_source=cuda.",
        ),
        (
            "Check that the NVLink fabric's other services can be installed where the node needs them",
            "gb200-nvl",
            "gpu-1 needs IMEX (nvidia_driver_imex) (its NVLink fabric is nvlink5-rack, or the setting asks for it), but"
            " the distro source on Debian does not package it. Use nvidia_driver_source=cuda.",
        ),
    ],
)
def test_a_source_without_a_needed_service_stops_the_role_with_one_sentence(task, shape, words):
    check = assertion(task)
    decided = role(shape, "debian12", inventory_hostname="gpu-1")
    that = check["that"] if isinstance(check["that"], str) else check["that"][0]
    assert decided.get(that) is False
    message = decided._templar.template(trust_as_template(check["fail_msg"]))
    assert " ".join(message.split()) == words


# --- IMEX's peer list and the NVLink Subnet Manager's prerequisites, from the role's one read --------------------

from ansible_collections.gpuops.k8s.tests.unit.roles.test_driver_decisions import (  # noqa: E402
    ABSENT,
    DIRECTORY,
    converged,
    written,
)

ROLE = Path(__file__).resolve().parents[3] / "roles" / "nvidia_driver"
NODES_CONFIG = "/etc/nvidia-imex/nodes_config.cfg"
UMAD_CONF = "/etc/modules-load.d/gpuops-nvlsm.conf"
UMAD_LOADED = "/sys/module/ib_umad"
PEERS = ["10.114.0.11", "10.114.0.12", "fd00:114::13"]
PEERS_TEXT = "10.114.0.11\n10.114.0.12\nfd00:114::13\n"
UMAD_TEXT = "# Managed by gpuops.k8s.nvidia_driver: the NVLink Subnet Manager needs ib_umad.\nib_umad\n"


def fabric_node(**paths: dict) -> dict:
    """node_state's read of a Debian 12 GPU machine (not a container) where the driver role converged, with the fabric
    files given."""
    read = converged()
    read["paths"].update(paths)
    return read


def decided_on(shape: str, read: dict, **inventory) -> RoleVars:
    return role(
        shape,
        "debian12",
        nvidia_driver_source="cuda",
        inventory_hostname="gpu-1",
        __nvidia_driver_node=read,
        **inventory,
    )


def test_imex_peers_are_written_one_address_a_line():
    decided = role("gb200-nvl", nvidia_driver_imex_peers=PEERS)
    assert decided.get("__nvidia_driver_imex_nodes") == PEERS_TEXT
    assert decided.get("__nvidia_driver_imex_peers_wanted") is True
    assert {NODES_CONFIG, "/etc/nvidia-imex"} <= set(decided.get("__nvidia_driver_read_paths"))


@pytest.mark.parametrize(("check_mode", "directory"), [(False, ABSENT), (True, ABSENT), (True, DIRECTORY)])
def test_check_mode_shows_the_peer_list_where_imex_has_no_directory_yet(check_mode, directory):
    """ansible.builtin.copy fails in check mode where the directory is missing: the role shows the list instead."""
    tasks = {task["name"]: task for task in yaml.safe_load((ROLE / "tasks" / "imex.yml").read_text())}
    read = fabric_node(**{NODES_CONFIG: ABSENT, "/etc/nvidia-imex": directory})
    decided = decided_on("gb200-nvl", read, nvidia_driver_imex_peers=PEERS, ansible_check_mode=check_mode)

    def runs(name):
        when = tasks[name]["when"]
        return all(decided.get(condition) for condition in ([when] if isinstance(when, str) else when))

    copies = runs("Write IMEX's peers, one address a line")
    shows = runs("Show the peer list a real run writes (check mode, no IMEX directory yet)")
    assert (copies, shows) == ((False, True) if check_mode and directory == ABSENT else (True, False))
    assert tasks["Show the peer list a real run writes (check mode, no IMEX directory yet)"]["notify"] == "Restart IMEX"


@pytest.mark.parametrize(
    ("shape", "peers", "file", "due"),
    [
        ("gb200-nvl", PEERS, ABSENT, True),
        ("gb200-nvl", PEERS, written("10.114.0.11\n10.114.0.12\n"), True),
        ("gb200-nvl", PEERS, written(PEERS_TEXT, mode="0600"), True),
        ("gb200-nvl", PEERS, written(PEERS_TEXT), False),
        # No peers: the file is left as it is, whatever it holds.
        ("gb200-nvl", [], ABSENT, False),
        ("gb200-nvl", [], written("10.0.0.1\n"), False),
        # No IMEX: no peer list.
        ("hgx-h100", PEERS, ABSENT, False),
    ],
)
def test_the_peer_list_is_written_where_the_read_finds_it_missing_or_different(shape, peers, file, due):
    decided = decided_on(shape, fabric_node(**{NODES_CONFIG: file}), nvidia_driver_imex_peers=peers)
    assert decided.get("__nvidia_driver_todo.imex_peers") is due
    assert (NODES_CONFIG in decided.get("__nvidia_driver_read_paths")) is (shape == "gb200-nvl" and bool(peers))


def test_imex_without_peers_says_that_the_file_is_left_alone():
    task = next(
        t for t in yaml.safe_load(TASKS.read_text()) if t["name"] == "Say that IMEX's peer list is left as it is"
    )
    for shape, peers, shown in (("gb200-nvl", [], True), ("gb200-nvl", PEERS, False), ("hgx-h100", [], False)):
        decided = role(shape, inventory_hostname="gpu-1", nvidia_driver_imex_peers=peers)
        assert all(decided.get(condition) for condition in task["when"]) is shown
    message = role("gb200-nvl", inventory_hostname="gpu-1")._templar.template(
        trust_as_template(task["ansible.builtin.debug"]["msg"])
    )
    assert " ".join(message.split()) == (
        "nvidia_driver_imex_peers is empty, so /etc/nvidia-imex/nodes_config.cfg on gpu-1 is left as it is: IMEX"
        " starts its domain only with the compute trays' addresses there."
    )


@pytest.mark.parametrize(
    ("peers", "words"),
    [
        (
            ["10.114.0.11", "tray-02"],
            'nvidia_driver_imex_peers has "tray-02", which is not an IPv4 or IPv6 address: give each compute tray of'
            " the NVLink domain by its address, one address an entry.",
        ),
        (
            ["10.114.0.0/24", "10.114.0.256", "fd00::1"],
            'nvidia_driver_imex_peers has "10.114.0.0/24", "10.114.0.256", which are not IPv4 or IPv6 addresses: give'
            " each compute tray of the NVLink domain by its address, one address an entry.",
        ),
    ],
)
def test_peers_that_are_not_addresses_stop_the_role_with_one_sentence(peers, words):
    check = assertion("Check IMEX's peers")
    decided = role("gb200-nvl", nvidia_driver_imex_peers=peers)
    assert decided.get(check["that"]) is False
    message = decided._templar.template(trust_as_template(check["fail_msg"]))
    assert message == words


def test_addresses_pass_the_check():
    assert role("gb200-nvl", nvidia_driver_imex_peers=PEERS).get(assertion("Check IMEX's peers")["that"]) is True


def test_a_changed_peer_list_asks_for_an_imex_restart_and_restarts_nothing():
    tasks = yaml.safe_load((ROLE / "tasks" / "imex.yml").read_text())
    write = next(task for task in tasks if "ansible.builtin.copy" in task)
    assert write["notify"] == "Restart IMEX"
    handlers = {handler["name"]: handler for handler in yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())}
    # A restart stops the node's multi-node NVLink jobs: the handler says so and acts on nothing.
    assert set(handlers["Restart IMEX"]) == {"name", "ansible.builtin.debug", "when"}
    text = handlers["Restart IMEX"]["ansible.builtin.debug"]["msg"]
    assert "systemctl restart {{ __nvidia_driver_imex_service }}" in text
    assert role("gb200-nvl")._templar.template(trust_as_template("{{ __nvidia_driver_imex_service }}")) == "nvidia-imex"
    # Where the module can be loaded and the read found IMEX's unit; not where check mode only pretended to install it.
    for unit, restarts in ((written("[Unit]\n"), True), (ABSENT, False)):
        read = fabric_node(**{"/lib/systemd/system/nvidia-imex.service": unit})
        decided = decided_on("gb200-nvl", read, nvidia_driver_imex_peers=PEERS)
        assert all(decided.get(condition) for condition in handlers["Restart IMEX"]["when"]) is restarts


# The NVLink Subnet Manager (HGX B200/B300): infiniband-diags beside nvlsm, ib_umad loaded now and at boot.
CUDA_B200 = dict(CUDA_DRIVER, nvlsm="2025.06.10-1")


def with_packages(read: dict, packages: dict) -> dict:
    read["packages"].update({name: {"version": version, "held": False} for name, version in packages.items()})
    return read


@pytest.mark.parametrize(
    ("packages", "due"),
    [
        (dict(CUDA_B200, **{"infiniband-diags": "44.0-2"}), False),
        (CUDA_B200, True),
    ],
)
def test_infiniband_diags_is_installed_with_the_nvlink_subnet_manager(packages, due):
    decided = decided_on("hgx-b200", with_packages(fabric_node(), packages))
    assert "infiniband-diags" in decided.get("__nvidia_driver_read_packages")
    assert decided.get("__nvidia_driver_todo.fabric") is due


def test_no_nvlink_subnet_manager_no_prerequisites():
    decided = decided_on("gb200-nvl", fabric_node())
    assert "infiniband-diags" not in decided.get("__nvidia_driver_read_packages")
    assert UMAD_LOADED not in decided.get("__nvidia_driver_read_paths")
    assert decided.get("__nvidia_driver_todo.nvlsm_umad") is False


@pytest.mark.parametrize(
    ("conf", "loaded", "changes", "due"),
    [
        (written(UMAD_TEXT), DIRECTORY, {}, False),
        (ABSENT, DIRECTORY, {}, True),
        (written("ib_umad\n"), DIRECTORY, {}, True),
        (written(UMAD_TEXT), ABSENT, {}, True),
        # In a container ib_umad is the host's to load: only the boot file is the role's.
        (written(UMAD_TEXT), ABSENT, {"/.dockerenv": written("")}, False),
    ],
)
def test_ib_umad_is_loaded_now_and_at_boot_where_the_read_finds_it_missing(conf, loaded, changes, due):
    read = fabric_node(**{UMAD_CONF: conf, UMAD_LOADED: loaded}, **changes)
    decided = decided_on("hgx-b200", read)
    assert {UMAD_CONF, UMAD_LOADED} <= set(decided.get("__nvidia_driver_read_paths"))
    assert decided.get("__nvidia_driver_nvlsm_modules") == UMAD_TEXT
    assert decided.get("__nvidia_driver_todo.nvlsm_umad") is due


def test_a_converged_fabric_node_has_no_fabric_step_to_do():
    read = with_packages(
        fabric_node(**{UMAD_CONF: written(UMAD_TEXT), UMAD_LOADED: DIRECTORY, NODES_CONFIG: written(PEERS_TEXT)}),
        dict(CUDA_B200, **{"infiniband-diags": "44.0-2", "nvidia-imex": "580.95.05-1"}),
    )
    for shape in ("hgx-b200", "gb200-nvl"):
        decided = decided_on(shape, read, nvidia_driver_imex_peers=PEERS)
        for step in ("fabric", "nvlsm_umad", "imex_peers"):
            assert decided.get(f"__nvidia_driver_todo.{step}") is False, (shape, step)
