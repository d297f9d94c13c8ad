"""site.yml with the DRA driver in daemonset mode, on a node shaped like one with NVIDIA's driver.

The lab's last node (the one test_site_daemonset.py runs the device plugin's DaemonSet on) moves to
gpu_allocation_mode=dra: the DRA driver's DaemonSet pod reads the node's 8 simulated GPUs through NVML (the
node's mock libnvidia-ml.so.1, docs/mock-nvml.md, with the spec the only stand-ins), found under the node's
root mounted read-only at /driver-root, publishes them in a ResourceSlice, and writes per-claim CDI specs
whose device nodes are the node's own. An XID and a GPU off the bus show in the slice; a claim's container
sees the device nodes of exactly its GPUs. At the end the node goes back to the device plugin's DaemonSet,
as test_upgrade_driver.py expects it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import (
    Lab,
    container_environment,
    container_nvidia_devices,
    ensure_runc_runtime_class,
    gpu_device_nodes,
    run_lab,
    running_pod,
    write_in_place,
)
from daemonset_node import GPU, MODE_LABEL, NAMESPACE, SPEC, DaemonsetNode, daemonset_node
from dra_objects import DRIVER, RESOURCE, claim_template, pod_manifest, published
from kubernetes import client
from playbook_run import PlaybookRun

POD_SELECTOR = "app.kubernetes.io/name=gpuops-dra-plugin"


@pytest.fixture(scope="module")
def dra_ds(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonsetNode, PlaybookRun]]:
    ds = daemonset_node(lab, tmp_path_factory.mktemp("site-daemonset"))
    lab.wait_until(f"{GPU}=8 from the plugin's DaemonSet", lambda: lab.allocatable(ds.node).get(GPU) == "8")
    # The lab's API server listens on the machine's loopback and no kube-proxy routes the cluster's service
    # address, so the pod reaches it as the node does: with the node's credentials on the host's network.
    to_dra = ds.run_site("--diff", gpu_allocation_mode="dra", device_plugin_dra_daemonset_node_credentials=True)
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
    mount = next(m for m in container.volume_mounts if m.name == "driver-root")
    assert (mount.mount_path, mount.read_only) == ("/driver-root", True)
    assert not [e for e in container.env or [] if e.name == "NVIDIA_VISIBLE_DEVICES"], "the lab's runtime injects none"
    devices = lab.wait_until(
        f"8 GPUs published for {ds.node}", lambda: (d := published(lab, ds.node)) and len(d) == 8 and d, timeout=120
    )
    spec_uuids = {gpu["uuid"] for gpu in yaml.safe_load(SPEC.read_text())["gpus"]}
    assert {d["attributes"]["uuid"]["string"] for d in devices.values()} == spec_uuids
    log = lab.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
    assert '"msg": "NVML library from the driver root"' in log, log[-3000:]


def test_a_claim_container_sees_the_device_nodes_of_its_gpu(
    lab: Lab, dra_ds: tuple[DaemonsetNode, PlaybookRun]
) -> None:
    ds = dra_ds[0]
    api = client.CustomObjectsApi(lab.api)
    template = f"one-gpu-{uuid.uuid4().hex[:6]}"
    api.create_namespaced_custom_object(
        *RESOURCE, "default", "resourceclaimtemplates", claim_template(template, 1, "40Gi")
    )
    name = f"dra-ds-{uuid.uuid4().hex[:8]}"
    ensure_runc_runtime_class(lab)
    lab.core.create_namespaced_pod("default", pod_manifest(name, ds.node, claim_template=template))
    try:
        pod = running_pod(lab, name)
        container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
        visible = container_environment(lab, ds.node, container_id)["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(visible) == 1, visible
        # The CDI spec the pod's driver wrote names the node's device nodes (found under /driver-root/dev).
        assert container_nvidia_devices(lab, ds.node, container_id) == gpu_device_nodes(SPEC, visible)
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
