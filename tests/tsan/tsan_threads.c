/* SPDX-License-Identifier: MIT
 * tsan_threads: the threaded paths of the allocator API and of `memsnap run`'s recorder, as a
 * plain program, so that `make test TSAN=1` runs them under ThreadSanitizer (Criterion's test
 * runner cannot start under TSan: its inheritable arena conflicts with TSan's memory layout,
 * Criterion issue #274). In an ordinary build it is a quick smoke test of the same paths.
 *
 *   history  two threads allocate and free while the main thread switches the history recording
 *            on, off, between context levels and unwinders, and takes snapshots
 *            (ms_allocator_record_history stores the hooks' context_level and trace_enabled
 *            while the allocator reads them: issue #35 item 10)
 *   record   eight threads record allocations and frees in the interposer's recorder
 *            (lib/interpose/record.c, linked in with tests/run/record_stubs.c) while the main
 *            thread builds snapshots of it
 *   csv      the CSV export (lib/export/csv.c), whose trace table is written on a second thread
 *            while the first writes the others, over a snapshot with a recorded history, its
 *            files compressed by a pool of three threads; then that pool's writer
 *            (lib/export/pgzip.c) alone: two streams, each written by a thread of its own, in
 *            hundreds of small chunks on one pool
 *   attr     four threads ask one classifier (lib/attribution) the category of every alloc
 *            entry's block and of the blocks alive at steps, so that its cache of the entries'
 *            categories is built (after ATTR_DIRECT_MAX answers found alone) while the others
 *            read: every answer is an eager classifier's
 *   series   four threads ask one time index for its series (made on first use under the
 *            index's lock, issue #33), peaks over ranges (walks) and totals at steps at once:
 *            every series is one array, equal to that of an index that made it alone
 *   stackcode  the cache's stack frames writer (lib/cache/stackcode.c) on four threads, its lanes
 *            counted and written side by side: the bytes one thread writes
 *   compare  two threads each read a snapshot file (a pickle, a memsnap file) and add it as one
 *            side of one comparison (ms_compare_add_side, as `memsnap compare` reads its two
 *            files): the comparison of both read in turn
 *   devices  a time index of three large devices built on three threads (lib/timeline/index.c,
 *            ms__tl_build), and again with a memory budget of one build at a time: the peaks of
 *            one thread's build
 *   replay   four threads run what-ifs and smallest-capacity searches under six settings on one
 *            device prepared once (ms_replay_prepare, as explain's remedies do): each
 *            answer is the one the public calls give alone
 * Exits 0 when every check held; ThreadSanitizer makes it exit 66 on a report.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "cache/internal.h"
#include "export/pgzip.h"
#include "interpose/run_internal.h"
#include "memsnap/allocator.h"
#include "memsnap/backend.h"
#include "memsnap/compare.h"
#include "memsnap/export.h"
#include "memsnap/history.h"
#include "memsnap/pickle.h"
#include "memsnap/replay.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"
#include "timeline/internal.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "tsan_threads: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);      \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static ms_allocator_t *tt_alloc;
static atomic_int tt_running;

static void *tt_history_worker(void *arg) {
  (void)arg;
  ms_devptr_t live[8] = {0};
  for (int i = 0; atomic_load(&tt_running) && i < 100000; i++) {
    int k = i % 8;
    if (live[k]) CHECK(ms_allocator_free(tt_alloc, live[k]) == MS_OK);
    CHECK(ms_allocator_malloc(tt_alloc, 512 * (size_t)(1 + i % 16), 0, &live[k]) == MS_OK);
  }
  for (int k = 0; k < 8; k++)
    if (live[k]) CHECK(ms_allocator_free(tt_alloc, live[k]) == MS_OK);
  return NULL;
}

static void tt_history(void) {
  ms_backend_t *be = NULL;
  ms_sim_config_t c = {.ndevices = 1, .capacity = (size_t)1 << 30};
  CHECK(ms_backend_sim_create(&c, &be) == MS_OK);
  ms_allocator_config_t ac = {.backend = be, .device = 0, .alloc = NULL};
  ms_errbuf_t eb = {0};
  CHECK(ms_allocator_create(&ac, &tt_alloc, &eb) == MS_OK);
  atomic_store(&tt_running, 1);
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    CHECK(pthread_create(&th[i], NULL, tt_history_worker, NULL) == 0);
  for (int i = 0; i < 60; i++) {
    ms_history_config_t hc;
    ms_history_config_init(&hc);
    hc.enabled = (ms_history_record)(i % 3);
    hc.context = (ms_history_context)(i % 4);
    hc.max_entries = 1 + (size_t)(i * 37) % 500;
    hc.unwinder = i % 2 ? MS_UNWIND_FRAME_POINTER : MS_UNWIND_BACKTRACE;
    CHECK(ms_allocator_record_history(tt_alloc, &hc, &eb) == MS_OK);
    if (i % 10 == 0) {
      ms_snapshot_t *s = NULL;
      CHECK(ms_allocator_snapshot(&tt_alloc, 1, &s, &eb) == MS_OK);
      ms_snapshot_free(s);
    }
  }
  atomic_store(&tt_running, 0);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  ms_allocator_destroy(tt_alloc);
  ms_backend_destroy(be);
}

#define TT_THREADS 8
#define TT_PAIRS 2000

static void *tt_record_worker(void *arg) {
  uint64_t base = 0x7f0000000000ULL + ((uint64_t)(uintptr_t)arg << 32);
  for (uint64_t i = 0; i < TT_PAIRS; i++) {
    uint64_t addr = base + (i % 64) * 4096;
    uint32_t stack = ms__run_stack(0);
    ms__run_on_alloc((int)((uintptr_t)arg % 2), addr, 4096 + i, 0, NULL, stack,
                     MS__RUN_KIND_MALLOC);
    uint64_t begin = ms__run_free_begin();
    ms__run_free_end(addr, begin, true);
  }
  ms__run_on_alloc(0, base + 0x100000, 1 << 20, 0, NULL, 0, MS__RUN_KIND_MALLOC);
  return NULL;
}

static void tt_record(void) {
  setenv("MEMSNAP_RUN_SIGNAL", "0", 1);
  setenv("MEMSNAP_RUN_QUIET", "1", 1);
  setenv("MEMSNAP_RUN_STACKS", "8", 1);
  ms__run_start();
  pthread_t th[TT_THREADS];
  for (uintptr_t t = 0; t < TT_THREADS; t++)
    CHECK(pthread_create(&th[t], NULL, tt_record_worker, (void *)t) == 0);
  for (int i = 0; i < 5; i++) {
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {0};
    CHECK(ms__run_take(-1, &s, &eb) == MS_OK);
    ms_snapshot_free(s);
  }
  for (int t = 0; t < TT_THREADS; t++)
    pthread_join(th[t], NULL);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {0};
  CHECK(ms__run_take(-1, &s, &eb) == MS_OK);
  CHECK(s->nsegments == TT_THREADS);
  ms_snapshot_free(s);
  ms__run_stop(); /* no exit snapshot */
}

