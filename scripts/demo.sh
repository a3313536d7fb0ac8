#!/usr/bin/env bash
# memsnap demo (make demo): runs the samples on the simulated device and writes what they produce
# into out/. A plain sequential list of steps; later steps append to it.
# usage: scripts/demo.sh BUILD
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
out=out
mkdir -p "$out"
bin="$build/bin"

step() { printf '\n== %s\n' "$*" >&2; }

step "basic: one allocator on the sim device, a cache hit, the statistics"
"$bin/basic" | tee "$out/basic.txt"

step "train: a training-like loop (weights, drifting activations, optimizer state, a comm stream)"
"$bin/train" --steps 20 | tee "$out/train-summary.txt"

step "train again with max_split_size_mb:64 (compare the reserved memory)"
"$bin/train" --steps 20 --conf max_split_size_mb:64 | tee "$out/train-summary-max-split-64.txt"

step "record: allocation history with stacks, snapshots at steps 2 and 5, then a batch too big for the device (the OOM observer writes a snapshot)"
rm -f "$out"/oom-*.msgpack
"$bin/record" "$out" --steps 6 --snapshot-at 2,5 | tee "$out/record.txt"
oom=$(ls "$out"/oom-*-dev0-0.msgpack)
"$bin/memsnap" stats "$oom" > "$out/oom-stats.txt"
"$bin/memsnap" memory "$oom" -o "$out/oom-memory.svg"
"$bin/memsnap" compare "$out/step-2.msgpack" "$out/step-5.msgpack" --stacks -o "$out/step-2-vs-5.svg"

step "memsnap's snapshot commands on the step-5 snapshot: stats (with memory_summary), trace, memory and segments flame graphs, and step 2 vs 5 (segment diff; --stacks is step-2-vs-5.svg above)"
snap5="$out/step-5.msgpack" snap2="$out/step-2.msgpack"
if [[ -f "$snap2" && -f "$snap5" ]]; then
  "$bin/memsnap" stats "$snap5" --summary > "$out/stats.txt"
  "$bin/memsnap" trace "$snap5" > "$out/trace.txt"
  "$bin/memsnap" memory "$snap5" -o "$out/memory.svg"
  "$bin/memsnap" segments "$snap5" -o "$out/segments.svg"
  "$bin/memsnap" compare "$snap2" "$snap5" -o "$out/compare.svg" > "$out/compare.txt"
  head -n 12 "$out/stats.txt" >&2
  for f in stats.txt trace.txt memory.svg segments.svg compare.txt compare.svg step-2-vs-5.svg; do
    printf '  %s/%s\n' "$out" "$f" >&2
  done
else
  echo "memsnap demo: no step snapshots in $out/ (the record sample did not write them)" >&2
fi

printf '\nmemsnap demo: outputs in %s/\n' "$out" >&2
