/* SPDX-License-Identifier: MIT
 * Tests for the offline HTML viewer (memsnap/view.h, `memsnap view`, issue #13): on every
 * PyTorch fixture the page's binary data, decoded here (unescape, gunzip, sections), equals
 * ms_tlv_compute's timeline data (which test_timeline compares with PyTorch's own output) and the
 * device's trace and the stacks; the page is self-contained (five script elements, a
 * Content-Security-Policy that forbids every fetch, no network address or fetching call in the
 * page's own code), hostile names in frames and titles stay data, errors are reported, and
 * `trace_plot -f` keeps only what is alive at the end. tests/browser/view.sh runs the pages in
 * Chromium.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "memsnap/view.h"
#include "model/snapbuild.h"
#include "view/bin.h"
#include "view/spool.h"

#include <zlib.h>

static const char *const fixtures[] = {
    "jogregoire_diffusion_tiny", "a0kuma_adamw_small",    "yiyi_flexgen_oom_legacy",
    "yiyi_flexgen_1.3b_legacy_a", "maphsge_select_n_4dev", "cranberrii_ftcourse",
    "wedsonlin_cs336_medium_1024_training",
};
#define NFIX (sizeof fixtures / sizeof *fixtures)

static ms_snapshot_t *load_fixture(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), name);
  if (access(path, R_OK) != 0) return NULL;
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s: %s", path, eb.msg);
  return s;
}

/* The page as a NUL-terminated string. */
static char *page_of(const ms_snapshot_t *s, const ms_viewer_opts_t *o) {
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  int rc = ms_viewer_write_html(s, o, &sink, &eb);
  cr_assert_eq(rc, MS_OK, "ms_viewer_write_html: %s (%s)", ms_strerror(rc), eb.msg);
  cr_assert_null(memchr(m.data, 0, m.len), "no NUL byte in the page");
  char *p = malloc(m.len + 1);
  cr_assert(p);
  memcpy(p, m.data, m.len);
  p[m.len] = 0;
  th_memsink_free(&m);
  return p;
}

static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* The text of <script type="application/json" id="ID">, malloc'd. */
static char *element(const char *page, const char *id) {
  char open[128];
  snprintf(open, sizeof open, "<script type=\"application/json\" id=\"%s\">", id);
  const char *a = strstr(page, open);
  cr_assert(a, "no element %s", id);
  a += strlen(open);
  const char *z = strstr(a, "</script>");
  cr_assert(z);
  return strndup(a, (size_t)(z - a));
}

/* ---- the page's binary data, decoded here independently of the page's script ---------------- */

typedef struct bin_s {
  unsigned char *data;
  size_t len;
  char *json; /* the ms-data element */
  size_t undone[256]; /* offsets of the delta-coded sections already summed back */
  size_t nundone;
} bin_t;

/* The byte values the page escapes (viz/view/bin.h): NUL, CR, '<', '=' and, narrow, the 27 bytes
 * 0x80-0x9F that windows-1252 decodes to characters above U+00FF (all but 0x81, 0x8D, 0x8F, 0x90,
 * 0x9D). */
static bool escaped_byte(unsigned char c, bool narrow) {
  static const unsigned char set[] = {0x00, 0x0d, 0x3c, 0x3d, 0x80, 0x82, 0x83, 0x84,
                                      0x85, 0x86, 0x87, 0x88, 0x89, 0x8a, 0x8b, 0x8c,
                                      0x8e, 0x91, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97,
                                      0x98, 0x99, 0x9a, 0x9b, 0x9c, 0x9e, 0x9f};
  return memchr(set, c, narrow ? sizeof set : 4) != NULL;
}

/* The escaped text of a binary element (viz/view/bin.h) back to its bytes, checking that the
 * HTML parser would leave it alone and windows-1252 decode it byte for character: none of the
 * escaped bytes raw, each escape followed by one of them plus 64. */
static size_t unescape_bin(const char *a, size_t n, unsigned char *out, bool narrow) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)a[i];
    cr_assert(!escaped_byte(c, narrow) || c == '=', "byte 0x%02x at %zu of a binary element", c, i);
    if (c == '=') {
      cr_assert_lt(i + 1, n, "an escape at the end");
      c = (unsigned char)(a[++i] - 64);
      cr_assert(escaped_byte(c, narrow), "escaped byte 0x%02x", c);
    }
    out[k++] = c;
  }
  return k;
}

/* The binary element ID (ms-bin: the devices' timelines, ms-trace: their traces and the stacks),
 * inflated; KEY names its entry in the JSON element JSON_ID ("bin" in ms-data, "trace_bin" in
 * ms-trace-data). */
static bin_t bin_of_element(const char *page, const char *id, const char *key,
                            const char *json_id) {
  char open[96];
  snprintf(open, sizeof open, "<script type=\"application/octet-stream\" id=\"%s\">", id);
  const char *a = strstr(page, open);
  cr_assert(a, "no %s element", id);
  a += strlen(open);
  const char *z = strstr(a, "</script>");
  cr_assert(z);
  size_t n = (size_t)(z - a);
  unsigned char *gz = malloc(n + 1);
  size_t k = unescape_bin(a, n, gz, strcmp(id, "ms-bin") == 0);
  bin_t b = {NULL, 0, element(page, json_id), {0}, 0};
  char lkey[96];
  snprintf(lkey, sizeof lkey, "\"%s\":{\"encoding\":\"gzip+esc\",\"length\":", key);
  const char *lp = strstr(b.json, lkey);
  cr_assert(lp, "no %s in the JSON", key);
  lp = strstr(lp, "\"length\":");
  b.len = strtoull(lp + 9, NULL, 10);
  b.data = malloc(b.len + 1);
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  cr_assert_eq(inflateInit2(&zs, 16 + MAX_WBITS), Z_OK);
  zs.next_in = gz;
  zs.avail_in = (uInt)k;
  zs.next_out = b.data;
  zs.avail_out = (uInt)b.len + 1;
  cr_assert_eq(inflate(&zs, Z_FINISH), Z_STREAM_END, "the data is one gzip stream");
  cr_assert_eq(zs.total_out, b.len, "inflated length as the JSON says");
  inflateEnd(&zs);
  free(gz);
  return b;
}

static bin_t bin_of(const char *page) { return bin_of_element(page, "ms-bin", "bin", "ms-data"); }
static bin_t trace_of(const char *page) {
  return bin_of_element(page, "ms-trace", "trace_bin", "ms-trace-data");
}

