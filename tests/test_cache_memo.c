/* SPDX-License-Identifier: MIT
 * The cache's hash memo (lib/cache/statmemo.c): a file's content hash recalled from its identity
 * when the file is the one hashed then, never when it changed (even with the same size and
 * modification time), never for a file whose times are too recent, never from a memo that fails
 * its checks, and neither read nor written with the cache turned off.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/internal.h"
#include "helpers.h"
#include "memsnap/cache.h"

TestSuite(cache_memo, .init = th_cache_setup, .fini = th_cache_teardown, .timeout = 120);

/* A file of n bytes filled from seed, at th_cache_tmp/name; its path in path. */
static void make_file(const char *name, size_t n, unsigned seed, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", th_cache_tmp, name);
  char *b = malloc(n);
  cr_assert(b);
  for (size_t i = 0; i < n; i++) b[i] = (char)(seed * 2654435761u + i * 40503u);
  cr_assert_eq(th_write_file(path, b, n), 0);
  free(b);
}

/* The hash of path's content, computed with the memo out of the way. */
static uint64_t true_hash(const char *path) {
  setenv("MEMSNAP_CACHE", "0", 1);
  uint64_t h = 0, size = 0;
  cr_assert_eq(ms_cache_hash_file(path, &h, &size), MS_OK);
  unsetenv("MEMSNAP_CACHE");
  return h;
}

static void memo_path(const char *path, char *out, size_t cap) {
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(ms__cache_memo_path(th_cache_dir(), &st, out, cap), MS_OK);
}

static bool trusted(const char *path) {
  int fd = open(path, O_RDONLY);
  cr_assert(fd >= 0);
  bool t = ms__cache_memo_trusted_fs(fd);
  close(fd);
  if (!t) cr_log_info("SKIP: %s is on a file system whose change times are not trusted", path);
  return t;
}

/* Waits until path's times are settled (the memo's guard), as a file copied in a while ago is. */
static void settle(const char *path) {
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  while (!ms__cache_memo_settled(&st, (int64_t)time(NULL))) usleep(100 * 1000);
}

/* Files a memo for path (its identity now) giving hash. */
static void forge(const char *path, uint64_t hash) {
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  ms__cache_memo_t m;
  ms__cache_memo_of(&st, hash, &m);
  unsigned char b[MS_CACHE_MEMO_LEN];
  ms__cache_memo_encode(&m, b);
  char mp[1200];
  memo_path(path, mp, sizeof mp);
  cr_assert_eq(mkdir(th_cache_dir(), 0700) == 0 || errno == EEXIST, 1);
  cr_assert_eq(th_write_file(mp, b, sizeof b), 0);
}

static uint64_t hash_of(const char *path) {
  uint64_t h = 0, size = 0;
  cr_assert_eq(ms_cache_hash_file(path, &h, &size), MS_OK);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(size, (uint64_t)st.st_size);
  return h;
}

/* A settled file (make_file, then settle) and its hash (remembered by that first hash); false,
 * the test skipped, on a file system whose change times are not trusted. */
static bool settled_file(const char *name, size_t n, unsigned seed, char *path, size_t cap,
                         uint64_t *h) {
  make_file(name, n, seed, path, cap);
  if (!trusted(path)) return false;
  settle(path);
  *h = hash_of(path);
  return true;
}

Test(cache_memo, remembered_once_settled_and_used_without_reading) {
  char p[700], mp[1200];
  make_file("a.bin", 300000, 1, p, sizeof p);
  if (!trusted(p)) return;
  uint64_t h = true_hash(p);
  memo_path(p, mp, sizeof mp);
  /* a file written just now: hashed, not remembered */
  cr_assert_eq(hash_of(p), h);
  cr_assert_neq(access(mp, F_OK), 0, "a memo of a file whose times are not settled");
  settle(p);
  cr_assert_eq(hash_of(p), h);
  size_t len = 0;
  char *b = th_read_file(mp, &len);
  cr_assert(b);
  cr_assert_eq(len, MS_CACHE_MEMO_LEN);
  ms__cache_memo_t m, want;
  cr_assert_eq(ms__cache_memo_decode(b, len, &m), MS_OK);
  free(b);
  struct stat st;
  cr_assert_eq(stat(p, &st), 0);
  ms__cache_memo_of(&st, h, &want);
  cr_assert(ms__cache_memo_same(&m, &want));
  cr_assert_eq(m.hash, h);
  /* the memo is what answers: a memo giving another hash is believed while the file is the same */
  forge(p, h ^ 0x5a5a);
  cr_assert_eq(hash_of(p), h ^ 0x5a5a);
  /* ... and neither read nor written with the cache turned off */
  setenv("MEMSNAP_CACHE", "0", 1);
  cr_assert_eq(hash_of(p), h);
  unsetenv("MEMSNAP_CACHE");
  cr_assert_eq(hash_of(p), h ^ 0x5a5a);
}

