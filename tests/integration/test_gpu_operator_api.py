"""NVIDIA's GPU Operator on a node, against a real kube-apiserver: site.yml stops before anything changes where the
Operator manages what the run would manage, honours the nvidia.com/gpu.deploy.* labels a person set to "false", and
takes a node over when told to (gpuops.k8s.gpu_node_labels, tasks_from operator; docs/gpu-operator.md).

The API server is real (the control_plane fixture's, conftest.py). The Operator is not: it needs kubelets and
NVIDIA's images. The test stands one in as an Operator-managed node looks through the API - the Operator's deploy
labels on the Node, and in its namespace its operand DaemonSets by their names with a pod of each bound to the node,
owned and labelled as the Operator's manifests have them (the facts are in the gpu_operator_hold filter's
documentation, from the Operator's source). No controller manager runs, so the test also does the DaemonSet
controller's part where one is needed: it removes an operand's pod once the node's label no longer selects it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import yaml
from kubernetes import client, config
from local_api import token_admin_api_server, wait_for
from playbook_env import REPO, playbook_env

TOKEN = "gpuops-operator-test-admin-token"
OPERATOR_NS = "gpu-operator"
TAKEN = "gpuops.k8s/taken-from-gpu-operator"
SPEC = REPO / "tests/fixtures/simulated/h100x8.yaml"

API_SERVER = token_admin_api_server(TOKEN)


@pytest.fixture(scope="module")
def api(control_plane):
    work = control_plane.work
    kubeconfig = control_plane.kubeconfig(work / "kubeconfig", token=TOKEN)
    api_client = config.new_client_from_config(str(kubeconfig))
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": OPERATOR_NS}})
    # The ServiceAccount admission plugin wants the namespace's default account (no controller manager makes it).
    core.create_namespaced_service_account(OPERATOR_NS, {"metadata": {"name": "default"}})
    return {
        "kubeconfig": str(kubeconfig),
        "core": core,
        "apps": client.AppsV1Api(api_client),
        "work": work,
        "env": playbook_env(),
    }


def operand_daemonset(api, name):
    """The Operator's DaemonSet ``name`` (selecting nodes by its deploy label), created once; returns its uid."""
    component = {"nvidia-driver-daemonset": "driver", "nvidia-container-toolkit-daemonset": "container-toolkit"}.get(
        name, name.replace("nvidia-", "").replace("-daemonset", "")
    )
    try:
        return api["apps"].read_namespaced_daemon_set(name, OPERATOR_NS).metadata.uid
    except client.ApiException as error:
        if error.status != 404:
            raise
    labels = {"app": name}
    body = {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {f"nvidia.com/gpu.deploy.{component}": "true"},
                    "containers": [{"name": name, "image": f"nvcr.io/nvidia/{name}:stand-in"}],
                },
            },
        },
    }
    return api["apps"].create_namespaced_daemon_set(OPERATOR_NS, body).metadata.uid


def operator_node(api, node, labels, operands=()):
    """A Node with ``labels`` and, for each DaemonSet name in ``operands``, its pod bound to the node."""
    api["core"].create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node, **labels}}})
    for name in operands:
        uid = operand_daemonset(api, name)
        api["core"].create_namespaced_pod(
            OPERATOR_NS,
            {
                "metadata": {
                    "name": f"{name}-{node}",
                    "labels": {"app": name},
                    "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": uid, "controller": True}
                    ],
                },
                "spec": {"nodeName": node, "containers": [{"name": name, "image": f"nvcr.io/nvidia/{name}:stand-in"}]},
            },
        )


