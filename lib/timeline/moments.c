/* SPDX-License-Identifier: MIT
 * memsnap core: moments of the time index (timeline/internal.h): the state at a step as a
 * snapshot, naming a moment (peak, peak-reserved, an entry, a time), and selecting the segments of
 * the end state by device, stream and pool.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "timeline/internal.h"

/* ---- the state as a snapshot --------------------------------------------------------------- */

int ms_timeline_snapshot_at(const ms_timeline_t *tl, size_t dev, size_t step,
                            const ms_tl_filter_t *filter, ms_snapshot_t **out) {
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(tl, dev, step, &st);
  if (rc != MS_OK) return rc;
  const ms_snapshot_t *src = tl->snap;
  ms_snapshot_t *s = NULL;
  /* at most 2 blocks per live block + 1 per segment */
  size_t nseg = st.nsegments, maxb = 2 * st.nblocks + st.nsegments;
  ms_snap_segment_t *segs = malloc((nseg ? nseg : 1) * sizeof *segs);
  ms_snap_block_t *blks = malloc((maxb ? maxb : 1) * sizeof *blks);
  if (!segs || !blks || ms__snapshot_new_borrowing(src, &s) != MS_OK) {
    free(segs);
    free(blks);
    ms_timeline_state_release(&st);
    return MS_ENOMEM;
  }
  size_t ns = 0, nb = 0, k = 0;
  for (size_t i = 0; i < st.nsegments; i++) {
    const ms_tl_segment_t *g = &st.segments[i];
    uint64_t end = g->address + g->size;
    size_t k0 = k;
    while (k < st.nblocks && st.blocks[k].address < end)
      k++;
    if (!tl_filter_keeps(filter, g)) continue;
    ms_snap_segment_t *o = &segs[ns++];
    memset(o, 0, sizeof *o);
    if (g->snap_segment != TL_NONE && g->snap_segment < src->nsegments)
      *o = src->segments[g->snap_segment];
    o->device = (int64_t)dev;
    o->address = g->address;
    o->total_size = g->size;
    o->stream = g->stream;
    o->pool_id[0] = g->pool_id[0];
    o->pool_id[1] = g->pool_id[1];
    o->is_expandable = g->is_expandable;
    if (g->snap_segment == TL_NONE) {
      o->is_large = g->size > 2 * TL_SMALL_SIZE || g->is_expandable;
      o->stack = g->stack;
      o->present = MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE | MS_SEG_HAS_SEGMENT_TYPE |
                   (g->stack != MS_SNAP_NO_STACK ? MS_SEG_HAS_FRAMES : 0);
    }
    o->allocated_size = o->active_size = o->requested_size = 0;
    o->first_block = (uint32_t)nb;
    uint64_t at = g->address;
    for (size_t j = k0; j <= k; j++) {
      uint64_t next = j < k ? st.blocks[j].address : end;
      if (next > at) { /* a free gap */
        ms_snap_block_t *fb = &blks[nb++];
        memset(fb, 0, sizeof *fb);
        fb->address = at;
        fb->size = next - at;
        fb->state = MS_BLOCK_INACTIVE;
        fb->state_name = "inactive";
        fb->stack = MS_SNAP_NO_STACK;
        fb->present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
      }
      if (j == k) break;
      const ms_tl_block_t *b = &st.blocks[j];
      ms_snap_block_t *ob = &blks[nb++];
      memset(ob, 0, sizeof *ob);
      if (b->snap_block != TL_NONE && b->snap_block < src->nblocks)
        *ob = src->blocks[b->snap_block];
      ob->address = b->address;
      ob->size = b->size;
      ob->requested_size = b->requested_size;
      ob->state = b->state;
      ob->state_name = ms_block_state_name(b->state);
      if (b->snap_block == TL_NONE) {
        ob->stack = b->stack;
        ob->first_history = 0;
        ob->nhistory = 0;
        ob->present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
      }
      if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) o->allocated_size += b->size;
      o->active_size += b->size;
      o->requested_size += b->requested_size;
      at = b->address + b->size;
    }
    o->nblocks = (uint32_t)(nb - o->first_block);
  }
  ms_timeline_state_release(&st);
  s->segments = segs;
  s->nsegments = ns;
  s->blocks = blks;
  s->nblocks = nb;
  *out = s;
  return MS_OK;
}

