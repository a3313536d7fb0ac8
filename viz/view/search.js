/* SPDX-License-Identifier: MIT
 * memsnap view: the address and frame search, off the main thread (embedded before view.js; no
 * library). docs/view.md, "Search".
 *
 * A Web Worker made from a Blob of this file's own code (the page's CSP allows `worker-src
 * blob:` and nothing else) holds an index built once per device: every frame's text in lower
 * case and every stack's frames (read in one pass with data.js's stacks(), whose source it runs),
 * and, once per timeline, each band's stack and address. A query matches the frames first (one
 * test per distinct frame), then the bands, each by its stack (read once per query, up to its
 * first matching frame), in slices of at most SLICE_MS: after each slice it reports the counts so
 * far, and a newer query stops an older one. A query that narrows the one before it (one more
 * letter typed) tests only the bands the older one matched. The page asks at each keystroke.
 *
 * window.memsnapSearch.engine() is the matching code itself (also run synchronously by the page's
 * API, the tests' reference); window.memsnapSearch.start(stacksSource) returns the searcher
 * {init(frames, sections, nframes), series(key, stack, addr, size), query(key, addr, text,
 * onProgress) -> Promise of {addr, text, match (Uint8Array: 1 address, 2 frame, 3 both), key,
 * ranked (the matched bands by size, largest first; null without sizes)}}, or null
 * where no worker can be made (the page then searches on the main thread).
 */
