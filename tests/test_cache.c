/* SPDX-License-Identifier: MIT
 * Tests of the snapshot cache (memsnap/cache.h, issue #33):
 *  - the format: every table of a synthetic snapshot and of each PyTorch fixture (each load flag)
 *    survives encode/decode exactly;
 *  - ms_cache_load: stored on the first load, hit on the second, the same snapshot; standard input
 *    never cached; a changed file with the same size and mtime is never answered from the stale
 *    entry;
 *  - damage: an entry truncated at every offset or filled with random bytes is refused by the
 *    reader (and, through ms_cache_load, rebuilt); every byte of an entry flipped with the
 *    checksums off never crashes the reader;
 *  - concurrent loads of one file into one empty cache all succeed and leave a valid entry;
 *  - the eviction bound holds after every store;
 *  - the time index's file: every fixture's index (each load flag, the default configuration and a
 *    filtered one) survives encode/decode, answering alike; another key, configuration or snapshot
 *    is refused; stored, hit, and rebuilt when truncated at any offset or filled with garbage; each
 *    byte flipped is refused with the checksums and never crashes the index's readers without;
 *  - blobs (the pages of `memsnap view`): encode/decode exactly; truncated at every offset or with
 *    any byte flipped refused; another key or tag is a miss;
 *  - the CLI: every command on every fixture answers byte for byte as with --no-cache, the second
 *    run is a hit (the entry is touched in place, not rewritten), MEMSNAP_CACHE=0 and --no-cache
 *    leave the cache alone, `memsnap cache --clear` empties it; `view` stores its page (not its
 *    snapshot), a second `view` writes the stored page, and a damaged page is rebuilt.
 * Every test uses its own cache directory under a fresh temporary folder (never the user's).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/internal.h"
#include "helpers.h"
#include "memsnap/cache.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"
#include "timeline/internal.h"

static const char *const fixtures[] = {
    "a0kuma_adamw_small.pickle",           "cranberrii_ftcourse.pickle",
    "jogregoire_diffusion_tiny.pickle",    "maphsge_select_n_4dev.pickle",
    "wedsonlin_cs336_medium_1024_training.pickle", "yiyi_flexgen_1.3b_legacy_a.pickle",
    "yiyi_flexgen_oom_legacy.pickle",
};
#define NFIX (sizeof fixtures / sizeof *fixtures)
static const unsigned flag_sets[] = {0, MS_LOAD_NO_TRACE, MS_LOAD_NO_TRACE_STACKS,
                                     MS_LOAD_NO_FREE_STACKS};


static bool fixture(const char *name, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", th_fixture_dir(), name);
  return access(path, R_OK) == 0;
}

static bool any_fixture(void) {
  char p[700];
  if (fixture(fixtures[0], p, sizeof p)) return true;
  cr_log_info("SKIP: no PyTorch fixtures in %s", th_fixture_dir());
  printf("SKIP: no PyTorch fixtures in %s\n", th_fixture_dir());
  return false;
}

/* The one entry of the cache directory (asserted to be one), into path. */
static void only_entry(char *path, size_t cap) {
  DIR *d = opendir(th_cache_dir());
  cr_assert(d);
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, cap, "%s/%s", th_cache_dir(), e->d_name);
    n++;
  }
  closedir(d);
  cr_assert_eq(n, 1, "%d entries", n);
}

static void roundtrip(const ms_snapshot_t *s, unsigned flags) {
  ms_cache_key_t key = {0x1234, 99, flags};
  void *buf;
  size_t len;
  cr_assert_eq(ms_cache_encode(s, &key, &buf, &len), MS_OK);
  ms_snapshot_t *back = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_cache_decode(buf, len, &key, true, &back, &eb), MS_OK, "%s", eb.msg);
  TH_ASSERT_SNAP_EQ(s, back);
  /* another key is a miss */
  ms_cache_key_t other = key;
  other.hash ^= 1;
  ms_snapshot_t *no = NULL;
  cr_assert_eq(ms_cache_decode(buf, len, &other, true, &no, NULL), MS_ENOTFOUND);
  cr_assert_null(no);
  ms_snapshot_free(back);
  free(buf);
}

TestSuite(cache, .init = th_cache_setup, .fini = th_cache_teardown, .timeout = 600);

Test(cache, synthetic_roundtrip) {
  ms_snapshot_t *s = th_synth(NULL);
  cr_assert(s);
  roundtrip(s, 0);
  ms_snapshot_free(s);
  th_synth_opts_t o = {.nsegments = 40, .blocks_per_segment = 9, .nframes = 70000, .nstacks = 300,
                       .ntrace = 3000, .history = 1, .seed = 7};
  s = th_synth(&o); /* more than 65,536 frames: 4-byte stack frames */
  cr_assert(s);
  roundtrip(s, 0);
  ms_snapshot_free(s);
}

Test(cache, fixtures_roundtrip) {
  if (!any_fixture()) return;
  for (size_t i = 0; i < NFIX; i++) {
    char p[700];
    if (!fixture(fixtures[i], p, sizeof p)) continue;
    for (size_t f = 0; f < sizeof flag_sets / sizeof *flag_sets; f++) {
      ms_snapshot_t *s = NULL;
      cr_assert_eq(ms_snapshot_load_ex(p, flag_sets[f], &s, NULL), MS_OK, "%s", p);
      roundtrip(s, flag_sets[f]);
      ms_snapshot_free(s);
    }
  }
}

/* Loads path through the cache; asserts the outcome and that the snapshot equals a plain load. */
static void load_expect(const char *path, unsigned flags, const ms_cache_options_t *o,
                        ms_cache_outcome want) {
  ms_snapshot_t *s = NULL, *plain = NULL;
  ms_cache_outcome oc;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_cache_load(path, flags, o, &s, &oc, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(oc, want, "%s: outcome %d, not %d", path, oc, want);
  cr_assert_eq(ms_snapshot_load_ex(path, flags, &plain, NULL), MS_OK);
  TH_ASSERT_SNAP_EQ(plain, s);
  ms_snapshot_free(s);
  ms_snapshot_free(plain);
}

Test(cache, hit_on_second_load) {
  if (!any_fixture()) return;
  for (size_t i = 0; i < NFIX; i++) {
    char p[700];
    if (!fixture(fixtures[i], p, sizeof p)) continue;
    for (size_t f = 0; f < sizeof flag_sets / sizeof *flag_sets; f++) {
      load_expect(p, flag_sets[f], NULL, MS_CACHE_STORED);
      load_expect(p, flag_sets[f], NULL, MS_CACHE_HIT);
    }
  }
  size_t n;
  uint64_t bytes;
  cr_assert_eq(ms_cache_usage(NULL, &n, &bytes), MS_OK);
  cr_assert_gt(n, 0);
  size_t removed = 0;
  cr_assert_eq(ms_cache_clear(NULL, &removed), MS_OK);
  cr_assert_eq(removed, n);
  cr_assert_eq(ms_cache_usage(NULL, &n, &bytes), MS_OK);
  cr_assert_eq(n, 0);
  cr_assert_eq(bytes, 0);
}

/* read_only: an entry is used, a miss is read and not stored, the key given either way. */
Test(cache, read_only_stores_nothing) {
  if (!any_fixture()) return;
  char p[700];
  cr_assert(fixture(fixtures[0], p, sizeof p));
  const ms_cache_options_t ro = {NULL, 0, true};
  size_t n;
  uint64_t bytes;
  load_expect(p, 0, &ro, MS_CACHE_MISSED);
  cr_assert_eq(ms_cache_usage(NULL, &n, &bytes), MS_OK);
  cr_assert_eq(n, 0);
  ms_snapshot_t *s = NULL;
  ms_cache_key_t key, want = {0, 0, 0};
  cr_assert_eq(ms_cache_hash_file(p, &want.hash, &want.size), MS_OK);
  cr_assert_eq(ms_cache_load_keyed(p, 0, &ro, &s, NULL, &key, NULL), MS_OK);
  cr_assert(key.hash == want.hash && key.size == want.size && key.flags == 0);
  ms_snapshot_free(s);
  load_expect(p, 0, NULL, MS_CACHE_STORED);
  load_expect(p, 0, &ro, MS_CACHE_HIT);
}

/* A memsnap file written to dir/name from a synthetic snapshot; its bytes in *buf. */
static void write_synth_seed(const char *path, uint64_t seed, char **buf, size_t *len) {
  th_synth_opts_t o = {.nsegments = 6, .blocks_per_segment = 5, .nframes = 40, .nstacks = 30,
                       .ntrace = 200, .history = 1, .seed = seed};
  ms_snapshot_t *s = th_synth(seed ? &o : NULL);
  cr_assert(s);
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, NULL), MS_OK);
  ms_snapshot_free(s);
  *buf = th_read_file(path, len);
  cr_assert(*buf);
}

