/* SPDX-License-Identifier: MIT
 * memsnap core: which trace entries' stacks a read of a PyTorch pickle may leave out
 * (MS_LOAD_NO_FREE_STACKS, memsnap/serialize.h; the reader's vocabulary: pickle_internal.h).
 *
 * The time index (lib/timeline) gives a block the stack of its alloc, and uses the stack of its
 * free_completed only when the alloc is not in the trace; it never uses a free_requested's. It
 * pairs a free_completed with the alloc open at its address in the same device's trace (the last
 * alloc there with no free_completed since). The reader keeps the same pairs, in trace order, so
 * that the frees of a block whose alloc it has seen get no stack: PyTorch records a block's
 * free_requested and free_completed with one frames list, memo-shared, so both go together. A
 * decision taken when an entry's frames came (its action and address known by then, as PyTorch
 * writes them) is checked again when the entry is complete, with the fields it ended with: after
 * the SETITEMS that filled its dict (an entry is one SETITEMS in the files Python writes; a
 * second one fails the check), or else when it is stored into its device's list. The entries
 * must complete in trace order, in the list they were made for. Where any of this does not hold
 * the read fails with MS_EUNSUPPORTED and the loader reads the file again in full.
 *
 * A load for a window of the trace (ms_snapshot_load_window, snapshot/load_window.h) runs with
 * these rules and adds its own: an entry after the window's end (its index in its device's list,
 * or an earlier entry of the list past the window's end time) drops the stack of an alloc too,
 * and of any free of an alloc in the trace; only the window's rules drop stacks before its end
 * unless the caller asked for MS_LOAD_NO_FREE_STACKS. An entry's index is its record's distance
 * from its list's first record, known from the entries accounted before it (trace order). A time
 * at or before the window's end after one past it fails the read as above.
 */
#include <stdlib.h>

#include "snapshot/load_window.h"
#include "snapshot/pickle_internal.h"

/* Slot of (list, addr): the empty slot where it would go when absent. */
static size_t dp_slot(const rd_drop_set_t *s, uint32_t list, uint64_t addr) {
  uint64_t h = (addr ^ ((uint64_t)list << 47)) * 0x9E3779B97F4A7C15ull;
  size_t m = s->cap - 1, i = (size_t)(h >> 32) & m;
  while (s->slot[i].used && (s->slot[i].addr != addr || s->slot[i].list != list)) i = (i + 1) & m;
  return i;
}

static int dp_grow(rd_drop_set_t *s) {
  size_t cap = s->cap ? s->cap * 2 : 256;
  rd_drop_slot_t *old = s->slot;
  size_t ocap = s->cap;
  s->slot = calloc(cap, sizeof *s->slot);
  if (!s->slot) {
    s->slot = old;
    return MS_ENOMEM;
  }
  s->cap = cap;
  for (size_t i = 0; i < ocap; i++)
    if (old[i].used) s->slot[dp_slot(s, old[i].list, old[i].addr)] = old[i];
  free(old);
  return MS_OK;
}

static bool dp_has(const rd_drop_set_t *s, uint32_t list, uint64_t addr) {
  return s->cap && s->slot[dp_slot(s, list, addr)].used;
}

static int dp_put(rd_drop_set_t *s, uint32_t list, uint64_t addr) {
  if ((s->len + 1) * 2 > s->cap && dp_grow(s)) return MS_ENOMEM;
  rd_drop_slot_t *e = &s->slot[dp_slot(s, list, addr)];
  if (!e->used) s->len++;
  *e = (rd_drop_slot_t){addr, list, 1};
  return MS_OK;
}

/* Linear probing's deletion: the entries after the hole that would be found before it move in. */
static void dp_del(rd_drop_set_t *s, uint32_t list, uint64_t addr) {
  if (!s->cap) return;
  size_t m = s->cap - 1, i = dp_slot(s, list, addr);
  if (!s->slot[i].used) return;
  s->slot[i].used = 0;
  s->len--;
  for (size_t j = (i + 1) & m; s->slot[j].used; j = (j + 1) & m) {
    rd_drop_slot_t e = s->slot[j];
    s->slot[j].used = 0;
    s->slot[dp_slot(s, e.list, e.addr)] = e;
  }
}

/* Whether trace entry t of device list `list`, not yet accounted, lies after window lw's end. */
static bool dp_after_window(const rd_t *r, const ms__load_window_t *lw, const ms_snap_trace_t *t,
                            uint32_t list) {
  bool same = lw->have_list && lw->list == list;
  if (lw->w.kind == MS_LOAD_WINDOW_TIMES) return same && lw->late;
  const rd_drop_set_t *s = &r->drop_set;
  uint32_t rec = (uint32_t)(t - r->b.trace.ptr);
  uint32_t first = same ? lw->first_rec : s->accounted ? s->last_rec + 1 : 0;
  return rec >= first && rec - first > lw->w.last_entry;
}

