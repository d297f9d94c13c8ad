"""Unit tests of the eviction decisions in module_utils/_pod_eviction.py.

PodStoreDouble is a test double of the API server's pods and their eviction subresource: it answers reads
(with the owner kind that keeps a DaemonSet or mirror pod in place), refuses evictions a budget holds (HTTP 429,
with a Retry-After when told), answers 409 where the UID precondition fails or where told to (a conflict the API
server gave up on), deletes or starts deleting an evicted pod, and lets a test play the kubelet between two reads.
The clock is a counter the sleeps advance, so no test waits. The real API server is exercised in
tests/integration/test_pod_eviction_api.py.
"""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._pod_eviction import (
    RETRY_MAX_SECONDS,
    RETRY_MIN_SECONDS,
    RETRY_SECONDS,
    EvictionError,
    evict_pods,
)

BUDGET = "Cannot evict pod as it would violate the pod's disruption budget."
CONFLICT = "Operation cannot be fulfilled on pods: the object has been modified."


class PodStoreDouble:
    def __init__(self):
        self.pods = {}  # "ns/name" -> {"uid", "deleting"}
        self.refusals = {}  # "ns/name" -> how many more evictions to refuse
        self.conflicts = {}  # "ns/name" -> how many more evictions to answer with a conflict (HTTP 409)
        self.retry_after = None
        self.graceful = False  # an evicted pod stays, being deleted, until finish() (a kubelet's part)
        self.on_read = None
        self.now = 0.0
        self.sleeps = []
        self.evictions = []

    def add(self, name, uid, deleting=False, kept=None):
        self.pods[f"ml/{name}"] = {"uid": uid, "deleting": deleting, "kept": kept}

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds

    def read_pod(self, namespace, name):
        if self.on_read is not None:
            self.on_read(f"{namespace}/{name}")
        pod = self.pods.get(f"{namespace}/{name}")
        return None if pod is None else (pod["uid"], pod["deleting"], pod.get("kept"))

    def evict(self, namespace, name, uid, grace_period):
        key = f"{namespace}/{name}"
        self.evictions.append((key, uid, grace_period))
        pod = self.pods.get(key)
        if pod is None:
            return "gone", "not found", None
        if pod["uid"] != uid:
            return "conflict", "Precondition failed: UID in precondition differs.", None
        if self.conflicts.get(key, 0) > 0:
            self.conflicts[key] -= 1
            return "conflict", CONFLICT, None
        if self.refusals.get(key, 0) > 0:
            self.refusals[key] -= 1
            return "refused", BUDGET, self.retry_after
        if self.graceful and grace_period != 0:
            pod["deleting"] = True
        else:
            del self.pods[key]
        return "evicted", "", None


def run(store, pods, timeout=300, grace_period=None, check_mode=False):
    result = {"evicted": [], "already_gone": [], "terminating": [], "kept": [], "refused": {}}
    evict_pods(store, pods, result, timeout, grace_period, check_mode, store.clock, store.sleep)
    return result


def ref(name, uid=None):
    return {"namespace": "ml", "name": name} if uid is None else {"namespace": "ml", "name": name, "uid": uid}


def test_check_mode_reads_and_evicts_nothing():
    store = PodStoreDouble()
    store.add("a", "u-a")
    store.add("b", "u-b", deleting=True)
    result = run(store, [ref("a"), ref("b"), ref("c")], check_mode=True)
    assert result == {
        "evicted": [ref("a", "u-a")],
        "already_gone": [ref("c")],
        "terminating": [ref("b", "u-b")],
        "kept": [],
        "refused": {},
    }
    assert store.evictions == [] and store.sleeps == [] and "ml/a" in store.pods


def test_pods_are_evicted_once_each_with_their_uid_and_the_grace_period():
    store = PodStoreDouble()
    store.add("a", "u-a")
    result = run(store, [ref("a"), ref("a")], grace_period=0)
    assert result["evicted"] == [ref("a", "u-a")]
    assert store.evictions == [("ml/a", "u-a", 0)] and store.pods == {}


def test_a_pod_under_another_uid_is_already_gone_and_left_alone():
    store = PodStoreDouble()
    store.add("a", "u-new")
    result = run(store, [ref("a", "u-old")])
    assert (result["evicted"], result["already_gone"]) == ([], [ref("a")])
    assert store.evictions == [] and store.pods["ml/a"]["uid"] == "u-new"


def test_a_refused_eviction_is_asked_again_while_the_others_go():
    store = PodStoreDouble()
    store.add("held", "u-h")
    store.add("free", "u-f")
    store.refusals["ml/held"] = 2
    result = run(store, [ref("held"), ref("free")])
    assert result["evicted"] == [ref("free", "u-f"), ref("held", "u-h")]
    assert result["refused"] == {"ml/held": 2}
    assert [key for key, _uid, _grace in store.evictions] == ["ml/held", "ml/free", "ml/held", "ml/held"]
    assert store.sleeps == [RETRY_SECONDS, RETRY_SECONDS]


