/* SPDX-License-Identifier: MIT
 * memsnap view: several files in one page (embedded before view.js; no library). docs/view.md,
 * "Several files".
 *
 * A page of several snapshots (`memsnap view a.pickle b.pickle ...` or a directory; written by
 * ms_viewer_write_html_files, viz/view/view.c) holds the names of its files in "ms-files" and each
 * file's data elements: the first's as a page of one file has them (ms-bin, ms-data, ms-trace,
 * ms-trace-data), file K's with "-K" after the id. The page shows one file at a time, the one the
 * URL's "file=K" names: the file selector sets it and reloads the page (every view's state is the
 * file's own). "Files side by side" draws the memory over time (memory.js) of two files next to
 * each other, each file's device shown first, with their figures in one table.
 *
 * window.memsnapFiles: list() -> the names, or null for a page of one file; suffix(hash) -> ""
 * or "-K" for the file shown; selector(bar, el, hash) adds the file selector to the bar;
 * view(root, ctx) with ctx = {el, fmtSize, fmtBoth, parseJSON, hash, writeHash} returns {name,
 * destroy, set(a, b), figures: [figures of file a, of file b], panes}.
 */
(function () {
  "use strict";

  var names;
  function list() {
    if (names === undefined) {
      var e = document.getElementById("ms-files");
      try { names = e ? JSON.parse(e.textContent) : null; } catch (x) { names = null; }
      if (!Array.isArray(names) || names.length < 2) names = null;
    }
    return names;
  }
  /* the file the URL names (0 when none or out of range) */
  function current(hash) {
    var k = parseInt(hash.file, 10), n = list();
    return n && k > 0 && k < n.length ? k : 0;
  }
  function suffix(hash) { var k = current(hash); return k ? "-" + k : ""; }

  function selector(bar, el, hash) {
    var n = list();
    if (!n) return null;
    var lab = el("label", "", bar, "File "), sel = el("select", "", lab);
    sel.setAttribute("aria-label", "the file shown (the page reloads)");
    n.forEach(function (name, k) {
      /* names are data: text only, with their controls escaped */
      var o = el("option", "", sel, (k + 1) + ": " + window.memsnapFrames.safe(String(name)));
      o.value = String(k);
    });
    sel.value = String(current(hash));
    sel.addEventListener("change", function () {
      /* the other file's state starts afresh: only the view is kept */
      location.hash = "file=" + sel.value + (hash.view ? "&view=" + encodeURIComponent(hash.view) : "");
      location.reload();
    });
    return sel;
  }

  /* file k's data (ms-data[-K]) and its device shown first, or null before the page is parsed */
  function fileData(k, parseJSON) {
    var id = "ms-data" + (k ? "-" + k : "");
    if (!document.getElementById(id)) return null;
    var d = parseJSON(id), pd = null;
    d.per_device.forEach(function (x) { if (x.device === d.device) pd = x; });
    return { title: d.title, device: d.device, memory: pd ? pd.memory : null,
             ntrace: pd ? pd.ntrace : 0 };
  }

  function view(root, ctx) {
    var el = ctx.el, n = list(), hash = ctx.hash || {}, self = { name: "files", destroy: function () {} };
    if (!n) {
      el("div", "note", root, "This page holds one file.");
      return self;
    }
    if (document.readyState === "loading") {
      el("div", "note", root, "The page is still being read: this view opens when it is.");
      return self;
    }
    var head = el("div", "consumers-head", root), sels = [];
    ["left ", " right "].forEach(function (t) {
      var lab = el("label", "", head, t), s = el("select", "", lab);
      s.setAttribute("aria-label", "the file on the " + t.trim());
      n.forEach(function (name, k) { el("option", "", s, (k + 1) + ": " + window.memsnapFrames.safe(String(name))).value = String(k); });
      sels.push(s);
    });
    var table = el("table", "figures", root), panes = el("div", "files-panes", root);
    var shown = [];
    function figuresRow(cells) { var tr = el("tr", "", table); cells.forEach(function (c, i) { el(i ? "td" : "th", "", tr, c); }); }
    self.set = function (a, b) {
      var ks = [a, b].map(function (k) { k = parseInt(k, 10); return k >= 0 && k < n.length ? k : 0; });
      sels[0].value = String(ks[0]); sels[1].value = String(ks[1]);
      hash.fa = ks[0]; hash.fb = ks[1]; if (ctx.writeHash) ctx.writeHash();
      shown.forEach(function (v) { v.destroy(); });
      shown = []; panes.textContent = ""; table.textContent = "";
      var data = ks.map(function (k) { return fileData(k, ctx.parseJSON); });
      self.figures = [];
      ks.forEach(function (k, i) {
        var pane = el("div", "files-pane", panes), d = data[i];
        el("div", "note", pane, (k + 1) + ": " + window.memsnapFrames.safe(String(n[k])) + ", device " + d.device
          + ", " + d.ntrace + " trace entries");
        var v = window.memsnapMemory.view(pane, { el: el, fmtSize: ctx.fmtSize, fmtBoth: ctx.fmtBoth, memory: d.memory });
        shown.push(v);
        self.figures.push(v.figures || null);
      });
      figuresRow(["", "left: " + window.memsnapFrames.safe(String(n[ks[0]])), "right: " + window.memsnapFrames.safe(String(n[ks[1]]))]);
      [["peak reserved", "peakReserved"], ["peak allocated", "peakAllocated"],
       ["most reserved - allocated", "mostFrag"]].forEach(function (r) {
        figuresRow([r[0]].concat(self.figures.map(function (f) { return f ? ctx.fmtBoth(f[r[1]]) : "no data"; })));
      });
      figuresRow(["trace entries"].concat(data.map(function (d) { return String(d.ntrace); })));
    };
    sels.forEach(function (s) { s.addEventListener("change", function () { self.set(sels[0].value, sels[1].value); }); });
    var fa = hash.fa !== undefined ? hash.fa : current(hash), fb = hash.fb !== undefined ? hash.fb : (fa === 0 ? 1 : 0);
    self.set(fa, fb);
    self.destroy = function () { shown.forEach(function (v) { v.destroy(); }); };
    self.panes = function () { return shown; };
    return self;
  }

  window.memsnapFiles = { list: list, suffix: suffix, selector: selector, view: view };
})();
