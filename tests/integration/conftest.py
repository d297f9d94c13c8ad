"""Fixtures for the real-peer tests of gpuops.k8s.nvidia_runtime.

The module runs the way Ansible runs it on a target: a separate Python process that gets its
arguments as a JSON file and prints its result as JSON. The collection is made importable through
a symlink tree (``ansible_collections/gpuops/k8s`` -> this checkout), so the tests exercise the
working tree itself. containerd 1.6 comes from Debian (scripts/bootstrap.sh); containerd 1.7
(the first with the CDI keys) and 2.x (which reads config version 3) are built by
scripts/build-containerd17.sh and scripts/build-containerd2.sh, both through
scripts/build-containerd.sh, and cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from local_api import ApiServerSettings, ScratchControlPlane

REPO = Path(__file__).resolve().parents[2]
CONFIGS = Path(__file__).resolve().parent / "configs"
# What waits for a build: these fixtures, and a module that runs a build script itself.
BUILD_FIXTURES = frozenset({"containerd2", "containerd17", "kubernetes_bin", "control_plane", "k3s_render"})
BUILD_SCRIPT = re.compile(r"build-[a-z0-9-]+\.sh|built_containerd\(")


def pytest_collection_modifyitems(config, items):
    """The modules that wait for a build (Kubernetes, containerd, NVIDIA's binaries: scripts/build-early.sh builds them
    from make test's first minute) go last, each whole, in their order; the others first, so that on a cold machine
    the tier's workers test what needs no build while the builds finish. The order is the same in every worker."""
    texts: dict[Path, bool] = {}

    def runs_a_build(item) -> bool:
        path = Path(str(item.fspath))
        if path not in texts:
            texts[path] = bool(BUILD_SCRIPT.search(path.read_text(encoding="utf-8")))
        return texts[path] or bool(BUILD_FIXTURES & set(getattr(item, "fixturenames", ())))

    late = {Path(str(item.fspath)) for item in items if runs_a_build(item)}
    items.sort(key=lambda item: Path(str(item.fspath)) in late)


def recap_changed(output: str) -> int:
    """The changed count of the last PLAY RECAP in ansible-playbook's output (one host)."""
    recap = output.rsplit("PLAY RECAP", 1)[1]
    return int(recap.split("changed=", 1)[1].split()[0])


@pytest.fixture(scope="session")
def collection_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("collections")
    (root / "ansible_collections" / "gpuops").mkdir(parents=True)
    (root / "ansible_collections" / "gpuops" / "k8s").symlink_to(REPO)
    return root


class ModuleRunner:
    """Runs plugins/modules/nvidia_runtime.py in its own interpreter, as Ansible does."""

    def __init__(self, collection_root, tmp_path, python=sys.executable, extra_path=()):
        self.collection_root = collection_root
        self.tmp_path = tmp_path
        self.python = python
        self.extra_path = list(extra_path)
        self.calls = 0

    def __call__(self, check=False, diff=False, expect_failure=False, **args):
        self.calls += 1
        module_args = dict(args)
        module_args["_ansible_check_mode"] = check
        module_args["_ansible_diff"] = diff
        args_file = self.tmp_path / f"args-{self.calls}.json"
        args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": module_args}))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.collection_root), *self.extra_path])
        proc = subprocess.run(
            [self.python, str(REPO / "plugins" / "modules" / "nvidia_runtime.py"), str(args_file)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        try:
            result = json.loads(proc.stdout)
        except ValueError as err:
            raise AssertionError(f"module printed no JSON: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}") from err
        assert bool(result.get("failed")) is expect_failure, result
        return result


@pytest.fixture
def run_module(collection_root, tmp_path):
    return ModuleRunner(collection_root, tmp_path)


@pytest.fixture(scope="session")
def containerd16():
    binary = shutil.which("containerd")
    assert binary, "containerd is not installed; run `make setup` (scripts/bootstrap.sh installs Debian's containerd)"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    assert " 1.6." in version, version
    return binary


def built_containerd(script, expect):
    # Builds on the first call (minutes), then comes from $GPUOPS_CACHE.
    proc = subprocess.run([str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=3600, check=False)
    assert proc.returncode == 0, proc.stderr
    binary = proc.stdout.strip().splitlines()[-1]
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    assert expect in version, version
    return binary


@pytest.fixture(scope="session")
def containerd2():
    return built_containerd("build-containerd2.sh", " 2.")


@pytest.fixture(scope="session")
def containerd17():
    """containerd 1.7: config version 2 with the CRI plugin's ``enable_cdi`` and ``cdi_spec_dirs``."""
    return built_containerd("build-containerd17.sh", " 1.7.")


def config_dump(binary, path):
    """containerd's effective config for ``path``, parsed."""
    import tomllib

    proc = subprocess.run(
        [binary, "--config", str(path), "config", "dump"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"containerd rejected {path}: {proc.stderr}"
    data = tomllib.loads(proc.stdout)
    if isinstance(data.get("imports"), list):
        data["imports"] = sorted(data["imports"])  # containerd lists the loaded files in no fixed order
    return data


def containerd_default(binary):
    return subprocess.run([binary, "config", "default"], capture_output=True, text=True, check=True, timeout=60).stdout


def go_tool(name: str, files: tuple[str, ...]) -> str:
    """tests/integration/NAME built with Go, cached in $GPUOPS_CACHE by the content of its source ``files``."""
    source = Path(__file__).resolve().parent / name
    digest = hashlib.sha256(b"".join((source / f).read_bytes() for f in files)).hexdigest()[:12]
    cache = Path(os.environ.get("GPUOPS_CACHE", Path.home() / ".cache" / "gpuops"))
    binary = cache / f"{name.replace('_', '-')}-{digest}" / name.replace("_", "-")
    if not binary.exists():
        go = shutil.which("go") or "/usr/local/go/bin/go"
        binary.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [go, "build", "-trimpath", "-o", str(binary), "."],
            cwd=source,
            check=True,
            timeout=600,
            env=dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod"),
        )
    return str(binary)


@pytest.fixture(scope="session")
def k3s_render():
    """tests/integration/k3s_render built with Go (the standard library only), cached by its source."""
    return go_tool("k3s_render", ("main.go", "go.mod"))


def config_dump_with_warnings(binary, path):
    """containerd's effective config for ``path`` and what it said on stderr (unknown keys, say)."""
    import tomllib

    proc = subprocess.run(
        [binary, "--config", str(path), "config", "dump"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"containerd rejected {path}: {proc.stderr}"
    return tomllib.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="session")
def kubernetes_bin():
    """The directory of the Kubernetes binaries tests/e2e/build-kubernetes.sh builds (cached; waits for a
    build in progress)."""
    proc = subprocess.run(
        [str(REPO / "tests/e2e/build-kubernetes.sh")], capture_output=True, text=True, timeout=3600, check=False
    )
    assert proc.returncode == 0, f"tests/e2e/build-kubernetes.sh failed:\n{proc.stderr[-3000:]}"
    return Path(proc.stdout.strip())


@pytest.fixture(scope="module")
def control_plane(request, tmp_path_factory, kubernetes_bin):
    """etcd and a kube-apiserver (real, started by the lab package as the lab starts them) for one test module,
    on ports no lab instance and no other module uses.

    What differs between modules is read from the module: ``API_SERVER`` (an ApiServerSettings: authorization
    modes, admission plugins, feature gates, token users, extra flags; the lab's own by default) and
    ``CONTROLLER_MANAGER`` (whether a kube-controller-manager runs; False by default)."""
    settings = getattr(request.module, "API_SERVER", ApiServerSettings())
    plane = ScratchControlPlane(tmp_path_factory.mktemp("control-plane"), kubernetes_bin)
    try:
        plane.start(settings, controller_manager=getattr(request.module, "CONTROLLER_MANAGER", False))
        yield plane
    finally:
        plane.stop()
