"""A lab node whose device plugin runs from the DaemonSet: site.yml with ``device_plugin_mode=daemonset``,
shared by test_site_daemonset.py and test_upgrade_driver.py (run once per test session).

The plugin image is built locally (files/device_plugin/build-image.sh) and handed to the role as an OCI
archive, which the role imports into the node's containerd; the DaemonSet's pod reads the GPUs through
NVML, the node's mock libnvidia-ml.so.1 (docs/mock-nvml.md), found under the node's root mounted at
/driver-root. The node is the lab's last one (the systemd-mode flow uses the first), with
8 simulated GPUs (tests/fixtures/simulated/h100x8.yaml).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml
from conftest import Lab
from playbook_run import REPO, PlaybookRun, lab_inventory, run_playbook

GPU = "nvidia.com/gpu"
NAMESPACE = "gpuops-system"
DAEMONSET = "gpuops-device-plugin"
POD_SELECTOR = "app.kubernetes.io/name=gpuops-device-plugin"
MODE_LABEL = "gpuops.k8s/device-plugin"
SPEC = REPO / "tests" / "fixtures" / "simulated" / "h100x8.yaml"


@dataclass
class DaemonsetNode:
    node: str
    inventory: Path
    extra_vars: Path
    image: str
    first: PlaybookRun

    def run_site(self, *args: str, **extra: object) -> PlaybookRun:
        """site.yml on this node with the same variables (plus ``extra``, written to a file of its own)."""
        extra_vars = self.extra_vars
        if extra:
            merged = {**yaml.safe_load(self.extra_vars.read_text()), **extra}
            extra_vars = self.extra_vars.with_name("vars-" + "-".join(sorted(extra)) + ".yml")
            extra_vars.write_text(yaml.safe_dump(merged))
        return run_playbook("site.yml", self.inventory, *args, extra_vars=extra_vars, limit=self.node)


_prepared: DaemonsetNode | None = None
_archive: tuple[Path, str] | None = None


def build_plugin_archive(path: Path) -> str:
    """The plugin image, built (or reused: it is cached by content) and saved as an OCI archive at ``path``.
    build-image.sh runs once per session; a later call copies the archive it saved."""
    global _archive
    if _archive is None:
        built = subprocess.run(
            [str(REPO / "files" / "device_plugin" / "build-image.sh"), "--save", str(path)],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
            timeout=1800,
        )
        _archive = (path, built.stdout.strip().splitlines()[-1])
    elif _archive[0] != path:
        shutil.copyfile(_archive[0], path)
    return _archive[1]


def daemonset_node(lab: Lab, work: Path) -> DaemonsetNode:
    """site.yml in daemonset mode on the lab's last node, once per session."""
    global _prepared
    if _prepared is None:
        node = lab.nodes[-1]
        work.mkdir(parents=True, exist_ok=True)
        inventory = lab_inventory(work / "inventory.yml")
        archive = work / "gpu-device-plugin.oci.tar"
        image = build_plugin_archive(archive)
        extra_vars = work / "vars.yml"
        extra_vars.write_text(
            yaml.safe_dump(
                {
                    "device_plugin_mode": "daemonset",
                    "device_plugin_image": image,
                    "device_plugin_image_archive": str(archive),
                    # Recovery on (off by default, as in NVIDIA's plugin), so that a GPU marked unhealthy
                    # can come back.
                    "device_plugin_config": {
                        "version": "v1",
                        "flags": {"migStrategy": "none", "plugin": {"passDeviceSpecs": True}},
                        "gpuops": {"healthRecoverySeconds": 1},
                    },
                }
            )
        )
        first = run_playbook("site.yml", inventory, "--diff", extra_vars=extra_vars, limit=node)
        _prepared = DaemonsetNode(node=node, inventory=inventory, extra_vars=extra_vars, image=image, first=first)
    return _prepared
