"""Unit tests of the batch labelling in module_utils/_node_labels.py against an in-memory Node store.

NodeStoreDouble is a test double of the API server's Node endpoint: it keeps resourceVersions and refuses a
patch whose resourceVersion is stale (HTTP 409), as the real one does (the real one is exercised in
tests/integration/test_labels_api.py). It applies JSON merge patches itself.
"""

from __future__ import annotations

import copy

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import Conflict, LabelError, label_batch

INFO = {
    "gpus": [{"index": 0, "name": "NVIDIA L4", "memory_total_mib": 23034, "compute_capability": "8.9"}],
    "driver_version": "580.95.05",
    "cuda_driver_version": "13.0",
}


def merge(target, patch):
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class NodeStoreDouble:
    def __init__(self, *names):
        self.nodes = {n: {"metadata": {"name": n, "resourceVersion": "1"}, "spec": {}} for n in names}
        self.lists = 0
        self.patches = []

    def bump(self, name, change):
        node = self.nodes[name]
        merge(node, change)
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)

    def list_nodes(self):
        self.lists += 1
        return [copy.deepcopy(n) for n in self.nodes.values()]

    def read_node(self, name):
        return copy.deepcopy(self.nodes[name]) if name in self.nodes else None

    def patch_node(self, name, patch):
        node = self.nodes[name]
        patch = copy.deepcopy(patch)
        version = patch.get("metadata", {}).pop("resourceVersion", None)
        if version is not None and version != node["metadata"]["resourceVersion"]:
            raise Conflict(name)
        self.patches.append((name, patch))
        self.bump(name, patch)
        return copy.deepcopy(node)


def request(name, **more):
    return dict({"name": name, "gpu_info": INFO, "user_labels": {}}, **more)


