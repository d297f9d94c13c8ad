# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: gpu_operator_hold
short_description: Which of a node's GPU components NVIDIA's GPU Operator manages, and which of a run's stages they meet
version_added: 0.1.0
description:
  - Takes a Node (as the Kubernetes API returns it) and the Pods on it (the C(resources) of a
    M(kubernetes.core.k8s_info) lookup with the field selector C(spec.nodeName)), and says which components the
    GPU Operator deploys on the node, with the evidence, and which of the given site.yml stages would manage the
    same components.
  - The Operator deploys a component on a node where the node's label C(nvidia.com/gpu.deploy.<component>) is
    C(true) (the only value the Operator writes) or C(paused-...) (the Operator's driver upgrade pauses its
    operands so), and its operand runs there as a pod of the Operator's DaemonSet for it. Either counts.
  - A pod is the Operator's when a DaemonSet of one of the operand names below owns it and the pod carries that
    name in its C(app) or C(app.kubernetes.io/component) label, as the Operator's manifests label their pods;
    the driver's pod is known by its C(app.kubernetes.io/component=nvidia-driver) label, whatever its DaemonSet
    is called (an C(NVIDIADriver) resource names it). Pods that have ended are left out.
  - A component whose label a person set to C(false) is off for the Operator on that node (the Operator never
    changes a value it did not write), and the collection may manage it.
  - "Stages and the Operator's components they meet: C(driver): C(driver); C(mig): C(mig-manager); C(toolkit) and
    C(runtime): C(container-toolkit) (the Operator's toolkit writes the runtime's config); C(plugin):
    C(device-plugin) and C(dra-driver) (two allocators of one GPU); C(labels): C(gpu-feature-discovery) (the same
    C(nvidia.com/gpu.*) labels)."
options:
  _input:
    description: The Node, as the Kubernetes API returns it (an empty dict for a node not registered).
    type: dict
    required: true
  pods:
    description: The Pods on the node, as the Kubernetes API returns them.
    type: list
    elements: dict
    required: true
  stages:
    description: The stages of the run (of C(driver), C(mig), C(toolkit), C(runtime), C(plugin), C(labels)).
    type: list
    elements: str
    required: true
  node_name:
    description:
      - Only the pods bound to this node count (C(spec.nodeName)), for pods listed across the cluster. Without it
        every pod given counts. A pod listed twice counts once.
    type: str
"""

EXAMPLES = r"""
- name: Say what the GPU Operator holds on the node
  ansible.builtin.debug:
    msg: "{{ node.resources[0] | gpuops.k8s.gpu_operator_hold(pods.resources, ['driver', 'plugin']) }}"
"""

RETURN = r"""
_value:
  description: What the Operator holds on the node and what of it the stages meet.
  type: dict
  contains:
    held:
      description:
        - Each component the Operator deploys on the node, with its evidence, in the order of the components.
        - "Each evidence item reads C(label nvidia.com/gpu.deploy.<component>=<value>) or
          C(pod <namespace>/<name>)."
      type: dict
    switched_off:
      description: The components whose deploy label a person set to C(false) on the node.
      type: list
      elements: str
    conflicts:
      description: The held components that the given stages would manage too, in the order of the components.
      type: list
      elements: str
    stages:
      description: The given stages that meet a held component, in site.yml's order.
      type: list
      elements: str
    labels_off:
      description: The merge-patch labels that switch the conflicting components off for the Operator.
      type: dict
