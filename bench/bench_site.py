"""Benchmark of playbooks/site.yml on the lab's nodes (tests/e2e/lab.py) with simulated GPUs.

Prints, side by side with their ratios:
  - one host: the first run on a fresh node vs the second (no-op) run;
  - four hosts: the first run at forks 4 vs forks 1 (and vs one host), and the no-op run at forks 4 vs the
    one-host no-op run;
  - the time from site.yml's start until the node's allocatable nvidia.com/gpu reaches the spec's
    GPU count, polled from the API server while the playbook runs;
  - the CPU seconds of the no-op runs (control host and node containers) and the many-host run's CPU floor;
  - what one task costs on this machine whatever it does: CPU per task and host of a module run
    (ansible.builtin.ping with become) and of a skipped task, on the converged one-host lab;
  - a per-task profile of the one-host first and no-op runs (the json callback's task times): seconds per
    role and the ten most expensive tasks.
A first run needs fresh nodes, so the lab is taken down and brought up again before each one (down
removes the nodes' volumes). Medians over --runs repetitions; the machine's load average is printed
with each figure. Asserts nothing.

    GPUOPS_LAB_INSTANCE=3 python bench/bench_site.py [--runs 1] [--spec h100x8] [--hosts 4] [--only one|many]
                                                     [--no-forks-1]

It needs its lab instance to be down when it starts, and leaves it down.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parent.parent
LAB_PY = REPO / "tests" / "e2e" / "lab.py"
SITE = REPO / "playbooks" / "site.yml"
RESOURCE = "nvidia.com/gpu"


def lab(*args: str, timeout: float = 1800) -> str:
    """Run ``lab.py ARGS``; its progress goes to stderr, its answer comes back."""
    done = subprocess.run([str(LAB_PY), *args], check=True, stdout=subprocess.PIPE, text=True, timeout=timeout)
    return done.stdout


def lab_is_up() -> bool:
    done = subprocess.run([str(LAB_PY), "nodes"], capture_output=True, text=True, check=False)
    return done.returncode == 0 and bool(done.stdout.split())


def spec_file(spec: str) -> Path:
    path = Path(spec)
    return path if path.is_file() else REPO / "tests" / "fixtures" / "simulated" / f"{spec}.yaml"


def gpu_count(spec: str) -> int:
    """How many nvidia.com/gpu the spec advertises: one per GPU, or one per MIG device where it has them."""
    gpus = yaml.safe_load(spec_file(spec).read_text(encoding="utf-8"))["gpus"]
    return sum(len(g.get("mig_devices") or []) or 1 for g in gpus)


def load() -> str:
    one, five = os.getloadavg()[:2]
    return f"{one:.1f}/{five:.1f}"


@dataclass
class Run:
    wall: float
    changed: dict[str, int]
    load_before: str
    load_after: str
    # Seconds from the playbook's start until each node advertised the expected count (None: never).
    allocatable_at: dict[str, float | None] = field(default_factory=dict)
    # Each task as the json callback timed it: (name with its role, seconds, whether every host skipped it).
    profile: list[tuple[str, float, bool]] = field(default_factory=list)
    # CPU seconds the run cost on this machine: ansible-playbook and its children (the control host's side),
    # and the lab's node containers (their modules, and whatever else ran in them meanwhile).
    controller_cpu: float = 0.0
    nodes_cpu: float = 0.0

    def all_reached(self) -> bool:
        return bool(self.allocatable_at) and all(v is not None for v in self.allocatable_at.values())

    def describe(self) -> str:
        reached = ", ".join(f"{k} {'never' if v is None else f'{v:.1f} s'}" for k, v in self.allocatable_at.items())
        return (
            f"{self.wall:.1f} s, changed {self.changed}, {self.load_before} .. {self.load_after},"
            f" CPU {self.controller_cpu:.1f} s control host + {self.nodes_cpu:.1f} s nodes"
        ) + (f"; allocatable reached: {reached}" if reached else "")


class AllocatableWatch(threading.Thread):
    """Polls the API server for each node's allocatable nvidia.com/gpu and notes when it reaches the count."""

    def __init__(self, kubeconfig: str, nodes: list[str], count: int, start: float, interval: float = 0.5) -> None:
        super().__init__(daemon=True, name="allocatable-watch")
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.nodes = nodes
        self.count = count
        self.start_time = start
        self.interval = interval
        self.reached: dict[str, float | None] = dict.fromkeys(nodes)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set() and any(v is None for v in self.reached.values()):
            for node in [n for n, v in self.reached.items() if v is None]:
                try:
                    allocatable = self.core.read_node(node).status.allocatable or {}
                except client.ApiException:
                    continue
                if int(allocatable.get(RESOURCE, "0")) == self.count:
                    self.reached[node] = time.monotonic() - self.start_time
            self.stopping.wait(self.interval)

    def stop(self) -> dict[str, float | None]:
        self.stopping.set()
        self.join(timeout=10)
        self.api.close()
        return self.reached


