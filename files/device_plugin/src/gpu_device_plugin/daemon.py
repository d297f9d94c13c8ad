"""Wires the pieces together on one asyncio loop: backend -> state -> one server per resource ->
registration, the kubelet-directory watch, signals, the metrics endpoint.

In dra allocation mode the device-plugin servers are never started: `dra.node.DraNode` serves the
kubelet's DRA plugin API instead, with the claim reader and slice publisher the `api_side` factory
gives (by default the API server client of gpu_device_plugin.dra.kubeapi, loaded only then)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any, Callable, Optional

import grpc

from gpu_device_plugin import allocation, hostdriver, registration, sharing
from gpu_device_plugin.config import Config, ConfigError
from gpu_device_plugin.discovery import BackendError, NvmlBackend, make_backend
from gpu_device_plugin.dra.node import ApiSide, DraNode, default_api_side
from gpu_device_plugin.health import HealthTracker, NvmlEventWatcher, policy_from
from gpu_device_plugin.metrics import HttpEndpoint, Metrics
from gpu_device_plugin.server import DevicePluginServicer
from gpu_device_plugin.state import UNHEALTHY, DeviceState

log = logging.getLogger(__name__)

_REGISTER_BACKOFF = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)


class Daemon:
    def __init__(
        self,
        config: Config,
        reload_config: Optional[Callable[[], Config]] = None,
        nvml: Any = None,
        install_signal_handlers: bool = True,
        api_side: ApiSide = default_api_side,
    ) -> None:
        self.config = config
        self.api_side = api_side
        self.dra: Optional[DraNode] = None
        self.reload_config = reload_config
        self.nvml = nvml
        self.install_signal_handlers = install_signal_handlers
        self.metrics = Metrics()
        self.servers: dict[str, registration.PluginServer] = {}
        self.backend_error: Optional[str] = None
        self.ready: Optional[asyncio.Event] = None  # set once serving; created on the loop in run()
        self._stop: Optional[asyncio.Event] = None
        self._kick: Optional[asyncio.Event] = None
        self._needs_register: set[str] = set()
        self._register_attempts: dict[str, int] = {}
        self._backend: Any = None
        self._events: Optional[NvmlEventWatcher] = None
        self._http: Optional[HttpEndpoint] = None
        self._retry_task: Optional[asyncio.Task[None]] = None
        self.exit_code = 0

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._stop, self._kick = asyncio.Event(), asyncio.Event()
        self._lock = asyncio.Lock()  # one reconcile or reload at a time
        self.ready = asyncio.Event()
        policy = self._policy(self.config)
        self.state = DeviceState(self.config, HealthTracker(policy), self.metrics)
        self.state.on_resources_changed.append(self.kick)
        self.builder = self._builder(self.config)
        if not await self._start_backend():
            return 1
        if self.config.metrics_address:
            self._http = HttpEndpoint(self.config.metrics_address, self.metrics, self.healthz, self.readyz)
            self._http.start()
        if self.config.allocation_mode == "dra":
            return await self._run_dra()
        self.watcher = registration.KubeletWatcher(self.config.plugin_dir, self._on_dir_event)
        try:
            self.watcher.start(self._loop)
        except OSError as exc:
            log.error("cannot watch the kubelet's device-plugin directory", extra={"reason": str(exc)})
            self._stop_backend()
            if self._http is not None:
                self._http.stop()
            return 1
        if self.install_signal_handlers:
            self._loop.add_signal_handler(signal.SIGTERM, self.stop)
            self._loop.add_signal_handler(signal.SIGINT, self.stop)
            self._loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        await self._reconcile()
        self.ready.set()
        reconciler = asyncio.ensure_future(self._reconcile_loop())
        await self._stop.wait()
        reconciler.cancel()
        await self._shutdown()
        return self.exit_code

    async def _run_dra(self) -> int:
        self.dra = DraNode(self.config, self.state, self.api_side)
        if not await self.dra.start():
            self._stop_backend()
            if self._http is not None:
                self._http.stop()
            return 1
        if self.install_signal_handlers:
            self._loop.add_signal_handler(signal.SIGTERM, self.stop)
            self._loop.add_signal_handler(signal.SIGINT, self.stop)
            self._loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        assert self._stop is not None and self.ready is not None
        self.ready.set()
        await self._stop.wait()
        await self.dra.stop()
        if self._retry_task is not None:
            self._retry_task.cancel()
        self._stop_backend()
        if self._http is not None:
            self._http.stop()
        log.info("stopped")
        return self.exit_code

    def stop(self) -> None:
        log.info("stopping")
        if self._stop is not None:
            self._stop.set()

    async def _shutdown(self) -> None:
        if self._retry_task is not None:
            self._retry_task.cancel()
        self.watcher.stop()
        for server in self.servers.values():
            await server.stop(remove_socket=True)
        self.servers.clear()
        self._stop_backend()
        if self._http is not None:
            self._http.stop()
        log.info("stopped")

    # -- backend -------------------------------------------------------------------------------
    def _policy(self, config: Config) -> Any:
        try:
            return policy_from(config.disable_healthchecks, config.enable_healthchecks, config.health_recovery_seconds)
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
            loop, state = self._loop, self.state
            self._events = NvmlEventWatcher(
                backend.nvml,
                [g.uuid for g in backend.snapshot().gpus],
                lambda uuid, xid: loop.call_soon_threadsafe(state.on_xid, uuid, xid),
                lambda uuid: loop.call_soon_threadsafe(state.on_lost, uuid),
                back=lambda uuid: loop.call_soon_threadsafe(state.on_back, uuid),
            )
            self._events.start()

    def _stop_backend(self) -> None:
        if self._events is not None:
            self._events.stop()
            self._events.join(timeout=3)
            self._events = None
        if self._backend is not None:
            self._backend.stop()

    # -- servers and registration --------------------------------------------------------------
    def kick(self) -> None:
        if self._kick is not None:
            self._kick.set()

    def _on_dir_event(self, name: str, created: bool) -> None:
        kubelet_name = os.path.basename(self.config.kubelet_socket)
        if (name == kubelet_name and created) or name == "":
            log.info("kubelet socket appeared; registering again", extra={"socket": self.config.kubelet_socket})
            self._needs_register.update(self.servers)
            self._register_attempts.clear()
            self.kick()
        elif not created and any(os.path.basename(s.socket_path) == name for s in self.servers.values()):
            self.kick()

    async def _reconcile_loop(self) -> None:
        assert self._kick is not None
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self._reconcile()
            except Exception:
                self.metrics.errors.labels("reconcile").inc()
                log.exception("reconcile failed")
                self._loop.call_later(1.0, self.kick)

    async def _reconcile(self) -> None:
        async with self._lock:
            await self._reconcile_locked()

    async def _reconcile_locked(self) -> None:
        wanted = list(self.state.plans)
        for name in [n for n in self.servers if n not in wanted]:
            await self.servers.pop(name).stop(remove_socket=True)
            self._needs_register.discard(name)
        for name in wanted:
            server = self.servers.get(name)
            if server is None:
                servicer = DevicePluginServicer(name, self.state, self.builder, self.config.pre_start_required)
                server = registration.PluginServer(
                    servicer, os.path.join(self.config.plugin_dir, sharing.socket_name(name))
                )
                if not await self._serve(server.start, name):
                    continue
                self.servers[name] = server
                self._needs_register.add(name)
            elif not server.socket_is_ours():
                log.info("our socket was removed (kubelet restart); serving again", extra={"resource": name})
                if await self._serve(server.restart, name):
                    self._needs_register.add(name)
        if not os.path.exists(self.config.kubelet_socket):
            return
        for name in sorted(self._needs_register):
            server = self.servers.get(name)
            if server is None:
                self._needs_register.discard(name)
                continue
            try:
                await registration.register(self.config.kubelet_socket, server, self.metrics)
            except grpc.aio.AioRpcError as exc:
                attempt = self._register_attempts.get(name, 0)
                self._register_attempts[name] = attempt + 1
                delay = _REGISTER_BACKOFF[min(attempt, len(_REGISTER_BACKOFF) - 1)]
                log.warning(
                    "Register failed; retrying",
                    extra={"resource": name, "code": exc.code().name, "reason": exc.details(), "retry_in": delay},
                )
                self._loop.call_later(delay, self.kick)
                continue
            self._needs_register.discard(name)
            self._register_attempts.pop(name, None)

    async def _serve(self, start: Callable[[], Any], name: str) -> bool:
        try:
            await start()
        except registration.ServeError as exc:
            self.metrics.errors.labels("serve").inc()
            log.error("cannot serve; retrying in 1 s", extra={"resource": name, "reason": str(exc)})
            self._loop.call_later(1.0, self.kick)
            return False
        return True

    # -- reload and health ---------------------------------------------------------------------
    async def reload(self) -> None:
        if self.reload_config is None:
            return
        try:
            config = self.reload_config()
            policy = self._policy(config)
            builder = self._builder(config)
        except ConfigError as exc:
            self.metrics.errors.labels("config").inc()
            log.error("SIGHUP: configuration rejected; keeping the running one", extra={"reason": str(exc)})
            return
        if self.dra is not None:
            # The sockets, CDI directory and checkpoint stay; the health policy follows the file.
            if (config.allocation_mode, config.driver_name, config.node_name) != (
                self.config.allocation_mode,
                self.config.driver_name,
                self.config.node_name,
            ):
                log.error("SIGHUP: the allocation mode, driver name and node name change only with a restart")
                return
            self.state.tracker.policy = policy
            self.state.publish()
            log.info("SIGHUP: configuration reloaded (health policy)")
            return
        log.info("SIGHUP: configuration reloaded; serving and registering again")
        async with self._lock:
            await self._apply(config, policy, builder)

    async def _apply(self, config: Config, policy: Any, builder: allocation.ResponseBuilder) -> None:
        backend_changed = (config.backend, config.simulated_spec) != (self.config.backend, self.config.simulated_spec)
        self.config, self.builder = config, builder
        for server in self.servers.values():
            await server.stop(remove_socket=True)
        self.servers.clear()
        self.state.tracker.policy = policy
        if backend_changed:
            self._stop_backend()
            if not await self._start_backend():
                self.exit_code = 1
                self.stop()
                return
        self.state.replace_config(config, self.state.tracker)
        self._register_attempts.clear()
        await self._reconcile_locked()

    def healthz(self) -> tuple[bool, dict[str, Any]]:
        # A dead XID watcher is a daemon that cannot see GPU faults: not ready, whatever else works.
        events = self._events
        watcher_error = events.failed if events is not None else None
        if self.dra is not None:
            serving = self.dra.serving() and watcher_error is None
            hub = self.dra.hub
            return serving, {
                "serving": serving,
                "backend_error": self.backend_error,
                "health_watcher_error": watcher_error,
                "allocation_mode": "dra",
                "registered": self.dra.registrar.registered,
                "slice_published": hub is not None and hub.published,
                "prepared_claims": len(self.dra.preparer.claims),
                "claims_reconciled": self.dra.claims_reconciled,
            }
        servers = dict(self.servers)  # called from the HTTP thread: work on a copy
        serving = bool(servers) and all(s.socket_is_ours() for s in servers.values()) and watcher_error is None
        resources = {
            name: {
                "devices": len(self.state.listing(name)),
                "unhealthy": sum(1 for row in self.state.listing(name) if row[1] == UNHEALTHY),
                "registered": name not in self._needs_register,
            }
            for name in servers
        }
        return serving, {
            "serving": serving,
            "backend_error": self.backend_error,
            "health_watcher_error": watcher_error,
            "resources": resources,
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
        if self.dra is not None:
            if detail["registered"] is not True:
                reasons.append("the kubelet has not accepted the DRA plugin's registration yet")
            if not detail["slice_published"]:
                reasons.append("the ResourceSlice has not been published yet")
        else:
            resources = detail["resources"]
            if not resources:
                reasons.append("no resource is served yet")
            unregistered = sorted(name for name, row in resources.items() if not row["registered"])
            if unregistered:
                reasons.append(f"not registered with the kubelet: {', '.join(unregistered)}")
        return not reasons, dict(detail, ready=not reasons, not_ready=reasons)
