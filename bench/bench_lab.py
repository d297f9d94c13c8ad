"""Benchmarks of the end-to-end lab (tests/e2e/lab.py): how long a bring-up takes with the
Kubernetes binaries and images already cached, how long a node takes to be Ready again after
its kubelet restarts, how long site.yml takes from its start until the node advertises allocatable
nvidia.com/gpu, and how long allocatable nvidia.com/gpu takes to come back after a kubelet restart
(the device plugin re-registers). Prints medians of several runs; asserts nothing.

    python bench/bench_lab.py [--ups 3] [--restarts 5] [--gpu-restarts 10] [--nodes 2]
    python bench/bench_lab.py --running [--restarts 5] [--gpu-restarts 10]

It needs the lab to be down when it starts (it brings the lab up and down itself), unless --running: then
it times only the kubelet restarts on the lab that is up (after `make demo`, say) and leaves it up. GPUOPS_LAB_INSTANCE
picks the lab. The GPU figures use node 1 with the simulated 8 x H100 spec (tests/fixtures/simulated);
``--gpu-restarts 0`` leaves out site.yml and those figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

from conftest import Lab, run_lab
from kubernetes import config


def lab_is_up() -> bool:
    done = subprocess.run(
        [str(Path(__file__).resolve().parent.parent / "tests/e2e/lab.py"), "kubeconfig"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def time_up(nodes: int) -> float:
    start = time.monotonic()
    run_lab("up", str(nodes))
    return time.monotonic() - start


def reset_start_limit(lab: Lab, node: str) -> None:
    """Back-to-back restarts would hit systemd's start rate limit (5 in 10 s); each timed one starts afresh."""
    lab.node_exec(node, "systemctl", "reset-failed", "kubelet", check=False)


def time_kubelet_restart(lab: Lab, node: str) -> float:
    reset_start_limit(lab, node)
    start = time.monotonic()
    restarted = lab.restart_kubelet(node)
    lab.wait_until(f"{node} Ready", lambda: lab.node_ready(node, since=restarted), interval=0.2)
    return time.monotonic() - start


def run_site(lab: Lab) -> float:
    """site.yml on the lab's nodes (simulated GPUs): seconds from its start until node 1 advertises its GPUs."""
    repo = Path(__file__).resolve().parents[1]
    collection = subprocess.run(
        [str(repo / "scripts" / "collection-tree.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    inventory = lab.kubeconfig.parent / "bench-inventory.yml"
    inventory.write_text(run_lab("inventory", *(["h100x8"] * len(lab.nodes))))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(Path(collection).parents[2]))
    start = time.monotonic()
    with (lab.kubeconfig.parent / "bench-site.log").open("w") as log:
        subprocess.run(
            ["ansible-playbook", "-i", str(inventory), str(repo / "playbooks" / "site.yml")],
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=3600,
        )
    lab.wait_until(
        f"{lab.nodes[0]} allocatable nvidia.com/gpu 8",
        lambda: lab.allocatable(lab.nodes[0]).get("nvidia.com/gpu") == "8",
        timeout=300,
        interval=0.2,
    )
    return time.monotonic() - start


def time_gpus_restored(lab: Lab, node: str, count: str) -> float:
    """Kubelet restart until the new kubelet reports allocatable nvidia.com/gpu == count again.

    The new kubelet reads its device checkpoint and reports those devices as unhealthy (allocatable 0)
    until the plugin has registered again and sent its device list, so a status from after the restart
    with the full count means the plugin is back.
    """
    reset_start_limit(lab, node)
    start = time.monotonic()
    restarted = lab.restart_kubelet(node)

    def restored() -> bool:
        status = lab.node(node).status
        allocatable = (status.allocatable or {}).get("nvidia.com/gpu")
        since = restarted.replace(microsecond=0) + timedelta(seconds=1 if restarted.microsecond else 0)
        fresh = any(c.type == "Ready" and c.last_heartbeat_time >= since for c in status.conditions or [])
        return fresh and allocatable == count

    lab.wait_until(f"{node} allocatable nvidia.com/gpu {count} after a kubelet restart", restored, interval=0.1)
    return time.monotonic() - start


def open_lab() -> Lab:
    kubeconfig = Path(run_lab("kubeconfig").strip())
    return Lab(
        kubeconfig=kubeconfig,
        nodes=run_lab("nodes").split(),
        api=config.new_client_from_config(config_file=str(kubeconfig)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ups", type=int, default=3, help="lab bring-ups to time (default 3)")
    parser.add_argument("--restarts", type=int, default=5, help="kubelet restarts to time (default 5)")
    parser.add_argument("--nodes", type=int, default=2, help="node containers (default 2)")
    parser.add_argument(
        "--gpu-restarts", type=int, default=10, help="kubelet restarts timed until GPUs are allocatable (default 10)"
    )
    parser.add_argument(
        "--running",
        action="store_true",
        help="use the lab that is up (say after `make demo`) and leave it up: no bring-ups, no site.yml; "
        "the GPU restarts need node 1 to advertise nvidia.com/gpu already",
    )
    args = parser.parse_args()
    if args.running != lab_is_up():
        state = "not up" if args.running else "up; run `make lab-down` first, or pass --running"
        print(f"bench_lab: the lab is {state}", file=sys.stderr)
        return 1

    first = 0.0
    ups: list[float] = []
    restarts: list[float] = []
    gpu_restarts: list[float] = []
    site = 0.0
    gpus = "8"
    if not args.running:
        # The first bring-up may build binaries and images; it is reported apart from the timed ones.
        first = time_up(args.nodes)
    try:
        if not args.running:
            for _attempt in range(args.ups):
                run_lab("down")
                ups.append(time_up(args.nodes))
        lab = open_lab()
        for _attempt in range(args.restarts):
            restarts.append(time_kubelet_restart(lab, lab.nodes[0]))
        if args.gpu_restarts > 0:
            if args.running:
                gpus = lab.allocatable(lab.nodes[0]).get("nvidia.com/gpu", "0")
                if gpus == "0":
                    print(
                        f"bench_lab: {lab.nodes[0]} advertises no nvidia.com/gpu; run `make demo` first",
                        file=sys.stderr,
                    )
                    return 1
            else:
                site = run_site(lab)
            for _attempt in range(args.gpu_restarts):
                gpu_restarts.append(time_gpus_restored(lab, lab.nodes[0], gpus))
    finally:
        if not args.running:
            run_lab("down")

    if ups:
        print(f"lab bring-up, {args.nodes} node(s), cached binaries and images")
        print(f"  first run (may include builds):  {first:7.1f} s")
        print(
            f"  median of {len(ups)} runs:            {statistics.median(ups):7.1f} s   runs: "
            + ", ".join(f"{u:.1f}" for u in ups)
        )
    if restarts:
        print("kubelet restart until the node is Ready by a new heartbeat")
        print(
            f"  median of {len(restarts)} restarts:        {statistics.median(restarts):7.1f} s   runs: "
            + ", ".join(f"{r:.1f}" for r in restarts)
        )
    if site:
        print(f"site.yml on {args.nodes} node(s), from its start until node 1 advertises 8 nvidia.com/gpu")
        print(f"  one run:                          {site:7.1f} s")
    if gpu_restarts:
        print(f"kubelet restart until allocatable nvidia.com/gpu is {gpus} again (the plugin re-registered)")
        print(
            f"  median of {len(gpu_restarts)} restarts:       {statistics.median(gpu_restarts):7.1f} s   "
            f"min {min(gpu_restarts):.1f}, max {max(gpu_restarts):.1f}   runs: "
            + ", ".join(f"{r:.1f}" for r in gpu_restarts)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