def run(api, node, playbook, extra, *args):
    """ansible-playbook on localhost as ``node``; (rc, the messages of the failed tasks, the names of the tasks that ran
    and changed, the whole report)."""
    extra_file = api["work"] / f"extra-{node}.json"
    extra_file.write_text(
        json.dumps(
            {
                "ansible_python_interpreter": sys.executable,
                "gpu_node_labels_node_name": node,
                "gpu_node_labels_kubeconfig": api["kubeconfig"],
                **extra,
            }
        )
    )
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook), "-e", f"@{extra_file}", *args]
    done = subprocess.run(argv, capture_output=True, text=True, env=api["env"], timeout=600, check=False)
    report = json.loads(done.stdout)
    # Task names without the role's prefix ("gpuops.k8s.gpu_node_labels : ").
    results = [
        (t["task"]["name"].split(" : ", 1)[-1], t["hosts"].get("localhost", {}))
        for p in report["plays"]
        for t in p["tasks"]
    ]
    failed = [r.get("msg", "") for _name, r in results if r.get("failed")]
    changed = [name for name, r in results if r.get("changed")]
    return done.returncode, failed, changed, report


def entry_point(api, node, *args, **settings):
    """The role's operator entry point, as site.yml runs it, with ``settings``."""
    playbook = api["work"] / "operator-play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "operator",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Weigh the Operator",
                            "ansible.builtin.include_role": {
                                "name": "gpuops.k8s.gpu_node_labels",
                                "tasks_from": "operator",
                            },
                        },
                        {"name": "After", "ansible.builtin.debug": {"msg": "{{ gpu_node_labels_operator_hold }}"}},
                    ],
                }
            ]
        )
    )
    return run(api, node, playbook, settings, *args)


def node_labels(api, node):
    meta = api["core"].read_node(node).metadata
    return meta.labels or {}, meta.annotations or {}


def test_site_yml_stops_on_an_operator_node_before_anything_changes_with_one_sentence(api):
    operator_node(
        api,
        "op-1",
        {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.deploy.driver": "true",
            "nvidia.com/gpu.deploy.container-toolkit": "true",
            "nvidia.com/gpu.deploy.dcgm-exporter": "true",
        },
        ("nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset", "nvidia-device-plugin-daemonset"),
    )
    before = api["core"].read_node("op-1").metadata.resource_version
    # Every stage on, as site.yml runs by default; root already, so no sudo.
    rc, failed, changed, report = run(
        api, "op-1", REPO / "playbooks/site.yml", {"gpuops_hosts": "localhost", "ansible_become": False}
    )
    ran = [t["task"]["name"] for p in report["plays"] for t in p["tasks"]]
    assert rc == 2 and changed == []
    assert failed == [
        "op-1 is left untouched: NVIDIA's GPU Operator manages its driver, container-toolkit, device-plugin"
        " (label nvidia.com/gpu.deploy.driver=true; pod gpu-operator/nvidia-driver-daemonset-op-1;"
        " label nvidia.com/gpu.deploy.container-toolkit=true; pod gpu-operator/nvidia-container-toolkit-daemonset-op-1;"
        " pod gpu-operator/nvidia-device-plugin-daemonset-op-1), which this run's driver, toolkit, runtime, plugin"
        " stage(s) would manage too; switch them off for the Operator on the node (nvidia.com/gpu.deploy.driver=false"
        " nvidia.com/gpu.deploy.container-toolkit=false nvidia.com/gpu.deploy.device-plugin=false) and run again once"
        " its pods have left, leave those stages out, or take the node over with gpu_node_labels_operator_takeover=true"
        " (site.yml: -e gpuops_operator_takeover=true), as docs/gpu-operator.md says."
    ]
    # Nothing ran after the check: no discovery, no stage.
    assert (
        "Discover the GPUs of the node" not in ran
        and ran[-1] == "gpuops.k8s.gpu_node_labels : Stop where the Operator manages what this run would manage"
    )
    assert api["core"].read_node("op-1").metadata.resource_version == before

    # upgrade_driver.yml weighs the driver alone, before its cordon: the node stays as it was.
    rc, failed, changed, _report = run(
        api,
        "op-1",
        REPO / "playbooks/upgrade_driver.yml",
        {"gpuops_hosts": "localhost", "ansible_become": False, "nvidia_driver_branch": "580"},
    )
    assert (rc, changed) == (2, []) and failed[0].startswith(
        "op-1 is left untouched: NVIDIA's GPU Operator manages its driver (label nvidia.com/gpu.deploy.driver=true;"
        " pod gpu-operator/nvidia-driver-daemonset-op-1), which this run's driver stage(s) would manage too;"
    )
    assert api["core"].read_node("op-1").metadata.resource_version == before


