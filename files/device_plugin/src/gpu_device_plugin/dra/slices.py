"""This node's ResourceSlices: what the scheduler allocates from.

One pool per node, named after the node, published by one driver. Each device carries the attributes
and capacity a claim selects on with CEL (`device.attributes["<driver>"].productName`,
`device.capacity["<driver>"].memory`). The slices name the node (`spec.nodeName`) and are owned by
the Node object, so they go when the Node goes. Every change of content bumps `pool.generation` in
all slices of the pool (the scheduler only trusts the newest generation) and `resourceSliceCount`
says how many slices the pool has.

An unhealthy device stays in the slice with `health: Unhealthy` and a NoSchedule device taint
(`<driver>/unhealthy`), so no new claim lands on it while the claims already holding it still find
it. Device taints are on by default from Kubernetes 1.36; a server that drops them (an older one, or
the DRADeviceTaints gate off) gets the unhealthy devices left out of the slice instead.

Writes happen only when what the server holds differs from what is wanted (`publish` and
`reconcile` list the slices first), so both are idempotent. `reconcile` republishes the last devices
given: the daemon calls it periodically, which re-creates slices someone deleted (the kubelet
deletes a node's slices when it starts)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from gpu_device_plugin.dra.devices import DEFAULT_DRIVER_NAME, ClaimReader, DraDevice, SlicePublisher
from gpu_device_plugin.dra.kubeapi import KubeApi, KubeApiError
from gpu_device_plugin.inventory import Inventory

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128  # ResourceSliceMaxDevices
MAX_TAINTED_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures
MAX_ATTRIBUTE_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength
STANDARD_PREFIX = "resource.kubernetes.io/"
# On every slice this driver writes: how the role (and anyone) tells its slices from another driver's of the same
# name (NVIDIA's, where both could be called gpu.nvidia.com).
LABELS = {"app.kubernetes.io/managed-by": "gpuops.k8s"}
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
_BINARY_SUFFIXES = ("Mi", "Gi", "Ti", "Pi", "Ei")


# -- what a device looks like in the API ---------------------------------------------------------
# Kubernetes' limit on the attributes and capacities of one device together
# (ResourceSliceMaxAttributesAndCapacitiesPerDevice).
MAX_ATTRIBUTES_AND_CAPACITIES = 32
# The architecture families (_shared/gpu_discovery's names) as NVIDIA's go-nvlib names NVML's architectures, which
# NVIDIA's DRA driver publishes; a family NVML names otherwise, or not at all, is Unknown there too.
ARCHITECTURE_NAMES = {
    "kepler": "Kepler",
    "maxwell": "Maxwell",
    "pascal": "Pascal",
    "volta": "Volta",
    "turing": "Turing",
    "ampere": "Ampere",
    "ada-lovelace": "Ada Lovelace",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
}
# A MIG device's capacities by its GPU instance's engines, as NVIDIA's DRA driver names them.
MIG_ENGINE_CAPACITIES = (
    ("multiprocessors", "multiprocessors"),
    ("copyEngines", "copy_engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpeg_engines"),
    ("ofaEngines", "ofa_engines"),
)


def quantity(value: int) -> str:
    """A whole number as the API server writes a binary quantity (its canonical form): the largest binary
    suffix that keeps the number whole, e.g. 14, 1Ki, 81559Mi, 40Gi."""
    if value == 0:
        return "0"
    suffixes = ("", "Ki", *_BINARY_SUFFIXES)
    suffix = 0
    while value % 1024 == 0 and suffix < len(suffixes) - 1:
        value //= 1024
        suffix += 1
    return f"{value}{suffixes[suffix]}"


def mib_quantity(mib: int) -> str:
    """A number of MiB as the API server writes the quantity of its bytes, e.g. 81559Mi, 80Gi, 0."""
    return quantity(mib * 1024 * 1024)


def semver(text: str) -> Optional[str]:
    """A dotted version as the semantic version the API takes (MAJOR.MINOR.PATCH, no leading zeros):
    "9.0" -> "9.0.0", "580.95.05" -> "580.95.5"; None when it is not numeric."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


