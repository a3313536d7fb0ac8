/* SPDX-License-Identifier: MIT
 * Tests of `memsnap run` (issue #18): the built memsnap runs tests/run/run_app (a program linked
 * against the fake CUDA runtime, knowing nothing of memsnap) as a user would, and the snapshots
 * it leaves are read back with memsnap's reader: exact allocations, frees, sizes, streams,
 * devices, stacks naming the program's functions, the OOM path, SIGUSR1, periodic snapshots that
 * survive a crash, programs that never touch CUDA, statically linked runtimes, and the cache mode.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"

extern char **environ;

static char *rt_dir;

static void rt_setup(void) {
  rt_dir = th_tmpdir();
}
static void rt_teardown(void) {
  th_rmdir(rt_dir);
  free(rt_dir);
}

static const char *rt_memsnap(void) {
  const char *b = getenv("MEMSNAP_BIN");
  return b && *b ? b : MS_TEST_BINARY_DIR "/bin/memsnap";
}

typedef struct rt_result_s {
  int status; /* exit status, or 128 + signal */
  char out[65536];
  char err[65536];
} rt_result_t;

static void rt_slurp(const char *path, char *dst, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = 0;
  if (f) {
    n = fread(dst, 1, cap - 1, f);
    fclose(f);
  }
  dst[n] = 0;
}

/* In a sanitizer build the test programs carry the ASan runtime, and memsnap run puts its
 * interposer ahead of it in the load order, which ASan refuses unless told not to check
 * (verify_asan_link_order=0); the option is ignored by programs without ASan. envp has room for
 * one more entry after its m entries. */
static char rt_asan_opts[4096];
static void rt_asan_env(char **envp, size_t m) {
  const char *old = getenv("ASAN_OPTIONS");
  snprintf(rt_asan_opts, sizeof rt_asan_opts, "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
           old && *old ? old : "", old && *old ? ":" : "");
  for (size_t i = 0; i < m; i++)
    if (strncmp(envp[i], "ASAN_OPTIONS=", 13) == 0) {
      envp[i] = rt_asan_opts;
      return;
    }
  envp[m] = rt_asan_opts;
  envp[m + 1] = NULL;
}

/* Runs argv with extra environment entries ("K=V", NULL-terminated list, may be NULL). */
static void rt_spawn(char *const argv[], const char *const *env_extra, rt_result_t *r) {
  char outp[4096], errp[4096];
  snprintf(outp, sizeof outp, "%s/.stdout", rt_dir);
  snprintf(errp, sizeof errp, "%s/.stderr", rt_dir);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  size_t n = 0, k = 0;
  while (environ[n])
    n++;
  while (env_extra && env_extra[k])
    k++;
  char **envp = calloc(n + k + 2, sizeof *envp);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    bool overridden = false;
    for (size_t j = 0; j < k; j++) {
      size_t kl = strcspn(env_extra[j], "=");
      if (strncmp(environ[i], env_extra[j], kl + 1) == 0) overridden = true;
    }
    if (!overridden) envp[m++] = environ[i];
  }
  for (size_t j = 0; j < k; j++)
    envp[m++] = (char *)env_extra[j];
  envp[m] = NULL;
  rt_asan_env(envp, m);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp);
  cr_assert_eq(rc, 0, "cannot spawn %s", argv[0]);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  posix_spawn_file_actions_destroy(&fa);
  free(envp);
  rt_slurp(outp, r->out, sizeof r->out);
  rt_slurp(errp, r->err, sizeof r->err);
  unlink(outp);
  unlink(errp);
}

#define RT_APP MS_TEST_BINARY_DIR "/tests/run/run_app"

/* Runs `memsnap run [opts...] -o DIR/s-%n.msgpack -- app args...`. */
static void rt_run(rt_result_t *r, const char *const *env, const char *const *opts,
                   const char *const *prog) {
  char pattern[4096];
  snprintf(pattern, sizeof pattern, "%s/s-%%n.msgpack", rt_dir);
  char *argv[64];
  int n = 0;
  argv[n++] = (char *)rt_memsnap();
  argv[n++] = "run";
  for (int i = 0; opts && opts[i]; i++)
    argv[n++] = (char *)opts[i];
  argv[n++] = "-o";
  argv[n++] = pattern;
  argv[n++] = "--";
  for (int i = 0; prog[i]; i++)
    argv[n++] = (char *)prog[i];
  argv[n] = NULL;
  rt_spawn(argv, env, r);
}

static const char *rt_path(int n) {
  static char path[4096];
  snprintf(path, sizeof path, "%s/s-%d.msgpack", rt_dir, n);
  return path;
}

static ms_snapshot_t *rt_load(int n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/s-%d.msgpack", rt_dir, n);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {0};
  int err = ms_snapshot_load(path, &s, &eb);
  cr_assert_eq(err, MS_OK, "cannot load %s: %s", path, eb.msg);
  return s;
}

static int rt_count_files(void) {
  DIR *d = opendir(rt_dir);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.' && strstr(de->d_name, ".msgpack")) n++;
  closedir(d);
  return n;
}

