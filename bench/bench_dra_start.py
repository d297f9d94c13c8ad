#!/usr/bin/env python
"""How long the daemon in dra mode keeps its sockets closed at start while the API server does not answer,
with N claims prepared in its checkpoint.

The API server is a TCP listener on 127.0.0.1 that accepts connections and never answers (an API server
that hangs, or an address whose packets are dropped); the daemon reaches it through the real API client
(gpu_device_plugin.dra.kubeapi with a kubeconfig naming that address) with `--request-timeout` seconds
per request (the daemon's own is 10 s). The node is simulated (tests/fixtures/simulated/h100x8.yaml),
its checkpoint holds N prepared claims (one GPU each, several claims per GPU are fine here: nothing
checks it at start), and the kubelet side is the plugin-watcher double of the daemon's tests. What is
timed: from the daemon's start until the double has registered the plugin, i.e. both sockets serve.
Figures are printed (median of `--runs` runs), never asserted. `--give-up` bounds one run."""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import asyncio
import logging
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLUGIN = ROOT / "files" / "device_plugin"
sys.path[:0] = [str(PLUGIN / "src"), str(PLUGIN / "tests")]

from dra_kubelet_double import PluginWatcherDouble  # noqa: E402
from gpu_device_plugin import config  # noqa: E402
from gpu_device_plugin.daemon import Daemon  # noqa: E402
from gpu_device_plugin.dra.cdi import PreparedDevice, device_id  # noqa: E402
from gpu_device_plugin.dra.checkpoint import Checkpoint, PreparedClaim  # noqa: E402
from gpu_device_plugin.dra.kubeapi import KubeApi  # noqa: E402
from gpu_device_plugin.dra.slices import ResourceSlices  # noqa: E402

DRIVER = "gpu.gpuops.k8s"
NODE = "node-a"
SPEC = ROOT / "tests" / "fixtures" / "simulated" / "h100x8.yaml"
UUIDS = [f"GPU-6f1c0a3e-0000-4000-8000-00000000000{i}" for i in range(1, 9)]


class SilentServer:
    """Accepts TCP connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for conn in self.held:
            conn.close()


def kubeconfig(path: Path, port: int) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n"
        "contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n"
        "users:\n- name: u\n  user:\n    token: bench\n"
    )


def one_run(claims: int, timeout: float, give_up: float, port: int) -> float:
    base = Path(tempfile.mkdtemp(prefix="gdrab-"))
    try:
        registry, plugins, cdi_dir = base / "reg", base / "plugins", base / "cdi"
        for directory in (registry, plugins / DRIVER, cdi_dir):
            directory.mkdir(parents=True)
        prepared = {}
        for n in range(claims):
            uid = f"5e1f0000-0000-4000-8000-{n:012x}"
            device = f"gpu-{n % 8}"
            prepared[uid] = PreparedClaim(
                "bench",
                f"claim-{n}",
                uid,
                (PreparedDevice(device, NODE, ("gpu",), device_id(uid, device), UUIDS[n % 8]),),
            )
        Checkpoint(str(plugins / DRIVER)).write(prepared)
        kube = base / "kubeconfig"
        kubeconfig(kube, port)
        settings = config.resolve(
            {
                "backend": "simulated",
                "simulated_spec": str(SPEC),
                "kubelet_socket": str(base / "dp" / "kubelet.sock"),
                "metrics_address": "",
                "allocation_mode": "dra",
                "node_name": NODE,
                "plugin_registry_dir": str(registry),
                "kubelet_plugins_dir": str(plugins),
                "cdi_dir": str(cdi_dir),
                "kubeconfig": str(kube),
            },
            {},
        )

        def api_side(cfg: config.Config) -> tuple[KubeApi, ResourceSlices]:
            client = KubeApi(cfg.kubeconfig, timeout=timeout)
            return client, ResourceSlices(client, cfg.node_name, cfg.driver_name)

        kubelet = PluginWatcherDouble(str(registry)).start()
        daemon = Daemon(settings, install_signal_handlers=False, api_side=api_side)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_until_complete, args=(daemon.run(),), daemon=True)
        started = time.monotonic()
        thread.start()
        registered = kubelet.wait(lambda: kubelet.registered(DRIVER) > 0, timeout=give_up)
        took = time.monotonic() - started if registered else float("inf")
        loop.call_soon_threadsafe(daemon.stop)
        thread.join(give_up + 3 * timeout * max(claims, 1))
        kubelet.stop()
        return took
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--claims", default="0,5,20", help="comma-separated numbers of prepared claims")
    parser.add_argument("--request-timeout", type=float, default=1.0, help="the API client's seconds per request")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--give-up", type=float, default=120.0, help="seconds before a run counts as never")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    server = SilentServer()
    try:
        print(f"API server silent; request timeout {args.request_timeout:g} s; median of {args.runs} runs")
        print("| prepared claims | sockets closed for |")
        print("|---|---|")
        for claims in (int(c) for c in args.claims.split(",")):
            times = [one_run(claims, args.request_timeout, args.give_up, server.port) for _run in range(args.runs)]
            median = statistics.median(times)
            shown = f"{median:.2f} s" if median != float("inf") else f"more than {args.give_up:g} s"
            print(f"| {claims} | {shown} |", flush=True)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
