# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A Node put under GPU remediation and given back (the node_remediation module), private.

Under remediation a Node is cordoned (spec.unschedulable), carries the taint ``nvidia.com/gpu-remediation=<class>``
(NoSchedule) and the annotation ``gpuops.k8s/gpu-remediation``, a JSON object that says since when, for which
GPUs and why, and whether the node was cordoned before (then it stays cordoned when it is given back). The three
are written with one JSON merge patch carrying the resourceVersion they were computed from, so that a taint or a
cordon someone else writes in between is never lost: the write is refused (HTTP 409) and redone from a fresh read.

The circuit breaker is enforced here, where the taint is written (``claim``): a ``coordination.k8s.io/v1`` Lease
is taken (holder: the run's identity, with an expiry, so a killed run blocks the others for at most its duration),
the Nodes carrying the taint are counted from the API server while it is held, the taint is written or not, and the
Lease is given up. A run that finds, when giving it up, that it held it past its expiry (another run took it) counts
again and backs its own taint out if the limit is exceeded.

A run holds its Node: the annotation names the run (``run``) and until when it holds the Node (``held_until``), renewed
at each step; another run leaves the Node alone until then. Giving the Node back removes the taint only when its value
is the class the remediation wrote (a taint someone raised stays, the annotation with it) and lifts the cordon only
when the remediation made it: the node was not cordoned before, and the API server's managedFields say the field was
last set by this module's field manager (a cordon someone set again meanwhile stays).
"""

from __future__ import annotations

import datetime
import json
import time

from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import (
    MERGE_PATCH,
    Conflict,
    NodeApi,
    apply_patch,
    dynamic_client,
    write_node,
)

TAINT_KEY = "nvidia.com/gpu-remediation"
ANNOTATION = "gpuops.k8s/gpu-remediation"
CLASSES = ("reset", "reboot", "replace")
_RANK = {name: rank for rank, name in enumerate(CLASSES)}
# The field manager of every Node write of this module: the cordon it made is the one whose managedFields name it.
FIELD_MANAGER = "gpuops.k8s-node-remediation"
LEASE_NAME = "gpuops-k8s-gpu-remediation"
LEASE_NAMESPACE = "kube-system"


class RemediationError(Exception):
    """One sentence saying what went wrong."""


def _annotation(node):
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def view(node, taint_key=TAINT_KEY):
    """What the module shows of a Node (its diff): the cordon, the remediation taint and the annotation."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == taint_key]
    return {
        "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
        "taint": {k: taints[0].get(k) for k in ("key", "value", "effect")} if taints else None,
        "annotation": _annotation(node),
    }


def parse_time(text):
    """An ISO 8601 time -> an aware datetime in UTC; None when it is not one."""
    if not isinstance(text, str) or not text.strip():
        return None
    raw = text.strip()
    if raw.endswith("Z"):
        raw = raw[:-1] + "+00:00"
    try:
        moment = datetime.datetime.fromisoformat(raw)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.astimezone(datetime.timezone.utc)


def iso(moment):
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def holder(node, moment, run_id=""):
    """(run, until) of another run that holds the Node at ``moment``; None when no run but ``run_id`` holds it."""
    annotation = _annotation(node) or {}
    run, until = annotation.get("run"), parse_time(annotation.get("held_until"))
    if not run or run == run_id or until is None or moment is None or until <= moment:
        return None
    return run, annotation.get("held_until")


def cordon_is_ours(node):
    """Whether the cordon was last set by this module: the managedFields entry that owns spec.unschedulable is
    FIELD_MANAGER's. A Node without managedFields (an API server that does not keep them) counts as ours."""
    entries = (node.get("metadata") or {}).get("managedFields")
    if not entries:
        return True
    for entry in entries:
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:unschedulable" in fields:
            return entry.get("manager") == FIELD_MANAGER
    return False


def _rank(name):
    return _RANK.get(name, len(CLASSES))


def remediation_patch(
    node, state, klass=None, gpus=None, reason="", now="", taint_key=TAINT_KEY, run_id="", held_until=""
):
    """The JSON merge patch that puts the Node under remediation (state present) or gives it back (absent);
    {} when it is there already.

    present: cordoned, the taint with value ``klass`` (another value is replaced: a class rises), the annotation.
    The annotation of an ongoing remediation of the same class keeps its time, reason and cordon, and gains the
    GPUs it did not list; with ``run_id`` it names the run and ``held_until`` (empty: the run lets go of the Node).
    absent: ``klass`` is the class this remediation wrote (None: the annotation's). The taint is removed only when
    its value is that class, and the annotation with it; a taint someone changed stays, with the annotation (less
    the run's hold). The cordon is lifted only when the annotation says the node was not cordoned before and the
    cordon is this module's (cordon_is_ours)."""
    spec = node.get("spec") or {}
    taints = [dict(t) for t in spec.get("taints") or []]
    ours = [t for t in taints if t.get("key") == taint_key]
    others = [t for t in taints if t.get("key") != taint_key]
    annotation = _annotation(node)
    cordoned = bool(spec.get("unschedulable"))
    patch = {}
    if state == "present":
        if klass not in CLASSES:
            raise RemediationError(f"node_remediation: class must be one of {', '.join(CLASSES)}, got {klass!r}.")
        wanted_taint = {"key": taint_key, "value": klass, "effect": "NoSchedule"}
        if len(ours) != 1 or {k: ours[0].get(k) for k in ("key", "value", "effect")} != wanted_taint:
            position = next((i for i, t in enumerate(taints) if t.get("key") == taint_key), len(others))
            new = list(others)
            new.insert(min(position, len(new)), wanted_taint)
            patch["spec"] = {"taints": new}
        if not cordoned:
            patch.setdefault("spec", {})["unschedulable"] = True
        gpus = sorted({str(g) for g in gpus or []})
        if annotation and annotation.get("class") == klass:
            wanted = dict(annotation)
            wanted["gpus"] = sorted(set(annotation.get("gpus") or []) | set(gpus))
        else:
            before = annotation.get("cordoned_before") if annotation else None
            wanted = {
                "class": klass,
                "since": now,
                "gpus": gpus,
                "reason": reason,
                "cordoned_before": bool(before) if before is not None else cordoned,
            }
            if annotation and annotation.get("class"):
                wanted["previous_class"] = annotation["class"]
        if run_id:
            wanted["run"] = run_id
            if held_until:
                wanted["held_until"] = held_until
            else:
                wanted.pop("held_until", None)
        if wanted != annotation:
            patch["metadata"] = {"annotations": {ANNOTATION: json.dumps(wanted, sort_keys=True)}}
        return patch
    if state != "absent":
        raise RemediationError(f"node_remediation: state must be present or absent, got {state!r}.")
    written = klass if klass is not None else (annotation or {}).get("class")
    if ours and written and any(t.get("value") != written for t in ours):
        # Someone changed the taint (a person raised it to replace): it stays, and so do the annotation and the cordon.
        if annotation and run_id and annotation.get("run") == run_id and "held_until" in annotation:
            kept = {k: v for k, v in annotation.items() if k != "held_until"}
            patch["metadata"] = {"annotations": {ANNOTATION: json.dumps(kept, sort_keys=True)}}
        return patch
    if ours:
        patch["spec"] = {"taints": others}
    if annotation is not None:
        patch["metadata"] = {"annotations": {ANNOTATION: None}}
    if cordoned and annotation is not None and not annotation.get("cordoned_before") and cordon_is_ours(node):
        patch.setdefault("spec", {})["unschedulable"] = False
    return patch


def taint_value(node, taint_key=TAINT_KEY):
    for taint in (node.get("spec") or {}).get("taints") or []:
        if isinstance(taint, dict) and taint.get("key") == taint_key:
            return taint.get("value") or ""
    return None


def write(
    api,
    name,
    state,
    klass=None,
    gpus=None,
    reason="",
    now="",
    check_mode=False,
    retries=5,
    run_id="",
    held_until="",
    moment=None,
):
    """Bring the Node to ``state`` unless another run holds it, or (present) its taint is of a higher class than
    ``klass``. Returns a dict: decision (written, held, raised, kept), message, patch, before, after, conflicts.

    api: read_node(name) -> node dict or None; patch_node(name, merge_patch) -> node dict, raising Conflict on 409.
    """

    def decide(node):
        held = holder(node, moment, run_id)
        if held:
            return {}, ("held", f"{name} is under the remediation of run {held[0]} until {held[1]} and is left to it.")
        value = taint_value(node)
        if state == "present" and value is not None and _rank(value) > _rank(klass):
            return {}, (
                "raised",
                f"{name} carries the taint {TAINT_KEY}={value}, above the {klass} asked for, and keeps it.",
            )
        patch = remediation_patch(node, state, klass, gpus, reason, now, run_id=run_id, held_until=held_until)
        if state == "absent" and value is not None and taint_value(apply_patch(node, patch)) is not None:
            return patch, (
                "kept",
                f"{name} carries the taint {TAINT_KEY}={value}, not the {klass or 'class'} this remediation set: "
                "the taint, the annotation and the cordon stay.",
            )
        return patch, ("written", "")

    (decision, message), patch, before, after, conflicts = write_node(
        api, name, decide, RemediationError, "node_remediation", check_mode=check_mode, retries=retries
    )
    return {
        "decision": decision,
        "message": message,
        "patch": patch,
        "before": before,
        "after": after,
        "conflicts": conflicts,
    }


def set_remediation(api, name, state, klass=None, gpus=None, reason="", now="", check_mode=False, retries=5):
    """Bring the Node to ``state``; returns (the patch written or {} , the node before, the node after, conflicts)."""
    result = write(api, name, state, klass, gpus, reason, now, check_mode, retries)
    return result["patch"], result["before"], result["after"], result["conflicts"]


def under_remediation(nodes, taint_key=TAINT_KEY):
    """{name: taint value} of the Nodes carrying the taint."""
    found = {}
    for node in nodes:
        value = taint_value(node, taint_key)
        if value is not None:
            found[(node.get("metadata") or {}).get("name")] = value
    return found


def _micro(moment):
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_expiry(lease):
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime") or spec.get("acquireTime"))
    if renewed is None:
        return None
    return renewed + datetime.timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))


