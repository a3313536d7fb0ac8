/* SPDX-License-Identifier: MIT
 * memsnap core: trace stacks read when they are asked for (snapshot/deferred.h, issue #33).
 *
 * What the time index prints of a trace needs the stacks of the blocks alive at a few moments, a
 * few thousand of a 5 M-entry trace's allocations; interning every one of them at the read is a
 * third of a cold `memsnap timeline` of a 1 GB pickle, in time and in memory. A deferred read
 * records, per alloc entry, the file offset of its frames list's run of memo gets (a get is
 * BINGET 'h' + 1 byte or LONG_BINGET 'j' + 4 bytes; the run ends at APPENDS 'e'), and the frame
 * that each memo index held. A fill reads a run again (pread), maps its memo indices to frames
 * and interns the stack beside the snapshot's stacks: a stack met before keeps its id.
 *
 * The file is the one read: the snapshot holds a descriptor of it (a file renamed or replaced
 * since is still the one read) and its size, modification and change times; a fill refuses when
 * those moved (MS_EIO; the change time only while the file still has a name), and a run that no
 * longer parses as the gets of known frames is MS_EFORMAT, never a stack made up.
 *
 * The stack tables grow by copies: a snapshot that borrows the tables (ms_timeline_snapshot_at's)
 * may still point at the old ones, so those are kept until the snapshot is freed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/internal.h"
#include "memsnap/serialize.h"
#include "model/snapbuild.h"
#include "snapshot/deferred.h"

/* the longest run a deferred read records: ms__pickle_frame_gets reads at most 64 Ki gets */
#define DF_MAX_GETS ((size_t)1 << 16)
#define DF_EMPTY UINT32_MAX
/* a read of the file: more than the longest run (5-byte gets) and its APPENDS */
#define DF_CHUNK ((size_t)512 << 10)
_Static_assert(DF_CHUNK > 5 * DF_MAX_GETS + 1, "a chunk holds the longest run");
/* a read for one run (most are a hundred bytes or so), and the gap between two runs asked that
 * one read still spans */
#define DF_RUN_BYTES ((size_t)2048)
#define DF_GAP ((uint64_t)16384)

/* the frame a memo index names, as a run's gets ask them: open addressing (Fibonacci hashing of
 * the index, at most half full), built once from the sorted pairs */
#define DF_EMPTY_IDX UINT32_MAX /* no memo index is: the memo stays below it */
typedef struct df_slot_s {
  uint32_t idx;
  uint32_t frame;
} df_slot_t;

typedef struct deferred_s {
  int fd;
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime, ctime;
  ms__defer_locs_t loc; /* the records still to read */
  df_slot_t *htab; /* 1 << (32 - hshift) slots */
  unsigned hshift;
  /* the stack table, as it grows: the arrays in the snapshot now and their capacity */
  ms_snap_stack_t *orig_stacks; /* what the read made, given back at the end */
  void *orig_sf;
  bool grown_stacks, grown_sf;
  size_t cap_stacks, cap_sf;
  void **old; /* copies replaced by a growth (malloc's), kept for borrowers */
  size_t nold, cap_old;
  uint32_t *tab; /* open addressing: stack ids by their frames' hash */
  size_t tabcap, tablen;
  unsigned char *buf; /* DF_CHUNK bytes of the file from buf_off, buf_len of them read */
  size_t bufcap, buf_len;
  uint64_t buf_off;
  void *kept; /* what a watch of the read found (ms__snapshot_defer_keep), freed with kept_free */
  void (*kept_free)(void *);
} deferred_t;

static void df_free(ms_snapshot_t *snap, void *ext) {
  deferred_t *d = ext;
  if (!d) return;
  /* the snapshot frees its tables as the read made them: put the originals back */
  if (d->grown_stacks) {
    free(snap->stacks);
    snap->stacks = d->orig_stacks;
  }
  if (d->grown_sf) {
    if (snap->stack_frames16) {
      free(snap->stack_frames16);
      snap->stack_frames16 = d->orig_sf;
    } else {
      free(snap->stack_frames);
      snap->stack_frames = d->orig_sf;
    }
  }
  for (size_t i = 0; i < d->nold; i++)
    free(d->old[i]); /* only copies are kept here: the originals went back above */
  free(d->old);
  if (d->fd >= 0) close(d->fd);
  if (d->kept_free) d->kept_free(d->kept);
  ms__defer_locs_free(&d->loc);
  free(d->htab);
  free(d->tab);
  free(d->buf);
  free(d);
}

