"""The control plane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler as background
processes on 127.0.0.1, with pid files under the lab's run directory.

A pid file is only trusted while the process it names still runs with this lab's state directory on
its command line: a pid the system has since given to another process (another lab's, anyone's) is
never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .config import LabConfig
from .util import log, succeeds, wait_for

# Only the controllers the lab uses: DaemonSets (the device plugin's daemonset mode), Deployments and
# ReplicaSets (workloads a drain moves), PodDisruptionBudgets (disruption: a drain's evictions honour
# them), ServiceAccounts with their tokens and the root CA ConfigMap (pods that mount a token), the
# garbage collector (owned objects go with their owner), namespaces (deleting one empties it).
# Node lifecycle is on: a kubelet registers its node with the node.kubernetes.io/not-ready:NoSchedule
# taint and only that controller removes it once the node is Ready (and puts it back when heartbeats
# stop), so without it neither the scheduler nor the DaemonSet controller places a pod anywhere.
# Taint-based eviction stays off (taint-eviction-controller): on a shared 2-core machine a starved
# kubelet, or one a test restarts on purpose, must not have its pods evicted under the test.
CONTROLLERS = (
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
    "disruption-controller",
    "node-lifecycle-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "garbage-collector-controller",
    "namespace-controller",
    # DRA: makes a pod's ResourceClaims from its ResourceClaimTemplates, and frees claims its pods are done with.
    "resourceclaim-controller",
)


def cmdline(pid: int) -> list[str]:
    """A process's arguments (empty when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def owned_by(cfg: LabConfig, pid: int) -> bool:
    """Whether ``pid`` is one of this lab's processes: its command line names this lab's state directory."""
    lab = str(cfg.lab)
    return any(arg == lab or arg.startswith(lab + "/") for arg in cmdline(pid))


def read_pid(cfg: LabConfig, name: str) -> int | None:
    """The pid in ``run/NAME.pid``, if the file holds one."""
    try:
        text = cfg.pid_file(name).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def running_pid(cfg: LabConfig, name: str) -> int | None:
    """The pid of this lab's process NAME while it runs; None otherwise (also for a reused pid)."""
    pid = read_pid(cfg, name)
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid if owned_by(cfg, pid) else None


