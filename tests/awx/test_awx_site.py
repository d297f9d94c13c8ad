"""playbooks/site.yml as an AWX job template runs it, against the SSH lab's nodes.

Every job goes through ansible-runner transmit | the execution environment's ``ansible-runner worker``
(podman, uid 1000) | ansible-runner process, with the private data directory AWX writes: the project
(the playbooks and this checkout's collection), the inventory, the machine credential's SSH key
(env/ssh_key: ansible-runner hands it to ssh-agent) and the Kubernetes credential's variables
(K8S_AUTH_HOST, K8S_AUTH_API_KEY, K8S_AUTH_VERIFY_SSL, K8S_AUTH_SSL_CA_CERT) in env/envvars. The
inventory names no controller-side kubeconfig and no key file: the roles reach the API only through those
variables, with a ServiceAccount token bound to the least the playbook needs. (The one kubeconfig it
names is a path on the nodes, the kubelet's own credentials a DRA node's driver uses.)

The first run is a sliced job (AWX's job slicing: one job per slice, each with its share of the
inventory's hosts) whose two slices run at the same time; the second run is one unsliced job over both
nodes and must change nothing. Asserted on the job events and through the API server.
"""

from __future__ import annotations

import copy
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from playbook_run import REPO, lab_inventory
from runner_job import JobResult, mirror_collection, run_job

GPU = "nvidia.com/gpu"
SPECS = ("h100x8", "t4x1")
PRODUCTS = {"h100x8": "NVIDIA-H100-80GB-HBM3", "t4x1": "Tesla-T4"}
NAMESPACE = "kube-system"
ACCOUNT = "gpuops-awx"
# Labels and taints written by someone else before the job: the job must keep every one of them.
FOREIGN_LABEL = ("example.com/rack", "r42")
KNOWN_HOSTS = "env/known_hosts"


@dataclass
class AwxSetup:
    nodes: list[str]
    inventory: dict[str, Any]
    envvars: dict[str, str]
    files: dict[str, str]
    ssh_key: str
    playbooks: dict[str, str]
    lab_inventory: dict[str, Any]
    collection: Path


def project_playbooks() -> dict[str, str]:
    """The project's playbooks/ as AWX checks it out (site.yml imports tasks/need_root.yml)."""
    root = REPO / "playbooks"
    return {f"playbooks/{p.relative_to(root)}": p.read_text() for p in sorted(root.rglob("*.yml"))}


def awx_inventory(lab_inv: dict[str, Any]) -> dict[str, Any]:
    """The lab's SSH inventory as an AWX inventory holds it: no key file (the machine credential gives
    the key), no kubeconfig (the Kubernetes credential gives the API), known_hosts inside the job."""
    inv = copy.deepcopy(lab_inv)
    group = inv["all"]["children"]["gpu_nodes"]["vars"]
    for name in ("ansible_ssh_private_key_file", "gpu_node_labels_kubeconfig", "device_plugin_kubeconfig"):
        group.pop(name)
    known_hosts = [a for a in group["ansible_ssh_common_args"].split() if a.startswith("UserKnownHostsFile=")]
    assert len(known_hosts) == 1, group["ansible_ssh_common_args"]
    # The key arrives in the job's ssh-agent, which IdentitiesOnly (no IdentityFile given) would ignore.
    group["ansible_ssh_common_args"] = (
        group["ansible_ssh_common_args"]
        .replace(known_hosts[0], f"UserKnownHostsFile=/runner/{KNOWN_HOSTS}")
        .replace("-o IdentitiesOnly=yes", "")
        .strip()
    )
    return inv


def slice_of(inv: dict[str, Any], index: int, count: int) -> dict[str, Any]:
    """Slice ``index`` (0-based) of ``count``, as AWX slices a job: every count-th host of the inventory."""
    sliced = copy.deepcopy(inv)
    hosts = sliced["all"]["children"]["gpu_nodes"]["hosts"]
    names = list(hosts)
    sliced["all"]["children"]["gpu_nodes"]["hosts"] = {n: hosts[n] for n in names[index::count]}
    return sliced


