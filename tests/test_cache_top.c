/* SPDX-License-Identifier: MIT
 * Tests of the answers of `memsnap top`, `timeline` and `explain` in the snapshot cache
 * (cli/answers.c, docs/performance.md):
 *  - the first top, timeline or explain of a file stores its answer (a blob entry beside the
 * snapshot's entry and its time index; not timeline's --range, which reads a window, nor its viewer
 *    data), a second one with the same options prints exactly what --no-cache prints, from
 *    that entry and nothing else (a forged answer filed under the same key, tag and description
 *    comes out as it is), touching it in place;
 *  - an entry truncated at any offset or with a byte flipped is rebuilt (the same answer, and the
 *    same entry again), never trusted; an entry whose description is another question's is a
 *    miss; other options, another --categories text (same size, same name) are other answers;
 *  - standard input, --no-cache and MEMSNAP_CACHE=0 store no answer; a failed top stores none;
 *  - memory's and segments' outputs (-o) are stored and written again the same way;
 *  - another file written under the same name is another answer (the key is the content), and
 *    the same bytes under another name another timeline answer (its JSON names the file);
 *  - compare's report is stored under AFTER's key with BEFORE's content in its question, and
 *    given again with its warnings (stderr) where they were printed;
 *  - a stored body whose message section is not of the form written is a miss.
 * Every test uses its own cache directory under a fresh temporary folder (never the user's).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/cache.h"
#include "memsnap/serialize.h"

TestSuite(cache_top, .init = th_cache_setup, .fini = th_cache_teardown, .timeout = 600);

static bool fixture(const char *name, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", th_fixture_dir(), name);
  if (access(path, R_OK) == 0) return true;
  cr_log_info("SKIP: no PyTorch fixtures in %s", th_fixture_dir());
  printf("SKIP: no PyTorch fixtures in %s\n", th_fixture_dir());
  return false;
}

static const char *bin(void) {
  const char *b = getenv("MEMSNAP_BIN");
  return b && *b ? b : MS_TEST_BINARY_DIR "/bin/memsnap";
}

/* Runs memsnap in th_cache_tmp with args (NULL-terminated), stdout and stderr into one buffer (stdin from
 * stdin_path when given). @return the exit status. */
static int run_in(char **out, size_t *len, const char *const *args, const char *env,
                  const char *stdin_path) {
  char cmd[8192];
  size_t k = (size_t)snprintf(cmd, sizeof cmd, "cd '%s' && %s '%s'", th_cache_tmp, env ? env : "", bin());
  for (; *args; args++) k += (size_t)snprintf(cmd + k, sizeof cmd - k, " '%s'", *args);
  if (stdin_path) k += (size_t)snprintf(cmd + k, sizeof cmd - k, " <'%s'", stdin_path);
  snprintf(cmd + k, sizeof cmd - k, " >'%s/.out' 2>&1", th_cache_tmp);
  int st = system(cmd);
  char p[700];
  snprintf(p, sizeof p, "%s/.out", th_cache_tmp);
  *out = th_read_file(p, len);
  cr_assert(*out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int run(char **out, size_t *len, const char *const *args) {
  return run_in(out, len, args, NULL, NULL);
}

/* The number of answers in the cache (blob entries of top's load flags), and the path of the last
 * one seen. */
static int answers(char *path, size_t cap) {
  char part[32];
  snprintf(part, sizeof part, "-f%x-v%u-p", MS_LOAD_NO_FREE_STACKS, MS_CACHE_VERSION);
  DIR *d = opendir(th_cache_dir());
  if (!d) return 0;
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || !strstr(e->d_name, part)) continue;
    if (path) snprintf(path, cap, "%s/%s", th_cache_dir(), e->d_name);
    n++;
  }
  closedir(d);
  return n;
}

/* Runs args with --no-cache appended: the answer every cached run must give. */
static int run_plain(char **out, size_t *len, const char *const *args) {
  const char *a[24];
  size_t n = 0;
  while (args[n]) {
    a[n] = args[n];
    n++;
  }
  a[n++] = "--no-cache";
  a[n] = NULL;
  return run(out, len, a);
}

