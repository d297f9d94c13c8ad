"""Benchmark of playbooks/site.yml on the lab's nodes (tests/e2e/lab.py) with simulated GPUs, under each
strategy side by side: Ansible's linear strategy and Mitogen's mitogen_linear (docs/mitogen.md).

Prints, for each strategy in one table, with the ratio of Mitogen to linear:
  - one host: the first run on a fresh node vs the second (no-op) run;
  - four hosts: the first run at forks 4 vs forks 1 (and vs one host), and the no-op run at forks 4 vs the
    one-host no-op run;
  - the time from site.yml's start until the node's allocatable nvidia.com/gpu reaches the spec's
    GPU count, polled from the API server while the playbook runs;
  - the CPU seconds of the runs: the control host (ansible-playbook and everything it started, its SSH
    connection masters included; and the part in ansible-playbook's own process, which does its work on one
    core) and the node containers (their cgroups); the many-host run's CPU floor;
  - what one task costs on this machine whatever it does: CPU per task and host of a module run
    (ansible.builtin.ping with become) and of a skipped task, on the converged one-host lab;
  - the module runs on the node per role in the one-host no-op run (tasks that ran there: not skipped, not
    delegated to the control host, not an action the control host answers alone such as set_fact or assert);
  - a per-task profile (the json callback's task times): seconds per role and the ten most expensive tasks;
  - a projection of the no-op and first runs to 100, 1,000 and 10,000 nodes, at forks 25 and 100 and as
    AWX job slices, from the per-node costs measured here, with its assumptions.
A first run needs fresh nodes, so the lab is taken down and brought up again before each one (down
removes the nodes' volumes); the strategies take turns. Medians over --runs repetitions; the machine's load
average is printed with each figure. Asserts nothing.

    GPUOPS_LAB_INSTANCE=3 python bench/bench_site.py [--runs 1] [--spec h100x8] [--hosts 4] [--only one|many]
                                                     [--no-forks-1] [--strategies linear,mitogen]
                                                     [--control-cores 16]

--strategies defaults to both where Mitogen is installed (requirements/mitogen.txt), to linear otherwise.
It needs its lab instance to be down when it starts, and leaves it down.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from playbook_run import mitogen_environment  # noqa: E402
from proc_stats import cpu_seconds  # noqa: E402

sys.path.insert(0, str(REPO / "molecule" / "shared"))
# Actions the control host answers alone: a task of these runs no module on the node (molecule counts the same).
from module_runs import CONTROL_ACTIONS  # noqa: E402

LAB_PY = REPO / "tests" / "e2e" / "lab.py"
SITE = REPO / "playbooks" / "site.yml"
RESOURCE = "nvidia.com/gpu"
# --strategies names -> the strategy ansible-playbook runs.
STRATEGIES = {"linear": "linear", "mitogen": "mitogen_linear"}
PROJECTED_NODES = (100, 1_000, 10_000)
# (label, forks, AWX job slices)
PROJECTED_LAYOUTS = (("forks 25", 25, 1), ("forks 100", 100, 1), ("10 slices x forks 25", 25, 10))


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


def strategy_env(name: str) -> dict[str, str]:
    """What ansible-playbook needs in its environment to run under the strategy (linear: nothing)."""
    return mitogen_environment() if name == "mitogen" else {}


def mitogen_version() -> str | None:
    try:
        return importlib.metadata.version("mitogen")
    except importlib.metadata.PackageNotFoundError:
        return None


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
    # CPU seconds the run cost on this machine: ansible-playbook and everything it started (the control host's
    # side), of it ansible-playbook's own process, and the lab's node containers (their modules, and whatever
    # else ran in them meanwhile).
    controller_cpu: float = 0.0
    main_cpu: float = 0.0
    nodes_cpu: float = 0.0
    # Module runs on the nodes per role (module_runs()).
    module_runs: dict[str, int] = field(default_factory=dict)

    def all_reached(self) -> bool:
        return bool(self.allocatable_at) and all(v is not None for v in self.allocatable_at.values())

    def describe(self) -> str:
        reached = ", ".join(f"{k} {'never' if v is None else f'{v:.1f} s'}" for k, v in self.allocatable_at.items())
        return (
            f"{self.wall:.1f} s, changed {self.changed}, {self.load_before} .. {self.load_after},"
            f" CPU {self.controller_cpu:.1f} s control host ({self.main_cpu:.1f} s in ansible-playbook itself)"
            f" + {self.nodes_cpu:.1f} s nodes"
        ) + (f"; allocatable reached: {reached}" if reached else "")


@dataclass
class Results:
    """Every run of one strategy."""

    first: list[Run] = field(default_factory=list)
    second: list[Run] = field(default_factory=list)
    many: dict[int, list[Run]] = field(default_factory=dict)
    many_noop: list[Run] = field(default_factory=list)
    units: dict[str, float] = field(default_factory=dict)

    def all_runs(self) -> list[Run]:
        return self.first + self.second + [r for runs in self.many.values() for r in runs] + self.many_noop


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


# The SSH connection masters that Ansible's ssh connection leaves behind (ControlPersist) detach from
# ansible-playbook; as their subreaper this process inherits them, ends them after the run and so counts their CPU
# (the encryption of every task's traffic) with the control host's. Mitogen's connections end with the run.
PR_SET_CHILD_SUBREAPER = 36


def set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def inherited_children() -> list[tuple[int, str]]:
    """(pid, command name) of this process's children that it did not start itself: orphans it inherited."""
    me = str(os.getpid())
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                head, _sep, rest = handle.read().rpartition(")")
        except OSError:
            continue
        if rest.split()[1] == me:
            children.append((int(entry), head.partition("(")[2]))
    return children


