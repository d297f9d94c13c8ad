"""site.yml names a lab node's DRA driver gpu.nvidia.com, NVIDIA's DRA driver's name, and claims written in NVIDIA's
dialect run on it: NVIDIA's DeviceClasses, CEL on NVIDIA's attributes, a GpuConfig that time-slices a GPU shared by two
pods. Before that, the role refuses the new name while a claim is prepared under the old one, and where NVIDIA's own
driver serves the name (its DeviceClass in the cluster, its ResourceSlices on the node); after it, a run finishes a
change of name that an earlier run left half done. Last, NVIDIA's own demo specs run on our driver, then (make test-full
only; make test runs ours on both shapes) on NVIDIA's driver (gpu-kubelet-plugin v0.5.0, built by
scripts/build-nvidia-dra-driver.sh) on the same node with the same kubelet:
the two publish the same devices, and every claim gets the same devices from both; then both again with the node's GPUs
simulated as four A100s and two H100 NVLs in MIG mode and two whole A100s: the same MIG devices from both, NVIDIA's MIG
demos on both, and NVIDIA's gpu-test6 refused alike by the scheduler on both (it selects on an attribute, `index`, that
neither driver publishes).

Proven against the lab's real kube-apiserver, scheduler, ResourceClaim controller, kubelet and containerd 1.7, with
the lab's mock NVIDIA driver (docs/mock-nvml.md). The time slice is set through a TEST DOUBLE of nvidia-smi (the lab
has none) that logs the arguments it is given on the node. The module runs after test_site_dra.py, which leaves the
first node in device_plugin mode, and leaves it so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PAUSE_IMAGE, Lab, container_pid, full_suite, gpu_device_nodes, run_lab
from dra_objects import GPU, RESOURCE, pod_manifest
from gpuops_lab.config import LabConfig
from gpuops_lab.inventory import CAPS_MAJOR, CDI_REFRESH_UNIT
from kubernetes import client
from playbook_run import LAB_PY, REPO, PlaybookRun, lab_inventory
from test_site_dra import SERVICE, delete_pod, run_site, running, visible_devices

OURS = "gpu.gpuops.k8s"
NVIDIA = "gpu.nvidia.com"
NVIDIA_SMI = "/usr/local/sbin/gpuops-lab-nvidia-smi"
# Where the hardened service may write (ReadWritePaths: the health directory), as the double runs as the daemon.
NVIDIA_SMI_LOG = "/var/lib/gpuops/gpuops-lab-nvidia-smi.log"
RECORD = "/var/lib/gpuops/dra-driver-name"
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


def create_slice(lab: Lab, node: str, driver: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An empty ResourceSlice of the driver in the node's pool, owned by the Node as a kubelet plugin's are."""
    node_uid = lab.core.read_node(node).metadata.uid
    metadata: dict[str, Any] = {
        "generateName": f"{node}-{driver}-",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
    }
    if labels:
        metadata["labels"] = labels
    piece = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    return client.CustomObjectsApi(lab.api).create_cluster_custom_object(*RESOURCE, "resourceslices", piece)


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
    created = create_slice(lab, flow.node, NVIDIA)
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
    record = lab.node_exec(flow.node, "cat", RECORD).stdout
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


def test_a_change_of_name_cut_short_is_finished_by_the_next_run_without_a_restart(
    lab: Lab, flow: NvidiaFlow, renamed: tuple[PlaybookRun, PlaybookRun]
) -> None:
    """A run that stopped after the daemon restarted under the new name and before the old name's leftovers went: the
    node's record still names the old name, and its plugin directory, registration socket and a slice are there. The
    next run removes them and records the new name; the daemon, already under the new name, keeps running."""
    old_dir = f"/var/lib/kubelet/plugins/{OURS}"
    old_socket = f"/var/lib/kubelet/plugins_registry/{OURS}-reg.sock"
    daemon_pid = lab.node_exec(flow.node, "systemctl", "show", "-p", "MainPID", "--value", SERVICE).stdout.strip()
    lab.node_exec(
        flow.node,
        "sh",
        "-c",
        f"mkdir -p {old_dir} && printf '%s\\n' '{{\"claims\": {{}}}}' > {old_dir}/checkpoint.json && touch {old_socket}"
        f" && printf '%s\\n' {OURS} > {RECORD}",
    )
    create_slice(lab, flow.node, OURS, labels=MANAGED)
    finished = to_nvidia(flow)
    assert finished.returncode == 0, finished.summary()
    assert finished.changed > 0
    assert slices_of(lab, flow.node, OURS) == []
    left_over = lab.node_exec(flow.node, "ls", "-d", old_dir, old_socket, check=False)
    assert left_over.returncode != 0 and left_over.stdout == "", left_over.stdout
    assert lab.node_exec(flow.node, "cat", RECORD).stdout == f"{NVIDIA}\n"
    assert (
        lab.node_exec(flow.node, "systemctl", "show", "-p", "MainPID", "--value", SERVICE).stdout.strip() == daemon_pid
    )
    assert len(devices_of(lab, flow.node, NVIDIA)) == 8