def service_account_token(api: client.ApiClient) -> str:
    """A ServiceAccount allowed what site.yml does through the API (label and taint Nodes, the nvidia
    RuntimeClass) and nothing else, and a token for it: what an AWX Kubernetes credential holds."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    rules = [
        client.V1PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "patch"]),
        client.V1PolicyRule(
            api_groups=["node.k8s.io"], resources=["runtimeclasses"], verbs=["get", "list", "create", "patch"]
        ),
    ]
    for create, body in (
        (
            lambda b: core.create_namespaced_service_account(NAMESPACE, b),
            client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=ACCOUNT)),
        ),
        (
            rbac.create_cluster_role,
            client.V1ClusterRole(metadata=client.V1ObjectMeta(name=ACCOUNT), rules=rules),
        ),
        (
            rbac.create_cluster_role_binding,
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name=ACCOUNT),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=ACCOUNT),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name=ACCOUNT, namespace=NAMESPACE)],
            ),
        ),
    ):
        try:
            create(body)
        except client.ApiException as error:
            if error.status != 409:
                raise
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200))
    return core.create_namespaced_service_account_token(ACCOUNT, NAMESPACE, request).status.token


@pytest.fixture(scope="module")
def awx(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> AwxSetup:
    assert len(lab.nodes) >= 2, "the AWX tests need a lab of two nodes (GPUOPS_LAB_NODES)"
    work = tmp_path_factory.mktemp("awx")
    lab_inv = yaml.safe_load(lab_inventory(work / "lab-inventory.yml", *SPECS).read_text())
    lab_vars = lab_inv["all"]["children"]["gpu_nodes"]["vars"]
    ssh_dir = Path(lab_vars["ansible_ssh_private_key_file"]).parent
    kubeconfig = yaml.safe_load(lab.kubeconfig.read_text())
    cluster = kubeconfig["clusters"][0]["cluster"]
    for node in lab.nodes:
        lab.core.patch_node(node, {"metadata": {"labels": {FOREIGN_LABEL[0]: FOREIGN_LABEL[1]}}})
    return AwxSetup(
        nodes=list(lab.nodes),
        inventory=awx_inventory(lab_inv),
        envvars={
            "K8S_AUTH_HOST": cluster["server"],
            "K8S_AUTH_API_KEY": service_account_token(lab.api),
            "K8S_AUTH_VERIFY_SSL": "True",
            "K8S_AUTH_SSL_CA_CERT": "/runner/env/k8s-ca.crt",
        },
        files={
            "env/k8s-ca.crt": Path(cluster["certificate-authority"]).read_text(),
            KNOWN_HOSTS: (ssh_dir / "known_hosts").read_text(),
        },
        ssh_key=(ssh_dir / "id_ed25519").read_text(),
        playbooks=project_playbooks(),
        lab_inventory=lab_inv,
        # Mirrored once: the slices' jobs start at the same time.
        collection=mirror_collection(),
    )


def job(ee_image: str, awx: AwxSetup, inventory: dict[str, Any], work: Path, **given: Any) -> JobResult:
    """One job of playbooks/site.yml; ``given`` replaces what the job gets (envvars, extravars, cmdline)."""
    return run_job(
        ee_image,
        "playbooks/site.yml",
        playbooks=awx.playbooks,
        inventory=inventory,
        files=awx.files,
        ssh_key=awx.ssh_key,
        collection=awx.collection,
        work_dir=work,
        timeout=1500,
        **{"envvars": awx.envvars, **given},
    )


def token_leaks(result: JobResult, token: str) -> list[str]:
    """Where the job's record holds ``token``: each job event (AWX stores all of it, the module results in
    event_data included, whatever the verbosity) and the job's output. (ansible-runner's own ``command``
    artifact records the job's environment, the K8S_AUTH_* variables included, as AWX keeps a job's
    environment apart from its events and masks the credential's values there.)"""
    found = [f"event {e.get('counter')} ({e.get('event')})" for e in result.events if token in json.dumps(e)]
    stdout = result.artifact_dir / "stdout"
    if token in result.stdout or (stdout.exists() and token in stdout.read_text(encoding="utf-8", errors="replace")):
        found.append("the job's output")
    return found


@dataclass
class Slice:
    result: JobResult
    started: float
    ended: float


@pytest.fixture(scope="module")
def sliced(ee_image: str, awx: AwxSetup, tmp_path_factory: pytest.TempPathFactory) -> list[Slice]:
    """The first run: a job sliced in two, both slices at once."""
    work = tmp_path_factory.mktemp("sliced")

    def one(index: int) -> Slice:
        started = time.monotonic()
        result = job(ee_image, awx, slice_of(awx.inventory, index, 2), work / f"slice-{index + 1}")
        return Slice(result, started, time.monotonic())

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, range(2)))


