#!/usr/bin/env bash
# What `make test` runs: each tier as its own make target, in order, stopping at the first that fails, and
# at the end (also after a failure) a table of each tier's minutes, so the 90-minute CI budget is visible.
#   scripts/make-test.sh TIER...      (MAKE: the make to call, as the Makefile passes it)
set -uo pipefail
make=${MAKE:-make}
name='make test'
[ "${GPUOPS_TEST_FULL:-0}" = 1 ] && name='make test-full'
names=() minutes=() results=()
start_all=$(date +%s)
table() {
  local total=$(( $(date +%s) - start_all ))
  printf '\n%s, minutes per tier:\n' "$name"
  printf '  %-14s %8s  %s\n' tier minutes result
  local i
  for i in "${!names[@]}"; do
    printf '  %-14s %8s  %s\n' "${names[$i]}" "${minutes[$i]}" "${results[$i]}"
  done
  printf '  %-14s %8s\n' total "$(awk -v s="$total" 'BEGIN { printf "%.1f", s / 60 }')"
}
# The builds the integration tier needs first start in the background with the first tier (scripts/build-early.sh:
# they need only Go, which the machine has), at low priority, and are waited for (or stopped, after a failure)
# before the table.
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
setsid nice -n 15 scripts/build-early.sh "$early_log" &
early_pid=$!
for tier in "$@"; do
  begin=$(date +%s)
  # shellcheck disable=SC2086 # MAKE may carry its own arguments
  $make --no-print-directory "$tier"
  rc=$?
  names+=("$tier")
  minutes+=("$(awk -v s="$(( $(date +%s) - begin ))" 'BEGIN { printf "%.1f", s / 60 }')")
  if [ "$rc" -ne 0 ]; then
    results+=("failed ($rc)")
    early_builds stop
    table
    exit "$rc"
  fi
  results+=(passed)
done
early_builds wait
table
echo "$name: every tier passed"
