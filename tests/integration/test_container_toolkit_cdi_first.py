"""container_toolkit writes the CDI specification before nvidia-container-runtime's mode: where nvidia-ctk could
not generate the specification, a switch to `cdi` stops the play with the mode file unchanged.

The role's apply tasks run with ansible-playbook on this machine (connection local); what the role's read
(read.yml) found is given as its registered result: a toolkit already installed, a mode that differs, and an
`nvidia-ctk cdi generate` that exited 1, as it does on a node whose driver does not answer. The files are written
under a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
GENERATE_ERROR = 'level=error msg="failed to generate CDI spec: failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"'


def test_a_switch_to_cdi_stops_before_the_mode_where_the_specification_cannot_be_generated(tmp_path: Path) -> None:
    collections = tmp_path / "collections"
    (collections / "ansible_collections" / "gpuops").mkdir(parents=True)
    (collections / "ansible_collections" / "gpuops" / "k8s").symlink_to(REPO)
    config = tmp_path / "config.toml"
    config.write_text('[nvidia-container-runtime]\nmode = "auto"\n')
    spec = tmp_path / "cdi" / "nvidia.yaml"
    node = {
        "paths": {"/usr/bin/absent-nvidia-ctk": {"type": "absent"}, str(spec.parent): {"type": "absent"}},
        "contents": {},
        "commands": {"cdi": {"rc": 1, "stdout": "", "stderr": GENERATE_ERROR}},
    }
    todo = dict.fromkeys(
        ["keyring_dir", "key", "sources", "unattended_upgrades", "hold", "unhold", "install", "cdi_refresh"], False
    )
    extra = {
        "__container_toolkit_todo": dict(todo, mode=True, cdi=True),
        "__container_toolkit_node": node,
        "__container_toolkit_config_file": str(config),
        "__container_toolkit_config_wanted": '[nvidia-container-runtime]\nmode = "cdi"\n',
        "__container_toolkit_nvidia_ctk": "/usr/bin/absent-nvidia-ctk",
        "container_toolkit_cdi_output": str(spec),
        "container_toolkit_runtime_mode": "cdi",
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [
                {"ansible.builtin.include_role": {"name": "gpuops.k8s.container_toolkit", "tasks_from": "apply"}}
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-e",
            f"@{tmp_path / 'extra.json'}",
            str(tmp_path / "play.yml"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "nvidia-ctk cdi generate failed on localhost (exit 1)" in run.stdout, run.stdout
    assert config.read_text() == '[nvidia-container-runtime]\nmode = "auto"\n'
    assert not spec.exists()
