"""playbooks/remediate.yml on the lab's two nodes, against the lab's real API server, scheduler, controller manager
(PodDisruptionBudgets), kubelets, containerd and the collection's daemon (systemd deployment, nvml backend).

The stand-ins, both TEST DOUBLES of the lab: the GPUs are the mock libnvidia-ml.so.1 serving each node's simulated
spec, in which a test writes a GPU's `xid` (the library delivers it to the daemon as an NVML XID event, and the
daemon writes the GPU's class into its health file), and the GPU reset is gpuops-lab-gpu-reset (the lab inventory's
gpu_remediation_reset_command). A node's reboot is real for the node: its systemd stops its services and the node's
container ends and starts again (tests/e2e/node/reboot.sh), with a new boot ID, and the daemon starts afresh,
registering for XIDs that come after it (docs/mock-nvml.md), as a rebooted machine's GPUs are fresh.

First, with both nodes converged: a real Prometheus (tests/e2e/prometheus_lab.py) scrapes the daemon's dcgm metrics
on both, promtool reads each exposition, and every query of NVIDIA's dashboard 12239 draws each GPU of both nodes at
the reading its spec set.

In order, one playbook run each (the state of one test is the start of the next):
1. An XID of class none and an unknown XID (the default class, device): nothing changes.
2. A reset XID on node 2, --check: each node's plan is printed, nothing changes.
3. A reboot XID on node 1 with GPU pods under a PodDisruptionBudget, node 2 still waiting for its reset, and a
   limit of one node: node 1 is cordoned and tainted, its pods evicted as the budget allows, the node rebooted, its
   GPUs verified healthy, the taint and cordon removed; node 2 waits, untouched, and the play says why. Figures:
   XID to cordon, XID to schedulable again (printed, not asserted).
4. The next run, limited to node 2 as Event-Driven Ansible runs it, takes node 2: only the pod on the GPU reset is
   evicted, the pods on its other GPUs keep running.
5. The same GPU fails again within the repeat window: node 2 goes to replace, cordoned and tainted for a person.
6. A node that does not come back from its reboot in time (gpu_remediation_reboot_timeout=0 for the run) is left
   cordoned and tainted, holding its slot; the next run continues it (no second reboot) and gives it back.

Under `make test-full`, last: an alert storm for both nodes through ansible-rulebook (the shipped rulebook, the real
remediate.yml) while a person runs remediate.yml by hand, with a watch on the Nodes' taints.

The breaker's decision on larger fleets (3 of 4 nodes failing with a limit of 1, percentages, a node that never came
back) is unit-tested on the filter that makes it (tests/unit/plugins/filter/test_remediation_plan.py).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import PAUSE_IMAGE, Lab, container_restarts, run_lab, write_in_place, write_xid
from kubernetes import client
from playbook_run import COLLECTIONS, PlaybookRun, lab_inventory, run_playbook
from prometheus_lab import Prometheus, dashboard, filled

# It runs at the end of the session (after test_drift and test_lab's last test): it reboots, taints and cordons the
# lab's nodes, and the modules before it expect a lab no playbook has touched (test_site's check-mode run first).
pytestmark = pytest.mark.last_in_session

GPU = "nvidia.com/gpu"
TAINT = "nvidia.com/gpu-remediation"
HEALTH_FILE = "/var/lib/gpuops/gpu-health.json"
RECORD = "/var/lib/gpuops/gpu-remediation.json"
PART_OF = "test-remediate"
NAMESPACE = "default"
# The lab's TEST DOUBLE of DCGM's host engine (tests/e2e/gpuops_lab/inventory.py): a service that holds NVML open.
DCGM = "nvidia-dcgm.service"


@dataclass
class Flow:
    lab: Lab
    inventory: Path
    work: Path
    node1: str
    node2: str
    specs: dict[str, Path]
    pods: dict[str, str] = field(default_factory=dict)  # pod name -> uid
    victim_gpu: str = ""  # node 2's GPU whose pod the reset evicts


def labels(app: str) -> dict[str, str]:
    return {"app": app, "app.kubernetes.io/part-of": PART_OF}


def pod_spec(node: str | None) -> dict:
    spec = {
        "automountServiceAccountToken": False,
        "dnsPolicy": "Default",
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never", "resources": {"limits": {GPU: "1"}}}
        ],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


def start_pod(lab: Lab, name: str, node: str) -> client.V1Pod:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": pod_spec(node),
    }
    lab.core.create_namespaced_pod(NAMESPACE, body)
    return lab.wait_until(
        f"pod {name} Running",
        lambda: (p := lab.core.read_namespaced_pod(name, NAMESPACE)).status.phase == "Running" and p,
        timeout=180,
    )


def pod_uid(lab: Lab, name: str) -> str | None:
    """The pod's UID while it exists and is not being deleted; None once it is gone."""
    try:
        pod = lab.core.read_namespaced_pod(name, NAMESPACE)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return None if pod.metadata.deletion_timestamp else pod.metadata.uid


