/* SPDX-License-Identifier: MIT
 * One device prepared for many what-if replays (ms_replay_prepare), and the smallest capacity
 * it is searched for (ms_replay_min_capacity):
 *  - a what-if on the prepared device is ms_replay_run()'s, figure for figure, for every setting
 *    and capacity tried, and several threads may run them on it at once;
 *  - the smallest capacity is the one a scan of every 2 MiB step finds, wherever the scan shows
 *    that a larger device never does worse; elsewhere it fits and 2 MiB less does not;
 *  - a trace that ends on an OOM the recorded device could not serve (an OOM snapshot) needs room
 *    for that request on top of what was allocated then.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "helpers.h"
#include "memsnap/allocator.h"
#include "memsnap/backend.h"
#include "memsnap/history.h"
#include "memsnap/replay.h"
#include "memsnap/snapshot.h"

#define MiB ((size_t)1 << 20)
#define PAGE (2 * MiB)

typedef th_rec_t rec_t;

static void rec_open(rec_t *r, size_t capacity) {
  cr_assert_eq(th_rec_open(r, capacity, MS_CONTEXT_NONE, 1000000), MS_OK);
}

static ms_snapshot_t *rec_close(rec_t *r) {
  ms_snapshot_t *s = th_rec_close(r);
  cr_assert(s != NULL);
  return s;
}

/* Each step: four large tensors that grow a little, freed, and a small one kept: the cache
 * fragments, so a smaller device takes the OOM path and fits in less than the unlimited peak. */
static ms_snapshot_t *fragmenting(void) {
  rec_t r;
  rec_open(&r, 64 * 1024 * MiB);
  ms_devptr_t keep[16];
  for (int step = 0; step < 16; step++) {
    ms_devptr_t big[4];
    for (int i = 0; i < 4; i++)
      cr_assert_eq(
          ms_allocator_malloc(r.al, (size_t)(30 + step) * MiB + 4096 * (size_t)i, 0, &big[i]),
          MS_OK);
    cr_assert_eq(ms_allocator_malloc(r.al, 3 * MiB, 0, &keep[step]), MS_OK);
    for (int i = 0; i < 4; i++)
      cr_assert_eq(ms_allocator_free(r.al, big[i]), MS_OK);
  }
  return rec_close(&r);
}

/* Small and large tensors in a drifting mix on a 512 MiB device, then one request larger than
 * anything free, which fails: the trace ends on its oom entry, as an OOM snapshot's does. */
static ms_snapshot_t *ends_on_oom(void) {
  rec_t r;
  rec_open(&r, 512 * MiB);
  enum { LIVE = 24 };
  ms_devptr_t live[LIVE] = {0};
  uint64_t x = 88172645463325252ull;
  for (int op = 0; op < 600; op++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    int slot = (int)(x % LIVE);
    if (live[slot]) {
      cr_assert_eq(ms_allocator_free(r.al, live[slot]), MS_OK);
      live[slot] = 0;
      continue;
    }
    size_t size =
        (x >> 8) & 1 ? (size_t)(x >> 12) % (600 * 1024) + 1 : (size_t)(x >> 12) % (12 * MiB) + 1;
    cr_assert_eq(ms_allocator_malloc(r.al, size, 0, &live[slot]), MS_OK);
  }
  ms_devptr_t huge = 0;
  cr_assert_eq(ms_allocator_malloc(r.al, 900 * MiB, 0, &huge), MS_EOOM);
  return rec_close(&r);
}

static const char *const configs[] = {
    "",
    "expandable_segments:True",
    "max_split_size_mb:20",
    "garbage_collection_threshold:0.6",
    "roundup_power2_divisions:4",
    "expandable_segments:True,garbage_collection_threshold:0.6",
};
#define NCONFIGS (sizeof configs / sizeof configs[0])

