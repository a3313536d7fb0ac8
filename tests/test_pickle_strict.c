/* SPDX-License-Identifier: MIT
 * memsnap tests: what the readers refuse and what reading hostile input costs (issue #16).
 *
 *  - pickle_strict: hand-built pickles that Python's unpickler rejects are rejected, with the
 *    opcode and the offset: invalid UTF-8 (ASCII for Python 2 strings), unhashable dict keys and
 *    set items, frames that are crossed, nested, too long or not held by the input (item 20).
 *    Each case also goes through python3 (both unpicklers) when it is installed, to prove the
 *    table right: at least one of them must refuse what memsnap refuses, and both must accept
 *    what it accepts.
 *  - pickle_gzip: gzip-compressed pickles corrupted at several places (a stored block's lengths,
 *    a block type, the CRC, the length, the end, trailing bytes): the message names the offset
 *    in the compressed file where it went wrong, and the pickle's own errors say that their
 *    offset is in the inflated data (item 23).
 *  - pickle_pipe_memory: absurd declared lengths fed through a pipe to the CLI fail fast, at the
 *    end of the input, with a peak RSS far below the declared size (item 24); the same for the
 *    memsnap format's str32 (suite serialize_pipe_memory).
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "snapshot/zio.h"

#define BIN(s) (s), sizeof(s) - 1

/* ---- helpers --------------------------------------------------------------------------------- */

typedef th_bytes_t buf_t; /* tests/helpers.h */

static const char *tmpdir_path(void) {
  static char *dir;
  if (!dir) dir = th_tmpdir();
  cr_assert(dir);
  return dir;
}

static const char *memsnap_bin(void) {
  const char *b = getenv("MEMSNAP_BIN");
  if (!b || access(b, X_OK) != 0) {
    printf("SKIP: memsnap binary not found (MEMSNAP_BIN=%s)\n", b ? b : "");
    fflush(stdout);
    cr_skip_test("memsnap binary not built");
  }
  return b;
}

/* ---- 20. what Python's unpickler rejects ----------------------------------------------------- */

/* FRAME with an 8-byte length, as bytes of a string literal */
#define FRAME(n) "\x95" n "\x00\x00\x00\x00\x00\x00\x00"

typedef struct case_s {
  const char *bytes;
  size_t len;
  int code;        /* MS_OK: accepted (a loadable snapshot) */
  const char *msg; /* the exact error */
} case_t;

