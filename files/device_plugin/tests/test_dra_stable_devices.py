"""DRA devices keep their names and their GPUs when NVML indices shift: the real pynvml on the mock
libnvidia-ml.so.1 (a TEST DOUBLE of the driver's library), a GPU taken out of its spec between two runs
of the daemon, over real unix-socket gRPC with the plugin-watcher double.

tests/data/checkpoint-v1/ holds a checkpoint and the CDI specs as the index-based version 1 wrote them
(claims on gpu-0, gpu-1 and gpu-2 of h100x8); a node being upgraded starts with such files."""

from __future__ import annotations

import json
import os
import shutil

from api_server_double import DRIVER
from harness import H100, fixture, remove_gpu, wait_until, write_spec

GONE = "5e1f0000-0000-4000-8000-000000000000"  # on gpu-0, the GPU that goes away
A = "5e1f0000-0000-4000-8000-00000000000a"  # on gpu-1
B = "5e1f0000-0000-4000-8000-00000000000b"  # on gpu-2
V1 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "checkpoint-v1")


def visible(dra, uid: str) -> str:
    spec = dra.spec_of(uid)
    assert spec is not None, f"no CDI spec for {uid}"
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    return env["NVIDIA_VISIBLE_DEVICES"]


def without_gpu_0(mock_nvml) -> None:
    """Take GPU 0 out of the spec the mock library follows; wait until NVML counts 7 GPUs."""
    spec = fixture("h100x8.yaml")
    remove_gpu(spec, 0)
    write_spec(mock_nvml.spec, spec)
    nvml = mock_nvml.pynvml

    def seven() -> bool:
        nvml.nvmlInit()
        try:
            return int(nvml.nvmlDeviceGetCount()) == 7
        finally:
            nvml.nvmlShutdown()

    assert wait_until(seven)


def checkpoint_devices(dra) -> dict[str, list[tuple[str, str]]]:
    with open(dra.checkpoint, encoding="utf-8") as handle:
        data = json.load(handle)
    return {uid: [(d["device"], d.get("uuid", "")) for d in entry["devices"]] for uid, entry in data["claims"].items()}


def check_after_gpu_0_is_gone(dra) -> None:
    """What every test below expects once the daemon runs again without GPU 0."""
    # Every prepared claim is on its own physical GPU, under the device name it was allocated.
    assert visible(dra, A) == H100[1] and visible(dra, B) == H100[2]
    answers = dra.kubelet.prepare(DRIVER, [("default", "a", A), ("default", "b", B)])
    assert {uid: (a.error, [d.device_name for d in a.devices]) for uid, a in answers.items()} == {
        A: ("", ["gpu-1"]),
        B: ("", ["gpu-2"]),
    }
    # The slice keeps every remaining GPU's name; gpu-0 is not given to another GPU.
    assert wait_until(lambda: (dra.publisher.last() or ([], None))[0] == [f"gpu-{i}" for i in range(1, 8)])
    names = {name: device.uuid for name, device in dra.daemons[-1].daemon.node._devices().items()}
    assert names == {f"gpu-{i}": H100[i] for i in range(1, 8)}
    # A new claim for A's device is refused; one for a free device gets that very GPU.
    thief = dra.allocate("thief", "5e1f0000-0000-4000-8000-0000000000ff", ["gpu-1"])
    assert "already prepared for ResourceClaim default/a" in dra.kubelet.prepare(DRIVER, [thief])[thief[2]].error
    new = dra.allocate("new", "5e1f0000-0000-4000-8000-0000000000ee", ["gpu-3"])
    assert dra.kubelet.prepare(DRIVER, [new])[new[2]].error == ""
    assert visible(dra, new[2]) == H100[3]
    seen = [visible(dra, uid) for uid in (A, B, new[2])]
    assert len(set(seen)) == len(seen), f"two claims share a GPU: {seen}"
    # The claim whose GPU is gone: preparing it again says so, unpreparing it works and frees it.
    error = dra.kubelet.prepare(DRIVER, [("default", "gone", GONE)])[GONE].error
    assert "default/gone" in error and "gpu-0" in error and H100[0] in error and "no longer" in error, error
    assert dra.kubelet.unprepare(DRIVER, [("default", "gone", GONE)]) == {GONE: ""}
    assert dra.spec_of(GONE) is None
    devices = checkpoint_devices(dra)
    assert GONE not in devices
    assert devices[A] == [("gpu-1", H100[1])] and devices[B] == [("gpu-2", H100[2])]


