"""site.yml partitions a lab node's GPUs with MIG by mig-parted config name, proven against the lab's real
kube-apiserver, scheduler, kubelet and containerd (and, under the DaemonSet deployment, the DaemonSet controller).

The node has 8 x H100 80GB (tests/fixtures/simulated/h100x8.yaml: NVLink islands 0-3 and 4-7) served by the lab's
mock NVIDIA driver (its libnvidia-ml.so.1, which models MIG as docs/mock-nvml.md says, its device nodes and MIG
capability devices), the only stand-ins. Everything reads the GPUs through NVML: the nvidia_mig module partitions
them, the plugin (migStrategy mixed) and the DRA driver serve their MIG devices, nvidia-ctk writes them into the CDI
specification the nvidia runtime gives pods, and site.yml's discovery reads them for the labels (the module runs
with gpuops_simulate_from empty, where the other modules read the spec: the spec does not change with MIG).

The core (the tests not marked full) runs one chain of steps, each path once, in device-plugin allocation under the
systemd deployment: MIG off (all-disabled, the setup); all-1g.10gb failing half-way (a fault injected into the mock
library) and rolled back; `--check` to all-1g.10gb, which evicts and writes nothing; none -> all-1g.10gb, where the pod
on four GPUs is evicted before the write and the node is fenced (a taint) from before the eviction until after it, and
a pod on two of the MIG devices is their holder in the daemon's dcgm metrics; a run
to all-1g.10gb cut short after the write (the daemon stopped, the fence left), undone by the next run before it labels
success. Then remediate.yml on that node, for a reset-class XID on GPU 1 and then a reboot-class XID on GPU 2: the
reset and the reboot take the GPUs' MIG devices (the lab node's boot does to them what a reboot does), and the node is
given back only once the nvidia_mig role applied the layout again and the Node advertises its 56 MIG devices again.
Then in DRA allocation: the node moved to DRA with MIG off, then none -> all-1g.10gb, where the DRA driver's
slice follows the layout and the pod whose ResourceClaim holds a GPU is evicted. Last, the DaemonSet deployment of the
plugin (its image imported by the role, as in test_site_daemonset.py): none -> all-1g.10gb with a pod on four GPUs,
found by gpu-pods in the plugin's pod and evicted, the plugin's pod stepping aside for the mode change (the pause label,
which the DaemonSet's node affinity excludes) and a new one serving the new devices, whose dcgm metrics name a pod on
two of them as their holder; the label never stays. At each step
the node's allocatable MIG devices (or its DRA slice) and its labels follow, and a second run changes nothing.

`make test-full` (GPUOPS_TEST_FULL=1) adds, each at the point of the chain whose state it needs: all-1g.10gb while
an NVML client the collection does not own holds the mode change pending (the lab's GPU reset double refuses the
reset, the run is rolled back); after the cut-short run, the config-name matrix all-1g.10gb -> lab-mixed (GPUs 0-3
keep their MIG devices, 4-7 turn MIG off) -> all-disabled, where each 28-device pod gets one NVLink island from the
plugin's preferred allocation and only the pods on the GPUs whose layout changes are evicted while a pod on a GPU
that keeps its layout keeps running; and under the DaemonSet deployment all-1g.10gb failing half-way, rolled back,
the plugin's pod back.

The module leaves the node in device-plugin allocation with MIG off under the systemd deployment, as it found it
(one site.yml run at the end, from wherever the last step left it).
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PAUSE_IMAGE, Lab, container_restarts, full_suite, run_lab, write_xid
from daemonset_checks import dcgm_exposition, ready_pod
from daemonset_node import DAEMONSET, build_plugin_archive
from dra_objects import RESOURCE, claim_template, pod_manifest, published
from gpuops_lab.config import LabConfig
from kubernetes import client
from playbook_run import PlaybookRun, lab_inventory, run_playbook

# The whole module runs under make test-full: make test's budget on 2 cores leaves no room for its converges. The
# nvidia_mig module's layouts, rollback and second runs are in the integration tier (test_nvidia_mig.py) and the fence
# and eviction against a real kube-apiserver in test_nvidia_mig_fence_api.py. Within make test-full, the tests not
# marked full are the core and those marked full the config-name matrix (the docstring above).
pytestmark = pytest.mark.full

GPU = "nvidia.com/gpu"
MIG_1G = "nvidia.com/mig-1g.10gb"
SERVICE = "gpuops-device-plugin"
PART_OF = "test-site-mig"
ISLANDS = ({0, 1, 2, 3}, {4, 5, 6, 7})
# GPUs 0-3 keep seven 1g.10gb each, GPUs 4-7 turn MIG off: the mixed layout changes one island only.
LAB_MIXED = {
    "version": "v1",
    "mig-configs": {
        "lab-mixed": [
            {"devices": [0, 1, 2, 3], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
            {"devices": [4, 5, 6, 7], "mig-enabled": False},
        ]
    },
}
# The tenth GPU instance the write creates (nvmlDeviceCreateGpuInstanceWithPlacement) fails (NVML_ERROR_UNKNOWN): GPU 0
# has its seven, GPU 1 two.
FAULT = {"GPUOPS_MOCK_NVML_FAIL": "nvmlDeviceCreateGpuInstanceWithPlacement:999@10"}
# The node label with which the nvidia_mig role keeps the plugin's DaemonSet pod off the node while a MIG mode changes.
PAUSE_LABEL = "gpuops.k8s/device-plugin.paused"
# The taint that keeps new pods off the node from before the eviction until the daemon serves the new devices, and the
# node's record of what a run fenced, stopped and paused (removed once the run undid it).
FENCE_TAINT = "gpuops.k8s/mig-reconfiguring"
RUN_RECORD = "/var/lib/gpuops/nvidia-mig-run.json"
# An NVML client the collection does not own (a monitoring agent), as a transient unit in the node.
HOLDER = "gpuops-test-nvml-holder"
HOLD = "import time, pynvml; pynvml.nvmlInit(); time.sleep(3600)"
# The node's MIG layout as NVML reports it (the node's python3-pynvml on the mock library).
LAYOUT_SCRIPT = r"""
import json
import pynvml as nvml