static const case_t cases[] = {
    /* strings: UTF-8 as Python decodes it ("surrogatepass"), ASCII for Python 2 str */
    {BIN("\x80\x04\x8c\x03" "a\xff" "b."), MS_EFORMAT,
     "offset 2: SHORT_BINUNICODE string is not valid UTF-8: byte 0xff at offset 5 (Python's "
     "unpickler raises UnicodeDecodeError)"},
    {BIN("\x80\x04X\x02\x00\x00\x00\xc3(."), MS_EFORMAT,
     "offset 2: BINUNICODE string is not valid UTF-8: byte 0xc3 at offset 7 (Python's unpickler "
     "raises UnicodeDecodeError)"},
    {BIN("\x80\x04\x8d\x03\x00\x00\x00\x00\x00\x00\x00" "ab\xe2."), MS_EFORMAT,
     "offset 2: BINUNICODE8 string is not valid UTF-8: byte 0xe2 at offset 13 (Python's unpickler "
     "raises UnicodeDecodeError)"},
    {BIN("\x80\x04\x8c\x02\xc0\x80."), MS_EFORMAT, /* overlong NUL */
     "offset 2: SHORT_BINUNICODE string is not valid UTF-8: byte 0xc0 at offset 4 (Python's "
     "unpickler raises UnicodeDecodeError)"},
    {BIN("\x80\x04\x8c\x03\xe0\x80\x80."), MS_EFORMAT, /* overlong, three bytes */
     "offset 2: SHORT_BINUNICODE string is not valid UTF-8: byte 0xe0 at offset 4 (Python's "
     "unpickler raises UnicodeDecodeError)"},
    {BIN("\x80\x04\x8c\x04\xf4\x90\x80\x80."), MS_EFORMAT, /* beyond U+10FFFF */
     "offset 2: SHORT_BINUNICODE string is not valid UTF-8: byte 0xf4 at offset 4 (Python's "
     "unpickler raises UnicodeDecodeError)"},
    {BIN("\x80\x04\x8c\x0c" "abcdefghijk\x80."), MS_EFORMAT, /* after eight ASCII bytes */
     "offset 2: SHORT_BINUNICODE string is not valid UTF-8: byte 0x80 at offset 15 (Python's "
     "unpickler raises UnicodeDecodeError)"},
    {BIN("\x80\x02U\x01\xe9."), MS_EFORMAT,
     "offset 2: SHORT_BINSTRING string is not valid ASCII: byte 0xe9 at offset 4 (Python's "
     "unpickler raises UnicodeDecodeError)"},
    {BIN("\x80\x02T\x02\x00\x00\x00" "a\x80."), MS_EFORMAT,
     "offset 2: BINSTRING string is not valid ASCII: byte 0x80 at offset 8 (Python's unpickler "
     "raises UnicodeDecodeError)"},
    /* what Python cannot hash, as a dict key or a set item */
    {BIN("\x80\x04}}}s."), MS_EFORMAT,
     "offset 5: SETITEM: the dict key is a dict, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    {BIN("\x80\x04}(]K\x01u."), MS_EFORMAT,
     "offset 7: SETITEMS: the dict key is a list, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    {BIN("\x80\x04}(\x8c\x01kK\x01]K\x02u."), MS_EFORMAT, /* the second pair's key */
     "offset 12: SETITEMS: the dict key is a list, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    {BIN("\x80\x04}]\x85K\x01s."), MS_EFORMAT,
     "offset 7: SETITEM: the dict key is a tuple holding a dict, list, set or bytearray, which "
     "Python cannot hash (its unpickler raises TypeError)"},
    {BIN("\x80\x04}K\x01]\x86\x85K\x01s."), MS_EFORMAT, /* a tuple in a tuple */
     "offset 10: SETITEM: the dict key is a tuple holding a dict, list, set or bytearray, which "
     "Python cannot hash (its unpickler raises TypeError)"},
    {BIN("\x80\x04}\x8fK\x01s."), MS_EFORMAT,
     "offset 6: SETITEM: the dict key is a set, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    {BIN("\x80\x05}\x96\x01\x00\x00\x00\x00\x00\x00\x00" "aK\x01s."), MS_EFORMAT,
     "offset 15: SETITEM: the dict key is a bytearray, which Python cannot hash (its unpickler "
     "raises TypeError)"},
    {BIN("\x80\x04}q\x00h\x00K\x01s."), MS_EFORMAT, /* the dict itself, from the memo */
     "offset 9: SETITEM: the dict key is a dict, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    {BIN("\x80\x02(]K\x01" "d."), MS_EFORMAT, /* protocol 0/1 DICT */
     "offset 6: DICT: the dict key is a list, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    {BIN("\x80\x04\x8f(]\x90."), MS_EFORMAT,
     "offset 5: ADDITEMS: the set item is a list, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    {BIN("\x80\x04(}\x91."), MS_EFORMAT,
     "offset 4: FROZENSET: the set item is a dict, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    /* a list key in a segment (it used to be ignored, and the segment's frames with it) */
    {BIN("\x80\x04}(\x8c\x08segments](}(\x8c\x06" "device" "K\x00" "]\x8c\x01xuau."), MS_EFORMAT,
     "offset 32: SETITEMS: the dict key is a list, which Python cannot hash (its unpickler raises "
     "TypeError)"},
    /* frames */
    {BIN("\x80\x04" FRAME("\x04") "}\x8c\x05" "abcde."), MS_EFORMAT, /* a string across the end */
     "offset 12: a string runs past the end of its frame (the FRAME at offset 2 declares 4 bytes, "
     "up to offset 15)"},
    {BIN("\x80\x04" FRAME("\x03") "}J\x01\x00\x00\x00."), MS_EFORMAT, /* an argument across it */
     "offset 12: an integer runs past the end of its frame (the FRAME at offset 2 declares 3 "
     "bytes, up to offset 14)"},
    {BIN("\x80\x04" FRAME("\x03") "}I12\n."), MS_EFORMAT, /* a text line across it */
     "offset 12: a text argument runs past the end of its frame (the FRAME at offset 2 declares 3 "
     "bytes, up to offset 14)"},
    {BIN("\x80\x04" FRAME("\x05") "}" FRAME("\x02") "]."), MS_EFORMAT, /* FRAME's own argument */
     "offset 12: FRAME runs past the end of its frame (the FRAME at offset 2 declares 5 bytes, up "
     "to offset 16)"},
    {BIN("\x80\x04" FRAME("\x14") "}" FRAME("\x02") "}.\0\0\0\0\0\0\0\0\0\0"), MS_EFORMAT,
     "offset 12: FRAME inside the frame that the FRAME at offset 2 declares (it ends at offset "
     "31)"},
    {BIN("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff}."), MS_EFORMAT,
     "offset 2: FRAME length 18446744073709551615 is beyond the largest Python accepts (2^63-1)"},
    {BIN("\x80\x04" FRAME("\x64") "]."), MS_ETRUNCATED, /* STOP before the frame's end */
     "offset 12: pickle truncated: the input ends at offset 13, inside the frame that the FRAME at "
     "offset 2 declares (100 bytes, up to offset 111)"},
    /* accepted, as Python accepts them */
    {BIN("\x80\x04" FRAME("\x01") "]."), MS_OK, NULL},           /* STOP after the frame */
    {BIN("\x80\x04" FRAME("\x00") FRAME("\x02") "]."), MS_OK, NULL}, /* an empty frame */
    {BIN("\x80\x04" FRAME("\x04") "}(\x8c\x08" "segments]u."), MS_OK, NULL}, /* reads that
                                                                 begin at the frame's end */
    {BIN("\x80\x04" FRAME("\x03") "].\0"), MS_OK, NULL}, /* bytes after STOP, in the frame */
    {BIN("\x80\x04}(\x8c\x08segments]\x8c\x03\xed\xa0\x80K\x01\x8c\x02\xc3\xa9K\x02\x8c\x04"
         "\xf0\x9f\x98\x80K\x03\x8c\x03\xef\xbf\xbfK\x04u."),
     MS_OK, NULL}, /* a lone surrogate (pickle's "surrogatepass"), é, U+1F600, U+FFFF */
    {BIN("\x80\x04}(\x8c\x08segments]K\x01\x85K\x01\x43\x01\xffK\x02u."), MS_OK,
     NULL}, /* a tuple of an int and bytes as keys: hashable */
};
#define NCASES (sizeof cases / sizeof cases[0])

