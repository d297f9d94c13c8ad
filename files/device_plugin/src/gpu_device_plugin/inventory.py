"""What a node's GPUs look like, whatever discovered them; immutable snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    profile: str
    memory_mib: int
    index: int  # position among its parent's MIG devices
    # Where it sits (its GPU instance's profile ID and memory slices) and what its GPU instance has; None where
    # NVML does not say.
    profile_id: Optional[int] = None
    placement_start: Optional[int] = None
    placement_size: Optional[int] = None
    multiprocessors: Optional[int] = None
    copy_engines: Optional[int] = None
    decoders: Optional[int] = None
    encoders: Optional[int] = None
    jpeg_engines: Optional[int] = None
    ofa_engines: Optional[int] = None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    compute_capability: str
    architecture: str = "undefined"
    brand: Optional[str] = None
    numa_node: Optional[int] = None
    pcie_switch: Optional[str] = None
    pcie_root: Optional[str] = None
    nvlink_peers: frozenset[str] = frozenset()
    minor_number: int = 0
    xid: Optional[int] = None  # simulated only: the standing XID condition written in the spec
    lost: bool = False
    mig_mode: str = "disabled"
    mig_devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class Inventory:
    driver_version: str = ""
    cuda_driver_version: str = ""
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)

    def by_uuid(self) -> dict[str, Gpu]:
        return {g.uuid: g for g in self.gpus}


EMPTY = Inventory()


# The facts `Gpu` keeps under the name and in the form `_shared/gpu_discovery.py` gives them.
_SAME_FACTS = (
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "compute_capability",
    "architecture",
    "brand",
    "numa_node",
    "pcie_switch",
    "pcie_root",
    "xid",
    "lost",
    "mig_mode",
)


def _mig(fact: dict[str, Any]) -> MigDevice:
    return MigDevice(
        uuid=fact["uuid"],
        profile=fact["profile"],
        memory_mib=fact["memory_mib"],
        index=fact["index"],
        profile_id=fact.get("gpu_instance_profile_id"),
        placement_start=fact.get("placement_start"),
        placement_size=fact.get("placement_size"),
        **{key: fact.get(key) for key in _MIG_ENGINES},
    )


_MIG_ENGINES = ("multiprocessors", "copy_engines", "decoders", "encoders", "jpeg_engines", "ofa_engines")


def _gpu(fact: dict[str, Any]) -> Gpu:
    minor = fact["minor_number"]
    return Gpu(
        memory_mib=fact["memory_total_mib"],
        nvlink_peers=frozenset(fact["nvlink_peers"]),
        minor_number=fact["index"] if minor is None else minor,
        mig_devices=tuple(_mig(m) for m in fact["mig_devices"]),
        **{key: fact[key] for key in _SAME_FACTS},
    )


def from_facts(facts: dict[str, Any]) -> Inventory:
    """The snapshot of GPU facts as `_shared/gpu_discovery.py` gives them (from NVML or a simulated spec).

    The only translation the daemon makes: a few field names, immutable collections, and the device
    node's minor number, which falls back to the NVML index where NVML does not report one."""
    return Inventory(facts["driver_version"], facts["cuda_driver_version"], tuple(_gpu(g) for g in facts["gpus"]))