def test_the_job_has_no_kubeconfig_and_no_key_file(awx: AwxSetup) -> None:
    text = yaml.safe_dump(awx.inventory)
    assert "private_key" not in text and "admin.kubeconfig" not in text
    kubeconfigs = {k: v for k, v in awx.inventory["all"]["children"]["gpu_nodes"]["vars"].items() if "kubeconfig" in k}
    # Only the node-side path stays: a DRA node's driver uses the kubelet's credentials on that node.
    assert kubeconfigs == {"device_plugin_dra_kubeconfig": "/etc/gpuops-lab/kubelet.kubeconfig"}, kubeconfigs
    rest = copy.deepcopy(awx.inventory)
    rest["all"]["children"]["gpu_nodes"]["vars"].pop("device_plugin_dra_kubeconfig")
    assert "kubeconfig" not in yaml.safe_dump(rest)
    assert "admin.kubeconfig" in yaml.safe_dump(awx.lab_inventory)  # (what was taken out)


def test_each_slice_converges_its_own_node(awx: AwxSetup, sliced: list[Slice]) -> None:
    for index, one in enumerate(sliced):
        result = one.result
        assert result.status == "successful" and result.rc == 0, result.summary()
        assert result.failed_tasks() == [], result.summary()
        own = awx.nodes[index]
        # The slice saw its own node only (the API tasks ran in the EE, delegated to localhost).
        assert set(result.stats) & set(awx.nodes) == {own}, result.stats
        assert result.stats[own]["changed"] > 0
    # The slices ran at the same time: each started before the other ended.
    first, second = sliced
    assert first.started < second.ended and second.started < first.ended


def test_slices_do_not_clobber_each_others_nodes(lab: Any, awx: AwxSetup, sliced: list[Slice]) -> None:
    for node, spec in zip(awx.nodes, SPECS):
        labels = lab.node(node).metadata.labels or {}
        assert labels.get("nvidia.com/gpu.product") == PRODUCTS[spec], (node, labels)
        assert labels.get("nvidia.com/gpu.count") == spec.rsplit("x", 1)[1]
        assert labels.get(FOREIGN_LABEL[0]) == FOREIGN_LABEL[1]
        taints = [t.key for t in lab.node(node).spec.taints or []]
        assert taints.count(GPU) == 1, taints


def test_allocatable_gpus_through_the_api_server(lab: Any, awx: AwxSetup, sliced: list[Slice]) -> None:
    for node, spec in zip(awx.nodes, SPECS):
        want = spec.rsplit("x", 1)[1]
        lab.wait_until(f"{GPU}={want} on {node}", lambda node=node, want=want: lab.allocatable(node).get(GPU) == want)


def test_second_run_one_job_changes_nothing(ee_image: str, awx: AwxSetup, sliced: list[Slice], tmp_path: Path) -> None:
    result = job(ee_image, awx, awx.inventory, tmp_path)
    assert result.status == "successful" and result.rc == 0, result.summary()
    assert result.failed_tasks() == [], result.summary()
    for node in awx.nodes:
        assert result.stats[node]["changed"] == 0, result.changed_tasks()
        assert result.stats[node]["failed"] == 0 and result.stats[node]["unreachable"] == 0
    first = max(one.result.seconds for one in sliced)
    print(f"AWX job: first run (two slices at once) {first:.0f}s, second run (one job) {result.seconds:.0f}s")


def test_no_job_event_holds_the_bearer_token(awx: AwxSetup, sliced: list[Slice]) -> None:
    token = awx.envvars["K8S_AUTH_API_KEY"]
    for one in sliced:
        assert token_leaks(one.result, token) == []


def test_a_token_given_as_extra_variables_stays_out_of_the_job_record(
    ee_image: str, awx: AwxSetup, sliced: list[Slice], tmp_path: Path
) -> None:
    """A custom credential type that injects the token as the roles' api_key variables, and a job run at
    verbosity 3 (module arguments and results in every event): the token is used, and never recorded."""
    token = awx.envvars["K8S_AUTH_API_KEY"]
    envvars = {k: v for k, v in awx.envvars.items() if k != "K8S_AUTH_API_KEY"}
    extravars = {"gpu_node_labels_api_key": token, "device_plugin_api_key": token}
    result = job(ee_image, awx, awx.inventory, tmp_path, envvars=envvars, extravars=extravars, cmdline=("-vvv",))
    assert result.status == "successful" and result.rc == 0, result.summary()
    # The API was reached with that token (the labels were read back, nothing to change).
    labels = "Write labels, taint and ownership, one merge patch per node that needs one (one LIST for the batch)"
    assert [res for res in result.task_results(labels) if not res.get("failed")], result.summary()
    for node in awx.nodes:
        assert result.stats[node]["changed"] == 0, result.changed_tasks()
    assert token_leaks(result, token) == []
