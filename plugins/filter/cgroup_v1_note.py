# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: cgroup_v1_note
short_description: What a GPU node on cgroup v1 needs from its kubelet, as one sentence
version_added: 0.1.0
description:
  - Takes the file system type of a node's C(/sys/fs/cgroup) (what C(stat -fc %T /sys/fs/cgroup) prints) and
    returns an empty string on cgroup v2 (C(cgroup2fs)), or a sentence for C(playbooks/validate.yml) to print
    on a cgroup v1 or hybrid layout (anything else, C(tmpfs) in practice).
  - From Kubernetes 1.35 on the kubelet refuses to start on cgroup v1 unless its KubeletConfiguration sets
    C(failCgroupV1) to C(false), and cgroup v1 support is deprecated. The sentence says this for the
    node's kubelet version when it is known.
options:
  _input:
    description: The file system type of the node's C(/sys/fs/cgroup).
    type: str
    required: true
  node:
    description: The node's name, for the sentence.
    type: str
    required: true
  kubelet_version:
    description: The node's C(status.nodeInfo.kubeletVersion) (C(v1.37.2)); empty when unknown.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Say what a cgroup v1 node needs
  ansible.builtin.debug:
    msg: "{{ cgroup_fs_type | gpuops.k8s.cgroup_v1_note(node='gpu-node-1', kubelet_version='v1.37.2') }}"
"""

RETURN = r"""
_value:
  description: An empty string on cgroup v2, otherwise one sentence naming the node and what its kubelet needs.
  type: str
"""

import re

from ansible.errors import AnsibleFilterError

_CGROUP_V2 = "cgroup2fs"
_REFUSES_FROM = (1, 35)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


def cgroup_v1_note(fs_type, node, kubelet_version=""):
    if not isinstance(fs_type, str) or not fs_type.strip():
        raise AnsibleFilterError("cgroup_v1_note: the input must be the file system type of /sys/fs/cgroup.")
    fs_type = fs_type.strip()
    if fs_type == _CGROUP_V2:
        return ""
    head = f"{node}: cgroup v1 (/sys/fs/cgroup is {fs_type}, not cgroup2fs)."
    tail = (
        " cgroup v1 support is deprecated in Kubernetes and will be removed; plan the move to cgroup v2"
        " (systemd.unified_cgroup_hierarchy=1 on the kernel command line)."
    )
    kubelet_version = (kubelet_version or "").strip()
    match = _VERSION.match(kubelet_version)
    if not match:
        return (
            f"{head} From Kubernetes 1.35 on the kubelet starts on cgroup v1 only when its"
            f" KubeletConfiguration sets failCgroupV1: false.{tail}"
        )
    if (int(match.group(1)), int(match.group(2))) >= _REFUSES_FROM:
        return (
            f"{head} Its kubelet {kubelet_version} starts there only because its KubeletConfiguration sets"
            f" failCgroupV1: false (Kubernetes 1.35 and later refuse cgroup v1 otherwise); keep that setting"
            f" through kubelet upgrades.{tail}"
        )
    return (
        f"{head} Its kubelet {kubelet_version} runs there as it is, but from Kubernetes 1.35 on the kubelet"
        f" refuses cgroup v1 unless its KubeletConfiguration sets failCgroupV1: false: set it before"
        f" upgrading the kubelet.{tail}"
    )


class FilterModule:
    def filters(self):
        return {"cgroup_v1_note": cgroup_v1_note}
