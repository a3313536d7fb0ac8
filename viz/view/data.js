/* SPDX-License-Identifier: MIT
 * memsnap view: reading the page's binary data (embedded before view.js; no library).
 * window.memsnapData.load(meta, id) inflates a binary element (ms-bin, ms-stacks: base64 of gzip, viz/view/bin.h) with
 * the browser's own DecompressionStream and returns one typed array per section, delta-coded
 * sections summed back. window.memsnapData.stacks(sections, nframes) reads the stacks
 * (viz/view/stacks.h) one at a time, when one is asked for.
 */
(function () {
  "use strict";

  /* base64 to bytes: the browser's own decoder where it has one, else a table */
  function unbase64(str) {
    if (typeof Uint8Array.fromBase64 === "function") {
      try { return Uint8Array.fromBase64(str); } catch (e) { /* below */ }
    }
    var lut = new Uint8Array(128), abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", i, j;
    for (i = 0; i < 64; i++) lut[abc.charCodeAt(i)] = i;
    var n = str.length;
    while (n > 0 && (str.charCodeAt(n - 1) === 61 || str.charCodeAt(n - 1) <= 32)) n--;
    var out = new Uint8Array(Math.floor(n * 3 / 4));
    for (i = 0, j = 0; i + 3 < n; i += 4) {
      var v = lut[str.charCodeAt(i)] << 18 | lut[str.charCodeAt(i + 1)] << 12
        | lut[str.charCodeAt(i + 2)] << 6 | lut[str.charCodeAt(i + 3)];
      out[j++] = v >> 16; out[j++] = v >> 8 & 255; out[j++] = v & 255;
    }
    var rest = n - i;
    if (rest >= 2) {
      var w = lut[str.charCodeAt(i)] << 18 | lut[str.charCodeAt(i + 1)] << 12
        | (rest > 2 ? lut[str.charCodeAt(i + 2)] << 6 : 0);
      out[j++] = w >> 16;
      if (rest > 2) out[j++] = w >> 8 & 255;
    }
    return out;
  }

  /* a delta-coded section back to its values (i32/u32 modulo 2^32, as the writer) */
  function undelta(a) {
    var n = a.length, i;
    if (a instanceof Float64Array) { for (i = 1; i < n; i++) a[i] += a[i - 1]; }
    else if (a instanceof Int32Array) { for (i = 1; i < n; i++) a[i] = (a[i] + a[i - 1]) | 0; }
    else { for (i = 1; i < n; i++) a[i] = (a[i] + a[i - 1]) >>> 0; }
    return a;
  }

  /* the element ID's sections; its text is dropped once read (it is the page's largest part) */
  function load(meta, id, phase) {
    var node = document.getElementById(id), bytes = unbase64(node.textContent);
    node.textContent = "";
    if (phase) phase("base64");
    var input = new ReadableStream({ start: function (c) { c.enqueue(bytes); c.close(); } });
    var reader = input.pipeThrough(new DecompressionStream("gzip")).getReader();
    var out = new Uint8Array(meta.length), at = 0;
    function pump() {
      return reader.read().then(function (r) {
        if (r.done) return;
        if (at + r.value.length > out.length) throw new Error("the page's data is damaged (too long)");
        out.set(r.value, at);
        at += r.value.length;
        return pump();
      });
    }
    return pump().then(function () {
      bytes = null;
      if (phase) phase("inflated");
      if (at !== meta.length) throw new Error("the page's data is damaged (" + at + " of " + meta.length + " bytes)");
      var types = { i32: Int32Array, u32: Uint32Array, u16: Uint16Array, u8: Uint8Array, f64: Float64Array }, res = {};
      meta.sections.forEach(function (s) {
        res[s.name] = new types[s.type](out.buffer, s.offset, s.count);
        if (s.delta) undelta(res[s.name]);
      });
      return res;
    });
  }

  /* The stacks: frames(i) gives stack i's frame numbers, innermost first. */
  function stacks(B, nframes) {
    var count = B["stacks.count"], ranks = B["stacks.ranks"], sc = B["stacks.succ_count"], succ = B["stacks.succ"];
    var nbig = B["stacks.nbig"], big = B["stacks.ranks_big"];
    var start = null, bigStart = null, succStart = null;
    function index() {
      start = new Float64Array(count.length + 1);
      bigStart = new Float64Array(count.length + 1);
      for (var i = 0; i < count.length; i++) { start[i + 1] = start[i] + count[i]; bigStart[i + 1] = bigStart[i] + nbig[i]; }
      succStart = new Float64Array(sc.length + 1);
      for (i = 0; i < sc.length; i++) succStart[i + 1] = succStart[i] + sc[i];
    }
    return {
      n: count.length,
      frames: function (st) {
        if (!start) index();
        var n = count[st], out = new Uint32Array(n), ctx = nframes, r = start[st], b = bigStart[st];
        for (var k = 0; k < n; k++) {
          var q = ranks[r + k], f = succ[succStart[ctx] + (q === 255 ? big[b++] : q)];
          out[n - 1 - k] = f;
          ctx = f;
        }
        return out;
      }
    };
  }

  window.memsnapData = { load: load, stacks: stacks, unbase64: unbase64 };
})();
