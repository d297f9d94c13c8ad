"""The opaque device configuration a claim (or its DeviceClass) gives this driver: NVIDIA's DRA driver's API.

A ResourceClaim's allocation carries `status.allocation.devices.config[]`: entries from the DeviceClass
(`source: FromClass`) and from the claim (`FromClaim`), each for some or all of the claim's requests, with
`opaque: {driver, parameters}`. Entries for another driver are skipped (a request may be served by several
drivers). The parameters this driver takes are NVIDIA's driver's, `apiVersion: resource.nvidia.com/v1beta1`:

    kind: GpuConfig            sharing: {strategy: TimeSlicing | MPS, timeSlicingConfig: {interval}, mpsConfig}
    kind: MigDeviceConfig      sharing: {strategy: TimeSlicing | MPS, mpsConfig}

decoded strictly, as NVIDIA's driver decodes what users write: a field the kind does not have, or a value of
the wrong type, refuses the claim with one sentence. Which entry applies to a device follows NVIDIA's driver:
the claim's entries after the class's, a later entry over an earlier one; an entry naming the device's
request must fit the device (GpuConfig a whole GPU, MigDeviceConfig a MIG device); an entry naming no
request applies to the devices it fits. Time-slicing on a whole GPU sets its time-slice interval
(`Default` 0, `Short` 1, `Medium` 2, `Long` 3) while the claim is prepared; on a MIG device it is accepted
and does nothing (NVIDIA's driver does the same: MIG devices have no time-slice setting). MPS is not
provided by this driver: a claim that asks for it is refused with one sentence (docs/dra.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_DEVICE_CONFIG = "MigDeviceConfig"
# NVIDIA's other kinds of the same API: known, and not served by this driver.
OTHER_KINDS = ("VfioDeviceConfig", "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig")
TIME_SLICING = "TimeSlicing"
MPS = "MPS"
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
_SOURCES = ("FromClass", "FromClaim")
_MPS_FIELDS = {
    "defaultActiveThreadPercentage": int,
    "defaultPinnedDeviceMemoryLimit": str,
    "defaultPerDevicePinnedMemoryLimit": dict,
    "multiUser": bool,
}


class OpaqueError(ValueError):
    """The configuration cannot be used; the message is the reason, to follow "ResourceClaim <ref>: "."""


@dataclass(frozen=True)
class DeviceConfig:
    kind: str  # GpuConfig or MigDeviceConfig
    strategy: Optional[str] = None  # None: no sharing
    interval: Optional[str] = None  # time-slicing on a whole GPU: the interval (Default when not given)
    requests: tuple[str, ...] = ()  # the requests it is for; () for every request it fits
    source: str = "FromClaim"

    @property
    def time_slice(self) -> Optional[int]:
        """The time-slice interval to set on the whole GPUs it applies to; None when it sets none."""
        if self.kind != GPU_CONFIG or self.strategy != TIME_SLICING:
            return None
        return INTERVALS[self.interval or "Default"]

    def fits(self, mig: bool) -> bool:
        return (self.kind == MIG_DEVICE_CONFIG) == mig


def _kind_name(value: Any) -> str:
    return repr(value) if not isinstance(value, str) else value


def _strict(data: Any, where: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """`data` as a mapping with only `fields` (name -> expected type), each of its type."""
    if not isinstance(data, Mapping):
        raise OpaqueError(f"{where} must be a mapping, not {type(data).__name__}")
    unknown = sorted(str(key) for key in data if key not in fields)
    if unknown:
        raise OpaqueError(f'{where} has the unknown field "{unknown[0]}" (it has {", ".join(sorted(fields))})')
    for key, value in data.items():
        kind = fields[key]
        if value is None:
            continue
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise OpaqueError(f"{where}.{key} must be an integer, not {value!r}")
        if kind is not int and not isinstance(value, kind):
            raise OpaqueError(
                f"{where}.{key} must be a {kind.__name__ if kind is not dict else 'mapping'}, not {value!r}"
            )
    return dict(data)


def decode(parameters: Any) -> DeviceConfig:
    """One entry's parameters as NVIDIA's driver decodes them, normalized (TimeSlicing's interval defaults to
    Default) and validated; OpaqueError with the reason otherwise."""
    if not isinstance(parameters, Mapping):
        raise OpaqueError(f"the opaque parameters must be an object, not {type(parameters).__name__}")
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version != API_VERSION:
        raise OpaqueError(f"the opaque parameters have apiVersion {_kind_name(api_version)}, not {API_VERSION}")
    if kind in OTHER_KINDS:
        raise OpaqueError(f"the opaque parameters are a {kind}, which this driver does not serve")
    if kind not in (GPU_CONFIG, MIG_DEVICE_CONFIG):
        raise OpaqueError(
            f"the opaque parameters have kind {_kind_name(kind)}, not {GPU_CONFIG} or {MIG_DEVICE_CONFIG}"
        )
    top = _strict(parameters, kind, {"apiVersion": str, "kind": str, "sharing": dict})
    sharing = top.get("sharing")
    if sharing is None:
        return DeviceConfig(kind)
    sharing_fields: dict[str, Any] = {"strategy": str, "mpsConfig": dict}
    if kind == GPU_CONFIG:
        sharing_fields["timeSlicingConfig"] = dict
    sharing = _strict(sharing, f"{kind}.sharing", sharing_fields)
    strategy = sharing.get("strategy")
    if strategy not in (TIME_SLICING, MPS):
        raise OpaqueError(
            f"{kind}.sharing.strategy is {_kind_name(strategy)}, not one of the strategies {TIME_SLICING} or {MPS}"
        )
    if sharing.get("mpsConfig") is not None:
        _strict(sharing["mpsConfig"], f"{kind}.sharing.mpsConfig", _MPS_FIELDS)
    if strategy == MPS:
        if sharing.get("timeSlicingConfig") is not None:
            raise OpaqueError(f"{kind}.sharing cannot have a timeSlicingConfig with the {MPS} strategy")
        return DeviceConfig(kind, MPS)
    if sharing.get("mpsConfig") is not None:
        raise OpaqueError(f"{kind}.sharing cannot have an mpsConfig with the {TIME_SLICING} strategy")
    interval = None
    if kind == GPU_CONFIG:
        slicing = _strict(
            sharing.get("timeSlicingConfig") or {}, f"{kind}.sharing.timeSlicingConfig", {"interval": str}
        )
        interval = slicing.get("interval") or "Default"
        if interval not in INTERVALS:
            raise OpaqueError(
                f"{kind}.sharing.timeSlicingConfig.interval is {_kind_name(interval)}, not one of"
                f" {', '.join(INTERVALS)}"
            )
    return DeviceConfig(kind, TIME_SLICING, interval)


def configs(allocation: Mapping[str, Any], driver: str) -> list[DeviceConfig]:
    """This driver's entries of `status.allocation.devices.config`, decoded, lowest precedence first (the class's,
    then the claim's, each in its order)."""
    entries = (allocation.get("devices") or {}).get("config") or []
    by_source: dict[str, list[DeviceConfig]] = {source: [] for source in _SOURCES}
    for position, entry in enumerate(entries):
        source = entry.get("source") if isinstance(entry, Mapping) else None
        if source not in _SOURCES:
            raise OpaqueError(f"device configuration {position} has the source {_kind_name(source)}")
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping):
            raise OpaqueError(
                f"device configuration {position} has no opaque parameters, the only kind this driver takes"
            )
        if opaque.get("driver") != driver:
            continue
        try:
            decoded = decode(opaque.get("parameters"))
        except OpaqueError as exc:
            origin = "its DeviceClass" if source == "FromClass" else "the claim"
            raise OpaqueError(f"the device configuration {position} (from {origin}): {exc}") from None
        requests = tuple(str(r) for r in entry.get("requests") or [])
        by_source[source].append(
            DeviceConfig(decoded.kind, decoded.strategy, decoded.interval, requests=requests, source=source)
        )
    return by_source["FromClass"] + by_source["FromClaim"]


def _names(request: str, requests: Sequence[str]) -> bool:
    """Whether an entry for `requests` names the result of `request` ("<request>" or "<request>/<subrequest>"):
    by its full name, or by its main request's (which names all its subrequests)."""
    return request in requests or request.split("/", 1)[0] in requests


def config_for(device: str, request: str, mig: bool, candidates: Sequence[DeviceConfig]) -> Optional[DeviceConfig]:
    """The entry that applies to an allocated device (the last that names its request, or else the last naming no
    request that fits the device); None when none does. OpaqueError when the entry naming the request does not fit."""
    for config in reversed(candidates):
        if config.requests and _names(request, config.requests):
            if not config.fits(mig):
                kind = "MIG device" if mig else "whole GPU"
                raise OpaqueError(f"a {config.kind} cannot apply to device {device}, a {kind} (request {request})")
            return config
        if not config.requests and config.fits(mig):
            return config
    return None
