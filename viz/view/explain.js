/* SPDX-License-Identifier: MIT
 * memsnap view: the Explain panel (embedded before view.js; no library). docs/view.md, "Explain".
 *
 * It shows the answer `memsnap explain` gives for the device (computed by memsnap in C and carried
 * in the page's data: viz/view/answer.c): the moment (the first OOM, else the peak), the capacity,
 * the verdict, the figures of the allocator's state, the remedies replayed and the
 * recommendation; a chart of allocated and reserved memory over the trace with every OOM marked;
 * and, for a moment chosen on a timeline, the verdict that the same rules give for the state the
 * page holds at that moment (docs/explain.md: at a moment without a failed request).
 *
 * window.memsnapExplain.view(root, ctx) with ctx = {el, fmtSize, fmtBoth, answer, trace (the
 * device's trace columns or null), A (the action codes), selected (a trace step, or -1),
 * stateAt (step -> {segs, blocks}) or null} returns {name, destroy, draw}.
 * window.memsnapExplain.stateVerdict(segs, blocks) is the rule, exported for the tests.
 */
(function () {
  "use strict";

  var VERDICT_COLOR = { full: "#b00", fragmentation: "#c60", releasable: "#07a",
                        private_pool: "#708", unknown: "#555" };

  /* The verdict of a state without a failed request (explain's rules at a peak or an end state):
   * segs [{addr, size, pool}], blocks [{addr, size, state}] (state 1 allocated, 2 pending free). */
  function stateVerdict(segs, blocks) {
    var f = { reserved: 0, allocated: 0, active: 0, cached_free: 0, inactive_split: 0,
              releasable: 0, private_free: 0, largest_free: 0 };
    var bs = blocks.slice().sort(function (a, b) { return a.addr - b.addr; }), k = 0;
    segs.slice().sort(function (a, b) { return a.addr - b.addr; }).forEach(function (g) {
      var end = g.addr + g.size, at = g.addr, live = 0, nlive = 0, gap = 0;
      while (k < bs.length && bs[k].addr < g.addr) k++;
      for (; k < bs.length && bs[k].addr < end; k++) {
        var b = bs[k];
        if (b.addr > at) gap = Math.max(gap, b.addr - at);
        live += b.size; nlive++;
        if (b.state === 1) f.allocated += b.size;
        at = b.addr + b.size;
      }
      if (end > at) gap = Math.max(gap, end - at);
      var free = Math.max(0, g.size - live), priv = g.pool && !(g.pool[0] === 0 && g.pool[1] === 0);
      f.reserved += g.size; f.active += live; f.cached_free += free;
      f.largest_free = Math.max(f.largest_free, gap);
      if (nlive > 0) f.inactive_split += free;
      if (priv) f.private_free += free;
      else if (nlive === 0) f.releasable += g.size;
    });
    var v;
    if (f.reserved === 0) v = "unknown";
    else if (f.cached_free <= f.reserved / 10) v = "full";
    else {
      var split = Math.max(0, f.inactive_split - f.private_free);
      if (f.releasable >= split && f.releasable >= f.private_free) v = "releasable";
      else if (split >= f.private_free) v = "fragmentation";
      else v = "private_pool";
    }
    f.verdict = v;
    return f;
  }

  function view(root, ctx) {
    var el = ctx.el, fmtSize = ctx.fmtSize, fmtBoth = ctx.fmtBoth, x = ctx.answer;
    var self = { name: "explain", destroy: function () {}, draw: function () {} };
    var box = el("div", "explain", root);
    if (!x || x.error) {
      el("div", "err", box, "No answer for this device: " + (x && x.error ? x.error : "none computed"));
      return self;
    }
    var what = { oom: "Out of memory", peak: "The peak of allocated memory", end: "The end state",
                 at: "The moment asked for" }[x.moment] || x.moment;
    el("h3", "", box, what + (x.entry !== null ? ", after trace entry " + x.entry : "")
       + (x.step !== null ? ", step " + x.step : "") + (x.phase ? ", phase \u201c" + x.phase + "\u201d" : ""));
    var vd = el("div", "verdict", box, "Verdict: " + x.verdict_text);
    vd.style.color = VERDICT_COLOR[x.verdict] || "#222";
    vd.dataset.verdict = x.verdict;

    /* the chart: allocated and reserved over the trace, OOMs and the moment marked */
    var plot = el("div", "explain-chart", box), cv = el("canvas", "", plot), c2 = cv.getContext("2d");
    var legend = el("div", "note", box, "");
    function draw() {
      var W = Math.max(200, plot.clientWidth || 600), H = 160, pad = { l: 64, r: 8, t: 8, b: 18 };
      cv.width = W; cv.height = H;
      c2.clearRect(0, 0, W, H);
      var s = x.series || [], n = s.length;
      if (!n) { c2.fillStyle = "#555"; c2.fillText("no trace: no chart", pad.l, 20); return; }
      var last = s[n - 1][0] + 1, ymax = 1;
      s.forEach(function (p) { ymax = Math.max(ymax, p[1], p[2]); });
      if (x.capacity_bytes) ymax = Math.max(ymax, x.capacity_bytes);
      function X(step) { return pad.l + (W - pad.l - pad.r) * step / Math.max(1, last); }
      function Y(b) { return H - pad.b - (H - pad.t - pad.b) * b / ymax; }
      c2.strokeStyle = "#999"; c2.beginPath(); c2.moveTo(pad.l, pad.t); c2.lineTo(pad.l, H - pad.b);
      c2.lineTo(W - pad.r, H - pad.b); c2.stroke();
      c2.fillStyle = "#222"; c2.font = "11px sans-serif";
      for (var i = 0; i <= 2; i++) c2.fillText(fmtSize(ymax * i / 2), 2, Y(ymax * i / 2) + 4);
      function line(col, k) {
        c2.strokeStyle = col; c2.lineWidth = 1.5; c2.beginPath();
        s.forEach(function (p, j) { var px = X(p[0]); if (j) c2.lineTo(px, Y(p[k])); else c2.moveTo(px, Y(p[k])); });
        c2.stroke();
      }
      line("#e8a33c", 2); /* reserved */
      line("#4e79a7", 1); /* allocated */
      function mark(step, col, label, dash) {
        var px = X(step);
        c2.strokeStyle = col; c2.setLineDash(dash); c2.beginPath();
        c2.moveTo(px, pad.t); c2.lineTo(px, H - pad.b); c2.stroke(); c2.setLineDash([]);
        c2.fillStyle = col;
        c2.fillText(label, px + 3 + c2.measureText(label).width > W ? px - 3 - c2.measureText(label).width : px + 3, pad.t + 10);
      }
      if (x.capacity_bytes) {
        c2.strokeStyle = "#b00"; c2.setLineDash([2, 2]); c2.beginPath();
        c2.moveTo(pad.l, Y(x.capacity_bytes)); c2.lineTo(W - pad.r, Y(x.capacity_bytes)); c2.stroke();
        c2.setLineDash([]);
      }
      var tr = ctx.trace, nooms = 0;
      if (tr) for (var e = 0; e < tr.action.length; e++)
        if (tr.action[e] === ctx.A.OOM) { mark(e + 1, "#d00", "OOM", [4, 3]); nooms++; }
      if (x.entry !== null && x.moment !== "oom") mark(x.entry + 1, "#222", x.moment, [1, 2]);
      if (ctx.selected >= 0) mark(ctx.selected, "#080", "selected", [1, 2]);
      legend.textContent = "Allocated (blue) and reserved (orange) bytes over the trace entries"
        + (x.capacity_bytes ? "; the capacity " + fmtSize(x.capacity_bytes) + " (dotted red)" : "")
        + (tr ? "; " + nooms + " OOM" + (nooms === 1 ? "" : "s") + " (dashed red)" : "; OOMs are marked once the trace is read")
        + ".";
    }
    self.draw = draw;

    function table(rows, head) {
      var t = el("table", "figures", box);
      if (head) { var hr = el("tr", "", t); head.forEach(function (h) { el("th", "", hr, h); }); }
      rows.forEach(function (r) { var tr = el("tr", "", t); r.forEach(function (c) { el("td", "", tr, c); }); });
      return t;
    }
    var cap = x.capacity_bytes ? fmtBoth(x.capacity_bytes) + " (" + {
      recorded: "recorded in the snapshot", inferred_from_oom: "inferred from the OOM at entry "
        + x.capacity_oom_entry + ": reserved + device_free", given: "given" }[x.capacity_source] + ")"
      : "unknown (the snapshot records no device size and no OOM says it)";
    var rows = [["capacity", cap]];
    if (x.request_bytes !== null) rows.push(["request", fmtBoth(x.request_bytes)]);
    if (x.device_free_bytes !== null) rows.push(["free on the device", fmtBoth(x.device_free_bytes)]);
    [["reserved", "reserved_bytes"], ["allocated", "allocated_bytes"], ["requested", "requested_bytes"],
     ["free in the cache", "cached_free_bytes"], ["largest free block (request's pool)", "largest_free_block_bytes"],
     ["inactive split", "inactive_split_bytes"], ["whole free segments (releasable)", "releasable_bytes"],
     ["private pools", "private_pool_bytes"]].forEach(function (p) { rows.push([p[0], fmtBoth(x[p[1]])]); });
    if (x.outside_allocator_bytes !== null) rows.push(["outside the allocator", fmtBoth(x.outside_allocator_bytes)]);
    table(rows);

    el("h4", "", box, "Remedies" + (x.capacity_bytes ? ", replayed at " + fmtSize(x.capacity_bytes) : ""));
    if (x.remedies.length) {
      table(x.remedies.map(function (r) {
        return [r.config || "(the recorded settings)",
                !r.replayed ? r.note || "" : r.avoids_oom === null ? "?" : r.avoids_oom ? "avoids the OOM" : "OOM",
                r.peak_reserved === null ? "" : fmtSize(r.peak_reserved)];
      }), ["configuration", "at the capacity", "peak reserved"]).className = "figures remedies";
    } else {
      el("div", "note", box, x.replay_note ? "None: " + x.replay_note
        : "Not replayed in this page (they are for devices with an OOM, or with `memsnap view --explain`); "
          + "`memsnap explain FILE` replays them and finds each one's smallest capacity.");
    }
    if (x.recommendation) el("div", "recommend", box, "Recommendation: " + x.recommendation);
    if (x.hint) el("div", "note", box, x.hint);

    el("h4", "", box, "Biggest holders by source line (allocated bytes, blocks)");
    table(x.top.map(function (h) { return [fmtSize(h.bytes), String(h.blocks), h.key]; }));
    var cats = (x.top_by_category || []).filter(function (c) { return c.bytes > 0; });
    if (cats.length)
      el("div", "note", box, "By category: " + cats.map(function (c) { return c.key + " " + fmtSize(c.bytes); }).join(", "));

    /* the moment chosen on a timeline */
    if (ctx.selected >= 0 && ctx.stateAt) {
      var st = ctx.stateAt(ctx.selected), f = stateVerdict(st.segs, st.blocks);
      el("h4", "", box, "At the selected moment (after " + ctx.selected + " trace entries)");
      var sv = el("div", "verdict", box, "Verdict: " + f.verdict + ": reserved " + fmtSize(f.reserved)
        + ", allocated " + fmtSize(f.allocated) + ", free in the cache " + fmtSize(f.cached_free)
        + " (inactive split " + fmtSize(f.inactive_split) + ", whole free segments "
        + fmtSize(f.releasable) + ", free in private pools " + fmtSize(f.private_free) + ")");
      sv.style.color = VERDICT_COLOR[f.verdict] || "#222";
      sv.dataset.verdict = f.verdict;
      self.selectedVerdict = f;
    } else {
      el("div", "note", box, "Click a moment on a timeline to see the verdict at it too.");
    }
    requestAnimationFrame(draw);
    window.addEventListener("resize", draw);
    self.destroy = function () { window.removeEventListener("resize", draw); };
    return self;
  }

  window.memsnapExplain = { view: view, stateVerdict: stateVerdict };
})();
