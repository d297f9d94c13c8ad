#!/bin/sh
# Test double of `k3s agent` (molecule scenario k3s): writes the containerd config the way k3s does at
# start, then stays up. Base is a recorded k3s v1.31 config (containerd 1.7, version 2); the NVIDIA
# runtimes count as found (ExtraRuntimes) only when K3S_DOUBLE_FINDS_TOOLKIT=1, as for a k3s that looks
# for the toolkit somewhere else. A default-runtime the config does not hold stops it, as k3s stops.
set -eu
lib=/usr/local/lib/gpuops-test
dir=/var/lib/rancher/k3s/agent/etc/containerd
mkdir -p "$dir"
found=""
if [ "${K3S_DOUBLE_FINDS_TOOLKIT:-0}" = 1 ] && [ -x /usr/bin/nvidia-container-runtime ]; then
  found="nvidia=/usr/bin/nvidia-container-runtime"
fi
if [ -f "$dir/config.toml.tmpl" ]; then
  # shellcheck disable=SC2086
  "$lib/k3s-render" "$lib/base.toml" "$dir/config.toml.tmpl" $found > "$dir/config.toml.new"
else
  cp "$lib/base.toml" "$dir/config.toml.new"
fi
mv "$dir/config.toml.new" "$dir/config.toml"
default=$(cat /etc/rancher/k3s/config.yaml.d/*.yaml 2>/dev/null | sed -n 's/^default-runtime: *//p' | tail -n 1)
if [ -n "$default" ] && ! grep -q "runtimes\.\"\{0,1\}$default\"\{0,1\}\]" "$dir/config.toml"; then
  echo "default runtime $default was not found" >&2
  exit 1
fi
exec sleep infinity
