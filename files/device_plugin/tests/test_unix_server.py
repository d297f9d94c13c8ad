"""unix_server.UnixServer, the one gRPC server both allocation modes serve their sockets with: real grpc.aio
on real unix sockets, a plain streaming service of its own (bytes in, bytes out) as its client."""

from __future__ import annotations

import asyncio
import os
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