static const char *rt_frame(const ms_snapshot_t *s, uint32_t stack, uint32_t i) {
  if (stack == MS_SNAP_NO_STACK || i >= ms_snap_stack_depth(s, stack)) return "";
  return ms_snap_stack_frame(s, stack, i)->name;
}

static int64_t rt_stat(const ms_snapshot_t *s, size_t dev, const char *key) {
  const ms_snap_device_t *d = &s->devices[dev];
  for (uint32_t i = 0; i < d->nstats; i++)
    if (strcmp(s->stats[d->first_stat + i].key, key) == 0) return s->stats[d->first_stat + i].i;
  cr_assert_fail("no statistic %s", key);
  return -1;
}

static size_t rt_count_action(const ms_snapshot_t *s, size_t dev, ms_trace_action a) {
  size_t n = 0;
  const ms_snap_device_t *d = &s->devices[dev];
  for (uint32_t i = 0; i < d->ntrace; i++)
    n += s->trace[d->first_trace + i].action == a;
  return n;
}

TestSuite(run, .init = rt_setup, .fini = rt_teardown, .timeout = 120);

Test(run, observe_records_exactly_what_the_program_did) {
  rt_result_t bare, r;
  rt_spawn((char *[]){RT_APP, "basic", NULL}, NULL, &bare);
  rt_run(&r, NULL, NULL, (const char *[]){RT_APP, "basic", NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_eq(bare.status, 0);
  /* The program behaves exactly as without memsnap (same addresses, same error codes). */
  cr_assert_str_eq(r.out, bare.out);
  cr_assert(strstr(r.out, "bad free 1 1"), "%s", r.out);
  cr_assert(strstr(r.err, "snapshot written to"), "%s", r.err);
  unsigned long long sp, b, d, m;
  const char *live = strstr(r.out, "live ");
  cr_assert(live && sscanf(live, "live %llx %llx %llx", &b, &d, &m) == 3, "%s", r.out);
  cr_assert(sscanf(r.out, "stream %llx", &sp) == 1);
  cr_assert_eq(rt_count_files(), 1);

  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->origin, MS_SNAP_ORIGIN_MEMSNAP);
  cr_assert_eq(s->nsegments, 3);
  cr_assert_eq(s->nblocks, 3);
  /* device 0: the 3 MiB cudaMalloc is all that is left */
  const ms_snap_segment_t *g = &s->segments[0];
  cr_assert_eq(g->device, 0);
  cr_assert_eq(g->address, b);
  cr_assert_eq(g->total_size, 3u << 20);
  cr_assert_eq(g->stream, 0);
  cr_assert_eq(g->nblocks, 1);
  const ms_snap_block_t *bl = ms_snap_segment_block(s, g, 0);
  cr_assert_eq(bl->state, MS_BLOCK_ACTIVE_ALLOCATED);
  cr_assert_eq(bl->size, 3u << 20);
  cr_assert_eq(bl->requested_size, 3u << 20);
  cr_assert_str_eq(rt_frame(s, bl->stack, 0), "app_alloc_big");
  cr_assert_str_eq(rt_frame(s, bl->stack, 1), "app_basic");
  /* device 1: cudaMalloc(12345) and cudaMallocManaged(777) in the managed pool (0, -1) */
  cr_assert_eq(s->segments[1].device, 1);
  cr_assert_eq(s->segments[1].address, d);
  cr_assert_eq(s->segments[1].total_size, 12345);
  cr_assert_eq(s->segments[1].pool_id[1], 0);
  cr_assert_str_eq(rt_frame(s, s->segments[1].stack, 0), "app_alloc_device1");
  cr_assert_eq(s->segments[2].device, 1);
  cr_assert_eq(s->segments[2].address, m);
  cr_assert_eq(s->segments[2].total_size, 777);
  cr_assert_eq(s->segments[2].pool_id[0], 0);
  cr_assert_eq(s->segments[2].pool_id[1], -1);
  cr_assert_str_eq(rt_frame(s, s->segments[2].stack, 0), "app_alloc_managed");

  /* The trace of device 0, entry by entry. */
  cr_assert_eq(s->ndevices, 2);
  const ms_snap_device_t *d0 = &s->devices[0];
  cr_assert_eq(d0->ntrace, 12);
  cr_assert_eq(d0->trace_dropped, 0);
  static const struct {
    ms_trace_action a;
    uint64_t size;
    int on_stream;
    const char *fn;
  } want[12] = {
      {MS_TRACE_SEGMENT_ALLOC, 1000, 0, "app_alloc_small"},
      {MS_TRACE_ALLOC, 1000, 0, "app_alloc_small"},
      {MS_TRACE_SEGMENT_ALLOC, 3u << 20, 0, "app_alloc_big"},
      {MS_TRACE_ALLOC, 3u << 20, 0, "app_alloc_big"},
      {MS_TRACE_SEGMENT_ALLOC, 4096, 1, "app_alloc_on_stream"},
      {MS_TRACE_ALLOC, 4096, 1, "app_alloc_on_stream"},
      {MS_TRACE_FREE_REQUESTED, 1000, 0, NULL},
      {MS_TRACE_FREE_COMPLETED, 1000, 0, NULL},
      {MS_TRACE_SEGMENT_FREE, 1000, 0, NULL},
      {MS_TRACE_FREE_REQUESTED, 4096, 1, NULL},
      {MS_TRACE_FREE_COMPLETED, 4096, 1, NULL},
      {MS_TRACE_SEGMENT_FREE, 4096, 1, NULL},
  };
  int64_t prev_time = 0;
  for (int i = 0; i < 12; i++) {
    const ms_snap_trace_t *t = &s->trace[d0->first_trace + i];
    cr_assert_eq(t->action, want[i].a, "entry %d: %s", i, ms_snap_trace_action_name(t));
    cr_assert_eq(t->size, want[i].size, "entry %d", i);
    cr_assert_eq(ms_snap_trace_stream(t), want[i].on_stream ? sp : 0, "entry %d", i);
    cr_assert_geq(t->time_us, prev_time);
    prev_time = t->time_us;
    if (want[i].fn) cr_assert_str_eq(rt_frame(s, t->stack, 0), want[i].fn, "entry %d", i);
  }
  cr_assert_eq(s->trace[d0->first_trace + 6].addr, s->trace[d0->first_trace + 1].addr);
  cr_assert_eq(s->trace[d0->first_trace + 9].addr, s->trace[d0->first_trace + 5].addr);
  cr_assert_eq(s->devices[1].ntrace, 4);
  /* Statistics (PyTorch's keys) and the device's capacity (the fake's 1 GiB). */
  cr_assert_eq(rt_stat(s, 0, "allocated_bytes.all.current"), 3 << 20);
  cr_assert_eq(rt_stat(s, 0, "allocated_bytes.all.peak"), (3 << 20) + 1000 + 4096);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.allocated"), 3);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.freed"), 2);
  cr_assert_eq(rt_stat(s, 1, "reserved_bytes.all.current"), 12345 + 777);
  cr_assert_eq(rt_stat(s, 0, "num_ooms"), 0);
  cr_assert(d0->present & MS_DEV_HAS_CAPACITY);
  cr_assert_eq(d0->capacity, 1u << 30);
  cr_assert(s->present & MS_SNAP_HAS_PROCESS);
  ms_snapshot_free(s);
}

