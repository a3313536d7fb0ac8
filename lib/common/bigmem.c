/* SPDX-License-Identifier: MIT
 * memsnap core: large arrays that one process frees and allocates again (common/internal.h,
 * "bigmem.c"): a read's working tables, then the time index built on what it read.
 *
 * A fresh anonymous page is zeroed by the kernel when first touched and, in a virtual machine,
 * may first have to be faulted in by the host; on the 1 GB bench pickle that cost a third of
 * `memsnap timeline`'s CPU time, and varied from run to run with the host. With the option
 * MS_REUSE_MEMORY on (the CLI sets it: a short-lived process), an array of BIG_MIN bytes or more
 * is an anonymous mapping that is kept when freed, and the next large array takes those pages,
 * already resident: no zeroing by the kernel, no fault. With the option off (the library's
 * default, for programs that embed it), a freed mapping goes back to the system at once, as
 * free() would give it.
 *
 * Every array starts BIG_HDR bytes into its block, after a header that says how it was made
 * (a mapping and its length, or malloc) and how many bytes were asked for. A kept range is handed
 * out whole or split: the head is the new array, the tail stays kept; a range given back is
 * joined with the kept ranges it touches, so that the pieces of one mapping become one range
 * again. A mapping grows into the kept range right after it when there is one (in place);
 * else by mremap (its pages move, nothing is copied), the new part then filled with kept pages
 * moved there (mremap again), so that a second file read after a first (compare's two sides)
 * takes the first one's pages rather than fresh ones. A range joined from pieces, or filled in,
 * may span several of the kernel's mappings, which mremap cannot grow: such a mapping moves to a
 * new one part by part. Thread-safe: the kept list has a lock. Off Linux (no mremap) every array
 * is malloc's.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/vec.h"
#include "memsnap/options.h"

#if defined(__linux__)
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mremap */
#endif
#include <sys/mman.h>
#include <unistd.h>
#define BIG_MAPS 1
#else
#define BIG_MAPS 0
#endif

#define BIG_HDR ((size_t)64)
#define BIG_MIN ((size_t)1 << 20)  /* smaller arrays are malloc's */
#define BIG_HUGE ((size_t)4 << 20) /* fresh mappings this large get huge-page advice */
#define BIG_KEEP_MAX 64            /* kept ranges; a free beyond them is given back */

typedef struct big_hdr_s {
  size_t map;  /* length of the mapping the array begins; 0: malloc'd */
  size_t size; /* bytes asked for */
  bool sparse; /* written here and there (ms__big_sparse): grows into untouched pages */
} big_hdr_t;
_Static_assert(sizeof(big_hdr_t) <= BIG_HDR, "the header fits before the array");

static big_hdr_t *big_hdr(void *p) {
  return (big_hdr_t *)(void *)((char *)p - BIG_HDR);
}

static void *big_from_malloc(size_t bytes) {
  if (bytes > SIZE_MAX - BIG_HDR) return NULL;
  big_hdr_t *h = malloc(bytes + BIG_HDR);
  if (!h) return NULL;
  h->map = 0;
  h->size = bytes;
  h->sparse = false;
  return (char *)h + BIG_HDR;
}

#if BIG_MAPS

typedef struct big_range_s {
  char *addr;
  size_t len;
} big_range_t;

static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;
static big_range_t big_kept[BIG_KEEP_MAX];
static size_t big_nkept;
/* Bytes of the kept ranges, of the mappings in use, and the most ever in use: kept plus in use
 * stays within that most (one snapshot's working set, however many are read one after another),
 * kept ranges that no array took being given back before a new mapping is made. */
static size_t big_kept_bytes, big_live, big_live_max;

/* In a child of fork, the lock may have been held by a thread that the child does not have (a
 * program under `memsnap run` whose snapshot thread freed an array while another thread forked):
 * the child starts with the lock free and no kept ranges (their pages stay mapped in the child,
 * unused; the counts are the parent's, which only bound what is kept). Registered at the first
 * lock, before which no thread can hold it. */
static pthread_once_t big_fork_once = PTHREAD_ONCE_INIT;

static void big_fork_child(void) {
  pthread_mutex_init(&big_lock, NULL);
  big_nkept = 0;
  big_kept_bytes = 0;
}

static void big_fork_register(void) {
  (void)pthread_atfork(NULL, NULL, big_fork_child);
}

