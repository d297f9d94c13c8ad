# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated-GPU spec format (docs/simulated-gpus.md): its keys, defaults and validation messages.

Labs and CI only: nothing in a spec is checked against hardware. Every rule violation is reported
as one sentence that names the file and, where there is one, the GPU. The one reader of the format:
the nvidia_gpu_info module and the bundled daemon (which carries this file as
gpu_device_plugin/_shared/simulated_spec.py, docs/architecture.md) both parse specs here, and
_gpu_discovery.facts_from_spec turns the result into GPU facts. It therefore imports nothing from Ansible.
"""

import hashlib
import re

try:
    import yaml

    HAS_YAML = True
    YAML_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by the sanity import test
    yaml = None
    HAS_YAML = False
    YAML_IMPORT_ERROR = exc

TOP_LEVEL_KEYS = ("driver_version", "cuda_driver_version", "gpus")
# The loaded kernel module's version, where it is not the library's (driver_version): NVML's nvmlInit then fails
# with NVML_ERROR_LIB_RM_VERSION_MISMATCH, as after new driver packages over the old module.
# The host's NVSwitch PCI functions (an HGX board's), each with its PCI device ID: gpuops.k8s.nvidia_gpu_info
# returns them in nvswitch_devices, as the sysfs scan would (docs/nvlink-fabric.md).
OPTIONAL_TOP_LEVEL_KEYS = ("kernel_module_version", "nvswitches")
NVSWITCH_REQUIRED_KEYS = ("pci_bus_id", "device_id")
NVSWITCH_OPTIONAL_KEYS = ("numa_node",)
GPU_REQUIRED_KEYS = ("uuid", "name", "memory_mib", "pci_bus_id", "compute_capability")
GPU_OPTIONAL_KEYS = (
    "numa_node",
    "pcie_switch",
    "nvlink_peers",
    "persistence_mode",
    "minor_number",
    "xid",
    "lost",
    "mig_mode",
    "mig_devices",
    "pci_device_id",
    "readings",
)
MIG_DEVICE_KEYS = ("uuid", "profile", "memory_mib")
MIG_MODES = ("enabled", "disabled", "unsupported")

_MAJOR_MINOR = re.compile(r"^[0-9]+\.[0-9]+$")
_PCI_BUS_ID = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_PCI_DEVICE_ID = re.compile(r"^0x[0-9a-fA-F]{4}$")


class SpecError(Exception):
    """A simulated-GPU spec breaks a rule; the message is one sentence naming the file and GPU."""


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value):
    return isinstance(value, str)


def _gpu_label(index, raw):
    uuid = raw.get("uuid") if isinstance(raw, dict) else None
    if _is_str(uuid):
        return f"GPU {index} ({uuid})"
    return f"GPU {index}"


def load_spec(path):
    """Read and validate the spec at ``path``; return its normalised content (see parse_spec)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise SpecError(f"Simulated-GPU spec {path} cannot be read: {reason}.") from None
    return parse_spec_text(text, path)


def parse_spec_text(text, path):
    """Validate the YAML ``text`` of a spec (read from ``path``, which the messages name)."""
    if not HAS_YAML:
        raise RuntimeError("PyYAML is required to read a simulated-GPU spec")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecError(f"Simulated-GPU spec {path} is not valid YAML{where}: {problem}.") from None
    return parse_spec(data, path)


def parse_spec(data, path):
    """Validate already-loaded spec ``data`` (from file ``path``).

    Returns driver_version, cuda_driver_version and gpus: per GPU every key of the format with its
    default filled in, the PCI bus ID in lower case, and nvlink_peers made symmetric (in index order); and
    kernel_module_version and nvswitches where the spec gives them.
    """
    if not isinstance(data, dict):
        raise SpecError(f"Simulated-GPU spec {path} must be a YAML mapping at the top level.")
    for key in sorted(data, key=str):
        if key not in TOP_LEVEL_KEYS + OPTIONAL_TOP_LEVEL_KEYS:
            raise SpecError(f"Simulated-GPU spec {path} has unknown top-level key '{key}'.")
    for key in TOP_LEVEL_KEYS:
        if key not in data:
            raise SpecError(f"Simulated-GPU spec {path} lacks the required key '{key}'.")
    if not _is_str(data["driver_version"]) or not data["driver_version"]:
        raise SpecError(f"Simulated-GPU spec {path}: driver_version must be a non-empty string.")
    cuda = data["cuda_driver_version"]
    if not _is_str(cuda) or not _MAJOR_MINOR.match(cuda):
        raise SpecError(f'Simulated-GPU spec {path}: cuda_driver_version must be a string "MAJOR.MINOR", not {cuda!r}.')
    if not isinstance(data["gpus"], list):
        raise SpecError(f"Simulated-GPU spec {path}: gpus must be a list.")
    module = data.get("kernel_module_version", data["driver_version"])
    if not _is_str(module) or not module:
        raise SpecError(f"Simulated-GPU spec {path}: kernel_module_version must be a non-empty string.")

    gpus = []
    seen_uuids = {}
    seen_bus_ids = {}
    for index, raw in enumerate(data["gpus"]):
        gpu = _parse_gpu(raw, index, path, seen_uuids, seen_bus_ids)
        gpus.append(gpu)

    _resolve_peers(gpus, path)
    nvswitches = _parse_nvswitches(data.get("nvswitches", []), path, seen_bus_ids)
    spec = {
        "driver_version": data["driver_version"],
        "cuda_driver_version": cuda,
        "gpus": gpus,
    }
    if module != data["driver_version"]:
        spec["kernel_module_version"] = module
    if nvswitches:
        spec["nvswitches"] = nvswitches
    return spec


