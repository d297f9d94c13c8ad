import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.node_label_patch import FilterModule, node_label_patch
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import (
    OWNED_LABELS_ANNOTATION,
    OWNED_TAINT_ANNOTATION,
)

TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _node(labels=None, annotations=None, taints=None):
    node = {"metadata": {"name": "gpu-1", "labels": labels or {}, "annotations": annotations or {}}, "spec": {}}
    if taints is not None:
        node["spec"]["taints"] = taints
    return node


def _apply(node, patch):
    """Apply a JSON merge patch the way the API server does, for the fields this filter touches."""
    meta = node["metadata"]
    for field in ("labels", "annotations"):
        for key, value in patch.get("metadata", {}).get(field, {}).items():
            if value is None:
                meta[field].pop(key, None)
            else:
                meta[field][key] = value
    if "spec" in patch:
        if patch["spec"]["taints"] is None:
            node["spec"].pop("taints", None)
        else:
            node["spec"]["taints"] = patch["spec"]["taints"]
    return node


def test_fresh_node_gets_labels_ownership_and_taint():
    node = _node(labels={"kubernetes.io/hostname": "gpu-1"})
    patch = node_label_patch(node, {"nvidia.com/gpu.present": "true", "accelerator": "h100"})
    assert patch == {
        "metadata": {
            "labels": {"nvidia.com/gpu.present": "true", "accelerator": "h100"},
            "annotations": {
                OWNED_LABELS_ANNOTATION: "accelerator,nvidia.com/gpu.present",
                OWNED_TAINT_ANNOTATION: "nvidia.com/gpu=present:NoSchedule",
            },
        },
        "spec": {"taints": [TAINT]},
    }


def test_second_pass_is_empty():
    node = _node(labels={"kubernetes.io/hostname": "gpu-1"}, taints=[{"key": "other", "effect": "NoExecute"}])
    wanted = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"}
    node = _apply(node, node_label_patch(node, wanted))
    assert node_label_patch(node, wanted) == {}
    assert {"key": "other", "effect": "NoExecute"} in node["spec"]["taints"]


def test_changed_value_only_that_label():
    node = _node(
        labels={"nvidia.com/gpu.count": "4", "nvidia.com/gpu.present": "true"},
        annotations={
            OWNED_LABELS_ANNOTATION: "nvidia.com/gpu.count,nvidia.com/gpu.present",
            OWNED_TAINT_ANNOTATION: "nvidia.com/gpu=present:NoSchedule",
        },
        taints=[TAINT],
    )
    patch = node_label_patch(node, {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"})
    assert patch == {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}}


def test_stale_owned_labels_removed_foreign_kept():
    node = _node(
        labels={"accelerator": "old", "nvidia.com/gpu.present": "true", "team": "ml", "nvidia.com/gpu.machine": "DGX"},
        annotations={
            OWNED_LABELS_ANNOTATION: "accelerator,nvidia.com/gpu.present",
            OWNED_TAINT_ANNOTATION: "nvidia.com/gpu=present:NoSchedule",
        },
        taints=[TAINT],
    )
    patch = node_label_patch(node, {"nvidia.com/gpu.present": "true"})
    assert patch["metadata"]["labels"] == {"accelerator": None}
    assert patch["metadata"]["annotations"] == {OWNED_LABELS_ANNOTATION: "nvidia.com/gpu.present"}
    node = _apply(node, patch)
    assert node["metadata"]["labels"] == {
        "nvidia.com/gpu.present": "true",
        "team": "ml",
        "nvidia.com/gpu.machine": "DGX",
    }


def test_owned_label_already_gone_is_not_patched():
    node = _node(annotations={OWNED_LABELS_ANNOTATION: "gone"}, taints=[TAINT])
    patch = node_label_patch(node, {}, taint=False)
    assert "labels" not in patch.get("metadata", {})
    assert patch["metadata"]["annotations"] == {OWNED_LABELS_ANNOTATION: None}


def test_taint_off_removes_only_our_taint():
    node = _node(
        annotations={OWNED_TAINT_ANNOTATION: "nvidia.com/gpu=present:NoSchedule"},
        taints=[TAINT, {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
    )
    patch = node_label_patch(node, {}, taint=False)
    assert patch["spec"] == {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}
    assert patch["metadata"]["annotations"] == {OWNED_TAINT_ANNOTATION: None}
    assert node_label_patch(_apply(node, patch), {}, taint=False) == {}


def test_taint_off_last_taint_removes_field():
    node = _node(annotations={OWNED_TAINT_ANNOTATION: "nvidia.com/gpu=present:NoSchedule"}, taints=[TAINT])
    assert node_label_patch(node, {}, taint=False)["spec"] == {"taints": None}


def test_taint_off_leaves_a_taint_someone_else_set():
    node = _node(taints=[TAINT])
    assert node_label_patch(node, {}, taint=False) == {}


def test_same_key_other_value_is_replaced_not_doubled():
    node = _node(taints=[{"key": "nvidia.com/gpu", "value": "absent", "effect": "NoSchedule"}])
    patch = node_label_patch(node, {})
    assert patch["spec"]["taints"] == [TAINT]


def test_taint_already_there_takes_ownership_only():
    node = _node(taints=[TAINT])
    assert node_label_patch(node, {}) == {
        "metadata": {"annotations": {OWNED_TAINT_ANNOTATION: "nvidia.com/gpu=present:NoSchedule"}}
    }


def test_custom_taint():
    patch = node_label_patch(
        _node(), {}, taint=True, taint_key="gpu", taint_value="yes", taint_effect="PreferNoSchedule"
    )
    assert patch["spec"]["taints"] == [{"key": "gpu", "value": "yes", "effect": "PreferNoSchedule"}]


@pytest.mark.parametrize("node, labels", [("x", {}), ({"spec": {}}, {}), (_node(), ["a"])])
def test_bad_input(node, labels):
    with pytest.raises(AnsibleFilterError):
        node_label_patch(node, labels)


def test_filter_is_registered():
    assert FilterModule().filters()["node_label_patch"] is node_label_patch
