"""Kubelet restarts, a late kubelet.sock, and the real daemon process under SIGTERM and SIGHUP."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import urllib.error
import urllib.request

import pytest
from harness import H100, DaemonThread, KubeletDouble, make_config, start_subprocess, wait_until

GPU = "nvidia.com/gpu"
SOCKET = "gpuops-nvidia.com-gpu.sock"


def test_fifty_kubelet_restarts_in_a_row_each_re_registered(node):
    daemon = DaemonThread(make_config(node.kubelet_socket, node.spec)).start()
    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        checkpoint = os.path.join(node.dir, "kubelet_internal_checkpoint")
        with open(checkpoint, "w") as handle:
            handle.write("{}")
        for n in range(2, 52):
            node.kubelet.restart()
            assert node.kubelet.wait(lambda n=n: node.kubelet.registered(GPU) == n), f"restart {n - 1}"
            assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
            assert [d["id"] for d in node.kubelet.devices(GPU)] == H100
        assert os.path.exists(checkpoint)
    finally:
        daemon.stop()


def test_registers_when_kubelet_sock_appears_after_the_daemon_started(tmp_path):
    from harness import fixture, write_spec

    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    spec = str(tmp_path / "gpus.yaml")
    write_spec(spec, fixture("t4x1.yaml"))
    kubelet = KubeletDouble(str(plugin_dir / "kubelet.sock"))
    daemon = DaemonThread(make_config(kubelet.socket_path, spec)).start()
    try:
        # Started: serving, and waiting for a kubelet to register with.
        assert os.path.exists(plugin_dir / SOCKET)
        assert daemon.daemon.readyz()[1]["not_ready"] == [f"not registered with the kubelet: {GPU}"]
        kubelet.start()
        assert kubelet.wait(lambda: kubelet.registered(GPU) == 1)
        assert kubelet.wait(lambda: kubelet.devices(GPU) is not None)
        assert [d["id"] for d in kubelet.devices(GPU)] == ["GPU-7e570000-0000-4000-8000-0000000000f4"]
        # Files the kubelet owns come and go without a new registration. The daemon hears of the
        # directory's files in order: once it has heard of a file created after them, it has seen them.
        heard = _hear_directory_events(daemon)
        for name in ("DEPRECATION", "kubelet_internal_checkpoint", "later"):
            (plugin_dir / name).write_text("")
            (plugin_dir / name).unlink()
        assert wait_until(lambda: ("later", False) in heard)
        assert heard == [("later", True), ("later", False)]
        assert wait_until(lambda: daemon.daemon.readyz()[1]["not_ready"] == [])  # no Register under way
        assert kubelet.registered(GPU) == 1
    finally:
        daemon.stop()
        kubelet.stop()


def _hear_directory_events(daemon: DaemonThread) -> list[tuple[str, bool]]:
    """Record (file name, created) for each event of the kubelet's directory that reaches the daemon."""
    heard: list[tuple[str, bool]] = []
    watcher = daemon.daemon.node._watcher
    forward = watcher.on_change

    def hear(name: str, created: bool) -> None:
        forward(name, created)  # first: once a test sees the event, the daemon has acted on it
        heard.append((name, created))

    watcher.on_change = hear
    return heard


class _Output:
    """The daemon subprocess's output, read as it comes by a thread, so a test can wait for a line."""

    def __init__(self, proc) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 10.0) -> bool:
        return wait_until(lambda: any(text in line for line in list(self.lines)), timeout=timeout)

    def text(self) -> str:
        """All of it, once the process has ended."""
        self._thread.join(10)
        return "".join(self.lines)


def test_sigterm_stops_cleanly_and_removes_the_socket(node):
    proc = start_subprocess(
        [
            "--backend",
            "simulated",
            "--simulated-spec",
            node.spec,
            "--kubelet-socket",
            node.kubelet_socket,
            "--metrics-address",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ]
    )
    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        endpoint = node.kubelet.endpoints[GPU]
        proc.send_signal(signal.SIGTERM)
        out, _err = proc.communicate(timeout=10)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not os.path.exists(os.path.join(node.dir, SOCKET))
    assert node.kubelet.wait(lambda: endpoint.stream_ended == "OK")
    records = [json.loads(line) for line in out.splitlines()]
    assert any(r["msg"] == "registered with the kubelet" and r["resource"] == GPU for r in records)
    assert records[-1]["msg"] == "stopped"


