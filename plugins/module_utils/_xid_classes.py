# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""XID classes: what a GPU's XID asks of the node, in the five steps the remediation acts on.

The one table of XID -> class. The gpu_faults module (kernel log lines) and the bundled daemon (NVML
events; its package carries this file as gpu_device_plugin/_shared/xid_classes.py, docs/architecture.md)
both classify here, so the module imports nothing from Ansible and nothing beyond the standard library.

Classes, by severity:
  none     nothing to do for the GPU (the application restarts, or the event is informational)
  device   take the GPU out of scheduling (the daemon does this for every XID above none)
  reset    reset the GPU once nothing uses it
  reboot   drain the node and reboot it
  replace  cordon and taint the node and leave it for a person

Sources: NVIDIA's XID catalog for Ampere and newer GPUs ("Analyzing Xid Errors with the Xid Catalog",
docs.nvidia.com/deploy/xid-errors), its "Resolution Bucket (Immediate Action)" column, which each entry
names. A bucket becomes a class by BUCKET_CLASSES. Where the catalog decodes an XID from the driver's text,
so does classify(): XID 154 by its new recovery action, XID 74 by its NVLink error registers, XIDs 144-150
by their NVLink unit, subcode and error status (the catalog's "Xid 144-150 Decode" sheet). The table's
class is what an XID gets without that text (NVML gives the daemon the number only); where it differs from
the bucket, NOTES says why. XIDs 162-172 have no bucket in the catalog; NOTES says what each class rests on.
An XID the table does not hold is DEFAULT_CLASS.
"""

import re

CLASSES = ("none", "device", "reset", "reboot", "replace")
DEFAULT_CLASS = "device"
RECOVERY_ACTION_XID = 154

# Catalog bucket (immediate action) -> class. RESTART_APP and IGNORE leave the GPU in service: the catalog asks
# for nothing beyond restarting the application. WORKFLOW_NVLINK5_ERR is the most severe of its decode rows.
BUCKET_CLASSES = {
    "IGNORE": "none",
    "RESTART_APP": "none",
    "WORKFLOW_XID_45": "none",
    "CHECK_UVM": "device",
    "UPDATE_SWFW": "device",
    "RESET_GPU": "reset",
    "WORKFLOW_XID_48": "reset",
    "WORKFLOW_NVLINK_ERR": "reset",
    "WORKFLOW_NVLINK5_ERR": "reset",
    "RESTART_BM": "reboot",
    "RESTART_VM": "reboot",
    "CONTACT_SUPPORT": "replace",
    "CHECK_MECHANICALS": "replace",
}

# XID -> (class, catalog bucket, what it is). The class column is BUCKET_CLASSES[bucket] except for the XIDs
# of NOTES, which say why (tests/unit/plugins/module_utils/test_xid_classes.py holds the table to that rule).
# An empty bucket: the catalog lists the XID without one.
TABLE = {
    8: ("none", "RESTART_APP", "GPU stopped processing (idle timeout)"),
    11: ("none", "RESTART_APP", "invalid or corrupted push buffer stream"),
    13: ("none", "RESTART_APP", "graphics engine exception"),
    14: ("none", "IGNORE", "fake or injected error"),
    25: ("none", "RESTART_APP", "invalid or illegal push buffer stream"),
    31: ("none", "RESTART_APP", "GPU memory page fault"),
    32: ("none", "RESTART_APP", "invalid or corrupted push buffer stream (PBDMA)"),
    37: ("none", "IGNORE", "driver firmware error (unimplemented method)"),
    38: ("none", "IGNORE", "driver firmware error (watchdog timeout)"),
    39: ("none", "RESTART_APP", "copy engine 0 exception"),
    40: ("none", "RESTART_APP", "copy engine 1 exception"),
    41: ("none", "RESTART_APP", "copy engine 2 exception"),
    43: ("none", "IGNORE", "GPU stopped processing (reset channel)"),
    44: ("none", "IGNORE", "graphics engine fault during context switch"),
    45: ("none", "WORKFLOW_XID_45", "preemptive cleanup after earlier errors"),
    46: ("reset", "RESET_GPU", "GPU stopped processing (GPU timeout)"),
    48: ("reset", "WORKFLOW_XID_48", "double bit ECC error"),
    54: ("replace", "CHECK_MECHANICALS", "auxiliary power not connected"),
    60: ("none", "RESTART_APP", "video processor (SEC2) exception"),
    61: ("replace", "CONTACT_SUPPORT", "internal micro-controller breakpoint, listed as unused"),
    62: ("reset", "RESET_GPU", "internal micro-controller halt"),
    63: ("none", "IGNORE", "GPU memory row remapping event"),
    64: ("reset", "RESET_GPU", "GPU memory row remapping failure"),
    66: ("none", "IGNORE", "illegal access by driver (register access)"),
    67: ("none", "IGNORE", "illegal access by driver (verification)"),
    68: ("none", "RESTART_APP", "video decoder (NVDEC0) exception"),
    69: ("none", "RESTART_APP", "graphics engine class error"),
    70: ("none", "RESTART_APP", "copy engine 3 error"),
    71: ("none", "RESTART_APP", "copy engine 4 error"),
    72: ("none", "RESTART_APP", "copy engine 5 error"),
    74: ("reset", "WORKFLOW_NVLINK_ERR", "NVLink error"),
    75: ("none", "RESTART_APP", "copy engine 6 error"),
    76: ("none", "RESTART_APP", "copy engine 7 error"),
    77: ("none", "RESTART_APP", "copy engine 8 error"),
    78: ("device", "UPDATE_SWFW", "vGPU start error"),
    79: ("reboot", "RESTART_BM", "GPU has fallen off the bus"),
    80: ("none", "RESTART_APP", "corrupted data sent to the GPU"),
    82: ("none", "RESTART_APP", "JPEG decoder (NVJPG0) error"),
    83: ("none", "RESTART_APP", "video decoder (NVDEC1) error"),
    84: ("none", "RESTART_APP", "video decoder (NVDEC2) error"),
    85: ("none", "RESTART_APP", "copy engine 9 error"),
    86: ("none", "RESTART_APP", "optical flow accelerator (OFA) exception"),
    88: ("none", "RESTART_APP", "video decoder (NVDEC3) error"),
    89: ("none", "RESTART_APP", "video decoder (NVDEC4) error"),
    92: ("none", "IGNORE", "high single-bit ECC error rate"),
    93: ("none", "IGNORE", "InfoROM wear limit exceeded (non-fatal)"),
    94: ("none", "RESTART_APP", "contained memory (ECC) error"),
    95: ("reset", "RESET_GPU", "uncontained memory (ECC) error"),
    96: ("none", "RESTART_APP", "video decoder (NVDEC5) error"),
    97: ("none", "RESTART_APP", "video decoder (NVDEC6) error"),
    98: ("none", "RESTART_APP", "video decoder (NVDEC7) error"),
    99: ("none", "RESTART_APP", "JPEG decoder (NVJPG1) error"),
    100: ("none", "RESTART_APP", "JPEG decoder (NVJPG2) error"),
    101: ("none", "RESTART_APP", "JPEG decoder (NVJPG3) error"),
    102: ("none", "RESTART_APP", "JPEG decoder (NVJPG4) error"),
    103: ("none", "RESTART_APP", "JPEG decoder (NVJPG5) error"),
    104: ("none", "RESTART_APP", "JPEG decoder (NVJPG6) error"),
    105: ("none", "RESTART_APP", "JPEG decoder (NVJPG7) error"),
    106: ("none", "IGNORE", "SMBPBI test message"),
    107: ("none", "IGNORE", "SMBPBI test message (silent)"),
    108: ("none", "IGNORE", "NVLink remote translation error"),
    109: ("reset", "RESET_GPU", "context switch timeout"),
    110: ("reset", "RESET_GPU", "security fault"),
    119: ("reset", "RESET_GPU", "GSP RPC timeout"),
    120: ("reset", "RESET_GPU", "GSP error"),
    121: ("none", "IGNORE", "C2C link error"),
    126: ("none", "RESTART_APP", "copy engine 10 error"),
    127: ("none", "RESTART_APP", "copy engine 11 error"),
    128: ("none", "RESTART_APP", "copy engine 12 error"),
    129: ("none", "RESTART_APP", "copy engine 13 error"),
    130: ("none", "RESTART_APP", "copy engine 14 error"),
    131: ("none", "RESTART_APP", "copy engine 15 error"),
    132: ("none", "RESTART_APP", "copy engine 16 error"),
    133: ("none", "RESTART_APP", "copy engine 17 error"),
    134: ("none", "RESTART_APP", "copy engine 18 error"),
    135: ("none", "RESTART_APP", "copy engine 19 error"),
    136: ("reset", "RESET_GPU", "NVLink training failed"),
    137: ("none", "IGNORE", "NVLink privilege error"),
    139: ("none", "RESTART_APP", "optical flow accelerator (OFA1) error"),
    140: ("reset", "RESET_GPU", "unrecovered ECC error"),
    141: ("none", "IGNORE", "CUDA fast path error"),
    142: ("replace", "CONTACT_SUPPORT", "video encoder (NVENC3) error"),
    143: ("reset", "RESET_GPU", "GPU initialisation error"),
    144: ("device", "WORKFLOW_NVLINK5_ERR", "NVLink SAW error"),
    145: ("device", "WORKFLOW_NVLINK5_ERR", "NVLink RLW error"),
    146: ("device", "WORKFLOW_NVLINK5_ERR", "NVLink TLW error"),
    147: ("none", "WORKFLOW_NVLINK5_ERR", "NVLink TREX error"),
    148: ("none", "WORKFLOW_NVLINK5_ERR", "NVLink NVLPW control error"),
    149: ("device", "WORKFLOW_NVLINK5_ERR", "NVLink NETIR error"),
    150: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLink MSE error"),
    151: ("reboot", "RESTART_VM", "key rotation error"),
    152: ("none", "IGNORE", "DLA SMMU error"),
    153: ("none", "IGNORE", "DLA timeout"),
    154: ("device", "XID_154", "GPU recovery action changed"),
    155: ("reset", "RESET_GPU", "NVLink software-defined error"),
    156: ("reset", "RESET_GPU", "resource retirement event"),
    157: ("none", "IGNORE", "resource retirement failure"),
    158: ("reset", "RESET_GPU", "GPU fatal timeout"),
    159: ("device", "CHECK_UVM", "CHI non-data error"),
    160: ("none", "IGNORE", "channel retirement event"),
    161: ("none", "IGNORE", "channel retirement failure"),
    162: ("none", "", "power smoothing circuitry engaged again"),
    163: ("none", "", "power smoothing circuitry disengaged"),
    164: ("none", "", "power smoothing circuitry low lifetime"),
    165: ("none", "", "power smoothing circuitry lifetime exhausted"),
    166: ("device", "", "confidential computing traffic before the link was set up"),
    167: ("reboot", "", "PCIe fatal timeout"),
    168: ("replace", "", "reduced GPU memory capacity (errors in the write-protected region)"),
    169: ("reset", "", "SEC2 micro-controller halt"),
    170: ("device", "", "confidential computing interrupt"),
    171: ("reset", "", "uncorrectable DRAM error"),
    172: ("reset", "", "uncorrectable SRAM error"),
}

# Why an XID's class is not its bucket's, or what it rests on where the catalog gives no bucket.
NOTES = {
    144: "decoded from the kernel line; without it (NVML) device, as some rows reset and most ignore",
    145: "decoded from the kernel line; without it (NVML) device, as some rows reset and most ignore",
    146: "decoded from the kernel line; without it (NVML) device, as some rows reset and most ignore",
    147: "IGNORE in every decode row",
    148: "IGNORE in every decode row",
    149: "decoded from the kernel line; without it (NVML) device, as some rows reset and some ignore",
    154: "decoded from its text or NVML's recovery action; without either device",
    162: "power smoothing news, the GPU keeps working",
    163: "power smoothing news, the GPU keeps working",
    164: "power smoothing news, the GPU keeps working",
    165: "power smoothing off from now on, the GPU keeps working",
    166: "confidential computing mode only, an effect the catalog does not state",
    167: "the GPU is unreachable over PCIe, as for XID 79",
    168: "ECC must be turned on or the boot changed, which is a person's call",
    169: "a micro-controller halt, as XID 62 (RESET_GPU)",
    170: "confidential computing mode only, an effect the catalog does not state",
    171: "the details of an XID 48 (WORKFLOW_XID_48)",
    172: "the details of an XID 48 (WORKFLOW_XID_48)",
}

# XIDs whose class classify() decodes from the driver's text where it has it.
DECODED = frozenset((74, 144, 145, 146, 147, 148, 149, 150, 154))

# XID 154's new recovery action (nvmlDeviceGpuRecoveryAction_t) -> (class, the action's name).
RECOVERY_ACTIONS = {
    0: ("none", "none"),
    1: ("reset", "GPU reset"),
    2: ("reboot", "node reboot"),
    3: ("device", "drain P2P"),
    4: ("reset", "drain P2P and reset"),
    5: ("device", "recover the IMEX domain"),
    6: ("reset", "PCIe bus reset"),
    7: ("reboot", "system reboot"),
}

_RANK = dict((name, position) for position, name in enumerate(CLASSES))

# NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
# NVRM: Xid (0000:01:00): 3, C 00000005 ...   (older drivers leave out "PCI:")
_KERNEL_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.(?P<function>[0-7]))?\):"
    r"\s*(?P<xid>\d+)(?:,\s*(?P<rest>.*))?$"
)
# The process fields some XIDs carry first: pid=1896 / pid='<unknown>' / pid=<unknown>, name=python3.
_PROCESS_FIELD = re.compile(r"^(?P<key>pid|name)=(?P<value>'[^']*'|[^,]*),\s*")
_NEW_ACTION = re.compile(r"\bto 0x(?P<action>[0-9a-fA-F]+)\b")

# XID 74: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)".
_NVLINK_REGISTERS = re.compile(
    r"\blink\s*(?P<link>\d+)\s*\(\s*(?P<registers>0x[0-9a-fA-F]+(?:\s*,\s*0x[0-9a-fA-F]+){6})\s*\)"
)
# The catalog's WORKFLOW_NVLINK_ERR, by register (bit numbers).
_NVLINK74_FIRST_IGNORED = frozenset((0, 23, 30))
_NVLINK74_FIRST_SECONDARY = frozenset((1, 20))
_NVLINK74_FIRST_RESET = frozenset((4, 5, 27, 29))
_NVLINK74_FIRST_HARDWARE = frozenset((8, 9, 12, 16, 17, 24, 28))
_NVLINK74_FIRST_SIGNAL = frozenset((21, 22))
_NVLINK74_FIRST_KNOWN = (
    _NVLINK74_FIRST_IGNORED
    | _NVLINK74_FIRST_SECONDARY
    | _NVLINK74_FIRST_RESET
    | _NVLINK74_FIRST_HARDWARE
    | _NVLINK74_FIRST_SIGNAL
)
_NVLINK74_THIRD_RESET = frozenset((0, 1, 2, 6, 16, 17, 18, 19))
_NVLINK74_THIRD_KNOWN = _NVLINK74_THIRD_RESET | frozenset((13,))
_NVLINK74_FOURTH_SECONDARY = frozenset((16, 17))
_NVLINK74_FOURTH_KNOWN = _NVLINK74_FOURTH_SECONDARY | frozenset((18,))
_NVLINK74_FIFTH_RESET = frozenset((18, 19, 21, 22, 24, 25, 27, 28))
_NVLINK74_FIFTH_KNOWN = _NVLINK74_FIFTH_RESET | frozenset((20, 23, 26, 29))

# XIDs 144-150: "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000044 0x00000001 0x00000000 ...)".
_NVLINK5_LINE = re.compile(
    r"(?P<subcode>[A-Za-z][A-Za-z0-9_]*)\s+\w+\s+\w+\s+\w+\s+Link\s+(?P<link>-?\d+)\s*\(\s*"
    r"(?P<intr>0x[0-9a-fA-F]+)\s*,?\s*(?P<status>0x[0-9a-fA-F]+)"
)
# XID 154_EVAL: "if an XID 154 is seen along with this error, take that action; if not, RESTART_APP". The XID 154
# line is classed by itself, so this one asks for nothing more.
_NVLINK5_BUCKET_CLASSES = {"IGNORE": "none", "XID_154_EVAL": "none", "RESET_GPU": "reset"}


def _nvlink5_rows(ignore=(), reset=(), evaluate=(), other=None):
    rows = dict((status, "IGNORE") for status in ignore)
    rows.update((status, "RESET_GPU") for status in reset)
    rows.update((status, "XID_154_EVAL") for status in evaluate)
    if other is not None:
        rows[None] = other
    return rows


_SW = 0x80000000  # the status every unit reports for a software-side event: IGNORE
_TLW = _nvlink5_rows(ignore=(0x1, 0x2, _SW), reset=(0x4,))
# (XID, subcode as the line names it, before or from R575) -> {error status: bucket}; None: any other status.
_NVLINK5_DECODE = {
    (144, "SAW_MVB"): _nvlink5_rows(ignore=(0x1, 0x4, 0x8, 0x20), reset=(0x2, 0x10)),
    (145, "RLW_CTRL"): _nvlink5_rows(ignore=(_SW,)),
    (145, "RLW_REMAP"): _nvlink5_rows(
        ignore=(0x100, 0x200, _SW), reset=(0x40, 0x80), evaluate=(0x1, 0x2, 0x4, 0x8, 0x10, 0x20)
    ),
    (145, "RLW_RSPCOL"): _nvlink5_rows(ignore=(0x1, _SW), reset=(0x2,)),
    (145, "RLW_RXPIPE"): _nvlink5_rows(ignore=(0x1, 0x2, 0x4, 0x8, _SW)),
    (145, "RLW_SRC_TRACK"): _nvlink5_rows(ignore=(0x2, _SW), reset=(0x1, 0x10, 0x20), evaluate=(0x4, 0x8)),
    (145, "RLW_TAGSTATE"): _nvlink5_rows(ignore=(0x1, 0x10000, _SW), reset=(0x2, 0x20000, 0x100000)),
    (146, "TLW_CTRL"): _TLW,
    (146, "TLW_RX"): _TLW,
    (146, "TLW_RX_PIPE0"): _TLW,
    (146, "TLW_RX_PIPE1"): _TLW,
    (146, "TLW_TX"): _TLW,
    (146, "TLW_TX_PIPE0"): _TLW,
    (146, "TLW_TX_PIPE1"): _TLW,
    (147, "TREX"): _nvlink5_rows(ignore=(0x1, _SW)),
    (148, "NVLPW_CTRL"): _nvlink5_rows(ignore=(_SW,)),
    (148, "NVLPW"): _nvlink5_rows(ignore=(_SW,)),
    (149, "NETIR"): _nvlink5_rows(other="RESET_GPU"),
    (149, "NETIR_INT"): _nvlink5_rows(other="RESET_GPU"),
    # The link-down reason (bits above the subcode) picks the row: all but two of its rows are RESET_GPU, and
    # those two (a peer or host taking the link down on purpose) cannot be told apart here, so: reset.
    (149, "NETIR_LINK_EVT"): _nvlink5_rows(other="RESET_GPU"),
    (149, "NETIR_LINK_DOWN"): _nvlink5_rows(other="RESET_GPU"),
    (149, "NETIR_BER_EVENT"): _nvlink5_rows(ignore=(0x0, 0x1, 0x2, 0x3)),
    (149, "NETIR_MFDE_EVENT"): _nvlink5_rows(ignore=(0x3,), reset=(0x1, 0x4, 0x5, 0x7)),
    (150, "MSE_DEGRADED"): _nvlink5_rows(other="RESET_GPU"),
    (150, "MSE_WATCHDOG"): _nvlink5_rows(other="RESET_GPU"),
}


def rank(name):
    """The severity rank of a class (none = 0 ... replace = 4)."""
    return _RANK[name]


def highest(names, floor="none"):
    """The most severe of the classes given (`floor` when there are none)."""
    best = floor
    for name in names:
        if _RANK[name] > _RANK[best]:
            best = name
    return best


def parse_overrides(raw, where="overrides"):
    """{xid: class} from what a user wrote (keys may be strings, as YAML and JSON give them).

    Raises ValueError with one sentence that names `where` and the bad entry."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a mapping of XID to class, not {type(raw).__name__}.")
    out = {}
    for key, value in raw.items():
        text = str(key).strip()
        if isinstance(key, bool) or not text.isdigit() or int(text) <= 0:
            raise ValueError(f"{where}: {key!r} is not an XID (a positive integer).")
        if value not in CLASSES:
            raise ValueError(f"{where}: XID {text} maps to {value!r}, which is not one of {', '.join(CLASSES)}.")
        out[int(text)] = value
    return out


