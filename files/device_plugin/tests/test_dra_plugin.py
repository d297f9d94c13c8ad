"""The daemon as a DRA kubelet plugin, over real unix-socket gRPC: registration through the plugin
watcher (a double of the kubelet's), NodePrepareResources / NodeUnprepareResources with the v1 and
v1beta1 stubs, the CDI specs written, the health stream. The API server is a double (api_server_double)."""

from __future__ import annotations

import os
import stat

import pytest
from api_server_double import DRIVER
from dra_harness import NODE
from harness import H100, fixture, wait_until, write_spec

ALL = [f"gpu-{i}" for i in range(8)]


def test_registers_through_the_plugin_watcher_with_both_versions(dra):
    dra.start()
    info = dra.kubelet.registrations[0]
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == os.path.join(dra.plugins, DRIVER, "dra.sock")
    assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert "v1.DRAResourceHealth" in info.supported_versions
    assert dra.kubelet.plugins[DRIVER].service == "v1.DRAPlugin"
    for path in (os.path.join(dra.registry, f"{DRIVER}-reg.sock"), info.endpoint):
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert wait_until(lambda: dra.daemons[0].daemon.node.registrar.registered is True)
    # The slice was published before the plugin registered.
    assert dra.publisher.calls[0] == (ALL, frozenset())


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_one_device_writes_its_cdi_spec_and_returns_its_id(dra, version):
    dra.start()
    claim = dra.allocate("one", "5e1f0000-0000-4000-8000-000000000031", ["gpu-3"])
    answer = dra.kubelet.prepare(DRIVER, [claim], version)["5e1f0000-0000-4000-8000-000000000031"]
    assert answer.error == ""
    [device] = answer.devices
    assert (device.pool_name, device.device_name, list(device.request_names)) == (NODE, "gpu-3", ["gpu"])
    assert list(device.cdi_device_ids) == ["gpuops.k8s/gpu=5e1f0000-0000-4000-8000-000000000031-gpu-3"]
    spec = dra.spec_of("5e1f0000-0000-4000-8000-000000000031")
    assert spec["kind"] == "gpuops.k8s/gpu"
    assert [d["name"] for d in spec["devices"]] == ["5e1f0000-0000-4000-8000-000000000031-gpu-3"]
    assert spec["devices"][0]["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/nvidia3", "hostPath": os.path.join(dra.dev, "nvidia3"), "permissions": "rw"}],
        "env": [f"GPUOPS_DEVICE_GPU_3={H100[3]}"],
    }
    common = spec["containerEdits"]
    assert common["env"] == [f"NVIDIA_VISIBLE_DEVICES={H100[3]}"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert "mounts" not in common
    assert sorted(os.listdir(dra.cdi)) == ["gpuops.k8s-gpu_5e1f0000-0000-4000-8000-000000000031.json"]


def test_a_gpu_without_a_device_node_still_has_edits_cdi_accepts(dra):
    # Simulated GPUs have no /dev/nvidia<minor>; CDI refuses a device whose edits are empty
    # ("invalid device, empty device edits"), so the device's own variable must be there.
    for name in os.listdir(dra.dev):
        os.unlink(os.path.join(dra.dev, name))
    dra.start()
    claim = dra.allocate("bare", "5e1f0000-0000-4000-8000-000000000062", ["gpu-5", "gpu-6"])
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000062"].error == ""
    spec = dra.spec_of("5e1f0000-0000-4000-8000-000000000062")
    assert [d["containerEdits"] for d in spec["devices"]] == [
        {"env": [f"GPUOPS_DEVICE_GPU_5={H100[5]}"]},
        {"env": [f"GPUOPS_DEVICE_GPU_6={H100[6]}"]},
    ]
    assert spec["containerEdits"] == {"env": [f"NVIDIA_VISIBLE_DEVICES={H100[5]},{H100[6]}"], "deviceNodes": []}


def test_prepare_eight_devices_and_the_mounts_strategy(dra, tmp_path):
    driver_root = tmp_path / "root"
    (driver_root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (driver_root / "usr/bin").mkdir(parents=True)
    for name in ("libnvidia-ml.so.1", "libcuda.so.1", "libunrelated.so.1"):
        (driver_root / "usr/lib/x86_64-linux-gnu" / name).write_text("")
    (driver_root / "usr/bin/nvidia-smi").write_text("")
    from gpu_device_plugin.config import MountsSettings

    dra.start(
        device_list_strategy=("envvar", "mounts"), mounts=MountsSettings(driver_root=str(driver_root), dev_root=dra.dev)
    )
    claim = dra.allocate("eight", "5e1f0000-0000-4000-8000-000000000038", ALL)
    answer = dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000038"]
    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == ALL
    assert [list(d.cdi_device_ids) for d in answer.devices] == [
        [f"gpuops.k8s/gpu=5e1f0000-0000-4000-8000-000000000038-{n}"] for n in ALL
    ]
    spec = dra.spec_of("5e1f0000-0000-4000-8000-000000000038")
    assert [d["containerEdits"]["deviceNodes"][0]["path"] for d in spec["devices"]] == [
        f"/dev/nvidia{i}" for i in range(8)
    ]
    common = spec["containerEdits"]
    assert common["env"] == [
        "NVIDIA_VISIBLE_DEVICES=" + ",".join(H100),
        "LD_LIBRARY_PATH=/usr/local/nvidia/lib64",
        "PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ]
    assert sorted((m["containerPath"], m["options"][0]) for m in common["mounts"]) == [
        ("/usr/local/nvidia/bin/nvidia-smi", "ro"),
        ("/usr/local/nvidia/lib64/libcuda.so.1", "ro"),
        ("/usr/local/nvidia/lib64/libnvidia-ml.so.1", "ro"),
    ]


def test_prepare_and_unprepare_are_idempotent_across_versions(dra):
    dra.start()
    claim = dra.allocate("twice", "5e1f0000-0000-4000-8000-000000000032", ["gpu-0", "gpu-1"])
    first = dra.kubelet.prepare(DRIVER, [claim], "v1")["5e1f0000-0000-4000-8000-000000000032"]
    second = dra.kubelet.prepare(DRIVER, [claim], "v1beta1")["5e1f0000-0000-4000-8000-000000000032"]
    assert [list(d.cdi_device_ids) for d in first.devices] == [list(d.cdi_device_ids) for d in second.devices]
    assert second.error == ""
    # Already prepared: answered from the checkpoint, even with the API server away.
    dra.claims.unreachable = True
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000032"].error == ""
    assert dra.kubelet.unprepare(DRIVER, [claim]) == {"5e1f0000-0000-4000-8000-000000000032": ""}
    assert dra.spec_of("5e1f0000-0000-4000-8000-000000000032") is None
    assert dra.kubelet.unprepare(DRIVER, [claim], "v1beta1") == {"5e1f0000-0000-4000-8000-000000000032": ""}
    assert dra.kubelet.unprepare(DRIVER, [("default", "never", "5e1f0000-0000-4000-8000-006e65766572")]) == {
        "5e1f0000-0000-4000-8000-006e65766572": ""
    }
    assert os.listdir(dra.cdi) == []
    with open(dra.checkpoint, encoding="utf-8") as handle:
        assert '"claims": {}' in handle.read()


def _setup_bad(dra):
    dra.allocate("holder", "5e1f0000-0000-4000-8000-000000000068", ["gpu-5"])
    dra.allocate("not-allocated", "5e1f0000-0000-4000-8000-00000000006e", [])
    dra.allocate("other-node", "5e1f0000-0000-4000-8000-00000000006f", ["gpu-1"], pool="node-b")
    dra.allocate("other-driver", "5e1f0000-0000-4000-8000-000000000064", ["gpu-1"], driver="gpu.example.com")
    dra.allocate("replaced", "5e1f0000-0000-4000-8000-0000006e6577", ["gpu-1"])
    dra.allocate("unknown", "5e1f0000-0000-4000-8000-000000000075", ["gpu-9"])
    dra.allocate("taken", "5e1f0000-0000-4000-8000-000000000074", ["gpu-5"])


@pytest.mark.parametrize(
    ("claim", "words"),
    [
        (
            ("default", "not-allocated", "5e1f0000-0000-4000-8000-00000000006e"),
            ["default/not-allocated", "not allocated"],
        ),
        (
            ("default", "other-node", "5e1f0000-0000-4000-8000-00000000006f"),
            ["pool(s) node-b", f"this node's pool {NODE}"],
        ),
        (
            ("default", "other-driver", "5e1f0000-0000-4000-8000-000000000064"),
            ["no device of driver gpu.gpuops.k8s", "gpu.example.com"],
        ),
        (
            ("default", "replaced", "5e1f0000-0000-4000-8000-0000006f6c64"),
            ["has UID 5e1f0000-0000-4000-8000-0000006e6577", "replaced"],
        ),
        (("default", "unknown", "5e1f0000-0000-4000-8000-000000000075"), ["gpu-9", "does not have"]),
        (
            ("default", "taken", "5e1f0000-0000-4000-8000-000000000074"),
            [
                "gpu-5",
                "default/holder (UID 5e1f0000-0000-4000-8000-000000000068)",
                "default/taken (UID 5e1f0000-0000-4000-8000-000000000074)",
            ],
        ),
        (("default", "missing", "5e1f0000-0000-4000-8000-00000000006d"), ["default/missing", "does not exist"]),
    ],
)
def test_bad_claims_get_a_per_claim_error_and_nothing_is_written(dra, claim, words):
    dra.start()
    _setup_bad(dra)
    assert (
        dra.kubelet.prepare(DRIVER, [("default", "holder", "5e1f0000-0000-4000-8000-000000000068")])[
            "5e1f0000-0000-4000-8000-000000000068"
        ].error
        == ""
    )
    good = dra.allocate("good", "5e1f0000-0000-4000-8000-000000000067", ["gpu-6"])
    answers = dra.kubelet.prepare(DRIVER, [claim, good])
    error = answers[claim[2]].error
    assert all(w in error for w in words), error
    assert not answers[claim[2]].devices
    assert answers["5e1f0000-0000-4000-8000-000000000067"].error == ""  # the other claim of the same call is prepared
    assert sorted(os.listdir(dra.cdi)) == [
        "gpuops.k8s-gpu_5e1f0000-0000-4000-8000-000000000067.json",
        "gpuops.k8s-gpu_5e1f0000-0000-4000-8000-000000000068.json",
    ]
    with open(dra.checkpoint, encoding="utf-8") as handle:
        assert claim[2] not in handle.read()


def test_an_unreachable_api_server_is_a_per_claim_error(dra):
    dra.start()
    claim = dra.allocate("later", "5e1f0000-0000-4000-8000-00000000006c", ["gpu-0"])
    dra.claims.unreachable = True
    error = dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-00000000006c"].error
    assert "cannot read ResourceClaim default/later from the API server" in error
    dra.claims.unreachable = False
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-00000000006c"].error == ""


def test_an_unwritable_cdi_dir_fails_the_claim_and_the_daemon_keeps_serving(dra):
    os.rmdir(dra.cdi)
    with open(dra.cdi, "w") as handle:  # a file where the directory should be: root cannot write there either
        handle.write("not a directory")
    dra.start()
    claim = dra.allocate("blocked", "5e1f0000-0000-4000-8000-000000000062", ["gpu-2"])
    error = dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000062"].error
    assert "cannot write the CDI spec" in error and dra.cdi in error
    assert not os.path.exists(dra.checkpoint)  # nothing was prepared, so nothing was checkpointed
    assert [n for n in os.listdir(dra.base) if n.startswith(".tmp")] == []
    os.unlink(dra.cdi)
    os.mkdir(dra.cdi)
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000062"].error == ""
    assert os.listdir(dra.cdi) == ["gpuops.k8s-gpu_5e1f0000-0000-4000-8000-000000000062.json"]


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_an_xid_reaches_the_health_stream_and_the_slice_publisher(dra, version):
    dra.start()
    watch = dra.kubelet.watch_health(DRIVER, version)
    assert watch.wait(lambda u: sorted(u) == ALL and {h for h, _m in u.values()} == {"HEALTHY"})
    assert watch.pools == {NODE}
    spec = fixture("h100x8.yaml")
    spec["gpus"][2]["xid"] = 79
    write_spec(dra.spec, spec)
    assert watch.wait(lambda u: u["gpu-2"][0] == "UNHEALTHY")
    last = watch.updates[-1]
    assert "XID 79" in last["gpu-2"][1] and H100[2] in last["gpu-2"][1]
    assert [n for n, (h, _m) in last.items() if h != "HEALTHY"] == ["gpu-2"]
    assert wait_until(lambda: dra.publisher.last() == (ALL, frozenset({"gpu-2"})))


def test_a_removed_registration_socket_is_served_again_and_registers_again(dra):
    dra.start()
    os.unlink(os.path.join(dra.registry, f"{DRIVER}-reg.sock"))
    assert dra.kubelet.wait(lambda: dra.kubelet.registered(DRIVER) == 2)
    os.unlink(os.path.join(dra.plugins, DRIVER, "dra.sock"))
    assert wait_until(lambda: os.path.exists(os.path.join(dra.plugins, DRIVER, "dra.sock")))
    claim = dra.allocate("after", "5e1f0000-0000-4000-8000-000000000061", ["gpu-0"])
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000061"].error == ""


def test_a_kubelet_restart_registers_the_plugin_again(dra):
    dra.start()
    claim = dra.allocate("kept", "5e1f0000-0000-4000-8000-00000000006b", ["gpu-4"])
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-00000000006b"].error == ""
    dra.kubelet.restart()
    assert dra.kubelet.wait(lambda: dra.kubelet.registered(DRIVER) == 2)
    assert dra.kubelet.unprepare(DRIVER, [claim]) == {"5e1f0000-0000-4000-8000-00000000006b": ""}


@pytest.mark.parametrize("uid", ["../../etc/cron.d/x", "uid-a", "5e1f0000-0000-4000-8000-00000000006"])
def test_a_claim_whose_uid_is_not_a_uuid_is_refused_and_names_no_file(dra, uid):
    """A claim's UID names its CDI spec (<cdi dir>/gpuops.k8s-gpu_<UID>.json): only a UUID, as Kubernetes gives
    every object, may; anything else is refused for that claim alone, and another claim of the call is prepared."""
    dra.start()
    bad = dra.allocate("odd", uid, ["gpu-1"])
    good = dra.allocate("fine", "5e1f0000-0000-4000-8000-0000000000aa", ["gpu-2"])
    answers = dra.kubelet.prepare(DRIVER, [bad, good])
    refused = f"ResourceClaim default/odd (UID {uid}) was refused: its UID {uid!r} is not a UUID"
    assert answers[uid].error == refused + ", and it would name a file."
    assert answers["5e1f0000-0000-4000-8000-0000000000aa"].error == ""
    assert os.listdir(dra.cdi) == ["gpuops.k8s-gpu_5e1f0000-0000-4000-8000-0000000000aa.json"]
    assert dra.kubelet.unprepare(DRIVER, [bad])[uid].startswith(f"ResourceClaim default/odd (UID {uid}) was refused")


def test_a_cdi_spec_is_durable_its_directory_is_flushed_after_the_rename(tmp_path, monkeypatch):
    from gpu_device_plugin.dra import cdi

    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}") and os.path.samefile(f"/proc/self/fd/{fd}", tmp_path))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    cdi.write_atomically(str(tmp_path / "spec.json"), "{}")
    assert synced == [False, True]


def test_mig_devices_are_prepared_by_their_names_and_by_the_names_earlier_versions_gave_them(dra):
    # gpu-0-mig-1 is what an earlier version published for the second MIG device: a claim the scheduler
    # allocated from that slice before the daemon was upgraded is still prepared on the same MIG device.
    write_spec(dra.spec, fixture("a100-mig.yaml"))
    dra.start()
    assert dra.publisher.calls[0][0] == [
        "gpu-0-mig-3g20gb-9-0",
        "gpu-0-mig-1g5gb-19-4",
        "gpu-0-mig-1g5gb-19-5",
        "gpu-1",
    ]
    old = dra.allocate("old", "5e1f0000-0000-4000-8000-000000000071", ["gpu-0-mig-1"])
    new = dra.allocate("new", "5e1f0000-0000-4000-8000-000000000072", ["gpu-0-mig-1g5gb-19-5"])
    answers = dra.kubelet.prepare(DRIVER, [old, new])
    assert {uid: (a.error, [d.device_name for d in a.devices]) for uid, a in answers.items()} == {
        old[2]: ("", ["gpu-0-mig-1"]),
        new[2]: ("", ["gpu-0-mig-1g5gb-19-5"]),
    }
    env = {uid: dra.spec_of(uid)["containerEdits"]["env"] for uid in (old[2], new[2])}
    assert env == {
        old[2]: ["NVIDIA_VISIBLE_DEVICES=MIG-0a5e1c00-0000-4000-8000-0000000000a2"],
        new[2]: ["NVIDIA_VISIBLE_DEVICES=MIG-0a5e1c00-0000-4000-8000-0000000000a3"],
    }
    # The same MIG device under its other name is already taken.
    again = dra.allocate("again", "5e1f0000-0000-4000-8000-000000000073", ["gpu-0-mig-1g5gb-19-4"])
    error = dra.kubelet.prepare(DRIVER, [again])[again[2]].error
    assert "is already prepared for ResourceClaim default/old" in error