static ms_replay_device_t run_whatif(const ms_snapshot_t *s, const char *conf, size_t capacity) {
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  o.config = conf;
  o.capacity = capacity;
  o.recorded_capacity = o.inferred_capacity = false; /* 0: unlimited */
  o.device = 0;
  ms_replay_report_t *rep = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_replay_run(s, &o, &rep, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(rep->ndevices, 1);
  ms_replay_device_t d = rep->devices[0];
  ms_replay_report_free(rep);
  return d;
}

static bool fits(const ms_snapshot_t *s, const char *conf, size_t capacity) {
  ms_replay_device_t d = run_whatif(s, conf, capacity);
  cr_assert(d.replayed.valid, "%s at %zu", conf, capacity);
  return d.replayed.ooms == 0 && d.replayed.start_short == 0;
}

static void expect_usage_eq(const ms_replay_usage_t *a, const ms_replay_usage_t *b,
                            const char *what) {
  cr_expect_eq(a->valid, b->valid, "%s: valid", what);
  cr_expect_eq(a->peak_reserved, b->peak_reserved, "%s: peak_reserved", what);
  cr_expect_eq(a->peak_reserved_index, b->peak_reserved_index, "%s", what);
  cr_expect_eq(a->peak_allocated, b->peak_allocated, "%s: peak_allocated", what);
  cr_expect_eq(a->peak_allocated_index, b->peak_allocated_index, "%s", what);
  cr_expect_eq(a->peak_requested, b->peak_requested, "%s", what);
  cr_expect_eq(a->unallocated_at_peak_reserved, b->unallocated_at_peak_reserved, "%s", what);
  cr_expect_eq(a->device_mallocs, b->device_mallocs, "%s: device_mallocs", what);
  cr_expect_eq(a->device_frees, b->device_frees, "%s: device_frees", what);
  cr_expect_eq(a->alloc_retries, b->alloc_retries, "%s: alloc_retries", what);
  cr_expect_eq(a->ooms, b->ooms, "%s: ooms", what);
  cr_expect_eq(a->final_reserved, b->final_reserved, "%s", what);
  cr_expect_eq(a->final_allocated, b->final_allocated, "%s", what);
  cr_expect_eq(a->start_reserved, b->start_reserved, "%s", what);
  cr_expect_eq(a->start_short, b->start_short, "%s", what);
  cr_expect_eq(a->first_oom_index, b->first_oom_index, "%s: first_oom_index", what);
  cr_expect_eq(a->first_oom_size, b->first_oom_size, "%s", what);
  cr_expect_str_eq(a->oom_message, b->oom_message, "%s", what);
}

/* The prepared device's what-if against ms_replay_run's, on the capacities given. */
static void expect_whatifs_agree(const ms_snapshot_t *s, const char *name) {
  ms_replay_prepared_t *p = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_replay_prepare(s, 0, &p, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_replay_prepared_result(p)->verdict, MS_REPLAY_PASS, "%s: %s", name,
               ms_replay_prepared_result(p)->reason);
  for (size_t c = 0; c < NCONFIGS; c++) {
    size_t caps[3] = {0, 200 * MiB, 400 * MiB};
    for (int k = 0; k < 3; k++) {
      char what[200];
      snprintf(what, sizeof what, "%s, '%s' at %zu MiB", name, configs[c], caps[k] / MiB);
      ms_replay_device_t want = run_whatif(s, configs[c], caps[k]);
      ms_replay_options_t o;
      ms_replay_options_init(&o);
      o.whatif = true;
      o.config = configs[c];
      o.capacity = caps[k];
      o.recorded_capacity = o.inferred_capacity = false;
      ms_replay_device_t got;
      cr_assert_eq(ms_replay_prepared_whatif(p, &o, &got, &eb), MS_OK, "%s: %s", what, eb.msg);
      cr_expect_eq(got.verdict, want.verdict, "%s", what);
      cr_expect_eq(got.allocs, want.allocs, "%s: allocs", what);
      cr_expect_eq(got.capacity, want.capacity, "%s: capacity", what);
      cr_expect_eq(got.capacity_source, want.capacity_source, "%s", what);
      cr_expect_eq(got.recorded_ooms, want.recorded_ooms, "%s", what);
      expect_usage_eq(&got.recorded, &want.recorded, what);
      expect_usage_eq(&got.replayed, &want.replayed, what);
    }
  }
  ms_replay_prepared_free(p);
}

Test(replay_prepared, whatif_is_replay_runs, .timeout = 120) {
  ms_snapshot_t *a = fragmenting(), *b = ends_on_oom();
  expect_whatifs_agree(a, "fragmenting");
  expect_whatifs_agree(b, "ends on an OOM");
  ms_snapshot_free(a);
  ms_snapshot_free(b);
}

/* The answer against a scan of every 2 MiB step from `from` to the unlimited run's peak (or the
 * answer, when that is more): where
 * every capacity from the smallest that fits upwards fits (a larger device never did worse), the
 * answer is that smallest one; elsewhere it fits and 2 MiB less does not. @return whether the scan
 * was monotone. */
static bool expect_min_capacity(const ms_snapshot_t *s, const char *conf, const char *name,
                                size_t from) {
  size_t cap = 0, cap2 = 0;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_replay_min_capacity(s, 0, conf, &cap, &eb), MS_OK, "%s '%s': %s", name, conf,
               eb.msg);
  ms_replay_prepared_t *p = NULL;
  cr_assert_eq(ms_replay_prepare(s, 0, &p, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_replay_prepared_min_capacity(p, conf, &cap2, &eb), MS_OK, "%s", eb.msg);
  ms_replay_prepared_free(p);
  cr_expect_eq(cap2, cap, "%s '%s': prepared %zu, alone %zu", name, conf, cap2, cap);
  cr_assert_eq(cap % PAGE, 0, "%s '%s': %zu", name, conf, cap);
  cr_expect(fits(s, conf, cap), "%s '%s': no fit at its answer %zu", name, conf, cap);
  cr_expect(!fits(s, conf, cap - PAGE), "%s '%s': a fit under its answer %zu", name, conf, cap);
  size_t top = (size_t)run_whatif(s, conf, 0).replayed.peak_reserved;
  top = (top + PAGE - 1) / PAGE * PAGE;
  if (top < cap) top = cap; /* expandable segments may need more than the unlimited run mapped */
  size_t smallest = 0;
  bool monotone = true, prev_fit = false;
  for (size_t c = from; c <= top; c += PAGE) {
    bool f = fits(s, conf, c);
    if (f && !smallest) smallest = c;
    if (prev_fit && !f) monotone = false;
    prev_fit = f;
  }
  cr_assert_neq(smallest, 0, "%s '%s': nothing fits up to the unlimited peak", name, conf);
  if (monotone)
    cr_expect_eq(cap, smallest, "%s '%s': %zu MiB, the scan %zu MiB", name, conf, cap / MiB,
                 smallest / MiB);
  return monotone;
}

Test(replay_prepared, min_capacity_is_the_scans, .timeout = 300) {
  ms_snapshot_t *a = fragmenting(), *b = ends_on_oom();
  int monotone = 0;
  for (size_t c = 0; c < NCONFIGS; c++) {
    monotone += expect_min_capacity(a, configs[c], "fragmenting", 2 * PAGE);
    monotone += expect_min_capacity(b, configs[c], "ends on an OOM", 2 * PAGE);
  }
  /* the table means something only where the scans are monotone: most of them are */
  cr_log_info("%d monotone scans of %zu", monotone, 2 * NCONFIGS);
  cr_expect_geq(monotone, (int)NCONFIGS, "%d monotone scans of %zu", monotone, 2 * NCONFIGS);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
}

/* The OOM the trace ends on asked for 900 MiB with blocks alive: a device without that OOM holds
 * both, so it is at least that large, which the unlimited run's peak_allocated (the request served
 * and released at once) does not show. */
Test(replay_prepared, min_capacity_counts_the_oom_request, .timeout = 120) {
  ms_snapshot_t *s = ends_on_oom();
  const ms_snap_trace_t *last = NULL;
  for (size_t i = 0; i < s->ntrace; i++)
    if (s->trace[i].action == MS_TRACE_OOM) last = &s->trace[i];
  cr_assert(last != NULL);
  cr_assert_eq(last->size, 900 * MiB);
  cr_expect_eq(s->trace[s->ntrace - 1].action, MS_TRACE_SNAPSHOT); /* then the snapshot's entry */
  ms_replay_device_t u = run_whatif(s, "", 0);
  cr_expect_lt(u.replayed.peak_allocated, 900 * MiB);
  size_t cap = 0;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_replay_min_capacity(s, 0, "", &cap, &eb), MS_OK, "%s", eb.msg);
  cr_expect_geq(cap, 900 * MiB, "%zu", cap);
  cr_expect_leq(cap, (size_t)u.replayed.peak_reserved, "%zu", cap);
  ms_snapshot_free(s);
}

