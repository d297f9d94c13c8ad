"""The daemon in device-plugin mode: serve each resource on its socket, Register, notice kubelet restarts.

The kubelet, when it starts, deletes every file in its device-plugin directory (it keeps its
checkpoint) and creates kubelet.sock anew. One inotify watch on that directory tells us both: our
socket vanished (serve again) and kubelet.sock appeared (register again)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Awaitable, Callable, NamedTuple, Optional

import grpc

from gpu_device_plugin import allocation, sharing, watch
from gpu_device_plugin.api import api_pb2, api_pb2_grpc
from gpu_device_plugin.config import Config
from gpu_device_plugin.metrics import Metrics
from gpu_device_plugin.server import DevicePluginServicer
from gpu_device_plugin.state import UNHEALTHY, DeviceState
from gpu_device_plugin.unix_server import ServeError, UnixServer

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
IGNORED_FILES = ("DEPRECATION", "kubelet_internal_checkpoint")
_REGISTER_BACKOFF = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)


class Resource(NamedTuple):
    """One advertised resource: its servicer and the server on `<plugin dir>/<socket name>`."""

    servicer: DevicePluginServicer
    server: UnixServer


def serve_resource(servicer: DevicePluginServicer, socket_path: str) -> Resource:
    def add(server: grpc.aio.Server) -> None:
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

    return Resource(
        servicer,
        UnixServer(socket_path, add, "DevicePlugin", streams=[servicer], log_extra={"resource": servicer.resource}),
    )


async def register(kubelet_socket: str, resource: Resource, metrics: Metrics, timeout: float = 5.0) -> None:
    """Call Register with the same options GetDevicePluginOptions answers. Raises grpc.aio.AioRpcError."""
    name = resource.servicer.resource
    request = api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=os.path.basename(resource.server.socket_path),
        resource_name=name,
        options=resource.servicer.options,
    )
    async with grpc.aio.insecure_channel("unix:" + kubelet_socket) as channel:
        try:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(request, timeout=timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError:
            metrics.registrations.labels(name, "error").inc()
            raise
    metrics.registrations.labels(name, "ok").inc()
    log.info(
        "registered with the kubelet",
        extra={"resource": name, "endpoint": request.endpoint, "kubelet": kubelet_socket},
    )


class KubeletWatcher:
    """Calls `on_change(name)` for each file created or deleted in the plugin directory."""

    def __init__(self, plugin_dir: str, on_change: Callable[[str, bool], None]) -> None:
        self.plugin_dir = plugin_dir
        self.on_change = on_change
        self._inotify: Optional[watch.Inotify] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        self._loop = loop
        self._inotify = watch.Inotify()
        self._inotify.add_watch(
            self.plugin_dir,
            watch.IN_CREATE | watch.IN_DELETE | watch.IN_MOVED_TO | watch.IN_MOVED_FROM | watch.IN_DELETE_SELF,
        )
        loop.add_reader(self._inotify.fd, self._on_events)

    def _on_events(self) -> None:
        assert self._inotify is not None
        for event in self._inotify.read():
            if event.mask & watch.IN_Q_OVERFLOW:
                self.on_change("", True)
                continue
            if event.name in IGNORED_FILES:
                continue
            created = bool(event.mask & (watch.IN_CREATE | watch.IN_MOVED_TO))
            self.on_change(event.name, created)

    def stop(self) -> None:
        if self._inotify is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None


class DevicePluginNode:
    """Serves every resource the state plans on its own socket and keeps each registered: after a kubelet
    restart, a removed socket, a configuration reload. One reconcile runs at a time."""

    def __init__(
        self, config: Config, state: DeviceState, builder: allocation.ResponseBuilder, metrics: Metrics
    ) -> None:
        self.config = config
        self.state = state
        self.builder = builder
        self.metrics = metrics
        self.resources: dict[str, Resource] = {}
        self._needs_register: set[str] = set()
        self._register_attempts: dict[str, int] = {}
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self._watcher = KubeletWatcher(config.plugin_dir, self._on_dir_event)
        self._task: Optional[asyncio.Task[None]] = None
        state.on_resources_changed.append(self.kick)

    async def start(self) -> bool:
        """False when the kubelet's directory cannot be watched (the reason is logged)."""
        loop = asyncio.get_running_loop()
        try:
            self._watcher.start(loop)
        except OSError as exc:
            log.error("cannot watch the kubelet's device-plugin directory", extra={"reason": str(exc)})
            return False
        await self._reconcile()
        self._task = asyncio.ensure_future(self._reconcile_loop())
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._watcher.stop()
        await self._stop_servers()

    async def _stop_servers(self) -> None:
        for resource in self.resources.values():
            await resource.server.stop(remove_socket=True)
        self.resources.clear()

    def kick(self) -> None:
        self._kick.set()

    def _on_dir_event(self, name: str, created: bool) -> None:
        kubelet_name = os.path.basename(self.config.kubelet_socket)
        if (name == kubelet_name and created) or name == "":
            log.info("kubelet socket appeared; registering again", extra={"socket": self.config.kubelet_socket})
            self._needs_register.update(self.resources)
            self._register_attempts.clear()
            self.kick()
        elif not created and any(os.path.basename(r.server.socket_path) == name for r in self.resources.values()):
            self.kick()

    async def _reconcile_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self._reconcile()
            except Exception:
                self.metrics.errors.labels("reconcile").inc()
                log.exception("reconcile failed")
                loop.call_later(1.0, self.kick)

    async def _reconcile(self) -> None:
        async with self._lock:
            await self._reconcile_locked()

    async def _reconcile_locked(self) -> None:
        wanted = list(self.state.plans)
        for name in [n for n in self.resources if n not in wanted]:
            await self.resources.pop(name).server.stop(remove_socket=True)
            self._needs_register.discard(name)
        for name in wanted:
            resource = self.resources.get(name)
            if resource is None:
                servicer = DevicePluginServicer(name, self.state, self.builder, self.config.pre_start_required)
                resource = serve_resource(servicer, os.path.join(self.config.plugin_dir, sharing.socket_name(name)))
                if not await self._serve(resource.server.start, name):
                    continue
                self.resources[name] = resource
                self._needs_register.add(name)
            elif not resource.server.socket_is_ours():
                log.info("our socket was removed (kubelet restart); serving again", extra={"resource": name})
                if await self._serve(resource.server.restart, name):
                    self._needs_register.add(name)
        if not os.path.exists(self.config.kubelet_socket):
            return
        for name in sorted(self._needs_register):
            await self._register(name)

    async def _register(self, name: str) -> None:
        resource = self.resources.get(name)
        if resource is None:
            self._needs_register.discard(name)
            return
        try:
            await register(self.config.kubelet_socket, resource, self.metrics)
        except grpc.aio.AioRpcError as exc:
            attempt = self._register_attempts.get(name, 0)
            self._register_attempts[name] = attempt + 1
            delay = _REGISTER_BACKOFF[min(attempt, len(_REGISTER_BACKOFF) - 1)]
            log.warning(
                "Register failed; retrying",
                extra={"resource": name, "code": exc.code().name, "reason": exc.details(), "retry_in": delay},
            )
            asyncio.get_running_loop().call_later(delay, self.kick)
            return
        self._needs_register.discard(name)
        self._register_attempts.pop(name, None)

    async def _serve(self, start: Callable[[], Awaitable[None]], name: str) -> bool:
        try:
            await start()
        except ServeError as exc:
            self.metrics.errors.labels("serve").inc()
            log.error("cannot serve; retrying in 1 s", extra={"resource": name, "reason": str(exc)})
            asyncio.get_running_loop().call_later(1.0, self.kick)
            return False
        return True

    # -- what the daemon asks of its allocation mode -------------------------------------------------
    def refuses(self, config: Config) -> Optional[str]:
        return None  # every setting can change: the resources are served and registered again

    async def reload(
        self,
        config: Config,
        policy: Any,
        builder: allocation.ResponseBuilder,
        adopt_config: Callable[[Config], Awaitable[bool]],
    ) -> None:
        log.info("SIGHUP: configuration reloaded; serving and registering again")
        async with self._lock:
            self.config, self.builder = config, builder
            await self._stop_servers()
            self.state.tracker.policy = policy
            if not await adopt_config(config):  # the daemon could not start a new backend: it stops
                return
            self.state.replace_config(config, self.state.tracker)
            self._register_attempts.clear()
            await self._reconcile_locked()

    def serving(self) -> bool:
        resources = dict(self.resources)  # called from the HTTP thread: work on a copy
        return bool(resources) and all(r.server.socket_is_ours() for r in resources.values())

    def status(self) -> dict[str, Any]:
        names = list(self.resources)  # called from the HTTP thread: work on a copy
        return {
            "resources": {
                name: {
                    "devices": len(self.state.listing(name)),
                    "unhealthy": sum(1 for row in self.state.listing(name) if row[1] == UNHEALTHY),
                    "registered": name not in self._needs_register,
                }
                for name in names
            }
        }

    def not_ready(self, status: dict[str, Any]) -> list[str]:
        resources = status["resources"]
        reasons = [] if resources else ["no resource is served yet"]
        unregistered = sorted(name for name, row in resources.items() if not row["registered"])
        if unregistered:
            reasons.append(f"not registered with the kubelet: {', '.join(unregistered)}")
        return reasons
