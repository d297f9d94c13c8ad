"""`gpu-device-plugin`: command line, logging, and the run of the daemon."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence

from gpu_device_plugin import __version__, config, gpu_pods
from gpu_device_plugin import log as logsetup
from gpu_device_plugin.daemon import Daemon
from gpu_device_plugin.discovery import BackendError, make_backend
from gpu_device_plugin.dra.devices import DEFAULT_DRIVER_NAME

log = logging.getLogger("gpu_device_plugin")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def _seconds(text: str) -> float:
    if text.strip().lower() in ("off", "never"):
        return -1.0
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds or 'off', not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-device-plugin",
        description="Advertise NVIDIA GPUs to the kubelet: device-plugin API v1beta1, or DRA (--allocation-mode dra).",
        epilog="gpu-device-plugin gpu-pods --gpu UUID ... [flags]: the pods holding devices of those GPUs, as JSON"
        " (gpu-pods --help).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_daemon_flags(p)
    return p


def add_daemon_flags(p: argparse.ArgumentParser) -> None:
    """The daemon's settings as flags (gpu-pods takes them too, so that it names devices as the daemon does)."""
    p.add_argument("--config-file", help="YAML config (NVIDIA's version: v1 fields we support, plus gpuops:)")
    p.add_argument("--backend", choices=("nvml", "simulated"), help="GPU discovery backend (default nvml)")
    p.add_argument("--simulated-spec", help="simulated-GPU spec file, watched for edits (labs and CI only)")
    p.add_argument("--kubelet-socket", help="the kubelet's registration socket; our sockets go beside it")
    p.add_argument("--fail-on-init-error", type=_bool, nargs="?", const=True, metavar="BOOL")
    p.add_argument("--init-retry-seconds", type=float, help="retry period when discovery fails (default 30)")
    p.add_argument("--mig-strategy", choices=config.MIG_STRATEGIES)
    p.add_argument(
        "--device-list-strategy",
        action="append",
        help=f"any of {', '.join(config.LIST_STRATEGIES)}; repeat or comma-separate to combine",
    )
    p.add_argument("--device-id-strategy", choices=config.ID_STRATEGIES)
    p.add_argument("--pass-device-specs", type=_bool, nargs="?", const=True, metavar="BOOL")
    for feature, what in (("gdrcopy", "GDRCopy"), ("gds", "GPUDirect Storage"), ("mofed", "MOFED")):
        p.add_argument(
            f"--{feature}-enabled",
            type=_bool,
            nargs="?",
            const=True,
            metavar="BOOL",
            help=f"ask the nvidia runtime for the node's {what} devices (default true)",
        )
    p.add_argument(
        "--pre-start-required",
        type=_bool,
        nargs="?",
        const=True,
        metavar="BOOL",
        help="ask the kubelet for PreStartContainer and refuse containers on unhealthy GPUs",
    )
    p.add_argument(
        "--health-recovery-seconds",
        type=_seconds,
        help="make an Unhealthy GPU Healthy after this many quiet seconds (default off)",
    )
    p.add_argument(
        "--container-driver-root",
        help="where the host's driver root is mounted in this container (a DaemonSet pod: /driver-root)",
    )
    p.add_argument("--metrics-address", help="HOST:PORT for /metrics and /healthz; empty turns it off")
    p.add_argument(
        "--dcgm-metrics-address",
        help="HOST:PORT for the GPUs' metrics under dcgm-exporter's names (as dcgm-exporter: :9400); empty: off",
    )
    p.add_argument("--dcgm-interval-seconds", type=float, help="how often NVML is read for those metrics (default 30)")
    p.add_argument(
        "--pod-resources-socket",
        help="the kubelet's pod-resources socket, for those metrics' pod labels "
        f"(default {config.DEFAULT_POD_RESOURCES_SOCKET}; empty: no pod labels)",
    )
    p.add_argument(
        "--health-file",
        help=f"where the GPUs' health, XIDs and classes go (default {config.DEFAULT_HEALTH_FILE}; off: nowhere)",
    )
    p.add_argument("--alert-webhook", help="URL to POST a GPU's class to when it rises above device (default: none)")
    p.add_argument(
        "--allocation-mode",
        choices=config.ALLOCATION_MODES,
        help="device-plugin (default): the device-plugin API; dra: a DRA kubelet plugin instead",
    )
    p.add_argument("--driver-name", help=f"dra: the DRA driver name (default {DEFAULT_DRIVER_NAME})")
    p.add_argument("--plugin-registry-dir", help="dra: the kubelet's plugin-watcher directory")
    p.add_argument("--kubelet-plugins-dir", help="dra: the DRA socket goes in <this>/<driver name>/dra.sock")
    p.add_argument("--cdi-dir", help="dra: where per-claim CDI specs are written (default /var/run/cdi)")
    p.add_argument("--node-name", help="dra: this node's name, the pool name (default: NODE_NAME)")
    p.add_argument("--kubeconfig", help="dra: kubeconfig for the API server (default: in-cluster credentials)")
    p.add_argument("--nvidia-smi", help="dra: the nvidia-smi that sets a GPU's time slice (default: the driver root's)")
    p.add_argument("--log-format", choices=("json", "text"))
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))


