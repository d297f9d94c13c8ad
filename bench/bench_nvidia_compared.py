#!/usr/bin/env python
"""NVIDIA's device plugin v0.19.0 and ours on the same simulated node, same harness, same run (prints, never asserts).

The harness is that of tests/integration/test_device_plugin_compared.py: each plugin a process in a private mount
namespace on one stand-in GPU node (the mock libnvidia-ml.so.1 serving tests/fixtures/simulated/h100x8.yaml,
mknod'd device nodes), under the same `version: v1` config file, each with its own kubelet double over real
unix-socket gRPC. Needs root. Figures, each for both and as a ratio ours / NVIDIA's:

- process start -> registered with the kubelet (median of 3 starts, one plugin at a time);
- GetDevicePluginOptions (a round trip that does nothing) and Allocate of one GPU, p50 / p99 over
  BENCH_CALLS calls (default 5,000), median of 3 runs, one plugin at a time;
- an XID 79 written into the library's state -> that GPU Unhealthy in ListAndWatch (both running; median / max
  over 6 GPUs; NVIDIA's plugin never makes a GPU Healthy again, so each XID hits another GPU);
- RSS after BENCH_IDLE_SECONDS (default 60) idle and the CPU used over that time (both running, idle).
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [
    os.path.join(HERE, "..", "files", "device_plugin", "src"),
    os.path.join(HERE, "..", "tests", "integration"),
]

from gpu_device_plugin.api import api_pb2  # noqa: E402
from proc_stats import cpu_seconds, percentile, rss_mb  # noqa: E402
from test_device_plugin_compared import (  # noqa: E402
    H100,
    NVIDIA,
    OURS,
    GpuNode,
    PluginRun,
    requirements,
    time_to_unhealthy,
)

KINDS = (NVIDIA, OURS)


def latencies(run: PluginRun, calls: int) -> dict[str, tuple[float, float]]:
    stub = run.kubelet.stub("nvidia.com/gpu")
    options: list[tuple[float, float]] = []
    allocate: list[tuple[float, float]] = []
    for _run in range(3):
        base, samples = [], []
        for n in range(calls):
            started = time.perf_counter()
            stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
            base.append((time.perf_counter() - started) * 1000)
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[H100[n % 8]])]
            )
            started = time.perf_counter()
            stub.Allocate(request, timeout=5)
            samples.append((time.perf_counter() - started) * 1000)
        options.append((percentile(base, 0.5), percentile(base, 0.99)))
        allocate.append((percentile(samples, 0.5), percentile(samples, 0.99)))
    return {
        "options": (statistics.median(o[0] for o in options), statistics.median(o[1] for o in options)),
        "allocate": (statistics.median(a[0] for a in allocate), statistics.median(a[1] for a in allocate)),
    }


def main() -> int:
    reason = requirements()
    if reason:
        sys.stderr.write(f"bench_nvidia_compared: {reason}\n")
        return 2
    calls = int(os.environ.get("BENCH_CALLS", "5000"))
    idle_seconds = float(os.environ.get("BENCH_IDLE_SECONDS", "60"))
    node = GpuNode()
    config = node.config(deviceListStrategy=["envvar"])
    figures: dict[str, dict[str, object]] = {kind: {} for kind in KINDS}
    runs: dict[str, PluginRun] = {}
    try:
        # Start -> registered, and the RPC latencies: one plugin at a time.
        for kind in KINDS:
            starts = []
            for _start in range(3):
                run = PluginRun(kind, node, config, log_level="error")
                try:
                    starts.append(run.wait_registered())
                    if len(starts) == 3:
                        figures[kind].update(latencies(run, calls))
                finally:
                    run.stop()
            figures[kind]["start"] = statistics.median(starts)

        # Both running on the node: XIDs, then idle.
        for kind in KINDS:
            runs[kind] = PluginRun(kind, node, config, log_level="error")
        for run in runs.values():
            run.wait_registered()
        time.sleep(1)  # both health watchers have registered their event sets
        event: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for index in range(6):
            seen = time_to_unhealthy(runs, node, index, 79)
            for kind in KINDS:
                event[kind].append(seen[kind] if seen[kind] is not None else float("inf"))
        for kind in KINDS:
            figures[kind]["event"] = (statistics.median(event[kind]), max(event[kind]))

        time.sleep(1)
        before = {kind: (cpu_seconds(run.proc.pid), time.monotonic()) for kind, run in runs.items()}
        time.sleep(idle_seconds)
        for kind, run in runs.items():
            cpu, wall = before[kind]
            figures[kind]["idle_cpu"] = 100 * (cpu_seconds(run.proc.pid) - cpu) / (time.monotonic() - wall)
            figures[kind]["rss"] = rss_mb(run.proc.pid)
        load = os.getloadavg()[0]
    finally:
        for run in runs.values():
            run.stop()
        node.close()

    def ratio(ours: float, theirs: float) -> str:
        return f"{ours / theirs:.2f}" if theirs > 0 else "-"

    ms = 1000
    rows = []
    n, o = figures[NVIDIA], figures[OURS]
    rows.append(
        (
            "start -> registered (median of 3)",
            f"{n['start'] * ms:.0f} ms",
            f"{o['start'] * ms:.0f} ms",
            ratio(o["start"], n["start"]),
        )
    )  # type: ignore[operator,arg-type]
    for key, label in (("options", "GetDevicePluginOptions"), ("allocate", "Allocate, 1 GPU")):
        for i, q in ((0, "p50"), (1, "p99")):
            theirs, ours = n[key][i], o[key][i]  # type: ignore[index]
            rows.append(
                (
                    f"{label} {q} ({calls:,} calls, median of 3)",
                    f"{theirs:.3f} ms",
                    f"{ours:.3f} ms",
                    ratio(ours, theirs),
                )
            )
    for i, q in ((0, "median"), (1, "max")):
        theirs, ours = n["event"][i], o["event"][i]  # type: ignore[index]
        rows.append(
            (
                f"XID 79 written -> Unhealthy, {q} of 6",
                f"{theirs * ms:.1f} ms",
                f"{ours * ms:.1f} ms",
                ratio(ours, theirs),
            )
        )
    rows.append(
        (f"RSS after {idle_seconds:.0f} s idle", f"{n['rss']:.1f} MB", f"{o['rss']:.1f} MB", ratio(o["rss"], n["rss"]))
    )  # type: ignore[operator,arg-type]
    rows.append(
        (
            f"idle CPU over {idle_seconds:.0f} s",
            f"{n['idle_cpu']:.3f} %",
            f"{o['idle_cpu']:.3f} %",
            ratio(o["idle_cpu"], n["idle_cpu"]),
        )
    )  # type: ignore[operator,arg-type]
    width = max(len(r[0]) for r in rows)
    sys.stdout.write(f"{'figure':<{width}}  {'NVIDIA v0.19.0':>14}  {'ours':>12}  ours / NVIDIA's\n")
    for name, theirs_text, ours_text, r in rows:
        sys.stdout.write(f"{name:<{width}}  {theirs_text:>14}  {ours_text:>12}  {r}\n")
    sys.stdout.write(f"load average (1 min) while measuring: {load:.1f} on {os.cpu_count()} CPUs\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
