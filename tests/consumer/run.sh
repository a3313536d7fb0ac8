#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, MOVES the installed tree elsewhere (nothing may
# remember where it was installed), then builds and runs tests/consumer/main.c against it four
# ways: find_package(memsnap) and pkg-config, each with the shared libraries and with the static
# archives. Also checks the installed libraries (soname, exported symbols, no libcudart) and that
# the installed CLI runs from its new place without LD_LIBRARY_PATH.
# usage: run.sh SOURCE_DIR BUILD_DIR [CFLAGS]   (CFLAGS: e.g. the sanitizer flags the build used)
set -euo pipefail
src=$1 build=$2 cflags=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "consumer: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/installed" >/dev/null
mv "$tmp/installed" "$tmp/moved"
prefix=$tmp/moved
pc=$(find "$prefix" -name memsnap.pc)
[[ -f $pc ]] || fail "no memsnap.pc under $prefix"
libdir=$(dirname "$(dirname "$pc")")

# The libraries: soname and version links, only the public API exported, no CUDA runtime.
for lib in memsnap_core memsnap_viz; do
  [[ -f $libdir/lib$lib.a ]] || fail "lib$lib.a is not installed"
  [[ -L $libdir/lib$lib.so && -L $libdir/lib$lib.so.0 && -f $libdir/lib$lib.so.0.1.0 ]] ||
    fail "lib$lib.so, .so.0 -> .so.0.1.0 are not installed"
  soname=$(readelf -d "$libdir/lib$lib.so.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [[ $soname == "lib$lib.so.0" ]] || fail "lib$lib.so.0 has the soname '$soname'"
  if readelf -d "$libdir/lib$lib.so.0" | grep -q 'NEEDED.*libcudart'; then
    fail "lib$lib.so.0 needs libcudart"
  fi
  other=$(nm -D --defined-only "$libdir/lib$lib.so.0" | awk '{print $3}' | grep -v '^ms_[a-z]' || true)
  [[ -z $other ]] || fail "lib$lib.so.0 exports more than the public API: $(echo $other | head -c 300)"
  internal=$(nm -D --defined-only "$libdir/lib$lib.so.0" | awk '{print $3}' | grep '^ms__' || true)
  [[ -z $internal ]] || fail "lib$lib.so.0 exports internal functions: $(echo $internal | head -c 300)"
done
env -u LD_LIBRARY_PATH "$prefix/bin/memsnap" --version >/dev/null || fail "the moved CLI does not start"

expected="memsnap 0.1.0
sim: 1024 bytes allocated, 2097152 reserved
svg: 1000 bytes of stacks, gzip-compressed
load: NOTFOUND"
check() { # name program: runs it without LD_LIBRARY_PATH and compares its output
  local out
  out=$(env -u LD_LIBRARY_PATH "$2") || fail "$1: the program failed"
  [[ $out == "$expected" ]] || fail "$1: unexpected output:"$'\n'"$out"
  if [[ $1 == *static* ]]; then
    ! readelf -d "$2" | grep -q 'NEEDED.*libmemsnap' || fail "$1: needs a shared libmemsnap"
  else
    readelf -d "$2" | grep -q 'NEEDED.*libmemsnap_core.so.0' || fail "$1: does not need libmemsnap_core.so.0"
  fi
  echo "consumer: $1: ok"
}

# find_package(memsnap)
for kind in shared static; do
  cmake -S "$src/tests/consumer" -B "$tmp/build-$kind" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCONSUMER_STATIC=$([[ $kind == static ]] && echo ON || echo OFF) \
    -DCMAKE_C_FLAGS="$cflags" -DCMAKE_EXE_LINKER_FLAGS="$cflags" >/dev/null
  cmake --build "$tmp/build-$kind" >/dev/null
  check "find_package $kind" "$tmp/build-$kind/consumer"
done

# pkg-config: the relocatable memsnap.pc finds the moved prefix by itself (no --define-variable).
export PKG_CONFIG_PATH=$libdir/pkgconfig
[[ $(pkg-config --variable=libdir memsnap) -ef $libdir ]] || fail "pkg-config's libdir is not $libdir"
# shared: what the issue reported failing (msgpack_* undefined); an RPATH, as for any prefix
# outside the loader's path
# shellcheck disable=SC2046
cc $cflags -o "$tmp/pc-shared" "$src/tests/consumer/main.c" $(pkg-config --cflags --libs memsnap) \
  -Wl,-rpath,"$libdir"
check "pkg-config shared" "$tmp/pc-shared"
# static: --static adds Requires.private and Libs.private; -Bstatic picks the archives over the
# shared libraries next to them (the system libraries stay shared)
libs=$(pkg-config --libs-only-l --static memsnap)
libs=${libs/-lmemsnap_viz -lmemsnap_core/}
# shellcheck disable=SC2046,SC2086
cc $cflags -o "$tmp/pc-static" "$src/tests/consumer/main.c" $(pkg-config --cflags memsnap) \
  $(pkg-config --libs-only-L --static memsnap) -Wl,-Bstatic -lmemsnap_viz -lmemsnap_core \
  -Wl,-Bdynamic $libs
check "pkg-config static" "$tmp/pc-static"
echo "consumer: find_package and pkg-config, shared and static, from a moved prefix: ok"
