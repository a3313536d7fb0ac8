/* SPDX-License-Identifier: MIT
 * memsnap cache: the flat file format (lib/cache/internal.h): a snapshot to a cache file and back,
 * and the checks that make a damaged or hostile file a refusal instead of a crash.
 *
 * Every record is fixed-width and little-endian but the trace's (varints, decoded once per load:
 * see w_trace); the reader never trusts a count, an offset or an
 * index: a section must lie inside the file, a string offset inside the string table (which ends
 * with a NUL, so every string ends inside it), an enum inside its range, an index inside its table,
 * and the built model passes ms__snapshot_check plus the layout the readers give (each device's
 * trace and each segment's blocks after the previous one's).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/internal.h"
#include "cache/varint.h"
#include "common/internal.h"
#include "memsnap/cache.h"
#include "model/snapbuild.h"

/* record widths */
enum {
  R_SCALARS = 48,
  R_SEGMENT = 96,
  R_BLOCK = 48,
  R_HISTORY = 24,
  R_DEVICE = 40,
  R_TRACE = 44,
  R_EXTRA = 40,
  R_FRAME = 16,
  R_KV = 40,
  R_ANNOTATION = 24,
};

/* ---- writing -------------------------------------------------------------------------------- */

/* The snapshot's writer: the body's stream (cache_out_t) and what it interns. */
typedef struct wbuf_s {
  cache_out_t o;
  uint64_t sect[CACHE_NSECTIONS][2];
  /* strings: the STRINGS section being built, interned by content */
  char *str;
  size_t str_len, str_cap;
  uint64_t *str_tab; /* hash << 32 | (offset + 1); 0: empty */
  size_t str_tab_cap, str_count;
  /* trace extras: pointer -> index */
  const ms_snap_trace_extra_t **extras;
  size_t nextras, extras_cap;
  uintptr_t *ext_tab; /* pointer; index in ext_idx */
  uint32_t *ext_idx;
  size_t ext_tab_cap;
} wbuf_t;

void ms__cache_out_raw(cache_out_t *w, const unsigned char *p, size_t n) {
  if (w->failed || n == 0) return;
  if (w->fd >= 0) {
    while (n) {
      ssize_t k = write(w->fd, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        w->failed = true;
        return;
      }
      p += k;
      n -= (size_t)k;
    }
    return;
  }
  if (w->mem_len + n > w->mem_cap) {
    size_t cap = w->mem_cap ? w->mem_cap : (size_t)1 << 16;
    while (cap < w->mem_len + n) cap *= 2;
    unsigned char *q = realloc(w->mem, cap);
    if (!q) {
      w->failed = true;
      return;
    }
    w->mem = q;
    w->mem_cap = cap;
  }
  memcpy(w->mem + w->mem_len, p, n);
  w->mem_len += n;
}

void ms__cache_out_flush(cache_out_t *w) {
  if (w->fill == 0) return;
  w->sum = ms_hash_step(w->sum, cache_sum(w->chunk, w->fill, 0));
  ms__cache_out_raw(w, w->chunk, w->fill);
  w->fill = 0;
}

void ms__cache_out_put(cache_out_t *w, const void *data, size_t n) {
  const unsigned char *p = data;
  while (n && !w->failed) {
    size_t k = CACHE_SUM_CHUNK - w->fill < n ? CACHE_SUM_CHUNK - w->fill : n;
    memcpy(w->chunk + w->fill, p, k);
    w->fill += k;
    w->pos += k;
    p += k;
    n -= k;
    if (w->fill == CACHE_SUM_CHUNK) ms__cache_out_flush(w);
  }
}

static void w_out(wbuf_t *w, const unsigned char *p, size_t n) {
  ms__cache_out_raw(&w->o, p, n);
}

static void w_flush(wbuf_t *w) {
  ms__cache_out_flush(&w->o);
}

static void w_put(wbuf_t *w, const void *data, size_t n) {
  ms__cache_out_put(&w->o, data, n);
}

/* Little-endian fields; on a little-endian host one unaligned load or store each. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CACHE_LE_HOST 1
#else
#define CACHE_LE_HOST 0
#endif
static inline void put_u8(unsigned char *p, uint8_t v) { p[0] = v; }
static inline void put_u16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}
static inline void put_u32(unsigned char *p, uint32_t v) {
  if (CACHE_LE_HOST) {
    memcpy(p, &v, 4);
    return;
  }
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void put_u64(unsigned char *p, uint64_t v) {
  if (CACHE_LE_HOST) {
    memcpy(p, &v, 8);
    return;
  }
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint16_t get_u16(const unsigned char *p) {
  return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}
static inline uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  if (CACHE_LE_HOST) {
    memcpy(&v, p, 4);
    return v;
  }
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static inline uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  if (CACHE_LE_HOST) {
    memcpy(&v, p, 8);
    return v;
  }
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* The offset of s in the string table (added when new); CACHE_NO_STR and failed on NULL. */
static uint32_t w_str(wbuf_t *w, const char *s) {
  if (!s) {
    w->o.failed = true;
    return CACHE_NO_STR;
  }
  size_t n = strlen(s);
  if ((w->str_count + 1) * 2 > w->str_tab_cap) {
    size_t cap = w->str_tab_cap ? w->str_tab_cap * 2 : 1024;
    uint64_t *t = calloc(cap, sizeof *t);
    if (!t) {
      w->o.failed = true;
      return CACHE_NO_STR;
    }
    for (size_t i = 0; i < w->str_tab_cap; i++) {
      uint64_t e = w->str_tab[i];
      if (!e) continue;
      size_t j = (size_t)(e >> 32) & (cap - 1);
      while (t[j]) j = (j + 1) & (cap - 1);
      t[j] = e;
    }
    free(w->str_tab);
    w->str_tab = t;
    w->str_tab_cap = cap;
  }
  uint64_t h = ms_hash_bytes(s, n, 0) >> 32;
  size_t j = (size_t)h & (w->str_tab_cap - 1);
  for (;; j = (j + 1) & (w->str_tab_cap - 1)) {
    uint64_t e = w->str_tab[j];
    if (!e) break;
    if ((e >> 32) != h) continue;
    uint32_t off = (uint32_t)e - 1;
    if (strcmp(w->str + off, s) == 0) return off;
  }
  if (w->str_len + n + 1 >= CACHE_NO_STR) {
    w->o.failed = true;
    return CACHE_NO_STR;
  }
  if (w->str_len + n + 1 > w->str_cap) {
    size_t cap = w->str_cap ? w->str_cap : 1 << 14;
    while (cap < w->str_len + n + 1) cap *= 2;
    char *p = realloc(w->str, cap);
    if (!p) {
      w->o.failed = true;
      return CACHE_NO_STR;
    }
    w->str = p;
    w->str_cap = cap;
  }
  uint32_t off = (uint32_t)w->str_len;
  memcpy(w->str + off, s, n + 1);
  w->str_len += n + 1;
  w->str_tab[j] = h << 32 | (uint64_t)(off + 1);
  w->str_count++;
  return off;
}

