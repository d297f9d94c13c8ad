"""A real containerd 1.6 daemon started on an edited config, on private paths, then queried.

The CRI plugin refuses to start when default_runtime_name names a runtime that is not configured,
so "cri ... ok" in `ctr plugins ls` means containerd accepted the nvidia runtime as the default.
The second test is the control: the same check fails for a config that is wrong in exactly that way.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
from conftest import containerd_default


class Containerd:
    def __init__(self, binary, config):
        # Unix socket paths are short-lived and must stay under 108 bytes: a short private directory.
        self.dir = tempfile.mkdtemp(prefix="gpuops-rt-")
        self.address = os.path.join(self.dir, "c.sock")
        self.log = open(os.path.join(self.dir, "containerd.log"), "w+")
        self.proc = subprocess.Popen(
            [
                binary, "--config", str(config), "--root", os.path.join(self.dir, "root"),
                "--state", os.path.join(self.dir, "state"), "--address", self.address,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def ctr(self, *args):
        return subprocess.run(
            ["ctr", "--address", self.address, *args], capture_output=True, text=True, timeout=30, check=False
        )

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if os.path.exists(self.address) and self.ctr("version").returncode == 0:
                return
            time.sleep(0.2)
        self.log.seek(0)
        raise AssertionError("containerd did not come up:\n" + self.log.read()[-4000:])

    def cri_status(self):
        out = self.ctr("plugins", "ls").stdout
        for line in out.splitlines():
            fields = line.split()
            if len(fields) >= 4 and fields[0] == "io.containerd.grpc.v1" and fields[1] == "cri":
                return fields[-1]
        raise AssertionError("no CRI plugin in:\n" + out)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def daemon_config(tmp_path, containerd16):
    text = containerd_default(containerd16)
    # Keep the daemon's optional-plugin directory private too.
    text = text.replace('path = "/opt/containerd"', 'path = "{0}"'.format(tmp_path / "opt"))
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def start(binary, config):
    daemon = Containerd(binary, config)
    try:
        daemon.wait_ready()
    except BaseException:
        daemon.stop()
        raise
    return daemon


def test_containerd_runs_with_the_edited_config(daemon_config, run_module, containerd16):
    result = run_module(runtime="containerd", config_path=str(daemon_config), runtime_path="/usr/bin/runc")
    assert result["default_runtime"] == "nvidia"
    daemon = start(containerd16, daemon_config)
    try:
        version = daemon.ctr("version")
        assert version.returncode == 0
        assert "Server:" in version.stdout
        assert daemon.cri_status() == "ok"
    finally:
        daemon.stop()


def test_control_cri_refuses_a_default_without_its_runtime(daemon_config, containerd16):
    text = daemon_config.read_text().replace('default_runtime_name = "runc"', 'default_runtime_name = "nvidia"')
    daemon_config.write_text(text)
    daemon = start(containerd16, daemon_config)
    try:
        assert daemon.cri_status() == "error"
    finally:
        daemon.stop()
