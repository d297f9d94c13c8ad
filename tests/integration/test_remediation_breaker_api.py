"""The circuit breaker of playbooks/remediate.yml and a Node's hold, against a real kube-apiserver and etcd (the
control_plane fixture, conftest.py): gpuops.k8s.node_remediation run as Ansible runs it (its own interpreter,
arguments in a JSON file), two runs at once where the test says so, and the plan made by the remediation_plan filter.

The test plays a person where one is needed: it changes a taint or a cordon with its own field manager, as kubectl
does. A watch on the Nodes records every Node's taints for as long as the runs take.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import urllib3
from kubernetes import client, config, watch
from local_api import token_admin_api_server, wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "gpuops-breaker-test-admin-token"
TAINT = "nvidia.com/gpu-remediation"
NODES = ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e", "gpu-f")

# The control_plane fixture's API server: RBAC alone, the default admission plugins, a token administrator.
API_SERVER = token_admin_api_server(TOKEN)


@pytest.fixture(scope="module")
def cluster(control_plane):
    kubeconfig = control_plane.kubeconfig(control_plane.work / "kubeconfig", token=TOKEN)
    api = config.new_client_from_config(str(kubeconfig))
    core = client.CoreV1Api(api)
    for name in NODES:
        core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    return {"kubeconfig": str(kubeconfig), "api": api, "core": core}


class Remediation:
    """plugins/modules/node_remediation.py as Ansible runs it."""

    def __init__(self, cluster, collection_root, tmp_path):
        self.cluster, self.collection_root, self.tmp_path = cluster, collection_root, tmp_path
        self.calls = 0

    def start(self, **args):
        self.calls += 1
        args_file = self.tmp_path / f"args-{self.calls}.json"
        module_args = dict(args, kubeconfig=self.cluster["kubeconfig"])
        if "max_nodes" in args:
            module_args["lease_namespace"] = "default"
        args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": module_args}))
        return subprocess.Popen(
            [sys.executable, str(ROOT / "plugins/modules/node_remediation.py"), str(args_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(self.collection_root)),
        )

    @staticmethod
    def result(proc):
        out, err = proc.communicate(timeout=120)
        try:
            result = json.loads(out)
        except ValueError as error:
            raise AssertionError(f"the module printed no JSON: rc={proc.returncode}\n{out}\n{err}") from error
        assert not result.get("failed"), result
        return result

    def __call__(self, **args):
        return self.result(self.start(**args))


@pytest.fixture
def remediation(cluster, collection_root, tmp_path):
    yield Remediation(cluster, collection_root, tmp_path)
    # Every test starts from schedulable Nodes without the taint or the annotation.
    for name in NODES:
        cluster["core"].patch_node(
            name,
            {
                "spec": {"taints": None, "unschedulable": None},
                "metadata": {"annotations": {"gpuops.k8s/gpu-remediation": None}},
            },
        )


def read(cluster, name):
    node = cluster["core"].read_node(name)
    taints = {t.key: t.value for t in node.spec.taints or []}
    return taints.get(TAINT), bool(node.spec.unschedulable)


def as_person(cluster, name, body, manager):
    """A write as a person's kubectl makes it: a patch under kubectl's field manager."""
    cluster["core"].patch_node(name, body, field_manager=manager)


class TaintWatch:
    """Every Node's remediation taint as the API server reports each change; the most Nodes tainted at once."""

    def __init__(self, cluster):
        self.core, self.state, self.most, self.events = cluster["core"], {}, 0, []
        listed = self.core.list_node()
        for node in listed.items:
            self._see(node)
        self.version = listed.metadata.resource_version
        self.stream = watch.Watch()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _see(self, node):
        self.state[node.metadata.name] = any(t.key == TAINT for t in node.spec.taints or [])
        tainted = sorted(name for name, on in self.state.items() if on)
        self.events.append(tainted)
        self.most = max(self.most, len(tainted))

    def _run(self):
        try:
            for event in self.stream.stream(self.core.list_node, resource_version=self.version, timeout_seconds=60):
                self._see(event["object"])
        except urllib3.exceptions.ProtocolError:
            pass  # the API server stopped at the end of the module; the watch was read before

    def tainted(self):
        return [name for name in NODES if self.state.get(name)]

    def stop(self):
        self.stream.stop()


def plan(cluster, node, klass):
    """What one run's plan says for one node with a GPU of ``klass``, from the cluster's Nodes as they are now."""
    sys.path.insert(0, str(ROOT / ".build"))
    from ansible_collections.gpuops.k8s.plugins.filter.remediation_plan import remediation_plan

    nodes = cluster["api"].sanitize_for_serialization(cluster["core"].list_node().items)
    gpu = {"uuid": "GPU-1", "index": 0, "class": klass, "reason": "XID"}
    entry = {"host": node, "node": node, "faults": {"gpus": [gpu], "node_class": klass}, "record": None}
    return remediation_plan([entry], nodes, max_nodes=1, fleet_size=len(NODES), now="2026-11-28T12:00:00Z")


