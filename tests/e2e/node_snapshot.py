"""A snapshot of what the collection may change on a lab node and in the API, for playbooks/remove.yml's proof:
taken before site.yml and after remove.yml, the two must be equal but for the places ``ALLOWED`` names.

The node's part: every file, directory and link under the places the collection writes, with its type, mode, owner
and group (a file's SHA-256 too, a link's target); the packages with their versions and dpkg's status (holds
included); the systemd unit files and their enablement; containerd's effective config (``containerd config dump``).
The API's part: the Node's labels, taints and annotations, and the cluster-wide objects the collection creates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kubernetes import client

# Where the collection writes on a node, with a checksum for each file.
CHECKED = ("/etc", "/opt", "/usr/local", "/var/lib")
# Where packages put their files: names, modes and owners only (dpkg's list of packages covers their contents).
LISTED = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/share/doc")
# What changes on its own, or belongs to the package manager and the kubelet, whatever the collection does: each with
# the reason it is left out of the comparison.
ALLOWED = {
    # apt's package index and its state (which packages were installed as dependencies), and dpkg's database, whose
    # contents the package list compares instead.
    "/var/lib/apt": "the package index and apt's own state",
    "/var/lib/dpkg": "dpkg's database (the package list compares what it says)",
    "/var/cache": "the package manager's cache",
    "/var/log": "logs",
    "/etc/ld.so.cache": "the linker cache, rebuilt by every package install and removal",
    # The kubelet's own state: its pods' directories, its device manager's checkpoint (rewritten at each
    # allocation) and the registration sockets of whatever plugin runs.
    "/var/lib/kubelet/pods": "the kubelet's pods",
    "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint": "the kubelet's device manager checkpoint",
    "/var/lib/kubelet/device-plugins/kubelet.sock": "the kubelet's socket",
    "/var/lib/kubelet/plugins_registry": "the kubelet's plugin registration directory",
    "/var/lib/kubelet/pod-resources": "the kubelet's pod-resources socket",
    "/var/lib/kubelet/cpu_manager_state": "the kubelet's CPU manager state",
    "/var/lib/kubelet/memory_manager_state": "the kubelet's memory manager state",
    "/var/lib/containerd": "containerd's images and containers",
    "/var/lib/cni": "the pod network's leases",
    "/var/lib/systemd": "systemd's timers and random seed",
    "/var/lib/gpuops-lab": "the lab's own files",
    "/etc/gpuops-lab": "the lab's own files",
}
# Node annotations the kubelet and the control plane write.
NODE_ANNOTATIONS_ALLOWED = ("node.alpha.kubernetes.io/ttl",)
# The cluster-wide objects the collection creates, by API: RuntimeClasses and DeviceClasses.
MANAGED = "app.kubernetes.io/managed-by=gpuops.k8s"

_TREE = r"""
set -eu
find {checked} -xdev \( {pruned} \) -prune -o \( -type f -printf '%p f %m %u %g ' -exec sha256sum {{}} \; \) \
  -o -type l -printf '%p l %m %u %g %l\n' -o -printf '%p %y %m %u %g\n' 2>/dev/null \
  | sed 's/ \([0-9a-f]\{{64\}}\)  .*$/ \1/'
find {listed} -xdev -printf '%p %y %m %u %g\n' 2>/dev/null
"""


@dataclass
class Snapshot:
    files: dict[str, str]
    packages: dict[str, str]
    units: dict[str, str]
    containerd: str
    node: dict[str, object]
    api: dict[str, list[str]]

    def differences(self, other: Snapshot) -> dict[str, object]:
        """What differs from ``other``, part by part (empty when the two are equal)."""
        out: dict[str, object] = {}
        for part in ("files", "packages", "units"):
            mine, theirs = getattr(self, part), getattr(other, part)
            keys = sorted(set(mine) | set(theirs))
            changed = {key: (mine.get(key), theirs.get(key)) for key in keys if mine.get(key) != theirs.get(key)}
            if changed:
                out[part] = changed
        for part in ("containerd", "node", "api"):
            if getattr(self, part) != getattr(other, part):
                out[part] = (getattr(self, part), getattr(other, part))
        return out


def take(lab, node: str) -> Snapshot:
    """The snapshot of ``node`` (a lab node's container name, its Node's name too) and of the API."""
    pruned = " -o ".join(f"-path {path}" for path in sorted(ALLOWED))
    script = _TREE.format(checked=" ".join(CHECKED), pruned=pruned, listed=" ".join(LISTED))
    tree = lab.node_exec(node, "sh", "-c", script, timeout=300).stdout
    files = dict(line.split(" ", 1) for line in tree.splitlines())
    listing = lab.node_exec(node, "dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\\n").stdout
    packages = dict(line.split(" ", 1) for line in listing.splitlines())
    units = {}
    listing = lab.node_exec(node, "systemctl", "list-unit-files", "--no-legend", "--no-pager").stdout
    for line in listing.splitlines():
        fields = line.split()
        units[fields[0]] = " ".join(fields[1:])
    containerd = lab.node_exec(node, "containerd", "config", "dump").stdout
    meta = lab.node(node)
    annotations = {
        key: value for key, value in (meta.metadata.annotations or {}).items() if key not in NODE_ANNOTATIONS_ALLOWED
    }
    taints = sorted(json.dumps(t.to_dict(), sort_keys=True, default=str) for t in meta.spec.taints or [])
    api = {
        "runtimeclasses": sorted(
            rc.metadata.name for rc in client.NodeV1Api(lab.api).list_runtime_class(label_selector=MANAGED).items
        ),
        "deviceclasses": sorted(
            dc.metadata.name for dc in client.ResourceV1Api(lab.api).list_device_class(label_selector=MANAGED).items
        ),
    }
    return Snapshot(
        files=files,
        packages=packages,
        units=units,
        containerd=containerd,
        node={"labels": dict(meta.metadata.labels or {}), "taints": taints, "annotations": annotations},
        api=api,
    )