Test(run, pitched_allocations_are_recorded_with_their_padded_size) {
  rt_result_t r;
  rt_run(&r, NULL, (const char *[]){"--quiet", NULL}, (const char *[]){RT_APP, "pitch", NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  unsigned long long b;
  cr_assert(sscanf(r.out, "pitch 1024 512 %llx", &b) == 1, "%s", r.out);
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->segments[0].address, b);
  cr_assert_eq(s->segments[0].total_size, 512 * 4 * 3);
  cr_assert_str_eq(rt_frame(s, s->segments[0].stack, 0), "app_alloc_volume");
  const ms_snap_trace_t *t = &s->trace[s->devices[0].first_trace];
  cr_assert_eq(s->devices[0].ntrace, 7);
  cr_assert_eq(t[1].size, 1024 * 10);
  cr_assert_str_eq(rt_frame(s, t[1].stack, 0), "app_alloc_pitched");
  cr_assert_eq(t[3].size, 512 * 4 * 3);
  cr_assert_eq(t[6].action, MS_TRACE_SEGMENT_FREE);
  cr_assert_eq(t[6].size, 1024 * 10);
  ms_snapshot_free(s);
}

Test(run, a_device_reset_frees_what_the_device_held) {
  rt_result_t bare, r;
  rt_spawn((char *[]){RT_APP, "reset", NULL}, NULL, &bare);
  rt_run(&r, NULL, (const char *[]){"--quiet", NULL}, (const char *[]){RT_APP, "reset", NULL});
  cr_assert_eq(bare.status, 0, "%s", bare.err);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, "reset done\n");
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->nsegments, 1); /* device 1's allocation only */
  cr_assert_eq(s->segments[0].device, 1);
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_SEGMENT_FREE), 3); /* 2 by the reset, then 4444 */
  cr_assert_eq(rt_stat(s, 0, "allocation.all.current"), 0);
  ms_snapshot_free(s);
}

Test(run, cache_mode_survives_a_device_reset) {
  rt_result_t r;
  rt_run(&r, NULL, (const char *[]){"--cache", "--quiet", NULL},
         (const char *[]){RT_APP, "reset", NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, "reset done\n");
  /* s-0: written before the reset, with device 0's allocator as it was */
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.current"), 2);
  ms_snapshot_free(s);
  /* s-1 (exit): device 0's new allocator served the allocation after the reset */
  s = rt_load(1);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.allocated"), 1);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.current"), 0);
  cr_assert_eq(rt_stat(s, 1, "allocation.all.current"), 1);
  ms_snapshot_free(s);
}

/* Stacks: backtrace(3) gives the same program frames as the frame-pointer walk; --stacks N keeps
 * N frames; --no-stacks none. */