def text(value):
    return value.decode() if isinstance(value, bytes) else value

nvml.nvmlInit()
gpus = []
for index in range(nvml.nvmlDeviceGetCount()):
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    current, pending = nvml.nvmlDeviceGetMigMode(handle)
    devices = []
    if current:
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:
                continue
            devices.append({"uuid": text(nvml.nvmlDeviceGetUUID(mig)),
                            "profile": text(nvml.nvmlDeviceGetName(mig)).rsplit(" ", 1)[-1]})
    gpus.append({"index": index, "uuid": text(nvml.nvmlDeviceGetUUID(handle)), "mig": [current, pending],
                 "devices": devices})
nvml.nvmlShutdown()
print(json.dumps(gpus))
"""


@dataclass
class Step:
    """One site.yml run to a config, and what was seen around it."""

    config: str
    first: PlaybookRun
    second: PlaybookRun | None
    layout: list[dict[str, Any]]
    labels: dict[str, str]
    allocatable: dict[str, str]
    plugin_active: str
    pods_before: dict[str, str] = field(default_factory=dict)  # pod name -> uid
    pods_after: dict[str, str | None] = field(default_factory=dict)  # pod name -> uid, None when gone


@dataclass
class Flow:
    lab: Lab
    node: str
    inventory: Path
    base_vars: Path
    setup: PlaybookRun | None = None


def layout(lab: Lab, node: str) -> list[dict[str, Any]]:
    return json.loads(lab.node_exec(node, "python3", "-c", LAYOUT_SCRIPT).stdout)


def summary(gpus: list[dict[str, Any]]) -> list[tuple[bool, dict[str, int]]]:
    """Per GPU: MIG mode on (current and pending alike, else it fails) and its profile counts."""
    assert all(g["mig"][0] == g["mig"][1] for g in gpus), gpus
    return [(bool(g["mig"][0]), dict(Counter(d["profile"] for d in g["devices"]))) for g in gpus]


OFF = (False, {})
SEVEN = (True, {"1g.10gb": 7})


def mig_labels(lab: Lab, node: str) -> dict[str, str]:
    labels = lab.node(node).metadata.labels or {}
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig.config")}


def resources(lab: Lab, node: str) -> dict[str, int]:
    allocatable = lab.allocatable(node)
    return {name: int(allocatable.get(name, "0")) for name in (GPU, MIG_1G)}


def pod_uid(lab: Lab, name: str) -> str | None:
    """The pod's uid while it exists and is not being deleted."""
    try:
        pod = lab.core.read_namespaced_pod(name, "default")
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return None if pod.metadata.deletion_timestamp else pod.metadata.uid


def gpu_pod(name: str, node: str, resource: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": PART_OF}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": False,
            "dnsPolicy": "Default",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "gpu",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {resource: str(count)}},
                }
            ],
        },
    }


def start_pod(lab: Lab, manifest: dict[str, Any]) -> str:
    """Create the pod, wait until it runs, return its uid."""
    name = manifest["metadata"]["name"]
    lab.core.create_namespaced_pod("default", manifest)
    pod = lab.wait_until(
        f"pod {name} Running",
        lambda: (p := lab.core.read_namespaced_pod(name, "default")).status.phase == "Running" and p,
        timeout=180,
    )
    return pod.metadata.uid


def pod_gpus(lab: Lab, node: str, uid: str, resource: str, gpus: list[dict[str, Any]]) -> set[int]:
    """The indexes of the GPUs whose devices the kubelet gave the pod (its device-manager checkpoint)."""
    parent = {d["uuid"]: g["index"] for g in gpus for d in g["devices"]}
    parent.update({g["uuid"]: g["index"] for g in gpus})
    return {parent[device] for device in lab.checkpoint_devices(node, uid, resource)}


def task_position(run: PlaybookRun, task: str, outcome: str = "changed") -> int | None:
    """Where in the output the task (by its name in the nvidia_mig role) reported OUTCOME, None if it did not."""
    header = f"TASK [gpuops.k8s.nvidia_mig : {task}]"
    at = run.output.find(header)
    while at >= 0:
        following = run.output[at:].split("\nTASK [", 1)[0]
        if f"\n{outcome}:" in following:
            return at
        at = run.output.find(header, at + 1)
    return None


