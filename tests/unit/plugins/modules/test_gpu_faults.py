"""Unit tests of gpuops.k8s.gpu_faults.

The module runs through its real entry point with real module arguments. The daemon's health file is a real
file; the kernel log is a real file of journal export JSON printed by the real `cat`, or a real journal read by the
real `journalctl -D DIR`: the journal files are written by systemd-journal-remote from export format (entries of
the kernel transport across several boots, as journald keeps them), so cursors, boots and matches are journald's
own. NVML is played by NvmlTestDouble, as in the nvidia_gpu_info tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

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
    assert result["gpus"][1]["xids"] == [
        {
            "xid": 48,
            "class": "reset",
            "reason": "XID 48",
            "source": "daemon",
            "count": 1,
            "first": xid["time"],
            "last": xid["time"],
            "samples": [{"time": xid["time"], "data": None}],
        }
    ]
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
    assert first["xids"][0]["samples"][0]["data"] == "Graphics SM Warp Exception"
    assert (second["uuid"], second["class"], second["source"]) == (UUID1, "reboot", "kernel")
    assert second["reason"] == "XID 79 (GPU has fallen off the bus): catalog RESTART_BM"
    assert second["xids"][0]["last"] == "2025-11-26T08:00:00.000003Z" and second["xids"][0]["count"] == 1
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
    # The XIDs were acted on by a reboot of the node: none is kept.
    moved = run_module(gpu_faults.main, dict(args, advance_cursor=True, acted_class="reboot"))
    assert moved["changed"] is True
    assert json.loads(cursor_file.read_text()) == {
        "cursor": "s=test;i=4",
        "time": "2025-11-26T08:00:00.000004Z",
        "pending": [],
    }
    # Nothing new: the kernel's XIDs are behind the place, and the place stays.
    again = run_module(gpu_faults.main, dict(args, advance_cursor=True, acted_class="reboot"))
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


def test_a_node_without_the_kernel_log_command_is_one_sentence(args, tmp_path):
    """Seen on a GPU machine with no journald: the default command is not there."""
    missing = str(tmp_path / "no-journalctl")
    result = fail_module(gpu_faults.main, dict(args, kernel_log_command=[missing, "_TRANSPORT=kernel"]))
    assert result["msg"] == (
        f"the kernel log command {missing} is not on this node: set kernel_log to false (gpu_remediation_kernel_log)"
        " to read the daemon's health file alone, or name the command that prints the kernel log as journal JSON in"
        " kernel_log_command."
    )
    result = fail_module(gpu_faults.main, dict(args, kernel_log_command=["gpuops-no-such-journalctl", "-k"]))
    assert result["msg"].startswith("the kernel log command gpuops-no-such-journalctl is not on this node: ")


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


# A real journal, written by systemd-journal-remote (Debian's systemd-journal-remote package, which
# scripts/bootstrap.sh installs) from export format into a directory that journalctl -D reads.
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
MACHINE = "5f0c6e1a2b3c4d5e8f90a1b2c3d4e5f6"


class Journal:
    """A journal directory with entries of the kernel transport, boot after boot, appended as a node logs them."""

    def __init__(self, directory):
        assert os.access(JOURNAL_REMOTE, os.X_OK), f"{JOURNAL_REMOTE} is missing: run make setup"
        self.directory = directory
        directory.mkdir()
        self.boot = None
        self.realtime = 1764144000000000
        self.monotonic = 0
        self.reboot()

    def reboot(self):
        self.boot = uuid.uuid4().hex
        self.monotonic = 1000000

    def log(self, *messages, transport="kernel"):
        text = ""
        for message in messages:
            self.realtime += 1000000
            self.monotonic += 1000000
            text += (
                f"__REALTIME_TIMESTAMP={self.realtime}\n__MONOTONIC_TIMESTAMP={self.monotonic}\n_BOOT_ID={self.boot}\n"
                f"_MACHINE_ID={MACHINE}\n_TRANSPORT={transport}\nSYSLOG_IDENTIFIER=kernel\nMESSAGE={message}\n\n"
            )
        subprocess.run(
            [JOURNAL_REMOTE, "-o", str(self.directory / "remote.journal"), "-"],
            input=text.encode(),
            check=True,
            capture_output=True,
        )

    def command(self, *extra):
        """The module's default command, reading this directory instead of the host's journal."""
        return ["journalctl", "-D", str(self.directory), *extra, "-o", "json", "--no-pager"]


XID79 = "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:18:00): 48, pid=<unknown>, name=<unknown>, An uncorrectable double bit error"
XID119 = "NVRM: Xid (PCI:0000:18:00): 119, pid=1, name=x, Timeout after 6s of waiting for RPC response"


@pytest.fixture
def node_journal(tmp_path):
    return Journal(tmp_path / "journal")


def test_the_default_command_reads_the_kernel_transport_not_the_current_boot():
    # No -k, which implies --boot=0 even after --after-cursor.
    assert "default: [journalctl, _TRANSPORT=kernel, -o, json, --no-pager]" in gpu_faults.DOCUMENTATION


@pytest.mark.parametrize("form", ["-k", "--dmesg", "_TRANSPORT=kernel"])
def test_an_xid_before_a_reboot_is_found_after_the_kept_place(args, node_journal, form):
    node_journal.log("Linux version 6.1.0", "eth0: link up")
    command = node_journal.command(form)
    kept = run_module(gpu_faults.main, dict(args, kernel_log_command=command, advance_cursor=True))
    assert kept["changed"] is True and kept["gpus"] == []
    # After the kept place: an XID 79, then the node reboots before any remediation ran.
    node_journal.log(XID79)
    node_journal.reboot()
    node_journal.log("Linux version 6.1.0", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module")
    found = run_module(gpu_faults.main, dict(args, kernel_log_command=command))
    assert [(g["pci"], g["class"]) for g in found["gpus"]] == [("0000:2a:00.0", "reboot")]
    assert found["kernel_log"] == {"entries": 3, "complete": True, "kept": 0, "notes": []}


def test_without_a_kept_place_the_previous_boot_is_read_too(args, node_journal):
    node_journal.log("Linux version 6.1.0", XID48)
    node_journal.reboot()
    node_journal.log("Linux version 6.1.0", XID119)
    node_journal.log("a user's line", transport="stdout")
    result = run_module(gpu_faults.main, dict(args, kernel_log_command=node_journal.command("-k")))
    assert [(g["pci"], [x["xid"] for x in g["xids"]]) for g in result["gpus"]] == [("0000:18:00.0", [48, 119])]
    assert result["since"] is None and result["kernel_log"]["entries"] == 4
    # Boots before the previous one are not read: a fault that old was followed by a reboot after it.
    node_journal.reboot()
    node_journal.log("Linux version 6.1.0")
    result = run_module(gpu_faults.main, dict(args, kernel_log_command=node_journal.command()))
    assert [x["xid"] for x in result["gpus"][0]["xids"]] == [119]


def test_a_cursor_journalctl_refuses_is_read_from_its_time_and_replaced(args, node_journal, tmp_path):
    node_journal.log("Linux version 6.1.0", XID48)
    state = tmp_path / "state"
    state.mkdir()
    # A place in the middle of the log: entry 2's time. Its cursor is one journalctl refuses.
    kept_time = gpu_faults.iso_from_microseconds(1764144000000000 + 2000000 - 1)
    (state / "gpu-faults.cursor").write_text(json.dumps({"cursor": "garbage", "time": kept_time}))
    result = run_module(gpu_faults.main, dict(args, kernel_log_command=node_journal.command()))
    assert [(g["pci"], g["class"]) for g in result["gpus"]] == [("0000:18:00.0", "reset")]
    (note,) = result["kernel_log"]["notes"]
    assert note.startswith("journalctl refused the kept place (the kernel log command journalctl -D ")
    assert note.endswith(f"so the kernel log was read from the kept place's time, {kept_time}")
    # Moving on (once the reset was done) writes a place journalctl takes; the next run reads after it, no note.
    run_module(
        gpu_faults.main,
        dict(args, kernel_log_command=node_journal.command(), advance_cursor=True, acted_class="reset"),
    )
    assert json.loads((state / "gpu-faults.cursor").read_text())["cursor"].startswith("s=")
    again = run_module(gpu_faults.main, dict(args, kernel_log_command=node_journal.command()))
    assert again["kernel_log"]["notes"] == [] and again["gpus"] == []


def test_moving_on_keeps_the_xids_the_action_did_not_cover(args, node_journal, tmp_path):
    # The plan: GPU 0000:18:00 asks for a reset.
    node_journal.log("Linux version 6.1.0", XID48)
    command = node_journal.command()
    plan = run_module(gpu_faults.main, dict(args, kernel_log_command=command))
    assert plan["node_class"] == "reset"
    # While it is reset: the same GPU's XID again, and an XID 79 on another GPU (0000:2a:00).
    node_journal.log(XID48, XID79)
    moved = run_module(
        gpu_faults.main,
        dict(args, kernel_log_command=command, advance_cursor=True, acted_class="reset", acted_gpus=["0000:18:00.0"]),
    )
    assert moved["changed"] is True and moved["kernel_log"]["kept"] == 1
    # Every later run still sees the XID 79, until a run acts on it; the reset GPU's XIDs are handled.
    later = run_module(gpu_faults.main, dict(args, kernel_log_command=command))
    assert [(g["pci"], g["class"], [(x["xid"], x["count"]) for x in g["xids"]]) for g in later["gpus"]] == [
        ("0000:2a:00.0", "reboot", [(79, 1)])
    ]
    assert later["kernel_log"]["entries"] == 0 and later["node_class"] == "reboot"
    # Moving on again without acting on it keeps it; nothing changes on a second run.
    again = run_module(gpu_faults.main, dict(args, kernel_log_command=command, advance_cursor=True))
    assert again["changed"] is False and again["node_class"] == "reboot"
    # The reboot acts on every GPU: nothing is kept.
    rebooted = run_module(
        gpu_faults.main, dict(args, kernel_log_command=command, advance_cursor=True, acted_class="reboot")
    )
    assert rebooted["changed"] is True and rebooted["kernel_log"]["kept"] == 0
    assert run_module(gpu_faults.main, dict(args, kernel_log_command=command))["gpus"] == []


def test_a_reset_does_not_cover_a_worse_class_on_its_own_gpu(args, tmp_path):
    worse = "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."
    args["kernel_log_command"] = ["cat", journal(tmp_path / "k.json", [entry(1, XID48), entry(2, worse)])]
    moved = run_module(
        gpu_faults.main, dict(args, advance_cursor=True, acted_class="reset", acted_gpus=["0000:18:00.0"])
    )
    assert moved["kernel_log"]["kept"] == 1
    # The XID 48 was handled by the reset; the XID 79 on the same GPU asks for more, and stays.
    (gpu,) = run_module(gpu_faults.main, args)["gpus"]
    assert gpu["class"] == "reboot" and [x["xid"] for x in gpu["xids"]] == [79]


def test_a_storm_of_xid_lines_gives_a_bounded_result_and_keeps_the_worst(args, tmp_path):
    lines = []
    for n in range(1, 100001):
        bus = 0x10 + n % 8
        lines.append(
            entry(n, f"NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid={n}, name=python3, Graphics SM Warp Exception")
        )
    lines[50000] = entry(50001, "NVRM: Xid (PCI:0000:13:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off")
    args["kernel_log_command"] = ["cat", journal(tmp_path / "storm.json", lines)]
    result = run_module(gpu_faults.main, args)
    assert len(json.dumps(result)) < 20000
    assert len(result["gpus"]) == 8 and result["node_class"] == "reboot"
    counts = dict(((g["pci"], x["xid"]), x["count"]) for g in result["gpus"] for x in g["xids"])
    assert sum(counts.values()) == 100000 and counts[("0000:13:00.0", 79)] == 1
    worst = next(g for g in result["gpus"] if g["pci"] == "0000:13:00.0")
    assert worst["class"] == "reboot" and worst["reason"].startswith("XID 79 ")
    row = next(x for x in worst["xids"] if x["xid"] == 13)
    assert row["count"] == 12500 and len(row["samples"]) == 3
    assert row["first"] < row["last"] and row["samples"][-1]["time"] == row["last"]


def test_journalctl_is_read_in_pages_and_a_long_backlog_over_runs(args, node_journal, monkeypatch):
    monkeypatch.setattr(gpu_faults, "PAGE_ENTRIES", 2)
    node_journal.log("Linux version 6.1.0", XID48, "eth0: link up", XID79, "usb 1-1: new device")
    command = node_journal.command()
    everything = run_module(gpu_faults.main, dict(args, kernel_log_command=command))
    assert everything["kernel_log"]["entries"] == 5 and everything["node_class"] == "reboot"
    # At most three entries a run, in pages of two: the first run stops after the page of the XID 79, says so ...
    first = run_module(
        gpu_faults.main, dict(args, kernel_log_command=command, kernel_log_max_entries=3, advance_cursor=True)
    )
    assert first["kernel_log"]["complete"] is False and first["kernel_log"]["entries"] == 4
    assert "the next one goes on from there" in first["kernel_log"]["notes"][0]
    # ... and keeps its XIDs 48 and 79, which no run acted on; the next run reads the rest.
    second = run_module(gpu_faults.main, dict(args, kernel_log_command=command, kernel_log_max_entries=3))
    assert second["kernel_log"] == {"entries": 1, "complete": True, "kept": 2, "notes": []}
    assert [g["class"] for g in second["gpus"]] == ["reset", "reboot"]


def test_a_damaged_place_is_read_as_none_and_said(args, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "gpu-faults.cursor").write_text("{not json")
    result = run_module(gpu_faults.main, args)
    assert [g["class"] for g in result["gpus"]] == ["none", "reboot"]
    place = state / "gpu-faults.cursor"
    assert result["kernel_log"]["notes"] == [
        f"the kept place {place} could not be read, so the kernel log was read as if none was kept"
    ]


def test_a_notice_tells_the_daemon_what_an_action_cleared_and_is_never_written_in_check_mode(args, tmp_path):
    notices = tmp_path / "gpu-health.json.cleared"
    boot = tmp_path / "boot_id"
    boot.write_text("6c7c6013a8674f2f9f2d8e7c1a1c1e1a\n")
    reset = dict(args, kernel_log=False, acted_class="reset", acted_gpus=[UUID1, UUID1], clear_daemon_faults="now")
    checked = run_module(gpu_faults.main, dict(reset, _ansible_check_mode=True))
    assert checked["changed"] is True and checked["cleared"]["gpus"] == [UUID1]
    assert not notices.exists()
    done = run_module(gpu_faults.main, reset)
    assert done["changed"] is True
    assert done["cleared"]["class"] == "reset" and done["cleared"]["time"].endswith("Z")
    assert json.loads(notices.read_text()) == {"version": 1, "notices": [done["cleared"]]}
    # A reboot's notice names the boot it leaves; the newest 8 notices are kept.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu_faults, "BOOT_ID_FILE", str(boot))
        for _attempt in range(8):
            rebooting = run_module(
                gpu_faults.main, dict(args, kernel_log=False, acted_class="reboot", clear_daemon_faults="after_reboot")
            )
    assert rebooting["cleared"] == {"class": "reboot", "gpus": [], "boot": "6c7c6013a8674f2f9f2d8e7c1a1c1e1a"}
    kept = json.loads(notices.read_text())["notices"]
    assert len(kept) == 8 and kept == [rebooting["cleared"]] * 8
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".gpu-faults-")] == []


def test_a_notice_needs_the_class_of_the_action_and_a_boot_id(args, tmp_path):
    result = fail_module(gpu_faults.main, dict(args, kernel_log=False, clear_daemon_faults="now"))
    assert result["msg"] == "clear_daemon_faults needs acted_class, the class of the action that cleared the faults."
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu_faults, "BOOT_ID_FILE", str(tmp_path / "no-boot-id"))
        result = fail_module(
            gpu_faults.main, dict(args, kernel_log=False, acted_class="reboot", clear_daemon_faults="after_reboot")
        )
    assert result["msg"] == f"cannot read the boot ID from {tmp_path / 'no-boot-id'}: No such file or directory."
    assert not (tmp_path / "gpu-health.json.cleared").exists()