def node_cpu_seconds() -> float:
    """CPU seconds used so far by this lab instance's node containers, from their cgroups (v1 cpuacct or v2)."""
    done = subprocess.run(
        ["podman", "ps", "--filter", f"name={node_prefix()}", "--format", "{{.ID}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    total = 0.0
    for cid in done.stdout.split():
        path = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.CgroupPath}}", cid], capture_output=True, text=True, check=False
        ).stdout.strip()
        v1 = Path("/sys/fs/cgroup/cpuacct") / path.lstrip("/") / "cpuacct.usage"
        v2 = Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.stat"
        if v1.exists():
            total += int(v1.read_text()) / 1e9
        elif v2.exists():
            stat = dict(line.split() for line in v2.read_text().splitlines())
            total += int(stat["usage_usec"]) / 1e6
    return total


def node_prefix() -> str:
    instance = os.environ.get("GPUOPS_LAB_INSTANCE", "0")
    return "gpuops-lab-node-" if instance == "0" else f"gpuops-lab{instance}-node-"


def measured(playbook: Path, inventory: Path, forks: int) -> tuple[subprocess.Popen, dict]:
    """Start ansible-playbook with the json callback; returns the process and the CPU counters before it."""
    env = dict(
        os.environ,
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".build"),
        ANSIBLE_HOST_KEY_CHECKING="False",
    )
    before = {"nodes": node_cpu_seconds(), "children": resource.getrusage(resource.RUSAGE_CHILDREN)}
    argv = ["ansible-playbook", "-i", str(inventory), "-f", str(forks), str(playbook)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO), before


def finished(proc: subprocess.Popen, before: dict) -> tuple[dict, float, float]:
    """Wait for a run started by measured(); returns its json report and the CPU seconds it cost on the control
    host (ansible-playbook and its children) and in the lab's node containers."""
    stdout, stderr = proc.communicate(timeout=3600)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = before["children"]
    controller_cpu = (children.ru_utime - start.ru_utime) + (children.ru_stime - start.ru_stime)
    nodes_cpu = node_cpu_seconds() - before["nodes"]
    if proc.returncode != 0:
        sys.stderr.write(stdout[-6000:] + stderr[-4000:])
        raise SystemExit(f"bench_site: {proc.args[-1]} failed (exit {proc.returncode}); its output is above")
    return json.loads(stdout[stdout.index("{") :]), controller_cpu, nodes_cpu


