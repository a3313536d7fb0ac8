/* SPDX-License-Identifier: MIT
 * memsnap view: reading the page's binary data (embedded before view.js; no library).
 * window.memsnapData.load(meta, id) inflates a binary element (ms-bin, ms-trace: gzip, escaped, viz/view/bin.h) with
 * the browser's own DecompressionStream and returns one typed array per section, delta-coded
 * sections summed back. window.memsnapData.stacks(sections, nframes) reads the stacks
 * (viz/view/stacks.h) one at a time, when one is asked for.
 */
(function () {
  "use strict";

  /* An escaped binary element's text (viz/view/bin.h) back to its bytes. The page is declared
   * windows-1252, whose decoder turns each byte the writer leaves as it is into the character of
   * the same code; the escape byte '=' and the byte after it stand for that byte minus 64 (modulo
   * 256). A character above U+00FF means the page was changed (saved again in another encoding). */
  function unescapeBytes(str) {
    var n = str.length, out = new Uint8Array(n), i, j = 0, c;
    for (i = 0; i < n; i++) {
      c = str.charCodeAt(i);
      if (c === 61) {
        if (++i === n) throw new Error("the page's data is damaged (an escape at its end)");
        c = (str.charCodeAt(i) - 64) & 255;
      } else if (c > 255) {
        throw new Error("the page's data is damaged (character U+" + c.toString(16).toUpperCase()
          + " at " + i + ": was the page saved again in another encoding?)");
      }
      out[j++] = c;
    }
    return out.subarray(0, j);
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
    if (meta.encoding !== "gzip+esc") return Promise.reject(new Error("unknown data encoding " + meta.encoding));
    var node = document.getElementById(id), text = node.textContent;
    node.textContent = "";
    if (phase) phase("text");
    var bytes = unescapeBytes(text);
    text = null;
    if (phase) phase("unescape");
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

  window.memsnapData = { load: load, stacks: stacks, unescapeBytes: unescapeBytes };
})();
