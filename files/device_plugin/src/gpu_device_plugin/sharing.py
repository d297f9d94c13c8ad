"""From GPUs to advertised devices: MIG strategies, time-slicing replicas, device ID strategies.

The result is one `ResourcePlan` per extended resource (one kubelet registration each)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from gpu_device_plugin.config import DEFAULT_RESOURCE, Config, TimeSlicedResource
from gpu_device_plugin.inventory import Gpu, Inventory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginDevice:
    id: str  # what the kubelet sees
    target: str  # what the container runtime is told: a UUID or an index ("0", "1:0" for MIG)
    gpu_uuid: str  # the physical GPU; health and topology come from it
    minor_number: int
    numa_node: Optional[int]
    mig_uuid: Optional[str] = None
    replica: Optional[int] = None


@dataclass(frozen=True)
class ResourcePlan:
    name: str
    devices: tuple[PluginDevice, ...]
    replicas: int = 1
    fail_requests_greater_than_one: bool = False

    def by_id(self) -> dict[str, PluginDevice]:
        return {d.id: d for d in self.devices}


def socket_name(resource: str) -> str:
    """`nvidia.com/mig-1g.10gb` -> `gpuops-nvidia.com-mig-1g.10gb.sock`."""
    return "gpuops-" + resource.replace("/", "-") + ".sock"


def _whole(gpu: Gpu, config: Config) -> PluginDevice:
    target = gpu.uuid if config.device_id_strategy == "uuid" else str(gpu.index)
    return PluginDevice(target, target, gpu.uuid, gpu.minor_number, gpu.numa_node)


def _migs(gpu: Gpu, config: Config) -> list[tuple[str, PluginDevice]]:
    out = []
    for mig in gpu.mig_devices:
        target = mig.uuid if config.device_id_strategy == "uuid" else f"{gpu.index}:{mig.index}"
        out.append((mig.profile, PluginDevice(target, target, gpu.uuid, gpu.minor_number, gpu.numa_node, mig.uuid)))
    return out


def mig_resource_name(profile: str) -> str:
    """The resource of a MIG profile in the mixed strategy: `+` is no character of a resource name, so a
    media-extension profile is spelled with a dot (`1g.10gb+me` -> `nvidia.com/mig-1g.10gb.me`), as NVIDIA's
    plugin and GPU Feature Discovery's labels spell it."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def plan(inventory: Inventory, config: Config) -> dict[str, ResourcePlan]:
    """Resources to advertise, in a stable order; `nvidia.com/gpu` (or its shared name) is always there."""
    base: list[PluginDevice] = []
    extra: dict[str, list[PluginDevice]] = {}
    mig_gpus = [g for g in inventory.gpus if g.mig_mode == "enabled"]
    if config.mig_strategy == "none":
        base = [_whole(g, config) for g in inventory.gpus]
    elif config.mig_strategy == "single":
        profiles = {m.profile for g in mig_gpus for m in g.mig_devices}
        if len(mig_gpus) != len(inventory.gpus) or len(profiles) > 1:
            log.error(
                "mig strategy single needs every GPU in MIG mode with one MIG profile; advertising no GPUs",
                extra={"mig_gpus": [g.uuid for g in mig_gpus], "profiles": sorted(profiles)},
            )
        else:
            base = [d for g in inventory.gpus for _profile, d in _migs(g, config)]
    else:  # mixed
        for gpu in inventory.gpus:
            if gpu.mig_mode == "enabled":
                for profile, device in _migs(gpu, config):
                    extra.setdefault(mig_resource_name(profile), []).append(device)
            else:
                base.append(_whole(gpu, config))
    plans = _time_sliced(base, inventory, config)
    for name in sorted(extra):
        plans[name] = ResourcePlan(name, tuple(extra[name]))
    return plans


def _selected(device: PluginDevice, inventory: Inventory, wanted: Optional[tuple[str, ...]]) -> bool:
    if wanted is None:
        return True
    gpu = inventory.by_uuid().get(device.gpu_uuid)
    keys = {device.gpu_uuid, device.target, device.mig_uuid or ""}
    if gpu is not None:
        keys.add(str(gpu.index))
    return bool(keys & set(wanted))


def _time_sliced(base: list[PluginDevice], inventory: Inventory, config: Config) -> dict[str, ResourcePlan]:
    ts = config.time_slicing
    rule: Optional[TimeSlicedResource] = ts.resources[0] if ts.resources else None
    if rule is None or rule.replicas < 2:
        return {DEFAULT_RESOURCE: ResourcePlan(DEFAULT_RESOURCE, tuple(base))}
    shared_name = rule.rename or (f"{DEFAULT_RESOURCE}.shared" if ts.rename_by_default else DEFAULT_RESOURCE)
    shared: list[PluginDevice] = []
    plain: list[PluginDevice] = []
    for device in base:
        if _selected(device, inventory, rule.devices):
            for n in range(rule.replicas):
                shared.append(
                    PluginDevice(
                        f"{device.id}::{n}",
                        device.target,
                        device.gpu_uuid,
                        device.minor_number,
                        device.numa_node,
                        device.mig_uuid,
                        n,
                    )
                )
        else:
            plain.append(device)
    plans: dict[str, ResourcePlan] = {}
    if shared_name == DEFAULT_RESOURCE:
        plans[DEFAULT_RESOURCE] = ResourcePlan(
            DEFAULT_RESOURCE, tuple(plain + shared), rule.replicas, ts.fail_requests_greater_than_one
        )
    else:
        plans[DEFAULT_RESOURCE] = ResourcePlan(DEFAULT_RESOURCE, tuple(plain))
        plans[shared_name] = ResourcePlan(shared_name, tuple(shared), rule.replicas, ts.fail_requests_greater_than_one)
    return plans
