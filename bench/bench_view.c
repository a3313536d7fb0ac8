/* SPDX-License-Identifier: MIT
 * Benchmark: `memsnap view` (issue #13), whole process, and the page in headless Chromium
 * (bench/view_page.sh).
 *
 *   view_write_largest_s       writing the page of the largest fixture (median of 5 runs)
 *   view_html_largest_mb       its size (MiB)
 *   view_first_paint_largest_s its first paint in Chromium (data inflated, timeline drawn)
 *   view_synth_entries         trace entries of the synthetic snapshot (bench/synth.h, training
 *                              shaped; MS_BENCH_VIEW_ENTRIES, default 5,000,000 = a 0.94 GB pickle)
 *   view_write_synth_s         writing its page (one run), view_write_synth_rss_mb its peak RSS;
 *                              view_write_1gb_s the same (the name of the 5 M-entry goal)
 *   view_html_mb               its page's size (MiB)
 *   view_first_paint_s         its first paint in Chromium
 *   view_zoom_frame_ms         median drawing time of a frame over 12 zooms in, 12 pans, 12 zooms
 *                              out on the memory timeline
 *   view_tab_mb                the tab's JavaScript heap after that
 *   view_search_5m_ms          frame search (bench/view_search.py): from the last keystroke of
 *                              "adamw", typed a letter every 80 ms, to the answer drawn
 *                              (MS_BENCH_VIEW_ENTRIES entries; the name says the default's 5 M)
 *   view_search_longest_task_ms the longest main-thread task from the first keystroke to then
 *   view_search_index_ms       from the first focus of the frame box to the first answer (the
 *                              worker's index built)
 * Without chromium the browser figures are left out (a note on stderr); without fixtures the
 * fixture figures are.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "synth.h"
#include "bench_util.h"

#ifndef MS_BENCH_FIXTURES_DEFAULT
#define MS_BENCH_FIXTURES_DEFAULT "../shared/fixtures/torch"
#endif
#ifndef MS_BENCH_SOURCE_DIR
#define MS_BENCH_SOURCE_DIR "."
#endif

/* Runs memsnap view IN -o OUT; @return wall seconds (-1 on failure), *rss_mb its peak RSS. */
static double run_view(const char *bin, const char *in, const char *out, double *rss_mb) {
  bench_child_t r;
  if (bench_try_run((const char *const[]){bin, "view", in, "-o", out, NULL}, &r) != 0) return -1;
  *rss_mb = (double)r.rss_kb / 1024.0;
  return r.wall;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double file_mb(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (double)st.st_size / 1048576.0 : -1;
}

/* first paint (ms), zoom frame (ms), heap (MiB) from view_page.sh; @return 0 on success. */
static int browse(const char *page, double *paint_ms, double *zoom_ms, double *heap_mb) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s/bench/view_page.sh' '%s'", MS_BENCH_SOURCE_DIR, page);
  fflush(stdout);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  int n = fscanf(p, "%lf %lf %lf", paint_ms, zoom_ms, heap_mb);
  while (fgetc(p) != EOF) { /* the rest, so that the script's last write finds a reader */
  }
  int rc = pclose(p);
  if (rc != 0 || n != 3) {
    fprintf(stderr, "bench_view: no browser figures for %s (chromium missing or the page did "
                    "not draw)\n", page);
    return -1;
  }
  return 0;
}

/* search (ms), longest main-thread task (ms), index (ms) from view_search.py; @return 0 on
 * success. */
static int search(const char *page, double *search_ms, double *task_ms, double *index_ms) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "python3 '%s/bench/view_search.py' '%s' adamw", MS_BENCH_SOURCE_DIR, page);
  fflush(stdout);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  double t0 = now_s();
  errno = 0;
  int n = fscanf(p, "%lf %lf %lf", search_ms, task_ms, index_ms);
  int err = errno, ferr = ferror(p), eof = feof(p);
  /* the script prints more than the three figures (the answer's text, which can be long): read
   * it all, or its last write meets a closed pipe and it fails */
  while (fgetc(p) != EOF) {
  }
  int rc = pclose(p);
  if (rc != 0 || n != 3) {
    fprintf(stderr,
            "bench_view: no search figures for %s (chromium missing or the search did "
            "not answer: %d read, after %.1f s, error %d (%s), end %d, status %d)\n",
            page, n, now_s() - t0, ferr, strerror(err), eof, rc);
    return -1;
  }
  return 0;
}

