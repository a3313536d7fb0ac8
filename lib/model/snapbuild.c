/* SPDX-License-Identifier: MIT
 * memsnap core: the snapshot builder (see snapbuild.h) and the model's small helpers
 * (action and state names, ms_snapshot_free). */
#include "model/snapbuild.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/internal.h"
#include "common/hash.h"

/* ---- names ---------------------------------------------------------------------------------- */

static const char *const trace_action_names[MS_TRACE_ACTION_COUNT] = {
    [MS_TRACE_ALLOC] = "alloc",
    [MS_TRACE_FREE_REQUESTED] = "free_requested",
    [MS_TRACE_FREE_COMPLETED] = "free_completed",
    [MS_TRACE_SEGMENT_ALLOC] = "segment_alloc",
    [MS_TRACE_SEGMENT_FREE] = "segment_free",
    [MS_TRACE_SEGMENT_MAP] = "segment_map",
    [MS_TRACE_SEGMENT_UNMAP] = "segment_unmap",
    [MS_TRACE_SNAPSHOT] = "snapshot",
    [MS_TRACE_OOM] = "oom",
    [MS_TRACE_ANNOTATE] = "annotate",
    [MS_TRACE_OTHER] = "?",
};

const char *ms_trace_action_name(ms_trace_action a) {
  if ((unsigned)a >= MS_TRACE_ACTION_COUNT) return "?";
  return trace_action_names[a];
}

ms_trace_action ms_trace_action_parse(const char *s) {
  for (int i = 0; i < MS_TRACE_OTHER; i++)
    if (strcmp(s, trace_action_names[i]) == 0) return (ms_trace_action)i;
  return MS_TRACE_OTHER;
}

const char *ms_block_state_name(ms_block_state s) {
  switch (s) {
  case MS_BLOCK_INACTIVE:
    return "inactive";
  case MS_BLOCK_ACTIVE_ALLOCATED:
    return "active_allocated";
  case MS_BLOCK_ACTIVE_PENDING_FREE:
    return "active_pending_free";
  default:
    return "?";
  }
}

ms_block_state ms_block_state_parse(const char *s) {
  if (strcmp(s, "inactive") == 0) return MS_BLOCK_INACTIVE;
  if (strcmp(s, "active_allocated") == 0) return MS_BLOCK_ACTIVE_ALLOCATED;
  if (strcmp(s, "active_pending_free") == 0) return MS_BLOCK_ACTIVE_PENDING_FREE;
  return MS_BLOCK_STATE_OTHER;
}

/* ---- arena ---------------------------------------------------------------------------------- */

struct ms__arena_chunk_s {
  ms__arena_chunk_t *next;
  size_t used, cap;
  char data[];
};

#define ARENA_CHUNK (256u * 1024u)

static char *arena_alloc(ms__snapbuild_t *b, size_t n) {
  ms__arena_chunk_t *c = b->chunks;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > ARENA_CHUNK / 4 ? n : ARENA_CHUNK;
    if (cap > SIZE_MAX - sizeof *c) return NULL;
    ms__arena_chunk_t *nc = malloc(sizeof *nc + cap);
    if (!nc) return NULL;
    nc->used = 0;
    nc->cap = cap;
    if (n > ARENA_CHUNK / 4 && c) {
      /* A large string gets its own chunk behind the current one, which stays open. */
      nc->next = c->next;
      c->next = nc;
    } else {
      nc->next = c;
      b->chunks = nc;
    }
    c = nc;
  }
  char *p = c->data + c->used;
  c->used += n;
  b->arena_bytes += n;
  return p;
}

static void arena_free(ms__arena_chunk_t *c) {
  while (c) {
    ms__arena_chunk_t *n = c->next;
    free(c);
    c = n;
  }
}

/* ---- big tables ----------------------------------------------------------------------------- */

/* The model's big tables (a 1 GB pickle fills a 380 MB table of frame indices) are written once,
 * front to back, into fresh memory: with 4 KiB pages, first-touch page faults were a fifth of the
 * read time on a virtual machine. A table whose allocation reaches BIG_TABLE bytes asks the kernel
 * for transparent huge pages (2 MiB: one fault instead of 512). Advice only: where the kernel
 * ignores it, nothing changes; the memory is still the allocator's (freed with free()), and
 * untouched capacity stays unbacked either way. The advice covers every page the allocation
 * touches: glibc serves big allocations from their own mapping and grows them with mremap, which
 * moves without copying only a mapping that advice has not split. */
#define BIG_TABLE ((size_t)4 << 20)

