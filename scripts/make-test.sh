#!/usr/bin/env bash
# What `make test` runs: the first group of tiers in order, alone (setup: the tools every tier needs), then each
# further group as a lane, the lanes side by side, each lane's tiers in order. A lane stops at its first tier that
# fails; the other lanes go on, so that one run says every failure. At the end (also after a failure) a table of
# each tier's lane, start and minutes, and the run's wall-clock total, so the 90-minute CI budget is visible.
# Every line a tier prints is prefixed with its name ("[e2e] ..."), as lanes print side by side.
#   scripts/make-test.sh "FIRST TIERS" "LANE 1 TIERS" "LANE 2 TIERS"...   (MAKE: the make to call, as the Makefile
#                                                                          passes it)
# Why lanes: a tier waits much of its time (apt in molecule's containers, the lab's kubelets and pods, the API
# servers of the integration tier), so one tier at a time leaves the two cores idle for a third of the run
# (docs/performance.md gives the figures).
set -uo pipefail
make=${MAKE:-make}
name='make test'
[ "${GPUOPS_TEST_FULL:-0}" = 1 ] && name='make test-full'
# The tiers know they run inside make test (the Makefile's daemon tier leaves its suite to daemon-py39 there).
export GPUOPS_MAKE_TEST=1
results=$(mktemp)
logs=$(mktemp -d)
start_all=$(date +%s)
minutes() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }
table() {
  local total=$(( $(date +%s) - start_all ))
  printf '\n%s, minutes per tier:\n' "$name"
  printf '  %-14s %5s %8s %8s  %s\n' tier lane start minutes result
  local tier lane begin took rc
  while read -r tier lane begin took rc; do
    printf '  %-14s %5s %8s %8s  %s\n' "$tier" "$lane" "$(minutes "$begin")" "$(minutes "$took")" \
      "$([ "$rc" = 0 ] && echo passed || echo "failed ($rc)")"
  done < <(sort -s -n -k3 "$results")
  printf '  %-14s %5s %8s %8s\n' total '' '' "$(minutes "$total")"
}
# The builds the integration tier needs first start in the background with the first tier (scripts/build-early.sh:
# they need only Go, which the machine has), and are waited for (or stopped, after a failure) before the table. They
# run at the tiers' priority (GPUOPS_BUILD_NICE, 0): on a cold machine they are what the integration tier and the lab
# wait for. On 2 busy cores, in two chains, Kubernetes was ready at minute 23 and every build at 39 (docs/performance.md,
# "Cold CI").
early_pid='' early_log=$(mktemp)
early_builds() {
  if [ -n "$early_pid" ]; then
    # Its own process group (setsid): the Go builds under it stop with it.
    if [ "$1" = stop ]; then kill -TERM -- "-$early_pid" 2>/dev/null; fi
    wait "$early_pid" 2>/dev/null
    cat "$early_log"
  fi
  rm -f "$early_log"
}
# One tier: its output prefixed with its name, its figures appended to the results. Returns the tier's status.
run_tier() {
  local tier=$1 lane=$2 begin rc
  begin=$(date +%s)
  # shellcheck disable=SC2086 # MAKE may carry its own arguments
  # sed -u: each line as it comes (mawk would hold a quiet tier's lines in its input buffer).
  $make --no-print-directory "$tier" 2>&1 | tee "$logs/$tier.log" | sed -u "s/^/[$tier] /"
  rc=${PIPESTATUS[0]}
  echo "$tier $lane $((begin - start_all)) $(( $(date +%s) - begin )) $rc" >>"$results"
  echo "$tier $rc" >>"$logs/rc"
  return "$rc"
}
run_lane() {
  local lane=$1 tier
  shift
  for tier in "$@"; do
    run_tier "$tier" "$lane" || return 1
  done
}
# GPUOPS_BUILD_EARLY=0 leaves them to the tiers that need them (tests/integration/test_make_test.py runs this script
# with tiers of its own).
if [ "${GPUOPS_BUILD_EARLY:-1}" != 0 ]; then
  GPUOPS_BUILD_NICE=${GPUOPS_BUILD_NICE:-0} setsid scripts/build-early.sh "$early_log" &
  early_pid=$!
fi
failed=0
# shellcheck disable=SC2086 # a group is a list of tier names
run_lane - $1 || failed=1
shift
pids=()
if [ "$failed" = 0 ]; then
  lane=0
  for group in "$@"; do
    lane=$((lane + 1))
    # shellcheck disable=SC2086
    run_lane "$lane" $group &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
  done
fi
if [ "$failed" = 0 ]; then early_builds wait; else early_builds stop; fi
table
rm -f "$results"
# What failed, last: a CI page that shows only the end of the output still says which test and why. pytest's
# summary lines when there are any, else the tier's last lines.
for log in "$logs"/*.log; do
  [ -e "$log" ] || continue
  tier=$(basename "$log" .log)
  grep -qE "^$tier [1-9][0-9]*$" "$logs/rc" || continue
  printf '\n%s failed:\n' "$tier"
  { grep -E '^(FAILED|ERROR) ' "$log" || tail -n 12 "$log"; } | head -n 15 | cut -c1-300 | sed 's/^/  /'
done
rm -rf "$logs"
if [ "$failed" != 0 ]; then
  echo "$name: a tier failed (above)"
  exit 1
fi
echo "$name: every tier passed"