def _parse_nvswitches(raw, path, seen_bus_ids):
    """The spec's NVSwitch PCI functions: bus ID and device ID in lower case, numa_node None where not given."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SpecError(f"Simulated-GPU spec {path}: nvswitches must be a list.")
    switches = []
    for index, entry in enumerate(raw):
        where = f"Simulated-GPU spec {path}, NVSwitch {index}"
        if not isinstance(entry, dict):
            raise SpecError(f"{where}: each entry of nvswitches must be a mapping.")
        for key in sorted(entry, key=str):
            if key not in NVSWITCH_REQUIRED_KEYS + NVSWITCH_OPTIONAL_KEYS:
                raise SpecError(f"{where}: unknown key '{key}'.")
        for key in NVSWITCH_REQUIRED_KEYS:
            if key not in entry:
                raise SpecError(f"{where}: the required key '{key}' is missing.")
        bus_id = entry["pci_bus_id"]
        if not _is_str(bus_id) or not _PCI_BUS_ID.match(bus_id):
            raise SpecError(f"{where}: pci_bus_id must be a string DDDD:BB:DD.F, not {bus_id!r}.")
        bus_id = bus_id.lower()
        if bus_id in seen_bus_ids:
            raise SpecError(f"{where}: pci_bus_id {bus_id} is already used by {seen_bus_ids[bus_id]}.")
        seen_bus_ids[bus_id] = f"NVSwitch {index}"
        device_id = entry["device_id"]
        if not _is_str(device_id) or not _PCI_DEVICE_ID.match(device_id):
            raise SpecError(f'{where}: device_id must be a string "0xNNNN" (four hex digits), not {device_id!r}.')
        numa_node = entry.get("numa_node")
        if numa_node is not None and not _is_int(numa_node):
            raise SpecError(f"{where}: numa_node must be an integer or null.")
        switches.append({"pci_bus_id": bus_id, "device_id": device_id.lower(), "numa_node": numa_node})
    return switches


def _parse_gpu(raw, index, path, seen_uuids, seen_bus_ids):
    label = _gpu_label(index, raw)

    def fail(message):
        raise SpecError(f"Simulated-GPU spec {path}, {label}: {message}.")

    if not isinstance(raw, dict):
        fail("each entry of gpus must be a mapping")
    for key in sorted(raw, key=str):
        if key not in GPU_REQUIRED_KEYS and key not in GPU_OPTIONAL_KEYS:
            fail(f"unknown key '{key}'")
    for key in GPU_REQUIRED_KEYS:
        if key not in raw:
            fail(f"the required key '{key}' is missing")

    uuid = raw["uuid"]
    if not _is_str(uuid) or not uuid.startswith("GPU-"):
        fail('uuid must be a string starting with "GPU-"')
    if uuid in seen_uuids:
        fail(f"uuid {uuid} is already used by {seen_uuids[uuid]}")
    seen_uuids[uuid] = f"GPU {index}"

    if not _is_str(raw["name"]) or not raw["name"]:
        fail("name must be a non-empty string")
    if not _is_int(raw["memory_mib"]) or raw["memory_mib"] <= 0:
        fail("memory_mib must be a positive integer")

    bus_id = raw["pci_bus_id"]
    if not _is_str(bus_id) or not _PCI_BUS_ID.match(bus_id):
        fail(f"pci_bus_id must be a string DDDD:BB:DD.F, not {bus_id!r}")
    bus_id = bus_id.lower()
    if bus_id in seen_bus_ids:
        fail(f"pci_bus_id {bus_id} is already used by {seen_bus_ids[bus_id]}")
    seen_bus_ids[bus_id] = f"GPU {index}"

    capability = raw["compute_capability"]
    if not _is_str(capability) or not _MAJOR_MINOR.match(capability):
        fail(f'compute_capability must be a string "MAJOR.MINOR", not {capability!r}')

    numa_node = raw.get("numa_node")
    if numa_node is not None and not _is_int(numa_node):
        fail("numa_node must be an integer or null")

    pci_device_id = raw.get("pci_device_id")
    if pci_device_id is not None and (not _is_str(pci_device_id) or not _PCI_DEVICE_ID.match(pci_device_id)):
        fail(f'pci_device_id must be a string "0xNNNN" (four hex digits), not {pci_device_id!r}')

    pcie_switch = raw.get("pcie_switch")
    if pcie_switch is not None and not _is_str(pcie_switch):
        fail("pcie_switch must be a string")

    peers = raw.get("nvlink_peers", [])
    if peers is None:
        peers = []
    if not isinstance(peers, list) or not all(_is_str(peer) for peer in peers):
        fail("nvlink_peers must be a list of GPU UUIDs")

    persistence_mode = raw.get("persistence_mode", True)
    if not isinstance(persistence_mode, bool):
        fail("persistence_mode must be true or false")

    minor_number = raw.get("minor_number", index)
    if not _is_int(minor_number) or minor_number < 0:
        fail("minor_number must be a non-negative integer")

    xid = raw.get("xid")
    if xid is not None and (not _is_int(xid) or xid <= 0):
        fail("xid must be a positive integer")
    if "lost" in raw and not isinstance(raw["lost"], bool):
        fail("lost must be true or false")

    mig_mode = raw.get("mig_mode", "disabled")
    if mig_mode not in MIG_MODES:
        fail(f"mig_mode must be one of enabled, disabled, unsupported, not {mig_mode!r}")

    mig_devices = []
    if "mig_devices" in raw:
        if mig_mode != "enabled":
            fail(f"mig_devices is only allowed with mig_mode: enabled (mig_mode is {mig_mode})")
        if not isinstance(raw["mig_devices"], list):
            fail("mig_devices must be a list")
        for mig_index, mig in enumerate(raw["mig_devices"]):
            device = _parse_mig_device(mig, mig_index, fail, seen_uuids, index)
            device.update(mig_device_attributes(raw["name"], device["profile"]))
            mig_devices.append(device)
        placements = _mig_placements({"index": index, "uuid": uuid, "name": raw["name"], "mig_devices": mig_devices})
        for device, placement in zip(mig_devices, placements):
            device.update(placement)

    return {
        "index": index,
        "uuid": uuid,
        "name": raw["name"],
        "pci_bus_id": bus_id,
        "memory_mib": raw["memory_mib"],
        "compute_capability": capability,
        "numa_node": numa_node,
        "persistence_mode": persistence_mode,
        "mig_mode": mig_mode,
        "mig_devices": mig_devices,
        "minor_number": minor_number,
        "nvlink_peers": list(peers),
        "pcie_switch": pcie_switch,
        "xid": xid,
        "lost": raw.get("lost", False),
        "pci_device_id": pci_device_id.lower() if pci_device_id else None,
        "brand": spec_brand(raw["name"]),
        # A simulated GPU has no PCI device in sysfs, so no root complex is known.
        "pcie_root": None,
        "readings": _parse_readings(raw, fail),
    }


def _parse_mig_device(mig, mig_index, fail, seen_uuids, gpu_index):
    where = f"MIG device {mig_index}"
    if not isinstance(mig, dict):
        fail(f"{where} must be a mapping")
    for key in sorted(mig, key=str):
        if key not in MIG_DEVICE_KEYS:
            fail(f"{where} has unknown key '{key}'")
    for key in MIG_DEVICE_KEYS:
        if key not in mig:
            fail(f"{where} lacks the required key '{key}'")
    if not _is_str(mig["uuid"]) or not mig["uuid"].startswith("MIG-"):
        fail(f'{where}: uuid must be a string starting with "MIG-"')
    if mig["uuid"] in seen_uuids:
        fail("{}: uuid {} is already used by {}".format(where, mig["uuid"], seen_uuids[mig["uuid"]]))
    seen_uuids[mig["uuid"]] = f"GPU {gpu_index} {where}"
    if not _is_str(mig["profile"]) or not mig["profile"]:
        fail(f"{where}: profile must be a non-empty string")
    if not _is_int(mig["memory_mib"]) or mig["memory_mib"] <= 0:
        fail(f"{where}: memory_mib must be a positive integer")
    return {"uuid": mig["uuid"], "profile": mig["profile"], "memory_mib": mig["memory_mib"]}


def _resolve_peers(gpus, path):
    """Check that every peer is a GPU of this file and make the relation symmetric."""
    by_uuid = dict((gpu["uuid"], gpu) for gpu in gpus)
    links = dict((gpu["uuid"], set()) for gpu in gpus)
    for gpu in gpus:
        for peer in gpu["nvlink_peers"]:
            if peer == gpu["uuid"]:
                raise SpecError(
                    f"Simulated-GPU spec {path}, GPU {gpu['index']} ({gpu['uuid']}): nvlink_peers names the GPU itself."
                )
            if peer not in by_uuid:
                raise SpecError(
                    f"Simulated-GPU spec {path}, GPU {gpu['index']} ({gpu['uuid']}): nvlink_peers names {peer}, "
                    "which is not a GPU in this file."
                )
            links[gpu["uuid"]].add(peer)
            links[peer].add(gpu["uuid"])
    for gpu in gpus:
        gpu["nvlink_peers"] = [other["uuid"] for other in gpus if other["uuid"] in links[gpu["uuid"]]]


# ---------------------------------------------------------------------------------------------
# The mock NVML library's state (labs and CI only; tests/mock_nvml/, docs/mock-nvml.md)

MOCK_NVML_FORMAT = "gpuops-mock-nvml 2"

# PCI device IDs (NVML's pciDeviceId: device << 16 | vendor 0x10de) of the products the lab's specs name.
_PCI_DEVICE_IDS = {
    "NVIDIA H100 80GB HBM3": 0x2330,
    "NVIDIA H100 PCIe": 0x2331,
    "NVIDIA H100 NVL": 0x2321,
    "NVIDIA H200": 0x2335,
    "NVIDIA A100-SXM4-40GB": 0x20B0,
    "NVIDIA A100-SXM4-80GB": 0x20B2,
    "NVIDIA A100 80GB PCIe": 0x20B5,
    "NVIDIA A100-PCIE-40GB": 0x20F1,
    "NVIDIA L4": 0x27B8,
    "Tesla T4": 0x1EB8,
    "Tesla V100-SXM2-16GB": 0x1DB1,
}
# nvmlDeviceArchitecture_t by compute capability major (7.5 is Turing, 8.9 Ada).
_NVML_ARCHITECTURES = {3: 2, 5: 3, 6: 4, 7: 5, 8: 7, 9: 9, 10: 10, 12: 10}
_NVML_BRAND_TESLA = 2
_NVML_BRAND_NVIDIA = 14
# The readings the mock NVML library gives for a GPU (labs and CI only; docs/mock-nvml.md), each a non-negative
# integer in the unit its name ends with: an idle GPU unless the spec's `readings` mapping sets some of them.
# memory_temperature_c is absent by default (NVML answers NOT_SUPPORTED for NVML_FI_DEV_MEMORY_TEMP, as on a GPU
# without an HBM sensor); a spec sets it for a GPU that has one. energy_mj counts from the driver's load.
MOCK_NVML_READINGS = {
    "temperature_c": 34,
    "memory_temperature_c": None,
    "power_mw": 68000,
    "power_limit_mw": 700000,
    "energy_mj": 0,
    "gpu_utilization_pct": 0,
    "memory_utilization_pct": 0,
    "encoder_utilization_pct": 0,
    "decoder_utilization_pct": 0,
    "graphics_clock_mhz": 345,
    "sm_clock_mhz": 345,
    "memory_clock_mhz": 2619,
    "video_clock_mhz": 765,
    "ecc_corrected": 0,
    "ecc_uncorrected": 0,
    "pcie_replays": 0,
    "memory_used_mib": 0,
    "memory_reserved_mib": 0,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "remap_pending": 0,
    "remap_failure": 0,
    # What NVML's GPM metrics give between two samples (Hopper and newer): the graphics engine's, the HMMA tensor
    # pipe's and the DRAM bandwidth's activity in %, and PCIe traffic in MiB/s.
    "gpm_graphics_util_pct": 0,
    "gpm_tensor_util_pct": 0,
    "gpm_dram_bw_util_pct": 0,
    "gpm_pcie_tx_mib_per_s": 0,
    "gpm_pcie_rx_mib_per_s": 0,
    # NVLink data sent and received over all the GPU's links, in KiB/s (a GPU with nvlink_peers): NVML's counters
    # of it (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and _RX, KiB) grow at these rates.
    "nvlink_tx_kib_per_s": 0,
    "nvlink_rx_kib_per_s": 0,
}
_PERCENT_READINGS = tuple(key for key in MOCK_NVML_READINGS if key.endswith("_pct"))
_FLAG_READINGS = ("remap_pending", "remap_failure")


def _parse_readings(raw, fail):
    """The GPU's readings: the defaults above with the spec's `readings` over them."""
    readings = dict(MOCK_NVML_READINGS)
    given = raw.get("readings")
    if given is None:
        return readings
    if not isinstance(given, dict):
        fail("readings must be a mapping")
    for key in sorted(given, key=str):
        if key not in MOCK_NVML_READINGS:
            fail(f"readings has unknown key '{key}'")
        value = given[key]
        if not _is_int(value) or value < 0:
            fail(f"readings.{key} must be a non-negative integer")
        if key in _PERCENT_READINGS and value > 100:
            fail(f"readings.{key} is a percentage, at most 100")
        if key in _FLAG_READINGS and value > 1:
            fail(f"readings.{key} must be 0 or 1")
        readings[key] = value
    if readings["memory_used_mib"] + readings["memory_reserved_mib"] > raw["memory_mib"]:
        fail("readings.memory_used_mib and memory_reserved_mib together exceed memory_mib")
    return readings


def _readings_state_lines(readings):
    """The state lines of a GPU's readings, in the form the library reads (tests/mock_nvml/mock_nvml.c)."""
    r = readings
    lines = [
        f"temperature_c {r['temperature_c']}",
        f"power_mw {r['power_mw']} {r['power_limit_mw']}",
        f"utilization {r['gpu_utilization_pct']} {r['memory_utilization_pct']}",
        f"codec_utilization {r['encoder_utilization_pct']} {r['decoder_utilization_pct']}",
        f"clocks_mhz {r['graphics_clock_mhz']} {r['sm_clock_mhz']} {r['memory_clock_mhz']} {r['video_clock_mhz']}",
        f"ecc_errors {r['ecc_corrected']} {r['ecc_uncorrected']}",
        f"energy_mj {r['energy_mj']}",
        f"pcie_replays {r['pcie_replays']}",
        f"memory_use_mib {r['memory_used_mib']} {r['memory_reserved_mib']}",
        "remapped_rows {} {} {} {}".format(
            r["remapped_rows_correctable"], r["remapped_rows_uncorrectable"], r["remap_pending"], r["remap_failure"]
        ),
        "gpm {} {} {} {} {}".format(
            r["gpm_graphics_util_pct"],
            r["gpm_tensor_util_pct"],
            r["gpm_dram_bw_util_pct"],
            r["gpm_pcie_tx_mib_per_s"],
            r["gpm_pcie_rx_mib_per_s"],
        ),
        f"nvlink_kib_per_s {r['nvlink_tx_kib_per_s']} {r['nvlink_rx_kib_per_s']}",
    ]
    if r["memory_temperature_c"] is not None:
        lines.append(f"memory_temperature_c {r['memory_temperature_c']}")
    return lines