Test(run, stack_options) {
  rt_result_t r;
  rt_run(&r, NULL, (const char *[]){"--quiet", "--unwind", "backtrace", "--stacks", "2", NULL},
         (const char *[]){RT_APP, "basic", NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  ms_snapshot_t *s = rt_load(0);
  uint32_t st = s->segments[0].stack;
  cr_assert_eq(ms_snap_stack_depth(s, st), 2);
  cr_assert_str_eq(rt_frame(s, st, 0), "app_alloc_big");
  cr_assert_str_eq(rt_frame(s, st, 1), "app_basic");
  ms_snapshot_free(s);
  unlink(rt_path(0));
  rt_run(&r, NULL, (const char *[]){"--quiet", "--no-stacks", NULL},
         (const char *[]){RT_APP, "basic", NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  s = rt_load(0);
  for (size_t i = 0; i < s->nsegments; i++)
    cr_assert_eq(s->segments[i].stack, MS_SNAP_NO_STACK);
  for (size_t i = 0; i < s->ntrace; i++)
    cr_assert_eq(s->trace[i].stack, MS_SNAP_NO_STACK);
  ms_snapshot_free(s);
}

Test(run, eight_threads_lose_no_event) {
  rt_result_t r;
  rt_run(&r, NULL, (const char *[]){"--quiet", NULL},
         (const char *[]){RT_APP, "threads", "8", "300", NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_str_eq(r.out, "threads done\n");
  cr_assert_str_eq(r.err, ""); /* --quiet */
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->nsegments, 36); /* thread t keeps t + 1 */
  int per_thread[8] = {0};
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    cr_assert_geq(g->total_size, 1u << 20);
    uint64_t t = g->total_size - (1u << 20);
    cr_assert_lt(t, 8);
    per_thread[t]++;
    cr_assert_str_eq(rt_frame(s, g->stack, 0), "app_worker");
  }
  for (int t = 0; t < 8; t++)
    cr_assert_eq(per_thread[t], t + 1, "thread %d", t);
  cr_assert_eq(s->ndevices, 1);
  cr_assert_eq(s->devices[0].trace_dropped, 0);
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_ALLOC), 8 * 300 + 36);
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_SEGMENT_ALLOC), 8 * 300 + 36);
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_FREE_COMPLETED), 8 * 300);
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_SEGMENT_FREE), 8 * 300);
  /* Each thread's stream-ordered pairs carry its own stream: one stream per size range, eight
   * distinct streams, and each free follows its allocation on the same address. */
  uint64_t stream_of[8] = {0};
  const ms_snap_device_t *d = &s->devices[0];
  for (uint32_t i = 0; i < d->ntrace; i++) {
    const ms_snap_trace_t *t = &s->trace[d->first_trace + i];
    if (t->action != MS_TRACE_ALLOC || ms_snap_trace_stream(t) == 0) continue;
    uint64_t th = t->size / 4096 - 1;
    if (!stream_of[th]) stream_of[th] = ms_snap_trace_stream(t);
    cr_assert_eq(ms_snap_trace_stream(t), stream_of[th], "size %" PRIu64, t->size);
  }
  for (int a = 0; a < 8; a++)
    for (int b = a + 1; b < 8; b++)
      cr_assert_neq(stream_of[a], stream_of[b]);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.current"), 36);
  ms_snapshot_free(s);
}

Test(run, oom_writes_a_snapshot_and_returns_the_same_error) {
  const char *env[] = {"FAKECUDART_CAPACITY=67108864", NULL};
  rt_result_t bare, r;
  rt_spawn((char *[]){RT_APP, "oom", NULL}, env, &bare);
  rt_run(&r, env, NULL, (const char *[]){RT_APP, "oom", NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_str_eq(bare.out, "oom 2 2 0 null\n");
  cr_assert_str_eq(r.out, bare.out); /* same code returned, same last error, same *ptr */
  static char want[70000];
  snprintf(want, sizeof want,
           "memsnap: out of memory: cudaMalloc of 40.0MiB on device 0 failed "
           "(cudaErrorMemoryAllocation); the device has 24.0MiB free of 64.0MiB; the program "
           "holds 40.0MiB in 1 allocation on it; snapshot written to '%s/s-0.msgpack'\n",
           rt_dir);
  cr_assert(strstr(r.err, want), "stderr: %s", r.err);
  cr_assert_eq(rt_count_files(), 2); /* the OOM snapshot, then the exit snapshot */
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->segments[0].total_size, 40u << 20);
  const ms_snap_device_t *d = &s->devices[0];
  cr_assert_eq(d->ntrace, 3);
  const ms_snap_trace_t *oom = &s->trace[d->first_trace + 2];
  cr_assert_eq(oom->action, MS_TRACE_OOM);
  cr_assert_eq(oom->size, 40u << 20);
  cr_assert_eq(oom->addr, 24u << 20); /* device_free */
  cr_assert_str_eq(rt_frame(s, oom->stack, 0), "app_oom_step");
  cr_assert_eq(rt_stat(s, 0, "num_ooms"), 1);
  cr_assert_eq(d->capacity, 64u << 20);
  ms_snapshot_free(s);
}

/* A program that links no runtime loads a plugin bringing its own libcudart in a local scope
 * (as Python loads an extension module): dlsym(RTLD_NEXT) cannot see it; the interposer finds it
 * among the loaded modules (else the plugin's calls would fail). */
Test(run, a_runtime_loaded_in_a_local_scope_is_found) {
  const char *plugin = MS_TEST_BINARY_DIR "/tests/run/plugin/librun_plugin.so";
  rt_result_t bare, r;
  const char *loader = MS_TEST_BINARY_DIR "/tests/run/run_loader";
  rt_spawn((char *[]){(char *)loader, (char *)plugin, NULL}, NULL, &bare);
  rt_run(&r, NULL, NULL, (const char *[]){loader, plugin, NULL});
  cr_assert_eq(bare.status, 0, "%s", bare.err);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, "plugin 0\n");
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->segments[0].total_size, 123456);
  cr_assert_str_eq(rt_frame(s, s->segments[0].stack, 0), "plugin_alloc");
  cr_assert_str_eq(rt_frame(s, s->segments[0].stack, 1), "plugin_work");
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_SEGMENT_FREE), 1);
  ms_snapshot_free(s);
}

