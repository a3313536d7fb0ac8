/* SPDX-License-Identifier: MIT
 * The viewer data's budget (issue #35 item 1; memsnap/timeline.h, docs/view.md "The budget"):
 * every free adds two points to every band stacked above the freed one, so the exact data grows as
 * the square of the trace. The worst shape is built here from its description (bench/synth.h,
 * synth_stacked: long-lived blocks, then rounds of allocating one and freeing a random one):
 *  - the exact data is refused past the budget, and says what it would take and what fits;
 *  - summarized, it holds at most the budget, and is exactly PyTorch's data with the number of
 *    elements drawn on their own that fit (max_entries), the others in the summarized band;
 *  - the count made before the replay is the replay's, on the fixtures and on built traces;
 *  - `timeline --viewer-data` refuses naming --max-entries; `view` writes a page that says it summarized.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "synth.h"

static ms_snapshot_t *stacked(size_t nlong, size_t nrounds) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(synth_stacked(nlong, nrounds, 7, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

/* the points of the series drawn on their own (the summarized band, last, aside) */
static size_t series_points(const ms_tlv_t *v) {
  return v->nseries ? v->series[v->nseries - 1].first_point : 0;
}

TestSuite(viewer_budget, .timeout = 300);

/* 2,000 long-lived blocks, then 2,000 rounds: about 4 million points exact (96 MB; the issue's
 * 10,000 + 10,000 took 4.7 GB), past the default budget. Before the budget, ms_tlv_compute
 * returned them all. */
Test(viewer_budget, worst_shape_is_bounded) {
  ms_snapshot_t *s = stacked(2000, 2000);
  ms_tlv_t v;
  int rc = ms_tlv_compute(s, 0, false, SIZE_MAX, 0, SIZE_MAX, NULL, &v);
  if (rc == MS_OK) {
    size_t n = v.npoints;
    ms_tlv_release(&v);
    cr_assert_fail("the exact data was computed: %zu points (%zu bytes), past 64 MiB", n, n * 24);
  }
  cr_expect_eq(rc, MS_ELIMIT);
  ms_tlv_budget_t b = {0};
  b.summarize = true;
  cr_assert_eq(ms_tlv_compute_budget(s, 0, false, SIZE_MAX, 0, SIZE_MAX, NULL, &b, &v), MS_OK);
  cr_expect_eq(b.bytes, MS_TLV_BUDGET_BYTES); /* 8,000 entries: 64 MiB is more than 384 B each */
  cr_expect(b.summarized);
  cr_expect_gt(b.exact_bytes, (uint64_t)3000000 * MS_TLV_POINT_BYTES, "%" PRIu64, b.exact_bytes);
  cr_expect_leq((uint64_t)series_points(&v) * MS_TLV_POINT_BYTES, MS_TLV_BUDGET_BYTES);
  cr_expect_lt(b.drawn, v.elements_length);
  cr_expect_eq(b.drawn, b.fits_entries);
  cr_expect_eq(v.nseries, b.drawn + 1, "%zu series", v.nseries);
  /* the band holds the rest: everything is drawn somewhere, max_size is the whole */
  cr_expect_eq(v.max_size, 2001 * 512);
  ms_tlv_release(&v);
  ms_snapshot_free(s);
}

/* The default budget: 64 MiB, or 384 bytes per trace entry when that is more. */
Test(viewer_budget, default_budget) {
  cr_expect_eq(ms_tlv_default_budget(0), (uint64_t)64 << 20);
  cr_expect_eq(ms_tlv_default_budget(174762), (uint64_t)64 << 20);
  cr_expect_eq(ms_tlv_default_budget(1000000), (uint64_t)384000000);
  cr_expect_eq(ms_tlv_default_budget(UINT32_MAX), (uint64_t)UINT32_MAX * 384);
}

static void expect_same(const ms_tlv_t *a, const ms_tlv_t *b) {
  cr_assert_eq(a->nseries, b->nseries);
  cr_assert_eq(a->npoints, b->npoints);
  cr_assert_eq(a->ntimesteps, b->ntimesteps);
  cr_expect_eq(a->max_size, b->max_size);
  cr_expect_eq(memcmp(a->max_at_time, b->max_at_time, a->ntimesteps * sizeof(int64_t)), 0);
  cr_expect_eq(memcmp(a->timesteps, b->timesteps, a->npoints * sizeof(int64_t)), 0);
  cr_expect_eq(memcmp(a->offsets, b->offsets, (a->npoints + 1) * sizeof(int64_t)), 0);
  const ms_tlv_series_t *band = &a->series[a->nseries - 1];
  cr_expect_eq(memcmp(a->sizes + band->first_point, b->sizes + band->first_point,
                      band->npoints * sizeof(int64_t)),
               0);
  for (size_t i = 0; i < a->nseries; i++) {
    cr_expect_eq(a->series[i].elem, b->series[i].elem);
    cr_expect_eq(a->series[i].first_point, b->series[i].first_point);
    cr_expect_eq(a->series[i].npoints, b->series[i].npoints);
  }
}

