"""The circuit breaker and the per-node decisions of playbooks/remediate.yml (the remediation_plan filter): which
nodes start, continue, wait or are held, and why, on fleets larger than the lab's two nodes."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.remediation_plan import (
    ANNOTATION,
    TAINT_KEY,
    FilterModule,
    parse_duration,
    parse_max_nodes,
    remediation_plan,
)
from ansible_collections.gpuops.k8s.plugins.filter.remediation_pods import remediation_pods

NOW = "2026-11-26T12:00:00Z"
REASONS = {
    "none": "XID 13 (graphics engine exception): catalog RESTART_APP, none as the daemon ignores it",
    "device": "XID 999 is not in the catalog table: the default class device",
    "reset": "XID 48 (double bit ECC error): catalog WORKFLOW_XID_48",
    "reboot": "XID 79 (GPU has fallen off the bus): catalog RESTART_BM",
    "replace": "XID 54 (auxiliary power not connected): catalog CHECK_MECHANICALS",
}


def uuid(node, index):
    return f"GPU-{node}-{index:04d}"


def gpu(node, index, klass="none", healthy=None):
    return {
        "uuid": uuid(node, index),
        "index": index,
        "pci": f"0000:{index + 0x18:02x}:00.0",
        "healthy": klass in ("none",) if healthy is None else healthy,
        "class": klass,
        "reason": REASONS[klass] if klass != "none" else "",
        "source": "daemon",
        "xids": [],
    }


def node(name, classes=(), record=None, boot_id="boot-1", can_reset=True, reset_note=None):
    """A play host's entry: GPU i of the node has classes[i] (the rest of 4 GPUs none)."""
    gpus = [gpu(name, i, klass) for i, klass in enumerate(list(classes) + ["none"] * (4 - len(classes)))]
    entry = {
        "host": name,
        "node": name,
        "faults": {"gpus": gpus, "node_class": max((g["class"] for g in gpus), key=list(REASONS).index)},
        "record": json.dumps(record) if isinstance(record, dict) else record,
        "boot_id": boot_id,
        "can_reset": can_reset,
    }
    if reset_note:
        entry["reset_note"] = reset_note
    return entry


def cluster_node(name, taint=None, since="2026-11-26T11:00:00Z", gpus=(), cordoned_before=False):
    """A Node as k8s_info returns it, under remediation of class `taint` (None: not under remediation)."""
    spec = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    metadata = {"name": name, "annotations": {}}
    if taint is not None:
        spec["taints"].append({"key": TAINT_KEY, "value": taint, "effect": "NoSchedule"})
        spec["unschedulable"] = True
        metadata["annotations"][ANNOTATION] = json.dumps(
            {"class": taint, "since": since, "gpus": list(gpus), "reason": "", "cordoned_before": cordoned_before}
        )
    return {"metadata": metadata, "spec": spec}


def plan_of(nodes, cluster=None, **kwargs):
    names = {entry["node"] for entry in nodes}
    cluster = list(cluster or []) + [
        cluster_node(n) for n in sorted(names - {c["metadata"]["name"] for c in cluster or []})
    ]
    kwargs.setdefault("now", NOW)
    return remediation_plan(nodes, cluster, **kwargs)


def by_node(plan):
    return {entry["node"]: entry for entry in plan["nodes"]}