class Runner:
    """site.yml on the node with the flow's variables and a step's own."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow

    def run(self, *args: str, **step_vars: Any) -> PlaybookRun:
        done = run_playbook(
            "site.yml",
            self.flow.inventory,
            "-e",
            json.dumps(step_vars),
            *args,
            extra_vars=self.flow.base_vars,
            limit=self.flow.node,
        )
        print(f"site.yml {json.dumps(step_vars)} {' '.join(args)}: rc {done.returncode}, {done.seconds:.0f}s")
        return done

    def step(
        self, config: str, pods: dict[str, str], wanted: dict[str, int] | None, twice: bool = True, **extra: Any
    ) -> Step:
        lab, node = self.flow.lab, self.flow.node
        first = self.run(gpu_mig_config=config, **extra)
        if wanted is not None:
            lab.wait_until(f"{node} allocatable {wanted}", lambda: resources(lab, node) == wanted, timeout=120)
        second = self.run(gpu_mig_config=config, **extra) if twice and first.returncode == 0 else None
        return Step(
            config=config,
            first=first,
            second=second,
            layout=layout(lab, node),
            labels=mig_labels(lab, node),
            allocatable=lab.allocatable(node),
            plugin_active=lab.node_exec(node, "systemctl", "is-active", SERVICE, check=False).stdout.strip(),
            pods_before=dict(pods),
            pods_after={name: pod_uid(lab, name) for name in pods},
        )


def after_full_steps(request: pytest.FixtureRequest, *steps: str) -> None:
    """Under `make test-full`, the exhaustive STEPS (fixtures that only full tests use) that come before a step of the
    chain run first, so that the step starts from what they left in either mode; in the core (not marked full) they
    do not run."""
    if full_suite():
        for step in steps:
            request.getfixturevalue(step)


@pytest.fixture(scope="module")
def flow(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flow]:
    """The first node converged by site.yml with MIG off (all-disabled), the plugin in systemd mode serving MIG
    devices as their own resources (migStrategy mixed), and GPU facts read through NVML. At the end of the module,
    the node goes back there from wherever the last step left it (in both modes, the DaemonSet deployment with
    all-1g.10gb: the pause path once more, turning MIG off)."""
    node = lab.nodes[0]
    work = tmp_path_factory.mktemp("site-mig")
    inventory = lab_inventory(work / "inventory.yml")
    base_vars = work / "vars.yml"
    base_vars.write_text(
        yaml.safe_dump(
            {
                "gpuops_simulate_from": "",
                "device_plugin_config": {"version": "v1", "flags": {"migStrategy": "mixed"}},
            }
        )
    )
    flow = Flow(lab, node, inventory, base_vars)
    flow.setup = Runner(flow).run(gpu_mig_config="all-disabled", gpu_allocation_mode="device_plugin")
    yield flow
    lab.core.delete_collection_namespaced_pod("default", label_selector=f"app.kubernetes.io/part-of={PART_OF}")
    # The remediations' record on the node: a later module's remediation of the same GPU would count as a repeat
    # within the window (and go to replace).
    lab.node_exec(node, "rm", "-f", REMEDIATION_RECORD)
    back = Runner(flow).run(gpu_mig_config="all-disabled", gpu_allocation_mode="device_plugin")
    assert back.returncode == 0, back.summary()


@pytest.fixture(scope="module")
def failed(flow: Flow) -> Step:
    """all-1g.10gb with a fault injected half-way into the write."""
    assert flow.setup is not None and flow.setup.returncode == 0, flow.setup and flow.setup.summary()
    # The plugin serves the old layout again: eight whole GPUs.
    return Runner(flow).step("all-1g.10gb", {}, {GPU: 8, MIG_1G: 0}, twice=False, nvidia_mig_environment=FAULT)


@pytest.fixture(scope="module")
def held(flow: Flow, failed: Step) -> Step:
    """all-1g.10gb while an NVML client the collection does not own keeps every MIG mode change pending: the
    write leaves the GPUs waiting for a reset, and the reset (the lab's double of nvidia-smi --gpu-reset) is
    refused as nvidia-smi refuses it."""
    lab, node = flow.lab, flow.node
    lab.node_exec(node, "systemd-run", f"--unit={HOLDER}", "python3", "-c", HOLD)
    lab.wait_until(
        "the NVML client to have NVML open",
        lambda: lab.node_exec(node, "systemctl", "is-active", HOLDER, check=False).stdout.strip() == "active",
    )
    try:
        return Runner(flow).step("all-1g.10gb", {}, {GPU: 8, MIG_1G: 0}, twice=False)
    finally:
        lab.node_exec(node, "systemctl", "stop", HOLDER, check=False)


@pytest.fixture(scope="module")
def check_run(flow: Flow, failed: Step, request: pytest.FixtureRequest) -> Step:
    """`site.yml --check` to all-1g.10gb, with a pod holding four GPUs (after `held` under `make test-full`; MIG is
    off and the labels say failed either way)."""
    after_full_steps(request, "held")
    pods = {"whole-a": start_pod(flow.lab, gpu_pod("whole-a", flow.node, GPU, 4))}
    runner = Runner(flow)
    check = runner.run("--check", gpu_mig_config="all-1g.10gb")
    lab, node = flow.lab, flow.node
    return Step(
        "all-1g.10gb",
        check,
        None,
        layout(lab, node),
        mig_labels(lab, node),
        lab.allocatable(node),
        lab.node_exec(node, "systemctl", "is-active", SERVICE, check=False).stdout.strip(),
        pods,
        {name: pod_uid(lab, name) for name in pods},
    )


@pytest.fixture(scope="module")
def all_1g(flow: Flow, check_run: Step) -> Step:
    """none -> all-1g.10gb: every GPU changes, so the pod holding four of them goes first."""
    return Runner(flow).step("all-1g.10gb", check_run.pods_before, {GPU: 0, MIG_1G: 56})


@pytest.fixture(scope="module")
def mixed(flow: Flow, mig_reboot: Remediation) -> tuple[Step, dict[str, set[int]]]:
    """`make test-full` only, after the cut-short run and the remediations (which leave all-1g.10gb): all-1g.10gb ->
    lab-mixed, with two pods of 28 MIG devices each: the plugin's preferred allocation puts each on one NVLink island
    (returned: pod name -> its GPUs). Only GPUs 4-7 change."""
    lab, node = flow.lab, flow.node
    gpus = layout(lab, node)
    pods, where = {}, {}
    for name in ("mig-a", "mig-b"):
        pods[name] = start_pod(lab, gpu_pod(name, node, MIG_1G, 28))
        where[name] = pod_gpus(lab, node, pods[name], MIG_1G, gpus)
    step = Runner(flow).step("lab-mixed", pods, {GPU: 4, MIG_1G: 28}, nvidia_mig_config=LAB_MIXED)
    return step, where


@pytest.fixture(scope="module")
def none_again(flow: Flow, mixed: tuple[Step, dict[str, set[int]]]) -> tuple[Step, dict[str, set[int]]]:
    """`make test-full` only: lab-mixed -> all-disabled, with a pod on four whole GPUs (4-7, the only whole ones)
    beside the MIG pod that stayed on 0-3. Only GPUs 0-3 change."""
    lab, node = flow.lab, flow.node
    step, where = mixed
    staying = {name: uid for name, uid in step.pods_after.items() if uid is not None}
    pods = dict(staying)
    pods["whole-b"] = start_pod(lab, gpu_pod("whole-b", node, GPU, 4))
    where = {name: where[name] for name in staying}
    where["whole-b"] = pod_gpus(lab, node, pods["whole-b"], GPU, layout(lab, node))
    return Runner(flow).step("all-disabled", pods, {GPU: 8, MIG_1G: 0}), where


@pytest.fixture(scope="module")
def dra(
    flow: Flow, mig_reboot: Remediation, request: pytest.FixtureRequest
) -> Iterator[tuple[Step, list[dict[str, Any]]]]:
    """The node moved to DRA allocation with MIG off by one run (in the core (not marked full) from the remediations'
    all-1g.10gb, turning MIG off on the way; under `make test-full` from none_again's all-disabled), then
    all-disabled -> all-1g.10gb there, with a pod whose ResourceClaim holds a whole GPU. Returns the step and the DRA
    slice's devices after it. The node stays in DRA allocation with all-1g.10gb until the DaemonSet part moves it."""
    after_full_steps(request, "none_again")
    lab, node = flow.lab, flow.node
    runner = Runner(flow)
    switch = runner.run(gpu_mig_config="all-disabled", gpu_allocation_mode="dra")
    assert switch.returncode == 0, switch.summary()
    objects = client.CustomObjectsApi(lab.api)
    template = f"one-gpu-{uuid.uuid4().hex[:6]}"
    objects.create_namespaced_custom_object(
        *RESOURCE, "default", "resourceclaimtemplates", claim_template(template, 1, "40Gi")
    )
    manifest = pod_manifest("dra-a", node, claim_template=template)
    manifest["metadata"]["labels"] = {"app.kubernetes.io/part-of": PART_OF}
    pods = {"dra-a": start_pod(lab, manifest)}
    step = runner.step("all-1g.10gb", pods, None, gpu_allocation_mode="dra")
    devices = lab.wait_until(
        "the DRA slice's 56 MIG devices",
        lambda: len(found := list(published(lab, node).values())) == 56 and found,
        timeout=120,
    )
    yield step, devices
    objects.delete_namespaced_custom_object(*RESOURCE, "default", "resourceclaimtemplates", template)


def succeeded_twice(step: Step) -> None:
    assert step.first.returncode == 0, step.first.summary()
    assert step.first.changed > 0, step.first.summary()
    assert step.second is not None and step.second.returncode == 0, step.second and step.second.summary()
    assert step.second.changed == 0, (step.second.changed_tasks(), step.second.summary())


def evicted_before_the_write(step: Step) -> None:
    evicted = task_position(step.first, "Evict those pods")
    written = task_position(step.first, "Write the MIG layout")
    assert evicted is not None and written is not None and evicted < written, step.first.summary()


def fenced_around_the_write(run: PlaybookRun) -> None:
    """The node was tainted before the pods were found and evicted, and the taint went after the write."""
    fenced = task_position(run, "Taint the node so that no new pod lands on the GPUs that change")
    found = task_position(run, "Find the pods that hold devices of the GPUs that change", "ok") or task_position(
        run, "Find the pods that hold devices of the GPUs that change, from the daemon's pod", "ok"
    )
    written = task_position(run, "Write the MIG layout")
    unfenced = task_position(run, "Remove the fence taint")
    assert None not in (fenced, found, written, unfenced), run.summary()
    assert fenced < found < written < unfenced, run.summary()


def fence_taints(lab: Lab, node: str) -> list[str]:
    return [t.key for t in lab.node(node).spec.taints or [] if t.key == FENCE_TAINT]


# --- the setup, and a failure half-way ------------------------------------------------------------------
def test_the_node_starts_with_mig_off(flow: Flow) -> None:
    assert flow.setup is not None and flow.setup.returncode == 0, flow.setup and flow.setup.summary()
    assert summary(layout(flow.lab, flow.node)) == [OFF] * 8
    assert mig_labels(flow.lab, flow.node) == {
        "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": "success",
    }


def test_a_layout_failing_half_way_is_rolled_back(failed: Step) -> None:
    assert failed.first.returncode != 0
    out = failed.first.output
    assert "did not take MIG config all-1g.10gb" in out, failed.first.summary()
    assert "Unknown Error" in out, failed.first.summary()
    assert "are back to the layout they had" in out, failed.first.summary()
    # The GPUs the write touched before the fault (0 with seven devices, 1 with two) have MIG off again.
    assert summary(failed.layout) == [OFF] * 8
    assert failed.labels == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "failed"}
    # The plugin runs again and serves the old layout.
    assert failed.plugin_active == "active"
    assert int(failed.allocatable.get(GPU, "0")) == 8
    assert int(failed.allocatable.get(MIG_1G, "0")) == 0


def test_the_lab_gpu_reset_double_refuses_while_the_plugin_has_nvml_open(flow: Flow, failed: Step) -> None:
    reset = flow.lab.node_exec(flow.node, "/usr/local/sbin/gpuops-lab-gpu-reset", failed.layout[0]["uuid"], check=False)
    assert reset.returncode == 1
    assert reset.stderr.strip() == f"Unable to reset GPU {failed.layout[0]['uuid']}: In use by another client"


@pytest.mark.full
def test_a_mode_change_another_nvml_client_holds_is_reset_or_rolled_back(held: Step) -> None:
    assert held.first.returncode != 0
    out = held.first.output
    # Every GPU waited for a reset; the role reset the first with the lab's double, which refused.
    assert task_position(held.first, "Write the MIG layout") is not None, held.first.summary()
    assert (
        f"gpuops-lab-gpu-reset {held.layout[0]['uuid']} exited 1: Unable to reset GPU {held.layout[0]['uuid']}:"
        " In use by another client" in " ".join(out.split())
    ), held.first.summary()
    # MIG mode is off again and nothing is pending (summary() fails on a pending mode).
    assert summary(held.layout) == [OFF] * 8
    assert held.labels == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "failed"}
    assert held.plugin_active == "active"