/* Summarized to a budget, the data is MemoryViz's with max_entries = the elements that fit; a
 * budget one point smaller draws fewer; without `summarize` the same budget is refused and says
 * what fits. */
Test(viewer_budget, summarized_is_pytorchs_data_with_fewer_entries) {
  ms_snapshot_t *s = stacked(300, 400);
  for (int seg = 0; seg < 2; seg++) {
    ms_tlv_budget_t b = {0};
    b.bytes = 20000 * MS_TLV_POINT_BYTES;
    b.summarize = true;
    ms_tlv_t v, exact;
    cr_assert_eq(ms_tlv_compute_budget(s, 0, seg, SIZE_MAX, 0, SIZE_MAX, NULL, &b, &v), MS_OK);
    if (seg) { /* one segment: nothing to summarize */
      cr_expect(!b.summarized);
      ms_tlv_release(&v);
      continue;
    }
    cr_assert(b.summarized);
    cr_expect_leq(series_points(&v), 20000);
    ms_tlv_budget_t none = {UINT64_MAX, false, 0, 0, 0, false};
    cr_assert_eq(
        ms_tlv_compute_budget(s, 0, false, b.drawn, 0, SIZE_MAX, NULL, &none, &exact), MS_OK);
    expect_same(&v, &exact);
    cr_expect_eq(none.exact_bytes, (uint64_t)series_points(&exact) * MS_TLV_POINT_BYTES);
    ms_tlv_release(&exact);
    /* one more element drawn does not fit */
    none.bytes = b.bytes;
    cr_expect_eq(
        ms_tlv_compute_budget(s, 0, false, b.drawn + 1, 0, SIZE_MAX, NULL, &none, &exact),
        MS_ELIMIT);
    cr_expect_gt(none.exact_bytes, b.bytes);
    cr_expect_eq(none.fits_entries, b.drawn);
    /* refused without summarize */
    ms_tlv_budget_t strict = {b.bytes, false, 0, 0, 0, false};
    cr_expect_eq(ms_tlv_compute_budget(s, 0, false, SIZE_MAX, 0, SIZE_MAX, NULL, &strict, &exact),
                 MS_ELIMIT);
    cr_expect_eq(strict.fits_entries, b.drawn);
    cr_expect_eq(strict.exact_bytes, b.exact_bytes);
    ms_tlv_release(&v);
  }
  ms_snapshot_free(s);
}

/* Random shapes and budgets, and the synthetic snapshots' hostile traces (frees that match no
 * alloc, reused addresses): summarized is always exact with fewer entries, within the budget. */
Test(viewer_budget, random_shapes_and_budgets) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  size_t tried = 0, summarized = 0;
  int rounds = getenv("MS_TEST_BUDGET_ROUNDS") ? atoi(getenv("MS_TEST_BUDGET_ROUNDS")) : 300;
  for (int k = 0; k < rounds; k++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ms_snapshot_t *s;
    if (k % 3 == 2) {
      th_synth_opts_t o = {.nsegments = 2 + x % 6, .blocks_per_segment = 1 + (x >> 8) % 12,
                           .nframes = 8, .nstacks = 8, .ntrace = 50 + (x >> 16) % 400,
                           .seed = x};
      s = th_synth(&o);
      cr_assert(s);
    } else {
      s = stacked(1 + x % 200, (x >> 8) % 300);
    }
    for (int seg = 0; seg < 2; seg++) {
      ms_tlv_budget_t b = {((x >> 24) % 4000 + 1) * MS_TLV_POINT_BYTES, true, 0, 0, 0, false};
      size_t me = (x >> 40) % 3 == 0 ? (size_t)((x >> 44) % 50) : SIZE_MAX;
      ms_tlv_t v, exact;
      int rc = ms_tlv_compute_budget(s, 0, seg, me, 0, SIZE_MAX, NULL, &b, &v);
      if (rc != MS_OK) continue; /* a device 0 the snapshot lacks, say */
      tried++;
      summarized += b.summarized;
      cr_expect_leq((uint64_t)series_points(&v) * MS_TLV_POINT_BYTES, b.bytes, "case %d", k);
      ms_tlv_budget_t none = {UINT64_MAX, false, 0, 0, 0, false};
      cr_assert_eq(ms_tlv_compute_budget(s, 0, seg, b.summarized ? b.drawn : me, 0, SIZE_MAX, NULL,
                                         &none, &exact),
                   MS_OK, "case %d", k);
      expect_same(&v, &exact);
      ms_tlv_release(&exact);
      ms_tlv_release(&v);
    }
    ms_snapshot_free(s);
  }
  cr_log_info("%zu computations, %zu summarized", tried, summarized);
  cr_expect_gt(summarized, 10);
}

/* The count made before the replay is the replay's own (ms_tlv_compute checks it and fails
 * otherwise): on every fixture, both timelines, every max_entries that matters. */
