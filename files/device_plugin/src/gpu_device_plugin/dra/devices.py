"""A node's DRA devices and the interfaces between the kubelet side and the API side.

A device is a whole GPU, or, for a GPU in MIG mode with MIG devices, each of its MIG devices (the
parent is then not a device: its memory is split among them). Device names are DNS labels:
``gpu-<number>`` and ``gpu-<number>-mig-<MIG index>``, where a GPU's number is bound to its UUID once
and for all (names.py: its NVML index when first seen), so that a name keeps naming the same physical
GPU when NVML indices shift. The ResourceSlice publishes them under these names, the scheduler writes
them into a claim's allocation, and NodePrepareResources finds the GPU again by the name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence

from gpu_device_plugin.inventory import Gpu, Inventory, MigDevice

DEFAULT_DRIVER_NAME = "gpu.gpuops.k8s"


@dataclass(frozen=True)
class DraDevice:
    name: str
    gpu: Gpu
    mig: Optional[MigDevice] = None

    @property
    def uuid(self) -> str:
        """What the container runtime is told (NVIDIA_VISIBLE_DEVICES): the MIG UUID or the GPU UUID."""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid

    @property
    def memory_mib(self) -> int:
        return self.mig.memory_mib if self.mig is not None else self.gpu.memory_mib


def device_name(number: int, mig: Optional[MigDevice] = None) -> str:
    return f"gpu-{number}" if mig is None else f"gpu-{number}-mig-{mig.index}"


def dra_devices(inventory: Inventory, numbers: Optional[Mapping[str, int]] = None) -> list[DraDevice]:
    """The node's devices in order of their names' numbers. `numbers`: GPU UUID -> the number in its
    devices' names (names.DeviceNumbers); without it, or for a GPU it lacks, the NVML index."""
    numbered = [((numbers or {}).get(g.uuid, g.index), g) for g in inventory.gpus]
    devices: list[DraDevice] = []
    for number, gpu in sorted(numbered, key=lambda pair: (pair[0], pair[1].index)):
        if gpu.mig_mode == "enabled" and gpu.mig_devices:
            devices.extend(
                DraDevice(device_name(number, m), gpu, m) for m in sorted(gpu.mig_devices, key=lambda m: m.index)
            )
        else:
            devices.append(DraDevice(device_name(number), gpu))
    return devices


def by_name(devices: Sequence[DraDevice]) -> dict[str, DraDevice]:
    return {d.name: d for d in devices}


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
