/* SPDX-License-Identifier: MIT
 * memsnap core: the recorded device, the backend of `memsnap replay --check` (replay/internal.h;
 * replay.c's file comment says why it is not the sim): it returns, for a new segment, the address
 * the trace recorded when the allocator asks for the recorded size at that point (a synthetic far
 * address otherwise), and reports "out of memory" while an OOM-path release burst is reproduced.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay/internal.h"

/* ---- the recorded device (check mode's backend) ------------------------------------------------
 */

static int rdev_full(rdev_t *d, size_t size) {
  if (d->fail == RDEV_FAIL_ALL) return MS_EOOM;
  if (d->fail == RDEV_FAIL_UNTIL_FREES && d->frees_done < d->fail_frees) return MS_EOOM;
  if (d->need_sync && !d->synced) return MS_EOOM;
  if (d->capacity && (size > d->capacity || d->used > d->capacity - size)) return MS_EOOM;
  return MS_OK;
}

/* A synthetic range of size bytes (rounded to 2 MiB); MS_ENOMEM when the synthetic space is
 * spent (a hostile trace: ~13,000 unlimited reservations fit). */
static int rdev_synth(rdev_t *d, size_t size, uint64_t *out) {
  uint64_t len = ((uint64_t)size + RP_PAGE - 1) & ~(RP_PAGE - 1);
  if (len < size || d->synth + len < d->synth) return MS_ENOMEM;
  *out = d->synth;
  d->synth += len;
  return MS_OK;
}

int ms__rp_dev_add(rdev_t *d, uint64_t addr, uint64_t size, bool va) {
  return MS_VEC_PUSH(&d->ranges, ((rdev_range_t){addr, size, va})) == 0 ? MS_OK : MS_ENOMEM;
}

static size_t rdev_find(const rdev_t *d, uint64_t addr, bool va) {
  for (size_t i = d->ranges.len; i-- > 0;)
    if (d->ranges.ptr[i].addr == addr && d->ranges.ptr[i].va == va) return i;
  return SIZE_MAX;
}

static void rdev_remove(rdev_t *d, size_t i) {
  d->ranges.ptr[i] = d->ranges.ptr[d->ranges.len - 1];
  d->ranges.len--;
}

/* Whether [addr, addr+size) overlaps a live device allocation (a hostile or inconsistent trace;
 * reservations are not checked, their recorded size being unknown). */
static bool rdev_overlaps(const rdev_t *d, uint64_t addr, uint64_t size) {
  if (addr + size < addr) return true;
  for (size_t i = 0; i < d->ranges.len; i++) {
    const rdev_range_t *r = &d->ranges.ptr[i];
    if (!r->va && addr < r->addr + r->size && r->addr < addr + size) return true;
  }
  return false;
}

static int rdev_device_count(void *ctx, int *count) {
  const rdev_t *d = ctx;
  *count = d->ndevices > 0 ? d->ndevices : 1;
  return MS_OK;
}

static int rdev_malloc(void *ctx, int device, size_t size, ms_stream_t stream, ms_devptr_t *out) {
  rdev_t *d = ctx;
  (void)device, (void)stream;
  MS_FORWARD_IF_ERROR(rdev_full(d, size));
  uint64_t addr;
  if (d->expect_pos < d->expect.len && d->expect.ptr[d->expect_pos].size == size &&
      !rdev_overlaps(d, d->expect.ptr[d->expect_pos].addr, size))
    addr = d->expect.ptr[d->expect_pos++].addr;
  else /* then the comparison reports the difference (check) */
    MS_FORWARD_IF_ERROR(rdev_synth(d, size, &addr));
  MS_FORWARD_IF_ERROR(ms__rp_dev_add(d, addr, size, false));
  d->used += size;
  *out = (ms_devptr_t)addr;
  return MS_OK;
}

static int rdev_free(void *ctx, int device, ms_devptr_t ptr) {
  rdev_t *d = ctx;
  (void)device;
  size_t i = rdev_find(d, ptr, false);
  if (i == SIZE_MAX) return MS_EINVAL;
  d->used -= d->ranges.ptr[i].size;
  rdev_remove(d, i);
  d->frees_done++;
  return MS_OK;
}

static int rdev_mem_info(void *ctx, int device, size_t *free_bytes, size_t *total_bytes) {
  rdev_t *d = ctx;
  (void)device;
  size_t total = d->capacity ? d->capacity : d->total;
  *total_bytes = total;
  *free_bytes = d->used < total ? total - d->used : 0;
  return MS_OK;
}

static int rdev_handle(void *ctx, int device, uint64_t *out) {
  rdev_t *d = ctx;
  (void)device;
  *out = ++d->next_handle;
  return MS_OK;
}

