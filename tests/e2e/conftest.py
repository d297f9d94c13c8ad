"""Fixtures of the end-to-end tier: a real Kubernetes lab (tests/e2e/lab.py).

The session fixture ``lab`` brings the lab up once (etcd, kube-apiserver, and GPU node containers
running containerd and the kubelet), hands tests a :class:`Lab` and takes it down at the end, unless
``GPUOPS_LAB_KEEP=1`` is set. Later flows (the collection's site.yml against the node containers, the
device plugin advertising ``nvidia.com/gpu``) build on the same handle: the admin kubeconfig, the node
container names, ``node_exec`` and ``allocatable``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import node_snapshot
import pytest
import yaml
from gpuops_lab.config import LabConfig
from kubernetes import client, config
from prometheus_lab import Prometheus

LAB_PY = Path(__file__).resolve().parent / "lab.py"
PAUSE_IMAGE = "localhost/gpuops-lab-pause:1.0"
KUBELET_CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
KUBERNETES_VERSION = os.environ.get("GPUOPS_K8S_VERSION", "v1.37.2")


class LabCommandFailed(Exception):
    """``lab.py`` failed; the message starts with its last words, so a one-line test summary says why."""


def run_lab(*args: str, timeout: float = 1800) -> str:
    """Run ``lab.py ARGS`` and return its stdout. Its progress messages are printed after it ends (pytest shows
    them with a failing test); when it fails, the exception's first line is its last message and the rest the
    last 40 lines of its progress."""
    done = subprocess.run([str(LAB_PY), *args], check=False, capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["(no message)"]
        raise LabCommandFailed(
            f"lab.py {' '.join(args)} failed (exit {done.returncode}): {lines[-1]}\n" + "\n".join(lines[-40:])
        )
    return done.stdout


@dataclass
class Lab:
    """A running lab: what a test needs to drive the cluster and its nodes."""

    kubeconfig: Path
    nodes: list[str]
    api: client.ApiClient = field(repr=False)
    # Each node as `up` made it, before any test touched it (node_snapshot.py): what remove.yml must give back.
    fresh: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def node_exec(
        self, node: str, *argv: str, check: bool = True, timeout: float = 120, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside a node container (``podman exec``, as root: the tests' own access to the
        node, not the playbooks' way in) and return the result; ``input_text`` goes to its stdin."""
        return subprocess.run(
            ["podman", "exec", *(["-i"] if input_text is not None else []), node, *argv],
            check=check,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
        )

    def node(self, name: str) -> client.V1Node:
        return self.core.read_node(name)

    def allocatable(self, node: str) -> dict[str, str]:
        """The node's status.allocatable as the API server has it (e.g. ``nvidia.com/gpu``)."""
        return dict(self.node(node).status.allocatable or {})

    def wait_until(self, what: str, predicate: Callable[[], Any], timeout: float = 120, interval: float = 0.5) -> Any:
        """Poll ``predicate`` until it returns something truthy; fail with ``what`` on timeout."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                result = predicate()
            except client.ApiException as error:
                last_error = error
                result = None
            if result:
                return result
            time.sleep(interval)
        pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})")

    def terminating_pods(self, node: str) -> list[str]:
        """``namespace/name`` of the node's pods that are being deleted (the kubelet still tearing them down)."""
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        return [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if p.metadata.deletion_timestamp]

    def wait_pods_gone(self, node: str, timeout: float = 180) -> None:
        """Wait until no pod on the node is being deleted: a pod's teardown (its sandbox's network, its volumes)
        writes on the node, so a test that looks at what changed on the node starts after it."""
        self.wait_until(f"no terminating pod on {node}", lambda: not self.terminating_pods(node), timeout=timeout)

    def node_ready(self, node: str, since: datetime | None = None) -> bool:
        """Whether the node is Ready, optionally by a kubelet heartbeat at or after ``since``."""
        conditions = self.node(node).status.conditions or []
        if since is not None and since.microsecond:
            # Heartbeats have whole seconds: round up so one from before `since` never counts.
            since = since.replace(microsecond=0) + timedelta(seconds=1)
        return any(
            c.type == "Ready" and c.status == "True" and (since is None or c.last_heartbeat_time >= since)
            for c in conditions
        )

    def checkpoint_devices(self, node: str, pod_uid: str, resource: str = "nvidia.com/gpu") -> list[str]:
        """The device IDs the kubelet's device manager checkpointed for a pod once Allocate answered."""
        data = json.loads(self.node_exec(node, "cat", KUBELET_CHECKPOINT).stdout)["Data"]
        ids: list[str] = []
        for entry in data.get("PodDeviceEntries") or []:
            if entry["PodUID"] == pod_uid and entry["ResourceName"] == resource:
                device_ids = entry["DeviceIDs"]
                # Since 1.20 a map NUMA node -> IDs; a plain list before.
                ids += (
                    [i for group in device_ids.values() for i in group] if isinstance(device_ids, dict) else device_ids
                )
        return ids

    def restart_kubelet(self, node: str) -> datetime:
        """Restart the node's kubelet service; returns when it was restarted (UTC)."""
        when = datetime.now(timezone.utc)
        self.node_exec(node, "systemctl", "restart", "kubelet")
        return when


