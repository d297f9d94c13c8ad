# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: remediation_pods
short_description: The pods a node's reboot evicts, as gpuops.k8s.pod_eviction takes them
version_added: 0.1.0
description:
  - From the Pods bound to a node (M(kubernetes.core.k8s_info) with C(spec.nodeName=<node>)), the ones a drain moves
    before the node reboots, as C({namespace, name, uid}) for M(gpuops.k8s.pod_eviction), ordered by namespace and
    name.
  - Left out, as C(kubectl drain) leaves them out, are pods of a DaemonSet (their controller puts them back on the
    node, which tolerates the cordon), static pods (their mirror pods cannot be evicted) and pods that have ended
    (C(Succeeded) or C(Failed)).
options:
  _input:
    description: The Pods, as M(kubernetes.core.k8s_info) returns them (C(resources)).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Evict what a drain would move
  gpuops.k8s.pod_eviction:
    pods: "{{ node_pods.resources | gpuops.k8s.remediation_pods }}"
"""

RETURN = r"""
_value:
  description: The pods to evict, each with C(namespace), C(name) and C(uid).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError


def remediation_pods(pods):
    """The pods a reboot evicts ({namespace, name, uid}): every pod bound to the node but DaemonSet pods, static
    (mirror) pods and pods that have ended."""
    if not isinstance(pods, list) or not all(isinstance(pod, dict) for pod in pods):
        raise AnsibleFilterError("remediation_pods: the input must be a list of Pods, as k8s_info returns them.")
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if any(owner.get("kind") == "DaemonSet" for owner in meta.get("ownerReferences") or []):
            continue
        if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            continue
        found.append({"namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "uid": meta.get("uid")})
    return sorted(found, key=lambda p: (p["namespace"], p["name"]))


class FilterModule:
    def filters(self):
        return {"remediation_pods": remediation_pods}
