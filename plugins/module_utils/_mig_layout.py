# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A GPU's MIG layout through NVML (pynvml): read it (mode, GPU instances, compute instances, and the product's
GPU-instance profiles as NVML lists them), and change it (destroy, set the mode, create, put back).

NVML handles are ctypes pointers: never equal, never hashable. GPUs are kept by index and UUID, and a handle is
only ever passed back to NVML.
"""

from __future__ import annotations

import ctypes
import math

from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_discovery import nvml_message, to_text
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_plan import (
    GpuInstanceProfile,
    PlannedInstance,
    counts,
    make_product,
)

_MIB = 1024 * 1024
_GIB = 1024 * _MIB
# The NVML enumerations, with the values of nvml.h, for a pynvml that lacks a name.
_GPU_INSTANCE_PROFILE_COUNT = 18
_COMPUTE_INSTANCE_PROFILE_COUNT = 9
_ENGINE_PROFILE_SHARED = 0
# Only for a driver or pynvml whose profile info has no name: the attribute each NVML_GPU_INSTANCE_PROFILE_*
# index adds to the name (REV1 has media extensions, ALL_ME all of them, GFX graphics, NO_ME none).
_PROFILE_SUFFIX = {7: "+me", 8: "+me", 15: "+me.all", 16: "+me.all", 10: "+gfx", 11: "+gfx", 12: "+gfx", 17: "+gfx"}
_PROFILE_SUFFIX.update({13: "-me", 14: "-me"})


class NvmlCallFailed(Exception):
    """An NVML call failed; ``call`` and ``message`` say which and NVML's words."""

    def __init__(self, call, message, code):
        super().__init__(f"{call}: {message}")
        self.call, self.message, self.code = call, message, code
        self.where = None


class Gpu:
    """One GPU as NVML reported it when it was read."""

    def __init__(self, index, uuid, name, device_id, subsystem_id, memory_mib, handle):
        self.index, self.uuid, self.name = index, uuid, name
        self.device_id, self.subsystem_id, self.memory_mib = device_id, subsystem_id, memory_mib
        self.handle = handle
        self.supported = False  # MIG at all
        self.current = self.pending = False  # MIG mode now, and after the next GPU reset
        self.product = None  # the Product NVML describes while MIG mode is on
        self.instances = []  # GpuInstance, by GPU-instance ID

    @property
    def label(self):
        return f"GPU {self.index} ({self.uuid})"

    def layout(self):
        """The layout as the module reports it: mig_enabled, mig_pending, devices (profile counts)."""
        return {
            "mig_enabled": self.current,
            "mig_pending": self.current != self.pending,
            "devices": counts((gi.profile, gi.compute_sizes, gi.slices) for gi in self.instances),
        }

    def has_bare_instances(self):
        """Whether a GPU instance has no compute instance: no MIG device, yet its slices are taken."""
        return any(not gi.compute for gi in self.instances)


class GpuInstance:
    def __init__(self, handle, instance_id, profile, placement):
        self.handle, self.id, self.placement = handle, instance_id, placement
        self.profile, self.profile_id, self.slices = profile.name, profile.id, profile.slices
        self.compute = []  # (handle, compute-instance ID, slices)

    @property
    def compute_sizes(self):
        return tuple(size for _h, _i, size in self.compute)


class Nvml:
    """pynvml's calls for one module run; a failed call raises NvmlCallFailed with NVML's words."""

    def __init__(self, nvml):
        self.nvml = nvml

    def const(self, name, default):
        return getattr(self.nvml, name, default)

    def code(self, name):
        return getattr(self.nvml, "NVML_ERROR_" + name, None)

    def call(self, name, *args, **kwargs):
        function = getattr(self.nvml, name, None)
        if function is None:
            raise NvmlCallFailed(name, "this pynvml has no such function", self.code("FUNCTION_NOT_FOUND"))
        try:
            return function(*args, **kwargs)
        except self.nvml.NVMLError as exc:
            raise NvmlCallFailed(name, nvml_message(exc), getattr(exc, "value", None)) from None

    def absent(self, exc, *names):
        """Whether a failed call means "nothing there" (one of the NVML_ERROR_<names>)."""
        return exc.code is not None and exc.code in [self.code(name) for name in names]


