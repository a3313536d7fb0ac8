/* SPDX-License-Identifier: MIT
 * memsnap core: the pickle VM of the streaming reader of PyTorch snapshot pickles
 * (memsnap/pickle.h, issue #4; the reader's files and vocabulary: pickle_internal.h).
 *
 * A small pickle VM: a typed value stack (scalars, arena strings, and "objects" for dicts, lists
 * and sets), a mark stack, and a memo of values. It never builds a generic object tree: the
 * containers it creates (pickle_objects.c) get a role in the snapshot schema the moment they are
 * born, and the items stored into them go straight into the model (pickle_schema.c). This file
 * holds the input buffer, the decoding of every opcode, grouped by family (control, stack and
 * marks, scalars, strings, containers, memo, refused), the run loop that dispatches them, and
 * the entry point.
 *
 * Bounds: stack depth and marks (RD_MAX_STACK), memo indices (dense, at most RD_MEMO_SLACK
 * beyond the entries stored), string lengths (below 4 GiB), integers (RD_MAX_LONG bytes). A
 * declared length is read in chunks and memory grows only as the input delivers the bytes, so a
 * 2^62-byte string in a 100-byte file fails at the end of the input having allocated nothing
 * big; bytes values, never kept, are skipped without buffering.
 *
 * What Python's unpickler refuses is refused here too (issue #16): text that does not decode
 * (pickle_objects.c), keys and set items that cannot be hashed, and frames that do not hold: a
 * read that begins inside a FRAME ends inside it, a FRAME does not begin inside another, and the
 * input holds every byte a FRAME declares. The frame check costs nothing on the hot path: the
 * inline rd_take() reads below r->lim, which stops at the frame's end, and only the slow path
 * (rd_frame_read) looks at frames.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snapshot/pickle_internal.h"

/* ---- errors ---------------------------------------------------------------------------------- */

int ms__pickle_err(rd_t *r, int code, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ms__errbuf_set(r->eb, code, "offset %" PRIu64 ": %s", r->op_off, msg);
}

/* ---- input ----------------------------------------------------------------------------------- */

/* Where rd_take's fast path stops: the end of the data, or of the current frame. */
static inline void rd_set_lim(rd_t *r) {
  r->lim = r->len;
  if (r->frame_end != RD_NO_FRAME && r->frame_end - r->base < r->len)
    r->lim = (size_t)(r->frame_end - r->base);
}

/* A mapped input's window: ms__pickle_read_fd maps the file this much at a time, so that the
 * process holds one window of it, not the whole file, and every read stays inside one (rd_need
 * asks for at most RD_BUF_CAP / 2 bytes). */
size_t ms__pickle_map_window = (size_t)8 << 20;
#define RD_MAP_WINDOW_MIN ((size_t)2 * RD_BUF_CAP) /* a window holds any read rd_need makes */

/* rd_read_more of a mapped input: the next window begins at the page of the current position
 * (the unread bytes stay where they are in the file, so nothing is moved or copied). */
static int rd_map_more(rd_t *r) {
  uint64_t at = r->base + r->pos;
  if (at >= r->map_size) {
    r->eof = true;
    rd_set_lim(r);
    return MS_OK;
  }
  long pg = sysconf(_SC_PAGESIZE);
  uint64_t off = at - at % (uint64_t)(pg > 0 ? pg : 4096);
  uint64_t rest = r->map_size - off;
  size_t win = ms__pickle_map_window > RD_MAP_WINDOW_MIN ? ms__pickle_map_window : RD_MAP_WINDOW_MIN;
  size_t wl = rest < win ? (size_t)rest : win;
  struct stat st;
  if (fstat(r->map_fd, &st) != 0 || (uint64_t)st.st_size < off + wl) {
    r->eof = true;
    return ms__pickle_err(r, MS_EIO,
                          "read error: the file shrank while it was read (it had %" PRIu64
                          " bytes when the read began)",
                          r->map_size);
  }
  void *m = mmap(NULL, wl, PROT_READ, MAP_PRIVATE | MAP_POPULATE, r->map_fd, (off_t)off);
  if (m == MAP_FAILED) {
    r->eof = true;
    return ms__pickle_err(r, MS_EIO, "read error: cannot map the file: %s", strerror(errno));
  }
  if (r->map) munmap(r->map, r->map_len);
  r->map = m;
  r->map_len = wl;
  r->buf = (char *)m + (at - off);
  r->base = at;
  r->pos = 0;
  r->len = r->cap = wl - (size_t)(at - off);
  r->eof = off + wl >= r->map_size;
  rd_set_lim(r);
  return MS_OK;
}

static int rd_read_more(rd_t *r) {
  if (r->eof) return MS_ETRUNCATED;
  if (r->map_fd >= 0) return rd_map_more(r);
  if (r->pos > 0) {
    memmove(r->buf, r->buf + r->pos, r->len - r->pos);
    r->base += r->pos;
    r->len -= r->pos;
    r->pos = 0;
  }
  if (r->cap < RD_BUF_CAP && r->base + r->len >= r->cap) {
    /* the input is larger than the first buffer: switch to the full size */
    char *nb = realloc(r->buf, RD_BUF_CAP);
    if (!nb) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
    r->buf = nb;
    r->cap = RD_BUF_CAP;
  }
  while (r->len < r->cap) {
    ptrdiff_t n = r->src->read(r->src->ctx, r->buf + r->len, r->cap - r->len);
    if (n < 0) { /* a failed source gives nothing more (a gzip source's error is sticky) */
      r->eof = true;
      rd_set_lim(r);
      return ms__pickle_err(r, (int)n, "read error: %s", ms_strerror((int)n));
    }
    if (n == 0) {
      r->eof = true;
      break;
    }
    r->len += (size_t)n;
    if (r->len >= 4096) break; /* enough to go on; keep latency low for pipes */
  }
  rd_set_lim(r);
  return MS_OK;
}

