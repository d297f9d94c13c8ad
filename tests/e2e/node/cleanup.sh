#!/bin/sh
# Run by `lab.py down` before the node container is killed: stops the kubelet, kills what runs in its
# pod cgroups and removes those cgroups in every hierarchy. This node's systemd sees the machine's
# name=systemd hierarchy from its root, beside every other node of every lab, so only the kubelet's
# cgroup root named after this node (gpuops-lab[I]-node-N) is touched, nothing else there.
set -u
root=$(sed -n 's#^GPUOPS_LAB_CGROUP_ROOT=/*##p' /etc/gpuops-lab/kubelet.env)
case $root in
  gpuops-lab-node-[1-9] | gpuops-lab[1-4]-node-[1-9]) ;;
  *) exit 0 ;;
esac
systemctl stop kubelet 2>/dev/null
if [ -d "/sys/fs/cgroup/memory/$root" ]; then
  # A pid this namespace cannot see reads as 0: never signal that (or anything not a plain number).
  find "/sys/fs/cgroup/memory/$root" -name cgroup.procs -exec cat {} + | while read -r pid; do
    case $pid in '' | 0 | *[!0-9]*) continue ;; esac
    kill -9 "$pid" 2>/dev/null
  done
  sleep 1
fi
for hierarchy in /sys/fs/cgroup/*/; do
  [ -d "$hierarchy$root" ] && find "$hierarchy$root" -depth -type d -exec rmdir {} + 2>/dev/null
done
exit 0
