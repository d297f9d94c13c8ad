"""Allocate answers (the device-list strategies) and preferred allocations (topology-aware choice).

Nothing here talks to a GPU: it works on `ResourcePlan`s, health answers and found driver files."""

from __future__ import annotations

import hashlib
import itertools
import os
from typing import Callable, Optional

from gpu_device_plugin.api import api_pb2
from gpu_device_plugin.config import Config
from gpu_device_plugin.hostdriver import HostDriver
from gpu_device_plugin.inventory import Inventory
from gpu_device_plugin.sharing import PluginDevice, ResourcePlan

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNT_DIR = "/var/run/nvidia-container-devices"
CDI_KIND = "nvidia.com/gpu"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/gpuops-device-plugin_"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CDI_STRATEGIES = ("cdi-annotations", "cdi-cri")


class AllocationError(ValueError):
    """A request the daemon refuses; the message names the offending device IDs."""


def check_request(plan: ResourcePlan, ids: list[str], healthy: Callable[[PluginDevice], bool]) -> list[PluginDevice]:
    """The devices of one container request, or AllocationError saying what is wrong with which IDs."""
    known = plan.by_id()
    unknown = sorted({i for i in ids if i not in known})
    if unknown:
        raise AllocationError(f"unknown device ID(s) for {plan.name}: {', '.join(unknown)}")
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise AllocationError(f"device ID(s) requested more than once: {', '.join(duplicates)}")
    devices = [known[i] for i in ids]
    unhealthy = [d.id for d in devices if not healthy(d)]
    if unhealthy:
        raise AllocationError(f"unhealthy device ID(s): {', '.join(unhealthy)}")
    if plan.fail_requests_greater_than_one and plan.replicas > 1 and len(ids) > 1:
        raise AllocationError(
            f"{plan.name} is time-sliced with failRequestsGreaterThanOne: a container may ask for 1 device,"
            f" not {len(ids)} ({', '.join(ids)})"
        )
    return devices


class ResponseBuilder:
    """Builds ContainerAllocateResponse messages for the configured device-list strategies."""

    def __init__(self, config: Config, host_driver: Optional[HostDriver]) -> None:
        self.strategies = config.device_list_strategy
        self.pass_device_specs = config.pass_device_specs
        self.mounts = config.mounts
        self.host_driver = host_driver
        # The nvidia runtime adds the node's GDRCopy, GDS and MOFED devices for these (none where there are none).
        features = (
            ("NVIDIA_GDRCOPY", config.gdrcopy_enabled),
            ("NVIDIA_GDS", config.gds_enabled),
            ("NVIDIA_MOFED", config.mofed_enabled),
        )
        self.feature_envs = {name: "enabled" for name, on in features if on}
        # With CDI alone, the CDI spec gives the container its device nodes: DeviceSpecs would only repeat them.
        self.cdi_only = all(s in CDI_STRATEGIES for s in self.strategies)

    def build(self, devices: list[PluginDevice]) -> api_pb2.ContainerAllocateResponse:
        # Replicas of one GPU name the same target once.
        targets = list(dict.fromkeys(d.target for d in devices))
        response = api_pb2.ContainerAllocateResponse(envs=self.feature_envs)
        if "envvar" in self.strategies:
            response.envs[VISIBLE_DEVICES] = ",".join(targets)
        if "volume-mounts" in self.strategies:
            response.envs[VISIBLE_DEVICES] = VOLUME_MOUNT_DIR
            for target in targets:
                response.mounts.add(container_path=f"{VOLUME_MOUNT_DIR}/{target}", host_path="/dev/null")
        if "cdi-annotations" in self.strategies:
            key = CDI_ANNOTATION_PREFIX + hashlib.sha256(",".join(targets).encode()).hexdigest()[:16]
            response.annotations[key] = ",".join(f"{CDI_KIND}={t}" for t in targets)
        if "cdi-cri" in self.strategies:
            for target in targets:
                response.cdi_devices.add(name=f"{CDI_KIND}={target}")
        if "mounts" in self.strategies:
            self._host_mounts(response, devices)
        elif self.pass_device_specs and not self.cdi_only:
            self._device_specs(response, devices)
        return response

    def _device_specs(self, response: api_pb2.ContainerAllocateResponse, devices: list[PluginDevice]) -> None:
        driver = self.host_driver
        dev_root = driver.dev_root if driver is not None else "/dev"
        paths = [os.path.join(dev_root, f"nvidia{m}") for m in dict.fromkeys(d.minor_number for d in devices)]
        paths += list(driver.control_devices) if driver is not None else []
        for host_path in paths:
            if os.path.exists(self.mounts.local(host_path)):
                container_path = "/dev/" + os.path.basename(host_path)
                response.devices.add(container_path=container_path, host_path=host_path, permissions="rw")

    def _host_mounts(self, response: api_pb2.ContainerAllocateResponse, devices: list[PluginDevice]) -> None:
        self._device_specs(response, devices)
        driver = self.host_driver
        if driver is None:
            return
        for host_path, name in driver.libraries:
            response.mounts.add(
                container_path=f"{self.mounts.container_lib_dir}/{name}", host_path=host_path, read_only=True
            )
        for host_path, name in driver.binaries:
            response.mounts.add(
                container_path=f"{self.mounts.container_bin_dir}/{name}", host_path=host_path, read_only=True
            )
        response.envs["LD_LIBRARY_PATH"] = self.mounts.container_lib_dir
        response.envs["PATH"] = f"{self.mounts.container_bin_dir}:{DEFAULT_PATH}"


