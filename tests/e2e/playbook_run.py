"""Run the collection's playbooks against the lab, for the end-to-end tests and anything built on them.

``lab_inventory`` asks ``lab.py inventory`` for an inventory of the lab's nodes (it also prepares them:
simulated-GPU specs, the local toolkit repository and the plugin's wheels); ``run_playbook`` runs
``ansible-playbook`` on the collection as checked out here and returns a :class:`PlaybookRun` with the
recap parsed, so a test can say "zero changed" from what Ansible itself reported. ``mitogen_environment``
gives the environment that runs a playbook under Mitogen's ``mitogen_linear`` strategy (docs/mitogen.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
LAB_PY = REPO / "tests" / "e2e" / "lab.py"
COLLECTIONS = REPO / ".build"

RECAP_LINE = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)",
    re.MULTILINE,
)
_collection_mirrored = False


@dataclass
class PlaybookRun:
    """One ``ansible-playbook`` run: its exit status, its output, and the PLAY RECAP per host."""

    argv: list[str]
    returncode: int
    output: str
    seconds: float
    recap: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def changed(self) -> int:
        return sum(host["changed"] for host in self.recap.values())

    @property
    def failed(self) -> int:
        return sum(host["failed"] + host["unreachable"] for host in self.recap.values())

    def changed_tasks(self) -> list[str]:
        """The task headers followed by a ``changed:`` line (to say what changed when nothing should)."""
        tasks, current = [], ""
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                current = line.rstrip("* ")
            elif line.startswith("changed:") and current and (not tasks or tasks[-1] != current):
                tasks.append(current)
        return tasks

    def summary(self) -> str:
        """The output's tail, for assertion messages."""
        return f"{' '.join(self.argv)} -> rc {self.returncode} in {self.seconds:.0f}s\n" + self.output[-6000:]


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    recap_at = output.rfind("PLAY RECAP")
    if recap_at < 0:
        return {}
    return {
        m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
        for m in RECAP_LINE.finditer(output, recap_at)
    }


def mirror_collection() -> None:
    """Mirror this checkout into .build/ansible_collections/gpuops/k8s, where the playbooks find the roles."""
    global _collection_mirrored
    if not _collection_mirrored:
        subprocess.run([str(REPO / "scripts" / "collection-tree.sh")], check=True, stdout=subprocess.DEVNULL)
        _collection_mirrored = True


def lab_inventory(path: Path, *specs: str) -> Path:
    """Write ``lab.py inventory SPEC...`` to ``path`` (node i gets spec i; the rest h100x8)."""
    done = subprocess.run(
        [str(LAB_PY), "inventory", *specs], check=True, stdout=subprocess.PIPE, text=True, timeout=1800
    )
    path.write_text(done.stdout)
    return path


def inventory_hostvars(inventory: Path, host: str) -> dict[str, Any]:
    """A host's variables as the lab inventory sets them (group vars, then its own)."""
    data = yaml.safe_load(inventory.read_text())
    group = data["all"]["children"]["gpu_nodes"]
    return {**group.get("vars", {}), **(group["hosts"].get(host) or {})}


def mitogen_strategy_dir() -> Path:
    """The directory of Mitogen's strategy plugins in this interpreter's environment (requirements/mitogen.txt)."""
    try:
        import ansible_mitogen
    except ImportError as error:
        raise RuntimeError(
            "Mitogen is not installed in this Python environment; install requirements/mitogen.txt"
        ) from error
    return Path(ansible_mitogen.__file__).resolve().parent / "plugins" / "strategy"


def mitogen_environment() -> dict[str, str]:
    """What ansible-playbook needs in its environment to run every play under mitogen_linear."""
    return {"ANSIBLE_STRATEGY_PLUGINS": str(mitogen_strategy_dir()), "ANSIBLE_STRATEGY": "mitogen_linear"}


def run_playbook(
    playbook: str,
    inventory: Path,
    *args: str,
    extra_vars: Path | None = None,
    limit: str | None = None,
    timeout: float = 3600,
    env: dict[str, str] | None = None,
    collections: Path | None = None,
) -> PlaybookRun:
    """Run ``ansible-playbook playbooks/PLAYBOOK`` with the lab inventory; never raises on a failed play.
    ``env`` adds to the environment (e.g. ``mitogen_environment()``). A PLAYBOOK named by its collection name
    (``gpuops.k8s.validate``) is run as an installed collection's, from ``collections`` (an installation path)."""
    if collections is None:
        mirror_collection()
    named = playbook.startswith("gpuops.k8s.")
    argv = ["ansible-playbook", "-i", str(inventory), playbook if named else str(REPO / "playbooks" / playbook), *args]
    if extra_vars is not None:
        argv += ["-e", f"@{extra_vars}"]
    if limit:
        argv += ["--limit", limit]
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections or COLLECTIONS),
        "ANSIBLE_STDOUT_CALLBACK": "default",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        **(env or {}),
    }
    start = time.monotonic()
    # A failed play is a result to assert on, not an exception.
    done = subprocess.run(
        argv,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    return PlaybookRun(
        argv=argv,
        returncode=done.returncode,
        output=done.stdout,
        seconds=time.monotonic() - start,
        recap=parse_recap(done.stdout),
    )
