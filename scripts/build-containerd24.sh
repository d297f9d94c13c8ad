#!/usr/bin/env bash
# Builds containerd 2.4 (config version 3; from 2.2 on it imports /etc/containerd/conf.d/*.toml by
# itself) at a pinned version through scripts/build-containerd.sh; prints the path of the cached binary.
set -euo pipefail

exec "$(dirname "$0")/build-containerd.sh" github.com/containerd/containerd/v2 "${CONTAINERD24_VERSION:-v2.4.2}"
