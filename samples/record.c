/* SPDX-License-Identifier: MIT
 * memsnap sample: record allocation history in a training-like loop, take snapshots at two steps,
 * and let the OOM observer capture an out-of-memory error, all on the simulated device.
 *
 *   record OUTDIR [--steps N] [--snapshot-at A,B] [--frame-pointers]
 *
 * Writes OUTDIR/step-A.msgpack and OUTDIR/step-B.msgpack (snapshots taken after those steps),
 * then runs one batch too big for the device: the allocation fails and the OOM observer writes
 * OUTDIR/oom-<pid>-dev0-0.msgpack, with the `oom` trace entry and the blocks held at the failure.
 * Each file can be read with `memsnap stats|trace|memory|segments FILE`.
 *
 * The model: an embedding, LAYERS linear layers and a head; each step runs forward (activations
 * per layer, kept for backward), backward (gradients, activations freed), and the optimizer
 * (its state allocated on the first step, like Adam's). The functions are separate and not
 * inlined so that the stacks in the snapshots name them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "memsnap/allocator.h"
#include "memsnap/backend.h"
#include "memsnap/history.h"
#include "memsnap/serialize.h"

#define LAYERS 6
#define MiB ((size_t)1 << 20)
#define NOINLINE __attribute__((noinline))

typedef struct model_s {
  ms_allocator_t *alloc;
  ms_devptr_t weights[LAYERS + 2];
  ms_devptr_t grads[LAYERS + 2];
  ms_devptr_t adam_m[LAYERS + 2], adam_v[LAYERS + 2];
  ms_devptr_t acts[LAYERS + 2];
  size_t hidden; /* bytes of one layer's weights */
} model_t;

static int check(int err, const char *what) {
  if (err != MS_OK) fprintf(stderr, "record: %s: %s\n", what, ms_strerror(err));
  return err;
}

NOINLINE static int alloc_tensor(model_t *m, size_t bytes, ms_devptr_t *out) {
  int err = ms_allocator_malloc(m->alloc, bytes, 0, out);
  __asm__ volatile("" ::: "memory"); /* not a tail call: this frame shows in the stacks */
  return err;
}

NOINLINE static void free_tensor(model_t *m, ms_devptr_t *p) {
  if (*p) ms_allocator_free(m->alloc, *p);
  *p = 0;
}

NOINLINE static int init_parameters(model_t *m) {
  for (int l = 0; l < LAYERS + 2; l++) {
    size_t bytes = l == 0 || l == LAYERS + 1 ? 3 * m->hidden : m->hidden;
    int err = alloc_tensor(m, bytes, &m->weights[l]);
    if (err) return err;
  }
  return MS_OK;
}

NOINLINE static int layer_forward(model_t *m, int l, size_t batch) {
  /* activations: batch x hidden, kept for backward; a temporary workspace freed at once */
  ms_devptr_t work = 0;
  int err = alloc_tensor(m, batch * 64 * 1024, &m->acts[l]);
  if (!err) err = alloc_tensor(m, batch * 16 * 1024 + 4096 * (size_t)l, &work);
  free_tensor(m, &work);
  return err;
}

NOINLINE static int forward(model_t *m, size_t batch) {
  for (int l = 0; l < LAYERS + 2; l++) {
    int err = layer_forward(m, l, batch);
    if (err) return err;
  }
  return MS_OK;
}

NOINLINE static int backward(model_t *m) {
  for (int l = LAYERS + 1; l >= 0; l--) {
    if (!m->grads[l]) {
      size_t bytes = l == 0 || l == LAYERS + 1 ? 3 * m->hidden : m->hidden;
      int err = alloc_tensor(m, bytes, &m->grads[l]);
      if (err) return err;
    }
    free_tensor(m, &m->acts[l]);
  }
  return MS_OK;
}

NOINLINE static int optimizer_step(model_t *m) {
  for (int l = 0; l < LAYERS + 2; l++) {
    size_t bytes = l == 0 || l == LAYERS + 1 ? 3 * m->hidden : m->hidden;
    if (!m->adam_m[l] && (alloc_tensor(m, bytes, &m->adam_m[l]) ||
                          alloc_tensor(m, bytes, &m->adam_v[l])))
      return MS_EOOM;
  }
  return MS_OK;
}

NOINLINE static int train_step(model_t *m, size_t batch) {
  int err = forward(m, batch);
  if (!err) err = backward(m);
  if (!err) err = optimizer_step(m);
  return err;
}