bool ms__pickle_drop_free(const rd_t *r, const ms_snap_trace_t *t, uint32_t list) {
  if (!r->drop_free) return false;
  const ms__load_window_t *lw = r->window;
  bool is_free = t->action == MS_TRACE_FREE_REQUESTED || t->action == MS_TRACE_FREE_COMPLETED;
  if (!is_free && (!lw || t->action != MS_TRACE_ALLOC)) return false;
  if (lw && !lw->free_stacks && !dp_after_window(r, lw, t, list)) return false;
  if (lw && !is_free) return dp_after_window(r, lw, t, list);
  return dp_has(&r->drop_set, list, t->addr);
}

/* The window's bookkeeping of entry t of `list`, accounted now (after the checks that use the
 * state before it). */
static int dp_window_account(ms__load_window_t *lw, const ms_snap_trace_t *t, uint32_t rec,
                             uint32_t list) {
  if (!lw->have_list || lw->list != list) {
    lw->have_list = true;
    lw->list = list;
    lw->first_rec = rec;
    lw->late = false;
  }
  if (lw->w.kind != MS_LOAD_WINDOW_TIMES || !(t->present & MS_TRACE_HAS_TIME)) return MS_OK;
  if (t->time_us > lw->w.last_time_us) {
    lw->late = true;
  } else if (lw->late) {
    return MS_EUNSUPPORTED; /* not in time order past the window: its end is not known yet */
  }
  return MS_OK;
}

int ms__pickle_drop_account(rd_t *r, uint32_t rec, uint32_t list, bool dropped) {
  if (!r->drop_free) return MS_OK;
  rd_drop_set_t *s = &r->drop_set;
  if (s->accounted && rec != s->last_rec + 1) return MS_EUNSUPPORTED; /* not in trace order */
  s->accounted = true;
  s->last_rec = rec;
  const ms_snap_trace_t *t = &r->b.trace.ptr[rec];
  if (dropped && !ms__pickle_drop_free(r, t, list)) return MS_EUNSUPPORTED;
  ms__load_window_t *lw = r->window;
  if (lw && dp_window_account(lw, t, rec, list) != MS_OK) return MS_EUNSUPPORTED;
  if (t->action == MS_TRACE_ALLOC) return dp_put(&r->drop_set, list, t->addr);
  if (t->action == MS_TRACE_FREE_COMPLETED) dp_del(&r->drop_set, list, t->addr);
  return MS_OK;
}

void ms__pickle_drop_init(rd_t *r, unsigned flags) {
  if (!r->skip_trace && (flags & MS_LOAD_NO_TRACE_STACKS))
    r->drop_actions |= 1u << MS_TRACE_ALLOC | 1u << MS_TRACE_FREE_REQUESTED |
                       1u << MS_TRACE_FREE_COMPLETED | 1u << MS_TRACE_SEGMENT_ALLOC |
                       1u << MS_TRACE_SEGMENT_FREE | 1u << MS_TRACE_OOM;
  r->drop_free =
      !r->skip_trace && (flags & (MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS)) != 0;
  r->window = ms__load_window_current();
  /* a stack is read again from the file: only from one the read maps (in a window, the allocs
   * before its end: those after it have none) */
  r->defer = !r->skip_trace && (flags & MS_LOAD_DEFER_STACKS) &&
             !(flags & MS_LOAD_NO_TRACE_STACKS) && r->map_fd >= 0;
  r->watch = r->defer ? ms__defer_watch_current(&r->watch_ctx) : NULL;
}

void ms__pickle_drop_release(rd_t *r) {
  free(r->drop_set.slot);
  r->drop_set = (rd_drop_set_t){0};
  ms__defer_locs_free(&r->dloc);
}

/* ---- stacks left for later (MS_LOAD_DEFER_STACKS) -------------------------------------------- */

bool ms__pickle_defer_note(rd_t *r, uint32_t rec, uint64_t off) {
  return ms__defer_locs_note(&r->dloc, rec, off);
}

int ms__pickle_defer_finish(rd_t *r, ms_snapshot_t *snap) {
  if (!r->defer || r->dloc.n == 0) return MS_OK;
  if (r->defer_broken) {
    r->cannot_skip = true;
    return ms__pickle_err(r, MS_EUNSUPPORTED,
                          "a frame's memo entry is stored again, so the trace's stacks cannot be "
                          "read later");
  }
  /* the frame each memo index holds (frame dicts are never freed: pickle_retire.c) */
  MS_VEC(uint32_t) memo = {0}, frame = {0};
  int rc = MS_OK;
  const uint8_t *tag = r->memo_tag.ptr;
  for (size_t i = 0; i < r->memo.len && rc == MS_OK; i++) {
    if (tag[i] != V_OBJ) continue;
    const rd_obj_t *o = &r->objs.ptr[r->memo_obj.ptr[i]];
    if (o->role != R_FRAME || !(o->flags & OF_INTERNED)) continue;
    if (MS_VEC_PUSH(&memo, (uint32_t)i) || MS_VEC_PUSH(&frame, o->ref)) rc = MS_ENOMEM;
  }
  if (rc == MS_OK) {
    rc = ms__deferred_attach(snap, r->map_fd, r->map_size, &r->dloc, memo.ptr, frame.ptr, memo.len,
                             r->eb);
  } else {
    rc = ms__pickle_err(r, MS_ENOMEM, "out of memory");
  }
  MS_VEC_FREE(&memo);
  MS_VEC_FREE(&frame);
  return rc;
}