static int rd_truncated(rd_t *r, const char *what) {
  return ms__pickle_err(r, MS_ETRUNCATED, "pickle truncated: the input ends inside %s", what);
}

/* A read of n bytes (what) at the current position, checked against the current frame: at its
 * end the frame is over (unframed bytes or the next FRAME follow); a read that begins inside it
 * must end inside it. Python's pickle.py refuses the rest ("pickle exhausted before end of
 * frame"); its C unpickler does not look, and memsnap is the stricter of the two. */
static int rd_frame_crossed(rd_t *r, const char *what) {
  return ms__pickle_err(r, MS_EFORMAT,
                        "%s runs past the end of its frame (the FRAME at offset %" PRIu64
                        " declares %" PRIu64 " bytes, up to offset %" PRIu64 ")",
                        what, r->frame_at, r->frame_len, r->frame_end);
}

static int rd_frame_read(rd_t *r, uint64_t n, const char *what) {
  uint64_t at = r->base + r->pos;
  if (at == r->frame_end) {
    r->frame_end = RD_NO_FRAME;
    rd_set_lim(r);
    return MS_OK;
  }
  return n > r->frame_end - at ? rd_frame_crossed(r, what) : MS_OK;
}

/* Makes n (<= RD_BUF_CAP) bytes available at buf+pos. */
static int rd_need(rd_t *r, size_t n, const char *what) {
  if (r->frame_end != RD_NO_FRAME) MS_FORWARD_IF_ERROR(rd_frame_read(r, n, what));
  while (r->len - r->pos < n) {
    if (r->eof) return rd_truncated(r, what);
    int rc = rd_read_more(r);
    if (rc != MS_OK && rc != MS_ETRUNCATED) return rc;
    if (r->eof && r->len - r->pos < n) return rd_truncated(r, what);
  }
  return MS_OK;
}

/* rd_take (pickle_internal.h) when the buffer holds fewer than n bytes. */
MS_NOINLINE int ms__pickle_take_slow(rd_t *r, uint64_t n, const char **p, const char *what) {
  if (n <= RD_BUF_CAP / 2) {
    MS_FORWARD_IF_ERROR(rd_need(r, (size_t)n, what));
    *p = r->buf + r->pos;
    r->pos += (size_t)n;
    return MS_OK;
  }
  if (r->frame_end != RD_NO_FRAME) MS_FORWARD_IF_ERROR(rd_frame_read(r, n, what));
  r->scratch.len = 0;
  while (r->scratch.len < n) {
    if (r->pos == r->len) {
      if (r->eof) return rd_truncated(r, what);
      int rc = rd_read_more(r);
      if (rc != MS_OK && rc != MS_ETRUNCATED) return rc;
      if (r->pos == r->len) return rd_truncated(r, what);
    }
    size_t chunk = r->len - r->pos;
    if (chunk > n - r->scratch.len) chunk = (size_t)(n - r->scratch.len);
    if (MS_VEC_RESERVE(&r->scratch, chunk)) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
    memcpy(r->scratch.ptr + r->scratch.len, r->buf + r->pos, chunk);
    r->scratch.len += chunk;
    r->pos += chunk;
  }
  *p = r->scratch.ptr;
  return MS_OK;
}

/* Skips n bytes of a value whose content is not kept (bytes): memory stays constant whatever
 * n says. */
int ms__pickle_skip(rd_t *r, uint64_t n, const char *what) {
  if (n <= r->lim - r->pos) {
    r->pos += (size_t)n;
    return MS_OK;
  }
  if (r->frame_end != RD_NO_FRAME) MS_FORWARD_IF_ERROR(rd_frame_read(r, n, what));
  while (n) {
    if (r->pos == r->len) {
      if (r->eof) return rd_truncated(r, what);
      int rc = rd_read_more(r);
      if (rc != MS_OK && rc != MS_ETRUNCATED) return rc;
      if (r->pos == r->len) return rd_truncated(r, what);
    }
    size_t chunk = r->len - r->pos;
    if (chunk > n) chunk = (size_t)n;
    r->pos += chunk;
    n -= chunk;
  }
  return MS_OK;
}

/* Reads a text argument up to '\n' (protocol 0 opcodes); at most cap-1 bytes. */
static int rd_line(rd_t *r, char *out, size_t cap) {
  size_t n = 0;
  uint64_t frame_end = r->frame_end; /* a line that begins in a frame ends in it */
  for (;;) {
    if (n && r->base + r->pos == frame_end) return rd_frame_crossed(r, "a text argument");
    MS_FORWARD_IF_ERROR(rd_need(r, 1, "a text argument"));
    char c = r->buf[r->pos++];
    if (c == '\n') break;
    if (n + 1 >= cap)
      return ms__pickle_err(r, MS_ELIMIT, "text argument longer than %zu bytes", cap - 1);
    out[n++] = c;
  }
  out[n] = 0;
  return MS_OK;
}

static inline uint64_t rd_le(const char *p, size_t n) {
  uint64_t x = 0;
  for (size_t i = n; i-- > 0;) x = (x << 8) | (uint8_t)p[i];
  return x;
}

/* ---- stack and memo -------------------------------------------------------------------------- */

static int rd_need_values(rd_t *r, size_t n, const char *op) {
  size_t avail = r->st.len - rd_mark_pos(r);
  if (avail < n)
    return ms__pickle_err(r, MS_EFORMAT,
                          "%s needs %zu value%s on the stack above the mark, found %zu", op, n,
                          n == 1 ? "" : "s", avail);
  return MS_OK;
}

