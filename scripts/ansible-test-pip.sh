#!/usr/bin/env bash
# `ansible-test --venv` bootstraps pip in each new virtual environment with a script it downloads from a file
# server these machines cannot reach. Put our stand-in (scripts/ansible-test-get-pip.py) where ansible-test
# looks for its cached copy, named for the pip version this ansible-test pins.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
reqs=$(python -c 'import ansible_test, os; print(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py"))')
pip_version=$(sed -n "s/^ *pip='\([0-9.]*\)',\$/\1/p" "$reqs" | head -n1)
[ -n "$pip_version" ] || { echo "ansible-test-pip.sh: cannot find the pip version ansible-test pins in $reqs" >&2; exit 1; }
cache="$HOME/.ansible/test/cache"
mkdir -p "$cache"
install -m 0644 "$here/scripts/ansible-test-get-pip.py" "$cache/get_pip_${pip_version//./_}.py"
