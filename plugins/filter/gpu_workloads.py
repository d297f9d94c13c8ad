# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: gpu_workloads
short_description: The pods of a node that hold GPUs and that a drain would move
version_added: 0.1.0
description:
  - Takes the Pods of one node (the C(resources) of a M(kubernetes.core.k8s_info) lookup with the field
    selector C(spec.nodeName)) and returns C(namespace/name) of each one that still runs and holds GPUs, in
    the order given.
  - A pod holds GPUs when one of its containers or init containers requests or limits an extended resource of
    the C(nvidia.com/) domain (a device plugin's GPUs, MIG devices or shares), or when it has DRA resource
    claims (C(spec.resourceClaims)).
  - Pods that have ended (phase C(Succeeded) or C(Failed)) are left out, and so are pods a DaemonSet owns,
    which a drain leaves in place. The role P(gpuops.k8s.node_drain#role) reads this list to decide whether a
    change that would stop the node's GPU workloads needs a drain first.
options:
  _input:
    description: The node's Pods, as the Kubernetes API returns them.
    type: list
    elements: dict
    required: true
  any_pod:
    description:
      - Return every running pod a drain would move, whether it holds GPUs or not (for a change that stops
        every container of the node, such as a dockerd restart without live-restore).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Say which pods hold GPUs on the node
  ansible.builtin.debug:
    msg: "{{ node_pods.resources | gpuops.k8s.gpu_workloads }}"
"""

RETURN = r"""
_value:
  description: C(namespace/name) of each running pod that holds GPUs and is not owned by a DaemonSet.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

_GPU_DOMAIN = "nvidia.com/"
_ENDED = ("Succeeded", "Failed")


def _holds_gpus(spec):
    if spec.get("resourceClaims"):
        return True
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            if any(str(name).startswith(_GPU_DOMAIN) for name in resources.get(kind) or {}):
                return True
    return False


def gpu_workloads(pods, any_pod=False):
    if not isinstance(pods, list) or not all(isinstance(pod, dict) for pod in pods):
        raise AnsibleFilterError("gpu_workloads: the input must be a list of Pods, as k8s_info returns them.")
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in _ENDED:
            continue
        if any(owner.get("kind") == "DaemonSet" for owner in meta.get("ownerReferences") or []):
            continue
        if any_pod or _holds_gpus(pod.get("spec") or {}):
            found.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return found


class FilterModule:
    def filters(self):
        return {"gpu_workloads": gpu_workloads}
