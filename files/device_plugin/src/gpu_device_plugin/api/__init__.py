"""Stubs generated from api.proto (kubelet device-plugin API v1beta1); see regenerate_stubs.py."""
