#!/usr/bin/env bash
# Runs one ansible-test command (sanity or units) on each ansible-core version of the matrix in turn, each from an
# environment that holds that ansible-core alone (scripts/python-env.sh) on the Python given with it; ansible-test
# --venv then makes the environments of its own checks. Python 3.11 is Debian 12's; the one scripts/build-python.sh
# builds (3.13) comes from there. Every version runs, also after one has failed; a line per version says how it
# ended, and the exit status whether all passed.
#   scripts/ansible-test-matrix.sh sanity|units VERSION/PYTHON...    (the Makefile's ANSIBLE_CORE_MATRIX)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
collection=$here/.build/ansible_collections/gpuops/k8s
command=$1
shift
built=$("$here/scripts/build-python.sh" --minor)
summary=()
failed=0
for entry in "$@"; do
  version=${entry%/*} python=${entry#*/}
  start=$(date +%s)
  printf '== ansible-test %s, ansible-core %s on Python %s\n' "$command" "$version" "$python"
  if (
    set -e
    if [ "$python" = "$built" ]; then interpreter=$("$here/scripts/build-python.sh"); else interpreter=$(command -v "python$python"); fi
    venv=$("$here/scripts/python-env.sh" "ansible-core-$version" "$interpreter" "ansible-core==$version")
    # ansible-test finds python<version> on PATH for --python.
    bin=$(dirname "$interpreter")
    export PATH="$venv/bin:$bin:$PATH"
    "$here/scripts/ansible-test-pip.sh"
    cd "$collection"
    ansible-test "$command" --venv --python "$python" --color no
  ); then result=passed; else result=failed; failed=1; fi
  summary+=("$(printf '%-8s %-5s %4s s  %s' "$version" "$python" "$(($(date +%s) - start))" "$result")")
done
printf 'ansible-test %s, each ansible-core version:\n' "$command"
printf '  %s\n' "${summary[@]}"
exit "$failed"
