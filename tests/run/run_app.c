/* clang-format off */
/* SPDX-License-Identifier: MIT
 * run_app: a CUDA program that knows nothing of memsnap, linked against the fake runtime
 * (fakecudart), run under `memsnap run` by tests/test_run.c. Each scenario does a fixed set of
 * device-memory calls that the test then finds, exactly, in the snapshots.
 *
 * The scenarios (see the app_* function of each for exactly what it calls):
 *   basic          2 devices, streams, managed memory, a bad free
 *   threads T N    T threads; thread t does N cudaMallocAsync/cudaFreeAsync pairs on its own
 *                  stream (sizes 4096 * (t + 1) + i, i < 4096), then keeps t + 1 allocations of
 *                  1 MiB + t
 *   oom            40 MiB, then 40 MiB more (fails on a 64 MiB device), prints the codes
 *   signal DIR     1 allocation, SIGUSR1 to itself, waits for a file in DIR, 1 more
 *   wait DIR       1 allocation, creates DIR/ready, waits for a file in DIR (SIGUSR1 sent by the
 *                  test to memsnap, which passes it on)
 *   pitch          cudaMallocPitch(1000 x 10), cudaMalloc3D(100 x 4 x 3), the first freed
 *   reset, probe   see app_reset and app_probe
 *   crash MS [DIR] 1 allocation, sleeps MS milliseconds (then, with DIR, until DIR holds two
 *                  snapshots, at most 20 s), then abort()
 *   nocuda ARGS    never touches CUDA: prints its arguments, exits 3
 *   bench N        N cudaMalloc/cudaFree pairs of 4 KiB; prints "ns_per_pair X", then the cost
 *                  of one backtrace(3) at about the interposer's depth ("ns_backtrace X"), then N
 *                  cudaMallocAsync/cudaFreeAsync pairs on a stream ("ns_per_async_pair X")
 * Hostile programs (issue #35), each printing what it saw, see the app_* function of each:
 *   pthread_exit   main ends with pthread_exit while a thread still allocates
 *   fork_signal    allocates, then a child that never uses CUDA sends itself SIGUSR1
 *   fork_quiet     allocates, then a child that never uses CUDA exits
 *   fork_every DIR allocates, then a child allocates and waits for a snapshot of its own pid
 *   fork_many N    allocates, then N children exit at once, one after the other
 *   sighandler N   a SIGALRM handler allocates and frees while the program allocates host memory
 */
/* clang-format on */
#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
typedef struct fk_stream_s *cudaStream_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMallocManaged(void **p, size_t size, unsigned flags);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaGetLastError(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height);
typedef struct {
  size_t width, height, depth;
} app_extent_t;
typedef struct {
  void *ptr;
  size_t pitch, xsize, ysize;
} app_pitched_t;
cudaError_t cudaMalloc3D(app_pitched_t *pp, app_extent_t ext);

#define CHECK(call)                                                                                \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != 0) {                                                                                 \
      fprintf(stderr, "run_app: %s failed: %d\n", #call, e_);                                      \
      exit(10);                                                                                    \
    }                                                                                              \
  } while (0)

#define NOINLINE __attribute__((noinline))

NOINLINE void *app_alloc_small(void) {
  void *p;
  CHECK(cudaMalloc(&p, 1000));
  return p;
}

NOINLINE void *app_alloc_big(void) {
  void *p;
  CHECK(cudaMalloc(&p, 3u << 20));
  return p;
}

NOINLINE void *app_alloc_on_stream(cudaStream_t s) {
  void *p;
  CHECK(cudaMallocAsync(&p, 4096, s));
  return p;
}

NOINLINE void *app_alloc_device1(void) {
  void *p;
  CHECK(cudaMalloc(&p, 12345));
  return p;
}

NOINLINE void *app_alloc_managed(void) {
  void *p;
  CHECK(cudaMallocManaged(&p, 777, 1));
  return p;
}

