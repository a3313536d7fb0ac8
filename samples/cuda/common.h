/* SPDX-License-Identifier: MIT
 * memsnap CUDA samples: what the three samples share (opening the device, checking CUDA calls,
 * writing snapshots, parsing the few options).
 *
 * Every sample is a program a user would write: it opens the "cuda" backend, creates a caching
 * allocator on device 0, does real work on the memory it gets, and writes memsnap snapshot files
 * that `memsnap stats`, `memsnap segments` and `memsnap compare --stacks` render. On a machine
 * without a GPU (or without the NVIDIA driver) it prints
 *   <program>: error: no CUDA device: <CUDA's reason>
 * and exits with status 1.
 */
#ifndef MEMSNAP_SAMPLES_CUDA_COMMON_H
#define MEMSNAP_SAMPLES_CUDA_COMMON_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "memsnap/allocator.h"
#include "memsnap/backend.h"
#include "memsnap/history.h"
#include "memsnap/serialize.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The program's name for messages (set by sample_open). */
extern const char *sample_prog;

/* Exits with status 1 after "<prog>: error: <what>: <cudaGetErrorName>: <cudaGetErrorString>"
 * when e is not cudaSuccess. */
void sample_check_cuda(cudaError_t e, const char *what);
#define SAMPLE_CK(call) sample_check_cuda((call), #call)

/* Exits with status 1 after "<prog>: error: <what>: <ms_strerror(r)>" when r != MS_OK. */
void sample_check_ms(int r, const char *what);
#define SAMPLE_MS(call) sample_check_ms((call), #call)

/* Opens the cuda backend and an allocator on device 0 with the settings of MEMSNAP_ALLOC_CONF.
 * Without a device: prints the "no CUDA device" error and exits with status 1. */
void sample_open(const char *prog, ms_backend_t **backend, ms_allocator_t **alloc);

/* Turns on history (trace and stacks at every event, the defaults of ms_history_config_init). */
void sample_record_history(ms_allocator_t *a);

/* Takes a snapshot of a and writes it to dir/name atomically; prints the path on stdout. */
void sample_write_snapshot(ms_allocator_t *a, const char *dir, const char *name);

/* Parses "--NAME VALUE" options from argv: *value is set for each name found. Unknown options
 * or --help print usage and exit (status 2 resp. 0). */
typedef struct sample_opt_s {
  const char *name;  /* without the dashes */
  const char *help;
  long *num;         /* numeric option, or NULL */
  const char **str;  /* string option, or NULL */
} sample_opt_t;
void sample_parse(int argc, char **argv, const char *summary, const sample_opt_t *opts, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* MEMSNAP_SAMPLES_CUDA_COMMON_H */