# MIG as the mock NVML library models it (labs and CI only; docs/mock-nvml.md). Per product: NVIDIA's
# GPU-instance profiles as `nvidia-smi mig -lgip` lists them and the MIG user guide tables them, and their
# placements as `nvidia-smi mig -lgipp` lists them (the first memory slice of each; a GPU has 8 memory slices
# and 7 compute slices). Each row: NVML_GPU_INSTANCE_PROFILE_* (the index NVML's profile calls take), NVIDIA's
# profile ID (the one NVML creates GPU instances by and reports them with), name, compute slices,
# instances, memory MiB, SMs, copy engines, decoders, encoders, JPEG engines, OFA engines, memory slices,
# placements. The MiB vary a little between driver releases; these are one release's.
_MIG_PLACEMENTS_1 = (0, 1, 2, 3, 4, 5, 6)
_MIG_A100_40GB = (
    (0, 19, "1g.5gb", 1, 7, 4864, 14, 1, 0, 0, 0, 0, 1, _MIG_PLACEMENTS_1),
    (7, 20, "1g.5gb+me", 1, 1, 4864, 14, 1, 1, 0, 1, 1, 1, _MIG_PLACEMENTS_1),
    (9, 15, "1g.10gb", 1, 4, 9856, 14, 1, 1, 0, 0, 0, 2, (0, 2, 4, 6)),
    (1, 14, "2g.10gb", 2, 3, 9856, 28, 2, 1, 0, 0, 0, 2, (0, 2, 4)),
    (2, 9, "3g.20gb", 3, 2, 19968, 42, 3, 2, 0, 0, 0, 4, (0, 4)),
    (3, 5, "4g.20gb", 4, 1, 19968, 56, 4, 2, 0, 0, 0, 4, (0,)),
    (4, 0, "7g.40gb", 7, 1, 40192, 98, 7, 5, 0, 1, 1, 8, (0,)),
)
_MIG_A100_80GB = (
    (0, 19, "1g.10gb", 1, 7, 9728, 14, 1, 0, 0, 0, 0, 1, _MIG_PLACEMENTS_1),
    (7, 20, "1g.10gb+me", 1, 1, 9728, 14, 1, 1, 0, 1, 1, 1, _MIG_PLACEMENTS_1),
    (9, 15, "1g.20gb", 1, 4, 19968, 14, 1, 1, 0, 0, 0, 2, (0, 2, 4, 6)),
    (1, 14, "2g.20gb", 2, 3, 19968, 28, 2, 1, 0, 0, 0, 2, (0, 2, 4)),
    (2, 9, "3g.40gb", 3, 2, 40192, 42, 3, 2, 0, 0, 0, 4, (0, 4)),
    (3, 5, "4g.40gb", 4, 1, 40192, 56, 4, 2, 0, 0, 0, 4, (0,)),
    (4, 0, "7g.80gb", 7, 1, 80896, 98, 7, 5, 0, 1, 1, 8, (0,)),
)
_MIG_H100_80GB = (
    (0, 19, "1g.10gb", 1, 7, 9984, 16, 1, 1, 0, 1, 0, 1, _MIG_PLACEMENTS_1),
    (7, 20, "1g.10gb+me", 1, 1, 9984, 16, 1, 1, 0, 1, 1, 1, _MIG_PLACEMENTS_1),
    (9, 15, "1g.20gb", 1, 4, 20096, 26, 1, 1, 0, 1, 0, 2, (0, 2, 4, 6)),
    (1, 14, "2g.20gb", 2, 3, 20096, 32, 2, 2, 0, 2, 0, 2, (0, 2, 4)),
    (2, 9, "3g.40gb", 3, 2, 40448, 60, 3, 3, 0, 3, 0, 4, (0, 4)),
    (3, 5, "4g.40gb", 4, 1, 40448, 64, 4, 4, 0, 4, 0, 4, (0,)),
    (4, 0, "7g.80gb", 7, 1, 81152, 132, 8, 7, 0, 7, 1, 8, (0,)),
)
# The H100 NVL (94 GB; device ID 0x2321 in NVIDIA/open-gpu-kernel-modules' README, "Compatible GPUs"):
# `nvidia-smi mig -lgip` and `-lgipp` as listed on one under driver 560.35.03 (github.com/AlizeeChen11/mig-and-mps,
# mig/README.md at 2f332263): the MiB of 1g.12gb, 1g.24gb and 3g.47gb as its MIG devices there report them,
# 7g.94gb's from the listing's 93.12 GiB (95360 MiB, the nearest 128 MiB).
_MIG_H100_NVL = (
    (0, 19, "1g.12gb", 1, 7, 11008, 16, 1, 1, 0, 1, 0, 1, _MIG_PLACEMENTS_1),
    (7, 20, "1g.12gb+me", 1, 1, 11008, 16, 1, 1, 0, 1, 1, 1, _MIG_PLACEMENTS_1),
    (9, 15, "1g.24gb", 1, 4, 22144, 26, 1, 1, 0, 1, 0, 2, (0, 2, 4, 6)),
    (1, 14, "2g.24gb", 2, 3, 22144, 32, 2, 2, 0, 2, 0, 2, (0, 2, 4)),
    (2, 9, "3g.47gb", 3, 2, 47488, 60, 3, 3, 0, 3, 0, 4, (0, 4)),
    (3, 5, "4g.47gb", 4, 1, 47488, 64, 4, 4, 0, 4, 0, 4, (0,)),
    (4, 0, "7g.94gb", 7, 1, 95360, 132, 8, 7, 0, 7, 1, 8, (0,)),
)
# The H200's 1g.35gb has the memory of its 2g.35gb, and its 3g.71gb and 4g.71gb twice that and 256 MiB, as
# the H100's and A100's listings have it; their SMs are those of the H100's profiles of the same slices.
_MIG_H200 = (
    (0, 19, "1g.18gb", 1, 7, 16384, 16, 1, 1, 0, 1, 0, 1, _MIG_PLACEMENTS_1),
    (7, 20, "1g.18gb+me", 1, 1, 16384, 16, 1, 1, 0, 1, 1, 1, _MIG_PLACEMENTS_1),
    (9, 15, "1g.35gb", 1, 4, 33280, 26, 1, 1, 0, 1, 0, 2, (0, 2, 4, 6)),
    (1, 14, "2g.35gb", 2, 3, 33280, 32, 2, 2, 0, 2, 0, 2, (0, 2, 4)),
    (2, 9, "3g.71gb", 3, 2, 66816, 60, 3, 3, 0, 3, 0, 4, (0, 4)),
    (3, 5, "4g.71gb", 4, 1, 66816, 64, 4, 4, 0, 4, 0, 4, (0,)),
    (4, 0, "7g.141gb", 7, 1, 143360, 132, 8, 7, 0, 7, 1, 8, (0,)),
)
MIG_PRODUCTS = {
    "NVIDIA A100-SXM4-40GB": _MIG_A100_40GB,
    "NVIDIA A100-PCIE-40GB": _MIG_A100_40GB,
    "NVIDIA A100-SXM4-80GB": _MIG_A100_80GB,
    "NVIDIA A100 80GB PCIe": _MIG_A100_80GB,
    "NVIDIA H100 80GB HBM3": _MIG_H100_80GB,
    "NVIDIA H100 NVL": _MIG_H100_NVL,
    "NVIDIA H200": _MIG_H200,
}
MIG_MEMORY_SLICES = 8
MIG_COMPUTE_SLICES = 7
# Compute instances: the slices a compute instance of a GPU instance may have (by the GPU instance's slices, as
# NVIDIA's mig-parted knows them: 1c.4g, 2c.4g and 4c.4g, no 3c.4g), and NVML_COMPUTE_INSTANCE_PROFILE_*
# by slices (NVML numbers compute-instance profiles by that index; 1c.3g.20gb is ID 0).
_MIG_CI_SLICES = {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 4), 7: (1, 2, 3, 4, 7)}
_MIG_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
_MIG_DEVICE_NAME = re.compile(r"^(?:(?P<ci>[0-9]+)c\.)?(?P<gi>[0-9]+g\.[0-9]+gb(?:\+me)?)$")


