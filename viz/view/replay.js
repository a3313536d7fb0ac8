/* SPDX-License-Identifier: MIT
 * memsnap view: the timeline replay in the page (embedded before view.js; no library).
 *
 * MemoryViz's process_alloc_data, redone from its description (docs/view.md): trace entries are
 * matched into elements (an `alloc` and its `free_completed`; an unmatched free or a block alive in
 * the snapshot is an element present from the start), then replayed into stacked bands. With
 * `pools`, elements whose segment (found by address among the snapshot's segments) belongs to a
 * private pool (pool id other than (0, 0): CUDA graphs, MemPool) are drawn inside one grey
 * envelope per pool and stream, as tall as the pool's reserved memory and never shrinking
 * ("Allocated memory (incl. private pools)"). Nothing is summarized here: every element is drawn.
 *
 * The page uses it for that view, and for the timestep at which each trace entry takes effect (the
 * time-range selector); without pools its bands are exactly those memsnap computed in C
 * (the browser test checks that).
 *
 * window.memsnapReplay(input) with input = {trace: {action, addr, size, stream} (typed arrays),
 * segments: the device's segments as in the page's JSON, segmentsView, pools} returns a timeline
 * object shaped as the page's decoded ones (first, T, O, size, elem, color, ghost, sources,
 * maxAt...) plus S (per point sizes of envelopes), alpha, envelopes [{key, pool, stream}] and
 * entryStep (per trace entry, the timestep at which it takes effect).
 */
