"""Stubs generated from the kubelet's DRA plugin (v1, v1beta1), DRA health (v1, v1alpha1) and
plugin-watcher registration (v1) protos; see regenerate_stubs.py."""
