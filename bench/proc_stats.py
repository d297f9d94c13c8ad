"""What the benchmarks measure with: a running process's CPU time and resident memory, read from /proc, and the
percentiles they report."""

from __future__ import annotations

import os


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time the process has used, in seconds."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """The process's resident set size in MB (NaN once it is gone)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    """The q-quantile of the samples (0 <= q <= 1): the sample at that rank, the nearest one rounding."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
