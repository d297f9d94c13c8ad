"""Unit tests of the XID classes (module_utils/_xid_classes.py): the table against its rule, classify with its
data and overrides, and the kernel log line parser on the line shapes the NVIDIA driver writes."""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils import _xid_classes as xc


def test_classes_are_ordered_by_severity():
    assert xc.CLASSES == ("none", "device", "reset", "reboot", "replace")
    assert [xc.rank(name) for name in xc.CLASSES] == [0, 1, 2, 3, 4]
    assert xc.highest(["device", "replace", "reset"]) == "replace"
    assert xc.highest([]) == "none"
    assert xc.highest([], floor="device") == "device"


@pytest.mark.parametrize("xid", sorted(xc.TABLE))
def test_each_entry_follows_its_catalog_bucket_or_the_daemons_line(xid):
    name, bucket, what = xc.TABLE[xid]
    assert name in xc.CLASSES and what
    if xid == xc.RECOVERY_ACTION_XID:
        assert bucket == "XID_154"
        return
    from_bucket = xc.BUCKET_CLASSES[bucket]
    if xid in xc.DAEMON_IGNORED:
        assert name == "none"
    elif from_bucket == "none":
        # The daemon takes the GPU out of scheduling for every XID it does not ignore.
        assert name == "device"
    else:
        assert name == from_bucket


def test_the_none_class_is_exactly_what_the_daemon_ignores():
    assert xc.ignored_xids() == xc.DAEMON_IGNORED == frozenset({13, 31, 43, 45, 68, 109})
    # An override moves an XID across the line, both ways.
    assert xc.ignored_xids({13: "device", 63: "none"}) == frozenset({31, 43, 45, 68, 109, 63})


@pytest.mark.parametrize(
    ("xid", "expected", "bucket"),
    [
        (79, "reboot", "RESTART_BM"),
        (48, "reset", "WORKFLOW_XID_48"),
        (63, "device", "IGNORE"),
        (64, "reset", "RESET_GPU"),
        (94, "device", "RESTART_APP"),
        (95, "reset", "RESET_GPU"),
        (119, "reset", "RESET_GPU"),
        (120, "reset", "RESET_GPU"),
        (54, "replace", "CHECK_MECHANICALS"),
        (13, "none", "RESTART_APP"),
        (109, "none", "RESET_GPU"),
    ],
)
def test_classify_names_the_catalog_bucket(xid, expected, bucket):
    name, reason = xc.classify(xid)
    assert name == expected
    assert reason.startswith(f"XID {xid} (") and f"catalog {bucket}" in reason


def test_classify_says_where_it_follows_the_daemon_instead_of_the_bucket():
    assert xc.classify(109)[1].endswith("none as the daemon ignores it")
    assert xc.classify(63)[1].endswith("device as the daemon takes the GPU out of scheduling for it")
    assert "as the daemon" not in xc.classify(79)[1]


def test_an_unknown_xid_gets_the_documented_default():
    assert xc.DEFAULT_CLASS == "device"
    name, reason = xc.classify(999)
    assert name == "device"
    assert reason == "XID 999 is not in the catalog table: the default class device"


@pytest.mark.parametrize(
    ("text", "expected", "label"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "reset", "GPU reset"),
        ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 (Node Reboot Required)", "reboot", None),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "device", "drain P2P"),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "reset", "drain P2P and reset"),
        ("GPU recovery action changed from 0x4 (Drain and Reset) to 0x0 (None)", "none", None),
        ("GPU recovery action changed from 0x0 (None) to 0x7 (System Reboot)", "reboot", "system reboot"),
    ],
)
def test_xid_154_is_decoded_from_its_new_recovery_action(text, expected, label):
    name, reason = xc.classify(154, text)
    assert name == expected
    assert reason.startswith("XID 154: the driver's recovery action is now ")
    if label:
        assert label in reason


def test_xid_154_without_its_text_or_with_an_unknown_action():
    assert xc.classify(154) == ("device", "XID 154 without its recovery action: device")
    name, reason = xc.classify(154, "GPU recovery action changed from 0x0 (None) to 0x2a (Future)")
    assert name == "device" and "unknown action 0x2a" in reason


def test_overrides_win_over_the_table_and_the_decoding():
    overrides = xc.parse_overrides({"63": "reset", 154: "replace", 999: "none"})
    assert overrides == {63: "reset", 154: "replace", 999: "none"}
    assert xc.classify(63, overrides=overrides) == ("reset", "XID 63 is reset by the inventory's override")
    assert xc.classify(154, "to 0x0 (None)", overrides)[0] == "replace"
    assert xc.classify(999, overrides=overrides)[0] == "none"
    assert xc.classify(79, overrides=overrides)[0] == "reboot"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"abc": "reset"}, "xidClasses: 'abc' is not an XID (a positive integer)."),
        ({0: "reset"}, "xidClasses: 0 is not an XID (a positive integer)."),
        ({True: "reset"}, "xidClasses: True is not an XID (a positive integer)."),
        (
            {79: "rebooot"},
            "xidClasses: XID 79 maps to 'rebooot', which is not one of none, device, reset, reboot, replace.",
        ),
        (["79"], "xidClasses must be a mapping of XID to class, not list."),
    ],
)
def test_bad_overrides_are_one_sentence(raw, message):
    with pytest.raises(ValueError) as error:
        xc.parse_overrides(raw, "xidClasses")
    assert str(error.value) == message


def test_no_overrides():
    assert xc.parse_overrides(None) == {}
    assert xc.parse_overrides({}) == {}


# What the driver writes, as journald keeps it (MESSAGE) and as dmesg prints it (with the timestamp).
@pytest.mark.parametrize(
    ("line", "pci", "xid", "data", "pid", "process"),
    [
        (
            "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
            "reset gpu to activate.",
            "0000:10:1c.0",
            63,
            "Row Remapper: New row marked for remapping, reset gpu to activate.",
            1896,
            None,
        ),
        (
            "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            "0000:91:00.0",
            79,
            "GPU has fallen off the bus.",
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
            "0000:2b:00.0",
            79,
            "GPU has fallen off the bus.",
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 31, pid=12345, name=python3, Ch 00000008, intr 10000000. "
            "MMU Fault: ENGINE GRAPHICS",
            "0000:3b:00.0",
            31,
            "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS",
            12345,
            "python3",
        ),
        (
            "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, "
            "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
            "0009:01:00.0",
            154,
            "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
            None,
            None,
        ),
        (
            "NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff",
            "0000:01:00.0",
            3,
            "C 00000005 SC 00000007 M 00001ffc Data ffffffff",
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:00000000:18:00.1): 48, pid=<unknown>, name=<unknown>, An uncorrectable double bit error",
            "0000:18:00.1",
            48,
            "An uncorrectable double bit error",
            None,
            None,
        ),
        ("NVRM: Xid (PCI:0000:18:00): 119, ", "0000:18:00.0", 119, "", None, None),
        ("NVRM: Xid (PCI:0000:18:00): 120", "0000:18:00.0", 120, "", None, None),
    ],
)
def test_kernel_lines(line, pci, xid, data, pid, process):
    assert xc.parse_kernel_line(line) == {"pci": pci, "xid": xid, "data": data, "pid": pid, "process": process}


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
        "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
        "NVRM: Xid (PCI:0000:18:00): not-a-number, text",
        "",
        None,
    ],
)
def test_other_kernel_lines_are_not_xids(line):
    assert xc.parse_kernel_line(line) is None
