/* SPDX-License-Identifier: MIT
 * memsnap CUDA sample 4 (issue #15): many threads sharing one caching allocator on a real GPU,
 * written to be run under compute-sanitizer (memcheck, racecheck) by scripts/gpu-verify.sh.
 *
 *   cuda_stress [--threads 8] [--ops 2000]
 *
 * Each thread has its own non-blocking stream and runs its own xorshift sequence: malloc of a
 * log-uniform size (256 B .. 16 MiB) on its stream, a kernel filling the block with the block's
 * tag, free (after record_stream onto the next thread's stream now and then, so that a free waits
 * for another thread's stream), empty_cache now and then, and every 64 operations a check that
 * each live block still holds its tag (first and last element, copied back on its stream). A
 * block handed out while another stream still uses it, or two live blocks that overlap, show up
 * as a wrong tag; an out-of-bounds access shows up under memcheck. Half of the threads use the
 * per-thread default stream instead of their own (cudaStreamPerThread, keyed by the real stream:
 * issue #15 defect 6). At the end every block is freed and empty_cache must leave nothing
 * reserved. Exit status 0: every check passed; 1 otherwise (the message says which).
 *
 * MEMSNAP_ALLOC_CONF applies (e.g. expandable_segments:True).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "kernels.h"

#define MAX_THREADS 64
#define LIVE 24

typedef struct blk_s {
  ms_devptr_t p;
  size_t n; /* floats */
  float tag;
  ms_stream_t stream;
} blk_t;

typedef struct thr_s {
  int id;
  pthread_t th;
  cudaStream_t own;    /* a stream of its own (other threads record uses on it) */
  cudaStream_t stream; /* the stream it allocates on: own, or cudaStreamPerThread */
  blk_t live[LIVE];
  int nlive;
  uint64_t rng;
  long mallocs, frees, checks;
} thr_t;

static ms_allocator_t *alloc;
static thr_t threads[MAX_THREADS];
static int nthreads = 8;
static long ops = 2000;
static atomic_int failed;