def _mig_ci_profiles(table):
    """Per GPU-instance profile: its compute-instance profiles as (NVML index, slices, instances, SMs, starts).

    A compute instance of c slices starts on a multiple of the power of two at or above c (a 3c in a 7g at 0
    or 4); one as large as its GPU instance has the GPU instance's SMs, a smaller one those of the product's
    GPU instance of c slices."""
    plain_sms = dict((row[3], row[6]) for row in table if row[0] in (0, 1, 2, 3, 4))
    result = {}
    for row in table:
        slices, sms = row[3], row[6]
        profiles = []
        for ci in _MIG_CI_SLICES[slices]:
            align = 1 << (ci - 1).bit_length()
            starts = tuple(start for start in range(0, slices, align) if start + ci <= slices)
            profiles.append((_MIG_CI_PROFILE[ci], ci, len(starts), sms if ci == slices else plain_sms[ci], starts))
        result[row[0]] = profiles
    return result


# The facts NVML's device attributes give of a MIG device (as _gpu_discovery.MIG_ATTRIBUTE_FACTS names them).
MIG_ATTRIBUTE_KEYS = (
    "multiprocessors",
    "gpu_instance_slices",
    "compute_instance_slices",
    "copy_engines",
    "decoders",
    "encoders",
    "jpeg_engines",
    "ofa_engines",
)