def read_gpus(api):
    """Every GPU of the host, in NVML index order, with its MIG mode, instances and profiles. A failed call
    raises NvmlCallFailed whose ``where`` names the GPU."""
    gpus = []
    for index in range(api.call("nvmlDeviceGetCount")):
        try:
            gpus.append(read_gpu(api, index))
        except NvmlCallFailed as exc:
            exc.where = f"GPU {index}"
            raise
    return gpus


def read_gpu(api, index):
    handle = api.call("nvmlDeviceGetHandleByIndex", index)
    pci_call = "nvmlDeviceGetPciInfo_v3" if hasattr(api.nvml, "nvmlDeviceGetPciInfo_v3") else "nvmlDeviceGetPciInfo"
    pci = api.call(pci_call, handle)
    gpu = Gpu(
        index,
        to_text(api.call("nvmlDeviceGetUUID", handle)),
        to_text(api.call("nvmlDeviceGetName", handle)),
        pci.pciDeviceId,
        pci.pciSubSystemId,
        api.call("nvmlDeviceGetMemoryInfo", handle).total // _MIB,
        handle,
    )
    refresh(api, gpu)
    return gpu


def refresh(api, gpu):
    """Read the GPU's MIG mode, and with MIG on its profiles and instances, again."""
    try:
        current, pending = api.call("nvmlDeviceGetMigMode", gpu.handle)
    except NvmlCallFailed as exc:
        if not api.absent(exc, "NOT_SUPPORTED", "FUNCTION_NOT_FOUND"):
            raise
        gpu.supported, gpu.current, gpu.pending, gpu.product, gpu.instances = False, False, False, None, []
        return gpu
    enable = api.const("NVML_DEVICE_MIG_ENABLE", 1)
    gpu.supported, gpu.current, gpu.pending = True, current == enable, pending == enable
    gpu.product = read_product(api, gpu) if gpu.current else None
    gpu.instances = read_instances(api, gpu) if gpu.product else []
    return gpu


def read_product(api, gpu):
    """The GPU's MIG profiles as NVML lists them (a Product), or None when NVML lists none (MIG mode off)."""
    profiles = []
    for index in range(api.const("NVML_GPU_INSTANCE_PROFILE_COUNT", _GPU_INSTANCE_PROFILE_COUNT)):
        try:
            info = _profile_info(api, gpu.handle, index)
        except NvmlCallFailed as exc:
            if api.absent(exc, "NOT_SUPPORTED", "INVALID_ARGUMENT"):
                continue
            raise
        name = _profile_name(info, index, gpu.memory_mib)
        profiles.append(
            GpuInstanceProfile(
                index,
                info.id,
                name,
                info.sliceCount,
                info.instanceCount,
                info.memorySizeMB,
                _placements(api, gpu.handle, info.id),
            )
        )
    return make_product(profiles, gpu.memory_mib) if profiles else None


def _profile_info(api, handle, index):
    try:
        return api.call("nvmlDeviceGetGpuInstanceProfileInfo", handle, index)
    except NvmlCallFailed as exc:
        # A driver before the versioned call: the first struct, without the name.
        if not api.absent(exc, "FUNCTION_NOT_FOUND"):
            raise
        return api.call("nvmlDeviceGetGpuInstanceProfileInfo", handle, index, version=1)


def _profile_name(info, index, memory_mib):
    """NVML names a profile "MIG 1g.10gb"; without a name, the one NVIDIA's tools derive from its memory (the
    share of the GPU's memory, rounded up to eighths, of the GPU's memory in whole GB)."""
    name = to_text(getattr(info, "name", b"") or b"").strip()
    if name:
        return name[4:] if name.startswith("MIG ") else name
    share = math.ceil(info.memorySizeMB / memory_mib * 8) / 8
    gb = math.floor(share * math.ceil(memory_mib * _MIB / _GIB) + 0.5)
    return f"{info.sliceCount}g.{gb}gb{_PROFILE_SUFFIX.get(index, '')}"


