"""A test double of the ``pynvml`` module (nvidia-ml-py), for machines without an NVIDIA GPU.

Only the functions nvidia_gpu_info calls are doubled, with the real functions' parameter names
(test_nvml_test_double.py compares them with the installed nvidia-ml-py). Errors are the real
``pynvml.NVMLError`` subclasses, chosen by NVML error code as the real library does, and structs
are the real ctypes structs, so the code under test sees what real pynvml hands out. ``legacy=True``
plays an older pynvml: strings come back as bytes and the ``_v2``/``_v3`` functions do not exist.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Optional

import pynvml as real_pynvml

MIB = 1024 * 1024


@dataclass
class DoubleMigDevice:
    uuid: str
    name: str
    memory_mib: int
    slot: int = 0
    # nvmlDeviceGetAttributes_v2: {struct field: value}; None answers NOT_SUPPORTED.
    attributes: Optional[dict] = None
    # Its GPU instance (ID, profile ID, first memory slice, memory slices); None: NOT_SUPPORTED.
    gpu_instance: Optional[tuple] = None


@dataclass
class DoubleNvLink:
    remote_bus_id: str
    active: bool = True
    remote_type: int = real_pynvml.NVML_NVLINK_DEVICE_TYPE_GPU


@dataclass
class DoubleGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: str = "00000000:18:00.0"
    memory_mib: int = 81559
    compute_capability: tuple = (9, 0)
    numa_node: Optional[int] = 0  # None: NVML answers NOT_SUPPORTED
    persistence_mode: Optional[int] = 1  # None: NOT_SUPPORTED
    mig_mode: str = "disabled"  # enabled | disabled | unsupported
    mig_devices: list = field(default_factory=list)
    max_mig_devices: int = 7
    minor_number: Optional[int] = 0
    nvlinks: Optional[list] = None  # None: NOT_SUPPORTED on every link
    brand: Optional[int] = real_pynvml.NVML_BRAND_NVIDIA  # None: NOT_SUPPORTED


class _Handle:
    """Stands in for the opaque c_nvmlDevice_t that real pynvml returns."""

    def __init__(self, gpu_index, gpu, mig=None):
        self.gpu_index = gpu_index
        self.gpu = gpu
        self.mig = mig


_LEGACY_MISSING = {
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetAttributes_v2",
}


class NvmlTestDouble:
    """Behaves like ``pynvml`` on a host with the given GPUs and driver."""

    def __init__(
        self,
        gpus,
        driver_version="580.95.05",
        cuda_version=13000,
        init_error=None,
        fail_on=None,
        legacy=False,
    ):
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.init_error = init_error
        # {(function name, GPU index): NVML error code}; GPU index None for system calls.
        self.fail_on = dict(fail_on or {})
        self.legacy = legacy
        self.calls = []
        self.initialised = 0

    # Constants and error classes are the real ones.
    def __getattr__(self, name):
        if name.startswith(("NVML_", "NVMLError")):
            return getattr(real_pynvml, name)
        raise AttributeError(name)

    def __getattribute__(self, name):
        if name in _LEGACY_MISSING and object.__getattribute__(self, "legacy"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def count(self, name):
        return self.calls.count(name)

    # -- helpers -----------------------------------------------------------------------------

    def _enter(self, name, handle=None):
        self.calls.append(name)
        if not self.initialised:
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_UNINITIALIZED)
        key = (name, None if handle is None else handle.gpu_index)
        if key in self.fail_on:
            raise real_pynvml.NVMLError(self.fail_on[key])

    def _text(self, value):
        return value.encode() if self.legacy else value

    def _pci(self, bus_id):
        if self.legacy:
            return types.SimpleNamespace(busId=bus_id.encode())
        info = real_pynvml.nvmlPciInfo_t()
        info.busId = bus_id.encode()
        return info

    @staticmethod
    def _memory(mib):
        memory = real_pynvml.c_nvmlMemory_t()
        memory.total = mib * MIB
        memory.free = mib * MIB
        memory.used = 0
        return memory

    # -- library -----------------------------------------------------------------------------

    def nvmlInit(self):
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise real_pynvml.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self):
        self._enter("nvmlSystemGetDriverVersion")
        return self._text(self.driver_version)

    def nvmlSystemGetCudaDriverVersion(self):
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlSystemGetCudaDriverVersion_v2(self):
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex", _Handle(index, None))
        if not 0 <= index < len(self.gpus):
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index, self.gpus[index])

    # -- device ------------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle):
        self._enter("nvmlDeviceGetUUID", handle)
        return self._text(handle.mig.uuid if handle.mig else handle.gpu.uuid)

    def nvmlDeviceGetName(self, handle):
        self._enter("nvmlDeviceGetName", handle)
        return self._text(handle.mig.name if handle.mig else handle.gpu.name)

    def nvmlDeviceGetPciInfo_v3(self, handle):
        self._enter("nvmlDeviceGetPciInfo_v3", handle)
        return self._pci(handle.gpu.bus_id)

    def nvmlDeviceGetPciInfo(self, handle):
        self._enter("nvmlDeviceGetPciInfo", handle)
        return self._pci(handle.gpu.bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        return self._memory(handle.mig.memory_mib if handle.mig else handle.gpu.memory_mib)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        self._enter("nvmlDeviceGetCudaComputeCapability", handle)
        return tuple(handle.gpu.compute_capability)

    def _supported(self, value):
        if value is None:
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetNumaNodeId(self, handle):
        self._enter("nvmlDeviceGetNumaNodeId", handle)
        return self._supported(handle.gpu.numa_node)

    def nvmlDeviceGetPersistenceMode(self, handle):
        self._enter("nvmlDeviceGetPersistenceMode", handle)
        return self._supported(handle.gpu.persistence_mode)

    def nvmlDeviceGetMinorNumber(self, handle):
        self._enter("nvmlDeviceGetMinorNumber", handle)
        return self._supported(handle.gpu.minor_number)

    def nvmlDeviceGetMigMode(self, device):
        self._enter("nvmlDeviceGetMigMode", device)
        if device.gpu.mig_mode == "unsupported":
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = real_pynvml.NVML_DEVICE_MIG_ENABLE if device.gpu.mig_mode == "enabled" else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        self._enter("nvmlDeviceGetMaxMigDeviceCount", device)
        return device.gpu.max_mig_devices if device.gpu.mig_mode == "enabled" else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if index >= device.gpu.max_mig_devices:
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for mig in device.gpu.mig_devices:
            if mig.slot == index:
                return _Handle(device.gpu_index, device.gpu, mig)
        raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_NOT_FOUND)

    def _attributes(self, name, device):
        self._enter(name, device)
        if device.mig is None or device.mig.attributes is None:
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_NOT_SUPPORTED)
        attributes = real_pynvml.c_nvmlDeviceAttributes()
        for field_name, value in device.mig.attributes.items():
            setattr(attributes, field_name, value)
        return attributes

    def nvmlDeviceGetBrand(self, handle):
        self._enter("nvmlDeviceGetBrand", handle)
        return self._supported(handle.gpu.brand)

    def nvmlDeviceGetGpuInstanceId(self, device):
        self._enter("nvmlDeviceGetGpuInstanceId", device)
        if device.mig is None or device.mig.gpu_instance is None:
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device.mig.gpu_instance[0]

    def nvmlDeviceGetGpuInstanceById(self, device, gpuInstanceId):
        self._enter("nvmlDeviceGetGpuInstanceById", device)
        for mig in device.gpu.mig_devices:
            if mig.gpu_instance is not None and mig.gpu_instance[0] == gpuInstanceId:
                return _Handle(device.gpu_index, device.gpu, mig)
        raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gpuInstance):
        self._enter("nvmlGpuInstanceGetInfo", gpuInstance)
        info = real_pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId, info.placement.start, info.placement.size = gpuInstance.mig.gpu_instance
        return info

    def nvmlDeviceGetAttributes_v2(self, device):
        return self._attributes("nvmlDeviceGetAttributes_v2", device)

    def nvmlDeviceGetAttributes(self, device):
        return self._attributes("nvmlDeviceGetAttributes", device)

    def _link(self, device, link):
        links = device.gpu.nvlinks
        if links is None:
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(links):
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetNvLinkState(self, device, link):
        self._enter("nvmlDeviceGetNvLinkState", device)
        return real_pynvml.NVML_FEATURE_ENABLED if self._link(device, link).active else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device, link):
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo", device)
        return self._pci(self._link(device, link).remote_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        return self._link(handle, link).remote_type


DOUBLED_FUNCTIONS = sorted(name for name in vars(NvmlTestDouble) if name.startswith("nvml"))
