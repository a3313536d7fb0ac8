/* SPDX-License-Identifier: MIT
 * Tests for the data of the viewer's "Memory over time" view (viz/view/memory.c): on a snapshot
 * with a default-pool segment, a private pool and an expandable segment mapped and unmapped, the
 * buckets of allocated, reserved, mapped and reserved-minus-allocated bytes and the largest free
 * block of each pool at every step, as worked out by hand; on a trace longer than the buckets,
 * each bucket's maximum; null without a time index. tests/browser/view_memory.js draws them.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"
#include "view/memory.h"
#include "view/writer.h"

typedef struct tr_s {
  ms_trace_action a;
  uint64_t addr, size;
} tr_t;

typedef struct blk_s {
  uint64_t addr, size;
  bool allocated;
} blk_t;

static void add_segment(ms__snapbuild_t *b, uint64_t addr, uint64_t size, int64_t p0, int64_t p1,
                        bool expandable, const blk_t *blocks, size_t nblocks, uint32_t *first) {
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = addr;
  g.total_size = size;
  g.stack = MS_SNAP_NO_STACK;
  g.pool_id[0] = p0;
  g.pool_id[1] = p1;
  g.is_expandable = expandable;
  g.present = MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE;
  g.first_block = *first;
  for (size_t i = 0; i < nblocks; i++) {
    ms_snap_block_t bl;
    memset(&bl, 0, sizeof bl);
    bl.address = blocks[i].addr;
    bl.size = bl.requested_size = blocks[i].size;
    bl.state = blocks[i].allocated ? MS_BLOCK_ACTIVE_ALLOCATED : MS_BLOCK_INACTIVE;
    bl.state_name = blocks[i].allocated ? "active_allocated" : "inactive";
    bl.stack = MS_SNAP_NO_STACK;
    bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE;
    cr_assert_eq(ms__snapbuild_add_block(b, &bl), MS_OK);
  }
  g.nblocks = (uint32_t)nblocks;
  *first += (uint32_t)nblocks;
  cr_assert_eq(ms__snapbuild_add_segment(b, &g), MS_OK);
}

static ms_snapshot_t *finish(ms__snapbuild_t *b, const tr_t *tr, size_t ntr) {
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  for (size_t i = 0; i < ntr; i++) {
    ms_snap_trace_t t;
    memset(&t, 0, sizeof t);
    t.action = (uint8_t)tr[i].a;
    t.addr = tr[i].addr;
    t.size = tr[i].size;
    t.stack = MS_SNAP_NO_STACK;
    cr_assert_eq(ms__snapbuild_add_trace(b, &t), MS_OK);
  }
  d.ntrace = (uint32_t)ntr;
  cr_assert_eq(ms__snapbuild_add_device(b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

/* The JSON memory.c writes for device dev of s (NULL index: "null"); the caller frees it. */
static char *memory_json(const ms_snapshot_t *s, size_t dev, bool index) {
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  if (index) cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  ms_sink_t sink;
  th_memsink_t m;
  th_memsink_init(&sink, &m);
  vw_t *w = malloc(sizeof *w);
  cr_assert_not_null(w);
  vw_init(w, &sink);
  ms__view_memory_json(w, tl, dev);
  vw_flush(w);
  cr_assert_eq(w->err, MS_OK);
  free(w);
  ms_timeline_destroy(tl);
  char *out = malloc(m.len + 1);
  cr_assert_not_null(out);
  memcpy(out, m.data, m.len);
  out[m.len] = 0;
  th_memsink_free(&m);
  return out;
}

/* Segments at the end: S1 [0x100000, 8 KiB) of pool (0, 0), its first 4 KiB allocated; S2
 * [0x200000, 8 KiB) of the private pool (1, 2), its first 2 KiB allocated; S3 [0x300000, 8 KiB)
 * expandable, its first 4 KiB allocated. The trace reserves them, maps 12 KiB of S3, allocates
 * and frees in it, and unmaps its last 4 KiB. Step s is the state after s entries:
 *   step        0     1     2     3     4     5     6     7     8     9    10
 *   allocated   0     0  4096  4096  6144  6144 10240 14336 10240 10240 10240
 *   reserved    0  8192  8192 16384 16384 28672 28672 28672 28672 28672 24576
 *   mapped      0     0     0     0     0 12288 12288 12288 12288 12288  8192
 * (a block whose free is requested is no longer allocated); the largest free range of pool (0, 0):
 * S1 empty (8 KiB), then 4 KiB after its block, S3 mapped and empty (12 KiB), 8 KiB after its
 * first block, 4 KiB when both blocks are live (also while the second's free is only requested),
 * 8 KiB once it is freed, 4 KiB once the tail is unmapped; of pool (1, 2): S2 empty (8 KiB) from
 * step 3, 6 KiB after its block. */
