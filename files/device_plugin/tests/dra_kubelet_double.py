"""A test double of the kubelet's DRA side (there is no kubelet on the test hosts).

Over real unix-socket gRPC it does what the kubelet's plugin watcher and DRA manager do with a DRA
plugin: notices a socket appearing in plugins_registry (with inotify, as the kubelet does), calls
Registration.GetInfo, checks the type, picks the first DRAPlugin version it knows from the plugin's
list (as a 1.34+ kubelet does), dials the advertised endpoint, answers NotifyRegistrationStatus, and
then calls NodePrepareResources and NodeUnprepareResources with the v1 or v1beta1 stubs and keeps
NodeWatchResources streams open.
`restart()` forgets every plugin and looks at the directory again, as a restarted kubelet does."""

from __future__ import annotations

import os
import select
import stat
import threading
from typing import Any, Callable, Optional

import grpc
from gpu_device_plugin import watch
from gpu_device_plugin.dra.api import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

KNOWN_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
STUBS = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub),
}
HEALTH = {
    "v1": (health_v1_pb2, health_v1_pb2_grpc.DRAResourceHealthStub),
    "v1alpha1": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc.DRAResourceHealthStub),
}


class Registered:
    def __init__(self, socket: str, info: Any, service: str) -> None:
        self.socket = socket
        self.info = info
        self.service = service
        self.channel = grpc.insecure_channel("unix:" + info.endpoint)

    def close(self) -> None:
        self.channel.close()


class HealthWatch:
    """One NodeWatchResources stream; `updates` holds every message as {device: (health name, message)}."""

    def __init__(self, channel: grpc.Channel, version: str) -> None:
        self.pb2, stub_class = HEALTH[version]
        self.updates: list[dict[str, tuple[str, str]]] = []
        self.pools: set[str] = set()
        self.cond = threading.Condition()
        self._stream = stub_class(channel).NodeWatchResources(self.pb2.NodeWatchResourcesRequest())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for response in self._stream:
                update = {
                    d.device.device_name: (self.pb2.HealthStatus.Name(d.health), d.message) for d in response.devices
                }
                with self.cond:
                    self.pools.update(d.device.pool_name for d in response.devices)
                    self.updates.append(update)
                    self.cond.notify_all()
        except grpc.RpcError:
            pass

    def wait(self, predicate: Callable[[dict[str, tuple[str, str]]], bool], timeout: float = 15.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: bool(self.updates) and predicate(self.updates[-1]), timeout)

    def cancel(self) -> None:
        self._stream.cancel()


class PluginWatcherDouble:
    def __init__(self, registry_dir: str) -> None:
        self.registry_dir = registry_dir
        self.cond = threading.Condition()
        self.plugins: dict[str, Registered] = {}  # driver name -> plugin
        self.registrations: list[Any] = []  # every PluginInfo registered
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._retired: list[Registered] = []
        self._thread: Optional[threading.Thread] = None
        self._watches: list[HealthWatch] = []

    # -- the plugin watcher --------------------------------------------------------------------
    def start(self) -> PluginWatcherDouble:
        os.makedirs(self.registry_dir, exist_ok=True)
        self._stop.clear()
        self._inotify = watch.Inotify()
        self._inotify.add_watch(self.registry_dir, watch.IN_CREATE | watch.IN_MOVED_TO)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        # What is there already, then each socket created (the kubelet's plugin watcher does the same).
        pending = sorted(os.listdir(self.registry_dir))
        while not self._stop.is_set():
            for name in pending:
                path = os.path.join(self.registry_dir, name)
                try:
                    is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
                except OSError:
                    continue
                if is_socket and not name.startswith("."):
                    self._register(path)
            ready, _w, _x = select.select([self._inotify.fd], [], [], 0.05)
            pending = [e.name for e in self._inotify.read()] if ready else []
        self._inotify.close()

    def _register(self, path: str) -> None:
        with grpc.insecure_channel("unix:" + path) as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            # The socket file exists from bind() on, before the plugin listens: try again a few times, as
            # the kubelet's reconciler does.
            for attempt in range(5):
                try:
                    info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=2, wait_for_ready=True)
                    break
                except grpc.RpcError as exc:
                    if attempt == 4 or self._stop.wait(0.2):
                        with self.cond:
                            self.errors.append(f"GetInfo on {path}: {exc.code().name}")
                            self.cond.notify_all()
                        return
            chosen = next((s for s in info.supported_versions if s in KNOWN_SERVICES), None)
            error = ""
            if info.type != "DRAPlugin":
                error = f"unexpected plugin type {info.type!r}"
            elif chosen is None:
                error = f"none of {list(info.supported_versions)} is supported"
            try:
                stub.NotifyRegistrationStatus(
                    pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=not error, error=error), timeout=5
                )
            except grpc.RpcError as exc:
                error = error or f"NotifyRegistrationStatus on {path}: {exc.code().name}"
        with self.cond:
            if error:
                self.errors.append(error)
            else:
                old = self.plugins.get(info.name)
                self.plugins[info.name] = Registered(path, info, str(chosen))
                self.registrations.append(info)
                if old is not None:
                    self._retired.append(old)  # closed at stop: a test may still be calling through it
            self.cond.notify_all()

    def restart(self) -> None:
        """Forget every plugin and look at the directory again, as a restarted kubelet does."""
        self.stop()
        self.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
            assert not self._thread.is_alive(), "the plugin-watcher double did not stop"
        for stream in self._watches:
            stream.cancel()
        self._watches.clear()
        with self.cond:
            plugins, self.plugins = list(self.plugins.values()) + self._retired, {}
            self._retired = []
        for plugin in plugins:
            plugin.close()

    # -- what tests do and look at ---------------------------------------------------------------
    def wait(self, predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def registered(self, driver: str) -> int:
        return sum(1 for info in self.registrations if info.name == driver)

    def _stub(self, driver: str, version: str) -> tuple[Any, Any]:
        pb2, stub_class = STUBS[version]
        return pb2, stub_class(self.plugins[driver].channel)

    def prepare(self, driver: str, claims: list[tuple[str, str, str]], version: str = "v1") -> dict[str, Any]:
        """NodePrepareResources for (namespace, name, uid) claims; the per-claim answers by UID."""
        pb2, stub = self._stub(driver, version)
        request = pb2.NodePrepareResourcesRequest(
            claims=[pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return dict(stub.NodePrepareResources(request, timeout=10).claims)

    def unprepare(self, driver: str, claims: list[tuple[str, str, str]], version: str = "v1") -> dict[str, str]:
        pb2, stub = self._stub(driver, version)
        request = pb2.NodeUnprepareResourcesRequest(
            claims=[pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return {uid: entry.error for uid, entry in stub.NodeUnprepareResources(request, timeout=10).claims.items()}

    def watch_health(self, driver: str, version: str = "v1") -> HealthWatch:
        stream = HealthWatch(self.plugins[driver].channel, version)
        self._watches.append(stream)
        return stream