(function () {
  "use strict";

  /* Typing posts a query at once (no pause: the worker drops an older query at its next slice);
   * a slice of the band phase lasts at most SLICE_MS. */
  var DEBOUNCE_MS = 0, SLICE_MS = 12;

  /* self-contained (its source runs in the worker): the index and the query */
  function engine() {
    var frames = null, stOff = null, stIds = null, nst = 0, bands = {}, last = null;
    var now = typeof performance !== "undefined" ? function () { return performance.now(); } : Date.now;
    function init(m, stacksOf) {
      frames = m.frames;
      /* typed arrays grown by doubling (a plain array of tens of millions of frame numbers
       * takes seconds and hundreds of MB more); 16 bits a frame where the frames allow */
      var S = m.sections && m.nframes >= 0 ? stacksOf(m.sections, m.nframes) : null;
      var Ids = m.nframes < 65535 ? Uint16Array : Uint32Array, len = 0;
      nst = S ? S.n : 0;
      stOff = new Float64Array(nst + 1);
      stIds = new Ids(1 << 20);
      if (S) S.each(function (st, fr) {
        if (len + fr.length > stIds.length) {
          var grown = new Ids(Math.max(2 * stIds.length, len + fr.length));
          grown.set(stIds); stIds = grown;
        }
        for (var i = 0; i < fr.length; i++) stIds[len++] = fr[i];
        stOff[st + 1] = len;
      });
      last = null;
    }
    /* the bands by size, largest first (of equal sizes, in order): a counting sort over the
     * distinct sizes, once per timeline */
    function bySize(size) {
      var n = size.length, at = new Map(), i;
      for (i = 0; i < n; i++) at.set(size[i], (at.get(size[i]) || 0) + 1);
      var sizes = Float64Array.from(at.keys()).sort(), pos = 0;
      for (i = sizes.length - 1; i >= 0; i--) { var c = at.get(sizes[i]); at.set(sizes[i], pos); pos += c; }
      var order = new Int32Array(n);
      for (i = 0; i < n; i++) { var k = at.get(size[i]); order[k] = i; at.set(size[i], k + 1); }
      return order;
    }
    function series(m) {
      bands[m.key] = { stack: m.stack, addr: m.addr, order: m.size ? bySize(m.size) : null };
    }
    /* A generator of slices: yields the counts so far, returns the result. A query that narrows
     * the one before it (its text contains the older text, its address starts with the older
     * address) tests again only the bands that the older one matched, as far as the older one
     * got (where the same frames match, it takes the older answer as it is); the stacks' answers
     * are kept for the query (a stack is read once, however many bands have it). q.slice: the
     * most milliseconds of a slice (Infinity: one slice). */
    function* query(q) {
      var b = bands[q.key], n = b ? b.stack.length : 0, addr = q.addr, text = q.text;
      var match = new Uint8Array(n), na = 0, nt = 0, fm = null, sm = null, s, i, v, st, m;
      var p = last && last.key === q.key ? last : null, upto = p ? p.upto : 0, pm = p ? p.match : null;
      var refT = !!(p && text && p.text && text.indexOf(p.text) >= 0);
      var refA = !!(p && addr && p.addr && addr.indexOf(p.addr) === 0);
      var cur = { key: q.key, addr: addr, text: text, match: match, upto: 0, fm: null };
      last = cur;
      if (text) {
        fm = cur.fm = new Uint8Array(frames.length);
        for (i = 0; i < frames.length; i++) if (frames[i].indexOf(text) >= 0) fm[i] = 1;
        sm = new Uint8Array(nst); /* 0 not read yet, 1 no match, 2 a match */
      }
      /* the same frames match as before (the rest of a word typed): the same bands, as far as
       * the older query got */
      var sameT = refT && !!p.fm;
      for (i = 0; sameT && i < fm.length; i++) if (fm[i] !== p.fm[i]) sameT = false;
      var t0 = now(), slice = q.slice > 0 ? q.slice : Infinity;
      for (s = 0; s < n; s++) {
        v = 0;
        if (addr && !(refA && s < upto && !(pm[s] & 1)) && b.addr[s] >= 0
            && b.addr[s].toString(16).indexOf(addr) === 0) { v = 1; na++; }
        st = b.stack[s];
        if (sameT && s < upto) { if (pm[s] & 2) { v |= 2; nt++; } }
        else if (sm && st >= 0 && st < nst && !(refT && s < upto && !(pm[s] & 2))) {
          m = sm[st];
          if (m === 0) {
            m = 1;
            for (i = stOff[st]; i < stOff[st + 1]; i++) if (fm[stIds[i]]) { m = 2; break; }
            sm[st] = m;
          }
          if (m === 2) { v |= 2; nt++; }
        }
        match[s] = v;
        if ((s & 4095) === 4095 && s + 1 < n) {
          cur.upto = s + 1;
          if (now() - t0 > slice) { yield { addr: na, text: nt, done: (s + 1) / n }; t0 = now(); }
        }
      }
      cur.upto = n;
      /* the matched bands by size, largest first: the page outlines the largest in its window
       * from their head */
      var ranked = null;
      if (b && b.order) {
        ranked = new Int32Array(na + nt);
        for (i = 0, m = 0; i < n; i++) if (match[b.order[i]]) ranked[m++] = b.order[i];
        ranked = ranked.subarray(0, m);
      }
      return { addr: na, text: nt, match: match, key: q.key, ranked: ranked };
    }
    return { init: init, series: series, query: query };
  }

  /* the worker's own code: the engine, data.js's stacks(), and the messages. A slice ends with a
   * message to itself (not a timer, which browsers hold back to 4 ms once nested), so that a
   * newer query, queued before it, is read first. */
  function workerMain(stacksOf, engineOf) {
    var E = engineOf(), current = 0, tick = new MessageChannel(), next = null;
    tick.port1.onmessage = function () { var f = next; next = null; if (f) f(); };
    self.onmessage = function (ev) {
      var m = ev.data;
      if (m.type === "init") E.init(m, stacksOf);
      else if (m.type === "series") E.series(m);
      else if (m.type === "query") {
        current = m.id;
        var it = E.query(m), t0 = performance.now();
        (function step() {
          if (m.id !== current) return; /* a newer query came */
          var r = it.next();
          if (r.done) {
            /* the worker keeps its answer (the next query may narrow it) and sends a copy */
            var out = { addr: r.value.addr, text: r.value.text, key: r.value.key, match: r.value.match.slice(),
                        ranked: r.value.ranked ? r.value.ranked.slice() : null, ms: performance.now() - t0 };
            self.postMessage({ type: "done", id: m.id, r: out },
                             out.ranked ? [out.match.buffer, out.ranked.buffer] : [out.match.buffer]);
          } else { self.postMessage({ type: "progress", id: m.id, r: r.value }); next = step; tick.port2.postMessage(0); }
        })();
      }
    };
  }

  function start(stacksOf) {
    var w;
    try {
      var src = "(" + workerMain.toString() + ")(" + stacksOf.toString() + ", " + engine.toString() + ");";
      w = new Worker(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
    } catch (e) {
      return null;
    }
    var id = 0, waiting = {}, failed = false;
    w.onmessage = function (ev) {
      var m = ev.data, p = waiting[m.id];
      if (!p) return;
      if (m.type === "progress") { if (p.onProgress) p.onProgress(m.r); return; }
      delete waiting[m.id];
      p.resolve(m.r);
    };
    w.onerror = function (e) {
      failed = true;
      Object.keys(waiting).forEach(function (k) { waiting[k].reject(new Error("search worker: " + (e.message || "failed"))); });
      waiting = {};
    };
    return {
      init: function (frames, sections, nframes) {
        w.postMessage({ type: "init", frames: frames, sections: sections, nframes: nframes });
      },
      series: function (key, stack, addr, size) {
        w.postMessage({ type: "series", key: key, stack: stack, addr: addr, size: size || null });
      },
      query: function (key, addr, text, onProgress) {
        if (failed) return Promise.reject(new Error("search worker failed"));
        var my = ++id;
        Object.keys(waiting).forEach(function (k) { waiting[k].resolve(null); delete waiting[k]; }); /* superseded */
        return new Promise(function (resolve, reject) {
          waiting[my] = { resolve: resolve, reject: reject, onProgress: onProgress };
          w.postMessage({ type: "query", id: my, key: key, addr: addr, text: text, slice: SLICE_MS });
        });
      },
      terminate: function () { w.terminate(); }
    };
  }

  /* The first k of ranked (band numbers, largest first) that keep(i) accepts. */
  function firstOf(ranked, keep, k) {
    var out = [];
    for (var j = 0; j < ranked.length && out.length < k; j++) if (keep(ranked[j])) out.push(ranked[j]);
    return out;
  }

  /* The k largest of the items each(visit) visits that keep(i) accepts, by size[i], in the order
   * visited (of equal sizes at the cut, the first visited): two passes and a selection in typed
   * arrays (no sort), so that outlining the matches among millions of bands costs milliseconds. */
  function largest(n, each, keep, size, k) {
    var idx = new Int32Array(n), inOrder = new Float64Array(n), c = 0, out = [], j;
    each(function (i) { if (keep(i)) { inOrder[c] = size[i]; idx[c++] = i; } });
    if (c <= k) { for (j = 0; j < c; j++) out.push(idx[j]); return out; }
    /* the k-th largest: Hoare's selection, in place in a copy of the sizes; where there are many,
     * of those at least a threshold read from a sample (about 3 k of them), which hold the k
     * largest whenever they are k or more */
    var sz = null;
    if (c > 64 * k) {
      var S = 2048, smp = new Float64Array(S), m = 0;
      for (j = 0; j < S; j++) smp[j] = inOrder[Math.floor((j + 0.5) * c / S)];
      smp.sort();
      var q = smp[Math.floor(S * (1 - 3 * k / c))];
      for (j = 0; j < c; j++) if (inOrder[j] >= q) m++;
      if (m >= k) {
        sz = new Float64Array(m); m = 0;
        for (j = 0; j < c; j++) if (inOrder[j] >= q) sz[m++] = inOrder[j];
      }
    }
    if (!sz) sz = inOrder.slice(0, c);
    var lo = 0, hi = sz.length - 1, want = sz.length - k;
    while (lo < hi) {
      var pivot = sz[(lo + hi) >> 1], a = lo, b = hi, t;
      while (a <= b) {
        while (sz[a] < pivot) a++;
        while (sz[b] > pivot) b--;
        if (a <= b) { t = sz[a]; sz[a] = sz[b]; sz[b] = t; a++; b--; }
      }
      if (want <= b) hi = b; else if (want >= a) lo = a; else break;
    }
    var cut = sz[want], above = 0;
    for (j = 0; j < c; j++) if (inOrder[j] > cut) above++;
    var ties = k - above;
    for (j = 0; j < c; j++) {
      var v = inOrder[j];
      if (v > cut || (v === cut && ties-- > 0)) out.push(idx[j]);
    }
    return out;
  }

  window.memsnapSearch = { engine: engine, start: start, largest: largest, firstOf: firstOf, DEBOUNCE_MS: DEBOUNCE_MS, SLICE_MS: SLICE_MS };
})();
