"""The lab itself, end to end against the real peers: kube-apiserver (with etcd), the kubelet and
containerd in each node container, RBAC with the Node authorizer, and a pod that really runs."""

from __future__ import annotations

import base64
import ipaddress
import os
import re
import subprocess
import uuid
from datetime import datetime, timezone

import pytest
from conftest import KUBERNETES_VERSION, LAB_PY, PAUSE_IMAGE, Lab, lab_instance
from kubernetes import client, config
from playbook_run import lab_inventory, run_playbook


def test_every_node_registers_and_is_ready(lab: Lab) -> None:
    assert len(lab.nodes) >= 1
    registered = {n.metadata.name: n for n in lab.core.list_node().items}
    assert sorted(registered) == sorted(lab.nodes)
    for name in lab.nodes:
        node = lab.wait_until(f"{name} Ready", lambda name=name: lab.node_ready(name) and lab.node(name))
        info = node.status.node_info
        assert info.kubelet_version == KUBERNETES_VERSION
        # The lab's nodes run the containerd 1.7 that scripts/build-containerd17.sh builds (CDI for DRA).
        assert info.container_runtime_version.startswith("containerd://1.7.")
        # Each node's kubelet serves on its own port: the API server reaches it there.
        assert node.status.daemon_endpoints.kubelet_endpoint.port > 26250


def cgroup_v1_events(lab: Lab, node: str) -> list:
    return lab.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node},reason=CgroupV1"
    ).items


def test_kubelets_run_on_cgroup_v1_because_their_config_allows_it(lab: Lab) -> None:
    """From 1.35 on the kubelet refuses cgroup v1 unless its configuration sets failCgroupV1: false. The
    lab's does, so on a cgroup v1 machine every kubelet runs, and records its CgroupV1 warning on its Node."""
    for name in lab.nodes:
        config_lines = lab.node_exec(name, "cat", "/etc/gpuops-lab/kubelet-config.yaml").stdout.splitlines()
        assert "failCgroupV1: false" in config_lines
        fs_type = lab.node_exec(name, "stat", "-fc", "%T", "/sys/fs/cgroup").stdout.strip()
        if fs_type == "cgroup2fs":
            assert cgroup_v1_events(lab, name) == []
            continue
        events = lab.wait_until(f"the CgroupV1 warning of {name}", lambda name=name: cgroup_v1_events(lab, name))
        assert events[0].type == "Warning"
        assert "cgroup v1 support is deprecated" in events[0].message


def test_allocatable_reports_the_node_resources(lab: Lab) -> None:
    for name in lab.nodes:
        allocatable = lab.allocatable(name)
        assert int(allocatable["pods"]) > 0
        assert allocatable["cpu"]
        # No device plugin runs yet: the extended resource must not be there.
        assert "nvidia.com/gpu" not in allocatable


def pod_manifest(name: str, node: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gpuops-lab"}},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            # The lab runs no cluster DNS.
            "dnsPolicy": "Default",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"},
            ],
        },
    }


@pytest.mark.parametrize("index", [0, -1], ids=["first-node", "last-node"])
def test_pod_with_node_name_runs_in_containerd(lab: Lab, index: int) -> None:
    node = lab.nodes[index]
    name = f"lab-pause-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", pod_manifest(name, node))
    try:
        pod = lab.wait_until(
            f"pod {name} Running on {node}",
            lambda: (p := lab.core.read_namespaced_pod(name, "default")).status.phase == "Running" and p,
            timeout=120,
        )
        assert pod.spec.node_name == node
        assert pod.status.container_statuses[0].ready is True
        # The pod's IP comes from this node's bridge network (10.<231 + lab instance>.<node number>.0/24).
        node_number = int(node.rsplit("-", 1)[1])
        subnet = f"10.{231 + lab_instance()}.{node_number}.0/24"
        assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(subnet)
        # containerd in that node container really runs it.
        container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
        tasks = lab.node_exec(node, "ctr", "-n", "k8s.io", "tasks", "ls").stdout
        assert any(line.startswith(container_id) and "RUNNING" in line for line in tasks.splitlines())
    finally:
        lab.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    lab.wait_until(
        f"pod {name} gone",
        lambda: not any(p.metadata.name == name for p in lab.core.list_namespaced_pod("default").items),
        timeout=120,
    )


