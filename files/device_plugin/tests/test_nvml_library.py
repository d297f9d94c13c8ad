"""NVML as a driver serves it: the real pynvml (nvidia-ml-py) on the mock libnvidia-ml.so.1 (a TEST
DOUBLE of the driver's library, tests/mock_nvml at the repository's top), driving the daemon's nvml
backend, its XID watcher, the device-plugin API, the DRA driver and a daemon process."""

from __future__ import annotations

import ctypes
import logging
import os
import time

import pytest
from api_server_double import DRIVER
from gpu_device_plugin._shared import gpu_discovery, simulated_spec
from gpu_device_plugin.discovery import NvmlBackend
from gpu_device_plugin.health import NvmlEventWatcher, handle_key
from harness import FIXTURES, H100, DaemonThread, fixture, make_config, start_subprocess, wait_until, write_spec
from mock_nvml import MockNvml

GPU = "nvidia.com/gpu"


def edit(spec_path: str, index: int, **changes: object) -> None:
    spec = fixture("h100x8.yaml")
    spec["gpus"][index].update(changes)
    write_spec(spec_path, spec)


def health(node, index):
    return node.kubelet.health(GPU).get(H100[index])


@pytest.mark.parametrize("name", ["h100x8.yaml", "a100-mig.yaml", "t4x1.yaml"])
def test_nvml_facts_equal_the_spec_field_by_field(tmp_path, name):
    path = os.path.join(FIXTURES, name)
    library = MockNvml(path, str(tmp_path / "state"))
    try:
        found = gpu_discovery.nvml_discover(library.pynvml, str(tmp_path))
    finally:
        library.close()
    expected = gpu_discovery.facts_from_spec(simulated_spec.load_spec(path))
    assert (found["driver_version"], found["cuda_driver_version"]) == (
        expected["driver_version"],
        expected["cuda_driver_version"],
    )
    assert len(found["gpus"]) == len(expected["gpus"])
    for got, want in zip(found["gpus"], expected["gpus"]):
        for key in gpu_discovery.GPU_FACT_KEYS:
            if key == "xid":  # NVML reports XIDs as events, never as a fact
                continue
            assert got[key] == want[key], f"{name} GPU {want['index']}: {key}"


@pytest.mark.parametrize("name", ["h100x8.yaml", "a100-mig.yaml", "t4x1.yaml"])
def test_every_simulated_gpu_is_bare_metal(tmp_path, name):
    # NVIDIA's DRA driver asks before it offers dynamic MIG (docs/compared-dra.md); a missing symbol ends it.
    library = MockNvml(os.path.join(FIXTURES, name), str(tmp_path / "state"))
    nvml = library.pynvml
    try:
        nvml.nvmlInit()
        modes = [
            nvml.nvmlDeviceGetVirtualizationMode(nvml.nvmlDeviceGetHandleByIndex(index))
            for index in range(nvml.nvmlDeviceGetCount())
        ]
        nvml.nvmlShutdown()
    finally:
        library.close()
    assert modes == [nvml.NVML_GPU_VIRTUALIZATION_MODE_NONE] * len(modes)


def test_real_handles_are_unhashable_and_never_equal_and_keyed_by_address(mock_nvml):
    nvml = mock_nvml.pynvml
    nvml.nvmlInit()
    try:
        first, again = nvml.nvmlDeviceGetHandleByIndex(3), nvml.nvmlDeviceGetHandleByUUID(H100[3])
        with pytest.raises(TypeError):
            hash(first)
        assert first != again
        assert handle_key(first) == handle_key(again) != handle_key(nvml.nvmlDeviceGetHandleByIndex(4))
        assert handle_key(first) == ctypes.addressof(first.contents)
    finally:
        nvml.nvmlShutdown()


