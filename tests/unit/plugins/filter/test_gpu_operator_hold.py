import pathlib

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.gpu_operator_hold import SELECTORS, FilterModule, gpu_operator_hold

ROOT = pathlib.Path(__file__).resolve().parents[4]

ALL = ["driver", "mig", "toolkit", "runtime", "plugin", "labels"]


def node(**labels):
    return {"metadata": {"name": "gpu-1", "labels": {"kubernetes.io/hostname": "gpu-1", **labels}}}


def pod(pod_name, daemonset=None, app=None, phase="Running", namespace="gpu-operator", **labels):
    meta = {"name": pod_name, "namespace": namespace, "labels": dict(labels)}
    if app:
        meta["labels"]["app"] = app
    if daemonset:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset, "uid": "u"}]
    return {"metadata": meta, "status": {"phase": phase}}


def operand(ds, suffix="x1"):
    """A pod of the Operator's DaemonSet ``ds``, labelled as the Operator's manifests label it."""
    return pod(f"{ds}-{suffix}", daemonset=ds, app=ds)


def test_a_node_the_operator_never_touched_holds_nothing():
    assert gpu_operator_hold(node(), [pod("web", app="web")], ALL) == {
        "held": {},
        "switched_off": [],
        "conflicts": [],
        "stages": [],
        "labels_off": {},
    }


def test_the_operators_labels_and_pods_are_evidence_of_what_it_holds_and_meet_the_stages_that_manage_the_same():
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/gpu.deploy.container-toolkit": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "true",
    }
    pods = [operand("nvidia-container-toolkit-daemonset"), operand("nvidia-dcgm-exporter")]
    hold = gpu_operator_hold(node(**labels), pods, ALL)
    assert hold["held"] == {
        "driver": ["label nvidia.com/gpu.deploy.driver=true"],
        "container-toolkit": [
            "label nvidia.com/gpu.deploy.container-toolkit=true",
            "pod gpu-operator/nvidia-container-toolkit-daemonset-x1",
        ],
        "device-plugin": ["label nvidia.com/gpu.deploy.device-plugin=true"],
        "dcgm-exporter": ["label nvidia.com/gpu.deploy.dcgm-exporter=true", "pod gpu-operator/nvidia-dcgm-exporter-x1"],
    }
    assert hold["conflicts"] == ["driver", "container-toolkit", "device-plugin"]
    assert hold["stages"] == ["driver", "toolkit", "runtime", "plugin"]
    assert hold["labels_off"] == {
        "nvidia.com/gpu.deploy.driver": "false",
        "nvidia.com/gpu.deploy.container-toolkit": "false",
        "nvidia.com/gpu.deploy.device-plugin": "false",
    }


def test_only_the_stages_of_the_run_meet_what_the_operator_holds():
    labels = {"nvidia.com/gpu.deploy.driver": "true", "nvidia.com/gpu.deploy.gpu-feature-discovery": "true"}
    hold = gpu_operator_hold(node(**labels), [], ["toolkit", "runtime", "plugin"])
    assert list(hold["held"]) == ["driver", "gpu-feature-discovery"]
    assert hold["conflicts"] == [] and hold["stages"] == []
    assert gpu_operator_hold(node(**labels), [], ["labels"])["stages"] == ["labels"]


def test_components_a_person_switched_off_are_the_collections_and_a_paused_operand_is_still_the_operators():
    labels = {
        "nvidia.com/gpu.deploy.driver": "false",
        "nvidia.com/gpu.deploy.container-toolkit": "false",
        "nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade",
        "nvidia.com/gpu.deploy.operands": "false",
    }
    hold = gpu_operator_hold(node(**labels), [], ALL)
    assert hold["switched_off"] == ["container-toolkit", "driver"]
    assert hold["held"] == {"device-plugin": ["label nvidia.com/gpu.deploy.device-plugin=paused-for-driver-upgrade"]}
    assert hold["stages"] == ["plugin"]


