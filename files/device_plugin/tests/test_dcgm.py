"""GPU telemetry under dcgm-exporter's names (gpu_device_plugin/dcgm.py), read by the real pynvml on the mock
libnvidia-ml.so.1 (mock_nvml.py), whose readings follow the simulated-GPU spec: each default field from its NVML
call in dcgm-exporter's unit, dcgm-exporter's labels in its order, what NVML does not give left out, the last XID
with its code, and the daemon serving them on a listener of its own. test_dcgm_held.py holds NVML inside a reading."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.request
from typing import Any, Callable, Optional

import grpc
import pytest
from gpu_device_plugin import config, dcgm, gpu_pods
from gpu_device_plugin.discovery import NvmlBackend
from harness import FIXTURES, H100, DaemonThread, fixture, make_config, wait_until, write_spec
from mock_nvml import MockNvml
from podresources_double import PodResourcesDouble, claim, container, pod
from prometheus_client.parser import text_string_to_metric_families

GPU = "nvidia.com/gpu"
DRIVER = "gpu.gpuops.k8s"
HOST = "gpu-node-1"
SERIES = re.compile(r"^(?P<name>[A-Z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
BUSY = {
    "temperature_c": 71,
    "memory_temperature_c": 83,
    "power_mw": 412345,
    "energy_mj": 987654321,
    "pcie_replays": 3,
    "gpu_utilization_pct": 97,
    "memory_utilization_pct": 41,
    "encoder_utilization_pct": 5,
    "decoder_utilization_pct": 7,
    "graphics_clock_mhz": 1755,
    "sm_clock_mhz": 1980,
    "memory_clock_mhz": 2619,
    "video_clock_mhz": 1605,
    "memory_used_mib": 40960,
    "memory_reserved_mib": 512,
    "remapped_rows_correctable": 2,
    "remapped_rows_uncorrectable": 1,
    "gpm_graphics_util_pct": 88,
    "gpm_tensor_util_pct": 63,
    "gpm_dram_bw_util_pct": 41,
    "gpm_pcie_tx_mib_per_s": 1200,
    "gpm_pcie_rx_mib_per_s": 3400,
    "nvlink_tx_kib_per_s": 250000,
    "nvlink_rx_kib_per_s": 150000,
}


def edit(library: Any, **gpus: dict[str, Any]) -> None:
    """The spec the library follows, h100x8 with these GPUs' keys changed (gpu3={...})."""
    spec = fixture("h100x8.yaml")
    for name, changes in gpus.items():
        spec["gpus"][int(name[3:])].update(changes)
    write_spec(library.spec, spec)


def sampled(library: Any, last_xid: Callable[[str], Optional[int]] = lambda uuid: None) -> str:
    backend = NvmlBackend(library.pynvml)
    backend.init()
    try:
        sampler = dcgm.Sampler(library.pynvml, backend.snapshot, hostname=HOST, last_xid=last_xid)
        # Two readings, as the daemon's steady state: the profiling fields are GPM's between a GPU's two samples, the
        # NVLink bandwidth the growth of its counters between them.
        sampler.read()
        time.sleep(0.002)  # more than the mock library's quantum of time at NVLink rates (1 ms: docs/mock-nvml.md)
        sampler.read()
        rendered = sampler.render().decode()
        sampler.stop()
        return rendered
    finally:
        backend.stop()


def series(text: str) -> dict[tuple[str, str], tuple[dict[str, str], str]]:
    """(metric, UUID) -> (labels, value) of every series line."""
    found = {}
    for line in text.splitlines():
        match = SERIES.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            found[(match["name"], labels["UUID"])] = (labels, match["value"])
    return found


def of_gpu(text: str, uuid: str) -> dict[str, str]:
    return {name: value for (name, found), (_labels, value) in series(text).items() if found == uuid}