static void write_synth(const char *path, char **buf, size_t *len) {
  write_synth_seed(path, 0, buf, len);
}

Test(cache, stdin_never_cached) {
  char p[700];
  snprintf(p, sizeof p, "%s/a.msnap", th_cache_tmp);
  char *bytes;
  size_t len;
  write_synth(p, &bytes, &len);
  free(bytes);
  int fd = open(p, O_RDONLY);
  cr_assert(fd >= 0);
  int saved = dup(0);
  dup2(fd, 0);
  close(fd);
  ms_snapshot_t *s = NULL;
  ms_cache_outcome oc;
  cr_assert_eq(ms_cache_load("-", 0, NULL, &s, &oc, NULL), MS_OK);
  dup2(saved, 0);
  close(saved);
  cr_assert_eq(oc, MS_CACHE_BYPASSED);
  ms_snapshot_free(s);
  size_t n = 1;
  uint64_t b;
  cr_assert_eq(ms_cache_usage(NULL, &n, &b), MS_OK);
  cr_assert_eq(n, 0);
}

Test(cache, changed_file_same_size_and_mtime) {
  char p[700];
  snprintf(p, sizeof p, "%s/a.msnap", th_cache_tmp);
  char *bytes;
  size_t len;
  write_synth(p, &bytes, &len);
  struct stat st;
  cr_assert_eq(stat(p, &st), 0);
  load_expect(p, 0, NULL, MS_CACHE_STORED);
  load_expect(p, 0, NULL, MS_CACHE_HIT);
  /* change one letter of a string the model keeps (a frame's name), same size, same mtime */
  char *at = NULL;
  for (size_t i = 0; i + 4 < len && !at; i++)
    if (memcmp(bytes + i, "fn_1(", 5) == 0) at = bytes + i + 3;
  cr_assert(at, "no frame name in the synthetic file");
  at[0] = '7'; /* fn_1 -> fn_7 */
  cr_assert_eq(th_write_file(p, bytes, len), 0);
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  cr_assert_eq(utimensat(AT_FDCWD, p, times, 0), 0);
  struct stat st2;
  cr_assert_eq(stat(p, &st2), 0);
  cr_assert_eq(st2.st_size, st.st_size);
  cr_assert_eq(st2.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
  load_expect(p, 0, NULL, MS_CACHE_STORED); /* never the stale entry */
  load_expect(p, 0, NULL, MS_CACHE_HIT);
  free(bytes);
}

/* A valid entry for the tiny fixture or the synthetic file; its source in src. */
static char *make_entry(char *src, size_t cap, char *entry, size_t ecap, size_t *len) {
  snprintf(src, cap, "%s/a.msnap", th_cache_tmp);
  char *b;
  size_t n;
  write_synth(src, &b, &n);
  free(b);
  load_expect(src, 0, NULL, MS_CACHE_STORED);
  only_entry(entry, ecap);
  char *e = th_read_file(entry, len);
  cr_assert(e);
  return e;
}

Test(cache, truncated_at_every_offset) {
  char src[700], entry[1200];
  size_t len;
  char *e = make_entry(src, sizeof src, entry, sizeof entry, &len);
  for (size_t cut = 0; cut < len; cut++) {
    ms_snapshot_t *s = NULL;
    cr_assert_neq(ms_cache_decode(e, cut, NULL, true, &s, NULL), MS_OK, "cut at %zu", cut);
    cr_assert_null(s);
    cr_assert_neq(ms_cache_decode(e, cut, NULL, false, &s, NULL), MS_OK, "cut at %zu", cut);
  }
  /* through the loader: a truncated entry is rebuilt (every 61st offset: each rebuild re-reads) */
  for (size_t cut = 0; cut < len; cut += 61) {
    cr_assert_eq(th_write_file(entry, e, cut), 0);
    load_expect(src, 0, NULL, MS_CACHE_STORED);
    load_expect(src, 0, NULL, MS_CACHE_HIT);
  }
  free(e);
}

Test(cache, random_bytes_and_flips) {
  char src[700], entry[1200];
  size_t len;
  char *e = make_entry(src, sizeof src, entry, sizeof entry, &len);
  unsigned seed = 12345;
  char *r = malloc(len + 4096);
  cr_assert(r);
  for (int k = 0; k < 50; k++) {
    size_t n = k == 0 ? len : (size_t)rand_r(&seed) % (len + 4096);
    for (size_t i = 0; i < n; i++) r[i] = (char)rand_r(&seed);
    if (k % 2) memcpy(r, e, n < 64 ? n : 64); /* a valid magic and key, then garbage */
    ms_snapshot_t *s = NULL;
    cr_assert_neq(ms_cache_decode(r, n, NULL, true, &s, NULL), MS_OK);
    if (k < 5) {
      cr_assert_eq(th_write_file(entry, r, n), 0);
      load_expect(src, 0, NULL, MS_CACHE_STORED);
    }
  }
  /* each byte changed, checksums off: the structural checks alone never let a crash through */
  for (size_t i = 0; i < len; i++) {
    memcpy(r, e, len);
    r[i] ^= (char)(1 + rand_r(&seed) % 255);
    ms_snapshot_t *s = NULL;
    if (ms_cache_decode(r, len, NULL, false, &s, NULL) == MS_OK) {
      cr_assert(s);
      ms_snapshot_free(s);
    }
    /* with the checksums, any change is refused */
    cr_assert_neq(ms_cache_decode(r, len, NULL, true, &s, NULL), MS_OK, "byte %zu", i);
  }
  free(r);
  free(e);
}

Test(cache, concurrent_loads) {
  char p[700];
  snprintf(p, sizeof p, "%s/a.msnap", th_cache_tmp);
  char *b;
  size_t n;
  write_synth(p, &b, &n);
  free(b);
  enum { KIDS = 8, ROUNDS = 5 };
  pid_t kids[KIDS];
  for (int k = 0; k < KIDS; k++) {
    kids[k] = fork();
    cr_assert_neq(kids[k], -1);
    if (kids[k] == 0) {
      for (int r = 0; r < ROUNDS; r++) {
        ms_snapshot_t *s = NULL;
        if (ms_cache_load(p, (unsigned)(r % 2), NULL, &s, NULL, NULL) != MS_OK) _exit(1);
        ms_snapshot_free(s);
        if (k == 0 && r == 2 && ms_cache_clear(NULL, NULL) != MS_OK) _exit(2);
      }
      _exit(0);
    }
  }
  for (int k = 0; k < KIDS; k++) {
    int st;
    cr_assert_eq(waitpid(kids[k], &st, 0), kids[k]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d failed", k);
  }
  /* whatever is left is complete: a hit or a rebuild, the same snapshot */
  ms_snapshot_t *s = NULL, *plain = NULL;
  ms_cache_outcome oc;
  cr_assert_eq(ms_cache_load(p, 0, NULL, &s, &oc, NULL), MS_OK);
  cr_assert(oc == MS_CACHE_HIT || oc == MS_CACHE_STORED);
  cr_assert_eq(ms_snapshot_load_ex(p, 0, &plain, NULL), MS_OK);
  TH_ASSERT_SNAP_EQ(plain, s);
  ms_snapshot_free(s);
  ms_snapshot_free(plain);
  load_expect(p, 0, NULL, MS_CACHE_HIT);
}

Test(cache, eviction_bound) {
  /* entries of 12 distinct files; the bound holds about three */
  char p[700];
  snprintf(p, sizeof p, "%s/f0.msnap", th_cache_tmp);
  char *b;
  size_t n;
  write_synth_seed(p, 100, &b, &n);
  free(b);
  load_expect(p, 0, NULL, MS_CACHE_STORED);
  size_t cnt;
  uint64_t one;
  cr_assert_eq(ms_cache_usage(NULL, &cnt, &one), MS_OK);
  cr_assert_eq(cnt, 1);
  ms_cache_options_t o = {NULL, one * 3 + one / 2, false};
  for (int i = 1; i < 12; i++) {
    snprintf(p, sizeof p, "%s/f%d.msnap", th_cache_tmp, i);
    write_synth_seed(p, 100 + (uint64_t)i, &b, &n);
    free(b);
    load_expect(p, flag_sets[i % 4], &o, MS_CACHE_STORED);
    uint64_t bytes;
    cr_assert_eq(ms_cache_usage(NULL, &cnt, &bytes), MS_OK);
    cr_assert_leq(bytes, o.max_bytes, "after store %d: %llu > %llu", i,
                  (unsigned long long)bytes, (unsigned long long)o.max_bytes);
    cr_assert_geq(cnt, 2);
    load_expect(p, flag_sets[i % 4], &o, MS_CACHE_HIT); /* the newest stays */
  }
  /* one entry larger than the bound is never stored */
  ms_cache_options_t tiny = {NULL, 16, false};
  ms_cache_outcome oc;
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms_cache_clear(NULL, NULL), MS_OK);
  cr_assert_eq(ms_cache_load(p, 0, &tiny, &s, &oc, NULL), MS_OK);
  cr_assert_eq(oc, MS_CACHE_MISSED);
  ms_snapshot_free(s);
  cr_assert_eq(ms_cache_usage(NULL, &cnt, &one), MS_OK);
  cr_assert_eq(cnt, 0);
}

/* Eviction in a cache folder with no entry (a concurrent `cache --clear` emptied it) or none at
 * all does nothing: the listing is empty, and sorting it must not be given a NULL array (UBSan
 * reported it in cache::concurrent_loads, a child evicting right after another cleared). */
Test(cache, eviction_of_an_empty_folder) {
  char d[800];
  snprintf(d, sizeof d, "%s/empty-cache", th_cache_tmp);
  cr_assert_eq(mkdir(d, 0700), 0);
  cr_assert_eq(ms_cache_evict(d, 0), MS_OK);
  size_t cnt = 1;
  uint64_t bytes = 1;
  cr_assert_eq(ms_cache_usage(d, &cnt, &bytes), MS_OK);
  cr_assert_eq(bytes, 0);
  cr_assert_eq(cnt, 0);
  cr_assert_eq(rmdir(d), 0);
  cr_assert_eq(ms_cache_evict(d, 0), MS_OK, "a folder that is not there: nothing to evict");
}

/* The entry of the cache directory that is not `except` (NULL: the only one). */
static void entry_other_than(const char *except, char *path, size_t cap) {
  DIR *d = opendir(th_cache_dir());
  cr_assert(d);
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL) {
    char q[1200];
    if (e->d_name[0] == '.') continue;
    snprintf(q, sizeof q, "%s/%s", th_cache_dir(), e->d_name);
    if (except && strcmp(q, except) == 0) continue;
    snprintf(path, cap, "%s", q);
    n++;
  }
  closedir(d);
  cr_assert_eq(n, 1);
}