/* Several threads replay on one prepared device at once: each what-if and search gives what it
 * gives alone. */
typedef struct thr_s {
  const ms_replay_prepared_t *p;
  size_t k;
  ms_replay_device_t d;
  size_t cap;
  int rc;
} thr_t;

static void *thr_run(void *arg) {
  thr_t *t = arg;
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  o.config = configs[t->k % NCONFIGS];
  o.capacity = 300 * MiB;
  ms_errbuf_t eb;
  t->rc = ms_replay_prepared_whatif(t->p, &o, &t->d, &eb);
  if (t->rc == MS_OK) t->rc = ms_replay_prepared_min_capacity(t->p, o.config, &t->cap, &eb);
  return NULL;
}

Test(replay_prepared, threads_share_one_device, .timeout = 120) {
  ms_snapshot_t *s = fragmenting();
  ms_replay_prepared_t *p = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_replay_prepare(s, 0, &p, &eb), MS_OK, "%s", eb.msg);
  enum { N = 8 };
  thr_t t[N], alone[N];
  pthread_t th[N];
  for (size_t k = 0; k < N; k++) {
    alone[k] = (thr_t){p, k, {0}, 0, 0};
    thr_run(&alone[k]);
    cr_assert_eq(alone[k].rc, MS_OK);
    t[k] = (thr_t){p, k, {0}, 0, 0};
  }
  for (size_t k = 0; k < N; k++)
    cr_assert_eq(pthread_create(&th[k], NULL, thr_run, &t[k]), 0);
  for (size_t k = 0; k < N; k++)
    pthread_join(th[k], NULL);
  for (size_t k = 0; k < N; k++) {
    char what[64];
    snprintf(what, sizeof what, "thread %zu", k);
    cr_expect_eq(t[k].rc, MS_OK, "%s", what);
    cr_expect_eq(t[k].cap, alone[k].cap, "%s", what);
    expect_usage_eq(&t[k].d.replayed, &alone[k].d.replayed, what);
  }
  ms_replay_prepared_free(p);
  ms_snapshot_free(s);
}

