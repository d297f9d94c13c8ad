"""GPU faults shown by the daemon (faults.py): the health file, the class gauge, the alert webhook and the Node
condition GPUHealthy, driven through the simulated spec and the pynvml double.

The health file is a real file in tmp_path. The webhook's peer is real: an HTTP server on 127.0.0.1 (the
standard library's) that records each POST and can be made to hold its answer, answer a status of its choice
or trickle its answer. Settings the tests give as environment variables are read the same way as from the
config file. The Node condition goes to
a test double of the API server client that records each condition (dra.kubeapi.KubeApi.set_node_condition
itself is tested against a real kube-apiserver in tests/integration/test_dra_api.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import pytest
from gpu_device_plugin import config, faults
from gpu_device_plugin.faults import CONDITION_TYPE
from harness import H100, DaemonThread, fixture, make_config, wait_until, write_spec
from pynvml_double import PynvmlDouble

GPU = "nvidia.com/gpu"


class WebhookPeer:
    """An HTTP server that records the JSON bodies POSTed to it; `hold` (an Event) keeps each answer back
    until it is set."""

    def __init__(self, status: int = 200) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[Optional[str]] = []
        self.requests: list[str] = []  # "METHOD path" of every request, whatever its method
        self.hold: Optional[threading.Event] = None
        self.arrived = threading.Event()
        self.statuses: list[int] = []  # answered first, one per request, then `status`
        self.headers: dict[str, str] = {}  # sent with each answer
        self.trickle: Optional[bytes] = None  # an answer's body sent a byte at a time, 0.1 s apart
        self.trickle_cut = threading.Event()  # the client went away before the trickle ended
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                peer.requests.append(f"GET {self.path}")
                peer.authorizations.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                peer.requests.append(f"POST {self.path}")
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                assert self.headers.get("Content-Type") == "application/json"
                peer.authorizations.append(self.headers.get("Authorization"))
                peer.bodies.append(body)
                peer.arrived.set()
                if peer.hold is not None:
                    peer.hold.wait(10)
                self.send_response(peer.statuses.pop(0) if peer.statuses else status)
                for key, value in peer.headers.items():
                    self.send_header(key, value)
                if peer.trickle is None:
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_header("Content-Length", str(len(peer.trickle)))
                self.end_headers()
                try:
                    for byte in peer.trickle:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.1)
                except OSError:
                    peer.trickle_cut.set()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alert"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()


class ConditionsDouble:
    """Stands in for the API server client's set_node_condition: records every condition; `fail` (a count)
    makes that many calls fail as an unreachable API server does."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail = 0
        self.unreadable = 0  # this many calls get an answer that is not JSON, as a proxy's error page is
        self._lock = threading.Lock()

    def set_node_condition(self, node_name: str, condition: dict[str, Any]) -> bool:
        with self._lock:
            if self.fail:
                self.fail -= 1
                raise ConnectionRefusedError(111, "connection refused (API server double)")
            if self.unreadable:
                self.unreadable -= 1
                json.loads("<html>bad gateway</html>")
            self.calls.append((node_name, dict(condition)))
        return True

    def last(self) -> Optional[dict[str, Any]]:
        with self._lock:
            return self.calls[-1][1] if self.calls else None


@pytest.fixture
def webhook():
    peer = WebhookPeer()
    yield peer
    peer.close()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """A failed POST is tried again after 0.01 s, then 0.02 s (1 s, then 2 s in the product)."""
    monkeypatch.setattr(faults, "WEBHOOK_RETRY_SECONDS", 0.01, raising=False)


# The token may go over plain http to the peers on 127.0.0.1.
TOKEN_OVER_HTTP = {"GPU_DEVICE_PLUGIN_ALERT_WEBHOOK_TOKEN_OVER_HTTP": "true"}


def edit(node, **per_gpu: dict[str, Any]) -> None:
    """Write the fixture again with the given GPUs' keys changed (gpu index -> {key: value or None})."""
    spec = fixture("h100x8.yaml")
    for index, changes in per_gpu.items():
        for key, value in changes.items():
            if value is None:
                spec["gpus"][int(index[1:])].pop(key, None)
            else:
                spec["gpus"][int(index[1:])][key] = value
    write_spec(node.spec, spec)


