"""playbooks/site.yml turns a lab node into a GPU node, device plugin in systemd mode, proven against the
real kube-apiserver, kubelet and containerd of the lab (tests/e2e/lab.py).

The node has 8 simulated GPUs (tests/fixtures/simulated/h100x8.yaml: two NVLink islands of four, NUMA
nodes 0 and 1), served by the lab's mock NVIDIA driver (its libnvidia-ml.so.1 and device nodes,
docs/mock-nvml.md), which the plugin reads through the real NVML bindings; the spec and that driver are the
only stand-ins, everything else is the real product: the
roles install the container toolkit from a signed (local) repository, configure the node's containerd,
install the plugin into a venv with a hardened unit, and label and taint the node through the API.

One lab, one check run and one real run are shared by every test of this module, in order. That a second run
changes nothing is proven in `make test` by test_failing_sudo_stops_that_host_only, whose play goes through the whole
of site.yml on the converged node (it must report no change there); `make test-full` also runs it on its own
(test_second_run_changes_nothing).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import node_snapshot
import pytest
import yaml
from conftest import (
    PAUSE_IMAGE,
    Lab,
    container_environment,
    container_nvidia_devices,
    container_pid,
    gpu_device_nodes,
    nvlink_peers,
    recovery_vars,
    run_lab,
    running_pod,
    write_in_place,
)
from kubernetes import client
from playbook_run import REPO, PlaybookRun, inventory_hostvars, lab_inventory, run_playbook
from prometheus_lab import Prometheus

GPU = "nvidia.com/gpu"
SPEC = REPO / "tests" / "fixtures" / "simulated" / "h100x8.yaml"
# Where the container_toolkit role writes the CDI spec (toolkit 1.18's refresh units write there too).
CDI_SPEC = "/var/run/cdi/nvidia.yaml"
# The unprivileged user the lab inventory logs in as (over SSH, with become).
LOGIN_HOME = "/home/gpuops"
# What a check run may touch on the node without writing anything of the product: Ansible's own
# temporary files (~/.ansible/tmp of the login user and of root, whose creation also touches their home
# directories), logs and caches, the mounts and volumes the lab owns (-xdev skips those), and /var/backups, where
# Debian's dpkg-db-backup.timer writes its daily copy of the package database (on a node image started for the
# first time it fires at boot, during the check run; a package the run installed shows in dpkg-query instead).
SNAPSHOT = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp -o -path /var/tmp"
    " -o -path /var/log -o -path /var/cache -o -path /var/backups"
    f" -o -path /root/.ansible -o -path {LOGIN_HOME}/.ansible \\) -prune"
    f" -o -newer /run/gpuops-check-mark ! -path /root ! -path {LOGIN_HOME} -print"
)


@dataclass
class SiteFlow:
    node: str
    inventory: Path
    extra_vars: Path
    check: PlaybookRun
    written_during_check: list[str]
    packages_before_check: str
    packages_after_check: str
    labels_after_check: dict[str, str]
    runtime_classes_before_check: dict[str, str]
    runtime_classes_after_check: dict[str, str]
    first: PlaybookRun


def packages(lab: Lab, node: str) -> str:
    return lab.node_exec(node, "dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\\n").stdout


def runtime_classes(lab: Lab) -> dict[str, str]:
    """The cluster's RuntimeClasses, name -> resourceVersion (which moves on any write)."""
    items = client.NodeV1Api(lab.api).list_runtime_class().items
    return {rc.metadata.name: rc.metadata.resource_version for rc in items}


