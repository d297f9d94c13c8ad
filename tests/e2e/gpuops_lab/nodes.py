"""The lab's GPU nodes: privileged podman containers with systemd running containerd, the kubelet and sshd.

Host network: the API server listens on 127.0.0.1 only and every kubelet reaches it there without
publishing anything; each node therefore gets its own kubelet ports, its own bridge (pod subnet
10.(231+I).N.0/24) and its own cgroup root (/<node name>). The kubelet refuses a loopback node IP
(validateNodeIP), so nodes use the machine's own address (the source address of its default route) as
InternalIP, and the kubelet listens there.

Isolation on this cgroup v1 machine: a node's systemd sees the machine's whole name=systemd hierarchy as
its own root (it sits in /init.scope there, beside every other node of every lab). Shutting down, it
trims every empty cgroup under that root, among them the name=systemd cgroup of every other node
container, after which ``podman exec`` into those fails. So a node is never shut down through its
systemd: its pods are stopped from inside (gpuops-lab-cleanup), then the container is killed outright,
and only this node's own cgroups (its container's libpod-<id> and its kubelet's /<node name>) are
removed afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from . import LabError
from .config import HERE, NODE_IMAGE_REPO, PAUSE_IMAGE, REPO, SSH_USER, LabConfig
from .controlplane import kubectl
from .pki import kubeconfig_text, sign_kubelet_cert
from .util import log, output, run, succeeds, wait_for

NODE_FILES = HERE / "node"
CGROUP_ROOT = Path("/sys/fs/cgroup")


# --- images -------------------------------------------------------------------------------------
def node_image_inputs() -> list[Path]:
    """The files the node image is built from, in the order their hash is taken."""
    files = [NODE_FILES / "Containerfile"]
    for pattern in ("*.service", "*.conf", "*.toml", "*.conflist", "*.sh"):
        files += sorted(NODE_FILES.glob(pattern))
    return files


def node_image_tag(base_id: str) -> str:
    """The node image's reference: its inputs and the base image's ID hashed."""
    digest = hashlib.sha256()
    for path in node_image_inputs():
        digest.update(path.read_bytes())
    digest.update(f"{base_id}\n".encode())
    return f"{NODE_IMAGE_REPO}:{digest.hexdigest()[:12]}"


def build_images(cfg: LabConfig, bin_dir: Path | None) -> str:
    """The node image (the shared Debian 12 systemd image plus containerd, runc, the CNI plugins and sshd
    from Debian) and the pause image (a static pause program in a scratch image); returns the node image.
    Without ``bin_dir`` (the Kubernetes build, which holds the pause program) the node image alone: what
    `lab.py images` builds ahead of the lab in make test's early builds.

    Labs of other instances share both images: one lab at a time builds them (a lock in the cache), so that two labs
    coming up at once (make test's e2e tier and test-awx, instances 0 and 1, in two lanes) do not build the same image
    side by side, or one of them remove an image the other is still tagging."""
    cfg.cache.mkdir(parents=True, exist_ok=True)
    with open(cfg.cache / "lab-images.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_images(cfg, bin_dir)


def _build_images(cfg: LabConfig, bin_dir: Path | None) -> str:
    image = _build_node_image(cfg)
    if bin_dir is not None:
        _build_pause_image(cfg, bin_dir)
    return image


def _build_node_image(cfg: LabConfig) -> str:
    base = run([REPO / "scripts" / "build-base-image.sh"], what="scripts/build-base-image.sh").stdout.strip()
    base_id = run(["podman", "image", "inspect", "--format", "{{.Id}}", base]).stdout.strip()
    image = node_image_tag(base_id)
    if not succeeds(["podman", "image", "exists", image]):
        log(f"building the node image {image} (containerd, runc, CNI plugins from Debian; about a minute)")
        mirror = ["--build-arg", f"MIRROR={cfg.mirror}"] if cfg.mirror else []
        run(
            [
                "podman",
                "build",
                "-q",
                "--network",
                "host",
                "--build-arg",
                f"BASE={base}",
                *mirror,
                "-t",
                image,
                "-f",
                NODE_FILES / "Containerfile",
                NODE_FILES,
            ],
            what="building the node image",
            stdout=subprocess.DEVNULL,
        )
        # Older node images are out of date now; keep only this one (one still in use stays).
        listed = output(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", NODE_IMAGE_REPO]) or ""
        for stale in listed.split():
            if stale != image:
                succeeds(["podman", "rmi", stale])
    return image


def _build_pause_image(cfg: LabConfig, bin_dir: Path) -> None:
    # The pause image is rebuilt only when the pause binary or its recipe changes (their hash is a label). The same
    # program is also /bin/bash and /bin/sh: a demo pod whose image is replaced by this one (NVIDIA's demo specs run
    # `bash -c "nvidia-smi -L; ... sleep"` or `sh -c "nvidia-smi; sleep 3600"`, tests/e2e/test_site_dra_nvidia.py)
    # runs it as its command and keeps running, so the pod's GPUs can be read from its container. A TEST DOUBLE of the
    # demos' ubuntu and CUDA sample images.
    recipe = 'FROM scratch\nCOPY pause /pause\nCOPY pause /bin/bash\nCOPY pause /bin/sh\nENTRYPOINT ["/pause"]\n'
    pause_sum = hashlib.sha256((bin_dir / "pause").read_bytes() + recipe.encode()).hexdigest()[:16]
    label = output(["podman", "image", "inspect", "--format", '{{index .Labels "gpuops.pause"}}', PAUSE_IMAGE])
    rebuilt = (label or "").strip() != pause_sum
    if rebuilt:
        log(f"building the pause image {PAUSE_IMAGE}")
        with tempfile.TemporaryDirectory() as context:
            shutil.copy2(bin_dir / "pause", Path(context) / "pause")
            (Path(context) / "Containerfile").write_text(recipe)
            run(
                [
                    "podman",
                    "build",
                    "-q",
                    "--label",
                    f"gpuops.pause={pause_sum}",
                    "-t",
                    PAUSE_IMAGE,
                    "-f",
                    Path(context) / "Containerfile",
                    context,
                ],
                what="building the pause image",
                stdout=subprocess.DEVNULL,
            )
    images = cfg.lab / "images"
    images.mkdir(parents=True, exist_ok=True)
    if rebuilt or not (images / "pause.tar").is_file():
        run(
            ["podman", "save", "-q", "--format", "docker-archive", "-o", images / "pause.tar", PAUSE_IMAGE],
            what="podman save",
            stdout=subprocess.DEVNULL,
        )


# --- configuration ------------------------------------------------------------------------------
def detect_node_ip(env_ip: str | None) -> str:
    """The nodes' InternalIP: GPUOPS_LAB_NODE_IP, else the source address of the default route, else
    the first global IPv4 address that is not a bridge or veth."""
    if env_ip:
        return env_ip
    route = output(["ip", "-4", "-o", "route", "get", "198.51.100.1"]) or ""
    found = re.search(r" src ([0-9.]+)", route)
    if found:
        return found.group(1)
    for line in (output(["ip", "-4", "-o", "addr", "show", "scope", "global"]) or "").splitlines():
        fields = line.split()
        if len(fields) > 3 and not re.match(r"(podman|gpuopslab|cni|veth)", fields[1]):
            return fields[3].split("/")[0]
    raise LabError("found no IPv4 address for the nodes (set GPUOPS_LAB_NODE_IP)")


def kubelet_config(cfg: LabConfig, index: int, node_ip: str) -> str:
    """The node's KubeletConfiguration. cgroupfs driver on both sides: the host has no systemd and the
    node's systemd does not own the (host) cgroup v1 hierarchy the kubelet writes to. failCgroupV1: false
    keeps the kubelet running on this cgroup v1 host."""
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node_ip}
port: {cfg.kubelet_port(index)}
healthzBindAddress: 127.0.0.1
healthzPort: {cfg.healthz_port(index)}
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupRoot: /{cfg.node_name(index)}
cgroupsPerQOS: true
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: /etc/gpuops-lab/ca.crt}}
authorization:
  mode: AlwaysAllow
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{}}
evictionPressureTransitionPeriod: 5s
nodeStatusUpdateFrequency: 5s
nodeStatusReportFrequency: 10s
syncFrequency: 10s
registerNode: true
"""


def kubelet_env(cfg: LabConfig, index: int, node_ip: str) -> str:
    """The kubelet unit's environment file: its arguments and the cgroup root to create before it starts."""
    name = cfg.node_name(index)
    args = " ".join(
        [
            "--kubeconfig=/etc/gpuops-lab/kubelet.kubeconfig",
            "--config=/etc/gpuops-lab/kubelet-config.yaml",
            f"--hostname-override={name}",
            f"--node-ip={node_ip}",
            "--cert-dir=/var/lib/kubelet/pki",
            "--v=1",
        ]
    )
    return f"KUBELET_ARGS={args}\nGPUOPS_LAB_CGROUP_ROOT=/{name}\n"


def sshd_config(cfg: LabConfig, index: int) -> str:
    """sshd on the machine's loopback (host network), a port per node; keys only, no root login."""
    return (
        f"Port {cfg.ssh_port(index)}\nListenAddress 127.0.0.1\nPermitRootLogin no\nPasswordAuthentication no\n"
        f"KbdInteractiveAuthentication no\nAllowUsers {SSH_USER}\n"
    )


def write_node_config(cfg: LabConfig, index: int, node_ip: str) -> Path:
    """Node ``index``'s configuration directory (mounted at /etc/gpuops-lab): its kubelet certificate and
    kubeconfig, kubelet configuration, CNI network, sshd drop-in and the login key; returns it."""
    name, directory = cfg.node_name(index), cfg.node_dir(index)
    directory.mkdir(parents=True, exist_ok=True)
    cert = sign_kubelet_cert(cfg, index)
    shutil.copyfile(cfg.pki / "ca.crt", directory / "ca.crt")
    shutil.copyfile(cfg.pki / f"{cert}.crt", directory / "kubelet-client.crt")
    shutil.copyfile(cfg.pki / f"{cert}.key", directory / "kubelet-client.key")
    (directory / "kubelet.kubeconfig").write_text(
        kubeconfig_text(
            f"https://127.0.0.1:{cfg.api_port}",
            "/etc/gpuops-lab/ca.crt",
            name,
            "/etc/gpuops-lab/kubelet-client.crt",
            "/etc/gpuops-lab/kubelet-client.key",
        )
    )
    (directory / "kubelet-config.yaml").write_text(kubelet_config(cfg, index, node_ip))
    (directory / "kubelet.env").write_text(kubelet_env(cfg, index, node_ip))
    conflist = (NODE_FILES / "10-gpuops-lab.conflist").read_text()
    conflist = conflist.replace("@BRIDGE@", cfg.bridge_name(index)).replace("@SUBNET@", cfg.pod_subnet(index))
    (directory / "10-gpuops-lab.conflist").write_text(conflist)
    (directory / "sshd.conf").write_text(sshd_config(cfg, index))
    shutil.copyfile(cfg.ssh_key.with_suffix(".pub"), directory / "ssh-user.pub")
    return directory


# --- containers ---------------------------------------------------------------------------------
def container_running(name: str) -> bool:
    return (output(["podman", "inspect", "--format", "{{.State.Running}}", name]) or "").strip() == "true"


def start_node(cfg: LabConfig, index: int, image: str, bin_dir: Path, containerd_bin: Path) -> None:
    """Start node ``index``'s container (or restart a stopped one), with the kubelet from ``bin_dir`` and
    the containerd daemon ``containerd_bin`` mounted over the node image's."""
    name = cfg.node_name(index)
    if succeeds(["podman", "container", "exists", name]):
        if not container_running(name):
            run(["podman", "start", name], what=f"podman start {name}", stdout=subprocess.DEVNULL)
        return
    log(f"starting node container {name}")
    # containerd's snapshots and the kubelet's state live on volumes, not on the container's overlay.
    for volume in cfg.volume_names(index):
        if not succeeds(["podman", "volume", "exists", volume]):
            run(
                ["podman", "volume", "create", "--label", cfg.instance_label, volume],
                what=f"podman volume create {volume}",
                stdout=subprocess.DEVNULL,
            )
    containerd, kubelet = cfg.volume_names(index)
    run(
        [
            "podman",
            "run",
            "-d",
            "--name",
            name,
            "--hostname",
            name,
            "--add-host",
            f"{name}:127.0.1.1",
            "--privileged",
            "--systemd=always",
            # A reboot in the node ends its container (node/reboot.sh); podman starts it again, as a machine
            # comes back from a reboot. A container stopped or killed by podman (lab.py down) stays down.
            "--restart",
            "on-failure",
            "--network",
            "host",
            "--cgroupns",
            "private",
            "--label",
            "gpuops-lab=node",
            "--label",
            cfg.instance_label,
            "-v",
            f"{containerd}:/var/lib/containerd",
            "-v",
            f"{kubelet}:/var/lib/kubelet",
            "-v",
            f"{cfg.node_dir(index)}:/etc/gpuops-lab:ro",
            "-v",
            f"{bin_dir / 'kubelet'}:/usr/local/bin/kubelet:ro",
            "-v",
            f"{containerd_bin}:/usr/bin/containerd:ro",
            "-v",
            f"{cfg.lab / 'images'}:/opt/gpuops-lab/images:ro",
            image,
        ],
        what=f"podman run {name}",
        stdout=subprocess.DEVNULL,
    )


def node_exec_argv(cfg: LabConfig, index: int | str, *argv: str) -> list[str]:
    """``podman exec`` into node ``index`` (1-based; as the command line gives it)."""
    return ["podman", "exec", cfg.node_name(index), *argv]


def node_systemd_up(cfg: LabConfig, index: int) -> bool:
    """Whether the node's systemd has finished booting (running, or degraded: some unit failed)."""
    done = subprocess.run(
        node_exec_argv(cfg, index, "systemctl", "is-system-running"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        check=False,
    )
    return done.stdout.strip() in ("running", "degraded")


def node_ready(cfg: LabConfig, bin_dir: Path, name: str) -> bool:
    """Ready, and schedulable: the node lifecycle controller has removed the not-ready taint the kubelet
    registers the node with."""
    path = (
        '{.status.conditions[?(@.type=="Ready")].status}/'
        '{.spec.taints[?(@.key=="node.kubernetes.io/not-ready")].effect}'
    )
    return (output(kubectl(cfg, bin_dir, "get", "node", name, "-o", f"jsonpath={path}")) or "") == "True/"


def prepare_node(cfg: LabConfig, index: int) -> None:
    """Wait for the node's systemd and containerd, import the pause image, start the kubelet and sshd."""
    name = cfg.node_name(index)
    wait_for(f"{name}: systemd up", 90, lambda: node_systemd_up(cfg, index), cfg.logs)
    wait_for(f"{name}: containerd up", 60, lambda: succeeds(node_exec_argv(cfg, index, "ctr", "version")), cfg.logs)
    images = output(node_exec_argv(cfg, index, "ctr", "-n", "k8s.io", "images", "ls", "-q")) or ""
    if PAUSE_IMAGE not in images.split():
        run(
            node_exec_argv(cfg, index, "ctr", "-n", "k8s.io", "images", "import", "/opt/gpuops-lab/images/pause.tar"),
            what=f"{name}: importing the pause image",
            stdout=subprocess.DEVNULL,
        )
        log(f"{name}: imported {PAUSE_IMAGE} into containerd")
    # Enabled, so that the kubelet starts again when the node comes back from a reboot.
    run(
        node_exec_argv(cfg, index, "systemctl", "enable", "--now", "kubelet"),
        what=f"{name}: systemctl enable --now kubelet",
    )
    setup_ssh(cfg, index)


# --- ssh ----------------------------------------------------------------------------------------
def ssh_options(cfg: LabConfig, index: int) -> list[str]:
    """How the lab (and the inventory) reaches node ``index``: its key, its known host key, its port."""
    return [
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={cfg.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-i",
        str(cfg.ssh_key),
        "-p",
        str(cfg.ssh_port(index)),
    ]


def ssh_argv(cfg: LabConfig, index: int, *command: str) -> list[str]:
    """``ssh`` to node ``index`` as the lab's login user."""
    return ["ssh", *ssh_options(cfg, index), f"{SSH_USER}@127.0.0.1", *command]


def setup_ssh(cfg: LabConfig, index: int) -> None:
    """The node's login: the user with passwordless sudo and the lab's key, the node's own host keys
    (generated on first start), sshd running, and the host key in the lab's known_hosts."""
    name, port, user = cfg.node_name(index), cfg.ssh_port(index), SSH_USER
    script = f"""
    id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user}
    install -d -o {user} -g {user} -m 700 /home/{user}/.ssh
    install -o {user} -g {user} -m 600 /etc/gpuops-lab/ssh-user.pub /home/{user}/.ssh/authorized_keys
    printf '%s\\n' '{user} ALL=(ALL:ALL) NOPASSWD: ALL' >/etc/sudoers.d/gpuops-lab
    chmod 440 /etc/sudoers.d/gpuops-lab
    ssh-keygen -A >/dev/null
    systemctl enable -q ssh
    systemctl restart ssh"""
    run(node_exec_argv(cfg, index, "sh", "-euc", script), what=f"{name}: setting up sshd")
    host_key = run(node_exec_argv(cfg, index, "cat", "/etc/ssh/ssh_host_ed25519_key.pub")).stdout.split()[:2]
    entry = f"[127.0.0.1]:{port} "
    lines = [line for line in cfg.known_hosts.read_text().splitlines() if not line.startswith(entry)]
    lines.append(entry + " ".join(host_key))
    new = cfg.known_hosts.with_name("known_hosts.new")
    new.write_text("".join(f"{line}\n" for line in lines))
    new.replace(cfg.known_hosts)
    wait_for(f"{name}: sshd on 127.0.0.1:{port}", 30, lambda: succeeds(ssh_argv(cfg, index, "true")), cfg.logs)


# --- removal ------------------------------------------------------------------------------------
def instance_containers(cfg: LabConfig) -> list[str]:
    """This instance's node containers: labelled with its instance and named as its nodes."""
    listed = output(["podman", "ps", "-a", "--filter", f"label={cfg.instance_label}", "--format", "{{.Names}}"])
    names = {cfg.node_name(i) for i in range(1, 10)}
    return [name for name in (listed or "").split() if name in names]


def container_cgroup(name: str) -> str | None:
    """The container's own cgroup path (``/libpod_parent/libpod-<id>``), if podman reports one that
    names this container's ID."""
    found = output(["podman", "inspect", "--format", "{{.Id}} {{.State.CgroupPath}}", name]) or ""
    fields = found.split()
    if len(fields) == 2 and re.fullmatch(r"[0-9a-f]{64}", fields[0]) and fields[1].rstrip("/").endswith(fields[0]):
        return fields[1]
    return None


def own_cgroups(container_cgroup_path: str | None, node_name: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The cgroup directories one node owns, in every hierarchy: its container's cgroup and its kubelet's
    cgroup root (/<node name>, at a hierarchy's root where the container sees the machine's tree)."""
    if not re.fullmatch(r"gpuops-lab[1-4]?-node-[1-9]", node_name):
        raise LabError(f"refusing to remove the cgroups of '{node_name}', which is not a lab node")
    found: list[Path] = []
    for hierarchy in sorted(p for p in root.glob("*") if p.is_dir() and not p.is_symlink()):
        candidates = [hierarchy / node_name]
        if container_cgroup_path and container_cgroup_path.strip("/"):
            candidates.append(hierarchy / container_cgroup_path.strip("/"))
        found += [c for c in candidates if c.is_dir()]
    return found


def remove_cgroup_tree(top: Path) -> None:
    """rmdir every cgroup under ``top``, deepest first (a cgroup with processes stays)."""
    for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            directory.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def remove_node_containers(cfg: LabConfig, names: list[str]) -> None:
    """Stop the pods in each node, then kill and remove the node containers and their own cgroups."""
    if not names:
        return
    cgroups: dict[str, str | None] = {}
    for name in names:
        cgroups[name] = container_cgroup(name)
        if container_running(name):
            done = subprocess.run(["podman", "exec", name, "/usr/local/sbin/gpuops-lab-cleanup"], check=False)
            if done.returncode != 0:
                log(f"warning: pod cleanup in {name} failed")
    log(f"removing node containers {' '.join(names)}")
    # SIGKILL, not the stop signal: the node's systemd must not run its shutdown (see the module's
    # docstring); its pods are gone already and its services die with the container's PID namespace.
    succeeds(["podman", "kill", "--signal", "KILL", *names])
    run(["podman", "rm", "-f", "-t", "0", *names], what="podman rm", stdout=subprocess.DEVNULL)
    # The kubelet's pod cgroups nest inside the container's cgroup (podman only removes an empty one) or
    # sit at a hierarchy's root under the node's name. Every process in them died with the container.
    for _attempt in range(3):
        left = [path for name in names for path in own_cgroups(cgroups[name], name)]
        for path in left:
            remove_cgroup_tree(path)
        if not any(path.exists() for path in left):
            break
        time.sleep(1)


def remove_volumes_and_bridges(cfg: LabConfig) -> None:
    """This instance's node volumes and bridges, by their exact names."""
    for index in range(1, 10):
        for volume in cfg.volume_names(index):
            if succeeds(["podman", "volume", "exists", volume]):
                run(
                    ["podman", "volume", "rm", "-f", volume],
                    what=f"podman volume rm {volume}",
                    stdout=subprocess.DEVNULL,
                )
        bridge = cfg.bridge_name(index)
        if succeeds(["ip", "link", "show", "dev", bridge]):
            run(["ip", "link", "del", "dev", bridge], what=f"ip link del {bridge}")


def wait_nodes_ready(cfg: LabConfig, bin_dir: Path, count: int) -> None:
    for index in range(1, count + 1):
        name = cfg.node_name(index)
        wait_for(f"{name} Ready", cfg.ready_timeout, lambda name=name: node_ready(cfg, bin_dir, name), cfg.logs)
