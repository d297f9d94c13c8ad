"""The numbers in this node's DRA device names, bound to GPU UUIDs: `<kubelet plugins dir>/<driver>/devices.json`.

A device name (`gpu-<number>`, `gpu-<number>-mig-…`, devices.py) is what the ResourceSlice publishes and
what the scheduler writes into a claim's allocation, so it must name the same physical GPU for as long
as any claim may hold it. NVML indices are not stable: when a GPU fails or is removed, the GPUs after it
are numbered one lower at the next start. So a GPU's number is given once, remembered by UUID, and never
given to another GPU. A GPU seen for the first time gets its minor number (`/dev/nvidia<minor>`, the
number NVIDIA's DRA driver names GPUs by; the NVML index where NVML gives none) when no remembered GPU
has that number, else the next number above every number given so far. A node that already has the file
keeps the names it had.

The file is JSON, written atomically when a number is given. One that cannot be read is renamed aside
and the numbers are taken again from the prepared claims (the checkpoint) and the NVML indices."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Mapping, Optional

from gpu_device_plugin.dra.cdi import write_atomically
from gpu_device_plugin.dra.checkpoint import move_aside
from gpu_device_plugin.inventory import Inventory

log = logging.getLogger(__name__)

FILE_NAME = "devices.json"
VERSION = 1
_NUMBER = re.compile(r"^gpu-(?P<number>[0-9]+)(-mig-[a-z0-9-]+)?$")


def number_in(device_name: str) -> Optional[int]:
    """The GPU number in a device name (`gpu-3` and `gpu-3-mig-1` -> 3), None for another name."""
    match = _NUMBER.match(device_name)
    return int(match.group("number")) if match else None


def assign(known: Mapping[str, int], inventory: Inventory) -> tuple[dict[str, int], dict[str, int]]:
    """(the number of every GPU of the inventory, the bindings after giving them) from the bindings `known`
    (GPU or MIG device UUID -> number), which are not changed."""
    bound = dict(known)
    given: dict[str, int] = {}
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        number = bound.get(gpu.uuid)
        if number is None:
            # Bound through a MIG device a claim holds (load): the GPU's own UUID takes the number over.
            held = [m.uuid for m in gpu.mig_devices if m.uuid in bound]
            if held:
                number = bound[held[0]]
                for uuid in held:
                    del bound[uuid]
        if number is None:
            taken = set(bound.values())
            number = gpu.minor_number if gpu.minor_number not in taken else max(taken) + 1
            log.info("DRA device number given", extra={"gpu": gpu.uuid, "number": number})
        bound[gpu.uuid] = number
        given[gpu.uuid] = number
    return given, bound


class DeviceNumbers:
    """GPU UUID -> number, kept on disk. Thread-safe: the servicer's worker threads and the loop ask."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self._numbers: dict[str, int] = {}
        self._lock = threading.Lock()

    def load(self, held: Mapping[str, str]) -> None:
        """Read the file; `held` (device UUID -> device name, from the prepared claims) binds the numbers
        of the devices that claims hold where the file does not know them (a first start after an upgrade,
        or a file that was lost)."""
        numbers = self._read()
        for uuid, name in sorted(held.items()):
            number = number_in(name)
            if number is not None and uuid not in numbers and number not in numbers.values():
                numbers[uuid] = number
        with self._lock:
            self._numbers = numbers

    def numbers(self, inventory: Inventory) -> dict[str, int]:
        """The number of every GPU in the inventory (a GPU in MIG mode is found by its own UUID or by the
        UUID of one of its MIG devices); numbers given now are written to the file."""
        with self._lock:
            given, bound = assign(self._numbers, inventory)
            new = bound != self._numbers
            self._numbers = bound
            if new:
                self._write()
            return given

    def peek(self, inventory: Inventory) -> dict[str, int]:
        """The numbers `numbers` would give now, from the file alone, changing nothing on disk: for a tool that
        runs beside the daemon (`gpu-device-plugin gpu-pods`). A file that cannot be read counts as none."""
        return assign(self._read(set_aside=False), inventory)[0]

    # -- the file ------------------------------------------------------------------------------
    def _read(self, set_aside: bool = True) -> dict[str, int]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
            numbers = data["gpus"]
            if data.get("version") != VERSION or not isinstance(numbers, dict):
                raise ValueError(f"its version is not {VERSION}")
            if not all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in numbers.items()):
                raise ValueError("a number in it is not a whole number")
            if len(set(numbers.values())) != len(numbers):
                raise ValueError("it gives one number to two GPUs")
            return dict(numbers)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if not set_aside:
                log.warning(
                    "the DRA device numbers %s cannot be used (%s); the NVML indices are taken",
                    self.path,
                    exc,
                    extra={"file": self.path},
                )
                return {}
            aside = move_aside(self.path)
            log.error(
                "the DRA device numbers %s cannot be used (%s); it was moved to %s and the numbers are taken"
                " from the prepared claims and the NVML indices",
                self.path,
                exc,
                aside,
                extra={"file": self.path, "moved_to": aside},
            )
            return {}

    def _write(self) -> None:
        text = json.dumps({"version": VERSION, "gpus": dict(sorted(self._numbers.items()))}, indent=2) + "\n"
        try:
            write_atomically(self.path, text)
        except OSError as exc:
            # Kept in memory: names stay right while this daemon runs; the next start reads the claims again.
            log.error("cannot write the DRA device numbers", extra={"file": self.path, "reason": str(exc)})