@pytest.fixture(scope="module")
def flow(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> SiteFlow:
    """`site.yml --check --diff`, then `site.yml`, on the first lab node, with what was seen around them."""
    node = lab.nodes[0]
    work = tmp_path_factory.mktemp("site-flow")
    inventory = lab_inventory(work / "inventory.yml")
    extra_vars = recovery_vars(work / "vars.yml")

    packages_before = packages(lab, node)
    classes_before = runtime_classes(lab)
    # A pod an earlier module deleted may still be torn down (its sandbox's CNI results are removed from
    # /var/lib/cni): that would read as a write of the check run.
    lab.wait_pods_gone(node)
    lab.node_exec(node, "touch", "/run/gpuops-check-mark")
    check = run_playbook("site.yml", inventory, "--check", "--diff", extra_vars=extra_vars, limit=node)
    written = lab.node_exec(node, "sh", "-c", SNAPSHOT).stdout.split()
    packages_after = packages(lab, node)
    labels = dict(lab.node(node).metadata.labels or {})
    classes = runtime_classes(lab)

    first = run_playbook("site.yml", inventory, "--diff", extra_vars=extra_vars, limit=node)
    return SiteFlow(
        node=node,
        inventory=inventory,
        extra_vars=extra_vars,
        check=check,
        written_during_check=written,
        packages_before_check=packages_before,
        packages_after_check=packages_after,
        labels_after_check=labels,
        runtime_classes_before_check=classes_before,
        runtime_classes_after_check=classes,
        first=first,
    )


def test_check_mode_first_fails_nothing_and_changes_nothing(flow: SiteFlow) -> None:
    assert flow.check.returncode == 0, flow.check.summary()
    assert flow.check.recap[flow.node]["failed"] == 0
    # It does report what it would do...
    assert flow.check.recap[flow.node]["changed"] > 0, flow.check.summary()
    # ...and does none of it: no file written on the node, no package installed, nothing in the API.
    assert flow.written_during_check == [], flow.written_during_check
    assert flow.packages_after_check == flow.packages_before_check
    assert not [k for k in flow.labels_after_check if k.startswith("nvidia.com/")]
    # (This module runs before the DaemonSet one, so the nvidia RuntimeClass is not there yet.)
    assert flow.runtime_classes_after_check == flow.runtime_classes_before_check
    assert "nvidia" not in flow.runtime_classes_after_check


def test_site_runs_and_skips_the_driver_by_detection(flow: SiteFlow) -> None:
    assert flow.first.returncode == 0, flow.first.summary()
    assert flow.first.recap[flow.node]["failed"] == 0
    assert flow.first.recap[flow.node]["changed"] > 0
    # A lab node has no NVIDIA PCI device: the driver role finds that out and says so.
    assert f"No NVIDIA PCI device found on {flow.node}; the driver is not installed" in flow.first.output
    print(f"site.yml --check --diff: {flow.check.seconds:.0f}s, first run: {flow.first.seconds:.0f}s")


def task_outcome(output: str, task: str) -> str:
    """The first result line (ok:, skipping:, changed: ...) under a task's header in the default callback's output."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"TASK [{task}]"))
    return next(line for line in lines[start + 1 :] if line.strip()).split(":", 1)[0]


def test_the_driver_role_uses_the_plays_pci_scan_and_scans_itself_only_without_one(
    flow: SiteFlow, tmp_path: Path
) -> None:
    """site.yml hands its discovery to the driver role: a real (sysfs) scan answers the role's question, and so does
    a simulated one, which carries the real bus beside its GPUs (host_pci), so the node is not asked twice; a
    simulated result without the real bus must not answer it (its GPUs are not PCI devices the driver could drive)."""
    cases = (
        ("sysfs", False, "{{ scan }}", "skipping"),
        ("simulated", True, "{{ scan }}", "skipping"),
        (
            "simulated-without-host-pci",
            True,
            "{{ scan | dict2items | rejectattr('key', 'equalto', 'host_pci') | items2dict }}",
            "ok",
        ),
    )
    for name, simulate, given, expected in cases:
        scan = {"name": "Scan the node", "gpuops.k8s.nvidia_gpu_info": {}, "register": "scan"}
        if simulate:
            scan["gpuops.k8s.nvidia_gpu_info"]["simulate_from"] = "{{ gpuops_simulate_from }}"
        role = {
            "name": "The driver role with the scan",
            "ansible.builtin.include_role": {"name": "gpuops.k8s.nvidia_driver"},
        }
        play = [
            {
                "hosts": flow.node,
                "become": True,
                "gather_facts": False,
                "tasks": [scan, dict(role, vars={"nvidia_driver_gpu_info": given})],
            }
        ]
        playbook = tmp_path / f"driver-scan-{name}.yml"
        playbook.write_text(yaml.safe_dump(play))
        run = run_playbook(str(playbook), flow.inventory, extra_vars=flow.extra_vars)
        assert run.returncode == 0, run.summary()
        assert run.recap[flow.node]["changed"] == 0
        assert task_outcome(run.output, "gpuops.k8s.nvidia_driver : Look for NVIDIA PCI devices") == expected, (
            name,
            run.output,
        )
        # Either way the answer is the node's real PCI devices: none.
        assert f"No NVIDIA PCI device found on {flow.node}; the driver is not installed" in run.output


def test_node_advertises_eight_gpus(lab: Lab, flow: SiteFlow) -> None:
    node = lab.wait_until(
        f"{flow.node} allocatable {GPU}=8",
        lambda: (n := lab.node(flow.node)).status.allocatable.get(GPU) == "8" and n,
        timeout=120,
    )
    assert node.status.capacity[GPU] == "8"
    assert node.status.allocatable[GPU] == "8"


def test_gpu_labels_and_taint(lab: Lab, flow: SiteFlow) -> None:
    node = lab.node(flow.node)
    labels = node.metadata.labels
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.memory"] == "81559"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == ("9", "0")
    assert labels["nvidia.com/cuda.driver-version.major"] == "580"
    taints = [(t.key, t.value, t.effect) for t in node.spec.taints or []]
    assert ("nvidia.com/gpu", "present", "NoSchedule") in taints


def test_runtime_class_nvidia(lab: Lab, flow: SiteFlow) -> None:
    runtime_class = client.NodeV1Api(lab.api).read_runtime_class("nvidia")
    assert runtime_class.handler == "nvidia"
    # containerd in the node knows that handler: nvidia is its default runtime now.
    dump = lab.node_exec(flow.node, "containerd", "config", "dump").stdout
    assert 'default_runtime_name = "nvidia"' in dump
    assert "/usr/bin/nvidia-container-runtime" in dump


def gpu_pod(name: str, node: str, runtime_class: str | None) -> dict:
    spec: dict = {
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
                "resources": {"limits": {GPU: "2"}},
            }
        ],
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def delete_pod(lab: Lab, name: str) -> None:
    lab.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    lab.wait_until(
        f"pod {name} gone",
        lambda: not any(p.metadata.name == name for p in lab.core.list_namespaced_pod("default").items),
        timeout=120,
    )


def test_the_toolkit_runs_in_cdi_mode_with_the_spec_nvidia_ctk_writes(lab: Lab, flow: SiteFlow) -> None:
    """The lab inventory asks for container_toolkit_runtime_mode: cdi. The role set that one value, wrote the spec
    NVIDIA's own nvidia-ctk generates from the node's NVML (the mock library, docs/mock-nvml.md) where toolkit
    1.18's refresh units write it, and left those units enabled."""
    effective = lab.node_exec(flow.node, "nvidia-ctk", "--quiet", "config").stdout
    assert re.search(r'(?m)^mode = "cdi"$', effective), effective
    written = lab.node_exec(flow.node, "cat", CDI_SPEC).stdout
    generated = lab.node_exec(flow.node, "nvidia-ctk", "--quiet", "cdi", "generate").stdout
    assert written == generated
    names = {device["name"] for device in yaml.safe_load(written)["devices"]}
    assert {gpu["uuid"] for gpu in yaml.safe_load(SPEC.read_text())["gpus"]} <= names
    units = lab.node_exec(
        flow.node, "systemctl", "show", "-p", "UnitFileState,ActiveState", "nvidia-cdi-refresh.path"
    ).stdout.split()
    assert sorted(units) == ["ActiveState=active", "UnitFileState=enabled"]
    assert lab.node_exec(flow.node, "systemctl", "is-enabled", "nvidia-cdi-refresh.service").stdout.strip() == "enabled"


def test_pod_gets_two_nvlink_peers(lab: Lab, flow: SiteFlow, prometheus: Prometheus) -> None:
    """A GPU pod on containerd's default runtime, NVIDIA's nvidia-container-runtime in CDI mode (the stand-in
    nvidia-container-cli of legacy mode is not involved): the plugin's Allocate answer names the GPUs, the runtime
    injects their devices from nvidia-ctk's spec, and the container sees exactly those. Its two GPUs' dcgm metrics
    carry its pod, namespace and container in Prometheus while it runs, and no longer once it is gone."""
    lab.wait_until(f"{GPU}=8", lambda: lab.allocatable(flow.node).get(GPU) == "8")
    name = f"gpu-pair-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", gpu_pod(name, flow.node, None))
    try:
        pod = running_pod(lab, name)
        # The kubelet called Allocate: its checkpoint names two devices for this pod...
        devices = lab.checkpoint_devices(flow.node, pod.metadata.uid)
        assert len(devices) == 2, devices
        # ...which the plugin's preferred allocation took from one NVLink island.
        assert devices[1] in nvlink_peers(SPEC)[devices[0]], devices
        container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
        # The device nodes of those GPUs and the control nodes, and no other GPU's.
        assert container_nvidia_devices(lab, flow.node, container_id) == gpu_device_nodes(SPEC, devices)
        # The spec's common edits: the driver's NVML library, its soname link made by nvidia-cdi-hook, and
        # NVIDIA_VISIBLE_DEVICES=void, which keeps a later hook from injecting again (the plugin had put the
        # UUIDs there: the runtime read them as nvidia.com/gpu=<uuid>).
        pid = container_pid(lab, flow.node, container_id)
        version = yaml.safe_load(SPEC.read_text())["driver_version"]
        lib = f"/proc/{pid}/root/usr/lib/x86_64-linux-gnu"
        assert lab.node_exec(flow.node, "test", "-f", f"{lib}/libnvidia-ml.so.{version}", check=False).returncode == 0
        link = lab.node_exec(flow.node, "readlink", f"{lib}/libnvidia-ml.so.1").stdout.strip()
        assert link == f"libnvidia-ml.so.{version}"
        assert container_environment(lab, flow.node, container_id)["NVIDIA_VISIBLE_DEVICES"] == "void"
        # The daemon reads the kubelet's pod-resources API with each reading (every 2 s in the lab), Prometheus
        # scrapes every 2 s: the labels are there within a few seconds.
        prometheus.wait_until(
            f"{name}'s GPUs in Prometheus", lambda: len(holders(prometheus, flow, name)) == 2, timeout=20
        )
        assert holders(prometheus, flow, name) == {device: ("default", "gpu") for device in devices}
    finally:
        delete_pod(lab, name)
    prometheus.wait_until(f"{name} gone from the dcgm metrics", lambda: not holders(prometheus, flow, name), timeout=20)