def end_inherited_children() -> None:
    """End the SSH masters a run left behind (by their pids) and reap every inherited child that has exited."""
    for pid, command in inherited_children():
        if command == "ssh":
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        else:
            os.waitpid(pid, os.WNOHANG)


def measured(playbook: Path, inventory: Path, forks: int, env: dict[str, str], output: IO[str]) -> tuple:
    """Start ansible-playbook with the json callback writing to ``output``; returns the process and the CPU
    counters before it."""
    run_env = dict(
        os.environ,
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".build"),
        ANSIBLE_HOST_KEY_CHECKING="False",
        **env,
    )
    set_subreaper(True)
    before = {"nodes": node_cpu_seconds(), "children": resource.getrusage(resource.RUSAGE_CHILDREN)}
    argv = ["ansible-playbook", "-i", str(inventory), "-f", str(forks), str(playbook)]
    proc = subprocess.Popen(argv, env=run_env, stdout=output, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    return proc, before


def finished(proc: subprocess.Popen, before: dict, output: IO[str]) -> tuple[dict, float, float, float]:
    """Wait for a run started by measured(); returns its json report and the CPU seconds it cost on the control
    host (ansible-playbook and everything it started), in ansible-playbook's own process, and in the lab's node
    containers."""
    # Exited but not reaped yet: its own CPU time can still be read.
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    main_cpu = cpu_seconds(proc.pid)
    proc.wait()
    end_inherited_children()
    set_subreaper(False)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = before["children"]
    controller_cpu = (children.ru_utime - start.ru_utime) + (children.ru_stime - start.ru_stime)
    nodes_cpu = node_cpu_seconds() - before["nodes"]
    output.seek(0)
    text = output.read()
    if proc.returncode != 0:
        sys.stderr.write(text[-10000:])
        raise SystemExit(f"bench_site: {proc.args[-1]} failed (exit {proc.returncode}); its output is above")
    return json.loads(text[text.index("{") :]), controller_cpu, main_cpu, nodes_cpu


def play(playbook: Path, inventory: Path, forks: int, env: dict[str, str]) -> tuple[dict, float, float, float]:
    """Run a playbook with the json callback; its report and CPU seconds (finished())."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as output:
        return finished(*measured(playbook, inventory, forks, env, output)[:2], output)


def site(inventory: Path, forks: int, env: dict[str, str], watch: tuple[str, list[str], int] | None = None) -> Run:
    """Run site.yml once; count changed tasks per host from the json callback's stats."""
    before = load()
    start = time.monotonic()
    with tempfile.TemporaryFile("w+", encoding="utf-8") as output:
        proc, counters = measured(SITE, inventory, forks, env, output)
        watcher = None
        if watch is not None:
            watcher = AllocatableWatch(*watch, start=start)
            watcher.start()
        report, controller_cpu, main_cpu, nodes_cpu = finished(proc, counters, output)
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
        main_cpu=main_cpu,
        nodes_cpu=nodes_cpu,
        module_runs=module_runs(report),
    )