static int snapshot_to(ms_allocator_t *a, const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  ms_snapshot_t *snap = NULL;
  ms_errbuf_t eb;
  int err = ms_allocator_snapshot(&a, 1, &snap, &eb);
  if (err == MS_OK) err = ms_snapshot_write_file(snap, path, NULL, &eb);
  if (err != MS_OK) {
    fprintf(stderr, "record: cannot write '%s': %s\n", path, eb.msg);
  } else {
    printf("wrote %s (%zu segments, %zu blocks, %zu trace entries)\n", path, snap->nsegments,
           snap->nblocks, snap->ntrace);
  }
  ms_snapshot_free(snap);
  return err;
}

static void usage(void) {
  fprintf(stderr, "usage: record OUTDIR [--steps N] [--snapshot-at A,B] [--frame-pointers]\n");
}

int main(int argc, char **argv) {
  const char *dir = NULL;
  int steps = 6, snap_a = 2, snap_b = 5, fp = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--snapshot-at") == 0 && i + 1 < argc) {
      if (sscanf(argv[++i], "%d,%d", &snap_a, &snap_b) != 2) {
        usage();
        return 2;
      }
    } else if (strcmp(argv[i], "--frame-pointers") == 0) {
      fp = 1;
    } else if (argv[i][0] == '-' || dir) {
      usage();
      return 2;
    } else {
      dir = argv[i];
    }
  }
  if (!dir || steps < 1) {
    usage();
    return 2;
  }
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "record: cannot create '%s': %s\n", dir, strerror(errno));
    return 1;
  }

  /* A 4 GiB simulated device. */
  ms_sim_config_t sc = {.ndevices = 1, .capacity = (size_t)4 << 30};
  ms_backend_t *be = NULL;
  if (check(ms_backend_sim_create(&sc, &be), "sim backend")) return 1;
  ms_allocator_config_t ac = {.backend = be, .device = 0, .alloc = NULL};
  ms_errbuf_t eb;
  model_t m;
  memset(&m, 0, sizeof m);
  m.hidden = 24 * MiB;
  if (ms_allocator_create(&ac, &m.alloc, &eb) != MS_OK) {
    fprintf(stderr, "record: cannot create the allocator: %s\n", eb.msg);
    return 1;
  }

  /* Record the state and the trace, with stacks everywhere (PyTorch's defaults). */
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.max_entries = 100000;
  hc.unwinder = fp ? MS_UNWIND_FRAME_POINTER : MS_UNWIND_BACKTRACE;
  if (ms_allocator_record_history(m.alloc, &hc, &eb) != MS_OK) {
    fprintf(stderr, "record: %s\n", eb.msg);
    return 1;
  }
  char pattern[4096];
  snprintf(pattern, sizeof pattern, "%s/oom-%%p-dev%%d-%%n.msgpack", dir);
  if (check(ms_oom_snapshot_install(m.alloc, pattern), "OOM observer")) return 1;

  int status = 0;
  if (check(init_parameters(&m), "parameters")) status = 1;
  for (int step = 1; !status && step <= steps; step++) {
    size_t batch = 16 + (size_t)(step % 3) * 8; /* drifting batch sizes, as real data gives */
    if (check(train_step(&m, batch), "train step")) status = 1;
    char name[64];
    if (!status && (step == snap_a || step == snap_b)) {
      snprintf(name, sizeof name, "step-%d.msgpack", step);
      if (snapshot_to(m.alloc, dir, name)) status = 1;
    }
  }

  /* A batch too big for the device: the OOM observer writes a snapshot of the failure. */
  if (!status) {
    int err = train_step(&m, 16384);
    if (err == MS_EOOM) {
      char msg[1024];
      ms_allocator_last_oom_message(m.alloc, msg, sizeof msg);
      printf("out of memory as planned (batch 16384): %s\n", msg);
      printf("the OOM observer wrote its snapshot to %s/oom-*.msgpack\n", dir);
    } else {
      fprintf(stderr, "record: expected an out-of-memory error, got %s\n", ms_strerror(err));
      status = 1;
    }
  }

  for (int l = 0; l < LAYERS + 2; l++) {
    free_tensor(&m, &m.weights[l]);
    free_tensor(&m, &m.grads[l]);
    free_tensor(&m, &m.adam_m[l]);
    free_tensor(&m, &m.adam_v[l]);
    free_tensor(&m, &m.acts[l]);
  }
  ms_allocator_destroy(m.alloc);
  ms_backend_destroy(be);
  return status;
}
