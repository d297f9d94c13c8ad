#!/usr/bin/env bash
# Builds the AWX execution environment (EE) with ansible-builder from meta/execution-environment.yml
# and prints its image reference. No registry and no Galaxy are reachable, so:
#   - the base image (localhost/gpuops-ee-base, meta/ee-base/Containerfile) is built from the local
#     Debian 12 image (scripts/build-base-image.sh) with ansible-core and ansible-runner at the pins
#     of requirements/*.txt;
#   - the collections are tarballs made from the ones the project's virtual environment has (the
#     `ansible` package), at the versions the definition names;
#   - every pip install in the builds takes its wheels from a wheelhouse that pip fills on the host
#     once per dependency set (mounted at /wheelhouse), constrained to the venv's versions.
# Cached by content: the EE's tag is a hash of the definition, meta/ee-requirements.txt,
# meta/ee-bindep.txt, the base image's ID, the collections' versions and this script; the base's tag
# a hash of its Containerfile, its package-manager shim, the Debian image's tag and the pins. Both
# images are kept as tarballs in $GPUOPS_CACHE/images, so a fresh podman storage loads them again.
#   scripts/build-ee.sh            -> prints the image reference (localhost/gpuops-ee:<hash>)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
python=${PYTHON:-python3}
definition=$here/meta/execution-environment.yml
base_dir=$here/meta/ee-base
ee_repo=localhost/gpuops-ee
base_repo=localhost/gpuops-ee-base
log() { printf '[ee] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

command -v ansible-builder >/dev/null || die "ansible-builder is not on PATH: run 'make ee' (it puts the project's venv first)."
mkdir -p "$cache/images" "$cache/wheels" "$cache/ee"
# One build at a time per cache (pytest-xdist workers each ask for the image).
exec 9>"$cache/ee/.lock"
flock 9

# The EE's base is Debian 12 (Python 3.11): the oldest controller's ansible-core (requirements/controller-oldest.txt).
pin() { grep -hE "^$1==" "$here"/requirements/controller-oldest.txt "$here"/requirements/test.txt | head -n 1; }
ansible_core=$(pin ansible-core)
ansible_runner=$(pin ansible-runner)
{ [ -n "$ansible_core" ] && [ -n "$ansible_runner" ]; } || die "requirements/*.txt must pin ansible-core and ansible-runner."

# The collections the definition names (collections/<namespace>-<name>-<version>.tar.gz), checked
# against the venv's copies; and the EE's init package, which the wheelhouse must also hold.
collections_root=$("$python" -c 'import os, ansible; print(os.path.join(os.path.dirname(os.path.dirname(ansible.__file__)), "ansible_collections"))')
collections=$("$python" - "$definition" "$collections_root" <<'PY'
import json
import os
import re
import sys

import yaml

definition, root = sys.argv[1:]
with open(definition, encoding="utf-8") as handle:
    ee = yaml.safe_load(handle)
for requirement in ee["dependencies"]["galaxy"]["collections"]:
    match = re.fullmatch(r"collections/([a-z0-9_]+)-([a-z0-9_]+)-(\S+)\.tar\.gz", requirement["name"])
    if requirement.get("type") != "file" or not match:
        sys.exit(f"{definition}: {requirement['name']!r} is not collections/<ns>-<name>-<version>.tar.gz of type file")
    namespace, name, version = match.groups()
    source = os.path.join(root, namespace, name)
    try:
        with open(os.path.join(source, "MANIFEST.json"), encoding="utf-8") as handle:
            installed = json.load(handle)["collection_info"]["version"]
    except FileNotFoundError:
        sys.exit(f"{namespace}.{name} is not installed in the venv ({source}); the `ansible` package brings it")
    if installed != version:
        sys.exit(f"the venv has {namespace}.{name} {installed}; {definition} names {version}: make them agree")
    print(namespace, name, version, source)
PY
)
init_package=$("$python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["options"]["container_init"]["package_pip"])' "$definition")

# The wheelhouse: every Python package the builds install, for the base's Debian 12 (Python 3.11,
# glibc 2.36). Its requirements are what ansible-builder's introspection will ask for (this
# definition's plus the collections' own), the pins, the init package, and the builder stage's tools.
wheelhouse() {
  local reqs intro key dir plats=() machine m
  reqs=$(mktemp)
  intro=$(mktemp -d)
  while read -r namespace name _ source; do
    mkdir -p "$intro/ansible_collections/$namespace"
    ln -s "$source" "$intro/ansible_collections/$namespace/$name"
  done <<< "$collections"
  ansible-builder introspect --user-pip "$here/meta/ee-requirements.txt" --write-pip "$reqs" "$intro" >/dev/null
  rm -rf "$intro"
  printf '%s\n' "$ansible_core" "$ansible_runner" "$init_package" bindep PyYAML packaging >> "$reqs"
  "$python" -m pip freeze --exclude-editable > "$reqs.constraints"
  key=$(cat "$reqs" "$reqs.constraints" | sha256sum | cut -c1-12)
  dir=$cache/wheels/ee-$key
  if [ ! -f "$dir/.complete" ]; then
    log "downloading wheels into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    machine=$(uname -m)
    for m in $(seq 36 -1 17); do plats+=(--platform "manylinux_2_${m}_$machine"); done
    plats+=(--platform "manylinux2014_$machine" --platform "manylinux2010_$machine" --platform "manylinux1_$machine")
    "$python" -m pip download -q -d "$dir" --only-binary=:all: --python-version 3.11 --implementation cp \
      --abi cp311 --abi abi3 --abi none "${plats[@]}" -r "$reqs" -c "$reqs.constraints" >&2
    cp "$reqs" "$dir/requirements.txt"
    cp "$reqs.constraints" "$dir/constraints.txt"
    touch "$dir/.complete"
  fi
  rm -f "$reqs" "$reqs.constraints"
  echo "$dir"
}

# load_or_build TAG TARBALL BUILD_FUNCTION: the image from podman storage, else from its tarball,
# else built (and saved as the tarball).
load_or_build() {
  local tag=$1 tarball=$2 build=$3
  if podman image exists "$tag"; then
    return
  fi
  if [ -f "$tarball" ]; then
    log "loading $tag from $tarball"
    podman load -q -i "$tarball" >/dev/null
    podman image exists "$tag" || die "$tarball did not hold $tag"
    return
  fi
  "$build" "$tag"
  podman save -q --format docker-archive -o "$tarball.tmp" "$tag"
  mv "$tarball.tmp" "$tarball"
  log "saved $tarball ($(du -m "$tarball" | cut -f1) MB)"
}

wheels=""
need_wheels() { [ -n "$wheels" ] || wheels=$(wheelhouse); }

build_base() {
  need_wheels
  log "building $1 from $debian"
  podman build -q --layers=false --build-arg "DEBIAN_IMAGE=$debian" --build-arg "ANSIBLE_CORE=$ansible_core" \
    --build-arg "ANSIBLE_RUNNER=$ansible_runner" --volume "$wheels:/wheelhouse:ro" -t "$1" "$base_dir" >/dev/null
}

build_ee() {
  local stage
  need_wheels
  stage=$(mktemp -d "$cache/ee/stage.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the trap outlives this function's locals
  trap "rm -rf '$stage'" EXIT
  # The definition's paths are relative to the collection root, so the staging directory is one.
  mkdir -p "$stage/meta" "$stage/collections"
  cp "$definition" "$stage/execution-environment.yml"
  cp "$here/meta/ee-requirements.txt" "$here/meta/ee-bindep.txt" "$stage/meta/"
  # Collection artifacts from the installed collections. The `ansible` package leaves out what a
  # release artifact also carries (tests/, docs/, dotfiles), so FILES.json lists files that are not
  # there and `ansible-galaxy collection install` would stop at the first one: the artifact's
  # FILES.json keeps the entries that exist (each file checked against its checksum) and MANIFEST.json
  # the new FILES.json's checksum, so `ansible-galaxy collection verify --offline` agrees with it.
  while read -r _ _ _ source; do
    "$python" - "$source" "$stage/collections" <<'PY' >&2
import hashlib
import io
import json
import os
import sys
import tarfile

source, out_dir = sys.argv[1:]
with open(os.path.join(source, "MANIFEST.json"), encoding="utf-8") as handle:
    manifest = json.load(handle)
with open(os.path.join(source, "FILES.json"), encoding="utf-8") as handle:
    files = json.load(handle)
kept = []
for entry in files["files"]:
    path = os.path.join(source, entry["name"])
    if entry["ftype"] == "dir" and os.path.isdir(path):
        kept.append(entry)
    elif entry["ftype"] == "file" and os.path.isfile(path):
        with open(path, "rb") as handle:
            if hashlib.sha256(handle.read()).hexdigest() != entry["chksum_sha256"]:
                sys.exit(f"{path} differs from its checksum in FILES.json: the venv's collection was changed")
        kept.append(entry)
left_out = len(files["files"]) - len(kept)
files["files"] = kept
files_json = json.dumps(files, indent=4).encode()
manifest["file_manifest_file"]["chksum_sha256"] = hashlib.sha256(files_json).hexdigest()
manifest_json = json.dumps(manifest, indent=4).encode()
info = manifest["collection_info"]
artifact = os.path.join(out_dir, f"{info['namespace']}-{info['name']}-{info['version']}.tar.gz")


def normalized(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    member.mtime = 0
    return member


with tarfile.open(artifact, "w:gz", format=tarfile.PAX_FORMAT) as tar:
    for name, data in (("MANIFEST.json", manifest_json), ("FILES.json", files_json)):
        member = normalized(tarfile.TarInfo(name))
        member.size, member.mode = len(data), 0o644
        tar.addfile(member, io.BytesIO(data))
    for entry in kept:
        if entry["name"] == ".":
            continue
        path = os.path.join(source, entry["name"])
        member = normalized(tar.gettarinfo(path, entry["name"]))
        if member.isreg():
            with open(path, "rb") as handle:
                tar.addfile(member, handle)
        else:
            tar.addfile(member)
print(f"[ee] {os.path.basename(artifact)}: {len(kept)} entries ({left_out} listed but not installed)")
PY
  done <<< "$collections"
  build_log=$cache/ee/build-${1##*:}.log
  log "building $1 with ansible-builder from $base (log: $build_log)"
  # --layers=false: each stage is committed as one layer and no intermediate images are left
  # behind (pruning them afterwards would also prune other people's dangling images).
  if ! ansible-builder build -f "$stage/execution-environment.yml" -c "$stage/context" -t "$1" \
      --container-runtime podman --build-arg "EE_BASE_IMAGE=$base" \
      --extra-build-cli-args "--layers=false --volume $wheels:/wheelhouse:ro" -v 3 > "$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    die "ansible-builder failed; the whole log is $build_log"
  fi
  rm -rf "$stage"
  trap - EXIT
}

debian=$("$here/scripts/build-base-image.sh")
base_hash=$( (cd "$base_dir" && sha256sum Containerfile ee-pkgmgr; echo "$debian $ansible_core $ansible_runner") | sha256sum | cut -c1-12)
base="$base_repo:$base_hash"
load_or_build "$base" "$cache/images/gpuops-ee-base-$base_hash.tar" build_base
podman tag "$base" "$base_repo:latest"
base_id=$(podman image inspect --format '{{.Id}}' "$base")

ee_hash=$( (cd "$here" && sha256sum meta/execution-environment.yml meta/ee-requirements.txt meta/ee-bindep.txt scripts/build-ee.sh;
            echo "$base_id"; cut -d' ' -f1-3 <<< "$collections") | sha256sum | cut -c1-12)
ee="$ee_repo:$ee_hash"
load_or_build "$ee" "$cache/images/gpuops-ee-$ee_hash.tar" build_ee
podman tag "$ee" "$ee_repo:latest"
log "$ee: $(podman image inspect --format '{{.Size}}' "$ee" | awk '{printf "%.1f MB", $1 / 1000000}')"
echo "$ee"
