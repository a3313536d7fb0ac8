/* SPDX-License-Identifier: MIT
 * The classifier on a snapshot whose trace stacks were left for later (MS_LOAD_DEFER_STACKS,
 * lib/attribution/stacks.c's attr_stacks_deferred): it reads those allocations' frames from the
 * file again without interning their stacks, and answers as on a snapshot read in full. Read by
 * ms_attr_load (lib/attribution/seed.c), the read itself keeps what the classifier of the same
 * rules needs of those frames, and the file is not read again. For every fixture and three rule
 * sets (the defaults: two words of patterns; one word; four words, so that each of the
 * pattern-set loops runs), both ways, what th_attr_same compares: every alloc entry's category,
 * the category series, the rows by category, source and stack at the peak and at the end. A file
 * changed after the read is refused with the loader's message (by a classifier that reads it: one
 * of other rules, or a second one); the stacks left for later stay left. (test_attribution.c: a
 * step whose source lines go through several operators.)
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers.h"
#include "memsnap/attribution.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"
#include "snapshot/deferred.h"

static const unsigned EAGER = MS_LOAD_NO_FREE_STACKS;
static const unsigned LATER = MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS;

typedef struct side_s {
  ms_snapshot_t *s;
  ms_timeline_t *tl;
  ms_attr_t *a;
} side_t;

/* How side_open reads: ms_snapshot_load_ex, or ms_attr_load (classified as read) with the
 * classifier's rules, and then with some stacks left for later read before the classifier is
 * made (the blocks alive at the end of device 0's trace, as a report's state reads them). */
typedef enum { PLAIN, WATCHED, WATCHED_FILLED } how_t;

static int side_open_how(const char *path, unsigned flags, const ms_attr_config_t *cfg, how_t how,
                         side_t *x, ms_errbuf_t *eb) {
  memset(x, 0, sizeof *x);
  int rc = how == PLAIN ? ms_snapshot_load_ex(path, flags, &x->s, eb)
                        : ms_attr_load(path, flags, cfg, &x->s, eb);
  cr_assert_eq(rc, MS_OK, "%s: %s", path, eb->msg);
  ms_timeline_config_t tc;
  ms_timeline_config_init(&tc);
  cr_assert_eq(ms_timeline_create(x->s, &tc, &x->tl, eb), MS_OK, "%s: %s", path, eb->msg);
  if (how == WATCHED_FILLED && ms_timeline_ndevices(x->tl) > 0) {
    ms_snapshot_t *at = NULL;
    cr_assert_eq(ms_timeline_snapshot_at(x->tl, 0, ms_timeline_nentries(x->tl, 0), NULL, &at),
                 MS_OK);
    ms_snapshot_free(at);
  }
  return ms_attr_create(x->s, x->tl, cfg, &x->a, eb);
}

static int side_open(const char *path, unsigned flags, const ms_attr_config_t *cfg, side_t *x,
                     ms_errbuf_t *eb) {
  return side_open_how(path, flags, cfg, PLAIN, x, eb);
}

static void side_close(side_t *x) {
  ms_attr_destroy(x->a);
  ms_timeline_destroy(x->tl);
  ms_snapshot_free(x->s);
}

/* The rules: a text of n lines that each add a pattern no frame matches, before the defaults. */
static char *many_patterns(size_t n) {
  char *t = malloc(n * 40 + 1);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += (size_t)sprintf(t + k, "skip func=no_such_function_%zu\n", i);
  t[k] = 0;
  return t;
}

static const char few_rules[] = "defaults none\n"
                                "skip file=*/torch/*\n"
                                "phase backward func=*Backward*\n"
                                "phase forward frame=_call_impl@*module.py\n"
                                "gradient phase=backward freed=after\n"
                                "activation phase=forward\n"
                                "temporary freed=within\n";