def mig_device_attributes(gpu_name, profile):
    """What the mock NVML library's device attributes say of a MIG device of this profile on this product: the SMs
    of its compute instance, the slices of its GPU and compute instance, and its GPU instance's shared engines.
    None each for a product or profile the library does not model (NVML's answer cannot be known)."""
    table = MIG_PRODUCTS.get(gpu_name)
    match = _MIG_DEVICE_NAME.match(profile) if table is not None else None
    row = next((r for r in table if r[2] == match.group("gi")), None) if match else None
    if row is None:
        return dict.fromkeys(MIG_ATTRIBUTE_KEYS)
    ci_slices = int(match.group("ci") or row[3])
    ci_profile = next((p for p in _mig_ci_profiles(table)[row[0]] if p[1] == ci_slices), None)
    if ci_profile is None:
        return dict.fromkeys(MIG_ATTRIBUTE_KEYS)
    values = (ci_profile[3], row[3], ci_slices, *row[7:12])
    return dict(zip(MIG_ATTRIBUTE_KEYS, values))


def spec_brand(name):
    """The brand NVML gives a simulated GPU (as NVIDIA's go-nvlib names it): Tesla for the products named Tesla, else
    Nvidia, as NVML answers for the data-centre GPUs the lab simulates."""
    return "Tesla" if name.startswith("Tesla") else "Nvidia"