def test_one_list_one_patch_per_node_then_nothing():
    store = NodeStoreDouble("a", "b")
    result = label_batch([request("a"), request("b", taint=False)], store)
    assert store.lists == 1
    assert [name for name, _patch in store.patches] == ["a", "b"]
    assert sorted(result["changed"]) == ["a", "b"]
    assert store.nodes["a"]["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert "taints" not in store.nodes["b"]["spec"]
    assert store.nodes["b"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    # Every patch was sent with the version it was computed from.
    assert result["conflicts"] == 0

    store.patches.clear()
    again = label_batch([request("a"), request("b", taint=False)], store)
    assert again["changed"] == {} and store.patches == []


def test_check_mode_writes_nothing_and_shows_the_change():
    store = NodeStoreDouble("a")
    result = label_batch([request("a", user_labels={"rack": "r1"})], store, check_mode=True)
    assert store.patches == []
    assert result["changed"]["a"]["metadata"]["labels"]["rack"] == "r1"
    assert result["diff"]["a"]["before"]["labels"] == {}
    assert result["diff"]["a"]["after"]["labels"]["rack"] == "r1"
    assert result["diff"]["a"]["after"]["taints"][0]["key"] == "nvidia.com/gpu"


def test_a_conflict_is_redone_from_a_fresh_read_and_keeps_the_other_writer():
    store = NodeStoreDouble("a")
    foreign = {"key": "example.com/drain", "effect": "NoSchedule"}
    result = label_batch([request("a")], store, before_write=lambda: store.bump("a", {"spec": {"taints": [foreign]}}))
    assert result["conflicts"] == 1
    assert foreign in store.nodes["a"]["spec"]["taints"]
    assert len(store.nodes["a"]["spec"]["taints"]) == 2


def test_missing_and_invalid_nodes_are_listed_and_the_others_written():
    store = NodeStoreDouble("a")
    result = label_batch(
        [request("a"), request("ghost"), request("a2", user_labels={"bad key!": "x"})],
        store,
    )
    assert result["missing"] == ["ghost"]
    assert "label key 'bad key!'" in result["invalid"]["a2"]
    assert sorted(result["changed"]) == ["a"]


def test_a_node_deleted_after_a_conflict_is_missing():
    store = NodeStoreDouble("a")

    def delete():
        store.bump("a", {})
        del store.nodes["a"]

    store.nodes["a"]["metadata"]["resourceVersion"] = "1"
    original_patch = store.patch_node

    def patch_then_conflict(name, patch):
        if name not in store.nodes:
            raise Conflict(name)
        return original_patch(name, patch)

    store.patch_node = patch_then_conflict
    result = label_batch([request("a")], store, before_write=delete)
    assert result["missing"] == ["a"] and result["changed"] == {}


def test_retries_exhausted_is_one_sentence():
    store = NodeStoreDouble("a")
    original = store.patch_node

    def always_stale(name, patch):
        store.bump(name, {"metadata": {"annotations": {"other": "x"}}})
        return original(name, patch)

    store.patch_node = always_stale
    with pytest.raises(LabelError, match=r"the Node a changed between every read and write \(3 tries\)"):
        label_batch([request("a")], store, conflict_retries=2)
    assert store.patches == []


def test_each_nodes_sharing_reaches_its_labels():
    store = NodeStoreDouble("plain", "sliced")
    sliced = {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}
    bad = {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}
    result = label_batch([request("plain"), request("sliced", sharing=sliced), request("mps", sharing=bad)], store)
    plain, shared = (store.nodes[n]["metadata"]["labels"] for n in ("plain", "sliced"))
    assert (plain["nvidia.com/gpu.product"], plain["nvidia.com/gpu.replicas"]) == ("NVIDIA-L4", "1")
    assert (shared["nvidia.com/gpu.product"], shared["nvidia.com/gpu.replicas"]) == ("NVIDIA-L4-SHARED", "4")
    assert shared["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert result["invalid"] == {
        "mps": "gpu_labels: sharing has mps; only timeSlicing is supported (the collection's "
        "device plugin does not run MPS)."
    }


MIG_CONFIG = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}
KEEP = ["nvidia.com/mig.config", "nvidia.com/mig.config.state"]


def _labelled_by_the_mig_stage(store, name):
    """The node as a run with the MIG stage left it: its labels, the MIG config's among them, are the collection's."""
    label_batch([request(name, user_labels=dict(MIG_CONFIG))], store)
    assert store.nodes[name]["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"


def test_kept_labels_keep_the_nodes_values_and_stay_owned():
    store = NodeStoreDouble("a")
    _labelled_by_the_mig_stage(store, "a")
    store.patches.clear()
    # A run that does not decide them (no MIG stage) and keeps them: nothing to write.
    result = label_batch([request("a", keep_labels=KEEP)], store)
    assert result["changed"] == {} and store.patches == []
    # Without keeping them they are removed, as any label the collection owned and no longer wants.
    result = label_batch([request("a")], store)
    assert result["changed"]["a"]["metadata"]["labels"] == dict.fromkeys(KEEP)
    assert not set(KEEP) & set(store.nodes["a"]["metadata"]["labels"])


def test_a_kept_label_the_node_does_not_have_is_not_added_and_a_decided_one_wins():
    store = NodeStoreDouble("a")
    label_batch([request("a", keep_labels=KEEP)], store)
    labels = store.nodes["a"]["metadata"]["labels"]
    assert not set(KEEP) & set(labels)
    assert "nvidia.com/mig.config" not in store.nodes["a"]["metadata"]["annotations"]["gpuops.k8s/owned-labels"]
    _labelled_by_the_mig_stage(store, "a")
    label_batch([request("a", keep_labels=KEEP, user_labels={"nvidia.com/mig.config.state": "pending"})], store)
    assert store.nodes["a"]["metadata"]["labels"]["nvidia.com/mig.config.state"] == "pending"
    assert store.nodes["a"]["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"


def test_a_kept_label_written_meanwhile_is_kept_at_its_new_value():
    """After a conflict the node is read again, and the kept value is the fresh one."""
    store = NodeStoreDouble("a")
    _labelled_by_the_mig_stage(store, "a")

    def relabel():
        store.bump("a", {"metadata": {"labels": {"nvidia.com/mig.config.state": "failed", "rack": "r2"}}})

    result = label_batch([request("a", keep_labels=KEEP, user_labels={"site": "x"})], store, before_write=relabel)
    assert result["conflicts"] == 1
    assert store.nodes["a"]["metadata"]["labels"]["nvidia.com/mig.config.state"] == "failed"


@pytest.mark.parametrize(
    "keep, message",
    [
        ("nvidia.com/mig.config", "keep_labels must be a list of label keys"),
        (["bad key!"], "label key 'bad key!'"),
    ],
)
def test_bad_kept_labels_make_the_node_invalid_with_a_sentence(keep, message):
    store = NodeStoreDouble("a")
    result = label_batch([request("a", keep_labels=keep)], store)
    assert message in result["invalid"]["a"]
    assert store.patches == []


def test_each_nodes_mig_strategy_reaches_its_labels():
    mig_info = {
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA A100-SXM4-40GB",
                "memory_total_mib": 40960,
                "compute_capability": "8.0",
                "mig_mode": "enabled",
                "mig_devices": [{"index": 0, "uuid": "MIG-1", "profile": "1g.5gb", "memory_mib": 4864}],
            }
        ]
    }
    store = NodeStoreDouble("none", "mixed", "bad")
    result = label_batch(
        [
            request("none", gpu_info=mig_info),
            request("mixed", gpu_info=mig_info, mig_strategy="mixed"),
            request("bad", gpu_info=mig_info, mig_strategy="all"),
        ],
        store,
    )
    plain, mixed = (store.nodes[n]["metadata"]["labels"] for n in ("none", "mixed"))
    assert "nvidia.com/mig.strategy" not in plain and "nvidia.com/mig-1g.5gb.count" not in plain
    assert (mixed["nvidia.com/mig.strategy"], mixed["nvidia.com/mig-1g.5gb.count"]) == ("mixed", "1")
    assert "mig_strategy must be one of none, single, mixed" in result["invalid"]["bad"]


def test_absent_takes_off_what_the_collection_applied_and_only_that():
    store = NodeStoreDouble("a", "b")
    label_batch([request("a", user_labels={"rack": "r1"}), request("b")], store)
    # Someone else's label and taint, one of them on a key the collection computes for other nodes.
    foreign_taint = {"key": "example.com/maintenance", "value": "yes", "effect": "NoSchedule"}
    store.bump(
        "a",
        {
            "metadata": {"labels": {"team": "ml", "nvidia.com/gpu.present": None}},
            "spec": {"taints": [*store.nodes["a"]["spec"]["taints"], foreign_taint]},
        },
    )
    store.bump("b", {"metadata": {"labels": {"nvidia.com/gpu.deploy.driver": "false"}}})
    b_before = copy.deepcopy(store.nodes["b"])
    store.patches.clear()

    result = label_batch([{"name": "a", "state": "absent"}], store, check_mode=True)
    assert store.patches == []
    assert result["diff"]["a"]["after"] == {"labels": {"team": "ml"}, "annotations": {}, "taints": [foreign_taint]}

    result = label_batch([{"name": "a", "state": "absent"}], store)
    assert store.lists == 3 and [name for name, _patch in store.patches] == ["a"]
    assert store.nodes["a"]["metadata"]["labels"] == {"team": "ml"}
    assert store.nodes["a"]["metadata"].get("annotations", {}) == {}
    assert store.nodes["a"]["spec"]["taints"] == [foreign_taint]
    assert sorted(result["changed"]) == ["a"]
    # The other node is as it was.
    assert store.nodes["b"] == b_before

    # Again, and on a node the collection never labelled: nothing to write.
    store.patches.clear()
    again = label_batch([{"name": "a", "state": "absent"}, {"name": "c", "state": "absent"}], store)
    assert again["changed"] == {} and store.patches == [] and again["missing"] == []


def test_absent_removes_the_owned_taint_whatever_the_request_says_of_taints():
    store = NodeStoreDouble("a")
    label_batch([request("a", taint_key="example.com/gpu", taint_value="v", taint_effect="NoExecute")], store)
    result = label_batch([{"name": "a", "state": "absent", "taint": True, "taint_key": "nvidia.com/gpu"}], store)
    assert "taints" not in store.nodes["a"]["spec"]
    assert result["changed"]["a"]["spec"] == {"taints": None}


def test_a_bad_state_is_one_sentence():
    store = NodeStoreDouble("a")
    result = label_batch([{"name": "a", "state": "gone"}], store)
    assert result["invalid"] == {"a": "node_labels: state must be present or absent, got 'gone'."}
    assert store.patches == []
