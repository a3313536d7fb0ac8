/* SPDX-License-Identifier: MIT
 * run_loader PATH: loads PATH with dlopen(RTLD_NOW | RTLD_LOCAL) and runs its plugin_work()
 * (tests/run/run_plugin.c). It links no CUDA runtime itself, as a Python interpreter: the only
 * libcudart in the process is the plugin's, in a local scope. Prints "plugin R", exits R. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "run_loader: %s\n", dlerror());
    return 11;
  }
  int (*work)(void) = (int (*)(void))dlsym(h, "plugin_work");
  int r = work ? work() : 12;
  printf("plugin %d\n", r);
  return r;
}
