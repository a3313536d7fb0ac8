/* SPDX-License-Identifier: MIT
 * memsnap core: explain's remedies (memsnap/explain.h, docs/explain.md): the settings an OOM
 * message or a user would try, each replayed at the device's capacity (memsnap/replay.h) on a
 * worker thread, their smallest capacities found by bisection, ordered by benefit; and the one
 * recommendation those replays back.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "explain/internal.h"

#define EX_MAX_REMEDIES 12

/* The remedies, the recorded settings first: expandable segments, max_split_size_mb at three
 * values around the request (PyTorch refuses values under 20), the garbage collection threshold,
 * power-of-two rounding, and the combinations of the threshold with the first two. */
static size_t ex_configs(const ms_explain_t *x, char cfg[EX_MAX_REMEDIES][128]) {
  size_t n = 0;
  snprintf(cfg[n++], 128, "%s", "");
  snprintf(cfg[n++], 128, "%s", "expandable_segments:True");
  uint64_t req_mb = x->has_request ? (x->request_rounded + EX_MIB - 1) / EX_MIB : 0;
  uint64_t v[3] = {req_mb / 2, req_mb, req_mb * 2}, last = 0;
  size_t nv = 0;
  for (size_t i = 0; i < 3; i++) {
    uint64_t m = v[i] < 20 ? 20 : v[i] > (1ull << 40) ? (1ull << 40) : v[i];
    if (m <= last) m = last ? last * 2 : 20;
    last = m;
    snprintf(cfg[n++], 128, "max_split_size_mb:%" PRIu64, m);
    nv++;
  }
  snprintf(cfg[n++], 128, "%s", "garbage_collection_threshold:0.6");
  snprintf(cfg[n++], 128, "%s", "roundup_power2_divisions:4");
  snprintf(cfg[n++], 128, "%s", "expandable_segments:True,garbage_collection_threshold:0.6");
  snprintf(cfg[n++], 128, "%s,garbage_collection_threshold:0.6", cfg[2 + nv / 2]);
  return n;
}

typedef struct ex_job_s {
  const ms_snapshot_t *snap;
  const ms_explain_options_t *o;
  const ms_explain_t *x;
  const ms_replay_prepared_t *prep; /* the device prepared once for every remedy; NULL: prep_rc */
  int prep_rc;
  ms_errbuf_t prep_eb;
  ms_explain_remedy_t *r;
  size_t n;
  atomic_size_t next;
  int err; /* the first MS_ENOMEM */
  pthread_mutex_t lock;
} ex_job_t;

static void ex_replay_one(ex_job_t *j, ms_explain_remedy_t *r) {
  const ms_explain_t *x = j->x;
  ms_replay_options_t ro;
  ms_replay_options_init(&ro);
  ro.whatif = true;
  ro.config = r->config;
  ro.device = (int)x->device;
  ro.capacity = (size_t)x->capacity;
  ro.recorded_capacity = ro.inferred_capacity = false; /* x->capacity says it, 0 = unlimited */
  ms_replay_device_t dev;
  ms_errbuf_t eb = {{0}};
  int rc = j->prep_rc;
  if (j->prep)
    rc = ms_replay_prepared_whatif(j->prep, &ro, &dev, &eb);
  else
    eb = j->prep_eb;
  if (rc != MS_OK) {
    snprintf(r->note, sizeof r->note, "not replayed: %.280s", eb.msg[0] ? eb.msg : ms_strerror(rc));
    if (rc == MS_ENOMEM) {
      pthread_mutex_lock(&j->lock);
      j->err = MS_ENOMEM;
      pthread_mutex_unlock(&j->lock);
    }
    return;
  }
  if (dev.verdict == MS_REPLAY_UNREPLAYABLE || !dev.replayed.valid) {
    snprintf(r->note, sizeof r->note, "not replayable: %.280s", dev.reason);
    return;
  }
  const ms_replay_usage_t *u = &dev.replayed;
  r->replayed = true;
  r->peak_reserved = u->peak_reserved;
  r->ooms = u->ooms + (u->start_short > 0);
  r->first_oom_entry = u->first_oom_index;
  r->avoids_oom = x->capacity ? (r->ooms == 0) : -1;
  if (!j->o->min_capacity) return;
  size_t cap = 0;
  rc = ms_replay_prepared_min_capacity(j->prep, r->config, &cap, &eb);
  if (rc == MS_OK) r->min_capacity = cap;
  else snprintf(r->note, sizeof r->note, "no smallest capacity: %.280s",
                eb.msg[0] ? eb.msg : ms_strerror(rc));
}

