# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""XID classes: what a GPU's XID asks of the node, in the five steps the remediation acts on.

The one table of XID -> class. The gpu_faults module (kernel log lines) and the bundled daemon (NVML
events; its package carries this file as gpu_device_plugin/_shared/xid_classes.py, docs/architecture.md)
both classify here, so the module imports nothing from Ansible and nothing beyond the standard library.

Classes, by severity:
  none     nothing to do for the GPU (the application restarts, or the event is informational)
  device   take the GPU out of scheduling (what the daemon does on every XID it does not ignore)
  reset    reset the GPU once nothing uses it
  reboot   drain the node and reboot it
  replace  cordon and taint the node and leave it for a person

Sources: NVIDIA's XID catalog for Ampere and newer GPUs ("Analyzing Xid Errors with the Xid Catalog",
docs.nvidia.com/deploy/xid-errors), its "Resolution Bucket (Immediate Action)" column, which each entry
names. A bucket becomes a class by BUCKET_CLASSES; the exceptions are the daemon's own line between
`none` and the rest: the XIDs the daemon ignores (NVIDIA's device plugin's list: 13, 31, 43, 45, 68, 109)
are `none` whatever their bucket, and an XID of the IGNORE bucket that the daemon does not ignore is
`device`, since the daemon takes the GPU out of scheduling for it. XID 154 (the driver's recovery action
changed) is decoded from its text, as the catalog's Xid 154 linkage says. An XID the table does not hold
is DEFAULT_CLASS.
"""

import re

CLASSES = ("none", "device", "reset", "reboot", "replace")
DEFAULT_CLASS = "device"
RECOVERY_ACTION_XID = 154

# Catalog bucket (immediate action) -> class.
BUCKET_CLASSES = {
    "IGNORE": "none",
    "WORKFLOW_XID_45": "none",
    "RESTART_APP": "device",
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

# The XIDs the daemon ignores by default: they point at the application, not the GPU.
DAEMON_IGNORED = frozenset((13, 31, 43, 45, 68, 109))

# XID -> (class, catalog bucket, what it is). The class column is BUCKET_CLASSES[bucket] except where the
# daemon's line decides (see the module's docstring; tests/unit/plugins/module_utils/test_xid_classes.py
# holds the table to that rule).
TABLE = {
    8: ("device", "RESTART_APP", "GPU stopped processing (idle timeout)"),
    11: ("device", "RESTART_APP", "invalid or corrupted push buffer stream"),
    13: ("none", "RESTART_APP", "graphics engine exception"),
    25: ("device", "RESTART_APP", "invalid or illegal push buffer stream"),
    31: ("none", "RESTART_APP", "GPU memory page fault"),
    32: ("device", "RESTART_APP", "invalid or corrupted push buffer stream (PBDMA)"),
    37: ("device", "IGNORE", "driver firmware error (unimplemented method)"),
    38: ("device", "IGNORE", "driver firmware error (watchdog timeout)"),
    39: ("device", "RESTART_APP", "copy engine 0 exception"),
    40: ("device", "RESTART_APP", "copy engine 1 exception"),
    41: ("device", "RESTART_APP", "copy engine 2 exception"),
    43: ("none", "IGNORE", "GPU stopped processing (reset channel)"),
    44: ("device", "IGNORE", "graphics engine fault during context switch"),
    45: ("none", "WORKFLOW_XID_45", "preemptive cleanup after earlier errors"),
    46: ("reset", "RESET_GPU", "GPU stopped processing (GPU timeout)"),
    48: ("reset", "WORKFLOW_XID_48", "double bit ECC error"),
    54: ("replace", "CHECK_MECHANICALS", "auxiliary power not connected"),
    60: ("device", "RESTART_APP", "video processor (SEC2) exception"),
    62: ("reset", "RESET_GPU", "internal micro-controller halt"),
    63: ("device", "IGNORE", "GPU memory row remapping event"),
    64: ("reset", "RESET_GPU", "GPU memory row remapping failure"),
    66: ("device", "IGNORE", "illegal access by driver (register access)"),
    67: ("device", "IGNORE", "illegal access by driver (verification)"),
    68: ("none", "RESTART_APP", "video decoder (NVDEC0) exception"),
    69: ("device", "RESTART_APP", "graphics engine class error"),
    70: ("device", "RESTART_APP", "copy engine 3 error"),
    71: ("device", "RESTART_APP", "copy engine 4 error"),
    72: ("device", "RESTART_APP", "copy engine 5 error"),
    74: ("reset", "WORKFLOW_NVLINK_ERR", "NVLink error"),
    75: ("device", "RESTART_APP", "copy engine 6 error"),
    76: ("device", "RESTART_APP", "copy engine 7 error"),
    77: ("device", "RESTART_APP", "copy engine 8 error"),
    78: ("device", "UPDATE_SWFW", "vGPU start error"),
    79: ("reboot", "RESTART_BM", "GPU has fallen off the bus"),
    80: ("device", "RESTART_APP", "corrupted data sent to the GPU"),
    82: ("device", "RESTART_APP", "JPEG decoder (NVJPG0) error"),
    83: ("device", "RESTART_APP", "video decoder (NVDEC1) error"),
    84: ("device", "RESTART_APP", "video decoder (NVDEC2) error"),
    85: ("device", "RESTART_APP", "copy engine 9 error"),
    86: ("device", "RESTART_APP", "optical flow accelerator (OFA) exception"),
    88: ("device", "RESTART_APP", "video decoder (NVDEC3) error"),
    89: ("device", "RESTART_APP", "video decoder (NVDEC4) error"),
    92: ("device", "IGNORE", "high single-bit ECC error rate"),
    93: ("device", "IGNORE", "InfoROM wear limit exceeded (non-fatal)"),
    94: ("device", "RESTART_APP", "contained memory (ECC) error"),
    95: ("reset", "RESET_GPU", "uncontained memory (ECC) error"),
    96: ("device", "RESTART_APP", "video decoder (NVDEC5) error"),
    97: ("device", "RESTART_APP", "video decoder (NVDEC6) error"),
    98: ("device", "RESTART_APP", "video decoder (NVDEC7) error"),
    99: ("device", "RESTART_APP", "JPEG decoder (NVJPG1) error"),
    100: ("device", "RESTART_APP", "JPEG decoder (NVJPG2) error"),
    101: ("device", "RESTART_APP", "JPEG decoder (NVJPG3) error"),
    102: ("device", "RESTART_APP", "JPEG decoder (NVJPG4) error"),
    103: ("device", "RESTART_APP", "JPEG decoder (NVJPG5) error"),
    104: ("device", "RESTART_APP", "JPEG decoder (NVJPG6) error"),
    105: ("device", "RESTART_APP", "JPEG decoder (NVJPG7) error"),
    106: ("device", "IGNORE", "SMBPBI test message"),
    107: ("device", "IGNORE", "SMBPBI test message (silent)"),
    109: ("none", "RESET_GPU", "context switch timeout"),
    110: ("reset", "RESET_GPU", "security fault"),
    119: ("reset", "RESET_GPU", "GSP RPC timeout"),
    120: ("reset", "RESET_GPU", "GSP error"),
    121: ("device", "IGNORE", "C2C link error"),
    126: ("device", "RESTART_APP", "copy engine 10 error"),
    127: ("device", "RESTART_APP", "copy engine 11 error"),
    128: ("device", "RESTART_APP", "copy engine 12 error"),
    129: ("device", "RESTART_APP", "copy engine 13 error"),
    130: ("device", "RESTART_APP", "copy engine 14 error"),
    131: ("device", "RESTART_APP", "copy engine 15 error"),
    132: ("device", "RESTART_APP", "copy engine 16 error"),
    133: ("device", "RESTART_APP", "copy engine 17 error"),
    134: ("device", "RESTART_APP", "copy engine 18 error"),
    135: ("device", "RESTART_APP", "copy engine 19 error"),
    136: ("reset", "RESET_GPU", "NVLink training failed"),
    137: ("device", "IGNORE", "NVLink privilege error"),
    139: ("device", "RESTART_APP", "optical flow accelerator (OFA1) error"),
    140: ("reset", "RESET_GPU", "unrecovered ECC error"),
    141: ("device", "IGNORE", "CUDA fast path error"),
    142: ("replace", "CONTACT_SUPPORT", "video encoder (NVENC3) error"),
    143: ("reset", "RESET_GPU", "GPU initialisation error"),
    144: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLink SAW error"),
    145: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLink RLW error"),
    146: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLink TLW error"),
    147: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLink TREX error"),
    148: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLink NVLPW control error"),
    149: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLink NETIR error"),
    150: ("reset", "WORKFLOW_NVLINK5_ERR", "NVLink MSE error"),
    151: ("reboot", "RESTART_VM", "key rotation error"),
    152: ("device", "IGNORE", "DLA SMMU error"),
    153: ("device", "IGNORE", "DLA timeout"),
    154: ("device", "XID_154", "GPU recovery action changed (decoded from its text)"),
    155: ("reset", "RESET_GPU", "NVLink software-defined error"),
    156: ("reset", "RESET_GPU", "resource retirement event"),
    157: ("device", "IGNORE", "resource retirement failure"),
    158: ("reset", "RESET_GPU", "GPU fatal timeout"),
    159: ("device", "CHECK_UVM", "CHI non-data error"),
    160: ("device", "IGNORE", "channel retirement event"),
    161: ("device", "IGNORE", "channel retirement failure"),
}

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
    entry = TABLE.get(xid)
    if entry is None:
        return DEFAULT_CLASS, f"XID {xid} is not in the catalog table: the default class {DEFAULT_CLASS}"
    name, bucket, what = entry
    reason = f"XID {xid} ({what}): catalog {bucket}"
    if name != BUCKET_CLASSES.get(bucket, name):
        why = "ignores it" if name == "none" else "takes the GPU out of scheduling for it"
        reason += f", {name} as the daemon {why}"
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
