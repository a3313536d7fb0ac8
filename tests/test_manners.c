/* SPDX-License-Identifier: MIT
 * The command line's manners (issue #32), run as a user runs them: "did you mean" for commands,
 * options and allocator keys; unambiguous prefixes of long options accepted and ambiguous ones
 * refused with their candidates (getopt_long, argparse); options named as typed; one vocabulary
 * (-d/--device, --filter-freed with the old spelling kept); clear messages where a command had
 * nothing to say. Exact texts and exit statuses. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "memsnap/serialize.h"

static char *dir;

static void setup(void) {
  dir = th_tmpdir();
  cr_assert(dir);
  char p[4200], why[512];
  snprintf(p, sizeof p, "%s/snap.msnap", dir);
  cr_assert_eq(th_write_synth(p, NULL, why, sizeof why), 0, "%s", why);
}

static void teardown(void) {
  th_rmdir(dir);
  free(dir);
}

TestSuite(manners, .init = setup, .fini = teardown);

#define RUN(...) th_run(dir, NULL, NULL, (const char *const[]){__VA_ARGS__, NULL})

/* Exit status 2 and exactly "memsnap: error: MSG\nRun 'memsnap CMD --help' for usage.\n". */
static void expect_usage(th_run_t r, const char *cmd, const char *msg) {
  char want[1024];
  if (cmd)
    snprintf(want, sizeof want, "memsnap: error: %s\nRun 'memsnap %s --help' for usage.\n", msg,
             cmd);
  else
    snprintf(want, sizeof want, "memsnap: error: %s\nRun 'memsnap --help' for usage.\n", msg);
  cr_expect_eq(r.status, 2, "status %d, stderr: %s", r.status, r.err);
  cr_expect_str_eq(r.err, want);
  cr_expect_eq(r.out_len, 0, "stdout: %s", r.out);
}

Test(manners, did_you_mean_a_command) {
  th_run_t r = RUN("stat", "snap.msnap");
  expect_usage(r, NULL, "'stat' is not a memsnap command; did you mean 'stats'?");
  th_run_free(&r);
  r = RUN("help", "tiemline");
  expect_usage(r, NULL, "'tiemline' is not a memsnap command; did you mean 'timeline'?");
  th_run_free(&r);
  r = RUN("expl");                 /* the prefix of one command */
  expect_usage(r, NULL, "'expl' is not a memsnap command; did you mean 'explain'?");
  th_run_free(&r);
  r = RUN("frobnicate"); /* nothing near: no suggestion */
  expect_usage(r, NULL, "'frobnicate' is not a memsnap command");
  th_run_free(&r);
}

Test(manners, did_you_mean_an_option) {
  th_run_t r = RUN("memory", "snap.msnap", "--outptu", "x.svg");
  expect_usage(r, "memory", "unknown option '--outptu'; did you mean '--output'?");
  th_run_free(&r);
  r = RUN("stats", "--summray", "snap.msnap");
  expect_usage(r, "stats", "unknown option '--summray'; did you mean '--summary'?");
  th_run_free(&r);
  r = RUN("stats", "--bogus", "snap.msnap");
  expect_usage(r, "stats", "unknown option '--bogus'");
  th_run_free(&r);
}

Test(manners, did_you_mean_an_allocator_key) {
  th_run_t r = RUN("replay", "snap.msnap", "--config", "max_split_size_md:64");
  cr_expect_neq(r.status, 0);
  cr_expect(strstr(r.err, "key 'max_split_size_md' at offset 0: unrecognized key; did you mean "
                          "'max_split_size_mb'? expected one of: max_split_size_mb, "),
            "%s", r.err);
  th_run_free(&r);
}

Test(manners, unambiguous_prefixes_are_accepted) {
  th_run_t full = RUN("stats", "--summary", "snap.msnap");
  cr_assert_eq(full.status, 0, "%s", full.err);
  th_run_t r = RUN("stats", "--summ", "snap.msnap");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.out, full.out);
  th_run_free(&r);
  th_run_free(&full);
  r = RUN("memory", "snap.msnap", "--fold", "--out", "a.folded");
  cr_expect_eq(r.status, 0, "%s", r.err);
  th_run_free(&r);
  r = RUN("memory", "snap.msnap", "--fold", "--out=b.folded");
  cr_expect_eq(r.status, 0, "%s", r.err);
  th_run_free(&r);
  char pa[4200], pb[4200];
  snprintf(pa, sizeof pa, "%s/a.folded", dir);
  snprintf(pb, sizeof pb, "%s/b.folded", dir);
  size_t la = 0, lb = 0;
  char *a = th_read_file(pa, &la), *b = th_read_file(pb, &lb);
  cr_expect(a && b && la == lb && la > 0 && memcmp(a, b, la) == 0);
  free(a);
  free(b);
  r = RUN("memory", "snap.msnap", "--he"); /* a prefix of --help alone */
  cr_expect_eq(r.status, 0);
  cr_expect(strncmp(r.out, "usage: memsnap memory ", 22) == 0, "%s", r.out);
  th_run_free(&r);
}