/* Any other error of the runtime (here cudaErrorNoDevice, injected into the second cudaMalloc)
 * comes back unchanged, and so does the thread's last error; nothing is recorded for it. */
Test(run, other_errors_and_the_last_error_are_forwarded_unchanged) {
  const char *env[] = {"FAKECUDART_FAIL=cudaMalloc:2:100", NULL};
  rt_result_t bare, r;
  rt_spawn((char *[]){RT_APP, "oom", NULL}, env, &bare);
  rt_run(&r, env, (const char *[]){"--quiet", NULL}, (const char *[]){RT_APP, "oom", NULL});
  cr_assert_str_eq(bare.out, "oom 100 100 0 null\n");
  cr_assert_str_eq(r.out, bare.out);
  cr_assert_eq(r.status, bare.status);
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->devices[0].ntrace, 2);
  cr_assert_eq(rt_stat(s, 0, "num_ooms"), 0);
  ms_snapshot_free(s);
}

/* A program probing for the largest allocation that fits: ten OOMs in a row. The first N get a
 * snapshot and a message, the others are in the trace only. */
Test(run, a_run_of_ooms_writes_at_most_max_oom_snapshots) {
  rt_result_t r;
  rt_run(&r, NULL, (const char *[]){"--max-oom-snapshots", "3", NULL},
         (const char *[]){RT_APP, "probe", NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, "probe 1073741824\n");
  size_t lines = 0;
  for (const char *p = r.err; (p = strstr(p, "memsnap: out of memory:")); p++)
    lines++;
  cr_assert_eq(lines, 3, "%s", r.err);
  cr_assert(strstr(r.err, "memsnap: 4 out-of-memory errors: later ones are recorded in the trace "
                          "only, without snapshot or message (--max-oom-snapshots)"),
            "%s", r.err);
  cr_assert_eq(rt_count_files(), 4); /* 3 OOM snapshots, then the exit snapshot */
  ms_snapshot_t *s = rt_load(3);
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_OOM), 10);
  cr_assert_eq(rt_stat(s, 0, "num_ooms"), 10);
  cr_assert_eq(s->nsegments, 1);
  ms_snapshot_free(s);
}

