/* SPDX-License-Identifier: MIT
 * Tests for stack capture (backtrace(3) and the frame-pointer walk with its fallback), the stack
 * table (interning, 100,000 distinct stacks, many lengths, threads) and symbolisation (names of
 * static functions, file:line with debug information, the module+offset fallback).
 * This file is compiled with -fno-omit-frame-pointer (tests/CMakeLists.txt) and linked with
 * -rdynamic, as the programs that use the frame-pointer unwinder are. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "history/history_internal.h"

/* Static functions' names, file:line and inlined frames come from libdw (docs/history.md); a build
 * without it (MEMSNAP_WITH_LIBDW=OFF) names only exported functions and falls back to
 * module+offset, so these tests say SKIP there. */
#ifdef MS_HAVE_LIBDW
#define NEED_LIBDW() ((void)0)
#else
#define NEED_LIBDW() cr_skip_test("SKIP: built without libdw: static names and file:line unresolved")
#endif

#define NOINLINE __attribute__((noinline))
#define KEEP_FRAME() __asm__ volatile("" ::: "memory")

static int line_c; /* the line of the capture call in chain_c */

typedef size_t capture_fn(uintptr_t *, size_t, size_t);

NOINLINE static size_t chain_c(capture_fn *cap, uintptr_t *pcs, size_t max) {
  line_c = __LINE__ + 1;
  size_t n = cap(pcs, max, 0);
  KEEP_FRAME();
  return n;
}
NOINLINE static size_t chain_b(capture_fn *cap, uintptr_t *pcs, size_t max) {
  size_t n = chain_c(cap, pcs, max);
  KEEP_FRAME();
  return n;
}
NOINLINE static size_t chain_a(capture_fn *cap, uintptr_t *pcs, size_t max) {
  size_t n = chain_b(cap, pcs, max);
  KEEP_FRAME();
  return n;
}

static ms__symbolizer_t *sym;
static void sym_setup(void) { cr_assert_eq(ms__symbolizer_create(&sym), MS_OK); }
static void sym_teardown(void) { ms__symbolizer_destroy(sym); }

/* The frame of the function that contains pc (the last of its inline expansion). */
static ms__sym_t sym_of(uintptr_t pc) {
  const ms__sym_t *s;
  size_t n = 0;
  cr_assert_eq(ms__symbolize(sym, pc, &s, &n), MS_OK);
  cr_assert_geq(n, 1);
  return s[n - 1];
}

static const char *name_of(uintptr_t pc) { return sym_of(pc).name; }

NOINLINE static void check_chain(capture_fn *cap) {
  uintptr_t pcs[64];
  size_t n = chain_a(cap, pcs, 64);
  cr_assert_geq(n, 4, "only %zu frames", n);
  cr_assert_str_eq(name_of(pcs[0]), "chain_c");
  cr_assert_str_eq(name_of(pcs[1]), "chain_b");
  cr_assert_str_eq(name_of(pcs[2]), "chain_a");
  cr_assert_str_eq(name_of(pcs[3]), "check_chain");
  /* skip drops exactly that many callers */
  uintptr_t again[64];
  size_t m = cap(again, 64, 1);
  cr_assert_geq(m, 1);
  cr_assert_neq(strcmp(name_of(again[0]), "check_chain"), 0);
}

Test(backtrace, backtrace3_names_static_callers, .init = sym_setup, .fini = sym_teardown) {
  NEED_LIBDW();
  ms__backtrace_init();
  check_chain(ms__capture_backtrace);
}

Test(backtrace, frame_pointer_walk_names_static_callers, .init = sym_setup,
     .fini = sym_teardown) {
  NEED_LIBDW();
  ms__backtrace_init();
  check_chain(ms__capture_fp);
}

Test(backtrace, max_frames_is_respected) {
  uintptr_t pcs[8];
  cr_assert_eq(chain_a(ms__capture_backtrace, pcs, 2), 2);
  cr_assert_eq(chain_a(ms__capture_fp, pcs, 2), 2);
  cr_assert_eq(chain_a(ms__capture_fp, pcs, 1), 1);
}

/* After the first (checked) walk of a thread, the walk agrees with backtrace(3) frame for frame
 * and needs no fallback. */
