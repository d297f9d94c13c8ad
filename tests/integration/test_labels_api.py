"""gpu_node_labels and device_plugin (daemonset mode, RuntimeClass) against a real kube-apiserver.

The peer is real: etcd from Debian and kube-apiserver built from the Kubernetes Go modules by
tests/e2e/build-kubernetes.sh (cached under $GPUOPS_CACHE). No kubelet runs: the test creates the
Node object itself, as a kubelet would when it registers, and the roles then talk to the API server
exactly as they would in a cluster. The control plane is the `control_plane` fixture's (conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from local_api import token_admin_api_server
from playbook_env import loaded_versions, loaded_versions_task, playbook_env

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-labels-test-1"
TOKEN = "gpuops-labels-test-admin-token"
SPEC = ROOT / "tests/fixtures/simulated/h100x8.yaml"


# The control_plane fixture's API server (conftest.py): RBAC alone, the default admission plugins, and an
# administrator with a bearer token.
API_SERVER = token_admin_api_server(TOKEN)


def labels_apiserver(control_plane, token, env, loaded=None):
    """What the tests below use: the API as an administrator (bearer ``token``) with the Node NODE registered, and
    the environment ``_play`` runs the roles in. With ``loaded`` (collection: version), each run reports the versions
    of the collections it loaded and ``_play`` checks that they are those. test_dependency_floors.py runs some of
    these tests with one of its own."""
    work = control_plane.work
    kubeconfig = control_plane.kubeconfig(work / "kubeconfig", token=token)
    api = config.new_client_from_config(str(kubeconfig))
    core = client.CoreV1Api(api)
    core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "team": "ml"}},
            "spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
        }
    )
    return {
        "kubeconfig": str(kubeconfig),
        "api": api,
        "core": core,
        "work": work,
        "server": control_plane.server,
        "env": env,
        "loaded": loaded,
    }


@pytest.fixture(scope="module")
def apiserver(control_plane):
    return labels_apiserver(control_plane, TOKEN, _ansible_env())


def _ansible_env():
    """ansible-playbook's environment: the collection from this tree, JSON results, no localhost warning."""
    return playbook_env()


def _play(apiserver, role, extra, check=False):
    """Run one role on localhost; returns (changed task count, the result of each task)."""
    playbook = apiserver["work"] / f"play-{role}.yml"
    play = {"name": "test", "hosts": "localhost", "gather_facts": True, "roles": [{"role": f"gpuops.k8s.{role}"}]}
    if apiserver["loaded"]:
        play["pre_tasks"] = [loaded_versions_task()]
    playbook.write_text(yaml.safe_dump([play]))
    extra_file = apiserver["work"] / "extra.json"
    # The roles' Kubernetes calls need the kubernetes client, which this (the controller's) Python has.
    extra_file.write_text(json.dumps(dict(extra, ansible_python_interpreter=sys.executable)))
    env = apiserver["env"]
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook), "-e", f"@{extra_file}"]
    if check:
        argv += ["--check", "--diff"]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads(run.stdout)
    if apiserver["loaded"]:
        assert loaded_versions(report) == [apiserver["loaded"]], "the run did not load the collections it was to load"
    tasks = {t["task"]["name"]: t["hosts"].get("localhost", {}) for p in report["plays"] for t in p["tasks"]}
    return report["stats"]["localhost"]["changed"], tasks


def _labels_vars(apiserver, **more):
    base = {
        "gpu_node_labels_node_name": NODE,
        "gpu_node_labels_simulate_from": str(SPEC),
        "gpu_node_labels_kubeconfig": apiserver["kubeconfig"],
        "gpu_node_labels_user_labels": {"accelerator": "nvidia-h100"},
    }
    base.update(more)
    return base


def _local_batch_vars(apiserver):
    """The group variables every host of a local batch shares: this Python, the simulated spec, the kubeconfig."""
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpu_node_labels_simulate_from": str(SPEC),
        "gpu_node_labels_kubeconfig": apiserver["kubeconfig"],
    }


def _node(apiserver):
    return apiserver["core"].read_node(NODE)


def test_labels_check_mode_then_apply_then_idempotent(apiserver):
    before = _node(apiserver).metadata.resource_version
    changed, _tasks = _play(apiserver, "gpu_node_labels", _labels_vars(apiserver), check=True)
    assert changed == 1  # the patch it would write
    assert _node(apiserver).metadata.resource_version == before, "check mode wrote to the API server"

    changed, _tasks = _play(apiserver, "gpu_node_labels", _labels_vars(apiserver))
    assert changed == 1
    node = _node(apiserver)
    labels = node.metadata.labels
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "81559"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["nvidia.com/gpu.compute.major"] == "9"
    assert labels["nvidia.com/cuda.driver-version.major"] == "580"
    assert labels["nvidia.com/cuda.runtime-version.major"] == "13"
    assert labels["accelerator"] == "nvidia-h100"
    assert labels["team"] == "ml", "a label the collection does not own was touched"
    taints = [(t.key, t.value, t.effect) for t in node.spec.taints]
    assert ("nvidia.com/gpu", "present", "NoSchedule") in taints
    assert ("dedicated", "ml", "NoSchedule") in taints
    assert "accelerator" in node.metadata.annotations["gpuops.k8s/owned-labels"].split(",")

    version = node.metadata.resource_version
    changed, _tasks = _play(apiserver, "gpu_node_labels", _labels_vars(apiserver))
    assert changed == 0
    assert _node(apiserver).metadata.resource_version == version, "a second run wrote to the API server"