def read_health(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def gpu_row(path: str, index: int) -> dict[str, Any]:
    return read_health(path)["gpus"][index]


def start(node, conditions: Any = None, env: Optional[dict[str, str]] = None, **values: Any) -> DaemonThread:
    settings = make_config(node.kubelet_socket, node.spec, env, **values)
    daemon = DaemonThread(settings, conditions_side=(lambda _config: conditions) if conditions else None).start()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    return daemon


def test_the_health_file_shows_each_gpus_class_and_xids(node):
    path = str(node.tmp / "state" / "gpu-health.json")  # the directory does not exist yet
    daemon = start(node, health_file=path, node_name="gpu-node-1")
    try:
        first = read_health(path)
        assert first["version"] == 1 and first["node"] == "gpu-node-1" and first["updated"].endswith("Z")
        assert [(g["index"], g["uuid"], g["healthy"], g["class"], g["xids"]) for g in first["gpus"]] == [
            (i, H100[i], True, "none", []) for i in range(8)
        ]
        assert first["gpus"][0]["pci"] == fixture("h100x8.yaml")["gpus"][0]["pci_bus_id"]

        edit(node, g0={"xid": 13}, g1={"xid": 79}, g2={"xid": 48}, g3={"lost": True})
        # Each GPU's event is its own write of the file, in no promised order: wait for all four.
        assert wait_until(
            lambda: (
                [(r["class"], bool(r["xids"])) for r in read_health(path)["gpus"][:4]]
                == [("none", True), ("reboot", True), ("reset", True), ("reboot", False)]
            )
        )
        rows = read_health(path)["gpus"]
        # XID 13 is ignored: healthy, class none, and the XID is still listed.
        assert (rows[0]["healthy"], rows[0]["class"]) == (True, "none")
        assert [(x["xid"], x["class"]) for x in rows[0]["xids"]] == [(13, "none")]
        assert (rows[1]["healthy"], rows[1]["class"]) == (False, "reboot")
        assert rows[1]["reason"] == "XID 79 (GPU has fallen off the bus): catalog RESTART_BM"
        (xid,) = rows[1]["xids"]
        assert (xid["xid"], xid["class"], xid["data"]) == (79, "reboot", None) and xid["time"].endswith("Z")
        assert (rows[2]["healthy"], rows[2]["class"]) == (False, "reset")
        assert (rows[3]["healthy"], rows[3]["class"], rows[3]["xids"]) == (False, "reboot", [])
        assert rows[3]["reason"].startswith("fell off the bus (XID 79 ")
        assert all(r["healthy"] and r["class"] == "none" for r in rows[4:])
        # Written atomically: nothing but the file in its directory.
        assert os.listdir(os.path.dirname(path)) == ["gpu-health.json"]
    finally:
        daemon.stop()


def test_the_class_is_the_highest_since_the_gpu_became_healthy_and_starts_over_after(node):
    path = str(node.tmp / "gpu-health.json")
    daemon = start(node, health_file=path, health_recovery_seconds=0.3)
    try:
        edit(node, g5={"xid": 79})
        assert wait_until(lambda: gpu_row(path, 5)["class"] == "reboot")
        edit(node, g5={"xid": 48})  # a lesser class does not lower it
        assert wait_until(lambda: len(gpu_row(path, 5)["xids"]) == 2)
        assert gpu_row(path, 5)["class"] == "reboot"
        edit(node)  # the standing XID is gone: the quiet period brings the GPU back
        assert wait_until(lambda: gpu_row(path, 5)["healthy"])
        assert (gpu_row(path, 5)["class"], gpu_row(path, 5)["xids"]) == ("none", [])
        edit(node, g5={"xid": 48})
        assert wait_until(lambda: gpu_row(path, 5)["class"] == "reset")
    finally:
        daemon.stop()


def test_xid_classes_from_the_config_move_xids_across_the_health_line(node, tmp_path):
    config_file = tmp_path / "config.yaml"
    config_file.write_text("version: v1\ngpuops:\n  xidClasses:\n    '13': reset\n    79: none\n")
    path = str(tmp_path / "gpu-health.json")
    daemon = start(node, health_file=path, **config.load_file(str(config_file)))
    try:
        edit(node, g0={"xid": 13}, g1={"xid": 79})
        assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[0]) == "Unhealthy")
        assert node.kubelet.health(GPU)[H100[1]] == "Healthy"
        assert wait_until(lambda: gpu_row(path, 0)["class"] == "reset")
        assert gpu_row(path, 0)["reason"] == "XID 13 is reset by the inventory's override"
        assert (gpu_row(path, 1)["healthy"], gpu_row(path, 1)["class"]) == (True, "none")
    finally:
        daemon.stop()


def test_the_fault_class_gauge(node):
    daemon = start(node)
    try:
        edit(node, g2={"xid": 95})
        node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[2]) == "Unhealthy")

        def gauge(uuid: str, name: str) -> str:
            return f'gpuops_gpu_fault_class{{class="{name}",gpu="{uuid}"}}'

        assert wait_until(lambda: gauge(H100[2], "reset") + " 1.0" in daemon.daemon.metrics.render().decode())
        text = daemon.daemon.metrics.render().decode()
        for name in ("none", "device", "reboot", "replace"):
            assert gauge(H100[2], name) + " 0.0" in text
        assert gauge(H100[0], "none") + " 1.0" in text
    finally:
        daemon.stop()