/* A trace that cannot be replayed is prepared, says why, and the calls answer as the public
 * ones do. */
Test(replay_prepared, unreplayable_says_why, .timeout = 30) {
  ms_backend_t *be;
  cr_assert_eq(ms_backend_sim_create(NULL, &be), MS_OK);
  ms_allocator_config_t ac = {.backend = be};
  ms_allocator_t *al;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_allocator_create(&ac, &al, &eb), MS_OK, "%s", eb.msg);
  ms_devptr_t x;
  cr_assert_eq(ms_allocator_malloc(al, 4 * MiB, 0, &x), MS_OK); /* a segment, no history */
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms_allocator_snapshot(&al, 1, &s, &eb), MS_OK, "%s", eb.msg);
  ms_allocator_destroy(al);
  ms_backend_destroy(be);
  ms_replay_prepared_t *p = NULL;
  cr_assert_eq(ms_replay_prepare(s, 0, &p, &eb), MS_OK, "%s", eb.msg);
  const ms_replay_device_t *d = ms_replay_prepared_result(p);
  cr_expect_eq(d->verdict, MS_REPLAY_UNREPLAYABLE);
  ms_replay_report_t *rep = NULL;
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  cr_assert_eq(ms_replay_run(s, &o, &rep, &eb), MS_OK, "%s", eb.msg);
  cr_expect_str_eq(d->reason, rep->devices[0].reason);
  ms_replay_report_free(rep);
  size_t cap = 7;
  cr_expect_eq(ms_replay_prepared_min_capacity(p, "", &cap, &eb), MS_ENOTFOUND);
  cr_expect(strstr(eb.msg, "not replayable") != NULL, "%s", eb.msg);
  cr_expect_eq(cap, 7);
  cr_expect_eq(ms_replay_prepare(s, 1, &p, &eb), MS_EINVAL);
  ms_replay_prepared_free(p);
  ms_snapshot_free(s);
}