static int rd_memo_put(rd_t *r, uint64_t idx) {
  if (r->st.len == 0 || (r->marks.len && r->st.len == rd_mark_pos(r)))
    return ms__pickle_err(r, MS_EFORMAT, "memo put with nothing on the stack");
  if (idx > r->memo.len + (uint64_t)RD_MEMO_SLACK || idx >= UINT32_MAX)
    return ms__pickle_err(r, MS_ELIMIT,
                          "memo index %" PRIu64
                          " is far beyond the %zu entries stored (sparse memos are "
                          "not supported)",
                          idx, r->memo.len);
  return rd_memo_store(r, idx, &r->st.ptr[r->st.len - 1]);
}

/* Memo entry idx (set: the caller checked its tag). */
static inline rd_val_t rd_memo_value(const rd_t *r, uint64_t idx) {
  uint8_t tag = r->memo_tag.ptr[idx];
  if (tag & RD_TAG_SKIP) return (rd_val_t){V_SKIP, K_UNKNOWN, (uint8_t)(tag & 0x7f), 0, 0, {0}};
  if (tag == V_OBJ) return rd_obj_val(r->memo_obj.ptr[idx]);
  return r->memo.ptr[idx];
}

static int rd_memo_get(rd_t *r, uint64_t idx, const char *op) {
  if (idx >= r->memo.len || r->memo_tag.ptr[idx] == V_UNSET)
    return ms__pickle_err(r, MS_EFORMAT, "%s %" PRIu64 ": memo entry %" PRIu64 " was never stored",
                          op, idx, idx);
  if (rd_tag_freed(r->memo_tag.ptr[idx])) /* a frames list or entry whose objects were freed */
    MS_FORWARD_IF_ERROR(ms__pickle_revive(r, (uint32_t)idx));
  return rd_push(r, rd_memo_value(r, idx));
}

/* The container (of the given kind) that st[at-1] holds, into which op stores the values above
 * it; *id = RD_NO_OBJ for a skipped container. */
static int rd_target(rd_t *r, size_t at, uint8_t kind, const char *op, uint32_t *id) {
  if (at == 0 || (r->marks.len && at - 1 < rd_mark_pos(r)))
    return ms__pickle_err(r, MS_EFORMAT, "%s with nothing to add to", op);
  const rd_val_t *t = &r->st.ptr[at - 1];
  if (t->t == V_SKIP && t->kind == kind) { /* items of a skipped container: dropped */
    *id = RD_NO_OBJ;
    return MS_OK;
  }
  if (t->t != V_OBJ || r->objs.ptr[t->v.obj].kind != kind)
    return ms__pickle_err(r, MS_EFORMAT, "%s on a %s", op, ms__pickle_type_name(r, t));
  *id = t->v.obj;
  return MS_OK;
}

/* ---- opcodes: control ------------------------------------------------------------------------ */

/* rd_op_stop's answer: the pickle ended well. */
#define RD_STOPPED 1

static int rd_op_proto(rd_t *r) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "PROTO"));
  if ((uint8_t)p[0] > 5)
    return ms__pickle_err(r, MS_EUNSUPPORTED, "unsupported pickle protocol %u (0 to 5 are known)",
                          (uint8_t)p[0]);
  return MS_OK;
}

/* FRAME: the next n bytes are a frame. Reads may not cross its end (rd_frame_read), a FRAME may
 * not begin inside another one, and the input must hold the bytes it declares (rd_frame_held). */
static int rd_op_frame(rd_t *r) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 8, &p, "FRAME"));
  uint64_t n = rd_le(p, 8), at = r->base + r->pos;
  if (r->frame_end != RD_NO_FRAME && at < r->frame_end)
    return ms__pickle_err(r, MS_EFORMAT,
                          "FRAME inside the frame that the FRAME at offset %" PRIu64
                          " declares (it ends at offset %" PRIu64 ")",
                          r->frame_at, r->frame_end);
  if (n > (uint64_t)INT64_MAX) /* as Python's: larger than its largest size */
    return ms__pickle_err(r, MS_EFORMAT,
                          "FRAME length %" PRIu64 " is beyond the largest Python accepts (2^63-1)",
                          n);
  r->frame_at = r->op_off;
  r->frame_len = n;
  r->frame_end = at + n;
  rd_set_lim(r);
  return MS_OK;
}

/* At STOP: the input holds every byte that the current frame declares (Python's C unpickler
 * reads a whole frame when it meets FRAME). The rest of the frame is read and dropped, in
 * buffer-sized steps. */
static int rd_frame_held(rd_t *r) {
  while (r->frame_end != RD_NO_FRAME && r->base + r->len < r->frame_end) {
    if (r->eof)
      return ms__pickle_err(r, MS_ETRUNCATED,
                            "pickle truncated: the input ends at offset %" PRIu64
                            ", inside the frame that the FRAME at offset %" PRIu64
                            " declares (%" PRIu64 " bytes, up to offset %" PRIu64 ")",
                            r->base + r->len, r->frame_at, r->frame_len, r->frame_end);
    r->pos = r->len; /* what was read goes, to make room */
    int rc = rd_read_more(r);
    if (rc != MS_OK && rc != MS_ETRUNCATED) return rc;
  }
  return MS_OK;
}