UNIT_TASKS = 20


def unit_costs(inventory: Path, workdir: Path, env: dict[str, str]) -> dict[str, float]:
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
        plays = {"hosts": "gpu_nodes", "become": True, "gather_facts": False, "tasks": tasks}
        playbook.write_text(yaml.safe_dump([plays]), encoding="utf-8")
        # The play's own start-up, measured with one task, is taken off.
        base = workdir / f"unit-{kind}-base.yml"
        base.write_text(yaml.safe_dump([dict(plays, tasks=tasks[:1])]), encoding="utf-8")
        _report, ctl_base, _main, nodes_base = play(base, inventory, 1, env)
        report, ctl, _main, nodes = play(playbook, inventory, 1, env)
        hosts = len(report["stats"])
        per = (UNIT_TASKS - 1) * hosts
        costs[f"{kind} control"] = (ctl - ctl_base) / per * 1000
        costs[f"{kind} node"] = (nodes - nodes_base) / per * 1000
    return costs


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def task_profile(report: dict) -> list[tuple[str, float, bool]]:
    """Each task of a json-callback report: its name (role prefixed), its seconds, and whether all hosts skipped it.
    (Under a strategy other than linear the callback records each host's run of a task on its own.)"""
    tasks = []
    for each in report["plays"]:
        for task in each["tasks"]:
            duration = task["task"].get("duration") or {}
            if not duration.get("start") or not duration.get("end"):
                continue
            hosts = task["hosts"].values()
            skipped = bool(hosts) and all(h.get("skipped") for h in hosts)
            tasks.append((task["task"]["name"], _seconds(duration["end"]) - _seconds(duration["start"]), skipped))
    return tasks


def ran_on_the_node(result: dict) -> int:
    """How many module runs on its host a task's result stands for: 0 when skipped or failed, when delegated (to
    the control host: the Kubernetes API tasks) or when the control host answers it alone; one per loop item."""
    if result.get("skipped") or result.get("failed") or "_ansible_delegated_vars" in result:
        return 0
    if result.get("action", "").rsplit(".", 1)[-1] in CONTROL_ACTIONS:
        return 0
    items = result.get("results")
    if isinstance(items, list):
        return sum(1 for item in items if isinstance(item, dict) and not item.get("skipped") and not item.get("failed"))
    return 1


def module_runs(report: dict) -> dict[str, int]:
    """Module runs on the nodes per role (all hosts together), from a json-callback report."""
    runs: dict[str, int] = {}
    for each in report["plays"]:
        for task in each["tasks"]:
            count = sum(ran_on_the_node(result) for result in task["hosts"].values())
            if count:
                role = role_of(task["task"]["name"])
                runs[role] = runs.get(role, 0) + count
    return runs


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


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def seconds_text(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.1f} {unit}"


def ratio_text(numerator: float | None, denominator: float | None) -> str:
    return "-" if numerator is None or not denominator else f"{numerator / denominator:.2f} x"


