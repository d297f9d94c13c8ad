"""gpuops.k8s.pod_eviction against a real kube-apiserver and etcd (the control_plane fixture, conftest.py).

No kubelet and no controller manager run, so the test plays their parts where the module needs them, and
says so where it does: it sets a pod's status to Running and Ready (what a kubelet reports), writes a
PodDisruptionBudget's status (what the disruption controller computes), and finishes a graceful deletion
(what a kubelet does once the containers have stopped). Found for real with these: an eviction without a
grace period leaves a pod bound to a node in Terminating until its kubelet deletes it (the API server gives
it its terminationGracePeriodSeconds); a Pending pod is deleted without asking its budget (the API server's
rule); `grace_period: 0` removes a pod at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from local_api import token_admin_api_server, wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "gpuops-eviction-test-admin-token"
NAMESPACE = "drain"
NODE = "gpu-node-without-kubelet"

# The control_plane fixture's API server: RBAC alone, the default admission plugins, a token administrator.
API_SERVER = token_admin_api_server(TOKEN)


@pytest.fixture(scope="module")
def cluster(control_plane):
    kubeconfig = control_plane.kubeconfig(control_plane.work / "kubeconfig", token=TOKEN)
    api = config.new_client_from_config(str(kubeconfig))
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    # The ServiceAccount admission plugin wants the namespace's default account (no controller manager makes it).
    core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
    return {"kubeconfig": str(kubeconfig), "api": api, "core": core, "policy": client.PolicyV1Api(api)}


class Eviction:
    """plugins/modules/pod_eviction.py run as Ansible runs it: its own interpreter, arguments in a JSON file."""

    def __init__(self, cluster, collection_root, tmp_path):
        self.cluster, self.collection_root, self.tmp_path = cluster, collection_root, tmp_path
        self.calls = 0

    def start(self, check=False, **args):
        self.calls += 1
        module_args = dict(args, kubeconfig=self.cluster["kubeconfig"], _ansible_check_mode=check)
        args_file = self.tmp_path / f"args-{self.calls}.json"
        args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": module_args}))
        env = dict(os.environ, PYTHONPATH=str(self.collection_root))
        return subprocess.Popen(
            [sys.executable, str(ROOT / "plugins/modules/pod_eviction.py"), str(args_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    @staticmethod
    def result(proc, expect_failure=False):
        out, err = proc.communicate(timeout=300)
        try:
            result = json.loads(out)
        except ValueError as error:
            raise AssertionError(f"the module printed no JSON: rc={proc.returncode}\n{out}\n{err}") from error
        assert bool(result.get("failed")) is expect_failure, result
        return result

    def __call__(self, check=False, expect_failure=False, **args):
        return self.result(self.start(check=check, **args), expect_failure)


@pytest.fixture
def evict(cluster, collection_root, tmp_path):
    return Eviction(cluster, collection_root, tmp_path)


def make_pod(cluster, name, labels=None, running=False, **metadata):
    """A pod bound to a node whose kubelet never comes; its uid."""
    pod = cluster["core"].create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": name, "labels": labels or {}, **metadata},
            "spec": {"nodeName": NODE, "containers": [{"name": "cuda", "image": "cuda-app:1"}]},
        },
    )
    if running:
        # The kubelet's part: the pod runs and is Ready (a Pending pod is evicted whatever its budget says).
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cluster["core"].patch_namespaced_pod_status(
            name,
            NAMESPACE,
            {
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                }
            },
        )
    return pod.metadata.uid


def read_pod(cluster, name):
    try:
        return cluster["core"].read_namespaced_pod(name, NAMESPACE)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def finish_deletion(cluster, name):
    """The kubelet's part once the containers have stopped: delete with no grace period left."""
    cluster["core"].delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def ref(name, uid=None):
    found = {"namespace": NAMESPACE, "name": name}
    return found if uid is None else dict(found, uid=uid)