static void set_age(const char *path, time_t seconds_ago) {
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= seconds_ago;
  t[1] = t[0];
  cr_assert_eq(utimensat(AT_FDCWD, path, t, 0), 0);
}

Test(cache, lru_keeps_the_recently_used) {
  char a[700], b[700], c[700], ea[1200], eb[1200];
  char *buf;
  size_t n;
  snprintf(a, sizeof a, "%s/a.msnap", th_cache_tmp);
  snprintf(b, sizeof b, "%s/b.msnap", th_cache_tmp);
  snprintf(c, sizeof c, "%s/c.msnap", th_cache_tmp);
  write_synth_seed(a, 1, &buf, &n);
  free(buf);
  write_synth_seed(b, 2, &buf, &n);
  free(buf);
  write_synth_seed(c, 3, &buf, &n);
  free(buf);
  load_expect(a, 0, NULL, MS_CACHE_STORED);
  entry_other_than(NULL, ea, sizeof ea);
  load_expect(b, 0, NULL, MS_CACHE_STORED);
  entry_other_than(ea, eb, sizeof eb);
  set_age(ea, 100); /* a stored first, b next ... */
  set_age(eb, 50);
  load_expect(a, 0, NULL, MS_CACHE_HIT); /* ... then a used again: b is the least recent */
  size_t cnt;
  uint64_t two;
  cr_assert_eq(ms_cache_usage(NULL, &cnt, &two), MS_OK);
  ms_cache_options_t o = {NULL, two + two / 4, false}; /* room for two entries, not three */
  load_expect(c, 0, &o, MS_CACHE_STORED);
  cr_assert_eq(access(eb, F_OK), -1, "the least recently used entry stayed");
  cr_assert_eq(access(ea, F_OK), 0, "the recently used entry went");
  load_expect(a, 0, &o, MS_CACHE_HIT);
  load_expect(c, 0, &o, MS_CACHE_HIT);
}

/* ---- the CLI ------------------------------------------------------------------------------- */

static const char *bin(void) {
  const char *b = getenv("MEMSNAP_BIN");
  return b && *b ? b : MS_TEST_BINARY_DIR "/bin/memsnap";
}

/* Runs memsnap in th_cache_tmp with args (NULL-terminated), stdout and stderr into one buffer, plus the
 * bytes of th_cache_tmp/out.* (an output file) when the command wrote one. @return the exit status. */
