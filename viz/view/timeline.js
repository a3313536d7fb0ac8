/* SPDX-License-Identifier: MIT
 * memsnap view: the timeline views (after timeline-search.js): canvas, level of detail, axes and
 * marks, zoom and pan, the minimap, hover and the search's outlines. V.timelineView(root, tl,
 * title) draws timeline tl and returns the view ({name, destroy, draw, setWindow, ...}).
 */
(function () {
  "use strict";

  var V = window.memsnapPage, D = V.D, hash = V.hash, el = V.el, fmtSize = V.fmtSize,
    readHash = V.readHash, writeHash = V.writeHash, maxIn = V.maxIn, lowerBound = V.lowerBound,
    eachIn = V.eachIn, elementText = V.elementText, seriesCat = V.seriesCat,
    catFiltered = V.catFiltered, shown = V.shown, oomSteps = V.oomSteps, stepMarks = V.stepMarks,
    stepRange = V.stepRange, offsetAt = V.offsetAt, searchSync = V.searchSync;

  var TABLEAU10 = ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f",
                   "#edc949", "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"];
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
    /* for the keyboard and screen readers: the plot takes the focus (its keys below) and is named
     * by what it shows; the details are read as they change; the minimap repeats the plot */
    cv.setAttribute("aria-hidden", "true");
    mcv.setAttribute("aria-hidden", "true");
    over.tabIndex = 0;
    over.setAttribute("role", "img");
    info.tabIndex = 0;
    info.setAttribute("role", "status");
    info.setAttribute("aria-live", "polite");
    info.setAttribute("aria-label", "details of the chosen allocation");
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
      + "moment of the flame graph view. The x axis counts timesteps (one per allocation or free "
      + "that changes this timeline; the Steps boxes use the same unit). Keys: + / - zoom, arrows pan, "
      + "* / / zoom vertically (or Shift with the wheel), Down / Up pick the next / previous band "
      + "at the chosen moment, [ / ] move the moment, "
      + "p peak, 0 whole run.";

    /* the top of the y axis: 5% above the window's highest point, divided by the vertical zoom */
    var yz = 1;
    function ymax() {
      var a = Math.max(0, Math.floor(x0)), b = Math.min(tl.maxAt.length - 1, Math.ceil(x1));
      return Math.max(1, maxIn(tl, a, b)) * 1.05 / yz;
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
      var col = V.colorBy === "category" && tl.cat && seriesCat(tl, s) >= 0
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
      var filter = V.streamFilter >= 0 || V.poolFilter !== "" || tl.cat && catFiltered();
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
      over.setAttribute("aria-label", (tl.segmentsView ? "Cached segments" : "Allocations") + " over timesteps "
        + Math.round(x0) + " to " + Math.round(x1) + " of " + tl.nT + "; peak " + fmtSize(tl.maxAt[tl.peakT])
        + " at timestep " + tl.peakT + (V.selectedT >= 0 ? "; chosen moment: timestep " + V.selectedT : "")
        + ". Down and Up pick a band at the chosen moment, [ and ] move it, + and - zoom, arrows pan.");
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
      /* whole timesteps, each once, at a round spacing; every label inside the canvas */
      var labels = self.labels = [];
      function label(text, x, y) {
        var w = ctx.measureText(text).width, lx = Math.max(0, Math.min(W - 1 - w, x));
        ctx.fillText(text, lx, y);
        labels.push([text, lx, lx + w]);
      }
      for (var i = 0; i <= 4; i++) label(fmtSize(Y * i / 4), 4, Yp(Y * i / 4) + 4);
      /* the x axis' unit, under the y axis' labels */
      ctx.fillStyle = "#666"; label("timestep", 4, H - 5); ctx.fillStyle = "#222";
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
      if (V.selectedT >= 0) {
        var x = X(V.selectedT);
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
    /* The minimap: the whole run between the same margins as the plot, so that a timestep is
     * above itself at the whole-run window (MX: its column; MT: back). */
    function MX(t) { return pad.l + t / tl.nT * (MW - pad.l - pad.r); }
    function MT(x) { return (x - pad.l) / (MW - pad.l - pad.r) * tl.nT; }
    function drawMini() {
      mctx.clearRect(0, 0, MW, MH);
      var n = tl.maxAt.length, x, cw = MW - pad.l - pad.r;
      if (!miniCols) {
        /* the maximum per pixel column, once per size */
        miniCols = new Float64Array(cw + 1);
        for (x = 0; x < cw; x++) {
          var a = Math.floor(x / cw * n), b = Math.min(n - 1, Math.max(a, Math.floor((x + 1) / cw * n) - 1));
          miniCols[x] = a < n ? maxIn(tl, a, b) : 0;
          if (miniCols[x] > miniCols[cw]) miniCols[cw] = miniCols[x];
        }
      }
      var m = Math.max(1, miniCols[cw]);
      mctx.fillStyle = "#9ab";
      mctx.beginPath(); mctx.moveTo(pad.l, MH);
      for (x = 0; x < cw; x++) mctx.lineTo(pad.l + x, MH - miniCols[x] / m * (MH - 4));
      mctx.lineTo(pad.l + cw, MH); mctx.fill();
      var lim = stepRange(tl);
      mctx.fillStyle = "rgba(255,255,255,0.7)";
      mctx.fillRect(pad.l, 0, MX(lim[0]) - pad.l, MH);
      mctx.fillRect(MX(lim[1]), 0, pad.l + cw - MX(lim[1]), MH);
      mctx.fillStyle = "rgba(0,0,0,0.15)";
      var bx0 = MX(x0), bx1 = MX(x1);
      mctx.fillRect(bx0, 0, Math.max(2, bx1 - bx0), MH);
    }
    self.miniX = MX;

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
    /* vertical zoom: f times taller (1 at least: the whole height of the window fits) */
    function zoomY(f) {
      yz = Math.max(1, Math.min(1 << 20, yz * f));
      draw();
    }
    self.zoomY = zoomY;
    self.yMax = function () { return Y; };
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
      V.selectedT = tl.peakT; drawOverlay();
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
      V.selectedT = Math.max(0, Math.round(T(ev.offsetX)));
      hash.t = V.selectedT; writeHash();
      show(s);
      drawOverlay();
    });
    over.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      if (ev.shiftKey) zoomY(ev.deltaY > 0 ? 0.8 : 1.25);
      else zoomAt(T(ev.offsetX), ev.deltaY > 0 ? 1.25 : 0.8);
    }, { passive: false });
    var brush = null;
    mcv.addEventListener("mousedown", function (ev) { brush = ev.offsetX; });
    mcv.addEventListener("mouseup", function (ev) {
      if (brush === null) return;
      var a = Math.min(brush, ev.offsetX), b = Math.max(brush, ev.offsetX);
      brush = null;
      if (b - a < 3) { var c = MT(a), w = x1 - x0; setWindow(c - w / 2, c + w / 2); }
      else setWindow(MT(a), MT(b));
    });
    /* The bands alive at the chosen moment (the peak when none is chosen), top first: Down picks
     * the next one below the one picked, Up the one above; its details are shown (and read). */
    function pickBand(dir) {
      var t = V.selectedT >= 0 ? Math.min(V.selectedT, tl.nT - 1) : tl.peakT, alive = [];
      if (V.selectedT < 0) { V.selectedT = t; hash.t = t; writeHash(); }
      eachIn(tl, t, t, function (s) {
        var o = shown(tl, s) && tl.tmin[s] <= t && t < tl.tmax[s] ? offsetAt(tl, s, t) : NaN;
        if (!isNaN(o)) alive.push([o, s]);
      });
      alive.sort(function (a, b) { return b[0] - a[0] || a[1] - b[1]; });
      if (!alive.length) {
        pinned = -1; drawOverlay();
        info.textContent = "Timestep " + t + ": no band alive.";
        return;
      }
      var k = -1;
      alive.forEach(function (x, i) { if (x[1] === pinned) k = i; });
      k = k < 0 ? (dir > 0 ? 0 : alive.length - 1) : Math.max(0, Math.min(alive.length - 1, k + dir));
      pinned = alive[k][1];
      if (t < x0 || t > x1) setWindow(t - (x1 - x0) / 2, t + (x1 - x0) / 2);
      drawOverlay();
      info.textContent = "Band " + (k + 1) + " of " + alive.length + " at timestep " + t + " (top first):\n"
        + elementText(tl, pinned);
    }
    /* [ and ]: the chosen moment a step (a hundredth of the window at least) earlier or later */
    function moveMoment(dir) {
      var t = V.selectedT >= 0 ? V.selectedT : tl.peakT;
      t = Math.max(0, Math.min(tl.nT - 1, t + dir * Math.max(1, Math.round((x1 - x0) / 100))));
      V.selectedT = t; hash.t = t; writeHash();
      pinned = -1;
      if (t < x0 || t > x1) setWindow(t - (x1 - x0) / 2, t + (x1 - x0) / 2);
      drawOverlay();
      info.textContent = "Timestep " + t + " chosen: Down and Up pick a band alive then.";
    }
    self.pickBand = pickBand;
    self.picked = function () { return pinned; };
    function key(ev) {
      var tag = ev.target && ev.target.tagName;
      if (tag === "INPUT" || tag === "SELECT" || tag === "BUTTON") return;
      var w = x1 - x0, c = (x0 + x1) / 2;
      if (ev.key === "+" || ev.key === "=") zoomAt(c, 0.5);
      else if (ev.key === "-") zoomAt(c, 2);
      else if (ev.key === "ArrowLeft") setWindow(x0 - w / 4, x1 - w / 4);
      else if (ev.key === "ArrowRight") setWindow(x0 + w / 4, x1 + w / 4);
      else if (ev.key === "p") self.peak();
      else if (ev.key === "ArrowDown") pickBand(1);
      else if (ev.key === "ArrowUp") pickBand(-1);
      else if (ev.key === "[") moveMoment(-1);
      else if (ev.key === "]") moveMoment(1);
      else if (ev.key === "*") zoomY(2);
      else if (ev.key === "/") zoomY(0.5);
      else if (ev.key === "0") { yz = 1; self.applyRange(); }
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

  V.timelineView = timelineView;
})();