def acquire_lease(api, run_id, seconds, wait, clock=None, sleep=time.sleep):
    """Take the breaker's Lease for ``run_id``: created where there is none, taken where it is free or expired
    (renewTime + leaseDurationSeconds past, by this host's clock), each write guarded by the resourceVersion read.
    Waits up to ``wait`` seconds for a holder to give it up; returns the Lease as written."""
    clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
    give_up = time.monotonic() + wait
    while True:
        moment = clock()
        lease = api.read_lease()
        spec = (lease or {}).get("spec") or {}
        held_by = spec.get("holderIdentity")
        expiry = lease_expiry(lease) if lease else None
        if lease is None or not held_by or held_by == run_id or expiry is None or expiry <= moment:
            transitions = int(spec.get("leaseTransitions") or 0) + (1 if held_by and held_by != run_id else 0)
            body = {
                "holderIdentity": run_id,
                "leaseDurationSeconds": int(seconds),
                "acquireTime": _micro(moment),
                "renewTime": _micro(moment),
                "leaseTransitions": transitions,
            }
            try:
                return api.write_lease(lease, body)
            except Conflict:
                continue
        if time.monotonic() >= give_up:
            raise RemediationError(
                f"node_remediation: the Lease {api.lease_where} is held by {held_by} until {iso(expiry)}, "
                f"longer than {wait} s; no Node was tainted. Run again."
            )
        sleep(0.2)


