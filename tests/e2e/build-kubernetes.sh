#!/usr/bin/env bash
# Builds the Kubernetes pieces the end-to-end lab runs (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl) from the k8s.io/kubernetes Go module at a pinned version, through
# the Go module proxy, plus the lab's pause program. Output goes to $GPUOPS_CACHE/k8s-<version>-<key>/bin,
# the key being a hash of what the output depends on (version, commands, flags, Go version, recipe
# revision, pause source), and is reused while that stays the same. Prints that bin directory on
# stdout; progress goes to stderr.
#
# The k8s.io/kubernetes module points its staging modules (k8s.io/api, k8s.io/apimachinery, ...) at
# ./staging/src in its own go.mod; a module that requires it must replace each of them with the
# published v0.<minor>.<patch> release. The replace lines are generated from that go.mod so they always
# match the pinned version.
#
# Environment:
#   GPUOPS_K8S_VERSION   Kubernetes version to build (default below)
#   GPUOPS_BUILD_JOBS    parallel compile jobs and GOMAXPROCS (default 2)
set -euo pipefail

version=${GPUOPS_K8S_VERSION:-v1.37.2}
jobs=${GPUOPS_BUILD_JOBS:-2}
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
here=$(cd "$(dirname "$0")" && pwd)
go=${GO:-/usr/local/go/bin/go}
commands=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
staging_version="v0.${version#v1.}"
minor=${version#v1.}
minor=${minor%%.*}
# Version stamps the official build sets with -X, so nodes report e.g. kubeletVersion v1.37.2.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
# No DWARF from the compiler either: -w drops it at link time, but the compiler still generates it for every package
# unless told not to, work that a cold run (CPU-bound on 2 cores) pays for nothing.
gcflags="all=-dwarf=false"
# Bump when the recipe changes in a way that changes the binaries.
recipe_revision=1

log() { printf '[build-kubernetes] %s\n' "$*" >&2; }

[ -x "$go" ] || { log "Go not found at $go (set GO=/path/to/go)"; exit 1; }
key=$({
  printf '%s\n' "$version" "${commands[*]}" "$ldflags" "$gcflags" "$recipe_revision" "$("$go" env GOVERSION)"
  cat "$here/pause/pause.go"
} | sha256sum | cut -c1-8)
out="$cache/k8s-$version-$key"

# shellcheck source=scripts/build-once.sh
. "$here/../../scripts/build-once.sh"
build_once "$out" "$out/bin" "Kubernetes $version"

rm -rf "$out"
mkdir -p "$out/src" "$out/bin"
export GOFLAGS="-trimpath -buildvcs=false -mod=mod" GOMAXPROCS="$jobs" CGO_ENABLED=0
export GOTOOLCHAIN=local
# The compiler and linker collect garbage less often (scripts/build-early.sh says why and what it saves).
export GOGC=${GPUOPS_BUILD_GOGC:-400}

log "fetching k8s.io/kubernetes@$version from the Go module proxy"
cd "$out/src"
cat > go.mod <<EOF
module gpuops.local/k8slab

go 1.24.0

require k8s.io/kubernetes $version
EOF
gomod=$("$go" mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
{
  echo
  echo "replace ("
  sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod"
  echo ")"
} >> go.mod
cat > tools.go <<'EOF'
//go:build tools

package k8slab

EOF
{
  echo "import ("
  for c in "${commands[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
  echo ")"
} >> tools.go
log "resolving module requirements (staging modules pinned to $staging_version)"
"$go" mod tidy -e >/dev/null 2>"$out/tidy.log" || { cat "$out/tidy.log" >&2; exit 1; }

pkgs=()
for c in "${commands[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
log "compiling ${commands[*]} with $jobs jobs (about 25 CPU-minutes the first time: 15 minutes on 2 idle cores, 40 on busy ones)"
start=$(date +%s)
/usr/bin/time -v -o "$out/build-time.txt" \
  nice -n "${GPUOPS_BUILD_NICE:-10}" "$go" build -p "$jobs" -gcflags "$gcflags" -ldflags "$ldflags" -o "$out/bin/" "${pkgs[@]}"
log "compiled in $(($(date +%s) - start)) s (details: $out/build-time.txt)"

log "compiling the pause program"
(cd "$here/pause" && "$go" build -gcflags "$gcflags" -ldflags "$ldflags" -o "$out/bin/pause" ./pause.go)

{
  echo "version=$version"
  echo "staging_version=$staging_version"
  echo "go=$("$go" env GOVERSION)"
  echo "seconds=$(($(date +%s) - start))"
  grep -E 'Elapsed|Maximum resident' "$out/build-time.txt"
} > "$out/build-info.txt"
touch "$out/.complete"
echo "$out/bin"
