#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later


DOCUMENTATION = r"""
---
module: gpu_faults
short_description: Report the node's GPU faults and the action each asks for, from the daemon and the kernel log
version_added: 0.1.0
description:
  - Reads the GPU health file the collection's device plugin daemon writes (O(health_file)) and the kernel
    log's C(NVRM Xid) lines since the last run, classifies every XID found (C(none), C(device), C(reset),
    C(reboot), C(replace), by severity; docs/xid-classes.md has the table and its sources) and returns each
    GPU's class and the node's highest.
  - The kernel log finds the XIDs that came while the daemon was down. Where the last run kept its place
    (O(advance_cursor)), only the kernel messages after it are read; otherwise those of the current boot.
  - A kernel line names the GPU by PCI bus; the module maps it to the GPU's UUID and index through the
    health file, else through NVML (C(pynvml)), else only the bus is known.
  - It changes nothing on the node but its own place in the kernel log, and that only with
    O(advance_cursor=true) and never in check mode.
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  health_file:
    description:
      - The health file of the collection's device plugin daemon (its C(healthFile) setting).
      - A file that does not exist is not an error (the daemon is not installed or not started yet); RV(health_file)
        says so.
    type: path
    default: /var/lib/gpuops/gpu-health.json
  state_dir:
    description:
      - Where the module keeps its place in the kernel log, in the file C(gpu-faults.cursor).
    type: path
    default: /var/lib/gpuops
  advance_cursor:
    description:
      - Keep the place reached in the kernel log, so that the next run reads only what came after it.
      - Leave it off to look without moving on (a plan, a check); a remediation turns it on once it has acted.
    type: bool
    default: false
  kernel_log:
    description:
      - Whether to read the kernel log at all. Off, only the health file is read.
    type: bool
    default: true
  kernel_log_command:
    description:
      - The command that prints the kernel log as journal export JSON, one entry per line (the C(MESSAGE),
        C(__CURSOR) and C(__REALTIME_TIMESTAMP) fields are read).
      - When its program is C(journalctl), C(--after-cursor) and the kept place are added to it. Any other
        command (a test, a log shipped elsewhere) prints everything, and the module skips the entries up to
        the kept place itself.
    type: list
    elements: str
    default: [journalctl, -k, -o, json, --no-pager]
  classes:
    description:
      - Classes of your own for XIDs, merged over the collection's table (the C(gpu_remediation_xid_classes)
        inventory variable). Keys are XIDs, values one of C(none), C(device), C(reset), C(reboot), C(replace).
      - Applies to the kernel log's XIDs; the daemon applies the same overrides from its own config (C(xidClasses)).
    type: dict
    default: {}
  sysfs_root:
    description:
      - The directory where sysfs is mounted, which NVML's discovery reads beside NVML.
    type: path
    default: /sys
attributes:
  check_mode:
    support: full
    description: In check mode the module reads as usual and never writes its place in the kernel log.
  diff_mode:
    support: none
    description: The only thing it writes is its place in the kernel log, which has nothing to show.
  platform:
    platforms: posix
    support: full
    description: Linux hosts with journald, or any command that prints the kernel log as journal JSON.
requirements:
  - The C(pynvml) Python module (package C(nvidia-ml-py)) on the target, only to name the GPU of a kernel line
    the health file does not know.
notes:
  - A kernel line of an XID whose class depends on its text (XID 154, the driver's recovery action) is decoded;
    the daemon, which gets XIDs from NVML without their text, classes XID 154 as C(device).
  - The daemon's class is the highest since the GPU last became healthy; the kernel log's, the highest since the
    kept place. A GPU's class is the higher of the two.
seealso:
  - name: NVIDIA's XID catalog
    description: The resolution buckets the classes come from (docs/xid-classes.md in the collection has the table).
    link: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
"""

