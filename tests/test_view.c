/* SPDX-License-Identifier: MIT
 * Tests for the offline HTML viewer (memsnap/view.h, `memsnap view`, issue #13): on every
 * PyTorch fixture the page's binary data, decoded here (base64, gunzip, sections), equals
 * ms_tlv_compute's timeline data (which test_timeline compares with PyTorch's own output) and the
 * device's trace and the stacks; the page is self-contained (three script elements, a
 * Content-Security-Policy that forbids every fetch, no network address or fetching call in the
 * page's own code), hostile names in frames and titles stay data, errors are reported, and
 * `trace_plot -f` keeps only what is alive at the end. tests/browser/view.sh runs the pages in
 * Chromium.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
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
} bin_t;

static int unb64(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

static bin_t bin_of(const char *page) {
  const char *open = "<script type=\"application/octet-stream\" id=\"ms-bin\">";
  const char *a = strstr(page, open);
  cr_assert(a, "no ms-bin element");
  a += strlen(open);
  const char *z = strstr(a, "</script>");
  cr_assert(z);
  size_t n = (size_t)(z - a);
  cr_assert_eq(n % 4, 0, "base64 of whole groups");
  unsigned char *gz = malloc(n / 4 * 3 + 1);
  size_t k = 0;
  for (size_t i = 0; i < n; i += 4) {
    int v[4];
    for (int j = 0; j < 4; j++) v[j] = a[i + j] == '=' ? 0 : unb64(a[i + j]);
    cr_assert(v[0] >= 0 && v[1] >= 0 && v[2] >= 0 && v[3] >= 0, "base64 alphabet");
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
    gz[k++] = (unsigned char)(w >> 16);
    if (a[i + 2] != '=') gz[k++] = (unsigned char)(w >> 8);
    if (a[i + 3] != '=') gz[k++] = (unsigned char)w;
  }
  bin_t b = {NULL, 0, element(page, "ms-data")};
  const char *lp = strstr(b.json, "\"bin\":{\"encoding\":\"gzip+base64\",\"length\":");
  cr_assert(lp);
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

static void bin_free(bin_t *b) {
  free(b->data);
  free(b->json);
}

/* The section NAME: its type, count and bytes. */
static const unsigned char *section(const bin_t *b, const char *name, const char *type,
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

/* The page's timeline sections PREFIX.* hold exactly ms_tlv_compute's data (nothing
 * summarized): every series, point, offset, size, max_at_time and source. */
static void check_tlv(const bin_t *b, const char *key, const ms_snapshot_t *s, size_t dev,
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
  const unsigned char *M = SEC("max_at_time", "f64");
  cr_assert_eq(c, v.ntimesteps);
  for (size_t i = 0; i < c; i++) cr_assert_eq(f64_at(M, i), (double)v.max_at_time[i]);
  const unsigned char *src = SEC("sources", "f64");
  cr_assert_eq(c, v.elements_length);
  for (size_t i = 0; i < c; i++) cr_assert_eq(f64_at(src, i), (double)v.element_source[i]);
#undef SEC
  char meta[160];
  snprintf(meta, sizeof meta, "\"%s\":{\"max_size\":%" PRId64 ",\"elements_length\":%zu,"
           "\"nseries\":%zu,\"npoints\":%zu}", key, v.max_size, v.elements_length,
           v.nseries, v.npoints);
  cr_assert(strstr(b->json, meta), "%s", meta);
  ms_tlv_release(&v);
}

/* The trace and stack sections hold the device's trace and the snapshot's stacks. */
static void check_trace(const bin_t *b, const ms_snapshot_t *s, size_t dev) {
  size_t c, n = dev < s->ndevices ? s->devices[dev].ntrace : 0;
  const ms_snap_trace_t *t = n ? s->trace + s->devices[dev].first_trace : NULL;
  char nm[64];
#define TN(col) (snprintf(nm, sizeof nm, "d%zu.trace.%s", dev, col), nm)
  const unsigned char *act = section(b, TN("action"), "u8", &c);
  cr_assert_eq(c, n);
  const unsigned char *addr = section(b, TN("addr"), "f64", &c);
  const unsigned char *sz = section(b, TN("size"), "f64", &c);
  const unsigned char *tm = section(b, TN("time"), "f64", &c);
  const unsigned char *stk = section(b, TN("stack"), "i32", &c);
#undef TN
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(act[i], (unsigned)t[i].action);
    cr_assert_eq(f64_at(addr, i), (double)t[i].addr);
    cr_assert_eq(f64_at(sz, i), (double)t[i].size);
    cr_assert_eq(f64_at(tm, i), t[i].present & MS_TRACE_HAS_TIME ? (double)t[i].time_us : -1.0);
    cr_assert_eq(i32_at(stk, i), t[i].stack == MS_SNAP_NO_STACK ? -1 : (int64_t)t[i].stack);
  }
  const unsigned char *sf = section(b, "stacks.first", "u32", &c);
  cr_assert_eq(c, s->nstacks);
  const unsigned char *sc = section(b, "stacks.count", "u32", &c);
  bool small = s->nframes < 65536;
  const unsigned char *fr = section(b, "stacks.frames", small ? "u16" : "u32", &c);
  cr_assert_eq(c, s->nstack_frames);
  for (size_t i = 0; i < s->nstacks; i++) {
    cr_assert_eq(le(sf + 4 * i, 4), s->stacks[i].first);
    cr_assert_eq(le(sc + 4 * i, 4), s->stacks[i].nframes);
  }
  for (size_t i = 0; i < c; i++)
    cr_assert_eq(small ? le(fr + 2 * i, 2) : le(fr + 4 * i, 4), ms_snap_frame_index(s, i));
}

