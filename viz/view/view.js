/* SPDX-License-Identifier: MIT
 * memsnap view: the page (the last of the viewer's scripts). Reads the JSON data elements ms-data
 * and ms-trace-data written by viz/view/view.c, decodes the binary data (data.js), builds the bar
 * (view, device, stream, pool, category, frames, range and search controls), shows the views
 * (timeline.js, history.js, flame.js, explain.js, the settings) and keeps the URL fragment. Its
 * API for the tests and the benchmarks is window.memsnapView.
 */
(function () {
  "use strict";

  var V = window.memsnapPage, A = V.A, D = V.D, hash = V.hash, catOff = V.catOff, el = V.el,
    fmtSize = V.fmtSize, fmtBoth = V.fmtBoth, parseJSON = V.parseJSON, readHash = V.readHash,
    writeHash = V.writeHash, streamName = V.streamName, numberStreams = V.numberStreams,
    hexAddr = V.hexAddr, stackFrames = V.stackFrames, frameText = V.frameText,
    shownFrames = V.shownFrames, resetDevice = V.resetDevice, resetStreams = V.resetStreams,
    streamNumbers = V.streamNumbers, setStacks = V.setStacks, setHash = V.setHash,
    decodeTimeline = V.decodeTimeline, lodIndex = V.lodIndex, elementText = V.elementText,
    elementStack = V.elementStack, elementAddr = V.elementAddr, elementPool = V.elementPool,
    seriesStreams = V.seriesStreams, seriesCat = V.seriesCat, entrySteps = V.entrySteps,
    oomSteps = V.oomSteps, stepMarks = V.stepMarks, resetAddrs = V.resetAddrs,
    stepRange = V.stepRange, lowerBound = V.lowerBound,
    searchStart = V.searchStart, searchAsync = V.searchAsync, searchOff = V.searchOff,
    timelineView = V.timelineView, AllocState = V.AllocState, historyView = V.historyView;

  var VIEWS = [["timeline", "Active Memory Timeline"],
               ["pools", "Allocated Memory (incl. Private Pools)"],
               ["segments", "Active Cached Segment Timeline"],
               ["history", "Allocator State History"],
               ["settings", "Allocator Settings"],
               ["flame", "Alive at the selected moment (flame graph)"],
               ["explain", "Explain: why it ran out or peaked"]];

  var app = null;
  var current = null;    /* the view shown: {name, destroy()} */

  /* ---- settings ----------------------------------------------------------------------------- */

  function settingsView(root) {
    var pre = el("pre", "settings", root);
    pre.textContent = D.has_settings ? JSON.stringify(D.settings, null, 2) : "No allocator settings found.";
    return { name: "settings", destroy: function () {} };
  }

  /* ---- the flame graph of what is alive at the selected moment ------------------------------ */

  function flameView(root, tl) {
    return window.memsnapFlame.view(root, tl, {
      D: D, selectedT: V.selectedT, el: el, fmtSize: fmtSize, fmtBoth: fmtBoth, elementStack: elementStack,
      shownFrames: shownFrames, stackFrames: stackFrames, frameText: frameText, elementAddr: elementAddr,
      streamName: streamName, seriesCat: seriesCat });
  }

  /* ---- the page ----------------------------------------------------------------------------- */

  /* The Explain panel (explain.js): the device's answer, and the state at the moment chosen on a
   * timeline (after the entries whose timestep is at or before it). */
  function explainView(root) {
    var sel = -1;
    if (D.trace && V.selectedT >= 0 && TL) {
      var st = entrySteps(TL);
      sel = 0;
      while (sel < st.length - 1 && st[sel] <= V.selectedT) sel++;
    }
    return window.memsnapExplain.view(root, {
      el: el, fmtSize: fmtSize, fmtBoth: fmtBoth, answer: D.explain, trace: D.trace, A: A,
      selected: sel,
      stateAt: D.trace ? function (step) {
        var s = new AllocState();
        s.moveTo(step);
        return { segs: s.segs, blocks: Array.from(s.blocks.values()) };
      } : null });
  }

  var TL = null, SEG = null, PTL = null;

  /* "Allocated Memory (incl. Private Pools)": replayed in the page when first shown (replay.js) */
  function poolsTimeline() {
    if (!PTL && TL.budget) {
      /* the replay draws every allocation on its own: past the budget it would need what the
       * budget avoided (docs/view.md, "The budget") */
      PTL = TL;
      api.poolsTimeline = PTL;
    }
    if (!PTL) {
      PTL = window.memsnapReplay({ trace: D.trace, segments: D.segments, segmentsView: false, pools: true });
      lodIndex(PTL);
      api.poolsTimeline = PTL;
    }
    return PTL;
  }

  function showView(name, bar, holder) {
    if (current && current.destroy) current.destroy();
    holder.textContent = "";
    hash.view = name; writeHash();
    var v = el("div", "view", holder);
    v.setAttribute("role", "region");
    VIEWS.forEach(function (x) { if (x[0] === name) v.setAttribute("aria-label", x[1]); });
    if (!D.trace && name !== "timeline" && name !== "segments" && name !== "settings" &&
        name !== "explain") {
      el("div", "note", v, "The trace is still being read: this view opens when it is.");
      current = { name: name, destroy: function () {} };
      api.view = current;
      return;
    }
    if (name === "segments") current = timelineView(v, SEG, "segments");
    else if (name === "history") current = historyView(v);
    else if (name === "settings") current = settingsView(v);
    else if (name === "flame") current = flameView(v, TL);
    else if (name === "explain") current = explainView(v);
    else if (name === "pools") {
      var ptl = poolsTimeline();
      el("div", "note", v, ptl === TL
        ? "This view replays every allocation in the page, which past the page's budget would take "
          + "what the budget avoids; the Active Memory Timeline, summarized, is shown instead."
        : ptl.envelopes.length
        ? "Blocks of private pools (CUDA graphs, MemPool) are the half transparent stripes inside "
          + "their pool's grey envelope, as tall as the pool's reserved memory (it never shrinks); "
          + ptl.envelopes.length + " pool envelope(s)."
        : "No private pool on this device (every segment is in the default pool (0, 0)): this is "
          + "the Active Memory Timeline.");
      current = timelineView(v, ptl, "pools");
    } else current = timelineView(v, TL, "timeline");
    bar.search.style.display = name === "timeline" || name === "segments" || name === "pools" ? "" : "none";
    if (bar.rangeShown) bar.rangeShown();
    api.view = current;
  }

  var api = { ready: false };

  /* when each step of the first paint ended (ms since navigation; bench/view_page.sh) */
  function phase(name) { (api.phases = api.phases || {})[name] = Math.round(performance.now()); }

  function main() {
    phase("script");
    app = document.getElementById("app");
    var data = parseJSON("ms-data");
    Object.keys(data).forEach(function (k) { D[k] = data[k]; });
    phase("json");
    app.textContent = "Reading the data...";
    D.nstacks = 0;
    return window.memsnapData.load(D.bin, "ms-bin", phase).then(function (B) {
      D.bin = B;
      api.stackFrames = stackFrames; api.hexAddr = hexAddr; api.entrySteps = entrySteps; api.oomSteps = oomSteps;
      api.elementPool = elementPool; api.streams = seriesStreams;
      var h = readHash();
      useDevice(h.device !== undefined && D.devices.indexOf(+h.device) >= 0 ? +h.device : D.device);
      phase("decoded");
      /* the views that need the trace wait for it */
      var first = h.view || D.view || "timeline";
      if (first === "timeline" || first === "segments" || first === "settings") build();
      phase("painted");
      /* the traces and the stacks after the first paint: only texts, search, filters, the
       * state history, the pools view and the flame graph need them; they come after the script
       * in the page, so wait until it is all parsed */
      return new Promise(function (ok) {
        if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ok);
        else ok();
      });
    }).then(function () {
      var td = parseJSON("ms-trace-data");
      D.pools = td.pools;
      phase("parsed");
      return window.memsnapData.load(td.trace_bin, "ms-trace", function (name) { phase("trace " + name); });
    }).then(function (TB) {
      D.traceBin = TB;
      D.nstacks = setStacks(window.memsnapData.stacks(TB, D.frames.length)).n;
      attachTrace();
      build();
      api.stacksMs = performance.now();
    });
  }

  /* The trace of the device shown, once the page has read it (null before). */
  function attachTrace() {
    var B = D.traceBin, p = "d" + D.device + ".trace.";
    if (!B) { D.trace = null; return; }
    D.trace = { action: B[p + "action"], addr: B[p + "addr"], size: B[p + "size"],
                stream: B[p + "stream"], time: B[p + "time"], stack: B[p + "stack"],
                pool: B[p + "pool"] };
    resetStreams();
    numberStreams(D.trace);
  }

  /* Every listed device is in the page (sections d<N>.*, per_device[k]); one is shown. */
  function useDevice(dev) {
    var B = D.bin, pd = null;
    D.per_device.forEach(function (x) { if (x.device === dev) pd = x; });
    D.device = dev;
    D.segments = pd.segments;
    D.ntrace = pd.ntrace;
    D.explain = pd.explain;
    D.steps = pd.steps || [];
    resetDevice();
    V.selectedT = -1;
    attachTrace();
    resetAddrs();
    PTL = null;
    TL = decodeTimeline(B, "d" + dev + ".tl", pd.tl, false);
    SEG = decodeTimeline(B, "d" + dev + ".seg", pd.seg, true);
    V.streamFilter = -1;
    V.poolFilter = "";
    api.data = D; api.timeline = TL; api.segmentTimeline = SEG;
  }

  /* Colour by category, and the categories' legend, each a checkbox that shows or hides its
   * bands (docs/categories.md; the memory timeline's bands, whose .cat section the page has). */
  function categoryControls(bar) {
    if (!D.categories || !TL || !TL.cat) return;
    var lc = el("label", "", bar, "Colour "), csel = el("select", "", lc);
    el("option", "", csel, "allocation").value = "allocation";
    el("option", "", csel, "category").value = "category";
    csel.value = V.colorBy;
    var legend = el("span", "legend", bar);
    legend.style.display = V.colorBy === "category" ? "" : "none";
    D.categories.forEach(function (name, k) {
      var lab = el("label", "cat", legend), box = el("input", "", lab);
      box.type = "checkbox";
      box.checked = !catOff[k];
      box.dataset.category = name;
      var sw = el("span", "swatch", lab, "\u25a0");
      sw.style.color = D.category_colors[k];
      el("span", "", lab, name + " ");
      box.addEventListener("change", function () {
        catOff[k] = !box.checked;
        hash.hide = D.categories.filter(function (n, j) { return catOff[j]; }).join(",");
        writeHash();
        if (current && current.draw) current.draw();
      });
    });
    function setColor(v) {
      V.colorBy = v; csel.value = v;
      legend.style.display = v === "category" ? "" : "none";
      hash.color = v; writeHash();
      if (current && current.draw) current.draw();
    }
    csel.addEventListener("change", function () { setColor(csel.value); });
    api.colorBy = setColor;
    api.hideCategory = function (name, hide) {
      var k = D.categories.indexOf(name);
      if (k < 0) return;
      catOff[k] = hide;
      legend.querySelectorAll("input")[k].checked = !hide;
      if (current && current.draw) current.draw();
    };
    /* the bytes of each category at step t of the memory timeline (for the tests and hovers) */
    api.categoryBytes = function (t) {
      var out = D.categories.map(function () { return 0; });
      for (var s = 0; s < TL.n; s++) {
        if (s === TL.summ || !(TL.tmin[s] <= t && t < TL.tmax[s])) continue;
        var c = seriesCat(TL, s);
        if (c >= 0) out[c] += TL.size[s];
      }
      return out;
    };
  }

  function build() {
    app.textContent = "";
    var bar = el("div", "bar", app);
    bar.setAttribute("role", "group");
    bar.setAttribute("aria-label", "memsnap view: the view shown and its filters");
    el("span", "title", bar, window.memsnapFrames.safe(D.title || "snapshot"));
    var lv = el("label", "", bar, "View ");
    var sel = el("select", "", lv);
    VIEWS.forEach(function (v) { var o = el("option", "", sel, v[1]); o.value = v[0]; });
    var ld = el("label", "", bar, "Device "), dsel = el("select", "", ld);
    D.devices.forEach(function (d) { var o = el("option", "", dsel, String(d)); o.value = String(d); });
    dsel.value = String(D.device);
    dsel.addEventListener("change", function () {
      var view = sel.value;
      if (current && current.destroy) current.destroy();
      current = null;
      useDevice(+dsel.value);
      setHash({ view: view, device: D.device });
      writeHash();
      build();
    });
    api.device = function (d) { dsel.value = String(d); dsel.dispatchEvent(new Event("change")); };
    var ls = el("label", "", bar, "Stream "), ssel = el("select", "", ls), seen = {};
    var oall = el("option", "", ssel, "all"); oall.value = "-1";
    var ids = streamNumbers();
    Object.keys(ids).forEach(function (k) { seen[ids[k]] = true; });
    Object.keys(seen).map(Number).sort(function (a, b) { return a - b; }).forEach(function (k) {
      var o = el("option", "", ssel, String(k)); o.value = String(k);
    });
    ssel.value = String(V.streamFilter);
    ssel.addEventListener("change", function () {
      V.streamFilter = +ssel.value;
      if (current && current.draw) current.draw();
    });
    api.stream = function (k) { ssel.value = String(k); V.streamFilter = k; if (current && current.draw) current.draw(); };
    /* the pool selector: the pools of this device's segments and of its trace entries */
    var lp = el("label", "", bar, "Pool "), psel = el("select", "", lp), pools = {};
    D.segments.forEach(function (g) { pools[g.pool[0] + "," + g.pool[1]] = g.pool; });
    (D.pools || []).forEach(function (p) { pools[p[0] + "," + p[1]] = p; });
    el("option", "", psel, "all").value = "";
    Object.keys(pools).sort().forEach(function (k) {
      var p = pools[k];
      el("option", "", psel, "(" + p[0] + ", " + p[1] + ")" + (p[0] === 0 && p[1] === 0 ? " default" : "")).value = k;
    });
    el("option", "", psel, "unknown").value = "unknown";
    function setPool(k) {
      V.poolFilter = k; psel.value = k;
      hash.pool = k; writeHash();
      if (current && current.draw) current.draw();
    }
    psel.addEventListener("change", function () { setPool(psel.value); });
    api.pool = setPool;
    categoryControls(bar);
    /* the frame filter: PyTorch's viewer hides the unwinder's and the interpreter's frames */
    var lf = el("label", "", bar), fbox = el("input", "", lf);
    el("span", "", lf, "all frames");
    fbox.type = "checkbox";
    lf.title = "Show the frames PyTorch's viewer hides (torch::unwind, gather, _PyEval_EvalFrameDefault, "
      + "Register..., the caching allocator's)";
    function setAllFrames(on) {
      V.allFrames = !!on; fbox.checked = V.allFrames;
      hash.frames = V.allFrames ? "all" : ""; writeHash();
      if (current) showView(sel.value, bar, holder);
    }
    fbox.addEventListener("change", function () { setAllFrames(fbox.checked); });
    api.allFrames = setAllFrames;
    /* the time-range selector, in the timesteps of the timeline shown (the x axis' unit); kept as
     * the trace entries A..B whose steps those are (V.range, the URL's from and to), so that it
     * carries to the other timelines */
    var lr = el("span", "", bar), lra = el("label", "", lr, "Steps "), ra = el("input", "range", lra);
    var lrb = el("label", "", lr, " to "), rb = el("input", "range", lrb), rclear = el("button", "", lr, "all");
    ra.type = rb.type = "number"; ra.min = rb.min = "0";
    ra.setAttribute("aria-label", "the first timestep shown");
    rb.setAttribute("aria-label", "the last timestep shown");
    rclear.setAttribute("aria-label", "show every timestep");
    /* the boxes: the steps the range gives on the timeline shown */
    function rangeShown() {
      var tl = current && current.tl;
      lr.style.display = tl ? "" : "none";
      if (!tl) return;
      ra.max = rb.max = String(tl.nT);
      var s = V.range && D.trace ? stepRange(tl) : null;
      ra.value = s ? String(s[0]) : ""; rb.value = s ? String(s[1]) : "";
    }
    bar.rangeShown = rangeShown;
    function setRange(a, b) {
      V.range = a === null || isNaN(a) || isNaN(b) ? null : [Math.min(a, b), Math.max(a, b)];
      hash.from = V.range ? V.range[0] : ""; hash.to = V.range ? V.range[1] : ""; writeHash();
      if (current && current.applyRange) current.applyRange();
      rangeShown();
    }
    /* steps typed: the entries from the first whose step is at or after the first step to the
     * last whose step ends at or before the last one */
    function rangeInput() {
      var tl = current && current.tl;
      if (ra.value === "" || rb.value === "" || !tl || !D.trace || !D.ntrace) return;
      var sa = parseInt(ra.value, 10), sb = parseInt(rb.value, 10);
      if (isNaN(sa) || isNaN(sb)) return;
      var st = entrySteps(tl), n = st.length - 1, lo = Math.min(sa, sb), hi = Math.max(sa, sb, lo + 1);
      var a = Math.min(n - 1, lowerBound(st, 0, n, lo)), e = lowerBound(st, 0, n + 1, hi);
      setRange(a, Math.max(a, Math.min(n - 1, e - 1)));
    }
    ra.addEventListener("change", rangeInput);
    rb.addEventListener("change", rangeInput);
    rclear.addEventListener("click", function () { setRange(null, null); });
    api.range = setRange;
    api.stepMarks = stepMarks;
    api.elementText = elementText;
    var search = el("span", "", bar);
    var la = el("label", "", search, "address "), ia = el("input", "", la);
    var lt = el("label", "", search, " frame "), it = el("input", "", lt);
    ia.type = it.type = "text";
    var cnt = el("span", "count", search);
    function counts(r, more) {
      cnt.textContent = (ia.value ? r.addr + " by address" : "") + (ia.value && it.value ? ", " : "")
        + (it.value ? r.text + " by frame" : "") + (more ? " so far (" + Math.round(100 * more) + "%)" : "");
    }
    function doSearch() {
      if (!current || !current.search) return;
      var r = current.search(ia.value, it.value);
      counts(r);
      api.lastSearch = r;
    }
    /* typing: the worker answers once typing pauses, the counts as they come (search.js) */
    var pause = null;
    function typed() {
      clearTimeout(pause);
      pause = setTimeout(function () {
        var view = current, tl = view && view.tl;
        if (!view || !view.search) return;
        if (!D.trace || !tl) { doSearch(); return; }
        cnt.textContent = "searching...";
        var p = searchAsync(tl, ia.value, it.value, function (r) { counts(r, r.done); });
        if (!p) { api.searchMode = "main thread"; doSearch(); return; }
        api.searchMode = "worker";
        api.searchSettled = p.then(function (r) {
          if (!r || current !== view) return r; /* superseded, or another view */
          view.setMatches(r.match);
          counts(r);
          api.lastSearch = r;
          return r;
        }, function () { searchOff(); doSearch(); return api.lastSearch; });
      }, window.memsnapSearch.DEBOUNCE_MS);
    }
    ia.addEventListener("input", typed);
    it.addEventListener("input", typed);
    ia.addEventListener("focus", searchStart);
    it.addEventListener("focus", searchStart);
    api.searchInputs = [ia, it];
    bar.search = search;
    var holder = el("div", "view", app);
    setHash(readHash());
    hash.device = D.device;
    var first = hash.view || D.view || "timeline";
    if (!VIEWS.some(function (v) { return v[0] === first; })) first = "timeline";
    if (hash.t !== undefined) V.selectedT = +hash.t;
    V.allFrames = hash.frames === "all"; fbox.checked = V.allFrames;
    if (hash.pool !== undefined && (hash.pool === "unknown" || pools[hash.pool])) {
      V.poolFilter = hash.pool; psel.value = hash.pool;
    }
    if (hash.color === "category" && api.colorBy) api.colorBy("category");
    if (hash.hide && D.categories && api.hideCategory)
      hash.hide.split(",").forEach(function (n) { api.hideCategory(n, true); });
    V.range = null;
    if (hash.from !== undefined && hash.to !== undefined && D.trace && D.ntrace > 0) {
      var fa = parseInt(hash.from, 10), fb = parseInt(hash.to, 10);
      if (fa >= 0 && fb >= 0) { V.range = [Math.min(fa, fb), Math.max(fa, fb)]; }
    }
    sel.value = first;
    sel.addEventListener("change", function () { showView(sel.value, bar, holder); });
    api.show = function (name) { sel.value = name; showView(name, bar, holder); };
    api.search = function (a, t) { ia.value = a || ""; it.value = t || ""; doSearch(); return api.lastSearch; };
    api.select = function (t) { V.selectedT = t; };
    showView(first, bar, holder);
    if (!api.ready) api.readyMs = performance.now();
    api.ready = true;
    document.body.setAttribute("data-status", "ready");
  }

  window.memsnapView = api;
  window.addEventListener("error", function (ev) {
    document.body.setAttribute("data-status", "error");
    document.body.setAttribute("data-error", String(ev.message));
  });
  function fail(e) {
    document.body.setAttribute("data-status", "error");
    document.body.setAttribute("data-error", String(e && e.stack || e));
    var box = el("div", "err", document.getElementById("app") || document.body);
    box.textContent = "memsnap view could not draw this page: " + e;
  }
  try {
    api.whenReady = main().catch(fail);
  } catch (e) {
    fail(e);
    api.whenReady = Promise.resolve();
  }
})();
