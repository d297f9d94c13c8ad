"""GPU telemetry under dcgm-exporter's names, read from NVML: what dashboards and alerts built on dcgm-exporter
read (its metric names, Prometheus types, units and label keys), without DCGM on the node.

One thread reads every GPU at the collect interval (`Sampler`); a scrape renders the last reading and never calls
NVML, so neither Prometheus nor the daemon's device-plugin and DRA paths (which never call NVML to answer the
kubelet) wait on a GPU that is slow to answer. The reading is served on a listener of its own (`Listener`, port
9400 as dcgm-exporter's), apart from the daemon's own metrics.

What is exported, each metric's NVML source, and what dcgm-exporter exports that NVML cannot give: docs/metrics.md.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from gpu_device_plugin.inventory import Gpu, Inventory
from gpu_device_plugin.metrics import HttpServer

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_ADDRESS = ":9400"
DEFAULT_INTERVAL_SECONDS = 30.0

# NVML's constants (nvml.h), as pynvml names them.
_CLOCK_SM = 1
_CLOCK_MEM = 2
_TEMPERATURE_GPU = 0
_FI_DEV_MEMORY_TEMP = 82
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and _RX (KiB) of every NVLink of the GPU (scope UINT_MAX), as DCGM reads them
# for DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL: a pynvml field ID may be a (field, scope) pair.
_NVLINK_DATA_ALL_LINKS = [(138, 0xFFFFFFFF), (139, 0xFFFFFFFF)]
_MEMORY_V2 = 0x02000028
_ERROR_NOT_SUPPORTED = 3
_ERROR_FUNCTION_NOT_FOUND = 13
_ERROR_GPU_IS_LOST = 15
_MIB = 1 << 20
# The profiling fields from NVML's GPM metrics (nvmlGpmMetricsGet between two samples; Hopper and newer):
# dcgm-exporter's name, the GPM metric's ID (NVML_GPM_METRIC_*) and its unit, which dcgm-exporter's gives as a ratio
# (%) or in bytes per second (MiB/s).
GPM_FIELDS = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1, "%"),  # NVML_GPM_METRIC_GRAPHICS_UTIL
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 7, "%"),  # NVML_GPM_METRIC_HMMA_TENSOR_UTIL
    ("DCGM_FI_PROF_DRAM_ACTIVE", 10, "%"),  # NVML_GPM_METRIC_DRAM_BW_UTIL
    ("DCGM_FI_PROF_PCIE_TX_BYTES", 20, "MiB/s"),  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    ("DCGM_FI_PROF_PCIE_RX_BYTES", 21, "MiB/s"),  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
)

# What a MIG device's sample gives (nvmlGpmMigSampleGet, its GPU instance): the fields DCGM reads below the GPU's own
# level; PCIe traffic is the GPU's (DCGM's field levels, dcgmlib/src/dcgm_fields.cpp).
GPM_MIG_FIELDS = tuple(f for f in GPM_FIELDS if not f[0].startswith("DCGM_FI_PROF_PCIE_"))


def _from_gpm(value: float, unit: str) -> float:
    return value / 100 if unit == "%" else value * _MIB


@dataclass(frozen=True)
class Field:
    """One of dcgm-exporter's default fields: its name, Prometheus type and the help line this exporter gives."""

    name: str
    kind: str  # gauge or counter
    help: str


# In the order dcgm-exporter's default counters list them (etc/default-counters.csv at d5e5f51).
FIELDS = (
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock in MHz."),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock in MHz."),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature in degrees C."),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature in degrees C."),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw in W."),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Energy used since the driver loaded, in mJ."),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "PCIe replays."),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilisation in %."),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory copy utilisation in %."),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilisation in %."),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilisation in %."),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "The last XID this daemon saw on the GPU (0: none)."),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free in MiB."),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used in MiB."),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved by the driver in MiB."),
    # dcgm-exporter's type; the value is DCGM's rate over the last interval (NvLinkBandwidth), not a running total.
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "NVLink data received and sent over all links since the last reading, in KiB/s / 1000 (as DCGM gives it).",
    ),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for uncorrectable errors."),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for correctable errors."),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "1 when a row remapping has failed, else 0."),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine was active (NVML GPM)."),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of time the HMMA tensor pipe was active (NVML GPM)."),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of the DRAM bandwidth in use (NVML GPM)."),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "PCIe bytes sent per second (NVML GPM)."),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "PCIe bytes received per second (NVML GPM)."),
)
FIELD_NAMES = tuple(f.name for f in FIELDS)
DRIVER_VERSION_LABEL = "DCGM_FI_DRIVER_VERSION"


