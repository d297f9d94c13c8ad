"""Prometheus metrics, /healthz and /readyz, served by a small HTTP thread on --metrics-address."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

log = logging.getLogger(__name__)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.devices = Gauge(
            "gpu_device_plugin_devices",
            "Devices advertised, by resource and health.",
            ["resource", "health"],
            registry=self.registry,
        )
        self.allocations = Counter(
            "gpu_device_plugin_allocations", "Container allocations answered.", ["resource"], registry=self.registry
        )
        self.allocation_errors = Counter(
            "gpu_device_plugin_allocation_errors", "Allocate requests refused.", ["resource"], registry=self.registry
        )
        self.registrations = Counter(
            "gpu_device_plugin_registrations",
            "Register calls to the kubelet.",
            ["resource", "result"],
            registry=self.registry,
        )
        self.xid_events = Counter(
            "gpu_device_plugin_xid_events", "XID events seen.", ["device", "xid", "critical"], registry=self.registry
        )
        self.errors = Counter("gpu_device_plugin_errors", "Errors, by kind.", ["kind"], registry=self.registry)
        self.fault_class = Gauge(
            "gpuops_gpu_fault_class",
            "Each GPU's remediation class: 1 for the class it is in, 0 for the others (none, device, reset, reboot,"
            " replace).",
            ["gpu", "class"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


Probe = Callable[[], "tuple[bool, dict[str, Any]]"]
# What a path answers: (status, content type, body).
Route = Callable[[], "tuple[int, str, bytes]"]


class HttpServer:
    """GET on each path of `routes` answers what its route gives; any other path 404. Served by a thread of its own
    (`name`), a thread per request."""

    def __init__(self, address: str, routes: dict[str, Route], name: str) -> None:
        host, _sep, port = address.rpartition(":")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?")[0])
                self._send(*(route() if route is not None else (404, "text/plain", b"not found\n")))

            def _send(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http request", extra={"request": format % args})

        self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self.server.daemon_threads = True
        self.address = "{}:{}".format(*self.server.server_address[:2])
        self._thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HttpEndpoint(HttpServer):
    """`/metrics` (Prometheus text format), `/healthz` (liveness: 200 while the daemon serves its sockets,
    else 503) and `/readyz` (readiness: 200 once it also does its job for the kubelet, else 503); both
    probes answer a JSON summary."""

    def __init__(self, address: str, metrics: Metrics, health: Probe, ready: Optional[Probe] = None) -> None:
        def probe(check: Probe) -> Route:
            def answer() -> tuple[int, str, bytes]:
                ok, detail = check()
                return 200 if ok else 503, "application/json", json.dumps(detail).encode()

            return answer

        routes: dict[str, Route] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, metrics.render()),
            "/healthz": probe(health),
            "/readyz": probe(ready or health),
        }
        super().__init__(address, routes, "metrics-http")

    def start(self) -> None:
        super().start()
        log.info("serving /metrics, /healthz and /readyz", extra={"address": self.address})
