/* SPDX-License-Identifier: MIT
 * memsnap view: the timelines' search (after timeline-data.js): an index of the stacks and of each
 * timeline's bands handed to search.js, which matches in a worker (searchAsync) or, without one,
 * on the main thread (searchSync).
 */
(function () {
  "use strict";

  var V = window.memsnapPage, D = V.D, frameRaw = V.frameRaw, elementStack = V.elementStack,
    elementAddr = V.elementAddr;

  /* ---- search (search.js): an index of the stacks and of each timeline's bands -------------- */

  var searcher = null, searchEngine = null, searchKeys = 0;
  function searchQuery(addr, text) {
    return { addr: (addr || "").toLowerCase().replace(/^0x/, "").replace(/^[bs]'/, ""),
             text: (text || "").toLowerCase() };
  }
  function searchInit() {
    var B = D.traceBin, sec = {};
    ["ranks", "ranks_hi", "ranks_lo", "ranks_big", "succ_count", "succ", "n", "at"].forEach(function (k) {
      sec["stacks." + k] = B["stacks." + k];
    });
    return { frames: D.frames.map(function (f, i) { return frameRaw(i).toLowerCase(); }), sections: sec,
             nframes: D.frames.length };
  }
  /* each series' stack and address (-1: none), once per timeline */
  function searchSeries(tl) {
    if (!tl.search) {
      var n = tl.n, stack = new Int32Array(n), addr = new Float64Array(n);
      for (var s = 0; s < n; s++) {
        var e = tl.elem[s];
        var src = e >= 0 ? tl.sources[e] : -1;
        stack[s] = s === tl.summ ? -1 : src >= 0 ? D.trace.stack[src] : elementStack(tl, s);
        addr[s] = s === tl.summ || e < 0 ? -1 : src >= 0 ? D.trace.addr[src] : parseInt(elementAddr(tl, s) || "-1", 16);
      }
      tl.search = { key: "k" + (++searchKeys), stack: stack, addr: addr, sent: false };
    }
    return tl.search;
  }
  /* the same matching, run to its end on the main thread (the API's search; no worker) */
  function searchSync(tl, addr, text) {
    if (!D.traceBin) return { addr: 0, text: 0, match: null }; /* nothing to find before the trace is read */
    if (!searchEngine) { searchEngine = window.memsnapSearch.engine(); searchEngine.init(searchInit(), window.memsnapData.stacks); }
    var x = searchSeries(tl), q = searchQuery(addr, text), it, r;
    searchEngine.series(x);
    q.key = x.key; q.slice = Infinity;
    it = searchEngine.query(q);
    while (!(r = it.next()).done) { /* one slice */ }
    r.value.match = q.addr || q.text ? r.value.match : null;
    return r.value;
  }
  /* the worker, its index built as soon as it starts (the first focus of a search box) */
  function searchStart() {
    if (searcher === null && D.traceBin) {
      searcher = window.memsnapSearch.start(window.memsnapData.stacks) || false;
      if (searcher) searcher.init.apply(null, (function (m) { return [m.frames, m.sections, m.nframes]; })(searchInit()));
    }
    return searcher;
  }
  /* in the worker: null where none could be made (then searchSync) */
  function searchAsync(tl, addr, text, onProgress) {
    if (!searchStart()) return null;
    var x = searchSeries(tl), q = searchQuery(addr, text);
    if (!x.sent) { searcher.series(x.key, x.stack, x.addr); x.sent = true; }
    return searcher.query(x.key, q.addr, q.text, onProgress).then(function (r) {
      if (r && !q.addr && !q.text) r.match = null;
      return r;
    });
  }

  /* the worker failed: search on the main thread from now on */
  function searchOff() { searcher = false; }

  V.searchSync = searchSync; V.searchStart = searchStart; V.searchAsync = searchAsync;
  V.searchOff = searchOff;
})();
