"""The kubelet lifecycle: serve a resource on its socket, Register, notice kubelet restarts.

The kubelet, when it starts, deletes every file in its device-plugin directory (it keeps its
checkpoint) and creates kubelet.sock anew. One inotify watch on that directory tells us both: our
socket vanished (serve again) and kubelet.sock appeared (register again)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from typing import Callable, Optional

import grpc

from gpu_device_plugin import watch
from gpu_device_plugin.api import api_pb2, api_pb2_grpc
from gpu_device_plugin.metrics import Metrics
from gpu_device_plugin.server import DevicePluginServicer

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
IGNORED_FILES = ("DEPRECATION", "kubelet_internal_checkpoint")


class ServeError(RuntimeError):
    """The plugin's socket cannot be served (directory missing or read-only, path too long)."""


class PluginServer:
    """One resource: a grpc.aio server on `<plugin dir>/<socket name>`."""

    def __init__(self, servicer: DevicePluginServicer, socket_path: str) -> None:
        self.servicer = servicer
        self.socket_path = socket_path
        self._server: Optional[grpc.aio.Server] = None

    @property
    def resource(self) -> str:
        return self.servicer.resource

    async def start(self) -> None:
        if os.path.lexists(self.socket_path):
            log.info("removing a stale socket", extra={"socket": self.socket_path})
            os.unlink(self.socket_path)
        self.servicer._stopping = False
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        old_umask = os.umask(0o177)  # the socket is created 0600, never briefly wider
        try:
            server.add_insecure_port("unix:" + self.socket_path)
            await server.start()
        except RuntimeError as exc:
            await server.stop(grace=None)
            raise ServeError(f"cannot serve {self.resource} on {self.socket_path}: {exc}") from None
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, stat.S_IRUSR | stat.S_IWUSR)
        self._server = server
        log.info("serving DevicePlugin", extra={"resource": self.resource, "socket": self.socket_path})

    def socket_is_ours(self) -> bool:
        return os.path.exists(self.socket_path)

    async def stop(self, remove_socket: bool = True) -> None:
        self.servicer.stop()
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None
        if remove_socket and os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)
        log.info("stopped serving", extra={"resource": self.resource, "socket": self.socket_path})

    async def restart(self) -> None:
        await self.stop(remove_socket=False)
        await self.start()


async def register(kubelet_socket: str, server: PluginServer, metrics: Metrics, timeout: float = 5.0) -> None:
    """Call Register with the same options GetDevicePluginOptions answers. Raises grpc.aio.AioRpcError."""
    request = api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=os.path.basename(server.socket_path),
        resource_name=server.resource,
        options=server.servicer.options,
    )
    async with grpc.aio.insecure_channel("unix:" + kubelet_socket) as channel:
        try:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(request, timeout=timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError:
            metrics.registrations.labels(server.resource, "error").inc()
            raise
    metrics.registrations.labels(server.resource, "ok").inc()
    log.info(
        "registered with the kubelet",
        extra={"resource": server.resource, "endpoint": request.endpoint, "kubelet": kubelet_socket},
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
