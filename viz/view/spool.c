/* SPDX-License-Identifier: MIT
 * memsnap viewer: bytes written by one thread for another (spool.h).
 */
#include "spool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/error.h"

#define VSP_PIECE ((size_t)1 << 20) /* the drainer wakes when this much is waiting */

int view_mem_write(void *ctx, const char *buf, size_t len) {
  view_mem_t *m = ctx;
  if (len > m->cap - m->len) {
    size_t cap = m->cap ? m->cap : 1 << 20;
    while (len > cap - m->len) {
      if (cap > SIZE_MAX / 2) return MS_ENOMEM;
      cap *= 2;
    }
    char *q = realloc(m->p, cap);
    if (!q) return MS_ENOMEM;
    m->p = q;
    m->cap = cap;
  }
  memcpy(m->p + m->len, buf, len);
  m->len += len;
  return MS_OK;
}

int vsp_init(vsp_t *s) {
  memset(s, 0, sizeof *s);
  if (pthread_mutex_init(&s->mu, NULL) != 0) return MS_ENOMEM;
  if (pthread_cond_init(&s->cv, NULL) != 0) {
    pthread_mutex_destroy(&s->mu);
    return MS_ENOMEM;
  }
  return MS_OK;
}

static int vsp_write(void *ctx, const char *buf, size_t len) {
  vsp_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  size_t before = s->mem.len;
  int rc = view_mem_write(&s->mem, buf, len);
  if (before < VSP_PIECE && s->mem.len >= VSP_PIECE) pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void vsp_sink(vsp_t *s, ms_sink_t *sink) {
  sink->write = vsp_write;
  sink->ctx = s;
}

void vsp_close(vsp_t *s) {
  pthread_mutex_lock(&s->mu);
  s->closed = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int vsp_drain(vsp_t *s, ms_sink_t *out) {
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (s->mem.len < VSP_PIECE && !s->closed) pthread_cond_wait(&s->cv, &s->mu);
    view_mem_t m = s->mem; /* taken whole: the writer goes on into a new buffer */
    bool closed = s->closed;
    memset(&s->mem, 0, sizeof s->mem);
    pthread_mutex_unlock(&s->mu);
    int rc = m.len ? out->write(out->ctx, m.p, m.len) : MS_OK;
    free(m.p);
    if (rc != MS_OK) return rc < 0 ? rc : MS_EIO;
    if (closed) return MS_OK;
  }
}

void vsp_release(vsp_t *s) {
  free(s->mem.p);
  s->mem.p = NULL;
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
}
