/* SPDX-License-Identifier: MIT
 * memsnap cache: the cache directory (memsnap/cache.h). Keys (a content hash computed by several
 * threads), entries named after their key, atomic writes (a temporary file renamed over the
 * entry, without fsync: a cache entry lost in a crash is rebuilt, and a torn one fails its
 * checksum), LRU eviction by mtime (a hit touches its entry), and ms_cache_load.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/internal.h"
#include "common/internal.h"
#include "memsnap/cache.h"
#include "memsnap/serialize.h"

#define CACHE_DEFAULT_MAX ((uint64_t)4 << 30)
#define HASH_CHUNK ((uint64_t)64 << 20) /* the unit of the content hash's parallel work */
#define HASH_READ ((size_t)1 << 20)
#define ENTRY_SUFFIX ".msc"
#define TEMP_PREFIX ".tmp-"

/* ---- settings ------------------------------------------------------------------------------- */

int ms_cache_dir(char *buf, size_t cap) {
  const char *x = getenv("XDG_CACHE_HOME");
  int n;
  if (x && x[0] == '/') {
    n = snprintf(buf, cap, "%s/memsnap", x);
  } else {
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') return MS_ENOTFOUND;
    n = snprintf(buf, cap, "%s/.cache/memsnap", home);
  }
  return n < 0 || (size_t)n >= cap ? MS_ELIMIT : MS_OK;
}

bool ms_cache_env_enabled(void) {
  const char *v = getenv("MEMSNAP_CACHE");
  if (!v) return true;
  return !(strcmp(v, "0") == 0 || strcmp(v, "off") == 0 || strcmp(v, "no") == 0 ||
           strcmp(v, "false") == 0);
}

uint64_t ms_cache_max_bytes(void) {
  const char *v = getenv("MEMSNAP_CACHE_MAX");
  if (!v || !*v) return CACHE_DEFAULT_MAX;
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno || end == v) return CACHE_DEFAULT_MAX;
  unsigned sh = 0;
  if (*end == 'K' || *end == 'k') sh = 10, end++;
  else if (*end == 'M' || *end == 'm') sh = 20, end++;
  else if (*end == 'G' || *end == 'g') sh = 30, end++;
  if (*end || (sh && n > (UINT64_MAX >> sh))) return CACHE_DEFAULT_MAX;
  return (uint64_t)n << sh;
}

/* ---- the content hash ----------------------------------------------------------------------- */

typedef struct hash_job_s {
  int fd;
  uint64_t size, nchunks;
  uint64_t *sums;
  pthread_mutex_t lock;
  uint64_t next;
  int failed;
} hash_job_t;

static void *hash_worker(void *arg) {
  hash_job_t *j = arg;
  unsigned char *buf = malloc(HASH_READ);
  if (!buf) {
    pthread_mutex_lock(&j->lock);
    j->failed = 1;
    pthread_mutex_unlock(&j->lock);
    return NULL;
  }
  for (;;) {
    pthread_mutex_lock(&j->lock);
    uint64_t c = j->next++;
    int stop = j->failed || c >= j->nchunks;
    pthread_mutex_unlock(&j->lock);
    if (stop) break;
    uint64_t off = c * HASH_CHUNK, end = off + HASH_CHUNK < j->size ? off + HASH_CHUNK : j->size;
    uint64_t h = 0x63686e6b ^ c;
    /* mapped: the page cache's pages are read in place, not copied (a fifth of a warm run's
     * time on a 1 GB file); the same 1 MiB pieces as the reads below, so the same hash */
    void *m = mmap(NULL, (size_t)(end - off), PROT_READ, MAP_PRIVATE | MAP_POPULATE, j->fd,
                   (off_t)off);
    if (m != MAP_FAILED) {
      for (uint64_t p = off; p < end; p += HASH_READ) {
        size_t want = end - p < HASH_READ ? (size_t)(end - p) : HASH_READ;
        h = ms_hash_step(h, cache_sum((const unsigned char *)m + (p - off), want, p));
      }
      munmap(m, (size_t)(end - off));
      off = end;
    }
    while (off < end) {
      size_t want = end - off < HASH_READ ? (size_t)(end - off) : HASH_READ;
      ssize_t got = pread(j->fd, buf, want, (off_t)off);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        pthread_mutex_lock(&j->lock);
        j->failed = 1;
        pthread_mutex_unlock(&j->lock);
        break;
      }
      h = ms_hash_step(h, cache_sum(buf, (size_t)got, off));
      off += (uint64_t)got;
    }
    j->sums[c] = h;
  }
  free(buf);
  return NULL;
}