def test_the_kill_switch_alone_is_no_component_and_a_dra_deploy_label_it_leaves_is_still_held():
    # The Operator's DRA stack leaves operands=false in place and still deploys its DRA driver.
    labels = {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.dra-driver": "true"}
    hold = gpu_operator_hold(node(**labels), [], ["plugin"])
    assert list(hold["held"]) == ["dra-driver"] and hold["switched_off"] == []
    assert hold["conflicts"] == ["dra-driver"]
    assert gpu_operator_hold(node(**{"nvidia.com/gpu.deploy.operands": "true"}), [], ALL)["held"] == {}


def test_a_pod_of_an_operand_daemonset_counts_even_after_its_label_went():
    pods = [operand("nvidia-dra-driver-kubelet-plugin"), operand("nvidia-mig-manager")]
    pods[0]["metadata"]["labels"] = {"app.kubernetes.io/component": "nvidia-dra-driver-kubelet-plugin"}
    hold = gpu_operator_hold(node(), pods, ALL)
    assert hold["conflicts"] == ["mig-manager", "dra-driver"]
    assert hold["stages"] == ["mig", "plugin"]


def test_the_driver_pod_is_known_by_its_component_label_whatever_its_daemonset_is_called():
    driver = pod("nvidia-gpu-driver-ubuntu22.04-7c9f-x", daemonset="nvidia-gpu-driver-ubuntu22.04-7c9f")
    driver["metadata"]["labels"]["app.kubernetes.io/component"] = "nvidia-driver"
    assert gpu_operator_hold(node(), [driver], ["driver"])["held"] == {
        "driver": ["pod gpu-operator/nvidia-gpu-driver-ubuntu22.04-7c9f-x"]
    }


@pytest.mark.parametrize(
    "other",
    [
        # NVIDIA's device plugin from its own static manifest: the same DaemonSet name, labelled name=..., no app.
        pod(
            "nvidia-device-plugin-daemonset-a",
            daemonset="nvidia-device-plugin-daemonset",
            name="nvidia-device-plugin-ds",
        ),
        # A pod named like an operand but not a DaemonSet's.
        pod("nvidia-driver-daemonset-b", app="nvidia-driver-daemonset"),
        # An operand pod that has ended.
        pod(
            "nvidia-driver-daemonset-c",
            daemonset="nvidia-driver-daemonset",
            app="nvidia-driver-daemonset",
            phase="Failed",
        ),
        # This collection's own DaemonSet.
        pod("gpuops-device-plugin-d", daemonset="gpuops-device-plugin", app="gpuops-device-plugin"),
    ],
    ids=["nvidias-static-plugin", "no-daemonset", "ended", "ours"],
)
def test_other_pods_are_not_the_operators(other):
    assert gpu_operator_hold(node(), [other], ALL)["held"] == {}


def test_bad_input_is_one_sentence():
    with pytest.raises(AnsibleFilterError, match="the input must be a Node"):
        gpu_operator_hold([], [], ALL)
    with pytest.raises(AnsibleFilterError, match="pods must be a list of Pods"):
        gpu_operator_hold(node(), {"items": []}, ALL)
    with pytest.raises(AnsibleFilterError, match=r"stages must be a list of driver, mig, .* got drivers"):
        gpu_operator_hold(node(), [], ["drivers"])


def test_the_filter_is_registered():
    assert FilterModule().filters()["gpu_operator_hold"] is gpu_operator_hold


def test_pods_listed_across_the_cluster_count_on_their_own_node_once():
    pods = [operand("nvidia-driver-daemonset", "a"), operand("nvidia-driver-daemonset", "b")]
    pods[0]["spec"] = {"nodeName": "gpu-1"}
    pods[1]["spec"] = {"nodeName": "gpu-2"}
    hold = gpu_operator_hold(node(), [*pods, pods[0]], ["driver"], node_name="gpu-1")
    assert hold["held"] == {"driver": ["pod gpu-operator/nvidia-driver-daemonset-a"]}


def test_the_role_lists_the_operand_pods_by_the_filters_selectors():
    tasks = yaml.safe_load((ROOT / "roles/gpu_node_labels/tasks/operator.yml").read_text())
    listing = next(t for t in tasks[0]["block"] if t["name"] == "List the GPU Operator's operand pods")
    assert [" ".join(item.split()) for item in listing["loop"]] == list(SELECTORS)
