"""Labels and taints on many nodes: the gpu_node_labels role, as Ansible runs it, over 1,000 Node objects.

    python bench/bench_labels.py [--nodes 1000] [--forks 10] [--runs 3] [--entries main,fleet]
                                 [--baseline REF [--baseline-runs N]]

What it does, against the lab's real kube-apiserver (tests/e2e/lab.py; GPUOPS_LAB_INSTANCE is honoured):
- registers N Node objects (``gpuops-bench-node-NNNN``, no kubelet behind them) through the API;
- writes an inventory of N hosts, half with the GPU information of a simulated 8 x H100 node and half of a
  1 x T4 node. That information is computed once, up front, by gpuops.k8s.nvidia_gpu_info on the
  simulated specs and handed to the role as ``gpu_node_labels_gpu_info``, so no node is contacted: what is
  timed is the role's work on the control host and its API calls;
- runs ``ansible-playbook`` with the role twice: the first run labels and taints every node, the second
  finds nothing to change; the Node objects are deleted and registered again for each repetition, and the
  medians of --runs repetitions are printed. Each entry point of --entries is a column: ``main``, the role in
  a play over the N hosts (what site.yml does; per host the argument check and the skipped discovery), and
  ``fleet``, its ``fleet`` entry point in a play on the control host over the same hosts (no task per host);
- with --baseline REF, does the same with the role's main entry point as it is at git REF (checked out in a
  git worktree), the repetitions of all interleaved, and prints them side by side;
- counts the API server's requests during each run by verb and resource (the difference of its
  ``apiserver_request_total`` counters before and after) and prints them side by side with the wall times.

The lab's kubelets are stopped and its controller manager is paused (SIGSTOP) while the runs are
counted, so their heartbeats and the node lifecycle controller's work on the new nodes do not mix into
the counts; both resume afterwards. What remains besides the role is the API server's own traffic (its
lease renewals, its informers' watch restarts), printed apart from the role's requests. The benchmark's
Node objects are deleted at the end. When the lab is not up it brings one up (one node) and takes it down
again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB_PY = REPO / "tests" / "e2e" / "lab.py"
SPECS = {
    "h100x8": REPO / "tests" / "fixtures" / "simulated" / "h100x8.yaml",
    "t4x1": REPO / "tests" / "fixtures" / "simulated" / "t4x1.yaml",
}
BENCH_LABEL = "gpuops.k8s/benchmark"
METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def lab(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LAB_PY), *args], check=check, stdout=subprocess.PIPE, text=True, timeout=1800)


def request_counts(api) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (verb, resource[/subresource]); discovery shows as its path."""
    method, url, headers, body, _files = api.param_serialize("GET", "/metrics", header_params={"Accept": "text/plain"})
    response = api.call_api(method, url, header_params=headers, body=body)
    response.read()
    text = response.data.decode()
    counts: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        match = METRIC.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        resource = labels.get("resource", "")
        sub = labels.get("subresource", "")
        if resource:
            name = f"{resource}/{sub}" if sub else resource
        else:
            name = f"discovery /{sub.lstrip('/')}" if sub else "(other)"
        counts[(labels.get("verb", "?"), name)] += int(float(match.group("value")))
    return counts


def gpu_info(spec: Path, workdir: Path, env: dict[str, str]) -> dict:
    """What gpuops.k8s.nvidia_gpu_info reports for a simulated spec, computed once on the control host."""
    out = workdir / f"{spec.stem}.json"
    playbook = workdir / "gpu-info.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - gpuops.k8s.nvidia_gpu_info: {simulate_from: '" + str(spec) + "'}\n      register: info\n"
        "    - ansible.builtin.copy: {content: '{{ info | to_json }}', dest: '" + str(out) + "', mode: '0600'}\n"
    )
    done = subprocess.run(
        [
            *("ansible-playbook", "-i", "localhost,", "-c", "local"),
            *("-e", f"ansible_python_interpreter={sys.executable}", str(playbook)),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-2000:])
        raise SystemExit(f"bench_labels: nvidia_gpu_info on {spec} failed (exit {done.returncode})")
    info = json.loads(out.read_text())
    return {k: v for k, v in info.items() if k not in ("changed", "invocation", "failed")}