(function () {
  "use strict";
  var ALLOC = 0, FREE_REQ = 1, FREE_DONE = 2, SEG_ALLOC = 3, SEG_FREE = 4, SEG_MAP = 5, SEG_UNMAP = 6;

  function isPrivate(pid) { return !!pid && !(pid[0] === 0 && pid[1] === 0); }

  /* the snapshot's segments sorted by address, and a lookup of the pool of an address */
  function segmentIndex(segments) {
    var segs = segments.map(function (s) { return { addr: parseInt(s.addr, 16), size: s.size, pool: s.pool }; });
    segs.sort(function (a, b) { return a.addr - b.addr; });
    return function poolOf(addr) {
      var lo = 0, hi = segs.length - 1;
      while (lo <= hi) {
        var mid = (lo + hi) >> 1, g = segs[mid];
        if (addr < g.addr) hi = mid - 1;
        else if (addr >= g.addr + g.size) lo = mid + 1;
        else return g.pool;
      }
      return null;
    };
  }

  /* Phase 1 and 2: elements, actions (element per replayed entry) and what is there at the start */
  function matchElements(inp, poolOf) {
    var tr = inp.trace, n = tr.action.length, seg = inp.segmentsView;
    var aAlloc = seg ? SEG_ALLOC : ALLOC, aFree = seg ? SEG_FREE : FREE_DONE;
    var els = [], initial = [], actions = [], actEntry = [], segEvents = [], live = new Map();
    function add(src, size, stream, ghost, pool) {
      els.push({ src: src, size: size, stream: stream, ghost: ghost, pool: pool });
      return els.length - 1;
    }
    for (var i = 0; i < n; i++) {
      var a = tr.action[i], addr = tr.addr[i], e, isFree = a === aFree;
      /* a free_completed right after the free_requested of its address is one `free`, at the
       * free_requested's place (MemoryViz's annotate_snapshot) */
      if (!seg && a === FREE_REQ) isFree = i + 1 < n && tr.action[i + 1] === FREE_DONE && tr.addr[i + 1] === addr;
      else if (!seg && a === FREE_DONE) isFree = !(i > 0 && tr.action[i - 1] === FREE_REQ && tr.addr[i - 1] === addr);
      if (a === aAlloc) {
        e = add(i, tr.size[i], tr.stream[i], false, undefined);
        live.set(addr, e); actions.push(e); actEntry.push(i);
      } else if (isFree) {
        e = live.get(addr);
        if (e !== undefined) live.delete(addr);
        else { e = add(i, tr.size[i], tr.stream[i], false, undefined); initial.push(e); }
        actions.push(e); actEntry.push(i);
      }
      if (inp.pools && a >= SEG_ALLOC && a <= SEG_UNMAP) {
        var pid = poolOf(addr);
        if (isPrivate(pid))
          segEvents.push({ pos: actions.length, delta: a === SEG_ALLOC || a === SEG_MAP ? tr.size[i] : -tr.size[i],
                           key: pid[0] + "," + pid[1] + ",s" + tr.stream[i] });
      }
    }
    inp.segments.forEach(function (g, k) {
      var addr = parseInt(g.addr, 16);
      if (seg) {
        if (!live.has(addr)) initial.push(add(-1 - g.index, g.size, g.stream, false, g.pool));
        return;
      }
      g.blocks.forEach(function (b, j) {
        if (b[2] === 1 && !live.has(addr)) initial.push(add(-1 - (g.first_block + j), b[1], g.stream, true, g.pool));
        addr += b[0];
      });
      void k;
    });
    els.forEach(function (x) {
      if (x.pool === undefined) x.pool = x.src >= 0 ? poolOf(tr.addr[x.src]) : null;
    });
    initial.reverse();
    if (actions.length === 0 && initial.length > 0) { actions.push(initial.pop()); actEntry.push(n); }
    return { els: els, initial: initial, actions: actions, actEntry: actEntry, segEvents: segEvents };
  }

  function replay(inp) {
    var poolOf = segmentIndex(inp.segments), m = matchElements(inp, poolOf), els = m.els;
    var data = [], current = [], maxAt = [], total = 0, maxSize = 0, t = 0;
    var pools = {}, poolKeys = [], poolActive = new Map();
    var stepOfAction = new Float64Array(m.actions.length + 1);

    function last(a) { return a[a.length - 1]; }
    function advance(k) { t += k; for (var i = 0; i < k; i++) maxAt.push(total); }
    function series(elem, off, size, color, ghost, alpha) {
      var s = { elem: elem, T: [t], O: [off], size: size, S: null, color: color, ghost: ghost, alpha: alpha };
      data.push(s);
      return s;
    }
    function keyOf(e) {
      var x = els[e];
      return inp.pools && isPrivate(x.pool) ? x.pool[0] + "," + x.pool[1] + ",s" + x.stream : null;
    }
    function pool(key) {
      if (!pools[key]) {
        var p = key.split(",");
        pools[key] = { key: key, max: 0, active: 0, reserved: 0, drawn: 0, env: null, blocks: [],
                       index: poolKeys.length, pool: [+p[0], +p[1]], stream: +p[2].slice(1) };
        poolKeys.push(pools[key]);
      }
      return pools[key];
    }
    function envelope(p, off) {
      p.env = series(-2 - p.index, off, 0, 9, false, 1);
      p.env.S = [0];
      p.env.pool = p;
      current.push(p.env);
    }
    function movePoint(s, dt, delta) {
      s.T.push(dt); s.O.push(last(s.O) + delta);
      if (s.S) s.S.push(last(s.S));
    }
    function shiftStripes(p, delta) {
      p.blocks.forEach(function (b) { movePoint(b.s, t, 0); movePoint(b.s, t + 3, delta); });
    }
    function shiftAbove(idx, delta) {
      for (var j = idx; j < current.length; j++) {
        var s = current[j];
        movePoint(s, t, 0); movePoint(s, t + 3, delta);
        if (s.pool) shiftStripes(s.pool, delta);
      }
    }
    function growNoAnim(p, target) {
      if (target <= p.max) return;
      var delta = target - p.max;
      p.max = target;
      p.env.S[p.env.S.length - 1] = p.max;
      total += delta;
      for (var j = current.indexOf(p.env) + 1; j < current.length; j++) current[j].O[current[j].O.length - 1] += delta;
    }
    function grow(p, target) {
      if (target <= p.max) return;
      var delta = target - p.max, env = p.env;
      p.max = target;
      env.T.push(t); env.O.push(last(env.O)); env.S.push(last(env.S));
      env.T.push(t + 3); env.O.push(last(env.O)); env.S.push(p.max);
      shiftAbove(current.indexOf(env) + 1, delta);
      total += delta;
      advance(3);
    }
    function stripe(p, e) {
      var inner = p.drawn;
      p.drawn += els[e].size;
      var s = series(e, last(p.env.O) + inner, els[e].size, e, els[e].ghost, 0.5);
      p.blocks.push({ e: e, inner: inner, s: s });
    }
    function fixStripes() {
      poolKeys.forEach(function (p) {
        if (!p.env) return;
        p.blocks.forEach(function (b) { for (var i = 0; i < b.s.O.length; i++) b.s.O[i] = last(p.env.O) + b.inner; });
      });
    }
    function addAllocation(e) {
      current.push(series(e, total, els[e].size, e, els[e].ghost, 1));
      current[current.length - 1].e = e;
      total += els[e].size;
    }

    m.initial.forEach(function (e) {
      var key = keyOf(e);
      if (!key) { addAllocation(e); return; }
      var p = pool(key);
      poolActive.set(e, key);
      if (!p.env) envelope(p, total);
      p.active += els[e].size;
      growNoAnim(p, Math.max(p.active, p.reserved));
      stripe(p, e);
    });
    fixStripes();
    if (inp.pools) {
      var snapReserved = {}, net = {};
      inp.segments.forEach(function (g) {
        if (isPrivate(g.pool)) {
          var k = g.pool[0] + "," + g.pool[1] + ",s" + g.stream;
          snapReserved[k] = (snapReserved[k] || 0) + g.size;
        }
      });
      m.segEvents.forEach(function (se) { net[se.key] = (net[se.key] || 0) + se.delta; });
      Object.keys(snapReserved).forEach(function (k) {
        var p = pool(k);
        p.reserved = snapReserved[k] - (net[k] || 0);
        if (p.env) growNoAnim(p, p.reserved);
      });
      fixStripes();
    }

    var si = 0, se;
    /* (MemoryViz updates max_size only for the segment events after the last action) */
    function segmentEvents(upTo) {
      while (si < m.segEvents.length && (se = m.segEvents[si]).pos <= upTo) {
        var p = pool(se.key);
        p.reserved += se.delta;
        if (p.reserved > p.max && p.env) grow(p, p.reserved);
        if (upTo === Infinity) maxSize = Math.max(total, maxSize);
        si++;
      }
    }
    for (var ai = 0; ai < m.actions.length; ai++) {
      stepOfAction[ai] = t;
      segmentEvents(ai);
      var e = m.actions[ai], size = els[e].size, key = keyOf(e), p, idx, j;
      if (key) {
        if (!poolActive.has(e)) {
          poolActive.set(e, key);
          p = pool(key);
          if (!p.env) envelope(p, total);
          p.active += size;
          grow(p, Math.max(p.active, p.reserved));
          stripe(p, e);
          advance(1);
        } else {
          p = pools[key];
          idx = -1;
          for (j = 0; j < p.blocks.length; j++) if (p.blocks[j].e === e) { idx = j; break; }
          advance(1);
          if (idx >= 0) {
            var b = p.blocks[idx];
            b.s.T.push(t); b.s.O.push(last(b.s.O));
            p.blocks.splice(idx, 1);
            p.active -= size; p.drawn -= size;
            if (idx < p.blocks.length) {
              for (j = idx; j < p.blocks.length; j++) {
                var q = p.blocks[j];
                q.inner -= size;
                q.s.T.push(t); q.s.O.push(last(q.s.O));
                q.s.T.push(t + 3); q.s.O.push(last(p.env.O) + q.inner);
              }
              advance(3);
            }
          }
          poolActive.delete(e);
        }
        maxSize = Math.max(total, maxSize);
        continue;
      }
      idx = -1;
      for (j = current.length - 1; j >= 0; j--) if (current[j].e === e) { idx = j; break; }
      if (idx === -1) {
        addAllocation(e);
        advance(1);
      } else {
        advance(1);
        var r = current[idx];
        r.T.push(t); r.O.push(last(r.O));
        current.splice(idx, 1);
        if (idx < current.length) { shiftAbove(idx, -size); advance(3); }
        total -= size;
      }
      maxSize = Math.max(total, maxSize);
    }
    segmentEvents(Infinity);
    stepOfAction[m.actions.length] = t;
    current.forEach(function (s) { movePoint(s, t, 0); });
    poolKeys.forEach(function (p) { p.blocks.forEach(function (b) { b.s.T.push(t); b.s.O.push(last(b.s.O)); }); });

    /* the step at which each trace entry takes effect: that of the first action at or after it */
    var n = inp.trace.action.length, entryStep = new Float64Array(n + 1), k = m.actions.length;
    for (var i = n; i >= 0; i--) {
      while (k > 0 && m.actEntry[k - 1] >= i) k--;
      entryStep[i] = stepOfAction[k];
    }
    return pack(data, els, maxAt, maxSize, poolKeys, entryStep, inp.segmentsView);
  }

  /* The timestep at which each trace entry takes effect (the time-range selector), as replay()
   * computes it without pools, but without its points: a free takes one step, and three more
   * when a band is above the freed one, which a stack of places with lazily popped dead ones
   * tells in O(1) amortized. So even a trace whose bands would need billions of points (the
   * viewer data's worst shape, docs/view.md "The budget") costs linear time and memory. */
  function entrySteps(inp) {
    var m = matchElements(inp, segmentIndex(inp.segments)), ne = m.els.length;
    var place = new Int32Array(ne).fill(-1), stack = [], dead = [], t = 0;
    var stepOfAction = new Float64Array(m.actions.length + 1);
    function push(e) { place[e] = stack.length; stack.push(e); dead.push(false); }
    m.initial.forEach(push);
    for (var ai = 0; ai < m.actions.length; ai++) {
      stepOfAction[ai] = t;
      var e = m.actions[ai];
      t += 1;
      if (place[e] < 0) { push(e); continue; }
      dead[place[e]] = true;
      place[e] = -1;
      if (stack.length && !dead[stack.length - 1]) t += 3; /* a live band above the freed one */
      while (stack.length && dead[stack.length - 1]) { stack.pop(); dead.pop(); }
    }
    stepOfAction[m.actions.length] = t;
    var n = inp.trace.action.length, entryStep = new Float64Array(n + 1), k = m.actions.length;
    for (var i = n; i >= 0; i--) {
      while (k > 0 && m.actEntry[k - 1] >= i) k--;
      entryStep[i] = stepOfAction[k];
    }
    return entryStep;
  }

  /* the series as typed arrays, the shape of the page's decoded timelines */
  function pack(data, els, maxAt, maxSize, poolKeys, entryStep, segmentsView) {
    var n = data.length, np = 0, i, k;
    data.forEach(function (s) { np += s.T.length; });
    var tl = {
      segmentsView: segmentsView, n: n, first: new Uint32Array(n + 1), T: new Int32Array(np),
      O: new Float64Array(np), S: new Float64Array(np), size: new Float64Array(n),
      elem: new Int32Array(n), color: new Int32Array(n), ghost: new Uint8Array(n),
      alpha: new Float32Array(n), tmin: new Float64Array(n), tmax: new Float64Array(n),
      sources: new Float64Array(els.length), summ: -1, summSizes: null, summOffsets: null,
      maxAt: new Float64Array(maxAt), maxSize: maxSize, elementsLength: els.length,
      envelopes: poolKeys.map(function (p) { return { key: p.key, pool: p.pool, stream: p.stream, reserved: p.max }; }),
      entryStep: entryStep
    };
    for (i = 0; i < els.length; i++) tl.sources[i] = els[i].src;
    np = 0;
    for (i = 0; i < n; i++) {
      var s = data[i];
      tl.first[i] = np;
      tl.elem[i] = s.elem; tl.color[i] = s.color; tl.ghost[i] = s.ghost ? 1 : 0; tl.alpha[i] = s.alpha;
      tl.size[i] = s.size;
      if (s.S) for (k = 0; k < s.S.length; k++) tl.size[i] = Math.max(tl.size[i], s.S[k]);
      tl.tmin[i] = s.T[0]; tl.tmax[i] = s.T[s.T.length - 1];
      for (k = 0; k < s.T.length; k++, np++) {
        tl.T[np] = s.T[k]; tl.O[np] = s.O[k]; tl.S[np] = s.S ? s.S[k] : s.size;
      }
    }
    tl.first[n] = np;
    var peak = 0;
    for (i = 1; i < tl.maxAt.length; i++) if (tl.maxAt[i] > tl.maxAt[peak]) peak = i;
    tl.peakT = peak;
    tl.nT = Math.max(1, tl.maxAt.length);
    return tl;
  }

  window.memsnapReplay = replay;
  window.memsnapEntrySteps = entrySteps;
})();
