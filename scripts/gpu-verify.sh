#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu-verify: every check of the cuda backend that needs a real NVIDIA GPU (issue #15), run in one
# go, with a report of exactly what ran, on which GPU and driver, and the figures measured.
#
# usage: scripts/gpu-verify.sh [--build DIR] [--out DIR] [--cuda-arch LIST] [--quick]
#   --build DIR       the CUDA build tree to create/use (default build-gpu)
#   --out DIR         where the report, the logs and the snapshots go (default DIR-of-build/verify)
#   --cuda-arch LIST  CMAKE_CUDA_ARCHITECTURES (default native: the GPUs of this machine)
#   --quick           smaller runs (stress ops, training steps); the report says so
#
# Steps (each PASS or FAIL, none ever skipped; docs/gpu.md explains each):
#   env          GPU(s), driver, CUDA toolkit, compute-sanitizer, commit
#   build        cmake -DMEMSNAP_WITH_CUDA=ON -DMS_DEBUG=3 -DCMAKE_CUDA_ARCHITECTURES=<arch>
#   suite        the whole ctest suite of that build with MEMSNAP_REQUIRE_GPU=1: the GPU tests
#                cannot skip (a skip or a failure fails the step)
#   gpu-tests    tests/test_cuda --verbose alone: every test listed, no SKIP line allowed
#   memcheck-*   compute-sanitizer --tool memcheck --leak-check full on cuda_train, cuda_graph,
#                cuda_oom and cuda_stress (8 threads), and cuda_stress with expandable segments
#   racecheck-*  compute-sanitizer --tool racecheck on cuda_train, cuda_graph and cuda_stress
#   expandable   the GPU test expandable_segments_grow_shrink_unmap_remap, then cuda_train with
#                MEMSNAP_ALLOC_CONF=expandable_segments:True
#   oom          cuda_oom: a real OOM, the observer's snapshot written and readable by
#                `memsnap stats`, recovery, the snapshot after recovery
#   streams3     the GPU test allocator_record_stream_across_three_streams
#   graph        cuda_graph --replays 100 (global capture mode: a sync or free during the capture
#                fails it; the sum is checked; nothing may stay reserved at the end)
#   bench        make bench with bench_cuda required (MEMSNAP_REQUIRE_GPU=1): memsnap's cache hit
#                side by side with cudaMalloc+cudaFree and cudaMallocAsync, and the training step
#
# Exit status: 0 every step passed; 1 a step failed (the report names it, its log is kept);
# 2 usage error; 3 no NVIDIA GPU on this machine: nothing was verified (the report says so).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
build="build-gpu"
out=
quick=0
arch=native
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --cuda-arch) arch=${2:?--cuda-arch needs a list}; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '3,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-verify: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $out ]] || out=$build/verify
mkdir -p "$out/logs" "$out/snapshots" || { echo "gpu-verify: error: cannot create $out" >&2; exit 2; }
report=$out/report.md
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | grep -qv '^??' && echo " (with uncommitted changes)")

# ---- is there a GPU? -----------------------------------------------------------------------------
gpus=
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap \
           --format=csv,noheader 2>/dev/null)
fi
nodes=$(ls /dev/nvidia[0-9]* 2>/dev/null | tr '\n' ' ')
if [[ -z $gpus && -z $nodes ]]; then
  why="nvidia-smi $(command -v nvidia-smi >/dev/null 2>&1 && echo 'lists no GPU' || echo 'not found'), no /dev/nvidia<N>"
  {
    echo "# gpu-verify report: NOT RUN"
    echo
    echo "- started: $started, commit $commit$dirty, host $(uname -n), $(uname -sr)"
    echo "- **No NVIDIA GPU on this machine ($why). Nothing was verified; no figure was measured.**"
  } > "$report"
  echo "gpu-verify: error: no NVIDIA GPU on this machine ($why): nothing was verified" >&2
  echo "gpu-verify: wrote $report (NOT RUN)" >&2
  exit 3
fi
if [[ -z $gpus ]]; then
  echo "gpu-verify: error: device nodes $nodes exist but nvidia-smi cannot list the GPUs: the driver is not usable" >&2
  printf '# gpu-verify report: FAILED before any check\n\n- device nodes %s but nvidia-smi lists no GPU\n' \
    "$nodes" > "$report"
  exit 1
fi

export MEMSNAP_REQUIRE_GPU=1 # nothing may skip from here on (samples/cuda/gpu_present.h)
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0}
nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
bin=$build/bin
jobs=$(nproc 2>/dev/null || echo 4)
stress_ops=3000; train_steps=20; graph_replays=100
[[ $quick == 1 ]] && { stress_ops=500; train_steps=6; }

