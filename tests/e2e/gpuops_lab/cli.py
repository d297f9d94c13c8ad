"""The lab's command line (``tests/e2e/lab.py``).

  tests/e2e/lab.py up [NODES]      build what is missing, start everything, wait until nodes are Ready
  tests/e2e/lab.py down            stop and remove everything this lab instance created
  tests/e2e/lab.py status          control-plane processes, node containers, `kubectl get nodes`
  tests/e2e/lab.py images          build the node image (or reuse it) and print it; starts nothing (make test
                                   builds it early, beside the tiers, scripts/build-early.sh)
  tests/e2e/lab.py kubeconfig      print the admin kubeconfig path
  tests/e2e/lab.py kubectl ARGS    run the lab's kubectl against the lab
  tests/e2e/lab.py node-exec N CMD run CMD inside node container N (1-based)
  tests/e2e/lab.py nodes           print the node names, one per line
  tests/e2e/lab.py inventory [SPEC...]  prepare the nodes for playbooks/site.yml and print an Ansible
                                   inventory (YAML) for them; SPEC i is node i's simulated-GPU spec
                                   (a name from tests/fixtures/simulated/ or a path; default h100x8).
                                   It connects over SSH as the unprivileged user gpuops with become,
                                   pipelining and ControlPersist (GPUOPS_LAB_CONNECTION=podman: as root
                                   through podman exec instead, for debugging)
  tests/e2e/lab.py simulate [SPEC...]  give the nodes simulated GPUs only (SPEC as for inventory): the
                                   spec, the mock NVML library and its state, the NVIDIA device nodes,
                                   PyYAML and pynvml; what inventory also does, without serving the
                                   toolkit repository and the wheels, and printing nothing
  tests/e2e/lab.py ssh N [CMD]     ssh to node N as that user, the way the inventory does
  tests/e2e/lab.py spec-path N     print where node N's simulated-GPU spec lives on this machine

Everything it creates is named gpuops-lab-*: containers gpuops-lab-node-N, volumes
gpuops-lab-node-N-containerd, bridges gpuopslabN, state under $GPUOPS_LAB_DIR
(default $GPUOPS_CACHE/lab). Ports on 127.0.0.1 (chosen high and unusual, below the ephemeral
range): etcd 26379/26380, kube-apiserver 26443, kubelet of node N 26250+N, its healthz 26270+N,
kube-controller-manager 26290, kube-scheduler 26291 (their healthz), sshd of node N 26230+N.
Every node runs sshd (its own host keys) and has the user gpuops with passwordless sudo, logging in
with the key $GPUOPS_LAB_DIR/ssh/id_ed25519 that `up` generates; known_hosts is beside it.
GPUOPS_LAB_INSTANCE=I (1-4) runs another lab beside the default one (0): names gpuops-labI-*,
bridges gpuopslabIN, ports +1000*I, subnets 10.(231+I).N.0/24, state under $GPUOPS_CACHE/labI.
`inventory` serves the container toolkit repository and the device plugin's wheels on
127.0.0.1:31000+I, and gives node N's device plugin the metrics port 31010+10*I+N and the dcgm metrics
port 31110+10*I+N.
`inventory` and `simulate` start the process nvml-state, which rewrites each node's mock NVML state
whenever its spec changes.
`down` removes only this instance's processes, containers, volumes, bridges and cgroups.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import LabError
from .config import HERE, MAX_NODES, PROCESSES, REPO, LabConfig
from .controlplane import kubectl, running_pid, start_control_plane, stop
from .inventory import inventory, nvml_state_up, simulate, specs_given
from .nodes import (
    build_images,
    detect_node_ip,
    instance_containers,
    node_exec_argv,
    prepare_node,
    remove_node_containers,
    remove_volumes_and_bridges,
    ssh_argv,
    start_node,
    wait_nodes_ready,
    write_node_config,
)
from .pki import make_pki, make_ssh_key, write_kubeconfigs
from .util import log, run

USAGE = __doc__ or ""
NOT_UP = "the lab is not up (run: lab.py up)"


def require_bin(cfg: LabConfig) -> Path:
    bin_dir = cfg.bin_dir()
    if bin_dir is None:
        raise LabError(NOT_UP)
    return bin_dir


def cmd_up(cfg: LabConfig, args: Sequence[str]) -> int:
    """Bring the lab up with N nodes (or keep it, when it is up with N)."""
    start = time.monotonic()
    wanted = args[0] if args else cfg.nodes_default
    if not re.fullmatch(r"[1-9]", wanted):
        raise LabError(f"the node count must be 1-{MAX_NODES}, got '{wanted}'")
    count = int(wanted)
    old = cfg.node_count()
    if old > 0 and old != count:
        raise LabError(f"the lab is up with {old} node(s); run 'lab.py down' first to change that to {count}")
    cfg.lab.mkdir(parents=True, exist_ok=True)
    log("building or reusing the Kubernetes binaries")
    bin_dir = Path(run([HERE / "build-kubernetes.sh"], what="tests/e2e/build-kubernetes.sh").stdout.strip())
    (cfg.lab / "bin.path").write_text(f"{bin_dir}\n")
    make_pki(cfg)
    make_ssh_key(cfg)
    write_kubeconfigs(cfg)
    # containerd 1.7 (built once from its Go module and cached, as the integration tier does) replaces
    # Debian's 1.6 in every node: 1.6 has no CDI, which DRA nodes need.
    log("building or reusing containerd 1.7")
    containerd = Path(
        run([REPO / "scripts" / "build-containerd17.sh"], what="scripts/build-containerd17.sh").stdout.strip()
    )
    (cfg.lab / "containerd.path").write_text(f"{containerd}\n")
    image = build_images(cfg, bin_dir)
    (cfg.lab / "nodes.count").write_text(f"{count}\n")
    node_ip = detect_node_ip(os.environ.get("GPUOPS_LAB_NODE_IP"))
    log("starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler on 127.0.0.1")
    start_control_plane(cfg, bin_dir)
    for index in range(1, count + 1):
        write_node_config(cfg, index, node_ip)
        start_node(cfg, index, image, bin_dir, containerd)
    for index in range(1, count + 1):
        prepare_node(cfg, index)
    wait_nodes_ready(cfg, bin_dir, count)
    if specs_given(cfg, count):
        # The nodes were given simulated GPUs before (a lab brought up again): keep their NVML following the specs.
        nvml_state_up(cfg, count)
    log(f"lab up with {count} node(s) in {int(time.monotonic() - start)}s; kubeconfig: {cfg.admin_kubeconfig}")
    return 0


def cmd_down(cfg: LabConfig) -> int:
    """Stop and remove everything this instance created, and nothing of any other instance."""
    remove_node_containers(cfg, instance_containers(cfg))
    remove_volumes_and_bridges(cfg)
    for process in reversed(PROCESSES):
        stop(cfg, process)
    if cfg.lab.is_dir():
        shutil.rmtree(cfg.lab)
        log("lab removed")
    return 0


def cmd_status(cfg: LabConfig) -> int:
    """The control-plane processes, this instance's node containers and its nodes."""
    for process in PROCESSES:
        pid = running_pid(cfg, process)
        print(f"{process}: running (pid {pid})" if pid else f"{process}: stopped", flush=True)
    subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={cfg.instance_label}", "--format", "{{.Names}}: {{.Status}}"],
        check=False,
    )
    bin_dir = cfg.bin_dir()
    if running_pid(cfg, "kube-apiserver") and bin_dir is not None:
        return subprocess.run(
            [str(a) for a in kubectl(cfg, bin_dir, "get", "nodes", "-o", "wide")], check=False
        ).returncode
    return 0


