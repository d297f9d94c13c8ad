"""Unit tests of gpuops.k8s.gpu_faults.

The module runs through its real entry point with real module arguments. The daemon's health file is a real
file; the kernel log is a real file of journal export JSON printed by the real `cat`, or by `journalctl`, a
test double (a shell script of that name in tmp_path) that records its arguments. NVML is played by
NvmlTestDouble, as in the nvidia_gpu_info tests.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible_collections.gpuops.k8s.plugins.modules import gpu_faults
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.module_harness import fail_module, run_module
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.nvml_test_double import DoubleGpu, NvmlTestDouble

UUID0 = "GPU-6f1c0a3e-0000-4000-8000-000000000001"
UUID1 = "GPU-6f1c0a3e-0000-4000-8000-000000000002"
UUID2 = "GPU-6f1c0a3e-0000-4000-8000-000000000003"


def health_file(path, gpus, node="gpu-1"):
    data = {"version": 1, "node": node, "updated": "2026-11-26T08:00:00.000000Z", "gpus": gpus}
    path.write_text(json.dumps(data))
    return str(path)


def daemon_gpu(uuid, index, pci, healthy=True, name="none", xids=()):
    return {
        "uuid": uuid,
        "index": index,
        "pci": pci,
        "healthy": healthy,
        "class": name,
        "reason": "" if name == "none" else f"XID {xids[-1]['xid']}",
        "updated": "2026-11-26T08:00:00.000000Z",
        "xids": list(xids),
    }


def entry(n, message):
    return {"__CURSOR": f"s=test;i={n:x}", "__REALTIME_TIMESTAMP": str(1764144000000000 + n), "MESSAGE": message}


def journal(path, entries):
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return str(path)


KERNEL = [
    entry(1, "Linux version 6.1.0"),
    entry(2, "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"),
    entry(3, "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
    entry(4, "eth0: link up"),
]


@pytest.fixture
def args(tmp_path, patched, monkeypatch):
    monkeypatch.setattr(gpu_faults, "pynvml", None)
    state = tmp_path / "state"
    return {
        "health_file": str(tmp_path / "gpu-health.json"),
        "state_dir": str(state),
        "kernel_log_command": ["cat", journal(tmp_path / "kernel.json", KERNEL)],
    }


def test_no_daemon_and_a_quiet_kernel_log(args, tmp_path):
    args["kernel_log_command"] = ["cat", journal(tmp_path / "quiet.json", [entry(1, "nothing here")])]
    result = run_module(gpu_faults.main, args)
    assert result["changed"] is False
    assert result["gpus"] == [] and result["node_class"] == "none"
    assert result["health_file"] == {"path": args["health_file"], "present": False, "updated": None, "node": None}
    assert result["since"] is None and result["cursor"] == "s=test;i=1"


def test_the_daemons_view_alone(args, tmp_path):
    xid = {"xid": 48, "data": None, "time": "2026-11-26T07:59:00.000000Z", "class": "reset", "reason": "XID 48"}
    health_file(
        tmp_path / "gpu-health.json",
        [
            daemon_gpu(UUID1, 1, "0000:2a:00.0", healthy=False, name="reset", xids=[xid]),
            daemon_gpu(UUID0, 0, "0000:18:00.0"),
        ],
    )
    result = run_module(gpu_faults.main, dict(args, kernel_log=False))
    assert [(g["uuid"], g["class"], g["healthy"], g["source"]) for g in result["gpus"]] == [
        (UUID0, "none", True, "daemon"),
        (UUID1, "reset", False, "daemon"),
    ]
    assert result["gpus"][1]["xids"] == [dict(xid, source="daemon")]
    assert result["node_class"] == "reset"
    assert result["health_file"]["present"] is True and result["health_file"]["node"] == "gpu-1"


def test_kernel_xids_join_the_daemons_gpus_by_bus_and_the_higher_class_wins(args, tmp_path):
    health_file(
        tmp_path / "gpu-health.json",
        [daemon_gpu(UUID0, 0, "0000:18:00.0"), daemon_gpu(UUID1, 1, "0000:2a:00.0")],
    )
    result = run_module(gpu_faults.main, args)
    first, second = result["gpus"]
    # XID 13 is none: the GPU keeps the daemon's class, and the XID is listed.
    assert (first["uuid"], first["class"], first["source"]) == (UUID0, "none", "daemon")
    assert [(x["xid"], x["class"], x["source"]) for x in first["xids"]] == [(13, "none", "kernel")]
    assert first["xids"][0]["data"] == "Graphics SM Warp Exception"
    assert (second["uuid"], second["class"], second["source"]) == (UUID1, "reboot", "kernel")
    assert second["reason"] == "XID 79 (GPU has fallen off the bus): catalog RESTART_BM"
    assert second["xids"][0]["time"] == "2025-11-26T08:00:00.000003Z"
    assert result["node_class"] == "reboot"


def test_a_bus_the_health_file_does_not_know_is_named_by_nvml(args, monkeypatch):
    nvml = NvmlTestDouble(
        [DoubleGpu(uuid=UUID0, bus_id="00000000:18:00.0"), DoubleGpu(uuid=UUID1, bus_id="00000000:2A:00.0")]
    )
    monkeypatch.setattr(gpu_faults, "pynvml", nvml)
    result = run_module(gpu_faults.main, args)
    assert [(g["uuid"], g["index"], g["pci"], g["class"], g["healthy"]) for g in result["gpus"]] == [
        (UUID0, 0, "0000:18:00.0", "none", None),
        (UUID1, 1, "0000:2a:00.0", "reboot", None),
    ]
    # One NVML initialisation for the two lines, and one shutdown.
    assert (nvml.count("nvmlInit"), nvml.count("nvmlShutdown"), nvml.initialised) == (1, 1, 0)


def test_without_nvml_a_kernel_gpu_is_known_by_its_bus_only(args):
    result = run_module(gpu_faults.main, args)
    assert [(g["uuid"], g["index"], g["pci"]) for g in result["gpus"]] == [
        (None, None, "0000:18:00.0"),
        (None, None, "0000:2a:00.0"),
    ]


def test_overrides_apply_to_kernel_xids(args):
    result = run_module(gpu_faults.main, dict(args, classes={"13": "reset", 79: "replace"}))
    assert [g["class"] for g in result["gpus"]] == ["reset", "replace"]
    assert result["node_class"] == "replace"


def test_the_place_is_kept_only_when_asked_and_never_in_check_mode(args, tmp_path):
    cursor_file = tmp_path / "state" / "gpu-faults.cursor"
    looked = run_module(gpu_faults.main, args)
    assert looked["changed"] is False and not cursor_file.exists()
    checked = run_module(gpu_faults.main, dict(args, advance_cursor=True, _ansible_check_mode=True))
    assert checked["changed"] is True and not cursor_file.exists()
    moved = run_module(gpu_faults.main, dict(args, advance_cursor=True))
    assert moved["changed"] is True
    assert json.loads(cursor_file.read_text()) == {"cursor": "s=test;i=4", "time": "2025-11-26T08:00:00.000004Z"}
    # Nothing new: the kernel's XIDs are behind the place, and the place stays.
    again = run_module(gpu_faults.main, dict(args, advance_cursor=True))
    assert again["changed"] is False
    assert again["gpus"] == [] and again["since"] == "2025-11-26T08:00:00.000004Z"
    # A new XID after the place is found, alone.
    later = [*KERNEL, entry(5, "NVRM: Xid (PCI:0000:18:00): 119, pid=1, name=x, Timeout after 6s of waiting")]
    journal(tmp_path / "kernel.json", later)
    found = run_module(gpu_faults.main, args)
    assert [(g["pci"], [x["xid"] for x in g["xids"]], g["class"]) for g in found["gpus"]] == [
        ("0000:18:00.0", [119], "reset")
    ]


def test_a_kept_place_the_log_no_longer_holds_reads_everything(args, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "gpu-faults.cursor").write_text(json.dumps({"cursor": "s=gone;i=1", "time": "2025-01-01T00:00:00Z"}))
    result = run_module(gpu_faults.main, args)
    assert [g["class"] for g in result["gpus"]] == ["none", "reboot"]
    assert result["since"] == "2025-01-01T00:00:00Z"


def test_journalctl_is_asked_for_what_follows_the_place(args, tmp_path):
    # A journalctl test double: records its arguments, prints one entry.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "argv.json"
    out = journal(tmp_path / "after.json", [entry(9, "NVRM: Xid (PCI:0000:2a:00): 95, pid=1, name=x, Uncontained")])
    script = bindir / "journalctl"
    script.write_text(
        f'#!/bin/sh\npython3 -c \'import json, sys; json.dump(sys.argv[1:], open("{record}", "w"))\' "$@"\ncat {out}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    command = [str(script), "-k", "-o", "json", "--no-pager"]
    first = run_module(gpu_faults.main, dict(args, kernel_log_command=command, advance_cursor=True))
    assert json.loads(record.read_text()) == ["-k", "-o", "json", "--no-pager"]
    assert first["gpus"][0]["class"] == "reset"
    run_module(gpu_faults.main, dict(args, kernel_log_command=command))
    assert json.loads(record.read_text()) == ["-k", "-o", "json", "--no-pager", "--after-cursor=s=test;i=9"]


def test_a_message_journald_kept_as_bytes(args, tmp_path):
    raw = list(b"NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\xff")
    args["kernel_log_command"] = ["cat", journal(tmp_path / "bytes.json", [dict(entry(1, None), MESSAGE=raw)])]
    result = run_module(gpu_faults.main, args)
    assert result["gpus"][0]["class"] == "reboot"


def test_a_failing_kernel_log_command_is_one_sentence(args, tmp_path):
    missing = str(tmp_path / "nowhere.json")
    result = fail_module(gpu_faults.main, dict(args, kernel_log_command=["cat", missing]))
    assert result["msg"].startswith(f"the kernel log command cat {missing} failed with exit status 1: ")
    assert result["msg"].endswith(".") and "\n" not in result["msg"]


def test_bad_classes_are_one_sentence(args):
    result = fail_module(gpu_faults.main, dict(args, classes={"79": "explode"}))
    assert result["msg"] == (
        "classes: XID 79 maps to 'explode', which is not one of none, device, reset, reboot, replace."
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", "is not JSON."), ('{"gpus": 3}', "has no list of gpus.")],
)
def test_a_broken_health_file_is_one_sentence(args, tmp_path, text, message):
    (tmp_path / "gpu-health.json").write_text(text)
    result = fail_module(gpu_faults.main, args)
    assert result["msg"] == f"the GPU health file {args['health_file']} {message}"


def test_an_unreadable_state_dir_is_one_sentence(args, tmp_path):
    if os.geteuid() == 0:
        # root writes anywhere: a file where the directory should be stops it instead.
        (tmp_path / "state").write_text("")
    else:
        (tmp_path / "state").mkdir(mode=0o500)
    result = fail_module(gpu_faults.main, dict(args, advance_cursor=True))
    assert result["msg"].startswith(f"cannot keep the kernel log place in {args['state_dir']}: ")
