"""site.yml moves a lab node from the device plugin to DRA and back, proven against the lab's real
kube-apiserver, kube-scheduler, kube-controller-manager (the ResourceClaim controller), kubelet and
containerd 1.7 (which reads CDI specs).

The node has 8 simulated GPUs (tests/fixtures/simulated/h100x8.yaml) served by the lab's mock NVIDIA
driver (its libnvidia-ml.so.1 and device nodes, docs/mock-nvml.md), the only stand-ins: the daemon reads
them through the real NVML bindings and publishes them in a ResourceSlice, the scheduler allocates claims
from it, the kubelet asks the daemon to prepare them over its DRA socket, and containerd injects the
per-claim CDI spec into the container: NVIDIA_VISIBLE_DEVICES and the device nodes of exactly its GPUs.
Pods run on containerd's default runtime, NVIDIA's nvidia-container-runtime in CDI mode.

The module runs after test_site.py, which leaves the first node in device_plugin mode, and leaves it so.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cdi_compare
import pytest
import tomllib
import yaml
from conftest import (
    Lab,
    container_environment,
    container_nvidia_devices,
    gpu_device_nodes,
    recovery_vars,
    run_lab,
    write_in_place,
)
from dra_objects import DEVICE_CLASS, DRIVER, GPU, RESOURCE, claim_template, pod_manifest, published, slices
from kubernetes import client
from playbook_run import REPO, PlaybookRun, lab_inventory, run_playbook
from prometheus_lab import Prometheus

SERVICE = "gpuops-device-plugin"
SPEC = REPO / "tests" / "fixtures" / "simulated" / "h100x8.yaml"
CDI_DIR = "/var/run/cdi"
CHECKPOINT = f"/var/lib/kubelet/plugins/{DRIVER}/checkpoint.json"
REGISTRATION_SOCKET = f"/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock"


@dataclass
class DraFlow:
    node: str
    inventory: Path
    extra_vars: Path
    check: PlaybookRun
    allocatable_after_check: str | None
    slices_after_check: int
    first: PlaybookRun


def run_site(flow_vars: Path, inventory: Path, node: str, mode: str, *args: str) -> PlaybookRun:
    return run_playbook(
        "site.yml", inventory, "-e", f"gpu_allocation_mode={mode}", *args, extra_vars=flow_vars, limit=node
    )


@pytest.fixture(scope="module")
def flow(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> DraFlow:
    """The first node in device_plugin mode (as test_site.py leaves it; made so when this module runs
    alone), then `site.yml --check` and `site.yml` with gpu_allocation_mode=dra."""
    node = lab.nodes[0]
    work = tmp_path_factory.mktemp("site-dra")
    inventory = lab_inventory(work / "inventory.yml")
    # Recovery on, so that a GPU an XID marked unhealthy comes back after the test.
    extra_vars = recovery_vars(work / "vars.yml")
    if lab.allocatable(node).get(GPU) != "8":
        setup = run_site(extra_vars, inventory, node, "device_plugin")
        assert setup.returncode == 0, setup.summary()
    lab.wait_until(f"{GPU}=8 from the device plugin", lambda: lab.allocatable(node).get(GPU) == "8")

    check = run_site(extra_vars, inventory, node, "dra", "--check", "--diff")
    allocatable_after_check = lab.allocatable(node).get(GPU)
    slices_after_check = len(slices(lab, node))
    first = run_site(extra_vars, inventory, node, "dra", "--diff")
    print(f"site.yml device_plugin -> dra: {first.seconds:.0f}s")
    return DraFlow(node, inventory, extra_vars, check, allocatable_after_check, slices_after_check, first)


@pytest.fixture(scope="module")
def templates(lab: Lab, flow: DraFlow) -> Iterator[dict[str, str]]:
    """Two claim templates: 2 GPUs of at least 40Gi (every H100 of the node), and 2 of at least 200Gi (none)."""
    api = client.CustomObjectsApi(lab.api)
    names = {"fits": f"two-40gi-{uuid.uuid4().hex[:6]}", "too-big": f"two-200gi-{uuid.uuid4().hex[:6]}"}
    api.create_namespaced_custom_object(
        *RESOURCE, "default", "resourceclaimtemplates", claim_template(names["fits"], 2, "40Gi")
    )
    api.create_namespaced_custom_object(
        *RESOURCE, "default", "resourceclaimtemplates", claim_template(names["too-big"], 2, "200Gi")
    )
    yield names
    for name in names.values():
        api.delete_namespaced_custom_object(*RESOURCE, "default", "resourceclaimtemplates", name)


def running(lab: Lab, name: str, timeout: float = 120) -> client.V1Pod:
    return lab.wait_until(
        f"pod {name} Running",
        lambda: (p := lab.core.read_namespaced_pod(name, "default")).status.phase == "Running" and p,
        timeout=timeout,
    )


def delete_pod(lab: Lab, name: str) -> None:
    # Graceful (the pod's 1 s): the pod object stays until the kubelet has unprepared its claims, so the next
    # test's claim is never handed a GPU still prepared for this one (which the daemon would refuse).
    lab.core.delete_namespaced_pod(name, "default")
    lab.wait_until(
        f"pod {name} gone",
        lambda: not any(p.metadata.name == name for p in lab.core.list_namespaced_pod("default").items),
        timeout=120,
    )


def pod_claim(lab: Lab, pod: client.V1Pod) -> dict[str, Any]:
    """The ResourceClaim the ResourceClaim controller made for the pod from its template."""
    status = pod.status.resource_claim_statuses or []
    assert len(status) == 1, status
    return client.CustomObjectsApi(lab.api).get_namespaced_custom_object(
        *RESOURCE, "default", "resourceclaims", status[0].resource_claim_name
    )


def allocated_devices(claim: dict[str, Any]) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def visible_devices(lab: Lab, node: str, pod: client.V1Pod) -> list[str]:
    """The UUIDs the claim's CDI spec gave the container's process: its GPUOPS_DEVICE_<NAME> variables, read from
    /proc in the node. (NVIDIA_VISIBLE_DEVICES is `void`: the claim's devices came as nvidia-ctk's devices too, and
    both specs set it so; docs/compared-cdi.md.)"""
    container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
    environment = container_environment(lab, node, container_id)
    assert environment.get("NVIDIA_VISIBLE_DEVICES") == "void", environment.get("NVIDIA_VISIBLE_DEVICES")
    return sorted(value for key, value in environment.items() if key.startswith("GPUOPS_DEVICE_"))


def device_nodes(lab: Lab, node: str, pod: client.V1Pod) -> list[str]:
    """The NVIDIA device nodes in the container's /dev (the CDI spec's deviceNodes)."""
    container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
    return container_nvidia_devices(lab, node, container_id)


def node_file(lab: Lab, node: str, path: str) -> str | None:
    done = lab.node_exec(node, "cat", path, check=False)
    return done.stdout if done.returncode == 0 else None


def checkpoint_claims(lab: Lab, node: str) -> set[str]:
    text = node_file(lab, node, CHECKPOINT)
    return set(json.loads(text)["claims"]) if text else set()


def cdi_specs(lab: Lab, node: str) -> set[str]:
    out = lab.node_exec(node, "sh", "-c", f"ls {CDI_DIR} 2>/dev/null || true").stdout.split()
    return {name for name in out if name.startswith("gpuops.k8s-gpu_")}


def uuids_of(lab: Lab, node: str, devices: list[str]) -> list[str]:
    by_name = published(lab, node)
    return sorted(by_name[d]["attributes"]["uuid"]["string"] for d in devices)


def service_argv(lab: Lab, node: str) -> list[str]:
    """The plugin service's ExecStart argv, as systemd holds it."""
    exec_start = lab.node_exec(node, "systemctl", "show", "-p", "ExecStart", "--value", SERVICE).stdout
    found = re.search(r"argv\[\]=(.*?) ;", exec_start)
    assert found, exec_start
    return found.group(1).split()