"""

from ansible.errors import AnsibleFilterError

LABEL_PREFIX = "nvidia.com/gpu.deploy."
# site.yml's stages in its order, and the Operator's components each would manage too.
STAGES = (
    ("driver", ("driver",)),
    ("mig", ("mig-manager",)),
    ("toolkit", ("container-toolkit",)),
    ("runtime", ("container-toolkit",)),
    ("plugin", ("device-plugin", "dra-driver")),
    ("labels", ("gpu-feature-discovery",)),
)
# The Operator's operand DaemonSets (its assets/ and manifests/ directories) and the component each deploys.
OPERANDS = {
    "nvidia-driver-daemonset": "driver",
    "nvidia-container-toolkit-daemonset": "container-toolkit",
    "nvidia-device-plugin-daemonset": "device-plugin",
    "nvidia-device-plugin-mps-control-daemon": "device-plugin",
    "gpu-feature-discovery": "gpu-feature-discovery",
    "nvidia-mig-manager": "mig-manager",
    "nvidia-dra-driver-kubelet-plugin": "dra-driver",
    "nvidia-dcgm": "dcgm",
    "nvidia-dcgm-exporter": "dcgm-exporter",
    "nvidia-operator-validator": "operator-validator",
    "nvidia-node-status-exporter": "node-status-exporter",
}
DRIVER_COMPONENT_LABEL = ("app.kubernetes.io/component", "nvidia-driver")
# The label selectors that find every operand pod across the cluster (the role's operator entry point lists with them).
SELECTORS = (
    f"app in ({', '.join(sorted(OPERANDS))})",
    f"app.kubernetes.io/component in ({', '.join(sorted({DRIVER_COMPONENT_LABEL[1], *OPERANDS}))})",
)
_ENDED = ("Succeeded", "Failed")


def _components():
    order = []
    for _stage, components in STAGES:
        order.extend(c for c in components if c not in order)
    order.extend(c for c in OPERANDS.values() if c not in order)
    return order


def _operand(pod):
    """The component an Operator's pod deploys, or None for any other pod."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    owners = [o.get("name") for o in meta.get("ownerReferences") or [] if o.get("kind") == "DaemonSet"]
    if not owners:
        return None
    if labels.get(DRIVER_COMPONENT_LABEL[0]) == DRIVER_COMPONENT_LABEL[1]:
        return "driver"
    for owner in owners:
        if owner in OPERANDS and owner in (labels.get("app"), labels.get("app.kubernetes.io/component")):
            return OPERANDS[owner]
    return None


def _deploys(value):
    return value == "true" or value.startswith("paused-")


def gpu_operator_hold(node, pods, stages, node_name=None):
    if not isinstance(node, dict):
        raise AnsibleFilterError("gpu_operator_hold: the input must be a Node, as k8s_info returns it.")
    if not isinstance(pods, list) or not all(isinstance(pod, dict) for pod in pods):
        raise AnsibleFilterError("gpu_operator_hold: pods must be a list of Pods, as k8s_info returns them.")
    known = [name for name, _components in STAGES]
    unknown = [stage for stage in stages or [] if stage not in known]
    if not isinstance(stages, list) or unknown:
        raise AnsibleFilterError(
            f"gpu_operator_hold: stages must be a list of {', '.join(known)}; got {', '.join(map(str, unknown))}."
        )
    labels = (node.get("metadata") or {}).get("labels") or {}
    evidence = {}
    switched_off = []
    for key, value in sorted(labels.items()):
        if not key.startswith(LABEL_PREFIX):
            continue
        component, value = key[len(LABEL_PREFIX) :], str(value)
        if component == "operands":  # the Operator's switch for the whole node, not a component
            continue
        if _deploys(value):
            evidence.setdefault(component, []).append(f"label {key}={value}")
        elif value == "false":
            switched_off.append(component)
    seen = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if key in seen or (pod.get("status") or {}).get("phase") in _ENDED:
            continue
        seen.add(key)
        if node_name is not None and (pod.get("spec") or {}).get("nodeName") != node_name:
            continue
        component = _operand(pod)
        if component:
            evidence.setdefault(component, []).append(f"pod {meta.get('namespace', '')}/{meta.get('name', '')}")
    order = _components()
    rank = {c: i for i, c in enumerate(order)}
    held = {c: evidence[c] for c in sorted(evidence, key=lambda c: (rank.get(c, len(order)), c))}
    wanted = [c for stage, components in STAGES if stage in stages for c in components]
    conflicts = [c for c in held if c in wanted]
    return {
        "held": held,
        "switched_off": switched_off,
        "conflicts": conflicts,
        "stages": [stage for stage, components in STAGES if stage in stages and set(components) & set(conflicts)],
        "labels_off": {LABEL_PREFIX + c: "false" for c in conflicts},
    }


class FilterModule:
    def filters(self):
        return {"gpu_operator_hold": gpu_operator_hold}
