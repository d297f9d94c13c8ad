"""GPU faults shown to the node and the fleet: the health file, the class gauge, the Node condition
`GPUHealthy` and the alert webhook.

After every publish of the device state, each GPU's health, remediation class and last XIDs (from
health.HealthTracker) are compared with what was last shown; on a change:

- the health file (`healthFile`, default /var/lib/gpuops/gpu-health.json) is written again, atomically
  and durably (dra.cdi.write_atomically: a temporary file flushed to disk and renamed over it, the
  directory flushed too), for the gpuops.k8s.gpu_faults module and the remediation playbook;
- `gpuops_gpu_fault_class{gpu=UUID, class=...}` is 1 for the GPU's class and 0 for the other classes;
- where the daemon can reach the API server (a `NodeConditions` writer exists), the Node condition
  `GPUHealthy` is set, in a worker thread, the latest state only, retried while the API server is away
  or answers what the daemon cannot read;
- a GPU whose class rose above `device` is announced to the alert webhook (`alertWebhook`): a POST of
  JSON {node, gpu, uuid, xid, class, reason, time} from a thread of its own, so the event loop never
  waits on it. A POST has one total deadline (`alertWebhookTimeoutSeconds`); a redirect is a failure,
  never followed (the token would go to its target); a token is sent over plain http only where
  `alertWebhookTokenOverHttp` allows it; a POST that fails (the receiver away, a 5xx, a timeout) is
  tried again WEBHOOK_ATTEMPTS times in all with a doubling pause. While the GPU stays in that class
  the same alert is sent again after `alertResendSeconds`, the pause doubling up to
  `alertResendMaxSeconds`, until the GPU is healthy again: an alert that found no one (an event source
  restarting, a run that failed) is heard later without a person. Failures are logged and counted,
  never fatal.

At start the daemon reads the health file it wrote before (a restart, an upgrade) and carries the
faulty GPUs' classes over, for the GPUs that still exist, until they recover as the recovery policy
says: a restart does not forget a fault. Temporary files a killed daemon left beside the file are
removed. A fault a remediation cleared is not carried over: the gpuops.k8s.gpu_faults module leaves
notices in the file beside the health file (its name and `.cleared`), each naming a class, the GPUs
(none: all) and when it holds: `time`, for a GPU reset done while the daemon was stopped (the faults
last changed up to then), or `boot`, for a reboot (the faults of a health file written in that boot,
once the node runs another one; the file says the boot it was written in). Faults of a higher class
are carried over whatever a notice says.

A failure to write the file is logged and counted too: faults are shown where they can be, and the
daemon's job for the kubelet never depends on them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import glob
import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from gpu_device_plugin._shared import xid_classes
from gpu_device_plugin.config import Config, ConfigError, is_node_name
from gpu_device_plugin.dra.cdi import write_atomically
from gpu_device_plugin.health import LOST
from gpu_device_plugin.metrics import Metrics
from gpu_device_plugin.state import DeviceState

log = logging.getLogger(__name__)

CONDITION_TYPE = "GPUHealthy"
HEALTH_FILE_VERSION = 1
CLEARED_SUFFIX = ".cleared"  # the remediation's notices, beside the health file
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
# A POST that fails is tried this many times in all, pausing WEBHOOK_RETRY_SECONDS, then twice that, ...
WEBHOOK_ATTEMPTS = 3
WEBHOOK_RETRY_SECONDS = 1.0
WEBHOOK_ANSWER_LIMIT = 65536  # bytes of the receiver's answer read (and thrown away)
# Answers worth trying again: the receiver is busy or away for a moment.
_TRANSIENT = {408, 425, 429, 500, 502, 503, 504}
# The condition is asserted again this often (a Node object created again has lost it).
CONDITION_REFRESH_SECONDS = 300.0
CONDITION_RETRY_SECONDS = 1.0
CONDITION_RETRY_MAX_SECONDS = 30.0
MESSAGE_LIMIT = 1024


def current_boot_id() -> str:
    """The kernel's boot ID; empty where it cannot be read (a notice bound to a boot then never holds)."""
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return ""


