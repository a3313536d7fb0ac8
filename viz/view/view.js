/* SPDX-License-Identifier: MIT
 * memsnap view: the page's script (embedded into the page at build time; no library, no network).
 * Reads the JSON data elements ms-tl, ms-seg and ms-data written by viz/view/view.c and draws the
 * views on canvases. Every name from the data is shown through textContent only.
 * docs/view.md describes the views, their colours, the keys and how the drawing scales.
 */
(function () {
  "use strict";

  var TABLEAU10 = ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f",
                   "#edc949", "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"];
  var VIEWS = [["timeline", "Active Memory Timeline"],
               ["pools", "Allocated Memory (incl. Private Pools)"],
               ["segments", "Active Cached Segment Timeline"],
               ["history", "Allocator State History"],
               ["settings", "Allocator Settings"],
               ["flame", "Alive at the selected moment (flame graph)"],
               ["explain", "Explain: why it ran out or peaked"]];
  var A = { ALLOC: 0, FREE_REQ: 1, FREE_DONE: 2, SEG_ALLOC: 3, SEG_FREE: 4, SEG_MAP: 5,
            SEG_UNMAP: 6, SNAPSHOT: 7, OOM: 8 };

  var D = null;          /* ms-data */
  var app = null;
  var current = null;    /* the view shown: {name, destroy()} */
  var selectedT = -1;    /* the moment (timestep of the memory timeline) chosen by a click */
  var hash = {};         /* the URL fragment's state */
  var streamFilter = -1; /* the stream whose bands the timelines show (-1: all) */
  var poolFilter = "";   /* the pool ("a,b", "unknown") whose bands the timelines show ("": all) */
  var colorBy = "allocation"; /* the bands' colours: "allocation" (MemoryViz's) or "category" */
  var catOff = {};            /* categories (their index in D.categories) whose bands are hidden */
  var range = null;      /* the time-range selector: [first entry, last entry] or null */

  /* ---- helpers ------------------------------------------------------------------------------ */

  function el(tag, cls, parent, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  /* PyTorch's formatSize: "605.0KiB" */
  function fmtSize(n) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"], i = 0, v = Math.abs(n);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (n < 0 ? "-" : "") + v.toFixed(1) + units[i];
  }
  function fmtBoth(n) { return fmtSize(n) + " (" + n + " bytes)"; }

  function parseJSON(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function readHash() {
    var h = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) h[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1));
    });
    return h;
  }
  function writeHash() {
    var parts = [];
    Object.keys(hash).forEach(function (k) {
      if (hash[k] !== undefined && hash[k] !== null && hash[k] !== "")
        parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(hash[k]));
    });
    try { history.replaceState(null, "", "#" + parts.join("&")); } catch (e) { /* file: */ }
  }

  /* ---- the snapshot's facts ----------------------------------------------------------------- */

  var streamIds = {};
  function streamName(raw) {
    var k = String(raw);
    if (!(k in streamIds)) streamIds[k] = raw === 0 ? 0 : Object.keys(streamIds).length;
    return streamIds[k];
  }

  /* Streams are numbered as MemoryViz numbers them: in order of first use in the trace, then in
   * the segments (one cheap pass: streams are few and change rarely from entry to entry). */
  function numberStreams(tr) {
    var n = tr.stream.length, last = NaN;
    for (var i = 0; i < n; i++) if (tr.stream[i] !== last) { last = tr.stream[i]; streamName(last); }
    D.segments.forEach(function (s) { streamName(s.stream); });
  }
  /* Annotation as MemoryViz: the version of each address at each trace entry; computed when a
   * text first needs it (hover, the state history), not before the first paint. */
  function versions() {
    var tr = D.trace;
    if (!tr.ver) annotate(tr);
    return tr;
  }
  function annotate(tr) {
    var n = tr.action.length, bver = new Map(), sver = new Map();
    var ver = new Int32Array(n);
    for (var i = 0; i < n; i++) {
      var a = tr.action[i], key = tr.addr[i];
      if (a === A.FREE_DONE) { var v = bver.get(key) || 0; ver[i] = v; bver.set(key, v + 1); }
      else if (a === A.ALLOC || a === A.FREE_REQ) ver[i] = bver.get(key) || 0;
      else if (a === A.SEG_FREE || a === A.SEG_UNMAP) {
        var w = sver.get(key) || 0; ver[i] = w; sver.set(key, w + 1);
      } else if (a === A.SEG_ALLOC || a === A.SEG_MAP) ver[i] = sver.get(key) || 0;
    }
    tr.ver = ver;
    tr.bver = bver;
    tr.sver = sver;
  }

  function hexAddr(i) { return D.trace.addr[i].toString(16); }
  /* the trace's own pool column (segment events carry it; an alloc's is found by address) */
  function poolOf(i) { var k = D.trace.pool[i]; return k >= 0 ? D.pools[k] : null; }
  var STK = null; /* the stacks (data.js), decoded one at a time */
  function stackFrames(st) { return STK ? STK.frames(st) : new Uint32Array(0); }
  function frameRaw(fi) {
    var f = D.frames[fi];
    return f[0] + ":" + f[1] + ":" + f[2];
  }
  /* a frame as shown: its bidirectional controls and lone surrogates escaped (frames.js) */
  function frameText(fi) { return window.memsnapFrames.safe(frameRaw(fi)); }
  /* The frames of a stack that are shown: without those PyTorch's viewer leaves out (frames.js),
   * unless the "all frames" box is ticked. */
  var allFrames = false, keptFrame = null;
  function shownFrames(st) {
    var fr = stackFrames(st);
    if (allFrames) return fr;
    if (!keptFrame) {
      keptFrame = new Uint8Array(D.frames.length);
      D.frames.forEach(function (f, i) { keptFrame[i] = window.memsnapFrames.keep(String(f[0]), String(f[2])) ? 1 : 2; });
    }
    return fr.filter(function (f) { return keptFrame[f] === 1; });
  }
  /* Innermost first, consecutive duplicates collapsed as the viewer does. */
  function stackText(stack) {
    if (!STK && stack >= 0) return "(the stacks are still being read)";
    if (stack < 0 || stack >= D.nstacks || stackFrames(stack).length === 0)
      return "No frames recorded: the block was allocated before recording started, the "
        + "recording kept no stacks, or the entry fell out of the ring buffer.";
    var fr = shownFrames(stack), out = [], i = 0, hidden = stackFrames(stack).length - fr.length;
    while (i < fr.length) {
      var j = i + 1;
      while (j < fr.length && fr[j] === fr[i]) j++;
      out.push(frameText(fr[i]));
      if (j - i > 1) out.push("<repeats " + (j - i - 1) + " times>");
      i = j;
    }
    if (hidden) out.push("(" + hidden + " frame" + (hidden > 1 ? "s" : "") + " of the unwinder, the interpreter, "
      + "the dispatcher or the allocator hidden, as PyTorch's viewer hides them: tick \"all frames\")");
    return out.join("\n");
  }
  function fmtTime(us) {
    if (us < 0) return "not recorded";
    return new Date(us / 1000).toString();
  }
  /* the pool as PyTorch's hover writes it, from the Pool filter's address lookup (elementPool) */
  function poolText(p) {
    if (typeof p === "string") p = p && p !== "unknown" ? p.split(",") : null;
    return p ? "pool_id (" + p[0] + ", " + p[1] + ")" : "pool_id unknown";
  }

  /* The global block index k -> [segment, block index inside it, address]. */
  var blockIndex = null;
  function snapBlock(k) {
    if (!blockIndex) {
      blockIndex = new Map();
      D.segments.forEach(function (s) {
        var addr = parseInt(s.addr, 16);
        s.blocks.forEach(function (b, i) { blockIndex.set(s.first_block + i, [s, i, addr]); addr += b[0]; });
      });
    }
    return blockIndex.get(k);
  }
  function segmentOfIndex(k) {
    for (var i = 0; i < D.segments.length; i++) if (D.segments[i].index === k) return D.segments[i];
    return null;
  }

  /* ---- timeline data ----------------------------------------------------------------------- */

  /* A timeline from its binary sections (PREFIX.*, viz/view/view.c): series s has the points
   * first[s] .. first[s + 1]; the summarized band is the last series. */
  function decodeTimeline(B, prefix, meta, segmentsView) {
    function sec(k) { return B[prefix + "." + k]; }
    var n = meta.nseries, i, f0 = sec("first"), np = sec("npoints");
    var tl = {
      segmentsView: segmentsView, n: n, sources: sec("sources"),
      first: new Uint32Array(n + 1), T: sec("T"), O: sec("O"),
      size: sec("size"), elem: sec("elem"), color: sec("color"), ghost: sec("ghost"),
      cat: sec("cat") || null, /* per element, the index of its category (memory timeline) */
      tmin: new Float64Array(n), tmax: new Float64Array(n),
      summ: -1, summSizes: null, summOffsets: null,
      maxAt: null, maxSize: meta.max_size, elementsLength: meta.elements_length,
      budget: meta.budget || null
    };
    for (i = 0; i < n; i++) {
      tl.first[i] = f0[i];
      tl.tmin[i] = np[i] ? tl.T[f0[i]] : 0;
      tl.tmax[i] = np[i] ? tl.T[f0[i] + np[i] - 1] : 0;
      if (tl.elem[i] < 0) {
        tl.summ = i; tl.summSizes = sec("S"); tl.summOffsets = tl.O.subarray(f0[i], f0[i] + np[i] + 1);
      }
    }
    tl.first[n] = n ? f0[n - 1] + np[n - 1] : 0;
    tl.maxAt = sec("max_at_time") || maxAtTime(tl, meta.ntimesteps);
    var peak = 0;
    for (i = 1; i < tl.maxAt.length; i++) if (tl.maxAt[i] > tl.maxAt[peak]) peak = i;
    tl.peakT = peak;
    tl.nT = Math.max(1, tl.maxAt.length);
    lodIndex(tl);
    return tl;
  }

  /* PyTorch's max_at_time, from the bands (the page holds it only where a total is too large to
   * sum exactly in doubles): at each step the sum of the sizes of the bands alive then. A band
   * counts from its first point to its last one less a step, or, when the bands above it moved
   * down as it ended (three steps, in which it still counts: another band has a point at its end
   * and, lower, one three steps later), to two steps after its last point. */
  function maxAtTime(tl, nT) {
    var T = tl.T, O = tl.O, first = tl.first, moved = new Uint8Array(nT + 4), diff = new Float64Array(nT + 4);
    var s, k, a, z, acc = 0, out = new Float64Array(nT);
    for (s = 0; s < tl.n; s++) {
      if (s === tl.summ) continue;
      for (k = first[s]; k + 1 < first[s + 1]; k++) if (T[k + 1] - T[k] === 3 && O[k + 1] < O[k]) moved[T[k]] = 1;
    }
    for (s = 0; s < tl.n; s++) {
      a = first[s]; z = first[s + 1];
      if (s === tl.summ || a === z || tl.size[s] === 0) continue;
      diff[T[a]] += tl.size[s];
      diff[moved[T[z - 1]] ? T[z - 1] + 3 : T[z - 1]] -= tl.size[s];
    }
    for (k = 0; k < nT; k++) { acc += diff[k]; out[k] = acc; }
    return out;
  }

  /* What keeps a frame's cost down (docs/view.md, "Level of detail"): the maximum of max_at_time
   * per block of 256 timesteps (the y scale of a window without a pass over it), and per group of
   * 64 series the first and last step they cover (groups outside the window are skipped whole). */
  var LOD_T = 256, LOD_S = 64;
  function lodIndex(tl) {
    var nb = Math.ceil(tl.maxAt.length / LOD_T), i, g;
    tl.maxBlk = new Float64Array(nb);
    for (i = 0; i < tl.maxAt.length; i++) {
      g = (i / LOD_T) | 0;
      if (tl.maxAt[i] > tl.maxBlk[g]) tl.maxBlk[g] = tl.maxAt[i];
    }
    var ng = Math.ceil(tl.n / LOD_S);
    tl.grpMin = new Float64Array(ng).fill(Infinity);
    tl.grpMax = new Float64Array(ng).fill(-Infinity);
    for (i = 0; i < tl.n; i++) {
      g = (i / LOD_S) | 0;
      if (tl.tmin[i] < tl.grpMin[g]) tl.grpMin[g] = tl.tmin[i];
      if (tl.tmax[i] > tl.grpMax[g]) tl.grpMax[g] = tl.tmax[i];
    }
  }
  /* the largest max_at_time in steps [a, b] */
  function maxIn(tl, a, b) {
    var m = 0, i = a;
    while (i <= b && i % LOD_T) { if (tl.maxAt[i] > m) m = tl.maxAt[i]; i++; }
    while (i + LOD_T - 1 <= b) { if (tl.maxBlk[i / LOD_T] > m) m = tl.maxBlk[i / LOD_T]; i += LOD_T; }
    for (; i <= b; i++) if (tl.maxAt[i] > m) m = tl.maxAt[i];
    return m;
  }
  /* the first index in [lo, hi) whose timestep is >= t (hi when none) */
  function lowerBound(T, lo, hi, t) {
    while (lo < hi) { var mid = (lo + hi) >> 1; if (T[mid] < t) lo = mid + 1; else hi = mid; }
    return lo;
  }
  /* calls f(s) for every series whose steps meet [t0, t1] */
  function eachIn(tl, t0, t1, f) {
    for (var g = 0; g < tl.grpMin.length; g++) {
      if (tl.grpMax[g] < t0 || tl.grpMin[g] > t1) continue;
      for (var s = g * LOD_S, z = Math.min(tl.n, s + LOD_S); s < z; s++)
        if (tl.tmax[s] >= t0 && tl.tmin[s] <= t1) f(s);
    }
  }

  /* The viewer's hover text of element e (context_for_id). */
  function elementText(tl, s) {
    var e = tl.elem[s];
    if (!D.trace && e >= 0) return "(the trace is still being read)";
    if (e <= -2) {
      var env = tl.envelopes[-2 - e];
      return "Private pool (" + env.pool[0] + ", " + env.pool[1] + "), stream " + streamName(env.stream)
        + ": the envelope is the pool's reserved memory (its segments), " + fmtBoth(env.reserved)
        + " at most; it never shrinks. Its live blocks are the half transparent stripes inside.";
    }
    if (e < 0) return "Small allocations summarized together.";
    var src = tl.sources[e], tr = versions(), lines = [], size = tl.size[s];
    var after = tl.maxAt[Math.min(tl.maxAt.length - 1, Math.max(0, tl.tmin[s]))];
    if (src >= 0) {
      var act = tr.action[src], pre = tl.segmentsView ? "s'" : "b'";
      lines.push("Addr: " + pre + hexAddr(src) + "_" + tr.ver[src] + ", Size: " + fmtBoth(size)
        + " allocation, Total memory used after allocation: " + fmtBoth(after) + ", stream "
        + streamName(tr.stream[src]) + ", " + poolText(elementPool(tl, s))
        + (tr.time[src] >= 0 ? ", timestamp " + fmtTime(tr.time[src]) : ", no timestamp recorded"));
      if (act !== A.ALLOC && act !== A.SEG_ALLOC)
        lines.push("alloc not recorded, stack trace for free:");
      lines.push(stackText(tr.stack[src]));
    } else {
      var k = -1 - src;
      if (tl.segmentsView) {
        var g = segmentOfIndex(k);
        lines.push("Addr: s'" + (g ? g.addr : "?") + ", Size: " + fmtBoth(size)
          + " segment, present in the snapshot, its allocation is not in the trace");
        lines.push(stackText(g ? g.stack : -1));
      } else {
        var b = snapBlock(k);
        var addr = b ? b[2].toString(16) : "?";
        lines.push("Addr: b'" + addr + "_" + (b ? versions().bver.get(b[2]) || 0 : 0) + ", Size: "
          + fmtBoth(size) + " allocation, stream " + (b ? streamName(b[0].stream) : "?") + ", "
          + poolText(elementPool(tl, s)));
        lines.push("This block was allocated before the trace starts (it is alive in the "
          + "snapshot, its alloc is not in the trace).");
        lines.push(stackText(b ? b[0].blocks[b[1]][3] : -1));
      }
    }
    return lines.join("\n");
  }
  function elementStack(tl, s) {
    var e = tl.elem[s];
    if (e < 0 || !D.trace) return -1;
    var src = tl.sources[e];
    if (src >= 0) return D.trace.stack[src];
    var k = -1 - src;
    if (tl.segmentsView) { var g = segmentOfIndex(k); return g ? g.stack : -1; }
    var b = snapBlock(k);
    return b ? b[0].blocks[b[1]][3] : -1;
  }
  /* The (renamed) stream of series s: its trace entry's, or its snapshot segment's; -1 for the
   * summarized band. */
  function elementStream(tl, s) {
    var e = tl.elem[s];
    if (e <= -2) return streamName(tl.envelopes[-2 - e].stream);
    if (e < 0 || !D.trace) return -1;
    var src = tl.sources[e];
    if (src >= 0) return streamName(D.trace.stream[src]);
    var k = -1 - src;
    if (tl.segmentsView) { var g = segmentOfIndex(k); return g ? streamName(g.stream) : -1; }
    var b = snapBlock(k);
    return b ? streamName(b[0].stream) : -1;
  }
  function elementAddr(tl, s) {
    var e = tl.elem[s];
    if (e < 0 || !D.trace) return "";
    var src = tl.sources[e];
    if (src >= 0) return hexAddr(src);
    var k = -1 - src;
    if (tl.segmentsView) { var g = segmentOfIndex(k); return g ? g.addr : ""; }
    var b = snapBlock(k);
    return b ? b[2].toString(16) : "";
  }

  /* The pool of series s as "a,b" (its segment's in the snapshot, found by address as MemoryViz
   * does; "unknown" when no segment of the snapshot holds it), "" for the summarized band. */
  var segsByAddr = null;
  function poolAtAddr(addr) {
    if (!segsByAddr) {
      segsByAddr = D.segments.map(function (g) { return [parseInt(g.addr, 16), g.size, g.pool]; });
      segsByAddr.sort(function (a, b) { return a[0] - b[0]; });
    }
    var lo = 0, hi = segsByAddr.length - 1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1, g = segsByAddr[mid];
      if (addr < g[0]) hi = mid - 1; else if (addr >= g[0] + g[1]) lo = mid + 1; else return g[2];
    }
    return null;
  }
  function elementPool(tl, s) {
    var e = tl.elem[s], p = null;
    if (e <= -2) p = tl.envelopes[-2 - e].pool;
    else if (e < 0) return "";
    else if (!D.trace) return "unknown";
    else {
      var src = tl.sources[e];
      if (src >= 0) p = poolAtAddr(D.trace.addr[src]);
      else if (tl.segmentsView) { var g = segmentOfIndex(-1 - src); p = g ? g.pool : null; }
      else { var b = snapBlock(-1 - src); p = b ? b[0].pool : null; }
    }
    return p ? p[0] + "," + p[1] : "unknown";
  }
  /* the pools of every series, computed once the pool selector is used */
  function seriesPools(tl) {
    if (!tl.poolKey) {
      tl.poolKey = new Array(tl.n);
      for (var s = 0; s < tl.n; s++) tl.poolKey[s] = elementPool(tl, s);
    }
    return tl.poolKey;
  }
  /* the (renamed) stream of every series, computed once the stream selector is used */
  function seriesStreams(tl) {
    if (!tl.stream) {
      tl.stream = new Int32Array(tl.n);
      for (var k = 0; k < tl.n; k++) tl.stream[k] = elementStream(tl, k);
    }
    return tl.stream;
  }
  /* the category of series s (its element's), or -1 */
  function seriesCat(tl, s) { return tl.cat && tl.elem[s] >= 0 ? tl.cat[tl.elem[s]] : -1; }
  function catFiltered() { return Object.keys(catOff).some(function (k) { return catOff[k]; }); }
  function shown(tl, s) {
    return s !== tl.summ && (streamFilter < 0 || seriesStreams(tl)[s] === streamFilter)
      && (poolFilter === "" || seriesPools(tl)[s] === poolFilter)
      && (!tl.cat || !catOff[seriesCat(tl, s)]);
  }
  /* The timestep at which trace entry i takes effect (the time-range selector), from the replay
   * (replay.js) of the same trace. */
  function entrySteps(tl) {
    if (!tl.entryStep)
      tl.entryStep = window.memsnapEntrySteps({ trace: D.trace, segments: D.segments,
                                                segmentsView: tl.segmentsView, pools: false });
    return tl.entryStep;
  }
  /* The timesteps at which the trace's `oom` entries take effect (none until the trace is read). */
  function oomSteps(tl) {
    if (!D.trace) return [];
    if (!tl.oomT) {
      var st = null, out = [];
      for (var i = 0; i < D.trace.action.length; i++)
        if (D.trace.action[i] === A.OOM) { st = st || entrySteps(tl); out.push(st[i]); }
      tl.oomT = out;
    }
    return tl.oomT;
  }
  /* The steps (ProfilerStep#N ranges, view.c) on timeline tl: [{step, t0, t1, peak}] from the
   * entries whose time is inside each (one pass, a binary search among the steps' starts). */
  function stepMarks(tl) {
    if (!D.trace || !D.steps || !D.steps.length) return [];
    if (!tl.stepMarks) {
      var S = D.steps, k = S.length, a = new Float64Array(k).fill(-1), b = new Float64Array(k), tm = D.trace.time;
      for (var i = 0; i < tm.length; i++) {
        var t = tm[i], lo = 0, hi = k - 1, j = -1;
        if (!(t >= 0)) continue;
        while (lo <= hi) { var mid = (lo + hi) >> 1; if (S[mid][1] <= t) { j = mid; lo = mid + 1; } else hi = mid - 1; }
        if (j < 0 || (S[j][2] >= 0 && t > S[j][2])) continue;
        if (a[j] < 0) a[j] = i;
        b[j] = i;
      }
      var st = entrySteps(tl), out = [];
      for (j = 0; j < k; j++) {
        if (a[j] < 0) continue;
        var t0 = Math.min(st[a[j]], tl.nT - 1), t1 = Math.max(t0 + 1, Math.min(tl.nT, st[b[j] + 1]));
        out.push({ step: S[j][0], t0: t0, t1: t1, peak: maxIn(tl, t0, Math.min(tl.maxAt.length - 1, t1 - 1)) });
      }
      tl.stepMarks = out;
    }
    return tl.stepMarks;
  }
  /* The Explain panel (explain.js): the device's answer, and the state at the moment chosen on a
   * timeline (after the entries whose timestep is at or before it). */
  function explainView(root) {
    var sel = -1;
    if (D.trace && selectedT >= 0 && TL) {
      var st = entrySteps(TL);
      sel = 0;
      while (sel < st.length - 1 && st[sel] <= selectedT) sel++;
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
  /* the timesteps [lo, hi] the time-range selector allows (the whole run without it) */
  function stepRange(tl) {
    if (!range || !D.trace) return [0, tl.nT];
    var st = entrySteps(tl), n = st.length - 1;
    var a = Math.max(0, Math.min(n, range[0])), b = Math.max(a, Math.min(n - 1, range[1]));
    var lo = Math.min(st[a], tl.nT - 1), hi = Math.min(tl.nT, st[Math.min(n, b + 1)]);
    return [lo, Math.max(lo + 1, hi)];
  }

  /* Offset of series s at timestep t (linear between points, as the polygons are drawn). */
  function offsetAt(tl, s, t) {
    var lo = tl.first[s], hi = tl.first[s + 1] - 1;
    if (hi < lo || t < tl.T[lo] || t > tl.T[hi]) return NaN;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (tl.T[mid] <= t) lo = mid; else hi = mid - 1;
    }
    if (lo + 1 < tl.first[s + 1] && tl.T[lo + 1] > tl.T[lo]) {
      var f = (t - tl.T[lo]) / (tl.T[lo + 1] - tl.T[lo]);
      return tl.O[lo] + f * (tl.O[lo + 1] - tl.O[lo]);
    }
    return tl.O[lo];
  }

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

  /* ---- the timeline view: canvas, level of detail, zoom and pan, hover ---------------------- */

  var ENV_COLOR = "#708"; /* a private pool's envelope outline */
  var MATCH_OUTLINES = 2000; /* the search's outlines drawn at most */
  function timelineView(root, tl, title) {
    var self = { name: title };
    if (tl.n === 0 || tl.elementsLength === 0) {
      el("div", "note", root, "No timeline: " + (D.ntrace === 0
        ? "the snapshot has no trace (it was taken without recording history). The Allocator "
          + "State History view shows its segments and blocks."
        : "the trace of this device has no allocation."));
      self.destroy = function () {};
      return self;
    }
    if (tl.budget) {
      /* the data past its budget (docs/view.md, "The budget"): the smallest in the grey band */
      el("div", "note budget", root, "Summarized: " + tl.budget.drawn + " of "
        + tl.elementsLength + " allocations are drawn on their own; the other "
        + (tl.elementsLength - tl.budget.drawn) + " (the smallest; of equal sizes, the latest) are "
        + "in the grey \"summarized\" band "
        + "(as PyTorch's viewer does past 15,000), because drawing every one would take "
        + fmtSize(tl.budget.exact_bytes) + ", more than the page's budget of "
        + fmtSize(tl.budget.bytes) + ".");
    }
    var plot = el("div", "plot", root), mini = el("div", "mini", root), info = el("pre", "info", root);
    var cv = el("canvas", "", plot), over = el("canvas", "", plot), mcv = el("canvas", "", mini);
    var ctx = cv.getContext("2d"), octx = over.getContext("2d"), mctx = mcv.getContext("2d");
    var W = 0, H = 0, MW = 0, MH = 0, pad = { l: 70, r: 10, t: 10, b: 20 };
    var x0 = 0, x1 = tl.nT, hover = -1, pinned = -1, matches = null, lastFrameMs = 0;
    var outlined = null; /* the matches outlined in this window (kept while only the hover moves) */
    var hs = readHash();
    var lim = stepRange(tl);
    x0 = lim[0]; x1 = lim[1];
    if (hs.x0 !== undefined && hs.x1 !== undefined && +hs.x1 > +hs.x0 && +hs.x0 >= lim[0] && +hs.x1 <= lim[1]) {
      x0 = +hs.x0; x1 = +hs.x1;
    }
    info.textContent = (D.ntrace === 0 ? "The snapshot has no trace (it was taken "
      + "without recording history), so there is no memory over time: the bands are the blocks "
      + "alive in the snapshot. The Allocator State History view shows its segment map.\n" : "")
      + "Hover a band to see its allocation; click to keep it and to choose the "
      + "moment of the flame graph view. Keys: + / - zoom, arrows pan, p peak, 0 whole run.";

    function ymax() {
      var a = Math.max(0, Math.floor(x0)), b = Math.min(tl.maxAt.length - 1, Math.ceil(x1));
      return Math.max(1, maxIn(tl, a, b)) * 1.05;
    }
    var Y = 1;
    function X(t) { return pad.l + (t - x0) / (x1 - x0) * (W - pad.l - pad.r); }
    function T(x) { return x0 + (x - pad.l) / (W - pad.l - pad.r) * (x1 - x0); }
    function Yp(b) { return H - pad.b - b / Y * (H - pad.t - pad.b); }
    function B(y) { return (H - pad.b - y) / (H - pad.t - pad.b) * Y; }

    var thin = null, thinCv = null, thinPx = null, miniCols = null;
    function resize() {
      var r = plot.getBoundingClientRect(), m = mini.getBoundingClientRect();
      W = Math.max(200, Math.floor(r.width)); H = Math.max(100, Math.floor(r.height));
      MW = Math.max(200, Math.floor(m.width)); MH = Math.max(30, Math.floor(m.height));
      cv.width = over.width = W; cv.height = over.height = H; mcv.width = MW; mcv.height = MH;
      thinCv = document.createElement("canvas");
      thinCv.width = W; thinCv.height = H;
      thin = thinCv.getContext("2d").createImageData(W, H);
      thinPx = new Uint32Array(thin.data.buffer);
      miniCols = null;
      draw(); drawMini();
    }
    /* Every band is drawn in software, column by column, into one image (aggregated per pixel):
     * in each column it covers, its pixels from its offset up to its height (one row at least), at
     * the offset it has at the column (its first point there). A band of many points over few
     * columns is read at one point per column (binary search), so a frame costs at most a column
     * per band plus the pixels, whatever the number of points; no path is made. Half transparent
     * bands (ghosts, pool stripes) are mixed with white or with the pool's grey. */
    var PX = [], PXG = [], PXP = [];
    TABLEAU10.forEach(function (c) { PX.push(rgba(c, 1, 255)); PXG.push(rgba(c, 0.45, 255)); PXP.push(rgba(c, 0.5, -1)); });
    var CPX = [], CPXG = []; /* by category: the profiler's colours */
    (D.category_colors || []).forEach(function (c) { CPX.push(rgba(c, 1, 255)); CPXG.push(rgba(c, 0.45, 255)); });
    function rgba(hex, a, under) {
      var v = [1, 3, 5].map(function (k) { return parseInt(hex.slice(k, k + 2), 16); });
      var u = under >= 0 ? [under, under, under] : [0xba, 0xb0, 0xab];
      v = v.map(function (x, k) { return Math.round(u[k] + (x - u[k]) * a); });
      return (255 << 24 | v[2] << 16 | v[1] << 8 | v[0]) >>> 0;
    }
    function rasterBand(s) {
      var a = tl.first[s], z = tl.first[s + 1], T0 = tl.T, O0 = tl.O, S0 = tl.elem[s] <= -2 ? tl.S : null;
      if (tl.tmin[s] < x0) a = Math.max(a, lowerBound(T0, a, z - 1, x0) - 1);
      var kx = (W - pad.l - pad.r) / (x1 - x0), ky = (H - pad.t - pad.b) / Y, base = H - pad.b;
      var cmin = pad.l, cmax = W - pad.r - 1, rmin = pad.t, rmax = H - pad.b - 1;
      var col = colorBy === "category" && tl.cat && seriesCat(tl, s) >= 0
        ? (tl.ghost[s] ? CPXG : CPX)[seriesCat(tl, s)]
        : (tl.ghost[s] ? PXG : tl.alpha && tl.alpha[s] < 1 ? PXP : PX)[tl.color[s] % 10];
      var hp = Math.max(1, Math.round(tl.size[s] * ky));
      function fill(c, o, i) {
        var r = Math.round(base - o * ky), h = S0 ? Math.max(1, Math.round(S0[i] * ky)) : hp;
        for (var q = r - h + 1 < rmin ? rmin : r - h + 1, qz = r > rmax ? rmax : r; q <= qz; q++) thinPx[q * W + c] = col;
      }
      var xa = pad.l + (T0[a] - x0) * kx;
      var cols = Math.min(W, Math.ceil(((tl.tmax[s] < x1 ? tl.tmax[s] : x1) - (tl.tmin[s] > x0 ? tl.tmin[s] : x0)) * kx) + 2);
      if (z - a > 4 * cols) {
        /* many points: one per column */
        var c0 = Math.max(cmin, Math.floor(xa)), c1 = Math.min(cmax, Math.floor(pad.l + (Math.min(tl.tmax[s], x1) - x0) * kx));
        for (var c = c0, i = a; c <= c1; c++) {
          i = Math.max(i, lowerBound(T0, i, z, x0 + (c + 0.5 - pad.l) / kx) - 1);
          fill(c, O0[i], i);
        }
        return;
      }
      for (var j = a; j < z; j++) {
        var xb = j + 1 < z ? pad.l + (T0[j + 1] - x0) * kx : xa;
        var ca = Math.floor(xa) < cmin ? cmin : Math.floor(xa), cb = Math.floor(xb) > cmax ? cmax : Math.floor(xb);
        for (var cc = ca; cc <= cb; cc++) {
          var f = xb > xa ? Math.min(1, Math.max(0, (cc + 0.5 - xa) / (xb - xa))) : 0;
          fill(cc, j + 1 < z ? O0[j] + (O0[j + 1] - O0[j]) * f : O0[j], j);
        }
        if (xb > W - pad.r) break;
        xa = xb;
      }
    }

    /* One band: the top edge forwards then the bottom edge back, at most one point per pixel
     * column (the first and last point of a column are kept). */
    function bandPath(s, h, c) {
      var a = tl.first[s], z = tl.first[s + 1], i;
      /* points inside the window, plus one on each side */
      a = Math.max(tl.first[s], lowerBound(tl.T, a, z - 1, x0) - 1);
      var end = Math.min(z, lowerBound(tl.T, a, z, x1 + 1e-9) + 1);
      var xs = [], ys = [], tops = [], lastX = -1e9, env = tl.elem[s] <= -2;
      function point(i) {
        var y = Yp(tl.O[i]);
        xs.push(X(tl.T[i])); ys.push(y);
        tops.push(env && h > 0 ? Yp(tl.O[i] + tl.S[i]) : y - h);
      }
      var c0 = Math.floor(X(tl.T[a])), c1 = Math.ceil(X(tl.T[end - 1]));
      if (end - a > 4 * (c1 - c0 + 2)) {
        /* far more points than columns (a long-lived band that slid many times): the first and
         * the last point of each column, found by binary search */
        var k = a;
        for (var c = c0; c <= c1 && k < end; c++) {
          var k1 = lowerBound(tl.T, k, end, T(c + 1));
          if (k1 === k) continue;
          point(k);
          if (k1 - 1 > k) point(k1 - 1);
          k = k1;
        }
      } else {
        for (i = a; i < end; i++) {
          var x = X(tl.T[i]);
          if (Math.round(x) === Math.round(lastX) && i + 1 < end && Math.round(X(tl.T[i + 1])) === Math.round(x)) continue;
          point(i); lastX = x;
        }
      }
      if (xs.length === 0) return;
      c.moveTo(xs[0], tops[0]);
      for (i = 1; i < xs.length; i++) c.lineTo(xs[i], tops[i]);
      if (h <= 0) return;
      for (i = xs.length - 1; i >= 0; i--) c.lineTo(xs[i], ys[i]);
      c.closePath();
    }

    function draw() {
      var t0 = performance.now();
      outlined = null;
      Y = ymax();
      ctx.clearRect(0, 0, W, H);
      ctx.save();
      ctx.beginPath(); ctx.rect(pad.l, pad.t, W - pad.l - pad.r, H - pad.t - pad.b); ctx.clip();
      var pxPerByte = (H - pad.t - pad.b) / Y, nsmall = 0, nbig = 0;
      var filter = streamFilter >= 0 || poolFilter !== "" || tl.cat && catFiltered();
      thinPx.fill(0);
      eachIn(tl, x0, x1, function (s) {
        if (s === tl.summ || filter && !shown(tl, s)) return;
        rasterBand(s);
        /* counted as before: bands at least a pixel high, and thinner ones */
        if (tl.size[s] * pxPerByte >= 1) nbig++; else nsmall++;
      });
      thinCv.getContext("2d").putImageData(thin, 0, 0);
      ctx.drawImage(thinCv, 0, 0);
      if (tl.summ >= 0) drawSummarized();
      ctx.restore();
      axes();
      self.stats = { big: nbig, small: nsmall };
      drawOverlay();
      lastFrameMs = performance.now() - t0;
      self.lastFrameMs = lastFrameMs;
      hash.x0 = Math.round(x0); hash.x1 = Math.round(x1); writeHash();
    }
    /* the summarized band (empty here: nothing is summarized, but it has a point per step) */
    function drawSummarized() {
      var s = tl.summ, a = tl.first[s], z = tl.first[s + 1], m = 0;
      if (tl.summMax === undefined) {
        for (var k = 0; k < z - a; k++) if (tl.summSizes[k] > m) m = tl.summSizes[k];
        tl.summMax = m;
      }
      if (z <= a || tl.summMax === 0) return;
      var a0 = a;
      a = Math.max(a, lowerBound(tl.T, a, z, x0) - 1);
      z = Math.min(z, lowerBound(tl.T, a, z, x1 + 1e-9) + 1);
      ctx.beginPath();
      for (var i = a; i < z; i++) ctx.lineTo(X(tl.T[i]), Yp(tl.summOffsets[i - a0] + tl.summSizes[i - a0]));
      for (i = z - 1; i >= a; i--) ctx.lineTo(X(tl.T[i]), Yp(tl.summOffsets[i - a0]));
      ctx.fillStyle = "#ccc";
      ctx.fill();
    }
    function axes() {
      ctx.fillStyle = "#222"; ctx.strokeStyle = "#999"; ctx.font = "11px sans-serif";
      ctx.beginPath(); ctx.moveTo(pad.l, pad.t); ctx.lineTo(pad.l, H - pad.b); ctx.lineTo(W - pad.r, H - pad.b); ctx.stroke();
      for (var i = 0; i <= 4; i++) {
        var b = Y * i / 4, y = Yp(b);
        ctx.fillText(fmtSize(b), 4, y + 4);
      }
      /* whole timesteps, each once, at a round spacing; every label inside the canvas */
      var labels = self.labels = [];
      function label(text, x, y) {
        var w = ctx.measureText(text).width, lx = Math.max(0, Math.min(W - 1 - w, x));
        ctx.fillText(text, lx, y);
        labels.push([text, lx, lx + w]);
      }
      var step = Math.max(1, niceStep((x1 - x0) / 5));
      for (var tk = Math.ceil(x0 / step) * step; tk <= x1 + 1e-9; tk += step) {
        var txt = String(Math.round(tk));
        label(txt, X(tk) - ctx.measureText(txt).width / 2, H - 5);
      }
      /* the peak: its label left of the line where it would pass the right edge */
      var px = X(tl.peakT);
      if (px >= pad.l && px <= W - pad.r) {
        ctx.strokeStyle = "#d00"; ctx.setLineDash([4, 3]);
        ctx.beginPath(); ctx.moveTo(px, pad.t); ctx.lineTo(px, H - pad.b); ctx.stroke();
        ctx.setLineDash([]);
        var pt = "peak " + fmtSize(tl.maxAt[tl.peakT]), pw = ctx.measureText(pt).width;
        ctx.fillStyle = "#d00"; label(pt, px + 3 + pw > W - 1 ? px - 3 - pw : px + 3, pad.t + 10);
      }
      /* each profiler step from where its first entry takes effect, with its peak where it fits */
      stepMarks(tl).forEach(function (m) {
        var sx = X(m.t0), ex = Math.min(X(m.t1), W - pad.r);
        if (X(m.t1) < pad.l || sx > W - pad.r) return;
        ctx.strokeStyle = "#888"; ctx.setLineDash([2, 3]);
        if (sx >= pad.l) { ctx.beginPath(); ctx.moveTo(sx, pad.t); ctx.lineTo(sx, H - pad.b); ctx.stroke(); }
        ctx.setLineDash([]);
        var name = "step " + m.step, full = name + ": peak " + fmtSize(m.peak), x = Math.max(pad.l, sx) + 3;
        ctx.fillStyle = "#555";
        if (ex - x > ctx.measureText(full).width + 4) label(full, x, pad.t + 34);
        else if (ex - x > ctx.measureText(name).width + 4) label(name, x, pad.t + 34);
      });
      /* each out-of-memory error, where its entry takes effect */
      oomSteps(tl).forEach(function (t) {
        var ox = X(t);
        if (ox < pad.l || ox > W - pad.r) return;
        ctx.strokeStyle = "#b00"; ctx.lineWidth = 2; ctx.setLineDash([6, 2]);
        ctx.beginPath(); ctx.moveTo(ox, pad.t); ctx.lineTo(ox, H - pad.b); ctx.stroke();
        ctx.setLineDash([]); ctx.lineWidth = 1;
        ctx.fillStyle = "#b00"; ctx.fillText("OOM", ox + 30 > W ? ox - 28 : ox + 3, pad.t + 22);
      });
    }
    /* 1, 2 or 5 times a power of ten, at least d */
    function niceStep(d) {
      var p = Math.pow(10, Math.floor(Math.log10(Math.max(d, 1e-9))));
      return d <= p ? p : d <= 2 * p ? 2 * p : d <= 5 * p ? 5 * p : 10 * p;
    }
    function outline(s, style) {
      octx.beginPath();
      var h = Math.max(1, tl.size[s] * (H - pad.t - pad.b) / Y);
      bandPath(s, h, octx);
      octx.strokeStyle = style; octx.lineWidth = 2; octx.stroke();
    }
    function drawOverlay() {
      octx.clearRect(0, 0, W, H);
      octx.save();
      octx.beginPath(); octx.rect(pad.l, pad.t, W - pad.l - pad.r, H - pad.t - pad.b); octx.clip();
      if (matches) {
        /* the largest matches in the window (MATCH_OUTLINES at most: an outline per band of
         * hundreds of thousands would take seconds; the counts are of all) */
        var ms = outlined || [], ky = (H - pad.t - pad.b) / Y;
        if (!outlined) eachIn(tl, x0, x1, function (s) { if (matches[s] && shown(tl, s)) ms.push(s); });
        if (!outlined && ms.length > MATCH_OUTLINES) {
          /* the size of the MATCH_OUTLINES-th largest (a typed array's numeric sort) */
          var sz = Float64Array.from(ms, function (s) { return tl.size[s]; }).sort(), cut = sz[sz.length - MATCH_OUTLINES];
          ms = ms.filter(function (s) { return tl.size[s] >= cut; }).slice(0, MATCH_OUTLINES);
        }
        octx.setLineDash([3, 2]);
        ms.forEach(function (s) {
          if (tl.size[s] * ky >= 0.5 || ms.length < 200) { var m = matches[s]; outline(s, m === 1 ? "#d00" : m === 2 ? "#00d" : "#d0d"); }
        });
        octx.setLineDash([]);
        outlined = ms;
        self.outlined = ms.length;
      }
      envelopes();
      if (pinned >= 0) outline(pinned, "#000");
      if (hover >= 0 && hover !== pinned) outline(hover, "#333");
      if (selectedT >= 0) {
        var x = X(selectedT);
        octx.strokeStyle = "#090"; octx.lineWidth = 1;
        octx.beginPath(); octx.moveTo(x, pad.t); octx.lineTo(x, H - pad.b); octx.stroke();
      }
      octx.restore();
    }
    /* each private pool's envelope (its reserved memory), outlined above its stripes and named */
    function envelopes() {
      if (!tl.envelopes || !tl.envelopes.length) return;
      if (!tl.envSeries) {
        tl.envSeries = [];
        for (var k = 0; k < tl.n; k++) if (tl.elem[k] <= -2) tl.envSeries.push(k);
      }
      tl.envSeries.forEach(function (s) {
        var e = tl.elem[s];
        if (tl.tmax[s] < x0 || tl.tmin[s] > x1 || !shown(tl, s)) return;
        outline(s, ENV_COLOR);
        var env = tl.envelopes[-2 - e], i = Math.max(tl.first[s], lowerBound(tl.T, tl.first[s], tl.first[s + 1] - 1, x0));
        octx.fillStyle = ENV_COLOR; octx.font = "11px sans-serif";
        octx.fillText("private pool (" + env.pool[0] + ", " + env.pool[1] + ")",
                      Math.max(pad.l, X(tl.T[i])) + 4, Yp(tl.O[i] + tl.S[i]) + 13);
      });
    }
    function drawMini() {
      mctx.clearRect(0, 0, MW, MH);
      var n = tl.maxAt.length, x;
      if (!miniCols) {
        /* the maximum per pixel column, once per size */
        miniCols = new Float64Array(MW + 1);
        for (x = 0; x < MW; x++) {
          var a = Math.floor(x / MW * n), b = Math.min(n - 1, Math.max(a, Math.floor((x + 1) / MW * n) - 1));
          miniCols[x] = a < n ? maxIn(tl, a, b) : 0;
          if (miniCols[x] > miniCols[MW]) miniCols[MW] = miniCols[x];
        }
      }
      var m = Math.max(1, miniCols[MW]);
      mctx.fillStyle = "#9ab";
      mctx.beginPath(); mctx.moveTo(0, MH);
      for (x = 0; x < MW; x++) mctx.lineTo(x, MH - miniCols[x] / m * (MH - 4));
      mctx.lineTo(MW, MH); mctx.fill();
      var lim = stepRange(tl);
      mctx.fillStyle = "rgba(255,255,255,0.7)";
      mctx.fillRect(0, 0, lim[0] / tl.nT * MW, MH);
      mctx.fillRect(lim[1] / tl.nT * MW, 0, MW, MH);
      mctx.fillStyle = "rgba(0,0,0,0.15)";
      var bx0 = x0 / tl.nT * MW, bx1 = x1 / tl.nT * MW;
      mctx.fillRect(bx0, 0, Math.max(2, bx1 - bx0), MH);
    }

    function hit(mx, my) {
      if (mx < pad.l || mx > W - pad.r || my < pad.t || my > H - pad.b) return -1;
      /* a band narrower than a pixel in time is hit within half a pixel of it */
      var t = T(mx), b = B(my), tol = Y / (H - pad.t - pad.b), best = -1;
      var dt = (x1 - x0) / (W - pad.l - pad.r) / 2;
      eachIn(tl, t - dt, t + dt, function (s) {
        if (!shown(tl, s)) return;
        var o = offsetAt(tl, s, Math.min(tl.tmax[s], Math.max(tl.tmin[s], t)));
        if (b >= o - tol && b < o + Math.max(tl.size[s], tol)) {
          if (best < 0 || tl.size[s] > tl.size[best] || b >= o && b < o + tl.size[s]) best = s;
        }
      });
      return best;
    }
    function show(s) {
      info.textContent = s >= 0 ? elementText(tl, s) : "";
    }
    function zoomAt(t, f) {
      var nx0 = t - (t - x0) * f, nx1 = t + (x1 - t) * f;
      if (nx1 - nx0 < 4) return;
      setWindow(nx0, nx1);
    }
    function setWindow(a, b) {
      var lim = stepRange(tl), w = Math.min(b - a, lim[1] - lim[0]);
      if (a < lim[0]) a = lim[0];
      if (a + w > lim[1]) a = lim[1] - w;
      x0 = a; x1 = a + w;
      draw(); drawMini();
    }
    self.setWindow = setWindow;
    self.applyRange = function () { var lim = stepRange(tl); setWindow(lim[0], lim[1]); };
    self.window = function () { return [x0, x1]; };
    self.zoomAt = zoomAt;
    self.draw = draw;
    self.hit = hit;
    self.bandsAt = function (t) { /* series alive at timestep t */
      var out = [];
      for (var s = 0; s < tl.n; s++)
        if (s !== tl.summ && tl.tmin[s] <= t && tl.tmax[s] > t) out.push(s);
      return out;
    };
    /* the search's answer (search.js): 1 address, 2 frame, 3 both, per series */
    self.setMatches = function (m) { matches = m; outlined = null; drawOverlay(); };
    self.search = function (addr, text) {
      var r = searchSync(tl, addr, text);
      self.setMatches(r.match);
      return r;
    };
    self.peak = function () {
      var w = Math.min(x1 - x0, tl.nT);
      setWindow(tl.peakT - w / 2, tl.peakT + w / 2);
      selectedT = tl.peakT; drawOverlay();
    };

    var drag = null;
    over.addEventListener("mousedown", function (ev) { drag = { x: ev.offsetX, x0: x0, x1: x1, moved: false }; });
    window.addEventListener("mouseup", function () { setTimeout(function () { drag = null; }, 0); });
    over.addEventListener("mousemove", function (ev) {
      if (drag && (ev.buttons & 1)) {
        var dt = (ev.offsetX - drag.x) / (W - pad.l - pad.r) * (drag.x1 - drag.x0);
        if (Math.abs(ev.offsetX - drag.x) > 2) drag.moved = true;
        if (drag.moved) { setWindow(drag.x0 - dt, drag.x1 - dt); return; }
      }
      var s = hit(ev.offsetX, ev.offsetY);
      if (s !== hover) { hover = s; drawOverlay(); if (pinned < 0) show(s); }
    });
    over.addEventListener("click", function (ev) {
      if (drag && drag.moved) return;
      var s = hit(ev.offsetX, ev.offsetY);
      pinned = s;
      selectedT = Math.max(0, Math.round(T(ev.offsetX)));
      hash.t = selectedT; writeHash();
      show(s);
      drawOverlay();
    });
    over.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      zoomAt(T(ev.offsetX), ev.deltaY > 0 ? 1.25 : 0.8);
    }, { passive: false });
    var brush = null;
    mcv.addEventListener("mousedown", function (ev) { brush = ev.offsetX; });
    mcv.addEventListener("mouseup", function (ev) {
      if (brush === null) return;
      var a = Math.min(brush, ev.offsetX), b = Math.max(brush, ev.offsetX);
      brush = null;
      if (b - a < 3) { var c = a / MW * tl.nT, w = x1 - x0; setWindow(c - w / 2, c + w / 2); }
      else setWindow(a / MW * tl.nT, b / MW * tl.nT);
    });
    function key(ev) {
      if (ev.target && ev.target.tagName === "INPUT") return;
      var w = x1 - x0, c = (x0 + x1) / 2;
      if (ev.key === "+" || ev.key === "=") zoomAt(c, 0.5);
      else if (ev.key === "-") zoomAt(c, 2);
      else if (ev.key === "ArrowLeft") setWindow(x0 - w / 4, x1 - w / 4);
      else if (ev.key === "ArrowRight") setWindow(x0 + w / 4, x1 + w / 4);
      else if (ev.key === "p") self.peak();
      else if (ev.key === "0") self.applyRange();
      else return;
      ev.preventDefault();
    }
    document.addEventListener("keydown", key);
    window.addEventListener("resize", resize);
    self.destroy = function () {
      document.removeEventListener("keydown", key);
      window.removeEventListener("resize", resize);
    };
    self.tl = tl;
    self.info = info;
    self.canvasToClient = function (t, b) { return [X(t), Yp(b)]; };
    resize();
    return self;
  }

  /* ---- Allocator State History -------------------------------------------------------------- */

  /* The allocator's state at a step, moved one entry at a time from the end (the snapshot). */
  function AllocState() {
    var tr = D.trace;
    this.n = tr.action.length;
    this.step = this.n;
    this.segs = [];           /* {addr, size, stream, pool, stack} sorted by addr */
    this.blocks = new Map();  /* addr -> {addr, size, req, state, stack} (live blocks) */
    var self = this;
    D.segments.forEach(function (s) {
      var addr = parseInt(s.addr, 16);
      self.segs.push({ addr: addr, size: s.size, stream: s.stream, pool: s.pool, stack: s.stack });
      s.blocks.forEach(function (b) {
        if (b[2] === 1 || b[2] === 2)
          self.blocks.set(addr, { addr: addr, size: b[0], req: b[1], state: b[2], stack: b[3] });
        addr += b[0];
      });
    });
    this.segs.sort(function (a, b) { return a.addr - b.addr; });
  }
  AllocState.prototype.findSeg = function (addr) {
    var s = this.segs, lo = 0, hi = s.length - 1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (s[mid].addr <= addr) lo = mid + 1; else hi = mid - 1;
    }
    return hi >= 0 && addr < s[hi].addr + s[hi].size ? hi : -1;
  };
  AllocState.prototype.addSeg = function (g) {
    var s = this.segs, i = 0;
    while (i < s.length && s[i].addr < g.addr) i++;
    s.splice(i, 0, g);
  };
  AllocState.prototype.removeRange = function (addr, size) {
    var i = this.findSeg(addr);
    if (i < 0) return;
    var g = this.segs[i], end = g.addr + g.size, parts = [];
    if (addr > g.addr) parts.push({ addr: g.addr, size: addr - g.addr, stream: g.stream, pool: g.pool, stack: g.stack });
    if (addr + size < end) parts.push({ addr: addr + size, size: end - addr - size, stream: g.stream, pool: g.pool, stack: g.stack });
    Array.prototype.splice.apply(this.segs, [i, 1].concat(parts));
  };
  AllocState.prototype.entry = function (i) {
    var tr = D.trace;
    return { a: tr.action[i], addr: tr.addr[i], size: tr.size[i],
             stream: tr.stream[i], stack: tr.stack[i], pool: poolOf(i) };
  };
  /* step -> step - 1: undo entry step - 1 */
  AllocState.prototype.undo = function () {
    var e = this.entry(--this.step), b;
    switch (e.a) {
    case A.ALLOC: this.blocks.delete(e.addr); break;
    case A.FREE_REQ: if ((b = this.blocks.get(e.addr))) b.state = 1; break;
    case A.FREE_DONE:
      this.blocks.set(e.addr, { addr: e.addr, size: Math.max(512, Math.ceil(e.size / 512) * 512),
                                req: e.size, state: 2, stack: e.stack });
      break;
    case A.SEG_ALLOC: case A.SEG_MAP: this.removeRange(e.addr, e.size); break;
    case A.SEG_FREE: case A.SEG_UNMAP:
      this.addSeg({ addr: e.addr, size: e.size, stream: e.stream, pool: e.pool || [0, 0], stack: e.stack });
      break;
    }
  };
  /* step -> step + 1: redo entry step */
  AllocState.prototype.redo = function () {
    var e = this.entry(this.step++), b;
    switch (e.a) {
    case A.ALLOC:
      this.blocks.set(e.addr, { addr: e.addr, size: Math.max(512, Math.ceil(e.size / 512) * 512),
                                req: e.size, state: 1, stack: e.stack });
      break;
    case A.FREE_REQ: if ((b = this.blocks.get(e.addr))) b.state = 2; break;
    case A.FREE_DONE: this.blocks.delete(e.addr); break;
    case A.SEG_ALLOC: case A.SEG_MAP:
      this.addSeg({ addr: e.addr, size: e.size, stream: e.stream, pool: e.pool || [0, 0], stack: e.stack });
      break;
    case A.SEG_FREE: case A.SEG_UNMAP: this.removeRange(e.addr, e.size); break;
    }
  };
  AllocState.prototype.moveTo = function (step) {
    step = Math.max(0, Math.min(this.n, step));
    while (this.step > step) this.undo();
    while (this.step < step) this.redo();
  };
  AllocState.prototype.totals = function () {
    var al = 0, res = 0;
    this.blocks.forEach(function (b) { if (b.state === 1) al += b.size; });
    this.segs.forEach(function (g) { res += g.size; });
    return { allocated: al, reserved: res };
  };

  function eventText(i) {
    var tr = versions(), a = tr.action[i], name = D.actions[a] || "other";
    if (a === A.OOM)
      return "OOM (requested " + fmtSize(tr.size[i]) + ", Device has "
        + fmtSize(tr.addr[i]) + " memory free)";
    if (a === A.SNAPSHOT) return "snapshot";
    if (a === A.FREE_REQ && i + 1 < tr.action.length && tr.action[i + 1] === A.FREE_DONE && tr.addr[i + 1] === tr.addr[i])
      name = "free";
    var pre = a >= A.SEG_ALLOC && a <= A.SEG_UNMAP ? "s'" : "b'";
    var addr = pre + hexAddr(i) + "_" + tr.ver[i];
    while (name.length < 14) name += " ";
    while (addr.length < 18) addr += " ";
    return name + " " + addr + " " + fmtBoth(tr.size[i]) + " (stream " + streamName(tr.stream[i]) + ")";
  }

  function hashColor(addr) {
    var h = (addr / 512) % 2147483647;
    h = (h * 2654435761) % 4294967296;
    return "hsl(" + (h % 360) + ",55%," + (50 + (h >> 8) % 20) + "%)";
  }

  function historyView(root) {
    var self = { name: "history" };
    var grid = el("div", "hist", root);
    var list = el("div", "events", grid), mapDiv = el("div", "segmap", grid), info = el("pre", "info", grid);
    list.tabIndex = 0;
    var spacer = el("div", "", list), rows = [];
    var n = D.trace.action.length, ROW = 18, MAXH = 8000000;
    var st = new AllocState(), sel = -1;
    var cv = el("canvas", "", mapDiv), ctx = cv.getContext("2d"), W = 0, H = 0, layout = [];
    spacer.style.height = Math.min(n * ROW, MAXH) + "px";
    spacer.style.width = "1px";

    /* the first row shown: scrollTop scaled when the list is taller than the browser allows */
    function firstRow() {
      var max = Math.max(1, list.scrollHeight - list.clientHeight), vis = Math.ceil(list.clientHeight / ROW);
      if (n * ROW <= MAXH) return Math.floor(list.scrollTop / ROW);
      return Math.floor(list.scrollTop / max * Math.max(0, n - vis + 1));
    }
    function rowTop(i, f) {
      return n * ROW <= MAXH ? i * ROW : list.scrollTop + (i - f) * ROW;
    }
    function renderRows() {
      var f = firstRow(), vis = Math.ceil(list.clientHeight / ROW) + 1;
      while (rows.length < vis) {
        var r = el("div", "row", list);
        r.addEventListener("click", function () { select(+this.dataset.i); });
        rows.push(r);
      }
      for (var k = 0; k < rows.length; k++) {
        var i = f + k, r2 = rows[k];
        if (i >= n || k >= vis) { r2.style.display = "none"; continue; }
        r2.style.display = "";
        r2.dataset.i = i;
        r2.style.top = rowTop(i, f) + "px";
        r2.textContent = eventText(i);
        r2.className = "row" + (i === sel ? " sel" : "") + (D.trace.action[i] === A.OOM ? " oom" : "");
      }
    }
    function scrollTo(i) {
      var f = firstRow(), vis = Math.floor(list.clientHeight / ROW);
      if (i >= f && i < f + vis) return;
      if (n * ROW <= MAXH) list.scrollTop = Math.max(0, i * ROW - list.clientHeight / 2);
      else list.scrollTop = i / Math.max(1, n - vis) * (list.scrollHeight - list.clientHeight);
    }
    function select(i) {
      if (n === 0) return; /* no trace: no event to select (the keys do nothing) */
      sel = Math.max(0, Math.min(n - 1, i));
      st.moveTo(sel + 1);
      hash.event = sel; writeHash();
      scrollTo(sel);
      renderRows();
      drawMap();
      var t = st.totals(), tr = D.trace;
      info.textContent = "(" + fmtSize(t.allocated) + " allocated / " + fmtSize(t.reserved)
        + " reserved)\n" + eventText(sel) + "\n" + (tr.time[sel] >= 0 ? fmtTime(tr.time[sel]) + "\n" : "")
        + stackText(tr.stack[sel]);
      self.selected = sel;
    }
    function drawMap() {
      var r = mapDiv.getBoundingClientRect();
      W = Math.max(100, Math.floor(r.width)); H = Math.max(60, Math.floor(r.height));
      cv.width = W; cv.height = H;
      ctx.clearRect(0, 0, W, H);
      var segs = st.segs.slice().sort(function (a, b) { return b.size - a.size || a.addr - b.addr; });
      layout = [];
      if (segs.length === 0) { ctx.fillStyle = "#555"; ctx.fillText("no segment at this moment", 10, 20); return; }
      var total = 0; segs.forEach(function (g) { total += g.size; });
      var rowBytes = Math.max(segs[0].size, total / Math.max(1, Math.floor(H / 14)));
      /* pack into rows */
      var rowsOf = [], cur = [], used = 0;
      segs.forEach(function (g) {
        if (used + g.size > rowBytes && cur.length) { rowsOf.push(cur); cur = []; used = 0; }
        cur.push(g); used += g.size;
      });
      if (cur.length) rowsOf.push(cur);
      var rh = Math.max(3, Math.min(30, Math.floor((H - 4) / rowsOf.length))), kx = (W - 4) / rowBytes;
      var byseg = new Map();
      st.blocks.forEach(function (b) {
        var i = st.findSeg(b.addr);
        if (i < 0) return;
        var g = st.segs[i];
        if (!byseg.has(g)) byseg.set(g, []);
        byseg.get(g).push(b);
      });
      rowsOf.forEach(function (row, ri) {
        var x = 2, y = 2 + ri * rh;
        row.forEach(function (g) {
          var w = g.size * kx;
          ctx.fillStyle = "#fff"; ctx.fillRect(x, y, w, rh - 1);
          (byseg.get(g) || []).forEach(function (b) {
            var bx = x + (b.addr - g.addr) * kx, bw = Math.max(0.5, b.size * kx);
            ctx.fillStyle = b.state === 2 ? "#d00" : hashColor(b.addr);
            ctx.fillRect(bx, y, bw, rh - 1);
            layout.push([bx, y, bw, rh - 1, g, b]);
          });
          ctx.strokeStyle = "#000"; ctx.lineWidth = 1; ctx.strokeRect(x + 0.5, y + 0.5, Math.max(1, w - 1), rh - 2);
          layout.push([x, y, w, rh - 1, g, null]);
          x += w;
        });
      });
      self.drawn = { segments: segs.length, blocks: st.blocks.size };
    }
    cv.addEventListener("mousemove", function (ev) {
      for (var i = 0; i < layout.length; i++) {
        var L = layout[i];
        if (ev.offsetX >= L[0] && ev.offsetX < L[0] + L[2] && ev.offsetY >= L[1] && ev.offsetY < L[1] + L[3]) {
          var g = L[4], b = L[5];
          if (b) info.textContent = "b'" + b.addr.toString(16) + " " + fmtBoth(b.size) + " allocation"
            + (b.state === 2 ? " (freed, waiting for its stream events)" : "") + " (stream "
            + streamName(g.stream) + ")\n" + stackText(b.stack);
          else info.textContent = "s'" + g.addr.toString(16) + ": segment " + fmtBoth(g.size)
            + " (stream " + streamName(g.stream) + ", " + poolText(g.pool) + ")\n" + stackText(g.stack);
          return;
        }
      }
    });
    list.addEventListener("scroll", renderRows);
    function key(ev) {
      if (ev.target && ev.target.tagName === "INPUT") return;
      if (ev.key === "ArrowDown") select(sel + 1);
      else if (ev.key === "ArrowUp") select(sel - 1);
      else if (ev.key === "PageDown") select(sel + Math.floor(list.clientHeight / ROW));
      else if (ev.key === "PageUp") select(sel - Math.floor(list.clientHeight / ROW));
      else if (ev.key === "Home") select(0);
      else if (ev.key === "End") select(n - 1);
      else return;
      ev.preventDefault();
    }
    document.addEventListener("keydown", key);
    self.destroy = function () { document.removeEventListener("keydown", key); };
    self.select = select;
    self.state = st;
    if (n === 0) {
      info.textContent = "The snapshot has no trace: the map shows its segments and blocks at the "
        + "moment it was taken.";
      drawMap();
    } else {
      var h0 = readHash();
      renderRows();
      select(h0.event !== undefined ? +h0.event : n - 1);
    }
    return self;
  }

  /* ---- settings ----------------------------------------------------------------------------- */

  function settingsView(root) {
    var pre = el("pre", "settings", root);
    pre.textContent = D.has_settings ? JSON.stringify(D.settings, null, 2) : "No allocator settings found.";
    return { name: "settings", destroy: function () {} };
  }

  /* ---- the flame graph of what is alive at the selected moment ------------------------------ */

  function flameView(root, tl) {
    return window.memsnapFlame.view(root, tl, {
      D: D, selectedT: selectedT, el: el, fmtSize: fmtSize, fmtBoth: fmtBoth, elementStack: elementStack,
      shownFrames: shownFrames, stackFrames: stackFrames, frameText: frameText, elementAddr: elementAddr,
      streamName: streamName, seriesCat: seriesCat });
  }

  /* ---- the page ----------------------------------------------------------------------------- */

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
    api.view = current;
  }

  var api = { ready: false };

  /* when each step of the first paint ended (ms since navigation; bench/view_page.sh) */
  function phase(name) { (api.phases = api.phases || {})[name] = Math.round(performance.now()); }

  function main() {
    phase("script");
    app = document.getElementById("app");
    D = parseJSON("ms-data");
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
      STK = window.memsnapData.stacks(TB, D.frames.length);
      D.nstacks = STK.n;
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
    streamIds = {};
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
    streamIds = {};
    blockIndex = null;
    selectedT = -1;
    attachTrace();
    segsByAddr = null;
    PTL = null;
    TL = decodeTimeline(B, "d" + dev + ".tl", pd.tl, false);
    SEG = decodeTimeline(B, "d" + dev + ".seg", pd.seg, true);
    streamFilter = -1;
    poolFilter = "";
    api.data = D; api.timeline = TL; api.segmentTimeline = SEG;
  }

  /* Colour by category, and the categories' legend, each a checkbox that shows or hides its
   * bands (docs/categories.md; the memory timeline's bands, whose .cat section the page has). */
  function categoryControls(bar) {
    if (!D.categories || !TL || !TL.cat) return;
    var lc = el("label", "", bar, "Colour "), csel = el("select", "", lc);
    el("option", "", csel, "allocation").value = "allocation";
    el("option", "", csel, "category").value = "category";
    csel.value = colorBy;
    var legend = el("span", "legend", bar);
    legend.style.display = colorBy === "category" ? "" : "none";
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
      colorBy = v; csel.value = v;
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
      hash = { view: view, device: D.device };
      writeHash();
      build();
    });
    api.device = function (d) { dsel.value = String(d); dsel.dispatchEvent(new Event("change")); };
    var ls = el("label", "", bar, "Stream "), ssel = el("select", "", ls), seen = {};
    var oall = el("option", "", ssel, "all"); oall.value = "-1";
    Object.keys(streamIds).forEach(function (k) { seen[streamIds[k]] = true; });
    Object.keys(seen).map(Number).sort(function (a, b) { return a - b; }).forEach(function (k) {
      var o = el("option", "", ssel, String(k)); o.value = String(k);
    });
    ssel.value = String(streamFilter);
    ssel.addEventListener("change", function () {
      streamFilter = +ssel.value;
      if (current && current.draw) current.draw();
    });
    api.stream = function (k) { ssel.value = String(k); streamFilter = k; if (current && current.draw) current.draw(); };
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
      poolFilter = k; psel.value = k;
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
      allFrames = !!on; fbox.checked = allFrames;
      hash.frames = allFrames ? "all" : ""; writeHash();
      if (current) showView(sel.value, bar, holder);
    }
    fbox.addEventListener("change", function () { setAllFrames(fbox.checked); });
    api.allFrames = setAllFrames;
    /* the time-range selector: trace entries A..B (the timelines show only the steps of those) */
    var lr = el("label", "", bar, "Entries "), ra = el("input", "range", lr);
    el("span", "", lr, " to ");
    var rb = el("input", "range", lr), rclear = el("button", "", lr, "all");
    ra.type = rb.type = "number"; ra.min = rb.min = "0"; ra.max = rb.max = String(Math.max(0, D.ntrace - 1));
    function setRange(a, b) {
      range = a === null || isNaN(a) || isNaN(b) ? null : [Math.min(a, b), Math.max(a, b)];
      ra.value = range ? String(range[0]) : ""; rb.value = range ? String(range[1]) : "";
      hash.from = range ? range[0] : ""; hash.to = range ? range[1] : ""; writeHash();
      if (current && current.applyRange) current.applyRange();
    }
    function rangeInput() {
      if (ra.value !== "" && rb.value !== "") setRange(parseInt(ra.value, 10), parseInt(rb.value, 10));
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
        }, function () { searcher = false; doSearch(); return api.lastSearch; });
      }, window.memsnapSearch.DEBOUNCE_MS);
    }
    ia.addEventListener("input", typed);
    it.addEventListener("input", typed);
    ia.addEventListener("focus", searchStart);
    it.addEventListener("focus", searchStart);
    api.searchInputs = [ia, it];
    bar.search = search;
    var holder = el("div", "view", app);
    hash = readHash();
    hash.device = D.device;
    var first = hash.view || D.view || "timeline";
    if (!VIEWS.some(function (v) { return v[0] === first; })) first = "timeline";
    if (hash.t !== undefined) selectedT = +hash.t;
    allFrames = hash.frames === "all"; fbox.checked = allFrames;
    if (hash.pool !== undefined && (hash.pool === "unknown" || pools[hash.pool])) {
      poolFilter = hash.pool; psel.value = hash.pool;
    }
    if (hash.color === "category" && api.colorBy) api.colorBy("category");
    if (hash.hide && D.categories && api.hideCategory)
      hash.hide.split(",").forEach(function (n) { api.hideCategory(n, true); });
    range = null;
    if (hash.from !== undefined && hash.to !== undefined && D.trace && D.ntrace > 0) {
      var fa = parseInt(hash.from, 10), fb = parseInt(hash.to, 10);
      if (fa >= 0 && fb >= 0) { range = [Math.min(fa, fb), Math.max(fa, fb)]; ra.value = String(range[0]); rb.value = String(range[1]); }
    }
    sel.value = first;
    sel.addEventListener("change", function () { showView(sel.value, bar, holder); });
    api.show = function (name) { sel.value = name; showView(name, bar, holder); };
    api.search = function (a, t) { ia.value = a || ""; it.value = t || ""; doSearch(); return api.lastSearch; };
    api.select = function (t) { selectedT = t; };
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
