#!/usr/bin/env python
"""NodePrepareResources latency of the daemon in dra mode on a simulated 8 x H100 node
(tests/fixtures/simulated/h100x8.yaml), for claims of 1 device and of 8 devices.

Every peer a real call touches is real. etcd and a kube-apiserver (built by tests/e2e/build-kubernetes.sh,
which waits for a build in progress) are started by the lab package's ScratchControlPlane
(tests/e2e/gpuops_lab/controlplane.py) with tests/integration/test_dra_api.py's settings: the Node authorizer
and NodeRestriction on. The daemon runs as its own process with the arguments the role's systemd unit gives
it in dra mode (the node's own credentials, JSON logs; no config file, which would hold only defaults here,
and no metrics port); it reads each ResourceClaim from the API server as system:node:<name>, writes the
claim's CDI spec and the checkpoint, and answers over its DRA unix socket. The kubelet side is the
plugin-watcher double of the daemon's tests (dra_kubelet_double), which registers the plugin and sends the
calls as a kubelet does.

Each round: an allocated ResourceClaim is created through the API (its allocation written through the
status subresource, as the scheduler does) with a pod bound to the node that uses it (so the Node
authorizer lets the node read it; claims and pods are created in a batch before the timed calls), then
NodePrepareResources is timed, the spec and checkpoint are checked, and NodeUnprepareResources is timed.
A few warm-up rounds are not counted. The figures are printed, never asserted; the target in the table is
the issue's (p99 < 50 ms). `--rounds N` sets the rounds per claim size (default 200).
Ports: free ones above every lab instance's (controlplane.free_port_offset)."""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLUGIN = ROOT / "files" / "device_plugin"
sys.path[:0] = [str(PLUGIN / "src"), str(PLUGIN / "tests"), str(ROOT / "tests" / "integration")]

import dra_claims  # noqa: E402
import test_dra_api as dra_api  # noqa: E402
from dra_kubelet_double import PluginWatcherDouble  # noqa: E402
from gpu_device_plugin.dra import cdi  # noqa: E402
from gpu_device_plugin.dra.kubeapi import KubeApi  # noqa: E402
from kubernetes import client  # noqa: E402
from local_api import ScratchControlPlane, wait_for  # noqa: E402
from proc_stats import percentile  # noqa: E402

NODE = dra_api.NODE
DRIVER = dra_api.DRIVER
NAMESPACE = "dra-bench"
DEVICE_CLASS = "gpu.gpuops.k8s"
SPEC = ROOT / "tests" / "fixtures" / "simulated" / "h100x8.yaml"
GPUS = [f"gpu-{i}" for i in range(8)]
WARMUP = 5
TARGET_P99_MS = 50.0


