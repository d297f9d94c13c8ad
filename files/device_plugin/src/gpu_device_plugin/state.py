"""The daemon's view of its devices: discovery snapshot + health -> device lists per resource.

Lives on the event loop. Other threads (NVML events) hand their news over with
`loop.call_soon_threadsafe`. Every change wakes the ListAndWatch streams through one event."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from gpu_device_plugin import sharing
from gpu_device_plugin.config import Config
from gpu_device_plugin.health import LOST, HealthTracker
from gpu_device_plugin.inventory import EMPTY, Inventory
from gpu_device_plugin.metrics import Metrics
from gpu_device_plugin.sharing import PluginDevice, ResourcePlan

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
Listing = tuple[tuple[str, str, Optional[int]], ...]  # (ID, health, NUMA node)


class DeviceState:
    def __init__(self, config: Config, tracker: HealthTracker, metrics: Metrics) -> None:
        self.config = config
        self.tracker = tracker
        self.metrics = metrics
        self.inventory: Inventory = EMPTY
        self.plans: dict[str, ResourcePlan] = sharing.plan(EMPTY, config)
        self.listings: dict[str, Listing] = {}
        self.version = 0
        self._changed = asyncio.Event()
        self._last_xid: dict[str, Optional[int]] = {}
        self._recovery_timer: Optional[asyncio.TimerHandle] = None
        self.on_resources_changed: list[Any] = []
        self.on_published: list[Any] = []  # called on every publish, changed or not (the DRA side compares)

    # -- inputs --------------------------------------------------------------------------------
    def set_inventory(self, inventory: Inventory) -> None:
        self.inventory = inventory
        for gpu in inventory.gpus:
            # A simulated spec carries the last XID that hit a GPU: a new value is a new event.
            if gpu.xid is not None and self._last_xid.get(gpu.uuid) != gpu.xid:
                self.on_xid(gpu.uuid, gpu.xid, publish=False)
            self._last_xid[gpu.uuid] = gpu.xid
            fault = None
            if gpu.lost:
                fault = LOST
            elif gpu.xid is not None and self.tracker.policy.is_critical(gpu.xid):
                fault = f"XID {gpu.xid}"
            self.tracker.set_standing_fault(gpu.uuid, fault)
        self.tracker.forget_others({g.uuid for g in inventory.gpus})
        self.publish()

    def on_xid(self, uuid: str, xid: int, publish: bool = True, data: Optional[str] = None) -> None:
        critical = self.tracker.policy.is_critical(xid)
        self.metrics.xid_events.labels(uuid, str(xid), str(critical).lower()).inc()
        self.tracker.record_xid(uuid, xid, data)
        if publish:
            self.publish()

    def on_lost(self, uuid: str) -> None:
        self.tracker.set_standing_fault(uuid, LOST)
        self.publish()

    def on_back(self, uuid: str) -> None:
        """A lost GPU answers again (after a reset); it is Healthy once the recovery policy allows."""
        self.tracker.set_standing_fault(uuid, None)
        self.publish()

    def replace_config(self, config: Config, tracker: HealthTracker) -> None:
        self.config, self.tracker = config, tracker
        self._last_xid.clear()
        self.set_inventory(self.inventory)

    # -- outputs -------------------------------------------------------------------------------
    def healthy(self, device: PluginDevice) -> bool:
        return self.tracker.is_healthy(device.gpu_uuid)

    def listing(self, resource: str) -> Listing:
        return self.listings.get(resource, ())

    def changed(self) -> asyncio.Event:
        return self._changed

    def wake(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    def publish(self) -> None:
        _recovered, next_check = self.tracker.recover_due()
        if self._recovery_timer is not None:
            self._recovery_timer.cancel()
            self._recovery_timer = None
        if next_check is not None:
            loop = asyncio.get_running_loop()
            self._recovery_timer = loop.call_later(next_check + 0.01, self.publish)
        for callback in self.on_published:
            callback()
        plans = sharing.plan(self.inventory, self.config)
        listings = {
            name: tuple((d.id, HEALTHY if self.healthy(d) else UNHEALTHY, d.numa_node) for d in plan.devices)
            for name, plan in plans.items()
        }
        resources_changed = list(plans) != list(self.plans)
        self.plans = plans
        if listings == self.listings and not resources_changed:
            return
        for name, rows in listings.items():
            if rows != self.listings.get(name):
                unhealthy = [r[0] for r in rows if r[1] == UNHEALTHY]
                log.info(
                    "device list changed",
                    extra={"resource": name, "devices": len(rows), "unhealthy": unhealthy},
                )
            for health in (HEALTHY, UNHEALTHY):
                self.metrics.devices.labels(name, health).set(sum(1 for r in rows if r[1] == health))
        self.listings = listings
        self.version += 1
        self.wake()
        if resources_changed:
            for callback in self.on_resources_changed:
                callback()