def kubelet_registered(lab: Lab, node: str) -> set[str]:
    """The drivers the kubelet told the running service's daemon it registered (NotifyRegistrationStatus with
    plugin_registered, logged as "registered with the kubelet"), from the journal of the unit's current run."""
    invocation = lab.node_exec(node, "systemctl", "show", "-p", "InvocationID", "--value", SERVICE).stdout.strip()
    if not invocation:
        return set()
    journal = lab.node_exec(node, "journalctl", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}").stdout
    drivers = set()
    for line in journal.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("msg") == "registered with the kubelet":
            drivers.add(entry.get("driver"))
    return drivers


# --- the switch to dra ---------------------------------------------------------------------------------
def test_check_mode_switch_changes_nothing(flow: DraFlow) -> None:
    assert flow.check.returncode == 0, flow.check.summary()
    # It reports the switch (the service stop, the unit, the DeviceClass)...
    assert flow.check.recap[flow.node]["changed"] > 0, flow.check.summary()
    # ...and the device plugin keeps serving: nothing was stopped, nothing published.
    assert flow.allocatable_after_check == "8"
    assert flow.slices_after_check == 0


def test_switch_to_dra(lab: Lab, flow: DraFlow) -> None:
    assert flow.first.returncode == 0, flow.first.summary()
    assert flow.first.recap[flow.node]["failed"] == 0
    # The device plugin's GPUs left the allocatable before the driver published.
    assert lab.allocatable(flow.node).get(GPU, "0") == "0"
    devices = lab.wait_until("8 devices published", lambda: (d := published(lab, flow.node)) and len(d) == 8 and d)
    assert sorted(devices) == [f"gpu-{i}" for i in range(8)]
    # Every device is the spec's GPU of that UUID: its product, its memory as capacity, healthy.
    spec = {gpu["uuid"]: gpu for gpu in yaml.safe_load(SPEC.read_text())["gpus"]}
    for name, device in devices.items():
        gpu = spec[device["attributes"]["uuid"]["string"]]
        assert device["attributes"]["productName"]["string"] == gpu["name"], name
        assert device["attributes"]["health"]["string"] == "Healthy", name
        assert device["capacity"] == {"memory": {"value": f"{gpu['memory_mib']}Mi"}}, name
    assert len({d["attributes"]["uuid"]["string"] for d in devices.values()}) == 8
    # One allocator: the kubelet registered the daemon as this driver's DRA plugin (its answer to the
    # plugin watcher reaches the daemon's registration socket, which logs it), and no device-plugin socket.
    lab.wait_until(f"the kubelet registers {DRIVER}", lambda: DRIVER in kubelet_registered(lab, flow.node))
    sockets = lab.node_exec(flow.node, "ls", "/var/lib/kubelet/device-plugins").stdout.split()
    assert [s for s in sockets if s.endswith(".sock") and s != "kubelet.sock"] == []
    argv = service_argv(lab, flow.node)
    assert argv[argv.index("--allocation-mode") + 1] == "dra"
    assert argv[argv.index("--node-name") + 1] == flow.node
    # CDI is on in the node's containerd (1.7 needs enable_cdi), as containerd itself loads it.
    dump = tomllib.loads(lab.node_exec(flow.node, "containerd", "config", "dump").stdout)
    cri = dump["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True
    assert CDI_DIR in cri["cdi_spec_dirs"]


def test_device_class_maps_the_extended_resource(lab: Lab, flow: DraFlow) -> None:
    cls = client.CustomObjectsApi(lab.api).get_cluster_custom_object(*RESOURCE, "deviceclasses", DEVICE_CLASS)
    assert cls["spec"]["extendedResourceName"] == GPU
    assert f'device.driver == "{DRIVER}"' in cls["spec"]["selectors"][0]["cel"]["expression"]


def test_second_run_in_dra_mode_changes_nothing(flow: DraFlow) -> None:
    second = run_site(flow.extra_vars, flow.inventory, flow.node, "dra")
    assert second.returncode == 0, second.summary()
    assert second.recap[flow.node]["changed"] == 0, second.changed_tasks()
    print(f"site.yml second run in dra mode: {second.seconds:.0f}s")


# --- claims ----------------------------------------------------------------------------------------------
def test_claim_with_a_cel_selector_gets_exactly_two_gpus(
    lab: Lab, flow: DraFlow, templates: dict[str, str], prometheus: Prometheus
) -> None:
    """The claim's two GPUs reach the container; the daemon's dcgm metrics, scraped by Prometheus, give each the
    pod's labels and the claim's (dcgm-exporter's dra_* labels) while it runs, and drop them once it is gone."""
    name = f"dra-pair-{uuid.uuid4().hex[:8]}"
    attributed = f'DCGM_FI_DEV_GPU_TEMP{{instance="{prometheus.targets[flow.node]}", pod="{name}"}}'
    lab.core.create_namespaced_pod("default", pod_manifest(name, flow.node, claim_template=templates["fits"]))
    try:
        pod = running(lab, name)
        claim = pod_claim(lab, pod)
        devices = allocated_devices(claim)
        assert len(devices) == 2, devices
        assert all(
            r["driver"] == DRIVER and r["pool"] == flow.node
            for r in claim["status"]["allocation"]["devices"]["results"]
        )
        # The daemon prepared it: a checkpoint entry and a CDI spec named after the claim...
        uid = claim["metadata"]["uid"]
        assert uid in checkpoint_claims(lab, flow.node)
        assert f"gpuops.k8s-gpu_{uid}.json" in cdi_specs(lab, flow.node)
        # ...and containerd injected it: the container sees exactly the claim's two GPUs, and their device nodes.
        assert visible_devices(lab, flow.node, pod) == uuids_of(lab, flow.node, devices)
        assert device_nodes(lab, flow.node, pod) == gpu_device_nodes(SPEC, uuids_of(lab, flow.node, devices))
        compare_with_nvidia_ctks_spec(lab, flow.node, uid)
        by_name = published(lab, flow.node)
        prometheus.wait_until(
            f"{name}'s GPUs in Prometheus", lambda: len(prometheus.query(attributed)) == 2, timeout=20
        )
        labels = sorted(tuple(series[key] for key in DRA_LABELS) for series, _value in prometheus.query(attributed))
        assert labels == sorted(
            (
                by_name[device]["attributes"]["uuid"]["string"],
                "default",
                pod.spec.containers[0].name,
                claim["metadata"]["name"],
                "default",
                DRIVER,
                flow.node,
                device,
            )
            for device in devices
        )
    finally:
        delete_pod(lab, name)
    prometheus.wait_until(f"{name} gone from the dcgm metrics", lambda: not prometheus.query(attributed), timeout=20)
    # Deleting the pod unprepares the claim: its spec and checkpoint entry go.
    lab.wait_until(
        "the claim's CDI spec removed", lambda: f"gpuops.k8s-gpu_{uid}.json" not in cdi_specs(lab, flow.node)
    )
    assert uid not in checkpoint_claims(lab, flow.node)


# A GPU's series' labels for the container holding it through a claim (docs/metrics.md).
DRA_LABELS = (
    "UUID",
    "namespace",
    "container",
    "dra_claim_name",
    "dra_claim_namespace",
    "dra_driver_name",
    "dra_pool_name",
    "dra_device_name",
)


def compare_with_nvidia_ctks_spec(lab: Lab, node: str, claim_uid: str) -> None:
    """The claim's spec against the one nvidia-ctk wrote for the same GPUs: every difference is one that
    docs/compared-cdi.md names, with the same values, and it names no other (tests/e2e/cdi_compare.py)."""
    ours = json.loads(lab.node_exec(node, "cat", f"{CDI_DIR}/gpuops.k8s-gpu_{claim_uid}.json").stdout)
    nvidia = yaml.safe_load(lab.node_exec(node, "cat", f"{CDI_DIR}/nvidia.yaml").stdout)
    claimed = json.loads(ours["annotations"]["gpuops.k8s/devices"])
    ours_names = {d["uuid"]: f"{claim_uid}-{d['device']}" for d in claimed}
    version = yaml.safe_load(SPEC.read_text())["driver_version"]
    # Each GPU's device brings the same device node in both.
    for gpu_uuid, name in ours_names.items():
        assert cdi_compare.gpu_nodes(ours, name) == cdi_compare.gpu_nodes(nvidia, gpu_uuid), gpu_uuid
    found = cdi_compare.differences(
        cdi_compare.aspects(nvidia, {u: u for u in ours_names}, version), cdi_compare.aspects(ours, ours_names, version)
    )
    assert found == cdi_compare.documented(), found


def test_a_selector_no_gpu_meets_leaves_the_pod_pending(lab: Lab, flow: DraFlow, templates: dict[str, str]) -> None:
    name = f"dra-none-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", pod_manifest(name, flow.node, claim_template=templates["too-big"]))
    try:

        def unschedulable() -> bool:
            conditions = lab.core.read_namespaced_pod(name, "default").status.conditions or []
            return any(c.type == "PodScheduled" and c.status == "False" for c in conditions)

        lab.wait_until(f"pod {name} unschedulable", unschedulable, timeout=60)
        assert lab.core.read_namespaced_pod(name, "default").status.phase == "Pending"
    finally:
        delete_pod(lab, name)