static void bin_free(bin_t *b) {
  free(b->data);
  free(b->json);
}

static uint64_t le(const unsigned char *p, size_t n);
static void put_le(unsigned char *p, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A shuffled section ("shuffle":B) transposed back and a delta-coded one ("delta":true) summed
 * back, in place, once: i32/u32 modulo 2^32, f64 as doubles (the page does the same). */
static void restore(bin_t *b, unsigned char *p, const char *type, size_t n, size_t w,
                    unsigned block, bool delta) {
  for (size_t i = 0; i < b->nundone; i++)
    if (b->undone[i] == (size_t)(p - b->data)) return;
  cr_assert_lt(b->nundone, 256);
  b->undone[b->nundone++] = (size_t)(p - b->data);
  if (block) {
    unsigned char *tmp = malloc((size_t)block * w);
    for (size_t v0 = 0; v0 < n; v0 += block) {
      size_t k = n - v0 < block ? n - v0 : block;
      unsigned char *q = p + v0 * w;
      memcpy(tmp, q, k * w);
      for (size_t j = 0; j < w; j++)
        for (size_t i = 0; i < k; i++) q[i * w + j] = tmp[j * k + i];
    }
    free(tmp);
  }
  if (!delta) return;
  if (type[0] == 'f') {
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
      uint64_t u = le(p + 8 * i, 8);
      double d;
      memcpy(&d, &u, 8);
      acc += d;
      memcpy(&u, &acc, 8);
      put_le(p + 8 * i, u, 8);
    }
  } else {
    cr_assert(type[1] == '3', "only 32-bit integer sections are delta coded");
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
      acc += (uint32_t)le(p + 4 * i, 4);
      put_le(p + 4 * i, acc, 4);
    }
  }
}

/* The section NAME: its type, count and bytes (delta-coded ones summed back). */
static const unsigned char *section(bin_t *b, const char *name, const char *type,
                                    size_t *count) {
  char key[64];
  snprintf(key, sizeof key, "{\"name\":\"%s\",\"type\":\"%s\",\"offset\":", name, type);
  const char *p = strstr(b->json, key);
  cr_assert(p, "no section %s of type %s", name, type);
  unsigned long long off = 0, cnt = 0;
  cr_assert_eq(sscanf(p + strlen(key), "%llu,\"count\":%llu", &off, &cnt), 2);
  cr_assert_eq(off % 8, 0, "%s aligned", name);
  size_t w = type[0] == 'f' ? 8 : type[1] == '8' ? 1 : type[1] == '1' ? 2 : 4;
  cr_assert_leq(off + cnt * w, b->len, "%s inside the data", name);
  *count = (size_t)cnt;
  const char *end = strchr(p + strlen(key), '}');
  cr_assert(end);
  unsigned block = 0;
  const char *sh = strstr(p, ",\"shuffle\":");
  if (sh && sh < end) cr_assert_eq(sscanf(sh + 11, "%u", &block), 1);
  cr_assert(block == 0 || w > 1, "%s: a shuffled section of bytes", name);
  bool delta = strncmp(end - 13, ",\"delta\":true", 13) == 0;
  if (delta || block) restore(b, b->data + off, type, (size_t)cnt, w, block, delta);
  return b->data + off;
}

static uint64_t le(const unsigned char *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}
static double f64_at(const unsigned char *p, size_t i) {
  uint64_t u = le(p + 8 * i, 8);
  double d;
  memcpy(&d, &u, 8);
  return d;
}
static int64_t i32_at(const unsigned char *p, size_t i) { return (int32_t)(uint32_t)le(p + 4 * i, 4); }

/* max_at_time from the bands alone, as the page computes it (timeline-data.js, maxAtTime): a band counts
 * from its first point to its last one less a step, or to two steps after its last point when
 * the bands above it moved down as it ended (a band has a point there and, lower, one three steps
 * later). */
static int64_t *max_at_time_of(const ms_tlv_t *v) {
  size_t nt = v->ntimesteps;
  unsigned char *moved = calloc(nt + 4, 1);
  int64_t *diff = calloc(nt + 4, sizeof *diff), *out = calloc(nt + 1, sizeof *out);
  cr_assert(moved && diff && out);
  for (size_t s = 0; s < v->nseries; s++) {
    const ms_tlv_series_t *r = &v->series[s];
    if (r->elem < 0) continue;
    for (size_t k = r->first_point; k + 1 < r->first_point + r->npoints; k++)
      if (v->timesteps[k + 1] - v->timesteps[k] == 3 && v->offsets[k + 1] < v->offsets[k])
        moved[v->timesteps[k]] = 1;
  }
  for (size_t s = 0; s < v->nseries; s++) {
    const ms_tlv_series_t *r = &v->series[s];
    if (r->elem < 0 || r->npoints == 0) continue;
    int64_t t0 = v->timesteps[r->first_point], te = v->timesteps[r->first_point + r->npoints - 1];
    cr_assert(t0 >= 0 && te >= t0 && (size_t)te <= nt);
    diff[t0] += r->size;
    diff[moved[te] ? te + 3 : te] -= r->size;
  }
  int64_t acc = 0;
  for (size_t k = 0; k < nt; k++) out[k] = acc += diff[k];
  free(moved);
  free(diff);
  return out;
}

/* The page's timeline sections PREFIX.* hold exactly ms_tlv_compute's data (nothing
 * summarized): every series, point, offset, size and source; max_at_time follows from them. */
static void check_tlv(bin_t *b, const char *key, const ms_snapshot_t *s, size_t dev,
                      bool seg) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "d%zu.%s", dev, key);
  ms_tlv_t v;
  cr_assert_eq(ms_tlv_compute(s, dev, seg, SIZE_MAX, 0, SIZE_MAX, NULL, &v), MS_OK);
  char n[160];
  size_t c;
