"""Health through the simulated spec (XIDs, a GPU off the bus), the healthcheck variables, recovery,
and NVML through the pynvml double (XID events, a lost GPU, init failures)."""

from __future__ import annotations

import os
import time

import pytest
from gpu_device_plugin.health import DEFAULT_IGNORED_XIDS, policy_from
from harness import H100, DaemonThread, fixture, make_config, remove_gpu, start_subprocess, wait_until, write_spec
from pynvml_double import PynvmlDouble

GPU = "nvidia.com/gpu"


def run(node, **values):
    daemon = DaemonThread(make_config(node.kubelet_socket, node.spec, **values)).start()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    return daemon


def edit(node, index, **changes):
    spec = fixture("h100x8.yaml")
    for key, value in changes.items():
        if value is None:
            spec["gpus"][index].pop(key, None)
        else:
            spec["gpus"][index][key] = value
    write_spec(node.spec, spec)


def health_of(node, index):
    return node.kubelet.health(GPU).get(H100[index])


def test_policy_from_the_environment_variables():
    assert policy_from("", "", None).ignored_xids == DEFAULT_IGNORED_XIDS
    assert not policy_from("all", "", None).enabled
    assert not policy_from("xids", "", None).xids_enabled
    assert policy_from("48, 63", "", None).ignored_xids == DEFAULT_IGNORED_XIDS | {48, 63}
    assert policy_from("", "13,31", None).ignored_xids == DEFAULT_IGNORED_XIDS - {13, 31}
    assert policy_from("", "all", None).ignored_xids == frozenset()
    with pytest.raises(ValueError, match="DP_DISABLE_HEALTHCHECKS"):
        policy_from("48,abc", "", None)


def test_ignored_xid_keeps_the_gpu_healthy_and_a_critical_one_does_not(node):
    daemon = run(node)
    try:
        edit(node, 0, xid=13)
        edit(node, 1, xid=79)
        assert node.kubelet.wait(lambda: health_of(node, 1) == "Unhealthy")
        assert health_of(node, 0) == "Healthy"
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    ("env", "xid", "expected"),
    [
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, 79, "Healthy"),
        ({"DP_DISABLE_HEALTHCHECKS": "xids"}, 79, "Healthy"),
        ({"DP_DISABLE_HEALTHCHECKS": "79"}, 79, "Healthy"),
        ({"DP_ENABLE_HEALTHCHECKS": "13"}, 13, "Unhealthy"),
        ({"DP_ENABLE_HEALTHCHECKS": "all"}, 43, "Unhealthy"),
    ],
)
def test_healthcheck_variables(node, env, xid, expected):
    daemon = run(node, env=env)
    try:
        # The same edit removes GPU 7, so the update that carries it is easy to recognise.
        spec = fixture("h100x8.yaml")
        spec["gpus"][3]["xid"] = xid
        remove_gpu(spec, 7)
        write_spec(node.spec, spec)
        assert node.kubelet.wait(lambda: len(node.kubelet.devices(GPU)) == 7)
        assert health_of(node, 3) == expected
    finally:
        daemon.stop()


def test_a_gpu_off_the_bus_is_unhealthy(node):
    daemon = run(node)
    try:
        edit(node, 4, lost=True)
        assert node.kubelet.wait(lambda: health_of(node, 4) == "Unhealthy")
    finally:
        daemon.stop()


def test_recovery_when_configured_after_the_fault_clears(node):
    daemon = run(node, health_recovery_seconds=0.5)
    try:
        edit(node, 2, xid=79)
        assert node.kubelet.wait(lambda: health_of(node, 2) == "Unhealthy")
        time.sleep(0.7)
        # Still Unhealthy: the spec still shows the XID as a standing fault.
        assert health_of(node, 2) == "Unhealthy"
        edit(node, 2, xid=None)
        assert node.kubelet.wait(lambda: health_of(node, 2) == "Healthy")
        # A new critical XID restarts the quiet period.
        edit(node, 2, xid=48)
        assert node.kubelet.wait(lambda: health_of(node, 2) == "Unhealthy")
        edit(node, 2, xid=None)
        started = time.monotonic()
        assert node.kubelet.wait(lambda: health_of(node, 2) == "Healthy")
        assert time.monotonic() - started > 0.3
    finally:
        daemon.stop()