def start_bg(cfg: LabConfig, name: str, argv: list[str | Path]) -> None:
    """Start NAME in its own session, its output in logs/NAME.log, unless this lab's NAME already runs."""
    if running_pid(cfg, name) is not None:
        return
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    cfg.logs.mkdir(parents=True, exist_ok=True)
    with open(cfg.logs / f"{name}.log", "wb") as out:
        process = subprocess.Popen(
            [str(a) for a in argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    cfg.pid_file(name).write_text(f"{process.pid}\n")


def stop(cfg: LabConfig, name: str) -> None:
    """Stop this lab's process NAME (SIGTERM, waiting up to 10 s); a pid that is not this lab's is left alone."""
    pid = running_pid(cfg, name)
    if pid is None:
        return
    log(f"stopping {name}")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _attempt in range(50):
        if running_pid(cfg, name) is None:
            break
        time.sleep(0.2)


def curl(*args: str | Path) -> list[str | Path]:
    return ["curl", "-fsS", *args]


def kubectl(cfg: LabConfig, bin_dir: Path, *args: str) -> list[str | Path]:
    """The lab's kubectl with the admin kubeconfig."""
    return [bin_dir / "kubectl", "--kubeconfig", cfg.admin_kubeconfig, *args]


def start_control_plane(cfg: LabConfig, bin_dir: Path) -> None:
    """Start (or keep) etcd, the API server, the controller manager and the scheduler; wait for each."""
    pki, logs = cfg.pki, cfg.logs
    etcd_peer = f"http://127.0.0.1:{cfg.etcd_peer_port}"
    etcd_client = f"http://127.0.0.1:{cfg.etcd_port}"
    start_bg(
        cfg,
        "etcd",
        [
            "etcd",
            "--name",
            cfg.name,
            "--data-dir",
            cfg.lab / "etcd",
            "--listen-client-urls",
            etcd_client,
            "--advertise-client-urls",
            etcd_client,
            "--listen-peer-urls",
            etcd_peer,
            "--initial-advertise-peer-urls",
            etcd_peer,
            "--initial-cluster",
            f"{cfg.name}={etcd_peer}",
            "--quota-backend-bytes",
            "536870912",
        ],
    )
    wait_for("etcd healthy", 60, lambda: succeeds(curl(f"{etcd_client}/health")), logs)

    # --endpoint-reconciler-type=none: the API server would otherwise try to publish 127.0.0.1 as the
    # kubernetes Service endpoint, which validation refuses (loopback); the 1.37 API server does not start
    # at all with a loopback address and a reconciler.
    start_bg(
        cfg,
        "kube-apiserver",
        [
            bin_dir / "kube-apiserver",
            "--etcd-servers",
            etcd_client,
            "--etcd-prefix",
            f"/{cfg.name}",
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--secure-port",
            str(cfg.api_port),
            "--endpoint-reconciler-type",
            "none",
            "--tls-cert-file",
            pki / "apiserver.crt",
            "--tls-private-key-file",
            pki / "apiserver.key",
            "--client-ca-file",
            pki / "ca.crt",
            "--kubelet-client-certificate",
            pki / "apiserver-kubelet-client.crt",
            "--kubelet-client-key",
            pki / "apiserver-kubelet-client.key",
            "--kubelet-preferred-address-types",
            "InternalIP",
            "--authorization-mode",
            "Node,RBAC",
            "--enable-admission-plugins",
            "NodeRestriction",
            "--service-account-key-file",
            pki / "sa.pub",
            "--service-account-signing-key-file",
            pki / "sa.key",
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-cluster-ip-range",
            cfg.service_range,
            "--allow-privileged=true",
            "--profiling=false",
            "--storage-backend",
            "etcd3",
            "--v",
            "1",
        ],
    )
    admin = ["--cacert", pki / "ca.crt", "--cert", pki / "admin.crt", "--key", pki / "admin.key"]
    wait_for(
        "kube-apiserver ready",
        120,
        lambda: succeeds(curl(*admin, f"https://127.0.0.1:{cfg.api_port}/readyz")),
        logs,
    )
    start_controller_manager(cfg, bin_dir)
    start_scheduler(cfg, bin_dir)


def _component_args(cfg: LabConfig, component: str, port: int) -> list[str | Path]:
    # --authentication-skip-lookup: the API server has no front proxy, so there is no request-header CA
    # to read from kube-system/extension-apiserver-authentication, and the lookup would log an error
    # every time.
    kubeconfig = cfg.lab / f"{component}.kubeconfig"
    return [
        "--kubeconfig",
        kubeconfig,
        "--authentication-kubeconfig",
        kubeconfig,
        "--authorization-kubeconfig",
        kubeconfig,
        "--authentication-skip-lookup",
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(port),
        "--leader-elect=false",
    ]


def start_controller_manager(cfg: LabConfig, bin_dir: Path) -> None:
    """The controller manager; each controller acts with its own service account's token (as kubeadm
    sets it up), so RBAC limits every controller to what its bootstrap role allows."""
    start_bg(
        cfg,
        "kube-controller-manager",
        [
            bin_dir / "kube-controller-manager",
            *_component_args(cfg, "kube-controller-manager", cfg.controller_manager_port),
            "--controllers",
            ",".join(CONTROLLERS),
            "--use-service-account-credentials=true",
            "--service-account-private-key-file",
            cfg.pki / "sa.key",
            "--root-ca-file",
            cfg.pki / "ca.crt",
            "--profiling=false",
            "--v",
            "1",
        ],
    )
    wait_for(
        "kube-controller-manager healthy",
        120,
        lambda: succeeds(curl("-k", f"https://127.0.0.1:{cfg.controller_manager_port}/healthz")),
        cfg.logs,
    )
    # Pods need their namespace's default ServiceAccount to pass admission; the controller makes them.
    for namespace in ("default", "kube-system"):
        wait_for(
            f"ServiceAccount {namespace}/default",
            60,
            lambda namespace=namespace: succeeds(
                kubectl(cfg, bin_dir, "-n", namespace, "get", "serviceaccount", "default")
            ),
            cfg.logs,
        )


def start_scheduler(cfg: LabConfig, bin_dir: Path) -> None:
    """The scheduler, with the default profile."""
    start_bg(
        cfg,
        "kube-scheduler",
        [
            bin_dir / "kube-scheduler",
            *_component_args(cfg, "kube-scheduler", cfg.scheduler_port),
            "--profiling=false",
            "--v",
            "1",
        ],
    )
    wait_for(
        "kube-scheduler healthy",
        120,
        lambda: succeeds(curl("-k", f"https://127.0.0.1:{cfg.scheduler_port}/healthz")),
        cfg.logs,
    )
