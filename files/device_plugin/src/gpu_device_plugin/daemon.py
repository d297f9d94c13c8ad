"""Wires the pieces together on one asyncio loop: backend -> state -> the allocation mode's kubelet
plugin -> signals and the metrics endpoint.

The kubelet plugin is one of two: `registration.DevicePluginNode` (device-plugin mode: one socket per
resource, registered with the kubelet) or `dra.node.DraNode` (dra mode: the kubelet's DRA plugin API,
with the claim reader and slice publisher the `api_side` factory gives, by default the API server client
of gpu_device_plugin.dra.kubeapi, loaded only then). Both serve their sockets with
`unix_server.UnixServer`, and the daemon runs either the same way: start it, serve until a signal,
stop it."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Awaitable, Callable, Optional, Protocol

from gpu_device_plugin import allocation, dcgm, gpu_pods, hostdriver
from gpu_device_plugin.config import Config, ConfigError
from gpu_device_plugin.discovery import BackendError, NvmlBackend, make_backend
from gpu_device_plugin.dra.node import ApiSide, DraNode, default_api_side
from gpu_device_plugin.faults import FaultReporter, NodeConditions, default_conditions
from gpu_device_plugin.health import HealthTracker, NvmlEventWatcher, policy_from
from gpu_device_plugin.metrics import HttpEndpoint, Metrics
from gpu_device_plugin.registration import DevicePluginNode
from gpu_device_plugin.state import DeviceState

log = logging.getLogger(__name__)


class KubeletPlugin(Protocol):
    """What the daemon runs for its allocation mode (DevicePluginNode or DraNode)."""

    async def start(self) -> bool:
        """Serve the sockets; False when it cannot (the reason is logged)."""

    async def stop(self) -> None:
        """Stop serving and remove the sockets."""

    def refuses(self, config: Config) -> Optional[str]:
        """Why a reloaded configuration cannot be taken without a restart, or None."""

    async def reload(
        self,
        config: Config,
        policy: Any,
        builder: allocation.ResponseBuilder,
        adopt_config: Callable[[Config], Awaitable[bool]],
    ) -> None:
        """Take a reloaded configuration; `adopt_config` restarts the backend if its settings changed."""

    def serving(self) -> bool:
        """Every socket is served (called from the HTTP thread)."""

    def status(self) -> dict[str, Any]:
        """The mode's part of /healthz (called from the HTTP thread)."""

    def not_ready(self, status: dict[str, Any]) -> list[str]:
        """One sentence per reason the mode is not doing its job for the kubelet yet."""


