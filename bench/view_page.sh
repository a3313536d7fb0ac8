#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Opens a page written by `memsnap view` in headless Chromium and prints what bench_view reports:
#   first_paint_ms zoom_frame_ms heap_mb
# first paint: from navigation to the page's first drawing (its data read and inflated, the
# memory timeline drawn); zoom frame: the median drawing time over a scripted sequence of 12 zooms
# in on the peak, 12 pans and 12 zooms out; heap: the tab's JavaScript heap after that
# (performance.memory). Prints nothing and exits 77 without chromium.
# usage: view_page.sh PAGE.html
set -euo pipefail
page=$1
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n "$chromium" ]] || exit 77
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/perf.js" <<'JS'
window.memsnapView.whenReady.then(function () {
  var api = window.memsnapView, v = api.view, TL = api.timeline, times = [], i;
  if (v.zoomAt) {
    for (i = 0; i < 12; i++) { v.zoomAt(TL.peakT, 0.7); times.push(v.lastFrameMs); }
    for (i = 0; i < 12; i++) {
      document.dispatchEvent(new KeyboardEvent("keydown", { key: i % 2 ? "ArrowLeft" : "ArrowRight" }));
      times.push(v.lastFrameMs);
    }
    for (i = 0; i < 12; i++) { v.zoomAt(TL.peakT, 1 / 0.7); times.push(v.lastFrameMs); }
  }
  times.sort(function (a, b) { return a - b; });
  document.body.setAttribute("data-perf", [api.readyMs, times.length ? times[times.length >> 1] : 0,
    performance.memory ? performance.memory.usedJSHeapSize / 1048576 : 0].join(" "));
});
JS
# the page ends with "</body>" and "</html>" lines: insert the script before them (streaming;
# awk is slow on the page's one very long line)
{ head -n -2 "$page"; echo "<script>"; cat "$work/perf.js"; printf '</script>\n</body>\n</html>\n'; } >"$work/p.html"
timeout 600 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage \
  --user-data-dir="$work/profile" --window-size=1200,900 --enable-precise-memory-info \
  --virtual-time-budget=5000 --dump-dom "file://$work/p.html" 2>/dev/null |
  tr '\n' ' ' | grep -o 'data-perf="[^"]*"' | head -1 | sed 's/data-perf="//; s/"$//'
