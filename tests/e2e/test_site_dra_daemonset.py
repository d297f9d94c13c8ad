"""site.yml with the DRA driver in daemonset mode, on a node shaped like one with NVIDIA's driver.

The lab's last node (the one test_site_daemonset.py runs the device plugin's DaemonSet on) moves to
gpu_allocation_mode=dra: the DRA driver's DaemonSet pod reads the node's 8 simulated GPUs through NVML (the
node's mock libnvidia-ml.so.1, docs/mock-nvml.md, with the spec the only stand-ins), found under the node's
root mounted read-only at /driver-root, publishes them in a ResourceSlice, and writes per-claim CDI specs
whose device nodes are the node's own. An XID and a GPU off the bus show in the slice; a claim's container
sees the device nodes of exactly its GPUs.

Then playbooks/upgrade_driver.yml on the node while it is a DRA node (test_upgrade_driver.py runs it on the device
plugin's DaemonSet): the playbook waits for what that node publishes, its ResourceSlice's devices, not for
nvidia.com/gpu. A loaded driver that changes (a test double: the version file read before and after the driver stage
is /proc/sys/kernel/random/uuid, which reads differently each time) restarts the node's DRA driver pod. Where the wait
fails, the play fails with a sentence that names the node left cordoned.

`make test-full` adds a node that changes its deployment and its allocation in one run: from the DRA driver's
DaemonSet to the device plugin's systemd service, and back.

Last, the driver takes NVIDIA's name, gpu.nvidia.com, through its DaemonSet (test_site_dra_nvidia.py does it under
systemd): the pod restarts under the new name, the old name's slices and files go, the admission policy follows.

At the end the node goes back to the device plugin's DaemonSet, as test_upgrade_driver.py expects it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    Lab,
    container_environment,
    container_nvidia_devices,
    gpu_device_nodes,
    run_lab,
    running_pod,
    write_in_place,
)
from daemonset_checks import (
    HOLDER_LABELS,
    dcgm_holders,
    node_pod,
    pod_ready,
    ready_pod,
    run_with,
    stopped_pod,
    validate_row,
)
from daemonset_node import GPU, MODE_LABEL, NAMESPACE, SPEC, DaemonsetNode, daemonset_node
from dra_objects import DRIVER, RESOURCE, claim_template, pod_manifest, published
from kubernetes import client
from playbook_run import PlaybookRun

POD_SELECTOR = "app.kubernetes.io/name=gpuops-dra-plugin"
DAEMONSET = "gpuops-dra-plugin"
DRA_VARS = {"gpu_allocation_mode": "dra", "device_plugin_dra_daemonset_node_credentials": True}
NVIDIA = "gpu.nvidia.com"
DRA_HOLDER_LABELS = ("dra_claim_name", "dra_claim_namespace", "dra_driver_name")


@pytest.fixture(scope="module")
def dra_ds(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonsetNode, PlaybookRun]]:
    ds = daemonset_node(lab, tmp_path_factory.mktemp("site-daemonset"))
    lab.wait_until(f"{GPU}=8 from the plugin's DaemonSet", lambda: lab.allocatable(ds.node).get(GPU) == "8")
    # The lab's API server listens on the machine's loopback and no kube-proxy routes the cluster's service
    # address, so the pod reaches it as the node does: with the node's credentials on the host's network.
    to_dra = ds.run_site("--diff", **DRA_VARS)
    yield ds, to_dra
    back = ds.run_site()
    assert back.returncode == 0, back.summary()
    lab.wait_until(f"{GPU}=8 from the plugin's DaemonSet again", lambda: lab.allocatable(ds.node).get(GPU) == "8")


def dra_pod(lab: Lab, node: str) -> client.V1Pod:
    def running() -> client.V1Pod | None:
        pods = lab.core.list_namespaced_pod(
            NAMESPACE, label_selector=POD_SELECTOR, field_selector=f"spec.nodeName={node}"
        ).items
        ready = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return ready[0] if len(ready) == 1 else None

    return lab.wait_until(f"the DRA driver's pod Running on {node}", running, timeout=180)


def health(lab: Lab, node: str, device: str) -> str:
    return published(lab, node)[device]["attributes"]["health"]["string"]


def test_the_node_runs_the_dra_driver_from_its_daemonset(lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]) -> None:
    ds, to_dra = dra_ds
    assert to_dra.returncode == 0, to_dra.summary()
    assert lab.node(ds.node).metadata.labels[MODE_LABEL] == "dra"
    pod = dra_pod(lab, ds.node)
    (container,) = pod.spec.containers
    assert container.args[-4:-2] == ["--container-driver-root", "/driver-root"]
    assert container.args[-2:] == ["--kubeconfig", "/etc/gpuops-lab/kubelet.kubeconfig"]
    assert pod.spec.host_network is True and pod.spec.automount_service_account_token is False
    # Of the node's /, the library's directory, the mock's state directory and /dev, read-only with their submounts.
    mounts = {m.name: (m.mount_path, m.read_only, m.recursive_read_only) for m in container.volume_mounts}
    assert {name: mounts.get(name) for name in ("driver-lib", "driver-extra-0", "driver-dev")} == {
        "driver-lib": ("/driver-root/usr/lib/x86_64-linux-gnu", True, "IfPossible"),
        "driver-extra-0": ("/driver-root/etc/gpuops-lab/simulated", True, "IfPossible"),
        "driver-dev": ("/driver-root/dev", True, "IfPossible"),
    }
    assert not [m for m in container.volume_mounts if m.mount_path == "/driver-root"]
    # The plugin's own pod asks the nvidia runtime for no GPU.
    assert not [e for e in container.env or [] if e.name == "NVIDIA_VISIBLE_DEVICES"]
    devices = lab.wait_until(
        f"8 GPUs published for {ds.node}", lambda: (d := published(lab, ds.node)) and len(d) == 8 and d, timeout=120
    )
    spec_uuids = {gpu["uuid"] for gpu in yaml.safe_load(SPEC.read_text())["gpus"]}
    assert {d["attributes"]["uuid"]["string"] for d in devices.values()} == spec_uuids
    log = lab.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
    assert '"msg": "NVML library from the driver root"' in log, log[-3000:]


def test_a_claim_container_sees_the_device_nodes_of_its_gpu_and_holds_it_in_the_dcgm_metrics(
    lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]
) -> None:
    ds = dra_ds[0]
    api = client.CustomObjectsApi(lab.api)
    template = f"one-gpu-{uuid.uuid4().hex[:6]}"
    api.create_namespaced_custom_object(
        *RESOURCE, "default", "resourceclaimtemplates", claim_template(template, 1, "40Gi")
    )
    name = f"dra-ds-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", pod_manifest(name, ds.node, claim_template=template))
    try:
        pod = running_pod(lab, name)
        container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
        # The claim's GPU, by the variable its CDI spec sets (NVIDIA_VISIBLE_DEVICES is `void`: the pod's driver
        # found nvidia-ctk's spec in the CDI directory it shares with the host and handed the GPU over as its device
        # too; docs/compared-cdi.md).
        environment = container_environment(lab, ds.node, container_id)
        visible = [value for key, value in environment.items() if key.startswith("GPUOPS_DEVICE_")]
        assert len(visible) == 1, visible
        assert environment["NVIDIA_VISIBLE_DEVICES"] == "void"
        # The CDI spec the pod's driver wrote names the node's device nodes (found under /driver-root/dev).
        assert container_nvidia_devices(lab, ds.node, container_id) == gpu_device_nodes(SPEC, visible)
        # The driver's pod names the claim's container as its GPU's holder in the dcgm metrics, with dcgm-exporter's
        # DRA labels (the pod-resources socket mounted into the pod).
        (claim,) = pod.status.resource_claim_statuses
        holder = {
            "pod": name,
            "namespace": "default",
            "container": "gpu",
            "dra_claim_name": claim.resource_claim_name,
            "dra_claim_namespace": "default",
            "dra_driver_name": DRIVER,
        }
        wanted = {
            gpu["uuid"]: [holder if gpu["uuid"] in visible else {}] for gpu in yaml.safe_load(SPEC.read_text())["gpus"]
        }
        daemon = dra_pod(lab, ds.node)
        lab.wait_until(
            f"{name} in the DRA driver's dcgm metrics",
            lambda: dcgm_holders(lab, ds.node, daemon, (*HOLDER_LABELS, *DRA_HOLDER_LABELS)) == wanted,
            timeout=20,
        )
    finally:
        lab.core.delete_namespaced_pod(name, "default")
        lab.wait_until(
            f"pod {name} gone",
            lambda: not any(p.metadata.name == name for p in lab.core.list_namespaced_pod("default").items),
            timeout=120,
        )
        api.delete_namespaced_custom_object(*RESOURCE, "default", "resourceclaimtemplates", template)


@pytest.mark.parametrize("fault", ["xid", "lost"])
def test_a_fault_through_nvml_shows_in_the_slice_and_clears(
    lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun], fault: str
) -> None:
    ds = dra_ds[0]
    spec_path = Path(run_lab("spec-path", ds.node.rsplit("-", 1)[1]).strip())
    original = spec_path.read_text()
    spec = yaml.safe_load(original)
    index = 3 if fault == "xid" else 6
    device = f"gpu-{index}"
    # An XID 79 leaves a GPU off the bus (an XID event, then GPU_IS_LOST); a lost GPU alone sends no XID.
    spec["gpus"][index].update({"xid": 79, "lost": True} if fault == "xid" else {"lost": True})
    try:
        write_in_place(spec_path, yaml.safe_dump(spec, sort_keys=False))
        marked = lab.wait_until(
            f"{device} Unhealthy in the slice",
            lambda: (d := published(lab, ds.node)[device])["attributes"]["health"]["string"] == "Unhealthy" and d,
            timeout=60,
        )
        assert any(t["key"] == f"{DRIVER}/unhealthy" for t in marked.get("taints", []))
        others = {name: d["attributes"]["health"]["string"] for name, d in published(lab, ds.node).items()}
        assert [name for name, state in others.items() if state != "Healthy"] == [device]
        log = lab.core.read_namespaced_pod_log(dra_pod(lab, ds.node).metadata.name, NAMESPACE)
        uuid_of = spec["gpus"][index]["uuid"]
        assert (f'"msg": "XID event", "device": "{uuid_of}", "xid": 79' in log) == (fault == "xid")
    finally:
        write_in_place(spec_path, original)
    lab.wait_until(f"{device} Healthy again", lambda: health(lab, ds.node, device) == "Healthy", timeout=60)


def test_the_dra_pod_is_ready_by_a_probe_of_its_health_endpoint(
    lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]
) -> None:
    ds = dra_ds[0]
    pod = ready_pod(lab, ds.node, DAEMONSET)
    (container,) = pod.spec.containers
    probe = container.readiness_probe
    assert probe is not None and probe.http_get.path == "/readyz"
    # On the host's network the daemon keeps the node's address (the lab's: 127.0.0.1 and a port of the
    # node's own), and the kubelet probes it there.
    address = container.args[container.args.index("--metrics-address") + 1]
    assert address == f"{probe.http_get.host}:{probe.http_get.port}"
    assert probe.http_get.host == "127.0.0.1"


def test_validate_is_green_on_the_dra_node_and_red_while_its_pod_is_not_ready(
    lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]
) -> None:
    ds = dra_ds[0]
    lab.wait_until(f"8 GPUs published for {ds.node}", lambda: len(published(lab, ds.node)) == 8, timeout=120)
    green = run_with(ds, "validate.yml", **DRA_VARS)
    assert green.returncode == 0, green.summary()
    assert " ready " in validate_row(green, ds.node) + " ", validate_row(green, ds.node)
    with stopped_pod(lab, ds.node, DAEMONSET):
        lab.wait_until(
            "the kubelet's probe to mark the stopped driver's pod not ready",
            lambda: not pod_ready(node_pod(lab, ds.node, DAEMONSET)),
            timeout=90,
        )
        red = run_with(ds, "validate.yml", **DRA_VARS)
    assert red.returncode != 0, red.summary()
    assert f"{ds.node}: red: plugin" in " ".join(red.output.split()), red.summary()
    assert "not-ready" in validate_row(red, ds.node)
    ready_pod(lab, ds.node, DAEMONSET)


def _slice(name: str, node: str, driver: str = DRIVER) -> dict:
    """A slice of ``node`` in the pool named after it, as the driver names its pool (the policy requires it)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    }


