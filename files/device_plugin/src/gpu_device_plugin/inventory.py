"""What a node's GPUs look like, whatever discovered them; immutable snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    profile: str
    memory_mib: int
    index: int  # position among its parent's MIG devices


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    compute_capability: str
    numa_node: Optional[int] = None
    pcie_switch: Optional[str] = None
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
