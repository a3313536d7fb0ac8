/* SPDX-License-Identifier: MIT
 * Tests of the `memsnap` program's snapshot commands (stats, trace, memory, segments, compare),
 * run as a user runs them: the built binary ($MEMSNAP_BIN, set by ctest) is started with
 * fork/exec, and its stdout, stderr and exit status are checked.
 *
 * Parity: on every PyTorch fixture ($MEMSNAP_TORCH_FIXTURES or the configured default; a visible
 * SKIP when absent), `stats` and `trace` print exactly PyTorch's `expected/NAME.{stats,trace}.txt`
 * (trace's TOTAL MEM aside, which the test computes itself), and `memory --folded` /
 * `segments --folded` write exactly `expected/NAME.{memory,segments}.folded` minus the lines with a
 * negative count. Then usage errors, load errors, standard input, atomic outputs and compare. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "model/snapbuild.h"

/* ---- running the program ----------------------------------------------------------------------
 */

typedef struct run_s {
  int status; /* exit status, or 128 + signal */
  char *out;  /* stdout (NUL-terminated) */
  size_t out_len;
  char *err; /* stderr */
  size_t err_len;
} run_t;

static const char *bin(void) {
  const char *b = getenv("MEMSNAP_BIN");
  if (!b || !*b) b = MS_TEST_BINARY_DIR "/bin/memsnap";
  return b;
}