#define SEC(suffix, type) (snprintf(n, sizeof n, "%s.%s", prefix, suffix), section(b, n, type, &c))
  const unsigned char *first = SEC("first", "u32");
  cr_assert_eq(c, v.nseries);
  const unsigned char *np = SEC("npoints", "u32");
  const unsigned char *elem = SEC("elem", "i32");
  const unsigned char *size = SEC("size", "f64");
  const unsigned char *color = SEC("color", "i32");
  const unsigned char *ghost = SEC("ghost", "u8");
  for (size_t i = 0; i < v.nseries; i++) {
    const ms_tlv_series_t *r = &v.series[i];
    cr_assert_eq(le(first + 4 * i, 4), r->first_point);
    cr_assert_eq(le(np + 4 * i, 4), r->npoints);
    cr_assert_eq(i32_at(elem, i), r->elem);
    if (r->elem >= 0) cr_assert_eq(f64_at(size, i), (double)r->size);
    cr_assert_eq(i32_at(color, i), r->color);
    cr_assert_eq(ghost[i], r->ghost);
  }
  const unsigned char *T = SEC("T", "i32");
  cr_assert_eq(c, v.npoints);
  for (size_t i = 0; i < v.npoints; i++) cr_assert_eq(i32_at(T, i), v.timesteps[i]);
  const unsigned char *O = SEC("O", "f64");
  cr_assert_eq(c, v.npoints + 1); /* the summarized band is always last */
  for (size_t i = 0; i < c; i++) cr_assert_eq(f64_at(O, i), (double)v.offsets[i]);
  const ms_tlv_series_t *last = &v.series[v.nseries - 1];
  cr_assert_lt(last->elem, 0);
  const unsigned char *S = SEC("S", "f64");
  cr_assert_eq(c, last->npoints);
  for (size_t i = 0; i < c; i++) cr_assert_eq(f64_at(S, i), (double)v.sizes[last->first_point + i]);
  /* max_at_time is not in the page (its values are exact as doubles here): the bands give it
   * back, by the rule timeline-data.js's maxAtTime follows */
  snprintf(n, sizeof n, "%s.max_at_time", prefix);
  cr_assert_null(strstr(b->json, n), "max_at_time is computed by the page");
  int64_t *mat = max_at_time_of(&v);
  for (size_t i = 0; i < v.ntimesteps; i++)
    cr_assert_eq(mat[i], v.max_at_time[i], "%s max_at_time[%zu]", prefix, i);
  free(mat);
  const unsigned char *src = SEC("sources", "f64");
  cr_assert_eq(c, v.elements_length);
  for (size_t i = 0; i < c; i++) cr_assert_eq(f64_at(src, i), (double)v.element_source[i]);
#undef SEC
  char meta[160];
  snprintf(meta, sizeof meta, "\"%s\":{\"max_size\":%" PRId64 ",\"elements_length\":%zu,"
           "\"nseries\":%zu,\"npoints\":%zu,\"ntimesteps\":%zu}", key, v.max_size,
           v.elements_length, v.nseries, v.npoints, v.ntimesteps);
  cr_assert(strstr(b->json, meta), "%s", meta);
  ms_tlv_release(&v);
}

/* The stack sections (viz/view/stacks.h) give back every stack's frames; every written rank is in
 * its context's list, a context with one successor has no rank written, the lists are most used
 * first, and every section is read to its end. */
static void check_stacks(bin_t *sb, const ms_snapshot_t *s) {
  size_t c, nranks, nhi, nlo, nbig, nsc, nsucc, wf = s->nframes < 65536 ? 2 : 4;
  const unsigned char *n = section(sb, "stacks.n", "u32", &c);
  cr_assert_eq(c, 1);
  cr_assert_eq(le(n, 4), s->nstacks);
  const unsigned char *rk = section(sb, "stacks.ranks", "u8", &nranks);
  const unsigned char *hi = section(sb, "stacks.ranks_hi", "u8", &nhi);
  const unsigned char *lo = section(sb, "stacks.ranks_lo", "u8", &nlo);
  const unsigned char *big = section(sb, "stacks.ranks_big", "u32", &nbig);
  const unsigned char *ns = section(sb, "stacks.succ_count", "u32", &nsc);
  const unsigned char *su = section(sb, "stacks.succ", wf == 2 ? "u16" : "u32", &nsucc);
  cr_assert_eq(nsc, s->nframes + 1);
  size_t *start = calloc(nsc + 1, sizeof *start), *uses = calloc(nsucc + 1, sizeof *uses);
  for (size_t i = 0; i < nsc; i++) start[i + 1] = start[i] + le(ns + 4 * i, 4);
  cr_assert_eq(start[nsc], nsucc);
  size_t nat, nck = (s->nstacks + 63) / 64;
  const unsigned char *at = section(sb, "stacks.at", "f64", &nat);
  cr_assert_eq(nat, 4 * nck);
  size_t ir = 0, ih = 0, il = 0, ib = 0, root = s->nframes;
  for (size_t i = 0; i < s->nstacks; i++) {
    if (i % 64 == 0) {
      size_t q = i / 64;
      cr_assert(f64_at(at, q) == (double)ir && f64_at(at, nck + q) == (double)ih &&
                f64_at(at, 2 * nck + q) == (double)il && f64_at(at, 3 * nck + q) == (double)ib,
                "where stack %zu starts", i);
    }
    size_t ctx = root, nf = s->stacks[i].nframes;
    for (size_t k = nf + 1; k-- > 0;) { /* the frames outermost first, then the end */
      size_t len = start[ctx + 1] - start[ctx], r = 0;
      if (len > 1 && len <= 256) {
        cr_assert_lt(ir, nranks, "stack %zu: its ranks", i);
        r = rk[ir++];
      } else if (len > 256) {
        cr_assert_lt(ih, nhi, "stack %zu: its wide ranks", i);
        r = hi[ih++];
        if (r == 255) {
          cr_assert_lt(ib, nbig);
          r = le(big + 4 * ib++, 4);
          cr_assert_geq(r, 255 * 256);
        } else {
          cr_assert_lt(il, nlo);
          r = 256 * r + lo[il++];
        }
      }
      cr_assert_lt(r, len, "stack %zu: rank %zu in a list of %zu", i, r, len);
      uses[start[ctx] + r]++;
      uint64_t f = le(su + wf * (start[ctx] + r), wf);
      if (k == 0) {
        cr_assert_eq(f, root, "stack %zu ends after %zu frames", i, nf);
      } else {
        cr_assert_eq(f, ms_snap_frame_index(s, s->stacks[i].first + k - 1), "stack %zu frame %zu",
                     i, k - 1);
        ctx = (size_t)f;
      }
    }
  }
  cr_assert_eq(ir, nranks);
  cr_assert_eq(ih, nhi);
  cr_assert_eq(il, nlo);
  cr_assert_eq(ib, nbig);
  for (size_t x = 0; x < nsc; x++)
    for (size_t j = start[x]; j < start[x + 1]; j++) {
      cr_assert_gt(uses[j], 0, "context %zu: a successor never used", x);
      if (j > start[x]) cr_assert_leq(uses[j], uses[j - 1], "context %zu: most used first", x);
    }
  free(start);
  free(uses);
}

