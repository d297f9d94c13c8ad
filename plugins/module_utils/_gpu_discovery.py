# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU facts: what NVML (through pynvml) or a simulated-GPU spec says about a node's GPUs, and the PCI bus in sysfs.

The one place that turns NVML answers into GPU facts. The nvidia_gpu_info module (whose facts decide the
node's labels) and the bundled daemon (whose devices the kubelet allocates) both use it: the daemon's
package carries this file as gpu_device_plugin/_shared/gpu_discovery.py (docs/architecture.md). It
therefore imports nothing from Ansible.

NVML answers once a driver is loaded; sysfs answers before one exists, so a play can decide whether
to install a driver (and Fabric Manager, when NVSwitches are present).
"""

import os
import contextlib

try:
    import pynvml

    PYNVML_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by the sanity import test
    pynvml = None
    PYNVML_IMPORT_ERROR = exc

NVIDIA_VENDOR_ID = "0x10de"
# PCI class prefixes: 0x0300 VGA controller, 0x0302 3D controller, 0x0680 other bridge (NVSwitch).
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")
NVSWITCH_CLASS_PREFIX = "0x0680"

_MIB = 1024 * 1024
# NVML constants, repeated here so that the sysfs path never needs pynvml.
_MIG_ENABLE = 1
_FEATURE_ENABLED = 1
_NVLINK_MAX_LINKS_FALLBACK = 18
_NVLINK_DEVICE_TYPE_GPU = 0
_NVLINK_DEVICE_TYPE_SWITCH = 2
# nvmlDeviceGetTopologyCommonAncestor: at most "multiple PCIe switches" means the GPUs share a switch tree.
_TOPOLOGY_MULTIPLE = 20

# Compute capability -> architecture, as GPU Feature Discovery names the families.
_ARCHITECTURE_BY_CC = {
    (7, 0): "volta",
    (7, 2): "volta",
    (7, 5): "turing",
    (8, 0): "ampere",
    (8, 6): "ampere",
    (8, 7): "ampere",
    (8, 9): "ada-lovelace",
}
_ARCHITECTURE_BY_MAJOR = {
    1: "tesla",
    2: "fermi",
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    7: "volta",
    8: "ampere",
    9: "hopper",
    10: "blackwell",
    12: "blackwell",
}

# The keys of one GPU's facts, in the order the module returns them.
GPU_FACT_KEYS = (
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "memory_total_mib",
    "compute_capability",
    "architecture",
    "brand",
    "numa_node",
    "persistence_mode",
    "mig_mode",
    "mig_devices",
    "minor_number",
    "nvlink_peers",
    "pcie_switch",
    "pcie_root",
    "xid",
    "lost",
)
# What NVML's device attributes (nvmlDeviceGetAttributes_v2) say of a MIG device, beside its profile and memory:
# the fact name, then the attribute of NVML's struct. GPU Feature Discovery labels a MIG profile with them.
MIG_ATTRIBUTE_FACTS = (
    ("multiprocessors", "multiprocessorCount"),
    ("gpu_instance_slices", "gpuInstanceSliceCount"),
    ("compute_instance_slices", "computeInstanceSliceCount"),
    ("copy_engines", "sharedCopyEngineCount"),
    ("decoders", "sharedDecoderCount"),
    ("encoders", "sharedEncoderCount"),
    ("jpeg_engines", "sharedJpegCount"),
    ("ofa_engines", "sharedOfaCount"),
)
MIG_ATTRIBUTE_KEYS = tuple(name for name, _attribute in MIG_ATTRIBUTE_FACTS)
# Where a MIG device sits on its GPU, from its GPU instance (nvmlGpuInstanceGetInfo): NVIDIA's GPU-instance profile ID
# and the first and number of memory slices it holds. NVIDIA's DRA driver names MIG devices by them.
MIG_PLACEMENT_KEYS = ("gpu_instance_profile_id", "placement_start", "placement_size")
# nvmlBrandType_t by value, with the names NVIDIA's go-nvlib gives them (GetBrandAsString), which NVIDIA's DRA driver
# publishes as the `brand` attribute. Values past the list are named Unknown.
BRAND_NAMES = (
    "Unknown",
    "Quadro",
    "Tesla",
    "NVS",
    "Grid",
    "GeForce",
    "Titan",
    "NvidiaVApps",
    "NvidiaVPC",
    "NvidiaVCS",
    "NvidiaVWS",
    "NvidiaCloudGaming",
    "QuadroRTX",
    "NvidiaRTX",
    "Nvidia",
    "GeForceRTX",
    "TitanRTX",
)


def installed_pynvml():
    """The pynvml module when nvidia-ml-py is installed on the target, else None."""
    return pynvml


class DiscoveryError(Exception):
    """Discovery failed; the message is one sentence for the user."""


def nvml_message(exc):
    """NVML's words for an error, without a closing full stop (the caller's sentence has one)."""
    return to_text(str(exc)).strip().rstrip(".")


def to_text(value):
    """pynvml returns bytes before nvidia-ml-py 11.515 and str after; give str either way."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return value


