"""The node_drain role (main, then a change, then tasks_from uncordon) run by ansible-playbook against a real
kube-apiserver and etcd (the control_plane fixture, conftest.py): who cordoned a node is recorded on it, a drain
that fails leaves the node cordoned and says so, the next run finishes or lifts that cordon, and a person's cordon
is never lifted.

No kubelet and no controller manager run, so the test plays their parts where the role needs them, and says so
where it does: it reports a pod Running and Ready (a kubelet), writes a PodDisruptionBudget's status (the
disruption controller), and finishes a graceful deletion (a kubelet, once the containers have stopped). Without
the last, an evicted pod stays Terminating: a drain whose pods do not go.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from local_api import token_admin_api_server
from playbook_env import loaded_versions, loaded_versions_task, playbook_env

TOKEN = "gpuops-node-drain-test-admin-token"
NAMESPACE = "ml"
ANNOTATION = "gpuops.k8s/cordoned-by"

API_SERVER = token_admin_api_server(TOKEN)

# What a caller does: node_drain before the change, the change, tasks_from uncordon after it.
PLAY = [
    {
        "name": "a change that stops the node's GPU pods",
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {"name": "Drain", "ansible.builtin.include_role": {"name": "gpuops.k8s.node_drain"}},
            {"name": "The change", "ansible.builtin.debug": {"msg": "changed"}},
            {
                "name": "Give back",
                "ansible.builtin.include_role": {"name": "gpuops.k8s.node_drain", "tasks_from": "uncordon"},
            },
        ],
    }
]


def drain_cluster(control_plane, token, env, loaded=None):
    """What the tests below use: the API as an administrator (bearer ``token``), the namespace the pods run in, and
    PLAY to run with ansible-playbook in ``env``. With ``loaded`` (collection: version), each run reports the versions
    of the collections it loaded and ``drain`` checks that they are those. test_dependency_floors.py runs these tests
    with one of its own."""
    first_tasks = [loaded_versions_task()] if loaded else []
    work = control_plane.work
    kubeconfig = control_plane.kubeconfig(work / "kubeconfig", token=token)
    api = config.new_client_from_config(str(kubeconfig))
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    # The ServiceAccount admission plugin wants the namespace's default account (no controller manager makes it).
    core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
    playbook = work / "drain-play.yml"
    playbook.write_text(yaml.safe_dump([dict(play, tasks=[*first_tasks, *play["tasks"]]) for play in PLAY]))
    return {
        "kubeconfig": str(kubeconfig),
        "core": core,
        "policy": client.PolicyV1Api(api),
        "work": work,
        "env": env,
        "playbook": playbook,
        "loaded": loaded,
    }


@pytest.fixture(scope="module")
def cluster(control_plane):
    return drain_cluster(control_plane, TOKEN, playbook_env())


def make_node(cluster, name, cordoned=False):
    cluster["core"].create_node({"metadata": {"name": name}, "spec": {"unschedulable": cordoned}})


def make_gpu_pod(cluster, name, node, labels=None):
    """A Running, Ready pod holding a GPU, bound to NODE, whose kubelet never comes."""
    cluster["core"].create_namespaced_pod(
        NAMESPACE,
        {
            # Managed by a ReplicaSet, as a drain wants (no controller manager runs to act on it).
            "metadata": {
                "name": name,
                "labels": labels or {},
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-rs", "uid": str(uuid.uuid4())}
                ],
            },
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "cuda", "image": "cuda-app:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        },
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # The kubelet's part: the pod runs and is Ready (a Pending pod is evicted whatever its budget says).
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


def refusing_budget(cluster, name, app):
    """A PodDisruptionBudget that allows no disruption of its one healthy pod (its status as the disruption
    controller would write it)."""
    cluster["policy"].create_namespaced_pod_disruption_budget(
        NAMESPACE, {"metadata": {"name": name}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}}
    )
    cluster["policy"].patch_namespaced_pod_disruption_budget_status(
        name,
        NAMESPACE,
        {
            "status": {
                "observedGeneration": 1,
                "disruptionsAllowed": 0,
                "currentHealthy": 1,
                "desiredHealthy": 1,
                "expectedPods": 1,
            }
        },
    )


def finish_deletion(cluster, name):
    """The kubelet's part once the containers have stopped: delete with no grace period left."""
    try:
        cluster["core"].delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    except ApiException as error:
        if error.status != 404:
            raise


@contextlib.contextmanager
def kubelet_stopping(cluster, name, after):
    """The kubelet's part for pod NAME while the block runs: once the pod is being deleted, its containers take
    ``after`` seconds to stop, then the deletion is finished."""
    done = threading.Event()

    def terminating():
        try:
            return cluster["core"].read_namespaced_pod(name, NAMESPACE).metadata.deletion_timestamp
        except ApiException as error:
            if error.status == 404:
                return True
            raise

    def kubelet():
        while not done.wait(0.2):
            if terminating():
                time.sleep(after)
                finish_deletion(cluster, name)
                return

    thread = threading.Thread(target=kubelet, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=after + 30)


