/* SPDX-License-Identifier: MIT
 * memsnap view: "Compare two moments" (embedded before view.js; no library). docs/view.md,
 * "Compare two moments".
 *
 * What is alive at moment A and at moment B (timesteps of the Active Memory Timeline; an
 * allocation is alive at t when its band starts at or before t and ends after it, as in the flame
 * graph), grouped as the top consumers group (consumers.js: by source line, category or stack),
 * and per group what changed: "appeared" (nothing at A), "went away" (nothing at B), "grew",
 * "shrank" or "same", with the bytes and counts at A and at B, biggest change first; below, the
 * allocations alive at B and not at A (new), at A and not at B (freed), at both (kept). Sortable
 * by a click on a column's head; the groups downloadable as CSV.
 *
 * window.memsnapDiff.view(root, tl, c) with c = the flame graph's context (D, selectedT, el,
 * fmtSize, fmtBoth, elementStack, shownFrames, frameText, seriesCat), c.hash (the URL state: da,
 * db) and c.writeHash, returns {name, destroy, set(a, b), rows(by) -> [[group, status, bytesA,
 * bytesB, countA, countB]], totals {a, b, kept, added, freed, addedBytes, freedBytes}, csv(by)}.
 * window.memsnapDiff.compare(itemsA, itemsB, by) is the comparison alone.
 */
