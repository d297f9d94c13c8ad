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


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    compute_capability: str
    architecture: str = "undefined"
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


def from_facts(facts: dict[str, Any]) -> Inventory:
    """The snapshot of GPU facts as `_shared/gpu_discovery.py` gives them (from NVML or a simulated spec).

    The only translation the daemon makes: field names, immutable collections, and the device node's
    minor number, which falls back to the NVML index where NVML does not report one."""
    return Inventory(
        driver_version=facts["driver_version"],
        cuda_driver_version=facts["cuda_driver_version"],
        gpus=tuple(
            Gpu(
                index=gpu["index"],
                uuid=gpu["uuid"],
                name=gpu["name"],
                memory_mib=gpu["memory_total_mib"],
                pci_bus_id=gpu["pci_bus_id"],
                compute_capability=gpu["compute_capability"],
                architecture=gpu["architecture"],
                numa_node=gpu["numa_node"],
                pcie_switch=gpu["pcie_switch"],
                nvlink_peers=frozenset(gpu["nvlink_peers"]),
                minor_number=gpu["index"] if gpu["minor_number"] is None else gpu["minor_number"],
                xid=gpu["xid"],
                lost=gpu["lost"],
                mig_mode=gpu["mig_mode"],
                mig_devices=tuple(
                    MigDevice(mig["uuid"], mig["profile"], mig["memory_mib"], mig["index"])
                    for mig in gpu["mig_devices"]
                ),
            )
            for gpu in facts["gpus"]
        ),
    )