Test(attr_deferred, the_same_answers_as_a_full_read, .timeout = 600) {
  static char paths[32][4096];
  size_t n = th_fixture_pickles(paths, 32);
  if (n == 0) cr_skip_test("no fixtures");
  char *many = many_patterns(150);
  ms_attr_config_t cfg[3];
  for (int k = 0; k < 3; k++)
    ms_attr_config_init(&cfg[k]);
  cfg[1].rules = few_rules;
  cfg[1].rules_len = strlen(few_rules);
  cfg[1].replace = true;
  cfg[2].rules = many;
  cfg[2].rules_len = strlen(many);
  size_t deferred = 0, kept = 0, seeded = 0;
  for (size_t f = 0; f < n; f++) {
    for (int k = 0; k < 3; k++) {
      side_t x;
      ms_errbuf_t eb = {{0}};
      cr_assert_eq(side_open(paths[f], EAGER, &cfg[k], &x, &eb), MS_OK, "%s", eb.msg);
      for (how_t how = PLAIN; how <= WATCHED_FILLED; how++) {
        side_t y;
        /* the deferred read's index is made first: the classifier is what reads every frame (or
         * takes what the read found of them) */
        int rc = side_open_how(paths[f], LATER, &cfg[k], how, &y, &eb);
        cr_assert_eq(rc, MS_OK, "%s rules %d way %d: %s", paths[f], k, how, eb.msg);
        deferred += ms__snapshot_defers(y.s);
        kept += ms__snapshot_has_deferred(y.s); /* the stacks the classifier read stay unread */
        seeded += how != PLAIN && ms__snapshot_defer_kept(y.s) != NULL;
        cr_assert(how != PLAIN || ms__snapshot_defer_kept(y.s) == NULL);
        char why[512] = "";
        cr_assert(th_attr_same(x.tl, x.a, y.tl, y.a, why, sizeof why), "%s rules %d way %d: %s",
                  paths[f], k, how, why);
        side_close(&y);
      }
      side_close(&x);
    }
  }
  free(many);
  cr_assert_gt(deferred, 0, "no fixture left a stack for later");
  cr_assert_gt(kept, 0, "the classifier read every stack left for later");
  cr_assert_gt(seeded, 0, "no read kept what it found of the stacks it left for later");
}

/* The first fixture whose read leaves stacks for later, copied to path; false: none. */
static bool copy_a_deferring_fixture(const char *path) {
  static char paths[32][4096];
  size_t n = th_fixture_pickles(paths, 32);
  for (size_t f = 0; f < n; f++) {
    ms_snapshot_t *b = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_load_ex(paths[f], LATER, &b, &eb), MS_OK, "%s", eb.msg);
    bool later = ms__snapshot_has_deferred(b);
    ms_snapshot_free(b);
    if (!later) continue;
    size_t len = 0;
    char *bytes = th_read_file(paths[f], &len);
    cr_assert_not_null(bytes);
    cr_assert_eq(th_write_file(path, bytes, len), 0);
    free(bytes);
    return true;
  }
  return false;
}