/* STOP: @return RD_STOPPED when the top value is the snapshot's top-level container. */
static int rd_op_stop(rd_t *r) {
  if (r->st.len == 0 || r->st.len == rd_mark_pos(r))
    return ms__pickle_err(r, MS_EFORMAT, "STOP with an empty stack");
  const rd_val_t *t = &r->st.ptr[r->st.len - 1];
  if (t->t == V_OBJ && t->v.obj != r->root) /* a dict or list, but not the one opened first */
    return ms__pickle_err(r, MS_EFORMAT,
                          "not a PyTorch memory snapshot: the pickle returns a %s that is not its "
                          "first container (a snapshot's dict or list of segments comes first)",
                          ms__pickle_type_name(r, t));
  if (t->t != V_OBJ)
    return ms__pickle_err(r, MS_EFORMAT,
                          "not a PyTorch memory snapshot: the top-level object is %s %s, not a "
                          "dict or a list of segments",
                          strchr("aeiou", ms__pickle_type_name(r, t)[0]) ? "an" : "a",
                          ms__pickle_type_name(r, t));
  return RD_STOPPED;
}

/* ---- opcodes: stack and marks ---------------------------------------------------------------- */

static int rd_op_mark(rd_t *r) {
  if (r->marks.len >= RD_MAX_STACK)
    return ms__pickle_err(r, MS_ELIMIT, "more than %u nested MARKs", RD_MAX_STACK);
  if (MS_VEC_PUSH(&r->marks, (uint32_t)r->st.len))
    return ms__pickle_err(r, MS_ENOMEM, "out of memory");
  return MS_OK;
}

static int rd_op_pop(rd_t *r) {
  if (r->st.len == rd_mark_pos(r) && r->marks.len) {
    r->marks.len--; /* POP of a mark, as Python's pickle does */
  } else {
    MS_FORWARD_IF_ERROR(rd_need_values(r, 1, "POP"));
    r->st.len--;
  }
  return MS_OK;
}

static int rd_op_pop_mark(rd_t *r) {
  size_t from = 0;
  MS_FORWARD_IF_ERROR(rd_pop_mark(r, "POP_MARK", &from));
  r->st.len = from;
  return MS_OK;
}

static int rd_op_dup(rd_t *r) {
  MS_FORWARD_IF_ERROR(rd_need_values(r, 1, "DUP"));
  return rd_push(r, r->st.ptr[r->st.len - 1]);
}

/* ---- opcodes: scalars ------------------------------------------------------------------------ */

static int rd_op_none(rd_t *r) {
  rd_val_t v = {V_NONE, K_UNKNOWN, 0, 0, 0, {0}};
  return rd_push(r, v);
}

/* NEWTRUE (0x88), NEWFALSE (0x89) */
static int rd_op_bool(rd_t *r, int op) {
  rd_val_t v = {V_BOOL, K_UNKNOWN, 0, 0, 0, {.i = op == 0x88}};
  return rd_push(r, v);
}

/* BININT1 'K', BININT2 'M', BININT 'J' */
static int rd_op_binint(rd_t *r, int op) {
  const char *p = NULL;
  size_t n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
  MS_FORWARD_IF_ERROR(rd_take(r, n, &p, "an integer"));
  rd_val_t v = {V_INT, K_UNKNOWN, 0, 0, 0, {0}};
  uint64_t u = rd_le(p, n);
  v.v.i = op == 'J' ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
  return rd_push(r, v);
}

/* Two's complement little-endian integer of n bytes (LONG1/LONG4). */
static rd_val_t rd_decode_long(const char *p, size_t n) {
  rd_val_t v = {V_INT, K_UNKNOWN, 0, 0, 0, {0}};
  if (n == 0) return v;
  bool neg = (uint8_t)p[n - 1] & 0x80;
  uint8_t ext = neg ? 0xff : 0x00;
  size_t m = n;
  while (m > 0 && (uint8_t)p[m - 1] == ext) m--;
  if (!neg) {
    if (m > 8) {
      v.t = V_BIG;
      return v;
    }
    uint64_t u = rd_le(p, m);
    if (u <= (uint64_t)INT64_MAX) {
      v.v.i = (int64_t)u;
    } else {
      v.t = V_UINT;
      v.v.u = u;
    }
    return v;
  }
  if (m > 8 || (m == 8 && !((uint8_t)p[7] & 0x80))) {
    v.t = V_BIG;
    return v;
  }
  uint64_t u = rd_le(p, m);
  if (m < 8) u |= ~(uint64_t)0 << (8 * m);
  memcpy(&v.v.i, &u, sizeof u);
  return v;
}

/* LONG1 (0x8a), LONG4 (0x8b) */
static int rd_op_long(rd_t *r, int op) {
  const char *p = NULL;
  uint64_t n;
  if (op == 0x8a) {
    MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "LONG1"));
    n = (uint8_t)p[0];
  } else {
    MS_FORWARD_IF_ERROR(rd_take(r, 4, &p, "LONG4"));
    int32_t sn = (int32_t)(uint32_t)rd_le(p, 4);
    if (sn < 0)
      return ms__pickle_err(r, MS_EFORMAT, "LONG4 with a negative length (%" PRId32 ")", sn);
    n = (uint64_t)sn;
    if (n > RD_MAX_LONG)
      return ms__pickle_err(r, MS_ELIMIT,
                            "integer of %" PRIu64 " bytes is beyond the reader's limit", n);
  }
  /* LONG1 of 1 to 8 bytes (PyTorch's addresses and times) with 8 bytes in the buffer */
  if (op == 0x8a && n - 1 < 8 && r->lim - r->pos >= 8) {
    const unsigned char *q = (const unsigned char *)r->buf + r->pos;
    r->pos += (size_t)n;
    return rd_push(r, rd_long1(q, (size_t)n));
  }
  MS_FORWARD_IF_ERROR(rd_take(r, n, &p, "an integer"));
  return rd_push(r, rd_decode_long(p, (size_t)n));
}