Test(pickle_strict, hand_built_pickles) {
  for (size_t i = 0; i < NCASES; i++) {
    const case_t *c = &cases[i];
    ms_snapshot_t *s = (ms_snapshot_t *)0x1;
    ms_errbuf_t eb;
    int rc = th_pickle_read_mem(c->bytes, c->len, 0, &s, &eb);
    cr_assert_eq(rc, c->code, "case %zu: expected %s, got %s (%s)", i, ms_err_name(c->code),
                 ms_err_name(rc), eb.msg);
    if (c->code == MS_OK) {
      ms_snapshot_free(s);
      continue;
    }
    cr_assert_eq(s, (ms_snapshot_t *)0x1, "case %zu: out-parameter touched on failure", i);
    cr_assert_str_eq(eb.msg, c->msg, "case %zu:\n got: %s\nwant: %s", i, eb.msg, c->msg);
  }
}

/* Each case through both of Python's unpicklers: memsnap refuses only what one of them refuses,
 * and accepts only what both accept. */
Test(pickle_strict, python_agrees) {
  if (!th_have_python()) {
    printf("SKIP: python3 not available\n");
    cr_skip_test("python3 not available");
  }
  const char *dir = tmpdir_path();
  char path[600];
  for (size_t i = 0; i < NCASES; i++) {
    snprintf(path, sizeof path, "%s/%s_%02zu.pkl", dir, cases[i].code ? "rej" : "acc", i);
    cr_assert_eq(th_write_file(path, cases[i].bytes, cases[i].len), 0);
  }
  char cmd[1500];
  snprintf(cmd, sizeof cmd,
           "python3 -c \"import glob,io,os,pickle,sys\n"
           "bad=0\n"
           "for f in sorted(glob.glob(sys.argv[1]+'/*.pkl')):\n"
           "  d=open(f,'rb').read(); ok=[]\n"
           "  for U in (pickle.Unpickler, pickle._Unpickler):\n"
           "    try: U(io.BytesIO(d)).load(); ok.append(True)\n"
           "    except Exception: ok.append(False)\n"
           "  rej=os.path.basename(f).startswith('rej')\n"
           "  if (rej and all(ok)) or (not rej and not all(ok)):\n"
           "    print('python disagrees:', f, ok); bad=1\n"
           "sys.exit(bad)\n"
           "\" %s",
           dir);
  cr_assert_eq(system(cmd), 0, "python3 disagrees with the table (see above)");
  for (size_t i = 0; i < NCASES; i++) {
    snprintf(path, sizeof path, "%s/%s_%02zu.pkl", dir, cases[i].code ? "rej" : "acc", i);
    unlink(path);
  }
}