def pod_account(lab: Lab, node: str) -> client.ApiClient:
    """A client with a token the API server binds to the driver's running pod on the node (what the kubelet mounts
    into a pod of that account)."""
    pod = ready_pod(lab, node, DAEMONSET)
    token = lab.core.create_namespaced_service_account_token(
        DAEMONSET,
        NAMESPACE,
        {
            "spec": {
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.metadata.name,
                    "uid": pod.metadata.uid,
                },
            }
        },
    ).status.token
    settings = client.Configuration()
    settings.host = lab.api.configuration.host
    settings.ssl_ca_cert = lab.api.configuration.ssl_ca_cert
    settings.verify_ssl = lab.api.configuration.verify_ssl
    settings.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(settings)


def refused(call: Any, *args: Any) -> str:
    """The API's 403 for the call, run as a server-side dry run (admission runs, nothing is stored)."""
    with pytest.raises(client.ApiException) as error:
        call(*args, dry_run="All")
    assert error.value.status == 403, error.value.body
    return error.value.body


def test_the_dra_pods_account_may_write_only_its_own_nodes_slices(
    lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]
) -> None:
    """A token the API server binds to the driver's running pod (what the kubelet mounts into a pod of
    that account): the admission policy the role applies refuses it any write to another node's slices or
    to another driver's, and lets it write its own node's (server-side dry runs: admission runs, nothing is
    stored)."""
    ds = dra_ds[0]
    other = next(n for n in lab.nodes if n != ds.node)
    account = pod_account(lab, ds.node)
    admin = client.CustomObjectsApi(lab.api)
    theirs = f"e2e-other-{uuid.uuid4().hex[:6]}"
    admin.create_cluster_custom_object(*RESOURCE, "resourceslices", _slice(theirs, other))
    try:
        who = client.AuthenticationV1Api(account).create_self_subject_review({"metadata": {}}).status.user_info
        assert who.extra["authentication.kubernetes.io/node-name"] == [ds.node]
        custom = client.CustomObjectsApi(account)
        body = refused(custom.create_cluster_custom_object, *RESOURCE, "resourceslices", _slice("e2e-x", other))
        assert ds.node in body and "ValidatingAdmissionPolicy" in body, body
        current = admin.get_cluster_custom_object(*RESOURCE, "resourceslices", theirs)
        refused(custom.replace_cluster_custom_object, *RESOURCE, "resourceslices", theirs, current)
        refused(custom.delete_cluster_custom_object, *RESOURCE, "resourceslices", theirs)
        refused(
            custom.create_cluster_custom_object,
            *RESOURCE,
            "resourceslices",
            _slice("e2e-y", ds.node, driver="gpu.example.com"),
        )
        # Its own node's slices, of its driver: allowed.
        custom.create_cluster_custom_object(*RESOURCE, "resourceslices", _slice("e2e-own", ds.node), dry_run="All")
        own = admin.list_cluster_custom_object(
            *RESOURCE, "resourceslices", field_selector=f"spec.nodeName={ds.node},spec.driver={DRIVER}"
        )["items"][0]
        custom.replace_cluster_custom_object(*RESOURCE, "resourceslices", own["metadata"]["name"], own, dry_run="All")
        custom.delete_cluster_custom_object(*RESOURCE, "resourceslices", own["metadata"]["name"], dry_run="All")
    finally:
        account.close()
        admin.delete_cluster_custom_object(*RESOURCE, "resourceslices", theirs)


