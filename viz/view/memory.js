/* SPDX-License-Identifier: MIT
 * memsnap view: the "Memory over time" view (embedded before view.js; no library). docs/view.md,
 * "Memory over time".
 *
 * It draws the device's memory over the trace from the data memsnap computes in C (the page's
 * per-device "memory": viz/view/memory.c), at most 512 buckets of steps, each the most bytes at
 * any of its steps: on one chart the reserved memory (segments and expandable segments' mapped
 * ranges), the allocated memory and the part of reserved memory mapped in expandable segments;
 * below it the fragmentation (reserved minus allocated) and the largest free block of each pool,
 * read at up to 64 steps. A table gives the peaks, and the largest free blocks at the end.
 *
 * window.memsnapMemory.view(root, ctx) with ctx = {el, fmtSize, fmtBoth, memory (or null)}
 * returns {name, destroy, draw, layout: {X(step), Y(bytes) of the top chart, Yf(bytes) of the
 * bottom one}, figures}.
 */
(function () {
  "use strict";

  var COLORS = { reserved: "#4e79a7", allocated: "#f28e2c", mapped: "#af7aa1", frag: "#e15759" };
  var POOL_COLORS = ["#59a14f", "#76b7b2", "#edc949", "#9c755f", "#ff9da7", "#bab0ab"];

  /* the bucket's and the sample's index of each step, and the figures of the table */
  function figures(m) {
    var f = { peakReserved: 0, peakReservedStep: 0, peakAllocated: 0, peakAllocatedStep: 0,
              mostFrag: 0, mostFragStep: 0, mappedEnd: m.mapped[m.mapped.length - 1], freeEnd: [] };
    for (var i = 0; i < m.step.length; i++) {
      if (m.reserved[i] > f.peakReserved) { f.peakReserved = m.reserved[i]; f.peakReservedStep = m.step[i]; }
      if (m.allocated[i] > f.peakAllocated) { f.peakAllocated = m.allocated[i]; f.peakAllocatedStep = m.step[i]; }
      if (m.frag[i] > f.mostFrag) { f.mostFrag = m.frag[i]; f.mostFragStep = m.step[i]; }
    }
    m.free_pools.forEach(function (p, k) {
      var row = m.largest_free[k];
      f.freeEnd.push({ pool: p, bytes: row[row.length - 1] });
    });
    return f;
  }

  function view(root, ctx) {
    var el = ctx.el, fmtSize = ctx.fmtSize, fmtBoth = ctx.fmtBoth, m = ctx.memory;
    var self = { name: "memory", destroy: function () {}, draw: function () {} };
    if (!m || !m.step || m.step.length === 0) {
      el("div", "note", root, "No memory over time: the trace of this device could not be indexed.");
      return self;
    }
    var f = self.figures = figures(m);
    var box = el("div", "memory", root);
    var legend = el("div", "memory-legend", box);
    [["reserved", "reserved (segments and mapped ranges)"], ["allocated", "allocated"],
     ["mapped", "mapped in expandable segments"], ["frag", "reserved - allocated"]].forEach(function (k) {
      var s = el("span", "", legend);
      el("span", "swatch", s, "\u25a0").style.color = COLORS[k[0]];
      s.appendChild(document.createTextNode(k[1] + " "));
    });
    m.free_pools.forEach(function (p, k) {
      var s = el("span", "", legend);
      el("span", "swatch", s, "\u2014").style.color = POOL_COLORS[k % POOL_COLORS.length];
      s.appendChild(document.createTextNode("largest free block, pool (" + p[0] + ", " + p[1] + ") "));
    });
    var plot = el("div", "memory-plot", box), cv = el("canvas", "", plot);
    cv.setAttribute("role", "img");
    cv.setAttribute("aria-label", "Reserved and allocated memory over the trace; below, reserved minus "
      + "allocated and the largest free block of each pool");
    var info = el("pre", "info", box);
    var table = el("table", "figures", box), rows = [
      ["peak reserved", fmtBoth(f.peakReserved) + " at step " + f.peakReservedStep],
      ["peak allocated", fmtBoth(f.peakAllocated) + " at step " + f.peakAllocatedStep],
      ["most reserved - allocated", fmtBoth(f.mostFrag) + " at step " + f.mostFragStep],
      ["mapped in expandable segments at the end", fmtBoth(f.mappedEnd)]];
    f.freeEnd.forEach(function (x) {
      rows.push(["largest free block at the end, pool (" + x.pool[0] + ", " + x.pool[1] + ")", fmtBoth(x.bytes)]);
    });
    rows.forEach(function (r) { var tr = el("tr", "", table); el("th", "", tr, r[0]); el("td", "", tr, r[1]); });

    var c2 = cv.getContext("2d"), W = 0, H = 0, pad = { l: 70, r: 12, t: 10, b: 20 }, split = 0;
    var n = m.steps, top = 1, bot = 1;
    m.reserved.forEach(function (v, i) { top = Math.max(top, v, m.allocated[i]); });
    m.frag.forEach(function (v) { bot = Math.max(bot, v); });
    m.largest_free.forEach(function (row) { row.forEach(function (v) { bot = Math.max(bot, v); }); });
    top *= 1.05; bot *= 1.05;
    function X(step) { return pad.l + step / Math.max(1, n - 1) * (W - pad.l - pad.r); }
    function Y(b) { return pad.t + (split - pad.t) * (1 - b / top); }
    function Yf(b) { return split + 24 + (H - pad.b - split - 24) * (1 - b / bot); }
    self.layout = { X: X, Y: Y, Yf: Yf };
    /* a bucket's value from its first step to the next bucket's */
    function steps(vals, Yof, fill, color) {
      c2.beginPath();
      c2.moveTo(X(m.step[0]), Yof(0));
      for (var i = 0; i < vals.length; i++) {
        var xa = X(m.step[i]), xb = X(i + 1 < vals.length ? m.step[i + 1] : n - 1);
        c2.lineTo(xa, Yof(vals[i])); c2.lineTo(xb, Yof(vals[i]));
      }
      if (fill) { c2.lineTo(X(n - 1), Yof(0)); c2.closePath(); c2.fillStyle = color; c2.fill(); }
      else { c2.strokeStyle = color; c2.lineWidth = 2; c2.stroke(); }
    }
    function axis(y0, y1, max) {
      c2.fillStyle = "#222"; c2.strokeStyle = "#999"; c2.font = "11px sans-serif"; c2.lineWidth = 1;
      c2.beginPath(); c2.moveTo(pad.l, y0); c2.lineTo(pad.l, y1); c2.lineTo(W - pad.r, y1); c2.stroke();
      for (var i = 0; i <= 2; i++) c2.fillText(fmtSize(max / 1.05 * i / 2), 4, y1 - (y1 - y0) * i / 2 / 1.05 + 4);
    }
    function draw() {
      var r = plot.getBoundingClientRect();
      W = cv.width = Math.max(300, Math.floor(r.width));
      H = cv.height = Math.max(240, Math.floor(r.height));
      split = Math.round((H - pad.b) * 0.6);
      c2.clearRect(0, 0, W, H);
      steps(m.reserved, Y, true, COLORS.reserved);
      steps(m.allocated, Y, true, COLORS.allocated);
      c2.setLineDash([5, 3]); steps(m.mapped, Y, false, COLORS.mapped); c2.setLineDash([]);
      axis(pad.t, split, top);
      steps(m.frag, Yf, true, COLORS.frag);
      m.largest_free.forEach(function (row, k) {
        c2.beginPath();
        row.forEach(function (v, i) { var x = X(m.free_step[i]); if (i) c2.lineTo(x, Yf(v)); else c2.moveTo(x, Yf(v)); });
        c2.strokeStyle = POOL_COLORS[k % POOL_COLORS.length]; c2.lineWidth = 2; c2.stroke();
      });
      axis(split + 24, H - pad.b, bot);
      c2.fillStyle = "#222";
      c2.fillText("step " + (n - 1), W - pad.r - c2.measureText("step " + (n - 1)).width, H - 4);
      c2.fillText("step 0", pad.l, H - 4);
    }
    function bucketAt(x) {
      var step = (x - pad.l) / (W - pad.l - pad.r) * Math.max(1, n - 1), lo = 0, hi = m.step.length - 1;
      while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (m.step[mid] <= step) lo = mid; else hi = mid - 1; }
      return lo;
    }
    cv.addEventListener("mousemove", function (ev) {
      var r = cv.getBoundingClientRect(), i = bucketAt(ev.clientX - r.left);
      var z = i + 1 < m.step.length ? m.step[i + 1] - 1 : n - 1;
      info.textContent = "steps " + m.step[i] + ".." + z + " (the most at any of them): reserved "
        + fmtBoth(m.reserved[i]) + ", allocated " + fmtBoth(m.allocated[i]) + ", mapped in expandable "
        + "segments " + fmtBoth(m.mapped[i]) + ", reserved - allocated " + fmtBoth(m.frag[i]);
    });
    info.textContent = "Hover the chart for a bucket's figures. Each point is the most bytes at any "
      + "step of its bucket (" + m.step.length + " buckets of " + n + " steps); the largest free "
      + "blocks are read at " + m.free_step.length + " steps.";
    self.draw = draw;
    window.addEventListener("resize", draw);
    self.destroy = function () { window.removeEventListener("resize", draw); };
    draw();
    return self;
  }

  window.memsnapMemory = { view: view, figures: figures };
})();
