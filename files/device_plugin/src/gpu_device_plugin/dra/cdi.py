"""Per-claim CDI specs: what the container runtime adds to a container that uses a prepared claim.

One spec file per claim, `<cdi dir>/gpuops.k8s-gpu_<claim UID>.json`, written atomically (a new
file renamed over the old) and removed on unprepare. Each device of the claim is a CDI device named
`<claim UID>-<device name>`, so a name is never reused by another claim and a runtime's cache can
never answer with a stale one; its fully-qualified ID is `gpuops.k8s/gpu=<claim UID>-<device name>`.

What goes in is what the device plugin gives a container (allocation.py): the GPU's device node,
the control device nodes, NVIDIA_VISIBLE_DEVICES, and with the `mounts` strategy the host driver's
libraries and tools plus LD_LIBRARY_PATH and PATH.

NVIDIA_VISIBLE_DEVICES is one value per container, whichever devices set it, while the kubelet gives each
container only the devices of the requests it names. So where the NVIDIA Container Toolkit's own CDI spec
(kind nvidia.com/gpu, `nvidia-ctk cdi generate`) names every device of the claim, each device is also handed
over as the toolkit's device (`nvidia.com/gpu=<UUID>`: its device nodes, a MIG device's capability nodes, the
driver's libraries and hooks) and the variable is `void`, so that the nvidia runtime adds nothing: a container
gets exactly the devices of its requests. Where it does not, the variable names every UUID of the claim, and
the nvidia runtime gives each container of the claim all of them. Device nodes are listed only where
they exist when the claim is prepared (a simulated GPU has none); each device also sets
GPUOPS_DEVICE_<NAME> to its UUID, so that no device is without edits, which CDI refuses. The spec's annotations name the
claim and its devices with their UUIDs, so that the checkpoint can be rebuilt from the specs if it is lost (a spec
written before UUIDs were annotated still names each device's UUID in its GPUOPS_DEVICE_<NAME> variable)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import yaml

from gpu_device_plugin import allocation, hostdriver
from gpu_device_plugin.config import MountsSettings
from gpu_device_plugin.dra.devices import DraDevice

VENDOR = "gpuops.k8s"
CLASS = "gpu"
KIND = f"{VENDOR}/{CLASS}"
CDI_VERSION = "0.6.0"  # the first version with annotations
ANNOTATION_CLAIM = "gpuops.k8s/claim"  # <namespace>/<name>/<uid>
ANNOTATION_DEVICES = "gpuops.k8s/devices"  # JSON: [{"device", "pool", "requests", "uuid"[, "toolkit"]}]
TOOLKIT_KIND = allocation.CDI_KIND  # the NVIDIA Container Toolkit's CDI specs: nvidia.com/gpu
# Where CDI specs live (the CDI specification's defaults); the toolkit writes /var/run/cdi/nvidia.yaml or
# /etc/cdi/nvidia.yaml.
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
_SPEC_FILE = re.compile(r"^" + re.escape(f"{VENDOR}-{CLASS}_") + r"(?P<uid>[A-Za-z0-9-]+)\.json$")


_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class CdiError(OSError):
    """A spec cannot be written or removed; the message names the file."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet is told and the checkpoint keeps it."""

    device: str
    pool: str
    requests: tuple[str, ...]
    cdi_id: str
    uuid: str = ""  # the GPU or MIG device's UUID: what the device is, whatever its name; "" when not known
    toolkit_id: str = ""  # the toolkit's CDI device (nvidia.com/gpu=<UUID>) handed over with ours; "" when none

    @property
    def cdi_ids(self) -> list[str]:
        """The CDI devices the kubelet hands to a container that uses this device."""
        return [self.cdi_id, self.toolkit_id] if self.toolkit_id else [self.cdi_id]


def toolkit_id(uuid: str) -> str:
    return f"{TOOLKIT_KIND}={uuid}"


def device_id(claim_uid: str, device: str) -> str:
    return f"{KIND}={claim_uid}-{device}"


def device_variable(device: str) -> str:
    """The environment variable that names one prepared device's UUID in its container:
    `GPUOPS_DEVICE_GPU_3` for `gpu-3`, `GPUOPS_DEVICE_GPU_0_MIG_1` for `gpu-0-mig-1`."""
    return "GPUOPS_DEVICE_" + re.sub(r"[^A-Za-z0-9]", "_", device).upper()


