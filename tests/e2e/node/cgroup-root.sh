#!/bin/sh
# The kubelet refuses a cgroupRoot that does not exist; create it in every cgroup v1 hierarchy.
set -eu
# Every v1 hierarchy the kubelet checks, name=systemd included; not the cgroup2 one (unified).
for hierarchy in /sys/fs/cgroup/*/; do
  case $hierarchy in */unified/) continue ;; esac
  [ -f "${hierarchy}cgroup.procs" ] && mkdir -p "${hierarchy}${GPUOPS_LAB_CGROUP_ROOT#/}"
done
exit 0