def normalize_bus_id(bus_id):
    """NVML says 00000000:18:00.0, sysfs says 0000:18:00.0: use the sysfs form, lower case."""
    bus_id = to_text(bus_id).strip().lower()
    parts = bus_id.split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    elif len(parts) == 2:
        parts.insert(0, "0000")
    return ":".join(parts)


def format_cuda_version(value):
    """NVML encodes CUDA 12.8 as 12080."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def gpu_architecture(compute_capability):
    """The architecture family of a "MAJOR.MINOR" compute capability; 'undefined' when unknown or malformed."""
    try:
        major, minor = (int(part) for part in str(compute_capability).split(".")[:2])
    except ValueError:
        return "undefined"
    return _ARCHITECTURE_BY_CC.get((major, minor)) or _ARCHITECTURE_BY_MAJOR.get(major, "undefined")


def gpu_fact(**fields):
    """One GPU's facts with every key of GPU_FACT_KEYS; the architecture follows from the compute capability."""
    unknown = set(fields) - set(GPU_FACT_KEYS)
    if unknown:
        raise ValueError("unknown GPU fact(s): " + ", ".join(sorted(unknown)))
    fact = dict((key, fields.get(key)) for key in GPU_FACT_KEYS)
    fact["architecture"] = gpu_architecture(fact["compute_capability"])
    fact["mig_devices"] = [_mig_device_fact(position, mig) for position, mig in enumerate(fact["mig_devices"] or [])]
    fact["nvlink_peers"] = list(fact["nvlink_peers"] or [])
    fact["lost"] = bool(fact["lost"])
    return fact


def _mig_device_fact(position, mig):
    """One MIG device's facts: its position, UUID, profile and memory, and the attributes NVML gives (None where
    they are not known)."""
    fact = {"index": position, "uuid": mig["uuid"], "profile": mig["profile"], "memory_mib": mig["memory_mib"]}
    fact.update((key, mig.get(key)) for key in MIG_ATTRIBUTE_KEYS + MIG_PLACEMENT_KEYS)
    return fact


def _nvml_mig_position(mig):
    """Where NVML lists a MIG device among its GPU's: by its GPU instance's ID, which follows from the instance's
    placement (NVIDIA's driver numbers the GPU instances of a GPU's 8 memory slices: the whole GPU 0, the halves 1-2,
    the quarters 3-6, the eighths 7-14). A device whose placement is not known keeps its place in the spec."""
    start, size = mig.get("placement_start"), mig.get("placement_size")
    if start is None or not size:
        return 0
    return 8 // size - 1 + start // size


