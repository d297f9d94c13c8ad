"""site.yml with the device plugin in daemonset mode, against the lab's real kube-apiserver,
kube-controller-manager (the DaemonSet controller), kube-scheduler, kubelet and containerd.

The plugin image is built here and imported into the node's containerd by the role (no registry); the
DaemonSet's pod serves 8 simulated GPUs (tests/fixtures/simulated/h100x8.yaml) and registers with the
node's kubelet. The pod reads them through NVML: the node's mock libnvidia-ml.so.1 (docs/mock-nvml.md,
with the spec the only stand-ins), found under the node's root mounted read-only at /driver-root. Then a
node switches to systemd mode and back: the role removes the other mode's deployment each time, and only
one plugin serves the node.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from conftest import (
    PAUSE_IMAGE,
    Lab,
    container_nvidia_devices,
    gpu_device_nodes,
    nvlink_peers,
    run_lab,
    running_pod,
    write_in_place,
)
from daemonset_checks import dcgm_holders, node_pod, pod_ready, ready_pod, run_with, stopped_pod, validate_row
from daemonset_node import DAEMONSET, GPU, MODE_LABEL, NAMESPACE, POD_SELECTOR, SPEC, DaemonsetNode, daemonset_node
from kubernetes import client

SERVICE = "gpuops-device-plugin"


@pytest.fixture(scope="module")
def ds(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> DaemonsetNode:
    return daemonset_node(lab, tmp_path_factory.mktemp("site-daemonset"))


def plugin_pods(lab: Lab, node: str) -> list[client.V1Pod]:
    return lab.core.list_namespaced_pod(
        NAMESPACE, label_selector=POD_SELECTOR, field_selector=f"spec.nodeName={node}"
    ).items


def running_plugin_pod(lab: Lab, node: str) -> client.V1Pod:
    def running() -> client.V1Pod | None:
        pods = [p for p in plugin_pods(lab, node) if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return pods[0] if len(pods) == 1 else None

    return lab.wait_until(f"the plugin pod Running on {node}", running, timeout=180)


def registrations(lab: Lab, pod: client.V1Pod) -> int:
    """How often the pod's plugin registered with the kubelet (its structured log, through the API)."""
    log = lab.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
    return sum(1 for line in log.splitlines() if '"msg": "registered with the kubelet"' in line)


def service_state(lab: Lab, node: str) -> str:
    return lab.node_exec(node, "systemctl", "is-active", SERVICE, check=False).stdout.strip()


def test_site_runs_in_daemonset_mode(ds: DaemonsetNode) -> None:
    assert ds.first.returncode == 0, ds.first.summary()
    assert ds.first.recap[ds.node]["failed"] == 0
    assert ds.first.recap[ds.node]["changed"] > 0
    # A lab node has no NVIDIA PCI device: the driver stage is skipped by detection, and says so.
    assert f"No NVIDIA PCI device found on {ds.node}; the driver is not installed" in ds.first.output


def test_image_imported_into_the_node_and_pod_runs_it(lab: Lab, ds: DaemonsetNode) -> None:
    images = lab.node_exec(ds.node, "ctr", "-n", "k8s.io", "images", "ls", "-q").stdout.split()
    assert ds.image in images
    # The copied archive does not stay on the node.
    assert lab.node_exec(ds.node, "test", "-e", "/var/tmp/gpuops-device-plugin-image.tar", check=False).returncode
    pod = running_plugin_pod(lab, ds.node)
    assert pod.spec.containers[0].image == ds.image
    assert pod.metadata.owner_references[0].kind == "DaemonSet"
    security = pod.spec.containers[0].security_context
    assert security.capabilities.drop == ["ALL"] and security.read_only_root_filesystem is True
    assert security.allow_privilege_escalation is False
    # The node is in the DaemonSet by its label; no systemd deployment runs beside the pod.
    assert lab.node(ds.node).metadata.labels[MODE_LABEL] == "daemonset"
    assert service_state(lab, ds.node) != "active"


