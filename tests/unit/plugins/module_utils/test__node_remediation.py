"""A Node put under GPU remediation and given back (module_utils/_node_remediation.py, the node_remediation module):
the merge patch for each state a Node can be in, and the write with its precondition, redone on a conflict."""

from __future__ import annotations

import copy
import datetime
import json

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils import _node_remediation as remediation
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import with_precondition
from ansible_collections.gpuops.k8s.plugins.module_utils._node_remediation import (
    ANNOTATION,
    TAINT_KEY,
    Conflict,
    RemediationError,
    apply_patch,
    remediation_patch,
    set_remediation,
    view,
)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NOW = "2026-11-26T12:00:00Z"


def node(unschedulable=False, klass=None, annotation=None, version="41"):
    spec = {"taints": [dict(GPU_TAINT)]}
    if unschedulable:
        spec["unschedulable"] = True
    if klass:
        spec["taints"].append({"key": TAINT_KEY, "value": klass, "effect": "NoSchedule"})
    annotations = {"other": "kept"}
    if annotation is not None:
        annotations[ANNOTATION] = json.dumps(annotation, sort_keys=True)
    return {"metadata": {"name": "gpu-a", "resourceVersion": version, "annotations": annotations}, "spec": spec}


def written_annotation(patch):
    return json.loads(patch["metadata"]["annotations"][ANNOTATION])


def test_present_cordons_taints_and_annotates_a_schedulable_node():
    patch = remediation_patch(node(), "present", "reset", ["GPU-2", "GPU-1"], "XID 48", NOW)
    assert patch["spec"] == {
        "taints": [GPU_TAINT, {"key": TAINT_KEY, "value": "reset", "effect": "NoSchedule"}],
        "unschedulable": True,
    }
    assert written_annotation(patch) == {
        "class": "reset",
        "since": NOW,
        "gpus": ["GPU-1", "GPU-2"],
        "reason": "XID 48",
        "cordoned_before": False,
    }


def test_present_on_a_node_cordoned_before_remembers_it_and_leaves_the_cordon():
    patch = remediation_patch(node(unschedulable=True), "present", "reboot", [], "XID 79", NOW)
    assert "unschedulable" not in patch["spec"]
    assert written_annotation(patch)["cordoned_before"] is True


def test_present_again_changes_nothing_even_later():
    first = node()
    after = apply_patch(first, remediation_patch(first, "present", "reset", ["GPU-1"], "XID 48", NOW))
    assert remediation_patch(after, "present", "reset", ["GPU-1"], "another reason", "2026-11-27T00:00:00Z") == {}


def test_present_with_another_gpu_of_the_same_class_adds_it_and_keeps_the_rest():
    first = node()
    after = apply_patch(first, remediation_patch(first, "present", "reset", ["GPU-1"], "XID 48", NOW))
    patch = remediation_patch(after, "present", "reset", ["GPU-3"], "XID 64", "2026-11-26T13:00:00Z")
    assert set(patch) == {"metadata"}
    assert written_annotation(patch) == {
        "class": "reset",
        "since": NOW,
        "gpus": ["GPU-1", "GPU-3"],
        "reason": "XID 48",
        "cordoned_before": False,
    }


def test_a_higher_class_replaces_the_taint_value_in_place_and_keeps_who_cordoned():
    before = node(
        unschedulable=True,
        klass="reset",
        annotation={"class": "reset", "since": NOW, "gpus": ["GPU-1"], "reason": "XID 48", "cordoned_before": False},
    )
    before["spec"]["taints"].append({"key": "example.com/other", "effect": "NoExecute"})
    patch = remediation_patch(
        before, "present", "replace", ["GPU-1"], "not healthy after the reset", "2026-11-26T13:00:00Z"
    )
    assert patch["spec"] == {
        "taints": [
            GPU_TAINT,
            {"key": TAINT_KEY, "value": "replace", "effect": "NoSchedule"},
            {"key": "example.com/other", "effect": "NoExecute"},
        ]
    }
    assert written_annotation(patch) == {
        "class": "replace",
        "since": "2026-11-26T13:00:00Z",
        "gpus": ["GPU-1"],
        "reason": "not healthy after the reset",
        "cordoned_before": False,
        "previous_class": "reset",
    }