def test_the_stages_a_run_leaves_out_and_the_components_a_person_switched_off_are_the_collections(api):
    labels = {
        "nvidia.com/gpu.deploy.driver": "false",  # a person's: the driver is the collection's
        "nvidia.com/gpu.deploy.container-toolkit": "true",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
    }
    operator_node(api, "op-2", labels, ("nvidia-container-toolkit-daemonset",))
    rc, failed, changed, _report = entry_point(api, "op-2", gpu_node_labels_operator_stages=["driver", "plugin"])
    assert (rc, failed, changed) == (0, [], [])
    rc, failed, _changed, _report = entry_point(
        api, "op-2", gpu_node_labels_operator_stages=["driver", "runtime", "labels"]
    )
    assert rc == 2 and failed[0].startswith(
        "op-2 is left untouched: NVIDIA's GPU Operator manages its container-toolkit, gpu-feature-discovery"
    )
    assert "which this run's runtime, labels stage(s) would manage too" in failed[0]

    # site.yml's tags choose the stages: the labels stage alone meets GPU Feature Discovery, not the toolkit.
    site = REPO / "playbooks/site.yml"
    settings = {"gpuops_hosts": "localhost", "ansible_become": False, "gpuops_simulate_from": str(SPEC)}
    # The CUDA stage alone (off by default, so nothing runs but the discovery) meets nothing of the Operator's.
    rc, failed, changed, _report = run(api, "op-2", site, settings, "--tags", "cuda")
    assert (rc, failed, changed) == (0, [], [])
    rc, failed, _changed, _report = run(api, "op-2", site, settings, "--tags", "labels")
    assert rc == 2 and "manages its gpu-feature-discovery (" in failed[0] and "this run's labels stage(s)" in failed[0]


def test_a_takeover_switches_the_components_off_for_the_operator_waits_for_its_pods_and_is_recorded(api):
    labels = {"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true"}
    operator_node(api, "op-3", labels, ("nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter"))
    settings = {"gpu_node_labels_operator_stages": ["plugin"], "gpu_node_labels_operator_takeover": True}

    # Check mode says what it would write and writes nothing.
    before = api["core"].read_node("op-3").metadata.resource_version
    rc, failed, changed, _report = entry_point(api, "op-3", "--check", **settings)
    assert (rc, failed) == (0, []) and changed == [
        "Switch the Operator's components off on the Node, recording which this run took over"
    ]
    assert api["core"].read_node("op-3").metadata.resource_version == before

    # The DaemonSet controller's part: the plugin's pod goes once the node's label no longer selects it.
    def daemonset_controller():
        wait_for(
            "the deploy label off",
            lambda: node_labels(api, "op-3")[0].get("nvidia.com/gpu.deploy.device-plugin") == "false",
            timeout=120,
        )
        time.sleep(6)  # the role sees the pod still there at least once
        api["core"].delete_namespaced_pod("nvidia-device-plugin-daemonset-op-3", OPERATOR_NS, grace_period_seconds=0)

    controller = threading.Thread(target=daemonset_controller)
    controller.start()
    try:
        rc, failed, changed, report = entry_point(api, "op-3", **settings)
    finally:
        controller.join()
    assert (rc, failed) == (0, [])
    waited = [
        r
        for p in report["plays"]
        for t in p["tasks"]
        if t["task"]["name"].split(" : ", 1)[-1].startswith("Wait until")
        for r in t["hosts"].values()
    ]
    assert waited and waited[0]["attempts"] > 1
    labels_now, annotations = node_labels(api, "op-3")
    assert labels_now["nvidia.com/gpu.deploy.device-plugin"] == "false"
    assert labels_now["nvidia.com/gpu.deploy.dcgm-exporter"] == "true"  # not a component the run manages
    assert annotations[TAKEN] == "device-plugin"

    # Taken over: the next run finds nothing to take and changes nothing.
    assert entry_point(api, "op-3", **settings)[:3] == (0, [], [])


