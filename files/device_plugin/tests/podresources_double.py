"""A test double of the kubelet's pod-resources API (there is no kubelet on the test hosts).

It serves `v1.PodResourcesLister` over real unix-socket gRPC, as the kubelet does on
/var/lib/kubelet/pod-resources/kubelet.sock, and answers `List` with the pods a test gives it, built
with `pod`, `container` and `claim` below; `refuse` makes List fail with a gRPC status instead."""

from __future__ import annotations

import os
import sys
from concurrent import futures
from typing import Any, Optional, Sequence

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from gpu_device_plugin.api import podresources_v1_pb2 as pb
from gpu_device_plugin.api import podresources_v1_pb2_grpc as pb_grpc


def claim(namespace: str, name: str, devices: Sequence[tuple[str, str, str]]) -> Any:
    """A DRA claim a container uses; devices: (driver, pool, device name) as its allocation names them."""
    return pb.DynamicResource(
        claim_name=name,
        claim_namespace=namespace,
        claim_resources=[
            pb.ClaimResource(
                driver_name=driver,
                pool_name=pool,
                device_name=device,
                cdi_devices=[pb.CDIDevice(name=f"{driver}/gpu={name}-{device}")],
            )
            for driver, pool, device in devices
        ],
    )


def container(name: str, devices: Optional[dict[str, list[str]]] = None, claims: Sequence[Any] = ()) -> Any:
    """A container with device-plugin devices (resource name -> device IDs) and DRA claims."""
    return pb.ContainerResources(
        name=name,
        devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in (devices or {}).items()],
        dynamic_resources=list(claims),
    )


def pod(namespace: str, name: str, *containers: Any) -> Any:
    return pb.PodResources(namespace=namespace, name=name, containers=list(containers))


class PodResourcesDouble(pb_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.pods: list[Any] = []
        self.refusal: Optional[tuple[grpc.StatusCode, str]] = None
        self.calls = 0
        self._server: Optional[grpc.Server] = None

    def refuse(self, code: grpc.StatusCode, details: str) -> None:
        self.refusal = (code, details)

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls += 1
        if self.refusal is not None:
            context.abort(*self.refusal)
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

    def start(self) -> PodResourcesDouble:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