/* The trace and stack sections hold the device's trace and the snapshot's stacks. */
static void check_trace(bin_t *sb, const ms_snapshot_t *s, size_t dev) {
  size_t c, n = dev < s->ndevices ? s->devices[dev].ntrace : 0;
  const ms_snap_trace_t *t = n ? s->trace + s->devices[dev].first_trace : NULL;
  char nm[64];
#define TN(col) (snprintf(nm, sizeof nm, "d%zu.trace.%s", dev, col), nm)
  const unsigned char *act = section(sb, TN("action"), "u8", &c);
  cr_assert_eq(c, n);
  const unsigned char *addr = section(sb, TN("addr"), "f64", &c);
  const unsigned char *sz = section(sb, TN("size"), "f64", &c);
  const unsigned char *tm = section(sb, TN("time"), "f64", &c);
  const unsigned char *stk = section(sb, TN("stack"), "i32", &c);
#undef TN
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(act[i], (unsigned)t[i].action);
    cr_assert_eq(f64_at(addr, i), (double)t[i].addr);
    cr_assert_eq(f64_at(sz, i), (double)t[i].size);
    cr_assert_eq(f64_at(tm, i), t[i].present & MS_TRACE_HAS_TIME ? (double)t[i].time_us : -1.0);
    cr_assert_eq(i32_at(stk, i), t[i].stack == MS_SNAP_NO_STACK ? -1 : (int64_t)t[i].stack);
  }
  check_stacks(sb, s);
}

/* The page's bytes: declared windows-1252 in its first 1024 bytes; ASCII outside its two binary
 * elements; inside them the bytes the HTML parser leaves alone (unescape_bin). */
static void check_page_bytes(const char *page) {
  const char *cs = strstr(page, "<meta charset=\"windows-1252\">");
  cr_assert(cs && cs - page + 30 <= 1024, "the charset declared in the first 1024 bytes");
  const char *p = page;
  int nbin = 0;
  for (;;) {
    const char *open = strstr(p, "<script type=\"application/octet-stream\"");
    const char *end = open ? open : p + strlen(p);
    for (const char *q = p; q < end; q++)
      cr_assert_lt((unsigned char)*q, 0x80, "byte 0x%02x at %zu, outside the binary data",
                   (unsigned char)*q, (size_t)(q - page));
    if (!open) break;
    open = strchr(open, '>') + 1;
    const char *close = strstr(open, "</script>");
    cr_assert(close);
    unsigned char *tmp = malloc((size_t)(close - open) + 1);
    unescape_bin(open, (size_t)(close - open), tmp, nbin == 0); /* ms-bin, then ms-trace */
    free(tmp);
    nbin++;
    p = close;
  }
  cr_assert_eq(nbin, 2, "two binary elements");
}

/* The checks every page must pass. */
static void check_self_contained(const char *page) {
  cr_assert(strncmp(page, "<!DOCTYPE html>", 15) == 0);
  check_page_bytes(page);
  cr_assert_eq(count(page, "<script"), 5, "the page has exactly its five script elements");
  cr_assert_eq(count(page, "</script>"), 5);
  cr_assert(strstr(page, "Content-Security-Policy\" content=\"default-src 'none'; "
                         "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
                         "worker-src blob:; connect-src 'none'\""));
  /* the page's own code (everything but the data elements) names no address and fetches nothing */
  const char *code_at = strstr(page, "</script>\n<script>\n");
  cr_assert(code_at);
  char *code = strndup(code_at, (size_t)(strstr(code_at + 18, "</script>") - code_at));
  const char *head_end = strstr(page, "<script type=\"application/octet-stream\"");
  char *head = strndup(page, (size_t)(head_end - page));
  const char *bad[] = {"http://", "https://", "fetch(", "XMLHttpRequest", "import(", "WebSocket",
                       "src=", "href=", "url(", "@import", "eval(", "innerHTML"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_assert_null(strstr(head, bad[i]), "the page's head holds '%s'", bad[i]);
    cr_assert_null(strstr(code, bad[i]), "the page's script holds '%s'", bad[i]);
  }
  free(head);
  free(code);
  cr_assert(strstr(page, "</script>\n</body>\n</html>\n"));
}

Test(view, fixtures_data_equal_timeline, .timeout = 300) {
  size_t done = 0;
  for (size_t f = 0; f < NFIX; f++) {
    ms_snapshot_t *s = load_fixture(fixtures[f]);
    if (!s) continue;
    size_t def = 0;
    cr_assert_gt(ms_tl_viewer_devices(s, NULL, 0, &def), 0);
    ms_viewer_opts_t o;
    ms_viewer_opts_init(&o);
    o.title = fixtures[f];
    char *page = page_of(s, &o);
    check_self_contained(page);
    bin_t b = bin_of(page);
    check_tlv(&b, "tl", s, def, false);
    check_tlv(&b, "seg", s, def, true);
    bin_t sb = trace_of(page);
    check_trace(&sb, s, def);
    bin_free(&b);
    bin_free(&sb);
    char *data = element(page, "ms-data");
    char dev[64];
    snprintf(dev, sizeof dev, ",\"device\":%zu,", def);
    cr_assert(strstr(data, dev), "%s: default device %zu", fixtures[f], def);
    free(data);
    free(page);
    ms_snapshot_free(s);
    done++;
  }
  if (done == 0) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
}

