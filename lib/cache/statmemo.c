/* SPDX-License-Identifier: MIT
 * memsnap cache: the content hash remembered by file identity (cache/internal.h).
 *
 * Hashing a 1 GB snapshot costs about what reading it does (0.2 s of CPU, most of it the
 * kernel's mapping of the page cache), and every warm command paid it again. A file whose
 * identity and change time are the same as when it was hashed has the same content, as git's
 * index trusts it, with the same two guards:
 *
 *   - the identity is the device, inode, size, modification time and change time, all to the
 *     nanosecond. The change time is set by the kernel on every write and cannot be set by a
 *     user (`touch -d` sets only the modification time), so a file rewritten with its old size
 *     and modification time restored still differs;
 *   - a hash is remembered only when both times lie at least MEMO_RACY_S seconds before the
 *     hashing started ("racily clean" in git's words): a write in the same clock tick as the
 *     hashing, on a file system whose times are coarse, cannot leave the same times behind.
 *
 * Only file systems known to keep a change time that every write updates are trusted (ext2/3/4,
 * XFS, Btrfs, tmpfs, overlayfs, ZFS, F2FS); on any other (NFS, FUSE, FAT, ...) the content is
 * hashed every time. A memo is a 96-byte file in the cache directory, named after the device and
 * inode, written atomically, checked (magic, version, checksum) and ignored when it fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "cache/internal.h"
#include "common/internal.h"
#include "memsnap/cache.h"

#define MEMO_MAGIC "MSHMEMO1"
#define MEMO_RACY_S 2

static void memo_wr64(unsigned char *p, uint64_t x) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
}

static uint64_t memo_rd64(const unsigned char *p) {
  uint64_t x = 0;
  for (int i = 8; i-- > 0;) x = (x << 8) | p[i];
  return x;
}

void ms__cache_memo_of(const struct stat *st, uint64_t hash, ms__cache_memo_t *m) {
  m->dev = (uint64_t)st->st_dev;
  m->ino = (uint64_t)st->st_ino;
  m->size = (uint64_t)st->st_size;
  m->mtime_s = (int64_t)st->st_mtim.tv_sec;
  m->mtime_ns = (int64_t)st->st_mtim.tv_nsec;
  m->ctime_s = (int64_t)st->st_ctim.tv_sec;
  m->ctime_ns = (int64_t)st->st_ctim.tv_nsec;
  m->hash = hash;
}

bool ms__cache_memo_same(const ms__cache_memo_t *a, const ms__cache_memo_t *b) {
  return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
         a->mtime_s == b->mtime_s && a->mtime_ns == b->mtime_ns && a->ctime_s == b->ctime_s &&
         a->ctime_ns == b->ctime_ns;
}

void ms__cache_memo_encode(const ms__cache_memo_t *m, unsigned char out[MS_CACHE_MEMO_LEN]) {
  memcpy(out, MEMO_MAGIC, 8);
  memo_wr64(out + 8, MS_CACHE_VERSION);
  memo_wr64(out + 16, m->dev);
  memo_wr64(out + 24, m->ino);
  memo_wr64(out + 32, m->size);
  memo_wr64(out + 40, (uint64_t)m->mtime_s);
  memo_wr64(out + 48, (uint64_t)m->mtime_ns);
  memo_wr64(out + 56, (uint64_t)m->ctime_s);
  memo_wr64(out + 64, (uint64_t)m->ctime_ns);
  memo_wr64(out + 72, m->hash);
  memo_wr64(out + 80, 0);
  memo_wr64(out + 88, cache_sum(out, 88, 0x6d656d6f));
}

int ms__cache_memo_decode(const void *buf, size_t len, ms__cache_memo_t *m) {
  const unsigned char *p = buf;
  if (len != MS_CACHE_MEMO_LEN) return len < MS_CACHE_MEMO_LEN ? MS_ETRUNCATED : MS_EFORMAT;
  if (memcmp(p, MEMO_MAGIC, 8) != 0) return MS_EFORMAT;
  if (memo_rd64(p + 8) != MS_CACHE_VERSION) return MS_EVERSION;
  if (memo_rd64(p + 88) != cache_sum(p, 88, 0x6d656d6f) || memo_rd64(p + 80) != 0)
    return MS_EFORMAT;
  m->dev = memo_rd64(p + 16);
  m->ino = memo_rd64(p + 24);
  m->size = memo_rd64(p + 32);
  m->mtime_s = (int64_t)memo_rd64(p + 40);
  m->mtime_ns = (int64_t)memo_rd64(p + 48);
  m->ctime_s = (int64_t)memo_rd64(p + 56);
  m->ctime_ns = (int64_t)memo_rd64(p + 64);
  m->hash = memo_rd64(p + 72);
  return MS_OK;
}

int ms__cache_memo_path(const char *dir, const struct stat *st, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s/" MS_CACHE_MEMO_PREFIX "%" PRIx64 "-%" PRIx64, dir,
                   (uint64_t)st->st_dev, (uint64_t)st->st_ino);
  return n < 0 || (size_t)n >= cap ? MS_ELIMIT : MS_OK;
}

bool ms__cache_memo_trusted_fs(int fd) {
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) return false;
  static const uint64_t trusted[] = {
      0xEF53,     /* ext2, ext3, ext4 */
      0x58465342, /* XFS */
      0x9123683E, /* Btrfs */
      0x01021994, /* tmpfs */
      0x794C7630, /* overlayfs */
      0x2FC12FC1, /* ZFS */
      0xF2F52010, /* F2FS */
  };
  for (size_t i = 0; i < sizeof trusted / sizeof *trusted; i++)
    if ((uint64_t)(unsigned long)fs.f_type == trusted[i]) return true;
  return false;
}

bool ms__cache_memo_settled(const struct stat *st, int64_t started_s) {
  return (int64_t)st->st_mtim.tv_sec <= started_s - MEMO_RACY_S &&
         (int64_t)st->st_ctim.tv_sec <= started_s - MEMO_RACY_S;
}

int ms__cache_memo_read(const char *path, const struct stat *st, uint64_t *hash) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return MS_ENOTFOUND;
  unsigned char buf[MS_CACHE_MEMO_LEN + 1];
  ssize_t got;
  do got = read(fd, buf, sizeof buf);
  while (got < 0 && errno == EINTR);
  close(fd);
  ms__cache_memo_t m, now;
  if (got < 0 || ms__cache_memo_decode(buf, (size_t)got, &m) != MS_OK) {
    unlink(path); /* refused: written anew by this run */
    return MS_ENOTFOUND;
  }
  ms__cache_memo_of(st, 0, &now);
  if (!ms__cache_memo_same(&m, &now)) return MS_ENOTFOUND;
  *hash = m.hash;
  return MS_OK;
}
