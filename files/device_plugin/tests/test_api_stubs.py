"""The committed stubs are exactly what the pinned grpcio-tools makes of api.proto."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from conftest import SRC

API = os.path.join(SRC, "gpu_device_plugin", "api")


def test_regenerating_gives_the_committed_files(tmp_path):
    from regenerate_stubs import OUTPUTS, generate

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