names=(); states=(); secs=(); whats=()
failed=0
# step NAME WHAT COMMAND...: runs COMMAND (a function or program), its output in logs/NAME.log.
step() {
  local name=$1 what=$2; shift 2
  local log=$out/logs/$name.log t0=$SECONDS rc
  printf '== %-22s %s\n' "$name" "$what" >&2
  "$@" > "$log" 2>&1
  rc=$?
  names+=("$name"); whats+=("$what"); secs+=($((SECONDS - t0)))
  if [[ $rc == 0 ]]; then
    states+=("PASS")
  else
    states+=("FAIL (exit $rc)"); failed=1
    echo "   FAILED (exit $rc); last lines of $log:" >&2
    tail -n 15 "$log" | sed 's/^/   | /' >&2
  fi
}

# ---- the checks -------------------------------------------------------------------------------------
do_env() {
  echo "GPUs (index, name, driver, memory, compute capability):"; echo "$gpus"
  nvidia-smi 2>&1 | head -n 15
  echo; echo "nvcc: $nvcc"; "$nvcc" --version || return 1
  echo; echo "compute-sanitizer: $sanitizer"; "$sanitizer" --version || echo "(not found)"
  echo; echo "commit $commit$dirty"; uname -a; cmake --version | head -n 1
}

do_build() {
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMS_DEBUG=3 -DMEMSNAP_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" || return 1
  cmake --build "$build" -j "$jobs" || return 1
  for p in cuda_train cuda_oom cuda_graph cuda_stress bench_cuda memsnap; do
    [[ -x $bin/$p ]] || { echo "missing $bin/$p"; return 1; }
  done
}

do_suite() {
  (cd "$build" && ctest --output-on-failure -j "$jobs") || return 1
  # The GPU suites must not have skipped (other suites may skip for their own reasons, listed).
  grep -h '^SKIP' "$build/Testing/Temporary/LastTest.log" | sort | uniq -c
  if grep -h '^SKIP' "$build/Testing/Temporary/LastTest.log" | grep -qi 'cuda\|gpu\|device'; then
    echo "a GPU test skipped on a machine with a GPU"; return 1
  fi
}

do_gpu_tests() {
  "$build/tests/test_cuda" --verbose --jobs 1 || return 1
  if grep -E '^SKIP|\[SKIP\]' "$out/logs/gpu-tests.log"; then echo "a GPU test skipped"; return 1; fi
}

# one_gpu_test NAME: runs the GPU test cuda::NAME alone; it must say [PASS] (with --filter,
# Criterion lists the other tests as "[SKIP] ...: Test is disabled", which is fine).
one_gpu_test() {
  local log
  log=$(mktemp)
  "$build/tests/test_cuda" --verbose --jobs 1 --filter "cuda/$1" > "$log" 2>&1
  local rc=$?
  cat "$log"
  if [[ $rc != 0 ]] || ! grep -q "\[PASS\] cuda::$1" "$log" || grep -q '^SKIP' "$log"; then
    rm -f "$log"; echo "cuda::$1 did not pass"; return 1
  fi
  rm -f "$log"
}

sanitize() { # TOOL PROGRAM ARGS...
  local tool=$1; shift
  [[ -x $sanitizer ]] || { echo "compute-sanitizer not found ($sanitizer): install the full CUDA Toolkit"; return 1; }
  local extra=()
  [[ $tool == memcheck ]] && extra=(--leak-check full)
  [[ $tool == racecheck ]] && extra=(--racecheck-report all)
  # API errors are not counted: the backend reads expected ones (cudaErrorNotReady from event
  # queries, cudaErrorMemoryAllocation in cuda_oom); memory and race errors are.
  "$sanitizer" --tool "$tool" "${extra[@]}" --report-api-errors no --error-exitcode 99 "$@"
}

do_memcheck_stress_es() (
  export MEMSNAP_ALLOC_CONF=expandable_segments:True
  sanitize memcheck "$bin/cuda_stress" --threads 8 --ops "$stress_ops"
)

do_expandable() {
  one_gpu_test expandable_segments_grow_shrink_unmap_remap || return 1
  MEMSNAP_ALLOC_CONF=expandable_segments:True "$bin/cuda_train" --steps "$train_steps" \
    --every "$train_steps" --out "$out/snapshots/expandable" || return 1
  "$bin/memsnap" segments "$(ls "$out"/snapshots/expandable/train-step*.msgpack | tail -n 1)" \
    -o "$out/snapshots/expandable/segments.svg"
}

do_oom() {
  local d=$out/snapshots/oom
  rm -rf "$d"; mkdir -p "$d"
  "$bin/cuda_oom" --chunk-mb 1024 --out "$d" || return 1
  local snap
  snap=$(ls "$d"/oom-*-dev0-*.msgpack 2>/dev/null | head -n 1)
  [[ -n $snap ]] || { echo "the OOM observer wrote no snapshot in $d"; return 1; }
  [[ -s $d/oom-after.msgpack ]] || { echo "no snapshot after the recovery"; return 1; }
  "$bin/memsnap" stats "$snap" || return 1
  "$bin/memsnap" memory "$snap" -o "$d/oom-memory.svg" || return 1
  "$bin/memsnap" stats "$d/oom-after.msgpack"
}