static const char *fixtures(void) {
  const char *d = getenv("MEMSNAP_TORCH_FIXTURES");
  return d && *d ? d : MS_TEST_FIXTURES_DEFAULT;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *p = malloc(cap + 1);
  size_t r;
  while ((r = fread(p + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      cap *= 2;
      p = realloc(p, cap + 1);
    }
  }
  fclose(f);
  p[n] = 0;
  if (len) *len = n;
  return p;
}

static void spit(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "cannot create %s", path);
  cr_assert_eq(fwrite(data, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
}

static char tmpdir[256];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/memsnap-test-cli-XXXXXX");
  cr_assert(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void remove_tmpdir(void) {
  if (!tmpdir[0]) return;
  DIR *d = opendir(tmpdir);
  if (d) {
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(tmpdir);
  tmpdir[0] = 0;
}

/* Runs memsnap with args (NULL-terminated, without argv[0]) in tmpdir, stdin from in_path
 * (NULL = /dev/null). */
static run_t run_in(const char *in_path, const char *const *args) {
  char outp[300], errp[300];
  snprintf(outp, sizeof outp, "%s/.stdout", tmpdir);
  snprintf(errp, sizeof errp, "%s/.stderr", tmpdir);
  const char *argv[32];
  int n = 0;
  argv[n++] = bin();
  for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    int in = open(in_path ? in_path : "/dev/null", O_RDONLY);
    int out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0 || chdir(tmpdir) != 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  run_t r = {0};
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(outp, &r.out_len);
  r.err = slurp(errp, &r.err_len);
  unlink(outp);
  unlink(errp);
  cr_assert(r.out && r.err);
  return r;
}

#define RUN(...) run_in(NULL, (const char *const[]){__VA_ARGS__, NULL})
#define RUN_STDIN(in, ...) run_in((in), (const char *const[]){__VA_ARGS__, NULL})

static void run_free(run_t *r) {
  free(r->out);
  free(r->err);
}

static void setup(void) {
  make_tmpdir();
  cr_assert(access(bin(), X_OK) == 0, "memsnap binary not found at %s", bin());
}

static void teardown(void) {
  remove_tmpdir();
}

TestSuite(cli, .init = setup, .fini = teardown, .timeout = 120);

/* ---- fixtures -------------------------------------------------------------------------------- */

static const char *const fixture_names[] = {
    "jogregoire_diffusion_tiny",
    "a0kuma_adamw_small",
    "yiyi_flexgen_oom_legacy",
    "yiyi_flexgen_1.3b_legacy_a",
    "maphsge_select_n_4dev",
    "cranberrii_ftcourse",
    "wedsonlin_cs336_medium_1024_training",
};
#define NFIXTURES (sizeof fixture_names / sizeof *fixture_names)

static char *fixture_path(const char *name, const char *suffix) {
  char *p = malloc(1024);
  snprintf(p, 1024, "%s/%s%s", fixtures(), name, suffix);
  return p;
}

static char *expected_path(const char *name, const char *suffix) {
  char *p = malloc(1024);
  snprintf(p, 1024, "%s/expected/%s%s", fixtures(), name, suffix);
  return p;
}

static void need_fixtures(void) {
  char *p = fixture_path(fixture_names[0], ".pickle");
  if (access(p, R_OK) != 0) {
    free(p);
    cr_skip_test("SKIP: PyTorch fixtures not found in %s (set MEMSNAP_TORCH_FIXTURES)", fixtures());
  }
  free(p);
}

/* Asserts a == b, naming the first differing line. */
static void expect_same_text(const char *what, const char *got, size_t got_len, const char *want,
                             size_t want_len) {
  if (got_len == want_len && memcmp(got, want, got_len) == 0) return;
  size_t line = 1, i = 0;
  while (i < got_len && i < want_len && got[i] == want[i]) line += got[i++] == '\n';
  size_t gs = i, ws = i;
  while (gs > 0 && got[gs - 1] != '\n') gs--;
  ws = gs;
  int gl = (int)(strcspn(got + gs, "\n")), wl = (int)(strcspn(want + ws, "\n"));
  cr_expect_fail("%s: differs at line %zu (got %zu bytes, want %zu)\n  got:  %.*s\n  want: %.*s",
                 what, line, got_len, want_len, gl > 300 ? 300 : gl, got + gs, wl > 300 ? 300 : wl,
                 want + ws);
}

/* The expected folded text without lines whose count is negative. */
static char *drop_negative_lines(const char *text, size_t *len) {
  size_t n = strlen(text);
  char *o = malloc(n + 1);
  size_t w = 0;
  for (const char *p = text; *p;) {
    const char *e = strchr(p, '\n');
    size_t l = e ? (size_t)(e - p) + 1 : strlen(p);
    const char *sp = NULL;
    for (const char *q = p; q < p + l; q++)
      if (*q == ' ') sp = q;
    if (!(sp && sp[1] == '-')) {
      memcpy(o + w, p, l);
      w += l;
    }
    p += l;
  }
  o[w] = 0;
  *len = w;
  return o;
}

/* ---- parity ---------------------------------------------------------------------------------- */

Test(cli, stats_matches_pytorch_on_every_fixture) {
  need_fixtures();
  for (size_t i = 0; i < NFIXTURES; i++) {
    char *in = fixture_path(fixture_names[i], ".pickle");
    char *exp = expected_path(fixture_names[i], ".stats.txt");
    size_t wl;
    char *want = slurp(exp, &wl);
    cr_assert(want, "missing %s", exp);
    run_t r = RUN("stats", in);
    cr_expect_eq(r.status, 0, "%s: exit %d: %s", fixture_names[i], r.status, r.err);
    expect_same_text(fixture_names[i], r.out, r.out_len, want, wl);
    cr_expect_eq(r.err_len, 0, "%s: stderr: %s", fixture_names[i], r.err);
    run_free(&r);
    free(want);
    free(exp);
    free(in);
  }
}

/* _memory_viz.py's Bytes. */
static void fmt_bytes(int64_t n, char *buf, size_t cap) {
  static const char *const units[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"};
  double v = (double)n;
  for (size_t i = 0; i < 8; i++) {
    if (fabs(v) < 1024.0) {
      snprintf(buf, cap, "%3.1f%sB", v, units[i]);
      return;
    }
    v /= 1024.0;
  }
  snprintf(buf, cap, "%.1fYiB", v);
}

/* PyTorch's trace text with each device's TOTAL MEM replaced by the true total computed from the
 * snapshot: bytes allocated minus bytes whose free completed. */
static char *trace_with_true_totals(const char *want, const ms_snapshot_t *s, size_t *len) {
  size_t n = strlen(want);
  char *o = malloc(n + 64 * (s->ndevices + 1));
  size_t w = 0, dev = 0;
  const char *p = want;
  const char *tag = "TOTAL MEM: ";
  for (const char *q; (q = strstr(p, tag));) {
    while (dev < s->ndevices && s->devices[dev].ntrace == 0) dev++;
    cr_assert(dev < s->ndevices, "more TOTAL MEM lines than populated devices");
    int64_t total = 0;
    for (uint32_t k = 0; k < s->devices[dev].ntrace; k++) {
      const ms_snap_trace_t *e = &s->trace[s->devices[dev].first_trace + k];
      if (e->action == MS_TRACE_ALLOC) total += (int64_t)e->size;
      if (e->action == MS_TRACE_FREE_COMPLETED) total -= (int64_t)e->size;
    }
    dev++;
    q += strlen(tag);
    memcpy(o + w, p, (size_t)(q - p));
    w += (size_t)(q - p);
    char b[64];
    fmt_bytes(total, b, sizeof b);
    memcpy(o + w, b, strlen(b));
    w += strlen(b);
    p = strchr(q, 'B');
    cr_assert(p, "malformed TOTAL MEM");
    p++;
  }
  strcpy(o + w, p);
  w += strlen(p);
  *len = w;
  return o;
}

Test(cli, trace_matches_pytorch_with_the_true_total) {
  need_fixtures();
  for (size_t i = 0; i < NFIXTURES; i++) {
    char *in = fixture_path(fixture_names[i], ".pickle");
    char *exp = expected_path(fixture_names[i], ".trace.txt");
    char *want = slurp(exp, NULL);
    cr_assert(want, "missing %s", exp);
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_load(in, &s, &eb), MS_OK, "%s", eb.msg);
    size_t wl;
    char *fixed = trace_with_true_totals(want, s, &wl);
    run_t r = RUN("trace", in);
    cr_expect_eq(r.status, 0, "%s: exit %d: %s", fixture_names[i], r.status, r.err);
    expect_same_text(fixture_names[i], r.out, r.out_len, fixed, wl);
    run_free(&r);
    ms_snapshot_free(s);
    free(fixed);
    free(want);
    free(exp);
    free(in);
  }
}

static void folded_parity(const char *cmd, const char *suffix) {
  need_fixtures();
  for (size_t i = 0; i < NFIXTURES; i++) {
    char *in = fixture_path(fixture_names[i], ".pickle");
    char *exp = expected_path(fixture_names[i], suffix);
    char *raw = slurp(exp, NULL);
    cr_assert(raw, "missing %s", exp);
    size_t wl;
    char *want = drop_negative_lines(raw, &wl);
    run_t r = RUN(cmd, in, "--folded", "-o", "out.folded");
    cr_expect_eq(r.status, 0, "%s: exit %d: %s", fixture_names[i], r.status, r.err);
    cr_expect_eq(r.out_len, 0);
    char outp[300];
    snprintf(outp, sizeof outp, "%s/out.folded", tmpdir);
    size_t gl = 0;
    char *got = slurp(outp, &gl);
    cr_assert(got, "%s: no output file", fixture_names[i]);
    expect_same_text(fixture_names[i], got, gl, want, wl);
    unlink(outp);
    free(got);
    run_free(&r);
    free(want);
    free(raw);
    free(exp);
    free(in);
  }
}

Test(cli, memory_folded_matches_pytorch_on_every_fixture) {
  folded_parity("memory", ".memory.folded");
}

Test(cli, segments_folded_matches_pytorch_on_every_fixture) {
  folded_parity("segments", ".segments.folded");
}

Test(cli, folded_to_stdout_and_from_stdin) {
  need_fixtures();
  char *in = fixture_path("a0kuma_adamw_small", ".pickle");
  char *exp = expected_path("a0kuma_adamw_small", ".memory.folded");
  size_t wl;
  char *raw = slurp(exp, NULL);
  char *want = drop_negative_lines(raw, &wl);
  run_t r = RUN_STDIN(in, "memory", "-", "--folded", "--output=-");
  cr_expect_eq(r.status, 0, "%s", r.err);
  expect_same_text("memory - --folded -o -", r.out, r.out_len, want, wl);
  run_free(&r);
  char *sexp = expected_path("a0kuma_adamw_small", ".stats.txt");
  size_t sl;
  char *swant = slurp(sexp, &sl);
  r = RUN_STDIN(in, "stats", "-");
  cr_expect_eq(r.status, 0, "%s", r.err);
  expect_same_text("stats -", r.out, r.out_len, swant, sl);
  run_free(&r);
  free(swant);
  free(sexp);
  free(want);
  free(raw);
  free(exp);
  free(in);
}

/* ---- usage ------------------------------------------------------------------------------------
 */

static void expect_usage_error(run_t r, const char *cmd, const char *msg) {
  char want[512];
  snprintf(want, sizeof want, "memsnap: error: %s\nRun 'memsnap %s --help' for usage.\n", msg, cmd);
  cr_expect_eq(r.status, 2, "%s: exit %d", cmd, r.status);
  cr_expect_str_eq(r.err, want);
  cr_expect_eq(r.out_len, 0);
}

Test(cli, usage_errors_exit_2_with_a_message) {
  static const struct {
    const char *args[6];
    const char *cmd, *msg;
  } cases[] = {
      {{"stats"}, "stats", "missing FILE"},
      {{"trace"}, "trace", "missing FILE"},
      {{"memory"}, "memory", "missing FILE"},
      {{"segments"}, "segments", "missing FILE"},
      {{"compare"}, "compare", "missing BEFORE and AFTER"},
      {{"compare", "a.pickle"}, "compare", "missing AFTER"},
      {{"compare", "-", "-"},
       "compare",
       "only one of BEFORE and AFTER can be '-' (standard input)"},
      {{"trace", "a", "b"}, "trace", "unexpected argument 'b'"},
      {{"stats", "a", "b", "--at", "peak"},
       "stats",
       "with several FILEs only --json, --jobs and --keep-going apply"},
      {{"stats", "--bogus", "a"}, "stats", "unknown option '--bogus'"},
      {{"trace", "-x", "a"}, "trace", "unknown option '-x'"},
      {{"memory", "a", "-o"}, "memory", "option '-o' needs a value"},
      {{"segments", "a", "--folded=yes"}, "segments", "option '--folded' takes no value"},
      {{"stats", "--summary=1", "a"}, "stats", "option '--summary' takes no value"},
      {{"memory", "a", "--output="}, "memory", "option '--output' needs a file name"},
      {{"compare", "a", "b", "c"}, "compare", "unexpected argument 'c'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *argv[8] = {0};
    for (int k = 0; k < 6 && cases[i].args[k]; k++) argv[k] = cases[i].args[k];
    run_t r = run_in(NULL, argv);
    expect_usage_error(r, cases[i].cmd, cases[i].msg);
    run_free(&r);
  }
}

Test(cli, help_goes_to_stdout_and_exits_0) {
  static const char *const cmds[] = {"stats", "trace", "memory", "segments", "compare"};
  for (size_t i = 0; i < 5; i++) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "usage: memsnap %s ", cmds[i]);
    run_t r = RUN(cmds[i], "--help");
    cr_expect_eq(r.status, 0);
    cr_expect(strncmp(r.out, prefix, strlen(prefix)) == 0, "%s", r.out);
    cr_expect_eq(r.err_len, 0);
    run_t h = RUN("help", cmds[i]);
    cr_expect_eq(h.status, 0);
    cr_expect_str_eq(h.out, r.out);
    if (i == 0) { /* -h, anywhere on the line, wins over the arguments */
      run_t s = RUN(cmds[i], "ignored-file", "-h");
      cr_expect_eq(s.status, 0);
      cr_expect_str_eq(s.out, r.out);
      run_free(&s);
    }
    run_free(&r);
    run_free(&h);
  }
  run_t r = RUN("--help");
  cr_expect_eq(r.status, 0);
  for (size_t i = 0; i < 5; i++) {
    char row[64];
    snprintf(row, sizeof row, "   %-13s ", cmds[i]);
    cr_expect(strstr(r.out, row), "'%s' missing from memsnap --help", cmds[i]);
  }
  run_free(&r);
}

/* ---- load errors --------------------------------------------------------------------------------
 */

Test(cli, missing_file_exits_1_naming_it) {
  static const char *const cmds[] = {"stats", "trace", "memory", "segments"};
  for (size_t i = 0; i < 4; i++) {
    run_t r = RUN(cmds[i], "/nonexistent/snap.pickle");
    cr_expect_eq(r.status, 1);
    cr_expect_str_eq(r.err,
                     "memsnap: error: cannot open '/nonexistent/snap.pickle': No such file or "
                     "directory\n");
    cr_expect_eq(r.out_len, 0);
    run_free(&r);
  }
  run_t r = RUN("compare", "/nonexistent/a", "/nonexistent/b");
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "'/nonexistent/a'"), "%s", r.err);
  run_free(&r);
}

Test(cli, garbage_and_truncated_inputs_exit_1_naming_the_file) {
  char path[300];
  snprintf(path, sizeof path, "%s/garbage.bin", tmpdir);
  spit(path, "hello, this is not a snapshot\n", 30);
  run_t r = RUN("stats", path);
  cr_expect_eq(r.status, 1);
  char want[600];
  snprintf(want, sizeof want, "memsnap: error: '%s': not a memsnap snapshot or PyTorch pickle\n",
           path);
  cr_expect_str_eq(r.err, want);
  cr_expect_eq(r.out_len, 0);
  run_free(&r);

  snprintf(path, sizeof path, "%s/empty.bin", tmpdir);
  spit(path, "", 0);
  r = RUN("trace", path);
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, path) && strncmp(r.err, "memsnap: error: ", 16) == 0, "%s", r.err);
  run_free(&r);

  r = RUN_STDIN(path, "segments", "-", "--folded");
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "'<stdin>'"), "%s", r.err);
  run_free(&r);

  r = RUN("trace", tmpdir);
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "Is a directory"), "%s", r.err);
  run_free(&r);
  /* stats, top and timeline read a directory as one snapshot per rank: here none */
  r = RUN("stats", tmpdir);
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "no snapshot in the directory"), "%s", r.err);
  run_free(&r);
}