NOINLINE static size_t one_site(capture_fn *cap, uintptr_t *pcs) {
  size_t n = chain_a(cap, pcs, 64);
  KEEP_FRAME();
  return n;
}

NOINLINE static void fp_matches_bt(void) {
  uintptr_t fp0[64], fp1[64], bt[64];
  ms__fp_stats_t s0, s1;
  (void)one_site(ms__capture_fp, fp0); /* learns this thread's end */
  ms__fp_stats(&s0);
  size_t nf = one_site(ms__capture_fp, fp1);
  ms__fp_stats(&s1);
  size_t nb = one_site(ms__capture_backtrace, bt);
  cr_assert_eq(s1.walks - s0.walks, 1);
  cr_assert_eq(s1.fallbacks - s0.fallbacks, 0, "a complete walk fell back");
  cr_assert_leq(nf, nb);
  cr_assert_geq(nf, 6);
  /* frame 4 is the return address into this function, a different call site each time */
  for (size_t i = 0; i < nf; i++)
    if (i != 4) cr_assert_eq(fp1[i], bt[i], "frame %zu differs", i);
}

Test(backtrace, fp_walk_agrees_with_backtrace3) { fp_matches_bt(); }

static void *fp_thread(void *arg) {
  fp_matches_bt();
  return arg;
}

Test(backtrace, fp_walk_agrees_on_another_thread) {
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, fp_thread, NULL), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
}

/* A frame whose saved frame pointer is corrupted makes the chain stop early: the walk must notice
 * and take the stack with backtrace(3) instead. */
NOINLINE static size_t broken_chain(uintptr_t *pcs, size_t max) {
  void **fp = __builtin_frame_address(0);
  void *saved = fp[0];
  fp[0] = (void *)((uintptr_t)fp - 64); /* points below: fails the monotonic check */
  size_t n = ms__capture_fp(pcs, max, 0);
  fp[0] = saved;
  KEEP_FRAME();
  return n;
}

Test(backtrace, broken_chain_falls_back_to_backtrace3, .init = sym_setup, .fini = sym_teardown) {
  NEED_LIBDW();
  uintptr_t pcs[64];
  (void)chain_a(ms__capture_fp, pcs, 64); /* learn the outermost frame */
  ms__fp_stats_t s0, s1;
  ms__fp_stats(&s0);
  size_t n = broken_chain(pcs, 64);
  ms__fp_stats(&s1);
  cr_assert_eq(s1.fallbacks - s0.fallbacks, 1);
  cr_assert_geq(n, 3);
  cr_assert_str_eq(name_of(pcs[0]), "broken_chain");
  /* backtrace(3) does not follow rbp: the caller is found */
  cr_assert_eq(strcmp(name_of(pcs[1]), "broken_chain_falls_back_to_backtrace3_impl") == 0 ||
                   strstr(name_of(pcs[1]), "broken_chain_falls_back") != NULL,
               1, "caller is %s", name_of(pcs[1]));
}

/* ---- symbolisation ------------------------------------------------------------------------- */

Test(backtrace, file_and_line_from_debug_info, .init = sym_setup, .fini = sym_teardown) {
  NEED_LIBDW();
  uintptr_t pcs[8];
  size_t n = chain_a(ms__capture_backtrace, pcs, 8);
  cr_assert_geq(n, 1);
  const ms__sym_t *ss;
  size_t ns;
  cr_assert_eq(ms__symbolize(sym, pcs[0], &ss, &ns), MS_OK);
  cr_assert_eq(ns, 1, "chain_c inlines nothing at the call");
  ms__sym_t s = ss[0];
  cr_assert_str_eq(s.name, "chain_c");
  if (strcmp(ms__symbolizer_kind(), "libdw") != 0) {
    cr_log_warn("SKIP: file:line needs libdw");
    cr_assert_eq(s.line, 0);
    return;
  }
  const char *suffix = "tests/test_backtrace.c";
  size_t fl = strlen(s.filename), sl = strlen(suffix);
  cr_assert_geq(fl, sl, "filename %s", s.filename);
  cr_assert_str_eq(s.filename + fl - sl, suffix);
  cr_assert_eq(s.line, line_c);
  /* remembered: the same strings come back */
  cr_assert_eq(sym_of(pcs[0]).name, s.name);
}

static int inl_line, inl_call_line;

