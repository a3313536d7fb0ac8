#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Browser test of the flame-graph page (ctest suite "browser"): opens SVGs written by
# `memsnap flamegraph` in headless Chromium and checks, from the DOM Chromium dumps after the
# page's script ran, that
#   1. the ?x=&y=&s= URL state zooms to a frame and searches (matched bytes shown, right-aligned
#      inside the image; only the share when the bytes do not fit, as flamegraph.pl);
#   2. a click on a frame zooms it; the Search button (prompt answered by the test) finds a name
#      and Reset Zoom restores the view;
#   2b. a click on [N small frames] zooms to its parent and says so;
#   3. hostile frame names (script tags, event handlers) stay text: no script of theirs runs and
#      no element is made from them, also after hovering, zooming and searching them.
# The test drives the page with a small script it inserts into a copy of the SVG (no ChromeDriver).
# usage: run.sh MEMSNAP_BINARY      Exit 77 (ctest: skipped) with a SKIP line without chromium.
set -euo pipefail
memsnap=${1:?usage: run.sh MEMSNAP_BINARY}
chromium=${CHROMIUM:-}
if [[ -z "$chromium" ]]; then
  for c in chromium chromium-browser; do
    if command -v "$c" >/dev/null 2>&1; then chromium=$(command -v "$c"); break; fi
  done
fi
if [[ -z "$chromium" ]]; then
  echo "SKIP: chromium not found (scripts/deps.sh test installs it); browser test not run"
  exit 77
fi

work=$(mktemp -d)
fail=0
trap '[[ $fail -eq 0 ]] && rm -rf "$work"' EXIT
check() { # check NAME FILE PATTERN: the dumped DOM must match the extended regex
  if grep -Eq -- "$3" "$2"; then echo "ok: $1"; else echo "FAIL: $1 (no match for: $3)"; fail=1; fi
}
check_not() {
  if grep -Eq -- "$3" "$2"; then echo "FAIL: $1 (unexpected: $3)"; fail=1; else echo "ok: $1"; fi
}
dump() { # dump URL OUT: the DOM after load and 3 s of virtual time for timers
  local profile
  profile=$(mktemp -d "$work/profile.XXXXXX")
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-dev-shm-usage --user-data-dir="$profile" --virtual-time-budget=3000 \
    --dump-dom "$1" >"$2" 2>"$2.err" || true
  if ! grep -q '<svg' "$2"; then
    echo "FAIL: chromium produced no DOM for $1"; sed -n '1,20p' "$2.err"; fail=1
  fi
}
inject() { # inject SVG OUT SCRIPT_FILE: insert the test script before <g id="frames">
  awk -v js="$3" '
    $0 == "<g id=\"frames\">" && !done {
      print "<script type=\"text/ecmascript\"><![CDATA["
      while ((getline l < js) > 0) print l
      print "]]></script>"
      done = 1
    }
    { print }
    END { if (!done) exit 1 }' "$1" >"$2"
}

# ---- 1. URL state: zoom to "compute" and search "gemm" ----
printf '%s\n' 'main;alloc;cudaMalloc 1000' 'main;compute;gemm 3000' 'main;compute;relu 500' \
  'other 7' >"$work/a.folded"
"$memsnap" flamegraph "$work/a.folded" -o "$work/a.svg"
xy=$(grep -o '<g><title>compute [^<]*</title><rect x="[0-9.]*" y="[0-9.]*"' "$work/a.svg" |
  sed 's/.*x="\([0-9.]*\)" y="\([0-9.]*\)"/x=\1\&y=\2/')
[[ -n "$xy" ]] || { echo "FAIL: no compute frame in the SVG"; exit 1; }
dump "file://$work/a.svg?$xy&s=gemm" "$work/url.dom"
check "URL zoom: compute fills the width" "$work/url.dom" \
  '<g( class="")?><title>compute [^<]*</title><rect x="10.0" y="[0-9.]*" width="1180.0"'
check "URL zoom: ancestors dimmed" "$work/url.dom" '<g class="parent"><title>main '
check "URL zoom: other subtrees hidden" "$work/url.dom" '<g class="hide"><title>alloc '
check "URL search: match coloured" "$work/url.dom" \
  '<title>gemm [^<]*</title><rect [^>]*fill="rgb\(230,0,230\)"'