# --- the breaker -----------------------------------------------------------------------------------------------
def test_three_of_four_failing_with_a_limit_of_one_start_exactly_one_and_the_others_are_told_why():
    nodes = [node("gpu-a", ["reset"]), node("gpu-b", ["none", "reboot"]), node("gpu-c"), node("gpu-d", ["reset"])]
    plan = plan_of(nodes, max_nodes=1)
    entries = by_node(plan)
    assert plan["started"] == ["gpu-b"]  # the most severe class first
    assert plan["waiting"] == ["gpu-a", "gpu-d"]
    assert [entries[n]["action"] for n in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")] == ["wait", "remediate", "none", "wait"]
    for waiting in ("gpu-a", "gpu-d"):
        message = entries[waiting]["message"]
        assert message == (
            f"{waiting}: reset for GPU 0 ({uuid(waiting, 0)}): {REASONS['reset']}; waits, 1 of 1 remediation slot(s)"
            " being taken (gpu-b (reboot); gpu_remediation_max_nodes 1). The node is left untouched; its faults stay"
            " on the node and a later run starts it once a slot is free."
        )
    started = entries["gpu-b"]["message"]
    assert started == f"gpu-b: reboot starts now for GPU 1 ({uuid('gpu-b', 1)}): {REASONS['reboot']}."
    assert (
        entries["gpu-c"]["message"]
        == "gpu-c: nothing to do, no GPU needs more than leaving scheduling (no GPU faults)."
    )
    assert plan["summary"] == (
        "Remediation slots: 1 of 1 in use (gpu_remediation_max_nodes 1): gpu-b (reboot). "
        "Started now: gpu-b. Waiting for a slot: gpu-a, gpu-d."
    )


def test_candidates_of_the_same_class_start_in_node_name_order():
    nodes = [node(name, ["reset"]) for name in ("gpu-c", "gpu-a", "gpu-b")]
    plan = plan_of(nodes, max_nodes=2)
    assert plan["started"] == ["gpu-a", "gpu-b"] and plan["waiting"] == ["gpu-c"]
    # The entries keep the play's order.
    assert [e["node"] for e in plan["nodes"]] == ["gpu-c", "gpu-a", "gpu-b"]


def test_replace_takes_a_slot_before_reboot_and_reset():
    nodes = [node("gpu-a", ["reset"]), node("gpu-b", ["reboot"]), node("gpu-c", ["replace"])]
    plan = plan_of(nodes, max_nodes=2)
    assert plan["started"] == ["gpu-c", "gpu-b"] and plan["waiting"] == ["gpu-a"]
    assert by_node(plan)["gpu-c"]["class"] == "replace"


@pytest.mark.parametrize(
    ("max_nodes", "fleet_size", "started"),
    [
        ("50%", 4, 2),
        ("25%", 4, 1),
        ("10%", 4, 1),  # rounded down to 0, but a percentage above 0 lets one node in
        ("0%", 4, 0),
        ("100%", 4, 3),
        ("10%", 20, 2),  # the fleet is larger than the play (a run limited to some nodes)
        ("10%", 0, 1),  # never a fleet smaller than the nodes given
        ("12.5%", 16, 2),
        (0, 4, 0),
        ("2", 4, 2),
        (3, 4, 3),
    ],
)
def test_count_and_percent_limits(max_nodes, fleet_size, started):
    nodes = [node(f"gpu-{i}", ["reset"]) for i in range(3)] + [node("gpu-3")]
    plan = plan_of(nodes, max_nodes=max_nodes, fleet_size=fleet_size)
    assert len(plan["started"]) == started
    assert len(plan["waiting"]) == 3 - started


def test_a_percent_limit_says_how_it_was_reached():
    plan = plan_of([node("gpu-a", ["reset"])], max_nodes="25%", fleet_size=8)
    assert plan["limit"] == 2 and plan["limit_text"] == "25% of 8 nodes = 2"
    assert "gpu_remediation_max_nodes 25% of 8 nodes = 2" in plan["summary"]


@pytest.mark.parametrize("bad", ["abc", "-1", -1, "150%", "%", True, "1.5", None])
def test_a_bad_limit_is_one_sentence(bad):
    with pytest.raises(AnsibleFilterError) as error:
        plan_of([node("gpu-a", ["reset"])], max_nodes=bad)
    assert str(error.value) == (
        "remediation_plan: gpu_remediation_max_nodes must be a count (0 or more) or a percentage such as '25%', "
        f"got {bad!r}."
    )


def test_a_node_that_never_came_back_holds_its_slot():
    """gpu-z rebooted and did not come back: it is not in the play (unreachable), but its taint counts."""
    nodes = [node("gpu-a", ["reboot"]), node("gpu-b")]
    cluster = [cluster_node("gpu-z", taint="reboot", since="2026-11-26T10:00:00Z")]
    plan = plan_of(nodes, cluster, max_nodes=1)
    assert plan["started"] == [] and plan["waiting"] == ["gpu-a"]
    assert plan["in_flight"] == [
        {"node": "gpu-z", "class": "reboot", "since": "2026-11-26T10:00:00Z", "in_play": False}
    ]
    assert "waits, 1 of 1 remediation slot(s) being taken (gpu-z (reboot);" in by_node(plan)["gpu-a"]["message"]
    assert "not in this run and still under remediation: gpu-z (reboot, since 2026-11-26T10:00:00Z)" in plan["summary"]
    # With a second slot, the one that never came back still holds the first.
    plan = plan_of(nodes, cluster, max_nodes=2)
    assert plan["started"] == ["gpu-a"]


def test_a_node_under_remediation_continues_without_a_new_slot_and_others_wait():
    """A re-run mid-remediation: gpu-a carries the taint from the run before; the limit of 1 is reached by it."""
    record = {"version": 1, "current": {"class": "reset", "gpus": [uuid("gpu-a", 2)], "boot_id": "boot-1"}}
    nodes = [node("gpu-a", record=record), node("gpu-b", ["reset"])]
    cluster = [cluster_node("gpu-a", taint="reset", gpus=[uuid("gpu-a", 2)])]
    plan = plan_of(nodes, cluster, max_nodes=1)
    entries = by_node(plan)
    assert entries["gpu-a"]["action"] == "remediate" and entries["gpu-a"]["continuing"]
    assert entries["gpu-a"]["class"] == "reset"
    # The GPU comes from the annotation and the record: the daemon restarted after its reset and reports none now.
    assert [g["uuid"] for g in entries["gpu-a"]["gpus"]] == [uuid("gpu-a", 2)]
    assert entries["gpu-a"]["message"] == (
        f"gpu-a: continues the reset it is under since 2026-11-26T11:00:00Z for GPU 2 ({uuid('gpu-a', 2)})."
    )
    assert entries["gpu-b"]["action"] == "wait"
    assert plan["started"] == []


def test_a_continuing_reboot_is_done_once_the_boot_id_changed():
    record = {"version": 1, "current": {"class": "reboot", "gpus": [uuid("gpu-a", 1)], "boot_id": "boot-1"}}
    cluster = [cluster_node("gpu-a", taint="reboot", gpus=[uuid("gpu-a", 1)])]
    same = by_node(plan_of([node("gpu-a", record=record, boot_id="boot-1")], cluster))["gpu-a"]
    assert same["continuing"] and not same["reboot_done"]
    after = by_node(plan_of([node("gpu-a", record=record, boot_id="boot-2")], cluster))["gpu-a"]
    assert after["reboot_done"]
    assert "rebooted already" in after["message"]


def test_a_continuing_remediation_rises_with_the_faults():
    cluster = [cluster_node("gpu-a", taint="reset", gpus=[uuid("gpu-a", 0)])]
    entry = by_node(plan_of([node("gpu-a", ["reset", "reboot"])], cluster))["gpu-a"]
    assert entry["class"] == "reboot" and entry["continuing"]
    assert "the node's faults now ask for reboot, more than the reset it was under" in entry["message"]


def test_a_node_tainted_reset_with_no_gpu_named_is_rebooted_not_reset_of_no_gpu():
    # Neither the annotation nor the record names a GPU, and the daemon reports none above device now.
    cluster = [cluster_node("gpu-a", taint="reset", gpus=())]
    entry = by_node(plan_of([node("gpu-a", record={"version": 1, "current": None})], cluster))["gpu-a"]
    assert entry["action"] == "remediate" and entry["class"] == "reboot", entry
    assert "neither its annotation nor its record names a GPU to reset" in entry["message"]


def test_a_node_whose_giving_back_failed_continues_with_the_giving_back():
    current = {"class": "reset", "gpus": [uuid("gpu-a", 0)], "boot_id": "boot-1", "verified": True}
    cluster = [cluster_node("gpu-a", taint="reset", gpus=[uuid("gpu-a", 0)])]
    entry = by_node(plan_of([node("gpu-a", record={"version": 1, "current": current})], cluster))["gpu-a"]
    assert entry["continuing"] and entry["release_only"] and entry["class"] == "reset", entry
    assert "given back, without another reset" in entry["message"]
    # A GPU that failed again since is remediated again.
    again = by_node(plan_of([node("gpu-a", ["reset"], record={"version": 1, "current": current})], cluster))["gpu-a"]
    assert not again["release_only"]


MIG_CAPACITY = {"cpu": "64", "nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56", "pods": "110"}


def with_capacity(cluster_entry, capacity):
    cluster_entry["status"] = {"capacity": dict(capacity), "allocatable": dict(capacity)}
    return cluster_entry


def test_a_remediation_that_starts_keeps_the_gpu_resources_the_node_advertises():
    # The capacity, not the allocatable: the faulty GPU's devices are unhealthy, and so not allocatable, right now.
    cluster = [with_capacity(cluster_node("gpu-a"), MIG_CAPACITY)]
    cluster[0]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "49"
    entry = by_node(plan_of([node("gpu-a", ["reset"])], cluster))["gpu-a"]
    assert entry["action"] == "remediate"
    assert entry["capacity"] == {"nvidia.com/mig-1g.10gb": "56"}
    # A Node without GPU resources (DRA allocation, or no daemon yet) has nothing of them to give back.
    bare = by_node(plan_of([node("gpu-b", ["reset"])], [cluster_node("gpu-b")]))["gpu-b"]
    assert bare["capacity"] == {}


def test_a_continuing_remediation_keeps_the_gpu_resources_of_its_start_not_those_it_lost():
    # The reset destroyed GPU 1's MIG devices: the Node advertises 49 now, the record the 56 it had.
    current = {
        "class": "reset",
        "gpus": [uuid("gpu-a", 1)],
        "boot_id": "boot-1",
        "capacity": {"nvidia.com/mig-1g.10gb": "56"},
    }
    lost = dict(MIG_CAPACITY, **{"nvidia.com/mig-1g.10gb": "49"})
    cluster = [with_capacity(cluster_node("gpu-a", taint="reset", gpus=[uuid("gpu-a", 1)]), lost)]
    entry = by_node(plan_of([node("gpu-a", record={"version": 1, "current": current})], cluster))["gpu-a"]
    assert entry["continuing"] and entry["capacity"] == current["capacity"]
    # Raised to a reboot since: still what the node had when the remediation began.
    raised = by_node(plan_of([node("gpu-a", ["reboot"], record={"version": 1, "current": current})], cluster))
    assert raised["gpu-a"]["class"] == "reboot" and raised["gpu-a"]["capacity"] == current["capacity"]


@pytest.mark.parametrize(
    "kept",
    [
        "56",
        ["nvidia.com/mig-1g.10gb"],
        {"nvidia.com/mig-1g.10gb": 56},
        {"nvidia.com/mig-1g.10gb": "-1"},
        {"nvidia.com/mig-1g.10gb": "1e9"},
        {"nvidia.com/../../etc": "1"},
    ],
)
def test_a_record_whose_gpu_resources_are_not_counts_is_not_believed(kept):
    """The record is the node's own file: what it keeps must be names and counts, else the Node's capacity counts."""
    current = {"class": "reset", "gpus": [uuid("gpu-a", 1)], "boot_id": "boot-1", "capacity": kept}
    cluster = [with_capacity(cluster_node("gpu-a", taint="reset", gpus=[uuid("gpu-a", 1)]), MIG_CAPACITY)]
    entry = by_node(plan_of([node("gpu-a", record={"version": 1, "current": current})], cluster))["gpu-a"]
    assert entry["capacity"] == {"nvidia.com/mig-1g.10gb": "56"}


def test_a_resource_the_node_offers_none_of_is_not_a_resource_it_had():
    """A MIG layout taken away minutes before: the kubelet keeps the stopped plugin's resource in status.capacity
    with its old count, none of it allocatable, and after its grace period at 0 for good. Neither is waited for."""
    cluster = [with_capacity(cluster_node("gpu-a"), {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "56"})]
    cluster[0]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "0"
    entry = by_node(plan_of([node("gpu-a", ["reset"])], cluster))["gpu-a"]
    assert entry["action"] == "remediate" and entry["capacity"] == {"nvidia.com/gpu": "8"}
    # After the grace period: 0 in both, and absent from allocatable where a status leaves it out.
    cluster = [with_capacity(cluster_node("gpu-a"), {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "0"})]
    assert by_node(plan_of([node("gpu-a", ["reset"])], cluster))["gpu-a"]["capacity"] == {"nvidia.com/gpu": "8"}
    del cluster[0]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"]
    cluster[0]["status"]["capacity"]["nvidia.com/mig-1g.10gb"] = "7"
    assert by_node(plan_of([node("gpu-a", ["reset"])], cluster))["gpu-a"]["capacity"] == {"nvidia.com/gpu": "8"}


def test_a_node_another_run_holds_is_left_to_it_until_its_hold_ends():
    cluster = [cluster_node("gpu-a", taint="reboot", gpus=[uuid("gpu-a", 1)])]
    annotation = json.loads(cluster[0]["metadata"]["annotations"][ANNOTATION])
    annotation.update(run="run-1", held_until="2026-11-26T12:30:00Z")
    cluster[0]["metadata"]["annotations"][ANNOTATION] = json.dumps(annotation)
    entry = by_node(plan_of([node("gpu-a", ["reboot"])], cluster, run_id="run-2"))["gpu-a"]
    assert entry["action"] == "other_run" and entry["held_by"] == "run-1"
    assert entry["message"].startswith("gpu-a: under the reboot of run run-1; held until 2026-11-26T12:30:00Z")
    mine = by_node(plan_of([node("gpu-a", ["reboot"])], cluster, run_id="run-1"))["gpu-a"]
    later = by_node(plan_of([node("gpu-a", ["reboot"])], cluster, run_id="run-2", now="2026-11-26T12:31:00Z"))
    assert mine["action"] == later["gpu-a"]["action"] == "remediate"


def test_a_node_under_replace_is_held_for_a_person_and_holds_its_slot():
    nodes = [node("gpu-a"), node("gpu-b", ["reboot"])]
    cluster = [cluster_node("gpu-a", taint="replace", since="2026-11-25T08:00:00Z")]
    plan = plan_of(nodes, cluster, max_nodes=1)
    entries = by_node(plan)
    assert entries["gpu-a"]["action"] == "hold"
    assert entries["gpu-a"]["message"] == (
        "gpu-a: under remediation as replace since 2026-11-25T08:00:00Z; it is left cordoned for a person, and holds"
        " a remediation slot until the taint nvidia.com/gpu-remediation is removed."
    )
    assert entries["gpu-b"]["action"] == "wait"


def test_a_taint_of_someone_elses_value_is_held():
    nodes = [node("gpu-a", ["reset"])]
    cluster = [cluster_node("gpu-a", taint="maintenance")]
    entry = by_node(plan_of(nodes, cluster))["gpu-a"]
    assert entry["action"] == "hold"
    assert "which is not a class this playbook acts on" in entry["message"]


# --- classes ---------------------------------------------------------------------------------------------------
def test_none_and_device_do_nothing_and_an_unknown_xid_says_its_default_class():
    entry = by_node(plan_of([node("gpu-a", ["none", "device"])]))["gpu-a"]
    assert entry["action"] == "none" and entry["class"] == "none"
    assert entry["message"] == (
        "gpu-a: nothing to do, no GPU needs more than leaving scheduling (GPU 1 (GPU-gpu-a-0001): device, XID 999 is"
        " not in the catalog table: the default class device)."
    )


def test_a_reset_becomes_a_reboot_where_the_node_cannot_reset():
    note = "the collection's daemon runs from a DaemonSet, whose controller owns the NVML client a GPU reset must stop"
    entry = by_node(plan_of([node("gpu-a", ["reset"], can_reset=False, reset_note=note)]))["gpu-a"]
    assert entry["class"] == "reboot"
    assert note in entry["message"]


def test_a_reset_of_a_gpu_without_a_uuid_becomes_a_reboot():
    entry = node("gpu-a", ["reset"])
    entry["faults"]["gpus"][0].update(uuid=None, index=None, source="kernel")
    planned = by_node(plan_of([entry]))["gpu-a"]
    assert planned["class"] == "reboot"
    assert "a GPU to reset has no known UUID" in planned["message"]
    assert "the GPU at 0000:18:00.0" in planned["message"]


# --- the repeat window -----------------------------------------------------------------------------------------
def history(gpu_uuid, finished, result="healthy", klass="reset"):
    return {
        "version": 1,
        "current": None,
        "history": [{"class": klass, "gpus": [gpu_uuid], "finished": finished, "result": result}],
    }


@pytest.mark.parametrize(
    ("finished", "window", "klass"),
    [
        ("2026-11-26T10:00:00Z", "24h", "replace"),  # 2 h ago
        ("2026-11-25T11:00:00Z", "24h", "reset"),  # 25 h ago
        ("2026-11-25T11:00:00Z", "1d12h", "replace"),
        ("2026-11-26T11:30:00Z", 1800, "replace"),  # exactly at the window's end
        ("2026-11-26T11:30:00Z", "29m", "reset"),
    ],
)
def test_a_gpu_failing_again_within_the_window_goes_to_replace(finished, window, klass):
    record = history(uuid("gpu-a", 0), finished)
    entry = by_node(plan_of([node("gpu-a", ["reset"], record=record)], repeat_window=window))["gpu-a"]
    assert entry["class"] == klass
    if klass == "replace":
        window_text = f"{window} s" if isinstance(window, int) else window
        assert f"GPU 0 ({uuid('gpu-a', 0)}) failed again within {window_text} of" in entry["message"]
        assert f"of the reset that made it healthy at {finished}" in entry["message"]


def test_only_a_remediation_that_made_the_same_gpu_healthy_counts():
    other_gpu = history(uuid("gpu-a", 3), "2026-11-26T11:00:00Z")
    failed = history(uuid("gpu-a", 0), "2026-11-26T11:00:00Z", result="failed")
    for record in (other_gpu, failed):
        assert by_node(plan_of([node("gpu-a", ["reset"], record=record)]))["gpu-a"]["class"] == "reset"


def test_an_unreadable_record_is_said_and_written_anew():
    entry = by_node(plan_of([node("gpu-a", ["reset"], record="{not json")]))["gpu-a"]
    assert entry["class"] == "reset" and entry["record"] == {}
    assert "its remediation record is not JSON and is written anew" in entry["message"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("24h", 86400), ("90m", 5400), ("1d12h", 129600), ("2w", 1209600), (60, 60), ("45", 45), ("1h30s", 3630)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "h", "1x", "-5", -5, True, "1h30", "30m1h"])