def test_node_advertises_eight_gpus(lab: Lab, ds: DaemonsetNode) -> None:
    node = lab.wait_until(
        f"{ds.node} allocatable {GPU}=8", lambda: (n := lab.node(ds.node)).status.allocatable.get(GPU) == "8" and n
    )
    assert node.status.capacity[GPU] == "8"
    pod = running_plugin_pod(lab, ds.node)
    assert registrations(lab, pod) >= 1


def test_the_plugin_pod_is_ready_by_a_probe_of_its_health_endpoint(lab: Lab, ds: DaemonsetNode) -> None:
    pod = ready_pod(lab, ds.node, DAEMONSET)
    (container,) = pod.spec.containers
    probe = container.readiness_probe
    # The pod has a network namespace of its own, which the kubelet cannot reach in the lab (its pod network
    # has no gateway on the host): the daemon keeps the node's address, in the pod, and the probe asks
    # /readyz there from inside the pod.
    address = container.args[container.args.index("--metrics-address") + 1]
    assert probe is not None and probe.var_exec.command[-1] == f"http://{address}/readyz"
    assert address.startswith("127.0.0.1:")


def test_validate_is_green_on_the_node_and_red_while_its_pod_is_not_ready(lab: Lab, ds: DaemonsetNode) -> None:
    green = run_with(ds, "validate.yml")
    assert green.returncode == 0, green.summary()
    assert " ready " in validate_row(green, ds.node) + " ", validate_row(green, ds.node)
    with stopped_pod(lab, ds.node, DAEMONSET):
        lab.wait_until(
            "the kubelet's probe to mark the stopped plugin's pod not ready",
            lambda: not pod_ready(node_pod(lab, ds.node, DAEMONSET)),
            timeout=90,
        )
        red = run_with(ds, "validate.yml")
    assert red.returncode != 0, red.summary()
    assert f"{ds.node}: red: plugin" in " ".join(red.output.split()), red.summary()
    assert "not-ready" in validate_row(red, ds.node)
    ready_pod(lab, ds.node, DAEMONSET)


def gpu_pod(name: str, node: str, count: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "dnsPolicy": "Default",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "gpu",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {GPU: str(count)}},
                }
            ],
        },
    }


def test_pod_with_two_gpus_gets_nvlink_peers(lab: Lab, ds: DaemonsetNode) -> None:
    lab.wait_until(f"{GPU}=8", lambda: lab.allocatable(ds.node).get(GPU) == "8")
    name = f"gpu-pair-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", gpu_pod(name, ds.node, 2))
    try:
        pod = lab.wait_until(
            f"pod {name} Running",
            lambda: (p := lab.core.read_namespaced_pod(name, "default")).status.phase == "Running" and p,
        )
        devices = lab.checkpoint_devices(ds.node, pod.metadata.uid)
        assert len(devices) == 2, devices
        assert devices[1] in nvlink_peers(SPEC)[devices[0]], devices
        # The pod's daemon found the node's device nodes under /driver-root/dev and passed their host paths:
        # the container has those of exactly its two GPUs.
        container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
        assert container_nvidia_devices(lab, ds.node, container_id) == gpu_device_nodes(SPEC, devices)
        # The daemon's pod reads the kubelet's pod-resources socket (mounted read-only): its dcgm metrics give the
        # two GPUs this pod's labels within a reading (every 2 s in the lab), and no other GPU any.
        daemon = running_plugin_pod(lab, ds.node)
        holder = {"pod": name, "namespace": "default", "container": "gpu"}
        gpus = [gpu["uuid"] for gpu in yaml.safe_load(SPEC.read_text())["gpus"]]
        wanted = {gpu: ([holder] if gpu in devices else [{}]) for gpu in gpus}
        lab.wait_until(f"{name} in the dcgm metrics", lambda: dcgm_holders(lab, ds.node, daemon) == wanted, timeout=20)
    finally:
        lab.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        lab.wait_until(
            f"pod {name} gone",
            lambda: not any(p.metadata.name == name for p in lab.core.list_namespaced_pod("default").items),
        )


