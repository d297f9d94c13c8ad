"""Settings: command-line flags, then environment variables, then the config file, then defaults.

The file accepts the fields of NVIDIA's device-plugin config `version: v1` that this daemon
implements, so an existing file can be reused, plus a `gpuops:` section for settings of our own.
Anything else is an error naming the field."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

import yaml

from gpu_device_plugin._shared import xid_classes
from gpu_device_plugin.dra.devices import DEFAULT_DRIVER_NAME

MIG_STRATEGIES = ("none", "single", "mixed")
LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri", "mounts")
ID_STRATEGIES = ("uuid", "index")
DEFAULT_RESOURCE = "nvidia.com/gpu"
ALLOCATION_MODES = ("device-plugin", "dra")
DEFAULT_HEALTH_FILE = "/var/lib/gpuops/gpu-health.json"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HOST = re.compile(r"^[A-Za-z0-9.-]*$")


def is_listen_address(text: str) -> bool:
    """HOST:PORT or :PORT (every address): HOST a name or an IPv4 address, PORT 0-65535 (0: one the kernel picks)."""
    host, sep, port = text.rpartition(":")
    return bool(sep) and bool(_HOST.match(host)) and port.isdigit() and int(port) <= 65535


DEFAULT_ALERT_TIMEOUT_SECONDS = 5.0
DEFAULT_ALERT_RESEND_SECONDS = 300.0
DEFAULT_ALERT_RESEND_MAX_SECONDS = 3600.0


def is_node_name(text: str) -> bool:
    """A Kubernetes Node's name: a lower-case DNS subdomain (RFC 1123) of at most 253 characters."""
    return 0 < len(text) <= 253 and all(_DNS_LABEL.match(label) for label in text.split("."))


class ConfigError(ValueError):
    """The configuration is invalid; the message is one sentence saying what and where."""


@dataclass(frozen=True)
class TimeSlicedResource:
    name: str
    replicas: int
    rename: Optional[str] = None
    devices: Optional[tuple[str, ...]] = None  # None: every GPU; else indices or UUIDs


@dataclass(frozen=True)
class TimeSlicing:
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[TimeSlicedResource, ...] = ()


@dataclass(frozen=True)
class MountsSettings:
    driver_root: str = "/"
    dev_root: str = "/dev"
    library_dirs: tuple[str, ...] = ()  # empty: found from where libnvidia-ml.so.1 lives
    binaries: tuple[str, ...] = (
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    )
    container_lib_dir: str = "/usr/local/nvidia/lib64"
    container_bin_dir: str = "/usr/local/nvidia/bin"
    # Where the host's driver root is mounted in this daemon's container (a DaemonSet pod: /driver-root);
    # empty when the daemon runs on the host itself. Paths given to the kubelet and the runtime stay the host's.
    container_driver_root: str = ""

    def local(self, host_path: str) -> str:
        """Where this daemon sees a path of the host's (the host's own path when it runs on the host)."""
        if not self.container_driver_root:
            return host_path
        relative = os.path.relpath(host_path, os.path.normpath(self.driver_root))
        if relative == ".." or relative.startswith("../"):
            return host_path
        return os.path.normpath(os.path.join(self.container_driver_root, relative))


