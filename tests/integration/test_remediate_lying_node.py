"""playbooks/remediate.yml, run by the real ansible-playbook against a real kube-apiserver (the control_plane
fixture), for a node that lies: its Python adds crafted ``ansible_facts`` to the results of the modules it runs.

The node is this machine (``ansible_connection: local``) and its Python is a double, ``lying-node-python``: it runs
the real Python and adds to every module's JSON result the facts a compromised node would send, which name the
breaker's limit, another Node as its own and a trap HTTP listener as the API server. The cluster has two Nodes: the
lying node's, with a GPU of class replace, and another node under remediation that holds the one slot
(gpu_remediation_max_nodes 1 in the inventory). Nothing may change on either Node, the breaker holds (the lying node
waits) and no request reaches the trap. The first run's double answers honestly to the fact gathering and lies
afterwards (the settings are pinned before the node can speak again); the second run's double is honest but the
fact cache still holds what the node said in the first (the node is refused before anything is read from it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from adhoc import ansible_environment
from kubernetes import client, config
from local_api import token_admin_api_server

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "gpuops-lying-node-test-admin-token"
LIAR, OTHER = "trust-liar", "trust-other"
TAINT_KEY = "nvidia.com/gpu-remediation"
ANNOTATION = "gpuops.k8s/gpu-remediation"
GPU = "GPU-6f1c0a3e-0000-4000-8000-0000000000a1"

API_SERVER = token_admin_api_server(TOKEN)

# What the double adds to every module result after its first answers: the settings it must not reach.
DOUBLE = """#!{python}
# Test double: a compromised node's Python. Runs the real interpreter and adds crafted ansible_facts to each
# module's JSON result, after the first {honest} answer(s).
import json, subprocess, sys
count_file = {count_file!r}
with open(count_file, "a+") as handle:
    handle.seek(0)
    answered = len(handle.read())
    handle.write(".")
run = subprocess.run([{python!r}, *sys.argv[1:]], stdin=sys.stdin, capture_output=True, text=True)
sys.stderr.write(run.stderr)
try:
    result = json.loads(run.stdout)
except ValueError:
    result = None
if isinstance(result, dict) and answered >= {honest}:
    result.setdefault("ansible_facts", {{}}).update({crafted!r})
    sys.stdout.write(json.dumps(result))
else:
    sys.stdout.write(run.stdout)