# NVIDIA's own demo specs of its DRA driver (v0.5.0's module, demo/specs), applied with only the container image
# replaced by the lab's (whose /bin/bash is the lab's pause program: a TEST DOUBLE of the demos' ubuntu image, which
# keeps running the `bash -c ...` the demos give it), first to our driver under NVIDIA's name, then to NVIDIA's own
# driver on the same node, per shape of the node's GPUs: gpu-test4 asks for MIG devices of A100 40GBs and
# extended-resources/mig-1g-12gb.yaml for a 1g.12gb (a profile of the H100 NVL and the GH200), so they run with the
# node's GPUs simulated as four A100s in MIG mode, two whole A100s and two H100 NVLs in MIG mode
# (tests/fixtures/simulated/mig-demos.yaml). gpu-test6 selects whole A100s on an `index` attribute that neither driver
# publishes: it is applied to both and must be refused by the scheduler alike (UNALLOCATABLE). Left out, with
# docs/compared-dra.md's reasons: gpu-test5 (MPS, which this driver refuses), the VFIO and IMEX specs.
DEMOS = {
    "h100x8": (
        "quickstart/v1/gpu-test1.yaml",
        "quickstart/v1/gpu-test2.yaml",
        "quickstart/v1/gpu-test3.yaml",
        "extended-resources/gpu-full.yaml",
    ),
    "mig-demos": ("quickstart/v1/gpu-test4.yaml", "extended-resources/mig-1g-12gb.yaml"),
}
# Demos no driver can serve, per shape: applied after the others; their pods stay unscheduled, and what the scheduler
# says of them is recorded (the CEL runtime error it gives).
UNALLOCATABLE = {"mig-demos": ("quickstart/v1/gpu-test6.yaml",)}
# The devices each shape publishes: 8 GPUs; 4 GPUs in MIG mode with 4 MIG devices each, 2 whole GPUs, and 2 GPUs in MIG
# mode with 7 each.
DEVICES = {"h100x8": 8, "mig-demos": 32}
# What a demo container's series in our daemon's dcgm metrics say of its claim and device (run_demos).
DRA_SERIES = (
    "dra_claim_namespace",
    "dra_driver_name",
    "dra_device_name",
    "UUID",
    "GPU_I_PROFILE",
    "dra_mig_profile",
    "dra_mig_device_uuid",
)
# NVIDIA's driver on the lab node: its binary and a TEST DOUBLE of the GPUs' PCI devices in sysfs (the node's sysfs is
# this machine's, with no NVIDIA device), which NVIDIA's driver reads through its own NVIDIA_DRA_SYSFS_ROOT.
NVIDIA_UNIT = "gpuops-lab-nvidia-dra"
NVIDIA_BINARY = "/usr/local/bin/gpu-kubelet-plugin"
NVIDIA_SYSFS = "/run/gpuops-lab-nvidia-dra/sysfs"
# And a TEST DOUBLE of /proc/devices (the node's is this machine's kernel's, with no NVIDIA driver), through NVIDIA's
# own ALT_PROC_DEVICES_PATH: the lab's major of nvidia-caps, the one device NVIDIA's driver looks up there, which it
# puts into a MIG device's CDI edits with the minors the lab's /proc/driver/nvidia/capabilities gives (docs/lab.md).
NVIDIA_PROC_DEVICES = "/run/gpuops-lab-nvidia-dra/devices"
PROC_DEVICES = f"Character devices:\n{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n"
NODE_NVIDIA_SMI = "/usr/bin/nvidia-smi"
PLUGIN_DIR = f"/var/lib/kubelet/plugins/{NVIDIA}"
# The toolkit's CDI specification of the node's GPUs, which the nvidia runtime gives a container its devices from.
TOOLKIT_CDI_SPEC = "/var/run/cdi/nvidia.yaml"


