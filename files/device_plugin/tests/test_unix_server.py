"""unix_server.UnixServer, the one gRPC server both allocation modes serve their sockets with: real grpc.aio
on real unix sockets, a plain streaming service of its own (bytes in, bytes out) as its client."""

from __future__ import annotations

import asyncio
import os
import socket
import stat

import grpc
import pytest
from gpu_device_plugin.unix_server import ServeError, UnixServer

WATCH = "/test.Ticker/Watch"


class Ticker:
    """A streaming servicer: one message per wake-up until told to stop (what ListAndWatch does); `linger`
    seconds pass between being told to stop and returning, as on a node whose event loop is busy."""

    def __init__(self, linger: float = 0.0) -> None:
        self.stopping = False
        self.wake = asyncio.Event()
        self.linger = linger
        self.open_streams = 0

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()

    def resume(self) -> None:
        self.stopping = False

    async def watch(self, request: bytes, context: object):
        self.open_streams += 1
        try:
            while not self.stopping:
                self.wake.clear()  # before the message: a wake-up after the client read it is never lost
                yield b"tick"
                await self.wake.wait()
            await asyncio.sleep(self.linger)
        finally:
            self.open_streams -= 1

    def add(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_stream_rpc_method_handler(self.watch)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Ticker", {"Watch": handler}),))


def _run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 20))


def test_a_stale_file_becomes_a_0600_socket_and_a_missing_directory_is_created(tmp_path):
    stale = tmp_path / "stale.sock"
    stale.write_text("left by a crashed daemon")
    fresh = tmp_path / "not-yet" / "there" / "fresh.sock"

    async def main():
        ticker = Ticker()
        servers = [UnixServer(str(path), ticker.add, "Ticker", streams=[ticker]) for path in (stale, fresh)]
        try:
            for server in servers:
                await server.start()
            modes = [os.stat(server.socket_path).st_mode for server in servers]
            return modes, [server.socket_is_ours() for server in servers]
        finally:
            for server in servers:
                await server.stop()

    modes, ours = _run(main())
    assert [(stat.S_ISSOCK(mode), stat.S_IMODE(mode)) for mode in modes] == [(True, 0o600), (True, 0o600)]
    assert ours == [True, True]
    assert not stale.exists() and not fresh.exists()


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("file-as-directory", "File exists"),
        ("too-long", "cannot serve Ticker on"),
    ],
)
def test_a_socket_that_cannot_be_served_is_one_sentence(tmp_path, where, words):
    if where == "file-as-directory":
        (tmp_path / "plain-file").write_text("")
        path = str(tmp_path / "plain-file" / "x.sock")
    else:
        path = str(tmp_path / ("d" * 120) / "x.sock")  # a unix socket path holds 107 bytes

    async def main():
        ticker = Ticker()
        server = UnixServer(path, ticker.add, "Ticker")
        try:
            with pytest.raises(ServeError) as caught:
                await server.start()
            return str(caught.value), server.socket_is_ours()
        finally:
            await server.stop()

    message, ours = _run(main())
    assert message.startswith(f"cannot serve Ticker on {path}: ")
    assert words in message
    assert "\n" not in message and "Traceback" not in message
    assert ours is False


def test_stop_ends_the_streams_with_status_ok_and_a_restart_streams_again(tmp_path):
    path = str(tmp_path / "t.sock")

    async def read_one(channel):
        call = channel.unary_stream(WATCH)(b"")
        return call, await call.read()

    async def main():
        ticker = Ticker()
        server = UnixServer(path, ticker.add, "Ticker", streams=[ticker])
        try:
            await server.start()
            async with grpc.aio.insecure_channel("unix:" + path) as channel:
                call, first = await read_one(channel)
                await server.stop(remove_socket=False)
                ended = (await call.read(), await call.code())
            await server.restart()
            async with grpc.aio.insecure_channel("unix:" + path) as channel:
                call, again = await read_one(channel)
                ticker.wake.set()
                again_after_wake = await call.read()
                ours = server.socket_is_ours()
                os.unlink(path)  # someone cleaned the directory
                gone = server.socket_is_ours()
        finally:
            await server.stop()
        return first, ended, again, again_after_wake, ours, gone

    first, ended, again, again_after_wake, ours, gone = _run(main())
    assert first == b"tick"
    assert ended == (grpc.aio.EOF, grpc.StatusCode.OK)
    assert (again, again_after_wake) == (b"tick", b"tick")
    assert (ours, gone) == (True, False)


def test_a_stream_slow_to_return_still_ends_with_status_ok(tmp_path):
    # The stream returns a second after it was told to stop: the server waits for it before it shuts down,
    # instead of cancelling it at the end of a grace period.
    path = str(tmp_path / "t.sock")

    async def main():
        ticker = Ticker(linger=1.0)
        server = UnixServer(path, ticker.add, "Ticker", streams=[ticker])
        try:
            await server.start()
            async with grpc.aio.insecure_channel("unix:" + path) as channel:
                call = channel.unary_stream(WATCH)(b"")
                first = await call.read()
                await server.stop()
                return first, await call.read(), await call.code(), ticker.open_streams
        finally:
            await server.stop()

    assert _run(main()) == (b"tick", grpc.aio.EOF, grpc.StatusCode.OK, 0)


def test_a_live_socket_of_another_instance_is_left_alone_and_refused_in_one_sentence(tmp_path):
    path = str(tmp_path / "t.sock")

    async def main():
        ticker = Ticker()
        first = UnixServer(path, ticker.add, "Ticker", streams=[ticker])
        second = UnixServer(path, Ticker().add, "Ticker")
        await first.start()
        inode = os.stat(path).st_ino
        try:
            with pytest.raises(ServeError) as refused:
                await second.start()
            await second.stop()  # the second never created the socket: it removes nothing
            still = os.stat(path).st_ino == inode and first.socket_is_ours()
            await first.restart()  # its own socket is no other instance's: a restart serves again
            async with grpc.aio.insecure_channel("unix:" + path) as channel:
                stream = channel.unary_stream(WATCH)(b"")
                answered = await stream.read()
            return str(refused.value), still, answered
        finally:
            await first.stop()

    message, still, answered = _run(main())
    assert message == (
        f"cannot serve Ticker on {path}: another running process serves that socket; stop it first, this one leaves it"
    )
    assert still and answered == b"tick", "the first instance's socket is there and it still answers"
    assert not os.path.exists(path)


def test_stop_removes_only_the_socket_this_server_created(tmp_path):
    path = str(tmp_path / "t.sock")
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    async def main():
        ticker = Ticker()
        server = UnixServer(path, ticker.add, "Ticker", streams=[ticker])
        await server.start()
        # Another instance took the path over: it removed this server's socket and bound its own there.
        os.unlink(path)
        other.bind(path)
        other.listen(1)
        await server.stop()

    try:
        _run(main())
        assert stat.S_ISSOCK(os.lstat(path).st_mode), "the other instance's socket stays"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(path)  # and it still answers
        probe.close()
    finally:
        other.close()
