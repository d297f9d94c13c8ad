"""GPU health: which XIDs count, what makes a GPU Unhealthy, and when it may become Healthy again.

NVIDIA's plugin never brings a GPU back; here recovery is a setting (off by default): after N
seconds with no new critical XID, and once the GPU no longer reports a standing fault (it is back
on the bus; in a simulated spec, its `xid`/`lost` entry is gone), it is Healthy again."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from gpu_device_plugin._shared import xid_classes

log = logging.getLogger(__name__)

# XIDs that point at the application, not the GPU (NVIDIA's default list): the XIDs of class `none` in the
# collection's table (_shared/xid_classes.py), so the daemon's health and the remediation classes agree.
DEFAULT_IGNORED_XIDS = xid_classes.ignored_xids()
XID_FALLEN_OFF_BUS = 79
# How many XIDs a GPU keeps (the health file's `xids`), the latest ones.
KEPT_XIDS = 16
LOST = "fell off the bus"


@dataclass(frozen=True)
class HealthPolicy:
    enabled: bool = True
    xids_enabled: bool = True
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recovery_seconds: Optional[float] = None
    # The user's XID classes over the collection's table (xidClasses): {xid: class}.
    classes: dict[int, str] = field(default_factory=dict, hash=False, compare=False)

    def is_critical(self, xid: int) -> bool:
        return self.enabled and self.xids_enabled and xid not in self.ignored_xids

    def classify(self, xid: int, data: Optional[str] = None) -> tuple[str, str]:
        """(class, reason) as the daemon acts on it: `none` for an XID it ignores, at least `device` for one
        that makes the GPU Unhealthy (an XID of class none made critical by DP_ENABLE_HEALTHCHECKS)."""
        name, reason = xid_classes.classify(xid, data, self.classes)
        if not self.is_critical(xid):
            return "none", reason if name == "none" else f"{reason}; the daemon's health checks ignore it"
        if name == "none":
            return "device", f"{reason}; the daemon's health checks count it"
        return name, reason


def _xid_list(text: str, variable: str) -> set[int]:
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(
                f"{variable} must be 'all', 'xids' or a comma-separated list of XIDs; {part!r} is neither."
            )
        out.add(int(part))
    return out


def policy_from(
    disable: str, enable: str, recovery_seconds: Optional[float], classes: Optional[dict[int, str]] = None
) -> HealthPolicy:
    """Read DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS over the XID classes.

    The XIDs ignored by default are those of class `none` (with `classes`, the user's overrides, merged
    over the collection's table). disable: `all` (no health checks), `xids` (no XID checks), or XIDs to
    ignore on top of the defaults. enable: `all`/`xids` (no XID is ignored, not even the defaults), or
    XIDs to treat as critical although the default list ignores them."""
    classes = dict(classes or {})
    disable, enable = disable.strip().lower(), enable.strip().lower()
    if disable == "all":
        return HealthPolicy(enabled=False, recovery_seconds=recovery_seconds, classes=classes)
    if disable == "xids":
        return HealthPolicy(xids_enabled=False, recovery_seconds=recovery_seconds, classes=classes)
    ignored = set(xid_classes.ignored_xids(classes)) | _xid_list(disable, "DP_DISABLE_HEALTHCHECKS")
    if enable in ("all", "xids"):
        ignored = set()
    else:
        ignored -= _xid_list(enable, "DP_ENABLE_HEALTHCHECKS")
    return HealthPolicy(ignored_xids=frozenset(ignored), recovery_seconds=recovery_seconds, classes=classes)


@dataclass
class _GpuHealth:
    unhealthy: bool = False
    reason: str = ""
    last_critical_at: float = 0.0
    standing_fault: Optional[str] = None
    # The remediation class: the highest of the XIDs since the GPU last became healthy, and why.
    fault_class: str = "none"
    fault_reason: str = ""
    fault_xid: Optional[int] = None  # the XID that gave the class; None for a GPU lost without one
    xids: list[dict[str, Any]] = field(default_factory=list)
    changed_at: float = field(default_factory=time.time)  # wall clock of the last change of the above


@dataclass(frozen=True)
class GpuFaults:
    """One GPU's health and remediation class, as the health file and the Node condition show them."""

    healthy: bool
    fault_class: str
    reason: str
    xid: Optional[int]
    xids: tuple[dict[str, Any], ...]
    changed_at: float


class HealthTracker:
    """Health per physical GPU UUID. Thread-safe: the NVML event thread and the event loop both call in."""

    def __init__(
        self,
        policy: HealthPolicy,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._gpus: dict[str, _GpuHealth] = {}

    def _raise_class(self, state: _GpuHealth, name: str, reason: str, xid: Optional[int], data: Optional[str]) -> None:
        """Keep the XID (the latest KEPT_XIDS) and raise the GPU's class to it; called with the lock held."""
        now = self._wall_clock()
        if xid is not None:
            state.xids.append({"xid": xid, "data": data, "time": now, "class": name, "reason": reason})
            del state.xids[:-KEPT_XIDS]
            state.changed_at = now
        if xid_classes.rank(name) > xid_classes.rank(state.fault_class):
            state.fault_class, state.fault_reason, state.fault_xid = name, reason, xid
            state.changed_at = now

    def record_xid(self, uuid: str, xid: int, data: Optional[str] = None) -> bool:
        """An XID event hit the GPU; True when its health changed."""
        critical = self.policy.is_critical(xid)
        name, reason = self.policy.classify(xid, data)
        log.log(
            logging.WARNING if critical else logging.INFO,
            "XID event",
            extra={"device": uuid, "xid": xid, "critical": critical, "class": name},
        )
        if not self.policy.enabled:
            return False
        with self._lock:
            state = self._gpus.setdefault(uuid, _GpuHealth())
            self._raise_class(state, name, reason, xid, data)
            if not critical:
                return False
            state.last_critical_at = self._clock()
            changed = not state.unhealthy
            state.unhealthy, state.reason = True, f"XID {xid}"
        if changed:
            log.warning("GPU marked Unhealthy", extra={"device": uuid, "reason": f"XID {xid}"})
        return changed

    def set_standing_fault(self, uuid: str, fault: Optional[str]) -> bool:
        """A fault the GPU reports now (lost from the bus, a simulated XID); None when there is none."""
        if not self.policy.enabled:
            return False
        with self._lock:
            state = self._gpus.setdefault(uuid, _GpuHealth())
            state.standing_fault = fault
            if fault == LOST:
                # A GPU off the bus asks for what XID 79 asks for, whether or not the XID itself came.
                name, reason = self.policy.classify(XID_FALLEN_OFF_BUS)
                self._raise_class(state, max(name, "device", key=xid_classes.rank), f"{LOST} ({reason})", None, None)
            if fault is None or state.unhealthy:
                return False
            state.unhealthy, state.reason, state.last_critical_at = True, fault, self._clock()
        log.warning("GPU marked Unhealthy", extra={"device": uuid, "reason": fault})
        return True

    def restore(
        self,
        uuid: str,
        fault_class: str,
        reason: str,
        xid: Optional[int],
        xids: list[dict[str, Any]],
        changed_at: Optional[float] = None,
    ) -> bool:
        """A fault from before the daemon started (the health file it wrote): the GPU is Unhealthy in that
        class until it recovers as the policy says, the quiet period counted from now. Nothing for a GPU
        already known here, or with health checks off; True when it was taken."""
        if not self.policy.enabled or fault_class not in xid_classes.CLASSES or fault_class == "none":
            return False
        with self._lock:
            if uuid in self._gpus:
                return False
            self._gpus[uuid] = _GpuHealth(
                unhealthy=True,
                reason=LOST
                if reason.startswith(LOST)
                else f"XID {xid}"
                if xid is not None
                else "faulty before a restart",
                last_critical_at=self._clock(),
                fault_class=fault_class,
                fault_reason=reason,
                fault_xid=xid,
                xids=[dict(x) for x in xids[-KEPT_XIDS:]],
                changed_at=changed_at if changed_at is not None else self._wall_clock(),
            )
        log.warning("GPU marked Unhealthy", extra={"device": uuid, "reason": reason, "class": fault_class})
        return True

    def knows(self, uuid: str) -> bool:
        with self._lock:
            return uuid in self._gpus

    def forget_others(self, uuids: set[str]) -> None:
        with self._lock:
            for gone in set(self._gpus) - uuids:
                del self._gpus[gone]

    def is_healthy(self, uuid: str) -> bool:
        if not self.policy.enabled:
            return True
        with self._lock:
            state = self._gpus.get(uuid)
            return state is None or not state.unhealthy

    def faults(self, uuid: str) -> GpuFaults:
        """The GPU's health, class and XIDs (a GPU never seen is healthy, class none)."""
        with self._lock:
            state = self._gpus.get(uuid)
            if state is None:
                return GpuFaults(True, "none", "", None, (), 0.0)
            healthy = not self.policy.enabled or not state.unhealthy
            return GpuFaults(
                healthy,
                state.fault_class,
                state.fault_reason,
                state.fault_xid,
                tuple(dict(x) for x in state.xids),
                state.changed_at,
            )

    def reason(self, uuid: str) -> str:
        """Why the GPU is Unhealthy ("XID 79", "fell off the bus"); empty when it is Healthy."""
        with self._lock:
            state = self._gpus.get(uuid)
            return state.reason if state is not None and state.unhealthy else ""

    def recover_due(self) -> tuple[list[str], Optional[float]]:
        """Bring back the GPUs whose quiet period is over. Returns (recovered UUIDs, seconds to the next check)."""
        wait = self.policy.recovery_seconds
        if wait is None:
            return [], None
        now = self._clock()
        recovered, next_check = [], None
        with self._lock:
            for uuid, state in self._gpus.items():
                if not state.unhealthy or state.standing_fault is not None:
                    continue
                due = state.last_critical_at + wait
                if now >= due:
                    state.unhealthy, state.reason = False, ""
                    # Healthy again: the class and the XIDs start over.
                    state.fault_class, state.fault_reason, state.fault_xid = "none", "", None
                    state.xids.clear()
                    state.changed_at = self._wall_clock()
                    recovered.append(uuid)
                else:
                    next_check = min(next_check, due - now) if next_check is not None else due - now
        for uuid in recovered:
            log.info("GPU Healthy again", extra={"device": uuid, "quiet_seconds": wait})
        return recovered, next_check


def handle_key(handle: Any) -> int:
    """What identifies an NVML device handle. The real bindings hand out ctypes pointers, which are
    unhashable, and two of them for the same GPU never compare equal: the address they point at is
    the identity. Anything else (a test double's object) is keyed by the object itself."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return address if address is not None else id(handle)


class NvmlEventWatcher(threading.Thread):
    """Waits on an NVML event set for XID events, in its own thread so gRPC never waits on NVML.

    `report(uuid, xid)` (`report(uuid, xid, data)` for XID 154, with the recovery action NVML reports) and
    `lost(uuid)` are called from this thread; they must be thread-safe. The
    thread never ends silently: whatever stops it early is logged as an error and kept in `failure`,
    which the daemon's /healthz reports as not ready."""

    def __init__(
        self,
        nvml: Any,
        uuids: list[str],
        report: Callable[..., object],
        lost: Callable[[str], object],
        wait_ms: int = 1000,
        back: Callable[[str], object] = lambda uuid: None,
    ) -> None:
        super().__init__(name="nvml-events", daemon=True)
        self.nvml, self.uuids, self.report, self.wait_ms = nvml, uuids, report, wait_ms
        self._lost_callback, self.back = lost, back
        self._stop_requested = threading.Event()
        self.failure: Optional[str] = None
        self._lost: set[str] = set()  # GPUs off the bus, asked after on every wait until they answer again

    def lost(self, uuid: str) -> None:
        if uuid not in self._lost:
            self._lost.add(uuid)
            self._lost_callback(uuid)

    def stop(self) -> None:
        self._stop_requested.set()

    @property
    def failed(self) -> Optional[str]:
        """Why the watcher stopped without being asked to; None while it works (or before it starts)."""
        if self.failure is not None:
            return self.failure
        if self.ident is not None and not self.is_alive() and not self._stop_requested.is_set():
            return "the NVML event watcher stopped"
        return None

    def run(self) -> None:
        try:
            self._watch()
        except Exception as exc:  # the thread must never die unseen
            self.failure = f"{type(exc).__name__}: {exc}"
            log.exception("the NVML event watcher failed; XID health checks are off", extra={"reason": self.failure})

    def _watch(self) -> None:
        nvml = self.nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self.failure = f"cannot create an NVML event set: {exc}"
            log.error("cannot create an NVML event set; XID health checks are off", extra={"reason": str(exc)})
            return
        # Keyed by the handle's address, never by the handle (see handle_key).
        handles: dict[int, tuple[Any, str]] = {}
        for uuid in self.uuids:
            self._register(event_set, handles, uuid)
        log.info("watching NVML events", extra={"devices": [uuid for _handle, uuid in handles.values()]})
        try:
            while not self._stop_requested.is_set():
                for uuid in sorted(self._lost):
                    if self._register(event_set, handles, uuid, quiet=True):
                        self._lost.discard(uuid)
                        log.info("GPU answers NVML again", extra={"device": uuid})
                        self.back(uuid)
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, self.wait_ms)
                except nvml.NVMLError as exc:
                    if exc.value == nvml.NVML_ERROR_TIMEOUT:
                        continue
                    if _is_lost(nvml, exc):
                        self._probe_all(handles)
                        continue
                    log.error("waiting for NVML events failed", extra={"reason": str(exc)})
                    self._stop_requested.wait(1.0)
                    continue
                hit = self._event_uuid(handles, data.device)
                if hit is not None and data.eventType == nvml.nvmlEventTypeXidCriticalError:
                    xid = int(data.eventData)
                    detail = self._recovery_action(data.device) if xid == xid_classes.RECOVERY_ACTION_XID else None
                    if detail is None:
                        self.report(hit, xid)
                    else:
                        self.report(hit, xid, detail)
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)

    def _recovery_action(self, device: Any) -> Optional[str]:
        """XID 154's news, the GPU's recovery action now, in the words the driver logs it with (the event
        carries only the XID); None where NVML cannot tell (an older driver or library)."""
        nvml = self.nvml
        field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return None
        try:
            value = nvml.nvmlDeviceGetFieldValues(device, [field_id])[0]
        except (nvml.NVMLError, IndexError, TypeError):
            return None
        if getattr(value, "nvmlReturn", 1) != 0:
            return None
        return f"GPU recovery action changed to 0x{int(value.value.uiVal):x} (read from NVML)"

    def _register(self, event_set: Any, handles: dict[int, tuple[Any, str]], uuid: str, quiet: bool = False) -> bool:
        """Listen for the GPU's XIDs; False when it cannot be reached (a lost GPU is reported as lost)."""
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        except nvml.NVMLError as exc:
            if _is_lost(nvml, exc):
                self.lost(uuid)
            elif not quiet:
                log.warning("XID events unavailable for this GPU", extra={"device": uuid, "reason": str(exc)})
            return False
        handles[handle_key(handle)] = (handle, uuid)
        return True

    def _event_uuid(self, handles: dict[int, tuple[Any, str]], device: Any) -> Optional[str]:
        """The UUID of the GPU an event names: by the handle's address, else by asking NVML."""
        hit = handles.get(handle_key(device))
        if hit is not None:
            return hit[1]
        try:
            uuid = self.nvml.nvmlDeviceGetUUID(device)
        except self.nvml.NVMLError:
            return None
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return uuid if uuid in self.uuids else None

    def _probe_all(self, handles: dict[int, tuple[Any, str]]) -> None:
        for handle, uuid in handles.values():
            try:
                self.nvml.nvmlDeviceGetUUID(handle)
            except self.nvml.NVMLError as exc:
                if _is_lost(self.nvml, exc):
                    self.lost(uuid)


def _is_lost(nvml: Any, exc: Any) -> bool:
    return getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", object())