def pci_bus_id(text: str) -> str:
    """NVML's bus ID ("00000000:18:00.0") in the extended BDF form the standard attribute uses
    ("0000:18:00.0"), lower case."""
    parts = text.strip().lower().split(":")
    if len(parts) == 3:
        with contextlib.suppress(ValueError):
            parts[0] = format(int(parts[0], 16), "04x")
    return ":".join(parts)


def _string(value: str) -> dict[str, str]:
    return {"string": value[:MAX_ATTRIBUTE_VALUE_LENGTH]}


def device_attributes(device: DraDevice, inventory: Inventory, healthy: bool) -> dict[str, dict[str, Any]]:
    """The device's attributes: the names, types and values NVIDIA's DRA driver publishes (docs/compared-dra.md),
    and `health`. Bare names are in the driver's domain (CEL: `device.attributes["<driver>"].<name>`);
    `resource.kubernetes.io/` names are the standard ones that constraints can match across drivers. A MIG
    device carries its parent GPU's."""
    gpu = device.gpu
    attributes: dict[str, dict[str, Any]] = {
        "type": _string("mig" if device.mig is not None else "gpu"),
        "uuid": _string(device.uuid),
        "productName": _string(gpu.name),
        "architecture": _string(ARCHITECTURE_NAMES.get(gpu.architecture, "Unknown")),
        "health": _string(HEALTHY if healthy else UNHEALTHY),
        STANDARD_PREFIX + "pciBusID": _string(pci_bus_id(gpu.pci_bus_id)),
    }
    if gpu.brand is not None:
        attributes["brand"] = _string(gpu.brand)
    versions = (
        ("cudaComputeCapability", gpu.compute_capability),
        ("driverVersion", inventory.driver_version),
        ("cudaDriverVersion", inventory.cuda_driver_version),
    )
    for name, text in versions:
        version = semver(text)
        if version is not None:
            attributes[name] = {"version": version}
    if gpu.pcie_root is not None:
        attributes[STANDARD_PREFIX + "pcieRoot"] = _string(gpu.pcie_root)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attributes[STANDARD_PREFIX + "numaNode"] = {"int": gpu.numa_node}
    if device.mig is not None:
        attributes["profile"] = _string(device.mig.profile)
        attributes["parentUUID"] = _string(gpu.uuid)
    return attributes


def device_capacity(device: DraDevice) -> dict[str, dict[str, str]]:
    """The device's capacities as NVIDIA's DRA driver publishes them: a GPU's `memory`; a MIG device's memory,
    its GPU instance's engines (where NVML gives them) and `memorySlice<i>` 1 for each memory slice it holds."""
    capacity = {"memory": {"value": mib_quantity(device.memory_mib)}}
    mig = device.mig
    if mig is None:
        return capacity
    for name, field in MIG_ENGINE_CAPACITIES:
        value = getattr(mig, field)
        if value is not None:
            capacity[name] = {"value": quantity(value)}
    if mig.placement_start is not None and mig.placement_size is not None:
        for memory_slice in range(mig.placement_start, mig.placement_start + mig.placement_size):
            capacity[f"memorySlice{memory_slice}"] = {"value": "1"}
    return capacity


def device_entry(device: DraDevice, inventory: Inventory, healthy: bool, driver: str, taint: bool) -> dict[str, Any]:
    """One `spec.devices[]` entry (v1 shape)."""
    entry: dict[str, Any] = {
        "name": device.name,
        "attributes": device_attributes(device, inventory, healthy),
        "capacity": device_capacity(device),
    }
    if len(entry["attributes"]) + len(entry["capacity"]) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise ValueError(
            f"device {device.name} would have {len(entry['attributes'])} attributes and {len(entry['capacity'])}"
            f" capacities, more than the {MAX_ATTRIBUTES_AND_CAPACITIES} Kubernetes allows a device."
        )
    if not healthy and taint:
        entry["taints"] = [{"key": f"{driver}/unhealthy", "value": UNHEALTHY, "effect": "NoSchedule"}]
    return entry