/* The index of a trace entry's extra (added when new), CACHE_NO_STR for none. */
static uint32_t w_extra(wbuf_t *w, const ms_snap_trace_extra_t *x) {
  if (!x) return CACHE_NO_STR;
  if ((w->nextras + 1) * 2 > w->ext_tab_cap) {
    size_t cap = w->ext_tab_cap ? w->ext_tab_cap * 2 : 64;
    uintptr_t *t = calloc(cap, sizeof *t);
    uint32_t *ix = calloc(cap, sizeof *ix);
    const ms_snap_trace_extra_t **l = realloc(w->extras, cap * sizeof *l);
    if (!t || !ix || !l) {
      free(t);
      free(ix);
      if (l) w->extras = l;
      w->o.failed = true;
      return CACHE_NO_STR;
    }
    w->extras = l;
    for (size_t i = 0; i < w->ext_tab_cap; i++) {
      if (!w->ext_tab[i]) continue;
      size_t j = (size_t)ms_hash_u64(w->ext_tab[i]) & (cap - 1);
      while (t[j]) j = (j + 1) & (cap - 1);
      t[j] = w->ext_tab[i];
      ix[j] = w->ext_idx[i];
    }
    free(w->ext_tab);
    free(w->ext_idx);
    w->ext_tab = t;
    w->ext_idx = ix;
    w->ext_tab_cap = cap;
  }
  uintptr_t key = (uintptr_t)x;
  size_t j = (size_t)ms_hash_u64(key) & (w->ext_tab_cap - 1);
  for (; w->ext_tab[j]; j = (j + 1) & (w->ext_tab_cap - 1))
    if (w->ext_tab[j] == key) return w->ext_idx[j];
  if (w->nextras >= UINT32_MAX - 1) {
    w->o.failed = true;
    return CACHE_NO_STR;
  }
  w->ext_tab[j] = key;
  w->ext_idx[j] = (uint32_t)w->nextras;
  w->extras[w->nextras] = x;
  return (uint32_t)w->nextras++;
}

static void w_kv(wbuf_t *w, unsigned char *r, const ms_snap_kv_t *kv) {
  put_u32(r, w_str(w, kv->key));
  put_u32(r + 4, (uint32_t)kv->kind);
  put_u32(r + 8, kv->b ? 1u : 0u);
  put_u32(r + 12, kv->kind == MS_SNAP_VAL_STR ? w_str(w, kv->s) : CACHE_NO_STR);
  put_u32(r + 16, kv->first);
  put_u32(r + 20, kv->count);
  put_u64(r + 24, (uint64_t)kv->i);
  uint64_t fb;
  memcpy(&fb, &kv->f, 8);
  put_u64(r + 32, fb);
}

/* Starts section sec of count records (8-byte aligned). */
static void w_section(wbuf_t *w, int sec, size_t count) {
  static const unsigned char zero[8] = {0};
  w_put(w, zero, (size_t)((8 - w->o.pos % 8) % 8));
  w->sect[sec][0] = w->o.pos;
  w->sect[sec][1] = count;
}

static void w_release(wbuf_t *w) {
  free(w->o.chunk);
  free(w->str);
  free(w->str_tab);
  free(w->extras);
  free(w->ext_tab);
  free(w->ext_idx);
}