def test_check_mode_evicts_nothing_then_the_pods_are_evicted_and_a_second_run_changes_nothing(cluster, evict):
    uids = {name: make_pod(cluster, name) for name in ("job-a", "job-b")}
    versions = {name: read_pod(cluster, name).metadata.resource_version for name in uids}
    pods = [ref("job-a"), ref("job-b")]

    result = evict(check=True, pods=pods, grace_period=0)
    assert result["changed"] is True
    assert result["evicted"] == [ref("job-a", uids["job-a"]), ref("job-b", uids["job-b"])]
    assert {name: read_pod(cluster, name).metadata.resource_version for name in uids} == versions

    result = evict(pods=pods, grace_period=0)
    assert result["changed"] is True
    assert result["evicted"] == [ref("job-a", uids["job-a"]), ref("job-b", uids["job-b"])]
    assert read_pod(cluster, "job-a") is None and read_pod(cluster, "job-b") is None

    result = evict(pods=pods, grace_period=0)
    assert result["changed"] is False
    assert (result["evicted"], result["already_gone"]) == ([], pods)


def test_a_pod_already_gone_and_a_pod_replaced_under_its_name_are_no_change(cluster, evict):
    old = make_pod(cluster, "worker-0")
    finish_deletion(cluster, "worker-0")
    new = make_pod(cluster, "worker-0")  # what a StatefulSet does
    # The output of gpu-device-plugin gpu-pods, as the role passes it.
    pods = [
        dict(ref("worker-0", old), containers=["cuda"], gpus=["GPU-1"], claims=[]),
        dict(ref("never-was"), uid=None, containers=["cuda"], gpus=["GPU-1"], claims=[]),
    ]
    result = evict(pods=pods, grace_period=0)
    assert result["changed"] is False
    assert result["already_gone"] == [ref("worker-0"), ref("never-was")]
    assert read_pod(cluster, "worker-0").metadata.uid == new
    finish_deletion(cluster, "worker-0")


def test_daemonset_and_mirror_pods_are_kept_where_they_are_as_kubectl_drain_keeps_them(cluster, evict):
    # What the DaemonSet controller and a kubelet would make: a pod the DaemonSet owns, and the mirror of a static pod.
    daemonset = client.AppsV1Api(cluster["api"]).create_namespaced_daemon_set(
        NAMESPACE,
        {
            "metadata": {"name": "gpu-exporter"},
            "spec": {
                "selector": {"matchLabels": {"app": "gpu-exporter"}},
                "template": {
                    "metadata": {"labels": {"app": "gpu-exporter"}},
                    "spec": {"containers": [{"name": "exporter", "image": "exporter:1"}]},
                },
            },
        },
    )
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-exporter", "uid": daemonset.metadata.uid}
    owned = make_pod(cluster, "gpu-exporter-x7k2p", labels={"app": "gpu-exporter"}, ownerReferences=[owner])
    mirror = make_pod(cluster, f"cuda-static-{NODE}", annotations={"kubernetes.io/config.mirror": "5b1c"})
    job = make_pod(cluster, "job-c")
    pods = [ref("gpu-exporter-x7k2p"), ref(f"cuda-static-{NODE}"), ref("job-c")]

    result = evict(pods=pods, grace_period=0)
    assert result["changed"] is True and result["evicted"] == [ref("job-c", job)]
    assert result["kept"] == [
        dict(ref("gpu-exporter-x7k2p", owned), reason="DaemonSet"),
        dict(ref(f"cuda-static-{NODE}", mirror), reason="mirror"),
    ]
    assert read_pod(cluster, "gpu-exporter-x7k2p").metadata.deletion_timestamp is None
    assert read_pod(cluster, f"cuda-static-{NODE}").metadata.deletion_timestamp is None
    assert read_pod(cluster, "job-c") is None
    finish_deletion(cluster, "gpu-exporter-x7k2p")
    finish_deletion(cluster, f"cuda-static-{NODE}")


