"""The committed stubs are exactly what the pinned grpcio-tools makes of each kubelet proto, and the
protos carry the kubelet's wire names (package, services, fields, numbers)."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from conftest import SRC

API = os.path.join(SRC, "gpu_device_plugin", "api")


def test_regenerating_gives_the_committed_files(tmp_path):
    from regenerate_stubs import PROTOS, generate, outputs

    assert len(PROTOS) == 7
    for proto in PROTOS:
        (tmp_path / proto).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(SRC, proto), tmp_path / proto)
    generate(str(tmp_path))
    for proto in PROTOS:
        for name in outputs(proto):
            with open(os.path.join(SRC, name), "rb") as committed:
                assert (tmp_path / name).read_bytes() == committed.read(), f"{name} is stale: run regenerate_stubs.py"


def test_the_descriptor_survives_the_line_splitting():
    from google.protobuf import descriptor_pb2
    from gpu_device_plugin.api import api_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(proto)
    assert proto.package == "v1beta1"
    assert len(proto.message_type) == 20 and [s.name for s in proto.service] == ["Registration", "DevicePlugin"]


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        ("RegisterRequest", "version", 1),
        ("RegisterRequest", "endpoint", 2),
        ("RegisterRequest", "resource_name", 3),
        ("RegisterRequest", "options", 4),
        ("DevicePluginOptions", "pre_start_required", 1),
        ("DevicePluginOptions", "get_preferred_allocation_available", 2),
        ("Device", "ID", 1),
        ("Device", "health", 2),
        ("Device", "topology", 3),
        ("NUMANode", "ID", 1),
        ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1),
        ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2),
        ("ContainerPreferredAllocationRequest", "allocation_size", 3),
        ("ContainerPreferredAllocationResponse", "deviceIDs", 1),
        ("ContainerAllocateRequest", "devices_ids", 1),
        ("PreStartContainerRequest", "devices_ids", 1),
        ("ContainerAllocateResponse", "envs", 1),
        ("ContainerAllocateResponse", "mounts", 2),
        ("ContainerAllocateResponse", "devices", 3),
        ("ContainerAllocateResponse", "annotations", 4),
        ("ContainerAllocateResponse", "cdi_devices", 5),
        ("CDIDevice", "name", 1),
        ("Mount", "read_only", 3),
        ("DeviceSpec", "permissions", 3),
    ],
)
def test_wire_names_and_numbers_match_the_kubelet(message, field, number):
    from gpu_device_plugin.api import api_pb2

    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.fields_by_name[field].number == number


def test_method_paths_carry_the_v1beta1_package():
    from gpu_device_plugin.api import api_pb2

    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming


def _gencode_versions() -> tuple[tuple[int, ...], tuple[int, ...]]:
    with open(os.path.join(API, "api_pb2.py"), encoding="utf-8") as handle:
        pb2 = handle.read()
    with open(os.path.join(API, "api_pb2_grpc.py"), encoding="utf-8") as handle:
        grpc_stub = handle.read()
    protobuf = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", pb2)
    grpc = re.search(r'GRPC_GENERATED_VERSION = "([\d.]+)"', grpc_stub)
    assert protobuf and grpc, "the stubs no longer carry their generated versions"
    return tuple(int(n) for n in protobuf.groups()), tuple(int(n) for n in grpc.group(1).split("."))


def test_declared_dependency_ranges_satisfy_the_stubs_version_checks():
    """Every grpcio/protobuf the package admits passes the checks the stubs run at import: the runtime
    may not be older than the gencode, and protobuf stays within the gencode's major version."""
    from lower_bounds import PYPROJECT, lower_bounds

    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib

    with open(PYPROJECT, "rb") as handle:
        declared = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0]: d for d in tomllib.load(handle)["project"]["dependencies"]}
    bounds = lower_bounds()
    protobuf_gencode, grpc_gencode = _gencode_versions()

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(n) for n in text.split("."))

    assert version(bounds["grpcio"]) >= grpc_gencode
    assert version(bounds["protobuf"]) >= protobuf_gencode
    assert f"<{protobuf_gencode[0] + 1}" in declared["protobuf"].replace(" ", "")
    assert re.search(r"<\s*2(?:,|$)", declared["grpcio"])


def test_the_installed_runtimes_pass_the_stubs_checks():
    """Importing the stubs runs their version checks against the installed grpcio and protobuf."""
    import grpc
    from google.protobuf import __version__ as protobuf_version
    from gpu_device_plugin.api import api_pb2, api_pb2_grpc

    protobuf_gencode, grpc_gencode = _gencode_versions()
    assert tuple(int(n) for n in grpc.__version__.split(".")[:3]) >= grpc_gencode
    assert tuple(int(n) for n in protobuf_version.split(".")[:3]) >= protobuf_gencode
    assert api_pb2_grpc.DevicePluginServicer and api_pb2.DESCRIPTOR.package == "v1beta1"