@pytest.mark.parametrize(
    ("retry_after", "slept"), [(0.0, RETRY_MIN_SECONDS), (3.0, 3.0), (60.0, RETRY_MAX_SECONDS)], ids=str
)
def test_the_wait_between_evictions_follows_retry_after_within_bounds(retry_after, slept):
    store = PodStoreDouble()
    store.add("held", "u-h")
    store.refusals["ml/held"] = 1
    store.retry_after = retry_after
    run(store, [ref("held")])
    assert store.sleeps == [slept]


def test_a_budget_that_never_allows_it_fails_at_the_timeout_naming_the_pod_and_the_reason():
    store = PodStoreDouble()
    store.add("held", "u-h")
    store.refusals["ml/held"] = 1000
    with pytest.raises(EvictionError) as caught:
        run(store, [ref("held")], timeout=12)
    assert str(caught.value) == (f"within 12 s the API server still refused to evict ml/held ({BUDGET.rstrip('.')}).")
    assert sum(store.sleeps) == 12 and store.sleeps[-1] == 2  # the last wait ends at the deadline


def test_an_evicted_pod_is_waited_for_until_the_kubelet_deletes_it():
    store = PodStoreDouble()
    store.graceful = True
    store.add("a", "u-a")
    reads = []

    def kubelet(key):
        reads.append(key)
        if len(reads) == 4:  # the first read, then three while it terminates
            del store.pods[key]

    store.on_read = kubelet
    result = run(store, [ref("a")])
    assert result["evicted"] == [ref("a", "u-a")]
    assert len(reads) == 4 and store.sleeps == [1.0, 1.0]


def test_a_pod_replaced_under_its_name_while_waited_for_counts_as_gone():
    store = PodStoreDouble()
    store.graceful = True
    store.add("a", "u-a")

    def statefulset(key):
        if store.pods[key]["deleting"]:
            store.pods[key] = {"uid": "u-a2", "deleting": False}

    store.on_read = statefulset
    result = run(store, [ref("a")])
    assert result["evicted"] == [ref("a", "u-a")] and store.pods["ml/a"]["uid"] == "u-a2"


def test_a_terminating_pod_is_waited_for_and_not_evicted_again():
    store = PodStoreDouble()
    store.add("a", "u-a", deleting=True)
    store.on_read = lambda key: store.sleeps and store.pods.pop(key, None)
    result = run(store, [ref("a")])
    assert (result["evicted"], result["terminating"]) == ([], [ref("a", "u-a")])
    assert store.evictions == []


def test_a_pod_not_gone_at_the_timeout_fails_naming_it():
    store = PodStoreDouble()
    store.graceful = True
    store.add("a", "u-a")
    store.add("b", "u-b")
    with pytest.raises(EvictionError) as caught:
        run(store, [ref("a"), ref("b")], timeout=3)
    assert str(caught.value) == (
        "ml/a, ml/b still exist 3 s after the eviction (the kubelet has not finished stopping the containers,"
        " or the node is unreachable)."
    )


def test_a_pod_that_vanishes_before_its_eviction_is_already_gone():
    store = PodStoreDouble()
    store.add("a", "u-a")
    original = store.evict

    def vanish_first(namespace, name, uid, grace_period):
        store.pods.pop(f"{namespace}/{name}", None)
        return original(namespace, name, uid, grace_period)

    store.evict = vanish_first
    result = run(store, [ref("a")])
    assert (result["evicted"], result["already_gone"]) == ([], [ref("a")])


@pytest.mark.parametrize("kind", ["DaemonSet", "mirror"])
def test_daemonset_and_mirror_pods_are_kept_and_listed_not_evicted(kind):
    store = PodStoreDouble()
    store.add("held", "u-h", kept=kind)
    store.add("a", "u-a")
    result = run(store, [ref("held"), ref("a")])
    assert result["kept"] == [dict(ref("held", "u-h"), reason=kind)]
    assert (result["evicted"], result["already_gone"]) == ([ref("a", "u-a")], [])
    assert [key for key, _uid, _grace in store.evictions] == ["ml/a"] and "ml/held" in store.pods


def test_a_conflict_on_the_very_pod_is_asked_again_not_taken_as_gone():
    store = PodStoreDouble()
    store.add("a", "u-a")
    store.conflicts["ml/a"] = 2
    result = run(store, [ref("a")])
    assert (result["evicted"], result["already_gone"]) == ([ref("a", "u-a")], [])
    assert len(store.evictions) == 3 and store.pods == {}


def test_a_conflict_that_lasts_fails_at_the_timeout_naming_the_pod():
    store = PodStoreDouble()
    store.add("a", "u-a")
    store.conflicts["ml/a"] = 1000
    with pytest.raises(EvictionError) as caught:
        run(store, [ref("a")], timeout=5)
    assert str(caught.value) == f"within 5 s the API server still refused to evict ml/a ({CONFLICT.rstrip('.')})."
    assert "ml/a" in store.pods


def test_a_conflict_because_another_pod_has_the_name_now_is_already_gone():
    store = PodStoreDouble()
    store.add("a", "u-a")
    original = store.evict

    def replaced_first(namespace, name, uid, grace_period):
        store.pods[f"{namespace}/{name}"] = {"uid": "u-a2", "deleting": False}
        return original(namespace, name, uid, grace_period)

    store.evict = replaced_first
    result = run(store, [ref("a")])
    assert (result["evicted"], result["already_gone"]) == ([], [ref("a")])