def types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_each_default_field_comes_from_its_nvml_call_in_dcgm_exporters_unit(mock_nvml):
    edit(mock_nvml, gpu0={"readings": BUSY})
    assert wait_until(lambda: of_gpu(sampled(mock_nvml), H100[0]).get("DCGM_FI_DEV_GPU_TEMP") == "71")
    text = sampled(mock_nvml)
    assert of_gpu(text, H100[0]) == {
        "DCGM_FI_DEV_SM_CLOCK": "1980",
        "DCGM_FI_DEV_MEM_CLOCK": "2619",
        "DCGM_FI_DEV_MEMORY_TEMP": "83",
        "DCGM_FI_DEV_GPU_TEMP": "71",
        "DCGM_FI_DEV_POWER_USAGE": "412.345",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "987654321",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "3",
        "DCGM_FI_DEV_GPU_UTIL": "97",
        "DCGM_FI_DEV_MEM_COPY_UTIL": "41",
        "DCGM_FI_DEV_ENC_UTIL": "5",
        "DCGM_FI_DEV_DEC_UTIL": "7",
        "DCGM_FI_DEV_XID_ERRORS": "0",
        "DCGM_FI_DEV_FB_FREE": str(81559 - 40960 - 512),
        "DCGM_FI_DEV_FB_USED": "40960",
        "DCGM_FI_DEV_FB_RESERVED": "512",
        # DCGM's NVLink rate between the two readings: KiB/s received and sent, / 1000.
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "400",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "1",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "2",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": "0",
        # GPM's % as a ratio, its MiB/s in bytes per second.
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0.88",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.63",
        "DCGM_FI_PROF_DRAM_ACTIVE": "0.41",
        "DCGM_FI_PROF_PCIE_TX_BYTES": str(1200 << 20),
        "DCGM_FI_PROF_PCIE_RX_BYTES": str(3400 << 20),
    }
    # The other GPUs are idle (the spec's defaults), and have no memory temperature.
    idle = of_gpu(text, H100[1])
    assert (idle["DCGM_FI_DEV_GPU_TEMP"], idle["DCGM_FI_DEV_POWER_USAGE"], idle["DCGM_FI_DEV_FB_USED"]) == (
        "34",
        "68",
        "0",
    )
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in idle
    # dcgm-exporter's types: the energy, the PCIe replays, the NVLink bandwidth (a rate, typed as dcgm-exporter types
    # it) and the remapped rows are counters, named without _total.
    assert types(text) == {field.name: field.kind for field in dcgm.FIELDS}
    counters = {name for name, kind in types(text).items() if kind == "counter"}
    assert counters == {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    }


