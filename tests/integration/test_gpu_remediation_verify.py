"""The gpu_remediation role's verify step (tasks/verify.yml) run by the real `ansible-playbook` on localhost: after a
GPU reset it moves the kernel log's place without forgetting an XID the reset did not cover.

The kernel log is a real journal in a directory of its own: systemd-journal-remote writes it from export format
(entries of the kernel transport, as journald keeps them) and the module reads it with the real `journalctl -D`,
through module_defaults. The daemon's health file is a real file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from adhoc import ansible_environment, run_module

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
RESET = "GPU-6f1c0a3e-0000-4000-8000-000000000001"
OTHER = "GPU-6f1c0a3e-0000-4000-8000-000000000004"


def write_journal(directory, messages):
    assert os.access(JOURNAL_REMOTE, os.X_OK), f"{JOURNAL_REMOTE} is missing: run make setup"
    directory.mkdir()
    boot, text = uuid.uuid4().hex, ""
    for n, message in enumerate(messages, 1):
        text += (
            f"__REALTIME_TIMESTAMP={1764144000000000 + n * 1000000}\n__MONOTONIC_TIMESTAMP={n * 1000000}\n"
            f"_BOOT_ID={boot}\n_MACHINE_ID={'5f0c6e1a2b3c4d5e8f90a1b2c3d4e5f6'}\n_TRANSPORT=kernel\n"
            f"MESSAGE={message}\n\n"
        )
    subprocess.run(
        [JOURNAL_REMOTE, "-o", str(directory / "remote.journal"), "-"],
        input=text.encode(),
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def ansible_env(tmp_path_factory):
    return ansible_environment(str(tmp_path_factory.mktemp("ansible-tmp")))


def test_a_reboot_xid_on_another_gpu_during_a_reset_is_kept_for_the_next_run(ansible_env, tmp_path):
    health = tmp_path / "gpu-health.json"
    gpus = [
        {"uuid": RESET, "index": 0, "pci": "0000:18:00.0", "healthy": True, "class": "none", "xids": []},
        {"uuid": OTHER, "index": 3, "pci": "0000:3b:00.0", "healthy": True, "class": "none", "xids": []},
    ]
    health.write_text(json.dumps({"version": 1, "node": "gpu-1", "updated": "2026-11-26T08:00:00Z", "gpus": gpus}))
    journal = tmp_path / "journal"
    # GPU 0's XID 48, which the plan acted on, then GPU 3's XID 79 while GPU 0 was reset.
    write_journal(
        journal,
        [
            "NVRM: Xid (PCI:0000:18:00): 48, pid=<unknown>, name=<unknown>, An uncorrectable double bit error",
            "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        ],
    )
    command = ["journalctl", "-D", str(journal), "_TRANSPORT=kernel", "-o", "json", "--no-pager"]
    playbook = tmp_path / "verify.yml"
    playbook.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "module_defaults": {"gpuops.k8s.gpu_faults": {"kernel_log_command": command}},
                    "vars": {
                        "gpu_remediation_health_file": str(health),
                        "gpu_remediation_state_dir": str(tmp_path / "state"),
                        "gpu_remediation_verify_timeout": 3,
                        "__gpu_remediation_class": "reset",
                        "__gpu_remediation_plan": {"nodes": [{"host": "localhost", "gpus": [{"uuid": RESET}]}]},
                        "__gpu_remediation_input": {"faults": {"gpus": gpus}},
                    },
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {
                                "name": "gpuops.k8s.gpu_remediation",
                                "tasks_from": "verify",
                            }
                        }
                    ],
                }
            ]
        )
    )
    ansible_playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    env = dict(ansible_env, ANSIBLE_STDOUT_CALLBACK="default")
    done = subprocess.run(
        [
            ansible_playbook,
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(playbook),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # The next run's read: GPU 0's XID 48 was handled by the reset, GPU 3's XID 79 is still there.
    rc, result, _stats = run_module(
        ansible_env,
        "gpuops.k8s.gpu_faults",
        {"health_file": str(health), "state_dir": str(tmp_path / "state"), "kernel_log_command": command},
    )
    assert rc == 0, result
    assert [(g["uuid"], g["class"], [x["xid"] for x in g["xids"]]) for g in result["gpus"]] == [
        (RESET, "none", []),
        (OTHER, "reboot", [79]),
    ]
    assert result["node_class"] == "reboot" and result["kernel_log"]["kept"] == 1