def spec_path(cdi_dir: str, claim_uid: str) -> str:
    return os.path.join(cdi_dir, f"{VENDOR}-{CLASS}_{claim_uid}.json")


def claim_uids_on_disk(cdi_dir: str) -> dict[str, str]:
    """Claim UID -> spec path for every spec of ours in the directory."""
    try:
        names = os.listdir(cdi_dir)
    except OSError:
        return {}
    found = {}
    for name in names:
        match = _SPEC_FILE.match(name)
        if match:
            found[match.group("uid")] = os.path.join(cdi_dir, name)
    return found


class ToolkitSpecs:
    """The device names in the NVIDIA Container Toolkit's CDI specs (kind nvidia.com/gpu, JSON or YAML) found
    in some directories. A file is read again only when its size or modification time changed; one that cannot
    be read or parsed names no device."""

    def __init__(self, dirs: Sequence[str]) -> None:
        self.dirs = list(dict.fromkeys(os.path.normpath(d) for d in dirs))
        self._files: dict[str, tuple[tuple[int, int], frozenset[str]]] = {}

    def names(self) -> frozenset[str]:
        found: set[str] = set()
        seen: dict[str, tuple[tuple[int, int], frozenset[str]]] = {}
        for directory in self.dirs:
            try:
                entries = sorted(os.listdir(directory))
            except OSError:
                continue
            for entry in entries:
                if not entry.endswith((".json", ".yaml", ".yml")) or _SPEC_FILE.match(entry):
                    continue
                path = os.path.join(directory, entry)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                stamp = (st.st_mtime_ns, st.st_size)
                cached = self._files.get(path)
                names = cached[1] if cached is not None and cached[0] == stamp else _toolkit_names(path)
                seen[path] = (stamp, names)
                found |= names
        self._files = seen
        return frozenset(found)


