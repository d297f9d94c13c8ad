"""Runs the daemon for tests: in a thread with its own event loop (most tests), or as a real
subprocess (signals). Specs are copied from tests/fixtures/simulated and edited like an operator would."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

import yaml
from conftest import INSTALLED, PLUGIN, SRC
from gpu_device_plugin import config
from gpu_device_plugin.daemon import Daemon
from kubelet_double import KubeletDouble

REPO = os.path.abspath(os.path.join(PLUGIN, "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "simulated")
H100 = [f"GPU-6f1c0a3e-0000-4000-8000-00000000000{i}" for i in range(1, 9)]


def fixture(name: str) -> dict[str, Any]:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        data: dict[str, Any] = yaml.safe_load(handle)
    return data


def remove_gpu(spec: dict[str, Any], index: int) -> None:
    """Take a GPU out of a spec, and out of its peers' NVLink lists (the spec format requires that)."""
    gone = spec["gpus"].pop(index)["uuid"]
    for gpu in spec["gpus"]:
        if gone in gpu.get("nvlink_peers", []):
            gpu["nvlink_peers"].remove(gone)


def write_spec(path: str, data: dict[str, Any]) -> None:
    """Write the way editors do: a new file renamed over the old one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        yaml.safe_dump(data, handle, sort_keys=False)
    os.replace(tmp, path)


def make_config(
    kubelet_socket: str, spec: Optional[str], env: Optional[dict[str, str]] = None, **values: Any
) -> config.Config:
    flags: dict[str, Any] = {
        "backend": "simulated" if spec else "nvml",
        "simulated_spec": spec,
        "kubelet_socket": kubelet_socket,
        "metrics_address": "",
        # Tests never write the node's own health file; those about it name one in tmp_path.
        "health_file": "off",
    }
    flags.update(values)
    return config.resolve(flags, env or {})


class DaemonThread:
    def __init__(
        self,
        settings: config.Config,
        nvml: Any = None,
        reload_config: Any = None,
        api_side: Any = None,
        conditions_side: Any = None,
    ) -> None:
        extra: dict[str, Any] = {"api_side": api_side} if api_side is not None else {}
        if conditions_side is not None:
            extra["conditions_side"] = conditions_side
        self.daemon = Daemon(settings, reload_config=reload_config, nvml=nvml, install_signal_handlers=False, **extra)
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.exit_code: Optional[int] = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()

    def _run(self) -> None:
        async def main() -> int:
            self.loop = asyncio.get_running_loop()
            task = asyncio.ensure_future(self.daemon.run())
            while self.daemon.ready is None or not self.daemon.ready.is_set():
                if task.done():
                    break
                await asyncio.sleep(0.01)
            self._started.set()
            return await task

        self.exit_code = asyncio.run(main())
        self._started.set()

    def start(self) -> DaemonThread:
        self._thread.start()
        assert self._started.wait(10), "the daemon did not start"
        return self

    def call(self, fn: Callable[[], Any]) -> Any:
        assert self.loop is not None
        result = fn()
        if asyncio.iscoroutine(result):
            return asyncio.run_coroutine_threadsafe(result, self.loop).result(10)
        return result

    def stop(self) -> Optional[int]:
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.daemon.stop)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the daemon did not stop"
        return self.exit_code

    def wait_exit(self, timeout: float = 10) -> Optional[int]:
        self._thread.join(timeout)
        return self.exit_code


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0, step: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def start_subprocess(args: list[str], env_extra: Optional[dict[str, str]] = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    extra = dict(env_extra or {})
    # The installed package is on the interpreter's own path; the source tree has to be added.
    paths = ["" if INSTALLED else SRC, extra.pop("PYTHONPATH", ""), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["GPU_DEVICE_PLUGIN_HEALTH_FILE"] = "off"  # never the node's own; a test may name one in env_extra
    env.update(extra)
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_device_plugin", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


__all__ = ["H100", "DaemonThread", "KubeletDouble", "fixture", "make_config", "remove_gpu", "wait_until", "write_spec"]