static int hash_fd(int fd, uint64_t size, uint64_t *hash) {
  hash_job_t j = {.fd = fd, .size = size, .nchunks = (size + HASH_CHUNK - 1) / HASH_CHUNK};
  j.sums = calloc(j.nchunks ? j.nchunks : 1, sizeof *j.sums);
  if (!j.sums) return MS_ENOMEM;
  pthread_mutex_init(&j.lock, NULL);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  size_t nt = ncpu < 1 ? 1 : (size_t)ncpu;
  if (nt > 16) nt = 16;
  if (nt > j.nchunks) nt = j.nchunks ? (size_t)j.nchunks : 1;
  pthread_t th[16];
  size_t started = 0;
  for (size_t i = 1; i < nt; i++)
    if (pthread_create(&th[started], NULL, hash_worker, &j) == 0) started++;
  hash_worker(&j);
  for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&j.lock);
  int rc = j.failed ? MS_EIO : MS_OK;
  uint64_t h = ms_hash_step(0x6d656d736e617068ULL, size);
  for (uint64_t c = 0; c < j.nchunks; c++) h = ms_hash_step(h, j.sums[c]);
  free(j.sums);
  *hash = h;
  return rc;
}

static int resolve_dir(const char *dir, char *buf, size_t cap, const char **out);
static int make_dir(const char *dir);
static bool same_file(const struct stat *a, const struct stat *b);

/* Writes the memo of st's file (hash) at mpath in dir, atomically; failures are silent (the
 * content is hashed again next time). */
static void memo_write(const char *dir, const char *mpath, const struct stat *st, uint64_t hash) {
  unsigned char buf[MS_CACHE_MEMO_LEN];
  ms__cache_memo_t m;
  ms__cache_memo_of(st, hash, &m);
  ms__cache_memo_encode(&m, buf);
  char tmp[4200];
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int n = snprintf(tmp, sizeof tmp, "%s/" TEMP_PREFIX "%ld-%lx", dir, (long)getpid(),
                   (unsigned long)ts.tv_nsec ^ (unsigned long)(uintptr_t)&ts);
  if (n < 0 || (size_t)n >= sizeof tmp || make_dir(dir) != MS_OK) return;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  bool ok = write(fd, buf, sizeof buf) == (ssize_t)sizeof buf;
  if (close(fd) != 0) ok = false;
  if (!ok || rename(tmp, mpath) != 0) unlink(tmp);
}

/* The content hash of path's file. With dir (the cache directory), a memo there gives it when
 * the file is the one hashed then (statmemo.c), and a hash computed is remembered when it may
 * be (and write). */
static int hash_file_in(const char *dir, bool write, const char *path, uint64_t *hash,
                        uint64_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MS_EIO;
  struct stat st;
  int rc = MS_EIO;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    *size = (uint64_t)st.st_size;
    char mpath[4400];
    bool memo = dir && ms__cache_memo_trusted_fs(fd) &&
                ms__cache_memo_path(dir, &st, mpath, sizeof mpath) == MS_OK;
    if (memo && ms__cache_memo_read(mpath, &st, hash) == MS_OK) {
      close(fd);
      utimensat(AT_FDCWD, mpath, NULL, 0); /* most recently used now */
      return MS_OK;
    }
    struct timespec t0;
    clock_gettime(CLOCK_REALTIME, &t0);
    rc = hash_fd(fd, *size, hash);
    struct stat after;
    if (rc == MS_OK && memo && write && fstat(fd, &after) == 0 && same_file(&st, &after) &&
        ms__cache_memo_settled(&st, (int64_t)t0.tv_sec))
      memo_write(dir, mpath, &st, *hash);
  }
  close(fd);
  return rc;
}

