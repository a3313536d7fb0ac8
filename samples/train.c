/* SPDX-License-Identifier: MIT
 * memsnap sample: a training-like loop on the simulated device, printing memory_summary.
 *
 *   train [--steps N] [--capacity-gib G] [--conf STRING]
 *
 * The model has weights allocated once, per step activations whose size follows a drifting batch
 * size (the case that fragments a caching allocator), gradients, optimizer state allocated on the
 * first step (like Adam's two moments), and a gradient all-reduce on a second stream: each
 * gradient is record_stream'ed onto it, so its memory returns to the cache only once the
 * communication stream has finished (the program "runs" that stream at the end of each step).
 * --conf takes a MEMSNAP_ALLOC_CONF string (the environment variable is used otherwise).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/allocator.h"
#include "memsnap/backend.h"

#define LAYERS 8
#define MiB ((size_t)1 << 20)

static ms_allocator_t *alloc;
static ms_backend_t *backend;

static ms_devptr_t must_malloc(size_t size, ms_stream_t stream) {
  ms_devptr_t p = 0;
  int r = ms_allocator_malloc(alloc, size, stream, &p);
  if (r != MS_OK) {
    char msg[1024];
    ms_allocator_last_oom_message(alloc, msg, sizeof msg);
    fprintf(stderr, "train: error: %s\n", r == MS_EOOM ? msg : ms_strerror(r));
    exit(1);
  }
  return p;
}

int main(int argc, char **argv) {
  int steps = 20;
  double capacity_gib = 8.0;
  const char *conf = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--capacity-gib") && i + 1 < argc) capacity_gib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--conf") && i + 1 < argc) conf = argv[++i];
    else {
      fprintf(stderr, "usage: train [--steps N] [--capacity-gib G] [--conf STRING]\n");
      return 2;
    }
  }
  ms_sim_config_t sc = {.capacity = (size_t)(capacity_gib * (double)(1u << 30))};
  if (ms_backend_sim_create(&sc, &backend) != MS_OK) return 1;
  ms_errbuf_t eb;
  ms_alloc_config_t ac;
  ms_alloc_config_init(&ac);
  if (conf && ms_alloc_config_parse(&ac, conf, &eb) != MS_OK) {
    fprintf(stderr, "train: error: --conf: %s\n", eb.msg);
    return 2;
  }
  ms_allocator_config_t cfg = {.backend = backend, .alloc = conf ? &ac : NULL};
  if (ms_allocator_create(&cfg, &alloc, &eb) != MS_OK) {
    fprintf(stderr, "train: error: %s\n", eb.msg);
    return 1;
  }
  const ms_backend_ops_t *ops = ms_backend_ops(backend);
  ms_stream_t compute = 0, comm = 0;
  if (ops->stream_create(ops->ctx, 0, &comm) != MS_OK) return 1;

  /* weights: an embedding, LAYERS linear layers of growing width, a head */
  size_t wsize[LAYERS + 2];
  ms_devptr_t weights[LAYERS + 2], grads[LAYERS + 2], moment1[LAYERS + 2], moment2[LAYERS + 2];
  wsize[0] = 96 * MiB;
  for (int l = 1; l <= LAYERS; l++) wsize[l] = (size_t)(4 + 2 * l) * MiB + 4096 * (size_t)l;
  wsize[LAYERS + 1] = 48 * MiB;
  for (int l = 0; l < LAYERS + 2; l++) weights[l] = must_malloc(wsize[l], compute);

  unsigned seed = 12345;
  for (int step = 0; step < steps; step++) {
    /* the batch drifts between 24 and 40 samples, the sequence length between 384 and 512 */
    seed = seed * 1103515245u + 12345u;
    size_t batch = 24 + (seed >> 16) % 17;
    size_t seq = 384 + (seed >> 8) % 129;
    ms_devptr_t act[LAYERS + 2];
    /* forward: activations kept for backward, plus short-lived temporaries */
    for (int l = 0; l < LAYERS + 2; l++) {
      act[l] = must_malloc(batch * seq * (512 + 64 * (size_t)l) * 2, compute);
      ms_devptr_t tmp = must_malloc(batch * seq * 256, compute);
      ms_devptr_t small = must_malloc(4 * batch + 1000, compute); /* a bias-sized tensor */
      ms_allocator_free(alloc, tmp);
      ms_allocator_free(alloc, small);
    }
    /* backward: gradients, activations freed in reverse order */
    for (int l = LAYERS + 1; l >= 0; l--) {
      grads[l] = must_malloc(wsize[l], compute);
      ms_allocator_free(alloc, act[l]);
      /* the gradient is all-reduced on the communication stream */
      ms_allocator_record_stream(alloc, grads[l], comm);
    }
    /* optimizer: state on the first step, then update */
    if (step == 0)
      for (int l = 0; l < LAYERS + 2; l++) {
        moment1[l] = must_malloc(wsize[l], compute);
        moment2[l] = must_malloc(wsize[l], compute);
      }
    for (int l = 0; l < LAYERS + 2; l++) ms_allocator_free(alloc, grads[l]);
    /* the all-reduce finishes: the gradients' memory can be reused from the next malloc on */
    ms_sim_stream_complete(backend, 0, comm);
  }

  ms_stats_t st = MS_STATS_INIT;
  ms_allocator_get_stats(alloc, &st);
  printf("train: %d steps on a %.1f GiB simulated device: peak allocated %.1f MiB, peak reserved "
         "%.1f MiB, %lld device mallocs, %lld retries, %lld OOMs\n",
         steps, capacity_gib, (double)st.allocated_bytes[MS_STAT_ALL].peak / (double)MiB,
         (double)st.reserved_bytes[MS_STAT_ALL].peak / (double)MiB, (long long)st.num_device_alloc,
         (long long)st.num_alloc_retries, (long long)st.num_ooms);
  char *summary = NULL;
  if (ms_allocator_memory_summary(alloc, false, &summary) == MS_OK) fputs(summary, stdout);
  ms_stats_text_free(summary);

  for (int l = 0; l < LAYERS + 2; l++) {
    ms_allocator_free(alloc, weights[l]);
    if (steps > 0) {
      ms_allocator_free(alloc, moment1[l]);
      ms_allocator_free(alloc, moment2[l]);
    }
  }
  ms_allocator_destroy(alloc);
  ms_backend_destroy(backend);
  return 0;
}
