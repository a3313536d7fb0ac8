/* SPDX-License-Identifier: MIT
 * `memsnap run` against hostile programs (issue #35 items 2, 4, 5, 6, 11, 12): programs that a
 * bare run completes, and that the interposer must neither hang, crash nor change. Each runs
 * tests/run/run_app (linked against the fake runtime) or tests/run/run_loader (no runtime of its
 * own) under the built `memsnap run`, in its own process group with a time limit, so that a hang
 * fails the test instead of stalling the suite.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"

extern char **environ;

static char *rh_dir;
/* Sanitizer builds: no LeakSanitizer in the programs run. The fork tests need it: a child forked
 * while another thread of the parent (the interposer's writer) was inside ASan's allocator
 * inherits that lock, and LeakSanitizer's check at the child's exit then waits on it forever (about
 * 1 run in 50 under load); the bare program has no second thread. */
static bool rh_no_leak_check;

static void rh_setup(void) {
  rh_dir = th_tmpdir();
}
static void rh_teardown(void) {
  th_rmdir(rh_dir);
  free(rh_dir);
}

#define RH_APP MS_TEST_BINARY_DIR "/tests/run/run_app"
#define RH_LOADER MS_TEST_BINARY_DIR "/tests/run/run_loader"
#define RH_PLUGIN MS_TEST_BINARY_DIR "/tests/run/plugin/librun_plugin.so"

static const char *rh_memsnap(void) {
  const char *b = getenv("MEMSNAP_BIN");
  return b && *b ? b : MS_TEST_BINARY_DIR "/bin/memsnap";
}

typedef struct rh_result_s {
  int status; /* exit status, 128 + signal, or -1 when it ran past its time (killed) */
  char out[16384];
  char err[16384];
} rh_result_t;

static void rh_slurp(const char *path, char *dst, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = 0;
  if (f) {
    n = fread(dst, 1, cap - 1, f);
    fclose(f);
  }
  dst[n] = 0;
}

/* Runs argv (with extra "K=V" environment entries) in a process group of its own; after
 * limit_s seconds the whole group is killed and status is -1. ASAN_OPTIONS gets
 * verify_asan_link_order=0, as in test_run.c (sanitizer builds: the interposer comes first). */
static void rh_spawn(char *const argv[], const char *const *env_extra, int limit_s,
                     rh_result_t *r) {
  char outp[4096], errp[4096], asan[4096];
  snprintf(outp, sizeof outp, "%s/.stdout", rh_dir);
  snprintf(errp, sizeof errp, "%s/.stderr", rh_dir);
  const char *old = getenv("ASAN_OPTIONS");
  snprintf(asan, sizeof asan, "ASAN_OPTIONS=%s%sverify_asan_link_order=0%s",
           old && *old ? old : "", old && *old ? ":" : "",
           rh_no_leak_check ? ":detect_leaks=0" : "");
  size_t n = 0, k = 0;
  while (environ[n])
    n++;
  while (env_extra && env_extra[k])
    k++;
  char **envp = calloc(n + k + 2, sizeof *envp);
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "ASAN_OPTIONS=", 13) != 0) envp[m++] = environ[i];
  for (size_t j = 0; j < k; j++)
    envp[m++] = (char *)env_extra[j];
  envp[m++] = asan;
  envp[m] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&at, 0);
  pid_t pid;
  cr_assert_eq(posix_spawn(&pid, argv[0], &fa, &at, argv, envp), 0, "cannot spawn %s", argv[0]);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  free(envp);
  int st = 0;
  r->status = -1;
  for (long waited_ms = 0;; waited_ms += 10) {
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) {
      r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (waited_ms >= limit_s * 1000L) {
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    usleep(10000);
  }
  kill(-pid, SIGKILL); /* a child the program left behind */
  rh_slurp(outp, r->out, sizeof r->out);
  rh_slurp(errp, r->err, sizeof r->err);
  unlink(outp);
  unlink(errp);
}

/* `memsnap run [opts...] -o DIR/s-%p-%n.msgpack -- prog...` */
static void rh_run(rh_result_t *r, const char *const *env, const char *const *opts,
                   const char *const *prog, int limit_s) {
  char pattern[4096];
  snprintf(pattern, sizeof pattern, "%s/s-%%p-%%n.msgpack", rh_dir);
  char *argv[64];
  int n = 0;
  argv[n++] = (char *)rh_memsnap();
  argv[n++] = "run";
  for (int i = 0; opts && opts[i]; i++)
    argv[n++] = (char *)opts[i];
  argv[n++] = "-o";
  argv[n++] = pattern;
  argv[n++] = "--";
  for (int i = 0; prog[i]; i++)
    argv[n++] = (char *)prog[i];
  argv[n] = NULL;
  rh_spawn(argv, env, limit_s, r);
}