static bool w_model(wbuf_t *w, const ms_snapshot_t *s) {
  unsigned char r[R_SEGMENT];
  w_section(w, CS_SCALARS, 1);
  memset(r, 0, R_SCALARS);
  put_u32(r, (uint32_t)s->origin);
  put_u32(r + 4, s->present);
  put_u64(r + 8, (uint64_t)s->pid);
  put_u32(r + 16, w_str(w, s->hostname ? s->hostname : ""));
  put_u32(r + 20, s->stack_frames16 ? 2u : 4u);
  put_u64(r + 24, (uint64_t)s->rank);
  put_u64(r + 32, (uint64_t)s->time_us);
  put_u64(r + 40, (uint64_t)s->nsettings_top);
  w_put(w, r, R_SCALARS);
  w_section(w, CS_SEGMENTS, s->nsegments);
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    memset(r, 0, R_SEGMENT);
    put_u64(r, (uint64_t)g->device);
    put_u64(r + 8, g->address);
    put_u64(r + 16, g->total_size);
    put_u64(r + 24, g->allocated_size);
    put_u64(r + 32, g->active_size);
    put_u64(r + 40, g->requested_size);
    put_u64(r + 48, g->stream);
    put_u64(r + 56, (uint64_t)g->pool_id[0]);
    put_u64(r + 64, (uint64_t)g->pool_id[1]);
    put_u32(r + 72, g->stack);
    put_u32(r + 76, g->first_block);
    put_u32(r + 80, g->nblocks);
    put_u32(r + 84, g->present);
    put_u8(r + 88, g->is_large);
    put_u8(r + 89, g->is_expandable);
    w_put(w, r, R_SEGMENT);
  }
  w_section(w, CS_BLOCKS, s->nblocks);
  for (size_t i = 0; i < s->nblocks; i++) {
    const ms_snap_block_t *b = &s->blocks[i];
    put_u64(r, b->address);
    put_u64(r + 8, b->size);
    put_u64(r + 16, b->requested_size);
    put_u32(r + 24, (uint32_t)b->state);
    put_u32(r + 28, w_str(w, b->state_name));
    put_u32(r + 32, b->stack);
    put_u32(r + 36, b->first_history);
    put_u32(r + 40, b->nhistory);
    put_u32(r + 44, b->present);
    w_put(w, r, R_BLOCK);
  }
  w_section(w, CS_HISTORY, s->nhistory);
  for (size_t i = 0; i < s->nhistory; i++) {
    const ms_snap_history_t *h = &s->history[i];
    put_u64(r, h->addr);
    put_u64(r + 8, h->real_size);
    put_u32(r + 16, h->stack);
    put_u32(r + 20, h->present);
    w_put(w, r, R_HISTORY);
  }
  w_section(w, CS_DEVICES, s->ndevices);
  for (size_t i = 0; i < s->ndevices; i++) {
    const ms_snap_device_t *d = &s->devices[i];
    memset(r, 0, R_DEVICE);
    put_u32(r, d->first_trace);
    put_u32(r + 4, d->ntrace);
    put_u64(r + 8, d->trace_dropped);
    put_u64(r + 16, d->capacity);
    put_u32(r + 24, d->first_stat);
    put_u32(r + 28, d->nstats);
    put_u32(r + 32, d->present);
    w_put(w, r, R_DEVICE);
  }
  return !w->o.failed;
}

/* The trace's fields in the order of an entry's varints. Three of them often repeat: a bit of the
 * entry's first byte (trace_same_bit) says when one is the previous entry's, and it is left out.
 * (The stream is the extra's: ms_snap_trace_extra_t.) */
enum { TF_PRESENT, TF_ADDR, TF_SIZE, TF_TIME, TF_EXTRA, TF_STACK, TF_COUNT };
#define TRACE_ACTION_BITS 0x0fu
#define TRACE_UNUSED_BIT 0x20u /* set: a damaged entry */
static unsigned trace_same_bit(int f) {
  return f == TF_PRESENT ? 0x10u : f == TF_EXTRA ? 0x40u : f == TF_SIZE ? 0x80u : 0u;
}

/* The trace: its number of entries (u64), then each entry as a byte (the action in its low 4
 * bits; bits 4, 6 and 7: its present bits, extra and size are the previous entry's; bit 5 is 0)
 * and the varints of its present bits, its address (zigzag of the difference from the previous
 * entry's), size, time (zigzag difference), extra (+1; 0: none) and stack (zigzag difference),
 * less those the byte says repeat. An entry takes 4 bytes or more; 8.7 on the synthetic file of
 * docs/performance.md (a free's size is its alloc's, or its request's just before), against 44 at
 * full width. */
static bool w_trace(wbuf_t *w, const ms_snapshot_t *s) {
  unsigned char r[R_EXTRA + R_TRACE];
  w_section(w, CS_TRACE, 0);
  put_u64(r, (uint64_t)s->ntrace);
  w_put(w, r, 8);
  uint64_t prev[TF_COUNT] = {0};
  for (size_t i = 0; i < s->ntrace; i++) {
    const ms_snap_trace_t *t = &s->trace[i];
    uint32_t x = w_extra(w, t->extra);
    uint64_t v[TF_COUNT] = {
        t->present, t->addr, t->size, (uint64_t)t->time_us, x == CACHE_NO_STR ? 0 : (uint64_t)x + 1,
        t->stack};
    if (t->action > TRACE_ACTION_BITS) w->o.failed = true;
    unsigned char flags = (unsigned char)(t->action & TRACE_ACTION_BITS);
    for (int f = 0; f < TF_COUNT; f++)
      if (v[f] == prev[f]) flags |= (unsigned char)trace_same_bit(f);
    size_t n = 0;
    r[n++] = flags;
    for (int f = 0; f < TF_COUNT; f++) {
      if (flags & trace_same_bit(f)) continue;
      bool diff = f == TF_ADDR || f == TF_TIME || f == TF_STACK;
      n += cache_put_var(r + n, diff ? cache_zigzag(v[f] - prev[f]) : v[f]);
    }
    w_put(w, r, n);
    memcpy(prev, v, sizeof prev);
  }
  w->sect[CS_TRACE][1] = w->o.pos - w->sect[CS_TRACE][0]; /* in bytes */
  w_section(w, CS_EXTRAS, w->nextras);
  memset(r, 0, sizeof r);
  for (size_t i = 0; i < w->nextras && !w->o.failed; i++) {
    const ms_snap_trace_extra_t *x = w->extras[i];
    put_u32(r, x->action_name ? w_str(w, x->action_name) : CACHE_NO_STR);
    put_u32(r + 4, w_str(w, x->compile_context));
    put_u32(r + 8, w_str(w, x->user_metadata));
    put_u32(r + 12, w_str(w, x->category ? x->category : ""));
    put_u64(r + 16, (uint64_t)x->pool_id[0]);
    put_u64(r + 24, (uint64_t)x->pool_id[1]);
    put_u64(r + 32, x->stream);
    w_put(w, r, R_EXTRA);
  }
  return !w->o.failed;
}

