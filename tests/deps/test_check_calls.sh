#!/bin/sh
# SPDX-License-Identifier: MIT
# scripts/check-calls.py fails on two files that call each other, naming both, and passes a
# chain of calls that points one way.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
script="$here/../../scripts/check-calls.py"
work=$(mktemp -d "${TMPDIR:-/tmp}/memsnap-calls-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/ok" "$work/bad"
printf 'int low(void);\nint high(void) { return low(); }\n' >"$work/high.c"
printf 'int low(void) { return 1; }\n' >"$work/low.c"
printf 'int high(void);\nint low(void) { return high() - 1; }\n' >"$work/lowbad.c"
${CC:-cc} -c "$work/high.c" -o "$work/ok/high.c.o"
${CC:-cc} -c "$work/low.c" -o "$work/ok/low.c.o"
python3 "$script" "$work/ok" || { echo "FAIL: a one-way chain was refused"; exit 1; }
cp "$work/ok/high.c.o" "$work/bad/high.c.o"
${CC:-cc} -c "$work/lowbad.c" -o "$work/bad/lowbad.c.o"
set +e
out=$(python3 "$script" "$work/bad")
rc=$?
set -e
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: exit $rc on a circle, expected 1"; exit 1; }
echo "$out" | grep -qF "a circle of calls between high.c, lowbad.c: high.c -> lowbad.c; lowbad.c -> high.c" ||
  { echo "FAIL: the circle is not named"; exit 1; }
echo PASS