# -- NVML through the pynvml double ----------------------------------------------------------------
def test_nvml_backend_discovers_gpus_and_topology_through_the_double(node):
    from gpu_device_plugin.discovery import NvmlBackend
    from gpu_device_plugin.simspec import load

    double = PynvmlDouble.from_spec(node.spec)
    backend = NvmlBackend(double)
    backend.init()
    found = backend.snapshot()
    expected = load(node.spec)
    assert [g.uuid for g in found.gpus] == H100
    assert found.driver_version == "580.95.05" and found.cuda_driver_version == "13.0"
    for got, want in zip(found.gpus, expected.gpus):
        assert (got.pci_bus_id, got.numa_node, got.nvlink_peers, got.memory_mib, got.compute_capability) == (
            want.pci_bus_id,
            want.numa_node,
            want.nvlink_peers,
            want.memory_mib,
            want.compute_capability,
        )
    assert [g.pcie_switch for g in found.gpus] == ["sw0", "sw0", "sw1", "sw1", "sw2", "sw2", "sw3", "sw3"]


def test_nvml_backend_reads_mig_devices_through_the_double(tmp_path):
    from gpu_device_plugin.discovery import NvmlBackend
    from harness import FIXTURES

    backend = NvmlBackend(PynvmlDouble.from_spec(os.path.join(FIXTURES, "a100-mig.yaml")))
    backend.init()
    mig_gpu, whole = backend.snapshot().gpus
    assert mig_gpu.mig_mode == "enabled" and whole.mig_mode == "disabled"
    assert [(m.profile, m.memory_mib) for m in mig_gpu.mig_devices] == [
        ("3g.20gb", 19968),
        ("1g.5gb", 4864),
        ("1g.5gb", 4864),
    ]
    assert whole.numa_node is None


def test_nvml_xid_events_and_a_lost_gpu(node):
    double = PynvmlDouble.from_spec(node.spec)
    daemon = DaemonThread(make_config(node.kubelet_socket, None), nvml=double).start()
    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        assert [d["id"] for d in node.kubelet.devices(GPU)] == H100
        double.inject_xid(H100[1], 31)  # ignored by default
        double.inject_xid(H100[6], 78)
        assert node.kubelet.wait(lambda: health_of(node, 6) == "Unhealthy")
        assert health_of(node, 1) == "Healthy"
        double.lose(H100[0])
        assert node.kubelet.wait(lambda: health_of(node, 0) == "Unhealthy")
        text = daemon.daemon.metrics.render().decode()
        assert f'gpu_device_plugin_xid_events_total{{critical="true",device="{H100[6]}",xid="78"}} 1.0' in text
        assert f'gpu_device_plugin_xid_events_total{{critical="false",device="{H100[1]}",xid="31"}} 1.0' in text
    finally:
        daemon.stop()


def test_nvml_init_failure_exits_when_fail_on_init_error(node):
    double = PynvmlDouble.from_spec(node.spec, init_fails=lambda: True)
    daemon = DaemonThread(make_config(node.kubelet_socket, None), nvml=double).start()
    assert daemon.wait_exit() == 1
    assert node.kubelet.registered(GPU) == 0


def test_nvml_init_failure_keeps_running_with_no_devices_and_retries(node):
    failing = {"on": True}
    double = PynvmlDouble.from_spec(node.spec, init_fails=lambda: failing["on"])
    settings = make_config(node.kubelet_socket, None, fail_on_init_error=False, init_retry_seconds=0.2)
    daemon = DaemonThread(settings, nvml=double).start()
    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) == [])
        assert wait_until(lambda: double.init_calls >= 3)
        assert "NVML Shared Library Not Found" in daemon.daemon.healthz()[1]["backend_error"]
        failing["on"] = False
        assert node.kubelet.wait(lambda: len(node.kubelet.devices(GPU) or []) == 8)
        assert daemon.daemon.healthz()[1]["backend_error"] is None
    finally:
        daemon.stop()


def test_the_real_daemon_process_with_the_pynvml_double_module(node, tmp_path):
    """`--backend nvml` as a process; `pynvml` on its path is the double (tests/doubles/pynvml.py)."""
    fail_file = tmp_path / "nvml-broken"
    fail_file.write_text("")
    doubles = os.path.join(os.path.dirname(__file__), "doubles")
    env = {
        "PYTHONPATH": doubles,
        "PYNVML_DOUBLE_SPEC": node.spec,
        "PYNVML_DOUBLE_FAIL_FILE": str(fail_file),
    }
    proc = start_subprocess(["--kubelet-socket", node.kubelet_socket, "--metrics-address", ""], env_extra=env)
    out, _err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "cannot discover GPUs; exiting" in out and "NVML Shared Library Not Found" in out
    assert "Traceback" not in out
