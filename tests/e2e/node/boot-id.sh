#!/bin/sh
# A container sees the machine's boot ID, which a restart of the container does not change. A lab node gets a
# boot ID of its own at each start of its container, as a machine gets one at each boot, so that whoever waits
# for a node to reboot (ansible.builtin.reboot compares /proc/sys/kernel/random/boot_id) sees it come back.
set -eu
[ -e /run/.containerenv ] || exit 0
tr -d '\n' </proc/sys/kernel/random/uuid >/run/gpuops-lab-boot-id
echo >>/run/gpuops-lab-boot-id
mount --bind /run/gpuops-lab-boot-id /proc/sys/kernel/random/boot_id