def test_the_webhook_hears_once_per_gpu_and_class(node, webhook):
    path = str(node.tmp / "gpu-health.json")
    daemon = start(node, alert_webhook=webhook.url, node_name="gpu-node-1", health_file=path)

    def seen(*xids: int) -> bool:
        return [x["xid"] for x in gpu_row(path, 1)["xids"]] == list(xids)

    try:
        edit(node, g0={"xid": 78}, g1={"xid": 79})  # 78 is device: no alert; 79 is reboot
        assert webhook.arrived.wait(5)
        (body,) = webhook.bodies
        assert {k: body[k] for k in ("node", "gpu", "uuid", "xid", "class")} == {
            "node": "gpu-node-1",
            "gpu": 1,
            "uuid": H100[1],
            "xid": 79,
            "class": "reboot",
        }
        assert body["time"].endswith("Z") and body["reason"].startswith("XID 79 ")
        # Another XID of the same class, then a lesser one: no news. A higher one is.
        # (Each edit is waited for: the spec's watcher would see only the last of quick edits.)
        edit(node, g0={"xid": 78}, g1={"xid": 151})
        assert wait_until(lambda: seen(79, 151))
        edit(node, g0={"xid": 78}, g1={"xid": 48})
        assert wait_until(lambda: seen(79, 151, 48))
        edit(node, g0={"xid": 78}, g1={"xid": 54})
        assert wait_until(lambda: seen(79, 151, 48, 54))
        assert wait_until(lambda: len(webhook.bodies) >= 2)
        assert (webhook.bodies[1]["class"], webhook.bodies[1]["xid"]) == ("replace", 54)
        for future in daemon.daemon.faults.webhook_posts:  # every POST was answered: nothing else is pending
            assert future.result(5) is True
        assert len(webhook.bodies) == 2
    finally:
        daemon.stop()


def test_the_webhook_carries_the_token_of_its_token_file_read_at_each_post(node, webhook, tmp_path):
    token = tmp_path / "alert-token"
    token.write_text("first-token\n")
    daemon = start(node, env=TOKEN_OVER_HTTP, alert_webhook=webhook.url, alert_webhook_token_file=str(token))
    try:
        edit(node, g1={"xid": 79})
        assert wait_until(lambda: len(webhook.bodies) == 1)
        token.write_text("rotated-token")  # a new token is taken without a restart
        edit(node, g1={"xid": 79}, g2={"xid": 48})
        assert wait_until(lambda: len(webhook.bodies) == 2)
        assert webhook.authorizations == ["Bearer first-token", "Bearer rotated-token"]
    finally:
        daemon.stop()


def test_without_a_token_file_the_webhook_gets_no_authorization(node, webhook):
    daemon = start(node, alert_webhook=webhook.url)
    try:
        edit(node, g3={"xid": 79})
        assert wait_until(lambda: len(webhook.bodies) == 1)
        assert webhook.authorizations == [None]
    finally:
        daemon.stop()


def test_a_webhook_that_does_not_answer_never_holds_the_daemon(node, webhook):
    webhook.hold = threading.Event()
    path = str(node.tmp / "gpu-health.json")
    daemon = start(node, alert_webhook=webhook.url, health_file=path)
    try:
        edit(node, g1={"xid": 79})
        assert webhook.arrived.wait(5)
        # The POST hangs; the kubelet, the health file and the next alert's turn go on.
        edit(node, g1={"xid": 79}, g2={"xid": 95}, g4={"lost": True})
        assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[2]) == "Unhealthy")
        assert wait_until(lambda: gpu_row(path, 4)["class"] == "reboot")
        assert len(webhook.bodies) == 1
        webhook.hold.set()
        assert wait_until(lambda: len(webhook.bodies) == 3)
        assert sorted((b["uuid"], b["class"]) for b in webhook.bodies[1:]) == [(H100[2], "reset"), (H100[4], "reboot")]
    finally:
        daemon.stop()


def test_a_webhook_that_is_away_is_logged_and_counted(node, tmp_path, caplog):
    # A port nothing listens on: the POST is refused.
    closed = WebhookPeer()
    url = closed.url
    closed.close()
    daemon = start(node, alert_webhook=url)
    try:
        edit(node, g0={"xid": 79})
        assert wait_until(lambda: len(daemon.daemon.faults.webhook_posts) == 1)
        assert daemon.daemon.faults.webhook_posts[0].result(10) is False
        assert 'gpu_device_plugin_errors_total{kind="alert_webhook"} 1.0' in daemon.daemon.metrics.render().decode()
        # The kubelet hears of the GPU on its own stream, which may come after the webhook's answer.
        assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[0]) == "Unhealthy")
    finally:
        daemon.stop()
    assert any(r.getMessage() == "the alert webhook failed" for r in caplog.records)