static void big_lock_take(void) {
  pthread_once(&big_fork_once, big_fork_register);
  pthread_mutex_lock(&big_lock);
}

static size_t big_page(void) {
  long pg = sysconf(_SC_PAGESIZE);
  return pg > 0 && (pg & (pg - 1)) == 0 ? (size_t)pg : 4096;
}

/* The mapping length for an array of bytes; 0 on overflow. */
static size_t big_map_len(size_t bytes) {
  size_t pg = big_page();
  if (bytes > SIZE_MAX - BIG_HDR - pg) return 0;
  return (bytes + BIG_HDR + pg - 1) & ~(pg - 1);
}

static bool big_reusing(void) {
  return ms_option_is_enabled(MS_OPTION_REUSE_MEMORY);
}

/* Huge-page advice for a mapping past BIG_HUGE, given whenever one is made or grown (a mapping
 * grown by mremap from below BIG_HUGE would otherwise fault in 4 KiB pages: 20,000 faults instead
 * of 40 for the 80 MB of a 1 GB pickle's memo). */
static void big_advise(void *m, size_t len) {
#ifdef MADV_HUGEPAGE
  if (len >= BIG_HUGE) (void)madvise(m, len, MADV_HUGEPAGE);
#else
  (void)m, (void)len;
#endif
}

/* Gives every kept range back (the option was turned off). Called with the lock held. */
static void big_trim_locked(void) {
  for (size_t i = 0; i < big_nkept; i++)
    munmap(big_kept[i].addr, big_kept[i].len);
  big_nkept = 0;
  big_kept_bytes = 0;
}

/* Before `more` bytes of new mappings come into use: gives kept ranges back, the largest first,
 * until kept and in use, with them, stay within the most ever in use (or what is in use then,
 * if that is more). Without it each file of many read one after another left its pieces kept
 * while the next file's arrays took new mappings beside them, and a process reading 12 files
 * held several files' memory. Called with the lock held. */
static void big_bound_locked(size_t more) {
  size_t live = big_live + more, max = big_live_max > live ? big_live_max : live;
  while (big_nkept && big_kept_bytes > max - live) {
    size_t largest = 0;
    for (size_t i = 1; i < big_nkept; i++)
      if (big_kept[i].len > big_kept[largest].len) largest = i;
    munmap(big_kept[largest].addr, big_kept[largest].len);
    big_kept_bytes -= big_kept[largest].len;
    big_kept[largest] = big_kept[--big_nkept];
  }
}

/* `more` bytes of mappings came into use. Called with the lock held. */
static void big_use_locked(size_t more) {
  big_live += more;
  if (big_live > big_live_max) big_live_max = big_live;
}

/* Takes len bytes from the head of kept range i (its tail stays kept) into use. Called with the
 * lock held. */
static char *big_cut_locked(size_t i, size_t len) {
  char *got = big_kept[i].addr;
  big_kept_bytes -= len;
  if (big_kept[i].len > len) {
    big_kept[i].addr += len;
    big_kept[i].len -= len;
  } else {
    big_kept[i] = big_kept[--big_nkept];
  }
  big_use_locked(len);
  return got;
}

/* The smallest kept range of at least len bytes; SIZE_MAX when none is. Called with the lock
 * held. */
static size_t big_fit_locked(size_t len) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < big_nkept; i++)
    if (big_kept[i].len >= len && (best == SIZE_MAX || big_kept[i].len < big_kept[best].len))
      best = i;
  return best;
}

/* Moves the pages of [src, src + n) to dst, replacing what is mapped there (both page-aligned):
 * one mremap for a part within one of the kernel's mappings, halves of a part that spans two.
 * @return the bytes moved from src's start (the rest stays where it was). */
static size_t big_move(char *src, char *dst, size_t n, size_t pg) {
  if (mremap(src, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, dst) != MAP_FAILED) return n;
  if (errno != EFAULT || n < 2 * pg) return 0;
  size_t half = (n / 2) & ~(pg - 1), done = big_move(src, dst, half, pg);
  return done < half ? done : half + big_move(src + half, dst + half, n - half, pg);
}

/* Fills [dst, dst + n), new pages of a mapping just grown, with the pages of kept ranges (their
 * heads, the largest range first), which are resident: no page there is zeroed by the kernel
 * then. @return the bytes filled from dst's start. Called with the lock held. */
