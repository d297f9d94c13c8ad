#!/usr/bin/env bash
# Installs everything `make test` and `make demo` need on a Debian 12 machine, idempotently:
# system packages (podman, containerd, debootstrap, ...), the podman settings this kind of host
# needs, and a Python virtual environment with the pinned requirements. Results are cached under
# $GPUOPS_CACHE (default ~/.cache/gpuops) so a second run takes seconds.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
mkdir -p "$cache"

log() { printf '[bootstrap] %s\n' "$*"; }

apt_packages=(
  podman containerd runc debootstrap gnupg dpkg-dev apt-utils uidmap slirp4netns
  fuse-overlayfs iproute2 rsync curl ca-certificates jq etcd-server inotify-tools shellcheck
  python3-tomlkit apt-cacher-ng gcc openssl time
  # ansible-rulebook's rule engine (scripts/eda-env.sh, extensions/eda) runs on a Java 17+ runtime.
  openjdk-17-jdk-headless
  # gpu_faults' tests write real journal files (kernel messages over several boots) for journalctl to read.
  systemd-journal-remote
  # The e2e tier's Prometheus (2.42, with promtool) scrapes the daemon's dcgm metrics (tests/e2e/prometheus_lab.py).
  prometheus
  # The CPython of the newest controller, built from source (scripts/build-python.sh).
  make libssl-dev zlib1g-dev libffi-dev libsqlite3-dev libbz2-dev liblzma-dev libreadline-dev libncurses-dev uuid-dev
)

need_apt=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# The containerd and prometheus packages start system instances; the tests run their own on private sockets and
# ports.
for service in containerd prometheus; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active -q "$service" 2>/dev/null; then
    systemctl stop "$service" || true
  fi
done

# podman on this kind of host: root lacks CAP_SYS_RESOURCE (so cap the default ulimits below the
# hard limit) and the cgroup layout is hybrid v1 (crun refuses it; runc accepts it).
conf=/etc/containers/containers.conf
want='# written by gpuops.k8s scripts/bootstrap.sh
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"'
if [ ! -f "$conf" ] || ! grep -q 'gpuops.k8s scripts/bootstrap.sh' "$conf"; then
  log "writing $conf"
  mkdir -p /etc/containers
  printf '%s\n' "$want" > "$conf"
fi

# The Python environment, keyed by the requirement files (test.txt and every file it includes) so a change
# rebuilds it; the Makefile's REQ_HASH is the same hash.
req_hash=$(cat "$here/requirements/controller-oldest.txt" "$here/requirements/test.txt" "$here/requirements/mitogen.txt" \
  | sha256sum | cut -c1-12)
venv="$cache/venv-$req_hash"
if [ ! -x "$venv/bin/ansible-playbook" ] || [ ! -f "$venv/.complete" ]; then
  log "creating the Python environment $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$here/requirements/test.txt"
  touch "$venv/.complete"
fi
log "ready: $cache/venv"