def test_the_node_condition_names_the_gpu_and_the_xid_and_comes_back(node):
    conditions = ConditionsDouble()
    conditions.fail = 1  # the API server is away at first: the condition is retried
    daemon = start(node, conditions=conditions, node_name="gpu-node-1", health_recovery_seconds=0.3)
    try:
        assert wait_until(lambda: conditions.last() is not None)
        assert conditions.calls[0] == (
            "gpu-node-1",
            {"type": CONDITION_TYPE, "status": "True", "reason": "GPUsHealthy", "message": "All 8 GPUs are healthy."},
        )
        edit(node, g2={"xid": 48}, g6={"xid": 79})
        # The two XIDs are two events: wait for the condition that names both GPUs.
        assert wait_until(
            lambda: all(f"GPU {i} " in (conditions.last() or {}).get("message", "") for i in (2, 6)), timeout=5
        )
        wanted = conditions.last()
        assert wanted is not None
        assert wanted["reason"] == "XID79"  # the worst GPU's
        assert wanted["message"] == (
            f"GPU 6 ({H100[6]}): class reboot, XID 79 (GPU has fallen off the bus): catalog RESTART_BM; "
            f"GPU 2 ({H100[2]}): class reset, XID 48 (double bit ECC error): catalog WORKFLOW_XID_48."
        )
        edit(node)
        assert wait_until(lambda: (conditions.last() or {}).get("status") == "True")
    finally:
        daemon.stop()


def test_without_credentials_there_is_no_condition(node, monkeypatch):
    from gpu_device_plugin.faults import default_conditions

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # The device-plugin mode under systemd: neither a kubeconfig nor a ServiceAccount, perhaps a node name.
    assert default_conditions(make_config(node.kubelet_socket, node.spec)) is None
    assert default_conditions(make_config(node.kubelet_socket, node.spec, node_name="n")) is None
    # A kubeconfig without a node name: the daemon would not know which Node is its own.
    assert default_conditions(make_config(node.kubelet_socket, node.spec, kubeconfig="/k")) is None
    # Switched off.
    assert default_conditions(make_config(node.kubelet_socket, node.spec, node_name="n", node_condition=False)) is None


def test_xid_154_takes_the_recovery_action_nvml_reports(node):
    double = PynvmlDouble.from_spec(node.spec)
    path = str(node.tmp / "gpu-health.json")
    daemon = DaemonThread(make_config(node.kubelet_socket, None, health_file=path), nvml=double).start()
    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        double.inject_xid(H100[3], 154, recovery_action=2)  # node reboot
        double.inject_xid(H100[4], 154)  # NVML cannot tell
        assert wait_until(lambda: gpu_row(path, 3)["class"] == "reboot" and gpu_row(path, 4)["xids"])
        (xid,) = gpu_row(path, 3)["xids"]
        assert xid["data"] == "GPU recovery action changed to 0x2 (read from NVML)"
        assert xid["reason"] == "XID 154: the driver's recovery action is now node reboot (0x2)"
        assert gpu_row(path, 4)["class"] == "device"
    finally:
        daemon.stop()


def test_an_unwritable_health_file_is_logged_and_counted(node, tmp_path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    daemon = start(node, health_file=str(blocker / "gpu-health.json"))
    try:
        edit(node, g0={"xid": 79})
        assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[0]) == "Unhealthy")
        assert wait_until(
            lambda: 'gpu_device_plugin_errors_total{kind="health_file"}' in daemon.daemon.metrics.render().decode()
        )
    finally:
        daemon.stop()
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cannot write the GPU health file")]
    assert messages and messages[0].startswith(f"cannot write the GPU health file {blocker / 'gpu-health.json'}: ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("  xidClasses:\n    79: rebooot\n", "gpuops.xidClasses: XID 79 maps to 'rebooot', which is not one of"),
        ("  xidClasses:\n    x: reset\n", "gpuops.xidClasses: 'x' is not an XID (a positive integer)."),
        ("  xidClasses: [79]\n", "gpuops.xidClasses must be a mapping of XID to class, not list."),
        ("  alertWebhook: ftp://x\n", "alertWebhook must be an http:// or https:// URL, not 'ftp://x'."),
        ("  healthFile: gpu-health.json\n", "healthFile must be an absolute path or off, not 'gpu-health.json'."),
        ("  alertWebhookTokenFile: token\n", "alertWebhookTokenFile must be an absolute path, not 'token'."),
        ("  nodeCondition: perhaps\n", "gpuops.nodeCondition must be true or false, not 'perhaps'."),
    ],
)
def test_bad_fault_settings_are_one_sentence(tmp_path, text, message):
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\ngpuops:\n" + text)
    with pytest.raises(config.ConfigError) as error:
        config.resolve({"backend": "simulated", "simulated_spec": "x"}, {}, config.load_file(str(path)))
    assert message in str(error.value)
    assert "\n" not in str(error.value) and str(error.value).endswith(".")