def ignored_xids(overrides=None):
    """The XIDs whose class is `none` with these overrides: the daemon's default list of XIDs to ignore."""
    merged = dict((xid, entry[0]) for xid, entry in TABLE.items())
    merged.update(overrides or {})
    return frozenset(xid for xid, name in merged.items() if name == "none")


def recovery_action(data):
    """XID 154's new recovery action from its text ("... changed from 0x0 (None) to 0x1 (GPU Reset Required)")."""
    found = _NEW_ACTION.search(data or "")
    return int(found.group("action"), 16) if found else None


def _bits(value):
    return set(bit for bit in range(32) if value >> bit & 1)


def decode_nvlink_error(data):
    """XID 74 from its registers, as the catalog's WORKFLOW_NVLINK_ERR reads them: (class, what), or None when
    the text carries no registers (or only zeros).

    The line: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)". The first,
    third, fourth and fifth registers are read. One line is judged alone: where the catalog asks for a bug report
    only when a bit repeats, the class is the reset the catalog's description says clears an XID 74, and a repeat
    within the remediation's window goes to replace."""
    found = _NVLINK_REGISTERS.search(data or "")
    if found is None:
        return None
    registers = [int(value, 16) for value in re.findall(r"0x[0-9a-fA-F]+", found.group("registers"))]
    first, third, fourth, fifth = (_bits(registers[i]) for i in (0, 2, 3, 4))
    if not (first or third or fourth or fifth):
        return None
    hardware = first & _NVLINK74_FIRST_HARDWARE
    unknown = (
        (first - _NVLINK74_FIRST_KNOWN)
        | set(bit + 64 for bit in third - _NVLINK74_THIRD_KNOWN)
        | set(bit + 96 for bit in fourth - _NVLINK74_FOURTH_KNOWN)
        | set(bit + 128 for bit in fifth - _NVLINK74_FIFTH_KNOWN)
    )
    primary_reset = (first & _NVLINK74_FIRST_RESET) | (third & _NVLINK74_THIRD_RESET) | (fifth & _NVLINK74_FIFTH_RESET)
    signal = first & _NVLINK74_FIRST_SIGNAL
    link = found.group("link")
    if hardware or 13 in third or unknown:
        return (
            "replace",
            f"link {link}: a possible hardware fault or an unexpected bit (catalog: report, check the link)",
        )
    if primary_reset:
        return "reset", f"link {link}: an ECC, parity or link error that a GPU reset clears"
    if signal:
        return "replace", f"link {link}: a marginal signal on the link alone (catalog: check the link's mechanics)"
    if 18 in fourth:
        return "reset", f"link {link}: a secondary error that needs the fabric reset"
    if (first & _NVLINK74_FIRST_SECONDARY) or (fourth & _NVLINK74_FOURTH_SECONDARY):
        return "replace", f"link {link}: a secondary error seen alone (catalog: report it)"
    return "none", f"link {link}: only bits the catalog says to ignore or to continue on"


