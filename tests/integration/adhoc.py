"""Modules of the collection run by the real `ansible` command on localhost, as an ad hoc task: the environment
(the collection mirrored by scripts/collection-tree.sh, JSON output) and one run's result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def ansible_environment(temp_dir: str) -> dict[str, str]:
    """This process's environment, with the collection's mirror on ANSIBLE_COLLECTIONS_PATH and JSON output."""
    subprocess.run([os.path.join(REPO, "scripts", "collection-tree.sh")], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build"),
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_LOCAL_TEMP=temp_dir,
        ANSIBLE_NOCOLOR="1",
    )
    return env


def run_module(env, module, module_args, *extra, timeout=120):
    """(rc, the task's result, the host's stats) of `ansible localhost -m MODULE -a ARGS EXTRA...`; ARGS is a
    string, or a dict given as JSON."""
    args = module_args if isinstance(module_args, str) else json.dumps(module_args)
    command = [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-m", module, "-a", args]
    completed = subprocess.run(
        [*command, *extra], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = json.loads(completed.stdout)
    return completed.returncode, output["plays"][0]["tasks"][0]["hosts"]["localhost"], output["stats"]["localhost"]