def test_removing_gpu_0_after_a_restart_keeps_every_prepared_claim_on_its_own_gpu(dra, mock_nvml):
    dra.start(backend="nvml", simulated_spec=None)
    claims = [
        dra.allocate("gone", GONE, ["gpu-0"]),
        dra.allocate("a", A, ["gpu-1"]),
        dra.allocate("b", B, ["gpu-2"]),
    ]
    assert {uid: a.error for uid, a in dra.kubelet.prepare(DRIVER, claims).items()} == {GONE: "", A: "", B: ""}
    assert [visible(dra, uid) for uid in (GONE, A, B)] == H100[:3]
    assert checkpoint_devices(dra)[A] == [("gpu-1", H100[1])]
    dra.stop_daemons()
    # GPU 0 fails and the node reboots: NVML numbers the rest 0..6 and /var/run/cdi is empty again.
    without_gpu_0(mock_nvml)
    shutil.rmtree(dra.cdi)
    os.mkdir(dra.cdi)
    dra.start(backend="nvml", simulated_spec=None)
    check_after_gpu_0_is_gone(dra)


def _install_v1_files(dra) -> None:
    os.makedirs(dra.plugin_dir)
    shutil.copy(os.path.join(V1, "plugin", "checkpoint.json"), dra.checkpoint)
    for name in os.listdir(os.path.join(V1, "cdi")):
        shutil.copy(os.path.join(V1, "cdi", name), os.path.join(dra.cdi, name))
    for name, uid, device in (("gone", GONE, "gpu-0"), ("a", A, "gpu-1"), ("b", B, "gpu-2")):
        dra.allocate(name, uid, [device])


def test_a_checkpoint_by_index_from_before_the_upgrade_is_read_and_its_claims_keep_their_gpus(dra, mock_nvml):
    _install_v1_files(dra)
    dra.start(backend="nvml", simulated_spec=None)
    answers = dra.kubelet.prepare(DRIVER, [("default", "a", A), ("default", "b", B), ("default", "gone", GONE)])
    assert {uid: (a.error, [d.device_name for d in a.devices]) for uid, a in answers.items()} == {
        GONE: ("", ["gpu-0"]),
        A: ("", ["gpu-1"]),
        B: ("", ["gpu-2"]),
    }
    # Written again in the new form, with each device's UUID.
    assert checkpoint_devices(dra) == {GONE: [("gpu-0", H100[0])], A: [("gpu-1", H100[1])], B: [("gpu-2", H100[2])]}
    with open(dra.checkpoint, encoding="utf-8") as handle:
        assert json.load(handle)["version"] == 2
    # ... and the names stay bound to these GPUs when GPU 0 goes later.
    dra.stop_daemons()
    without_gpu_0(mock_nvml)
    dra.start(backend="nvml", simulated_spec=None)
    check_after_gpu_0_is_gone(dra)


def test_an_upgrade_that_meets_a_shifted_gpu_set_takes_the_uuids_from_the_cdi_specs(dra, mock_nvml):
    # GPU 0 went away while the old version was stopped: its CDI specs still say which GPU each claim had.
    _install_v1_files(dra)
    without_gpu_0(mock_nvml)
    dra.start(backend="nvml", simulated_spec=None)
    check_after_gpu_0_is_gone(dra)


