/* SPDX-License-Identifier: MIT
 * memsnap view: the flame graph of what is alive at the selected moment, its downloads and the
 * top consumers there (embedded before view.js; no library). docs/view.md, "Alive at the selected
 * moment (flame graph)".
 *
 * window.memsnapFlame.view(root, tl, c) draws it for timeline tl at c.selectedT (the peak when
 * it is -1); c carries the page's data D and its helpers (el, fmtSize, fmtBoth, elementStack,
 * shownFrames, stackFrames, frameText, elementAddr, streamName, seriesCat). Returns {name,
 * destroy, alive, total, csv(), json(), consumers (consumers.js), depth, drawnDepth, tree (the
 * frames: {name, value, kids, parent}), cursor() (the keyboard's frame), zoomed()}.
 */
(function () {
  "use strict";

  function view(root, tl, c) {
    var D = c.D, selectedT = c.selectedT, el = c.el, fmtSize = c.fmtSize, fmtBoth = c.fmtBoth;
    var elementStack = c.elementStack, shownFrames = c.shownFrames, stackFrames = c.stackFrames;
    var frameText = c.frameText, elementAddr = c.elementAddr, streamName = c.streamName, seriesCat = c.seriesCat;
    var self = { name: "flame", destroy: function () {} };
    var t = selectedT >= 0 ? selectedT : tl.peakT;
    var head = el("div", "note", root, "What is alive at timestep " + t + (selectedT >= 0 ? "" : " (the peak; click the timeline to choose a moment)")
      + ": " + fmtBoth(tl.maxAt[Math.min(t, tl.maxAt.length - 1)] || 0) + ". Root at the bottom, callers below callees; click a frame to zoom, click the root to reset.");
    var plot = el("div", "plot", root), info = el("pre", "info", root);
    var cv = el("canvas", "", plot), ctx = cv.getContext("2d");
    /* by keyboard (below): the canvas takes the focus, the details are read as they change */
    cv.tabIndex = 0;
    cv.setAttribute("role", "img");
    cv.setAttribute("aria-label", "Flame graph of what is alive at timestep " + t + ". Up goes to the biggest "
      + "callee, Down to the caller, Left and Right to the neighbours, Enter zooms to the frame (on the "
      + "frame zoomed to: back out).");
    info.tabIndex = 0;
    info.setAttribute("role", "status");
    info.setAttribute("aria-live", "polite");
    /* the tree: root -> outermost frame ... innermost */
    var root0 = { name: "all", value: 0, kids: new Map(), parent: null };
    var alive = [];
    for (var s = 0; s < tl.n; s++) if (s !== tl.summ && tl.tmin[s] <= t && tl.tmax[s] > t) alive.push(s);
    alive.forEach(function (s) {
      var st = elementStack(tl, s), fr = st >= 0 && st < D.nstacks ? shownFrames(st) : [], node = root0;
      node.value += tl.size[s];
      for (var i = fr.length - 1; i >= -1; i--) {
        var name = i >= 0 ? frameText(fr[i]) : "<no frames>";
        if (i < 0 && fr.length) break;
        var k = node.kids.get(name);
        if (!k) { k = { name: name, value: 0, kids: new Map(), parent: node }; node.kids.set(name, k); }
        k.value += tl.size[s];
        node = k;
      }
    });
    self.alive = alive.length;
    self.total = root0.value;
    /* what is alive, for download: one row per allocation, biggest first */
    function rows() {
      return alive.slice().sort(function (a, b) { return tl.size[b] - tl.size[a]; }).map(function (s) {
        var e = tl.elem[s], src = tl.sources[e], st = elementStack(tl, s), fr = [];
        if (st >= 0 && st < D.nstacks) stackFrames(st).forEach(function (f) { fr.push(frameText(f)); });
        return { addr: elementAddr(tl, s), size: tl.size[s],
                 stream: src >= 0 ? streamName(D.trace.stream[src]) : null,
                 trace_entry: src >= 0 ? src : null, time_us: src >= 0 && D.trace.time[src] >= 0 ? D.trace.time[src] : null,
                 from_snapshot: src < 0, frames: fr };
      });
    }
    function csvField(v) {
      var t = v === null || v === undefined ? "" : String(v);
      return /[",\n\r]/.test(t) ? '"' + t.replace(/"/g, '""') + '"' : t;
    }
    self.csv = function () {
      var out = ["address,size,stream,trace_entry,time_us,from_snapshot,stack (innermost first)"];
      rows().forEach(function (r) {
        out.push([r.addr, r.size, r.stream, r.trace_entry, r.time_us, r.from_snapshot, r.frames.join(" <- ")].map(csvField).join(","));
      });
      return out.join("\n") + "\n";
    };
    self.json = function () {
      return JSON.stringify({ device: D.device, timestep: t, bytes: root0.value, allocations: rows() }, null, 1);
    };
    function download(text, type, ext) {
      var a = el("a", "", null);
      a.href = URL.createObjectURL(new Blob([text], { type: type }));
      a.download = "alive-at-" + t + "." + ext;
      document.body.appendChild(a); a.click(); a.remove();
    }
    var bcsv = el("button", "", head, "Download CSV"), bjson = el("button", "", head, "Download JSON");
    bcsv.addEventListener("click", function () { download(self.csv(), "text/csv", "csv"); });
    bjson.addEventListener("click", function () { download(self.json(), "application/json", "json"); });
    /* the top consumers there, by source line, category or stack (consumers.js) */
    var sourceOf = new Map();
    function consumer(s) {
      var st = elementStack(tl, s), c = seriesCat(tl, s), src = sourceOf.get(st);
      if (src === undefined) {
        var fr = st >= 0 && st < D.nstacks ? Array.from(shownFrames(st)) : [];
        var py = fr.filter(function (f) { return /\.py$/.test(String(D.frames[f][0])); })[0];
        src = { source: fr.length ? frameText(py !== undefined ? py : fr[0]) : "<no frames>",
                stack: fr.length ? fr.map(frameText).join(" <- ") : "<no frames>" };
        sourceOf.set(st, src);
      }
      return { size: tl.size[s], source: src.source, stack: src.stack,
               category: c >= 0 && D.categories ? D.categories[c] : "unknown" };
    }
    self.consumers = window.memsnapConsumers.table(root, {
      el: el, fmtSize: fmtSize, items: alive.map(consumer), moment: t, total: root0.value,
      hasCategories: !!(tl.cat && D.categories) });
    var focus = root0, boxes = [], cursor = null;
    function byName(a, b) { return a.name < b.name ? -1 : a.name > b.name ? 1 : 0; }
    function kidsOf(node) { return Array.from(node.kids.values()).sort(byName); }
    function say(node) {
      info.textContent = node.name + "\n" + fmtBoth(node.value) + " ("
        + (100 * node.value / Math.max(1, root0.value)).toFixed(2) + "% of what is alive)";
    }
    function depthOf(node) {
      var d = 0;
      node.kids.forEach(function (k) { d = Math.max(d, 1 + depthOf(k)); });
      return d;
    }
    /* a deep stack makes the canvas taller than the plot, which scrolls (the root at the bottom) */
    plot.style.overflowY = "auto";
    function draw() {
      var r = plot.getBoundingClientRect(), W = Math.max(200, r.width | 0) - 16, rh = 16;
      var depth = depthOf(focus), H = Math.max(Math.max(100, r.height | 0), (depth + 1) * rh);
      cv.width = W; cv.height = H; ctx.clearRect(0, 0, W, H); boxes = [];
      self.depth = depth; self.drawnDepth = 0;
      function rec(node, x, w, depth) {
        if (w < 0.5) return;
        var y = H - (depth + 1) * rh;
        self.drawnDepth = Math.max(self.drawnDepth, depth);
        ctx.fillStyle = depth === 0 ? "#bbb" : "hsl(" + (20 + (node.name.length * 37) % 40) + ",80%," + (55 + (node.name.length * 7) % 15) + "%)";
        ctx.fillRect(x, y, w - 0.5, rh - 1);
        boxes.push([x, y, w, rh, node]);
        if (w > 30) {
          ctx.fillStyle = "#000"; ctx.font = "11px sans-serif";
          ctx.save(); ctx.beginPath(); ctx.rect(x, y, w, rh); ctx.clip();
          ctx.fillText(node.name, x + 2, y + 12); ctx.restore();
        }
        var kids = kidsOf(node), cx = x;
        kids.forEach(function (k) { var kw = w * k.value / node.value; rec(k, cx, kw, depth + 1); cx += kw; });
      }
      rec(focus, 0, W, 0);
      plot.scrollTop = plot.scrollHeight;
      /* the keyboard's frame: outlined, and scrolled to */
      boxes.forEach(function (b) {
        if (b[4] !== cursor) return;
        ctx.strokeStyle = "#000"; ctx.lineWidth = 2;
        ctx.strokeRect(b[0] + 1, b[1] + 1, Math.max(1, b[2] - 2.5), b[3] - 3);
        if (b[1] < plot.scrollTop || b[1] + b[3] > plot.scrollTop + plot.clientHeight)
          plot.scrollTop = Math.max(0, b[1] - plot.clientHeight / 2);
      });
    }
    /* the keys while the graph has the focus: Up the biggest callee, Down the caller (not below
     * the frame zoomed to), Left / Right the neighbours (in drawing order), Enter zooms */
    cv.addEventListener("keydown", function (ev) {
      var c = cursor || focus, k, i;
      if (ev.key === "ArrowUp") {
        k = kidsOf(c);
        if (k.length) c = k.reduce(function (a, b) { return b.value > a.value ? b : a; });
      } else if (ev.key === "ArrowDown") {
        if (c !== focus && c.parent) c = c.parent;
      } else if (ev.key === "ArrowLeft" || ev.key === "ArrowRight") {
        if (c !== focus && c.parent) {
          k = kidsOf(c.parent); i = k.indexOf(c) + (ev.key === "ArrowLeft" ? -1 : 1);
          if (i >= 0 && i < k.length) c = k[i];
        }
      } else if (ev.key === "Enter") {
        focus = c === focus && focus.parent ? focus.parent : c;
        c = focus;
      } else return;
      ev.preventDefault();
      ev.stopPropagation();
      cursor = c;
      draw();
      say(c);
    });
    self.cursor = function () { return cursor; };
    self.zoomed = function () { return focus; };
    self.tree = root0;
    cv.addEventListener("mousemove", function (ev) {
      for (var i = 0; i < boxes.length; i++) {
        var b = boxes[i];
        if (ev.offsetX >= b[0] && ev.offsetX < b[0] + b[2] && ev.offsetY >= b[1] && ev.offsetY < b[1] + b[3]) {
          say(b[4]);
          return;
        }
      }
    });
    cv.addEventListener("click", function (ev) {
      for (var i = 0; i < boxes.length; i++) {
        var b = boxes[i];
        if (ev.offsetX >= b[0] && ev.offsetX < b[0] + b[2] && ev.offsetY >= b[1] && ev.offsetY < b[1] + b[3]) {
          focus = b[4] === focus && focus.parent ? focus.parent : b[4]; cursor = null; draw(); return;
        }
      }
    });
    void head;
    draw();
    return self;
  }

  window.memsnapFlame = { view: view };
})();