def test_stale_labels_removed_and_taint_turned_off(apiserver):
    _play(apiserver, "gpu_node_labels", _labels_vars(apiserver))
    changed, _tasks = _play(
        apiserver,
        "gpu_node_labels",
        _labels_vars(apiserver, gpu_node_labels_user_labels={"site": "rack 12"}, gpu_node_labels_taint=False),
    )
    assert changed == 1
    node = _node(apiserver)
    assert "accelerator" not in node.metadata.labels
    assert node.metadata.labels["site"] == "rack-12"
    assert node.metadata.labels["team"] == "ml"
    # The API server's TaintNodesByCondition admission adds node.kubernetes.io/not-ready to a new Node:
    # that one, like "dedicated", is someone else's and stays.
    taints = [(t.key, t.value) for t in node.spec.taints]
    assert ("dedicated", "ml") in taints
    assert "nvidia.com/gpu" not in [key for key, _value in taints]
    assert "gpuops.k8s/owned-taint" not in (node.metadata.annotations or {})


def _taint(taint):
    """A V1Taint as a merge patch writes it."""
    return {k: v for k, v in {"key": taint.key, "value": taint.value, "effect": taint.effect}.items() if v is not None}


def test_absent_takes_off_what_the_role_applied_and_nothing_else_then_changes_nothing(apiserver):
    _play(apiserver, "gpu_node_labels", _labels_vars(apiserver))
    core = apiserver["core"]
    # A person's label and taint on a node the role labelled: the role never applied them, so they stay.
    node = _node(apiserver)
    core.patch_node(
        NODE,
        {
            "metadata": {"labels": {"example.com/rack": "r7"}},
            "spec": {
                "taints": [
                    *[_taint(t) for t in node.spec.taints],
                    {"key": "example.com/hold", "effect": "NoSchedule"},
                ]
            },
        },
    )
    before = _node(apiserver)
    owned = before.metadata.annotations["gpuops.k8s/owned-labels"].split(",")
    assert "nvidia.com/gpu.product" in owned
    absent = {
        "gpu_node_labels_node_name": NODE,
        "gpu_node_labels_kubeconfig": apiserver["kubeconfig"],
        "gpu_node_labels_state": "absent",
    }

    changed, tasks = _play(apiserver, "gpu_node_labels", absent, check=True)
    assert changed == 1
    assert _node(apiserver).metadata.resource_version == before.metadata.resource_version, "check mode wrote"
    # No GPU facts were asked of the node (where the labels are wanted, the task asks it: see the end).
    discover = "gpuops.k8s.gpu_node_labels : Discover the GPUs of the node"
    assert tasks[discover].get("skipped") is True

    changed, _tasks = _play(apiserver, "gpu_node_labels", absent)
    assert changed == 1
    after = _node(apiserver)
    expected = {k: v for k, v in before.metadata.labels.items() if k not in owned}
    assert after.metadata.labels == expected
    assert "example.com/rack" in after.metadata.labels and "team" in after.metadata.labels
    assert not any(k.startswith("nvidia.com/") for k in after.metadata.labels)
    assert not any(k.startswith("gpuops.k8s/owned-") for k in (after.metadata.annotations or {}))
    taints = sorted((t.key, t.effect) for t in after.spec.taints)
    assert taints == sorted((t.key, t.effect) for t in before.spec.taints if t.key != "nvidia.com/gpu")
    assert ("example.com/hold", "NoSchedule") in taints

    version = after.metadata.resource_version
    changed, _tasks = _play(apiserver, "gpu_node_labels", absent)
    assert changed == 0 and _node(apiserver).metadata.resource_version == version, "a second run wrote"
    # A node that is not registered has nothing to take off.
    changed, _tasks = _play(apiserver, "gpu_node_labels", dict(absent, gpu_node_labels_node_name="no-such-node"))
    assert changed == 0
    # Labelled again afterwards, as the other tests expect; that run asks the node for its GPUs.
    core.patch_node(NODE, {"spec": {"taints": [_taint(t) for t in after.spec.taints if t.key != "example.com/hold"]}})
    _changed, tasks = _play(apiserver, "gpu_node_labels", _labels_vars(apiserver))
    assert tasks[discover].get("skipped") is not True and tasks[discover]["gpus"]


def test_missing_node_fails_with_a_sentence(apiserver):
    playbook_vars = _labels_vars(apiserver, gpu_node_labels_node_name="no-such-node")
    with pytest.raises(AssertionError, match="has no Node named no-such-node"):
        _play(apiserver, "gpu_node_labels", playbook_vars)


def _plugin_vars(apiserver, **more):
    base = {
        "device_plugin_mode": "daemonset",
        "device_plugin_kubeconfig": apiserver["kubeconfig"],
        "device_plugin_runtime_is_default": False,
        "device_plugin_config": {"version": "v1", "flags": {"migStrategy": "none"}},
        # The node the DaemonSet is for (labelled gpuops.k8s/device-plugin=daemonset), where the role keeps
        # its record of that; no kubelet runs here, so no plugin pod will come to wait for.
        "device_plugin_node_name": NODE,
        "device_plugin_state_dir": str(apiserver["work"] / "node-state"),
        "device_plugin_wait_for_pod": False,
        # This machine has no driver: the directory of the node's libnvidia-ml.so.1 the pods mount, as an inventory
        # names it for nodes whose library is not where the daemon looks.
        "device_plugin_driver_library_dir": "/usr/lib/x86_64-linux-gnu",
    }
    base.update(more)
    return base