static uint64_t next(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

static bool check_block(thr_t *t, const blk_t *b) {
  float first = 0, last = 0;
  cudaStream_t s = (cudaStream_t)(uintptr_t)b->stream;
  SAMPLE_CK(cudaMemcpyAsync(&first, (void *)b->p, sizeof first, cudaMemcpyDeviceToHost, s));
  SAMPLE_CK(cudaMemcpyAsync(&last, (void *)(b->p + (b->n - 1) * sizeof(float)), sizeof last,
                            cudaMemcpyDeviceToHost, s));
  SAMPLE_CK(cudaStreamSynchronize(s));
  t->checks++;
  if (first != b->tag || last != b->tag) {
    fprintf(stderr, "%s: error: thread %d: block %#llx holds %g .. %g, wrote %g\n", sample_prog,
            t->id, (unsigned long long)b->p, (double)first, (double)last, (double)b->tag);
    atomic_store(&failed, 1);
    return false;
  }
  return true;
}

static void free_one(thr_t *t, int i) {
  blk_t b = t->live[i];
  t->live[i] = t->live[--t->nlive];
  if (next(&t->rng) % 4 == 0) {
    /* Another thread's stream reads it: the block may not be reused until that work is done. */
    thr_t *o = &threads[(t->id + 1) % nthreads];
    SAMPLE_MS(ms_allocator_record_stream(alloc, b.p, (ms_stream_t)(uintptr_t)o->own));
  }
  SAMPLE_MS(ms_allocator_free(alloc, b.p));
  t->frees++;
}

static void *worker(void *arg) {
  thr_t *t = arg;
  SAMPLE_CK(cudaSetDevice(0));
  for (long op = 0; op < ops && !atomic_load(&failed); op++) {
    uint64_t r = next(&t->rng);
    if (t->nlive == LIVE || (t->nlive > 0 && r % 3 == 0)) {
      free_one(t, (int)(r / 3 % (uint64_t)t->nlive));
    } else {
      /* log-uniform size: 2^(8..24) bytes, times 1..2 */
      size_t bytes = ((size_t)1 << (8 + r % 17)) + (size_t)(r >> 40) % ((size_t)1 << (8 + r % 17));
      bytes &= ~(size_t)3;
      ms_stream_t ms = (ms_stream_t)(uintptr_t)t->stream;
      ms_devptr_t p;
      int e = ms_allocator_malloc(alloc, bytes, ms, &p);
      if (e == MS_EOOM) {
        while (t->nlive)
          free_one(t, t->nlive - 1);
        continue;
      }
      SAMPLE_MS(e);
      t->mallocs++;
      blk_t b = {p, bytes / sizeof(float), (float)(1 + (t->id * 1000 + op) % 100000), ms};
      SAMPLE_CK(ms_sample_fill((float *)p, b.n, b.tag, 0.0f, t->stream));
      t->live[t->nlive++] = b;
    }
    if (r % 257 == 0) SAMPLE_MS(ms_allocator_empty_cache(alloc));
    if (op % 64 == 63)
      for (int i = 0; i < t->nlive && !atomic_load(&failed); i++)
        check_block(t, &t->live[i]);
  }
  for (int i = 0; i < t->nlive && !atomic_load(&failed); i++)
    check_block(t, &t->live[i]);
  while (t->nlive)
    free_one(t, t->nlive - 1);
  SAMPLE_CK(cudaStreamSynchronize(t->stream));
  SAMPLE_CK(cudaStreamSynchronize(t->own));
  return NULL;
}

int main(int argc, char **argv) {
  long nth = nthreads;
  const sample_opt_t opts[] = {
      {"threads", "number of threads (default 8, at most 64)", &nth, NULL},
      {"ops", "operations per thread (default 2000)", &ops, NULL},
  };
  sample_parse(argc, argv, "Many threads on one caching allocator, every block checked.", opts,
               sizeof opts / sizeof opts[0]);
  if (nth < 1 || nth > MAX_THREADS || ops < 1) {
    fprintf(stderr, "%s: error: --threads must be 1..%d and --ops >= 1\n", sample_prog,
            MAX_THREADS);
    return 2;
  }
  nthreads = (int)nth;
  ms_backend_t *backend;
  sample_open(sample_prog, &backend, &alloc);
  for (int i = 0; i < nthreads; i++) {
    threads[i].id = i;
    threads[i].rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    SAMPLE_CK(cudaStreamCreateWithFlags(&threads[i].own, cudaStreamNonBlocking));
    /* Odd threads allocate on their per-thread default stream: the same handle on every thread,
     * a different stream on each (the allocator keys it by the real stream). */
    threads[i].stream = i % 2 ? cudaStreamPerThread : threads[i].own;
  }
  for (int i = 0; i < nthreads; i++)
    if (pthread_create(&threads[i].th, NULL, worker, &threads[i]) != 0) {
      fprintf(stderr, "%s: error: cannot start thread %d\n", sample_prog, i);
      return 1;
    }
  long m = 0, f = 0, c = 0;
  for (int i = 0; i < nthreads; i++) {
    pthread_join(threads[i].th, NULL);
    m += threads[i].mallocs, f += threads[i].frees, c += threads[i].checks;
  }
  SAMPLE_CK(cudaDeviceSynchronize());
  SAMPLE_MS(ms_allocator_empty_cache(alloc));
  ms_stats_t st = MS_STATS_INIT;
  SAMPLE_MS(ms_allocator_get_stats(alloc, &st));
  printf("%d threads, %ld mallocs, %ld frees, %ld block checks, %lld OOMs, peak reserved %lld "
         "bytes\n",
         nthreads, m, f, c, (long long)st.num_ooms, (long long)st.reserved_bytes[MS_STAT_ALL].peak);
  if (m != f) {
    fprintf(stderr, "%s: error: %ld mallocs but %ld frees\n", sample_prog, m, f);
    atomic_store(&failed, 1);
  }
  if (st.reserved_bytes[MS_STAT_ALL].current != 0 || st.active_bytes[MS_STAT_ALL].current != 0) {
    fprintf(stderr, "%s: error: %lld bytes still reserved, %lld active after freeing everything\n",
            sample_prog, (long long)st.reserved_bytes[MS_STAT_ALL].current,
            (long long)st.active_bytes[MS_STAT_ALL].current);
    atomic_store(&failed, 1);
  }
  for (int i = 0; i < nthreads; i++)
    SAMPLE_CK(cudaStreamDestroy(threads[i].own));
  ms_allocator_destroy(alloc);
  ms_backend_destroy(backend);
  return atomic_load(&failed) ? 1 : 0;
}