def test_a_failed_row_remapping_shows_as_one(mock_nvml):
    edit(mock_nvml, gpu6={"readings": {"remapped_rows_uncorrectable": 9, "remap_failure": 1}})
    assert wait_until(lambda: of_gpu(sampled(mock_nvml), H100[6]).get("DCGM_FI_DEV_ROW_REMAP_FAILURE") == "1")
    assert of_gpu(sampled(mock_nvml), H100[6])["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == "9"


def test_the_series_carry_dcgm_exporters_labels_in_its_order_and_parse_as_prometheus_text(mock_nvml):
    text = sampled(mock_nvml)
    assert (
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="3",UUID="{H100[3]}",pci_bus_id="00000000:5D:00.0",device="nvidia3",'
        f'modelName="NVIDIA H100 80GB HBM3",hostname="{HOST}",DCGM_FI_DRIVER_VERSION="580.95.05"}} 34'
    ) in text.splitlines()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    temperature = families["DCGM_FI_DEV_GPU_TEMP"]
    assert [s.labels["gpu"] for s in temperature.samples] == [str(i) for i in range(8)]
    assert {s.labels["UUID"] for s in temperature.samples} == set(H100)


def test_what_nvml_does_not_give_is_left_out_not_faked(mock_nvml):
    # No GPU of h100x8 has a memory temperature in the spec: NVML answers NOT_SUPPORTED for the field.
    found = series(sampled(mock_nvml))
    assert not [key for key in found if key[0] == "DCGM_FI_DEV_MEMORY_TEMP"]
    assert {uuid for name, uuid in found if name == "DCGM_FI_DEV_GPU_TEMP"} == set(H100)


def test_a_gpu_off_the_bus_keeps_its_last_xid_alone_until_it_answers_again(mock_nvml):
    """XID 79: NVML answers GPU_IS_LOST for the GPU. Its readings go, but not its last XID, which an alert on
    DCGM_FI_DEV_XID_ERRORS{err_code="79"} reads (with no series at all, the alert could never fire)."""
    backend = NvmlBackend(mock_nvml.pynvml)
    backend.init()
    sampler = dcgm.Sampler(mock_nvml.pynvml, backend.snapshot, hostname=HOST, last_xid={H100[5]: 79}.get)

    def names(uuid: str) -> set[str]:
        sampler.read()
        return {name for name, found in series(sampler.render().decode()) if found == uuid}

    try:
        names(H100[5])  # the profiling fields come from the second reading on
        everything = names(H100[5])
        assert {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"} <= everything
        edit(mock_nvml, gpu5={"lost": True})
        assert wait_until(lambda: names(H100[5]) == {"DCGM_FI_DEV_XID_ERRORS"})
        labels, value = series(sampler.render().decode())[("DCGM_FI_DEV_XID_ERRORS", H100[5])]
        assert (labels["err_code"], value, labels["gpu"]) == ("79", "79", "5")
        assert names(H100[4]) == everything
        edit(mock_nvml)
        assert wait_until(lambda: names(H100[5]) == everything)
    finally:
        backend.stop()


def test_the_profiling_fields_come_from_gpm_between_two_readings_and_every_sample_is_freed(
    mock_nvml, tmp_path, monkeypatch
):
    """Hopper: NVML's GPM metrics between a GPU's last two samples, the spec's rates, from the second reading on; a
    change of rate shows at the next reading. Each sample is freed once it has served, and all at the end."""
    trace = tmp_path / "trace"
    monkeypatch.setenv("GPUOPS_MOCK_NVML_TRACE", str(trace))
    edit(mock_nvml, gpu3={"readings": {"gpm_tensor_util_pct": 25, "gpm_pcie_rx_mib_per_s": 7}})
    assert wait_until(lambda: of_gpu(sampled(mock_nvml), H100[3]).get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") == "0.25")
    backend = NvmlBackend(mock_nvml.pynvml)
    backend.init()
    sampler = dcgm.Sampler(mock_nvml.pynvml, backend.snapshot, hostname=HOST)
    try:
        sampler.read()
        assert not [name for name, _uuid in series(sampler.render().decode()) if name.startswith("DCGM_FI_PROF_")]
        sampler.read()
        found = of_gpu(sampler.render().decode(), H100[3])
        assert {name: value for name, value in found.items() if name.startswith("DCGM_FI_PROF_")} == {
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.25",
            "DCGM_FI_PROF_DRAM_ACTIVE": "0",
            "DCGM_FI_PROF_PCIE_TX_BYTES": "0",
            "DCGM_FI_PROF_PCIE_RX_BYTES": str(7 << 20),
        }
        edit(mock_nvml, gpu3={"readings": {"gpm_tensor_util_pct": 90}})

        def tensor() -> str:
            sampler.read()
            return of_gpu(sampler.render().decode(), H100[3])["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]

        assert wait_until(lambda: tensor() == "0.9")
    finally:
        sampler.stop()
        backend.stop()
    calls = trace.read_text().splitlines()
    assert calls.count("nvmlGpmSampleAlloc") == calls.count("nvmlGpmSampleFree") >= 3 * 8


def test_the_profiling_fields_are_absent_before_hopper_and_said_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gpu_device_plugin.dcgm")
    library = MockNvml(os.path.join(FIXTURES, "t4x1.yaml"), str(tmp_path / "state"))
    backend = NvmlBackend(library.pynvml)
    backend.init()
    try:
        sampler = dcgm.Sampler(library.pynvml, backend.snapshot, hostname=HOST)
        for _reading in range(3):
            sampler.read()
        text = sampler.render().decode()
        sampler.stop()
    finally:
        backend.stop()
        library.close()
    (uuid,) = {found for _name, found in series(text)}
    assert "DCGM_FI_DEV_GPU_TEMP" in of_gpu(text, uuid)
    assert not [name for name in of_gpu(text, uuid) if name.startswith("DCGM_FI_PROF_")]
    said = [r.getMessage() for r in caplog.records if "DCGM_FI_PROF_" in r.getMessage()]
    assert said == [
        f"the profiling fields (DCGM_FI_PROF_*) are absent for GPU {uuid}: the GPU has no GPM (Hopper and newer)"
    ]


NVLINK = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"


def two_readings(tmp_path: Any, spec: dict[str, Any]) -> str:
    """The exposition after two readings (the steady state) of a spec's GPUs, on a library of their own."""
    write_spec(str(tmp_path / "spec.yaml"), spec)
    library = MockNvml(str(tmp_path / "spec.yaml"), str(tmp_path / "state"))
    try:
        return sampled(library)
    finally:
        library.close()


def nvlink_of(sampler: dcgm.Sampler) -> dict[str, str]:
    """One more reading: GPU UUID -> its NVLink bandwidth series' value, the GPUs' own series only (no GPU_I_ID)."""
    time.sleep(0.002)  # more than the mock library's quantum of time at these rates (1 ms: docs/mock-nvml.md)
    sampler.read()
    return {
        uuid: value
        for (name, uuid), (labels, value) in series(sampler.render().decode()).items()
        if name == NVLINK and "GPU_I_ID" not in labels
    }


def test_the_nvlink_bandwidth_is_dcgms_rate_from_a_gpus_second_reading_on_and_follows_the_spec(mock_nvml):
    """NVML's NVLink data counters of all links (KiB, received and sent) between a GPU's last two readings, in KiB/s /
    1000 as DCGM gives it: none at the first reading, the spec's rates to the unit from the second. A change of rates
    shows at the next reading (between the two rates, a reading spanning the change) and exactly at the one after."""
    edit(mock_nvml, gpu2={"readings": {"nvlink_tx_kib_per_s": 3000, "nvlink_rx_kib_per_s": 1000, "temperature_c": 40}})
    backend = NvmlBackend(mock_nvml.pynvml)
    backend.init()
    sampler = dcgm.Sampler(mock_nvml.pynvml, backend.snapshot, hostname=HOST)
    handle = mock_nvml.pynvml.nvmlDeviceGetHandleByUUID(H100[2])

    def temperature() -> int:
        return mock_nvml.pynvml.nvmlDeviceGetTemperature(handle, 0)

    try:
        assert wait_until(lambda: temperature() == 40)  # the library has the spec's rates
        # The library's fields: all links' counters (KiB, an unsigned long long) stamped in µs since the epoch; a
        # single link's are not modelled (not supported).
        link, total = mock_nvml.pynvml.nvmlDeviceGetFieldValues(handle, [(138, 0), (139, 0xFFFFFFFF)])
        assert (link.nvmlReturn, total.nvmlReturn, total.valueType) == (3, 0, 3)
        assert abs(total.timestamp - time.time() * 1e6) < 5e6
        assert nvlink_of(sampler) == {}
        assert NVLINK not in sampler.render().decode()  # nor its family
        idle = dict.fromkeys(H100, "0")
        assert nvlink_of(sampler) == {**idle, H100[2]: "4"}
        assert types(sampler.render().decode())[NVLINK] == "counter"
        readings = {"nvlink_tx_kib_per_s": 250000, "nvlink_rx_kib_per_s": 150000, "temperature_c": 41}
        edit(mock_nvml, gpu2={"readings": readings})
        assert wait_until(lambda: temperature() == 41)
        spanning = nvlink_of(sampler)
        assert 4 <= int(spanning[H100[2]]) <= 400
        assert nvlink_of(sampler) == {**idle, H100[2]: "400"}
    finally:
        sampler.stop()
        backend.stop()


def test_the_nvlink_bandwidth_is_a_gpus_with_nvlink_not_a_mig_devices_nor_a_gpus_without(tmp_path):
    """Two H100s joined by NVLink, one of them in MIG mode, and a T4 (no NVLink: NVML answers not supported), each
    with the same rates in its spec: each H100 has the series, on its own series only, and the T4 none."""
    spec = fixture("h100x8.yaml")
    first, second = spec["gpus"][:2]
    first["nvlink_peers"], second["nvlink_peers"] = [second["uuid"]], []
    second.update(
        mig_mode="enabled",
        mig_devices=[{"uuid": "MIG-6f1c0a3e-0000-4000-8000-0000000000b1", "profile": "1g.10gb", "memory_mib": 9984}],
    )
    t4 = fixture("t4x1.yaml")["gpus"][0]
    for gpu in (first, second, t4):
        gpu["readings"] = {"nvlink_tx_kib_per_s": 3000, "nvlink_rx_kib_per_s": 1000}
    spec["gpus"] = [first, second, t4]
    text = two_readings(tmp_path, spec)
    found = {
        uuid: value
        for (name, uuid), (labels, value) in series(text).items()
        if name == NVLINK and "GPU_I_ID" not in labels
    }
    assert found == {first["uuid"]: "4", second["uuid"]: "4"}
    assert [line for line in text.splitlines() if "GPU_I_ID" in line]  # the MIG device's own series are there
    assert not [line for line in text.splitlines() if line.startswith(NVLINK) and "GPU_I_ID" in line]
    assert "DCGM_FI_DEV_GPU_TEMP" in of_gpu(text, t4["uuid"])


def test_the_last_xid_shows_with_its_code(mock_nvml):
    found = series(sampled(mock_nvml, last_xid={H100[4]: 79}.get))
    labels, value = found[("DCGM_FI_DEV_XID_ERRORS", H100[4])]
    assert (labels["err_code"], value) == ("79", "79")
    labels, value = found[("DCGM_FI_DEV_XID_ERRORS", H100[0])]
    assert (labels["err_code"], value) == ("0", "0")


@pytest.fixture
def pod_resources():
    """The kubelet's pod-resources API (a double: podresources_double.py) on a real unix socket."""
    sockets = tempfile.mkdtemp(prefix="gpr-")  # unix socket paths are limited to 107 bytes
    kubelet = PodResourcesDouble(f"{sockets}/kubelet.sock").start()
    yield kubelet
    kubelet.stop()
    shutil.rmtree(sockets, ignore_errors=True)


def sampler_with_holders(nvml: Any, backend: NvmlBackend, pod_resources: PodResourcesDouble) -> dcgm.Sampler:
    """A sampler of the backend's GPUs whose holders come from the pod-resources double, as the daemon's do."""
    settings = make_config("/nonexistent", None, node_name=HOST, pod_resources_socket=pod_resources.socket_path)

    def holders(inventory: Any) -> dict[str, list[tuple[tuple[str, str], ...]]]:
        response = gpu_pods.list_pod_resources(settings.pod_resources_socket, 5)
        return gpu_pods.holders_by_gpu(response, gpu_pods.device_map(inventory, settings))

    return dcgm.Sampler(nvml, backend.snapshot, hostname=HOST, holders=holders)


def holders(text: str, metric: str = "DCGM_FI_DEV_GPU_TEMP") -> dict[str, list[dict[str, str]]]:
    """GPU UUID -> the pod labels of its series of `metric` (an empty dict for a series without them)."""
    keys = ("pod", "namespace", "container", "dra_claim_name", "dra_claim_namespace", "dra_driver_name")
    found: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        match = SERIES.match(line)
        if match and match["name"] == metric:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            found.setdefault(labels["UUID"], []).append({k: v for k, v in labels.items() if k in keys})
    return found


def test_each_container_holding_a_gpu_gets_a_series_of_its_own(mock_nvml, pod_resources):
    claims = [claim("team-b", "big", [("gpu.gpuops.k8s", HOST, "gpu-5")])]
    pod_resources.pods = [
        pod("ml", "train", container("main", {GPU: [H100[0]]}), container("sidecar")),
        # Two pods on replicas of one time-sliced GPU; the second holds two of them.
        pod("ml", "a", container("main", {GPU: [f"{H100[2]}::0"]})),
        pod("ml", "b", container("main", {GPU: [f"{H100[2]}::1", f"{H100[2]}::3"]})),
        pod("team-b", "claimer", container("main", claims=claims)),
        # A MIG index no GPU of this node has, and a claim of another driver, are attributed to nothing.
        pod("ml", "mig", container("main", {"nvidia.com/mig-1g.10gb": ["3:0"]})),
        pod("ml", "other", container("main", claims=[claim("ml", "c", [("gpu.example.com", HOST, "gpu-6")])])),
    ]
    backend = NvmlBackend(mock_nvml.pynvml)
    backend.init()
    sampler = sampler_with_holders(mock_nvml.pynvml, backend, pod_resources)
    try:
        sampler.read()
    finally:
        backend.stop()
    found = holders(sampler.render().decode())
    assert found[H100[0]] == [{"pod": "train", "namespace": "ml", "container": "main"}]
    assert found[H100[2]] == [
        {"pod": "a", "namespace": "ml", "container": "main"},
        {"pod": "b", "namespace": "ml", "container": "main"},
    ]
    assert found[H100[5]] == [
        {
            "pod": "claimer",
            "namespace": "team-b",
            "container": "main",
            "dra_claim_name": "big",
            "dra_claim_namespace": "team-b",
            "dra_driver_name": "gpu.gpuops.k8s",
        }
    ]
    assert found[H100[3]] == found[H100[6]] == found[H100[1]] == [{}]
    # Every field of a held GPU has a series per holder, the XID's with its err_code after the pod labels.
    xid = holders(sampler.render().decode(), "DCGM_FI_DEV_XID_ERRORS")
    assert xid[H100[2]] == found[H100[2]]


def test_the_daemons_pod_labels_follow_the_pods_within_a_reading(node, mock_nvml, pod_resources):
    settings = make_config(
        node.kubelet_socket,
        None,
        dcgm_metrics_address="127.0.0.1:0",
        dcgm_interval_seconds=1.0,
        node_name=HOST,
        pod_resources_socket=pod_resources.socket_path,
    )
    daemon = DaemonThread(settings, nvml=mock_nvml.pynvml).start()

    def scrape() -> dict[str, list[dict[str, str]]]:
        listener = daemon.daemon._dcgm_listener
        assert listener is not None
        with urllib.request.urlopen(f"http://{listener.address}/metrics", timeout=10) as reply:
            return holders(reply.read().decode())

    try:
        assert wait_until(lambda: len(scrape()) == 8)
        assert scrape()[H100[4]] == [{}]
        pod_resources.pods = [pod("ml", "train", container("main", {GPU: [H100[4]]}))]
        assert wait_until(lambda: scrape()[H100[4]] == [{"pod": "train", "namespace": "ml", "container": "main"}])
        pod_resources.pods = []
        assert wait_until(lambda: scrape()[H100[4]] == [{}])
        # The kubelet stops answering: the series stay, without pod labels, and come back with them.
        pod_resources.pods = [pod("ml", "train", container("main", {GPU: [H100[4]]}))]
        pod_resources.refuse(grpc.StatusCode.UNAVAILABLE, "restarting")
        calls = pod_resources.calls
        assert wait_until(lambda: pod_resources.calls > calls + 1)
        assert scrape()[H100[4]] == [{}]
        pod_resources.refusal = None
        assert wait_until(lambda: scrape()[H100[4]] == [{"pod": "train", "namespace": "ml", "container": "main"}])
    finally:
        daemon.stop()


MIG_GPU = "GPU-0a5e1c00-0000-4000-8000-00000000a100"
MIGS = [f"MIG-0a5e1c00-0000-4000-8000-0000000000a{i}" for i in (1, 2, 3)]


def a100_mig_reading(tmp_path: Any, pod_resources: PodResourcesDouble) -> str:
    """One reading of a100-mig.yaml's GPUs, with the pod-resources double's pods as holders."""
    library = MockNvml(os.path.join(FIXTURES, "a100-mig.yaml"), str(tmp_path / "state"))
    backend = NvmlBackend(library.pynvml)
    backend.init()
    try:
        sampler = sampler_with_holders(library.pynvml, backend, pod_resources)
        sampler.read()
        return sampler.render().decode()
    finally:
        backend.stop()
        library.close()


def test_each_mig_device_has_series_of_its_own_with_its_gpu_instance_and_holders(tmp_path, pod_resources):
    pod_resources.pods = [
        pod("ml", "small", container("main", {"nvidia.com/mig-1g.5gb": [MIGS[2]]})),
        pod("ml", "big", container("main", {"nvidia.com/mig-3g.20gb": ["0:0"]})),
    ]
    text = a100_mig_reading(tmp_path, pod_resources)
    free = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FB_FREE{")]
    mig = [line for line in free if "GPU_I_PROFILE" in line]
    # NVML's GPU-instance IDs on 8 memory slices: the 3g.20gb at slices 0-3 is 1, the 1g.5gb at 4 and 5 are 11, 12.
    assert mig == [
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="' + MIG_GPU + '",pci_bus_id="00000000:07:00.0",device="nvidia0",'
        'modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="3g.20gb",GPU_I_ID="1",hostname="gpu-node-1",'
        'DCGM_FI_DRIVER_VERSION="535.247.01",pod="big",namespace="ml",container="main"} 19968',
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="' + MIG_GPU + '",pci_bus_id="00000000:07:00.0",device="nvidia0",'
        'modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="1g.5gb",GPU_I_ID="11",hostname="gpu-node-1",'
        'DCGM_FI_DRIVER_VERSION="535.247.01"} 4864',
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="' + MIG_GPU + '",pci_bus_id="00000000:07:00.0",device="nvidia0",'
        'modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="1g.5gb",GPU_I_ID="12",hostname="gpu-node-1",'
        'DCGM_FI_DRIVER_VERSION="535.247.01",pod="small",namespace="ml",container="main"} 4864',
    ]
    # A MIG device's series has its framebuffer only: NVML gives no utilisation for it.
    mig_fields = {line.split("{")[0] for line in text.splitlines() if "GPU_I_ID" in line}
    assert mig_fields == {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"}


def test_a_dra_claims_mig_device_is_held_on_its_own_series_with_its_profile_and_uuid(tmp_path, pod_resources):
    """dcgm-exporter's dra_mig_profile and dra_mig_device_uuid, on the claimed MIG device's series: by the name the
    slice publishes and by the name an earlier version gave it (a claim allocated before an upgrade)."""
    pod_resources.pods = [
        pod("ml", "small", container("main", claims=[claim("ml", "one", [(DRIVER, HOST, "gpu-0-mig-1g5gb-19-5")])])),
        pod("ml", "old", container("main", claims=[claim("ml", "two", [(DRIVER, HOST, "gpu-0-mig-0")])])),
        # Another driver's device of the same name, and a MIG device not in the layout: attributed to nothing.
        pod("ml", "other", container("main", claims=[claim("ml", "c", [("gpu.example.com", HOST, "gpu-0-mig-1")])])),
        pod("ml", "gone", container("main", claims=[claim("ml", "d", [(DRIVER, HOST, "gpu-0-mig-7g40gb-0-0")])])),
    ]
    held = {}
    for line in a100_mig_reading(tmp_path, pod_resources).splitlines():
        if line.startswith("DCGM_FI_DEV_FB_FREE{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            held.setdefault(labels.get("GPU_I_ID", "whole"), []).append(
                line[line.index('DCGM_FI_DRIVER_VERSION="535.247.01"') + 35 : line.index("}")]
            )
    claimed = ',namespace="ml",container="main",dra_claim_name="{claim}",dra_claim_namespace="ml",'
    claimed += f'dra_driver_name="{DRIVER}",dra_pool_name="{HOST}",dra_device_name="{{device}}",'
    claimed += 'dra_mig_profile="{profile}",dra_mig_device_uuid="{uuid}"'
    assert held == {
        "1": [',pod="old"' + claimed.format(claim="two", device="gpu-0-mig-0", profile="3g.20gb", uuid=MIGS[0])],
        "11": [""],
        "12": [
            ',pod="small"' + claimed.format(claim="one", device="gpu-0-mig-1g5gb-19-5", profile="1g.5gb", uuid=MIGS[2])
        ],
        "whole": ["", ""],  # both GPUs' own series: a claim's MIG device is held on its own series only
    }


def test_a_mig_devices_profiling_fields_come_from_its_gpu_instances_gpm_samples(tmp_path, monkeypatch, caplog):
    """An H100 NVL in seven 1g.12gb: each MIG device's series carry the fields GPM gives per GPU instance
    (nvmlGpmMigSampleGet with the GPU's handle and the instance's ID), its PCIe traffic stays the GPU's; the A100s'
    MIG devices have none (no GPM before Hopper), said once per GPU. Every sample is freed."""
    caplog.set_level(logging.INFO, logger="gpu_device_plugin.dcgm")
    trace = tmp_path / "trace"
    monkeypatch.setenv("GPUOPS_MOCK_NVML_TRACE", str(trace))
    spec = fixture("mig-demos.yaml")
    busy, idle = (gpu for gpu in spec["gpus"] if gpu["name"] == "NVIDIA H100 NVL")
    busy["readings"] = {k: BUSY[k] for k in BUSY if k.startswith("gpm_")}
    text = two_readings(tmp_path, spec)
    profiled: dict[tuple[str, str], dict[str, str]] = {}
    for line in text.splitlines():
        match = SERIES.match(line)
        if match and match["name"].startswith("DCGM_FI_PROF_"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            profiled.setdefault((labels["UUID"], labels.get("GPU_I_ID", "")), {})[match["name"]] = match["value"]
    instance = {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0.88",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.63",
        "DCGM_FI_PROF_DRAM_ACTIVE": "0.41",
    }
    whole = {**instance, "DCGM_FI_PROF_PCIE_TX_BYTES": str(1200 << 20), "DCGM_FI_PROF_PCIE_RX_BYTES": str(3400 << 20)}
    nothing = dict.fromkeys(whole, "0")
    gpu_instances = [str(gi) for gi in range(7, 14)]  # the library's GPU-instance IDs of the seven 1g.12gb
    assert profiled == {
        (busy["uuid"], ""): whole,
        **{(busy["uuid"], gi): instance for gi in gpu_instances},
        (idle["uuid"], ""): nothing,
        **{(idle["uuid"], gi): {k: nothing[k] for k in instance} for gi in gpu_instances},
    }
    calls = trace.read_text().splitlines()
    said = sorted(
        r.getMessage().split(" for GPU ")[1].split(":")[0]
        for r in caplog.records
        if "(DCGM_FI_PROF_*)" in r.getMessage()
    )
    assert said == sorted(gpu["uuid"] for gpu in spec["gpus"] if gpu["name"].startswith("NVIDIA A100"))
    assert calls.count("nvmlGpmMigSampleGet") == 2 * 2 * 7  # two readings of two GPUs' seven instances
    assert calls.count("nvmlGpmSampleAlloc") == calls.count("nvmlGpmSampleFree") == 2 * 2 * 8


def test_label_values_are_escaped_as_the_text_format_asks():
    reading = dcgm.GpuReading(
        (("gpu", "0"), ("UUID", "GPU-x"), ("modelName", 'a "b" \\ c\nd')), {"DCGM_FI_DEV_GPU_TEMP": 1}
    )
    text = dcgm.render([reading]).decode()
    assert 'modelName="a \\"b\\" \\\\ c\\nd"' in text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_TEMP"]
    assert family.samples[0].labels["modelName"] == 'a "b" \\ c\nd'


def test_the_daemon_serves_them_on_their_own_listener_with_the_xids_its_watcher_saw(node, mock_nvml):
    settings = make_config(
        node.kubelet_socket, None, dcgm_metrics_address="127.0.0.1:0", dcgm_interval_seconds=1.0, node_name=HOST
    )
    daemon = DaemonThread(settings, nvml=mock_nvml.pynvml).start()

    def scrape() -> dict[tuple[str, str], tuple[dict[str, str], str]]:
        listener = daemon.daemon._dcgm_listener
        assert listener is not None
        with urllib.request.urlopen(f"http://{listener.address}/metrics", timeout=10) as reply:
            assert reply.headers["Content-Type"] == dcgm.CONTENT_TYPE
            return series(reply.read().decode())

    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        assert wait_until(lambda: len([k for k in scrape() if k[0] == "DCGM_FI_DEV_GPU_TEMP"]) == 8)
        edit(mock_nvml, gpu4={"xid": 79}, gpu2={"readings": {"power_mw": 250000}})
        assert wait_until(lambda: scrape()[("DCGM_FI_DEV_XID_ERRORS", H100[4])][1] == "79")
        assert wait_until(lambda: scrape()[("DCGM_FI_DEV_POWER_USAGE", H100[2])][1] == "250")
        assert scrape()[("DCGM_FI_DEV_XID_ERRORS", H100[4])][0]["err_code"] == "79"
    finally:
        daemon.stop()


def test_a_taken_port_leaves_the_metrics_off_and_the_gpus_served(node, mock_nvml, caplog):
    """dcgm-exporter already on the port: the daemon says so in one line and serves the kubelet all the same."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        settings = make_config(node.kubelet_socket, None, dcgm_metrics_address=address, dcgm_interval_seconds=1.0)
        daemon = DaemonThread(settings, nvml=mock_nvml.pynvml).start()
        try:
            assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
            assert len(node.kubelet.devices(GPU)) == 8
            assert daemon.daemon._dcgm_listener is None
            errors = [r.getMessage() for r in caplog.records if "dcgm metrics are not served" in r.getMessage()]
            assert errors == [f"the dcgm metrics are not served: {address} cannot listen (Address already in use)"]
        finally:
            daemon.stop()


def test_off_by_default_and_with_the_simulated_backend(node, mock_nvml):
    daemon = DaemonThread(make_config(node.kubelet_socket, None), nvml=mock_nvml.pynvml).start()
    try:
        assert daemon.daemon._dcgm_listener is None
    finally:
        daemon.stop()
    simulated = make_config(node.kubelet_socket, node.spec, dcgm_metrics_address="127.0.0.1:0")
    daemon = DaemonThread(simulated).start()
    try:
        assert daemon.daemon._dcgm_listener is None and daemon.daemon._dcgm is None
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"dcgm_metrics_address": "9400"},
            "dcgmMetricsAddress must be HOST:PORT or :PORT (port 0-65535), or empty for off, not '9400'.",
        ),
        (
            {"dcgm_metrics_address": "0.0.0.0:70000"},
            "dcgmMetricsAddress must be HOST:PORT or :PORT (port 0-65535), or empty for off, not '0.0.0.0:70000'.",
        ),
        ({"dcgm_interval_seconds": 0.5}, "dcgmIntervalSeconds must be a number of seconds of 1 or more."),
    ],
)
def test_bad_settings_are_one_sentence(values, message):
    with pytest.raises(config.ConfigError) as refused:
        config.resolve(values, {})
    assert str(refused.value) == message


def test_the_settings_from_the_file_and_the_environment(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\ngpuops:\n  dcgmMetricsAddress: ':9400'\n  dcgmIntervalSeconds: 15\n")
    from_file = config.resolve({}, {}, config.load_file(str(path)))
    assert (from_file.dcgm_metrics_address, from_file.dcgm_interval_seconds) == (":9400", 15.0)
    env = {"GPU_DEVICE_PLUGIN_DCGM_METRICS_ADDRESS": "127.0.0.1:9500"}
    assert config.resolve({}, env).dcgm_metrics_address == "127.0.0.1:9500"
    assert config.resolve({}, {}).dcgm_metrics_address == ""
    assert config.resolve({}, {}).pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert config.resolve({}, {"GPU_DEVICE_PLUGIN_POD_RESOURCES_SOCKET": "/run/pr.sock"}).pod_resources_socket == (
        "/run/pr.sock"
    )
    path.write_text("version: v1\ngpuops:\n  podResourcesSocket: ''\n")
    assert config.resolve({}, {}, config.load_file(str(path))).pod_resources_socket == ""
