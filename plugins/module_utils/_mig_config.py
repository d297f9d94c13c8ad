# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""MIG configs in the format of NVIDIA's mig-parted (``version: v1``): read, validate, and select the GPUs each
entry of the chosen config names, with the layout it wants for them.

Pure Python, no NVML: the nvidia_mig module reads the GPUs, this file says what each of them should become.

The format: ``version: v1`` and ``mig-configs``, a map of config names to lists of entries. An entry names GPUs
by ``devices`` (``all`` or a list of NVML indexes) and, optionally, ``device-filter`` (one PCI ID or a list of
them, ``0x233010DE`` being device 0x2330 of vendor 0x10DE, with an optional ``:0xSSSSVVVV`` subsystem ID);
``mig-enabled`` says whether MIG mode is on and ``mig-devices`` maps MIG profile names (``1g.10gb``,
``1g.10gb+me``, ``1c.3g.40gb`` for a compute instance of one slice in a 3g.40gb GPU instance) to counts.
"""

from __future__ import annotations

import re

try:
    import yaml

    HAS_YAML = True
    YAML_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by the sanity import test
    HAS_YAML = False
    YAML_IMPORT_ERROR = exc

VERSION = "v1"
TOP_LEVEL_KEYS = ("version", "mig-configs")
ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")

# [<c>c.]<g>g.<gb>gb[+attr,attr | -attr,attr]: the names NVIDIA's libraries give MIG profiles.
_PROFILE = re.compile(
    r"^(?:(?P<c>[0-9]+)c\.)?(?P<g>[0-9]+)g\.(?P<gb>[0-9]+)gb(?P<suffix>[+-][A-Za-z][A-Za-z0-9.]*(?:,[A-Za-z][A-Za-z0-9.]*)*)?$"
)
_PCI_ID = re.compile(r"^(?:0[xX][0-9A-Fa-f]{1,8}|[0-9]+)$")


class MigConfigError(Exception):
    """A config that cannot be used; the message is one sentence naming the config and the entry."""


class Profile:
    """A MIG profile name taken apart: ``c`` compute slices of a GPU instance of ``g`` slices and ``gb`` GB."""

    __slots__ = ("c", "g", "gb", "suffix")

    def __init__(self, c, g, gb, suffix):
        self.c, self.g, self.gb, self.suffix = c, g, gb, suffix

    @property
    def gpu_instance(self):
        """The name of the GPU-instance profile (``3g.40gb`` for ``1c.3g.40gb``)."""
        return f"{self.g}g.{self.gb}gb{self.suffix}"

    @property
    def whole(self):
        """Whether the compute instance takes all of its GPU instance (the plain ``3g.40gb`` form)."""
        return self.c == self.g

    def __str__(self):
        return self.gpu_instance if self.whole else f"{self.c}c.{self.gpu_instance}"


def compute_instance_sizes(gpu_instance_slices):
    """The compute-instance sizes, in slices, a GPU instance of that many slices can hold: all of it, or c
    slices where 2c <= slices + 1 (1c and 2c in a 3g or 4g, up to 4c in a 7g), the rule NVIDIA's own
    libraries use (NVML offers no way to list them before a GPU instance exists)."""
    slices = gpu_instance_slices
    return tuple(c for c in range(1, slices + 1) if c == slices or 2 * c <= slices + 1)


def parse_profile(name):
    """The Profile a name means, or None when it is not a MIG profile name."""
    match = _PROFILE.match(name) if isinstance(name, str) else None
    if match is None:
        return None
    g, gb = int(match.group("g")), int(match.group("gb"))
    c = int(match.group("c")) if match.group("c") is not None else g
    suffix = match.group("suffix") or ""
    attributes = suffix[1:].split(",") if suffix else []
    if g < 1 or gb < 1 or c < 1 or len(set(attributes)) != len(attributes):
        return None
    return Profile(c, g, gb, suffix)


def parse_pci_id(text):
    """(device << 16 | vendor, subsystem or None) of a device-filter string such as ``0x233010DE`` or
    ``0x233010DE:0x16C110DE``; None when malformed."""
    if not isinstance(text, str):
        return None
    parts = text.strip().split(":")
    if len(parts) > 2 or not all(_PCI_ID.match(part) for part in parts):
        return None
    values = [int(part, 0) if part[:2].lower() == "0x" else int(part) for part in parts]
    if any(value > 0xFFFFFFFF for value in values):
        return None
    return values[0], values[1] if len(parts) == 2 else None


def pci_id_text(packed):
    """NVML's pciDeviceId (device << 16 | vendor) as mig-parted writes it: ``0x233010DE``."""
    return f"0x{packed >> 16:04X}{packed & 0xFFFF:04X}"