Test(viewer_budget, count_is_the_replays_on_the_fixtures) {
  static const char *const names[] = {"a0kuma_adamw_small",
                                      "cranberrii_ftcourse",
                                      "jogregoire_diffusion_tiny",
                                      "maphsge_select_n_4dev",
                                      "wedsonlin_cs336_medium_1024_training",
                                      "yiyi_flexgen_1.3b_legacy_a",
                                      "yiyi_flexgen_oom_legacy"};
  size_t tried = 0;
  for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), names[k]);
    cr_assert_eq(access(path, R_OK), 0, "%s", path);
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s: %s", path, eb.msg);
    size_t def = 0;
    ms_tl_viewer_devices(s, NULL, 0, &def);
    for (int seg = 0; seg < 2; seg++) {
      static const size_t me[] = {SIZE_MAX, 15000, 100, 1, 0};
      for (size_t m = 0; m < sizeof me / sizeof *me; m++) {
        ms_tlv_budget_t b = {UINT64_MAX, false, 0, 0, 0, false};
        ms_tlv_t v;
        cr_assert_eq(ms_tlv_compute_budget(s, def, seg, me[m], 0, SIZE_MAX, NULL, &b, &v), MS_OK,
                     "%s", names[k]);
        cr_expect_eq(b.exact_bytes, (uint64_t)series_points(&v) * MS_TLV_POINT_BYTES, "%s",
                     names[k]);
        cr_expect(!b.summarized);
        ms_tlv_release(&v);
        tried++;
      }
    }
    ms_snapshot_free(s);
  }
  cr_log_info("%zu computations", tried);
}

/* ---- the CLI ---------------------------------------------------------------------------------- */

TestSuite(viewer_budget_cli, .init = th_workdir_setup, .fini = th_workdir_teardown,
          .timeout = 300);

Test(viewer_budget_cli, timeline_viewer_data_refuses_and_view_summarizes) {
  ms_snapshot_t *s = stacked(2000, 2000);
  char path[400];
  snprintf(path, sizeof path, "%s/stacked.msgpack", th_workdir);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_tlv_budget_t b = {0};
  ms_tlv_t v;
  cr_assert_eq(ms_tlv_compute_budget(s, 0, false, SIZE_MAX, 0, SIZE_MAX, NULL, &b, &v), MS_ELIMIT);
  ms_snapshot_free(s);
  th_run_t r = TH_RUN("timeline", "stacked.msgpack", "--viewer-data");
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect_str_eq(r.out, "");
  char want[300];
  snprintf(want, sizeof want,
           "'stacked.msgpack': device 0: the timeline data would take %.1fMiB, past its limit of "
           "64.0MiB (docs/timeline.md); --max-entries %zu or fewer fits",
           (double)b.exact_bytes / (1 << 20), b.fits_entries);
  cr_expect(strstr(r.err, want), "%s\nwanted: %s", r.err, want);
  th_run_free(&r);
  char fits[32];
  snprintf(fits, sizeof fits, "%zu", b.fits_entries);
  r = TH_RUN("timeline", "stacked.msgpack", "--viewer-data", "--max-entries", fits);
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.out, "\"elem\": \"summarized\""));
  th_run_free(&r);
  r = TH_RUN("view", "stacked.msgpack", "-o", "v.html");
  cr_expect_eq(r.status, 0, "%s", r.err);
  th_run_free(&r);
  char html[400], expect[200];
  snprintf(html, sizeof html, "%s/v.html", th_workdir);
  char *page = th_read_text(html, NULL);
  cr_assert(page, "%s", html);
  snprintf(expect, sizeof expect, "\"budget\":{\"bytes\":%" PRIu64 ",\"exact_bytes\":%" PRIu64
           ",\"drawn\":%zu}", MS_TLV_BUDGET_BYTES, b.exact_bytes, b.fits_entries);
  cr_expect(strstr(page, expect), "the page's data does not say it summarized: %s", expect);
  free(page);
  /* --budget: a larger one draws everything, a smaller one fewer; 0 or junk is a usage error */
  r = TH_RUN("view", "stacked.msgpack", "-o", "big.html", "--budget", "1G");
  cr_expect_eq(r.status, 0, "%s", r.err);
  th_run_free(&r);
  snprintf(html, sizeof html, "%s/big.html", th_workdir);
  page = th_read_text(html, NULL);
  cr_assert(page, "%s", html);
  cr_expect_null(strstr(page, "\"budget\":{"), "summarized within a 1 GiB budget");
  free(page);
  r = TH_RUN("view", "stacked.msgpack", "-o", "small.html", "--budget", "1M");
  cr_expect_eq(r.status, 0, "%s", r.err);
  th_run_free(&r);
  snprintf(html, sizeof html, "%s/small.html", th_workdir);
  page = th_read_text(html, NULL);
  cr_assert(page, "%s", html);
  cr_expect(strstr(page, "\"budget\":{\"bytes\":1048576,"), "no 1 MiB budget in the page");
  free(page);
  r = TH_RUN("view", "stacked.msgpack", "--budget", "0");
  cr_expect_eq(r.status, 2, "%s", r.err);
  cr_expect(strstr(r.err, "option '--budget' needs a size such as 64M or 2G"), "%s", r.err);
  th_run_free(&r);
}