# --- none -> all-1g.10gb ----------------------------------------------------------------------------------
def test_check_mode_evicts_nothing_and_writes_nothing(check_run: Step) -> None:
    assert check_run.first.returncode == 0, check_run.first.summary()
    assert task_position(check_run.first, "Write the MIG layout") is not None, check_run.first.summary()
    assert summary(check_run.layout) == [OFF] * 8
    assert check_run.pods_after == check_run.pods_before
    assert check_run.plugin_active == "active"
    assert check_run.labels["nvidia.com/mig.config.state"] == "failed"


def test_all_1g_10gb_partitions_every_gpu_and_the_plugin_serves_56_mig_devices(all_1g: Step) -> None:
    succeeded_twice(all_1g)
    assert summary(all_1g.layout) == [SEVEN] * 8
    assert int(all_1g.allocatable[MIG_1G]) == 56
    assert int(all_1g.allocatable.get(GPU, "0")) == 0
    assert all_1g.labels == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}
    assert all_1g.plugin_active == "active"


def test_all_1g_10gb_evicts_the_pod_on_the_gpus_first(all_1g: Step) -> None:
    assert all_1g.pods_after == {"whole-a": None}
    evicted_before_the_write(all_1g)


def test_all_1g_10gb_fences_the_node_from_the_eviction_until_after_the_write(flow: Flow, all_1g: Step) -> None:
    fenced_around_the_write(all_1g.first)
    assert fence_taints(flow.lab, flow.node) == []
    assert flow.lab.node_exec(flow.node, "test", "-e", RUN_RECORD, check=False).returncode == 1


