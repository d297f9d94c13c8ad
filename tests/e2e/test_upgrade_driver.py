"""playbooks/upgrade_driver.yml on a lab node whose plugin runs from the DaemonSet, against the lab's real
kube-apiserver, kube-controller-manager (ReplicaSets, the disruption controller), kube-scheduler and
kubelets.

A Deployment of two replicas runs on the node, covered by a PodDisruptionBudget that allows one
disruption. The drain evicts one replica, is refused the second until the first one's replacement is
ready on the other node, then evicts it; at no time are both replicas down. The driver stage finds no
NVIDIA PCI device on the lab node and says so; the loaded driver did not change, so the plugin keeps
running; the node advertises its 8 GPUs, and is schedulable again at the end.

The same playbook on the node as a DRA node runs in test_site_dra_daemonset.py, while the node is one.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from conftest import PAUSE_IMAGE, Lab
from daemonset_node import GPU, NAMESPACE, POD_SELECTOR, DaemonsetNode, daemonset_node
from kubernetes import client
from playbook_run import PlaybookRun, run_playbook

NAMESPACE_WORKLOAD = "default"
REPLICAS = 2


@dataclass
class ReadyWatch:
    """Polls the Deployment's ready pods while the drain runs and keeps the lowest count seen."""

    lab: Lab
    selector: str
    lowest: int = REPLICAS
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        api = client.CoreV1Api(self.lab.api)
        while not self.stop.is_set():
            pods = api.list_namespaced_pod(NAMESPACE_WORKLOAD, label_selector=self.selector).items
            ready = sum(
                1
                for p in pods
                if not p.metadata.deletion_timestamp
                and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            )
            self.lowest = min(self.lowest, ready)
            self.samples += 1
            time.sleep(0.2)


@dataclass
class Upgrade:
    node: str
    other: str
    app: str
    run: PlaybookRun
    watch: ReadyWatch
    plugin_pod_before: str
    pods_before: list[client.V1Pod]


def deployment(app: str) -> dict:
    labels = {"app": app}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": labels},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "dnsPolicy": "Default",
                    "terminationGracePeriodSeconds": 1,
                    # The lab's GPU nodes carry the GPU taint; this workload may run on either.
                    "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
                },
            },
        },
    }


def budget(app: str) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": app},
        "spec": {"minAvailable": REPLICAS - 1, "selector": {"matchLabels": {"app": app}}},
    }


def set_unschedulable(lab: Lab, node: str, value: bool) -> None:
    lab.core.patch_node(node, {"spec": {"unschedulable": value}})


def plugin_pod_uid(lab: Lab, node: str) -> str:
    pods = lab.core.list_namespaced_pod(NAMESPACE, label_selector=POD_SELECTOR, field_selector=f"spec.nodeName={node}")
    assert len(pods.items) == 1, [p.metadata.name for p in pods.items]
    return pods.items[0].metadata.uid


def app_pods(lab: Lab, app: str) -> list[client.V1Pod]:
    return [
        p
        for p in lab.core.list_namespaced_pod(NAMESPACE_WORKLOAD, label_selector=f"app={app}").items
        if not p.metadata.deletion_timestamp
    ]


def all_running(lab: Lab, app: str, node: str) -> list[client.V1Pod] | None:
    pods = app_pods(lab, app)
    if len(pods) == REPLICAS and all(p.status.phase == "Running" and p.spec.node_name == node for p in pods):
        return pods
    return None


