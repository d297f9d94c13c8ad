#!/usr/bin/env python
"""NVIDIA's DRA driver v0.5.0 and ours on the same simulated 8 x H100 node, in one run (prints, never asserts).

The node is tests/integration/test_dra_compared.py's: the mock libnvidia-ml.so.1 (a TEST DOUBLE of the driver's
library) serving tests/fixtures/simulated/h100x8.yaml, a sysfs double, and etcd with a kube-apiserver (the lab
package's ScratchControlPlane, that test's settings: the Node and RBAC authorizers, NodeRestriction). NVIDIA's
`gpu-kubelet-plugin` (scripts/build-nvidia-dra-driver.sh) runs with that test's flags for Node `nvidia-h100x8`
with an administrator's token; ours is the daemon as its own process in dra mode, as the role's systemd unit starts
it (nvml backend on the mock library, driver name gpu.nvidia.com, JSON logs, no metrics port) for Node
`ours-h100x8` with the node's token. Each has its own registration directory, watched by the kubelet double of the
daemon's tests (files/device_plugin/tests/dra_kubelet_double.py), which registers the plugin and calls it over its
DRA unix socket with the kubelet's v1 stubs. Figures, each for both:

- process start -> its ResourceSlice readable from the API server (one start each, one at a time);
- NodePrepareResources and NodeUnprepareResources of a one-GPU claim (`gpu-0`, freshly allocated each round:
  created through the API with its allocation written through the status subresource, as the scheduler does, and
  for ours a pod bound to the node that uses it, so the Node authorizer lets the node read it), p50 / p99 over
  `--rounds` rounds (default 100) after 5 not counted; the two plugins measured one after the other;
- RSS after the calls and the CPU used over `--idle` seconds (default 10) of idling, both running.

NVIDIA's plugin limits its own API requests (client-go's QPS 5, burst 10 by default) and reads the claim from the
API server in every NodePrepareResources, so back-to-back calls past the burst wait for that limiter;
`--nvidia-qps N` raises its limit to N (its flags --kube-api-qps and --kube-api-burst) to show the call's own cost.
Ours has no client-side limit. Needs root (the device nodes are made with mknod).
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
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
sys.path[:0] = [str(HERE), str(PLUGIN / "src"), str(PLUGIN / "tests"), str(ROOT / "tests" / "integration")]

import dra_claims  # noqa: E402
import test_dra_compared as compared  # noqa: E402
from dra_kubelet_double import PluginWatcherDouble  # noqa: E402
from gpu_device_plugin.dra.kubeapi import KubeApi  # noqa: E402
from kubernetes import client, config  # noqa: E402
from local_api import ScratchControlPlane, wait_for  # noqa: E402
from proc_stats import cpu_seconds, percentile, rss_mb  # noqa: E402

SHAPE = "h100x8"
DRIVER = compared.DRIVER
NAMESPACE = "dra-compared-bench"
DEVICE_CLASS = "dra-compared-bench"
WARMUP = 5
NVIDIA, OURS = "NVIDIA's", "ours"


class Claims:
    """Allocated one-GPU claims through the administrator's client."""

    def __init__(self, admin: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(admin)
        self.core = client.CoreV1Api(admin)
        self.count = 0
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        self.core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
        dra_claims.device_class(self.custom, DEVICE_CLASS, DRIVER)

    def allocated(self, node: str, device: str, pod: bool) -> tuple[str, str, str]:
        """A claim allocated `device` of `node`'s pool (and a pod on `node` using it): (namespace, name, uid)."""
        self.count += 1
        name = f"claim-{self.count}"
        claim = dra_claims.allocated_claim(self.custom, (NAMESPACE, name), DEVICE_CLASS, (DRIVER, node), [device])
        if pod:
            dra_claims.claim_pod(self.core, (NAMESPACE, name), f"pod-{self.count}", node)
        return NAMESPACE, name, claim["metadata"]["uid"]


def device_nodes(node: compared.GpuNode) -> None:
    """/dev under the driver root, which NVIDIA's driver then takes as its device root: the GPUs' and the control
    device nodes, made with mknod (nothing opens them), for the CDI spec it writes for a claim."""
    dev = node.driver_root / "dev"
    dev.mkdir()
    nodes = {f"nvidia{gpu.get('minor_number', n)}": (195, n) for n, gpu in enumerate(node.spec["gpus"])}
    nodes.update({"nvidiactl": (195, 255), "nvidia-uvm": (235, 0), "nvidia-uvm-tools": (235, 1)})
    for name, (major, minor) in nodes.items():
        os.mknod(dev / name, 0o20666, os.makedev(major, minor))


def start_ours(node: compared.GpuNode, work: Path, kubeconfig: str, log: IO[str]) -> subprocess.Popen:
    """The daemon as the role's systemd unit starts it in dra mode, on the mock library."""
    argv = [sys.executable, "-m", "gpu_device_plugin", "--backend", "nvml", "--allocation-mode", "dra"]
    argv += ["--kubelet-socket", str(work / "device-plugins" / "kubelet.sock"), "--device-list-strategy", "envvar"]
    argv += ["--log-format", "json", "--metrics-address", "", "--driver-name", DRIVER]
    argv += ["--plugin-registry-dir", str(work / "registry"), "--kubelet-plugins-dir", str(work / "plugins")]
    argv += ["--cdi-dir", str(work / "cdi"), "--node-name", f"ours-{SHAPE}", "--kubeconfig", kubeconfig]
    env = {
        "PYTHONPATH": str(PLUGIN / "src"),
        "PATH": "/usr/bin:/bin",
        "GRPC_VERBOSITY": "ERROR",
        "GPU_DEVICE_PLUGIN_HEALTH_FILE": str(work / "gpu-health.json"),
        "LD_LIBRARY_PATH": str(compared.mock_library_dir()),
        compared.STATE_VARIABLE: str(node.state),
    }
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def measure(kubelet: PluginWatcherDouble, claims: list[tuple[str, str, str]]) -> tuple[list[float], list[float]]:
    prepare, unprepare = [], []
    for n, claim in enumerate(claims):
        uid = claim[2]
        started = time.perf_counter()
        answer = kubelet.prepare(DRIVER, [claim])[uid]
        prepared_ms = (time.perf_counter() - started) * 1000
        assert answer.error == "" and len(answer.devices) == 1, answer
        started = time.perf_counter()
        errors = kubelet.unprepare(DRIVER, [claim])
        unprepared_ms = (time.perf_counter() - started) * 1000
        assert errors == {uid: ""}, errors
        if n >= WARMUP:
            prepare.append(prepared_ms)
            unprepare.append(unprepared_ms)
    return prepare, unprepare


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=100, help="one-GPU claims prepared per driver (default 100)")
    parser.add_argument(
        "--nvidia-qps",
        type=int,
        default=0,
        help="NVIDIA's client-side API rate limit (--kube-api-qps and --kube-api-burst); default: its own, 5 and 10",
    )
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idling measured (default 10)")
    args = parser.parse_args()
    begun = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ddc-"))
    ours_dir = work / "ours"
    for directory in ("registry", "plugins", "cdi", "device-plugins"):
        (ours_dir / directory).mkdir(parents=True)
    sys.stderr.write("starting etcd and kube-apiserver (waits for a Kubernetes build in progress)\n")
    plane = ours = nvidia = None
    kubelets: dict[str, PluginWatcherDouble] = {}
    log = open(ours_dir / "log", "w")  # noqa: SIM115 - kept open for the daemon's lifetime
    started: dict[str, float] = {}
    results: dict[str, tuple[list[float], list[float]]] = {}
    idle: dict[str, tuple[float, float]] = {}
    try:
        compared.nvidia_plugin()  # built (or cached) before anything is timed
        bin_dir = subprocess.run(
            [str(ROOT / "tests/e2e/build-kubernetes.sh")], check=True, capture_output=True, text=True, timeout=3600
        ).stdout.strip()
        plane = ScratchControlPlane(work / "control-plane", Path(bin_dir))
        plane.start(compared.API_SERVER)
        admin_kubeconfig = str(plane.kubeconfig(work / "admin.conf", token=compared.ADMIN_TOKEN))
        admin = config.new_client_from_config(admin_kubeconfig)
        custom = client.CustomObjectsApi(admin)
        for name in (f"nvidia-{SHAPE}", f"ours-{SHAPE}"):
            client.CoreV1Api(admin).create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        node = compared.GpuNode(SHAPE, work / "node")
        device_nodes(node)
        node_kubeconfig = str(plane.kubeconfig(work / "node.conf", token=compared.node_token(SHAPE)))

        t0 = time.monotonic()
        limit = (f"--kube-api-qps={args.nvidia_qps}", f"--kube-api-burst={args.nvidia_qps}") if args.nvidia_qps else ()
        nvidia = compared.NvidiaPlugin(node, admin_kubeconfig, limit)
        wait_for("NVIDIA's slice", lambda: compared.pool(custom, f"nvidia-{SHAPE}"), 60, 0.02)
        started[NVIDIA] = time.monotonic() - t0
        t0 = time.monotonic()
        ours = start_ours(node, ours_dir, node_kubeconfig, log)
        wait_for("our slice", lambda: compared.pool(custom, f"ours-{SHAPE}"), 60, 0.02)
        started[OURS] = time.monotonic() - t0

        kubelets[NVIDIA] = PluginWatcherDouble(str(node.dir / "nvidia" / "registry")).start()
        kubelets[OURS] = PluginWatcherDouble(str(ours_dir / "registry")).start()
        for kind, kubelet in kubelets.items():
            if not kubelet.wait(lambda k=kubelet: DRIVER in k.plugins, timeout=60):
                raise RuntimeError(f"{kind} plugin did not register: {kubelet.errors}")

        claims = Claims(admin)
        batches = {
            NVIDIA: [claims.allocated(f"nvidia-{SHAPE}", "gpu-0", pod=False) for _round in range(WARMUP + args.rounds)],
            OURS: [claims.allocated(f"ours-{SHAPE}", "gpu-0", pod=True) for _round in range(WARMUP + args.rounds)],
        }
        node_api = KubeApi(node_kubeconfig)
        # The Node authorizer learns of the pods from a watch: wait until the node may read the last claim.
        last = batches[OURS][-1]
        wait_for("the Node authorizer to learn of the pods", lambda: node_api.get_resource_claim(*last[:2]), 60)
        node_api.close()
        for kind in (NVIDIA, OURS):
            results[kind] = measure(kubelets[kind], batches[kind])

        pids = {NVIDIA: nvidia.process.pid, OURS: ours.pid}
        before = {kind: cpu_seconds(pid) for kind, pid in pids.items()}
        time.sleep(args.idle)
        idle = {kind: (rss_mb(pid), cpu_seconds(pid) - before[kind]) for kind, pid in pids.items()}
        load = os.getloadavg()
        admin.close()
    finally:
        for kubelet in kubelets.values():
            kubelet.stop()
        if nvidia is not None:
            nvidia.kill()
        if ours is not None:
            ours.terminate()
            ours.wait(30)
        log.close()
        if plane is not None:
            plane.stop()
        shutil.rmtree(work, ignore_errors=True)

    rows = [("start -> slice published (s)", {k: f"{v:.2f}" for k, v in started.items()})]
    for label, index in (("NodePrepareResources", 0), ("NodeUnprepareResources", 1)):
        for q in (0.5, 0.99):
            rows.append(
                (f"{label} p{round(q * 100)} (ms)", {k: f"{percentile(v[index], q):.2f}" for k, v in results.items()})
            )
    rows.append(("RSS (MiB)", {k: f"{v[0]:.1f}" for k, v in idle.items()}))
    rows.append((f"CPU over {args.idle:.0f} s idle (s)", {k: f"{v[1]:.2f}" for k, v in idle.items()}))
    width = max(len(r[0]) for r in rows)
    rate = f"{args.nvidia_qps} QPS, burst {args.nvidia_qps}" if args.nvidia_qps else "its own (5 QPS, burst 10)"
    sys.stdout.write(f"{'8 x H100, one-GPU claims':<{width}}  {NVIDIA:>10}  {OURS:>10}\n")
    for name, values in rows:
        sys.stdout.write(f"{name:<{width}}  {values[NVIDIA]:>10}  {values[OURS]:>10}\n")
    sys.stdout.write(
        f"NVIDIA's API rate limit: {rate};"
        f" {args.rounds} rounds each after {WARMUP} not counted; load average (1/5/15 min) after measuring:"
        f" {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} CPUs;"
        f" whole bench {time.monotonic() - begun:.0f} s\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