def _mig_placements(gpu):
    """Per declared MIG device: where the mock NVML library places it (gpu_instance_profile_id, placement_start,
    placement_size, as _gpu_discovery.MIG_PLACEMENT_KEYS names them); None each where the library does not model
    the product or the layout does not fit (the library's state then refuses the spec)."""
    keys = ("gpu_instance_profile_id", "placement_start", "placement_size")
    try:
        placed = _mig_seed_layout(gpu, "<spec>")
    except SpecError:
        return [dict.fromkeys(keys) for _mig in gpu["mig_devices"]]
    return [dict(zip(keys, (row[1], start, row[12]))) for row, start, _ci, _ci_start in placed]


def _mig_seed_layout(gpu, path):
    """The declared MIG devices of a GPU placed as the mock NVML library serves them: per device (GPU-instance
    profile row, memory-slice start, NVML compute-instance profile index, compute-slice start). Each device is
    one compute instance in a GPU instance of its own, at the lowest free placement of its profile, in the order
    listed; a profile the product does not offer, or a device that does not fit, is an error naming both."""
    label = "Simulated-GPU spec {}, GPU {} ({})".format(path, gpu["index"], gpu["uuid"])
    table = MIG_PRODUCTS.get(gpu["name"])
    if not gpu["mig_devices"]:
        return []
    if table is None:
        raise SpecError(
            "{}: the mock NVML library models MIG on {} only, not on {}.".format(
                label, ", ".join(sorted(MIG_PRODUCTS)), gpu["name"]
            )
        )
    by_name = dict((row[2], row) for row in table)
    ci_profiles = _mig_ci_profiles(table)
    used = []  # (start, size) of the memory slices taken
    counts = {}
    placed = []
    for index, mig in enumerate(gpu["mig_devices"]):
        match = _MIG_DEVICE_NAME.match(mig["profile"])
        row = by_name.get(match.group("gi")) if match else None
        ci = int(match.group("ci") or 0) if row else 0
        ci_profile = next((p for p in ci_profiles[row[0]] if p[1] == (ci or row[3])), None) if row else None
        if row is None or ci_profile is None or (ci and ci == row[3]):
            offered = [r[2] for r in table]
            raise SpecError(
                "{}: MIG device {} has profile {}, which an {} does not offer (it offers {}).".format(
                    label, index, mig["profile"], gpu["name"], ", ".join(offered)
                )
            )
        size = row[12]
        free = [s for s in row[13] if all(s + size <= u or u + n <= s for u, n in used)]
        if counts.get(row[2], 0) >= row[4] or not free:
            raise SpecError(
                "{}: MIG device {} ({}) does not fit on the {} beside the MIG devices listed before it.".format(
                    label, index, mig["profile"], gpu["name"]
                )
            )
        counts[row[2]] = counts.get(row[2], 0) + 1
        used.append((free[0], size))
        placed.append((row, free[0], ci_profile[0], ci_profile[4][0]))
    return placed