def nvidia_build() -> tuple[Path, Path]:
    """NVIDIA's gpu-kubelet-plugin and its module's demo specs, as scripts/build-nvidia-dra-driver.sh builds it and
    downloads the module into the Go module cache."""
    done = subprocess.run(
        [str(REPO / "scripts" / "build-nvidia-dra-driver.sh")],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert done.returncode == 0, f"scripts/build-nvidia-dra-driver.sh failed:\n{done.stderr[-3000:]}"
    cache = Path(os.environ.get("GPUOPS_CACHE") or Path.home() / ".cache" / "gpuops")
    module = cache / "go-mod" / "sigs.k8s.io" / "dra-driver-nvidia-gpu@v0.5.0"
    return Path(done.stdout.strip().splitlines()[-1]) / "gpu-kubelet-plugin", module / "demo" / "specs"


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


def pod_allocation(lab: Lab, namespace: str, pod: client.V1Pod) -> dict[str, list[str]]:
    """Per container, the names of the devices allocated to the claims and requests it names (in the extended-resource
    demo, to the requests the scheduler mapped to it), from the API."""
    api = client.CustomObjectsApi(lab.api)
    raw = lab.api.sanitize_for_serialization(pod)
    claim_of = {c["name"]: c.get("resourceClaimName") for c in raw["spec"].get("resourceClaims") or []}
    claim_of.update({s["name"]: s["resourceClaimName"] for s in raw["status"].get("resourceClaimStatuses") or []})
    wanted = {
        c["name"]: [(claim_of[r["name"]], r.get("request")) for r in (c.get("resources") or {}).get("claims") or []]
        for c in raw["spec"]["containers"]
    }
    extended = raw["status"].get("extendedResourceClaimStatus") or {}
    for mapping in extended.get("requestMappings") or []:
        wanted[mapping["containerName"]].append((extended["resourceClaimName"], mapping["requestName"]))
    results = {}
    for claim_name in {claim_name for pairs in wanted.values() for claim_name, _request in pairs}:
        claim = api.get_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", claim_name)
        results[claim_name] = claim["status"]["allocation"]["devices"]["results"]
        for result in results[claim_name]:
            assert (result["driver"], result["pool"]) == (NVIDIA, pod.spec.node_name), result
    return {
        container: sorted(
            {r["device"] for name, request in pairs for r in results[name] if request in (None, r["request"])}
        )
        for container, pairs in wanted.items()
    }


def container_device_nodes(lab: Lab, node: str, container_id: str) -> list[str]:
    """The NVIDIA device nodes in the container's /dev, as 'name major:minor' (hex), MIG's capability nodes
    (nvidia-caps/nvidia-cap<minor>) among them."""
    pid = container_pid(lab, node, container_id)
    listed = lab.node_exec(
        node,
        "sh",
        "-c",
        f"cd /proc/{pid}/root/dev && stat -c '%n %t:%T' nvidia* nvidia-caps/* 2>/dev/null",
        check=False,
    ).stdout
    return sorted(line for line in listed.splitlines() if not line.startswith("nvidia-caps "))


def dcgm_holders(address: str, namespace: str) -> dict[tuple[str, str], list[dict[str, str]]]:
    """(pod, container) of the namespace -> the labels of each DCGM_FI_DEV_FB_USED series (a GPU's or a MIG device's)
    the node's daemon serves with that container as its holder."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found: dict[tuple[str, str], list[dict[str, str]]] = {}
    for labels in re.findall(r"^DCGM_FI_DEV_FB_USED\{([^}]*)\}", text, re.MULTILINE):
        series = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if series.get("namespace") == namespace:
            found.setdefault((series["pod"], series["container"]), []).append(series)
    return found


def run_demos(lab: Lab, node: str, specs: Path, shape: str, dcgm: str = "") -> dict[str, list[dict[str, Any]]]:
    """Apply each demo of the shape in turn on the node (the other nodes cordoned: the extended-resource demo asks for
    nvidia.com/gpu, which another node's device plugin could serve) and wait for its pods. Per namespace, per pod
    (sorted, as pod names are random), per container: its devices and the NVIDIA device nodes it sees. Every container
    sees exactly its devices' GPUs, and a capability node for each MIG device's GPU and compute instance. With `dcgm`
    (our daemon's dcgm metrics address), also each container's series there, once every container has some (DRA_SERIES:
    what they say of the claim and device). Then the shape's UNALLOCATABLE demos, each recorded as the set of CEL
    runtime errors the scheduler gives its pods. The namespaces (and the DeviceClasses a demo brings) are gone when it
    returns, so every claim is unprepared."""
    spec_path = Path(run_lab("spec-path", node.rsplit("-", 1)[1]).strip())
    others = [n for n in lab.nodes if n != node]
    for other in others:
        lab.core.patch_node(other, {"spec": {"unschedulable": True}})
    namespaces: list[str] = []
    device_classes: list[str] = []
    seen: dict[str, list[dict[str, Any]]] = {}
    try:
        for path in DEMOS[shape]:
            documents = [d for d in yaml.safe_load_all((specs / path).read_text()) if d]
            (namespace,) = [d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"]
            namespaces.append(namespace)
            device_classes += [d["metadata"]["name"] for d in documents if d["kind"] == "DeviceClass"]
            apply([with_lab_image(d) for d in documents])
            try:
                pods = lab.wait_until(
                    f"the pods of {namespace} running, every container ready",
                    lambda ns=namespace: (
                        (items := lab.core.list_namespaced_pod(ns).items)
                        and all(
                            p.status.phase == "Running" and all(s.ready for s in p.status.container_statuses or [])
                            for p in items
                        )
                        and items
                    ),
                    timeout=180,
                )
            except pytest.fail.Exception as error:
                states = {
                    f"{p.metadata.name}/{s.name}": (s.restart_count, lab.api.sanitize_for_serialization(s.state))
                    for p in lab.core.list_namespaced_pod(namespace).items
                    for s in p.status.container_statuses or []
                }
                pytest.fail(f"{error}: {states}")
            published = devices_of(lab, node, NVIDIA)
            held: dict[tuple[str, str], list[dict[str, str]]] = {}
            if dcgm:
                everyone = {(p.metadata.name, c.name) for p in pods for c in p.spec.containers}
                held = lab.wait_until(
                    f"every container of {namespace} holding its devices in the daemon's dcgm metrics",
                    lambda ns=namespace, everyone=everyone: set(found := dcgm_holders(dcgm, ns)) == everyone and found,
                    timeout=30,
                )
            records = []
            for pod in pods:
                assert pod.spec.node_name == node, f"{namespace}/{pod.metadata.name}"
                allocation = pod_allocation(lab, namespace, pod)
                ids = {s.name: s.container_id.removeprefix("containerd://") for s in pod.status.container_statuses}
                containers = []
                for container in pod.spec.containers:
                    devices = allocation[container.name]
                    attributes = [published[d]["attributes"] for d in devices]
                    gpus = sorted({a.get("parentUUID", a["uuid"])["string"] for a in attributes})
                    nodes = container_device_nodes(lab, node, ids[container.name])
                    where = f"{namespace}/{pod.metadata.name}/{container.name}"
                    assert [n for n in nodes if not n.startswith("nvidia-caps/")] == gpu_device_nodes(
                        spec_path, gpus
                    ), where
                    migs = sum(a["type"]["string"] == "mig" for a in attributes)
                    assert sum(n.startswith("nvidia-caps/") for n in nodes) == 2 * migs, (where, nodes)
                    record = {"devices": devices, "gpus": gpus, "nodes": nodes}
                    if dcgm:
                        series = held[(pod.metadata.name, container.name)]
                        record["dcgm"] = sorted(tuple(labels.get(key, "") for key in DRA_SERIES) for labels in series)
                    containers.append(record)
                records.append(containers)
            seen[namespace] = sorted(records, key=json.dumps)
        for path in UNALLOCATABLE.get(shape, ()):
            documents = [d for d in yaml.safe_load_all((specs / path).read_text()) if d]
            (namespace,) = [d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"]
            namespaces.append(namespace)
            apply([with_lab_image(d) for d in documents])
            replicas = sum(d["spec"]["replicas"] for d in documents if d["kind"] == "Deployment")
            errors = lab.wait_until(
                f"the scheduler's verdict on every pod of {namespace}",
                lambda ns=namespace, replicas=replicas: (
                    len(found := scheduling_errors(lab, ns)) == replicas and all(found.values()) and found
                ),
                timeout=120,
            )
            seen[namespace] = sorted(set(errors.values()))
    finally:
        for namespace in namespaces:
            # The demos' containers wait for SIGTERM; nothing of theirs needs a grace period.
            lab.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            lab.core.delete_namespace(namespace)
        for name in device_classes:
            client.CustomObjectsApi(lab.api).delete_cluster_custom_object(*RESOURCE, "deviceclasses", name)
        for other in others:
            lab.core.patch_node(other, {"spec": {"unschedulable": False}})
        lab.wait_until(
            "the demos' namespaces gone",
            lambda: not {n.metadata.name for n in lab.core.list_namespace().items} & set(namespaces),
            timeout=180,
        )
    return seen


def scheduling_errors(lab: Lab, namespace: str) -> dict[str, str]:
    """Per pod of the namespace: the CEL runtime error its PodScheduled condition gives, without the names of the claim
    and the device it failed on ("" while it has none); every pod must be unscheduled."""
    errors = {}
    for pod in lab.core.list_namespaced_pod(namespace).items:
        assert pod.spec.node_name is None, f"{namespace}/{pod.metadata.name} was scheduled"
        messages = [c.message or "" for c in pod.status.conditions or [] if c.type == "PodScheduled"]
        errors[pod.metadata.name] = next(
            (m.split("CEL runtime error: ", 1)[1] for m in messages if "CEL runtime error: " in m), ""
        )
    return errors


def delete_slices(lab: Lab, node: str) -> None:
    """The node's ResourceSlices of gpu.nvidia.com, whichever driver wrote them."""
    for piece in slices_of(lab, node, NVIDIA):
        client.CustomObjectsApi(lab.api).delete_cluster_custom_object(
            *RESOURCE, "resourceslices", piece["metadata"]["name"]
        )


def sysfs_double(spec: Path) -> str:
    """A shell script that makes the TEST DOUBLE of sysfs for the spec's GPUs: each PCI device under its root complex
    (its own domain and bus, as tests/integration/test_dra_compared.py's) with its NUMA node."""
    lines = [f"rm -rf {NVIDIA_SYSFS}", f"mkdir -p {NVIDIA_SYSFS}/bus/pci/devices"]
    for gpu in yaml.safe_load(spec.read_text())["gpus"]:
        bus = gpu["pci_bus_id"].lower()
        root = "pci" + bus[: bus.rindex(":")]
        numa = gpu.get("numa_node")
        lines += [
            f"mkdir -p {NVIDIA_SYSFS}/devices/{root}/{bus}",
            f"echo {-1 if numa is None else numa} > {NVIDIA_SYSFS}/devices/{root}/{bus}/numa_node",
            f"ln -s ../../../devices/{root}/{bus} {NVIDIA_SYSFS}/bus/pci/devices/{bus}",
        ]
    return " && ".join(lines)


class NodeDrivers:
    """Our driver and NVIDIA's, one at a time on the lab node (the first), and the node's simulated GPUs."""

    def __init__(self, lab: Lab, node: str, binary: Path) -> None:
        assert node == lab.nodes[0]
        self.lab, self.node, self.binary = lab, node, binary
        self.spec_path = Path(run_lab("spec-path", node.rsplit("-", 1)[1]).strip())

    def simulate(self, shape: str) -> None:
        """The node's GPUs become the shape's (the lab's `simulate`: the spec, the NVML state, the device nodes and
        MIG's capabilities; the other node keeps h100x8), and the toolkit's CDI specification is written again for
        them by the node's refresh unit, as at a boot of the node."""
        run_lab("simulate", shape)
        # (`simulate` writes the lab's units again.)
        self.lab.node_exec(self.node, "systemctl", "daemon-reload")
        self.lab.node_exec(self.node, "systemctl", "restart", CDI_REFRESH_UNIT)
        written = self.lab.node_exec(self.node, "cat", TOOLKIT_CDI_SPEC).stdout
        # nvidia-ctk names a GPU in MIG mode by its MIG devices only.
        uuids = [
            device["uuid"]
            for gpu in yaml.safe_load(self.spec_path.read_text())["gpus"]
            for device in (gpu.get("mig_devices") if gpu.get("mig_mode") == "enabled" else [gpu])
        ]
        assert all(u in written for u in uuids), f"{TOOLKIT_CDI_SPEC} does not name the devices of {shape}"

    def published(self, shape: str, ours: bool) -> dict[str, Any]:
        """Once the driver has published the shape's devices: its devices and slices."""
        self.lab.wait_until(
            f"{'our' if ours else 'NVIDIA'}'s driver publishing {DEVICES[shape]} devices",
            lambda: (
                len(devices_of(self.lab, self.node, NVIDIA)) == DEVICES[shape]
                and all(
                    (s["metadata"].get("labels") == MANAGED) == ours for s in slices_of(self.lab, self.node, NVIDIA)
                )
            ),
            timeout=120,
        )
        return {"devices": devices_of(self.lab, self.node, NVIDIA), "slices": slices_of(self.lab, self.node, NVIDIA)}

    def start_ours(self) -> None:
        """Our driver's unit started; its plugin directory made first where it is not there (the unit may write only
        there, so systemd refuses to start it without it)."""
        self.lab.node_exec(self.node, "mkdir", "-p", PLUGIN_DIR)
        self.lab.node_exec(self.node, "systemctl", "start", SERVICE)

    def stop_ours(self) -> None:
        """Our driver stopped, its slices deleted."""
        self.lab.node_exec(self.node, "systemctl", "stop", SERVICE)
        delete_slices(self.lab, self.node)

    def start_nvidia(self) -> None:
        """NVIDIA's gpu-kubelet-plugin as a transient unit on the node, with the sysfs double of the node's GPUs."""
        subprocess.run(["podman", "cp", str(self.binary), f"{self.node}:{NVIDIA_BINARY}"], check=True, timeout=60)
        self.lab.node_exec(self.node, "sh", "-c", sysfs_double(self.spec_path))
        self.lab.node_exec(self.node, "sh", "-c", f"printf '%s' '{PROC_DEVICES}' > {NVIDIA_PROC_DEVICES}")
        # NVIDIA's driver will not start without an nvidia-smi under its driver root (it runs it for time-slicing):
        # the module's double, where the driver's packages put it.
        self.lab.node_exec(self.node, "ln", "-sfn", NVIDIA_SMI, NODE_NVIDIA_SMI)
        hook = self.lab.node_exec(self.node, "sh", "-c", "command -v nvidia-cdi-hook").stdout.strip()
        self.lab.node_exec(
            self.node,
            "systemd-run",
            f"--unit={NVIDIA_UNIT}",
            f"--setenv=NVIDIA_DRA_SYSFS_ROOT={NVIDIA_SYSFS}",
            f"--setenv=ALT_PROC_DEVICES_PATH={NVIDIA_PROC_DEVICES}",
            NVIDIA_BINARY,
            f"--node-name={self.node}",
            # The node's own credentials, as our driver's in the lab (NVIDIA's chart gives its plugin a service
            # account of its own).
            "--kubeconfig=/etc/gpuops-lab/kubelet.kubeconfig",
            "--nvidia-driver-root=/",
            "--container-driver-root=/",
            "--host-root=/",
            "--cdi-root=/var/run/cdi",
            f"--nvidia-cdi-hook-path={hook}",
            "--image-name=lab.invalid/none:v0",  # required; used only for MPS control daemons' pods
        )

    def stop_nvidia(self) -> str:
        """NVIDIA's driver stopped, its slices and plugin directory deleted; its last log lines."""
        log = self.lab.node_exec(
            self.node, "journalctl", "-u", NVIDIA_UNIT, "--no-pager", "-n", "40", check=False
        ).stdout
        self.lab.node_exec(self.node, "systemctl", "stop", NVIDIA_UNIT, check=False)
        delete_slices(self.lab, self.node)
        self.lab.node_exec(self.node, "rm", "-rf", PLUGIN_DIR, NODE_NVIDIA_SMI)
        return log


@pytest.fixture(scope="module")
def demos(lab: Lab, flow: NvidiaFlow, renamed: tuple[PlaybookRun, PlaybookRun]) -> Iterator[dict[str, Any]]:
    """Per driver and shape: the driver's devices and slices on the node, and what NVIDIA's demos got from it. Ours runs
    first, as the flow left it (h100x8); then NVIDIA's driver on the same node, ours stopped and its plugin directory
    set aside; then, with the node's GPUs replaced by the MIG shape's, NVIDIA's driver again and ours from an empty
    plugin directory, as on a new node (ours keeps the names it gave GPUs it no longer sees). NVIDIA's driver runs
    under make test-full only (make test compares the two drivers' slices on every shape in
    tests/integration/test_dra_compared.py). Ours, its plugin directory and the node's GPUs are as they were
    afterwards."""
    binary, specs = nvidia_build()
    drivers = NodeDrivers(lab, flow.node, binary)
    seen: dict[str, dict[str, Any]] = {"ours": {}, "nvidia": {}}
    seen["ours"]["h100x8"] = drivers.published("h100x8", ours=True)
    dcgm = f"127.0.0.1:{LabConfig.from_env().dcgm_port(lab.nodes.index(flow.node) + 1)}"
    seen["ours"]["h100x8"]["demos"] = run_demos(lab, flow.node, specs, "h100x8", dcgm)
    drivers.stop_ours()
    lab.node_exec(flow.node, "mv", PLUGIN_DIR, f"{PLUGIN_DIR}.ours")
    logs: list[str] = []
    nvidia_running = False
    steps = [("h100x8", False), ("mig-demos", False), ("mig-demos", True)] if full_suite() else [("mig-demos", True)]
    simulated = "h100x8"
    try:
        for shape, ours in steps:
            if shape != simulated:
                drivers.simulate(shape)
                simulated = shape
            if ours:
                drivers.start_ours()
            else:
                drivers.start_nvidia()
                nvidia_running = True
            seen["ours" if ours else "nvidia"][shape] = drivers.published(shape, ours=ours)
            seen["ours" if ours else "nvidia"][shape]["demos"] = run_demos(
                lab, flow.node, specs, shape, dcgm if ours else ""
            )
            if ours:
                drivers.stop_ours()
                lab.node_exec(flow.node, "rm", "-rf", PLUGIN_DIR)
            else:
                logs.append(drivers.stop_nvidia())
                nvidia_running = False
        yield seen
    finally:
        if nvidia_running:
            logs.append(drivers.stop_nvidia())
        sys.stderr.write("NVIDIA's driver's last log lines, per start:\n" + "\n".join(logs) + "\n")
        drivers.stop_ours()
        drivers.simulate("h100x8")
        lab.node_exec(
            flow.node,
            "sh",
            "-c",
            f"rm -rf {NVIDIA_SYSFS} {NVIDIA_PROC_DEVICES} {NVIDIA_BINARY}"
            f" && if [ -d {PLUGIN_DIR}.ours ]; then rm -rf {PLUGIN_DIR} && mv {PLUGIN_DIR}.ours {PLUGIN_DIR}; fi",
        )
        drivers.start_ours()
        drivers.published("h100x8", ours=True)


def assert_demo_allocations(seen: dict[str, list[Any]], devices: dict[str, dict[str, Any]]) -> None:
    """What NVIDIA's demos ask for. On the node's eight identical GPUs: gpu-test1, two pods, a claim each from the
    template: two different GPUs. gpu-test2: one pod, two containers sharing one GPU. gpu-test3: two pods sharing one
    claim: the same GPU. gpu-full: one GPU through the DeviceClass's extended-resource mapping. On the four A100s:
    gpu-test4, four pods of four containers, each container one MIG device of the profile its request names, all four
    of a pod on one GPU (the claim's matchAttribute on parentUUID), so that each pod has a GPU of its own. On the H100
    NVLs: mig-1g-12gb, one container with one 1g.12gb MIG device through its DeviceClass's extended-resource mapping
    (nvidia.com/mig-1g.12gb). (run_demos checked each container's device nodes.)"""
    if "gpu-test4" in seen:
        # NVIDIA's gpu-test6 asks for whole A100s by `index`: an attribute neither driver publishes, so the scheduler's
        # CEL evaluation fails on the first A100 it tries, and no pod is scheduled.
        (error,) = seen["gpu-test6"]
        assert error.startswith("no such key: index"), error
        pods = seen["gpu-test4"]
        assert len(pods) == 4
        for containers in pods:
            assert [len(c["devices"]) for c in containers] == [1, 1, 1, 1]
            profiles = [devices[c["devices"][0]]["attributes"]["profile"]["string"] for c in containers]
            assert profiles == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
            assert len({gpu for c in containers for gpu in c["gpus"]}) == 1
        assert len({containers[0]["gpus"][0] for containers in pods}) == 4
        ((mig,),) = seen["extended-resource-mig-1g12gb"]
        (device,) = [devices[d]["attributes"] for d in mig["devices"]]
        assert (device["profile"]["string"], device["productName"]["string"]) == ("1g.12gb", "NVIDIA H100 NVL")
        assert len(mig["gpus"]) == 1
        return
    (one,), (two,) = seen["gpu-test1"]
    assert len(one["gpus"]) == len(two["gpus"]) == 1 and one["gpus"] != two["gpus"]
    ((first, second),) = seen["gpu-test2"]
    assert first["devices"] == second["devices"] and len(first["gpus"]) == 1
    (first,), (second,) = seen["gpu-test3"]
    assert first == second and len(first["gpus"]) == 1
    ((full,),) = seen["extended-resource-gpu-full"]
    assert len(full["gpus"]) == 1


def test_nvidia_s_demo_claims_run_unchanged_on_ours_and_each_container_sees_exactly_its_devices(
    demos: dict[str, Any],
) -> None:
    assert len(demos["ours"]["h100x8"]["demos"]) == len(DEMOS["h100x8"])
    assert_demo_allocations(demos["ours"]["h100x8"]["demos"], demos["ours"]["h100x8"]["devices"])


@pytest.mark.parametrize("driver", ["ours", pytest.param("nvidia", marks=pytest.mark.full)])
def test_nvidia_s_mig_demos_run_on_both_drivers_on_the_lab_s_mig_gpus(demos: dict[str, Any], driver: str) -> None:
    """gpu-test4 and mig-1g-12gb on each driver, on the lab's MIG capabilities (docs/lab.md). In gpu-test4 each of a
    pod's four containers names one request of the pod's claim and sees its GPU and the capability nodes of exactly its
    MIG device's GPU and compute instance (run_demos), not those of the claim's other three: on ours, each device is
    handed over as the toolkit's CDI device too and NVIDIA_VISIBLE_DEVICES is void (docs/dra.md, "What a container is
    given"). mig-1g-12gb's pod gets a 1g.12gb of an H100 NVL through the extended resource its DeviceClass maps."""
    seen = demos[driver]["mig-demos"]
    assert len(seen["demos"]) == len(DEMOS["mig-demos"]) + len(UNALLOCATABLE["mig-demos"])
    assert_demo_allocations(seen["demos"], seen["devices"])


@pytest.mark.parametrize("shape", DEMOS)
def test_our_dcgm_metrics_name_each_demo_containers_claim_and_devices(demos: dict[str, Any], shape: str) -> None:
    """dcgm-exporter's DRA labels on ours, under NVIDIA's driver name: each container of NVIDIA's demos is the holder
    of its claim's devices' series (a GPU's, or a MIG device's own with its GPU instance's profile), with its claim's
    namespace, the driver and device names, and for a MIG device dra_mig_profile and dra_mig_device_uuid as its slice
    publishes them (profile, uuid). The kubelet's pod-resources API names every device of a claim for each container
    that references the claim, whichever of its requests the container names (its answer carries no request): in
    gpu-test4 each of a pod's four containers is given one MIG device and is named the holder of all four. In these
    demos a pod's containers share its one claim, so that is the devices of all its containers."""
    seen = demos["ours"][shape]
    checked = 0
    for namespace, pods in seen["demos"].items():
        if all(isinstance(p, str) for p in pods):
            continue  # a demo no pod of which is scheduled
        for containers in pods:
            claimed = sorted({name for container in containers for name in container["devices"]})
            for container in containers:
                expected = []
                for name in claimed:
                    attributes = {
                        k: v["string"] for k, v in seen["devices"][name]["attributes"].items() if "string" in v
                    }
                    if attributes["type"] == "mig":
                        mig = (attributes["profile"], attributes["profile"], attributes["uuid"])
                        expected.append((namespace, NVIDIA, name, attributes["parentUUID"], *mig))
                    else:
                        expected.append((namespace, NVIDIA, name, attributes["uuid"], "", "", ""))
                assert container["dcgm"] == sorted(expected), f"{namespace}: {container}"
                checked += 1
    assert checked >= 4


@pytest.mark.full
@pytest.mark.parametrize("shape", DEMOS)
def test_nvidia_s_driver_on_the_same_node_publishes_our_devices(demos: dict[str, Any], shape: str) -> None:
    """What each driver published on the lab node: the same devices, attributes and capacities, apart from what
    docs/compared-dra.md names (our `health`; NVIDIA's pcieRoot, read from the sysfs double it alone is given)."""
    ours, nvidia = demos["ours"][shape]["devices"], demos["nvidia"][shape]["devices"]
    assert all("labels" not in s["metadata"] for s in demos["nvidia"][shape]["slices"])
    assert sorted(ours) == sorted(nvidia) and len(nvidia) == DEVICES[shape]
    for name, device in nvidia.items():
        attributes = dict(device["attributes"])
        assert attributes.pop("resource.kubernetes.io/pcieRoot")["string"].startswith("pci0000:")
        mine = dict(ours[name]["attributes"])
        assert mine.pop("health") == {"string": "Healthy"}
        assert (name, mine) == (name, attributes)
        assert (name, ours[name]["capacity"]) == (name, device["capacity"])


@pytest.mark.full
@pytest.mark.parametrize("shape", DEMOS)
def test_nvidia_s_demo_claims_get_the_same_allocation_from_nvidia_s_driver_as_from_ours(
    demos: dict[str, Any], shape: str
) -> None:
    """The same allocation up to the names of identical GPUs: NVIDIA's driver lists a slice's devices in no fixed order
    (a Go map), and the scheduler takes the first device that fits, so which GPU a claim gets can differ between two
    starts of NVIDIA's own driver. Per demo, per pod, per container: as many devices and device nodes (a MIG device's
    capability nodes among them), and the same sharing (assert_demo_allocations). A demo neither can serve
    (UNALLOCATABLE): the same error from the scheduler on both."""
    ours, nvidia = demos["ours"][shape], demos["nvidia"][shape]
    assert_demo_allocations(nvidia["demos"], nvidia["devices"])

    def counts(seen: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {
            namespace: (
                pods
                if all(isinstance(p, str) for p in pods)
                else sorted([[len(c["devices"]), len(c["nodes"])] for c in containers] for containers in pods)
            )
            for namespace, pods in seen.items()
        }

    assert counts(nvidia["demos"]) == counts(ours["demos"])