def test_nvidia_gpu_pod_runs_through_the_extended_resource_mapping(lab: Lab, flow: DraFlow) -> None:
    name = f"dra-ext-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", pod_manifest(name, flow.node, gpus=1))
    try:
        pod = running(lab, name)
        # The scheduler served nvidia.com/gpu from the DeviceClass: a claim of its own, allocated one device.
        raw = lab.api.sanitize_for_serialization(pod)
        status = raw["status"].get("extendedResourceClaimStatus")
        assert status, raw["status"]
        claim = client.CustomObjectsApi(lab.api).get_namespaced_custom_object(
            *RESOURCE, "default", "resourceclaims", status["resourceClaimName"]
        )
        devices = allocated_devices(claim)
        assert len(devices) == 1, devices
        assert visible_devices(lab, flow.node, pod) == uuids_of(lab, flow.node, devices)
    finally:
        delete_pod(lab, name)


def test_validate_shows_the_dra_node_with_its_claim(lab: Lab, flow: DraFlow, templates: dict[str, str]) -> None:
    name = f"dra-validate-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", pod_manifest(name, flow.node, claim_template=templates["fits"]))
    try:
        running(lab, name)
        done = run_playbook(
            "validate.yml", flow.inventory, "-e", "gpu_allocation_mode=dra", extra_vars=flow.extra_vars, limit=flow.node
        )
    finally:
        delete_pod(lab, name)
    assert done.returncode == 0, done.summary()
    assert "MODE" in done.output and "PUBLISHED" in done.output
    # mode, count, allocatable, published, unhealthy, claims, labels, taint, plugin, red
    row = rf'"{re.escape(flow.node)}\s+NVIDIA H100 80GB HBM3\s+dra\s+8\s+0\s+8\s+0\s+1\s+ok\s+on\s+healthy\s+-"'
    assert re.search(row, done.output), done.output[-3000:]