/* The snapshot files in the directory (names into names[], at most cap). */
static int rh_files(char names[][256], int cap) {
  DIR *d = opendir(rh_dir);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.' && strstr(de->d_name, ".msgpack")) {
      if (n < cap) snprintf(names[n], sizeof names[n], "%s", de->d_name);
      n++;
    }
  closedir(d);
  return n;
}

static const char *rh_path(const char *name) {
  static char path[4096];
  snprintf(path, sizeof path, "%s/%s", rh_dir, name);
  return path;
}

static ms_snapshot_t *rh_load(const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", rh_dir, name);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {0};
  cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "cannot load %s: %s", path, eb.msg);
  return s;
}

TestSuite(run_hostile, .init = rh_setup, .fini = rh_teardown, .timeout = 240);

/* Item 2: the process ends when its last thread does (glibc then calls exit(0), which writes the
 * exit snapshot); the interposer's snapshot thread must not keep it alive. */
Test(run_hostile, main_ending_with_pthread_exit_exits_as_bare) {
  rh_result_t bare, r;
  rh_spawn((char *[]){RH_APP, "pthread_exit", NULL}, NULL, 20, &bare);
  cr_assert_eq(bare.status, 0);
  cr_assert_str_eq(bare.out, "thread done\n");
  rh_run(&r, NULL, NULL, (const char *[]){RH_APP, "pthread_exit", NULL}, 20);
  cr_assert_eq(r.status, 0, "status %d (-1: still running after 20 s): %s", r.status, r.err);
  cr_assert_str_eq(r.out, bare.out);
  char names[4][256];
  cr_assert_eq(rh_files(names, 4), 1, "%s", r.err);
  cr_assert(strstr(r.err, "(exit)"), "%s", r.err);
  ms_snapshot_t *s = rh_load(names[0]);
  cr_assert_eq(s->nsegments, 1); /* 1111 bytes; the thread's 2222 were freed */
  cr_assert_eq(s->segments[0].total_size, 1111);
  ms_snapshot_free(s);
}

/* Item 4: a libcudart loaded privately, unloaded, and loaded again at another address: the
 * interposer must call the new one, not the old address. */
Test(run_hostile, a_runtime_reloaded_at_another_address_is_found_again) {
  rh_no_leak_check = true; /* the fake runtime is unloaded with what it allocated */
  rh_result_t bare, r;
  const char *prog[] = {RH_LOADER, RH_PLUGIN, "reload", NULL};
  rh_spawn((char *[]){RH_LOADER, RH_PLUGIN, "reload", NULL}, NULL, 20, &bare);
  cr_assert_eq(bare.status, 0, "%s", bare.err);
  cr_assert_str_eq(bare.out, "plugin 0 0 unloaded moved\n");
  rh_run(&r, NULL, (const char *[]){"--quiet", NULL}, prog, 20);
  cr_assert_eq(r.status, 0, "status %d: %s", r.status, r.err);
  cr_assert_str_eq(r.out, bare.out);
  char names[4][256];
  cr_assert_eq(rh_files(names, 4), 1);
  ms_snapshot_t *s = rh_load(names[0]);
  /* each load allocated 123456 + 654321 and freed the second */
  size_t allocs = 0;
  for (size_t i = 0; i < s->ntrace; i++)
    allocs += s->trace[i].action == MS_TRACE_ALLOC;
  cr_assert_eq(allocs, 4);
  ms_snapshot_free(s);
}

/* Item 11: a program without CUDA that looks cudaMalloc up finds nothing, as without memsnap. */
Test(run_hostile, a_program_without_cuda_does_not_find_cudamalloc) {
  rh_result_t bare, r;
  rh_spawn((char *[]){RH_LOADER, "-", "dlsym", NULL}, NULL, 20, &bare);
  cr_assert_str_eq(bare.out, "cudaMalloc absent\n");
  rh_run(&r, NULL, NULL, (const char *[]){RH_LOADER, "-", "dlsym", NULL}, 20);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, bare.out);
  char names[1][256];
  cr_assert_eq(rh_files(names, 1), 0);
}

/* Items 5 and 11: a forked child that never uses CUDA is the bare program's child: SIGUSR1 kills
 * it, and it writes no snapshot (the parent's allocations are not its own), in both modes. */
Test(run_hostile, a_forked_child_without_cuda_dies_of_sigusr1) {
  rh_no_leak_check = true; /* see rh_no_leak_check */
  rh_result_t bare, r;
  rh_spawn((char *[]){RH_APP, "fork_signal", NULL}, NULL, 20, &bare);
  cr_assert_str_eq(bare.out, "child signal 10\n");
  rh_run(&r, NULL, (const char *[]){"--quiet", NULL}, (const char *[]){RH_APP, "fork_signal", NULL},
         60);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, bare.out);
}

