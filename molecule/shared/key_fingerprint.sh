#!/usr/bin/env bash
# Prints the primary key fingerprint of the OpenPGP key in FILE (the tests' expected value for the roles'
# *_repo_key_fingerprint variables), read with gpg in a throwaway home.
#   molecule/shared/key_fingerprint.sh FILE
set -euo pipefail
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
gpg --batch --quiet --no-options --homedir "$home" --show-keys --with-colons <"$1" | awk -F: '$1 == "pub" { want = 1; next } want && $1 == "fpr" { print $10; exit }'
