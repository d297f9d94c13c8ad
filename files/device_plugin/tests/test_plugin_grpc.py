"""Every DevicePlugin RPC over real unix-socket gRPC, driven by the kubelet double as the kubelet would."""

from __future__ import annotations

import os
import stat
import threading

import grpc
import pytest
from gpu_device_plugin.api import api_pb2
from harness import H100, DaemonThread, fixture, make_config, remove_gpu, write_spec

GPU = "nvidia.com/gpu"


@pytest.fixture
def plugin(node):
    daemons = []

    def start(spec=None, **values):
        settings = make_config(node.kubelet_socket, spec or node.spec, **values)
        d = DaemonThread(settings).start()
        daemons.append(d)
        return d

    yield start
    for d in daemons:
        d.stop()


def allocate(node, *requests, resource=GPU):
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in requests]
    )
    return node.kubelet.stub(resource).Allocate(request, timeout=5)


def test_serves_first_then_registers_with_v1beta1_and_its_options(node, plugin):
    stale = os.path.join(node.dir, "gpuops-nvidia.com-gpu.sock")
    with open(stale, "w") as handle:
        handle.write("left over from a crash")
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.registered(GPU) == 1)
    request = node.kubelet.registrations[0]
    assert request.version == "v1beta1"
    assert request.endpoint == "gpuops-nvidia.com-gpu.sock"
    assert request.resource_name == GPU
    assert request.options.get_preferred_allocation_available
    assert not request.options.pre_start_required
    mode = os.stat(stale).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    options = node.kubelet.stub(GPU).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert options == request.options


def test_list_and_watch_sends_every_device_with_its_numa_node(node, plugin):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    devices = node.kubelet.devices(GPU)
    assert [d["id"] for d in devices] == H100
    assert {d["health"] for d in devices} == {"Healthy"}
    assert [d["numa"] for d in devices] == [[0]] * 4 + [[1]] * 4


def test_list_and_watch_follows_spec_edits(node, plugin):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    spec = fixture("h100x8.yaml")
    spec["gpus"][2]["xid"] = 79
    write_spec(node.spec, spec)
    assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[2]) == "Unhealthy")
    assert list(node.kubelet.health(GPU).values()).count("Unhealthy") == 1
    remove_gpu(spec, 7)
    write_spec(node.spec, spec)
    assert node.kubelet.wait(lambda: len(node.kubelet.devices(GPU)) == 7)
    # Recovery is off by default: the XID entry going away does not make the GPU Healthy.
    del spec["gpus"][2]["xid"]
    write_spec(node.spec, spec)
    updates = node.kubelet.endpoints[GPU].updates
    assert not node.kubelet.wait(lambda: node.kubelet.endpoints[GPU].updates > updates, timeout=0.5)
    assert node.kubelet.health(GPU)[H100[2]] == "Unhealthy"


def test_an_invalid_spec_edit_keeps_the_last_good_devices(node, plugin):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    with open(node.spec, "w") as handle:
        handle.write("gpus: [{uuid: nope}]\n")
    spec = fixture("h100x8.yaml")
    spec["gpus"][0]["xid"] = 48
    write_spec(node.spec, spec)
    assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[0]) == "Unhealthy")
    assert len(node.kubelet.devices(GPU)) == 8


def test_allocate_envvar_answers_each_container_in_order(node, plugin):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    response = allocate(node, [H100[3]], [H100[0], H100[1]])
    assert [r.envs["NVIDIA_VISIBLE_DEVICES"] for r in response.container_responses] == [
        H100[3],
        f"{H100[0]},{H100[1]}",
    ]
    assert not response.container_responses[0].devices


@pytest.mark.parametrize(
    ("ids", "words"),
    [
        (["GPU-nope"], ["unknown", "GPU-nope"]),
        ([H100[0], H100[0]], ["more than once", H100[0]]),
    ],
)
def test_allocate_refuses_bad_ids_and_keeps_serving(node, plugin, ids, words):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    with pytest.raises(grpc.RpcError) as caught:
        allocate(node, [H100[1]], ids)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for word in words:
        assert word in caught.value.details()
    assert allocate(node, [H100[1]]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == H100[1]


def test_allocate_refuses_an_unhealthy_gpu(node, plugin):
    plugin()
    spec = fixture("h100x8.yaml")
    spec["gpus"][5]["lost"] = True
    write_spec(node.spec, spec)
    assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[5]) == "Unhealthy")
    with pytest.raises(grpc.RpcError) as caught:
        allocate(node, [H100[4], H100[5]])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unhealthy" in caught.value.details() and H100[5] in caught.value.details()
    assert H100[4] not in caught.value.details()