def test_sighup_reloads_the_config_file_and_registers_again(node, tmp_path):
    config_file = tmp_path / "config.yaml"
    config_file.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: uuid\n")
    proc = start_subprocess(
        [
            "--backend",
            "simulated",
            "--simulated-spec",
            node.spec,
            "--kubelet-socket",
            node.kubelet_socket,
            "--config-file",
            str(config_file),
            "--metrics-address",
            "",
        ]
    )
    output = _Output(proc)
    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        assert node.kubelet.devices(GPU)[0]["id"] == H100[0]
        config_file.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
        proc.send_signal(signal.SIGHUP)
        assert node.kubelet.wait(lambda: node.kubelet.registered(GPU) == 2)
        assert node.kubelet.wait(
            lambda: [d["id"] for d in node.kubelet.devices(GPU) or []] == [str(i) for i in range(8)], timeout=5
        )
        # A broken file on SIGHUP is refused; the daemon keeps serving what it had.
        config_file.write_text("version: v2\n")
        proc.send_signal(signal.SIGHUP)
        assert output.wait_for("configuration rejected"), output.lines
        assert [d["id"] for d in node.kubelet.devices(GPU)] == [str(i) for i in range(8)]
        # Signals are handled in order: the good file that follows is taken, with one more registration, so
        # the refused one neither stopped the daemon nor registered it again.
        config_file.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: uuid\n")
        proc.send_signal(signal.SIGHUP)
        assert node.kubelet.wait(lambda: [d["id"] for d in node.kubelet.devices(GPU) or []] == H100)
        assert node.kubelet.registered(GPU) == 3
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = output.text()
    assert proc.returncode == 0, out
    assert "configuration rejected" in out and "version must be v1" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "simulated"], "needs a spec file"),
        (["--device-list-strategy", "envvar,bogus"], "bogus"),
    ],
)
def test_bad_settings_fail_with_one_sentence(node, args, message):
    proc = start_subprocess(["--kubelet-socket", node.kubelet_socket, *args])
    out, _err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert message in out
    assert "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_metrics_and_healthz_over_http(node):
    daemon = DaemonThread(make_config(node.kubelet_socket, node.spec, metrics_address="127.0.0.1:0")).start()
    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        base = f"http://{daemon.daemon._http.address}"
        from gpu_device_plugin.api import api_pb2

        node.kubelet.stub(GPU).Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[H100[0]])])
        )
        assert wait_until(lambda: daemon.daemon.healthz()[1]["resources"][GPU]["registered"])
        with urllib.request.urlopen(base + "/healthz", timeout=5) as reply:
            health = json.loads(reply.read())
        assert reply.status == 200 and health["serving"] and health["resources"][GPU]["devices"] == 8
        with urllib.request.urlopen(base + "/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert 'gpu_device_plugin_devices{health="Healthy",resource="nvidia.com/gpu"} 8.0' in text
        assert 'gpu_device_plugin_allocations_total{resource="nvidia.com/gpu"} 1.0' in text
        assert 'gpu_device_plugin_registrations_total{resource="nvidia.com/gpu",result="ok"} 1.0' in text
    finally:
        daemon.stop()


def test_the_kubelet_double_standalone_writes_its_report(tmp_path):
    """The mode molecule scenarios use: the double as a process, the daemon registering with it."""
    import subprocess
    import sys
    import tempfile

    from harness import fixture, write_spec

    plugin_dir = tempfile.mkdtemp(prefix="gdp-")
    kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
    report = tmp_path / "report.json"
    double = subprocess.Popen(
        [
            sys.executable,
            os.path.join(os.path.dirname(__file__), "kubelet_double.py"),
            "--socket",
            kubelet_socket,
            "--report",
            str(report),
        ]
    )
    spec = str(tmp_path / "gpus.yaml")
    write_spec(spec, fixture("t4x1.yaml"))
    daemon = None
    try:
        assert wait_until(lambda: os.path.exists(kubelet_socket), timeout=20)
        daemon = DaemonThread(make_config(kubelet_socket, spec)).start()

        def devices():
            try:
                data = json.loads(report.read_text())
            except (OSError, ValueError):
                return None
            return data["resources"].get(GPU, {}).get("devices"), data

        # A Register that ran past its deadline on a busy machine is retried (registration.py's backoff).
        assert wait_until(lambda: (devices() or (None,))[0], timeout=30)
        found, data = devices()
        assert found == [{"id": "GPU-7e570000-0000-4000-8000-0000000000f4", "health": "Healthy", "numa": []}]
        assert data["registrations"] == [
            {
                "version": "v1beta1",
                "endpoint": SOCKET,
                "resource_name": GPU,
                "pre_start_required": False,
                "get_preferred_allocation_available": True,
            }
        ]
    finally:
        if daemon is not None:
            daemon.stop()
        double.send_signal(signal.SIGTERM)
        code = double.wait(10)
        left = os.path.exists(kubelet_socket)
        shutil.rmtree(plugin_dir, ignore_errors=True)
    assert code == 0
    assert not left


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_readyz_answers_200_only_once_registered_with_the_kubelet_while_healthz_is_liveness(node):
    node.kubelet.stop()  # no kubelet yet: the plugin serves, but cannot register
    daemon = DaemonThread(make_config(node.kubelet_socket, node.spec, metrics_address="127.0.0.1:0")).start()
    try:
        base = f"http://{daemon.daemon._http.address}"
        assert _get(base + "/healthz")[0] == 200
        code, detail = _get(base + "/readyz")
        assert code == 503 and detail["ready"] is False
        assert any("not registered with the kubelet" in reason for reason in detail["not_ready"]), detail
        node.kubelet.start()
        assert node.kubelet.wait(lambda: node.kubelet.registered(GPU) == 1)
        assert wait_until(lambda: _get(base + "/readyz")[0] == 200)
        assert _get(base + "/readyz")[1]["not_ready"] == []
        # A kubelet restart: not ready until the plugin has registered again.
        node.kubelet.restart()
        assert node.kubelet.wait(lambda: node.kubelet.registered(GPU) == 1)
        assert wait_until(lambda: _get(base + "/readyz")[0] == 200)
    finally:
        daemon.stop()


def test_the_kubelet_double_does_not_register_a_plugin_that_stopped_waiting(tmp_path):
    """As the kubelet (devicemanager: Register dials the plugin and asks its options within the Register call's own
    context): a plugin whose options come after its Register deadline is not registered, so its retry is the only
    registration."""
    import tempfile
    import time
    from concurrent import futures

    import grpc
    from gpu_device_plugin.api import api_pb2, api_pb2_grpc

    class SlowPlugin(api_pb2_grpc.DevicePluginServicer):
        def GetDevicePluginOptions(self, request, context):
            time.sleep(1.0)
            return api_pb2.DevicePluginOptions()

    plugin_dir = tempfile.mkdtemp(prefix="gdp-")
    kubelet = KubeletDouble(os.path.join(plugin_dir, "kubelet.sock"))
    kubelet.start()
    plugin = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_DevicePluginServicer_to_server(SlowPlugin(), plugin)
    plugin.add_insecure_port("unix:" + os.path.join(plugin_dir, "slow.sock"))
    plugin.start()
    try:
        request = api_pb2.RegisterRequest(version="v1beta1", endpoint="slow.sock", resource_name="example.com/slow")
        with grpc.insecure_channel("unix:" + kubelet.socket_path) as channel, pytest.raises(grpc.RpcError) as raised:
            api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=0.3)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert wait_until(lambda: kubelet.register_errors)
        assert kubelet.registrations == [] and "example.com/slow" not in kubelet.endpoints
    finally:
        plugin.stop(grace=None)
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