static int tt_count(void *ctx, const char *buf, size_t len) {
  (void)buf;
  *(size_t *)ctx += len;
  return 0;
}

typedef struct tt_pgz_s {
  ms__pgz_t *z;
  int err;
} tt_pgz_t;

/* 300 chunks of 5,000 bytes of text into one stream. */
static void *tt_pgz_writer(void *arg) {
  tt_pgz_t *t = arg;
  char *buf = ms__pgz_buffer(t->z);
  for (int i = 0; i < 300 && buf && t->err == MS_OK; i++) {
    for (int k = 0; k < 5000; k++) buf[k] = (char)('a' + (i * 7 + k % 13) % 26);
    t->err = ms__pgz_write(t->z, &buf, 5000);
  }
  if (t->err == MS_OK) t->err = ms__pgz_finish(t->z);
  free(buf);
  return NULL;
}

static void tt_pgz(void) {
  ms__pgz_pool_t *pool = NULL;
  CHECK(ms__pgz_pool_create(3, 1, &pool) == MS_OK);
  size_t bytes[2] = {0, 0};
  ms_sink_t sink[2] = {{tt_count, &bytes[0]}, {tt_count, &bytes[1]}};
  tt_pgz_t t[2] = {{NULL, MS_OK}, {NULL, MS_OK}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) CHECK(ms__pgz_create(pool, &sink[i], 5000, &t[i].z) == MS_OK);
  for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, tt_pgz_writer, &t[i]) == 0);
  for (int i = 0; i < 2; i++) {
    CHECK(pthread_join(th[i], NULL) == 0);
    CHECK(t[i].err == MS_OK);
    CHECK(bytes[i] > 18);
    ms__pgz_destroy(t[i].z);
  }
  ms__pgz_pool_destroy(pool);
}