def exec_command(argv: Sequence[str | Path]) -> int:
    """Replace this process with ``argv`` (its exit status is the command's)."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [str(a) for a in argv]
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        raise LabError(f"cannot run {argv[0]} ({error.strerror})") from error
    return 127  # not reached


def dispatch(cfg: LabConfig, command: str, args: list[str]) -> int:
    """Run one lab command; returns its exit status."""
    if command == "up":
        return cmd_up(cfg, args)
    if command == "down":
        return cmd_down(cfg)
    if command == "status":
        return cmd_status(cfg)
    if command == "images":
        print(build_images(cfg, None))
        return 0
    if command == "kubeconfig":
        if not cfg.admin_kubeconfig.is_file():
            raise LabError(NOT_UP)
        print(cfg.admin_kubeconfig)
        return 0
    if command == "kubectl":
        return exec_command(kubectl(cfg, require_bin(cfg), *args))
    if command == "node-exec":
        if len(args) < 2:
            raise LabError("usage: lab.py node-exec N COMMAND...")
        return exec_command(node_exec_argv(cfg, args[0], *args[1:]))
    if command == "ssh":
        if not args or not re.fullmatch(r"[1-9]", args[0]):
            raise LabError("usage: lab.py ssh N [COMMAND...]")
        if not cfg.ssh_key.is_file():
            raise LabError(NOT_UP)
        return exec_command(ssh_argv(cfg, int(args[0]), *args[1:]))
    if command == "inventory":
        text = inventory(cfg, args)
        sys.stdout.write(text)
        return 0
    if command == "simulate":
        simulate(cfg, args)
        return 0
    if command == "spec-path":
        if not args or not re.fullmatch(r"[1-9]", args[0]):
            raise LabError("usage: lab.py spec-path N")
        print(cfg.spec_path(int(args[0])))
        return 0
    if command == "nodes":
        for index in range(1, cfg.node_count() + 1):
            print(cfg.node_name(index))
        return 0
    sys.stdout.write(USAGE)
    return 0 if command in ("", "help") else 2


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``lab.py COMMAND [ARGS...]``; user errors are one ``[lab] error:`` line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    try:
        cfg = LabConfig.from_env()
        return dispatch(cfg, command, args)
    except LabError as error:
        print(f"[lab] error: {error}", file=sys.stderr, flush=True)
        return error.code
    except KeyboardInterrupt:
        print("[lab] error: interrupted", file=sys.stderr, flush=True)
        return 130