/* Room for records up to rec in l: grown by doubling (the records come in their order), so that
 * a trace's places are never copied (ms__big_realloc moves pages) and the room past the last
 * record noted is never touched. */
static bool df_locs_room(ms__defer_locs_t *l, size_t rec) {
  size_t room = l->room ? 2 * l->room : 16 * MS__DEFER_BLOCK;
  while (room <= rec) room *= 2;
  uint32_t *o = ms__big_realloc(l->off, room * sizeof *o);
  if (!o) return false;
  l->off = o;
  uint64_t *b = realloc(l->base, room / MS__DEFER_BLOCK * sizeof *b);
  if (!b) return false; /* l->off has more room than l->room says: harmless */
  l->base = b;
  l->room = room;
  return true;
}

bool ms__defer_locs_note(ms__defer_locs_t *l, size_t rec, uint64_t off) {
  if (rec >= l->cap) { /* the blocks up to rec's: none of their records noted yet */
    if (rec >= l->room && !df_locs_room(l, rec)) return false;
    size_t cap = (rec / MS__DEFER_BLOCK + 1) * MS__DEFER_BLOCK;
    memset(l->off + l->cap, 0, (cap - l->cap) * sizeof *l->off);
    memset(l->base + l->cap / MS__DEFER_BLOCK, 0xff,
           (cap - l->cap) / MS__DEFER_BLOCK * sizeof *l->base);
    l->cap = cap;
  }
  uint64_t *base = &l->base[rec / MS__DEFER_BLOCK];
  if (*base == UINT64_MAX) *base = off;
  if (off < *base || off - *base >= UINT32_MAX) return false;
  if (!l->off[rec]) l->n++;
  l->off[rec] = (uint32_t)(off - *base) + 1;
  return true;
}

void ms__defer_locs_free(ms__defer_locs_t *l) {
  ms__big_free(l->off);
  free(l->base);
  memset(l, 0, sizeof *l);
}

/* Record rec's offset + 1, 0 when it is not left for later. */
static uint64_t df_loc(const ms__defer_locs_t *l, size_t rec) {
  if (rec >= l->cap || !l->off[rec]) return 0;
  return l->base[rec / MS__DEFER_BLOCK] + l->off[rec];
}

static size_t df_hslot(uint32_t idx, unsigned shift) {
  return (size_t)((uint32_t)(idx * 0x9E3779B1u) >> shift);
}

/* The memo index -> frame table from the nf pairs memo[i], frame[i]. */
static int df_htab_build(deferred_t *d, const uint32_t *memo, const uint32_t *frame, size_t nf) {
  unsigned bits = 4;
  while (bits < 31 && ((size_t)1 << bits) < 2 * nf)
    bits++;
  size_t n = (size_t)1 << bits;
  if (!(d->htab = malloc(n * sizeof *d->htab))) return MS_ENOMEM;
  memset(d->htab, 0xff, n * sizeof *d->htab);
  d->hshift = 32 - bits;
  for (size_t i = 0; i < nf; i++) {
    size_t j = df_hslot(memo[i], d->hshift);
    while (d->htab[j].idx != DF_EMPTY_IDX)
      j = (j + 1) & (n - 1);
    d->htab[j] = (df_slot_t){memo[i], frame[i]};
  }
  return MS_OK;
}