Test(attr_deferred, a_changed_file_is_refused) {
  char *dir = th_tmpdir(), path[4200];
  snprintf(path, sizeof path, "%s/copy.pickle", dir);
  if (!copy_a_deferring_fixture(path)) cr_skip_test("no fixture leaves stacks for later");
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_load_ex(path, LATER, &s, &eb), MS_OK, "%s", eb.msg);
  ms_timeline_t *tl = NULL;
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  /* the same bytes written again: its times moved */
  struct timespec ts[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
  cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
  ms_attr_t *a = NULL;
  cr_assert_eq(ms_attr_create(s, tl, NULL, &a, &eb), MS_EIO);
  cr_assert_null(a);
  cr_assert_str_eq(eb.msg, "the file changed since it was read: the stacks of its trace cannot be "
                           "read (run the command again)");
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

/* Read by ms_attr_load, the first classifier of the same rules does not read the file again:
 * made after the file changed, it answers as on a full read. Another one (the read's findings
 * are taken), or one of other rules, reads the file and is refused. */
Test(attr_deferred, a_classifier_of_the_rules_read_with_needs_no_second_read) {
  char *dir = th_tmpdir(), path[4200];
  snprintf(path, sizeof path, "%s/copy.pickle", dir);
  if (!copy_a_deferring_fixture(path)) cr_skip_test("no fixture leaves stacks for later");
  side_t x;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(side_open(path, EAGER, NULL, &x, &eb), MS_OK, "%s", eb.msg);
  static const char other[] = "defaults none\nactivation phase=forward\n";
  ms_attr_config_t cfg[2];
  ms_attr_config_init(&cfg[0]);
  ms_attr_config_init(&cfg[1]);
  cfg[1].rules = other;
  cfg[1].rules_len = strlen(other);
  for (int first = 0; first < 2; first++) { /* the rules read with first, then the others */
    ms_snapshot_t *s = NULL;
    cr_assert_eq(ms_attr_load(path, LATER, &cfg[first], &s, &eb), MS_OK, "%s", eb.msg);
    cr_assert_not_null(ms__snapshot_defer_kept(s));
    ms_timeline_t *tl = NULL;
    cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1000000000 + first, 0}};
    cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
    ms_attr_t *a = NULL, *b = NULL;
    cr_assert_eq(ms_attr_create(s, tl, &cfg[!first], &b, &eb), MS_EIO);
    cr_assert_null(b);
    cr_assert_eq(ms_attr_create(s, tl, &cfg[first], &a, &eb), MS_OK, "%s", eb.msg);
    if (first == 0) { /* every entry's category, and the series (rows would read stacks) */
      for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
        size_t n = ms_timeline_nentries(tl, d);
        for (size_t i = 0; i < n; i++)
          if (ms_timeline_entry(tl, d, i)->action == MS_TRACE_ALLOC)
            cr_assert_eq(ms_attr_entry_category(a, d, i), ms_attr_entry_category(x.a, d, i));
        uint64_t *u = NULL, *v = NULL;
        cr_assert_eq(ms_attr_category_series(a, d, &u), MS_OK);
        cr_assert_eq(ms_attr_category_series(x.a, d, &v), MS_OK);
        cr_assert_eq(memcmp(u, v, (n + 1) * MS_CAT_COUNT * sizeof *u), 0);
        free(u);
        free(v);
      }
    }
    cr_assert_eq(ms_attr_create(s, tl, &cfg[first], &b, &eb), MS_EIO);
    cr_assert_str_eq(eb.msg, "the file changed since it was read: the stacks of its trace cannot "
                             "be read (run the command again)");
    ms_attr_destroy(a);
    ms_timeline_destroy(tl);
    ms_snapshot_free(s);
  }
  /* nothing to keep: a read that leaves no stack for later, rules that do not parse */
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms_attr_load(path, EAGER, NULL, &s, &eb), MS_OK, "%s", eb.msg);
  cr_assert_null(ms__snapshot_defer_kept(s));
  ms_snapshot_free(s);
  ms_attr_config_t bad;
  ms_attr_config_init(&bad);
  bad.rules = "no such rule\n";
  bad.rules_len = strlen(bad.rules);
  cr_assert_eq(ms_attr_load(path, LATER, &bad, &s, &eb), MS_OK, "%s", eb.msg);
  cr_assert_null(ms__snapshot_defer_kept(s));
  ms_timeline_t *tl = NULL;
  ms_attr_t *a = NULL;
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_attr_create(s, tl, &bad, &a, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "rules:1: unknown category or kind of line (categories: parameter, "
                           "optimizer_state, input, temporary, activation, gradient, "
                           "autograd_detail, unknown; or skip, prefer, phase): 'no'");
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
  /* a file that is not there: the loader's error */
  char gone[4300];
  snprintf(gone, sizeof gone, "%s/none.pickle", dir);
  cr_assert_eq(ms_attr_load(gone, LATER, NULL, &s, &eb), MS_ENOTFOUND);
  char want[4400];
  snprintf(want, sizeof want, "cannot open '%s': No such file or directory", gone);
  cr_assert_str_eq(eb.msg, want);
  side_close(&x);
  th_rmdir(dir);
  free(dir);
}

/* Runs the Python script text (which writes the pickle its argument names) as dir/NAME.py; path
 * receives the pickle's path, dir/NAME.pickle. */