GPU_PODS_FLAGS = ("gpu", "socket", "timeout")


def gpu_pods_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-device-plugin gpu-pods",
        description="Print as JSON the pods of this node holding devices (device-plugin or DRA) of the given GPUs,"
        " from the kubelet's pod-resources API; give the daemon's own flags and --config-file so that device IDs"
        ' and resource names are read as the daemon makes them. Exit 0 with {"pods": []} when none; 2 and one'
        " sentence on stderr when the question cannot be answered.",
    )
    p.add_argument("--gpu", action="append", required=True, metavar="UUID", help="a GPU's UUID; repeat for more")
    p.add_argument(
        "--socket",
        default=gpu_pods.DEFAULT_SOCKET,
        help=f"the kubelet's pod-resources socket (default {gpu_pods.DEFAULT_SOCKET})",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the kubelet (default 10)")
    add_daemon_flags(p)
    return p


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    values = {k: v for k, v in vars(args).items() if k != "config_file"}
    if values.get("device_list_strategy"):
        values["device_list_strategy"] = tuple(
            s.strip() for item in values["device_list_strategy"] for s in item.split(",") if s.strip()
        )
    if values.get("health_recovery_seconds") == -1.0:
        values["health_recovery_seconds"] = None
        values["_recovery_off"] = True
    return values


def load_config(args: argparse.Namespace, env: Mapping[str, str]) -> config.Config:
    path = args.config_file or env.get("CONFIG_FILE") or None
    file_values = config.load_file(path) if path else {}
    flags = flag_values(args)
    recovery_off = flags.pop("_recovery_off", False)
    result = config.resolve(flags, env, file_values)
    if recovery_off:
        result = replace(result, health_recovery_seconds=None)
    return replace(result, config_file=path)


def gpu_pods_main(argv: Sequence[str]) -> int:
    """`gpu-device-plugin gpu-pods`: JSON on stdout; on failure one sentence on stderr and exit status 2."""
    args = gpu_pods_parser().parse_args(argv)
    env = dict(os.environ)
    logsetup.setup(args.log_format or "text", args.log_level or "warning")
    daemon_args = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in GPU_PODS_FLAGS})
    try:
        settings = load_config(daemon_args, env)
        backend = make_backend(settings.backend, settings.simulated_spec, mounts=settings.mounts)
        backend.init()
        try:
            inventory = backend.snapshot()
        finally:
            backend.stop()
        unknown = [u for u in dict.fromkeys(args.gpu) if u not in inventory.by_uuid()]
        if unknown:
            raise gpu_pods.GpuPodsError(f"this node has no GPU with the UUID {', '.join(unknown)}.")
        devices = gpu_pods.device_map(inventory, settings)
        response = gpu_pods.list_pod_resources(args.socket, args.timeout)
    except config.ConfigError as exc:
        sys.stderr.write(f"gpu-pods: invalid configuration: {exc}\n")
        return 2
    except (BackendError, gpu_pods.GpuPodsError) as exc:
        sys.stderr.write(f"gpu-pods: {exc}\n")
        return 2
    pods = gpu_pods.pods_on_gpus(response, devices, args.gpu)
    sys.stdout.write(json.dumps({"pods": pods}, indent=2) + "\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gpu-pods"]:
        return gpu_pods_main(argv[1:])
    args = parser().parse_args(argv)
    env = dict(os.environ)
    logsetup.setup(args.log_format or env.get("GPU_DEVICE_PLUGIN_LOG_FORMAT") or "text", args.log_level or "info")
    try:
        settings = load_config(args, env)
    except config.ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    logsetup.setup(settings.log_format, args.log_level or settings.log_level)
    log.info(
        "starting gpu-device-plugin",
        extra={
            "version": __version__,
            "backend": settings.backend,
            "kubelet_socket": settings.kubelet_socket,
            "mig_strategy": settings.mig_strategy,
            "device_list_strategy": list(settings.device_list_strategy),
            "device_id_strategy": settings.device_id_strategy,
            "allocation_mode": settings.allocation_mode,
        },
    )
    try:
        return asyncio.run(Daemon(settings, reload_config=lambda: load_config(args, dict(os.environ))).run())
    except config.ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
