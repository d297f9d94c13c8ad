# Sourced by the build scripts whose output is cached in a directory of its own (Kubernetes, NVIDIA's
# device plugin): `build_once OUT RESULT WHAT` prints RESULT and ends the script when OUT is complete (it
# holds .complete); otherwise it takes OUT's lock, so one build at a time per output directory, waiting for
# another caller's build of WHAT, and ends the script the same way if that build completed OUT meanwhile.
# The caller builds into OUT, touches OUT/.complete and prints RESULT.
# shellcheck shell=bash
build_once() {
  local out=$1 result=$2 what=$3
  if [ -f "$out/.complete" ]; then
    echo "$result"
    exit 0
  fi
  mkdir -p "$(dirname "$out")"
  exec 9>"$out.lock"
  if ! flock -n 9; then
    printf '[%s] another build of %s is running; waiting for it\n' "$(basename "$0" .sh)" "$what" >&2
    flock 9
  fi
  if [ -f "$out/.complete" ]; then
    echo "$result"
    exit 0
  fi
}
