"""Per-device health for the DRA side, from the daemon's health tracker (XID events, GPUs lost).

A device's health is its GPU's: a MIG device is Unhealthy when its parent GPU is. With health checks
switched off every device is Unknown. The hub wakes the kubelet's health streams on each change, and
hands the new set of unhealthy devices to the ResourceSlice publisher (in a worker thread, the latest
state only, one call at a time)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

from gpu_device_plugin.dra.devices import DraDevice, SlicePublisher, dra_devices
from gpu_device_plugin.state import DeviceState

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY, UNKNOWN = "HEALTHY", "UNHEALTHY", "UNKNOWN"


@dataclass(frozen=True)
class HealthRow:
    pool: str
    device: str
    status: str  # HEALTHY, UNHEALTHY or UNKNOWN (the names of the proto's HealthStatus)
    message: str
    since: float  # Unix seconds of the last change


class DeviceHealthHub:
    def __init__(
        self,
        state: DeviceState,
        pool: str,
        publisher: Optional[SlicePublisher],
        devices: Optional[Callable[[], list[DraDevice]]] = None,
    ) -> None:
        self.state = state
        self._devices = devices or (lambda: dra_devices(self.state.inventory))
        self.pool = pool
        self.publisher = publisher
        self._rows: dict[str, HealthRow] = {}
        self._changed = asyncio.Event()
        self._published: Optional[tuple[tuple[str, ...], frozenset[str]]] = None
        self._publish_wanted = asyncio.Event()
        self._publisher_task: Optional[asyncio.Task[None]] = None

    # -- inputs --------------------------------------------------------------------------------
    def start(self) -> None:
        """Publish the slice (in the background, retried until it works) and follow the health changes."""
        self.update()
        self.state.on_published.append(self.update)
        self._publish_wanted.set()  # also a node without devices publishes its (empty) pool
        self._publisher_task = asyncio.ensure_future(self._publish_loop())

    def stop(self) -> None:
        if self.update in self.state.on_published:
            self.state.on_published.remove(self.update)
        if self._publisher_task is not None:
            self._publisher_task.cancel()
        self.wake()

    def devices(self) -> list[DraDevice]:
        return self._devices()

    def update(self) -> None:
        """Recompute every device's health from the tracker; wake the streams when something changed."""
        tracker = self.state.tracker
        now = time.time()
        rows: dict[str, HealthRow] = {}
        for device in self.devices():
            uuid = device.gpu.uuid
            if not tracker.policy.enabled:
                status, message = UNKNOWN, "health checks are switched off"
            elif tracker.is_healthy(uuid):
                status, message = HEALTHY, ""
            else:
                status, message = UNHEALTHY, f"GPU {uuid}: {tracker.reason(uuid) or 'unhealthy'}"
            old = self._rows.get(device.name)
            same = old is not None and (old.status, old.message) == (status, message)
            rows[device.name] = (
                old if same and old is not None else HealthRow(self.pool, device.name, status, message, now)
            )
        if rows == self._rows:
            return
        changed = [name for name, row in rows.items() if self._rows.get(name) != row]
        self._rows = rows
        log.info(
            "DRA device health changed",
            extra={"devices": changed, "unhealthy": sorted(self.unhealthy())},
        )
        self.wake()
        self._publish_wanted.set()

    @property
    def published(self) -> bool:
        """Whether the ResourceSlice has been published (or found up to date) at least once."""
        return self._published is not None

    def unhealthy(self) -> frozenset[str]:
        return frozenset(name for name, row in self._rows.items() if row.status == UNHEALTHY)

    # -- outputs -------------------------------------------------------------------------------
    def rows(self) -> list[HealthRow]:
        return list(self._rows.values())

    def changed(self) -> asyncio.Event:
        return self._changed

    def wake(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    def _publish(self) -> bool:
        if self.publisher is None:
            return True
        devices = self.devices()
        unhealthy = self.unhealthy()
        key = (tuple(d.name for d in devices), unhealthy)
        if key == self._published:
            return True
        try:
            wrote = self.publisher.publish(devices, unhealthy, self.state.inventory)
        except OSError as exc:
            log.warning("cannot publish the ResourceSlice; retrying", extra={"reason": str(exc)})
            return False
        self._published = key
        log.info(
            "ResourceSlice published" if wrote else "ResourceSlice already up to date",
            extra={"devices": len(devices), "unhealthy": sorted(unhealthy)},
        )
        return True

    async def _publish_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._publish_wanted.wait()
            self._publish_wanted.clear()
            try:
                ok = await loop.run_in_executor(None, self._publish)
            except Exception:
                log.exception("publishing the ResourceSlice failed")
                ok = False
            if not ok:
                await asyncio.sleep(1.0)
                self._publish_wanted.set()