def _nvml_architecture(capability):
    major, minor = (int(part) for part in capability.split("."))
    if (major, minor) == (7, 5):
        return 6
    if (major, minor) == (8, 9):
        return 8
    return _NVML_ARCHITECTURES.get(major, 0xFFFFFFFF)


def _nvml_cuda_version(text):
    major, minor = (int(part) for part in text.split("."))
    return major * 1000 + minor * 10


def mock_nvml_state_text(spec, path="<spec>"):
    """The mock NVML library's state for a spec (as parse_spec returns it): one `key value` line each.

    The library serves exactly this; everything it knows of the GPUs comes from here, so the spec reader
    stays the one reader of the spec format.
    """
    by_uuid = dict((gpu["uuid"], gpu["index"]) for gpu in spec["gpus"])
    cuda = spec["cuda_driver_version"]
    lines = [
        "# Written from a simulated-GPU spec for the mock libnvidia-ml.so.1 (labs and CI only).",
        "format " + MOCK_NVML_FORMAT,
        "driver_version " + spec["driver_version"],
        "nvml_version {}.{}".format(cuda.split(".")[0], spec["driver_version"]),
        f"cuda_driver_version {_nvml_cuda_version(cuda)}",
    ]
    if spec.get("kernel_module_version", spec["driver_version"]) != spec["driver_version"]:
        lines.append("kernel_module_version " + spec["kernel_module_version"])
    for gpu in spec["gpus"]:
        device_id = _PCI_DEVICE_IDS.get(gpu["name"], 0)
        numa = gpu["numa_node"]
        affinity = (0xFFFFFFFF << (32 * numa)) if numa is not None and numa < 2 else 0xFFFFFFFFFFFFFFFF
        lines += [
            "gpu {}".format(gpu["index"]),
            "uuid " + gpu["uuid"],
            "name " + gpu["name"],
            "serial 1{:012d}".format(int(gpu["uuid"].replace("-", "")[-8:], 16) % 10**12),
            "pci_bus_id " + gpu["pci_bus_id"],
            f"pci_device_id 0x{(device_id << 16) | 0x10DE if device_id else 0:08x}",
            f"pci_subsystem_id 0x{(device_id << 16) | 0x10DE if device_id else 0:08x}",
            "memory_mib {}".format(gpu["memory_mib"]),
            "compute_capability " + gpu["compute_capability"],
            f"numa_node {-1 if numa is None else numa}",
            f"cpu_affinity {affinity & 0xFFFFFFFFFFFFFFFF:x} 0 0 0",
            "persistence_mode {}".format(int(gpu["persistence_mode"])),
            "minor_number {}".format(gpu["minor_number"]),
            "mig_mode " + gpu["mig_mode"],
            "architecture {}".format(_nvml_architecture(gpu["compute_capability"])),
            "brand {}".format(_NVML_BRAND_TESLA if spec_brand(gpu["name"]) == "Tesla" else _NVML_BRAND_NVIDIA),
            "xid {}".format(gpu["xid"] or 0),
            "lost {}".format(int(gpu["lost"])),
        ]
        if gpu["pcie_switch"] is not None:
            lines.append("pcie_switch " + gpu["pcie_switch"])
        lines += [f"nvlink_peer {by_uuid[peer]}" for peer in gpu["nvlink_peers"]]
        lines += _readings_state_lines(gpu["readings"])
        lines += _mig_state_lines(gpu, path)
    return "".join(line + "\n" for line in lines)