def test_daemonset_and_runtimeclass(apiserver):
    api = apiserver["api"]
    changed, _tasks = _play(apiserver, "device_plugin", _plugin_vars(apiserver), check=True)
    assert changed >= 1
    with pytest.raises(client.ApiException):
        client.NodeV1Api(api).read_runtime_class("nvidia")

    changed, _tasks = _play(apiserver, "device_plugin", _plugin_vars(apiserver))
    # The RuntimeClass, the namespace, the three objects in it in one task, the node's label, the record on
    # the node (its directory and the file), and the node's record of its allocation mode.
    assert changed == 7
    assert (apiserver["work"] / "node-state" / "allocation-mode").read_text() == "device_plugin\n"
    runtime_class = client.NodeV1Api(api).read_runtime_class("nvidia")
    assert runtime_class.handler == "nvidia"
    ds = client.AppsV1Api(api).read_namespaced_daemon_set("gpuops-device-plugin", "gpuops-system")
    pod = ds.spec.template.spec
    assert pod.priority_class_name == "system-node-critical"
    assert pod.runtime_class_name == "nvidia"
    assert pod.node_selector == {"nvidia.com/gpu.present": "true", "gpuops.k8s/device-plugin": "daemonset"}
    assert _node(apiserver).metadata.labels["gpuops.k8s/device-plugin"] == "daemonset"
    assert json.loads((apiserver["work"] / "node-state" / "device-plugin-daemonset.json").read_text()) == {
        "namespace": "gpuops-system",
        "daemonset": "gpuops-device-plugin",
    }
    assert any(t.key == "nvidia.com/gpu" and t.operator == "Exists" for t in pod.tolerations)
    container = pod.containers[0]
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.read_only_root_filesystem is True
    assert container.security_context.capabilities.drop == ["ALL"]
    # An enforcing SELinux host lets only spc_t reach the kubelet's sockets and the driver's files.
    assert container.security_context.se_linux_options.type == "spc_t"
    # The kubelet's device-plugin directory is mounted at the same path, and --config-file names the
    # ConfigMap's config.yaml where its volume is mounted.
    volumes = {v.name: v for v in pod.volumes}
    mounts = {m.name: m.mount_path for m in container.volume_mounts}
    assert volumes["device-plugins"].host_path.path == mounts["device-plugins"] == "/var/lib/kubelet/device-plugins"
    assert volumes["config"].config_map.name == "gpuops-device-plugin-config"
    assert container.args[container.args.index("--config-file") + 1] == f"{mounts['config']}/config.yaml"
    cm = apiserver["core"].read_namespaced_config_map("gpuops-device-plugin-config", "gpuops-system")
    assert yaml.safe_load(cm.data["config.yaml"]) == {"version": "v1", "flags": {"migStrategy": "none"}}
    # The pods run as the role's ServiceAccount, which exists in the namespace.
    assert pod.service_account_name == "gpuops-device-plugin"
    account = apiserver["core"].read_namespaced_service_account("gpuops-device-plugin", "gpuops-system")
    assert account.metadata.name == pod.service_account_name

    changed, _tasks = _play(apiserver, "device_plugin", _plugin_vars(apiserver))
    assert changed == 0

    changed, _tasks = _play(apiserver, "device_plugin", _plugin_vars(apiserver, device_plugin_runtime_is_default=True))
    assert changed == 1
    ds = client.AppsV1Api(api).read_namespaced_daemon_set("gpuops-device-plugin", "gpuops-system")
    assert ds.spec.template.spec.runtime_class_name is None


def _node_requests(apiserver):
    """The API server's request counters for Node objects, by verb (its own /metrics)."""
    api = apiserver["api"]
    method, url, headers, body, _files = api.param_serialize(
        "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
    )
    response = api.call_api(method, url, header_params=headers, body=body)
    response.read()
    assert response.status == 200, response.data[:200]
    counts = {}
    for line in response.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if labels.get("resource") == "nodes" and not labels.get("subresource"):
            counts[labels["verb"]] = counts.get(labels["verb"], 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


# The role over the hosts (its main entry point), or its fleet entry point in a play on the control host.
_BATCH_PLAYS = {
    "main": [{"hosts": "gpu", "gather_facts": False, "roles": [{"role": "gpuops.k8s.gpu_node_labels"}]}],
    "fleet": [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {"name": "gpuops.k8s.gpu_node_labels", "tasks_from": "fleet"},
                    "vars": {"gpu_node_labels_hosts": "{{ groups['gpu'] }}"},
                }
            ],
        }
    ],
}


