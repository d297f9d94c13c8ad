"""Event-Driven Ansible: the shipped rulebooks, gpuops.k8s.gpu_remediation and gpuops.k8s.gpu_remediation_job_template,
run by a real ansible-rulebook.

The peers are real: ansible-rulebook 1.3.2 with its Drools rule engine (requirements/eda.txt, built and cached by
scripts/eda-env.sh) on Debian's OpenJDK 17 (scripts/bootstrap.sh), loading the rulebooks and the gpuops.k8s.gpu_alerts
event source from the collection as ``ansible-galaxy collection build`` would ship it (scripts/collection-tree.sh on
ANSIBLE_COLLECTIONS_PATH). Alerts are POSTed to the source over HTTP on 127.0.0.1 with the sender token, or with a
node's own token derived from the node secret by the collection's gpuops.k8s.alert_token filter (run by a real
``ansible``, as the device_plugin role runs it).
The playbook gpu_remediation starts is a TEST DOUBLE standing in for gpuops.k8s.remediate: the collection
``gpuops_test.doubles`` written below, whose ``remediate_recorder`` playbook first imports the shipped
playbooks/tasks/alert_hosts.yml, the check remediate.yml begins with, and then records each run's limit, hosts and
``ansible_eda`` extra variables in a file and changes nothing; the rulebook is pointed at it through its
``gpu_remediation_playbook`` variable. The controller gpu_remediation_job_template launches job templates on is a
TEST DOUBLE of the AWX controller API (``Controller`` below: the endpoints ansible-rulebook calls, and where in its
source each comes from), an HTTP server in this process that records every request. One process of each rulebook
serves the module; each test uses nodes of its own.
The last tests run the real playbooks/remediate.yml with ansible-playbook (no rulebook) to show that it begins with
that check; a job template launch's limit and extra variables are run through it too.
Nothing sleeps and then asserts: a test that needs every earlier alert handled posts a class ``none`` alert and
waits for the rulebook to print it (the rulebook's actions run one at a time, in the order the alerts came).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from local_api import wait_for

REPO = Path(__file__).resolve().parents[2]
TOKEN = "gpuops-eda-test-token"
NODE_SECRET = "gpuops-eda-test-node-secret"
NODES = [f"eda-node-{letter}" for letter in "abcdefghijklmn"]
# An inventory group of GPU nodes that is not the GPU group the playbook targets (gpu_nodes).
WORKERS = ["eda-node-a", "eda-node-b", "eda-node-i"]
BURST = 20


def uuid(n: int) -> str:
    return f"GPU-5e1f0000-0000-4000-8000-{n:012x}"


REMEDIATE_RULE = "Remediate a node with a GPU to reset, a reboot to make or a GPU to replace"

RECORDER_PLAYBOOK = """\
---
# TEST DOUBLE for gpuops.k8s.remediate: the same hosts and first check, then records the run and changes nothing.
- name: Record a remediation run
  hosts: "{{{{ gpuops_hosts | default('gpu_nodes') }}}}"
  gather_facts: false
  pre_tasks:
    - name: Check that a run for an alert acts on the alert's node alone
      ansible.builtin.import_tasks: {alert_hosts}
  tasks:
    - name: Record the run
      ansible.builtin.import_tasks: tasks/record.yml
"""
# In a file of its own so that the run proves a collection playbook's relative imports resolve under ansible-rulebook.
RECORD_TASKS = """\
---
- name: Write the run's limit, hosts and EDA variables to a file named by the event
  ansible.builtin.copy:
    dest: "{{ lookup('ansible.builtin.env', 'GPUOPS_EDA_RECORDER_DIR') }}/{{ ansible_eda.event.meta.uuid }}.json"
    content: "{{ {'limit': ansible_limit, 'hosts': ansible_play_hosts_all, 'ansible_eda': ansible_eda} | to_json }}"
    mode: "0644"
  delegate_to: localhost
  run_once: true