/* A snapshot of the simulated allocator: 2000 allocations, with a trace. */
static ms_snapshot_t *tt_sim_snapshot(void) {
  ms_backend_t *be = NULL;
  ms_sim_config_t c = {.ndevices = 1, .capacity = (size_t)1 << 30};
  CHECK(ms_backend_sim_create(&c, &be) == MS_OK);
  ms_allocator_config_t ac = {.backend = be, .device = 0, .alloc = NULL};
  ms_errbuf_t eb = {0};
  ms_allocator_t *a = NULL;
  CHECK(ms_allocator_create(&ac, &a, &eb) == MS_OK);
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.enabled = MS_HISTORY_ALL;
  CHECK(ms_allocator_record_history(a, &hc, &eb) == MS_OK);
  ms_devptr_t live[16] = {0};
  for (int i = 0; i < 2000; i++) {
    int k = i % 16;
    if (live[k]) CHECK(ms_allocator_free(a, live[k]) == MS_OK);
    CHECK(ms_allocator_malloc(a, 512 * (size_t)(1 + i % 64), 0, &live[k]) == MS_OK);
  }
  ms_snapshot_t *s = NULL;
  CHECK(ms_allocator_snapshot(&a, 1, &s, &eb) == MS_OK);
  for (int k = 0; k < 16; k++)
    if (live[k]) CHECK(ms_allocator_free(a, live[k]) == MS_OK);
  ms_allocator_destroy(a);
  ms_backend_destroy(be);
  return s;
}

static void tt_csv(void) {
  ms_snapshot_t *s = tt_sim_snapshot();
  ms_errbuf_t eb = {0};
  ms_timeline_t *tl = NULL;
  CHECK(ms_timeline_create(s, NULL, &tl, &eb) == MS_OK);
  size_t bytes[MS_EXPORT_CSV_NFILES] = {0};
  ms_sink_t sink[MS_EXPORT_CSV_NFILES], *sinks[MS_EXPORT_CSV_NFILES];
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) {
    sink[k] = (ms_sink_t){tt_count, &bytes[k]};
    sinks[k] = &sink[k];
  }
  ms_export_csv_t *x = NULL;
  CHECK(ms_export_csv_create(sinks, 1, &x, &eb) == MS_OK);
  CHECK(ms_export_csv_jobs(x, 3, &eb) == MS_OK);
  for (int i = 0; i < 3; i++)
    CHECK(ms_export_csv_add(x, s, tl, "tsan", true, i, NULL, &eb) == MS_OK);
  CHECK(ms_export_csv_rows(x, MS_EXPORT_CSV_TRACE) == 3 * s->ntrace);
  CHECK(ms_export_csv_finish(x, &eb) == MS_OK);
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) CHECK(bytes[k] > 0);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

typedef struct tt_attr_s {
  const ms_timeline_t *tl;
  const ms_attr_t *lazy, *eager;
  int bad;
} tt_attr_t;