def facts_from_spec(spec):
    """The facts a simulated-GPU spec (as _simulated_spec.parse_spec returns it) describes: the same shape as NVML's.

    A spec's GPU has every fact but the architecture (derived here) under the same name, except its memory.
    """
    gpus = []
    for gpu in spec["gpus"]:
        # The PCI device ID is the bus's fact (nvidia_gpu_info's pci_devices), not NVML's; the readings are what the
        # mock library answers, not facts.
        fields = dict(
            (key, value) for key, value in gpu.items() if key not in ("memory_mib", "pci_device_id", "readings")
        )
        fields["memory_total_mib"] = gpu["memory_mib"]
        fields["mig_devices"] = sorted(gpu.get("mig_devices") or [], key=_nvml_mig_position)
        gpus.append(gpu_fact(**fields))
    return {"driver_version": spec["driver_version"], "cuda_driver_version": spec["cuda_driver_version"], "gpus": gpus}


# ---------------------------------------------------------------------------------------------
# sysfs


def _read_attr(device_dir, name):
    try:
        with open(os.path.join(device_dir, name)) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _numa_from_text(text):
    if text is None:
        return None
    try:
        node = int(text)
    except ValueError:
        return None
    return node if node >= 0 else None


def sysfs_numa_node(sysfs_root, bus_id):
    """The NUMA node sysfs gives for a PCI device, or None when unknown (-1 or missing)."""
    return _numa_from_text(_read_attr(os.path.join(sysfs_root, "bus", "pci", "devices", bus_id), "numa_node"))


def brand_name(value):
    """NVML's brand (nvmlBrandType_t) by the name NVIDIA's go-nvlib gives it; None when NVML did not answer."""
    if value is None:
        return None
    return BRAND_NAMES[value] if 0 <= value < len(BRAND_NAMES) else "Unknown"


def sysfs_pcie_root(sysfs_root, bus_id):
    """The PCIe root complex a PCI device hangs off (C(pci0000:17)): the first directory under devices/ that its
    bus/pci/devices/<bus ID> link leads to, read as Kubernetes reads the standard pcieRoot attribute; None when sysfs
    does not know the device or the link leads elsewhere."""
    link = os.path.join("bus", "pci", "devices", bus_id)
    try:
        target = os.readlink(os.path.join(sysfs_root, link))
    except OSError:
        return None
    if os.path.isabs(target):
        return None
    target = os.path.normpath(os.path.join(os.path.dirname(link), target))
    if not target.startswith(os.path.join("devices", "pci")) or os.path.basename(target) != bus_id:
        return None
    return target.split(os.sep)[1]


def scan_pci(sysfs_root):
    """Return (gpus, nvswitches): NVIDIA PCI functions found under <sysfs_root>/bus/pci/devices."""
    if not os.path.isdir(sysfs_root):
        raise DiscoveryError(f"sysfs_root {sysfs_root} is not a directory.")
    devices_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(devices_dir))
    except OSError:
        return [], []
    gpus = []
    nvswitches = []
    for name in names:
        device_dir = os.path.join(devices_dir, name)
        vendor = (_read_attr(device_dir, "vendor") or "").lower()
        if vendor != NVIDIA_VENDOR_ID:
            continue
        pci_class = (_read_attr(device_dir, "class") or "").lower()
        if pci_class.startswith(GPU_CLASS_PREFIXES):
            target = gpus
        elif pci_class.startswith(NVSWITCH_CLASS_PREFIX):
            target = nvswitches
        else:
            continue
        driver_link = os.path.join(device_dir, "driver")
        driver = os.path.basename(os.path.realpath(driver_link)) if os.path.islink(driver_link) else None
        target.append(
            {
                "bus_id": name.lower(),
                "vendor_id": vendor,
                "device_id": (_read_attr(device_dir, "device") or "").lower() or None,
                "class": pci_class,
                "numa_node": _numa_from_text(_read_attr(device_dir, "numa_node")),
                "driver": driver,
            }
        )
    return gpus, nvswitches


