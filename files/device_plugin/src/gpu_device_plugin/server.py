"""The DevicePlugin gRPC servicer (grpc.aio): one per advertised resource.

It answers from `DeviceState` and `allocation`; it holds no discovery or NVML code. ListAndWatch
streams are coroutines waiting on one event, so any number of them costs no thread and never
starves Allocate."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

import grpc

from gpu_device_plugin import allocation
from gpu_device_plugin.api import api_pb2
from gpu_device_plugin.state import DeviceState, Listing

log = logging.getLogger(__name__)


class DevicePluginServicer:
    # Not derived from the generated (synchronous) base class: these methods are coroutines for grpc.aio.
    def __init__(
        self,
        resource: str,
        state: DeviceState,
        builder: allocation.ResponseBuilder,
        pre_start_required: bool = False,
    ) -> None:
        self.resource = resource
        self.state = state
        self.builder = builder
        self.options = api_pb2.DevicePluginOptions(
            pre_start_required=pre_start_required, get_preferred_allocation_available=True
        )
        self._stopping = False
        self.open_streams = 0

    def stop(self) -> None:
        """End every ListAndWatch stream cleanly (status OK)."""
        self._stopping = True
        self.state.wake()

    def resume(self) -> None:
        self._stopping = False

    async def GetDevicePluginOptions(self, request: api_pb2.Empty, context: Any) -> api_pb2.DevicePluginOptions:
        return self.options

    async def ListAndWatch(self, request: api_pb2.Empty, context: Any) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent: Listing | None = None
        log.info("ListAndWatch opened", extra={"resource": self.resource})
        self.open_streams += 1
        try:
            while not self._stopping:
                changed = self.state.changed()
                listing = self.state.listing(self.resource)
                if listing != sent:
                    yield _response(listing)
                    sent = listing
                await changed.wait()
        except asyncio.CancelledError:
            log.info("ListAndWatch closed by the kubelet", extra={"resource": self.resource})
            raise
        finally:
            self.open_streams -= 1
        log.info("ListAndWatch ended: shutting down", extra={"resource": self.resource})

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Any) -> api_pb2.AllocateResponse:
        plan = self.state.plans.get(self.resource)
        response = api_pb2.AllocateResponse()
        try:
            if plan is None:
                raise allocation.AllocationError(f"{self.resource} is no longer advertised")
            for container in request.container_requests:
                ids = list(container.devices_ids)
                devices = allocation.check_request(plan, ids, self.state.healthy)
                response.container_responses.append(self.builder.build(devices))
        except allocation.AllocationError as exc:
            self.state.metrics.allocation_errors.labels(self.resource).inc()
            log.warning("Allocate refused", extra={"resource": self.resource, "reason": str(exc)})
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.state.metrics.allocations.labels(self.resource).inc(len(request.container_requests))
        log.info(
            "Allocate",
            extra={
                "resource": self.resource,
                "devices": [list(c.devices_ids) for c in request.container_requests],
            },
        )
        return response

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        plan = self.state.plans.get(self.resource)
        response = api_pb2.PreferredAllocationResponse()
        try:
            if plan is None:
                raise allocation.AllocationError(f"{self.resource} is no longer advertised")
            for container in request.container_requests:
                chosen = allocation.preferred(
                    plan,
                    self.state.inventory,
                    list(container.available_deviceIDs),
                    list(container.must_include_deviceIDs),
                    container.allocation_size,
                )
                response.container_responses.add(deviceIDs=chosen)
        except allocation.AllocationError as exc:
            log.warning("GetPreferredAllocation refused", extra={"resource": self.resource, "reason": str(exc)})
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return response

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        if self.options.pre_start_required:
            # Configured: refuse to start a container on a device that went bad since Allocate.
            plan = self.state.plans.get(self.resource)
            try:
                if plan is None:
                    raise allocation.AllocationError(f"{self.resource} is no longer advertised")
                allocation.check_request(plan, list(request.devices_ids), self.state.healthy)
            except allocation.AllocationError as exc:
                log.warning("PreStartContainer refused", extra={"resource": self.resource, "reason": str(exc)})
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return api_pb2.PreStartContainerResponse()


def _response(listing: Listing) -> api_pb2.ListAndWatchResponse:
    response = api_pb2.ListAndWatchResponse()
    for device_id, health, numa in listing:
        device = response.devices.add(ID=device_id, health=health)
        if numa is not None:
            device.topology.nodes.add(ID=numa)
    return response