def test_an_xid_marks_exactly_that_gpu_unhealthy_within_a_second(node, mock_nvml):
    daemon = DaemonThread(make_config(node.kubelet_socket, None), nvml=mock_nvml.pynvml).start()
    try:
        assert node.kubelet.wait(lambda: [d["id"] for d in node.kubelet.devices(GPU) or []] == H100)
        edit(mock_nvml.spec, 1, xid=31)  # ignored by default
        time.sleep(0.3)
        started = time.monotonic()
        edit(mock_nvml.spec, 6, xid=78)
        assert node.kubelet.wait(lambda: health(node, 6) == "Unhealthy")
        print(f"XID to Unhealthy in ListAndWatch: {time.monotonic() - started:.2f} s")
        assert [d["id"] for d in node.kubelet.devices(GPU) if d["health"] != "Healthy"] == [H100[6]]
        ok, detail = daemon.daemon.healthz()
        assert ok and detail["resources"][GPU]["unhealthy"] == 1 and detail["health_watcher_error"] is None
        text = daemon.daemon.metrics.render().decode()
        assert f'gpu_device_plugin_xid_events_total{{critical="true",device="{H100[6]}",xid="78"}} 1.0' in text
        assert f'gpu_device_plugin_xid_events_total{{critical="false",device="{H100[1]}",xid="31"}} 1.0' in text
    finally:
        daemon.stop()


def test_a_lost_gpu_is_unhealthy_within_a_second(node, mock_nvml):
    daemon = DaemonThread(make_config(node.kubelet_socket, None), nvml=mock_nvml.pynvml).start()
    try:
        assert node.kubelet.wait(lambda: len(node.kubelet.devices(GPU) or []) == 8)
        edit(mock_nvml.spec, 0, lost=True)
        assert node.kubelet.wait(lambda: health(node, 0) == "Unhealthy")
        assert [d["id"] for d in node.kubelet.devices(GPU) if d["health"] != "Healthy"] == [H100[0]]
    finally:
        daemon.stop()


def test_a_lost_gpu_that_answers_again_recovers_when_recovery_is_on(node, mock_nvml):
    settings = make_config(node.kubelet_socket, None, health_recovery_seconds=0.3)
    daemon = DaemonThread(settings, nvml=mock_nvml.pynvml).start()
    try:
        assert node.kubelet.wait(lambda: len(node.kubelet.devices(GPU) or []) == 8)
        edit(mock_nvml.spec, 7, lost=True)
        assert node.kubelet.wait(lambda: health(node, 7) == "Unhealthy")
        time.sleep(0.6)  # longer than the quiet period: a GPU still off the bus stays Unhealthy
        assert health(node, 7) == "Unhealthy"
        edit(mock_nvml.spec, 7, lost=False)
        assert node.kubelet.wait(lambda: health(node, 7) == "Healthy")
        # It is watched again: a new XID on it is seen.
        edit(mock_nvml.spec, 7, xid=79)
        assert node.kubelet.wait(lambda: health(node, 7) == "Unhealthy")
    finally:
        daemon.stop()


def test_a_watcher_that_cannot_start_is_an_error_and_a_not_ready_healthz(node, mock_nvml, monkeypatch, caplog):
    monkeypatch.setenv("GPUOPS_MOCK_NVML_FAIL", "nvmlEventSetCreate:999")
    caplog.set_level(logging.ERROR)
    daemon = DaemonThread(make_config(node.kubelet_socket, None), nvml=mock_nvml.pynvml).start()
    try:
        assert node.kubelet.wait(lambda: len(node.kubelet.devices(GPU) or []) == 8)
        assert wait_until(lambda: daemon.daemon.healthz()[1]["health_watcher_error"] is not None)
        ok, detail = daemon.daemon.healthz()
        assert not ok and "Unknown Error" in detail["health_watcher_error"]
        assert any("cannot create an NVML event set" in r.getMessage() for r in caplog.records)
    finally:
        daemon.stop()


