"""The nvidia_mig role's fence taint and its repair of a run cut short, against a real kube-apiserver and etcd (the
control_plane fixture, conftest.py).

The role's fence.yml, unfence.yml and repair.yml run with ansible-playbook on this machine (connection local, the
API calls delegated to localhost as the role delegates them to its controller), against a Node object no kubelet
serves; the node's run record lies in a temporary state directory. A run cut short is what it leaves behind: the
record, the fence taint and the pause label on the Node. The systemd side (a unit the record says the run stopped)
needs a systemd host: tests/e2e/test_site_mig.py runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from local_api import token_admin_api_server

TOKEN = "gpuops-mig-fence-test-admin-token"
API_SERVER = token_admin_api_server(TOKEN)
FENCE = {"key": "gpuops.k8s/mig-reconfiguring", "effect": "NoSchedule"}
PERSONS = {"key": "maintenance", "value": "rack-4", "effect": "NoSchedule"}
PAUSE = "gpuops.k8s/device-plugin.paused"


@pytest.fixture(scope="module")
def cluster(control_plane):
    kubeconfig = control_plane.kubeconfig(control_plane.work / "kubeconfig", token=TOKEN)
    return {"kubeconfig": str(kubeconfig), "core": client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))}


def make_node(cluster, name, taints=None, labels=None):
    """A Node with TAINTS alone: the API server's admission adds node.kubernetes.io/not-ready to a new Node, which the
    node lifecycle controller removes once its kubelet is ready; the test plays that part. Its taints as stored."""
    cluster["core"].create_node({"metadata": {"name": name, "labels": labels or {}}})
    cluster["core"].patch_node(name, [{"op": "replace", "path": "/spec/taints", "value": taints or []}])
    return node(cluster, name)[0]


def node(cluster, name):
    found = cluster["core"].read_node(name)
    taints = [{k: v for k, v in t.to_dict().items() if v is not None} for t in found.spec.taints or []]
    return taints, found.metadata.labels or {}


def run_role(cluster, collection_root, tmp_path, tasks_from, node_name):
    state_dir = tmp_path / "state"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.include_role": {"name": "gpuops.k8s.nvidia_mig", "tasks_from": tasks_from}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    extra = {
        "nvidia_mig_node_name": node_name,
        "nvidia_mig_kubeconfig": cluster["kubeconfig"],
        "nvidia_mig_plugin_state_dir": str(state_dir),
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(collection_root),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCALHOST_WARNING="0",
    )
    playbook = Path(sys.executable).parent / "ansible-playbook"
    argv = [str(playbook), "-i", "localhost,", "-c", "local", "-e", f"@{tmp_path / 'extra.json'}", "play.yml"]
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    recap = run.stdout.rsplit("PLAY RECAP", 1)[1]
    return int(recap.split("changed=")[1].split()[0])


def test_a_run_cut_short_is_undone_by_the_next_keeping_a_persons_taint_and_labels(cluster, collection_root, tmp_path):
    created = make_node(cluster, "mig-cut-short", taints=[PERSONS, FENCE], labels={PAUSE: "mig", "team": "ml"})
    assert FENCE in created and PERSONS in created
    record = tmp_path / "state" / "nvidia-mig-run.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"fence_taint": FENCE["key"], "stopped_unit": "", "paused": True}))

    assert run_role(cluster, collection_root, tmp_path, "repair", "mig-cut-short") > 0
    taints, labels = node(cluster, "mig-cut-short")
    assert taints == [t for t in created if t != FENCE]
    assert labels == {"team": "ml"}
    assert not record.exists()

    assert run_role(cluster, collection_root, tmp_path, "repair", "mig-cut-short") == 0


def test_without_a_record_a_pause_label_and_the_taint_are_left_as_they_are(cluster, collection_root, tmp_path):
    created = make_node(cluster, "mig-by-hand", taints=[FENCE], labels={PAUSE: "mig"})
    assert run_role(cluster, collection_root, tmp_path, "repair", "mig-by-hand") == 0
    assert node(cluster, "mig-by-hand") == (created, {PAUSE: "mig"})


@pytest.mark.parametrize("given", [[], [PERSONS]], ids=["no-taints-given", "a-persons-taint"])
def test_the_fence_taint_is_added_and_removed_and_only_it(cluster, collection_root, tmp_path, given):
    name = f"mig-fence-{len(given)}"
    before = make_node(cluster, name, taints=given)
    assert run_role(cluster, collection_root, tmp_path, "fence", name) == 1
    assert node(cluster, name)[0] == [*before, FENCE]
    assert run_role(cluster, collection_root, tmp_path, "fence", name) == 0
    assert run_role(cluster, collection_root, tmp_path, "unfence", name) == 1
    assert node(cluster, name)[0] == before
    assert run_role(cluster, collection_root, tmp_path, "unfence", name) == 0
