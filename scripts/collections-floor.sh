#!/usr/bin/env bash
# The collections this one depends on at the lowest versions galaxy.yml allows (its `dependencies`, read from there
# so that the two cannot drift apart), in one ansible_collections tree for the integration tests that run the roles
# against them (tests/integration/test_dependency_floors.py). Galaxy cannot be reached where CI runs, so each comes
# from a release of the `ansible` package that ships exactly that version (shipped_by below, through
# scripts/ansible-collections.sh); the script fails with one sentence where none is known or where the release
# ships another version.
# Cached under $GPUOPS_CACHE/collections-floor-<key> (key: these scripts and the floors), one build at a time
# (scripts/build-once.sh). Prints that directory, which holds ansible_collections/, for ANSIBLE_COLLECTIONS_PATH.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
python=${PYTHON:-python3}
dependencies=(kubernetes.core community.general)
# The release of the ansible package that ships each floor (its ansible_collections/<ns>/<name>/MANIFEST.json):
# no final release ships community.general 10.0.0 (11.0.0 ships 10.0.1), the pre-release 11.0.0b2 does.
declare -A shipped_by=(
  ["kubernetes.core 5.1.0"]=11.2.0
  ["community.general 10.0.0"]=11.0.0b2
)

log() { printf '[collections-floor] %s\n' "$*" >&2; }

# floor NAME: the version after `>=` in galaxy.yml's line for NAME under dependencies.
floor() {
  sed -n '/^dependencies:/,/^[^ ]/p' "$here/galaxy.yml" | sed -n "s/^  ${1//./\\.}: *\">=\([0-9][0-9.]*\)[,\"].*/\1/p"
}

declare -A floors
for name in "${dependencies[@]}"; do
  floors[$name]=$(floor "$name")
  if [ -z "${floors[$name]}" ]; then
    log "galaxy.yml's dependencies give $name no lower bound of the form \">=X.Y.Z\""
    exit 1
  fi
  if [ -z "${shipped_by["$name ${floors[$name]}"]:-}" ]; then
    log "galaxy.yml's floor for $name is ${floors[$name]}, which no ansible release in this script's shipped_by ships; add the release that does"
    exit 1
  fi
done

key=$(
  cat "$0" "$here/scripts/ansible-collections.sh"
  for name in "${dependencies[@]}"; do echo "$name ${floors[$name]}"; done
)
key=$(sha256sum <<<"$key" | cut -c1-12)
out="$cache/collections-floor-$key"

# shellcheck source=scripts/build-once.sh
. "$here/scripts/build-once.sh"
build_once "$out" "$out" "the floor collections"

rm -rf "$out"
mkdir -p "$out/ansible_collections"
for name in "${dependencies[@]}"; do
  release=${shipped_by["$name ${floors[$name]}"]}
  tree=$(PYTHON=$python "$here/scripts/ansible-collections.sh" "$release")
  path=${name/.//}
  shipped=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["collection_info"]["version"])' \
    "$tree/ansible_collections/$path/MANIFEST.json")
  if [ "$shipped" != "${floors[$name]}" ]; then
    log "ansible $release ships $name $shipped, not ${floors[$name]}, the floor galaxy.yml declares"
    exit 1
  fi
  mkdir -p "$out/ansible_collections/${path%/*}"
  cp -a "$tree/ansible_collections/$path" "$out/ansible_collections/$path"
  log "$name ${floors[$name]} (from ansible $release)"
done
touch "$out/.complete"
echo "$out"