Test(run, sigusr1_writes_a_snapshot_mid_run) {
  rt_result_t r;
  rt_run(&r, NULL, NULL, (const char *[]){RT_APP, "signal", rt_dir, NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_str_eq(r.out, "signal seen\n");
  cr_assert(strstr(r.err, "s-0.msgpack' (signal)"), "%s", r.err);
  cr_assert(strstr(r.err, "s-1.msgpack' (exit)"), "%s", r.err);
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->segments[0].total_size, 5000);
  ms_snapshot_free(s);
  s = rt_load(1);
  cr_assert_eq(s->nsegments, 2);
  ms_snapshot_free(s);
}

Test(run, sigusr1_sent_to_memsnap_reaches_the_program) {
  char pattern[4096], ready[4096], outp[4096];
  snprintf(pattern, sizeof pattern, "%s/s-%%n.msgpack", rt_dir);
  snprintf(ready, sizeof ready, "%s/ready", rt_dir);
  snprintf(outp, sizeof outp, "%s/.out", rt_dir);
  char *argv[] = {(char *)rt_memsnap(), "run", "-o", pattern, "--", RT_APP, "wait", rt_dir, NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  size_t n = 0;
  while (environ[n])
    n++;
  char **envp = calloc(n + 2, sizeof *envp);
  memcpy(envp, environ, n * sizeof *envp);
  rt_asan_env(envp, n);
  cr_assert_eq(posix_spawn(&pid, argv[0], &fa, NULL, argv, envp), 0);
  posix_spawn_file_actions_destroy(&fa);
  free(envp);
  for (int i = 0; i < 1000 && access(ready, F_OK) != 0; i++)
    usleep(10000);
  cr_assert_eq(access(ready, F_OK), 0, "the program never allocated");
  cr_assert_eq(kill(pid, SIGUSR1), 0); /* to memsnap, not to the program */
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
  char out[256];
  rt_slurp(outp, out, sizeof out);
  cr_assert_str_eq(out, "wait seen\n");
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(s->nsegments, 1);
  ms_snapshot_free(s);
}

Test(run, periodic_snapshots_survive_a_crash) {
  rt_result_t r;
  rt_run(&r, NULL, (const char *[]){"--every", "0.05", NULL},
         (const char *[]){RT_APP, "crash", "300", rt_dir, NULL});
  cr_assert_eq(r.status, 128 + 6, "stderr: %s", r.err); /* SIGABRT */
  cr_assert(strstr(r.err, "was killed by signal 6"), "%s", r.err);
  int n = rt_count_files();
  cr_assert_geq(n, 2, "only %d periodic snapshots", n);
  /* Every complete file reads back (an interrupted write leaves only a temporary file). */
  for (int i = 0; i < 1000 && n > 0; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/s-%d.msgpack", rt_dir, i);
    if (access(path, F_OK) != 0) continue;
    n--;
    ms_snapshot_t *s = rt_load(i);
    cr_assert_eq(s->nsegments, 1);
    cr_assert_eq(s->segments[0].total_size, 7000);
    ms_snapshot_free(s);
  }
  cr_assert_eq(n, 0);
}

Test(run, a_program_without_cuda_is_unaffected) {
  rt_result_t bare, r;
  rt_spawn((char *[]){RT_APP, "nocuda", "a b", "--c", NULL}, NULL, &bare);
  rt_run(&r, NULL, NULL, (const char *[]){RT_APP, "nocuda", "a b", "--c", NULL});
  cr_assert_eq(bare.status, 3);
  cr_assert_eq(r.status, 3);
  cr_assert_str_eq(r.out, bare.out);
  /* the program's own stderr, then memsnap's one line on why there is no snapshot (#32) */
  static char want[70000];
  snprintf(want, sizeof want,
           "%smemsnap: warning: no CUDA call was seen in '%s', so no snapshot was written: it "
           "made no device-memory calls, or it is linked with the static CUDA runtime (nvcc's "
           "default; build it with -cudart shared), whose calls cannot be interposed\n",
           bare.err, RT_APP);
  cr_assert_str_eq(r.err, want);
  cr_assert_eq(rt_count_files(), 0);
  /* a system program, found in PATH */
  rt_spawn((char *[]){"/bin/sh", "-c", "echo hi; exit 7", NULL}, NULL, &bare);
  rt_run(&r, NULL, NULL, (const char *[]){"sh", "-c", "echo hi; exit 7", NULL});
  cr_assert_eq(r.status, 7);
  cr_assert_str_eq(r.out, "hi\n");
  cr_assert(strncmp(r.err, "memsnap: warning: no CUDA call was seen in 'sh'", 47) == 0, "%s",
            r.err);
  cr_assert_eq(rt_count_files(), 0);
}

Test(run, a_statically_linked_runtime_is_detected) {
  const char *apps[2] = {MS_TEST_BINARY_DIR "/tests/run/run_app_static",
                         MS_TEST_BINARY_DIR "/tests/run/run_app_stripped"};
  for (int i = 0; i < 2; i++) {
    rt_result_t bare, r;
    rt_spawn((char *[]){(char *)apps[i], "basic", NULL}, NULL, &bare);
    rt_run(&r, NULL, NULL, (const char *[]){apps[i], "basic", NULL});
    cr_assert_eq(r.status, 0);
    cr_assert_str_eq(r.out, bare.out);
    cr_assert(strstr(r.err, "contains the CUDA runtime (linked with libcudart_static)"), "%s",
              r.err);
    cr_assert(strstr(r.err, "-lcudart instead of -lcudart_static"), "%s", r.err);
    cr_assert_eq(rt_count_files(), 0);
  }
}

Test(run, usage_and_runtime_errors) {
  rt_result_t r;
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", NULL}, NULL, &r);
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "memsnap: error: no program to run"), "%s", r.err);
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "--every", "0", "--", RT_APP, NULL}, NULL, &r);
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "--every wants a positive number of seconds, not '0'"), "%s", r.err);
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "-o", "x-%q", "--", RT_APP, NULL}, NULL, &r);
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "invalid output pattern 'x-%q'"), "%s", r.err);
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "--observe", "--cache", "--", RT_APP, NULL},
           NULL, &r);
  cr_assert_eq(r.status, 2);
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "--", "/nonexistent/app", NULL}, NULL, &r);
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "memsnap: error: cannot run '/nonexistent/app': No such file"), "%s",
            r.err);
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "-o", "/nonexistent/dir/s.msgpack", "--", RT_APP,
                      NULL},
           NULL, &r);
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "cannot write snapshots into '/nonexistent/dir'"), "%s", r.err);
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "--cache", "--", RT_APP, "nocuda", NULL},
           (const char *[]){"MEMSNAP_ALLOC_CONF=max_split_size_mb:banana", NULL}, &r);
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "memsnap: error: MEMSNAP_ALLOC_CONF: "), "%s", r.err);
  char spaced[4096], env[4200];
  snprintf(spaced, sizeof spaced, "%s/a b.so", rt_dir);
  FILE *f = fopen(spaced, "w");
  cr_assert(f);
  fclose(f);
  snprintf(env, sizeof env, "MEMSNAP_PRELOAD_LIB=%s", spaced);
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "--", RT_APP, "nocuda", NULL},
           (const char *[]){env, NULL}, &r);
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "contains a space or a colon, which LD_PRELOAD cannot carry"), "%s",
            r.err);
  unlink(spaced);
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "--help", NULL}, NULL, &r);
  cr_assert_eq(r.status, 0);
  cr_assert(strstr(r.out, "usage: memsnap run"), "%s", r.out);
}