/* ms_replay_run() with the devices prepared gives the report it gives without; a preparation of
 * another snapshot, or of another device, is refused. */
Test(replay_prepared, run_with_preparations, .timeout = 60) {
  ms_snapshot_t *s = fragmenting(), *other = ends_on_oom();
  ms_replay_prepared_t *p = NULL, *q = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_replay_prepare(s, 0, &p, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_replay_prepare(other, 0, &q, &eb), MS_OK, "%s", eb.msg);
  for (size_t c = 0; c < NCONFIGS; c++) {
    ms_replay_options_t o;
    ms_replay_options_init(&o);
    o.whatif = true;
    o.config = configs[c];
    o.capacity = 250 * MiB;
    ms_replay_report_t *with = NULL, *without = NULL;
    cr_assert_eq(ms_replay_run(s, &o, &without, &eb), MS_OK, "%s", eb.msg);
    const ms_replay_prepared_t *preps[1] = {p};
    o.prepared = preps;
    o.nprepared = 1;
    cr_assert_eq(ms_replay_run(s, &o, &with, &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(with->ndevices, without->ndevices);
    expect_usage_eq(&with->devices[0].replayed, &without->devices[0].replayed, configs[c]);
    expect_usage_eq(&with->devices[0].recorded, &without->devices[0].recorded, configs[c]);
    cr_expect_eq(with->devices[0].verdict, without->devices[0].verdict);
    cr_expect_eq(with->devices[0].capacity, without->devices[0].capacity);
    ms_replay_report_free(with);
    ms_replay_report_free(without);
  }
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  const ms_replay_prepared_t *wrong[1] = {q};
  o.prepared = wrong;
  o.nprepared = 1;
  ms_replay_report_t *rep = (ms_replay_report_t *)0x1;
  cr_expect_eq(ms_replay_run(s, &o, &rep, &eb), MS_EINVAL);
  cr_expect_str_eq(eb.msg, "the preparation given for device 0 is another snapshot's");
  cr_expect_eq(rep, (ms_replay_report_t *)0x1, "out-parameter touched on failure");
  const ms_replay_prepared_t *shifted[2] = {NULL, p};
  o.prepared = shifted;
  o.nprepared = 2;
  cr_expect_eq(ms_replay_run(s, &o, &rep, &eb), MS_EINVAL);
  cr_expect_str_eq(eb.msg, "the preparation given for device 1 is another device's");
  /* a check ignores them */
  o.whatif = false;
  o.prepared = wrong;
  o.nprepared = 1;
  cr_assert_eq(ms_replay_run(s, &o, &rep, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(rep->devices[0].verdict, MS_REPLAY_PASS);
  ms_replay_report_free(rep);
  /* absent arguments */
  ms_replay_device_t d;
  size_t cap = 0;
  cr_expect_eq(ms_replay_prepare(NULL, 0, &p, &eb), MS_EINVAL);
  cr_expect_eq(ms_replay_prepared_whatif(NULL, &o, &d, &eb), MS_EINVAL);
  cr_expect_eq(ms_replay_prepared_whatif(p, NULL, &d, &eb), MS_EINVAL);
  cr_expect_eq(ms_replay_prepared_min_capacity(NULL, "", &cap, &eb), MS_EINVAL);
  cr_expect_eq(ms_replay_prepared_min_capacity(p, "", NULL, &eb), MS_EINVAL);
  cr_expect_null(ms_replay_prepared_result(NULL));
  /* a bad setting is the what-if's error, the preparation unchanged */
  o.whatif = true;
  o.config = "max_split_size_mb:1";
  cr_expect_eq(ms_replay_prepared_whatif(p, &o, &d, &eb), MS_ECONFIG);
  cr_expect(strstr(eb.msg, "max_split_size_mb") != NULL, "%s", eb.msg);
  cr_expect_eq(ms_replay_prepared_min_capacity(p, "max_split_size_mb:1", &cap, &eb), MS_ECONFIG);
  cr_expect_eq(cap, 0);
  ms_replay_prepared_free(p);
  ms_replay_prepared_free(q);
  ms_replay_prepared_free(NULL);
  ms_snapshot_free(s);
  ms_snapshot_free(other);
}