def kubelet_identity_client(lab: Lab, node: str, tmp_path) -> client.CoreV1Api:
    """An API client that authenticates as the node's kubelet (its client certificate)."""
    for file in ("kubelet-client.crt", "kubelet-client.key", "ca.crt"):
        data = lab.node_exec(node, "cat", f"/etc/gpuops-lab/{file}").stdout
        (tmp_path / file).write_text(data)
    kubeconfig = tmp_path / "kubeconfig"
    server = lab.api.configuration.host
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: lab, cluster: {{server: '{server}', certificate-authority: '{tmp_path}/ca.crt'}}}}]\n"
        f"users: [{{name: kubelet, user: {{client-certificate: '{tmp_path}/kubelet-client.crt', "
        f"client-key: '{tmp_path}/kubelet-client.key'}}}}]\n"
        "contexts: [{name: lab, context: {cluster: lab, user: kubelet}}]\ncurrent-context: lab\n"
    )
    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def test_kubelet_identity_is_limited_by_node_authorizer(lab: Lab, tmp_path) -> None:
    node = lab.nodes[0]
    kubelet = kubelet_identity_client(lab, node, tmp_path)
    # Its own node: allowed.
    assert kubelet.read_node(node).metadata.name == node
    # Another node object: NodeRestriction refuses a kubelet creating or changing anyone else.
    with pytest.raises(client.ApiException) as refused:
        kubelet.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "not-this-kubelet"}})
    assert refused.value.status == 403
    # Secrets it has no pod for: the Node authorizer refuses them.
    with pytest.raises(client.ApiException) as refused:
        kubelet.list_namespaced_secret("kube-system")
    assert refused.value.status == 403


def test_service_account_tokens_are_signed_by_the_lab_key(lab: Lab) -> None:
    token = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=["gpuops-lab"]))
    issued = lab.core.create_namespaced_service_account_token("default", "default", token)
    payload = issued.status.token.split(".")[1]
    claims = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
    assert '"iss":"https://kubernetes.default.svc"' in claims
    assert '"sub":"system:serviceaccount:default:default"' in claims


def test_kubelet_restart_comes_back_ready(lab: Lab) -> None:
    node = lab.nodes[0]
    before = lab.node_exec(node, "systemctl", "show", "-p", "MainPID", "--value", "kubelet").stdout.strip()
    restarted = lab.restart_kubelet(node)
    after = lab.node_exec(node, "systemctl", "show", "-p", "MainPID", "--value", "kubelet").stdout.strip()
    assert after not in ("0", before)
    # Ready again, by a heartbeat of the new kubelet process (no controller marks it NotReady here).
    lab.wait_until(f"{node} Ready after kubelet restart", lambda: lab.node_ready(node, since=restarted))
    assert lab.node_exec(node, "systemctl", "is-active", "kubelet").stdout.strip() == "active"


# A lab instance this session's lab never is (the end-to-end tier uses 0, make test-awx 1).
SECOND_INSTANCE = 3


PLUGIN_SERVICE = "gpuops-device-plugin"
# The DaemonSets that run the plugin in daemonset mode (device plugin, DRA driver), in the plugin's namespace.
PLUGIN_DAEMONSETS = ("gpuops-device-plugin", "gpuops-dra-plugin")


