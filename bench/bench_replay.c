/* SPDX-License-Identifier: MIT
 * bench_replay: trace entries replayed per second by `memsnap replay --check` on the largest
 * shared PyTorch fixture (wedsonlin_cs336_medium_1024_training, 22,331 entries, a mid-run trace
 * with 438 inferred start blocks). Prints `replay_events_per_s` (median of 9 runs; target
 * >= 2,000,000, issue #7; a Python model of the same logic replays about 50,000 per second) and
 * `replay_check_ms` (median milliseconds per check, start-state rebuild and final layout
 * included); for what-if (issue #14), `whatif_events_per_s` (trace entries of the what-if replay
 * per second, expandable_segments:True, unlimited; the check replay that classifies release bursts
 * is part of each call and its entries are not counted, so this is a lower bound), `whatif_ms`,
 * and `min_capacity_s` (seconds for --min-capacity's bisection under the recorded settings). The
 * snapshot is loaded once, outside the timing. Without the fixtures it prints a SKIP line on
 * stderr and no metric.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "memsnap/error.h"
#include "memsnap/replay.h"
#include "memsnap/serialize.h"
#include "bench_util.h"

#define RUNS 9

int main(void) {
  const char *dir = getenv("MEMSNAP_TORCH_FIXTURES");
  if (!dir || !*dir) dir = MS_BENCH_FIXTURES_DEFAULT;
  char path[4096];
  snprintf(path, sizeof path, "%s/wedsonlin_cs336_medium_1024_training.pickle", dir);
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "SKIP: bench_replay: %s not found (set MEMSNAP_TORCH_FIXTURES)\n", path);
    return 0;
  }
  ms_snapshot_t *snap = NULL;
  ms_errbuf_t eb;
  if (ms_snapshot_load(path, &snap, &eb) != MS_OK) {
    fprintf(stderr, "bench_replay: %s: %s\n", path, eb.msg);
    return 1;
  }
  double rate[RUNS], ms[RUNS];
  for (int i = 0; i < RUNS; i++) {
    ms_replay_report_t *rep = NULL;
    double t0 = now_s();
    if (ms_replay_run(snap, NULL, &rep, &eb) != MS_OK) {
      fprintf(stderr, "bench_replay: replay failed: %s\n", eb.msg);
      return 1;
    }
    double dt = now_s() - t0;
    size_t events = 0;
    for (size_t d = 0; d < rep->ndevices; d++) {
      if (rep->devices[d].verdict != MS_REPLAY_PASS &&
          rep->devices[d].verdict != MS_REPLAY_UNREPLAYABLE) {
        fprintf(stderr, "bench_replay: device %zu: %s\n", d, rep->devices[d].reason);
        return 1;
      }
      events += rep->devices[d].events;
    }
    ms_replay_report_free(rep);
    rate[i] = (double)events / dt;
    ms[i] = dt * 1e3;
  }
  qsort(rate, RUNS, sizeof *rate, cmp_double);
  qsort(ms, RUNS, sizeof *ms, cmp_double);
  printf("replay_events_per_s %.0f\n", rate[RUNS / 2]);
  printf("replay_check_ms %.3f\n", ms[RUNS / 2]);
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  o.config = "expandable_segments:True";
  for (int i = 0; i < RUNS; i++) {
    ms_replay_report_t *rep = NULL;
    double t0 = now_s();
    if (ms_replay_run(snap, &o, &rep, &eb) != MS_OK) {
      fprintf(stderr, "bench_replay: what-if failed: %s\n", eb.msg);
      return 1;
    }
    double dt = now_s() - t0;
    size_t events = 0;
    for (size_t d = 0; d < rep->ndevices; d++) events += rep->devices[d].entries;
    ms_replay_report_free(rep);
    rate[i] = (double)events / dt;
    ms[i] = dt * 1e3;
  }
  qsort(rate, RUNS, sizeof *rate, cmp_double);
  qsort(ms, RUNS, sizeof *ms, cmp_double);
  printf("whatif_events_per_s %.0f\n", rate[RUNS / 2]);
  printf("whatif_ms %.3f\n", ms[RUNS / 2]);
  double t0 = now_s();
  size_t cap = 0;
  if (ms_replay_min_capacity(snap, 0, "", &cap, &eb) != MS_OK) {
    fprintf(stderr, "bench_replay: min capacity failed: %s\n", eb.msg);
    return 1;
  }
  printf("min_capacity_s %.3f\n", now_s() - t0);
  fprintf(stderr, "bench_replay: min capacity %zu bytes\n", cap);
  ms_snapshot_free(snap);
  return 0;
}
