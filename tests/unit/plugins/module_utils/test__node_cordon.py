"""A Node cordoned by the collection and given back (module_utils/_node_cordon.py, the node_cordon module): the
merge patch for each state a Node can be in, and the write with its precondition, redone on a conflict. The
node_drain role's use of it against a real API server: tests/integration/test_node_drain_api.py."""

from __future__ import annotations

import copy
import json

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import Conflict, apply_patch
from ansible_collections.gpuops.k8s.plugins.module_utils._node_cordon import (
    ANNOTATION,
    CordonError,
    cordon_patch,
    set_cordon,
    view,
)

NOW = "2026-11-28T12:00:00Z"
OURS = {"by": "gpuops.k8s.node_drain", "since": NOW, "reason": "the driver changes"}


def node(unschedulable=False, record=None, version="41"):
    annotations = {"other": "kept"}
    if record is not None:
        annotations[ANNOTATION] = json.dumps(record, sort_keys=True)
    return {
        "metadata": {"name": "gpu-a", "resourceVersion": version, "annotations": annotations},
        "spec": {"unschedulable": True} if unschedulable else {},
    }


def test_present_cordons_a_schedulable_node_and_records_who_in_the_same_patch():
    patch = cordon_patch(node(), "present", "gpuops.k8s.node_drain", "the driver changes", NOW)
    assert patch == {
        "spec": {"unschedulable": True},
        "metadata": {"annotations": {ANNOTATION: json.dumps(OURS, sort_keys=True)}},
    }


def test_present_leaves_a_cordon_as_it_is_ours_or_a_persons():
    assert cordon_patch(node(unschedulable=True, record=OURS), "present", "x", "y", NOW) == {}
    assert cordon_patch(node(unschedulable=True), "present", "x", "y", NOW) == {}
    assert view(node(unschedulable=True)) == {"unschedulable": True, "cordoned_by": None}


def test_absent_lifts_only_a_recorded_cordon():
    assert cordon_patch(node(unschedulable=True, record=OURS), "absent") == {
        "spec": {"unschedulable": False},
        "metadata": {"annotations": {ANNOTATION: None}},
    }
    assert cordon_patch(node(unschedulable=True), "absent") == {}
    # Uncordoned by hand since: the record goes, nothing else changes.
    assert cordon_patch(node(record=OURS), "absent") == {"metadata": {"annotations": {ANNOTATION: None}}}


def test_a_record_that_is_no_json_object_is_still_a_record():
    broken = node(unschedulable=True)
    broken["metadata"]["annotations"][ANNOTATION] = "not json"
    assert view(broken)["cordoned_by"] == {}
    assert cordon_patch(broken, "absent")["spec"] == {"unschedulable": False}


class NodeStoreDouble:
    """A Node store that refuses writes carrying an old resourceVersion, as the API server does; someone else writes
    the node right before each of our first WRITES writes (cordoning it, with CORDONS)."""

    def __init__(self, stored, writes=0, cordons=False):
        self.stored = stored
        self.writes, self.cordons = writes, cordons
        self.patches = []

    def read_node(self, name):
        return copy.deepcopy(self.stored) if self.stored else None

    def patch_node(self, name, patch):
        if self.writes:
            self.writes -= 1
            if self.cordons:
                self.stored["spec"]["unschedulable"] = True
            self.stored["metadata"]["resourceVersion"] = str(int(self.stored["metadata"]["resourceVersion"]) + 1)
        if patch["metadata"]["resourceVersion"] != self.stored["metadata"]["resourceVersion"]:
            raise Conflict(name)
        self.patches.append(patch)
        self.stored = apply_patch(self.stored, patch)
        self.stored["metadata"]["resourceVersion"] = str(int(patch["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.stored)


def test_a_person_cordoning_between_the_read_and_the_write_keeps_the_cordon_theirs():
    api = NodeStoreDouble(node(), writes=1, cordons=True)
    patch, _before, after, conflicts = set_cordon(api, "gpu-a", "present", "gpuops.k8s.node_drain", "", NOW)
    assert (patch, conflicts, api.patches) == ({}, 1, [])
    assert view(after) == {"unschedulable": True, "cordoned_by": None}


def test_check_mode_writes_nothing_and_shows_the_node_after():
    api = NodeStoreDouble(node())
    patch, _before, after, _conflicts = set_cordon(api, "gpu-a", "present", "x", "", NOW, check_mode=True)
    assert patch and api.patches == []
    assert view(after)["unschedulable"] is True and view(api.stored)["unschedulable"] is False


def test_a_node_written_all_the_time_and_a_missing_node_are_one_sentence():
    with pytest.raises(CordonError) as error:
        set_cordon(NodeStoreDouble(node(), writes=10), "gpu-a", "present", retries=2)
    assert str(error.value) == (
        "node_cordon: the Node gpu-a changed between every read and write (3 tries); something else is writing it "
        "all the time."
    )
    with pytest.raises(CordonError, match=r"^node_cordon: the API server has no Node gpu-x\.$"):
        set_cordon(NodeStoreDouble(None), "gpu-x", "absent")