/* INT 'I' (protocol 0; "I01" is True), LONG 'L' (protocol 0) */
static int rd_op_int_text(rd_t *r, int op) {
  char line[64], *end;
  MS_FORWARD_IF_ERROR(rd_line(r, line, sizeof line));
  size_t ln = strlen(line);
  if (op == 'L' && ln && line[ln - 1] == 'L') line[--ln] = 0;
  rd_val_t v = {V_INT, K_UNKNOWN, 0, 0, 0, {0}};
  if (op == 'I' && (strcmp(line, "00") == 0 || strcmp(line, "01") == 0)) {
    v.t = V_BOOL;
    v.v.i = line[1] == '1';
  } else {
    errno = 0;
    long long x = strtoll(line, &end, 10);
    if (end == line || *end) return ms__pickle_err(r, MS_EFORMAT, "bad integer text '%s'", line);
    if (errno) {
      v.t = V_BIG;
      if (line[0] != '-') {
        errno = 0;
        unsigned long long ux = strtoull(line, &end, 10);
        if (!errno) {
          v.t = V_UINT;
          v.v.u = ux;
        }
      }
    } else {
      v.v.i = x;
    }
  }
  return rd_push(r, v);
}

/* FLOAT 'F' (protocol 0) */
static int rd_op_float_text(rd_t *r) {
  char line[64], *end;
  MS_FORWARD_IF_ERROR(rd_line(r, line, sizeof line));
  rd_val_t v = {V_FLOAT, K_UNKNOWN, 0, 0, 0, {0}};
  v.v.f = strtod(line, &end);
  if (end == line || *end) return ms__pickle_err(r, MS_EFORMAT, "bad float text '%s'", line);
  return rd_push(r, v);
}

/* BINFLOAT: big-endian IEEE 754 double */
static int rd_op_binfloat(rd_t *r) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 8, &p, "BINFLOAT"));
  uint64_t u = 0;
  for (int i = 0; i < 8; i++) u = (u << 8) | (uint8_t)p[i];
  rd_val_t v = {V_FLOAT, K_UNKNOWN, 0, 0, 0, {0}};
  memcpy(&v.v.f, &u, sizeof u);
  return rd_push(r, v);
}

/* ---- opcodes: strings (their values: pickle_objects.c) --------------------------------------- */

/* SHORT_BINUNICODE (0x8c), SHORT_BINSTRING 'U', SHORT_BINBYTES 'C': one length byte */
static int rd_op_short_str(rd_t *r, int op) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "a string length"));
  return ms__pickle_str(r, (uint8_t)p[0], op);
}

/* BINUNICODE 'X', BINSTRING 'T' (signed length), BINBYTES 'B': four length bytes */
static int rd_op_str4(rd_t *r, int op) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 4, &p, "a string length"));
  uint64_t n = rd_le(p, 4);
  if (op == 'T' && (n & 0x80000000u))
    return ms__pickle_err(r, MS_EFORMAT, "BINSTRING with a negative length");
  return ms__pickle_str(r, n, op);
}

/* BINUNICODE8 (0x8d), BINBYTES8 (0x8e), BYTEARRAY8 (0x96): eight length bytes */
static int rd_op_str8(rd_t *r, int op) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 8, &p, "a string length"));
  return ms__pickle_str(r, rd_le(p, 8), op);
}

/* ---- opcodes: containers (created in pickle_objects.c, filled in pickle_schema.c) ------------ */

/* EMPTY_DICT '}', EMPTY_LIST ']', EMPTY_SET (0x8f) */
static int rd_op_empty(rd_t *r, int op) {
  uint8_t kind = op == '}' ? O_DICT : op == ']' ? O_LIST : O_SET;
  /* a skipped trace's entries and frames lists (ms__pickle_create's first answer), pushed here */
  if (rd_born_skipped(r, kind)) {
    if (kind == O_DICT && r->skip_trace) { /* a trace entry: read whole when it can be */
      bool done = false;
      MS_FORWARD_IF_ERROR(ms__pickle_skim_entry(r, &done));
      if (done) return MS_OK;
    }
    return rd_push(r, (rd_val_t){V_SKIP, K_UNKNOWN, kind, 0, 0, {0}});
  }
  bool done = false;
  if (kind == O_DICT) MS_FORWARD_IF_ERROR(ms__pickle_entry_dict(r, &done)); /* a trace entry */
  if (done) return MS_OK;
  rd_val_t v;
  MS_FORWARD_IF_ERROR(ms__pickle_create(r, kind, &v));
  MS_FORWARD_IF_ERROR(rd_push(r, v));
  bool entry = v.t == V_OBJ && r->objs.ptr[v.v.obj].role == R_TRACE; /* read whole if it can be */
  return entry && ms__pickle_fast ? ms__pickle_entry(r, v.v.obj) : MS_OK;
}

/* TUPLE1 (0x85), TUPLE2 (0x86), TUPLE3 (0x87) */
static int rd_op_tuple_n(rd_t *r, int op) {
  size_t n = (size_t)(op - 0x84);
  MS_FORWARD_IF_ERROR(rd_need_values(r, n, "TUPLE1/2/3"));
  return ms__pickle_tuple(r, r->st.len - n);
}

static int rd_op_tuple_mark(rd_t *r) {
  size_t from = 0;
  MS_FORWARD_IF_ERROR(rd_pop_mark(r, "TUPLE", &from));
  return ms__pickle_tuple(r, from);
}

static int rd_op_frozenset(rd_t *r) {
  size_t from = 0;
  MS_FORWARD_IF_ERROR(rd_pop_mark(r, "FROZENSET", &from));
  MS_FORWARD_IF_ERROR(ms__pickle_check_hashable(r, from, 1, "FROZENSET", "set item"));
  r->st.len = from;
  rd_val_t v = {V_FSET, K_UNKNOWN, 0, 0, 0, {0}};
  return rd_push(r, v);
}

