"""The device_plugin role's part of the GPU fault settings: the daemon's config file carries the XID classes of the
inventory (gpu_remediation_xid_classes), the alert webhook and a health file of the user's own, and is the same
file as before when none is set (so a node converged earlier is not changed, nor its daemon restarted)."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def daemonset_pod(template: str, **inventory):
    """The pod spec of one of the role's DaemonSet templates, rendered with the role's defaults, INVENTORY and vars."""
    variables = RoleVars(device_plugin_image="gpu-device-plugin:test", **inventory)
    text = variables._templar.template(trust_as_template((ROLE / "templates" / template).read_text()))
    (daemonset,) = [o for o in yaml.safe_load_all(text) if o and o["kind"] == "DaemonSet"]
    return daemonset["spec"]["template"]["spec"]


def test_with_the_alert_secret_the_token_file_defaults_and_reaches_the_config():
    config = config_of(device_plugin_alert_webhook="https://eda.example:5000/", device_plugin_alert_secret="k")
    assert config["gpuops"] == {
        "alertWebhook": "https://eda.example:5000/",
        "alertWebhookTokenFile": "/etc/gpuops/alert-token",
    }
    config = config_of(device_plugin_alert_secret="k", device_plugin_alert_webhook_token_file="/srv/token")
    assert config["gpuops"] == {"alertWebhookTokenFile": "/srv/token"}
    # The secret itself is nowhere in what the node or the API server gets.
    assert "k" not in RoleVars(device_plugin_alert_secret="k").get("__device_plugin_fault_settings").values()


@pytest.mark.parametrize("template", ["daemonset.yml.j2", "dra-daemonset.yml.j2"])
def test_in_daemonset_mode_the_pod_mounts_the_nodes_token_file_alone_at_the_path_the_config_names(template):
    pod = daemonset_pod(template, device_plugin_alert_secret="k", device_plugin_alert_webhook="https://eda.example/")
    (container,) = pod["containers"]
    assert {"name": "alert-token", "mountPath": "/etc/gpuops/alert-token", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": "alert-token", "hostPath": {"path": "/etc/gpuops/alert-token", "type": "File"}} in pod["volumes"]
    # Without a token file there is nothing to mount.
    pod = daemonset_pod(template)
    assert not any(volume["name"] == "alert-token" for volume in pod["volumes"])