class Cluster:
    """The admin's view of the API server: the DeviceClass, the namespace, claims and their pods."""

    def __init__(self, admin: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(admin)
        self.core = client.CoreV1Api(admin)
        self.claims = 0

    def prepare_namespace(self) -> None:
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        # No controller-manager runs to create it; pods need it.
        self.core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
        dra_claims.device_class(self.custom, DEVICE_CLASS, DRIVER)

    def allocated_claim(self, devices: list[str]) -> tuple[str, str, str]:
        """An allocated claim for `devices` of NODE and a pod on NODE that uses it: (namespace, name, uid)."""
        self.claims += 1
        name = f"claim-{self.claims}"
        claim = dra_claims.allocated_claim(self.custom, (NAMESPACE, name), DEVICE_CLASS, (DRIVER, NODE), devices)
        dra_claims.claim_pod(self.core, (NAMESPACE, name), f"pod-{self.claims}", NODE)
        return NAMESPACE, name, claim["metadata"]["uid"]


def start_daemon(work: Path, kubeconfig: str, log: IO[str]) -> subprocess.Popen:
    """The daemon as the role's systemd unit starts it in dra mode (simulated backend, no metrics port)."""
    argv = [
        sys.executable,
        "-m",
        "gpu_device_plugin",
        "--backend",
        "simulated",
        "--kubelet-socket",
        str(work / "device-plugins" / "kubelet.sock"),
        "--device-list-strategy",
        "envvar",
        "--log-format",
        "json",
        "--simulated-spec",
        str(work / "gpus.yaml"),
        "--metrics-address",
        "",
        "--allocation-mode",
        "dra",
        "--driver-name",
        DRIVER,
        "--plugin-registry-dir",
        str(work / "registry"),
        "--kubelet-plugins-dir",
        str(work / "plugins"),
        "--cdi-dir",
        str(work / "cdi"),
        "--node-name",
        NODE,
        "--kubeconfig",
        kubeconfig,
    ]
    env = {
        "PYTHONPATH": str(PLUGIN / "src"),
        "PATH": "/usr/bin:/bin",
        "GRPC_VERBOSITY": "ERROR",
        "GPU_DEVICE_PLUGIN_HEALTH_FILE": str(work / "gpu-health.json"),
    }
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def measure(
    kubelet: PluginWatcherDouble, cluster: Cluster, work: Path, devices: int, rounds: int, node_api: KubeApi
) -> tuple[list[float], list[float]]:
    """Prepare and unprepare `rounds` fresh claims of `devices` devices: the latencies in ms."""
    claims = [cluster.allocated_claim([GPUS[(n + k) % 8] for k in range(devices)]) for n in range(WARMUP + rounds)]
    # The Node authorizer learns of the pods from a watch: wait until the node may read the last claim.
    wait_for(
        "the Node authorizer to learn of the pods",
        lambda: _readable(node_api, claims[-1]) and _readable(node_api, claims[0]),
        60,
    )
    checkpoint = work / "plugins" / DRIVER / "checkpoint.json"
    prepare, unprepare = [], []
    for n, claim in enumerate(claims):
        uid = claim[2]
        started = time.perf_counter()
        answer = kubelet.prepare(DRIVER, [claim])[uid]
        prepared_ms = (time.perf_counter() - started) * 1000
        assert answer.error == "", answer.error
        assert len(answer.devices) == devices, answer
        assert os.path.exists(cdi.spec_path(str(work / "cdi"), uid)), "no CDI spec was written"
        assert uid in json.loads(checkpoint.read_text())["claims"], "the checkpoint does not have the claim"
        started = time.perf_counter()
        errors = kubelet.unprepare(DRIVER, [claim])
        unprepared_ms = (time.perf_counter() - started) * 1000
        assert errors == {uid: ""}, errors
        assert not os.path.exists(cdi.spec_path(str(work / "cdi"), uid)), "the CDI spec was not removed"
        if n >= WARMUP:
            prepare.append(prepared_ms)
            unprepare.append(unprepared_ms)
    return prepare, unprepare


def filesystem(path: Path) -> str:
    """The type of the filesystem `path` is on (fsync costs differ: a node's /var/run/cdi is tmpfs)."""
    best, kind = "", "?"
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            mountpoint = fields[1]
            inside = str(path) == mountpoint or str(path).startswith(mountpoint.rstrip("/") + "/")
            if inside and len(mountpoint) >= len(best):
                best, kind = mountpoint, fields[2]
    return kind


def _readable(node_api: KubeApi, claim: tuple[str, str, str]) -> bool:
    try:
        return node_api.get_resource_claim(claim[0], claim[1]) is not None
    except OSError:
        return False


def claim_get_alone(node_api: KubeApi, claim: tuple[str, str, str], calls: int) -> list[float]:
    """The API server's share: the same GET the daemon makes, with the same client and identity."""
    samples = []
    for _call in range(calls):
        started = time.perf_counter()
        node_api.get_resource_claim(claim[0], claim[1])
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=200, help="claims prepared per claim size (default 200)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    begun = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gdra-bench-"))
    work_fs = filesystem(work)
    for directory in ("registry", "plugins", "cdi", "device-plugins"):
        (work / directory).mkdir()
    shutil.copyfile(SPEC, work / "gpus.yaml")
    sys.stderr.write("starting etcd and kube-apiserver (waits for a Kubernetes build in progress)\n")
    plane = daemon = None
    kubelet = PluginWatcherDouble(str(work / "registry"))
    log = open(work / "daemon.log", "w")  # noqa: SIM115 - kept open for the daemon's lifetime
    try:
        bin_dir = subprocess.run(
            [str(ROOT / "tests/e2e/build-kubernetes.sh")], check=True, capture_output=True, text=True, timeout=3600
        ).stdout.strip()
        plane = ScratchControlPlane(work / "control-plane", Path(bin_dir))
        plane.start(dra_api.API_SERVER)
        cluster = Cluster(dra_api.admin_client(plane))
        cluster.prepare_namespace()
        node_kubeconfig = str(plane.kubeconfig(work / "node.conf", token=dra_api.NODE_TOKEN))
        node_api = KubeApi(node_kubeconfig)
        daemon = start_daemon(work, node_kubeconfig, log)
        kubelet.start()
        if not kubelet.wait(lambda: DRIVER in kubelet.plugins, timeout=60):
            raise RuntimeError(
                "the daemon did not register: " + (work / "daemon.log").read_text()[-2000:] + str(kubelet.errors)
            )
        started_at = time.monotonic() - begun
        sys.stderr.write(f"daemon registered {started_at:.0f} s after the start; measuring\n")

        results = {}
        for devices in (1, 8):
            results[devices] = measure(kubelet, cluster, work, devices, args.rounds, node_api)
        last = (NAMESPACE, f"claim-{cluster.claims}", "")
        get_alone = claim_get_alone(node_api, last, args.rounds)
        load = os.getloadavg()
        assert daemon.poll() is None, "the daemon exited"
        node_api.close()
    finally:
        kubelet.stop()
        if daemon is not None:
            daemon.terminate()
            daemon.wait(30)
        log.close()
        if plane is not None:
            plane.stop()
        shutil.rmtree(work, ignore_errors=True)

    header = ("call", "devices", "n", "p50 ms", "p99 ms", "max ms", "target p99")
    rows = []
    for devices, (prepare, _unprepare) in results.items():
        rows.append(("NodePrepareResources", devices, prepare, f"< {TARGET_P99_MS:.0f} ms"))
    for devices, (_prepare, unprepare) in results.items():
        rows.append(("NodeUnprepareResources", devices, unprepare, "-"))
    rows.append(("ResourceClaim GET alone", "-", get_alone, "-"))
    width = max(len(r[0]) for r in rows)
    sys.stdout.write(
        f"{header[0]:<{width}}  {header[1]:>7}  {header[2]:>5}  {header[3]:>8}  {header[4]:>8}  {header[5]:>8}"
        f"  {header[6]}\n"
    )
    for name, devices, samples, target in rows:
        sys.stdout.write(
            f"{name:<{width}}  {devices!s:>7}  {len(samples):>5}  {percentile(samples, 0.5):>8.2f}"
            f"  {percentile(samples, 0.99):>8.2f}  {max(samples):>8.2f}  {target}\n"
        )
    sys.stdout.write(
        f"load average (1/5/15 min) after measuring: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
        f" on {os.cpu_count()} CPUs; whole bench {time.monotonic() - begun:.0f} s\n"
        f"CDI specs and checkpoint written (with fsync) on {work_fs}"
        " (on a node the checkpoint is under /var/lib/kubelet, /var/run/cdi is usually tmpfs)\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