static void *tt_attr_worker(void *arg) {
  tt_attr_t *t = arg;
  const tl_dev_t *td = &t->tl->dev[0];
  for (size_t i = 0; i < td->n; i++) {
    if (td->trace[i].action != MS_TRACE_ALLOC) continue;
    int64_t fe = td->pair[i] == TL_NONE ? -1 : (int64_t)td->pair[i];
    if (ms__attr_classify(t->lazy, 0, (int64_t)i, fe, td->trace[i].stack, td->trace[i].addr,
                          false) != ms_attr_entry_category(t->eager, 0, i))
      t->bad++;
  }
  for (size_t step = 0; step <= td->n; step += td->n / 7 + 1) {
    ms_tl_state_t st;
    ms_timeline_state_init(&st);
    if (ms_timeline_state_at(t->tl, 0, step, &st) != MS_OK) t->bad++;
    for (size_t b = 0; b < st.nblocks; b++)
      if (ms_attr_block_category(t->lazy, 0, &st.blocks[b]) !=
          ms_attr_block_category(t->eager, 0, &st.blocks[b]))
        t->bad++;
    ms_timeline_state_release(&st);
  }
  return NULL;
}

static void tt_attr(void) {
  ms_snapshot_t *s = tt_sim_snapshot();
  ms_errbuf_t eb = {0};
  ms_timeline_t *tl = NULL;
  CHECK(ms_timeline_create(s, NULL, &tl, &eb) == MS_OK);
  ms_attr_t *lazy = NULL, *eager = NULL;
  CHECK(ms_attr_create(s, tl, NULL, &lazy, &eb) == MS_OK);
  CHECK(ms_attr_create(s, tl, NULL, &eager, &eb) == MS_OK);
  CHECK(ms__attr_ecat_ready(eager, 0));
  CHECK(atomic_load(&lazy->dev[0].ecat_ready) == 0);
  tt_attr_t t[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    t[i] = (tt_attr_t){tl, lazy, eager, 0};
    CHECK(pthread_create(&th[i], NULL, tt_attr_worker, &t[i]) == 0);
  }
  for (int i = 0; i < 4; i++) {
    CHECK(pthread_join(th[i], NULL) == 0);
    CHECK(t[i].bad == 0);
  }
  CHECK(atomic_load(&lazy->dev[0].ecat_ready) == 1); /* 4 x 2000 asked: the cache was built */
  ms_attr_destroy(eager);
  ms_attr_destroy(lazy);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

typedef struct tt_series_s {
  const ms_timeline_t *tl;
  const uint64_t *got[MS_TL_METRIC_COUNT];
  int bad;
} tt_series_t;

static void *tt_series_worker(void *arg) {
  tt_series_t *t = arg;
  size_t n = ms_timeline_nentries(t->tl, 0);
  for (int m = MS_TL_METRIC_COUNT; m-- > 0;) {
    ms_tl_peak_t p;
    uint64_t tot[MS_TL_METRIC_COUNT];
    if (ms_timeline_peak(t->tl, 0, (ms_tl_metric)m, n / 3, n / 2, &p) != MS_OK) t->bad++;
    if (ms_timeline_totals_at(t->tl, 0, n / 5, tot) != MS_OK) t->bad++;
    t->got[m] = ms_timeline_series(t->tl, 0, (ms_tl_metric)m);
    if (!t->got[m] || t->got[m][n / 5] != tot[m]) t->bad++;
  }
  return NULL;
}

static void tt_series(void) {
  ms_snapshot_t *s = tt_sim_snapshot();
  ms_errbuf_t eb = {0};
  ms_timeline_t *tl = NULL, *ref = NULL;
  CHECK(ms_timeline_create(s, NULL, &tl, &eb) == MS_OK);
  CHECK(ms_timeline_create(s, NULL, &ref, &eb) == MS_OK);
  tt_series_t t[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    t[i] = (tt_series_t){tl, {NULL}, 0};
    CHECK(pthread_create(&th[i], NULL, tt_series_worker, &t[i]) == 0);
  }
  size_t n = ms_timeline_nentries(tl, 0);
  for (int i = 0; i < 4; i++) {
    CHECK(pthread_join(th[i], NULL) == 0);
    CHECK(t[i].bad == 0);
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
      CHECK(t[i].got[m] == t[0].got[m]);
      CHECK(memcmp(t[i].got[m], ms_timeline_series(ref, 0, (ms_tl_metric)m),
                   (n + 1) * sizeof(uint64_t)) == 0);
    }
  }
  ms_timeline_destroy(ref);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

/* The stack frames' writer of the cache (lib/cache/stackcode.c) on four threads: its lanes count
 * into maps of their own, then write into buffers of their own from one shared map. */
static void tt_stackcode(void) {
  enum { N = 200000 };
  uint16_t *idx = malloc(N * sizeof *idx);
  CHECK(idx);
  uint64_t x = 1;
  for (size_t i = 0; i < N; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    idx[i] = (uint16_t)(i % 7 ? (x >> 40) % 500 : i % 50);
  }
  ms_snapshot_t s;
  memset(&s, 0, sizeof s);
  s.stack_frames16 = idx;
  s.nstack_frames = N;
  s.nframes = 500;
  unsigned char *b[2];
  size_t len[2];
  for (int k = 0; k < 2; k++) {
    ms__cache_sc_threads = k ? 4 : 1;
    cache_out_t o = {.fd = -1};
    CHECK((o.chunk = malloc(CACHE_SUM_CHUNK)) != NULL);
    bool nomem = false;
    CHECK(ms__cache_w_stack_frames(&o, &s, &nomem));
    ms__cache_out_flush(&o);
    free(o.chunk);
    b[k] = o.mem;
    len[k] = o.mem_len;
  }
  ms__cache_sc_threads = 0;
  CHECK(len[0] == len[1] && memcmp(b[0], b[1], len[0]) == 0);
  free(b[0]);
  free(b[1]);
  free(idx);
}

typedef struct tt_side_s {
  ms_compare_build_t *b;
  int k;
  const char *path;
  int rc;
} tt_side_t;

static void *tt_side_worker(void *arg) {
  tt_side_t *t = arg;
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {0};
  t->rc = ms_snapshot_load_ex(t->path, MS_LOAD_NO_FREE_STACKS, &s, &eb);
  if (t->rc == MS_OK) t->rc = ms_compare_add_side(t->b, t->k, s, NULL, &eb);
  ms_snapshot_free(s);
  return NULL;
}

static void tt_compare(void) {
  ms_snapshot_t *s = tt_sim_snapshot();
  char dir[] = "/tmp/tsan-compare-XXXXXX";
  CHECK(mkdtemp(dir));
  char path[2][64];
  snprintf(path[0], sizeof path[0], "%s/before.pickle", dir);
  snprintf(path[1], sizeof path[1], "%s/after.msnap", dir);
  ms_errbuf_t eb = {0};
  CHECK(ms_pickle_write_file(s, path[0], &eb) == MS_OK);
  CHECK(ms_snapshot_write_file(s, path[1], NULL, &eb) == MS_OK);
  ms_compare_t *alone = NULL, *both = NULL;
  CHECK(ms_compare_run(s, s, NULL, &alone, &eb) == MS_OK);
  ms_compare_build_t *b = NULL;
  CHECK(ms_compare_begin(NULL, &b) == MS_OK);
  tt_side_t t[2];
  pthread_t th[2];
  for (int k = 0; k < 2; k++) {
    t[k] = (tt_side_t){b, 1 - k, path[1 - k], -1};
    CHECK(pthread_create(&th[k], NULL, tt_side_worker, &t[k]) == 0);
  }
  for (int k = 0; k < 2; k++) {
    CHECK(pthread_join(th[k], NULL) == 0);
    CHECK(t[k].rc == MS_OK);
  }
  CHECK(ms_compare_finish(b, &both) == MS_OK);
  for (int k = 0; k < 2; k++)
    CHECK(both->side[k].peak_allocated == alone->side[k].peak_allocated);
  CHECK(both->nsource == alone->nsource && both->nleaks == alone->nleaks);
  ms_compare_free(alone);
  ms_compare_free(both);
  for (int k = 0; k < 2; k++)
    remove(path[k]);
  remove(dir);
  ms_snapshot_free(s);
}

/* Three devices past TL_PAR_MIN entries, their indexes built on three threads (index.c,
 * ms__tl_build), then every device's peaks asked against one thread's build. */
static void tt_devices(void) {
  ms_backend_t *be = NULL;
  ms_sim_config_t c = {.ndevices = 3, .capacity = (size_t)1 << 30};
  CHECK(ms_backend_sim_create(&c, &be) == MS_OK);
  ms_errbuf_t eb = {0};
  ms_allocator_t *a[3] = {NULL};
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.enabled = MS_HISTORY_ALL;
  hc.max_entries = (size_t)1 << 20;
  for (int d = 0; d < 3; d++) {
    ms_allocator_config_t ac = {.backend = be, .device = d, .alloc = NULL};
    CHECK(ms_allocator_create(&ac, &a[d], &eb) == MS_OK);
    CHECK(ms_allocator_record_history(a[d], &hc, &eb) == MS_OK);
    ms_devptr_t live[16] = {0};
    for (int i = 0; i < (int)TL_PAR_MIN / 2 + 1000 * d; i++) {
      int k = i % 16;
      if (live[k]) CHECK(ms_allocator_free(a[d], live[k]) == MS_OK);
      CHECK(ms_allocator_malloc(a[d], 512 * (size_t)(1 + (i * 7 + d) % 64), 0, &live[k]) == MS_OK);
    }
  }
  ms_snapshot_t *s = NULL;
  CHECK(ms_allocator_snapshot(a, 3, &s, &eb) == MS_OK);
  for (int d = 0; d < 3; d++) {
    CHECK(s->devices[d].ntrace >= TL_PAR_MIN);
    ms_allocator_destroy(a[d]);
  }
  ms_backend_destroy(be);
  /* one thread; three; three with a budget of one build at a time (the others wait) */
  static const size_t runs[3][2] = {{1, 0}, {3, 0}, {3, 1}};
  ms_timeline_t *tl[3] = {NULL, NULL, NULL};
  for (int t = 0; t < 3; t++) {
    CHECK(ms__tl_alloc(s, NULL, &tl[t], &eb) == MS_OK);
    CHECK(ms__tl_build(tl[t], runs[t][0], runs[t][1], &eb) == MS_OK);
  }
  for (int t = 1; t < 3; t++)
    for (size_t d = 0; d < 3; d++)
      for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
        ms_tl_peak_t p, q;
        size_t n = ms_timeline_nentries(tl[0], d);
        CHECK(ms_timeline_peak(tl[0], d, (ms_tl_metric)m, 0, n, &p) == MS_OK);
        CHECK(ms_timeline_peak(tl[t], d, (ms_tl_metric)m, 0, n, &q) == MS_OK);
        CHECK(p.bytes == q.bytes && p.step == q.step);
      }
  for (int t = 0; t < 3; t++)
    ms_timeline_destroy(tl[t]);
  ms_snapshot_free(s);
}