def _pair_score(a: PluginDevice, b: PluginDevice, inventory: Inventory) -> int:
    """How well two devices work together: NVLink over PCIe switch over NUMA node."""
    if a.gpu_uuid == b.gpu_uuid:
        return 0  # two replicas or two MIG slices of one GPU: spread over GPUs first
    gpus = inventory.by_uuid()
    ga, gb = gpus.get(a.gpu_uuid), gpus.get(b.gpu_uuid)
    if ga is None or gb is None:
        return 0
    score = 0
    if gb.uuid in ga.nvlink_peers:
        score += 100
    if ga.pcie_switch is not None and ga.pcie_switch == gb.pcie_switch:
        score += 10
    if ga.numa_node is not None and ga.numa_node == gb.numa_node:
        score += 1
    return score


def preferred(
    plan: ResourcePlan, inventory: Inventory, available: list[str], must_include: list[str], size: int
) -> list[str]:
    """`size` device IDs from `available`, `must_include` first, then the best-connected additions."""
    known = plan.by_id()
    unknown = sorted({i for i in list(available) + list(must_include) if i not in known})
    if unknown:
        raise AllocationError(f"unknown device ID(s) for {plan.name}: {', '.join(unknown)}")
    missing = sorted(set(must_include) - set(available))
    if missing:
        raise AllocationError(f"must-include device ID(s) not among the available ones: {', '.join(missing)}")
    if len(must_include) > size:
        raise AllocationError(
            f"{len(must_include)} must-include device ID(s) ({', '.join(must_include)}) exceed allocation_size {size}"
        )
    chosen = list(dict.fromkeys(must_include))
    pool = [i for i in dict.fromkeys(available) if i not in chosen]
    scores: dict[tuple[str, str], int] = {}

    def score(a: str, b: str) -> int:
        key = (a, b) if a < b else (b, a)
        if key not in scores:
            scores[key] = _pair_score(known[a], known[b], inventory)
        return scores[key]

    def extend(start: list[str], rest: list[str]) -> list[str]:
        """Add the best-connected device, one at a time, until `size` (or `rest` runs out)."""
        picked, rest = list(start), list(rest)
        used_gpus = {known[i].gpu_uuid for i in picked}
        while len(picked) < size and rest:
            pick = max(
                rest,
                key=lambda c: (sum(score(c, o) for o in picked), known[c].gpu_uuid not in used_gpus, -rest.index(c)),
            )
            picked.append(pick)
            used_gpus.add(known[pick].gpu_uuid)
            rest.remove(pick)
        return picked

    def quality(ids: list[str]) -> tuple[int, int]:
        return sum(score(a, b) for a, b in itertools.combinations(ids, 2)), len({known[i].gpu_uuid for i in ids})

    if size > len(chosen) + 1 and len(pool) <= 16:
        # Small sets: grow a set from every start (each pair, or the must-include devices plus each candidate)
        # and keep the best-connected whole, the first on a tie; so a good first pick in a broken island does
        # not beat a whole island elsewhere.
        starts = [[*chosen, c] for c in pool] if chosen else [list(p) for p in itertools.combinations(pool, 2)]
        best: Optional[tuple[tuple[int, int], list[str]]] = None
        for start in starts:
            candidate = extend(start, [i for i in pool if i not in start])
            if best is None or quality(candidate) > best[0]:
                best = (quality(candidate), candidate)
        chosen = best[1] if best is not None else chosen
    else:
        chosen = extend(chosen, pool)
    return chosen[:size] if size > 0 else chosen