static void advise_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes < BIG_TABLE) return;
  long pg = sysconf(_SC_PAGESIZE);
  if (pg <= 0 || (pg & (pg - 1))) return;
  uintptr_t a = (uintptr_t)p & ~((uintptr_t)pg - 1);
  uintptr_t e = ((uintptr_t)p + bytes + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
  (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

/* ms__vec_reserve for the builder's tables, with huge-page advice when an allocation grows. */
static int big_reserve(void **ptr, size_t *cap, size_t len, size_t extra, size_t elem) {
  if (extra <= *cap - len) return 0;
  size_t old = *cap;
  if (ms__vec_reserve(ptr, cap, len, extra, elem)) return -1;
  if (*cap != old) advise_huge(*ptr, *cap * elem);
  return 0;
}

#define BIG_RESERVE(v, extra)                                                                      \
  big_reserve((void **)&(v)->ptr, &(v)->cap, (v)->len, (extra), sizeof(*(v)->ptr))

int ms__bigvec_reserve(void **ptr, size_t *cap, size_t len, size_t extra, size_t elem) {
  return ms__big_vec_reserve(ptr, cap, len, extra, elem);
}

/* The largest tables (the trace, the stacks and their frame indices: 390 MB of a 1 GB pickle's
 * model) are ms__big_* arrays, and so are those of the snapshot that takes them (snap_impl_t's
 * big_tables): freed, their pages are kept for the next large arrays of the process (a second
 * file read after the first, as `compare` reads its two) instead of going back to the kernel and
 * being zeroed again when touched (common/internal.h, "bigmem.c"). */
#define BIGMEM_RESERVE(v, extra)                                                                   \
  ((size_t)(extra) <= (v)->cap - (v)->len                                                          \
       ? 0                                                                                         \
       : ms__big_vec_reserve((void **)&(v)->ptr, &(v)->cap, (v)->len, (extra), sizeof(*(v)->ptr)))

/* ---- intern tables -------------------------------------------------------------------------- */

/* Intern tables are open-addressing arrays of 64-bit entries: the high 32 bits hold the key's
 * hash tag (the high half of its 64-bit hash), the low 32 bits index + 1 (0 = empty). Growing the
 * table therefore never re-reads the keys (a stack's frames may be cold in memory: re-hashing them
 * on every doubling cost a fifth of a 1 GB pickle read), and a probe touches a key only when its
 * tag matches. The slot is tag & mask, so tables stay below 2^32 slots. */
#define TAB_TAG(h) ((uint32_t)((h) >> 32))
#define TAB_ENTRY(tag, idx) (((uint64_t)(tag) << 32) | ((uint64_t)(idx) + 1))
#define TAB_INDEX(e) ((uint32_t)(e) - 1)

static int tab_grow(uint64_t **tab, size_t *cap, size_t count) {
  if ((count + 1) * 4 <= *cap * 3) return MS_OK;
  size_t ncap = *cap ? *cap * 2 : 1024;
  if (ncap > ((size_t)1 << 32)) return MS_ELIMIT;
  uint64_t *nt = ms__big_calloc(ncap, sizeof *nt); /* a read's temporary: the index reuses it */
  if (!nt) return MS_ENOMEM;
  for (size_t i = 0; i < *cap; i++) {
    uint64_t e = (*tab)[i];
    if (!e) continue;
    size_t j = (size_t)(e >> 32) & (ncap - 1);
    while (nt[j]) j = (j + 1) & (ncap - 1);
    nt[j] = e;
  }
  ms__big_free(*tab);
  *tab = nt;
  *cap = ncap;
  return MS_OK;
}

static uint64_t hash_str(const char *s, size_t n) { return ms_hash_bytes(s, n, 0x5eed); }

static uint64_t hash_frame(const char *name, const char *file, int64_t line) {
  uint64_t h = ms_hash_bytes(name, strlen(name), 0xf4a3e);
  h = ms_hash_step(h, ms_hash_bytes(file, strlen(file), 0xf11e));
  return ms_hash_step(h, (uint64_t)line);
}

static uint64_t hash_stack(const uint32_t *fr, size_t n) {
  return ms_hash_bytes(fr, n * sizeof *fr, 0x57ac);
}

/* ---- builder -------------------------------------------------------------------------------- */

void ms__snapbuild_init(ms__snapbuild_t *b) {
  memset(b, 0, sizeof *b);
  b->hdr.hostname = "";
  b->hdr.rank = -1;
}

void ms__snapbuild_release(ms__snapbuild_t *b) {
  if (!b) return;
  MS_VEC_FREE(&b->segments);
  MS_VEC_FREE(&b->blocks);
  MS_VEC_FREE(&b->history);
  MS_VEC_FREE(&b->devices);
  ms__big_free(b->trace.ptr);
  MS_VEC_FREE(&b->frames);
  ms__big_free(b->stacks.ptr);
  MS_VEC_FREE(&b->stack_frames);
  ms__big_free(b->sf16.ptr);
  ms__big_free(b->sf32.ptr);
  MS_VEC_FREE(&b->extras);
  ms__big_free(b->extra_tab);
  MS_VEC_FREE(&b->settings);
  MS_VEC_FREE(&b->settings_children);
  MS_VEC_FREE(&b->stats);
  MS_VEC_FREE(&b->annotations);
  MS_VEC_FREE(&b->str_list);
  arena_free(b->chunks);
  ms__big_free(b->frame_tab);
  ms__big_free(b->stack_tab);
  ms__big_free(b->str_tab);
  ms__snapbuild_init(b);
}

int ms__snapbuild_str(ms__snapbuild_t *b, const char *s, size_t len, const char **out) {
  if (len == 0) {
    *out = "";
    return MS_OK;
  }
  uint64_t h = 0;
  size_t slot = 0;
  int intern = len < 256;
  if (intern) {
    if (b->str_list.len >= UINT32_MAX - 1) return MS_ELIMIT;
    MS_FORWARD_IF_ERROR(tab_grow(&b->str_tab, &b->str_tab_cap, b->str_list.len));
    h = hash_str(s, len);
    slot = (size_t)TAB_TAG(h) & (b->str_tab_cap - 1);
    for (uint64_t e; (e = b->str_tab[slot]) != 0; slot = (slot + 1) & (b->str_tab_cap - 1)) {
      if ((uint32_t)(e >> 32) != TAB_TAG(h)) continue;
      const char *c = b->str_list.ptr[TAB_INDEX(e)];
      if (strncmp(c, s, len) == 0 && c[len] == 0) {
        *out = c;
        return MS_OK;
      }
    }
    if (MS_VEC_RESERVE(&b->str_list, 1)) return MS_ENOMEM;
  }
  if (len == SIZE_MAX) return MS_ELIMIT;
  char *p = arena_alloc(b, len + 1);
  if (!p) return MS_ENOMEM;
  memcpy(p, s, len);
  p[len] = 0;
  if (intern) {
    b->str_tab[slot] = TAB_ENTRY(TAB_TAG(h), b->str_list.len);
    b->str_list.ptr[b->str_list.len++] = p;
  }
  *out = p;
  return MS_OK;
}

int ms__snapbuild_frame_owned(ms__snapbuild_t *b, const char *name, const char *filename,
                              int64_t line, uint32_t *out) {
  if (b->frames.len >= UINT32_MAX - 1) return MS_ELIMIT;
  MS_FORWARD_IF_ERROR(tab_grow(&b->frame_tab, &b->frame_tab_cap, b->frames.len));
  size_t mask = b->frame_tab_cap - 1;
  uint32_t tag = TAB_TAG(hash_frame(name, filename, line));
  size_t slot = (size_t)tag & mask;
  for (uint64_t e; (e = b->frame_tab[slot]) != 0; slot = (slot + 1) & mask) {
    if ((uint32_t)(e >> 32) != tag) continue;
    const ms_snap_frame_t *f = &b->frames.ptr[TAB_INDEX(e)];
    if (f->line == line && strcmp(f->name, name) == 0 && strcmp(f->filename, filename) == 0) {
      *out = TAB_INDEX(e);
      return MS_OK;
    }
  }
  ms_snap_frame_t f = {name, filename, line};
  if (MS_VEC_PUSH(&b->frames, f)) return MS_ENOMEM;
  b->frame_tab[slot] = TAB_ENTRY(tag, b->frames.len - 1);
  *out = (uint32_t)b->frames.len - 1;
  return MS_OK;
}

int ms__snapbuild_frame(ms__snapbuild_t *b, const char *name, size_t name_len,
                        const char *filename, size_t filename_len, int64_t line, uint32_t *out) {
  const char *n, *f;
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, name, name_len, &n));
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, filename, filename_len, &f));
  return ms__snapbuild_frame_owned(b, n, f, line, out);
}

