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
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import LabelError
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import node_label_patch as _node_label_patch


def node_label_patch(
    node, labels, taint=True, taint_key="nvidia.com/gpu", taint_value="present", taint_effect="NoSchedule"
):
    """The patch lives in module_utils/_node_labels.py, shared with the module gpuops.k8s.node_labels."""
    try:
        return _node_label_patch(
            node, labels, taint=taint, taint_key=taint_key, taint_value=taint_value, taint_effect=taint_effect
        )
    except LabelError as error:
        raise AnsibleFilterError(str(error)) from None


class FilterModule:
    def filters(self):
        return {"node_label_patch": node_label_patch}
