#!/usr/bin/env bash
# A profile-guided release tree (docs/performance.md "Release builds"; make bench and make wheel):
#   1. configure BUILD with MS_PGO=GENERATE (cmake/pgo.cmake) and the CMAKE_ARGs, forget the counts
#      of an earlier training, build the command instrumented;
#   2. train it (scripts/pgo-train.sh: the user's commands on PyTorch's own snapshots);
#   3. configure BUILD with MS_PGO=USE and build the TARGETs (default: all) from those counts.
# Without snapshots to train on, or with a compiler other than GCC, BUILD is a plain release tree
# (MS_PGO=OFF), and the script says so.
#
# usage: scripts/pgo-build.sh BUILD [CMAKE_ARG...] [-- TARGET...]      (JOBS: parallel jobs)
set -euo pipefail
build=${1:?usage: pgo-build.sh BUILD [CMAKE_ARG...] [-- TARGET...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
cmake=${CMAKE:-cmake}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
args=()
while [[ $# -gt 0 && $1 != -- ]]; do
  args+=("$1")
  shift
done
[[ $# -gt 0 ]] && shift
targets=()
for t in "$@"; do targets+=(--target "$t"); done

plain() {
  echo "memsnap pgo: $1: a release tree without a profile" >&2
  "$cmake" -S "$root" -B "$build" "${args[@]}" -DMS_PGO=OFF >/dev/null
  "$cmake" --build "$build" -j "$jobs" "${targets[@]}"
}

"$cmake" -S "$root" -B "$build" "${args[@]}" -DMS_PGO=GENERATE
# cmake/pgo.cmake instruments with GCC only (it warns and adds nothing with another compiler)
if ! grep -qs 'fprofile-generate' "$build/compile_commands.json"; then
  plain "the compiler is not GCC"
  exit 0
fi
find "$build" -name '*.gcda' -delete
"$cmake" --build "$build" -j "$jobs" --target memsnap
rc=0
"$root/scripts/pgo-train.sh" "$build/bin/memsnap" || rc=$?
if [[ $rc -eq 77 ]]; then
  plain "nothing to train on"
  exit 0
fi
[[ $rc -eq 0 ]] || exit "$rc"
"$cmake" -S "$root" -B "$build" -DMS_PGO=USE >/dev/null
"$cmake" --build "$build" -j "$jobs" "${targets[@]}"
echo "memsnap pgo: $build built from the training's profile" >&2