Test(cache_memo, a_file_rewritten_with_its_size_and_mtime_is_hashed_again) {
  char p[700], q[700];
  uint64_t h = 0;
  if (!settled_file("a.bin", 200000, 1, p, sizeof p, &h)) return;
  forge(p, h ^ 1); /* what a stale memo would answer */
  struct stat before;
  cr_assert_eq(stat(p, &before), 0);
  /* other bytes, the same size, the modification time put back: only the change time moved */
  make_file("b.bin", 200000, 2, q, sizeof q);
  size_t len;
  char *b = th_read_file(q, &len);
  int fd = open(p, O_WRONLY);
  cr_assert(fd >= 0);
  cr_assert_eq(pwrite(fd, b, len, 0), (ssize_t)len);
  close(fd);
  free(b);
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  cr_assert_eq(utimensat(AT_FDCWD, p, times, 0), 0);
  struct stat after;
  cr_assert_eq(stat(p, &after), 0);
  cr_assert_eq(after.st_size, before.st_size);
  cr_assert_eq(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  cr_assert_eq(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  uint64_t now = hash_of(p);
  cr_assert_eq(now, true_hash(q));
  cr_assert_neq(now, h);
  cr_assert_neq(now, h ^ 1);
}

Test(cache_memo, another_file_in_its_place_is_hashed_again) {
  char p[700], q[700];
  uint64_t h = 0;
  if (!settled_file("a.bin", 100000, 1, p, sizeof p, &h)) return;
  forge(p, h ^ 1);
  make_file("b.bin", 100000, 3, q, sizeof q);
  cr_assert_eq(rename(q, p), 0); /* another inode under the same name */
  cr_assert_eq(hash_of(p), true_hash(p));
  cr_assert_neq(hash_of(p), h ^ 1);
}

Test(cache_memo, a_memo_it_refuses_is_never_trusted_and_is_written_anew) {
  char p[700], mp[1200];
  uint64_t h = 0;
  if (!settled_file("a.bin", 50000, 4, p, sizeof p, &h)) return;
  memo_path(p, mp, sizeof mp);
  size_t len = 0;
  unsigned char *good = (unsigned char *)th_read_file(mp, &len);
  cr_assert(good && len == MS_CACHE_MEMO_LEN);
  /* a forged hash in a memo damaged in any other way: the true hash, and the memo rebuilt */
  struct stat st;
  cr_assert_eq(stat(p, &st), 0);
  ms__cache_memo_t m;
  ms__cache_memo_of(&st, h ^ 7, &m);
  unsigned char forged[MS_CACHE_MEMO_LEN];
  ms__cache_memo_encode(&m, forged);
  for (size_t cut = 0; cut <= MS_CACHE_MEMO_LEN; cut++) {
    cr_assert_eq(th_write_file(mp, forged, cut), 0);
    if (cut == MS_CACHE_MEMO_LEN) break; /* whole: the flips below start from it */
    cr_assert_eq(hash_of(p), h, "cut at %zu", cut);
    size_t l2;
    char *again = th_read_file(mp, &l2);
    cr_assert(again && l2 == len && memcmp(again, good, len) == 0, "not rebuilt after %zu", cut);
    free(again);
  }
  for (size_t i = 0; i < MS_CACHE_MEMO_LEN; i++)
    for (unsigned bit = 0; bit < 8; bit += 3) {
      forged[i] ^= (unsigned char)(1u << bit);
      cr_assert_eq(th_write_file(mp, forged, sizeof forged), 0);
      uint64_t got = hash_of(p);
      /* a flip in the identity is another file's memo, anywhere else a refused one */
      cr_assert_eq(got, h, "byte %zu bit %u", i, bit);
      forged[i] ^= (unsigned char)(1u << bit);
    }
  /* too long, random bytes */
  unsigned char big[MS_CACHE_MEMO_LEN + 1];
  memcpy(big, forged, sizeof forged);
  big[MS_CACHE_MEMO_LEN] = 0;
  cr_assert_eq(th_write_file(mp, big, sizeof big), 0);
  cr_assert_eq(hash_of(p), h);
  srand(7);
  for (int k = 0; k < 200; k++) {
    unsigned char r[MS_CACHE_MEMO_LEN];
    for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)rand();
    cr_assert_eq(th_write_file(mp, r, sizeof r), 0);
    cr_assert_eq(hash_of(p), h);
  }
  /* a directory where the memo goes: hashed, no memo, no crash */
  cr_assert_eq(unlink(mp), 0);
  cr_assert_eq(mkdir(mp, 0700), 0);
  cr_assert_eq(hash_of(p), h);
  cr_assert_eq(rmdir(mp), 0);
  free(good);
}

Test(cache_memo, decode_table) {
  ms__cache_memo_t m = {1, 2, 3, 4, 5, 6, 7, 0x1122334455667788ULL}, back;
  unsigned char b[MS_CACHE_MEMO_LEN];
  ms__cache_memo_encode(&m, b);
  cr_assert_eq(ms__cache_memo_decode(b, sizeof b, &back), MS_OK);
  cr_assert(ms__cache_memo_same(&m, &back));
  cr_assert_eq(back.hash, m.hash);
  cr_assert_eq(ms__cache_memo_decode(b, sizeof b - 1, &back), MS_ETRUNCATED);
  cr_assert_eq(ms__cache_memo_decode(b, 0, &back), MS_ETRUNCATED);
  unsigned char c[MS_CACHE_MEMO_LEN];
  memcpy(c, b, sizeof c);
  c[0] ^= 1;
  cr_assert_eq(ms__cache_memo_decode(c, sizeof c, &back), MS_EFORMAT); /* magic */
  memcpy(c, b, sizeof c);
  c[8] ^= 1;
  cr_assert_eq(ms__cache_memo_decode(c, sizeof c, &back), MS_EVERSION);
  memcpy(c, b, sizeof c);
  c[80] = 1;
  cr_assert_eq(ms__cache_memo_decode(c, sizeof c, &back), MS_EFORMAT); /* reserved, checksummed */
  memcpy(c, b, sizeof c);
  c[72] ^= 1;
  cr_assert_eq(ms__cache_memo_decode(c, sizeof c, &back), MS_EFORMAT); /* checksum */
  /* settled: both times at least two seconds before the hashing started */
  struct stat st;
  memset(&st, 0, sizeof st);
  st.st_mtim.tv_sec = 100;
  st.st_ctim.tv_sec = 100;
  cr_assert(ms__cache_memo_settled(&st, 102));
  cr_assert_not(ms__cache_memo_settled(&st, 101));
  st.st_ctim.tv_sec = 101;
  cr_assert_not(ms__cache_memo_settled(&st, 102));
}

Test(cache_memo, cleared_with_the_cache_and_not_counted_as_entries) {
  char p[700], mp[1200];
  uint64_t h = 0;
  if (!settled_file("a.bin", 10000, 5, p, sizeof p, &h)) return;
  memo_path(p, mp, sizeof mp);
  cr_assert_eq(access(mp, F_OK), 0);
  size_t n = 9;
  uint64_t bytes = 9;
  cr_assert_eq(ms_cache_usage(NULL, &n, &bytes), MS_OK);
  cr_assert_eq(n, 0);
  cr_assert_eq(bytes, 0);
  size_t removed = 0;
  cr_assert_eq(ms_cache_clear(NULL, &removed), MS_OK);
  cr_assert_eq(removed, 0); /* entries removed: a memo is none */
  cr_assert_neq(access(mp, F_OK), 0);
  /* a bound of nothing evicts it too */
  cr_assert_eq(hash_of(p), h);
  cr_assert_eq(access(mp, F_OK), 0);
  cr_assert_eq(ms_cache_evict(NULL, 0), MS_OK);
  cr_assert_neq(access(mp, F_OK), 0);
}

Test(cache_memo, warm_cli_answers_from_the_memo) {
  char p[700];
  snprintf(p, sizeof p, "%s/a0kuma_adamw_small.pickle", th_fixture_dir());
  if (access(p, R_OK) != 0) {
    cr_log_info("SKIP: no PyTorch fixtures in %s", th_fixture_dir());
    return;
  }
  /* a copy of its own, settled, then `stats` twice: the second from the entry the first stored,
   * its key from the memo; the answer the same as without the cache */
  char q[700], cmd[4400];
  snprintf(q, sizeof q, "%s/s.pickle", th_cache_tmp);
  size_t len;
  char *b = th_read_file(p, &len);
  cr_assert(b);
  cr_assert_eq(th_write_file(q, b, len), 0);
  free(b);
  if (!trusted(q)) return;
  settle(q);
  const char *bin = getenv("MEMSNAP_BIN");
  char outs[3][800];
  for (int i = 0; i < 3; i++) {
    snprintf(outs[i], sizeof outs[i], "%s/out%d", th_cache_tmp, i);
    snprintf(cmd, sizeof cmd, "%s '%s' stats '%s' > '%s' 2>&1", i == 0 ? "MEMSNAP_CACHE=0" : "",
             bin && *bin ? bin : MS_TEST_BINARY_DIR "/bin/memsnap", q, outs[i]);
    cr_assert_eq(system(cmd), 0);
  }
  char mp[1200];
  memo_path(q, mp, sizeof mp);
  cr_assert_eq(access(mp, F_OK), 0);
  size_t l0, l2;
  char *o0 = th_read_file(outs[0], &l0), *o2 = th_read_file(outs[2], &l2);
  cr_assert(o0 && o2 && l0 == l2 && memcmp(o0, o2, l0) == 0);
  free(o0);
  free(o2);
}
