# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A remediation's reboot is refused, before the node is cordoned, where the kernel it boots next has no module of the
loaded driver (roles/gpu_remediation: vars/main.yml __gpu_remediation_boot_refusal, tasks/main.yml), from what the
nvidia_driver role's files/boot-kernel.sh prints, with the loaded module's version after it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLE = Path(__file__).resolve().parents[3] / "roles" / "gpu_remediation"
NEXT = "6.1.0-31-amd64"


def refusal(stdout: str) -> str:
    loader = DataLoader()
    variables: dict = {}
    variables.update(loader.load_from_file(str(ROLE / "defaults" / "main.yml"), trusted_as_template=True))
    variables.update(loader.load_from_file(str(ROLE / "vars" / "main.yml"), trusted_as_template=True))
    variables.update(inventory_hostname="gpu-1", __gpu_remediation_boot={"rc": 0, "stdout": stdout})
    return Templar(loader=loader, variables=variables).template(
        trust_as_template("{{ __gpu_remediation_boot_refusal }}")
    )


@pytest.mark.parametrize(
    ("what", "stdout", "refused"),
    [
        ("no kernel under /boot (a container)", "", ""),
        ("the loaded driver's module",
         f"kernel={NEXT}\nmodule=/x/nvidia.ko\nversion=580.95.05\nloaded=580.95.05\n", ""),
        ("a module where modinfo is not installed", f"kernel={NEXT}\nmodule=/x/nvidia.ko\nloaded=580.95.05\n", ""),
        ("no module", f"kernel={NEXT}\nversion=\nloaded=580.95.05\n",
         f"gpu-1 is not rebooted: the kernel it boots next ({NEXT}) has no NVIDIA kernel module, so it would come up"
         f" without its GPUs; build the module for that kernel (dkms autoinstall -k {NEXT}) and run again."),
        ("another driver's module", f"kernel={NEXT}\nmodule=/x/nvidia.ko\nversion=580.82.07\nloaded=580.95.05\n",
         f"gpu-1 is not rebooted: the kernel it boots next ({NEXT}) has NVIDIA kernel module 580.82.07, not the loaded"
         f" driver 580.95.05, so it would come up without its GPUs; rebuild the module for that kernel (dkms"
         f" autoinstall -k {NEXT}) and run again."),
    ],
)  # fmt: skip
def test_a_reboot_into_a_kernel_without_the_loaded_drivers_module_is_refused(what, stdout, refused):
    assert refusal(stdout) == refused, what


def test_the_refusal_comes_before_the_remediation_cordons_the_node():
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    names = [task.get("name") for task in tasks]
    refuse = names.index("Refuse a reboot into a kernel without the driver's module")
    assert refuse < names.index("Remediate the node")
    assert "__gpu_remediation_mine['class'] == 'reboot'" in tasks[refuse]["when"]
    read, stop = tasks[refuse]["block"]
    assert "/../nvidia_driver/files/boot-kernel.sh" in read["ansible.builtin.command"]["argv"][2]
    assert stop["ansible.builtin.fail"]["msg"] == "{{ __gpu_remediation_boot_refusal }}"
