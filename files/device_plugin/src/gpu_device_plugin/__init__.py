"""gpu-device-plugin: advertises NVIDIA GPUs to the kubelet (device-plugin API v1beta1)."""

from __future__ import annotations

__version__ = "0.1.0"
