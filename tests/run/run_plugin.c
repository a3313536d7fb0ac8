/* SPDX-License-Identifier: MIT
 * run_plugin: a plugin that run_app loads with dlopen(RTLD_LOCAL), linked against a fake runtime
 * named libcudart.so.99, as a Python extension module (PyTorch's libtorch_cuda) brings its own
 * libcudart into a local scope. Its cudaMalloc calls still reach the interposer (first in the
 * global scope), which must then find that libcudart among the loaded modules, since
 * dlsym(RTLD_NEXT) cannot see a local scope. */
#include <stddef.h>

typedef int cudaError_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);

__attribute__((noinline)) void *plugin_alloc(size_t size);
__attribute__((noinline)) void *plugin_alloc(size_t size) {
  void *p = NULL;
  if (cudaMalloc(&p, size) != 0) return NULL;
  return p;
}

int plugin_work(void);
int plugin_work(void) {
  void *a = plugin_alloc(123456);
  void *b = plugin_alloc(654321);
  if (!a || !b) return 1;
  return cudaFree(b);
}
