/* SPDX-License-Identifier: MIT
 * memsnap core: files. FILE* and memory sinks and sources, atomic files (temporary name, fsync,
 * rename), ms_snapshot_write_file() and ms_snapshot_load(), which recognises the format of a file
 * from its first bytes and dispatches to the msgpack reader or the PyTorch pickle reader.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "snapshot/msgpack_schema.h"
#include "snapshot/zio.h"

/* ---- format detection ----------------------------------------------------------------------- */

ms_format ms_format_detect(const void *head, size_t len) {
  const unsigned char *p = head;
  if (!head) return MS_FORMAT_UNKNOWN;
  if (len >= sizeof snap_head16 && memcmp(p, snap_head16, sizeof snap_head16) == 0)
    return MS_FORMAT_MEMSNAP;
  if (len >= 2 && p[0] == 0x80 && p[1] >= 2 && p[1] <= 5) return MS_FORMAT_PICKLE;
  if (ms__zio_is_gzip(p, len)) {
    char out[sizeof snap_head16];
    size_t n = ms__zio_peek(p, len, out, sizeof out);
    if (n == sizeof out && memcmp(out, snap_head16, sizeof out) == 0) return MS_FORMAT_MEMSNAP_Z;
  }
  return MS_FORMAT_UNKNOWN;
}

const char *ms_format_name(ms_format f) {
  switch (f) {
  case MS_FORMAT_MEMSNAP:
    return "memsnap";
  case MS_FORMAT_MEMSNAP_Z:
    return "memsnap-z";
  case MS_FORMAT_PICKLE:
    return "pickle";
  default:
    return "unknown";
  }
}

/* How many bytes ms_snapshot_load() reads before deciding on the format: enough for a gzip
 * header plus the deflated memsnap header. */
#define LOAD_PEEK 4096u

/* ---- FILE* and memory streams --------------------------------------------------------------- */

static int file_write(void *ctx, const char *buf, size_t len) {
  FILE *fp = ctx;
  if (len && fwrite(buf, 1, len, fp) != len) return MS_EIO;
  return MS_OK;
}

static ptrdiff_t file_read(void *ctx, char *buf, size_t cap) {
  FILE *fp = ctx;
  size_t n = fread(buf, 1, cap, fp);
  if (n == 0 && ferror(fp)) return MS_EIO;
  return (ptrdiff_t)n;
}

void ms_sink_init_file(ms_sink_t *sink, FILE *fp) {
  sink->write = file_write;
  sink->ctx = fp;
}

void ms_source_init_file(ms_source_t *src, FILE *fp) {
  src->read = file_read;
  src->ctx = fp;
}

static ptrdiff_t mem_read(void *ctx, char *buf, size_t cap) {
  ms_membuf_t *m = ctx;
  size_t n = m->len - m->pos;
  if (n > cap) n = cap;
  if (n > PTRDIFF_MAX) n = PTRDIFF_MAX;
  if (n == 0) return 0;
  memcpy(buf, m->data + m->pos, n);
  m->pos += n;
  return (ptrdiff_t)n;
}

void ms_source_init_mem(ms_source_t *src, ms_membuf_t *buf, const void *data, size_t len) {
  buf->data = data;
  buf->len = len;
  buf->pos = 0;
  src->read = mem_read;
  src->ctx = buf;
}

/* ---- atomic files --------------------------------------------------------------------------- */

static void atomic_release(ms_atomic_file_t *af) {
  free(af->path);
  free(af->tmp_path);
  af->path = NULL;
  af->tmp_path = NULL;
  af->fp = NULL;
}

/* An existing path that is not a regular file (a FIFO, a device such as /dev/null, a symbolic
 * link that does not end at a regular file) is opened and written through, as cp and sort -o
 * do: renaming over it would destroy it. A symbolic link to a regular file is followed: the
 * target is replaced complete-or-not-at-all and the link stays. @return 1 to go on with a
 * temporary file (af->path possibly replaced by the link's target), MS_OK when af->fp writes
 * through, or an error. */
