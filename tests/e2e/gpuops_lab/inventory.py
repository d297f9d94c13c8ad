"""What playbooks/site.yml needs on the lab's nodes, and an Ansible inventory that says so.

Nothing NVIDIA's servers or a package index would give a real node is fetched at run time: the container
toolkit comes from the signed local repository (scripts/build-toolkit-repo.sh) and the device plugin's
pinned wheels from a wheelhouse, both served on 127.0.0.1 (the nodes share the machine's network).
Debian's own packages come from the node's apt sources.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from . import LabError
from .config import NODE_SPEC_PATH, REPO, SSH_USER, LabConfig
from .controlplane import curl, start_bg
from .nodes import node_exec_argv
from .util import log, run, succeeds, wait_for

SPECS = REPO / "tests" / "fixtures" / "simulated"
DEFAULT_SPEC = "h100x8"


def resolve_spec(spec: str, specs: Path = SPECS) -> Path:
    """A simulated-GPU spec given as a file, or as a name under tests/fixtures/simulated/."""
    if Path(spec).is_file():
        return Path(spec)
    if (specs / f"{spec}.yaml").is_file():
        return specs / f"{spec}.yaml"
    known = " ".join(sorted(p.stem for p in specs.glob("*.yaml")))
    raise LabError(f"no simulated-GPU spec '{spec}' (give a file, or one of: {known})")


def wheelhouse(cfg: LabConfig) -> Path:
    """The device plugin's pinned dependencies in both allocation modes (roles/device_plugin/defaults),
    with what they need, downloaded once into a wheelhouse keyed by the pins."""
    defaults = REPO / "roles" / "device_plugin" / "defaults" / "main.yml"
    read = subprocess.run(
        [
            cfg.python,
            "-c",
            "import sys, yaml; d = yaml.safe_load(open(sys.argv[1]));"
            ' print(" ".join(sorted(d["device_plugin_pip_packages"] + d["device_plugin_dra_pip_packages"])), end="")',
            str(defaults),
        ],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if read.returncode != 0:
        raise LabError(f"cannot read the plugin's pins with {cfg.python} (it needs PyYAML)")
    pins = read.stdout
    key = hashlib.sha256(pins.encode()).hexdigest()[:12]
    directory = cfg.cache / "wheels" / f"cluster-plugin-{key}"
    if not (directory / ".complete").is_file():
        log(f"downloading the device plugin's pinned wheels into {directory}")
        run(
            [cfg.python, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", directory, *pins.split()],
            what="pip download",
            stdout=sys.stderr,
        )
        (directory / ".complete").touch()
    return directory


def serve_up(cfg: LabConfig) -> None:
    """Serve the toolkit repository and the wheels on 127.0.0.1:31000+I."""
    toolkit = run([REPO / "scripts" / "build-toolkit-repo.sh"], what="scripts/build-toolkit-repo.sh").stdout.strip()
    wheels = wheelhouse(cfg)
    serve = cfg.lab / "serve"
    serve.mkdir(parents=True, exist_ok=True)
    for link, target in (("toolkit", Path(toolkit)), ("wheels", wheels)):
        path = serve / link
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(target)
    start_bg(
        cfg,
        "serve",
        [cfg.python, "-m", "http.server", "--bind", "127.0.0.1", "--directory", serve, str(cfg.serve_port)],
    )
    wait_for(
        f"the toolkit repository and the wheels served on 127.0.0.1:{cfg.serve_port}",
        30,
        lambda: succeeds(curl(f"http://127.0.0.1:{cfg.serve_port}/toolkit/gpgkey")),
        cfg.logs,
    )


def prepare_node_for_site(cfg: LabConfig, index: int, spec: Path) -> None:
    """The node's simulated-GPU spec, and what a fresh Debian node has and the lab's image lacks: apt's
    package lists; plus PyYAML, with which nvidia_gpu_info reads the spec."""
    name = cfg.node_name(index)
    target = cfg.spec_path(index)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written in place: the node sees the same file, and the plugin's watch sees the write.
    with open(target, "wb") as handle:
        handle.write(spec.read_bytes())
    if not succeeds(node_exec_argv(cfg, index, "python3", "-c", "import yaml")):
        log(f"{name}: fetching apt's package lists and installing python3-yaml")
        install = (
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends"
            " python3-yaml >/dev/null"
        )
        done = subprocess.run(node_exec_argv(cfg, index, "sh", "-c", install), stdout=sys.stderr, check=False)
        if done.returncode != 0:
            raise LabError(f"{name}: apt-get could not install python3-yaml")


def inventory_text(cfg: LabConfig, count: int) -> str:
    """The inventory YAML for ``count`` nodes, reached as ``cfg.connection`` says (ssh or podman)."""
    ssh = cfg.connection == "ssh"
    lines = [
        f"# Written by tests/e2e/lab.py inventory (lab instance {cfg.instance})"
        " for playbooks/site.yml and validate.yml.",
        "all:",
        "  hosts:",
        "    # The Kubernetes API is reached from the control host, with the Python that runs Ansible.",
        "    localhost:",
        "      ansible_connection: local",
        '      ansible_python_interpreter: "{{ ansible_playbook_python }}"',
        "  children:",
        "    gpu_nodes:",
        "      hosts:",
    ]
    for index in range(1, count + 1):
        name = cfg.node_name(index)
        lines += [
            f"        {name}:",
            f"          gpu_node_labels_node_name: {name}",
            f'          device_plugin_metrics_address: "127.0.0.1:{cfg.metrics_port(index)}"',
        ]
        if ssh:
            lines += ["          ansible_host: 127.0.0.1", f"          ansible_port: {cfg.ssh_port(index)}"]
    lines.append("      vars:")
    if ssh:
        # What a fleet uses: an unprivileged login with sudo, one pipelined SSH session per task, and the
        # connection kept open between tasks (ControlPersist). The host keys are checked.
        lines += [
            "        ansible_connection: ssh",
            f"        ansible_user: {SSH_USER}",
            f"        ansible_ssh_private_key_file: {cfg.ssh_key}",
            "        ansible_ssh_common_args: >-",
            f"          -o UserKnownHostsFile={cfg.known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
            "        ansible_ssh_args: -o ControlMaster=auto -o ControlPersist=300s -o ServerAliveInterval=30",
            "        ansible_ssh_pipelining: true",
            "        ansible_become: true",
        ]
    else:
        lines.append("        ansible_connection: containers.podman.podman")
    kubeconfig = cfg.admin_kubeconfig
    lines += [
        "        ansible_python_interpreter: /usr/bin/python3",
        f"        # Simulated GPUs (labs and CI only): the spec at {NODE_SPEC_PATH} on each node,",
        f"        # {cfg.lab}/nodes/<node>/simulated/gpus.yaml on this machine.",
        f"        gpuops_simulate_from: {NODE_SPEC_PATH}",
        "        device_plugin_backend: simulated",
        f"        device_plugin_simulated_spec: {NODE_SPEC_PATH}",
        f'        container_toolkit_repo_base_url: "http://127.0.0.1:{cfg.serve_port}/toolkit"',
        '        container_toolkit_version: "1.17.8"',
        f'        device_plugin_pip_extra_args: "--no-index --find-links http://127.0.0.1:{cfg.serve_port}/wheels/"',
        f"        gpu_node_labels_kubeconfig: {kubeconfig}",
        f"        device_plugin_kubeconfig: {kubeconfig}",
        "        # DRA nodes (gpu_allocation_mode: dra) reach the API server with the kubelet's own credentials.",
        "        device_plugin_dra_kubeconfig: /etc/gpuops-lab/kubelet.kubeconfig",
    ]
    return "".join(f"{line}\n" for line in lines)


def check_inventory_args(cfg: LabConfig, specs: list[str]) -> int:
    """The node count, once the lab is up, the specs fit it and the connection is known."""
    count = cfg.node_count()
    if count <= 0:
        raise LabError("the lab is not up (run: lab.py up)")
    if len(specs) > count:
        raise LabError(f"{len(specs)} specs given for {count} node(s)")
    if cfg.connection not in ("ssh", "podman"):
        raise LabError(f"GPUOPS_LAB_CONNECTION must be ssh or podman, got '{cfg.connection}'")
    return count


def inventory(cfg: LabConfig, specs: list[str]) -> str:
    """Prepare the running lab's nodes for site.yml (spec i on node i, h100x8 on the rest); the inventory."""
    count = check_inventory_args(cfg, specs)
    serve_up(cfg)
    for index in range(1, count + 1):
        spec = resolve_spec(specs[index - 1] if index <= len(specs) else DEFAULT_SPEC)
        prepare_node_for_site(cfg, index, spec)
    return inventory_text(cfg, count)