static size_t big_fill_locked(char *dst, size_t n) {
  size_t pg = big_page(), filled = 0;
  while (filled < n && big_nkept) {
    size_t i = 0;
    for (size_t k = 1; k < big_nkept; k++)
      if (big_kept[k].len > big_kept[i].len) i = k;
    big_range_t *r = &big_kept[i];
    size_t want = r->len < n - filled ? r->len : n - filled;
    size_t got = big_move(r->addr, dst + filled, want, pg);
    big_kept_bytes -= got;
    r->addr += got;
    r->len -= got;
    if (!r->len) big_kept[i] = big_kept[--big_nkept];
    filled += got;
    if (got < want) break; /* a part that would not move */
  }
  return filled;
}

/* A mapping of len bytes: a kept range when one is large enough (the smallest such; its tail
 * stays kept), else the largest kept range grown by mremap and filled with the other kept
 * ranges' pages, else a fresh mapping (always, for a sparse array: kept pages would be resident
 * where it writes nothing). *dirty: how many bytes from its start may hold old data (the rest
 * reads as zeros). NULL when out of memory. */
static char *big_take(size_t len, size_t *dirty, bool sparse) {
  *dirty = 0;
  char *got = NULL;
  bool reuse = big_reusing(); /* read before the lock: a first read may warn through the hook */
  big_lock_take();
  if (!reuse) big_trim_locked();
  size_t best = sparse ? SIZE_MAX : big_fit_locked(len), largest = SIZE_MAX;
  for (size_t i = 0; i < big_nkept && !sparse; i++)
    if (largest == SIZE_MAX || big_kept[i].len > big_kept[largest].len) largest = i;
  if (best != SIZE_MAX) {
    got = big_cut_locked(best, len);
    pthread_mutex_unlock(&big_lock);
    *dirty = len;
    return got;
  }
  if (largest != SIZE_MAX) {
    big_range_t r = big_kept[largest];
    big_kept[largest] = big_kept[--big_nkept];
    big_kept_bytes -= r.len;
    /* fails (EFAULT) when r spans two of the kernel's mappings: r is given back */
    void *m = mremap(r.addr, r.len, len, MREMAP_MAYMOVE);
    if (m != MAP_FAILED) {
      got = m;
      *dirty = r.len + big_fill_locked(got + r.len, len - r.len);
      big_advise(m, len);
    } else {
      munmap(r.addr, r.len);
    }
  }
  if (!got) big_bound_locked(len);
  big_use_locked(len); /* a failed mmap below gives it back */
  if (got) big_bound_locked(0);
  pthread_mutex_unlock(&big_lock);
  if (got) return got;
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    big_lock_take();
    big_live -= len;
    pthread_mutex_unlock(&big_lock);
    return NULL;
  }
  big_advise(m, len);
  return m;
}

/* Keeps the range [addr, addr + len), joined with the kept ranges it touches, so that the pieces
 * a range was cut into are one range again once all are back (the next file's arrays grow to
 * the sizes the previous one's reached). @return false when the list is full: the caller gives
 * the range (and what it joined) back. Called with the lock held. */
static bool big_keep_locked(char **addr, size_t *len) {
  for (size_t i = 0; i < big_nkept;) {
    big_range_t r = big_kept[i];
    if (r.addr + r.len == *addr) {
      *addr = r.addr;
    } else if (*addr + *len != r.addr) {
      i++;
      continue;
    }
    *len += r.len;
    big_kept_bytes -= r.len;
    big_kept[i] = big_kept[--big_nkept]; /* index i is looked at again */
  }
  if (big_nkept == BIG_KEEP_MAX) return false;
  big_kept[big_nkept++] = (big_range_t){*addr, *len};
  big_kept_bytes += *len;
  return true;
}

/* The bytes of [addr, addr + len) up to the end of its last resident page: past it, pages were
 * never touched (a vector's room it did not fill), and kept they would hand the next array
 * fresh pages as if they were resident. len when it cannot be known. */
static size_t big_resident(char *addr, size_t len) {
  size_t pg = big_page(), end = len / pg;
  unsigned char v[1024];
  while (end) {
    size_t k = end < sizeof v ? end : sizeof v;
    if (mincore(addr + (end - k) * pg, k * pg, v) != 0) return len;
    for (size_t i = k; i-- > 0;)
      if (v[i] & 1) return (end - k + i + 1) * pg;
    end -= k;
  }
  return 0;
}

