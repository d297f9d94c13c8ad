"""dcgm-exporter's series while NVML does not answer, through the pynvml double: the library answers every call at
once, and these tests hold NVML inside a reading (the double's readings_open) to show that a scrape answers the last
reading without calling NVML and that the kubelet's Allocate is answered meanwhile. The reading path itself runs
through the library in test_dcgm.py."""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

import pytest
from gpu_device_plugin import dcgm
from gpu_device_plugin.api import api_pb2
from gpu_device_plugin.discovery import NvmlBackend
from harness import FIXTURES, H100, DaemonThread, make_config, wait_until
from pynvml_double import PynvmlDouble

GPU = "nvidia.com/gpu"
HOST = "gpu-node-1"


def double_and_backend() -> tuple[PynvmlDouble, NvmlBackend]:
    double = PynvmlDouble.from_spec(os.path.join(FIXTURES, "h100x8.yaml"))
    backend = NvmlBackend(double)
    backend.init()
    return double, backend


def gpu_temperatures(text: str) -> int:
    return len([line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")])


def test_a_scrape_answers_the_last_reading_and_never_calls_nvml():
    double, backend = double_and_backend()
    sampler = dcgm.Sampler(double, backend.snapshot, interval=3600, hostname=HOST)
    sampler.read()
    first = sampler.render()
    listener = dcgm.Listener("127.0.0.1:0", sampler.render)
    listener.start()
    reader = None
    try:
        # NVML stops answering: the next reading blocks inside its first call.
        double.readings_open.clear()
        calls = double.reading_calls
        reader = threading.Thread(target=sampler.read, daemon=True)
        reader.start()
        assert wait_until(lambda: double.reading_calls == calls + 1)
        for _scrape in range(3):
            with urllib.request.urlopen(f"http://{listener.address}/metrics", timeout=10) as reply:
                assert reply.status == 200
                assert reply.headers["Content-Type"] == dcgm.CONTENT_TYPE
                assert reply.read() == first
        assert double.reading_calls == calls + 1
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://{listener.address}/other", timeout=10)
        assert missing.value.code == 404
    finally:
        double.readings_open.set()
        if reader is not None:
            reader.join(10)
        listener.stop()
    assert sampler.readings == 2


def test_allocate_never_waits_for_the_sampler_held_in_nvml(node):
    double = PynvmlDouble.from_spec(node.spec)
    settings = make_config(
        node.kubelet_socket, None, dcgm_metrics_address="127.0.0.1:0", dcgm_interval_seconds=1.0, node_name=HOST
    )
    daemon = DaemonThread(settings, nvml=double).start()

    def scrape() -> str:
        listener = daemon.daemon._dcgm_listener
        assert listener is not None
        with urllib.request.urlopen(f"http://{listener.address}/metrics", timeout=10) as reply:
            return reply.read().decode()

    try:
        assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
        assert wait_until(lambda: gpu_temperatures(scrape()) == 8)
        # NVML stops answering: the sampler is held inside a reading, and the kubelet's Allocate is answered.
        double.readings_open.clear()
        calls = double.reading_calls
        assert wait_until(lambda: double.reading_calls > calls)
        request = api_pb2.ContainerAllocateRequest(devices_ids=[H100[1]])
        answer = node.kubelet.stub(GPU).Allocate(api_pb2.AllocateRequest(container_requests=[request]), timeout=10)
        assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == H100[1]
        assert "DCGM_FI_DEV_GPU_TEMP" in scrape()
    finally:
        double.readings_open.set()
        daemon.stop()
