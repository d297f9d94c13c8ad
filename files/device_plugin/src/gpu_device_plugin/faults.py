"""GPU faults shown to the node and the fleet: the health file, the class gauge, the Node condition
`GPUHealthy` and the alert webhook.

After every publish of the device state, each GPU's health, remediation class and last XIDs (from
health.HealthTracker) are compared with what was last shown; on a change:

- the health file (`healthFile`, default /var/lib/gpuops/gpu-health.json) is written again, atomically
  (a temporary file renamed over it), for the gpuops.k8s.gpu_faults module and the remediation playbook;
- `gpuops_gpu_fault_class{gpu=UUID, class=...}` is 1 for the GPU's class and 0 for the other classes;
- where the daemon can reach the API server (a `NodeConditions` writer exists), the Node condition
  `GPUHealthy` is set, in a worker thread, the latest state only, retried while the API server is away;
- a GPU whose class rose above `device` is announced to the alert webhook (`alertWebhook`) once per
  (GPU, class): a POST of JSON {node, gpu, uuid, xid, class, reason, time} from a thread of its own, so
  the event loop never waits on it; a failed POST is logged and counted, never retried, never fatal.

A failure to write the file is logged and counted too: faults are shown where they can be, and the
daemon's job for the kubelet never depends on them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import json
import logging
import os
import socket
import tempfile
import urllib.error
import urllib.request
from typing import Any, Callable, Optional, Protocol

from gpu_device_plugin._shared import xid_classes
from gpu_device_plugin.config import Config
from gpu_device_plugin.health import LOST
from gpu_device_plugin.metrics import Metrics
from gpu_device_plugin.state import DeviceState

log = logging.getLogger(__name__)

CONDITION_TYPE = "GPUHealthy"
HEALTH_FILE_VERSION = 1
WEBHOOK_TIMEOUT_SECONDS = 5.0
# The condition is asserted again this often (a Node object created again has lost it).
CONDITION_REFRESH_SECONDS = 300.0
CONDITION_RETRY_SECONDS = 1.0
CONDITION_RETRY_MAX_SECONDS = 30.0
MESSAGE_LIMIT = 1024


class NodeConditions(Protocol):
    """Sets one condition of a Node, leaving the others as they are (dra.kubeapi.KubeApi)."""

    def set_node_condition(self, node_name: str, condition: dict[str, Any]) -> bool:
        """Write the condition unless the Node already has it; True when it was written. OSError on failure."""


def iso(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FaultReporter:
    def __init__(
        self,
        config: Config,
        state: DeviceState,
        metrics: Metrics,
        conditions: Optional[NodeConditions] = None,
        wall_clock: Callable[[], float] = lambda: datetime.datetime.now(datetime.timezone.utc).timestamp(),
    ) -> None:
        self.config = config
        self.state = state
        self.metrics = metrics
        self.conditions = conditions
        self.node_name = config.node_name or socket.gethostname()
        self._now = wall_clock
        self._shown: Optional[list[dict[str, Any]]] = None
        self._file_error: Optional[str] = None
        self._gauged: set[str] = set()
        self._announced: dict[str, str] = {}  # GPU UUID -> the class last POSTed for it
        self._condition: Optional[dict[str, Any]] = None
        self._condition_wanted = asyncio.Event()
        self._condition_task: Optional[asyncio.Task[None]] = None
        self._webhook = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="alert-webhook")
        self.webhook_posts: list[concurrent.futures.Future[bool]] = []  # the latest ones, for /healthz and tests

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.state.on_published.append(self.update)
        if self.conditions is not None and self.config.node_condition:
            self._condition_task = asyncio.ensure_future(self._condition_loop())
        self.update()

    def stop(self) -> None:
        if self.update in self.state.on_published:
            self.state.on_published.remove(self.update)
        if self._condition_task is not None:
            self._condition_task.cancel()
        self._webhook.shutdown(wait=False)

    def configure(self, config: Config) -> None:
        """A reloaded configuration: the file, the webhook and the condition follow it from the next change."""
        moved = config.health_file != self.config.health_file
        self.config = config
        if moved:
            self._shown = None
        self.update()

    # -- the view ------------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """Every GPU of the inventory with its health, class and XIDs, in index order."""
        tracker = self.state.tracker
        rows = []
        for gpu in sorted(self.state.inventory.gpus, key=lambda g: g.index):
            faults = tracker.faults(gpu.uuid)
            rows.append(
                {
                    "uuid": gpu.uuid,
                    "index": gpu.index,
                    "pci": gpu.pci_bus_id,
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
            "updated": iso(self._now()),
            "gpus": [{k: v for k, v in row.items() if k != "xid"} for row in rows],
        }
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpu-health-")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(document, handle, indent=1, sort_keys=True)
                    handle.write("\n")
                os.chmod(tmp, 0o644)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
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
        for row in rows:
            uuid, name = row["uuid"], row["class"]
            if xid_classes.rank(name) <= xid_classes.rank("device"):
                if row["healthy"]:
                    self._announced.pop(uuid, None)  # healthy again: the next rise is news
                continue
            if self._announced.get(uuid) == name:
                continue
            self._announced[uuid] = name
            if not self.config.alert_webhook:
                continue
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
            future = self._webhook.submit(self._post, self.config.alert_webhook, payload)
            self.webhook_posts = [*self.webhook_posts[-15:], future]

    def _post(self, url: str, payload: dict[str, Any]) -> bool:
        """POST one alert (in the webhook's thread); False when it failed, which is logged and counted."""
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "gpuops-k8s"}
        try:
            if self.config.alert_webhook_token_file:
                with open(self.config.alert_webhook_token_file, encoding="utf-8") as handle:
                    headers["Authorization"] = f"Bearer {handle.read().strip()}"
            request = urllib.request.Request(url, data=body, method="POST", headers=headers)
            with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_SECONDS) as response:
                response.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            self.metrics.errors.labels("alert_webhook").inc()
            log.warning(
                "the alert webhook failed",
                extra={"url": url, "device": payload["uuid"], "class": payload["class"], "reason": str(reason)},
            )
            return False
        log.info("alert sent", extra={"url": url, "device": payload["uuid"], "class": payload["class"]})
        return True

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
            except OSError as exc:
                log.warning(
                    "cannot set the Node condition GPUHealthy; retrying",
                    extra={"node": self.node_name, "reason": str(exc), "retry_seconds": retry},
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