sys.exit(run.returncode)
"""


class _Trap(BaseHTTPRequestHandler):
    """The API host the node names: records every request (and its Authorization header) and answers 403."""

    seen: list = []

    def _answer(self):
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def trap():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Trap)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def cluster(control_plane):
    kubeconfig = control_plane.kubeconfig(control_plane.work / "kubeconfig", token=TOKEN)
    core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    core.create_node({"metadata": {"name": LIAR}})
    # The other node is under a reboot remediation: it holds the one slot.
    core.create_node(
        {
            "metadata": {
                "name": OTHER,
                "annotations": {ANNOTATION: json.dumps({"class": "reboot", "since": "2026-11-28T10:00:00Z"})},
            },
            "spec": {"unschedulable": True, "taints": [{"key": TAINT_KEY, "value": "reboot", "effect": "NoSchedule"}]},
        }
    )
    return {"server": control_plane.server, "core": core, "work": control_plane.work}


def _node(core, name):
    node = core.read_node(name).to_dict()
    return node["metadata"]["resource_version"], node["spec"]


def _remediate(cluster, trap, honest, crafted, cache):
    work = cluster["work"] / f"liar-{honest}"
    state = work / "state"
    state.mkdir(parents=True)
    health = work / "gpu-health.json"
    health.write_text(
        json.dumps(
            {
                "version": 1,
                "node": LIAR,
                "updated": "2026-11-28T10:00:00.000000Z",
                "gpus": [
                    {
                        "uuid": GPU,
                        "index": 0,
                        "pci": "0000:18:00.0",
                        "healthy": False,
                        "class": "replace",
                        "reason": "XID 54 (auxiliary power not connected): catalog CHECK_MECHANICALS",
                        "xids": [{"xid": 54, "data": None, "time": "2026-11-28T09:59:00Z", "class": "replace"}],
                    }
                ],
            }
        )
    )
    double = work / "lying-node-python"
    double.write_text(
        DOUBLE.format(python=sys.executable, honest=honest, crafted=crafted, count_file=str(work / "answers"))
    )
    double.chmod(0o755)
    inventory = work / "inventory.yml"
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(double),
        # This machine is the node and the tests run as root: no privilege escalation.
        "ansible_become": False,
        "gpu_remediation_node_name": LIAR,
        "gpu_remediation_max_nodes": 1,
        # The controller's token, as an AWX credential or a vault gives it.
        "gpu_remediation_api_host": cluster["server"],
        "gpu_remediation_api_key": TOKEN,
        "gpu_remediation_validate_certs": False,
        "gpu_remediation_health_file": str(health),
        "gpu_remediation_state_dir": str(state),
        "gpu_remediation_kernel_log": False,
    }
    inventory.write_text(yaml.safe_dump({"gpu_nodes": {"hosts": {"liar": host}}}))
    env = dict(
        ansible_environment(str(work)),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_CACHE_PLUGIN="ansible.builtin.jsonfile",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(cache),
    )
    run = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
            "-i",
            str(inventory),
            str(ROOT / "playbooks/remediate.yml"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        output = json.loads(run.stdout)
    except ValueError:
        raise AssertionError(run.stdout[-3000:] + run.stderr[-3000:]) from None
    # A role's tasks are named "gpuops.k8s.gpu_remediation : NAME".
    results = {
        task["task"]["name"].split(" : ")[-1]: task["hosts"].get("liar", {}) for task in output["plays"][0]["tasks"]
    }
    return run, results


def test_a_lying_node_changes_no_node_reaches_no_other_host_and_the_breaker_holds(cluster, trap, tmp_path):
    core = cluster["core"]
    before = {name: _node(core, name) for name in (LIAR, OTHER)}
    crafted = {
        "gpu_remediation_max_nodes": 100,
        "gpu_remediation_node_name": OTHER,
        "gpu_remediation_api_host": f"http://127.0.0.1:{trap.server_address[1]}",
        "awx_job_id": 4242,
    }
    cache = tmp_path / "facts"

    # Honest to the fact gathering, lying to every module after it: the pinned settings hold.
    run, results = _remediate(cluster, trap, 1, crafted, cache)
    assert _Trap.seen == [], f"requests reached the node's API host: {_Trap.seen}"
    assert {name: _node(core, name) for name in (LIAR, OTHER)} == before
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    said = results["Say what the node does"]["msg"]
    assert said.startswith(f"{LIAR}: replace for GPU 0 ({GPU}): XID 54"), said
    assert "waits, 1 of 1 remediation slot(s) being taken (trust-other (reboot); gpu_remediation_max_nodes 1)" in said

    # What the node said is in the fact cache: the next run refuses it before reading anything from it.
    run, results = _remediate(cluster, trap, 10**6, crafted, cache)
    assert _Trap.seen == []
    assert {name: _node(core, name) for name in (LIAR, OTHER)} == before
    assert run.returncode == 2
    refused = results["Refuse a node whose facts carry the collection's settings"]
    assert refused["msg"] == (
        "liar is left untouched: its facts carry awx_job_id, gpu_remediation_api_host, gpu_remediation_max_nodes, "
        "gpu_remediation_node_name, which only the inventory or the command line set, and no module of gpuops.k8s "
        "returns. The node's Python answered with them, now or in a run whose facts are cached; look at the node "
        "before clearing the fact cache for it."
    )
    assert "Read the node's GPU faults" not in results
