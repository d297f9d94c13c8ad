"""The kubelet-facing gRPC services of the DRA plugin (grpc.aio) and the two sockets that serve them.

- `<kubelet plugins dir>/<driver>/dra.sock`: DRAPlugin v1 and v1beta1 (one implementation) and
  DRAResourceHealth v1 and v1alpha1;
- `<plugins_registry>/<driver>-reg.sock`: the plugin watcher's Registration service; GetInfo names
  the DRA socket and every service served there.

The DRA socket is served first, so the kubelet never dials an endpoint that does not listen yet. Both are
`unix_server.UnixServer`s, as the device plugin's sockets are."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Callable, Optional

import grpc

from gpu_device_plugin.dra import claims as claims_mod
from gpu_device_plugin.dra.api import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from gpu_device_plugin.dra.devicehealth import DeviceHealthHub
from gpu_device_plugin.dra.devices import ClaimReader
from gpu_device_plugin.unix_server import UnixServer

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# Preferred first: a 1.34+ kubelet takes the first DRAPlugin entry it knows, a 1.33 kubelet v1beta1;
# kubelets with ResourceHealthStatus open the newest health service listed.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
HEALTH_RESEND_SECONDS = 10.0  # well inside the kubelet's 30 s before a silent device turns Unknown


class ClaimService:
    """NodePrepareResources and NodeUnprepareResources, whatever the API version: claims are read from the
    API server concurrently, then handled one call at a time under one lock."""

    def __init__(self, preparer: claims_mod.ClaimPreparer, reader: Callable[[], Optional[ClaimReader]]) -> None:
        self.preparer = preparer
        self.reader = reader
        self.lock = asyncio.Lock()

    async def _read(self, namespace: str, name: str, uid: str) -> Any:
        if self.preparer.prepared(uid) is not None:
            return None  # answered from the checkpoint, without the API server
        reader = self.reader()
        if reader is None:
            return claims_mod.ClaimError("the API server client is not ready yet.")
        try:
            return await asyncio.get_running_loop().run_in_executor(None, reader.get_resource_claim, namespace, name)
        except OSError as exc:
            return claims_mod.ClaimError(f"cannot read ResourceClaim {namespace}/{name} from the API server: {exc}")

    async def prepare(self, request: Any, pb2: Any) -> Any:
        response = pb2.NodePrepareResourcesResponse()
        reads = await asyncio.gather(*(self._read(c.namespace, c.name, c.uid) for c in request.claims))
        loop = asyncio.get_running_loop()
        async with self.lock:
            for claim, read in zip(request.claims, reads):
                entry = response.claims[claim.uid]
                try:
                    if isinstance(read, claims_mod.ClaimError):
                        raise read
                    prepared = await loop.run_in_executor(
                        None, self.preparer.prepare, claim.namespace, claim.name, claim.uid, read
                    )
                except claims_mod.ClaimError as exc:
                    entry.error = str(exc)
                    log.warning(
                        "NodePrepareResources refused a claim", extra={"claim_uid": claim.uid, "reason": str(exc)}
                    )
                    continue
                except Exception as exc:  # a bug must not take the other claims or the daemon down
                    entry.error = (
                        f"ResourceClaim {claim.namespace}/{claim.name} was not prepared: internal error {exc!r}"
                    )
                    log.exception("NodePrepareResources failed", extra={"claim_uid": claim.uid})
                    continue
                for device in prepared.devices:
                    entry.devices.add(
                        request_names=list(device.requests),
                        pool_name=device.pool,
                        device_name=device.device,
                        cdi_device_ids=device.cdi_ids,
                    )
        return response

    async def unprepare(self, request: Any, pb2: Any) -> Any:
        response = pb2.NodeUnprepareResourcesResponse()
        loop = asyncio.get_running_loop()
        async with self.lock:
            for claim in request.claims:
                entry = response.claims[claim.uid]
                try:
                    await loop.run_in_executor(None, self.preparer.unprepare, claim.namespace, claim.name, claim.uid)
                except claims_mod.ClaimError as exc:
                    entry.error = str(exc)
                    log.warning(
                        "NodeUnprepareResources failed for a claim", extra={"claim_uid": claim.uid, "reason": str(exc)}
                    )
                except Exception as exc:
                    entry.error = (
                        f"ResourceClaim {claim.namespace}/{claim.name} was not unprepared: internal error {exc!r}"
                    )
                    log.exception("NodeUnprepareResources failed", extra={"claim_uid": claim.uid})
        return response


class DraPluginServicer:
    """One version of the DRAPlugin service over the shared ClaimService."""

    def __init__(self, service: ClaimService, pb2: Any) -> None:
        self.service = service
        self.pb2 = pb2

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return await self.service.prepare(request, self.pb2)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return await self.service.unprepare(request, self.pb2)


class HealthServicer:
    """One version of DRAResourceHealth: every device's health when the kubelet subscribes, again on each
    change, and again every HEALTH_RESEND_SECONDS so that the kubelet never times a device out."""

    def __init__(self, hub: DeviceHealthHub, pb2: Any, resend_seconds: float = HEALTH_RESEND_SECONDS) -> None:
        self.hub = hub
        self.pb2 = pb2
        self.resend_seconds = resend_seconds
        self._stopping = False
        self.open_streams = 0

    def stop(self) -> None:
        self._stopping = True
        self.hub.wake()

    def resume(self) -> None:
        self._stopping = False

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        log.info("NodeWatchResources opened", extra={"service": self.pb2.DESCRIPTOR.package})
        self.open_streams += 1
        try:
            while not self._stopping:
                changed = self.hub.changed()
                yield self._response()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), self.resend_seconds)
        finally:
            self.open_streams -= 1

    def _response(self) -> Any:
        pb2 = self.pb2
        response = pb2.NodeWatchResourcesResponse()
        for row in self.hub.rows():
            response.devices.add(
                device=pb2.DeviceIdentifier(pool_name=row.pool, device_name=row.device),
                health=pb2.HealthStatus.Value(row.status),
                last_updated_time=int(row.since or time.time()),
                message=row.message[:1024],
            )
        return response


class RegistrationServicer:
    def __init__(self, driver: str, endpoint: str) -> None:
        self.info = pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=endpoint, supported_versions=list(SUPPORTED_VERSIONS)
        )
        self.registered: Optional[bool] = None

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return self.info

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("registered with the kubelet", extra={"driver": self.info.name, "endpoint": self.info.endpoint})
        else:
            log.error(
                "the kubelet refused the registration",
                extra={"driver": self.info.name, "endpoint": self.info.endpoint, "reason": request.error},
            )
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


def dra_server(socket_path: str, service: ClaimService, health: list[HealthServicer]) -> UnixServer:
    def add(server: grpc.aio.Server) -> None:
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraPluginServicer(service, dra_v1_pb2), server)  # type: ignore[no-untyped-call]
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraPluginServicer(service, dra_v1beta1_pb2), server)  # type: ignore[no-untyped-call]
        v1, v1alpha1 = health
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(v1, server)  # type: ignore[no-untyped-call]
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(v1alpha1, server)  # type: ignore[no-untyped-call]

    return UnixServer(socket_path, add, "DRAPlugin and DRAResourceHealth", streams=health)


def health_servicers(hub: DeviceHealthHub) -> list[HealthServicer]:
    return [HealthServicer(hub, health_v1_pb2), HealthServicer(hub, health_v1alpha1_pb2)]


def registration_server(socket_path: str, servicer: RegistrationServicer) -> UnixServer:
    def add(server: grpc.aio.Server) -> None:
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

    return UnixServer(socket_path, add, "plugin-watcher Registration")
