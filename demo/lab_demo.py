"""`make demo`: the collection turns two simulated GPU nodes of a real Kubernetes lab into GPU nodes.

    python demo/lab_demo.py [--specs h100x8 t4x1]

1. brings the lab up (tests/e2e/lab.py: etcd + kube-apiserver on 127.0.0.1, one podman container with
   systemd, containerd and a kubelet per node), reusing the cached Kubernetes build and images;
2. gives each node a simulated-GPU spec and writes an Ansible inventory for them (``lab.py inventory``);
3. runs ``playbooks/site.yml`` on both nodes, one progress line per stage;
4. waits until every node advertises allocatable ``nvidia.com/gpu``;
5. runs ``playbooks/validate.yml`` through each node's NVML (the lab's mock libnvidia-ml.so.1, not the
   spec) and prints its table (node, GPU model, count, allocatable, labels, taint, plugin status).

The lab instance is GPUOPS_LAB_INSTANCE (0 unless set); ``make demo-clean`` (``lab.py down``) removes
everything. Logs of every run are kept under the lab's state directory, in ``demo/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB_PY = REPO / "tests" / "e2e" / "lab.py"
NODES = 2
ALLOCATABLE_TIMEOUT = float(os.environ.get("GPUOPS_DEMO_ALLOCATABLE_TIMEOUT", "180"))
TASK_LINE = re.compile(r"^TASK \[(?:(?P<role>[\w.]+) : )?(?P<task>.*?)\] \*+$")
RECAP_LINE = re.compile(
    r"^(?P<host>\S+)\s*: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unr>\d+)\s+failed=(?P<failed>\d+)"
)

START = time.monotonic()


class DemoError(Exception):
    """A stage failed; the message says which and where its log is."""


def say(message: str, end: str = "\n") -> None:
    elapsed = int(time.monotonic() - START)
    print(f"[demo] {elapsed // 60:2d}:{elapsed % 60:02d}  {message}", end=end, flush=True)


def lab(*args: str, stdout=subprocess.PIPE) -> str:
    """Run lab.py; its own progress lines ([lab] ...) go to the terminal."""
    done = subprocess.run([str(LAB_PY), *args], stdout=stdout, text=True, check=False, timeout=3600)
    if done.returncode != 0:
        raise DemoError(f"tests/e2e/lab.py {' '.join(args)} failed (exit {done.returncode}); see its messages above")
    return done.stdout or ""


def ansible_env() -> dict[str, str]:
    collection = subprocess.run(
        [str(REPO / "scripts" / "collection-tree.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    return dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(Path(collection).parents[2]),
        ANSIBLE_FORCE_COLOR="false",
        ANSIBLE_NOCOLOR="true",
        ANSIBLE_RETRY_FILES_ENABLED="false",
    )


def stage_name(role: str | None, task: str) -> str:
    if role:
        return role.rsplit(".", 1)[-1]
    if task == "Gathering Facts":
        return "facts"
    return "discovery" if "Discover" in task else task


def run_site(inventory: Path, log: Path, env: dict[str, str]) -> dict[str, dict[str, int]]:
    """site.yml with the default output into ``log``; one line per stage (role): its name when it starts,
    its duration appended when the next one starts."""
    say(f"site.yml: started on {NODES} nodes (full output: {log})")
    current = None
    stage_start = time.monotonic()
    recap: dict[str, dict[str, int]] = {}
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["ansible-playbook", "-i", str(inventory), str(REPO / "playbooks" / "site.yml")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(env, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default"),
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            task = TASK_LINE.match(line.rstrip())
            if task:
                stage = stage_name(task.group("role"), task.group("task"))
                if stage != current:
                    if current is not None:
                        print(f" {time.monotonic() - stage_start:6.1f} s", flush=True)
                    current, stage_start = stage, time.monotonic()
                    say(f"  {current:<18}", end="")
            counts = RECAP_LINE.match(line)
            if counts:
                recap[counts.group("host")] = {k: int(v) for k, v in counts.groupdict().items() if k != "host"}
        rc = proc.wait()
    if current is not None:
        print(f" {time.monotonic() - stage_start:6.1f} s", flush=True)
    if rc != 0:
        tail = log.read_text().splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        raise DemoError(f"site.yml failed (exit {rc}); the full output is in {log}")
    return recap


def allocatable(node: str) -> int:
    out = lab("kubectl", "get", "node", node, "-o", r"jsonpath={.status.allocatable.nvidia\.com/gpu}")
    return int(out.strip() or 0)


def gpu_count(spec_path: Path) -> int:
    """How many GPUs a simulated spec lists (the count the plugin should advertise)."""
    import yaml

    spec = yaml.safe_load(spec_path.read_text()) or {}
    return len(spec.get("gpus") or [])


def wait_allocatable(nodes: list[str], wanted: dict[str, int]) -> dict[str, int]:
    say("waiting for allocatable nvidia.com/gpu on every node")
    deadline = time.monotonic() + ALLOCATABLE_TIMEOUT
    seen: dict[str, int] = {}
    while True:
        seen = {node: allocatable(node) for node in nodes}
        if all(seen[node] == wanted[node] for node in nodes):
            return seen
        if time.monotonic() > deadline:
            raise DemoError(
                f"allocatable nvidia.com/gpu did not reach {wanted} within {ALLOCATABLE_TIMEOUT:.0f} s "
                f"(last seen: {seen})"
            )
        time.sleep(0.5)


def run_validate(inventory: Path, log: Path, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """validate.yml with JSON output into ``log``: (the table's lines, messages of failed checks)."""
    say("validate.yml: checking driver, runtime, plugin, allocatable, labels and taint on every node")
    # Without the simulated spec: the table's GPUs come from each node's NVML (the lab's mock
    # libnvidia-ml.so.1, docs/mock-nvml.md), as on a node with a driver.
    with log.open("w") as out:
        done = subprocess.run(
            [
                "ansible-playbook",
                "-i",
                str(inventory),
                str(REPO / "playbooks" / "validate.yml"),
                "-e",
                "gpuops_simulate_from=",
            ],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"),
            check=False,
            timeout=1800,
        )
    try:
        report = json.loads(log.read_text())
    except json.JSONDecodeError as error:
        raise DemoError(
            f"validate.yml printed no report (exit {done.returncode}): {done.stderr.strip()[-500:]}"
        ) from error
    table: list[str] = []
    red: list[str] = []
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            for host, result in task.get("hosts", {}).items():
                if task["task"]["name"] == "Show every node" and isinstance(result.get("msg"), list):
                    table = result["msg"]
                if result.get("failed") or result.get("unreachable"):
                    red.append(f"{host}: {task['task']['name']}: {result.get('msg', '')}")
    if not table and not red:
        red.append(f"validate.yml printed no table (exit {done.returncode})")
    return table, red


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--specs",
        nargs=NODES,
        default=["h100x8", "t4x1"],
        metavar="SPEC",
        help="simulated-GPU spec of each node: a name from tests/fixtures/simulated/ or a file (default: h100x8 t4x1)",
    )
    parser.add_argument(
        "--removed-after",
        action="store_true",
        help="the caller removes the lab afterwards (make demo-test): no hints about looking around",
    )
    args = parser.parse_args()
    instance = os.environ.get("GPUOPS_LAB_INSTANCE", "0")

    try:
        say(f"lab up: control plane and {NODES} GPU nodes (lab instance {instance}); the first run builds Kubernetes")
        stage = time.monotonic()
        lab("up", str(NODES), stdout=subprocess.DEVNULL)
        say(f"lab up: done in {time.monotonic() - stage:.1f} s")

        state = Path(lab("kubeconfig").strip()).parent / "demo"
        state.mkdir(exist_ok=True)
        nodes = lab("nodes").split()
        say(f"lab inventory: simulated GPUs {', '.join(f'{s} on {n}' for s, n in zip(args.specs, nodes))}")
        stage = time.monotonic()
        inventory = state / "inventory.yml"
        inventory.write_text(lab("inventory", *args.specs))
        say(f"lab inventory: done in {time.monotonic() - stage:.1f} s ({inventory})")
        wanted = {node: gpu_count(Path(lab("spec-path", str(i)).strip())) for i, node in enumerate(nodes, 1)}

        env = ansible_env()
        site_start = time.monotonic()
        recap = run_site(inventory, state / "site.log", env)
        changes = ", ".join(f"{host} {c['changed']}" for host, c in sorted(recap.items()) if host != "localhost")
        say(f"site.yml: done in {time.monotonic() - site_start:.1f} s (tasks changed: {changes})")

        seen = wait_allocatable(nodes, wanted)
        say(
            "allocatable nvidia.com/gpu: "
            + ", ".join(f"{node} {seen[node]}" for node in nodes)
            + f" ({time.monotonic() - site_start:.1f} s after site.yml started)"
        )

        stage = time.monotonic()
        table, red = run_validate(inventory, state / "validate.json", env)
        say(f"validate.yml: done in {time.monotonic() - stage:.1f} s")
    except DemoError as error:
        say(f"failed: {error}")
        return 1

    print()
    print("\n".join(table))
    print()
    if red:
        for line in red:
            print(f"red: {line}")
        hint = "" if args.removed_after else "; `make demo-clean` removes the lab"
        say(f"validation found red checks (above){hint}")
        return 1
    if args.removed_after:
        say(f"done in {time.monotonic() - START:.0f} s")
    else:
        say(
            f"done in {time.monotonic() - START:.0f} s. Try: GPUOPS_LAB_INSTANCE={instance} tests/e2e/lab.py kubectl "
            "get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count; `make demo-clean` removes the lab"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
