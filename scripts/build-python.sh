#!/usr/bin/env bash
# Builds the CPython that the newest ansible-core needs on the controller (2.20 and later need Python 3.12 or
# newer; Debian 12 has 3.11, and the 3.13 binaries of Debian's next release need its newer glibc) from the source
# tarball in Debian's source pool, through the mirror this machine's apt uses, checked against the checksum that
# Debian's python3.13_3.13.5-2.dsc gives.
# Installed into $GPUOPS_CACHE/python-<version>-<hash of the source and the configure flags> once (scripts/build-once.sh); prints the
# interpreter's path. Every build dependency (gcc, make and the -dev packages of ssl, ffi, zlib, bz2, lzma,
# sqlite3, readline, ncurses, uuid) comes from scripts/bootstrap.sh's list.
#   scripts/build-python.sh            -> /root/.cache/gpuops/python-3.13.5-<hash>/bin/python3.13
#   scripts/build-python.sh --minor    -> 3.13 (what it builds; builds nothing)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
version=3.13.5
minor=${version%.*}
if [ "${1:-}" = --minor ]; then echo "$minor"; exit 0; fi
tarball=python${minor}_${version}.orig.tar.xz
sha256=93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640
# How it is built; with the source's checksum, the key of the cached build. Without the test modules (the C
# extensions and Lib/test that only CPython's own test suite uses: a third of the files `make install` byte-compiles
# three times) and without debug information (OPT: CPython's default less -g; configure adds -DNDEBUG to it), which
# the controller never needs: less work for a cold run, which is CPU-bound (docs/performance.md, "Cold CI").
configure_flags=(--with-ensurepip=install --disable-test-modules "OPT=-O3 -Wall")
out="$cache/python-$version-$(printf '%s\n' "$sha256" "${configure_flags[@]}" | sha256sum | cut -c1-12)"
# shellcheck source=scripts/build-once.sh
. "$here/scripts/build-once.sh"
build_once "$out" "$out/bin/python$minor" "CPython $version"

log() { printf '[build-python] %s\n' "$*" >&2; }
die() { printf 'build-python.sh: %s\n' "$*" >&2; exit 1; }
# shellcheck source=scripts/debian-mirror.sh
. "$here/scripts/debian-mirror.sh"
mirror=$(debian_mirror build-python.sh)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src="$cache/sources/$tarball"
if [ ! -f "$src" ] || ! echo "$sha256  $src" | sha256sum -c --status; then
  log "downloading $tarball"
  mkdir -p "$cache/sources"
  curl -fsSL --retry 3 -o "$work/$tarball" "$mirror/pool/main/p/python$minor/$tarball"
  echo "$sha256  $work/$tarball" | sha256sum -c --status || die "$tarball does not have the checksum this script expects."
  mv "$work/$tarball" "$src"
fi
start=$(date +%s)
tar -xJf "$src" -C "$work"
cd "$work/Python-$version"
rm -rf "$out"
./configure -q --prefix="$out" "${configure_flags[@]}" >"$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; die "configure failed."; }
make -s -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -n 30 "$work/make.log" >&2; die "make failed."; }
make -s install >"$work/install.log" 2>&1 || { tail -n 30 "$work/install.log" >&2; die "make install failed."; }
# The modules pip, venv and ansible-core need; a missing -dev package leaves one out without failing the build.
"$out/bin/python$minor" -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, readline, venv, ensurepip' \
  || die "the built Python lacks a module (a -dev package was missing at build time)."
touch "$out/.complete"
log "CPython $version built in $(($(date +%s) - start)) s"
echo "$out/bin/python$minor"
