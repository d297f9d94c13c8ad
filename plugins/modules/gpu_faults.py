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
  - The kernel log finds the XIDs that came while the daemon was down, a reboot included. Where the last run kept its
    place (O(advance_cursor)), every kernel message after it is read, across boots; otherwise those of the current
    boot and the one before it.
  - What is returned is bounded whatever the log holds; per GPU, XID and class one row with a count, the first and
    last time and the newest lines. journalctl is read in pages, at most O(kernel_log_max_entries) entries a run.
  - A kernel line names the GPU by PCI bus; the module maps it to the GPU's UUID and index through the
    health file, else through NVML (C(pynvml)), else only the bus is known.
  - It changes nothing on the node but its own place in the kernel log, and that only with O(advance_cursor=true),
    and the daemon's notices of O(clear_daemon_faults); never in check mode. Moving on never forgets an XID that asks
    for more than O(acted_class) on the GPUs of O(acted_gpus); such XIDs are kept with the place and returned by every
    later run until a run acted on them.
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
      - Leave it off to look without moving on (a plan, a check); a remediation turns it on once it has acted,
        and says what it did with O(acted_class) and O(acted_gpus).
      - The kernel log's XIDs of a class above C(device) that the action did not cover are kept with the place
        (RV(kernel_log.kept)) and count in every later run until a run acts on them.
    type: bool
    default: false
  acted_class:
    description:
      - With O(advance_cursor), the action just taken (C(reset), C(reboot); C(replace) once a person has repaired the
        node). The kernel log's XIDs of this class or below, on O(acted_gpus), count as handled.
      - The default C(none) handles nothing above C(device); the place moves on, and the rest is kept.
    type: str
    choices: [none, device, reset, reboot, replace]
    default: none
  acted_gpus:
    description:
      - With O(advance_cursor), the GPUs the action covered, by UUID or PCI bus ID. Empty means every GPU of the
        node (a reboot).
    type: list
    elements: str
    default: []
  clear_daemon_faults:
    description:
      - Tell the collection's daemon that an action cleared faults, so that it does not carry them over from its health
        file at its next start (it keeps a GPU's fault across a restart until the GPU recovers). The faults are those
        of O(acted_class) or below on O(acted_gpus) (empty means every GPU). A fault of a higher class is always carried
        over.
      - C(now), once the action is done (a GPU reset, while the daemon is stopped), covers the faults last changed up
        to now.
      - C(after_reboot), just before the node reboots, covers the faults of a health file written in the current
        boot, at a start in a later boot; a daemon started again in this boot carries them over.
      - The notices, the newest 8, are kept in the file beside O(health_file) named like it with C(.cleared),
        written atomically. In check mode nothing is written.
    type: str
    choices: [none, now, after_reboot]
    default: none
  kernel_log:
    description:
      - Whether to read the kernel log at all. Off, only the health file is read.
    type: bool
    default: true
  kernel_log_command:
    description:
      - The command that prints the kernel log as journal export JSON, one entry per line (the C(MESSAGE),
        C(__CURSOR), C(__REALTIME_TIMESTAMP) and C(_BOOT_ID) fields are read).
      - When its program is C(journalctl), the module adds where to start (C(--after-cursor), or the current and
        previous boots' C(_BOOT_ID) matches) and reads in pages (C(-n)); C(-k) and C(--dmesg) are read as the
        C(_TRANSPORT=kernel) match, since C(-k) limits journalctl to the current boot even after a cursor. A cursor
        journalctl refuses is not an error; the log is read from the kept place's time instead, and RV(kernel_log.notes)
        says so.
      - Any other command (a test, a log shipped elsewhere) prints everything, and the module skips the entries up to
        the kept place itself.
    type: list
    elements: str
    default: [journalctl, _TRANSPORT=kernel, -o, json, --no-pager]
  kernel_log_max_entries:
    description:
      - The most kernel log entries one run reads. A longer backlog is read on by the next runs from where this one
        stopped (RV(kernel_log.complete) is false).
    type: int
    default: 1000000
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
    description: In check mode the module reads as usual and never writes its place in the kernel log or a notice.
  diff_mode:
    support: none
    description: The only things it writes are its place in the kernel log and the daemon's notices, which have
      nothing to show.
  platform:
    platforms: posix
    support: full
    description: Linux hosts with journald, or any command that prints the kernel log as journal JSON.
requirements:
  - The C(pynvml) Python module (package C(nvidia-ml-py)) on the target, only to name the GPU of a kernel line
    the health file does not know.
notes:
  - A kernel line of an XID whose class depends on its text is decoded as NVIDIA's catalog does (XID 154's recovery
    action, XID 74's NVLink registers, XIDs 144-150's unit and error status); the daemon, which gets XIDs from NVML
    without their text, classes them by the table (docs/xid-classes.md).
  - The daemon's class is the highest since the GPU last became healthy; the kernel log's, the highest since the
    kept place and of the XIDs kept as not acted on. A GPU's class is the higher of the two.
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

- name: Move on in the kernel log once GPU 1 was reset; an XID on another GPU that asks for a reset stays
  gpuops.k8s.gpu_faults:
    advance_cursor: true
    acted_class: reset
    acted_gpus: [GPU-6f1c0a3e-0000-4000-8000-000000000001]
    classes:
      63: reset

- name: With the daemon stopped and GPU 1 reset, tell the daemon the reset cleared its faults
  gpuops.k8s.gpu_faults:
    kernel_log: false
    acted_class: reset
    acted_gpus: [GPU-6f1c0a3e-0000-4000-8000-000000000001]
    clear_daemon_faults: now
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
      description:
        - The XIDs behind the class, one row per XID, class and source, oldest last time first (the daemon keeps the
          last 16 XIDs since the GPU became healthy; the kernel log's rows count every line read).
      type: list
      elements: dict
      contains:
        xid:
          description: The XID.
          type: int
        class:
          description: The XID's class.
          type: str
        reason:
          description: Why it has that class (of the newest line).
          type: str
        source:
          description: C(daemon) or C(kernel).
          type: str
        count:
          description: How many times it came.
          type: int
        first:
          description: When it first came, ISO 8601 in UTC.
          type: str
        last:
          description: When it last came, ISO 8601 in UTC.
          type: str
        samples:
          description: The newest lines (at most 3), each C(time), C(data) (the driver's text after the XID's number;
            null from the daemon) and, from the kernel log, C(boot) (the boot ID).
          type: list
          elements: dict
node_class:
  description: The highest class of the node's GPUs (C(none) without any).
  returned: always
  type: str
  choices: [none, device, reset, reboot, replace]
  sample: reset
since:
  description:
    - The time of the kernel log entry at the kept place (ISO 8601, UTC), after which this run read; null when no
      place was kept and the current and previous boots were read.
  returned: always
  type: str
  sample: "2026-11-26T08:46:00.123456Z"
cleared:
  description:
    - The notice of O(clear_daemon_faults) (written, or that would be in check mode); null without one.
    - C(class) and C(gpus) are what it covers; C(time) (C(now)) or C(boot) (C(after_reboot)) when it holds.
  returned: always
  type: dict
  sample:
    class: reset
    gpus: [GPU-6f1c0a3e-0000-4000-8000-000000000001]
    time: "2026-11-26T08:47:10.000000Z"
cursor:
  description: The journal cursor of the last kernel log entry read (the kept place after O(advance_cursor)); null when
    none was read.
  returned: always
  type: str
  sample: s=739ad463348b4ceca5a9e69c95a3c93f;i=4ece7;b=6c7c6013a8674f2f9f2d8e7c1a1c1e1a;m=9dc5fc5e;t=5c0f3e6a5f1f6;x=1
kernel_log:
  description: How the kernel log was read.
  returned: always
  type: dict
  contains:
    entries:
      description: How many entries this run read.
      type: int
    complete:
      description: False when O(kernel_log_max_entries) stopped the read before the end of the log.
      type: bool
    kept:
      description: How many rows of XIDs no run has acted on are kept with the place.
      type: int
    notes:
      description: What was read otherwise than asked, one sentence each (a refused cursor, a cut-short read).
      type: list
      elements: str
  sample: {entries: 1824, complete: true, kept: 0, notes: []}
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
import re
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
# The daemon's notices of faults a remediation cleared: beside the health file, its name and this.
CLEARED_SUFFIX = ".cleared"
KEPT_NOTICES = 8
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
# journalctl is read in pages of this many entries, each one command, so no run holds more than a page of output.
PAGE_ENTRIES = 5000
# Kept per GPU, XID and class: the newest few lines as the driver wrote them.
SAMPLES = 3
# A journal match ("FIELD=value"), which journalctl --list-boots refuses.
_MATCH = re.compile(r"^[A-Z0-9_]+=")
_BOOT_LINE = re.compile(r"^\s*(?P<index>-?\d+)\s+(?P<boot>[0-9a-f]{32})\b")


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


def epoch_from_iso(text):
    """ISO 8601 UTC as this module writes it -> seconds since the epoch (as journalctl's --since=@ takes them)."""
    for layout in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            moment = datetime.datetime.strptime(text, layout)
        except (TypeError, ValueError):
            continue
        delta = moment - datetime.datetime(1970, 1, 1)
        return f"{delta.days * 86400 + delta.seconds}.{delta.microseconds:06d}"
    return None


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
    """(the kept place {cursor, time, pending}, a note): an unreadable file counts as none, and the note says so."""
    path = os.path.join(state_dir, CURSOR_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError):
        return {}, f"the kept place {path} could not be read, so the kernel log was read as if none was kept"
    if not isinstance(data, dict) or not isinstance(data.get("cursor"), str):
        return {}, f"the kept place {path} holds no cursor, so the kernel log was read as if none was kept"
    pending = data.get("pending")
    data["pending"] = [row for row in pending if _valid_row(row)] if isinstance(pending, list) else []
    return data, None


def _valid_row(row):
    return (
        isinstance(row, dict)
        and isinstance(row.get("xid"), int)
        and row.get("class") in _xid_classes.CLASSES
        and isinstance(row.get("count"), int)
    )


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


class XidSummary:
    """The kernel log's XIDs, bounded: per GPU (PCI bus), XID and class, a count, the first and last time and the
    newest SAMPLES lines. However many lines came, its size depends only on how many GPUs, XIDs and classes."""

    def __init__(self, overrides):
        self.overrides = overrides
        self.rows = {}
        self.entries = 0
        self.last, self._last_stamp = None, None

    @property
    def last_time(self):
        """The time of the last entry read (converted once, not for every entry)."""
        return iso_from_microseconds(self._last_stamp) if self.last else None

    def add_entry(self, entry):
        self.entries += 1
        if isinstance(entry.get("__CURSOR"), str):
            self.last, self._last_stamp = entry["__CURSOR"], entry.get("__REALTIME_TIMESTAMP")
        message = message_text(entry)
        if "Xid" not in message:
            return
        found = _xid_classes.parse_kernel_line(message)
        if found is None:
            return
        name, reason = _xid_classes.classify(found["xid"], found["data"], self.overrides)
        time = iso_from_microseconds(entry.get("__REALTIME_TIMESTAMP"))
        sample = {"time": time, "data": found["data"], "boot": entry.get("_BOOT_ID")}
        self.add_row(
            {
                "pci": found["pci"],
                "xid": found["xid"],
                "class": name,
                "reason": reason,
                "count": 1,
                "first": time,
                "last": time,
                "samples": [sample],
            }
        )

    def add_row(self, row):
        """A row of one line, or one kept from an earlier run: counted into the row of its GPU, XID and class."""
        key = (row.get("pci"), row["xid"], row["class"])
        held = self.rows.get(key)
        if held is None:
            self.rows[key] = dict(row, samples=list(row.get("samples") or [])[-SAMPLES:])
            return
        held["count"] += row["count"]
        if row.get("first") and (not held.get("first") or row["first"] < held["first"]):
            held["first"] = row["first"]
        if row.get("last") and (not held.get("last") or row["last"] >= held["last"]):
            held["last"], held["reason"] = row["last"], row["reason"]
        samples = held["samples"] + list(row.get("samples") or [])
        held["samples"] = sorted(samples, key=lambda sample: sample.get("time") or "")[-SAMPLES:]

    def records(self):
        return sorted(self.rows.values(), key=lambda row: (row.get("pci") or "", row["xid"], row["class"]))


def kernel_xids(entries, cursor, overrides):
    """(the XID summary after `cursor`, the last cursor seen, its entry's time), for a command that prints the
    whole log: when the cursor is among the entries, only what follows it counts; otherwise every entry does."""
    summary = XidSummary(overrides)
    skipping = bool(cursor)
    held = []
    for entry in entries:
        if skipping:
            held.append(entry)
            if entry.get("__CURSOR") == cursor:
                skipping, held = False, []
            continue
        summary.add_entry(entry)
    for entry in held:  # the cursor was not there (the log rotated, or another log): everything counts
        summary.add_entry(entry)
    return summary, summary.last or cursor or None, summary.last_time


def nvml_gpus_by_bus(nvml, sysfs_root):
    """{pci: (uuid, index)} from NVML; empty when NVML does not answer."""
    if nvml is None:
        return {}
    try:
        facts = nvml_discover(nvml, sysfs_root)
    except (NvmlUnavailable, DiscoveryError):
        return {}
    return dict((gpu["pci_bus_id"], (gpu["uuid"], gpu["index"])) for gpu in facts["gpus"])


def _daemon_rows(item):
    """The daemon's XIDs of one GPU (it keeps the last 16) as rows of the same shape as the kernel log's."""
    rows = {}
    for x in item.get("xids") or []:
        if not isinstance(x, dict) or not isinstance(x.get("xid"), int):
            continue
        name = x.get("class") if x.get("class") in _xid_classes.CLASSES else _xid_classes.DEFAULT_CLASS
        row = rows.get((x["xid"], name))
        sample = {"time": x.get("time"), "data": x.get("data")}
        if row is None:
            rows[(x["xid"], name)] = {
                "xid": x["xid"],
                "class": name,
                "reason": x.get("reason", ""),
                "source": "daemon",
                "count": 1,
                "first": x.get("time"),
                "last": x.get("time"),
                "samples": [sample],
            }
            continue
        row["count"] += 1
        row["last"], row["reason"] = x.get("time"), x.get("reason", "")
        row["samples"] = (row["samples"] + [sample])[-SAMPLES:]
    return list(rows.values())


def merge(health, records, nvml_lookup):
    """The GPUs with their classes: the health file's entries, with the kernel rows joined by PCI bus."""
    gpus = []
    by_pci = {}
    for item in (health or {}).get("gpus", []):
        if not isinstance(item, dict):
            continue
        pci = normalize_bus_id(item["pci"]) if item.get("pci") else None
        name = item.get("class") if item.get("class") in _xid_classes.CLASSES else _xid_classes.DEFAULT_CLASS
        gpu = {
            "uuid": item.get("uuid"),
            "index": item.get("index"),
            "pci": pci,
            "healthy": item.get("healthy"),
            "class": name,
            "reason": item.get("reason") or "",
            "source": "daemon",
            "xids": _daemon_rows(item),
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
        record["uuid"] = gpu["uuid"]
        gpu["xids"].append(dict(((k, v) for k, v in record.items() if k not in ("pci", "uuid")), source="kernel"))
        if _xid_classes.rank(record["class"]) > _xid_classes.rank(gpu["class"]):
            gpu.update({"class": record["class"], "reason": record["reason"], "source": "kernel"})
    for gpu in gpus:
        gpu["xids"].sort(key=lambda row: (row.get("last") or "", row["xid"]))
    gpus.sort(key=lambda g: (g["index"] is None, g["index"] if g["index"] is not None else 0, g["pci"] or ""))
    return gpus


def not_acted_on(records, acted_class, acted_gpus):
    """The kernel rows a run that acted with `acted_class` on `acted_gpus` (UUIDs or PCI bus IDs; empty: every GPU
    of the node) has not handled: those whose class asks the remediation for something (above device) that is more
    than the action, or that came on another GPU. They stay kept until a run acts on them."""
    wanted = set(acted_gpus or [])
    kept = []
    for row in records:
        if _xid_classes.rank(row["class"]) <= _xid_classes.rank("device"):
            continue
        if _xid_classes.rank(row["class"]) <= _xid_classes.rank(acted_class) and (
            not wanted or row.get("uuid") in wanted or row.get("pci") in wanted
        ):
            continue
        kept.append(dict(row))
    return kept


def write_json(module, path, data, what):
    """Write a JSON file atomically (a temporary file flushed in the same directory, then a rename)."""
    directory = os.path.dirname(path)
    try:
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o755)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpu-faults-")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise FaultsError(f"cannot keep {what} in {directory}: {exc.strerror}.") from None
    module.atomic_move(tmp, path)


def write_cursor(module, state_dir, cursor, time, pending):
    """Keep the place atomically."""
    data = {"cursor": cursor, "time": time, "pending": pending}
    write_json(module, os.path.join(state_dir, CURSOR_FILE), data, "the kernel log place")


def cleared_notice(kind, acted_class, acted_gpus, now):
    """The daemon's notice that an action cleared faults (see the daemon's faults.py, which reads it)."""
    notice = {"class": acted_class, "gpus": sorted(set(acted_gpus or []))}
    if kind == "after_reboot":
        try:
            with open(BOOT_ID_FILE, encoding="ascii") as handle:
                boot = handle.read().strip()
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise FaultsError(f"cannot read the boot ID from {BOOT_ID_FILE}: {reason}.") from None
        if not boot:
            raise FaultsError(f"{BOOT_ID_FILE} is empty: a reboot's notice needs the boot ID.")
        notice["boot"] = boot
    else:
        notice["time"] = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return notice


def add_cleared_notice(module, health_file, notice):
    """Keep the notice with the newest ones before it; notices that cannot be read are replaced."""
    path = health_file + CLEARED_SUFFIX
    try:
        with open(path, encoding="utf-8") as handle:
            old = json.load(handle).get("notices")
    except (OSError, ValueError, AttributeError):
        old = None
    notices = [n for n in old if isinstance(n, dict)] if isinstance(old, list) else []
    notices = [*notices, notice][-KEPT_NOTICES:]
    write_json(module, path, {"version": 1, "notices": notices}, "the daemon's notices")


def journalctl_argv(command):
    """The command with journalctl's -k/--dmesg turned into the kernel transport match: -k implies the current
    boot, even after --after-cursor, and would hide what came before a reboot."""
    return [command[0]] + ["_TRANSPORT=kernel" if arg in ("-k", "--dmesg") else arg for arg in command[1:]]


def _failure(argv, rc, out, err):
    lines = (err or out or "").strip().splitlines()
    detail = ": " + lines[-1].rstrip(".") if lines else ""
    return f"the kernel log command {' '.join(argv)} failed with exit status {rc}{detail}"


def recent_boots(module, argv):
    """The _BOOT_ID matches of the current boot and the one before it, from journalctl --list-boots (JSON where it
    can, else its table); None when it cannot say."""
    listing = [arg for arg in argv if not _MATCH.match(arg)] + ["--list-boots"]
    rc, out, _err = module.run_command(listing, check_rc=False)
    if rc != 0:
        return None
    boots = []
    try:
        parsed = json.loads(out)
        boots = [(int(b["index"]), b["boot_id"]) for b in parsed if isinstance(b, dict) and "boot_id" in b]
    except (ValueError, TypeError, KeyError):
        for line in out.splitlines():
            found = _BOOT_LINE.match(line)
            if found:
                boots.append((int(found.group("index")), found.group("boot")))
    chosen = [boot for index, boot in sorted(boots) if index in (-1, 0)]
    return ["_BOOT_ID=" + boot for boot in chosen] or None


def read_journal(module, argv, start, summary, limit):
    """Read the journal in pages from `start` (--after-cursor=… or --since=…) into `summary`, at most `limit`
    entries. Returns whether all of it was read; FaultsError with journalctl's own words when a page fails."""
    position = list(start)
    while True:
        page = argv + position + ["-n", str(PAGE_ENTRIES)]
        rc, out, err = module.run_command(page, check_rc=False)
        if rc != 0:
            raise FaultsError(_failure(page, rc, out, err))
        count = 0
        for entry in journal_entries(out.splitlines()):
            summary.add_entry(entry)
            count += 1
        if count < PAGE_ENTRIES:
            return True
        if summary.entries >= limit:
            return False
        position = ["--after-cursor=" + summary.last]


def read_kernel_log(module, command, kept, overrides, limit):
    """(summary, the last cursor, its time, whether all was read, a note or None)."""
    # A node without journald (or without the command named) says so in one sentence, not with run_command's error.
    if module.get_bin_path(command[0]) is None and not os.access(command[0], os.X_OK):
        raise FaultsError(
            f"the kernel log command {command[0]} is not on this node: set kernel_log to false"
            " (gpu_remediation_kernel_log) to read the daemon's health file alone, or name the command that prints"
            " the kernel log as journal JSON in kernel_log_command."
        )
    if os.path.basename(command[0]) != "journalctl":
        rc, out, err = module.run_command(list(command), check_rc=False)
        if rc != 0:
            raise FaultsError(_failure(command, rc, out, err) + ".")
        summary, last, last_time = kernel_xids(journal_entries(out.splitlines()), kept.get("cursor"), overrides)
        return summary, last, last_time, True, None
    argv = journalctl_argv(command)
    note = None
    if kept.get("cursor"):
        summary = XidSummary(overrides)
        try:
            complete = read_journal(module, argv, ["--after-cursor=" + kept["cursor"]], summary, limit)
            return summary, summary.last or kept["cursor"], summary.last_time, complete, None
        except FaultsError as exc:
            if summary.entries:
                raise FaultsError(f"{exc}.") from None
            refused = str(exc)
        since = epoch_from_iso(kept.get("time"))
        note = f"journalctl refused the kept place ({refused}), so the kernel log was read "
        if since is not None:
            note += f"from the kept place's time, {kept['time']}"
            summary = XidSummary(overrides)
            try:
                complete = read_journal(module, argv, ["--since=@" + since], summary, limit)
            except FaultsError as exc:
                raise FaultsError(f"{exc}.") from None
            return summary, summary.last, summary.last_time, complete, note
        note += "as if none was kept"
    boots = recent_boots(module, argv)
    window = boots or ["--boot"]
    summary = XidSummary(overrides)
    try:
        complete = read_journal(module, argv + window, ["--since=@0"], summary, limit)
    except FaultsError as exc:
        raise FaultsError(f"{exc}.") from None
    if boots is None:
        extra = "journalctl could not list the boots, so only the current boot was read"
        note = f"{note}; {extra}" if note else extra
    return summary, summary.last, summary.last_time, complete, note


def run_module(module):
    params = module.params
    try:
        overrides = _xid_classes.parse_overrides(params["classes"], "classes")
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    try:
        health = read_health_file(params["health_file"])
        kept, note = read_cursor(params["state_dir"])
        notes = [note] if note else []
        summary, last, last_time, complete = XidSummary(overrides), kept.get("cursor"), kept.get("time"), True
        if params["kernel_log"]:
            if not params["kernel_log_command"]:
                raise FaultsError("kernel_log_command must name a command.")
            summary, read_last, read_time, complete, note = read_kernel_log(
                module, params["kernel_log_command"], kept, overrides, params["kernel_log_max_entries"]
            )
            if note:
                notes.append(note)
            if read_last and read_last != last:
                last, last_time = read_last, read_time
            if not complete:
                notes.append(
                    f"the kernel log had more than {params['kernel_log_max_entries']} entries after the kept place: "
                    f"this run read up to {last_time}, the next one goes on from there"
                )
        for row in kept.get("pending") or []:
            summary.add_row(row)
        records = summary.records()
        gpus = merge(health, records, lambda: nvml_gpus_by_bus(pynvml, params["sysfs_root"]))
        pending = kept.get("pending") or []
        changed = False
        if params["advance_cursor"]:
            pending = not_acted_on(records, params["acted_class"], params["acted_gpus"])
            changed = bool(last) and (last != kept.get("cursor") or pending != (kept.get("pending") or []))
            if changed and not module.check_mode:
                write_cursor(module, params["state_dir"], last, last_time, pending)
        notice = None
        if params["clear_daemon_faults"] != "none":
            notice = cleared_notice(
                params["clear_daemon_faults"],
                params["acted_class"],
                params["acted_gpus"],
                datetime.datetime.now(datetime.timezone.utc),
            )
            changed = True
            if not module.check_mode:
                add_cleared_notice(module, params["health_file"], notice)
    except FaultsError as exc:
        module.fail_json(msg=str(exc))
    for note in notes:
        module.warn(note[0].upper() + note[1:] + ".")
    module.exit_json(
        changed=changed,
        cleared=notice,
        gpus=gpus,
        node_class=_xid_classes.highest(g["class"] for g in gpus),
        since=kept.get("time") if kept.get("cursor") else None,
        cursor=last,
        kernel_log={
            "entries": summary.entries,
            "complete": complete,
            "kept": len(pending),
            "notes": notes,
        },
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
            acted_class=dict(type="str", default="none", choices=list(_xid_classes.CLASSES)),
            acted_gpus=dict(type="list", elements="str", default=[]),
            clear_daemon_faults=dict(type="str", default="none", choices=["none", "now", "after_reboot"]),
            kernel_log=dict(type="bool", default=True),
            kernel_log_command=dict(
                type="list", elements="str", default=["journalctl", "_TRANSPORT=kernel", "-o", "json", "--no-pager"]
            ),
            kernel_log_max_entries=dict(type="int", default=1000000),
            classes=dict(type="dict", default={}),
            sysfs_root=dict(type="path", default="/sys"),
        ),
        supports_check_mode=True,
    )
    if module.params["kernel_log_max_entries"] < 1:
        module.fail_json(msg="kernel_log_max_entries must be 1 or more.")
    if module.params["clear_daemon_faults"] != "none" and module.params["acted_class"] == "none":
        module.fail_json(msg="clear_daemon_faults needs acted_class, the class of the action that cleared the faults.")
    run_or_fail(module, "gpu_faults", run_module)


if __name__ == "__main__":
    main()