def app_pods(lab: Lab, app: str) -> list[client.V1Pod]:
    found = lab.core.list_namespaced_pod(NAMESPACE, label_selector=f"app={app}").items
    return [p for p in found if not p.metadata.deletion_timestamp]


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def set_xid(flow: Flow, node: str, index: int, xid: int | None) -> str:
    """Write (or clear) GPU `index`'s XID in the node's spec, in place; returns the GPU's UUID."""
    return write_xid(flow.specs[node], index, xid)


def gpu_index(flow: Flow, node: str, gpu_uuid: str) -> int:
    return [g["uuid"] for g in yaml.safe_load(flow.specs[node].read_text())["gpus"]].index(gpu_uuid)


def health(lab: Lab, node: str) -> dict[str, dict]:
    """The daemon's health file on the node: GPU UUID -> its row."""
    rows = json.loads(lab.node_exec(node, "cat", HEALTH_FILE).stdout)["gpus"]
    return {row["uuid"]: row for row in rows}


def wait_class(lab: Lab, node: str, gpu_uuid: str, klass: str) -> dict:
    return lab.wait_until(
        f"{gpu_uuid} of class {klass} in {node}'s health file",
        lambda: (row := health(lab, node).get(gpu_uuid)) and row["class"] == klass and row,
        timeout=60,
        interval=0.2,
    )


def remediation(lab: Lab, node: str) -> tuple[bool, str | None]:
    """(cordoned, the value of the remediation taint or None)."""
    spec = lab.node(node).spec
    values = [t.value for t in spec.taints or [] if t.key == TAINT]
    return bool(spec.unschedulable), (values[0] if values else None)