int ms_cache_hash_file(const char *path, uint64_t *hash, uint64_t *size) {
  char dbuf[4096];
  const char *dir = NULL;
  if (!ms_cache_env_enabled() || resolve_dir(NULL, dbuf, sizeof dbuf, &dir) != MS_OK) dir = NULL;
  return hash_file_in(dir, true, path, hash, size);
}

/* ---- entries -------------------------------------------------------------------------------- */

static int entry_path(const char *dir, const ms_cache_key_t *key, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s/%016" PRIx64 "-%" PRIx64 "-f%x-v%u" ENTRY_SUFFIX, dir, key->hash,
                   key->size, key->flags, MS_CACHE_VERSION);
  return n < 0 || (size_t)n >= cap ? MS_ELIMIT : MS_OK;
}

static bool is_entry(const char *name) {
  size_t n = strlen(name), s = strlen(ENTRY_SUFFIX);
  return name[0] != '.' && n > s && strcmp(name + n - s, ENTRY_SUFFIX) == 0;
}

static bool is_temp(const char *name) {
  return strncmp(name, TEMP_PREFIX, strlen(TEMP_PREFIX)) == 0;
}

static bool is_memo(const char *name) {
  return strncmp(name, MS_CACHE_MEMO_PREFIX, strlen(MS_CACHE_MEMO_PREFIX)) == 0;
}

/* mkdir -p of dir (mode 0700: snapshots name the user's code). */
static int make_dir(const char *dir) {
  char buf[4096];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof buf) return MS_ELIMIT;
  memcpy(buf, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    char c = buf[i];
    buf[i] = 0;
    if (mkdir(buf, 0700) != 0 && errno != EEXIST) return MS_EIO;
    buf[i] = c;
  }
  struct stat st;
  return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? MS_OK : MS_EIO;
}

/* Reads the entry for key; MS_OK with *out, or a miss (the entry is then removed when it exists
 * but is refused). */
static int entry_read(const char *path, const ms_cache_key_t *key, ms_snapshot_t **out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MS_ENOTFOUND;
  struct stat st;
  int rc = MS_EFORMAT;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
      (uint64_t)st.st_size <= SIZE_MAX) {
    size_t len = (size_t)st.st_size;
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      madvise(m, len, MADV_SEQUENTIAL);
      ms_errbuf_t eb = {{0}};
      rc = ms_cache_decode(m, len, key, true, out, &eb);
      munmap(m, len);
    } else {
      rc = MS_EIO;
    }
  }
  close(fd);
  if (rc == MS_OK) {
    utimensat(AT_FDCWD, path, NULL, 0); /* most recently used now */
  } else if (rc != MS_ENOMEM && rc != MS_EIO) {
    unlink(path); /* refused: rebuilt by this run */
  }
  return rc == MS_OK ? MS_OK : MS_ENOTFOUND;
}

/* What an entry's file holds: a snapshot, a time index, or a blob (data, len, tag). */
typedef struct entry_body_s {
  const ms_snapshot_t *snap;
  const ms_timeline_t *tl;
  const void *data;
  size_t len;
  uint64_t tag;
} entry_body_t;

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = write(fd, c, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return MS_EIO;
    c += k;
    n -= (size_t)k;
  }
  return MS_OK;
}

