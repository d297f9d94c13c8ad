"""Discovery backends: `nvml` (the real driver, through pynvml) and `simulated` (a watched YAML spec).

Both produce `Inventory` snapshots and call `on_change` when the node's GPUs change. They hold no
gRPC code; the servicer never talks to them directly."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from typing import Any, Callable, Optional

from gpu_device_plugin import simspec, watch
from gpu_device_plugin.inventory import EMPTY, Gpu, Inventory, MigDevice

log = logging.getLogger(__name__)


class BackendError(RuntimeError):
    """The backend cannot enumerate GPUs (NVML missing or failing, spec unreadable)."""


class SimulatedBackend:
    """GPUs described by a spec file, re-read whenever the file changes (labs and CI only)."""

    name = "simulated"

    def __init__(self, spec_path: str) -> None:
        self.spec_path = os.path.abspath(spec_path)
        self._inventory: Inventory = EMPTY
        self._inotify: Optional[watch.Inotify] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._on_change: Callable[[], None] = lambda: None
        self._reload_handle: Optional[asyncio.TimerHandle] = None

    def init(self) -> None:
        try:
            self._inventory = simspec.load(self.spec_path)
        except simspec.SpecError as exc:
            raise BackendError(str(exc)) from None

    def snapshot(self) -> Inventory:
        return self._inventory

    def start(self, loop: asyncio.AbstractEventLoop, on_change: Callable[[], None]) -> None:
        self._loop, self._on_change = loop, on_change
        self._inotify = watch.Inotify()
        mask = watch.IN_CLOSE_WRITE | watch.IN_MOVED_TO | watch.IN_CREATE | watch.IN_DELETE | watch.IN_MOVED_FROM
        self._inotify.add_watch(os.path.dirname(self.spec_path), mask)
        loop.add_reader(self._inotify.fd, self._on_events)

    def _on_events(self) -> None:
        assert self._inotify is not None and self._loop is not None
        base = os.path.basename(self.spec_path)
        if any(ev.name == base for ev in self._inotify.read()):
            # Editors write in several steps; reading 20 ms after the last event sees the whole file.
            if self._reload_handle is not None:
                self._reload_handle.cancel()
            self._reload_handle = self._loop.call_later(0.02, self._reload)

    def _reload(self) -> None:
        self._reload_handle = None
        if not os.path.exists(self.spec_path):
            log.warning("simulated spec removed; keeping the last GPUs read", extra={"spec": self.spec_path})
            return
        try:
            inventory = simspec.load(self.spec_path)
        except simspec.SpecError as exc:
            log.error("simulated spec rejected; keeping the last GPUs read", extra={"reason": str(exc)})
            return
        if inventory != self._inventory:
            self._inventory = inventory
            log.info("simulated spec changed", extra={"spec": self.spec_path, "gpus": [g.uuid for g in inventory.gpus]})
            self._on_change()

    def stop(self) -> None:
        if self._inotify is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None


def load_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise BackendError(f"the nvml backend needs the pynvml module (package nvidia-ml-py): {exc}") from None


class NvmlBackend:
    """GPUs as the NVIDIA driver reports them. `nvml` may be any object with pynvml's interface."""

    name = "nvml"

    def __init__(self, nvml: Any = None, sysfs: str = "/sys") -> None:
        self._nvml_module = nvml
        self.sysfs = sysfs
        self._inventory: Inventory = EMPTY
        self.initialized = False

    @property
    def nvml(self) -> Any:
        if self._nvml_module is None:
            self._nvml_module = load_pynvml()
        return self._nvml_module

    def init(self) -> None:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
            self.initialized = True
            self._inventory = self._enumerate()
        except nvml.NVMLError as exc:
            raise BackendError(f"NVML failed: {exc}") from None

    def snapshot(self) -> Inventory:
        return self._inventory

    def start(self, loop: asyncio.AbstractEventLoop, on_change: Callable[[], None]) -> None:
        """Health events come from health.NvmlEventWatcher; the GPU set itself is fixed until restart."""

    def stop(self) -> None:
        if self.initialized:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.initialized = False

    def _enumerate(self) -> Inventory:
        nvml = self.nvml
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        bus_ids = [_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
        uuid_by_bus = {}
        gpus = []
        for index, handle in enumerate(handles):
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            uuid_by_bus[bus_ids[index]] = uuid
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            mig_mode, migs = self._mig(handle)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=uuid,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
                    pci_bus_id=bus_ids[index],
                    compute_capability=f"{major}.{minor}",
                    numa_node=self._numa(handle, bus_ids[index]),
                    minor_number=int(nvml.nvmlDeviceGetMinorNumber(handle)),
                    mig_mode=mig_mode,
                    mig_devices=migs,
                )
            )
        switches = self._switch_groups(handles)
        from dataclasses import replace

        result = []
        for index, gpu in enumerate(gpus):
            peers = frozenset(uuid_by_bus[b] for b in self._nvlink_peer_buses(handles[index]) if b in uuid_by_bus)
            result.append(replace(gpu, pcie_switch=switches.get(index), nvlink_peers=peers - {gpu.uuid}))
        return Inventory(driver, f"{cuda // 1000}.{(cuda % 1000) // 10}", tuple(result))

    def _numa(self, handle: Any, bus_id: str) -> Optional[int]:
        getter = getattr(self.nvml, "nvmlDeviceGetNumaNodeId", None)
        if getter is not None:
            try:
                node = int(getter(handle))
                return node if node >= 0 else None
            except self.nvml.NVMLError:
                pass
        try:
            with open(os.path.join(self.sysfs, "bus/pci/devices", bus_id.lower(), "numa_node")) as handle_file:
                node = int(handle_file.read().strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    def _mig(self, handle: Any) -> tuple[str, tuple[MigDevice, ...]]:
        nvml = self.nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            return "unsupported", ()
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return "disabled", ()
        migs: list[MigDevice] = []
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:
                continue
            name = _text(nvml.nvmlDeviceGetName(mig))
            profile = name.rsplit("MIG ", 1)[-1].strip()
            memory = int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // (1024 * 1024)
            migs.append(MigDevice(_text(nvml.nvmlDeviceGetUUID(mig)), profile, memory, len(migs)))
        return "enabled", tuple(migs)

    def _nvlink_peer_buses(self, handle: Any) -> list[str]:
        nvml = self.nvml
        buses = []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                buses.append(_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except nvml.NVMLError:
                break
        return buses

    def _switch_groups(self, handles: list[Any]) -> dict[int, str]:
        """GPUs whose closest common ancestor is a PCIe switch share a group, named sw0, sw1, ..."""
        nvml = self.nvml
        parent = list(range(len(handles)))

        def root(i: int) -> int:
            while parent[i] != i:
                i = parent[i]
            return i

        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                try:
                    level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                except nvml.NVMLError:
                    continue
                if level <= nvml.NVML_TOPOLOGY_MULTIPLE:
                    parent[root(j)] = root(i)
        groups: dict[int, list[int]] = {}
        for i in range(len(handles)):
            groups.setdefault(root(i), []).append(i)
        names: dict[int, str] = {}
        for number, members in enumerate(m for m in groups.values() if len(m) > 1):
            for i in members:
                names[i] = f"sw{number}"
        return names


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(raw: Any) -> str:
    """NVML writes an 8-digit PCI domain ("00000000:18:00.0"); sysfs and the spec use 4."""
    text = _text(raw).lower()
    domain, _sep, rest = text.partition(":")
    return f"{domain[-4:]}:{rest}"


def make_backend(kind: str, simulated_spec: Optional[str], nvml: Any = None) -> Any:
    if kind == "simulated":
        if not simulated_spec:
            raise BackendError("--backend simulated needs --simulated-spec FILE.")
        return SimulatedBackend(simulated_spec)
    if kind == "nvml":
        return NvmlBackend(nvml)
    raise BackendError(f"unknown backend {kind!r}: choose nvml or simulated.")