@dataclass(frozen=True)
class Config:
    backend: str = "nvml"
    simulated_spec: Optional[str] = None
    kubelet_socket: str = "/var/lib/kubelet/device-plugins/kubelet.sock"
    config_file: Optional[str] = None
    fail_on_init_error: bool = True
    init_retry_seconds: float = 30.0
    mig_strategy: str = "none"
    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    pass_device_specs: bool = False
    pre_start_required: bool = False
    # Ask the nvidia runtime for GDRCopy, GPUDirect Storage and MOFED devices (NVIDIA_GDRCOPY=enabled ...):
    # it adds those the node has; on by default, as in NVIDIA's plugin.
    gdrcopy_enabled: bool = True
    gds_enabled: bool = True
    mofed_enabled: bool = True
    health_recovery_seconds: Optional[float] = None  # None: an Unhealthy GPU stays Unhealthy
    disable_healthchecks: str = ""
    enable_healthchecks: str = ""
    metrics_address: str = "127.0.0.1:9402"
    # GPU telemetry under dcgm-exporter's names (dcgm.py): HOST:PORT of its own listener ("": off) and how often
    # NVML is read for it. Only with the nvml backend.
    dcgm_metrics_address: str = ""
    dcgm_interval_seconds: float = 30.0
    # The kubelet's pod-resources socket, read with each reading of those metrics for their pod, namespace and
    # container labels ("": none).
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    log_format: str = "text"
    log_level: str = "info"
    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)
    mounts: MountsSettings = field(default_factory=MountsSettings)
    # DRA: "dra" serves the kubelet's DRA plugin API instead of the device-plugin API (never both).
    allocation_mode: str = "device-plugin"
    driver_name: str = DEFAULT_DRIVER_NAME
    plugin_registry_dir: str = "/var/lib/kubelet/plugins_registry"
    kubelet_plugins_dir: str = "/var/lib/kubelet/plugins"
    cdi_dir: str = "/var/run/cdi"
    node_name: str = ""
    kubeconfig: str = ""  # empty: the in-cluster service account
    # What sets a GPU's time-slice interval for a claim's GpuConfig (dra/timeslice.py): empty, the driver's
    # nvidia-smi under the driver root.
    nvidia_smi: str = ""
    # GPU faults (faults.py): the node-local health file ("" or "off": none), the XID classes of the user's
    # own as (xid, class) pairs over the collection's table, the Node condition GPUHealthy where the daemon
    # has API credentials, and the alert webhook ("" : none).
    health_file: str = DEFAULT_HEALTH_FILE
    xid_classes: tuple[tuple[int, str], ...] = ()
    node_condition: bool = True
    alert_webhook: str = ""
    # A file holding the token sent as "Authorization: Bearer <token>" with each alert ("": none), read at each POST
    # so a rotated token needs no restart; a file, not the token, so the daemon's config stays free of secrets.
    alert_webhook_token_file: str = ""
    # The token goes over plain http only where this allows it (a receiver on the node itself, a lab).
    alert_webhook_token_over_http: bool = False
    # One deadline for all of a POST (connect, send, the answer).
    alert_webhook_timeout_seconds: float = DEFAULT_ALERT_TIMEOUT_SECONDS
    # While a GPU stays in a class above device its alert is sent again after this (None: never), the pause
    # doubling up to alert_resend_max_seconds.
    alert_resend_seconds: Optional[float] = DEFAULT_ALERT_RESEND_SECONDS
    alert_resend_max_seconds: float = DEFAULT_ALERT_RESEND_MAX_SECONDS

    @property
    def xid_overrides(self) -> dict[int, str]:
        return dict(self.xid_classes)

    @property
    def plugin_dir(self) -> str:
        return os.path.dirname(os.path.abspath(self.kubelet_socket))

    @property
    def dra_plugin_dir(self) -> str:
        """The DRA socket and the checkpoint of prepared claims live here."""
        return os.path.join(self.kubelet_plugins_dir, self.driver_name)

    @property
    def dra_socket(self) -> str:
        return os.path.join(self.dra_plugin_dir, "dra.sock")

    @property
    def registration_socket(self) -> str:
        return os.path.join(self.plugin_registry_dir, f"{self.driver_name}-reg.sock")