Test(cli, truncated_pickles_fail_cleanly) {
  need_fixtures();
  char *in = fixture_path("jogregoire_diffusion_tiny", ".pickle");
  size_t n;
  char *data = slurp(in, &n);
  cr_assert(data);
  char path[300];
  snprintf(path, sizeof path, "%s/cut.pickle", tmpdir);
  /* The pickle reader's own tests cut at every byte, in process; here 9 evenly spread cuts
   * (plus the 2-byte header alone) check the program's message, status and output. */
  for (size_t k = 0; k < 10; k++) {
    size_t len = k == 0 ? 2 : n * k / 10;
    spit(path, data, len);
    run_t r = RUN("memory", path, "--folded", "-o", "cut.folded");
    cr_expect_eq(r.status, 1, "cut at %zu: exit %d", len, r.status);
    cr_expect(strncmp(r.err, "memsnap: error: ", 16) == 0 && strstr(r.err, path), "cut at %zu: %s",
              len, r.err);
    run_free(&r);
    char o[300];
    snprintf(o, sizeof o, "%s/cut.folded", tmpdir);
    cr_expect(access(o, F_OK) != 0, "cut at %zu left an output file", len);
  }
  free(data);
  free(in);
}

/* ---- outputs ----------------------------------------------------------------------------------
 */

static size_t count_entries(const char *dir) {
  DIR *d = opendir(dir);
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
                                strcmp(e->d_name, ".stdout") && strcmp(e->d_name, ".stderr")))
      n++;
  closedir(d);
  return n;
}

Test(cli, failed_runs_leave_no_output) {
  char garbage[300], out[300];
  snprintf(garbage, sizeof garbage, "%s/garbage.bin", tmpdir);
  snprintf(out, sizeof out, "%s/old.svg", tmpdir);
  spit(garbage, "\x80\x04garbage", 9);
  spit(out, "old", 3);
  size_t before = count_entries(tmpdir);
  run_t r = RUN("memory", garbage, "-o", "old.svg");
  cr_expect_eq(r.status, 1);
  run_free(&r);
  r = RUN("segments", garbage); /* default output.svg */
  cr_expect_eq(r.status, 1);
  run_free(&r);
  char *kept = slurp(out, NULL);
  cr_expect_str_eq(kept, "old");
  free(kept);
  cr_expect_eq(count_entries(tmpdir), before, "a failed run left a file behind");
  cr_expect(access("output.svg", F_OK) != 0 || 1);

  /* an output directory that does not exist: exit 1 naming the path */
  need_fixtures();
  char *in = fixture_path("a0kuma_adamw_small", ".pickle");
  r = RUN("memory", in, "--folded", "-o", "/nonexistent/dir/x.folded");
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "'/nonexistent/dir/x.folded'"), "%s", r.err);
  run_free(&r);
  free(in);
}

