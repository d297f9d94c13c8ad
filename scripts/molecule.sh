#!/usr/bin/env bash
# Runs every molecule scenario (molecule/*/molecule.yml, except shared/) with what they need: the
# local Debian 12 image, the signed container toolkit repository and an apt cache on 127.0.0.1, all
# cached under $GPUOPS_CACHE. Prints each scenario's wall time.
#   scripts/molecule.sh [scenario...]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
log() { printf '[molecule] %s\n' "$*" >&2; }

# The image (debootstrap: mostly downloads and dpkg) and the repository (a Go build) side by side: on a cold machine
# each takes minutes before the first scenario can start.
scripts/build-base-image.sh >/dev/null &
base_image=$!
GPUOPS_TOOLKIT_REPO=$(scripts/build-toolkit-repo.sh)
export GPUOPS_TOOLKIT_REPO
wait "$base_image" || { log "scripts/build-base-image.sh failed"; exit 1; }
# The apt cache may already serve another run on this machine (make test runs molecule-default and molecule-runtimes
# side by side): each run of this script records its PID while it runs, and the last one to end stops the cache, if a
# run of this script started it (one started by hand is left running). No lock is held across the run: the cache's
# daemon, started from here, would inherit it and hold it for its lifetime.
acng_run=${GPUOPS_CACHE:-$HOME/.cache/gpuops}/apt-cacher-ng/run
mkdir -p "$acng_run/users"
touch "$acng_run/users/$$"
acng_pidfile=$acng_run/apt-cacher-ng.pid
if ! { [ -f "$acng_pidfile" ] && kill -0 "$(cat "$acng_pidfile")" 2>/dev/null; }; then touch "$acng_run/started-by-molecule"; fi
# flock -o: the lock's descriptor is closed before the command runs, so the daemon it starts does not hold it.
GPUOPS_APT_PROXY=$(flock -o "$acng_run/start.lock" scripts/apt-cache.sh start)
export GPUOPS_APT_PROXY
stop_apt_cache() {
  rm -f "$acng_run/users/$$"
  local user
  for user in "$acng_run"/users/*; do
    [ -e "$user" ] || continue
    if kill -0 "$(basename "$user")" 2>/dev/null; then return 0; fi
    rm -f "$user" # a run that ended without its trap
  done
  if [ -e "$acng_run/started-by-molecule" ]; then
    scripts/apt-cache.sh stop
    rm -f "$acng_run/started-by-molecule"
  fi
}
trap stop_apt_cache EXIT
# Ports on the machine's 127.0.0.1 (the hosts use its network): the toolkit repository and the device
# plugin's metrics endpoint in scenario default.
export GPUOPS_TOOLKIT_REPO_PORT=${GPUOPS_TOOLKIT_REPO_PORT:-31210}
export GPUOPS_MOLECULE_PLUGIN_PORT=${GPUOPS_MOLECULE_PLUGIN_PORT:-31211}
scripts/collection-tree.sh >/dev/null

# Scenarios that only make test-full runs (GPUOPS_TEST_FULL=1), unless named: k3s, whose k3s is a double; the
# integration tier runs the role's k3s decisions with the real text/template and containerd 2.1/2.4 (README). ubuntu
# and rhel (the driver role with real apt and dnf on hosts that say Ubuntu and Rocky; about 11 and 6 minutes): the
# unit tests of tests/unit/roles run the same decisions in make test (README, "make test-full"). Run beside the other
# scenarios instead, on 2 cores, they doubled the others' time (docs/performance.md).
full_only=(k3s rhel ubuntu)
if [ $# -gt 0 ]; then
  scenarios=("$@")
else
  mapfile -t scenarios < <(find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -n1 basename | sort)
  if [ "${GPUOPS_TEST_FULL:-0}" != 1 ]; then
    kept=()
    for s in "${scenarios[@]}"; do
      if printf '%s\n' "${full_only[@]}" | grep -qxF "$s"; then log "scenario $s: make test-full only"; else kept+=("$s"); fi
    done
    scenarios=("${kept[@]}")
  fi
fi
declare -A took
for s in "${scenarios[@]}"; do
  log "scenario $s"
  start=$(date +%s)
  timeout 3600 molecule test -s "$s"
  took[$s]=$(($(date +%s) - start))
  log "scenario $s passed in ${took[$s]} s"
done
for s in "${scenarios[@]}"; do
  printf 'molecule scenario %-20s %5d s\n' "$s" "${took[$s]}"
done
