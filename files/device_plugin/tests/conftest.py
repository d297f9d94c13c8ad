"""Shared fixtures for the daemon tier: every test talks real unix-socket gRPC."""

from __future__ import annotations

import os
import sys

# Tests start daemon subprocesses (fork, then exec) while gRPC servers and channels of the test process
# are busy in other threads; gRPC's fork handlers then give up and the child can abort before it execs.
# The child never uses the parent's gRPC state, so the handlers are switched off (set before grpc loads).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.dirname(HERE)  # regenerate_stubs.py, lower_bounds.py, pyproject.toml
SRC = os.path.join(PLUGIN, "src")
INSTALLED = os.environ.get("GPU_DEVICE_PLUGIN_TEST_INSTALLED") == "1"
if INSTALLED:
    # `make daemon-py39`: test the package as pip installed it, not the source tree.
    import gpu_device_plugin

    SRC = os.path.dirname(os.path.dirname(os.path.abspath(gpu_device_plugin.__file__)))
    assert not SRC.startswith(PLUGIN + os.sep), f"gpu_device_plugin is imported from the source tree ({SRC})"
elif SRC not in sys.path:
    sys.path.insert(0, SRC)
for path in (HERE, PLUGIN):
    if path not in sys.path:
        sys.path.insert(0, path)

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


@pytest.fixture
def dra(tmp_path):
    """A DRA node: plugin-watcher double, API-side doubles, CDI and kubelet directories (dra_harness.py)."""
    from dra_harness import DraNodeFixture

    node = DraNodeFixture(tmp_path)
    yield node
    node.close()


@pytest.fixture
def mock_nvml(tmp_path):
    """The real pynvml on the mock libnvidia-ml.so.1, whose state follows a copy of h100x8 (mock_nvml.py)."""
    from harness import fixture, write_spec
    from mock_nvml import MockNvml

    spec = str(tmp_path / "nvml-gpus.yaml")
    write_spec(spec, fixture("h100x8.yaml"))
    library = MockNvml(spec, str(tmp_path / "nvml.state"))
    yield library
    library.close()