/* Keeps the range [addr, addr + len) for the next array (its resident parts: the rest is given
 * back), or gives it back. A range with long runs of pages never touched inside it (an array
 * written only here and there: the pickle reader's memo of values beside that of containers) is
 * kept as its resident pieces, the runs of BIG_GAP bytes or more given back: kept whole, the
 * next arrays would take its fresh pages while the resident ones of other ranges stayed idle. */
#define BIG_GAP ((size_t)2 << 20)
static void big_give(char *addr, size_t len) {
  bool reuse = big_reusing();
  size_t keep = reuse ? big_resident(addr, len) : 0;
  if (keep < len) munmap(addr + keep, len - keep);
  /* the resident pieces of [addr, addr + keep), found page by page; the last one runs from
   * where the scan stopped (at keep, or at a failed mincore, or with no room for more pieces) */
  big_range_t piece[BIG_KEEP_MAX];
  size_t npiece = 0, pg = big_page(), npages = keep / pg, start = 0, gap = 0, i = 0;
  unsigned char v[1024];
  while (keep > BIG_GAP && i < npages && npiece < BIG_KEEP_MAX - 1) {
    size_t k = npages - i < sizeof v ? npages - i : sizeof v;
    if (mincore(addr + i * pg, k * pg, v) != 0) break;
    for (size_t j = 0; j < k && npiece < BIG_KEEP_MAX - 1; j++, i++) {
      if (!(v[j] & 1)) {
        gap++;
        continue;
      }
      if (gap * pg >= BIG_GAP) { /* give the gap back; a piece before it ends there */
        if (i - gap > start)
          piece[npiece++] = (big_range_t){addr + start * pg, (i - gap - start) * pg};
        munmap(addr + (i - gap) * pg, gap * pg);
        start = i;
      }
      gap = 0;
    }
  }
  if (keep > start * pg) piece[npiece++] = (big_range_t){addr + start * pg, keep - start * pg};
  big_lock_take();
  big_live -= len;
  bool kept[BIG_KEEP_MAX];
  for (size_t k = 0; k < npiece; k++)
    kept[k] = big_keep_locked(&piece[k].addr, &piece[k].len);
  if (!reuse) big_trim_locked();
  pthread_mutex_unlock(&big_lock);
  for (size_t k = 0; k < npiece; k++)
    if (!kept[k]) munmap(piece[k].addr, piece[k].len);
}

static void *big_alloc(size_t bytes, bool zero, bool sparse) {
  if (bytes + BIG_HDR < BIG_MIN || bytes > SIZE_MAX - BIG_HDR) {
    void *p = big_from_malloc(bytes);
    if (p && zero) memset(p, 0, bytes);
    if (p) big_hdr(p)->sparse = sparse;
    return p;
  }
  size_t len = big_map_len(bytes), dirty;
  if (!len) return NULL;
  char *m = big_take(len, &dirty, sparse);
  if (!m) return NULL;
  big_hdr_t *h = (big_hdr_t *)(void *)m;
  h->map = len;
  h->size = bytes;
  h->sparse = sparse;
  char *p = m + BIG_HDR;
  if (zero && dirty > BIG_HDR) memset(p, 0, dirty - BIG_HDR < bytes ? dirty - BIG_HDR : bytes);
  return p;
}

/* Grows the mapping of h to len bytes into the kept range that follows it, in place. @return
 * whether one did. */
static bool big_grow_in_place(big_hdr_t *h, size_t len) {
  char *end = (char *)h + h->map;
  size_t more = len - h->map;
  bool grown = false;
  big_lock_take();
  for (size_t i = 0; i < big_nkept && !grown; i++)
    if (big_kept[i].addr == end && big_kept[i].len >= more) {
      big_cut_locked(i, more);
      grown = true;
    }
  pthread_mutex_unlock(&big_lock);
  if (grown) {
    big_advise(h, len);
    h->map = len;
  }
  return grown;
}

/* Grows the mapping of h to len bytes elsewhere, its new part filled with kept pages as far as
 * they go: by mremap, or, when h spans two of the kernel's mappings (kept ranges joined or
 * filled in), into a new mapping by moving its pages there part by part. @return its header;
 * NULL when out of memory (h unchanged). */
