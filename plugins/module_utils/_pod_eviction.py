# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the module gpuops.k8s.pod_eviction decides, apart from the API calls (private).

``evict_pods`` reads each pod, leaves DaemonSet and static (mirror) pods where they are, as ``kubectl drain``
does (their controller or kubelet puts them straight back, so an eviction frees nothing), evicts the others that
exist (retrying those a PodDisruptionBudget refuses or a conflict stops), then waits until each evicted pod is
gone or replaced by a pod of the same name with another UID. The API is any object with
``read_pod(namespace, name)`` -> ``(uid, being_deleted, kept)`` or None, kept being None, 'DaemonSet' or
'mirror', and ``evict(namespace, name, uid, grace_period)`` -> ``(outcome, reason, retry_after)``, outcome one
of 'evicted', 'gone', 'refused' and 'conflict' (HTTP 409: the UID precondition failed, or the API server gave up
on a conflicting write; the pod is read again to tell which); the clock and the sleep are given too, so that the
decisions can be tested without an API server or real time. Errors are EvictionError with one sentence."""

from __future__ import annotations

# Seconds between two evictions of a pod a disruption budget refused, when the API server asks for no other
# wait (Retry-After), and the bounds of the wait it may ask for.
RETRY_SECONDS = 5.0
RETRY_MIN_SECONDS = 1.0
RETRY_MAX_SECONDS = 10.0
# Seconds between two reads of the pods being deleted.
POLL_SECONDS = 1.0


class EvictionError(Exception):
    """A pod cannot be evicted, or is not gone in time; the message is one sentence."""


def _ref(pod):
    return f"{pod['namespace']}/{pod['name']}"


def _find(api, pods, result):
    """The pods to evict and those to wait for, from one read of each requested pod."""
    to_evict = []
    seen = set()
    for pod in pods:
        if _ref(pod) in seen:
            continue
        seen.add(_ref(pod))
        ref = {"namespace": pod["namespace"], "name": pod["name"]}
        found = api.read_pod(pod["namespace"], pod["name"])
        if found is None or (pod.get("uid") and found[0] != pod["uid"]):
            result["already_gone"].append(ref)
            continue
        uid, being_deleted, kept = found
        if kept is not None:
            result["kept"].append(dict(ref, uid=uid, reason=kept))
            continue
        (result["terminating"] if being_deleted else to_evict).append(dict(ref, uid=uid))
    return to_evict


def _evict(api, pending, result, timeout, grace_period, clock, sleep, deadline):
    reasons = {}
    while pending:
        waits = []
        for pod in list(pending):
            outcome, reason, retry_after = api.evict(pod["namespace"], pod["name"], pod["uid"], grace_period)
            if outcome == "refused":
                result["refused"][_ref(pod)] = result["refused"].get(_ref(pod), 0) + 1
                reasons[_ref(pod)] = reason
                waits.append(RETRY_SECONDS if retry_after is None else retry_after)
                continue
            if outcome == "conflict" and _still_there(api, pod):
                # Not a UID mismatch: the very pod is still there, so it is asked again.
                reasons[_ref(pod)] = reason
                waits.append(RETRY_MIN_SECONDS)
                continue
            pending.remove(pod)
            if outcome == "evicted":
                result["evicted"].append(pod)
            else:
                result["already_gone"].append({"namespace": pod["namespace"], "name": pod["name"]})
        if not pending:
            return
        remaining = deadline - clock()
        if remaining <= 0:
            refused = "; ".join(f"{_ref(p)} ({reasons[_ref(p)].rstrip('.')})" for p in pending)
            raise EvictionError(f"within {timeout} s the API server still refused to evict {refused}.")
        sleep(min(max(RETRY_MIN_SECONDS, min(max(waits), RETRY_MAX_SECONDS)), remaining))


def _still_there(api, pod):
    """Whether the very pod (same UID) still exists; a pod of the same name with another UID replaced it."""
    found = api.read_pod(pod["namespace"], pod["name"])
    return found is not None and found[0] == pod["uid"]


def _wait_gone(api, waiting, timeout, clock, sleep, deadline):
    while waiting:
        waiting = [p for p in waiting if _still_there(api, p)]
        if not waiting:
            return
        remaining = deadline - clock()
        if remaining <= 0:
            names = ", ".join(_ref(p) for p in waiting)
            raise EvictionError(
                f"{names} still {'exists' if len(waiting) == 1 else 'exist'} {timeout} s after the eviction"
                " (the kubelet has not finished stopping the containers, or the node is unreachable)."
            )
        sleep(min(POLL_SECONDS, remaining))


def evict_pods(api, pods, result, timeout, grace_period, check_mode, clock, sleep):
    """Fill ``result`` (lists evicted, already_gone, terminating, kept and dict refused) as the pods go; in check
    mode, ``evicted`` lists the pods that would be evicted and nothing is written or waited for."""
    deadline = clock() + timeout
    to_evict = _find(api, pods, result)
    if check_mode:
        result["evicted"].extend(to_evict)
        return
    _evict(api, list(to_evict), result, timeout, grace_period, clock, sleep, deadline)
    _wait_gone(api, result["evicted"] + result["terminating"], timeout, clock, sleep, deadline)