/* The frames at full width; the stacks and their frame indices coded (lib/cache/stackcode.c), each
 * of those two sections counted in bytes. */
static bool w_stacks(wbuf_t *w, const ms_snapshot_t *s, bool *nomem) {
  unsigned char r[R_FRAME];
  w_section(w, CS_FRAMES, s->nframes);
  for (size_t i = 0; i < s->nframes; i++) {
    put_u32(r, w_str(w, s->frames[i].name));
    put_u32(r + 4, w_str(w, s->frames[i].filename));
    put_u64(r + 8, (uint64_t)s->frames[i].line);
    w_put(w, r, R_FRAME);
  }
  w_section(w, CS_STACKS, 0);
  if (!ms__cache_w_stacks(&w->o, s)) return false;
  w->sect[CS_STACKS][1] = w->o.pos - w->sect[CS_STACKS][0];
  w_section(w, CS_STACK_FRAMES, 0);
  if (!ms__cache_w_stack_frames(&w->o, s, nomem)) return false;
  w->sect[CS_STACK_FRAMES][1] = w->o.pos - w->sect[CS_STACK_FRAMES][0];
  return !w->o.failed;
}

static bool w_rest(wbuf_t *w, const ms_snapshot_t *s) {
  unsigned char r[R_KV];
  w_section(w, CS_SETTINGS, s->nsettings);
  for (size_t i = 0; i < s->nsettings; i++) {
    w_kv(w, r, &s->settings[i]);
    w_put(w, r, R_KV);
  }
  w_section(w, CS_STATS, s->nstats);
  for (size_t i = 0; i < s->nstats; i++) {
    w_kv(w, r, &s->stats[i]);
    w_put(w, r, R_KV);
  }
  w_section(w, CS_ANNOTATIONS, s->nannotations);
  for (size_t i = 0; i < s->nannotations; i++) {
    put_u32(r, w_str(w, s->annotations[i].name));
    put_u32(r + 4, w_str(w, s->annotations[i].stage));
    put_u64(r + 8, (uint64_t)s->annotations[i].device);
    put_u64(r + 16, (uint64_t)s->annotations[i].time_us);
    w_put(w, r, R_ANNOTATION);
  }
  if (w->o.failed) return false;
  /* the table ends with a NUL even when empty, so every string offset finds its end in it */
  w_section(w, CS_STRINGS, w->str_len + 1);
  w_put(w, w->str, w->str_len);
  w_put(w, "", 1);
  w_flush(w);
  return !w->o.failed;
}

/* Streams snap's cache file for key: to fd from its current offset (the header is then written at
 * offset 0 by pwrite; fd must be a new, empty file), or to memory (fd < 0: w->o.mem). *len = the
 * file's length. */
static int w_encode(wbuf_t *w, int fd, const ms_snapshot_t *s, const ms_cache_key_t *key,
                    size_t *len) {
  memset(w, 0, sizeof *w);
  w->o.fd = fd;
  w->o.sum = 0x6d656d736e617073ULL;
  w->o.chunk = malloc(CACHE_SUM_CHUNK);
  unsigned char h[CACHE_HEADER_BYTES] = {0};
  if (!w->o.chunk) return MS_ENOMEM;
  w_out(w, h, sizeof h); /* a placeholder, written again at the end */
  w->o.pos = CACHE_HEADER_BYTES;
  bool nomem = false;
  if (!(w_model(w, s) && w_trace(w, s) && w_stacks(w, s, &nomem) && w_rest(w, s)))
    return w->o.fd >= 0 && w->o.failed && !nomem ? MS_EIO : MS_ENOMEM;
  memcpy(h, CACHE_MAGIC, 8);
  put_u32(h + 8, MS_CACHE_VERSION);
  put_u32(h + 12, key->flags);
  put_u64(h + 16, key->hash);
  put_u64(h + 24, key->size);
  put_u64(h + 32, w->o.pos);
  put_u64(h + 40, ms_hash_step(w->o.sum, w->o.pos - CACHE_HEADER_BYTES));
  for (int i = 0; i < CACHE_NSECTIONS; i++) {
    put_u64(h + CACHE_FIXED_BYTES + 16 * i, w->sect[i][0]);
    put_u64(h + CACHE_FIXED_BYTES + 16 * i + 8, w->sect[i][1]);
  }
  put_u64(h + CACHE_HEADER_BYTES - 8, cache_sum(h, CACHE_HEADER_BYTES - 8, 1));
  if (fd >= 0) {
    if (pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h) return MS_EIO;
  } else {
    memcpy(w->o.mem, h, sizeof h);
  }
  *len = (size_t)w->o.pos;
  return MS_OK;
}

int ms__cache_write_fd(int fd, const ms_snapshot_t *s, const ms_cache_key_t *key, size_t *len) {
  wbuf_t w;
  int rc = w_encode(&w, fd, s, key, len);
  w_release(&w);
  return rc;
}