int ms__deferred_attach(ms_snapshot_t *snap, int fd, uint64_t size, ms__defer_locs_t *locs,
                        const uint32_t *memo, const uint32_t *frame, size_t nf, ms_errbuf_t *eb) {
  deferred_t *d = calloc(1, sizeof *d);
  struct stat st;
  if (d) {
    d->fd = -1;
  }
  if (!d || df_htab_build(d, memo, frame, nf) != MS_OK) {
    df_free(snap, d);
    ms__defer_locs_free(locs);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  d->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d->fd < 0 || fstat(d->fd, &st) != 0) {
    int e = errno;
    df_free(snap, d);
    ms__defer_locs_free(locs);
    return ms__errbuf_set(eb, MS_EIO, "cannot keep the file open: %s", strerror(e));
  }
  if ((uint64_t)st.st_size != size) {
    df_free(snap, d);
    ms__defer_locs_free(locs);
    return ms__errbuf_set(eb, MS_EIO,
                          "read error: the file changed while it was read (it had %" PRIu64
                          " bytes when the read began)",
                          size);
  }
  d->dev = st.st_dev;
  d->ino = st.st_ino;
  d->size = st.st_size;
  d->mtime = st.st_mtim;
  d->ctime = st.st_ctim;
  d->loc = *locs;
  memset(locs, 0, sizeof *locs);
  if (d->loc.cap > snap->ntrace) d->loc.cap = snap->ntrace; /* records past the trace: none */
  d->orig_stacks = snap->stacks;
  d->orig_sf = snap->stack_frames16 ? (void *)snap->stack_frames16 : (void *)snap->stack_frames;
  d->cap_stacks = snap->nstacks;
  d->cap_sf = snap->nstack_frames;
  ms__snapshot_set_ext(snap, d, df_free);
  return MS_OK;
}

static deferred_t *df_of(const ms_snapshot_t *snap) {
  void *ext = ms__snapshot_ext(snap);
  /* the only ext a snapshot has is this module's */
  return ext;
}

bool ms__snapshot_defers(const ms_snapshot_t *snap) {
  return snap && df_of(snap) != NULL;
}

bool ms__snapshot_defer_keep(ms_snapshot_t *snap, void *p, void (*free_fn)(void *)) {
  deferred_t *d = snap ? df_of(snap) : NULL;
  if (!d) return false;
  if (d->kept_free) d->kept_free(d->kept);
  d->kept = p;
  d->kept_free = free_fn;
  return true;
}

void *ms__snapshot_defer_kept(const ms_snapshot_t *snap) {
  const deferred_t *d = snap ? df_of(snap) : NULL;
  return d ? d->kept : NULL;
}

/* The calling thread's watch (ms__snapshot_load_watched): the readers' signatures stay as they
 * are, as with a load's window (load_window.c). */
static __thread ms__defer_watch_fn *watch_fn;
static __thread void *watch_ctx;

ms__defer_watch_fn *ms__defer_watch_current(void **ctx) {
  *ctx = watch_ctx;
  return watch_fn;
}

int ms__snapshot_load_watched(const char *path, unsigned flags, ms__defer_watch_fn *fn, void *ctx,
                              ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms__defer_watch_fn *saved_fn = watch_fn;
  void *saved_ctx = watch_ctx;
  watch_fn = fn;
  watch_ctx = ctx;
  int rc = ms_snapshot_load_ex(path, flags, out, eb);
  watch_fn = saved_fn;
  watch_ctx = saved_ctx;
  return rc;
}

bool ms__snapshot_has_deferred(const ms_snapshot_t *snap) {
  const deferred_t *d = snap ? df_of(snap) : NULL;
  return d && d->loc.n > 0;
}

/* ---- the stack table ------------------------------------------------------------------------ */

static uint64_t df_hash_frames(const ms_snapshot_t *s, size_t first, uint32_t n) {
  uint64_t h = ms_hash_u64(n);
  for (uint32_t k = 0; k < n; k++)
    h = ms_hash_step(h, ms_snap_frame_index(s, first + k));
  return h;
}

static uint64_t df_hash_run(const uint32_t *fr, uint32_t n) {
  uint64_t h = ms_hash_u64(n);
  for (uint32_t k = 0; k < n; k++)
    h = ms_hash_step(h, fr[k]);
  return h;
}

static size_t df_slot_of(const deferred_t *d, uint64_t h) {
  return (size_t)(h >> 17) & (d->tabcap - 1);
}

static int df_tab_grow(deferred_t *d, const ms_snapshot_t *s) {
  size_t cap = 1024;
  while (cap < 2 * (s->nstacks + 1)) cap *= 2;
  uint32_t *t = malloc(cap * sizeof *t);
  if (!t) return MS_ENOMEM;
  memset(t, 0xff, cap * sizeof *t);
  free(d->tab);
  d->tab = t;
  d->tabcap = cap;
  d->tablen = 0;
  for (size_t i = 0; i < s->nstacks; i++) {
    const ms_snap_stack_t *st = &s->stacks[i];
    size_t j = df_slot_of(d, df_hash_frames(s, st->first, st->nframes));
    while (t[j] != DF_EMPTY) j = (j + 1) & (cap - 1);
    t[j] = (uint32_t)i;
    d->tablen++;
  }
  return MS_OK;
}