static int rd_op_setitem(rd_t *r) {
  MS_FORWARD_IF_ERROR(rd_need_values(r, 3, "SETITEM"));
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_target(r, r->st.len - 2, O_DICT, "SETITEM", &id));
  return ms__pickle_setitems(r, id, r->st.len - 2, "SETITEM");
}

static int rd_op_setitems(rd_t *r) {
  size_t from = 0;
  MS_FORWARD_IF_ERROR(rd_pop_mark(r, "SETITEMS", &from));
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_target(r, from, O_DICT, "SETITEMS", &id));
  if (id == RD_NO_OBJ && !((r->st.len - from) & 1)) { /* a skipped dict: its keys checked, dropped */
    size_t i = from;
    while (i < r->st.len && !rd_unhashable(&r->st.ptr[i])) i += 2;
    if (i >= r->st.len) {
      r->st.len = from;
      return MS_OK;
    }
  }
  return ms__pickle_setitems(r, id, from, "SETITEMS"); /* what it refuses, and why */
}

static int rd_op_append(rd_t *r) {
  MS_FORWARD_IF_ERROR(rd_need_values(r, 2, "APPEND"));
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_target(r, r->st.len - 1, O_LIST, "APPEND", &id));
  return ms__pickle_appends(r, id, r->st.len - 1);
}

static int rd_op_appends(rd_t *r) {
  size_t from = 0;
  MS_FORWARD_IF_ERROR(rd_pop_mark(r, "APPENDS", &from));
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_target(r, from, O_LIST, "APPENDS", &id));
  return ms__pickle_appends(r, id, from);
}

/* ADDITEMS: sets are not part of the schema */
static int rd_op_additems(rd_t *r) {
  size_t from = 0;
  MS_FORWARD_IF_ERROR(rd_pop_mark(r, "ADDITEMS", &from));
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_target(r, from, O_SET, "ADDITEMS", &id));
  MS_FORWARD_IF_ERROR(ms__pickle_check_hashable(r, from, 1, "ADDITEMS", "set item"));
  r->st.len = from;
  return MS_OK;
}

/* ---- opcodes: memo --------------------------------------------------------------------------- */

static int rd_op_binput(rd_t *r) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "BINPUT"));
  return rd_memo_put(r, (uint8_t)p[0]);
}

static int rd_op_long_binput(rd_t *r) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 4, &p, "LONG_BINPUT"));
  return rd_memo_put(r, rd_le(p, 4));
}

static int rd_op_binget(rd_t *r) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "BINGET"));
  return rd_memo_get(r, (uint8_t)p[0], "BINGET");
}

static int rd_op_long_binget(rd_t *r) {
  const char *p = NULL;
  MS_FORWARD_IF_ERROR(rd_take(r, 4, &p, "LONG_BINGET"));
  return rd_memo_get(r, rd_le(p, 4), "LONG_BINGET");
}

/* A run of BINGET ('h') and LONG_BINGET ('j'), the opcode at buf[pos - 1] being the first:
 * PyTorch's files are mostly such runs (a frames list's frame dicts, every dict's keys), so
 * they are decoded here in one loop, with the stack and memo in locals, instead of once per turn
 * of rd_run's dispatch. A get that is not plain (an index never stored, a full stack) and one
 * whose argument reaches the buffer's or a frame's end take the opcode's own path. */
static int rd_op_get_run(rd_t *r, int op) {
  if (r->skip_trace ? ms__pickle_skip_list_run(r, op) : ms__pickle_frames_run(r, op)) return MS_OK;
  size_t pos = r->pos, lim = r->lim;
  const unsigned char *buf = (const unsigned char *)r->buf;
  const rd_val_t *memo = r->memo.ptr;
  const uint32_t *memo_obj = r->memo_obj.ptr;
  const uint8_t *tag = r->memo_tag.ptr;
  size_t nmemo = r->memo.len;
  rd_val_t *st = r->st.ptr;
  size_t len = r->st.len, room = r->st.cap < RD_MAX_STACK ? r->st.cap : RD_MAX_STACK;
  for (;;) {
    size_t n = op == 'j' ? 4 : 1;
    if (ms_unlikely(n > lim - pos)) {
      r->st.len = len;
      r->pos = pos;
      r->op_off = r->base + pos - 1;
      return op == 'j' ? rd_op_long_binget(r) : rd_op_binget(r);
    }
    uint32_t idx = op == 'j' ? rd_le32(buf + pos) : buf[pos];
    pos += n;
    if (ms_likely(idx < nmemo && tag[idx] != V_UNSET && tag[idx] < RD_TAG_TFRAMES && len < room)) {
      st[len++] = tag[idx] == V_OBJ ? rd_obj_val(memo_obj[idx]) : memo[idx];
    } else {
      r->st.len = len;
      r->pos = pos;
      r->op_off = r->base + pos - n - 1;
      MS_FORWARD_IF_ERROR(rd_memo_get(r, idx, op == 'j' ? "LONG_BINGET" : "BINGET"));
      st = r->st.ptr;
      len = r->st.len;
      room = r->st.cap < RD_MAX_STACK ? r->st.cap : RD_MAX_STACK;
    }
    if (pos >= lim) break;
    op = buf[pos];
    if (op != 'j' && op != 'h') break;
    pos++;
  }
  r->st.len = len;
  r->pos = pos;
  return MS_OK;
}

/* PUT 'p', GET 'g' (protocol 0): the index as text */
static int rd_op_memo_text(rd_t *r, int op) {
  char line[32], *end;
  MS_FORWARD_IF_ERROR(rd_line(r, line, sizeof line));
  errno = 0;
  unsigned long long x = strtoull(line, &end, 10);
  if (end == line || *end || errno || line[0] == '-')
    return ms__pickle_err(r, MS_EFORMAT, "bad memo index text '%s'", line);
  return op == 'p' ? rd_memo_put(r, x) : rd_memo_get(r, x, "GET");
}