def record(lab: Lab, node: str) -> dict:
    done = lab.node_exec(node, "cat", RECORD, check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def holds_nvml(lab: Lab, node: str, unit: str) -> bool:
    """Whether the unit's process holds the mock library's client lock (/proc/locks names the holder's PID)."""
    pid = lab.node_exec(node, "systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip()
    locks = [line.split() for line in lab.node_exec(node, "cat", "/proc/locks").stdout.splitlines()]
    return pid not in ("", "0") and any(len(fields) > 4 and fields[4] == pid for fields in locks)


def persistence_mode(lab: Lab, node: str, uuid: str) -> int:
    """The GPU's persistence mode as NVML on the node answers it (the mock library keeps it for the node)."""
    code = (
        "import pynvml as n; n.nvmlInit(); "
        f"print(n.nvmlDeviceGetPersistenceMode(n.nvmlDeviceGetHandleByUUID({uuid!r})))"
    )
    return int(lab.node_exec(node, "python3", "-c", code).stdout)


def boot_id(lab: Lab, node: str) -> str:
    return lab.node_exec(node, "cat", "/proc/sys/kernel/random/boot_id").stdout.strip()


def messages(run: PlaybookRun) -> list[str]:
    """The play's debug messages, unescaped."""
    return [json.loads(f'"{m}"') for m in re.findall(r'^\s*"msg": "(.*)"$', run.output, re.MULTILINE)]


def message_for(run: PlaybookRun, node: str) -> str:
    found = [m for m in messages(run) if re.match(rf"^(Check mode, nothing is done\. )?{re.escape(node)}: ", m)]
    assert found, f"no message for {node}\n{run.summary()}"
    return found[0]


def task_lines(run: PlaybookRun, task: str) -> list[str]:
    """The result lines under a task's header (up to the next task)."""
    parts = run.output.split(f"TASK [gpuops.k8s.gpu_remediation : {task}]")
    assert len(parts) == 2, f"task {task!r} ran {len(parts) - 1} times\n{run.summary()}"
    return [line for line in parts[1].split("\nTASK [")[0].splitlines()[1:] if line.strip()]


def summary(run: PlaybookRun) -> str:
    found = [m for m in messages(run) if m.startswith("Remediation slots: ")]
    assert len(found) == 1, run.summary()
    return found[0]


def remediate(flow: Flow, *args: str) -> PlaybookRun:
    return run_playbook("remediate.yml", flow.inventory, *args, timeout=1200)


class NodeWatch(threading.Thread):
    """Polls a Node (and an app's pods) while a playbook runs: when it was first seen cordoned and tainted, when it
    was first seen schedulable again after that, and the fewest Ready pods of the app seen meanwhile."""

    def __init__(self, lab: Lab, node: str, app: str | None = None) -> None:
        super().__init__(daemon=True)
        self.lab, self.node, self.app = lab, node, app
        self.stop = threading.Event()
        self.cordoned_at: float | None = None
        self.taint_seen: str | None = None
        self.back_at: float | None = None
        self.fewest_ready: int | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                cordoned, taint = remediation(self.lab, self.node)
                now = time.monotonic()
                if self.cordoned_at is None and cordoned and taint:
                    self.cordoned_at, self.taint_seen = now, taint
                elif self.cordoned_at is not None and self.back_at is None and not cordoned and not taint:
                    self.back_at = now
                if self.app:
                    count = sum(1 for p in app_pods(self.lab, self.app) if ready(p))
                    self.fewest_ready = count if self.fewest_ready is None else min(self.fewest_ready, count)
            except client.ApiException:
                pass
            time.sleep(0.2)


@pytest.fixture(scope="module")
def flow(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flow]:
    """Both nodes converged by site.yml (8 simulated H100 each, the daemon in systemd mode on the nvml backend)."""
    work = tmp_path_factory.mktemp("remediate")
    node1, node2 = lab.nodes[:2]
    inventory = lab_inventory(work / "inventory.yml")
    specs = {node: Path(run_lab("spec-path", str(i + 1)).strip()) for i, node in enumerate((node1, node2))}
    site = run_playbook("site.yml", inventory)
    assert site.returncode == 0, site.summary()
    for node in (node1, node2):
        lab.wait_until(f"8 x {GPU} on {node}", lambda node=node: lab.allocatable(node).get(GPU) == "8", timeout=180)
    flow = Flow(lab, inventory, work, node1, node2, specs)
    try:
        yield flow
    finally:
        apps = client.AppsV1Api(lab.api)
        for deployment in apps.list_namespaced_deployment(
            NAMESPACE, label_selector=f"app.kubernetes.io/part-of={PART_OF}"
        ).items:
            apps.delete_namespaced_deployment(deployment.metadata.name, NAMESPACE, propagation_policy="Foreground")
        client.PolicyV1Api(lab.api).delete_collection_namespaced_pod_disruption_budget(
            NAMESPACE, label_selector=f"app.kubernetes.io/part-of={PART_OF}"
        )
        lab.core.delete_collection_namespaced_pod(NAMESPACE, label_selector=f"app.kubernetes.io/part-of={PART_OF}")
        # Gone before the next module looks at the nodes (a pod's teardown writes on its node).
        lab.wait_until(
            "the module's pods gone",
            lambda: (
                not lab.core.list_namespaced_pod(NAMESPACE, label_selector=f"app.kubernetes.io/part-of={PART_OF}").items
            ),
            timeout=180,
        )
        for node, spec in specs.items():
            data = yaml.safe_load(spec.read_text())
            for gpu in data["gpus"]:
                gpu.pop("xid", None)
            write_in_place(spec, yaml.safe_dump(data, sort_keys=False))
            lab.node_exec(node, "systemctl", "stop", DCGM, check=False)
            lab.core.patch_node(node, {"spec": {"unschedulable": False}})
            taints = [t for t in lab.node(node).spec.taints or [] if t.key != TAINT]
            lab.core.patch_node(node, {"spec": {"taints": [lab.api.sanitize_for_serialization(t) for t in taints]}})


# The panels of NVIDIA's dashboard 12239 that draw one line per GPU, and the metric and scale of each; the gauges
# aggregate the same metric over every GPU.
DASHBOARD_LINES = {
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1),
    "DCGM_FI_DEV_POWER_USAGE": ("power_mw", 0.001),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_pct", 1),
    "DCGM_FI_DEV_FB_USED": ("memory_used_mib", 1),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpm_tensor_util_pct", 0.01),  # GPM's %, dcgm-exporter's ratio
}
AGGREGATES = {"avg": lambda values: sum(values) / len(values), "sum": sum}


def busy_readings(node_number: int, index: int) -> dict[str, int]:
    """Readings that differ on every GPU of both nodes, for the dashboard's queries to tell them apart."""
    return {
        "temperature_c": 40 + 10 * node_number + index,
        "power_mw": 300000 + 20000 * node_number + 1000 * index,
        "sm_clock_mhz": 1500 + 100 * node_number + 10 * index,
        "gpu_utilization_pct": 50 + 20 * node_number + index,
        "memory_used_mib": 10000 * node_number + 1000 * index,
        "gpm_tensor_util_pct": 10 * node_number + 5 * index,
    }


def test_prometheus_scrapes_both_nodes_and_promtool_reads_the_exposition(flow: Flow, prometheus: Prometheus) -> None:
    """A real Prometheus scrapes the dcgm metrics of both converged nodes (the role's listener, the lab's port per
    node). promtool parses each exposition; what its lint finds is exactly what dcgm-exporter's own names give, which
    dashboards and alerts read: counters without _total, the label modelName in camelCase on every series, and
    DCGM_FI_DEV_PCIE_REPLAY_COUNTER naming its type."""
    nodes = (flow.node1, flow.node2)
    wanted = {prometheus.targets[node]: 1.0 for node in nodes}
    prometheus.wait_until(
        "both nodes' dcgm metrics scraped",
        lambda: {k: v for k, v in prometheus.targets_up().items() if k in wanted} == wanted,
        timeout=60,
    )
    for node in nodes:
        exposition = urllib.request.urlopen(f"http://{prometheus.targets[node]}/metrics", timeout=10).read().decode()
        checked = subprocess.run(
            ["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True, check=False
        )
        families = re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE)
        assert families, exposition
        expected = {f"{name} label names should be written in 'snake_case' not 'camelCase'" for name, _kind in families}
        expected |= {
            f'{name} counter metrics should have "_total" suffix' for name, kind in families if kind == "counter"
        }
        expected.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'")
        assert set((checked.stdout + checked.stderr).splitlines()) == expected
        # 3: lint problems only; 1 would be an exposition promtool cannot parse.
        assert checked.returncode == 3, checked.returncode


def test_every_query_of_nvidias_dashboard_draws_each_gpu_of_both_nodes_with_its_reading(
    flow: Flow, prometheus: Prometheus
) -> None:
    """NVIDIA's dashboard 12239, its queries unchanged (tests/fixtures/dcgm-exporter-dashboard.yaml): its template
    variables list both nodes and every GPU; each per-GPU panel has one line per GPU of both nodes at the reading
    the node's spec set, each gauge the average or sum of those; the tensor-core panel's from NVML's GPM (the lab's
    GPUs are H100s)."""
    nodes = (flow.node1, flow.node2)
    originals = {node: flow.specs[node].read_text() for node in nodes}
    expected: dict[str, dict[tuple[str, str], float]] = {metric: {} for metric in DASHBOARD_LINES}
    try:
        for number, node in enumerate(nodes, start=1):
            data = yaml.safe_load(originals[node])
            for index, gpu in enumerate(data["gpus"]):
                readings = busy_readings(number, index)
                gpu["readings"] = {**gpu.get("readings", {}), **readings}
                for metric, (key, scale) in DASHBOARD_LINES.items():
                    expected[metric][(prometheus.targets[node], str(index))] = readings[key] * scale
            write_in_place(flow.specs[node], yaml.safe_dump(data, sort_keys=False))

        def lines(expr: str) -> dict[tuple[str, str], float]:
            return {(labels["instance"], labels["gpu"]): value for labels, value in prometheus.query(expr)}

        prometheus.wait_until(
            "the new readings in Prometheus",
            lambda: all(lines(metric) == pytest.approx(expected[metric]) for metric in expected),
            timeout=30,
        )
        board = dashboard()
        variables = {
            name: prometheus.label_values(*re.fullmatch(r"label_values\((\w+), (\w+)\)", query).group(2, 1))
            for name, query in board["variables"].items()
        }
        assert sorted(variables["instance"]) == sorted(prometheus.targets[node] for node in nodes)
        assert sorted(variables["gpu"], key=int) == [str(index) for index in range(8)]
        drawn = set()
        for panel in board["panels"]:
            expr = filled(panel["expr"], variables)
            metric = re.search(r"DCGM_FI_\w+", expr).group(0)
            scale = 1_000_000 if expr.endswith("* 1000000") else 1  # the SM clock panel draws Hz
            aggregate = re.match(r"(avg|sum)\(", expr)
            if aggregate:
                ((_labels, value),) = prometheus.query(expr)
                want = AGGREGATES[aggregate.group(1)](list(expected[metric].values()))
                assert value == pytest.approx(want), panel
            else:
                got = lines(expr)
                assert got == pytest.approx({key: value * scale for key, value in expected[metric].items()}), panel
            drawn.add(metric)
        assert drawn == set(DASHBOARD_LINES)
    finally:
        for node in nodes:
            write_in_place(flow.specs[node], originals[node])


def test_an_xid_of_class_none_and_an_unknown_xid_change_nothing(flow: Flow) -> None:
    lab, node = flow.lab, flow.node1
    steady = start_pod(lab, "steady", node)
    flow.pods["steady"] = steady.metadata.uid
    ignored = set_xid(flow, node, 0, 13)  # a graphics engine exception: the application's, class none
    unknown = set_xid(flow, node, 1, 999)  # not in NVIDIA's catalog: the default class, device
    wait_class(lab, node, unknown, "device")
    lab.wait_until(
        f"XID 13 of {ignored} in the health file",
        lambda: [x["xid"] for x in health(lab, node)[ignored]["xids"]] == [13],
    )
    assert health(lab, node)[ignored]["healthy"]
    run = remediate(flow)
    assert run.returncode == 0, run.summary()
    assert run.changed == 0, run.changed_tasks()
    message = message_for(run, node)
    assert message.startswith(f"{node}: nothing to do, no GPU needs more than leaving scheduling (")
    assert f"GPU 1 ({unknown}): device, XID 999 is not in the catalog table: the default class device" in message
    assert remediation(lab, node) == (False, None)
    assert pod_uid(lab, "steady") == flow.pods["steady"]


def test_check_mode_prints_the_plan_and_changes_nothing(flow: Flow) -> None:
    lab, node = flow.lab, flow.node2
    for name in ("victim", "bystander"):
        flow.pods[name] = start_pod(lab, name, node).metadata.uid
    # The reset XID hits the GPU the victim holds (its device ID is the GPU's UUID).
    flow.victim_gpu = lab.checkpoint_devices(node, flow.pods["victim"])[0]
    assert flow.victim_gpu not in lab.checkpoint_devices(node, flow.pods["bystander"])
    set_xid(flow, node, gpu_index(flow, node, flow.victim_gpu), 48)  # double bit ECC error: reset
    wait_class(lab, node, flow.victim_gpu, "reset")
    run = remediate(flow, "--check")
    assert run.returncode == 0, run.summary()
    assert run.changed == 0, run.changed_tasks()
    index = gpu_index(flow, node, flow.victim_gpu)
    assert message_for(run, node) == (
        f"Check mode, nothing is done. {node}: reset starts now for GPU {index} ({flow.victim_gpu}): XID 48 (double"
        " bit ECC error): catalog WORKFLOW_XID_48."
    )
    assert message_for(run, flow.node1).startswith(f"Check mode, nothing is done. {flow.node1}: nothing to do")
    for name in ("victim", "bystander"):
        assert pod_uid(lab, name) == flow.pods[name]
    assert remediation(lab, node) == (False, None)
    assert record(lab, node) == {}


def test_with_a_limit_of_one_the_reboot_goes_first_and_the_reset_waits(flow: Flow) -> None:
    lab, node, other = flow.lab, flow.node1, flow.node2
    # Two GPU pods of one app on node 1 under a budget of one disruption: node 2 is cordoned while they are placed,
    # so both land on node 1; their replacements can run on node 2's healthy GPUs once node 1 is drained.
    lab.core.patch_node(other, {"spec": {"unschedulable": True}})
    app = f"train-{uuid.uuid4().hex[:6]}"
    apps, policy = client.AppsV1Api(lab.api), client.PolicyV1Api(lab.api)
    apps.create_namespaced_deployment(
        NAMESPACE,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": app, "labels": labels(app)},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": {"labels": labels(app)}, "spec": pod_spec(None)},
            },
        },
    )
    policy.create_namespaced_pod_disruption_budget(
        NAMESPACE,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": app, "labels": labels(app)},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        },
    )
    placed = lab.wait_until(
        f"2 pods of {app} Ready on {node}",
        lambda: len(pods := [p for p in app_pods(lab, app) if ready(p) and p.spec.node_name == node]) == 2 and pods,
        timeout=180,
    )
    lab.wait_until(
        f"the budget of {app} allowing one disruption",
        lambda: (policy.read_namespaced_pod_disruption_budget(app, NAMESPACE).status.disruptions_allowed or 0) == 1,
    )
    lab.core.patch_node(other, {"spec": {"unschedulable": False}})
    starts, boot = container_restarts(node), boot_id(lab, node)

    watch = NodeWatch(lab, node, app)
    watch.start()
    fallen = set_xid(flow, node, 2, 79)  # fallen off the bus: reboot
    injected = time.monotonic()
    wait_class(lab, node, fallen, "reboot")
    seen = time.monotonic()
    run = remediate(flow)
    watch.stop.set()
    watch.join()
    restarts = container_restarts(node)
    assert run.returncode == 0, f"{run.summary()}\n{node}'s container restarts: {starts} before, {restarts} now"

    # The breaker: one slot, the reboot (the more severe) takes it, the reset waits and is told why.
    assert summary(run) == (
        f"Remediation slots: 1 of 1 in use (gpu_remediation_max_nodes 1): {node} (reboot). Started now: {node}."
        f" Waiting for a slot: {other}."
    )
    assert message_for(run, node).startswith(f"{node}: reboot starts now for GPU 2 ({fallen}): XID 79")
    assert (
        f"; waits, 1 of 1 remediation slot(s) being taken ({node} (reboot); gpu_remediation_max_nodes 1)."
        " The node is left untouched" in message_for(run, other)
    )
    assert remediation(lab, other) == (False, None)
    for name in ("victim", "bystander"):
        assert pod_uid(lab, name) == flow.pods[name]

    # Node 1: cordoned and tainted, drained within the budget, rebooted, healthy, given back.
    assert watch.taint_seen == "reboot" and watch.cordoned_at is not None and watch.back_at is not None
    assert remediation(lab, node) == (False, None)
    assert lab.node_ready(node)
    evicted = [m for m in messages(run) if m.startswith(f"{node}: evicted ")]
    assert len(evicted) == 1, run.summary()
    for name in [p.metadata.name for p in placed] + ["steady"]:
        assert f"{NAMESPACE}/{name}" in evicted[0]
    refused = int(re.search(r"; (\d+) eviction\(s\) refused by a PodDisruptionBudget", evicted[0]).group(1))
    assert refused >= 1, evicted[0]  # the second pod waited for the first one's replacement
    assert watch.fewest_ready is not None and watch.fewest_ready >= 1
    assert pod_uid(lab, "steady") is None
    assert restarts == starts + 1 and boot_id(lab, node) != boot
    # The reboot ended only node 1's container: node 2's cgroups are intact (podman exec works) and its pods run.
    assert lab.node_exec(other, "true").returncode == 0
    rows = health(lab, node)
    assert all(row["healthy"] and row["class"] == "none" for row in rows.values()), rows
    last = record(lab, node)["history"][-1]
    assert (last["class"], last["result"], last["gpus"]) == ("reboot", "healthy", [fallen])
    lab.wait_until(
        f"{app} back to 2 Ready pods", lambda: sum(1 for p in app_pods(lab, app) if ready(p)) == 2, timeout=180
    )
    # The rebooted node runs GPU pods again (its CDI specification was written again at its start).
    start_pod(lab, "after-reboot", node)

    print(
        f"\nremediate.yml, reboot class on {node}: XID to the daemon's health file {seen - injected:.1f}s;"
        f" XID to cordoned and tainted {watch.cordoned_at - injected:.1f}s;"
        f" XID to schedulable again {watch.back_at - injected:.1f}s;"
        f" the playbook run {run.seconds:.1f}s ({refused} eviction(s) refused by the budget)"
    )