static void assert_same(const char *what, const char *a, size_t la, const char *b, size_t lb) {
  cr_assert(la == lb && memcmp(a, b, la) == 0, "%s: the answers differ:\n%.*s\n---\n%.*s", what,
            (int)la, a, (int)lb, b);
}

Test(cache_top, stored_then_served_for_each_question) {
  static const char *const fx[] = {"a0kuma_adamw_small.pickle", "maphsge_select_n_4dev.pickle"};
  static const char *const qs[][10] = {
      {"top", "FILE"},
      {"top", "FILE", "--by", "category", "--json"},
      {"top", "FILE", "--by", "stack", "-n", "3"},
      {"top", "FILE", "--at", "end", "--by", "frame", "-n", "0"},
      {"top", "FILE", "--by", "size", "--json", "--at", "peak-reserved"},
      {"top", "FILE", "--device", "1", "--by", "file"},
      {"timeline", "FILE"},
      {"timeline", "FILE", "--json"},
      {"timeline", "FILE", "--steps", "--json"},
      {"timeline", "FILE", "--by", "category"},
      {"timeline", "FILE", "--device", "1", "--json"},
      {"explain", "FILE"},
      {"explain", "FILE", "--json", "--no-replay"},
      {"explain", "FILE", "--at", "end", "-n", "3", "--no-min-capacity"},
      {"explain", "FILE", "--device", "1", "--capacity", "1GiB"},
      /* not stored: --range reads a window of the trace, never through the cache; the viewer's
       * data is not an answer that is kept */
      {"timeline", "FILE", "--range", "0:10"},
      {"timeline", "FILE", "--viewer-data"},
  };
  for (size_t f = 0; f < sizeof fx / sizeof *fx; f++) {
    char p[700];
    if (!fixture(fx[f], p, sizeof p)) return;
    cr_assert_eq(ms_cache_clear(NULL, NULL), MS_OK);
    for (size_t i = 0; i < sizeof qs / sizeof *qs; i++) {
      const char *argv[12];
      size_t n = 0;
      for (; qs[i][n]; n++) argv[n] = strcmp(qs[i][n], "FILE") == 0 ? p : qs[i][n];
      argv[n] = NULL;
      char *plain, *first, *second;
      size_t lp, l1, l2;
      int sp = run_plain(&plain, &lp, argv);
      int before = answers(NULL, 0);
      int s1 = run(&first, &l1, argv);
      char entry[1200];
      struct stat e1, e2;
      int stored = answers(entry, sizeof entry);
      cr_assert(stored == 0 || stat(entry, &e1) == 0);
      int s2 = run(&second, &l2, argv);
      cr_assert(stored == 0 || (stat(entry, &e2) == 0 && e1.st_ino == e2.st_ino),
                "%s %zu: the second run rewrote the answer", fx[f], i);
      cr_assert(sp == s1 && s1 == s2, "%s %zu: status %d %d %d", fx[f], i, sp, s1, s2);
      assert_same(fx[f], plain, lp, first, l1);
      assert_same(fx[f], plain, lp, second, l2);
      /* an answer stored per question, but a failed one (no device 1 on a one-device file) */
      bool kept = sp == 0 && strcmp(argv[n - 1], "0:10") != 0 && strcmp(argv[n - 1], "--viewer-data") != 0;
      cr_assert_eq(stored, before + kept, "%s %zu: %d answers after %d", fx[f], i, stored,
                   before);
      cr_assert_eq(answers(NULL, 0), stored);
      free(plain);
      free(first);
      free(second);
    }
  }
}

/* The stored entry's description (its body up to the NUL). */
static char *entry_desc(const char *path, size_t *dlen) {
  size_t len;
  char *e = th_read_file(path, &len);
  cr_assert(e && len > 64);
  char *nul = memchr(e + 64, 0, len - 64);
  cr_assert(nul);
  *dlen = (size_t)(nul - (e + 64));
  char *d = malloc(*dlen + 1);
  memcpy(d, e + 64, *dlen + 1);
  free(e);
  return d;
}

