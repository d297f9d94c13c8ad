# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the nvidia_mig role decides from its read (vars/main.yml), rendered with Ansible's own templar from the
role's defaults and vars, given a gpuops.k8s.nvidia_mig check-mode result and a gpuops.k8s.node_state result built
here: whether anything differs, whether a MIG mode changes (the daemon must stop), gpu-pods' command line, the
daemon's readiness URL and the config the module is given. The e2e tier (tests/e2e/test_site_mig.py) runs the
role's tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template

# The config document is read with the file lookup.
init_plugin_loader()

ROLE = Path(__file__).resolve().parents[3] / "roles" / "nvidia_mig"
CLI = "/opt/gpuops/device-plugin/venv/bin/gpu-device-plugin"
CONFIG_FILE = "/etc/gpuops/device-plugin/config.yaml"
ABSENT = {"type": "absent"}
FILE = {"type": "file", "mode": "0644", "owner": "root", "group": "root"}


def role_vars(**given: Any):
    """The role's variables as its tasks see them, with GIVEN as inventory and registered results."""
    loader = DataLoader()
    variables: dict[str, Any] = {"role_path": str(ROLE)}
    variables.update(loader.load_from_file(str(ROLE / "defaults" / "main.yml"), trusted_as_template=True))
    variables.update(given)
    variables.update(loader.load_from_file(str(ROLE / "vars" / "main.yml"), trusted_as_template=True))
    templar = Templar(loader=loader, variables=variables)
    return lambda name: templar.template(trust_as_template("{{ " + name + " }}"))


def layout(enabled: bool, devices: dict[str, int] | None = None, pending: bool = False) -> dict[str, Any]:
    return {"mig_enabled": enabled, "mig_pending": pending, "devices": devices or {}}


def gpu(index: int, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "before": before,
        "after": after,
        "changed": before != after,
        "reset_required": False,
    }


def read(*gpus: dict[str, Any]) -> dict[str, Any]:
    return {"gpus": list(gpus), "changed_gpus": [g["uuid"] for g in gpus if g["changed"]]}


SEVEN = layout(True, {"1g.10gb": 7})
BALANCED = layout(True, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
OFF = layout(False)


def test_a_converged_node_differs_in_nothing_and_changes_no_mode():
    get = role_vars(__nvidia_mig_read=read(gpu(0, SEVEN, SEVEN), gpu(1, OFF, OFF)))
    assert get("__nvidia_mig_differs") is False
    assert get("__nvidia_mig_mode_changes") == []


def test_new_profile_counts_on_a_gpu_in_mig_mode_change_no_mode():
    get = role_vars(__nvidia_mig_read=read(gpu(0, SEVEN, BALANCED), gpu(1, OFF, OFF)))
    assert get("__nvidia_mig_differs") is True
    assert get("__nvidia_mig_mode_changes") == []


@pytest.mark.parametrize(
    ("before", "after"),
    [(OFF, SEVEN), (SEVEN, OFF), (layout(False, pending=True), OFF)],
    ids=["mig-on", "mig-off", "pending-from-before"],
)
def test_mig_turned_on_or_off_or_pending_from_before_is_a_mode_change(before, after):
    get = role_vars(__nvidia_mig_read=read(gpu(0, SEVEN, SEVEN), gpu(1, before, after)))
    assert [g["uuid"] for g in get("__nvidia_mig_mode_changes")] == ["GPU-1"]


def node(config_file: dict[str, Any], active: str = "active") -> dict[str, Any]:
    return {
        "paths": {CLI: FILE, CONFIG_FILE: config_file, "/var/lib/gpuops/device-plugin-daemonset.json": ABSENT},
        "units": {"gpuops-device-plugin.service": {"active_state": active}},
    }


def test_gpu_pods_asks_about_the_gpus_that_change_as_the_daemon_names_devices():
    get = role_vars(
        __nvidia_mig_read=read(gpu(0, SEVEN, SEVEN), gpu(1, OFF, SEVEN), gpu(2, OFF, SEVEN)),
        __nvidia_mig_node=node(FILE),
    )
    assert get("__nvidia_mig_gpu_pods_argv") == [
        CLI,
        "gpu-pods",
        "--socket",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "--driver-name",
        "gpu.gpuops.k8s",
        "--config-file",
        CONFIG_FILE,
        "--gpu=GPU-1",
        "--gpu=GPU-2",
    ]
    assert get("__nvidia_mig_plugin_active") is True


def test_gpu_pods_without_a_config_file_and_with_the_simulated_backend():
    get = role_vars(
        __nvidia_mig_read=read(gpu(0, OFF, SEVEN)),
        __nvidia_mig_node=node(ABSENT, active="inactive"),
        device_plugin_backend="simulated",
        device_plugin_simulated_spec="/etc/spec.yaml",
        device_plugin_dra_driver_name="gpu.example.com",
    )
    argv = get("__nvidia_mig_gpu_pods_argv")
    assert "--config-file" not in argv
    assert argv[4:] == [
        "--driver-name",
        "gpu.example.com",
        "--backend",
        "simulated",
        "--simulated-spec",
        "/etc/spec.yaml",
        "--gpu=GPU-0",
    ]
    assert get("__nvidia_mig_plugin_active") is False


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("127.0.0.1:9402", "http://127.0.0.1:9402/readyz"),
        ("0.0.0.0:9402", "http://127.0.0.1:9402/readyz"),
        (":9402", "http://127.0.0.1:9402/readyz"),
        ("[::]:9402", "http://[::1]:9402/readyz"),
        ("[fd00::1]:9402", "http://[fd00::1]:9402/readyz"),
    ],
)
def test_the_daemon_is_asked_whether_it_is_ready_where_it_listens(address, url):
    assert role_vars(device_plugin_metrics_address=address)("__nvidia_mig_health_url") == url


def test_the_shipped_config_unless_another_file_or_a_document_is_given(tmp_path: Path):
    shipped = yaml.safe_load((ROLE / "files" / "config-default.yaml").read_text())
    assert role_vars()("__nvidia_mig_config_doc") == shipped
    own = {"version": "v1", "mig-configs": {"mine": [{"devices": "all", "mig-enabled": False}]}}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(own))
    assert role_vars(nvidia_mig_config_file=str(path))("__nvidia_mig_config_doc") == own
    inline = {"version": "v1", "mig-configs": {"inline": [{"devices": [0], "mig-enabled": True, "mig-devices": {}}]}}
    assert role_vars(nvidia_mig_config_file=str(path), nvidia_mig_config=inline)("__nvidia_mig_config_doc") == inline


def test_the_config_name_is_the_hosts_gpu_mig_config():
    assert role_vars()("nvidia_mig_config_name") == ""
    assert role_vars(gpu_mig_config="all-balanced")("nvidia_mig_config_name") == "all-balanced"