def runs_text(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def progress(text: str) -> None:
    print(text, flush=True)


def parse_strategies(text: str | None) -> list[str]:
    if text is None:
        return ["linear", "mitogen"] if mitogen_version() else ["linear"]
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown or not names:
        raise SystemExit(f"bench_site: --strategies takes linear and/or mitogen, comma-separated; got '{text}'")
    if "mitogen" in names and not mitogen_version():
        raise SystemExit("bench_site: --strategies names mitogen, which is not installed (requirements/mitogen.txt)")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="repetitions of each first run (default 1)")
    parser.add_argument("--spec", default="h100x8", help="simulated-GPU spec for every node (default h100x8)")
    parser.add_argument("--hosts", type=int, default=4, help="nodes for the forks comparison (default 4)")
    parser.add_argument("--only", choices=["one", "many"], help="only the one-host or only the many-host part")
    parser.add_argument(
        "--no-forks-1", action="store_true", help="many hosts at forks N only (skips the serial run, N times as long)"
    )
    parser.add_argument(
        "--strategies",
        help="comma-separated: linear, mitogen (default: both where Mitogen is installed, else linear)",
    )
    parser.add_argument(
        "--control-cores", type=int, default=16, help="the control host's cores in the projection (default 16)"
    )
    args = parser.parse_args()
    strategies = parse_strategies(args.strategies)
    if lab_is_up():
        print("bench_site: this lab instance is up; take it down first (tests/e2e/lab.py down)", file=sys.stderr)
        return 1
    subprocess.run([str(REPO / "scripts" / "collection-tree.sh")], check=True, stdout=subprocess.DEVNULL)
    count = gpu_count(args.spec)
    instance = os.environ.get("GPUOPS_LAB_INSTANCE", "0")
    progress(
        f"bench_site: lab instance {instance}, spec {args.spec} ({count} x {RESOURCE}), {os.cpu_count()} CPUs,"
        f" strategies {', '.join(STRATEGIES[s] for s in strategies)}"
    )

    results = {name: Results(many={args.hosts: [], 1: []}) for name in strategies}
    n = args.hosts
    with tempfile.TemporaryDirectory(prefix="bench-site-") as tmp:
        workdir = Path(tmp)
        try:
            for attempt in range(args.runs if args.only != "many" else 0):
                for name in strategies:
                    env, res = strategy_env(name), results[name]
                    inventory, kubeconfig, nodes = fresh_lab(1, args.spec, workdir)
                    res.first.append(site(inventory, 1, env, watch=(kubeconfig, nodes, count)))
                    progress(f"  {name}, 1 host, run {attempt + 1}: first {res.first[-1].describe()}")
                    res.second.append(site(inventory, 1, env))
                    progress(f"  {name}, 1 host, run {attempt + 1}: second {res.second[-1].describe()}")
                    if attempt == args.runs - 1:
                        # The converged node is still up: what one task costs, whatever it does.
                        res.units = unit_costs(inventory, workdir, env)
                        progress(f"  {name}, 1 host, unit costs (CPU ms per task and host): {res.units}")
            for attempt in range(args.runs if args.only != "one" else 0):
                for forks in (n,) if args.no_forks_1 else (n, 1):
                    for name in strategies:
                        env, res = strategy_env(name), results[name]
                        inventory, kubeconfig, nodes = fresh_lab(n, args.spec, workdir)
                        res.many[forks].append(site(inventory, forks, env, watch=(kubeconfig, nodes, count)))
                        where = f"  {name}, {n} hosts, forks {forks}, run {attempt + 1}"
                        progress(f"{where}: first {res.many[forks][-1].describe()}")
                        if forks == n:
                            res.many_noop.append(site(inventory, forks, env))
                            progress(f"{where}: no-op {res.many_noop[-1].describe()}")
        except subprocess.CalledProcessError as error:
            # A lab that does not come up (its error is above) ends the runs; what was measured is still reported.
            progress(
                f"bench_site: {' '.join(map(str, error.cmd))} failed (exit {error.returncode}); the runs stop here"
            )
        finally:
            if lab_is_up():
                lab("down", timeout=300)
    report(args, count, strategies, results)
    return 0