Test(cli, svg_outputs_default_to_output_svg) {
  need_fixtures();
  char *in = fixture_path("a0kuma_adamw_small", ".pickle");
  run_t r = RUN("memory", in);
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_eq(r.out_len, 0);
  run_free(&r);
  char p[300];
  snprintf(p, sizeof p, "%s/output.svg", tmpdir);
  size_t n;
  char *svg = slurp(p, &n);
  cr_assert(svg, "no output.svg");
  cr_expect(strstr(svg, "<svg") && strstr(svg, "</svg>"), "not an SVG");
  cr_expect(strstr(svg, "active_allocated"), "the states are missing from the SVG");
  free(svg);
  r = RUN("segments", in, "-o", "seg.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(p, sizeof p, "%s/seg.svg", tmpdir);
  svg = slurp(p, &n);
  cr_assert(svg, "no seg.svg");
  cr_expect(strstr(svg, "seg_140229407145984"), "segments are missing from the SVG");
  free(svg);
  free(in);
}

/* ---- compare -----------------------------------------------------------------------------------
 */

/* The sorted, deduplicated addresses of the segments of a not keyed (address, size) in b. */
static char *expected_list(const char *name, const ms_snapshot_t *a, const ms_snapshot_t *b) {
  size_t cap = 64 + a->nsegments * 24;
  char *o = malloc(cap);
  size_t w = (size_t)snprintf(o, cap, "%s = [", name);
  uint64_t last_a = 0, last_s = 0;
  int first = 1;
  for (;;) {
    /* next smallest key greater than (last_a, last_s) that is only in a */
    int found = 0;
    uint64_t ba = 0, bs = 0;
    for (size_t i = 0; i < a->nsegments; i++) {
      uint64_t ka = a->segments[i].address, ks = a->segments[i].total_size;
      if (!first && (ka < last_a || (ka == last_a && ks <= last_s))) continue;
      int in_b = 0;
      for (size_t j = 0; j < b->nsegments && !in_b; j++)
        in_b = b->segments[j].address == ka && b->segments[j].total_size == ks;
      if (in_b) continue;
      if (!found || ka < ba || (ka == ba && ks < bs)) {
        ba = ka;
        bs = ks;
        found = 1;
      }
    }
    if (!found) break;
    w += (size_t)snprintf(o + w, cap - w, first ? "%" PRIu64 : ", %" PRIu64, ba);
    first = 0;
    last_a = ba;
    last_s = bs;
  }
  snprintf(o + w, cap - w, "]\n");
  return o;
}

Test(cli, compare_two_fixtures) {
  need_fixtures();
  char *a = fixture_path("a0kuma_adamw_small", ".pickle");
  char *b = fixture_path("jogregoire_diffusion_tiny", ".pickle");
  ms_snapshot_t *sa = NULL, *sb = NULL;
  cr_assert_eq(ms_snapshot_load(a, &sa, NULL), MS_OK);
  cr_assert_eq(ms_snapshot_load(b, &sb, NULL), MS_OK);
  char *l1 = expected_list("only_before", sa, sb), *l2 = expected_list("only_after", sb, sa);
  run_t r = RUN("compare", a, b, "--folded", "-o", "cmp.folded");
  cr_expect_eq(r.status, 0, "%s", r.err);
  char want[8192];
  snprintf(want, sizeof want, "%s%s", l1, l2);
  cr_expect_str_eq(r.out, want);
  run_free(&r);
  char p[300];
  snprintf(p, sizeof p, "%s/cmp.folded", tmpdir);
  char *got = slurp(p, NULL);
  cr_assert(got);
  /* every line is under only_before; or only_after;, the before lines first, and the bytes add
   * up to the blocks' lines of each side */
  size_t lines = 0, nb = 0;
  int seen_after = 0;
  for (char *line = got; *line;) {
    char *e = strchr(line, '\n');
    cr_assert(e);
    int is_b = strncmp(line, "only_before;stream_0;seg_", 25) == 0;
    int is_a = strncmp(line, "only_after;stream_0;seg_", 24) == 0;
    cr_expect(is_a || is_b, "bad line: %.*s", (int)(e - line), line);
    if (is_a) seen_after = 1;
    cr_expect(!(is_b && seen_after), "before line after an after line");
    nb += (size_t)is_b;
    lines++;
    line = e + 1;
  }
  cr_expect_gt(nb, 0);
  cr_expect_gt(lines, nb);
  free(got);

  /* a snapshot compared with itself: nothing differs */
  r = RUN("compare", a, a, "--folded", "-o", "-");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.err, "only_before = []\nonly_after = []\n");
  cr_expect_str_eq(r.out, "");
  run_free(&r);

  /* --stacks: merged differential lines STACK BEFORE AFTER */
  r = RUN("compare", a, b, "--stacks", "--folded", "-o", "-");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.out, "stream_0;active_allocated;"), "%.200s", r.out);
  for (char *line = r.out; *line;) {
    char *e = strchr(line, '\n');
    cr_assert(e);
    char *sp2 = e;
    while (sp2 > line && sp2[-1] != ' ') sp2--;
    char *sp1 = sp2 - 1;
    while (sp1 > line && sp1[-1] != ' ') sp1--;
    cr_expect(sp1 > line && strspn(sp1, "0123456789") == (size_t)(sp2 - 1 - sp1),
              "not a STACK BEFORE AFTER line: %.*s", (int)(e - line), line);
    line = e + 1;
  }
  run_free(&r);
  r = RUN("compare", a, b, "--stacks", "-o", "diff.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(p, sizeof p, "%s/diff.svg", tmpdir);
  got = slurp(p, NULL);
  cr_assert(got, "no diff.svg");
  cr_expect(strstr(got, "<svg"));
  free(got);
  free(l1);
  free(l2);
  ms_snapshot_free(sa);
  ms_snapshot_free(sb);
  free(a);
  free(b);
}

/* ---- memsnap's own snapshots: every state, several streams and devices, oom, repr, stats --- */

static uint32_t mk_frame(ms__snapbuild_t *b, const char *name, const char *file, int64_t line) {
  uint32_t f;
  cr_assert_eq(ms__snapbuild_frame(b, name, strlen(name), file, strlen(file), line, &f), MS_OK);
  return f;
}

static void mk_block(ms__snapbuild_t *b, ms_block_state st, uint64_t size, uint64_t req,
                     uint32_t stack) {
  ms_snap_block_t blk = {
      .size = size,
      .requested_size = req,
      .state = st,
      .state_name = ms_block_state_name(st),
      .stack = stack,
      .present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES};
  cr_assert_eq(ms__snapbuild_add_block(b, &blk), MS_OK);
}

static void mk_segment(ms__snapbuild_t *b, uint64_t addr, uint64_t stream, uint32_t first) {
  uint64_t total = 0, alloc = 0;
  for (size_t i = first; i < b->blocks.len; i++) {
    b->blocks.ptr[i].address = addr + total;
    total += b->blocks.ptr[i].size;
    if (b->blocks.ptr[i].state == MS_BLOCK_ACTIVE_ALLOCATED) alloc += b->blocks.ptr[i].size;
  }
  ms_snap_segment_t seg = {.address = addr,
                           .total_size = total,
                           .allocated_size = alloc,
                           .active_size = alloc,
                           .stream = stream,
                           .is_large = true,
                           .stack = MS_SNAP_NO_STACK,
                           .first_block = first,
                           .nblocks = (uint32_t)(b->blocks.len - first)};
  cr_assert_eq(ms__snapbuild_add_segment(b, &seg), MS_OK);
}

