#!/usr/bin/env bash
# Builds every libFuzzer target tests/fuzz/fuzz_*.c with clang (-fsanitize=fuzzer,address,undefined)
# into build-fuzz/ and runs each for SECONDS, seeded with the PyTorch fixtures (copied into a
# temporary corpus directory, never into the project). Exit status 0 when no target found a crash.
#
# usage: scripts/fuzz.sh [SECONDS]        (make fuzz FUZZ_SECONDS=N)
#
# memsnap_core is built once with clang and the sanitizers (CMake, in build-fuzz/core); each
# target links against it. Extra seed files for a target may live in tests/fuzz/corpus/<target>/.
# Environment: MS_FUZZ_BUILD (build directory, default build-fuzz), FUZZ_CC (default clang),
# MEMSNAP_TORCH_FIXTURES (seed corpus, default ../shared/fixtures/torch).
set -euo pipefail
secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${MS_FUZZ_BUILD:-$root/build-fuzz}
CC=${FUZZ_CC:-clang}
fixtures=${MEMSNAP_TORCH_FIXTURES:-$root/../shared/fixtures/torch}
command -v "$CC" >/dev/null || { echo "memsnap: error: $CC not found (apt-get install clang)" >&2; exit 1; }
shopt -s nullglob
targets=("$root"/tests/fuzz/fuzz_*.c)
[[ ${#targets[@]} -gt 0 ]] || { echo "memsnap: error: no fuzz targets in tests/fuzz" >&2; exit 1; }
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

mkdir -p "$out"
echo "== building memsnap_core with $CC and sanitizers (build-fuzz)" >&2
cmake -S "$root" -B "$out/core" -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=Debug -DMS_DEBUG=3 \
  -DCMAKE_C_FLAGS="-O1 -g -fsanitize=fuzzer-no-link $san" -DMS_BUILD_TESTS=OFF \
  -DMS_BUILD_SAMPLES=OFF -DMS_BUILD_BENCH=OFF -DMEMSNAP_WITH_CUDA=OFF -DMEMSNAP_WITH_LIBDW=OFF \
  >"$out/cmake.log" 2>&1 || { cat "$out/cmake.log" >&2; exit 1; }
cmake --build "$out/core" -j "$(nproc 2>/dev/null || echo 2)" --target memsnap_core >"$out/build.log" 2>&1 ||
  { tail -n 40 "$out/build.log" >&2; exit 1; }
lib="$out/core/lib/libmemsnap_core.a"
msgpack_libs=$(pkg-config --libs msgpack-c 2>/dev/null || pkg-config --libs msgpack)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/memsnap-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
status=0
for src in "${targets[@]}"; do
  name=$(basename "$src" .c)
  echo "== building $name" >&2
  # shellcheck disable=SC2086
  "$CC" -std=c11 -D_GNU_SOURCE -DMS_DEBUG=3 -g -O1 -fsanitize=fuzzer $san \
    -I"$root/include" -I"$root/lib" "$src" "$lib" $msgpack_libs -lz -lm -lpthread -o "$out/$name"
  corpus="$tmp/$name"
  mkdir -p "$corpus"
  if [[ -d $fixtures ]]; then
    cp "$fixtures"/*.pickle "$corpus"/ 2>/dev/null || true
  else
    echo "SKIP: seed fixtures not found at $fixtures (fuzzing from an empty corpus)" >&2
  fi
  if [[ -d $root/tests/fuzz/corpus/$name ]]; then cp "$root/tests/fuzz/corpus/$name"/* "$corpus"/; fi
  echo "== running $name for ${secs}s" >&2
  # Seeds longer than max_len are cut to it: short inputs keep the run fast under the sanitizers.
  if ! (cd "$tmp" && "$out/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 "$corpus" 2>&1 | tail -n 25); then
    echo "memsnap: error: fuzz target $name failed (crash inputs copied to $out/)" >&2
    cp "$tmp"/crash-* "$tmp"/timeout-* "$tmp"/oom-* "$out"/ 2>/dev/null || true
    status=1
  fi
done
exit $status
