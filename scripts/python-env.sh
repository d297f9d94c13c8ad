#!/usr/bin/env bash
# A virtual environment for one interpreter with pinned requirements, built once per interpreter and requirement
# set under $GPUOPS_CACHE/venv-NAME-<hash>; prints its directory. The hash covers the interpreter (`PYTHON -VV`),
# the arguments and every requirement file they name, with the files those include (-r), so a changed pin makes a
# new environment. One build at a time per environment (scripts/build-once.sh): a second caller waits for it.
#   scripts/python-env.sh NAME PYTHON PIP-INSTALL-ARGUMENTS...
#   scripts/python-env.sh e2e "$(scripts/build-python.sh)" -r requirements/e2e.txt
#   scripts/python-env.sh ansible-core-2.20 python3.13 ansible-core==2.20.10
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
[ $# -ge 3 ] || { echo "usage: scripts/python-env.sh NAME PYTHON PIP-INSTALL-ARGUMENTS..." >&2; exit 2; }
name=$1 python=$2
shift 2
command -v "$python" >/dev/null || { echo "python-env.sh: no interpreter $python." >&2; exit 1; }

# A requirement file and, depth first, the files it includes.
files_of() {
  local file=$1 include
  [ -f "$file" ] || { echo "python-env.sh: no requirement file $file." >&2; exit 1; }
  printf '%s\n' "$file"
  sed -n 's/^-r[[:space:]]*//p' "$file" | while IFS= read -r include; do
    files_of "$(dirname "$file")/$include"
  done
}
# The key: the interpreter, the arguments but the requirement files' paths (a clone elsewhere shares the
# environment), and those files' contents.
files=() words=()
previous=''
for arg in "$@"; do
  if [ "$previous" = -r ]; then mapfile -t -O "${#files[@]}" files < <(files_of "$arg"); else words+=("$arg"); fi
  previous=$arg
done
key=$( ("$python" -VV; printf '%s\n' "${words[@]}"; [ ${#files[@]} -eq 0 ] || cat "${files[@]}") | sha256sum | cut -c1-12)
venv="$cache/venv-$name-$key"
# shellcheck source=scripts/build-once.sh
. "$here/scripts/build-once.sh"
build_once "$venv" "$venv" "the $name environment"
printf '[python-env] creating %s\n' "$venv" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$@"
"$venv/bin/pip" check --disable-pip-version-check >&2
touch "$venv/.complete"
echo "$venv"
