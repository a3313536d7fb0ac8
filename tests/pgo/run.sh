#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The profile-guided release tree (scripts/pgo-build.sh, cmake/pgo.cmake; docs/performance.md
# "Release builds"), made as make bench and make wheel make theirs, in a temporary folder:
#   - the training ran: every object of the reader has its counts, and the tree was built again
#     from them (-fprofile-use on every compile command);
#   - the optimised command answers exactly what the suite's build answers: `trace --json`,
#     `timeline --json`, `stats`, `top --by category --json`, `explain --json` and `compare --json`
#     on every PyTorch snapshot, byte for byte;
#   - the training refuses a command that no longer exists (a usage error is not trained around).
# usage: run.sh SOURCE_DIR MEMSNAP FIXTURES     Exit 77 (ctest: skipped) without the fixtures or
#                                               without GCC.
set -euo pipefail
src=${1:?usage: run.sh SOURCE_DIR MEMSNAP FIXTURES} ref=${2:?} fixtures=${3:?}
shopt -s nullglob
snaps=("$fixtures"/*.pickle)
[[ ${#snaps[@]} -gt 0 ]] || { echo "SKIP: no PyTorch snapshots in $fixtures; profile-guided build not tried"; exit 77; }
command -v gcc >/dev/null || { echo "SKIP: no gcc; profile-guided build not tried"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
export MEMSNAP_TORCH_FIXTURES=$fixtures MEMSNAP_CACHE=0
if ! CC=gcc JOBS=${JOBS:-2} "$src/scripts/pgo-build.sh" "$work/tree" -DCMAKE_BUILD_TYPE=Release \
     -DMS_DEBUG=0 -DMS_BUILD_TESTS=OFF -DMS_BUILD_BENCH=OFF -DMS_BUILD_SAMPLES=OFF \
     -DMEMSNAP_WITH_CUDA=OFF -- memsnap >"$work/log" 2>&1; then
  tail -n 30 "$work/log"
  echo "FAIL: pgo-build.sh failed"
  exit 1
fi
grep -q '^memsnap pgo: trained on [0-9]* snapshots' "$work/log" || { echo "FAIL: no training"; fail=1; }
grep -q "built from the training's profile" "$work/log" || { echo "FAIL: not built from the profile"; fail=1; }
for o in pickle_entry pickle_frames pickle_vm index state; do
  n=$(find "$work/tree" -name "$o.c.gcda" | wc -l)
  (( n > 0 )) || { echo "FAIL: no counts for $o.c"; fail=1; }
done
cmds=$(grep -c '"command"' "$work/tree/compile_commands.json")
uses=$(grep -c 'fprofile-use' "$work/tree/compile_commands.json")
[[ $cmds -gt 0 && $cmds == "$uses" ]] || { echo "FAIL: $uses of $cmds objects built from the profile"; fail=1; }
opt=$work/tree/bin/memsnap
[[ -x $opt ]] || { echo "FAIL: no command built"; exit 1; }
# the same answers
same() {
  local a=0 b=0
  "$ref" "$@" >"$work/a" 2>&1 || a=$?
  "$opt" "$@" >"$work/b" 2>&1 || b=$?
  if [[ $a != "$b" ]] || ! cmp -s "$work/a" "$work/b"; then
    echo "FAIL: 'memsnap $*' differs (status $a, optimised $b)"
    diff "$work/a" "$work/b" | head -n 5
    fail=1
  fi
}
for s in "${snaps[@]}"; do
  same trace "$s" --json
  same timeline "$s" --json
  same stats "$s"
  same top "$s" --by category --json
  same explain "$s" --json
done
same compare "${snaps[0]}" "${snaps[-1]}" --json
# a training command that no longer parses stops the training
mkdir -p "$work/bin"
cat >"$work/bin/memsnap" <<'EOF'
#!/bin/sh
echo "memsnap: error: unknown option" >&2
exit 2
EOF
chmod +x "$work/bin/memsnap"
rc=0
"$src/scripts/pgo-train.sh" "$work/bin/memsnap" >"$work/refused" 2>&1 || rc=$?
[[ $rc == 1 ]] || { echo "FAIL: a usage error in training gave status $rc, not 1"; fail=1; }
grep -q "ended with status 2" "$work/refused" || { echo "FAIL: the refusal is not said"; fail=1; }
[[ $fail == 0 ]] && echo "pgo: trained, built from the profile, the same answers on ${#snaps[@]} snapshots"
exit $fail
