import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.validation_row import FilterModule, validation_row

WANT = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2"}
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def gpu_info(count=2, mig=False):
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(count)]
    if mig and gpus:
        gpus[0]["mig_devices"] = [{"uuid": "MIG-1"}, {"uuid": "MIG-2"}, {"uuid": "MIG-3"}]
    return {"source": "simulated", "gpus": gpus}


def node(allocatable="2", labels=None, taints=(TAINT,), kubelet="v1.37.2"):
    return {
        "resources": [
            {
                "metadata": {"name": "gpu-1", "labels": dict(WANT, team="ml") if labels is None else labels},
                "spec": {"taints": list(taints)},
                "status": {
                    "allocatable": {"cpu": "8", "nvidia.com/gpu": allocatable}
                    if allocatable is not None
                    else {"cpu": "8"},
                    "nodeInfo": {"kubeletVersion": kubelet},
                },
            }
        ]
    }


def runtime(*changed):
    return {"results": [{"item": engine, "changed": engine in changed} for engine in ("containerd", "docker")]}


def slice_(generation, *health):
    devices = [{"name": f"gpu-{i}", "attributes": {"health": {"string": h}}} for i, h in enumerate(health)]
    return {"spec": {"pool": {"generation": generation}, "devices": devices}}


def pod(ready=True, deleting=False):
    meta = {"name": "gpuops-device-plugin-x"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def row(info=None, **options):
    given = {
        "node_name": "gpu-1",
        "node": node(),
        "runtime": runtime(),
        "want_labels": WANT,
        "metrics_address": "127.0.0.1:9402",
        "health": {"status": 200},
        "sockets": {"matched": 1},
        "cgroupfs": {"rc": 0, "stdout": "cgroup2fs\n"},
    }
    given.update(options)
    return validation_row(info or gpu_info(), **given)


def test_a_healthy_device_plugin_node_is_all_green():
    result = row()
    assert result == {
        "node": "gpu-1",
        "mode": "device-plugin",
        "model": "NVIDIA H100 80GB HBM3",
        "count": 2,
        "allocatable": 2,
        "published": "-",
        "unhealthy": "-",
        "claims": "-",
        "labels": "ok",
        "taint": "on",
        "plugin": "healthy",
        "cgroup_note": "",
        "fabric": "-",
        "checks": dict.fromkeys(("driver", "node", "runtime", "plugin", "allocatable", "labels", "taint"), True),
    }


@pytest.mark.parametrize(
    ("options", "red"),
    [
        ({"driver_ok": False}, "driver"),
        ({"node": {"resources": node()["resources"] * 2}}, "node"),
        ({"runtime": runtime("docker")}, "runtime"),
        ({"health": {"status": 0}}, "plugin"),
        ({"node": node(allocatable="1")}, "allocatable"),
        ({"node": node(allocatable=None)}, "allocatable"),
        ({"node": node(labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"})}, "labels"),
        ({"node": node(taints=())}, "taint"),
        ({"taint": False}, "taint"),
    ],
)
def test_each_check_turns_red_on_its_own(options, red):
    checks = row(**options)["checks"]
    assert [name for name, green in checks.items() if not green] == [red]


def test_a_node_without_gpus_is_red_for_allocatable_and_shows_no_model():
    result = row(gpu_info(count=0), node=node(allocatable="0"))
    assert (result["model"], result["count"], result["checks"]["allocatable"]) == ("-", 0, False)


def test_without_a_metrics_address_a_registered_socket_is_a_green_plugin():
    result = row(metrics_address="", health={"skipped": True})
    assert (result["plugin"], result["checks"]["plugin"]) == ("registered", True)
    result = row(metrics_address="", health={"skipped": True}, sockets={"matched": 0})
    assert (result["plugin"], result["checks"]["plugin"]) == ("down", False)
    # With a metrics address the health endpoint must answer, whatever the socket.
    assert row(health={"status": 0})["plugin"] == "down"


@pytest.mark.parametrize(
    ("pods", "registered", "plugin", "green"),
    [
        ([pod()], True, "ready", True),
        ([pod()], False, "ready", False),
        ([pod(ready=False)], True, "not-ready", False),
        ([], True, "no-pod", False),
        ([pod(deleting=True)], True, "no-pod", False),
        ([pod(deleting=True), pod()], True, "ready", True),
    ],
)
def test_daemonset_mode_judges_the_nodes_pod_of_the_daemonset(pods, registered, plugin, green):
    result = row(
        daemonset=True,
        health={"skipped": True},
        sockets={"matched": int(registered)},
        pods={"resources": pods},
    )
    assert (result["plugin"], result["checks"]["plugin"]) == (plugin, green)


def dra_row(info=None, slices=(), **options):
    given = {
        "dra": True,
        "node": node(allocatable=None),
        "sockets": {"skipped": True},
        "dra_socket": {"stat": {"exists": True}},
        "slices": {"resources": list(slices)},
        "claims": 3,
    }
    given.update(options)
    return row(info, **given)


def test_a_dra_node_publishing_each_gpu_is_green_and_counts_unhealthy_devices_without_red():
    result = dra_row(slices=[slice_(1, "Healthy", "Unhealthy")])
    assert (result["mode"], result["published"], result["unhealthy"], result["claims"]) == ("dra", 2, 1, 3)
    assert all(result["checks"].values()), result["checks"]
    assert list(result["checks"]) == [
        "driver",
        "node",
        "runtime",
        "plugin",
        "allocatable",
        "labels",
        "taint",
        "published",
    ]


def test_a_dra_node_that_advertises_nvidia_com_gpu_is_red():
    assert (
        dra_row(slices=[slice_(1, "Healthy", "Healthy")], node=node(allocatable="2"))["checks"]["allocatable"] is False
    )


def test_a_dra_node_missing_a_gpu_from_its_slices_is_red_for_published():
    result = dra_row(slices=[slice_(1, "Healthy")])
    assert (result["published"], result["checks"]["published"]) == (1, False)
    assert dra_row()["checks"]["published"] is False


def test_only_the_latest_generation_of_slices_counts():
    result = dra_row(slices=[slice_(1, "Healthy", "Healthy", "Unhealthy"), slice_(2, "Healthy", "Healthy")])
    assert (result["published"], result["unhealthy"], result["checks"]["published"]) == (2, 0, True)


def test_on_a_mig_node_some_published_devices_are_enough():
    assert dra_row(gpu_info(mig=True), slices=[slice_(1, "Healthy", "Healthy", "Healthy", "Healthy")])["checks"][
        "published"
    ]
    assert not dra_row(gpu_info(mig=True))["checks"]["published"]


def test_a_dra_node_without_its_registration_socket_is_a_red_plugin():
    result = dra_row(slices=[slice_(1, "Healthy", "Healthy")], health={"status": 0}, dra_socket={"skipped": True})
    assert (result["plugin"], result["checks"]["plugin"]) == ("down", False)


def test_a_cgroup_v1_node_gets_the_note_for_its_kubelet_and_a_failed_stat_gets_none():
    note = row(cgroupfs={"rc": 0, "stdout": "tmpfs\n"})["cgroup_note"]
    assert note.startswith("gpu-1: cgroup v1 (/sys/fs/cgroup is tmpfs, not cgroup2fs).")
    assert "1.37" in note
    assert row(cgroupfs={"rc": 1, "stdout": ""})["cgroup_note"] == ""


@pytest.mark.parametrize("info", [None, [], {"gpus": "none"}])
def test_an_input_that_is_not_a_gpu_info_result_is_one_sentence(info):
    with pytest.raises(AnsibleFilterError, match=r"^validation_row: the input must be a gpuops.k8s.nvidia_gpu_info"):
        validation_row(info, node_name="gpu-1", node={}, runtime={}, want_labels={})


def test_a_registered_result_that_is_not_a_dict_is_one_sentence():
    with pytest.raises(AnsibleFilterError, match=r"^validation_row: node must be a dict"):
        validation_row(gpu_info(), node_name="gpu-1", node=[], runtime={}, want_labels={})


def test_the_filter_is_registered():
    assert FilterModule().filters()["validation_row"] is validation_row


def test_a_driver_that_did_not_answer_is_red_with_nvmls_reason():
    reason = (
        "NVML could not be initialised (RM has detected an NVML/RM version mismatch: Driver/library version mismatch)"
    )
    result = row(driver_ok=False, driver_reason=reason)
    assert [name for name, green in result["checks"].items() if not green] == ["driver"]
    assert result["reason"] == f"driver: {reason}"
    # A green driver's reason (simulate_from's note) is no reason for the row.
    assert "reason" not in row(driver_reason="simulate_from is set, so NVML was not queried")


def test_the_boot_kernels_module_is_a_check_where_a_kernel_was_found():
    assert "boot_module" not in row(boot={"judged": False, "problem": ""})["checks"]
    assert "boot_module" not in row()["checks"]
    green = row(boot={"judged": True, "problem": ""})
    assert green["checks"]["boot_module"] is True and "reason" not in green
    problem = "the kernel it boots next (6.1.0-31-amd64) has no NVIDIA kernel module"
    red = row(boot={"judged": "True", "problem": problem})
    assert [name for name, ok in red["checks"].items() if not ok] == ["boot_module"]
    assert red["reason"] == f"boot_module: {problem}"
    both = row(
        driver_ok=False, driver_reason="NVML could not be initialised", boot={"judged": True, "problem": problem}
    )
    assert both["reason"] == f"driver: NVML could not be initialised; boot_module: {problem}"


# -- NVLink fabric services (docs/nvlink-fabric.md) ----------------------------------------------------------------


def fabric_info(*services):
    return dict(gpu_info(), nvlink_fabric={"shape": "test", "services": list(services)})


def fabric_state(fm=None, imex=None, nvlsm=False):
    """node_state's read: each unit's active_state, or None where the unit is not installed."""

    def unit(active):
        if active is None:
            return {"load_state": "not-found", "active_state": "inactive", "unit_file_state": None}
        return {"load_state": "loaded", "active_state": active, "unit_file_state": "enabled"}

    return {
        "units": {"nvidia-fabricmanager.service": unit(fm), "nvidia-imex.service": unit(imex)},
        "paths": {"/opt/nvidia/nvlsm/sbin/nvlsm": {"type": "file"} if nvlsm else {"type": "absent"}},
    }


def fabric_row(info, state, settings=None):
    return validation_row(
        info, "gpu-1", node(), runtime(), WANT, health={"status": 200}, fabric_state=state, fabric_settings=settings
    )


@pytest.mark.parametrize(
    ("services", "state", "fabric", "reason"),
    [
        ((), fabric_state(), "-", None),
        (("fabricmanager",), fabric_state(fm="active"), "fabricmanager active", None),
        (("fabricmanager",), fabric_state(fm="failed"), "fabricmanager inactive", "fabric: fabricmanager inactive"),
        (("fabricmanager",), fabric_state(), "fabricmanager missing", "fabric: fabricmanager missing"),
        (
            ("nvlsm", "fabricmanager"),
            fabric_state(fm="active", nvlsm=True),
            "nvlsm installed, fabricmanager active",
            None,
        ),
        (
            ("nvlsm", "fabricmanager"),
            fabric_state(fm="active"),
            "nvlsm missing, fabricmanager active",
            "fabric: nvlsm missing",
        ),
        (("imex",), fabric_state(imex="active"), "imex active", None),
        (("imex",), fabric_state(fm="active"), "imex missing", "fabric: imex missing"),
    ],
)
def test_the_fabric_services_the_node_needs_are_shown_and_red_where_missing_or_inactive(
    services, state, fabric, reason
):
    row = fabric_row(fabric_info(*services), state)
    assert row["fabric"] == fabric
    assert ("fabric" in row["checks"]) is bool(services)
    assert [name for name, ok in row["checks"].items() if not ok] == (["fabric"] if reason else [])
    assert row.get("reason") == reason


def test_the_fabric_settings_force_a_service_as_the_role_does():
    state = fabric_state(fm="active")
    forced = fabric_row(fabric_info(), state, {"imex": "always"})
    assert forced["fabric"] == "imex missing" and forced["checks"]["fabric"] is False
    off = fabric_row(fabric_info("fabricmanager"), fabric_state(), {"fabricmanager": "never"})
    assert off["fabric"] == "-" and "fabric" not in off["checks"]
    # A result without nvlink_fabric (no scan of the fabric) needs only what the settings force.
    assert fabric_row(gpu_info(), state)["fabric"] == "-"


def test_a_fabric_setting_that_is_not_one_of_the_three_is_one_sentence():
    with pytest.raises(AnsibleFilterError, match="fabric_settings imex must be auto, always or never, not yes"):
        fabric_row(fabric_info(), fabric_state(), {"imex": "yes"})