/* ---- moments ------------------------------------------------------------------------------- */

static bool tl_parse_i64(const char *s, int64_t *out) {
  if (!*s) return false;
  bool neg = *s == '-';
  if (neg) s++;
  if (!*s) return false;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return false;
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  if (v > (uint64_t)INT64_MAX) return false;
  *out = neg ? -(int64_t)v : (int64_t)v;
  return true;
}

int ms_tl_moment_parse(const char *text, ms_tl_moment_t *out, ms_errbuf_t *eb) {
  ms_tl_moment_t m = {MS_TL_MOMENT_PEAK, 0};
  if (!text) return ms__errbuf_set(eb, MS_EINVAL, "empty moment");
  size_t len = strlen(text);
  char buf[64];
  if (strcmp(text, "peak") == 0) {
    m.kind = MS_TL_MOMENT_PEAK;
  } else if (strcmp(text, "peak-reserved") == 0) {
    m.kind = MS_TL_MOMENT_PEAK_RESERVED;
  } else if (strcmp(text, "end") == 0) {
    m.kind = MS_TL_MOMENT_END;
  } else if (strcmp(text, "oom") == 0) {
    m.kind = MS_TL_MOMENT_OOM;
    m.value = 1;
  } else if (strncmp(text, "oom:", 4) == 0) {
    if (!tl_parse_i64(text + 4, &m.value) || m.value < 1 || text[4] == '-') goto bad;
    m.kind = MS_TL_MOMENT_OOM;
  } else if (strncmp(text, "step=", 5) == 0) {
    if (!tl_parse_i64(text + 5, &m.value) || m.value < 0 || text[5] == '-') goto bad;
    m.kind = MS_TL_MOMENT_STEP;
  } else if (strncmp(text, "t=", 2) == 0 && tl_parse_i64(text + 2, &m.value)) {
    m.kind = MS_TL_MOMENT_TIME;
  } else if (len > 2 && len < sizeof buf && strcmp(text + len - 2, "us") == 0) {
    memcpy(buf, text, len - 2);
    buf[len - 2] = 0;
    if (!tl_parse_i64(buf, &m.value)) goto bad;
    m.kind = MS_TL_MOMENT_TIME;
  } else if (tl_parse_i64(text, &m.value) && m.value >= -1) {
    m.kind = MS_TL_MOMENT_ENTRY;
  } else {
    goto bad;
  }
  *out = m;
  return MS_OK;
bad:
  return ms__errbuf_set(eb, MS_EINVAL,
                        "invalid moment '%.100s' (expected peak, peak-reserved, end, oom, "
                        "oom:N, step=N, an entry index such as 123, or a time such as "
                        "t=1700000000123456 or 1700000000123456us)",
                        text);
}