class Table:
    """Rows of figures, one column per strategy, and Mitogen's over linear's where both ran."""

    def __init__(self, strategies: list[str]) -> None:
        self.strategies = strategies
        self.both = set(strategies) == {"linear", "mitogen"}
        header = "".join(f"{STRATEGIES[s]:>16}" for s in strategies)
        print(f"  {'':46}{header}" + (f"{'mitogen / linear':>19}" if self.both else ""))

    def row(self, label: str, values: dict[str, float | None], unit: str = "s", ratio: bool = True) -> None:
        cells = "".join(f"{seconds_text(values.get(s), unit):>16}" for s in self.strategies)
        tail = ""
        if self.both and ratio:
            tail = f"{ratio_text(values.get('mitogen'), values.get('linear')):>19}"
        print(f"  {label:46}{cells}{tail}")

    def text_row(self, label: str, values: dict[str, str]) -> None:
        print(f"  {label:46}" + "".join(f"{values.get(s, '-'):>16}" for s in self.strategies))


def walls(runs: list[Run]) -> list[float]:
    return [r.wall for r in runs]


def report(args: argparse.Namespace, count: int, strategies: list[str], results: dict[str, Results]) -> None:
    n = args.hosts
    version = mitogen_version()
    print()
    print(
        f"site.yml, median of {args.runs} run(s) each; first runs on fresh lab nodes ({args.spec});"
        f" strategies side by side{f' (mitogen {version})' if 'mitogen' in strategies else ''}"
    )
    table = Table(strategies)

    def each(value) -> dict[str, float | None]:
        return {s: value(results[s]) for s in strategies}

    table.row("1 host     first run", each(lambda r: median(walls(r.first))))
    table.row("1 host     second (no-op) run", each(lambda r: median(walls(r.second))))
    table.row("           first / second", each(lambda r: _ratio(walls(r.first), walls(r.second))), "x", False)
    table.row(f"{n} hosts    first run, forks {n}", each(lambda r: median(walls(r.many[n]))))
    table.row(f"{n} hosts    first run, forks 1", each(lambda r: median(walls(r.many[1]))))
    table.row(f"           forks 1 / forks {n}", each(lambda r: _ratio(walls(r.many[1]), walls(r.many[n]))), "x", False)
    table.row(
        f"           {n} hosts forks {n} / 1 host", each(lambda r: _ratio(walls(r.many[n]), walls(r.first))), "x", False
    )
    table.row(f"{n} hosts    no-op run, forks {n}", each(lambda r: median(walls(r.many_noop))))
    table.row(
        f"           {n} hosts no-op / 1 host no-op",
        each(lambda r: _ratio(walls(r.many_noop), walls(r.second))),
        "x",
        False,
    )
    for s in strategies:
        r = results[s]
        print(
            f"  {STRATEGIES[s]}: runs (s): 1-host first {runs_text(walls(r.first))};"
            f" no-op {runs_text(walls(r.second))};"
            f" {n}-host first forks {n} {runs_text(walls(r.many[n]))}; forks 1 {runs_text(walls(r.many[1]))};"
            f" no-op {runs_text(walls(r.many_noop))}"
        )
        print(
            f"  {STRATEGIES[s]}: tasks changed on the no-op runs: 1 host {[x.changed for x in r.second]},"
            f" {n} hosts {[x.changed for x in r.many_noop]}"
        )

    print(f"CPU seconds on this machine ({os.cpu_count()} CPUs; the lab's nodes share them), medians")
    print("  (control host: ansible-playbook and everything it started; 'in ansible-playbook': its own process, whose")
    print("  work is done on one core)")
    table = Table(strategies)
    for label, pick in (
        ("1 host, no-op", lambda r: r.second),
        ("1 host, first", lambda r: r.first),
        (f"{n} hosts, no-op, forks {n}", lambda r: r.many_noop),
        (f"{n} hosts, first, forks {n}", lambda r: r.many[n]),
    ):
        table.row(f"{label}: control host", each(lambda r, p=pick: median([x.controller_cpu for x in p(r)])))
        table.row(f"{label}: in ansible-playbook", each(lambda r, p=pick: median([x.main_cpu for x in p(r)])))
        table.row(f"{label}: node containers", each(lambda r, p=pick: median([x.nodes_cpu for x in p(r)])))
    for s in strategies:
        r = results[s]
        if r.second and r.many_noop:
            # No schedule finishes sooner than its CPU work spread over every core of the machine.
            need = statistics.median(x.controller_cpu + x.nodes_cpu for x in r.many_noop)
            floor = need / (os.cpu_count() or 1)
            print(
                f"  {STRATEGIES[s]}: the {n}-host no-op run needs {need:.1f} CPU-s here: on {os.cpu_count()} CPUs no"
                f" less than {floor:.1f} s, {floor / statistics.median(walls(r.second)):.2f} x the 1-host no-op,"
                " before any wait"
            )

    if any(results[s].units for s in strategies):
        print(f"what one task costs here, CPU ms per task and host ({UNIT_TASKS} tasks on the 1-host lab, with become)")
        table = Table(strategies)
        table.row("a module run (ping): control host", each(lambda r: r.units.get("module control")), "ms")
        table.row("a module run (ping): node", each(lambda r: r.units.get("module node")), "ms")
        table.row("a task every host skips: control host", each(lambda r: r.units.get("skipped control")), "ms")

    noop_runs = {s: results[s].second[-1].module_runs for s in strategies if results[s].second}
    if noop_runs:
        print(
            "module runs on the node in the 1-host no-op run, per role (not skipped, not delegated, not control-only)"
        )
        table = Table(strategies)
        roles = sorted({role for runs in noop_runs.values() for role in runs})
        for role in roles:
            table.text_row(role, {s: str(runs.get(role, 0)) for s, runs in noop_runs.items()})
        table.text_row("total", {s: str(sum(runs.values())) for s, runs in noop_runs.items()})

    print(f"time from site.yml's start until allocatable {RESOURCE} = {count}, polled from the API server")
    table = Table(strategies)
    table.row(
        "1 host", each(lambda r: median([v for x in r.first for v in x.allocatable_at.values() if v is not None]))
    )
    table.row(
        f"{n} hosts, forks {n}, the last node",
        each(
            lambda r: median(
                [max(v for v in x.allocatable_at.values() if v is not None) for x in r.many[n] if x.all_reached()]
            )
        ),
    )
    for s in strategies:
        loads = [r.load_before for r in results[s].all_runs()]
        print(f"{STRATEGIES[s]}: machine load (1 min / 5 min) at the start of each run: {', '.join(loads)}")

    for s in strategies:
        r = results[s]
        if r.first:
            print()
            print_profile(f"{STRATEGIES[s]}: profile of the last 1-host first run", r.first[-1])
        if r.second:
            print()
            print_profile(f"{STRATEGIES[s]}: profile of the last 1-host no-op run", r.second[-1])

    projection(args, strategies, results)


