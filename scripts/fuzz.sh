#!/usr/bin/env bash
# Builds every libFuzzer target tests/fuzz/fuzz_*.c with clang (-fsanitize=fuzzer,address,undefined)
# into build-fuzz/ and runs each for SECONDS, seeded with the target's corpus kept in the project
# (tests/fuzz/corpus/<target>/) plus the PyTorch fixtures when present (copied into a temporary
# corpus directory, never into the project). Exit status 0 when no target found a crash.
#
# usage: scripts/fuzz.sh [SECONDS [TARGET...]]     (make fuzz FUZZ_SECONDS=N [FUZZ_TARGETS="a b"])
#
# memsnap_core and memsnap_viz are built once with clang and the sanitizers (CMake, in
# build-fuzz/core); each target links against them. A target's source may say, in its header
# comment:
#   fuzz-flags: -max_len=N -dict=tests/fuzz/X.dict   extra libFuzzer flags (default -max_len=65536)
#   fuzz-link: cli                                     also link the CLI's objects (cli/*.c, its
#                                                      main renamed memsnap_cli_main)
# Environment: MS_FUZZ_BUILD (build directory, default build-fuzz), FUZZ_CC (default clang),
# MEMSNAP_TORCH_FIXTURES (extra seeds, default ../shared/fixtures/torch), MS_FUZZ_NO_FIXTURES=1
# (the project's corpus only), MS_FUZZ_BUILD_ONLY=1 (build the targets, run nothing),
# MS_FUZZ_SANITIZERS (default address,undefined; e.g. `undefined` for a long campaign that trades
# ASan's checks for about twice the executions per second: use its own MS_FUZZ_BUILD).
set -euo pipefail
secs=${1:-60}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
out=${MS_FUZZ_BUILD:-$root/build-fuzz}
CC=${FUZZ_CC:-clang}
fixtures=${MEMSNAP_TORCH_FIXTURES:-$root/../shared/fixtures/torch}
command -v "$CC" >/dev/null || { echo "memsnap: error: $CC not found (apt-get install clang)" >&2; exit 1; }
shopt -s nullglob
if [[ $# -gt 0 ]]; then
  targets=()
  for t in "$@"; do
    [[ -f $root/tests/fuzz/$t.c ]] || { echo "memsnap: error: no fuzz target tests/fuzz/$t.c" >&2; exit 1; }
    targets+=("$root/tests/fuzz/$t.c")
  done
else
  targets=("$root"/tests/fuzz/fuzz_*.c)
fi
[[ ${#targets[@]} -gt 0 ]] || { echo "memsnap: error: no fuzz targets in tests/fuzz" >&2; exit 1; }
san="-fsanitize=${MS_FUZZ_SANITIZERS:-address,undefined} -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cflags="-std=c11 -D_GNU_SOURCE -DMS_DEBUG=3 -g -O1 $san"

mkdir -p "$out"
echo "== building memsnap_core and memsnap_viz with $CC and sanitizers (build-fuzz)" >&2
cmake -S "$root" -B "$out/core" -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=Debug -DMS_DEBUG=3 \
  -DCMAKE_C_FLAGS="-O1 -g -fsanitize=fuzzer-no-link $san" -DMS_BUILD_TESTS=OFF \
  -DMS_BUILD_SAMPLES=OFF -DMS_BUILD_BENCH=OFF -DMEMSNAP_WITH_CUDA=OFF -DMEMSNAP_WITH_LIBDW=OFF \
  >"$out/cmake.log" 2>&1 || { cat "$out/cmake.log" >&2; exit 1; }
cmake --build "$out/core" -j "${JOBS:-2}" --target memsnap_core memsnap_viz >"$out/build.log" 2>&1 ||
  { tail -n 40 "$out/build.log" >&2; exit 1; }
libs="$out/core/viz/libmemsnap_viz.a $out/core/lib/libmemsnap_core.a"
ext_libs="$(pkg-config --libs msgpack-c 2>/dev/null || pkg-config --libs msgpack) \
  $(pkg-config --libs libxml-2.0) -lsqlite3 -lz -lm -lpthread -ldl"

# The CLI's objects, for targets that drive its commands (built only when one needs them).
cli_objs=()
build_cli() {
  [[ ${#cli_objs[@]} -gt 0 ]] && return 0
  mkdir -p "$out/cli"
  echo "== building the CLI's objects" >&2
  local c o extra h newest=""
  # an object is made again when its source or any header it may include changed since: a layout
  # changed in a public header must not leave the CLI's objects on the old one (they would read
  # the libraries' structs at the wrong offsets, and the fuzzer report that as a crash)
  for h in "$root"/include/memsnap/*.h "$root"/cli/*.h "$root"/lib/*/*.h "$root"/viz/*/*.h; do
    [[ -z $newest || $h -nt $newest ]] && newest=$h
  done
  for c in "$root"/cli/*.c; do
    o="$out/cli/$(basename "$c" .c).o" extra=""
    [[ $(basename "$c") == main.c ]] && extra="-Dmain=memsnap_cli_main"
    if [[ ! -f $o || $c -nt $o || $newest -nt $o ]]; then
      # shellcheck disable=SC2086
      "$CC" $cflags -fsanitize=fuzzer-no-link $extra -I"$root/include" -I"$root/cli" -c "$c" -o "$o"
    fi
    cli_objs+=("$o")
  done
}

# The value of "NAME: ..." in a target's header comment, or empty.
header_value() { sed -n "s/^ \* $2: //p" "$1" | head -n 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/memsnap-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
status=0
for src in "${targets[@]}"; do
  name=$(basename "$src" .c)
  flags=$(header_value "$src" fuzz-flags)
  link=$(header_value "$src" fuzz-link)
  [[ $flags == *-max_len=* ]] || flags="-max_len=65536 $flags"
  objs=()
  if [[ $link == *cli* ]]; then build_cli; objs=("${cli_objs[@]}"); fi
  echo "== building $name" >&2
  # shellcheck disable=SC2086
  "$CC" $cflags -fsanitize=fuzzer -I"$root/include" -I"$root/lib" "$src" "${objs[@]}" $libs \
    $ext_libs -o "$out/$name"
  [[ ${MS_FUZZ_BUILD_ONLY:-0} == 1 ]] && continue
  corpus="$tmp/$name"
  mkdir -p "$corpus"
  if [[ -d $root/tests/fuzz/corpus/$name ]]; then cp "$root/tests/fuzz/corpus/$name"/* "$corpus"/; fi
  # The readers' targets also start from the real pickles (the SVG and parser targets would only
  # cut them to noise).
  case $name in
    fuzz_pickle|fuzz_msgpack|fuzz_load|fuzz_consumers)
      if [[ ${MS_FUZZ_NO_FIXTURES:-0} != 1 && -d $fixtures ]]; then
        cp "$fixtures"/*.pickle "$corpus"/ 2>/dev/null || true
      elif [[ ${MS_FUZZ_NO_FIXTURES:-0} != 1 ]]; then
        echo "SKIP: seed fixtures not found at $fixtures (fuzzing from the project's corpus only)" >&2
      fi ;;
  esac
  echo "== running $name for ${secs}s ($flags)" >&2
  # Seeds longer than max_len are cut to it: short inputs keep the run fast under the sanitizers.
  # shellcheck disable=SC2086
  if ! (cd "$root" && "$out/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        $flags -print_final_stats=1 -artifact_prefix="$tmp/" "$corpus" 2>&1 | tail -n 25); then
    echo "memsnap: error: fuzz target $name failed (crash inputs copied to $out/)" >&2
    cp "$tmp"/crash-* "$tmp"/timeout-* "$tmp"/oom-* "$tmp"/leak-* "$out"/ 2>/dev/null || true
    status=1
  fi
done
exit $status