/* Every device the viewer lists gives a page whose data is that device's. */
Test(view, every_device) {
  ms_snapshot_t *s = load_fixture("maphsge_select_n_4dev");
  if (!s) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  size_t devs[16];
  size_t n = ms_tl_viewer_devices(s, devs, 16, NULL);
  cr_assert_gt(n, 0);
  for (size_t i = 0; i < n && i < 16; i++) {
    ms_viewer_opts_t o;
    ms_viewer_opts_init(&o);
    o.device = devs[i];
    char *page = page_of(s, &o);
    bin_t b = bin_of(page);
    check_tlv(&b, "tl", s, devs[i], false);
    bin_t sb = trace_of(page);
    check_trace(&sb, s, devs[i]);
    bin_free(&b);
    bin_free(&sb);
    free(page);
  }
  ms_viewer_opts_t o;
  ms_viewer_opts_init(&o);
  o.device = 99;
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_viewer_write_html(s, &o, &sink, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "device 99 has no trace and no segments");
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

/* ---- synthetic snapshots ------------------------------------------------------------------- */

typedef struct tr_s {
  ms_trace_action a;
  uint64_t addr, size;
} tr_t;

static const char hostile_name[] = "</script><img src=x onerror=\"window.pwned=1\">";
static const char hostile_file[] = "\"><svg onload=alert(1)>&amp;\xff\x01'.py";

/* One segment [0x10000, +8192) with an allocated block at 0x10000 (512 bytes) alive at the end;
 * the trace given; every entry's stack is one frame with the hostile names. */
static ms_snapshot_t *build(const tr_t *tr, size_t ntr, bool with_segment) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  uint32_t fr, st;
  cr_assert_eq(ms__snapbuild_frame(&b, hostile_name, strlen(hostile_name), hostile_file,
                                   strlen(hostile_file), 7, &fr), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, &fr, 1, &st), MS_OK);
  if (with_segment) {
    ms_snap_segment_t g;
    memset(&g, 0, sizeof g);
    g.address = 0x10000;
    g.total_size = 8192;
    g.stack = st;
    g.first_block = 0;
    ms_snap_block_t bl;
    memset(&bl, 0, sizeof bl);
    bl.address = 0x10000;
    bl.size = bl.requested_size = 512;
    bl.state = MS_BLOCK_ACTIVE_ALLOCATED;
    bl.state_name = "active_allocated";
    bl.stack = st;
    bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
    cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
    bl.address = 0x10200;
    bl.size = 8192 - 512;
    bl.state = MS_BLOCK_INACTIVE;
    bl.state_name = "inactive";
    bl.stack = MS_SNAP_NO_STACK;
    cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
    g.nblocks = 2;
    cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  }
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  for (size_t i = 0; i < ntr; i++) {
    ms_snap_trace_t t;
    memset(&t, 0, sizeof t);
    t.action = (uint8_t)tr[i].a;
    t.addr = tr[i].addr;
    t.size = tr[i].size;
    t.stack = st;
    t.present = MS_TRACE_HAS_FRAMES;
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  d.ntrace = (uint32_t)ntr;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

static const tr_t small_trace[] = {
    {MS_TRACE_SEGMENT_ALLOC, 0x10000, 8192}, {MS_TRACE_ALLOC, 0x10200, 1024},
    {MS_TRACE_ALLOC, 0x10000, 512},          {MS_TRACE_FREE_REQUESTED, 0x10200, 1024},
    {MS_TRACE_FREE_COMPLETED, 0x10200, 1024},
};

/* Stacks whose ranks need more than a byte (a frame followed by 300 others) and a stack of 300
 * frames (counts as u32) come back whole from the page's stacks sections. */
/* b finished with one device whose trace allocates n blocks of 512 bytes from 0x10000, block k
 * with stack st[k]. */
static ms_snapshot_t *allocs_of(ms__snapbuild_t *b, const uint32_t *st, size_t n) {
  for (size_t k = 0; k < n; k++) {
    ms_snap_trace_t t;
    memset(&t, 0, sizeof t);
    t.action = MS_TRACE_ALLOC;
    t.addr = 0x10000 + 512 * (uint64_t)k;
    t.size = 512;
    t.stack = st[k];
    t.present = MS_TRACE_HAS_FRAMES;
    cr_assert_eq(ms__snapbuild_add_trace(b, &t), MS_OK);
  }
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = (uint32_t)n;
  cr_assert_eq(ms__snapbuild_add_device(b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

/* Ranks of every width (a byte; a high and a low byte; a big one), contexts with one successor
 * (nothing written), a stack of 300 frames, the empty stack, recursion, frame numbers above u16. */
Test(view, stacks_ranks_of_every_width) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  enum { NF = 66000 };
  static uint32_t fr[NF + 1], st[NF + 4];
  for (int i = 0; i <= NF; i++) {
    char name[16];
    snprintf(name, sizeof name, "f%d", i);
    cr_assert_eq(ms__snapbuild_frame(&b, name, strlen(name), "a.py", 4, i, &fr[i]), MS_OK);
  }
  size_t ns = 0;
  /* f0 then fk: f0 has NF successors, f3 and f7 (used twice) first, then the others in order of
   * first use */
  for (int k = 1; k <= NF; k++) {
    uint32_t two[2] = {fr[k], fr[0]}; /* innermost first: f0 is the outermost */
    cr_assert_eq(ms__snapbuild_stack(&b, two, 2, &st[ns++]), MS_OK);
  }
  uint32_t again[3] = {fr[7], fr[7], fr[0]}, rec[4] = {fr[3], fr[3], fr[3], fr[0]};
  cr_assert_eq(ms__snapbuild_stack(&b, again, 3, &st[ns++]), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, rec, 4, &st[ns++]), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, fr + 1, 300, &st[ns++]), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, fr, 0, &st[ns++]), MS_OK);
  ms_snapshot_t *s = allocs_of(&b, st, ns);
  char *page = page_of(s, NULL);
  cr_assert(strstr(page, "\"name\":\"stacks.succ\",\"type\":\"u32\""));
  bin_t bb = bin_of(page), sb = trace_of(page);
  check_trace(&sb, s, 0);
  size_t c;
  section(&sb, "stacks.ranks", "u8", &c);
  cr_assert_gt(c, 0, "from contexts with a few successors (f3: f3, f2, the end)");
  section(&sb, "stacks.ranks_hi", "u8", &c);
  cr_assert_eq(c, NF + 2, "every step after f0");
  section(&sb, "stacks.ranks_big", "u32", &c);
  cr_assert_eq(c, NF - 255 * 256, "the ranks of 65,280 and more after f0");
  section(&sb, "stacks.ranks_lo", "u8", &c);
  cr_assert_eq(c, NF + 2 - (NF - 255 * 256), "the others after f0");
  bin_free(&bb);
  bin_free(&sb);
  free(page);
  ms_snapshot_free(s);
}

/* More contexts with many successors than the rows of viz/view/stacks.c's lookup hold (32 MiB of
 * them: 932 rows of 9,001 frames): the first contexts look their successors up in rows, the
 * later ones in the hash map, and every stack comes back whole, each list most used first. */
