#!/usr/bin/env python
"""Regenerates the Python gRPC stubs in src/gpu_device_plugin/api from api.proto.

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
PROTO = "gpu_device_plugin/api/api.proto"
OUTPUTS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
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


def generate(root: str) -> None:
    """Generate the stubs for `root`/gpu_device_plugin/api/api.proto next to it."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--pyi_out=.",
            "--grpc_python_out=.",
            PROTO,
        ],
        cwd=root,
        check=True,
    )
    api = os.path.join(root, "gpu_device_plugin", "api")
    pb2 = os.path.join(api, "api_pb2.py")
    with open(pb2, encoding="utf-8") as handle:
        text = handle.read()
    with open(pb2, "w", encoding="utf-8") as handle:
        handle.write(_LITERAL.sub(_split_literal, text))
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    modules = [os.path.join(api, name) for name in OUTPUTS if name.endswith(".py")]
    # grpcio-tools imports `warnings` without using it; pylint in ansible-test sanity rejects that.
    subprocess.run([ruff, "check", "--isolated", "--quiet", "--select", "F401", "--fix", *modules], check=True)
    subprocess.run([ruff, "format", "--isolated", "--quiet", "--line-length", "120", *modules], check=True)


if __name__ == "__main__":
    generate(SRC)
