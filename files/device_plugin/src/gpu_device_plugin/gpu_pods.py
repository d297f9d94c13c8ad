"""Which pods of this node hold devices of given GPUs: the kubelet's pod-resources API (v1 List) read
against the daemon's own discovery, for `gpu-device-plugin gpu-pods` (the nvidia_mig role asks before it
changes a GPU's MIG layout, to evict those pods first).

A device-plugin device ID names its GPU the way `sharing.py` makes IDs: a GPU or MIG device UUID, or an
index (`0`, `1:0` for MIG device 0 of GPU 1), with `::<n>` after it for time-slicing replica n. A UUID
names its GPU whichever plugin advertised it (NVIDIA's uses the same forms), so UUID IDs count under any
resource name; an index only under the resource names this daemon's configuration gives. A DRA device
counts when the claim's allocation names this daemon's driver (and its pool, the node's name, when the
configuration names the node): its name `gpu-<number>[-mig-<i>]` gives the GPU through the numbers the
daemon bound to GPU UUIDs (dra/names.py), read without writing anything."""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import grpc

from gpu_device_plugin.api import podresources_v1_pb2, podresources_v1_pb2_grpc
from gpu_device_plugin.config import DEFAULT_POD_RESOURCES_SOCKET, DEFAULT_RESOURCE, Config
from gpu_device_plugin.dra.devices import by_name, dra_devices, with_legacy_names
from gpu_device_plugin.dra.names import DeviceNumbers, number_in
from gpu_device_plugin.inventory import Inventory
from gpu_device_plugin.sharing import plan

log = logging.getLogger(__name__)

DEFAULT_SOCKET = DEFAULT_POD_RESOURCES_SOCKET
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_REPLICA = re.compile(r"::[0-9]+$")


class GpuPodsError(RuntimeError):
    """The question cannot be answered; the message is one sentence."""


@dataclass(frozen=True)
class DeviceMap:
    """What names which GPU on this node (GPU UUIDs as values throughout)."""

    by_uuid: dict[str, str]  # GPU and MIG device UUIDs
    by_index: dict[str, str]  # "0", "1:0"
    resources: frozenset[str]  # resource names whose index IDs are ours
    driver: str
    pool: str  # "" accepts any pool of the driver
    by_dra_number: dict[int, str]
    # A MIG device's device-plugin IDs (its UUID, "1:0") -> its UUID
    mig_devices: dict[str, str] = field(default_factory=dict)
    # A MIG device's DRA device names (and the name an earlier version gave it) -> its UUID and profile
    dra_migs: dict[str, tuple[str, str]] = field(default_factory=dict)

    def ours(self, resource: str) -> bool:
        return resource in self.resources or resource.startswith(MIG_RESOURCE_PREFIX)

    def device_plugin_gpu(self, resource: str, device_id: str) -> Optional[str]:
        target = _REPLICA.sub("", device_id)
        if target in self.by_uuid:
            return self.by_uuid[target]
        return self.by_index.get(target) if self.ours(resource) else None

    def mig_device(self, resource: str, device_id: str) -> Optional[str]:
        """The MIG device a device-plugin device ID names (a replica's too), by its UUID; None for another ID."""
        target = _REPLICA.sub("", device_id)
        if target in self.by_uuid and target != self.by_uuid[target]:
            return target
        return self.mig_devices.get(target) if ":" in target and self.ours(resource) else None

    def whole_gpu(self, resource: str, device_id: str) -> Optional[str]:
        """The GPU a device-plugin device ID names when it is the GPU itself or a replica of it, not a MIG device."""
        target = _REPLICA.sub("", device_id)
        gpu = self.device_plugin_gpu(resource, device_id)
        whole = target == gpu or (":" not in target and target in self.by_index)
        return gpu if gpu is not None and whole else None

    def dra_gpu(self, driver: str, pool: str, device: str) -> Optional[str]:
        if not self._dra_ours(driver, pool):
            return None
        number = number_in(device)
        return None if number is None else self.by_dra_number.get(number)

    def dra_mig(self, driver: str, pool: str, device: str) -> Optional[tuple[str, str]]:
        """The MIG device (its UUID and profile) a DRA device of this daemon's driver names; None for another."""
        return self.dra_migs.get(device) if self._dra_ours(driver, pool) else None

    def _dra_ours(self, driver: str, pool: str) -> bool:
        return driver == self.driver and (not self.pool or pool == self.pool)


def resource_names(inventory: Inventory, config: Config) -> frozenset[str]:
    """Every resource name this daemon advertises now, or would with the time-slicing rule's names."""
    names = set(plan(inventory, config)) | {DEFAULT_RESOURCE}
    slicing = config.time_slicing
    for rule in slicing.resources:
        names.add(rule.rename or (f"{DEFAULT_RESOURCE}.shared" if slicing.rename_by_default else DEFAULT_RESOURCE))
    return frozenset(names)


def device_map(inventory: Inventory, config: Config) -> DeviceMap:
    by_uuid: dict[str, str] = {}
    by_index: dict[str, str] = {}
    mig_devices: dict[str, str] = {}
    for gpu in inventory.gpus:
        by_uuid[gpu.uuid] = gpu.uuid
        by_index[str(gpu.index)] = gpu.uuid
        for mig in gpu.mig_devices:
            by_uuid[mig.uuid] = gpu.uuid
            by_index[f"{gpu.index}:{mig.index}"] = gpu.uuid
            mig_devices[f"{gpu.index}:{mig.index}"] = mig.uuid
    numbers = DeviceNumbers(config.dra_plugin_dir).peek(inventory)
    named = with_legacy_names(by_name(dra_devices(inventory, numbers)))
    dra_migs = {name: (d.mig.uuid, d.mig.profile) for name, d in named.items() if d.mig is not None}
    return DeviceMap(
        by_uuid,
        by_index,
        resource_names(inventory, config),
        config.driver_name,
        config.node_name,
        {number: uuid for uuid, number in numbers.items()},
        mig_devices,
        dra_migs,
    )


