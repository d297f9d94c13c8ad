"""Discovery backends: `nvml` (the real driver, through pynvml) and `simulated` (a watched YAML spec).

Both produce `Inventory` snapshots and call `on_change` when the node's GPUs change. They hold no
gRPC code; the servicer never talks to them directly."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import logging
import os
from typing import Any, Callable, Optional

from gpu_device_plugin import hostdriver, simspec, watch
from gpu_device_plugin._shared import gpu_discovery
from gpu_device_plugin.config import MountsSettings
from gpu_device_plugin.inventory import EMPTY, Inventory, from_facts

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


def load_pynvml(mounts: Optional[MountsSettings] = None) -> Any:
    """pynvml, bound to the host driver's library where the driver root is mounted into this container.

    pynvml opens libnvidia-ml.so.1 by that name; a library already loaded by its full path answers to
    its soname, so loading the driver root's copy first is all it takes."""
    if mounts is not None and mounts.container_driver_root:
        path = hostdriver.nvml_library(mounts)
        if path is None:
            log.warning(
                "no libnvidia-ml.so.1 under the driver root; relying on the library search path",
                extra={"driver_root": mounts.driver_root, "container_driver_root": mounts.container_driver_root},
            )
        else:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                raise BackendError(f"cannot load the driver's NVML library {path}: {exc}") from None
            log.info("NVML library from the driver root", extra={"library": path})
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise BackendError(f"the nvml backend needs the pynvml module (package nvidia-ml-py): {exc}") from None


class NvmlBackend:
    """GPUs as the NVIDIA driver reports them. `nvml` may be any object with pynvml's interface."""

    name = "nvml"

    def __init__(self, nvml: Any = None, sysfs: str = "/sys", mounts: Optional[MountsSettings] = None) -> None:
        self._nvml_module = nvml
        self.sysfs = sysfs
        self.mounts = mounts
        self._inventory: Inventory = EMPTY
        self.initialized = False

    @property
    def nvml(self) -> Any:
        if self._nvml_module is None:
            self._nvml_module = load_pynvml(self.mounts)
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
        try:
            return from_facts(gpu_discovery.discover_initialised(self.nvml, self.sysfs))
        except gpu_discovery.DiscoveryError as exc:
            raise BackendError(str(exc)) from None


def make_backend(
    kind: str, simulated_spec: Optional[str], nvml: Any = None, mounts: Optional[MountsSettings] = None
) -> Any:
    if kind == "simulated":
        if not simulated_spec:
            raise BackendError("--backend simulated needs --simulated-spec FILE.")
        return SimulatedBackend(simulated_spec)
    if kind == "nvml":
        return NvmlBackend(nvml, mounts=mounts)
    raise BackendError(f"unknown backend {kind!r}: choose nvml or simulated.")