class NodeConditions(Protocol):
    """Sets one condition of a Node, leaving the others as they are (dra.kubeapi.KubeApi)."""

    def set_node_condition(self, node_name: str, condition: dict[str, Any]) -> bool:
        """Write the condition unless the Node already has it; True when it was written. OSError on failure."""


def iso(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def from_iso(text: Any) -> Optional[float]:
    """The wall clock an `iso` string names; None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return None
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp()


def node_name_of(config: Config) -> str:
    """The name the daemon gives its node: the configured one, else the host name in lower case (a Node's
    name is a lower-case DNS subdomain, the kubelet's default is the host name lowered). ConfigError of one
    sentence when the alert webhook is on and the host name cannot be a Node's name: the receiver would
    refuse every alert."""
    if config.node_name:
        return config.node_name
    host = socket.gethostname()
    name = host.lower()
    if config.alert_webhook and not is_node_name(name):
        raise ConfigError(
            f"the host name {host!r} is not a Kubernetes node name (a lower-case DNS subdomain), which the alert"
            " webhook needs: set nodeName (--node-name or the NODE_NAME variable)."
        )
    return name


class WebhookFailure(Exception):
    """One POST failed; `transient`: worth trying again."""

    def __init__(self, reason: str, transient: bool) -> None:
        super().__init__(reason)
        self.transient = transient


@dataclass
class _Alert:
    """An alert sent for a GPU that is still in its class: sent again at `due` (the loop's clock)."""

    payload: dict[str, Any]
    interval: float
    due: float


class FaultReporter:
    def __init__(
        self,
        config: Config,
        state: DeviceState,
        metrics: Metrics,
        conditions: Optional[NodeConditions] = None,
        wall_clock: Callable[[], float] = lambda: datetime.datetime.now(datetime.timezone.utc).timestamp(),
        boot_id: Optional[str] = None,
    ) -> None:
        self.config = config
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        self.state = state
        self.metrics = metrics
        self.conditions = conditions
        self.node_name = node_name_of(config)
        self._now = wall_clock
        self._shown: Optional[list[dict[str, Any]]] = None
        self._file_error: Optional[str] = None
        self._gauged: set[str] = set()
        self._announced: dict[str, str] = {}  # GPU UUID -> the class last POSTed for it
        self._alerts: dict[str, _Alert] = {}  # GPU UUID -> the alert sent again while it stays in its class
        self._alerts_changed = asyncio.Event()
        self._resend_task: Optional[asyncio.Task[None]] = None
        self._carried: dict[str, dict[str, Any]] = {}  # GPU UUID -> its row in the health file read at start
        self._condition: Optional[dict[str, Any]] = None
        self._condition_wanted = asyncio.Event()
        self._condition_task: Optional[asyncio.Task[None]] = None
        self._webhook = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="alert-webhook")
        self.webhook_posts: list[concurrent.futures.Future[bool]] = []  # the latest ones, for /healthz and tests

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.carry_over()
        self.state.on_published.append(self.update)
        if self.conditions is not None and self.config.node_condition:
            self._condition_task = asyncio.ensure_future(self._condition_loop())
        self._resend_task = asyncio.ensure_future(self._resend_loop())
        self.update()

    def stop(self) -> None:
        if self.update in self.state.on_published:
            self.state.on_published.remove(self.update)
        if self._condition_task is not None:
            self._condition_task.cancel()
        if self._resend_task is not None:
            self._resend_task.cancel()
        self._webhook.shutdown(wait=False)

    def configure(self, config: Config) -> None:
        """A reloaded configuration: the file, the webhook and the condition follow it from the next change."""
        moved = config.health_file != self.config.health_file
        try:
            self.node_name = node_name_of(config)
        except ConfigError as exc:
            log.error("SIGHUP: %s Alerts keep the name %s.", exc, self.node_name)
        self.config = config
        if moved:
            self._shown = None
        self.update()

    # -- the view ------------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """Every GPU of the inventory with its health, class and XIDs, in index order."""
        tracker = self.state.tracker
        gpus = [(gpu.uuid, gpu.index, gpu.pci_bus_id) for gpu in self.state.inventory.gpus]
        present = {uuid for uuid, _index, _pci in gpus}
        # A GPU carried over from the health file stays in it until the inventory says whether it still exists.
        for uuid, row in list(self._carried.items()):
            if uuid in present or not tracker.knows(uuid):
                del self._carried[uuid]
            else:
                gpus.append((uuid, row["index"], row["pci"]))
        rows = []
        for uuid, index, pci in sorted(gpus, key=lambda g: (g[1], g[0])):
            faults = tracker.faults(uuid)
            rows.append(
                {
                    "uuid": uuid,
                    "index": index,
                    "pci": pci,
                    "healthy": faults.healthy,
                    "class": faults.fault_class,
                    "reason": faults.reason,
                    "xid": faults.xid,
                    "updated": iso(faults.changed_at) if faults.changed_at else None,
                    "xids": [dict(x, time=iso(x["time"])) for x in faults.xids],
                }
            )
        return rows

    def update(self) -> None:
        rows = self.rows()
        if rows == self._shown:
            return
        self._shown = rows
        self._gauge(rows)
        self._write_file(rows)
        self._announce(rows)
        self._want_condition(rows)

    # -- the health file -----------------------------------------------------------------------
    def _write_file(self, rows: list[dict[str, Any]]) -> None:
        path = self.config.health_file
        if path in ("", "off"):
            return
        document = {
            "version": HEALTH_FILE_VERSION,
            "node": self.node_name,
            "boot": self.boot_id,
            "updated": iso(self._now()),
            "gpus": [{k: v for k, v in row.items() if k != "xid"} for row in rows],
        }
        try:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            text = json.dumps(document, indent=1, sort_keys=True) + "\n"
            write_atomically(path, text, mode=0o644, prefix=_temporary_prefix(path))
        except OSError as exc:
            message = f"cannot write the GPU health file {path}: {exc.strerror or exc}"
            self.metrics.errors.labels("health_file").inc()
            if message != self._file_error:
                log.warning(message, extra={"path": path})
            self._file_error = message
            self._shown = None  # try again at the next change
            return
        if self._file_error is not None:
            log.info("the GPU health file is written again", extra={"path": path})
        self._file_error = None

    def carry_over(self) -> None:
        """Read the health file the daemon wrote before and give its faulty GPUs' classes back to the tracker
        (which keeps them until the GPU recovers, or forgets them when the inventory lacks the GPU); remove
        the temporary files a killed writer left. A file that cannot be read carries nothing over (logged)."""
        path = self.config.health_file
        if path in ("", "off"):
            return
        for leftover in glob.glob(glob.escape(_temporary_prefix(path)) + "*"):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
                log.info("removed a temporary file a stopped daemon left", extra={"path": leftover})
        try:
            with open(path, encoding="utf-8") as handle:
                document = json.load(handle)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning(
                "cannot read the GPU health file %s: no fault is carried over from before the start",
                path,
                extra={"path": path, "reason": str(exc)},
            )
            return
        rows = document.get("gpus") if isinstance(document, dict) else None
        if (
            not isinstance(document, dict)
            or document.get("version") != HEALTH_FILE_VERSION
            or not isinstance(rows, list)
        ):
            log.warning(
                "the GPU health file %s is not one the daemon writes: no fault is carried over",
                path,
                extra={"path": path},
            )
            return
        notices = self._cleared_notices(path)
        carried, cleared = [], []
        for row in rows:
            if not isinstance(row, dict) or row.get("healthy") is not False:
                continue
            uuid, name, index = row.get("uuid"), row.get("class"), row.get("index")
            if not isinstance(uuid, str) or name not in xid_classes.CLASSES or name == "none":
                continue
            if not isinstance(index, int) or isinstance(index, bool):
                continue
            if any(self._clears(notice, document, row) for notice in notices):
                cleared.append({"device": uuid, "class": name})
                continue
            xids = []
            for item in row.get("xids") or []:
                moment = from_iso(item.get("time")) if isinstance(item, dict) else None
                if moment is not None and isinstance(item.get("xid"), int):
                    xids.append(dict(item, time=moment))
            # The XID that gave the class (the file keeps each XID's class); none for a GPU lost without one.
            last = next((x["xid"] for x in xids if x.get("class") == name), None)
            reason = str(row.get("reason") or "")
            if self.state.tracker.restore(uuid, str(name), reason, last, xids, from_iso(row.get("updated"))):
                self._carried[uuid] = {"index": index, "pci": str(row.get("pci") or "")}
                carried.append({"device": uuid, "class": name})
        if cleared:
            log.info("GPU faults a remediation cleared are not carried over", extra={"path": path, "gpus": cleared})
        if carried:
            log.warning("GPU faults carried over from before the start", extra={"path": path, "gpus": carried})

    @staticmethod
    def _cleared_notices(path: str) -> list[dict[str, Any]]:
        """The remediation's notices beside the health file; none when there is no such file or it cannot be
        read (logged): the faults are then carried over."""
        notices_path = path + CLEARED_SUFFIX
        try:
            with open(notices_path, encoding="utf-8") as handle:
                document = json.load(handle)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning(
                "cannot read the remediation's notices %s: every fault is carried over",
                notices_path,
                extra={"path": notices_path, "reason": str(exc)},
            )
            return []
        notices = document.get("notices") if isinstance(document, dict) else None
        return [n for n in notices if isinstance(n, dict)] if isinstance(notices, list) else []

    def _clears(self, notice: dict[str, Any], document: dict[str, Any], row: dict[str, Any]) -> bool:
        """Whether a remediation's notice covers a fault of the health file: its class is the notice's or
        below, on a GPU it names (none named: every GPU), and the notice holds (a reset's, for a fault last
        changed up to its time; a reboot's, for a file written in its boot, now that the node runs another)."""
        name, gpus = notice.get("class"), notice.get("gpus")
        if name not in xid_classes.CLASSES or not isinstance(gpus, list):
            return False
        if xid_classes.rank(str(row.get("class"))) > xid_classes.rank(name):
            return False
        if gpus and row.get("uuid") not in gpus and row.get("pci") not in gpus:
            return False
        boot = notice.get("boot")
        if isinstance(boot, str) and boot:
            return document.get("boot") == boot and bool(self.boot_id) and self.boot_id != boot
        until, updated = from_iso(notice.get("time")), from_iso(row.get("updated"))
        return until is not None and updated is not None and updated <= until

    # -- /metrics ------------------------------------------------------------------------------
    def _gauge(self, rows: list[dict[str, Any]]) -> None:
        gauge = self.metrics.fault_class
        present = {row["uuid"] for row in rows}
        for uuid in self._gauged - present:
            for name in xid_classes.CLASSES:
                gauge.remove(uuid, name)
        for row in rows:
            for name in xid_classes.CLASSES:
                gauge.labels(row["uuid"], name).set(1 if row["class"] == name else 0)
        self._gauged = present

    # -- the alert webhook ---------------------------------------------------------------------
    def _announce(self, rows: list[dict[str, Any]]) -> None:
        present = {row["uuid"] for row in rows}
        for uuid in set(self._alerts) - present:
            del self._alerts[uuid]
        for row in rows:
            uuid, name = row["uuid"], row["class"]
            if xid_classes.rank(name) <= xid_classes.rank("device"):
                if row["healthy"]:
                    self._announced.pop(uuid, None)  # healthy again: the next rise is news
                    self._alerts.pop(uuid, None)  # and nothing is sent again
                continue
            if self._announced.get(uuid) == name:
                continue
            self._announced[uuid] = name
            last = row["xids"][-1]["time"] if row["xids"] else iso(self._now())
            payload = {
                "node": self.node_name,
                "gpu": row["index"],
                "uuid": uuid,
                "xid": row["xid"],
                "class": name,
                "reason": row["reason"],
                "time": last,
            }
            resend = self.config.alert_resend_seconds
            if resend is None or not self.config.alert_webhook:
                self._alerts.pop(uuid, None)
            else:
                self._alerts[uuid] = _Alert(payload, resend, self._loop_time() + resend)
                self._alerts_changed.set()
            self._send(payload)

    def _send(self, payload: dict[str, Any]) -> None:
        if not self.config.alert_webhook:
            return
        future = self._webhook.submit(self._post, self.config.alert_webhook, payload)
        self.webhook_posts = [*self.webhook_posts[-15:], future]

    @staticmethod
    def _loop_time() -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()

    async def _resend_loop(self) -> None:
        """Send each alert again while its GPU stays in its class, the pause doubling up to the maximum."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for uuid, alert in list(self._alerts.items()):
                if not self.config.alert_webhook or self.config.alert_resend_seconds is None:
                    del self._alerts[uuid]  # switched off by a reload
                    continue
                if alert.due > now:
                    continue
                log.info(
                    "the GPU is still faulty: sending its alert again",
                    extra={"device": uuid, "class": alert.payload["class"], "after_seconds": alert.interval},
                )
                self._send(alert.payload)
                alert.interval = min(alert.interval * 2, max(self.config.alert_resend_max_seconds, alert.interval))
                alert.due = now + alert.interval
            self._alerts_changed.clear()
            wait = min((alert.due for alert in self._alerts.values()), default=None)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._alerts_changed.wait(), None if wait is None else max(wait - now, 0.0))

    def _post(self, url: str, payload: dict[str, Any]) -> bool:
        """POST one alert (in the webhook's thread), trying again after a transient failure; False when it
        failed, which is logged and counted."""
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "gpuops-k8s"}
        where = {"url": url, "device": payload["uuid"], "class": payload["class"]}
        try:
            if self.config.alert_webhook_token_file:
                if urllib.parse.urlsplit(url).scheme == "http" and not self.config.alert_webhook_token_over_http:
                    raise WebhookFailure(
                        "the alert webhook is a plain http URL and the token is sent over https only"
                        " (alertWebhookTokenOverHttp allows http): the alert is not sent",
                        transient=False,
                    )
                with open(self.config.alert_webhook_token_file, encoding="utf-8") as handle:
                    headers["Authorization"] = f"Bearer {handle.read().strip()}"
        except (OSError, WebhookFailure) as exc:
            return self._failed(where, str(exc), 0)
        pause = WEBHOOK_RETRY_SECONDS
        for attempt in range(1, WEBHOOK_ATTEMPTS + 1):
            try:
                self._post_once(url, body, headers)
            except WebhookFailure as exc:
                if not exc.transient or attempt == WEBHOOK_ATTEMPTS:
                    return self._failed(where, str(exc), attempt)
                log.info(
                    "the alert webhook failed; trying again", extra=dict(where, reason=str(exc), retry_seconds=pause)
                )
                time.sleep(pause)
                pause *= 2
                continue
            log.info("alert sent", extra=where)
            return True
        return False  # not reached: the last attempt returns

    def _failed(self, where: dict[str, Any], reason: str, attempts: int) -> bool:
        self.metrics.errors.labels("alert_webhook").inc()
        log.warning("the alert webhook failed", extra=dict(where, reason=reason, attempts=attempts))
        return False

    def _post_once(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        """One POST within one deadline for all of it (connect, send, the answer); WebhookFailure unless the
        receiver answered 2xx. A redirect is not followed: it is a failure."""
        parts = urllib.parse.urlsplit(url)
        timeout = self.config.alert_webhook_timeout_seconds
        try:
            connection: http.client.HTTPConnection
            if parts.scheme == "https":
                connection = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout)
            else:
                connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
        except ValueError as exc:  # a port that is not a number
            raise WebhookFailure(f"the URL is not usable: {exc}", transient=False) from None
        expired = threading.Event()
        sockets: list[socket.socket] = []  # the connection's own; it lets go of it once the answer began

        def cut() -> None:  # the deadline: whatever the connection waits on ends now
            expired.set()
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(timeout, cut)
        timer.daemon = True
        timer.start()
        try:
            connection.connect()
            if connection.sock is not None:
                sockets.append(connection.sock)
            if expired.is_set():
                cut()
            target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
            connection.request("POST", target, body=body, headers=headers)
            response = connection.getresponse()
            response.read(WEBHOOK_ANSWER_LIMIT)
            status = response.status
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if expired.is_set():
                raise WebhookFailure(f"no answer within {timeout:g} seconds", transient=True) from None
            # A certificate the daemon does not trust stays untrusted: not worth asking again.
            raise WebhookFailure(
                str(getattr(exc, "reason", None) or exc) or type(exc).__name__,
                transient=not isinstance(exc, ssl.SSLError),
            ) from None
        finally:
            timer.cancel()
            connection.close()
        if expired.is_set():
            raise WebhookFailure(f"no answer within {timeout:g} seconds", transient=True)
        if 300 <= status < 400:
            raise WebhookFailure(
                f"the receiver answered {status}, a redirect, which is not followed (the token stays here)",
                transient=False,
            )
        if not 200 <= status < 300:
            raise WebhookFailure(f"the receiver answered {status}", transient=status in _TRANSIENT)

    # -- the Node condition --------------------------------------------------------------------
    def condition(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """GPUHealthy as the rows make it: False naming each unhealthy GPU (the worst first), else True."""
        sick = [row for row in rows if not row["healthy"]]
        if not sick:
            return {
                "type": CONDITION_TYPE,
                "status": "True",
                "reason": "GPUsHealthy",
                "message": f"All {len(rows)} GPUs are healthy.",
            }
        sick.sort(key=lambda row: (-xid_classes.rank(row["class"]), row["index"]))
        worst = sick[0]
        if worst["xid"] is not None:
            reason = f"XID{worst['xid']}"
        elif worst["reason"].startswith(LOST):
            reason = "GPUFellOffTheBus"
        else:
            reason = "GPUUnhealthy"
        parts = [
            f"GPU {row['index']} ({row['uuid']}): class {row['class']}, {row['reason'] or 'unhealthy'}" for row in sick
        ]
        message = "; ".join(parts) + "."
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 20].rsplit(";", 1)[0] + f"; and {len(sick)} in all."
        return {"type": CONDITION_TYPE, "status": "False", "reason": reason, "message": message}

    def _want_condition(self, rows: list[dict[str, Any]]) -> None:
        if self.conditions is None or not self.config.node_condition:
            return
        self._condition = self.condition(rows)
        self._condition_wanted.set()

    async def _condition_loop(self) -> None:
        loop = asyncio.get_running_loop()
        retry = CONDITION_RETRY_SECONDS
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._condition_wanted.wait(), CONDITION_REFRESH_SECONDS)
            self._condition_wanted.clear()
            wanted = self._condition
            if wanted is None or self.conditions is None:
                continue
            try:
                wrote = await loop.run_in_executor(None, self.conditions.set_node_condition, self.node_name, wanted)
            except Exception as exc:  # an unreadable answer as well as an absent server: the loop goes on
                log.warning(
                    "cannot set the Node condition GPUHealthy; retrying",
                    extra={
                        "node": self.node_name,
                        "reason": str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}",
                        "retry_seconds": retry,
                    },
                )
                self.metrics.errors.labels("node_condition").inc()
                await asyncio.sleep(retry)
                retry = min(retry * 2, CONDITION_RETRY_MAX_SECONDS)
                self._condition_wanted.set()
                continue
            retry = CONDITION_RETRY_SECONDS
            if wrote:
                log.info(
                    "Node condition GPUHealthy set",
                    extra={"node": self.node_name, "status": wanted["status"], "reason": wanted["reason"]},
                )


def _temporary_prefix(path: str) -> str:
    """The name the health file's temporary files start with (beside it, hidden)."""
    return os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp-")


def default_conditions(config: Config) -> Optional[NodeConditions]:
    """The API server client where the daemon has credentials for it and a node name: a kubeconfig
    (`--kubeconfig`, as in dra mode under systemd) or a ServiceAccount token mounted in its pod. None
    otherwise (the device-plugin mode under systemd has neither), and where the client library is not
    installed; the reason is logged once."""
    if not config.node_condition:
        return None
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(token)
    if not config.node_name or not (config.kubeconfig or in_cluster):
        log.info(
            "no API server credentials and node name: the Node condition GPUHealthy is not set",
            extra={"node_name": config.node_name or None, "kubeconfig": config.kubeconfig or None},
        )
        return None
    try:
        from gpu_device_plugin.dra.kubeapi import KubeApi, KubeApiError
    except ImportError as exc:
        log.warning(
            "the kubernetes client is not installed: the Node condition GPUHealthy is not set",
            extra={"reason": str(exc)},
        )
        return None
    try:
        return KubeApi(config.kubeconfig or None)
    except (KubeApiError, ImportError) as exc:
        log.warning("the Node condition GPUHealthy is not set", extra={"reason": str(exc)})
        return None
