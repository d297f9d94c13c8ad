"""Preparing and unpreparing claims on this node: the checks, the CDI specs, the checkpoint.

Synchronous and single-threaded by contract: the servicer runs one call at a time under its lock
(in a worker thread, so the event loop keeps serving). Each call either completes (spec and
checkpoint written) or leaves the files as they were, and says why in one sentence (ClaimError)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from typing import Any, Callable, Mapping, Optional

from gpu_device_plugin.dra import cdi, opaque
from gpu_device_plugin.dra.checkpoint import Checkpoint, PreparedClaim
from gpu_device_plugin.dra.devices import ClaimReader, DraDevice, with_legacy_names
from gpu_device_plugin.dra.timeslice import TimeSliceError, TimeSlicer

log = logging.getLogger(__name__)


class ClaimError(ValueError):
    """A claim this node refuses or cannot prepare; the message names the claim and what is wrong."""


# Kubernetes gives every object an RFC 4122 UUID. A claim's UID names its CDI spec file, so nothing else passes.
_UID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def check_uid(ref: str, uid: str) -> None:
    if not _UID.match(uid):
        raise ClaimError(f"ResourceClaim {ref} was refused: its UID {uid!r} is not a UUID, and it would name a file.")


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


class ClaimPreparer:
    def __init__(
        self,
        driver: str,
        node: str,
        checkpoint: Checkpoint,
        writer: cdi.SpecWriter,
        devices: Callable[[], dict[str, DraDevice]],
        time_slicer: Optional[TimeSlicer] = None,
    ) -> None:
        self.driver = driver
        self.pool = node  # one pool per node, named after it
        self.checkpoint = checkpoint
        self.writer = writer
        self.devices = devices
        self.time_slicer = time_slicer
        self.claims: dict[str, PreparedClaim] = {}

    # -- prepare -------------------------------------------------------------------------------
    def prepared(self, uid: str) -> Optional[PreparedClaim]:
        return self.claims.get(uid)

    def prepare(self, namespace: str, name: str, uid: str, claim: Optional[Mapping[str, Any]]) -> PreparedClaim:
        """Prepare a claim as read from the API server (None: it does not exist). Idempotent."""
        ref = f"{namespace}/{name} (UID {uid})"
        check_uid(ref, uid)
        done = self.claims.get(uid)
        if done is not None:
            self._ensure_spec(done)
            return done
        wanted = self._check(ref, uid, claim)
        known = with_legacy_names(self.devices())
        unknown = sorted(d for d in wanted if d not in known)
        if unknown:
            raise ClaimError(
                f"ResourceClaim {ref} was allocated device(s) {', '.join(unknown)}, which this node does not have"
                f" (it has {', '.join(sorted(known)) or 'none'})."
            )
        for device in wanted:
            uuid = known[device].uuid
            for other in self.claims.values():
                if any(d.device == device or (uuid and d.uuid == uuid) for d in other.devices):
                    raise ClaimError(
                        f"device {device} is already prepared for ResourceClaim {other.ref};"
                        f" ResourceClaim {ref} cannot have it too."
                    )
        time_slices = self._time_slices(ref, claim, wanted, known)
        toolkit = self.writer.toolkit_ids([known[d].uuid for d in wanted])
        if toolkit is None and len(wanted) > 1:
            log.warning(
                "the NVIDIA Container Toolkit's CDI spec does not name every device of the claim, so each of its"
                " containers is given every device of the claim (NVIDIA_VISIBLE_DEVICES), whichever requests it names",
                extra={"claim": ref, "devices": sorted(wanted)},
            )
        prepared = PreparedClaim(
            namespace,
            name,
            uid,
            tuple(
                cdi.PreparedDevice(
                    device,
                    self.pool,
                    tuple(requests),
                    cdi.device_id(uid, device),
                    known[device].uuid,
                    (toolkit or {}).get(known[device].uuid, ""),
                )
                for device, requests in wanted.items()
            ),
            tuple(sorted(time_slices)),
        )
        self._write_spec(prepared, [(known[d.device], d) for d in prepared.devices])
        self._set_time_slices(prepared, time_slices)
        try:
            self.checkpoint.write({**self.claims, uid: prepared})
        except OSError as exc:
            if self.time_slicer is not None and prepared.time_sliced:
                self.time_slicer.reset(prepared.time_sliced)
            self._remove_spec_quietly(uid)
            raise ClaimError(f"ResourceClaim {ref} was not prepared: {exc}") from None
        self.claims[uid] = prepared
        log.info(
            "claim prepared",
            extra={"claim": ref, "devices": [d.device for d in prepared.devices], "cdi": self.writer.cdi_dir},
        )
        return prepared

    def _time_slices(
        self,
        ref: str,
        claim: Optional[Mapping[str, Any]],
        wanted: Mapping[str, list[str]],
        known: Mapping[str, DraDevice],
    ) -> dict[str, int]:
        """The claim's opaque configuration for this driver (dra/opaque.py) applied to its devices: the time-slice
        interval of each whole GPU it sets one on. ClaimError for a configuration that cannot be used or asks for
        what this driver does not provide (MPS)."""
        allocation = _get(claim, "status", "allocation") or {}
        try:
            candidates = opaque.configs(allocation, self.driver)
            chosen = [
                (device, config)
                for device, requests in wanted.items()
                for request in requests or [""]
                if (config := opaque.config_for(device, request, known[device].mig is not None, candidates))
            ]
        except opaque.OpaqueError as exc:
            raise ClaimError(f"ResourceClaim {ref} has a device configuration this driver cannot use: {exc}.") from None
        slices: dict[str, int] = {}
        for device, config in chosen:
            if config.strategy == opaque.MPS:
                raise ClaimError(
                    f"ResourceClaim {ref} asks for MPS sharing of device {device} ({config.kind}), which this driver"
                    " does not provide; use the TimeSlicing strategy or no sharing."
                )
            interval = config.time_slice
            if interval is None:
                continue
            uuid = known[device].gpu.uuid
            if slices.setdefault(uuid, interval) != interval:
                raise ClaimError(f"ResourceClaim {ref} asks for two time-slice intervals on GPU {uuid}.")
        return slices

    def _set_time_slices(self, prepared: PreparedClaim, slices: Mapping[str, int]) -> None:
        if not slices:
            return
        if self.time_slicer is None:
            self._remove_spec_quietly(prepared.uid)
            raise ClaimError(
                f"ResourceClaim {prepared.ref} asks for a time-slice interval, which this node cannot set."
            )
        done: list[str] = []
        try:
            for uuid, interval in sorted(slices.items()):
                self.time_slicer.set([uuid], interval)
                done.append(uuid)
        except TimeSliceError as exc:
            self.time_slicer.reset(done)
            self._remove_spec_quietly(prepared.uid)
            raise ClaimError(f"ResourceClaim {prepared.ref} was not prepared: {exc}.") from None

    def _check(self, ref: str, uid: str, claim: Optional[Mapping[str, Any]]) -> dict[str, list[str]]:
        """The claim's devices of this driver and pool -> the request names they serve."""
        if claim is None:
            raise ClaimError(f"ResourceClaim {ref} does not exist in the API server.")
        actual = _get(claim, "metadata", "uid")
        if actual != uid:
            raise ClaimError(f"ResourceClaim {ref} has UID {actual} in the API server: it was replaced.")
        allocation = _get(claim, "status", "allocation")
        if not allocation:
            raise ClaimError(f"ResourceClaim {ref} is not allocated.")
        results = _get(allocation, "devices", "results") or []
        ours = [r for r in results if isinstance(r, Mapping) and r.get("driver") == self.driver]
        if not ours:
            drivers = sorted({str(r.get("driver")) for r in results if isinstance(r, Mapping)})
            raise ClaimError(
                f"ResourceClaim {ref} has no device of driver {self.driver}"
                f" (allocated: {', '.join(drivers) or 'no devices'})."
            )
        elsewhere = sorted({str(r.get("pool")) for r in ours if r.get("pool") != self.pool})
        if elsewhere:
            raise ClaimError(
                f"ResourceClaim {ref} is allocated devices of pool(s) {', '.join(elsewhere)},"
                f" not of this node's pool {self.pool}."
            )
        wanted: dict[str, list[str]] = {}
        for result in ours:
            device = str(result.get("device") or "")
            request = str(result.get("request") or "").split("/", 1)[0]  # "<request>/<subrequest>"
            requests = wanted.setdefault(device, [])
            if request and request not in requests:
                requests.append(request)
        return wanted

    # -- unprepare -----------------------------------------------------------------------------
    def unprepare(self, namespace: str, name: str, uid: str) -> None:
        """Undo prepare; a claim this node does not know is not an error (it is not prepared)."""
        ref = f"{namespace}/{name} (UID {uid})"
        check_uid(ref, uid)
        done = self.claims.get(uid)
        if done is not None:
            rest = {k: v for k, v in self.claims.items() if k != uid}
            try:
                self.checkpoint.write(rest)
            except OSError as exc:
                raise ClaimError(f"ResourceClaim {ref} was not unprepared: {exc}") from None
            self.claims = rest
            if done.time_sliced and self.time_slicer is not None:
                self.time_slicer.reset(done.time_sliced)
        try:
            self.writer.remove(uid)
        except OSError as exc:
            raise ClaimError(f"ResourceClaim {ref} was unprepared but its CDI spec stays: {exc}") from None
        if done is not None:
            log.info("claim unprepared", extra={"claim": ref, "devices": [d.device for d in done.devices]})

    # -- start ---------------------------------------------------------------------------------
    def load(self, by_index: Mapping[str, DraDevice]) -> None:
        """Read the checkpoint; when it is corrupt, rebuild the claims from our CDI specs. Devices recorded
        without their UUID (checkpoint version 1) get it from the claim's CDI spec, written when the claim
        was prepared; where that spec is gone, from `by_index`, the devices named by today's NVML indices
        as version 1 named them (right unless GPUs were added or removed since)."""
        claims = self.checkpoint.read()
        if claims is None:
            claims = {}
            for uid, path in cdi.claim_uids_on_disk(self.writer.cdi_dir).items():
                found = cdi.read_claim_from_spec(path)
                if found is None or found[2] != uid:
                    log.error(
                        "a CDI spec of ours names no claim; it is left as it is",
                        extra={"spec": path},
                    )
                    continue
                namespace, name, _uid, devices = found
                claims[uid] = PreparedClaim(namespace, name, uid, tuple(devices))
            log.warning("claims rebuilt from the CDI specs", extra={"claims": sorted(c.ref for c in claims.values())})
            self.claims = claims
            self._fill_uuids(by_index)
            self._save_quietly()
            return
        self.claims = claims
        if self._fill_uuids(by_index):
            self._save_quietly()

    def _fill_uuids(self, by_index: Mapping[str, DraDevice]) -> bool:
        changed = False
        for uid, claim in list(self.claims.items()):
            if all(d.uuid for d in claim.devices):
                continue
            found = cdi.read_claim_from_spec(cdi.spec_path(self.writer.cdi_dir, uid))
            from_spec = {d.device: d.uuid for d in found[3]} if found is not None and found[2] == uid else {}
            devices = []
            for device in claim.devices:
                uuid = device.uuid or from_spec.get(device.device, "")
                if not uuid and device.device in by_index:
                    uuid = by_index[device.device].uuid
                    log.warning(
                        "a prepared device recorded without its UUID is taken to be the GPU with its NVML index now;"
                        " this is right unless GPUs were added or removed since the claim was prepared",
                        extra={"claim": claim.ref, "device": device.device, "uuid": uuid},
                    )
                devices.append(replace(device, uuid=uuid))
            self.claims[uid] = replace(claim, devices=tuple(devices))
            changed = True
        return changed

    def held(self) -> dict[str, str]:
        """Device UUID -> device name, for every device a prepared claim holds."""
        return {d.uuid: d.device for c in self.claims.values() for d in c.devices if d.uuid}

    def restore_specs(self) -> None:
        """At start, before serving (nothing else touches the files then), without the API server: write
        again the CDI specs a reboot removed, and remove specs of ours that belong to no prepared claim."""
        for uid, path in cdi.claim_uids_on_disk(self.writer.cdi_dir).items():
            if uid not in self.claims:
                log.info("removing a CDI spec of no prepared claim", extra={"spec": path})
                self._remove_spec_quietly(uid)
        for claim in self.claims.values():
            try:
                self._ensure_spec(claim)
            except ClaimError as exc:
                log.error(str(exc), extra={"claim": claim.ref})

    def gone_from_api_server(self, reader: ClaimReader, uids: list[str]) -> tuple[list[str], list[str]]:
        """Ask the API server about these prepared claims: (the UIDs it no longer has, or has under another
        UID; the UIDs it could not be asked about). Changes nothing. Stops at the first failure: when the
        API server is away, each further read would only wait for its own timeout."""
        gone: list[str] = []
        for index, uid in enumerate(uids):
            claim = self.claims.get(uid)
            if claim is None:
                continue
            try:
                current = reader.get_resource_claim(claim.namespace, claim.name)
            except OSError as exc:
                log.warning(
                    "cannot ask the API server about the prepared claims; keeping them and asking again later",
                    extra={"claim": claim.ref, "claims_not_asked": len(uids) - index, "reason": str(exc)},
                )
                return gone, uids[index:]
            if current is None or _get(current, "metadata", "uid") != uid:
                gone.append(uid)
        return gone, []

    def drop(self, uids: list[str]) -> None:
        """Unprepare claims the API server no longer has (their pods are gone with them)."""
        for uid in uids:
            claim = self.claims.get(uid)
            if claim is None:
                continue
            log.info("prepared claim is gone from the API server; unpreparing it", extra={"claim": claim.ref})
            try:
                self.unprepare(claim.namespace, claim.name, uid)
            except ClaimError as exc:
                log.error(str(exc), extra={"claim": claim.ref})

    # -- files ---------------------------------------------------------------------------------
    def _resolve(self, claim: PreparedClaim) -> list[tuple[DraDevice, cdi.PreparedDevice]]:
        """Each prepared device with the device it is now: found by its UUID, whatever its name; a device
        recorded without a UUID by its name."""
        known = self.devices()
        by_uuid = {d.uuid: d for d in known.values()}
        pairs, missing = [], []
        for prepared in claim.devices:
            found = by_uuid.get(prepared.uuid) if prepared.uuid else known.get(prepared.device)
            if found is None:
                missing.append(f"{prepared.device} ({prepared.uuid or 'UUID not recorded'})")
            else:
                pairs.append((found, prepared))
        if missing:
            raise ClaimError(
                f"ResourceClaim {claim.ref} is prepared on device(s) {', '.join(missing)}, which no longer exist on"
                " this node; unprepare it (delete its pod) to free it."
            )
        return pairs

    def _write_spec(self, claim: PreparedClaim, pairs: list[tuple[DraDevice, cdi.PreparedDevice]]) -> None:
        spec = self.writer.build(claim.namespace, claim.name, claim.uid, pairs)
        try:
            self.writer.write(claim.uid, spec)
        except OSError as exc:
            raise ClaimError(f"ResourceClaim {claim.ref} was not prepared: {exc}") from None

    def _ensure_spec(self, claim: PreparedClaim) -> None:
        """Check that the claim's devices are still there, and write its spec again if it is missing (a
        reboot empties /var/run/cdi)."""
        pairs = self._resolve(claim)
        if os.path.exists(cdi.spec_path(self.writer.cdi_dir, claim.uid)):
            return
        self._write_spec(claim, pairs)
        log.info("CDI spec written again", extra={"claim": claim.ref})

    def _remove_spec_quietly(self, uid: str) -> None:
        try:
            self.writer.remove(uid)
        except OSError as exc:
            log.error("cannot remove a CDI spec", extra={"claim_uid": uid, "reason": str(exc)})

    def _save_quietly(self) -> None:
        try:
            self.checkpoint.write(self.claims)
        except OSError as exc:
            log.error("cannot write the checkpoint", extra={"reason": str(exc)})
