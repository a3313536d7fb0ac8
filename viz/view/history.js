/* SPDX-License-Identifier: MIT
 * memsnap view: the Allocator State History (after timeline.js): the allocator's state replayed to
 * any trace entry (AllocState, also the Explain panel's state at a moment), the list of entries
 * and the segment map. V.historyView(root) returns the view.
 */
(function () {
  "use strict";

  var V = window.memsnapPage, A = V.A, D = V.D, hash = V.hash, el = V.el, fmtSize = V.fmtSize,
    fmtBoth = V.fmtBoth, readHash = V.readHash, writeHash = V.writeHash, streamName = V.streamName,
    versions = V.versions, hexAddr = V.hexAddr, poolOf = V.poolOf, stackText = V.stackText,
    fmtTime = V.fmtTime, poolText = V.poolText;

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

  V.AllocState = AllocState; V.historyView = historyView;
})();