EXAMPLES = r"""
- name: Read the node's GPU faults
  gpuops.k8s.gpu_faults:
  register: faults

- name: Act only on a node whose GPUs need more than leaving scheduling
  ansible.builtin.debug:
    msg: "{{ faults.gpus | selectattr('class', 'in', ['reset', 'reboot', 'replace']) | map(attribute='uuid') | list }}"
  when: faults.node_class in ['reset', 'reboot', 'replace']

- name: Move on in the kernel log once the faults were handled
  gpuops.k8s.gpu_faults:
    advance_cursor: true
    classes:
      63: reset
"""

RETURN = r"""
gpus:
  description:
    - Every GPU the health file lists and every GPU a kernel XID line names, in index order (GPUs without a known
      index last, by PCI bus).
  returned: always
  type: list
  elements: dict
  contains:
    uuid:
      description: The GPU's UUID; null for a kernel line whose bus neither the health file nor NVML knows.
      type: str
      sample: GPU-6f1c0a3e-0000-4000-8000-000000000001
    index:
      description: The GPU's NVML index; null when unknown.
      type: int
      sample: 0
    pci:
      description: The GPU's PCI bus ID in the sysfs form; null when unknown.
      type: str
      sample: "0000:18:00.0"
    healthy:
      description: Whether the daemon counts the GPU healthy; null when the health file does not list it.
      type: bool
      sample: false
    class:
      description: The GPU's class, the highest of the daemon's and the kernel log's.
      type: str
      choices: [none, device, reset, reboot, replace]
      sample: reboot
    reason:
      description: Why the GPU has its class, one sentence; empty for C(none).
      type: str
      sample: "XID 79 (GPU has fallen off the bus): catalog RESTART_BM"
    source:
      description: Where the class comes from; C(daemon) when both agree.
      type: str
      choices: [daemon, kernel]
      sample: daemon
    xids:
      description: The XIDs behind the class, oldest first (the daemon keeps the last 16 since the GPU became healthy).
      type: list
      elements: dict
      contains:
        xid:
          description: The XID.
          type: int
        data:
          description: The driver's text after the XID's number (kernel log); null from the daemon.
          type: str
        time:
          description: When it came, ISO 8601 in UTC.
          type: str
        class:
          description: The XID's class.
          type: str
        reason:
          description: Why it has that class.
          type: str
        source:
          description: C(daemon) or C(kernel).
          type: str
node_class:
  description: The highest class of the node's GPUs (C(none) without any).
  returned: always
  type: str
  choices: [none, device, reset, reboot, replace]
  sample: reset
since:
  description:
    - The time of the kernel log entry at the kept place (ISO 8601, UTC), after which this run read; null when no
      place was kept and the command's whole output (with C(journalctl -k), the current boot) was read.
  returned: always
  type: str
  sample: "2026-11-26T08:46:00.123456Z"
cursor:
  description: The journal cursor of the last kernel log entry read (the kept place after O(advance_cursor)); null when
    none was read.
  returned: always
  type: str
  sample: s=739ad463348b4ceca5a9e69c95a3c93f;i=4ece7;b=6c7c6013a8674f2f9f2d8e7c1a1c1e1a;m=9dc5fc5e;t=5c0f3e6a5f1f6;x=1
health_file:
  description: What was found at O(health_file).
  returned: always
  type: dict
  contains:
    path:
      description: The file.
      type: str
    present:
      description: Whether it exists.
      type: bool
    updated:
      description: When the daemon last wrote it (ISO 8601, UTC); null without it.
      type: str
    node:
      description: The node name the daemon wrote into it; null without it.
      type: str
  sample: {path: /var/lib/gpuops/gpu-health.json, present: true, updated: "2026-11-26T08:46:00Z", node: gpu-1}
"""

import datetime
import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils import _xid_classes
from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_discovery import (
    DiscoveryError,
    NvmlUnavailable,
    installed_pynvml,
    normalize_bus_id,
    nvml_discover,
)

# The pynvml module, or None without nvidia-ml-py; unit tests put an NVML test double here.
pynvml = installed_pynvml()

CURSOR_FILE = "gpu-faults.cursor"


class FaultsError(Exception):
    """One sentence naming what could not be read and where."""