/* ---- opcodes: refused and unknown ------------------------------------------------------------ */

static const char *rd_refused_name(int op) {
  switch (op) {
  case 'c': return "GLOBAL";
  case 0x93: return "STACK_GLOBAL";
  case 'R': return "REDUCE";
  case 'b': return "BUILD";
  case 'i': return "INST";
  case 'o': return "OBJ";
  case 0x81: return "NEWOBJ";
  case 0x92: return "NEWOBJ_EX";
  case 'P': return "PERSID";
  case 'Q': return "BINPERSID";
  case 0x82: return "EXT1";
  case 0x83: return "EXT2";
  case 0x84: return "EXT4";
  case 0x97: return "NEXT_BUFFER";
  case 0x98: return "READONLY_BUFFER";
  default: return NULL;
  }
}

/* STRING 'S', UNICODE 'V' (protocol 0 text strings), the opcodes that would run Python code,
 * and unknown ones. */
static int rd_op_refused(rd_t *r, int op) {
  if (op == 'S' || op == 'V')
    return ms__pickle_err(r, MS_EUNSUPPORTED,
                          "opcode %s (protocol 0 text strings) is not supported; PyTorch writes "
                          "protocol 2 or later",
                          op == 'S' ? "STRING" : "UNICODE");
  const char *name = rd_refused_name(op);
  if (name)
    return ms__pickle_err(
        r, MS_EREFUSED,
        "opcode %s refused: it would import or call Python code, and memsnap never "
        "executes anything from a pickle",
        name);
  return ms__pickle_err(r, MS_EFORMAT, "unknown opcode 0x%02x", (unsigned)op);
}

/* ---- the run loop ---------------------------------------------------------------------------- */

/* Runs the VM until STOP. Each opcode's work is one of the rd_op_* above, all static in this
 * file so that the compiler inlines them into this loop, as it did when they were its cases. */
static int rd_run(rd_t *r) {
  for (;;) {
    if (ms_unlikely(r->pos >= r->lim)) {
      r->op_off = r->base + r->pos;
      MS_FORWARD_IF_ERROR(rd_need(r, 1, "an opcode (no STOP)"));
    }
    r->op_off = r->base + r->pos;
    int op = (uint8_t)r->buf[r->pos++];
    int rc;
    switch (op) {
    /* control */
    case 0x80: rc = rd_op_proto(r); break;           /* PROTO */
    case 0x95: rc = rd_op_frame(r); break;           /* FRAME */
    case '.': /* STOP */
      rc = rd_op_stop(r);
      if (rc == RD_STOPPED) rc = rd_frame_held(r);
      return rc;
    /* stack and marks */
    case '(': rc = rd_op_mark(r); break;             /* MARK */
    case '0': rc = rd_op_pop(r); break;              /* POP */
    case '1': rc = rd_op_pop_mark(r); break;         /* POP_MARK */
    case '2': rc = rd_op_dup(r); break;              /* DUP */
    /* scalars */
    case 'N': rc = rd_op_none(r); break;             /* NONE */
    case 0x88:                                       /* NEWTRUE */
    case 0x89: rc = rd_op_bool(r, op); break;        /* NEWFALSE */
    case 'K':                                        /* BININT1 */
    case 'M':                                        /* BININT2 */
    case 'J': rc = rd_op_binint(r, op); break;       /* BININT */
    case 0x8a:                                       /* LONG1 */
    case 0x8b: rc = rd_op_long(r, op); break;        /* LONG4 */
    case 'I':                                        /* INT */
    case 'L': rc = rd_op_int_text(r, op); break;     /* LONG */
    case 'F': rc = rd_op_float_text(r); break;       /* FLOAT */
    case 'G': rc = rd_op_binfloat(r); break;         /* BINFLOAT */
    /* strings */
    case 0x8c:                                       /* SHORT_BINUNICODE */
    case 'U':                                        /* SHORT_BINSTRING */
    case 'C': rc = rd_op_short_str(r, op); break;    /* SHORT_BINBYTES */
    case 'X':                                        /* BINUNICODE */
    case 'T':                                        /* BINSTRING */
    case 'B': rc = rd_op_str4(r, op); break;         /* BINBYTES */
    case 0x8d:                                       /* BINUNICODE8 */
    case 0x8e:                                       /* BINBYTES8 */
    case 0x96: rc = rd_op_str8(r, op); break;        /* BYTEARRAY8 */
    /* containers */
    case '}':                                        /* EMPTY_DICT */
    case ']':                                        /* EMPTY_LIST */
    case 0x8f: rc = rd_op_empty(r, op); break;       /* EMPTY_SET */
    case 'd': rc = ms__pickle_build_from_mark(r, O_DICT, "DICT"); break;
    case 'l': rc = ms__pickle_build_from_mark(r, O_LIST, "LIST"); break;
    case ')': rc = ms__pickle_tuple(r, r->st.len); break; /* EMPTY_TUPLE */
    case 0x85:                                       /* TUPLE1 */
    case 0x86:                                       /* TUPLE2 */
    case 0x87: rc = rd_op_tuple_n(r, op); break;     /* TUPLE3 */
    case 't': rc = rd_op_tuple_mark(r); break;       /* TUPLE */
    case 0x91: rc = rd_op_frozenset(r); break;       /* FROZENSET */
    case 's': rc = rd_op_setitem(r); break;          /* SETITEM */
    case 'u': rc = rd_op_setitems(r); break;         /* SETITEMS */
    case 'a': rc = rd_op_append(r); break;           /* APPEND */
    case 'e': rc = rd_op_appends(r); break;          /* APPENDS */
    case 0x90: rc = rd_op_additems(r); break;        /* ADDITEMS */
    /* memo */
    case 0x94: rc = rd_memo_put(r, r->memo.len); break; /* MEMOIZE */
    case 'q': rc = rd_op_binput(r); break;           /* BINPUT */
    case 'r': rc = rd_op_long_binput(r); break;      /* LONG_BINPUT */
    case 'h':                                        /* BINGET */
    case 'j': rc = rd_op_get_run(r, op); break;      /* LONG_BINGET */
    case 'p':                                        /* PUT */
    case 'g': rc = rd_op_memo_text(r, op); break;    /* GET */
    /* STRING, UNICODE, the opcodes that run code, unknown ones */
    default: return rd_op_refused(r, op);
    }
    MS_FORWARD_IF_ERROR(rc);
  }
}

