#!/bin/sh
# The kubelet refuses a cgroupRoot that does not exist; create it in every cgroup v1 hierarchy.
set -eu
for hierarchy in /sys/fs/cgroup/*/; do
  [ -f "${hierarchy}cgroup.procs" ] && mkdir -p "${hierarchy}${GPUOPS_LAB_CGROUP_ROOT#/}"
done
exit 0
