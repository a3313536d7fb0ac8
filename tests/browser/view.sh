#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Browser test of `memsnap view` (ctest suite "browser_view"): writes the page of every PyTorch
# fixture and of two hostile snapshots (markup in frame and file names and in the settings; one
# without a trace), opens each in headless Chromium with every host unresolvable and an
# unreachable proxy, and drives it with view_test.js (inserted before </body>, after the data of
# `memsnap timeline --viewer-data`):
#   - every view renders; the page's decoder reads back exactly the timeline --viewer-data data, and the
#     page's own replay (replay.js) draws the same bands;
#   - "Allocated Memory (incl. Private Pools)" on a snapshot with a private pool (view_pools.py):
#     envelope and stripes as worked out by hand; the pool and time-range selectors;
#   - stacks whose encoding needs big ranks (view_stacks.py) are read back whole;
#   - stacks (view_frames.py) without the frames PyTorch's viewer hides, unless "all frames" is
#     ticked; the flame graph draws the innermost frame of a deep stack; a right-to-left override
#     in a name is shown escaped; every axis label lies inside the canvas, each tick once;
#   - the Explain panel on every page; on a run that ran out of memory (view_oom.py) its verdict,
#     capacity, remedies and phase as worked out by hand, and the OOM marked on the timeline;
#   - a click on a band shows its size and stack; search counts match the data; typing in the
#     frame box searches in a blob: worker (the CSP allows it) and gives the same counts; the
#     pool on hover is PyTorch's for every band of view_pools.py, whose envelope is outlined;
#     the profiler's steps of view_oom.py on the axis; the top consumers add up; the peak key;
#   - what is alive at the peak as CSV and JSON matches the bands alive there;
#   - arrow keys in the Allocator State History move the selected event and the map, and the
#     last event is the snapshot's own state; a free (free_requested then at once its
#     free_completed) is one row; the free space, its largest block and the internal
#     fragmentation are the snapshot's; a block's hover gives its requested and rounded sizes;
#     the segment map zooms (canvas pixels) and takes keys; a page without a trace says why;
#   - the x axis says its unit (timesteps), the range boxes take timesteps and show the window;
#     the minimap is aligned with the plot (canvas pixels); vertical zoom;
#   - by keyboard only: named controls and regions, the focus order, the plot named by what it
#     shows, the details a live region, Down / Up pick the bands at the peak and show their
#     details, ] moves the moment; the history list is a listbox driven by keys;
#   - no name from the data runs or becomes an element; the page loads nothing and tries to load
#     nothing (no resource timing entry, no Content-Security-Policy violation);
#   - names that are not ASCII (view_hostile.py: "\u00fc", an emoji, invalid UTF-8) and a title
#     that is not show as they should; every byte value 0..255 written into the page as its
#     binary data is (view_bytes.py) comes back from the page's decoder under Chromium's
#     windows-1252 decoding;
#   - the viewer data's worst shape (view_stacked.py), past the budget, renders and says that it
#     summarized.
# usage: view.sh MEMSNAP_BINARY [FIXTURE_DIR]   Exit 77 (ctest: skipped) without chromium/python3.
set -euo pipefail
memsnap=${1:?usage: view.sh MEMSNAP_BINARY [FIXTURE_DIR]}
fixtures=${MEMSNAP_TORCH_FIXTURES:-${2:-}}
here=$(cd "$(dirname "$0")" && pwd)
chromium=${CHROMIUM:-}
if [[ -z "$chromium" ]]; then
  for c in chromium chromium-browser; do
    if command -v "$c" >/dev/null 2>&1; then chromium=$(command -v "$c"); break; fi
  done
fi
if [[ -z "$chromium" ]] || ! command -v python3 >/dev/null; then
  echo "SKIP: chromium or python3 not found (scripts/deps.sh test installs them); view test not run"
  exit 77
fi
work=$(mktemp -d)
fail=0
trap '[[ $fail -eq 0 && -z "${KEEP:-}" ]] && rm -rf "$work"' EXIT

