#!/usr/bin/env bash
# Usage: ansible-collections.sh VERSION
# kubernetes.core and community.general as release VERSION of the `ansible` package ships them: pip downloads that
# release's wheel (no dependencies) from the configured package index and only those two collections are taken out
# of it, each with its MANIFEST.json. Cached under $GPUOPS_CACHE/ansible-collections/<VERSION>-<script hash>, one
# build at a time (scripts/build-once.sh); prints that directory, which holds ansible_collections/ and so goes on
# ANSIBLE_COLLECTIONS_PATH as it is.
#
# Where wheel_sums below has VERSION, pip checks the wheel against that SHA-256 (--require-hashes); the releases
# scripts/collections-floor.sh takes the floors from are pinned so. Another VERSION (a controller's release, read
# by the drift tests) is taken as the package index serves it, as `pip install -r requirements/controller.txt` does.
#
# Environment:
#   PYTHON   the interpreter whose pip downloads the wheel and which reads it (default python3)
set -euo pipefail

collections=(kubernetes/core community/general)
declare -A wheel_sums=(
  [11.0.0]=367f6acc8e927575f1ce31c3f3c23f0ed15b1d03086997803226cd948745dce2
  [11.0.0b2]=04f8b9fda72537161a1802df92d760530fa0813255404e8ccfda9bf6729f450c
  [11.2.0]=7cbb3116ad4e499e081b1083d199698dd1be9f70107355396e05c60fc073dfcd
)

log() { printf '[ansible-collections] %s\n' "$*" >&2; }

if [ $# -ne 1 ]; then
  echo "usage: ansible-collections.sh VERSION" >&2
  exit 2
fi
version=$1
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+((a|b|rc)[0-9]+)?$ ]]; then
  log "'$version' is not a release number of the ansible package, such as 12.3.0 or 11.0.0b2"
  exit 2
fi
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
python=${PYTHON:-python3}
key=$(sha256sum "$0" | cut -c1-12)
out="$cache/ansible-collections/$version-$key"

# shellcheck source=scripts/build-once.sh
. "$(dirname "$0")/build-once.sh"
build_once "$out" "$out" "the collections of ansible $version"

rm -rf "$out"
work=$(mktemp -d "$cache/ansible-collections/.work-$version.XXXXXX")
trap 'rm -rf "$work"' EXIT
pin="ansible==$version"
hash_args=()
if [ -n "${wheel_sums[$version]:-}" ]; then
  pin="$pin --hash=sha256:${wheel_sums[$version]}"
  hash_args=(--require-hashes)
fi
printf '%s\n' "$pin" >"$work/requirements.txt"
log "downloading the wheel of ansible $version"
# The wheel's own Python requirement does not matter: nothing of it runs, two directories are read out of it.
if ! "$python" -m pip download -q --no-deps --only-binary :all: --ignore-requires-python "${hash_args[@]}" \
  -r "$work/requirements.txt" -d "$work/download" >&2; then
  log "pip could not download the wheel of ansible $version (its message is above)"
  exit 1
fi
wheel=$(find "$work/download" -name "ansible-$version-*.whl" -print -quit)
[ -n "$wheel" ] || { log "pip downloaded no wheel of ansible $version into $work/download"; exit 1; }

"$python" - "$wheel" "$work/tree" "${collections[@]}" <<'EOF'
import sys
import zipfile

wheel, dest, *collections = sys.argv[1:]
prefixes = tuple(f"ansible_collections/{c}/" for c in collections)
with zipfile.ZipFile(wheel) as archive:
    members = [m for m in archive.namelist() if m.startswith(prefixes)]
    archive.extractall(dest, members)
EOF
for c in "${collections[@]}"; do
  if [ ! -f "$work/tree/ansible_collections/$c/MANIFEST.json" ]; then
    log "ansible $version ships no ${c/\//.} (its wheel has no ansible_collections/$c/MANIFEST.json)"
    exit 1
  fi
done
mv "$work/tree" "$out"
touch "$out/.complete"
echo "$out"
