#!/usr/bin/env bash
# memsnap on a machine without CUDA (issue #16 item 15): nothing links libcudart, the CLI and the
# sim backend start where no CUDA runtime can be found, and asking for the cuda backend there says
# so. "No CUDA" is made two ways: LD_LIBRARY_PATH naming an empty directory, and the dynamic loader
# run with --inhibit-cache (so that only the default system directories are searched: a runtime
# registered through ld.so.conf, as /usr/local/cuda's is, is not found).
# usage: run.sh MEMSNAP LIBDIR SNAPSHOT [SAMPLE_BASIC CUDART_SONAME]
#   SAMPLE_BASIC: samples/basic.c built against libmemsnap_core.a; CUDART_SONAME: the runtime the
#   cuda backend loads (empty when memsnap was built without the cuda backend)
set -euo pipefail
memsnap=$1 libdir=$2 snap=$3 basic=${4:-} soname=${5:-}
fail() { echo "cli_without_cuda: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/empty"

for f in "$memsnap" "$libdir/libmemsnap_core.so.0" "$libdir/libmemsnap_viz.so.0" ${basic:+"$basic"}; do
  if readelf -d "$f" | grep -q 'NEEDED.*libcudart'; then fail "$f needs libcudart"; fi
  if ldd "$f" | grep -q libcudart; then fail "$f loads libcudart: $(ldd "$f" | grep libcudart)"; fi
done

interp=$(readelf -l "$memsnap" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
[[ -x $interp ]] || fail "no program interpreter for $memsnap"
nocuda_env() { env LD_LIBRARY_PATH="$tmp/empty" "$@"; }
nocuda_ld() { "$interp" --inhibit-cache --library-path "$tmp/empty" "$@"; }

expected=$("$memsnap" stats "$snap") || fail "memsnap stats failed"
for how in nocuda_env nocuda_ld; do
  out=$($how "$memsnap" stats "$snap") || fail "$how: memsnap stats failed"
  [[ $out == "$expected" ]] || fail "$how: memsnap stats printed something else:"$'\n'"$out"
done
echo "cli_without_cuda: memsnap stats runs without a CUDA runtime"

if [[ -n $basic ]]; then
  for how in nocuda_env nocuda_ld; do
    $how "$basic" sim >"$tmp/out" 2>&1 || fail "$how: the sim backend failed: $(cat "$tmp/out")"
  done
  if [[ -n $soname ]]; then
    # the runtime cannot be found: the cuda backend says so (exit 1, the sample's prefix)
    rc=0
    nocuda_ld "$basic" cuda >"$tmp/out" 2>&1 || rc=$?
    want="basic: error: cuda backend: cannot load the CUDA runtime ($soname): $soname: cannot open shared object file: No such file or directory"
    [[ $rc == 1 && $(cat "$tmp/out") == "$want" ]] || fail "cuda without a runtime: rc $rc:"$'\n'"$(cat "$tmp/out")"
    rc=0
    MEMSNAP_CUDART=/nonexistent "$basic" cuda >"$tmp/out" 2>&1 || rc=$?
    want="basic: error: cuda backend: cannot load the CUDA runtime (/nonexistent): /nonexistent: cannot open shared object file: No such file or directory"
    [[ $rc == 1 && $(cat "$tmp/out") == "$want" ]] || fail "MEMSNAP_CUDART=/nonexistent: rc $rc:"$'\n'"$(cat "$tmp/out")"
    echo "cli_without_cuda: the cuda backend reports the missing runtime"
  fi
  echo "cli_without_cuda: the sim backend runs without a CUDA runtime"
fi