static void mk_trace(ms__snapbuild_t *b, ms_trace_action a, uint64_t addr, uint64_t size,
                     uint32_t stack, uint32_t present) {
  ms_snap_trace_t t = {.action = (uint8_t)a,
                       .addr = addr,
                       .size = size,
                       .stack = stack,
                       .time_us = 1700000000000000,
                       .present = (uint16_t)present};
  ms_snap_trace_extra_t x = ms__trace_extra_of(&t);
  x.user_metadata = "it's";
  cr_assert_eq(ms__snapbuild_trace_extra(b, &t, &x), MS_OK);
  cr_assert_eq(ms__snapbuild_add_trace(b, &t), MS_OK);
}

static void mk_stat(ms__snapbuild_t *b, const char *key, int64_t v) {
  ms_snap_kv_t kv = {.key = key, .kind = MS_SNAP_VAL_INT, .i = v};
  cr_assert_eq(ms__snapbuild_add_stat(b, &kv), MS_OK);
}

/* Step 1 (before=1) or step 2 of a "training run". */
static void write_step(const char *path, int before) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  uint32_t ft = mk_frame(&b, "train_step", "/src/train.c", 42);
  uint32_t fm = mk_frame(&b, "main", "/src/main.c", 7);
  uint32_t fg = mk_frame(&b, "grow", "/src/grow.c", 1);
  uint32_t s1[] = {ft, fm}, s2[] = {fg, fm}, st1, st2;
  cr_assert_eq(ms__snapbuild_stack(&b, s1, 2, &st1), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, s2, 2, &st2), MS_OK);
  mk_block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 1 << 20, 1000000, st1);
  mk_block(&b, MS_BLOCK_INACTIVE, 1 << 20, 0, MS_SNAP_NO_STACK);
  mk_segment(&b, 268435456, 0, 0);
  uint32_t first = (uint32_t)b.blocks.len;
  if (before) {
    mk_block(&b, MS_BLOCK_ACTIVE_PENDING_FREE, 2 << 20, 2 << 20, st1);
    mk_segment(&b, 536870912, 5, first);
  } else {
    mk_block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 4 << 20, 4 << 20, st2);
    mk_segment(&b, 805306368, 0, first);
  }
  /* device 0: a trace with every action kind; device 1: one alloc in snapshot segment 0 */
  ms_snap_device_t d0 = {.first_trace = (uint32_t)b.trace.len,
                         .present = MS_DEV_HAS_STATS,
                         .first_stat = (uint32_t)b.stats.len};
  mk_trace(&b, MS_TRACE_SEGMENT_ALLOC, 268435456, 2 << 20, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 268435456 + 512, 1000, st1, MS_TRACE_HAS_FRAMES);
  mk_trace(&b, MS_TRACE_FREE_REQUESTED, 268435456 + 512, 1000, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_FREE_COMPLETED, 268435456 + 512, 1000, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_SEGMENT_MAP, 805306368, 2 << 20, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_OOM, 1610612736, 8589934592ull, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_SEGMENT_FREE, 268435456, 2 << 20, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_FREE_REQUESTED, 4096, 16, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_SNAPSHOT, 0, 0, st1,
           MS_TRACE_HAS_TIME | MS_TRACE_HAS_USER_METADATA | MS_TRACE_HAS_FRAMES);
  d0.ntrace = (uint32_t)b.trace.len - d0.first_trace;
  mk_stat(&b, "allocated_bytes.all.current", 1 << 20);
  mk_stat(&b, "allocated_bytes.all.peak", 3 << 20);
  mk_stat(&b, "reserved_bytes.all.current", 4 << 20);
  mk_stat(&b, "num_ooms", 1);
  d0.nstats = (uint32_t)b.stats.len - d0.first_stat;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d0), MS_OK);
  ms_snap_device_t d1 = {.first_trace = (uint32_t)b.trace.len};
  mk_trace(&b, MS_TRACE_ALLOC, 268435456 + 4096, 512, MS_SNAP_NO_STACK, 0);
  d1.ntrace = 1;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d1), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  ms__snapbuild_release(&b);
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
}

Test(cli, memsnap_snapshot_trace_every_action) {
  char p[300];
  snprintf(p, sizeof p, "%s/step1.memsnap", tmpdir);
  write_step(p, 1);
  run_t r = RUN("trace", p);
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(
      r.out,
      "Device 0 ----------------\n"
      "9 entries\n"
      "a = cudaMalloc(268435456, 2.0MiB)\n"
      "b = a[512:1000.0B]\n"
      "del b # 1000.0B\n"
      "# free completed for b 1000.0B\n"
      "{'action': 'segment_map', 'addr': 805306368, 'size': 2097152, 'stream': 0}\n"
      "raise OutOfMemoryError # 8.0GiB requested, 1.5GiB free in CUDA\n"
      "cudaFree(a) # 2.0MiB\n"
      "del 4096 # 16.0B\n"
      "{'action': 'snapshot', 'addr': 0, 'size': 0, 'stream': 0, 'time_us': 1700000000000000, "
      "'user_metadata': \"it's\", 'frames': [{'name': 'train_step', 'filename': '/src/train.c', "
      "'line': 42}, {'name': 'main', 'filename': '/src/main.c', 'line': 7}]}\n"
      "TOTAL MEM: 0.0BDevice 1 ----------------\n"
      "1 entries\n"
      "a = seg_0[4096:512.0B]\n"
      "TOTAL MEM: 512.0B\n");
  run_free(&r);
}

Test(cli, pickle_trace_prints_the_frames_it_kept) {
  /* `trace` reads a pickle without the stacks of the entries it prints by name
   * (MS_LOAD_NO_TRACE_STACKS); the entries it prints with their frames keep them */
  char p[300], q[300];
  snprintf(p, sizeof p, "%s/step1.memsnap", tmpdir);
  snprintf(q, sizeof q, "%s/step1-trace.pickle", tmpdir);
  write_step(p, 1);
  run_t c = RUN("convert", p, q);
  cr_assert_eq(c.status, 0, "%s", c.err);
  run_free(&c);
  /* the pickle read back in full, as memsnap's format (always read whole) */
  snprintf(p, sizeof p, "%s/step1-back.memsnap", tmpdir);
  c = RUN("convert", q, p);
  cr_assert_eq(c.status, 0, "%s", c.err);
  run_free(&c);
  run_t a = RUN("trace", p), b = RUN("trace", q);
  cr_expect_eq(b.status, 0, "%s", b.err);
  cr_expect(strstr(b.out, "'frames': [{'name': 'train_step', 'filename': '/src/train.c', "
                          "'line': 42}, {'name': 'main', 'filename': '/src/main.c', 'line': 7}]}"),
            "%s", b.out);
  cr_expect_str_eq(a.out, b.out);
  run_free(&a);
  run_free(&b);
}

