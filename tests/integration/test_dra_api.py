"""The daemon's DRA API side (gpu_device_plugin.dra.kubeapi and .slices) against a real kube-apiserver.

The peer is real: etcd from Debian and kube-apiserver built from the Kubernetes Go modules by
tests/e2e/build-kubernetes.sh (its default version, cached under $GPUOPS_CACHE), with the Node
authorizer and the NodeRestriction admission plugin, as a cluster runs them. The daemon's client
talks to it with a node's identity (system:node:<name> in system:nodes, from a token file this test
writes), as it does under systemd with the kubelet's credentials. No scheduler, controller-manager or
kubelet runs: the test writes a claim's allocation through the status subresource as the scheduler
would, and there is no garbage collector, so the Node owner reference is checked, not acted on.
The control plane is the `control_plane` fixture's (conftest.py), the v1beta1 server a second API server on it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import dra_claims
import pytest
import yaml
from kubernetes import client, config
from local_api import ApiServerSettings, wait_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "files/device_plugin/src"))

from gpu_device_plugin import simspec  # noqa: E402
from gpu_device_plugin.dra.devices import DEFAULT_DRIVER_NAME, dra_devices  # noqa: E402
from gpu_device_plugin.dra.kubeapi import KubeApi, KubeApiError  # noqa: E402
from gpu_device_plugin.dra.slices import ResourceSlices  # noqa: E402

NODE = "dra-api-node-a"
OTHER = "dra-api-node-b"
ADMIN_TOKEN = "gpuops-dra-api-test-admin"
NODE_TOKEN = "gpuops-dra-api-test-node-a"
DRIVER = DEFAULT_DRIVER_NAME
GROUP = "resource.k8s.io"
FIXTURES = ROOT / "tests/fixtures/simulated"
NAMESPACE = "dra-api-test"


def _kubeconfig(path, port, token, ca=None):
    """A kubeconfig for one identity; `ca`: the apiserver's self-signed certificate, which the client
    then verifies; without one (a server that is down has none to give) TLS is not verified."""
    trust = {"certificate-authority": str(ca)} if ca else {"insecure-skip-tls-verify": True}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "t", "cluster": {"server": f"https://127.0.0.1:{port}", **trust}}],
                "users": [{"name": "t", "user": {"token": token}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
                "current-context": "t",
            }
        )
    )
    return str(path)


# The control_plane fixture's API server (conftest.py): the Node and RBAC authorizers with NodeRestriction (the
# lab's), an administrator and node NODE with bearer tokens.
API_SERVER = ApiServerSettings(
    tokens=(
        (ADMIN_TOKEN, "gpuops-admin", "system:masters"),
        (NODE_TOKEN, f"system:node:{NODE}", "system:nodes"),
    )
)
# A second API server on the same etcd, as on Kubernetes 1.34 and 1.35: resource.k8s.io/v1 off, v1beta1 on,
# device taints off. The 1.37 Node authorizer watches v1 ResourceSlices, so it runs RBAC alone.
BETA_API_SERVER = ApiServerSettings(
    authorization_modes=("RBAC",),
    admission_plugins=(),
    feature_gates={"DRADeviceTaints": False, "DRADeviceTaintRules": False},
    extra_flags=("--runtime-config=resource.k8s.io/v1=false,resource.k8s.io/v1beta1=true",),
    tokens=API_SERVER.tokens,
)


def admin_client(plane, filename="apiserver-admin.conf", server=None):
    """An administrator's client of ``server`` (the plane's first API server by default), its kubeconfig at
    ``filename`` in the plane's directory, after creating the Node objects NODE and OTHER there."""
    kubeconfig = plane.kubeconfig(plane.work / filename, token=ADMIN_TOKEN, server=server)
    admin = config.new_client_from_config(str(kubeconfig))
    core = client.CoreV1Api(admin)
    for node in (NODE, OTHER):
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    return admin


@pytest.fixture(scope="module")
def cluster(control_plane):
    admin = admin_client(control_plane)
    return {
        "admin": admin,
        "custom": client.CustomObjectsApi(admin),
        "core": client.CoreV1Api(admin),
        "admin_kubeconfig": str(control_plane.work / "apiserver-admin.conf"),
        "node_kubeconfig": str(control_plane.kubeconfig(control_plane.work / "node-a.conf", token=NODE_TOKEN)),
    }