static int rdev_ok2(void *ctx, int device, uint64_t h) {
  (void)ctx, (void)device, (void)h;
  return MS_OK;
}

static int rdev_event_record(void *ctx, int device, ms_event_t e, ms_stream_t s) {
  rdev_t *d = ctx;
  (void)device, (void)s;
  uint64_t v = 0;
  size_t slot;
  (void)rp_map_take(&d->done, (uint64_t)e, &v); /* a reused event is pending again */
  uint64_t g = rp_map_find(&d->gen, (uint64_t)e, &slot) ? d->gen.v[slot] + 1 : 1;
  MS_FORWARD_IF_ERROR(rp_map_put(&d->gen, (uint64_t)e, g));
  d->last_event = (uint64_t)e;
  d->last_gen = g;
  return MS_OK;
}

static int rdev_event_query(void *ctx, int device, ms_event_t e, bool *done) {
  rdev_t *d = ctx;
  (void)device;
  *done = rp_map_has(&d->done, (uint64_t)e);
  return MS_OK;
}

/* The allocator waits for the event: the program's work on that stream is done. */
static int rdev_event_sync(void *ctx, int device, ms_event_t e) {
  rdev_t *d = ctx;
  (void)device;
  d->synced = true;
  return rp_map_put(&d->done, (uint64_t)e, 1);
}

static int rdev_sync(void *ctx, int device) {
  (void)ctx, (void)device;
  return MS_OK;
}

static int rdev_va_reserve(void *ctx, int device, size_t size, ms_devptr_t *out) {
  rdev_t *d = ctx;
  (void)device;
  uint64_t addr;
  if (d->va_pos < d->va_bases.len) addr = d->va_bases.ptr[d->va_pos++];
  else MS_FORWARD_IF_ERROR(rdev_synth(d, size, &addr));
  MS_FORWARD_IF_ERROR(ms__rp_dev_add(d, addr, size, true));
  *out = (ms_devptr_t)addr;
  return MS_OK;
}

static int rdev_va_release(void *ctx, int device, ms_devptr_t addr, size_t size) {
  rdev_t *d = ctx;
  (void)device, (void)size;
  size_t i = rdev_find(d, addr, true);
  if (i == SIZE_MAX) return MS_EINVAL;
  rdev_remove(d, i);
  return MS_OK;
}

static int rdev_mem_map(void *ctx, int device, ms_devptr_t addr, size_t size) {
  rdev_t *d = ctx;
  (void)device, (void)addr;
  MS_FORWARD_IF_ERROR(rdev_full(d, size));
  d->used += size;
  return MS_OK;
}

static int rdev_mem_unmap(void *ctx, int device, ms_devptr_t addr, size_t size) {
  rdev_t *d = ctx;
  (void)device, (void)addr;
  d->used -= size < d->used ? size : d->used;
  d->frees_done++;
  return MS_OK;
}

static void rdev_destroy(void *ctx) {
  rdev_t *d = ctx;
  MS_VEC_FREE(&d->ranges);
  MS_VEC_FREE(&d->expect);
  MS_VEC_FREE(&d->va_bases);
  rp_map_free(&d->done);
  rp_map_free(&d->gen);
  free(d);
}

int ms__rp_dev_create(size_t capacity, size_t total, ms_backend_t **out, rdev_t **dev) {
  rdev_t *d = calloc(1, sizeof *d);
  if (!d) return MS_ENOMEM;
  d->capacity = capacity;
  d->total = total ? total : RP_UNLIMITED;
  d->synth = RP_SYNTH_BASE;
  ms_backend_ops_t ops = {
      .name = "recorded",
      .ctx = d,
      .device_count = rdev_device_count,
      .malloc = rdev_malloc,
      .free = rdev_free,
      .mem_info = rdev_mem_info,
      .stream_create = rdev_handle,
      .stream_destroy = rdev_ok2,
      .event_create = rdev_handle,
      .event_record = rdev_event_record,
      .event_query = rdev_event_query,
      .event_synchronize = rdev_event_sync,
      .event_destroy = rdev_ok2,
      .device_synchronize = rdev_sync,
      .va_reserve = rdev_va_reserve,
      .va_release = rdev_va_release,
      .mem_map = rdev_mem_map,
      .mem_unmap = rdev_mem_unmap,
      .stream_capture_info = NULL,
      .destroy = rdev_destroy,
  };
  int r = ms_backend_create(&ops, out);
  if (r != MS_OK) {
    free(d);
    return r;
  }
  *dev = d;
  return MS_OK;
}