static int run(char **out, size_t *len, const char *const *args, const char *env) {
  char cmd[4096];
  size_t k = (size_t)snprintf(cmd, sizeof cmd, "cd '%s' && rm -f out.file && %s '%s'", th_cache_tmp,
                              env ? env : "", bin());
  for (; *args; args++) k += (size_t)snprintf(cmd + k, sizeof cmd - k, " '%s'", *args);
  snprintf(cmd + k, sizeof cmd - k, " >'%s/.out' 2>&1; s=$?; [ -f out.file ] && cat out.file "
           ">>'%s/.out'; exit $s", th_cache_tmp, th_cache_tmp);
  int st = system(cmd);
  char p[700];
  snprintf(p, sizeof p, "%s/.out", th_cache_tmp);
  *out = th_read_file(p, len);
  cr_assert(*out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The commands, each with FILE where the fixture goes. */
static const char *const commands[][12] = {
    {"stats", "FILE"},
    {"stats", "FILE", "--summary"},
    {"trace", "FILE"},
    {"memory", "FILE", "--folded", "-o", "-"},
    {"segments", "FILE", "--folded", "-o", "-"},
    {"memory", "FILE", "--json", "--at", "peak"},
    {"timeline", "FILE"},
    {"timeline", "FILE", "--json"},
    {"top", "FILE"},
    {"top", "FILE", "--at", "end", "--by", "frame"},
    {"top", "FILE", "--by", "category", "--json"},
    {"explain", "FILE", "--no-replay"},
    {"view", "FILE", "-o", "out.file"},
    {"export", "FILE", "--perfetto", "out.file"},
    {"compare", "FILE", "FILE", "--folded", "-o", "-"},
    {"convert", "FILE", "out.file"},
    {"replay", "FILE", "--check"},
    {"trace_plot", "FILE", "-o", "out.file"},
    {"trace_plot", "FILE", "-f", "-s", "-o", "out.file"},
    {"segment_plot", "FILE", "-o", "out.file"},
    {"view", "FILE", "--view", "flame", "--no-replay", "--budget", "1M", "-o", "out.file"},
};
#define NCMD (sizeof commands / sizeof *commands)

static void args_for(size_t c, const char *file, const char **argv, bool no_cache) {
  size_t n = 0;
  for (size_t i = 0; i < 12 && commands[c][i]; i++)
    argv[n++] = strcmp(commands[c][i], "FILE") == 0 ? file : commands[c][i];
  if (no_cache) argv[n++] = "--no-cache";
  argv[n] = NULL;
}

static ino_t entries_ino(void) { /* the sum of the entries' inode numbers: changes on a rewrite */
  DIR *d = opendir(th_cache_dir());
  if (!d) return 0;
  struct dirent *e;
  ino_t s = 0;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') s += e->d_ino;
  closedir(d);
  return s;
}

Test(cache, cli_identical_for_every_command_and_fixture) {
  if (!any_fixture()) return;
  for (size_t i = 0; i < NFIX; i++) {
    char p[700];
    if (!fixture(fixtures[i], p, sizeof p)) continue;
    for (size_t c = 0; c < NCMD; c++) {
      const char *argv[16];
      char *plain, *first, *second;
      size_t lp, l1, l2;
      cr_assert_eq(ms_cache_clear(NULL, NULL), MS_OK);
      args_for(c, p, argv, true);
      int sp = run(&plain, &lp, argv, NULL);
      size_t cnt;
      uint64_t bytes;
      cr_assert_eq(ms_cache_usage(NULL, &cnt, &bytes), MS_OK);
      cr_assert_eq(cnt, 0, "--no-cache stored an entry");
      args_for(c, p, argv, false);
      int s1 = run(&first, &l1, argv, NULL);
      ino_t ino = entries_ino();
      int s2 = run(&second, &l2, argv, NULL);
      cr_assert_eq(entries_ino(), ino, "%s %s: the second run rewrote the cache", argv[0], p);
      cr_assert(sp == s1 && s1 == s2, "%s %s: status %d %d %d", argv[0], p, sp, s1, s2);
      cr_assert(lp == l1 && lp == l2 && memcmp(plain, first, lp) == 0 &&
                    memcmp(plain, second, lp) == 0,
                "%s %s %s: the cached answer differs", argv[0], argv[1], argv[2] ? argv[2] : "");
      if (sp == 0 && strcmp(argv[0], "convert") != 0) {
        cr_assert_eq(ms_cache_usage(NULL, &cnt, &bytes), MS_OK);
        cr_assert_gt(cnt, 0, "%s %s: nothing cached", argv[0], p);
      }
      free(plain);
      free(first);
      free(second);
    }
  }
}

Test(cache, cli_disabled_and_clear) {
  char p[700];
  snprintf(p, sizeof p, "%s/a.msnap", th_cache_tmp);
  char *b;
  size_t n;
  write_synth(p, &b, &n);
  free(b);
  char *out;
  size_t len, cnt;
  uint64_t bytes;
  cr_assert_eq(run(&out, &len, (const char *const[]){"stats", p, NULL}, "MEMSNAP_CACHE=0"), 0);
  free(out);
  cr_assert_eq(ms_cache_usage(NULL, &cnt, &bytes), MS_OK);
  cr_assert_eq(cnt, 0, "MEMSNAP_CACHE=0 stored an entry");
  cr_assert_eq(run(&out, &len, (const char *const[]){"stats", p, NULL}, NULL), 0);
  free(out);
  cr_assert_eq(ms_cache_usage(NULL, &cnt, &bytes), MS_OK);
  cr_assert_eq(cnt, 1);
  cr_assert_eq(run(&out, &len, (const char *const[]){"cache", NULL}, NULL), 0);
  cr_assert(strstr(out, th_cache_dir()) && strstr(out, "entries:   1"), "%s", out);
  free(out);
  cr_assert_eq(run(&out, &len, (const char *const[]){"cache", "--clear", NULL}, NULL), 0);
  cr_assert(strstr(out, "removed 1 cache entry"), "%s", out);
  free(out);
  cr_assert_eq(ms_cache_usage(NULL, &cnt, &bytes), MS_OK);
  cr_assert_eq(cnt, 0);
  /* a cache directory that cannot be made: the command still answers */
  cr_assert_eq(run(&out, &len, (const char *const[]){"stats", p, NULL},
                   "XDG_CACHE_HOME=/proc/nonexistent"), 0);
  free(out);
}

/* ---- the stacks' coding (lib/cache/stackcode.c) ------------------------------------------- */

/* The stack frames section of idx[0..n) over nframes frames, through the writer. */
static unsigned char *sf_encode(const uint16_t *idx, size_t n, size_t nframes, size_t *len) {
  ms_snapshot_t s;
  memset(&s, 0, sizeof s);
  s.stack_frames16 = (uint16_t *)idx;
  s.nstack_frames = n;
  s.nframes = nframes;
  cache_out_t o = {.fd = -1};
  o.chunk = malloc(CACHE_SUM_CHUNK);
  cr_assert(o.chunk);
  bool nomem = false;
  cr_assert(ms__cache_w_stack_frames(&o, &s, &nomem));
  ms__cache_out_flush(&o);
  free(o.chunk);
  *len = o.mem_len;
  return o.mem;
}

/* Decodes a stack frames section at width 2; the refusal (NULL: accepted) and the indices. */
static const char *sf_decode(const unsigned char *p, size_t len, size_t nframes,
                             ms_snapshot_t *t) {
  memset(t, 0, sizeof *t);
  bool nomem = false;
  const char *why = ms__cache_r_stack_frames(p, len, 2, nframes, t, &nomem);
  cr_assert(!nomem);
  return why;
}

Test(cache, stack_frames_coded_exactly) {
  /* three stacks sharing their transitions: 0 1 2, 0 1 3, 0 1 2 3; and no index at all */
  static const uint16_t idx[] = {0, 1, 2, 0, 1, 3, 0, 1, 2, 3};
  size_t len;
  for (size_t n = 0; n <= 10; n += 10) {
    unsigned char *b = sf_encode(idx, n, 4, &len);
    ms_snapshot_t t;
    cr_assert_null(sf_decode(b, len, 4, &t));
    cr_assert_eq(t.nstack_frames, n);
    cr_assert(n == 0 || memcmp(t.stack_frames16, idx, sizeof idx) == 0);
    free(t.stack_frames16);
    free(b);
  }
  /* the exact bytes: N 10; the lists of frames 0..3 and of the start (values: index + 1, 0 the
   * end mark; most frequent first, then by value); the lengths of the four lanes (indices 0-1,
   * 2-4, 5-6, 7-9 and the end mark, each starting at the start); their ranks (none in a list of
   * one value) */
  unsigned char *b = sf_encode(idx, 10, 4, &len);
  static const unsigned char want[] = {10, 1, 2, 1, 3, 2, 1, 4, 2, 0, 1, 4, 1, 2,
                                       3,  4, 1, 2, 2, 3, 0, 2, 0, 3, 1, 1, 1, 0};
  cr_assert_eq(len, sizeof want);
  cr_assert(memcmp(b, want, len) == 0);
  free(b);
}

/* Indices as stacks make them: 2,000 stacks of 20 to 60 frames over 3,000 frames, each the
 * innermost frames of one of 40 paths then frames of their own (contexts with one value, with a
 * few and with hundreds), from a fixed seed. */
static uint16_t *sf_stacks(size_t *n) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  size_t cap = 2000 * 60, k = 0;
  uint16_t *idx = malloc(cap * sizeof *idx);
  cr_assert(idx);
  for (int st = 0; st < 2000; st++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    unsigned path = (unsigned)(x >> 33) % 40, depth = 20 + (unsigned)(x >> 45) % 41;
    for (unsigned f = 0; f < depth; f++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      idx[k++] = (uint16_t)(f < 12 ? path * 12 + f : 480 + (unsigned)(x >> 35) % 2520);
    }
  }
  *n = k;
  return idx;
}

Test(cache, stack_frames_threads) {
  /* the section's bytes do not depend on how many threads wrote its lanes, and read back */
  size_t n;
  uint16_t *idx = sf_stacks(&n);
  cr_assert_gt(n, 4096); /* the size at which the writer uses threads by itself */
  unsigned char *b[3];
  size_t len[3];
  static const unsigned threads[] = {1, 4, 0};
  for (int k = 0; k < 3; k++) {
    ms__cache_sc_threads = threads[k];
    b[k] = sf_encode(idx, n, 3000, &len[k]);
  }
  ms__cache_sc_threads = 0;
  for (int k = 1; k < 3; k++) {
    cr_assert_eq(len[k], len[0], "threads %u", threads[k]);
    cr_assert(memcmp(b[k], b[0], len[0]) == 0, "threads %u", threads[k]);
  }
  ms_snapshot_t t;
  cr_assert_null(sf_decode(b[0], len[0], 3000, &t));
  cr_assert_eq(t.nstack_frames, n);
  cr_assert(memcmp(t.stack_frames16, idx, n * sizeof *idx) == 0);
  free(t.stack_frames16);
  for (int k = 0; k < 3; k++) free(b[k]);
  free(idx);
}

Test(cache, stack_frames_hostile) {
  static const struct {
    unsigned char bytes[16];
    size_t len;
    const char *why;
  } cases[] = {
      /* 3 indices claimed by a section of 1 byte per 64 */
      {{0x80, 0x80, 0x01}, 3, "stack frames out of range"},
      /* a list cut short */
      {{1, 1}, 2, "stack frames cut short"},
      /* a value past 2^16 at width 2 (frame 65536) */
      {{1, 0, 1, 0x81, 0x80, 0x04}, 6, "stack frame index out of range"},
      /* one index, frame 0: the start's list has it, but frame 0 has no successors */
      {{1, 0, 1, 1, 0, 0, 0, 0}, 8, "a stack frame follows one that has no successors"},
      /* the start's list has two values; a rank of 5 */
      {{1, 0, 2, 1, 0, 0, 0, 0, 2, 5, 0}, 11, "stack frame rank out of range"},
      /* the end mark where an index should be */
      {{1, 1, 0, 1, 0, 0, 0, 0, 0}, 9, "stack frames end where they should not"},
      /* a lane longer than its indices */
      {{1, 1, 0, 1, 1, 0, 0, 0, 1, 7}, 10, "a lane of stack frames is longer than its frames"},
      /* bytes after the lanes that are not padding */
      {{1, 1, 0, 1, 1, 0, 0, 0, 0, 9}, 10, "stack frames section longer than its frames"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    ms_snapshot_t t;
    const char *why = sf_decode(cases[c].bytes, cases[c].len, 1, &t);
    cr_assert_str_eq(why ? why : "(accepted)", cases[c].why, "case %zu", c);
    free(t.stack_frames16);
  }
  /* stacks: a count past the section, a start past 2^32, trailing bytes */
  static const unsigned char st1[] = {3, 0, 1}, st2[] = {1, 0x80, 0x80, 0x80, 0x80, 0x20, 1},
                             st3[] = {1, 0, 1, 0};
  ms_snapshot_t t;
  memset(&t, 0, sizeof t);
  bool nomem = false;
  cr_assert_str_eq(ms__cache_r_stacks(st1, sizeof st1, &t, &nomem), "stacks out of range");
  cr_assert_str_eq(ms__cache_r_stacks(st2, sizeof st2, &t, &nomem), "stack out of range");
  free(t.stacks);
  memset(&t, 0, sizeof t);
  cr_assert_str_eq(ms__cache_r_stacks(st3, sizeof st3, &t, &nomem),
                   "stacks section longer than its stacks");
  free(t.stacks);
}

/* ---- the time index ------------------------------------------------------------------------ */

/* Asserts that two indexes of one snapshot answer alike: devices, entries, every series, and the
 * state (segments, blocks, totals) at several steps of each device. */
static void tl_expect_same(const ms_timeline_t *a, const ms_timeline_t *b) {
  cr_assert_eq(ms_timeline_ndevices(a), ms_timeline_ndevices(b));
  for (size_t d = 0; d < ms_timeline_ndevices(a); d++) {
    size_t n = ms_timeline_nentries(a, d);
    cr_assert_eq(n, ms_timeline_nentries(b, d));
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
      cr_assert(memcmp(ms_timeline_series(a, d, (ms_tl_metric)m),
                       ms_timeline_series(b, d, (ms_tl_metric)m), (n + 1) * sizeof(uint64_t)) == 0,
                "device %zu: series %d differs", d, m);
    const size_t steps[] = {0, n / 3, n / 2, n - n / 5, n};
    for (size_t k = 0; k < sizeof steps / sizeof *steps; k++) {
      ms_tl_state_t sa, sb;
      ms_timeline_state_init(&sa);
      ms_timeline_state_init(&sb);
      int ra = ms_timeline_state_at(a, d, steps[k], &sa);
      cr_assert_eq(ra, ms_timeline_state_at(b, d, steps[k], &sb));
      if (ra == MS_OK) {
        cr_assert_eq(sa.nsegments, sb.nsegments);
        cr_assert_eq(sa.nblocks, sb.nblocks);
        for (size_t i = 0; i < sa.nsegments; i++)
          cr_assert(sa.segments[i].address == sb.segments[i].address &&
                    sa.segments[i].size == sb.segments[i].size &&
                    sa.segments[i].stack == sb.segments[i].stack &&
                    sa.segments[i].snap_segment == sb.segments[i].snap_segment);
        for (size_t i = 0; i < sa.nblocks; i++)
          cr_assert(memcmp(&sa.blocks[i], &sb.blocks[i], offsetof(ms_tl_block_t, state)) == 0 &&
                        sa.blocks[i].state == sb.blocks[i].state &&
                        sa.blocks[i].flags == sb.blocks[i].flags,
                    "device %zu step %zu: block %zu differs", d, steps[k], i);
        cr_assert(memcmp(sa.totals, sb.totals, sizeof sa.totals) == 0);
      }
      ms_timeline_state_release(&sa);
      ms_timeline_state_release(&sb);
    }
  }
}

/* A read index keeps no series (issue #33): before any is made, its peaks over the whole trace
 * and over parts of it, and its totals at steps, are the built index's (b); none of these makes
 * a series. */
static void tl_expect_same_queries(const ms_timeline_t *a, const ms_timeline_t *b) {
  for (size_t d = 0; d < ms_timeline_ndevices(a); d++) {
    size_t n = ms_timeline_nentries(a, d);
    const size_t range[][2] = {{0, n}, {0, n / 2}, {n / 3, n - n / 5}, {n / 2, n / 2}, {n, n}};
    for (size_t k = 0; k < sizeof range / sizeof *range; k++) {
      ms_tl_peak_t pa[MS_TL_METRIC_COUNT], pb[MS_TL_METRIC_COUNT];
      cr_assert_eq(ms_timeline_peaks(a, d, range[k][0], range[k][1], pa), MS_OK);
      cr_assert_eq(ms_timeline_peaks(b, d, range[k][0], range[k][1], pb), MS_OK);
      cr_assert(memcmp(pa, pb, sizeof pa) == 0, "device %zu: peaks over [%zu, %zu] differ", d,
                range[k][0], range[k][1]);
      uint64_t ta[MS_TL_METRIC_COUNT], tb[MS_TL_METRIC_COUNT];
      cr_assert_eq(ms_timeline_totals_at(a, d, range[k][0], ta), MS_OK);
      cr_assert_eq(ms_timeline_totals_at(b, d, range[k][0], tb), MS_OK);
      cr_assert(memcmp(ta, tb, sizeof ta) == 0, "device %zu: totals at %zu differ", d,
                range[k][0]);
    }
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) cr_assert_null(a->dev[d].series[m]);
  }
}

/* A fixture loaded (flags), its index; false when the fixture is absent or its index fails. */
static bool fixture_index(const char *name, unsigned flags, const ms_timeline_config_t *cfg,
                          ms_snapshot_t **s, ms_timeline_t **tl) {
  char p[700];
  if (!fixture(name, p, sizeof p)) return false;
  cr_assert_eq(ms_snapshot_load_ex(p, flags, s, NULL), MS_OK, "%s", p);
  if (ms_timeline_create(*s, cfg, tl, NULL) == MS_OK) return true;
  ms_snapshot_free(*s);
  return false;
}

Test(cache, index_roundtrip_every_fixture) {
  if (!any_fixture()) return;
  ms_timeline_config_t filt;
  ms_timeline_config_init(&filt);
  filt.checkpoint_every = 64;
  filt.filter.has_pool = true; /* the default pool only */
  for (size_t i = 0; i < NFIX; i++) {
    for (size_t f = 0; f < sizeof flag_sets / sizeof *flag_sets; f++) {
      for (int c = 0; c < 2; c++) {
        const ms_timeline_config_t *cfg = c ? &filt : NULL;
        ms_snapshot_t *s = NULL;
        ms_timeline_t *tl = NULL, *back = NULL;
        if (!fixture_index(fixtures[i], flag_sets[f], cfg, &s, &tl)) continue;
        ms_cache_key_t key = {0x77, 1234, flag_sets[f]};
        void *buf;
        size_t len;
        cr_assert_eq(ms_cache_index_encode(tl, &key, &buf, &len), MS_OK);
        ms_errbuf_t eb = {{0}};
        cr_assert_eq(ms_cache_index_decode(buf, len, &key, true, s, cfg, &back, &eb), MS_OK,
                     "%s: %s", fixtures[i], eb.msg);
        tl_expect_same_queries(back, tl);
        tl_expect_same(tl, back);
        ms_timeline_destroy(back);
        back = NULL;
        /* another key, another configuration: misses */
        ms_cache_key_t other = key;
        other.flags ^= 1;
        cr_assert_eq(ms_cache_index_decode(buf, len, &other, true, s, cfg, &back, NULL),
                     MS_ENOTFOUND);
        cr_assert_eq(ms_cache_index_decode(buf, len, &key, true, s, c ? NULL : &filt, &back, NULL),
                     MS_ENOTFOUND);
        cr_assert_null(back);
        free(buf);
        ms_timeline_destroy(tl);
        ms_snapshot_free(s);
      }
    }
  }
}

Test(cache, index_of_another_snapshot_refused) {
  if (!any_fixture()) return;
  ms_snapshot_t *a = NULL, *b = NULL;
  ms_timeline_t *ta = NULL, *tb = NULL, *back = NULL;
  cr_assert(fixture_index(fixtures[0], 0, NULL, &a, &ta));
  cr_assert(fixture_index(fixtures[3], 0, NULL, &b, &tb));
  ms_cache_key_t key = {1, 2, 0};
  void *buf;
  size_t len;
  cr_assert_eq(ms_cache_index_encode(ta, &key, &buf, &len), MS_OK);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_cache_index_decode(buf, len, &key, true, b, NULL, &back, &eb), MS_EFORMAT);
  cr_assert(strstr(eb.msg, "cache index: ") == eb.msg, "%s", eb.msg);
  cr_assert_null(back);
  free(buf);
  ms_timeline_destroy(ta);
  ms_timeline_destroy(tb);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
}