def mig_holders(text: str, pod: str) -> list[tuple[str, str, str]]:
    """The series of DCGM_FI_DEV_FB_USED in the daemon's dcgm metrics with the pod as holder: (the GPU's UUID,
    GPU_I_PROFILE, GPU_I_ID) each, "" for a label a series does not have."""
    found = []
    for labels in re.findall(r"^DCGM_FI_DEV_FB_USED\{([^}]*)\}", text, re.MULTILINE):
        series = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if series.get("pod") == pod:
            found.append((series["UUID"], series.get("GPU_I_PROFILE", ""), series.get("GPU_I_ID", "")))
    return sorted(found)


def two_mig_devices_held(lab: Lab, node: str, name: str, exposition: Callable[[], str]) -> None:
    """A pod given two 1g.10gb is the holder on those two MIG devices' own series in the daemon's dcgm metrics (their
    GPU's UUID, GPU_I_PROFILE, two GPU instances), on no other series, and on none once it is gone."""
    uid = start_pod(lab, gpu_pod(name, node, MIG_1G, 2))
    try:
        parent = {d["uuid"]: g["uuid"] for g in layout(lab, node) for d in g["devices"]}
        given = sorted(parent[device] for device in lab.checkpoint_devices(node, uid, MIG_1G))
        held = lab.wait_until(
            f"{name} in the dcgm metrics",
            lambda: len(found := mig_holders(exposition(), name)) == 2 and found,
            timeout=30,
        )
        assert [gpu for gpu, _profile, _instance in held] == given
        assert {profile for _gpu, profile, _instance in held} == {"1g.10gb"}
        assert len({(gpu, instance) for gpu, _profile, instance in held}) == 2
    finally:
        lab.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        lab.wait_until(
            f"pod {name} gone",
            lambda: (
                pod_uid(lab, name) is None
                and not lab.core.list_namespaced_pod("default", field_selector=f"metadata.name={name}").items
            ),
        )
    lab.wait_until(f"{name} gone from the dcgm metrics", lambda: not mig_holders(exposition(), name), timeout=30)


def test_a_pod_on_two_mig_devices_is_their_holder_in_the_dcgm_metrics(flow: Flow, all_1g: Step) -> None:
    """The plugin's MIG devices in the dcgm metrics of the daemon's service, at the node's port."""
    lab, node = flow.lab, flow.node
    address = f"127.0.0.1:{LabConfig.from_env().dcgm_port(lab.nodes.index(node) + 1)}"

    def exposition() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
            return reply.read().decode()

    two_mig_devices_held(lab, node, "mig-held", exposition)


# --- a run cut short (an unreachable node, a killed controller) after the write ---------------------------------
@pytest.fixture(scope="module")
def cut_short(flow: Flow, all_1g: Step) -> Step:
    """What a run to all-1g.10gb leaves when the node drops out of it after the write: the layout is all-1g.10gb
    already, the plugin stopped, the fence taint on the Node and the run's record on the node. The next run to the
    same config (the read finds nothing to change) must undo them before it labels the node success."""
    lab, node = flow.lab, flow.node
    record = {"fence_taint": FENCE_TAINT, "stopped_unit": f"{SERVICE}.service", "paused": False}
    lab.node_exec(node, "sh", "-c", f"cat > {RUN_RECORD}", input_text=json.dumps(record) + "\n")
    lab.node_exec(node, "systemctl", "stop", SERVICE)
    taints = [t.to_dict() for t in lab.node(node).spec.taints or []]
    taints.append({"key": FENCE_TAINT, "effect": "NoSchedule"})
    lab.core.patch_node(node, {"spec": {"taints": [{k: v for k, v in t.items() if v is not None} for t in taints]}})
    return Runner(flow).step("all-1g.10gb", {}, {GPU: 0, MIG_1G: 56})