def test_a_watcher_that_dies_is_an_error_and_a_not_ready_healthz(mock_nvml, caplog):
    def broken(uuid: str, xid: int) -> None:
        raise RuntimeError("the report failed")

    caplog.set_level(logging.ERROR)
    nvml = mock_nvml.pynvml
    nvml.nvmlInit()
    watcher = NvmlEventWatcher(nvml, list(H100), broken, lambda uuid: None, wait_ms=50)
    try:
        watcher.start()
        time.sleep(0.2)
        assert watcher.failed is None
        edit(mock_nvml.spec, 2, xid=79)
        watcher.join(3)
        assert not watcher.is_alive()
        assert watcher.failed == "RuntimeError: the report failed"
        assert any("event watcher failed" in r.getMessage() for r in caplog.records)
    finally:
        watcher.stop()
        nvml.nvmlShutdown()


@pytest.mark.parametrize("version", ["v1"])
def test_dra_an_xid_through_nvml_reaches_the_health_stream_and_the_slice(dra, mock_nvml, version):
    dra.start(backend="nvml", simulated_spec=None)
    watch = dra.kubelet.watch_health(DRIVER, version)
    everything = [f"gpu-{i}" for i in range(8)]
    assert watch.wait(lambda u: sorted(u) == everything and {h for h, _m in u.values()} == {"HEALTHY"})
    started = time.monotonic()
    edit(mock_nvml.spec, 2, xid=79)
    assert watch.wait(lambda u: u["gpu-2"][0] == "UNHEALTHY")
    print(f"XID to UNHEALTHY in the DRA health stream: {time.monotonic() - started:.2f} s")
    last = watch.updates[-1]
    assert [n for n, (h, _m) in last.items() if h != "HEALTHY"] == ["gpu-2"]
    assert wait_until(lambda: dra.publisher.last() == (everything, frozenset({"gpu-2"})))
    edit(mock_nvml.spec, 5, lost=True)
    assert watch.wait(lambda u: u["gpu-5"][0] == "UNHEALTHY")


def test_the_daemon_process_loads_the_library_by_its_soname(node, mock_nvml):
    env = mock_nvml.env()
    proc = start_subprocess(["--kubelet-socket", node.kubelet_socket, "--metrics-address", ""], env_extra=env)
    try:
        assert node.kubelet.wait(lambda: [d["id"] for d in node.kubelet.devices(GPU) or []] == H100, timeout=20)
        edit(mock_nvml.spec, 4, xid=48)
        assert node.kubelet.wait(lambda: health(node, 4) == "Unhealthy")
    finally:
        proc.terminate()
        out, _err = proc.communicate(timeout=20)
    assert "Traceback" not in out, out
    assert "watching NVML events" in out


def test_without_the_state_the_library_says_the_driver_is_not_loaded(node, tmp_path):
    env = {"LD_LIBRARY_PATH": __import__("mock_nvml").library_dir(), "GPUOPS_MOCK_NVML_STATE": str(tmp_path / "none")}
    proc = start_subprocess(["--kubelet-socket", node.kubelet_socket, "--metrics-address", ""], env_extra=env)
    out, _err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "cannot discover GPUs; exiting" in out and "Driver Not Loaded" in out
    assert "Traceback" not in out


def test_the_nvml_backend_reads_mig_devices_through_the_library(tmp_path):
    library = MockNvml(os.path.join(FIXTURES, "a100-mig.yaml"), str(tmp_path / "state"))
    backend = NvmlBackend(library.pynvml)
    try:
        backend.init()
        mig_gpu, whole = backend.snapshot().gpus
    finally:
        backend.stop()
        library.close()
    assert mig_gpu.mig_mode == "enabled" and whole.mig_mode == "disabled"
    assert [(m.profile, m.memory_mib) for m in mig_gpu.mig_devices] == [
        ("3g.20gb", 19968),
        ("1g.5gb", 4864),
        ("1g.5gb", 4864),
    ]
    # Where each sits, from its GPU instance: NVIDIA's profile ID and the memory slices it holds.
    assert [(m.profile_id, m.placement_start, m.placement_size) for m in mig_gpu.mig_devices] == [
        (9, 0, 4),
        (19, 4, 1),
        (19, 5, 1),
    ]
    assert (mig_gpu.brand, whole.brand) == ("Nvidia", "Nvidia")