/* The committed frame indices first..+n equal frames[0..n). */
static bool stack_equal(const ms__snapbuild_t *b, uint32_t first, const uint32_t *frames,
                        size_t n) {
  if (n == 0) return true; /* the tables may have no storage yet: no pointer into them */
  if (b->sf_wide) return memcmp(b->sf32.ptr + first, frames, n * sizeof *frames) == 0;
  const uint16_t *p = b->sf16.ptr + first;
  for (size_t i = 0; i < n; i++)
    if (p[i] != frames[i]) return false;
  return true;
}

/* Looks stack frames[0..n) up; *slot = where it is, or where it goes when *found is false. */
static int stack_find(ms__snapbuild_t *b, const uint32_t *frames, size_t n, uint64_t hash,
                      uint32_t *tag_out, size_t *slot_out, bool *found) {
  if (b->stacks.len >= UINT32_MAX - 1) return MS_ELIMIT;
  if (n > UINT32_MAX || b->nsf > UINT32_MAX - n) return MS_ELIMIT;
  MS_FORWARD_IF_ERROR(tab_grow(&b->stack_tab, &b->stack_tab_cap, b->stacks.len));
  size_t mask = b->stack_tab_cap - 1;
  uint32_t tag = TAB_TAG(hash);
  size_t slot = (size_t)tag & mask;
  *found = false;
  for (uint64_t e; (e = b->stack_tab[slot]) != 0; slot = (slot + 1) & mask) {
    if ((uint32_t)(e >> 32) != tag) continue;
    const ms_snap_stack_t *st = &b->stacks.ptr[TAB_INDEX(e)];
    if (st->nframes == n && stack_equal(b, st->first, frames, n)) {
      *found = true;
      break;
    }
  }
  *tag_out = tag;
  *slot_out = slot;
  return MS_OK;
}