# --- upgrade_driver.yml on the DRA node ------------------------------------------------------------------
@dataclass
class DraUpgrade:
    node: str
    run: PlaybookRun
    pod_before: str
    pod_after: str
    published_after: int
    stuck: PlaybookRun
    stuck_unschedulable: bool


@pytest.fixture(scope="module")
def dra_upgrade(lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]) -> Iterator[DraUpgrade]:
    """playbooks/upgrade_driver.yml on the node while it is a DRA node: once with a loaded driver that changes, once
    waiting for another driver's slices, which never come."""
    ds, to_dra = dra_ds
    assert to_dra.returncode == 0, to_dra.summary()
    node = ds.node
    try:
        lab.wait_until(f"8 GPUs published for {node}", lambda: len(published(lab, node)) == 8, timeout=180)
        before = ready_pod(lab, node, DAEMONSET).metadata.uid
        run = run_with(
            ds,
            "upgrade_driver.yml",
            "-e",
            "nvidia_driver_branch=535",
            "-e",
            "__upgrade_driver_version_file=/proc/sys/kernel/random/uuid",
            gpuops_upgrade_ready_timeout=120,
            **DRA_VARS,
        )
        after = node_pod(lab, node, DAEMONSET)
        published_after = len(published(lab, node))
        # The wait looks for another driver's slices, which never come: the play must say the node stays cordoned.
        stuck = run_with(
            ds,
            "upgrade_driver.yml",
            "-e",
            "nvidia_driver_branch=535",
            gpuops_upgrade_ready_timeout=20,
            device_plugin_dra_driver_name="gpu.example.invalid",
            **DRA_VARS,
        )
        stuck_unschedulable = bool(lab.node(node).spec.unschedulable)
        yield DraUpgrade(
            node=node,
            run=run,
            pod_before=before,
            pod_after=after.metadata.uid if after else "",
            published_after=published_after,
            stuck=stuck,
            stuck_unschedulable=stuck_unschedulable,
        )
    finally:
        lab.core.patch_node(node, {"spec": {"unschedulable": False}})


