/* SPDX-License-Identifier: MIT
 * memsnap viewer (viz/view): bytes written by one thread for another. A part of the page that a
 * thread of its own writes (the trace element, the Explain answers) goes into memory (view_mem_t,
 * a growing buffer read once it is done), or into a spool (vsp_t) that the page's own thread
 * drains into the page as the bytes come, once it has reached their place: the sink of the page
 * is only ever called from the page's thread, and the part is not held whole in memory.
 */
#ifndef MEMSNAP_VIZ_VIEW_SPOOL_H
#define MEMSNAP_VIZ_VIEW_SPOOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "memsnap/serialize.h"

/* A growing buffer as a sink (one thread at a time). */
typedef struct view_mem_s {
  char *p;
  size_t len, cap;
} view_mem_t;

/* Appends; @return MS_OK or MS_ENOMEM. ctx is a view_mem_t. */
int view_mem_write(void *ctx, const char *buf, size_t len);

typedef struct vsp_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  view_mem_t mem; /* written, not drained yet */
  bool closed;    /* the writer is done */
} vsp_t;

/* @return MS_OK, or MS_ENOMEM (no mutex: nothing to release). */
int vsp_init(vsp_t *s);
/* The writer's sink (any one thread): its bytes are kept until drained. */
void vsp_sink(vsp_t *s, ms_sink_t *sink);
/* The writer is done (called once, after its last write). */
void vsp_close(vsp_t *s);
/* Writes what the writer writes into out, as it comes (in pieces of about 1 MiB), until it has
 * closed and all of it is written. @return MS_OK or out's error (the rest is then dropped). */
int vsp_drain(vsp_t *s, ms_sink_t *out);
void vsp_release(vsp_t *s);

#endif