/* From 2-byte to 4-byte frame indices, once: a frame index of 65,536 or more has come. */
static int stack_widen(ms__snapbuild_t *b, size_t extra) {
  MS_VEC(uint32_t) w = {0};
  if (b->nsf > SIZE_MAX - extra || BIGMEM_RESERVE(&w, b->nsf + extra)) return MS_ENOMEM;
  for (size_t i = 0; i < b->nsf; i++)
    w.ptr[i] = b->sf16.ptr[i];
  w.len = b->nsf;
  ms__big_free(b->sf16.ptr);
  b->sf16.ptr = NULL, b->sf16.len = 0, b->sf16.cap = 0;
  b->sf32.ptr = w.ptr, b->sf32.len = w.len, b->sf32.cap = w.cap;
  b->sf_wide = true;
  return MS_OK;
}

/* Stores frames[0..n) as a new stack (its intern slot found by stack_find). */
static int stack_add(ms__snapbuild_t *b, const uint32_t *fr, size_t n, uint32_t tag, size_t slot,
                     uint32_t *out) {
  uint32_t max = 0;
  for (size_t i = 0; i < n; i++)
    max = fr[i] > max ? fr[i] : max;
  if (!b->sf_wide && max > UINT16_MAX) MS_FORWARD_IF_ERROR(stack_widen(b, n));
  if (BIGMEM_RESERVE(&b->stacks, 1)) return MS_ENOMEM;
  if (b->sf_wide) {
    if (BIGMEM_RESERVE(&b->sf32, n)) return MS_ENOMEM;
    if (n) memcpy(b->sf32.ptr + b->sf32.len, fr, n * sizeof *fr);
    b->sf32.len += n;
  } else {
    if (BIGMEM_RESERVE(&b->sf16, n)) return MS_ENOMEM;
    for (size_t i = 0; i < n; i++) /* (no pointer into sf16 before it has storage) */
      b->sf16.ptr[b->sf16.len + i] = (uint16_t)fr[i];
    b->sf16.len += n;
  }
  if (n && max >= b->stack_frame_bound) b->stack_frame_bound = max + 1;
  ms_snap_stack_t st = {(uint32_t)b->nsf, (uint32_t)n};
  b->nsf += n;
  b->stack_tab[slot] = TAB_ENTRY(tag, b->stacks.len);
  b->stacks.ptr[b->stacks.len++] = st;
  *out = (uint32_t)b->stacks.len - 1;
  return MS_OK;
}

int ms__snapbuild_stack(ms__snapbuild_t *b, const uint32_t *frames, size_t n, uint32_t *out) {
  uint32_t tag;
  size_t slot;
  bool found;
  MS_FORWARD_IF_ERROR(stack_find(b, frames, n, hash_stack(frames, n), &tag, &slot, &found));
  if (found) {
    *out = TAB_INDEX(b->stack_tab[slot]);
    return MS_OK;
  }
  return stack_add(b, frames, n, tag, slot, out);
}

int ms__snapbuild_stack_room(ms__snapbuild_t *b, size_t have, size_t extra, uint32_t **tail) {
  if (have > SIZE_MAX - extra) return MS_ELIMIT;
  if (MS_VEC_RESERVE(&b->stack_frames, have + extra)) return MS_ENOMEM;
  *tail = b->stack_frames.ptr;
  return MS_OK;
}

uint64_t ms__snapbuild_stack_hash(const uint32_t *frames, size_t n) {
  return hash_stack(frames, n);
}

