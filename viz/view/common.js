/* SPDX-License-Identifier: MIT
 * memsnap view: what every part of the page's script shares (embedded first of the viewer's own
 * scripts, after data.js .. flame.js; no library). window.memsnapPage (V) holds the page's state:
 * the data D (ms-data, filled by view.js), the URL fragment's state (hash), the moment chosen
 * (V.selectedT), the filters (V.streamFilter, V.poolFilter, catOff, V.colorBy, V.range,
 * V.allFrames), and the helpers each later script takes from it: the DOM and size helpers, the
 * snapshot's facts (streams numbered as MemoryViz numbers them, address versions, blocks) and the
 * stacks as shown (frames.js's filter and escaping). Every name from the data is shown through
 * textContent only. docs/view.md describes the views, their colours, the keys and how the drawing
 * scales.
 */
(function () {
  "use strict";

  var V = window.memsnapPage = { selectedT: -1, streamFilter: -1, poolFilter: "", colorBy: "allocation",
                                  range: null, allFrames: false };

  var A = { ALLOC: 0, FREE_REQ: 1, FREE_DONE: 2, SEG_ALLOC: 3, SEG_FREE: 4, SEG_MAP: 5,
            SEG_UNMAP: 6, SNAPSHOT: 7, OOM: 8 };

  var D = {};           /* ms-data (filled by view.js) */
  var hash = {};        /* the URL fragment's state (setHash replaces it in place) */
  var catOff = {};      /* categories (their index in D.categories) whose bands are hidden */

  /* ---- helpers ------------------------------------------------------------------------------ */

  function el(tag, cls, parent, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  /* PyTorch's formatSize: "605.0KiB" */
  function fmtSize(n) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"], i = 0, v = Math.abs(n);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (n < 0 ? "-" : "") + v.toFixed(1) + units[i];
  }
  function fmtBoth(n) { return fmtSize(n) + " (" + n + " bytes)"; }

  function parseJSON(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function readHash() {
    var h = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) h[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1));
    });
    return h;
  }
  function writeHash() {
    var parts = [];
    Object.keys(hash).forEach(function (k) {
      if (hash[k] !== undefined && hash[k] !== null && hash[k] !== "")
        parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(hash[k]));
    });
    try { history.replaceState(null, "", "#" + parts.join("&")); } catch (e) { /* file: */ }
  }

  /* ---- the snapshot's facts ----------------------------------------------------------------- */

  var streamIds = {};
  function streamName(raw) {
    var k = String(raw);
    if (!(k in streamIds)) streamIds[k] = raw === 0 ? 0 : Object.keys(streamIds).length;
    return streamIds[k];
  }

  /* Streams are numbered as MemoryViz numbers them: in order of first use in the trace, then in
   * the segments (one cheap pass: streams are few and change rarely from entry to entry). */
  function numberStreams(tr) {
    var n = tr.stream.length, last = NaN;
    for (var i = 0; i < n; i++) if (tr.stream[i] !== last) { last = tr.stream[i]; streamName(last); }
    D.segments.forEach(function (s) { streamName(s.stream); });
  }
  /* Annotation as MemoryViz: the version of each address at each trace entry; computed when a
   * text first needs it (hover, the state history), not before the first paint. */
  function versions() {
    var tr = D.trace;
    if (!tr.ver) annotate(tr);
    return tr;
  }
  function annotate(tr) {
    var n = tr.action.length, bver = new Map(), sver = new Map();
    var ver = new Int32Array(n);
    for (var i = 0; i < n; i++) {
      var a = tr.action[i], key = tr.addr[i];
      if (a === A.FREE_DONE) { var v = bver.get(key) || 0; ver[i] = v; bver.set(key, v + 1); }
      else if (a === A.ALLOC || a === A.FREE_REQ) ver[i] = bver.get(key) || 0;
      else if (a === A.SEG_FREE || a === A.SEG_UNMAP) {
        var w = sver.get(key) || 0; ver[i] = w; sver.set(key, w + 1);
      } else if (a === A.SEG_ALLOC || a === A.SEG_MAP) ver[i] = sver.get(key) || 0;
    }
    tr.ver = ver;
    tr.bver = bver;
    tr.sver = sver;
  }

  function hexAddr(i) { return D.trace.addr[i].toString(16); }
  /* the trace's own pool column (segment events carry it; an alloc's is found by address) */
  function poolOf(i) { var k = D.trace.pool[i]; return k >= 0 ? D.pools[k] : null; }
  var STK = null; /* the stacks (data.js), decoded one at a time */
  function stackFrames(st) { return STK ? STK.frames(st) : new Uint32Array(0); }
  function frameRaw(fi) {
    var f = D.frames[fi];
    return f[0] + ":" + f[1] + ":" + f[2];
  }
  /* a frame as shown: its bidirectional controls and lone surrogates escaped (frames.js) */
  function frameText(fi) { return window.memsnapFrames.safe(frameRaw(fi)); }
  /* The frames of a stack that are shown: without those PyTorch's viewer leaves out (frames.js),
   * unless the "all frames" box is ticked. */
  var keptFrame = null;
  function shownFrames(st) {
    var fr = stackFrames(st);
    if (V.allFrames) return fr;
    if (!keptFrame) {
      keptFrame = new Uint8Array(D.frames.length);
      D.frames.forEach(function (f, i) { keptFrame[i] = window.memsnapFrames.keep(String(f[0]), String(f[2])) ? 1 : 2; });
    }
    return fr.filter(function (f) { return keptFrame[f] === 1; });
  }
  /* Innermost first, consecutive duplicates collapsed as the viewer does. */
  function stackText(stack) {
    if (!STK && stack >= 0) return "(the stacks are still being read)";
    if (stack < 0 || stack >= D.nstacks || stackFrames(stack).length === 0)
      return "No frames recorded: the block was allocated before recording started, the "
        + "recording kept no stacks, or the entry fell out of the ring buffer.";
    var fr = shownFrames(stack), out = [], i = 0, hidden = stackFrames(stack).length - fr.length;
    while (i < fr.length) {
      var j = i + 1;
      while (j < fr.length && fr[j] === fr[i]) j++;
      out.push(frameText(fr[i]));
      if (j - i > 1) out.push("<repeats " + (j - i - 1) + " times>");
      i = j;
    }
    if (hidden) out.push("(" + hidden + " frame" + (hidden > 1 ? "s" : "") + " of the unwinder, the interpreter, "
      + "the dispatcher or the allocator hidden, as PyTorch's viewer hides them: tick \"all frames\")");
    return out.join("\n");
  }
  function fmtTime(us) {
    if (us < 0) return "not recorded";
    return new Date(us / 1000).toString();
  }
  /* the pool as PyTorch's hover writes it, from the Pool filter's address lookup (elementPool) */
  function poolText(p) {
    if (typeof p === "string") p = p && p !== "unknown" ? p.split(",") : null;
    return p ? "pool_id (" + p[0] + ", " + p[1] + ")" : "pool_id unknown";
  }

  /* The global block index k -> [segment, block index inside it, address]. */
  var blockIndex = null;
  function snapBlock(k) {
    if (!blockIndex) {
      blockIndex = new Map();
      D.segments.forEach(function (s) {
        var addr = parseInt(s.addr, 16);
        s.blocks.forEach(function (b, i) { blockIndex.set(s.first_block + i, [s, i, addr]); addr += b[0]; });
      });
    }
    return blockIndex.get(k);
  }
  function segmentOfIndex(k) {
    for (var i = 0; i < D.segments.length; i++) if (D.segments[i].index === k) return D.segments[i];
    return null;
  }

  /* a new device: its streams are numbered again, its blocks indexed again */
  function resetDevice() { streamIds = {}; blockIndex = null; }
  function resetStreams() { streamIds = {}; }
  /* the streams' numbers: raw stream -> number */
  function streamNumbers() { return streamIds; }
  function setStacks(s) { STK = s; return s; }
  function setHash(h) {
    Object.keys(hash).forEach(function (k) { delete hash[k]; });
    Object.keys(h).forEach(function (k) { hash[k] = h[k]; });
  }

  V.A = A; V.D = D; V.hash = hash; V.catOff = catOff; V.el = el; V.fmtSize = fmtSize;
  V.fmtBoth = fmtBoth; V.parseJSON = parseJSON; V.readHash = readHash; V.writeHash = writeHash;
  V.streamName = streamName; V.numberStreams = numberStreams; V.versions = versions;
  V.hexAddr = hexAddr; V.poolOf = poolOf; V.stackFrames = stackFrames; V.frameRaw = frameRaw;
  V.frameText = frameText; V.shownFrames = shownFrames; V.stackText = stackText;
  V.fmtTime = fmtTime; V.poolText = poolText; V.snapBlock = snapBlock;
  V.segmentOfIndex = segmentOfIndex; V.resetDevice = resetDevice; V.resetStreams = resetStreams;
  V.streamNumbers = streamNumbers; V.setStacks = setStacks; V.setHash = setHash;
})();
