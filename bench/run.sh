#!/usr/bin/env bash
# Runs every benchmark program (BUILD/bin/bench_*) and merges what they print into one flat JSON
# object, OUTDIR/results.json, then prints a table. A benchmark prints lines "metric value" on
# stdout (anything else it prints goes to stderr). Timings are medians of repeated runs, measured
# against a baseline in the same run where the metric has one.
# usage: bench/run.sh BUILD OUTDIR
set -euo pipefail
build=$1 out=$2
mkdir -p "$out"
raw="$out/raw.txt"
: > "$raw"
shopt -s nullglob
# Figures are of first runs: the snapshot cache off (a benchmark that measures warm runs, such as
# bench_cache and bench_compare, turns it on for those and says so), and nothing from the user's
# own cache.
export MEMSNAP_CACHE=0
for b in "$build"/bin/bench_*; do
  [[ -x "$b" ]] || continue
  echo "== $(basename "$b")" >&2
  # Exit status 77: the benchmark cannot run on this machine (bench_cuda without a GPU): a
  # visible SKIP, no metrics. Any other non-zero status fails the run.
  rc=0
  MS_BENCH_OUT="$out" MEMSNAP_BIN="$build/bin/memsnap" "$b" > "$out/one.txt" || rc=$?
  if [[ $rc == 77 ]]; then
    echo "SKIP: $(basename "$b") did not run (see its message above)" >&2
    continue
  fi
  cat "$out/one.txt" >&2
  if [[ $rc != 0 ]]; then
    echo "memsnap: error: benchmark $(basename "$b") failed (exit status $rc)" >&2; exit 1
  fi
  cat "$out/one.txt" >> "$raw"
done
rm -f "$out/one.txt"
python3 - "$raw" "$out/results.json" <<'PY'
import json, sys
res = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 2:
        try:
            res[parts[0]] = float(parts[1])
        except ValueError:
            pass
json.dump(res, open(sys.argv[2], "w"), indent=1, sort_keys=True)
print(f"{'metric':34} {'value':>14}")
for k in sorted(res):
    print(f"{k:34} {res[k]:>14.6g}")
print(f"\nwrote {sys.argv[2]}")
PY
