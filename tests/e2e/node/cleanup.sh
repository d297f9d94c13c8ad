#!/bin/sh
# Run by `lab.sh down` before the node container goes: stops the kubelet, kills what runs in its pod
# cgroups and removes those cgroups in every hierarchy. Some hierarchies (hugetlb, perf_event, ...)
# are shared with the machine rather than nested in the container's own cgroup, so they would stay
# behind otherwise.
set -u
. /etc/gpuops-lab/kubelet.env
root=${GPUOPS_LAB_CGROUP_ROOT#/}
systemctl stop kubelet 2>/dev/null
if [ -d "/sys/fs/cgroup/memory/$root" ]; then
  find "/sys/fs/cgroup/memory/$root" -name cgroup.procs -exec cat {} + | xargs -r kill -9 2>/dev/null
  sleep 1
fi
for hierarchy in /sys/fs/cgroup/*/; do
  [ -d "$hierarchy$root" ] && find "$hierarchy$root" -depth -type d -exec rmdir {} + 2>/dev/null
done
exit 0