def _play_batch(apiserver, hosts, common, expect_ok=True, entry="main"):
    """gpu_node_labels over several inventory hosts in one play; returns (the nodes its API step changed, node
    requests made), or (the json report, requests made) when the play is expected to fail."""
    work = apiserver["work"]
    inventory = work / "batch-inventory.yml"
    localhost = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"hosts": {"localhost": localhost}, "children": {"gpu": {"hosts": hosts, "vars": common}}}}
        )
    )
    playbook = work / "batch-play.yml"
    playbook.write_text(yaml.safe_dump(_BATCH_PLAYS[entry]))
    env = _ansible_env()
    before = _node_requests(apiserver)
    run = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), "--forks", "3", str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    after = _node_requests(apiserver)
    made = {verb: after.get(verb, 0) - before.get(verb, 0) for verb in after}
    if not expect_ok:
        assert run.returncode != 0
        return json.loads(run.stdout), made
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads(run.stdout)
    step = [
        result
        for play in report["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith("one merge patch per node that needs one (one LIST for the batch)")
        for result in task["hosts"].values()
    ]
    # The batch's API step runs once, on one host, and reports the batch's change there.
    assert len(step) == 1, step
    assert sum(s["changed"] for s in report["stats"].values()) == (1 if step[0]["nodes_changed"] else 0)
    return set(step[0]["nodes_changed"]), made


def _failed_messages(report):
    """The msg of every failed task result in an ansible.posix.json report."""
    return [
        result.get("msg", "")
        for play in report["plays"]
        for task in play["tasks"]
        for result in task["hosts"].values()
        if result.get("failed")
    ]


def test_a_batch_is_read_with_one_list_and_written_once_per_changed_node(apiserver):
    names = [f"gpu-labels-batch-{i}" for i in (1, 2, 3)]
    for name in names:
        apiserver["core"].create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    hosts = {name: {"gpu_node_labels_user_labels": {"rack": f"r{i}"}} for i, name in enumerate(names, 1)}
    common = _local_batch_vars(apiserver)

    changed, made = _play_batch(apiserver, hosts, common)
    assert changed == set(names)
    assert made.get("LIST", 0) == 1, made
    assert made.get("PATCH", 0) == 3, made
    for i, name in enumerate(names, 1):
        labels = apiserver["core"].read_node(name).metadata.labels
        assert labels["rack"] == f"r{i}"
        assert labels["nvidia.com/gpu.count"] == "8"

    changed, made = _play_batch(apiserver, hosts, common)
    assert changed == set()
    assert made.get("LIST", 0) == 1 and made.get("PATCH", 0) == 0, made

    # One host's labels change: that node alone is written.
    hosts[names[1]] = {"gpu_node_labels_user_labels": {"rack": "r9"}}
    changed, made = _play_batch(apiserver, hosts, common)
    assert changed == {names[1]}
    assert made.get("PATCH", 0) == 1, made
    assert apiserver["core"].read_node(names[1]).metadata.labels["rack"] == "r9"


def test_the_fleet_entry_point_labels_from_the_control_host_with_each_hosts_facts_and_settings(apiserver):
    """No task on the nodes: the GPU facts and settings come from the hosts' variables."""
    names = [f"gpu-labels-fleet-{i}" for i in (1, 2)]
    for name in names:
        apiserver["core"].create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    facts = {"source": "simulated", "driver_version": "580.95.05", "cuda_driver_version": "13.0", "gpus": []}
    facts["gpus"] = [{"index": 0, "name": "NVIDIA T4", "memory_total_mib": 15360, "compute_capability": "7.5"}]
    hosts = {
        # Not reachable: the play must not contact the nodes.
        names[0]: {"gpuops_gpu_info": facts, "ansible_host": "192.0.2.1", "gpu_node_labels_taint": False},
        names[1]: {"gpuops_gpu_info": dict(facts, gpus=facts["gpus"] * 2), "ansible_host": "192.0.2.2"},
    }
    common = {"gpu_node_labels_gpu_info_var": "gpuops_gpu_info", "gpu_node_labels_kubeconfig": apiserver["kubeconfig"]}
    changed, made = _play_batch(apiserver, hosts, common, entry="fleet")
    assert changed == set(names)
    assert made.get("LIST", 0) == 1 and made.get("PATCH", 0) == 2, made
    first, second = (apiserver["core"].read_node(name) for name in names)
    assert first.metadata.labels["nvidia.com/gpu.count"] == "1"
    assert second.metadata.labels["nvidia.com/gpu.count"] == "2"
    assert "nvidia.com/gpu" not in [t.key for t in first.spec.taints or []], "the host's own taint setting was lost"
    assert "nvidia.com/gpu" in [t.key for t in second.spec.taints or []]

    # A host without facts fails the step with its name, and nothing is written.
    hosts[names[1]] = {"ansible_host": "192.0.2.2", "gpu_node_labels_user_labels": {"rack": "r2"}}
    report, made = _play_batch(apiserver, hosts, common, expect_ok=False, entry="fleet")
    messages = _failed_messages(report)
    assert any(f"no GPU facts for {names[1]};" in m for m in messages), messages
    assert made.get("PATCH", 0) == 0, made


def test_each_host_is_labelled_and_tainted_by_its_own_settings_never_the_first_hosts(apiserver):
    """The batch's step runs on its first host: what that host sets in its own inventory is its own. A host that sets
    nothing gets the role's defaults, and one that sets something else gets that."""
    names = [f"gpu-labels-own-{i}" for i in (1, 2, 3)]
    for name in names:
        apiserver["core"].create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    hosts = {
        names[0]: {
            "gpu_node_labels_user_labels": {"rack": "r1"},
            "gpu_node_labels_taint_key": "example.com/gpu",
            "gpu_node_labels_taint_value": "reserved",
            "gpu_node_labels_taint_effect": "NoExecute",
        },
        names[1]: {},
        names[2]: {"gpu_node_labels_user_labels": {"rack": "r3"}, "gpu_node_labels_taint": False},
    }
    common = _local_batch_vars(apiserver)
    changed, _made = _play_batch(apiserver, hosts, common)
    assert changed == set(names)
    nodes = [apiserver["core"].read_node(name) for name in names]
    labels = [node.metadata.labels or {} for node in nodes]
    # The API server's own not-ready taint (admission, on create) aside.
    taints = [
        {(t.key, t.value, t.effect) for t in node.spec.taints or [] if not t.key.startswith("node.kubernetes.io/")}
        for node in nodes
    ]
    assert labels[0]["rack"] == "r1" and labels[2]["rack"] == "r3"
    assert "rack" not in labels[1], "the first host's labels were given to a host without its own"
    assert taints[0] == {("example.com/gpu", "reserved", "NoExecute")}
    assert taints[1] == {("nvidia.com/gpu", "present", "NoSchedule")}, "the first host's taint was given to another"
    assert taints[2] == set()


MIG_SPEC = ROOT / "tests/fixtures/simulated/a100-mig.yaml"
MIG_CONFIG_LABELS = {"nvidia.com/mig.config": "all-balanced", "nvidia.com/mig.config.state": "success"}


def test_the_mig_labels_follow_the_hosts_plugin_config_and_survive_a_run_without_the_mig_stage(apiserver):
    """The MIG strategy labels come from each host's own device_plugin_config; the MIG config labels the nvidia_mig
    role notes (its fact nvidia_mig_node_labels, here given as a host variable) are kept by a later run where that
    stage did not run (site.yml --tags labels) while the host names a MIG config, and removed once it names none."""
    names = [f"gpu-labels-mig-{i}" for i in (1, 2)]
    for name in names:
        apiserver["core"].create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    mixed = {"version": "v1", "flags": {"migStrategy": "mixed"}}
    stage_ran = {"gpu_mig_config": "all-balanced", "nvidia_mig_node_labels": MIG_CONFIG_LABELS}
    hosts = {
        # The batch's first host: its own plugin config must not stand for the other host's.
        names[0]: {"gpu_node_labels_simulate_from": str(MIG_SPEC), "device_plugin_config": mixed, **stage_ran},
        names[1]: dict(stage_ran),
    }
    common = _local_batch_vars(apiserver)
    changed, _made = _play_batch(apiserver, hosts, common)
    assert changed == set(names)
    first, second = (apiserver["core"].read_node(name).metadata.labels for name in names)
    assert (first["nvidia.com/mig.strategy"], first["nvidia.com/mig-1g.5gb.count"]) == ("mixed", "2")
    assert first["nvidia.com/mig-3g.20gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert not [key for key in second if key.startswith(("nvidia.com/mig.strategy", "nvidia.com/mig-"))]
    for labels in (first, second):
        assert {key: labels[key] for key in MIG_CONFIG_LABELS} == MIG_CONFIG_LABELS

    # The labels stage alone: no MIG stage noted anything. Both hosts still name their config: no change.
    for name in names:
        del hosts[name]["nvidia_mig_node_labels"]
    changed, made = _play_batch(apiserver, hosts, common)
    assert changed == set() and made.get("PATCH", 0) == 0, made
    for name in names:
        labels = apiserver["core"].read_node(name).metadata.labels
        assert {key: labels[key] for key in MIG_CONFIG_LABELS} == MIG_CONFIG_LABELS

    # The second host names no MIG config any more: its MIG config labels go, the first host's stay.
    hosts[names[1]]["gpu_mig_config"] = ""
    changed, _made = _play_batch(apiserver, hosts, common)
    assert changed == {names[1]}
    first, second = (apiserver["core"].read_node(name).metadata.labels for name in names)
    assert {key: first[key] for key in MIG_CONFIG_LABELS} == MIG_CONFIG_LABELS
    assert not set(MIG_CONFIG_LABELS) & set(second)


def test_the_fleet_entry_point_with_no_hosts_does_nothing(apiserver):
    """An empty batch (a group without hosts) is not an error: no API request, no change."""
    work = apiserver["work"]
    inventory = work / "empty-inventory.yml"
    localhost = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": localhost}}}))
    playbook = work / "empty-play.yml"
    play = _BATCH_PLAYS["fleet"][0]
    task = dict(
        play["tasks"][0], vars={"gpu_node_labels_hosts": [], "gpu_node_labels_kubeconfig": apiserver["kubeconfig"]}
    )
    playbook.write_text(yaml.safe_dump([dict(play, tasks=[task])]))
    before = _node_requests(apiserver)
    run = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(playbook)],
        capture_output=True,
        text=True,
        env=_ansible_env(),
        timeout=300,
        check=False,
    )
    after = _node_requests(apiserver)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert json.loads(run.stdout)["stats"]["localhost"]["changed"] == 0
    assert {verb: after.get(verb, 0) - before.get(verb, 0) for verb in after} == dict.fromkeys(after, 0)


