#!/usr/bin/env bash
# Builds, once per requirement set, the Event-Driven Ansible environment (requirements/eda.txt: ansible-rulebook
# with its rule engine, and the oldest controller's ansible) under $GPUOPS_CACHE (scripts/python-env.sh); prints its
# directory. ansible-rulebook also needs a Java 17+ runtime: Debian's openjdk-17-jdk-headless, which
# scripts/bootstrap.sh installs; run it with JAVA_HOME pointing there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exec "$here/scripts/python-env.sh" eda "${PYTHON:-python3.11}" -r "$here/requirements/eda.txt"