int app_basic(void);
int app_basic(void) {
  void *a = app_alloc_small();
  void *b = app_alloc_big();
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  void *c = app_alloc_on_stream(s);
  CHECK(cudaFree(a));
  CHECK(cudaFreeAsync(c, s));
  int bad = cudaFree((void *)(uintptr_t)0x1234); /* never allocated: the runtime's own error */
  int again = cudaGetLastError();
  CHECK(cudaFree(NULL));
  CHECK(cudaSetDevice(1));
  void *d = app_alloc_device1();
  void *m = app_alloc_managed();
  printf("stream %p\nbad free %d %d\nlive %p %p %p\n", (void *)s, bad, again, b, d, m);
  return 0;
}

typedef struct {
  int t, n;
} worker_arg_t;

NOINLINE void *app_worker(void *arg) {
  worker_arg_t *w = arg;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (int i = 0; i < w->n; i++) {
    void *p;
    CHECK(cudaMallocAsync(&p, (size_t)(4096 * (w->t + 1) + i), s));
    CHECK(cudaFreeAsync(p, s));
  }
  for (int k = 0; k <= w->t; k++) {
    void *p;
    CHECK(cudaMalloc(&p, (1u << 20) + (size_t)w->t));
  }
  return NULL;
}

static int app_threads(int nt, int n) {
  pthread_t th[64];
  worker_arg_t args[64];
  if (nt > 64) nt = 64;
  for (int t = 0; t < nt; t++) {
    args[t] = (worker_arg_t){t, n};
    pthread_create(&th[t], NULL, app_worker, &args[t]);
  }
  for (int t = 0; t < nt; t++)
    pthread_join(th[t], NULL);
  printf("threads done\n");
  return 0;
}

NOINLINE int app_oom_step(void **p) {
  return cudaMalloc(p, 40u << 20);
}

static int app_oom(void) {
  void *a, *b = NULL;
  CHECK(app_oom_step(&a));
  int e = app_oom_step(&b);
  int last = cudaGetLastError();
  int after = cudaGetLastError();
  printf("oom %d %d %d %s\n", e, last, after, b ? "set" : "null");
  return 0;
}

/* The complete snapshot files in dir (temporaries start with a dot). */
static int dir_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *de;
  int n = 0;
  while ((de = readdir(d)))
    if (strstr(de->d_name, ".msgpack") && de->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static bool dir_has_file(const char *dir) { return dir_files(dir) > 0; }

static int app_signal(const char *dir) {
  void *a, *b;
  CHECK(cudaMalloc(&a, 5000));
  kill(getpid(), SIGUSR1);
  for (int i = 0; i < 2000 && !dir_has_file(dir); i++)
    usleep(10000);
  CHECK(cudaMalloc(&b, 6000));
  printf("signal %s\n", dir_has_file(dir) ? "seen" : "timeout");
  return 0;
}

/* Allocates, says so with the file DIR/ready, and waits (10 s at most) for a snapshot in DIR
 * written on a SIGUSR1 that someone else sends. */
static int app_wait(const char *dir) {
  void *a;
  CHECK(cudaMalloc(&a, 5000));
  char path[4096];
  snprintf(path, sizeof path, "%s/ready", dir);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
  for (int i = 0; i < 2000 && !dir_has_file(dir); i++)
    usleep(10000);
  printf("wait %s\n", dir_has_file(dir) ? "seen" : "timeout");
  return 0;
}

NOINLINE void *app_alloc_pitched(size_t *pitch) {
  void *p;
  CHECK(cudaMallocPitch(&p, pitch, 1000, 10));
  return p;
}

NOINLINE void *app_alloc_volume(size_t *pitch) {
  app_pitched_t pp;
  CHECK(cudaMalloc3D(&pp, (app_extent_t){100, 4, 3}));
  *pitch = pp.pitch;
  return pp.ptr;
}

static int app_pitch(void) {
  size_t p1, p2;
  void *a = app_alloc_pitched(&p1);
  void *b = app_alloc_volume(&p2);
  CHECK(cudaFree(a));
  printf("pitch %zu %zu %p\n", p1, p2, b);
  return 0;
}

/* Two allocations on device 0, one on device 1, cudaDeviceReset of device 0, then one more
 * allocation on device 0 (freed), and exit. */
static int app_reset(void) {
  void *a, *b, *c, *d;
  CHECK(cudaMalloc(&a, 1111));
  CHECK(cudaMalloc(&b, 2222));
  CHECK(cudaSetDevice(1));
  CHECK(cudaMalloc(&c, 3333));
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceReset());
  CHECK(cudaMalloc(&d, 4444));
  CHECK(cudaFree(d));
  CHECK(cudaFree(a) == 0 ? 99 : 0); /* freed by the reset: the runtime refuses it now */
  printf("reset done\n");
  return 0;
}

