/* SPDX-License-Identifier: MIT
 * memsnap view: reading the page's binary data (embedded before view.js; no library).
 * window.memsnapData.load(meta, id) inflates a binary element (ms-bin, ms-trace: gzip, escaped, viz/view/bin.h) with
 * the browser's own DecompressionStream and returns one typed array per section, shuffled
 * sections transposed back and delta-coded ones summed back. window.memsnapData.stacks(sections, nframes) reads the stacks
 * (viz/view/stacks.h) one at a time, when one is asked for, or all in one pass (each); it is
 * self-contained, as search.js runs its source in a worker.
 */
(function () {
  "use strict";

  /* An escaped binary element's text (viz/view/bin.h) back to its bytes. The page is declared
   * windows-1252, whose decoder turns each byte the writer leaves as it is into one character:
   * of the same code, or for 27 of the bytes 0x80-0x9F one above U+00FF (C1 maps them back); the
   * escape byte '=' and the byte after it stand for that byte minus 64 (modulo 256). Any other
   * character above U+00FF means the page was changed (saved again in another encoding). */
  var C1 = new Uint8Array(0x2200);
  [0x20AC, 0, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0,
    0x017D, 0, 0, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A,
    0x0153, 0, 0x017E, 0x0178].forEach(function (u, i) { if (u) C1[u] = 0x80 + i; });
  function unescapeBytes(str) {
    var n = str.length, out = new Uint8Array(n), i, j = 0, c;
    for (i = 0; i < n; i++) {
      c = str.charCodeAt(i);
      if (c === 61) {
        if (++i === n) throw new Error("the page's data is damaged (an escape at its end)");
        c = (str.charCodeAt(i) - 64) & 255;
      } else if (c > 255) {
        if (c < 0x2200 && C1[c]) c = C1[c];
        else throw new Error("the page's data is damaged (character U+" + c.toString(16).toUpperCase()
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

  /* a shuffled section's blocks (viz/view/bin.h) back from byte planes to values of w bytes;
   * 4 and 8 bytes a 32-bit word at a time (typed arrays are little-endian, as the data is) */
  function unshuffle(buf, offset, count, w, block) {
    var u8 = new Uint8Array(buf, offset, count * w), tmp = new Uint8Array(block * w), v0, n, k, i, at, b, o;
    var u32 = w >= 4 ? new Uint32Array(buf, offset, count * w / 4) : null;
    for (v0 = 0; v0 < count; v0 += block) {
      n = Math.min(block, count - v0);
      b = u8.subarray(v0 * w, (v0 + n) * w);
      tmp.set(b);
      if (w === 8) {
        for (i = 0, o = 2 * v0; i < n; i++, o += 2) {
          u32[o] = tmp[i] | tmp[n + i] << 8 | tmp[2 * n + i] << 16 | tmp[3 * n + i] << 24;
          u32[o + 1] = tmp[4 * n + i] | tmp[5 * n + i] << 8 | tmp[6 * n + i] << 16 | tmp[7 * n + i] << 24;
        }
      } else if (w === 4) {
        for (i = 0, o = v0; i < n; i++, o++) u32[o] = tmp[i] | tmp[n + i] << 8 | tmp[2 * n + i] << 16 | tmp[3 * n + i] << 24;
      } else {
        for (k = 0; k < w; k++) for (i = 0, at = k * n; i < n; i++) b[i * w + k] = tmp[at + i];
      }
    }
  }

  /* A buffer's memory given back now, not at the next garbage collection, which may be long in
   * coming once the page stops allocating (the tab's heap counts the garbage until then): its
   * buffer detached (transferred to an empty one). Where transfer is missing, it waits for the
   * collector. */
  function release(a) {
    var b = a && a.buffer;
    if (b && typeof b.transfer === "function" && !b.detached) {
      try { b.transfer(0); } catch (e) { /* not detachable: left to the collector */ }
    }
  }

  /* the element ID's sections; its text is dropped once read (it is the page's largest part),
   * its escaped bytes once inflated, and every inflated chunk once copied */
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
        release(r.value);
        return pump();
      });
    }
    return pump().then(function () {
      release(bytes);
      bytes = null;
      if (phase) phase("inflated");
      if (at !== meta.length) throw new Error("the page's data is damaged (" + at + " of " + meta.length + " bytes)");
      var types = { i32: Int32Array, u32: Uint32Array, u16: Uint16Array, u8: Uint8Array, f64: Float64Array }, res = {};
      meta.sections.forEach(function (s) {
        if (s.shuffle) unshuffle(out.buffer, s.offset, s.count, types[s.type].BYTES_PER_ELEMENT, s.shuffle);
        res[s.name] = new types[s.type](out.buffer, s.offset, s.count);
        if (s.delta) undelta(res[s.name]);
      });
      return res;
    });
  }

  /* The stacks (viz/view/stacks.h): frames(i) gives stack i's frame numbers, innermost first,
   * read from where stack 64 * (i / 64) starts in the four rank sections (stacks.at). */
  function stacks(B, nframes) {
    var ranks = B["stacks.ranks"], hi = B["stacks.ranks_hi"], lo = B["stacks.ranks_lo"], big = B["stacks.ranks_big"];
    var sc = B["stacks.succ_count"], succ = B["stacks.succ"], n = B["stacks.n"][0];
    var at = B["stacks.at"], nck = (n + 63) >> 6, succStart = null, pos = { r: 0, h: 0, l: 0, b: 0 };
    function damaged(what) { throw new Error("the page's stacks are damaged (" + what + ")"); }
    /* one stack from pos (advanced past it); its frames, outermost first, into out (if given) */
    function walk(out) {
      var ctx = nframes, steps = 0, s0, ns, q, f;
      for (;;) {
        s0 = succStart[ctx];
        ns = succStart[ctx + 1] - s0;
        if (ns === 1) q = 0;
        else {
          if (ns <= 256) q = ranks[pos.r++];
          else { q = hi[pos.h++]; q = q === 255 ? big[pos.b++] : (q << 8) + lo[pos.l++]; }
          if (!(q < ns)) damaged("a rank out of its list");
        }
        f = succ[s0 + q];
        if (f === nframes) return;
        if (f > nframes || ++steps > 16777216) damaged("a frame out of range");
        if (out) out.push(f);
        ctx = f;
      }
    }
    function index() {
      succStart = new Float64Array(sc.length + 1);
      for (var i = 0; i < sc.length; i++) succStart[i + 1] = succStart[i] + sc[i];
      if (sc.length !== nframes + 1 || succStart[sc.length] !== succ.length || at.length !== 4 * nck)
        damaged("their lists");
    }
    return {
      n: n,
      frames: function (st) {
        if (!succStart) index();
        var c = st >> 6, out = [];
        pos.r = at[c]; pos.h = at[nck + c]; pos.l = at[2 * nck + c]; pos.b = at[3 * nck + c];
        for (var i = c << 6; i < st; i++) walk(null);
        walk(out);
        return Uint32Array.from(out.reverse());
      },
      /* every stack in order, in one pass: f(st, frames outermost first) (the search's index) */
      each: function (f) {
        if (!succStart) index();
        pos.r = pos.h = pos.l = pos.b = 0;
        for (var st = 0; st < n; st++) { var out = []; walk(out); f(st, out); }
      }
    };
  }

  window.memsnapData = { load: load, stacks: stacks, unescapeBytes: unescapeBytes };
})();
