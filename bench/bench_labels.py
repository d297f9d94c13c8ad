"""Labels and taints on many nodes: the gpu_node_labels role, as Ansible runs it, over 1,000 Node objects.

    python bench/bench_labels.py [--nodes 1000] [--forks 10]

What it does, against the lab's real kube-apiserver (tests/e2e/lab.py; GPUOPS_LAB_INSTANCE is honoured):
- registers N Node objects (``gpuops-bench-node-NNNN``, no kubelet behind them) through the API;
- writes an inventory of N hosts, half with the GPU information of a simulated 8 x H100 node and half of a
  1 x T4 node. That information is computed once, up front, by gpuops.k8s.nvidia_gpu_info on the
  simulated specs and handed to the role as ``gpu_node_labels_gpu_info``, so no node is contacted: what is
  timed is the role's work on the control host and its API calls;
- runs ``ansible-playbook`` with the role twice: the first run labels and taints every node, the second
  finds nothing to change;
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


def run_role(workdir: Path, inventory: Path, forks: int, env: dict[str, str]) -> tuple[float, int, int]:
    """One ansible-playbook run of the role over every host: (wall seconds, hosts changed, hosts failed)."""
    playbook = workdir / "label.yml"
    playbook.write_text(
        "- name: Label the benchmark's nodes\n  hosts: bench_nodes\n  gather_facts: false\n"
        "  roles:\n    - gpuops.k8s.gpu_node_labels\n"
    )
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
    recap = re.findall(r"^gpuops-bench-node-\d+\s*:.*?changed=(\d+).*?failed=(\d+)", done.stdout, re.MULTILINE)
    if done.returncode != 0 or not recap:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-2000:])
        raise SystemExit(f"bench_labels: ansible-playbook failed (exit {done.returncode})")
    changed = sum(1 for c, _failed in recap if int(c) > 0)
    failed = sum(1 for _changed, f in recap if int(f) > 0)
    return wall, changed, failed


def set_kubelets(nodes: list[str], action: str) -> None:
    for node in nodes:
        subprocess.run(["podman", "exec", node, "systemctl", action, "kubelet"], check=True, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="Node objects to register and label (default 1000)")
    parser.add_argument("--forks", type=int, default=10, help="ansible-playbook --forks (default 10)")
    args = parser.parse_args()

    from kubernetes import client, config

    collection = subprocess.run(
        [str(REPO / "scripts" / "collection-tree.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(Path(collection).parents[2]),
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
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="gpuops-bench-labels-") as tmp:
            workdir = Path(tmp)
            infos = {kind: gpu_info(spec, workdir, env) for kind, spec in SPECS.items()}
            inventory = write_inventory(workdir, names, kubeconfig, infos)

            start = time.monotonic()
            for name in names:
                core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={BENCH_LABEL: "true"})))
            registered = time.monotonic() - start
            print(f"registered {len(names)} Node objects in {registered:.1f} s", file=sys.stderr)

            set_kubelets(lab_nodes, "stop")
            # The controller manager's node lifecycle controller would be taking up the new nodes (taints,
            # status) while the role runs, and its requests would count with the role's: it is paused.
            controller_manager = int((Path(kubeconfig).parent / "run" / "kube-controller-manager.pid").read_text())
            os.kill(controller_manager, signal.SIGSTOP)
            try:
                for label in ("first run", "second run"):
                    before = request_counts(api)
                    wall, changed, failed = run_role(workdir, inventory, args.forks, env)
                    after = request_counts(api)
                    results.append((label, wall, changed, failed, after - before))
                    print(f"{label}: {wall:.1f} s, {changed} nodes changed", file=sys.stderr)
            finally:
                os.kill(controller_manager, signal.SIGCONT)
                set_kubelets(lab_nodes, "start")

            sample = core.read_node(names[0])
            labelled = sum(1 for k in (sample.metadata.labels or {}) if k.startswith("nvidia.com/"))
            taints = [f"{t.key}={t.value}:{t.effect}" for t in sample.spec.taints or []]
    finally:
        core.delete_collection_node(label_selector=f"{BENCH_LABEL}=true")
        api.close()
        if brought_up:
            lab("down")

    print(f"gpu_node_labels over {args.nodes} Node objects, ansible-playbook --forks {args.forks}")
    print("(GPU information precomputed from simulated specs; no node contacted;")
    print(" the lab's kubelets stopped and its controller manager paused while the runs were counted)")
    print(f"{names[0]} now has {labelled} nvidia.com/ labels and taints {taints}")
    print()
    header = f"{'':34}" + "".join(f"{label:>14}" for label, *_rest in results)
    print(header)
    print(f"{'wall time (s)':34}" + "".join(f"{r[1]:14.1f}" for r in results))
    print(f"{'per node (ms)':34}" + "".join(f"{1000 * r[1] / args.nodes:14.1f}" for r in results))
    print(f"{'hosts reporting changed':34}" + "".join(f"{r[2]:14d}" for r in results))
    print(f"{'hosts failed':34}" + "".join(f"{r[3]:14d}" for r in results))

    # The role reads and patches Node objects (and may ask for discovery); everything else in the interval is the
    # API server's own loopback traffic (its lease renewals, its informers' watch restarts), printed apart.
    def by_role(key: tuple[str, str]) -> bool:
        verb, resource = key
        return (resource == "nodes" and verb != "WATCH") or resource.startswith("discovery")

    print("API requests of the role (verb resource)")
    keys = sorted({k for r in results for k, v in r[4].items() if v > 0 and by_role(k)}, key=lambda k: (k[1], k[0]))
    for verb, resource in keys:
        print(f"  {verb + ' ' + resource:32}" + "".join(f"{r[4][(verb, resource)]:14d}" for r in results))
    write_verbs = ("PATCH", "PUT", "POST", "DELETE")
    writes = [sum(v for (verb, _res), v in r[4].items() if verb in write_verbs and v > 0) for r in results]
    role_writes = [
        sum(v for (verb, res), v in r[4].items() if verb in write_verbs and v > 0 and by_role((verb, res)))
        for r in results
    ]
    print(f"{'  writes':34}" + "".join(f"{w:14d}" for w in role_writes))
    print("the API server's own requests in the same interval (no kubelet running)")
    print(f"{'  PUT leases':34}" + "".join(f"{r[4][('PUT', 'leases')]:14d}" for r in results))
    watches = [sum(v for (verb, _res), v in r[4].items() if verb == "WATCH" and v > 0) for r in results]
    print(f"{'  WATCH (watch restarts, all)':34}" + "".join(f"{w:14d}" for w in watches))
    other = [
        sum(
            v
            for (verb, res), v in r[4].items()
            if v > 0 and not by_role((verb, res)) and verb != "WATCH" and (verb, res) != ("PUT", "leases")
        )
        for r in results
    ]
    print(f"{'  other':34}" + "".join(f"{o:14d}" for o in other))
    print(f"{'all writes in the interval':34}" + "".join(f"{w:14d}" for w in writes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
