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
    this.kept = new Map();    /* entry -> the block it made or ended (block()) */
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
  /* The block an alloc made or a free_completed ended, as the state knew it (from the snapshot,
   * with its real size) when the entry was undone or redone: kept by entry, so that moving back
   * and forth never replaces a block's real size by the rounding of its request. */
  AllocState.prototype.block = function (i, e, state) {
    var b = this.kept.get(i);
    if (!b) b = { addr: e.addr, size: Math.max(512, Math.ceil(e.size / 512) * 512), req: e.size, stack: e.stack };
    b.state = state;
    return b;
  };
  /* step -> step - 1: undo entry step - 1 */
  AllocState.prototype.undo = function () {
    var i = --this.step, e = this.entry(i), b;
    switch (e.a) {
    case A.ALLOC:
      if ((b = this.blocks.get(e.addr))) this.kept.set(i, b);
      this.blocks.delete(e.addr);
      break;
    case A.FREE_REQ: if ((b = this.blocks.get(e.addr))) b.state = 1; break;
    case A.FREE_DONE: this.blocks.set(e.addr, this.block(i, e, 2)); break;
    case A.SEG_ALLOC: case A.SEG_MAP: this.removeRange(e.addr, e.size); break;
    case A.SEG_FREE: case A.SEG_UNMAP:
      this.addSeg({ addr: e.addr, size: e.size, stream: e.stream, pool: e.pool || [0, 0], stack: e.stack });
      break;
    }
  };
  /* step -> step + 1: redo entry step */
  AllocState.prototype.redo = function () {
    var i = this.step++, e = this.entry(i), b;
    switch (e.a) {
    case A.ALLOC: this.blocks.set(e.addr, this.block(i, e, 1)); break;
    case A.FREE_REQ: if ((b = this.blocks.get(e.addr))) b.state = 2; break;
    case A.FREE_DONE:
      if ((b = this.blocks.get(e.addr))) this.kept.set(i, b);
      this.blocks.delete(e.addr);
      break;
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
  /* What the map shows in figures: allocated (the blocks in use, rounded sizes) and what was
   * requested of them, the blocks freed but waiting for their streams' events, reserved (the
   * segments), the free space in the segments and its largest block (the largest request that fits
   * without a new segment), and the internal fragmentation (rounded less requested). */
  AllocState.prototype.totals = function () {
    var al = 0, req = 0, pend = 0, res = 0, nlive = 0, largest = 0, self = this;
    var spans = this.segs.map(function () { return []; });
    this.blocks.forEach(function (b) {
      if (b.state === 1) { al += b.size; req += b.req; nlive++; } else pend += b.size;
      var i = self.findSeg(b.addr);
      if (i >= 0) spans[i].push([b.addr, b.addr + b.size]);
    });
    this.segs.forEach(function (g, i) {
      res += g.size;
      /* the gaps between the live blocks of the segment, in address order */
      var at = g.addr;
      spans[i].sort(function (x, y) { return x[0] - y[0]; });
      spans[i].forEach(function (s) { if (s[0] - at > largest) largest = s[0] - at; at = Math.max(at, s[1]); });
      if (g.addr + g.size - at > largest) largest = g.addr + g.size - at;
    });
    return { allocated: al, requested: req, pending: pend, reserved: res, live: nlive,
             free: res - al - pend, largestFree: largest, internal: al - req };
  };
  /* the totals as the history's text says them */
  function totalsText(t) {
    return "(" + fmtSize(t.allocated) + " allocated / " + fmtSize(t.reserved) + " reserved)\n"
      + "free in the segments: " + fmtBoth(t.free) + ", largest free block " + fmtBoth(t.largestFree)
      + (t.pending ? "; " + fmtBoth(t.pending) + " freed, waiting for stream events" : "") + "\n"
      + "internal fragmentation: " + fmtBoth(t.internal) + " (rounded less requested, of " + t.live
      + " block" + (t.live === 1 ? "" : "s") + " in use)";
  }

  /* The rows of the list: one per trace entry, but one for a free_requested followed at once by
   * the free_completed of the same block (one free, as PyTorch's viewer lists it). rows[k] is the
   * first entry of row k. */
  function historyRows() {
    var tr = D.trace, n = tr.action.length, r = new Int32Array(n), m = 0;
    for (var i = 0; i < n; i++) {
      r[m++] = i;
      if (tr.action[i] === A.FREE_REQ && i + 1 < n && tr.action[i + 1] === A.FREE_DONE && tr.addr[i + 1] === tr.addr[i]) i++;
    }
    return r.subarray(0, m);
  }

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

  /* The segment map: segments packed into rows (largest first), each row at most MAP_ROW_MAX
   * pixels high before zooming; zoomed (MAP_ZOOM_MAX at most) about a point and panned. */
  var MAP_ROW_MAX = 160, MAP_ZOOM_MAX = 4096;

  function historyView(root) {
    var self = { name: "history" };
    var grid = el("div", "hist", root);
    var list = el("div", "events", grid), mapDiv = el("div", "segmap", grid), info = el("pre", "info", grid);
    list.tabIndex = 0;
    list.setAttribute("role", "listbox");
    list.setAttribute("aria-label", "Allocator State History: one row per event of the trace; arrow keys, "
      + "Page Up, Page Down, Home and End move the selection");
    info.setAttribute("role", "status");
    info.setAttribute("aria-live", "polite");
    var spacer = el("div", "", list), rowEls = [];
    var rows = historyRows(), n = rows.length, N = D.trace.action.length, ROW = 18, MAXH = 8000000;
    var st = new AllocState(), sel = -1;
    var tools = el("div", "maptools", mapDiv);
    var zin = el("button", "", tools, "+"), zout = el("button", "", tools, "\u2212"), zfit = el("button", "", tools, "fit");
    zin.setAttribute("aria-label", "zoom the segment map in");
    zout.setAttribute("aria-label", "zoom the segment map out");
    zfit.setAttribute("aria-label", "fit the segment map");
    var cv = el("canvas", "", mapDiv), ctx = cv.getContext("2d"), W = 0, H = 0, layout = [];
    cv.tabIndex = 0;
    cv.setAttribute("role", "img");
    var zoom = { z: 1, px: 0, py: 0 };
    spacer.style.height = Math.min(n * ROW, MAXH) + "px";
    spacer.style.width = "1px";

    /* the entries of row k: rows[k] .. rowEnd(k) - 1 */
    function rowEnd(k) { return k + 1 < n ? rows[k + 1] : N; }
    /* the row that holds entry e */
    function rowOf(e) {
      var lo = 0, hi = n - 1;
      while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (rows[mid] <= e) lo = mid; else hi = mid - 1; }
      return lo;
    }
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
      var f = firstRow(), vis = Math.ceil(list.clientHeight / ROW) + 1, active = "";
      while (rowEls.length < vis) {
        var r = el("div", "row", list);
        r.setAttribute("role", "option");
        r.addEventListener("click", function () { select(+this.dataset.i); });
        rowEls.push(r);
      }
      for (var k = 0; k < rowEls.length; k++) {
        var i = f + k, r2 = rowEls[k];
        if (i >= n || k >= vis) { r2.style.display = "none"; r2.removeAttribute("id"); continue; }
        r2.style.display = "";
        r2.dataset.i = i;
        r2.id = "ms-history-row-" + i;
        r2.setAttribute("aria-posinset", String(i + 1));
        r2.setAttribute("aria-setsize", String(n));
        r2.setAttribute("aria-selected", i === sel ? "true" : "false");
        if (i === sel) active = r2.id;
        r2.style.top = rowTop(i, f) + "px";
        r2.textContent = eventText(rows[i]);
        r2.className = "row" + (i === sel ? " sel" : "") + (D.trace.action[rows[i]] === A.OOM ? " oom" : "");
      }
      if (active) list.setAttribute("aria-activedescendant", active);
      else list.removeAttribute("aria-activedescendant");
    }
    function scrollTo(i) {
      var f = firstRow(), vis = Math.floor(list.clientHeight / ROW);
      if (i >= f && i < f + vis) return;
      if (n * ROW <= MAXH) list.scrollTop = Math.max(0, i * ROW - list.clientHeight / 2);
      else list.scrollTop = i / Math.max(1, n - vis) * (list.scrollHeight - list.clientHeight);
    }
    /* row i selected: the state after its last entry */
    function select(i) {
      if (n === 0) return; /* no trace: no event to select (the keys do nothing) */
      sel = Math.max(0, Math.min(n - 1, i));
      var e = rows[sel], tr = D.trace;
      st.moveTo(rowEnd(sel));
      hash.event = e; writeHash();
      scrollTo(sel);
      renderRows();
      drawMap();
      info.textContent = totalsText(st.totals()) + "\n" + eventText(e) + "\n"
        + (tr.time[e] >= 0 ? fmtTime(tr.time[e]) + "\n" : "") + stackText(tr.stack[e]);
      self.selected = sel;
      self.selectedEntry = e;
    }
    function drawMap() {
      var r = cv.parentNode.getBoundingClientRect();
      W = Math.max(100, Math.floor(r.width)); H = Math.max(60, Math.floor(r.height));
      cv.width = W; cv.height = H;
      ctx.clearRect(0, 0, W, H);
      var segs = st.segs.slice().sort(function (a, b) { return b.size - a.size || a.addr - b.addr; });
      layout = [];
      if (segs.length === 0) {
        ctx.fillStyle = "#555"; ctx.fillText("no segment at this moment", 10, 20);
        cv.setAttribute("aria-label", "Segment map: no segment at this moment");
        self.drawn = { segments: 0, blocks: 0 };
        return;
      }
      var total = 0; segs.forEach(function (g) { total += g.size; });
      var rowBytes = Math.max(segs[0].size, total / Math.max(1, Math.floor(H / 14)));
      /* pack into rows */
      var packed = [], cur = [], used = 0;
      segs.forEach(function (g) {
        if (used + g.size > rowBytes && cur.length) { packed.push(cur); cur = []; used = 0; }
        cur.push(g); used += g.size;
      });
      if (cur.length) packed.push(cur);
      var rh = Math.max(3, Math.min(MAP_ROW_MAX, Math.floor((H - 4) / packed.length))), kx = (W - 4) / rowBytes;
      var byseg = new Map();
      st.blocks.forEach(function (b) {
        var i = st.findSeg(b.addr);
        if (i < 0) return;
        var g = st.segs[i];
        if (!byseg.has(g)) byseg.set(g, []);
        byseg.get(g).push(b);
      });
      /* world coordinates (the map fitted) to the canvas: zoomed and panned */
      var z = zoom.z, px = zoom.px, py = zoom.py;
      function sx(x) { return (x - px) * z; }
      function sy(y) { return (y - py) * z; }
      packed.forEach(function (row, ri) {
        var x = 2, y = 2 + ri * rh;
        row.forEach(function (g) {
          var w = g.size * kx;
          layout.push([x, y, w, rh - 1, g, null]);
          if (sx(x + w) >= 0 && sx(x) <= W && sy(y + rh) >= 0 && sy(y) <= H) {
            ctx.fillStyle = "#fff"; ctx.fillRect(sx(x), sy(y), w * z, (rh - 1) * z);
            (byseg.get(g) || []).forEach(function (b) {
              var bx = x + (b.addr - g.addr) * kx, bw = b.size * kx;
              layout.push([bx, y, bw, rh - 1, g, b]);
              if (sx(bx + bw) < 0 || sx(bx) > W) return;
              ctx.fillStyle = b.state === 2 ? "#d00" : hashColor(b.addr);
              ctx.fillRect(sx(bx), sy(y), Math.max(0.5, bw * z), (rh - 1) * z);
            });
            ctx.strokeStyle = "#000"; ctx.lineWidth = 1;
            ctx.strokeRect(sx(x) + 0.5, sy(y) + 0.5, Math.max(1, w * z - 1), (rh - 1) * z - 1);
          }
          x += w;
        });
      });
      self.drawn = { segments: segs.length, blocks: st.blocks.size, rowHeight: rh * z };
      cv.setAttribute("aria-label", "Segment map: " + segs.length + " segment" + (segs.length === 1 ? "" : "s")
        + ", " + st.blocks.size + " block" + (st.blocks.size === 1 ? "" : "s") + (z > 1 ? ", zoomed " + z.toFixed(1) + " times" : "")
        + ". Plus and minus zoom, arrows pan, 0 fits.");
    }
    /* zoom by f about canvas point (cx, cy); the map never leaves the canvas */
    function zoomMap(f, cx, cy) {
      var z = Math.max(1, Math.min(MAP_ZOOM_MAX, zoom.z * f));
      if (cx === undefined) { cx = W / 2; cy = H / 2; }
      var wx = cx / zoom.z + zoom.px, wy = cy / zoom.z + zoom.py;
      zoom.z = z;
      panMap(wx - cx / z - zoom.px, wy - cy / z - zoom.py);
    }
    function panMap(dx, dy) {
      zoom.px = Math.max(0, Math.min(W - W / zoom.z, zoom.px + dx));
      zoom.py = Math.max(0, Math.min(H - H / zoom.z, zoom.py + dy));
      drawMap();
    }
    /* the rectangle where block (or segment) at address addr is drawn, in canvas pixels */
    self.rectOf = function (addr, segment) {
      for (var i = 0; i < layout.length; i++) {
        var L = layout[i], it = segment ? L[4] : L[5];
        if (it && it.addr === addr && (segment ? !L[5] : true))
          return [(L[0] - zoom.px) * zoom.z, (L[1] - zoom.py) * zoom.z, L[2] * zoom.z, L[3] * zoom.z];
      }
      return null;
    };
    self.zoomMap = zoomMap;
    self.mapZoom = zoom;
    function hover(mx, my) {
      var wx = mx / zoom.z + zoom.px, wy = my / zoom.z + zoom.py, i, L, tol = 0;
      /* the block (else the segment) under the point; else one drawn wider than it is (half a pixel) */
      for (i = layout.length - 1; i >= 0; i--) {
        L = layout[i];
        if (wx >= L[0] && wx < L[0] + L[2] && wy >= L[1] && wy < L[1] + L[3]) break;
      }
      if (i < 0) tol = 0.5 / zoom.z;
      for (i = i < 0 ? layout.length - 1 : i; i >= 0; i--) {
        L = layout[i];
        if (wx >= L[0] && wx < L[0] + Math.max(L[2], tol) && wy >= L[1] && wy < L[1] + L[3]) {
          var g = L[4], b = L[5];
          if (b) info.textContent = "b'" + b.addr.toString(16) + ": block of " + fmtBoth(b.size) + ", requested "
            + fmtBoth(b.req) + (b.size > b.req ? ", rounded up by " + fmtBoth(b.size - b.req) : "")
            + (b.state === 2 ? " (freed, waiting for its stream events)" : "") + " (stream "
            + streamName(g.stream) + ")\n" + stackText(b.stack);
          else info.textContent = "s'" + g.addr.toString(16) + ": segment " + fmtBoth(g.size)
            + " (stream " + streamName(g.stream) + ", " + poolText(g.pool) + ")\n" + stackText(g.stack);
          return;
        }
      }
    }
    self.hover = hover;
    var drag = null;
    cv.addEventListener("mousemove", function (ev) {
      if (drag && (ev.buttons & 1)) {
        panMap((drag[0] - ev.offsetX) / zoom.z, (drag[1] - ev.offsetY) / zoom.z);
        drag = [ev.offsetX, ev.offsetY];
        return;
      }
      hover(ev.offsetX, ev.offsetY);
    });
    cv.addEventListener("mousedown", function (ev) { drag = [ev.offsetX, ev.offsetY]; });
    cv.addEventListener("mouseup", function () { drag = null; });
    cv.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      zoomMap(ev.deltaY < 0 ? 1.25 : 0.8, ev.offsetX, ev.offsetY);
    }, { passive: false });
    zin.addEventListener("click", function () { zoomMap(2); });
    zout.addEventListener("click", function () { zoomMap(0.5); });
    zfit.addEventListener("click", function () { zoom.z = 1; panMap(-zoom.px, -zoom.py); });
    /* the map's own keys while it has the focus */
    cv.addEventListener("keydown", function (ev) {
      var d = 40 / zoom.z;
      if (ev.key === "+" || ev.key === "=") zoomMap(2);
      else if (ev.key === "-") zoomMap(0.5);
      else if (ev.key === "0") { zoom.z = 1; panMap(-zoom.px, -zoom.py); }
      else if (ev.key === "ArrowLeft") panMap(-d, 0);
      else if (ev.key === "ArrowRight") panMap(d, 0);
      else if (ev.key === "ArrowUp") panMap(0, -d);
      else if (ev.key === "ArrowDown") panMap(0, d);
      else return;
      ev.preventDefault();
      ev.stopPropagation();
    });
    list.addEventListener("scroll", renderRows);
    function key(ev) {
      var tag = ev.target && ev.target.tagName;
      if (tag === "INPUT" || tag === "SELECT" || tag === "BUTTON" || ev.target === cv) return;
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
    self.selectEntry = function (e) { select(rowOf(e)); };
    self.rows = rows;
    self.state = st;
    self.info = info;
    if (n === 0) {
      info.textContent = "The snapshot has no trace: the map shows its segments and blocks at the "
        + "moment it was taken.\n" + totalsText(st.totals());
      drawMap();
    } else {
      var h0 = readHash();
      renderRows();
      select(h0.event !== undefined ? rowOf(+h0.event) : n - 1);
    }
    return self;
  }

  V.AllocState = AllocState; V.historyView = historyView;
})();