def test_the_fault_settings_from_file_environment_and_flags(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\ngpuops:\n  healthFile: /srv/h.json\n  alertWebhook: http://eda:5000/alert\n"
        "  nodeCondition: false\n  xidClasses: {63: reset}\n"
    )
    settings = config.resolve({}, {}, config.load_file(str(path)))
    assert (settings.health_file, settings.alert_webhook, settings.node_condition) == (
        "/srv/h.json",
        "http://eda:5000/alert",
        False,
    )
    assert settings.xid_overrides == {63: "reset"}
    default = config.resolve({}, {})
    assert (default.health_file, default.alert_webhook, default.node_condition, default.xid_classes) == (
        "/var/lib/gpuops/gpu-health.json",
        "",
        True,
        (),
    )
    from_env = config.resolve(
        {}, {"GPU_DEVICE_PLUGIN_HEALTH_FILE": "off", "GPU_DEVICE_PLUGIN_ALERT_WEBHOOK": "https://a"}
    )
    assert (from_env.health_file, from_env.alert_webhook) == ("off", "https://a")


def test_xid_154_through_the_library_that_reports_no_recovery_action(node, mock_nvml):
    # The real pynvml on the mock libnvidia-ml.so.1, which answers no field values: the class is the default.
    path = str(node.tmp / "gpu-health.json")
    daemon = DaemonThread(make_config(node.kubelet_socket, None, health_file=path), nvml=mock_nvml.pynvml).start()
    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        spec = fixture("h100x8.yaml")
        spec["gpus"][4]["xid"] = 154
        write_spec(mock_nvml.spec, spec)
        assert wait_until(lambda: gpu_row(path, 4)["xids"])
        (xid,) = gpu_row(path, 4)["xids"]
        assert (xid["xid"], xid["data"], xid["class"]) == (154, None, "device")
        assert xid["reason"] == "XID 154 without its recovery action: device"
    finally:
        daemon.stop()


# -- the webhook's bounds: redirects, plain http, one deadline, retries, sending again ---------------------------
def _posts(daemon: DaemonThread, count: int) -> list[bool]:
    """The results of the daemon's first `count` POSTs, once they have all been made."""
    assert wait_until(lambda: len(daemon.daemon.faults.webhook_posts) >= count)
    return [future.result(10) for future in daemon.daemon.faults.webhook_posts[:count]]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failure_and_the_token_stays_here(node, webhook, tmp_path, caplog, status):
    token = tmp_path / "alert-token"
    token.write_text("secret-token")
    elsewhere = WebhookPeer()
    webhook.statuses = [status]
    webhook.headers = {"Location": elsewhere.url}
    try:
        daemon = start(node, env=TOKEN_OVER_HTTP, alert_webhook=webhook.url, alert_webhook_token_file=str(token))
        try:
            edit(node, g1={"xid": 79})
            assert _posts(daemon, 1) == [False]
            text = daemon.daemon.metrics.render().decode()
        finally:
            daemon.stop()
        assert 'gpu_device_plugin_errors_total{kind="alert_webhook"} 1.0' in text
        assert webhook.requests == ["POST /alert"], "a redirect is never tried again"
    finally:
        elsewhere.close()
    assert elsewhere.requests == [] and elsewhere.authorizations == [], "the redirect's target heard nothing"
    messages = [r.getMessage() for r in caplog.records if r.name == "gpu_device_plugin.faults"]
    assert "alert sent" not in messages and "the alert webhook failed" in messages
    (failed,) = [r for r in caplog.records if r.getMessage() == "the alert webhook failed"]
    assert failed.reason == (
        f"the receiver answered {status}, a redirect, which is not followed (the token stays here)"
    )


def test_a_token_is_never_sent_over_plain_http_unless_a_setting_allows_it(node, webhook, tmp_path, caplog):
    token = tmp_path / "alert-token"
    token.write_text("secret-token")
    daemon = start(node, alert_webhook=webhook.url, alert_webhook_token_file=str(token))
    try:
        edit(node, g1={"xid": 79})
        assert _posts(daemon, 1) == [False]
    finally:
        daemon.stop()
    assert webhook.requests == [] and webhook.authorizations == []
    (failed,) = [r for r in caplog.records if r.getMessage() == "the alert webhook failed"]
    assert failed.reason == (
        "the alert webhook is a plain http URL and the token is sent over https only"
        " (alertWebhookTokenOverHttp allows http): the alert is not sent"
    )