def list_pod_resources(socket: str, timeout: float) -> Any:
    """The kubelet's answer to List, over its unix socket."""
    try:
        mode = os.stat(socket).st_mode
    except FileNotFoundError:
        raise GpuPodsError(
            f"the kubelet's pod-resources socket {socket} does not exist (is the kubelet running on this node?)."
        ) from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise GpuPodsError(f"cannot reach the kubelet's pod-resources socket {socket}: {reason}.") from None
    if not stat.S_ISSOCK(mode):
        raise GpuPodsError(f"{socket} is not a unix socket, so not the kubelet's pod-resources socket.")
    with grpc.insecure_channel(f"unix://{os.path.abspath(socket)}") as channel:
        stub = podresources_v1_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        try:
            return stub.List(podresources_v1_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            detail = " ".join(str(exc.details() or "no detail").split()).rstrip(".")
            raise GpuPodsError(
                f"the kubelet's pod-resources API on {socket} refused List: {exc.code().name} ({detail})."
            ) from None


def pods_on_gpus(response: Any, devices: DeviceMap, gpus: Sequence[str]) -> list[dict[str, Any]]:
    """The pods of a List answer that hold a device of any of `gpus`, ordered by namespace and name."""
    wanted = set(gpus)
    found: list[dict[str, Any]] = []
    for pod in response.pod_resources:
        containers: list[str] = []
        held: set[str] = set()
        claims: dict[tuple[str, str], None] = {}
        for container in pod.containers:
            here: set[str] = set()
            for entry in container.devices:
                for device_id in entry.device_ids:
                    gpu = devices.device_plugin_gpu(entry.resource_name, device_id)
                    if gpu is None and devices.ours(entry.resource_name):
                        where = {"pod": f"{pod.namespace}/{pod.name}", "resource": entry.resource_name}
                        log.warning("a device of ours on no GPU of this node", extra=dict(where, id=device_id))
                    if gpu in wanted:
                        here.add(gpu)
            for dynamic in container.dynamic_resources:
                for resource in dynamic.claim_resources:
                    gpu = devices.dra_gpu(resource.driver_name, resource.pool_name, resource.device_name)
                    if gpu in wanted:
                        here.add(gpu)
                        claims[(dynamic.claim_namespace or pod.namespace, dynamic.claim_name)] = None
            if here:
                containers.append(container.name)
                held |= here
        if held:
            found.append(
                {
                    "namespace": pod.namespace,
                    "name": pod.name,
                    "uid": None,  # the pod-resources API does not carry it
                    "containers": containers,
                    "gpus": sorted(held),
                    "claims": [{"namespace": ns, "name": name} for ns, name in claims],
                }
            )
    return sorted(found, key=lambda p: (p["namespace"], p["name"]))


LabelSet = tuple[tuple[str, str], ...]


def holders_by_gpu(response: Any, devices: DeviceMap) -> dict[str, list[LabelSet]]:
    """Who holds each GPU and MIG device of a List answer, as dcgm-exporter labels their series: per GPU or MIG
    device UUID, a label set per container holding it (a device-plugin device, a time-slicing replica, or a DRA
    claim's GPU or MIG device) in the order of the answer: `pod`, `namespace`, `container`, and for a claim
    `dra_claim_name`, `dra_claim_namespace`, `dra_driver_name`, `dra_pool_name`, `dra_device_name`, with
    `dra_mig_profile` and `dra_mig_device_uuid` after them for a claim's MIG device (held on the MIG device's own
    series, as a device-plugin MIG device is). A container holding several replicas of one device is one holder."""
    held: dict[str, dict[LabelSet, None]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            holder: LabelSet = (("pod", pod.name), ("namespace", pod.namespace), ("container", container.name))
            for entry in container.devices:
                for device_id in entry.device_ids:
                    target = devices.mig_device(entry.resource_name, device_id) or devices.whole_gpu(
                        entry.resource_name, device_id
                    )
                    if target is not None:
                        held.setdefault(target, {})[holder] = None
            for dynamic in container.dynamic_resources:
                for resource in dynamic.claim_resources:
                    mig = devices.dra_mig(resource.driver_name, resource.pool_name, resource.device_name)
                    if mig is not None:
                        claimed: Optional[str] = mig[0]
                        of_mig: LabelSet = (("dra_mig_profile", mig[1]), ("dra_mig_device_uuid", mig[0]))
                    elif "-mig-" in resource.device_name:
                        continue  # a MIG device no longer in the node's layout
                    else:
                        claimed = devices.dra_gpu(resource.driver_name, resource.pool_name, resource.device_name)
                        of_mig = ()
                    if claimed is None:
                        continue
                    claim: LabelSet = (
                        ("dra_claim_name", dynamic.claim_name),
                        ("dra_claim_namespace", dynamic.claim_namespace or pod.namespace),
                        ("dra_driver_name", resource.driver_name),
                        ("dra_pool_name", resource.pool_name),
                        ("dra_device_name", resource.device_name),
                        *of_mig,
                    )
                    held.setdefault(claimed, {})[holder + claim] = None
    return {gpu: list(sets) for gpu, sets in held.items()}