static big_hdr_t *big_grow_moved(big_hdr_t *h, size_t len) {
  size_t old = h->map;
  bool sparse = h->sparse; /* h moves with the pages */
  big_lock_take();
  big_use_locked(len - old);
  char *m = mremap(h, old, len, MREMAP_MAYMOVE);
  if (m == MAP_FAILED) {
    m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      big_live -= len - old;
      pthread_mutex_unlock(&big_lock);
      return NULL;
    }
    size_t moved = big_move((char *)h, m, old, big_page());
    if (moved < old) { /* (a part that would not move is copied) */
      memcpy(m + moved, (char *)h + moved, old - moved);
      munmap((char *)h + moved, old - moved);
    }
  }
  if (!sparse) big_fill_locked(m + old, len - old);
  big_bound_locked(0);
  pthread_mutex_unlock(&big_lock);
  big_advise(m, len);
  h = (big_hdr_t *)(void *)m;
  h->map = len;
  return h;
}

void *ms__big_realloc(void *p, size_t bytes) {
  if (!p) return big_alloc(bytes, false, false);
  big_hdr_t *h = big_hdr(p);
  if (h->map) {
    size_t len = big_map_len(bytes);
    if (!len) return NULL;
    if (len > h->map && (h->sparse || !big_grow_in_place(h, len))) {
      big_hdr_t *g = big_grow_moved(h, len);
      if (!g) return NULL;
      h = g;
    }
    h->size = bytes;
    return (char *)h + BIG_HDR;
  }
  if (bytes + BIG_HDR < BIG_MIN) {
    big_hdr_t *n = realloc(h, bytes + BIG_HDR);
    if (!n) return NULL;
    n->size = bytes;
    return (char *)n + BIG_HDR;
  }
  void *q = big_alloc(bytes, false, h->sparse);
  if (!q) return NULL;
  memcpy(q, p, h->size < bytes ? h->size : bytes);
  free(h);
  return q;
}

void ms__big_free(void *p) {
  if (!p) return;
  big_hdr_t *h = big_hdr(p);
  if (h->map)
    big_give((char *)h, h->map);
  else
    free(h);
}

#else /* no mremap: malloc's arrays behind the same header */

static void *big_alloc(size_t bytes, bool zero, bool sparse) {
  (void)sparse; /* malloc's pages: nothing to choose */
  void *p = big_from_malloc(bytes);
  if (p && zero) memset(p, 0, bytes);
  return p;
}

void *ms__big_realloc(void *p, size_t bytes) {
  if (!p) return big_alloc(bytes, false, false);
  if (bytes > SIZE_MAX - BIG_HDR) return NULL;
  big_hdr_t *n = realloc(big_hdr(p), bytes + BIG_HDR);
  if (!n) return NULL;
  n->size = bytes;
  return (char *)n + BIG_HDR;
}

void ms__big_free(void *p) {
  if (p) free(big_hdr(p));
}

#endif

void *ms__big_malloc(size_t bytes) {
  return big_alloc(bytes, false, false);
}

void *ms__big_calloc(size_t n, size_t elem) {
  if (elem && n > SIZE_MAX / elem) return NULL;
  return big_alloc(n * elem, true, false);
}

void ms__big_sparse(void *p) {
  if (p) big_hdr(p)->sparse = true;
}

/* A vector of this many bytes or more grows by an eighth, not by doubling: growing a mapping
 * moves its pages (mremap) and copies nothing, and the room a doubling adds is filled with kept
 * pages (big_fill_locked) that the vector may never use. A second file read in one process
 * (compare's AFTER) then took up to half of its largest tables' pages fresh from the kernel while
 * the first file's pages stayed kept. */
#define BIG_VEC_SLOW ((size_t)64 << 20)

int ms__big_vec_reserve(void **ptr, size_t *cap, size_t len, size_t extra, size_t elem) {
  if (extra <= *cap - len) return 0;
  size_t ncap = ms__vec_grown_cap(*cap, len, extra, elem);
  if (!ncap) return -1;
  if (*cap >= BIG_VEC_SLOW / elem) { /* len + extra is known not to overflow here */
    size_t need = len + extra, step = *cap + *cap / 8;
    ncap = need > step ? need : step;
    if (ncap > SIZE_MAX / elem) return -1;
  }
  void *p = ms__big_realloc(*ptr, ncap * elem);
  if (!p) return -1;
  *ptr = p;
  *cap = ncap;
  return 0;
}