static bool df_same(const ms_snapshot_t *s, const ms_snap_stack_t *st, const uint32_t *fr,
                    uint32_t n) {
  if (st->nframes != n) return false;
  for (uint32_t k = 0; k < n; k++)
    if (ms_snap_frame_index(s, st->first + k) != fr[k]) return false;
  return true;
}

static int df_keep_old(deferred_t *d, void *p) {
  if (d->nold == d->cap_old) {
    size_t cap = d->cap_old ? 2 * d->cap_old : 8;
    void **o = realloc(d->old, cap * sizeof *o);
    if (!o) return MS_ENOMEM;
    d->old = o;
    d->cap_old = cap;
  }
  d->old[d->nold++] = p;
  return MS_OK;
}

/* Room for one more stack of n frames in the snapshot's tables (copies when they are full). */
static int df_room(deferred_t *d, ms_snapshot_t *s, uint32_t n) {
  if (s->nstacks + 1 > d->cap_stacks) {
    size_t cap = 2 * d->cap_stacks + 64;
    ms_snap_stack_t *a = malloc(cap * sizeof *a);
    if (!a) return MS_ENOMEM;
    if (s->nstacks) memcpy(a, s->stacks, s->nstacks * sizeof *a);
    if (d->grown_stacks && df_keep_old(d, s->stacks) != MS_OK) {
      free(a);
      return MS_ENOMEM;
    }
    s->stacks = a;
    d->grown_stacks = true;
    d->cap_stacks = cap;
  }
  if (s->nstack_frames + n > d->cap_sf) {
    size_t cap = 2 * d->cap_sf + n + 256;
    bool narrow = s->stack_frames16 != NULL || (!s->stack_frames && s->nframes <= UINT16_MAX);
    size_t w = narrow ? sizeof(uint16_t) : sizeof(uint32_t);
    void *cur = narrow ? (void *)s->stack_frames16 : (void *)s->stack_frames;
    void *a = malloc(cap * w);
    if (!a) return MS_ENOMEM;
    if (s->nstack_frames) memcpy(a, cur, s->nstack_frames * w);
    if (d->grown_sf && df_keep_old(d, cur) != MS_OK) {
      free(a);
      return MS_ENOMEM;
    }
    if (!d->grown_sf) d->orig_sf = cur;
    if (narrow)
      s->stack_frames16 = a;
    else
      s->stack_frames = a;
    d->grown_sf = true;
    d->cap_sf = cap;
  }
  return MS_OK;
}

/* The id of the stack of frames fr[0..n), added when the snapshot has none like it. */
static int df_intern(deferred_t *d, ms_snapshot_t *s, const uint32_t *fr, uint32_t n,
                     uint32_t *id) {
  if (!d->tab || 2 * (d->tablen + 1) > d->tabcap) MS_FORWARD_IF_ERROR(df_tab_grow(d, s));
  size_t j = df_slot_of(d, df_hash_run(fr, n));
  for (; d->tab[j] != DF_EMPTY; j = (j + 1) & (d->tabcap - 1))
    if (df_same(s, &s->stacks[d->tab[j]], fr, n)) {
      *id = d->tab[j];
      return MS_OK;
    }
  if (s->nstacks >= UINT32_MAX - 1 || s->nstack_frames > UINT32_MAX - n) return MS_ELIMIT;
  MS_FORWARD_IF_ERROR(df_room(d, s, n));
  size_t first = s->nstack_frames;
  for (uint32_t k = 0; k < n; k++) {
    if (s->stack_frames16)
      s->stack_frames16[first + k] = (uint16_t)fr[k];
    else
      s->stack_frames[first + k] = fr[k];
  }
  s->nstack_frames += n;
  ms_snap_stack_t *st = &s->stacks[s->nstacks];
  memset(st, 0, sizeof *st);
  st->first = (uint32_t)first;
  st->nframes = n;
  d->tab[j] = (uint32_t)s->nstacks;
  d->tablen++;
  *id = (uint32_t)s->nstacks++;
  return MS_OK;
}

/* ---- reading a run again -------------------------------------------------------------------- */