def _ratio(numerator: list[float], denominator: list[float]) -> float | None:
    if not numerator or not denominator:
        return None
    return statistics.median(numerator) / statistics.median(denominator)


@dataclass
class PerNode:
    """What a run costs per node and once, from a one-host run and a many-host run at forks = hosts."""

    control: float  # control-host CPU-s per node
    main: float  # of it in ansible-playbook's own process
    fixed_control: float  # control-host CPU-s once per run
    fixed_main: float
    wall: float  # one node's run, wall seconds
    source: str

    @classmethod
    def measure(cls, one: list[Run], many: list[Run], hosts: int) -> PerNode | None:
        if not one:
            return None
        c1 = statistics.median(r.controller_cpu for r in one)
        m1 = statistics.median(r.main_cpu for r in one)
        wall = statistics.median(r.wall for r in one)
        if not many or hosts < 2:
            return cls(c1, m1, 0.0, 0.0, wall, "the 1-host run's whole cost counted per node (no many-host run)")
        cn = statistics.median(r.controller_cpu for r in many)
        mn = statistics.median(r.main_cpu for r in many)
        control = max((cn - c1) / (hosts - 1), 0.0)
        main = max((mn - m1) / (hosts - 1), 0.0)
        source = f"per node: ({hosts}-host run - 1-host run) / {hosts - 1}; once: the 1-host run less one node"
        return cls(control, main, max(c1 - control, 0.0), max(m1 - main, 0.0), wall, source)

    def project(self, nodes: int, forks: int, slices: int, cores: int) -> tuple[float, float]:
        """(wall seconds, control-host CPU seconds of all slices together) for a run over ``nodes``."""
        per_slice = math.ceil(nodes / slices)
        batches = math.ceil(per_slice / forks) * self.wall
        serial = self.fixed_main + per_slice * self.main
        spread = (self.fixed_control + per_slice * self.control) / cores
        return max(batches, serial, spread), slices * self.fixed_control + nodes * self.control