def test_pods_that_stay_after_a_takeover_stop_the_run_with_one_sentence(api):
    operator_node(api, "op-4", {"nvidia.com/gpu.deploy.driver": "true"}, ("nvidia-driver-daemonset",))
    rc, failed, _changed, _report = entry_point(
        api,
        "op-4",
        gpu_node_labels_operator_stages=["driver"],
        gpu_node_labels_operator_takeover=True,
        gpu_node_labels_operator_takeover_timeout=5,
    )
    assert rc == 2 and failed == [
        "op-4 is left as it was but for the Operator's labels: its pod gpu-operator/nvidia-driver-daemonset-op-4 still"
        " ran 5 s after this run switched driver off for the Operator; see why they stay (the Operator's DaemonSets,"
        " its controller) and run again."
    ]
    labels_now, annotations = node_labels(api, "op-4")
    assert labels_now["nvidia.com/gpu.deploy.driver"] == "false" and annotations[TAKEN] == "driver"

    # The next run repairs the half-way state: the label is off already, so the pod alone says the Operator's driver is
    # still there; once it has gone, the run goes ahead without writing anything, and the record stays.
    settings = {
        "gpu_node_labels_operator_stages": ["driver"],
        "gpu_node_labels_operator_takeover": True,
        "gpu_node_labels_operator_takeover_timeout": 5,
    }
    before = api["core"].read_node("op-4").metadata.resource_version
    rc, failed, changed, _report = entry_point(api, "op-4", **settings)
    assert (rc, changed) == (2, []) and failed[0].startswith("op-4 is left as it was but for the Operator's labels")
    api["core"].delete_namespaced_pod("nvidia-driver-daemonset-op-4", OPERATOR_NS, grace_period_seconds=0)
    assert entry_point(api, "op-4", **settings)[:3] == (0, [], [])
    assert api["core"].read_node("op-4").metadata.resource_version == before
    assert node_labels(api, "op-4")[1][TAKEN] == "driver"


def test_a_node_without_the_operator_and_one_not_registered_yet_go_ahead(api):
    api["core"].create_node({"metadata": {"name": "plain-1"}})
    for node in ("plain-1", "not-registered-1"):
        rc, failed, changed, report = entry_point(api, node)
        assert (rc, failed, changed) == (0, [], []), node
        hold = [
            t["hosts"]["localhost"]["msg"] for p in report["plays"] for t in p["tasks"] if t["task"]["name"] == "After"
        ]
        assert hold == [{"held": {}, "switched_off": [], "conflicts": [], "stages": [], "labels_off": {}}]


def test_taking_the_driver_from_a_node_with_gpu_pods_is_decided_by_the_drain_rules_before_anything_changes(api):
    operator_node(api, "op-5", {"nvidia.com/gpu.deploy.driver": "true"}, ("nvidia-driver-daemonset",))
    # A GPU workload on the node (bound to it; no kubelet runs it, which the decision does not need).
    api["core"].create_namespaced_pod(
        OPERATOR_NS,
        {
            "metadata": {"name": "train-0"},
            "spec": {
                "nodeName": "op-5",
                "containers": [
                    {"name": "cuda", "image": "cuda-app:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        },
    )
    before = api["core"].read_node("op-5")
    rc, failed, changed, _report = entry_point(
        api, "op-5", gpu_node_labels_operator_stages=["driver"], gpu_node_labels_operator_takeover=True
    )
    assert (rc, changed) == (2, []) and failed == [
        "op-5 runs 1 GPU pod(s) (gpu-operator/train-0) and this run takes the node's driver over from NVIDIA's GPU"
        " Operator, whose driver pod unloads it as it leaves; set node_drain_allowed=true (site.yml: -e"
        " gpuops_drain=true) to cordon and drain the node first, or drain it yourself and run again. "
    ]
    after = api["core"].read_node("op-5")
    assert after.metadata.resource_version == before.metadata.resource_version and not after.spec.unschedulable