/* A blob's file streamed to fd. */
static int blob_write_fd(int fd, entry_body_t body, const ms_cache_key_t *key, size_t *len) {
  unsigned char h[MS_CACHE_BLOB_HEADER];
  ms__cache_blob_header(h, key, body.tag, body.data, body.len);
  int rc = write_all(fd, h, sizeof h);
  if (rc == MS_OK) rc = write_all(fd, body.data, body.len);
  *len = sizeof h + body.len;
  return rc;
}

/* Writes an entry: streamed to a temporary file of dir, renamed over path when complete and within
 * max bytes. */
static int entry_write(const char *dir, const char *path, entry_body_t body,
                       const ms_cache_key_t *key, uint64_t max) {
  char tmp[4200];
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int n = snprintf(tmp, sizeof tmp, "%s/" TEMP_PREFIX "%ld-%lx", dir, (long)getpid(),
                   (unsigned long)ts.tv_nsec ^ (unsigned long)(uintptr_t)&ts);
  if (n < 0 || (size_t)n >= sizeof tmp) return MS_ELIMIT;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return MS_EIO;
  size_t len = 0;
  int rc = body.tl     ? ms__cache_index_write_fd(fd, body.tl, key, &len)
           : body.snap ? ms__cache_write_fd(fd, body.snap, key, &len)
                       : blob_write_fd(fd, body, key, &len);
  if (close(fd) != 0 && rc == MS_OK) rc = MS_EIO;
  if (rc == MS_OK && len > max) rc = MS_ELIMIT;
  if (rc == MS_OK && rename(tmp, path) != 0) rc = MS_EIO;
  if (rc != MS_OK) unlink(tmp);
  return rc;
}

/* ---- the directory -------------------------------------------------------------------------- */

typedef struct dirent_info_s {
  char *name;
  uint64_t bytes;
  struct timespec mtime;
} dirent_info_t;

/* The entries of dir (and, with temps, the hash memos and the temporary files older than an
 * hour). */
static int list_dir(const char *dir, bool temps, dirent_info_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? MS_OK : MS_EIO;
  size_t cap = 0;
  struct dirent *e;
  int rc = MS_OK;
  time_t now = time(NULL);
  while ((e = readdir(d)) != NULL) {
    bool entry = is_entry(e->d_name), memo = is_memo(e->d_name);
    if (!entry && !(temps && (memo || is_temp(e->d_name)))) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    if (!entry && !memo && now - st.st_mtime < 3600) continue; /* another run may write it */
    if (*n == cap) {
      size_t nc = cap ? cap * 2 : 32;
      dirent_info_t *p = realloc(*out, nc * sizeof *p);
      if (!p) {
        rc = MS_ENOMEM;
        break;
      }
      *out = p;
      cap = nc;
    }
    char *name = strdup(e->d_name);
    if (!name) {
      rc = MS_ENOMEM;
      break;
    }
    (*out)[(*n)++] = (dirent_info_t){name, (uint64_t)st.st_size, st.st_mtim};
  }
  closedir(d);
  return rc;
}

static void list_free(dirent_info_t *l, size_t n) {
  for (size_t i = 0; i < n; i++) free(l[i].name);
  free(l);
}

static int resolve_dir(const char *dir, char *buf, size_t cap, const char **out) {
  if (dir) {
    *out = dir;
    return MS_OK;
  }
  int rc = ms_cache_dir(buf, cap);
  *out = buf;
  return rc;
}

int ms_cache_usage(const char *dir, size_t *nfiles, uint64_t *bytes) {
  char buf[4096];
  int rc = resolve_dir(dir, buf, sizeof buf, &dir);
  if (rc != MS_OK) return rc;
  dirent_info_t *l;
  size_t n;
  if ((rc = list_dir(dir, false, &l, &n)) != MS_OK) return rc;
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += l[i].bytes;
  list_free(l, n);
  *nfiles = n;
  *bytes = sum;
  return MS_OK;
}