static void *ex_worker(void *arg) {
  ex_job_t *j = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&j->next, 1);
    if (i >= j->n) return NULL;
    ex_replay_one(j, &j->r[i]);
  }
}

static unsigned ex_threads(const ms_explain_options_t *o, size_t n) {
  long c = o->threads ? (long)o->threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (c < 1) c = 1;
  if ((size_t)c > n) c = (long)n;
  return (unsigned)c;
}

/* Remedies 1.. by benefit: those that avoid the OOM first, then the smaller smallest capacity,
 * then the lower peak; the order of the list on ties (qsort is not stable: idx breaks them). */
typedef struct ex_sorted_s {
  ms_explain_remedy_t r;
  size_t idx;
} ex_sorted_t;

static int ex_remedy_cmp(const void *a, const void *b) {
  const ex_sorted_t *p = a, *q = b;
  if (p->r.replayed != q->r.replayed) return p->r.replayed ? -1 : 1;
  if (p->r.avoids_oom != q->r.avoids_oom) return p->r.avoids_oom > q->r.avoids_oom ? -1 : 1;
  uint64_t mp = p->r.min_capacity ? p->r.min_capacity : UINT64_MAX;
  uint64_t mq = q->r.min_capacity ? q->r.min_capacity : UINT64_MAX;
  if (mp != mq) return mp < mq ? -1 : 1;
  if (p->r.peak_reserved != q->r.peak_reserved)
    return p->r.peak_reserved < q->r.peak_reserved ? -1 : 1;
  return p->idx < q->idx ? -1 : p->idx > q->idx;
}

static void ex_sort(ms_explain_t *x) {
  if (x->nremedies < 3) return;
  ex_sorted_t s[EX_MAX_REMEDIES];
  size_t n = x->nremedies - 1;
  for (size_t i = 0; i < n; i++) s[i] = (ex_sorted_t){x->remedies[i + 1], i};
  qsort(s, n, sizeof *s, ex_remedy_cmp);
  for (size_t i = 0; i < n; i++) x->remedies[i + 1] = s[i].r;
}

#define EX_SZ(v, b) ms__explain_size((v), (b), sizeof(b))

/* The one recommendation, backed by the replays (docs/explain.md, "The recommendation"). */
static void ex_recommend(ms_explain_t *x) {
  char a[32], b[32], c[32];
  const ms_explain_remedy_t *base = &x->remedies[0], *best = NULL;
  for (size_t i = 1; i < x->nremedies && !best; i++)
    if (x->remedies[i].replayed) best = &x->remedies[i];
  char *rec = x->recommendation;
  size_t cap = sizeof x->recommendation;
  if (!base->replayed) {
    snprintf(rec, cap, "no remedy can be proven: the trace cannot be replayed (%s)", base->note);
    return;
  }
  if (!x->capacity) {
    if (best && best->min_capacity && base->min_capacity &&
        best->min_capacity < base->min_capacity)
      snprintf(rec, cap, "the device's size is unknown (pass --capacity), so no remedy can be "
               "proven to avoid an OOM; %s lowers the memory the run needs from %s to %s",
               best->config, EX_SZ(base->min_capacity, a), EX_SZ(best->min_capacity, b));
    else if (base->min_capacity)
      snprintf(rec, cap, "the device's size is unknown (pass --capacity); the run needs %s with "
               "the recorded settings, and no setting tried needs less",
               EX_SZ(base->min_capacity, a));
    else
      snprintf(rec, cap, "the device's size is unknown (pass --capacity): no remedy can be "
               "proven");
    return;
  }
  if (base->avoids_oom == 1 && x->verdict == MS_EXPLAIN_RELEASABLE) {
    snprintf(rec, cap, "the recorded settings replayed at %s do not run out of memory: releasing "
             "the cached segments makes room, which the recorded run did not do; call "
             "torch.cuda.empty_cache() before this step, or set "
             "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6",
             EX_SZ(x->capacity, a));
    return;
  }
  if (base->avoids_oom == 1 && x->moment == MS_EXPLAIN_AT_OOM) {
    snprintf(rec, cap, "the recorded settings replayed at %s do not run out of memory: the OOM "
             "needed memory the snapshot does not show (other processes or allocations outside "
             "the allocator grew); leave headroom or find that memory (nvidia-smi)",
             EX_SZ(x->capacity, a));
    return;
  }
  if (base->avoids_oom == 1) {
    snprintf(rec, cap, "the run fits %s with the recorded settings (it needs %s)",
             EX_SZ(x->capacity, a), base->min_capacity ? EX_SZ(base->min_capacity, b) : "?");
    return;
  }
  if (best && best->avoids_oom == 1) {
    snprintf(rec, cap, "set PYTORCH_CUDA_ALLOC_CONF=%s: replayed at %s it has no OOM (peak "
             "reserved %s%s%s)",
             best->config, EX_SZ(x->capacity, a), EX_SZ(best->peak_reserved, b),
             best->min_capacity ? "; it needs at least " : "",
             best->min_capacity ? EX_SZ(best->min_capacity, c) : "");
    return;
  }
  const ms_explain_remedy_t *least = base;
  for (size_t i = 1; i < x->nremedies; i++) {
    const ms_explain_remedy_t *r = &x->remedies[i];
    if (r->replayed && r->min_capacity && (!least->min_capacity ||
                                           r->min_capacity < least->min_capacity))
      least = r;
  }
  if (least->min_capacity)
    snprintf(rec, cap, "no setting avoids the OOM at %s: the run needs at least %s (%s more, "
             "with %s); make the largest holders smaller (below) or use a larger device",
             EX_SZ(x->capacity, a), EX_SZ(least->min_capacity, b),
             EX_SZ(least->min_capacity > x->capacity ? least->min_capacity - x->capacity : 0, c),
             least->config[0] ? least->config : "the recorded settings");
  else
    snprintf(rec, cap, "no setting avoids the OOM at %s; make the largest holders smaller "
             "(below) or use a larger device", EX_SZ(x->capacity, a));
}