"""


def java_home() -> Path:
    """Debian's OpenJDK 17 (package openjdk-17-jdk-headless)."""
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    home = Path(f"/usr/lib/jvm/java-17-openjdk-{arch}")
    assert (home / "bin" / "java").exists(), f"{home} has no Java; run `make setup` (openjdk-17-jdk-headless)"
    return home


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Rulebook:
    """ansible-rulebook running a rulebook, its output in ``log``; gpu_remediation's recorded runs in ``runs``."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path, runs: Path | None, **context):
        self.proc, self.port, self.log, self.runs = proc, port, log, runs
        self.work, self.venv, self.env = context["work"], context["venv"], context["env"]
        self.sentinels = itertools.count()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive_or_fail(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"ansible-rulebook exited with {self.proc.returncode}:\n{self.output()[-4000:]}")

    def wait(self, what: str, predicate, timeout: float = 180) -> None:
        def checked():
            self.alive_or_fail()
            return predicate()

        try:
            wait_for(what, checked, timeout=timeout, interval=0.2)
        except AssertionError as err:
            raise AssertionError(f"{err}\nansible-rulebook's output:\n{self.output()[-4000:]}") from None

    def post(self, data, token: str | None = TOKEN) -> tuple[int, str]:
        """(status, text) of a POST of DATA (bytes, or what becomes JSON) with TOKEN as the bearer token."""
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/alerts", data=raw, method="POST")
        request.add_header("Content-Type", "application/json")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def answers(self) -> bool:
        """Whether the source answers HTTP (a GET is refused with 405: it takes POST only)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("GET", "/")
            return connection.getresponse().status == 405
        except OSError:
            return False
        finally:
            connection.close()

    def settle(self) -> None:
        """Returns once every alert posted before it has been handled and its action has finished."""
        gpu = uuid(0xF00000 + next(self.sentinels))
        status, text = self.post({"node": "eda-sentinel", "gpu": 0, "uuid": gpu, "xid": 13, "class": "none"})
        assert (status, json.loads(text)) == (200, {"events": 1}), text
        line = f"gpu_alerts: node eda-sentinel GPU 0 ({gpu}) XID 13 is of class none; no node action is taken."
        self.wait(f"the rulebook to print the alert of {gpu}", lambda: line in self.output())

    def recorded(self) -> list[dict]:
        return [json.loads(path.read_text()) for path in sorted(self.runs.glob("*.json"))]

    def recorded_for(self, node: str) -> list[dict]:
        return [run for run in self.recorded() if run["ansible_eda"]["event"]["gpu_alert"]["node"] == node]

    def node_token(self, node: str) -> str:
        """NODE's own alert token, as the device_plugin role writes it: the gpuops.k8s.alert_token filter run by a
        real ``ansible`` with this module's collection."""
        out = self.work / f"token-{node}"
        proc = subprocess.run(
            [
                str(self.venv / "bin/ansible"),
                "localhost",
                "-c",
                "local",
                "-e",
                json.dumps({"ansible_python_interpreter": str(self.venv / "bin/python"), "secret": NODE_SECRET}),
                "-m",
                "ansible.builtin.copy",
                "-a",
                json.dumps({"dest": str(out), "content": f"{{{{ '{node}' | gpuops.k8s.alert_token(secret) }}}}"}),
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return out.read_text()


@pytest.fixture(scope="module")
def eda_venv() -> Path:
    # Builds on the first call (about a minute), then comes from $GPUOPS_CACHE.
    proc = subprocess.run([str(REPO / "scripts/eda-env.sh")], capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def collections(eda_venv, tmp_path_factory) -> Path:
    """A work directory holding the collection as it ships (shipped/) and the test doubles' collection (doubles/)."""
    work = tmp_path_factory.mktemp("eda")
    shipped = work / "shipped"
    proc = subprocess.run(
        [str(REPO / "scripts/collection-tree.sh"), str(shipped / "ansible_collections/gpuops/k8s")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doubles = work / "doubles"
    collection = doubles / "ansible_collections/gpuops_test/doubles"
    (collection / "playbooks/tasks").mkdir(parents=True)
    (collection / "galaxy.yml").write_text(
        "namespace: gpuops_test\nname: doubles\nversion: 1.0.0\nreadme: README.md\nauthors: [tests]\n"
    )
    alert_hosts = shipped / "ansible_collections/gpuops/k8s/playbooks/tasks/alert_hosts.yml"
    (collection / "playbooks/remediate_recorder.yml").write_text(RECORDER_PLAYBOOK.format(alert_hosts=alert_hosts))
    (collection / "playbooks/tasks/record.yml").write_text(RECORD_TASKS)
    return work


@contextlib.contextmanager
def started(
    eda_venv: Path,
    work: Path,
    name: str,
    variables: dict,
    options: list[str],
    env: dict[str, str],
    runs: Path | None = None,
):
    """ansible-rulebook running the rulebook gpuops.k8s.NAME from WORK's collections with VARIABLES (the source's
    port, token and rates added), OPTIONS and ENV added to its environment, until the block ends."""
    port = free_port()
    variables_file = work / f"{name}.vars.yml"
    variables_file.write_text(
        yaml.safe_dump(
            {
                "gpu_alerts_port": port,
                "gpu_alerts_token": TOKEN,
                "gpu_alerts_node_secret": NODE_SECRET,
                # A burst of BURST alerts per node, and so few more a minute that none comes during a test.
                "gpu_alerts_node_burst": BURST,
                "gpu_alerts_node_rate": 1,
                **variables,
            }
        )
    )
    log = work / f"{name}.log"
    env = dict(
        os.environ,
        PATH=f"{eda_venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        JAVA_HOME=str(java_home()),
        ANSIBLE_COLLECTIONS_PATH=f"{work / 'shipped'}{os.pathsep}{work / 'doubles'}",
        ANSIBLE_NOCOLOR="1",
        PYTHONUNBUFFERED="1",
        **env,
    )
    command = [
        str(eda_venv / "bin/ansible-rulebook"),
        "--rulebook",
        f"gpuops.k8s.{name}",
        "--vars",
        str(variables_file),
        *options,
        # Every event the source puts on the queue is printed: a test can tell that a request made none.
        "--print-events",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
    book = Rulebook(proc, port, log, runs, work=work, venv=eda_venv, env=env)
    try:
        book.wait(f"the gpu_alerts source to answer on 127.0.0.1:{port}", book.answers, timeout=300)
        yield book
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def rulebook(eda_venv, collections):
    inventory = collections / "inventory.yml"
    python = str(eda_venv / "bin/python")
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_nodes": {"hosts": {node: None for node in NODES}},
                        "eda-workers": {"hosts": {node: None for node in WORKERS}},
                    },
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": python},
                }
            }
        )
    )
    runs = collections / "runs"
    runs.mkdir()
    with started(
        eda_venv,
        collections,
        "gpu_remediation",
        {"gpu_remediation_playbook": "gpuops_test.doubles.remediate_recorder"},
        ["--inventory", str(inventory)],
        {"GPUOPS_EDA_RECORDER_DIR": str(runs)},
        runs=runs,
    ) as book:
        yield book


def test_a_burst_of_alerts_on_a_node_is_one_playbook_run_per_class_for_that_node(rulebook):
    burst = [
        {
            "node": "eda-node-a",
            "gpu": i % 8,
            "uuid": uuid(i % 8),
            "xid": (79, 48, 74, 95)[i % 4],
            "class": ("reboot", "reset", "reboot", "replace")[i % 4],
            "time": f"2026-11-26T08:00:{i:02d}Z",
        }
        for i in range(BURST)
    ]
    with ThreadPoolExecutor(max_workers=len(burst)) as pool:
        answers = list(pool.map(rulebook.post, burst))
    assert answers == [(200, '{"events": 1}')] * BURST
    other = {
        "node": "eda-node-b",
        "gpu": 2,
        "uuid": uuid(0xB2),
        "xid": 48,
        "class": "reset",
        "time": "2026-11-26T08:01:00Z",
    }
    assert rulebook.post(other) == (200, '{"events": 1}')
    rulebook.settle()

    # One run per class the burst holds (the throttle groups by node and class), each limited to the node.
    runs_a = rulebook.recorded_for("eda-node-a")
    (run_b,) = rulebook.recorded_for("eda-node-b")
    assert len(rulebook.recorded()) == 4
    assert sorted(run["ansible_eda"]["event"]["gpu_alert"]["class"] for run in runs_a) == ["reboot", "replace", "reset"]
    for run_a in runs_a:
        assert (run_a["limit"], run_a["hosts"]) == ("eda-node-a", ["eda-node-a"])
        assert run_a["ansible_eda"]["rule"] == REMEDIATE_RULE
    assert (run_b["limit"], run_b["hosts"]) == ("eda-node-b", ["eda-node-b"])
    assert run_b["ansible_eda"]["event"]["gpu_alert"] == {
        "node": "eda-node-b",
        "gpu": 2,
        "uuid": uuid(0xB2),
        "xid": 48,
        "class": "reset",
    }


def test_classes_none_and_device_run_nothing(rulebook):
    for klass, xid in (("none", 13), ("device", 31)):
        alert = {"node": "eda-node-c", "gpu": 1, "uuid": uuid(xid), "xid": xid, "class": klass}
        assert rulebook.post(alert) == (200, '{"events": 1}')
    rulebook.settle()
    output = rulebook.output()
    assert f"gpu_alerts: node eda-node-c GPU 1 ({uuid(13)}) XID 13 is of class none; no node action" in output
    assert f"gpu_alerts: node eda-node-c GPU 1 ({uuid(31)}) XID 31 is of class device; no node action" in output
    assert rulebook.recorded_for("eda-node-c") == []


def test_an_alertmanager_notification_runs_the_playbook_for_its_firing_alert(rulebook):
    def alert(status, labels):
        return {
            "status": status,
            "labels": {"alertname": "GPUFault", **labels},
            "annotations": {"summary": "GPU fault"},
            "startsAt": "2026-11-26T08:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus.invalid/graph",
            "fingerprint": "c0ffee",
        }

    notification = {
        "version": "4",
        "groupKey": '{}:{alertname="GPUFault"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "gpuops-eda",
        "groupLabels": {"alertname": "GPUFault"},
        "commonLabels": {"alertname": "GPUFault"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.invalid",
        "alerts": [
            alert("firing", {"node": "eda-node-e", "gpu": uuid(0xE0), "class": "reset", "xid": "48"}),
            alert("resolved", {"node": "eda-node-f", "gpu": uuid(0xF0), "class": "reboot"}),
        ],
    }
    assert rulebook.post(notification) == (200, '{"events": 1}')
    rulebook.settle()
    (run,) = rulebook.recorded_for("eda-node-e")
    assert run["limit"] == "eda-node-e"
    assert run["ansible_eda"]["event"]["gpu_alert"] == {
        "node": "eda-node-e",
        "gpu": None,
        "uuid": uuid(0xE0),
        "xid": 48,
        "class": "reset",
    }
    assert rulebook.recorded_for("eda-node-f") == []


def test_a_bad_body_gets_400_with_one_sentence_and_runs_nothing(rulebook):
    bad = [
        (b"{not json", "The request body is not JSON."),
        (
            json.dumps({"node": "eda-node-d", "xid": 79, "class": "explode"}).encode(),
            "The alert's class 'explode' is not one of none, device, reset, reboot, replace.",
        ),
        (
            json.dumps({"node": "eda-node-d", "xid": "seventy-nine", "class": "reboot"}).encode(),
            "The alert's xid must be a non-negative integer of at most 10 digits, not 'seventy-nine'.",
        ),
        (
            json.dumps({"node": "all", "class": "reboot"}).encode(),
            "The alert's node 'all' is not a Kubernetes node name.",
        ),
        # Deep nesting (a RecursionError in the parser), integers of thousands of digits (int()'s limit) and a
        # uuid that is not one: 400 with a sentence, never 500.
        (b"[" * 100000 + b"]" * 100000, "The request body nests deeper than 100 levels."),
        (
            b'{"node": "eda-node-d", "class": "reset", "xid": ' + b"7" * 5000 + b"}",
            "The request body holds an integer of more than 18 digits.",
        ),
        (
            json.dumps({"node": "eda-node-d", "class": "reset", "xid": "7" * 5000}).encode(),
            "The alert's xid must be a non-negative integer of at most 10 digits, not a string of 5000 characters.",
        ),
        (
            json.dumps({"node": "eda-node-d", "class": "reset", "uuid": "GPU-0\nforged"}).encode(),
            "The alert's uuid 'GPU-0\\nforged' is not a GPU or MIG device UUID.",
        ),
    ]
    for body, sentence in bad:
        assert rulebook.post(body) == (400, f"{sentence}\n")
    rulebook.settle()
    assert rulebook.recorded_for("eda-node-d") == []
    assert rulebook.recorded_for("all") == []
    assert "eda-node-d" not in rulebook.output()


def test_a_request_without_the_token_gets_401_and_runs_nothing(rulebook):
    alert = {"node": "eda-node-g", "gpu": 0, "uuid": uuid(0x60), "xid": 79, "class": "reboot"}
    assert rulebook.post(alert, token=None) == (401, "The request lacks the expected bearer token.\n")
    # With a node secret any bearer token may be a node's: it is checked against the node the alert names.
    assert rulebook.post(alert, token="not-the-token") == (
        401,
        "The request's bearer token is not the token of node 'eda-node-g'.\n",
    )
    rulebook.settle()
    assert rulebook.recorded_for("eda-node-g") == []
    # No event: the node is named only in the source's log line that refused it.
    assert [line for line in rulebook.output().splitlines() if "eda-node-g" in line and "refused" not in line] == []


def alert_of(node: str, klass: str = "reboot", gpu: int = 0) -> dict:
    return {
        "node": node,
        "gpu": gpu,
        "uuid": uuid(gpu),
        "xid": {"reset": 48, "reboot": 79}.get(klass, 31),
        "class": klass,
    }


def test_all_newline_and_a_group_name_change_nothing_outside_the_alerts_node(rulebook):
    # A name with a newline is refused by the source: Ansible would split the limit on it.
    for name in ("all\n", "eda-node-h\n"):
        assert rulebook.post(alert_of(name)) == (400, f"The alert's node {name!r} is not a Kubernetes node name.\n")
    # A group's name is a DNS name the source cannot tell from a node's: the run starts, limited to the group, and
    # remediate.yml's first check stops it on every host of the group before anything is recorded (or done).
    assert rulebook.post(alert_of("eda-workers")) == (200, '{"events": 1}')
    rulebook.settle()
    assert rulebook.recorded_for("eda-workers") == []
    assert rulebook.recorded_for("all\n") == [] and rulebook.recorded_for("eda-node-h\n") == []
    assert not any(
        set(run["hosts"]) - {run["ansible_eda"]["event"]["gpu_alert"]["node"]} for run in rulebook.recorded()
    )
    for node in WORKERS:
        assert (
            f'{node}: a run for the alert of node "eda-workers" acts on that one host of "gpu_nodes" alone, not on'
            ' 3 host(s) with the limit "eda-workers"; nothing was done.'
        ) in rulebook.output()
    # The node's own alert runs the playbook on that node alone.
    assert rulebook.post(alert_of("eda-node-h")) == (200, '{"events": 1}')
    rulebook.settle()
    (run,) = rulebook.recorded_for("eda-node-h")
    assert (run["limit"], run["hosts"]) == ("eda-node-h", ["eda-node-h"])


def test_a_nodes_token_sends_alerts_for_that_node_alone(rulebook):
    token = rulebook.node_token("eda-node-j")
    assert len(token) == 64
    assert rulebook.post(alert_of("eda-node-k"), token=token) == (
        401,
        "The request's bearer token is not the token of node 'eda-node-k'.\n",
    )
    assert rulebook.post(alert_of("eda-node-j"), token=token) == (200, '{"events": 1}')
    rulebook.settle()
    assert rulebook.recorded_for("eda-node-k") == []
    (run,) = rulebook.recorded_for("eda-node-j")
    assert run["hosts"] == ["eda-node-j"]


def test_a_reboot_after_a_reset_within_the_window_starts_its_own_run(rulebook):
    assert rulebook.post(alert_of("eda-node-l", "reset", gpu=1)) == (200, '{"events": 1}')
    rulebook.settle()
    assert rulebook.post(alert_of("eda-node-l", "reboot", gpu=2)) == (200, '{"events": 1}')
    # The same class again within the window: one run is enough (the playbook reads every GPU of the node).
    assert rulebook.post(alert_of("eda-node-l", "reboot", gpu=3)) == (200, '{"events": 1}')
    rulebook.settle()
    runs = rulebook.recorded_for("eda-node-l")
    assert sorted(run["ansible_eda"]["event"]["gpu_alert"]["class"] for run in runs) == ["reboot", "reset"]


def test_a_flooding_node_gets_429_and_other_nodes_get_through(rulebook):
    token = rulebook.node_token("eda-node-m")
    answers = [rulebook.post(alert_of("eda-node-m", "device"), token=token) for _try in range(BURST + 3)]
    assert answers[:BURST] == [(200, '{"events": 1}')] * BURST
    assert (
        answers[BURST:]
        == [
            (
                429,
                f"Node 'eda-node-m' sent more than {BURST} alerts at once or 1 a minute; send the alert again later.\n",
            )
        ]
        * 3
    )
    assert rulebook.post(alert_of("eda-node-n", "device")) == (200, '{"events": 1}')


def test_one_invalid_alert_of_an_alertmanager_group_does_not_hold_back_the_others(rulebook):
    notification = {
        "version": "4",
        "status": "firing",
        "receiver": "gpuops-eda",
        "alerts": [
            {"status": "firing", "labels": {"alertname": "GPUFault", "node": "eda-node-i", "class": "melt"}},
            {"status": "firing", "labels": {"alertname": "GPUFault", "node": "eda-node-i", "class": "reset"}},
        ],
    }
    status, text = rulebook.post(notification)
    assert (status, json.loads(text)) == (
        207,
        {
            "events": 1,
            "refused": [
                {
                    "alert": 1,
                    "status": 400,
                    "reason": "Alert 1's label class 'melt' is not one of none, device, reset, reboot, replace.",
                }
            ],
        },
    )
    rulebook.settle()
    (run,) = rulebook.recorded_for("eda-node-i")
    assert run["hosts"] == ["eda-node-i"]


REMEDIATE_CHECK = "Check that a run for an alert acts on the alert's node alone"


def remediate_check(tmp_path: Path, limit: str, extra: dict) -> dict[str, dict]:
    """The real playbooks/remediate.yml run by ansible-playbook with LIMIT and EXTRA as extra variables, only as far
    as the tasks tagged always (the check, and need_root): its check's result for each host it ran on."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_nodes": {"hosts": {"gpu-1": None, "gpu-2": None}},
                        "workers": {"hosts": {"gpu-1": None, "gpu-2": None}},
                        "solo": {"hosts": {"gpu-2": None}},
                    },
                    "vars": {"ansible_connection": "local", "ansible_become": False},
                }
            }
        )
    )
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            str(REPO / "playbooks/remediate.yml"),
            "--limit",
            limit,
            "--tags",
            "no-such-tag",
            "-e",
            json.dumps({"ansible_python_interpreter": sys.executable, **extra}),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    output = json.loads(proc.stdout)
    (check,) = [task for task in output["plays"][0]["tasks"] if task["task"]["name"] == REMEDIATE_CHECK]
    return check["hosts"]


# Each case is one ansible-playbook run (seconds): a few that cover the check's parts.
@pytest.mark.parametrize(
    "limit, extra",
    [
        # The limit is not the node's name (Ansible splits "all\n" into every host).
        ("all\n", {"gpuops_alert_node": "gpu-1"}),
        # The node is a group's name: the hosts are that group's, not one host named so.
        ("solo", {"ansible_eda": {"event": {"gpu_alert": {"node": "solo"}}}}),
        # The variable and the event disagree.
        ("gpu-1", {"gpuops_alert_node": "gpu-1", "ansible_eda": {"event": {"gpu_alert": {"node": "gpu-2"}}}}),
    ],
)
def test_remediate_yml_refuses_a_run_for_an_alert_on_more_or_other_than_its_node(tmp_path, limit, extra):
    results = remediate_check(tmp_path, limit, extra)
    assert results and all(result.get("failed") for result in results.values()), results
    for host, result in results.items():
        assert result["msg"].startswith(f"{host}: a run for the alert of node ")
        assert result["msg"].endswith("; nothing was done.")


def test_remediate_yml_runs_for_an_alert_on_its_node(tmp_path):
    results = remediate_check(tmp_path, "gpu-2", {"ansible_eda": {"event": {"gpu_alert": {"node": "gpu-2"}}}})
    assert list(results) == ["gpu-2"] and not results["gpu-2"].get("failed"), results


def test_remediate_yml_runs_over_the_gpu_group_when_no_alert_asks(tmp_path):
    results = remediate_check(tmp_path, "workers", {})
    assert sorted(results) == ["gpu-1", "gpu-2"]
    assert all(result.get("skipped") for result in results.values()), results


def test_the_device_plugin_role_puts_only_the_nodes_derived_token_on_the_node(tmp_path):
    """The role's token tasks (roles/device_plugin/tasks/alert_token.yml, which its main.yml imports first) run by a
    real ansible-playbook on localhost: check mode writes nothing, the file holds the node's token and not the
    secret, 0600, a second run changes nothing, and state absent removes it. Then the daemonset-mode path check."""
    token_file = tmp_path / "etc/alert-token"
    token_file.parent.mkdir()
    playbook = tmp_path / "token.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {
                                "name": "gpuops.k8s.device_plugin",
                                "tasks_from": "alert_token.yml",
                            }
                        }
                    ],
                }
            ]
        )
    )
    subprocess.run([str(REPO / "scripts/collection-tree.sh")], check=True, stdout=subprocess.DEVNULL, timeout=300)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".build"),
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_NOCOLOR="1",
    )

    def run(*extra, **variables):
        values = {
            "ansible_python_interpreter": sys.executable,
            "device_plugin_node_name": "gpu-node-7",
            "device_plugin_alert_secret": NODE_SECRET,
            "device_plugin_alert_webhook_token_file": str(token_file),
            **variables,
        }
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-playbook"),
                *("-i", "localhost,", "-c", "local", str(playbook)),
                *("-e", json.dumps(values), *extra),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        output = json.loads(proc.stdout)
        return proc.returncode, output["stats"]["localhost"], output

    rc, stats, _output = run("--check")
    assert (rc, stats["changed"], token_file.exists()) == (0, 1, False)
    rc, stats, output = run()
    assert (rc, stats["changed"]) == (0, 1)
    expected = hmac.new(NODE_SECRET.encode(), b"gpu-node-7", hashlib.sha256).hexdigest()
    assert token_file.read_text() == expected
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert NODE_SECRET not in json.dumps(output)
    assert run()[:2][1]["changed"] == 0
    rc, stats, _output = run(device_plugin_state="absent")
    assert (rc, stats["changed"], token_file.exists()) == (0, 1, False)
    rc, _stats, output = run(
        device_plugin_mode="daemonset", device_plugin_alert_webhook_token_file="/etc/gpuops/device-plugin/token"
    )
    assert rc != 0
    assert "lies under /etc/gpuops/device-plugin, where the DaemonSet's pods mount their ConfigMap" in json.dumps(
        output
    )


# The job template rulebook, gpuops.k8s.gpu_remediation_job_template, against a test double of the controller's API.

CONTROLLER_TOKEN = "gpuops-eda-test-controller-token"
JOB_TEMPLATE = "gpu-remediate"  # the rulebook's default gpu_remediation_job_template
ORGANIZATION = "gpu-fleet"  # set through gpu_remediation_organization (the default, Default, holds a decoy)
TEMPLATE_ID = 42
FAILING_NODE = "eda-jt-node-f"


class Controller:
    """A TEST DOUBLE of the AWX (automation controller) API: exactly the endpoints ansible-rulebook 1.3.2's
    run_job_template calls, read from its source (ansible_rulebook/ in the venv scripts/eda-env.sh builds), and
    nothing else (any other request is answered 404 and counted in ``unexpected``):

    - ``GET /api/v2/config/``, answered with a ``version``: app.py ``validate_actions`` asks for a controller when a
      rule runs a job template and ``validate_controller_params`` calls ``JobTemplateRunner.get_config``
      (job_template_runner.py) before any source starts. The URL and token come from EDA_CONTROLLER_URL and
      EDA_CONTROLLER_TOKEN (cli.py, the defaults of --controller-url and --controller-token); a URL without a path
      gets the ``api/v2/`` paths (``JobTemplateRunner._set_slugs``). Every request carries
      ``Authorization: Bearer TOKEN`` (``JobTemplateRunner._auth_headers``); the double refuses others with 401.
    - ``GET /api/v2/unified_job_templates/?name=NAME``, then ``&page=2`` and on while the answer has a ``next``
      (``JobTemplateRunner._get_template_obj``): the template is the result whose ``type`` is ``job_template``, whose
      ``name`` is NAME and whose ``summary_fields.organization.name`` is the organization; ansible-rulebook reads its
      ``id``, ``related.launch`` and ``ask_limit_on_launch``, ``ask_labels_on_launch``, ``ask_inventory_on_launch``,
      ``ask_variables_on_launch``. Page 1 holds decoys: the same name in the organization Default, and a workflow
      job template of that name in the right one; the template is on page 2.
    - labels: only for a template that asks for them on launch (``JobTemplateRunner._get_labels_for_job``, which
      then reads ``organizations/`` and ``labels/``); this one does not, so no label endpoint exists here.
    - ``POST`` to ``related.launch`` with the action's ``job_args`` as the JSON body
      (``JobTemplateRunner.launch_job_template``, ``_launch``); ansible-rulebook reads the answer's ``url``. The
      body's ``limit`` is the rulebook's (``util.process_controller_host_limit``, called by
      ``RunJobTemplate.__init__`` in action/run_job_template.py: the event's hosts only when the rulebook sets
      none), and ``extra_vars`` gets ``ansible_eda`` (ruleset, rule, event) added by ``Helper.collect_extra_vars``
      (action/helper.py; ``include_events`` defaults to true).
    - ``GET /api/v2/jobs/?id__in=IDS&page_size=N`` (shared_job_monitor.py ``SharedJobMonitor._poll_job_chunk``; the
      id is the last segment of the job's URL, ``register_job``), every EDA_JOB_TEMPLATE_REFRESH_DELAY seconds
      (``JobTemplateRunner.__init__``, default 10) until ``status`` is one of successful, failed, error, canceled
      (``JobTemplateRunner.JOB_COMPLETION_STATUSES``). The double answers ``running`` to a job's first poll, then
      its end: ``failed`` for FAILING_NODE's jobs, ``successful`` for the others. ``RunJobTemplate._post_process``
      reads the job's ``created`` and ``id``.
    - A failed job is retried only with ``retry`` or ``retries`` (``RunJobTemplate._run_with_retries``; the rulebook
      sets neither) and is logged by ``Helper.log_completion`` at ERROR, "Job template 'NAME' failed (job_id: N)",
      which ansible-rulebook prints without -v (cli.py ``setup_logging_and_display``: WARNING and above).
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[dict] = []  # every request: method, path, query, authorization, body
        self.timeline: list[tuple] = []  # ("launch", job id) and ("end", job id, status), in the order they came
        self.launches: list[dict] = []  # each launch's body, with the job's id
        self.unexpected: list[str] = []
        self.jobs: dict[int, dict] = {}
        self.ids = itertools.count(100)
        controller = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args):
                pass

            def do_GET(self):
                self.answer()

            def do_POST(self):
                self.answer()

            def answer(self):
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = {
                    "method": self.command,
                    "path": url.path,
                    "query": urllib.parse.parse_qs(url.query),
                    "authorization": self.headers.get("Authorization"),
                    "body": json.loads(raw) if raw else None,
                }
                with controller.lock:
                    controller.requests.append(request)
                    status, body = controller.route(request)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def template(template_id: int, kind: str, organization: str) -> dict:
        launch = f"/api/v2/{kind}s/{template_id}/launch/"
        return {
            "id": template_id,
            "type": kind,
            "name": JOB_TEMPLATE,
            "summary_fields": {"organization": {"id": template_id, "name": organization}},
            "related": {"launch": launch},
            "ask_limit_on_launch": True,
            "ask_labels_on_launch": False,
            "ask_inventory_on_launch": False,
            "ask_variables_on_launch": True,
        }

    def route(self, request: dict) -> tuple[int, dict]:
        method, path, query = request["method"], request["path"], request["query"]
        if request["authorization"] != f"Bearer {CONTROLLER_TOKEN}":
            self.unexpected.append(f"{method} {path} without the token")
            return 401, {"detail": "Authentication credentials were not provided."}
        if (method, path) == ("GET", "/api/v2/config/"):
            return 200, {"version": "24.6.1"}
        if (method, path) == ("GET", "/api/v2/unified_job_templates/"):
            pages = [
                [self.template(7, "job_template", "Default"), self.template(9, "workflow_job_template", ORGANIZATION)],
                [self.template(TEMPLATE_ID, "job_template", ORGANIZATION)],
            ]
            page = int(query.get("page", ["1"])[0])
            results = [item for item in pages[page - 1] if [item["name"]] == query.get("name")]
            more = f"/api/v2/unified_job_templates/?page={page + 1}" if page < len(pages) else None
            return 200, {"count": 3, "next": more, "previous": None, "results": results}
        if (method, path) == ("POST", f"/api/v2/job_templates/{TEMPLATE_ID}/launch/"):
            job = next(self.ids)
            node = (request["body"].get("extra_vars") or {}).get("gpuops_alert_node")
            self.jobs[job] = {"polls": 0, "end": "failed" if node == FAILING_NODE else "successful"}
            self.launches.append({"job": job, **request["body"]})
            self.timeline.append(("launch", job))
            url = f"/api/v2/jobs/{job}/"
            return 201, {"job": job, "id": job, "type": "job", "url": url, "status": "pending", "ignored_fields": {}}
        if (method, path) == ("GET", "/api/v2/jobs/"):
            results = []
            for job in query["id__in"][0].split(","):
                state = self.jobs[int(job)]
                state["polls"] += 1
                status = "running" if state["polls"] == 1 else state["end"]
                if state["polls"] == 2:
                    self.timeline.append(("end", int(job), status))
                created = "2026-11-26T08:00:00.000000Z"
                results.append({"id": int(job), "status": status, "created": created, "artifacts": {}})
            return 200, {"count": len(results), "next": None, "previous": None, "results": results}
        self.unexpected.append(f"{method} {path}")
        return 404, {"detail": "Not found."}

    def launches_for(self, node: str) -> list[dict]:
        with self.lock:
            return [launch for launch in self.launches if launch["limit"] == node]


@pytest.fixture(scope="module")
def controller():
    double = Controller()
    yield double
    double.close()


@pytest.fixture(scope="module")
def job_template_rulebook(eda_venv, collections, controller):
    """The job template rulebook, as a controller's activation runs it: no inventory, the controller's address and
    token in the environment; its organization from its variable, its job template's name its default."""
    with started(
        eda_venv,
        collections,
        "gpu_remediation_job_template",
        {"gpu_remediation_organization": ORGANIZATION},
        [],
        {
            "EDA_CONTROLLER_URL": controller.url,
            "EDA_CONTROLLER_TOKEN": CONTROLLER_TOKEN,
            "EDA_JOB_TEMPLATE_REFRESH_DELAY": "0.1",
        },
    ) as book:
        yield book


def test_the_job_template_rulebook_launches_the_template_once_per_node_and_class_limited_to_the_node(
    job_template_rulebook, controller, tmp_path
):
    book = job_template_rulebook
    burst = [
        alert_of("eda-jt-node-a", ("reboot", "reset", "reboot", "replace")[i % 4], gpu=i % 8) for i in range(BURST)
    ]
    with ThreadPoolExecutor(max_workers=len(burst)) as pool:
        assert list(pool.map(book.post, burst)) == [(200, '{"events": 1}')] * BURST
    # A node of remediate_check's inventory: its launch is then run through the real remediate.yml's check.
    assert book.post(alert_of("gpu-2", "reset", gpu=2)) == (200, '{"events": 1}')
    book.settle()

    launches_a = controller.launches_for("eda-jt-node-a")
    (launch_2,) = controller.launches_for("gpu-2")
    assert len(controller.launches) == 4
    assert sorted(launch["extra_vars"]["ansible_eda"]["event"]["gpu_alert"]["class"] for launch in launches_a) == [
        "reboot",
        "replace",
        "reset",
    ]
    for launch, node in [*((launch, "eda-jt-node-a") for launch in launches_a), (launch_2, "gpu-2")]:
        assert set(launch) == {"job", "limit", "extra_vars"}
        assert launch["limit"] == node
        eda = launch["extra_vars"]["ansible_eda"]
        assert set(launch["extra_vars"]) == {"gpuops_alert_node", "ansible_eda"}
        assert launch["extra_vars"]["gpuops_alert_node"] == node
        assert (eda["ruleset"], eda["rule"], eda["event"]["gpu_alert"]["node"]) == (
            "GPU fault remediation",
            REMEDIATE_RULE,
            node,
        )
    assert launch_2["extra_vars"]["ansible_eda"]["event"]["gpu_alert"] == {
        "node": "gpu-2",
        "gpu": 2,
        "uuid": uuid(2),
        "xid": 48,
        "class": "reset",
    }

    with controller.lock:
        requests = list(controller.requests)
        timeline = list(controller.timeline)
    assert controller.unexpected == []
    assert requests[0]["path"] == "/api/v2/config/"
    # The template looked up by its name, through both pages, before each launch; the launch went to the one of
    # the organization the variable names.
    lookups = [request["query"] for request in requests if request["path"] == "/api/v2/unified_job_templates/"]
    assert lookups == [{"name": [JOB_TEMPLATE]}, {"name": [JOB_TEMPLATE], "page": ["2"]}] * 4
    launched = [request["path"] for request in requests if request["method"] == "POST"]
    assert launched == [f"/api/v2/job_templates/{TEMPLATE_ID}/launch/"] * 4
    # One job at a time: each launch comes after the job before it ended (the sequential strategy, and
    # run_job_template waiting for its job).
    assert [event[0] for event in timeline] == ["launch", "end"] * 4
    assert all(event[2] == "successful" for event in timeline if event[0] == "end")

    # What the controller would run: the real remediate.yml with the launch's limit and extra variables passes its
    # alert check on that one node.
    results = remediate_check(tmp_path, launch_2["limit"], launch_2["extra_vars"])
    assert list(results) == ["gpu-2"] and not results["gpu-2"].get("failed"), results


def test_the_job_template_rulebook_launches_nothing_for_classes_none_and_device(job_template_rulebook, controller):
    book = job_template_rulebook
    for klass, xid in (("none", 13), ("device", 31)):
        alert = {"node": "eda-jt-node-c", "gpu": 1, "uuid": uuid(xid), "xid": xid, "class": klass}
        assert book.post(alert) == (200, '{"events": 1}')
    book.settle()
    output = book.output()
    assert f"gpu_alerts: node eda-jt-node-c GPU 1 ({uuid(13)}) XID 13 is of class none; no node action" in output
    assert f"gpu_alerts: node eda-jt-node-c GPU 1 ({uuid(31)}) XID 31 is of class device; no node action" in output
    assert controller.launches_for("eda-jt-node-c") == []
    assert controller.unexpected == []


def test_the_job_template_rulebook_reports_a_failed_job_and_goes_on(job_template_rulebook, controller):
    book = job_template_rulebook
    assert book.post(alert_of(FAILING_NODE, "reboot")) == (200, '{"events": 1}')
    assert book.post(alert_of("eda-jt-node-g", "reset")) == (200, '{"events": 1}')
    book.settle()
    (failed,) = controller.launches_for(FAILING_NODE)  # not retried
    (after,) = controller.launches_for("eda-jt-node-g")
    assert f"Job template '{JOB_TEMPLATE}' failed (job_id: {failed['job']})" in book.output()
    with controller.lock:
        timeline = list(controller.timeline)
    assert timeline.index(("end", failed["job"], "failed")) < timeline.index(("launch", after["job"]))
    assert ("end", after["job"], "successful") in timeline
    assert controller.unexpected == []
