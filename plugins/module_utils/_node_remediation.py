# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A Node put under GPU remediation and given back (the node_remediation module), private.

Under remediation a Node is cordoned (spec.unschedulable), carries the taint ``nvidia.com/gpu-remediation=<class>``
(NoSchedule) and the annotation ``gpuops.k8s/gpu-remediation``, a JSON object that says since when, for which
GPUs and why, and whether the node was cordoned before (then it stays cordoned when it is given back). The three
are written with one JSON merge patch carrying the resourceVersion they were computed from, so that a taint or a
cordon someone else writes in between is never lost: the write is refused (HTTP 409) and redone from a fresh read.
"""

from __future__ import annotations

import json

from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import Conflict, with_precondition

TAINT_KEY = "nvidia.com/gpu-remediation"
ANNOTATION = "gpuops.k8s/gpu-remediation"
CLASSES = ("reset", "reboot", "replace")


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


def remediation_patch(node, state, klass=None, gpus=None, reason="", now="", taint_key=TAINT_KEY):
    """The JSON merge patch that puts the Node under remediation (state present) or gives it back (absent);
    {} when it is there already.

    present: cordoned, the taint with value ``klass`` (another value is replaced: a class rises), the annotation.
    The annotation of an ongoing remediation of the same class keeps its time, reason and cordon, and gains the
    GPUs it did not list. absent: the taint and the annotation removed, and the cordon lifted unless the annotation
    says the node was cordoned before (or there is no annotation to say who cordoned it)."""
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
        if wanted != annotation:
            patch["metadata"] = {"annotations": {ANNOTATION: json.dumps(wanted, sort_keys=True)}}
        return patch
    if state != "absent":
        raise RemediationError(f"node_remediation: state must be present or absent, got {state!r}.")
    if ours:
        patch["spec"] = {"taints": others}
    if annotation is not None:
        patch["metadata"] = {"annotations": {ANNOTATION: None}}
    if cordoned and annotation is not None and not annotation.get("cordoned_before"):
        patch.setdefault("spec", {})["unschedulable"] = False
    return patch


def apply_patch(node, patch):
    """The Node after a merge patch of the three fields this module writes (check mode's view)."""
    after = json.loads(json.dumps(node))
    spec = after.setdefault("spec", {})
    for key, value in (patch.get("spec") or {}).items():
        spec[key] = value
    annotations = after.setdefault("metadata", {}).setdefault("annotations", {}) or {}
    for key, value in ((patch.get("metadata") or {}).get("annotations") or {}).items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    after["metadata"]["annotations"] = annotations
    return after


def set_remediation(api, name, state, klass=None, gpus=None, reason="", now="", check_mode=False, retries=5):
    """Bring the Node to ``state``; returns (the patch written or {} , the node before, the node after, conflicts).

    api: read_node(name) -> node dict or None; patch_node(name, merge_patch) -> node dict, raising Conflict on 409.
    """
    node = api.read_node(name)
    if node is None:
        raise RemediationError(f"node_remediation: the API server has no Node {name}.")
    conflicts = 0
    for _attempt in range(retries + 1):
        patch = remediation_patch(node, state, klass, gpus, reason, now)
        if not patch:
            return {}, node, node, conflicts
        if check_mode:
            return patch, node, apply_patch(node, patch), conflicts
        try:
            return patch, node, api.patch_node(name, with_precondition(patch, node)), conflicts
        except Conflict:
            conflicts += 1
            node = api.read_node(name)
            if node is None:
                raise RemediationError(f"node_remediation: the Node {name} went away while it was written.") from None
    raise RemediationError(
        f"node_remediation: the Node {name} changed between every read and write ({retries + 1} tries); "
        "something else is writing it all the time."
    )