def decode_nvlink5_error(xid, data):
    """XIDs 144-150 from their unit, subcode and error status, as the catalog's "Xid 144-150 Decode" sheet gives
    them: (class, what), or None where the text is not of that shape or its row is not listed.

    The line: "<subcode> <Fatal|Nonfatal> <XC> <injected> Link <n> (<intrInfo> <errorStatus> <debug data>...)"."""
    found = _NVLINK5_LINE.search(data or "")
    if found is None:
        return None
    subcode = found.group("subcode").upper()
    rows = _NVLINK5_DECODE.get((int(xid), subcode))
    if rows is None:
        return None
    status = int(found.group("status"), 16)
    bucket = rows.get(status, rows.get(None))
    if bucket is None:
        return None
    intr = int(found.group("intr"), 16)
    if (xid, subcode) == (145, "RLW_RXPIPE") and status in (1, 2, 4) and _rxpipe_action_two(intr):
        bucket = "RESET_GPU"
    name = _NVLINK5_BUCKET_CLASSES[bucket]
    return name, f"{subcode} error status 0x{status:08x} on link {found.group('link')}: catalog {bucket}"


def _rxpipe_action_two(intr):
    """The catalog's "action 2" bit of RLW_RXPIPE: bit 10 of the interrupt info before R575, bit 7 from R575 on
    (told apart by where the subcode sits: bits 9-5 with the unit in 4-0, or bits 6-0)."""
    if intr & 0x3FF == 0b0011000010:
        return bool(intr >> 10 & 1)
    if intr & 0x7F == 0b0000110:
        return bool(intr >> 7 & 1)
    return False