Test(manners, ambiguous_prefixes_are_refused_with_the_candidates) {
  th_run_t r = RUN("top", "snap.msnap", "--j");
  expect_usage(r, "top", "option '--j' is ambiguous; possibilities: '--jobs' '--json'");
  th_run_free(&r);
  r = RUN("stats", "snap.msnap", "--s");
  expect_usage(r, "stats", "option '--s' is ambiguous; possibilities: '--summary' '--stream'");
  th_run_free(&r);
}

Test(manners, options_are_named_as_typed) {
  th_run_t r = RUN("top", "snap.msnap", "-n");
  expect_usage(r, "top", "option '-n' needs a value");
  th_run_free(&r);
  r = RUN("memory", "snap.msnap", "--out");
  expect_usage(r, "memory", "option '--out' needs a value");
  th_run_free(&r);
  r = RUN("memory", "snap.msnap", "--fold=yes");
  expect_usage(r, "memory", "option '--fold' takes no value");
  th_run_free(&r);
}

Test(manners, one_vocabulary) {
  /* -d is --device in every command that has one */
  static const char *const cmds[] = {"stats", "trace", "top", "timeline", "explain"};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    th_run_t a = RUN(cmds[i], "snap.msnap", "--device", "1");
    th_run_t b = RUN(cmds[i], "snap.msnap", "-d", "1");
    cr_expect_eq(b.status, a.status, "%s: %s", cmds[i], b.err);
    cr_expect_str_eq(b.out, a.out, "%s", cmds[i]);
    th_run_free(&a);
    th_run_free(&b);
  }
  /* --filter-freed, the old --filter_freed kept */
  th_run_t a = RUN("trace_plot", "snap.msnap", "--filter-freed", "-o", "a.html");
  cr_expect_eq(a.status, 0, "%s", a.err);
  th_run_t b = RUN("trace_plot", "snap.msnap", "--filter_freed", "-o", "b.html");
  cr_expect_eq(b.status, 0, "%s", b.err);
  th_run_free(&a);
  th_run_free(&b);
  th_run_t h = RUN("trace_plot", "--help");
  cr_expect(strstr(h.out, "--filter-freed") && !strstr(h.out, "--filter_freed"), "%s", h.out);
  th_run_free(&h);
}

/* {'segments': [], 'device_traces': []} as Python pickles it with protocols 0, 1 and 2. */
static const char pickle_p0[] = "(dp0\nVsegments\np1\n(lp2\nsVdevice_traces\np3\n(lp4\ns.";
static const char pickle_p1[] = "}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\x0d\x00\x00\x00"
                                "device_tracesq\x03]q\x04u.";
static const char pickle_p2[] = "\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X"
                                "\x0d\x00\x00\x00"
                                "device_tracesq\x03]q\x04u.";

static void put(const char *name, const char *data, size_t len) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  cr_assert_eq(th_write_file(p, data, len), 0);
}

Test(manners, trace_without_a_trace_says_so) {
  put("notrace.pickle", pickle_p2, sizeof pickle_p2 - 1);
  th_run_t r = RUN("trace", "notrace.pickle");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.out, "\n"); /* _memory_viz.py's text */
  cr_expect_str_eq(r.err, "memsnap: warning: 'notrace.pickle' holds no allocator trace: record "
                          "one with torch.cuda.memory._record_memory_history() before the code "
                          "to trace (PyTorch), or take it with `memsnap run` or a history "
                          "recorder (memsnap)\n");
  th_run_free(&r);
}

