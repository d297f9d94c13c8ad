#!/usr/bin/env python
"""Device-plugin figures on an 8-GPU simulated node (tests/fixtures/simulated/h100x8.yaml).

Runs the real daemon as a process against the kubelet double over unix-socket gRPC and prints:
Allocate latency p50/p99 over 5,000 calls (median of 3 runs), time from an XID written into the spec
to the ListAndWatch update, time to re-register after a kubelet restart, and RSS and CPU of the idle
daemon over 60 s (BENCH_IDLE_SECONDS to change). Targets: p99 < 2 ms, event < 1 s, re-register < 2 s,
RSS < 60 MB, idle CPU < 0.5 %."""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(HERE, "..", "files", "device_plugin")
sys.path[:0] = [os.path.join(PLUGIN, "src"), os.path.join(PLUGIN, "tests")]

import grpc  # noqa: E402
import yaml  # noqa: E402
from gpu_device_plugin.api import api_pb2, api_pb2_grpc  # noqa: E402
from kubelet_double import KubeletDouble  # noqa: E402
from proc_stats import cpu_seconds, percentile, rss_mb  # noqa: E402

SPEC = os.path.join(HERE, "..", "tests", "fixtures", "simulated", "h100x8.yaml")
GPU = "nvidia.com/gpu"
CALLS = 5000


def wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.0005)
    return False


def write_spec(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as handle:
        yaml.safe_dump(data, handle, sort_keys=False)
    os.replace(path + ".tmp", path)


def main() -> int:
    idle_seconds = float(os.environ.get("BENCH_IDLE_SECONDS", "60"))
    work = tempfile.mkdtemp(prefix="gdp-bench-")
    spec_path = os.path.join(work, "gpus.yaml")
    with open(SPEC) as handle:
        spec = yaml.safe_load(handle)
    write_spec(spec_path, spec)
    # The kubelet wipes its directory on restart: the spec lives beside it, not in it.
    os.mkdir(os.path.join(work, "device-plugins"))
    kubelet = KubeletDouble(os.path.join(work, "device-plugins", "kubelet.sock"))
    kubelet.start()
    env = dict(
        os.environ,
        PYTHONPATH=os.path.join(PLUGIN, "src"),
        GPU_DEVICE_PLUGIN_HEALTH_FILE=os.path.join(work, "gpu-health.json"),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_device_plugin",
            "--backend",
            "simulated",
            "--simulated-spec",
            spec_path,
            "--kubelet-socket",
            kubelet.socket_path,
            "--health-recovery-seconds",
            "0",
            "--metrics-address",
            "",
            "--log-level",
            "error",
        ],
        env=env,
    )
    try:
        assert kubelet.wait(lambda: kubelet.devices(GPU) is not None, timeout=30), "the daemon did not register"
        ids = [d["id"] for d in kubelet.devices(GPU)]

        # Allocate latency, as the kubelet calls it: one container, one GPU, over the plugin's socket.
        channel = grpc.insecure_channel("unix:" + os.path.join(work, "device-plugins", "gpuops-nvidia.com-gpu.sock"))
        stub = api_pb2_grpc.DevicePluginStub(channel)
        # Baseline: the cost of any round trip on this machine (an RPC that does nothing).
        base = []
        for _call in range(CALLS):
            started = time.perf_counter()
            stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
            base.append((time.perf_counter() - started) * 1000)
        runs = []
        for _run in range(3):
            samples = []
            for n in range(CALLS):
                request = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[ids[n % len(ids)]])]
                )
                started = time.perf_counter()
                stub.Allocate(request, timeout=5)
                samples.append((time.perf_counter() - started) * 1000)
            runs.append((percentile(samples, 0.5), percentile(samples, 0.99)))
        channel.close()
        p50 = statistics.median(r[0] for r in runs)
        p99 = statistics.median(r[1] for r in runs)

        # XID written into the spec -> the ListAndWatch update reaches the kubelet.
        endpoint = kubelet.endpoints[GPU]
        event_times = []
        for n in range(10):
            gpu = spec["gpus"][n % 8]
            gpu["xid"] = 79
            before = endpoint.updates
            started = time.perf_counter()
            write_spec(spec_path, spec)
            assert wait(lambda b=before: endpoint.updates > b, 5), "no ListAndWatch update"
            event_times.append(time.perf_counter() - started)
            del gpu["xid"]
            before = endpoint.updates
            write_spec(spec_path, spec)
            assert wait(lambda b=before: endpoint.updates > b, 5), "no recovery update"

        # Kubelet restart -> registered again.
        register_times = []
        for _restart in range(10):
            count = kubelet.registered(GPU)
            started = time.perf_counter()
            kubelet.restart()
            assert wait(lambda c=count: kubelet.registered(GPU) > c, 5), "not registered again"
            register_times.append(time.perf_counter() - started)
        assert kubelet.wait(lambda: kubelet.devices(GPU) is not None, timeout=5)

        # Idle: ListAndWatch open, nothing happening.
        time.sleep(1)
        cpu_before, wall_before = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(idle_seconds)
        idle_cpu = 100 * (cpu_seconds(proc.pid) - cpu_before) / (time.monotonic() - wall_before)
        rss = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
        kubelet.stop()
        shutil.rmtree(work, ignore_errors=True)

    ms = 1000
    load = os.getloadavg()[0]
    rows = [
        (
            "baseline: GetDevicePluginOptions p50 / p99",
            f"{percentile(base, 0.5):.3f} / {percentile(base, 0.99):.3f} ms",
            "-",
        ),
        ("Allocate p50 (5,000 calls, median of 3)", f"{p50:.3f} ms", "-"),
        ("Allocate p99 (5,000 calls, median of 3)", f"{p99:.3f} ms", "< 2 ms"),
        (
            "XID in spec -> ListAndWatch (median / max of 10)",
            f"{statistics.median(event_times) * ms:.0f} / {max(event_times) * ms:.0f} ms",
            "< 1 s",
        ),
        (
            "kubelet restart -> registered (median / max of 10)",
            f"{statistics.median(register_times) * ms:.0f} / {max(register_times) * ms:.0f} ms",
            "< 2 s",
        ),
        (f"RSS after {idle_seconds:.0f} s idle", f"{rss:.1f} MB", "< 60 MB"),
        (f"idle CPU over {idle_seconds:.0f} s", f"{idle_cpu:.3f} %", "< 0.5 %"),
    ]
    rows.append(("load average (1 min) while measuring", f"{load:.1f} on {os.cpu_count()} CPUs", "-"))
    width = max(len(r[0]) for r in rows)
    sys.stdout.write(f"{'figure':<{width}}  {'measured':>16}  target\n")
    for name, value, target in rows:
        sys.stdout.write(f"{name:<{width}}  {value:>16}  {target}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