static inline __attribute__((always_inline)) size_t inl_inner(uintptr_t *pcs) {
  inl_line = __LINE__ + 1;
  size_t n = ms__capture_backtrace(pcs, 8, 0);
  return n;
}

NOINLINE static size_t inl_outer(uintptr_t *pcs) {
  inl_call_line = __LINE__ + 1;
  size_t n = inl_inner(pcs);
  KEEP_FRAME();
  return n;
}

Test(backtrace, inlined_functions_are_expanded, .init = sym_setup, .fini = sym_teardown) {
  NEED_LIBDW();
  uintptr_t pcs[8];
  cr_assert_geq(inl_outer(pcs), 1);
  const ms__sym_t *s;
  size_t n;
  cr_assert_eq(ms__symbolize(sym, pcs[0], &s, &n), MS_OK);
  if (strcmp(ms__symbolizer_kind(), "libdw") != 0) {
    cr_assert_eq(n, 1);
    cr_assert_str_eq(s[0].name, "inl_outer");
    cr_skip_test("SKIP: inline expansion needs libdw");
  }
  cr_assert_eq(n, 2, "%zu frames, first %s", n, s[0].name);
  cr_assert_str_eq(s[0].name, "inl_inner");
  cr_assert_eq(s[0].line, inl_line);
  cr_assert(strstr(s[0].filename, "tests/test_backtrace.c") != NULL, "%s", s[0].filename);
  cr_assert_str_eq(s[1].name, "inl_outer");
  cr_assert_eq(s[1].line, inl_call_line);
  cr_assert_str_eq(s[1].filename, s[0].filename);
}

Test(backtrace, shared_library_symbols_are_named, .init = sym_setup, .fini = sym_teardown) {
  /* a return address just after libc's qsort's first byte: pc - 1 is qsort itself (looked up in
   * libc, since a sanitizer interposes its own qsort) */
  void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(libc);
  void *q = dlsym(libc, "qsort");
  cr_assert_not_null(q);
  uintptr_t pc = (uintptr_t)q + 1;
  ms__sym_t s = sym_of(pc);
  cr_assert(strstr(s.name, "qsort") != NULL, "name %s", s.name);
  cr_assert(strstr(s.module, "libc") != NULL, "module %s", s.module);
  dlclose(libc);
}

Test(backtrace, unknown_addresses_fall_back_to_module_offset, .init = sym_setup,
     .fini = sym_teardown) {
  NEED_LIBDW();
  Dl_info di;
  cr_assert_neq(dladdr((void *)&chain_a, &di), 0);
  /* inside the executable's ELF header: covered by no symbol */
  uintptr_t pc = (uintptr_t)di.dli_fbase + 0x11;
  ms__sym_t s = sym_of(pc);
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  cr_assert_gt(len, 0);
  exe[len] = 0;
  const char *base = strrchr(exe, '/');
  base = base ? base + 1 : exe;
  char want[4200];
  snprintf(want, sizeof want, "%s+0x11", base);
  cr_assert_str_eq(s.name, want);
  cr_assert_eq(s.line, 0);
  cr_assert_str_eq(s.filename, s.module);
  /* outside every module */
  s = sym_of(0x10);
  cr_assert_str_eq(s.name, "0x10");
  cr_assert_str_eq(s.filename, "??");
  cr_assert_str_eq(s.module, "");
}

Test(backtrace, many_addresses_are_remembered, .init = sym_setup, .fini = sym_teardown) {
  /* 5000 distinct (unknown) addresses, twice: the table grows and answers stay the same */
  static const char *first[5000];
  for (int round = 0; round < 2; round++)
    for (uintptr_t i = 0; i < 5000; i++) {
      ms__sym_t s = sym_of(0x1000 + i * 16);
      if (round == 0)
        first[i] = s.name;
      else
        cr_assert_eq(first[i], s.name);
    }
}

/* ---- stack table --------------------------------------------------------------------------- */

