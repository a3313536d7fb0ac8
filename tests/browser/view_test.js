/* SPDX-License-Identifier: MIT
 * Injected by tests/browser/view.sh after the page's own script: drives `memsnap view`'s page
 * and writes the verdict into the body's data-test attribute (PASS, or FAIL and why), measures into
 * data-measure (first paint, median zoom frame). Uses only the page's API (window.memsnapView),
 * synthetic DOM events, and the page's data elements. */
(function () {
  "use strict";
  var errors = [], measure = {}, typedSearch = null;
  /* the page reads its data asynchronously: go on once it is ready (or failed) */
  window.memsnapView.whenReady.then(run, run);
  function run() {
  function ok(name, cond, detail) { if (!cond) errors.push(name + (detail ? ": " + detail : "")); }
  var violations = [], api;
  document.addEventListener("securitypolicyviolation", function (e) { violations.push(e.blockedURI); });
  function status() { return document.body.getAttribute("data-status"); }
  function frameText(D, f) { return D.frames[f][0] + ":" + D.frames[f][1] + ":" + D.frames[f][2]; }
  function key(k) {
    document.dispatchEvent(new KeyboardEvent("keydown", { key: k, bubbles: true, cancelable: true }));
  }
  api = window.memsnapView;
  try {
    ok("ready", api && api.ready && status() === "ready", document.body.getAttribute("data-error"));
    measure.first_paint_ms = api.readyMs;
    var D = api.data, TL = api.timeline;
    ["segments", "history", "settings", "flame", "timeline"].forEach(function (v) {
      api.show(v);
      ok("view " + v + " renders", status() === "ready", document.body.getAttribute("data-error"));
    });
    /* the page's decoder reads back exactly `memsnap timeline --viewer-data` (PyTorch's data, which the
     * C tests compare with PyTorch's own output), injected by view.sh as EXPECTED_TL/SEG */
    [["tl", window.EXPECTED_TL, api.timeline], ["seg", window.EXPECTED_SEG, api.segmentTimeline]].forEach(function (x) {
      var raw = x[1], tl = x[2], pts = 0, same = true, bad = "";
      if (!raw) { errors.push(x[0] + ": no expected data"); return; }
      raw.allocations_over_time.forEach(function (s, i) {
        if (tl.first[i] !== pts && same) { same = false; bad = "first of " + i; }
        for (var k = 0; k < s.timesteps.length; k++, pts++)
          if (tl.T[tl.first[i] + k] !== s.timesteps[k] || tl.O[tl.first[i] + k] !== s.offsets[k]) { if (same) bad = "point " + k + " of " + i; same = false; }
        if (s.elem === "summarized") {
          if (tl.summ !== i || s.size.some(function (z, k) { return tl.summSizes[k] !== z; })
              || s.offsets.some(function (o, k) { return tl.summOffsets[k] !== o; })) { same = false; bad = "summarized"; }
        } else if (tl.elem[i] !== s.elem || tl.size[i] !== s.size || tl.color[i] !== s.color
                   || !!tl.ghost[i] !== !!s.ghost) { if (same) bad = "series " + i; same = false; }
      });
      ok(x[0] + " decoded series", tl.n === raw.allocations_over_time.length, tl.n + " vs " + raw.allocations_over_time.length);
      ok(x[0] + " decoded points", tl.first[tl.n] === pts && same, bad);
      ok(x[0] + " max_at_time", tl.maxAt.length === raw.max_at_time.length
        && raw.max_at_time.every(function (v, i) { return tl.maxAt[i] === v; }));
      ok(x[0] + " max_size, elements_length", tl.maxSize === raw.max_size && tl.elementsLength === raw.elements_length);
    });
    /* the page's own replay (replay.js: the pools view, the time-range selector) without pools
     * draws exactly the bands memsnap computed in C (the summarized band aside: it draws all) */
    [["tl", api.timeline], ["seg", api.segmentTimeline]].forEach(function (x) {
      var tl = x[1], r = window.memsnapReplay({ trace: D.trace, segments: D.segments, segmentsView: tl.segmentsView, pools: false });
      var n = tl.summ >= 0 ? tl.n - 1 : tl.n, same = r.n === n && r.elementsLength === tl.elementsLength, bad = "";
      for (var i = 0; i < n && same; i++) {
        if (r.elem[i] !== tl.elem[i] || r.size[i] !== tl.size[i] || r.color[i] !== tl.color[i] || !!r.ghost[i] !== !!tl.ghost[i]
            || r.first[i + 1] - r.first[i] !== tl.first[i + 1] - tl.first[i]) { same = false; bad = "series " + i; break; }
        for (var k = 0; k < r.first[i + 1] - r.first[i]; k++)
          if (r.T[r.first[i] + k] !== tl.T[tl.first[i] + k] || r.O[r.first[i] + k] !== tl.O[tl.first[i] + k]) { same = false; bad = "point " + k + " of " + i; break; }
      }
      for (i = 0; i < tl.elementsLength && same; i++) if (r.sources[i] !== tl.sources[i]) { same = false; bad = "source " + i; }
      ok(x[0] + ": the page's replay equals the data", same && r.maxAt.length === tl.maxAt.length
         && tl.maxAt.every(function (v, j) { return r.maxAt[j] === v; }), bad + " n " + r.n + " vs " + n);
      /* the time-range selector's steps without the points (replay.js, entrySteps) are the replay's */
      var es = window.memsnapEntrySteps({ trace: D.trace, segments: D.segments, segmentsView: tl.segmentsView, pools: false });
      ok(x[0] + ": entry steps without points equal the replay's", es.length === r.entryStep.length
         && r.entryStep.every(function (v, j) { return es[j] === v; }));
    });
    /* the pools view: without private pools it is the memory timeline */
    api.show("pools");
    var PT = api.poolsTimeline;
    ok("pools view renders", status() === "ready" && PT && PT.elementsLength === TL.elementsLength);
    if (PT && PT.envelopes.length === 0)
      ok("no private pool: the pools view is the memory timeline", PT.n === (TL.summ >= 0 ? TL.n - 1 : TL.n) && PT.maxAt.length === TL.maxAt.length);
    if (window.EXPECT_POOLS) poolsCase(PT);
    categoriesCase(D, TL);
    if (!window.EXPECT_OOM) ok("steps: none without annotations", api.stepMarks(TL).length === 0 || (D.steps || []).length > 0);
    if (window.EXPECT_FRAMES) framesCase(D, TL);
    if (window.EXPECT_STACKS) {
      /* view_stacks.py: entry k has the stack [f<k+1>, f0]; 300 frames follow f0 */
      var bad = -1;
      for (var k = 0; k < D.trace.action.length && bad < 0; k++) {
        var fs = api.stackFrames(D.trace.stack[k]);
        if (fs.length !== 2 || D.frames[fs[0]][2] !== "f" + (k + 1) || D.frames[fs[1]][2] !== "f0") bad = k;
      }
      ok("stacks with wide ranks read back", D.trace.action.length === 300 && bad < 0, "entry " + bad);
    }
    api.show("timeline");
    var v = api.view;
    if (TL.elementsLength > 0 && TL.n > 1) {
      /* click the middle of a flat stretch of the largest band: its text and stack are shown */
      var best = -1, s, i;
      for (s = 0; s < TL.n; s++)
        if (s !== TL.summ && TL.tmax[s] - TL.tmin[s] >= TL.nT / 50 && (best < 0 || TL.size[s] > TL.size[best])) best = s;
      if (best < 0) best = TL.summ === 0 ? 1 : 0;
      v.setWindow(0, TL.nT);
      var t = TL.tmin[best], off = TL.O[TL.first[best]];
      for (i = TL.first[best]; i + 1 < TL.first[best + 1]; i++)
        if (TL.O[i] === TL.O[i + 1] && TL.T[i + 1] - TL.T[i] >= 2) { t = (TL.T[i] + TL.T[i + 1]) / 2; off = TL.O[i]; break; }
      var xy = v.canvasToClient(t, off + TL.size[best] / 2);
      var over = document.querySelectorAll(".plot canvas")[1], r = over.getBoundingClientRect();
      over.dispatchEvent(new MouseEvent("click", { clientX: r.left + xy[0], clientY: r.top + xy[1], bubbles: true }));
      var src = TL.sources[TL.elem[best]], st = src >= 0 ? D.trace.stack[src] : -2;
      /* its innermost frame that PyTorch's viewer shows (frames.js) */
      var kept = st >= 0 ? Array.from(api.stackFrames(st)).filter(function (f) {
        return window.memsnapFrames.keep(String(D.frames[f][0]), String(D.frames[f][2])); }) : [];
      var want = kept.length ? frameText(D, kept[0]) : "";
      var info = v.info.textContent;
      ok("click shows the band's size", info.indexOf("(" + TL.size[best] + " bytes) allocation") >= 0,
         "band " + best + " t " + t + " off " + off + " size " + TL.size[best] + " xy " + xy + " info " + info.slice(0, 200));
      ok("click shows the band's stack", info.indexOf(want) >= 0, want);
      measure.clicked_text = info.slice(0, 300);
      ok("no timestamp: not 'Invalid Date'", info.indexOf("Invalid Date") < 0, info.slice(0, 200));
      axisLabels(v, "whole run");
      axesCase(D, TL, v, t, off + TL.size[best] / 2);
      /* search by that band's address and by a frame's text: counts as counted from the data */
      var addr = src >= 0 ? api.hexAddr(src) : "";
      if (addr) {
        var byAddr = 0;
        for (s = 0; s < TL.n; s++) {
          if (s === TL.summ) continue;
          var q = TL.sources[TL.elem[s]];
          if (q >= 0 && api.hexAddr(q).indexOf(addr) === 0) byAddr++;
        }
        var res = api.search(addr, "");
        ok("search by address counts", res.addr === byAddr && byAddr >= 1, res.addr + " vs " + byAddr);
      }
      if (want) {
        var needle = D.frames[kept[0]][2].slice(0, 12).toLowerCase(), byText = 0;
        for (s = 0; s < TL.n; s++) {
          if (s === TL.summ) continue;
          var q2 = TL.sources[TL.elem[s]], st2 = q2 >= 0 ? D.trace.stack[q2] : -1;
          if (st2 < 0) {
            continue;
          }
          if (api.stackFrames(st2).some(function (f) { return frameText(D, f).toLowerCase().indexOf(needle) >= 0; })) byText++;
        }
        var res2 = api.search("", needle);
        ok("search by frame counts", res2.text === byText && byText >= 1, res2.text + " vs " + byText);
        typedSearch = { needle: needle, count: byText };
        api.search("", "");
      }
      /* the stream selector: only that stream's bands are drawn */
      v.setWindow(0, TL.nT);
      var all = v.stats.big + v.stats.small, TS = api.streams(TL), s0 = TS[best], n0 = 0;
      for (s = 0; s < TL.n; s++) if (s !== TL.summ && TS[s] === s0) n0++;
      api.stream(s0);
      ok("stream filter draws that stream's bands", v.stats.big + v.stats.small === n0, (v.stats.big + v.stats.small) + " vs " + n0);
      api.stream(s0 + 1000);
      ok("stream filter: none of another stream", v.stats.big + v.stats.small === 0);
      api.stream(-1);
      ok("stream filter off", v.stats.big + v.stats.small === all);
      /* the pool selector: the bands of each pool add up to all of them */
      var byPool = {}, sum = 0;
      for (s = 0; s < TL.n; s++) if (s !== TL.summ) { var pk = api.elementPool(TL, s); byPool[pk] = (byPool[pk] || 0) + 1; }
      Object.keys(byPool).forEach(function (pk) {
        api.pool(pk);
        ok("pool filter " + pk, v.stats.big + v.stats.small === byPool[pk], (v.stats.big + v.stats.small) + " vs " + byPool[pk]);
        ok("pool in the URL", document.location.hash.indexOf("pool=" + encodeURIComponent(pk)) >= 0);
        sum += v.stats.big + v.stats.small;
      });
      api.pool("");
      ok("pool filters add up", sum === all && v.stats.big + v.stats.small === all, sum + " vs " + all);
      /* the time-range selector: entries a..b restrict the window to their steps */
      var st = api.entrySteps(TL), nE = D.trace.action.length, ea = -1;
      for (i = 0; i < nE && ea < 0; i++) if (D.trace.action[i] === 0) ea = i;
      if (ea >= 0) {
        for (s = 0; s < TL.n; s++) if (s !== TL.summ && TL.sources[TL.elem[s]] === ea)
          ok("an alloc's entry takes effect at its band's first step", st[ea] === TL.tmin[s], st[ea] + " vs " + TL.tmin[s]);
        var eb = Math.min(nE - 1, ea + 20);
        api.range(ea, eb);
        var w = v.window();
        ok("range: the window is entries a..b", w[0] === st[ea] && w[1] === Math.max(st[ea] + 1, Math.min(TL.nT, st[eb + 1])), w + " vs " + st[ea] + "," + st[eb + 1]);
        ok("range in the URL", document.location.hash.indexOf("from=" + ea + "&to=" + eb) >= 0 || (document.location.hash.indexOf("from=" + ea) >= 0 && document.location.hash.indexOf("to=" + eb) >= 0), document.location.hash);
        v.setWindow(0, TL.nT);
        w = v.window();
        ok("range: zooming out stays in it", w[0] >= st[ea] && w[1] <= Math.max(st[ea] + 1, st[eb + 1]), String(w));
        api.range(null, null);
        v.setWindow(0, TL.nT);
        ok("range cleared", v.window()[0] === 0 && v.window()[1] === TL.nT && document.location.hash.indexOf("from=") < 0);
      }
      /* the peak key: the window holds the peak */
      v.setWindow(0, Math.max(8, TL.nT / 50));
      key("p");
      ok("p jumps to the peak", v.tl.peakT >= 0 && document.location.hash.indexOf("x0=") >= 0);
      /* zoom: a scripted sequence; the median frame time */
      var times = [];
      v.setWindow(0, TL.nT);
      for (i = 0; i < 12; i++) { v.zoomAt(TL.peakT, 0.7); times.push(v.lastFrameMs); }
      for (i = 0; i < 12; i++) { key(i % 2 ? "ArrowLeft" : "ArrowRight"); times.push(v.lastFrameMs); }
      for (i = 0; i < 12; i++) { v.zoomAt(TL.peakT, 1 / 0.7); times.push(v.lastFrameMs); }
      times.sort(function (a, b) { return a - b; });
      measure.zoom_frame_ms = times[times.length >> 1];
      /* level of detail: zoomed in on the peak, at least as many bands have their own polygon */
      v.setWindow(0, TL.nT);
      var bigAll = v.stats.big;
      v.setWindow(Math.max(0, TL.peakT - 20), TL.peakT + 20);
      ok("zooming in splits small bands", v.stats.big >= Math.min(bigAll, 1), v.stats.big + " vs " + bigAll);
      v.setWindow(TL.nT - 4, TL.nT);
      axisLabels(v, "4 steps at the end");
      v.setWindow(0, TL.nT);
    }
    /* what is alive at the peak, as CSV and JSON: one row per band alive there */
    api.select(TL.peakT);
    api.show("flame");
    var fl = api.view, csv = fl.csv().split("\n"), js = JSON.parse(fl.json());
    var aliveN = 0, aliveB = 0;
    for (s = 0; s < TL.n; s++) if (s !== TL.summ && TL.tmin[s] <= TL.peakT && TL.tmax[s] > TL.peakT) { aliveN++; aliveB += TL.size[s]; }
    ok("alive CSV rows", csv.length === aliveN + 2 && csv[0].indexOf("address,size,") === 0, csv.length + " vs " + aliveN);
    ok("alive JSON", js.allocations.length === aliveN && js.bytes === aliveB && js.timestep === TL.peakT);
    ok("alive bytes", fl.total === aliveB);
    /* issue #30 defect 8: the flame graph by keyboard: Up the biggest callee, Down back, Enter
     * zooms; the details (a live region) say the frame's name and bytes */
    var fcv = document.querySelector(".plot canvas"), finfo = document.querySelector(".info");
    function fpress(k) { fcv.dispatchEvent(new KeyboardEvent("keydown", { key: k, bubbles: true, cancelable: true })); }
    ok("flame: the graph and its details are reachable and named", fcv.tabIndex === 0 && fcv.getAttribute("role") === "img"
       && /^Flame graph/.test(fcv.getAttribute("aria-label") || "") && finfo.getAttribute("aria-live") === "polite");
    if (fl.tree && fl.tree.kids.size) {
      var big = null;
      fl.tree.kids.forEach(function (k) { if (!big || k.value > big.value || k.value === big.value && k.name < big.name) big = k; });
      fcv.focus();
      fpress("ArrowUp");
      ok("flame: Up goes to the biggest callee and says it", fl.cursor() === big && finfo.textContent.indexOf(big.name + "\n") === 0
         && finfo.textContent.indexOf("(" + big.value + " bytes)") > 0, finfo.textContent.slice(0, 120));
      fpress("Enter");
      ok("flame: Enter zooms to it", fl.zoomed() === big && document.activeElement === fcv);
      fpress("Enter");
      fpress("ArrowDown");
      ok("flame: Enter again backs out, Down goes to the caller", fl.zoomed() === fl.tree && fl.cursor() === fl.tree
         && finfo.textContent.indexOf("all\n") === 0, finfo.textContent.slice(0, 60));
    }
    /* issue #30 item 11: the top consumers there, by each grouping, add up to what is alive;
     * sortable; the CSV has every group */
    var cons = fl.consumers;
    ["source", "category", "stack"].forEach(function (by) {
      var gs = cons.groups(by), b = 0, c = 0;
      gs.forEach(function (g) { b += g[1]; c += g[2]; });
      ok("consumers by " + by + " add up", b === aliveB && c === aliveN, b + " vs " + aliveB + ", " + c + " vs " + aliveN);
      ok("consumers by " + by + ": biggest first", gs.every(function (g, i) { return i === 0 || gs[i - 1][1] >= g[1]; }));
      ok("consumers by " + by + ": CSV", cons.csv(by).split("\n").length === gs.length + 2 && cons.csv(by).indexOf(by + ",bytes,count") === 0);
    });
    /* the count column's head is a button (the keyboard's Enter or Space clicks it), which keeps
     * the focus and says how the table is sorted (issue #30 defect 8) */
    var heads = document.querySelectorAll("th button.sort");
    if (heads.length === 3) { heads[2].focus(); heads[2].click(); }
    var head2 = document.querySelectorAll("th button.sort")[2];
    ok("consumers: the heads are buttons that keep the focus", heads.length === 3 && document.activeElement === head2
       && head2.parentNode.getAttribute("aria-sort") === "descending", heads.length + " heads");
    var byCount = cons.groups("source");
    ok("consumers: sorted by count on a click", byCount.every(function (g, i) { return i === 0 || byCount[i - 1][2] >= g[2]; })
       && cons.rows() === Math.min(100, byCount.length));
    cons.sort(1);
    if (window.EXPECT_FRAMES) {
      var gsrc = cons.groups("source"), top = gsrc[0], layer = gsrc.filter(function (g) { return g[0] === "user.py:10:layer"; })[0];
      ok("consumers: the source line is the innermost Python frame shown", top[0] === "train.py:1:main" && top[1] === 1097 * 4096
         && top[2] === 1097 && !!layer && layer[1] === 1048576 && layer[2] === 1, JSON.stringify(gsrc.slice(0, 4)));
    }
    /* the Explain panel: the device's answer; at the selected moment, the page's own verdict */
    api.show("explain");
    var xa = D.explain, ev = api.view;
    ok("explain: the panel", ev && ev.name === "explain" && !!xa, JSON.stringify(xa || {}).slice(0, 200));
    if (xa && !xa.error) {
      var vdiv = document.querySelector(".explain .verdict");
      ok("explain: the verdict shown", !!vdiv && vdiv.dataset.verdict === xa.verdict
         && ["full", "fragmentation", "releasable", "private_pool", "unknown"].indexOf(xa.verdict) >= 0);
      if (ev.selectedVerdict) {
        var sv = ev.selectedVerdict;
        ok("explain: the selected moment's figures add up", sv.reserved >= sv.active && sv.active >= sv.allocated
           && sv.cached_free === sv.reserved - sv.active);
      }
    }
    if (window.EXPECT_OOM) {
      var MiB = 1048576;
      ok("oom: moment", xa.moment === "oom" && xa.entry === 6 && xa.step === 4, JSON.stringify([xa.moment, xa.entry, xa.step]));
      ok("oom: phase as text", xa.phase === "<img src=x onerror=alert(1)>## forward ##"
         && document.querySelector(".explain h3").textContent.indexOf("<img src=x") > 0
         && !document.querySelector(".explain img"));
      ok("oom: capacity inferred", xa.capacity_bytes === 120 * MiB && xa.capacity_source === "inferred_from_oom");
      ok("oom: verdict", xa.verdict === "fragmentation" && xa.cached_free_bytes === 40 * MiB
         && xa.largest_free_block_bytes === 40 * MiB, xa.verdict_text);
      var es = xa.remedies.filter(function (r) { return r.config === "expandable_segments:True"; })[0];
      ok("oom: remedies replayed", xa.remedies.length >= 8 && !!es && es.avoids_oom === true
         && document.querySelectorAll(".explain .remedies tr").length === xa.remedies.length + 1);
      ok("oom: recommendation", (xa.recommendation || "").indexOf("set PYTORCH_CUDA_ALLOC_CONF=") === 0, xa.recommendation);
      ok("oom: marked on the timeline", api.oomSteps(TL).length === 1);
      /* issue #30 item 13: ProfilerStep#4 (times 9..99: every entry) on the time axis, its peak */
      var sm = api.stepMarks(TL), est = api.entrySteps(TL);
      ok("steps: ProfilerStep#4 marked", sm.length === 1 && sm[0].step === 4 && sm[0].t0 === est[0] && sm[0].t1 === TL.nT
         && sm[0].peak === TL.maxAt[TL.peakT], JSON.stringify(sm));
      api.show("timeline");
      api.view.setWindow(0, TL.nT);
      ok("steps: labelled on the axis", (api.view.labels || []).some(function (l) { return l[0] === "step 4: peak " + (TL.maxAt[TL.peakT] / 1048576).toFixed(1) + "MiB"; }),
         JSON.stringify(api.view.labels));
    }
    keyboardCase(D, TL);
    /* Allocator State History: arrow keys move the event; the map follows */
    api.show("history");
    var h = api.view, n = D.trace.action.length;
    if (n > 1) {
      historyCase(D, h, n);
      /* issue #30 defect 8: the list is a listbox reached and driven by the keyboard */
      var lst = document.querySelector(".events");
      lst.focus();
      lst.dispatchEvent(new KeyboardEvent("keydown", { key: "Home", bubbles: true, cancelable: true }));
      ok("a11y: the history list by keyboard", document.activeElement === lst && lst.tabIndex === 0 && lst.getAttribute("role") === "listbox"
         && !!lst.getAttribute("aria-label") && h.selected === 0 && lst.getAttribute("aria-activedescendant") === "ms-history-row-0");
      var ia = -1;
      for (i = 1; i < n; i++) if (D.trace.action[i] === 0) { ia = i; break; }
      if (ia > 0 && h.selectEntry) {
        /* ia starts a row (an alloc is never folded into another row); ia - 1 is in the row before */
        h.selectEntry(ia - 1);
        var before = h.state.blocks.size;
        key("ArrowDown");
        ok("ArrowDown selects the next event", h.selectedEntry === ia, h.selectedEntry + " vs " + ia);
        ok("the map gains the allocated block", h.state.blocks.size === before + 1, h.state.blocks.size + " vs " + before);
        key("ArrowUp");
        ok("ArrowUp goes back", h.selectedEntry < ia && h.state.blocks.size === before);
        var sel = document.querySelector(".events .row.sel");
        ok("the selected row is shown", !!sel && +sel.dataset.i === h.selected && sel.getAttribute("aria-selected") === "true"
           && document.querySelector(".events").getAttribute("aria-activedescendant") === sel.id);
      }
      /* the end of the trace is the snapshot's own state */
      h.select(h.rows ? h.rows.length - 1 : n - 1);
      var live = 0;
      D.segments.forEach(function (g) { g.blocks.forEach(function (b) { if (b[1 + 1] === 1 || b[2] === 2) live++; }); });
      ok("the last event shows the snapshot's blocks", h.state.blocks.size === live, h.state.blocks.size + " vs " + live);
      historyFigures(D, h);
    } else {
      ok("no trace: the map shows the snapshot", h.drawn && h.drawn.segments === D.segments.length);
      /* issue #30 defect 4: the keys of the list do nothing (no TypeError) without a trace */
      var keyErr = [];
      window.addEventListener("error", function (e) { keyErr.push(e.message); });
      ["ArrowDown", "ArrowUp", "End", "Home", "PageDown", "PageUp"].forEach(key);
      ok("no trace: the history's keys raise nothing", keyErr.length === 0 && status() === "ready"
         && h.drawn.segments === D.segments.length, keyErr.join(" "));
      if (n === 0) {
        api.show("timeline");
        ok("no trace: the timeline says why", document.querySelector(".info").textContent.indexOf("The snapshot has no trace") === 0);
      }
    }
    /* the device selector: every listed device is in the page */
    if (D.devices.length > 1) {
      var first = D.device, other = D.devices.filter(function (d) { return d !== first; })[0];
      api.device(other);
      var pd = D.per_device.filter(function (x) { return x.device === other; })[0];
      ok("device switch", api.data.device === other && api.timeline.elementsLength === pd.tl.elements_length
        && api.data.trace.action.length === pd.ntrace && status() === "ready");
      api.show("history");
      ok("device switch: the map shows that device's segments", api.view.drawn && api.view.drawn.segments === pd.segments.length);
      api.device(first);
      ok("device switch back", api.data.device === first && api.timeline.n === TL.n);
      measure.devices = D.devices.length;
    }
    api.show("timeline");
    measure.timeline_text = (document.querySelector(".note") || {}).textContent || "";
    if (window.EXPECT_NONASCII) {
      /* view_hostile.py's innermost frame: the lone surrogate is invalid UTF-8 in the pickle,
       * three U+FFFD (one per byte) in the page */
      var NA = ["d\u00e9j\u00e0/\u4e2d.py", 3, "f\u00fc\ud83d\ude00\ufffd\ufffd\ufffd"];
      ok("a frame that is not ASCII reads back", D.frames.some(function (f) { return f.join(":") === NA.join(":"); }),
         JSON.stringify(D.frames));
      ok("a frame that is not ASCII shows", (measure.clicked_text || "").indexOf(NA.join(":")) >= 0, measure.clicked_text);
      ok("a title that is not ASCII", document.title === window.EXPECT_NONASCII, document.title);
    }
    if (window.EXPECT_BYTES) {
      /* view_bytes.py: every byte value, then what the HTML parser would change (CR LF, CR, NUL)
       * or what would end the element, written as the page writes its binary data */
      var want = [], i2, tail = "\r\n\r\u0000\u0000\u003c!--\u003cscript>\u003c/script>\u003c/SCRIPT ==\u00ff\u0080\u009d";
      for (i2 = 0; i2 < 256; i2++) want.push(i2);
      for (i2 = 0; i2 < tail.length; i2++) want.push(tail.charCodeAt(i2));
      var el = document.getElementById("ms-test-bytes"), got = el ? Array.from(window.memsnapData.unescapeBytes(el.textContent)) : [];
      ok("every byte value comes back", got.join() === want.join(), got.join());
      /* 31 escapes among the 256 values, 11 in the rest (CR, NUL, '<', '=', 0x80) */
      var text = el ? el.textContent : "", same = text.length === want.length + 31 + 11;
      for (i2 = 0; i2 < text.length && same; i2++) if (text.charCodeAt(i2) > 255) same = false;
      ok("one character per byte, of the byte's code", same, text.length + " " + i2);
      /* not narrow: 4 escapes among the 256 values, 10 in the rest; the 27 bytes 0x80-0x9F that
       * windows-1252 decodes above U+00FF (and the tail's 0x80) come back through the page's map */
      var wel = document.getElementById("ms-test-bytes-wide"), wtext = wel ? wel.textContent : "";
      got = wel ? Array.from(window.memsnapData.unescapeBytes(wtext)) : [];
      ok("every byte value comes back, not narrow", got.join() === want.join(), got.join());
      var above = 0;
      for (i2 = 0; i2 < wtext.length; i2++) if (wtext.charCodeAt(i2) > 255) above++;
      ok("one character per byte, not narrow", wtext.length === want.length + 4 + 10 && above === 28,
        wtext.length + " " + above);
    }
  } catch (e) {
    errors.push("exception: " + (e && e.stack || e));
  }
  /* tests/browser/view_pools.py's snapshot: the numbers worked out by hand from MemoryViz's rules
   * (A, D in the default pool; B, C and the ghost block G in the private pool (1, 2), which
   * reserves 4 MiB at entry 2) */
  /* issue #27: every band of the memory timeline has a category; colour by category, with a
   * legend whose boxes hide a category's bands; MemoryViz's list always has `unknown` */
  function categoriesCase(D, TL) {
    ok("categories: MemoryViz's list, unknown among them", D.categories && D.categories.length === 8
      && D.categories.indexOf("unknown") === 7 && D.category_colors.length === 8);
    if (!TL.n || !TL.elementsLength) return;
    ok("categories: one per element", TL.cat && TL.cat.length === TL.elementsLength
      && Array.prototype.every.call(TL.cat, function (c) { return c < 8; }));
    api.show("timeline");
    api.colorBy("category");
    ok("categories: colour by category draws", status() === "ready", document.body.getAttribute("data-error"));
    var boxes = document.querySelectorAll(".legend input[type=checkbox]");
    ok("categories: a legend box per category", boxes.length === 8);
    var pk = TL.peakT, cb = api.categoryBytes(pk), sum = 0, bands = 0, s;
    cb.forEach(function (b) { sum += b; });
    for (s = 0; s < TL.n; s++) if (s !== TL.summ && TL.tmin[s] <= pk && pk < TL.tmax[s]) bands += TL.size[s];
    ok("categories: the bands alive at the peak, by category, sum to them", sum === bands, sum + " vs " + bands);
    var before = api.view.stats.big + api.view.stats.small;
    D.categories.forEach(function (n) { api.hideCategory(n, true); });
    var hidden = api.view.stats.big + api.view.stats.small;
    D.categories.forEach(function (n) { api.hideCategory(n, false); });
    var back = api.view.stats.big + api.view.stats.small;
    ok("categories: hiding every category hides every band, showing them brings them back",
       hidden === 0 && back === before && before > 0, before + " " + hidden + " " + back);
    api.colorBy("allocation");
  }

  /* issue #30 defect 7: one unit on the x axis and in the range boxes (timesteps), said; the
   * minimap under the plot's own columns; vertical zoom */
  function axesCase(D, TL, v, t, b) {
    v.setWindow(0, TL.nT);
    ok("axes: the x axis says its unit", (v.labels || []).some(function (l) { return l[0] === "timestep"; }), JSON.stringify(v.labels));
    var boxes = document.querySelectorAll("input.range");
    ok("range: the boxes say they take timesteps", boxes.length === 2 && /^Steps/.test(boxes[0].parentNode.textContent),
       boxes.length && boxes[0].parentNode.textContent);
    if (D.trace && D.ntrace > 2 && TL.nT >= 8 && boxes.length === 2) {
      var sa = Math.floor(TL.nT / 4), sb = Math.floor(TL.nT / 2);
      boxes[0].value = String(sa); boxes[1].value = String(sb);
      boxes[1].dispatchEvent(new Event("change"));
      var w = v.window();
      ok("range: the boxes take timesteps and show the window", w[0] >= sa && w[0] < w[1] && w[1] >= sb
         && +boxes[0].value === w[0] && +boxes[1].value === w[1], w + " boxes " + boxes[0].value + "," + boxes[1].value + " typed " + sa + "," + sb);
      api.range(null, null);
    }
    /* the minimap's window box starts under the plot's column of its first step */
    var cv = document.querySelector(".plot canvas"), mcv = document.querySelector(".mini canvas");
    ok("minimap: as wide as the plot", mcv.width === cv.width, mcv.width + " vs " + cv.width);
    if (TL.nT >= 8) {
      var a = TL.nT / 4, xa = Math.round(v.canvasToClient(a, 0)[0]);
      v.setWindow(a, TL.nT / 2);
      var row = mcv.getContext("2d").getImageData(0, 0, mcv.width, 1).data;
      ok("minimap: aligned with the plot", row[4 * (xa + 2) + 3] > 0 && row[4 * (xa - 2) + 3] === 0,
         "alpha at " + (xa - 2) + ": " + row[4 * (xa - 2) + 3] + ", at " + (xa + 2) + ": " + row[4 * (xa + 2) + 3]);
      v.setWindow(0, TL.nT);
    }
    /* vertical zoom: twice as tall, the axis' top is its old middle; the key 0 undoes it */
    if (!v.zoomY) { ok("vertical zoom", false, "none"); return; }
    var y0 = v.yMax(), mid = v.labels[2][0], base = v.canvasToClient(t, 0)[1], p0 = v.canvasToClient(t, b)[1];
    v.zoomY(2);
    var p1 = v.canvasToClient(t, b)[1];
    ok("vertical zoom: twice as tall", v.yMax() === y0 / 2 && v.labels[4][0] === mid && Math.abs((base - p1) - 2 * (base - p0)) < 1e-6,
       v.yMax() + " vs " + y0 + ", " + v.labels[4][0] + " vs " + mid + ", " + (base - p1) + " vs " + (base - p0));
    var px = p1 > 10 ? cv.getContext("2d").getImageData(Math.round(v.canvasToClient(t, b)[0]), Math.round(p1), 1, 1).data : [0, 0, 0, 255];
    ok("vertical zoom: the band drawn where it now is", px[3] === 255, Array.from(px).join(","));
    key("0");
    ok("vertical zoom: 0 undoes it", v.yMax() === y0, v.yMax() + " vs " + y0);
  }
  /* issue #30 defect 8: the page by keyboard and screen reader: named controls, a focus order
   * (the bar, the plot, the details), the plot named by what it shows, the details a live region;
   * keys alone choose a band at a moment and show its details */
  function keyboardCase(D, TL) {
    api.show("timeline");
    var v = api.view, bar = document.querySelector(".bar");
    function press(node, k) { node.dispatchEvent(new KeyboardEvent("keydown", { key: k, bubbles: true, cancelable: true })); }
    ok("a11y: the controls are a named group", bar.getAttribute("role") === "group" && !!bar.getAttribute("aria-label"));
    var unnamed = [].filter.call(bar.querySelectorAll("select, input, button"), function (c) {
      return !c.getAttribute("aria-label") && !c.closest("label") && !c.textContent.trim();
    });
    ok("a11y: every control has a name", unnamed.length === 0, unnamed.map(function (c) { return c.outerHTML; }).join(" "));
    var region = document.querySelector("[role=region]");
    ok("a11y: the view is a region named as the view", !!region && region.getAttribute("aria-label") === "Active Memory Timeline");
    var plot = document.querySelector(".plot canvas[tabindex]"), info = document.querySelector(".info");
    var order = [].filter.call(document.querySelectorAll("select, input, button, [tabindex]"), function (e) { return e.tabIndex >= 0; });
    ok("a11y: Tab reaches the views, the plot, then the details", !!plot && order.indexOf(bar.querySelector("select")) === 0
       && order.indexOf(plot) > 0 && order.indexOf(info) > order.indexOf(plot), order.map(function (e) { return e.tagName; }).join(","));
    if (!plot) return;
    ok("a11y: the plot is an image named by what it shows", plot.getAttribute("role") === "img"
       && plot.getAttribute("aria-label").indexOf("peak " ) >= 0, plot.getAttribute("aria-label"));
    ok("a11y: the details are read as they change", info.getAttribute("role") === "status" && info.getAttribute("aria-live") === "polite");
    if (!(TL.elementsLength > 0 && TL.n > 1) || !v.picked) return;
    plot.focus();
    api.select(-1);
    press(plot, "ArrowDown");
    var s1 = v.picked(), T0 = TL.peakT, txt = info.textContent, m = /^Band 1 of (\d+) at timestep (\d+)/.exec(txt);
    ok("a11y: Down picks the top band at the peak", document.activeElement === plot && s1 >= 0 && !!m && +m[2] === T0
       && TL.tmin[s1] <= T0 && T0 < TL.tmax[s1] && txt.indexOf(api.elementText(TL, s1)) > 0, txt.slice(0, 200));
    if (m && +m[1] > 1) {
      press(plot, "ArrowDown");
      var s2 = v.picked();
      ok("a11y: Down again picks the band below", s2 !== s1 && s2 >= 0 && /^Band 2 of /.test(info.textContent)
         && info.textContent.indexOf(api.elementText(TL, s2)) > 0, info.textContent.slice(0, 120));
      press(plot, "ArrowUp");
      ok("a11y: Up goes back", v.picked() === s1 && /^Band 1 of /.test(info.textContent));
    }
    press(plot, "]");
    ok("a11y: ] moves the moment", T0 + 1 >= TL.nT || /^Timestep \d+ chosen/.test(info.textContent) && v.picked() === -1,
       info.textContent.slice(0, 100));
    api.select(-1);
  }
  /* issue #30 defect 5: the Allocator State History lists one row per free (a free_requested
   * followed at once by its free_completed), as PyTorch's viewer does */
  function historyCase(D, h, n) {
    var pairs = 0, firstPair = -1, i;
    for (i = 0; i + 1 < n; i++)
      if (D.trace.action[i] === 1 && D.trace.action[i + 1] === 2 && D.trace.addr[i] === D.trace.addr[i + 1]) {
        if (firstPair < 0) firstPair = i;
        pairs++; i++;
      }
    ok("history: one row per free", !!h.rows && h.rows.length === n - pairs, (h.rows ? h.rows.length : "no rows") + " vs " + (n - pairs));
    if (firstPair >= 0 && h.selectEntry) {
      h.selectEntry(firstPair + 1);
      var row = document.querySelector(".events .row.sel");
      ok("history: a free is one row, its state after the free_completed", h.selectedEntry === firstPair && !!row
         && /^free /.test(row.textContent) && h.state.step === firstPair + 2, row && row.textContent);
    }
  }
  /* issue #30 defect 5: the figures of the snapshot's own state (free space, its largest block,
   * internal fragmentation), a block's hover (requested and rounded sizes), the map zoomed */
  function historyFigures(D, h) {
    var res = 0, al = 0, req = 0, busy = 0, largest = 0, pick = null;
    D.segments.forEach(function (g) {
      var run = 0, addr = parseInt(g.addr, 16);
      res += g.size;
      g.blocks.forEach(function (b) {
        if (b[2] === 1 || b[2] === 2) {
          busy += b[0];
          if (b[2] === 1) { al += b[0]; req += b[1]; if (!pick || (b[0] > b[1]) > (pick.size > pick.req) || (b[0] > b[1]) === (pick.size > pick.req) && b[0] > pick.size)
            pick = { addr: addr, size: b[0], req: b[1] }; /* the largest, rounded if one is */
          }
          run = 0;
        } else { run += b[0]; if (run > largest) largest = run; }
        addr += b[0];
      });
    });
    var txt = h.info.textContent;
    var m = /free in the segments: [^(]*\((\d+) bytes\), largest free block [^(]*\((\d+) bytes\)/.exec(txt);
    ok("history: free space and its largest block", !!m && +m[1] === res - busy && +m[2] === largest,
       (m ? m[1] + "," + m[2] : txt.slice(0, 200)) + " vs " + (res - busy) + "," + largest);
    m = /internal fragmentation: [^(]*\((\d+) bytes\)/.exec(txt);
    ok("history: internal fragmentation", !!m && +m[1] === al - req, (m ? m[1] : txt.slice(0, 200)) + " vs " + (al - req));
    if (!pick || !h.rectOf) { ok("history: the map's API", !!h.rectOf); return; }
    var r = h.rectOf(pick.addr);
    h.hover(r[0] + r[2] / 2, r[1] + r[3] / 2);
    txt = h.info.textContent;
    ok("history: a block's hover says its requested and rounded sizes", txt.indexOf("b'" + pick.addr.toString(16) + ": block of ") === 0
       && txt.indexOf("(" + pick.size + " bytes), requested ") > 0 && txt.indexOf("(" + pick.req + " bytes)") > 0,
       JSON.stringify(pick) + " at " + JSON.stringify(r) + ": " + txt.slice(0, 200));
    /* zoomed 8 times about the block: 8 times as wide, and drawn in its colour where it now is */
    h.zoomMap(8, r[0] + r[2] / 2, r[1] + r[3] / 2);
    var r2 = h.rectOf(pick.addr), cv = document.querySelector(".segmap canvas");
    ok("history: the map zooms", h.mapZoom.z === 8 && Math.abs(r2[2] - 8 * r[2]) < 1e-6 && Math.abs(r2[3] - 8 * r[3]) < 1e-6,
       JSON.stringify([r, r2]));
    var cx = Math.round(r2[0] + r2[2] / 2), cy = Math.round(r2[1] + r2[3] / 2);
    var px = cx >= 0 && cx < cv.width && cy >= 0 && cy < cv.height ? cv.getContext("2d").getImageData(cx, cy, 1, 1).data : [0, 0, 0, 0];
    ok("history: the zoomed block drawn under its new place", px[3] === 255 && !(px[0] === 255 && px[1] === 255 && px[2] === 255)
       && !(px[0] === 0 && px[1] === 0 && px[2] === 0), Array.from(px) + " at " + cx + "," + cy);
    /* keyboard: the map takes + - 0 and arrows while focused; the list keeps its selection */
    var at = h.selected;
    cv.focus();
    cv.dispatchEvent(new KeyboardEvent("keydown", { key: "0", bubbles: true, cancelable: true }));
    cv.dispatchEvent(new KeyboardEvent("keydown", { key: "+", bubbles: true, cancelable: true }));
    cv.dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowDown", bubbles: true, cancelable: true }));
    ok("history: the map's keys", h.mapZoom.z === 2 && h.mapZoom.py > 0 && h.selected === at, JSON.stringify(h.mapZoom));
    if (window.EXPECT_OOM || window.EXPECT_POOLS) {
      /* few segments: a row of the map is taller than the old 30-pixel strip */
      cv.dispatchEvent(new KeyboardEvent("keydown", { key: "0", bubbles: true, cancelable: true }));
      var g0 = h.state.segs[0], rs = g0 && h.rectOf(g0.addr, true);
      ok("history: the map's rows fill its height", !!rs && rs[3] > 30, JSON.stringify(rs));
    }
  }
  /* issue #30 defect 7: every label of the timeline's axes inside the canvas (the last tick, the
   * peak's label), and no tick twice */
  function axisLabels(v, when) {
    var W = document.querySelector(".plot canvas").width, L = v.labels || [], ticks = {}, twice = "";
    L.forEach(function (l) { if (/^[0-9]+$/.test(l[0])) { if (ticks[l[0]]) twice += " " + l[0]; ticks[l[0]] = 1; } });
    ok("axes (" + when + "): every label inside the canvas", L.length >= 2 && L.every(function (l) { return l[1] >= 0 && l[2] <= W; }),
       JSON.stringify(L) + " W " + W);
    ok("axes (" + when + "): each tick once", twice === "", twice);
  }
  /* issue #30 defects 6 and 7: view_frames.py's stacks (entries 0, 1, 2) */
  function framesCase(D, TL) {
    function bandOf(entry) {
      for (var s = 0; s < TL.n; s++) if (s !== TL.summ && TL.sources[TL.elem[s]] === entry) return s;
      return -1;
    }
    var t0 = api.elementText(TL, bandOf(0));
    ok("frames: PyTorch's hidden frames are hidden", t0.indexOf("user.py:10:layer\ntrain.py:1:main") >= 0
       && !/torch::unwind|CapturedTraceback|CUDACachingAllocator|RegisterCUDA|_PyEval/.test(t0) && t0.indexOf("5 frames") >= 0, t0);
    api.allFrames(true);
    var t1 = api.elementText(TL, bandOf(0));
    ok("frames: all frames on the toggle", t1.indexOf("torch::unwind::unwind()") >= 0 && t1.indexOf("_PyEval_EvalFrameDefault") >= 0
       && t1.indexOf("RegisterCUDA") >= 0 && document.location.hash.indexOf("frames=all") >= 0, t1);
    api.allFrames(false);
    var t2 = api.elementText(TL, bandOf(2));
    ok("frames: a right-to-left override is shown escaped", t2.indexOf("x\\u2067y.py:7:evil\\u202egnp.exe") >= 0
       && !/[\u202a-\u202e\u2066-\u2069]/.test(t2), t2);
    api.select(TL.peakT);
    api.show("flame");
    var fl = api.view;
    ok("frames: the flame graph draws the innermost frame of a deep stack", fl.depth >= 150 && fl.drawnDepth === fl.depth,
       fl.depth + " vs " + fl.drawnDepth);
    ok("frames: the flame graph hides PyTorch's hidden frames", fl.depth === 150, String(fl.depth));
    api.show("timeline");
  }
  function poolsCase(PT) {
    var M = 1048576, want = [
      ["envelope", -2, [0, 1, 4, 15], [0, 0, 0, 0], [M, M, 4 * M, 4 * M]],
      ["G", 4, [0, 15], [0, 0]], ["A", 0, [0, 1, 4, 12], [M, M, 4 * M, 4 * M]],
      ["B", 1, [4, 8], [M, M]], ["C", 2, [5, 8, 11, 15], [2 * M, 2 * M, M, M]],
      ["D", 3, [6, 12, 15, 15], [5 * M, 5 * M, 4 * M, 4 * M]]];
    ok("pools: series", PT.n === want.length, String(PT.n));
    want.forEach(function (w, i) {
      var a = PT.first[i], z = PT.first[i + 1], T = Array.from(PT.T.subarray(a, z)), O = Array.from(PT.O.subarray(a, z));
      var good = PT.elem[i] === w[1] && T.join() === w[2].join() && O.join() === w[3].join();
      if (w[4]) good = good && Array.from(PT.S.subarray(a, z)).join() === w[4].join();
      ok("pools: " + w[0], good, PT.elem[i] + " T " + T + " O " + O + " S " + Array.from(PT.S.subarray(a, z)));
    });
    ok("pools: stripes are half transparent", PT.alpha[1] === 0.5 && PT.alpha[3] === 0.5 && PT.alpha[2] === 1 && PT.ghost[1] === 1);
    ok("pools: max_at_time", Array.from(PT.maxAt).join() === [2, 5, 5, 5, 5, 5, 5.5, 5.5, 5.5, 5.5, 5.5, 5.5, 5.5, 5.5, 5.5].map(function (x) { return x * M; }).join(), Array.from(PT.maxAt).join());
    ok("pools: the envelope", PT.envelopes.length === 1 && PT.envelopes[0].key === "1,2,s0" && PT.envelopes[0].reserved === 4 * M);
    ok("pools: entry steps", Array.from(PT.entryStep).join() === "0,0,1,1,5,6,7,11,11,15,15", Array.from(PT.entryStep).join());
    var v = api.view;
    v.setWindow(0, PT.nT);
    /* issue #30 defect 3: the envelope's outline is drawn on the overlay (above its stripes) along
     * its top (4 MiB from step 4), and not inside it */
    var oc = document.querySelectorAll(".plot canvas")[1], ox = oc.getContext("2d");
    function outlined(t, b) {
      var p = v.canvasToClient(t, b), d = ox.getImageData(Math.round(p[0]) - 1, Math.round(p[1]) - 2, 3, 5).data;
      for (var k = 0; k < d.length; k += 4) if (d[k] === 0x77 && d[k + 1] === 0 && d[k + 2] === 0x88 && d[k + 3] > 200) return true;
      return false;
    }
    ok("pools: the envelope's outline is drawn", outlined(10, 4 * M) && outlined(12, 4 * M) && !outlined(10, 3 * M));
    var xy = v.canvasToClient(10, 2.5 * M);
    var over = document.querySelectorAll(".plot canvas")[1], r = over.getBoundingClientRect();
    over.dispatchEvent(new MouseEvent("click", { clientX: r.left + xy[0], clientY: r.top + xy[1], bubbles: true }));
    ok("pools: the envelope's text", v.info.textContent.indexOf("Private pool (1, 2), stream 0: the envelope") === 0, v.info.textContent.slice(0, 120));
    api.pool("1,2");
    ok("pools: the pool selector keeps the pool's envelope and stripes", v.stats.big + v.stats.small === 4, JSON.stringify(v.stats));
    api.pool("0,0");
    ok("pools: the default pool's bands", v.stats.big + v.stats.small === 2, JSON.stringify(v.stats));
    api.pool("");
    api.show("timeline");
    var TL = api.timeline, n12 = 0;
    for (var s = 0; s < TL.n; s++) if (s !== TL.summ && api.elementPool(TL, s) === "1,2") n12++;
    ok("pools: B, C and G are in the pool on the memory timeline", n12 === 3, String(n12));
    /* issue #30 defect 2: the pool on hover is PyTorch's (device, pool) of every band: A and D
     * in the default pool (0, 0), B, C and the ghost block G in the private pool (1, 2) */
    var wantPool = ["0, 0", "1, 2", "1, 2", "0, 0", "1, 2"], badPool = "";
    [TL, PT].forEach(function (tl) {
      for (var s = 0; s < tl.n; s++) {
        var e = tl.elem[s], txt = api.elementText(tl, s);
        if (e >= 0 && txt.indexOf(", pool_id (" + wantPool[e] + ")") < 0) badPool += " " + e + ": " + txt.split("\n")[0];
        if (e <= -2 && txt.indexOf("Private pool (1, 2)") !== 0) badPool += " envelope";
      }
    });
    ok("pools: the hover shows PyTorch's pool of every band", badPool === "", badPool);
    api.range(3, 5);
    var w = api.view.window(), st = api.entrySteps(TL);
    ok("pools: range 3..5 of the memory timeline", w[0] === st[3] && w[1] === st[6], w + " vs " + st[3] + "," + st[6]);
    api.range(null, null);
    api.show("pools");
  }
  /* issue #30 defect 1: typing in the frame box searches in a worker (a blob: worker, which the
   * page's CSP allows) once typing pauses; the last query's counts are the synchronous ones */
  function typedCase() {
    if (!typedSearch) return Promise.resolve();
    api.show("timeline");
    var box = api.searchInputs[1], t0 = performance.now();
    for (var k = 1; k <= typedSearch.needle.length; k++) {
      box.value = typedSearch.needle.slice(0, k);
      box.dispatchEvent(new Event("input", { bubbles: true }));
    }
    /* the worker answers in real time, and headless Chromium's virtual time would run out while
     * the page waits idle: keep a task queued (a message channel, not a timer) until it answers */
    var settled = false, spin = new MessageChannel(), spins = 0;
    return new Promise(function (resolve) {
      var started = false;
      spin.port1.onmessage = function () {
        if (!started && api.searchSettled) { started = true; api.searchSettled.then(function (r) { settled = true; resolve(r); }, function (e) { settled = true; resolve(Promise.reject(e)); }); }
        if (!settled && ++spins < 5e6) spin.port2.postMessage(0);
        else if (!settled) resolve(null);
      };
      setTimeout(function () { spin.port2.postMessage(0); }, window.memsnapSearch.DEBOUNCE_MS + 10);
    }).then(function (r) {
      measure.typed_search_ms = Math.round(performance.now() - t0);
      ok("typed search: in a worker", api.searchMode === "worker", api.searchMode);
      ok("typed search: the counts of the last query", !!r && r.text === typedSearch.count
         && document.querySelector(".count").textContent === r.text + " by frame", JSON.stringify(r && { text: r.text }) + " vs " + typedSearch.count);
      box.value = ""; box.dispatchEvent(new Event("input", { bubbles: true }));
    }, function (e) { errors.push("typed search: " + e); });
  }
  typedCase().then(finish, finish);
  function finish() {
  var res = performance.getEntriesByType("resource");
  ok("the page loads nothing", res.length === 0, res.map(function (r) { return r.name; }).join(" "));
  ok("the page tries to load nothing", violations.length === 0, violations.join(" "));
  ok("no markup from the data ran", window.pwned === undefined, String(window.pwned));
  ok("no element from the data", document.querySelectorAll("img, svg, iframe, object").length === 0);
  document.body.setAttribute("data-measure", JSON.stringify(measure));
  document.body.setAttribute("data-test", errors.length ? "FAIL " + errors.join(" | ") : "PASS");
  }
  }
})();