def site(inventory: Path, forks: int, watch: tuple[str, list[str], int] | None = None) -> Run:
    """Run site.yml once; count changed tasks per host from the json callback's stats."""
    before = load()
    start = time.monotonic()
    proc, counters = measured(SITE, inventory, forks)
    watcher = None
    if watch is not None:
        watcher = AllocatableWatch(*watch, start=start)
        watcher.start()
    report, controller_cpu, nodes_cpu = finished(proc, counters)
    wall = time.monotonic() - start
    reached: dict[str, float | None] = {}
    if watcher is not None:
        # The plugin may register a moment after the play ends: give it a little longer.
        deadline = time.monotonic() + 60
        while any(v is None for v in watcher.reached.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        reached = watcher.stop()
    changed = {host: s["changed"] for host, s in report["stats"].items()}
    return Run(
        wall=wall,
        changed=changed,
        load_before=before,
        load_after=load(),
        allocatable_at=reached,
        profile=task_profile(report),
        controller_cpu=controller_cpu,
        nodes_cpu=nodes_cpu,
    )


UNIT_TASKS = 20


def unit_costs(inventory: Path, workdir: Path) -> dict[str, float]:
    """What one task costs on this machine, whatever the roles do: CPU milliseconds per task and host of
    UNIT_TASKS ansible.builtin.ping tasks (with become, as site.yml runs), on the control host and in the node,
    and of as many tasks that every host skips (control host only)."""
    costs = {}
    for kind, task in (
        ("module", {"ansible.builtin.ping": {}}),
        ("skipped", {"ansible.builtin.debug": {"msg": "never"}, "when": "gpuops_never is defined"}),
    ):
        tasks = [dict(task, name=f"{kind} {i}") for i in range(UNIT_TASKS)]
        playbook = workdir / f"unit-{kind}.yml"
        play = {"hosts": "gpu_nodes", "become": True, "gather_facts": False, "tasks": tasks}
        playbook.write_text(yaml.safe_dump([play]), encoding="utf-8")
        # The play's own start-up, measured with one task, is taken off.
        base = workdir / f"unit-{kind}-base.yml"
        base.write_text(yaml.safe_dump([dict(play, tasks=tasks[:1])]), encoding="utf-8")
        _report, ctl_base, nodes_base = finished(*measured(base, inventory, 1))
        report, ctl, nodes = finished(*measured(playbook, inventory, 1))
        hosts = len(report["stats"])
        per = (UNIT_TASKS - 1) * hosts
        costs[f"{kind} control"] = (ctl - ctl_base) / per * 1000
        costs[f"{kind} node"] = (nodes - nodes_base) / per * 1000
    return costs


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def task_profile(report: dict) -> list[tuple[str, float, bool]]:
    """Each task of a json-callback report: its name (role prefixed), its seconds, and whether all hosts skipped it."""
    tasks = []
    for play in report["plays"]:
        for task in play["tasks"]:
            duration = task["task"].get("duration") or {}
            if not duration.get("start") or not duration.get("end"):
                continue
            hosts = task["hosts"].values()
            skipped = bool(hosts) and all(h.get("skipped") for h in hosts)
            tasks.append((task["task"]["name"], _seconds(duration["end"]) - _seconds(duration["start"]), skipped))
    return tasks


def role_of(name: str) -> str:
    """'gpuops.k8s.nvidia_driver : Look for ...' -> 'nvidia_driver'; a play-level task -> '(play)'."""
    prefix, sep, _rest = name.partition(" : ")
    return prefix.rsplit(".", 1)[-1] if sep else "(play)"


def print_profile(title: str, run: Run, top: int = 10) -> None:
    """The run's cost by role and its most expensive tasks."""
    ran = [t for t in run.profile if not t[2]]
    print(
        f"{title}: {len(run.profile)} tasks, {len(ran)} ran, {len(run.profile) - len(ran)} skipped on every host, "
        f"{sum(t[1] for t in run.profile):.1f} s in tasks of {run.wall:.1f} s"
    )
    by_role: dict[str, list[float]] = {}
    for name, seconds, _skipped in run.profile:
        by_role.setdefault(role_of(name), []).append(seconds)
    for role, times in sorted(by_role.items(), key=lambda item: -sum(item[1])):
        print(f"  {role:22} {sum(times):6.1f} s  {len(times):3d} tasks")
    print(f"  the {top} most expensive tasks")
    for name, seconds, skipped in sorted(run.profile, key=lambda t: -t[1])[:top]:
        print(f"    {seconds:5.2f} s  {name}{'  (skipped)' if skipped else ''}")


def fresh_lab(hosts: int, spec: str, workdir: Path) -> tuple[Path, str, list[str]]:
    """Bring a fresh lab up with HOSTS nodes and write its inventory; returns (inventory, kubeconfig, nodes)."""
    if lab_is_up():
        lab("down", timeout=300)
    lab("up", str(hosts))
    inventory = workdir / f"inventory-{hosts}.yml"
    inventory.write_text(lab("inventory", *([spec] * hosts)), encoding="utf-8")
    return inventory, lab("kubeconfig").strip(), lab("nodes").split()


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} s" if values else "      - s"


