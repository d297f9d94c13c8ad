#!/usr/bin/env bash
# Runs every molecule scenario (molecule/*/molecule.yml, except shared/) with what they need: the
# local Debian 12 image, the signed container toolkit repository and an apt cache on 127.0.0.1, all
# cached under $GPUOPS_CACHE. Prints each scenario's wall time.
#   scripts/molecule.sh [scenario...]
# The scenarios run in two groups side by side, each group's in order: the driver role's distribution scenarios
# (rhel, ubuntu: local repositories and real apt/dnf, mostly waiting on package managers) beside the others (crio,
# default, docker, k3s). Their containers have names of their own; the apt cache is shared.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
log() { printf '[molecule] %s\n' "$*" >&2; }

scripts/build-base-image.sh >/dev/null
GPUOPS_TOOLKIT_REPO=$(scripts/build-toolkit-repo.sh)
export GPUOPS_TOOLKIT_REPO
# The apt cache may already serve another run on this machine: stop it at the end only if it was started here.
acng_pidfile=${GPUOPS_CACHE:-$HOME/.cache/gpuops}/apt-cacher-ng/run/apt-cacher-ng.pid
acng_was_running=false
if [ -f "$acng_pidfile" ] && kill -0 "$(cat "$acng_pidfile")" 2>/dev/null; then acng_was_running=true; fi
GPUOPS_APT_PROXY=$(scripts/apt-cache.sh start)
export GPUOPS_APT_PROXY
if [ "$acng_was_running" = false ]; then trap 'scripts/apt-cache.sh stop' EXIT; fi
# Ports on the machine's 127.0.0.1 (the hosts use its network): the toolkit repository and the device
# plugin's metrics endpoint in scenario default.
export GPUOPS_TOOLKIT_REPO_PORT=${GPUOPS_TOOLKIT_REPO_PORT:-31210}
export GPUOPS_MOLECULE_PLUGIN_PORT=${GPUOPS_MOLECULE_PLUGIN_PORT:-31211}
scripts/collection-tree.sh >/dev/null

# Scenarios that only make test-full runs (GPUOPS_TEST_FULL=1), unless named: k3s, whose k3s is a double; the
# integration tier runs the role's k3s decisions with the real text/template and containerd 2.1/2.4 (README).
full_only=(k3s)
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
distro_group=(rhel ubuntu)
group_a=() group_b=()
for s in "${scenarios[@]}"; do
  if printf '%s\n' "${distro_group[@]}" | grep -qxF "$s"; then group_b+=("$s"); else group_a+=("$s"); fi
done
results=$(mktemp)
# One group's scenarios in order, each line prefixed with the scenario's name; stops at the first that fails.
run_group() {
  local s start rc
  for s in "$@"; do
    log "scenario $s"
    start=$(date +%s)
    set +e
    timeout 3600 molecule test -s "$s" 2>&1 | sed -u "s/^/[$s] /"
    rc=${PIPESTATUS[0]}
    set -e
    echo "$s $(($(date +%s) - start)) $rc" >>"$results"
    if [ "$rc" != 0 ]; then log "scenario $s failed ($rc)"; return 1; fi
    log "scenario $s passed in $(($(date +%s) - start)) s"
  done
}
failed=0
pid_b=''
if [ ${#group_b[@]} -gt 0 ]; then run_group "${group_b[@]}" & pid_b=$!; fi
if [ ${#group_a[@]} -gt 0 ]; then run_group "${group_a[@]}" || failed=1; fi
if [ -n "$pid_b" ]; then wait "$pid_b" || failed=1; fi
while read -r s took rc; do
  printf 'molecule scenario %-20s %5d s  %s\n' "$s" "$took" "$([ "$rc" = 0 ] && echo passed || echo "failed ($rc)")"
done <"$results"
rm -f "$results"
exit "$failed"