def test_dra_node_upgrade_restarts_the_driver_and_waits_for_its_slices(lab: Lab, dra_upgrade: DraUpgrade) -> None:
    run = dra_upgrade.run
    assert run.returncode == 0, run.summary()
    assert run.recap[dra_upgrade.node]["failed"] == 0
    assert "the device plugin is restarted to see it" in " ".join(run.output.split())
    assert dra_upgrade.pod_after, "no DRA driver pod on the node after the upgrade"
    assert dra_upgrade.pod_after != dra_upgrade.pod_before, "the DRA driver's pod was not replaced"
    assert dra_upgrade.published_after == 8
    assert "Wait until the node publishes its GPUs in its ResourceSlices" in run.output, run.summary()


def test_dra_node_whose_wait_fails_is_named_as_left_cordoned(dra_upgrade: DraUpgrade) -> None:
    stuck = dra_upgrade.stuck
    assert stuck.returncode != 0, stuck.summary()
    assert dra_upgrade.stuck_unschedulable
    assert f"{dra_upgrade.node} is left cordoned" in " ".join(stuck.output.split()), stuck.summary()


# Two more converges of a DaemonSet node (about 2.5 minutes on 2 cores): make test-full. make test switches the
# deployment alone (test_site_daemonset.py) and the allocation alone (test_site_dra.py, and this module's teardown).
@pytest.mark.full
def test_the_deployment_and_the_allocation_change_in_one_run(
    lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]
) -> None:
    """From the DRA driver's DaemonSet to the device plugin's systemd service in one run, and back: the switch stops
    the allocator the node runs (its DaemonSet pod, then its service), not the one it is to run."""
    ds, _to_dra = dra_ds
    node = ds.node
    # A wait for an allocator that was never stopped would end here, not after the default two minutes.
    bounded = {"device_plugin_switch_timeout": 60}
    to_systemd = ds.run_site(device_plugin_mode="systemd", **bounded)
    assert to_systemd.returncode == 0, to_systemd.summary()
    assert lab.node_exec(node, "systemctl", "is-active", "gpuops-device-plugin", check=False).stdout.strip() == "active"
    lab.wait_until(f"{GPU}=8 from the service", lambda: lab.allocatable(node).get(GPU) == "8", timeout=90)
    assert published(lab, node) == {}, "the DRA driver's slices were left"
    assert MODE_LABEL not in (lab.node(node).metadata.labels or {})

    back = ds.run_site(**DRA_VARS, **bounded)
    assert back.returncode == 0, back.summary()
    assert lab.node_exec(node, "systemctl", "is-active", "gpuops-device-plugin", check=False).stdout.strip() != "active"
    dra_pod(lab, node)
    lab.wait_until(f"8 GPUs published for {node}", lambda: len(published(lab, node)) == 8, timeout=180)
    assert lab.allocatable(node).get(GPU, "0") == "0"