Test(run, one_file_per_device_with_percent_d) {
  char pattern[4096];
  snprintf(pattern, sizeof pattern, "%s/d%%d-%%n.msgpack", rt_dir);
  rt_result_t r;
  rt_spawn((char *[]){(char *)rt_memsnap(), "run", "--quiet", "-o", pattern, "--", RT_APP, "basic",
                      NULL},
           NULL, &r);
  cr_assert_eq(r.status, 0, "%s", r.err);
  for (int dev = 0; dev < 2; dev++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/d%d-0.msgpack", rt_dir, dev);
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {0};
    cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(s->nsegments, dev == 0 ? 1 : 2);
    for (size_t i = 0; i < s->nsegments; i++)
      cr_assert_eq(s->segments[i].device, dev);
    cr_assert_eq(s->devices[dev].ntrace, dev == 0 ? 12 : 4);
    ms_snapshot_free(s);
  }
}

Test(run, cache_mode_serves_the_program_from_memsnaps_allocator) {
  rt_result_t r;
  rt_run(&r, NULL, (const char *[]){"--cache", NULL}, (const char *[]){RT_APP, "basic", NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert(strstr(r.out, "bad free 1 1"), "%s", r.out); /* unknown pointers reach CUDA */
  ms_snapshot_t *s = rt_load(0);
  /* PyTorch's segments: the 1000-byte and 4 KiB blocks in 2 MiB small-pool segments (freed,
   * cached), the 3 MiB block in a 20 MiB segment; on device 1 the 12345-byte block. The managed
   * allocation went to CUDA unchanged, and is merged in as its own segment (pool (0, -1)). */
  size_t found_big = 0, found_dev1 = 0, cached = 0, managed = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    if (i > 0)
      cr_assert(s->segments[i - 1].device < g->device || (s->segments[i - 1].device == g->device &&
                                                          s->segments[i - 1].address < g->address));
    if (g->pool_id[1] == -1) {
      managed++;
      cr_assert_eq(g->device, 1);
      cr_assert_eq(g->total_size, 777);
      cr_assert_str_eq(rt_frame(s, g->stack, 0), "app_alloc_managed");
    }
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const ms_snap_block_t *bl = ms_snap_segment_block(s, g, k);
      if (bl->state == MS_BLOCK_ACTIVE_ALLOCATED && bl->requested_size == (3u << 20)) {
        found_big++;
        cr_assert_eq(g->device, 0);
        cr_assert_eq(g->total_size, 20u << 20);
        cr_assert_str_eq(rt_frame(s, bl->stack, 0), "app_alloc_big");
      }
      if (bl->state == MS_BLOCK_ACTIVE_ALLOCATED && bl->requested_size == 12345) {
        found_dev1++;
        cr_assert_eq(g->device, 1);
        cr_assert_str_eq(rt_frame(s, bl->stack, 0), "app_alloc_device1");
      }
      if (bl->state == MS_BLOCK_INACTIVE) cached += g->total_size == (2u << 20);
    }
  }
  cr_assert_eq(found_big, 1);
  cr_assert_eq(found_dev1, 1);
  cr_assert_geq(cached, 1);
  cr_assert_eq(managed, 1);
  /* device 1's trace: the allocator's entries and the managed allocation's, in time order */
  const ms_snap_device_t *d1 = &s->devices[1];
  size_t managed_entries = 0;
  for (uint32_t i = 0; i < d1->ntrace; i++) {
    const ms_snap_trace_t *t = &s->trace[d1->first_trace + i];
    if (i > 0) cr_assert_geq(t->time_us, s->trace[d1->first_trace + i - 1].time_us);
    managed_entries += ms_snap_trace_pool(t, 1) == -1;
  }
  cr_assert_eq(managed_entries, 2); /* segment_alloc and alloc */
  cr_assert(s->present & MS_SNAP_HAS_SETTINGS);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.allocated"), 3);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.current"), 1);
  ms_snapshot_free(s);
}

Test(run, cache_mode_oom_returns_the_same_error) {
  const char *env[] = {"FAKECUDART_CAPACITY=67108864", NULL};
  rt_result_t r;
  rt_run(&r, env, (const char *[]){"--cache", NULL}, (const char *[]){RT_APP, "oom", NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_str_eq(r.out, "oom 2 2 0 null\n");
  cr_assert(strstr(r.err, "memsnap: out of memory: cudaMalloc of 40.0MiB on device 0"), "%s",
            r.err);
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(rt_stat(s, 0, "num_ooms"), 1);
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_OOM), 1);
  ms_snapshot_free(s);
}