int ms_cache_encode(const ms_snapshot_t *s, const ms_cache_key_t *key, void **buf, size_t *len) {
  wbuf_t w;
  *buf = NULL;
  *len = 0;
  int rc = w_encode(&w, -1, s, key, len);
  w_release(&w);
  if (rc != MS_OK) {
    free(w.o.mem);
    *len = 0;
    return rc;
  }
  *buf = w.o.mem;
  return MS_OK;
}

/* ---- reading -------------------------------------------------------------------------------- */

typedef struct rd_s {
  const unsigned char *p;
  size_t len;
  uint64_t off[CACHE_NSECTIONS], count[CACHE_NSECTIONS];
  uint32_t sf_width; /* 2 or 4 */
  char *str;         /* a copy of the string table */
  size_t str_len;
  ms_snap_trace_extra_t *extras;
  size_t nextras;
  ms_snapshot_t t; /* the tables being built */
  bool nomem;
  ms_errbuf_t *eb;
} rd_t;

/* A string offset into the table; allow_null: CACHE_NO_STR is NULL. */
static bool rd_str(const rd_t *r, uint32_t off, bool allow_null, const char **out) {
  if (off == CACHE_NO_STR && allow_null) {
    *out = NULL;
    return true;
  }
  if (off >= r->str_len) return false;
  *out = r->str + off;
  return true;
}

static bool rd_kv(const rd_t *r, const unsigned char *p, ms_snap_kv_t *kv) {
  memset(kv, 0, sizeof *kv);
  uint32_t kind = get_u32(p + 4), b = get_u32(p + 8);
  if (kind > MS_SNAP_VAL_MAP || b > 1) return false;
  if (!rd_str(r, get_u32(p), false, &kv->key)) return false;
  kv->kind = (ms_snap_value_kind)kind;
  kv->b = b != 0;
  if (kind == MS_SNAP_VAL_STR) {
    if (!rd_str(r, get_u32(p + 12), false, &kv->s)) return false;
  } else {
    if (get_u32(p + 12) != CACHE_NO_STR) return false;
    kv->s = NULL;
  }
  kv->first = get_u32(p + 16);
  kv->count = get_u32(p + 20);
  kv->i = (int64_t)get_u64(p + 24);
  uint64_t fb = get_u64(p + 32);
  memcpy(&kv->f, &fb, 8);
  return true;
}

/* malloc for section sec's records as elem bytes each (the count is bounded by the file's size);
 * NULL when empty; NULL with r->nomem when out of memory. *n = the count. */
static void *rd_alloc(rd_t *r, int sec, size_t elem, size_t *n) {
  *n = (size_t)r->count[sec];
  if (*n == 0) return NULL;
  void *p = malloc(*n * elem);
  if (!p) r->nomem = true;
  return p;
}

static const unsigned char *rd_rec(const rd_t *r, int sec, size_t i, size_t width) {
  return r->p + r->off[sec] + i * width;
}

static void rd_release(rd_t *r) {
  ms_snapshot_t *t = &r->t;
  free(t->segments);
  free(t->blocks);
  free(t->history);
  free(t->devices);
  free(t->trace);
  free(t->frames);
  free(t->stacks);
  free(t->stack_frames);
  free(t->stack_frames16);
  free(t->settings);
  free(t->stats);
  free(t->annotations);
  free(r->extras);
  free(r->str);
}

