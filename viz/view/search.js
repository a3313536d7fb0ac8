/* SPDX-License-Identifier: MIT
 * memsnap view: the address and frame search, off the main thread (embedded before view.js; no
 * library). docs/view.md, "Search".
 *
 * A Web Worker made from a Blob of this file's own code (the page's CSP allows `worker-src
 * blob:` and nothing else) holds an index built once per device: every frame's text in lower
 * case and every stack's frames (read in one pass with data.js's stacks(), whose source it runs),
 * and, once per timeline, each band's stack and address. A query matches the frames first (one
 * test per distinct frame), then the stacks (one look-up per frame of each), then the bands (one
 * look-up each), in slices: after each slice it reports the counts so far, and a newer query
 * stops an older one. The page waits for typing to pause (DEBOUNCE_MS) before it asks.
 *
 * window.memsnapSearch.engine() is the matching code itself (also run synchronously by the page's
 * API, the tests' reference); window.memsnapSearch.start(stacksSource) returns the searcher
 * {init(frames, sections, nframes), series(key, stack, addr), query(key, addr, text, onProgress)
 * -> Promise of {addr, text, match (Uint8Array: 1 address, 2 frame, 3 both), key}}, or null
 * where no worker can be made (the page then searches on the main thread).
 */
(function () {
  "use strict";

  var DEBOUNCE_MS = 150, SLICE = 262144;

  /* self-contained (its source runs in the worker): the index and the query */
  function engine() {
    var frames = null, stOff = null, stIds = null, bands = {};
    function init(m, stacksOf) {
      frames = m.frames;
      /* typed arrays grown by doubling (a plain array of tens of millions of frame numbers
       * takes seconds and hundreds of MB more); 16 bits a frame where the frames allow */
      var S = m.sections && m.nframes >= 0 ? stacksOf(m.sections, m.nframes) : null;
      var Ids = m.nframes < 65535 ? Uint16Array : Uint32Array, len = 0;
      stOff = new Float64Array((S ? S.n : 0) + 1);
      stIds = new Ids(1 << 20);
      if (S) S.each(function (st, fr) {
        if (len + fr.length > stIds.length) {
          var grown = new Ids(Math.max(2 * stIds.length, len + fr.length));
          grown.set(stIds); stIds = grown;
        }
        for (var i = 0; i < fr.length; i++) stIds[len++] = fr[i];
        stOff[st + 1] = len;
      });
    }
    function series(m) { bands[m.key] = { stack: m.stack, addr: m.addr }; }
    /* a generator of slices: yields the counts so far, returns the result */
    function* query(q) {
      var b = bands[q.key], n = b ? b.stack.length : 0, addr = q.addr, text = q.text;
      var match = new Uint8Array(n), na = 0, nt = 0, fm = null, sm = null, s, i;
      if (text) {
        fm = new Uint8Array(frames.length);
        for (i = 0; i < frames.length; i++) if (frames[i].indexOf(text) >= 0) fm[i] = 1;
        sm = new Uint8Array(stOff.length);
        for (s = 0; s + 1 < stOff.length; s++)
          for (i = stOff[s]; i < stOff[s + 1]; i++) if (fm[stIds[i]]) { sm[s] = 1; break; }
      }
      for (var a = 0; a < n; a += q.slice) {
        for (s = a; s < Math.min(n, a + q.slice); s++) {
          var v = 0, st = b.stack[s];
          if (addr && b.addr[s] >= 0 && b.addr[s].toString(16).indexOf(addr) === 0) { v = 1; na++; }
          if (sm && st >= 0 && st + 1 < stOff.length && sm[st]) { v |= 2; nt++; }
          match[s] = v;
        }
        if (s < n) yield { addr: na, text: nt, done: s / n };
      }
      return { addr: na, text: nt, match: match, key: q.key };
    }
    return { init: init, series: series, query: query };
  }

  /* the worker's own code: the engine, data.js's stacks(), and the messages */
  function workerMain(stacksOf, engineOf) {
    var E = engineOf(), current = 0;
    self.onmessage = function (ev) {
      var m = ev.data;
      if (m.type === "init") E.init(m, stacksOf);
      else if (m.type === "series") E.series(m);
      else if (m.type === "query") {
        current = m.id;
        var it = E.query(m);
        (function step() {
          if (m.id !== current) return; /* a newer query came */
          var r = it.next();
          if (r.done) self.postMessage({ type: "done", id: m.id, r: r.value }, [r.value.match.buffer]);
          else { self.postMessage({ type: "progress", id: m.id, r: r.value }); setTimeout(step, 0); }
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
      series: function (key, stack, addr) { w.postMessage({ type: "series", key: key, stack: stack, addr: addr }); },
      query: function (key, addr, text, onProgress) {
        if (failed) return Promise.reject(new Error("search worker failed"));
        var my = ++id;
        Object.keys(waiting).forEach(function (k) { waiting[k].resolve(null); delete waiting[k]; }); /* superseded */
        return new Promise(function (resolve, reject) {
          waiting[my] = { resolve: resolve, reject: reject, onProgress: onProgress };
          w.postMessage({ type: "query", id: my, key: key, addr: addr, text: text, slice: SLICE });
        });
      },
      terminate: function () { w.terminate(); }
    };
  }

  window.memsnapSearch = { engine: engine, start: start, DEBOUNCE_MS: DEBOUNCE_MS, SLICE: SLICE };
})();