/* ---- the entry point ------------------------------------------------------------------------- */

/* Reads from r (its input set up by the caller: a source and a first buffer, or a mapped file)
 * and releases r. */
static int rd_read(rd_t *r, unsigned flags, ms_snapshot_t **out, ms_errbuf_t *eb,
                   bool *cannot_skip) {
  int rc = MS_OK;
  r->eb = eb;
  r->root = RD_NO_OBJ;
  r->root_segments = RD_NO_OBJ;
  r->fbuf_owner = RD_NO_OBJ;
  r->pframe_free = RD_NO_OBJ;
  r->free_obj = RD_NO_OBJ;
  r->skip_trace = (flags & MS_LOAD_NO_TRACE) != 0;
  ms__pickle_drop_init(r, flags);
  r->frame_end = RD_NO_FRAME;
  ms__snapbuild_init(&r->b);
  /* the memo's values are written only for what is not a container: most of its pages stay
   * untouched, and it must not take a previous read's resident pages (common/internal.h) */
  if (MS_BIGVEC_RESERVE(&r->memo, 1) == 0) ms__big_sparse(r->memo.ptr);
  /* The first opcode must be PROTO (protocols 2 to 5); say so plainly for other files. */
  rc = rd_need(r, 2, "the pickle header");
  if (rc == MS_OK && ((uint8_t)r->buf[0] != 0x80 || (uint8_t)r->buf[1] < 2))
    rc = ms__errbuf_set(eb, MS_EFORMAT,
                        "offset 0: not a pickle of protocol 2 or later (PyTorch snapshots start "
                        "with 0x80 0x02..0x05)");
  if (rc == MS_OK) rc = rd_run(r);
  ms_snapshot_t *snap = NULL;
  if (rc == MS_OK) rc = ms__pickle_finish(r, &snap);
  if (rc == MS_OK && (rc = ms__pickle_defer_finish(r, snap)) != MS_OK) {
    ms_snapshot_free(snap);
    snap = NULL;
  }
  if (cannot_skip) *cannot_skip = r->cannot_skip;
  ms__snapbuild_release(&r->b);
  if (r->map_fd >= 0) {
    if (r->map) munmap(r->map, r->map_len);
  } else {
    free(r->buf);
  }
  MS_VEC_FREE(&r->scratch);
  MS_VEC_FREE(&r->st);
  MS_VEC_FREE(&r->marks);
  ms__big_free(r->memo.ptr); /* MS_BIGVEC_RESERVE's */
  ms__big_free(r->memo_obj.ptr);
  ms__big_free(r->memo_tag.ptr);
  ms__big_free(r->objs.ptr);
  ms__pickle_retire_release(r);
  MS_VEC_FREE(&r->pframes);
  MS_VEC_FREE(&r->pairs);
  MS_VEC_FREE(&r->tmp);
  ms__pickle_drop_release(r);
  free(r->fcache);
  free(r);
  if (rc == MS_OK) *out = snap;
  return rc;
}

int ms__pickle_read(ms_source_t *src, unsigned flags, ms_snapshot_t **out, ms_errbuf_t *eb,
                    bool *cannot_skip) {
  if (cannot_skip) *cannot_skip = false;
  if (!src || !src->read || !out) return ms__errbuf_set(eb, MS_EINVAL, "invalid argument");
  if (flags & ~(unsigned)MS_LOAD_FLAGS_ALL)
    return ms__errbuf_set(eb, MS_EINVAL, "unknown load flags 0x%x", flags);
  rd_t *r = calloc(1, sizeof *r);
  if (!r) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  r->buf = malloc(RD_BUF_MIN);
  r->cap = RD_BUF_MIN;
  if (!r->buf) {
    free(r);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  r->src = src;
  r->map_fd = -1;
  return rd_read(r, flags, out, eb, cannot_skip);
}

int ms__pickle_read_fd(int fd, uint64_t size, unsigned flags, ms_snapshot_t **out,
                       ms_errbuf_t *eb, bool *cannot_skip) {
  if (cannot_skip) *cannot_skip = false;
  if (fd < 0 || !out) return ms__errbuf_set(eb, MS_EINVAL, "invalid argument");
  if (flags & ~(unsigned)MS_LOAD_FLAGS_ALL)
    return ms__errbuf_set(eb, MS_EINVAL, "unknown load flags 0x%x", flags);
  rd_t *r = calloc(1, sizeof *r);
  if (!r) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  r->map_fd = fd;
  r->map_size = size;
  r->buf = NULL; /* the first window is mapped by the first rd_need */
  return rd_read(r, flags, out, eb, cannot_skip);
}

int ms_pickle_read(ms_source_t *src, ms_snapshot_t **out, ms_errbuf_t *eb) {
  return ms__pickle_read(src, 0, out, eb, NULL);
}

int ms_pickle_read_ex(ms_source_t *src, unsigned flags, ms_snapshot_t **out, ms_errbuf_t *eb) {
  return ms__pickle_read(src, flags, out, eb, NULL);
}