/* The PyTorch fixtures and what memsnap writes still load: nothing there is refused. */
Test(pickle_strict, fixtures_and_own_output_load) {
  const char *fx = th_fixture_dir();
  const char *const names[] = {"a0kuma_adamw_small", "cranberrii_ftcourse",
                               "jogregoire_diffusion_tiny", "maphsge_select_n_4dev",
                               "wedsonlin_cs336_medium_1024_training",
                               "yiyi_flexgen_1.3b_legacy_a", "yiyi_flexgen_oom_legacy"};
  int found = 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.pickle", fx, names[i]);
    if (access(path, R_OK) != 0) continue;
    found++;
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s", eb.msg);
    ms_snapshot_free(s);
  }
  if (!found) printf("note: no PyTorch fixtures in %s\n", fx);
  ms_snapshot_t *a = th_synth(NULL);
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_pickle_write(a, &sink, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_t *b = NULL;
  cr_assert_eq(th_pickle_read_mem(m.data, m.len, 0, &b, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(b);
  ms_snapshot_free(a);
  th_memsink_free(&m);
}

/* ---- 23. gzip errors say where --------------------------------------------------------------- */

static uint32_t crc32_of(const unsigned char *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

#define STORED 1000 /* bytes per stored deflate block */

/* A gzip file of data in stored (uncompressed) deflate blocks of STORED bytes, so that the test
 * knows where every block header lies: block k's header is at 10 + k * (STORED + 5). */
static buf_t gzip_stored(const char *data, size_t len) {
  buf_t b = {0};
  th_bytes_put(&b, "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10);
  for (size_t off = 0; off < len; off += STORED) {
    size_t n = len - off < STORED ? len - off : STORED;
    unsigned char hdr = off + n == len ? 1 : 0; /* BFINAL, BTYPE 00 */
    th_bytes_put(&b, &hdr, 1);
    th_bytes_put_le(&b, n, 2);
    th_bytes_put_le(&b, ~n & 0xffffu, 2);
    th_bytes_put(&b, data + off, n);
  }
  th_bytes_put_le(&b, crc32_of((const unsigned char *)data, len), 4);
  th_bytes_put_le(&b, len, 4);
  return b;
}

static buf_t synth_pickle(void) {
  th_synth_opts_t o = {.nsegments = 8, .blocks_per_segment = 20, .nframes = 40, .nstacks = 30,
                       .ntrace = 200, .history = 1, .seed = 7};
  ms_snapshot_t *s = th_synth(&o);
  cr_assert(s);
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_pickle_write(s, &sink, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  buf_t b = {m.data, m.len, m.cap};
  return b;
}

/* Loads bytes written to a file; @return the code, the message in eb. */
static int load_bytes(const void *p, size_t n, const char *name, char *path, size_t cap,
                      ms_errbuf_t *eb) {
  snprintf(path, cap, "%s/%s", tmpdir_path(), name);
  cr_assert_eq(th_write_file(path, p, n), 0);
  ms_snapshot_t *s = NULL;
  memset(eb, 0, sizeof *eb);
  int rc = ms_snapshot_load(path, &s, eb);
  if (rc == MS_OK) ms_snapshot_free(s);
  unlink(path);
  return rc;
}

static void expect_load(const buf_t *g, const char *name, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Expects the load of g to fail with code and exactly "'PATH': " + the formatted text. */
static void expect_load(const buf_t *g, const char *name, int code, const char *fmt, ...) {
  char path[600], want[1400], text[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  ms_errbuf_t eb;
  int rc = load_bytes(g->p, g->n, name, path, sizeof path, &eb);
  snprintf(want, sizeof want, "'%s': %s", path, text);
  cr_assert_eq(rc, code, "%s: expected %s, got %s: %s", name, ms_err_name(code), ms_err_name(rc),
               eb.msg);
  cr_assert_str_eq(eb.msg, want, "%s:\n got: %s\nwant: %s", name, eb.msg, want);
}

Test(pickle_gzip, corruption_names_the_compressed_offset) {
  buf_t pk = synth_pickle();
  cr_assert_gt(pk.n, 4 * STORED, "the pickle spans several blocks");
  buf_t g = gzip_stored(pk.p, pk.n);
  ms_errbuf_t eb;
  char path[600];
  cr_assert_eq(load_bytes(g.p, g.n, "ok.pickle.gz", path, sizeof path, &eb), MS_OK, "%s", eb.msg);
  size_t blk = STORED + 5, nblocks = (pk.n + STORED - 1) / STORED;

  /* a stored block whose lengths disagree: found after its 5 header bytes */
  buf_t c = {0};
  th_bytes_put(&c, g.p, g.n);
  size_t at = 10 + 2 * blk; /* block 2 */
  c.p[at + 3] ^= 0x01;
  expect_load(&c, "nlen.gz", MS_EFORMAT,
              "gzip: corrupt compressed data at offset %zu of the compressed file (%d bytes "
              "inflated): invalid stored block lengths",
              at + 5, 2 * STORED);
  /* a reserved block type (3) */
  memcpy(c.p, g.p, g.n);
  at = 10 + 3 * blk;
  c.p[at] = 0x06;
  expect_load(&c, "btype.gz", MS_EFORMAT,
              "gzip: corrupt compressed data at offset %zu of the compressed file (%d bytes "
              "inflated): invalid block type",
              at + 1, 3 * STORED);
  /* the CRC and the length in the trailer: the pickle reader, asking for more after its last
   * bytes, meets them */
  memcpy(c.p, g.p, g.n);
  c.p[g.n - 8] ^= 0x01;
  expect_load(&c, "crc.gz", MS_EFORMAT,
              "gzip: corrupt compressed data at offset %zu of the compressed file (%zu bytes "
              "inflated): incorrect data check",
              g.n - 4, pk.n);
  memcpy(c.p, g.p, g.n);
  c.p[g.n - 2] ^= 0x01;
  expect_load(&c, "isize.gz", MS_EFORMAT,
              "gzip: corrupt compressed data at offset %zu of the compressed file (%zu bytes "
              "inflated): incorrect length check",
              g.n, pk.n);
  /* bytes after the stream */
  th_bytes_put(&c, "junk", 4);
  memcpy(c.p, g.p, g.n);
  expect_load(&c, "trailing.gz", MS_EFORMAT,
              "gzip: trailing data after the compressed stream at offset %zu of the compressed "
              "file (%zu bytes inflated)",
              g.n, pk.n);
  /* cut at several places: the offset is where the input ends */
  const size_t cuts[] = {10 + blk + 500, 10 + 4 * blk + 2, g.n - 6};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    buf_t t = {g.p, cuts[i], 0};
    size_t inflated = 0; /* the data bytes of the blocks (and partial block) before the cut */
    for (size_t k = 0; k < nblocks; k++) {
      size_t start = 10 + k * blk + 5;
      size_t n = k == nblocks - 1 ? pk.n - k * STORED : STORED;
      if (cuts[i] > start) inflated += cuts[i] - start < n ? cuts[i] - start : n;
    }
    if (cuts[i] > 10 + (nblocks - 1) * blk + 5 + (pk.n - (nblocks - 1) * STORED))
      expect_load(&t, "cut.gz", MS_ETRUNCATED,
                  "gzip: compressed stream is truncated at offset %zu of the compressed file (%zu "
                  "bytes inflated) (the pickle inside was complete)",
                  cuts[i], inflated);
    else
      expect_load(&t, "cut.gz", MS_ETRUNCATED,
                  "gzip: compressed stream is truncated at offset %zu of the compressed file (%zu "
                  "bytes inflated)",
                  cuts[i], inflated);
  }
  free(c.p);
  free(g.p);
  free(pk.p);
}

/* zlib's own deflate, damaged in the middle: the offset lies between the damage and the end. */
Test(pickle_gzip, deflate_damage_in_the_middle) {
  buf_t pk = synth_pickle();
  buf_t g = {malloc(ms__zio_deflate_bound(pk.n)), 0, 0};
  size_t cap = ms__zio_deflate_bound(pk.n);
  cr_assert_eq(ms__zio_deflate_buffer(6, pk.p, pk.n, g.p, cap, &g.n), MS_OK);
  int damaged = 0;
  for (size_t at = g.n / 4; at < g.n - 8; at += g.n / 7) {
    buf_t c = {malloc(g.n), g.n, g.n};
    memcpy(c.p, g.p, g.n);
    c.p[at] ^= 0xa5;
    c.p[at + 1] ^= 0x5a;
    ms_errbuf_t eb;
    char path[600];
    int rc = load_bytes(c.p, c.n, "mid.gz", path, sizeof path, &eb);
    cr_assert_neq(rc, MS_OK, "damage at %zu was not noticed", at);
    size_t plen = strlen(path);
    cr_assert(strncmp(eb.msg + plen + 4, "gzip: corrupt compressed data at offset ", 40) == 0,
              "damage at %zu: %s", at, eb.msg);
    unsigned long long off = strtoull(eb.msg + plen + 44, NULL, 10);
    cr_assert(off > at && off <= g.n, "damage at %zu reported at %llu: %s", at, off, eb.msg);
    damaged++;
    free(c.p);
  }
  cr_assert_geq(damaged, 4);
  free(g.p);
  free(pk.p);
}

/* An error of the pickle itself, in a sound gzip stream: its offset is in the inflated data. */
Test(pickle_gzip, pickle_errors_say_inflated_offset) {
  static const char bad[] = "\x80\x04}(\x8c\x08segments]]K\x01u.";
  buf_t g = gzip_stored(bad, sizeof bad - 1);
  expect_load(&g, "bad.pickle.gz", MS_EFORMAT,
              "offset 18 of the inflated pickle: SETITEMS: the dict key is a list, which Python "
              "cannot hash (its unpickler raises TypeError)");
  free(g.p);
}

/* ---- 24. memory bounded by what the input holds ---------------------------------------------- */

typedef struct piped_s {
  int status;      /* wait status */
  long max_rss_kb; /* the child's peak RSS */
  double wall_s;
  char err[1024]; /* its stderr (start) */
} piped_t;

/* Runs `memsnap stats -` with head then `fill` bytes of `byte` written into its stdin through a
 * pipe, then EOF. */
static piped_t run_piped(const void *head, size_t hlen, size_t fill, char byte) {
  piped_t r = {0};
  const char *bin = memsnap_bin();
  char errpath[600];
  snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmpdir_path());
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    dup2(fds[0], 0);
    close(fds[0]);
    close(fds[1]);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    int nul = open("/dev/null", O_WRONLY);
    dup2(nul, 1);
    execl(bin, bin, "stats", "-", (char *)NULL);
    _exit(127);
  }
  close(fds[0]);
  void (*old)(int) = signal(SIGPIPE, SIG_IGN);
  bool open_end = write(fds[1], head, hlen) == (ssize_t)hlen;
  static char chunk[1 << 16];
  memset(chunk, byte, sizeof chunk);
  for (size_t left = fill; open_end && left;) {
    size_t n = left < sizeof chunk ? left : sizeof chunk;
    ssize_t w = write(fds[1], chunk, n);
    if (w <= 0) break; /* the reader gave up early: fine */
    left -= (size_t)w;
  }
  close(fds[1]);
  signal(SIGPIPE, old);
  struct rusage ru;
  cr_assert_eq(wait4(pid, &r.status, 0, &ru), pid);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  r.wall_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  r.max_rss_kb = ru.ru_maxrss;
  size_t n = 0;
  char *e = th_read_file(errpath, &n);
  snprintf(r.err, sizeof r.err, "%.*s", (int)(n < sizeof r.err ? n : sizeof r.err - 1),
           e ? e : "");
  free(e);
  return r;
}

static void expect_piped(const piped_t *r, const char *err, long max_kb, double max_s) {
  cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 1, "status 0x%x: %s", r->status,
            r->err);
  cr_assert_str_eq(r->err, err);
  cr_assert_lt(r->max_rss_kb, max_kb, "peak RSS %ld KiB (limit %ld): %s", r->max_rss_kb, max_kb,
               r->err);
  cr_assert_lt(r->wall_s, max_s, "%.2f s: %s", r->wall_s, r->err);
  printf("  %-70.70s  %6ld KiB  %.2f s\n", r->err, r->max_rss_kb, r->wall_s);
}

#define MIB (1u << 20)

Test(pickle_pipe_memory, declared_gigabytes_with_a_megabyte_behind) {
  /* BINUNICODE8 and BINBYTES8 of 1 GiB, BINUNICODE of 4 GiB - 2, each with 1 MiB then EOF */
  static const struct {
    const char *head;
    size_t len;
  } t[] = {
      {BIN("\x80\x04\x8d\x00\x00\x00\x40\x00\x00\x00\x00")},
      {BIN("\x80\x04\x8e\x00\x00\x00\x40\x00\x00\x00\x00")},
      {BIN("\x80\x04X\xfe\xff\xff\xff")},
  };
  const char *const errs[] = {
      "memsnap: error: '<stdin>': offset 2: pickle truncated: the input ends inside a string\n",
      "memsnap: error: '<stdin>': offset 2: pickle truncated: the input ends inside a bytes "
      "value\n",
      "memsnap: error: '<stdin>': offset 2: pickle truncated: the input ends inside a string\n",
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    piped_t r = run_piped(t[i].head, t[i].len, MIB, 'z');
    expect_piped(&r, errs[i], 100 * 1024, 10.0);
  }
}

/* A bytes value that the input really holds costs no memory: its content is never kept. */
Test(pickle_pipe_memory, real_bytes_are_not_buffered) {
  char head[11] = "\x80\x04\x8e";
  for (int i = 0; i < 8; i++) head[3 + i] = (char)((uint64_t)(128u * MIB) >> (8 * i));
  piped_t r = run_piped(head, sizeof head, 128u * MIB, 0);
  expect_piped(&r,
               "memsnap: error: '<stdin>': offset 134217739: pickle truncated: the input ends "
               "inside an opcode (no STOP)\n",
               48 * 1024, 20.0);
}

/* The same declared gigabyte inside a gzip stream on stdin. */
Test(pickle_pipe_memory, declared_gigabyte_in_gzip) {
  buf_t pk = {0};
  th_bytes_put(&pk, "\x80\x04\x8d\x00\x00\x00\x40\x00\x00\x00\x00", 11);
  char *z = calloc(1, MIB);
  th_bytes_put(&pk, z, MIB);
  free(z);
  buf_t g = gzip_stored(pk.p, pk.n);
  piped_t r = run_piped(g.p, g.n, 0, 0);
  expect_piped(&r,
               "memsnap: error: '<stdin>': offset 2 of the inflated pickle: pickle truncated: the "
               "input ends inside a string\n",
               100 * 1024, 10.0);
  free(g.p);
  free(pk.p);
}

/* memsnap's format: a str32 of 60 MiB (under the 64 MiB per object limit) with 1 MiB behind. */
Test(serialize_pipe_memory, declared_str32_with_a_megabyte_behind) {
  buf_t m = {0};
  th_bytes_put(&m, "\x82\xa5magic\xb0memsnap-snapshot\xa7version\x01", 33);
  th_bytes_put(&m, "\x83\xa6origin\x00\xa7present\x00\xa6" "counts\x99", 26);
  th_bytes_put(&m, "\x00\x00\x00\x00\x00\x00\x00\x00\x00", 9);
  size_t off = m.n;
  th_bytes_put(&m, "\x92\x01\x93\xdb\x03\xc0\x00\x00", 8); /* a frame chunk; its first row's name */
  piped_t r = run_piped(m.p, m.n, MIB, 'a');
  char want[300];
  snprintf(want, sizeof want,
           "memsnap: error: '<stdin>': offset %zu: truncated input in a table chunk (object at "
           "offset %zu is incomplete)\n",
           m.n + MIB, off);
  expect_piped(&r, want, 100 * 1024, 10.0);
  free(m.p);
}
