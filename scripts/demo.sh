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

printf '\nmemsnap demo: outputs in %s/\n' "$out" >&2