/* The largest allocation that fits, found by halving from 1 TiB: a run of OOMs. */
static int app_probe(void) {
  void *p = NULL;
  size_t size = (size_t)1 << 40;
  while (size && cudaMalloc(&p, size) != 0)
    size /= 2;
  cudaGetLastError();
  printf("probe %zu\n", size);
  return 0;
}

static int app_crash(int ms, const char *dir) {
  void *a;
  CHECK(cudaMalloc(&a, 7000));
  usleep((useconds_t)ms * 1000);
  /* with a directory: until two periodic snapshots are there (at most 20 s), whatever the load */
  for (int i = 0; dir && i < 2000 && dir_files(dir) < 2; i++)
    usleep(10000);
  fflush(stdout);
  abort();
}

/* backtrace(3) from the depth at which the interposer captures a stack: two frames below the
 * program's caller (the hook, ms__capture_backtrace). */
NOINLINE int app_bt_inner(void) {
  void *buf[32];
  return backtrace(buf, 32);
}
NOINLINE int app_bt_probe(void) {
  return app_bt_inner() + 1;
}

static int app_bench(long n) {
  struct timespec t0, t1;
  void *p;
  for (int i = 0; i < 1000; i++) { /* warm up: the first call starts the recorder */
    CHECK(cudaMalloc(&p, 4096));
    CHECK(cudaFree(p));
  }
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) {
    CHECK(cudaMalloc(&p, 4096));
    CHECK(cudaFree(p));
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ns =
      ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)n;
  printf("ns_per_pair %.1f\n", ns);
  long nb = n / 10 > 0 ? n / 10 : 1;
  volatile int sink = 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < nb; i++)
    sink += app_bt_probe();
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)nb;
  printf("ns_backtrace %.1f\n", ns);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (int i = 0; i < 1000; i++) {
    CHECK(cudaMallocAsync(&p, 4096, s));
    CHECK(cudaFreeAsync(p, s));
  }
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) {
    CHECK(cudaMallocAsync(&p, 4096, s));
    CHECK(cudaFreeAsync(p, s));
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)n;
  printf("ns_per_async_pair %.1f\n", ns);
  return 0;
}

/* ---- hostile programs (issue #35) ---- */

static void *app_late_thread(void *arg) {
  (void)arg;
  usleep(100000);
  void *p;
  CHECK(cudaMalloc(&p, 2222));
  CHECK(cudaFree(p));
  printf("thread done\n");
  return NULL;
}

/* main returns through pthread_exit: the process ends when its last thread does, exit(0). */
static int app_pthread_exit(void) {
  void *a;
  CHECK(cudaMalloc(&a, 1111));
  pthread_t th;
  pthread_create(&th, NULL, app_late_thread, NULL);
  pthread_exit(NULL);
}

/* Waits for pid; prints "child exit N" or "child signal N". */
static int app_wait_child(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return 1;
  if (WIFSIGNALED(st))
    printf("child signal %d\n", WTERMSIG(st));
  else
    printf("child exit %d\n", WEXITSTATUS(st));
  return 0;
}

static int app_fork_signal(void) {
  void *a;
  CHECK(cudaMalloc(&a, 1111));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    kill(getpid(), SIGUSR1); /* the default action: the child dies of it */
    usleep(500000);
    _exit(0);
  }
  return app_wait_child(pid);
}

static int app_fork_quiet(void) {
  void *a, *b;
  CHECK(cudaMalloc(&a, 1111));
  CHECK(cudaMalloc(&b, 2222));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) exit(0); /* atexit handlers run in the child */
  return app_wait_child(pid);
}

/* The complete snapshot files in dir whose name holds "-PID-". */
static int dir_files_of(const char *dir, pid_t pid) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  char key[32];
  snprintf(key, sizeof key, "-%d-", (int)pid);
  struct dirent *de;
  int n = 0;
  while ((de = readdir(d)))
    if (strstr(de->d_name, ".msgpack") && de->d_name[0] != '.' && strstr(de->d_name, key)) n++;
  closedir(d);
  return n;
}