def test_the_next_run_resets_the_gpu_and_evicts_only_its_pod(flow: Flow) -> None:
    lab, node = flow.lab, flow.node2
    on_node = lab.core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}").items
    others = {p.metadata.name: p.metadata.uid for p in on_node if p.metadata.name != "victim"}
    assert "bystander" in others and len(others) >= 2, others  # the bystander and the app's replacement(s)
    # DCGM's host engine (the lab's double) holds NVML open on the node: the reset works only once the run stops it.
    lab.node_exec(node, "systemctl", "start", DCGM)
    lab.wait_until(f"{DCGM} holding NVML on {node}", lambda: holds_nvml(lab, node, DCGM), timeout=30)
    # The GPU is in persistence mode (the spec's default), in which it is not reset.
    assert persistence_mode(lab, node, flow.victim_gpu) == 1
    watch = NodeWatch(lab, node)
    watch.start()
    # As Event-Driven Ansible runs it for the node an alert names: limited to that node.
    run = remediate(flow, "--limit", node)
    watch.stop.set()
    watch.join()
    assert run.returncode == 0, run.summary()
    assert set(run.recap) == {node}
    index = gpu_index(flow, node, flow.victim_gpu)
    assert message_for(run, node).startswith(f"{node}: reset starts now for GPU {index} ({flow.victim_gpu}): XID 48")
    assert summary(run).startswith(f"Remediation slots: 1 of 1 in use (gpu_remediation_max_nodes 1): {node} (reset).")
    assert watch.taint_seen == "reset" and watch.back_at is not None
    assert f"changed: [{node}] => (item={flow.victim_gpu})" in run.output  # the reset command, for that GPU only
    # The node has no NVSwitch (read only because a GPU needs a reset): one GPU may be reset alone.
    assert task_lines(run, "Read the node's GPUs and NVSwitches, to know whether one GPU can be reset alone") == [
        f"ok: [{node}]"
    ]
    stopped_and_started = [f"changed: [{node}] => (item={DCGM})"]
    assert task_lines(run, "Stop the node's other services that keep GPUs open") == stopped_and_started
    assert task_lines(run, "Start the node's other services again") == stopped_and_started
    assert holds_nvml(lab, node, DCGM), f"{DCGM} is running again after the reset"
    off_and_on = [f"changed: [{node}] => (item={flow.victim_gpu})"]  # that GPU only
    assert task_lines(run, "Turn persistence mode off on the GPUs to reset") == off_and_on
    assert task_lines(run, "Turn persistence mode on again where it was") == off_and_on
    assert persistence_mode(lab, node, flow.victim_gpu) == 1
    assert pod_uid(lab, "victim") is None
    for name, uid in others.items():  # the pods on the node's other GPUs keep running
        assert pod_uid(lab, name) == uid, name
    assert remediation(lab, node) == (False, None)
    row = health(lab, node)[flow.victim_gpu]
    assert row["healthy"] and row["class"] == "none"
    last = record(lab, node)["history"][-1]
    assert (last["class"], last["result"], last["gpus"]) == ("reset", "healthy", [flow.victim_gpu])