def test_one_deadline_covers_the_whole_post_and_a_trickling_receiver_is_cut(node, webhook):
    # The answer comes a byte every 0.1 s: each read waits far less than the deadline, all of them far more.
    webhook.trickle = b"x" * 40
    env = {"GPU_DEVICE_PLUGIN_ALERT_WEBHOOK_TIMEOUT_SECONDS": "0.3"}
    daemon = start(node, env=env, alert_webhook=webhook.url)
    try:
        edit(node, g1={"xid": 79})
        assert _posts(daemon, 1) == [False]
    finally:
        daemon.stop()
    # A timeout is worth trying again: three POSTs in all, each cut at its deadline.
    assert webhook.requests == ["POST /alert"] * 3
    assert webhook.trickle_cut.wait(5)


def test_a_failed_post_is_tried_again_and_a_refused_one_is_not(node, webhook):
    webhook.statuses = [503, 502]
    daemon = start(node, alert_webhook=webhook.url)
    try:
        edit(node, g1={"xid": 79})
        assert _posts(daemon, 1) == [True]
        assert 'kind="alert_webhook"' not in daemon.daemon.metrics.render().decode()
        webhook.statuses = [403]  # the receiver refuses: asking again would not change its answer
        edit(node, g1={"xid": 79}, g2={"xid": 48})
        assert _posts(daemon, 2) == [True, False]
    finally:
        daemon.stop()
    assert [b["uuid"] for b in webhook.bodies] == [H100[1]] * 3 + [H100[2]]


def test_the_alert_is_sent_again_while_the_gpu_stays_faulty_and_stops_when_it_is_healthy(node, webhook):
    path = str(node.tmp / "gpu-health.json")
    env = {"GPU_DEVICE_PLUGIN_ALERT_RESEND_SECONDS": "0.05", "GPU_DEVICE_PLUGIN_ALERT_RESEND_MAX_SECONDS": "0.2"}
    daemon = start(node, env=env, alert_webhook=webhook.url, health_file=path, health_recovery_seconds=0.5)
    try:
        edit(node, g1={"xid": 79}, g2={"xid": 63})  # 63 is device: never announced, never again
        assert wait_until(lambda: len(webhook.bodies) >= 4)
        assert all(body == webhook.bodies[0] for body in webhook.bodies)
        assert (webhook.bodies[0]["uuid"], webhook.bodies[0]["class"]) == (H100[1], "reboot")
        # The receiver is slow to answer one post, and the next resend waits behind it in the webhook's thread:
        # it was sent while the GPU was faulty and arrives after the GPU recovers.
        webhook.hold = threading.Event()
        arrived = len(webhook.bodies)
        assert wait_until(lambda: len(webhook.bodies) > arrived)
        submitted = len(daemon.daemon.faults.webhook_posts)
        assert wait_until(lambda: len(daemon.daemon.faults.webhook_posts) > submitted)
        edit(node)  # the GPU is quiet: healthy again after the recovery period, and the alerts stop
        assert wait_until(lambda: gpu_row(path, 1)["healthy"])
        webhook.hold.set()
        for post in list(daemon.daemon.faults.webhook_posts):
            post.result(10)  # what was sent before the GPU recovered has arrived
        sent = len(webhook.bodies)
        # Longer than the longest pause (0.2 s) twice over: nothing more comes.
        assert not wait_until(lambda: len(webhook.bodies) > sent, timeout=0.5)
    finally:
        daemon.stop()