void ms__snapbuild_stack_prefetch(const ms__snapbuild_t *b, uint64_t hash) {
#if defined(__GNUC__) || defined(__clang__)
  if (b->stack_tab_cap)
    __builtin_prefetch(&b->stack_tab[(size_t)TAB_TAG(hash) & (b->stack_tab_cap - 1)]);
#else
  (void)b, (void)hash;
#endif
}

int ms__snapbuild_stack_tail(ms__snapbuild_t *b, size_t n, uint32_t *out) {
  if (n > b->stack_frames.cap) return MS_EINVAL;
  return ms__snapbuild_stack_tail_hashed(b, n, hash_stack(b->stack_frames.ptr, n), out);
}

int ms__snapbuild_stack_tail_hashed(ms__snapbuild_t *b, size_t n, uint64_t h, uint32_t *out) {
  return ms__snapbuild_stack_tail_at(b, 0, n, h, out);
}

int ms__snapbuild_stack_tail_at(ms__snapbuild_t *b, size_t at, size_t n, uint64_t h,
                                uint32_t *out) {
  if (at > b->stack_frames.cap || n > b->stack_frames.cap - at) return MS_EINVAL;
  const uint32_t *fr = b->stack_frames.ptr + at;
  uint32_t tag;
  size_t slot;
  bool found;
  MS_FORWARD_IF_ERROR(stack_find(b, fr, n, h, &tag, &slot, &found));
  if (found) {
    *out = TAB_INDEX(b->stack_tab[slot]);
    return MS_OK;
  }
  return stack_add(b, fr, n, tag, slot, out);
}

/* ---- trace extras --------------------------------------------------------------------------- */

static bool extra_equal(const ms_snap_trace_extra_t *a, const ms_snap_trace_extra_t *b) {
  return a->action_name == b->action_name && a->compile_context == b->compile_context &&
         a->user_metadata == b->user_metadata && a->pool_id[0] == b->pool_id[0] &&
         a->pool_id[1] == b->pool_id[1] && a->category == b->category && a->stream == b->stream;
}

/* ms__snapbuild_trace_extra's answer, found or made (out of line: its callers' common case is
 * the last call's answer, which needs none of this) */
MS_NOINLINE static int trace_extra_find(ms__snapbuild_t *b, ms_snap_trace_t *t,
                                        const ms_snap_trace_extra_t *xin) {
  ms_snap_trace_extra_t x = *xin;
  if (!x.compile_context) x.compile_context = "";
  if (!x.user_metadata) x.user_metadata = "";
  if (!x.category) x.category = "";
  if (x.action_name && t->action != MS_TRACE_OTHER &&
      strcmp(x.action_name, ms_trace_action_name((ms_trace_action)t->action)) == 0)
    x.action_name = NULL;
  if (!x.action_name && !x.compile_context[0] && !x.user_metadata[0] && !x.pool_id[0] &&
      !x.pool_id[1] && !x.category[0] && !x.stream) {
    t->extra = NULL;
    return MS_OK;
  }
  if (t->extra && extra_equal(t->extra, &x)) return MS_OK;
  /* consecutive entries mostly repeat the last combinations (a reader may pass through one
   * while an entry's fields arrive): no hashing then */
  for (int k = 0; k < 2; k++)
    if (b->extra_last[k] && extra_equal(b->extra_last[k], &x)) {
      t->extra = b->extra_last[k];
      return MS_OK;
    }
  /* equal strings share storage when interned (ms__snapbuild_str), so pointers are the key */
  uint64_t h = ms_hash_step(
      ms_hash_step((uint64_t)(uintptr_t)x.action_name, (uint64_t)(uintptr_t)x.compile_context),
      ms_hash_step((uint64_t)(uintptr_t)x.user_metadata,
                   ms_hash_step((uint64_t)x.pool_id[0] ^ x.stream,
                                (uint64_t)x.pool_id[1] ^ (uint64_t)(uintptr_t)x.category)));
  h = ms_hash_bytes(&h, sizeof h, 0xe7a);
  MS_FORWARD_IF_ERROR(tab_grow(&b->extra_tab, &b->extra_tab_cap, b->extras.len));
  size_t mask = b->extra_tab_cap - 1, slot = (size_t)TAB_TAG(h) & mask;
  for (uint64_t e; (e = b->extra_tab[slot]) != 0; slot = (slot + 1) & mask) {
    if ((uint32_t)(e >> 32) != TAB_TAG(h)) continue;
    const ms_snap_trace_extra_t *c = b->extras.ptr[TAB_INDEX(e)];
    if (extra_equal(c, &x)) {
      t->extra = b->extra_last[b->extra_next] = c;
      b->extra_next ^= 1;
      return MS_OK;
    }
  }
  if (b->extras.len >= UINT32_MAX - 1) return MS_ELIMIT;
  char *mem = arena_alloc(b, sizeof x + _Alignof(ms_snap_trace_extra_t));
  if (!mem || MS_VEC_RESERVE(&b->extras, 1)) return MS_ENOMEM;
  uintptr_t al = _Alignof(ms_snap_trace_extra_t);
  ms_snap_trace_extra_t *c = (ms_snap_trace_extra_t *)(((uintptr_t)mem + al - 1) & ~(al - 1));
  *c = x;
  b->extra_tab[slot] = TAB_ENTRY(TAB_TAG(h), b->extras.len);
  b->extras.ptr[b->extras.len++] = c;
  t->extra = b->extra_last[b->extra_next] = c;
  b->extra_next ^= 1;
  return MS_OK;
}