/* The index entry of dir (the one whose name has a configuration tag "-t"), into path. */
static void index_entry(char *path, size_t cap) {
  DIR *d = opendir(th_cache_dir());
  cr_assert(d);
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || !strstr(e->d_name, "-t")) continue;
    snprintf(path, cap, "%s/%s", th_cache_dir(), e->d_name);
    n++;
  }
  closedir(d);
  cr_assert_eq(n, 1, "%d index entries", n);
}

/* Loads path and its index through the cache; asserts both outcomes and that the index answers as
 * one built from a plain load. */
static void index_expect(const char *path, ms_cache_outcome want_snap, ms_cache_outcome want_tl) {
  ms_snapshot_t *s = NULL;
  ms_cache_outcome oc;
  ms_cache_key_t key;
  cr_assert_eq(ms_cache_load_keyed(path, MS_LOAD_NO_FREE_STACKS, NULL, &s, &oc, &key, NULL), MS_OK);
  cr_assert_eq(oc, want_snap, "snapshot: outcome %d, not %d", oc, want_snap);
  cr_assert(key.hash || key.size);
  ms_timeline_t *tl = NULL, *plain = NULL;
  cr_assert_eq(ms_cache_timeline(&key, NULL, s, NULL, &tl, &oc, NULL), MS_OK);
  cr_assert_eq(oc, want_tl, "index: outcome %d, not %d", oc, want_tl);
  cr_assert_eq(ms_timeline_create(s, NULL, &plain, NULL), MS_OK);
  tl_expect_same(plain, tl);
  ms_timeline_destroy(tl);
  ms_timeline_destroy(plain);
  ms_snapshot_free(s);
}