def test_the_dra_services_carry_the_kubelet_method_paths():
    from gpu_device_plugin.dra.api import (
        dra_v1_pb2,
        dra_v1beta1_pb2,
        health_v1_pb2,
        health_v1alpha1_pb2,
        pluginregistration_v1_pb2,
    )

    def methods(module, service):
        found = module.DESCRIPTOR.services_by_name[service]
        return {f"/{found.full_name}/{m.name}": m.server_streaming for m in found.methods}

    for module, version in ((dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")):
        assert methods(module, "DRAPlugin") == {
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources": False,
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources": False,
        }
    for module, version in ((health_v1_pb2, "v1"), (health_v1alpha1_pb2, "v1alpha1")):
        assert methods(module, "DRAResourceHealth") == {f"/{version}.DRAResourceHealth/NodeWatchResources": True}
        assert dict(module.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert methods(pluginregistration_v1_pb2, "Registration") == {
        "/pluginregistration.Registration/GetInfo": False,
        "/pluginregistration.Registration/NotifyRegistrationStatus": False,
    }


_DRA_FIELDS = [
    ("NodePrepareResourcesRequest", "claims", 1),
    ("NodePrepareResourcesResponse", "claims", 1),
    ("NodePrepareResourceResponse", "devices", 1),
    ("NodePrepareResourceResponse", "error", 2),
    ("Device", "request_names", 1),
    ("Device", "pool_name", 2),
    ("Device", "device_name", 3),
    ("Device", "cdi_device_ids", 4),
    ("NodeUnprepareResourcesRequest", "claims", 1),
    ("NodeUnprepareResourcesResponse", "claims", 1),
    ("NodeUnprepareResourceResponse", "error", 1),
    ("Claim", "namespace", 1),
    ("Claim", "uid", 2),
    ("Claim", "name", 3),
]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
@pytest.mark.parametrize(("message", "field", "number"), _DRA_FIELDS)
def test_dra_plugin_wire_names_and_numbers(version, message, field, number):
    import importlib

    module = importlib.import_module(f"gpu_device_plugin.dra.api.dra_{version}_pb2")
    assert module.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].number == number


def test_only_dra_v1_has_the_share_id():
    from gpu_device_plugin.dra.api import dra_v1_pb2, dra_v1beta1_pb2

    assert dra_v1_pb2.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"].number == 5
    assert "share_id" not in dra_v1beta1_pb2.DESCRIPTOR.message_types_by_name["Device"].fields_by_name


@pytest.mark.parametrize(
    ("module_name", "message", "field", "number"),
    [
        ("pluginregistration_v1", "PluginInfo", "type", 1),
        ("pluginregistration_v1", "PluginInfo", "name", 2),
        ("pluginregistration_v1", "PluginInfo", "endpoint", 3),
        ("pluginregistration_v1", "PluginInfo", "supported_versions", 4),
        ("pluginregistration_v1", "RegistrationStatus", "plugin_registered", 1),
        ("pluginregistration_v1", "RegistrationStatus", "error", 2),
        *[
            (f"health_{v}", message, field, number)
            for v in ("v1", "v1alpha1")
            for message, field, number in (
                ("DeviceIdentifier", "pool_name", 1),
                ("DeviceIdentifier", "device_name", 2),
                ("DeviceHealth", "device", 1),
                ("DeviceHealth", "health", 2),
                ("DeviceHealth", "last_updated_time", 3),
                ("DeviceHealth", "health_check_timeout_seconds", 4),
                ("DeviceHealth", "message", 5),
                ("NodeWatchResourcesResponse", "devices", 1),
            )
        ],
    ],
)
def test_registration_and_health_wire_names_and_numbers(module_name, message, field, number):
    import importlib

    module = importlib.import_module(f"gpu_device_plugin.dra.api.{module_name}_pb2")
    assert module.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].number == number


def test_the_pod_resources_service_carries_the_kubelet_method_paths():
    from gpu_device_plugin.api import podresources_v1_pb2

    service = podresources_v1_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert podresources_v1_pb2.DESCRIPTOR.package == "v1"
    assert [f"/{service.full_name}/{m.name}" for m in service.methods] == [
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1.PodResourcesLister/Get",
    ]


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        ("ListPodResourcesResponse", "pod_resources", 1),
        ("PodResources", "name", 1),
        ("PodResources", "namespace", 2),
        ("PodResources", "containers", 3),
        ("ContainerResources", "name", 1),
        ("ContainerResources", "devices", 2),
        ("ContainerResources", "dynamic_resources", 5),
        ("ContainerDevices", "resource_name", 1),
        ("ContainerDevices", "device_ids", 2),
        ("ContainerDevices", "topology", 3),
        ("TopologyInfo", "nodes", 1),
        ("NUMANode", "ID", 1),
        ("DynamicResource", "claim_name", 2),
        ("DynamicResource", "claim_namespace", 3),
        ("DynamicResource", "claim_resources", 4),
        ("ClaimResource", "cdi_devices", 1),
        ("ClaimResource", "driver_name", 2),
        ("ClaimResource", "pool_name", 3),
        ("ClaimResource", "device_name", 4),
        ("ClaimResource", "share_id", 5),
        ("CDIDevice", "name", 1),
        ("GetPodResourcesRequest", "pod_name", 1),
        ("GetPodResourcesRequest", "pod_namespace", 2),
    ],
)
def test_pod_resources_wire_names_and_numbers(message, field, number):
    from gpu_device_plugin.api import podresources_v1_pb2

    assert podresources_v1_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].number == number