# ---------------------------------------------------------------------------------------------
# NVML


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host; the message says why, as one sentence."""


class _Reader:
    """Runs NVML calls for one GPU and turns an unexpected NVML error into one sentence."""

    def __init__(self, nvml, where):
        self.nvml = nvml
        self.where = where

    def call(self, name, *args, **kwargs):
        try:
            return getattr(self.nvml, name)(*args, **kwargs)
        except self.nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML call {name} failed for {self.where}: {nvml_message(exc)}.") from None

    def optional(self, name, *args, **kwargs):
        """Like call, but NotSupported (or a function this pynvml lacks) gives None."""
        function = getattr(self.nvml, name, None)
        if function is None:
            return None
        try:
            return function(*args, **kwargs)
        except self.nvml.NVMLError as exc:
            if _error_code(exc) in _codes(self.nvml, "NOT_SUPPORTED", "FUNCTION_NOT_FOUND"):
                return None
            raise DiscoveryError(f"NVML call {name} failed for {self.where}: {nvml_message(exc)}.") from None


def _codes(nvml, *names):
    return tuple(getattr(nvml, "NVML_ERROR_" + name) for name in names if hasattr(nvml, "NVML_ERROR_" + name))


# nvml.h: the loaded kernel module is not the library's version, which nvidia-smi calls a "Driver/library version
# mismatch"; NVML's own words for it, and what the reason adds.
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
LIB_RM_VERSION_MISMATCH_NVML_WORDS = "RM has detected an NVML/RM version mismatch"
LIB_RM_VERSION_MISMATCH_HINT = (
    ": Driver/library version mismatch, the loaded NVIDIA kernel module is not the installed driver library's version;"
    " reboot the node to load the installed driver"
)


def unavailable_reason(words):
    """The sentence for an nvmlInit that failed with WORDS."""
    return f"NVML could not be initialised ({words}), so the GPUs were read from the PCI bus in sysfs."


def _error_code(exc):
    return getattr(exc, "value", None)


def nvml_discover(nvml, sysfs_root):
    """Everything NVML knows about the GPUs, with exactly one nvmlInit and one nvmlShutdown.

    Raises NvmlUnavailable when NVML cannot be initialised and DiscoveryError when a call fails
    after initialisation.
    """
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        words = nvml_message(exc)
        if _error_code(exc) == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            words += LIB_RM_VERSION_MISMATCH_HINT
        raise NvmlUnavailable(unavailable_reason(words)) from None
    try:
        return discover_initialised(nvml, sysfs_root)
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def discover_initialised(nvml, sysfs_root):
    """The GPU facts from an NVML that is already initialised (the daemon keeps it so, for its events).

    Raises DiscoveryError with one sentence when a call fails.
    """
    system = _Reader(nvml, "the system")
    driver_version = to_text(system.call("nvmlSystemGetDriverVersion"))
    if hasattr(nvml, "nvmlSystemGetCudaDriverVersion_v2"):
        cuda = system.call("nvmlSystemGetCudaDriverVersion_v2")
    else:
        cuda = system.call("nvmlSystemGetCudaDriverVersion")
    count = system.call("nvmlDeviceGetCount")

    gpus = []
    links = []
    handles = []
    for index in range(count):
        gpu, gpu_links, handle = _read_gpu(nvml, index, sysfs_root)
        gpus.append(gpu)
        links.append(gpu_links)
        handles.append(handle)
    _resolve_nvlink_peers(gpus, links)
    for gpu, switch in zip(gpus, _pcie_switch_groups(nvml, handles)):
        gpu["pcie_switch"] = switch
    return {
        "driver_version": driver_version,
        "cuda_driver_version": format_cuda_version(cuda),
        "gpus": gpus,
    }


def _read_gpu(nvml, index, sysfs_root):
    reader = _Reader(nvml, f"GPU index {index}")
    handle = reader.call("nvmlDeviceGetHandleByIndex", index)
    uuid = to_text(reader.call("nvmlDeviceGetUUID", handle))
    reader.where = f"GPU index {index} ({uuid})"
    name = to_text(reader.call("nvmlDeviceGetName", handle))
    pci_call = "nvmlDeviceGetPciInfo_v3" if hasattr(nvml, "nvmlDeviceGetPciInfo_v3") else "nvmlDeviceGetPciInfo"
    bus_id = normalize_bus_id(reader.call(pci_call, handle).busId)
    memory_total = reader.call("nvmlDeviceGetMemoryInfo", handle).total
    major, minor = reader.call("nvmlDeviceGetCudaComputeCapability", handle)

    numa_node = reader.optional("nvmlDeviceGetNumaNodeId", handle)
    if numa_node is None:
        numa_node = sysfs_numa_node(sysfs_root, bus_id)
    elif numa_node < 0:
        numa_node = None

    persistence = reader.optional("nvmlDeviceGetPersistenceMode", handle)
    mig_mode, mig_devices = _read_mig(nvml, reader, handle)
    brand = reader.optional("nvmlDeviceGetBrand", handle)

    gpu = gpu_fact(
        index=index,
        uuid=uuid,
        name=name,
        pci_bus_id=bus_id,
        memory_total_mib=memory_total // _MIB,
        compute_capability=f"{major}.{minor}",
        numa_node=numa_node,
        brand=brand_name(brand),
        pcie_root=sysfs_pcie_root(sysfs_root, bus_id),
        persistence_mode=None if persistence is None else persistence == _FEATURE_ENABLED,
        mig_mode=mig_mode,
        mig_devices=mig_devices,
        minor_number=reader.optional("nvmlDeviceGetMinorNumber", handle),
        # XIDs arrive later as NVML events (the daemon's health watcher); a GPU that fell off the bus
        # fails the calls above instead.
        xid=None,
        lost=False,
    )
    return gpu, _read_nvlinks(nvml, reader, handle), handle


def _read_mig(nvml, reader, handle):
    modes = reader.optional("nvmlDeviceGetMigMode", handle)
    if modes is None:
        return "unsupported", []
    if modes[0] != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", _MIG_ENABLE):
        return "disabled", []
    devices = []
    not_found = _codes(nvml, "NOT_FOUND", "INVALID_ARGUMENT")
    for slot in range(reader.call("nvmlDeviceGetMaxMigDeviceCount", handle)):
        # Slots without a MIG device answer NOT_FOUND: MIG devices need not be numbered densely.
        try:
            mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as exc:
            if _error_code(exc) in not_found:
                continue
            raise DiscoveryError(
                f"NVML call nvmlDeviceGetMigDeviceHandleByIndex failed for {reader.where}, MIG slot {slot}: "
                f"{nvml_message(exc)}."
            ) from None
        mig_uuid = to_text(reader.call("nvmlDeviceGetUUID", mig_handle))
        mig_name = to_text(reader.call("nvmlDeviceGetName", mig_handle))
        memory = reader.call("nvmlDeviceGetMemoryInfo", mig_handle).total
        device = {"uuid": mig_uuid, "profile": _mig_profile(mig_name), "memory_mib": memory // _MIB}
        device.update(_mig_attributes(nvml, reader, mig_handle))
        device.update(_mig_placement(reader, handle, mig_handle))
        devices.append(device)
    return "enabled", devices


def _mig_attributes(nvml, reader, mig_handle):
    """The MIG device's SMs, slices and shared engines as NVML's device attributes give them (what GPU Feature
    Discovery reads for its labels); None each when this driver or pynvml does not answer."""
    call = "nvmlDeviceGetAttributes_v2" if hasattr(nvml, "nvmlDeviceGetAttributes_v2") else "nvmlDeviceGetAttributes"
    attributes = reader.optional(call, mig_handle)
    return dict(
        (key, None if attributes is None else int(getattr(attributes, attribute)))
        for key, attribute in MIG_ATTRIBUTE_FACTS
    )


def _mig_placement(reader, handle, mig_handle):
    """The MIG device's GPU-instance profile ID and memory-slice placement (MIG_PLACEMENT_KEYS); None each when this
    driver or pynvml does not answer."""
    gpu_instance_id = reader.optional("nvmlDeviceGetGpuInstanceId", mig_handle)
    gpu_instance = None
    if gpu_instance_id is not None:
        gpu_instance = reader.optional("nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
    info = None if gpu_instance is None else reader.optional("nvmlGpuInstanceGetInfo", gpu_instance)
    if info is None:
        return dict.fromkeys(MIG_PLACEMENT_KEYS)
    values = (info.profileId, info.placement.start, info.placement.size)
    return dict(zip(MIG_PLACEMENT_KEYS, (int(value) for value in values)))


def _mig_profile(name):
    """NVML names a MIG device "<GPU name> MIG 1g.5gb"; the profile is the last word."""
    marker = " MIG "
    if marker in name:
        return name.rsplit(marker, 1)[1].strip()
    return name


def _read_nvlinks(nvml, reader, handle):
    """Active NVLinks of one GPU: the remote bus IDs, and whether any link ends at an NVSwitch."""
    remote_gpus = set()
    to_switch = False
    absent = _codes(nvml, "NOT_SUPPORTED", "INVALID_ARGUMENT", "NOT_FOUND", "FUNCTION_NOT_FOUND")
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS_FALLBACK)
    for link in range(max_links):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as exc:
            # A GPU without NVLink answers NOT_SUPPORTED, and links past its last INVALID_ARGUMENT.
            if _error_code(exc) in absent:
                continue
            raise DiscoveryError(
                f"NVML call nvmlDeviceGetNvLinkState failed for {reader.where}, link {link}: {nvml_message(exc)}."
            ) from None
        if state != _FEATURE_ENABLED:
            continue
        remote = normalize_bus_id(reader.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link).busId)
        remote_type = reader.optional("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if remote_type == _NVLINK_DEVICE_TYPE_SWITCH:
            to_switch = True
        else:
            remote_gpus.add(remote)
    return {"remote_gpus": remote_gpus, "to_switch": to_switch}


def _pcie_switch_groups(nvml, handles):
    """Per GPU, the PCIe switch tree it shares with other GPUs, named sw0, sw1, ... in index order; else None.

    None for every GPU when this pynvml or driver cannot answer nvmlDeviceGetTopologyCommonAncestor.
    """
    ancestor = getattr(nvml, "nvmlDeviceGetTopologyCommonAncestor", None)
    parent = list(range(len(handles)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    if ancestor is not None:
        multiple = getattr(nvml, "NVML_TOPOLOGY_MULTIPLE", _TOPOLOGY_MULTIPLE)
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                try:
                    level = ancestor(handles[i], handles[j])
                except nvml.NVMLError:
                    continue
                if level <= multiple:
                    parent[root(j)] = root(i)
    members = {}
    for i in range(len(handles)):
        members.setdefault(root(i), []).append(i)
    names = [None] * len(handles)
    shared = [group for group in members.values() if len(group) > 1]
    for number, group in enumerate(sorted(shared)):
        for i in group:
            names[i] = f"sw{number}"
    return names


def _resolve_nvlink_peers(gpus, links):
    """Turn remote bus IDs into peer UUIDs; GPUs on the same NVSwitch fabric are all peers."""
    by_bus_id = dict((gpu["pci_bus_id"], gpu["uuid"]) for gpu in gpus)
    peers = dict((gpu["uuid"], set()) for gpu in gpus)
    on_fabric = [gpu["uuid"] for gpu, link in zip(gpus, links) if link["to_switch"]]
    for gpu, link in zip(gpus, links):
        for remote in link["remote_gpus"]:
            peer = by_bus_id.get(remote)
            if peer is not None and peer != gpu["uuid"]:
                peers[gpu["uuid"]].add(peer)
                peers[peer].add(gpu["uuid"])
        if link["to_switch"]:
            peers[gpu["uuid"]].update(uuid for uuid in on_fabric if uuid != gpu["uuid"])
    for gpu in gpus:
        gpu["nvlink_peers"] = [other["uuid"] for other in gpus if other["uuid"] in peers[gpu["uuid"]]]
