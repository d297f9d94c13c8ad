"""The nvidia_driver role refuses a driver branch that is not a branch before it writes anything: the
branch becomes part of package names and of the apt preferences (an AWX survey answer reaches it as text).
The role runs for real with ansible-playbook against this machine, in check mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run_role(tmp_path, **extra):
    """The role in check mode on this machine with EXTRA as extra vars: its exit status and (task, result) pairs."""
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: gpuops.k8s.nvidia_driver\n")
    subprocess.run([os.path.join(REPO, "scripts", "collection-tree.sh")], check=True, stdout=subprocess.DEVNULL)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build"),
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        ANSIBLE_NOCOLOR="1",
    )
    extra["ansible_python_interpreter"] = sys.executable
    done = subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", "--check", str(playbook), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    # Task names without the role's prefix ("gpuops.k8s.nvidia_driver : ").
    return done.returncode, [(t["task"]["name"].split(" : ")[-1], t["hosts"].get("localhost", {})) for t in tasks]


@pytest.mark.parametrize("branch", ["580*\nPin-Priority: 1001", "../535", "latest", "5"])
def test_a_branch_that_is_not_digits_stops_the_role_before_anything_else(tmp_path, branch):
    rc, tasks = run_role(tmp_path, nvidia_driver_branch=branch)
    assert rc != 0
    name, result = tasks[-1]
    assert name == "Check the source for this platform and the driver branch"
    assert result["msg"] == (
        f"nvidia_driver_branch={json.dumps(branch)} is not a driver branch: give its three or four digits,"
        " such as 580, or leave it empty for the source's default."
    )
    assert not any(n.startswith(("Configure", "Install")) for n, _result in tasks)


def test_a_branch_of_digits_passes_the_check(tmp_path):
    _rc, tasks = run_role(tmp_path, nvidia_driver_branch="580")
    results = dict(tasks)
    assert results["Check the source for this platform and the driver branch"].get("failed") is not True