PLUGIN_CONFIG = "/etc/gpuops/device-plugin/config.yaml"  # the role's device_plugin_config_dir/config.yaml


def test_each_holder_of_a_time_sliced_gpus_replicas_has_a_series_of_its_own(
    lab: Lab, flow: SiteFlow, prometheus: Prometheus
) -> None:
    """Time-slicing, two replicas per GPU, set in the daemon's config file and taken by a reload (the unit's
    ExecReload, SIGHUP): one pod takes 9 of the 16 replicas, another the other 7, so at least one GPU is shared by
    both. Each GPU's series in Prometheus carry exactly the pods the kubelet gave its replicas to, one series per
    holder (a pod with both replicas of a GPU is one). The file is put back and reloaded after, as it was."""
    node = flow.node
    original = lab.node_exec(node, "cat", PLUGIN_CONFIG).stdout
    config = yaml.safe_load(original)
    config["sharing"] = {"timeSlicing": {"resources": [{"name": GPU, "replicas": 2}]}}
    # In place (`cat >`): the file keeps its owner and mode.
    lab.node_exec(node, "sh", "-c", f"cat > {PLUGIN_CONFIG}", input_text=yaml.safe_dump(config))
    names = {"a": f"sliced-a-{uuid.uuid4().hex[:6]}", "b": f"sliced-b-{uuid.uuid4().hex[:6]}"}
    try:
        lab.node_exec(node, "systemctl", "reload", "gpuops-device-plugin")
        lab.wait_until(f"{GPU}=16 (two replicas each)", lambda: lab.allocatable(node).get(GPU) == "16", timeout=60)
        given: dict[str, set[str]] = {}
        for key, count in (("a", 9), ("b", 7)):
            manifest = gpu_pod(names[key], node, None)
            manifest["spec"]["containers"][0]["resources"]["limits"][GPU] = str(count)
            lab.core.create_namespaced_pod("default", manifest)
            pod = running_pod(lab, names[key])
            devices = lab.checkpoint_devices(node, pod.metadata.uid)
            assert len(devices) == count and all("::" in d for d in devices), devices
            for device in devices:
                given.setdefault(device.split("::")[0], set()).add(names[key])
        assert len(given) == 8 and any(len(pods) == 2 for pods in given.values()), given
        instance = prometheus.targets[node]
        query = f'DCGM_FI_DEV_GPU_TEMP{{instance="{instance}", pod=~"{names["a"]}|{names["b"]}"}}'

        def series() -> list[tuple[str, str]]:
            return sorted((labels["UUID"], labels["pod"]) for labels, _value in prometheus.query(query))

        expected = sorted((gpu, pod) for gpu, pods in given.items() for pod in pods)
        prometheus.wait_until("both pods' replicas in Prometheus", lambda: series() == expected, timeout=20)
    finally:
        for name in names.values():
            delete_pod(lab, name)
        lab.node_exec(node, "sh", "-c", f"cat > {PLUGIN_CONFIG}", input_text=original)
        lab.node_exec(node, "systemctl", "reload", "gpuops-device-plugin")
        lab.wait_until(f"{GPU}=8 again", lambda: lab.allocatable(node).get(GPU) == "8", timeout=60)
    assert lab.node_exec(node, "cat", PLUGIN_CONFIG).stdout == original


