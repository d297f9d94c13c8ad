"""What the DaemonSet-mode tests share beyond the node itself (test_site_daemonset.py,
test_site_dra_daemonset.py, test_upgrade_driver.py): a playbook run with the node's site.yml variables
plus a few, the node's pod of a DaemonSet, a pod made not ready for real (its process stopped, so the
kubelet's readiness probe goes unanswered), and what validate.yml said about the node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import yaml
from conftest import Lab, container_pid
from daemonset_node import NAMESPACE, DaemonsetNode
from kubernetes import client
from playbook_run import PlaybookRun, run_playbook


def run_with(ds: DaemonsetNode, playbook: str, *args: str, **extra: object) -> PlaybookRun:
    """``playbook`` on the DaemonSet node with its site.yml variables plus ``extra``."""
    extra_vars = ds.extra_vars
    if extra:
        merged = {**yaml.safe_load(ds.extra_vars.read_text()), **extra}
        extra_vars = ds.extra_vars.with_name(f"{playbook}-" + "-".join(sorted(extra)) + ".yml")
        extra_vars.write_text(yaml.safe_dump(merged))
    return run_playbook(playbook, ds.inventory, *args, extra_vars=extra_vars, limit=ds.node)


def node_pod(lab: Lab, node: str, daemonset: str) -> client.V1Pod | None:
    """The DaemonSet's one pod on the node that is not on its way out, or None."""
    pods = [
        p
        for p in lab.core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/name={daemonset}", field_selector=f"spec.nodeName={node}"
        ).items
        if not p.metadata.deletion_timestamp
    ]
    return pods[0] if len(pods) == 1 else None


def pod_ready(pod: client.V1Pod | None) -> bool:
    return pod is not None and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def ready_pod(lab: Lab, node: str, daemonset: str, timeout: float = 180) -> client.V1Pod:
    return lab.wait_until(
        f"{daemonset}'s pod Ready on {node}",
        lambda: (p := node_pod(lab, node, daemonset)) is not None and pod_ready(p) and p,
        timeout=timeout,
    )


@contextlib.contextmanager
def stopped_pod(lab: Lab, node: str, daemonset: str) -> Iterator[client.V1Pod]:
    """The node's pod of the DaemonSet with its daemon stopped (SIGSTOP): it answers no probe until the block
    ends, and the kubelet's readiness probe, if it has one, marks the pod not ready. Continued afterwards."""
    pod = ready_pod(lab, node, daemonset)
    container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
    pid = container_pid(lab, node, container_id)
    lab.node_exec(node, "kill", "-STOP", pid)
    try:
        yield pod
    finally:
        lab.node_exec(node, "kill", "-CONT", pid)


def validate_row(run: PlaybookRun, node: str) -> str:
    """validate.yml's table row for the node (the line that starts with its name)."""
    for line in run.output.splitlines():
        # The default callback prints the table's lines as a JSON list: '"<row>",'.
        cell = line.strip().rstrip(",").strip('"').strip()
        if cell.startswith(node + " "):
            return " ".join(cell.split())
    raise AssertionError(f"validate.yml printed no row for {node}:\n{run.output[-4000:]}")
