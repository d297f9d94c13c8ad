"""A DRA node for tests: short directories (unix socket paths are limited to 107 bytes) for the
plugins_registry, the kubelet plugins, the CDI specs and a /dev with the NVIDIA device nodes as plain
files, the plugin-watcher double, the API-side doubles, and the daemon in a thread in dra mode."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Optional

from api_server_double import DRIVER, ClaimStoreDouble, SlicePublisherDouble, claim_json
from dra_kubelet_double import PluginWatcherDouble
from harness import DaemonThread, fixture, make_config, write_spec

NODE = "node-a"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")  # no nvidia-modeset on this host


class DraNodeFixture:
    def __init__(self, tmp_path: Any) -> None:
        self.base = tempfile.mkdtemp(prefix="gdra-")
        self.registry = os.path.join(self.base, "reg")
        self.plugins = os.path.join(self.base, "plugins")
        self.cdi = os.path.join(self.base, "cdi")
        self.dev = os.path.join(self.base, "dev")
        self.dp_dir = os.path.join(self.base, "dp")
        for directory in (self.registry, self.plugins, self.cdi, self.dev, self.dp_dir):
            os.makedirs(directory)
        for name in [f"nvidia{i}" for i in range(8)] + list(CONTROL_NODES):
            with open(os.path.join(self.dev, name), "w"):
                pass
        self.spec = str(tmp_path / "gpus.yaml")
        write_spec(self.spec, fixture("h100x8.yaml"))
        self.claims = ClaimStoreDouble()
        self.publisher = SlicePublisherDouble()
        self.kubelet = PluginWatcherDouble(self.registry).start()
        self.daemons: list[DaemonThread] = []

    @property
    def plugin_dir(self) -> str:
        return os.path.join(self.plugins, DRIVER)

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.plugin_dir, "checkpoint.json")

    def settings(self, **values: Any) -> Any:
        flags: dict[str, Any] = {
            "allocation_mode": "dra",
            "node_name": NODE,
            "plugin_registry_dir": self.registry,
            "kubelet_plugins_dir": self.plugins,
            "cdi_dir": self.cdi,
            "mounts": None,
        }
        flags.update(values)
        if flags["mounts"] is None:
            from gpu_device_plugin.config import MountsSettings

            flags["mounts"] = MountsSettings(dev_root=self.dev)
        return make_config(os.path.join(self.dp_dir, "kubelet.sock"), self.spec, **flags)

    def start(self, wait_registered: bool = True, **values: Any) -> DaemonThread:
        before = self.kubelet.registered(DRIVER)
        daemon = DaemonThread(self.settings(**values), api_side=lambda _config: (self.claims, self.publisher))
        daemon.start()
        self.daemons.append(daemon)
        if wait_registered:
            registered = self.kubelet.wait(lambda: self.kubelet.registered(DRIVER) > before)
            assert registered, f"the plugin did not register (plugin-watcher double: {self.kubelet.errors})"
        return daemon

    def wait_reconciled(self, timeout: float = 10) -> bool:
        """Wait until the last daemon started has asked the API server about every prepared claim."""
        from harness import wait_until

        node = self.daemons[-1].daemon.node
        return wait_until(lambda: node is not None and node.claims_reconciled, timeout=timeout)

    def stop_daemons(self) -> None:
        for daemon in self.daemons:
            daemon.stop()
        self.daemons.clear()

    def allocate(self, name: str, uid: str, devices: list[str], namespace: str = "default", **kw: Any) -> tuple:
        """Put an allocated claim in the store; the (namespace, name, uid) the kubelet sends."""
        kw.setdefault("pool", NODE)
        self.claims.put(claim_json(namespace, name, uid, devices, **kw))
        return (namespace, name, uid)

    def spec_of(self, uid: str) -> Optional[dict[str, Any]]:
        import json

        path = os.path.join(self.cdi, f"gpuops.k8s-gpu_{uid}.json")
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as handle:
            data: dict[str, Any] = json.load(handle)
        return data

    def close(self) -> None:
        self.stop_daemons()
        self.kubelet.stop()
        shutil.rmtree(self.base, ignore_errors=True)