def test_strategies_combined_cdi_and_volume_mounts(node, plugin):
    plugin(device_list_strategy=("cdi-cri", "cdi-annotations", "volume-mounts"))
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    reply = allocate(node, [H100[0], H100[1]]).container_responses[0]
    assert [c.name for c in reply.cdi_devices] == [f"nvidia.com/gpu={H100[0]}", f"nvidia.com/gpu={H100[1]}"]
    ((key, value),) = reply.annotations.items()
    assert key.startswith("cdi.k8s.io/") and value == f"nvidia.com/gpu={H100[0]},nvidia.com/gpu={H100[1]}"
    assert reply.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert [(m.container_path, m.host_path) for m in reply.mounts] == [
        (f"/var/run/nvidia-container-devices/{H100[0]}", "/dev/null"),
        (f"/var/run/nvidia-container-devices/{H100[1]}", "/dev/null"),
    ]


def _fake_host(tmp):
    """A driver root and /dev as a host with the driver would have them (files, not real nodes)."""
    dev = tmp / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia5", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    root = tmp / "root"
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libnvidia-ml.so.580.95.05", "libcuda.so.580.95.05", "libssl.so.3", "libnvidia-ptxjitcompiler.so.1"):
        (lib / name).write_text("")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.95.05")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.580.95.05")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("")
    return str(root), str(dev)


def test_mounts_strategy_for_clusters_without_the_nvidia_runtime(node, plugin, tmp_path):
    from gpu_device_plugin.config import MountsSettings

    root, dev = _fake_host(tmp_path)
    plugin(device_list_strategy=("mounts",), mounts=MountsSettings(driver_root=root, dev_root=dev))
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    reply = allocate(node, [H100[0], H100[5]]).container_responses[0]
    assert [(d.container_path, d.host_path, d.permissions) for d in reply.devices] == [
        ("/dev/nvidia0", f"{dev}/nvidia0", "rw"),
        ("/dev/nvidia5", f"{dev}/nvidia5", "rw"),
        ("/dev/nvidiactl", f"{dev}/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", f"{dev}/nvidia-uvm", "rw"),
    ]
    mounts = {m.container_path: (m.host_path, m.read_only) for m in reply.mounts}
    lib = f"{root}/usr/lib/x86_64-linux-gnu"
    assert mounts == {
        "/usr/local/nvidia/lib64/libcuda.so.1": (f"{lib}/libcuda.so.1", True),
        "/usr/local/nvidia/lib64/libcuda.so.580.95.05": (f"{lib}/libcuda.so.580.95.05", True),
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1": (f"{lib}/libnvidia-ml.so.1", True),
        "/usr/local/nvidia/lib64/libnvidia-ml.so.580.95.05": (f"{lib}/libnvidia-ml.so.580.95.05", True),
        "/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1": (f"{lib}/libnvidia-ptxjitcompiler.so.1", True),
        "/usr/local/nvidia/bin/nvidia-smi": (f"{root}/usr/bin/nvidia-smi", True),
    }
    assert reply.envs["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    assert reply.envs["PATH"].startswith("/usr/local/nvidia/bin:")
    assert "NVIDIA_VISIBLE_DEVICES" not in reply.envs


def test_index_ids_and_pass_device_specs(node, plugin, tmp_path):
    from gpu_device_plugin.config import MountsSettings

    _root, dev = _fake_host(tmp_path)
    plugin(device_id_strategy="index", pass_device_specs=True, mounts=MountsSettings(dev_root=dev))
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    assert [d["id"] for d in node.kubelet.devices(GPU)] == [str(i) for i in range(8)]
    reply = allocate(node, ["1"]).container_responses[0]
    assert reply.envs["NVIDIA_VISIBLE_DEVICES"] == "1"
    assert [d.container_path for d in reply.devices] == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]


FEATURES = {"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled"}


@pytest.mark.parametrize("strategy", ["envvar", "volume-mounts", "cdi-cri"])
def test_allocate_asks_for_gdrcopy_gds_and_mofed_as_nvidias_plugin_does(node, plugin, strategy):
    plugin(device_list_strategy=(strategy,))
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    envs = allocate(node, [H100[3]]).container_responses[0].envs
    assert {k: v for k, v in envs.items() if k in FEATURES} == FEATURES


def test_allocate_feature_envs_can_be_turned_off(node, plugin):
    plugin(gdrcopy_enabled=False, gds_enabled=False, mofed_enabled=True)
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    envs = allocate(node, [H100[3]]).container_responses[0].envs
    assert dict(envs) == {"NVIDIA_VISIBLE_DEVICES": H100[3], "NVIDIA_MOFED": "enabled"}


@pytest.mark.parametrize(
    ("strategies", "specs"),
    [(("cdi-cri",), False), (("cdi-annotations", "cdi-cri"), False), (("cdi-cri", "envvar"), True)],
)
def test_pass_device_specs_leaves_device_nodes_to_cdi_when_only_cdi_strategies_are_on(
    node, plugin, tmp_path, strategies, specs
):
    from gpu_device_plugin.config import MountsSettings

    _root, dev = _fake_host(tmp_path)
    plugin(device_list_strategy=strategies, pass_device_specs=True, mounts=MountsSettings(dev_root=dev))
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    reply = allocate(node, [H100[1]]).container_responses[0]
    expected = [f"{dev}/nvidia1", f"{dev}/nvidiactl", f"{dev}/nvidia-uvm"] if specs else []
    assert [d.host_path for d in reply.devices] == expected
    assert [c.name for c in reply.cdi_devices] == [f"nvidia.com/gpu={H100[1]}"]


