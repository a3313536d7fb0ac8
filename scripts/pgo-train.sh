#!/usr/bin/env bash
# The training run of a profile-guided build (scripts/pgo-build.sh, docs/performance.md "Release
# builds"): the instrumented `memsnap` runs what users run, on real snapshots written by PyTorch,
# and each run adds its counts to the build tree's .gcda files. The snapshots are PyTorch's own
# (MEMSNAP_TORCH_FIXTURES, default ../shared/fixtures/torch), read where they are; memsnap's
# benchmarks' synthetic snapshots are not used, so that the profile is not fitted to what the
# benchmarks measure. Every command runs twice: from the file (MEMSNAP_CACHE=0, as the benchmarks
# read) and then with a snapshot cache in a temporary folder (a first command that stores, a
# second that answers from it: what a user's default does).
#
# usage: scripts/pgo-train.sh MEMSNAP            exit 0 when it trained, 77 when there is no
#                                                snapshot to train on, 1 when a run crashed or was refused
set -euo pipefail
bin=${1:?usage: pgo-train.sh MEMSNAP}
root=$(cd "$(dirname "$0")/.." && pwd)
fixtures=${MEMSNAP_TORCH_FIXTURES:-$root/../shared/fixtures/torch}
shopt -s nullglob
snaps=("$fixtures"/*.pickle)
if [[ ${#snaps[@]} -eq 0 ]]; then
  echo "SKIP: memsnap pgo: no PyTorch snapshots in $fixtures to train on" >&2
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run ARGS...: one training run. A failure at run time (exit status 1: a replay that does not
# match, a limit broken, a snapshot without what a command needs) is part of what is trained; a
# usage error (2: a command or an option that changed) or a crash stops the training.
run() {
  local rc=0
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  if [[ $rc -gt 1 ]]; then
    echo "memsnap pgo: 'memsnap $*' ended with status $rc:" >&2
    tail -n 5 "$tmp/err" >&2
    exit 1
  fi
}

train() {
  local s
  for s in "${snaps[@]}"; do
    run stats "$s"
    run trace "$s"
    run timeline "$s"
    run timeline "$s" --json
    run top "$s"
    run top "$s" --by category
    run memory "$s" -q -o "$tmp/m.svg"
    run segments "$s" -q -o "$tmp/s.svg"
    run explain "$s"
    run replay "$s" --check
    run view "$s" -q -o "$tmp/v.html"
    run convert "$s" "$tmp/s.msgpack" --to memsnap
    run convert "$tmp/s.msgpack" "$tmp/s.pickle" --to pickle
    run timeline "$tmp/s.msgpack"
    run timeline "$tmp/s.pickle"
  done
  # two snapshots at once: compare, the gate, the exports of many ranks
  run compare "${snaps[0]}" "${snaps[-1]}"
  run compare "${snaps[-1]}" "${snaps[0]}" --json
  run check "${snaps[-1]}" --baseline "${snaps[0]}" --limit 'peak_allocated<=+100%'
  rm -f "$tmp/x.db"
  run export "${snaps[@]}" --sqlite "$tmp/x.db"
}

MEMSNAP_CACHE=0 train
XDG_CACHE_HOME=$tmp/cache train
XDG_CACHE_HOME=$tmp/cache train
echo "memsnap pgo: trained on ${#snaps[@]} snapshots from $fixtures"