def test_a_run_cut_short_is_undone_by_the_next_before_it_labels_success(flow: Flow, cut_short: Step) -> None:
    succeeded_twice(cut_short)
    assert cut_short.plugin_active == "active"
    assert fence_taints(flow.lab, flow.node) == []
    assert flow.lab.node_exec(flow.node, "test", "-e", RUN_RECORD, check=False).returncode == 1
    assert summary(cut_short.layout) == [SEVEN] * 8
    assert cut_short.labels == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}
    # Before the read, and so before any label: the record is read first thing in the role.
    started = task_position(cut_short.first, "Start the daemon the run left stopped")
    read = task_position(cut_short.first, "Read the node's MIG layout against the config", "ok")
    assert None not in (started, read) and started < read, cut_short.first.summary()


# --- a reset and a reboot of a MIG node (remediate.yml): the layout and its resources come back --------------------
REMEDIATION_TAINT = "nvidia.com/gpu-remediation"
HEALTH_FILE = "/var/lib/gpuops/gpu-health.json"
REMEDIATION_RECORD = "/var/lib/gpuops/gpu-remediation.json"


@dataclass
class Remediation:
    """One remediate.yml run for an XID on a GPU of the MIG node, and what the node had before and after it."""

    run: PlaybookRun
    gpu: str
    capacity_before: dict[str, str]
    layout: list[dict[str, Any]]
    allocatable: dict[str, str]
    labels: dict[str, str]
    cordoned: bool
    taints: list[str]
    restarts_before: int
    restarts_after: int


def gpu_resources(lab: Lab, node: str) -> dict[str, str]:
    return {k: v for k, v in (lab.node(node).status.capacity or {}).items() if k.startswith("nvidia.com/")}


def remediate_for(flow: Flow, index: int, xid: int, klass: str) -> Remediation:
    """An XID of class KLASS on GPU INDEX, seen by the daemon, then remediate.yml for the node as EDA runs it."""
    lab, node = flow.lab, flow.node
    spec = Path(run_lab("spec-path", "1").strip())
    capacity = gpu_resources(lab, node)
    restarts = container_restarts(node)
    gpu = write_xid(spec, index, xid)
    try:
        lab.wait_until(
            f"{gpu} of class {klass} in the health file",
            lambda: any(
                row["uuid"] == gpu and row["class"] == klass
                for row in json.loads(lab.node_exec(node, "cat", HEALTH_FILE).stdout)["gpus"]
            ),
            timeout=60,
            interval=0.5,
        )
        run = run_playbook(
            "remediate.yml",
            flow.inventory,
            "-e",
            json.dumps({"gpu_mig_config": "all-1g.10gb"}),
            extra_vars=flow.base_vars,
            limit=node,
            timeout=1800,
        )
        print(f"remediate.yml for XID {xid} on GPU {index}: rc {run.returncode}, {run.seconds:.0f}s")
    finally:
        write_xid(spec, index, None)
    lab.wait_until(f"{node} Ready", lambda: lab.node_ready(node), timeout=300)
    spec_node = lab.node(node).spec
    return Remediation(
        run=run,
        gpu=gpu,
        capacity_before=capacity,
        layout=layout(lab, node),
        allocatable=lab.allocatable(node),
        labels=mig_labels(lab, node),
        cordoned=bool(spec_node.unschedulable),
        taints=[t.key for t in spec_node.taints or [] if t.key in (REMEDIATION_TAINT, FENCE_TAINT)],
        restarts_before=restarts,
        restarts_after=container_restarts(node),
    )


@pytest.fixture(scope="module")
def mig_reset(flow: Flow, cut_short: Step) -> Remediation:
    """A reset-class XID (48, double bit ECC error) on GPU 1 of the node at all-1g.10gb: the reset takes GPU 1's seven
    MIG devices."""
    return remediate_for(flow, 1, 48, "reset")


@pytest.fixture(scope="module")
def mig_reboot(flow: Flow, mig_reset: Remediation) -> Remediation:
    """A reboot-class XID (79, fallen off the bus) on GPU 2: the node reboots and comes up with MIG on and no MIG
    device on any GPU, as a machine does."""
    return remediate_for(flow, 2, 79, "reboot")


def given_back_with_its_layout(done: Remediation) -> None:
    assert done.run.returncode == 0, done.run.summary()
    assert done.capacity_before[MIG_1G] == "56", done.capacity_before
    # The nvidia_mig role wrote the layout again within the remediation, before the checks and the giving back.
    written = task_position(done.run, "Write the MIG layout")
    role = "TASK [gpuops.k8s.gpu_remediation : "
    checked = done.run.output.find(
        role + "Wait until the Node advertises the GPU resources it had before the remediation]"
    )
    released = done.run.output.find(role + "Remove the taint and uncordon the node]")
    assert written is not None and 0 <= written < checked < released, done.run.summary()
    assert summary(done.layout) == [SEVEN] * 8
    assert resources_of(done.allocatable) == {GPU: 0, MIG_1G: 56}
    assert done.labels == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}
    assert not done.cordoned and done.taints == [], (done.cordoned, done.taints)


def resources_of(allocatable: dict[str, str]) -> dict[str, int]:
    return {name: int(allocatable.get(name, "0")) for name in (GPU, MIG_1G)}


def test_a_reset_of_a_mig_gpu_gives_the_node_back_with_its_layout_applied_again(mig_reset: Remediation) -> None:
    given_back_with_its_layout(mig_reset)
    assert mig_reset.restarts_after == mig_reset.restarts_before  # a reset, not a reboot
    # GPU 1 alone was reset (and so lost its MIG devices, which the layout's write above gave back).
    reset = mig_reset.run.output.split("TASK [gpuops.k8s.gpu_remediation : Reset each GPU]")[1].split("\nTASK [")[0]
    assert re.findall(r"\(item=(GPU-[^)]+)\)", reset) == [mig_reset.gpu], reset


def test_a_reboot_of_a_mig_node_gives_it_back_with_its_layout_applied_again(mig_reboot: Remediation) -> None:
    given_back_with_its_layout(mig_reboot)
    assert mig_reboot.restarts_after == mig_reboot.restarts_before + 1  # the node rebooted