def test_restarts_lose_no_prepared_claim(lab: Lab, flow: DraFlow, templates: dict[str, str]) -> None:
    name = f"dra-restart-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", pod_manifest(name, flow.node, claim_template=templates["fits"]))
    try:
        pod = running(lab, name)
        uid = pod_claim(lab, pod)["metadata"]["uid"]
        lab.node_exec(flow.node, "systemctl", "restart", SERVICE)
        restarted = lab.restart_kubelet(flow.node)
        lab.wait_until(f"{flow.node} Ready after the restart", lambda: lab.node_ready(flow.node, since=restarted))
        # The kubelet deletes the node's slices when it starts; the daemon publishes them again.
        lab.wait_until("8 devices published again", lambda: len(published(lab, flow.node)) == 8, timeout=60)
        assert uid in checkpoint_claims(lab, flow.node)
        assert f"gpuops.k8s-gpu_{uid}.json" in cdi_specs(lab, flow.node)
        assert lab.core.read_namespaced_pod(name, "default").status.phase == "Running"
    finally:
        delete_pod(lab, name)
    lab.wait_until("the claim unprepared after the restarts", lambda: uid not in checkpoint_claims(lab, flow.node))
    assert f"gpuops.k8s-gpu_{uid}.json" not in cdi_specs(lab, flow.node)


