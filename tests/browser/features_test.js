/* SPDX-License-Identifier: MIT
 * Injected by tests/browser/features.sh after the page's own script, with window.FEATURE naming
 * the case: drives the page through its API (window.memsnapView) and synthetic DOM events, and
 * writes the verdict into the body's data-test attribute (PASS, or FAIL and why). */
(function () {
  "use strict";
  var errors = [], violations = [];
  document.addEventListener("securitypolicyviolation", function (e) { violations.push(e.blockedURI); });
  function ok(name, cond, detail) { if (!cond) errors.push(name + (detail ? ": " + detail : "")); }
  function eq(name, got, want) {
    var g = JSON.stringify(got), w = JSON.stringify(want);
    ok(name, g === w, g + " vs " + w);
  }
  function status() { return document.body.getAttribute("data-status"); }
  /* the colour at (x, y) of canvas cv as [r, g, b, a] */
  function pixel(cv, x, y) {
    return Array.from(cv.getContext("2d").getImageData(Math.round(x), Math.round(y), 1, 1).data);
  }
  function rgb(hex) { return [1, 3, 5].map(function (k) { return parseInt(hex.slice(k, k + 2), 16); }).concat(255); }

  /* "Memory over time" on view_memory.py: the table of test_view_memory.c, drawn */
  function memoryCase(api) {
    api.show("memory");
    ok("memory: renders", status() === "ready", document.body.getAttribute("data-error"));
    var v = api.view, L = v.layout, cv = document.querySelector(".memory-plot canvas");
    ok("memory: a view with its canvas", v.name === "memory" && !!cv && !!L);
    if (!cv || !L) return;
    var rows = Array.from(document.querySelectorAll(".memory table.figures tr")).map(function (r) {
      return [r.children[0].textContent, r.children[1].textContent];
    });
    eq("memory: the figures", rows, [
      ["peak reserved", "28.0KiB (28672 bytes) at step 5"],
      ["peak allocated", "14.0KiB (14336 bytes) at step 7"],
      ["most reserved - allocated", "22.0KiB (22528 bytes) at step 5"],
      ["mapped in expandable segments at the end", "8.0KiB (8192 bytes)"],
      ["largest free block at the end, pool (0, 0)", "4.0KiB (4096 bytes)"],
      ["largest free block at the end, pool (1, 2)", "6.0KiB (6144 bytes)"]]);
    /* bucket 6 (steps 6..6): allocated 10240, reserved 28672; bucket 0: nothing */
    var x6 = (L.X(6) + L.X(7)) / 2, x0 = (L.X(0) + L.X(1)) / 2, x5 = (L.X(5) + L.X(6)) / 2;
    eq("memory: reserved above allocated at step 6", pixel(cv, x6, L.Y(20000)), rgb("#4e79a7"));
    eq("memory: allocated at step 6", pixel(cv, x6, L.Y(5000)), rgb("#f28e2c"));
    eq("memory: nothing at step 0", pixel(cv, x0, L.Y(5000))[3], 0);
    eq("memory: nothing above reserved at step 6", pixel(cv, x6, L.Y(28672 * 1.03))[3], 0);
    /* below: reserved - allocated is 22528 at step 5, the largest free blocks 12288 and 6144 */
    eq("memory: reserved - allocated at step 5", pixel(cv, x5, L.Yf(3000)), rgb("#e15759"));
    eq("memory: nothing above it", pixel(cv, x5, L.Yf(22528 * 1.03))[3], 0);
    var legend = document.querySelector(".memory-legend").textContent;
    ok("memory: the legend names both pools", legend.indexOf("pool (0, 0)") >= 0 && legend.indexOf("pool (1, 2)") >= 0, legend);
  }

  /* "Compare two moments" on view_diff.py: bands X1 [0, 8), X2 [1, 4), X3 [2, 8), X4 [7, 8) */
  function diffCase(api) {
    api.show("diff");
    ok("diff: renders", status() === "ready", document.body.getAttribute("data-error"));
    var v = api.view;
    v.set(2, 7);
    eq("diff: by source line", v.rows(), [
      ["data.py:30:load", "appeared", 0, 524288, 0, 1],
      ["optim.py:20:step", "went away", 131072, 0, 1, 0],
      ["model.py:10:forward", "same", 327680, 327680, 2, 2]]);
    eq("diff: totals", v.totals, { bytesA: 458752, bytesB: 851968, kept: 2, added: 1, freed: 1,
                                   addedBytes: 524288, freedBytes: 131072 });
    var cells = Array.from(document.querySelectorAll(".consumers table tr")).map(function (r) {
      return Array.from(r.children).map(function (c) { return c.textContent; }).join("|");
    });
    eq("diff: the table", cells, [
      "source line|change|bytes at A|bytes at B|difference|count at A|count at B",
      "data.py:30:load|appeared|0.0B|512.0KiB|+512.0KiB|0|1",
      "optim.py:20:step|went away|128.0KiB|0.0B|-128.0KiB|1|0",
      "model.py:10:forward|same|320.0KiB|320.0KiB|0.0B|2|2"]);
    eq("diff: the CSV", v.csv(), "source,change,bytes_a,bytes_b,count_a,count_b\n"
      + "data.py:30:load,appeared,0,524288,0,1\noptim.py:20:step,went away,131072,0,1,0\n"
      + "model.py:10:forward,same,327680,327680,2,2\n");
    /* the other way round: what went away appeared; by stack, the same groups here */
    v.set(7, 2);
    eq("diff: B before A", v.rows().map(function (r) { return r[0] + " " + r[1]; }),
       ["data.py:30:load went away", "optim.py:20:step appeared", "model.py:10:forward same"]);
    v.set(1, 3);
    eq("diff: X3 added to forward", v.rows(), [
      ["model.py:10:forward", "grew", 262144, 327680, 1, 2],
      ["optim.py:20:step", "same", 131072, 131072, 1, 1]]);
    v.sort(0);
    eq("diff: sorted by name, A to Z", v.rows().map(function (r) { return r[0]; }), ["model.py:10:forward", "optim.py:20:step"]);
    /* the heads are buttons (the keyboard sorts too): bytes at A, largest first */
    document.querySelectorAll(".consumers th button")[2].click();
    eq("diff: sorted by bytes at A", v.rows().map(function (r) { return r[2]; }), [262144, 131072]);
    eq("diff: the head says so", [document.querySelectorAll(".consumers th")[2].getAttribute("aria-sort"),
                                  document.activeElement && document.activeElement.textContent], ["descending", "bytes at A \u25be"]);
    ok("diff: the moments in the URL", /da=1/.test(location.hash) && /db=3/.test(location.hash), location.hash);
    /* out of range: clamped to the last timestep */
    v.set(-5, 99);
    eq("diff: clamped", [document.querySelectorAll(".consumers-head input")[0].value,
                         document.querySelectorAll(".consumers-head input")[1].value], ["0", "7"]);
  }

  /* a page of view_memory.py's and view_diff.py's snapshots (names: the files' or the directory's) */
  function filesCase(api, names) {
    var sel = document.querySelector(".bar select[aria-label^='the file shown']");
    ok("files: a file selector", !!sel);
    if (!sel) return;
    eq("files: its options", Array.from(sel.options).map(function (o) { return o.textContent; }),
       names.map(function (n, k) { return (k + 1) + ": " + n; }));
    eq("files: the first file shown", [sel.value, api.data.title], ["0", names[0]]);
    api.show("files");
    ok("files: renders", status() === "ready", document.body.getAttribute("data-error"));
    var v = api.view, f = v.figures;
    eq("files: two panes", [v.name, document.querySelectorAll(".files-pane canvas").length], ["files", 2]);
    var mem = names.indexOf("memory.pickle") >= 0 ? names.indexOf("memory.pickle") : names.indexOf("b-memory.pickle");
    var fm = f[mem], fd = f[1 - mem];
    eq("files: the memory file's figures", [fm.peakReserved, fm.peakAllocated, fm.mostFrag], [28672, 14336, 22528]);
    eq("files: the diff file's figures", [fd.peakReserved, fd.peakAllocated], [1048576, 851968]);
    var rows = Array.from(document.querySelectorAll(".view > table.figures tr")).map(function (r) {
      return Array.from(r.children).map(function (c) { return c.textContent; }).join("|");
    });
    eq("files: the table's heads", rows[0], "|left: " + names[0] + "|right: " + names[1]);
    eq("files: trace entries", rows[4], "trace entries|" + (mem === 0 ? "10|7" : "7|10"));
    v.set(1, 1);
    eq("files: one file twice", document.querySelectorAll(".files-pane .note")[0].textContent,
       "2: " + names[1] + ", device 0, " + (mem === 1 ? 10 : 7) + " trace entries");
  }
  /* the second file of files.html, from the URL (file=1&view=memory) */
  function file1Case(api) {
    eq("file1: the second file", [api.data.title, document.querySelector(".bar select[aria-label^='the file shown']").value],
       ["diff.pickle", "1"]);
    eq("file1: its timeline", Array.from(api.timeline.maxAt), [262144, 393216, 458752, 458752, 458752, 458752, 458752, 851968]);
    ok("file1: the view from the URL", api.view && api.view.name === "memory", api.view && api.view.name);
    eq("file1: its memory", api.view.figures && api.view.figures.peakAllocated, 851968);
    /* choosing a device keeps the file in the URL (a reload shows the same file) */
    api.device(0);
    ok("file1: the file stays in the URL", /(^#|&)file=1(&|$)/.test(location.hash), location.hash);
  }

  window.memsnapView.whenReady.then(run, run);
  function run() {
    var api = window.memsnapView;
    try {
      ok("ready", api && api.ready && status() === "ready", document.body.getAttribute("data-error"));
      if (window.FEATURE === "memory") memoryCase(api);
      else if (window.FEATURE === "diff") diffCase(api);
      else if (window.FEATURE === "files") filesCase(api, ["memory.pickle", "diff.pickle"]);
      else if (window.FEATURE === "dir") filesCase(api, ["a-diff.pickle", "b-memory.pickle"]);
      else if (window.FEATURE === "file1") file1Case(api);
      else errors.push("no case " + window.FEATURE);
    } catch (e) {
      errors.push("exception: " + e + " " + (e.stack || ""));
    }
    ok("the page loads nothing", performance.getEntriesByType("resource").length === 0);
    ok("the page tries to load nothing", violations.length === 0, violations.join(" "));
    document.body.setAttribute("data-test", errors.length ? "FAIL " + errors.join(" | ") : "PASS");
  }
})();
