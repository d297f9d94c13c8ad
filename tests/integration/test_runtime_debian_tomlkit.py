"""The module under the target's own Python: Debian 12's /usr/bin/python3 with python3-tomlkit (0.11.x).

Only ansible's module_utils come from the controller's environment (Ansible ships them to the
target with the module); tomlkit is the distro's, so this checks the minimum version we support.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import ansible
import pytest
from conftest import CONFIGS, ModuleRunner, config_dump

SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def ansible_only_path(tmp_path):
    path = tmp_path / "ansible-only"
    path.mkdir()
    (path / "ansible").symlink_to(Path(ansible.__file__).parent)
    return str(path)


def test_module_runs_with_debian_tomlkit(tmp_path, collection_root, ansible_only_path, containerd16):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(collection_root), ansible_only_path]))
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import tomlkit; print(tomlkit.__version__, tomlkit.__file__)"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.split()
    assert probe[0].startswith("0.11."), "expected Debian 12's python3-tomlkit 0.11.x, got {0}".format(probe)
    assert probe[1].startswith("/usr/lib/python3/dist-packages/"), probe

    run = ModuleRunner(collection_root, tmp_path, python=SYSTEM_PYTHON, extra_path=[ansible_only_path])
    path = tmp_path / "config.toml"
    path.write_text((CONFIGS / "v2-mirrors-comments.toml").read_text())
    before = config_dump(containerd16, path)
    assert run(runtime="containerd", config_path=str(path))["changed"] is True
    assert run(runtime="containerd", config_path=str(path))["changed"] is False
    after = config_dump(containerd16, path)
    section = after["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert "# pulls from Docker Hub go through the site cache first" in path.read_text()
    assert run(runtime="containerd", config_path=str(path), state="absent")["changed"] is True
    assert config_dump(containerd16, path) == before

    crio = tmp_path / "99-nvidia.toml"
    assert run(runtime="crio", config_path=str(crio))["changed"] is True
    assert run(runtime="crio", config_path=str(crio))["changed"] is False