int ms_cache_clear(const char *dir, size_t *removed) {
  char buf[4096], path[8192];
  int rc = resolve_dir(dir, buf, sizeof buf, &dir);
  if (rc != MS_OK) return rc;
  dirent_info_t *l;
  size_t n, k = 0;
  if ((rc = list_dir(dir, true, &l, &n)) != MS_OK) return rc;
  for (size_t i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, l[i].name);
    if (unlink(path) == 0 && !is_memo(l[i].name)) k++; /* memos are not entries */
  }
  list_free(l, n);
  if (removed) *removed = k;
  return MS_OK;
}

static int by_age(const void *a, const void *b) {
  const dirent_info_t *x = a, *y = b;
  if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
  if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
  return strcmp(x->name, y->name);
}

int ms_cache_evict(const char *dir, uint64_t max_bytes) {
  char buf[4096], path[8192];
  int rc = resolve_dir(dir, buf, sizeof buf, &dir);
  if (rc != MS_OK) return rc;
  dirent_info_t *l;
  size_t n;
  if ((rc = list_dir(dir, true, &l, &n)) != MS_OK) return rc;
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += l[i].bytes;
  if (n > 1) qsort(l, n, sizeof *l, by_age); /* (l is NULL for an empty folder) */
  for (size_t i = 0; i < n && sum > max_bytes; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, l[i].name);
    if (unlink(path) == 0 || errno == ENOENT) sum -= l[i].bytes;
  }
  list_free(l, n);
  return MS_OK;
}

/* ---- loading through the cache -------------------------------------------------------------- */

static bool same_file(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
         a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

int ms_cache_load(const char *path, unsigned flags, const ms_cache_options_t *opts,
                  ms_snapshot_t **out, ms_cache_outcome *outcome, ms_errbuf_t *eb) {
  return ms_cache_load_keyed(path, flags, opts, out, outcome, NULL, eb);
}

int ms_cache_load_keyed(const char *path, unsigned flags, const ms_cache_options_t *opts,
                        ms_snapshot_t **out, ms_cache_outcome *outcome, ms_cache_key_t *key_out,
                        ms_errbuf_t *eb) {
  if (key_out) memset(key_out, 0, sizeof *key_out);
  ms_cache_outcome oc = MS_CACHE_BYPASSED;
  char dbuf[4096], epath[4400];
  const char *dir = opts ? opts->dir : NULL;
  uint64_t max = opts && opts->max_bytes ? opts->max_bytes : ms_cache_max_bytes();
  /* a snapshot whose stacks are read later is never stored: a miss reads the one that is */
  unsigned want = flags;
  flags &= ~(unsigned)MS_LOAD_DEFER_STACKS;
  ms_cache_key_t key = {0, 0, flags};
  struct stat before;
  bool cacheable = strcmp(path, "-") != 0 && (flags & ~(unsigned)MS_LOAD_FLAGS_ALL) == 0 &&
                   stat(path, &before) == 0 && S_ISREG(before.st_mode) &&
                   resolve_dir(dir, dbuf, sizeof dbuf, &dir) == MS_OK &&
                   hash_file_in(dir, !(opts && opts->read_only), path, &key.hash,
                                &key.size) == MS_OK &&
                   key.size == (uint64_t)before.st_size &&
                   entry_path(dir, &key, epath, sizeof epath) == MS_OK;
  if (cacheable && entry_read(epath, &key, out) == MS_OK) {
    if (outcome) *outcome = MS_CACHE_HIT;
    if (key_out) *key_out = key;
    return MS_OK;
  }
  int rc = ms_snapshot_load_ex(path, cacheable ? flags : want, out, eb);
  if (rc == MS_OK && cacheable) {
    oc = MS_CACHE_MISSED;
    struct stat after;
    /* the file changed while it was hashed or read: what was read may not be what was hashed */
    bool same = stat(path, &after) == 0 && same_file(&before, &after);
    if (same && opts && opts->read_only && key_out) *key_out = key;
    if (same && !(opts && opts->read_only) && make_dir(dir) == MS_OK) {
      if (entry_write(dir, epath, (entry_body_t){*out, NULL, NULL, 0, 0}, &key, max) == MS_OK) {
        oc = MS_CACHE_STORED;
        if (key_out) *key_out = key;
        if (ms_cache_evict(dir, max) != MS_OK) oc = MS_CACHE_STORED; /* evicted next time */
      }
    }
  }
  if (outcome) *outcome = oc;
  return rc;
}

/* ---- the time index through the cache ------------------------------------------------------- */

/* The configuration as the index has it (ms_timeline_create's defaults), as a tag of its name. */
static uint64_t config_tag(const ms_timeline_config_t *cfg) {
  uint64_t k = cfg && cfg->checkpoint_every ? cfg->checkpoint_every : 1024;
  uint64_t h = ms_hash_step(0x696e646578ULL, k);
  if (cfg && cfg->filter.has_stream) h = ms_hash_step(ms_hash_step(h, 1), cfg->filter.stream);
  if (cfg && cfg->filter.has_pool)
    h = ms_hash_step(ms_hash_step(ms_hash_step(h, 2), (uint64_t)cfg->filter.pool_id[0]),
                     (uint64_t)cfg->filter.pool_id[1]);
  return h;
}

static int index_path(const char *dir, const ms_cache_key_t *key, const ms_timeline_config_t *cfg,
                      char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s/%016" PRIx64 "-%" PRIx64 "-f%x-v%u-t%016" PRIx64 ENTRY_SUFFIX,
                   dir, key->hash, key->size, key->flags, MS_CACHE_VERSION, config_tag(cfg));
  return n < 0 || (size_t)n >= cap ? MS_ELIMIT : MS_OK;
}