def write_inventory(workdir: Path, names: list[str], kubeconfig: str, infos: dict[str, dict]) -> Path:
    kinds = list(infos)
    groups = {kind: {"hosts": {}, "vars": {"gpu_node_labels_gpu_info": infos[kind]}} for kind in kinds}
    for i, name in enumerate(names):
        groups[kinds[i % len(kinds)]]["hosts"][name] = None
    inventory = {
        "all": {
            "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
            "children": {
                "bench_nodes": {
                    "children": groups,
                    "vars": {"ansible_connection": "local", "gpu_node_labels_kubeconfig": kubeconfig},
                }
            },
        }
    }
    path = workdir / "inventory.json"
    path.write_text(json.dumps(inventory))
    return path


PLAYBOOKS = {
    # The role in a play over the hosts, as site.yml runs it.
    "main": "- name: Label the benchmark's nodes\n  hosts: bench_nodes\n  gather_facts: false\n"
    "  roles:\n    - gpuops.k8s.gpu_node_labels\n",
    # Its fleet entry point in a play on the control host, the batch named by the inventory group.
    "fleet": "- name: Label the benchmark's nodes from the control host\n  hosts: localhost\n  gather_facts: false\n"
    "  tasks:\n    - ansible.builtin.include_role:\n        name: gpuops.k8s.gpu_node_labels\n"
    "        tasks_from: fleet\n      vars:\n        gpu_node_labels_hosts: \"{{ groups['bench_nodes'] }}\"\n",
}


def run_role(workdir: Path, inventory: Path, forks: int, env: dict[str, str], entry: str) -> tuple[float, int, int]:
    """One ansible-playbook run of the role over every host: (wall seconds, hosts changed, hosts failed)."""
    playbook = workdir / f"label-{entry}.yml"
    playbook.write_text(PLAYBOOKS[entry])
    start = time.monotonic()
    done = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), "--forks", str(forks), str(playbook)],
        env=dict(env, ANSIBLE_DISPLAY_OK_HOSTS="false", ANSIBLE_DISPLAY_SKIPPED_HOSTS="false"),
        capture_output=True,
        text=True,
        check=False,
        timeout=7200,
    )
    wall = time.monotonic() - start
    recap = re.findall(r"^(?:gpuops-bench-node-\d+|localhost)\s*:.*?changed=(\d+).*?failed=(\d+)", done.stdout, re.M)
    if done.returncode != 0 or not recap:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-2000:])
        raise SystemExit(f"bench_labels: ansible-playbook failed (exit {done.returncode})")
    changed = sum(1 for c, _failed in recap if int(c) > 0)
    failed = sum(1 for _changed, f in recap if int(f) > 0)
    return wall, changed, failed


def load() -> str:
    one, five = os.getloadavg()[:2]
    return f"{one:.1f}/{five:.1f}"


def set_kubelets(nodes: list[str], action: str) -> None:
    for node in nodes:
        subprocess.run(["podman", "exec", node, "systemctl", action, "kubelet"], check=True, timeout=120)


def collection_tree(ref: str | None, workdir: Path) -> str:
    """ANSIBLE_COLLECTIONS_PATH for this checkout, or for REF from a git worktree of it."""
    if ref is None:
        tree = subprocess.run(
            [str(REPO / "scripts" / "collection-tree.sh")], check=True, stdout=subprocess.PIPE, text=True
        ).stdout.strip()
        return str(Path(tree).parents[2])
    worktree = workdir / "baseline-src"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(worktree), ref], check=True)
    dest = workdir / "baseline" / "ansible_collections" / "gpuops" / "k8s"
    subprocess.run([str(worktree / "scripts" / "collection-tree.sh"), str(dest)], check=True, stdout=subprocess.DEVNULL)
    return str(workdir / "baseline")