typedef struct tt_rp_s {
  const ms_replay_prepared_t *p;
  atomic_size_t next;
  ms_replay_usage_t use[6];
  size_t cap[6];
  int rc[6];
} tt_rp_t;

static const char *const tt_rp_configs[6] = {
    "", "expandable_segments:True", "max_split_size_mb:20", "garbage_collection_threshold:0.6",
    "roundup_power2_divisions:4", "expandable_segments:True,garbage_collection_threshold:0.6"};

/* The what-if of setting k on a 200 MiB device. */
static ms_replay_options_t tt_rp_options(size_t k) {
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  o.config = tt_rp_configs[k];
  o.capacity = 200u << 20;
  o.recorded_capacity = o.inferred_capacity = false;
  return o;
}

static void *tt_rp_worker(void *arg) {
  tt_rp_t *j = arg;
  for (size_t k; (k = atomic_fetch_add(&j->next, 1)) < 6;) {
    ms_replay_options_t o = tt_rp_options(k);
    ms_replay_device_t d;
    ms_errbuf_t eb;
    j->rc[k] = ms_replay_prepared_whatif(j->p, &o, &d, &eb);
    j->use[k] = d.replayed;
    if (j->rc[k] == MS_OK)
      j->rc[k] = ms_replay_prepared_min_capacity(j->p, o.config, &j->cap[k], &eb);
  }
  return NULL;
}