Test(cache_top, served_from_the_entry_alone_and_rebuilt_when_damaged) {
  char p[700], entry[1200];
  if (!fixture("a0kuma_adamw_small.pickle", p, sizeof p)) return;
  const char *args[] = {"top", p, "--by", "stack", NULL};
  char *plain, *out;
  size_t lp, lo;
  cr_assert_eq(run_plain(&plain, &lp, args), 0);
  cr_assert_eq(run(&out, &lo, args), 0);
  free(out);
  cr_assert_eq(answers(entry, sizeof entry), 1);
  /* the tag from the entry's own name: the test directory's random name may hold "-p" too */
  unsigned long long tag = strtoull(strstr(strrchr(entry, '/'), "-p") + 2, NULL, 16);
  ms_cache_key_t key = {0, 0, MS_LOAD_NO_FREE_STACKS};
  cr_assert_eq(ms_cache_hash_file(p, &key.hash, &key.size), MS_OK);
  size_t dlen;
  char *desc = entry_desc(entry, &dlen);
  /* the stored answer is what a second top prints: another one filed under its key, tag and
   * description comes out as it is, its messages (stderr, here with stdout) where they stand */
  static const struct {
    const char *stored, *printed; /* after the description's NUL; NULL: a miss */
  } forged[] = {
      {"0\nan answer of the cache\n", "an answer of the cache\n"},
      {"0\n", ""},
      {"10\n0 6\nfirst\nabc", "first\nabc"},
      {"21\n0 3\nw1\n2 3\nw2\n3 3\nw3\nabcd", "w1\nabw2\ncw3\nd"},
      {"6\n4 2\nw\nabcd", "abcdw\n"},
      /* not of the form stored: a miss, answered and stored anew */
      {"an answer of the cache\n", NULL},
      {"", NULL},
      {"5\nabc", NULL},                   /* the section runs past the body */
      {"6\n5 2\nw\nabcd", NULL},          /* a message past the answer's end */
      {"12\n2 2\nw\n1 2\nv\nabcd", NULL}, /* offsets out of order */
      {"6\n0 9\nw\nabcd", NULL},          /* a line longer than the section */
      {"6\n0 2 w\nabcd", NULL},
      {"1234567890123456\nab", NULL},
  };
  for (size_t k = 0; k < sizeof forged / sizeof *forged; k++) {
    size_t fl = strlen(forged[k].stored);
    char *body = malloc(dlen + 1 + fl);
    memcpy(body, desc, dlen + 1);
    memcpy(body + dlen + 1, forged[k].stored, fl);
    cr_assert_eq(ms_cache_blob_put(&key, tag, NULL, body, dlen + 1 + fl), MS_OK);
    cr_assert_eq(run(&out, &lo, args), 0);
    if (forged[k].printed)
      assert_same("forged", forged[k].printed, strlen(forged[k].printed), out, lo);
    else
      assert_same("not of the stored form", plain, lp, out, lo);
    free(out);
    free(body);
  }
  /* the same tag with another question's description: a miss, answered and stored anew */
  char *body = malloc(dlen + 3);
  memcpy(body, desc, dlen + 1);
  memcpy(body + dlen + 1, "0\n", 2);
  body[0] ^= 1;
  cr_assert_eq(ms_cache_blob_put(&key, tag, NULL, body, dlen + 3), MS_OK);
  cr_assert_eq(run(&out, &lo, args), 0);
  assert_same("another description", plain, lp, out, lo);
  free(out);
  free(body);
  free(desc);
  size_t len;
  char *e = th_read_file(entry, &len);
  cr_assert(e);
  /* truncated at every offset, or one byte flipped anywhere: rebuilt, the same entry again */
  for (size_t cut = 0; cut <= len; cut += (cut < 80 ? 1 : len / 7 + 1)) {
    bool flip = cut < len && cut % 2 == 1;
    if (flip) e[cut] ^= 0x10;
    cr_assert_eq(th_write_file(entry, e, flip ? len : cut), 0);
    cr_assert_eq(run(&out, &lo, args), 0);
    assert_same("damaged", plain, lp, out, lo);
    free(out);
    if (flip) e[cut] ^= 0x10;
    size_t la;
    char *again = th_read_file(entry, &la);
    cr_assert(again && la == len && memcmp(again, e, len) == 0, "not rebuilt after %zu", cut);
    free(again);
  }
  free(e);
  free(plain);
}

