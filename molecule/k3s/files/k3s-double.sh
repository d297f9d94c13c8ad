#!/bin/sh
# Test double of `k3s agent` (molecule scenario k3s): writes the containerd config the way k3s does at
# start, then stays up. Base is a recorded k3s config (K3S_DOUBLE_BASE, default the k3s v1.31 one:
# containerd 1.7, version 2, no imports). Like k3s, it looks for the NVIDIA runtimes in
# /usr/local/nvidia/toolkit:/opt/kwasm/bin:$PATH (nvidia, nvidia-experimental with the hyphenated binary,
# nvidia-cdi) and adds those it finds; a default-runtime it did not find stops it, as k3s stops.
set -eu
lib=/usr/local/lib/gpuops-test
base=${K3S_DOUBLE_BASE:-$lib/base.toml}
dir=/var/lib/rancher/k3s/agent/etc/containerd
mkdir -p "$dir"
found=""
names=""
for pair in nvidia=nvidia-container-runtime nvidia-experimental=nvidia-container-runtime-experimental \
  nvidia-cdi=nvidia-container-runtime.cdi; do
  name=${pair%%=*}
  binary=$(PATH="/usr/local/nvidia/toolkit:/opt/kwasm/bin:$PATH" command -v "${pair#*=}" || true)
  if [ -n "$binary" ]; then
    found="$found $name=$binary"
    names="$names $name "
  fi
done
template="$dir/config.toml.tmpl"
runtimes='plugins."io.containerd.grpc.v1.cri".containerd.runtimes'
if grep -q '^version = 3' "$base"; then
  template="$dir/config-v3.toml.tmpl"
  runtimes="plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes"
fi
# The base template renders the runtimes k3s found (ExtraRuntimes) after runc.
cp "$base" "$lib/base.rendered"
for pair in $found; do
  printf '\n[%s."%s"]\n  runtime_type = "io.containerd.runc.v2"\n[%s."%s".options]\n  BinaryName = "%s"\n  SystemdCgroup = true\n' \
    "$runtimes" "${pair%%=*}" "$runtimes" "${pair%%=*}" "${pair#*=}" >> "$lib/base.rendered"
done
if [ -f "$template" ]; then
  # shellcheck disable=SC2086
  "$lib/k3s-render" "$lib/base.rendered" "$template" $found > "$dir/config.toml.new"
else
  cp "$lib/base.rendered" "$dir/config.toml.new"
fi
mv "$dir/config.toml.new" "$dir/config.toml"
default=$(cat /etc/rancher/k3s/config.yaml.d/*.yaml 2>/dev/null | sed -n 's/^default-runtime: *//p' | tail -n 1)
case "$names" in
  *" $default "*) ;;
  *)
    if [ -n "$default" ]; then
      echo "default runtime $default was not found" >&2
      exit 1
    fi
    ;;
esac
exec sleep infinity