def _toolkit_names(path: str) -> frozenset[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            spec = yaml.load(handle, Loader=_Loader)  # JSON is YAML
        if not isinstance(spec, dict) or spec.get("kind") != TOOLKIT_KIND:
            return frozenset()
        return frozenset(str(d["name"]) for d in spec.get("devices") or [] if isinstance(d, dict) and d.get("name"))
    except (OSError, ValueError, yaml.YAMLError):
        return frozenset()


class SpecWriter:
    """Builds and writes the specs; knows the host's driver files when the mounts strategy is on, and the
    toolkit's CDI devices."""

    def __init__(
        self,
        cdi_dir: str,
        mounts: MountsSettings,
        strategies: Sequence[str],
        host_driver: Optional[hostdriver.HostDriver],
        toolkit_dirs: Optional[Sequence[str]] = None,
    ) -> None:
        self.cdi_dir = cdi_dir
        self.mounts = mounts
        self.with_mounts = "mounts" in strategies
        self.host_driver = host_driver
        if toolkit_dirs is None:
            toolkit_dirs = [cdi_dir, *(mounts.local(d) for d in SPEC_DIRS)]
        self.toolkit = ToolkitSpecs(toolkit_dirs)

    def toolkit_ids(self, uuids: Sequence[str]) -> Optional[dict[str, str]]:
        """UUID -> the toolkit's CDI device for each of these devices, when the toolkit's spec names every one
        of them; None when it does not (no spec, or one written before a device was there)."""
        names = self.toolkit.names()
        if not uuids or not all(u and u in names for u in uuids):
            return None
        return {u: toolkit_id(u) for u in uuids}

    def _node(self, host_path: str) -> Optional[dict[str, str]]:
        if not os.path.exists(self.mounts.local(host_path)):
            return None
        return {"path": "/dev/" + os.path.basename(host_path), "hostPath": host_path, "permissions": "rw"}

    def build(
        self, namespace: str, name: str, uid: str, devices: Sequence[tuple[DraDevice, PreparedDevice]]
    ) -> dict[str, Any]:
        dev_root = self.mounts.dev_root
        entries = []
        for dra, prepared in devices:
            node = self._node(os.path.join(dev_root, f"nvidia{dra.gpu.minor_number}"))
            # CDI refuses a device without edits, and a GPU whose device node is missing (a simulated
            # one) would have none: the variable naming the device's UUID is always there.
            edits: dict[str, Any] = {"env": [f"{device_variable(prepared.device)}={dra.uuid}"]}
            if node:
                edits["deviceNodes"] = [node]
            entries.append({"name": prepared.cdi_id.split("=", 1)[1], "containerEdits": edits})
        controls = [self._node(os.path.join(dev_root, n)) for n in hostdriver.CONTROL_DEVICES]
        if any(prepared.toolkit_id for _dra, prepared in devices):
            visible = "void"  # the toolkit's devices bring each container its own; the nvidia runtime adds none
        else:
            visible = ",".join(dict.fromkeys(dra.uuid for dra, _prepared in devices))
        common: dict[str, Any] = {
            "env": [f"{allocation.VISIBLE_DEVICES}={visible}"],
            "deviceNodes": [n for n in controls if n is not None],
        }
        if self.with_mounts and self.host_driver is not None:
            mounts = [
                (path, f"{self.mounts.container_lib_dir}/{file}") for path, file in self.host_driver.libraries
            ] + [(path, f"{self.mounts.container_bin_dir}/{file}") for path, file in self.host_driver.binaries]
            common["mounts"] = [
                {"hostPath": host, "containerPath": target, "options": ["ro", "nosuid", "nodev", "bind"]}
                for host, target in mounts
            ]
            common["env"] += [
                f"LD_LIBRARY_PATH={self.mounts.container_lib_dir}",
                f"PATH={self.mounts.container_bin_dir}:{allocation.DEFAULT_PATH}",
            ]
        described = [
            {
                "device": p.device,
                "pool": p.pool,
                "requests": list(p.requests),
                "uuid": dra.uuid,
                **({"toolkit": p.toolkit_id} if p.toolkit_id else {}),
            }
            for dra, p in devices
        ]
        return {
            "cdiVersion": CDI_VERSION,
            "kind": KIND,
            "annotations": {
                ANNOTATION_CLAIM: f"{namespace}/{name}/{uid}",
                ANNOTATION_DEVICES: json.dumps(described, separators=(",", ":")),
            },
            "devices": entries,
            "containerEdits": common,
        }

    def write(self, uid: str, spec: dict[str, Any]) -> str:
        path = spec_path(self.cdi_dir, uid)
        try:
            write_atomically(path, json.dumps(spec, indent=2, sort_keys=True) + "\n", mode=0o644)
        except OSError as exc:
            raise CdiError(f"cannot write the CDI spec {path}: {exc.strerror or exc}") from None
        return path

    def remove(self, uid: str) -> None:
        path = spec_path(self.cdi_dir, uid)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CdiError(f"cannot remove the CDI spec {path}: {exc.strerror or exc}") from None


def read_claim_from_spec(path: str) -> Optional[tuple[str, str, str, list[PreparedDevice]]]:
    """(namespace, name, uid, devices) from a spec this daemon wrote; None when it says too little."""
    try:
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
        annotations = spec["annotations"]
        namespace, name, uid = annotations[ANNOTATION_CLAIM].split("/")
        variables = _device_variables(spec)
        devices = [
            PreparedDevice(
                d["device"],
                d["pool"],
                tuple(d["requests"]),
                device_id(uid, d["device"]),
                str(d.get("uuid") or variables.get(device_variable(d["device"]), "")),
                str(d.get("toolkit") or ""),
            )
            for d in json.loads(annotations[ANNOTATION_DEVICES])
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return namespace, name, uid, devices


def _device_variables(spec: Any) -> dict[str, str]:
    """GPUOPS_DEVICE_<NAME> -> UUID, from the devices' edits of a spec."""
    found = {}
    for device in spec.get("devices") or []:
        for item in (device.get("containerEdits") or {}).get("env") or []:
            key, sep, value = str(item).partition("=")
            if sep and key.startswith("GPUOPS_DEVICE_"):
                found[key] = value
    return found


def write_atomically(path: str, text: str, mode: int = 0o600, prefix: str = "") -> None:
    """Write a new file beside `path`, flush it to disk and rename it over `path`: readers see the old
    content or the new, never a part. The directory is flushed too, so the rename survives a power cut.
    `prefix`: what the temporary file's path starts with (in the same directory; default .tmp-), so that a
    writer can find what a killed predecessor left."""
    directory = os.path.dirname(path) or "."
    if prefix:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(prefix), dir=os.path.dirname(prefix) or ".")
    else:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    sync_directory(directory)


def sync_directory(directory: str) -> None:
    """Flush a directory's entries (a rename or an unlink in it) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
