#!/usr/bin/env bash
# ansible-test needs the collection at .../ansible_collections/<namespace>/<name>. This mirrors the
# files git knows about (tracked, plus untracked files that are not ignored) into such a tree and
# prints its path.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$here/.build/ansible_collections/gpuops/k8s}
mkdir -p "$dest"
# Two make targets may mirror at once (make -j, or two shells): one at a time.
exec 9>"$dest/../.mirror.lock"
flock 9
cd "$here"
git ls-files -co --exclude-standard -z | rsync -a --delete --files-from=- --from0 ./ "$dest/"
# rsync --delete only prunes inside directories it was given; remove files that git no longer lists. What
# ansible-test writes in the mirror (tests/output) stays: make test's lanes mirror while another lane's ansible-test runs.
(cd "$dest" && find . \( -path ./.git -o -path ./tests/output \) -prune -o -type f -printf '%P\n' | sort) \
  > "$dest/../.mirror-have"
git ls-files -co --exclude-standard | sort > "$dest/../.mirror-want"
comm -23 "$dest/../.mirror-have" "$dest/../.mirror-want" | while IFS= read -r f; do rm -f "$dest/$f"; done
rm -f "$dest/../.mirror-have" "$dest/../.mirror-want"
find "$dest" -type d -empty -not -path "$dest/.git/*" -not -path "$dest/tests/output" -not -path "$dest/tests/output/*" \
  -delete
# ansible-test lists a collection's files through the nearest git repository above it; that would be
# this checkout, which ignores .build/, so every target would be skipped. A repository of its own in
# the mirror (nothing committed) makes ansible-test list the mirrored files.
[ -e "$dest/.git" ] || git init -q "$dest"
echo "$dest"