def test_the_driver_renamed_gpu_nvidia_com_through_its_daemonset(
    lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]
) -> None:
    """device_plugin_dra_driver_name in daemonset mode: the node's pod restarts under NVIDIA's name and publishes the
    node's GPUs under it, labelled as this driver's; the old name's slices, plugin directory and registration socket
    are gone; the admission policy follows the name; the node records it. (The module's teardown then leaves DRA, which
    deletes the slices of the name the node records.)"""
    ds = dra_ds[0]
    before = dra_pod(lab, ds.node).metadata.uid
    renamed = ds.run_site(**DRA_VARS, device_plugin_dra_driver_name=NVIDIA)
    assert renamed.returncode == 0, renamed.summary()
    pod = dra_pod(lab, ds.node)
    assert pod.metadata.uid != before
    custom = client.CustomObjectsApi(lab.api)

    def slices_named(driver: str) -> list[dict]:
        return custom.list_cluster_custom_object(
            *RESOURCE, "resourceslices", field_selector=f"spec.nodeName={ds.node},spec.driver={driver}"
        )["items"]

    lab.wait_until(
        f"8 GPUs published as {NVIDIA}",
        lambda: sum(len(s["spec"].get("devices", [])) for s in slices_named(NVIDIA)) == 8,
        timeout=180,
    )
    assert all(s["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuops.k8s"} for s in slices_named(NVIDIA))
    assert slices_named(DRIVER) == []
    listing = lab.node_exec(ds.node, "ls", "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry").stdout
    assert DRIVER not in listing and NVIDIA in listing
    assert lab.node_exec(ds.node, "cat", "/var/lib/gpuops/dra-driver-name").stdout == f"{NVIDIA}\n"
    account = pod_account(lab, ds.node)
    try:
        custom_as_pod = client.CustomObjectsApi(account)
        custom_as_pod.create_cluster_custom_object(
            *RESOURCE, "resourceslices", _slice("e2e-own", ds.node, driver=NVIDIA), dry_run="All"
        )
        refused(custom_as_pod.create_cluster_custom_object, *RESOURCE, "resourceslices", _slice("e2e-old", ds.node))
    finally:
        account.close()
        # NVIDIA's DeviceClass names, which the role created and keeps after the node leaves DRA: gone, as
        # test_site_dra_nvidia.py starts from a cluster without them (it installs a DeviceClass of NVIDIA's chart).
        for name in (NVIDIA, "mig.nvidia.com"):
            custom.delete_cluster_custom_object(*RESOURCE, "deviceclasses", name)