Test(view_memory, pools_expandable_by_hand) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  uint32_t first = 0;
  blk_t s1[] = {{0x100000, 4096, true}, {0x101000, 4096, false}};
  blk_t s2[] = {{0x200000, 2048, true}, {0x200800, 6144, false}};
  blk_t s3[] = {{0x300000, 4096, true}, {0x301000, 4096, false}};
  add_segment(&b, 0x100000, 8192, 0, 0, false, s1, 2, &first);
  add_segment(&b, 0x200000, 8192, 1, 2, false, s2, 2, &first);
  add_segment(&b, 0x300000, 8192, 0, 0, true, s3, 2, &first);
  static const tr_t tr[] = {
      {MS_TRACE_SEGMENT_ALLOC, 0x100000, 8192}, {MS_TRACE_ALLOC, 0x100000, 4096},
      {MS_TRACE_SEGMENT_ALLOC, 0x200000, 8192}, {MS_TRACE_ALLOC, 0x200000, 2048},
      {MS_TRACE_SEGMENT_MAP, 0x300000, 12288},  {MS_TRACE_ALLOC, 0x300000, 4096},
      {MS_TRACE_ALLOC, 0x301000, 4096},         {MS_TRACE_FREE_REQUESTED, 0x301000, 4096},
      {MS_TRACE_FREE_COMPLETED, 0x301000, 4096}, {MS_TRACE_SEGMENT_UNMAP, 0x302000, 4096},
  };
  ms_snapshot_t *s = finish(&b, tr, sizeof tr / sizeof *tr);
  char *j = memory_json(s, 0, true);
  cr_assert_str_eq(j,
      "{\"steps\":11,\"step\":[0,1,2,3,4,5,6,7,8,9,10],"
      "\"allocated\":[0,0,4096,4096,6144,6144,10240,14336,10240,10240,10240],"
      "\"reserved\":[0,8192,8192,16384,16384,28672,28672,28672,28672,28672,24576],"
      "\"mapped\":[0,0,0,0,0,12288,12288,12288,12288,12288,8192],"
      "\"frag\":[0,8192,4096,12288,10240,22528,18432,14336,18432,18432,14336],"
      "\"free_step\":[0,1,2,3,4,5,6,7,8,9,10],\"free_pools\":[[0,0],[1,2]],"
      "\"largest_free\":[[0,8192,4096,4096,4096,12288,8192,4096,4096,8192,4096],"
      "[0,0,0,8192,6144,6144,6144,6144,6144,6144,6144]]}");
  free(j);
  /* without a time index, or for a device it does not know: null */
  j = memory_json(s, 0, false);
  cr_assert_str_eq(j, "null");
  free(j);
  j = memory_json(s, 7, true);
  cr_assert_str_eq(j, "null");
  free(j);
  ms_snapshot_free(s);
}

/* 1,200 allocations of 512 or 1,024 bytes in one segment, each freed (free_requested, then
 * free_completed) after the next one is allocated: past the buckets, bucket i holds steps
 * [i * steps / 512, (i + 1) * steps / 512) and their maxima, which a plain sum of the trace's
 * sizes gives here (allocated: alloc adds, free_requested takes away). */
Test(view_memory, buckets_hold_maxima) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  uint32_t first = 0;
  blk_t blk[] = {{0x100000, 1 << 20, false}};
  add_segment(&b, 0x100000, 1 << 20, 0, 0, false, blk, 1, &first);
  enum { N = 1200 };
  tr_t *tr = calloc(2 + 3 * N, sizeof *tr);
  cr_assert_not_null(tr);
  size_t n = 0;
  tr[n++] = (tr_t){MS_TRACE_SEGMENT_ALLOC, 0x100000, 1 << 20};
  for (size_t k = 0; k <= N; k++) {
    if (k < N) tr[n++] = (tr_t){MS_TRACE_ALLOC, 0x100000 + 2048 * (k % 2), k % 2 ? 1024 : 512};
    if (k > 0) {
      tr_t f = {MS_TRACE_FREE_REQUESTED, 0x100000 + 2048 * ((k - 1) % 2), (k - 1) % 2 ? 1024 : 512};
      tr[n++] = f;
      f.a = MS_TRACE_FREE_COMPLETED;
      tr[n++] = f;
    }
  }
  ms_snapshot_t *s = finish(&b, tr, n);
  size_t nsteps = n + 1;
  uint64_t *alloc = calloc(nsteps, sizeof *alloc);
  cr_assert_not_null(alloc);
  for (size_t e = 0; e < n; e++)
    alloc[e + 1] = alloc[e] + (tr[e].a == MS_TRACE_ALLOC ? tr[e].size : 0) -
                   (tr[e].a == MS_TRACE_FREE_REQUESTED ? tr[e].size : 0);
  free(tr);
  char *j = memory_json(s, 0, true);
  char want[64];
  snprintf(want, sizeof want, "{\"steps\":%zu,\"step\":[0,", nsteps);
  cr_assert(strncmp(j, want, strlen(want)) == 0, "%.80s", j);
  /* each bucket: its first step and its maximum of allocated and of reserved minus allocated */
  const char *p = strstr(j, "\"allocated\":[");
  const char *f = strstr(j, "\"frag\":[");
  const char *st = strstr(j, "\"step\":[");
  cr_assert(p && f && st);
  p += strlen("\"allocated\":[");
  f += strlen("\"frag\":[");
  st += strlen("\"step\":[");
  for (size_t i = 0; i < MS_VIEW_MEMORY_BUCKETS; i++) {
    size_t a = i * nsteps / MS_VIEW_MEMORY_BUCKETS, z = (i + 1) * nsteps / MS_VIEW_MEMORY_BUCKETS;
    uint64_t ma = 0, mf = 0;
    for (size_t k = a; k < z; k++) {
      uint64_t r = k ? 1u << 20 : 0;
      if (alloc[k] > ma) ma = alloc[k];
      if (r - alloc[k] > mf) mf = r - alloc[k];
    }
    char *end;
    cr_assert_eq(strtoull(st, &end, 10), a, "bucket %zu's first step", i);
    st = end + 1;
    cr_assert_eq(strtoull(p, &end, 10), ma, "bucket %zu's allocated", i);
    p = end + 1;
    cr_assert_eq(strtoull(f, &end, 10), mf, "bucket %zu's frag", i);
    f = end + 1;
  }
  cr_assert(strstr(j, "\"free_pools\":[[0,0]]"));
  free(alloc);
  free(j);
  ms_snapshot_free(s);
}