Test(view, stacks_past_the_rows_budget) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  enum { NF = 9000, NCTX = 1000, NSUCC = 12 };
  static uint32_t fr[NF], st[NCTX * (NSUCC + 1)];
  for (int i = 0; i < NF; i++) {
    char name[16];
    snprintf(name, sizeof name, "g%d", i);
    cr_assert_eq(ms__snapbuild_frame(&b, name, strlen(name), "b.py", 4, i, &fr[i]), MS_OK);
  }
  size_t ns = 0;
  /* context k (frame k) then NSUCC successors, the last of them twice (once in a stack of three
   * frames): it is ranked first */
  for (int k = 0; k < NCTX; k++)
    for (int j = 0; j <= NSUCC; j++) {
      uint32_t f[3] = {fr[NF - 1], fr[NCTX + (k * 7 + (j < NSUCC ? j : NSUCC - 1) * 13) % (NF - NCTX - 1)],
                       fr[k]};
      cr_assert_eq(ms__snapbuild_stack(&b, j < NSUCC ? f + 1 : f, j < NSUCC ? 2 : 3, &st[ns++]),
                   MS_OK);
    }
  ms_snapshot_t *s = allocs_of(&b, st, ns);
  char *page = page_of(s, NULL);
  bin_t bb = bin_of(page), sb = trace_of(page);
  check_trace(&sb, s, 0);
  size_t c;
  const unsigned char *ns_ = section(&sb, "stacks.succ_count", "u32", &c);
  cr_assert_eq(c, NF + 1);
  const unsigned char *su = section(&sb, "stacks.succ", "u16", &c);
  for (int k = 0, at = 0; k < NCTX; k++) {
    cr_assert_eq(le(ns_ + 4 * k, 4), NSUCC, "context %d", k);
    cr_assert_eq(le(su + 2 * at, 2), fr[NCTX + (k * 7 + (NSUCC - 1) * 13) % (NF - NCTX - 1)],
                 "context %d: the successor used twice first", k);
    at += NSUCC;
  }
  bin_free(&bb);
  bin_free(&sb);
  free(page);
  ms_snapshot_free(s);
}

/* A total above 2^52, which the page could not sum exactly in doubles: max_at_time is in it. */
Test(view, max_at_time_too_large_to_compute) {
  const uint64_t big = (uint64_t)1 << 53;
  const tr_t tr[] = {{MS_TRACE_ALLOC, 0x100000, big},
                     {MS_TRACE_ALLOC, 0x20000000000000, 3},
                     {MS_TRACE_FREE_COMPLETED, 0x100000, big}};
  ms_snapshot_t *s = build(tr, 3, false);
  char *page = page_of(s, NULL);
  bin_t b = bin_of(page);
  ms_tlv_t v;
  cr_assert_eq(ms_tlv_compute(s, 0, false, SIZE_MAX, 0, SIZE_MAX, NULL, &v), MS_OK);
  size_t c;
  const unsigned char *M = section(&b, "d0.tl.max_at_time", "f64", &c);
  cr_assert_eq(c, v.ntimesteps);
  cr_assert_gt(c, 0);
  for (size_t i = 0; i < c; i++) cr_assert_eq(f64_at(M, i), (double)v.max_at_time[i]);
  cr_assert_eq(f64_at(M, 0), (double)big);
  ms_tlv_release(&v);
  bin_free(&b);
  free(page);
  ms_snapshot_free(s);
}

Test(view, hostile_names_stay_data) {
  ms_snapshot_t *s = build(small_trace, 5, true);
  ms_viewer_opts_t o;
  ms_viewer_opts_init(&o);
  o.title = "<b>x</b>\"'&.pickle";
  char *page = page_of(s, &o);
  check_self_contained(page);
  cr_assert_null(strstr(page, "<img"));
  cr_assert_null(strstr(page, "<svg"));
  cr_assert_null(strstr(page, "<b>"));
  cr_assert(strstr(page, "<title>memsnap view: &lt;b&gt;x&lt;/b&gt;&quot;&#39;&amp;.pickle</title>"));
  /* the names are in the data, as JSON escapes the browser's JSON.parse turns back into text */
  cr_assert(strstr(page, "\"\\u003c/script\\u003e\\u003cimg src=x onerror=\\\"window.pwned=1\\\"\\u003e\""));
  cr_assert(strstr(page, "\"\\\"\\u003e\\u003csvg onload=alert(1)\\u003e\\u0026amp;\\ufffd\\u0001\\u0027.py\""));
  free(page);
  ms_snapshot_free(s);
}

/* The escape of the binary data (viz/view/bin.h): every byte value comes back; only the 31 (narrow)
 * or 4 of escaped_byte are escaped, as '=' and the byte plus 64. */
static void escape_every_byte(bool narrow) {
  unsigned char in[256], out[512], back[512];
  for (int i = 0; i < 256; i++) in[i] = (unsigned char)i;
  size_t n = vb_escape(in, 256, out, narrow);
  cr_assert_eq(n, 256 + (narrow ? 31 : 4));
  size_t k = 0;
  for (int i = 0; i < 256; i++) {
    if (escaped_byte((unsigned char)i, narrow)) {
      cr_assert(out[k] == '=' && out[k + 1] == (unsigned char)(i + 64), "byte 0x%02x escaped", i);
      k += 2;
    } else {
      cr_assert_eq(out[k], i, "byte 0x%02x as it is", i);
      k++;
    }
  }
  cr_assert(memcmp(out, "=@", 2) == 0, "NUL");
  cr_assert(memcmp(out + 14, "=M", 2) == 0, "CR");
  cr_assert(memcmp(out + 62, "=|=}", 4) == 0, "'<' and '='");
  if (narrow) cr_assert(memcmp(out + 132, "=\xc0\x81=\xc2", 4) == 0, "0x80 escaped, 0x81 not, 0x82 escaped");
  else cr_assert(memcmp(out + 132, "\x80\x81\x82", 3) == 0, "0x80-0x82 as they are");
  cr_assert_eq(unescape_bin((const char *)out, n, back, narrow), 256);
  cr_assert(memcmp(back, in, 256) == 0);
  cr_assert_eq(vb_escape(in, 0, out, narrow), 0);
  /* through the sink, in pieces of every size, more than its buffer at once */
  size_t big = 100000;
  unsigned char *r = malloc(big), *b2 = malloc(big);
  uint32_t x = 12345;
  size_t specials = 0;
  for (size_t i = 0; i < big; i++) {
    x = x * 1103515245u + 12345u;
    r[i] = (unsigned char)(x >> 16);
    specials += escaped_byte(r[i], narrow);
  }
  th_memsink_t m;
  ms_sink_t sink, esc;
  th_memsink_init(&sink, &m);
  vw_t *w = malloc(sizeof *w);
  vw_init(w, &sink);
  vb_esc_t e = {w, narrow};
  vb_escape_sink(&e, &esc);
  for (size_t at = 0, step = 1; at < big; at += step, step = step * 2 + 1) {
    size_t piece = big - at < step ? big - at : step;
    cr_assert_eq(esc.write(esc.ctx, (const char *)r + at, piece), MS_OK);
  }
  vw_flush(w);
  cr_assert_eq(m.len, big + specials, "one byte more per escaped byte");
  cr_assert_eq(unescape_bin(m.data, m.len, b2, narrow), big);
  cr_assert(memcmp(b2, r, big) == 0);
  th_memsink_free(&m);
  free(w);
  free(r);
  free(b2);
}

