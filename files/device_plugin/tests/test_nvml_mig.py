"""MIG as a driver serves it: the real pynvml (nvidia-ml-py) on the mock libnvidia-ml.so.1 (a TEST DOUBLE of
the driver's library, tests/mock_nvml at the repository's top) partitioning GPUs: the profiles and placements
each product offers, MIG mode changes that wait for a GPU reset, creating and destroying GPU and compute
instances with NVML's errors, one layout seen by every process, and a failure injected half-way."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from typing import Any, Optional

import pytest
from gpu_device_plugin._shared import gpu_discovery
from harness import FIXTURES, fixture, wait_until, write_spec
from mock_nvml import MockNvml

H100 = "NVIDIA H100 80GB HBM3"
PRODUCTS = {
    # name: (memory MiB, compute capability)
    "NVIDIA A100-SXM4-40GB": (40960, "8.0"),
    "NVIDIA A100-SXM4-80GB": (81920, "8.0"),
    H100: (81559, "9.0"),
    "NVIDIA H100 NVL": (95830, "9.0"),
    "NVIDIA H200": (143771, "9.0"),
}
# NVIDIA's profiles per product (MIG user guide, "Supported MIG Profiles"; IDs and placements as
# `nvidia-smi mig -lgip` and `-lgipp` list them): per NVML_GPU_INSTANCE_PROFILE_* index, the name by product,
# NVIDIA's ID, compute slices, instances and the placements (first memory slice, memory slices).
NAMES = {
    "NVIDIA A100-SXM4-40GB": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "NVIDIA A100-SXM4-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    H100: ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "NVIDIA H100 NVL": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "NVIDIA H200": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
}
ONE_SLICE = [(start, 1) for start in range(7)]
GEOMETRY = [  # (NVML index, NVIDIA ID, slices, instances, placements), in the order of NAMES
    (0, 19, 1, 7, ONE_SLICE),
    (7, 20, 1, 1, ONE_SLICE),
    (9, 15, 1, 4, [(0, 2), (2, 2), (4, 2), (6, 2)]),
    (1, 14, 2, 3, [(0, 2), (2, 2), (4, 2)]),
    (2, 9, 3, 2, [(0, 4), (4, 4)]),
    (3, 5, 4, 1, [(0, 4)]),
    (4, 0, 7, 1, [(0, 8)]),
]
# H100 80GB HBM3, `nvidia-smi mig -lgip` (GiB there): memory MiB and SMs by NVIDIA ID.
H100_MEMORY_SM = {19: (9984, 16), 20: (9984, 16), 15: (20096, 26), 14: (20096, 32), 9: (40448, 60), 5: (40448, 64)}
H100_MEMORY_SM[0] = (81152, 132)


def one_gpu_spec(path: str, name: str = H100, **gpu: Any) -> str:
    """A spec of one GPU of the product `name` (the first GPU of h100x8, renamed); persistence mode off unless
    `gpu` says otherwise, as a GPU in persistence mode is not reset (the MIG mode tests reset it)."""
    spec = fixture("h100x8.yaml")
    first = spec["gpus"][0]
    first.pop("nvlink_peers")
    memory, capability = PRODUCTS[name]
    first.update(name=name, memory_mib=memory, compute_capability=capability, **{"persistence_mode": False, **gpu})
    spec["gpus"] = [first]
    write_spec(path, spec)
    return path


@pytest.fixture
def library(tmp_path):
    """The real pynvml on the library, its state from a one-H100 spec with MIG mode off."""
    mock = MockNvml(one_gpu_spec(str(tmp_path / "gpus.yaml")), str(tmp_path / "state"))
    mock.pynvml.nvmlInit()
    yield mock
    mock.pynvml.nvmlShutdown()
    mock.close()


def code(nvml: Any, call: Any, *args: Any) -> int:
    """The NVML code a call answers (0 for success)."""
    try:
        call(*args)
    except nvml.NVMLError as exc:
        return int(exc.value)
    return 0


def enable(nvml: Any, gpu: Any) -> None:
    assert nvml.nvmlDeviceSetMigMode(gpu, nvml.NVML_DEVICE_MIG_ENABLE) == nvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(gpu) == [1, 1]


def placements(nvml: Any, gpu: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, None, ctypes.byref(count))
    found = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, found, ctypes.byref(count))
    return [(p.start, p.size) for p in found[: count.value]]


def gpu_instances(nvml: Any, gpu: Any, profile_id: int) -> list[Any]:
    found = (nvml.c_nvmlGpuInstance_t * 8)()
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetGpuInstances(gpu, profile_id, found, ctypes.byref(count))
    return list(found[: count.value])


def create(nvml: Any, gpu: Any, profile_id: int, ci_profile: Any = None) -> tuple[int, int]:
    """A GPU instance of the profile with one compute instance (the whole of it, unless `ci_profile`), as
    `nvidia-smi mig -cgi ID -C` makes it: (GPU-instance ID, first memory slice)."""
    instance = nvml.nvmlDeviceCreateGpuInstance(gpu, profile_id)
    info = nvml.nvmlGpuInstanceGetInfo(instance)
    if ci_profile is None:
        slices = next(p for p in GEOMETRY if p[1] == profile_id)[2]
        ci_profile = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[slices]
    nvml.nvmlGpuInstanceCreateComputeInstance(instance, ci_profile)
    return info.id, info.placement.start


def mig_devices(nvml: Any, gpu: Any) -> list[tuple[str, int, int, int]]:
    """(name, GPU-instance ID, compute-instance ID, MiB) of each MIG device, in NVML's order."""
    found = []
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
        except nvml.NVMLError_NotFound:
            continue
        found.append(
            (
                nvml.nvmlDeviceGetName(mig),
                nvml.nvmlDeviceGetGpuInstanceId(mig),
                nvml.nvmlDeviceGetComputeInstanceId(mig),
                nvml.nvmlDeviceGetMemoryInfo(mig).total // 2**20,
            )
        )
    return found