# -- the health file across restarts, durably ------------------------------------------------------------------
def test_a_restart_keeps_the_faults_of_the_gpus_that_still_exist_until_they_recover(node):
    path = str(node.tmp / "gpu-health.json")
    daemon = start(node, health_file=path)
    try:
        edit(node, g1={"xid": 79}, g3={"lost": True}, g5={"xid": 13})
        assert wait_until(
            lambda: [gpu_row(path, i)["class"] for i in (1, 3)] == ["reboot", "reboot"] and gpu_row(path, 5)["xids"]
        )
        before = read_health(path)["gpus"]
    finally:
        daemon.stop()
    # A GPU the file names that the node no longer has, and the faults gone from the spec (GPU 3 back on the bus).
    document = read_health(path)
    document["gpus"].append(dict(before[1], uuid="GPU-00000000-0000-4000-8000-00000000dead", index=8))
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle)
    edit(node)

    daemon = start(node, health_file=path)
    try:
        rows = read_health(path)["gpus"]
        assert [r["uuid"] for r in rows] == H100
        for index in (1, 3):
            assert {k: rows[index][k] for k in ("healthy", "class", "reason", "xids")} == {
                k: before[index][k] for k in ("healthy", "class", "reason", "xids")
            }
        assert (rows[5]["healthy"], rows[5]["class"]) == (True, "none"), "class none is not carried over"
        assert node.kubelet.wait(
            lambda: [node.kubelet.health(GPU).get(H100[i]) for i in (1, 3, 5)] == ["Unhealthy", "Unhealthy", "Healthy"]
        )
    finally:
        daemon.stop()
    # With a recovery period, the carried faults recover as the policy says.
    daemon = start(node, health_file=path, health_recovery_seconds=0.2)
    try:
        assert wait_until(lambda: gpu_row(path, 1)["class"] == "reboot")
        assert wait_until(lambda: all(r["healthy"] and r["class"] == "none" for r in read_health(path)["gpus"]))
    finally:
        daemon.stop()


def test_a_fault_a_remediation_cleared_is_not_carried_over_and_a_worse_one_is(node, monkeypatch, caplog):
    path = str(node.tmp / "gpu-health.json")
    boot = node.tmp / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setattr(faults, "BOOT_ID_FILE", str(boot))
    caplog.set_level(logging.INFO, logger=faults.__name__)
    daemon = start(node, health_file=path)
    try:
        # GPU 1 to reboot, GPU 2 to reset, GPU 4 to replace (XID 54: auxiliary power), GPU 6 to reset.
        edit(node, g1={"xid": 79}, g2={"xid": 48}, g4={"xid": 54}, g6={"xid": 48})
        assert wait_until(
            lambda: [gpu_row(path, i)["class"] for i in (1, 2, 4, 6)] == ["reboot", "reset", "replace", "reset"]
        )
    finally:
        daemon.stop()
    assert read_health(path)["boot"] == "boot-a"
    edit(node)
    reset_done = faults.iso(time.time())
    notices = {
        "version": 1,
        "notices": [
            # GPU 2 and GPU 4 were reset while the daemon was stopped; GPU 6's reset was before its fault.
            {"class": "reset", "gpus": [H100[2], H100[4]], "time": reset_done},
            {"class": "reset", "gpus": [H100[6]], "time": "2020-01-01T00:00:00.000000Z"},
            # The node is about to reboot, in boot-a.
            {"class": "reboot", "gpus": [], "boot": "boot-a"},
        ],
    }
    with open(path + ".cleared", "w", encoding="utf-8") as handle:
        json.dump(notices, handle)

    def classes() -> list[str]:
        return [gpu_row(path, i)["class"] for i in range(8)]

    # Started again in the same boot (the reboot has not happened): only the reset's notice holds.
    daemon = start(node, health_file=path)
    try:
        assert wait_until(lambda: classes() == ["none", "reboot", "none", "none", "replace", "none", "reset", "none"])
        assert not gpu_row(path, 1)["healthy"] and gpu_row(path, 2)["healthy"]
    finally:
        daemon.stop()
    # After the reboot: the reboot's notice clears everything up to reboot; the GPU to replace stays.
    boot.write_text("boot-b\n")
    daemon = start(node, health_file=path)
    try:
        assert wait_until(lambda: classes() == ["none", "none", "none", "none", "replace", "none", "none", "none"])
        assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[1]) == "Healthy")
        assert read_health(path)["boot"] == "boot-b"
    finally:
        daemon.stop()
    cleared = [r for r in caplog.records if r.getMessage() == "GPU faults a remediation cleared are not carried over"]
    assert [sorted(g["device"] for g in r.gpus) for r in cleared] == [
        sorted([H100[2]]),
        sorted([H100[1], H100[6]]),
    ]
    # The reboot's notice held once: started again in boot-b, the file is boot-b's and GPU 4 still carried.
    daemon = start(node, health_file=path)
    try:
        assert classes()[4] == "replace"
    finally:
        daemon.stop()


def test_notices_that_cannot_be_read_clear_nothing(node, caplog):
    path = str(node.tmp / "gpu-health.json")
    daemon = start(node, health_file=path)
    try:
        edit(node, g1={"xid": 79})
        assert wait_until(lambda: gpu_row(path, 1)["class"] == "reboot")
    finally:
        daemon.stop()
    edit(node)
    for text in ("{", json.dumps({"notices": [{"class": "reboot", "gpus": "all", "time": "later"}, 7]})):
        with open(path + ".cleared", "w", encoding="utf-8") as handle:
            handle.write(text)
        daemon = start(node, health_file=path)
        try:
            assert gpu_row(path, 1)["class"] == "reboot"
        finally:
            daemon.stop()
    assert any(r.getMessage().startswith("cannot read the remediation's notices") for r in caplog.records)


