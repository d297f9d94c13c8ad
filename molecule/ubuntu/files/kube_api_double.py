# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A double of the Kubernetes API server for gpuops.k8s.node_drain on the scenario's node double: it knows the Node
and says that no pod runs on it, so node_drain goes ahead as it does for a node without GPU pods. It answers the
discovery and the two reads node_drain makes (the node's pods, the Node) and nothing else: any write (a cordon, an
eviction) is answered 405 and recorded, as is every request, one line each in DIR/requests.log.
    kube_api_double.py DIR NODE_NAME
It listens on 127.0.0.1 on a free port, written to DIR/port, and exits after twenty minutes."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

STATE = Path(sys.argv[1])
NODE = sys.argv[2]
RESOURCES = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ["get", "list"]},
        {"name": "pods/eviction", "singularName": "", "namespaced": True, "kind": "Eviction", "verbs": ["create"]},
        {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node", "verbs": ["get", "list"]},
    ],
}
ANSWERS = {
    "/version": {"major": "1", "minor": "37", "gitVersion": "v1.37.0-gpuops-double"},
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": RESOURCES,
    "/api/v1/pods": {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []},
    f"/api/v1/nodes/{NODE}": {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": NODE, "resourceVersion": "1", "annotations": {}},
        "spec": {},
    },
}


class Handler(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        with (STATE / "requests.log").open("a") as log:
            log.write(f"{self.command} {self.path} {status}\n")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if path in ANSWERS:
            self._answer(200, ANSWERS[path])
        else:
            self._status(404, "NotFound")

    def _status(self, code: int, reason: str) -> None:
        self._answer(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code})

    def _refuse(self) -> None:
        self._status(405, "MethodNotAllowed")

    do_POST = do_PATCH = do_PUT = do_DELETE = _refuse

    def log_message(self, *args) -> None:
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Timer(1200, server.shutdown).start()
(STATE / "port").write_text(str(server.server_address[1]))
server.serve_forever()