@pytest.mark.parametrize("own", [1, 0], ids=["a-later-host", "the-first-host"])
def test_a_batch_with_different_credentials_fails_with_a_sentence(apiserver, own):
    """Whichever host sets its own context, the batch reaches the API two ways: the first host's setting is not
    everyone's."""
    names = [f"gpu-labels-creds-{own}-1", f"gpu-labels-creds-{own}-2"]
    for name in names:
        apiserver["core"].create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    hosts = {name: {} for name in names}
    hosts[names[own]] = {"gpu_node_labels_context": "another-cluster"}
    common = _local_batch_vars(apiserver)
    report, made = _play_batch(apiserver, hosts, common, expect_ok=False)
    messages = _failed_messages(report)
    assert any("set gpu_node_labels_delegate_to, _kubeconfig, _context" in m for m in messages), messages
    assert made.get("PATCH", 0) == 0, made
    for name in names:
        assert "nvidia.com/gpu.present" not in (apiserver["core"].read_node(name).metadata.labels or {})


def _node_labels_module():
    """The module gpuops.k8s.node_labels from the collection tree, imported into this process."""
    collections = _ansible_env()["ANSIBLE_COLLECTIONS_PATH"]
    if collections not in sys.path:
        sys.path.insert(0, collections)
    import importlib

    return importlib.import_module("ansible_collections.gpuops.k8s.plugins.modules.node_labels")


