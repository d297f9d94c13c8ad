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
  - The product, memory and compute capability describe the first GPU (index 0), as GPU Feature Discovery does.
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
      - 'Extra labels, for example C({"accelerator": "nvidia-tesla-p100"}).'
      - They win over computed labels of the same key.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Compute the labels of this node
  ansible.builtin.set_fact:
    node_labels: "{{ gpu_info | gpuops.k8s.gpu_labels({'accelerator': 'nvidia-h100'}) }}"
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
"""

import re

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_discovery import gpu_architecture

_LABEL_VALUE_MAX = 63
_INVALID_VALUE_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def sanitize_label_value(value):
    """Make any string a valid Kubernetes label value: spaces and other characters become '-'."""
    text = _INVALID_VALUE_CHARS.sub("-", str(value).strip())
    text = _EDGE.sub("", text[:_LABEL_VALUE_MAX])
    return text


def gpu_family(compute_capability):
    """Architecture family for a "MAJOR.MINOR" compute capability; 'undefined' when unknown.

    The table is the GPU facts' own (module_utils/_gpu_discovery.py), so a label and a fact never disagree.
    """
    _split_version(compute_capability, 2, "compute_capability")
    return gpu_architecture(compute_capability)


def validate_label_key(key):
    """Raise unless key is a valid label key ([prefix/]name)."""
    if not isinstance(key, str) or not key:
        raise AnsibleFilterError(f"gpu_labels: label key {key!r} is not a non-empty string.")
    prefix, _slash, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise AnsibleFilterError(
            f"gpu_labels: label key {key!r} has an invalid prefix {prefix!r} (a DNS subdomain is needed)."
        )
    if not _LABEL_NAME.match(name):
        raise AnsibleFilterError(
            f"gpu_labels: label key {key!r} has an invalid name {name!r} (at most 63 characters of [A-Za-z0-9_.-], "
            "starting and ending with an alphanumeric character)."
        )


def _split_version(text, parts, what):
    pieces = str(text).strip().split(".")
    try:
        numbers = [int(p) for p in pieces[:parts]]
    except ValueError:
        raise AnsibleFilterError(f"gpu_labels: {what} {text!r} is not a dotted version of numbers.") from None
    if len(numbers) < parts:
        raise AnsibleFilterError(f"gpu_labels: {what} {text!r} needs {parts} dotted parts.")
    return numbers


def gpu_labels(gpu_info, user_labels=None):
    if not isinstance(gpu_info, dict):
        raise AnsibleFilterError(
            f"gpu_labels: the input must be the result of nvidia_gpu_info (a dict), got {type(gpu_info).__name__}."
        )
    user_labels = user_labels or {}
    if not isinstance(user_labels, dict):
        raise AnsibleFilterError("gpu_labels: user_labels must be a dict of label key to value.")
    gpus = gpu_info.get("gpus") or []
    labels = {}
    if gpus:
        first = gpus[0]
        for field in ("name", "memory_total_mib", "compute_capability"):
            if first.get(field) in (None, ""):
                raise AnsibleFilterError(f"gpu_labels: GPU 0 in the nvidia_gpu_info result has no {field}.")
        cc_major, cc_minor = _split_version(first["compute_capability"], 2, "compute_capability")
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": sanitize_label_value(first["name"]),
                "nvidia.com/gpu.count": str(len(gpus)),
                "nvidia.com/gpu.memory": str(int(first["memory_total_mib"])),
                "nvidia.com/gpu.family": gpu_family(first["compute_capability"]),
                "nvidia.com/gpu.compute.major": str(cc_major),
                "nvidia.com/gpu.compute.minor": str(cc_minor),
            }
        )
        driver = gpu_info.get("driver_version")
        if driver:
            pieces = str(driver).strip().split(".")
            if len(pieces) < 2 or not all(p.isdigit() for p in pieces):
                raise AnsibleFilterError(f"gpu_labels: driver_version {driver!r} is not MAJOR.MINOR[.REV].")
            rev = pieces[2] if len(pieces) > 2 else ""
            labels.update(
                {
                    "nvidia.com/cuda.driver-version.full": sanitize_label_value(driver),
                    "nvidia.com/cuda.driver-version.major": pieces[0],
                    "nvidia.com/cuda.driver-version.minor": pieces[1],
                    "nvidia.com/cuda.driver-version.revision": rev,
                    "nvidia.com/cuda.driver.major": pieces[0],
                    "nvidia.com/cuda.driver.minor": pieces[1],
                    "nvidia.com/cuda.driver.rev": rev,
                }
            )
        cuda = gpu_info.get("cuda_driver_version")
        if cuda:
            major, minor = _split_version(cuda, 2, "cuda_driver_version")
            labels.update(
                {
                    "nvidia.com/cuda.runtime-version.full": f"{major}.{minor}",
                    "nvidia.com/cuda.runtime-version.major": str(major),
                    "nvidia.com/cuda.runtime-version.minor": str(minor),
                    "nvidia.com/cuda.runtime.major": str(major),
                    "nvidia.com/cuda.runtime.minor": str(minor),
                }
            )
    for key, value in user_labels.items():
        validate_label_key(key)
        if isinstance(value, bool):
            value = "true" if value else "false"
        labels[key] = sanitize_label_value("" if value is None else value)
    return labels


class FilterModule:
    def filters(self):
        return {"gpu_labels": gpu_labels}
