#!/usr/bin/env bash
# `memsnap run` on a real GPU (issue #18; docs/gpu.md, docs/run.md): the CUDA samples and a cuBLAS
# program under both modes, a real OOM, and the overhead of --observe per cudaMalloc + cudaFree
# pair against the bare program. Prints what it checks and the figures for docs/gpu.md.
# usage: tests/run/gpu.sh [BUILD]   (BUILD: a build tree with the CUDA Toolkit, default build)
set -euo pipefail
build=${1:-build}
ms="$build/bin/memsnap"
out=$(mktemp -d /tmp/memsnap-gpu.XXXXXX)
trap 'rm -rf "$out"' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || {
  echo "SKIP: no GPU (nvidia-smi failed)"; exit 77; }
for t in run_app_cudart run_cublas; do
  [[ -x "$build/tests/run/$t" ]] || { echo "memsnap: error: $build/tests/run/$t missing (build with the CUDA Toolkit)"; exit 1; }
done
check() { echo "== $*"; "$@"; }

# 1. the samples (they use memsnap's own allocator on the cuda backend: its cudaMallocs are seen)
for s in cuda_train cuda_oom cuda_graph; do
  for mode in --observe --cache; do
    check "$ms" run $mode --quiet -o "$out/$s$mode-%n.msgpack" -- "$build/bin/$s" --out "$out/own-$s" >/dev/null
    ls "$out/$s$mode"-*.msgpack >/dev/null
    "$ms" stats "$(ls "$out/$s$mode"-*.msgpack | tail -1)" | sed -n 2,4p
  done
done
# 2. cuBLAS, both modes, and a real OOM (an OOM snapshot, and the program sees cudaErrorMemoryAllocation)
for mode in --observe --cache; do
  check "$ms" run $mode -o "$out/cublas$mode-%n.msgpack" -- "$build/tests/run/run_cublas" 2048 oom | tee "$out/cublas.out"
  grep -q "oom request: 2 (cudaErrorMemoryAllocation)" "$out/cublas.out"
  "$ms" top "$out/cublas$mode-0.msgpack" -n 5
done
# 3. the same program, same results, with and without memsnap
bare=$("$build/tests/run/run_app_cudart" threads 8 1000); under=$("$ms" run --quiet -o "$out/t-%n.msgpack" -- "$build/tests/run/run_app_cudart" threads 8 1000)
[[ "$bare" == "$under" ]] || { echo "memsnap: error: outputs differ: '$bare' vs '$under'"; exit 1; }
# 4. overhead per cudaMalloc + cudaFree pair (4 KiB), medians of 7
med() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
for v in bare nostacks fp bt; do
  for i in 1 2 3 4 5 6 7; do
    case $v in
      bare) "$build/tests/run/run_app_cudart" bench 100000 ;;
      nostacks) "$ms" run --quiet --no-stacks -o "$out/b.msgpack" -- "$build/tests/run/run_app_cudart" bench 100000 ;;
      fp) "$ms" run --quiet --unwind fp -o "$out/b.msgpack" -- "$build/tests/run/run_app_cudart" bench 100000 ;;
      bt) "$ms" run --quiet --unwind backtrace -o "$out/b.msgpack" -- "$build/tests/run/run_app_cudart" bench 100000 ;;
    esac | awk '/ns_per_pair/ {print $2}'
  done | med | sed "s/^/gpu_run_pair_ns_$v /"
done
echo "all checks passed"
