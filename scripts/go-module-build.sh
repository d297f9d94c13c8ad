# Sourced by the scripts that build programs from a Go module at a pinned version (build-nvidia-device-plugin.sh,
# build-nvidia-dra-driver.sh): the environment they build in, the download checked against a pinned checksum, and
# the build of each command. The caller sets go, jobs, cache, module and version, and defines log, first.
# shellcheck shell=bash disable=SC2154 # go, jobs, cache, module and version: the caller's

# shellcheck source=scripts/build-once.sh
. "$(dirname "${BASH_SOURCE[0]}")/build-once.sh"

# go_module_start OUT: ends the script, printing OUT/bin, when OUT holds a complete build (scripts/build-once.sh);
# otherwise an empty OUT/bin to build into, and the Go environment of the build: the module and build caches under
# $cache, the local toolchain, no build paths or VCS stamps in the binaries, cgo on (the programs dlopen
# libnvidia-ml.so.1 through go-nvml's cgo loader).
go_module_start() {
  local out=$1
  build_once "$out" "$out/bin" "$module $version"
  rm -rf "$out"
  mkdir -p "$out/bin"
  export GOMODCACHE="$cache/go-mod" GOCACHE="$cache/go-build" GOTOOLCHAIN=local GOMAXPROCS="$jobs"
  export GOFLAGS="-modcacherw -trimpath -buildvcs=false" GONOSUMDB="$module"
  # The compiler and linker collect garbage less often (scripts/build-early.sh says why and what it saves).
  export GOGC=${GPUOPS_BUILD_GOGC:-400}
  export CGO_ENABLED=1
}

# go_module_fetch SUM DEST: $module@$version downloaded through the Go module proxy, refused unless its h1: checksum
# is SUM (the checksum database does not answer for every version, so Go is told not to ask it), copied to DEST.
go_module_fetch() {
  local pinned=$1 dest=$2 download dir sum
  log "fetching $module@$version from the Go module proxy"
  download=$("$go" mod download -json "$module@$version")
  dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$download")
  sum=$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p' <<<"$download")
  [ -d "$dir" ] || { log "the module proxy gave no directory for $module@$version"; exit 1; }
  if [ -z "$pinned" ] || [ "$sum" != "$pinned" ]; then
    log "$module@$version has checksum '${sum:-none}', not the one pinned in this script ('${pinned:-none}')"
    exit 1
  fi
  cp -r "$dir" "$dest"
  chmod -R u+w "$dest"
}

# go_module_build BIN COMMAND...: each ./cmd/COMMAND of the module in the current directory, into BIN, with the link
# flags of NVIDIA's Makefiles (stripped, the version in internal/info), at low priority.
go_module_build() {
  local bin=$1 cmd ldflags="-s -w -X $module/internal/info.version=$version"
  shift
  for cmd in "$@"; do
    log "building $cmd (cached in $GOCACHE)"
    nice -n "${GPUOPS_BUILD_NICE:-10}" "$go" build -p "$jobs" -ldflags "$ldflags" -o "$bin/$cmd" "./cmd/$cmd"
  done
}
