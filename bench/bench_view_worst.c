/* SPDX-License-Identifier: MIT
 * bench_view_worst: `memsnap view` on the viewer data's worst shape (issue #35 item 1; bench/synth.h,
 * synth_stacked): long-lived blocks at the bottom of the stack, then rounds of allocating one and
 * freeing a random one, so that every free slides most bands. Exact, that data grows as the
 * square of the trace; the budget (docs/view.md, "The budget") bounds it.
 *
 * Metrics (one `memsnap view` run each, as a child process: its peak RSS from wait4):
 *   view_worst_shape_rss_mb, view_worst_shape_s     10,000 + 10,000 (target: <= 300 MB)
 *   view_worst_200k_rss_mb, view_worst_200k_s       50,000 + 50,000: 200,000 entries, 11 MB
 *                                                   (target: <= 30 s)
 * The child runs under an address-space limit (MS_BENCH_VIEW_WORST_LIMIT_MB, default 6000) so
 * that a memsnap without the budget fails instead of taking the machine: a failed run prints its
 * exit status on stderr and the metric -1.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "synth.h"
#include "bench_util.h"

static int view_once(const char *bin, const char *in, const char *out, double *secs,
                     double *rss_mb) {
  const char *lim = getenv("MS_BENCH_VIEW_WORST_LIMIT_MB");
  rlim_t limit = (rlim_t)(lim ? atof(lim) : 6000.0) << 20;
  fflush(stdout); /* the child must not write what the parent has buffered */
  double t0 = now_s();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    struct rlimit rl = {limit, limit};
    setrlimit(RLIMIT_AS, &rl);
    if (!freopen("/dev/null", "w", stdout)) _exit(126);
    execl(bin, bin, "view", in, "-o", out, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  struct rusage ru;
  if (wait4(pid, &st, 0, &ru) != pid) return -1;
  *secs = now_s() - t0;
  *rss_mb = (double)ru.ru_maxrss / 1024.0;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "bench_view_worst: memsnap view %s: %s %d after %.1f s, %.0f MB RSS\n", in,
            WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
            *secs, *rss_mb);
    return -1;
  }
  return 0;
}

static int one(const char *bin, const char *dir, const char *name, size_t nlong, size_t nrounds) {
  char in[512], out[512];
  snprintf(in, sizeof in, "%s/%s.pickle", dir, name);
  snprintf(out, sizeof out, "%s/%s.html", dir, name);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  if (synth_stacked(nlong, nrounds, 1, &s, &eb) != MS_OK || synth_write_pickle(s, in, &eb) != MS_OK) {
    fprintf(stderr, "bench_view_worst: %s\n", eb.msg);
    ms_snapshot_free(s);
    return 1;
  }
  struct stat sb;
  stat(in, &sb);
  fprintf(stderr, "bench_view_worst: %s: %zu entries, %.1f MB pickle\n", name, s->ntrace,
          (double)sb.st_size / 1e6);
  ms_snapshot_free(s);
  double secs = -1, rss = -1;
  if (view_once(bin, in, out, &secs, &rss) != 0) secs = rss = -1;
  printf("view_worst_%s_rss_mb %.1f\nview_worst_%s_s %.3f\n", name, rss, name, secs);
  if (!getenv("MS_BENCH_VIEW_WORST_KEEP")) {
    unlink(in);
    unlink(out);
  }
  return 0;
}

int main(void) {
  const char *bin = getenv("MEMSNAP_BIN");
  const char *tmp = getenv("TMPDIR");
  if (!bin) bin = "memsnap";
  char dir[512];
  snprintf(dir, sizeof dir, "%s/bench_view_worst.XXXXXX", tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return 1;
  int rc = one(bin, dir, "shape", 10000, 10000);
  if (rc == 0) rc = one(bin, dir, "200k", 50000, 50000);
  if (!getenv("MS_BENCH_VIEW_WORST_KEEP")) rmdir(dir);
  else fprintf(stderr, "bench_view_worst: kept %s\n", dir);
  return rc;
}
