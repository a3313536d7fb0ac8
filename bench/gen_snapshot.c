/* SPDX-License-Identifier: MIT
 * gen_snapshot: writes a synthetic PyTorch snapshot pickle for benchmarks (bench/synth.h;
 * docs/pytorch.md, "Reading speed").
 *
 *   gen_snapshot [-o FILE] [--size BYTES | --entries N] [--seed S] [--streams N]
 *                [--code-paths N] [--wide]
 *
 * The default is a consistent, training-shaped history of 5,000,000 trace entries (about 1 GB)
 * on 4 streams, seed 1, written to memsnap-synthetic.pickle. --size takes a byte count with an
 * optional K, M or G suffix (powers of 1000) and picks the entry count that gives about that size.
 * --wide writes bench_pickle's shape instead (1,000,000 entries with stacks 160-223 frames deep
 * per GB). What was written is printed on stderr. Exit status 0, 1 on failure, 2 on bad usage.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "synth.h"
#include "bench_util.h"

static int usage(const char *msg) {
  if (msg) fprintf(stderr, "gen_snapshot: error: %s\n", msg);
  fprintf(stderr, "usage: gen_snapshot [-o FILE] [--size BYTES | --entries N] [--seed S] "
                  "[--streams N] [--code-paths N] [--wide]\n");
  return 2;
}

static bool parse_count(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || !(v > 0)) return false;
  if (*end == 'K' || *end == 'k')
    v *= 1e3, end++;
  else if (*end == 'M' || *end == 'm')
    v *= 1e6, end++;
  else if (*end == 'G' || *end == 'g')
    v *= 1e9, end++;
  if (*end) return false;
  *out = v;
  return v < 1e12;
}

int main(int argc, char **argv) {
  const char *path = "memsnap-synthetic.pickle";
  synth_opts_t o = {1, 5000000, 4, 0};
  bool wide = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    double x = 0;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(NULL);
      return 0;
    } else if (strcmp(a, "--wide") == 0) {
      wide = true;
      continue;
    }
    static const char *const with_value[] = {"-o",        "--output", "--size",
                                             "--entries", "--seed",   "--streams", "--code-paths"};
    bool known = false;
    for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
      known = known || strcmp(a, with_value[k]) == 0;
    if (!known) return usage("unknown option");
    if (!v) return usage("an option lacks its value");
    i++;
    if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
      path = v;
    } else if (strcmp(a, "--size") == 0) {
      if (!parse_count(v, &x)) return usage("--size: not a size");
      o.entries = (size_t)(x / SYNTH_BYTES_PER_ENTRY);
    } else if (strcmp(a, "--entries") == 0) {
      if (!parse_count(v, &x)) return usage("--entries: not a count");
      o.entries = (size_t)x;
    } else if (strcmp(a, "--seed") == 0) {
      if (!parse_count(v, &x) && strcmp(v, "0") != 0) return usage("--seed: not a number");
      o.seed = (uint64_t)x;
    } else if (strcmp(a, "--code-paths") == 0) {
      if (!parse_count(v, &x) || x > 1000000) return usage("--code-paths: 0 to 1,000,000");
      o.code_paths = (size_t)x;
    } else if (strcmp(a, "--streams") == 0) {
      if (!parse_count(v, &x) || x > 8) return usage("--streams: 1 to 8");
      o.streams = (int)x;
    } else {
      return usage("unknown option");
    }
  }
  if (o.entries < 1000) o.entries = 1000;
  if (o.entries > 400000000) return usage("too many entries (at most 400M)");
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  double t0 = now_s();
  int rc = wide ? synth_wide(o.entries / 5, 1000, &s, &eb) : synth_workload(&o, &s, &eb);
  if (rc != MS_OK) {
    fprintf(stderr, "gen_snapshot: error: %s\n", eb.msg[0] ? eb.msg : ms_strerror(rc));
    return 1;
  }
  double t1 = now_s();
  rc = synth_write_pickle(s, path, &eb);
  if (rc != MS_OK) {
    fprintf(stderr, "gen_snapshot: error: %s\n", eb.msg[0] ? eb.msg : ms_strerror(rc));
    ms_snapshot_free(s);
    return 1;
  }
  struct stat st;
  long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
  size_t live = 0;
  for (size_t i = 0; i < s->nblocks; i++)
    live += s->blocks[i].state == MS_BLOCK_ACTIVE_ALLOCATED;
  fprintf(stderr,
          "gen_snapshot: wrote %s: %lld bytes, %zu trace entries, %zu segments, %zu blocks "
          "(%zu allocated), %zu stacks of %zu frames (built in %.1f s, written in %.1f s)\n",
          path, size, s->ntrace, s->nsegments, s->nblocks, live, s->nstacks, s->nframes, t1 - t0,
          now_s() - t1);
  ms_snapshot_free(s);
  return 0;
}