# --- all-1g.10gb -> lab-mixed (make test-full): GPUs 4-7 change, 0-3 keep their MIG devices -------------------------
@pytest.mark.full
def test_each_mig_pod_has_an_island(mixed: tuple[Step, dict[str, set[int]]]) -> None:
    _step, where = mixed
    assert sorted(sorted(gpus) for gpus in where.values()) == [[0, 1, 2, 3], [4, 5, 6, 7]], where


@pytest.mark.full
def test_lab_mixed_changes_only_gpus_4_to_7(mixed: tuple[Step, dict[str, set[int]]]) -> None:
    step, _where = mixed
    succeeded_twice(step)
    assert summary(step.layout) == [SEVEN] * 4 + [OFF] * 4
    assert int(step.allocatable[MIG_1G]) == 28 and int(step.allocatable[GPU]) == 4
    assert step.labels == {"nvidia.com/mig.config": "lab-mixed", "nvidia.com/mig.config.state": "success"}


@pytest.mark.full
def test_lab_mixed_keeps_the_pod_on_0_to_3_and_evicts_the_one_on_4_to_7(
    mixed: tuple[Step, dict[str, set[int]]],
) -> None:
    step, where = mixed
    for name, gpus in where.items():
        if gpus <= ISLANDS[0]:
            assert step.pods_after[name] == step.pods_before[name], (name, step.pods_after)
        else:
            assert step.pods_after[name] is None, (name, step.pods_after)
    evicted_before_the_write(step)


# --- lab-mixed -> all-disabled (make test-full): GPUs 0-3 change, 4-7 stay whole ---------------------------------
@pytest.mark.full
def test_none_again_turns_mig_off(none_again: tuple[Step, dict[str, set[int]]]) -> None:
    step, _where = none_again
    succeeded_twice(step)
    assert summary(step.layout) == [OFF] * 8
    assert int(step.allocatable[GPU]) == 8 and int(step.allocatable.get(MIG_1G, "0")) == 0
    assert step.labels == {"nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.config.state": "success"}


@pytest.mark.full
def test_none_again_keeps_the_pod_on_4_to_7_and_evicts_the_one_on_0_to_3(
    none_again: tuple[Step, dict[str, set[int]]],
) -> None:
    step, where = none_again
    assert where["whole-b"] == ISLANDS[1], where
    assert step.pods_after["whole-b"] == step.pods_before["whole-b"]
    evicted = [name for name in where if name != "whole-b"]
    assert evicted and all(step.pods_after[name] is None for name in evicted), step.pods_after
    evicted_before_the_write(step)


# --- DRA: all-disabled -> all-1g.10gb --------------------------------------------------------------------
def test_dra_slice_follows_the_layout(dra: tuple[Step, list[dict[str, Any]]]) -> None:
    step, devices = dra
    succeeded_twice(step)
    assert summary(step.layout) == [SEVEN] * 8
    kinds = Counter(
        (d["attributes"]["type"]["string"], d["attributes"].get("profile", {}).get("string")) for d in devices
    )
    assert kinds == {("mig", "1g.10gb"): 56}, kinds
    # NVIDIA's names: the 1g.10gb GPU-instance profile (ID 19) at each of the seven first memory slices.
    assert sorted(d["name"] for d in devices) == sorted(
        f"gpu-{g}-mig-1g10gb-19-{s}" for g in range(8) for s in range(7)
    )
    assert step.labels == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}


def test_dra_evicts_the_pod_whose_claim_holds_a_gpu_that_changes(dra: tuple[Step, list[dict[str, Any]]]) -> None:
    step, _devices = dra
    assert step.pods_after == {"dra-a": None}
    evicted_before_the_write(step)


# --- the DaemonSet deployment: all-disabled -> all-1g.10gb (failing half-way first under make test-full) ------------
@dataclass
class DaemonsetStep:
    """One site.yml run to a config under the DaemonSet deployment (twice where the first succeeds)."""

    first: PlaybookRun
    second: PlaybookRun | None
    pod_before: client.V1Pod
    pod_after: client.V1Pod  # the node's plugin pod once it is Ready again
    layout: list[dict[str, Any]]
    labels: dict[str, str]
    node_labels: dict[str, str]
    allocatable: dict[str, str]
    pods_before: dict[str, str] = field(default_factory=dict)
    pods_after: dict[str, str | None] = field(default_factory=dict)