int ms__snapbuild_trace_extra(ms__snapbuild_t *b, ms_snap_trace_t *t,
                              const ms_snap_trace_extra_t *xin) {
  /* a reader gives one entry's fields after another's, mostly the same strings: the answer
   * depends on the fields as given, and on the action only when an action name is given */
  if (b->extra_in_valid && extra_equal(&b->extra_in, xin) &&
      (!xin->action_name || b->extra_in_action == t->action)) {
    t->extra = b->extra_out;
    return MS_OK;
  }
  int rc = trace_extra_find(b, t, xin);
  b->extra_in_valid = rc == MS_OK;
  b->extra_in = *xin;
  b->extra_in_action = t->action;
  b->extra_out = t->extra;
  return rc;
}

#define BUILD_ADD(fn, vec, T, RESERVE)                                                             \
  int fn(ms__snapbuild_t *b, const T *x) {                                                         \
    if (b->vec.len >= UINT32_MAX - 1) return MS_ELIMIT;                                            \
    if (RESERVE(&b->vec, 1)) return MS_ENOMEM;                                                     \
    b->vec.ptr[b->vec.len++] = *x;                                                                 \
    return MS_OK;                                                                                  \
  }

BUILD_ADD(ms__snapbuild_add_segment, segments, ms_snap_segment_t, BIG_RESERVE)
BUILD_ADD(ms__snapbuild_add_block, blocks, ms_snap_block_t, BIG_RESERVE)
BUILD_ADD(ms__snapbuild_add_history, history, ms_snap_history_t, BIG_RESERVE)
BUILD_ADD(ms__snapbuild_add_device, devices, ms_snap_device_t, BIG_RESERVE)
BUILD_ADD(ms__snapbuild_add_trace, trace, ms_snap_trace_t, BIGMEM_RESERVE)
BUILD_ADD(ms__snapbuild_add_stat, stats, ms_snap_kv_t, BIG_RESERVE)
BUILD_ADD(ms__snapbuild_add_annotation, annotations, ms_snap_annotation_t, BIG_RESERVE)
BUILD_ADD(ms__snapbuild_add_setting, settings, ms_snap_kv_t, BIG_RESERVE)

int ms__snapbuild_add_setting_child(ms__snapbuild_t *b, const ms_snap_kv_t *kv, uint32_t *index) {
  if (b->settings_children.len >= UINT32_MAX / 2) return MS_ELIMIT;
  if (MS_VEC_PUSH(&b->settings_children, *kv)) return MS_ENOMEM;
  *index = (uint32_t)b->settings_children.len - 1;
  return MS_OK;
}

/* ---- validation ----------------------------------------------------------------------------- */

static int check_stack_ref(const ms_snapshot_t *s, uint32_t st, const char *what, size_t i,
                           ms_errbuf_t *eb) {
  if (st != MS_SNAP_NO_STACK && st >= s->nstacks)
    return ms__errbuf_set(eb, MS_EFORMAT, "%s %zu refers to stack %u of %zu", what, i, st,
                          s->nstacks);
  return MS_OK;
}

/* ms__snapshot_check; frames_in_range: every entry of stack_frames is known to be below
 * nframes, so the per-frame test (the one pass over the model's largest table) cannot fail. */
