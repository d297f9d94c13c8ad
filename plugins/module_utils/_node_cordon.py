# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A Node cordoned by the collection and given back (the node_cordon module), private.

The collection's cordon is ``spec.unschedulable`` together with the annotation ``gpuops.k8s/cordoned-by``, a JSON
object that says who cordoned the node, since when and why. Both are written in one JSON merge patch carrying the
resourceVersion they were computed from (``_k8s_nodes.with_precondition``), so a cordon is never recorded as the
collection's when someone else wrote it in between: the write is refused (HTTP 409) and redone from a fresh read.
A node cordoned without the annotation was cordoned by someone else: it is neither annotated nor uncordoned.
"""

from __future__ import annotations

import json

from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import write_node

ANNOTATION = "gpuops.k8s/cordoned-by"


class CordonError(Exception):
    """One sentence saying what went wrong."""


def record(node):
    """The collection's record of its cordon on NODE: a dict, {} for one that is no JSON object, None when absent."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if raw is None:
        return None
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def view(node):
    """What the module shows of a Node: the cordon and the record of who made it."""
    return {"unschedulable": bool((node.get("spec") or {}).get("unschedulable")), "cordoned_by": record(node)}


def cordon_patch(node, state, by="", reason="", now=""):
    """The JSON merge patch that brings NODE to STATE; {} when it is there already or the cordon is not ours.

    present: a schedulable node is cordoned and the record written with it; a node cordoned with the record stays as
    it is; a node cordoned without it (someone else's cordon) is left alone. absent: where the record is, it is
    removed and the node uncordoned; a cordon without the record stays."""
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    ours = record(node)
    if state == "present":
        if cordoned:
            return {}
        text = json.dumps({"by": by, "since": now, "reason": reason}, sort_keys=True)
        return {"spec": {"unschedulable": True}, "metadata": {"annotations": {ANNOTATION: text}}}
    if state != "absent":
        raise CordonError(f"node_cordon: state must be present or absent, got {state!r}.")
    if ours is None:
        return {}
    patch = {"metadata": {"annotations": {ANNOTATION: None}}}
    if cordoned:
        patch["spec"] = {"unschedulable": False}
    return patch


def set_cordon(api, name, state, by="", reason="", now="", check_mode=False, retries=5):
    """Bring the Node to STATE; returns (the patch written or {}, the node before, the node after, conflicts).

    api: read_node(name) -> node dict or None; patch_node(name, merge_patch) -> node dict, raising Conflict on 409.
    """

    def decide(node):
        return cordon_patch(node, state, by, reason, now), None

    _answer, patch, before, after, conflicts = write_node(
        api, name, decide, CordonError, "node_cordon", check_mode=check_mode, retries=retries
    )
    return patch, before, after, conflicts
