#!/usr/bin/env bash
# Runs galaxy-importer, the check Galaxy and Automation Hub run on import, on the collection tarball as
# `ansible-galaxy collection build` makes it from the files git knows about. Its environment (requirements/
# galaxy-importer.txt) is cached under $GPUOPS_CACHE (scripts/python-env.sh), and holds ansible-doc and
# ansible-lint, so none of the importer's checks is skipped (its ansible-lint run is made here as it makes it, below).
# Fails when the import fails and when the importer warns about anything.
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
# The importer's ansible-lint run is made below, as the importer makes it, instead of by the importer: the importer
# gives it 180 seconds (a limit in its own code), and on a two-core machine busy with other tiers it takes longer
# (3.5 minutes there, 2 of them CPU), which says nothing of the collection.
cat > "$work/galaxy-importer.cfg" <<'CFG'
[galaxy-importer]
RUN_ANSIBLE_DOC = True
RUN_ANSIBLE_LINT = False
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

# ansible-lint as galaxy-importer 0.4.44 runs it (galaxy_importer/loaders/collection.py, _lint_collection): in the
# extracted tarball, its collections path, temporary and cache directories set, offline, with the importer's
# profile, exclusions and skipped rules. What the importer makes of the output: every line on stdout is a warning,
# and so is a line on stderr that starts with CRITICAL or ERROR; any of them fails here, as does a failed run.
importer_source=$("$venv/bin/python" -c 'import galaxy_importer.loaders.collection as m; print(m.__file__)')
for piece in '"--profile",' '"production",' '"tests/integration/",' '"tests/unit/",' '"--format=pep8",' \
  '"--nocolor",' '"yaml,var-naming,avoid-dot-notation,import-task-no-when,single-entry-point,use-loop",' \
  'cmd.append("--offline")' 'XDG_CACHE_HOME='; do
  if ! grep -qF -- "$piece" "$importer_source"; then
    log "galaxy-importer no longer runs ansible-lint as this script does ($piece is not in $importer_source)"
    exit 1
  fi
done
extracted="$work/extracted"
mkdir -p "$extracted/ansible_collections/gpuops/k8s" "$work/lint-tmp"
tar -xzf "$tarball" -C "$extracted/ansible_collections/gpuops/k8s"
log "ansible-lint on the tarball, as the importer runs it"
lint_rc=0
(cd "$extracted/ansible_collections/gpuops/k8s" && PATH="$venv/bin:$PATH" /usr/bin/env \
  ANSIBLE_COLLECTIONS_PATH="$extracted" ANSIBLE_LOCAL_TEMP="$work/lint-tmp" XDG_CACHE_HOME="$work/lint-tmp" \
  ansible-lint --profile production --exclude tests/integration/ --exclude tests/unit/ --format=pep8 --nocolor \
  -x yaml,var-naming,avoid-dot-notation,import-task-no-when,single-entry-point,use-loop --offline \
  > "$work/lint.out" 2> "$work/lint.err") || lint_rc=$?
if [ "$lint_rc" -ne 0 ] || [ -s "$work/lint.out" ] || grep -qE '^(CRITICAL|ERROR)' "$work/lint.err"; then
  cat "$work/lint.out" >&2
  grep -E '^(CRITICAL|ERROR)' "$work/lint.err" >&2 || tail -n 20 "$work/lint.err" >&2
  log "ansible-lint found what the importer would report (exit status $lint_rc); the lines above say what"
  exit 1
fi
log "$(tail -n 1 "$work/lint.err")"
