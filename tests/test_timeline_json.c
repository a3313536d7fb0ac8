/* SPDX-License-Identifier: MIT
 * `memsnap timeline --json` (docs/timeline.md, "`--json`: the text as JSON"): the content of the
 * text as one JSON document, and `--viewer-data` for PyTorch's viewer's data (which `--json`
 * printed before, still reachable for one release with a warning).
 *  - the exact document of a built snapshot: peaks with their entries, actions, times and the
 *    stacks alive then (a label that needs escaping), an OOM, steps (one without END, an END
 *    without START, a stage of another kind), categories, a range;
 *  - the text and the JSON agree line for line, on the built snapshot and on every PyTorch
 *    fixture, with and without --steps and --by category: each text line is read back and what
 *    it says must be in that device's JSON object; a line no rule reads fails the test, so the
 *    text cannot grow a line the JSON lacks;
 *  - the earlier form: `--json --segments`, `--json --max-entries N` and
 *    MEMSNAP_TIMELINE_JSON=viewer print exactly `--viewer-data`'s bytes, with the warning;
 *  - a failure on a later device leaves no partial document.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/serialize.h"
#include "model/snapbuild.h"

#define MiB ((uint64_t)1 << 20)
#define A ((uint64_t)0x7f0000000000)

static uint32_t stack_of(ms__snapbuild_t *b, const char *name, const char *file, int64_t line) {
  uint32_t fr, st;
  cr_assert_eq(ms__snapbuild_frame(b, name, strlen(name), file, strlen(file), line, &fr), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(b, &fr, 1, &st), MS_OK);
  return st;
}

static void add_trace(ms__snapbuild_t *b, ms_trace_action a, uint64_t addr, uint64_t size,
                      uint32_t stack, int64_t t) {
  ms_snap_trace_t e;
  memset(&e, 0, sizeof e);
  e.action = (uint8_t)a;
  e.addr = addr;
  e.size = size;
  e.stack = stack;
  e.time_us = t;
  e.present = MS_TRACE_HAS_TIME | MS_TRACE_HAS_STREAM | (stack != MS_SNAP_NO_STACK ? MS_TRACE_HAS_FRAMES : 0);
  cr_assert_eq(ms__snapbuild_add_trace(b, &e), MS_OK);
}

static void add_block(ms__snapbuild_t *b, uint64_t addr, uint64_t size, bool alive,
                      uint32_t stack) {
  ms_snap_block_t k;
  memset(&k, 0, sizeof k);
  k.address = addr;
  k.size = size;
  k.requested_size = alive ? size : 0;
  k.state = alive ? MS_BLOCK_ACTIVE_ALLOCATED : MS_BLOCK_INACTIVE;
  k.state_name = alive ? "active_allocated" : "inactive";
  k.stack = stack;
  k.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
  cr_assert_eq(ms__snapbuild_add_block(b, &k), MS_OK);
}

/* One device, one segment of 20 MiB; three steps (ProfilerStep#2 without END), an END without a
 * START, a stage of another kind; an OOM between two steps; a frame whose name needs escaping. */
static ms_snapshot_t *stepped(void) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_ANNOTATIONS;
  uint32_t s1 = stack_of(&b, "weights", "model.py", 12);
  uint32_t s2 = stack_of(&b, "act \"x\"\\y", "train.py", 40);
  add_trace(&b, MS_TRACE_SEGMENT_ALLOC, A, 20 * MiB, MS_SNAP_NO_STACK, 110);
  add_trace(&b, MS_TRACE_ALLOC, A, 10 * MiB, s1, 111);
  add_trace(&b, MS_TRACE_ALLOC, A + 10 * MiB, 4 * MiB, s2, 210);
  add_trace(&b, MS_TRACE_FREE_REQUESTED, A + 10 * MiB, 4 * MiB, s2, 220);
  add_trace(&b, MS_TRACE_FREE_COMPLETED, A + 10 * MiB, 4 * MiB, s2, 221);
  add_trace(&b, MS_TRACE_OOM, 1 * MiB, 64 * MiB, MS_SNAP_NO_STACK, 250);
  add_trace(&b, MS_TRACE_ALLOC, A + 10 * MiB, 2 * MiB, s2, 310);
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = A;
  g.total_size = 20 * MiB;
  g.allocated_size = g.active_size = g.requested_size = 12 * MiB;
  g.is_large = true;
  g.stack = MS_SNAP_NO_STACK;
  g.first_block = (uint32_t)b.blocks.len;
  add_block(&b, A, 10 * MiB, true, s1);
  add_block(&b, A + 10 * MiB, 2 * MiB, true, s2);
  add_block(&b, A + 12 * MiB, 8 * MiB, false, MS_SNAP_NO_STACK);
  g.nblocks = 3;
  cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  static const struct {
    const char *name, *stage;
    int64_t t;
  } an[] = {{"ProfilerStep#0", "START", 100}, {"ProfilerStep#0", "END", 199},
            {"ProfilerStep#1", "START", 200}, {"ProfilerStep#1", "END", 240},
            {"ProfilerStep#2", "START", 300}, {"orphan", "END", 50},
            {"odd", "MIDDLE", 302}};
  for (size_t i = 0; i < sizeof an / sizeof an[0]; i++) {
    ms_snap_annotation_t a = {NULL, NULL, 0, an[i].t};
    cr_assert_eq(ms__snapbuild_str(&b, an[i].name, strlen(an[i].name), &a.name), MS_OK);
    cr_assert_eq(ms__snapbuild_str(&b, an[i].stage, strlen(an[i].stage), &a.stage), MS_OK);
    cr_assert_eq(ms__snapbuild_add_annotation(&b, &a), MS_OK);
  }
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = 7;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

static void write_stepped(void) {
  ms_snapshot_t *s = stepped();
  char why[512];
  cr_assert_eq(th_write_snapshot(s, th_workdir, "s.msgpack", why, sizeof why), 0, "%s", why);
  ms_snapshot_free(s);
}

TestSuite(timeline_json, .init = th_workdir_setup, .fini = th_workdir_teardown, .timeout = 300);

Test(timeline_json, exact_document) {
  write_stepped();
  th_run_t r = TH_RUN("timeline", "s.msgpack", "--json", "--steps");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_expect_str_empty(r.err);
  cr_expect_str_eq(
      r.out,
      "{\"command\": \"timeline\", \"file\": \"s.msgpack\", \"devices\": [\n"
      " {\"device\": 0, \"entries\": 7, \"range\": null, \"first_time_us\": 110, "
      "\"last_time_us\": 310, \"duration_us\": 200,\n"
      "  \"peaks\": {\"allocated\": {\"bytes\": 14680064, \"entry\": 2, \"action\": \"alloc\", "
      "\"time_us\": 210, \"top_stacks\": [\n"
      "    {\"bytes\": 10485760, \"blocks\": 1, \"label\": \"model.py:12:weights\"},\n"
      "    {\"bytes\": 4194304, \"blocks\": 1, \"label\": \"train.py:40:act \\\"x\\\"\\\\y\"}]},\n"
      "  \"reserved\": {\"bytes\": 20971520, \"entry\": 0, \"action\": \"segment_alloc\", "
      "\"time_us\": 110, \"top_stacks\": []}},\n"
      "  \"ooms\": [\n"
      "    {\"oom\": 1, \"entry\": 5, \"time_us\": 250, \"request\": 67108864, \"stream\": 0, "
      "\"device_free\": 1048576, \"reserved\": 20971520}],\n"
      "  \"steps\": {\"steps\": [\n"
      "    {\"step\": 0, \"first_entry\": 0, \"last_entry\": 1, \"peak_allocated\": {\"bytes\": "
      "10485760, \"entry\": 1}, \"peak_reserved\": {\"bytes\": 20971520, \"entry\": 0}, "
      "\"has_end\": true},\n"
      "    {\"step\": 1, \"first_entry\": 2, \"last_entry\": 4, \"peak_allocated\": {\"bytes\": "
      "14680064, \"entry\": 2}, \"peak_reserved\": {\"bytes\": 20971520, \"entry\": 2}, "
      "\"has_end\": true},\n"
      "    {\"step\": 2, \"first_entry\": 6, \"last_entry\": 6, \"peak_allocated\": {\"bytes\": "
      "12582912, \"entry\": 6}, \"peak_reserved\": {\"bytes\": 20971520, \"entry\": 6}, "
      "\"has_end\": false}], \"peak_step\": 1, \"unmatched_ends\": 1, \"other_stages\": 1, "
      "\"error\": null},\n"
      "  \"state\": {\"at\": \"end\", \"allocated\": 12582912, \"active\": 12582912, "
      "\"requested\": 12582912, \"reserved\": 20971520}, \"before\": {\"allocated\": 0, "
      "\"reserved\": 0}}\n"
      "]}\n");
  th_run_free(&r);
}

/* ---- the text and the JSON agree line for line ------------------------------------------------ */

/* s as a JSON string's content, as cli_json_str writes it; stops before a byte >= 0x80 (where
 * the JSON may have replaced it). */
static void json_escape(const char *s, char *out, size_t cap) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p && *p < 0x80 && n + 8 < cap; p++) {
    if (*p == '"' || *p == '\\') n += (size_t)snprintf(out + n, cap - n, "\\%c", *p);
    else if (*p < 0x20) n += (size_t)snprintf(out + n, cap - n, "\\u%04x", *p);
    else out[n++] = (char)*p;
  }
  out[n] = 0;
}

/* Where the JSON is read: the current device's object [dev, end) and a cursor in it that every
 * fragment found moves forward (so the order agrees too). */
typedef struct agree_s {
  const char *doc, *dev, *end, *at;
  const char *line; /* the text line being read */
  char metric[16];  /* a "peak M:" line waiting for its moment line */
  uint64_t peak_bytes;
  char mode; /* the block of indented lines being read: 'S' stacks, 'C' categories, 'T' steps,
              * 'F' the state; 0 none */
  int ndevices;
} agree_t;

/* Finds frag at or after the cursor within the device; moves the cursor past it. */
static const char *want(agree_t *g, const char *frag) {
  cr_assert(g->dev, "line '%s' before any device line", g->line);
  const char *p = strstr(g->at, frag);
  cr_assert(p && p < g->end, "text line '%s': no '%s' in its place in the JSON:\n%.*s", g->line,
            frag, (int)(g->end - g->dev), g->dev);
  g->at = p + strlen(frag);
  return p;
}

/* " (t=T)" at the end of a moment, as a JSON value: "T" or "null". */
static void moment_time(const char *line, char *out, size_t cap) {
  const char *t = strstr(line, "(t=");
  long long v;
  if (t && sscanf(t, "(t=%lld)", &v) == 1) snprintf(out, cap, "%lld", v);
  else snprintf(out, cap, "null");
}

static void agree_device(agree_t *g, size_t dev, size_t n, bool range, size_t a, size_t b) {
  char frag[128];
  snprintf(frag, sizeof frag, "{\"device\": %zu, \"entries\": %zu, \"range\": ", dev, n);
  const char *p = strstr(g->doc, frag);
  cr_assert(p, "text line '%s': no device object %s", g->line, frag);
  g->dev = g->at = p;
  const char *next = strstr(p + 1, "\n {\"device\": ");
  g->end = next ? next : p + strlen(p);
  g->ndevices++;
  if (range) snprintf(frag, sizeof frag, "\"range\": {\"first\": %zu, \"last\": %zu}", a, b);
  else snprintf(frag, sizeof frag, "\"range\": null");
  want(g, frag);
}

/* The lines of a device's head, peaks and stacks. @return true when the line was one of them. */
static bool agree_peaks(agree_t *g, const char *l) {
  char frag[1400], s[1024], t[32];
  size_t dev, n, a, b;
  unsigned long long u, blocks;
  if (l[0] == ' ' && l[1] == ' ' && l[2] != ' ') g->mode = 0; /* a line of the device's own */
  long long e;
  double secs;
  if (sscanf(l, "device %zu: %zu trace entries, showing entries %zu to %zu", &dev, &n, &a, &b) ==
      4)
    agree_device(g, dev, n, true, a, b);
  else if (sscanf(l, "device %zu: %zu trace entries", &dev, &n) == 2)
    agree_device(g, dev, n, false, 0, 0);
  else if (!strncmp(l, "  first entry: ", 15) || !strncmp(l, "  last entry:  ", 15)) {
    moment_time(l, t, sizeof t);
    snprintf(frag, sizeof frag, "\"%s_time_us\": %s", l[2] == 'f' ? "first" : "last", t);
    want(g, frag);
  } else if (sscanf(l, "  duration: %lf s", &secs) == 1) {
    const char *p = want(g, "\"duration_us\": ");
    long long us = strtoll(p + 15, NULL, 10);
    cr_expect(us / 1e6 - secs < 1e-6 && secs - us / 1e6 < 1e-6, "'%s' vs %lld us", l, us);
  } else if (!strcmp(l, "  (the entries have no timestamps)")) {
    want(g, "\"first_time_us\": null");
  } else if (sscanf(l, "  peak %15[a-z]: %*s (%llu bytes)", g->metric, &u) == 2) {
    g->peak_bytes = u;
  } else if (g->metric[0] && sscanf(l, "    after entry %lld (%1000[^)])", &e, s) == 2) {
    moment_time(l, t, sizeof t);
    snprintf(frag, sizeof frag, "\"%s\": {\"bytes\": %" PRIu64 ", \"entry\": %lld, "
             "\"action\": \"%s\", \"time_us\": %s, \"top_stacks\": [", g->metric, g->peak_bytes,
             e, s, t);
    want(g, frag);
    g->metric[0] = 0;
  } else if (g->metric[0] && !strcmp(l, "    before entry 0")) {
    snprintf(frag, sizeof frag, "\"%s\": {\"bytes\": %" PRIu64 ", \"entry\": -1, \"action\": "
             "null, \"time_us\": null, \"top_stacks\": [", g->metric, g->peak_bytes);
    want(g, frag);
    g->metric[0] = 0;
  } else if (!strcmp(l, "    top stacks alive then (allocated bytes, blocks, innermost frame):")) {
    g->mode = 'S'; /* the list opened with the peak */
  } else if (g->mode == 'S' && !strcmp(l, "      (no allocated block)")) {
    cr_expect(g->at[0] == ']', "'%s': the JSON's top_stacks is not empty", l);
  } else if (g->mode == 'S' && !strncmp(l, "      ", 6)) {
    int off = 0;
    cr_assert(sscanf(l, " %*s %llu%n", &blocks, &off) == 1 && !strncmp(l + off, "  ", 2),
              "stack line '%s'", l);
    json_escape(l + off + 2, s, sizeof s);
    snprintf(frag, sizeof frag, "\"blocks\": %llu, \"label\": \"%s", blocks, s);
    want(g, frag);
  } else {
    return false;
  }
  return true;
}

/* The lines of the categories, the OOMs and the steps. @return true when the line was one. */
static bool agree_events(agree_t *g, const char *l) {
  char frag[1400], s[1024], t[32], ent[64];
  unsigned long long k, st, lo, hi, u, o;
  long long e, step;
  static const char bycat[] = "  by category (allocated bytes): at the peak of allocated";
  if (!strncmp(l, bycat, sizeof bycat - 1)) {
    want(g, "\"categories\": [");
    g->mode = 'C';
  } else if (g->mode == 'C' && sscanf(l, "    %1000s", s) == 1) {
    snprintf(frag, sizeof frag, "{\"category\": \"%s\", \"peak_bytes\": ", s);
    want(g, frag);
    const char *pe = strstr(l, " after entry ");
    if (pe && sscanf(pe, " after entry %lld", &e) == 1) snprintf(frag, sizeof frag, "\"peak_entry\": %lld, ", e);
    else snprintf(frag, sizeof frag, "\"peak_entry\": null, ");
    cr_expect(strstr(l, "never held") || pe, "category line '%s'", l);
    want(g, frag);
  } else if (sscanf(l, "  out of memory (--at oom:%llu): %*s requested on stream %llu, after entry "
                       "%lld",
                    &k, &st, &e) == 3) {
    moment_time(l, t, sizeof t);
    snprintf(frag, sizeof frag, "{\"oom\": %llu, \"entry\": %lld, \"time_us\": %s, \"request\": ",
             k, e, t);
    want(g, frag);
    snprintf(frag, sizeof frag, "\"stream\": %llu, \"device_free\": ", st);
    want(g, frag);
    if (strstr(l, "no device_free")) want(g, "null");
  } else if (sscanf(l,
                    "  out of memory %llu times (the first 5 and the last 5 below; --json lists "
                    "every one%1[)]",
                    &k, s) == 2) {
    cr_expect_gt(k, 10, "'%s': the text leaves out OOMs only past 10", l);
  } else if (sscanf(l, "  ... %llu more (--at oom:%llu to oom:%llu)", &u, &lo, &hi) == 3) {
    cr_expect_eq(u, hi - lo + 1, "'%s'", l);
    snprintf(frag, sizeof frag, "{\"oom\": %llu, ", lo); /* the JSON holds those left out */
    want(g, frag);
    snprintf(frag, sizeof frag, "{\"oom\": %llu, ", hi);
    if (hi != lo) want(g, frag);
  } else if (strstr(l, " free on the device, ") && strstr(l, " reserved by the allocator then")) {
    cr_expect(strncmp(g->at, "null", 4) != 0, "'%s': the JSON has no device_free", l);
  } else if (!strcmp(l, "    the entry does not say how much the device had free (no "
                        "device_free)")) {
    cr_expect(strncmp(g->at, "null", 4) == 0, "'%s': the JSON has a device_free", l);
  } else if (!strcmp(l, "    (memsnap explain says why, and which setting would have avoided "
                        "it)")) {
    /* a pointer to another command, printed after the OOMs */
  } else if (!strcmp(l, "  steps (ProfilerStep#N annotations):")) {
    want(g, "\"steps\": {\"steps\": [");
    g->mode = 'T';
  } else if (g->mode == 'T' && strstr(l, "step  entries")) {
    /* the table's head */
  } else if (g->mode == 'T' && sscanf(l, "    %lld  %63s", &step, ent) == 2 &&
             strncmp(l, "    the ", 8) != 0 && strncmp(l, "    (", 5) != 0) {
    if (sscanf(ent, "%llu-%llu", &lo, &hi) == 2)
      snprintf(frag, sizeof frag, "{\"step\": %lld, \"first_entry\": %llu, \"last_entry\": %llu, "
               "\"peak_allocated\": ", step, lo, hi);
    else
      snprintf(frag, sizeof frag, "{\"step\": %lld, \"first_entry\": null, \"last_entry\": null, "
               "\"peak_allocated\": ", step);
    want(g, frag);
    if (sscanf(l, "    %*d  %*s %*s %lld", &e) == 1) {
      snprintf(frag, sizeof frag, "\"entry\": %lld}", e);
      want(g, frag);
    } else {
      want(g, "null, \"peak_reserved\": null");
    }
    want(g, strstr(l, "(no END: runs to the end of the trace)") ? "\"has_end\": false}"
                                                                 : "\"has_end\": true}");
  } else if (sscanf(l, "    the peak of allocated memory is in step %lld", &step) == 1) {
    snprintf(frag, sizeof frag, "\"peak_step\": %lld, ", step);
    want(g, frag);
  } else if (!strcmp(l, "    the peak of allocated memory is outside every step")) {
    want(g, "\"peak_step\": null, ");
  } else if (!strncmp(l, "  steps: none (no ProfilerStep#N annotation", 43)) {
    want(g, "\"steps\": {\"steps\": [], \"peak_step\": null, ");
  } else if (sscanf(l, "    (%llu END annotation", &u) == 1 && strstr(l, " without a START, ") &&
             sscanf(strstr(l, " without a START, "), " without a START, %llu of another", &o) ==
                 1) {
    snprintf(frag, sizeof frag, "\"unmatched_ends\": %llu, \"other_stages\": %llu", u, o);
    want(g, frag);
  } else if (!strncmp(l, "  steps: ", 9)) {
    json_escape(l + 9, s, sizeof s);
    snprintf(frag, sizeof frag, "\"error\": \"%s", s);
    want(g, frag);
  } else {
    return false;
  }
  return true;
}

/* The state at the end and before the first entry. @return true when the line was one. */
static bool agree_state(agree_t *g, const char *l) {
  char frag[256], name[16];
  unsigned long long a, r;
  if (!strcmp(l, "  final state (the snapshot):")) {
    want(g, "\"state\": {\"at\": \"end\"");
    g->mode = 'F';
  } else if (!strcmp(l, "  state at the end of the range:")) {
    want(g, "\"state\": {\"at\": \"range_end\"");
    g->mode = 'F';
  } else if (g->mode == 'F' && sscanf(l, "    %15s %*s (%llu bytes)", name, &a) == 2) {
    snprintf(frag, sizeof frag, "\"%s\": %llu", name, a);
    want(g, frag);
  } else if (sscanf(l, "  before the first entry shown: allocated %*s (%llu bytes), reserved %*s "
                       "(%llu bytes)",
                    &a, &r) == 2) {
    snprintf(frag, sizeof frag, "\"before\": {\"allocated\": %llu, \"reserved\": %llu}", a, r);
    want(g, frag);
  } else {
    return false;
  }
  return true;
}

/* `timeline FILE ARGS` and `timeline FILE ARGS --json`: the same exit status; on success every
 * text line is found in the JSON, in order, and the JSON has no device the text lacks. */
static void expect_agree(const char *file, const char *const *args) {
  const char *t[16] = {"timeline", file}, *j[16] = {"timeline", file};
  size_t n = 2;
  for (; args[n - 2]; n++) t[n] = j[n] = args[n - 2];
  j[n] = "--json";
  th_run_t text = th_run(th_workdir, NULL, NULL, t);
  th_run_t json = th_run(th_workdir, NULL, NULL, j);
  cr_assert_eq(json.status, text.status, "%s: text %d, json %d: %s", file, text.status,
               json.status, json.err);
  if (text.status != 0) {
    cr_expect_str_empty(json.out, "%s: a failed --json printed", file);
    cr_expect_str_eq(json.err, text.err);
  } else {
    agree_t g = {json.out, NULL, NULL, NULL, NULL, "", 0, 0, 0};
    for (char *l = text.out; *l;) {
      char *nl = strchr(l, '\n');
      cr_assert(nl, "%s: the text's last line has no newline", file);
      *nl = 0;
      g.line = l;
      cr_assert(agree_peaks(&g, l) || agree_events(&g, l) || agree_state(&g, l),
                "%s: no rule reads the text line '%s' (the JSON must say it too)", file, l);
      l = nl + 1;
    }
    size_t objects = 0;
    for (const char *p = json.out; (p = strstr(p, "{\"device\": ")); p++) objects++;
    cr_expect_eq(objects, (size_t)g.ndevices, "%s: %zu devices in the JSON, %d in the text",
                 file, objects, g.ndevices);
  }
  th_run_free(&text);
  th_run_free(&json);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__ __VA_OPT__(, ) NULL})

Test(timeline_json, agrees_with_the_text_built) {
  write_stepped();
  expect_agree("s.msgpack", ARGS());
  expect_agree("s.msgpack", ARGS("--steps"));
  expect_agree("s.msgpack", ARGS("--steps", "--by", "category"));
  expect_agree("s.msgpack", ARGS("--steps", "--range", "2:5"));
  expect_agree("s.msgpack", ARGS("--range", "step=1", "--steps"));
  expect_agree("s.msgpack", ARGS("--range", "9:12")); /* an error: the same on both */
}

/* One segment of 20 MiB, then n OOMs of 1 to n MiB, each after an allocation of 1 MiB freed
 * again (two entries apart). */
static void write_oomy(const char *name, int n) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  add_trace(&b, MS_TRACE_SEGMENT_ALLOC, A, 20 * MiB, MS_SNAP_NO_STACK, 100);
  for (int i = 1; i <= n; i++) {
    add_trace(&b, MS_TRACE_ALLOC, A, MiB, MS_SNAP_NO_STACK, 100 + 4 * i);
    add_trace(&b, MS_TRACE_OOM, MiB, (uint64_t)i * MiB, MS_SNAP_NO_STACK, 101 + 4 * i);
    add_trace(&b, MS_TRACE_FREE_REQUESTED, A, MiB, MS_SNAP_NO_STACK, 102 + 4 * i);
    add_trace(&b, MS_TRACE_FREE_COMPLETED, A, MiB, MS_SNAP_NO_STACK, 103 + 4 * i);
  }
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = A;
  g.total_size = 20 * MiB;
  g.is_large = true;
  g.stack = MS_SNAP_NO_STACK;
  g.first_block = (uint32_t)b.blocks.len;
  add_block(&b, A, 20 * MiB, false, MS_SNAP_NO_STACK);
  g.nblocks = 1;
  cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = (uint32_t)(1 + 4 * n);
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  char why[512];
  cr_assert_eq(th_write_snapshot(s, th_workdir, name, why, sizeof why), 0, "%s", why);
  ms_snapshot_free(s);
}

/* The `oom:N` numbers of the text's OOM lines, in order, and its two summary lines (or ""). */
static size_t text_ooms(const char *out, unsigned *n, size_t cap, char *head, char *more) {
  size_t k = 0;
  head[0] = more[0] = 0;
  for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    unsigned v;
    if (sscanf(l, "  out of memory (--at oom:%u)", &v) == 1 && k < cap) n[k++] = v;
    if (!strncmp(l, "  out of memory ", 16) && strstr(l, " times ")) sscanf(l, "%199[^\n]", head);
    if (!strncmp(l, "  ... ", 6)) sscanf(l, "%199[^\n]", more);
  }
  return k;
}

Test(timeline_json, many_ooms_the_first_and_the_last) {
  /* up to 10 OOMs the text shows each; past 10 the first and the last 5, and how many it left
   * out, which --json lists */
  static const struct {
    int n;
    const char *range;
    size_t shown;         /* OOM lines */
    unsigned first, last; /* the first and the last oom:N shown */
    const char *head, *more;
  } cases[] = {
      {10, NULL, 10, 1, 10, "", ""},
      {11, NULL, 10, 1, 11,
       "  out of memory 11 times (the first 5 and the last 5 below; --json lists every one)",
       "  ... 1 more (--at oom:6 to oom:6)"},
      {14, NULL, 10, 1, 14,
       "  out of memory 14 times (the first 5 and the last 5 below; --json lists every one)",
       "  ... 4 more (--at oom:6 to oom:9)"},
      {14, "9:57", 10, 3, 14, /* oom:3 (entry 10) to oom:14 (entry 54) */
       "  out of memory 12 times (the first 5 and the last 5 below; --json lists every one)",
       "  ... 2 more (--at oom:8 to oom:9)"},
      {14, "9:45", 9, 3, 11, "", ""}, /* oom:3 to oom:11 (entry 42) */
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    char name[32];
    snprintf(name, sizeof name, "o%d.msgpack", cases[c].n);
    write_oomy(name, cases[c].n);
    const char *argv[] = {"timeline", name, cases[c].range ? "--range" : NULL, cases[c].range,
                          NULL};
    th_run_t r = th_run(th_workdir, NULL, NULL, argv);
    cr_assert_eq(r.status, 0, "case %zu: %s", c, r.err);
    unsigned n[32];
    char head[200], more[200];
    size_t k = text_ooms(r.out, n, 32, head, more);
    cr_assert_eq(k, cases[c].shown, "case %zu: %zu OOM lines\n%s", c, k, r.out);
    cr_expect_str_eq(head, cases[c].head, "case %zu", c);
    cr_expect_str_eq(more, cases[c].more, "case %zu", c);
    for (size_t i = 0; i < k; i++) /* in order: the first ones, then the last ones */
      cr_expect_eq(n[i], i < 5 || !head[0] ? cases[c].first + i : cases[c].last - (k - 1 - i),
                   "case %zu, line %zu", c, i);
    cr_expect_eq(n[k - 1], cases[c].last, "case %zu", c);
    th_run_free(&r);
    if (cases[c].range)
      expect_agree(name, ARGS("--range", cases[c].range));
    else
      expect_agree(name, ARGS());
  }
}

Test(timeline_json, agrees_with_the_text_fixtures) {
  static const char *const names[] = {
      "a0kuma_adamw_small",         "cranberrii_ftcourse",
      "jogregoire_diffusion_tiny",  "maphsge_select_n_4dev",
      "wedsonlin_cs336_medium_1024_training", "yiyi_flexgen_1.3b_legacy_a",
      "yiyi_flexgen_oom_legacy"};
  size_t found = 0;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), names[i]);
    if (access(path, R_OK) != 0) continue;
    found++;
    expect_agree(path, ARGS("--steps", "--by", "category"));
    expect_agree(path, ARGS("--range", "0:20"));
  }
  if (!found) {
    printf("SKIP: PyTorch fixtures not found in %s\n", th_fixture_dir());
    cr_skip_test("no fixtures");
  }
}

/* ---- the viewer's data, and the earlier form of --json ------------------------------------- */

Test(timeline_json, earlier_form_prints_the_viewer_data_with_a_warning) {
  write_stepped();
  th_run_t v = TH_RUN("timeline", "s.msgpack", "--viewer-data");
  cr_assert_eq(v.status, 0, "%s", v.err);
  cr_expect_str_empty(v.err);
  cr_expect(strstr(v.out, "\"allocations_over_time\": ["), "%s", v.out);
  th_run_t vs = TH_RUN("timeline", "s.msgpack", "--viewer-data", "--segments");
  th_run_t vm = TH_RUN("timeline", "s.msgpack", "--viewer-data", "--max-entries", "1");
  cr_assert_eq(vs.status, 0, "%s", vs.err);
  cr_assert_eq(vm.status, 0, "%s", vm.err);
  static const char warn[] =
      "memsnap: warning: '--json' with '--segments' or '--max-entries' prints the viewer's data "
      "as before, in this release only: use '--viewer-data' (docs/timeline.md)\n";
  th_run_t r = TH_RUN("timeline", "s.msgpack", "--json", "--segments");
  cr_expect_eq(r.status, 0);
  cr_expect_str_eq(r.out, vs.out);
  cr_expect_str_eq(r.err, warn);
  th_run_free(&r);
  r = TH_RUN("timeline", "s.msgpack", "--max-entries", "1", "--json");
  cr_expect_eq(r.status, 0);
  cr_expect_str_eq(r.out, vm.out);
  cr_expect_str_eq(r.err, warn);
  th_run_free(&r);
  /* a script that cannot change its command line: the environment */
  static const char *const env[] = {"MEMSNAP_TIMELINE_JSON=viewer", NULL};
  r = th_run(th_workdir, NULL, env, ARGS("timeline", "s.msgpack", "--json"));
  cr_expect_eq(r.status, 0);
  cr_expect_str_eq(r.out, v.out);
  cr_expect_str_eq(r.err, "memsnap: warning: MEMSNAP_TIMELINE_JSON=viewer: '--json' prints the "
                          "viewer's data as before, in this release only: use '--viewer-data' "
                          "(docs/timeline.md)\n");
  th_run_free(&r);
  /* the variable changes nothing else: the text, and --viewer-data, stay as they are */
  r = th_run(th_workdir, NULL, env, ARGS("timeline", "s.msgpack", "--viewer-data"));
  cr_expect_str_eq(r.out, v.out);
  cr_expect_str_empty(r.err);
  th_run_free(&r);
  th_run_free(&v);
  th_run_free(&vs);
  th_run_free(&vm);
}

Test(timeline_json, usage_errors) {
  write_stepped();
  static const struct {
    const char *args[8];
    const char *err;
  } cases[] = {
      {{"timeline", "s.msgpack", "--segments", NULL},
       "options '--segments' and '--max-entries' need '--viewer-data'"},
      {{"timeline", "s.msgpack", "--json", "--viewer-data", NULL},
       "options '--json' and '--viewer-data' exclude each other"},
      {{"timeline", "s.msgpack", "--viewer-data", "--steps", NULL},
       "option '--steps' does not apply to '--viewer-data'"},
      {{"timeline", "s.msgpack", "--viewer-data", "--stream", "0", NULL},
       "options '--stream' and '--pool' do not apply to '--viewer-data' (the viewer's data "
       "covers the whole device)"},
      {{"timeline", "s.msgpack", "--json", "--by", "category", "--segments", NULL},
       "option '--by category' counts every segment and is not the viewer's data: no "
       "--viewer-data, --segments, --max-entries, --stream, --pool"},
      {{"timeline", "s.msgpack", "s.msgpack", "--viewer-data", NULL},
       "with several FILEs only --json, --jobs and --keep-going apply"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    th_run_t r = th_run(th_workdir, NULL, NULL, cases[i].args);
    cr_expect_eq(r.status, 2, "case %zu: %d", i, r.status);
    cr_expect_str_empty(r.out);
    char want[600];
    snprintf(want, sizeof want, "memsnap: error: %s\nRun 'memsnap timeline --help' for usage.\n",
             cases[i].err);
    cr_expect_str_eq(r.err, want, "case %zu", i);
    th_run_free(&r);
  }
}

/* An error found after every device was read (a filter that matches nothing) leaves no partial
 * document on standard output. */
Test(timeline_json, failure_prints_no_partial_document) {
  write_stepped();
  th_run_t r = TH_RUN("timeline", "s.msgpack", "--json", "--stream", "7");
  cr_expect_eq(r.status, 1);
  cr_expect_str_empty(r.out);
  cr_expect_str_eq(r.err, "memsnap: error: 's.msgpack': no segment matches the filter "
                          "(--stream/--pool) at any moment\n");
  th_run_free(&r);
}