def test_the_same_gpu_failing_again_within_the_window_goes_to_replace(flow: Flow) -> None:
    lab, node = flow.lab, flow.node2
    set_xid(flow, node, gpu_index(flow, node, flow.victim_gpu), 64)  # row remapping failure: reset, again
    wait_class(lab, node, flow.victim_gpu, "reset")
    run = remediate(flow)
    assert run.returncode == 0, run.summary()
    message = message_for(run, node)
    assert message.startswith(f"{node}: replace starts now for GPU ")
    assert f"({flow.victim_gpu}) failed again within 24h of the reset that made it healthy at" in message
    assert remediation(lab, node) == (True, "replace")
    left = [
        m
        for m in messages(run)
        if m.startswith(f"{node} is cordoned and tainted {TAINT}=replace and left for a person")
    ]
    assert len(left) == 1, run.summary()
    assert pod_uid(lab, "bystander") == flow.pods["bystander"]  # nothing is evicted for a person to look at


def test_a_node_that_does_not_come_back_in_time_stays_out_and_the_next_run_continues(flow: Flow) -> None:
    lab, node = flow.lab, flow.node1
    fallen = set_xid(flow, node, 4, 79)
    wait_class(lab, node, fallen, "reboot")
    starts = container_restarts(node)
    late = remediate(flow, "-e", "gpu_remediation_max_nodes=2", "-e", "gpu_remediation_reboot_timeout=0")
    assert late.returncode != 0 and late.recap[node]["failed"] == 1, late.summary()
    words = " ".join(late.output.split())
    assert (
        f"{node} is left cordoned and tainted ({TAINT}=reboot) and holds a remediation slot: it did not come back from"
        " its reboot within 0 s (" in words
    ), late.summary()
    assert remediation(lab, node) == (True, "reboot")
    lab.wait_until(f"{node} restarted", lambda: container_restarts(node) == starts + 1, timeout=120)

    again = remediate(flow, "-e", "gpu_remediation_max_nodes=2")
    assert again.returncode == 0, again.summary()
    # The node that did not come back held its slot; the one to replace holds the other.
    assert summary(again).startswith(
        f"Remediation slots: 2 of 2 in use (gpu_remediation_max_nodes 2): {node} (reboot), {flow.node2} (replace)."
    )
    assert message_for(again, node).startswith(f"{node}: continues the reboot it is under since ")
    assert "rebooted already" in message_for(again, node)
    assert message_for(again, flow.node2).startswith(f"{flow.node2}: under remediation as replace since ")
    assert task_lines(again, "Reboot the node and wait until it answers with a new boot ID") == [f"skipping: [{node}]"]
    assert container_restarts(node) == starts + 1  # not rebooted a second time
    assert remediation(lab, node) == (False, None)
    assert health(lab, node)[fallen]["healthy"]


