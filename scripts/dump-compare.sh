#!/usr/bin/env bash
# dump-compare.sh: shows that two builds of conveyor give byte-identical `conveyor dump` output
# (stdout, stderr and exit status) on every dataset under tests/data and examples/
# (scripts/dump-all.py says which and how).
#
#   scripts/dump-compare.sh OLD_CONVEYOR NEW_CONVEYOR   # two binaries
#   scripts/dump-compare.sh REV [NEW_CONVEYOR]          # REV (e.g. a commit) built in a
#                                                       # temporary worktree, against
#                                                       # build/client/conveyor
# Exit status 0 when every dump is identical; the differing files are listed otherwise.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/conveyor-dump-compare.XXXXXX)
trap 'git -C "$repo" worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
if [ $# -lt 1 ]; then sed -n '2,10p' "$0"; exit 2; fi
old=$1
new=${2:-$repo/build/client/conveyor}
if [ ! -x "$old" ]; then
  echo "building $old in a temporary worktree (Release, no CUDA, no benchmarks)..."
  git -C "$repo" worktree add --detach "$work/src" "$old" >/dev/null
  cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCONVEYOR_CUDA=OFF \
    -DCONVEYOR_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$work/build" --target conveyor >/dev/null
  old=$work/build/client/conveyor
fi
python3 "$repo/scripts/dump-all.py" --conveyor "$old" --out "$work/before"
python3 "$repo/scripts/dump-all.py" --conveyor "$new" --out "$work/after"
if diff -rq "$work/before/dumps" "$work/after/dumps"; then
  echo "identical: $(ls "$work/after/dumps" | wc -l) dumps, $(cat "$work/after/dumps"/* | wc -c) bytes"
else
  echo "the dumps above differ" >&2
  exit 1
fi