def preferred(node, available, must=(), size=1, resource=GPU):
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=list(must), allocation_size=size
            )
        ]
    )
    return list(node.kubelet.stub(resource).GetPreferredAllocation(request, timeout=5).container_responses[0].deviceIDs)


def test_preferred_allocation_follows_nvlink_then_switch_then_numa(node, plugin):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    # Pairs on one switch and one NVLink island come first.
    assert sorted(preferred(node, H100, size=2)) == [H100[0], H100[1]]
    assert sorted(preferred(node, H100, must=[H100[2]], size=2)) == [H100[2], H100[3]]
    assert sorted(preferred(node, H100, must=[H100[6]], size=4)) == H100[4:]
    # Without NVLink between the candidates, the same NUMA node wins over a remote one.
    assert sorted(preferred(node, [H100[0], H100[5], H100[2]], must=[H100[0]], size=2)) == [H100[0], H100[2]]
    assert preferred(node, H100, must=[H100[7], H100[3]], size=2) == [H100[7], H100[3]]


def test_preferred_allocation_takes_a_whole_nvlink_island_over_the_best_first_pair(node, plugin):
    # The best pair (GPUs 0 and 1: NVLink and one switch) sits in an island that has only three GPUs left;
    # four GPUs that all reach each other over NVLink beat it (NVIDIA's plugin picks them too).
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    available = [H100[i] for i in (0, 1, 2, 4, 5, 6, 7)]
    assert sorted(preferred(node, available, size=4)) == H100[4:]
    assert sorted(preferred(node, H100, size=4)) == H100[:4]  # a tie between islands: the first
    assert sorted(preferred(node, [H100[i] for i in (0, 1, 2, 5, 6)], size=3)) == [H100[0], H100[1], H100[2]]
    # With a must-include GPU: three of one island beside it beat one island partner and a pair elsewhere.
    got = preferred(node, [H100[i] for i in (1, 2, 5, 6, 7)], must=[H100[1]], size=4)
    assert got[0] == H100[1] and sorted(got[1:]) == H100[5:]


def test_preferred_allocation_refuses_bad_input(node, plugin):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    for available, must, size, word in (
        (["GPU-x"], [], 1, "GPU-x"),
        ([H100[0]], [H100[1]], 1, H100[1]),
        (H100, H100[:3], 2, "exceed"),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            preferred(node, available, must, size)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert word in caught.value.details()


def test_pre_start_container_is_a_no_op_by_default(node, plugin):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    stub = node.kubelet.stub(GPU)
    reply = stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["GPU-anything"]), timeout=5)
    assert reply == api_pb2.PreStartContainerResponse()


def test_pre_start_container_when_configured_refuses_an_unhealthy_gpu(node, plugin):
    plugin(pre_start_required=True)
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    assert node.kubelet.registrations[0].options.pre_start_required
    stub = node.kubelet.stub(GPU)
    stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=[H100[1]]), timeout=5)
    spec = fixture("h100x8.yaml")
    spec["gpus"][1]["xid"] = 48
    write_spec(node.spec, spec)
    assert node.kubelet.wait(lambda: node.kubelet.health(GPU).get(H100[1]) == "Unhealthy")
    with pytest.raises(grpc.RpcError) as caught:
        stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=[H100[1]]), timeout=5)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_many_list_and_watch_streams_do_not_starve_allocate(node, plugin):
    plugin()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    channel = grpc.insecure_channel("unix:" + os.path.join(node.dir, "gpuops-nvidia.com-gpu.sock"))
    from gpu_device_plugin.api import api_pb2_grpc

    stub = api_pb2_grpc.DevicePluginStub(channel)
    streams = [stub.ListAndWatch(api_pb2.Empty()) for _stream in range(200)]
    firsts = []

    def first(stream):
        firsts.append(len(next(stream).devices))

    readers = [threading.Thread(target=first, args=(s,)) for s in streams]
    for r in readers:
        r.start()
    for r in readers:
        r.join(10)
    assert firsts == [8] * 200
    for _call in range(20):
        reply = stub.Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[H100[0]])]),
            timeout=5,
        )
        assert reply.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == H100[0]
    for s in streams:
        s.cancel()
    channel.close()


def test_shutdown_ends_list_and_watch_cleanly_and_removes_the_socket(node):
    daemon = DaemonThread(make_config(node.kubelet_socket, node.spec)).start()
    assert node.kubelet.wait(lambda: node.kubelet.devices(GPU) is not None)
    endpoint = node.kubelet.endpoints[GPU]
    assert daemon.stop() == 0
    assert node.kubelet.wait(lambda: endpoint.stream_ended is not None)
    assert endpoint.stream_ended == "OK"
    assert not os.path.exists(os.path.join(node.dir, "gpuops-nvidia.com-gpu.sock"))