Test(cli, memsnap_snapshot_stats_and_summary) {
  char p[300];
  snprintf(p, sizeof p, "%s/step1.memsnap", tmpdir);
  write_step(p, 1);
  run_t r = RUN("stats", p);
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strncmp(r.out,
                    "Summary of segments >= 20.0MiB in size\nsegments: 2\n"
                    "total_reserved: 4.0MiB\ntotal_allocated: 976.6KiB\n"
                    "total_free: 3.0MiB (1.5% internal)\n\nLegend:\n",
                    107) == 0,
            "%s", r.out);
  run_t s = RUN("stats", p, "--summary");
  cr_expect_eq(s.status, 0, "%s", s.err);
  cr_expect(strncmp(s.out, r.out, r.out_len) == 0, "--summary changed the segment summary");
  cr_expect(strstr(s.out + r.out_len, "PyTorch CUDA memory summary, device ID 0"), "%s",
            s.out + r.out_len);
  cr_expect(strstr(s.out + r.out_len, "Allocated memory"), "%s", s.out + r.out_len);
  run_free(&r);
  run_free(&s);
  need_fixtures();
  char *in = fixture_path("a0kuma_adamw_small", ".pickle");
  r = RUN("stats", in, "--summary");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.out, "\nmemory_summary: this snapshot carries no allocator statistics"), "%s",
            r.out);
  /* the current values computed from the segments (checked against the pickle with Python) */
  cr_expect(strstr(r.out,
                   "\nCurrent values computed from the segments of device 0:\n"
                   "                                  all   large_pool   small_pool\n"
                   "  reserved memory            222.0MiB     220.0MiB       2.0MiB\n"
                   "  allocated memory           169.5MiB     168.8MiB     704.0KiB\n"
                   "  active memory              169.5MiB     168.8MiB     704.0KiB\n"
                   "  requested memory           169.5MiB     168.8MiB     703.1KiB\n"
                   "  non-releasable memory       12.5MiB      11.2MiB       1.3MiB\n"
                   "  segments                          7            6            1\n"
                   "  allocations                      13            6            7\n"
                   "  active allocs                    13            6            7\n"
                   "  non-releasable allocs             7            5            2\n"),
            "%s", r.out);
  run_free(&r);
  free(in);
}

Test(cli, compare_two_memsnap_snapshots) {
  char p1[300], p2[300];
  snprintf(p1, sizeof p1, "%s/step1.memsnap", tmpdir);
  snprintf(p2, sizeof p2, "%s/step2.memsnap", tmpdir);
  write_step(p1, 1);
  write_step(p2, 0);
  run_t r = RUN("compare", p1, p2, "--folded", "-o", "cmp.folded");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.out, "only_before = [536870912]\nonly_after = [805306368]\n");
  run_free(&r);
  char p[300];
  snprintf(p, sizeof p, "%s/cmp.folded", tmpdir);
  char *got = slurp(p, NULL);
  cr_assert(got);
  cr_expect_str_eq(got,
                   "only_before;stream_5;seg_536870912;active_pending_free;main.c:7:main;"
                   "train.c:42:train_step 2097152\n"
                   "only_after;stream_0;seg_805306368;active_allocated;main.c:7:main;"
                   "grow.c:1:grow 4194304\n");
  free(got);

  r = RUN("compare", p1, p2, "--stacks", "--folded", "-o", "-");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.out,
                   "stream_5;active_pending_free;main.c:7:main;train.c:42:train_step "
                   "2097152 0\n"),
            "%s", r.out);
  cr_expect(strstr(r.out, "stream_0;active_allocated;main.c:7:main;grow.c:1:grow 0 4194304\n"),
            "%s", r.out);
  cr_expect(strstr(r.out,
                   "stream_0;active_allocated;main.c:7:main;train.c:42:train_step "
                   "1000000 1000000\n"),
            "%s", r.out);
  run_free(&r);

  /* standard input as one side */
  r = RUN_STDIN(p2, "compare", p1, "-", "--folded", "-o", "cmp2.folded");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.out, "only_before = [536870912]\nonly_after = [805306368]\n");
  run_free(&r);

  r = RUN("compare", p1, p2, "--stacks", "-o", "diff.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(p, sizeof p, "%s/diff.svg", tmpdir);
  got = slurp(p, NULL);
  cr_assert(got, "no diff.svg");
  cr_expect(strstr(got, "<svg") && strstr(got, "grow.c:1:grow"), "diff.svg lacks the new frame");
  free(got);
}

