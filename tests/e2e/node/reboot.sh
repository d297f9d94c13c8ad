#!/bin/sh
# The last step of a lab node's reboot (systemd-reboot.service, gpuops-lab-reboot.conf): the reboot system call
# itself, made here instead of by systemd's manager. After `systemctl reboot` has stopped the node's services,
# the manager would exit and, on its way out, remove every empty cgroup under its root, which on this cgroup v1
# machine is the whole name=systemd hierarchy with the cgroups of every other node container in it
# (tests/e2e/gpuops_lab/nodes.py). The system call ends this container's PID namespace at once instead; podman
# starts the container again (its restart policy), as a machine comes back from a reboot.
set -eu
# Only inside a podman container: on a machine the same call reboots the machine.
if [ ! -e /run/.containerenv ] || [ "$(systemd-detect-virt --container 2>/dev/null)" != podman ]; then
  echo "gpuops-lab-reboot: not in a podman container; refusing" >&2
  exit 1
fi
exec systemctl --force --force reboot
