"""site.yml names a lab node's DRA driver gpu.nvidia.com, NVIDIA's DRA driver's name, and claims written in NVIDIA's
dialect run on it: NVIDIA's DeviceClasses, CEL on NVIDIA's attributes, a GpuConfig that time-slices a GPU shared by two
pods. Before that, the role refuses the new name while a claim is prepared under the old one, and where NVIDIA's own
driver serves the name (its DeviceClass in the cluster, its ResourceSlices on the node).

Proven against the lab's real kube-apiserver, scheduler, ResourceClaim controller, kubelet and containerd 1.7, with
the lab's mock NVIDIA driver (docs/mock-nvml.md). The time slice is set through a TEST DOUBLE of nvidia-smi (the lab
has none) that logs the arguments it is given on the node. The module runs after test_site_dra.py, which leaves the
first node in device_plugin mode, and leaves it so.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PAUSE_IMAGE, Lab, container_environment
from dra_objects import GPU, RESOURCE, pod_manifest
from kubernetes import client
from playbook_run import LAB_PY, REPO, PlaybookRun, lab_inventory
from test_site_dra import delete_pod, run_site, running, visible_devices

OURS = "gpu.gpuops.k8s"
NVIDIA = "gpu.nvidia.com"
NVIDIA_SMI = "/usr/local/sbin/gpuops-lab-nvidia-smi"
# Where the hardened service may write (ReadWritePaths: the health directory), as the double runs as the daemon.
NVIDIA_SMI_LOG = "/var/lib/gpuops/gpuops-lab-nvidia-smi.log"
MANAGED = {"app.kubernetes.io/managed-by": "gpuops.k8s"}
H100 = [f"GPU-6f1c0a3e-0000-4000-8000-00000000000{i}" for i in range(1, 9)]


@dataclass
class NvidiaFlow:
    node: str
    inventory: Path
    ours: Path  # extra vars: the driver under its own name
    nvidia: Path  # extra vars: the driver under NVIDIA's name


def vars_file(path: Path, driver: str) -> Path:
    """site.yml's extra vars: the plugin's config (as conftest.recovery_vars, with the nvidia-smi double) and the
    driver's name."""
    config = {
        "version": "v1",
        "flags": {"migStrategy": "none", "plugin": {"passDeviceSpecs": True}},
        "gpuops": {"healthRecoverySeconds": 1, "nvidiaSmi": NVIDIA_SMI},
    }
    path.write_text(yaml.safe_dump({"device_plugin_config": config, "device_plugin_dra_driver_name": driver}))
    return path


def slices_of(lab: Lab, node: str, driver: str) -> list[dict[str, Any]]:
    return client.CustomObjectsApi(lab.api).list_cluster_custom_object(
        *RESOURCE, "resourceslices", field_selector=f"spec.nodeName={node},spec.driver={driver}"
    )["items"]


def devices_of(lab: Lab, node: str, driver: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices_of(lab, node, driver) for d in s["spec"].get("devices", [])}


@pytest.fixture(scope="module")
def flow(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NvidiaFlow]:
    """The first node in dra mode under the driver's own name, with the nvidia-smi double on it."""
    node = lab.nodes[0]
    work = tmp_path_factory.mktemp("site-dra-nvidia")
    lab.node_exec(
        node,
        "sh",
        "-c",
        f"printf '%s\\n' '#!/bin/sh' 'echo \"$*\" >> {NVIDIA_SMI_LOG}' > {NVIDIA_SMI} && chmod 0755 {NVIDIA_SMI}"
        f" && rm -f {NVIDIA_SMI_LOG}",
    )
    flow = NvidiaFlow(
        node,
        lab_inventory(work / "inventory.yml"),
        vars_file(work / "ours.yml", OURS),
        vars_file(work / "nvidia.yml", NVIDIA),
    )
    first = run_site(flow.ours, flow.inventory, node, "dra")
    assert first.returncode == 0, first.summary()
    lab.wait_until("8 devices published as gpu.gpuops.k8s", lambda: len(devices_of(lab, node, OURS)) == 8)
    yield flow
    back = run_site(flow.ours, flow.inventory, node, "device_plugin")
    assert back.returncode == 0, back.summary()
    lab.node_exec(node, "rm", "-f", NVIDIA_SMI, NVIDIA_SMI_LOG)