@pytest.fixture(scope="module")
def upgrade(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upgrade]:
    if len(lab.nodes) < 2:
        pytest.fail("the upgrade test needs a lab of two nodes (GPUOPS_LAB_NODES=2): evicted pods move to the other")
    ds: DaemonsetNode = daemonset_node(lab, tmp_path_factory.mktemp("site-daemonset"))
    assert ds.first.returncode == 0, ds.first.summary()
    # The daemonset node is the lab's last one; the first is the other.
    node, other = ds.node, lab.nodes[0]
    lab.wait_until(f"{GPU}=8 on {node}", lambda: lab.allocatable(node).get(GPU) == "8", timeout=180)

    app = f"drain-{uuid.uuid4().hex[:6]}"
    apps = client.AppsV1Api(lab.api)
    policy = client.PolicyV1Api(lab.api)
    # Both replicas on the node being upgraded: the other node is cordoned while they are scheduled.
    set_unschedulable(lab, other, True)
    try:
        apps.create_namespaced_deployment(NAMESPACE_WORKLOAD, deployment(app))
        pods_before = lab.wait_until(f"{app}: both replicas Running on {node}", lambda: all_running(lab, app, node))
    finally:
        set_unschedulable(lab, other, False)
    policy.create_namespaced_pod_disruption_budget(NAMESPACE_WORKLOAD, budget(app))
    lab.wait_until(
        f"PodDisruptionBudget {app} allows one disruption",
        lambda: (
            (policy.read_namespaced_pod_disruption_budget(app, NAMESPACE_WORKLOAD).status.disruptions_allowed or 0) == 1
        ),
    )

    plugin_before = plugin_pod_uid(lab, node)
    watch = ReadyWatch(lab, f"app={app}")
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    try:
        run = run_playbook(
            "upgrade_driver.yml",
            ds.inventory,
            "-e",
            "nvidia_driver_branch=535",
            "-e",
            "gpuops_upgrade_drain_retry_delay=2",
            extra_vars=ds.extra_vars,
            limit=node,
        )
    finally:
        watch.stop.set()
        thread.join(timeout=10)
    yield Upgrade(
        node=node, other=other, app=app, run=run, watch=watch, plugin_pod_before=plugin_before, pods_before=pods_before
    )
    apps.delete_namespaced_deployment(app, NAMESPACE_WORKLOAD)
    policy.delete_namespaced_pod_disruption_budget(app, NAMESPACE_WORKLOAD)
    set_unschedulable(lab, node, False)


def test_upgrade_playbook_succeeds(upgrade: Upgrade) -> None:
    assert upgrade.run.returncode == 0, upgrade.run.summary()
    assert upgrade.run.recap[upgrade.node]["failed"] == 0


def test_drain_honours_the_disruption_budget(lab: Lab, upgrade: Upgrade) -> None:
    # The budget refused the second eviction (HTTP 429) and the drain tried again until it was allowed.
    output = " ".join(upgrade.run.output.split())
    assert f"FAILED - RETRYING: [{upgrade.node} -> localhost]: Cordon and drain the node" in output, output
    attempts = re.search(rf"{re.escape(upgrade.node)} drained in (\d+) attempt\(s\) \(evictions were refused", output)
    assert attempts and int(attempts[1]) >= 2, upgrade.run.summary()
    # Never both replicas down at once: at least one was Ready throughout.
    assert upgrade.watch.samples > 10
    assert upgrade.watch.lowest >= 1


def test_evicted_pods_run_again_on_the_other_node(lab: Lab, upgrade: Upgrade) -> None:
    pods = lab.wait_until(
        f"{upgrade.app}: both replicas Running on {upgrade.other}",
        lambda: all_running(lab, upgrade.app, upgrade.other),
    )
    before = {p.metadata.uid for p in upgrade.pods_before}
    assert not before & {p.metadata.uid for p in pods}, "the replicas were evicted and replaced"


def test_driver_stage_skipped_by_detection_and_plugin_left_running(lab: Lab, upgrade: Upgrade) -> None:
    assert f"No NVIDIA PCI device found on {upgrade.node}; the driver is not installed" in upgrade.run.output
    assert "none before, none now; the device plugin keeps running" in " ".join(upgrade.run.output.split())
    # The drain left the DaemonSet's plugin pod alone and nothing replaced it.
    assert plugin_pod_uid(lab, upgrade.node) == upgrade.plugin_pod_before


def test_node_schedulable_with_its_gpus_at_the_end(lab: Lab, upgrade: Upgrade) -> None:
    node = lab.node(upgrade.node)
    assert not node.spec.unschedulable
    assert node.status.allocatable[GPU] == "8"
    assert not [t for t in node.spec.taints or [] if t.key == "node.kubernetes.io/unschedulable"]
