/* SPDX-License-Identifier: MIT
 * memsnap CUDA sample 1 (issue #6): a training-like loop on a real GPU with history on, writing a
 * snapshot every few steps.
 *
 *   cuda_train [--steps 30] [--every 10] [--out snapshots]
 *
 * Each step allocates activations, gradients and a workspace through memsnap's caching allocator
 * (see train.h), runs kernels that write and read them, and checks the loss on the host. The
 * snapshots (OUT/train-stepNNN.msgpack) show the segments, the blocks and the stacks that
 * allocated them; compare two of them with
 *   memsnap compare --stacks OUT/train-step010.msgpack OUT/train-step020.msgpack -o diff.svg
 */
#include <stdio.h>
#include <time.h>

#include "common.h"
#include "train.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  long steps = 30, every = 10;
  const char *out = "snapshots";
  const sample_opt_t opts[] = {
      {"steps", "number of training steps (default 30)", &steps, NULL},
      {"every", "write a snapshot after every N-th step (default 10)", &every, NULL},
      {"out", "directory for the snapshot files (default snapshots)", NULL, &out},
  };
  sample_parse(argc, argv, "A training-like loop on the GPU with memsnap's allocator and history.",
               opts, sizeof opts / sizeof opts[0]);
  ms_backend_t *backend;
  ms_allocator_t *a;
  sample_open(sample_prog, &backend, &a);
  sample_record_history(a);

  cudaStream_t stream;
  SAMPLE_CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  train_t *t;
  train_config_t cfg = {.layers = 8, .width = 65536, .batch = 16, .stream = stream};
  SAMPLE_CK(train_create(&cfg, train_mem_memsnap(a), &t));
  int bad = 0;
  for (long s = 1; s <= steps; s++) {
    double t0 = now_s();
    bool ok = false;
    SAMPLE_CK(train_step(t, (int)s, &ok));
    bad += !ok;
    ms_stats_t st = MS_STATS_INIT;
    SAMPLE_MS(ms_allocator_get_stats(a, &st));
    printf("step %3ld  %8.3f ms  allocated %6.1f MiB  reserved %6.1f MiB  segments %lld  %s\n", s,
           (now_s() - t0) * 1e3, (double)st.allocated_bytes[MS_STAT_ALL].current / 1048576.0,
           (double)st.reserved_bytes[MS_STAT_ALL].current / 1048576.0,
           (long long)st.segment[MS_STAT_ALL].current, ok ? "loss ok" : "LOSS WRONG");
    if (every > 0 && s % every == 0) {
      char name[64];
      snprintf(name, sizeof name, "train-step%03ld.msgpack", s);
      sample_write_snapshot(a, out, name);
    }
  }
  train_destroy(t);
  SAMPLE_CK(cudaStreamDestroy(stream));
  ms_allocator_destroy(a);
  ms_backend_destroy(backend);
  if (bad) {
    fprintf(stderr, "%s: error: %d steps computed a wrong loss\n", sample_prog, bad);
    return 1;
  }
  return 0;
}
