"""ansible-playbook on localhost as the API tests run the roles: the environment (scripts/collection-tree.sh's mirror
of this checkout on ANSIBLE_COLLECTIONS_PATH, after any trees put first; results as JSON from ansible.posix's json
callback), and a task that puts into a run's own output the version of each collection this one depends on, as that
run loaded it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# The collections galaxy.yml says this one depends on.
DEPENDENCIES = tuple(yaml.safe_load((REPO / "galaxy.yml").read_text())["dependencies"])
LOADED = "Report the versions of the collections gpuops.k8s depends on, as this run loaded them"


def playbook_env(*first: str) -> dict[str, str]:
    """This process's environment for ansible-playbook: the trees ``first`` on ANSIBLE_COLLECTIONS_PATH ahead of this
    checkout's mirror (a collection is loaded from the first tree that has it; the ones the ansible package ships come
    after all of them), JSON results, no warnings about localhost or an inventory given as a list."""
    mirror = subprocess.run(
        [str(REPO / "scripts/collection-tree.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    return dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=os.pathsep.join([*first, str(Path(mirror).parents[2])]),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
    )


def loaded_versions_task() -> dict:
    """A task for the front of a play: the version of each dependency as the controller imports it, which is where
    the run takes that collection's modules and plugins from (community.general's collection_version lookup reads the
    MANIFEST.json beside the package the controller imported)."""
    lookups = {name: f"{{{{ lookup('community.general.collection_version', '{name}') }}}}" for name in DEPENDENCIES}
    return {"name": LOADED, "ansible.builtin.debug": {"msg": lookups}}


def loaded_versions(report: dict) -> list[dict]:
    """What each run of loaded_versions_task in a json callback ``report`` said, in order."""
    return [
        task["hosts"]["localhost"].get("msg")
        for play in report["plays"]
        for task in play["tasks"]
        if task["task"]["name"] == LOADED
    ]
