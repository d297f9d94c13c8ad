#!/usr/bin/env bash
# Builds the device-plugin image from the local Debian 12 base and, with --save, writes it as an
# OCI archive for `ctr images import`. Cached by content: the image tag is a hash of the daemon's
# sources, this script, the Containerfile and the base image; an unchanged tree rebuilds nothing.
# The image is also tagged with the package's version (localhost/<name>:<version>, both from
# pyproject.toml): the device_plugin role's default image, and latest.
#   files/device_plugin/build-image.sh [--save FILE]   -> prints the image reference (the content tag)
#   files/device_plugin/build-image.sh --reference     -> prints the version reference; builds nothing
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
python=${PYTHON:-python3}
save=""
# localhost/<name>:<version> from the package's own metadata: one source for the name and the version.
reference=$("$python" -c 'import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("localhost/{}:{}".format(project["name"], project["version"]))' "$here/pyproject.toml")
repository=${reference%:*}
while [ $# -gt 0 ]; do
  case "$1" in
    --save) save=$2; shift 2 ;;
    --reference) echo "$reference"; exit 0 ;;
    *) echo "usage: $0 [--save FILE | --reference]" >&2; exit 2 ;;
  esac
done
log() { printf '[device-plugin-image] %s\n' "$*" >&2; }

base=$("$repo/scripts/build-base-image.sh")
# One build at a time: make test's tiers can ask for the image side by side (daemon-image and e2e, in two lanes).
mkdir -p "$cache"
exec 8>"$cache/device-plugin-image.lock"
flock 8
base_id=$(podman image inspect --format '{{.Id}}' "$base")
hash=$( (cd "$here" && find -L src -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum;
         sha256sum Containerfile build-image.sh lower_bounds.py pyproject.toml; echo "$base_id") | sha256sum | cut -c1-12)
tag="$repository:$hash"

if ! podman image exists "$tag"; then
  # Wheels come from the package index through pip, once per dependency set, outside the build.
  # The dependencies at the lower bounds pyproject.toml declares: the versions the tests use.
  deps=$("$python" "$here/lower_bounds.py")
  # For the image's Python (Debian 12's python3), whichever Python runs this script.
  for_image=(--only-binary=:all: --implementation cp --python-version 3.11)
  wheels="$cache/wheels/device-plugin-$(printf '%s %s' "$deps" "${for_image[*]}" | sha256sum | cut -c1-12)"
  if [ ! -f "$wheels/.complete" ]; then
    log "downloading wheels into $wheels"
    mkdir -p "$wheels"
    printf '%s\n' "$deps" > "$wheels/requirements.txt"
    "$python" -m pip download -q "${for_image[@]}" -d "$wheels" -r "$wheels/requirements.txt"
    touch "$wheels/.complete"
  fi
  context=$(mktemp -d)
  trap 'rm -rf "$context"' EXIT
  "$python" -m pip install -q "${for_image[@]}" --no-index --find-links "$wheels" --target "$context/site" \
    -r "$wheels/requirements.txt"
  # -L: src/gpu_device_plugin/_shared links to the collection's module_utils; the image gets the files.
  cp -rL "$here/src/gpu_device_plugin" "$context/site/"
  find "$context/site" -name __pycache__ -type d -prune -exec rm -rf {} +
  rm -rf "$context/site/bin"
  cp "$here/Containerfile" "$context/"
  log "building $tag from $base"
  podman build -q --build-arg "BASE=$base" -t "$tag" "$context" >/dev/null
fi
podman tag "$tag" "$reference" "$repository:latest"
log "size: $(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.1f MB", $1 / 1000000}')"

if [ -n "$save" ]; then
  archive="$cache/images/gpu-device-plugin-$hash.oci.tar"
  if [ ! -f "$archive" ]; then
    mkdir -p "$cache/images"
    podman save -q --format oci-archive -o "$archive.tmp" "$tag"
    mv "$archive.tmp" "$archive"
  fi
  cp "$archive" "$save"
  log "saved $save ($(du -m "$save" | cut -f1) MB)"
fi
echo "$tag"
