"""The nvidia_runtime role's absent on a node whose containerd had no config file, judged by real containerd 1.6.

The role runs with ansible-playbook on this machine (connection local, Debian 12's own Python as the node's) against a
containerd config path and a state directory in a temporary directory, with the restart and the verify off (they act
on this machine's containerd service): present writes `containerd config default` and the nvidia runtime into it;
absent takes the runtime out again and, the file then holding only what it was written with, takes the file off, as
it was before; absent once more, on a node with no config at all, changes nothing. A file someone changed in between
stays, with one sentence.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from conftest import config_dump, recap_changed

NODE_PYTHON = "/usr/bin/python3"
RUNTIME = "/usr/bin/nvidia-container-runtime"


def run_role(collection_root: Path, work: Path, state: str, *flags: str) -> subprocess.CompletedProcess[str]:
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": True,
            "gather_subset": ["min"],
            "vars": {
                "nvidia_runtime_engines": ["containerd"],
                "nvidia_runtime_config_paths": {"containerd": str(work / "etc" / "config.toml")},
                "nvidia_runtime_state_dir": str(work / "state"),
                "nvidia_runtime_restart": False,
                "nvidia_runtime_verify": False,
                "nvidia_runtime_backup": False,
                "nvidia_runtime_state": state,
            },
            "tasks": [
                {"ansible.builtin.include_role": {"name": "gpuops.k8s.nvidia_runtime"}},
                {
                    "name": "Say what the role left",
                    "ansible.builtin.debug": {"msg": "left: {{ nvidia_runtime_not_removed | default([]) | to_json }}"},
                },
            ],
        }
    ]
    playbook = work / f"play-{state}.yml"
    playbook.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collection_root), ANSIBLE_NOCOLOR="1")
    done = subprocess.run(
        [
            "ansible-playbook",
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={NODE_PYTHON}",
            *flags,
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def converged(collection_root: Path, work: Path, containerd16: str) -> Path:
    """A node whose containerd had no config, after present: the config containerd loads, with the runtime."""
    config = work / "etc" / "config.toml"
    config.parent.mkdir()
    run_role(collection_root, work, "present")
    assert RUNTIME in str(config_dump(containerd16, config))
    return config


def test_absent_takes_off_the_config_present_wrote_and_a_second_run_changes_nothing(
    collection_root: Path, tmp_path: Path, containerd16: str
) -> None:
    config = converged(collection_root, tmp_path, containerd16)

    check = run_role(collection_root, tmp_path, "absent", "--check")
    assert recap_changed(check.stdout) > 0
    assert config.exists() and sorted(os.listdir(tmp_path / "state")) == [
        "containerd-config-written.json",
        "nvidia-runtime.json",
    ]

    removed = run_role(collection_root, tmp_path, "absent")
    assert recap_changed(removed.stdout) > 0
    assert not config.exists()
    assert os.listdir(tmp_path / "state") == []
    assert "left: []" in removed.stdout

    again = run_role(collection_root, tmp_path, "absent")
    assert recap_changed(again.stdout) == 0
    assert not config.exists()


def test_a_config_someone_changed_since_stays_and_is_named(
    collection_root: Path, tmp_path: Path, containerd16: str
) -> None:
    config = converged(collection_root, tmp_path, containerd16)
    with open(config, "a", encoding="utf-8") as handle:
        handle.write("\n# site: kept for the GPU pool\n")
    removed = run_role(collection_root, tmp_path, "absent")
    assert config.exists() and "# site: kept for the GPU pool" in config.read_text()
    assert RUNTIME not in str(config_dump(containerd16, config))
    assert f"{config} was written by the role from containerd's default config and changed since: it stays" in (
        removed.stdout
    )
    assert os.listdir(tmp_path / "state") == []