def _placements(api, handle, profile_id):
    count = ctypes.c_uint(0)
    api.call("nvmlDeviceGetGpuInstancePossiblePlacements", handle, profile_id, None, ctypes.byref(count))
    found = (api.nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    api.call("nvmlDeviceGetGpuInstancePossiblePlacements", handle, profile_id, found, ctypes.byref(count))
    return tuple((p.start, p.size) for p in found[: count.value])


def read_instances(api, gpu):
    """The GPU's GPU instances, each with its compute instances, by GPU-instance ID."""
    instances = []
    for profile in gpu.product.profiles.values():
        found = (api.nvml.c_nvmlGpuInstance_t * max(profile.instances, 1))()
        count = ctypes.c_uint(0)
        api.call("nvmlDeviceGetGpuInstances", gpu.handle, profile.id, found, ctypes.byref(count))
        for handle in found[: count.value]:
            info = api.call("nvmlGpuInstanceGetInfo", handle)
            instance = GpuInstance(handle, info.id, profile, (info.placement.start, info.placement.size))
            instance.compute = _compute_instances(api, handle)
            instances.append(instance)
    return sorted(instances, key=lambda instance: instance.id)


def _compute_profiles(api, gi_handle):
    """(profile ID, slices, instances) of each compute-instance profile a GPU instance offers."""
    offered = []
    shared = api.const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", _ENGINE_PROFILE_SHARED)
    for index in range(api.const("NVML_COMPUTE_INSTANCE_PROFILE_COUNT", _COMPUTE_INSTANCE_PROFILE_COUNT)):
        try:
            try:
                info = api.call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi_handle, index, shared)
            except NvmlCallFailed as exc:
                if not api.absent(exc, "FUNCTION_NOT_FOUND"):
                    raise
                info = api.call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi_handle, index, shared, version=1)
        except NvmlCallFailed as exc:
            if api.absent(exc, "NOT_SUPPORTED", "INVALID_ARGUMENT"):
                continue
            raise
        offered.append((info.id, info.sliceCount, info.instanceCount))
    return offered


def _compute_instances(api, gi_handle):
    found_all = []
    for profile_id, slices, instances in _compute_profiles(api, gi_handle):
        found = (api.nvml.c_nvmlComputeInstance_t * max(instances, 1))()
        count = ctypes.c_uint(0)
        api.call("nvmlGpuInstanceGetComputeInstances", gi_handle, profile_id, found, ctypes.byref(count))
        for handle in found[: count.value]:
            info = api.call("nvmlComputeInstanceGetInfo", handle)
            found_all.append((handle, info.id, slices))
    return sorted(found_all, key=lambda ci: ci[1])


# ---------------------------------------------------------------------------------------------
# Changes


class ApplyFailed(Exception):
    """A change failed on a GPU: ``gpu`` (the Gpu), ``what`` (what was being done, naming the profile) and the
    NvmlCallFailed."""

    def __init__(self, gpu, what, failure):
        super().__init__(f"{gpu.label}: {what}: {failure}")
        self.gpu, self.what, self.failure = gpu, what, failure

    def sentence_part(self):
        return f"{self.what} on {self.gpu.label} failed ({self.failure.call}: {self.failure.message})"


def destroy_all(api, gpu):
    """Destroy every compute and GPU instance of the GPU (read anew, so what another process made goes too)."""
    refresh(api, gpu)
    for instance in gpu.instances:
        for handle, ci_id, _slices in instance.compute:
            try:
                api.call("nvmlComputeInstanceDestroy", handle)
            except NvmlCallFailed as exc:
                raise ApplyFailed(gpu, f"destroying compute instance {ci_id} of the {instance.profile}", exc) from None
        try:
            api.call("nvmlGpuInstanceDestroy", instance.handle)
        except NvmlCallFailed as exc:
            raise ApplyFailed(gpu, f"destroying the {instance.profile} GPU instance {instance.id}", exc) from None
    gpu.instances = []