def gpu_instance_ids(nvml: Any, gpu: Any) -> Optional[list[int]]:
    """The GPU-instance ID of each MIG device, or None when one was destroyed between NVML's listing and the
    read of it (a layout being replaced meanwhile)."""
    try:
        return [gi for _name, gi, _ci, _mib in mig_devices(nvml, gpu)]
    except nvml.NVMLError_InvalidArgument:
        return None


# Run by another process: the library's layout seen there (the same pynvml, loaded by its soname).
CLIENT = r"""
import json, sys
import pynvml as nvml
nvml.nvmlInit()
gpu = nvml.nvmlDeviceGetHandleByIndex(0)
def layout():
    found = []
    for index in range(7):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
        except nvml.NVMLError:
            continue
        found.append([nvml.nvmlDeviceGetUUID(mig), nvml.nvmlDeviceGetName(mig), nvml.nvmlDeviceGetGpuInstanceId(mig)])
    return {"mode": nvml.nvmlDeviceGetMigMode(gpu), "devices": found}
"""


def run_client(mock: MockNvml, code_text: str, **env: str) -> Any:
    """Runs CLIENT and then `code_text` (which prints JSON) in a process of its own; returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-c", CLIENT + code_text],
        env={**os.environ, **mock.env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class OtherClient:
    """Another process with NVML initialised (a monitoring agent, a device plugin), until closed; it tells
    the layout it sees whenever asked."""

    def __init__(self, mock: MockNvml) -> None:
        loop = (
            "print(json.dumps(layout()), flush=True)\n"
            "for _line in sys.stdin:\n"
            "    print(json.dumps(layout()), flush=True)\n"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", CLIENT + loop],
            env={**os.environ, **mock.env()},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.seen = self._answer()  # NVML is initialised there once it answers

    def _answer(self) -> Any:
        assert self.process.stdout is not None
        return json.loads(self.process.stdout.readline())

    def ask(self) -> Any:
        """The layout the process sees now."""
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        self.process.communicate(timeout=20)


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_each_product_offers_nvidias_profiles_and_placements(tmp_path, name):
    mock = MockNvml(one_gpu_spec(str(tmp_path / "gpus.yaml"), name, mig_mode="enabled"), str(tmp_path / "state"))
    nvml = mock.pynvml
    nvml.nvmlInit()
    try:
        gpu = nvml.nvmlDeviceGetHandleByIndex(0)
        offered = []
        for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, index)
            except nvml.NVMLError_NotSupported:
                continue
            offered.append((index, info.name, info.id, info.sliceCount, info.instanceCount, info.memorySizeMB))
        past_the_end = code(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, gpu, nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
        by_id = {i: placements(nvml, gpu, i) for (_x, i, _s, _n, _p) in GEOMETRY}
        first = nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, 0, version=1)
    finally:
        nvml.nvmlShutdown()
        mock.close()
    want = sorted(
        (index, f"MIG {label}", nvidia_id, slices, instances)
        for label, (index, nvidia_id, slices, instances, _p) in zip(NAMES[name], GEOMETRY)
    )
    assert sorted(row[:5] for row in offered) == want
    assert past_the_end == nvml.NVML_ERROR_INVALID_ARGUMENT
    assert by_id == {nvidia_id: where for (_x, nvidia_id, _s, _n, where) in GEOMETRY}
    assert (first.id, first.sliceCount) == (19, 1)  # the first profile through the unversioned call too
    if name == H100:
        assert {row[2]: row[5] for row in offered} == {i: memory for i, (memory, _sm) in H100_MEMORY_SM.items()}


def test_all_1g_10gb_on_an_h100_takes_seven_gpu_instances_where_the_driver_puts_them(library, tmp_path):
    nvml = library.pynvml
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(gpu) == [0, 0]
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstance, gpu, 19) == nvml.NVML_ERROR_NOT_SUPPORTED
    enable(nvml, gpu)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19) == 7
    made = [create(nvml, gpu, 19) for _attempt in range(7)]
    # NVIDIA's own transcript of `nvidia-smi mig -cgi 19,19,19,19,19,19,19 -C` on an H100: IDs 13, 11, 12, 7-10.
    assert made == [(13, 6), (11, 4), (12, 5), (7, 0), (8, 1), (9, 2), (10, 3)]
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstance, gpu, 19) == nvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19) == 0
    assert len(gpu_instances(nvml, gpu, 19)) == 7 and gpu_instances(nvml, gpu, 9) == []
    assert mig_devices(nvml, gpu) == [(f"{H100} MIG 1g.10gb", gi, 0, 9984) for gi in range(7, 14)]
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    attributes = nvml.nvmlDeviceGetAttributes_v2(mig)
    assert (attributes.gpuInstanceSliceCount, attributes.computeInstanceSliceCount) == (1, 1)
    assert (attributes.multiprocessorCount, attributes.memorySizeMB) == (16, 9984)
    # The collection's and the daemon's discovery read them as any NVML client does.
    facts = gpu_discovery.nvml_discover(nvml, str(tmp_path))["gpus"][0]
    assert facts["mig_mode"] == "enabled"
    assert [m["profile"] for m in facts["mig_devices"]] == ["1g.10gb"] * 7
    assert len({m["uuid"] for m in facts["mig_devices"]}) == 7


@pytest.mark.parametrize(
    ("profiles", "ids"),
    [
        ([9, 9], [2, 1]),  # `nvidia-smi mig -cgi 9,3g.20gb -C`
        ([19, 19, 14, 9], [13, 11, 3, None]),  # the order the guide warns of: no room left for the 3g.20gb
        ([9, 19, 14, 19], [2, 7, 4, 8]),
        ([14, 19, 19, 19, 19, 19], [5, 13, 7, 8, 9, 10]),
    ],
    ids=["two-3g", "3g-last", "3g-first", "2g-and-five-1g"],
)
def test_gpu_instances_go_where_nvidias_examples_on_an_a100_show_them(tmp_path, profiles, ids):
    spec = one_gpu_spec(str(tmp_path / "gpus.yaml"), "NVIDIA A100-SXM4-40GB", mig_mode="enabled")
    mock = MockNvml(spec, str(tmp_path / "state"))
    nvml = mock.pynvml
    nvml.nvmlInit()
    try:
        gpu = nvml.nvmlDeviceGetHandleByIndex(0)
        made = []
        for profile_id in profiles:
            try:
                made.append(nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceCreateGpuInstance(gpu, profile_id)).id)
            except nvml.NVMLError_InsufficientResources:
                made.append(None)
    finally:
        nvml.nvmlShutdown()
        mock.close()
    assert made == ids


def test_a_mixed_layout_with_compute_instances_that_share_a_gpu_instance(library):
    nvml = library.pynvml
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    enable(nvml, gpu)
    # mig-parted's all-balanced for an H100 80GB: 3g.40gb, 2g.20gb and two 1g.10gb.
    big = nvml.nvmlDeviceCreateGpuInstance(gpu, 9)
    assert nvml.nvmlGpuInstanceGetInfo(big).id == 2  # the driver's choice: 4:4, as NVIDIA's examples show
    assert [create(nvml, gpu, 14), create(nvml, gpu, 19), create(nvml, gpu, 19)] == [(3, 0), (9, 2), (10, 3)]
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19) == 0
    # In the 3g.40gb: a 1c and a 2c (1c.3g.40gb takes the last slice, so the 2c still fits at 0).
    one = nvml.nvmlGpuInstanceCreateComputeInstance(big, nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    two = nvml.nvmlGpuInstanceCreateComputeInstance(big, nvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    assert [
        (i.id, i.profileId, i.placement.start, i.placement.size)
        for i in map(nvml.nvmlComputeInstanceGetInfo, (one, two))
    ] == [
        (0, 0, 2, 1),
        (1, 1, 0, 2),
    ]
    profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(big, nvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 0)
    assert (profile.sliceCount, profile.instanceCount, profile.multiprocessorCount) == (2, 1, 32)
    assert nvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(big, 0) == 0
    assert mig_devices(nvml, gpu) == [
        (f"{H100} MIG 1c.3g.40gb", 2, 0, 40448),
        (f"{H100} MIG 2c.3g.40gb", 2, 1, 40448),
        (f"{H100} MIG 2g.20gb", 3, 0, 20096),
        (f"{H100} MIG 1g.10gb", 9, 0, 9984),
        (f"{H100} MIG 1g.10gb", 10, 0, 9984),
    ]
    sms = [
        nvml.nvmlDeviceGetAttributes_v2(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i)).multiprocessorCount
        for i in range(5)
    ]
    assert sms == [16, 32, 32, 16, 16]
    # The compute instances as NVIDIA's libraries walk them.
    found = (nvml.c_nvmlComputeInstance_t * 7)()
    count = ctypes.c_uint()
    nvml.nvmlGpuInstanceGetComputeInstances(big, nvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, found, ctypes.byref(count))
    assert count.value == 1 and nvml.nvmlComputeInstanceGetInfo(found[0]).id == 1
    assert nvml.nvmlComputeInstanceGetInfo(nvml.nvmlGpuInstanceGetComputeInstanceById(big, 0)).placement.start == 2


def test_destroying_instances_and_the_errors_of_nvml(library):
    nvml = library.pynvml
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    enable(nvml, gpu)
    instance = nvml.nvmlDeviceCreateGpuInstance(gpu, 14)
    compute = nvml.nvmlGpuInstanceCreateComputeInstance(instance, 1)
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0))
    # A GPU instance with compute instances is in use; MIG mode cannot go while GPU instances exist.
    assert code(nvml, nvml.nvmlGpuInstanceDestroy, instance) == nvml.NVML_ERROR_IN_USE
    assert code(nvml, nvml.nvmlDeviceSetMigMode, gpu, 0) == nvml.NVML_ERROR_IN_USE
    nvml.nvmlComputeInstanceDestroy(compute)
    assert code(nvml, nvml.nvmlComputeInstanceGetInfo, compute) == nvml.NVML_ERROR_INVALID_ARGUMENT
    assert code(nvml, nvml.nvmlDeviceGetHandleByUUID, uuid) == nvml.NVML_ERROR_NOT_FOUND
    assert code(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, gpu, 0) == nvml.NVML_ERROR_NOT_FOUND
    nvml.nvmlGpuInstanceDestroy(instance)
    assert code(nvml, nvml.nvmlGpuInstanceGetInfo, instance) == nvml.NVML_ERROR_INVALID_ARGUMENT
    assert code(nvml, nvml.nvmlDeviceGetGpuInstanceById, gpu, 5) == nvml.NVML_ERROR_NOT_FOUND
    # A new compute instance is a new MIG device with a new UUID.
    again = nvml.nvmlDeviceCreateGpuInstance(gpu, 14)
    nvml.nvmlGpuInstanceCreateComputeInstance(again, 1)
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)) != uuid
    assert nvml.nvmlDeviceGetMigMode(gpu) == [1, 1]


def test_placement_conflicts_and_profiles_not_offered(library):
    nvml = library.pynvml
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    enable(nvml, gpu)

    def place(start: int, size: int) -> Any:  # the bindings pass the placement on as given: a pointer
        return ctypes.byref(nvml.c_nvmlGpuInstancePlacement_t(start, size))

    lower = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, place(0, 4))
    assert nvml.nvmlGpuInstanceGetInfo(lower).id == 1
    # 4g.40gb has one placement, 0:4, which the 3g.40gb holds; 7g.80gb needs the whole GPU.
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstanceWithPlacement, gpu, 5, place(0, 4)) == 23
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstance, gpu, 0) == nvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstanceWithPlacement, gpu, 19, place(2, 1)) == 23
    # Not a placement of the profile, a profile the GPU does not have.
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstanceWithPlacement, gpu, 9, place(2, 4)) == 2
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstanceWithPlacement, gpu, 9, place(4, 2)) == 2
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstance, gpu, 99) == nvml.NVML_ERROR_INVALID_ARGUMENT
    assert code(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, gpu, 6) == nvml.NVML_ERROR_NOT_SUPPORTED
    # One 1g.10gb+me: the media engines are not shared.
    nvml.nvmlDeviceCreateGpuInstance(gpu, 20)
    assert code(nvml, nvml.nvmlDeviceCreateGpuInstance, gpu, 20) == nvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    # Compute instances: a 3g.40gb has no 4-slice profile, a 2g.20gb no 3-slice one; the only engine profile
    # is the shared one.
    assert code(nvml, nvml.nvmlGpuInstanceCreateComputeInstance, lower, 3) == nvml.NVML_ERROR_NOT_SUPPORTED
    four = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 14, place(4, 2))
    assert code(nvml, nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, four, 2, 0) == nvml.NVML_ERROR_NOT_SUPPORTED
    assert code(nvml, nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, four, 0, 1) == nvml.NVML_ERROR_INVALID_ARGUMENT

    def ci_place(start: int, size: int) -> Any:
        return ctypes.byref(nvml.c_nvmlComputeInstancePlacement_t(start, size))

    nvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(four, 0, ci_place(1, 1))
    assert code(nvml, nvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement, four, 1, ci_place(0, 2)) == 23
    # A GPU without MIG.
    no_mig = MockNvml(os.path.join(FIXTURES, "t4x1.yaml"), str(library.state) + ".t4")
    try:
        t4 = nvml.nvmlDeviceGetHandleByIndex(0)
        assert code(nvml, nvml.nvmlDeviceSetMigMode, t4, 1) == nvml.NVML_ERROR_NOT_SUPPORTED
        count = ctypes.byref(ctypes.c_uint())
        assert code(nvml, nvml.nvmlDeviceGetGpuInstancePossiblePlacements, t4, 19, None, count) == 3
    finally:
        no_mig.close()


def test_a_client_without_write_access_to_the_layout_gets_no_permission(library, monkeypatch):
    nvml = library.pynvml
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    monkeypatch.setenv("GPUOPS_MOCK_NVML_MIG_LAYOUT", "/sys/gpuops-mock-nvml.mig")
    assert code(nvml, nvml.nvmlDeviceSetMigMode, gpu, 1) == nvml.NVML_ERROR_NO_PERMISSION
    assert nvml.nvmlDeviceGetMigMode(gpu) == [0, 0]


def test_mig_mode_stays_pending_while_another_process_has_nvml_until_the_gpu_is_reset(library):
    nvml = library.pynvml
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    uuid = nvml.nvmlDeviceGetUUID(gpu)
    other = OtherClient(library)
    try:
        # The driver's reset after the mode change fails: the other process has the GPU open.
        assert nvml.nvmlDeviceSetMigMode(gpu, 1) == nvml.NVML_ERROR_IN_USE
        assert nvml.nvmlDeviceGetMigMode(gpu) == [0, 1]
        assert code(nvml, nvml.nvmlDeviceCreateGpuInstance, gpu, 19) == nvml.NVML_ERROR_NOT_SUPPORTED
        assert code(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, gpu, 0) == nvml.NVML_ERROR_NOT_SUPPORTED
        assert run_client(library, "print(json.dumps(layout()))")["mode"] == [0, 1]
        # So does a reset asked for while it has.
        assert library.reset_gpu(uuid) == nvml.NVML_ERROR_IN_USE
        assert nvml.nvmlDeviceGetMigMode(gpu) == [0, 1]
    finally:
        other.close()
    assert library.reset_gpu(uuid) == nvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(gpu) == [1, 1]
    create(nvml, gpu, 9)
    # With no other client the driver resets at once; a reboot applies a pending mode whoever has NVML open.
    other = OtherClient(library)
    try:
        assert library.reset_gpu(uuid, force=True) == nvml.NVML_SUCCESS  # instances are gone with a reset
        assert mig_devices(nvml, gpu) == []
        assert nvml.nvmlDeviceSetMigMode(gpu, 0) == nvml.NVML_ERROR_IN_USE
        assert library.reset_gpu(uuid, force=True) == nvml.NVML_SUCCESS
        assert nvml.nvmlDeviceGetMigMode(gpu) == [0, 0]
    finally:
        other.close()
    assert nvml.nvmlDeviceSetMigMode(gpu, 1) == nvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(gpu) == [1, 1]


def test_one_layout_for_every_process_on_the_node(library):
    nvml = library.pynvml
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    enable(nvml, gpu)
    watcher = OtherClient(library)  # started before the change, like a device plugin
    try:
        create(nvml, gpu, 9)
        create(nvml, gpu, 14)
        mine = [[nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i))] for i in range(2)]
        seen = run_client(library, "print(json.dumps(layout()))")
        assert seen["mode"] == [1, 1]
        assert [[uuid] for uuid, _name, _gi in seen["devices"]] == mine
        assert [name for _uuid, name, _gi in seen["devices"]] == [f"{H100} MIG 3g.40gb", f"{H100} MIG 2g.20gb"]
        # Another process destroys the 2g.20gb; this one sees it gone.
        run_client(
            library,
            "gi = nvml.nvmlDeviceGetGpuInstanceById(gpu, 3)\n"
            "nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0))\n"
            "nvml.nvmlGpuInstanceDestroy(gi)\n"
            "print(json.dumps(layout()))",
        )
        assert [name for name, *_rest in mig_devices(nvml, gpu)] == [f"{H100} MIG 3g.40gb"]
        # And a process that had NVML open all along sees the layout as it is now.
        assert watcher.seen["devices"] == []
        assert [name for _uuid, name, _gi in watcher.ask()["devices"]] == [f"{H100} MIG 3g.40gb"]
    finally:
        watcher.close()


def test_the_declared_layout_holds_until_clients_change_it_and_a_new_declaration_replaces_it(tmp_path):
    spec = str(tmp_path / "gpus.yaml")
    write_spec(spec, fixture("a100-mig.yaml"))
    mock = MockNvml(spec, str(tmp_path / "state"))
    nvml = mock.pynvml
    nvml.nvmlInit()
    try:
        gpu = nvml.nvmlDeviceGetHandleByIndex(0)
        name = "NVIDIA A100-SXM4-40GB"
        declared = [(f"{name} MIG 3g.20gb", 1, 0, 19968), (f"{name} MIG 1g.5gb", 11, 0, 4864)]
        declared.append((f"{name} MIG 1g.5gb", 12, 0, 4864))
        assert mig_devices(nvml, gpu) == declared  # 3g.20gb at 0:4, the 1g.5gb at 4 and 5
        # The declared instances are NVML's like any other: one more 1g.5gb fits, at 6.
        assert create(nvml, gpu, 19) == (13, 6)
        seen = run_client(mock, "print(json.dumps(layout()))")
        assert [gi for _uuid, _name, gi in seen["devices"]] == [1, 11, 12, 13]
        # An edit elsewhere in the spec keeps the layout; a new declaration for the GPU puts that in place.
        edited = fixture("a100-mig.yaml")
        edited["gpus"][0]["numa_node"] = 1
        write_spec(spec, edited)
        assert wait_until(lambda: nvml.nvmlDeviceGetNumaNodeId(gpu) == 1)
        assert [gi for _name, gi, _ci, _mib in mig_devices(nvml, gpu)] == [1, 11, 12, 13]
        # A handle to a MIG device the new declaration replaces answers INVALID_ARGUMENT from then on, as the
        # driver's does for a destroyed device; so a reader polling while the layout changes may meet one.
        stale = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
        edited["gpus"][0]["mig_devices"] = edited["gpus"][0]["mig_devices"][:1]
        write_spec(spec, edited)
        assert wait_until(lambda: gpu_instance_ids(nvml, gpu) == [1])
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetName(stale)
    finally:
        nvml.nvmlShutdown()
        mock.close()


def test_a_failure_injected_half_way_through_a_layout_leaves_what_came_before(library):
    nvml = library.pynvml
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    enable(nvml, gpu)
    # A client applying all-balanced, whose third GPU instance fails (as a driver can): INSUFFICIENT_RESOURCES
    # for the 3rd nvmlDeviceCreateGpuInstance of that process only; the 4th goes through.
    applied = run_client(
        library,
        "codes = []\n"
        "for profile in (9, 14, 19, 19):\n"
        "    try:\n"
        "        nvml.nvmlGpuInstanceCreateComputeInstance(nvml.nvmlDeviceCreateGpuInstance(gpu, profile), 0)\n"
        "        codes.append(0)\n"
        "    except nvml.NVMLError as exc:\n"
        "        codes.append(exc.value)\n"
        "print(json.dumps({'codes': codes, 'layout': layout()}))",
        GPUOPS_MOCK_NVML_FAIL="nvmlDeviceCreateGpuInstance:23@3",
    )
    assert applied["codes"] == [0, 0, 23, 0]
    assert [gi for _uuid, _name, gi in applied["layout"]["devices"]] == [2, 3, 9]
    assert [(name, gi) for name, gi, _ci, _mib in mig_devices(nvml, gpu)] == [
        (f"{H100} MIG 1c.3g.40gb", 2),
        (f"{H100} MIG 1c.2g.20gb", 3),
        (f"{H100} MIG 1g.10gb", 9),
    ]
    # Every call fails without @N.
    assert run_client(library, "print(json.dumps(layout()))", GPUOPS_MOCK_NVML_FAIL="x:1")["mode"] == [1, 1]
    failing = run_client(
        library,
        "try:\n    nvml.nvmlDeviceCreateGpuInstance(gpu, 19)\n    print(0)\nexcept nvml.NVMLError as exc:\n"
        "    print(exc.value)",
        GPUOPS_MOCK_NVML_FAIL="nvmlDeviceCreateGpuInstance:999",
    )
    assert failing == 999
    assert len(mig_devices(nvml, gpu)) == 3


def test_a_gpu_in_persistence_mode_is_not_reset_until_persistence_mode_is_turned_off(tmp_path):
    mock = MockNvml(one_gpu_spec(str(tmp_path / "gpus.yaml"), persistence_mode=True), str(tmp_path / "state"))
    nvml = mock.pynvml
    nvml.nvmlInit()
    try:
        gpu = nvml.nvmlDeviceGetHandleByIndex(0)
        uuid = nvml.nvmlDeviceGetUUID(gpu)
        assert nvml.nvmlDeviceGetPersistenceMode(gpu) == 1
        # As nvidia-smi --gpu-reset answers then: "In use by another client".
        assert mock.reset_gpu(uuid) == nvml.NVML_ERROR_IN_USE
        nvml.nvmlDeviceSetPersistenceMode(gpu, 0)
        # Every process on the node sees it.
        seen = "print(json.dumps(nvml.nvmlDeviceGetPersistenceMode(nvml.nvmlDeviceGetHandleByIndex(0))))\n"
        assert run_client(mock, seen) == 0
        assert mock.reset_gpu(uuid) == nvml.NVML_SUCCESS
        nvml.nvmlDeviceSetPersistenceMode(gpu, 1)
        assert run_client(mock, seen) == 1
        assert mock.reset_gpu(uuid) == nvml.NVML_ERROR_IN_USE
        assert mock.reset_gpu(uuid, force=True) == nvml.NVML_SUCCESS  # a reboot resets it whatever its mode
        assert code(nvml, nvml.nvmlDeviceSetPersistenceMode, gpu, 2) == nvml.NVML_ERROR_INVALID_ARGUMENT
    finally:
        nvml.nvmlShutdown()
        mock.close()