typedef struct index_map_s {
  void *p;
  size_t len;
} index_map_t;

static void index_unmap(void *arg) {
  index_map_t *m = arg;
  munmap(m->p, m->len);
  free(m);
}

/* Maps the index entry at path and reads it in place for snap; MS_OK with *out (which keeps the
 * mapping until it is destroyed), or a miss (a refused entry is removed). */
static int index_read(const char *path, const ms_cache_key_t *key, const ms_snapshot_t *snap,
                      const ms_timeline_config_t *cfg, ms_timeline_t **out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MS_ENOTFOUND;
  struct stat st;
  int rc = MS_EFORMAT;
  index_map_t *m = malloc(sizeof *m);
  if (!m) rc = MS_ENOMEM;
  if (m && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
      (uint64_t)st.st_size <= SIZE_MAX) {
    m->len = (size_t)st.st_size;
    m->p = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->p != MAP_FAILED) {
      ms_errbuf_t eb = {{0}};
      rc = ms__cache_index_decode(m->p, m->len, key, true, snap, cfg, index_unmap, m, out, &eb);
      if (rc != MS_OK) munmap(m->p, m->len);
    } else {
      rc = MS_EIO;
    }
  }
  if (rc != MS_OK) free(m);
  close(fd);
  if (rc == MS_OK) {
    utimensat(AT_FDCWD, path, NULL, 0); /* most recently used now */
  } else if (rc != MS_ENOMEM && rc != MS_EIO) {
    unlink(path); /* refused: rebuilt by this run */
  }
  return rc == MS_OK ? MS_OK : MS_ENOTFOUND;
}

