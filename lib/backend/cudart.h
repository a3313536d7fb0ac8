/* SPDX-License-Identifier: MIT
 * memsnap core: the CUDA runtime functions of the cuda backend, loaded at run time (cudart.c).
 *
 * memsnap never links libcudart: a program that links memsnap (the CLI, the sim backend) starts on
 * a machine without CUDA. The cuda backend loads the runtime when it is first asked for
 * (dlopen of MS_CUDART_SONAME, "libcudart.so.<major of the toolkit it was built with>", or of the
 * file MEMSNAP_CUDART names) and looks up each function below into ms__cudart, the way the driver's
 * virtual-memory calls are looked up (cudaGetDriverEntryPointByVersion). A program that already
 * has the runtime loaded gets that same copy (dlopen finds it by its soname).
 * Only lib/backend/cuda.c and cudart.c include this header (the CUDA headers are theirs).
 */
#ifndef MEMSNAP_BACKEND_CUDART_H
#define MEMSNAP_BACKEND_CUDART_H

#include <cuda_runtime_api.h>

#include "memsnap/error.h"

/* Every runtime function the cuda backend calls. A name the header defines as a macro (the
 * per-thread-stream variants, _ptsz) is expanded before it is looked up, so the table holds the
 * function the header would have linked. */
#define MS_CUDART_FUNCS(X)                                                                         \
  X(cudaGetErrorName)                                                                              \
  X(cudaGetErrorString)                                                                            \
  X(cudaGetLastError)                                                                              \
  X(cudaPeekAtLastError)                                                                           \
  X(cudaGetDeviceCount)                                                                            \
  X(cudaSetDevice)                                                                                 \
  X(cudaDeviceCanAccessPeer)                                                                       \
  X(cudaDeviceSynchronize)                                                                         \
  X(cudaMalloc)                                                                                    \
  X(cudaFree)                                                                                      \
  X(cudaMemGetInfo)                                                                                \
  X(cudaStreamCreateWithFlags)                                                                     \
  X(cudaStreamDestroy)                                                                             \
  X(cudaStreamGetDevice)                                                                           \
  X(cudaStreamGetId)                                                                               \
  X(cudaStreamIsCapturing)                                                                         \
  X(cudaStreamGetCaptureInfo)                                                                      \
  X(cudaThreadExchangeStreamCaptureMode)                                                           \
  X(cudaEventCreateWithFlags)                                                                      \
  X(cudaEventRecord)                                                                               \
  X(cudaEventQuery)                                                                                \
  X(cudaEventSynchronize)                                                                          \
  X(cudaEventDestroy)                                                                              \
  X(cudaGetDriverEntryPointByVersion)

#define MS_CUDART_MEMBER(fn) __typeof__(&fn) fn;
typedef struct ms_cudart_s {
  MS_CUDART_FUNCS(MS_CUDART_MEMBER)
} ms_cudart_t;
#undef MS_CUDART_MEMBER

/* The table, filled by ms__cudart_load; read it only after a load succeeded. */
extern ms_cudart_t ms__cudart;

/* Loads the runtime and fills ms__cudart, once per process (thread-safe); a failure is remembered
 * and answered the same way again. The runtime is never unloaded.
 * @return MS_OK; MS_ENODEVICE with "cuda backend: cannot load the CUDA runtime (NAME): <dlerror>"
 *         in eb when the library cannot be loaded; MS_EBACKEND with "cuda backend: the CUDA runtime
 *         (NAME) has no FUNCTION: <dlerror>" when it lacks a function. */
int ms__cudart_load(ms_errbuf_t *eb);

#endif /* MEMSNAP_BACKEND_CUDART_H */