static int atomic_open_existing(ms_atomic_file_t *af, const char *path, ms_errbuf_t *eb) {
  struct stat lst, st;
  if (lstat(path, &lst) != 0 || S_ISREG(lst.st_mode)) return 1;
  if (S_ISLNK(lst.st_mode) && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
    char *target = realpath(path, NULL);
    if (target) {
      free(af->path);
      af->path = target;
      return 1;
    }
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd >= 0 && !(af->fp = fdopen(fd, "wb"))) close(fd);
  if (!af->fp) {
    int e = errno;
    ms__errbuf_set(eb, MS_EIO, "cannot open '%s': %s", path, strerror(e));
    atomic_release(af);
    return MS_EIO;
  }
  return MS_OK;
}

int ms_atomic_file_open(ms_atomic_file_t *af, const char *path, ms_errbuf_t *eb) {
  memset(af, 0, sizeof *af);
  if (!path || !*path) return ms__errbuf_set(eb, MS_EINVAL, "empty output path");
  af->path = strdup(path);
  if (!af->path) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  if (strcmp(path, "-") == 0) {
    af->fp = stdout;
    return MS_OK;
  }
  int through = atomic_open_existing(af, path, eb);
  if (through != 1) return through; /* written through, or failed */
  path = af->path; /* a symbolic link's target, when it names a regular file */
  /* ".NAME.tmp-XXXXXX" next to the final name, so that rename() stays in one file system. */
  const char *slash = strrchr(path, '/');
  size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
  const char *base = path + dirlen;
  size_t need = dirlen + 1 + strlen(base) + sizeof ".tmp-XXXXXX";
  af->tmp_path = malloc(need);
  if (!af->tmp_path) {
    atomic_release(af);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  /* Created exclusively with mode 0666, so that the kernel applies the umask as fopen() would
   * (mkstemp's 0600 plus a umask() dance would race with other threads). */
  static atomic_uint tmp_counter;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long x = (unsigned long)ts.tv_nsec ^ ((unsigned long)getpid() << 16) ^
                      ((unsigned long)atomic_fetch_add(&tmp_counter, 1) * 2654435761u);
    static const char digits[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    char suffix[7];
    for (int i = 0; i < 6; i++, x /= 36) suffix[i] = digits[x % 36];
    suffix[6] = 0;
    snprintf(af->tmp_path, need, "%.*s.%s.tmp-%s", (int)dirlen, path, base, suffix);
    fd = open(af->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    int e = errno;
    ms__errbuf_set(eb, MS_EIO, "cannot create '%s': %s", path, strerror(e));
    atomic_release(af);
    return MS_EIO;
  }
  af->fp = fdopen(fd, "wb");
  if (!af->fp) {
    int e = errno;
    close(fd);
    unlink(af->tmp_path);
    ms__errbuf_set(eb, MS_EIO, "cannot create '%s': %s", path, strerror(e));
    atomic_release(af);
    return MS_EIO;
  }
  return MS_OK;
}

/* fsyncs the directory holding path, so the rename itself is durable. Best effort. */
static void sync_parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) {
    strcpy(dir, ".");
  } else {
    size_t n = (size_t)(slash - path);
    if (n == 0) n = 1;
    if (n >= sizeof dir) return;
    memcpy(dir, path, n);
    dir[n] = 0;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

int ms_atomic_file_commit(ms_atomic_file_t *af, ms_errbuf_t *eb) {
  if (!af->fp) {
    atomic_release(af);
    return ms__errbuf_set(eb, MS_ESTATE, "atomic file is not open");
  }
  if (!af->tmp_path) { /* stdout, or a file written through */
    int bad = fflush(af->fp) != 0 || ferror(af->fp);
    int e = errno;
    if (af->fp != stdout && fclose(af->fp) != 0 && !bad) {
      bad = 1;
      e = errno;
    }
    int rc = MS_OK;
    if (bad && af->fp == stdout)
      rc = ms__errbuf_set(eb, MS_EIO, "cannot write to standard output: %s", strerror(e));
    else if (bad)
      rc = ms__errbuf_set(eb, MS_EIO, "cannot write '%s': %s", af->path, strerror(e));
    atomic_release(af);
    return rc;
  }
  int rc = MS_OK;
  const char *what = NULL;
  int e = 0;
  if (fflush(af->fp) != 0 || ferror(af->fp)) {
    what = "cannot write";
    e = errno;
  } else if (fsync(fileno(af->fp)) != 0 && errno != EINVAL && errno != EROFS) {
    what = "cannot sync";
    e = errno;
  }
  if (fclose(af->fp) != 0 && !what) {
    what = "cannot write";
    e = errno;
  }
  af->fp = NULL;
  if (!what && rename(af->tmp_path, af->path) != 0) {
    what = "cannot rename the temporary file to";
    e = errno;
  }
  if (what) {
    unlink(af->tmp_path);
    rc = ms__errbuf_set(eb, MS_EIO, "%s '%s': %s", what, af->path, e ? strerror(e) : "I/O error");
  } else {
    sync_parent_dir(af->path);
  }
  atomic_release(af);
  return rc;
}

void ms_atomic_file_abort(ms_atomic_file_t *af) {
  if (!af) return;
  if (af->fp && af->tmp_path) {
    fclose(af->fp);
    unlink(af->tmp_path);
  } else if (af->fp == stdout) {
    fflush(af->fp);
  } else if (af->fp) {
    fclose(af->fp); /* written through: what was written stays */
  }
  atomic_release(af);
}

int ms_snapshot_write_file(const ms_snapshot_t *snap, const char *path,
                           const ms_write_opts_t *opts, ms_errbuf_t *eb) {
  ms_atomic_file_t af;
  MS_FORWARD_IF_ERROR(ms_atomic_file_open(&af, path, eb));
  ms_sink_t sink;
  ms_sink_init_file(&sink, af.fp);
  ms_errbuf_t inner = {{0}};
  int rc = ms_snapshot_write(snap, opts, &sink, &inner);
  if (rc != MS_OK) {
    ms_atomic_file_abort(&af);
    if (rc == MS_EIO)
      return ms__errbuf_set(eb, rc, "cannot write '%s': %s", path, strerror(errno));
    return ms__errbuf_set(eb, rc, "cannot write '%s': %s", path,
                          inner.msg[0] ? inner.msg : ms_strerror(rc));
  }
  return ms_atomic_file_commit(&af, eb);
}

/* ---- loading -------------------------------------------------------------------------------- */

/* A source that replays the bytes read while detecting the format, then reads the FILE. */
typedef struct peek_source_s {
  const char *head;
  size_t len, pos;
  FILE *fp;
} peek_source_t;

static ptrdiff_t peek_read(void *ctx, char *buf, size_t cap) {
  peek_source_t *p = ctx;
  if (p->pos < p->len) {
    size_t n = p->len - p->pos;
    if (n > cap) n = cap;
    memcpy(buf, p->head + p->pos, n);
    p->pos += n;
    return (ptrdiff_t)n;
  }
  return file_read(p->fp, buf, cap);
}

/* Whether head is the start of a gzip stream whose content is a pickle (`.pickle.gz`). */
static bool load_is_gz_pickle(const char *head, size_t n) {
  unsigned char in[2];
  return ms__zio_is_gzip(head, n) && ms__zio_peek(head, n, in, sizeof in) == sizeof in &&
         in[0] == 0x80 && in[1] >= 2 && in[1] <= 5;
}

/* How much of a gzip stream is inflated after the pickle inside failed, to see whether the
 * stream itself is sound (a corrupt member often decodes to garbage first). */
#define LOAD_GZ_DRAIN (64u << 20)

/* The pickle reader's message for a gzip-compressed input: its "offset N:" is an offset in the
 * inflated pickle, and the message says so. */
static void load_gz_pickle_msg(char *out, size_t cap, const char *msg) {
  unsigned long long off = 0;
  int used = 0;
  if (sscanf(msg, "offset %llu: %n", &off, &used) == 1 && used > 0)
    snprintf(out, cap, "offset %llu of the inflated pickle: %s", off, msg + used);
  else
    snprintf(out, cap, "%s", msg);
}

/* Reads a gzip-compressed pickle, inflating as it goes (the pickle is never whole in memory). A
 * regular file whose trace could not be skipped is read again in full, from its start. The gzip
 * stream is read to its end (its CRC and length checked) after the pickle; errors of the gzip
 * layer name their offset in the compressed file, those of the pickle their offset in the
 * inflated data. */
static int load_gz_pickle(FILE *fp, int is_stdin, const char *head, size_t n, unsigned flags,
                          ms_snapshot_t **snap, ms_errbuf_t *inner) {
  for (int pass = 0; pass < 2; pass++) {
    ms_source_t file, src;
    ms_source_init_file(&file, fp);
    ms__zsource_t *z = NULL;
    if (ms__zsource_create(&file, head, pass ? 0 : n, &z, &src) != MS_OK)
      return ms__errbuf_set(inner, MS_ENOMEM, "out of memory");
    bool again = false;
    ms_snapshot_t *s = NULL;
    int rc = ms__pickle_read(&src, pass ? 0 : flags, &s, inner, pass ? NULL : &again);
    if (!again) {
      char pickle_msg[sizeof inner->msg];
      load_gz_pickle_msg(pickle_msg, sizeof pickle_msg, inner->msg);
      bool failed_reading = ms__zsource_error(z)[0] != 0; /* the pickle failed on the stream */
      int zrc =
          failed_reading ? MS_OK : ms__zsource_drain(z, rc == MS_OK ? UINT64_MAX : LOAD_GZ_DRAIN);
      if (failed_reading)
        rc = ms__errbuf_set(inner, rc != MS_OK ? rc : MS_EFORMAT, "gzip: %s", ms__zsource_error(z));
      else if (zrc < 0 && rc == MS_OK)
        rc = ms__errbuf_set(inner, zrc, "gzip: %s (the pickle inside was complete)",
                            ms__zsource_error(z));
      else if (zrc < 0)
        rc = ms__errbuf_set(inner, zrc, "gzip: %s; the pickle inside failed first, at %s",
                            ms__zsource_error(z), pickle_msg);
      else if (rc != MS_OK)
        rc = ms__errbuf_set(inner, rc, "%s", pickle_msg);
      if (rc != MS_OK && s) {
        ms_snapshot_free(s);
        s = NULL;
      }
    }
    ms__zsource_destroy(z);
    if (rc == MS_OK) *snap = s;
    if (!again || is_stdin || fseek(fp, 0, SEEK_SET) != 0) return rc;
    inner->msg[0] = 0;
  }
  return MS_EFORMAT; /* not reached */
}

int ms_snapshot_load(const char *path, ms_snapshot_t **out, ms_errbuf_t *eb) {
  return ms_snapshot_load_ex(path, 0, out, eb);
}

/* The protocol of a pickle written with protocol 0 or 1 (no PROTO opcode), told by how Python
 * starts one of a dict or list: protocol 0 "(dp0\n" / "(lp0\n", protocol 1 "}q\0" / "]q\0" (or
 * "}(" / "](" ...). @return 0, 1 or -1 (not one). */
static int load_old_pickle_protocol(const char *head, size_t n) {
  const unsigned char *h = (const unsigned char *)head;
  if (n >= 3 && h[0] == '(' && (h[1] == 'd' || h[1] == 'l') && (h[2] == 'p' || h[2] == '('))
    return 0;
  if (n >= 2 && (h[0] == '}' || h[0] == ']') &&
      (h[1] == 'q' || h[1] == 'r' || h[1] == '(' || h[1] == '.'))
    return 1;
  return -1;
}

int ms_snapshot_load_ex(const char *path, unsigned flags, ms_snapshot_t **out, ms_errbuf_t *eb) {
  if (!path || !out) return ms__errbuf_set(eb, MS_EINVAL, "no input path");
  if (flags & ~(unsigned)MS_LOAD_FLAGS_ALL)
    return ms__errbuf_set(eb, MS_EINVAL, "unknown load flags 0x%x", flags);
  int is_stdin = strcmp(path, "-") == 0;
  const char *name = is_stdin ? "<stdin>" : path;
  FILE *fp = is_stdin ? stdin : fopen(path, "rb");
  if (!fp) {
    int e = errno;
    return ms__errbuf_set(eb, e == ENOENT ? MS_ENOTFOUND : MS_EIO, "cannot open '%s': %s", name,
                          strerror(e));
  }
  if (!is_stdin) {
    struct stat st;
    if (fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
      fclose(fp);
      return ms__errbuf_set(eb, MS_EIO, "cannot read '%s': Is a directory", name);
    }
  }
  int rc = ms__snapshot_load_fp(fp, name, !is_stdin, flags, out, eb);
  if (!is_stdin) fclose(fp);
  return rc;
}

int ms__snapshot_load_fp(FILE *fp, const char *name, bool rewindable, unsigned flags,
                         ms_snapshot_t **out, ms_errbuf_t *eb) {
  if (!fp || !name || !out) return ms__errbuf_set(eb, MS_EINVAL, "no input stream");
  if (flags & ~(unsigned)MS_LOAD_FLAGS_ALL)
    return ms__errbuf_set(eb, MS_EINVAL, "unknown load flags 0x%x", flags);
  int is_stdin = !rewindable;
  char head[LOAD_PEEK];
  size_t n = 0;
  while (n < sizeof head) {
    size_t r = fread(head + n, 1, sizeof head - n, fp);
    if (r == 0) break;
    n += r;
  }
  if (ferror(fp)) {
    int e = errno;
    return ms__errbuf_set(eb, MS_EIO, "cannot read '%s': %s", name, strerror(e));
  }
  peek_source_t ps = {head, n, 0, fp};
  ms_source_t src = {peek_read, &ps};
  ms_errbuf_t inner = {{0}};
  ms_snapshot_t *snap = NULL;
  int rc;
  switch (ms_format_detect(head, n)) {
  case MS_FORMAT_MEMSNAP:
  case MS_FORMAT_MEMSNAP_Z:
    rc = ms_snapshot_read(&src, &snap, &inner);
    break;
  case MS_FORMAT_PICKLE: {
    bool again = false;
    struct stat st;
    if (!is_stdin && fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      /* a regular file is read in place, through mapped windows of the page cache */
      int fd = fileno(fp);
      rc = ms__pickle_read_fd(fd, (uint64_t)st.st_size, flags, &snap, &inner, &again);
      if (again) {
        inner.msg[0] = 0;
        rc = ms__pickle_read_fd(fd, (uint64_t)st.st_size, 0, &snap, &inner, NULL);
      }
      break;
    }
    rc = ms__pickle_read(&src, flags, &snap, &inner, &again);
    /* The trace could not be skipped: read a regular file again, in full. */
    if (again && !is_stdin && fseek(fp, (long)n, SEEK_SET) == 0) {
      ps.pos = 0;
      inner.msg[0] = 0;
      rc = ms__pickle_read(&src, 0, &snap, &inner, NULL);
    }
    break;
  }
  default:
    if (load_is_gz_pickle(head, n)) {
      rc = load_gz_pickle(fp, is_stdin, head, n, flags, &snap, &inner);
      break;
    }
    if (n == 0) {
      rc = ms__errbuf_set(&inner, MS_ETRUNCATED, "empty file");
    } else if (load_old_pickle_protocol(head, n) >= 0) {
      rc = ms__errbuf_set(&inner, MS_EUNSUPPORTED,
                          "a pickle of protocol %d; PyTorch writes snapshots with protocols 2 to "
                          "5 (re-save it with pickle.dump(obj, f, protocol=4))",
                          load_old_pickle_protocol(head, n));
    } else {
      rc = ms__errbuf_set(&inner, MS_EFORMAT, "not a memsnap snapshot or PyTorch pickle");
    }
    break;
  }
  if (rc != MS_OK) return ms__errbuf_set(eb, rc, "'%s': %s", name, inner.msg);
  *out = snap;
  return MS_OK;
}