def runs_text(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def ratio(numerator: list[float], denominator: list[float]) -> str:
    if not numerator or not denominator:
        return "      -  "
    return f"{statistics.median(numerator) / statistics.median(denominator):7.2f} x"


def progress(text: str) -> None:
    print(text, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="repetitions of each first run (default 1)")
    parser.add_argument("--spec", default="h100x8", help="simulated-GPU spec for every node (default h100x8)")
    parser.add_argument("--hosts", type=int, default=4, help="nodes for the forks comparison (default 4)")
    parser.add_argument("--only", choices=["one", "many"], help="only the one-host or only the many-host part")
    parser.add_argument(
        "--no-forks-1", action="store_true", help="many hosts at forks N only (skips the serial run, N times as long)"
    )
    args = parser.parse_args()
    if lab_is_up():
        print("bench_site: this lab instance is up; take it down first (tests/e2e/lab.py down)", file=sys.stderr)
        return 1
    subprocess.run([str(REPO / "scripts" / "collection-tree.sh")], check=True, stdout=subprocess.DEVNULL)
    count = gpu_count(args.spec)
    instance = os.environ.get("GPUOPS_LAB_INSTANCE", "0")
    progress(f"bench_site: lab instance {instance}, spec {args.spec} ({count} x {RESOURCE}), {os.cpu_count()} CPUs")

    first: list[Run] = []
    second: list[Run] = []
    many: dict[int, list[Run]] = {args.hosts: [], 1: []}
    many_noop: list[Run] = []
    units: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-site-") as tmp:
        workdir = Path(tmp)
        try:
            for attempt in range(args.runs if args.only != "many" else 0):
                inventory, kubeconfig, nodes = fresh_lab(1, args.spec, workdir)
                first.append(site(inventory, forks=1, watch=(kubeconfig, nodes, count)))
                progress(f"  1 host, run {attempt + 1}: first {first[-1].describe()}")
                second.append(site(inventory, forks=1))
                progress(f"  1 host, run {attempt + 1}: second {second[-1].describe()}")
            if second:
                # The converged node of the last one-host run is still up: what one task costs, whatever it does.
                units = unit_costs(inventory, workdir)
                progress(f"  1 host, unit costs (CPU ms per task and host): {units}")
            for attempt in range(args.runs if args.only != "one" else 0):
                for forks in (args.hosts,) if args.no_forks_1 else (args.hosts, 1):
                    inventory, kubeconfig, nodes = fresh_lab(args.hosts, args.spec, workdir)
                    many[forks].append(site(inventory, forks=forks, watch=(kubeconfig, nodes, count)))
                    progress(
                        f"  {args.hosts} hosts, forks {forks}, run {attempt + 1}: first {many[forks][-1].describe()}"
                    )
                    if forks == args.hosts:
                        many_noop.append(site(inventory, forks=forks))
                        progress(
                            f"  {args.hosts} hosts, forks {forks}, run {attempt + 1}: no-op {many_noop[-1].describe()}"
                        )
        finally:
            if lab_is_up():
                lab("down", timeout=300)
    report(args, count, first, second, many, many_noop, units)
    return 0


def report(
    args: argparse.Namespace,
    count: int,
    first: list[Run],
    second: list[Run],
    many: dict[int, list[Run]],
    many_noop: list[Run],
    units: dict[str, float],
) -> None:
    n = args.hosts
    f = [r.wall for r in first]
    s = [r.wall for r in second]
    a = [r.wall for r in many[n]]
    b = [r.wall for r in many[1]]
    one_alloc = [v for r in first for v in r.allocatable_at.values() if v is not None]
    all_alloc = [max(v for v in r.allocatable_at.values() if v is not None) for r in many[n] if r.all_reached()]
    print()
    print(f"site.yml wall time, median of {args.runs} run(s) each; first runs on fresh lab nodes ({args.spec})")
    print(f"  1 host     first run                {fmt(f)}   runs: {runs_text(f)}")
    print(f"  1 host     second (no-op) run       {fmt(s)}   runs: {runs_text(s)}")
    print(f"             first / second           {ratio(f, s)}")
    print(f"             tasks changed on the second run: {[r.changed for r in second]}")
    print(f"  {n} hosts    first run, forks {n}        {fmt(a)}   runs: {runs_text(a)}")
    print(f"  {n} hosts    first run, forks 1        {fmt(b)}   runs: {runs_text(b)}")
    print(f"             forks 1 / forks {n}         {ratio(b, a)}")
    print(f"             {n} hosts forks {n} / 1 host   {ratio(a, f)}")
    m = [r.wall for r in many_noop]
    print(f"  {n} hosts    no-op run, forks {n}        {fmt(m)}   runs: {runs_text(m)}")
    print(f"             {n} hosts no-op / 1 host no-op {ratio(m, s)}")
    print(f"             tasks changed on the {n}-host no-op run: {[r.changed for r in many_noop]}")
    print(f"CPU seconds of the no-op runs on this machine ({os.cpu_count()} CPUs; the lab's nodes share them), medians")
    for label, runs in (("1 host", second), (f"{n} hosts", many_noop)):
        if runs:
            ctl = statistics.median(r.controller_cpu for r in runs)
            nodes = statistics.median(r.nodes_cpu for r in runs)
            print(f"  {label:9}  control host {ctl:5.1f} s, node containers {nodes:5.1f} s")
    if second and many_noop:
        # No schedule finishes sooner than its CPU work spread over every core of the machine.
        need = statistics.median(r.controller_cpu + r.nodes_cpu for r in many_noop)
        floor = need / (os.cpu_count() or 1)
        print(
            f"  the {n}-host no-op run needs {need:.1f} CPU-s here: on {os.cpu_count()} CPUs no less than"
            f" {floor:.1f} s, {floor / statistics.median(s):.2f} x the 1-host no-op, before any wait"
        )
    if units:
        print(f"what one task costs here, CPU ms per task and host ({UNIT_TASKS} tasks on the 1-host lab, with become)")
        print(
            f"  a module run (ansible.builtin.ping): control host {units['module control']:5.1f},"
            f" node {units['module node']:5.1f}"
        )
        print(f"  a task every host skips:             control host {units['skipped control']:5.1f}")
    print(f"time from site.yml's start until allocatable {RESOURCE} = {count}, polled from the API server")
    print(f"  1 host                              {fmt(one_alloc)}   runs: {runs_text(one_alloc)}")
    print(f"  {n} hosts, forks {n}, the last node     {fmt(all_alloc)}   runs: {runs_text(all_alloc)}")
    loads = [r.load_before for r in first + second + a_runs(many) + many_noop]
    print(f"machine load (1 min / 5 min) at the start of each run: {', '.join(loads)}")
    if first:
        print()
        print_profile("profile of the last 1-host first run", first[-1])
    if second:
        print()
        print_profile("profile of the last 1-host no-op run", second[-1])


def a_runs(many: dict[int, list[Run]]) -> list[Run]:
    return [r for runs in many.values() for r in runs]


if __name__ == "__main__":
    sys.exit(main())