/* The header: magic, version, checksums, key, length, every section inside the file. */
static int rd_header(rd_t *r, const ms_cache_key_t *key, bool check_sums) {
  const unsigned char *h = r->p;
  if (r->len < CACHE_HEADER_BYTES)
    return ms__errbuf_set(r->eb, MS_ETRUNCATED, "cache file: shorter than its header");
  if (memcmp(h, CACHE_MAGIC, 8) != 0)
    return ms__errbuf_set(r->eb, MS_EFORMAT, "cache file: not a memsnap cache file");
  if (get_u32(h + 8) != MS_CACHE_VERSION)
    return ms__errbuf_set(r->eb, MS_EVERSION, "cache file: version %u, not %u", get_u32(h + 8),
                          MS_CACHE_VERSION);
  if (check_sums && get_u64(h + CACHE_HEADER_BYTES - 8) != cache_sum(h, CACHE_HEADER_BYTES - 8, 1))
    return ms__errbuf_set(r->eb, MS_EFORMAT, "cache file: header checksum mismatch");
  if (key && (get_u32(h + 12) != key->flags || get_u64(h + 16) != key->hash ||
              get_u64(h + 24) != key->size))
    return ms__errbuf_set(r->eb, MS_ENOTFOUND, "cache file: for another input");
  if (get_u64(h + 32) != r->len)
    return ms__errbuf_set(r->eb, MS_ETRUNCATED, "cache file: %zu bytes, not %llu", r->len,
                          (unsigned long long)get_u64(h + 32));
  if (check_sums &&
      get_u64(h + 40) != cache_checksum(h + CACHE_HEADER_BYTES, r->len - CACHE_HEADER_BYTES))
    return ms__errbuf_set(r->eb, MS_EFORMAT, "cache file: body checksum mismatch");
  static const size_t rec[CACHE_NSECTIONS] = {
      [CS_SCALARS] = R_SCALARS, [CS_SEGMENTS] = R_SEGMENT,  [CS_BLOCKS] = R_BLOCK,
      [CS_HISTORY] = R_HISTORY, [CS_DEVICES] = R_DEVICE,    [CS_TRACE] = 1,     
      [CS_EXTRAS] = R_EXTRA,    [CS_FRAMES] = R_FRAME,      [CS_STACKS] = 1,
      [CS_STACK_FRAMES] = 1,    [CS_SETTINGS] = R_KV,       [CS_STATS] = R_KV,
      [CS_ANNOTATIONS] = R_ANNOTATION, [CS_STRINGS] = 1,
  };
  for (int i = 0; i < CACHE_NSECTIONS; i++) {
    r->off[i] = get_u64(h + CACHE_FIXED_BYTES + 16 * i);
    r->count[i] = get_u64(h + CACHE_FIXED_BYTES + 16 * i + 8);
  }
  /* the stack frames' width is a scalar: read it before sizing that section */
  if (r->count[CS_SCALARS] != 1 || r->off[CS_SCALARS] < CACHE_HEADER_BYTES ||
      r->off[CS_SCALARS] > r->len || r->len - r->off[CS_SCALARS] < R_SCALARS)
    return ms__errbuf_set(r->eb, MS_EFORMAT, "cache file: no scalars");
  r->sf_width = get_u32(rd_rec(r, CS_SCALARS, 0, R_SCALARS) + 20);
  if (r->sf_width != 2 && r->sf_width != 4)
    return ms__errbuf_set(r->eb, MS_EFORMAT, "cache file: stack frames of an unknown width");
  for (int i = 0; i < CACHE_NSECTIONS; i++) {
    size_t w = rec[i];
    bool bytes = i == CS_TRACE || i == CS_STACKS || i == CS_STACK_FRAMES;
    if (r->off[i] < CACHE_HEADER_BYTES || r->off[i] > r->len ||
        r->count[i] > (r->len - r->off[i]) / w || (!bytes && r->count[i] > UINT32_MAX - 1))
      return ms__errbuf_set(r->eb, MS_EFORMAT, "cache file: a section lies outside the file");
  }
  if (r->count[CS_STRINGS] < 1 || r->p[r->off[CS_STRINGS] + r->count[CS_STRINGS] - 1] != 0)
    return ms__errbuf_set(r->eb, MS_EFORMAT, "cache file: string table without its final NUL");
  return MS_OK;
}

/* Each rd_ function below fills its tables and returns NULL, or what it refused. */

static const char *rd_scalars(rd_t *r) {
  const unsigned char *p = rd_rec(r, CS_SCALARS, 0, R_SCALARS);
  ms_snapshot_t *t = &r->t;
  uint32_t origin = get_u32(p);
  if (origin > MS_SNAP_ORIGIN_TORCH_DICT) return "unknown origin";
  t->origin = (ms_snap_origin)origin;
  t->present = get_u32(p + 4);
  t->pid = (int64_t)get_u64(p + 8);
  if (!rd_str(r, get_u32(p + 16), false, &t->hostname)) return "host name out of range";
  t->rank = (int64_t)get_u64(p + 24);
  t->time_us = (int64_t)get_u64(p + 32);
  t->nsettings_top = (size_t)get_u64(p + 40);
  if (get_u64(p + 40) > r->count[CS_SETTINGS]) return "settings out of range";
  r->extras = rd_alloc(r, CS_EXTRAS, sizeof *r->extras, &r->nextras);
  for (size_t i = 0; !r->nomem && i < r->nextras; i++) {
    const unsigned char *q = rd_rec(r, CS_EXTRAS, i, R_EXTRA);
    ms_snap_trace_extra_t *x = &r->extras[i];
    if (!rd_str(r, get_u32(q), true, &x->action_name) ||
        !rd_str(r, get_u32(q + 4), false, &x->compile_context) ||
        !rd_str(r, get_u32(q + 8), false, &x->user_metadata) ||
        !rd_str(r, get_u32(q + 12), false, &x->category))
      return "trace extra out of range";
    x->pool_id[0] = (int64_t)get_u64(q + 16);
    x->pool_id[1] = (int64_t)get_u64(q + 24);
    x->stream = get_u64(q + 32);
  }
  return NULL;
}

static const char *rd_segments(rd_t *r) {
  ms_snapshot_t *t = &r->t;
  t->segments = rd_alloc(r, CS_SEGMENTS, sizeof *t->segments, &t->nsegments);
  uint64_t next = 0;
  for (size_t i = 0; !r->nomem && i < t->nsegments; i++) {
    const unsigned char *p = rd_rec(r, CS_SEGMENTS, i, R_SEGMENT);
    ms_snap_segment_t *g = &t->segments[i];
    memset(g, 0, sizeof *g);
    g->device = (int64_t)get_u64(p);
    g->address = get_u64(p + 8);
    g->total_size = get_u64(p + 16);
    g->allocated_size = get_u64(p + 24);
    g->active_size = get_u64(p + 32);
    g->requested_size = get_u64(p + 40);
    g->stream = get_u64(p + 48);
    g->pool_id[0] = (int64_t)get_u64(p + 56);
    g->pool_id[1] = (int64_t)get_u64(p + 64);
    g->stack = get_u32(p + 72);
    g->first_block = get_u32(p + 76);
    g->nblocks = get_u32(p + 80);
    g->present = get_u32(p + 84);
    /* the readers give each segment's blocks after the previous segment's */
    if (p[88] > 1 || p[89] > 1 || g->first_block < next) return "segment out of order";
    g->is_large = p[88];
    g->is_expandable = p[89];
    next = (uint64_t)g->first_block + g->nblocks;
  }
  t->blocks = rd_alloc(r, CS_BLOCKS, sizeof *t->blocks, &t->nblocks);
  for (size_t i = 0; !r->nomem && i < t->nblocks; i++) {
    const unsigned char *p = rd_rec(r, CS_BLOCKS, i, R_BLOCK);
    ms_snap_block_t *b = &t->blocks[i];
    memset(b, 0, sizeof *b);
    b->address = get_u64(p);
    b->size = get_u64(p + 8);
    b->requested_size = get_u64(p + 16);
    uint32_t st = get_u32(p + 24);
    if (st > MS_BLOCK_STATE_OTHER || !rd_str(r, get_u32(p + 28), false, &b->state_name))
      return "block state out of range";
    b->state = (ms_block_state)st;
    b->stack = get_u32(p + 32);
    b->first_history = get_u32(p + 36);
    b->nhistory = get_u32(p + 40);
    b->present = get_u32(p + 44);
  }
  t->history = rd_alloc(r, CS_HISTORY, sizeof *t->history, &t->nhistory);
  for (size_t i = 0; !r->nomem && i < t->nhistory; i++) {
    const unsigned char *p = rd_rec(r, CS_HISTORY, i, R_HISTORY);
    t->history[i].addr = get_u64(p);
    t->history[i].real_size = get_u64(p + 8);
    t->history[i].stack = get_u32(p + 16);
    t->history[i].present = get_u32(p + 20);
  }
  return NULL;
}