def nvlink_peers(spec: Path) -> dict[str, set[str]]:
    """GPU UUID -> its NVLink peers, from a simulated-GPU spec (a peer relation is symmetric)."""
    peers: dict[str, set[str]] = {}
    for gpu in yaml.safe_load(spec.read_text(encoding="utf-8"))["gpus"]:
        for peer in gpu.get("nvlink_peers", []):
            peers.setdefault(gpu["uuid"], set()).add(peer)
            peers.setdefault(peer, set()).add(gpu["uuid"])
    return peers


def container_environment(lab: Lab, node: str, container_id: str) -> dict[str, str]:
    """The environment of the container's process, read from /proc in the node."""
    raw = lab.node_exec(node, "cat", f"/proc/{container_pid(lab, node, container_id)}/environ").stdout
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def container_pid(lab: Lab, node: str, container_id: str) -> str:
    """The PID, in the node, of the container's process."""
    for line in lab.node_exec(node, "ctr", "-n", "k8s.io", "tasks", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == container_id:
            return fields[1]
    raise AssertionError(f"container {container_id} is not running in {node}")


def container_nvidia_devices(lab: Lab, node: str, container_id: str) -> list[str]:
    """The NVIDIA device nodes in the container's /dev, as 'name major:minor' (hex, as stat prints them)."""
    pid = container_pid(lab, node, container_id)
    listed = lab.node_exec(
        node, "sh", "-c", f"cd /proc/{pid}/root/dev && stat -c '%n %t:%T' nvidia* 2>/dev/null", check=False
    ).stdout
    return sorted(listed.split("\n")[:-1]) if listed else []


def gpu_device_nodes(spec: Path, uuids: list[str]) -> list[str]:
    """What a container given these GPUs of the spec must see in its /dev: their nodes (195:minor, the minor
    being the GPU's index) and the control nodes as the lab makes them (nvidia-uvm's major is the lab's 511)."""
    minors = {gpu["uuid"]: index for index, gpu in enumerate(yaml.safe_load(spec.read_text())["gpus"])}
    wanted = [f"nvidia{minors[u]} c3:{minors[u]:x}" for u in uuids]
    wanted += ["nvidiactl c3:ff", "nvidia-uvm 1ff:0", "nvidia-uvm-tools 1ff:1"]
    return sorted(wanted)


def running_pod(lab: Lab, name: str, timeout: float = 120, namespace: str = "default") -> client.V1Pod:
    """Wait for the pod to run; return it."""
    return lab.wait_until(
        f"pod {name} Running",
        lambda: (p := lab.core.read_namespaced_pod(name, namespace)).status.phase == "Running" and p,
        timeout=timeout,
    )


def recovery_vars(path: Path) -> Path:
    """Write site.yml's extra vars for the GPU flows to ``path``: the plugin's config with health recovery on
    (off by default, as in NVIDIA's plugin) after 1 quiet second, so that a GPU an XID marked unhealthy can
    come back within a test; and the device nodes passed to the kubelet (passDeviceSpecs), as NVIDIA's plugin
    does with the same setting (the nvidia runtime in CDI mode adds the same nodes from nvidia-ctk's spec)."""
    config = {
        "version": "v1",
        "flags": {"migStrategy": "none", "plugin": {"passDeviceSpecs": True}},
        "gpuops": {"healthRecoverySeconds": 1},
    }
    path.write_text(yaml.safe_dump({"device_plugin_config": config}))
    return path


def write_in_place(path: Path, text: str) -> None:
    """Rewrite a file without a rename: nodes and pods see simulated specs through bind mounts of their directory."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_xid(spec: Path, index: int, xid: int | None) -> str:
    """Write (or clear) GPU INDEX's XID in a node's simulated spec, in place: the mock library delivers it to the
    daemon as an NVML XID event. Returns the GPU's UUID."""
    data = yaml.safe_load(spec.read_text())
    gpu = data["gpus"][index]
    if xid is None:
        gpu.pop("xid", None)
    else:
        gpu["xid"] = xid
    write_in_place(spec, yaml.safe_dump(data, sort_keys=False))
    return gpu["uuid"]


def container_restarts(node: str) -> int:
    """How many times podman started the node's container again (its restart policy: a reboot in the node)."""
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{.RestartCount}}", node], check=True, capture_output=True, text=True
    ).stdout
    return int(out.strip())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "last_in_session: run after every other test of the session")
    config.addinivalue_line("markers", "full: exhaustive; runs under `make test-full` (GPUOPS_TEST_FULL=1) only")


