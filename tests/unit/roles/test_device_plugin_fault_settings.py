"""The device_plugin role's part of the GPU fault settings: the daemon's config file carries the XID classes of the
inventory (gpu_remediation_xid_classes), the alert webhook and a health file of the user's own, and is the same
file as before when none is set (so a node converged earlier is not changed, nor its daemon restarted)."""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLE = Path(__file__).resolve().parents[3] / "roles" / "device_plugin"


class RoleVars:
    """The role's defaults, the inventory's values over them and its vars/main.yml, as a play would see them."""

    def __init__(self, **inventory: object) -> None:
        loader = DataLoader()
        variables: dict = {}
        variables.update(loader.load_from_file(str(ROLE / "defaults" / "main.yml"), trusted_as_template=True))
        variables.update(inventory)
        variables.update(loader.load_from_file(str(ROLE / "vars" / "main.yml"), trusted_as_template=True))
        self._templar = Templar(loader=loader, variables=variables)

    def get(self, name: str):
        return self._templar.template(trust_as_template("{{ " + name + " }}"))


def config_of(**inventory):
    return yaml.safe_load(RoleVars(**inventory).get("__device_plugin_config_text"))


def test_without_fault_settings_the_config_is_device_plugin_config():
    assert config_of() == {"version": "v1", "flags": {"migStrategy": "none"}}
    assert RoleVars().get("__device_plugin_health_dir") == "/var/lib/gpuops"


def test_the_inventorys_xid_classes_webhook_and_health_file_reach_the_daemon():
    config = config_of(
        gpu_remediation_xid_classes={63: "reset", 79: "replace"},
        device_plugin_alert_webhook="http://eda.example:5000/endpoint",
        device_plugin_alert_webhook_token_file="/etc/gpuops/alert-token",
        device_plugin_health_file="/srv/gpuops/health.json",
        device_plugin_config={"version": "v1", "flags": {"migStrategy": "single"}, "gpuops": {"initRetrySeconds": 5}},
    )
    assert config == {
        "version": "v1",
        "flags": {"migStrategy": "single"},
        "gpuops": {
            "initRetrySeconds": 5,
            "xidClasses": {63: "reset", 79: "replace"},
            "alertWebhook": "http://eda.example:5000/endpoint",
            "alertWebhookTokenFile": "/etc/gpuops/alert-token",
            "healthFile": "/srv/gpuops/health.json",
        },
    }
    assert RoleVars(device_plugin_health_file="off").get("__device_plugin_health_dir") == ""


def test_the_role_variable_wins_over_the_inventory_variable():
    config = config_of(gpu_remediation_xid_classes={63: "reset"}, device_plugin_xid_classes={13: "device"})
    assert config["gpuops"] == {"xidClasses": {13: "device"}}
