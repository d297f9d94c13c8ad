# Sourced by the scripts that fetch from Debian (scripts/build-base-image.sh, scripts/build-python.sh):
# `debian_mirror WHO` prints GPUOPS_DEBIAN_MIRROR, else the first Debian mirror this machine's own apt sources use,
# and ends the script with one sentence naming WHO when there is none.
# shellcheck shell=bash
debian_mirror() {
  local mirror=${GPUOPS_DEBIAN_MIRROR:-}
  if [ -z "$mirror" ]; then
    mirror=$(
      { sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)[[:space:]]*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null || true
        sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\)[[:space:]]\+bookworm[[:space:]].*/\2/p' \
          /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true
      } | head -n 1 || true  # a sources file that does not exist is not an error here
    )
  fi
  if [ -z "$mirror" ]; then
    echo "$1: no Debian mirror found in this machine's apt sources; set GPUOPS_DEBIAN_MIRROR." >&2
    exit 1
  fi
  printf '%s\n' "$mirror"
}