def full_suite() -> bool:
    """`make test-full` (GPUOPS_TEST_FULL=1): every exhaustive case one by one, as well as what `make test` runs."""
    return os.environ.get("GPUOPS_TEST_FULL") == "1"


_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds each phase's time (the lab's bring-up counts for the test that first needed it) to its module."""
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The minutes of each module, so the tier's share of CI's budget is visible at every run."""
    if not _MODULE_SECONDS:
        return
    terminalreporter.write_sep("-", "e2e minutes per module")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds / 60:6.1f}  {module}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``last_in_session`` run at the end, on the lab the rest of the tier left behind. Tests marked
    ``full`` are left out of `make test` (reported as deselected) and run under `make test-full`."""
    if not full_suite():
        left_out = [item for item in items if item.get_closest_marker("full") is not None]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if item.get_closest_marker("full") is None]
    items.sort(key=lambda item: item.get_closest_marker("last_in_session") is not None)


def lab_instance() -> int:
    """Which lab (``GPUOPS_LAB_INSTANCE``, 0-4): several can run side by side (tests/e2e/lab.py)."""
    return int(os.environ.get("GPUOPS_LAB_INSTANCE", "0"))


def lab_node_count() -> int:
    return int(os.environ.get("GPUOPS_LAB_NODES", "2"))


@pytest.fixture(scope="session")
def prometheus(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus scraping the daemon's dcgm metrics on every lab node (their ports: the lab inventory's
    device_plugin_dcgm_metrics_address), from the first test that asks for it to the end of the session."""
    cfg = LabConfig.from_env()
    targets = {node: f"127.0.0.1:{cfg.dcgm_port(index)}" for index, node in enumerate(lab.nodes, start=1)}
    server = Prometheus(tmp_path_factory.mktemp("prometheus"), targets).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """The lab, up for the whole session (``GPUOPS_LAB_KEEP=1`` leaves it running afterwards)."""
    keep = os.environ.get("GPUOPS_LAB_KEEP") == "1"
    if not keep:
        # Nothing left from an earlier session (an interrupted run, or a cache restored from another machine) is
        # reused: the session starts from no lab.
        run_lab("down", timeout=300)
    try:
        run_lab("up", str(lab_node_count()))
        kubeconfig = Path(run_lab("kubeconfig").strip())
        nodes = run_lab("nodes").split()
        api = config.new_client_from_config(config_file=str(kubeconfig))
        lab = Lab(kubeconfig=kubeconfig, nodes=nodes, api=api)
        # The nodes as a machine with NVIDIA's driver is before the collection touches it: the lab's simulated GPUs
        # and stand-in driver given (what every module's `inventory` gives them first), no playbook run yet.
        run_lab("inventory")
        lab.fresh = {node: node_snapshot.take(lab, node) for node in nodes}
        yield lab
        api.close()
    finally:
        if not keep:
            run_lab("down", timeout=300)