@pytest.fixture(scope="module")
def ds_flow(flow: Flow, dra: tuple[Step, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory) -> Flow:
    """The node moved from the DRA step's state (DRA allocation, all-1g.10gb) to the DaemonSet deployment of the
    plugin (device-plugin allocation, MIG off) by one run: the flow's variables plus the image, which the role imports
    into the node's containerd. The flow's own teardown moves the node back to systemd at the end of the module."""
    work = tmp_path_factory.mktemp("site-mig-daemonset")
    archive = work / "gpu-device-plugin.oci.tar"
    image = build_plugin_archive(archive)
    ds_vars = work / "vars.yml"
    ds_vars.write_text(
        yaml.safe_dump(
            {
                **yaml.safe_load(flow.base_vars.read_text()),
                "device_plugin_mode": "daemonset",
                "device_plugin_image": image,
                "device_plugin_image_archive": str(archive),
            }
        )
    )
    ds = Flow(flow.lab, flow.node, flow.inventory, ds_vars)
    ds.setup = Runner(ds).run(gpu_mig_config="all-disabled", gpu_allocation_mode="device_plugin")
    return ds


def ds_step(
    ds: Flow, config: str, pods: dict[str, str], wanted: dict[str, int], twice: bool, **extra: Any
) -> DaemonsetStep:
    lab, node = ds.lab, ds.node
    assert ds.setup is not None and ds.setup.returncode == 0, ds.setup and ds.setup.summary()
    runner = Runner(ds)
    before = ready_pod(lab, node, DAEMONSET)
    first = runner.run(gpu_mig_config=config, gpu_allocation_mode="device_plugin", **extra)
    lab.wait_until(f"{node} allocatable {wanted}", lambda: resources(lab, node) == wanted, timeout=120)
    second = (
        runner.run(gpu_mig_config=config, gpu_allocation_mode="device_plugin", **extra)
        if twice and first.returncode == 0
        else None
    )
    return DaemonsetStep(
        first=first,
        second=second,
        pod_before=before,
        pod_after=ready_pod(lab, node, DAEMONSET),
        layout=layout(lab, node),
        labels=mig_labels(lab, node),
        node_labels=dict(lab.node(node).metadata.labels or {}),
        allocatable=lab.allocatable(node),
        pods_before=dict(pods),
        pods_after={name: pod_uid(lab, name) for name in pods},
    )


@pytest.fixture(scope="module")
def ds_failed(ds_flow: Flow) -> DaemonsetStep:
    """`make test-full` only: all-disabled -> all-1g.10gb under the DaemonSet deployment, with a fault injected
    half-way into the write."""
    return ds_step(ds_flow, "all-1g.10gb", {}, {GPU: 8, MIG_1G: 0}, twice=False, nvidia_mig_environment=FAULT)


@pytest.fixture(scope="module")
def ds_all_1g(ds_flow: Flow, request: pytest.FixtureRequest) -> DaemonsetStep:
    """all-disabled -> all-1g.10gb under the DaemonSet deployment, with a pod holding four GPUs (after ds_failed under
    `make test-full`, which leaves MIG off too)."""
    after_full_steps(request, "ds_failed")
    pods = {"ds-whole": start_pod(ds_flow.lab, gpu_pod("ds-whole", ds_flow.node, GPU, 4))}
    return ds_step(ds_flow, "all-1g.10gb", pods, {GPU: 0, MIG_1G: 56}, twice=True)


def paused_around_the_write(run: PlaybookRun) -> None:
    """The pod was kept off the node before the layout was written, and let back after."""
    paused = task_position(run, "Label the node so that the DaemonSet's pod leaves it")
    gone = task_position(run, "Wait until the node has no pod of the DaemonSet", "ok")
    written = task_position(run, "Write the MIG layout", "changed") or task_position(
        run, "Write the MIG layout", "fatal"
    )
    resumed = task_position(run, "Remove the node's pause label")
    assert None not in (paused, gone, written, resumed), run.summary()
    assert paused < gone < written < resumed, run.summary()


@pytest.mark.full
def test_daemonset_deployment_a_failure_half_way_is_rolled_back_and_the_plugin_pod_comes_back(
    ds_failed: DaemonsetStep,
) -> None:
    step = ds_failed
    assert step.first.returncode != 0
    out = step.first.output
    assert "did not take MIG config all-1g.10gb" in out, step.first.summary()
    assert "Unknown Error" in out, step.first.summary()
    assert "are back to the layout they had" in out, step.first.summary()
    paused_around_the_write(step.first)
    assert summary(step.layout) == [OFF] * 8
    assert step.labels == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "failed"}
    # The DaemonSet is back on the node: the pause label is gone, and a new pod serves the old layout.
    assert PAUSE_LABEL not in step.node_labels, step.node_labels
    assert step.pod_after.metadata.uid != step.pod_before.metadata.uid
    assert int(step.allocatable.get(GPU, "0")) == 8 and int(step.allocatable.get(MIG_1G, "0")) == 0


def test_daemonset_deployment_all_1g_10gb_pauses_the_plugin_pod_and_a_new_one_serves_56_mig_devices(
    ds_flow: Flow, ds_all_1g: DaemonsetStep
) -> None:
    step = ds_all_1g
    assert step.first.returncode == 0, step.first.summary()
    assert step.second is not None and step.second.returncode == 0, step.second and step.second.summary()
    assert step.second.changed == 0, (step.second.changed_tasks(), step.second.summary())
    paused_around_the_write(step.first)
    assert summary(step.layout) == [SEVEN] * 8
    assert int(step.allocatable[MIG_1G]) == 56 and int(step.allocatable.get(GPU, "0")) == 0
    assert step.labels == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}
    assert PAUSE_LABEL not in step.node_labels, step.node_labels
    assert step.pod_after.metadata.uid != step.pod_before.metadata.uid
    fenced_around_the_write(step.first)
    assert fence_taints(ds_flow.lab, ds_flow.node) == []


def test_daemonset_deployment_a_pod_on_two_mig_devices_is_their_holder_in_the_plugin_pods_dcgm_metrics(
    ds_flow: Flow, ds_all_1g: DaemonsetStep
) -> None:
    """The plugin's MIG devices in the dcgm metrics its DaemonSet pod serves (asked in the pod's network namespace,
    with the kubelet's pod-resources socket mounted into the pod)."""
    lab, node = ds_flow.lab, ds_flow.node
    daemon = ready_pod(lab, node, DAEMONSET)
    two_mig_devices_held(lab, node, "ds-mig-held", lambda: dcgm_exposition(lab, node, daemon))


def test_daemonset_deployment_finds_the_pod_on_the_gpus_from_the_plugin_pod_and_evicts_it_first(
    ds_all_1g: DaemonsetStep,
) -> None:
    step = ds_all_1g
    assert step.pods_after == {"ds-whole": None}
    asked = task_position(
        step.first, "Find the pods that hold devices of the GPUs that change, from the daemon's pod", "ok"
    )
    evicted = task_position(step.first, "Evict those pods")
    paused = task_position(step.first, "Label the node so that the DaemonSet's pod leaves it")
    assert None not in (asked, evicted, paused), step.first.summary()
    assert asked < evicted < paused, step.first.summary()
