"""Parser for the simulated-GPU spec (docs/simulated-gpus.md). Labs and CI only.

Every violation is one sentence naming the file and the GPU, as the format's document requires."""

from __future__ import annotations

import re
from typing import Any

import yaml

from gpu_device_plugin.inventory import Gpu, Inventory, MigDevice

_TOP_KEYS = {"driver_version", "cuda_driver_version", "gpus"}
_GPU_REQUIRED = {"uuid", "name", "memory_mib", "pci_bus_id", "compute_capability"}
_GPU_OPTIONAL = {
    "numa_node",
    "pcie_switch",
    "nvlink_peers",
    "persistence_mode",
    "minor_number",
    "xid",
    "lost",
    "mig_mode",
    "mig_devices",
}
_MIG_KEYS = {"uuid", "profile", "memory_mib"}
_PCI = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_CC = re.compile(r"^\d+\.\d+$")
_MIG_MODES = {"enabled", "disabled", "unsupported"}


class SpecError(ValueError):
    """The spec file is not valid; the message is one sentence naming the file and the GPU."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load(path: str) -> Inventory:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the simulated-GPU spec: {exc.strerror}.") from None
    return parse(text, path)


def parse(text: str, source: str) -> Inventory:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise SpecError(f"{source}:{where} is not valid YAML.") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the simulated-GPU spec must be a mapping.")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise SpecError(f"{source}: unknown key(s) {', '.join(map(str, unknown))} at the top level.")
    for key in ("driver_version", "cuda_driver_version"):
        if not isinstance(data.get(key), str):
            raise SpecError(f"{source}: {key} is required and must be a string.")
    if not _CC.match(data["cuda_driver_version"]):
        raise SpecError(f"{source}: cuda_driver_version must look like MAJOR.MINOR.")
    gpus_in = data.get("gpus")
    if not isinstance(gpus_in, list):
        raise SpecError(f"{source}: gpus is required and must be a list (it may be empty).")
    gpus = [_gpu(source, index, item) for index, item in enumerate(gpus_in)]
    _check_unique(source, gpus)
    return Inventory(data["driver_version"], data["cuda_driver_version"], tuple(_symmetric_peers(source, gpus)))


def _gpu(source: str, index: int, item: Any) -> Gpu:
    label = f"GPU {index}"
    if not isinstance(item, dict):
        raise SpecError(f"{source}: {label} must be a mapping.")
    if isinstance(item.get("uuid"), str):
        label = f"GPU {index} ({item['uuid']})"

    def fail(what: str) -> SpecError:
        return SpecError(f"{source}: {label}: {what}.")

    unknown = sorted(set(item) - _GPU_REQUIRED - _GPU_OPTIONAL)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(map(str, unknown))}")
    missing = sorted(_GPU_REQUIRED - set(item))
    if missing:
        raise fail(f"missing required key(s) {', '.join(missing)}")
    uuid, name = item["uuid"], item["name"]
    if not isinstance(uuid, str) or not uuid.startswith("GPU-"):
        raise fail('uuid must be a string starting with "GPU-"')
    if not isinstance(name, str) or not name:
        raise fail("name must be a non-empty string")
    if not _is_int(item["memory_mib"]) or item["memory_mib"] <= 0:
        raise fail("memory_mib must be a positive integer")
    if not isinstance(item["pci_bus_id"], str) or not _PCI.match(item["pci_bus_id"]):
        raise fail("pci_bus_id must be a string DDDD:BB:DD.F")
    if not isinstance(item["compute_capability"], str) or not _CC.match(item["compute_capability"]):
        raise fail('compute_capability must be a string "MAJOR.MINOR"')
    numa = item.get("numa_node")
    if numa is not None and not _is_int(numa):
        raise fail("numa_node must be an integer or null")
    switch = item.get("pcie_switch")
    if switch is not None and not isinstance(switch, str):
        raise fail("pcie_switch must be a string")
    peers = item.get("nvlink_peers", [])
    if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
        raise fail("nvlink_peers must be a list of GPU UUIDs")
    for key in ("persistence_mode", "lost"):
        if key in item and not isinstance(item[key], bool):
            raise fail(f"{key} must be true or false")
    minor = item.get("minor_number", index)
    if not _is_int(minor) or minor < 0:
        raise fail("minor_number must be a non-negative integer")
    xid = item.get("xid")
    if xid is not None and (not _is_int(xid) or xid <= 0):
        raise fail("xid must be a positive integer")
    mig_mode = item.get("mig_mode", "disabled")
    if mig_mode not in _MIG_MODES:
        raise fail("mig_mode must be one of enabled, disabled, unsupported")
    migs_in = item.get("mig_devices", [])
    if migs_in and mig_mode != "enabled":
        raise fail("mig_devices are only allowed with mig_mode: enabled")
    if not isinstance(migs_in, list):
        raise fail("mig_devices must be a list")
    migs = []
    for mig_index, mig in enumerate(migs_in):
        if not isinstance(mig, dict) or set(mig) != _MIG_KEYS:
            raise fail(f"MIG device {mig_index} must have exactly the keys memory_mib, profile, uuid")
        if not isinstance(mig["uuid"], str) or not mig["uuid"].startswith("MIG-"):
            raise fail(f'MIG device {mig_index}: uuid must be a string starting with "MIG-"')
        if not isinstance(mig["profile"], str) or not mig["profile"]:
            raise fail(f"MIG device {mig_index}: profile must be a non-empty string")
        if not _is_int(mig["memory_mib"]) or mig["memory_mib"] <= 0:
            raise fail(f"MIG device {mig_index}: memory_mib must be a positive integer")
        migs.append(MigDevice(mig["uuid"], mig["profile"], mig["memory_mib"], mig_index))
    return Gpu(
        index=index,
        uuid=uuid,
        name=name,
        memory_mib=item["memory_mib"],
        pci_bus_id=item["pci_bus_id"],
        compute_capability=item["compute_capability"],
        numa_node=numa,
        pcie_switch=switch,
        nvlink_peers=frozenset(peers),
        minor_number=minor,
        xid=xid,
        lost=bool(item.get("lost", False)),
        mig_mode=mig_mode,
        mig_devices=tuple(migs),
    )


def _check_unique(source: str, gpus: list[Gpu]) -> None:
    seen: dict[str, int] = {}
    for gpu in gpus:
        for key in [gpu.uuid, gpu.pci_bus_id.lower()] + [m.uuid for m in gpu.mig_devices]:
            if key in seen:
                raise SpecError(f"{source}: GPU {gpu.index} ({gpu.uuid}): {key} is already used by GPU {seen[key]}.")
            seen[key] = gpu.index


def _symmetric_peers(source: str, gpus: list[Gpu]) -> list[Gpu]:
    uuids = {g.uuid for g in gpus}
    links: dict[str, set[str]] = {g.uuid: set() for g in gpus}
    for gpu in gpus:
        for peer in gpu.nvlink_peers:
            if peer not in uuids or peer == gpu.uuid:
                raise SpecError(
                    f"{source}: GPU {gpu.index} ({gpu.uuid}): nvlink peer {peer} is not another GPU in this file."
                )
            links[gpu.uuid].add(peer)
            links[peer].add(gpu.uuid)
    return [_replace_peers(g, frozenset(links[g.uuid])) for g in gpus]


def _replace_peers(gpu: Gpu, peers: frozenset[str]) -> Gpu:
    from dataclasses import replace

    return replace(gpu, nvlink_peers=peers)
