/* SPDX-License-Identifier: MIT
 * Benchmark of memsnap's snapshot file format (issue #3 section 7) on a synthetic snapshot of
 * 1,000,000 blocks (1,000 segments of 1,000 blocks, with stacks, history, traces, statistics and
 * settings: tests/helpers.c th_synth()).
 *
 * Everything goes to and from memory, not a file system: the writer's sink appends into one
 * buffer that is allocated and touched before the timed runs and reused (docs/dev/measurements.md:
 * first-touch page faults cost ~100x warm memory on this machine and would measure the
 * hypervisor); the reader reads from that buffer. glibc is told to keep freed memory
 * (mallopt), so the snapshot the reader builds lands in memory that earlier repetitions touched:
 * the first repetition is reported separately as the cold figure.
 *
 * Rates are by CPU time of the process (CLOCK_PROCESS_CPUTIME_ID: user + system), which is robust
 * on the shared 2-core machine where other jobs preempt the benchmark; the *_wall_mb_s lines give
 * the wall-clock rates of the same runs (equal to the CPU rates on a quiet machine).
 *
 * Prints (MB = 10^6 bytes of uncompressed msgpack, medians of REPS runs):
 *   snapshot_write_mb_s       ms_snapshot_write, plain (target >= 500)
 *   snapshot_read_mb_s        ms_snapshot_read, plain, warm memory (target >= 500)
 *   snapshot_read_cold_mb_s   the same, first repetition (fresh pages for the model)
 *   msgpack_unpack_only_mb_s  msgpack-c's streaming unpacker alone on the same bytes (no
 *                             validation, no model): what a reader built on msgpack-c's object
 *                             tree could reach at best (the reader decodes rows itself since)
 *   snapshot_write_z_mb_s     ms_snapshot_write at level 1 (gzip)
 *   zlib1_mb_s                zlib level 1 alone on the same msgpack bytes, one deflate call with
 *                             the same settings (gzip container), in the same run
 *   snapshot_write_z_ratio    snapshot_write_z_mb_s / zlib1_mb_s (target >= 0.8)
 *   snapshot_read_z_mb_s      ms_snapshot_read of the compressed bytes (inflate + decode)
 *   snapshot_{write,read,read_cold}_wall_mb_s, msgpack_unpack_only_wall_mb_s
 *                             wall-clock rates of the same runs
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
#include "snapshot/msgpack_internal.h"
#include "snapshot/zio.h"
#include "bench_util.h"

#define REPS 5

/* A timed run: wall-clock and CPU seconds. */
typedef struct span_s {
  double wall, cpu;
} span_t;

static span_t span_start(void) {
  span_t t = {now_s(), cpu_s()};
  return t;
}

static span_t span_end(span_t t0) {
  span_t t = {now_s() - t0.wall, cpu_s() - t0.cpu};
  return t;
}

/* Medians of the CPU and of the wall-clock seconds of n runs. */
static span_t median_span(const span_t *t, int n) {
  double c[16], w[16];
  for (int i = 0; i < n; i++)
    c[i] = t[i].cpu, w[i] = t[i].wall;
  span_t m = {median(w, n), median(c, n)};
  return m;
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

static span_t time_write(const ms_snapshot_t *s, int level, fixbuf_t *out) {
  ms_sink_t sink = {fix_write, out};
  ms_write_opts_t o = {level};
  ms_errbuf_t eb;
  out->len = 0;
  span_t t0 = span_start();
  if (ms_snapshot_write(s, &o, &sink, &eb) != MS_OK) die("write", &eb);
  return span_end(t0);
}

static span_t time_read(const fixbuf_t *in, size_t expect_blocks) {
  ms_membuf_t mb;
  ms_source_t src;
  ms_source_init_mem(&src, &mb, in->p, in->len);
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  span_t t0 = span_start();
  if (ms_snapshot_read(&src, &r, &eb) != MS_OK) die("read", &eb);
  span_t t = span_end(t0);
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

  span_t tw[REPS], tr[REPS + 1], tz[REPS], tzl[REPS], trz[REPS], tu[REPS];
  for (int i = 0; i < REPS; i++)
    tw[i] = time_write(s, 0, &plain);
  if (plain.len != nbytes) die("plain size changed between runs", NULL);
  for (int i = 0; i < REPS + 1; i++)
    tr[i] = time_read(&plain, s->nblocks);
  span_t cold = tr[0];
  for (int i = 0; i < REPS; i++) {
    span_t t0 = span_start();
    if (ms__serialize_unpack_only(plain.p, nbytes) <= 0) die("unpack only", NULL);
    tu[i] = span_end(t0);
  }
  for (int i = 0; i < REPS; i++) {
    /* Alternate the two compressors so that any drift in machine load hits both alike. */
    tz[i] = time_write(s, 1, &z);
    span_t t0 = span_start();
    if (ms__zio_deflate_buffer(1, plain.p, nbytes, zref.p, zref.cap, &zref.len) != MS_OK)
      die("deflate", NULL);
    tzl[i] = span_end(t0);
  }
  for (int i = 0; i < REPS; i++)
    trz[i] = time_read(&z, s->nblocks);

  double mb = (double)nbytes / 1e6;
  span_t w = median_span(tw, REPS), r = median_span(tr + 1, REPS), u = median_span(tu, REPS);
  double wz = mb / median_span(tz, REPS).cpu, zl = mb / median_span(tzl, REPS).cpu;
  printf("snapshot_write_mb_s %.1f\n", mb / w.cpu);
  printf("snapshot_read_mb_s %.1f\n", mb / r.cpu);
  printf("snapshot_read_cold_mb_s %.1f\n", mb / cold.cpu);
  printf("msgpack_unpack_only_mb_s %.1f\n", mb / u.cpu);
  printf("snapshot_write_z_mb_s %.1f\n", wz);
  printf("zlib1_mb_s %.1f\n", zl);
  printf("snapshot_write_z_ratio %.3f\n", wz / zl);
  printf("snapshot_read_z_mb_s %.1f\n", mb / median_span(trz, REPS).cpu);
  printf("snapshot_write_wall_mb_s %.1f\n", mb / w.wall);
  printf("snapshot_read_wall_mb_s %.1f\n", mb / r.wall);
  printf("snapshot_read_cold_wall_mb_s %.1f\n", mb / cold.wall);
  printf("msgpack_unpack_only_wall_mb_s %.1f\n", mb / u.wall);
  printf("snapshot_bytes %zu\n", nbytes);
  printf("snapshot_z_bytes %zu\n", z.len);
  free(plain.p);
  free(z.p);
  free(zref.p);
  ms_snapshot_free(s);
  return 0;
}