check "URL search: matched bytes shown" "$work/url.dom" \
  'id="matched"[^>]*>Matched: 2.9 KiB, 3,000 bytes, 66.56%<'
check "URL search: matched line right-aligned inside the image" "$work/url.dom" \
  'id="matched"[^>]* x="1190.00"[^>]* text-anchor="end"'
# a narrow image: the bytes do not fit in half of it, the share alone is shown (issue #16)
"$memsnap" flamegraph "$work/a.folded" -o "$work/narrow.svg" --width 300
dump "file://$work/narrow.svg?s=gemm" "$work/narrow.dom"
check "narrow image: matched share only" "$work/narrow.dom" 'id="matched"[^>]*>Matched: 66.56%<'

# ---- 2. clicks: zoom on a frame, search through the button, reset ----
cat >"$work/click.js" <<'JS'
window.addEventListener("load", function () {
  setTimeout(function () {
    var root = document.documentElement, gs = document.getElementById("frames").children;
    function frame(name) {
      for (var i = 0; i < gs.length; i++)
        if (gs[i].getElementsByTagName("title")[0].textContent.indexOf(name + " (") === 0)
          return gs[i];
      return null;
    }
    function click(el) { el.dispatchEvent(new MouseEvent("click", {bubbles: true})); }
    var relu = frame("relu");
    click(relu.getElementsByTagName("rect")[0]);
    var rect = relu.getElementsByTagName("rect")[0];
    root.setAttribute("data-t-relu-width", rect.getAttribute("width"));
    root.setAttribute("data-t-gemm-class", frame("gemm").getAttribute("class"));
    var unzoom = document.getElementById("unzoom");
    root.setAttribute("data-t-unzoom-class", unzoom.getAttribute("class"));
    root.setAttribute("data-t-url", location.search);
    window.prompt = function () { return "^cuda"; };
    click(document.getElementById("search"));
    root.setAttribute("data-t-matched", document.getElementById("matched").textContent);
    click(document.getElementById("unzoom"));
    root.setAttribute("data-t-reset-width", rect.getAttribute("width"));
    root.setAttribute("data-t-done", "1");
  }, 10);
});
JS
inject "$work/a.svg" "$work/click.svg" "$work/click.js"
dump "file://$work/click.svg" "$work/click.dom"
check "click: test script ran" "$work/click.dom" 'data-t-done="1"'
check "click: relu zoomed to full width" "$work/click.dom" 'data-t-relu-width="1180.0"'
check "click: sibling hidden" "$work/click.dom" 'data-t-gemm-class="hide"'
check "click: Reset Zoom shown" "$work/click.dom" 'data-t-unzoom-class=""'
check "click: zoom kept in the URL" "$work/click.dom" 'data-t-url="\?x=[0-9.]+&amp;y=[0-9.]+"'
check "search button: matched bytes" "$work/click.dom" \
  'data-t-matched="Matched: 1000 B, 1,000 bytes, 22.19%"'
check "Reset Zoom: original width back" "$work/click.dom" 'data-t-reset-width="130.9"'

# ---- 2a. a search in a differential graph counts grown and shrunk bytes apart (issue #16) ----
printf '%s\n' 'main;a 1000 3000' 'main;b 2000 500' 'main;c 700 700' >"$work/d.folded"
"$memsnap" flamegraph "$work/d.folded" -o "$work/d.svg"
dump "file://$work/d.svg?s=%5E(a%7Cb)%24" "$work/d.dom"
check "diff search: grown and shrunk apart" "$work/d.dom" \
  'id="matched"[^>]*>Matched: grew 2.0 KiB, 2,000 bytes; shrank 1.5 KiB, 1,500 bytes<'

# ---- 2b. a click on [N small frames] zooms to its parent and says so (issue #16) ----
printf '%s\n' 'top;main;big 100000' 'top;main;tiny1 1' 'top;main;tiny2 1' 'top;other 50000' \
  >"$work/s.folded"
