"""What the tests that start their own etcd and kube-apiserver on 127.0.0.1 share (test_labels_api.py,
test_dra_api.py, test_dra_daemonset_rbac.py, and bench/bench_dra_prepare.py through test_dra_api.py):
waiting for a condition, and whether a port is taken."""

from __future__ import annotations

import socket
import time
from typing import Any, Callable


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 120.0, interval: float = 0.3) -> None:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
