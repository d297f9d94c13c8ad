"""A test double of pynvml (nvidia-ml-py): there is no NVIDIA GPU or driver on the test hosts.

It answers the NVML calls the daemon makes from a simulated-GPU spec, and lets a test inject XID
events, lose a GPU from the bus, or make nvmlInit fail. Constants carry pynvml's real values."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

from gpu_device_plugin import simspec
from gpu_device_plugin._shared import gpu_discovery, simulated_spec
from gpu_device_plugin.inventory import Gpu, Inventory, MigDevice

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeXidCriticalError = 0x8
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class _Memory:
    total: int
    free: int = 0
    used: int = 0
    reserved: int = 0


@dataclass
class _Utilization:
    gpu: int
    memory: int


# What each GPU reads: the mock NVML library's idle GPU (simulated_spec.MOCK_NVML_READINGS; None: NOT_SUPPORTED).
IDLE_READINGS: dict[str, Any] = dict(simulated_spec.MOCK_NVML_READINGS)
NVML_FI_DEV_MEMORY_TEMP = 82


@dataclass
class _Attributes:
    """NVML's nvmlDeviceAttributes_t, field for field."""

    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int


@dataclass
class _Pci:
    busId: str


@dataclass
class _Event:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class _Handle:
    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu


class _MigHandle:
    def __init__(self, gpu: Gpu, mig: MigDevice) -> None:
        self.gpu, self.mig = gpu, mig


def _bus(bus_id: str) -> str:
    return "0000" + bus_id.upper()


