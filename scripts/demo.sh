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

printf '\nmemsnap demo: outputs in %s/\n' "$out" >&2
