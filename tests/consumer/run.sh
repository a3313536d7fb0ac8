#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds and runs
# tests/consumer against it with find_package(memsnap) and with pkg-config.
# usage: run.sh SOURCE_DIR BUILD_DIR [CFLAGS]   (CFLAGS: e.g. the sanitizer flags the build used)
set -euo pipefail
src=$1 build=$2 cflags=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_EXE_LINKER_FLAGS="$cflags" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer"
# pkg-config: compile the same program by hand.
PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib64/pkgconfig" \
  cc $cflags -o "$tmp/consumer-pc" "$src/tests/consumer/main.c" \
  $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib64/pkgconfig" pkg-config --define-variable=prefix="$tmp/prefix" --cflags --libs --static memsnap)
"$tmp/consumer-pc"
echo "consumer: find_package and pkg-config builds work"
