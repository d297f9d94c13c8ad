#!/usr/bin/env python
"""A test double of the kubelet's device manager (there is no kubelet on the test hosts).

It does what the kubelet does with a device plugin, over real unix-socket gRPC: serves
`Registration` on kubelet.sock, dials back to each plugin inside Register (GetDevicePluginOptions),
keeps a ListAndWatch stream open per resource and remembers the latest device list. `restart()`
behaves like a kubelet restart: every file in the directory except the checkpoint and DEPRECATION
is deleted and kubelet.sock is created anew.

Standalone (used by molecule scenarios to prove the systemd deployment registers):

    python kubelet_double.py --socket /var/lib/kubelet/device-plugins/kubelet.sock --report out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures
from typing import Any, Callable, Optional

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from gpu_device_plugin.api import api_pb2, api_pb2_grpc

KEEP = ("kubelet_internal_checkpoint", "DEPRECATION")


class Endpoint:
    """The kubelet's side of one registered plugin."""

    def __init__(self, double: KubeletDouble, request: api_pb2.RegisterRequest, timeout: float = 5.0) -> None:
        self.double = double
        self.resource = request.resource_name
        self.socket = os.path.join(double.directory, request.endpoint)
        self.channel = grpc.insecure_channel("unix:" + self.socket)
        self.stub = api_pb2_grpc.DevicePluginStub(self.channel)
        self.options = self.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout)
        self.devices: Optional[list[dict[str, Any]]] = None
        self.updates = 0
        self.stream_ended: Optional[str] = None
        self._stream: Any = None
        self._thread = threading.Thread(target=self._watch, daemon=True, name=f"law-{self.resource}")
        self._thread.start()

    def _watch(self) -> None:
        try:
            self._stream = self.stub.ListAndWatch(api_pb2.Empty())
            for response in self._stream:
                devices = [
                    {"id": d.ID, "health": d.health, "numa": [n.ID for n in d.topology.nodes]} for d in response.devices
                ]
                with self.double.cond:
                    self.devices, self.updates = devices, self.updates + 1
                    self.double.cond.notify_all()
                self.double.write_report()
            ended = "OK"
        except grpc.RpcError as exc:
            ended = exc.code().name
        with self.double.cond:
            self.stream_ended = ended
            self.double.cond.notify_all()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        self.channel.close()


class KubeletDouble(api_pb2_grpc.RegistrationServicer):
    def __init__(self, socket_path: str, report: Optional[str] = None) -> None:
        self.socket_path = socket_path
        self.directory = os.path.dirname(os.path.abspath(socket_path))
        self.report = report
        self.cond = threading.Condition()
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.endpoints: dict[str, Endpoint] = {}
        self.register_errors: list[str] = []
        self._server: Optional[grpc.Server] = None

    # -- the Registration service ----------------------------------------------------------------
    def Register(self, request: api_pb2.RegisterRequest, context: Any) -> api_pb2.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        # As the kubelet (devicemanager's Register, connectClient, PluginConnected): the plugin is dialled and asked
        # its options within the Register call's own deadline, and a plugin that stopped waiting is not registered.
        remaining = context.time_remaining()
        try:
            endpoint = Endpoint(self, request, timeout=5.0 if remaining is None else max(min(remaining, 5.0), 0.01))
        except grpc.RpcError as exc:
            with self.cond:
                self.register_errors.append(f"{request.resource_name}: {exc.code().name}")
            context.abort(grpc.StatusCode.UNKNOWN, f"cannot dial the plugin at {request.endpoint}")
        if not context.is_active():
            endpoint.close()
            with self.cond:
                self.register_errors.append(f"{request.resource_name}: the plugin stopped waiting")
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the plugin stopped waiting for its registration")
        with self.cond:
            old = self.endpoints.get(request.resource_name)
            self.endpoints[request.resource_name] = endpoint
            self.registrations.append(request)
            self.cond.notify_all()
        if old is not None:
            old.close()
        self.write_report()
        return api_pb2.Empty()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port("unix:" + self.socket_path)
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        with self.cond:
            endpoints, self.endpoints = list(self.endpoints.values()), {}
        for endpoint in endpoints:
            endpoint.close()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def restart(self) -> None:
        """What a kubelet restart does to the directory: wipe it, then serve kubelet.sock again."""
        self.stop()
        for name in os.listdir(self.directory):
            if name not in KEEP:
                path = os.path.join(self.directory, name)
                if not os.path.isdir(path):
                    os.unlink(path)
        self.start()

    # -- what tests look at -------------------------------------------------------------------------
    def wait(self, predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def devices(self, resource: str) -> Optional[list[dict[str, Any]]]:
        endpoint = self.endpoints.get(resource)
        return None if endpoint is None else endpoint.devices

    def health(self, resource: str) -> dict[str, str]:
        return {d["id"]: d["health"] for d in self.devices(resource) or []}

    def registered(self, resource: str) -> int:
        return sum(1 for r in self.registrations if r.resource_name == resource)

    def stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        return self.endpoints[resource].stub

    def write_report(self) -> None:
        if not self.report:
            return
        # The Register handler and each resource's ListAndWatch thread write the report: one at a time, under the
        # double's own lock, else two writers share the temporary file and the report is two reports run together.
        with self.cond:
            data = {
                "registrations": [
                    {
                        "version": r.version,
                        "endpoint": r.endpoint,
                        "resource_name": r.resource_name,
                        "pre_start_required": r.options.pre_start_required,
                        "get_preferred_allocation_available": r.options.get_preferred_allocation_available,
                    }
                    for r in self.registrations
                ],
                "resources": {
                    name: {"endpoint": os.path.basename(e.socket), "devices": e.devices, "updates": e.updates}
                    for name, e in self.endpoints.items()
                },
                "written_at": time.time(),
            }
            tmp = f"{self.report}.tmp"
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(data, handle, indent=2)
            os.replace(tmp, self.report)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="kubelet device-manager test double")
    parser.add_argument("--socket", default="/var/lib/kubelet/device-plugins/kubelet.sock")
    parser.add_argument("--report", help="JSON file rewritten with the latest registrations and devices")
    args = parser.parse_args(argv)
    double = KubeletDouble(args.socket, args.report)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    double.start()
    double.write_report()
    done.wait()
    double.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