CONFIG_MAP = "gpuops-device-plugin-config"  # the role's, with the daemon's config.yaml


def replaced_plugin_pod(lab: Lab, node: str, gpus: str) -> client.V1Pod:
    """The node's plugin pod deleted; its replacement (which reads the ConfigMap as it is now) serving `gpus`."""
    old = running_plugin_pod(lab, node)
    lab.core.delete_namespaced_pod(old.metadata.name, NAMESPACE, grace_period_seconds=0)
    lab.wait_until(
        f"a new plugin pod on {node}",
        lambda: (p := node_pod(lab, node, DAEMONSET)) is not None and p.metadata.uid != old.metadata.uid,
        timeout=120,
    )
    lab.wait_until(f"{GPU}={gpus}", lambda: lab.allocatable(node).get(GPU) == gpus, timeout=120)
    return ready_pod(lab, node, DAEMONSET)


def test_each_holder_of_a_time_sliced_gpus_replicas_has_a_series_in_the_plugin_pods_dcgm_metrics(
    lab: Lab, ds: DaemonsetNode
) -> None:
    """Time-slicing under the DaemonSet deployment: two replicas per GPU in the role's ConfigMap, served by a new pod
    of the DaemonSet. One pod takes 9 of the 16 replicas, another the other 7, so at least one GPU is shared: the
    plugin pod's dcgm metrics give each GPU one series per pod the kubelet gave its replicas to. The ConfigMap is put
    back as it was and a new pod serves the 8 GPUs again."""
    node = ds.node
    original = lab.core.read_namespaced_config_map(CONFIG_MAP, NAMESPACE).data["config.yaml"]
    config = yaml.safe_load(original)
    config["sharing"] = {"timeSlicing": {"resources": [{"name": GPU, "replicas": 2}]}}
    names = {"a": f"ds-sliced-a-{uuid.uuid4().hex[:6]}", "b": f"ds-sliced-b-{uuid.uuid4().hex[:6]}"}
    lab.core.patch_namespaced_config_map(CONFIG_MAP, NAMESPACE, {"data": {"config.yaml": yaml.safe_dump(config)}})
    try:
        daemon = replaced_plugin_pod(lab, node, "16")
        given: dict[str, list[dict[str, str]]] = {}
        for key, count in (("a", 9), ("b", 7)):
            lab.core.create_namespaced_pod("default", gpu_pod(names[key], node, count))
            pod = running_pod(lab, names[key])
            devices = lab.checkpoint_devices(node, pod.metadata.uid)
            assert len(devices) == count and all("::" in d for d in devices), devices
            for gpu in sorted({d.split("::")[0] for d in devices}):
                given.setdefault(gpu, []).append({"pod": names[key], "namespace": "default", "container": "gpu"})
        assert len(given) == 8 and any(len(pods) == 2 for pods in given.values()), given

        def held() -> dict[str, list[dict[str, str]]]:
            return {
                gpu: sorted(pods, key=lambda p: p.get("pod", ""))
                for gpu, pods in dcgm_holders(lab, node, daemon).items()
            }

        lab.wait_until("both pods' replicas in the plugin pod's dcgm metrics", lambda: held() == given, timeout=20)
    finally:
        for name in names.values():
            lab.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            lab.wait_until(
                f"pod {name} gone",
                lambda name=name: (
                    not any(p.metadata.name == name for p in lab.core.list_namespaced_pod("default").items)
                ),
            )
        lab.core.patch_namespaced_config_map(CONFIG_MAP, NAMESPACE, {"data": {"config.yaml": original}})
        replaced_plugin_pod(lab, node, "8")


