#!/usr/bin/env python
"""The cost of the dcgm-exporter metrics (docs/metrics.md) on an 8-GPU node, in one run.

Two daemon processes side by side on the nvml backend, each reading the real pynvml on the mock libnvidia-ml.so.1
(tests/mock_nvml, a TEST DOUBLE of the driver's library) for tests/fixtures/simulated/h100x8.yaml, each registered
with a kubelet double: one with the metrics off, one serving them every 15 s with eight pods holding a GPU each (the
kubelet's pod-resources API, a double). Prints, side by side: a scrape's p50/p99 (1,000 scrapes), Allocate's
p50/p99 (2,000 calls each), the daemon's CPU over BENCH_IDLE_SECONDS (60) and its RSS after it."""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(HERE, "..", "files", "device_plugin")
sys.path[:0] = [os.path.join(PLUGIN, "src"), os.path.join(PLUGIN, "tests")]

import grpc  # noqa: E402
from gpu_device_plugin.api import api_pb2, api_pb2_grpc  # noqa: E402
from kubelet_double import KubeletDouble  # noqa: E402
from mock_nvml import MockNvml  # noqa: E402
from podresources_double import PodResourcesDouble, container, pod  # noqa: E402
from proc_stats import cpu_seconds, percentile, rss_mb  # noqa: E402

SPEC = os.path.join(HERE, "..", "tests", "fixtures", "simulated", "h100x8.yaml")
GPU = "nvidia.com/gpu"
INTERVAL = "15"


class Node:
    """A kubelet double and a daemon process; with `dcgm`, the metrics on and a pod-resources double beside it."""

    def __init__(self, work: str, library: MockNvml, dcgm: bool) -> None:
        self.dir = tempfile.mkdtemp(prefix="dcgm-", dir=work)
        os.mkdir(os.path.join(self.dir, "device-plugins"))
        self.kubelet = KubeletDouble(os.path.join(self.dir, "device-plugins", "kubelet.sock"))
        self.kubelet.start()
        self.pods = PodResourcesDouble(os.path.join(self.dir, "pr.sock")).start()
        self.address = ""
        argv = [sys.executable, "-m", "gpu_device_plugin", "--backend", "nvml"]
        argv += ["--kubelet-socket", self.kubelet.socket_path, "--metrics-address", "", "--log-level", "error"]
        if dcgm:
            self.pods.pods = [pod("ml", f"train-{i}", container("main", {GPU: [self.gpu(i)]})) for i in range(8)]
            argv += ["--dcgm-metrics-address", "127.0.0.1:0", "--dcgm-interval-seconds", INTERVAL]
            argv += ["--pod-resources-socket", self.pods.socket_path, "--node-name", "bench-node"]
        env = dict(os.environ, PYTHONPATH=os.path.join(PLUGIN, "src"), **library.env())
        env["GPU_DEVICE_PLUGIN_HEALTH_FILE"] = os.path.join(self.dir, "gpu-health.json")
        self.proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def gpu(index: int) -> str:
        return f"GPU-6f1c0a3e-0000-4000-8000-00000000000{index + 1}"

    def wait_registered(self) -> None:
        assert self.kubelet.wait(lambda: self.kubelet.devices(GPU) is not None, timeout=60), "not registered"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.kubelet.stop()
        self.pods.stop()


def dcgm_port(pid: int) -> int:
    """The port the daemon's dcgm listener took (127.0.0.1:0), from the process's listening sockets."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/net/tcp") as handle:
        for line in handle.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                return int(fields[1].split(":")[1], 16)
    raise AssertionError("the daemon listens on no TCP port")


def allocate_ms(node: Node, calls: int) -> list[float]:
    ids = [d["id"] for d in node.kubelet.devices(GPU)]
    channel = grpc.insecure_channel("unix:" + os.path.join(node.dir, "device-plugins", "gpuops-nvidia.com-gpu.sock"))
    stub = api_pb2_grpc.DevicePluginStub(channel)
    samples = []
    for n in range(calls):
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[ids[n % len(ids)]])]
        )
        started = time.perf_counter()
        stub.Allocate(request, timeout=5)
        samples.append((time.perf_counter() - started) * 1000)
    channel.close()
    return samples


def main() -> int:
    seconds = float(os.environ.get("BENCH_IDLE_SECONDS", "60"))
    work = tempfile.mkdtemp(prefix="dcgm-bench-")
    library = MockNvml(SPEC, os.path.join(work, "nvml.state"))
    nodes = []
    try:
        off, on = Node(work, library, dcgm=False), Node(work, library, dcgm=True)
        nodes = [off, on]
        for node in nodes:
            node.wait_registered()
        url = f"http://127.0.0.1:{dcgm_port(on.proc.pid)}/metrics"
        # The steady state: the pods' labels, and the profiling fields, which GPM gives from the second reading on.
        deadline = time.monotonic() + 45
        while not all(
            text in urllib.request.urlopen(url, timeout=5).read()
            for text in (b'pod="train-7"', b"DCGM_FI_PROF_GR_ENGINE_ACTIVE{")
        ):
            assert time.monotonic() < deadline, "no pod labels or profiling fields in the metrics"
            time.sleep(0.2)
        body = urllib.request.urlopen(url, timeout=5).read()
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        scrapes = []
        for _scrape in range(1000):
            started = time.perf_counter()
            with urllib.request.urlopen(url, timeout=5) as reply:
                reply.read()
            scrapes.append((time.perf_counter() - started) * 1000)
        allocate = {id(node): allocate_ms(node, 2000) for node in nodes}
        # Idle, side by side: the one reads NVML and the kubelet's pod resources every 15 s.
        time.sleep(1)
        before = {id(node): cpu_seconds(node.proc.pid) for node in nodes}
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        cpu = {id(node): 100 * (cpu_seconds(node.proc.pid) - before[id(node)]) / elapsed for node in nodes}
        rss = {id(node): rss_mb(node.proc.pid) for node in nodes}
    finally:
        for node in nodes:
            node.stop()
        library.close()
        shutil.rmtree(work, ignore_errors=True)

    def both(values: dict[int, float], unit: str, digits: int) -> tuple[str, str]:
        return f"{values[id(off)]:.{digits}f} {unit}", f"{values[id(on)]:.{digits}f} {unit}"

    p50 = {k: percentile(v, 0.5) for k, v in allocate.items()}
    p99 = {k: percentile(v, 0.99) for k, v in allocate.items()}
    rows = [
        (
            f"scrape of 8 GPUs, 8 pods ({series} series, {len(body)} bytes) p50",
            "-",
            f"{percentile(scrapes, 0.5):.3f} ms",
        ),
        ("scrape p99 (1,000 scrapes)", "-", f"{percentile(scrapes, 0.99):.3f} ms"),
        ("Allocate p50 (2,000 calls)", *both(p50, "ms", 3)),
        ("Allocate p99 (2,000 calls)", *both(p99, "ms", 3)),
        (f"CPU over {seconds:.0f} s (metrics every {INTERVAL} s)", *both(cpu, "%", 3)),
        (f"RSS after {seconds:.0f} s", *both(rss, "MB", 1)),
        ("load average (1 min) while measuring", f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", "-"),
    ]
    width = max(len(r[0]) for r in rows)
    sys.stdout.write(f"{'figure':<{width}}  {'metrics off':>16}  {'metrics on':>16}\n")
    for name, first, second in rows:
        sys.stdout.write(f"{name:<{width}}  {first:>16}  {second:>16}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