def plugin_process(lab: Lab, node: str) -> str:
    """The device plugin's process on ``node``, named so that a restart changes the name. systemd mode: the
    service's MainPID, after checking that this process is the unit's ExecStart (its command line ends with
    ExecStart's argv: the console script runs under the venv's interpreter). daemonset mode: the plugin pod's
    running container."""
    pid = lab.node_exec(node, "systemctl", "show", "-p", "MainPID", "--value", PLUGIN_SERVICE).stdout.strip()
    if pid not in ("", "0"):
        exec_start = lab.node_exec(node, "systemctl", "show", "-p", "ExecStart", "--value", PLUGIN_SERVICE).stdout
        found = re.search(r"argv\[\]=(.*?) ;", exec_start)
        assert found, exec_start
        argv = found.group(1).split()
        cmdline = lab.node_exec(node, "sh", "-c", f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.splitlines()
        assert cmdline[-len(argv) :] == argv, (cmdline, argv)
        return f"pid {pid}"
    for daemonset in PLUGIN_DAEMONSETS:
        selector = f"app.kubernetes.io/name={daemonset}"
        pods = lab.core.list_namespaced_pod(
            "gpuops-system", label_selector=selector, field_selector=f"spec.nodeName={node}"
        ).items
        for pod in pods:
            for status in pod.status.container_statuses or ():
                if status.state.running is not None:
                    return f"{pod.metadata.uid} {status.container_id}"
    raise AssertionError(f"no device plugin runs on {node}: {PLUGIN_SERVICE} is inactive and no DaemonSet pod runs")


def gpus_allocatable(lab: Lab, node: str) -> int:
    return int(lab.allocatable(node).get("nvidia.com/gpu", "0"))


def node_with_gpus(lab: Lab, tmp_path) -> str:
    """A lab node with GPUs allocatable: one that site.yml already made a GPU node (the rest of the tier
    leaves one so), else the first node, made one now (site.yml, 8 simulated GPUs)."""
    for node in lab.nodes:
        if gpus_allocatable(lab, node) > 0:
            return node
    node = lab.nodes[0]
    done = run_playbook("site.yml", lab_inventory(tmp_path / "inventory.yml"), limit=f"localhost,{node}")
    assert done.returncode == 0, done.summary()
    lab.wait_until(f"{node}: nvidia.com/gpu allocatable", lambda: gpus_allocatable(lab, node) > 0, timeout=180)
    return node


@pytest.mark.full
@pytest.mark.last_in_session
def test_taking_another_instance_down_leaves_this_lab_alone(lab: Lab, tmp_path) -> None:
    """`lab.py down` of a second lab instance touches none of this lab's node containers, cgroups or
    services: the node stays Ready with its GPUs, `podman exec` into it works and a new pod runs there."""
    node = node_with_gpus(lab, tmp_path)
    gpus = gpus_allocatable(lab, node)
    plugin = plugin_process(lab, node)
    second = {**os.environ, "GPUOPS_LAB_INSTANCE": str(SECOND_INSTANCE), "GPUOPS_LAB_NODES": "1"}
    second.pop("GPUOPS_LAB_DIR", None)
    try:
        subprocess.run([str(LAB_PY), "up", "1"], env=second, check=True, stdout=subprocess.PIPE, timeout=900)
        nodes = subprocess.run([str(LAB_PY), "nodes"], env=second, check=True, stdout=subprocess.PIPE, text=True)
        assert nodes.stdout.split() == [f"gpuops-lab{SECOND_INSTANCE}-node-1"]
    finally:
        subprocess.run([str(LAB_PY), "down"], env=second, check=True, stdout=subprocess.PIPE, timeout=300)

    since = datetime.now(timezone.utc)
    for name in lab.nodes:
        assert lab.node_exec(name, "true").returncode == 0
        assert lab.node_exec(name, "systemctl", "is-active", "kubelet", "containerd").stdout.split() == [
            "active",
            "active",
        ]
        lab.wait_until(f"{name} Ready after the other lab went", lambda name=name: lab.node_ready(name, since=since))
    assert gpus_allocatable(lab, node) == gpus
    # The kubelet keeps a vanished plugin's devices allocatable for a grace period: the plugin must be the
    # very process that ran before (the service in systemd mode, the DaemonSet pod's container in daemonset
    # mode; both in the node), not merely some process of that name.
    assert plugin_process(lab, node) == plugin
    name = f"lab-after-{uuid.uuid4().hex[:8]}"
    manifest = pod_manifest(name, node)
    # Schedulable on that node as any pod is: the GPU node's taint tolerated.
    manifest["spec"]["tolerations"] = [{"operator": "Exists"}]
    lab.core.create_namespaced_pod("default", manifest)
    try:
        lab.wait_until(
            f"pod {name} Running on {node}",
            lambda: lab.core.read_namespaced_pod(name, "default").status.phase == "Running",
            timeout=120,
        )
    finally:
        lab.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