def measure(core, api, names, workdir, inventory, forks, env, lab_nodes, kubeconfig, entry):
    """Register the Node objects, run the role twice with the kubelets stopped and the controller manager
    paused, delete the Node objects: [(label, wall, changed, failed, requests)] for the two runs."""
    from kubernetes import client

    for name in names:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={BENCH_LABEL: "true"})))
    results = []
    set_kubelets(lab_nodes, "stop")
    # The controller manager's node lifecycle controller would be taking up the new nodes (taints,
    # status) while the role runs, and its requests would count with the role's: it is paused.
    controller_manager = int((Path(kubeconfig).parent / "run" / "kube-controller-manager.pid").read_text())
    os.kill(controller_manager, signal.SIGSTOP)
    try:
        for label in ("first run", "no-op run"):
            before = request_counts(api)
            wall, changed, failed = run_role(workdir, inventory, forks, env, entry)
            after = request_counts(api)
            results.append((label, wall, changed, failed, after - before))
            print(f"  {label}: {wall:.1f} s, {changed} nodes changed (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    finally:
        os.kill(controller_manager, signal.SIGCONT)
        set_kubelets(lab_nodes, "start")
    sample = core.read_node(names[0])
    labelled = sum(1 for k in (sample.metadata.labels or {}) if k.startswith("nvidia.com/"))
    taints = [f"{t.key}={t.value}:{t.effect}" for t in sample.spec.taints or []]
    core.delete_collection_node(label_selector=f"{BENCH_LABEL}=true")
    deadline = time.monotonic() + 120
    while core.list_node(label_selector=f"{BENCH_LABEL}=true", limit=1).items and time.monotonic() < deadline:
        time.sleep(0.5)
    return results, labelled, taints


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="Node objects to register and label (default 1000)")
    parser.add_argument("--forks", type=int, default=10, help="ansible-playbook --forks (default 10)")
    parser.add_argument("--runs", type=int, default=3, help="repetitions of first + no-op run; medians (default 3)")
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also measure the role as it is at git REF (a worktree of this repository), side by side",
    )
    parser.add_argument("--baseline-runs", type=int, help="repetitions for the baseline (default: --runs)")
    parser.add_argument(
        "--entries",
        default="main,fleet",
        help="the role's entry points to measure, comma-separated (default main,fleet)",
    )
    args = parser.parse_args()

    from kubernetes import client, config

    base_env = dict(
        os.environ,
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
        ANSIBLE_HOST_KEY_CHECKING="false",
    )

    brought_up = lab("kubeconfig", check=False).returncode != 0
    if brought_up:
        print("bench_labels: bringing the lab up (one node)", file=sys.stderr)
        lab("up", "1")
    kubeconfig = lab("kubeconfig").stdout.strip()
    lab_nodes = lab("nodes").stdout.split()
    api = config.new_client_from_config(config_file=kubeconfig)
    core = client.CoreV1Api(api)
    names = [f"gpuops-bench-node-{i:04d}" for i in range(1, args.nodes + 1)]
    # variant -> list of [(label, wall, changed, failed, requests)] per repetition
    measured: dict[str, list] = {}
    sample = (0, [])
    try:
        with tempfile.TemporaryDirectory(prefix="gpuops-bench-labels-") as tmp:
            workdir = Path(tmp)
            tree = collection_tree(None, workdir)
            # column name -> (collections path, entry point)
            variants = {entry: (tree, entry) for entry in args.entries.split(",")}
            runs = dict.fromkeys(variants, args.runs)
            if args.baseline:
                variants[args.baseline] = (collection_tree(args.baseline, workdir), "main")
                runs[args.baseline] = args.baseline_runs or args.runs
            env = dict(base_env, ANSIBLE_COLLECTIONS_PATH=tree)
            infos = {kind: gpu_info(spec, workdir, env) for kind, spec in SPECS.items()}
            inventory = write_inventory(workdir, names, kubeconfig, infos)
            for rep in range(max(runs.values())):
                for variant, (collections, entry) in variants.items():
                    if rep >= runs[variant]:
                        continue
                    print(f"{variant}, repetition {rep + 1}", file=sys.stderr)
                    results, *found = measure(
                        core,
                        api,
                        names,
                        workdir,
                        inventory,
                        args.forks,
                        dict(base_env, ANSIBLE_COLLECTIONS_PATH=collections),
                        lab_nodes,
                        kubeconfig,
                        entry,
                    )
                    measured.setdefault(variant, []).append(results)
                    if variant != args.baseline:
                        sample = tuple(found)
            if args.baseline:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(workdir / "baseline-src")],
                    check=False,
                )
    finally:
        core.delete_collection_node(label_selector=f"{BENCH_LABEL}=true")
        api.close()
        if brought_up:
            lab("down")

    print(f"gpu_node_labels over {args.nodes} Node objects, ansible-playbook --forks {args.forks}, load {load()}")
    print("(GPU information precomputed from simulated specs; no node contacted;")
    print(" the lab's kubelets stopped and its controller manager paused while the runs were counted)")
    print(f"{names[0]} got {sample[0]} nvidia.com/ labels and taints {sample[1]}")
    print()
    columns = [(variant, i) for variant in measured for i in range(2)]
    print(f"{'':34}" + "".join(f"{variant[:13]:>14}" for variant, _i in columns))
    print(f"{'':34}" + "".join(f"{('first run', 'no-op run')[i]:>14}" for _variant, i in columns))

    def median(variant, i, pick):
        return statistics.median(pick(rep[i]) for rep in measured[variant])

    print(f"{'repetitions':34}" + "".join(f"{len(measured[v]):14d}" for v, _i in columns))
    print(f"{'wall time, median (s)':34}" + "".join(f"{median(v, i, lambda r: r[1]):14.1f}" for v, i in columns))
    print(
        f"{'wall time, all (s)':34}"
        + "".join(f"{'/'.join(f'{rep[i][1]:.0f}' for rep in measured[v]):>14}" for v, i in columns)
    )
    print(
        f"{'per node, median (ms)':34}"
        + "".join(f"{1000 * median(v, i, lambda r: r[1]) / args.nodes:14.1f}" for v, i in columns)
    )
    # The role reports the batch's change on the host that ran its API step (the batch's first host, or localhost).
    print(f"{'hosts reporting changed':34}" + "".join(f"{measured[v][-1][i][2]:14d}" for v, i in columns))
    print(f"{'hosts failed':34}" + "".join(f"{measured[v][-1][i][3]:14d}" for v, i in columns))

    # The role reads and patches Node objects (and may ask for discovery); everything else in the interval is the
    # API server's own loopback traffic (its lease renewals, its informers' watch restarts), printed apart.
    def by_role(key: tuple[str, str]) -> bool:
        verb, resource = key
        return (resource == "nodes" and verb != "WATCH") or resource.startswith("discovery")

    last = [measured[v][-1][i][4] for v, i in columns]
    print("API requests of the role in the last repetition (verb resource)")
    keys = sorted({k for r in last for k, v in r.items() if v > 0 and by_role(k)}, key=lambda k: (k[1], k[0]))
    for verb, resource in keys:
        print(f"  {verb + ' ' + resource:32}" + "".join(f"{r[(verb, resource)]:14d}" for r in last))
    write_verbs = ("PATCH", "PUT", "POST", "DELETE")
    role_writes = [
        sum(v for (verb, res), v in r.items() if verb in write_verbs and v > 0 and by_role((verb, res))) for r in last
    ]
    print(f"{'  writes':34}" + "".join(f"{w:14d}" for w in role_writes))
    print("the API server's own requests in the same interval (no kubelet running)")
    print(f"{'  PUT leases':34}" + "".join(f"{r[('PUT', 'leases')]:14d}" for r in last))
    watches = [sum(v for (verb, _res), v in r.items() if verb == "WATCH" and v > 0) for r in last]
    print(f"{'  WATCH (watch restarts, all)':34}" + "".join(f"{w:14d}" for w in watches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
