# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: node_label_patch
short_description: The one merge patch that brings a Node's labels and GPU taint to the wanted state
version_added: 0.1.0
description:
  - Compares a Node object (as M(kubernetes.core.k8s_info) returns it) with the labels the collection wants on it
    and returns a JSON merge patch that sets changed labels, removes the labels the collection applied earlier and
    no longer wants, and adds or removes the GPU taint. It returns an empty dict when the node is already right,
    so the caller writes to the API only on change.
  - Ownership is recorded on the node in two annotations, C(gpuops.k8s/owned-labels) (the comma-separated label
    keys the collection applied) and C(gpuops.k8s/owned-taint) (the taint it applied). Labels and taints that
    someone else set are never removed.
options:
  _input:
    description: The Node object (a dict with C(metadata) and C(spec)).
    type: dict
    required: true
  labels:
    description: The labels the collection wants on the node (for example from P(gpuops.k8s.gpu_labels#filter)).
    type: dict
    required: true
  taint:
    description: Whether the node should carry the GPU taint.
    type: bool
    default: true
  taint_key:
    description: Key of the GPU taint.
    type: str
    default: nvidia.com/gpu
  taint_value:
    description: Value of the GPU taint.
    type: str
    default: present
  taint_effect:
    description: Effect of the GPU taint.
    type: str
    default: NoSchedule
"""

EXAMPLES = r"""
- name: Compute the patch for this node
  ansible.builtin.set_fact:
    node_patch: "{{ node_info.resources[0] | gpuops.k8s.node_label_patch(wanted_labels, taint=true) }}"
"""

RETURN = r"""
_value:
  description: A JSON merge patch for the Node (labels set to null are removed), or an empty dict when nothing changes.
  type: dict
"""

from ansible.errors import AnsibleFilterError

OWNED_LABELS_ANNOTATION = "gpuops.k8s/owned-labels"
OWNED_TAINT_ANNOTATION = "gpuops.k8s/owned-taint"


def _taint_id(key, value, effect):
    return f"{key}={value}:{effect}"


def node_label_patch(
    node, labels, taint=True, taint_key="nvidia.com/gpu", taint_value="present", taint_effect="NoSchedule"
):
    if not isinstance(node, dict) or not isinstance(node.get("metadata"), dict):
        raise AnsibleFilterError(
            f"node_label_patch: the input must be a Node object with metadata, got {type(node).__name__}."
        )
    if not isinstance(labels, dict):
        raise AnsibleFilterError("node_label_patch: labels must be a dict of label key to value.")
    metadata = node["metadata"]
    current = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    owned_before = [k for k in (annotations.get(OWNED_LABELS_ANNOTATION) or "").split(",") if k]

    label_patch = {}
    for key, value in labels.items():
        if current.get(key) != str(value):
            label_patch[key] = str(value)
    for key in owned_before:
        if key not in labels and key in current:
            label_patch[key] = None

    annotation_patch = {}
    owned_now = ",".join(sorted(labels))
    if (annotations.get(OWNED_LABELS_ANNOTATION) or "") != owned_now:
        annotation_patch[OWNED_LABELS_ANNOTATION] = owned_now or None

    taints = list((node.get("spec") or {}).get("taints") or [])
    wanted = {"key": taint_key, "value": taint_value, "effect": taint_effect}
    ours = _taint_id(taint_key, taint_value, taint_effect)
    owned_taint = annotations.get(OWNED_TAINT_ANNOTATION)
    taint_patch = None
    if taint:
        present = any(
            t.get("key") == taint_key and t.get("effect") == taint_effect and (t.get("value") or "") == taint_value
            for t in taints
        )
        if not present:
            # One taint per key and effect: a same-key taint with another value is replaced, not doubled.
            taint_patch = [t for t in taints if not (t.get("key") == taint_key and t.get("effect") == taint_effect)] + [
                wanted
            ]
        if owned_taint != ours:
            annotation_patch[OWNED_TAINT_ANNOTATION] = ours
    elif owned_taint:
        key, _eq, rest = owned_taint.partition("=")
        value, _colon, effect = rest.rpartition(":")
        kept = [
            t
            for t in taints
            if not (t.get("key") == key and t.get("effect") == effect and (t.get("value") or "") == value)
        ]
        if len(kept) != len(taints):
            taint_patch = kept
        annotation_patch[OWNED_TAINT_ANNOTATION] = None

    patch = {}
    if label_patch or annotation_patch:
        patch["metadata"] = {}
        if label_patch:
            patch["metadata"]["labels"] = label_patch
        if annotation_patch:
            patch["metadata"]["annotations"] = annotation_patch
    if taint_patch is not None:
        # A merge patch replaces the whole list; null removes the field when no taint is left.
        patch["spec"] = {"taints": taint_patch or None}
    return patch


class FilterModule:
    def filters(self):
        return {"node_label_patch": node_label_patch}