def test_a_bad_window_is_one_sentence(bad):
    with pytest.raises(AnsibleFilterError, match=r"^remediation_plan: gpu_remediation_repeat_window must be seconds"):
        parse_duration(bad)


# --- input ----------------------------------------------------------------------------------------------------
def test_bad_input_is_one_sentence():
    with pytest.raises(AnsibleFilterError, match=r"^remediation_plan: the input must be a list"):
        remediation_plan("gpu-a", [], now=NOW)
    with pytest.raises(AnsibleFilterError, match=r"^remediation_plan: the entry of gpu-a lacks faults\.$"):
        remediation_plan([{"host": "gpu-a", "node": "gpu-a"}], [], now=NOW)
    with pytest.raises(AnsibleFilterError, match=r"^remediation_plan: cluster must be the list of Nodes"):
        remediation_plan([node("gpu-a")], {"items": []}, now=NOW)
    with pytest.raises(
        AnsibleFilterError, match=r"^remediation_plan: now must be an ISO 8601 time, got 'yesterday'\.$"
    ):
        remediation_plan([node("gpu-a")], [], now="yesterday")


def test_two_hosts_naming_one_node_are_refused():
    liar = dict(node("gpu-b", ["reboot"]), host="gpu-a")
    with pytest.raises(
        AnsibleFilterError,
        match=r"^remediation_plan: gpu-a, gpu-b name the same Node gpu-b; each host names its own Node "
        r"\(gpu_remediation_node_name\), and none acts on another's\.$",
    ):
        plan_of([liar, node("gpu-b")])


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"class": "drain-everything"}, "the GPU class 'drain-everything', not one of none, device, reset, reboot"),
        ({"uuid": "GPU-1 --all"}, "the GPU UUID 'GPU-1 --all', not of the shape GPU-... or MIG-..."),
        ({"uuid": "0"}, "the GPU UUID '0', not of the shape"),
        ({"uuid": ["GPU-1"]}, "the GPU UUID \"['GPU-1']\", not of the shape"),
    ],
)
def test_a_node_reporting_outside_the_known_classes_and_uuid_shapes_is_left_untouched(change, why):
    liar = node("gpu-a", ["reboot"])
    liar["faults"]["gpus"][0].update(change)
    plan = plan_of([liar, node("gpu-b", ["reset"])], max_nodes=2)
    mine = by_node(plan)["gpu-a"]
    assert (mine["action"], mine["class"], mine["gpus"]) == ("none", "none", [])
    assert mine["message"].startswith(f"gpu-a: left untouched, its fault report has {why}")
    assert plan["started"] == ["gpu-b"]