def to_nvidia(flow: NvidiaFlow, *args: str) -> PlaybookRun:
    return run_site(flow.nvidia, flow.inventory, flow.node, "dra", *args)


def claim(name: str, device_class: str, selector: str = "", config: list[dict[str, Any]] | None = None) -> dict:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def pod_with_claim(name: str, node: str, claim_name: str) -> dict[str, Any]:
    manifest = pod_manifest(name, node)
    manifest["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim_name}]
    manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    return manifest


def test_a_claim_prepared_under_the_old_name_stops_the_change_of_name(lab: Lab, flow: NvidiaFlow) -> None:
    api = client.CustomObjectsApi(lab.api)
    name = f"held-{uuid.uuid4().hex[:6]}"
    api.create_namespaced_custom_object(*RESOURCE, "default", "resourceclaims", claim(name, OURS))
    lab.core.create_namespaced_pod("default", pod_with_claim(name, flow.node, name))
    try:
        running(lab, name)
        refused = to_nvidia(flow)
        assert refused.returncode != 0
        assert (
            f"{flow.node} runs its DRA driver as {OURS} with 1 prepared claim (default/{name}): delete the pods that"
            f" use it before the driver is named {NVIDIA} on this node"
        ) in " ".join(refused.output.split()), refused.summary()
        # Nothing moved: the old name's driver still serves the node, the new name publishes nothing.
        assert len(devices_of(lab, flow.node, OURS)) == 8 and devices_of(lab, flow.node, NVIDIA) == {}
    finally:
        delete_pod(lab, name)
        api.delete_namespaced_custom_object(*RESOURCE, "default", "resourceclaims", name)


def test_nvidia_s_driver_in_the_cluster_or_on_the_node_stops_the_change_of_name(lab: Lab, flow: NvidiaFlow) -> None:
    api = client.CustomObjectsApi(lab.api)
    # What NVIDIA's chart installs: the DeviceClass of its name, labelled by Helm.
    helm_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": NVIDIA, "labels": {"app.kubernetes.io/managed-by": "Helm"}},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA}'"}}]},
    }
    api.create_cluster_custom_object(*RESOURCE, "deviceclasses", helm_class)
    try:
        refused = to_nvidia(flow)
    finally:
        api.delete_cluster_custom_object(*RESOURCE, "deviceclasses", NVIDIA)
    assert refused.returncode != 0
    assert (
        f"NVIDIA's DRA driver is installed in this cluster (DeviceClass {NVIDIA} was not created by this collection),"
        f" so this driver cannot be named {NVIDIA}"
    ) in " ".join(refused.output.split()), refused.summary()
    # What NVIDIA's kubelet plugin publishes on the node: a slice of its name, not labelled ours.
    node_uid = lab.core.read_node(flow.node).metadata.uid
    foreign = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"{flow.node}-{NVIDIA}-",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": flow.node, "uid": node_uid}],
        },
        "spec": {
            "driver": NVIDIA,
            "nodeName": flow.node,
            "pool": {"name": flow.node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    created = api.create_cluster_custom_object(*RESOURCE, "resourceslices", foreign)
    try:
        refused = to_nvidia(flow)
    finally:
        api.delete_cluster_custom_object(*RESOURCE, "resourceslices", created["metadata"]["name"])
    assert refused.returncode != 0
    assert (
        f"NVIDIA's DRA driver serves {NVIDIA} on {flow.node} (ResourceSlices this driver did not write), so this"
        " driver cannot take that name there"
    ) in " ".join(refused.output.split()), refused.summary()
    assert len(devices_of(lab, flow.node, OURS)) == 8


@pytest.fixture(scope="module")
def renamed(lab: Lab, flow: NvidiaFlow) -> tuple[PlaybookRun, PlaybookRun]:
    """site.yml with the driver named gpu.nvidia.com, twice (after the refusals above)."""
    first = to_nvidia(flow, "--diff")
    lab.wait_until("8 devices published as gpu.nvidia.com", lambda: len(devices_of(lab, flow.node, NVIDIA)) == 8)
    return first, to_nvidia(flow)


def test_the_node_s_driver_is_named_gpu_nvidia_com_and_the_old_name_is_gone(
    lab: Lab, flow: NvidiaFlow, renamed: tuple[PlaybookRun, PlaybookRun]
) -> None:
    first, second = renamed
    assert first.returncode == 0, first.summary()
    assert second.returncode == 0 and second.changed == 0, second.changed_tasks()
    assert all(s["metadata"].get("labels") == MANAGED for s in slices_of(lab, flow.node, NVIDIA))
    devices = devices_of(lab, flow.node, NVIDIA)
    assert sorted(devices) == [f"gpu-{i}" for i in range(8)]
    assert {d["attributes"]["uuid"]["string"] for d in devices.values()} == set(H100)
    assert devices_of(lab, flow.node, OURS) == {}, "the old name's slices are deleted"
    listing = lab.node_exec(flow.node, "ls", "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry").stdout
    assert OURS not in listing and NVIDIA in listing
    record = lab.node_exec(flow.node, "cat", "/var/lib/gpuops/dra-driver-name").stdout
    assert record == f"{NVIDIA}\n"
    api = client.CustomObjectsApi(lab.api)
    classes = {c["metadata"]["name"]: c for c in api.list_cluster_custom_object(*RESOURCE, "deviceclasses")["items"]}
    assert classes[NVIDIA]["metadata"]["labels"] == MANAGED
    assert classes[NVIDIA]["spec"]["extendedResourceName"] == GPU
    assert classes[NVIDIA]["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{NVIDIA}" && device.attributes["{NVIDIA}"].type == "gpu"'}}
    ]
    assert classes["mig.nvidia.com"]["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{NVIDIA}" && device.attributes["{NVIDIA}"].type == "mig"'}}
    ]
    assert "extendedResourceName" not in classes["mig.nvidia.com"]["spec"]


def test_a_claim_in_nvidia_s_dialect_gets_the_gpu_its_selector_names(
    lab: Lab, flow: NvidiaFlow, renamed: tuple[PlaybookRun, PlaybookRun]
) -> None:
    api = client.CustomObjectsApi(lab.api)
    name = f"nv-{uuid.uuid4().hex[:6]}"
    selector = (
        f"device.attributes['{NVIDIA}'].uuid == '{H100[5]}'"
        f" && device.attributes['{NVIDIA}'].brand == 'Nvidia'"
        f" && device.attributes['{NVIDIA}'].architecture == 'Hopper'"
        f" && device.attributes['{NVIDIA}'].cudaComputeCapability.isGreaterThan(semver('8.0.0'))"
        f" && device.capacity['{NVIDIA}'].memory.compareTo(quantity('79Gi')) >= 0"
        " && device.attributes['resource.kubernetes.io'].numaNode == 1"
    )
    api.create_namespaced_custom_object(*RESOURCE, "default", "resourceclaims", claim(name, NVIDIA, selector))
    lab.core.create_namespaced_pod("default", pod_with_claim(name, flow.node, name))
    try:
        pod = running(lab, name)
        assert visible_devices(lab, flow.node, pod) == [H100[5]]
    finally:
        delete_pod(lab, name)
        api.delete_namespaced_custom_object(*RESOURCE, "default", "resourceclaims", name)


def test_a_time_sliced_gpu_config_is_set_for_two_pods_sharing_the_claim_and_set_back_after(
    lab: Lab, flow: NvidiaFlow, renamed: tuple[PlaybookRun, PlaybookRun]
) -> None:
    api = client.CustomObjectsApi(lab.api)
    name = f"ts-{uuid.uuid4().hex[:6]}"
    config = [
        {
            "opaque": {
                "driver": NVIDIA,
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
                },
            }
        }
    ]
    lab.node_exec(flow.node, "rm", "-f", NVIDIA_SMI_LOG)
    api.create_namespaced_custom_object(*RESOURCE, "default", "resourceclaims", claim(name, NVIDIA, config=config))
    pods = [f"{name}-a", f"{name}-b"]
    for pod in pods:
        lab.core.create_namespaced_pod("default", pod_with_claim(pod, flow.node, name))
    try:
        seen = {tuple(visible_devices(lab, flow.node, running(lab, pod))) for pod in pods}
        assert len(seen) == 1, seen
        ((gpu,),) = seen
        assert gpu in H100
        log = lab.node_exec(flow.node, "cat", NVIDIA_SMI_LOG).stdout.splitlines()
        assert log == [f"-i {gpu} -c DEFAULT", f"compute-policy -i {gpu} --set-timeslice 3"]
    finally:
        for pod in pods:
            delete_pod(lab, pod)
        api.delete_namespaced_custom_object(*RESOURCE, "default", "resourceclaims", name)
    lab.wait_until(
        "the time slice set back to Default",
        lambda: (
            lab.node_exec(flow.node, "cat", NVIDIA_SMI_LOG).stdout.splitlines()[2:]
            == [f"-i {gpu} -c DEFAULT", f"compute-policy -i {gpu} --set-timeslice 0"]
        ),
        timeout=60,
    )
    state = json.loads(lab.node_exec(flow.node, "cat", f"/var/lib/kubelet/plugins/{NVIDIA}/checkpoint.json").stdout)
    assert state["claims"] == {}


# NVIDIA's own demo specs of its DRA driver (v0.5.0's module, demo/specs), applied with only the container image
# replaced by the lab's (whose /bin/bash is the lab's pause program: a TEST DOUBLE of the demos' ubuntu image, which
# keeps running the `bash -c ...` the demos give it). Left out, with docs/compared-dra.md's reasons: gpu-test4 (MIG
# devices of an A100 40GB), gpu-test5 (MPS, which this driver refuses), gpu-test6 (selects on an `index` attribute
# neither driver publishes), the VFIO and IMEX specs, extended-resources/mig-1g-12gb.yaml (an H200's MIG profile).
DEMOS = ("quickstart/v1/gpu-test1.yaml", "quickstart/v1/gpu-test2.yaml", "quickstart/v1/gpu-test3.yaml")
EXTENDED = "extended-resources/gpu-full.yaml"


def nvidia_demo_specs() -> Path:
    """NVIDIA's module as scripts/build-nvidia-dra-driver.sh downloads it into the Go module cache."""
    subprocess.run([str(REPO / "scripts" / "build-nvidia-dra-driver.sh")], check=True, stdout=subprocess.DEVNULL)
    cache = Path(os.environ.get("GPUOPS_CACHE") or Path.home() / ".cache" / "gpuops")
    return cache / "go-mod" / "sigs.k8s.io" / "dra-driver-nvidia-gpu@v0.5.0" / "demo" / "specs"


def with_lab_image(document: dict[str, Any]) -> dict[str, Any]:
    """The object with each container's image replaced by the lab's, and nothing else changed."""
    spec = document.get("spec", {})
    pod_spec = spec.get("template", {}).get("spec") if document["kind"] == "Deployment" else spec
    for container in (pod_spec or {}).get("containers", []):
        container["image"] = PAUSE_IMAGE
    return document


def apply(documents: list[dict[str, Any]]) -> None:
    """`kubectl apply` of the objects, as a person applies NVIDIA's demos (the lab's kubectl, as an admin)."""
    done = subprocess.run(
        [str(LAB_PY), "kubectl", "apply", "-f", "-"],
        input=yaml.safe_dump_all(documents),
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def pod_devices(lab: Lab, node: str, pod: client.V1Pod) -> list[list[str]]:
    """Per container, the GPUs its claims' CDI specs gave it (GPUOPS_DEVICE_<NAME> variables, as visible_devices)."""
    seen = []
    for status in pod.status.container_statuses:
        environment = container_environment(lab, node, status.container_id.removeprefix("containerd://"))
        seen.append(sorted(v for k, v in environment.items() if k.startswith("GPUOPS_DEVICE_")))
    return seen


def claim_gpus(lab: Lab, namespace: str, pod: client.V1Pod) -> list[str]:
    """The UUIDs of the devices the pod's claims were allocated, from the API (the slice's uuid attributes)."""
    api = client.CustomObjectsApi(lab.api)
    raw = lab.api.sanitize_for_serialization(pod)
    names = [s["resourceClaimName"] for s in raw["status"].get("resourceClaimStatuses") or []]
    names += [c["resourceClaimName"] for c in raw["spec"].get("resourceClaims") or [] if c.get("resourceClaimName")]
    # A pod asking for nvidia.com/gpu on a DRA node: the claim the scheduler wrote for it.
    extended = raw["status"].get("extendedResourceClaimStatus")
    if extended:
        names.append(extended["resourceClaimName"])
    assert names, f"{namespace}/{pod.metadata.name} has no claim"
    published = devices_of(lab, pod.spec.node_name, NVIDIA)
    gpus = set()
    for name in names:
        claim = api.get_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", name)
        for result in claim["status"]["allocation"]["devices"]["results"]:
            gpus.add(published[result["device"]]["attributes"]["uuid"]["string"])
    return sorted(gpus)


# In `make test-full` only: the claims it proves (one GPU per claim, a claim shared by containers and by pods, the
# extended-resource mapping) are `make test`'s in the tests above and in test_site_dra.py; this applies NVIDIA's own.
@pytest.mark.full
def test_nvidia_s_demo_claims_run_unchanged_and_each_pod_sees_exactly_its_claim_s_gpus(
    lab: Lab, flow: NvidiaFlow, renamed: tuple[PlaybookRun, PlaybookRun]
) -> None:
    specs = nvidia_demo_specs()
    namespaces = []
    others = [n for n in lab.nodes if n != flow.node]
    # The extended-resource demo asks for nvidia.com/gpu, which another lab node's device plugin could serve: only
    # this node may take it, so that its DeviceClass mapping is what serves it.
    for other in others:
        lab.core.patch_node(other, {"spec": {"unschedulable": True}})
    try:
        for path in (*DEMOS, EXTENDED):
            documents = [d for d in yaml.safe_load_all((specs / path).read_text()) if d]
            namespaces += [d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"]
            apply([with_lab_image(d) for d in documents])
        seen: dict[str, dict[str, Any]] = {}
        for namespace in namespaces:
            pods = lab.wait_until(
                f"the pods of {namespace} Running",
                lambda ns=namespace: (
                    (items := lab.core.list_namespaced_pod(ns).items)
                    and all(p.status.phase == "Running" for p in items)
                    and items
                ),
                timeout=180,
            )
            for pod in pods:
                assert pod.spec.node_name == flow.node, f"{namespace}/{pod.metadata.name}"
                gpus = claim_gpus(lab, namespace, pod)
                containers = pod_devices(lab, flow.node, pod)
                # Every container sees exactly the GPUs of the claims it names (each demo's containers name all).
                assert containers == [gpus] * len(containers), f"{namespace}/{pod.metadata.name}"
                seen[f"{namespace}/{pod.metadata.name}"] = {"gpus": gpus, "containers": len(containers)}
        # gpu-test1: two pods, a claim each from the template: two different GPUs. gpu-test2: one pod, two
        # containers sharing one GPU. gpu-test3: two pods sharing one claim: the same GPU. gpu-full: one GPU
        # through the DeviceClass's extended-resource mapping.
        assert len(seen["gpu-test1/pod1"]["gpus"]) == len(seen["gpu-test1/pod2"]["gpus"]) == 1
        assert seen["gpu-test1/pod1"]["gpus"] != seen["gpu-test1/pod2"]["gpus"]
        assert seen["gpu-test2/pod"] == {"gpus": seen["gpu-test2/pod"]["gpus"], "containers": 2}
        assert len(seen["gpu-test2/pod"]["gpus"]) == 1
        assert (
            seen["gpu-test3/pod1"]["gpus"] == seen["gpu-test3/pod2"]["gpus"]
            and len(seen["gpu-test3/pod1"]["gpus"]) == 1
        )
        assert len(seen["extended-resource-gpu-full/gpu-full-pod"]["gpus"]) == 1
    finally:
        for namespace in namespaces:
            lab.core.delete_namespace(namespace)
        for other in others:
            lab.core.patch_node(other, {"spec": {"unschedulable": False}})
        lab.wait_until(
            "the demos' namespaces gone",
            lambda: not {n.metadata.name for n in lab.core.list_namespace().items} & set(namespaces),
            timeout=180,
        )