int main(void) {
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) bin = "bin/memsnap";
  /* Every write here is a first one: `view` stores its page in the snapshot cache and a second
   * run of the same file would copy the stored page (bench_cache measures that). */
  setenv("MEMSNAP_CACHE", "0", 1);
  const char *fx = getenv("MEMSNAP_TORCH_FIXTURES");
  if (!fx || !*fx) fx = MS_BENCH_FIXTURES_DEFAULT;
  const char *outdir = getenv("MS_BENCH_OUT");
  char dir[512];
  snprintf(dir, sizeof dir, "%s/view", outdir && *outdir ? outdir : "/tmp");
  mkdir(dir, 0755);
  char in[1024], out[1024];
  double rss, paint, zoom, heap;

  snprintf(in, sizeof in, "%s/wedsonlin_cs336_medium_1024_training.pickle", fx);
  snprintf(out, sizeof out, "%s/largest.html", dir);
  if (access(in, R_OK) == 0) {
    double t[5];
    for (int i = 0; i < 5; i++)
      if ((t[i] = run_view(bin, in, out, &rss)) < 0) {
        fprintf(stderr, "bench_view: memsnap view failed on %s\n", in);
        return 1;
      }
    qsort(t, 5, sizeof *t, cmp);
    printf("view_write_largest_s %.4f\n", t[2]);
    printf("view_html_largest_mb %.3f\n", file_mb(out));
    if (browse(out, &paint, &zoom, &heap) == 0) printf("view_first_paint_largest_s %.3f\n", paint / 1000);
  } else {
    fprintf(stderr, "bench_view: fixtures not found in %s: no fixture figures\n", fx);
  }

  synth_opts_t so = {1, 5000000, 4};
  const char *e = getenv("MS_BENCH_VIEW_ENTRIES");
  if (e && *e) so.entries = (size_t)strtoull(e, NULL, 10);
  ms_snapshot_t *snap = NULL;
  ms_errbuf_t eb = {{0}};
  if (synth_workload(&so, &snap, &eb) != MS_OK) {
    fprintf(stderr, "bench_view: %s\n", eb.msg);
    return 1;
  }
  snprintf(in, sizeof in, "%s/synth.pickle", dir);
  snprintf(out, sizeof out, "%s/synth.html", dir);
  size_t n = snap->ntrace;
  if (synth_write_pickle(snap, in, &eb) != MS_OK) {
    fprintf(stderr, "bench_view: %s\n", eb.msg);
    return 1;
  }
  ms_snapshot_free(snap);
  double w = run_view(bin, in, out, &rss);
  if (w < 0) {
    fprintf(stderr, "bench_view: memsnap view failed on %s\n", in);
    return 1;
  }
  printf("view_synth_entries %zu\n", n);
  printf("view_write_synth_s %.3f\n", w);
  printf("view_write_1gb_s %.3f\n", w);
  printf("view_write_synth_rss_mb %.1f\n", rss);
  printf("view_html_mb %.2f\n", file_mb(out));
  if (browse(out, &paint, &zoom, &heap) == 0) {
    printf("view_first_paint_s %.3f\n", paint / 1000);
    printf("view_zoom_frame_ms %.2f\n", zoom);
    printf("view_tab_mb %.1f\n", heap);
  }
  double sms, task, index;
  if (search(out, &sms, &task, &index) == 0) {
    printf("view_search_5m_ms %.1f\n", sms);
    printf("view_search_longest_task_ms %.1f\n", task);
    printf("view_search_index_ms %.0f\n", index);
  }
  unlink(in);
  unlink(out);
  return 0;
}