# --- an alert storm for both nodes and a run by hand at once (make test-full) ---------------------------------------
EDA_TOKEN = "gpuops-e2e-storm-token"
STORM = 20  # alerts per node, sent as fast as the source takes them
REPO = Path(__file__).resolve().parents[2]


class TaintWatch(threading.Thread):
    """A watch on the API server's Nodes (every event, in resourceVersion order): each node's remediation taint as it
    changes, and the most nodes seen under remediation at one moment."""

    def __init__(self, lab: Lab, nodes: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.lab, self.nodes = lab, nodes
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.state: dict[str, str | None] = {}
        self.changes: list[tuple[float, dict[str, str | None]]] = []
        self.most = 0
        self.error: BaseException | None = None

    def taint_of(self, node: client.V1Node) -> str | None:
        values = [t.value for t in node.spec.taints or [] if t.key == TAINT]
        return values[0] if values else None

    def record(self, node: client.V1Node) -> None:
        name = node.metadata.name
        if name not in self.nodes or self.state.get(name, "unset") == (taint := self.taint_of(node)):
            return
        self.state[name] = taint
        self.changes.append((time.monotonic(), dict(self.state)))
        self.most = max(self.most, sum(1 for value in self.state.values() if value))

    def run(self) -> None:
        from kubernetes import watch

        try:
            listed = self.lab.core.list_node()
            for node in listed.items:
                self.record(node)
            version = listed.metadata.resource_version
            self.ready.set()
            while not self.stop.is_set():
                stream = watch.Watch()
                for event in stream.stream(self.lab.core.list_node, resource_version=version, timeout_seconds=5):
                    version = event["object"].metadata.resource_version
                    self.record(event["object"])
                    if self.stop.is_set():
                        stream.stop()
        except Exception as error:  # the test reports it
            self.error = error
            self.ready.set()


def eda_environment() -> tuple[Path, dict[str, str]]:
    """ansible-rulebook's environment (scripts/eda-env.sh, cached) and the JDK its rule engine runs on."""
    done = subprocess.run([str(REPO / "scripts/eda-env.sh")], capture_output=True, text=True, timeout=1800, check=True)
    venv = Path(done.stdout.strip().splitlines()[-1])
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    env = dict(
        os.environ,
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        JAVA_HOME=f"/usr/lib/jvm/java-17-openjdk-{arch}",
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_NOCOLOR="1",
        PYTHONUNBUFFERED="1",
    )
    return venv, env


def post_alert(port: int, node: str, index: int, gpu: str, xid: int, klass: str) -> int:
    body = json.dumps({"node": node, "gpu": index, "uuid": gpu, "xid": xid, "class": klass}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/alerts", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {EDA_TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:  # not listening yet
        return 0


def fresh_nodes(flow: Flow) -> None:
    """Both nodes as a person leaves them after replacing a GPU: no remediation taint or cordon, no XID, no record of
    past remediations and the daemon started afresh (no fault carried over)."""
    lab = flow.lab
    for node in (flow.node1, flow.node2):
        data = yaml.safe_load(flow.specs[node].read_text())
        for gpu in data["gpus"]:
            gpu.pop("xid", None)
        write_in_place(flow.specs[node], yaml.safe_dump(data, sort_keys=False))
        taints = [t for t in lab.node(node).spec.taints or [] if t.key != TAINT]
        lab.core.patch_node(
            node,
            {
                "spec": {"unschedulable": False, "taints": [lab.api.sanitize_for_serialization(t) for t in taints]},
                "metadata": {"annotations": {"gpuops.k8s/gpu-remediation": None}},
            },
        )
        lab.node_exec(node, "systemctl", "stop", "gpuops-device-plugin")
        lab.node_exec(node, "rm", "-f", RECORD, HEALTH_FILE)
        since = lab.node_exec(node, "date", "+@%s").stdout.strip()
        lab.node_exec(node, "systemctl", "start", "gpuops-device-plugin")
        # An XID is heard only once the daemon registered for the GPUs' events, which it logs.
        lab.wait_until(
            f"the daemon on {node} to watch NVML events",
            lambda node=node, since=since: (
                "watching NVML events"
                in lab.node_exec(node, "journalctl", "-u", "gpuops-device-plugin", "--since", since, "-o", "cat").stdout
            ),
            timeout=180,
        )
        lab.wait_until(f"8 x {GPU} on {node}", lambda node=node: lab.allocatable(node).get(GPU) == "8", timeout=180)


@pytest.mark.full
def test_an_alert_storm_for_both_nodes_and_a_run_by_hand_never_have_two_nodes_under_remediation(
    flow: Flow, tmp_path: Path
) -> None:
    """A reset XID on a GPU of each node; then, at once: ansible-rulebook with the shipped rulebook receives STORM
    alerts for each node (it runs the real remediate.yml for the node, one run at a time) while a person runs
    remediate.yml over both nodes by hand. The limit is one node (the default). A watch on the API server sees every
    change of the Nodes' taints: never two nodes under remediation. Each node ends schedulable, or a run named it as
    waiting for a slot."""
    lab = flow.lab
    nodes = (flow.node1, flow.node2)
    fresh_nodes(flow)
    gpus = {node: set_xid(flow, node, 6, 48) for node in nodes}  # double bit ECC error: reset
    for node in nodes:
        wait_class(lab, node, gpus[node], "reset")

    venv, env = eda_environment()
    port = int(
        subprocess.check_output(
            [
                sys.executable,
                "-c",
                "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])",
            ],
            text=True,
        )
    )
    variables = tmp_path / "vars.yml"
    variables.write_text(
        yaml.safe_dump({"gpu_alerts_port": port, "gpu_alerts_token": EDA_TOKEN, "gpu_alerts_node_burst": STORM})
    )
    log = tmp_path / "ansible-rulebook.log"
    command = [
        str(venv / "bin/ansible-rulebook"),
        "--rulebook",
        "gpuops.k8s.gpu_remediation",
        "--inventory",
        str(flow.inventory),
        "--vars",
        str(variables),
        "--print-events",
    ]
    watch = TaintWatch(lab, nodes)
    watch.start()
    assert watch.ready.wait(60) and watch.error is None, watch.error
    with log.open("wb") as out:
        rulebook = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        lab.wait_until(
            "the gpu_alerts source to answer",
            lambda: rulebook.poll() is None and post_alert(port, nodes[0], 0, gpus[nodes[0]], 13, "none") == 200,
            timeout=300,
            interval=1,
        )
        statuses: list[int] = []

        def storm() -> None:
            for node in [each for _round in range(STORM) for each in nodes]:
                statuses.append(post_alert(port, node, 6, gpus[node], 48, "reset"))

        sender = threading.Thread(target=storm)
        sender.start()
        by_hand = remediate(flow)  # both nodes, at the same time as the rulebook's runs
        sender.join()
        # The rulebook's actions run one at a time in the order the alerts came: a class none alert sent last is
        # printed once every run before it ended. The storm spent the node's burst: the sentinel is sent again, as
        # an alert sender does on a 429, until the node's bucket took it.
        sentinel = set_xid(flow, nodes[1], 0, None)
        lab.wait_until(
            "the gpu_alerts source to take the last alert",
            lambda: post_alert(port, nodes[1], 0, sentinel, 13, "none") == 200,
            timeout=120,
            interval=2,
        )
        line = f"gpu_alerts: node {nodes[1]} GPU 0 ({sentinel}) XID 13 is of class none; no node action is taken."
        lab.wait_until("the rulebook's runs to end", lambda: line in log.read_text(errors="replace"), timeout=900)
    finally:
        rulebook.send_signal(signal.SIGINT)
        try:
            rulebook.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rulebook.kill()
    output = log.read_text(errors="replace")
    print(f"{len(statuses)} alerts: {dict(collections.Counter(statuses))}")
    assert statuses.count(200) >= 2 and set(statuses) <= {200, 429}, statuses  # each alert answered, none lost
    assert "Remediation slots:" in output, output[-4000:]  # the rulebook ran remediate.yml
    words = " ".join((by_hand.output + output).split())
    for node in nodes:
        cordoned, taint = remediation(lab, node)
        # The plan's line (the breaker counted from the Nodes read) or the taint's (counted again under the Lease).
        planned = re.search(rf"{re.escape(node)}: reset for GPU 6 \({re.escape(gpus[node])}\)[^.]*?; waits,", words)
        assert (not cordoned and taint is None) or planned or f"{node} waits: " in words, (node, cordoned, taint)
    # The next run (an AWX schedule's, or a person's) takes the node that waited, the watch still on.
    later = remediate(flow)
    watch.stop.set()
    watch.join(timeout=30)
    print(f"taint changes seen: {len(watch.changes)}: {watch.changes}")
    assert later.returncode == 0, later.summary()
    assert watch.error is None, watch.error
    # Both nodes were under remediation at some moment, never both at once, and both are back.
    assert {node for _when, state in watch.changes for node, value in state.items() if value == "reset"} == set(nodes)
    assert watch.most == 1, watch.changes
    for node in nodes:
        assert remediation(lab, node) == (False, None), node
        assert health(lab, node)[gpus[node]]["healthy"], node