def test_absent_removes_the_taint_and_the_annotation_and_uncordons():
    under = node(
        unschedulable=True,
        klass="reboot",
        annotation={"class": "reboot", "since": NOW, "gpus": [], "reason": "", "cordoned_before": False},
    )
    patch = remediation_patch(under, "absent")
    assert patch == {
        "spec": {"taints": [GPU_TAINT], "unschedulable": False},
        "metadata": {"annotations": {ANNOTATION: None}},
    }
    after = apply_patch(under, patch)
    assert view(after) == {"unschedulable": False, "taint": None, "annotation": None}
    assert after["metadata"]["annotations"] == {"other": "kept"}
    assert remediation_patch(after, "absent") == {}


def test_absent_leaves_a_cordon_that_was_there_before():
    under = node(
        unschedulable=True,
        klass="reboot",
        annotation={"class": "reboot", "since": NOW, "gpus": [], "reason": "", "cordoned_before": True},
    )
    patch = remediation_patch(under, "absent")
    assert "unschedulable" not in patch["spec"]
    assert view(apply_patch(under, patch))["unschedulable"] is True


def test_absent_without_an_annotation_removes_the_taint_and_leaves_the_cordon():
    """Nothing says who cordoned the node: the cordon stays."""
    patch = remediation_patch(node(unschedulable=True, klass="reset"), "absent")
    assert patch == {"spec": {"taints": [GPU_TAINT]}}


@pytest.mark.parametrize(
    ("state", "klass", "message"),
    [
        ("present", "drain", "node_remediation: class must be one of reset, reboot, replace, got 'drain'."),
        ("present", None, "node_remediation: class must be one of reset, reboot, replace, got None."),
        ("gone", None, "node_remediation: state must be present or absent, got 'gone'."),
    ],
)
def test_bad_arguments_are_one_sentence(state, klass, message):
    with pytest.raises(RemediationError) as error:
        remediation_patch(node(), state, klass)
    assert str(error.value) == message


def test_the_precondition_carries_the_resource_version_read():
    patch = {"spec": {"unschedulable": True}, "metadata": {"annotations": {ANNOTATION: "{}"}}}
    assert with_precondition(patch, node(version="7")) == {
        "spec": {"unschedulable": True},
        "metadata": {"annotations": {ANNOTATION: "{}"}, "resourceVersion": "7"},
    }


