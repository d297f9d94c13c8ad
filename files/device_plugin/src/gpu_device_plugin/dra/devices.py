"""A node's DRA devices and the interfaces between the kubelet side and the API side.

A device is a whole GPU, or, for a GPU in MIG mode with MIG devices, each of its MIG devices (the
parent is then not a device: its memory is split among them). Device names are DNS labels, the names
NVIDIA's DRA driver gives: ``gpu-<number>`` and ``gpu-<number>-mig-<profile>-<GPU-instance profile
ID>-<first memory slice>`` (the profile without its dots, e.g. ``gpu-0-mig-1g5gb-19-0``), where a GPU's
number is bound to its UUID once and for all (names.py: its minor number when first seen, as NVIDIA's
driver numbers GPUs), so that a name keeps naming the same physical GPU when NVML indices shift. A MIG
device whose placement NVML does not give is ``gpu-<number>-mig-<MIG index>``, the name earlier
versions gave every MIG device, which a claim allocated before an upgrade may still carry: such names
are aliases when a claim is prepared. The ResourceSlice publishes the devices under their names, the
scheduler writes them into a claim's allocation, and NodePrepareResources finds the GPU again by the name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence

from gpu_device_plugin.inventory import Gpu, Inventory, MigDevice

DEFAULT_DRIVER_NAME = "gpu.gpuops.k8s"


@dataclass(frozen=True)
class DraDevice:
    name: str
    gpu: Gpu
    mig: Optional[MigDevice] = None
    legacy_name: Optional[str] = None  # the name an earlier version gave it, where that differs

    @property
    def uuid(self) -> str:
        """What the container runtime is told (NVIDIA_VISIBLE_DEVICES): the MIG UUID or the GPU UUID."""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid

    @property
    def memory_mib(self) -> int:
        return self.mig.memory_mib if self.mig is not None else self.gpu.memory_mib


def _dns_label_part(text: str) -> str:
    """A MIG profile as NVIDIA's driver puts it into a device name: no dots, lower case, anything but
    letters, digits and dashes a dash, no dash at either end (`1g.5gb+me` -> `1g5gb-me`)."""
    return re.sub(r"[^a-z0-9-]", "-", text.replace(".", "").lower()).strip("-")


def legacy_mig_name(number: int, mig: MigDevice) -> str:
    """The name earlier versions gave a MIG device: its position among its GPU's MIG devices."""
    return f"gpu-{number}-mig-{mig.index}"


def device_name(number: int, mig: Optional[MigDevice] = None) -> str:
    if mig is None:
        return f"gpu-{number}"
    if mig.profile_id is None or mig.placement_start is None:
        return legacy_mig_name(number, mig)
    return f"gpu-{number}-mig-{_dns_label_part(mig.profile)}-{mig.profile_id}-{mig.placement_start}"


def dra_devices(inventory: Inventory, numbers: Optional[Mapping[str, int]] = None) -> list[DraDevice]:
    """The node's devices in order of their names' numbers. `numbers`: GPU UUID -> the number in its
    devices' names (names.DeviceNumbers); without it, or for a GPU it lacks, the NVML index."""
    numbered = [((numbers or {}).get(g.uuid, g.index), g) for g in inventory.gpus]
    devices: list[DraDevice] = []
    for number, gpu in sorted(numbered, key=lambda pair: (pair[0], pair[1].index)):
        if gpu.mig_mode == "enabled" and gpu.mig_devices:
            for mig in sorted(gpu.mig_devices, key=lambda m: m.index):
                name, legacy = device_name(number, mig), legacy_mig_name(number, mig)
                devices.append(DraDevice(name, gpu, mig, legacy if legacy != name else None))
        else:
            devices.append(DraDevice(device_name(number), gpu))
    return devices


def by_name(devices: Sequence[DraDevice]) -> dict[str, DraDevice]:
    return {d.name: d for d in devices}


def with_legacy_names(devices: Mapping[str, DraDevice]) -> dict[str, DraDevice]:
    """The devices by name, and the MIG devices also by the names earlier versions gave them (for a claim
    the scheduler allocated from an earlier version's slice)."""
    aliases = {d.legacy_name: d for d in devices.values() if d.legacy_name and d.legacy_name not in devices}
    return {**aliases, **devices}


class ClaimReader(Protocol):
    """Reads a ResourceClaim from the API server (the API side implements it)."""

    def get_resource_claim(self, namespace: str, name: str) -> Optional[Mapping[str, Any]]:
        """The claim as JSON in the `resource.k8s.io/v1` shape (``status.allocation.devices.results[]``
        with ``driver``, ``pool``, ``device``, ``request``), or None when it does not exist. Raises
        `OSError` (or a subclass) when the API server cannot be asked or refuses. With the node's own
        credentials the Node authorizer refuses (403) a claim no pod bound to this node uses, and so
        also one that no longer exists: `kubeapi.KubeApiError` carries the status."""


class SlicePublisher(Protocol):
    """Keeps this node's ResourceSlice(s) equal to the devices given (the API side implements it)."""

    def publish(self, devices: Sequence[DraDevice], unhealthy: frozenset[str], inventory: Inventory) -> bool:
        """Create or update the slice(s); `unhealthy` holds the device names to mark or leave out. Returns
        whether anything was written (the pool generation is bumped then). Idempotent."""

    def reconcile(self) -> bool:
        """Publish the last devices given again where the server's slices differ (someone deleted them:
        the kubelet does when it starts); call it periodically. Returns whether anything was written."""

    def delete_all(self) -> None:
        """Delete this driver's slices for this node (switching the node back to device-plugin mode)."""