def _inventory(name):
    return simspec.load(str(FIXTURES / name))


def _slices(cluster, node=NODE):
    found = cluster["custom"].list_cluster_custom_object(
        GROUP, "v1", "resourceslices", field_selector=f"spec.nodeName={node}"
    )
    return found["items"]


@pytest.fixture
def publisher(cluster):
    """The daemon's publisher for NODE, with NODE's own credentials, on an empty pool."""
    api = KubeApi(cluster["node_kubeconfig"])
    slices = ResourceSlices(api, NODE, DRIVER)
    slices.delete_all()
    yield slices
    slices.delete_all()
    api.close()


def _expected_attributes(spec, gpu_index, driver_version, cuda_version):
    """What the slice must say, derived from the simulated spec's YAML itself: NVIDIA's attributes, and health."""
    gpu = spec["gpus"][gpu_index]
    attributes = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu["uuid"]},
        "productName": {"string": gpu["name"]},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "resource.kubernetes.io/pciBusID": {"string": gpu["pci_bus_id"]},
        "health": {"string": "Healthy"},
        "cudaComputeCapability": {"version": gpu["compute_capability"] + ".0"},
        "driverVersion": {"version": driver_version},
        "cudaDriverVersion": {"version": cuda_version},
        "resource.kubernetes.io/numaNode": {"int": gpu["numa_node"]},
    }
    return attributes


def test_the_probe_finds_v1(cluster):
    api = KubeApi(cluster["node_kubeconfig"])
    assert api.probe() == "v1"
    assert api.version == "v1"