# (attribute, environment variable, kind); kinds: str, bool, float, list
_ENV = (
    ("backend", "GPU_DEVICE_PLUGIN_BACKEND", "str"),
    ("simulated_spec", "GPU_DEVICE_PLUGIN_SIMULATED_SPEC", "str"),
    ("kubelet_socket", "GPU_DEVICE_PLUGIN_KUBELET_SOCKET", "str"),
    ("fail_on_init_error", "FAIL_ON_INIT_ERROR", "bool"),
    ("mig_strategy", "MIG_STRATEGY", "str"),
    ("device_list_strategy", "DEVICE_LIST_STRATEGY", "list"),
    ("device_id_strategy", "DEVICE_ID_STRATEGY", "str"),
    ("pass_device_specs", "PASS_DEVICE_SPECS", "bool"),
    ("gdrcopy_enabled", "GDRCOPY_ENABLED", "bool"),
    ("gds_enabled", "GDS_ENABLED", "bool"),
    ("mofed_enabled", "MOFED_ENABLED", "bool"),
    ("health_recovery_seconds", "GPU_DEVICE_PLUGIN_HEALTH_RECOVERY_SECONDS", "float"),
    ("disable_healthchecks", "DP_DISABLE_HEALTHCHECKS", "str"),
    ("enable_healthchecks", "DP_ENABLE_HEALTHCHECKS", "str"),
    ("metrics_address", "GPU_DEVICE_PLUGIN_METRICS_ADDRESS", "str"),
    ("dcgm_metrics_address", "GPU_DEVICE_PLUGIN_DCGM_METRICS_ADDRESS", "str"),
    ("dcgm_interval_seconds", "GPU_DEVICE_PLUGIN_DCGM_INTERVAL_SECONDS", "float"),
    ("pod_resources_socket", "GPU_DEVICE_PLUGIN_POD_RESOURCES_SOCKET", "str"),
    ("log_format", "GPU_DEVICE_PLUGIN_LOG_FORMAT", "str"),
    ("allocation_mode", "GPU_DEVICE_PLUGIN_ALLOCATION_MODE", "str"),
    ("driver_name", "GPU_DEVICE_PLUGIN_DRIVER_NAME", "str"),
    ("plugin_registry_dir", "GPU_DEVICE_PLUGIN_PLUGIN_REGISTRY_DIR", "str"),
    ("kubelet_plugins_dir", "GPU_DEVICE_PLUGIN_KUBELET_PLUGINS_DIR", "str"),
    ("cdi_dir", "GPU_DEVICE_PLUGIN_CDI_DIR", "str"),
    ("node_name", "NODE_NAME", "str"),
    ("kubeconfig", "GPU_DEVICE_PLUGIN_KUBECONFIG", "str"),
    ("nvidia_smi", "GPU_DEVICE_PLUGIN_NVIDIA_SMI", "str"),
    ("container_driver_root", "CONTAINER_DRIVER_ROOT", "str"),
    ("health_file", "GPU_DEVICE_PLUGIN_HEALTH_FILE", "str"),
    ("node_condition", "GPU_DEVICE_PLUGIN_NODE_CONDITION", "bool"),
    ("alert_webhook", "GPU_DEVICE_PLUGIN_ALERT_WEBHOOK", "str"),
    ("alert_webhook_token_file", "GPU_DEVICE_PLUGIN_ALERT_WEBHOOK_TOKEN_FILE", "str"),
    ("alert_webhook_token_over_http", "GPU_DEVICE_PLUGIN_ALERT_WEBHOOK_TOKEN_OVER_HTTP", "bool"),
    ("alert_webhook_timeout_seconds", "GPU_DEVICE_PLUGIN_ALERT_WEBHOOK_TIMEOUT_SECONDS", "float"),
    ("alert_resend_seconds", "GPU_DEVICE_PLUGIN_ALERT_RESEND_SECONDS", "float"),
    ("alert_resend_max_seconds", "GPU_DEVICE_PLUGIN_ALERT_RESEND_MAX_SECONDS", "float"),
)


def _convert(value: Any, kind: str, where: str) -> Any:
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where} must be true or false, not {value!r}.")
    if kind == "float":
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off", "never")):
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number of seconds or 'off', not {value!r}.") from None
        if number < 0:
            raise ConfigError(f"{where} must not be negative.")
        return number
    if kind == "list":
        items = value if isinstance(value, list) else str(value).split(",")
        return tuple(str(i).strip() for i in items if str(i).strip())
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(f"{where} must be a string.")
    return str(value)