def wanted_devices(
    devices: Sequence[DraDevice], unhealthy: frozenset[str], inventory: Inventory, driver: str, taints: bool
) -> list[dict[str, Any]]:
    """The `spec.devices` of the pool: every device, the unhealthy ones tainted; without taints the
    unhealthy ones are left out."""
    return [
        device_entry(d, inventory, d.name not in unhealthy, driver, taints)
        for d in devices
        if taints or d.name not in unhealthy
    ]


def chunks(devices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The devices split into slices within the API's limits; a pool always has at least one slice
    (an empty pool is not the same as no pool)."""
    size = MAX_TAINTED_DEVICES_PER_SLICE if any("taints" in d for d in devices) else MAX_DEVICES_PER_SLICE
    return [devices[i : i + size] for i in range(0, len(devices), size)] or [[]]


def _without_taint_times(devices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Devices as compared: the server stamps each taint with timeAdded, which is no content."""
    out = []
    for device in devices:
        copy = dict(device)
        if "taints" in copy:
            copy["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"} for t in copy["taints"]]
        out.append(copy)
    return out


def _keep_taint_times(wanted: list[dict[str, Any]], current: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The wanted devices with the timeAdded the server gave each taint that stays."""
    added = {
        (d.get("name"), t.get("key"), t.get("effect")): t["timeAdded"]
        for d in current
        for t in d.get("taints") or []
        if t.get("timeAdded")
    }
    out = []
    for device in wanted:
        if "taints" in device:
            device = dict(device)
            device["taints"] = [
                dict(t, timeAdded=added[(device["name"], t["key"], t["effect"])])
                if (device["name"], t["key"], t["effect"]) in added
                else t
                for t in device["taints"]
            ]
        out.append(device)
    return out


# -- the publisher -------------------------------------------------------------------------------
class ResourceSlices:
    """Keeps this node's pool equal to the devices given (the `SlicePublisher`). Thread-safe; every
    method does blocking API calls (run them off the event loop) and raises KubeApiError (an
    OSError) when the API server cannot be asked or refuses."""

    def __init__(self, api: KubeApi, node_name: str, driver: str = DEFAULT_DRIVER_NAME) -> None:
        self.api = api
        self.node_name = node_name
        self.driver = driver
        self.taints = True  # until the server is seen dropping them
        self.writes = 0  # slices created, updated or deleted so far
        self._lock = threading.Lock()
        self._wanted: Optional[tuple[Sequence[DraDevice], frozenset[str], Inventory]] = None
        self._generation = 0  # the last pool generation written

    def publish(self, devices: Sequence[DraDevice], unhealthy: frozenset[str], inventory: Inventory) -> bool:
        """Make the pool hold these devices; True when anything was written (the generation is then
        bumped). When it raises, the devices are still remembered and the next `reconcile` tries again."""
        with self._lock:
            self._wanted = (tuple(devices), frozenset(unhealthy), inventory)
            return self._sync()

    def reconcile(self) -> bool:
        """Publish the last devices given again if the server's slices differ from them (deleted,
        edited); True when anything was written. Nothing to do before the first `publish`."""
        with self._lock:
            return self._wanted is not None and self._sync()

    def delete_all(self) -> None:
        """Delete this driver's slices of this node; the next `reconcile` does nothing until
        `publish` is called again."""
        with self._lock:
            self._wanted = None
            for item in self.api.list_resource_slices(self.node_name, self.driver):
                self.api.delete_resource_slice(item["metadata"]["name"])
                self.writes += 1
                log.info("ResourceSlice deleted", extra={"slice": item["metadata"]["name"], "node": self.node_name})

    # -- internals -------------------------------------------------------------------------------
    def _owner(self) -> dict[str, Any]:
        # Read every time: a Node deleted and registered again has a new UID, and slices owned by the
        # old one would be garbage-collected.
        node = self.api.get_node(self.node_name)
        if node is None:
            raise KubeApiError(
                f"cannot publish ResourceSlices for node {self.node_name}: the Node object does not exist.", 404
            )
        uid = str(node["metadata"]["uid"])
        return {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid, "controller": True}

    def _sync(self) -> bool:
        attempt, attempts = 0, 3
        while True:
            attempt += 1
            try:
                written = self._sync_once()
            except KubeApiError as exc:
                # 409: someone else wrote in between. 403 on a slice just created: the Node authorizer
                # learns of new slices from a watch, a moment after they exist. Read again and retry.
                if exc.status not in (403, 409) or attempt == attempts:
                    raise
                log.info("ResourceSlice write refused; reading again", extra={"reason": str(exc), "attempt": attempt})
                time.sleep(0.5 * attempt)
                continue
            if written and self.taints and not self._server_kept_taints():
                log.warning(
                    "the API server drops device taints (DRADeviceTaints is off there): unhealthy devices are left "
                    "out of the ResourceSlice instead",
                    extra={"node": self.node_name},
                )
                self.taints = False
                self._sync_once()
            return written

    def _server_kept_taints(self) -> bool:
        wanted = self._wanted_devices()
        if not any("taints" in d for d in wanted):
            return True
        current = [d for s in self.api.list_resource_slices(self.node_name, self.driver) for d in s["spec"]["devices"]]
        return sum(1 for d in current if d.get("taints")) == sum(1 for d in wanted if "taints" in d)

    def _wanted_devices(self) -> list[dict[str, Any]]:
        assert self._wanted is not None
        devices, unhealthy, inventory = self._wanted
        return wanted_devices(devices, unhealthy, inventory, self.driver, self.taints)

    def _sync_once(self) -> bool:
        owner = self._owner()
        current = sorted(
            self.api.list_resource_slices(self.node_name, self.driver), key=lambda s: s["metadata"]["name"]
        )
        current_devices = [d for s in current for d in s["spec"].get("devices") or []]
        pieces = chunks(_keep_taint_times(self._wanted_devices(), current_devices))
        if self._up_to_date(current, pieces, owner):
            return False
        # Never back: a pool wiped and published again continues from the last generation written.
        generation = 1 + max([self._generation, *(int(s["spec"]["pool"].get("generation", 0)) for s in current)])
        pool = {"name": self.node_name, "generation": generation, "resourceSliceCount": len(pieces)}
        for index, devices in enumerate(pieces):
            spec = {"driver": self.driver, "nodeName": self.node_name, "pool": pool, "devices": devices}
            if index < len(current):
                metadata = dict(current[index]["metadata"])
                metadata["ownerReferences"] = [owner]
                metadata["labels"] = {**(metadata.get("labels") or {}), **LABELS}
                if self.api.update_resource_slice({"metadata": metadata, "spec": spec}) is None:
                    raise KubeApiError(f"ResourceSlice {metadata['name']} was deleted while being updated.", 409)
                name = metadata["name"]
            else:
                metadata = {
                    "generateName": f"{self.node_name}-{self.driver}-",
                    "ownerReferences": [owner],
                    "labels": dict(LABELS),
                }
                name = self.api.create_resource_slice({"metadata": metadata, "spec": spec})["metadata"]["name"]
            self.writes += 1
            log.info(
                "ResourceSlice written",
                extra={"slice": name, "node": self.node_name, "generation": generation, "devices": len(devices)},
            )
        self._generation = generation
        for extra in current[len(pieces) :]:
            self.api.delete_resource_slice(extra["metadata"]["name"])
            self.writes += 1
        return True

    def _up_to_date(
        self, current: list[dict[str, Any]], pieces: list[list[dict[str, Any]]], owner: Mapping[str, Any]
    ) -> bool:
        if len(current) != len(pieces):
            return False
        generations = {s["spec"]["pool"].get("generation") for s in current}
        for item, devices in zip(current, pieces):
            spec = item["spec"]
            if (
                len(generations) != 1
                or spec["pool"].get("name") != self.node_name
                or spec["pool"].get("resourceSliceCount") != len(pieces)
                or spec.get("nodeName") != self.node_name
                or _without_taint_times(spec.get("devices") or []) != _without_taint_times(devices)
                or not any(r.get("uid") == owner["uid"] for r in item["metadata"].get("ownerReferences") or [])
                or any((item["metadata"].get("labels") or {}).get(k) != v for k, v in LABELS.items())
            ):
                return False
        return True


if TYPE_CHECKING:

    def _implements_the_contract(slices: ResourceSlices, api: KubeApi) -> tuple[SlicePublisher, ClaimReader]:
        """mypy checks here that the two classes are what the kubelet side expects."""
        return slices, api