Test(run, cache_mode_eight_threads) {
  rt_result_t r;
  rt_run(&r, NULL, (const char *[]){"--cache", "--quiet", NULL},
         (const char *[]){RT_APP, "threads", "8", "300", NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  ms_snapshot_t *s = rt_load(0);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.allocated"), 8 * 300 + 36);
  cr_assert_eq(rt_stat(s, 0, "allocation.all.current"), 36);
  cr_assert_eq(rt_count_action(s, 0, MS_TRACE_ALLOC), 8 * 300 + 36);
  ms_snapshot_free(s);
}

/* The toolkit's own libcudart (shared): calls reach it through the interposer with the same
 * results. Without a GPU every call fails (e.g. cudaErrorInsufficientDriver) and the program exits
 * the same way; on a GPU the program runs and the outputs still match. */
Test(run, the_real_shared_runtime_is_forwarded_unchanged) {
#ifndef MS_TEST_HAVE_CUDART
  printf("SKIP: run: no CUDA Toolkit in this build (the real-runtime test needs libcudart)\n");
  cr_skip_test("no CUDA Toolkit");
#else
  const char *app = MS_TEST_BINARY_DIR "/tests/run/run_app_cudart";
  rt_result_t bare, r;
  rt_spawn((char *[]){(char *)app, "oom", NULL}, NULL, &bare);
  rt_run(&r, NULL, NULL, (const char *[]){app, "oom", NULL});
  cr_assert_eq(r.status, bare.status, "bare %d, under memsnap %d: %s", bare.status, r.status,
               r.err);
  cr_assert_str_eq(r.out, bare.out);
  cr_assert(strstr(r.err, bare.err), "bare stderr '%s' not in '%s'", bare.err, r.err);
  cr_assert(!strstr(r.err, "contains the CUDA runtime"), "%s", r.err);
#endif
}

/* The toolkit's libcudart_static, as nvcc links by default: detected, stripped or not. */
Test(run, the_real_static_runtime_is_detected) {
#ifndef MS_TEST_HAVE_CUDART
  printf(
      "SKIP: run: no CUDA Toolkit in this build (the real-runtime test needs libcudart_static)\n");
  cr_skip_test("no CUDA Toolkit");
#else
  const char *apps[2] = {MS_TEST_BINARY_DIR "/tests/run/run_app_cudart_static",
                         MS_TEST_BINARY_DIR "/tests/run/run_app_cudart_stripped"};
  for (int i = 0; i < 2; i++) {
    rt_result_t bare, r;
    rt_spawn((char *[]){(char *)apps[i], "oom", NULL}, NULL, &bare);
    rt_run(&r, NULL, NULL, (const char *[]){apps[i], "oom", NULL});
    cr_assert_eq(r.status, bare.status);
    cr_assert_str_eq(r.out, bare.out);
    cr_assert(strstr(r.err, "contains the CUDA runtime (linked with libcudart_static)"), "%s: %s",
              apps[i], r.err);
    cr_assert_eq(rt_count_files(), 0);
  }
#endif
}

/* `memsnap run` reads the program's ELF headers and symbol tables before starting it: truncated
 * and corrupted files (offsets and counts pointing anywhere) never crash it; the program then
 * fails to start (126), runs, or crashes by itself. Under ASan in `make test SANITIZE=1`. */
Test(run, hostile_program_files_never_crash_the_check) {
  const char *src = MS_TEST_BINARY_DIR "/tests/run/run_app_static";
  FILE *f = fopen(src, "rb");
  cr_assert(f);
  static unsigned char buf[4 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  cr_assert_gt(n, 4096);
  char path[4096];
  snprintf(path, sizeof path, "%s/prog", rt_dir);
  uint64_t seed = 12345;
  for (int round = 0; round < 40; round++) {
    static unsigned char mut[4 << 20];
    size_t len = n;
    memcpy(mut, buf, n);
    if (round < 10) {
      static const size_t cuts[10] = {0, 1, 4, 16, 63, 64, 65, 200, 4096, 0};
      len = round == 9 ? n / 2 : cuts[round];
    } else {
      /* overwrite header, program-header and section-header fields with random values */
      uint64_t shoff = 0;
      memcpy(&shoff, mut + 40, 8);
      for (int k = 0; k < 8; k++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t at = (seed >> 33) % 64;
        if (k >= 4 && shoff && shoff < n - 64) at = shoff + ((seed >> 20) % (n - shoff));
        if (at + 8 <= len) {
          uint64_t v = seed ^ (seed << 13);
          memcpy(mut + at, &v, (seed & 1) ? 8 : 2);
        }
      }
    }
    FILE *o = fopen(path, "wb");
    cr_assert(o);
    fwrite(mut, 1, len, o);
    fclose(o);
    chmod(path, 0755);
    rt_result_t r;
    rt_run(&r, NULL, (const char *[]){"--quiet", NULL}, (const char *[]){path, "nocuda", NULL});
    /* a mangled program may start and crash itself (memsnap reports it); memsnap must not */
    cr_assert(r.status < 128 || strstr(r.err, "was killed by signal"),
              "round %d: memsnap died (status %d): %s", round, r.status, r.err);
  }
}