def classify(xid, data=None, overrides=None):
    """(class, reason) for one XID. `data` is the text the driver logged after the XID's number (the
    process fields removed), where it is known; `overrides` a parsed {xid: class} merged over the table."""
    xid = int(xid)
    if overrides and xid in overrides:
        return overrides[xid], f"XID {xid} is {overrides[xid]} by the inventory's override"
    if xid == RECOVERY_ACTION_XID:
        action = recovery_action(data)
        if action is None:
            return DEFAULT_CLASS, f"XID 154 without its recovery action: {DEFAULT_CLASS}"
        name, label = RECOVERY_ACTIONS.get(action, (DEFAULT_CLASS, f"unknown action 0x{action:x}"))
        return name, f"XID 154: the driver's recovery action is now {label} (0x{action:x})"
    decoded = None
    if xid == 74:
        decoded = decode_nvlink_error(data)
    elif 144 <= xid <= 150:
        decoded = decode_nvlink5_error(xid, data)
    entry = TABLE.get(xid)
    if entry is None:
        return DEFAULT_CLASS, f"XID {xid} is not in the catalog table: the default class {DEFAULT_CLASS}"
    name, bucket, what = entry
    if decoded is not None:
        return decoded[0], f"XID {xid} ({what}) decoded: {decoded[1]}"
    if not bucket:
        return name, f"XID {xid} ({what}): the catalog lists no bucket; {name}: {NOTES[xid]}"
    reason = f"XID {xid} ({what}): catalog {bucket}"
    if xid in NOTES:
        reason += f", {name}: {NOTES[xid]}"
    return name, reason


def parse_kernel_line(message):
    """One kernel log message -> {pci, xid, data, pid, process} for an `NVRM: Xid` line, else None.

    `pci` is the GPU's bus ID in sysfs form (0000:3b:00.0); `data` is what follows the XID's number
    without the process fields."""
    found = _KERNEL_LINE.search((message or "").rstrip())
    if found is None:
        return None
    domain, bus, device = found.group("pci").lower().rsplit(":", 2)
    pci = f"{domain[-4:].rjust(4, '0')}:{bus}:{device}.{found.group('function') or '0'}"
    rest = found.group("rest") or ""
    fields = {}
    while True:
        field = _PROCESS_FIELD.match(rest)
        if field is None or field.group("key") in fields:
            break
        fields[field.group("key")] = field.group("value").strip("'")
        rest = rest[field.end() :]
    pid = fields.get("pid")
    return {
        "pci": pci,
        "xid": int(found.group("xid")),
        "data": rest.strip(),
        "pid": int(pid) if pid and pid.isdigit() else None,
        "process": fields.get("name") if fields.get("name") not in (None, "<unknown>") else None,
    }
