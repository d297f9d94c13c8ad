"""The collection's own definitions of GPU facts, shared with the Ansible modules (docs/architecture.md).

In the repository these are links to plugins/module_utils/_simulated_spec.py (the simulated-GPU spec
format), plugins/module_utils/_gpu_discovery.py (NVML to GPU facts) and plugins/module_utils/_xid_classes.py
(XID to remediation class); every way the daemon is packaged (the systemd role's source archive, the
container image, pip) copies the files they point to.
"""