Test(cache, index_stored_hit_and_damaged) {
  if (!any_fixture()) return;
  char p[700], entry[1200];
  cr_assert(fixture(fixtures[0], p, sizeof p));
  index_expect(p, MS_CACHE_STORED, MS_CACHE_STORED);
  index_expect(p, MS_CACHE_HIT, MS_CACHE_HIT);
  index_entry(entry, sizeof entry);
  size_t len;
  char *e = th_read_file(entry, &len);
  cr_assert(e);
  /* no key: the index is built, nothing stored */
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms_snapshot_load_ex(p, MS_LOAD_NO_FREE_STACKS, &s, NULL), MS_OK);
  ms_timeline_t *tl = NULL;
  ms_cache_outcome oc;
  cr_assert_eq(ms_cache_timeline(NULL, NULL, s, NULL, &tl, &oc, NULL), MS_OK);
  cr_assert_eq(oc, MS_CACHE_BYPASSED);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
  /* truncated at every offset: refused by the reader; through the cache rebuilt, then hit */
  ms_cache_key_t key;
  cr_assert_eq(ms_cache_load_keyed(p, MS_LOAD_NO_FREE_STACKS, NULL, &s, NULL, &key, NULL), MS_OK);
  for (size_t cut = 0; cut < len; cut++) {
    cr_assert_neq(ms_cache_index_decode(e, cut, &key, true, s, NULL, &tl, NULL), MS_OK, "%zu", cut);
    cr_assert_neq(ms_cache_index_decode(e, cut, &key, false, s, NULL, &tl, NULL), MS_OK, "%zu", cut);
  }
  ms_snapshot_free(s);
  for (size_t cut = 0; cut < len; cut += len / 7 + 1) {
    cr_assert_eq(th_write_file(entry, e, cut), 0);
    index_expect(p, MS_CACHE_HIT, MS_CACHE_STORED);
    index_expect(p, MS_CACHE_HIT, MS_CACHE_HIT);
  }
  /* random bytes after a valid header: rebuilt */
  unsigned seed = 99;
  for (size_t i = 96; i < len; i++) e[i] ^= (char)rand_r(&seed);
  cr_assert_eq(th_write_file(entry, e, len), 0);
  index_expect(p, MS_CACHE_HIT, MS_CACHE_STORED);
  free(e);
}