Test(cache_top, rules_text_is_part_of_the_question) {
  char p[700], rules[700];
  if (!fixture("a0kuma_adamw_small.pickle", p, sizeof p)) return;
  snprintf(rules, sizeof rules, "%s/my.rules", th_cache_tmp);
  const char *args[] = {"top", p, "--by", "category", "--categories", rules, NULL};
  /* two texts of the same size under the same name, stored a second apart at most */
  const char *texts[] = {"defaults none\nparameter\n", "defaults none\ntemporary\n"};
  cr_assert_eq(strlen(texts[0]), strlen(texts[1]));
  char *first = NULL;
  size_t lfirst = 0;
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(th_write_file(rules, texts[k], strlen(texts[k])), 0);
    char *plain, *out;
    size_t lp, lo;
    cr_assert_eq(run_plain(&plain, &lp, args), 0, "%.*s", (int)lp, plain);
    cr_assert_eq(run(&out, &lo, args), 0);
    assert_same("first", plain, lp, out, lo);
    free(out);
    cr_assert_eq(run(&out, &lo, args), 0);
    assert_same("second", plain, lp, out, lo);
    free(out);
    cr_assert_eq(answers(NULL, 0), k + 1);
    if (k == 1) cr_assert(lfirst != lp || memcmp(first, plain, lp) != 0, "the rules changed nothing");
    free(first);
    first = plain;
    lfirst = lp;
  }
  free(first);
  /* a rules file that cannot be read: the same error with the cache as without, nothing stored */
  char *plain, *out;
  size_t lp, lo;
  cr_assert_eq(unlink(rules), 0);
  cr_assert_eq(run_plain(&plain, &lp, args), 1);
  cr_assert_eq(run(&out, &lo, args), 1);
  assert_same("unreadable rules", plain, lp, out, lo);
  cr_assert_eq(answers(NULL, 0), 2);
  free(plain);
  free(out);
}

Test(cache_top, nothing_stored_from_stdin_or_with_the_cache_off) {
  char p[700];
  if (!fixture("a0kuma_adamw_small.pickle", p, sizeof p)) return;
  char *plain, *out;
  size_t lp, lo;
  cr_assert_eq(run_plain(&plain, &lp, (const char *const[]){"top", p, NULL}), 0);
  cr_assert_eq(run_in(&out, &lo, (const char *const[]){"top", "-", NULL}, NULL, p), 0);
  assert_same("stdin", plain, lp, out, lo);
  free(out);
  cr_assert_eq(run_in(&out, &lo, (const char *const[]){"top", p, NULL}, "MEMSNAP_CACHE=0", NULL),
               0);
  assert_same("MEMSNAP_CACHE=0", plain, lp, out, lo);
  free(out);
  size_t n = 0;
  uint64_t bytes = 0;
  cr_assert_eq(ms_cache_usage(NULL, &n, &bytes), MS_OK);
  cr_assert_eq(n, 0, "%zu entries", n);
  free(plain);
}

