"""The device_plugin role refuses a bad dcgm metrics setting with one sentence before it touches the node (its first
checks, ahead of any read of the node), as the daemon would refuse it at start."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def run_role(tmp_path: Path, **settings: object) -> subprocess.CompletedProcess[str]:
    collections = tmp_path / "collections" / "ansible_collections" / "gpuops"
    collections.mkdir(parents=True)
    (collections / "k8s").symlink_to(REPO)
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "roles": [{"role": "gpuops.k8s.device_plugin"}]}])
    )
    return subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook), "-e", json.dumps(settings)],
        capture_output=True,
        text=True,
        env=dict(
            os.environ,
            ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "collections"),
            ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
            ANSIBLE_LOCALHOST_WARNING="false",
        ),
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    "settings",
    [
        {"device_plugin_dcgm_metrics_address": "9400"},
        {"device_plugin_dcgm_metrics_address": ":70000"},
        {"device_plugin_dcgm_metrics_address": "a:b:9400"},
        {"device_plugin_dcgm_interval": 0},
    ],
)
def test_a_bad_dcgm_setting_stops_the_role_with_one_sentence_before_it_reads_the_node(tmp_path, settings):
    run = run_role(tmp_path, **settings)
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    tasks = [task for play in json.loads(run.stdout)["plays"] for task in play["tasks"]]
    names = [task["task"]["name"].rsplit(" : ", 1)[-1] for task in tasks]
    assert names[-1] == "Check the dcgm metrics settings", names
    assert "Read the node" not in " ".join(names)
    message = tasks[-1]["hosts"]["localhost"]["msg"]
    address = settings.get("device_plugin_dcgm_metrics_address", ":9400")
    interval = settings.get("device_plugin_dcgm_interval", 30)
    assert message == (
        'device_plugin_dcgm_metrics_address must be HOST:PORT or :PORT (port 0-65535), or "" for off, and'
        " device_plugin_dcgm_interval a number of seconds of 1 or more, not"
        f" {json.dumps(address)} and {json.dumps(interval)}."
    )