Test(cache, index_every_byte_flipped) {
  if (!any_fixture()) return;
  ms_snapshot_t *s = NULL;
  ms_timeline_t *tl = NULL;
  ms_timeline_config_t cfg; /* a checkpoint every 4 entries: many to damage */
  ms_timeline_config_init(&cfg);
  cfg.checkpoint_every = 4;
  cr_assert(fixture_index("a0kuma_adamw_small.pickle", 0, &cfg, &s, &tl));
  cr_assert_gt(ms_timeline_nentries(tl, 0), 30);
  ms_cache_key_t key = {5, 6, 0};
  void *buf;
  size_t len;
  cr_assert_eq(ms_cache_index_encode(tl, &key, &buf, &len), MS_OK);
  char *r = malloc(len);
  cr_assert(r);
  unsigned seed = 4321;
  size_t accepted = 0;
  for (size_t i = 0; i < len; i++) {
    memcpy(r, buf, len);
    r[i] ^= (char)(1 + rand_r(&seed) % 255);
    ms_timeline_t *back = NULL;
    cr_assert_neq(ms_cache_index_decode(r, len, &key, true, s, &cfg, &back, NULL), MS_OK, "%zu", i);
    if (ms_cache_index_decode(r, len, &key, false, s, &cfg, &back, NULL) != MS_OK) continue;
    /* accepted without the checksums: whatever it answers, its readers do not crash */
    accepted++;
    for (size_t d = 0; d < ms_timeline_ndevices(back); d++) {
      size_t n = ms_timeline_nentries(back, d);
      for (size_t st = 0; st <= n; st += n / 4 + 1) {
        ms_snapshot_t *at = NULL;
        if (ms_timeline_snapshot_at(back, d, st, NULL, &at) == MS_OK) ms_snapshot_free(at);
      }
      ms_tl_peak_t pk;
      (void)!ms_timeline_peak(back, d, MS_TL_ALLOCATED, 0, n, &pk);
    }
    ms_timeline_destroy(back);
  }
  cr_log_info("%zu of %zu changed bytes accepted without the checksums", accepted, len);
  free(r);
  free(buf);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

/* A checkpoint whose totals are not those the entries' stream sums to is refused: the reader
 * keeps no series, and checks each checkpoint against the stream read again. */
Test(cache, index_checkpoint_totals_refused) {
  if (!any_fixture()) return;
  ms_snapshot_t *s = NULL;
  ms_timeline_t *tl = NULL;
  ms_timeline_config_t cfg;
  ms_timeline_config_init(&cfg);
  cfg.checkpoint_every = 4;
  cr_assert(fixture_index("a0kuma_adamw_small.pickle", 0, &cfg, &s, &tl));
  ms_cache_key_t key = {5, 6, 0};
  void *buf;
  size_t len;
  cr_assert_eq(ms_cache_index_encode(tl, &key, &buf, &len), MS_OK);
  const tl_dev_t *d = &tl->dev[0];
  cr_assert_geq(d->ckpts.len, 1);
  for (size_t c = 0; c < d->ckpts.len; c += c + 1 < d->ckpts.len - 1 ? d->ckpts.len - 1 - c : 1) {
    const tl_ckpt_t *ck = &d->ckpts.ptr[c]; /* the first and the last */
    uint64_t head[7] = {ck->step, ck->nsegs, ck->nblocks};
    memcpy(head + 3, ck->totals, sizeof ck->totals);
    unsigned char want[56];
    for (int k = 0; k < 56; k++) want[k] = (unsigned char)(head[k / 8] >> (8 * (k % 8)));
    size_t at = SIZE_MAX;
    for (size_t o = 96; o + sizeof want <= len && at == SIZE_MAX; o += 8)
      if (memcmp((char *)buf + o, want, sizeof want) == 0) at = o;
    cr_assert_neq(at, SIZE_MAX, "checkpoint %zu found in the file", c);
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
      char *r = malloc(len);
      cr_assert(r);
      memcpy(r, buf, len);
      r[at + 24 + 8 * m] ^= 0x40;
      ms_timeline_t *back = NULL;
      ms_errbuf_t eb = {{0}};
      cr_assert_eq(ms_cache_index_decode(r, len, &key, false, s, &cfg, &back, &eb), MS_EFORMAT);
      cr_assert(strstr(eb.msg, "a checkpoint's totals are not the series'"), "%s", eb.msg);
      cr_assert_null(back);
      free(r);
    }
  }
  free(buf);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

/* The entries' stream (lib/cache/index.c): a code word of an unknown kind, a pair that names no
 * entry, and a pair said to be named by an earlier entry that named none are refused, each with
 * its message and the offset of the entry. */
Test(cache, index_entry_codes_refused) {
  if (!any_fixture()) return;
  ms_snapshot_t *s = NULL;
  ms_timeline_t *tl = NULL;
  cr_assert(fixture_index("a0kuma_adamw_small.pickle", 0, NULL, &s, &tl));
  size_t n = ms_timeline_nentries(tl, 0);
  cr_assert(n > 30 && n < 8192);
  ms_cache_key_t key = {5, 6, 0};
  void *buf;
  size_t len;
  cr_assert_eq(ms_cache_index_encode(tl, &key, &buf, &len), MS_OK);
  enum { FIRST = 96 + 16 + 32 }; /* the header, device 0's counts and first values */
  unsigned char bad_at[] = {2, 0, (unsigned char)(2 * n | 0x80), (unsigned char)(2 * n >> 7)};
  const struct {
    const unsigned char *bytes;
    size_t len;
    const char *msg;
  } cases[] = {
      {(const unsigned char *)"\x00\x80", 2,
       "cache index: an entry has an unknown code (offset 144)"},
      {(const unsigned char *)"\x03\x00", 2,
       "cache index: an entry has an unknown code (offset 144)"},
      {(const unsigned char *)"\x01\x00", 2,
       "cache index: an entry's pair was named by no earlier entry (offset 144)"},
      {bad_at, sizeof bad_at, "cache index: a pair names no entry of its device (offset 144)"},
  };
  unsigned char *r = malloc(len);
  cr_assert(r);
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    memcpy(r, buf, len);
    memcpy(r + FIRST, cases[c].bytes, cases[c].len);
    ms_timeline_t *back = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_cache_index_decode(r, len, &key, false, s, NULL, &back, &eb), MS_EFORMAT,
                 "case %zu", c);
    cr_assert_str_eq(eb.msg, cases[c].msg);
    cr_assert_null(back);
  }
  free(r);
  free(buf);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

/* A checkpoint's segments (lib/cache/index.c): with no trace, device 0's only checkpoint follows
 * its counts at once, its segments' records at offset 200; an unknown flag and a snapshot segment
 * past the snapshot's are refused, each with its message. */