/* The checks every page must pass. */
static void check_self_contained(const char *page) {
  cr_assert(strncmp(page, "<!DOCTYPE html>", 15) == 0);
  cr_assert_eq(count(page, "<script"), 3, "the page has exactly its three script elements");
  cr_assert_eq(count(page, "</script>"), 3);
  cr_assert(strstr(page, "Content-Security-Policy\" content=\"default-src 'none'; "
                         "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
                         "connect-src 'none'\""));
  /* the page's own code (everything but the data elements) names no address and fetches nothing */
  const char *code = strstr(page, "</script>\n<script>\n");
  cr_assert(code);
  const char *head_end = strstr(page, "<script type=\"application/octet-stream\"");
  char *head = strndup(page, (size_t)(head_end - page));
  const char *bad[] = {"http://", "https://", "fetch(", "XMLHttpRequest", "import(", "WebSocket",
                       "src=", "href=", "url(", "@import", "eval(", "innerHTML"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_assert_null(strstr(head, bad[i]), "the page's head holds '%s'", bad[i]);
    cr_assert_null(strstr(code, bad[i]), "the page's script holds '%s'", bad[i]);
  }
  free(head);
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
    check_trace(&b, s, def);
    bin_free(&b);
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
    check_trace(&b, s, devs[i]);
    bin_free(&b);
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
  bin_t fb = bin_of(f);
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
  cr_assert_eq(RUN("view"), 2);
  cr_assert_eq(RUN("view", "s.msnap", "--view", "nope"), 2);
  cr_assert_eq(RUN("view", "s.msnap", "--device", "x"), 2);
  cr_assert_eq(RUN("view", "missing.pickle", "-o", "m.html"), 1);
  cr_assert_null(slurp("m.html"));
  cr_assert_eq(RUN("view", "s.msnap", "--device", "3", "-o", "d.html"), 1);
  cr_assert_null(slurp("d.html"));
  char *err = slurp(".stderr");
  cr_assert_str_eq(err, "memsnap: error: 's.msnap': device 3 has no trace and no segments\n");
  free(err);
  cr_assert_eq(RUN("view", "--help"), 0);
  cr_assert_eq(RUN("trace_plot", "--help"), 0);
  cr_assert_eq(RUN("segment_plot", "--help"), 0);
}