static bool df_frame_of(const deferred_t *d, uint32_t idx, uint32_t *frame) {
  size_t mask = ((size_t)1 << (32 - d->hshift)) - 1;
  for (size_t j = df_hslot(idx, d->hshift);; j = (j + 1) & mask) {
    const df_slot_t *s = &d->htab[j];
    if (s->idx == idx) {
      *frame = s->frame;
      return true;
    }
    if (s->idx == DF_EMPTY_IDX) return false;
  }
}

/* The file's bytes from off into the buffer, len of them (at most DF_CHUNK; fewer at its end). */
static int df_fill_buf(deferred_t *d, uint64_t off, size_t len) {
  if (!d->buf && !(d->buf = malloc(DF_CHUNK))) return MS_ENOMEM;
  d->bufcap = DF_CHUNK;
  size_t have = 0;
  while (have < len) {
    ssize_t k = pread(d->fd, d->buf + have, len - have, (off_t)(off + have));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return MS_EIO;
    if (k == 0) break;
    have += (size_t)k;
  }
  d->buf_off = off;
  d->buf_len = have;
  return MS_OK;
}

enum { DF_RUN_OK, DF_RUN_CUT, DF_RUN_BAD };

/* The frames of the run at p (avail bytes) into fr (room for DF_MAX_GETS): *n. DF_RUN_CUT: the
 * bytes end inside it. */
static int df_parse(deferred_t *d, const unsigned char *p, size_t avail, uint32_t *fr,
                    uint32_t *n) {
  size_t at = 0, k = 0;
  for (;;) {
    if (at == avail) return DF_RUN_CUT;
    unsigned op = p[at];
    uint32_t idx;
    if (op == 'e') {
      if (k == 0) return DF_RUN_BAD; /* an empty run is never left for later */
      *n = (uint32_t)k;
      return DF_RUN_OK;
    }
    if (op == 'h') {
      if (avail - at < 2) return DF_RUN_CUT;
      idx = p[at + 1];
      at += 2;
    } else if (op == 'j') {
      if (avail - at < 5) return DF_RUN_CUT;
      idx = (uint32_t)p[at + 1] | (uint32_t)p[at + 2] << 8 | (uint32_t)p[at + 3] << 16 |
            (uint32_t)p[at + 4] << 24;
      at += 5;
    } else {
      return DF_RUN_BAD;
    }
    if (k == DF_MAX_GETS || !df_frame_of(d, idx, &fr[k])) return DF_RUN_BAD;
    k++;
  }
}

/* The run at off, read through the buffer: a read from off of `ahead` bytes (the runs asked next
 * lie within them), read again from off as a whole chunk (which holds the longest run) when the
 * buffer ends inside the run. */
static int df_run(deferred_t *d, uint64_t off, size_t ahead, uint32_t *fr, uint32_t *n,
                  ms_errbuf_t *eb, size_t rec) {
  for (int pass = 0;; pass++) {
    bool in = d->buf && off >= d->buf_off && off - d->buf_off < d->buf_len;
    if (!in || pass > 0) {
      int rc = df_fill_buf(d, off, pass > 0 ? DF_CHUNK : ahead);
      if (rc == MS_ENOMEM) return ms__errbuf_set(eb, rc, "out of memory");
      if (rc != MS_OK)
        return ms__errbuf_set(eb, rc, "cannot read the file again: %s", strerror(errno));
    }
    size_t skip = (size_t)(off - d->buf_off);
    int r = skip < d->buf_len ? df_parse(d, d->buf + skip, d->buf_len - skip, fr, n)
                              : DF_RUN_BAD;
    if (r == DF_RUN_OK) return MS_OK;
    /* cut by the buffer's end: once more from off, a whole chunk, unless it was one */
    if (r == DF_RUN_CUT && pass == 0 && (skip > 0 || d->buf_len < DF_CHUNK)) continue;
    return ms__errbuf_set(eb, MS_EFORMAT,
                          "the frames of trace entry %zu (at offset %" PRIu64
                          ") are no longer those read: the file changed",
                          rec, off);
  }
}

typedef struct df_want_s {
  uint64_t off; /* + 1, as the places hold it */
  size_t rec;
} df_want_t;

