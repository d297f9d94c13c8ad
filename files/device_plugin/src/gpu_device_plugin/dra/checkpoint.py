"""The checkpoint of prepared claims: `<kubelet plugins dir>/<driver>/checkpoint.json`.

NodeUnprepareResources gets only a claim's namespace, name and UID, and the claim may be gone from
the API server by then, so what each claim was given must be remembered across restarts. The file
is JSON with a SHA-256 checksum of its claims, written atomically before the kubelet is answered.
A file that cannot be read or whose checksum does not match is renamed aside (never deleted) and the
caller rebuilds what it can from the CDI specs on disk.

Version 2 records each device's UUID beside its name, and the toolkit's CDI device handed over with it
where there is one (cdi.py). Version 1 (names only, when names were NVML
indices) is still read: its devices come back with an empty UUID, which the caller fills in
(ClaimPreparer.load) before the file is written again as version 2."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from gpu_device_plugin.dra.cdi import PreparedDevice, device_id, write_atomically

log = logging.getLogger(__name__)

FILE_NAME = "checkpoint.json"
VERSION = 2
READABLE_VERSIONS = (1, 2)


def move_aside(path: str) -> str:
    """Rename a record that cannot be used to ``<path>.corrupt-<time>``, kept for a look; return where it went."""
    aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
    try:
        os.replace(path, aside)
    except OSError:
        return "(could not be renamed)"
    return aside


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    uid: str
    devices: tuple[PreparedDevice, ...]
    # The whole GPUs whose time-slice interval the claim's GpuConfig set, to be set back when it is unprepared.
    time_sliced: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name} (UID {self.uid})"


class CheckpointError(OSError):
    """The checkpoint cannot be written; the message names the file."""


def _claim_json(c: PreparedClaim) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "namespace": c.namespace,
        "name": c.name,
        "devices": [
            {
                "device": d.device,
                "pool": d.pool,
                "requests": list(d.requests),
                "uuid": d.uuid,
                # only when set: a checkpoint without it reads and checks as before
                **({"toolkit": d.toolkit_id} if d.toolkit_id else {}),
            }
            for d in c.devices
        ],
    }
    if c.time_sliced:  # only then: a checkpoint without it reads and checks as before
        entry["timeSliced"] = list(c.time_sliced)
    return entry


def _claims_json(claims: dict[str, PreparedClaim]) -> dict[str, Any]:
    return {uid: _claim_json(c) for uid, c in sorted(claims.items())}


def _checksum(claims: dict[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class Checkpoint:
    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE_NAME)

    def write(self, claims: dict[str, PreparedClaim]) -> None:
        body = _claims_json(claims)
        text = json.dumps({"version": VERSION, "checksum": _checksum(body), "claims": body}, indent=2) + "\n"
        try:
            write_atomically(self.path, text)
        except OSError as exc:
            raise CheckpointError(f"cannot write the checkpoint {self.path}: {exc.strerror or exc}") from None

    def read(self) -> Optional[dict[str, PreparedClaim]]:
        """The claims in the file ({} when there is none), or None when it was corrupt (and set aside)."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            return self._set_aside(f"it cannot be read ({exc.strerror or exc})")
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
                return self._set_aside(f"its version is not one of {', '.join(map(str, READABLE_VERSIONS))}")
            body = data["claims"]
            if data.get("checksum") != _checksum(body):
                return self._set_aside("its checksum does not match its content")
            return {
                uid: PreparedClaim(
                    entry["namespace"],
                    entry["name"],
                    uid,
                    tuple(
                        PreparedDevice(
                            d["device"],
                            d["pool"],
                            tuple(d["requests"]),
                            device_id(uid, d["device"]),
                            str(d.get("uuid") or ""),
                            str(d.get("toolkit") or ""),
                        )
                        for d in entry["devices"]
                    ),
                    tuple(str(u) for u in entry.get("timeSliced") or ()),
                )
                for uid, entry in body.items()
            }
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._set_aside("it is not valid checkpoint JSON")

    def _set_aside(self, why: str) -> Optional[dict[str, PreparedClaim]]:
        aside = move_aside(self.path)
        log.error(
            "the checkpoint of prepared claims %s is corrupt because %s; it was moved to %s"
            " and the prepared claims are rebuilt from the CDI specs on disk",
            self.path,
            why,
            aside,
            extra={"checkpoint": self.path, "moved_to": aside},
        )
        return None
