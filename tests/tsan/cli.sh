#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tsan_cli: `memsnap compare` and `memsnap check --baseline` reading their two files at once
# (--jobs 2: each on a thread, its messages held and printed in the files' order), with the
# snapshot cache on and off, on PyTorch pickles that compare cleanly, with warnings and with
# errors on either side, and check's replays on two threads; and the same output with --jobs 1.
# Built with TSan (make test TSAN=1), a data race makes memsnap exit 66 and print a report, which
# fails the test; in other builds it checks the output alone.
# Usage: cli.sh MEMSNAP FIXTURES_DIR ($MEMSNAP_TORCH_FIXTURES first; without the fixtures it
# exits 77, a skip)
set -euo pipefail
memsnap=$1
fx=${MEMSNAP_TORCH_FIXTURES:-${2:-}}
if [[ -z "$fx" || ! -f "$fx/a0kuma_adamw_small.pickle" || ! -f "$fx/cranberrii_ftcourse.pickle" ||
      ! -f "$fx/jogregoire_diffusion_tiny.pickle" ]]; then
  echo "SKIP: PyTorch fixtures not found (MEMSNAP_TORCH_FIXTURES, or ../shared/fixtures/torch)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '\x80\x02not a pickle' > "$work/bad.pickle"
a=$fx/a0kuma_adamw_small.pickle
b=$fx/cranberrii_ftcourse.pickle
bare=$fx/jogregoire_diffusion_tiny.pickle
fail=0
run() { # command expected-rc args...
  local cmd=$1 want=$2 rc
  shift 2
  for jobs in 2 1; do
    rc=0
    XDG_CACHE_HOME=$work/cache "$memsnap" "$cmd" "$@" --jobs $jobs > "$work/out$jobs" 2>&1 || rc=$?
    if [[ $rc != "$want" ]] || grep -q ThreadSanitizer "$work/out$jobs"; then
      echo "FAIL: $cmd $* --jobs $jobs: exit $rc (want $want)"
      cat "$work/out$jobs"
      fail=1
    fi
  done
  if ! cmp -s "$work/out1" "$work/out2"; then
    echo "FAIL: $cmd $*: --jobs 1 and --jobs 2 differ"
    diff "$work/out1" "$work/out2" || true
    fail=1
  fi
}
run compare 0 --no-cache "$a" "$b"
run compare 0 --no-cache "$b" "$bare" --json
run compare 1 --no-cache "$work/bad.pickle" "$a"
run compare 1 --no-cache "$a" "$work/bad.pickle"
run compare 1 --no-cache "$work/bad.pickle" "$work/missing.pickle"
run compare 1 --no-cache "$a" "$b" --device 5
run compare 0 "$a" "$b" -n 3   # through the cache: both read and stored at once, then one answer
run compare 0 "$a" "$b" -n 4   # snapshots and indexes from the cache
run compare 0 --no-cache "$a" "$b" --stacks --folded --at peak
run compare 0 "$a" "$b" --segments --json
run check 1 --no-cache "$b" --baseline "$a" --limit 'peak_reserved<=+0%' --replay
run check 0 --no-cache "$b" --baseline "$a" --limit 'ooms<=+0'
run check 1 --no-cache "$work/bad.pickle" --baseline "$a" --limit 'ooms<=+0'
exit $fail
