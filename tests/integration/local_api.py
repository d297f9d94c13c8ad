"""The lab package's control plane (tests/e2e/gpuops_lab/controlplane.py) for the integration tier and bench/:
the one place that knows how etcd and a kube-apiserver are started, with which certificates, flags and ports,
how to wait for them and how to stop them. The ``control_plane`` fixture (conftest.py) is how tests use it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from gpuops_lab.controlplane import ApiServerSettings, ScratchControlPlane, port_open

__all__ = ["ApiServerSettings", "ScratchControlPlane", "port_open", "token_admin_api_server", "wait_for"]


def token_admin_api_server(token: str) -> ApiServerSettings:
    """An API server with RBAC alone, the default admission plugins and an administrator with a bearer token."""
    return ApiServerSettings(
        authorization_modes=("RBAC",), admission_plugins=(), tokens=((token, "gpuops-admin", "system:masters"),)
    )


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 120.0, interval: float = 0.3) -> None:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