H100_INFO = {
    "gpus": [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": "9.0"}
        for i in range(8)
    ],
    "driver_version": "580.95.05",
    "cuda_driver_version": "13.0",
}
FOREIGN_TAINT = {"key": "example.com/maintenance", "value": "rack-12", "effect": "NoExecute"}


def _add_foreign_taint(core, name):
    """What another controller does between the module's LIST and its PATCH: read, add a taint, replace."""
    node = core.read_node(name)
    node.spec.taints = [*(node.spec.taints or []), client.V1Taint(**FOREIGN_TAINT)]
    core.replace_node(name, node)


def _race_setup(apiserver, name):
    """A new Node, the module's own client for it (as the module builds it from a kubeconfig), and the
    module_utils the module runs."""
    module = _node_labels_module()
    apiserver["core"].create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    params = dict.fromkeys(("context", "host", "api_key", "validate_certs", "ca_cert", "client_cert", "client_key"))
    api = module.NodeApi(module._api_client(dict(params, kubeconfig=apiserver["kubeconfig"])))
    return api, sys.modules["ansible_collections.gpuops.k8s.plugins.module_utils._node_labels"]


def test_a_taint_written_between_the_list_and_the_patch_survives(apiserver):
    """The patch carries the resourceVersion it was computed from: the real API server refuses it (409) once
    someone else wrote the Node, and the module reads the Node again and writes a patch that keeps their taint."""
    core = apiserver["core"]
    name = "gpu-labels-race-1"
    api, node_labels = _race_setup(apiserver, name)

    result = node_labels.label_batch(
        [{"name": name, "gpu_info": H100_INFO, "user_labels": {"rack": "r12"}}],
        api,
        before_write=lambda: _add_foreign_taint(core, name),
    )
    assert result["conflicts"] == 1, result
    assert sorted(result["changed"]) == [name]
    node = core.read_node(name)
    taints = [(t.key, t.value, t.effect) for t in node.spec.taints]
    assert ("example.com/maintenance", "rack-12", "NoExecute") in taints, taints
    assert ("nvidia.com/gpu", "present", "NoSchedule") in taints, taints
    assert node.metadata.labels["nvidia.com/gpu.count"] == "8"
    assert node.metadata.labels["rack"] == "r12"
    # Before and after in the diff are the Node as read again after the conflict, and as written.
    assert [t["key"] for t in result["diff"][name]["before"]["taints"] if t["key"].startswith("example.com/")] == [
        "example.com/maintenance"
    ]


def test_a_node_that_changes_on_every_try_fails_with_a_sentence_and_is_not_written(apiserver):
    core = apiserver["core"]
    name = "gpu-labels-race-2"
    api, node_labels = _race_setup(apiserver, name)

    with pytest.raises(node_labels.LabelError, match=f"the Node {name} changed between every read and write"):
        node_labels.label_batch(
            [{"name": name, "gpu_info": H100_INFO}],
            api,
            conflict_retries=0,
            before_write=lambda: _add_foreign_taint(core, name),
        )
    node = core.read_node(name)
    assert "nvidia.com/gpu.present" not in (node.metadata.labels or {})
    assert "example.com/maintenance" in [t.key for t in node.spec.taints]


def test_an_api_server_that_does_not_answer_fails_with_a_sentence(tmp_path):
    """No connection (nothing listens on the port): one sentence saying the API cannot be reached, no traceback."""
    playbook = tmp_path / "unreachable.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "test",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Label",
                            "gpuops.k8s.node_labels": {
                                "nodes": [{"name": "gpu-node-1", "gpu_info": H100_INFO}],
                                "host": "http://127.0.0.1:9",
                            },
                        }
                    ],
                }
            ]
        )
    )
    env = dict(_ansible_env(), ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook), "-e"]
    argv.append(json.dumps({"ansible_python_interpreter": sys.executable}))
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert _failed_messages(report) == [_failed_messages(report)[0]]
    message = _failed_messages(report)[0]
    assert message.startswith("node_labels: cannot reach the Kubernetes API: "), message
    assert "Traceback" not in message and "\n" not in message