def _driver_root(tmp_path, mock_nvml) -> str:
    """A host as a DaemonSet pod sees it at /driver-root: the driver's library (the mock, with its state
    beside it, where the library looks for it) and the device nodes (plain files stand in for them here)."""
    import shutil

    from mock_nvml import LIBRARY, library_dir

    root = tmp_path / "driver-root"
    lib = root / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    shutil.copy(os.path.join(library_dir(), LIBRARY), lib / "libnvidia-ml.so.580.95.05")
    (lib / LIBRARY).symlink_to("libnvidia-ml.so.580.95.05")
    (lib / "gpuops-mock-nvml.state").symlink_to(mock_nvml.state)
    dev = root / "dev"
    dev.mkdir()
    for name in [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm"]:
        (dev / name).write_text("")
    return str(root)


def test_a_daemon_in_a_pod_reaches_nvml_and_the_device_nodes_through_the_driver_root(node, mock_nvml, tmp_path):
    from gpu_device_plugin.api import api_pb2

    root = _driver_root(tmp_path, mock_nvml)
    # Neither the library search path nor the state variable: only the driver root leads to NVML.
    env = {"GPUOPS_MOCK_NVML_STATE": "", "LD_LIBRARY_PATH": ""}
    args = ["--kubelet-socket", node.kubelet_socket, "--metrics-address", "", "--pass-device-specs"]
    proc = start_subprocess([*args, "--container-driver-root", root], env_extra=env)
    try:
        assert node.kubelet.wait(lambda: [d["id"] for d in node.kubelet.devices(GPU) or []] == H100, timeout=20)
        request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[H100[3]])])
        reply = node.kubelet.stub(GPU).Allocate(request, timeout=5).container_responses[0]
        # The kubelet and the runtime get the host's paths, not the pod's.
        assert [(d.container_path, d.host_path) for d in reply.devices] == [
            ("/dev/nvidia3", "/dev/nvidia3"),
            ("/dev/nvidiactl", "/dev/nvidiactl"),
            ("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
        ]
        edit(mock_nvml.spec, 3, xid=79)
        assert node.kubelet.wait(lambda: health(node, 3) == "Unhealthy")
    finally:
        proc.terminate()
        out, _err = proc.communicate(timeout=20)
    assert "NVML library from the driver root" in out and f"{root}/usr/lib/x86_64-linux-gnu" in out, out
    assert "Traceback" not in out


def test_dra_cdi_specs_name_the_host_device_nodes_seen_through_the_driver_root(dra, mock_nvml, tmp_path):
    from gpu_device_plugin.config import MountsSettings

    root = _driver_root(tmp_path, mock_nvml)
    dra.start(backend="nvml", simulated_spec=None, mounts=MountsSettings(container_driver_root=root))
    claim = dra.allocate("pod-claim", "5d0c2f7a-1b3e-4c5d-8e9f-0a1b2c3d4e5f", ["gpu-6"])
    assert dra.kubelet.prepare(DRIVER, [claim])["5d0c2f7a-1b3e-4c5d-8e9f-0a1b2c3d4e5f"].error == ""
    spec = dra.spec_of("5d0c2f7a-1b3e-4c5d-8e9f-0a1b2c3d4e5f")
    assert spec is not None
    nodes = [n["hostPath"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    nodes += [n["hostPath"] for n in spec["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidia6", "/dev/nvidiactl", "/dev/nvidia-uvm"]


# How NVIDIA's go-nvlib names a MIG device's profile from NVML (its loop indices, not the returned IDs).
_GI_SLICES = {0: 1, 7: 1, 9: 1, 10: 1, 13: 1, 15: 1, 1: 2, 8: 2, 11: 2, 14: 2, 16: 2, 2: 3, 3: 4, 12: 4, 6: 6, 4: 7}
_GI_SLICES[5] = 8
_CI_SLICES = {0: 1, 7: 1, 1: 2, 2: 3, 3: 4, 6: 6, 4: 7, 5: 8}
_SUFFIX = {7: "+me", 8: "+me", 15: "+me.all", 16: "+me.all", 10: "+gfx", 11: "+gfx", 12: "+gfx", 13: "-me", 14: "-me"}


def _nvidia_profile_name(nvml, mig) -> str:
    import math

    skip = (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT)
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    total = nvml.nvmlDeviceGetMemoryInfo(parent).total
    memory_mb = nvml.nvmlDeviceGetAttributes_v2(mig).memorySizeMB
    gi = nvml.nvmlDeviceGetGpuInstanceById(parent, nvml.nvmlDeviceGetGpuInstanceId(mig))
    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, nvml.nvmlDeviceGetComputeInstanceId(mig))
    gi_profile = nvml.nvmlGpuInstanceGetInfo(gi).profileId
    ci_profile = nvml.nvmlComputeInstanceGetInfo_v2(ci).profileId

    def first(ask, count, wanted):
        for index in range(count):
            try:
                if ask(index).id == wanted:
                    return index
            except nvml.NVMLError as exc:
                if exc.value not in skip:
                    raise
        raise AssertionError(f"no profile with ID {wanted}")

    i = first(lambda p: nvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, p, version=1), 17, gi_profile)
    j = first(lambda p: nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p, 0, version=1), 8, ci_profile)
    g, c = _GI_SLICES[i], _CI_SLICES[j]
    # Go's math.Round: halves away from zero (70.5 GB is a 71gb profile).
    gigabytes = math.floor(math.ceil(memory_mb * 2**20 / total * 8) / 8 * math.ceil(total / 2**30) + 0.5)
    name = f"{g}g.{gigabytes}gb" if c == g else f"{c}c.{g}g.{gigabytes}gb"
    return name + _SUFFIX.get(i, "")


@pytest.mark.parametrize(
    ("product", "profiles"),
    [
        (None, [("3g.20gb", 19968), ("1g.5gb", 4864), ("1g.5gb", 4864)]),
        (None, [("1g.5gb+me", 4864), ("1c.3g.20gb", 19968), ("1g.10gb", 9856)]),
        (("NVIDIA H100 80GB HBM3", 81559), [("2c.4g.40gb", 40448), ("1g.20gb", 20096), ("1g.10gb+me", 9984)]),
        (("NVIDIA H200", 143771), [("3g.71gb", 66816), ("2g.35gb", 33280), ("1g.35gb", 33280)]),
        (("NVIDIA H100 NVL", 95830), [("3g.47gb", 47488), ("1g.24gb", 22144), ("1g.12gb", 11008)]),
    ],
    ids=["fixture", "suffixes", "h100", "h200", "h100-nvl"],
)
def test_mig_profiles_are_named_as_nvidias_libraries_name_them(tmp_path, product, profiles):
    spec = fixture("a100-mig.yaml")
    if product:
        spec["gpus"][0].update(name=product[0], memory_mib=product[1], compute_capability="9.0")
    spec["gpus"][0]["mig_devices"] = [
        {"uuid": f"MIG-0a5e1c00-0000-4000-8000-0000000000b{n}", "profile": p, "memory_mib": m}
        for n, (p, m) in enumerate(profiles)
    ]
    path = str(tmp_path / "gpus.yaml")
    write_spec(path, spec)
    library = MockNvml(path, str(tmp_path / "state"))
    nvml = library.pynvml
    nvml.nvmlInit()
    try:
        gpu = nvml.nvmlDeviceGetHandleByIndex(0)
        # NVML numbers MIG devices by GPU-instance ID, which need not be the order the spec lists them in.
        handles = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot) for slot in range(len(profiles))]
        names = {nvml.nvmlDeviceGetUUID(mig): _nvidia_profile_name(nvml, mig) for mig in handles}
        whole = nvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(nvml.NVMLError) as raised:
            nvml.nvmlDeviceGetGpuInstanceById(whole, 1)
        assert raised.value.value == nvml.NVML_ERROR_NOT_SUPPORTED
    finally:
        nvml.nvmlShutdown()
        library.close()
    assert names == {mig["uuid"]: mig["profile"] for mig in spec["gpus"][0]["mig_devices"]}