(function () {
  "use strict";

  var SHOWN = 100, STATUS_ORDER = { appeared: 0, grew: 1, "went away": 2, shrank: 3, same: 4 };

  /* [group, status, bytes at A, bytes at B, count at A, count at B], biggest change first (then
   * by name) */
  function compare(itemsA, itemsB, by) {
    var C = window.memsnapConsumers, ga = C.group(itemsA, by), gb = C.group(itemsB, by), out = [];
    var names = new Set(Array.from(ga.keys()).concat(Array.from(gb.keys())));
    names.forEach(function (k) {
      var a = ga.get(k) || [k, 0, 0], b = gb.get(k) || [k, 0, 0];
      var st = a[2] === 0 ? "appeared" : b[2] === 0 ? "went away" : b[1] > a[1] ? "grew"
        : b[1] < a[1] ? "shrank" : "same";
      out.push([k, st, a[1], b[1], a[2], b[2]]);
    });
    out.sort(function (p, q) {
      return Math.abs(q[3] - q[2]) - Math.abs(p[3] - p[2]) || (p[0] < q[0] ? -1 : p[0] > q[0] ? 1 : 0);
    });
    return out;
  }

  function view(root, tl, c) {
    var el = c.el, fmtSize = c.fmtSize, fmtBoth = c.fmtBoth, hash = c.hash || {};
    var self = { name: "diff", destroy: function () {} };
    var last = Math.max(0, tl.nT - 1);
    function clamp(v, d) { v = Math.round(+v); return isFinite(v) && v >= 0 ? Math.min(v, last) : d; }
    /* B: the moment chosen on a timeline (else the peak); A: the URL's, else the start */
    var tb = clamp(hash.db, c.selectedT >= 0 ? c.selectedT : tl.peakT), ta = clamp(hash.da, 0);
    var head = el("div", "consumers-head", root), by = "source", sortCol = -1, sortDown = true;
    var la = el("label", "", head, "moment A: timestep "), ia = el("input", "", la);
    var lb = el("label", "", head, " moment B: timestep "), ib = el("input", "", lb);
    ia.type = ib.type = "number"; ia.min = ib.min = "0"; ia.max = ib.max = String(last);
    ia.setAttribute("aria-label", "moment A, a timestep"); ib.setAttribute("aria-label", "moment B, a timestep");
    var lg = el("label", "", head, " by "), sel = el("select", "", lg);
    [["source", "source line"], ["category", "category"], ["stack", "stack"]].forEach(function (o) {
      if (o[0] === "category" && !(tl.cat && c.D.categories)) return;
      el("option", "", sel, o[1]).value = o[0];
    });
    var bcsv = el("button", "", head, "Download CSV");
    var summary = el("div", "note", root);
    var box = el("div", "consumers", root), tab = el("table", "figures", box);
    tab.setAttribute("aria-label", "what changed between moment A and moment B, by group");
    var itemOf = window.memsnapConsumers.itemOf(tl, c), A = [], B = [], ka = [], kb = [];

    function alive(t) {
      var out = [];
      for (var s = 0; s < tl.n; s++) if (s !== tl.summ && tl.tmin[s] <= t && tl.tmax[s] > t) out.push(s);
      return out;
    }
    function rows(b) {
      var r = compare(A, B, b || by);
      if (sortCol >= 0) r.sort(function (p, q) {
        var d = sortCol === 1 ? STATUS_ORDER[p[1]] - STATUS_ORDER[q[1]]
          : sortCol === 0 ? (p[0] < q[0] ? -1 : p[0] > q[0] ? 1 : 0)
          : sortCol === 4 ? (p[3] - p[2]) - (q[3] - q[2]) : p[sortCol] - q[sortCol];
        return (sortDown ? -d : d) || (p[0] < q[0] ? -1 : p[0] > q[0] ? 1 : 0);
      });
      return r;
    }
    function render() {
      var r = rows();
      tab.textContent = "";
      var tr = el("tr", "", tab);
      [by === "source" ? "source line" : by, "change", "bytes at A", "bytes at B", "difference",
       "count at A", "count at B"].forEach(function (h, i) {
        var col = i <= 4 ? i : -1, th = el("th", "", tr);
        var text = h + (col === sortCol && col >= 0 ? (sortDown ? " \u25be" : " \u25b4") : "");
        th.setAttribute("scope", "col");
        if (col >= 0) {
          /* a button, so that the keyboard sorts too (as the top consumers' heads) */
          var b = el("button", "sort", th, text);
          th.setAttribute("aria-sort", col === sortCol ? (sortDown ? "descending" : "ascending") : "none");
          b.addEventListener("click", function () {
            self.sort(col);
            var again = tab.querySelectorAll("th button")[col];
            if (again) again.focus();
          });
        } else th.textContent = text;
      });
      r.slice(0, SHOWN).forEach(function (g) {
        var row = el("tr", "diff-" + g[1].replace(" ", "-"), tab), d = g[3] - g[2];
        el("td", "", row, g[0]);
        el("td", "", row, g[1]);
        el("td", "", row, fmtSize(g[2]));
        el("td", "", row, fmtSize(g[3]));
        el("td", "", row, (d > 0 ? "+" : "") + fmtSize(d));
        el("td", "", row, String(g[4]));
        el("td", "", row, String(g[5]));
      });
      var t = self.totals;
      summary.textContent = "Timestep " + ta + ": " + fmtBoth(t.bytesA) + " in " + ka.length
        + " allocations; timestep " + tb + ": " + fmtBoth(t.bytesB) + " in " + kb.length + ". Between them "
        + t.added + " allocation(s) appeared (" + fmtSize(t.addedBytes) + "), " + t.freed + " went away ("
        + fmtSize(t.freedBytes) + "), " + t.kept + " stayed. " + r.length + " group(s)"
        + (r.length > SHOWN ? "; the first " + SHOWN + " shown, all in the CSV." : ".");
    }
    self.set = function (a, b) {
      ta = clamp(a, 0); tb = clamp(b, 0);
      ia.value = String(ta); ib.value = String(tb);
      hash.da = ta; hash.db = tb; if (c.writeHash) c.writeHash();
      ka = alive(ta); kb = alive(tb);
      A = ka.map(itemOf); B = kb.map(itemOf);
      var inA = new Uint8Array(tl.n), t = { bytesA: 0, bytesB: 0, kept: 0, added: 0, freed: 0, addedBytes: 0, freedBytes: 0 };
      ka.forEach(function (s) { inA[s] = 1; t.bytesA += tl.size[s]; });
      kb.forEach(function (s) {
        t.bytesB += tl.size[s];
        if (inA[s]) { inA[s] = 2; t.kept++; } else { t.added++; t.addedBytes += tl.size[s]; }
      });
      ka.forEach(function (s) { if (inA[s] === 1) { t.freed++; t.freedBytes += tl.size[s]; } });
      self.totals = t;
      render();
    };
    self.sort = function (col) {
      if (col === sortCol) sortDown = !sortDown; else { sortCol = col; sortDown = col !== 0; }
      render();
    };
    self.by = function (b) { by = b; sel.value = b; render(); };
    self.rows = rows;
    self.csv = function (b) {
      var out = [(b || by) + ",change,bytes_a,bytes_b,count_a,count_b"], f = window.memsnapConsumers.csvField;
      rows(b).forEach(function (g) { out.push(g.map(f).join(",")); });
      return out.join("\n") + "\n";
    };
    ia.addEventListener("change", function () { self.set(ia.value, tb); });
    ib.addEventListener("change", function () { self.set(ta, ib.value); });
    sel.addEventListener("change", function () { by = sel.value; render(); });
    bcsv.addEventListener("click", function () {
      var a = el("a", "", null);
      a.href = URL.createObjectURL(new Blob([self.csv()], { type: "text/csv" }));
      a.download = "changes-by-" + by + "-from-" + ta + "-to-" + tb + ".csv";
      document.body.appendChild(a); a.click(); a.remove();
    });
    self.set(ta, tb);
    return self;
  }

  window.memsnapDiff = { view: view, compare: compare };
})();