static int snapshot_check(const ms_snapshot_t *s, bool frames_in_range, ms_errbuf_t *eb) {
  for (size_t i = 0; i < s->nstacks; i++) {
    const ms_snap_stack_t *st = &s->stacks[i];
    if (st->first > s->nstack_frames || st->nframes > s->nstack_frames - st->first)
      return ms__errbuf_set(eb, MS_EFORMAT, "stack %zu is out of range", i);
    if (frames_in_range) continue;
    for (uint32_t k = 0; k < st->nframes; k++)
      if (ms_snap_frame_index(s, st->first + k) >= s->nframes)
        return ms__errbuf_set(eb, MS_EFORMAT, "stack %zu refers to frame %u of %zu", i,
                              ms_snap_frame_index(s, st->first + k), s->nframes);
  }
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    if (g->first_block > s->nblocks || g->nblocks > s->nblocks - g->first_block)
      return ms__errbuf_set(eb, MS_EFORMAT, "segment %zu: blocks out of range", i);
    MS_FORWARD_IF_ERROR(check_stack_ref(s, g->stack, "segment", i, eb));
  }
  for (size_t i = 0; i < s->nblocks; i++) {
    const ms_snap_block_t *k = &s->blocks[i];
    if (k->first_history > s->nhistory || k->nhistory > s->nhistory - k->first_history)
      return ms__errbuf_set(eb, MS_EFORMAT, "block %zu: history out of range", i);
    MS_FORWARD_IF_ERROR(check_stack_ref(s, k->stack, "block", i, eb));
  }
  for (size_t i = 0; i < s->nhistory; i++)
    MS_FORWARD_IF_ERROR(check_stack_ref(s, s->history[i].stack, "history entry", i, eb));
  for (size_t i = 0; i < s->ndevices; i++) {
    const ms_snap_device_t *d = &s->devices[i];
    if (d->first_trace > s->ntrace || d->ntrace > s->ntrace - d->first_trace)
      return ms__errbuf_set(eb, MS_EFORMAT, "device %zu: trace out of range", i);
    if (d->first_stat > s->nstats || d->nstats > s->nstats - d->first_stat)
      return ms__errbuf_set(eb, MS_EFORMAT, "device %zu: statistics out of range", i);
  }
  for (size_t i = 0; i < s->ntrace; i++)
    MS_FORWARD_IF_ERROR(check_stack_ref(s, s->trace[i].stack, "trace entry", i, eb));
  for (size_t i = 0; i < s->nsettings; i++) {
    const ms_snap_kv_t *kv = &s->settings[i];
    if (kv->kind == MS_SNAP_VAL_MAP &&
        (kv->first > s->nsettings || kv->count > s->nsettings - kv->first ||
         (kv->count && kv->first <= i)))
      return ms__errbuf_set(eb, MS_EFORMAT, "setting '%s': entries out of range", kv->key);
  }
  return MS_OK;
}

int ms__snapshot_check(const ms_snapshot_t *s, ms_errbuf_t *eb) {
  return snapshot_check(s, false, eb);
}

/* ---- finish --------------------------------------------------------------------------------- */

typedef struct snap_impl_s {
  ms__arena_chunk_t *chunks;
  int borrowing; /* every table but segments and blocks belongs to another snapshot */
  int big_tables; /* trace, stacks, stack_frames(16) are ms__big_* arrays (the builder's) */
  void *strings; /* ms__snapshot_adopt: the one malloc'd block its strings live in */
  void *ext;      /* ms__snapshot_set_ext: what a reader keeps with the snapshot */
  void (*ext_free)(ms_snapshot_t *, void *);
} snap_impl_t;

void ms__snapshot_set_ext(ms_snapshot_t *snap, void *ext,
                          void (*ext_free)(ms_snapshot_t *, void *)) {
  snap_impl_t *impl = snap->impl_;
  impl->ext = ext;
  impl->ext_free = ext_free;
}

void *ms__snapshot_ext(const ms_snapshot_t *snap) {
  const snap_impl_t *impl = snap ? snap->impl_ : NULL;
  return impl ? impl->ext : NULL;
}


int ms__snapshot_new_borrowing(const ms_snapshot_t *src, ms_snapshot_t **out) {
  ms_snapshot_t *s = malloc(sizeof *s);
  snap_impl_t *impl = malloc(sizeof *impl);
  if (!s || !impl) {
    free(s);
    free(impl);
    return MS_ENOMEM;
  }
  *s = *src;
  s->segments = NULL, s->nsegments = 0;
  s->blocks = NULL, s->nblocks = 0;
  s->devices = malloc((src->ndevices ? src->ndevices : 1) * sizeof *s->devices);
  if (!s->devices) {
    free(s);
    free(impl);
    return MS_ENOMEM;
  }
  if (src->ndevices) memcpy(s->devices, src->devices, src->ndevices * sizeof *s->devices);
  impl->chunks = NULL;
  impl->borrowing = 1;
  impl->big_tables = 0;
  impl->strings = NULL;
  impl->ext = NULL;
  impl->ext_free = NULL;
  s->impl_ = impl;
  *out = s;
  return MS_OK;
}