static void tt_replay(void) {
  ms_backend_t *be = NULL;
  ms_sim_config_t c = {.capacity = (size_t)1 << 34};
  CHECK(ms_backend_sim_create(&c, &be) == MS_OK);
  ms_errbuf_t eb = {0};
  ms_allocator_t *a = NULL;
  ms_allocator_config_t ac = {.backend = be, .alloc = NULL};
  CHECK(ms_allocator_create(&ac, &a, &eb) == MS_OK);
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.enabled = MS_HISTORY_ALL;
  CHECK(ms_allocator_record_history(a, &hc, &eb) == MS_OK);
  for (int step = 0; step < 12; step++) { /* a cache that fragments: the OOM path below 2x */
    ms_devptr_t big[4], keep;
    for (int i = 0; i < 4; i++)
      CHECK(ms_allocator_malloc(a, (size_t)(20 + step) << 20, 0, &big[i]) == MS_OK);
    CHECK(ms_allocator_malloc(a, (size_t)3 << 20, 0, &keep) == MS_OK);
    for (int i = 0; i < 4; i++) CHECK(ms_allocator_free(a, big[i]) == MS_OK);
  }
  ms_snapshot_t *s = NULL;
  CHECK(ms_allocator_snapshot(&a, 1, &s, &eb) == MS_OK);
  ms_allocator_destroy(a);
  ms_backend_destroy(be);
  ms_replay_prepared_t *p = NULL;
  CHECK(ms_replay_prepare(s, 0, &p, &eb) == MS_OK);
  tt_rp_t j = {.p = p};
  atomic_init(&j.next, 0);
  pthread_t th[4];
  for (int t = 0; t < 4; t++) CHECK(pthread_create(&th[t], NULL, tt_rp_worker, &j) == 0);
  for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
  for (size_t k = 0; k < 6; k++) {
    CHECK(j.rc[k] == MS_OK);
    ms_replay_options_t o = tt_rp_options(k);
    ms_replay_report_t *rep = NULL;
    CHECK(ms_replay_run(s, &o, &rep, &eb) == MS_OK);
    const ms_replay_usage_t *u = &rep->devices[0].replayed;
    CHECK(u->peak_reserved == j.use[k].peak_reserved && u->ooms == j.use[k].ooms &&
          u->device_mallocs == j.use[k].device_mallocs);
    ms_replay_report_free(rep);
    size_t cap = 0;
    CHECK(ms_replay_min_capacity(s, 0, tt_rp_configs[k], &cap, &eb) == MS_OK);
    CHECK(cap == j.cap[k]);
  }
  ms_replay_prepared_free(p);
  ms_snapshot_free(s);
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all";
  if (!strcmp(what, "history") || !strcmp(what, "all")) tt_history();
  if (!strcmp(what, "record") || !strcmp(what, "all")) tt_record();
  if (!strcmp(what, "csv") || !strcmp(what, "all")) {
    tt_csv();
    tt_pgz();
  }
  if (!strcmp(what, "attr") || !strcmp(what, "all")) tt_attr();
  if (!strcmp(what, "series") || !strcmp(what, "all")) tt_series();
  if (!strcmp(what, "stackcode") || !strcmp(what, "all")) tt_stackcode();
  if (!strcmp(what, "compare") || !strcmp(what, "all")) tt_compare();
  if (!strcmp(what, "devices") || !strcmp(what, "all")) tt_devices();
  if (!strcmp(what, "replay") || !strcmp(what, "all")) tt_replay();
  printf("tsan_threads: %s: ok\n", what);
  return 0;
}
