# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the gpu_remediation role decides from its reads of the node (vars/main.yml), rendered with Ansible's own
templar from the role's defaults and vars, given gpuops.k8s.node_state and gpuops.k8s.nvidia_gpu_info results built
here: whether one GPU of a node with NVSwitches can be reset alone (else the node is rebooted, with the sentence),
and which of the node's services that hold GPUs a reset stops and starts again. The e2e tier
(tests/e2e/test_remediate.py) runs the role's tasks on a node without NVSwitches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLE = Path(__file__).resolve().parents[3] / "roles" / "gpu_remediation"
FABRIC_MANAGER = "nvidia-fabricmanager.service"


def role_vars(**given: Any):
    """The role's variables as its tasks see them, with GIVEN as inventory and registered results."""
    loader = DataLoader()
    variables: dict[str, Any] = {"role_path": str(ROLE), "inventory_hostname": "gpu-1"}
    variables.update(loader.load_from_file(str(ROLE / "defaults" / "main.yml"), trusted_as_template=True))
    variables.update(given)
    variables.update(loader.load_from_file(str(ROLE / "vars" / "main.yml"), trusted_as_template=True))
    templar = Templar(loader=loader, variables=variables)
    return lambda name: templar.template(trust_as_template("{{ " + name + " }}"))


def node(active: tuple[str, ...] = ()) -> dict[str, Any]:
    """A node_state result whose units are active where ACTIVE names them, inactive or absent otherwise."""
    units = ["gpuops-device-plugin.service", FABRIC_MANAGER, "nvsm.service", "nvidia-dcgm.service"]
    return {
        "units": {u: {"active_state": "active" if u in active else "inactive"} for u in units},
        "paths": {},
        "contents": {},
    }


def gpu_info(*compute_capabilities: str, switches: int = 6, nvml: bool = True) -> dict[str, Any]:
    """An nvidia_gpu_info result: GPUs of these compute capabilities, and SWITCHES NVSwitches on the PCI bus."""
    return {
        "changed": False,
        "nvml_available": nvml,
        "nvml_unavailable_reason": "" if nvml else "NVML could not be initialised: Driver Not Loaded.",
        "gpus": [{"index": i, "compute_capability": cc} for i, cc in enumerate(compute_capabilities)] if nvml else [],
        "nvswitch_devices": [{"bus_id": f"0000:{0x80 + i:02x}:00.0"} for i in range(switches)],
    }


@pytest.mark.parametrize(
    ("info", "active", "expected"),
    [
        pytest.param(gpu_info("9.0", "9.0", switches=0), (), "", id="no-nvswitch"),
        pytest.param(gpu_info("9.0", "9.0"), (), "", id="hopper-without-fabric-manager"),
        pytest.param(gpu_info("10.0"), (), "", id="blackwell"),
        pytest.param(gpu_info("8.0", "8.0"), (FABRIC_MANAGER,), "", id="ampere-with-fabric-manager"),
        pytest.param(
            gpu_info("8.0", "8.0"),
            (),
            "the node has 6 NVSwitch(es) and Ampere GPUs, which need Fabric Manager (nvidia-fabricmanager.service) "
            "running to reset one GPU, and it is not running",
            id="ampere-without-fabric-manager",
        ),
        pytest.param(
            gpu_info("7.0", "7.0", switches=12),
            (FABRIC_MANAGER,),
            "the node has 12 NVSwitch(es) and GPUs older than Ampere, which are reset only all together",
            id="volta",
        ),
        pytest.param(
            gpu_info(nvml=False),
            (FABRIC_MANAGER,),
            "the node has 6 NVSwitch(es) and NVML did not answer (NVML could not be initialised: Driver Not "
            "Loaded.), so it cannot be told whether one GPU may be reset alone",
            id="nvml-unavailable",
        ),
        # Read only where the node's faults call for a reset.
        pytest.param(
            {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}, (), "", id="not-read"
        ),
    ],
)
def test_one_gpu_of_an_nvswitch_node_is_reset_only_where_nvidia_smi_can(info, active, expected):
    get = role_vars(__gpu_remediation_gpu_info=info, __gpu_remediation_node=node(active))
    assert get("__gpu_remediation_nvswitch_note") == expected


def test_the_services_that_hold_gpus_are_those_of_the_setting_that_run():
    get = role_vars(
        __gpu_remediation_node=node(("nvidia-dcgm.service", FABRIC_MANAGER, "gpuops-device-plugin.service"))
    )
    # Fabric Manager and the daemon run too: neither is in the setting (the daemon is stopped on its own).
    assert get("__gpu_remediation_reset_holders") == ["nvidia-dcgm.service"]
    get = role_vars(
        __gpu_remediation_node=node(("nvsm.service", "nvidia-dcgm.service")),
        gpu_remediation_reset_stop_units=["nvidia-dcgm.service"],
    )
    assert get("__gpu_remediation_reset_holders") == ["nvidia-dcgm.service"]
    assert role_vars(__gpu_remediation_node=node())("__gpu_remediation_reset_holders") == []


def failure(**given: Any) -> str:
    """Why the remediation stopped, as tasks/remediate.yml's rescue notes it, for a reset of GPU-1 on gpu-1."""
    plan = {"nodes": [{"host": "gpu-1", "gpus": [{"uuid": "GPU-1"}]}]}
    return role_vars(__gpu_remediation_plan=plan, __gpu_remediation_class="reset", **given)(
        "__gpu_remediation_failure_text"
    )