def _play_verbose(apiserver, role, extra):
    """Run one role on localhost with -vvv and the default callback, as an operator would read it."""
    playbook = apiserver["work"] / f"play-verbose-{role}.yml"
    playbook.write_text(
        yaml.safe_dump([{"name": "test", "hosts": "localhost", "gather_facts": False, "roles": [f"gpuops.k8s.{role}"]}])
    )
    extra_file = apiserver["work"] / "extra-verbose.json"
    extra_file.write_text(json.dumps(dict(extra, ansible_python_interpreter=sys.executable)))
    env = {key: value for key, value in _ansible_env().items() if key != "ANSIBLE_STDOUT_CALLBACK"}
    # No kubeconfig of this machine may stand in for the credentials under test.
    env.update(ANSIBLE_INVENTORY_UNPARSED_WARNING="false", KUBECONFIG=str(apiserver["work"] / "none"))
    argv = ["ansible-playbook", "-vvv", "-i", "localhost,", "-c", "local", str(playbook), "-e", f"@{extra_file}"]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    return run.returncode, run.stdout + run.stderr


def test_the_action_group_gives_host_and_token_to_the_roles_api_calls(apiserver):
    """group/gpuops.k8s.k8s reaches gpuops.k8s.node_labels and, through extend_group, kubernetes.core's modules:
    with only api_host + api_key set, gpu_node_labels writes the labels and node_drain lists the node's pods."""
    name = "gpu-labels-token-1"
    core = apiserver["core"]
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    labels = {
        "gpu_node_labels_api_host": apiserver["server"],
        "gpu_node_labels_api_key": TOKEN,
        "gpu_node_labels_validate_certs": False,
    }
    labels.update(gpu_node_labels_node_name=name, gpu_node_labels_simulate_from=str(SPEC))
    rc, output = _play_verbose(apiserver, "gpu_node_labels", labels)
    assert rc == 0, output[-4000:]
    assert core.read_node(name).metadata.labels["nvidia.com/gpu.count"] == "8"
    assert TOKEN not in output

    # A GPU pod bound to the node (no kubelet runs it): node_drain must find it through the API and stop.
    core.create_namespace({"metadata": {"name": "drain-token"}})
    core.create_namespaced_service_account("drain-token", {"metadata": {"name": "default"}})
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    pod = {"name": "trainer", "image": "example.invalid/trainer", "resources": gpu}
    core.create_namespaced_pod(
        "drain-token", {"metadata": {"name": "trainer"}, "spec": {"nodeName": name, "containers": [pod]}}
    )
    drain = {
        "node_drain_api_host": apiserver["server"],
        "node_drain_api_key": TOKEN,
        "node_drain_validate_certs": False,
    }
    drain.update(node_drain_node_name=name, node_drain_reason="the test changes it")
    rc, output = _play_verbose(apiserver, "node_drain", drain)
    assert rc != 0, output[-4000:]
    assert f"{name} runs 1 GPU pod(s) (drain-token/trainer) and the test changes it" in output, output[-4000:]
    assert TOKEN not in output


def test_the_roles_take_the_rest_of_the_connection_from_their_k8s_options(apiserver):
    """A role's module_defaults for the action group replace the play's, so the roles carry the rest of the connection
    themselves: gpu_node_labels reaches the API through the proxy its k8s_options name, and node_drain, whose
    options default to gpu_node_labels', acts as the user they impersonate. A password among them is not shown."""
    name = "gpu-labels-options-1"
    core = apiserver["core"]
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    token = {"api_host": apiserver["server"], "api_key": TOKEN, "validate_certs": False}
    proxy = ConnectProxy()
    try:
        labels = {f"gpu_node_labels_{key}": value for key, value in token.items()}
        secret = "gpuops-password-that-must-not-show"
        labels.update(
            gpu_node_labels_node_name=name,
            gpu_node_labels_simulate_from=str(SPEC),
            gpu_node_labels_k8s_options={"proxy": proxy.url, "username": "someone", "password": secret},
        )
        rc, output = _play_verbose(apiserver, "gpu_node_labels", labels)
        assert rc == 0, output[-4000:]
        assert core.read_node(name).metadata.labels["nvidia.com/gpu.count"] == "8"
        assert proxy.targets and all(target.startswith("CONNECT ") for target in proxy.targets), proxy.targets
        assert secret not in output and TOKEN not in output
    finally:
        proxy.close()

    drain = {f"node_drain_{key}": value for key, value in token.items()}
    drain.update(
        node_drain_node_name=name,
        node_drain_reason="the test changes it",
        gpu_node_labels_k8s_options={"impersonate_user": "gpuops-nobody"},
    )
    rc, output = _play_verbose(apiserver, "node_drain", drain)
    assert rc != 0
    assert "forbidden" in output.lower() and "gpuops-nobody" in output, output[-4000:]


def test_a_failed_api_call_does_not_show_the_token(apiserver):
    """kubernetes.core returns its arguments, the token too, with a failed call: the role's block hides them."""
    secret = "gpuops-token-that-must-not-show"
    drain = {"node_drain_api_host": "https://127.0.0.1:1", "node_drain_api_key": secret, "node_drain_node_name": NODE}
    rc, output = _play_verbose(apiserver, "node_drain", drain)
    assert rc != 0, output[-4000:]
    assert "List the pods on the node" in output
    assert secret not in output


class ConnectProxy:
    """A forward proxy for HTTPS (HTTP CONNECT, then the bytes both ways), as a corporate proxy is to a client; it
    records the targets it was asked for. The API server behind it is the real one."""

    def __init__(self):
        self.targets: list[str] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _peer = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    def _tunnel(self, conn):
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                return
            request += chunk
        method, target, _version = request.split(b"\r\n", 1)[0].decode().split(" ", 2)
        self.targets.append(f"{method} {target}")
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pump(src, dst):
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for end in (src, dst):
                    with contextlib.suppress(OSError):
                        end.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()
        pump(conn, upstream)

    def close(self):
        self.server.close()