def test_xid_on_an_allocated_gpu_shows_in_the_pod_and_the_slice(
    lab: Lab, flow: DraFlow, templates: dict[str, str]
) -> None:
    name = f"dra-xid-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", pod_manifest(name, flow.node, claim_template=templates["fits"]))
    spec_path = Path(run_lab("spec-path", flow.node.rsplit("-", 1)[1]).strip())
    original = spec_path.read_text()
    try:
        pod = running(lab, name)
        claim = pod_claim(lab, pod)
        device = allocated_devices(claim)[0]
        # The kubelet names a device by its first CDI ID (driver/pool/device when it has none).
        resource_id = f"gpuops.k8s/gpu={claim['metadata']['uid']}-{device}"
        index = int(device.removeprefix("gpu-"))
        spec = yaml.safe_load(original)
        spec["gpus"][index].update(xid=79, lost=True)  # fell off the bus: an XID, then GPU_IS_LOST
        write_in_place(spec_path, yaml.safe_dump(spec, sort_keys=False))

        def pod_health() -> dict[str, str] | None:
            raw = lab.api.sanitize_for_serialization(lab.core.read_namespaced_pod(name, "default"))
            found = {
                r["resourceID"]: r.get("health", "")
                for s in raw["status"]["containerStatuses"][0].get("allocatedResourcesStatus") or []
                for r in s.get("resources") or []
            }
            return found if found.get(resource_id) == "Unhealthy" else None

        health = lab.wait_until(f"{device} Unhealthy in the pod's allocatedResourcesStatus", pod_health, timeout=90)
        # The claim's other GPU stays healthy.
        assert [h for h in health.values() if h == "Healthy"], health
        marked = lab.wait_until(
            f"{device} marked in the slice",
            lambda: (d := published(lab, flow.node)[device])["attributes"]["health"]["string"] == "Unhealthy" and d,
            timeout=60,
        )
        assert any(t["key"] == f"{DRIVER}/unhealthy" and t["effect"] == "NoSchedule" for t in marked.get("taints", []))
    finally:
        write_in_place(spec_path, original)
        delete_pod(lab, name)
    lab.wait_until(
        f"{device} Healthy again",
        lambda: published(lab, flow.node)[device]["attributes"]["health"]["string"] == "Healthy",
        timeout=60,
    )


# --- and back --------------------------------------------------------------------------------------------
def test_switch_back_to_the_device_plugin(lab: Lab, flow: DraFlow) -> None:
    back = run_site(flow.extra_vars, flow.inventory, flow.node, "device_plugin", "--diff")
    assert back.returncode == 0, back.summary()
    assert "Delete the node's ResourceSlices before the device plugin registers" in back.output
    assert slices(lab, flow.node) == []
    lab.wait_until(f"{GPU}=8 from the device plugin again", lambda: lab.allocatable(flow.node).get(GPU) == "8")
    assert lab.node_exec(flow.node, "test", "-e", REGISTRATION_SOCKET, check=False).returncode != 0
    again = run_site(flow.extra_vars, flow.inventory, flow.node, "device_plugin")
    assert again.returncode == 0, again.summary()
    assert again.recap[flow.node]["changed"] == 0, again.changed_tasks()