def load_file(path: str) -> dict[str, Any]:
    """Read the YAML config file into a flat dict of Config attributes."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}{where}: the config file is not valid YAML.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config file must be a mapping.")
    return _FileReader(path).read(data)


class _FileReader:
    def __init__(self, path: str) -> None:
        self.path = path

    def mapping(self, data: Any, where: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ConfigError(f"{self.path}: {where} must be a mapping.")
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise ConfigError(
                f"{self.path}: unknown field {where + '.' if where != '(top level)' else ''}{unknown[0]}"
                f" (supported here: {', '.join(sorted(allowed))})."
            )
        return data

    def read(self, data: dict[str, Any]) -> dict[str, Any]:
        self.mapping(data, "(top level)", {"version", "flags", "sharing", "gpuops"})
        if data.get("version") != "v1":
            raise ConfigError(f"{self.path}: version must be v1, not {data.get('version')!r}.")
        out: dict[str, Any] = {}
        flags = self.mapping(
            data.get("flags") or {},
            "flags",
            {
                "migStrategy",
                "failOnInitError",
                "nvidiaDriverRoot",
                "gdrcopyEnabled",
                "gdsEnabled",
                "mofedEnabled",
                "plugin",
            },
        )
        pairs = (
            ("migStrategy", "mig_strategy", "str"),
            ("failOnInitError", "fail_on_init_error", "bool"),
            ("gdrcopyEnabled", "gdrcopy_enabled", "bool"),
            ("gdsEnabled", "gds_enabled", "bool"),
            ("mofedEnabled", "mofed_enabled", "bool"),
        )
        for key, attr, kind in pairs:
            if key in flags:
                out[attr] = _convert(flags[key], kind, f"{self.path}: flags.{key}")
        mounts: dict[str, Any] = {}
        if "nvidiaDriverRoot" in flags:
            mounts["driver_root"] = _convert(flags["nvidiaDriverRoot"], "str", f"{self.path}: flags.nvidiaDriverRoot")
        plugin = self.mapping(
            flags.get("plugin") or {}, "flags.plugin", {"passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy"}
        )
        plugin_pairs = (
            ("passDeviceSpecs", "pass_device_specs", "bool"),
            ("deviceListStrategy", "device_list_strategy", "list"),
            ("deviceIDStrategy", "device_id_strategy", "str"),
        )
        for key, attr, kind in plugin_pairs:
            if key in plugin:
                out[attr] = _convert(plugin[key], kind, f"{self.path}: flags.plugin.{key}")
        if "sharing" in data:
            out["time_slicing"] = self.sharing(data["sharing"])
        if "gpuops" in data:
            out.update(self.gpuops(data["gpuops"], mounts))
        if mounts:
            out["mounts"] = MountsSettings(**mounts)
        return out

    def sharing(self, data: Any) -> TimeSlicing:
        sharing = self.mapping(data or {}, "sharing", {"timeSlicing"})
        ts = self.mapping(
            sharing.get("timeSlicing") or {},
            "sharing.timeSlicing",
            {"renameByDefault", "failRequestsGreaterThanOne", "resources"},
        )
        where = f"{self.path}: sharing.timeSlicing"
        resources = []
        items = ts.get("resources") or []
        if not isinstance(items, list):
            raise ConfigError(f"{where}.resources must be a list.")
        for n, item in enumerate(items):
            res = self.mapping(item, f"sharing.timeSlicing.resources[{n}]", {"name", "replicas", "rename", "devices"})
            name, replicas = res.get("name"), res.get("replicas")
            if name != DEFAULT_RESOURCE:
                raise ConfigError(f"{where}.resources[{n}].name must be {DEFAULT_RESOURCE}, not {name!r}.")
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
                raise ConfigError(f"{where}.resources[{n}].replicas must be an integer of 1 or more.")
            devices = res.get("devices", "all")
            if devices == "all":
                chosen = None
            elif isinstance(devices, list) and all(isinstance(d, (int, str)) for d in devices):
                chosen = tuple(str(d) for d in devices)
            else:
                raise ConfigError(f"{where}.resources[{n}].devices must be 'all' or a list of GPU indices or UUIDs.")
            rename = res.get("rename")
            if rename is not None and not isinstance(rename, str):
                raise ConfigError(f"{where}.resources[{n}].rename must be a string.")
            resources.append(TimeSlicedResource(name, replicas, rename, chosen))
        return TimeSlicing(
            rename_by_default=_convert(ts.get("renameByDefault", False), "bool", f"{where}.renameByDefault"),
            fail_requests_greater_than_one=_convert(
                ts.get("failRequestsGreaterThanOne", False), "bool", f"{where}.failRequestsGreaterThanOne"
            ),
            resources=tuple(resources),
        )

    def gpuops(self, data: Any, mounts: dict[str, Any]) -> dict[str, Any]:
        keys = {
            "backend": ("backend", "str"),
            "simulatedSpec": ("simulated_spec", "str"),
            "kubeletSocket": ("kubelet_socket", "str"),
            "healthRecoverySeconds": ("health_recovery_seconds", "float"),
            "preStartRequired": ("pre_start_required", "bool"),
            "metricsAddress": ("metrics_address", "str"),
            "dcgmMetricsAddress": ("dcgm_metrics_address", "str"),
            "dcgmIntervalSeconds": ("dcgm_interval_seconds", "float"),
            "podResourcesSocket": ("pod_resources_socket", "str"),
            "logFormat": ("log_format", "str"),
            "initRetrySeconds": ("init_retry_seconds", "float"),
            "allocationMode": ("allocation_mode", "str"),
            "driverName": ("driver_name", "str"),
            "pluginRegistryDir": ("plugin_registry_dir", "str"),
            "kubeletPluginsDir": ("kubelet_plugins_dir", "str"),
            "cdiDir": ("cdi_dir", "str"),
            "nodeName": ("node_name", "str"),
            "kubeconfig": ("kubeconfig", "str"),
            "nvidiaSmi": ("nvidia_smi", "str"),
            "healthFile": ("health_file", "str"),
            "nodeCondition": ("node_condition", "bool"),
            "alertWebhook": ("alert_webhook", "str"),
            "alertWebhookTokenFile": ("alert_webhook_token_file", "str"),
            "alertWebhookTokenOverHttp": ("alert_webhook_token_over_http", "bool"),
            "alertWebhookTimeoutSeconds": ("alert_webhook_timeout_seconds", "float"),
            "alertResendSeconds": ("alert_resend_seconds", "float"),
            "alertResendMaxSeconds": ("alert_resend_max_seconds", "float"),
        }
        section = self.mapping(data, "gpuops", set(keys) | {"mounts", "xidClasses"})
        out: dict[str, Any] = {}
        for key, (attr, kind) in keys.items():
            if key in section:
                out[attr] = _convert(section[key], kind, f"{self.path}: gpuops.{key}")
        if "xidClasses" in section:
            try:
                parsed = xid_classes.parse_overrides(section["xidClasses"] or {}, f"{self.path}: gpuops.xidClasses")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            out["xid_classes"] = tuple(sorted(parsed.items()))
        mount_keys = {
            "driverRoot": ("driver_root", "str"),
            "devRoot": ("dev_root", "str"),
            "libraryDirs": ("library_dirs", "list"),
            "binaries": ("binaries", "list"),
            "containerLibDir": ("container_lib_dir", "str"),
            "containerBinDir": ("container_bin_dir", "str"),
            "containerDriverRoot": ("container_driver_root", "str"),
        }
        for key, value in self.mapping(section.get("mounts") or {}, "gpuops.mounts", set(mount_keys)).items():
            attr, kind = mount_keys[key]
            mounts[attr] = _convert(value, kind, f"{self.path}: gpuops.mounts.{key}")
        return out


def resolve(
    flags: Mapping[str, Any], env: Mapping[str, str], file_values: Optional[Mapping[str, Any]] = None
) -> Config:
    """Merge the sources (flag over env over file over default) and validate the result."""
    merged: dict[str, Any] = dict(file_values or {})
    for attr, var, kind in _ENV:
        if env.get(var, "") != "":
            merged[attr] = _convert(env[var], kind, f"environment variable {var}")
    for attr, value in flags.items():
        if value is not None:
            merged[attr] = value
    # A flag or variable of its own, kept with the other host paths in the mounts settings.
    inside = merged.pop("container_driver_root", None)
    if inside is not None:
        merged["mounts"] = replace(merged.get("mounts") or MountsSettings(), container_driver_root=inside)
    config = Config(**merged)
    _validate(config)
    return config


def _validate(config: Config) -> None:
    if config.backend not in ("nvml", "simulated"):
        raise ConfigError(f"backend must be nvml or simulated, not {config.backend!r}.")
    if config.backend == "simulated" and not config.simulated_spec:
        raise ConfigError("the simulated backend needs a spec file (--simulated-spec FILE).")
    if config.mig_strategy not in MIG_STRATEGIES:
        raise ConfigError(f"mig strategy must be one of {', '.join(MIG_STRATEGIES)}, not {config.mig_strategy!r}.")
    bad = [s for s in config.device_list_strategy if s not in LIST_STRATEGIES]
    if bad or not config.device_list_strategy:
        raise ConfigError(
            f"device list strategy {','.join(bad) or '(empty)'} is not one of {', '.join(LIST_STRATEGIES)}."
        )
    if config.device_id_strategy not in ID_STRATEGIES:
        raise ConfigError(f"device ID strategy must be uuid or index, not {config.device_id_strategy!r}.")
    if config.log_format not in ("json", "text"):
        raise ConfigError(f"log format must be json or text, not {config.log_format!r}.")
    if len(config.time_slicing.resources) > 1:
        raise ConfigError("sharing.timeSlicing.resources may name nvidia.com/gpu once.")
    if config.allocation_mode not in ALLOCATION_MODES:
        raise ConfigError(f"allocation mode must be device-plugin or dra, not {config.allocation_mode!r}.")
    labels = config.driver_name.split(".")
    if len(config.driver_name) > 63 or len(labels) < 2 or not all(_DNS_LABEL.match(part) for part in labels):
        raise ConfigError(
            f"driver name must be a lowercase DNS subdomain of at most 63 characters with a dot"
            f" (gpu.example.com), not {config.driver_name!r}."
        )
    if config.health_file not in ("", "off") and not os.path.isabs(config.health_file):
        raise ConfigError(f"healthFile must be an absolute path or off, not {config.health_file!r}.")
    if config.alert_webhook and not re.match(r"^https?://[^/\s]+", config.alert_webhook):
        raise ConfigError(f"alertWebhook must be an http:// or https:// URL, not {config.alert_webhook!r}.")
    if config.alert_webhook_token_file and not os.path.isabs(config.alert_webhook_token_file):
        raise ConfigError(f"alertWebhookTokenFile must be an absolute path, not {config.alert_webhook_token_file!r}.")
    if config.alert_webhook_timeout_seconds is None or not config.alert_webhook_timeout_seconds > 0:
        raise ConfigError("alertWebhookTimeoutSeconds must be a number of seconds above 0.")
    if config.alert_resend_seconds is not None and not config.alert_resend_seconds > 0:
        raise ConfigError("alertResendSeconds must be a number of seconds above 0, or off.")
    if config.alert_resend_max_seconds is None or not config.alert_resend_max_seconds > 0:
        raise ConfigError("alertResendMaxSeconds must be a number of seconds above 0.")
    if config.dcgm_metrics_address and not is_listen_address(config.dcgm_metrics_address):
        raise ConfigError(
            f"dcgmMetricsAddress must be HOST:PORT or :PORT (port 0-65535), or empty for off,"
            f" not {config.dcgm_metrics_address!r}."
        )
    if config.dcgm_interval_seconds is None or not config.dcgm_interval_seconds >= 1:
        raise ConfigError("dcgmIntervalSeconds must be a number of seconds of 1 or more.")
    if config.node_name and not is_node_name(config.node_name):
        raise ConfigError(
            f"the node name must be a Kubernetes node name (a lower-case DNS subdomain), not {config.node_name!r}."
        )
    if config.allocation_mode == "dra" and not config.node_name:
        raise ConfigError("dra allocation mode needs the node's name (--node-name or the NODE_NAME variable).")
