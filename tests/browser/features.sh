#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Browser test of the viewer's views that compare and sum up (ctest "browser_features"): writes
# the pages of small snapshots worked out by hand, opens each in headless Chromium with every host
# unresolvable and an unreachable proxy, and drives it with features_test.js (inserted before
# </body>; window.FEATURE names the case):
#   - memory (view_memory.py): "Memory over time": the figures table, and the pixels of reserved,
#     allocated and reserved minus allocated where the buckets put them;
#   - diff (view_diff.py): "Compare two moments": what appeared, went away and stayed, by source
#     line, its totals, its CSV and sorting;
#   - files, file1, dir: a page of both files (named, and a directory's): the file selector, the
#     two side by side with their figures, the second file shown from the URL;
# and that no page loads anything.
# usage: features.sh MEMSNAP_BINARY   Exit 77 (ctest: skipped) without chromium/python3.
set -euo pipefail
memsnap=${1:?usage: features.sh MEMSNAP_BINARY}
memsnap=$(cd "$(dirname "$memsnap")" && pwd)/$(basename "$memsnap")
here=$(cd "$(dirname "$0")" && pwd)
chromium=${CHROMIUM:-}
if [[ -z "$chromium" ]]; then
  for c in chromium chromium-browser; do
    if command -v "$c" >/dev/null 2>&1; then chromium=$(command -v "$c"); break; fi
  done
fi
if [[ -z "$chromium" ]] || ! command -v python3 >/dev/null; then
  echo "SKIP: chromium or python3 not found (scripts/deps.sh test installs them); features test not run"
  exit 77
fi
work=$(mktemp -d)
fail=0
trap '[[ $fail -eq 0 && -z "${KEEP:-}" ]] && rm -rf "$work"' EXIT

# run NAME PAGE [FRAGMENT]: inject the test with window.FEATURE = NAME, open the page (at #FRAGMENT),
# check the verdict
run() {
  local name=$1 page=$2 t="$work/$1.test.html" dom="$work/$1.dom" frag=${3:+#$3}
  LC_ALL=C awk -v js="$here/features_test.js" -v name="$name" '
    $0 == "</body>" && !done {
      print "<script>window.FEATURE = \"" name "\";"; while ((getline l < js) > 0) print l; print "</script>"
      done = 1
    }
    { print }' "$page" >"$t"
  timeout 180 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-dev-shm-usage --user-data-dir="$work/profile-$name" --window-size=1200,900 \
    --host-resolver-rules="MAP * ~NOTFOUND" --proxy-server="127.0.0.1:9" \
    --virtual-time-budget=5000 --dump-dom "file://$t$frag" >"$dom" 2>"$dom.err" || true
  local verdict
  tr '\n' ' ' <"$dom" >"$dom.flat"
  verdict=$(grep -o '<body [^>]*>' "$dom.flat" | grep -o 'data-test="[^"]*"' | head -1 || true)
  if [[ "$verdict" == 'data-test="PASS"' ]]; then
    echo "ok: $name"
  else
    echo "FAIL: $name: ${verdict:-no verdict (the page did not run)}"; sed -n '1,5p' "$dom.err"; fail=1
  fi
}

python3 "$here/view_memory.py" "$work/memory.pickle"
"$memsnap" view "$work/memory.pickle" -o "$work/memory.html"
run memory "$work/memory.html"
python3 "$here/view_diff.py" "$work/diff.pickle"
"$memsnap" view "$work/diff.pickle" -o "$work/diff.html"
run diff "$work/diff.html"
# several files: named, and a directory's (by name: a-diff before b-memory; not the text file)
"$memsnap" view "$work/memory.pickle" "$work/diff.pickle" -o "$work/files.html"
run files "$work/files.html"
run file1 "$work/files.html" "file=1&view=memory"
mkdir "$work/ranks"
cp "$work/diff.pickle" "$work/ranks/a-diff.pickle"
cp "$work/memory.pickle" "$work/ranks/b-memory.pickle"
echo "notes" >"$work/ranks/notes.txt"
(cd "$work" && "$memsnap" view ranks/)
run dir "$work/ranks.view.html"
exit $fail
