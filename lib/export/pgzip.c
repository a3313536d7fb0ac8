/* SPDX-License-Identifier: MIT
 * memsnap exports: a gzip member compressed on several threads (pgzip.h). Each stream keeps a
 * ring of its chunks in flight, oldest first: a chunk is queued to the pool's workers when its
 * text is handed in, and written to the inner sink, in order, once done. The producer waits only
 * when the ring is full, so at most `ring` chunks (input and output) per stream are in memory.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "export/pgzip.h"

#define PGZ_DICT 32768u /* deflate's window: the text before a chunk that primes it */

enum { JOB_FREE, JOB_QUEUED, JOB_DONE };

typedef struct pgz_job_s {
  struct pgz_job_s *next; /* the pool's queue */
  char *in;
  size_t len;
  unsigned char dict[PGZ_DICT];
  size_t ndict;
  bool last;
  unsigned char *out;
  size_t cap_out, nout;
  uint32_t crc;
  int state; /* JOB_*, under the pool's lock */
  int err;
} pgz_job_t;

struct ms__pgz_pool_s {
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  pgz_job_t *head, *tail; /* queued, not yet taken */
  bool stop;
  int level, nthreads;
  pthread_t *th;
};

struct ms__pgz_s {
  ms__pgz_pool_t *pool;
  ms_sink_t *inner;
  size_t cap;
  pgz_job_t *ring;
  size_t nring, first, inflight; /* ring[first] is the oldest chunk in flight */
  char **spare;                  /* free input buffers */
  size_t nspare;
  unsigned char tail[PGZ_DICT]; /* the last bytes of the text so far */
  size_t ntail;
  uint32_t crc;
  uint64_t total;
  bool header;
  int err;
};

/* ---- the workers ----------------------------------------------------------------------------- */

static int pgz_room(pgz_job_t *j, size_t need) {
  if (j->cap_out - j->nout >= need) return MS_OK;
  size_t cap = j->cap_out + (j->cap_out >> 1) + need;
  unsigned char *p = realloc(j->out, cap);
  if (!p) return MS_ENOMEM;
  j->out = p;
  j->cap_out = cap;
  return MS_OK;
}

/* Raw-deflates j->in after its dictionary: a sync flush at the end, or the final block. */
static int pgz_deflate(z_stream *zs, pgz_job_t *j) {
  j->nout = 0;
  j->crc = (uint32_t)crc32(0L, Z_NULL, 0);
  if (deflateReset(zs) != Z_OK) return MS_ENOMEM;
  if (j->ndict && deflateSetDictionary(zs, j->dict, (uInt)j->ndict) != Z_OK) return MS_ENOMEM;
  const unsigned char *in = (const unsigned char *)j->in;
  size_t left = j->len;
  int flush = j->last ? Z_FINISH : Z_SYNC_FLUSH;
  for (;;) {
    size_t step = left > (1u << 30) ? (1u << 30) : left;
    zs->next_in = (Bytef *)(uintptr_t)in;
    zs->avail_in = (uInt)step;
    int f = step == left ? flush : Z_NO_FLUSH;
    for (;;) {
      if (pgz_room(j, (size_t)deflateBound(zs, zs->avail_in) + 64) != MS_OK) return MS_ENOMEM;
      zs->next_out = j->out + j->nout;
      zs->avail_out = (uInt)(j->cap_out - j->nout);
      int rc = deflate(zs, f);
      j->nout = j->cap_out - zs->avail_out;
      if (rc == Z_STREAM_END) break;
      if (rc != Z_OK && rc != Z_BUF_ERROR) return MS_ENOMEM;
      if (zs->avail_in == 0 && zs->avail_out != 0 && f != Z_FINISH) break;
    }
    if (step) j->crc = (uint32_t)crc32(j->crc, in, (uInt)step);
    in += step;
    left -= step;
    if (!left) return MS_OK;
  }
}

static void *pgz_worker(void *arg) {
  ms__pgz_pool_t *p = arg;
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  bool ok = deflateInit2(&zs, p->level, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->head && !p->stop) pthread_cond_wait(&p->work, &p->mu);
    pgz_job_t *j = p->head;
    if (!j) break;
    p->head = j->next;
    if (!p->head) p->tail = NULL;
    pthread_mutex_unlock(&p->mu);
    int err = ok ? pgz_deflate(&zs, j) : MS_ENOMEM;
    pthread_mutex_lock(&p->mu);
    j->err = err;
    j->state = JOB_DONE;
    pthread_cond_broadcast(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  if (ok) deflateEnd(&zs);
  return NULL;
}

int ms__pgz_pool_create(int workers, int level, ms__pgz_pool_t **out) {
  if (workers < 1 || workers > 256 || level < 1 || level > 9) return MS_EINVAL;
  ms__pgz_pool_t *p = calloc(1, sizeof *p);
  if (!p || !(p->th = malloc((size_t)workers * sizeof *p->th))) {
    free(p);
    return MS_ENOMEM;
  }
  p->level = level;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  while (p->nthreads < workers && pthread_create(&p->th[p->nthreads], NULL, pgz_worker, p) == 0)
    p->nthreads++;
  if (!p->nthreads) {
    ms__pgz_pool_destroy(p);
    return MS_ENOMEM;
  }
  *out = p;
  return MS_OK;
}

void ms__pgz_pool_destroy(ms__pgz_pool_t *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) pthread_join(p->th[i], NULL);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->mu);
  free(p->th);
  free(p);
}

/* ---- a stream -------------------------------------------------------------------------------- */

