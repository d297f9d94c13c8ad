import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.gpu_workloads import FilterModule, gpu_workloads


def pod(name, phase="Running", owner=None, claims=None, containers=None, init=None, namespace="ml"):
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [{"kind": owner, "name": "x"}] if owner else [],
        },
        "spec": {
            "containers": containers if containers is not None else [{"name": "main"}],
            "initContainers": init or [],
            "resourceClaims": claims or [],
        },
        "status": {"phase": phase},
    }


def gpus(kind="limits", resource="nvidia.com/gpu"):
    return [{"name": "main", "resources": {kind: {resource: "1", "cpu": "1"}}}]


def test_pods_that_request_or_limit_gpus_or_mig_devices_are_found():
    pods = [
        pod("limit", containers=gpus()),
        pod("request", containers=gpus("requests")),
        pod("mig", containers=gpus(resource="nvidia.com/mig-1g.10gb")),
        pod("init", containers=[{"name": "main"}], init=gpus()),
    ]
    assert gpu_workloads(pods) == ["ml/limit", "ml/request", "ml/mig", "ml/init"]


def test_a_pod_with_dra_claims_is_found():
    assert gpu_workloads([pod("dra", claims=[{"name": "gpu", "resourceClaimName": "c"}])]) == ["ml/dra"]


def test_cpu_pods_ended_pods_and_daemonset_pods_are_not():
    pods = [
        pod("cpu", containers=[{"name": "main", "resources": {"limits": {"cpu": "2"}}}]),
        pod("other-vendor", containers=gpus(resource="amd.com/gpu")),
        pod("done", phase="Succeeded", containers=gpus()),
        pod("failed", phase="Failed", containers=gpus()),
        pod("exporter", owner="DaemonSet", containers=gpus()),
        pod("pending", phase="Pending", owner="ReplicaSet", containers=gpus()),
    ]
    assert gpu_workloads(pods) == ["ml/pending"]


def test_any_pod_returns_every_running_pod_a_drain_would_move():
    pods = [
        pod("cpu", containers=[{"name": "main"}]),
        pod("gpu", containers=gpus()),
        pod("done", phase="Succeeded"),
        pod("exporter", owner="DaemonSet"),
    ]
    assert gpu_workloads(pods, any_pod=True) == ["ml/cpu", "ml/gpu"]


def test_sparse_pods_are_read_without_error():
    assert gpu_workloads([{"metadata": {"name": "bare"}}, {}]) == []


@pytest.mark.parametrize("value", [None, "pods", {"items": []}, [1]])
def test_other_input_is_refused_in_one_sentence(value):
    with pytest.raises(AnsibleFilterError, match="must be a list of Pods"):
        gpu_workloads(value)


def test_the_filter_is_registered():
    assert FilterModule().filters()["gpu_workloads"] is gpu_workloads