def test_a_node_class_outside_the_known_set_is_left_untouched():
    liar = node("gpu-a", ["reboot"])
    liar["faults"]["node_class"] = "everything"
    assert by_node(plan_of([liar]))["gpu-a"]["refused"] == (
        "its fault report has the class 'everything', not one of none, device, reset, reboot, replace"
    )


@pytest.mark.parametrize(
    "uuid_text",
    [
        "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3b",
        "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3b/7/0",
        "MIG-a1b2c3d4-0000-5000-8000-000000000001",
    ],
)
def test_nvml_uuid_shapes_are_acted_on(uuid_text):
    entry = node("gpu-a", ["reset"])
    entry["faults"]["gpus"][0]["uuid"] = uuid_text
    mine = by_node(plan_of([entry]))["gpu-a"]
    assert (mine["action"], mine["class"], [g["uuid"] for g in mine["gpus"]]) == ("remediate", "reset", [uuid_text])


def test_parse_max_nodes_rounds_down():
    assert parse_max_nodes("33%", 10) == (3, "33% of 10 nodes = 3")
    assert parse_max_nodes("1%", 1) == (1, "1% of 1 node = 1")


def test_the_filters_are_registered():
    assert FilterModule().filters()["remediation_plan"] is remediation_plan


# --- the pods a reboot evicts ----------------------------------------------------------------------------------
def pod(name, phase="Running", owner=None, mirror=False, namespace="ml"):
    metadata = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": {}}
    if owner:
        metadata["ownerReferences"] = [{"kind": owner, "name": "x"}]
    if mirror:
        metadata["annotations"]["kubernetes.io/config.mirror"] = "abc"
    return {"metadata": metadata, "status": {"phase": phase}}


def test_a_reboot_evicts_what_a_drain_moves():
    pods = [
        pod("train-1", owner="ReplicaSet"),
        pod("plugin", owner="DaemonSet", namespace="gpuops-system"),
        pod("etcd", mirror=True, namespace="kube-system"),
        pod("done", phase="Succeeded"),
        pod("crashed", phase="Failed"),
        pod("pending", phase="Pending"),
        pod("bare", namespace="default"),
    ]
    assert remediation_pods(pods) == [
        {"namespace": "default", "name": "bare", "uid": "uid-bare"},
        {"namespace": "ml", "name": "pending", "uid": "uid-pending"},
        {"namespace": "ml", "name": "train-1", "uid": "uid-train-1"},
    ]
    with pytest.raises(AnsibleFilterError, match=r"^remediation_pods: the input must be a list of Pods"):
        remediation_pods({"resources": []})
