"""Shared fixtures for the daemon tier: every test talks real unix-socket gRPC."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", "src"))
if SRC not in sys.path:
    sys.path.insert(0, SRC)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import pytest  # noqa: E402


@pytest.fixture
def node(tmp_path):
    """A device-plugin directory with a kubelet double serving kubelet.sock, and a copy of h100x8."""
    import pathlib
    import shutil
    import tempfile

    from harness import KubeletDouble, fixture, write_spec

    # unix socket paths are limited to 107 bytes: keep the directory short, as the kubelet's is.
    plugin_dir = pathlib.Path(tempfile.mkdtemp(prefix="gdp-"))
    kubelet = KubeletDouble(str(plugin_dir / "kubelet.sock"))
    kubelet.start()
    spec = str(tmp_path / "gpus.yaml")
    write_spec(spec, fixture("h100x8.yaml"))

    class Node:
        pass

    n = Node()
    n.dir, n.kubelet, n.spec, n.kubelet_socket, n.tmp = (
        str(plugin_dir),
        kubelet,
        spec,
        str(plugin_dir / "kubelet.sock"),
        tmp_path,
    )
    yield n
    kubelet.stop()
    shutil.rmtree(plugin_dir, ignore_errors=True)