def holders(prometheus: Prometheus, flow: SiteFlow, pod: str) -> dict[str, tuple[str, str]]:
    """The node's GPUs (UUID) whose DCGM_FI_DEV_GPU_TEMP series in Prometheus carry ``pod``, with their namespace and
    container labels."""
    instance = prometheus.targets[flow.node]
    found = prometheus.query(f'DCGM_FI_DEV_GPU_TEMP{{instance="{instance}", pod="{pod}"}}')
    return {labels["UUID"]: (labels.get("namespace", ""), labels.get("container", "")) for labels, _value in found}


def test_the_plugins_cdi_names_resolve_in_nvidia_ctks_spec(lab: Lab, flow: SiteFlow) -> None:
    """The device plugin writes no CDI spec of its own: with the cdi-annotations and cdi-cri strategies it names
    each GPU nvidia.com/gpu=<UUID>, as the nvidia runtime in CDI mode names the UUIDs of NVIDIA_VISIBLE_DEVICES.
    Each such name must be a device of nvidia-ctk's spec that brings exactly that GPU's device node
    (docs/compared-cdi.md)."""
    spec = yaml.safe_load(lab.node_exec(flow.node, "cat", CDI_SPEC).stdout)
    assert spec["kind"] == "nvidia.com/gpu"
    devices = {device["name"]: device["containerEdits"] for device in spec["devices"]}
    gpus = yaml.safe_load(SPEC.read_text())["gpus"]
    for index, gpu in enumerate(gpus):
        nodes = [node["path"] for node in devices[gpu["uuid"]]["deviceNodes"]]
        assert nodes == [f"/dev/nvidia{gpu.get('minor_number', index)}"], (gpu["uuid"], nodes)