static const char *rd_trace(rd_t *r) {
  ms_snapshot_t *t = &r->t;
  if (r->count[CS_DEVICES] > 65536) return "too many devices";
  t->devices = rd_alloc(r, CS_DEVICES, sizeof *t->devices, &t->ndevices);
  uint64_t next = 0;
  for (size_t i = 0; !r->nomem && i < t->ndevices; i++) {
    const unsigned char *p = rd_rec(r, CS_DEVICES, i, R_DEVICE);
    ms_snap_device_t *d = &t->devices[i];
    memset(d, 0, sizeof *d);
    d->first_trace = get_u32(p);
    d->ntrace = get_u32(p + 4);
    d->trace_dropped = get_u64(p + 8);
    d->capacity = get_u64(p + 16);
    d->first_stat = get_u32(p + 24);
    d->nstats = get_u32(p + 28);
    d->present = get_u32(p + 32);
    /* the readers give each device's trace after the previous device's */
    if (d->ntrace && d->first_trace < next) return "device traces overlap";
    if (d->ntrace) next = (uint64_t)d->first_trace + d->ntrace;
  }
  if (r->count[CS_TRACE] < 8) return "trace without its number of entries";
  const unsigned char *p = rd_rec(r, CS_TRACE, 0, 1), *end = p + r->count[CS_TRACE];
  uint64_t n = get_u64(p);
  p += 8;
  if (n > (uint64_t)(end - p) / 4 || n > UINT32_MAX - 1) return "trace entries out of range";
  t->ntrace = (size_t)n;
  t->trace = n ? malloc((size_t)n * sizeof *t->trace) : NULL;
  if (n && !t->trace) r->nomem = true;
  if (r->nomem) return NULL;
  bool bad_entry = false;
  uint64_t v[TF_COUNT] = {0};
  for (size_t i = 0; i < t->ntrace; i++) {
    ms_snap_trace_t *e = &t->trace[i];
    if (p >= end) return "trace entry cut short";
    unsigned flags = *p++;
    for (int f = 0; f < TF_COUNT; f++) {
      if (flags & trace_same_bit(f)) continue;
      uint64_t x;
      if (!cache_get_var(&p, end, &x)) return "trace entry cut short";
      bool diff = f == TF_ADDR || f == TF_TIME || f == TF_STACK;
      v[f] = diff ? v[f] + cache_unzigzag(x) : x;
    }
    unsigned act = flags & TRACE_ACTION_BITS;
    e->addr = v[TF_ADDR];
    e->size = v[TF_SIZE];
    e->time_us = (int64_t)v[TF_TIME];
    e->stack = (uint32_t)v[TF_STACK];
    e->present = (uint16_t)v[TF_PRESENT];
    e->action = (uint8_t)act;
    bad_entry |= (flags & TRACE_UNUSED_BIT) || act >= MS_TRACE_ACTION_COUNT ||
                 v[TF_PRESENT] > UINT16_MAX || v[TF_STACK] > UINT32_MAX || v[TF_EXTRA] > r->nextras;
    e->extra = v[TF_EXTRA] == 0 || v[TF_EXTRA] > r->nextras ? NULL : &r->extras[v[TF_EXTRA] - 1];
  }
  if (p != end) return "trace section longer than its entries";
  return bad_entry ? "trace entry out of range" : NULL;
}

static const char *rd_stacks(rd_t *r) {
  ms_snapshot_t *t = &r->t;
  t->frames = rd_alloc(r, CS_FRAMES, sizeof *t->frames, &t->nframes);
  for (size_t i = 0; !r->nomem && i < t->nframes; i++) {
    const unsigned char *p = rd_rec(r, CS_FRAMES, i, R_FRAME);
    if (!rd_str(r, get_u32(p), false, &t->frames[i].name) ||
        !rd_str(r, get_u32(p + 4), false, &t->frames[i].filename))
      return "frame out of range";
    t->frames[i].line = (int64_t)get_u64(p + 8);
  }
  if (r->nomem) return NULL;
  const char *why = ms__cache_r_stacks(rd_rec(r, CS_STACKS, 0, 1), (size_t)r->count[CS_STACKS],
                                       t, &r->nomem);
  if (why || r->nomem) return why;
  return ms__cache_r_stack_frames(rd_rec(r, CS_STACK_FRAMES, 0, 1),
                                  (size_t)r->count[CS_STACK_FRAMES], r->sf_width, t->nframes, t,
                                  &r->nomem);
}

