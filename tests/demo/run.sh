#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make demo's run (scripts/demo.sh, issue #16 item 17), into a temporary folder: it succeeds, says
# one short line per step and no more than a screen in all, and ends with the list of what it
# made and what to open, every file of which exists.
# usage: run.sh SOURCE_DIR BUILD_DIR      Exit 77 (ctest: skipped) when the samples are not built.
set -euo pipefail
src=${1:?usage: run.sh SOURCE_DIR BUILD_DIR} build=${2:?usage: run.sh SOURCE_DIR BUILD_DIR}
for s in basic train record memsnap; do
  [[ -x "$build/bin/$s" ]] || { echo "SKIP: $build/bin/$s not built; demo not run"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
MEMSNAP_DEMO_OUT="$work/out" "$src/scripts/demo.sh" "$build" >"$work/said" 2>&1 || {
  echo "FAIL: demo.sh exited with $?"; cat "$work/said"; exit 1; }
cat "$work/said"
lines=$(wc -l <"$work/said")
if (( lines > 24 )); then echo "FAIL: $lines lines (at most 24)"; fail=1; fi
for w in basic train record replay explain; do
  grep -q "^  $w " "$work/said" || { echo "FAIL: no line for the step '$w'"; fail=1; }
done
grep -q "^memsnap demo: made in $work/out/\$" "$work/said" || { echo "FAIL: no 'made in'"; fail=1; }
# the last lines: what to open, each an existing file
tail -n 7 "$work/said" | head -n 1 | grep -qx "open in a browser:" || {
  echo "FAIL: 'open in a browser:' is not followed by the six files to open"; fail=1; }
while read -r path _; do
  [[ -s "$path" ]] || { echo "FAIL: '$path' is listed to open but was not made"; fail=1; }
done < <(tail -n 6 "$work/said")
# the files of the 'made' list
for f in basic.txt train-summary.txt train-summary-max-split-64.txt record.txt step-2.msgpack \
  step-5.msgpack oom-stats.txt oom-replay.txt stats.txt trace.txt compare.txt; do
  [[ -s "$work/out/$f" ]] || { echo "FAIL: $f was not made"; fail=1; }
done
# compare explains the difference; the segment lists moved behind --segments (issue #28)
grep -q "^  peak reserved " "$work/out/compare.txt" || { echo "FAIL: compare.txt has no totals"; fail=1; }
grep -q "^only_before = \[" "$work/out/compare-segments.txt" || {
  echo "FAIL: compare-segments.txt has no segment lists"; fail=1; }
# the demo's step 2 and step 5 at their ends, exactly: only the cache grew (issue #28's first
# reading): 4 segments and 8 MiB more reserved, the same allocated bytes by every source
m="$build/bin/memsnap" s2="$work/out/step-2.msgpack" s5="$work/out/step-5.msgpack"
"$m" compare "$s2" "$s5" --at end --json >"$work/cmp.json"
grep -q '"change": {"peak_allocated": 0, "peak_reserved": 8388608, "peak_requested": 0, "allocated": 0, "reserved": 8388608, "segments": 4, "blocks": 0}' "$work/cmp.json" || {
  echo "FAIL: compare step-2 step-5: not the known change"; cat "$work/cmp.json"; fail=1; }
grep -q '"segments": 34, "blocks": 32, "capacity": 4294967296}, "after": {' "$work/cmp.json" || {
  echo "FAIL: compare step-2 step-5: BEFORE's segments and blocks"; fail=1; }
grep -q '"sources_changed": 0, "by_source": \[\], "settings_same": 9, "settings": \[\]' "$work/cmp.json" || {
  echo "FAIL: compare step-2 step-5: a source or a setting changed"; fail=1; }
# the gate on them: reserved grew by 8 MiB (0.68%): +1% holds, +0.5% breaks (exit 1); the fresh
# replay of step 5 needs no more than step 2's
"$m" check "$s5" --baseline "$s2" --limit 'peak_reserved<=+1%' >/dev/null || {
  echo "FAIL: check +1% does not hold"; fail=1; }
set +e
"$m" check "$s5" --baseline "$s2" --limit 'peak_reserved<=+0.5%' >"$work/check.txt"; rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q '^FAIL peak_reserved: 1239416832 B, limit 1237183365 B (peak_reserved<=+0.5%, baseline 1.1GiB)' "$work/check.txt" || {
  echo "FAIL: check +0.5% exited $rc"; cat "$work/check.txt"; fail=1; }
# the OOM snapshot replays on the device it ran out of (issue #16 item 16)
grep -q "capacity 4.0GiB (recorded in the snapshot)" "$work/out/oom-replay.txt" || {
  echo "FAIL: the OOM replay does not use the recorded capacity"; fail=1; }
# the OOM explained: the verdict, the recorded capacity, and the remedies replayed (issue #26)
grep -q "^capacity:  4.0GiB (recorded in the snapshot)" "$work/out/oom-explain.txt" || {
  echo "FAIL: explain does not use the recorded capacity"; fail=1; }
grep -q "^verdict:   full: " "$work/out/oom-explain.txt" || {
  echo "FAIL: explain's verdict on the demo's OOM is not 'full'"; cat "$work/out/oom-explain.txt"; fail=1; }
grep -q "^  expandable_segments:True  *no " "$work/out/oom-explain.txt" || {
  echo "FAIL: explain did not replay expandable_segments:True"; fail=1; }
[[ $fail -eq 0 ]] && echo "ok: demo"
exit "$fail"
