"""gpuops.k8s.gpu_faults run end to end by the real `ansible` command on localhost, as a play would run it.

The collection is mirrored by scripts/collection-tree.sh and found through ANSIBLE_COLLECTIONS_PATH. The health
file is a real file. The kernel log: the default `journalctl _TRANSPORT=kernel -o json` runs for real against
this host's journal, and the XID lines come from a real file of journal export JSON printed by `cat` through the
module's `kernel_log_command` option (tests/unit/plugins/modules/test_gpu_faults.py reads real journal files,
across boots, with journalctl).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from adhoc import ansible_environment, run_module

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UUID0 = "GPU-6f1c0a3e-0000-4000-8000-000000000001"
UUID1 = "GPU-6f1c0a3e-0000-4000-8000-000000000002"


@pytest.fixture(scope="module")
def ansible_env(tmp_path_factory):
    return ansible_environment(str(tmp_path_factory.mktemp("ansible-tmp")))


def run_adhoc(env, args, *extra):
    return run_module(env, "gpuops.k8s.gpu_faults", args, *extra)


def journal_entry(n, message):
    return json.dumps(
        {"__CURSOR": f"s=adhoc;i={n}", "__REALTIME_TIMESTAMP": str(1764144000000000 + n), "MESSAGE": message}
    )


@pytest.fixture
def node_files(tmp_path):
    health = tmp_path / "gpu-health.json"
    health.write_text(
        json.dumps(
            {
                "version": 1,
                "node": "gpu-node-1",
                "updated": "2026-11-26T08:00:00.000000Z",
                "gpus": [
                    {"uuid": UUID0, "index": 0, "pci": "0000:18:00.0", "healthy": True, "class": "none", "xids": []},
                    {
                        "uuid": UUID1,
                        "index": 1,
                        "pci": "0000:2a:00.0",
                        "healthy": False,
                        "class": "reset",
                        "reason": "XID 95 (uncontained memory (ECC) error): catalog RESET_GPU",
                        "xids": [{"xid": 95, "data": None, "time": "2026-11-26T07:59:00Z", "class": "reset"}],
                    },
                ],
            }
        )
    )
    kernel = tmp_path / "kernel.json"
    kernel.write_text(
        "\n".join(
            [
                journal_entry(1, "Linux version 6.1.0"),
                journal_entry(
                    2, "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
                ),
                journal_entry(3, "NVRM: Xid (PCI:0000:2a:00): 31, pid=4242, name=python3, Ch 00000008, MMU Fault"),
            ]
        )
        + "\n"
    )
    return {
        "health_file": str(health),
        "state_dir": str(tmp_path / "state"),
        "kernel_log_command": [shutil.which("cat"), str(kernel)],
    }


def test_the_default_kernel_log_command_runs_against_this_hosts_journal(ansible_env, tmp_path):
    rc, result, stats = run_adhoc(
        ansible_env, {"health_file": str(tmp_path / "absent.json"), "state_dir": str(tmp_path / "state")}
    )
    assert rc == 0, result
    assert result["changed"] is False and stats["changed"] == 0
    assert result["health_file"] == {
        "path": str(tmp_path / "absent.json"),
        "present": False,
        "updated": None,
        "node": None,
    }
    # No GPU here: whatever this host's kernel log holds, it names none.
    assert result["gpus"] == [] and result["node_class"] == "none" and result["since"] is None


def test_the_daemons_file_and_the_kernel_lines_check_mode_first_then_twice(ansible_env, node_files, tmp_path):
    cursor = tmp_path / "state" / "gpu-faults.cursor"
    # Moving on after a reboot of the node: every XID read was acted on.
    args = dict(node_files, advance_cursor=True, acted_class="reboot")

    rc, checked, stats = run_adhoc(ansible_env, args, "--check")
    assert rc == 0, checked
    assert checked["changed"] is True and stats["changed"] == 1
    assert not cursor.exists(), "check mode writes nothing"
    assert [(g["uuid"], g["class"], g["source"]) for g in checked["gpus"]] == [
        (UUID0, "reboot", "kernel"),
        (UUID1, "reset", "daemon"),
    ]
    assert checked["node_class"] == "reboot"

    rc, first, stats = run_adhoc(ansible_env, args)
    assert rc == 0, first
    assert first["changed"] is True and first["gpus"] == checked["gpus"]
    assert json.loads(cursor.read_text())["cursor"] == "s=adhoc;i=3" == first["cursor"]

    rc, second, stats = run_adhoc(ansible_env, args)
    assert rc == 0, second
    assert second["changed"] is False and stats["changed"] == 0
    # The kernel's lines are behind the kept place: only the daemon's view is left.
    assert [(g["uuid"], g["class"], g["source"]) for g in second["gpus"]] == [
        (UUID0, "none", "daemon"),
        (UUID1, "reset", "daemon"),
    ]
    assert second["since"] == "2025-11-26T08:00:00.000003Z"


def test_overrides_from_the_inventory_reach_the_kernel_lines(ansible_env, node_files):
    rc, result, _stats = run_adhoc(ansible_env, dict(node_files, classes={"79": "replace", "31": "device"}))
    assert rc == 0, result
    assert [g["class"] for g in result["gpus"]] == ["replace", "reset"]
    xids = {x["xid"]: x for g in result["gpus"] for x in g["xids"]}
    assert xids[31]["class"] == "device" and xids[31]["reason"] == "XID 31 is device by the inventory's override"


def test_bad_input_is_one_sentence(ansible_env, node_files):
    rc, result, stats = run_adhoc(ansible_env, dict(node_files, classes={"79": "melt"}))
    assert rc != 0 and stats["failures"] == 1
    assert result["msg"] == "classes: XID 79 maps to 'melt', which is not one of none, device, reset, reboot, replace."
    assert "Traceback" not in json.dumps(result)