Test(cache, index_segment_codes_refused) {
  if (!any_fixture()) return;
  ms_snapshot_t *s = NULL;
  ms_timeline_t *tl = NULL;
  cr_assert(fixture_index("a0kuma_adamw_small.pickle", MS_LOAD_NO_TRACE, NULL, &s, &tl));
  cr_assert_eq(ms_timeline_nentries(tl, 0), 0);
  ms_cache_key_t key = {5, 6, MS_LOAD_NO_TRACE};
  void *buf;
  size_t len;
  cr_assert_eq(ms_cache_index_encode(tl, &key, &buf, &len), MS_OK);
  const struct {
    unsigned char bytes[3];
    const char *msg;
  } cases[] = {
      {{0x80, 0, 0}, "cache index: a segment has unknown flags (offset 200)"},
      {{0, 0xfe, 0x7f}, "cache index: a segment names no segment of the snapshot (offset 200)"},
  };
  unsigned char *r = malloc(len);
  cr_assert(r && len > 203);
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    memcpy(r, buf, len);
    memcpy(r + 200, cases[c].bytes, 3);
    ms_timeline_t *back = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_cache_index_decode(r, len, &key, false, s, NULL, &back, &eb), MS_EFORMAT);
    cr_assert_str_eq(eb.msg, cases[c].msg);
    cr_assert_null(back);
  }
  free(r);
  free(buf);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

/* ---- blobs: the pages of `memsnap view` ----------------------------------------------------- */

Test(cache, blob_format) {
  const char body[] = "<html>a page</html>";
  ms_cache_key_t key = {7, 8, 0}, other = {7, 9, 0};
  void *buf;
  size_t len;
  cr_assert_eq(ms_cache_blob_encode(&key, 42, body, sizeof body, &buf, &len), MS_OK);
  const void *d;
  size_t n;
  cr_assert_eq(ms_cache_blob_decode(buf, len, &key, 42, true, &d, &n, NULL), MS_OK);
  cr_assert(n == sizeof body && memcmp(d, body, n) == 0);
  cr_assert_eq(ms_cache_blob_decode(buf, len, NULL, 0, true, &d, &n, NULL), MS_OK);
  cr_assert_eq(ms_cache_blob_decode(buf, len, &key, 43, true, &d, &n, NULL), MS_ENOTFOUND);
  cr_assert_eq(ms_cache_blob_decode(buf, len, &other, 42, true, &d, &n, NULL), MS_ENOTFOUND);
  for (size_t cut = 0; cut < len; cut++) {
    cr_assert_neq(ms_cache_blob_decode(buf, cut, &key, 42, false, &d, &n, NULL), MS_OK, "%zu",
                  cut);
    cr_assert_null(d);
  }
  char *r = malloc(len);
  cr_assert(r);
  for (size_t i = 0; i < len; i++) {
    memcpy(r, buf, len);
    r[i] ^= 0x20;
    cr_assert_neq(ms_cache_blob_decode(r, len, &key, 42, true, &d, &n, NULL), MS_OK, "%zu", i);
  }
  free(r);
  free(buf);
  /* through the directory: stored, written to a sink, another tag a miss */
  cr_assert_eq(ms_cache_blob_put(&key, 42, NULL, body, sizeof body), MS_OK);
  th_memsink_t mb;
  ms_sink_t sink;
  th_memsink_init(&sink, &mb);
  cr_assert_eq(ms_cache_blob_get(&key, 42, NULL, &sink), MS_OK);
  cr_assert(mb.len == sizeof body && memcmp(mb.data, body, mb.len) == 0);
  cr_assert_eq(ms_cache_blob_get(&key, 41, NULL, &sink), MS_ENOTFOUND);
  cr_assert_eq(ms_cache_blob_put(&(ms_cache_key_t){0, 0, 0}, 42, NULL, body, 1), MS_EINVAL);
  th_memsink_free(&mb);
}

/* The entry of dir whose name holds part, into path (exactly one). */
static void entry_with(const char *part, char *path, size_t cap) {
  DIR *d = opendir(th_cache_dir());
  cr_assert(d);
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || !strstr(e->d_name, part)) continue;
    snprintf(path, cap, "%s/%s", th_cache_dir(), e->d_name);
    n++;
  }
  closedir(d);
  cr_assert_eq(n, 1, "%d entries with '%s'", n, part);
}

Test(cache, view_page_stored_served_and_rebuilt) {
  if (!any_fixture()) return;
  char p[700], page[1200];
  cr_assert(fixture(fixtures[3], p, sizeof p));
  const char *args[] = {"view", p, "-o", "out.file", "-q", NULL};
  const char *plain_args[] = {"view", p, "-o", "out.file", "-q", "--no-cache", NULL};
  char *plain, *out;
  size_t lp, lo;
  cr_assert_eq(run(&plain, &lp, plain_args, NULL), 0);
  cr_assert_eq(run(&out, &lo, args, NULL), 0);
  cr_assert(lo == lp && memcmp(out, plain, lp) == 0);
  free(out);
  entry_with("-p", page, sizeof page);
  /* view stores its page, not its snapshot */
  char part[32];
  snprintf(part, sizeof part, "-v%u.msc", MS_CACHE_VERSION);
  DIR *dd = opendir(th_cache_dir());
  struct dirent *de;
  while ((de = readdir(dd)) != NULL) cr_assert_null(strstr(de->d_name, part), "%s", de->d_name);
  closedir(dd);
  /* the stored page is what a second view writes: another page filed under its key and tag
   * comes out as it is */
  ms_cache_key_t key = {0, 0, 0};
  cr_assert_eq(ms_cache_hash_file(p, &key.hash, &key.size), MS_OK);
  /* the tag from the entry's own name: the test directory's random name may hold "-p" too */
  unsigned long long tag = strtoull(strstr(strrchr(page, '/'), "-p") + 2, NULL, 16);
  const char forged[] = "a page of the cache";
  cr_assert_eq(ms_cache_blob_put(&key, tag, NULL, forged, sizeof forged - 1), MS_OK);
  cr_assert_eq(run(&out, &lo, args, NULL), 0);
  cr_assert(lo == sizeof forged - 1 && memcmp(out, forged, lo) == 0, "%.*s", (int)lo, out);
  free(out);
  cr_assert_eq(unlink(page), 0);
  cr_assert_eq(run(&out, &lo, args, NULL), 0);
  cr_assert(lo == lp && memcmp(out, plain, lp) == 0);
  free(out);
  /* a damaged page: written anew, the same bytes, and stored again */
  size_t len;
  char *e = th_read_file(page, &len);
  cr_assert(e);
  for (size_t cut = 0; cut <= len; cut += len / 5 + 1) {
    if (cut < len) e[cut] ^= 1;
    cr_assert_eq(th_write_file(page, e, cut < len ? len : len - 1), 0);
    cr_assert_eq(run(&out, &lo, args, NULL), 0);
    cr_assert(lo == lp && memcmp(out, plain, lp) == 0, "damaged at %zu", cut);
    free(out);
    if (cut < len) e[cut] ^= 1;
    char *again = th_read_file(page, &lo);
    cr_assert(again && lo == len && memcmp(again, e, len) == 0, "not rebuilt after %zu", cut);
    free(again);
  }
  free(e);
  free(plain);
  /* other options: another page */
  const char *dev[] = {"view", p, "-o", "out.file", "-q", "--view", "segments", NULL};
  cr_assert_eq(run(&out, &lo, dev, NULL), 0);
  free(out);
  size_t cnt;
  uint64_t bytes;
  cr_assert_eq(ms_cache_usage(NULL, &cnt, &bytes), MS_OK);
  dd = opendir(th_cache_dir());
  int pages = 0;
  while ((de = readdir(dd)) != NULL) pages += strstr(de->d_name, "-p") != NULL;
  closedir(dd);
  cr_assert_eq(pages, 2);
}