Test(manners, an_old_pickle_protocol_is_named) {
  put("p0.pickle", pickle_p0, sizeof pickle_p0 - 1);
  put("p1.pickle", pickle_p1, sizeof pickle_p1 - 1);
  for (int p = 0; p <= 1; p++) {
    char name[32], want[512];
    snprintf(name, sizeof name, "p%d.pickle", p);
    snprintf(want, sizeof want,
             "memsnap: error: '%s': a pickle of protocol %d; PyTorch writes snapshots with "
             "protocols 2 to 5 (re-save it with pickle.dump(obj, f, protocol=4))\n",
             name, p);
    th_run_t r = RUN("stats", name);
    cr_expect_eq(r.status, 1);
    cr_expect_str_eq(r.err, want);
    th_run_free(&r);
  }
}

Test(manners, run_without_a_cuda_call_says_so) {
  th_run_t r = RUN("run", "--", "/bin/true");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.err, "memsnap: warning: no CUDA call was seen in '/bin/true', so no "
                          "snapshot was written: it made no device-memory calls, or it is "
                          "linked with the static CUDA runtime (nvcc's default; build it with "
                          "-cudart shared), whose calls cannot be interposed\n");
  th_run_free(&r);
}

/* ---- outputs say what they wrote; default names; no silent overwrite (item 4) ---------------- */

static bool exists(const char *name) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "rb");
  if (f) fclose(f);
  return f != NULL;
}

/* "memsnap: wrote 'NAME' (" ... ")HINT\n", the size being the file's. */
static void expect_wrote(const char *err, const char *name, const char *hint) {
  char head[512];
  snprintf(head, sizeof head, "memsnap: wrote '%s' (", name);
  cr_expect(strncmp(err, head, strlen(head)) == 0, "%s", err);
  const char *close = strchr(err + strlen(head), ')');
  cr_assert(close, "%s", err);
  char tail[256];
  snprintf(tail, sizeof tail, ")%s\n", hint);
  cr_expect_str_eq(close, tail);
}

Test(manners, outputs_say_what_they_wrote_unless_quiet) {
  th_run_t r = RUN("memory", "snap.msnap", "-o", "m.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  expect_wrote(r.err, "m.svg", "; open it in a web browser");
  th_run_free(&r);
  r = RUN("memory", "snap.msnap", "--folded", "-o", "m.folded");
  expect_wrote(r.err, "m.folded", "");
  th_run_free(&r);
  r = RUN("memory", "snap.msnap", "-q", "-o", "q.svg");
  cr_expect_eq(r.status, 0);
  cr_expect_str_eq(r.err, "");
  th_run_free(&r);
  r = RUN("segments", "snap.msnap", "--quiet", "-o", "q2.svg");
  cr_expect_str_eq(r.err, "");
  th_run_free(&r);
  /* standard output is not announced */
  r = RUN("memory", "snap.msnap", "--folded");
  cr_expect_str_eq(r.err, "");
  th_run_free(&r);
}

Test(manners, default_output_names) {
  /* view names its page after the input; the commands that mirror _memory_viz.py keep its
   * output.svg and output.html */
  th_run_t r = RUN("view", "snap.msnap");
  cr_expect_eq(r.status, 0, "%s", r.err);
  expect_wrote(r.err, "snap.view.html", "; open it in a web browser");
  cr_expect(exists("snap.view.html"));
  th_run_free(&r);
  r = RUN("memory", "snap.msnap");
  cr_expect_eq(r.status, 0, "%s", r.err);
  expect_wrote(r.err, "output.svg", "; open it in a web browser");
  th_run_free(&r);
  r = RUN("segment_plot", "snap.msnap");
  cr_expect_eq(r.status, 0, "%s", r.err);
  expect_wrote(r.err, "output.html", "; open it in a web browser");
  th_run_free(&r);
}

Test(manners, a_default_output_never_overwrites_a_users_file) {
  put("output.svg", "my own drawing\n", 15);
  th_run_t r = RUN("memory", "snap.msnap");
  cr_expect_eq(r.status, 1);
  cr_expect_str_eq(r.err, "memsnap: error: refusing to overwrite 'output.svg', which memsnap did "
                          "not write; name another output with -o, or add --force\n");
  char p[4200];
  snprintf(p, sizeof p, "%s/output.svg", dir);
  size_t n = 0;
  char *keep = th_read_file(p, &n);
  cr_expect(keep && n == 15 && memcmp(keep, "my own drawing\n", 15) == 0);
  free(keep);
  th_run_free(&r);
  r = RUN("memory", "snap.msnap", "--force");
  cr_expect_eq(r.status, 0, "%s", r.err);
  th_run_free(&r);
  /* memsnap's own output.svg is written over, again and again */
  r = RUN("memory", "snap.msnap", "-q");
  cr_expect_eq(r.status, 0, "%s", r.err);
  th_run_free(&r);
  /* the same for view's default page */
  put("snap.view.html", "<p>notes</p>\n", 13);
  r = RUN("view", "snap.msnap");
  cr_expect_eq(r.status, 1);
  cr_expect_str_eq(r.err, "memsnap: error: refusing to overwrite 'snap.view.html', which memsnap "
                          "did not write; name another output with -o, or add --force\n");
  th_run_free(&r);
  /* a name given with -o is the user's choice, as cp's */
  r = RUN("view", "snap.msnap", "-q", "-o", "snap.view.html");
  cr_expect_eq(r.status, 0, "%s", r.err);
  th_run_free(&r);
}

/* ---- help within 80 columns (item 6) ---------------------------------------------------------- */

/* Display columns of a line: UTF-8 code points. */
static size_t columns(const char *s, size_t n) {
  size_t w = 0;
  for (size_t i = 0; i < n; i++)
    if (((unsigned char)s[i] & 0xC0) != 0x80) w++;
  return w;
}

static void expect_within_80(const char *what, const char *text) {
  for (const char *p = text; *p;) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    cr_expect(columns(p, n) <= 80, "%s: a line of %zu columns: %.*s", what, columns(p, n),
              (int)n, p);
    p += n + (nl ? 1 : 0);
  }
}