/* One block of 1 MiB allocated by FN at model.py:10, called from main. */
static void write_one_block(const char *path, const char *fn) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  uint32_t fl = mk_frame(&b, fn, "/src/model.py", 10);
  uint32_t fm = mk_frame(&b, "main", "/src/main.py", 1);
  uint32_t st[] = {fl, fm}, s;
  cr_assert_eq(ms__snapbuild_stack(&b, st, 2, &s), MS_OK);
  mk_block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 1 << 20, 1 << 20, s);
  mk_segment(&b, 268435456, 0, 0);
  ms_snap_device_t d0 = {0};
  cr_assert_eq(ms__snapbuild_add_device(&b, &d0), MS_OK);
  ms_snapshot_t *snap = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &snap, &eb), MS_OK, "%s", eb.msg);
  ms__snapbuild_release(&b);
  cr_assert_eq(ms_snapshot_write_file(snap, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(snap);
}

/* issue #16 item 10: the stack diff keys a frame by name, file and line, so two functions on one
 * file:line stay two frames (one gone, one new), in the folded text and in the SVG. */
Test(cli, compare_stacks_keeps_two_functions_on_one_line_apart) {
  char p1[300], p2[300];
  snprintf(p1, sizeof p1, "%s/f.memsnap", tmpdir);
  snprintf(p2, sizeof p2, "%s/g.memsnap", tmpdir);
  write_one_block(p1, "forward");
  write_one_block(p2, "backward");
  run_t r = RUN("compare", p1, p2, "--stacks", "--folded", "-o", "-");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.out, "stream_0;active_allocated;main.py:1:main;model.py:10:backward 0 1048576\n"
                          "stream_0;active_allocated;main.py:1:main;model.py:10:forward 1048576 0\n");
  run_free(&r);
  r = RUN("compare", p1, p2, "--stacks", "-o", "fg.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char p[300];
  snprintf(p, sizeof p, "%s/fg.svg", tmpdir);
  char *svg = slurp(p, NULL);
  cr_assert(svg);
  cr_expect(strstr(svg, "<title>model.py:10:forward (before 1.0 MiB, 1,048,576 bytes; after 0 B, "
                        "0 bytes; change -1.0 MiB, -1,048,576 bytes, -100.00%; gone)</title>"),
            "%s", svg);
  cr_expect(strstr(svg, "<title>model.py:10:backward (before 0 B, 0 bytes; after 1.0 MiB, "
                        "1,048,576 bytes; change +1.0 MiB, +1,048,576 bytes; new)</title>"));
  free(svg);
}

/* The legend of an SVG file as "FILL LABEL\n" lines ("" without one). */
static char *legend_lines(const char *path) {
  char *svg = slurp(path, NULL);
  cr_assert(svg, "no %s", path);
  static char out[2048];
  size_t n = 0;
  out[0] = 0;
  const char *l = strstr(svg, "<g id=\"legend\">");
  const char *end = l ? strstr(l, "</g>\n</g>") : NULL;
  for (const char *e = l; e && (e = strstr(e, "<rect ")) && e < end;) {
    const char *f = strstr(e, "fill=\"") + 6, *fe = strchr(f, '"');
    const char *t = strstr(fe, "<text "), *ts = strchr(t, '>') + 1, *te = strstr(ts, "</text>");
    n += (size_t)snprintf(out + n, sizeof out - n, "%.*s %.*s\n", (int)(fe - f), f,
                          (int)(te - ts), ts);
    e = te;
  }
  free(svg);
  return out;
}

/* issue #16 item 10: every SVG memsnap writes whose colours mean something has a legend of the
 * colours it uses. */
Test(cli, every_view_svg_has_its_legend) {
  char p1[300], p2[300], p[300];
  snprintf(p1, sizeof p1, "%s/step1.memsnap", tmpdir);
  snprintf(p2, sizeof p2, "%s/step2.memsnap", tmpdir);
  write_step(p1, 1);
  write_step(p2, 0);
  static const struct {
    const char *argv[6];
    const char *legend;
  } cases[] = {
      {{"memory", "step1.memsnap", "-o", "memory.svg"},
       "rgb(224,82,62) allocated\nrgb(245,166,35) pending free\nrgb(110,168,222) inactive "
       "(cached)\nrgb(150,150,150) gaps (not requested)\nrgb(160,160,196) stream\n"},
      {{"segments", "step1.memsnap", "-o", "segments.svg"},
       "rgb(224,82,62) allocated\nrgb(245,166,35) pending free\nrgb(110,168,222) inactive "
       "(cached)\nrgb(150,150,150) gaps (not requested)\nrgb(160,160,196) stream\n"
       "rgb(186,186,214) segment\n"},
      {{"compare", "step1.memsnap", "step2.memsnap", "-o", "compare.svg"},
       "rgb(224,82,62) allocated\nrgb(245,166,35) pending free\nrgb(86,110,214) only before\n"
       "rgb(52,168,83) only after\nrgb(160,160,196) stream\nrgb(186,186,214) segment\n"},
      {{"compare", "step1.memsnap", "step2.memsnap", "--stacks", "-o", "stacks.svg"},
       "rgb(255,103,103) grew (deeper: more)\nrgb(46,170,72) new\nrgb(140,140,140) gone\n"
       "rgb(238,238,238) unchanged\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *const *a = cases[i].argv;
    run_t r = RUN(a[0], a[1], a[2], a[3], a[4], a[5]); /* the list ends at the first NULL */
    cr_expect_eq(r.status, 0, "%s: %s", a[0], r.err);
    run_free(&r);
    snprintf(p, sizeof p, "%s/%s", tmpdir, a[a[5] ? 5 : a[4] ? 4 : 3]);
    cr_expect_str_eq(legend_lines(p), cases[i].legend, "%s", p);
  }
}

/* ---- the progress line --------------------------------------------------------------------------
 */

/* Runs `memsnap stats -` with its standard input fed after delay_ms by a pipe, and stderr on a
 * terminal (a pty) when tty, else in a file. @return everything written to stderr (and, on the
 * pty, stdout too). */
static char *run_slow_stdin(const char *data, size_t len, int delay_ms, int tty, int *status) {
  int pfd[2];
  cr_assert_eq(pipe(pfd), 0);
  char errp[300];
  snprintf(errp, sizeof errp, "%s/.slow-stderr", tmpdir);
  int master = -1;
  pid_t pid = tty ? forkpty(&master, NULL, NULL, NULL) : fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    dup2(pfd[0], 0);
    close(pfd[0]);
    close(pfd[1]);
    if (!tty) {
      int out = open("/dev/null", O_WRONLY);
      int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, 1);
      dup2(err, 2);
    }
    execl(bin(), bin(), "stats", "-", (char *)NULL);
    _exit(127);
  }
  close(pfd[0]);
  usleep((useconds_t)delay_ms * 1000);
  cr_assert_eq(write(pfd[1], data, len), (ssize_t)len);
  close(pfd[1]);
  size_t cap = 1 << 16, n = 0;
  char *o = malloc(cap + 1);
  if (tty) {
    for (;;) { /* read the pty until the child closes it (EIO on Linux) */
      if (n == cap) o = realloc(o, (cap *= 2) + 1);
      ssize_t r = read(master, o + n, cap - n);
      if (r <= 0) break;
      n += (size_t)r;
    }
    close(master);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  o[n] = 0;
  if (!tty) {
    free(o);
    o = slurp(errp, NULL);
    unlink(errp);
  }
  return o;
}

Test(cli, progress_line_only_on_a_terminal_and_only_when_slow) {
  need_fixtures();
  char *in = fixture_path("a0kuma_adamw_small", ".pickle");
  size_t len;
  char *data = slurp(in, &len);
  int status;
  char *t = run_slow_stdin(data, len, 1600, 1, &status);
  cr_expect_eq(status, 0, "%s", t);
  /* with the bytes read so far (standard input: no total, so no percent) (#32 item 5) */
  const char *line = strstr(t, "\rmemsnap: reading '<stdin>'... ");
  cr_expect(line && strstr(line, "B, 1 s"), "no progress line: %s", t);
  cr_expect(strstr(t, "\r\033[K"), "the progress line was not erased");
  cr_expect(strstr(t, "total_reserved: 222.0MiB"), "%s", t);
  free(t);
  /* fast on a terminal: no line. "Fast" is relative to the threshold, which is raised so that a
   * loaded machine (the sanitizer run) cannot make this run slow. */
  setenv("MEMSNAP_PROGRESS_DELAY", "60", 1);
  t = run_slow_stdin(data, len, 0, 1, &status);
  unsetenv("MEMSNAP_PROGRESS_DELAY");
  cr_expect_eq(status, 0);
  cr_expect(!strstr(t, "memsnap: reading"), "progress line on a fast run: %s", t);
  free(t);
  /* slow but not a terminal: stderr stays empty */
  t = run_slow_stdin(data, len, 1600, 0, &status);
  cr_expect_eq(status, 0);
  cr_expect_str_eq(t, "");
  free(t);
  free(data);
  free(in);
}

Test(cli, hostile_frame_names_reach_the_svg_as_text) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  uint32_t f = mk_frame(&b, "</title><script>alert(1)</script>&\"'", "/x/<b>.c", 1), st;
  cr_assert_eq(ms__snapbuild_stack(&b, &f, 1, &st), MS_OK);
  mk_block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 1 << 20, 1 << 20, st);
  mk_segment(&b, 1 << 21, 0, 0);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  ms__snapbuild_release(&b);
  char p[300];
  snprintf(p, sizeof p, "%s/evil.memsnap", tmpdir);
  cr_assert_eq(ms_snapshot_write_file(s, p, NULL, NULL), MS_OK);
  ms_snapshot_free(s);
  run_t r = RUN("memory", p, "--folded", "-o", "-");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.out,
                   "stream_0;active_allocated;<b>.c:1:</title><script>alert(1)</script>&\"' "
                   "1048576\n");
  run_free(&r);
  r = RUN("memory", p, "-o", "evil.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(p, sizeof p, "%s/evil.svg", tmpdir);
  char *svg = slurp(p, NULL);
  cr_assert(svg);
  cr_expect(!strstr(svg, "<script>alert"), "the frame name became markup");
  cr_expect(strstr(svg, "&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;&amp;"),
            "the frame name is missing as text");
  free(svg);
}

