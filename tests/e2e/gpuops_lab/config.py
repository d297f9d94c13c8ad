"""Names, ports, subnets and paths of one lab instance, all derived from the environment.

Instance 0 is the default lab; instances 1-4 run beside it with names ``gpuops-labI-*``, bridges
``gpuopslabIN``, ports +1000*I, subnets 10.(231+I).N.0/24 and state under ``$GPUOPS_CACHE/labI``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import LabError

HERE = Path(__file__).resolve().parent.parent
REPO = HERE.parent.parent
PAUSE_IMAGE = "localhost/gpuops-lab-pause:1.0"
NODE_IMAGE_REPO = "localhost/gpuops-lab-node"
SSH_USER = "gpuops"
# Where a node's simulated-GPU spec is, inside the node (the node's config directory is mounted at
# /etc/gpuops-lab, so an edit on this machine is an edit on the node, seen by inotify there).
NODE_SPEC_PATH = "/etc/gpuops-lab/simulated/gpus.yaml"
# The mock NVML library's state, written next to the spec (tests/mock_nvml/nvml_state.py) and found by the
# library through a relative symlink beside it in the node (docs/lab.md).
NVML_STATE_NAME = "mock-nvml.state"
MAX_NODES = 9
# The control-plane processes, in the order `status` lists them and the reverse of how `down` stops them.
PROCESSES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "serve", "nvml-state")


@dataclass(frozen=True)
class LabConfig:
    """One lab instance: everything it names and where it listens."""

    instance: int
    cache: Path
    lab: Path
    nodes_default: str
    connection: str
    mirror: str
    ready_timeout: int
    python: str
    # A control plane of its own (controlplane.scratch_config, for the integration tier) moves every port by
    # this much instead of by the instance's 1000 * I.
    port_offset_override: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LabConfig:
        """The instance the environment selects (GPUOPS_LAB_INSTANCE, GPUOPS_CACHE, GPUOPS_LAB_DIR, ...)."""
        env = os.environ if env is None else env
        cache = Path(env.get("GPUOPS_CACHE") or Path(env.get("HOME", "~")).expanduser() / ".cache" / "gpuops")
        raw = env.get("GPUOPS_LAB_INSTANCE") or "0"
        if not re.fullmatch(r"[0-4]", raw):
            raise LabError(f"GPUOPS_LAB_INSTANCE must be 0-4, got {raw}", code=2)
        instance = int(raw)
        suffix = "" if instance == 0 else str(instance)
        timeout = env.get("GPUOPS_LAB_READY_TIMEOUT") or "240"
        if not timeout.isdigit():
            raise LabError(f"GPUOPS_LAB_READY_TIMEOUT must be a number of seconds, got '{timeout}'")
        return cls(
            instance=instance,
            cache=cache,
            lab=Path(env.get("GPUOPS_LAB_DIR") or cache / f"lab{suffix}"),
            nodes_default=env.get("GPUOPS_LAB_NODES") or "1",
            connection=env.get("GPUOPS_LAB_CONNECTION") or "ssh",
            mirror=env.get("GPUOPS_DEBIAN_MIRROR", ""),
            ready_timeout=int(timeout),
            python=env.get("GPUOPS_PYTHON") or "python3",
        )

    @classmethod
    def scratch(cls, directory: Path, port_offset: int) -> LabConfig:
        """A control plane of its own in ``directory`` (no nodes), its ports moved by ``port_offset``: what the
        integration tier's API server tests start (controlplane.free_port_offset picks a free offset)."""
        return cls(
            instance=0,
            cache=directory,
            lab=directory,
            nodes_default="0",
            connection="ssh",
            mirror="",
            ready_timeout=240,
            python="python3",
            port_offset_override=port_offset,
        )

    # --- names -------------------------------------------------------------------------------
    @property
    def suffix(self) -> str:
        """'' for instance 0, else the instance number (gpuops-lab3-node-1)."""
        return "" if self.instance == 0 else str(self.instance)

    @property
    def name(self) -> str:
        """The lab's own name: etcd's member name and the API server's etcd prefix."""
        return f"gpuops-lab{self.suffix}"

    def node_name(self, index: int | str) -> str:
        """Node container, hostname, Kubernetes node and cgroup root of node ``index`` (1-based)."""
        return f"gpuops-lab{self.suffix}-node-{index}"

    def bridge_name(self, index: int) -> str:
        """The CNI bridge of node ``index`` on this machine."""
        return f"gpuopslab{self.suffix}{index}"

    def volume_names(self, index: int) -> tuple[str, str]:
        """The podman volumes of node ``index``: containerd's state and the kubelet's."""
        name = self.node_name(index)
        return f"{name}-containerd", f"{name}-kubelet"

    @property
    def instance_label(self) -> str:
        """The podman label every node container of this instance carries."""
        return f"gpuops-lab-instance={self.instance}"

    # --- ports and subnets ---------------------------------------------------------------------
    @property
    def port_offset(self) -> int:
        if self.port_offset_override is not None:
            return self.port_offset_override
        return self.instance * 1000

    @property
    def etcd_port(self) -> int:
        return 26379 + self.port_offset

    @property
    def etcd_peer_port(self) -> int:
        return 26380 + self.port_offset

    @property
    def api_port(self) -> int:
        return 26443 + self.port_offset

    def kubelet_port(self, index: int) -> int:
        return 26250 + self.port_offset + index

    def healthz_port(self, index: int) -> int:
        return 26270 + self.port_offset + index

    @property
    def controller_manager_port(self) -> int:
        return 26290 + self.port_offset

    @property
    def scheduler_port(self) -> int:
        return 26291 + self.port_offset

    def ssh_port(self, index: int) -> int:
        return 26230 + self.port_offset + index

    @property
    def serve_port(self) -> int:
        """Where `inventory` serves the toolkit repository and the device plugin's wheels."""
        return 31000 + self.instance

    def metrics_port(self, index: int) -> int:
        """The device plugin's metrics port on node ``index``."""
        return 31010 + 10 * self.instance + index

    def dcgm_port(self, index: int) -> int:
        """The daemon's dcgm metrics port on node ``index`` (dcgm-exporter's 9400 on a node of its own)."""
        return 31110 + 10 * self.instance + index

    @property
    def net_prefix(self) -> str:
        """The first two octets of this instance's service range and pod subnets."""
        return f"10.{231 + self.instance}"

    def pod_subnet(self, index: int) -> str:
        return f"{self.net_prefix}.{index}.0/24"

    @property
    def service_range(self) -> str:
        return f"{self.net_prefix}.0.0/24"

    # --- paths ---------------------------------------------------------------------------------
    @property
    def pki(self) -> Path:
        return self.lab / "pki"

    @property
    def run_dir(self) -> Path:
        return self.lab / "run"

    @property
    def logs(self) -> Path:
        return self.lab / "logs"

    @property
    def ssh_dir(self) -> Path:
        return self.lab / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.lab / "admin.kubeconfig"

    def node_dir(self, index: int) -> Path:
        """The node's configuration directory, mounted read-only at /etc/gpuops-lab in the node."""
        return self.lab / "nodes" / self.node_name(index)

    def spec_path(self, index: int) -> Path:
        """Node ``index``'s simulated-GPU spec on this machine."""
        return self.node_dir(index) / "simulated" / "gpus.yaml"

    def nvml_state_path(self, index: int) -> Path:
        """Node ``index``'s mock NVML state on this machine, next to its spec."""
        return self.spec_path(index).with_name(NVML_STATE_NAME)

    def nvidia_devices_script(self, index: int) -> Path:
        """The script that makes node ``index``'s NVIDIA device nodes (/etc/gpuops-lab/nvidia-devices.sh there)."""
        return self.node_dir(index) / "nvidia-devices.sh"

    def pid_file(self, process: str) -> Path:
        return self.run_dir / f"{process}.pid"

    def node_count(self) -> int:
        """How many nodes the lab was brought up with (0: not up)."""
        try:
            return int((self.lab / "nodes.count").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def bin_dir(self) -> Path | None:
        """The Kubernetes binaries the lab runs, once `up` has recorded them."""
        try:
            return Path((self.lab / "bin.path").read_text().strip())
        except OSError:
            return None