/* The spool (viz/view/spool.h): a writer thread's bytes come out of vsp_drain whole and in
 * order, in pieces as they come; a failing output stops the drain with its error. */
typedef struct spool_writer_s {
  vsp_t *s;
  size_t n;
  int rc;             /* the first failed write's */
  const size_t *seen; /* the output's writes so far: halfway, the writer waits for the first */
} spool_writer_t;

static unsigned char spool_byte(size_t i) { return (unsigned char)(i * 131 + (i >> 9)); }

static void *spool_write(void *arg) {
  spool_writer_t *w = arg;
  ms_sink_t sink;
  vsp_sink(w->s, &sink);
  unsigned char buf[70000];
  bool waited = false;
  for (size_t at = 0, step = 1; at < w->n; at += step, step = (step * 7 + 7919) % 69999 + 1) {
    if (!waited && at >= w->n / 2) { /* the drain has written a piece before the rest comes */
      for (int t = 0; t < 5000 && __atomic_load_n(w->seen, __ATOMIC_ACQUIRE) == 0; t++)
        usleep(1000);
      waited = true;
    }
    size_t piece = w->n - at < step ? w->n - at : step;
    for (size_t i = 0; i < piece; i++) buf[i] = spool_byte(at + i);
    int rc = sink.write(sink.ctx, (const char *)buf, piece);
    if (rc != MS_OK && w->rc == MS_OK) w->rc = rc;
  }
  vsp_close(w->s);
  return NULL;
}

typedef struct spool_out_s {
  th_memsink_t m;
  ms_sink_t sink;
  size_t writes, fail_at; /* the write that fails (0: none) */
} spool_out_t;

static int spool_out_write(void *ctx, const char *buf, size_t len) {
  spool_out_t *o = ctx;
  if (__atomic_add_fetch(&o->writes, 1, __ATOMIC_ACQ_REL) == o->fail_at) return MS_EIO;
  return o->sink.write(o->sink.ctx, buf, len);
}

Test(view, spool_drains_a_writer_thread_in_order) {
  for (int fail = 0; fail < 2; fail++) {
    vsp_t s;
    cr_assert_eq(vsp_init(&s), MS_OK);
    /* the first write fails: how the 5 MB are cut into the drain's writes depends on how the
     * two threads are scheduled, but the writer waits halfway for the drain's first write (else,
     * run first to its end, it could leave one write) */
    spool_out_t o = {.fail_at = fail ? 1 : 0};
    spool_writer_t w = {&s, 5000000, MS_OK, &o.writes};
    th_memsink_init(&o.sink, &o.m);
    ms_sink_t out = {spool_out_write, &o};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, spool_write, &w), 0);
    int rc = vsp_drain(&s, &out);
    pthread_join(th, NULL);
    cr_expect_eq(w.rc, MS_OK, "the writer's writes are kept");
    if (fail) {
      cr_expect_eq(rc, MS_EIO);
      cr_expect_eq(o.writes, 1, "the drain stops at the failed write");
    } else {
      cr_expect_eq(rc, MS_OK);
      cr_assert_eq(o.m.len, w.n);
      size_t bad = 0;
      for (size_t i = 0; i < w.n; i++) bad += (unsigned char)o.m.data[i] != spool_byte(i);
      cr_expect_eq(bad, 0, "every byte in its place");
      cr_expect_gt(o.writes, 1, "in pieces (%zu)", o.writes);
      /* drained after the close: nothing more, nothing written */
      cr_expect_eq(vsp_drain(&s, &out), MS_OK);
      cr_expect_eq(o.m.len, w.n);
    }
    th_memsink_free(&o.m);
    vsp_release(&s);
  }
}

Test(view, escape_every_byte_narrow) { escape_every_byte(true); }
Test(view, escape_every_byte_wide) { escape_every_byte(false); }

/* Names that are not ASCII: the page stays ASCII outside its binary data (JSON \u escapes,
 * surrogate pairs above U+FFFF, HTML character references in the title); invalid UTF-8 is U+FFFD
 * (tests/browser/view.sh shows them in Chromium). */
Test(view, non_ascii_names) {
  static const char name[] = "f\xc3\xbc\xf0\x9f\x98\x80\xe2\x82\xac\xff\xc0\xaf\xed\xa0\x80\xf0\x9f";
  static const char file[] = "d\xc3\xa9j\xc3\xa0/\xe4\xb8\xad.py";
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  uint32_t fr, st;
  cr_assert_eq(ms__snapbuild_frame(&b, name, strlen(name), file, strlen(file), 3, &fr), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, &fr, 1, &st), MS_OK);
  ms_snapshot_t *s = allocs_of(&b, &st, 1);
  ms_viewer_opts_t o;
  ms_viewer_opts_init(&o);
  o.title = "\xc3\xbc\xf0\x9f\x98\x80\xff<\x01.pickle";
  char *page = page_of(s, &o);
  check_self_contained(page);
  cr_assert(strstr(page, "[\"d\\u00e9j\\u00e0/\\u4e2d.py\",3,\"f\\u00fc\\ud83d\\ude00\\u20ac"
                         "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\"]"),
            "the frame in ms-data");
  cr_assert(strstr(page, "<title>memsnap view: &#xfc;&#x1f600;&#xfffd;&lt;&#xfffd;.pickle</title>"));
  cr_assert(strstr(page, "\"title\":\"\\u00fc\\ud83d\\ude00\\ufffd\\u003c\\u0001.pickle\""));
  free(page);
  ms_snapshot_free(s);
}