int ms_cache_timeline(const ms_cache_key_t *key, const ms_cache_options_t *opts,
                      const ms_snapshot_t *snap, const ms_timeline_config_t *cfg,
                      ms_timeline_t **out, ms_cache_outcome *outcome, ms_errbuf_t *eb) {
  ms_cache_outcome oc = MS_CACHE_BYPASSED;
  char dbuf[4096], ipath[4400];
  const char *dir = opts ? opts->dir : NULL;
  uint64_t max = opts && opts->max_bytes ? opts->max_bytes : ms_cache_max_bytes();
  bool cacheable = key && (key->hash || key->size) && snap && out &&
                   resolve_dir(dir, dbuf, sizeof dbuf, &dir) == MS_OK &&
                   index_path(dir, key, cfg, ipath, sizeof ipath) == MS_OK;
  if (cacheable && index_read(ipath, key, snap, cfg, out) == MS_OK) {
    if (outcome) *outcome = MS_CACHE_HIT;
    return MS_OK;
  }
  int rc = ms_timeline_create(snap, cfg, out, eb);
  if (rc == MS_OK && cacheable) {
    oc = MS_CACHE_MISSED;
    if (make_dir(dir) == MS_OK &&
        entry_write(dir, ipath, (entry_body_t){NULL, *out, NULL, 0, 0}, key, max) == MS_OK) {
      oc = MS_CACHE_STORED;
      (void)!ms_cache_evict(dir, max); /* on failure: evicted next time */
    }
  }
  if (outcome) *outcome = oc;
  return rc;
}

/* ---- blobs ---------------------------------------------------------------------------------- */

static int blob_path(const char *dir, const ms_cache_key_t *key, uint64_t tag, char *buf,
                     size_t cap) {
  int n = snprintf(buf, cap, "%s/%016" PRIx64 "-%" PRIx64 "-f%x-v%u-p%016" PRIx64 ENTRY_SUFFIX,
                   dir, key->hash, key->size, key->flags, MS_CACHE_VERSION, tag);
  return n < 0 || (size_t)n >= cap ? MS_ELIMIT : MS_OK;
}

int ms_cache_blob_get(const ms_cache_key_t *key, uint64_t tag, const ms_cache_options_t *opts,
                      ms_sink_t *sink) {
  char dbuf[4096], path[4400];
  const char *dir = opts ? opts->dir : NULL;
  if (!key || (!key->hash && !key->size) || !sink ||
      resolve_dir(dir, dbuf, sizeof dbuf, &dir) != MS_OK ||
      blob_path(dir, key, tag, path, sizeof path) != MS_OK)
    return MS_ENOTFOUND;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MS_ENOTFOUND;
  struct stat st;
  int rc = MS_EFORMAT, wrc = MS_OK;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
      (uint64_t)st.st_size <= SIZE_MAX) {
    size_t len = (size_t)st.st_size;
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      madvise(m, len, MADV_SEQUENTIAL);
      const void *data = NULL;
      size_t n = 0;
      rc = ms_cache_blob_decode(m, len, key, tag, true, &data, &n, NULL);
      if (rc == MS_OK) wrc = sink->write(sink->ctx, (const char *)data, n);
      munmap(m, len);
    } else {
      rc = MS_EIO;
    }
  }
  close(fd);
  if (rc == MS_OK) {
    utimensat(AT_FDCWD, path, NULL, 0); /* most recently used now */
    return wrc;
  }
  if (rc != MS_ENOMEM && rc != MS_EIO) unlink(path); /* refused: rebuilt by this run */
  return MS_ENOTFOUND;
}

int ms_cache_blob_put(const ms_cache_key_t *key, uint64_t tag, const ms_cache_options_t *opts,
                      const void *data, size_t len) {
  char dbuf[4096], path[4400];
  const char *dir = opts ? opts->dir : NULL;
  uint64_t max = opts && opts->max_bytes ? opts->max_bytes : ms_cache_max_bytes();
  if (!key || (!key->hash && !key->size) || (!data && len)) return MS_EINVAL;
  int rc = resolve_dir(dir, dbuf, sizeof dbuf, &dir);
  if (rc == MS_OK) rc = blob_path(dir, key, tag, path, sizeof path);
  if (rc == MS_OK && make_dir(dir) != MS_OK) rc = MS_EIO;
  if (rc == MS_OK)
    rc = entry_write(dir, path, (entry_body_t){NULL, NULL, data, len, tag}, key, max);
  if (rc == MS_OK) (void)!ms_cache_evict(dir, max); /* on failure: evicted next time */
  return rc;
}