static int df_want_cmp(const void *a, const void *b) {
  const df_want_t *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* MS_OK when the file is still the one read, else MS_EIO (eb says so). */
static int df_same_file(const deferred_t *d, ms_errbuf_t *eb) {
  struct stat st;
  if (fstat(d->fd, &st) != 0 || st.st_dev != d->dev || st.st_ino != d->ino ||
      st.st_size != d->size || st.st_mtim.tv_sec != d->mtime.tv_sec ||
      st.st_mtim.tv_nsec != d->mtime.tv_nsec ||
      /* a change time that moved: its times set back after a write; not for a file removed or
       * renamed over since (that moves it too), which nobody can open to write any more */
      (st.st_nlink > 0 &&
       (st.st_ctim.tv_sec != d->ctime.tv_sec || st.st_ctim.tv_nsec != d->ctime.tv_nsec)))
    return ms__errbuf_set(eb, MS_EIO,
                          "the file changed since it was read: the stacks of its trace cannot "
                          "be read (run the command again)");
  return MS_OK;
}

int ms__snapshot_fill_stacks(const ms_snapshot_t *csnap, const size_t *trace_idx, size_t n,
                             ms_errbuf_t *eb) {
  deferred_t *d = df_of(csnap);
  if (!d || d->loc.n == 0 || n == 0) return MS_OK;
  ms_snapshot_t *snap = (ms_snapshot_t *)(uintptr_t)csnap; /* the part its load left for later */
  size_t nw = 0;
  for (size_t i = 0; i < n; i++)
    nw += df_loc(&d->loc, trace_idx[i]) != 0;
  if (nw == 0) return MS_OK;
  MS_FORWARD_IF_ERROR(df_same_file(d, eb));
  /* in the file's order, so that neighbouring runs come from one read */
  df_want_t *w = malloc(nw * sizeof *w);
  uint32_t *fr = malloc(DF_MAX_GETS * sizeof *fr);
  if (!w || !fr) {
    free(w);
    free(fr);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  nw = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t at = df_loc(&d->loc, trace_idx[i]);
    if (at) w[nw++] = (df_want_t){at, trace_idx[i]};
  }
  qsort(w, nw, sizeof *w, df_want_cmp);
  d->buf_len = 0; /* the file may have been read past since the last fill: nothing is kept */
  int rc = MS_OK;
  size_t j = 0; /* the last run of the cluster that w[i] begins or is in */
  for (size_t i = 0; i < nw && rc == MS_OK; i++) {
    size_t t = w[i].rec;
    if (!df_loc(&d->loc, t)) continue; /* asked twice */
    uint32_t nf = 0, id = 0;
    /* a read reaches the runs asked next while each is near the one before (copying a gap
     * costs less than another read), else it takes DF_RUN_BYTES */
    if (j < i) j = i;
    while (j + 1 < nw && w[j + 1].off - w[j].off <= DF_GAP &&
           w[j + 1].off - w[i].off <= DF_CHUNK - DF_RUN_BYTES)
      j++;
    size_t ahead = (size_t)(w[j].off - w[i].off) + DF_RUN_BYTES;
    rc = df_run(d, w[i].off - 1, ahead, fr, &nf, eb, t);
    if (rc == MS_OK) rc = df_intern(d, snap, fr, nf, &id);
    if (rc == MS_ENOMEM || rc == MS_ELIMIT) ms__errbuf_set(eb, rc, "out of memory");
    if (rc != MS_OK) break;
    snap->trace[t].stack = id;
    d->loc.off[t] = 0;
    d->loc.n--;
  }
  free(w);
  free(fr);
  return rc;
}

int ms__snapshot_scan_deferred(const ms_snapshot_t *snap, ms__deferred_visit_fn *fn, void *ctx,
                               ms_errbuf_t *eb) {
  deferred_t *d = df_of(snap);
  if (!d || d->loc.n == 0) return MS_OK;
  MS_FORWARD_IF_ERROR(df_same_file(d, eb));
  uint32_t *fr = malloc(DF_MAX_GETS * sizeof *fr);
  if (!fr) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  d->buf_len = 0; /* the file may have been read past since the last fill: nothing is kept */
  int rc = MS_OK;
  /* in the records' order, which is the file's: each read a whole chunk, the runs in it parsed
   * from the buffer */
  for (size_t t = 0; t < d->loc.cap && rc == MS_OK; t++) {
    uint64_t at = df_loc(&d->loc, t);
    if (!at) continue;
    uint32_t nf = 0;
    rc = df_run(d, at - 1, DF_CHUNK, fr, &nf, eb, t);
    if (rc == MS_OK) rc = fn(ctx, t, fr, nf);
  }
  free(fr);
  return rc;
}