int ms_timeline_moment_step(const ms_timeline_t *tl, size_t dev, const ms_tl_moment_t *m,
                            size_t from, size_t to, size_t *step, ms_errbuf_t *eb) {
  if (dev >= tl->ndev) return ms__errbuf_set(eb, MS_EINVAL, "no device %zu", dev);
  const tl_dev_t *d = &tl->dev[dev];
  if (to > d->n) to = d->n;
  if (from > to) return ms__errbuf_set(eb, MS_EINVAL, "empty range of entries");
  ms_tl_peak_t p;
  switch (m->kind) {
  case MS_TL_MOMENT_PEAK:
  case MS_TL_MOMENT_PEAK_RESERVED:
    if (ms_timeline_peak(tl, dev, m->kind == MS_TL_MOMENT_PEAK ? MS_TL_ALLOCATED : MS_TL_RESERVED,
                         from, to, &p) != MS_OK)
      return ms__errbuf_set(eb, MS_EINVAL, "no peak");
    *step = p.step;
    return MS_OK;
  case MS_TL_MOMENT_END:
    *step = to;
    return MS_OK;
  case MS_TL_MOMENT_ENTRY:
    if (m->value >= (int64_t)d->n)
      return ms__errbuf_set(eb, MS_EINVAL,
                            "entry %" PRId64 " is past the trace of device %zu (%zu entries)",
                            m->value, dev, d->n);
    *step = (size_t)(m->value + 1);
    return MS_OK;
  case MS_TL_MOMENT_OOM: {
    size_t n = ms_snapshot_oom_count(tl->snap, dev);
    ms_tl_oom_t o;
    if (m->value < 1 || (uint64_t)m->value > n ||
        ms_snapshot_oom_at(tl->snap, dev, (size_t)(m->value - 1), &o) != MS_OK) {
      if (n == 0)
        return ms__errbuf_set(eb, MS_EINVAL, "device %zu had no out-of-memory error (no `oom` "
                              "entry in its trace)", dev);
      return ms__errbuf_set(eb, MS_EINVAL, "device %zu had %zu out-of-memory error%s, not %" PRId64,
                            dev, n, n == 1 ? "" : "s", m->value);
    }
    *step = o.entry + 1;
    return MS_OK;
  }
  case MS_TL_MOMENT_STEP: {
    size_t lo, hi;
    int rc = ms_timeline_step_range(tl, dev, m->value, &lo, &hi, eb);
    if (rc != MS_OK) return rc;
    *step = hi;
    return MS_OK;
  }
  case MS_TL_MOMENT_TIME: {
    /* the last entry whose time is <= the moment (times need not be sorted: scan) */
    size_t best = 0;
    bool any = false;
    for (size_t i = 0; i < d->n; i++) {
      const ms_snap_trace_t *e = &d->trace[i];
      if (!(e->present & MS_TRACE_HAS_TIME)) continue;
      any = true;
      if (e->time_us <= m->value) best = i + 1;
    }
    if (!any) return ms__errbuf_set(eb, MS_EINVAL, "the trace of device %zu has no times", dev);
    *step = best;
    return MS_OK;
  }
  }
  return ms__errbuf_set(eb, MS_EINVAL, "invalid moment");
}

/* ---- selecting segments of the end state ---------------------------------------------------- */

int ms_snapshot_select(const ms_snapshot_t *snap, size_t dev, const ms_tl_filter_t *filter,
                       ms_snapshot_t **out) {
  size_t ns = 0, nb = 0;
  for (size_t i = 0; i < snap->nsegments; i++) {
    const ms_snap_segment_t *g = &snap->segments[i];
    if (dev != SIZE_MAX && g->device != (int64_t)dev) continue;
    if (filter && !tl_filter_keeps_snap(filter, g)) continue;
    ns++;
    nb += g->nblocks;
  }
  ms_snapshot_t *s = NULL;
  ms_snap_segment_t *segs = malloc((ns ? ns : 1) * sizeof *segs);
  ms_snap_block_t *blks = malloc((nb ? nb : 1) * sizeof *blks);
  if (!segs || !blks || ms__snapshot_new_borrowing(snap, &s) != MS_OK) {
    free(segs);
    free(blks);
    return MS_ENOMEM;
  }
  ns = nb = 0;
  for (size_t i = 0; i < snap->nsegments; i++) {
    const ms_snap_segment_t *g = &snap->segments[i];
    if (dev != SIZE_MAX && g->device != (int64_t)dev) continue;
    if (filter && !tl_filter_keeps_snap(filter, g)) continue;
    segs[ns] = *g;
    segs[ns].first_block = (uint32_t)nb;
    if (g->nblocks) memcpy(blks + nb, snap->blocks + g->first_block, g->nblocks * sizeof *blks);
    nb += g->nblocks;
    ns++;
  }
  s->segments = segs;
  s->nsegments = ns;
  s->blocks = blks;
  s->nblocks = nb;
  *out = s;
  return MS_OK;
}