static int app_fork_every(const char *dir) {
  void *a;
  CHECK(cudaMalloc(&a, 1111));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    void *b;
    CHECK(cudaMalloc(&b, 3333));
    for (int i = 0; i < 500 && dir_files_of(dir, getpid()) == 0; i++)
      usleep(10000);
    printf("child every %s\n", dir_files_of(dir, getpid()) ? "seen" : "timeout");
    fflush(stdout);
    _exit(0);
  }
  return app_wait_child(pid);
}

/* N children that exit at once (exit: atexit handlers run), while the parent's snapshot thread
 * writes every few milliseconds (run with --every). */
static int app_fork_many(int n) {
  void *a;
  for (int i = 0; i < 64; i++)
    CHECK(cudaMalloc(&a, 1000 + (size_t)i));
  int bad = 0;
  for (int i = 0; i < n; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) exit(0);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
  }
  printf("children %d bad %d\n", n, bad);
  return 0;
}

static volatile sig_atomic_t app_handled, app_handler_errors;

static void app_on_alarm(int sig) {
  (void)sig;
  int saved = errno;
  void *p = NULL;
  if (cudaMalloc(&p, 4096 + (size_t)app_handled % 64) != 0 || cudaFree(p) != 0)
    app_handler_errors++;
  app_handled++;
  errno = saved;
}

/* A SIGALRM handler allocates device memory while the program allocates host memory (malloc
 * holds its arena lock when the signal comes): N signals, 200 us apart. The program's first CUDA
 * call is its own (under memsnap it starts the recorder, which a handler cannot do safely). */
static int app_sighandler(int n) {
  void *first;
  CHECK(cudaMalloc(&first, 512));
  CHECK(cudaFree(first));
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = app_on_alarm;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{0, 200}, {0, 200}};
  setitimer(ITIMER_REAL, &it, NULL);
  volatile size_t sink = 0;
  while (app_handled < n) {
    char *m = malloc(70000 + (sink & 4095));
    if (m) {
      m[0] = 1;
      sink += (size_t)m[0];
    }
    free(m);
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  printf("handled %d errors %d\n", n, (int)app_handler_errors);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *what = argc > 1 ? argv[1] : "basic";
  if (strcmp(what, "basic") == 0) return app_basic();
  if (strcmp(what, "threads") == 0 && argc > 3) return app_threads(atoi(argv[2]), atoi(argv[3]));
  if (strcmp(what, "oom") == 0) return app_oom();
  if (strcmp(what, "signal") == 0 && argc > 2) return app_signal(argv[2]);
  if (strcmp(what, "pitch") == 0) return app_pitch();
  if (strcmp(what, "reset") == 0) return app_reset();
  if (strcmp(what, "probe") == 0) return app_probe();
  if (strcmp(what, "wait") == 0 && argc > 2) return app_wait(argv[2]);
  if (strcmp(what, "crash") == 0 && argc > 2)
    return app_crash(atoi(argv[2]), argc > 3 ? argv[3] : NULL);
  if (strcmp(what, "bench") == 0 && argc > 2) return app_bench(atol(argv[2]));
  if (strcmp(what, "pthread_exit") == 0) return app_pthread_exit();
  if (strcmp(what, "fork_signal") == 0) return app_fork_signal();
  if (strcmp(what, "fork_quiet") == 0) return app_fork_quiet();
  if (strcmp(what, "fork_every") == 0 && argc > 2) return app_fork_every(argv[2]);
  if (strcmp(what, "fork_many") == 0 && argc > 2) return app_fork_many(atoi(argv[2]));
  if (strcmp(what, "sighandler") == 0 && argc > 2) return app_sighandler(atoi(argv[2]));
  if (strcmp(what, "nocuda") == 0) {
    for (int i = 2; i < argc; i++)
      printf("arg %s\n", argv[i]);
    fprintf(stderr, "to stderr\n");
    return 3;
  }
  fprintf(stderr, "run_app: unknown scenario '%s'\n", what);
  return 2;
}