"$memsnap" flamegraph "$work/s.folded" -o "$work/s.svg"
cat >"$work/small.js" <<'JS'
window.addEventListener("load", function () {
  setTimeout(function () {
    var root = document.documentElement, gs = document.getElementById("frames").children;
    function frame(name) {
      for (var i = 0; i < gs.length; i++)
        if (gs[i].getElementsByTagName("title")[0].textContent.indexOf(name + " (") === 0)
          return gs[i];
      return null;
    }
    var small = document.querySelector("#frames g.small");
    root.setAttribute("data-t-small", small ? "1" : "0");
    small.getElementsByTagName("rect")[0].dispatchEvent(new MouseEvent("click", {bubbles: true}));
    root.setAttribute("data-t-main-width", frame("main").getElementsByTagName("rect")[0].getAttribute("width"));
    root.setAttribute("data-t-other-class", frame("other").getAttribute("class"));
    root.setAttribute("data-t-details", document.getElementById("details").textContent);
    root.setAttribute("data-t-done", "1");
  }, 10);
});
JS
inject "$work/s.svg" "$work/small.svg" "$work/small.js"
dump "file://$work/small.svg" "$work/small.dom"
check "small frames: test script ran" "$work/small.dom" 'data-t-done="1"'
check "small frames: the SVG has them" "$work/small.dom" 'data-t-small="1"'
check "small frames: click zooms to the parent" "$work/small.dom" 'data-t-main-width="1180.0"'
check "small frames: the parent's sibling hidden" "$work/small.dom" 'data-t-other-class="hide"'
check "small frames: said so" "$work/small.dom" \
  'data-t-details="\[2 small frames\] are too narrow to draw; zoomed to their parent, main'

# ---- 3. hostile names ----
{
  echo 'top;</title><script>document.documentElement.setAttribute("data-pwned","1")</script> 100'
  echo 'top;<img src=x onerror="document.documentElement.setAttribute(`data-pwned`,2)"> 200'
  echo "top;\"'><svg onload=alert(3)>&amp; 300"
  echo 'top;]]><script>alert(4)</script> 400'
} >"$work/h.folded"
"$memsnap" flamegraph "$work/h.folded" -o "$work/h.svg" --title '<script>alert(5)</script>'
cat >"$work/hostile.js" <<'JS'
window.alert = function (m) { document.documentElement.setAttribute("data-pwned", "alert " + m); };
window.addEventListener("load", function () {
  setTimeout(function () {
    var root = document.documentElement, gs = document.getElementById("frames").children;
    for (var i = 0; i < gs.length; i++) {
      var r = gs[i].getElementsByTagName("rect")[0];
      r.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
      r.dispatchEvent(new MouseEvent("click", {bubbles: true}));
    }
    window.prompt = function () { return "script|img|svg"; };
    document.getElementById("search").dispatchEvent(new MouseEvent("click", {bubbles: true}));
    root.setAttribute("data-t-scripts", document.getElementsByTagName("script").length);
    root.setAttribute("data-t-imgs", document.getElementsByTagName("img").length);
    root.setAttribute("data-t-svgs", document.getElementsByTagName("svg").length);
    root.setAttribute("data-t-matched", document.getElementById("matched").textContent);
    root.setAttribute("data-t-done", "1");
  }, 10);
});
JS
inject "$work/h.svg" "$work/hostile.svg" "$work/hostile.js"
dump "file://$work/hostile.svg" "$work/hostile.dom"
check "hostile: test script ran" "$work/hostile.dom" 'data-t-done="1"'
check_not "hostile: no script from names ran" "$work/hostile.dom" '<svg[^>]* data-pwned='
check "hostile: only the page's and the test's scripts" "$work/hostile.dom" 'data-t-scripts="2"'
check "hostile: no element from names" "$work/hostile.dom" 'data-t-imgs="0" data-t-svgs="1"'
check "hostile: names shown as text" "$work/hostile.dom" \
  '<title>&lt;/title&gt;&lt;script&gt;document.documentElement.setAttribute'
check "hostile: title shown as text" "$work/hostile.dom" 'id="title"[^>]*>&lt;script&gt;alert'
check "hostile: searching the names works" "$work/hostile.dom" 'data-t-matched="Matched: '

if [[ $fail -ne 0 ]]; then
  echo "browser test FAILED (DOM dumps were in $work)"
  exit 1
fi
echo "browser test passed"