static const char *rd_rest(rd_t *r) {
  ms_snapshot_t *t = &r->t;
  t->settings = rd_alloc(r, CS_SETTINGS, sizeof *t->settings, &t->nsettings);
  for (size_t i = 0; !r->nomem && i < t->nsettings; i++)
    if (!rd_kv(r, rd_rec(r, CS_SETTINGS, i, R_KV), &t->settings[i])) return "setting out of range";
  t->stats = rd_alloc(r, CS_STATS, sizeof *t->stats, &t->nstats);
  for (size_t i = 0; !r->nomem && i < t->nstats; i++)
    if (!rd_kv(r, rd_rec(r, CS_STATS, i, R_KV), &t->stats[i]) ||
        t->stats[i].kind == MS_SNAP_VAL_MAP)
      return "statistic out of range";
  t->annotations = rd_alloc(r, CS_ANNOTATIONS, sizeof *t->annotations, &t->nannotations);
  for (size_t i = 0; !r->nomem && i < t->nannotations; i++) {
    const unsigned char *p = rd_rec(r, CS_ANNOTATIONS, i, R_ANNOTATION);
    if (!rd_str(r, get_u32(p), false, &t->annotations[i].name) ||
        !rd_str(r, get_u32(p + 4), false, &t->annotations[i].stage))
      return "annotation out of range";
    t->annotations[i].device = (int64_t)get_u64(p + 8);
    t->annotations[i].time_us = (int64_t)get_u64(p + 16);
  }
  return NULL;
}

/* Moves the extras and the strings into one block the snapshot owns (the extras first) and
 * rebases every pointer into either; NULL when out of memory. */
static char *rd_pack(rd_t *r) {
  size_t xb = r->nextras * sizeof *r->extras;
  char *blob = malloc(xb + r->str_len);
  if (!blob) return NULL;
  char *nstr = blob + xb;
  const char *old = r->str;
  memcpy(nstr, old, r->str_len);
  ms_snap_trace_extra_t *nx = (ms_snap_trace_extra_t *)(void *)blob;
  if (xb) memcpy(nx, r->extras, xb);
  ms_snapshot_t *t = &r->t;
#define REBASE(ptr) ((ptr) = (ptr) ? nstr + ((ptr) - old) : NULL)
  for (size_t i = 0; i < r->nextras; i++) {
    REBASE(nx[i].action_name);
    REBASE(nx[i].compile_context);
    REBASE(nx[i].user_metadata);
    REBASE(nx[i].category);
  }
  for (size_t i = 0; i < t->ntrace; i++)
    if (t->trace[i].extra) t->trace[i].extra = nx + (t->trace[i].extra - r->extras);
  REBASE(t->hostname);
  for (size_t i = 0; i < t->nblocks; i++) REBASE(t->blocks[i].state_name);
  for (size_t i = 0; i < t->nframes; i++) {
    REBASE(t->frames[i].name);
    REBASE(t->frames[i].filename);
  }
  for (size_t i = 0; i < t->nsettings; i++) {
    REBASE(t->settings[i].key);
    REBASE(t->settings[i].s);
  }
  for (size_t i = 0; i < t->nstats; i++) {
    REBASE(t->stats[i].key);
    REBASE(t->stats[i].s);
  }
  for (size_t i = 0; i < t->nannotations; i++) {
    REBASE(t->annotations[i].name);
    REBASE(t->annotations[i].stage);
  }
#undef REBASE
  free(r->extras);
  free(r->str);
  r->extras = NULL;
  r->str = NULL;
  return blob;
}

int ms_cache_decode(const void *buf, size_t len, const ms_cache_key_t *key, bool check_sums,
                    ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms_errbuf_t local = {{0}};
  rd_t r;
  memset(&r, 0, sizeof r);
  r.p = buf;
  r.len = len;
  r.eb = eb ? eb : &local;
  *out = NULL;
  int rc = rd_header(&r, key, check_sums);
  if (rc != MS_OK) return rc;
  r.str_len = (size_t)r.count[CS_STRINGS];
  r.str = malloc(r.str_len);
  if (!r.str) return ms__errbuf_set(r.eb, MS_ENOMEM, "out of memory reading the cache");
  memcpy(r.str, rd_rec(&r, CS_STRINGS, 0, 1), r.str_len);
  const char *why = rd_scalars(&r);
  if (!why && !r.nomem) why = rd_segments(&r);
  if (!why && !r.nomem) why = rd_trace(&r);
  if (!why && !r.nomem) why = rd_stacks(&r);
  if (!why && !r.nomem) why = rd_rest(&r);
  char *blob = why || r.nomem ? NULL : rd_pack(&r);
  if (!blob) {
    rd_release(&r);
    if (why) return ms__errbuf_set(r.eb, MS_EFORMAT, "cache file: %s", why);
    return ms__errbuf_set(r.eb, MS_ENOMEM, "out of memory reading the cache");
  }
  rc = ms__snapshot_adopt(&r.t, blob, out, r.eb);
  if (rc != MS_OK) {
    rd_release(&r);
    free(blob);
    if (rc != MS_EFORMAT) return rc;
    char msg[sizeof r.eb->msg];
    memcpy(msg, r.eb->msg, sizeof msg);
    return ms__errbuf_set(r.eb, MS_EFORMAT, "cache file: %.200s", msg);
  }
  return MS_OK;
}