def iso_from_microseconds(value):
    """journald's __REALTIME_TIMESTAMP (microseconds since the epoch, as text) -> ISO 8601 UTC; None if not one."""
    try:
        micros = int(value)
    except (TypeError, ValueError):
        return None
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_health_file(path):
    """The daemon's health file as a dict, or None when there is none; FaultsError when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise FaultsError(f"cannot read the GPU health file {path}: {getattr(exc, 'strerror', None) or exc}.") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise FaultsError(f"the GPU health file {path} is not JSON.") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise FaultsError(f"the GPU health file {path} has no list of gpus.")
    return data


def read_cursor(state_dir):
    """The kept place: {cursor, time}, or an empty dict; an unreadable file counts as none."""
    try:
        with open(os.path.join(state_dir, CURSOR_FILE), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("cursor"), str):
        return {}
    return data


def journal_entries(lines):
    """Parse journal export JSON lines; lines that are not JSON objects are skipped."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


def message_text(entry):
    """journald gives MESSAGE as text, or as a list of bytes when it is not valid UTF-8."""
    message = entry.get("MESSAGE")
    if isinstance(message, list):
        return bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", "replace")
    return message if isinstance(message, str) else ""


def kernel_xids(entries, cursor, overrides):
    """(XID records after `cursor`, the last cursor seen, its entry's time).

    When the cursor is among the entries, only what follows it counts; otherwise every entry does (journalctl
    already started after it, or the log rotated)."""
    entries = list(entries)
    start = 0
    if cursor:
        for position, entry in enumerate(entries):
            if entry.get("__CURSOR") == cursor:
                start = position + 1
                break
    records = []
    last, last_time = cursor or None, None
    for entry in entries[start:]:
        if isinstance(entry.get("__CURSOR"), str):
            last, last_time = entry["__CURSOR"], iso_from_microseconds(entry.get("__REALTIME_TIMESTAMP"))
        found = _xid_classes.parse_kernel_line(message_text(entry))
        if found is None:
            continue
        name, reason = _xid_classes.classify(found["xid"], found["data"], overrides)
        records.append(
            {
                "pci": found["pci"],
                "xid": found["xid"],
                "data": found["data"],
                "time": iso_from_microseconds(entry.get("__REALTIME_TIMESTAMP")),
                "class": name,
                "reason": reason,
                "source": "kernel",
            }
        )
    return records, last, last_time


def nvml_gpus_by_bus(nvml, sysfs_root):
    """{pci: (uuid, index)} from NVML; empty when NVML does not answer."""
    if nvml is None:
        return {}
    try:
        facts = nvml_discover(nvml, sysfs_root)
    except (NvmlUnavailable, DiscoveryError):
        return {}
    return dict((gpu["pci_bus_id"], (gpu["uuid"], gpu["index"])) for gpu in facts["gpus"])


def merge(health, records, nvml_lookup):
    """The GPUs with their classes: the health file's entries, with the kernel records joined by PCI bus."""
    gpus = []
    by_pci = {}
    for item in (health or {}).get("gpus", []):
        if not isinstance(item, dict):
            continue
        pci = normalize_bus_id(item["pci"]) if item.get("pci") else None
        xids = [
            dict(
                xid=x.get("xid"),
                data=x.get("data"),
                time=x.get("time"),
                reason=x.get("reason", ""),
                source="daemon",
                **{"class": x.get("class", _xid_classes.DEFAULT_CLASS)},
            )
            for x in item.get("xids") or []
            if isinstance(x, dict)
        ]
        name = item.get("class") if item.get("class") in _xid_classes.CLASSES else _xid_classes.DEFAULT_CLASS
        gpu = {
            "uuid": item.get("uuid"),
            "index": item.get("index"),
            "pci": pci,
            "healthy": item.get("healthy"),
            "class": name,
            "reason": item.get("reason") or "",
            "source": "daemon",
            "xids": xids,
        }
        gpus.append(gpu)
        if pci:
            by_pci[pci] = gpu
    lookup = None
    for record in records:
        gpu = by_pci.get(record["pci"])
        if gpu is None:
            if lookup is None:
                lookup = nvml_lookup()
            uuid, index = lookup.get(record["pci"], (None, None))
            gpu = {
                "uuid": uuid,
                "index": index,
                "pci": record["pci"],
                "healthy": None,
                "class": "none",
                "reason": "",
                "source": "kernel",
                "xids": [],
            }
            gpus.append(gpu)
            by_pci[record["pci"]] = gpu
        gpu["xids"].append(dict((k, v) for k, v in record.items() if k != "pci"))
        if _xid_classes.rank(record["class"]) > _xid_classes.rank(gpu["class"]):
            gpu.update({"class": record["class"], "reason": record["reason"], "source": "kernel"})
    gpus.sort(key=lambda g: (g["index"] is None, g["index"] if g["index"] is not None else 0, g["pci"] or ""))
    return gpus


