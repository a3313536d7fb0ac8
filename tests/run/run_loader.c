/* SPDX-License-Identifier: MIT
 * run_loader: a program that links no CUDA runtime itself, as a Python interpreter.
 *   run_loader PATH         loads PATH with dlopen(RTLD_NOW | RTLD_LOCAL) and runs its
 *                           plugin_work() (tests/run/run_plugin.c): the only libcudart in the
 *                           process is the plugin's, in a local scope. Prints "plugin R", exits R.
 *   run_loader PATH reload  the same, then closes the plugin (its libcudart.so.99 is unloaded),
 *                           keeps the runtime's old addresses mapped (inaccessible) so that it
 *                           cannot come back there, loads the plugin again and runs it again.
 *                           Prints "plugin R1 R2 unloaded|still-loaded moved|same".
 *   run_loader - dlsym      looks cudaMalloc up in the global scope, as a program that uses CUDA
 *                           only when it is there; prints "cudaMalloc absent" or "... present R"
 *                           with what a call returned.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

typedef struct span_s {
  uintptr_t lo, hi;
} span_t;

/* The addresses of the loaded libcudart.so.99 (lo = hi = 0 when it is not loaded). */
static int span_of_runtime(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  span_t *s = arg;
  if (!info->dlpi_name || !strstr(info->dlpi_name, "libcudart.so.99")) return 0;
  s->lo = UINTPTR_MAX;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
    if (a < s->lo) s->lo = a;
    if (b > s->hi) s->hi = b;
  }
  return 1;
}

static int run_plugin(const char *path, void **handle) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "run_loader: %s\n", dlerror());
    return 11;
  }
  int (*work)(void) = (int (*)(void))dlsym(h, "plugin_work");
  *handle = h;
  return work ? work() : 12;
}

static int reload(const char *path) {
  void *h;
  int r1 = run_plugin(path, &h);
  span_t before = {0, 0}, gone = {0, 0}, after = {0, 0};
  dl_iterate_phdr(span_of_runtime, &before);
  dlclose(h);
  dl_iterate_phdr(span_of_runtime, &gone);
  if (before.hi > before.lo) {
    uintptr_t lo = before.lo & ~(uintptr_t)4095, hi = (before.hi + 4095) & ~(uintptr_t)4095;
    mmap((void *)lo, hi - lo, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  }
  int r2 = run_plugin(path, &h);
  dl_iterate_phdr(span_of_runtime, &after);
  printf("plugin %d %d %s %s\n", r1, r2, gone.hi ? "still-loaded" : "unloaded",
         after.lo != before.lo ? "moved" : "same");
  return r1 || r2;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  if (argc > 2 && strcmp(argv[2], "dlsym") == 0) {
    int (*f)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_DEFAULT, "cudaMalloc");
    void *p = NULL;
    if (f)
      printf("cudaMalloc present %d\n", f(&p, 16));
    else
      printf("cudaMalloc absent\n");
    return 0;
  }
  if (argc > 2 && strcmp(argv[2], "reload") == 0) return reload(argv[1]);
  void *h;
  int r = run_plugin(argv[1], &h);
  printf("plugin %d\n", r);
  return r;
}
