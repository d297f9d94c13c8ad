#!/usr/bin/env bash
# The newest controller's environment (requirements/e2e.txt) on the CPython scripts/build-python.sh builds, for the
# e2e tier and the demo (Makefile, NEWEST); built once (scripts/python-env.sh), prints its directory.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exec "$here/scripts/python-env.sh" e2e "$("$here/scripts/build-python.sh")" -r "$here/requirements/e2e.txt"