do_streams3() { one_gpu_test allocator_record_stream_across_three_streams; }

do_graph() {
  local d=$out/snapshots/graph
  rm -rf "$d"; mkdir -p "$d"
  "$bin/cuda_graph" --replays "$graph_replays" --out "$d" || return 1
  grep -q 'no leak' "$out/logs/graph.log" || return 1
  "$bin/memsnap" segments "$d/graph-pool.msgpack" -o "$d/graph-pool.svg"
}

do_bench() {
  make bench || return 1
  grep -q '"cuda_hit_pair_ns"' build/bench/results.json || { echo "bench_cuda measured nothing"; return 1; }
  python3 -c 'import json,sys; r=json.load(open("build/bench/results.json")); [print(k, r[k]) for k in sorted(r) if k.startswith("cuda_")]'
}

step env "GPU, driver, toolkit, commit" do_env
step build "configure and build with the cuda backend" do_build
if [[ ${states[-1]} == PASS ]]; then
  step suite "the whole ctest suite, GPU tests required" do_suite
  step gpu-tests "tests/test_cuda --verbose, no SKIP" do_gpu_tests
  step memcheck-train "memcheck: cuda_train" sanitize memcheck "$bin/cuda_train" --steps "$train_steps" --out "$out/snapshots/mc-train"
  step memcheck-graph "memcheck: cuda_graph" sanitize memcheck "$bin/cuda_graph" --replays 20 --out "$out/snapshots/mc-graph"
  step memcheck-oom "memcheck: cuda_oom" sanitize memcheck "$bin/cuda_oom" --chunk-mb 2048 --out "$out/snapshots/mc-oom"
  step memcheck-stress "memcheck: cuda_stress, 8 threads" sanitize memcheck "$bin/cuda_stress" --threads 8 --ops "$stress_ops"
  step memcheck-stress-es "memcheck: cuda_stress, expandable segments" do_memcheck_stress_es
  step racecheck-train "racecheck: cuda_train" sanitize racecheck "$bin/cuda_train" --steps 4 --out "$out/snapshots/rc-train"
  step racecheck-graph "racecheck: cuda_graph" sanitize racecheck "$bin/cuda_graph" --replays 10 --out "$out/snapshots/rc-graph"
  step racecheck-stress "racecheck: cuda_stress, 8 threads" sanitize racecheck "$bin/cuda_stress" --threads 8 --ops $((stress_ops / 4))
  step expandable "expandable segments: grow, shrink, unmap, remap (2x, 0.5x), OOM" do_expandable
  step oom "a real OOM, the observer's snapshot, recovery" do_oom
  step streams3 "record_stream across 3 streams" do_streams3
  step graph "CUDA graph from a private pool, $graph_replays replays, no leak" do_graph
  step bench "make bench with bench_cuda" do_bench
fi

# ---- the report -------------------------------------------------------------------------------------
{
  if [[ $failed == 0 ]]; then echo "# gpu-verify report: PASSED"; else echo "# gpu-verify report: FAILED"; fi
  echo
  echo "- started $started, finished $(date -u +%Y-%m-%dT%H:%M:%SZ)$([[ $quick == 1 ]] && echo ', --quick')"
  echo "- commit $commit$dirty, host $(uname -n), $(uname -sr)"
  echo "- GPUs (index, name, driver, memory, compute capability):"
  echo "$gpus" | sed 's/^/  - /'
  echo "- toolkit: $("$nvcc" --version 2>/dev/null | tail -n 1)"
  echo "- compute-sanitizer: $("$sanitizer" --version 2>/dev/null | tail -n 1 || echo 'not found')"
  echo
  echo "| step | result | seconds | what |"
  echo "| --- | --- | --- | --- |"
  for i in "${!names[@]}"; do
    echo "| ${names[$i]} | ${states[$i]} | ${secs[$i]} | ${whats[$i]} |"
  done
  if [[ -s build/bench/results.json && -f $out/logs/bench.log ]] && grep -q '^cuda_' "$out/logs/bench.log"; then
    echo
    echo "## bench_cuda (medians of 9 repetitions)"
    echo
    echo '```'
    grep '^cuda_' "$out/logs/bench.log"
    echo '```'
  fi
  for i in "${!names[@]}"; do
    [[ ${states[$i]} == PASS ]] && continue
    echo
    echo "## ${names[$i]}: last lines of logs/${names[$i]}.log"
    echo
    echo '```'
    tail -n 40 "$out/logs/${names[$i]}.log"
    echo '```'
  done
  echo
  echo "Logs: $out/logs/; snapshots: $out/snapshots/."
} > "$report"
echo "gpu-verify: wrote $report" >&2
[[ $failed == 0 ]] || { echo "gpu-verify: error: some checks failed (see $report)" >&2; exit 1; }
echo "gpu-verify: every check passed" >&2