Test(backtrace, stack_table_interns) {
  ms__stacktab_t *t;
  cr_assert_eq(ms__stacktab_create(&t), MS_OK);
  uintptr_t a[3] = {1, 2, 3}, b[3] = {1, 2, 4};
  uint32_t ia = ms__stacktab_intern(t, a, 3), ib = ms__stacktab_intern(t, b, 3);
  uint32_t ia2 = ms__stacktab_intern(t, a, 3), ip = ms__stacktab_intern(t, a, 2);
  uint32_t ie = ms__stacktab_intern(t, a, 0);
  cr_assert_neq(ia, 0);
  cr_assert_eq(ia, ia2);
  cr_assert_neq(ia, ib);
  cr_assert_neq(ia, ip);
  cr_assert_neq(ie, 0);
  cr_assert_neq(ie, ia);
  cr_assert_eq(ms__stacktab_count(t), 4);
  size_t n;
  const uintptr_t *p = ms__stacktab_get(t, ib, &n);
  cr_assert_not_null(p);
  cr_assert_eq(n, 3);
  cr_assert_eq(p[2], 4);
  cr_assert_not_null(ms__stacktab_get(t, ie, &n));
  cr_assert_eq(n, 0);
  cr_assert_null(ms__stacktab_get(t, 0, &n));
  cr_assert_null(ms__stacktab_get(t, 0xfffff, &n));
  ms__stacktab_destroy(t);
  ms__stacktab_destroy(NULL);
}

/* 100,000 distinct stacks of 32 frames sharing their outer frames and differing in one inner
 * frame (the hard case for a weak hash), of many lengths: every one gets its own id, and every
 * id gives back its own pcs. */
Test(backtrace, hundred_thousand_distinct_stacks) {
  ms__stacktab_t *t;
  cr_assert_eq(ms__stacktab_create(&t), MS_OK);
  enum { N = 100000, D = 32 };
  uint32_t *ids = malloc(N * sizeof *ids);
  uintptr_t pcs[D];
  for (int k = 0; k < D; k++) pcs[k] = 0x400000 + (uintptr_t)k * 0x40;
  for (uint32_t i = 0; i < N; i++) {
    pcs[0] = 0x500000 + (uintptr_t)(i % 1000) * 8;
    pcs[1] = 0x600000 + (uintptr_t)(i / 1000) * 8;
    size_t len = 2 + i % (D - 1); /* lengths 2..32 */
    ids[i] = ms__stacktab_intern(t, pcs, len);
    cr_assert_neq(ids[i], 0);
  }
  cr_assert_eq(ms__stacktab_count(t), N);
  for (uint32_t i = 0; i < N; i++) {
    pcs[0] = 0x500000 + (uintptr_t)(i % 1000) * 8;
    pcs[1] = 0x600000 + (uintptr_t)(i / 1000) * 8;
    size_t len = 2 + i % (D - 1), n;
    cr_assert_eq(ms__stacktab_intern(t, pcs, len), ids[i]);
    const uintptr_t *p = ms__stacktab_get(t, ids[i], &n);
    cr_assert_eq(n, len);
    cr_assert_eq(memcmp(p, pcs, len * sizeof *pcs), 0);
  }
  cr_assert_eq(ms__stacktab_count(t), N);
  /* memory stays proportional: at most ~2x the pcs themselves plus the table */
  cr_assert_lt(ms__stacktab_bytes(t), (size_t)N * (D + 1) * 8 * 2 + (size_t)N * 64);
  free(ids);
  ms__stacktab_destroy(t);
}

typedef struct intern_job_s {
  ms__stacktab_t *t;
  uint32_t ids[4000];
} intern_job_t;

static void *intern_thread(void *arg) {
  intern_job_t *j = arg;
  for (uint32_t i = 0; i < 4000; i++) {
    uintptr_t pcs[4] = {i, i * 3, 77, 99};
    j->ids[i] = ms__stacktab_intern(j->t, pcs, 4);
  }
  return NULL;
}

Test(backtrace, threads_intern_the_same_stacks_to_the_same_ids) {
  ms__stacktab_t *t;
  cr_assert_eq(ms__stacktab_create(&t), MS_OK);
  static intern_job_t jobs[4];
  pthread_t th[4];
  for (int k = 0; k < 4; k++) {
    jobs[k].t = t;
    cr_assert_eq(pthread_create(&th[k], NULL, intern_thread, &jobs[k]), 0);
  }
  for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
  for (int k = 1; k < 4; k++)
    cr_assert_eq(memcmp(jobs[0].ids, jobs[k].ids, sizeof jobs[0].ids), 0);
  cr_assert_eq(ms__stacktab_count(t), 4000);
  ms__stacktab_destroy(t);
}