def load_file(path):
    """The document in a YAML file on this host; MigConfigError with one sentence when it cannot be read."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as exc:
        raise MigConfigError(f"MIG config file {path} cannot be read ({exc.strerror}).") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise MigConfigError(f"MIG config file {path} is not valid YAML{where} ({problem}).") from None


def parse_config(document, config_name, source):
    """The entries of config ``config_name`` in a mig-parted v1 ``document`` (``source`` names it in errors).

    Each entry is a dict: ``number`` (its position), ``devices`` ("all" or a list of indexes), ``filters`` (a
    list of (packed ID, subsystem or None); empty means any GPU), ``mig_enabled`` and ``mig_devices`` (profile
    name -> count, counts of 0 left out). Every config of the document is read the same way, as mig-parted
    reads the whole file, so a malformed entry of another config is refused too (naming that config); whether
    a config's profiles exist on this node's products is checked only for the chosen one (another config of the
    same file may name profiles of other products). A config with no entries names no GPU (mig-parted refuses
    it; the module's own ``previous`` config is empty when nothing changed)."""
    if not isinstance(document, dict):
        raise MigConfigError(f"{source} is not a mig-parted config: it must be a mapping with version and mig-configs.")
    unknown = sorted(str(key) for key in document if key not in TOP_LEVEL_KEYS)
    if unknown:
        raise MigConfigError(
            f"{source} has the unknown key(s) {', '.join(unknown)}; a mig-parted config has version and mig-configs."
        )
    if document.get("version") != VERSION:
        raise MigConfigError(f"{source} has version {document.get('version')!r}; only {VERSION} is understood.")
    configs = document.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigConfigError(f"{source} has no mig-configs mapping of config names to lists of entries.")
    if config_name not in configs:
        names = ", ".join(sorted(str(name) for name in configs))
        raise MigConfigError(f"{source} has no MIG config named {config_name} (it has {names}).")
    parsed = {}
    for name in sorted(configs, key=lambda other: (other != config_name, str(other))):
        entries = configs[name]
        label = f"{source}, MIG config {name}"
        if not isinstance(entries, list):
            raise MigConfigError(f"{label} is not a list of entries.")
        parsed[name] = [_parse_entry(entry, f"{label}, entry {number}", number) for number, entry in enumerate(entries)]
    return parsed[config_name]


def _parse_entry(entry, label, number):
    if not isinstance(entry, dict):
        raise MigConfigError(f"{label} is not a mapping with devices, mig-enabled and mig-devices.")
    unknown = sorted(str(key) for key in entry if key not in ENTRY_KEYS)
    if unknown:
        raise MigConfigError(
            f"{label} has the unknown key(s) {', '.join(unknown)}; an entry has {', '.join(ENTRY_KEYS)}."
        )
    for key in ("devices", "mig-enabled"):
        if key not in entry:
            raise MigConfigError(f"{label} has no {key}.")
    enabled = entry["mig-enabled"]
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{label} has mig-enabled {enabled!r}, which is not true or false.")
    return {
        "number": number,
        "devices": _parse_devices(entry["devices"], label),
        "filters": _parse_filters(entry.get("device-filter"), label),
        "mig_enabled": enabled,
        "mig_devices": _parse_mig_devices(entry, enabled, label),
    }


def _parse_devices(devices, label):
    if devices == "all":
        return "all"
    if isinstance(devices, list) and devices and all(_is_index(index) for index in devices):
        if len(set(devices)) != len(devices):
            raise MigConfigError(f"{label} names a GPU index twice in devices {devices}.")
        return list(devices)
    raise MigConfigError(f"{label} has devices {devices!r}; it must be all or a list of GPU indexes.")


def _is_index(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_filters(device_filter, label):
    if device_filter is None or device_filter == "":
        return []
    texts = device_filter if isinstance(device_filter, list) else [device_filter]
    filters = []
    for text in texts:
        parsed = parse_pci_id(text)
        if parsed is None:
            raise MigConfigError(
                f"{label} has device-filter {text!r}, which is not a PCI ID such as 0x233010DE "
                "(device 0x2330, vendor 0x10DE)."
            )
        filters.append(parsed)
    return filters


def _parse_mig_devices(entry, enabled, label):
    devices = entry.get("mig-devices")
    if devices is None:
        if enabled:
            raise MigConfigError(
                f"{label} has mig-enabled true but no mig-devices ({{}} for MIG mode without devices)."
            )
        return {}
    if not isinstance(devices, dict):
        raise MigConfigError(f"{label} has mig-devices {devices!r}; it must map MIG profile names to counts.")
    wanted = {}
    for name, count in devices.items():
        profile = parse_profile(name)
        if profile is None:
            raise MigConfigError(
                f"{label} has {name!r} in mig-devices, which is not a MIG profile name such as 1g.10gb, "
                "1g.10gb+me or 1c.3g.40gb."
            )
        if not _is_index(count):
            raise MigConfigError(
                f"{label} has the count {count!r} for {name}, which is not a whole number of 0 or more."
            )
        if profile.c > profile.g or profile.c not in compute_instance_sizes(profile.g):
            sizes = ", ".join(f"{c}c" for c in compute_instance_sizes(profile.g))
            raise MigConfigError(
                f"{label} has {name} in mig-devices, but a {profile.g}g GPU instance holds compute instances of "
                f"{sizes} only."
            )
        if count:
            key = str(profile)
            wanted[key] = wanted.get(key, 0) + count
    if devices and not wanted:
        raise MigConfigError(f"{label} has a count of 0 for every profile in mig-devices ({{}} for none).")
    if wanted and not enabled:
        raise MigConfigError(f"{label} lists mig-devices while mig-enabled is false.")
    return wanted


def entry_matches(entry, index, device_id, subsystem_id):
    """Whether an entry names the GPU of this NVML index and PCI IDs (device << 16 | vendor, and subsystem)."""
    if entry["devices"] != "all" and index not in entry["devices"]:
        return False
    if not entry["filters"]:
        return True
    return any(packed == device_id and sub in (None, subsystem_id) for packed, sub in entry["filters"])


def select(entries, gpus, config_label):
    """Per GPU that an entry names, (GPU, entry), in GPU index order; ``gpus`` are dicts with ``index``,
    ``uuid``, ``device_id`` and ``subsystem_id``. GPUs no entry names are left out (left alone). A GPU that two
    entries name is refused with one sentence, as is an entry index that names no GPU of this host."""
    chosen = []
    for gpu in gpus:
        matching = [e for e in entries if entry_matches(e, gpu["index"], gpu["device_id"], gpu["subsystem_id"])]
        if len(matching) > 1:
            numbers = " and ".join(str(e["number"]) for e in matching)
            raise MigConfigError(
                f"{config_label}: GPU {gpu['index']} ({gpu['uuid']}) is named by entries {numbers}; "
                "each GPU may be named by one entry only."
            )
        if matching:
            chosen.append((gpu, matching[0]))
    present = set(gpu["index"] for gpu in gpus)
    for entry in entries:
        if entry["devices"] != "all":
            missing = [index for index in entry["devices"] if index not in present]
            if missing:
                raise MigConfigError(
                    f"{config_label}, entry {entry['number']} names GPU index(es) {missing}, which this host "
                    f"does not have (it has {len(present)} GPU(s))."
                )
    return chosen


def previous_config(gpus):
    """A mig-parted v1 document with one config, ``previous``: per GPU (dicts with ``index`` and a ``before``
    layout) an entry that names it by index with the MIG mode and devices it had."""
    entries = []
    for gpu in gpus:
        entry = {"devices": [gpu["index"]], "mig-enabled": gpu["before"]["mig_enabled"]}
        if gpu["before"]["mig_enabled"]:
            entry["mig-devices"] = dict(gpu["before"]["devices"])
        entries.append(entry)
    return {"version": VERSION, "mig-configs": {"previous": entries}}