def release_lease(api, lease):
    """Give the Lease up; False when it is no longer this run's (it expired and another run took it)."""
    body = dict((lease.get("spec") or {}), holderIdentity=None)
    try:
        api.write_lease(lease, body)
    except Conflict:
        return False
    return True


def claim(
    api,
    name,
    klass,
    limit,
    gpus=None,
    reason="",
    now="",
    check_mode=False,
    retries=5,
    run_id="",
    held_until="",
    moment=None,
    lease_seconds=30,
    lease_wait=60,
):
    """Put the Node under remediation within the circuit breaker: at most ``limit`` Nodes carry the taint.

    A Node that carries the taint already continues (no new slot). Otherwise, holding the Lease, the Nodes carrying
    the taint are counted from the API server: the Node is tainted if fewer than ``limit`` do, and left untouched
    (decision waiting) if not. Check mode counts without the Lease and writes nothing."""
    node = api.read_node(name)
    if node is None:
        raise RemediationError(f"node_remediation: the API server has no Node {name}.")
    common = dict(gpus=gpus, reason=reason, now=now, retries=retries, run_id=run_id, held_until=held_until)
    if taint_value(node) is not None:
        return write(api, name, "present", klass, check_mode=check_mode, moment=moment, **common)
    lease = None if check_mode else acquire_lease(api, run_id or name, lease_seconds, lease_wait)
    try:
        taken = {n: v for n, v in under_remediation(api.list_nodes()).items() if n != name}
        if len(taken) >= limit:
            holders = ", ".join(f"{n} ({v})" for n, v in sorted(taken.items())) or "none"
            return {
                "decision": "waiting",
                "message": (
                    f"{name} waits: {len(taken)} of {limit} remediation slot(s) are taken ({holders}), counted from "
                    "the API server under the breaker's Lease. The node is left untouched."
                ),
                "before": node,
                "after": node,
                "patch": {},
                "conflicts": 0,
                "counted": len(taken),
            }
        result = write(api, name, "present", klass, check_mode=check_mode, moment=moment, **common)
        result["counted"] = len(taken)
    finally:
        kept = release_lease(api, lease) if lease is not None else True
    if not kept and result["decision"] == "written" and result["patch"]:
        # The Lease expired while it was held and another run took it: count again, and back out past the limit.
        taken = under_remediation(api.list_nodes())
        if len(taken) > limit:
            back = write(api, name, "absent", klass, retries=retries, run_id=run_id, moment=moment)
            return dict(
                back,
                decision="waiting",
                counted=len(taken) - 1,
                message=(
                    f"{name} waits: its taint was backed out, as the breaker's Lease expired while it was held and "
                    f"{len(taken)} Nodes carried the taint, more than {limit}."
                ),
            )
    return result


