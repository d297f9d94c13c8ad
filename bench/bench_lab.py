"""Benchmarks of the end-to-end lab (tests/e2e/lab.sh): how long a bring-up takes with the
Kubernetes binaries and images already cached, and how long a node takes to be Ready again after
its kubelet restarts. Prints medians of several runs; asserts nothing.

    python bench/bench_lab.py [--ups 3] [--restarts 5] [--nodes 2]

It needs the lab to be down when it starts (it brings the lab up and down itself).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

from conftest import Lab, run_lab
from kubernetes import config


def lab_is_up() -> bool:
    done = subprocess.run(
        [str(Path(__file__).resolve().parent.parent / "tests/e2e/lab.sh"), "kubeconfig"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def time_up(nodes: int) -> float:
    start = time.monotonic()
    run_lab("up", str(nodes))
    return time.monotonic() - start


def time_kubelet_restart(lab: Lab, node: str) -> float:
    start = time.monotonic()
    restarted = lab.restart_kubelet(node)
    lab.wait_until(f"{node} Ready", lambda: lab.node_ready(node, since=restarted), interval=0.2)
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ups", type=int, default=3, help="lab bring-ups to time (default 3)")
    parser.add_argument("--restarts", type=int, default=5, help="kubelet restarts to time (default 5)")
    parser.add_argument("--nodes", type=int, default=2, help="node containers (default 2)")
    args = parser.parse_args()
    if lab_is_up():
        print("bench_lab: the lab is up; run `make lab-down` first", file=sys.stderr)
        return 1

    # The first bring-up may build binaries and images; it is reported apart from the timed ones.
    first = time_up(args.nodes)
    ups: list[float] = []
    restarts: list[float] = []
    try:
        for _ in range(args.ups):
            run_lab("down")
            ups.append(time_up(args.nodes))
        kubeconfig = Path(run_lab("kubeconfig").strip())
        lab = Lab(
            kubeconfig=kubeconfig,
            nodes=run_lab("nodes").split(),
            api=config.new_client_from_config(config_file=str(kubeconfig)),
        )
        for _ in range(args.restarts):
            restarts.append(time_kubelet_restart(lab, lab.nodes[0]))
    finally:
        run_lab("down")

    print(f"lab bring-up, {args.nodes} node(s), cached binaries and images")
    print(f"  first run (may include builds):  {first:7.1f} s")
    print(
        f"  median of {len(ups)} runs:            {statistics.median(ups):7.1f} s   runs: "
        + ", ".join(f"{u:.1f}" for u in ups)
    )
    print("kubelet restart until the node is Ready by a new heartbeat")
    print(
        f"  median of {len(restarts)} restarts:        {statistics.median(restarts):7.1f} s   runs: "
        + ", ".join(f"{r:.1f}" for r in restarts)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