Test(cache_top, another_file_under_the_same_name_gets_its_own_answer) {
  char a[700], b[700], x[700];
  if (!fixture("a0kuma_adamw_small.pickle", a, sizeof a) ||
      !fixture("jogregoire_diffusion_tiny.pickle", b, sizeof b))
    return;
  snprintf(x, sizeof x, "%s/x.pickle", th_cache_tmp);
  const char *args[] = {"top", x, "--by", "source", NULL};
  const char *src[] = {a, b, a};
  for (int k = 0; k < 3; k++) {
    size_t len, lp, lo;
    char *bytes = th_read_file(src[k], &len);
    cr_assert(bytes);
    cr_assert_eq(th_write_file(x, bytes, len), 0);
    free(bytes);
    char *plain, *out;
    cr_assert_eq(run_plain(&plain, &lp, args), 0);
    cr_assert_eq(run(&out, &lo, args), 0);
    assert_same(src[k], plain, lp, out, lo);
    cr_assert_eq(answers(NULL, 0), k < 2 ? k + 1 : 2, "the answers of %d files", k + 1);
    free(plain);
    free(out);
  }
  /* timeline's JSON names the file: the same bytes under another name are another answer */
  char y[700];
  snprintf(y, sizeof y, "%s/y.pickle", th_cache_tmp);
  size_t len;
  char *bytes = th_read_file(x, &len);
  cr_assert(bytes);
  cr_assert_eq(th_write_file(y, bytes, len), 0);
  free(bytes);
  const char *names[] = {x, y, x};
  for (int k = 0; k < 3; k++) {
    const char *targs[] = {"timeline", names[k], "--json", NULL};
    char *plain, *out;
    size_t lp, lo;
    cr_assert_eq(run_plain(&plain, &lp, targs), 0);
    cr_assert(strstr(plain, names[k]), "%s", plain);
    cr_assert_eq(run(&out, &lo, targs), 0);
    assert_same(names[k], plain, lp, out, lo);
    cr_assert_eq(answers(NULL, 0), k < 2 ? 3 + k : 4, "the answers after %s", names[k]);
    free(plain);
    free(out);
  }
}

/* compare's report is an answer too, filed under AFTER's key with BEFORE's content in its
 * description: served the same, warnings included (a side without a trace); another BEFORE (the
 * same name, other bytes) is another answer; BEFORE on standard input stores none. */
Test(cache_top, compare_reports_are_answers) {
  char a[700], b[700], c[700], x[700];
  if (!fixture("a0kuma_adamw_small.pickle", a, sizeof a) ||
      !fixture("jogregoire_diffusion_tiny.pickle", b, sizeof b) ||
      !fixture("maphsge_select_n_4dev.pickle", c, sizeof c))
    return;
  snprintf(x, sizeof x, "%s/x.pickle", th_cache_tmp);
  static const char *const qs[][10] = {
      {"compare", "A", "C"},
      {"compare", "A", "C", "--json"},
      {"compare", "A", "B"}, /* B has no trace: a warning on stderr, given again */
      {"compare", "A", "--at", "10", "--at", "end"},
      {"compare", "C", "A", "--device", "0", "-n", "2"},
      {"compare", "C", "A", "--device", "0", "-n", "2", "--json"},
      {"compare", "X", "A"},
  };
  const char *srcs[] = {b, c}; /* X's bytes, one after the other */
  int stored = 0;
  for (int round = 0; round < 2; round++) {
    size_t len;
    char *bytes = th_read_file(srcs[round], &len);
    cr_assert(bytes);
    cr_assert_eq(th_write_file(x, bytes, len), 0);
    free(bytes);
    for (size_t i = 0; i < sizeof qs / sizeof *qs; i++) {
      if (round == 1 && strcmp(qs[i][1], "X") != 0) continue;
      const char *argv[12];
      size_t n = 0;
      for (; qs[i][n]; n++)
        argv[n] = strcmp(qs[i][n], "A") == 0   ? a
                  : strcmp(qs[i][n], "B") == 0 ? b
                  : strcmp(qs[i][n], "C") == 0 ? c
                  : strcmp(qs[i][n], "X") == 0 ? x
                                               : qs[i][n];
      argv[n] = NULL;
      char *plain, *first, *second;
      size_t lp, l1, l2;
      cr_assert_eq(run_plain(&plain, &lp, argv), 0, "%zu: %.*s", i, (int)lp, plain);
      cr_assert_eq(run(&first, &l1, argv), 0);
      cr_assert_eq(answers(NULL, 0), ++stored, "%d %zu: %d answers", round, i, answers(NULL, 0));
      cr_assert_eq(run(&second, &l2, argv), 0);
      cr_assert_eq(answers(NULL, 0), stored);
      assert_same("first", plain, lp, first, l1);
      assert_same("second", plain, lp, second, l2);
      if (i == 2) cr_assert(strstr(second, "memsnap: warning: "), "%s", second);
      free(plain);
      free(first);
      free(second);
    }
  }
  /* BEFORE from standard input: the same report, nothing stored */
  char *plain, *out;
  size_t lp, lo;
  cr_assert_eq(
      run_in(&plain, &lp, (const char *const[]){"compare", "-", c, "--no-cache", NULL}, NULL, a),
      0);
  cr_assert_eq(run_in(&out, &lo, (const char *const[]){"compare", "-", c, NULL}, NULL, a), 0);
  assert_same("stdin", plain, lp, out, lo);
  cr_assert_eq(answers(NULL, 0), stored);
  free(plain);
  free(out);
}

