/* SPDX-License-Identifier: MIT
 * Tests for a viewer page of several files (ms_viewer_write_html_files, `memsnap view A B ...`,
 * `memsnap view DIR`; docs/view.md, "Several files"): the names in ms-files, each file's data
 * elements in order with the viewer's script once, the first file's before it; the errors (no
 * file, a device the first file lacks, named by file); a page of one file has no file list; the
 * command's directory listing (snapshot names only, by name), its default output names and its
 * errors. tests/browser/features.sh runs such pages in Chromium.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/pickle.h"
#include "memsnap/view.h"
#include "model/snapbuild.h"

/* One segment [addr, +8 KiB) with a 512-byte block alive at the end; its trace reserves it and
 * allocates the block. */
static ms_snapshot_t *small(uint64_t addr) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  uint32_t fr, st;
  cr_assert_eq(ms__snapbuild_frame(&b, "step", 4, "train.py", 8, 3, &fr), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, &fr, 1, &st), MS_OK);
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = addr;
  g.total_size = 8192;
  g.stack = st;
  ms_snap_block_t bl;
  memset(&bl, 0, sizeof bl);
  bl.address = addr;
  bl.size = bl.requested_size = 512;
  bl.state = MS_BLOCK_ACTIVE_ALLOCATED;
  bl.state_name = "active_allocated";
  bl.stack = st;
  bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
  cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
  bl.address = addr + 512;
  bl.size = 8192 - 512;
  bl.requested_size = 0;
  bl.state = MS_BLOCK_INACTIVE;
  bl.state_name = "inactive";
  bl.stack = MS_SNAP_NO_STACK;
  cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
  g.nblocks = 2;
  cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  ms_snap_trace_t t;
  memset(&t, 0, sizeof t);
  t.action = MS_TRACE_SEGMENT_ALLOC;
  t.addr = addr;
  t.size = 8192;
  t.stack = st;
  t.present = MS_TRACE_HAS_FRAMES;
  cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  t.action = MS_TRACE_ALLOC;
  t.size = 512;
  cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = 2;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

static char *page_of_files(const ms_viewer_file_t *f, size_t n, const ms_viewer_opts_t *o,
                           int want, const char *msg) {
  ms_sink_t sink;
  th_memsink_t m;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  int rc = ms_viewer_write_html_files(f, n, o, &sink, &eb);
  cr_assert_eq(rc, want, "%s", eb.msg);
  if (msg) cr_assert_str_eq(eb.msg, msg);
  char *out = strndup(m.data ? m.data : "", m.len);
  th_memsink_free(&m);
  return out;
}

/* the ids of the page's script elements, in order, and how many have no id (the script) */
static void ids(const char *page, char *out, size_t cap, int *scripts) {
  out[0] = 0;
  *scripts = 0;
  for (const char *p = page; (p = strstr(p, "<script")) != NULL; p++) {
    const char *id = strstr(p, " id=\""), *end = strchr(p, '>');
    if (!id || id > end) {
      (*scripts)++;
      continue;
    }
    id += 5;
    size_t l = strlen(out);
    snprintf(out + l, cap - l, "%s%.*s", l ? " " : "", (int)(strchr(id, '"') - id), id);
  }
}

TestSuite(view_files, .timeout = 60);

Test(view_files, elements_of_each_file) {
  ms_snapshot_t *a = small(0x100000), *b = small(0x200000), *c = small(0x300000);
  ms_viewer_file_t f[] = {{a, "rank0.pickle"}, {b, "rank1 <b>.pickle"}, {c, "rank2.pickle"}};
  char *page = page_of_files(f, 3, NULL, MS_OK, NULL);
  char got[512];
  int scripts;
  ids(page, got, sizeof got, &scripts);
  cr_assert_str_eq(got, "ms-bin ms-data ms-files ms-trace ms-trace-data ms-bin-1 ms-data-1 "
                        "ms-trace-1 ms-trace-data-1 ms-bin-2 ms-data-2 ms-trace-2 ms-trace-data-2");
  cr_assert_eq(scripts, 1, "the viewer's script once");
  cr_assert(strstr(page, "id=\"ms-files\">[\"rank0.pickle\",\"rank1 \\u003cb\\u003e.pickle\","
                         "\"rank2.pickle\"]</script>"), "the names, escaped");
  cr_assert(strstr(page, "<title>memsnap view: rank0.pickle</title>"));
  cr_assert(strstr(page, "\"title\":\"rank1 \\u003cb\\u003e.pickle\""), "each file's own title");
  size_t len = strlen(page);
  cr_assert(len > 16 && strcmp(page + len - 16, "</body>\n</html>\n") == 0);
  free(page);
  /* a page title of its own */
  ms_viewer_opts_t o;
  ms_viewer_opts_init(&o);
  o.title = "job 7";
  page = page_of_files(f, 2, &o, MS_OK, NULL);
  cr_assert(strstr(page, "<title>memsnap view: job 7</title>"));
  ids(page, got, sizeof got, &scripts);
  cr_assert_str_eq(got, "ms-bin ms-data ms-files ms-trace ms-trace-data ms-bin-1 ms-data-1 "
                        "ms-trace-1 ms-trace-data-1");
  free(page);
  /* a page of one file has no file list */
  ms_sink_t sink;
  th_memsink_t m;
  th_memsink_init(&sink, &m);
  cr_assert_eq(ms_viewer_write_html(a, NULL, &sink, NULL), MS_OK);
  page = strndup(m.data, m.len);
  th_memsink_free(&m);
  ids(page, got, sizeof got, &scripts);
  cr_assert_str_eq(got, "ms-bin ms-data ms-trace ms-trace-data");
  free(page);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  ms_snapshot_free(c);
}

