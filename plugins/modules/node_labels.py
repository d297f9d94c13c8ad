#!/usr/bin/python
# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
module: node_labels
short_description: GPU labels and the GPU taint on many Kubernetes Nodes with one LIST and one PATCH per change
version_added: 0.1.0
description:
  - Computes, for every node it is given, the labels GPU Feature Discovery would set from that node's
    M(gpuops.k8s.nvidia_gpu_info) result merged with the user's labels (as P(gpuops.k8s.gpu_labels#filter)
    does), and the change that brings the Node object there (as P(gpuops.k8s.node_label_patch#filter) does).
  - Reads every Node with one LIST and writes one JSON merge patch per Node that needs a change; a Node
    already right is not written.
  - Each patch carries the C(resourceVersion) of the Node it was computed from, so the API server refuses
    it when someone else wrote the Node in between; the module then reads that Node again, recomputes and
    writes again (up to O(conflict_retries) times). A label or taint written by someone else between the
    LIST and the PATCH is never lost.
  - The role M(gpuops.k8s.gpu_node_labels) runs it once per play batch.
  - Credentials as M(kubernetes.core.k8s) takes them, including its C(K8S_AUTH_*) environment variables.
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  nodes:
    description: The nodes to label, one entry per Node.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The Node's name.
        type: str
        required: true
      state:
        description:
          - V(present) gives the Node the labels and the taint this entry computes.
          - V(absent) takes from the Node what the collection applied and nothing else, as a node leaves the GPU
            pool or the collection's care - the labels named in its
            C(gpuops.k8s/owned-labels) annotation, the taint named in C(gpuops.k8s/owned-taint), and those two
            annotations. A label or taint someone else set stays, also where its key is one the collection
            computes. The entry's other options are not read.
        type: str
        default: present
        choices: [present, absent]
      gpu_info:
        description:
          - The node's M(gpuops.k8s.nvidia_gpu_info) result.
          - C(gpus), C(driver_version) and C(cuda_driver_version) are read.
        type: dict
        default: {}
      user_labels:
        description: The user's own labels; they win over computed labels of the same key.
        type: dict
        default: {}
      sharing:
        description:
          - The C(sharing) section of the device plugin's config (NVIDIA's config, version v1) on this node, for
            C(nvidia.com/gpu.replicas), C(nvidia.com/gpu.sharing-strategy) and the C(-SHARED) product, as the
            P(gpuops.k8s.gpu_labels#filter) filter computes them.
        type: dict
        default: {}
      mig_strategy:
        description:
          - The device plugin's MIG strategy on this node (C(flags.migStrategy) of its config), for the labels GPU
            Feature Discovery adds for it, as the P(gpuops.k8s.gpu_labels#filter) filter computes them.
          - C(mixed) adds C(nvidia.com/mig.strategy) and C(nvidia.com/mig-<profile>.*) per MIG profile; C(single)
            adds C(nvidia.com/mig.strategy) and describes the MIG devices under C(nvidia.com/gpu.*).
        type: str
        default: none
        choices: [none, single, mixed]
      keep_labels:
        description:
          - Label keys this run does not decide; the Node's current value of each is kept, and stays the
            collection's (a later run that neither wants nor keeps it removes it). A key the Node does not
            have is not added, and a key this run computes or the user labels set is decided by them.
          - The role M(gpuops.k8s.gpu_node_labels) keeps C(nvidia.com/mig.config) and
            C(nvidia.com/mig.config.state) of a node that names a MIG config where the MIG stage did not run.
        type: list
        elements: str
        default: []
      taint:
        description: Whether the node carries the GPU taint.
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
        choices: [NoSchedule, PreferNoSchedule, NoExecute]
  conflict_retries:
    description: How many times a write refused because the Node changed is redone from a fresh read.
    type: int
    default: 5
extends_documentation_fragment:
  - gpuops.k8s.k8s_connection
attributes:
  check_mode:
    support: full
    description: Reads the Nodes and computes every change without writing anything.
  diff_mode:
    support: full
    description: Returns each changed Node's labels, the collection's annotations and taints before and after.
notes:
  - A node the API has no Node for, or whose labels cannot be computed, is listed in RV(missing) or
    RV(invalid) and does not stop the others; the role fails those hosts with a sentence each.
"""

EXAMPLES = r"""
- name: Label two nodes from their GPU facts
  gpuops.k8s.node_labels:
    kubeconfig: /etc/kubernetes/admin.conf
    nodes:
      - name: gpu-node-1
        gpu_info: "{{ hostvars['gpu-node-1'].gpu_info }}"
        user_labels: {accelerator: nvidia-h100}
      - name: gpu-node-2
        gpu_info: "{{ hostvars['gpu-node-2'].gpu_info }}"
        taint: false

- name: Take the collection's labels, taint and ownership annotations off a node that leaves the GPU pool
  gpuops.k8s.node_labels:
    kubeconfig: /etc/kubernetes/admin.conf
    nodes:
      - name: gpu-node-3
        state: absent
"""

RETURN = r"""
nodes_changed:
  description:
    - Node name to the merge patch written (in check mode, the one that would be written), for changed nodes only.
  returned: always
  type: dict
missing:
  description: Names of requested nodes the API server has no Node object for.
  returned: always
  type: list
  elements: str
invalid:
  description: Node name to the sentence saying why its labels cannot be computed.
  returned: always
  type: dict
conflicts:
  description: How many writes the API server refused because the Node had changed, each redone from a fresh read.
  returned: always
  type: int
unchanged:
  description: How many requested nodes were already right.
  returned: always
  type: int
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_connection import CONNECTION_ARGUMENT_SPEC
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_connection import api_client as _api_client
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import NodeApi
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import api_error as _api_error
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import LabelError, label_batch

try:
    from kubernetes import config as k8s_config
    from kubernetes.dynamic.exceptions import DynamicApiError
    from urllib3 import exceptions as urllib3_exceptions

    KUBERNETES_IMPORT_ERROR = None
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

ARGUMENT_SPEC = {
    "nodes": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "name": {"type": "str", "required": True},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
            "gpu_info": {"type": "dict", "default": {}},
            "user_labels": {"type": "dict", "default": {}},
            "sharing": {"type": "dict", "default": {}},
            "mig_strategy": {"type": "str", "default": "none", "choices": ["none", "single", "mixed"]},
            "keep_labels": {"type": "list", "elements": "str", "default": []},
            "taint": {"type": "bool", "default": True},
            "taint_key": {"type": "str", "default": "nvidia.com/gpu", "no_log": False},
            "taint_value": {"type": "str", "default": "present"},
            "taint_effect": {
                "type": "str",
                "default": "NoSchedule",
                "choices": ["NoSchedule", "PreferNoSchedule", "NoExecute"],
            },
        },
    },
    "conflict_retries": {"type": "int", "default": 5},
    **CONNECTION_ARGUMENT_SPEC,
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_or_fail(module, "node_labels", run_module)


def run_module(module):
    """Check the options, label the batch, and answer with what changed."""
    if KUBERNETES_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    if module.params["conflict_retries"] < 0:
        module.fail_json(
            msg=f"node_labels: conflict_retries must be 0 or more, got {module.params['conflict_retries']}."
        )
    module.exit_json(**_response(module, _label(module)))


def _label(module):
    """label_batch on the API the options name; each way it can fail, one sentence."""
    try:
        api = NodeApi(_api_client(module.params))
        return label_batch(
            module.params["nodes"],
            api,
            check_mode=module.check_mode,
            conflict_retries=module.params["conflict_retries"],
        )
    except LabelError as error:
        module.fail_json(msg=str(error))
    except (k8s_config.ConfigException, OSError) as error:
        module.fail_json(msg=f"node_labels: cannot set up the Kubernetes client: {error}")
    except DynamicApiError as error:
        module.fail_json(msg=f"node_labels: the Kubernetes API refused a request: {_api_error(error)}")
    except urllib3_exceptions.HTTPError as error:  # no connection, TLS, retries exhausted
        module.fail_json(msg=f"node_labels: cannot reach the Kubernetes API: {error}")


def _response(module, result):
    """The module's result. The invocation echoes every node's GPU facts; a fleet's worth is not worth keeping
    in each host's result, so it says how many nodes there were instead."""
    changed = result["changed"]
    nodes = module.params["nodes"]
    response = {
        "changed": bool(changed),
        "nodes_changed": changed,
        "missing": result["missing"],
        "invalid": result["invalid"],
        "conflicts": result["conflicts"],
        "unchanged": len(nodes) - len(changed) - len(result["missing"]) - len(result["invalid"]),
        "invocation": {"module_args": {"nodes": f"({len(nodes)} nodes)"}},
    }
    if module._diff and changed:
        names = sorted(changed)
        response["diff"] = {
            "before": {name: result["diff"][name]["before"] for name in names},
            "after": {name: result["diff"][name]["after"] for name in names},
        }
    return response


if __name__ == "__main__":
    main()
