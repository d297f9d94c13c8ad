"""playbooks/site.yml under Mitogen's mitogen_linear strategy (requirements/mitogen.txt, docs/mitogen.md), over the
lab inventory's SSH login as an unprivileged user with sudo, against the lab's real API server, kubelet and
containerd.

The node is the lab's first, which test_site.py converges the same way (the plugin in systemd mode, the same
variables) and the modules after it leave so before this module runs; run alone, the module finds it fresh and
converges it from nothing. Under Mitogen, three runs: one that removes the device plugin from the node
(device_plugin_state=absent), one that installs it again (the package copied and unpacked, the virtual environment
built by pip, the config and unit written, the service started: the writing paths through Mitogen's file transfer
and sudo), and one that must change nothing. The node leaves the module as it came: converged, advertising its 8
GPUs."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Lab, recovery_vars
from playbook_run import COLLECTIONS, REPO, PlaybookRun, lab_inventory, mitogen_environment, run_playbook

GPU = "nvidia.com/gpu"
SERVICE = "gpuops-device-plugin.service"
LOGIN_HOME = "/home/gpuops"


@dataclass
class MitogenFlow:
    node: str
    inventory: Path
    env: dict[str, str]
    removed: PlaybookRun
    unit_after_removal: str
    installed: PlaybookRun
    noop: PlaybookRun


def unit_load_state(lab: Lab, node: str) -> str:
    return lab.node_exec(node, "systemctl", "show", "-p", "LoadState", "--value", SERVICE).stdout.strip()


@pytest.fixture(scope="module")
def flow(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> MitogenFlow:
    node = lab.nodes[0]
    work = tmp_path_factory.mktemp("site-mitogen")
    inventory = lab_inventory(work / "inventory.yml")
    extra_vars = recovery_vars(work / "vars.yml")
    env = mitogen_environment()

    def site(*args: str) -> PlaybookRun:
        return run_playbook("site.yml", inventory, *args, extra_vars=extra_vars, limit=node, env=env)

    # The RuntimeClass is the cluster's, used by the other node's plugin too: the removal leaves it alone.
    removed = site("-e", "device_plugin_state=absent", "-e", "device_plugin_runtime_class=false")
    unit_after_removal = unit_load_state(lab, node)
    installed = site("--diff")
    noop = site()
    return MitogenFlow(
        node=node,
        inventory=inventory,
        env=env,
        removed=removed,
        unit_after_removal=unit_after_removal,
        installed=installed,
        noop=noop,
    )


def test_the_plugin_is_removed_under_mitogen(flow: MitogenFlow) -> None:
    assert flow.removed.returncode == 0, flow.removed.summary()
    assert flow.removed.recap[flow.node]["changed"] > 0, flow.removed.summary()
    assert flow.unit_after_removal == "not-found"


def test_the_plugin_is_installed_again_under_mitogen(flow: MitogenFlow) -> None:
    assert flow.installed.returncode == 0, flow.installed.summary()
    assert flow.installed.recap[flow.node]["failed"] == 0
    changed = flow.installed.changed_tasks()
    # The writes went through Mitogen: a file copied with sudo, pip into the venv, the unit, the service.
    for task in (
        "Copy the daemon's package to the node",
        "Install the daemon into the virtual environment",
        "Write the systemd unit",
        "Enable and start the service",
    ):
        assert any(task in header for header in changed), (task, changed)


def test_a_second_run_under_mitogen_changes_nothing(flow: MitogenFlow) -> None:
    assert flow.noop.returncode == 0, flow.noop.summary()
    assert flow.noop.recap[flow.node]["changed"] == 0, flow.noop.changed_tasks()
    assert flow.noop.recap[flow.node]["failed"] == 0
    print(f"site.yml under mitogen_linear: install {flow.installed.seconds:.0f}s, no-op {flow.noop.seconds:.0f}s")


def test_the_node_advertises_its_eight_gpus(lab: Lab, flow: MitogenFlow) -> None:
    lab.wait_until(f"{flow.node} allocatable {GPU}=8", lambda: lab.allocatable(flow.node).get(GPU) == "8")
    assert lab.node(flow.node).status.capacity[GPU] == "8"
    assert lab.node_exec(flow.node, "systemctl", "is-active", SERVICE).stdout.strip() == "active"


def test_mitogen_logs_in_over_ssh_as_the_login_user_then_runs_sudo(flow: MitogenFlow) -> None:
    """Mitogen's own diagnostic action, which runs only on a Mitogen connection, names the connection it made
    for the inventory's `ansible_connection: ssh` with become: SSH as the login user, then sudo to root."""
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), **flow.env}
    done = subprocess.run(
        ["ansible", "-i", str(flow.inventory), flow.node, "-m", "mitogen_get_stack", "-o"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    stack = json.loads(done.stdout.split("=>", 1)[1])["result"]
    assert [(hop["method"], hop["kwargs"]["username"]) for hop in stack] == [("ssh", "gpuops"), ("sudo", "root")]
    assert stack[1]["kwargs"]["sudo_args"] == ["-H", "-S", "-n"]


def test_mitogen_leaves_no_interpreter_and_no_temporary_file_on_the_node(lab: Lab, flow: MitogenFlow) -> None:
    # Mitogen names its interpreters on the node mitogen:<user>@<host>:<pid>; they end with the SSH session.
    lab.wait_until(
        f"Mitogen's interpreters on {flow.node} to end",
        lambda: "mitogen:" not in lab.node_exec(flow.node, "ps", "-eo", "args").stdout,
        timeout=30,
    )
    for directory in (f"{LOGIN_HOME}/.ansible/tmp", "/root/.ansible/tmp"):
        left = lab.node_exec(flow.node, "find", directory, "-mindepth", "1", check=False)
        assert left.stdout == "", f"{directory} on {flow.node}: {left.stdout}"
