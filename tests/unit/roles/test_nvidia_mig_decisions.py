# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the nvidia_mig role decides from its read (vars/main.yml), rendered with Ansible's own templar from the
role's defaults and vars, given a gpuops.k8s.nvidia_mig check-mode result and a gpuops.k8s.node_state result built
here: whether anything differs, whether a MIG mode changes (the daemon must stop), gpu-pods' command line, the
daemon's readiness URL and the config the module is given; under the DaemonSet deployment, whether the DaemonSet (as
the device_plugin role's templates render it) steps aside for the role's pause label, and gpu-pods' command line in
the node's daemon pod. The e2e tier (tests/e2e/test_site_mig.py) runs the role's tasks."""

from __future__ import annotations

import json
import re
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
CONTAINERFILE = ROLE.parents[1] / "files" / "device_plugin" / "Containerfile"
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


@pytest.mark.parametrize(
    ("before", "active", "daemonset", "stopped", "paused"),
    [
        (SEVEN, "active", False, "", False),
        (OFF, "active", False, "gpuops-device-plugin.service", False),
        (OFF, "inactive", False, "", False),
        (OFF, "inactive", True, "", True),
        (SEVEN, "inactive", True, "", False),
    ],
    ids=[
        "profiles-only",
        "mode-change",
        "mode-change-unit-stopped-before",
        "daemonset-mode-change",
        "daemonset-profiles",
    ],
)
def test_the_run_record_names_the_fence_and_what_the_run_stops_or_pauses(before, active, daemonset, stopped, paused):
    found = node(FILE, active=active)
    if daemonset:
        found["paths"]["/var/lib/gpuops/device-plugin-daemonset.json"] = FILE
    get = role_vars(__nvidia_mig_read=read(gpu(0, before, BALANCED)), __nvidia_mig_node=found)
    assert get("__nvidia_mig_run_record") == "/var/lib/gpuops/nvidia-mig-run.json"
    assert get("__nvidia_mig_run_record_wanted") == {
        "fence_taint": "gpuops.k8s/mig-reconfiguring",
        "stopped_unit": stopped,
        "paused": paused,
    }
    assert get("__nvidia_mig_fence_taint") == {"key": "gpuops.k8s/mig-reconfiguring", "effect": "NoSchedule"}


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


# --- the DaemonSet deployment -----------------------------------------------------------------------------------
DEVICE_PLUGIN = ROLE.parent / "device_plugin"
RECORD = "/var/lib/gpuops/device-plugin-daemonset.json"


def device_plugin_daemonset(template: str) -> dict[str, Any]:
    """The DaemonSet of one of the device_plugin role's templates, rendered with that role's defaults and vars."""
    loader = DataLoader()
    variables: dict[str, Any] = {"device_plugin_image": "gpu-device-plugin:test"}
    variables.update(loader.load_from_file(str(DEVICE_PLUGIN / "defaults" / "main.yml"), trusted_as_template=True))
    variables.update(loader.load_from_file(str(DEVICE_PLUGIN / "vars" / "main.yml"), trusted_as_template=True))
    templar = Templar(loader=loader, variables=variables)
    text = templar.template(trust_as_template((DEVICE_PLUGIN / "templates" / template).read_text()))
    (daemonset,) = [o for o in yaml.safe_load_all(text) if o and o["kind"] == "DaemonSet"]
    return daemonset


def daemonset_node(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "paths": {CLI: ABSENT, CONFIG_FILE: ABSENT, RECORD: FILE},
        "contents": {RECORD: json.dumps(record)},
        "units": {},
    }


@pytest.mark.parametrize("template", ["daemonset.yml.j2", "dra-daemonset.yml.j2"])
def test_both_daemonsets_step_aside_for_the_label_the_role_pauses_a_node_with(template):
    daemonset = device_plugin_daemonset(template)
    get = role_vars(__nvidia_mig_daemonset_object={"resources": [daemonset]})
    assert get("__nvidia_mig_daemonset_pausable") is True
    assert get("__nvidia_mig_daemonset_selector") == [f"app.kubernetes.io/name={daemonset['metadata']['name']}"]
    # The pod mounts the directory of the socket gpu-pods is pointed at, read-only.
    socket_dir = str(Path(role_vars()("nvidia_mig_pod_resources_socket")).parent)
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert {"name": "pod-resources", "mountPath": socket_dir, "readOnly": True} in container["volumeMounts"]
    assert {"name": "pod-resources", "hostPath": {"path": socket_dir, "type": "DirectoryOrCreate"}} in daemonset[
        "spec"
    ]["template"]["spec"]["volumes"]


def test_a_daemonset_without_the_pause_affinity_or_not_in_the_api_cannot_be_paused():
    daemonset = device_plugin_daemonset("daemonset.yml.j2")
    del daemonset["spec"]["template"]["spec"]["affinity"]
    assert (
        role_vars(__nvidia_mig_daemonset_object={"resources": [daemonset]})("__nvidia_mig_daemonset_pausable") is False
    )
    assert role_vars(__nvidia_mig_daemonset_object={"resources": []})("__nvidia_mig_daemonset_pausable") is False
    # A second term that does not exclude the label lets the pod stay on a labelled node.
    daemonset = device_plugin_daemonset("daemonset.yml.j2")
    terms = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    terms["nodeSelectorTerms"].append({"matchExpressions": [{"key": "zone", "operator": "Exists"}]})
    assert (
        role_vars(__nvidia_mig_daemonset_object={"resources": [daemonset]})("__nvidia_mig_daemonset_pausable") is False
    )


def test_the_node_is_in_the_daemonset_deployment_by_its_record():
    record = {"namespace": "gpuops-system", "daemonset": "gpuops-dra-plugin", "allocation_mode": "dra"}
    get = role_vars(__nvidia_mig_node=daemonset_node(record))
    assert get("__nvidia_mig_in_daemonset") is True
    assert get("__nvidia_mig_daemonset") == record
    assert role_vars(__nvidia_mig_node=node(FILE))("__nvidia_mig_in_daemonset") is False


@pytest.mark.parametrize("template", ["daemonset.yml.j2", "dra-daemonset.yml.j2"])
def test_gpu_pods_runs_in_the_pod_with_the_arguments_its_container_runs_the_daemon_with(template):
    container = device_plugin_daemonset(template)["spec"]["template"]["spec"]["containers"][0]
    get = role_vars(
        __nvidia_mig_read=read(gpu(0, SEVEN, SEVEN), gpu(1, OFF, SEVEN)),
        __nvidia_mig_daemonset_pod={"spec": {"containers": [container]}},
    )
    argv = get("__nvidia_mig_pod_gpu_pods_argv")
    # The image's entrypoint (files/device_plugin/Containerfile), where the container names no command.
    entrypoint = re.search(r"^ENTRYPOINT (.*)$", CONTAINERFILE.read_text(), re.MULTILINE)
    assert entrypoint is not None and argv[:3] == json.loads(entrypoint.group(1))
    assert argv[3] == "gpu-pods"
    assert argv[4:-3] == container["args"]
    assert argv[-3:] == ["--socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "--gpu=GPU-1"]
    own = dict(container, command=["/usr/local/bin/gpu-device-plugin"])
    get = role_vars(
        __nvidia_mig_read=read(gpu(0, OFF, SEVEN)), __nvidia_mig_daemonset_pod={"spec": {"containers": [own]}}
    )
    assert get("__nvidia_mig_pod_gpu_pods_argv")[:2] == ["/usr/local/bin/gpu-device-plugin", "gpu-pods"]


def test_the_pods_to_evict_come_from_the_pod_under_the_daemonset_deployment():
    found = {"stdout": json.dumps({"pods": [{"namespace": "default", "name": "a"}]})}
    record = {"namespace": "gpuops-system", "daemonset": "gpuops-device-plugin"}
    get = role_vars(
        __nvidia_mig_node=daemonset_node(record),
        __nvidia_mig_found_pods={"skipped": True},
        __nvidia_mig_found_pods_in_pod=found,
    )
    assert get("__nvidia_mig_pods") == [{"namespace": "default", "name": "a"}]
    get = role_vars(__nvidia_mig_node=node(FILE), __nvidia_mig_found_pods=found, __nvidia_mig_found_pods_in_pod={})
    assert get("__nvidia_mig_pods") == [{"namespace": "default", "name": "a"}]