int ms__explain_remedies(const ms_snapshot_t *snap, const ms_explain_options_t *o,
                         ms_explain_t *x) {
  x->replayable = false;
  if (!x->has_trace) {
    snprintf(x->replay_note, sizeof x->replay_note,
             "the snapshot has no allocation trace to replay");
    snprintf(x->recommendation, sizeof x->recommendation,
             "no remedy can be proven without a trace (see the hint below)");
    return MS_OK;
  }
  char cfg[EX_MAX_REMEDIES][128];
  size_t n = ex_configs(x, cfg);
  x->remedies = calloc(n, sizeof *x->remedies);
  if (!x->remedies) return MS_ENOMEM;
  x->nremedies = n;
  for (size_t i = 0; i < n; i++) {
    memcpy(x->remedies[i].config, cfg[i], sizeof cfg[i]);
    x->remedies[i].first_oom_entry = -1;
    x->remedies[i].avoids_oom = -1;
  }
  ex_job_t j = {.snap = snap, .o = o, .x = x, .r = x->remedies, .n = 1, .err = MS_OK};
  /* prepared once: the start state and the check replay serve every remedy's runs */
  ms_replay_prepared_t *prep = NULL;
  j.prep_rc = ms_replay_prepare(snap, (int)x->device, &prep, &j.prep_eb);
  j.prep = prep;
  atomic_init(&j.next, 0);
  pthread_mutex_init(&j.lock, NULL);
  ex_replay_one(&j, &x->remedies[0]); /* the recorded settings: is the trace replayable? */
  if (x->remedies[0].replayed) {
    x->replayable = true;
    j.r = x->remedies + 1;
    j.n = n - 1;
    unsigned nt = ex_threads(o, j.n);
    pthread_t th[EX_MAX_REMEDIES];
    unsigned started = 0;
    for (unsigned t = 1; t < nt; t++)
      if (pthread_create(&th[started], NULL, ex_worker, &j) == 0) started++;
    ex_worker(&j);
    for (unsigned t = 0; t < started; t++) pthread_join(th[t], NULL);
  } else {
    snprintf(x->replay_note, sizeof x->replay_note, "%s", x->remedies[0].note);
    x->nremedies = 1;
  }
  pthread_mutex_destroy(&j.lock);
  ms_replay_prepared_free(prep);
  if (j.err != MS_OK) return j.err;
  ex_sort(x);
  ex_recommend(x);
  return MS_OK;
}