def test_a_wait_for_healthy_gpus_that_runs_out_says_how_the_daemon_last_showed_them():
    after = {
        "failed": True,
        "msg": "Task failed: Action failed: Unknown error.",
        "gpus": [
            {"uuid": "GPU-1", "class": "reset", "healthy": False},
            {"uuid": "GPU-2", "class": "none", "healthy": True},
        ],
    }
    waited = {"msg": "Task failed: Action failed: Unknown error."}
    given = {"__gpu_remediation_stage": "verify", "ansible_failed_result": waited}
    assert failure(__gpu_remediation_after=after, **given) == "the daemon last showed GPU-1 reset unhealthy"
    # After a reboot: every GPU of the node.
    rebooted = role_vars(
        __gpu_remediation_plan={"nodes": [{"host": "gpu-1", "gpus": []}]},
        __gpu_remediation_class="reboot",
        __gpu_remediation_after=after,
        **given,
    )
    assert rebooted("__gpu_remediation_failure_text") == (
        "the daemon last showed GPU-1 reset unhealthy, GPU-2 none healthy"
    )


def test_a_reset_that_fails_says_the_commands_own_words():
    result = {
        "failed": True,
        "msg": "One or more items failed",
        "results": [
            {
                "failed": True,
                "item": "GPU-1",
                "cmd": ["nvidia-smi", "--gpu-reset", "-i", "GPU-1"],
                "rc": 255,
                "stderr_lines": [
                    "The following GPUs could not be reset:",
                    "  GPU 00000000:1A:00.0: In use by another client",
                ],
            }
        ],
    }
    assert failure(
        __gpu_remediation_stage="reset", ansible_failed_result=result, ansible_failed_task={"name": "Reset each GPU"}
    ) == ("Reset each GPU: nvidia-smi --gpu-reset -i GPU-1 exited 255: GPU 00000000:1A:00.0: In use by another client")
    # Any other task: its message.
    assert (
        failure(
            __gpu_remediation_stage="evict",
            ansible_failed_result={"failed": True, "msg": "2 pods were not evicted within 600 s."},
            ansible_failed_task={"name": "Evict those pods, as their PodDisruptionBudgets allow"},
        )
        == "Evict those pods, as their PodDisruptionBudgets allow: 2 pods were not evicted within 600 s."
    )


def test_a_failure_before_the_class_is_known_is_said_too():
    get = role_vars(
        __gpu_remediation_stage="cordon",
        ansible_failed_result={"failed": True, "msg": "the API server did not answer."},
        ansible_failed_task={"name": "Cordon and taint the node"},
    )
    assert get("__gpu_remediation_failure_text") == "Cordon and taint the node: the API server did not answer."


def node_read(capacity: dict[str, str] | None) -> dict[str, Any]:
    """kubernetes.core.k8s_info's result for the Node, whose status.capacity is CAPACITY (None: no status yet)."""
    resource: dict[str, Any] = {"metadata": {"name": "gpu-1"}}
    if capacity is not None:
        resource["status"] = {"capacity": dict(capacity, cpu="64", pods="110")}
    return {"changed": False, "api_found": True, "resources": [resource]}


HAD = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}


@pytest.mark.parametrize(
    ("capacity", "missing"),
    [
        pytest.param(HAD, [], id="all-back"),
        pytest.param(dict(HAD, **{"nvidia.com/mig-2g.20gb": "8"}), [], id="more-is-not-less"),
        pytest.param(
            dict(HAD, **{"nvidia.com/mig-1g.10gb": "49"}),
            [{"key": "nvidia.com/mig-1g.10gb", "value": "56"}],
            id="one-gpu-lost-its-mig-devices",
        ),
        pytest.param(
            {"nvidia.com/gpu": "8"},
            [{"key": "nvidia.com/gpu", "value": "0"}, {"key": "nvidia.com/mig-1g.10gb", "value": "56"}],
            id="mig-gone",
        ),
        pytest.param(
            None,
            [{"key": "nvidia.com/gpu", "value": "0"}, {"key": "nvidia.com/mig-1g.10gb", "value": "56"}],
            id="no-status",
        ),
    ],
)
def test_the_gpu_resources_the_node_had_are_waited_for_by_name_and_count(capacity, missing):
    get = role_vars(__gpu_remediation_current={"capacity": HAD}, __gpu_remediation_advertised=node_read(capacity))
    assert get("__gpu_remediation_capacity_missing") == missing


def test_a_node_that_had_no_gpu_resources_waits_for_none():
    # A Node in DRA allocation, or whose daemon was not serving when the remediation began.
    get = role_vars(__gpu_remediation_current={"capacity": {}}, __gpu_remediation_advertised=node_read({}))
    assert get("__gpu_remediation_capacity_missing") == []


def test_a_wait_for_the_gpu_resources_that_runs_out_says_what_the_node_advertises():
    lost = dict(HAD, **{"nvidia.com/mig-1g.10gb": "49"})
    lost.pop("nvidia.com/gpu")
    text = failure(
        __gpu_remediation_stage="advertise",
        __gpu_remediation_current={"capacity": HAD},
        __gpu_remediation_advertised=dict(node_read(lost), failed=True, attempts=100),
        ansible_failed_result={"failed": True, "msg": "Task failed: Action failed: Unknown error."},
    )
    assert text == (
        "the Node advertises nvidia.com/gpu: none where it had 0, nvidia.com/mig-1g.10gb: 49 where it had 56"
    )