def test_unhealthy_gpu_leaves_allocatable_and_comes_back(lab: Lab, ds: DaemonsetNode) -> None:
    spec_path = Path(run_lab("spec-path", ds.node.rsplit("-", 1)[1]).strip())
    original = spec_path.read_text()
    spec = yaml.safe_load(original)
    # XID 79, the GPU fell off the bus: an XID event through NVML, then GPU_IS_LOST (docs/mock-nvml.md).
    spec["gpus"][5].update(xid=79, lost=True)
    try:
        write_in_place(spec_path, yaml.safe_dump(spec, sort_keys=False))
        lab.wait_until(f"{GPU}=7 with one GPU unhealthy", lambda: lab.allocatable(ds.node).get(GPU) == "7", timeout=30)
        # The pod's daemon heard the XID through NVML, from the library under /driver-root.
        log = lab.core.read_namespaced_pod_log(running_plugin_pod(lab, ds.node).metadata.name, NAMESPACE)
        assert f'"msg": "XID event", "device": "{spec["gpus"][5]["uuid"]}", "xid": 79' in log, log[-3000:]
        assert '"msg": "NVML library from the driver root"' in log
    finally:
        write_in_place(spec_path, original)
    lab.wait_until(f"{GPU}=8 after recovery", lambda: lab.allocatable(ds.node).get(GPU) == "8", timeout=30)


def test_kubelet_restart_plugin_registers_again(lab: Lab, ds: DaemonsetNode) -> None:
    pod = running_plugin_pod(lab, ds.node)
    before = registrations(lab, pod)
    restarted = lab.restart_kubelet(ds.node)
    lab.wait_until("a new registration of the same pod", lambda: registrations(lab, pod) > before, timeout=60)
    lab.wait_until(f"{ds.node} Ready after the restart", lambda: lab.node_ready(ds.node, since=restarted))
    lab.wait_until(f"{GPU}=8 after the restart", lambda: lab.allocatable(ds.node).get(GPU) == "8", timeout=60)
    # The same pod served throughout: the kubelet restart did not need the DaemonSet to replace it.
    assert running_plugin_pod(lab, ds.node).metadata.uid == pod.metadata.uid


def test_second_run_changes_nothing(ds: DaemonsetNode) -> None:
    second = ds.run_site()
    assert second.returncode == 0, second.summary()
    assert second.recap[ds.node]["changed"] == 0, second.changed_tasks()
    assert second.recap[ds.node]["failed"] == 0


def test_switch_to_systemd_mode_and_back(lab: Lab, ds: DaemonsetNode) -> None:
    """The plugin stage alone (--tags plugin), in the other mode: the role takes the node out of the
    DaemonSet, waits for its pod to go, then starts the service; and back again."""
    to_systemd = ds.run_site("--tags", "plugin", device_plugin_mode="systemd")
    assert to_systemd.returncode == 0, to_systemd.summary()
    assert plugin_pods(lab, ds.node) == []
    assert MODE_LABEL not in (lab.node(ds.node).metadata.labels or {})
    assert service_state(lab, ds.node) == "active"
    # No other node uses the DaemonSet any more, so its objects are gone (the namespace stays).
    apps = client.AppsV1Api(lab.api)
    assert not [d for d in apps.list_namespaced_daemon_set(NAMESPACE).items if d.metadata.name == DAEMONSET]
    lab.wait_until(f"{GPU}=8 from the service", lambda: lab.allocatable(ds.node).get(GPU) == "8", timeout=60)

    back = ds.run_site("--tags", "plugin")
    assert back.returncode == 0, back.summary()
    assert service_state(lab, ds.node) != "active"
    assert lab.node_exec(ds.node, "test", "-e", f"/etc/systemd/system/{SERVICE}.service", check=False).returncode
    pod = running_plugin_pod(lab, ds.node)
    assert registrations(lab, pod) >= 1
    lab.wait_until(f"{GPU}=8 from the pod", lambda: lab.allocatable(ds.node).get(GPU) == "8", timeout=60)