def eviction_refusals(cluster):
    """How many evictions the API server has answered with 429, from its own metrics."""
    api = cluster["api"]
    response = api.rest_client.pool_manager.request(
        "GET", f"{api.configuration.host}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert response.status == 200, response.data[:200]
    total = 0.0
    for line in response.data.decode().splitlines():
        if line.startswith("apiserver_request_total{") and 'subresource="eviction"' in line and 'code="429"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def write_budget_status(cluster, name, allowed):
    """The disruption controller's part: the budget's verdict for its one healthy pod."""
    cluster["policy"].patch_namespaced_pod_disruption_budget_status(
        name,
        NAMESPACE,
        {
            "status": {
                "observedGeneration": 1,
                "disruptionsAllowed": allowed,
                "currentHealthy": 1,
                "desiredHealthy": 1 - allowed,
                "expectedPods": 1,
            }
        },
    )


def test_a_disruption_budget_holds_the_eviction_until_it_allows_it(cluster, evict):
    uid = make_pod(cluster, "serve-0", labels={"app": "serve"}, running=True)
    cluster["policy"].create_namespaced_pod_disruption_budget(
        NAMESPACE,
        {"metadata": {"name": "serve"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "serve"}}}},
    )
    write_budget_status(cluster, "serve", allowed=0)

    result = evict(expect_failure=True, pods=[ref("serve-0")], timeout=2, grace_period=0)
    assert result["msg"] == (
        f"pod_eviction: within 2 s the API server still refused to evict {NAMESPACE}/serve-0 (Cannot evict pod as it"
        " would violate the pod's disruption budget. The disruption budget serve needs 1 healthy pods and has 1"
        " currently)."
    )
    assert result["refused"][f"{NAMESPACE}/serve-0"] >= 1 and result["evicted"] == []
    assert read_pod(cluster, "serve-0").metadata.deletion_timestamp is None

    refusals = eviction_refusals(cluster)
    proc = evict.start(pods=[ref("serve-0")], timeout=120, grace_period=0)
    wait_for("the module to be refused again", lambda: eviction_refusals(cluster) > refusals)
    write_budget_status(cluster, "serve", allowed=1)
    result = evict.result(proc)
    assert result["changed"] is True and result["evicted"] == [ref("serve-0", uid)]
    assert result["refused"][f"{NAMESPACE}/serve-0"] >= 1
    assert read_pod(cluster, "serve-0") is None


def test_the_module_waits_until_the_kubelet_has_deleted_the_evicted_pod(cluster, evict):
    uid = make_pod(cluster, "train-0")
    proc = evict.start(pods=[ref("train-0")], timeout=120)
    wait_for("the eviction to start the deletion", lambda: read_pod(cluster, "train-0").metadata.deletion_timestamp)
    assert proc.poll() is None, "the module returned while the pod still exists"
    finish_deletion(cluster, "train-0")
    result = evict.result(proc)
    assert result["changed"] is True and result["evicted"] == [ref("train-0", uid)]


def test_a_pod_not_gone_in_time_fails_and_a_terminating_pod_is_waited_for_without_a_new_eviction(cluster, evict):
    uid = make_pod(cluster, "train-1")
    result = evict(expect_failure=True, pods=[ref("train-1")], timeout=2)
    assert result["msg"] == (
        f"pod_eviction: {NAMESPACE}/train-1 still exists 2 s after the eviction (the kubelet has not finished stopping"
        " the containers, or the node is unreachable)."
    )
    assert result["changed"] is True and result["evicted"] == [ref("train-1", uid)]

    # The module reads every pod before it evicts any: once train-2 is being deleted, train-1 was read.
    other = make_pod(cluster, "train-2")
    proc = evict.start(pods=[ref("train-1"), ref("train-2")], timeout=120)
    wait_for("the eviction of train-2", lambda: read_pod(cluster, "train-2").metadata.deletion_timestamp)
    finish_deletion(cluster, "train-1")
    assert proc.poll() is None, "the module returned while train-2 still exists"
    finish_deletion(cluster, "train-2")
    result = evict.result(proc)
    assert result["changed"] is True
    assert (result["evicted"], result["terminating"]) == ([ref("train-2", other)], [ref("train-1", uid)])
