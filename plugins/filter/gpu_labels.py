# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: gpu_labels
short_description: Kubernetes node labels for the GPUs that nvidia_gpu_info found
version_added: 0.1.0
description:
  - Turns the result of M(gpuops.k8s.nvidia_gpu_info) into the node labels that GPU Feature Discovery
    would set (C(nvidia.com/gpu.present), C(nvidia.com/gpu.product), C(nvidia.com/gpu.count),
    C(nvidia.com/gpu.memory), C(nvidia.com/gpu.family), C(nvidia.com/gpu.compute.major/minor),
    C(nvidia.com/cuda.driver-version.*), C(nvidia.com/cuda.runtime-version.*) and their older
    C(nvidia.com/cuda.driver.*) / C(nvidia.com/cuda.runtime.*) names), merged with the user's own labels.
  - Also C(nvidia.com/gpu.replicas) and C(nvidia.com/gpu.sharing-strategy), from O(sharing), and the labels of
    the device plugin's MIG strategy (C(nvidia.com/mig.strategy), C(nvidia.com/mig-<profile>.*)), from
    O(mig_strategy).
  - As GPU Feature Discovery does, the product, memory and compute capability describe one GPU - the first whole
    GPU (not in MIG mode), or GPU 0 when every GPU is in MIG mode - and C(nvidia.com/gpu.count) counts the GPUs of
    that model. The product is GFD's spelling of the name - characters other than C([A-Za-z0-9_. -]) dropped,
    runs of spaces turned into one C(-) - with C(-SHARED) appended when its GPUs are time-sliced and not renamed.
  - docs/compared-labels.md compares these labels with what GPU Feature Discovery v0.19.0 writes for the same GPUs.
  - A node without GPUs gets no C(nvidia.com/*) labels; only the user's labels are returned.
  - Every value is sanitized into a valid label value (at most 63 characters of C([A-Za-z0-9_.-]),
    starting and ending with an alphanumeric character).
options:
  _input:
    description:
      - The registered result of M(gpuops.k8s.nvidia_gpu_info).
      - Uses C(gpus), C(driver_version) and C(cuda_driver_version).
    type: dict
    required: true
  user_labels:
    description:
      - 'Extra labels, for example C({"accelerator": "nvidia-h100"}).'
      - They win over computed labels of the same key.
    type: dict
    default: {}
  sharing:
    description:
      - The C(sharing) section of the device plugin's config (NVIDIA's config, version v1).
      - 'For example C({"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}).'
      - With C(replicas) of 2 or more for C(nvidia.com/gpu), C(nvidia.com/gpu.replicas) is that number,
        C(nvidia.com/gpu.sharing-strategy) is C(time-slicing) and the product ends in C(-SHARED) unless
        C(renameByDefault) is true. Without it they are C(1) and C(none) (C(0) and C(none) when all GPUs of the
        model are in MIG mode).
      - C(mps) is refused with one sentence; the collection's device plugin does not run MPS.
    type: dict
    default: {}
  mig_strategy:
    description:
      - The device plugin's MIG strategy (C(flags.migStrategy) of its config), for the labels GPU Feature
        Discovery adds for it. C(none) adds none.
      - C(mixed) adds C(nvidia.com/mig.strategy=mixed) and, per MIG profile on the node (C(+) in a profile
        name becomes C(.)), C(nvidia.com/mig-<profile>.count), C(.product) (C(<model>-MIG-<profile>)),
        C(.replicas), C(.sharing-strategy), C(.memory), C(.multiprocessors), C(.slices.gi), C(.slices.ci) and
        C(.engines.copy/decoder/encoder/jpeg/ofa), from the first MIG device of the profile.
      - C(single) adds C(nvidia.com/mig.strategy=single) and, when every GPU is in MIG mode with devices of one
        profile, those labels under C(nvidia.com/gpu.*) instead of the whole GPU's (the MIG devices are the
        node's C(nvidia.com/gpu)); otherwise, as GPU Feature Discovery, C(<model>-MIG-INVALID) with count,
        replicas and memory 0 and an empty sharing strategy. A node without GPUs in MIG mode gets only
        C(nvidia.com/mig.strategy).
      - The MIG attribute labels need the facts' MIG device attributes (C(multiprocessors) and the others); facts
        without them give only count, product, replicas, sharing strategy and memory.
    type: str
    default: none
    choices: [none, single, mixed]
"""

EXAMPLES = r"""
- name: Compute the labels of this node
  ansible.builtin.set_fact:
    node_labels: "{{ gpu_info | gpuops.k8s.gpu_labels({'accelerator': 'nvidia-h100'}) }}"

- name: The labels of a node whose GPUs the device plugin time-slices four ways
  ansible.builtin.set_fact:
    node_labels: "{{ gpu_info | gpuops.k8s.gpu_labels(sharing=device_plugin_config.sharing) }}"

- name: The labels of a node whose device plugin serves its MIG devices as nvidia.com/mig-<profile>
  ansible.builtin.set_fact:
    node_labels: "{{ gpu_info | gpuops.k8s.gpu_labels(mig_strategy=device_plugin_config.flags.migStrategy) }}"
"""

RETURN = r"""
_value:
  description: Label key to label value (all strings).
  type: dict
  sample:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.family: hopper
    nvidia.com/gpu.replicas: "1"
    nvidia.com/gpu.sharing-strategy: none
"""


from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import LabelError
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import gpu_labels as _gpu_labels


def gpu_labels(gpu_info, user_labels=None, sharing=None, mig_strategy=None):
    """The labels live in module_utils/_node_labels.py, shared with the module gpuops.k8s.node_labels."""
    try:
        return _gpu_labels(gpu_info, user_labels, sharing, mig_strategy)
    except LabelError as error:
        raise AnsibleFilterError(str(error)) from None


class FilterModule:
    def filters(self):
        return {"gpu_labels": gpu_labels}
