"""The module under the target's own Python, with only what a node has.

Ansible ships the module and its module_utils to the node and runs them with the node's Python; only
ansible's own module_utils come from the controller here. Three nodes:
- Debian 12's /usr/bin/python3 (3.11): the standard library's tomllib, no TOML package at all;
- Python 3.9 (the oldest the modules support) without any TOML library: one sentence naming tomli;
- Python 3.9 with Debian's python3-tomlkit 0.11 on the path (RHEL 9 style): tomlkit's parser.
Each edit is judged by containerd 1.6 loading the result.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import ansible
import pytest
from conftest import CONFIGS, ModuleRunner, config_dump

SYSTEM_PYTHON = "/usr/bin/python3"


def python39():
    pyenv = shutil.which("pyenv")
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False).stdout.strip() if pyenv else ""
    root = root or os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    found = sorted(glob.glob(f"{root}/versions/3.9.*/bin/python3.9"))
    assert found, "no Python 3.9 under pyenv (the daemon-py39 tier needs it too)"
    return found[-1]


@pytest.fixture
def ansible_only_path(tmp_path):
    path = tmp_path / "ansible-only"
    path.mkdir()
    (path / "ansible").symlink_to(Path(ansible.__file__).parent)
    return str(path)


def converge(run, tmp_path, binary):
    path = tmp_path / "config.toml"
    path.write_text((CONFIGS / "v2-mirrors-comments.toml").read_text())
    before = config_dump(binary, path)
    assert run(runtime="containerd", config_path=str(path))["changed"] is True
    assert run(runtime="containerd", config_path=str(path))["changed"] is False
    section = config_dump(binary, path)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert "# pulls from Docker Hub go through the site cache first" in path.read_text()
    assert run(runtime="containerd", config_path=str(path), state="absent")["changed"] is True
    assert config_dump(binary, path) == before
    crio = tmp_path / "99-nvidia.toml"
    assert run(runtime="crio", config_path=str(crio))["changed"] is True
    assert run(runtime="crio", config_path=str(crio))["changed"] is False


def test_debian_12_python_needs_no_toml_package(tmp_path, collection_root, ansible_only_path, containerd16):
    version = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys, tomllib; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == "(3, 11)", version
    run = ModuleRunner(collection_root, tmp_path, python=SYSTEM_PYTHON, extra_path=[ansible_only_path])
    converge(run, tmp_path, containerd16)


def test_python_39_without_a_toml_library_names_what_to_install(tmp_path, collection_root, ansible_only_path):
    run = ModuleRunner(collection_root, tmp_path, python=python39(), extra_path=[ansible_only_path])
    path = tmp_path / "config.toml"
    path.write_text("version = 2\n")
    result = run(runtime="containerd", config_path=str(path), expect_failure=True)
    assert "Failed to import the required Python library (tomli" in result["msg"]
    assert path.read_text() == "version = 2\n"
    # Docker's JSON needs no TOML library.
    daemon = tmp_path / "daemon.json"
    assert run(runtime="docker", config_path=str(daemon))["changed"] is True


def test_python_39_with_the_distributions_tomlkit(tmp_path, collection_root, ansible_only_path, containerd16):
    shadow = tmp_path / "dist-tomlkit"
    shadow.mkdir()
    (shadow / "tomlkit").symlink_to("/usr/lib/python3/dist-packages/tomlkit")
    run = ModuleRunner(collection_root, tmp_path, python=python39(), extra_path=[ansible_only_path, str(shadow)])
    converge(run, tmp_path, containerd16)
