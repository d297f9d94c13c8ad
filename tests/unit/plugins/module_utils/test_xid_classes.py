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
def test_each_entry_follows_its_catalog_bucket_or_says_why_not(xid):
    name, bucket, what = xc.TABLE[xid]
    assert name in xc.CLASSES and what
    if not bucket or xid in (xc.RECOVERY_ACTION_XID,):
        # No bucket in the catalog (162-172), or one decoded from the text: the note says what the class rests on.
        assert xc.NOTES.get(xid)
        return
    if name != xc.BUCKET_CLASSES[bucket]:
        assert xc.NOTES.get(xid)


def test_the_catalogs_ignore_and_restart_app_rows_leave_the_gpu_in_service():
    # The catalog asks nothing of the GPU for them: the daemon ignores them, so a GPU is not taken out of
    # scheduling with no way back by default.
    for xid, (name, bucket, _what) in xc.TABLE.items():
        if bucket in ("IGNORE", "RESTART_APP"):
            assert name == "none", xid
    assert {63, 92, 94, 13, 31, 43, 68} <= xc.ignored_xids()
    assert not {48, 79, 109} & xc.ignored_xids()
    # An override moves an XID across the line, both ways.
    assert xc.ignored_xids({13: "device", 48: "none"}) == (xc.ignored_xids() - {13}) | {48}


@pytest.mark.parametrize(
    ("xid", "expected", "bucket"),
    [
        (79, "reboot", "RESTART_BM"),
        (48, "reset", "WORKFLOW_XID_48"),
        (63, "none", "IGNORE"),
        (92, "none", "IGNORE"),
        (64, "reset", "RESET_GPU"),
        (94, "none", "RESTART_APP"),
        (95, "reset", "RESET_GPU"),
        (119, "reset", "RESET_GPU"),
        (120, "reset", "RESET_GPU"),
        (54, "replace", "CHECK_MECHANICALS"),
        (13, "none", "RESTART_APP"),
        (109, "reset", "RESET_GPU"),
        (61, "replace", "CONTACT_SUPPORT"),
        (74, "reset", "WORKFLOW_NVLINK_ERR"),
        (150, "reset", "WORKFLOW_NVLINK5_ERR"),
    ],
)
def test_classify_names_the_catalog_bucket(xid, expected, bucket):
    name, reason = xc.classify(xid)
    assert name == expected
    assert reason.startswith(f"XID {xid} (") and f"catalog {bucket}" in reason


@pytest.mark.parametrize(
    ("xid", "expected"),
    [
        (162, "none"),
        (163, "none"),
        (164, "none"),
        (165, "none"),
        (166, "device"),
        (167, "reboot"),
        (168, "replace"),
        (169, "reset"),
        (170, "device"),
        (171, "reset"),
        (172, "reset"),
    ],
)
def test_the_xids_the_catalog_lists_without_a_bucket(xid, expected):
    name, reason = xc.classify(xid)
    assert name == expected
    assert "the catalog lists no bucket; " + expected + ": " + xc.NOTES[xid] in reason


def test_without_their_text_the_nvlink5_xids_are_classed_by_their_decode_rows():
    # Mixed rows (some RESET_GPU, most IGNORE): out of scheduling until the kernel line is decoded.
    for xid in (144, 145, 146, 149):
        name, reason = xc.classify(xid)
        assert name == "device" and "decoded from the kernel line" in reason
    # IGNORE in every row, RESET_GPU in every row.
    assert [xc.classify(xid)[0] for xid in (147, 148, 150)] == ["none", "none", "reset"]


NVLINK74 = "NVLink: fatal error detected on link 14({})"