def set_mode(api, gpu, enabled):
    """Set the GPU's MIG mode; True when it took effect, False when it waits for a GPU reset (the driver could
    not reset the GPU itself: another process has it open)."""
    mode = api.const("NVML_DEVICE_MIG_ENABLE", 1) if enabled else api.const("NVML_DEVICE_MIG_DISABLE", 0)
    try:
        activation = api.call("nvmlDeviceSetMigMode", gpu.handle, mode)
    except NvmlCallFailed as exc:
        raise ApplyFailed(gpu, "turning MIG mode {}".format("on" if enabled else "off"), exc) from None
    refresh(api, gpu)
    success = api.const("NVML_SUCCESS", 0)
    return activation == success and gpu.current == gpu.pending == enabled


def create(api, gpu, planned, placements):
    """Create the planned GPU instances (PlannedInstance, in the order given), each at its placement ((first
    memory slice, memory slices), as _mig_plan.check_fit found them) and with its compute instances. Where this
    pynvml or driver has no nvmlDeviceCreateGpuInstanceWithPlacement, the driver places them."""
    for instance, placement in zip(planned, placements):
        profile = gpu.product.profiles[instance.profile]
        handle = _create_gi(api, gpu, profile, placement, f"creating a {instance.profile} GPU instance")
        _create_compute(api, gpu, handle, instance)


def _create_gi(api, gpu, profile, placement, what):
    """A GPU instance of the profile at the placement; where the driver puts it when this pynvml or driver cannot
    create at a placement."""
    if hasattr(api.nvml, "nvmlDeviceCreateGpuInstanceWithPlacement"):
        at = api.nvml.c_nvmlGpuInstancePlacement_t(*placement)
        try:
            return api.call("nvmlDeviceCreateGpuInstanceWithPlacement", gpu.handle, profile.id, ctypes.byref(at))
        except NvmlCallFailed as exc:
            if not api.absent(exc, "FUNCTION_NOT_FOUND"):
                raise ApplyFailed(gpu, what, exc) from None
    try:
        return api.call("nvmlDeviceCreateGpuInstance", gpu.handle, profile.id)
    except NvmlCallFailed as exc:
        raise ApplyFailed(gpu, what, exc) from None


def _create_compute(api, gpu, gi_handle, instance):
    for size in instance.compute:
        whole = size == gpu.product.profiles[instance.profile].slices
        name = instance.profile if whole else f"{size}c.{instance.profile}"
        try:
            # A driver may offer a variant beside the plain profile of the same slices (1_SLICE_REV1 beside
            # 1_SLICE, 7_SLICE_NVL beside 7_SLICE): the first in NVML's order, the plain one, as mig-parted takes
            # the first profile whose name matches.
            offered = {}
            for profile_id, slices, _n in _compute_profiles(api, gi_handle):
                offered.setdefault(slices, profile_id)
            if size not in offered:
                raise NvmlCallFailed(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    f"the GPU instance offers no compute instance of {size} slice(s)",
                    api.code("NOT_SUPPORTED"),
                )
            api.call("nvmlGpuInstanceCreateComputeInstance", gi_handle, offered[size])
        except NvmlCallFailed as exc:
            raise ApplyFailed(gpu, f"creating a {name} compute instance", exc) from None


def restore(api, gpu, before):
    """Put the GPU back to the layout ``before`` (a Gpu as read before the run changed it): the MIG mode it had in
    effect and, with MIG on, its GPU instances at their placements with their compute instances. Returns False
    when the mode change back waits for a GPU reset (the instances are then not made)."""
    destroy_all(api, gpu)
    if (gpu.current, gpu.pending) != (before.current, before.current):
        set_mode(api, gpu, before.current)
        if gpu.current != before.current:
            return False
    for instance in sorted(before.instances, key=lambda gi: (-gi.slices, gi.id)):
        profile = gpu.product.profiles[instance.profile]
        handle = _create_gi(api, gpu, profile, instance.placement, f"putting back the {instance.profile} GPU instance")
        _create_compute(
            api, gpu, handle, PlannedInstance(instance.profile, tuple(sorted(instance.compute_sizes, reverse=True)))
        )
    return True