# run NAME PAGE SNAPSHOT [JS [HTML]]: inject the expected timeline data (`memsnap timeline --viewer-data`),
# the file HTML (raw bytes) and the test, open the page, check the verdict
run() {
  local name=$1 page=$2 t="$work/$1.test.html" dom="$work/$1.dom"
  { echo "window.EXPECTED_TL = $("$memsnap" timeline "$3" --viewer-data);"
    echo "window.EXPECTED_SEG = $("$memsnap" timeline "$3" --viewer-data --segments);"; echo "${4:-}"; } >"$work/$1.expected.js"
  # (the page's binary data is raw bytes, so awk in the C locale; the lines pass unchanged)
  LC_ALL=C awk -v js="$here/view_test.js" -v ex="$work/$1.expected.js" -v html="${5:-/dev/null}" '
    $0 == "</body>" && !done {
      while ((getline l < html) > 0) print l
      print "<script>"; while ((getline l < ex) > 0) print l; while ((getline l < js) > 0) print l; print "</script>"
      done = 1
    }
    { print }' "$page" >"$t"
  timeout 180 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-dev-shm-usage --user-data-dir="$work/profile-$name" --window-size=1200,900 \
    --host-resolver-rules="MAP * ~NOTFOUND" --proxy-server="127.0.0.1:9" \
    --virtual-time-budget=5000 --dump-dom "file://$t" >"$dom" 2>"$dom.err" || true
  local verdict
  tr '\n' ' ' <"$dom" >"$dom.flat"
  verdict=$(grep -o '<body [^>]*>' "$dom.flat" | grep -o 'data-test="[^"]*"' | head -1 || true)
  if [[ "$verdict" == 'data-test="PASS"' ]]; then
    echo "ok: $name: $(grep -o '<body [^>]*>' "$dom.flat" | grep -o 'data-measure="[^"]*"' | sed 's/&quot;/"/g' | cut -c1-160)"
  else
    echo "FAIL: $name: ${verdict:-no verdict (the page did not run)}"; sed -n '1,5p' "$dom.err"; fail=1
  fi
}

python3 "$here/view_hostile.py" "$work/hostile.pickle"
python3 "$here/view_hostile.py" "$work/notrace.pickle" --no-trace
python3 "$here/view_bytes.py" "$work/bytes.html"
# the title is the file's name: not ASCII here
cp "$work/hostile.pickle" "$work/hostile-$(printf '\xc3\xbc\xf0\x9f\x98\x80').pickle"
"$memsnap" view "$work/hostile-$(printf '\xc3\xbc\xf0\x9f\x98\x80').pickle" -o "$work/hostile.html"
"$memsnap" view "$work/notrace.pickle" -o "$work/notrace.html"
run hostile "$work/hostile.html" "$work/hostile.pickle" \
  'window.EXPECT_NONASCII = "memsnap view: hostile-\u00fc\ud83d\ude00.pickle"; window.EXPECT_BYTES = true;' "$work/bytes.html"
run notrace "$work/notrace.html" "$work/notrace.pickle"
python3 "$here/view_pools.py" "$work/pools.pickle"
"$memsnap" view "$work/pools.pickle" -o "$work/pools.html"
run pools "$work/pools.html" "$work/pools.pickle" "window.EXPECT_POOLS = true;"
python3 "$here/view_oom.py" "$work/oom.pickle"
"$memsnap" view "$work/oom.pickle" -o "$work/oom.html"
run oom "$work/oom.html" "$work/oom.pickle" "window.EXPECT_OOM = true;"
python3 "$here/view_frames.py" "$work/frames.pickle"
"$memsnap" view "$work/frames.pickle" -o "$work/frames.html"
run frames "$work/frames.html" "$work/frames.pickle" "window.EXPECT_FRAMES = true;"
python3 "$here/view_stacks.py" "$work/stacks.pickle"
"$memsnap" view "$work/stacks.pickle" -o "$work/stacks.html"
run stacks "$work/stacks.html" "$work/stacks.pickle" "window.EXPECT_STACKS = true;"
# the viewer data's worst shape (view_stacked.py) past the page's budget: the page renders and
# says what it summarized, also in the pools view, which shows that timeline rather than
# replaying every allocation (issue #35 item 1; `timeline --viewer-data` refuses it, so no view_test.js)
python3 "$here/view_stacked.py" "$work/stacked.pickle" 2000 2000
"$memsnap" view "$work/stacked.pickle" -o "$work/stacked.html"
for v in timeline pools; do
  timeout 180 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-dev-shm-usage --user-data-dir="$work/profile-stacked-$v" --window-size=1200,900 \
    --host-resolver-rules="MAP * ~NOTFOUND" --proxy-server="127.0.0.1:9" --virtual-time-budget=5000 \
    --dump-dom "file://$work/stacked.html#view=$v&from=3000&to=5000" >"$work/stacked-$v.dom" 2>/dev/null || true
  if grep -q '<body data-status="ready"' "$work/stacked-$v.dom" &&
     grep -Eq 'Summarized: [0-9]+ of 4000 allocations are drawn on their own; the other [0-9]+' "$work/stacked-$v.dom"; then
    echo "ok: stacked ($v, a time range): summarized past the budget, and says so"
  else
    echo "FAIL: stacked ($v): no ready page saying it summarized"; fail=1
  fi
done
grep -q 'the Active Memory Timeline, summarized, is shown instead' "$work/stacked-pools.dom" ||
  { echo "FAIL: stacked (pools): no note that the timeline is shown instead"; fail=1; }
n=0
if [[ -n "$fixtures" && -d "$fixtures" ]]; then
  for f in "$fixtures"/*.pickle; do
    [[ -e "$f" ]] || continue
    b=$(basename "$f" .pickle)
    "$memsnap" view "$f" -o "$work/$b.html"
    run "$b" "$work/$b.html" "$f"
    n=$((n + 1))
  done
fi
[[ $n -gt 0 ]] || echo "SKIP: PyTorch fixtures not found; only the synthetic pages were tested"
exit $fail
