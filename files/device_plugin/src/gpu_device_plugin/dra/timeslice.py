"""A GPU's time-slice interval, set while a claim that asks for it is prepared (dra/opaque.py).

As NVIDIA's DRA driver does it: the driver's nvidia-smi puts the GPU in the DEFAULT compute mode
(`nvidia-smi -i <UUID> -c DEFAULT`), then sets the interval (`nvidia-smi compute-policy -i <UUID>
--set-timeslice <0-3>`); when the claim is unprepared the interval goes back to 0 (Default). NVML has no
call for the interval, so nvidia-smi it is: the one under the driver root (where a DaemonSet pod sees the
host's), found next to the driver's libnvidia-ml.so.1, which it is told to load."""

from __future__ import annotations

import logging
import os
import subprocess
from typing import Optional, Sequence

from gpu_device_plugin import hostdriver
from gpu_device_plugin.config import MountsSettings

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 30.0


class TimeSliceError(OSError):
    """nvidia-smi could not set the interval; the message says which GPU and why, in one sentence."""


class TimeSlicer:
    def __init__(self, nvidia_smi: str, mounts: MountsSettings, timeout: float = TIMEOUT_SECONDS) -> None:
        self.mounts = mounts
        self.timeout = timeout
        if nvidia_smi:
            self.command = nvidia_smi
        else:
            self.command = mounts.local(os.path.join(mounts.driver_root, "usr", "bin", "nvidia-smi"))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        library = hostdriver.nvml_library(self.mounts)
        if library is not None:
            directory = os.path.dirname(library)
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (directory, env.get("LD_LIBRARY_PATH", "")) if p)
        return env

    def _run(self, uuid: str, args: Sequence[str]) -> None:
        argv = [self.command, *args]
        try:
            done = subprocess.run(
                argv, env=self._env(), capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TimeSliceError(f"{' '.join(argv)} could not run for GPU {uuid}: {exc}") from None
        if done.returncode != 0:
            output = " ".join((done.stdout + done.stderr).split())[:300] or "no output"
            raise TimeSliceError(f"{' '.join(argv)} failed for GPU {uuid} (exit status {done.returncode}): {output}")

    def set(self, uuids: Sequence[str], interval: int) -> None:
        """Set the interval (0 Default, 1 Short, 2 Medium, 3 Long) on each whole GPU; TimeSliceError on the first
        that fails."""
        for uuid in uuids:
            self._run(uuid, ["-i", uuid, "-c", "DEFAULT"])
            self._run(uuid, ["compute-policy", "-i", uuid, "--set-timeslice", str(interval)])
            log.info("GPU time slice set", extra={"gpu": uuid, "interval": interval})

    def reset(self, uuids: Sequence[str]) -> Optional[str]:
        """Set the GPUs back to the Default interval; the reason when one could not be (it is logged, not raised:
        an unprepare must not be held up by it)."""
        try:
            self.set(uuids, 0)
        except TimeSliceError as exc:
            log.error("a GPU's time slice could not be set back to Default", extra={"reason": str(exc)})
            return str(exc)
        return None
