"""Test doubles of the DRA API side (there is no API server on the test hosts): a claim store that
answers `get_resource_claim` as the API server client does, and a ResourceSlice publisher that records
what it is given. They implement gpu_device_plugin.dra.devices.ClaimReader and SlicePublisher."""

from __future__ import annotations

import copy
import threading
from typing import Any, Mapping, Optional, Sequence

from gpu_device_plugin.dra.devices import DraDevice
from gpu_device_plugin.inventory import Inventory

DRIVER = "gpu.gpuops.k8s"


def claim_json(
    namespace: str,
    name: str,
    uid: str,
    devices: Sequence[str],
    pool: str,
    driver: str = DRIVER,
    request: str = "gpu",
    config: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim as `resource.k8s.io/v1` returns it, allocated the given devices (empty: not allocated), with
    `config` as its allocation's device configuration."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": request, "exactly": {"deviceClassName": "gpu.gpuops.k8s"}}]}},
        "status": {},
    }
    if devices:
        claim["status"]["allocation"] = {
            "devices": {"results": [{"request": request, "driver": driver, "pool": pool, "device": d} for d in devices]}
        }
        if config:
            claim["status"]["allocation"]["devices"]["config"] = list(config)
    return claim


class ClaimStoreDouble:
    """ResourceClaims by namespace/name; `unreachable` makes every read fail as an API server outage does,
    and `hang` (an Event) makes every read wait until it is set, as an API server that does not answer."""

    def __init__(self) -> None:
        self._claims: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.unreachable = False
        self.hang: Optional[threading.Event] = None
        self.reads: list[tuple[str, str]] = []

    def put(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        with self._lock:
            self._claims[(meta["namespace"], meta["name"])] = claim

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            self._claims.pop((namespace, name), None)

    def get_resource_claim(self, namespace: str, name: str) -> Optional[Mapping[str, Any]]:
        hang = self.hang
        if hang is not None:
            hang.wait()
        with self._lock:
            self.reads.append((namespace, name))
            if self.unreachable:
                raise ConnectionRefusedError(111, "connection refused (API server double set unreachable)")
            claim = self._claims.get((namespace, name))
            return copy.deepcopy(claim) if claim is not None else None


class SlicePublisherDouble:
    """Records every publish call: (device names, unhealthy device names). `hang` (an Event) makes every
    publish wait until it is set."""

    def __init__(self) -> None:
        self.hang: Optional[threading.Event] = None
        self.calls: list[tuple[list[str], frozenset[str]]] = []
        self.deleted = 0
        self.reconciles = 0
        self.reconcile_error: Optional[OSError] = None
        self._lock = threading.Lock()

    def publish(self, devices: Sequence[DraDevice], unhealthy: frozenset[str], inventory: Inventory) -> bool:
        hang = self.hang
        if hang is not None:
            hang.wait()
        with self._lock:
            self.calls.append(([d.name for d in devices], frozenset(unhealthy)))
        return True

    def reconcile(self) -> bool:
        with self._lock:
            self.reconciles += 1
        if self.reconcile_error is not None:
            raise self.reconcile_error
        return False

    def delete_all(self) -> None:
        with self._lock:
            self.deleted += 1

    def last(self) -> Optional[tuple[list[str], frozenset[str]]]:
        with self._lock:
            return self.calls[-1] if self.calls else None