/* The answers of every load flags (f0, view's pages, left out). */
static int file_answers(void) {
  char part[32];
  snprintf(part, sizeof part, "-v%u-p", MS_CACHE_VERSION);
  DIR *d = opendir(th_cache_dir());
  if (!d) return 0;
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.' && strstr(e->d_name, part) && !strstr(e->d_name, "-f0-")) n++;
  closedir(d);
  return n;
}

Test(cache_top, memory_and_segments_outputs_stored_and_written_again) {
  char p[700];
  if (!fixture("maphsge_select_n_4dev.pickle", p, sizeof p)) return;
  static const char *const qs[][10] = {
      {"memory", "FILE", "--at", "peak"},
      {"memory", "FILE"},
      {"memory", "FILE", "--at", "end", "--json"},
      {"memory", "FILE", "--by", "category", "--folded"},
      {"segments", "FILE", "--at", "peak-reserved", "--device", "0", "--title", "t <&>"},
      {"segments", "FILE", "--folded", "--width", "900"},
      /* not stored: a window of the trace, never through the cache */
      {"memory", "FILE", "--at", "peak", "--range", "0:5"},
  };
  for (size_t i = 0; i < sizeof qs / sizeof *qs; i++) {
    char outs[3][800];
    for (int k = 0; k < 3; k++) snprintf(outs[k], sizeof outs[k], "%s/out%d", th_cache_tmp, k);
    int before = file_answers(), st[3];
    for (int k = 0; k < 3; k++) {
      const char *argv[16];
      size_t n = 0;
      for (; qs[i][n]; n++) argv[n] = strcmp(qs[i][n], "FILE") == 0 ? p : qs[i][n];
      argv[n++] = "-o";
      argv[n++] = outs[k];
      if (k == 0) argv[n++] = "--no-cache";
      argv[n] = NULL;
      char *msg;
      size_t lm;
      st[k] = run(&msg, &lm, argv);
      cr_assert(strstr(msg, "wrote"), "%zu/%d: %.*s", i, k, (int)lm, msg);
      free(msg);
      if (k == 1) /* stored by the first cached run, unless it read a window */
        cr_assert_eq(file_answers(), before + (i + 1 < sizeof qs / sizeof *qs), "question %zu", i);
    }
    cr_assert(st[0] == 0 && st[1] == 0 && st[2] == 0, "question %zu", i);
    size_t l0, l1, l2;
    char *o0 = th_read_file(outs[0], &l0), *o1 = th_read_file(outs[1], &l1),
         *o2 = th_read_file(outs[2], &l2);
    cr_assert(o0 && o1 && o2 && l0 > 0);
    assert_same("first", o0, l0, o1, l1);
    assert_same("second", o0, l0, o2, l2);
    free(o0);
    free(o1);
    free(o2);
  }
}