def drain(cluster, node, allowed, **settings):
    """Run the play for NODE (``settings``: more of the role's variables); (rc, the messages of the tasks that
    failed, the names of the tasks that ran)."""
    extra = cluster["work"] / f"extra-{node}.json"
    extra.write_text(
        json.dumps(
            {
                "node_drain_node_name": node,
                "node_drain_kubeconfig": cluster["kubeconfig"],
                "node_drain_allowed": allowed,
                "node_drain_timeout": 2,
                "node_drain_retry_delay": 1,
                # The role's Kubernetes calls need the kubernetes client, which this (the controller's) Python has.
                "ansible_python_interpreter": sys.executable,
                **settings,
            }
        )
    )
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(cluster["playbook"]), "-e", f"@{extra}"]
    run = subprocess.run(argv, capture_output=True, text=True, env=cluster["env"], timeout=300, check=False)
    try:
        report = json.loads(run.stdout)
    except ValueError as error:
        raise AssertionError(run.stdout[-3000:] + run.stderr[-3000:]) from error
    if cluster["loaded"]:
        assert loaded_versions(report) == [cluster["loaded"]], "the run did not load the collections it was to load"
    failed, ran = [], []
    for play in report["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get("localhost", {})
            if not result.get("skipped"):
                ran.append(task["task"]["name"])
            if result.get("failed") and not result.get("ignore_errors"):
                failed.append(str(result.get("msg", "")))
    return run.returncode, failed, ran


def node_state(cluster, node):
    found = cluster["core"].read_node(node)
    return bool(found.spec.unschedulable), (found.metadata.annotations or {}).get(ANNOTATION)


def test_a_refused_drain_leaves_the_node_cordoned_with_a_record_and_says_so_and_the_next_run_lifts_it(cluster):
    make_node(cluster, "gpu-a")
    make_gpu_pod(cluster, "serve-0", "gpu-a", labels={"app": "serve"})
    refusing_budget(cluster, "serve", "serve")

    rc, failed, ran = drain(cluster, "gpu-a", allowed=True)
    assert rc != 0 and "The change" not in ran
    assert failed[-1].startswith("gpu-a is left cordoned: 'Drain the node' failed (still refused after"), failed
    assert "would violate the pod's disruption budget" in failed[-1], failed
    assert "Run again" in failed[-1] and "kubectl uncordon gpu-a" in failed[-1], failed
    cordoned, record = node_state(cluster, "gpu-a")
    assert cordoned is True
    assert json.loads(record)["by"] == "gpuops.k8s.node_drain"

    # The next run may not drain: it lifts the cordon the failed run left, and stops before the change.
    rc, failed, ran = drain(cluster, "gpu-a", allowed=False)
    assert rc != 0 and "The change" not in ran
    assert failed[-1].endswith("The cordon an earlier run left on it is lifted."), failed
    assert node_state(cluster, "gpu-a") == (False, None)


def test_a_drain_whose_pods_do_not_go_fails_and_the_next_run_finishes_it(cluster):
    make_node(cluster, "gpu-b")
    make_gpu_pod(cluster, "train-0", "gpu-b")

    # The evicted pod stays Terminating (no kubelet): k8s_drain's wait ends with a warning, which is a failure.
    rc, failed, ran = drain(cluster, "gpu-b", allowed=True)
    assert rc != 0 and "The change" not in ran
    assert failed[-1].startswith(
        "gpu-b is left cordoned: 'Fail where the drain did not finish' failed (the drain did not finish within 2"
        " seconds: 1 pod(s) still on the node (ml/train-0))."
    ), failed
    assert node_state(cluster, "gpu-b")[0] is True

    finish_deletion(cluster, "train-0")
    rc, failed, ran = drain(cluster, "gpu-b", allowed=True)
    assert rc == 0 and failed == [] and "The change" in ran
    assert node_state(cluster, "gpu-b") == (False, None)


def test_a_persons_cordon_stays_through_a_failed_drain_and_the_next_run(cluster):
    make_node(cluster, "gpu-c", cordoned=True)
    make_gpu_pod(cluster, "train-1", "gpu-c")

    rc, failed, _ran = drain(cluster, "gpu-c", allowed=True)
    assert rc != 0 and failed[-1].startswith("gpu-c is left cordoned:"), failed
    assert node_state(cluster, "gpu-c") == (True, None)

    finish_deletion(cluster, "train-1")
    rc, failed, ran = drain(cluster, "gpu-c", allowed=True)
    assert rc == 0 and "The change" in ran
    assert node_state(cluster, "gpu-c") == (True, None)


def test_the_drain_waits_for_a_pod_that_takes_a_moment_to_stop(cluster):
    """k8s_drain waits for the pods it evicted to go (kubernetes.core 5.0.0's did not where the node had one pod: the
    role then found it still on the node, and failed)."""
    make_node(cluster, "gpu-d")
    make_gpu_pod(cluster, "infer-0", "gpu-d")

    with kubelet_stopping(cluster, "infer-0", after=3):
        rc, failed, ran = drain(cluster, "gpu-d", allowed=True, node_drain_timeout=60)
    assert rc == 0 and failed == [] and "The change" in ran, failed
    assert node_state(cluster, "gpu-d") == (False, None)