static void python_pickle(const char *dir, const char *name, const char *text, char *path,
                          size_t cap) {
  char script[4200], cmd[9000];
  snprintf(script, sizeof script, "%s/%s.py", dir, name);
  snprintf(path, cap, "%s/%s.pickle", dir, name);
  cr_assert_eq(th_write_file(script, text, strlen(text)), 0);
  snprintf(cmd, sizeof cmd, "python3 '%s' '%s'", script, path);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* A source line whose allocations go through two operators, the second only in a stack left for
 * later, after one left for later with the first: the classifier learns it from the file (the
 * line's rows name their operators), as a full read does. Written by Python's pickle as PyTorch's
 * are: the block alive at the end lists the frame dicts first, and the trace's lists name them by
 * memo gets. */
static const char two_ops_py[] =
    "import pickle, sys\n"
    "def fr(n, f, l): return {'name': n, 'filename': f, 'line': l}\n"
    "mm = fr('at::_ops::mm::call(at::Tensor const&, at::Tensor const&)', '?"
    "?', 0)\n"
    "add = fr('at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&)', '?"
    "?', 0)\n"
    "py = fr('<module>', '/home/u/train.py', 5)\n"
    "base, mb = 0x7f0000000000, 1 << 20\n"
    "def blk(a, s, st, frames): return {'address': a, 'size': s, 'requested_size': s,\n"
    "    'state': st, 'frames': frames}\n"
    "seg = {'device': 0, 'address': base, 'total_size': 4 * mb, 'allocated_size': mb,\n"
    "    'active_size': mb, 'requested_size': mb, 'stream': 0, 'segment_type': 'large',\n"
    "    'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [],\n"
    "    'blocks': [blk(base, mb, 'active_allocated', [add, mm, py]),\n"
    "               blk(base + mb, 3 * mb, 'inactive', [])]}\n"
    "def ev(a, addr, t, frames):\n"
    "    e = {'action': a, 'addr': addr, 'size': mb, 'stream': 0, 'time_us': t}\n"
    "    if frames is not None: e['frames'] = frames\n"
    "    return e\n"
    "b, c = base + mb, base + 2 * mb\n"
    "tr = [ev('alloc', base, 1, [add, mm, py]), ev('alloc', b, 2, [add, mm, py]),\n"
    "      ev('alloc', c, 3, [mm, add, py]),\n"
    "      ev('free_requested', b, 4, None), ev('free_completed', b, 5, []),\n"
    "      ev('free_requested', c, 6, None), ev('free_completed', c, 7, [])]\n"
    "pickle.dump({'segments': [seg], 'device_traces': [tr]}, open(sys.argv[1], 'wb'), "
    "protocol=4)\n";

Test(attr_deferred, an_operator_known_only_from_a_stack_left_for_later) {
  if (!th_have_python()) cr_skip_test("no python3");
  char *dir = th_tmpdir(), path[4200];
  python_pickle(dir, "two_ops", two_ops_py, path, sizeof path);
  side_t x, y;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(side_open(path, EAGER, NULL, &x, &eb), MS_OK, "%s", eb.msg);
  for (how_t how = PLAIN; how <= WATCHED; how++) {
    cr_assert_eq(side_open_how(path, LATER, NULL, how, &y, &eb), MS_OK, "%s", eb.msg);
    cr_assert(ms__snapshot_defers(y.s), "the trace's stacks were left for later");
    char why[512] = "";
    cr_assert(th_attr_same(x.tl, x.a, y.tl, y.a, why, sizeof why), "%s", why);
    /* at the peak the three blocks are alive: one row per operator */
    ms_attr_rows_t r = {0};
    cr_assert_eq(ms_attr_aggregate(y.a, 0, 3, NULL, MS_ATTR_BY_SOURCE, &r), MS_OK);
    cr_assert_eq(r.nrows, 2);
    cr_assert_str_eq(r.rows[0].key, "train.py:5 <module> \xe2\x86\x92 at::mm");
    cr_assert_eq(r.rows[0].bytes, 2 << 20);
    cr_assert_str_eq(r.rows[1].key, "train.py:5 <module> \xe2\x86\x92 at::add_Tensor");
    cr_assert_eq(r.rows[1].bytes, 1 << 20);
    ms_attr_rows_free(&r);
    side_close(&y);
  }
  side_close(&x);
  th_rmdir(dir);
  free(dir);
}

/* The read keeps a byte per record for its pattern set: a trace whose allocations meet 255 sets
 * or more drops what the read found, and the classifier reads the file again, with the same
 * answers. 300 allocations, each through a function of its own (f_0 .. f_299) called from the
 * same line, under rules that name n of them: n + 1 sets. Written by Python as PyTorch writes:
 * the frames are met first in the block alive at the end, so that the trace's frames lists are
 * runs of memo gets (two a list: one is an APPEND), left for later. */
static const char many_sets_py[] =
    "import pickle, sys\n"
    "N, base, mb = 300, 0x7f0000000000, 1 << 20\n"
    "fr = [{'name': 'f_%d' % i, 'filename': '/home/u/m.py', 'line': i} for i in range(N)]\n"
    "top = {'name': '<module>', 'filename': '/home/u/train.py', 'line': 1}\n"
    "def blk(a, s, st, frames): return {'address': a, 'size': s, 'requested_size': s,\n"
    "    'state': st, 'frames': frames}\n"
    "seg = {'device': 0, 'address': base, 'total_size': (N + 1) * mb, 'allocated_size': mb,\n"
    "    'active_size': mb, 'requested_size': mb, 'stream': 0, 'segment_type': 'large',\n"
    "    'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [],\n"
    "    'blocks': [blk(base, N * mb, 'inactive', []),\n"
    "               blk(base + N * mb, mb, 'active_allocated', fr + [top])]}\n"
    "tr = [{'action': 'alloc', 'addr': base + i * mb, 'size': mb, 'stream': 0, 'time_us': i,\n"
    "       'frames': [fr[i], top]} for i in range(N)]\n"
    "for i in range(N):\n"
    "    tr.append({'action': 'free_requested', 'addr': base + i * mb, 'size': mb, 'stream': 0,\n"
    "               'time_us': N + 2 * i})\n"
    "    tr.append({'action': 'free_completed', 'addr': base + i * mb, 'size': mb, 'stream': 0,\n"
    "               'time_us': N + 2 * i + 1, 'frames': []})\n"
    "pickle.dump({'segments': [seg], 'device_traces': [tr]}, open(sys.argv[1], 'wb'), "
    "protocol=4)\n";

Test(attr_deferred, too_many_sets_for_the_read_to_keep) {
  if (!th_have_python()) cr_skip_test("no python3");
  char *dir = th_tmpdir(), path[4200];
  python_pickle(dir, "many_sets", many_sets_py, path, sizeof path);
  static const size_t named[2] = {200, 256}; /* 201 sets: kept; 257: dropped */
  for (int k = 0; k < 2; k++) {
    char *rules = malloc(named[k] * 40 + 32);
    size_t len = (size_t)sprintf(rules, "defaults none\n");
    for (size_t i = 0; i < named[k]; i++)
      len += (size_t)sprintf(rules + len, "activation func=f_%zu\n", i);
    ms_attr_config_t cfg;
    ms_attr_config_init(&cfg);
    cfg.rules = rules;
    cfg.rules_len = len;
    side_t x, y;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(side_open(path, EAGER, &cfg, &x, &eb), MS_OK, "%s", eb.msg);
    memset(&y, 0, sizeof y);
    cr_assert_eq(ms_attr_load(path, LATER, &cfg, &y.s, &eb), MS_OK, "%s", eb.msg);
    cr_assert(ms__snapshot_has_deferred(y.s), "the allocations' stacks were left for later");
    cr_assert_eq(ms__snapshot_defer_kept(y.s) != NULL, k == 0, "%zu rules", named[k]);
    cr_assert_eq(ms_timeline_create(y.s, NULL, &y.tl, &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(ms_attr_create(y.s, y.tl, &cfg, &y.a, &eb), MS_OK, "%s", eb.msg);
    char why[512] = "";
    cr_assert(th_attr_same(x.tl, x.a, y.tl, y.a, why, sizeof why), "%zu rules: %s", named[k], why);
    /* each named function's allocation is an activation, the others unknown */
    for (size_t i = 0; i < 300; i++)
      cr_assert_eq(ms_attr_entry_category(y.a, 0, i),
                   i < named[k] ? MS_CAT_ACTIVATION : MS_CAT_UNKNOWN, "entry %zu", i);
    side_close(&x);
    side_close(&y);
    free(rules);
  }
  th_rmdir(dir);
  free(dir);
}
