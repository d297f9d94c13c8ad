"""The control plane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler as background
processes on 127.0.0.1, with pid files under the lab's run directory.

A pid file is only trusted while the process it names still runs with this lab's state directory on
its command line: a pid the system has since given to another process (another lab's, anyone's) is
never signalled.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import LabError
from .config import LabConfig
from .pki import kubeconfig_text, make_pki, write_kubeconfigs
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


@dataclass(frozen=True)
class ApiServerSettings:
    """What differs between the API servers the lab and the tests start; everything else is the same flags.

    ``tokens``: (token, user, groups) rows for a static token file, for tests that act as a node or an admin
    without a certificate of their own; none by default (the lab's users have certificates).
    """

    authorization_modes: tuple[str, ...] = ("Node", "RBAC")
    admission_plugins: tuple[str, ...] = ("NodeRestriction",)
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    extra_flags: tuple[str, ...] = ()
    tokens: tuple[tuple[str, str, str], ...] = ()


# The lab's own API server: the Node authorizer and NodeRestriction, as a kubeadm cluster runs them.
LAB_API_SERVER = ApiServerSettings()


def etcd_url(cfg: LabConfig) -> str:
    return f"http://127.0.0.1:{cfg.etcd_port}"


def start_etcd(cfg: LabConfig) -> None:
    """Start (or keep) this lab's etcd and wait until it answers /health."""
    etcd_peer = f"http://127.0.0.1:{cfg.etcd_peer_port}"
    etcd_client = etcd_url(cfg)
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
    _wait_running(cfg, "etcd", "etcd healthy", 60, lambda: succeeds(curl(f"{etcd_client}/health")))


def exited(cfg: LabConfig, name: str) -> bool:
    """Whether the process in ``run/NAME.pid`` is gone or a zombie. Unlike running_pid, it does not look at the
    command line, which is still the starting Python's between fork and exec, so right after start_bg."""
    pid = read_pid(cfg, name)
    if pid is None:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _wait_running(cfg: LabConfig, name: str, what: str, timeout: int, ready: Callable[[], bool]) -> None:
    """wait_for ``ready``, failing at once (with the end of its log) when process NAME has exited."""

    def check() -> bool:
        if exited(cfg, name):
            try:
                tail = (cfg.logs / f"{name}.log").read_text(errors="replace")[-3000:]
            except OSError:
                tail = ""
            raise LabError(f"{name} exited while waiting for {what} (logs: {cfg.logs}):\n{tail}")
        return ready()

    wait_for(what, timeout, check, cfg.logs)


def apiserver_argv(
    cfg: LabConfig, bin_dir: Path, settings: ApiServerSettings, *, name: str, port: int
) -> list[str | Path]:
    """The kube-apiserver command line: this lab's etcd (under the prefix /<lab>, or /<lab>-<name> for a
    second server), its PKI, and ``settings``."""
    pki = cfg.pki
    prefix = f"/{cfg.name}" if name == "kube-apiserver" else f"/{cfg.name}-{name}"
    # --endpoint-reconciler-type=none: the API server would otherwise try to publish 127.0.0.1 as the
    # kubernetes Service endpoint, which validation refuses (loopback); the 1.37 API server does not start
    # at all with a loopback address and a reconciler.
    argv: list[str | Path] = [
        bin_dir / "kube-apiserver",
        "--etcd-servers",
        etcd_url(cfg),
        "--etcd-prefix",
        prefix,
        "--bind-address",
        "127.0.0.1",
        "--advertise-address",
        "127.0.0.1",
        "--secure-port",
        str(port),
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
        ",".join(settings.authorization_modes),
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
    ]
    if settings.admission_plugins:
        argv += ["--enable-admission-plugins", ",".join(settings.admission_plugins)]
    if settings.feature_gates:
        gates = ",".join(f"{gate}={str(on).lower()}" for gate, on in sorted(settings.feature_gates.items()))
        argv += ["--feature-gates", gates]
    if settings.tokens:
        tokens = cfg.lab / f"{name}.tokens.csv"
        tokens.write_text("".join(f'{token},{user},{user},"{groups}"\n' for token, user, groups in settings.tokens))
        tokens.chmod(0o600)
        argv += ["--token-auth-file", tokens]
    return argv + list(settings.extra_flags)


def start_apiserver(
    cfg: LabConfig,
    bin_dir: Path,
    settings: ApiServerSettings = LAB_API_SERVER,
    *,
    name: str = "kube-apiserver",
    port: int | None = None,
) -> None:
    """Start (or keep) an API server on this lab's etcd and wait for its /readyz (serving, with the bootstrap
    RBAC policy and priority classes in place). NAME and ``port`` for a second server beside the lab's."""
    port = cfg.api_port if port is None else port
    start_bg(cfg, name, apiserver_argv(cfg, bin_dir, settings, name=name, port=port))
    pki = cfg.pki
    admin = ["--cacert", pki / "ca.crt", "--cert", pki / "admin.crt", "--key", pki / "admin.key"]
    _wait_running(cfg, name, f"{name} ready", 180, lambda: succeeds(curl(*admin, f"https://127.0.0.1:{port}/readyz")))


def start_control_plane(
    cfg: LabConfig,
    bin_dir: Path,
    settings: ApiServerSettings = LAB_API_SERVER,
    *,
    controller_manager: bool = True,
    scheduler: bool = True,
) -> None:
    """Start (or keep) etcd and the API server, then the controller manager and the scheduler (unless told
    not to); wait for each. The PKI and the kubeconfigs (pki.make_pki, pki.write_kubeconfigs) come first."""
    start_etcd(cfg)
    start_apiserver(cfg, bin_dir, settings)
    if controller_manager:
        start_controller_manager(cfg, bin_dir)
    if scheduler:
        start_scheduler(cfg, bin_dir)


def stop_control_plane(cfg: LabConfig, extra: tuple[str, ...] = ()) -> None:
    """Stop this lab's control-plane processes (and the ``extra`` ones, such as a second API server), the
    last started first."""
    for name in (*reversed(extra), "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        stop(cfg, name)


# Offsets for the control planes tests start: above every lab instance's ports and the lab's serve ports, 200 apart
# (a control plane's ports span 155), the last one's ports below 65536.
_SCRATCH_OFFSETS = range(10000, 39001, 200)


def ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections (net.ipv4.ip_local_port_range)."""
    try:
        low, high = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_port_offset(tries: int = 50) -> int:
    """A port offset whose control-plane ports are all free on 127.0.0.1 now and outside the ephemeral range, where
    an outgoing connection could take one between this check and the bind."""
    ephemeral = ephemeral_ports()
    offsets = [
        offset
        for offset in _SCRATCH_OFFSETS
        if not any(port in ephemeral for port in control_plane_ports(LabConfig.scratch(Path("/nonexistent"), offset)))
    ]
    if not offsets:
        raise LabError(f"no control-plane ports outside the ephemeral range {ephemeral.start}-{ephemeral.stop - 1}")
    for _attempt in range(tries):
        offset = random.choice(offsets)
        probe = LabConfig.scratch(Path("/nonexistent"), offset)
        if not any(port_open(port) for port in control_plane_ports(probe)):
            return offset
    raise LabError("no free set of control-plane ports on 127.0.0.1")


def control_plane_ports(cfg: LabConfig) -> tuple[int, ...]:
    """The ports a control plane of ``cfg`` listens on; the API server's port + 1 is for a second API server."""
    return (
        cfg.etcd_port,
        cfg.etcd_peer_port,
        cfg.api_port,
        cfg.api_port + 1,
        cfg.controller_manager_port,
        cfg.scheduler_port,
    )


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


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
    _wait_running(
        cfg,
        "kube-controller-manager",
        "kube-controller-manager healthy",
        120,
        lambda: succeeds(curl("-k", f"https://127.0.0.1:{cfg.controller_manager_port}/healthz")),
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
    _wait_running(
        cfg,
        "kube-scheduler",
        "kube-scheduler healthy",
        120,
        lambda: succeeds(curl("-k", f"https://127.0.0.1:{cfg.scheduler_port}/healthz")),
    )


class ScratchControlPlane:
    """etcd and an API server (and, when asked, the controller manager) started exactly as the lab starts
    them, in ``directory`` on ports no lab instance uses: the integration tier's API server
    (tests/integration/conftest.py's ``control_plane`` fixture) and bench/bench_dra_prepare.py."""

    def __init__(self, directory: Path, bin_dir: Path) -> None:
        self.cfg = LabConfig.scratch(directory, free_port_offset())
        self.bin_dir = bin_dir
        self.more: list[str] = []

    @property
    def work(self) -> Path:
        return self.cfg.lab

    @property
    def ca(self) -> Path:
        """The CA that signed the API servers' serving certificate."""
        return self.cfg.pki / "ca.crt"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.cfg.api_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig of an administrator (group system:masters, a client certificate)."""
        return self.cfg.admin_kubeconfig

    def start(self, settings: ApiServerSettings = LAB_API_SERVER, *, controller_manager: bool = False) -> None:
        make_pki(self.cfg)
        write_kubeconfigs(self.cfg)
        start_control_plane(self.cfg, self.bin_dir, settings, controller_manager=controller_manager, scheduler=False)

    def second_apiserver(self, name: str, settings: ApiServerSettings) -> str:
        """Another API server NAME on the same etcd, under its own prefix; returns its URL."""
        port = self.cfg.api_port + 1
        self.more.append(name)
        start_apiserver(self.cfg, self.bin_dir, settings, name=name, port=port)
        return f"https://127.0.0.1:{port}"

    def kubeconfig(self, path: Path, token: str | None = None, server: str | None = None) -> Path:
        """A kubeconfig for ``server`` (the first API server by default) that verifies it with the lab CA:
        the administrator's certificate, or a bearer ``token`` from the settings' token rows."""
        if token is None:
            pki = self.cfg.pki
            text = kubeconfig_text(
                server or self.server, self.ca, "gpuops-lab-admin", pki / "admin.crt", pki / "admin.key"
            )
        else:
            text = kubeconfig_text(server or self.server, self.ca, "token", token=token)
        path.write_text(text)
        return path

    def stop(self) -> None:
        stop_control_plane(self.cfg, tuple(self.more))
