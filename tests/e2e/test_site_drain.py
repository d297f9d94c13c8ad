"""No disruption outside a drain, on a lab node with a GPU pod, against the lab's real API server, scheduler,
controller manager, kubelet and containerd.

- containerd restarts (what the runtime role's handler does after a containerd or CRI-O config change) keep
  the pod's container: its process has the same PID afterwards, and the kubelet restarted nothing.
- gpuops.k8s.node_drain, which the runtime role calls before a dockerd restart without live-restore and the
  driver role before a reboot: with node_drain_allowed off it stops the play on the node with one sentence
  that names the setting, and the GPU pod keeps running; with it on the node is cordoned and the GPU pod
  evicted (its Deployment's replacement cannot run there), and tasks_from uncordon makes the node schedulable
  again. (The lab's nodes are containers: no reboot and no dockerd run there; molecule's docker scenario
  proves the dockerd side of the guard with a real dockerd.)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import PAUSE_IMAGE, Lab, container_pid, recovery_vars
from kubernetes import client
from playbook_run import PlaybookRun, lab_inventory, run_playbook

GPU = "nvidia.com/gpu"


@dataclass
class Busy:
    node: str
    app: str
    inventory: Path
    work: Path


def gpu_deployment(app: str, node: str) -> dict:
    labels = {"app": app}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "dnsPolicy": "Default",
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": "app",
                            "image": PAUSE_IMAGE,
                            "imagePullPolicy": "Never",
                            "resources": {"limits": {GPU: "1"}},
                        }
                    ],
                },
            },
        },
    }


def app_pods(lab: Lab, app: str) -> list[client.V1Pod]:
    return [
        p
        for p in lab.core.list_namespaced_pod("default", label_selector=f"app={app}").items
        if not p.metadata.deletion_timestamp
    ]


def running_on(lab: Lab, app: str, node: str) -> client.V1Pod | None:
    pods = [p for p in app_pods(lab, app) if p.spec.node_name == node and p.status.phase == "Running"]
    return pods[0] if len(pods) == 1 else None


def drain_play(work: Path, node: str, allowed: bool) -> tuple[Path, Path]:
    """A play that calls the role as the runtime and driver roles do: before the change, then (the change being
    where the play records whether the node is cordoned and which of its pods still run) uncordon."""
    seen = work / f"seen-{uuid.uuid4().hex[:6]}.json"
    api = {"kubeconfig": "{{ gpu_node_labels_kubeconfig }}"}
    tasks = [
        {
            "name": "Drain before the change, or stop",
            "ansible.builtin.include_role": {"name": "gpuops.k8s.node_drain"},
            "vars": {"node_drain_allowed": allowed, "node_drain_reason": "the test's change stops GPU pods"},
        },
        {
            "name": "The change: see the node",
            "kubernetes.core.k8s_info": {"kind": "Node", "name": node, **api},
            "register": "seen_node",
            "delegate_to": "localhost",
        },
        {
            "name": "The change: see its pods",
            "kubernetes.core.k8s_info": {"kind": "Pod", "field_selectors": [f"spec.nodeName={node}"], **api},
            "register": "seen_pods",
            "delegate_to": "localhost",
        },
        {
            "name": "The change: write down what it saw",
            "ansible.builtin.copy": {
                "dest": str(seen),
                "content": "{{ {'unschedulable': seen_node.resources[0].spec.unschedulable | default(false),"
                " 'pods': seen_pods.resources | map(attribute='metadata.uid') | list} | to_json }}",
                "mode": "0644",
            },
            "delegate_to": "localhost",
        },
        {
            "name": "Uncordon after the change",
            "ansible.builtin.include_role": {"name": "gpuops.k8s.node_drain", "tasks_from": "uncordon"},
        },
    ]
    path = work / f"drain-{'allowed' if allowed else 'refused'}-{uuid.uuid4().hex[:6]}.yml"
    path.write_text(yaml.safe_dump([{"hosts": node, "gather_facts": False, "tasks": tasks}], sort_keys=False))
    return path, seen


@pytest.fixture(scope="module")
def busy(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Busy]:
    work = tmp_path_factory.mktemp("site-drain")
    node = lab.nodes[0]
    inventory = lab_inventory(work / "inventory.yml")
    # The node as test_site.py and test_site_dra.py leave it: the device plugin serving its 8 GPUs. Converged here
    # only when it is not (the module run alone, or after a module that left it otherwise).
    if lab.allocatable(node).get(GPU) != "8":
        run = run_playbook("site.yml", inventory, extra_vars=recovery_vars(work / "vars.yml"), limit=node)
        assert run.returncode == 0, run.summary()
    lab.wait_until(f"{GPU}=8 on {node}", lambda: lab.allocatable(node).get(GPU) == "8", timeout=180)
    app = f"gpu-app-{uuid.uuid4().hex[:6]}"
    apps = client.AppsV1Api(lab.api)
    apps.create_namespaced_deployment("default", gpu_deployment(app, node))
    try:
        lab.wait_until(f"{app} running on {node}", lambda: running_on(lab, app, node), timeout=180)
        yield Busy(node=node, app=app, inventory=inventory, work=work)
    finally:
        apps.delete_namespaced_deployment(app, "default")
        lab.core.patch_node(node, {"spec": {"unschedulable": False}})


def test_a_containerd_restart_keeps_the_pods_container(lab: Lab, busy: Busy) -> None:
    pod = running_on(lab, busy.app, busy.node)
    assert pod is not None
    container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
    before = container_pid(lab, busy.node, container_id)
    lab.node_exec(busy.node, "systemctl", "restart", "containerd")
    assert lab.node_exec(busy.node, "systemctl", "is-active", "containerd").stdout.strip() == "active"
    # The shim kept the container: the same process, seen by the restarted containerd.
    assert lab.wait_until("containerd to list the container again", lambda: container_pid(lab, busy.node, container_id))
    assert container_pid(lab, busy.node, container_id) == before
    lab.node_exec(busy.node, "kill", "-0", before)
    after = running_on(lab, busy.app, busy.node)
    assert after is not None and after.metadata.uid == pod.metadata.uid
    assert after.status.container_statuses[0].restart_count == 0


def test_without_a_drain_allowed_the_play_stops_and_the_gpu_pod_runs_on(lab: Lab, busy: Busy) -> None:
    pod = running_on(lab, busy.app, busy.node)
    assert pod is not None
    play, seen = drain_play(busy.work, busy.node, allowed=False)
    run: PlaybookRun = run_playbook(str(play), busy.inventory)
    assert run.returncode != 0 and run.recap[busy.node]["failed"] == 1, run.summary()
    sentence = (
        f"{busy.node} runs 1 GPU pod(s) (default/{pod.metadata.name}) and the test's change stops GPU pods;"
        " set node_drain_allowed=true (site.yml: -e gpuops_drain=true)"
    )
    assert sentence in " ".join(run.output.split()), run.output
    assert "Traceback" not in run.output
    assert not seen.exists()  # the change never ran
    assert not lab.node(busy.node).spec.unschedulable
    still = running_on(lab, busy.app, busy.node)
    assert still is not None and still.metadata.uid == pod.metadata.uid


def test_with_a_drain_allowed_the_change_runs_on_a_drained_node_then_it_is_uncordoned(lab: Lab, busy: Busy) -> None:
    pod = running_on(lab, busy.app, busy.node)
    assert pod is not None
    play, seen = drain_play(busy.work, busy.node, allowed=True)
    run = run_playbook(str(play), busy.inventory)
    assert run.returncode == 0, run.summary()
    assert f"{busy.node} is cordoned and drained of default/{pod.metadata.name}" in " ".join(run.output.split())
    during = json.loads(seen.read_text())
    # While the change ran the node was cordoned and the GPU pod gone from it.
    assert during["unschedulable"] is True and pod.metadata.uid not in during["pods"], during
    # Afterwards the node takes pods again: the Deployment's replacement runs there.
    assert not lab.node(busy.node).spec.unschedulable
    back = lab.wait_until(f"{busy.app} back on {busy.node}", lambda: running_on(lab, busy.app, busy.node), timeout=180)
    assert back.metadata.uid != pod.metadata.uid


def test_a_node_cordoned_before_the_play_stays_cordoned(lab: Lab, busy: Busy) -> None:
    lab.wait_until(f"{busy.app} on {busy.node}", lambda: running_on(lab, busy.app, busy.node), timeout=180)
    lab.core.patch_node(busy.node, {"spec": {"unschedulable": True}})
    play, seen = drain_play(busy.work, busy.node, allowed=True)
    run = run_playbook(str(play), busy.inventory)
    assert run.returncode == 0, run.summary()
    assert json.loads(seen.read_text())["unschedulable"] is True
    assert lab.node(busy.node).spec.unschedulable  # the operator's cordon is theirs to lift