def test_unhealthy_gpu_leaves_allocatable_and_comes_back(lab: Lab, flow: SiteFlow, prometheus: Prometheus) -> None:
    """XID 79 on GPU 7: it leaves the node's allocatable and comes back when the spec says it answers again. The
    XID shows in Prometheus as dcgm-exporter's DCGM_FI_DEV_XID_ERRORS{err_code="79"} for that GPU, though NVML no
    longer answers for it, within a few seconds (a reading every 2 s, a scrape every 2 s)."""
    spec_path = Path(run_lab("spec-path", flow.node.rsplit("-", 1)[1]).strip())
    original = spec_path.read_text()
    spec = yaml.safe_load(original)
    # XID 79, the GPU fell off the bus: the mock NVML library delivers the XID event, then answers
    # GPU_IS_LOST for that GPU until the spec says otherwise (docs/mock-nvml.md).
    spec["gpus"][7].update(xid=79, lost=True)
    try:
        write_in_place(spec_path, yaml.safe_dump(spec, sort_keys=False))
        lab.wait_until(
            f"{GPU}=7 with one GPU unhealthy", lambda: lab.allocatable(flow.node).get(GPU) == "7", timeout=30
        )
        # The plugin heard the XID through NVML.
        uuid_7 = spec["gpus"][7]["uuid"]
        assert metric(flow, "gpu_device_plugin_xid_events_total", device=uuid_7, xid="79", critical="true") == 1.0
        instance = prometheus.targets[flow.node]
        xids = prometheus.wait_until(
            "XID 79 in Prometheus",
            lambda: prometheus.query(f'DCGM_FI_DEV_XID_ERRORS{{instance="{instance}", err_code="79"}}'),
            timeout=20,
        )
        assert [(labels["UUID"], labels["gpu"], value) for labels, value in xids] == [(uuid_7, "7", 79.0)]
    finally:
        write_in_place(spec_path, original)
    lab.wait_until(f"{GPU}=8 after recovery", lambda: lab.allocatable(flow.node).get(GPU) == "8", timeout=30)


def metric(flow: SiteFlow, name: str, **labels: str) -> float | None:
    """A sample of the plugin's Prometheus endpoint whose labels include ``labels``; None when there is none."""
    address = inventory_hostvars(flow.inventory, flow.node)["device_plugin_metrics_address"]
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    for found in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', found[1]))
        if all(pairs.get(key) == value for key, value in labels.items()):
            return float(found[2])
    return None


def registrations(flow: SiteFlow) -> float:
    """The plugin's count of successful registrations with the kubelet (its Prometheus endpoint)."""
    count = metric(flow, "gpu_device_plugin_registrations_total", result="ok")
    assert count is not None
    return count


def test_kubelet_restart_plugin_registers_again(lab: Lab, flow: SiteFlow) -> None:
    before = registrations(flow)
    restarted = lab.restart_kubelet(flow.node)
    lab.wait_until("a new registration", lambda: registrations(flow) > before, timeout=60)
    lab.wait_until(f"{flow.node} Ready after the restart", lambda: lab.node_ready(flow.node, since=restarted))
    lab.wait_until(f"{GPU}=8 after the restart", lambda: lab.allocatable(flow.node).get(GPU) == "8", timeout=60)


@pytest.mark.full
def test_second_run_changes_nothing(flow: SiteFlow) -> None:
    """The converged node's second run alone (make test-full): make test proves the same through
    test_failing_sudo_stops_that_host_only, a whole site.yml run on this node that must change nothing."""
    second = run_playbook("site.yml", flow.inventory, extra_vars=flow.extra_vars, limit=flow.node)
    assert second.returncode == 0, second.summary()
    assert second.recap[flow.node]["changed"] == 0, second.changed_tasks()
    assert second.recap[flow.node]["failed"] == 0
    print(f"site.yml second run: {second.seconds:.0f}s")


def test_validate_is_green_and_prints_the_table(lab: Lab, flow: SiteFlow) -> None:
    validate = run_playbook("validate.yml", flow.inventory, extra_vars=flow.extra_vars, limit=flow.node)
    assert validate.returncode == 0, validate.summary()
    assert "NODE" in validate.output and "ALLOCATABLE" in validate.output
    row = re.search(
        rf'"{re.escape(flow.node)}\s+NVIDIA H100 80GB HBM3\s+8\s+8\s+ok\s+on\s+healthy\s+-"', validate.output
    )
    assert row, validate.summary()
    # The note on cgroup v1 follows what the node itself reports, and names its running kubelet.
    fs_type = lab.node_exec(flow.node, "stat", "-fc", "%T", "/sys/fs/cgroup").stdout.strip()
    kubelet = lab.core.read_node(flow.node).status.node_info.kubelet_version
    note = f"{flow.node}: cgroup v1 (/sys/fs/cgroup is {fs_type}, not cgroup2fs). Its kubelet {kubelet} "
    assert (note in validate.output) == (fs_type != "cgroup2fs"), validate.summary()
    if fs_type != "cgroup2fs":
        assert "failCgroupV1: false" in validate.output
    print("\n".join(line for line in validate.output.splitlines() if "NODE" in line or flow.node + " " in line))