/* The root frame's exact byte count in an SVG: "<title>all (..., 1,234 bytes, ...". */
static int64_t svg_root_bytes(const char *svg) {
  const char *t = strstr(svg, "<title>all (");
  if (!t) return -1;
  const char *e = strstr(t, " bytes");
  if (!e) return -1;
  const char *p = e;
  while (p > t && (p[-1] == ',' || (p[-1] >= '0' && p[-1] <= '9'))) p--;
  int64_t v = 0;
  for (; p < e; p++)
    if (*p != ',') v = v * 10 + (*p - '0');
  return v;
}

static int64_t folded_sum(const char *text) {
  int64_t sum = 0;
  for (const char *line = text; *line;) {
    const char *e = strchr(line, '\n');
    if (!e) break;
    const char *sp = e;
    while (sp > line && sp[-1] != ' ') sp--;
    sum += strtoll(sp, NULL, 10);
    line = e + 1;
  }
  return sum;
}

Test(cli, svg_root_holds_every_folded_byte) {
  need_fixtures();
  static const char *const cmds[] = {"memory", "segments"};
  /* one legacy, one newest, and one with negative <gaps> lines (parity covers every fixture) */
  static const char *const names[] = {"yiyi_flexgen_oom_legacy", "a0kuma_adamw_small",
                                      "cranberrii_ftcourse"};
  for (size_t i = 0; i < 3; i++) {
    char *in = fixture_path(names[i], ".pickle");
    for (size_t c = 0; c < 2; c++) {
      run_t f = RUN(cmds[c], in, "--folded", "-o", "-");
      run_t r = RUN(cmds[c], in, "-o", "-");
      cr_expect_eq(f.status, 0, "%s", f.err);
      cr_expect_eq(r.status, 0, "%s", r.err);
      int64_t want = folded_sum(f.out), got = svg_root_bytes(r.out);
      cr_expect_eq(got, want,
                   "%s %s: the SVG's root holds %" PRId64 " bytes, the folded text %" PRId64,
                   cmds[c], names[i], got, want);
      run_free(&f);
      run_free(&r);
    }
    free(in);
  }
}

/* ---- views read PyTorch pickles without their trace ------------------------------------------ */

Test(cli, views_same_without_the_trace_on_every_fixture) {
  /* stats, memory and segments load a pickle without its trace (MS_LOAD_NO_TRACE); the same
   * snapshot converted to memsnap's format, which is read in full, gives the same output */
  need_fixtures();
  for (size_t i = 0; i < NFIXTURES; i++) {
    char *in = fixture_path(fixture_names[i], ".pickle");
    run_t c = RUN("convert", in, "full.msgpack");
    cr_assert_eq(c.status, 0, "%s: convert: %s", fixture_names[i], c.err);
    run_free(&c);
    run_t a = RUN("stats", in), b = RUN("stats", "full.msgpack");
    cr_assert_eq(a.status, 0, "%s: %s", fixture_names[i], a.err);
    cr_assert_eq(b.status, 0, "%s: %s", fixture_names[i], b.err);
    expect_same_text(fixture_names[i], a.out, a.out_len, b.out, b.out_len);
    run_free(&a);
    run_free(&b);
    static const char *const views[] = {"memory", "segments"};
    for (int v = 0; v < 2; v++) {
      a = RUN(views[v], in, "--folded", "-o", "skip.txt");
      b = RUN(views[v], "full.msgpack", "--folded", "-o", "full.txt");
      cr_assert_eq(a.status, 0, "%s: %s", fixture_names[i], a.err);
      cr_assert_eq(b.status, 0, "%s: %s", fixture_names[i], b.err);
      char p[512];
      size_t la, lb;
      snprintf(p, sizeof p, "%s/skip.txt", tmpdir);
      char *x = slurp(p, &la);
      snprintf(p, sizeof p, "%s/full.txt", tmpdir);
      char *y = slurp(p, &lb);
      cr_assert(x && y && la > 0, "%s %s: no output", fixture_names[i], views[v]);
      expect_same_text(views[v], x, la, y, lb);
      free(x);
      free(y);
      run_free(&a);
      run_free(&b);
    }
    free(in);
  }
}

Test(cli, trace_names_the_first_segment_that_held_an_address) {
  /* `find_segment` of _memory_viz.py: the first segment_alloc'd range, in trace order, that holds
   * the address, freed or not, ranges overlapping; then the snapshot's segments; then MEM */
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  mk_block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 4096, 4096, MS_SNAP_NO_STACK);
  mk_segment(&b, 0x100000, 0, 0);
  ms_snap_device_t d = {.first_trace = 0};
  mk_trace(&b, MS_TRACE_SEGMENT_ALLOC, 0x10000, 0x1000, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_SEGMENT_FREE, 0x10000, 0x1000, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_SEGMENT_ALLOC, 0x8000, 0x10000, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_SEGMENT_ALLOC, 0x20000, 0, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x10800, 16, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x9000, 16, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x17fff, 1, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x18000, 16, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x20000, 16, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_SEGMENT_ALLOC, 0x30000, 0x100, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_SEGMENT_ALLOC, 0x2ff00, 0x400, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x30200, 16, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x30050, 16, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x2ff10, 16, MS_SNAP_NO_STACK, 0);
  mk_trace(&b, MS_TRACE_ALLOC, 0x100010, 16, MS_SNAP_NO_STACK, 0);
  d.ntrace = (uint32_t)b.trace.len;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  char p[300];
  snprintf(p, sizeof p, "%s/overlap.memsnap", tmpdir);
  cr_assert_eq(ms_snapshot_write_file(s, p, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  run_t r = RUN("trace", p);
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.out,
                   "Device 0 ----------------\n"
                   "15 entries\n"
                   "a = cudaMalloc(65536, 4.0KiB)\n"
                   "cudaFree(a) # 4.0KiB\n"
                   "b = cudaMalloc(32768, 64.0KiB)\n"
                   "c = cudaMalloc(131072, 0.0B)\n"
                   "d = a[2048:16.0B]\n"
                   "e = b[4096:16.0B]\n"
                   "f = b[65535:1.0B]\n"
                   "g = MEM[98304:16.0B]\n"
                   "h = MEM[131072:16.0B]\n"
                   "i = cudaMalloc(196608, 256.0B)\n"
                   "j = cudaMalloc(196352, 1.0KiB)\n"
                   "k = j[768:16.0B]\n"
                   "l = i[80:16.0B]\n"
                   "m = j[16:16.0B]\n"
                   "n = seg_0[16:16.0B]\n"
                   "TOTAL MEM: 129.0B\n");
  run_free(&r);
}
