"""Event-Driven Ansible: the shipped rulebook, gpuops.k8s.gpu_remediation, run by a real ansible-rulebook.

The peers are real: ansible-rulebook 1.3.2 with its Drools rule engine (requirements/eda.txt, built and cached by
scripts/eda-env.sh) on Debian's OpenJDK 17 (scripts/bootstrap.sh), loading the rulebook and the gpuops.k8s.gpu_alerts
event source from the collection as ``ansible-galaxy collection build`` would ship it (scripts/collection-tree.sh on
ANSIBLE_COLLECTIONS_PATH). Alerts are POSTed to the source over HTTP on 127.0.0.1 with its bearer token.
The playbook the rulebook starts is a TEST DOUBLE standing in for gpuops.k8s.remediate: the collection
``gpuops_test.doubles`` written below, whose ``remediate_recorder`` playbook records each run's limit, hosts and
``ansible_eda`` extra variables in a file and changes nothing; the rulebook is pointed at it through its
``gpu_remediation_playbook`` variable. One rulebook process serves the module; each test uses nodes of its own.
Nothing sleeps and then asserts: a test that needs every earlier alert handled posts a class ``none`` alert and
waits for the rulebook to print it (the rulebook's actions run one at a time, in the order the alerts came).
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from local_api import wait_for

REPO = Path(__file__).resolve().parents[2]
TOKEN = "gpuops-eda-test-token"
NODES = [f"eda-node-{letter}" for letter in "abcdefgh"]
REMEDIATE_RULE = "Remediate a node with a GPU to reset, a reboot to make or a GPU to replace"

RECORDER_PLAYBOOK = """\
---
# TEST DOUBLE for gpuops.k8s.remediate: records the run and changes nothing.
- name: Record a remediation run
  hosts: all
  gather_facts: false
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
    """ansible-rulebook running gpuops.k8s.gpu_remediation, its output in ``log``, its recorded runs in ``runs``."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path, runs: Path):
        self.proc, self.port, self.log, self.runs = proc, port, log, runs
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
        uuid = f"GPU-sentinel-{next(self.sentinels)}"
        status, text = self.post({"node": "eda-sentinel", "gpu": 0, "uuid": uuid, "xid": 13, "class": "none"})
        assert (status, json.loads(text)) == (200, {"events": 1}), text
        line = f"gpu_alerts: node eda-sentinel GPU 0 ({uuid}) XID 13 is of class none; no node action is taken."
        self.wait(f"the rulebook to print the alert of {uuid}", lambda: line in self.output())

    def recorded(self) -> list[dict]:
        return [json.loads(path.read_text()) for path in sorted(self.runs.glob("*.json"))]

    def recorded_for(self, node: str) -> list[dict]:
        return [run for run in self.recorded() if run["ansible_eda"]["event"]["gpu_alert"]["node"] == node]


@pytest.fixture(scope="module")
def eda_venv() -> Path:
    # Builds on the first call (about a minute), then comes from $GPUOPS_CACHE.
    proc = subprocess.run([str(REPO / "scripts/eda-env.sh")], capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rulebook(eda_venv, tmp_path_factory):
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
    (collection / "playbooks/remediate_recorder.yml").write_text(RECORDER_PLAYBOOK)
    (collection / "playbooks/tasks/record.yml").write_text(RECORD_TASKS)

    inventory = work / "inventory.yml"
    python = str(eda_venv / "bin/python")
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {node: None for node in NODES},
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": python},
                }
            }
        )
    )
    port = free_port()
    variables = work / "vars.yml"
    variables.write_text(
        yaml.safe_dump(
            {
                "gpu_alerts_port": port,
                "gpu_alerts_token": TOKEN,
                "gpu_remediation_playbook": "gpuops_test.doubles.remediate_recorder",
            }
        )
    )
    runs = work / "runs"
    runs.mkdir()
    log = work / "ansible-rulebook.log"
    env = dict(
        os.environ,
        PATH=f"{eda_venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        JAVA_HOME=str(java_home()),
        ANSIBLE_COLLECTIONS_PATH=f"{shipped}{os.pathsep}{doubles}",
        ANSIBLE_NOCOLOR="1",
        PYTHONUNBUFFERED="1",
        GPUOPS_EDA_RECORDER_DIR=str(runs),
    )
    command = [
        str(eda_venv / "bin/ansible-rulebook"),
        "--rulebook",
        "gpuops.k8s.gpu_remediation",
        "--inventory",
        str(inventory),
        "--vars",
        str(variables),
        # Every event the source puts on the queue is printed: a test can tell that a request made none.
        "--print-events",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
    book = Rulebook(proc, port, log, runs)
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


def test_a_burst_of_alerts_on_a_node_is_one_playbook_run_for_that_node(rulebook):
    burst = [
        {
            "node": "eda-node-a",
            "gpu": i % 8,
            "uuid": f"GPU-0000000{i % 8}",
            "xid": (79, 48, 74, 95)[i % 4],
            "class": ("reboot", "reset", "reboot", "replace")[i % 4],
            "time": f"2026-11-26T08:00:{i:02d}Z",
        }
        for i in range(20)
    ]
    with ThreadPoolExecutor(max_workers=len(burst)) as pool:
        answers = list(pool.map(rulebook.post, burst))
    assert answers == [(200, '{"events": 1}')] * 20
    other = {
        "node": "eda-node-b",
        "gpu": 2,
        "uuid": "GPU-b2",
        "xid": 48,
        "class": "reset",
        "time": "2026-11-26T08:01:00Z",
    }
    assert rulebook.post(other) == (200, '{"events": 1}')
    rulebook.settle()

    (run_a,) = rulebook.recorded_for("eda-node-a")
    (run_b,) = rulebook.recorded_for("eda-node-b")
    assert len(rulebook.recorded()) == 2
    assert (run_a["limit"], run_a["hosts"]) == ("eda-node-a", ["eda-node-a"])
    assert (run_b["limit"], run_b["hosts"]) == ("eda-node-b", ["eda-node-b"])
    assert run_a["ansible_eda"]["rule"] == REMEDIATE_RULE
    assert run_a["ansible_eda"]["event"]["gpu_alert"]["class"] in {"reset", "reboot", "replace"}
    assert run_b["ansible_eda"]["event"]["gpu_alert"] == {
        "node": "eda-node-b",
        "gpu": 2,
        "uuid": "GPU-b2",
        "xid": 48,
        "class": "reset",
    }


def test_classes_none_and_device_run_nothing(rulebook):
    for klass, xid in (("none", 13), ("device", 31)):
        alert = {"node": "eda-node-c", "gpu": 1, "uuid": f"GPU-c-{klass}", "xid": xid, "class": klass}
        assert rulebook.post(alert) == (200, '{"events": 1}')
    rulebook.settle()
    output = rulebook.output()
    assert "gpu_alerts: node eda-node-c GPU 1 (GPU-c-none) XID 13 is of class none; no node action" in output
    assert "gpu_alerts: node eda-node-c GPU 1 (GPU-c-device) XID 31 is of class device; no node action" in output
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
            alert("firing", {"node": "eda-node-e", "gpu": "GPU-e0", "class": "reset", "xid": "48"}),
            alert("resolved", {"node": "eda-node-f", "gpu": "GPU-f0", "class": "reboot"}),
        ],
    }
    assert rulebook.post(notification) == (200, '{"events": 1}')
    rulebook.settle()
    (run,) = rulebook.recorded_for("eda-node-e")
    assert run["limit"] == "eda-node-e"
    assert run["ansible_eda"]["event"]["gpu_alert"] == {
        "node": "eda-node-e",
        "gpu": None,
        "uuid": "GPU-e0",
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
            "The alert's xid must be a non-negative integer, not 'seventy-nine'.",
        ),
        (
            json.dumps({"node": "all", "class": "reboot"}).encode(),
            "The alert's node 'all' is not a Kubernetes node name.",
        ),
    ]
    for body, sentence in bad:
        assert rulebook.post(body) == (400, f"{sentence}\n")
    rulebook.settle()
    assert rulebook.recorded_for("eda-node-d") == []
    assert rulebook.recorded_for("all") == []
    assert "eda-node-d" not in rulebook.output()


def test_a_request_without_the_token_gets_401_and_runs_nothing(rulebook):
    alert = {"node": "eda-node-g", "gpu": 0, "uuid": "GPU-g0", "xid": 79, "class": "reboot"}
    assert rulebook.post(alert, token=None) == (401, "The request lacks the expected bearer token.\n")
    assert rulebook.post(alert, token="not-the-token") == (401, "The request lacks the expected bearer token.\n")
    rulebook.settle()
    assert rulebook.recorded_for("eda-node-g") == []
    assert "eda-node-g" not in rulebook.output()
