"""Time-slicing replicas and the MIG strategies, registered and allocated over gRPC."""

from __future__ import annotations

import grpc
import pytest
from gpu_device_plugin.api import api_pb2
from gpu_device_plugin.config import TimeSlicedResource, TimeSlicing
from harness import FIXTURES, H100, DaemonThread, fixture, make_config, write_spec

GPU = "nvidia.com/gpu"
A100_MIG = "GPU-0a5e1c00-0000-4000-8000-00000000a100"
A100_WHOLE = "GPU-0a5e1c00-0000-4000-8000-00000000a101"
MIGS = [f"MIG-0a5e1c00-0000-4000-8000-0000000000a{i}" for i in (1, 2, 3)]


def allocate(stub, ids):
    request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
    return stub.Allocate(request, timeout=5).container_responses[0]


@pytest.fixture
def daemon(node):
    started = []

    def start(spec=None, **values):
        d = DaemonThread(make_config(node.kubelet_socket, spec or node.spec, **values)).start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def test_time_slicing_replicas(node, daemon):
    daemon(time_slicing=TimeSlicing(resources=(TimeSlicedResource(GPU, 4),)))
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    ids = [d["id"] for d in node.kubelet.devices(GPU)]
    assert len(ids) == 32 and ids[:4] == [f"{H100[0]}::{n}" for n in range(4)]
    stub = node.kubelet.stub(GPU)
    # Two replicas of one GPU and one of another: each GPU named once.
    reply = allocate(stub, [f"{H100[0]}::1", f"{H100[0]}::3", f"{H100[5]}::0"])
    assert reply.envs["NVIDIA_VISIBLE_DEVICES"] == f"{H100[0]},{H100[5]}"
    # Preferred allocation spreads replicas over GPUs, keeping to the best-connected ones.
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=2)]
    )
    chosen = list(stub.GetPreferredAllocation(request, timeout=5).container_responses[0].deviceIDs)
    assert sorted(c.split("::")[0] for c in chosen) == [H100[0], H100[1]]


def test_time_slicing_rename_by_default_and_fail_requests_greater_than_one(node, daemon):
    sharing = TimeSlicing(
        rename_by_default=True,
        fail_requests_greater_than_one=True,
        resources=(TimeSlicedResource(GPU, 2, devices=("0", H100[1])),),
    )
    daemon(time_slicing=sharing)
    shared = "nvidia.com/gpu.shared"
    assert node.kubelet.wait(lambda: node.kubelet.devices(shared) is not None and node.kubelet.devices(GPU) is not None)
    assert {r.resource_name for r in node.kubelet.registrations} == {GPU, shared}
    assert [d["id"] for d in node.kubelet.devices(shared)] == [f"{H100[i]}::{n}" for i in (0, 1) for n in (0, 1)]
    assert [d["id"] for d in node.kubelet.devices(GPU)] == H100[2:]
    stub = node.kubelet.stub(shared)
    assert allocate(stub, [f"{H100[1]}::1"]).envs["NVIDIA_VISIBLE_DEVICES"] == H100[1]
    with pytest.raises(grpc.RpcError) as caught:
        allocate(stub, [f"{H100[0]}::0", f"{H100[1]}::0"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failRequestsGreaterThanOne" in caught.value.details() and f"{H100[0]}::0" in caught.value.details()


def test_mig_strategy_none_advertises_whole_gpus(node, daemon):
    daemon(spec=f"{FIXTURES}/a100-mig.yaml", mig_strategy="none")
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    assert [d["id"] for d in node.kubelet.devices(GPU)] == [A100_MIG, A100_WHOLE]


def test_mig_strategy_mixed_registers_one_resource_per_profile(node, daemon):
    daemon(spec=f"{FIXTURES}/a100-mig.yaml", mig_strategy="mixed", device_list_strategy=("envvar", "cdi-cri"))
    resources = {GPU: [A100_WHOLE], "nvidia.com/mig-3g.20gb": [MIGS[0]], "nvidia.com/mig-1g.5gb": MIGS[1:]}
    assert node.kubelet.wait(lambda: all(node.kubelet.devices(r) is not None for r in resources))
    for resource, ids in resources.items():
        assert [d["id"] for d in node.kubelet.devices(resource)] == ids
    assert sorted(r.endpoint for r in node.kubelet.registrations) == [
        "gpuops-nvidia.com-gpu.sock",
        "gpuops-nvidia.com-mig-1g.5gb.sock",
        "gpuops-nvidia.com-mig-3g.20gb.sock",
    ]
    reply = allocate(node.kubelet.stub("nvidia.com/mig-1g.5gb"), [MIGS[2]])
    assert reply.envs["NVIDIA_VISIBLE_DEVICES"] == MIGS[2]
    assert [c.name for c in reply.cdi_devices] == [f"nvidia.com/gpu={MIGS[2]}"]


def test_mig_mixed_follows_spec_edits_that_add_a_profile(node, daemon, tmp_path):
    spec_path = str(tmp_path / "a100.yaml")
    spec = fixture("a100-mig.yaml")
    write_spec(spec_path, spec)
    daemon(spec=spec_path, mig_strategy="mixed")
    assert node.kubelet.wait(lambda: node.kubelet.devices("nvidia.com/mig-1g.5gb") is not None)
    spec["gpus"][0]["mig_devices"][0]["profile"] = "2g.10gb"
    write_spec(spec_path, spec)
    assert node.kubelet.wait(lambda: node.kubelet.devices("nvidia.com/mig-2g.10gb") is not None)
    assert [d["id"] for d in node.kubelet.devices("nvidia.com/mig-2g.10gb")] == [MIGS[0]]


def test_a_media_extension_profile_is_a_resource_spelled_with_a_dot(node, daemon, tmp_path):
    spec_path = str(tmp_path / "a100.yaml")
    spec = fixture("a100-mig.yaml")
    spec["gpus"][0]["mig_devices"][1]["profile"] = "1g.5gb+me"
    write_spec(spec_path, spec)
    daemon(spec=spec_path, mig_strategy="mixed")
    assert node.kubelet.wait(lambda: node.kubelet.devices("nvidia.com/mig-1g.5gb.me") is not None)
    assert [d["id"] for d in node.kubelet.devices("nvidia.com/mig-1g.5gb.me")] == [MIGS[1]]
    assert "gpuops-nvidia.com-mig-1g.5gb.me.sock" in {r.endpoint for r in node.kubelet.registrations}


def test_mig_strategy_single(node, daemon, tmp_path):
    spec = fixture("a100-mig.yaml")
    spec["gpus"] = spec["gpus"][:1]
    for mig in spec["gpus"][0]["mig_devices"]:
        mig["profile"] = "1g.5gb"
    spec_path = str(tmp_path / "uniform.yaml")
    write_spec(spec_path, spec)
    daemon(spec=spec_path, mig_strategy="single", device_id_strategy="index")
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    assert [d["id"] for d in node.kubelet.devices(GPU)] == ["0:0", "0:1", "0:2"]
    assert allocate(node.kubelet.stub(GPU), ["0:2"]).envs["NVIDIA_VISIBLE_DEVICES"] == "0:2"


def test_mig_strategy_single_refuses_a_mixed_node(node, daemon):
    daemon(spec=f"{FIXTURES}/a100-mig.yaml", mig_strategy="single")
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    assert node.kubelet.devices(GPU) == []