def _cordon_play(apiserver, connection, env=None):
    """gpuops.k8s.node_cordon (state absent: the node is left schedulable) with the connection given to the action
    group as module_defaults, as a playbook sets it for kubernetes.core's modules."""
    playbook = apiserver["work"] / "play-connection.yml"
    task = {"gpuops.k8s.node_cordon": {"name": NODE, "state": "absent"}}
    play = {"hosts": "localhost", "gather_facts": False, "tasks": [task]}
    play["module_defaults"] = {"group/gpuops.k8s.k8s": connection}
    playbook.write_text(yaml.safe_dump([play]))
    extra = apiserver["work"] / "extra-connection.json"
    extra.write_text(json.dumps({"ansible_python_interpreter": sys.executable}))
    run_env = dict(
        _ansible_env(), ANSIBLE_INVENTORY_UNPARSED_WARNING="false", KUBECONFIG=str(apiserver["work"] / "none")
    )
    run_env.update(env or {})
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook), "-e", f"@{extra}"]
    run = subprocess.run(argv, capture_output=True, text=True, env=run_env, timeout=300, check=False)
    return run.returncode, run.stdout + run.stderr


def test_the_collections_modules_take_the_proxy_kubernetes_core_users_pass(apiserver):
    """proxy in module_defaults (or K8S_AUTH_PROXY) reaches the API server through the proxy; no_proxy bypasses it."""
    proxy = ConnectProxy()
    try:
        token = {"host": apiserver["server"], "api_key": TOKEN, "validate_certs": False}
        rc, output = _cordon_play(apiserver, dict(token, proxy=proxy.url))
        assert rc == 0, output[-3000:]
        server = apiserver["server"].split("://", 1)[1]
        assert proxy.targets == [f"CONNECT {server}"], proxy.targets

        rc, output = _cordon_play(apiserver, token, env={"K8S_AUTH_PROXY": proxy.url})
        assert rc == 0, output[-3000:]
        assert len(proxy.targets) == 2, proxy.targets

        rc, output = _cordon_play(apiserver, dict(token, proxy=proxy.url, no_proxy="127.0.0.1"))
        assert rc == 0, output[-3000:]
        assert len(proxy.targets) == 2, "no_proxy did not bypass the proxy"
    finally:
        proxy.close()


def test_the_collections_modules_take_impersonation_and_a_kubeconfig_as_a_dict(apiserver):
    """impersonate_user and impersonate_groups act as the API server's RBAC says of that user; a kubeconfig given as
    a dict (as a vault or a lookup hands it) works as the file does."""
    kubeconfig = yaml.safe_load(Path(apiserver["kubeconfig"]).read_text(encoding="utf-8"))
    token = {"host": apiserver["server"], "api_key": TOKEN, "validate_certs": False}
    rc, output = _cordon_play(apiserver, dict(token, impersonate_user="gpuops-nobody"))
    assert rc != 0
    assert "forbidden" in output.lower() and "gpuops-nobody" in output, output[-3000:]
    for groups in (["system:masters"], ["gpuops-team", "system:masters"]):
        rc, output = _cordon_play(apiserver, dict(token, impersonate_user="gpuops-nobody", impersonate_groups=groups))
        assert rc == 0, f"{groups}: {output[-3000:]}"
    rc, output = _cordon_play(apiserver, {"kubeconfig": kubeconfig})
    assert rc == 0, output[-3000:]
    assert TOKEN not in output


def test_a_node_that_leaves_takes_the_runtimeclass_only_when_it_is_the_last_gpu_node(apiserver):
    """device_plugin_state absent on one node (site.yml --limit NODE): the RuntimeClass the other GPU nodes' pods
    name stays; it goes with the last GPU node the API knows."""
    nodes = client.NodeV1Api(apiserver["api"])
    name = "gpuops-leave-test"
    leave = {"device_plugin_runtime_class_name": name, "device_plugin_state_dir": str(apiserver["work"] / "leave")}
    _play(apiserver, "device_plugin", _plugin_vars(apiserver, **leave))
    assert nodes.read_runtime_class(name).handler == "nvidia"
    other = "gpu-still-here-1"
    labelled = {"nvidia.com/gpu.present": "true"}
    apiserver["core"].create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": other, "labels": labelled}})

    changed, _tasks = _play(apiserver, "device_plugin", _plugin_vars(apiserver, device_plugin_state="absent", **leave))
    assert nodes.read_runtime_class(name).handler == "nvidia", "another GPU node still needs it"

    # The last GPU node leaves: no other Node is labelled as one any more.
    for node in apiserver["core"].list_node().items:
        gpu = {"nvidia.com/gpu.present", "gpuops.k8s/device-plugin"} & set(node.metadata.labels or {})
        if node.metadata.name != NODE and gpu:
            apiserver["core"].patch_node(node.metadata.name, {"metadata": {"labels": dict.fromkeys(gpu)}})
    changed, _tasks = _play(apiserver, "device_plugin", _plugin_vars(apiserver, device_plugin_state="absent", **leave))
    assert changed >= 1
    with pytest.raises(client.ApiException):
        nodes.read_runtime_class(name)
