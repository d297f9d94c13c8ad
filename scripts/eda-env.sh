#!/usr/bin/env bash
# Builds, once per requirement set, the Event-Driven Ansible environment (requirements/eda.txt: ansible-rulebook
# with its rule engine, and the controller's ansible) under $GPUOPS_CACHE, keyed by a hash of the interpreter and
# the requirement files; prints its directory. ansible-rulebook also needs a Java 17+ runtime: Debian's
# openjdk-17-jdk-headless, which scripts/bootstrap.sh installs; run it with JAVA_HOME pointing there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
python=${PYTHON:-python3.11}
log() { printf '[eda-env] %s\n' "$*" >&2; }

reqs=("$here/requirements/eda.txt" "$here/requirements/controller.txt")
venv="$cache/venv-eda-$( ("$python" -VV; cat "${reqs[@]}") | sha256sum | cut -c1-12)"
if [ ! -f "$venv/.complete" ]; then
  log "creating $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements/eda.txt"
  "$venv/bin/pip" check --disable-pip-version-check >&2
  touch "$venv/.complete"
fi
printf '%s\n' "$venv"
