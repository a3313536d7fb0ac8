/* SPDX-License-Identifier: MIT
 * memsnap CUDA samples: the helpers of common.h. */
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *sample_prog = "sample";

void sample_check_cuda(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "%s: error: %s: %s: %s\n", sample_prog, what, cudaGetErrorName(e),
          cudaGetErrorString(e));
  exit(1);
}

void sample_check_ms(int r, const char *what) {
  if (r == MS_OK) return;
  fprintf(stderr, "%s: error: %s: %s\n", sample_prog, what, ms_strerror(r));
  exit(1);
}

void sample_open(const char *prog, ms_backend_t **backend, ms_allocator_t **alloc) {
  sample_prog = prog;
  ms_errbuf_t eb;
  int r = ms_backend_open("cuda", backend, &eb);
  if (r != MS_OK) {
    fprintf(stderr, "%s: error: %s\n", prog, eb.msg[0] ? eb.msg : ms_strerror(r));
    exit(1);
  }
  ms_allocator_config_t cfg = {.backend = *backend, .device = 0, .alloc = NULL};
  r = ms_allocator_create(&cfg, alloc, &eb);
  if (r != MS_OK) {
    fprintf(stderr, "%s: error: cannot create the allocator: %s\n", prog,
            eb.msg[0] ? eb.msg : ms_strerror(r));
    exit(1);
  }
}

void sample_record_history(ms_allocator_t *a) {
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  ms_errbuf_t eb;
  int r = ms_allocator_record_history(a, &hc, &eb);
  if (r != MS_OK) {
    fprintf(stderr, "%s: error: cannot record history: %s\n", sample_prog, eb.msg);
    exit(1);
  }
}

void sample_write_snapshot(ms_allocator_t *a, const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "%s: error: cannot create '%s': %s\n", sample_prog, dir, strerror(errno));
    exit(1);
  }
  ms_snapshot_t *snap = NULL;
  ms_errbuf_t eb;
  int r = ms_allocator_snapshot(&a, 1, &snap, &eb);
  if (r != MS_OK) {
    fprintf(stderr, "%s: error: cannot take a snapshot: %s\n", sample_prog, eb.msg);
    exit(1);
  }
  r = ms_snapshot_write_file(snap, path, NULL, &eb);
  ms_snapshot_free(snap);
  if (r != MS_OK) {
    fprintf(stderr, "%s: error: cannot write '%s': %s\n", sample_prog, path, eb.msg);
    exit(1);
  }
  printf("snapshot %s\n", path);
}

static void sample_usage(FILE *fp, const char *summary, const sample_opt_t *opts, size_t n) {
  fprintf(fp, "usage: %s [options]\n\n%s\n\noptions:\n", sample_prog, summary);
  for (size_t i = 0; i < n; i++) fprintf(fp, "  --%-12s %s\n", opts[i].name, opts[i].help);
}

void sample_parse(int argc, char **argv, const char *summary, const sample_opt_t *opts, size_t n) {
  const char *slash = strrchr(argv[0], '/');
  sample_prog = slash ? slash + 1 : argv[0];
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      sample_usage(stdout, summary, opts, n);
      exit(0);
    }
    const sample_opt_t *o = NULL;
    for (size_t k = 0; k < n && !o; k++)
      if (strncmp(argv[i], "--", 2) == 0 && strcmp(argv[i] + 2, opts[k].name) == 0) o = &opts[k];
    if (!o || i + 1 >= argc) {
      fprintf(stderr, "%s: error: %s '%s'\n", sample_prog, o ? "missing value for" : "unknown option",
              argv[i]);
      sample_usage(stderr, summary, opts, n);
      exit(2);
    }
    const char *v = argv[++i];
    if (o->num) {
      char *end;
      errno = 0;
      long x = strtol(v, &end, 10);
      if (errno || *end || x < 0) {
        fprintf(stderr, "%s: error: --%s wants a non-negative integer, not '%s'\n", sample_prog,
                o->name, v);
        exit(2);
      }
      *o->num = x;
    } else {
      *o->str = v;
    }
  }
}