class PynvmlDouble:
    """Module-like object: pass it as `nvml=` to the daemon, or install it as `pynvml`."""

    NVMLError = NVMLError

    def __init__(self, inventory: Inventory, init_fails: Optional[Callable[[], bool]] = None) -> None:
        self.inventory = inventory
        self.init_fails = init_fails or (lambda: False)
        self.init_calls = 0
        self.initialized = False
        self.lost: set[str] = set()
        self.recovery_actions: dict[str, int] = {}  # what NVML_FI_DEV_GET_GPU_RECOVERY_ACTION answers, per GPU
        # The readings each GPU gives, the reading calls made, and a gate every reading call waits on while a test
        # holds it closed (NVML slow to answer).
        self.readings: dict[str, dict[str, Any]] = {g.uuid: dict(IDLE_READINGS) for g in inventory.gpus}
        self.reading_calls = 0
        self.readings_open = threading.Event()
        self.readings_open.set()
        self._events: queue.Queue[Any] = queue.Queue()
        self._handles = {g.uuid: _Handle(g) for g in inventory.gpus}
        self._lock = threading.Lock()
        for name, value in list(globals().items()):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, value)

    @classmethod
    def from_spec(cls, path: str, init_fails: Optional[Callable[[], bool]] = None) -> PynvmlDouble:
        return cls(simspec.load(path), init_fails)

    # -- what tests drive --------------------------------------------------------------------------
    def inject_xid(self, uuid: str, xid: int, recovery_action: Optional[int] = None) -> None:
        """An XID event; with `recovery_action`, the GPU's recovery action field is that value from now on
        (the driver sets it before it reports XID 154)."""
        if recovery_action is not None:
            self.recovery_actions[uuid] = recovery_action
        self._events.put(_Event(self._handles[uuid], nvmlEventTypeXidCriticalError, xid))

    def lose(self, uuid: str) -> None:
        self.lost.add(uuid)
        self._events.put(NVMLError(NVML_ERROR_GPU_IS_LOST))

    # -- NVML -----------------------------------------------------------------------------------------
    def _ready(self) -> None:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any) -> Gpu:
        self._ready()
        gpu: Gpu = handle.gpu
        if gpu.uuid in self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_fails():
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._ready()
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready()
        return self.inventory.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._ready()
        major, minor = self.inventory.cuda_driver_version.split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self.inventory.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._ready()
        return self._handles[self.inventory.gpus[index].uuid]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        self._ready()
        if uuid not in self._handles:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._handles[uuid]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, _MigHandle):
            return handle.mig.uuid
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        if isinstance(handle, _MigHandle):
            return f"{handle.gpu.name} MIG {handle.mig.profile}"
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Optional[int] = None) -> _Memory:
        if isinstance(handle, _MigHandle):
            return _Memory(handle.mig.memory_mib * 1024 * 1024)
        gpu = self._gpu(handle)
        if version is None:
            return _Memory(gpu.memory_mib * 1024 * 1024)
        reading = self._reading(handle)
        used, reserved = reading["memory_used_mib"], reading["memory_reserved_mib"]
        free = gpu.memory_mib - used - reserved
        return _Memory(*(mib * 1024 * 1024 for mib in (gpu.memory_mib, free, used, reserved)))

    # -- readings (dcgm.py) ------------------------------------------------------------------------------
    def _reading(self, handle: Any, key: Optional[str] = None) -> Any:
        """The GPU's readings (or one of them), after the gate; NOT_SUPPORTED for a reading set to None."""
        self.reading_calls += 1
        self.readings_open.wait()
        readings = self.readings[self._gpu(handle).uuid]
        if key is None:
            return readings
        if readings[key] is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return readings[key]

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == 0, "NVML_TEMPERATURE_GPU is the only sensor"
        return int(self._reading(handle, "temperature_c"))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._reading(handle, "power_mw"))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._reading(handle, "energy_mj"))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return int(self._reading(handle, "pcie_replays"))

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> _Utilization:
        reading = self._reading(handle)
        return _Utilization(reading["gpu_utilization_pct"], reading["memory_utilization_pct"])

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        return [int(self._reading(handle, "encoder_utilization_pct")), 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        return [int(self._reading(handle, "decoder_utilization_pct")), 167000]

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        names = ("graphics_clock_mhz", "sm_clock_mhz", "memory_clock_mhz", "video_clock_mhz")
        return int(self._reading(handle, names[clock]))

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        reading = self._reading(handle)
        keys = ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure")
        return (reading[keys[0]], reading[keys[1]], reading[keys[2]], reading[keys[3]])

    def nvmlDeviceGetAttributes_v2(self, handle: Any) -> _Attributes:
        """A MIG device's attributes as the mock NVML library models its product's profiles; NOT_SUPPORTED for a
        whole GPU (the daemon asks only MIG devices) and for a product or profile the library does not model."""
        if not isinstance(handle, _MigHandle):
            self._gpu(handle)
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        known = simulated_spec.mig_device_attributes(handle.gpu.name, handle.mig.profile)
        if None in known.values():
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Attributes(
            multiprocessorCount=known["multiprocessors"],
            sharedCopyEngineCount=known["copy_engines"],
            sharedDecoderCount=known["decoders"],
            sharedEncoderCount=known["encoders"],
            sharedJpegCount=known["jpeg_engines"],
            sharedOfaCount=known["ofa_engines"],
            gpuInstanceSliceCount=known["gpu_instance_slices"],
            computeInstanceSliceCount=known["compute_instance_slices"],
            memorySizeMB=handle.mig.memory_mib,
        )

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        brand = self._gpu(handle).brand
        if brand is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu_discovery.BRAND_NAMES.index(brand)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        """A MIG device's GPU instance: numbered by the device's position (one compute instance each)."""
        if not isinstance(handle, _MigHandle):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.mig.index + 1

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int) -> _MigHandle:
        gpu = self._gpu(handle)
        for mig in gpu.mig_devices:
            if mig.index + 1 == gpu_instance_id:
                return _MigHandle(gpu, mig)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: _MigHandle) -> SimpleNamespace:
        """nvmlGpuInstanceInfo_t's profile ID and placement, where the mock NVML library places the device."""
        mig = gpu_instance.mig
        if mig.profile_id is None or mig.placement_start is None or mig.placement_size is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        placement = SimpleNamespace(start=mig.placement_start, size=mig.placement_size)
        return SimpleNamespace(id=mig.index + 1, profileId=mig.profile_id, placement=placement)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> _Pci:
        return _Pci(_bus(self._gpu(handle).pci_bus_id))

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        major, minor = self._gpu(handle).compute_capability.split(".")
        return int(major), int(minor)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle).minor_number

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        node = self._gpu(handle).numa_node
        return -1 if node is None else node

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        gpu = self._gpu(handle)
        if gpu.mig_mode == "unsupported":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if gpu.mig_mode == "enabled" else NVML_DEVICE_MIG_DISABLE
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._gpu(handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _MigHandle:
        gpu = self._gpu(handle)
        if index >= len(gpu.mig_devices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _MigHandle(gpu, gpu.mig_devices[index])

    def _peers(self, gpu: Gpu) -> list[Gpu]:
        by_uuid = self.inventory.by_uuid()
        return [by_uuid[p] for p in sorted(gpu.nvlink_peers)]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        gpu = self._gpu(handle)
        if link >= 18:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if link < len(self._peers(gpu)) else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> _Pci:
        peers = self._peers(self._gpu(handle))
        if link >= len(peers):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Pci(_bus(peers[link].pci_bus_id))

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:
        ga, gb = self._gpu(a), self._gpu(b)
        if ga.pcie_switch is not None and ga.pcie_switch == gb.pcie_switch:
            return NVML_TOPOLOGY_MULTIPLE
        if ga.numa_node is not None and ga.numa_node == gb.numa_node:
            return NVML_TOPOLOGY_NODE
        return NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> list[Any]:
        gpu = self._gpu(handle)
        values = []
        for field_id in field_ids:
            if field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                value = self.recovery_actions.get(gpu.uuid)
            elif field_id == NVML_FI_DEV_MEMORY_TEMP:
                value = self._reading(handle)["memory_temperature_c"]
            else:
                value = None
            values.append(
                SimpleNamespace(
                    fieldId=field_id,
                    nvmlReturn=NVML_ERROR_NOT_SUPPORTED if value is None else 0,
                    value=SimpleNamespace(uiVal=value or 0),
                )
            )
        return values

    def nvmlEventSetCreate(self) -> object:
        self._ready()
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: object) -> None:
        self._gpu(handle)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> _Event:
        self._ready()
        try:
            item = self._events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None
        if isinstance(item, NVMLError):
            raise item
        return item  # type: ignore[no-any-return]

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass
