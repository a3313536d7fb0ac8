/* SPDX-License-Identifier: MIT
 * memsnap tests: `memsnap explain` (memsnap/explain.h, docs/explain.md, issue #26).
 *
 * Each OOM case is recorded by memsnap's allocator on the simulated device (or built entry by
 * entry where no allocator would leave that state), written in both formats (memsnap's msgpack,
 * which records the device's size, and PyTorch's pickle, which does not: the capacity is then
 * inferred from the `oom` entry), read back, and explained. The expected figures are the case's
 * own arithmetic, written here, not recomputed by the code under test; every remedy's claim is
 * replayed again: no OOM at its smallest capacity, an OOM 2 MiB below, and at the capacity an OOM
 * exactly when it says it does not avoid one.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"
#include "memsnap/allocator.h"
#include "memsnap/attribution.h"
#include "memsnap/backend.h"
#include "memsnap/config.h"
#include "memsnap/explain.h"
#include "memsnap/history.h"
#include "memsnap/pickle.h"
#include "memsnap/replay.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"

#define MiB (1024ull * 1024ull)

/* ---- recording on the simulated device ------------------------------------------------------ */

typedef th_rec_t rec_t;

static void rec_open(rec_t *r, size_t capacity) {
  cr_assert_eq(th_rec_open(r, capacity, MS_CONTEXT_ALL, 0), MS_OK);
}

static ms_snapshot_t *rec_close(rec_t *r) {
  ms_snapshot_t *s = th_rec_close(r);
  cr_assert(s != NULL);
  return s;
}

static ms_devptr_t rec_malloc(rec_t *r, size_t size) {
  ms_devptr_t p = 0;
  cr_assert_eq(ms_allocator_malloc(r->al, size, 0, &p), MS_OK, "malloc %zu", size);
  return p;
}

static void rec_oom(rec_t *r, size_t size) {
  ms_devptr_t p = 0;
  cr_assert_eq(ms_allocator_malloc(r->al, size, 0, &p), MS_EOOM, "malloc %zu must fail", size);
}

/* ---- the cases ----------------------------------------------------------------------------- */

typedef struct expect_s {
  const char *name;
  ms_explain_verdict verdict;
  uint64_t capacity, device_free, request;
  uint64_t reserved, allocated, cached_free, largest_free, inactive_split, releasable, priv;
  bool replayable;
} expect_t;

/* Full: 150 MiB live on a 200 MiB device, then 100 MiB more. */
static ms_snapshot_t *case_full(expect_t *e) {
  rec_t r;
  rec_open(&r, 200 * MiB);
  (void)rec_malloc(&r, 150 * MiB);
  rec_oom(&r, 100 * MiB);
  *e = (expect_t){"full", MS_EXPLAIN_FULL, 200 * MiB, 50 * MiB, 100 * MiB,
                  150 * MiB, 150 * MiB, 0, 0, 0, 0, 0, true};
  return rec_close(&r);
}

/* Fragmentation: a cached 100 MiB segment split by 40 + 20 MiB tensors leaves 40 MiB free in it
 * and 20 MiB on the 120 MiB device: 60 MiB lie free, but no 50 MiB block. */
static ms_snapshot_t *case_fragmented(expect_t *e) {
  rec_t r;
  rec_open(&r, 120 * MiB);
  ms_devptr_t a = rec_malloc(&r, 100 * MiB);
  cr_assert_eq(ms_allocator_free(r.al, a), MS_OK);
  (void)rec_malloc(&r, 40 * MiB);
  (void)rec_malloc(&r, 20 * MiB);
  rec_oom(&r, 50 * MiB);
  *e = (expect_t){"fragmentation", MS_EXPLAIN_FRAGMENTATION, 120 * MiB, 20 * MiB, 50 * MiB,
                  100 * MiB, 60 * MiB, 40 * MiB, 40 * MiB, 40 * MiB, 0, 0, true};
  return rec_close(&r);
}

/* Private pool: a private pool (a CUDA graph's) keeps 60 MiB cached, 50 MiB are live in the
 * default pool of a 150 MiB device, and 70 MiB more are asked for. */
static ms_snapshot_t *case_private(expect_t *e) {
  rec_t r;
  rec_open(&r, 150 * MiB);
  ms_pool_id_t id = ms_pool_id_new(true);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(r.al, id, NULL, NULL), MS_OK);
  ms_devptr_t p = rec_malloc(&r, 60 * MiB);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(r.al, id), MS_OK);
  cr_assert_eq(ms_allocator_free(r.al, p), MS_OK);
  (void)rec_malloc(&r, 50 * MiB);
  rec_oom(&r, 70 * MiB);
  *e = (expect_t){"private_pool", MS_EXPLAIN_PRIVATE_POOL, 150 * MiB, 40 * MiB, 70 * MiB,
                  110 * MiB, 50 * MiB, 60 * MiB, 0, 0, 0, 60 * MiB, false};
  return rec_close(&r);
}

/* Releasable: built entry by entry (PyTorch's allocator releases whole free segments before it
 * gives up, so only a run whose release did not happen leaves this): a whole free 20 MiB segment
 * is cached when 30 MiB are asked for with 16 MiB free on the device. */
static ms_snapshot_t *case_releasable(expect_t *e) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  const uint64_t A = 0x7f0000000000;
  static const struct {
    uint8_t action;
    uint64_t addr, size;
  } tr[] = {{MS_TRACE_SEGMENT_ALLOC, A, 20 * MiB},
            {MS_TRACE_ALLOC, A, 20 * MiB},
            {MS_TRACE_FREE_REQUESTED, A, 20 * MiB},
            {MS_TRACE_FREE_COMPLETED, A, 20 * MiB},
            {MS_TRACE_OOM, 16 * MiB, 30 * MiB}};
  for (size_t k = 0; k < sizeof tr / sizeof tr[0]; k++) {
    ms_snap_trace_t t;
    memset(&t, 0, sizeof t);
    t.action = tr[k].action;
    t.addr = tr[k].addr;
    t.size = tr[k].size;
    t.time_us = 1000 + (int64_t)k;
    t.stack = MS_SNAP_NO_STACK;
    t.present = MS_TRACE_HAS_TIME | MS_TRACE_HAS_STREAM;
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  ms_snap_block_t k;
  memset(&k, 0, sizeof k);
  k.address = A;
  k.size = 20 * MiB;
  k.state = MS_BLOCK_INACTIVE;
  k.state_name = "inactive";
  k.stack = MS_SNAP_NO_STACK;
  k.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
  cr_assert_eq(ms__snapbuild_add_block(&b, &k), MS_OK);
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = A;
  g.total_size = 20 * MiB;
  g.is_large = true;
  g.stack = MS_SNAP_NO_STACK;
  g.nblocks = 1;
  g.present = MS_SEG_HAS_SEGMENT_TYPE | MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE;
  cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = sizeof tr / sizeof tr[0];
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  *e = (expect_t){"releasable", MS_EXPLAIN_RELEASABLE, 36 * MiB, 16 * MiB, 30 * MiB,
                  20 * MiB, 0, 20 * MiB, 20 * MiB, 0, 20 * MiB, 0, true};
  return s;
}

typedef ms_snapshot_t *case_fn(expect_t *e);
static case_fn *const cases[] = {case_full, case_fragmented, case_private, case_releasable};

/* ---- both formats ---------------------------------------------------------------------------- */

static ms_snapshot_t *reread(const ms_snapshot_t *s, bool pickle, const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.%s", dir, name, pickle ? "pickle" : "msgpack");
  ms_errbuf_t eb = {{0}};
  if (pickle) cr_assert_eq(ms_pickle_write_file(s, path, &eb), MS_OK, "%s", eb.msg);
  else cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_t *back = NULL;
  cr_assert_eq(ms_snapshot_load(path, &back, &eb), MS_OK, "%s: %s", path, eb.msg);
  return back;
}

static ms_explain_t *explain(const ms_snapshot_t *s, const ms_explain_options_t *o) {
  ms_explain_t *x = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_explain_run(s, o, &x, &eb), MS_OK, "%s", eb.msg);
  return x;
}

static bool replay_ooms(const ms_snapshot_t *s, size_t dev, const char *conf, uint64_t capacity) {
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  o.config = conf;
  o.capacity = capacity;
  o.device = (int)dev;
  ms_replay_report_t *rep = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_replay_run(s, &o, &rep, &eb), MS_OK, "%s", eb.msg);
  const ms_replay_usage_t *u = &rep->devices[0].replayed;
  cr_assert(u->valid, "%s at %" PRIu64, conf, capacity);
  bool oom = u->ooms > 0 || u->start_short > 0;
  ms_replay_report_free(rep);
  return oom;
}

/* Every claim a remedy makes, replayed again. */
static void verify_remedies(const ms_snapshot_t *s, const ms_explain_t *x, const char *what) {
  for (size_t i = 0; i < x->nremedies; i++) {
    const ms_explain_remedy_t *r = &x->remedies[i];
    if (!r->replayed) continue;
    if (x->capacity)
      cr_expect_eq(replay_ooms(s, x->device, r->config, x->capacity), r->avoids_oom == 0,
                   "%s: '%s' avoids_oom %d at %" PRIu64, what, r->config, r->avoids_oom,
                   x->capacity);
    if (!r->min_capacity) continue;
    cr_expect(!replay_ooms(s, x->device, r->config, r->min_capacity),
              "%s: '%s' has an OOM at its min_capacity %" PRIu64, what, r->config,
              r->min_capacity);
    cr_expect(replay_ooms(s, x->device, r->config, r->min_capacity - 2 * MiB),
              "%s: '%s' has no OOM 2 MiB under its min_capacity %" PRIu64, what, r->config,
              r->min_capacity);
  }
}

static void expect_case(const ms_explain_t *x, const expect_t *e, ms_capacity_source src,
                        const char *what) {
  cr_expect_eq(x->moment, MS_EXPLAIN_AT_OOM, "%s", what);
  cr_expect_eq(x->verdict, e->verdict, "%s: verdict %s: %s", what,
               ms_explain_verdict_name(x->verdict), x->verdict_text);
  cr_expect_eq(x->capacity_source, src, "%s: source %s", what,
               ms_capacity_source_name(x->capacity_source));
  cr_expect_eq(x->capacity, e->capacity, "%s: capacity %" PRIu64, what, x->capacity);
  cr_expect(x->has_device_free && x->device_free == e->device_free, "%s: device_free %" PRIu64,
            what, x->device_free);
  cr_expect(x->has_request && x->request_bytes == e->request, "%s: request", what);
  cr_expect_eq(x->reserved_bytes, e->reserved, "%s: reserved %" PRIu64, what, x->reserved_bytes);
  cr_expect_eq(x->allocated_bytes, e->allocated, "%s: allocated %" PRIu64, what,
               x->allocated_bytes);
  cr_expect_eq(x->cached_free_bytes, e->cached_free, "%s: cached free %" PRIu64, what,
               x->cached_free_bytes);
  cr_expect_eq(x->largest_free_block_bytes, e->largest_free, "%s: largest free %" PRIu64, what,
               x->largest_free_block_bytes);
  cr_expect_eq(x->inactive_split_bytes, e->inactive_split, "%s: split %" PRIu64, what,
               x->inactive_split_bytes);
  cr_expect_eq(x->releasable_bytes, e->releasable, "%s: releasable %" PRIu64, what,
               x->releasable_bytes);
  cr_expect_eq(x->private_pool_bytes, e->priv, "%s: private %" PRIu64, what,
               x->private_pool_bytes);
  /* the capacity the allocator had is all of it: nothing outside when inferred or simulated */
  cr_expect(x->has_outside && x->outside_allocator_bytes == 0, "%s: outside", what);
  cr_expect_eq(x->replayable, e->replayable, "%s: replayable (%s)", what, x->replay_note);
  /* the holders: every category has a row, and each allocated byte is in exactly one */
  uint64_t cat = 0, by_src = 0;
  for (size_t i = 0; i < x->nby_category; i++) cat += x->by_category[i].bytes;
  for (size_t i = 0; i < x->nby_source; i++) by_src += x->by_source[i].bytes;
  cr_expect_eq(x->nby_category, MS_CAT_COUNT, "%s", what);
  cr_expect_eq(cat, x->allocated_bytes, "%s: categories %" PRIu64, what, cat);
  cr_expect(by_src <= x->allocated_bytes && (x->allocated_bytes == 0 || x->nby_source > 0), "%s",
            what);
  cr_expect(x->recommendation[0], "%s: a recommendation", what);
}

Test(explain, oom_cases_in_both_formats, .timeout = 120) {
  char *dir = th_tmpdir();
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    expect_t e;
    ms_snapshot_t *s = cases[c](&e);
    for (int pickle = 0; pickle < 2; pickle++) {
      ms_snapshot_t *back = reread(s, pickle, dir, e.name);
      char what[96];
      snprintf(what, sizeof what, "%s (%s)", e.name, pickle ? "pickle" : "msgpack");
      bool recorded = back->origin == MS_SNAP_ORIGIN_MEMSNAP &&
                      (back->devices[0].present & MS_DEV_HAS_CAPACITY);
      ms_explain_t *x = explain(back, NULL);
      expect_case(x, &e, recorded ? MS_CAPACITY_RECORDED : MS_CAPACITY_INFERRED, what);
      verify_remedies(back, x, what);
      ms_explain_free(x);
      ms_snapshot_free(back);
    }
    ms_snapshot_free(s);
  }
  th_rmdir(dir);
  free(dir);
}

/* The answers the replays give on those cases: the full run needs exactly the 250 MiB its live
 * tensors and the request add up to, and nothing avoids it; the fragmented run fits its
 * 120 MiB device with expandable segments; the releasable one fits as recorded (the allocator
 * itself releases the cached segment); the private pool one cannot be replayed. */
Test(explain, remedies_answer, .timeout = 120) {
  expect_t e;
  ms_snapshot_t *s = case_full(&e);
  ms_explain_t *x = explain(s, NULL);
  cr_assert_geq(x->nremedies, 8);
  cr_expect_str_empty(x->remedies[0].config);
  cr_expect_eq(x->remedies[0].min_capacity, 250 * MiB);
  for (size_t i = 0; i < x->nremedies; i++)
    cr_expect_eq(x->remedies[i].avoids_oom, 0, "%s", x->remedies[i].config);
  cr_expect(strstr(x->recommendation, "no setting avoids the OOM at 200.0MiB: the run needs at "
                                      "least 250.0MiB (50.0MiB more") != NULL,
            "%s", x->recommendation);
  ms_explain_free(x);
  ms_snapshot_free(s);

  s = case_fragmented(&e);
  x = explain(s, NULL);
  bool found = false;
  for (size_t i = 0; i < x->nremedies; i++)
    if (strcmp(x->remedies[i].config, "expandable_segments:True") == 0) {
      found = true;
      cr_expect_eq(x->remedies[i].avoids_oom, 1);
    }
  cr_expect(found);
  cr_expect_eq(x->remedies[0].avoids_oom, 0);
  cr_expect_eq(x->remedies[1].avoids_oom, 1, "the best first: %s", x->remedies[1].config);
  cr_expect(strncmp(x->recommendation, "set PYTORCH_CUDA_ALLOC_CONF=", 28) == 0, "%s",
            x->recommendation);
  ms_explain_free(x);
  ms_snapshot_free(s);

  s = case_releasable(&e);
  x = explain(s, NULL);
  cr_expect_eq(x->remedies[0].avoids_oom, 1);
  cr_expect(strstr(x->recommendation, "releas") != NULL, "%s", x->recommendation);
  ms_explain_free(x);
  ms_snapshot_free(s);

  s = case_private(&e);
  x = explain(s, NULL);
  cr_expect(!x->replayable);
  cr_expect(strstr(x->replay_note, "private pools") != NULL, "%s", x->replay_note);
  cr_expect(strncmp(x->recommendation, "no remedy can be proven", 23) == 0, "%s",
            x->recommendation);
  ms_explain_free(x);
  ms_snapshot_free(s);
}

/* ---- capacity ------------------------------------------------------------------------------- */

/* The pickle writer gives the oom entry PyTorch's own keys: device_free, not addr. */
Test(explain, capacity_inferred_from_a_pytorch_shaped_oom_entry) {
  expect_t e;
  ms_snapshot_t *s = case_full(&e);
  char *dir = th_tmpdir();
  ms_snapshot_t *back = reread(s, true, dir, "inferred");
  char path[512];
  snprintf(path, sizeof path, "%s/inferred.pickle", dir);
  size_t len = 0;
  char *bytes = th_read_file(path, &len);
  cr_assert(bytes);
  cr_expect(memmem(bytes, len, "device_free", 11) != NULL);
  free(bytes);
  uint64_t cap = 0;
  ms_tl_oom_t o;
  cr_assert_eq(ms_snapshot_capacity(back, 0, &cap, &o), MS_CAPACITY_INFERRED);
  cr_expect_eq(cap, 200 * MiB);
  cr_expect_eq(o.reserved, 150 * MiB);
  cr_expect_eq(o.device_free, 50 * MiB);
  cr_expect_eq(o.request, 100 * MiB);
  cr_expect_eq(ms_snapshot_oom_count(back, 0), 1);
  /* memsnap's own snapshot records the size: that wins */
  cr_assert_eq(ms_snapshot_capacity(s, 0, &cap, NULL), MS_CAPACITY_RECORDED);
  cr_expect_eq(cap, 200 * MiB);
  ms_snapshot_free(back);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

/* A copy of s whose oom entries have no device_free (as a damaged or hostile pickle). */
static ms_snapshot_t *without_device_free(const ms_snapshot_t *s, const char *dir) {
  for (size_t i = 0; i < s->ntrace; i++)
    if (s->trace[i].action == MS_TRACE_OOM) {
      ((ms_snap_trace_t *)&s->trace[i])->present |= MS_TRACE_NO_ADDR;
      ((ms_snap_trace_t *)&s->trace[i])->addr = 0;
    }
  ms_snap_device_t *d = (ms_snap_device_t *)&s->devices[0];
  d->present &= ~(uint32_t)MS_DEV_HAS_CAPACITY;
  return reread(s, true, dir, "nofree");
}

Test(explain, oom_without_device_free_is_unknown_and_says_so, .timeout = 60) {
  expect_t e;
  ms_snapshot_t *s = case_full(&e);
  char *dir = th_tmpdir();
  ms_snapshot_t *back = without_device_free(s, dir);
  size_t noms = 0;
  for (size_t i = 0; i < back->ntrace; i++)
    if (back->trace[i].action == MS_TRACE_OOM) {
      cr_expect(back->trace[i].present & MS_TRACE_NO_ADDR);
      noms++;
    }
  cr_assert_eq(noms, 1);
  uint64_t cap = 1;
  cr_expect_eq(ms_snapshot_capacity(back, 0, &cap, NULL), MS_CAPACITY_UNKNOWN);
  cr_expect_eq(cap, 0);
  ms_explain_t *x = explain(back, NULL);
  cr_expect(!x->has_device_free);
  cr_expect_eq(x->capacity_source, MS_CAPACITY_UNKNOWN);
  cr_expect_eq(x->verdict, MS_EXPLAIN_UNKNOWN, "%s", x->verdict_text);
  cr_expect(strstr(x->verdict_text, "pass --capacity") != NULL, "%s", x->verdict_text);
  for (size_t i = 0; i < x->nremedies; i++) cr_expect_eq(x->remedies[i].avoids_oom, -1);
  cr_expect(strncmp(x->recommendation, "the device's size is unknown", 28) == 0, "%s",
            x->recommendation);
  ms_explain_free(x);
  /* --capacity makes it an answer again */
  ms_explain_options_t o;
  ms_explain_options_init(&o);
  o.capacity = 200 * MiB;
  x = explain(back, &o);
  cr_expect_eq(x->capacity_source, MS_CAPACITY_GIVEN);
  cr_expect_eq(x->verdict, MS_EXPLAIN_FULL, "%s", x->verdict_text);
  ms_explain_free(x);
  ms_snapshot_free(back);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

/* An OOM on a device that has no segment at all: its first request failed. */
Test(explain, oom_on_a_device_without_segments) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  ms_snap_trace_t t;
  memset(&t, 0, sizeof t);
  t.action = MS_TRACE_OOM;
  t.addr = 512 * MiB;
  t.size = 1024 * MiB;
  t.stack = MS_SNAP_NO_STACK;
  cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = 1;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  ms_explain_t *x = explain(s, NULL);
  cr_expect_eq(x->reserved_bytes, 0);
  cr_expect_eq(x->capacity, 512 * MiB);
  cr_expect_eq(x->verdict, MS_EXPLAIN_FULL, "%s", x->verdict_text);
  cr_expect_eq(x->npools, 1); /* the request's own, empty */
  cr_expect_eq(x->ntop, 0);
  ms_explain_free(x);
  ms_snapshot_free(s);
}

/* ---- moments and steps ---------------------------------------------------------------------- */

/* A trace of three steps (ProfilerStep#0..2), 10 MiB more each step, with hostile annotations:
 * unsorted, an END without START, a START without END, markup and control bytes in names. */
static ms_snapshot_t *stepped_snapshot(void) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_ANNOTATIONS;
  const uint64_t A = 0x7f0000000000;
  size_t n = 0;
  for (int step = 0; step < 3; step++) {
    uint64_t addr = A + (uint64_t)step * 0x10000000;
    uint8_t acts[2] = {MS_TRACE_SEGMENT_ALLOC, MS_TRACE_ALLOC};
    for (int k = 0; k < 2; k++, n++) {
      ms_snap_trace_t t;
      memset(&t, 0, sizeof t);
      t.action = acts[k];
      t.addr = addr;
      t.size = 10 * MiB;
      t.time_us = 100 * (step + 1) + 10 + k;
      t.stack = MS_SNAP_NO_STACK;
      t.present = MS_TRACE_HAS_TIME | MS_TRACE_HAS_STREAM;
      cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
    }
  }
  for (int step = 0; step < 3; step++) {
    ms_snap_block_t k;
    memset(&k, 0, sizeof k);
    k.address = A + (uint64_t)step * 0x10000000;
    k.size = k.requested_size = 10 * MiB;
    k.state = MS_BLOCK_ACTIVE_ALLOCATED;
    k.state_name = "active_allocated";
    k.stack = MS_SNAP_NO_STACK;
    k.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
    ms_snap_segment_t g;
    memset(&g, 0, sizeof g);
    g.address = k.address;
    g.total_size = g.allocated_size = g.active_size = g.requested_size = 10 * MiB;
    g.is_large = true;
    g.stack = MS_SNAP_NO_STACK;
    g.first_block = (uint32_t)b.blocks.len;
    g.nblocks = 1;
    cr_assert_eq(ms__snapbuild_add_block(&b, &k), MS_OK);
    cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  }
  static const struct {
    const char *name, *stage;
    int64_t t;
  } an[] = {{"ProfilerStep#2", "END", 399},
            {"ProfilerStep#0", "START", 100},
            {"ProfilerStep#0", "END", 199},
            {"ProfilerStep#1", "START", 200},
            {"## forward <b>\x1b[31m ##", "START", 205},
            {"## forward <b>\x1b[31m ##", "END", 215},
            {"ProfilerStep#1", "END", 299},
            {"ProfilerStep#2", "START", 300},
            {"orphan", "END", 50},
            {"never ends", "START", 301},
            {"odd", "MIDDLE", 302}};
  for (size_t i = 0; i < sizeof an / sizeof an[0]; i++) {
    ms_snap_annotation_t a = {NULL, NULL, 0, an[i].t};
    cr_assert_eq(ms__snapbuild_str(&b, an[i].name, strlen(an[i].name), &a.name), MS_OK);
    cr_assert_eq(ms__snapbuild_str(&b, an[i].stage, strlen(an[i].stage), &a.stage), MS_OK);
    cr_assert_eq(ms__snapbuild_add_annotation(&b, &a), MS_OK);
  }
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = (uint32_t)n;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

Test(explain, annotations_pair_into_steps_and_phases) {
  ms_snapshot_t *s = stepped_snapshot();
  ms_tl_ranges_t rs;
  cr_assert_eq(ms_tl_ranges_build(s, &rs), MS_OK);
  cr_expect_eq(rs.unmatched_ends, 1);
  cr_expect_eq(rs.unknown_stages, 1);
  cr_assert_eq(rs.n, 5); /* three steps, the forward range, "never ends" */
  const ms_tl_range_t *r1 = ms_tl_ranges_step(&rs, 0, 1);
  cr_assert(r1);
  cr_expect_eq(r1->start_us, 200);
  cr_expect_eq(r1->end_us, 299);
  const ms_tl_range_t *p = ms_tl_ranges_at(&rs, 0, 210, false);
  cr_assert(p);
  cr_expect_str_eq(p->name, "## forward <b>\x1b[31m ##");
  cr_expect_eq(ms_tl_ranges_at(&rs, 0, 210, true), r1);
  const ms_tl_range_t *open = ms_tl_ranges_at(&rs, 0, 1000000, false);
  cr_assert(open);
  cr_expect(!open->has_end);
  cr_expect_eq(open->end_us, INT64_MAX);
  cr_expect_null(ms_tl_ranges_at(&rs, 0, 50, true));
  ms_tl_ranges_release(&rs);

  /* --at step=N: after the last entry of step N; the range of its entries */
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  size_t from = 9, to = 9, step = 0;
  cr_assert_eq(ms_timeline_step_range(tl, 0, 1, &from, &to, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(from, 2);
  cr_expect_eq(to, 4);
  ms_tl_moment_t m;
  cr_assert_eq(ms_tl_moment_parse("step=1", &m, &eb), MS_OK);
  cr_assert_eq(ms_timeline_moment_step(tl, 0, &m, 0, 6, &step, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(step, 4);
  cr_expect_eq(ms_timeline_series(tl, 0, MS_TL_ALLOCATED)[step], 20 * MiB);
  cr_assert_eq(ms_tl_moment_parse("step=7", &m, &eb), MS_OK);
  cr_expect_eq(ms_timeline_moment_step(tl, 0, &m, 0, 6, &step, &eb), MS_EINVAL);
  cr_expect(strstr(eb.msg, "no ProfilerStep#7 annotation") != NULL, "%s", eb.msg);
  cr_assert_eq(ms_tl_moment_parse("oom", &m, &eb), MS_OK);
  cr_expect_eq(ms_timeline_moment_step(tl, 0, &m, 0, 6, &step, &eb), MS_EINVAL);
  cr_expect(strstr(eb.msg, "no out-of-memory error") != NULL, "%s", eb.msg);
  ms_timeline_destroy(tl);

  /* explain at the peak names the step and phase of its entry */
  ms_explain_options_t o;
  ms_explain_options_init(&o);
  o.remedies = false;
  o.has_moment = true;
  cr_assert_eq(ms_tl_moment_parse("3", &m, &eb), MS_OK); /* the alloc of step 1, t = 211 */
  o.moment = m;
  ms_explain_t *x = explain(s, &o);
  cr_expect_eq(x->step_number, 1);
  cr_assert(x->phase);
  cr_expect_str_eq(x->phase, "## forward <b>\x1b[31m ##");
  ms_explain_free(x);
  ms_snapshot_free(s);
}

/* The pairing as a scan back over the ranges opened so far (what ms_tl_ranges_build did before
 * its open ranges were kept by name and device): the reference for the random markers below. */
typedef struct ref_range_s {
  ms_tl_range_t r;
  size_t pos; /* the START's position among the markers sorted by time */
} ref_range_t;

static int ref_mark_cmp(const void *x, const void *y) {
  const ms_snap_annotation_t *const *a = x, *const *b = y;
  if ((*a)->time_us != (*b)->time_us) return (*a)->time_us < (*b)->time_us ? -1 : 1;
  return *a < *b ? -1 : *a > *b; /* the snapshot's order: the annotations are one array */
}

static int ref_range_cmp(const void *x, const void *y) {
  const ref_range_t *a = x, *b = y;
  if (a->r.start_us != b->r.start_us) return a->r.start_us < b->r.start_us ? -1 : 1;
  if (a->r.end_us != b->r.end_us) return a->r.end_us > b->r.end_us ? -1 : 1;
  return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static size_t ref_pair(const ms_snapshot_t *s, ref_range_t *r, size_t *unmatched, size_t *unknown) {
  const ms_snap_annotation_t **m = malloc(s->nannotations * sizeof *m);
  cr_assert(m);
  for (size_t i = 0; i < s->nannotations; i++)
    m[i] = &s->annotations[i];
  qsort(m, s->nannotations, sizeof *m, ref_mark_cmp);
  size_t nr = 0;
  *unmatched = *unknown = 0;
  for (size_t i = 0; i < s->nannotations; i++) {
    if (strcmp(m[i]->stage, "START") == 0) {
      int64_t step = -1;
      if (strncmp(m[i]->name, "ProfilerStep#", 13) == 0) step = atoi(m[i]->name + 13);
      r[nr++] = (ref_range_t){{m[i]->name, m[i]->device, m[i]->time_us, INT64_MAX, false, step}, i};
    } else if (strcmp(m[i]->stage, "END") == 0) {
      size_t j = nr;
      while (j-- > 0)
        if (!r[j].r.has_end && r[j].r.device == m[i]->device &&
            strcmp(r[j].r.name, m[i]->name) == 0)
          break;
      if (j == SIZE_MAX) {
        ++*unmatched;
        continue;
      }
      r[j].r.end_us = m[i]->time_us;
      r[j].r.has_end = true;
    } else {
      ++*unknown;
    }
  }
  free(m);
  qsort(r, nr, sizeof *r, ref_range_cmp);
  return nr;
}

/* Random markers (names and devices repeating, times tied and out of order, ranges nested,
 * crossed, never ended and ended twice): the ranges, their order and the counts are the
 * reference's, and ms_tl_ranges_step's search answers as a scan of the ranges does. */
Test(explain, annotations_pair_as_a_scan_back_does) {
  static const char *names[] = {"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2",
                                "ProfilerStep#3", "## forward ##",  "aten::mm",
                                "<b>&amp;"};
  static const char *stages[] = {"START", "START", "END", "END", "MIDDLE"};
  uint64_t seed = 12345;
  for (int c = 0; c < 60; c++) {
    ms__snapbuild_t b;
    ms__snapbuild_init(&b);
    size_t n = 1 + (size_t)(c * 37 % 400);
    for (size_t i = 0; i < n; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      uint32_t x = (uint32_t)(seed >> 33);
      ms_snap_annotation_t a = {names[x % 7], stages[(x >> 3) % 5], (int64_t)((x >> 6) % 3) - 1,
                                c % 3 == 0 ? (int64_t)i : (int64_t)((x >> 9) % (n / 4 + 1))};
      cr_assert_eq(ms__snapbuild_add_annotation(&b, &a), MS_OK);
    }
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
    ref_range_t *ref = malloc(n * sizeof *ref);
    cr_assert(ref);
    size_t unmatched, unknown, nref = ref_pair(s, ref, &unmatched, &unknown);
    ms_tl_ranges_t rs;
    cr_assert_eq(ms_tl_ranges_build(s, &rs), MS_OK);
    cr_assert_eq(rs.n, nref, "case %d", c);
    cr_expect_eq(rs.unmatched_ends, unmatched, "case %d", c);
    cr_expect_eq(rs.unknown_stages, unknown, "case %d", c);
    for (size_t i = 0; i < nref; i++) {
      const ms_tl_range_t *x = &rs.ranges[i], *y = &ref[i].r;
      cr_assert(x->name == y->name && x->device == y->device && x->start_us == y->start_us &&
                    x->end_us == y->end_us && x->has_end == y->has_end && x->step == y->step,
                "case %d, range %zu", c, i);
    }
    ms_tl_ranges_t scan = rs; /* a table its caller filled: no index, a scan */
    scan.by_step = NULL;
    for (int64_t dev = -1; dev <= 2; dev++)
      for (int64_t k = -1; k <= 5; k++) {
        const ms_tl_range_t *want = NULL;
        for (size_t i = 0; i < nref && !want; i++)
          if (k >= 0 && rs.ranges[i].step == k && (dev < 0 || rs.ranges[i].device == dev))
            want = &rs.ranges[i];
        cr_expect_eq(ms_tl_ranges_step(&rs, dev, k), want,
                     "case %d, dev %" PRId64 ", step %" PRId64, c, dev, k);
        cr_expect_eq(ms_tl_ranges_step(&scan, dev, k), want);
      }
    ms_tl_ranges_release(&rs);
    free(ref);
    ms_snapshot_free(s);
  }
}

Test(explain, moment_texts_parse) {
  static const struct {
    const char *text;
    int ok;
    ms_tl_moment_kind kind;
    int64_t value;
  } cases_[] = {{"oom", 1, MS_TL_MOMENT_OOM, 1},      {"oom:1", 1, MS_TL_MOMENT_OOM, 1},
                {"oom:12", 1, MS_TL_MOMENT_OOM, 12},  {"oom:0", 0, 0, 0},
                {"oom:-1", 0, 0, 0},                  {"oom:", 0, 0, 0},
                {"oom:x", 0, 0, 0},                   {"step=0", 1, MS_TL_MOMENT_STEP, 0},
                {"step=42", 1, MS_TL_MOMENT_STEP, 42}, {"step=", 0, 0, 0},
                {"step=-2", 0, 0, 0},                 {"step=1x", 0, 0, 0},
                {"oomm", 0, 0, 0}};
  for (size_t i = 0; i < sizeof cases_ / sizeof cases_[0]; i++) {
    ms_tl_moment_t m = {MS_TL_MOMENT_END, -5};
    ms_errbuf_t eb = {{0}};
    int rc = ms_tl_moment_parse(cases_[i].text, &m, &eb);
    cr_expect_eq(rc == MS_OK, cases_[i].ok, "'%s'", cases_[i].text);
    if (rc == MS_OK) {
      cr_expect_eq(m.kind, cases_[i].kind, "'%s'", cases_[i].text);
      cr_expect_eq(m.value, cases_[i].value, "'%s'", cases_[i].text);
    } else {
      cr_expect(strstr(eb.msg, "oom:N, step=N") != NULL, "'%s': %s", cases_[i].text, eb.msg);
    }
  }
}

/* ---- no trace ------------------------------------------------------------------------------- */

Test(explain, legacy_oom_fixture_without_trace) {
  char path[1024];
  snprintf(path, sizeof path, "%s/yiyi_flexgen_oom_legacy.pickle", th_fixture_dir());
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  if (ms_snapshot_load(path, &s, &eb) != MS_OK) cr_skip_test("SKIP: fixture %s absent", path);
  uint64_t reserved = 0, active = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    reserved += s->segments[i].total_size;
    active += s->segments[i].active_size;
  }
  ms_explain_t *x = explain(s, NULL);
  cr_expect_eq(x->moment, MS_EXPLAIN_AT_END);
  cr_expect(!x->has_trace);
  cr_expect_eq(x->reserved_bytes, reserved);
  cr_expect_eq(x->active_bytes, active);
  cr_expect_eq(x->cached_free_bytes, reserved - active);
  cr_expect_eq(x->verdict, MS_EXPLAIN_FULL, "%s", x->verdict_text); /* 11.0 of 11.0 GiB live */
  cr_expect(strstr(x->hint, "_record_memory_history(") != NULL, "%s", x->hint);
  cr_expect_eq(x->nremedies, 0);
  ms_explain_free(x);
  ms_snapshot_free(s);
}

/* ---- the command ---------------------------------------------------------------------------- */

static int run_cli(const char *args, char *out, size_t cap) {
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) cr_skip_test("SKIP: MEMSNAP_BIN not set (run through ctest)");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin, args);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(explain, cli_json_fields_text_and_replay_warning, .timeout = 120) {
  expect_t e;
  ms_snapshot_t *s = case_fragmented(&e);
  char *dir = th_tmpdir();
  ms_snapshot_t *back = reread(s, true, dir, "frag");
  ms_snapshot_free(back);
  static char out[1 << 17];
  char args[1024];
  snprintf(args, sizeof args, "explain %s/frag.pickle --json", dir);
  cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  static const char *const fields[] = {
      "\"device\": 0", "\"moment\": \"oom\"", "\"entry\": ", "\"request_bytes\": 52428800",
      "\"capacity_bytes\": 125829120", "\"capacity_source\": \"inferred_from_oom\"",
      "\"reserved_bytes\": 104857600", "\"allocated_bytes\": 62914560", "\"requested_bytes\": ",
      "\"cached_free_bytes\": 41943040", "\"largest_free_block_bytes\": 41943040",
      "\"inactive_split_bytes\": 41943040", "\"private_pool_bytes\": 0",
      "\"outside_allocator_bytes\": 0", "\"verdict\": \"fragmentation\"", "\"top\": [{\"key\": ",
      "\"remedies\": [", "\"avoids_oom\": ", "\"peak_reserved\": ", "\"min_capacity\": ",
      "\"recommendation\": \"set PYTORCH_CUDA_ALLOC_CONF="};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    cr_expect(strstr(out, fields[i]) != NULL, "missing %s in %s", fields[i], out);

  snprintf(args, sizeof args, "explain %s/frag.pickle --no-min-capacity", dir);
  cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "capacity:  120.0MiB (inferred from the recorded OOM at entry ") != NULL,
            "%s", out);
  cr_expect(strstr(out, "verdict:   fragmentation: ") != NULL, "%s", out);
  cr_expect(strstr(out, "recommendation: set PYTORCH_CUDA_ALLOC_CONF=") != NULL, "%s", out);

  /* --at oom in another command, and oom:2 of a run that had one */
  snprintf(args, sizeof args, "top %s/frag.pickle --at oom", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  snprintf(args, sizeof args, "stats %s/frag.pickle --at oom:2", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "device 0 had 1 out-of-memory error, not 2") != NULL, "%s", out);
  snprintf(args, sizeof args, "timeline %s/frag.pickle", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "out of memory (--at oom:1): 50.0MiB requested on stream 0") != NULL,
            "%s", out);

  /* Without device_free, the size is unknown: replay warns on every output */
  ms_snapshot_t *nf = without_device_free(s, dir);
  ms_snapshot_free(nf);
  snprintf(args, sizeof args, "replay %s/nofree.pickle --config expandable_segments:True", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "warning: expandable_segments:True: recorded 1 OOM, replayed 0: the "
                        "device's size is unknown; pass --capacity") != NULL,
            "%s", out);
  snprintf(args, sizeof args, "replay %s/nofree.pickle --config expandable_segments:True --json",
           dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "\"capacity_source\": \"unknown\"") != NULL, "%s", out);
  cr_expect(strstr(out, "\"warning\": \"recorded 1 OOM, replayed 0: the device's size is "
                        "unknown; pass --capacity\"") != NULL,
            "%s", out);
  snprintf(args, sizeof args, "explain %s/nofree.pickle --json --no-replay", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "\"capacity_source\": \"unknown\"") != NULL, "%s", out);
  cr_expect(strstr(out, "\"device_free_bytes\": null") != NULL, "%s", out);

  /* usage errors */
  snprintf(args, sizeof args, "explain %s/frag.pickle --at nowhere", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 2, "%s", out);
  snprintf(args, sizeof args, "explain %s/frag.pickle --capacity 0x10", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 2, "%s", out);
  snprintf(args, sizeof args, "explain %s/frag.pickle --device 3", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "device 3 has no trace and no segments") != NULL, "%s", out);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

/* A JSON writer into a buffer, escaping as the command does for plain text. */
typedef struct jbuf_s {
  char *p;
  size_t len, cap;
} jbuf_t;

static void jb_lit(void *ctx, const char *s) {
  jbuf_t *b = ctx;
  size_t n = strlen(s);
  cr_assert_lt(b->len + n, b->cap);
  memcpy(b->p + b->len, s, n + 1);
  b->len += n;
}

static void jb_str(void *ctx, const char *s) {
  char t[2048];
  size_t k = 0;
  t[k++] = '"';
  for (; *s && k + 8 < sizeof t; s++) {
    if (*s == '"' || *s == '\\') t[k++] = '\\';
    t[k++] = *s;
  }
  t[k++] = '"';
  t[k] = 0;
  jb_lit(ctx, t);
}

static void jb_u64(void *ctx, uint64_t v) {
  char t[32];
  snprintf(t, sizeof t, "%" PRIu64, v);
  jb_lit(ctx, t);
}

static void jb_i64(void *ctx, int64_t v) {
  char t[32];
  snprintf(t, sizeof t, "%" PRId64, v);
  jb_lit(ctx, t);
}

/* One emitter for `explain --json` and the viewer's panel: the command's object is the file's
 * members and ms_explain_write_json's, and the viewer's flag only adds its own at the end. */
Test(explain, one_json_emitter_for_the_command_and_the_viewer, .timeout = 60) {
  expect_t e;
  ms_snapshot_t *s = case_fragmented(&e);
  char *dir = th_tmpdir();
  ms_snapshot_t *back = reread(s, true, dir, "frag");
  static char out[1 << 17], lib[1 << 17], view[1 << 17];
  char args[1024];
  snprintf(args, sizeof args, "explain %s/frag.pickle --json --no-replay", dir);
  cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  ms_explain_options_t o;
  ms_explain_options_init(&o);
  o.remedies = false;
  ms_explain_t *x = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_explain_run(back, &o, &x, &eb), MS_OK, "%s", eb.msg);
  jbuf_t b = {lib, 0, sizeof lib};
  snprintf(args, sizeof args, "{\"command\": \"explain\", \"file\": \"%s/frag.pickle\", ", dir);
  jb_lit(&b, args);
  const ms_json_writer_t w = {&b, jb_lit, jb_str, jb_u64, jb_i64, NULL};
  ms_explain_write_json(x, &w, 0);
  jb_lit(&b, "}\n");
  /* the command's output less its top_by_stack (labels are the command's) */
  char *ts = strstr(out, ", \"top_by_stack\": "), *re = strstr(out, ", \"remedies\": ");
  cr_assert(ts && re && ts < re, "%s", out);
  memmove(ts, re, strlen(re) + 1);
  cr_expect_str_eq(lib, out);
  cr_expect(strstr(lib, "\"moment\": \"oom\", \"entry\": "), "%s", lib);
  /* the viewer's: the same members, then its own */
  jbuf_t v = {view, 0, sizeof view};
  const ms_json_writer_t wv = {&v, jb_lit, jb_str, jb_u64, jb_i64, NULL};
  ms_explain_write_json(x, &wv, MS_EXPLAIN_JSON_VIEWER);
  size_t common = b.len - strlen("}\n") - strlen(args);
  cr_assert(strncmp(view, lib + strlen(args), common) == 0, "%s", view);
  snprintf(args, sizeof args, ", \"capacity_oom_entry\": %zu, \"replayed\": false, "
           "\"replay_note\": \"\", \"series\": [", x->capacity_oom.entry);
  cr_expect(strncmp(view + common, args, strlen(args)) == 0, "%s", view + common);
  ms_explain_free(x);
  ms_snapshot_free(back);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

/* The caller's time index and classifier (o.timeline, o.attr: what the viewer built for its own
 * columns) give the same answer as those explain builds, holders by source and category
 * included. */
Test(explain, a_given_index_and_classifier_give_the_same_answer, .timeout = 60) {
  expect_t e;
  ms_snapshot_t *s = case_fragmented(&e);
  static char own[1 << 17], given[1 << 17];
  ms_explain_options_t o;
  ms_explain_options_init(&o);
  o.remedies = false;
  o.series_points = 100;
  ms_explain_t *x = explain(s, &o);
  cr_assert_gt(x->nby_source, 0);
  jbuf_t b = {own, 0, sizeof own};
  const ms_json_writer_t w = {&b, jb_lit, jb_str, jb_u64, jb_i64, NULL};
  ms_explain_write_json(x, &w, MS_EXPLAIN_JSON_VIEWER);
  ms_explain_free(x);
  ms_timeline_t *tl = NULL;
  ms_attr_t *a = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_attr_create(s, tl, NULL, &a, &eb), MS_OK, "%s", eb.msg);
  o.timeline = tl;
  o.attr = a;
  x = explain(s, &o);
  jbuf_t g = {given, 0, sizeof given};
  const ms_json_writer_t wg = {&g, jb_lit, jb_str, jb_u64, jb_i64, NULL};
  ms_explain_write_json(x, &wg, MS_EXPLAIN_JSON_VIEWER);
  cr_expect_str_eq(given, own);
  cr_expect(strstr(own, "\"top\": [{") != NULL, "%s", own);
  ms_explain_free(x);
  ms_attr_destroy(a);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

Test(explain, cli_steps_and_hostile_annotation_names, .timeout = 60) {
  ms_snapshot_t *s = stepped_snapshot();
  char *dir = th_tmpdir();
  ms_snapshot_t *back = reread(s, true, dir, "steps");
  ms_snapshot_free(back);
  static char out[1 << 16];
  char args[1024];
  snprintf(args, sizeof args, "timeline %s/steps.pickle --steps", dir);
  cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "steps (ProfilerStep#N annotations):") != NULL, "%s", out);
  cr_expect(strstr(out, "         1  2-3                    20.0MiB          3      20.0MiB") !=
                NULL,
            "%s", out);
  cr_expect(strstr(out, "the peak of allocated memory is in step 2") != NULL, "%s", out);
  cr_expect(strstr(out, "(1 END annotation without a START, 1 of another stage: ignored)") != NULL,
            "%s", out);
  snprintf(args, sizeof args, "top %s/steps.pickle --at step=0", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  snprintf(args, sizeof args, "timeline %s/steps.pickle --range step=1", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "showing entries 2 to 3") != NULL, "%s", out);
  snprintf(args, sizeof args, "timeline %s/steps.pickle --range step=9", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "--range step=9: no step 9") != NULL, "%s", out);
  snprintf(args, sizeof args, "explain %s/steps.pickle --at 3 --no-replay", dir);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "step:      step 1, phase \"## forward <b>\\x1b[31m ##\"") != NULL, "%s",
            out);
  cr_expect(strchr(out, 0x1b) == NULL, "a control byte reached the terminal");
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}
