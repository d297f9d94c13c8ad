#!/usr/bin/env bash
# Regenerates the Python gRPC stubs from api.proto with the pinned grpcio-tools (requirements/test.txt).
# tests/test_api_stubs.py fails when the committed stubs differ from what this produces.
set -euo pipefail
cd "$(dirname "$0")/src"
"${PYTHON:-python}" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
  gpu_device_plugin/api/api.proto
