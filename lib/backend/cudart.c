/* SPDX-License-Identifier: MIT
 * memsnap core: loading the CUDA runtime of the cuda backend at run time (cudart.h).
 *
 * dlopen(MEMSNAP_CUDART or MS_CUDART_SONAME, RTLD_NOW | RTLD_LOCAL), then dlsym of every function
 * of MS_CUDART_FUNCS into ms__cudart; once per process (pthread_once). MEMSNAP_CUDART names
 * another runtime to load, a soname or a path (docs/gpu.md): the tests load the fake runtime of
 * tests/fakecuda through it, and MEMSNAP_CUDART=/nonexistent shows what a machine without CUDA
 * answers.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cudart.h"
#include "common/internal.h"

#ifndef MS_CUDART_SONAME
#error "MS_CUDART_SONAME (\"libcudart.so.<major>\") is defined by lib/CMakeLists.txt"
#endif

ms_cudart_t ms__cudart;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_status = MS_EBACKEND;
static char load_msg[sizeof(((ms_errbuf_t *)0)->msg)];

#define MS_CUDART_STR2(x) #x
#define MS_CUDART_STR(x) MS_CUDART_STR2(x) /* expands a macro name (cudaX -> cudaX_ptsz) first */

/* Looks up one function; on failure records the message and returns NULL. */
static void *lookup(void *h, const char *lib, const char *fn) {
  (void)dlerror();
  void *p = dlsym(h, fn);
  if (!p) {
    const char *why = dlerror();
    snprintf(load_msg, sizeof load_msg, "cuda backend: the CUDA runtime (%s) has no %s: %s", lib,
             fn, why ? why : "null symbol");
    load_status = MS_EBACKEND;
  }
  return p;
}

static void load(void) {
  /* secure_getenv: a set-user-ID program never loads a library an unprivileged user named */
  const char *env = secure_getenv("MEMSNAP_CUDART");
  const char *lib = env && *env ? env : MS_CUDART_SONAME;
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    snprintf(load_msg, sizeof load_msg, "cuda backend: cannot load the CUDA runtime (%s): %s", lib,
             why ? why : "unknown error");
    load_status = MS_ENODEVICE;
    return;
  }
  ms_cudart_t t;
  void *p = NULL;
  bool ok = true;
  /* memcpy: ISO C has no conversion from void * to a function pointer (POSIX guarantees it). */
#define MS_CUDART_LOOKUP(fn)                                                                       \
  if (ok && (ok = (p = lookup(h, lib, MS_CUDART_STR(fn))) != NULL)) memcpy(&t.fn, &p, sizeof p);
  MS_CUDART_FUNCS(MS_CUDART_LOOKUP)
#undef MS_CUDART_LOOKUP
  if (!ok) {
    (void)dlclose(h); /* not a runtime memsnap can use: nothing of it is kept */
    return;
  }
  ms__cudart = t;
  load_status = MS_OK;
}

int ms__cudart_load(ms_errbuf_t *eb) {
  pthread_once(&load_once, load);
  if (load_status == MS_OK) return MS_OK;
  return ms__errbuf_set(eb, load_status, "%s", load_msg);
}