Test(manners, every_help_fits_in_80_columns) {
  th_run_t top = RUN("--help");
  cr_assert_eq(top.status, 0);
  expect_within_80("memsnap --help", top.out);
  const char *list = strstr(top.out, "commands:\n");
  cr_assert(list);
  int n = 0;
  for (const char *p = list + 10; *p == ' '; n++) {
    char name[32];
    cr_assert_eq(sscanf(p, " %31s", name), 1);
    th_run_t h = RUN(name, "--help");
    cr_expect_eq(h.status, 0, "%s", name);
    cr_expect_gt(h.out_len, 0, "%s", name);
    expect_within_80(name, h.out);
    th_run_free(&h);
    p = strchr(p, '\n') + 1;
  }
  cr_expect_geq(n, 17);
  th_run_free(&top);
}

/* ---- top: rows that look the same say what tells them apart (item 14) ------------------------- */

Test(manners, top_rows_that_look_the_same_are_told_apart) {
  static const char *const names[] = {"yiyi_flexgen_1.3b_legacy_a.pickle",
                                      "wedsonlin_cs336_medium_1024_training.pickle",
                                      "jogregoire_diffusion_tiny.pickle"};
  int ran = 0;
  for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", th_fixture_dir(), names[k]);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    fclose(f);
    ran++;
    th_run_t r = RUN("top", path, "-n", "30", "--by", "stack", "--json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    /* every "label" differs from every other */
    const char *labels[64];
    size_t lens[64], n = 0;
    for (const char *p = r.out; (p = strstr(p, "\"label\": \"")) && n < 64; n++) {
      p += 10;
      const char *q = p;
      while (*q && !(*q == '"' && q[-1] != '\\')) q++;
      labels[n] = p;
      lens[n] = (size_t)(q - p);
      p = q;
    }
    cr_expect_gt(n, 2, "%s", names[k]);
    for (size_t i = 0; i < n; i++)
      for (size_t j = i + 1; j < n; j++)
        cr_expect(lens[i] != lens[j] || memcmp(labels[i], labels[j], lens[i]) != 0,
                  "%s: rows %zu and %zu read the same: %.*s", names[k], i, j, (int)lens[i],
                  labels[i]);
    th_run_free(&r);
  }
  if (!ran) printf("SKIP: no PyTorch fixture in %s: top's row labels not checked\n", th_fixture_dir());
  /* <no frame> is explained where it appears */
  char path[4200];
  snprintf(path, sizeof path, "%s/cranberrii_ftcourse.pickle", th_fixture_dir());
  FILE *f = fopen(path, "rb");
  if (!f) return;
  fclose(f);
  th_run_t r = RUN("top", path, "-n", "0", "--by", "frame");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.out, "  <no frame>"), "%s", r.out);
  cr_expect(strstr(r.out, "\n<no frame>: a stack without a frame that PyTorch's filter keeps (only "
                          "allocator or C++ frames,\nor none recorded)\n"),
            "%s", r.out);
  th_run_free(&r);
}