class FakeApi:
    """A Node store that refuses writes carrying an old resourceVersion, as the API server does."""

    def __init__(self, stored, interfere=0):
        self.stored = stored
        self.interfere = interfere  # how many writes someone else makes right before ours
        self.patches = []

    def read_node(self, name):
        return copy.deepcopy(self.stored) if self.stored else None

    def patch_node(self, name, patch):
        if self.interfere:
            self.interfere -= 1
            self.stored["spec"]["taints"].append({"key": f"someone-else-{self.interfere}", "effect": "NoSchedule"})
            self.stored["metadata"]["resourceVersion"] = str(int(self.stored["metadata"]["resourceVersion"]) + 1)
        if patch["metadata"]["resourceVersion"] != self.stored["metadata"]["resourceVersion"]:
            raise Conflict(name)
        self.patches.append(patch)
        self.stored = apply_patch(self.stored, patch)
        self.stored["metadata"].pop("resourceVersion", None)
        self.stored["metadata"]["resourceVersion"] = str(int(patch["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.stored)


def test_a_write_refused_because_the_node_changed_is_redone_and_loses_nothing():
    api = FakeApi(node(), interfere=2)
    _patch, before, after, conflicts = set_remediation(api, "gpu-a", "present", "reboot", ["GPU-1"], "XID 79", NOW)
    assert conflicts == 2 and len(api.patches) == 1
    keys = [t["key"] for t in api.stored["spec"]["taints"]]
    assert keys == ["nvidia.com/gpu", "someone-else-1", "someone-else-0", TAINT_KEY]
    assert view(after)["taint"] == {"key": TAINT_KEY, "value": "reboot", "effect": "NoSchedule"}
    assert view(before)["taint"] is None


def test_a_node_written_all_the_time_is_one_sentence():
    api = FakeApi(node(), interfere=10)
    with pytest.raises(RemediationError) as error:
        set_remediation(api, "gpu-a", "present", "reboot", retries=2)
    assert str(error.value) == (
        "node_remediation: the Node gpu-a changed between every read and write (3 tries); something else is writing "
        "it all the time."
    )


def test_check_mode_writes_nothing_and_shows_the_node_after():
    api = FakeApi(node())
    patch, _before, after, _conflicts = set_remediation(
        api, "gpu-a", "present", "reset", ["GPU-1"], "", NOW, check_mode=True
    )
    assert patch and api.patches == []
    assert view(after)["unschedulable"] is True and view(api.stored)["unschedulable"] is False


def test_nothing_to_do_is_no_write():
    api = FakeApi(node())
    assert set_remediation(api, "gpu-a", "absent")[0] == {}
    assert api.patches == []


def test_a_missing_node_is_one_sentence():
    with pytest.raises(RemediationError, match=r"^node_remediation: the API server has no Node gpu-x\.$"):
        set_remediation(FakeApi(None), "gpu-x", "present", "reset")


# --- holds, giving back only what the remediation set, the breaker under its Lease ---------------------------------
class LeaseStore(FakeApi):
    """FakeApi with a list of Nodes and a Lease, as an API server keeps them (a test double of both)."""

    def __init__(self, *nodes):
        super().__init__(nodes[0])
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        self.lease, self.lease_where, self.lease_version = None, "kube-system/gpuops-k8s-gpu-remediation", 0

    def read_node(self, name):
        return copy.deepcopy(self.nodes.get(name))

    def list_nodes(self):
        return [copy.deepcopy(n) for n in self.nodes.values()]

    def patch_node(self, name, patch):
        current = self.nodes[name]
        if patch.get("metadata", {}).get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
            raise Conflict(name)
        body = copy.deepcopy(patch)
        body.get("metadata", {}).pop("resourceVersion", None)
        after = apply_patch(current, body)
        after["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
        self.nodes[name] = after
        return copy.deepcopy(after)

    def read_lease(self):
        return copy.deepcopy(self.lease)

    def write_lease(self, lease, spec):
        if (lease or {}).get("metadata", {}).get("resourceVersion") != (self.lease or {}).get("metadata", {}).get(
            "resourceVersion"
        ):
            raise Conflict(self.lease_where)
        self.lease_version += 1
        self.lease = {"metadata": {"resourceVersion": str(self.lease_version)}, "spec": dict(spec)}
        return copy.deepcopy(self.lease)


MOMENT = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.timezone.utc)


def named(name, **kwargs):
    made = node(**kwargs)
    made["metadata"]["name"] = name
    return made


def test_a_taint_a_person_raised_stays_when_the_node_is_given_back():
    annotation = {"class": "reset", "since": NOW, "gpus": ["GPU-1"], "reason": "", "cordoned_before": False}
    raised = node(unschedulable=True, klass="replace", annotation=annotation)
    assert remediation_patch(raised, "absent", "reset") == {}
    assert remediation_patch(raised, "absent") == {}
    result = remediation.write(LeaseStore(raised), "gpu-a", "absent", "reset")
    assert result["decision"] == "kept" and result["patch"] == {}
    # Present never lowers it either.
    assert remediation.write(LeaseStore(raised), "gpu-a", "present", "reset")["decision"] == "raised"


def test_only_a_cordon_this_module_set_is_lifted():
    annotation = {"class": "reset", "since": NOW, "gpus": ["GPU-1"], "reason": "", "cordoned_before": False}
    ours = node(unschedulable=True, klass="reset", annotation=annotation)
    ours["metadata"]["managedFields"] = [
        {"manager": "gpuops.k8s-node-remediation", "fieldsV1": {"f:spec": {"f:unschedulable": {}, "f:taints": {}}}}
    ]
    assert remediation_patch(ours, "absent", "reset")["spec"]["unschedulable"] is False
    theirs = copy.deepcopy(ours)
    theirs["metadata"]["managedFields"] = [
        {"manager": "gpuops.k8s-node-remediation", "fieldsV1": {"f:spec": {"f:taints": {}}}},
        {"manager": "kubectl-cordon", "fieldsV1": {"f:spec": {"f:unschedulable": {}}}},
    ]
    patch = remediation_patch(theirs, "absent", "reset")
    assert "unschedulable" not in patch["spec"] and patch["spec"]["taints"] == [GPU_TAINT]


def test_a_node_another_run_holds_is_left_alone_until_the_hold_ends():
    store = LeaseStore(node())
    later = "2026-11-26T13:00:00Z"
    first = remediation.write(store, "gpu-a", "present", "reset", run_id="run-1", held_until=later, moment=MOMENT)
    assert first["decision"] == "written"
    other = remediation.write(store, "gpu-a", "absent", run_id="run-2", moment=MOMENT)
    assert other["decision"] == "held" and other["patch"] == {}
    assert (
        other["message"] == "gpu-a is under the remediation of run run-1 until 2026-11-26T13:00:00Z and is left to it."
    )
    after = remediation.write(store, "gpu-a", "absent", run_id="run-2", moment=MOMENT + datetime.timedelta(hours=2))
    assert after["decision"] == "written" and view(after["after"])["taint"] is None


def test_the_breaker_counts_under_the_lease_and_leaves_the_node_untouched_when_full():
    store = LeaseStore(named("gpu-a"), named("gpu-b"))
    taken = remediation.claim(store, "gpu-a", "reset", 1, run_id="run-1", moment=MOMENT)
    assert taken["decision"] == "written" and taken["counted"] == 0
    assert store.lease["spec"]["holderIdentity"] is None and store.lease_version == 2
    waits = remediation.claim(store, "gpu-b", "reboot", 1, run_id="run-2", moment=MOMENT)
    assert waits["decision"] == "waiting" and waits["patch"] == {} and view(store.nodes["gpu-b"])["taint"] is None
    assert waits["message"].startswith("gpu-b waits: 1 of 1 remediation slot(s) are taken (gpu-a (reset))")


def test_a_lease_held_by_a_live_run_is_waited_for_then_one_sentence():
    store = LeaseStore(named("gpu-a"))
    store.lease = {
        "metadata": {"resourceVersion": "7"},
        "spec": {"holderIdentity": "run-1", "leaseDurationSeconds": 30, "renewTime": "2999-01-01T00:00:00.000000Z"},
    }
    with pytest.raises(RemediationError, match="the Lease kube-system/gpuops-k8s-gpu-remediation is held by run-1"):
        remediation.acquire_lease(store, "run-2", 30, 0, sleep=lambda seconds: None)


def test_a_run_whose_lease_was_taken_meanwhile_backs_its_taint_out_past_the_limit():
    store = LeaseStore(named("gpu-a"), named("gpu-b", klass="reboot"))
    real_write = store.write_lease

    def other_run_takes_it(lease, spec):
        if lease is not None and spec.get("holderIdentity") is None:
            raise Conflict(store.lease_where)  # the release: another run holds the Lease now
        return real_write(lease, spec)

    store.write_lease = other_run_takes_it
    lists = iter([lambda: [named("gpu-a")], LeaseStore.list_nodes.__get__(store)])

    def list_nodes():  # the first count misses gpu-b, tainted by the other run meanwhile
        return next(lists)()

    store.list_nodes = list_nodes
    result = remediation.claim(store, "gpu-a", "reset", 1, run_id="run-1", moment=MOMENT)
    assert result["decision"] == "waiting" and "backed out" in result["message"]
    assert view(store.nodes["gpu-a"])["taint"] is None