def _inventory(gpus, minors=None):
    from gpu_device_plugin.inventory import Gpu, Inventory, MigDevice

    return Inventory(
        gpus=tuple(
            Gpu(
                index,
                uuid,
                "NVIDIA A100",
                40960,
                f"0000:{index:02x}:00.0",
                "8.0",
                mig_mode="enabled" if migs else "disabled",
                mig_devices=tuple(MigDevice(m, "1g.5gb", 4864, i) for i, m in enumerate(migs)),
                minor_number=index if minors is None else minors[index],
            )
            for index, (uuid, migs) in enumerate(gpus)
        )
    )


def test_a_gpu_seen_for_the_first_time_never_takes_the_number_of_one_that_went(tmp_path):
    from gpu_device_plugin.dra.names import DeviceNumbers

    numbers = DeviceNumbers(str(tmp_path))
    numbers.load({})
    assert numbers.numbers(_inventory([("GPU-a", ()), ("GPU-b", ()), ("GPU-c", ())])) == {
        "GPU-a": 0,
        "GPU-b": 1,
        "GPU-c": 2,
    }
    # GPU-a is replaced by GPU-n in the same slot (NVML index 0): the new GPU gets a new number.
    again = DeviceNumbers(str(tmp_path))
    again.load({})
    assert again.numbers(_inventory([("GPU-n", ()), ("GPU-b", ()), ("GPU-c", ())])) == {
        "GPU-n": 3,
        "GPU-b": 1,
        "GPU-c": 2,
    }
    with open(tmp_path / "devices.json", encoding="utf-8") as handle:
        assert json.load(handle) == {"version": 1, "gpus": {"GPU-a": 0, "GPU-b": 1, "GPU-c": 2, "GPU-n": 3}}


def test_a_gpu_seen_first_is_numbered_by_its_minor_number_as_nvidia_s_driver_names_it(tmp_path):
    from gpu_device_plugin.dra.devices import dra_devices
    from gpu_device_plugin.dra.names import DeviceNumbers

    numbers = DeviceNumbers(str(tmp_path))
    numbers.load({})
    # NVML's order is not the device nodes' order: /dev/nvidia2 is NVML index 0.
    inventory = _inventory([("GPU-a", ()), ("GPU-b", ()), ("GPU-c", ())], minors=[2, 0, 1])
    assert numbers.numbers(inventory) == {"GPU-a": 2, "GPU-b": 0, "GPU-c": 1}
    assert [d.name for d in dra_devices(inventory, numbers.numbers(inventory))] == ["gpu-0", "gpu-1", "gpu-2"]


def test_the_numbers_of_held_mig_devices_bind_their_gpu_and_a_corrupt_file_is_set_aside(tmp_path, caplog):
    import logging

    from gpu_device_plugin.dra.devices import dra_devices
    from gpu_device_plugin.dra.names import DeviceNumbers

    (tmp_path / "devices.json").write_text('{"version": 1, "gpus": {"GPU-x": 0, "GPU-y": 0}}')
    numbers = DeviceNumbers(str(tmp_path))
    with caplog.at_level(logging.ERROR, logger="gpu_device_plugin"):
        # A claim holds a MIG device of the GPU that was number 1, now NVML index 0.
        numbers.load({"MIG-b1": "gpu-1-mig-1"})
    assert "gives one number to two GPUs" in caplog.text
    assert [n for n in os.listdir(tmp_path) if n.startswith("devices.json.corrupt-")]
    inventory = _inventory([("GPU-b", ("MIG-b0", "MIG-b1")), ("GPU-c", ())])
    assert numbers.numbers(inventory) == {"GPU-b": 1, "GPU-c": 2}
    assert [d.name for d in dra_devices(inventory, numbers.numbers(inventory))] == [
        "gpu-1-mig-0",
        "gpu-1-mig-1",
        "gpu-2",
    ]
    reread = DeviceNumbers(str(tmp_path))
    reread.load({})
    assert reread.numbers(inventory) == {"GPU-b": 1, "GPU-c": 2}