def test_two_runs_planned_from_one_snapshot_never_have_two_nodes_under_remediation(cluster, remediation):
    # Both plans are made before either run writes: each sees no Node under remediation and starts its node.
    first, second = plan(cluster, "gpu-a", "reset"), plan(cluster, "gpu-b", "reboot")
    assert first["started"] == ["gpu-a"] and second["started"] == ["gpu-b"]
    seen = TaintWatch(cluster)
    try:
        runs = [
            remediation.start(
                name=name, remediation_class=klass, max_nodes=p["limit"], run_id=run, hold_seconds=600, gpus=["GPU-1"]
            )
            for name, klass, p, run in (("gpu-a", "reset", first, "run-1"), ("gpu-b", "reboot", second, "run-2"))
        ]
        results = [remediation.result(proc) for proc in runs]
        third = remediation(name="gpu-c", remediation_class="reset", max_nodes=1, run_id="run-3", hold_seconds=600)
        tainted = [name for name in NODES if read(cluster, name)[0]]
        wait_for("the watch to see the last write", lambda: seen.tainted() == tainted, timeout=30, interval=0.05)
    finally:
        seen.stop()
    assert sorted(r["decision"] for r in results) == ["waiting", "written"], results
    assert third["decision"] == "waiting" and third["counted"] == 1 and not third["changed"], third
    assert len(tainted) == 1, tainted
    waiting = next(r for r in results if r["decision"] == "waiting")
    assert "1 of 1 remediation slot(s) are taken" in waiting["message"] and not waiting["changed"]
    assert seen.most == 1, seen.events


def test_a_node_held_by_one_run_is_not_touched_by_another(cluster, remediation):
    taken = remediation(name="gpu-d", remediation_class="reset", max_nodes=1, run_id="run-1", hold_seconds=600)
    assert taken["decision"] == "written" and taken["after"]["annotation"]["run"] == "run-1"
    for args in ({"remediation_class": "reboot"}, {"state": "absent"}):
        other = remediation(name="gpu-d", max_nodes=1, run_id="run-2", hold_seconds=600, **args)
        assert other["decision"] == "held" and not other["changed"], other
        assert "under the remediation of run run-1 until" in other["message"]
    assert read(cluster, "gpu-d") == ("reset", True)
    # The first run lets go (hold_seconds 0, as its rescue does): the second continues, and may raise the class.
    remediation(name="gpu-d", remediation_class="reset", run_id="run-1", hold_seconds=0)
    raised = remediation(name="gpu-d", remediation_class="reboot", max_nodes=1, run_id="run-2", hold_seconds=600)
    assert raised["decision"] == "written" and read(cluster, "gpu-d") == ("reboot", True)


def test_giving_back_keeps_a_taint_a_person_raised(cluster, remediation):
    remediation(name="gpu-e", remediation_class="reset")
    taints = [{"key": TAINT, "value": "replace", "effect": "NoSchedule"}]
    as_person(cluster, "gpu-e", {"spec": {"taints": taints}}, "kubectl-taint")
    back = remediation(name="gpu-e", state="absent", remediation_class="reset")
    assert read(cluster, "gpu-e") == ("replace", True)
    assert back["decision"] == "kept", back
    # A run never lowers it either.
    again = remediation(name="gpu-e", remediation_class="reset")
    assert again["decision"] == "raised" and read(cluster, "gpu-e") == ("replace", True)


def test_giving_back_keeps_a_cordon_a_person_set_meanwhile(cluster, remediation):
    remediation(name="gpu-f", remediation_class="reset")
    as_person(cluster, "gpu-f", {"spec": {"unschedulable": None}}, "kubectl-cordon")
    as_person(cluster, "gpu-f", {"spec": {"unschedulable": True}}, "kubectl-cordon")
    back = remediation(name="gpu-f", state="absent", remediation_class="reset")
    assert read(cluster, "gpu-f") == (None, True)
    assert back["changed"]
    # Its own cordon it lifts, after the person uncordoned the node.
    as_person(cluster, "gpu-f", {"spec": {"unschedulable": None}}, "kubectl-cordon")
    remediation(name="gpu-f", remediation_class="reset", max_nodes=1, run_id="run-2", hold_seconds=600)
    remediation(name="gpu-f", state="absent", remediation_class="reset", run_id="run-2")
    assert read(cluster, "gpu-f") == (None, False)


def test_a_lease_left_by_a_killed_run_is_taken_once_it_expired(cluster, remediation):
    coordination = client.CoordinationV1Api(cluster["api"])
    coordination.delete_collection_namespaced_lease("default")
    an_hour_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    coordination.create_namespaced_lease(
        "default",
        {
            "metadata": {"name": "gpuops-k8s-gpu-remediation"},
            "spec": {"holderIdentity": "killed-run", "leaseDurationSeconds": 30, "renewTime": an_hour_ago},
        },
    )
    taken = remediation(name="gpu-a", remediation_class="reset", max_nodes=1, run_id="run-9", hold_seconds=60)
    assert taken["decision"] == "written"
    lease = coordination.read_namespaced_lease("gpuops-k8s-gpu-remediation", "default")
    assert lease.spec.holder_identity is None and lease.spec.lease_transitions == 1
