"""The AWX job harness, for real: the execution environment built by scripts/build-ee.sh (podman,
ansible-builder, the local Debian 12 base) runs a small playbook the way AWX runs a job
(ansible-runner transmit | podman run EE ansible-runner worker | ansible-runner process), and the
job events say what the EE has: the controller-side Python libraries, the collections, the project's
gpuops.k8s, a non-root user. No test double: every peer is real (no cluster is needed here)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from runner_job import JobResult, run_job

PLAYBOOK = """\
---
- name: What an AWX job finds in the execution environment
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Import the controller-side libraries
      ansible.builtin.command: python3 -c "import kubernetes, jmespath, yaml; print(kubernetes.__version__)"
      register: libraries
      changed_when: false

    - name: The machine credential's key is in the job's ssh-agent
      ansible.builtin.command: ssh-add -l
      changed_when: false

    - name: Who runs the job
      ansible.builtin.command: id -u
      register: uid
      changed_when: false

    - name: Use a community.general filter and a kubernetes.core module
      kubernetes.core.k8s:
        state: present
        definition:
          apiVersion: v1
          kind: ConfigMap
          metadata: "{{ 'awx-probe' | community.general.dict_kv('name') }}"
      check_mode: true
      # Nothing listens where K8S_AUTH_HOST points: the module loads its client, fails to connect, and
      # the test asserts on that error (failed_when: false would drop its message under ansible-core 2.19).
      ignore_errors: true

    - name: Use the project's collection
      ansible.builtin.debug:
        msg: "{{ bare_node | gpuops.k8s.node_label_patch(wanted, taint=false) }}"
      vars:
        bare_node: {metadata: {labels: {}}, spec: {}}
        wanted: {nvidia.com/gpu.present: "true"}

    - name: Report
      ansible.builtin.debug:
        msg: "{{ greeting }} from uid {{ uid.stdout }}"

    - name: Change something, once
      ansible.builtin.command: "true"
      changed_when: true

- name: A failing play is reported per host
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Fail on purpose
      ansible.builtin.fail:
        msg: this one fails
      when: fail_on_purpose | bool
"""


@pytest.fixture(scope="session")
def machine_key() -> tuple[str, str]:
    """A machine credential's private key (OpenSSH format) and its SHA256 fingerprint."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    blob = base64.b64decode(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).split()[1]
    )
    return private, "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def run(ee_image: str, work_dir: Path, ssh_key: str, fail: bool) -> JobResult:
    return run_job(
        ee_image,
        "probe.yml",
        playbooks={"probe.yml": PLAYBOOK},
        inventory="localhost ansible_connection=local\n",
        extravars={"greeting": "hello", "fail_on_purpose": fail},
        ssh_key=ssh_key,
        work_dir=work_dir,
        # What AWX's Kubernetes bearer-token credential injects; nothing listens on that port.
        envvars={
            "K8S_AUTH_HOST": "https://127.0.0.1:1",
            "K8S_AUTH_API_KEY": "no-token",
            "K8S_AUTH_VERIFY_SSL": "false",
        },
        timeout=180,
    )


def test_a_job_runs_in_the_ee_as_awx_runs_it(ee_image: str, machine_key: tuple[str, str], tmp_path: Path) -> None:
    private_key, fingerprint = machine_key
    job = run(ee_image, tmp_path, private_key, fail=False)
    assert job.ok, job.summary()
    assert job.stats == {
        "localhost": {"ok": 7, "changed": 1, "unreachable": 0, "failed": 0, "skipped": 1, "rescued": 0, "ignored": 1}
    }, job.summary()
    assert job.changed_counts() == {"localhost": 1}
    assert job.changed_tasks() == [("localhost", "Change something, once")]
    assert job.failed_tasks() == []  # the kubernetes.core task's failure is ignored
    [libraries] = job.task_results("Import the controller-side libraries")
    assert libraries["stdout"] == "37.0.2", job.summary()
    [agent] = job.task_results("The machine credential's key is in the job's ssh-agent")
    assert fingerprint in agent["stdout"], agent
    [uid] = job.task_results("Who runs the job")
    assert uid["stdout"] == "1000"
    # kubernetes.core's module ran (the EE has the collection and the kubernetes library) and reached
    # for the API server the K8S_AUTH_* variables named: nothing listens there.
    [k8s_call] = job.task_results("Use a community.general filter and a kubernetes.core module")
    assert "HTTPSConnectionPool(host='127.0.0.1', port=1)" in k8s_call["msg"], k8s_call
    [report] = job.task_results("Report")
    assert report["msg"] == "hello from uid 1000"
    assert "hello from uid 1000" in job.stdout
    # ansible-runner put the key into the worker's ssh-agent before the playbook started.
    kinds = [event["event"] for event in job.events]
    assert kinds[:3] == ["verbose", "playbook_on_start", "playbook_on_play_start"], kinds
    assert job.events[0]["stdout"].startswith("Identity added: /runner/artifacts/")


def test_a_failed_task_fails_the_job_and_is_named(ee_image: str, machine_key: tuple[str, str], tmp_path: Path) -> None:
    job = run(ee_image, tmp_path, machine_key[0], fail=True)
    assert job.status == "failed" and job.rc == 2, job.summary()
    [failed] = job.failed_tasks()
    assert (failed.host, failed.task, failed.action, failed.message) == (
        "localhost",
        "Fail on purpose",
        "ansible.builtin.fail",
        "this one fails",
    )
    assert job.stats["localhost"]["failed"] == 1