class RemediationApi(NodeApi):
    """NodeApi whose writes name FIELD_MANAGER, and the breaker's Lease (read, created or replaced)."""

    def __init__(self, api_client, lease_name=LEASE_NAME, lease_namespace=LEASE_NAMESPACE):
        client, self._conflict_error, self._not_found_error = dynamic_client(api_client)
        self._nodes = client.resources.get(api_version="v1", kind="Node")
        self._leases = client.resources.get(api_version="coordination.k8s.io/v1", kind="Lease")
        self.lease_name, self.lease_namespace = lease_name, lease_namespace
        self.lease_where = f"{lease_namespace}/{lease_name}"

    def patch_node(self, name, patch):
        try:
            return self._nodes.patch(
                name=name, body=patch, content_type=MERGE_PATCH, field_manager=FIELD_MANAGER
            ).to_dict()
        except self._conflict_error:
            raise Conflict(name) from None

    def read_lease(self):
        try:
            return self._leases.get(name=self.lease_name, namespace=self.lease_namespace).to_dict()
        except self._not_found_error:
            return None

    def write_lease(self, lease, spec):
        """Create the Lease (lease None) or replace it, guarded by the resourceVersion it was read at."""
        metadata = {"name": self.lease_name, "namespace": self.lease_namespace}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
        try:
            if lease is None:
                return self._leases.create(body=body, namespace=self.lease_namespace).to_dict()
            metadata["resourceVersion"] = lease["metadata"]["resourceVersion"]
            return self._leases.replace(body=body, namespace=self.lease_namespace).to_dict()
        except self._conflict_error:
            raise Conflict(self.lease_where) from None