def test_validate_reaches_the_api_as_the_inventory_says(lab: Lab, flow: SiteFlow, tmp_path: Path) -> None:
    """validate.yml takes the whole connection the roles take from the inventory (gpu_node_labels_context,
    _api_host, _api_key, _validate_certs), not only the kubeconfig: here a kubeconfig whose current context is an
    API server that does not answer, and the inventory names the lab's context."""
    kubeconfig = yaml.safe_load(lab.kubeconfig.read_text(encoding="utf-8"))
    lab_context = kubeconfig["contexts"][0]
    nowhere = {"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}
    kubeconfig["clusters"].append(nowhere)
    kubeconfig["contexts"].append({"name": "nowhere", "context": dict(lab_context["context"], cluster="nowhere")})
    kubeconfig["current-context"] = "nowhere"
    path = tmp_path / "two-contexts.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig), encoding="utf-8")
    settings = yaml.safe_load(flow.extra_vars.read_text(encoding="utf-8")) or {}
    settings.update(gpu_node_labels_kubeconfig=str(path), gpu_node_labels_context=lab_context["name"])
    extra = tmp_path / "vars.yml"
    extra.write_text(yaml.safe_dump(settings), encoding="utf-8")
    validate = run_playbook("validate.yml", flow.inventory, extra_vars=extra, limit=flow.node)
    assert validate.returncode == 0, validate.summary()
    row = rf'"{re.escape(flow.node)}\s+NVIDIA H100 80GB HBM3\s+8\s+8\s+ok'
    assert re.search(row, validate.output), validate.summary()


def test_the_collection_tarball_installs_and_its_validate_playbook_runs(
    lab: Lab, flow: SiteFlow, tmp_path: Path
) -> None:
    """What a new user does: build the tarball Galaxy would get (from this checkout, with whatever the tiers before
    left in it; galaxy.yml's build_ignore keeps that out), install it with ansible-galaxy into an empty path, and run
    the playbook by its collection name. Its dependencies come from where the controller has them (the
    ansible package), so the install asks no server (--no-deps)."""
    build = subprocess.run(
        ["ansible-galaxy", "collection", "build", str(REPO), "--output-path", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = tmp_path.glob("gpuops-k8s-*.tar.gz")
    installed = tmp_path / "installed"
    install = subprocess.run(
        ["ansible-galaxy", "collection", "install", "--no-deps", "-p", str(installed), str(tarball)],
        capture_output=True,
        text=True,
        check=False,
        # Only the empty path counts as installed (ansible-lint, for one, installs the checkout in ~/.ansible).
        env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(installed)},
    )
    assert install.returncode == 0, install.stdout + install.stderr
    collection = installed / "ansible_collections" / "gpuops" / "k8s"
    assert (collection / "playbooks" / "validate.yml").is_file() and (collection / "LICENSE").is_file()
    # Nothing of the checkout's tools, caches or build output went into the tarball.
    assert not [p for p in collection.rglob("*") if p.name in {".build", "__pycache__", ".pytest_cache", "build"}]
    validate = run_playbook(
        "gpuops.k8s.validate", flow.inventory, extra_vars=flow.extra_vars, limit=flow.node, collections=installed
    )
    assert validate.returncode == 0, validate.summary()
    row = rf'"{re.escape(flow.node)}\s+NVIDIA H100 80GB HBM3\s+8\s+8\s+ok'
    assert re.search(row, validate.output), validate.summary()


# The fleet path: the lab's inventory logs in over SSH as an unprivileged user with become, as a fleet
# does; what happens when become is off, when sudo fails and when a node cannot be reached.


def test_the_lab_inventory_logs_in_over_ssh_as_a_sudo_user(lab: Lab, flow: SiteFlow) -> None:
    hostvars = inventory_hostvars(flow.inventory, flow.node)
    assert hostvars["ansible_connection"] == "ssh"
    assert hostvars["ansible_user"] == "gpuops"
    assert hostvars["ansible_become"] is True
    assert hostvars["ansible_ssh_pipelining"] is True
    assert "ControlPersist=" in hostvars["ansible_ssh_args"]
    assert "StrictHostKeyChecking=yes" in hostvars["ansible_ssh_common_args"]
    assert lab.node_exec(flow.node, "id", "-u", "gpuops").stdout.strip() != "0"
    # The node refuses root logins: everything the roles did on it went through sudo.
    sshd = lab.node_exec(flow.node, "sshd", "-T").stdout.lower().splitlines()
    assert "permitrootlogin no" in sshd
    assert "passwordauthentication no" in sshd


def test_no_temporary_files_are_left_on_the_node(lab: Lab, flow: SiteFlow) -> None:
    for directory in (f"{LOGIN_HOME}/.ansible/tmp", "/root/.ansible/tmp"):
        left = lab.node_exec(flow.node, "find", directory, "-mindepth", "1", check=False)
        assert left.stdout == "", f"{directory} on {flow.node}: {left.stdout}"


def test_without_become_the_play_stops_with_a_sentence(flow: SiteFlow) -> None:
    run = run_playbook(
        "site.yml", flow.inventory, "-e", "ansible_become=false", extra_vars=flow.extra_vars, limit=flow.node
    )
    assert run.returncode != 0, run.summary()
    assert run.recap[flow.node]["failed"] == 1
    assert run.recap[flow.node]["changed"] == 0
    assert f"{flow.node}: tasks run as 'gpuops' (uid " in run.output, run.summary()
    assert "set become: true" in run.output
    assert "Traceback" not in run.output


def other_node(lab: Lab, flow: SiteFlow) -> str:
    others = [node for node in lab.nodes if node != flow.node]
    assert others, "these tests need a lab of two nodes or more (GPUOPS_LAB_NODES)"
    return others[0]


def test_failing_sudo_stops_that_host_only(lab: Lab, flow: SiteFlow) -> None:
    other = other_node(lab, flow)
    sudoers = "/etc/sudoers.d/gpuops-lab"
    kept = lab.node_exec(other, "cat", sudoers).stdout
    # sudo now wants a password the inventory does not have.
    lab.node_exec(other, "sh", "-c", f"echo 'gpuops ALL=(ALL:ALL) ALL' > {sudoers}")
    try:
        run = run_playbook("site.yml", flow.inventory, extra_vars=flow.extra_vars, limit=f"{flow.node},{other}")
    finally:
        lab.node_exec(other, "sh", "-c", f"cat > {sudoers}", check=True, input_text=kept)
    assert run.returncode != 0, run.summary()
    assert run.recap[other]["failed"] == 1, run.summary()
    assert run.recap[other]["ok"] == 0
    assert f"fatal: [{other}]: FAILED! => " in run.output and "Missing sudo password" in run.output
    # The converged node went through the whole play and is still converged: make test's proof that a second
    # site.yml run changes nothing (test_second_run_changes_nothing runs it alone under make test-full).
    assert run.recap[flow.node]["failed"] == 0 and run.recap[flow.node]["unreachable"] == 0, run.summary()
    assert run.recap[flow.node]["changed"] == 0, run.changed_tasks()
    assert "Traceback" not in run.output


def test_validate_names_a_node_it_cannot_reach(lab: Lab, flow: SiteFlow) -> None:
    other = other_node(lab, flow)
    # sshd stops listening and its sessions (the ControlPersist master among them) end.
    lab.node_exec(other, "sh", "-c", "systemctl stop ssh; pkill -x sshd; true")
    try:
        run = run_playbook("validate.yml", flow.inventory, extra_vars=flow.extra_vars, limit=f"{flow.node},{other}")
    finally:
        lab.node_exec(other, "systemctl", "start", "ssh")
    assert run.returncode != 0, run.summary()
    assert f"fatal: [{other}]: UNREACHABLE! => " in run.output, run.summary()
    assert re.search(rf'"{re.escape(other)}(\s+-){{6}}\s+connection"', run.output), run.summary()
    assert f"{other}: red: connection (unreachable: " in run.output
    # The reachable node was checked and is green.
    assert re.search(rf'"{re.escape(flow.node)}\s+NVIDIA H100 80GB HBM3\s+8\s+8\s+ok\s+on\s+healthy\s+-"', run.output)
    assert run.recap[flow.node]["failed"] == 0


GREEN_ROW = r'"{node}\s+NVIDIA H100 80GB HBM3\s+8\s+8\s+ok\s+on\s+healthy\s+-"'


def validate_until_green(flow: SiteFlow, timeout: float = 90) -> PlaybookRun:
    """validate.yml again until the node is green (the plugin may take its time to answer after a change)."""
    deadline = time.monotonic() + timeout
    while True:
        run = run_playbook("validate.yml", flow.inventory, extra_vars=flow.extra_vars, limit=flow.node)
        if run.returncode == 0 or time.monotonic() > deadline:
            assert run.returncode == 0, run.summary()
            return run
        time.sleep(2)


def test_validate_is_red_on_a_driver_library_mismatch_and_green_after(lab: Lab, flow: SiteFlow) -> None:
    """New driver packages over the old module: NVML's nvmlInit fails with NVML_ERROR_LIB_RM_VERSION_MISMATCH. The
    node's spec gives the loaded module another version than the library's (kernel_module_version); the mock
    library (a TEST DOUBLE) answers nvmlInit so, and validate.yml's driver check is red with that reason."""
    spec_path = Path(run_lab("spec-path", flow.node.rsplit("-", 1)[1]).strip())
    original = spec_path.read_text()
    spec = yaml.safe_load(original)
    try:
        write_in_place(spec_path, yaml.safe_dump({**spec, "kernel_module_version": "535.216.01"}, sort_keys=False))
        # The node's own NVML (the mock library through the real bindings) refuses to initialise.
        probe = lab.wait_until(
            "NVML reports the mismatch",
            lambda: (
                (
                    r := lab.node_exec(flow.node, "python3", "-c", "import pynvml; pynvml.nvmlInit()", check=False)
                ).returncode
                != 0
                and r
            ),
            timeout=30,
        )
        assert "RM has detected an NVML/RM version mismatch" in probe.stderr, probe.stderr
        red = run_playbook("validate.yml", flow.inventory, extra_vars=flow.extra_vars, limit=flow.node)
        assert red.returncode != 0, red.summary()
        line = next((x for x in red.output.splitlines() if f"{flow.node}: red: " in x), "")
        assert re.search(r"red: ([a-z_]+, )*driver\b", line), red.summary()
        assert "driver: NVML could not be initialised (RM has detected an NVML/RM version mismatch: Driver/library" \
            " version mismatch" in line, red.summary()  # fmt: skip
    finally:
        write_in_place(spec_path, original)
    assert re.search(GREEN_ROW.format(node=re.escape(flow.node)), validate_until_green(flow).output)


# A kernel the lab node "boots next": a kernel image name under the node's /boot, newer than any there (a lab node is
# a container, whose /boot holds no kernel, so validate.yml judges only this one).
FAKE_KERNEL = "99.0.0-1-gpuops-lab"


def test_validate_is_red_where_the_next_kernel_has_no_module_and_green_after(lab: Lab, flow: SiteFlow) -> None:
    """The state a kernel update without headers leaves: the newest /boot/vmlinuz-* (GRUB's default entry) has no
    nvidia.ko under its /lib/modules. The lab shows it with an empty kernel image file (a TEST DOUBLE of one) and no
    module tree; validate.yml is red (boot_module) with the reason, and green again once the kernel is gone."""
    assert lab.node_exec(flow.node, "sh", "-c", "ls /boot/vmlinuz-* 2>/dev/null", check=False).stdout == ""
    try:
        lab.node_exec(flow.node, "sh", "-c", f"mkdir -p /boot && : > /boot/vmlinuz-{FAKE_KERNEL}")
        red = run_playbook("validate.yml", flow.inventory, extra_vars=flow.extra_vars, limit=flow.node)
        assert red.returncode != 0, red.summary()
        line = next((x for x in red.output.splitlines() if f"{flow.node}: red: " in x), "")
        assert f"{flow.node}: red: boot_module (boot_module: the kernel it boots next ({FAKE_KERNEL}) has no NVIDIA" \
            " kernel module)" in line, red.summary()  # fmt: skip
    finally:
        lab.node_exec(flow.node, "rm", "-f", f"/boot/vmlinuz-{FAKE_KERNEL}")
    assert re.search(GREEN_ROW.format(node=re.escape(flow.node)), validate_until_green(flow).output)


# The backups of containerd's config that site.yml's runtime role kept (nvidia_runtime_backup), left for the operator:
# the one difference from the node as the lab made it that the proof below allows.
RUNTIME_BACKUP = re.compile(r"^/etc/containerd/config\.toml\.\d+\.[0-9-]+@[0-9:]+~$")


def leftovers(differences: dict) -> dict:
    """``differences`` without the runtime config's backups."""
    out = dict(differences)
    files = {path: seen for path, seen in out.pop("files", {}).items() if not RUNTIME_BACKUP.match(path)}
    if files:
        out["files"] = files
    return out


def test_remove_gives_the_node_back_as_the_lab_made_it_and_leaves_the_other_gpu_node_alone(
    lab: Lab, flow: SiteFlow
) -> None:
    """playbooks/remove.yml on this node, with the other lab node a GPU node running a GPU pod: --check --diff lists
    what it would take off and writes nothing; the run takes off the labels, taint and annotations of the collection,
    the plugin with the distribution packages its install brought, the runtime entry, the toolkit and the records, so
    that the node equals its snapshot from before any test touched it (tests/e2e/node_snapshot.py: files with modes,
    owners and checksums, packages, units, containerd's effective config, the Node's labels, taints and annotations),
    apart from the allowance above; the other node's pod runs on and the RuntimeClass it names stays; a second run
    changes nothing."""
    other = next(node for node in lab.nodes if node != flow.node)
    if lab.allocatable(other).get(GPU) != "8":
        converged = run_playbook("site.yml", flow.inventory, extra_vars=flow.extra_vars, limit=other)
        assert converged.returncode == 0, converged.summary()
        lab.wait_until(f"{GPU}=8 on {other}", lambda: lab.allocatable(other).get(GPU) == "8", timeout=180)
    name = f"stays-{uuid.uuid4().hex[:8]}"
    lab.core.create_namespaced_pod("default", gpu_pod(name, other, "nvidia"))
    try:
        pod = running_pod(lab, name)
        lab.wait_pods_gone(flow.node)
        before_check = node_snapshot.take(lab, flow.node)
        check = run_playbook(
            "remove.yml", flow.inventory, "--check", "--diff", extra_vars=flow.extra_vars, limit=flow.node
        )
        assert check.returncode == 0, check.summary()
        assert check.recap[flow.node]["changed"] > 0, check.summary()
        assert "/etc/apt/sources.list.d/nvidia-container-toolkit.sources" in check.output
        assert before_check.differences(node_snapshot.take(lab, flow.node)) == {}

        removed = run_playbook("remove.yml", flow.inventory, extra_vars=flow.extra_vars, limit=flow.node)
        assert removed.returncode == 0, removed.summary()
        assert f"Nothing the collection wrote is left on {flow.node} but what remove.yml keeps" in removed.output
        after = node_snapshot.take(lab, flow.node)
        assert leftovers(lab.fresh[flow.node].differences(after)) == {"api": (
            lab.fresh[flow.node].api, {**lab.fresh[flow.node].api, "runtimeclasses": ["nvidia"]}
        )}  # fmt: skip

        # The other node: its pod ran on through it, its GPUs are still offered, and the RuntimeClass stays for it.
        again = lab.core.read_namespaced_pod(name, "default")
        assert again.status.phase == "Running" and again.metadata.uid == pod.metadata.uid
        assert lab.allocatable(other).get(GPU) == "8"
        # The kubelet keeps a resource whose plugin went, at zero.
        assert lab.allocatable(flow.node).get(GPU) in (None, "0")

        second = run_playbook("remove.yml", flow.inventory, extra_vars=flow.extra_vars, limit=flow.node)
        assert second.returncode == 0, second.summary()
        assert second.recap[flow.node]["changed"] == 0, second.changed_tasks()
        print(
            f"remove.yml --check: {check.seconds:.0f}s, first run: {removed.seconds:.0f}s,"
            f" second: {second.seconds:.0f}s"
        )
    finally:
        delete_pod(lab, name)