class Daemon:
    def __init__(
        self,
        config: Config,
        reload_config: Optional[Callable[[], Config]] = None,
        nvml: Any = None,
        install_signal_handlers: bool = True,
        api_side: ApiSide = default_api_side,
        conditions_side: Callable[[Config], Optional[NodeConditions]] = default_conditions,
    ) -> None:
        self.config = config
        self.api_side = api_side
        self.conditions_side = conditions_side
        self.faults: Optional[FaultReporter] = None
        self.node: Optional[KubeletPlugin] = None
        self.reload_config = reload_config
        self.nvml = nvml
        self.install_signal_handlers = install_signal_handlers
        self.metrics = Metrics()
        self.backend_error: Optional[str] = None
        self.ready: Optional[asyncio.Event] = None  # set once serving; created on the loop in run()
        self._stop: Optional[asyncio.Event] = None
        self._backend: Any = None
        self._events: Optional[NvmlEventWatcher] = None
        self._http: Optional[HttpEndpoint] = None
        # GPU telemetry under dcgm-exporter's names (dcgm.py), with the nvml backend only; the last XID per GPU is
        # its DCGM_FI_DEV_XID_ERRORS.
        self._dcgm: Optional[dcgm.Sampler] = None
        self._dcgm_listener: Optional[dcgm.Listener] = None
        self.last_xid: dict[str, int] = {}
        self._pods_error: Optional[str] = None  # why the last List of the kubelet's pod resources failed
        self._retry_task: Optional[asyncio.Task[None]] = None
        self.exit_code = 0

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        self.state = DeviceState(self.config, HealthTracker(self._policy(self.config)), self.metrics)
        node = self.node = self._kubelet_plugin()
        # Before the backend: its first inventory is the health file's first content.
        self.faults = FaultReporter(self.config, self.state, self.metrics, self.conditions_side(self.config))
        self.faults.start()
        if not await self._start_backend():
            self.faults.stop()
            return 1
        if self.config.metrics_address:
            self._http = HttpEndpoint(self.config.metrics_address, self.metrics, self.healthz, self.readyz)
            self._http.start()
        if self.install_signal_handlers:  # before serving: a SIGTERM during the first Register stops cleanly
            self._loop.add_signal_handler(signal.SIGTERM, self.stop)
            self._loop.add_signal_handler(signal.SIGINT, self.stop)
            self._loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        if not await node.start():
            self._release()
            return 1
        self.ready.set()
        await self._stop.wait()
        await node.stop()
        self._release()
        log.info("stopped")
        return self.exit_code

    def _kubelet_plugin(self) -> KubeletPlugin:
        if self.config.allocation_mode == "dra":
            return DraNode(self.config, self.state, self.api_side)
        return DevicePluginNode(self.config, self.state, self._builder(self.config), self.metrics)

    def stop(self) -> None:
        log.info("stopping")
        if self._stop is not None:
            self._stop.set()

    def _release(self) -> None:
        if self._retry_task is not None:
            self._retry_task.cancel()
        if self.faults is not None:
            self.faults.stop()
        self._stop_backend()
        if self._http is not None:
            self._http.stop()
        if self._dcgm_listener is not None:
            self._dcgm_listener.stop()
            self._dcgm_listener = None

    # -- backend -------------------------------------------------------------------------------
    def _policy(self, config: Config) -> Any:
        try:
            return policy_from(
                config.disable_healthchecks,
                config.enable_healthchecks,
                config.health_recovery_seconds,
                config.xid_overrides,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _builder(self, config: Config) -> allocation.ResponseBuilder:
        needs_host = "mounts" in config.device_list_strategy or config.pass_device_specs
        return allocation.ResponseBuilder(config, hostdriver.find(config.mounts) if needs_host else None)

    async def _start_backend(self) -> bool:
        self._backend = make_backend(self.config.backend, self.config.simulated_spec, self.nvml, self.config.mounts)
        try:
            self._backend.init()
        except BackendError as exc:
            self.backend_error = str(exc)
            self.metrics.errors.labels("backend_init").inc()
            if self.config.fail_on_init_error:
                log.error(
                    "cannot discover GPUs; exiting (set failOnInitError false to keep running)",
                    extra={"backend": self._backend.name, "reason": str(exc)},
                )
                return False
            log.error(
                "cannot discover GPUs; advertising none and retrying",
                extra={
                    "backend": self._backend.name,
                    "reason": str(exc),
                    "retry_seconds": self.config.init_retry_seconds,
                },
            )
            self._retry_task = asyncio.ensure_future(self._retry_backend())
            return True
        self._backend_ready()
        return True

    async def _retry_backend(self) -> None:
        while True:
            await asyncio.sleep(self.config.init_retry_seconds)
            try:
                self._backend.init()
            except BackendError as exc:
                self.backend_error = str(exc)
                self.metrics.errors.labels("backend_init").inc()
                log.warning("GPU discovery still failing", extra={"reason": str(exc)})
                continue
            log.info("GPU discovery works now", extra={"backend": self._backend.name})
            self._backend_ready()
            return

    def _backend_ready(self) -> None:
        self.backend_error = None
        backend = self._backend
        self.state.set_inventory(backend.snapshot())
        backend.start(self._loop, lambda: self.state.set_inventory(backend.snapshot()))
        if isinstance(backend, NvmlBackend):
            loop, state, last_xid = self._loop, self.state, self.last_xid

            def on_xid(uuid: str, xid: int, data: Optional[str] = None) -> None:
                last_xid[uuid] = xid
                loop.call_soon_threadsafe(state.on_xid, uuid, xid, True, data)

            self._events = NvmlEventWatcher(
                backend.nvml,
                [g.uuid for g in backend.snapshot().gpus],
                on_xid,
                lambda uuid: loop.call_soon_threadsafe(state.on_lost, uuid),
                back=lambda uuid: loop.call_soon_threadsafe(state.on_back, uuid),
            )
            self._events.start()
        self._start_dcgm(backend)

    def _start_dcgm(self, backend: Any) -> None:
        """The dcgm metrics' sampler on the backend's NVML, and their listener (once: it outlives a new backend)."""
        address = self.config.dcgm_metrics_address
        if not address:
            return
        if not isinstance(backend, NvmlBackend):
            log.warning("the dcgm metrics read NVML: off with the %s backend", backend.name)
            return
        self._dcgm = dcgm.Sampler(
            backend.nvml,
            backend.snapshot,
            self.config.dcgm_interval_seconds,
            dcgm.hostname_label(self.config.node_name),
            self.last_xid.get,
            self.gpu_holders,
        )
        self._dcgm.start()
        if self._dcgm_listener is None:
            try:
                self._dcgm_listener = dcgm.Listener(address, self.dcgm_metrics)
            except OSError as exc:
                # Telemetry never stops the GPUs from being served: a port taken (dcgm-exporter on the node, say)
                # leaves the metrics off, said once, and is tried again when NVML is next started.
                log.error("the dcgm metrics are not served: %s cannot listen (%s)", address, exc.strerror or exc)
                return
            self._dcgm_listener.start()

    def gpu_holders(self, inventory: Any) -> dict[str, list[tuple[tuple[str, str], ...]]]:
        """The containers holding each GPU, from the kubelet's pod-resources API (called by the dcgm sampler's thread
        with each reading); none when the setting is empty or the kubelet does not answer (said once per cause)."""
        socket = self.config.pod_resources_socket
        if not socket:
            return {}
        try:
            response = gpu_pods.list_pod_resources(socket, timeout=5.0)
        except gpu_pods.GpuPodsError as exc:
            if str(exc) != self._pods_error:
                log.warning("the dcgm metrics carry no pod labels until the kubelet answers: %s", exc)
            self._pods_error = str(exc)
            return {}
        if self._pods_error is not None:
            log.info("the dcgm metrics carry pod labels again")
        self._pods_error = None
        return gpu_pods.holders_by_gpu(response, gpu_pods.device_map(inventory, self.config))

    def dcgm_metrics(self) -> bytes:
        """The last reading of the dcgm metrics (called from the listener's thread)."""
        sampler = self._dcgm
        return sampler.render() if sampler is not None else b""

    def _stop_backend(self) -> None:
        if self._dcgm is not None:
            self._dcgm.stop()
            self._dcgm = None
        if self._events is not None:
            self._events.stop()
            self._events.join(timeout=3)
            self._events = None
        if self._backend is not None:
            self._backend.stop()

    # -- reload and health ---------------------------------------------------------------------
    async def reload(self) -> None:
        if self.reload_config is None or self.node is None:
            return
        try:
            config = self.reload_config()
            policy = self._policy(config)
            builder = self._builder(config)
        except ConfigError as exc:
            self.metrics.errors.labels("config").inc()
            log.error("SIGHUP: configuration rejected; keeping the running one", extra={"reason": str(exc)})
            return
        refusal = self.node.refuses(config)
        if refusal is None and (config.dcgm_metrics_address, config.dcgm_interval_seconds) != (
            self.config.dcgm_metrics_address,
            self.config.dcgm_interval_seconds,
        ):
            refusal = "the dcgm metrics' address and interval change with a restart only; keeping the running ones"
        if refusal is not None:
            log.error("SIGHUP: %s", refusal)
            return
        await self.node.reload(config, policy, builder, self._adopt_config)
        if self.faults is not None:
            self.faults.configure(config)

    async def _adopt_config(self, config: Config) -> bool:
        """Make `config` the daemon's, with a new backend if its settings changed; False (and the daemon
        stops with exit code 1) when that backend cannot start."""
        backend_changed = (config.backend, config.simulated_spec) != (self.config.backend, self.config.simulated_spec)
        self.config = config
        if backend_changed:
            self._stop_backend()
            if not await self._start_backend():
                self.exit_code = 1
                self.stop()
                return False
        return True

    def healthz(self) -> tuple[bool, dict[str, Any]]:
        # A dead XID watcher is a daemon that cannot see GPU faults: not ready, whatever else works.
        events = self._events
        watcher_error = events.failed if events is not None else None
        node = self.node
        serving = node is not None and node.serving() and watcher_error is None
        return serving, {
            "serving": serving,
            "backend_error": self.backend_error,
            "health_watcher_error": watcher_error,
            **(node.status() if node is not None else {}),
        }

    def readyz(self) -> tuple[bool, dict[str, Any]]:
        """Readiness: alive (healthz), GPU discovery working, and doing the job for the kubelet. In
        device-plugin mode every resource is registered with the kubelet (again after a kubelet restart);
        in dra mode the kubelet has accepted the registration and the ResourceSlice has been published
        once. The detail is healthz's plus `ready` and `not_ready`, one sentence per reason."""
        alive, detail = self.healthz()
        reasons = [] if alive else ["the daemon is not serving its sockets, or its GPU health watcher failed"]
        if self.backend_error is not None:
            reasons.append(f"GPU discovery fails: {self.backend_error}")
        if self.node is not None:
            reasons.extend(self.node.not_ready(detail))
        return not reasons, dict(detail, ready=not reasons, not_ready=reasons)
