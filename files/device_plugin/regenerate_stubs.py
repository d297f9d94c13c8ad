#!/usr/bin/env python
"""Regenerates the Python gRPC stubs of every kubelet API the daemon speaks from its .proto file:
the device-plugin and pod-resources APIs in src/gpu_device_plugin/api, the DRA plugin, DRA health and plugin-watcher
registration APIs in src/gpu_device_plugin/dra/api.

The pipeline: the pinned grpcio-tools' protoc, then the serialized descriptor's one very long bytes
literal is cut into lines, then the pinned ruff drops an unused import and formats the modules, so
that the committed stubs pass the same style checks as the rest of the collection.
tests/test_api_stubs.py runs this pipeline into a temporary directory and fails when the committed
files differ from its output."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")
# Relative to src/. Each file gets its own path so that their descriptors load into one process.
PROTOS = (
    "gpu_device_plugin/api/api.proto",
    "gpu_device_plugin/api/podresources_v1.proto",
    "gpu_device_plugin/dra/api/dra_v1.proto",
    "gpu_device_plugin/dra/api/dra_v1beta1.proto",
    "gpu_device_plugin/dra/api/health_v1.proto",
    "gpu_device_plugin/dra/api/health_v1alpha1.proto",
    "gpu_device_plugin/dra/api/pluginregistration_v1.proto",
)
_LITERAL = re.compile(r"AddSerializedFile\(b'((?:[^'\\]|\\.)*)'\)")
_UNIT = re.compile(r"\\x[0-9a-fA-F]{2}|\\[0-7]{1,3}|\\.|.", re.DOTALL)


def _split_literal(match: re.Match[str], width: int = 100) -> str:
    chunks, current = [], ""
    for unit in _UNIT.findall(match.group(1)):
        if len(current) + len(unit) > width:
            chunks.append(current)
            current = ""
        current += unit
    chunks.append(current)
    return "AddSerializedFile(\n" + "\n".join(f"    b'{c}'" for c in chunks) + "\n)"


def outputs(proto: str) -> tuple[str, str, str]:
    """The files protoc writes next to `proto` (paths relative to the same root)."""
    stem = proto[: -len(".proto")]
    return (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py")


def generate(root: str) -> None:
    """Generate the stubs of every file of PROTOS under `root`, each next to its .proto."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--pyi_out=.",
            "--grpc_python_out=.",
            *PROTOS,
        ],
        cwd=root,
        check=True,
    )
    modules = [os.path.join(root, name) for proto in PROTOS for name in outputs(proto) if name.endswith(".py")]
    for pb2 in (m for m in modules if m.endswith("_pb2.py")):
        with open(pb2, encoding="utf-8") as handle:
            text = handle.read()
        with open(pb2, "w", encoding="utf-8") as handle:
            handle.write(_LITERAL.sub(_split_literal, text))
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    # grpcio-tools imports `warnings` without using it; pylint in ansible-test sanity rejects that.
    subprocess.run([ruff, "check", "--isolated", "--quiet", "--select", "F401", "--fix", *modules], check=True)
    subprocess.run([ruff, "format", "--isolated", "--quiet", "--line-length", "120", *modules], check=True)


if __name__ == "__main__":
    generate(SRC)