@pytest.mark.parametrize(
    ("registers", "expected", "words"),
    [
        # Third register bit 16 (the catalog's example line): an error a reset clears.
        ("0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0", "reset", "a GPU reset clears"),
        # First register bits 4/5: ECC or parity.
        ("0x10, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "reset", "a GPU reset clears"),
        # First register bit 8: possibly hardware, check the link's mechanics.
        ("0x100, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "replace", "possible hardware fault"),
        # Third register bit 13: not expected in production.
        ("0x0, 0x0, 0x2000, 0x0, 0x0, 0x0, 0x0", "replace", "unexpected bit"),
        # A bit the catalog does not list.
        ("0x4, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "replace", "unexpected bit"),
        # First register bit 21 alone: a marginal signal; with an ECC bit, the ECC bit's resolution first.
        ("0x200000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "replace", "marginal signal"),
        ("0x200010, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "reset", "a GPU reset clears"),
        # Fourth register bit 18 alone: the fabric needs a reset; bits 16/17 alone: report it.
        ("0x0, 0x0, 0x0, 0x40000, 0x0, 0x0, 0x0", "reset", "fabric reset"),
        ("0x0, 0x0, 0x0, 0x10000, 0x0, 0x0, 0x0", "replace", "secondary error seen alone"),
        # First register bit 1 with an ECC bit: follow the ECC bit.
        ("0x12, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "reset", "a GPU reset clears"),
        # Only bits to ignore (first 0/23/30) and thresholds (fifth 20/23/26/29): continue.
        ("0x40800001, 0x0, 0x0, 0x0, 0x24900000, 0x0, 0x0", "none", "ignore or to continue on"),
        # The second, sixth and seventh registers are not read.
        ("0x0, 0xffffffff, 0x0, 0x0, 0x100000, 0xffffffff, 0x1", "none", "ignore or to continue on"),
    ],
)
def test_xid_74_is_decoded_from_its_registers(registers, expected, words):
    name, reason = xc.classify(74, NVLINK74.format(registers))
    assert name == expected
    assert reason.startswith("XID 74 (NVLink error) decoded: link 14: ") and words in reason


def test_xid_74_without_registers_is_the_catalogs_reset():
    assert xc.classify(74, "NVLink: fatal error detected on link 2")[0] == "reset"
    assert xc.classify(74, NVLINK74.format("0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0"))[0] == "reset"


@pytest.mark.parametrize(
    ("xid", "text", "expected", "bucket"),
    [
        (144, "SAW_MVB Fatal XC1 i0 Link 01 (0x00000021 0x00000002 0x0 0x0 0x0 0x0 0x0)", "reset", "RESET_GPU"),
        (144, "SAW_MVB Nonfatal XC0 i0 Link 01 (0x00000021 0x00000004 0x0 0x0 0x0 0x0 0x0)", "none", "IGNORE"),
        (145, "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000044 0x00000001 0x0 0x0 0x0)", "none", "XID_154_EVAL"),
        (145, "RLW_REMAP Fatal XC1 i0 Link 00 (0x00000044 0x00000080 0x0 0x0 0x0)", "reset", "RESET_GPU"),
        (145, "RLW_TAGSTATE Fatal XC1 i0 Link 07 (0x00000102 0x00100000 0x0 0x0 0x0)", "reset", "RESET_GPU"),
        (145, "RLW_CTRL Nonfatal XC0 i0 Link 07 (0x00000062 0x80000000 0x0 0x0 0x0)", "none", "IGNORE"),
        # RLW_RXPIPE: the catalog's action 2 (bit 10 of the interrupt info before R575, bit 7 from R575 on).
        (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 03 (0x000000c2 0x00000001 0x0 0x0 0x0)", "none", "IGNORE"),
        (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 03 (0x000004c2 0x00000001 0x0 0x0 0x0)", "reset", "RESET_GPU"),
        (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 03 (0x00000006 0x00000002 0x0 0x0 0x0)", "none", "IGNORE"),
        (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 03 (0x00000086 0x00000002 0x0 0x0 0x0)", "reset", "RESET_GPU"),
        (146, "TLW_RX_PIPE1 Fatal XC1 i0 Link 02 (0x0000000b 0x00000004 0x0 0x0 0x0)", "reset", "RESET_GPU"),
        (146, "TLW_TX Nonfatal XC0 i0 Link 02 (0x00000163 0x00000002 0x0 0x0 0x0)", "none", "IGNORE"),
        (147, "TREX Nonfatal XC0 i0 Link 00 (0x0000000e 0x00000001 0x0 0x0 0x0)", "none", "IGNORE"),
        (148, "NVLPW_CTRL Nonfatal XC0 i0 Link 00 (0x0000000f 0x80000000 0x0 0x0 0x0)", "none", "IGNORE"),
        (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 05 (0x00000011 0x00000000 0x0 0x0 0x0)", "reset", "RESET_GPU"),
        (149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 05 (0x00000013 0x00000002 0x0 0x0 0x0)", "none", "IGNORE"),
        (149, "NETIR_MFDE_EVENT Fatal XC0 i0 Link 05 (0x00000014 0x00000005 0x0 0x0 0x0)", "reset", "RESET_GPU"),
        (150, "MSE_WATCHDOG Fatal XC0 i0 Link -1 (0x00000000 0x00000000 0x0 0x0 0x0)", "reset", "RESET_GPU"),
    ],
)
def test_xids_144_to_150_are_decoded_from_unit_subcode_and_error_status(xid, text, expected, bucket):
    name, reason = xc.classify(xid, text)
    assert name == expected
    assert " decoded: " in reason and f"catalog {bucket}" in reason


def test_an_nvlink5_row_the_catalog_does_not_list_keeps_the_tables_class():
    assert xc.classify(145, "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000044 0x00000400 0x0)")[0] == "device"
    assert xc.classify(146, "SOMETHING_NEW Nonfatal XC0 i0 Link 00 (0x1 0x2)")[0] == "device"


def test_the_kernel_line_carries_the_text_the_decoders_read():
    line = (
        "NVRM: Xid (PCI:0000:9b:00): 145, pid='<unknown>', name=<unknown>, "
        "RLW_REMAP Fatal XC1 i0 Link 03 (0x00000044 0x00000040 0x00000000 0x00000000 0x00000000 0x0 0x0)"
    )
    found = xc.parse_kernel_line(line)
    assert xc.classify(found["xid"], found["data"])[0] == "reset"


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
