"""Stand-in for the pip bootstrap script that `ansible-test --venv` runs in each new virtual environment.

ansible-test fetches that script from a file server these machines cannot reach. This one does the same job
with what is reachable: the pip bundled with Python (ensurepip), then the pip version ansible-test asked for,
from the package registry pip is configured with. scripts/ansible-test-pip.sh puts it in ansible-test's cache.
"""

import subprocess
import sys

# Options only the original bootstrap script understands.
BOOTSTRAP_ONLY = {"--no-setuptools", "--no-wheel"}

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
subprocess.check_call([sys.executable, "-m", "pip", "install", *[a for a in sys.argv[1:] if a not in BOOTSTRAP_ONLY]])
