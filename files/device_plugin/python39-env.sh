#!/usr/bin/env bash
# Builds, once per dependency set, a virtual environment on Python 3.9 (the oldest Python the daemon
# supports) holding this package installed from source at the lower bound of every dependency it
# declares in pyproject.toml, plus the test tools; prints the environment's directory.
# The interpreter: $PYTHON39, else the newest <pyenv root>/versions/3.9.*/bin/python3.9.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
host_python=${PYTHON:-python3}
log() { printf '[device-plugin-py39] %s\n' "$*" >&2; }

python39=${PYTHON39:-}
if [ -z "$python39" ]; then
  root=$(pyenv root 2>/dev/null || printf '%s' "${PYENV_ROOT:-$HOME/.pyenv}")
  python39=$(compgen -G "$root/versions/3.9.*/bin/python3.9" | sort -V | tail -n 1 || true)
fi
if [ -z "$python39" ] || ! "$python39" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 9))' 2>/dev/null; then
  echo "No Python 3.9 interpreter was found (looked for \$PYTHON39, then <pyenv root>/versions/3.9.*/bin/python3.9)." >&2
  exit 1
fi

# The package's dependencies at their declared lower bounds (lower_bounds.py); the test tools pinned.
constraints=$("$host_python" "$here/lower_bounds.py")
tools=$(grep -E '^grpcio-tools==' "$repo/requirements/test.txt")
key=$( ("$python39" -VV; printf '%s\n%s\n' "$constraints" "$tools";
        cd "$here" && sha256sum lower_bounds.py python39-env.sh tests/requirements-py39.txt) | sha256sum | cut -c1-12)
venv="$cache/venv-device-plugin-py39-$key"
# pip builds a project in place: build from a copy so the source tree stays clean.
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
# -L: the package's _shared files are links to the collection's module_utils (docs/architecture.md).
cp -rL "$here/pyproject.toml" "$here/README.md" "$here/src" "$copy/"
find "$copy/src" -name __pycache__ -type d -prune -exec rm -rf {} +
pip39() { "$venv/bin/python" -m pip -q --disable-pip-version-check "$@"; }
if [ ! -f "$venv/.complete" ]; then
  log "creating $venv from $python39"
  rm -rf "$venv"
  "$python39" -m venv "$venv"
  printf '%s\n' "$constraints" > "$venv/constraints.txt"
  pip39 install -c "$venv/constraints.txt" -r "$here/tests/requirements-py39.txt" "$tools"
  # The package with the dependencies it declares, resolved within the constraints.
  pip39 install --no-build-isolation -c "$venv/constraints.txt" "$copy"
  touch "$venv/.complete"
fi
# The environment outlives source changes: reinstall the package itself (offline) when it changed.
source_hash=$(cd "$copy" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
if [ "$(cat "$venv/.installed-source" 2>/dev/null || true)" != "$source_hash" ]; then
  pip39 install --no-build-isolation --no-deps --no-index --force-reinstall "$copy"
  printf '%s\n' "$source_hash" > "$venv/.installed-source"
fi
"$venv/bin/python" -m pip check --disable-pip-version-check >&2
printf '%s\n' "$venv"
