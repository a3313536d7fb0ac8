/* SPDX-License-Identifier: MIT
 * libFuzzer target for the PyTorch pickle reader (issue #4). Any input must give MS_OK or a
 * described error, never a crash, a hang or unbounded memory. An accepted input is also written
 * back with the pickle writer and read again, which must succeed with the same counts. Every input
 * is also read without its trace (MS_LOAD_NO_TRACE): never a crash; when the full read succeeds,
 * this one gives the same segments, blocks and history and no trace entries, or MS_EUNSUPPORTED
 * (a value of the trace is shared with a later part). And without the plain entries' stacks
 * (MS_LOAD_NO_TRACE_STACKS) or the frees' (MS_LOAD_NO_FREE_STACKS): never a crash; when the full
 * read succeeds, the same model but for those stacks (entries of other actions keep theirs), or
 * MS_EUNSUPPORTED (a stack left out is needed later).
 * Its trace is also indexed (memsnap/timeline.h): accepted, or refused with a description, and
 * when accepted the viewer's data and the first and peak moments are computed (issue #12).
 *
 * Built and run by scripts/fuzz.sh (make fuzz), seeded with the PyTorch fixtures.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "memsnap/pickle.h"
#include "memsnap/timeline.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz_timeline(const ms_snapshot_t *s) {
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms_timeline_create(s, NULL, &tl, &eb);
  if (rc != MS_OK) {
    if (eb.msg[0] == 0) abort();
    return;
  }
  size_t def = 0;
  if (ms_tl_viewer_devices(s, NULL, 0, &def) > 0) {
    for (int seg = 0; seg < 2; seg++) {
      ms_tlv_t v;
      if (ms_tlv_compute(s, def, seg != 0, 4, 0, SIZE_MAX, NULL, &v) == MS_OK) ms_tlv_release(&v);
    }
  }
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    ms_tl_peak_t p;
    if (ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, SIZE_MAX, &p) != MS_OK) abort();
    size_t steps[2] = {0, p.step};
    for (int k = 0; k < 2; k++) {
      ms_snapshot_t *at = NULL;
      if (ms_timeline_snapshot_at(tl, d, steps[k], NULL, &at) != MS_OK) abort();
      ms_snapshot_free(at);
    }
  }
  ms_timeline_destroy(tl);
}

static bool fz_plain(uint8_t a) {
  return a == MS_TRACE_ALLOC || a == MS_TRACE_FREE_REQUESTED || a == MS_TRACE_FREE_COMPLETED ||
         a == MS_TRACE_SEGMENT_ALLOC || a == MS_TRACE_SEGMENT_FREE || a == MS_TRACE_OOM;
}

static bool fz_free(uint8_t a) {
  return a == MS_TRACE_FREE_REQUESTED || a == MS_TRACE_FREE_COMPLETED;
}

/* The read without some entries' stacks (flags), against the full read s (rc). */
static void fz_no_stacks(const uint8_t *data, size_t size, unsigned flags, int rc,
                         const ms_snapshot_t *s) {
  fz_source_t fs;
  ms_snapshot_t *k = NULL;
  ms_errbuf_t eb = {{0}};
  int rk = ms_pickle_read_ex(fz_source(&fs, fz_in(data, size), 0), flags, &k, &eb);
  if (rk != MS_OK && eb.msg[0] == 0) abort();
  if (rk != MS_OK) {
    if (rc == MS_OK && rk != MS_EUNSUPPORTED) abort();
    return;
  }
  if (!(k->present & MS_SNAP_TRACE_STACKS_SKIPPED)) abort();
  if (rc == MS_OK) {
    if (k->nsegments != s->nsegments || k->nblocks != s->nblocks || k->ntrace != s->ntrace ||
        k->ndevices != s->ndevices)
      abort();
    for (size_t i = 0; i < s->ntrace; i++) {
      const ms_snap_trace_t *a = &s->trace[i], *b = &k->trace[i];
      if (a->action != b->action || a->addr != b->addr || a->size != b->size) abort();
      if (b->stack == MS_SNAP_NO_STACK && a->stack != MS_SNAP_NO_STACK &&
          !(flags == MS_LOAD_NO_TRACE_STACKS ? fz_plain(a->action) : fz_free(a->action)))
        abort();
      if (b->stack != MS_SNAP_NO_STACK &&
          ms_snap_stack_depth(k, b->stack) != ms_snap_stack_depth(s, a->stack))
        abort();
    }
  }
  ms_snapshot_free(k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_source_t fs;
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms_pickle_read(fz_source(&fs, fz_in(data, size), 0), &s, &eb);
  ms_snapshot_t *k = NULL;
  ms_errbuf_t ekb = {{0}};
  int rk = ms_pickle_read_ex(fz_source(&fs, fz_in(data, size), 0), MS_LOAD_NO_TRACE, &k, &ekb);
  if (rk != MS_OK && ekb.msg[0] == 0) abort();
  if (rk == MS_OK) {
    if (k->ntrace != 0 || !(k->present & MS_SNAP_TRACE_SKIPPED)) abort();
    if (rc == MS_OK && (k->nsegments != s->nsegments || k->nblocks != s->nblocks ||
                        k->nhistory != s->nhistory || k->ndevices != s->ndevices))
      abort();
    ms_snapshot_free(k);
  } else if (rc == MS_OK && rk != MS_EUNSUPPORTED) {
    abort();
  }
  fz_no_stacks(data, size, MS_LOAD_NO_TRACE_STACKS, rc, s);
  fz_no_stacks(data, size, MS_LOAD_NO_FREE_STACKS, rc, s);
  if (rc != MS_OK) {
    if (eb.msg[0] == 0) abort(); /* every failure is described */
    return 0;
  }
  fz_timeline(s);
  fz_buf_t out = {0};
  ms_sink_t sink = {fz_buf_write, &out};
  if (ms_pickle_write(s, &sink, &eb) != MS_OK) abort();
  ms_snapshot_t *t = NULL;
  if (ms_pickle_read(fz_source(&fs, fz_in((const uint8_t *)out.p, out.n), 0), &t, &eb) != MS_OK)
    abort();
  if (t->nsegments != s->nsegments || t->nblocks != s->nblocks || t->ntrace != s->ntrace ||
      t->nhistory != s->nhistory)
    abort();
  ms_snapshot_free(t);
  ms_snapshot_free(s);
  free(out.p);
  return 0;
}