def test_the_health_file_is_flushed_to_disk_and_a_killed_writers_leftover_is_removed(node, monkeypatch):
    directory = node.tmp / "state"
    directory.mkdir()
    path = directory / "gpu-health.json"
    leftover = directory / ".gpu-health.json.tmp-k1ll3d"  # what a daemon killed mid-write leaves
    leftover.write_text("{")
    flushed: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    daemon = start(node, health_file=str(path))
    try:
        edit(node, g1={"xid": 79})
        assert wait_until(lambda: gpu_row(str(path), 1)["class"] == "reboot")
    finally:
        daemon.stop()
    assert os.listdir(directory) == ["gpu-health.json"]
    assert any(os.path.basename(f).startswith(".gpu-health.json.tmp-") for f in flushed), "the file is flushed"
    assert str(directory) in flushed, "the directory is flushed"


# -- the Node condition's loop ---------------------------------------------------------------------------------
def test_the_condition_loop_goes_on_after_an_answer_it_cannot_read(node, caplog):
    conditions = ConditionsDouble()
    conditions.unreadable = 1  # the first answer is a 200 that is not JSON
    daemon = start(node, conditions=conditions, node_name="gpu-node-1")
    try:
        assert wait_until(lambda: conditions.last() is not None)
    finally:
        daemon.stop()
    assert conditions.last() == {
        "type": CONDITION_TYPE,
        "status": "True",
        "reason": "GPUsHealthy",
        "message": "All 8 GPUs are healthy.",
    }
    (retry,) = [r for r in caplog.records if r.getMessage().startswith("cannot set the Node condition")]
    assert retry.reason == "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"


# -- the node's name -------------------------------------------------------------------------------------------
def test_the_host_name_is_lowered_into_a_node_name(node, webhook, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "GPU-Node-7.Example.Com")
    daemon = start(node, alert_webhook=webhook.url)
    try:
        edit(node, g1={"xid": 79})
        assert wait_until(lambda: len(webhook.bodies) == 1)
    finally:
        daemon.stop()
    assert webhook.bodies[0]["node"] == "gpu-node-7.example.com"


def test_a_host_name_that_cannot_be_a_node_name_stops_the_start_with_one_sentence(node, webhook, monkeypatch):
    from gpu_device_plugin.daemon import Daemon

    monkeypatch.setattr(socket, "gethostname", lambda: "gpu_node_7")
    settings = make_config(node.kubelet_socket, node.spec, alert_webhook=webhook.url)

    async def main() -> int:
        return await asyncio.wait_for(Daemon(settings, install_signal_handlers=False).run(), 5)

    with pytest.raises(config.ConfigError) as refused:
        asyncio.run(main())
    assert str(refused.value) == (
        "the host name 'gpu_node_7' is not a Kubernetes node name (a lower-case DNS subdomain), which the alert"
        " webhook needs: set nodeName (--node-name or the NODE_NAME variable)."
    )
    assert node.kubelet.devices(GPU) is None, "nothing was served"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"node_name": "GPU_node"}, "the node name must be a Kubernetes node name (a lower-case DNS subdomain)"),
        ({"alert_webhook_timeout_seconds": 0.0}, "alertWebhookTimeoutSeconds must be a number of seconds above 0."),
        ({"alert_resend_seconds": 0.0}, "alertResendSeconds must be a number of seconds above 0, or off."),
    ],
)
def test_bad_alert_and_node_settings_are_one_sentence(values, message):
    with pytest.raises(config.ConfigError) as error:
        config.resolve(dict({"backend": "simulated", "simulated_spec": "x"}, **values), {})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_alert_settings_from_the_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\ngpuops:\n  alertWebhookTokenOverHttp: true\n  alertWebhookTimeoutSeconds: 2\n"
        "  alertResendSeconds: 60\n  alertResendMaxSeconds: 900\n"
    )
    settings = config.resolve({}, {}, config.load_file(str(path)))
    assert (
        settings.alert_webhook_token_over_http,
        settings.alert_webhook_timeout_seconds,
        settings.alert_resend_seconds,
        settings.alert_resend_max_seconds,
    ) == (True, 2.0, 60.0, 900.0)
    assert config.resolve({}, {"GPU_DEVICE_PLUGIN_ALERT_RESEND_SECONDS": "off"}).alert_resend_seconds is None
    default = config.resolve({}, {})
    assert (
        default.alert_webhook_token_over_http,
        default.alert_webhook_timeout_seconds,
        default.alert_resend_seconds,
        default.alert_resend_max_seconds,
    ) == (False, 5.0, 300.0, 3600.0)
