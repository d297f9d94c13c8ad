"""The host's driver files, for the `mounts` strategy (clusters with no nvidia container runtime).

The old Kubernetes GPU recipe mounted host directories by hand. Here the daemon finds the driver's
own files once, at start: the device nodes that exist, each driver library in the directory that
holds libnvidia-ml.so.1 (mounted file by file, so no unrelated host library leaks in), and the
driver's tools."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Optional

from gpu_device_plugin.config import MountsSettings

log = logging.getLogger(__name__)

CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
_LIBRARY = re.compile(
    r"^lib(cuda|nvidia-[A-Za-z0-9_-]+|nvcuvid|nvoptix|GLX_nvidia|EGL_nvidia|GLESv1_CM_nvidia|GLESv2_nvidia)\.so(\.[0-9.]+)?$"
)
_LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu/nvidia/current",
    "usr/lib/aarch64-linux-gnu/nvidia/current",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
)
_BIN_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")


@dataclass(frozen=True)
class HostDriver:
    dev_root: str
    control_devices: tuple[str, ...]  # host paths that exist
    libraries: tuple[tuple[str, str], ...]  # (host path, file name in the container's lib dir)
    binaries: tuple[tuple[str, str], ...]  # (host path, file name in the container's bin dir)

    def gpu_node(self, minor: int) -> str:
        return os.path.join(self.dev_root, f"nvidia{minor}")


def nvml_library(settings: MountsSettings) -> Optional[str]:
    """Where this daemon finds the host driver's libnvidia-ml.so.1 (under the mounted driver root), or None."""
    for lib_dir in _library_dirs(settings):
        path = settings.local(os.path.join(lib_dir, "libnvidia-ml.so.1"))
        if os.path.exists(path):
            return path
    return None


def _library_dirs(settings: MountsSettings) -> list[str]:
    """The driver's library directories, as host paths: the configured ones, else the one with libnvidia-ml.so.1."""
    root = settings.driver_root
    if settings.library_dirs:
        return [os.path.join(root, d.lstrip("/")) for d in settings.library_dirs]
    found = (os.path.join(root, c) for c in _LIB_DIRS)
    return [d for d in found if os.path.exists(settings.local(os.path.join(d, "libnvidia-ml.so.1")))][:1]


def find(settings: MountsSettings) -> HostDriver:
    """The driver's files, found where this daemon sees them and named by their host paths."""
    root = settings.driver_root
    controls = tuple(
        os.path.join(settings.dev_root, name)
        for name in CONTROL_DEVICES
        if os.path.exists(settings.local(os.path.join(settings.dev_root, name)))
    )
    lib_dirs = _library_dirs(settings)
    libraries: list[tuple[str, str]] = []
    for lib_dir in lib_dirs:
        try:
            names = sorted(os.listdir(settings.local(lib_dir)))
        except OSError:
            continue
        libraries.extend((os.path.join(lib_dir, n), n) for n in names if _LIBRARY.match(n))
    binaries: list[tuple[str, str]] = []
    for name in settings.binaries:
        for bin_dir in _BIN_DIRS:
            path = os.path.join(root, bin_dir, name)
            if os.path.isfile(settings.local(path)):
                binaries.append((path, name))
                break
    found = HostDriver(settings.dev_root, controls, tuple(libraries), tuple(binaries))
    if not libraries:
        log.warning(
            "no driver libraries found for the mounts strategy (looked for libnvidia-ml.so.1)",
            extra={"driver_root": root, "dirs": lib_dirs or list(_LIB_DIRS)},
        )
    else:
        log.info(
            "driver files for the mounts strategy",
            extra={
                "libraries": len(libraries),
                "binaries": [name for _path, name in binaries],
                "devices": list(controls),
            },
        )
    return found
