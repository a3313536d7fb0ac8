/* SPDX-License-Identifier: MIT
 * Synthetic snapshots for the benchmarks and for gen_snapshot (docs/pytorch.md, "Reading speed").
 *
 * Two shapes:
 *  - synth_wide(): the shape bench_pickle has always measured: ntrace trace entries, each with its
 *    own stack 160-223 frames deep drawn from 4,000 code locations (half of them C++ frames with
 *    long names), and nsegments segments of 8 blocks. The trace is not a consistent history (its
 *    frees do not match its allocs); only the reader's speed is measured on it.
 *  - synth_workload(): a consistent history, shaped like a training run's. A workload (parameters,
 *    then steps of activations allocated in the forward pass and freed in the backward pass, with
 *    temporaries, side streams and an occasional empty_cache) runs through memsnap's own caching
 *    allocator on the simulated device, recording its trace; the snapshot taken at the end (in the
 *    middle of a step, so that activations are alive) is then given deterministic times and
 *    PyTorch-like stacks: every trace entry its own stack (or one of code_paths) of tens of frames (the allocator's C++
 *    frames, an operator, Python module frames interleaved with the interpreter's C frames, the
 *    program's entry), each live block the stack of the alloc that made it, each segment that of
 *    its segment_alloc. So every free matches a live block, every block lies in a segment, and the
 *    trace undone from the end reaches a consistent start.
 * Both are deterministic (the workload for a given seed).
 */
#ifndef MEMSNAP_BENCH_SYNTH_H
#define MEMSNAP_BENCH_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "memsnap/error.h"
#include "memsnap/snapshot.h"

typedef struct synth_opts_s {
  uint64_t seed;  /* any value; 0 is as good as any */
  size_t entries; /* trace entries wanted (the result has this many, give or take a step) */
  int streams;    /* streams used, 1..8 (the default stream and streams-1 side streams) */
  /* 0: every trace entry its own stack (the worst case for the stack table). N > 0: stacks drawn
   * from N code paths for allocations and N for frees, as in real training traces, where the same
   * few hundred call paths repeat every step (the test fixtures have 0.4-1.5% distinct stacks per
   * trace entry). */
  size_t code_paths;
} synth_opts_t;

/* Trace entries per byte of the pickle that synth_workload() + ms_pickle_write give, measured:
 * about 186 bytes per entry, so 5,000,000 entries make about 0.94 GB. */
#define SYNTH_BYTES_PER_ENTRY 186.0

/* The consistent, training-shaped snapshot described above. @return MS_OK and *out, or an error
 * with a message in eb. */
int synth_workload(const synth_opts_t *opts, ms_snapshot_t **out, ms_errbuf_t *eb);

/* The wide shape described above. @return MS_OK and *out, or an error with a message in eb. */
int synth_wide(size_t ntrace, size_t nsegments, ms_snapshot_t **out, ms_errbuf_t *eb);

/* The viewer data's worst shape (issue #35 item 1): nlong blocks of 512 bytes allocated and kept,
 * then nrounds rounds of allocating one and freeing a random live one (free_requested then
 * free_completed), in one segment: a consistent history of nlong + 3 x nrounds entries whose
 * exact viewer data has about nlong x nrounds points (every free slides the bands above it).
 * Deterministic for a seed. @return MS_OK and *out, or an error with a message in eb. */
int synth_stacked(size_t nlong, size_t nrounds, uint64_t seed, ms_snapshot_t **out,
                  ms_errbuf_t *eb);

/* Writes snap as a PyTorch pickle to path (plain stdio, not atomic: benchmarks write scratch
 * files). @return MS_OK or an error with a message in eb. */
int synth_write_pickle(const ms_snapshot_t *snap, const char *path, ms_errbuf_t *eb);

/* Writes synth_workload(opts)'s snapshot to path as a pickle, in a child process (its memory goes
 * with it); exits with a message when that fails. */
void synth_generate_pickle(const synth_opts_t *opts, const char *path);

#endif /* MEMSNAP_BENCH_SYNTH_H */
