"""A grpc.aio server on one unix socket: how both allocation modes serve the kubelet.

The device plugin serves one socket per resource (`registration`); the DRA plugin serves its DRA socket
and its plugin-watcher registration socket (`dra.plugin`). Each is a `UnixServer`:

- a stale file at the socket's path is removed and a missing directory created before it binds; a live
  socket there (another running instance answers on it) is left alone and is a `ServeError`;
- stopping removes the socket only if it is still the one this server created (the same inode): a socket
  another instance has bound at the path since is never removed;
- the socket is created 0600 (the umask is narrowed while it binds, so it is never briefly wider);
- a path it cannot serve (directory read-only, path too long) is a `ServeError` of one sentence;
- stopping first tells the streaming servicers to end their streams and waits until those have returned,
  so that the kubelet sees them end with status OK (the final status is sent before the server shuts
  down, not raced by it); then it gives the other calls STOP_GRACE_SECONDS; serving again lets the
  servicers stream again."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import socket
import stat
from typing import Any, Callable, Optional, Protocol, Sequence

import grpc

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 2.0
STATUS_SEND_SECONDS = 0.05  # after the last stream returned, for its final status to go out
PROBE_SECONDS = 0.5  # how long a connect to a socket found at the path may take to tell it is live


def _answers(path: str) -> bool:
    """Something accepts connections on the unix socket at `path` (a running server); False for a socket
    no one listens on (left by a stopped process) and for anything that is not a socket."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_SECONDS)
    try:
        probe.connect(path)
    except socket.timeout:
        return True  # a listener with a full backlog is still a listener
    except OSError as exc:
        return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK, errno.EPROTOTYPE)
    finally:
        probe.close()
    return True


def _beside(path: str) -> str:
    """A free name in the path's directory, no longer than the path's own name (a socket's path is short)."""
    directory, name = os.path.split(path)
    size = max(min(len(name), 12), 3)
    while True:
        candidate = os.path.join(directory, "." + secrets.token_hex(size)[: size - 1])
        if not os.path.lexists(candidate):
            return candidate


def _identity(path: str) -> Optional[tuple[int, int]]:
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


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
        self._created: Optional[tuple[int, int]] = None  # (device, inode) of the socket this server bound

    async def start(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
            found = _identity(self.socket_path)
            if found is not None:
                mine = found == self._created  # the socket this server bound before a restart
                if not mine and stat.S_ISSOCK(os.lstat(self.socket_path).st_mode) and _answers(self.socket_path):
                    raise ServeError(
                        self._cannot("another running process serves that socket; stop it first, this one leaves it")
                    )
                log.info("removing a stale socket", extra=self._extra)
                os.unlink(self.socket_path)
        except OSError as exc:
            raise ServeError(self._cannot(exc.strerror or exc)) from None
        for servicer in self.streams:
            servicer.resume()
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self.add(server)
        # gRPC binds a name of this server's own beside the path, then the socket is linked at the path (which
        # fails rather than replace a socket another instance bound meanwhile): gRPC removes the name it bound
        # when it stops, and that is never the path another instance may own by then.
        bound = _beside(self.socket_path)
        old_umask = os.umask(0o177)  # the socket is created 0600, never briefly wider
        try:
            server.add_insecure_port("unix:" + bound)
            await server.start()
        except RuntimeError as exc:
            await server.stop(grace=None)
            raise ServeError(self._cannot(exc)) from None
        finally:
            os.umask(old_umask)
        try:
            os.chmod(bound, stat.S_IRUSR | stat.S_IWUSR)
            os.link(bound, self.socket_path)
        except OSError as exc:
            await server.stop(grace=None)
            raise ServeError(self._cannot(exc.strerror or exc)) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(bound)
        self._created = _identity(self.socket_path)
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
        if remove_socket and self._created is not None:
            if _identity(self.socket_path) == self._created:
                os.unlink(self.socket_path)
            else:
                log.info("the socket at the path is not the one this server created: left there", extra=self._extra)
            self._created = None

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