def test_eight_h100s_are_published_field_by_field_and_a_second_publish_writes_nothing(cluster, publisher):
    inventory = _inventory("h100x8.yaml")
    spec = yaml.safe_load((FIXTURES / "h100x8.yaml").read_text())
    node_uid = cluster["core"].read_node(NODE).metadata.uid

    assert publisher.publish(dra_devices(inventory), frozenset(), inventory) is True
    (published,) = _slices(cluster)
    assert published["metadata"]["name"].startswith(f"{NODE}-{DRIVER}-")
    assert published["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    ]
    assert published["spec"]["driver"] == DRIVER
    assert published["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuops.k8s"}
    assert published["spec"]["nodeName"] == NODE
    assert published["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    devices = published["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    for index, device in enumerate(devices):
        assert device["attributes"] == _expected_attributes(spec, index, "580.95.5", "13.0.0"), device["name"]
        assert device["capacity"] == {"memory": {"value": "81559Mi"}}
        assert "taints" not in device

    version = published["metadata"]["resourceVersion"]
    writes = publisher.writes
    assert publisher.publish(dra_devices(inventory), frozenset(), inventory) is False
    assert publisher.reconcile() is False
    assert publisher.writes == writes
    (again,) = _slices(cluster)
    assert again["metadata"]["resourceVersion"] == version, "an unchanged pool is not written"


def test_an_unhealthy_gpu_bumps_the_generation_and_is_tainted_until_it_recovers(cluster, publisher):
    inventory = _inventory("h100x8.yaml")
    devices = dra_devices(inventory)
    publisher.publish(devices, frozenset(), inventory)

    assert publisher.publish(devices, frozenset({"gpu-3"}), inventory) is True
    (published,) = _slices(cluster)
    assert published["spec"]["pool"]["generation"] == 2
    by_name = {d["name"]: d for d in published["spec"]["devices"]}
    assert by_name["gpu-3"]["attributes"]["health"] == {"string": "Unhealthy"}
    (taint,) = by_name["gpu-3"]["taints"]
    assert {k: taint[k] for k in ("key", "value", "effect")} == {
        "key": f"{DRIVER}/unhealthy",
        "value": "Unhealthy",
        "effect": "NoSchedule",
    }
    assert taint["timeAdded"], "the server stamps the taint"
    assert all("taints" not in d for n, d in by_name.items() if n != "gpu-3")
    assert publisher.taints is True, "this server keeps device taints"

    version = published["metadata"]["resourceVersion"]
    assert publisher.publish(devices, frozenset({"gpu-3"}), inventory) is False
    assert _slices(cluster)[0]["metadata"]["resourceVersion"] == version

    assert publisher.publish(devices, frozenset(), inventory) is True
    (recovered,) = _slices(cluster)
    assert recovered["spec"]["pool"]["generation"] == 3
    assert all("taints" not in d for d in recovered["spec"]["devices"])
    assert all(d["attributes"]["health"] == {"string": "Healthy"} for d in recovered["spec"]["devices"])


def test_a_deleted_slice_is_recreated_by_reconcile(cluster, publisher):
    inventory = _inventory("h100x8.yaml")
    publisher.publish(dra_devices(inventory), frozenset(), inventory)
    (published,) = _slices(cluster)
    # What the kubelet does when it starts: delete every slice of its node.
    for item in _slices(cluster):
        cluster["custom"].delete_cluster_custom_object(GROUP, "v1", "resourceslices", item["metadata"]["name"])
    assert _slices(cluster) == []
    assert publisher.reconcile() is True
    (recreated,) = _slices(cluster)
    assert recreated["metadata"]["name"] != published["metadata"]["name"]
    assert recreated["spec"]["devices"] == published["spec"]["devices"]
    assert recreated["spec"]["pool"]["generation"] > published["spec"]["pool"]["generation"]
    assert recreated["metadata"]["ownerReferences"] == published["metadata"]["ownerReferences"]
    assert publisher.reconcile() is False


def test_mig_devices_are_published_with_their_profile_and_parent(cluster, publisher):
    inventory = _inventory("a100-mig.yaml")
    assert publisher.publish(dra_devices(inventory), frozenset(), inventory) is True
    (published,) = _slices(cluster)
    by_name = {d["name"]: d for d in published["spec"]["devices"]}
    assert sorted(by_name) == ["gpu-0-mig-1g5gb-19-4", "gpu-0-mig-1g5gb-19-5", "gpu-0-mig-3g20gb-9-0", "gpu-1"]
    parent = "GPU-0a5e1c00-0000-4000-8000-00000000a100"
    one_slice = {"multiprocessors": "14", "copyEngines": "1", "decoders": "0", "encoders": "0"}
    expected = {
        "gpu-0-mig-3g20gb-9-0": ("3g.20gb", "MIG-0a5e1c00-0000-4000-8000-0000000000a1", "19968Mi", range(0, 4)),
        "gpu-0-mig-1g5gb-19-4": ("1g.5gb", "MIG-0a5e1c00-0000-4000-8000-0000000000a2", "4864Mi", range(4, 5)),
        "gpu-0-mig-1g5gb-19-5": ("1g.5gb", "MIG-0a5e1c00-0000-4000-8000-0000000000a3", "4864Mi", range(5, 6)),
    }
    for name, (profile, uuid, memory, memory_slices) in expected.items():
        attributes = by_name[name]["attributes"]
        assert attributes["type"] == {"string": "mig"}
        assert attributes["profile"] == {"string": profile}
        assert attributes["parentUUID"] == {"string": parent}
        assert attributes["uuid"] == {"string": uuid}
        assert attributes["productName"] == {"string": "NVIDIA A100-SXM4-40GB"}
        assert attributes["architecture"] == {"string": "Ampere"}
        assert attributes["cudaComputeCapability"] == {"version": "8.0.0"}
        assert attributes["driverVersion"] == {"version": "535.247.1"}
        assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}
        capacity = by_name[name]["capacity"]
        assert capacity["memory"] == {"value": memory}
        assert {f"memorySlice{i}" for i in memory_slices} == {k for k in capacity if k.startswith("memorySlice")}
        if profile == "1g.5gb":
            assert {k: capacity[k]["value"] for k in one_slice} == one_slice
    whole = by_name["gpu-1"]
    assert whole["attributes"]["type"] == {"string": "gpu"}
    assert "profile" not in whole["attributes"] and "resource.kubernetes.io/numaNode" not in whole["attributes"]
    assert whole["capacity"] == {"memory": {"value": "40Gi"}}


def _allocated_claim(cluster, name, devices):
    dra_claims.device_class(cluster["custom"], f"{name}-class", DRIVER)
    memory = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
    return dra_claims.allocated_claim(
        cluster["custom"], (NAMESPACE, name), f"{name}-class", (DRIVER, NODE), devices, selectors=(memory,)
    )


@pytest.fixture(scope="module")
def namespace(cluster):
    core = cluster["core"]
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    # No controller-manager runs to create it; pods need it.
    core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
    return NAMESPACE


def test_an_allocated_claim_is_read_back_and_an_absent_one_is_none(cluster, namespace):
    allocated = _allocated_claim(cluster, "two-gpus", ["gpu-0", "gpu-1"])
    api = KubeApi(cluster["admin_kubeconfig"])
    claim = api.get_resource_claim(NAMESPACE, "two-gpus")
    assert claim["apiVersion"] == f"{GROUP}/v1"
    assert claim["metadata"]["uid"] == allocated["metadata"]["uid"]
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    assert claim["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
        {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": "gpu-1"},
    ]
    assert api.get_resource_claim(NAMESPACE, "no-such-claim") is None


def test_the_node_reads_only_the_claims_of_its_own_pods(cluster, namespace):
    _allocated_claim(cluster, "node-claim", ["gpu-2"])
    node_api = KubeApi(cluster["node_kubeconfig"])
    with pytest.raises(KubeApiError) as refused:
        node_api.get_resource_claim(NAMESPACE, "node-claim")
    assert refused.value.status == 403
    assert str(refused.value).startswith(
        f"cannot get ResourceClaim {NAMESPACE}/node-claim: the API server answered 403 Forbidden: "
        f'resourceclaims.resource.k8s.io "node-claim" is forbidden: User "system:node:{NODE}" cannot get resource'
    )
    with pytest.raises(KubeApiError) as absent:
        node_api.get_resource_claim(NAMESPACE, "no-such-claim")
    assert absent.value.status == 403, "to a node, a claim that does not exist is one it may not read"
    # A pod bound to the node that uses the claim: the Node authorizer now lets the node read it.
    dra_claims.claim_pod(cluster["core"], (NAMESPACE, "node-claim"), "user", NODE)

    def readable():
        try:
            return node_api.get_resource_claim(NAMESPACE, "node-claim") is not None
        except KubeApiError:
            return False

    wait_for("the Node authorizer to learn of the pod", readable, 30)
    assert node_api.get_resource_claim(NAMESPACE, "node-claim")["status"]["allocation"]["devices"]["results"][0][
        "device"
    ] == ("gpu-2")


def test_a_server_that_is_down_is_an_oserror_naming_the_object_and_the_server(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = KubeApi(_kubeconfig(tmp_path / "down.conf", port, NODE_TOKEN), timeout=5)
    with pytest.raises(OSError) as error:
        api.get_resource_claim(NAMESPACE, "c")
    assert str(error.value).startswith(
        f"cannot discover {GROUP}/v1: the API server at https://127.0.0.1:{port} cannot be reached ("
    )
    assert "\n" not in str(error.value)


def test_a_node_manages_its_own_slices_and_no_other_nodes(cluster, publisher):
    inventory = _inventory("h100x8.yaml")
    node_api = publisher.api
    # Create, update, delete: its own.
    assert publisher.publish(dra_devices(inventory), frozenset(), inventory) is True
    assert publisher.publish(dra_devices(inventory), frozenset({"gpu-0"}), inventory) is True
    publisher.delete_all()
    assert _slices(cluster) == []

    # Another node's pool: not created, and one that exists is neither listed, changed nor deleted.
    trespasser = ResourceSlices(node_api, OTHER, DRIVER)
    with pytest.raises(KubeApiError) as create:
        trespasser.publish(dra_devices(inventory), frozenset(), inventory)
    assert create.value.status == 403
    assert str(create.value).startswith(f"cannot get Node {OTHER}: the API server answered 403 Forbidden: ")
    with pytest.raises(KubeApiError) as listing:
        node_api.list_resource_slices(OTHER, DRIVER)
    assert str(listing.value).startswith(
        f"cannot list the ResourceSlices of node {OTHER}: the API server answered 403 Forbidden: "
    )
    body = {
        "metadata": {"generateName": f"{OTHER}-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": OTHER,
            "pool": {"name": OTHER, "generation": 1, "resourceSliceCount": 1},
        },
    }
    with pytest.raises(KubeApiError) as create:
        node_api.create_resource_slice(body)
    assert str(create.value) == (
        f"cannot create a ResourceSlice for node {OTHER}: the API server answered 403 Forbidden: "
        f'resourceslices.resource.k8s.io "{OTHER}-" is forbidden: can only create ResourceSlice with the same '
        "NodeName as the requesting node."
    )

    admin_slices = ResourceSlices(KubeApi(cluster["admin_kubeconfig"]), OTHER, DRIVER)
    admin_slices.publish(dra_devices(inventory), frozenset(), inventory)
    (theirs,) = _slices(cluster, OTHER)
    with pytest.raises(KubeApiError) as update:
        node_api.update_resource_slice(theirs)
    assert update.value.status == 403
    assert str(update.value).startswith(
        f"cannot update ResourceSlice {theirs['metadata']['name']}: the API server answered 403 Forbidden: "
    )
    with pytest.raises(KubeApiError) as delete:
        node_api.delete_resource_slice(theirs["metadata"]["name"])
    assert delete.value.status == 403
    assert len(_slices(cluster, OTHER)) == 1
    admin_slices.delete_all()


def test_a_server_serving_only_v1beta1_without_device_taints_gets_the_same_pool(control_plane, cluster):
    """The same publisher and claim reader against a server where resource.k8s.io/v1 is switched off
    and v1beta1 (the shape with `basic` and requests without `exactly`) is on, and device taints are
    off, as on Kubernetes 1.34 and 1.35: the unhealthy GPU is left out of the pool instead. (The
    1.37 Node authorizer watches v1 ResourceSlices, so this server runs RBAC alone and the client is
    an administrator.)"""
    server = control_plane.second_apiserver("beta-apiserver", BETA_API_SERVER)
    admin = admin_client(control_plane, "beta-apiserver-admin.conf", server)
    custom = client.CustomObjectsApi(admin)
    node_api = KubeApi(str(control_plane.work / "beta-apiserver-admin.conf"))
    assert node_api.probe() == "v1beta1"
    inventory = _inventory("h100x8.yaml")
    slices = ResourceSlices(node_api, NODE, DRIVER)
    assert slices.publish(dra_devices(inventory), frozenset({"gpu-5"}), inventory) is True
    assert slices.taints is False
    (stored,) = custom.list_cluster_custom_object(
        GROUP, "v1beta1", "resourceslices", field_selector=f"spec.nodeName={NODE}"
    )["items"]
    assert stored["spec"]["pool"]["name"] == NODE and stored["spec"]["pool"]["resourceSliceCount"] == 1
    assert [d["name"] for d in stored["spec"]["devices"]] == [f"gpu-{i}" for i in range(8) if i != 5]
    first = stored["spec"]["devices"][0]
    assert set(first) == {"name", "basic"}
    assert first["basic"]["capacity"] == {"memory": {"value": "81559Mi"}}
    assert first["basic"]["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert slices.publish(dra_devices(inventory), frozenset({"gpu-5"}), inventory) is False
    assert slices.publish(dra_devices(inventory), frozenset(), inventory) is True
    (recovered,) = custom.list_cluster_custom_object(
        GROUP, "v1beta1", "resourceslices", field_selector=f"spec.nodeName={NODE}"
    )["items"]
    assert len(recovered["spec"]["devices"]) == 8
    assert recovered["spec"]["pool"]["generation"] > stored["spec"]["pool"]["generation"]

    custom.create_namespaced_custom_object(
        GROUP,
        "v1beta1",
        "default",
        "resourceclaims",
        {"metadata": {"name": "beta"}, "spec": {"devices": {"requests": [{"name": "r", "deviceClassName": "c"}]}}},
    )
    claim = KubeApi(str(control_plane.work / "beta-apiserver-admin.conf")).get_resource_claim("default", "beta")
    assert claim["apiVersion"] == f"{GROUP}/v1"
    assert claim["spec"]["devices"]["requests"] == [
        {"name": "r", "exactly": {"deviceClassName": "c", "allocationMode": "ExactCount", "count": 1}}
    ]


def _device_health(cluster, node=NODE):
    """{device name: health attribute} over NODE's slices, or None while there are none."""
    found = _slices(cluster, node)
    if not found:
        return None
    devices = [d for s in found for d in s["spec"].get("devices", [])]
    return {d["name"]: d["attributes"]["health"]["string"] for d in devices}


def test_the_daemon_in_dra_mode_publishes_keeps_and_marks_its_node_slice(cluster, tmp_path):
    """The daemon as the systemd service runs it (dra mode, the node's own credentials, a simulated
    8 x H100): its slice appears, comes back after someone deletes it, and follows an XID."""
    spec = tmp_path / "gpus.yaml"
    text = (FIXTURES / "h100x8.yaml").read_text()
    spec.write_text(text)
    for directory in ("registry", "plugins", "cdi", "device-plugins"):
        (tmp_path / directory).mkdir()
    api = KubeApi(cluster["node_kubeconfig"])
    ResourceSlices(api, NODE, DRIVER).delete_all()
    api.close()
    log = open(tmp_path / "daemon.log", "w")  # noqa: SIM115 - kept open for the process's lifetime
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_device_plugin",
            "--allocation-mode",
            "dra",
            "--node-name",
            NODE,
            "--kubeconfig",
            cluster["node_kubeconfig"],
            "--backend",
            "simulated",
            "--simulated-spec",
            str(spec),
            "--plugin-registry-dir",
            str(tmp_path / "registry"),
            "--kubelet-plugins-dir",
            str(tmp_path / "plugins"),
            "--cdi-dir",
            str(tmp_path / "cdi"),
            "--kubelet-socket",
            str(tmp_path / "device-plugins" / "kubelet.sock"),
            "--metrics-address",
            "",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # A health file of its own: the daemon carries the faults of the one it finds over a restart.
        env={
            "PYTHONPATH": str(ROOT / "files/device_plugin/src"),
            "PATH": "/usr/bin:/bin",
            "GPU_DEVICE_PLUGIN_HEALTH_FILE": str(tmp_path / "gpu-health.json"),
        },
    )
    all_healthy = {f"gpu-{i}": "Healthy" for i in range(8)}
    try:
        wait_for("the daemon's slice", lambda: _device_health(cluster) == all_healthy, timeout=60)
        # The daemon publishes its slice first and opens its sockets a moment later.
        sockets = (tmp_path / "registry" / f"{DRIVER}-reg.sock", tmp_path / "plugins" / DRIVER / "dra.sock")
        wait_for("the daemon's sockets", lambda: all(path.is_socket() for path in sockets), timeout=30)
        assert not list((tmp_path / "device-plugins").iterdir()), "dra mode registered a device-plugin socket"
        # Someone deletes the slice (the kubelet does when it starts): the daemon writes it again.
        for found in _slices(cluster):
            cluster["custom"].delete_cluster_custom_object(GROUP, "v1", "resourceslices", found["metadata"]["name"])
        wait_for("the slice to be written again", lambda: _device_health(cluster) == all_healthy, timeout=60)
        # An XID on the second GPU: its device is marked in the slice.
        spec.write_text(text.replace("pci_bus_id: '0000:2a:00.0'", "pci_bus_id: '0000:2a:00.0'\n  xid: 79", 1))
        marked = dict(all_healthy, **{"gpu-1": "Unhealthy"})
        wait_for("the XID in the slice", lambda: _device_health(cluster) == marked, timeout=60)
        assert daemon.poll() is None, "the daemon exited"
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()
    assert daemon.returncode == 0, (tmp_path / "daemon.log").read_text()


# -- the Node condition GPUHealthy (gpu_device_plugin.faults through KubeApi.set_node_condition) -------------------
def _conditions(cluster, node=NODE):
    return {c.type: c for c in cluster["core"].read_node_status(node).status.conditions or []}


def test_the_node_sets_its_own_gpu_condition_and_leaves_the_kubelets(cluster):
    # The kubelet's condition, as an administrator writes it here (no kubelet runs).
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": "2026-11-26T08:00:00Z",
        "lastTransitionTime": "2026-11-26T08:00:00Z",
    }
    cluster["core"].patch_node_status(NODE, [{"op": "add", "path": "/status/conditions", "value": [ready]}])
    api = KubeApi(cluster["node_kubeconfig"])
    try:
        healthy = {
            "type": "GPUHealthy",
            "status": "True",
            "reason": "GPUsHealthy",
            "message": "All 8 GPUs are healthy.",
        }
        assert api.set_node_condition(NODE, healthy) is True
        first = _conditions(cluster)
        assert set(first) == {"Ready", "GPUHealthy"}
        assert (first["GPUHealthy"].status, first["GPUHealthy"].reason, first["GPUHealthy"].message) == (
            "True",
            "GPUsHealthy",
            "All 8 GPUs are healthy.",
        )
        assert first["GPUHealthy"].last_heartbeat_time and first["GPUHealthy"].last_transition_time
        assert api.set_node_condition(NODE, healthy) is False, "an unchanged condition is not written"

        sick = {
            "type": "GPUHealthy",
            "status": "False",
            "reason": "XID79",
            "message": "GPU 1 (GPU-6f1c0a3e-0000-4000-8000-000000000002): class reboot, XID 79",
        }
        assert api.set_node_condition(NODE, sick) is True
        assert api.set_node_condition(NODE, dict(sick, message=sick["message"] + "; GPU 2 too")) is True
        now = _conditions(cluster)
        assert (now["GPUHealthy"].status, now["GPUHealthy"].reason) == ("False", "XID79")
        assert now["GPUHealthy"].message.endswith("; GPU 2 too")
        # The kubelet's condition is as it was, and there is one GPUHealthy.
        assert now["Ready"].to_dict() == first["Ready"].to_dict()
        statuses = cluster["core"].read_node_status(NODE).status.conditions
        assert [c.type for c in statuses].count("GPUHealthy") == 1
    finally:
        api.close()


def test_two_writers_never_append_the_condition_twice(cluster):
    # A Node of its own, with the kubelet's condition and no GPUHealthy yet.
    name = "dra-api-node-c"
    cluster["core"].create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": "2026-11-26T08:00:00Z",
        "lastTransitionTime": "2026-11-26T08:00:00Z",
    }
    cluster["core"].patch_node_status(name, [{"op": "add", "path": "/status/conditions", "value": [ready]}])
    first, second = KubeApi(cluster["admin_kubeconfig"]), KubeApi(cluster["admin_kubeconfig"])
    try:
        # The second writer reads the Node, then the first writes the condition, then the second writes
        # from what it read (a daemon restarted while the old one's write was in flight).
        stale = [second.get_node(name)]
        fresh = second.get_node
        second.get_node = lambda node_name: stale.pop() if stale else fresh(node_name)  # type: ignore[method-assign]
        healthy = {
            "type": "GPUHealthy",
            "status": "True",
            "reason": "GPUsHealthy",
            "message": "All 8 GPUs are healthy.",
        }
        sick = {"type": "GPUHealthy", "status": "False", "reason": "XID79", "message": "GPU 1: class reboot, XID 79"}
        assert first.set_node_condition(name, healthy) is True
        assert second.set_node_condition(name, sick) is True
        assert stale == [], "the second writer acted on the Node it read before the first wrote"
    finally:
        first.close()
        second.close()
    statuses = cluster["core"].read_node_status(name).status.conditions
    assert [c.type for c in statuses] == ["Ready", "GPUHealthy"]
    assert (statuses[1].status, statuses[1].reason) == ("False", "XID79")


def test_a_node_may_not_set_another_nodes_condition(cluster):
    api = KubeApi(cluster["node_kubeconfig"])
    try:
        with pytest.raises(KubeApiError) as refused:
            api.set_node_condition(
                OTHER, {"type": "GPUHealthy", "status": "True", "reason": "GPUsHealthy", "message": "x"}
            )
    finally:
        api.close()
    assert refused.value.status == 403
    message = str(refused.value)
    # Refused at the read (a node may read only its own Node) or at the patch.
    assert message.startswith(("cannot get Node", "cannot set the condition")) and f"Node {OTHER}: " in message
    assert "the API server answered 403 Forbidden" in message and "\n" not in message
    assert "GPUHealthy" not in _conditions(cluster, OTHER)
