/* SPDX-License-Identifier: MIT
 * Benchmark of memsnap's snapshot file format (issue #3 section 7) on a synthetic snapshot of
 * 1,000,000 blocks (1,000 segments of 1,000 blocks, with stacks, history, traces, statistics and
 * settings: tests/helpers.c th_synth()).
 *
 * Everything goes to and from memory, not a file system: the writer's sink appends into one
 * buffer that is allocated and touched before the timed runs and reused (reference/performance.md:
 * first-touch page faults cost ~100x warm memory on this machine and would measure the
 * hypervisor); the reader reads from that buffer. glibc is told to keep freed memory
 * (mallopt), so the snapshot the reader builds lands in memory that earlier repetitions touched:
 * the first repetition is reported separately as the cold figure.
 *
 * Prints (MB = 10^6 bytes of uncompressed msgpack, medians of REPS runs):
 *   snapshot_write_mb_s       ms_snapshot_write, plain (target >= 500)
 *   snapshot_read_mb_s        ms_snapshot_read, plain, warm memory (target >= 500)
 *   snapshot_read_cold_mb_s   the same, first repetition (fresh pages for the model)
 *   msgpack_unpack_only_mb_s  msgpack-c's streaming unpacker alone on the same bytes (no
 *                             validation, no model): the ceiling of a reader built on msgpack-c
 *   snapshot_write_z_mb_s     ms_snapshot_write at level 1 (gzip)
 *   zlib1_mb_s                zlib level 1 alone on the same msgpack bytes, one deflate call with
 *                             the same settings (gzip container), in the same run
 *   snapshot_write_z_ratio    snapshot_write_z_mb_s / zlib1_mb_s (target >= 0.8)
 *   snapshot_read_z_mb_s      ms_snapshot_read of the compressed bytes (inflate + decode)
 *   snapshot_bytes            size of the plain file
 *   snapshot_z_bytes          size of the compressed file
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "memsnap/serialize.h"
#include "serialize_internal.h"
#include "zio.h"

#define REPS 5

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A sink into a fixed, pre-faulted buffer. */
typedef struct fixbuf_s {
  char *p;
  size_t len, cap;
} fixbuf_t;

static int fix_write(void *ctx, const char *buf, size_t n) {
  fixbuf_t *f = ctx;
  if (n > f->cap - f->len) return MS_ELIMIT;
  memcpy(f->p + f->len, buf, n);
  f->len += n;
  return MS_OK;
}

static void die(const char *what, const ms_errbuf_t *eb) {
  fprintf(stderr, "bench_snapshot: %s: %s\n", what, eb ? eb->msg : "");
  exit(1);
}

static double time_write(const ms_snapshot_t *s, int level, fixbuf_t *out) {
  ms_sink_t sink = {fix_write, out};
  ms_write_opts_t o = {level};
  ms_errbuf_t eb;
  out->len = 0;
  double t0 = now_s();
  if (ms_snapshot_write(s, &o, &sink, &eb) != MS_OK) die("write", &eb);
  return now_s() - t0;
}

static double time_read(const fixbuf_t *in, size_t expect_blocks) {
  ms_membuf_t mb;
  ms_source_t src;
  ms_source_init_mem(&src, &mb, in->p, in->len);
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  double t0 = now_s();
  if (ms_snapshot_read(&src, &r, &eb) != MS_OK) die("read", &eb);
  double t = now_s() - t0;
  if (r->nblocks != expect_blocks) die("read: wrong block count", NULL);
  ms_snapshot_free(r);
  return t;
}

int main(void) {
  /* Keep freed memory in the heap so that repetitions reuse touched pages (see above). */
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, -1);

  th_synth_opts_t o = {1000, 1000, 2000, 20000, 10000, 1, 12345};
  ms_snapshot_t *s = th_synth(&o);
  if (!s || s->nblocks != 1000000) die("building the synthetic snapshot", NULL);

  /* Size the buffers with a first, untimed write, and touch them. */
  fixbuf_t plain = {0}, z = {0}, zref = {0};
  plain.cap = (size_t)1 << 31;
  plain.p = malloc(plain.cap);
  if (!plain.p) die("out of memory", NULL);
  time_write(s, 0, &plain);
  size_t nbytes = plain.len;
  z.cap = zref.cap = ms__zio_deflate_bound(nbytes);
  z.p = malloc(z.cap);
  zref.p = malloc(zref.cap);
  if (!z.p || !zref.p) die("out of memory", NULL);
  memset(z.p, 0, z.cap);
  memset(zref.p, 0, zref.cap);

  double tw[REPS], tr[REPS + 1], tz[REPS], tzl[REPS], trz[REPS], tu[REPS];
  for (int i = 0; i < REPS; i++) tw[i] = time_write(s, 0, &plain);
  if (plain.len != nbytes) die("plain size changed between runs", NULL);
  for (int i = 0; i < REPS + 1; i++) tr[i] = time_read(&plain, s->nblocks);
  double cold = tr[0];
  for (int i = 0; i < REPS; i++) {
    double t0 = now_s();
    if (ms__serialize_unpack_only(plain.p, nbytes) <= 0) die("unpack only", NULL);
    tu[i] = now_s() - t0;
  }
  for (int i = 0; i < REPS; i++) {
    /* Alternate the two compressors so that any drift in machine load hits both alike. */
    tz[i] = time_write(s, 1, &z);
    double t0 = now_s();
    if (ms__zio_deflate_buffer(1, plain.p, nbytes, zref.p, zref.cap, &zref.len) != MS_OK)
      die("deflate", NULL);
    tzl[i] = now_s() - t0;
  }
  for (int i = 0; i < REPS; i++) trz[i] = time_read(&z, s->nblocks);

  double mb = (double)nbytes / 1e6;
  double w = mb / median(tw, REPS), r = mb / median(tr + 1, REPS);
  double wz = mb / median(tz, REPS), zl = mb / median(tzl, REPS);
  printf("snapshot_write_mb_s %.1f\n", w);
  printf("snapshot_read_mb_s %.1f\n", r);
  printf("snapshot_read_cold_mb_s %.1f\n", mb / cold);
  printf("msgpack_unpack_only_mb_s %.1f\n", mb / median(tu, REPS));
  printf("snapshot_write_z_mb_s %.1f\n", wz);
  printf("zlib1_mb_s %.1f\n", zl);
  printf("snapshot_write_z_ratio %.3f\n", wz / zl);
  printf("snapshot_read_z_mb_s %.1f\n", mb / median(trz, REPS));
  printf("snapshot_bytes %zu\n", nbytes);
  printf("snapshot_z_bytes %zu\n", z.len);
  free(plain.p);
  free(z.p);
  free(zref.p);
  ms_snapshot_free(s);
  return 0;
}
