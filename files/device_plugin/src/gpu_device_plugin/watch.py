"""A minimal inotify binding (ctypes, no dependency): the daemon watches two directories, the
kubelet's device-plugin directory and the simulated spec's, and wakes only when something changes."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from typing import NamedTuple

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

_HEADER = struct.Struct("iIII")


class Event(NamedTuple):
    wd: int
    mask: int
    name: str


def _libc() -> ctypes.CDLL:
    # The interpreter's own symbols include libc's where it is linked dynamically: no lookup. The lookup
    # (find_library) runs ldconfig in a child process, and forking while gRPC threads work can crash.
    own = ctypes.CDLL(None, use_errno=True)
    if hasattr(own, "inotify_init1"):
        return own
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class Inotify:
    """An inotify instance; `fd` is non-blocking, for `loop.add_reader`."""

    def __init__(self) -> None:
        libc = _libc()
        self._add_watch = libc.inotify_add_watch
        self._add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm_watch = libc.inotify_rm_watch
        self._rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1 failed: {os.strerror(err)}")
        self.fd: int = fd

    def add_watch(self, path: str, mask: int) -> int:
        wd = self._add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot watch {path}: {os.strerror(err)}", path)
        return int(wd)

    def remove_watch(self, wd: int) -> None:
        self._rm_watch(self.fd, wd)

    def read(self) -> list[Event]:
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return []
        events = []
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            name = data[offset : offset + length].rstrip(b"\0").decode(errors="replace")
            offset += length
            events.append(Event(wd, mask, name))
        return events

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