int ms__pgz_create(ms__pgz_pool_t *pool, ms_sink_t *inner, size_t cap, ms__pgz_t **out) {
  ms__pgz_t *z = calloc(1, sizeof *z);
  if (!z) return MS_ENOMEM;
  z->pool = pool;
  z->inner = inner;
  z->cap = cap ? cap : 1;
  z->nring = (size_t)pool->nthreads + 2; /* every worker busy, one being written, one queued */
  z->ring = calloc(z->nring, sizeof *z->ring);
  z->spare = calloc(z->nring + 2, sizeof *z->spare);
  if (!z->ring || !z->spare) {
    ms__pgz_destroy(z);
    return MS_ENOMEM;
  }
  *out = z;
  return MS_OK;
}

char *ms__pgz_buffer(ms__pgz_t *z) { return z->nspare ? z->spare[--z->nspare] : malloc(z->cap); }

static void pgz_put_spare(ms__pgz_t *z, char *b) {
  if (z->nspare < z->nring + 2)
    z->spare[z->nspare++] = b;
  else
    free(b);
}

static void pgz_emit(ms__pgz_t *z, const void *p, size_t n) {
  if (z->err == MS_OK && n) z->err = z->inner->write(z->inner->ctx, p, n);
}

/* Waits for the oldest chunk in flight, writes it and frees its slot. */
static void pgz_retire(ms__pgz_t *z) {
  pgz_job_t *j = &z->ring[z->first];
  pthread_mutex_lock(&z->pool->mu);
  while (j->state != JOB_DONE) pthread_cond_wait(&z->pool->done, &z->pool->mu);
  pthread_mutex_unlock(&z->pool->mu);
  if (z->err == MS_OK) z->err = j->err;
  if (!z->header) {
    /* gzip: deflate, no flags, no time, the extra flags of the level, OS unknown */
    unsigned char h[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255};
    h[8] = z->pool->level == 1 ? 4 : z->pool->level == 9 ? 2 : 0;
    pgz_emit(z, h, sizeof h);
    z->header = true;
  }
  pgz_emit(z, j->out, j->nout);
  z->crc = (uint32_t)crc32_combine(z->crc, j->crc, (z_off_t)j->len);
  z->total += j->len;
  if (j->in) pgz_put_spare(z, j->in);
  j->in = NULL;
  j->state = JOB_FREE;
  z->first = (z->first + 1) % z->nring;
  z->inflight--;
}

/* Queues len bytes at in (owned by the job from now) as the next chunk. */
static void pgz_submit(ms__pgz_t *z, char *in, size_t len, bool last) {
  if (z->inflight == z->nring) pgz_retire(z);
  pgz_job_t *j = &z->ring[(z->first + z->inflight) % z->nring];
  j->in = in;
  j->len = len;
  j->last = last;
  j->ndict = z->ntail;
  memcpy(j->dict, z->tail, z->ntail);
  /* the text's last PGZ_DICT bytes: the tail kept so far, then this chunk */
  if (len >= PGZ_DICT) {
    memcpy(z->tail, in + len - PGZ_DICT, PGZ_DICT);
    z->ntail = PGZ_DICT;
  } else {
    size_t keep = z->ntail + len > PGZ_DICT ? PGZ_DICT - len : z->ntail;
    memmove(z->tail, z->tail + z->ntail - keep, keep);
    if (len) memcpy(z->tail + keep, in, len); /* the last chunk may be empty (in is NULL) */
    z->ntail = keep + len;
  }
  z->inflight++;
  ms__pgz_pool_t *p = z->pool;
  pthread_mutex_lock(&p->mu);
  j->state = JOB_QUEUED;
  j->next = NULL;
  if (p->tail)
    p->tail->next = j;
  else
    p->head = j;
  p->tail = j;
  pthread_cond_signal(&p->work);
  pthread_mutex_unlock(&p->mu);
}

/* Writes the chunks at the front of the ring that are done, without waiting. */
static void pgz_drain(ms__pgz_t *z) {
  for (;;) {
    if (!z->inflight) return;
    pthread_mutex_lock(&z->pool->mu);
    bool done = z->ring[z->first].state == JOB_DONE;
    pthread_mutex_unlock(&z->pool->mu);
    if (!done) return;
    pgz_retire(z);
  }
}

int ms__pgz_write(ms__pgz_t *z, char **buf, size_t len) {
  if (z->err != MS_OK) return z->err;
  if (!len) return MS_OK;
  char *next = ms__pgz_buffer(z);
  if (!next) return z->err = MS_ENOMEM;
  pgz_submit(z, *buf, len, false);
  *buf = next;
  pgz_drain(z);
  return z->err;
}

int ms__pgz_finish(ms__pgz_t *z) {
  if (z->err != MS_OK) return z->err;
  pgz_submit(z, NULL, 0, true); /* the final block */
  while (z->inflight) pgz_retire(z);
  unsigned char t[8];
  uint32_t n = (uint32_t)z->total; /* ISIZE: the length mod 2^32 */
  for (int i = 0; i < 4; i++) {
    t[i] = (unsigned char)(z->crc >> (8 * i));
    t[4 + i] = (unsigned char)(n >> (8 * i));
  }
  pgz_emit(z, t, sizeof t);
  return z->err;
}

void ms__pgz_destroy(ms__pgz_t *z) {
  if (!z) return;
  if (z->ring) {
    pthread_mutex_lock(&z->pool->mu);
    for (size_t i = 0; i < z->nring; i++)
      while (z->ring[i].state == JOB_QUEUED) pthread_cond_wait(&z->pool->done, &z->pool->mu);
    pthread_mutex_unlock(&z->pool->mu);
    for (size_t i = 0; i < z->nring; i++) {
      free(z->ring[i].in);
      free(z->ring[i].out);
    }
  }
  for (size_t i = 0; z->spare && i < z->nspare; i++) free(z->spare[i]);
  free(z->spare);
  free(z->ring);
  free(z);
}
