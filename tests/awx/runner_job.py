"""Run one job the way AWX runs it, for the tests that need AWX's view of the collection.

AWX does not call ``ansible-playbook``: it writes a private data directory (the project, the
inventory, extra variables, the credentials' environment variables and SSH key, runner settings),
streams it with ``ansible-runner transmit`` to receptor, which starts the execution environment and
runs ``ansible-runner worker --private-data-dir=/runner`` in it, and reads the result stream back
with ``ansible-runner process``. :func:`run_job` does exactly that with podman in receptor's place::

    ansible-runner transmit PDD -p PLAYBOOK
      | podman run --rm -i --network host EE ansible-runner worker --private-data-dir=/runner
      | ansible-runner process OUT

and returns a :class:`JobResult`: status and rc as the worker reported them, the job events (the
records AWX stores and shows), the per-host recap from ``playbook_on_stats``, and helpers to say which
tasks failed and how much changed.

The project holds the playbooks given and the collection at ``project/collections/ansible_collections/
gpuops/k8s`` (this checkout, mirrored by ``scripts/collection-tree.sh``), as a project that vendors
it would; ``ANSIBLE_COLLECTIONS_PATH`` points there first, then at the EE's collections. The
execution environment comes from ``scripts/build-ee.sh``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD_EE = REPO / "scripts" / "build-ee.sh"
COLLECTION_TREE = REPO / "scripts" / "collection-tree.sh"
# Inside the EE: the private data directory is /runner (AWX's and ansible-builder's workdir).
RUNNER_DIR = "/runner"
COLLECTIONS_PATH = f"{RUNNER_DIR}/project/collections:/usr/share/ansible/collections"

_RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

Inventory = Union[str, Mapping[str, Any]]


def build_ee(timeout: float = 3600) -> str:
    """Build (or find in the cache) the execution environment and return its image reference.

    build-ee.sh runs with this interpreter's environment first on PATH: its ansible-builder, and its
    ``ansible`` package's collections, which go into the EE.
    """
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PYTHON=sys.executable, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run([str(BUILD_EE)], check=True, stdout=subprocess.PIPE, text=True, timeout=timeout, env=env)
    return done.stdout.strip().splitlines()[-1]


def mirror_collection() -> Path:
    """This checkout as .build/ansible_collections/gpuops/k8s (what ansible-test also uses)."""
    done = subprocess.run([str(COLLECTION_TREE)], check=True, stdout=subprocess.PIPE, text=True, timeout=300)
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class FailedTask:
    """A task that failed (or could not reach its host) and was not ignored."""

    host: str
    task: str
    action: str
    message: str
    unreachable: bool = False


@dataclass
class JobResult:
    """One job as AWX would record it."""

    status: str  # the worker's last status: successful, failed, error, canceled, timeout
    rc: int | None
    events: list[dict[str, Any]]
    private_data_dir: Path
    artifact_dir: Path
    seconds: float
    stderr: str = ""  # transmit's, podman's and the worker's, and process's, for diagnosis
    stats: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    @property
    def stdout(self) -> str:
        """The job's output, the events' stdout in order, as plain text (AWX's ``?format=txt``)."""
        return _ANSI.sub("", "\n".join(event["stdout"] for event in self.events if event.get("stdout")))

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind (``runner_on_ok``, ``playbook_on_task_start``, ...)."""
        return [event for event in self.events if event.get("event") == kind]

    def task_results(self, task: str, host: str | None = None) -> list[dict[str, Any]]:
        """The module results (``event_data.res``) of the task named ``task``, on ``host`` or every host."""
        return [
            event["event_data"].get("res", {})
            for event in self.events
            if event.get("event") in _RESULT_EVENTS
            and event["event_data"].get("task") == task
            and (host is None or event["event_data"].get("host") == host)
        ]

    def failed_tasks(self) -> list[FailedTask]:
        """Tasks that failed or found their host unreachable, ignore_errors excepted."""
        failed = []
        for event in self.events:
            kind, data = event.get("event"), event.get("event_data", {})
            if kind not in ("runner_on_failed", "runner_on_unreachable") or data.get("ignore_errors"):
                continue
            res = data.get("res") or {}
            failed.append(
                FailedTask(
                    host=data.get("host", ""),
                    task=data.get("task", ""),
                    action=data.get("task_action", ""),
                    message=str(res.get("msg", "")),
                    unreachable=kind == "runner_on_unreachable",
                )
            )
        return failed

    def changed_counts(self) -> dict[str, int]:
        """Changed tasks per host, from the recap."""
        return {host: counts["changed"] for host, counts in self.stats.items()}

    def changed_tasks(self) -> list[tuple[str, str]]:
        """(host, task) for every task result that reported a change."""
        return [
            (event["event_data"].get("host", ""), event["event_data"].get("task", ""))
            for event in self.events
            if event.get("event") == "runner_on_ok" and event["event_data"].get("res", {}).get("changed")
        ]

    def summary(self) -> str:
        """Status, recap, failures and the output's tail, for assertion messages."""
        lines = [
            f"job {self.private_data_dir}: {self.status}, rc {self.rc}, {self.seconds:.1f}s",
            f"recap: {self.stats}",
        ]
        lines += [f"failed: {task}" for task in self.failed_tasks()]
        lines += ["--- stdout (tail)", self.stdout[-6000:], "--- stderr (tail)", self.stderr[-3000:]]
        return "\n".join(lines)


def recap(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """PLAY RECAP per host from the last ``playbook_on_stats`` event (AWX's job host summaries)."""
    stats = [event for event in events if event.get("event") == "playbook_on_stats"]
    if not stats:
        return {}
    data = stats[-1]["event_data"]
    # The recap's names for Ansible's stats keys.
    names = {
        "ok": "ok",
        "changed": "changed",
        "dark": "unreachable",
        "failures": "failed",
        "skipped": "skipped",
        "rescued": "rescued",
        "ignored": "ignored",
    }
    hosts = set().union(*(data.get(key) or {} for key in names))
    return {
        host: {name: int((data.get(key) or {}).get(host, 0)) for key, name in names.items()} for host in sorted(hosts)
    }


def _collection_ignore(root: Path) -> Callable[[str, list[str]], set[str]]:
    """What a job does not need from the mirror: its git repository (collection-tree.sh makes one for
    ansible-test), bytecode, and ansible-test's scratch space tests/output."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = {name for name in names if name in (".git", "__pycache__") or name.endswith(".pyc")}
        if Path(directory) == root / "tests" and "output" in names:
            skipped.add("output")
        return skipped

    return ignore


def _write(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    path.chmod(mode)


def write_private_data_dir(
    pdd: Path,
    *,
    playbooks: Mapping[str, str],
    collection: Path | None,
    inventory: Inventory,
    extravars: Mapping[str, Any] | None = None,
    envvars: Mapping[str, str] | None = None,
    ssh_key: str | None = None,
    settings: Mapping[str, Any] | None = None,
    cmdline: Sequence[str] = (),
    files: Mapping[str, str | bytes] | None = None,
) -> Path:
    """Lay out AWX's private data directory (ansible-runner's input directory hierarchy) at ``pdd``.

    ``playbooks`` maps paths under project/ to their text; ``collection`` is copied to
    project/collections/ansible_collections/gpuops/k8s; ``files`` are any other files (a CA
    certificate a K8S_AUTH_* variable names as /runner/env/ca.crt, say), relative to ``pdd``.
    """
    project = pdd / "project"
    project.mkdir(parents=True)
    for name, text in playbooks.items():
        _write(project / name, text)
    if collection is not None:
        target = project / "collections" / "ansible_collections" / "gpuops" / "k8s"
        shutil.copytree(collection, target, symlinks=True, ignore=_collection_ignore(collection))
    inventory_text = inventory if isinstance(inventory, str) else yaml.safe_dump(dict(inventory), sort_keys=False)
    _write(pdd / "inventory" / "hosts", inventory_text)
    env = pdd / "env"
    env.mkdir()
    _write(env / "extravars", json.dumps(dict(extravars or {})))
    _write(env / "envvars", json.dumps({"ANSIBLE_COLLECTIONS_PATH": COLLECTIONS_PATH, **dict(envvars or {})}), 0o600)
    _write(env / "settings", json.dumps(dict(settings or {})))
    if ssh_key is not None:
        # ansible-runner feeds it to ssh-agent in the worker (through a FIFO) and removes it again.
        _write(env / "ssh_key", ssh_key if ssh_key.endswith("\n") else ssh_key + "\n", 0o600)
    if cmdline:
        _write(env / "cmdline", shlex.join(cmdline))
    for name, content in (files or {}).items():
        _write(pdd / name, content, 0o600)
    return pdd


def _runner(*args: str) -> list[str]:
    """ansible-runner of this interpreter's environment: the version the EE has (requirements/test.txt)."""
    return [sys.executable, "-m", "ansible_runner", *args]


def run_job(
    ee_image: str,
    playbook: str,
    *,
    playbooks: Mapping[str, str],
    collection: Path | None = None,
    include_collection: bool = True,
    work_dir: Path | None = None,
    timeout: float = 900,
    podman_args: Sequence[str] = ("--network", "host"),
    **job: Any,
) -> JobResult:
    """Run ``playbook`` (a path under project/, one of ``playbooks``) as an AWX job in ``ee_image``.

    The project's collection is ``collection``, by default this checkout as scripts/collection-tree.sh
    mirrors it; ``include_collection=False`` leaves it out. The other keywords (``inventory``,
    ``extravars``, ``envvars``, ``ssh_key``, ``settings``, ``cmdline``, ``files``) lay out the private
    data directory as write_private_data_dir says. ``envvars`` go to env/envvars (the
    K8S_AUTH_* variables of a Kubernetes credential, say); ``ssh_key`` is the machine credential's
    private key (the EE knows no host keys: set ANSIBLE_HOST_KEY_CHECKING=False in ``envvars``, or
    give a known_hosts file in ``files`` and point ssh at it). The job runs under ``timeout``
    seconds (its status is then ``timeout``); nothing is left running. ``work_dir`` (default: a new
    temporary directory) keeps the private data directory and the artifacts for a look afterwards.
    """
    if playbook not in playbooks:
        raise ValueError(f"{playbook!r} is not one of the playbooks given: {sorted(playbooks)}")
    source = (collection or mirror_collection()) if include_collection else None
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="gpuops-awx-job-"))
    work.mkdir(parents=True, exist_ok=True)
    ident = uuid.uuid4().hex[:12]
    pdd = write_private_data_dir(work / "pdd", playbooks=playbooks, collection=source, **job)
    out = work / "out"
    out.mkdir()
    container = f"gpuops-awx-job-{ident}"
    worker = ["podman", "run", "--rm", "-i", "--name", container, *podman_args, ee_image]
    worker += ["ansible-runner", "worker", f"--private-data-dir={RUNNER_DIR}"]
    logs = [(work / f"{name}.stderr").open("w+", encoding="utf-8") for name in ("transmit", "worker", "process")]
    started = time.monotonic()
    status = ""
    with open(os.devnull, "wb") as devnull:
        transmit = subprocess.Popen(
            _runner("transmit", str(pdd), "-p", playbook, "--ident", ident), stdout=subprocess.PIPE, stderr=logs[0]
        )
        run = subprocess.Popen(worker, stdin=transmit.stdout, stdout=subprocess.PIPE, stderr=logs[1])
        process = subprocess.Popen(
            _runner("process", str(out), "--ident", ident), stdin=run.stdout, stdout=devnull, stderr=logs[2]
        )
        # Only the next stage holds each pipe, so a stage that dies ends the ones after it.
        assert transmit.stdout is not None and run.stdout is not None
        transmit.stdout.close()
        run.stdout.close()
        try:
            process.wait(timeout=timeout)
            run.wait(timeout=60)
            transmit.wait(timeout=60)
        except subprocess.TimeoutExpired:
            status = "timeout"
            subprocess.run(["podman", "rm", "-f", "-t", "0", container], capture_output=True, check=False)
            for proc in (transmit, run, process):
                proc.kill()
                proc.wait()
    seconds = time.monotonic() - started
    stderr = ""
    for log in logs:
        log.seek(0)
        stderr += log.read()
        log.close()
    artifact_dir = out / "artifacts" / ident
    events = []
    for path in (artifact_dir / "job_events").glob("*.json"):
        events.append(json.loads(path.read_text(encoding="utf-8")))
    events.sort(key=lambda event: event.get("counter", 0))
    if not status:
        status_file = artifact_dir / "status"
        status = status_file.read_text().strip() if status_file.exists() else "error"
    rc_file = artifact_dir / "rc"
    rc = int(rc_file.read_text().strip()) if rc_file.exists() and rc_file.read_text().strip() else None
    return JobResult(
        status=status,
        rc=rc,
        events=events,
        private_data_dir=pdd,
        artifact_dir=artifact_dir,
        seconds=seconds,
        stderr=stderr,
        stats=recap(events),
    )