Test(run_hostile, a_forked_child_without_cuda_writes_nothing) {
  rh_no_leak_check = true; /* see rh_no_leak_check */
  for (int cache = 0; cache < 2; cache++) {
    rh_result_t r;
    rh_run(&r, NULL, (const char *[]){cache ? "--cache" : "--observe", "--quiet", NULL},
           (const char *[]){RH_APP, "fork_quiet", NULL}, 60);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(r.out, "child exit 0\n");
    char names[4][256];
    cr_assert_eq(rh_files(names, 4), 1, "%s: %d files, the child's included", 
                 cache ? "cache" : "observe", rh_files(names, 4));
    ms_snapshot_t *s = rh_load(names[0]);
    cr_assert_eq(s->pid, atoll(names[0] + 2)); /* s-PID-0.msgpack: the parent's */
    ms_snapshot_free(s);
    unlink(rh_path(names[0]));
  }
}

/* Items 5 and 11: a child that uses CUDA gets its own --every snapshots, under its own pid. */
Test(run_hostile, a_forked_child_using_cuda_gets_its_own_periodic_snapshots) {
#if defined(__SANITIZE_ADDRESS__)
  /* GCC 12's AddressSanitizer does not lock its allocator around fork(): about one run in twelve,
   * the child's first malloc waits forever on a size-class lock the parent held when it forked
   * (both of the child's threads in SizeClassAllocator64::GetFromAllocator, seen with gdb). The
   * plain build (make test) runs this test; the sanitizer build cannot run it reliably. */
  printf("SKIP: a forked child's malloc under GCC 12's AddressSanitizer may wait forever on the "
         "parent's allocator lock; the plain build runs this test\n");
  fflush(stdout);
  cr_skip_test("AddressSanitizer's allocator is not fork-safe here");
#endif
  rh_no_leak_check = true; /* see rh_no_leak_check */
  rh_result_t r;
  rh_run(&r, NULL, (const char *[]){"--quiet", "--every", "0.05", NULL},
         (const char *[]){RH_APP, "fork_every", rh_dir, NULL}, 30);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, "child every seen\nchild exit 0\n");
}

/* Item 5: children that exit while the parent's snapshot thread writes every millisecond in cache
 * mode: none may hang on a lock that thread held at the fork, and none writes a snapshot. */
Test(run_hostile, forked_children_never_hang_on_the_parents_locks) {
  rh_no_leak_check = true; /* see rh_no_leak_check */
  char pattern[4096];
  snprintf(pattern, sizeof pattern, "%s/s-%%p.msgpack", rh_dir);
  rh_result_t r;
  rh_spawn((char *[]){(char *)rh_memsnap(), "run", "--cache", "--quiet", "--every", "0.001", "-o",
                      pattern, "--", RH_APP, "fork_many", "200", NULL},
           NULL, 90, &r);
  cr_assert_eq(r.status, 0, "status %d (-1: still running after 90 s): %s", r.status, r.err);
  cr_assert_str_eq(r.out, "children 200 bad 0\n");
  char names[4][256];
  cr_assert_eq(rh_files(names, 4), 1);
}

/* Item 6: cudaMalloc and cudaFree from a signal handler that interrupted malloc: forwarded (not
 * recorded) without a deadlock. */
Test(run_hostile, cuda_calls_from_a_signal_handler_never_deadlock) {
  rh_result_t bare, r;
  rh_spawn((char *[]){RH_APP, "sighandler", "3000", NULL}, NULL, 60, &bare);
  cr_assert_str_eq(bare.out, "handled 3000 errors 0\n");
  rh_run(&r, NULL, (const char *[]){"--quiet", NULL},
         (const char *[]){RH_APP, "sighandler", "3000", NULL}, 60);
  cr_assert_eq(r.status, 0, "status %d (-1: still running after 60 s): %s", r.status, r.err);
  cr_assert_str_eq(r.out, bare.out);
}

/* Item 12: a runtime without cudaStreamGetDevice (the fake's) is asked for it once, not at every
 * cudaMallocAsync/cudaFreeAsync (the loader's LD_DEBUG=symbols trace counts the lookups). */
Test(run_hostile, a_missing_runtime_function_is_looked_up_once) {
  char dbg[4200];
  snprintf(dbg, sizeof dbg, "LD_DEBUG_OUTPUT=%s/.ld", rh_dir);
  rh_result_t r;
  rh_run(&r, (const char *[]){"LD_DEBUG=symbols", dbg, NULL}, (const char *[]){"--quiet", NULL},
         (const char *[]){RH_APP, "threads", "1", "300", NULL}, 60);
  cr_assert_eq(r.status, 0, "%s", r.err);
  DIR *d = opendir(rh_dir);
  struct dirent *de;
  size_t lookups = 0, files = 0;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, ".ld.", 4) != 0) continue;
    files++;
    FILE *f = fopen(rh_path(de->d_name), "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f))
      lookups += strstr(line, "symbol=cudaStreamGetDevice;") != NULL;
    if (f) fclose(f);
    unlink(rh_path(de->d_name));
  }
  closedir(d);
  cr_assert_geq(files, 1);
  cr_assert_gt(lookups, 0); /* it was looked up */
  cr_assert_lt(lookups, 40, "%zu lookups of cudaStreamGetDevice for 300 pairs", lookups);
}