def read_gpu(nvml: Any, handle: Any) -> Optional[dict[str, float]]:
    """Every field NVML gives for one GPU (XID aside), by dcgm-exporter's name; a field NVML does not give for this
    GPU (not supported, or another NVML error) is left out. None for a GPU that fell off the bus (its series are
    then its last XID alone)."""
    lost: list[bool] = []

    def get(read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return read(handle, *args, **kwargs)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == _ERROR_GPU_IS_LOST:
                lost.append(True)
            return None

    values: dict[str, Any] = {
        "DCGM_FI_DEV_SM_CLOCK": get(nvml.nvmlDeviceGetClockInfo, _CLOCK_SM),
        "DCGM_FI_DEV_MEM_CLOCK": get(nvml.nvmlDeviceGetClockInfo, _CLOCK_MEM),
        "DCGM_FI_DEV_GPU_TEMP": get(nvml.nvmlDeviceGetTemperature, _TEMPERATURE_GPU),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": get(nvml.nvmlDeviceGetTotalEnergyConsumption),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": get(nvml.nvmlDeviceGetPcieReplayCounter),
    }
    field = get(nvml.nvmlDeviceGetFieldValues, [_FI_DEV_MEMORY_TEMP])
    if field and field[0].nvmlReturn == 0:
        values["DCGM_FI_DEV_MEMORY_TEMP"] = field[0].value.uiVal
    milliwatts = get(nvml.nvmlDeviceGetPowerUsage)
    if milliwatts is not None:
        values["DCGM_FI_DEV_POWER_USAGE"] = milliwatts / 1000.0
    rates = get(nvml.nvmlDeviceGetUtilizationRates)
    if rates is not None:
        values["DCGM_FI_DEV_GPU_UTIL"], values["DCGM_FI_DEV_MEM_COPY_UTIL"] = rates.gpu, rates.memory
    # [utilisation in %, the sampling period in microseconds]
    for name, read in (
        ("DCGM_FI_DEV_ENC_UTIL", nvml.nvmlDeviceGetEncoderUtilization),
        ("DCGM_FI_DEV_DEC_UTIL", nvml.nvmlDeviceGetDecoderUtilization),
    ):
        sample = get(read)
        if sample is not None:
            values[name] = sample[0]
    memory = get(nvml.nvmlDeviceGetMemoryInfo, version=_MEMORY_V2)
    if memory is not None:
        values["DCGM_FI_DEV_FB_FREE"] = memory.free // _MIB
        values["DCGM_FI_DEV_FB_USED"] = memory.used // _MIB
        values["DCGM_FI_DEV_FB_RESERVED"] = memory.reserved // _MIB
    rows = get(nvml.nvmlDeviceGetRemappedRows)  # (corrected, uncorrected, pending, failed)
    if rows is not None:
        values["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = rows[0]
        values["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = rows[1]
        values["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = 1 if rows[3] else 0
    if lost:
        return None
    return {name: value for name, value in values.items() if value is not None}


def read_mig(nvml: Any, handle: Any) -> Optional[dict[str, float]]:
    """A MIG device's framebuffer, free and used (MiB), as dcgm-exporter reads it for the device's series; None
    where NVML does not answer."""
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError:
        return None
    return {"DCGM_FI_DEV_FB_FREE": memory.free // _MIB, "DCGM_FI_DEV_FB_USED": memory.used // _MIB}


def mig_labels(parent: tuple[tuple[str, str], ...], profile: str, instance_id: int) -> tuple[tuple[str, str], ...]:
    """A MIG device's series' labels: its GPU's, with `GPU_I_PROFILE` and `GPU_I_ID` (its GPU instance) after
    `modelName`, as dcgm-exporter places them."""
    at = [key for key, _value in parent].index("modelName") + 1
    return (*parent[:at], ("GPU_I_PROFILE", profile), ("GPU_I_ID", str(instance_id)), *parent[at:])


class Gpm:
    """The profiling fields of each GPU and MIG device from NVML's GPM API: a sample per GPU (or per MIG device's GPU
    instance, through its GPU's handle) at each reading, the metrics between its last two samples (so from its second
    reading on). A GPU without GPM (before Hopper, a driver or bindings without the API) has none, nor have its MIG
    devices, said once per UUID; only the sampler's thread calls it."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._last: dict[str, Any] = {}  # GPU or MIG device UUID -> its last sample
        self._without: set[str] = set()  # UUIDs without GPM

    def read(self, uuid: str, handle: Any, instance: Optional[int] = None, gpu: str = "") -> dict[str, float]:
        """The fields of the GPU `handle`, or with `instance` (a GPU instance's ID) of that MIG device of it (`gpu`:
        the GPU's UUID, read first: a GPU without GPM has said so for its MIG devices too)."""
        if uuid in self._without or gpu in self._without:
            return {}
        nvml = self.nvml
        fields = GPM_FIELDS if instance is None else GPM_MIG_FIELDS
        try:
            if uuid not in self._last and not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return self._none(uuid, "the GPU has no GPM (Hopper and newer)")
            sample = nvml.nvmlGpmSampleAlloc()
        except AttributeError:
            return self._none(uuid, "the NVML bindings have no GPM API")
        except nvml.NVMLError as exc:
            return self._gone(uuid, exc)
        try:
            if instance is None:
                nvml.nvmlGpmSampleGet(handle, sample)
            else:
                nvml.nvmlGpmMigSampleGet(handle, instance, sample)
        except nvml.NVMLError as exc:
            nvml.nvmlGpmSampleFree(sample)
            return self._gone(uuid, exc)
        previous, self._last[uuid] = self._last.get(uuid), sample
        if previous is None:
            return {}
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(fields)
            request.sample1, request.sample2 = previous, sample
            for slot, (_name, metric, _unit) in zip(request.metrics, fields):
                slot.metricId = metric
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError:
            return {}
        finally:
            nvml.nvmlGpmSampleFree(previous)
        return {
            name: _from_gpm(slot.value, unit)
            for slot, (name, _metric, unit) in zip(request.metrics, fields)
            if slot.nvmlReturn == 0
        }

    def _none(self, uuid: str, why: str) -> dict[str, float]:
        self._without.add(uuid)
        log.info("the profiling fields (DCGM_FI_PROF_*) are absent for GPU %s: %s", uuid, why)
        return {}

    def _gone(self, uuid: str, exc: Exception) -> dict[str, float]:
        """NVML refused a sample: for good where it has no GPM there, else (a GPU off the bus) until it answers."""
        if getattr(exc, "value", None) in (_ERROR_NOT_SUPPORTED, _ERROR_FUNCTION_NOT_FOUND):
            return self._none(uuid, f"NVML answers {exc}")
        self.forget(uuid)
        return {}

    def forget(self, uuid: str) -> None:
        sample = self._last.pop(uuid, None)
        if sample is not None:
            self.nvml.nvmlGpmSampleFree(sample)

    def keep_only(self, uuids: set[str]) -> None:
        for uuid in set(self._last) - uuids:
            self.forget(uuid)

    def close(self) -> None:
        self.keep_only(set())


class NvLinkBandwidth:
    """DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as DCGM computes it (DcgmCacheManager's ReadAndCacheNvLinkBandwidth, DCGM
    4.6.0): NVML's NVLink data counters of all links, received and sent (KiB), summed at each reading of a GPU in one
    nvmlDeviceGetFieldValues call; the value is the sum's growth since the GPU's previous reading over the time between
    their timestamps (the later of the two fields'), in KiB/s / 1000 (DCGM's "MiB/s"), truncated. From a GPU's second
    reading on (DCGM gives 0 at its first). None where a field is not given (a GPU without NVLink: not supported; the
    last reading that gave both stays the one to compare with), for a reading with no time since the previous (which
    stays the previous), or where the sum went back (a driver reload restarts the counters; it is the next reading's
    previous). Only the sampler's thread calls it."""

    NAME = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._last: dict[str, tuple[int, int]] = {}  # GPU UUID -> (KiB, µs since the epoch) at its last reading

    def read(self, uuid: str, handle: Any) -> dict[str, float]:
        try:
            fields = self.nvml.nvmlDeviceGetFieldValues(handle, _NVLINK_DATA_ALL_LINKS)
        except self.nvml.NVMLError:
            return {}
        if any(field.nvmlReturn != 0 for field in fields):
            return {}
        kib = sum(int(field.value.ullVal) for field in fields)
        at = max(int(field.timestamp) for field in fields)
        previous = self._last.get(uuid)
        if previous is not None and at == previous[1]:
            return {}
        self._last[uuid] = (kib, at)
        if previous is None or kib < previous[0] or at < previous[1]:
            return {}
        # KiB over µs, as integers: (KiB / (µs / 10^6)) / 1000 with no float to round it down by one.
        return {self.NAME: (kib - previous[0]) * 1_000_000 // ((at - previous[1]) * 1000)}

    def forget(self, uuid: str) -> None:
        self._last.pop(uuid, None)

    def keep_only(self, uuids: set[str]) -> None:
        for uuid in set(self._last) - uuids:
            self.forget(uuid)


@dataclass(frozen=True)
class GpuReading:
    """One GPU's labels (dcgm-exporter's keys, in its order) and values at one reading."""

    labels: tuple[tuple[str, str], ...]
    values: dict[str, float]
    # The containers holding the GPU (pod, namespace, container and a claim's dra_* labels): a series for each.
    holders: tuple[tuple[tuple[str, str], ...], ...] = ()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_labels(nvml: Any, handle: Optional[Any], gpu: Gpu, hostname: str) -> tuple[tuple[str, str], ...]:
    """`gpu` (the NVML index), `UUID`, `pci_bus_id` (NVML's form, 00000000:3B:00.0), `device` (nvidia<index>),
    `modelName` (NVML's name), then `hostname` where one is given."""
    bus_id = gpu.pci_bus_id  # the inventory's form where NVML no longer answers (None: a GPU off the bus)
    if handle is not None:
        with contextlib.suppress(nvml.NVMLError):
            bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    labels = [
        ("gpu", str(gpu.index)),
        ("UUID", gpu.uuid),
        ("pci_bus_id", bus_id),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", gpu.name),
    ]
    if hostname:
        labels.append(("hostname", hostname))
    return tuple(labels)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render(readings: Sequence[GpuReading], driver_version: str = "") -> bytes:
    """The Prometheus text format (0.0.4), a family per field with a series per GPU that has a value for it."""
    extra = f',{DRIVER_VERSION_LABEL}="{_escape(driver_version)}"' if driver_version else ""
    lines: list[str] = []
    for field in FIELDS:
        series = [r for r in readings if field.name in r.values]
        if not series:
            continue
        lines.append(f"# HELP {field.name} {field.help}")
        lines.append(f"# TYPE {field.name} {field.kind}")
        for reading in series:
            value = reading.values[field.name]
            base = ",".join(f'{key}="{_escape(text)}"' for key, text in reading.labels) + extra
            code = f',err_code="{_number(value)}"' if field.name == "DCGM_FI_DEV_XID_ERRORS" else ""
            for holder in reading.holders or ((),):
                labels = base + "".join(f',{key}="{_escape(text)}"' for key, text in holder) + code
                lines.append(f"{field.name}{{{labels}}} {_number(value)}")
    return ("\n".join(lines) + "\n").encode() if lines else b""


Holders = Callable[[Inventory], "dict[str, list[tuple[tuple[str, str], ...]]]"]


class Sampler:
    """Reads every GPU of `inventory()` through `nvml` every `interval` seconds on a thread of its own; `render()`
    gives the last reading. `last_xid(uuid)` is the last XID the daemon's event watcher saw on a GPU; `holders`
    gives, with each reading, the label sets of the containers holding each GPU (gpu_pods.holders_by_gpu)."""

    def __init__(
        self,
        nvml: Any,
        inventory: Callable[[], Inventory],
        interval: float = DEFAULT_INTERVAL_SECONDS,
        hostname: str = "",
        last_xid: Callable[[str], Optional[int]] = lambda uuid: None,
        holders: Holders = lambda inventory: {},
    ) -> None:
        self.nvml = nvml
        self.holders = holders
        self.inventory = inventory
        self.interval = interval
        self.hostname = hostname
        self.last_xid = last_xid
        self.readings = 0
        self.last_seconds: Optional[float] = None
        self._labels: dict[str, tuple[tuple[str, str], ...]] = {}
        self.gpm = Gpm(nvml)
        self.nvlink = NvLinkBandwidth(nvml)
        self._rendered = b""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def read(self) -> None:
        """One reading of every GPU, kept for the scrapes until the next."""
        started = time.monotonic()
        snapshot = self.inventory()
        held = self.holders(snapshot)
        readings = []
        for gpu in snapshot.gpus:
            try:
                handle = self.nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            except self.nvml.NVMLError as exc:
                if getattr(exc, "value", None) != _ERROR_GPU_IS_LOST:
                    continue  # gone from NVML: no series until it answers again
                handle = None
            read = read_gpu(self.nvml, handle) if handle is not None else None
            # A GPU off the bus (XID 79) keeps its last XID alone: what an alert on it reads.
            values = read if read is not None else {}
            if read is not None:
                values.update(self.gpm.read(gpu.uuid, handle))
                values.update(self.nvlink.read(gpu.uuid, handle))
            else:
                self.gpm.forget(gpu.uuid)
                self.nvlink.forget(gpu.uuid)
            values["DCGM_FI_DEV_XID_ERRORS"] = self.last_xid(gpu.uuid) or 0
            labels = self._labels.get(gpu.uuid)
            if labels is None:
                labels = self._labels[gpu.uuid] = gpu_labels(self.nvml, handle, gpu, self.hostname)
            readings.append(GpuReading(labels, values, tuple(held.get(gpu.uuid, ()))))
            for mig in gpu.mig_devices if read is not None else ():
                reading = self._read_mig(mig, (gpu.uuid, handle), labels, tuple(held.get(mig.uuid, ())))
                if reading is not None:
                    readings.append(reading)
        self.gpm.keep_only({gpu.uuid for gpu in snapshot.gpus} | {m.uuid for g in snapshot.gpus for m in g.mig_devices})
        self.nvlink.keep_only({gpu.uuid for gpu in snapshot.gpus})
        rendered = render(readings, snapshot.driver_version)
        with self._lock:
            self._rendered = rendered
            self.readings += 1
            self.last_seconds = time.monotonic() - started

    def _read_mig(
        self,
        mig: Any,
        gpu: tuple[str, Any],  # its GPU's UUID and handle
        parent: tuple[tuple[str, str], ...],
        holders: tuple[tuple[tuple[str, str], ...], ...],
    ) -> Optional[GpuReading]:
        try:
            handle = self.nvml.nvmlDeviceGetHandleByUUID(mig.uuid)
            instance_id = self.nvml.nvmlDeviceGetGpuInstanceId(handle)
        except self.nvml.NVMLError:
            self.gpm.forget(mig.uuid)
            return None  # not in NVML's layout now: no series until it is
        values = read_mig(self.nvml, handle)
        if values is None:
            self.gpm.forget(mig.uuid)
            return None
        values.update(self.gpm.read(mig.uuid, gpu[1], instance_id, gpu=gpu[0]))
        return GpuReading(mig_labels(parent, mig.profile, instance_id), values, holders)

    def render(self) -> bytes:
        with self._lock:
            return self._rendered

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dcgm-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.read()
            except Exception:  # one bad reading must not end the exporter
                log.exception("reading the GPUs for the dcgm metrics failed; trying again at the next interval")
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._thread is None or not self._thread.is_alive():
            self.gpm.close()  # never under a reading still running


class Listener(HttpServer):
    """GET /metrics answers `render()`; anything else 404."""

    def __init__(self, address: str, render: Callable[[], bytes]) -> None:
        super().__init__(address, {"/metrics": lambda: (200, CONTENT_TYPE, render())}, "dcgm-http")

    def start(self) -> None:
        super().start()
        log.info("serving the dcgm metrics on /metrics", extra={"address": self.address})


def hostname_label(node_name: str) -> str:
    """dcgm-exporter's `hostname`: the node's name where the daemon knows it, else the machine's host name."""
    return node_name or socket.gethostname()