def duration_text(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def projection(args: argparse.Namespace, strategies: list[str], results: dict[str, Results]) -> None:
    n, cores = args.hosts, args.control_cores
    print()
    print("projection to a fleet from the per-node costs above: wall time (the largest of three limits) and the")
    print("control host's CPU time of all slices together")
    print(f"  assumptions: a control host of {cores} cores (--control-cores), nothing else running on it; the linear")
    print("  strategy (mitogen_linear keeps its barrier): a task waits for every node of the play, so a batch of")
    print("  `forks` nodes takes one node's wall time of the 1-host run; ansible-playbook's own process works on one")
    print("  core, one node after another; the rest of the control host's CPU spreads over every core; per-node")
    print(f"  costs independent of the fleet's size (from the {n}-host run at forks {n} against the 1-host run);")
    print("  the Kubernetes API calls batched (labels: one LIST and one PATCH per changed node per batch), so they")
    print("  are in the once-per-run part; AWX job slices each on an execution node of their own with as many cores,")
    print("  all at the same time; the nodes, the package mirror and the network never the limit.")
    for s in strategies:
        r = results[s]
        for label, one, many in (("no-op run", r.second, r.many_noop), ("first run", r.first, r.many[n])):
            cost = PerNode.measure(one, many, n)
            if cost is None:
                continue
            print(
                f"  {STRATEGIES[s]}, {label}: per node {cost.control:.2f} CPU-s on the control host"
                f" ({cost.main:.2f} in ansible-playbook itself), once per run {cost.fixed_control:.1f} CPU-s;"
                f" one node's run {cost.wall:.1f} s ({cost.source})"
            )
            header = "".join(f"{layout[0]:>22}" for layout in PROJECTED_LAYOUTS)
            print(f"    {'nodes':>8}{header}{'control-host CPU':>20}")
            for nodes in PROJECTED_NODES:
                cells = "".join(
                    f"{duration_text(cost.project(nodes, forks, slices, cores)[0]):>22}"
                    for _label, forks, slices in PROJECTED_LAYOUTS
                )
                # One job's CPU; each further slice adds the once-per-run part.
                print(f"    {nodes:>8,}{cells}{duration_text(cost.project(nodes, 1, 1, cores)[1]):>20}")


if __name__ == "__main__":
    sys.exit(main())