def _mig_state_lines(gpu, path):
    """A GPU's MIG lines of the state: the product's profiles and placements, and the declared MIG devices placed
    (mig_seed names that declaration; the library serves it until a client changes the layout)."""
    seed = _mig_seed_layout(gpu, path)
    table = MIG_PRODUCTS.get(gpu["name"])
    lines = []
    if table is not None and gpu["mig_mode"] != "unsupported":
        lines.append(f"mig_slices {MIG_MEMORY_SLICES} {MIG_COMPUTE_SLICES}")
        ci_profiles = _mig_ci_profiles(table)
        for row in table:
            # gi_profile INDEX ID NAME SLICES INSTANCES MEMORY_MIB SMS CE DEC ENC JPEG OFA MEMORY_SLICES STARTS
            lines.append("gi_profile " + " ".join(str(field) for field in row[:13]) + " " + _csv(row[13]))
            for ci_index, ci_slices, instances, sms, starts in ci_profiles[row[0]]:
                # ci_profile GI_INDEX CI_INDEX SLICES INSTANCES SMS STARTS
                lines.append(f"ci_profile {row[0]} {ci_index} {ci_slices} {instances} {sms} {_csv(starts)}")
    for mig, (row, start, ci_index, ci_start) in zip(gpu["mig_devices"], seed):
        # mig UUID MEMORY_MIB PROFILE GI_INDEX GI_START CI_INDEX CI_START
        fields = (mig["uuid"], mig["memory_mib"], mig["profile"], row[0], start, ci_index, ci_start)
        lines.append("mig " + " ".join(str(field) for field in fields))
    declared = "{} {} {}".format(gpu["name"], gpu["mig_mode"], lines[-len(seed) :] if seed else [])
    lines.append("mig_seed " + hashlib.sha256(declared.encode("utf-8")).hexdigest()[:16])
    return lines


def _csv(values):
    return ",".join(str(value) for value in values)
