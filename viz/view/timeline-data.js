/* SPDX-License-Identifier: MIT
 * memsnap view: the timelines' data (after common.js). A timeline decoded from its binary sections
 * (viz/view/view.c), PyTorch's max_at_time, the level-of-detail index, what each band stands for
 * (its hover text, stack, stream, address and pool), the filters, and the timeline's marks (OOMs,
 * profiler steps) and time range.
 */
(function () {
  "use strict";

  var V = window.memsnapPage, A = V.A, D = V.D, catOff = V.catOff, fmtBoth = V.fmtBoth,
    streamName = V.streamName, versions = V.versions, hexAddr = V.hexAddr, stackText = V.stackText,
    fmtTime = V.fmtTime, poolText = V.poolText, snapBlock = V.snapBlock,
    segmentOfIndex = V.segmentOfIndex;

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
    return s !== tl.summ && (V.streamFilter < 0 || seriesStreams(tl)[s] === V.streamFilter)
      && (V.poolFilter === "" || seriesPools(tl)[s] === V.poolFilter)
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
  /* the timesteps [lo, hi] the time-range selector allows (the whole run without it) */
  function stepRange(tl) {
    if (!V.range || !D.trace) return [0, tl.nT];
    var st = entrySteps(tl), n = st.length - 1;
    var a = Math.max(0, Math.min(n, V.range[0])), b = Math.max(a, Math.min(n - 1, V.range[1]));
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

  /* a new device: its segments looked up by address again */
  function resetAddrs() { segsByAddr = null; }

  V.decodeTimeline = decodeTimeline; V.lodIndex = lodIndex; V.maxIn = maxIn;
  V.lowerBound = lowerBound; V.eachIn = eachIn; V.elementText = elementText;
  V.elementStack = elementStack; V.elementAddr = elementAddr; V.elementPool = elementPool;
  V.seriesStreams = seriesStreams; V.seriesCat = seriesCat; V.catFiltered = catFiltered;
  V.shown = shown; V.entrySteps = entrySteps; V.oomSteps = oomSteps; V.stepMarks = stepMarks;
  V.stepRange = stepRange; V.offsetAt = offsetAt; V.resetAddrs = resetAddrs;
})();