Test(view, errors) {
  /* no device listed: nothing to show */
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK);
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  cr_assert_eq(ms_viewer_write_html(s, NULL, &sink, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "no device has a trace or segments: nothing to show");
  cr_assert_eq(m.len, 0);
  th_memsink_free(&m);
  ms_snapshot_free(s);
  /* a failing sink: its error comes back */
  s = build(small_trace, 5, true);
  char *whole = page_of(s, NULL);
  size_t len = strlen(whole);
  free(whole);
  for (size_t at = 1; at < len; at = at * 3 + 1) {
    th_memsink_init(&sink, &m);
    m.fail_after = at;
    int rc = ms_viewer_write_html(s, NULL, &sink, &eb);
    cr_assert_eq(rc, MS_EIO, "fail after %zu: %s", at, ms_strerror(rc));
    th_memsink_free(&m);
  }
  ms_snapshot_free(s);
}

/* A snapshot with segments and no trace: the page is written; its timeline shows the blocks of
 * the snapshot (ghosts) and the history view shows the map (tests/browser/view.sh). */
Test(view, no_trace) {
  ms_snapshot_t *s = build(NULL, 0, true);
  char *page = page_of(s, NULL);
  check_self_contained(page);
  char *data = element(page, "ms-data");
  cr_assert(strstr(data, "\"ntrace\":0,"));
  cr_assert(strstr(data, "\"segments\":[\n{\"addr\":\"10000\",\"size\":8192,"));
  free(data);
  free(page);
  ms_snapshot_free(s);
}

/* ---- the commands -------------------------------------------------------------------------- */

static char dir[256];
static void setup(void) {
  char *d = th_tmpdir();
  snprintf(dir, sizeof dir, "%s", d);
  free(d);
}
static void teardown(void) { th_rmdir(dir); }

static int run(const char *const *args) {
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) bin = MS_TEST_BINARY_DIR "/bin/memsnap";
  const char *argv[16];
  int n = 0;
  argv[n++] = bin;
  for (; args[n - 1] && n < 15; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    char errp[300];
    snprintf(errp, sizeof errp, "%s/.stderr", dir);
    int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int out = open("/dev/null", O_WRONLY);
    if (err < 0 || out < 0 || chdir(dir) != 0) _exit(126);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}
#define RUN(...) run((const char *const[]){__VA_ARGS__, NULL})

static char *slurp(const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  size_t len = 0;
  char *b = th_read_file(p, &len);
  if (!b) return NULL;
  char *t = strndup(b, len);
  free(b);
  return t;
}

TestSuite(view_cli, .init = setup, .fini = teardown, .timeout = 120);

Test(view_cli, commands_and_filter_freed) {
  ms_snapshot_t *s = build(small_trace, 5, true);
  char path[512];
  snprintf(path, sizeof path, "%s/s.msnap", dir);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  cr_assert_eq(RUN("view", "s.msnap", "-o", "v.html"), 0);
  cr_assert_eq(RUN("trace_plot", "s.msnap"), 0); /* default output.html */
  cr_assert_eq(RUN("trace_plot", "s.msnap", "-f", "-o", "f.html"), 0);
  cr_assert_eq(RUN("trace_plot", "s.msnap", "-s", "-o", "s.html"), 0);
  cr_assert_eq(RUN("segment_plot", "s.msnap", "-o", "h.html"), 0);
  char *v = slurp("v.html"), *out = slurp("output.html"), *f = slurp("f.html"),
       *sg = slurp("s.html"), *h = slurp("h.html");
  cr_assert(v && out && f && sg && h);
  cr_assert(strstr(v, "\"view\":\"timeline\""));
  cr_assert(strstr(out, "\"view\":\"timeline\""));
  cr_assert(strstr(sg, "\"view\":\"segments\""));
  cr_assert(strstr(h, "\"view\":\"history\""));
  /* two allocations drawn; with -f only the one alive at the end (its alloc, the free pair gone) */
  cr_assert(strstr(v, "\"tl\":{\"max_size\":1536,\"elements_length\":2,"));
  cr_assert(strstr(v, "\"ntrace\":5,"));
  cr_assert(strstr(f, "\"tl\":{\"max_size\":512,\"elements_length\":1,"));
  bin_t fb = trace_of(f);
  size_t c;
  const unsigned char *act = section(&fb, "d0.trace.action", "u8", &c);
  cr_assert_eq(c, 2, "the filtered trace: segment_alloc, alloc");
  cr_assert(act[0] == MS_TRACE_SEGMENT_ALLOC && act[1] == MS_TRACE_ALLOC);
  cr_assert_eq(f64_at(section(&fb, "d0.trace.addr", "f64", &c), 1), (double)0x10000);
  bin_free(&fb);
  free(v);
  free(out);
  free(f);
  free(sg);
  free(h);
  /* usage errors and a missing file: exit 2 and 1, no output written */
  char *err = NULL;
  cr_assert_eq(RUN("view"), 2);
  cr_assert_eq(RUN("view", "s.msnap", "--view", "nope"), 2);
  err = slurp(".stderr");
  cr_assert(strstr(err, "unknown view 'nope' (timeline, pools, segments, history, settings, flame, "
                        "explain, memory, diff, files)"),
            "%s", err);
  free(err);
  cr_assert_eq(RUN("view", "s.msnap", "--view", "pools", "-o", "p.html"), 0);
  char *pp = slurp("p.html");
  cr_assert(pp && strstr(pp, "\"view\":\"pools\""));
  free(pp);
  cr_assert_eq(RUN("view", "s.msnap", "--device", "x"), 2);
  cr_assert_eq(RUN("view", "missing.pickle", "-o", "m.html"), 1);
  cr_assert_null(slurp("m.html"));
  cr_assert_eq(RUN("view", "s.msnap", "--device", "3", "-o", "d.html"), 1);
  cr_assert_null(slurp("d.html"));
  err = slurp(".stderr");
  cr_assert_str_eq(err, "memsnap: error: 's.msnap': device 3 has no trace and no segments\n");
  free(err);
  cr_assert_eq(RUN("view", "--help"), 0);
  cr_assert_eq(RUN("trace_plot", "--help"), 0);
  cr_assert_eq(RUN("segment_plot", "--help"), 0);
}
