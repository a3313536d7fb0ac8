#!/bin/sh
# SPDX-License-Identifier: MIT
# The README's C example, compiled and run as a reader would copy it (issue #32 item 12): the
# first ```c block of README.md, built against this build tree, must exit 0 on any machine, and
# without a GPU say that it goes on with the simulated device; the snapshot it dumps must read.
#   tests/readme/run.sh SRC BUILD
set -eu
src=$1 build=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/memsnap-readme-XXXXXX")
trap 'rm -rf "$work"' EXIT
awk '/^```c$/ && !done { on = 1; next } /^```$/ && on { on = 0; done = 1 } on' "$src/README.md" >"$work/app.c"
test -s "$work/app.c" || { echo "FAIL: no \`\`\`c block in README.md"; exit 1; }
# MS_README_CFLAGS: the sanitizer of a sanitizer build (tests/CMakeLists.txt), whose library needs it
# shellcheck disable=SC2086
${CC:-cc} -std=c11 -Wall -Wextra -Werror ${MS_README_CFLAGS:-} -I"$src/include" -I"$build/include" "$work/app.c" \
  -L"$build/lib" -lmemsnap_core -Wl,-rpath,"$build/lib" -o "$work/app"
cd "$work"
set +e
./app >out.txt 2>err.txt
rc=$?
set -e
cat out.txt err.txt
[ "$rc" -eq 0 ] || { echo "FAIL: the README's example exited $rc"; exit 1; }
if ! ls /dev/nvidia0 >/dev/null 2>&1; then
  grep -q '^no CUDA device (.*): using the simulated device$' err.txt ||
    { echo "FAIL: without a GPU the example must say that it uses the simulated device"; exit 1; }
fi
grep -qx 'wrote now.msgpack: try memsnap stats now.msgpack' out.txt ||
  { echo "FAIL: the example did not write its snapshot"; exit 1; }
"$build/bin/memsnap" stats now.msgpack >/dev/null || { echo "FAIL: now.msgpack does not read"; exit 1; }
echo "PASS: the README's C example builds, runs and writes a snapshot that reads"
