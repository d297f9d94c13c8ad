"""A grpc.aio server on one unix socket: how both allocation modes serve the kubelet.

The device plugin serves one socket per resource (`registration`); the DRA plugin serves its DRA socket
and its plugin-watcher registration socket (`dra.plugin`). Each is a `UnixServer`:

- a stale file at the socket's path is removed and a missing directory created before it binds;
- the socket is created 0600 (the umask is narrowed while it binds, so it is never briefly wider);
- a path it cannot serve (directory read-only, path too long) is a `ServeError` of one sentence;
- stopping first tells the streaming servicers to end their streams and waits until those have returned,
  so that the kubelet sees them end with status OK (the final status is sent before the server shuts
  down, not raced by it); then it gives the other calls STOP_GRACE_SECONDS; serving again lets the
  servicers stream again."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from typing import Any, Callable, Optional, Protocol, Sequence

import grpc

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 2.0
STATUS_SEND_SECONDS = 0.05  # after the last stream returned, for its final status to go out


class ServeError(RuntimeError):
    """The socket cannot be served (directory missing or read-only, path too long)."""


class Streaming(Protocol):
    """A servicer with long-lived response streams (ListAndWatch, NodeWatchResources); `open_streams` counts
    the streams that have not returned yet."""

    open_streams: int

    def stop(self) -> None:
        """End every open stream cleanly."""

    def resume(self) -> None:
        """Let new streams run again."""


class UnixServer:
    """One grpc.aio server on `socket_path`; `add` puts the services on each new server. `what` names the
    services in logs and errors, `log_extra` adds fields (a resource) to its log records."""

    def __init__(
        self,
        socket_path: str,
        add: Callable[[grpc.aio.Server], None],
        what: str,
        streams: Sequence[Streaming] = (),
        log_extra: Optional[dict[str, Any]] = None,
    ) -> None:
        self.socket_path = socket_path
        self.add = add
        self.what = what
        self.streams = tuple(streams)
        self._extra = dict(log_extra or {}, socket=socket_path)
        self._server: Optional[grpc.aio.Server] = None

    async def start(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
            if os.path.lexists(self.socket_path):
                log.info("removing a stale socket", extra=self._extra)
                os.unlink(self.socket_path)
        except OSError as exc:
            raise ServeError(self._cannot(exc.strerror or exc)) from None
        for servicer in self.streams:
            servicer.resume()
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self.add(server)
        old_umask = os.umask(0o177)  # the socket is created 0600, never briefly wider
        try:
            server.add_insecure_port("unix:" + self.socket_path)
            await server.start()
        except RuntimeError as exc:
            await server.stop(grace=None)
            raise ServeError(self._cannot(exc)) from None
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, stat.S_IRUSR | stat.S_IWUSR)
        self._server = server
        log.info("serving %s", self.what, extra=self._extra)

    def _cannot(self, reason: object) -> str:
        return f"cannot serve {self.what} on {self.socket_path}: {reason}"

    def socket_is_ours(self) -> bool:
        """Serving, and the socket is still there (the kubelet removes every file of its directory when it
        starts; someone may clean the directory)."""
        return self._server is not None and os.path.exists(self.socket_path)

    async def stop(self, remove_socket: bool = True) -> None:
        for servicer in self.streams:
            servicer.stop()
        if self._server is not None:
            await self._streams_returned()
            await self._server.stop(grace=STOP_GRACE_SECONDS)
            self._server = None
            log.info("stopped serving %s", self.what, extra=self._extra)
        if remove_socket and os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)

    async def _streams_returned(self) -> None:
        """Wait (STOP_GRACE_SECONDS at most) until every stream told to end has returned, then a moment for
        their final status to be sent: a server that shuts down first can close the connection before it."""
        if not any(servicer.open_streams for servicer in self.streams):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE_SECONDS
        while any(servicer.open_streams for servicer in self.streams) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(STATUS_SEND_SECONDS)

    async def restart(self) -> None:
        await self.stop(remove_socket=False)
        await self.start()
