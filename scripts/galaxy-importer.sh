#!/usr/bin/env bash
# Runs galaxy-importer, the check Galaxy and Automation Hub run on import, on the collection tarball as
# `ansible-galaxy collection build` makes it from the files git knows about. Its environment (requirements/
# galaxy-importer.txt) is cached under $GPUOPS_CACHE (scripts/python-env.sh), and holds ansible-doc and
# ansible-lint, so none of the importer's checks is skipped. Fails when the import fails and when the
# importer warns about anything.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3.11}
log() { printf '[galaxy-importer] %s\n' "$*" >&2; }

venv=$("$here/scripts/python-env.sh" galaxy-importer "$python" -r "$here/requirements/galaxy-importer.txt")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tree=$("$here/scripts/collection-tree.sh" "$work/tree/ansible_collections/gpuops/k8s")
# galaxy.yml names no repository address: the project has no public one yet. Galaxy requires one on import, and
# without it the importer stops before its other checks, so the tarball checked here (never the one published)
# carries GPUOPS_REPOSITORY_URL when set, else a stand-in under .invalid that can never resolve. Publishing
# needs the real address in galaxy.yml (README, "Releases").
if ! grep -q '^repository:' "$tree/galaxy.yml"; then
  repository=${GPUOPS_REPOSITORY_URL:-https://gpuops.invalid/k8s}
  log "checked with repository: $repository (galaxy.yml has none)"
  # The tree is this check's own copy (scripts/collection-tree.sh copies the files git knows about).
  printf 'repository: %s\n' "$repository" >> "$tree/galaxy.yml"
fi
"$venv/bin/ansible-galaxy" collection build "$tree" --output-path "$work" >/dev/null
tarball=$(compgen -G "$work/gpuops-k8s-*.tar.gz")
cat > "$work/galaxy-importer.cfg" <<'CFG'
[galaxy-importer]
RUN_ANSIBLE_DOC = True
RUN_ANSIBLE_LINT = True
CHECK_CHANGELOG = True
CFG
log "importing $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KB)"
rc=0
# In the work directory: the importer writes its importer_result.json where it runs.
(cd "$work" && PATH="$venv/bin:$PATH" GALAXY_IMPORTER_CONFIG="$work/galaxy-importer.cfg" \
  "$venv/bin/python" -m galaxy_importer.main "$tarball" > "$work/import.log" 2>&1) || rc=$?
if [ "$rc" -ne 0 ] || grep -qE '^(WARNING|ERROR)' "$work/import.log"; then
  grep -E '^(WARNING|ERROR)' "$work/import.log" >&2 || tail -n 20 "$work/import.log" >&2
  log "the import failed or warned (exit status $rc); the lines above say why"
  exit 1
fi
log "$(tail -n 1 "$work/import.log")"