def write_cursor(module, state_dir, cursor, time):
    """Keep the place atomically (a temporary file in the same directory, then a rename)."""
    try:
        if not os.path.isdir(state_dir):
            os.makedirs(state_dir, 0o755)
        fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".gpu-faults-")
        with os.fdopen(fd, "w") as handle:
            json.dump({"cursor": cursor, "time": time}, handle)
            handle.write("\n")
    except OSError as exc:
        raise FaultsError(f"cannot keep the kernel log place in {state_dir}: {exc.strerror}.") from None
    module.atomic_move(tmp, os.path.join(state_dir, CURSOR_FILE))


def read_kernel_log(module, command, kept):
    argv = list(command)
    if kept.get("cursor") and os.path.basename(argv[0]) == "journalctl":
        argv.append("--after-cursor=" + kept["cursor"])
    rc, out, err = module.run_command(argv, check_rc=False)
    if rc != 0:
        lines = (err or out or "").strip().splitlines()
        detail = ": " + lines[-1].rstrip(".") if lines else ""
        raise FaultsError(f"the kernel log command {' '.join(argv)} failed with exit status {rc}{detail}.")
    return journal_entries(out.splitlines())


def run_module(module):
    params = module.params
    try:
        overrides = _xid_classes.parse_overrides(params["classes"], "classes")
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    try:
        health = read_health_file(params["health_file"])
        kept = read_cursor(params["state_dir"])
        records, last, last_time = [], kept.get("cursor"), None
        if params["kernel_log"]:
            if not params["kernel_log_command"]:
                raise FaultsError("kernel_log_command must name a command.")
            entries = read_kernel_log(module, params["kernel_log_command"], kept)
            records, last, last_time = kernel_xids(entries, kept.get("cursor"), overrides)
        gpus = merge(health, records, lambda: nvml_gpus_by_bus(pynvml, params["sysfs_root"]))
        changed = bool(params["advance_cursor"] and last and last != kept.get("cursor"))
        if changed and not module.check_mode:
            write_cursor(module, params["state_dir"], last, last_time)
    except FaultsError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=changed,
        gpus=gpus,
        node_class=_xid_classes.highest(g["class"] for g in gpus),
        since=kept.get("time") if kept.get("cursor") else None,
        cursor=last,
        health_file={
            "path": params["health_file"],
            "present": health is not None,
            "updated": (health or {}).get("updated"),
            "node": (health or {}).get("node"),
        },
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            health_file=dict(type="path", default="/var/lib/gpuops/gpu-health.json"),
            state_dir=dict(type="path", default="/var/lib/gpuops"),
            advance_cursor=dict(type="bool", default=False),
            kernel_log=dict(type="bool", default=True),
            kernel_log_command=dict(
                type="list", elements="str", default=["journalctl", "-k", "-o", "json", "--no-pager"]
            ),
            classes=dict(type="dict", default={}),
            sysfs_root=dict(type="path", default="/sys"),
        ),
        supports_check_mode=True,
    )
    run_or_fail(module, "gpu_faults", run_module)


if __name__ == "__main__":
    main()