int ms__snapshot_adopt(const ms_snapshot_t *tables, void *strings, ms_snapshot_t **out,
                       ms_errbuf_t *eb) {
  int rc = snapshot_check(tables, false, eb);
  if (rc != MS_OK) return rc;
  ms_snapshot_t *s = malloc(sizeof *s);
  snap_impl_t *impl = malloc(sizeof *impl);
  if (!s || !impl) {
    free(s);
    free(impl);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory building the snapshot");
  }
  *s = *tables;
  if (!s->hostname) s->hostname = "";
  impl->chunks = NULL;
  impl->borrowing = 0;
  impl->big_tables = 0;
  impl->strings = strings;
  impl->ext = NULL;
  impl->ext_free = NULL;
  s->impl_ = impl;
  *out = s;
  return MS_OK;
}

int ms__snapbuild_finish(ms__snapbuild_t *b, ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms_snapshot_t *s = malloc(sizeof *s);
  snap_impl_t *impl = malloc(sizeof *impl);
  size_t ntop = b->settings.len, nchild = b->settings_children.len;
  if (!s || !impl || MS_VEC_RESERVE(&b->settings, nchild)) {
    free(s);
    free(impl);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory building the snapshot");
  }
  if (nchild) memcpy(b->settings.ptr + ntop, b->settings_children.ptr, nchild * sizeof(ms_snap_kv_t));
  for (size_t i = 0; i < ntop + nchild; i++)
    if (b->settings.ptr[i].kind == MS_SNAP_VAL_MAP) b->settings.ptr[i].first += (uint32_t)ntop;

  *s = b->hdr;
  s->segments = b->segments.ptr, s->nsegments = b->segments.len;
  s->blocks = b->blocks.ptr, s->nblocks = b->blocks.len;
  s->history = b->history.ptr, s->nhistory = b->history.len;
  s->devices = b->devices.ptr, s->ndevices = b->devices.len;
  s->trace = b->trace.ptr, s->ntrace = b->trace.len;
  s->frames = b->frames.ptr, s->nframes = b->frames.len;
  s->stacks = b->stacks.ptr, s->nstacks = b->stacks.len;
  s->stack_frames = b->sf_wide ? b->sf32.ptr : NULL;
  s->stack_frames16 = b->sf_wide ? NULL : b->sf16.ptr;
  s->nstack_frames = b->nsf;
  s->settings = b->settings.ptr, s->nsettings = ntop + nchild, s->nsettings_top = ntop;
  s->stats = b->stats.ptr, s->nstats = b->stats.len;
  s->annotations = b->annotations.ptr, s->nannotations = b->annotations.len;
  if (!s->hostname) s->hostname = "";
  bool frames_in_range = b->stack_frame_bound <= b->frames.len;
  int rc = snapshot_check(s, frames_in_range, eb);
  if (rc != MS_OK) {
    /* Undo the settings rebase so the builder is as it was. */
    for (size_t i = 0; i < ntop + nchild; i++)
      if (b->settings.ptr[i].kind == MS_SNAP_VAL_MAP) b->settings.ptr[i].first -= (uint32_t)ntop;
    free(s);
    free(impl);
    return rc;
  }
  impl->chunks = b->chunks;
  impl->borrowing = 0;
  impl->big_tables = 1;
  impl->strings = NULL;
  impl->ext = NULL;
  impl->ext_free = NULL;
  s->impl_ = impl;
  /* Ownership moved: forget the pointers without freeing them. */
  b->segments.ptr = NULL, b->blocks.ptr = NULL, b->history.ptr = NULL, b->devices.ptr = NULL;
  b->trace.ptr = NULL, b->frames.ptr = NULL, b->stacks.ptr = NULL;
  b->sf16.ptr = NULL, b->sf32.ptr = NULL;
  b->settings.ptr = NULL, b->stats.ptr = NULL, b->annotations.ptr = NULL;
  b->chunks = NULL;
  ms__snapbuild_release(b);
  *out = s;
  return MS_OK;
}

void ms_snapshot_free(ms_snapshot_t *snap) {
  if (!snap) return;
  snap_impl_t *impl = snap->impl_;
  /* first: it may own the stack tables it grew (and puts back those it replaced) */
  if (impl && impl->ext_free) impl->ext_free(snap, impl->ext);
  bool big = impl && impl->big_tables;
  free(snap->segments);
  free(snap->blocks);
  if (impl && impl->borrowing) {
    free(snap->devices);
    free(impl);
    free(snap);
    return;
  }
  if (impl) {
    arena_free(impl->chunks);
    free(impl->strings);
    free(impl);
  }
  free(snap->history);
  free(snap->devices);
  free(snap->frames);
  if (big) {
    ms__big_free(snap->trace);
    ms__big_free(snap->stacks);
    ms__big_free(snap->stack_frames);
    ms__big_free(snap->stack_frames16);
  } else {
    free(snap->trace);
    free(snap->stacks);
    free(snap->stack_frames);
    free(snap->stack_frames16);
  }
  free(snap->settings);
  free(snap->stats);
  free(snap->annotations);
  free(snap);
}
