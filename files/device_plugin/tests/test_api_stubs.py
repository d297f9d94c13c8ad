"""The committed stubs are exactly what the pinned grpcio-tools makes of api.proto."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from conftest import SRC

API = os.path.join(SRC, "gpu_device_plugin", "api")


def test_regenerating_gives_the_committed_files(tmp_path):
    sys.path.insert(0, os.path.dirname(SRC))
    try:
        from regenerate_stubs import OUTPUTS, generate
    finally:
        sys.path.remove(os.path.dirname(SRC))
    target = tmp_path / "gpu_device_plugin" / "api"
    target.mkdir(parents=True)
    shutil.copy(os.path.join(API, "api.proto"), target / "api.proto")
    generate(str(tmp_path))
    for name in OUTPUTS:
        with open(os.path.join(API, name), "rb") as committed:
            assert (target / name).read_bytes() == committed.read(), f"{name} is stale: run regenerate_stubs.py"


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
