"""What the DaemonSet-mode tests share beyond the node itself (test_site_daemonset.py,
test_site_dra_daemonset.py, test_upgrade_driver.py): a playbook run with the node's site.yml variables
plus a few, the node's pod of a DaemonSet, a pod made not ready for real (its process stopped, so the
kubelet's readiness probe goes unanswered), what validate.yml said about the node, and the GPUs' holders in the
dcgm metrics the daemon's pod serves in its own network namespace.
"""

from __future__ import annotations

import contextlib
import re
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


HOLDER_LABELS = ("pod", "namespace", "container")


def dcgm_exposition(lab: Lab, node: str, daemon_pod: client.V1Pod) -> str:
    """The dcgm metrics the daemon's pod serves at its --dcgm-metrics-address, asked inside the pod's own network
    namespace (nothing outside it reaches the pod's loopback)."""
    (container,) = daemon_pod.spec.containers
    address = container.args[container.args.index("--dcgm-metrics-address") + 1]
    host, _sep, port = address.rpartition(":")
    status = daemon_pod.status.container_statuses[0]
    pid = container_pid(lab, node, status.container_id.removeprefix("containerd://"))
    fetch = "import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=5).read())"
    url = f"http://{host or '127.0.0.1'}:{port}/metrics"
    return lab.node_exec(node, "nsenter", "-t", pid, "-n", "python3", "-c", fetch, url).stdout


def dcgm_holders(
    lab: Lab, node: str, daemon_pod: client.V1Pod, keys: tuple[str, ...] = HOLDER_LABELS
) -> dict[str, list[dict[str, str]]]:
    """The holder labels (`keys`: pod, namespace and container unless told) of each GPU's DCGM_FI_DEV_GPU_TEMP series
    (UUID -> a label set per series), as the daemon's pod serves them (dcgm_exposition)."""
    text = dcgm_exposition(lab, node, daemon_pod)
    found: dict[str, list[dict[str, str]]] = {}
    for labels in re.findall(r"^DCGM_FI_DEV_GPU_TEMP\{([^}]*)\}", text, re.MULTILINE):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        holder = {key: pairs[key] for key in keys if key in pairs}
        found.setdefault(pairs["UUID"], []).append(holder)
    return found