Test(view_files, errors) {
  ms_snapshot_t *a = small(0x100000);
  ms_viewer_file_t f[] = {{a, "rank0.pickle"}, {a, "rank1.pickle"}};
  free(page_of_files(f, 0, NULL, MS_EINVAL, "no file to write a page of"));
  free(page_of_files(NULL, 2, NULL, MS_EINVAL, "no file to write a page of"));
  ms_viewer_opts_t o;
  ms_viewer_opts_init(&o);
  o.device = 5;
  char *page = page_of_files(f, 2, &o, MS_EINVAL, "'rank0.pickle': device 5 has no trace and no segments");
  cr_assert_str_eq(page, "", "nothing written");
  free(page);
  /* a file with no device to show, past the first: named, nothing written */
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  ms_snapshot_t *none = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &none, &eb), MS_OK, "%s", eb.msg);
  ms_viewer_file_t g[] = {{a, "rank0.pickle"}, {none, "empty.pickle"}};
  page = page_of_files(g, 2, NULL, MS_EINVAL, "'empty.pickle': no device has a trace or segments: nothing to show");
  cr_assert_str_eq(page, "", "nothing written");
  free(page);
  ms_snapshot_free(none);
  ms_snapshot_free(a);
}

/* ---- the command ----------------------------------------------------------------------------- */

static char dir[256];
static void setup(void) {
  char *d = th_tmpdir();
  snprintf(dir, sizeof dir, "%s", d);
  free(d);
}
static void teardown(void) {
  char p[512];
  snprintf(p, sizeof p, "rm -rf '%s'", dir);
  cr_assert_eq(system(p), 0);
}

/* memsnap ARGS in dir; stderr into dir/.stderr. @return the exit status. */
static int run(const char *const *args) {
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) bin = MS_TEST_BINARY_DIR "/bin/memsnap";
  const char *argv[16];
  int n = 0;
  argv[n++] = bin;
  for (; args[n - 1] && n < 15; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    char errp[300];
    snprintf(errp, sizeof errp, "%s/.stderr", dir);
    int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int out = open("/dev/null", O_WRONLY);
    if (err < 0 || out < 0 || chdir(dir) != 0) _exit(126);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}
#define RUN(...) run((const char *const[]){__VA_ARGS__, NULL})

static char *slurp(const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  size_t len = 0;
  char *b = th_read_file(p, &len);
  if (!b) return NULL;
  char *t = strndup(b, len);
  free(b);
  return t;
}

static void write_pickle(const char *name, uint64_t addr) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  ms_snapshot_t *s = small(addr);
  cr_assert_eq(ms_pickle_write_file(s, p, NULL), MS_OK);
  ms_snapshot_free(s);
}

TestSuite(view_files_cli, .init = setup, .fini = teardown, .timeout = 120);

Test(view_files_cli, files_and_directories) {
  write_pickle("b.pickle", 0x100000);
  write_pickle("a.pickle", 0x200000);
  /* several files: files.view.html, in the order given */
  cr_assert_eq(RUN("view", "b.pickle", "a.pickle"), 0);
  char *page = slurp("files.view.html");
  cr_assert_not_null(page);
  cr_assert(strstr(page, "id=\"ms-files\">[\"b.pickle\",\"a.pickle\"]"));
  free(page);
  /* a directory: its snapshot files by name, DIR.view.html; other files are left out */
  char p[512];
  snprintf(p, sizeof p, "%s/ranks", dir);
  cr_assert_eq(mkdir(p, 0755), 0);
  write_pickle("ranks/rank1.pickle", 0x100000);
  write_pickle("ranks/rank0.msnap.pickle", 0x200000);
  snprintf(p, sizeof p, "%s/ranks/notes.txt", dir);
  cr_assert_eq(th_write_file(p, "x", 1), 0);
  snprintf(p, sizeof p, "%s/ranks/.hidden.pickle", dir);
  cr_assert_eq(th_write_file(p, "x", 1), 0);
  cr_assert_eq(RUN("view", "ranks/"), 0);
  page = slurp("ranks.view.html");
  cr_assert_not_null(page);
  cr_assert(strstr(page, "id=\"ms-files\">[\"rank0.msnap.pickle\",\"rank1.pickle\"]"));
  free(page);
  cr_assert_eq(RUN("view", "ranks", "-o", "r.html", "--view", "files"), 0);
  page = slurp("r.html");
  cr_assert(page && strstr(page, "\"view\":\"files\""));
  free(page);
}

Test(view_files_cli, errors) {
  write_pickle("a.pickle", 0x100000);
  char p[512];
  snprintf(p, sizeof p, "%s/empty", dir);
  cr_assert_eq(mkdir(p, 0755), 0);
  cr_assert_eq(RUN("view", "empty"), 1);
  char *e = slurp(".stderr");
  cr_assert_str_eq(e, "memsnap: error: no snapshot file (.pickle, .pkl, .msnap, .msgpack, "
                      ".memsnap) in directory 'empty'\n");
  free(e);
  cr_assert_eq(RUN("view", "a.pickle", "-"), 2);
  e = slurp(".stderr");
  cr_assert(strstr(e, "standard input ('-') is one file alone, not one of several"), "%s", e);
  free(e);
  cr_assert_eq(RUN("view", "a.pickle", "missing.pickle"), 1);
  e = slurp(".stderr");
  cr_assert(strstr(e, "missing.pickle"), "%s", e);
  free(e);
  cr_assert(!slurp("files.view.html"), "no page when a file cannot be read");
  cr_assert_eq(RUN("view", "a.pickle", "a.pickle", "--view", "nope"), 2);
  e = slurp(".stderr");
  cr_assert(strstr(e, "unknown view 'nope' (timeline, pools, segments, history, settings, flame, "
                      "explain, memory, diff, files)"), "%s", e);
  free(e);
}
