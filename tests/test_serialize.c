/* SPDX-License-Identifier: MIT
 * Tests for memsnap's snapshot file format (lib/snapshot/msgpack_*.c, zio.c, load.c): round trips
 * (plain and compressed, small and 100,000 blocks), format detection, hostile input (every
 * truncation, flipped type bytes, huge lengths, deep nesting, wrong types, sizes that do not add
 * up) with the expected messages, atomic file writes and loading by path.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "helpers.h"
#include "memsnap/serialize.h"
#include "model/snapbuild.h"
#include "snapshot/zio.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static void encode(const ms_snapshot_t *s, int level, th_memsink_t *m) {
  ms_sink_t sink;
  th_memsink_init(&sink, m);
  ms_write_opts_t o = {level};
  ms_errbuf_t eb = {{0}};
  int rc = ms_snapshot_write(s, &o, &sink, &eb);
  cr_assert_eq(rc, MS_OK, "write failed: %s", eb.msg);
}

static int decode(const void *data, size_t len, ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms_membuf_t mb;
  ms_source_t src;
  ms_source_init_mem(&src, &mb, data, len);
  eb->msg[0] = 0;
  return ms_snapshot_read(&src, out, eb);
}

/* A source that returns at most 7 bytes per read, to exercise every refill path. */
static ptrdiff_t dribble_read(void *ctx, char *buf, size_t cap) {
  ms_membuf_t *m = ctx;
  size_t n = m->len - m->pos;
  if (n > 7) n = 7;
  if (n > cap) n = cap;
  memcpy(buf, m->data + m->pos, n);
  m->pos += n;
  return (ptrdiff_t)n;
}

static void roundtrip(const ms_snapshot_t *s, int level) {
  th_memsink_t m;
  encode(s, level, &m);
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  int rc = decode(m.data, m.len, &r, &eb);
  cr_assert_eq(rc, MS_OK, "read failed: %s", eb.msg);
  TH_ASSERT_SNAP_EQ(s, r);
  ms_snapshot_free(r);
  cr_assert_eq(ms_format_detect(m.data, m.len), level ? MS_FORMAT_MEMSNAP_Z : MS_FORMAT_MEMSNAP);
  th_memsink_free(&m);
}

/* ---- round trips ---------------------------------------------------------------------------- */

Test(serialize, roundtrip_small_plain) {
  ms_snapshot_t *s = th_synth(NULL);
  cr_assert_not_null(s);
  cr_assert_gt(s->nhistory, 0);
  cr_assert_gt(s->nsettings, s->nsettings_top);
  roundtrip(s, 0);
  ms_snapshot_free(s);
}

Test(serialize, roundtrip_small_compressed) {
  ms_snapshot_t *s = th_synth(NULL);
  for (int level = 1; level <= 9; level += 4)
    roundtrip(s, level);
  ms_snapshot_free(s);
}

Test(serialize, roundtrip_empty) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  roundtrip(s, 0);
  roundtrip(s, 1);
  ms_snapshot_free(s);
}

Test(serialize, roundtrip_100k_blocks, .timeout = 60) {
  th_synth_opts_t o = {100, 1000, 500, 2000, 20000, 1, 7};
  ms_snapshot_t *s = th_synth(&o);
  cr_assert_not_null(s);
  cr_assert_eq(s->nblocks, 100000);
  roundtrip(s, 0);
  roundtrip(s, 1);
  ms_snapshot_free(s);
}

Test(serialize, roundtrip_through_small_reads) {
  ms_snapshot_t *s = th_synth(NULL);
  for (int level = 0; level <= 1; level++) {
    th_memsink_t m;
    encode(s, level, &m);
    ms_membuf_t mb = {m.data, m.len, 0};
    ms_source_t src = {dribble_read, &mb};
    ms_snapshot_t *r = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_read(&src, &r, &eb), MS_OK, "%s", eb.msg);
    TH_ASSERT_SNAP_EQ(s, r);
    ms_snapshot_free(r);
    th_memsink_free(&m);
  }
  ms_snapshot_free(s);
}

Test(serialize, file_starts_with_magic_and_version) {
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t m;
  encode(s, 0, &m);
  static const char head[] = "\x82\xa5magic\xb0memsnap-snapshot\xa7version\x01";
  cr_assert_geq(m.len, sizeof head - 1);
  cr_assert_eq(memcmp(m.data, head, sizeof head - 1), 0);
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

Test(serialize, write_rejects_bad_level_and_noncanonical_layout) {
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  ms_write_opts_t o = {10};
  cr_assert_eq(ms_snapshot_write(s, &o, &sink, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "compression level 10 is not in 0-9");
  /* Swap two segments' block runs: the format stores blocks in segment order. */
  uint32_t f = s->segments[0].first_block;
  s->segments[0].first_block = s->segments[1].first_block;
  s->segments[1].first_block = f;
  cr_assert_eq(ms_snapshot_write(s, NULL, &sink, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "segment 0: blocks are not stored in segment order");
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

Test(serialize, write_reports_sink_failure) {
  ms_snapshot_t *s = th_synth(NULL);
  for (int level = 0; level <= 1; level++) {
    th_memsink_t m;
    ms_sink_t sink;
    th_memsink_init(&sink, &m);
    m.fail_after = 100;
    ms_write_opts_t o = {level};
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_write(s, &o, &sink, &eb), MS_EIO);
    cr_assert_str_eq(eb.msg, "write failed: input/output error");
    th_memsink_free(&m);
  }
  ms_snapshot_free(s);
}

/* ---- format detection ----------------------------------------------------------------------- */

Test(serialize, format_detection_table) {
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t plain, z;
  encode(s, 0, &plain);
  encode(s, 6, &z);
  struct {
    const char *what;
    const void *data;
    size_t len;
    ms_format want;
  } cases[] = {
      {"memsnap", plain.data, plain.len, MS_FORMAT_MEMSNAP},
      {"memsnap first 16 bytes", plain.data, 16, MS_FORMAT_MEMSNAP},
      {"memsnap first 15 bytes", plain.data, 15, MS_FORMAT_UNKNOWN},
      {"memsnap-z", z.data, z.len, MS_FORMAT_MEMSNAP_Z},
      {"memsnap-z first 512 bytes", z.data, 512, MS_FORMAT_MEMSNAP_Z},
      {"gzip header only", z.data, 10, MS_FORMAT_UNKNOWN},
      {"pickle protocol 2", "\x80\x02}q\x00", 5, MS_FORMAT_PICKLE},
      {"pickle protocol 4", "\x80\x04\x95", 3, MS_FORMAT_PICKLE},
      {"pickle protocol 5", "\x80\x05", 2, MS_FORMAT_PICKLE},
      {"pickle protocol 1", "\x80\x01", 2, MS_FORMAT_UNKNOWN},
      {"pickle protocol 6", "\x80\x06", 2, MS_FORMAT_UNKNOWN},
      {"text", "hello world, not a snapshot", 27, MS_FORMAT_UNKNOWN},
      {"empty", "", 0, MS_FORMAT_UNKNOWN},
      {"other msgpack map", "\x82\xa5magic\xa3xyz\xa7version\x01", 20, MS_FORMAT_UNKNOWN},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    cr_expect_eq(ms_format_detect(cases[i].data, cases[i].len), cases[i].want, "%s: got %s",
                 cases[i].what, ms_format_name(ms_format_detect(cases[i].data, cases[i].len)));
  /* gzip of something else is not ours */
  th_memsink_t other;
  ms_sink_t sink;
  th_memsink_init(&sink, &other);
  (void)sink;
  cr_assert_str_eq(ms_format_name(MS_FORMAT_MEMSNAP), "memsnap");
  cr_assert_str_eq(ms_format_name(MS_FORMAT_MEMSNAP_Z), "memsnap-z");
  cr_assert_str_eq(ms_format_name(MS_FORMAT_PICKLE), "pickle");
  cr_assert_str_eq(ms_format_name(MS_FORMAT_UNKNOWN), "unknown");
  th_memsink_free(&other);
  th_memsink_free(&plain);
  th_memsink_free(&z);
  ms_snapshot_free(s);
}

/* ---- hostile input: truncations and flipped bytes ------------------------------------------- */

static void every_truncation_fails(int level) {
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t m;
  encode(s, level, &m);
  for (size_t n = 0; n < m.len; n++) {
    ms_snapshot_t *r = NULL;
    ms_errbuf_t eb;
    int rc = decode(m.data, n, &r, &eb);
    cr_assert_lt(rc, 0, "truncation at %zu of %zu was accepted", n, m.len);
    cr_assert_null(r, "out-parameter touched on failure");
    cr_assert_neq(eb.msg[0], 0, "no message for truncation at %zu", n);
    if (level == 0)
      cr_assert(rc == MS_ETRUNCATED, "truncation at %zu: %s (%s)", n, ms_err_name(rc), eb.msg);
  }
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

Test(serialize, every_truncation_is_an_error_plain) {
  every_truncation_fails(0);
}
Test(serialize, every_truncation_is_an_error_compressed) {
  every_truncation_fails(1);
}

Test(serialize, truncation_messages) {
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t m;
  encode(s, 0, &m);
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(decode(m.data, 0, &r, &eb), MS_ETRUNCATED);
  cr_assert_str_eq(eb.msg, "offset 0: empty input");
  cr_assert_eq(decode(m.data, 10, &r, &eb), MS_ETRUNCATED);
  cr_assert_str_eq(eb.msg,
                   "offset 10: truncated input in the header (object at offset 0 is incomplete)");
  /* cut exactly before the end marker [0] (the last byte pair 0x91 0x00) */
  cr_assert_eq((unsigned char)m.data[m.len - 2], 0x91);
  cr_assert_eq(decode(m.data, m.len - 2, &r, &eb), MS_ETRUNCATED);
  char want[160];
  snprintf(want, sizeof want,
           "offset %zu: truncated input: missing end marker after allocator_settings", m.len - 2);
  cr_assert_str_eq(eb.msg, want);
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

Test(serialize, trailing_data_is_an_error) {
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t m;
  encode(s, 0, &m);
  char *buf = malloc(m.len + 1);
  memcpy(buf, m.data, m.len);
  buf[m.len] = 0x00;
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(decode(buf, m.len + 1, &r, &eb), MS_EFORMAT);
  char want[96];
  snprintf(want, sizeof want, "offset %zu: trailing data after the end marker", m.len);
  cr_assert_str_eq(eb.msg, want);
  free(buf);
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

Test(serialize, flipped_type_bytes_never_crash, .timeout = 120) {
  th_synth_opts_t o = {2, 3, 4, 3, 3, 1, 5};
  ms_snapshot_t *s = th_synth(&o);
  th_memsink_t m;
  encode(s, 0, &m);
  /* nil, never-used, fixarray(3), array32, str32, uint64: wrong types, huge and bad lengths */
  static const unsigned char types[] = {0xc0, 0xc1, 0x93, 0xdd, 0xdb, 0xcf};
  char *buf = malloc(m.len);
  size_t errors = 0, total = 0;
  for (size_t i = 0; i < m.len; i++) {
    for (size_t t = 0; t < sizeof types; t++) {
      if ((unsigned char)m.data[i] == types[t]) continue;
      memcpy(buf, m.data, m.len);
      buf[i] = (char)types[t];
      ms_snapshot_t *r = NULL;
      ms_errbuf_t eb;
      int rc = decode(buf, m.len, &r, &eb);
      total++;
      if (rc != MS_OK) {
        errors++;
        cr_assert_null(r);
        cr_assert(strncmp(eb.msg, "offset ", 7) == 0, "message without offset: %s", eb.msg);
      } else {
        ms_snapshot_free(r);
      }
    }
  }
  /* Many flips land in string bytes (names, keys) or swap a value for another valid one; the
   * structural ones must be caught. */
  cr_assert_gt(errors * 3, total, "only %zu of %zu corrupt inputs rejected", errors, total);
  free(buf);
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

/* ---- hand-crafted files ---------------------------------------------------------------------- */

typedef struct mp_s {
  unsigned char b[8192];
  size_t n;
} mp_t;

static void mp_raw(mp_t *m, const void *p, size_t n) {
  cr_assert_leq(m->n + n, sizeof m->b);
  memcpy(m->b + m->n, p, n);
  m->n += n;
}
static void mp_byte(mp_t *m, unsigned v) {
  unsigned char c = (unsigned char)v;
  mp_raw(m, &c, 1);
}
static void mp_be(mp_t *m, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; i--)
    mp_byte(m, (unsigned)(v >> (8 * i)) & 0xff);
}
static void mp_uint(mp_t *m, uint64_t v) {
  if (v < 128) {
    mp_byte(m, (unsigned)v);
  } else {
    mp_byte(m, 0xcf);
    mp_be(m, v, 8);
  }
}
static void mp_str(mp_t *m, const char *s) {
  size_t n = strlen(s);
  cr_assert_lt(n, 32);
  mp_byte(m, 0xa0 | (unsigned)n);
  mp_raw(m, s, n);
}
static void mp_arr(mp_t *m, unsigned n) {
  if (n < 16) {
    mp_byte(m, 0x90 | n);
  } else {
    mp_byte(m, 0xdc);
    mp_be(m, n, 2);
  }
}

/* Header (version v) and a meta object declaring counts. */
static void mp_start(mp_t *m, unsigned version, const uint64_t counts[9]) {
  m->n = 0;
  mp_raw(m, "\x82\xa5magic\xb0memsnap-snapshot\xa7version", 32);
  mp_uint(m, version);
  mp_byte(m, 0x83);
  mp_str(m, "origin");
  mp_uint(m, 0);
  mp_str(m, "present");
  mp_uint(m, 0);
  mp_str(m, "counts");
  mp_arr(m, 9);
  for (int i = 0; i < 9; i++)
    mp_uint(m, counts[i]);
}

/* Writes a segment row whose column `bad_col` is replaced by a string; returns its offset. */
static size_t mp_segment_row(mp_t *m, uint64_t total, unsigned nblocks, int bad_col) {
  size_t bad_off = 0;
  mp_arr(m, 14);
  for (int c = 0; c < 14; c++) {
    if (c == bad_col) {
      bad_off = m->n;
      mp_str(m, "x");
      continue;
    }
    switch (c) {
    case 1:
      mp_uint(m, 0x10000);
      break; /* address */
    case 2:
      mp_uint(m, total);
      break; /* total_size */
    case 7:
    case 8:
      mp_byte(m, 0xc2);
      break; /* booleans */
    case 11:
      mp_byte(m, 0xc0);
      break; /* no stack */
    case 12:
      mp_uint(m, nblocks);
      break;
    default:
      mp_uint(m, 0);
      break;
    }
  }
  return bad_off;
}

static void mp_block_row(mp_t *m, uint64_t addr, uint64_t size) {
  mp_arr(m, 7);
  mp_uint(m, addr);
  mp_uint(m, size);
  mp_uint(m, size);
  mp_uint(m, 1);
  mp_byte(m, 0xc0);
  mp_uint(m, 0);
  mp_uint(m, 0);
}

static void mp_finish(mp_t *m) {
  mp_arr(m, 2);
  mp_uint(m, 9);
  mp_byte(m, 0x80); /* empty settings */
  mp_arr(m, 1);
  mp_uint(m, 0);
}

static void expect_error(const mp_t *m, int want_rc, const char *want_msg) {
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  int rc = decode(m->b, m->n, &r, &eb);
  cr_assert_eq(rc, want_rc, "got %s (%s), want %s", ms_err_name(rc), eb.msg, ms_err_name(want_rc));
  cr_assert_null(r);
  cr_assert_str_eq(eb.msg, want_msg);
}

Test(serialize, handmade_valid_file_reads) {
  const uint64_t counts[9] = {0, 0, 1, 2, 0, 0, 0, 0, 0};
  mp_t m;
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  mp_segment_row(&m, 0x3000, 2, -1);
  mp_arr(&m, 3);
  mp_uint(&m, 4);
  mp_block_row(&m, 0x10000, 0x1000);
  mp_block_row(&m, 0x11000, 0x2000);
  mp_finish(&m);
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(decode(m.b, m.n, &r, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(r->nsegments, 1);
  cr_assert_eq(r->nblocks, 2);
  cr_assert_eq(r->blocks[1].address, 0x11000);
  cr_assert_eq(r->blocks[1].state, MS_BLOCK_ACTIVE_ALLOCATED);
  cr_assert_str_eq(r->blocks[1].state_name, "active_allocated");
  ms_snapshot_free(r);
}

Test(serialize, wrong_type_names_field_and_offset) {
  const uint64_t counts[9] = {0, 0, 1, 0, 0, 0, 0, 0, 0};
  static const struct {
    int col;
    const char *msg;
  } cases[] = {
      {0, "segments[0].device: expected integer, got string"},
      {2, "segments[0].total_size: expected unsigned integer, got string"},
      {7, "segments[0].is_large: expected boolean, got string"},
      {11, "segments[0].frames: expected nil or stack index, got string"},
      {12, "segments[0].nblocks: expected unsigned integer, got string"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mp_t m;
    mp_start(&m, 1, counts);
    mp_arr(&m, 2);
    mp_uint(&m, 3);
    size_t off = mp_segment_row(&m, 0, 0, cases[i].col);
    mp_finish(&m);
    char want[200];
    snprintf(want, sizeof want, "offset %zu: %s", off, cases[i].msg);
    expect_error(&m, MS_EFORMAT, want);
  }
}

Test(serialize, block_type_and_range_errors) {
  const uint64_t counts[9] = {0, 0, 1, 1, 0, 0, 0, 0, 0};
  mp_t m;
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  mp_segment_row(&m, 0x1000, 1, -1);
  mp_arr(&m, 2);
  mp_uint(&m, 4);
  mp_arr(&m, 7);
  mp_uint(&m, 0x10000);
  size_t off = m.n;
  mp_byte(&m, 0xcb); /* float64 as size */
  mp_be(&m, 0, 8);
  mp_uint(&m, 0);
  mp_uint(&m, 1);
  mp_byte(&m, 0xc0);
  mp_uint(&m, 0);
  mp_uint(&m, 0);
  mp_finish(&m);
  char want[200];
  snprintf(want, sizeof want,
           "offset %zu: segments[0].blocks[0].size: expected unsigned integer, got float", off);
  expect_error(&m, MS_EFORMAT, want);
}

Test(serialize, sizes_that_do_not_add_up) {
  const uint64_t counts[9] = {0, 0, 1, 2, 0, 0, 0, 0, 0};
  /* 1: blocks sum to less than total_size */
  mp_t m;
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  mp_segment_row(&m, 0x4000, 2, -1);
  mp_arr(&m, 3);
  mp_uint(&m, 4);
  mp_block_row(&m, 0x10000, 0x1000);
  mp_block_row(&m, 0x11000, 0x2000);
  size_t end = m.n;
  mp_finish(&m);
  char want[200];
  snprintf(want, sizeof want,
           "offset %zu: segments[0]: block sizes sum to 12288, total_size is 16384", end);
  expect_error(&m, MS_EFORMAT, want);

  /* 2: a block larger than what is left */
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  mp_segment_row(&m, 0x2000, 2, -1);
  mp_arr(&m, 3);
  mp_uint(&m, 4);
  mp_block_row(&m, 0x10000, 0x1000);
  size_t row = m.n;
  mp_block_row(&m, 0x11000, 0x2000);
  mp_finish(&m);
  /* the size column: row header (1) + address (9) */
  snprintf(
      want, sizeof want,
      "offset %zu: segments[0].blocks[1].size: 8192 exceeds the 4096 bytes left in the segment",
      row + 1 + 9);
  expect_error(&m, MS_EFORMAT, want);

  /* 3: a gap between blocks */
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  mp_segment_row(&m, 0x3000, 2, -1);
  mp_arr(&m, 3);
  mp_uint(&m, 4);
  mp_block_row(&m, 0x10000, 0x1000);
  row = m.n;
  mp_block_row(&m, 0x12000, 0x2000);
  mp_finish(&m);
  snprintf(want, sizeof want,
           "offset %zu: segments[0].blocks[1].address: 0x12000 does not follow the previous block "
           "(expected 0x11000)",
           row + 1);
  expect_error(&m, MS_EFORMAT, want);

  /* 4: fewer blocks than the segment declares */
  const uint64_t counts1[9] = {0, 0, 1, 1, 0, 0, 0, 0, 0};
  mp_start(&m, 1, counts1);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  mp_segment_row(&m, 0x1000, 2, -1);
  mp_arr(&m, 2);
  mp_uint(&m, 4);
  mp_block_row(&m, 0x10000, 0x1000);
  end = m.n;
  mp_finish(&m);
  snprintf(want, sizeof want, "offset %zu: segments[0]: declares 2 blocks, 1 found", end);
  expect_error(&m, MS_EFORMAT, want);
}

Test(serialize, writer_refuses_segments_its_reader_would_refuse) {
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  s->segments[2].total_size += 512;
  cr_assert_eq(ms_snapshot_write(s, NULL, &sink, &eb), MS_EINVAL);
  char want[160];
  snprintf(want, sizeof want, "segments[2]: block sizes sum to %" PRIu64 ", total_size is %" PRIu64,
           s->segments[2].total_size - 512, s->segments[2].total_size);
  cr_assert_str_eq(eb.msg, want);
  s->segments[2].total_size -= 512;
  s->blocks[s->segments[1].first_block + 1].address += 512;
  cr_assert_eq(ms_snapshot_write(s, NULL, &sink, &eb), MS_EINVAL);
  cr_assert(strstr(eb.msg, "segments[1].blocks[1]: address 0x") == eb.msg, "%s", eb.msg);
  cr_assert_eq(m.len, 0, "nothing may be written for a refused snapshot");
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

Test(serialize, huge_declared_lengths) {
  const uint64_t counts[9] = {0};
  mp_t m;
  /* array32 of 4 billion elements */
  mp_start(&m, 1, counts);
  size_t off = m.n;
  mp_byte(&m, 0xdd);
  mp_be(&m, 0xffffffffu, 4);
  mp_uint(&m, 3);
  char want[200];
  snprintf(want, sizeof want,
           "offset %zu: declared length 4294967295 exceeds the limit of 67108864 bytes per object",
           off);
  expect_error(&m, MS_ELIMIT, want);
  /* str32 of 4 GiB inside a frame row */
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 1);
  mp_arr(&m, 3);
  off = m.n;
  mp_byte(&m, 0xdb);
  mp_be(&m, 0xfffffff0u, 4);
  mp_raw(&m, "abc", 3);
  snprintf(want, sizeof want,
           "offset %zu: declared length 4294967280 exceeds the limit of 67108864 bytes per object",
           off);
  expect_error(&m, MS_ELIMIT, want);
  /* map32 with 2^31 entries */
  mp_start(&m, 1, counts);
  off = m.n;
  mp_byte(&m, 0xdf);
  mp_be(&m, 0x80000000u, 4);
  snprintf(want, sizeof want,
           "offset %zu: declared length 4294967296 exceeds the limit of 67108864 bytes per object",
           off);
  expect_error(&m, MS_ELIMIT, want);
  /* a plausible length that the file does not back: truncated, not allocated */
  mp_start(&m, 1, counts);
  off = m.n;
  mp_byte(&m, 0xdd);
  mp_be(&m, 1000000u, 4);
  mp_uint(&m, 1);
  snprintf(want, sizeof want,
           "offset %zu: truncated input in a table chunk (object at offset %zu is incomplete)", m.n,
           off);
  expect_error(&m, MS_ETRUNCATED, want);
}

Test(serialize, deep_nesting) {
  const uint64_t counts[9] = {0};
  mp_t m;
  mp_start(&m, 1, counts);
  size_t off = m.n;
  for (int i = 0; i < 1000; i++)
    mp_byte(&m, 0x91);
  mp_byte(&m, 0xc0);
  char want[160];
  snprintf(want, sizeof want, "offset %zu: nesting deeper than 12 levels", off + 12);
  expect_error(&m, MS_EFORMAT, want);
}

Test(serialize, header_errors) {
  const uint64_t counts[9] = {0};
  mp_t m;
  mp_start(&m, 2, counts);
  mp_finish(&m);
  expect_error(&m, MS_EUNSUPPORTED,
               "offset 32: header.version: unsupported format version 2 (this build reads 1 to 1)");
  mp_start(&m, 1, counts);
  m.b[10] = 'X'; /* magic string */
  expect_error(&m, MS_EFORMAT, "offset 0: not a memsnap snapshot (bad magic)");
  /* meta without counts */
  m.n = 0;
  mp_raw(&m, "\x82\xa5magic\xb0memsnap-snapshot\xa7version\x01", 33);
  mp_byte(&m, 0x82);
  mp_str(&m, "origin");
  mp_uint(&m, 0);
  mp_str(&m, "present");
  mp_uint(&m, 0);
  mp_finish(&m);
  expect_error(&m, MS_EFORMAT, "offset 33: meta: missing key 'counts'");
  /* unknown origin */
  mp_start(&m, 1, counts);
  m.b[33 + 8] = 7;
  mp_finish(&m);
  expect_error(&m, MS_EFORMAT, "offset 41: meta.origin: unknown origin 7");
}

Test(serialize, table_structure_errors) {
  const uint64_t counts[9] = {0, 0, 1, 0, 0, 0, 0, 0, 0};
  mp_t m;
  /* counts disagree */
  mp_start(&m, 1, counts);
  size_t off = m.n;
  mp_finish(&m);
  char want[160];
  snprintf(want, sizeof want, "offset %zu: segments: 0 rows, meta.counts declares 1", off);
  expect_error(&m, MS_EFORMAT, want);
  /* tables out of order */
  const uint64_t c2[9] = {0};
  mp_start(&m, 1, c2);
  mp_arr(&m, 1);
  mp_uint(&m, 3);
  off = m.n;
  mp_arr(&m, 2);
  mp_uint(&m, 1);
  mp_arr(&m, 3);
  mp_str(&m, "f");
  mp_str(&m, "g");
  mp_uint(&m, 1);
  mp_finish(&m);
  snprintf(want, sizeof want, "offset %zu: frames: table out of order (after segments)", off);
  expect_error(&m, MS_EFORMAT, want);
  /* a stack refers to a frame that does not exist */
  const uint64_t c3[9] = {1, 1, 0, 0, 0, 0, 0, 0, 0};
  mp_start(&m, 1, c3);
  mp_arr(&m, 2);
  mp_uint(&m, 1);
  mp_arr(&m, 3);
  mp_str(&m, "f");
  mp_str(&m, "g");
  mp_uint(&m, 1);
  mp_arr(&m, 2);
  mp_uint(&m, 2);
  mp_arr(&m, 2);
  mp_uint(&m, 0);
  off = m.n;
  mp_uint(&m, 5);
  mp_finish(&m);
  snprintf(want, sizeof want,
           "offset %zu: stacks[0].frames[1]: frame index 5 out of range (1 frames)", off);
  expect_error(&m, MS_EFORMAT, want);
  /* a row with the wrong number of columns */
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  off = m.n;
  mp_arr(&m, 2);
  mp_uint(&m, 0);
  mp_uint(&m, 0);
  mp_finish(&m);
  snprintf(want, sizeof want, "offset %zu: segments[0]: expected 14 columns, got 2", off);
  expect_error(&m, MS_EFORMAT, want);
}

/* ---- compressed streams --------------------------------------------------------------------- */

Test(serialize, corrupt_compressed_data) {
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t m;
  encode(s, 6, &m);
  char *buf = malloc(m.len + 4);
  /* flip a byte in the middle of the deflate stream */
  memcpy(buf, m.data, m.len);
  buf[m.len / 2] ^= 0x55;
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  int rc = decode(buf, m.len, &r, &eb);
  cr_assert_lt(rc, 0);
  cr_assert_null(r);
  /* the flip changes a literal: the deflate stream decodes, the CRC in the trailer (its last 8
   * bytes) does not match; the message names the offset in the compressed data (issue #16) */
  unsigned long long off = 0, inflated = 0;
  cr_assert_eq(sscanf(eb.msg,
                      "gzip: corrupt compressed data at offset %llu of the compressed file (%llu "
                      "bytes inflated): incorrect data check",
                      &off, &inflated),
               2, "%s", eb.msg);
  cr_assert_eq(off, m.len - 4, "%s", eb.msg);
  cr_assert_gt(inflated, m.len, "%s", eb.msg);
  /* data after the gzip stream */
  memcpy(buf, m.data, m.len);
  memcpy(buf + m.len, "junk", 4);
  rc = decode(buf, m.len + 4, &r, &eb);
  cr_assert_eq(rc, MS_EFORMAT, "%s", eb.msg);
  cr_assert(strstr(eb.msg, "trailing data after the compressed stream") != NULL, "%s", eb.msg);
  free(buf);
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

/* ---- files ---------------------------------------------------------------------------------- */

Test(serialize, write_file_and_load) {
  char *dir = th_tmpdir();
  cr_assert_not_null(dir);
  ms_snapshot_t *s = th_synth(NULL);
  char path[4200];
  for (int level = 0; level <= 1; level++) {
    snprintf(path, sizeof path, "%s/snap%d.msgpack", dir, level);
    ms_errbuf_t eb = {{0}};
    ms_write_opts_t o = {level};
    cr_assert_eq(ms_snapshot_write_file(s, path, &o, &eb), MS_OK, "%s", eb.msg);
    ms_snapshot_t *r = NULL;
    cr_assert_eq(ms_snapshot_load(path, &r, &eb), MS_OK, "%s", eb.msg);
    TH_ASSERT_SNAP_EQ(s, r);
    ms_snapshot_free(r);
  }
  cr_assert_eq(th_dir_count(dir), 2, "temporary files left behind");
  th_rmdir(dir);
  free(dir);
  ms_snapshot_free(s);
}

Test(serialize, load_errors_name_the_file) {
  char *dir = th_tmpdir();
  char path[4200], want[4400];
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  snprintf(path, sizeof path, "%s/missing.msgpack", dir);
  cr_assert_eq(ms_snapshot_load(path, &r, &eb), MS_ENOTFOUND);
  snprintf(want, sizeof want, "cannot open '%s': No such file or directory", path);
  cr_assert_str_eq(eb.msg, want);
  snprintf(path, sizeof path, "%s/text.txt", dir);
  cr_assert_eq(th_write_file(path, "just some text\n", 15), 0);
  cr_assert_eq(ms_snapshot_load(path, &r, &eb), MS_EFORMAT);
  snprintf(want, sizeof want, "'%s': not a memsnap snapshot or PyTorch pickle", path);
  cr_assert_str_eq(eb.msg, want);
  snprintf(path, sizeof path, "%s/empty", dir);
  cr_assert_eq(th_write_file(path, "", 0), 0);
  cr_assert_eq(ms_snapshot_load(path, &r, &eb), MS_ETRUNCATED);
  snprintf(want, sizeof want, "'%s': empty file", path);
  cr_assert_str_eq(eb.msg, want);
  /* a truncated snapshot: the reader's message, prefixed with the file name */
  ms_snapshot_t *s = th_synth(NULL);
  th_memsink_t m;
  encode(s, 0, &m);
  snprintf(path, sizeof path, "%s/cut.msgpack", dir);
  cr_assert_eq(th_write_file(path, m.data, 40), 0);
  cr_assert_eq(ms_snapshot_load(path, &r, &eb), MS_ETRUNCATED);
  snprintf(want, sizeof want,
           "'%s': offset 40: truncated input in meta (object at offset 33 is incomplete)", path);
  cr_assert_str_eq(eb.msg, want);
  cr_assert_eq(ms_snapshot_load(dir, &r, &eb), MS_EIO);
  cr_assert_null(r);
  th_memsink_free(&m);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

Test(serialize, atomic_write_failure_leaves_nothing) {
  char *dir = th_tmpdir();
  char path[4200];
  snprintf(path, sizeof path, "%s/out.msgpack", dir);
  th_synth_opts_t o = {20, 500, 50, 50, 100, 1, 3};
  ms_snapshot_t *s = th_synth(&o);
  /* A file size limit makes write(2) fail with EFBIG in the middle of the snapshot. */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit old, lim;
  cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
  lim = old;
  lim.rlim_cur = 64 * 1024;
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  ms_errbuf_t eb = {{0}};
  int rc = ms_snapshot_write_file(s, path, NULL, &eb);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  cr_assert_eq(rc, MS_EIO);
  cr_assert(strncmp(eb.msg, "cannot write '", 14) == 0, "%s", eb.msg);
  cr_assert_eq(access(path, F_OK), -1, "a truncated file was left under the final name");
  cr_assert_eq(th_dir_count(dir), 0, "the temporary file was left behind");

  /* An existing file survives a failed rewrite untouched. */
  cr_assert_eq(th_write_file(path, "old", 3), 0);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  rc = ms_snapshot_write_file(s, path, NULL, &eb);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  cr_assert_eq(rc, MS_EIO);
  size_t len = 0;
  char *data = th_read_file(path, &len);
  cr_assert_not_null(data);
  cr_assert_eq(len, 3);
  cr_assert_eq(memcmp(data, "old", 3), 0);
  free(data);
  cr_assert_eq(th_dir_count(dir), 1);
  th_rmdir(dir);
  free(dir);
  ms_snapshot_free(s);
}

Test(serialize, atomic_file_api) {
  char *dir = th_tmpdir();
  char path[4200], want[4400];
  ms_errbuf_t eb = {{0}};
  ms_atomic_file_t af;
  snprintf(path, sizeof path, "%s/a.svg", dir);
  cr_assert_eq(ms_atomic_file_open(&af, path, &eb), MS_OK, "%s", eb.msg);
  cr_assert_not_null(af.fp);
  fputs("<svg/>", af.fp);
  cr_assert_eq(access(path, F_OK), -1, "final name visible before commit");
  cr_assert_eq(th_dir_count(dir), 1);
  cr_assert_eq(ms_atomic_file_commit(&af, &eb), MS_OK, "%s", eb.msg);
  cr_assert_null(af.fp);
  size_t len;
  char *data = th_read_file(path, &len);
  cr_assert_eq(len, 6);
  free(data);
  cr_assert_eq(th_dir_count(dir), 1);
  /* abort removes the temporary file and keeps the old content */
  cr_assert_eq(ms_atomic_file_open(&af, path, &eb), MS_OK);
  fputs("partial", af.fp);
  ms_atomic_file_abort(&af);
  ms_atomic_file_abort(&af); /* twice is harmless */
  cr_assert_eq(th_dir_count(dir), 1);
  data = th_read_file(path, &len);
  cr_assert_eq(len, 6);
  free(data);
  /* a missing directory */
  snprintf(path, sizeof path, "%s/nodir/x.svg", dir);
  cr_assert_eq(ms_atomic_file_open(&af, path, &eb), MS_EIO);
  snprintf(want, sizeof want, "cannot create '%s': No such file or directory", path);
  cr_assert_str_eq(eb.msg, want);
  ms_atomic_file_abort(&af);
  /* the final file gets the usual permissions, not mkstemp's 0600 */
  snprintf(path, sizeof path, "%s/perm", dir);
  mode_t um = umask(022);
  cr_assert_eq(ms_atomic_file_open(&af, path, &eb), MS_OK);
  cr_assert_eq(ms_atomic_file_commit(&af, &eb), MS_OK);
  umask(um);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0644);
  th_rmdir(dir);
  free(dir);
}

/* ---- PyTorch fixtures: pickle -> memsnap format -> equal model ------------------------------ */

static const char *const fixtures[] = {
    "jogregoire_diffusion_tiny.pickle",
    "a0kuma_adamw_small.pickle",
    "yiyi_flexgen_oom_legacy.pickle",
    "yiyi_flexgen_1.3b_legacy_a.pickle",
    "maphsge_select_n_4dev.pickle",
    "cranberrii_ftcourse.pickle",
    "wedsonlin_cs336_medium_1024_training.pickle",
};

Test(serialize, fixture_roundtrip, .timeout = 120) {
  const char *dir = th_fixture_dir();
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, fixtures[0]);
  if (access(path, R_OK) != 0) cr_skip_test("SKIP: PyTorch fixtures not found in '%s'", dir);
  for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, fixtures[i]);
    ms_snapshot_t *p = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_load(path, &p, &eb), MS_OK, "%s: %s", fixtures[i], eb.msg);
    cr_assert_neq(p->origin, MS_SNAP_ORIGIN_MEMSNAP);
    for (int level = 0; level <= 1; level++) {
      th_memsink_t m;
      encode(p, level, &m);
      ms_snapshot_t *r = NULL;
      cr_assert_eq(decode(m.data, m.len, &r, &eb), MS_OK, "%s: %s", fixtures[i], eb.msg);
      char why[512];
      cr_assert_eq(th_snapshot_diff(p, r, why, sizeof why), 0, "%s: %s", fixtures[i], why);
      ms_snapshot_free(r);
      th_memsink_free(&m);
    }
    ms_snapshot_free(p);
  }
}

/* ---- decompression bomb --------------------------------------------------------------------- */

Test(serialize, decompression_bomb_is_refused, .timeout = 60) {
  /* A valid header and meta, then a 60 MiB string of zeros: ~60 KiB once deflated, far above
   * the 256x bound. */
  const uint64_t counts[9] = {0};
  mp_t m;
  mp_start(&m, 1, counts);
  mp_byte(&m, 0xdb);
  mp_be(&m, 60u << 20, 4);
  th_memsink_t out;
  ms_sink_t inner, zs;
  th_memsink_init(&inner, &out);
  ms__zsink_t *z = NULL;
  cr_assert_eq(ms__zsink_create(&inner, 9, &z, &zs), MS_OK);
  cr_assert_eq(zs.write(zs.ctx, (const char *)m.b, m.n), MS_OK);
  static char zeros[1 << 16];
  for (int i = 0; i < 60 * 16; i++)
    cr_assert_eq(zs.write(zs.ctx, zeros, sizeof zeros), MS_OK);
  cr_assert_eq(ms__zsink_finish(z), MS_OK);
  ms__zsink_destroy(z);
  cr_assert_lt(out.len, 1 << 20);
  cr_assert_eq(ms_format_detect(out.data, out.len), MS_FORMAT_MEMSNAP_Z);
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(decode(out.data, out.len, &r, &eb), MS_ELIMIT, "%s", eb.msg);
  unsigned long long off = 0, inflated = 0;
  cr_assert_eq(sscanf(eb.msg,
                      "gzip: decompressed data is too large (decompression bomb?) at offset "
                      "%llu of the compressed file (%llu bytes inflated)",
                      &off, &inflated),
               2, "%s", eb.msg);
  cr_assert(strstr(eb.msg, "bytes inflated): more than 256 times the compressed size"), "%s",
            eb.msg);
  cr_assert_gt(inflated, MS__ZIO_BOMB_SLACK + MS__ZIO_BOMB_RATIO * off, "%s", eb.msg);
  th_memsink_free(&out);
}

/* ---- settings depth: what the writer accepts, the reader reads back ------------------------- */

static ms_snapshot_t *nested_settings(int levels) {
  /* top-level map "m0" containing "m1" containing ... "m<levels-1>", whose entry is "x": 1 */
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  uint32_t first = 0, prev = 0;
  for (int k = 1; k <= levels; k++) {
    ms_snap_kv_t kv = {0};
    kv.key = k < levels ? "m" : "x";
    kv.s = "";
    kv.kind = k < levels ? MS_SNAP_VAL_MAP : MS_SNAP_VAL_INT;
    kv.i = 1;
    uint32_t idx;
    cr_assert_eq(ms__snapbuild_add_setting_child(&b, &kv, &idx), MS_OK);
    if (k == 1) {
      first = idx;
    } else {
      b.settings_children.ptr[prev].first = idx;
      b.settings_children.ptr[prev].count = 1;
    }
    prev = idx;
  }
  ms_snap_kv_t top = {0};
  top.key = "m0";
  top.s = "";
  top.kind = MS_SNAP_VAL_MAP;
  top.first = first;
  top.count = 1;
  cr_assert_eq(ms__snapbuild_add_setting(&b, &top), MS_OK);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  return s;
}

Test(serialize, settings_depth_limit_is_the_same_for_writer_and_reader) {
  ms_snapshot_t *ok = nested_settings(8); /* 8 maps: m0 and 7 nested */
  roundtrip(ok, 0);
  ms_snapshot_free(ok);
  ms_snapshot_t *deep = nested_settings(9);
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_write(deep, NULL, &sink, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "allocator_settings nested deeper than 8");
  th_memsink_free(&m);
  ms_snapshot_free(deep);
}

/* ---- "-": standard input and output --------------------------------------------------------- */

Test(serialize, dash_means_stdin_and_stdout) {
  char *dir = th_tmpdir();
  char path[4200];
  snprintf(path, sizeof path, "%s/out.msgpack.gz", dir);
  ms_snapshot_t *s = th_synth(NULL);
  /* write "-" with stdout redirected to a file */
  cr_assert_not_null(freopen(path, "wb", stdout));
  ms_errbuf_t eb = {{0}};
  ms_write_opts_t o = {1};
  cr_assert_eq(ms_snapshot_write_file(s, "-", &o, &eb), MS_OK, "%s", eb.msg);
  fflush(stdout);
  /* read "-" with stdin redirected from it */
  cr_assert_not_null(freopen(path, "rb", stdin));
  ms_snapshot_t *r = NULL;
  cr_assert_eq(ms_snapshot_load("-", &r, &eb), MS_OK, "%s", eb.msg);
  TH_ASSERT_SNAP_EQ(s, r);
  ms_snapshot_free(r);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

/* ---- the row decoder: encodings, read sizes, the guard's precedence ------------------------- */

/* Reads from memory in pieces of `piece` bytes (0: all at once). */
typedef struct pieces_s {
  const char *data;
  size_t len, pos, piece;
} pieces_t;

static ptrdiff_t pieces_read(void *ctx, char *buf, size_t cap) {
  pieces_t *p = ctx;
  size_t n = p->len - p->pos;
  if (p->piece && n > p->piece) n = p->piece;
  if (n > cap) n = cap;
  memcpy(buf, p->data + p->pos, n);
  p->pos += n;
  return (ptrdiff_t)n;
}

static int decode_pieces(const void *data, size_t len, size_t piece, ms_snapshot_t **out,
                         ms_errbuf_t *eb) {
  pieces_t p = {data, len, 0, piece};
  ms_source_t src = {pieces_read, &p};
  eb->msg[0] = 0;
  return ms_snapshot_read(&src, out, eb);
}

Test(serialize, rows_accept_every_integer_and_length_encoding) {
  const uint64_t counts[9] = {0, 0, 1, 2, 0, 0, 0, 0, 0};
  mp_t m;
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  /* a segment row as array16, with int8/int16/uint8/uint16 encodings */
  mp_byte(&m, 0xdc);
  mp_be(&m, 14, 2);
  mp_byte(&m, 0xd0); /* device: int8 -1 */
  mp_byte(&m, 0xff);
  mp_byte(&m, 0xd2); /* address: int32 0x10000 (non-negative: an unsigned integer) */
  mp_be(&m, 0x10000, 4);
  mp_byte(&m, 0xcd); /* total_size: uint16 0x3000 */
  mp_be(&m, 0x3000, 2);
  for (int c = 3; c <= 6; c++)
    mp_byte(&m, 0xcc), mp_byte(&m, 7); /* uint8 7 */
  mp_byte(&m, 0xc3);                   /* is_large: true */
  mp_byte(&m, 0xc2);
  mp_byte(&m, 0xd3); /* pool_id[0]: int64 -5 */
  mp_be(&m, (uint64_t)-5, 8);
  mp_byte(&m, 0xe0); /* pool_id[1]: negative fixint -32 */
  mp_byte(&m, 0xc0);
  mp_byte(&m, 0xd1); /* nblocks: int16 2 */
  mp_be(&m, 2, 2);
  mp_uint(&m, 0);
  /* blocks: array32 chunk header; state as a str8 string and as a uint64 number */
  mp_byte(&m, 0xdd);
  mp_be(&m, 3, 4);
  mp_uint(&m, 4);
  mp_arr(&m, 7);
  mp_uint(&m, 0x10000);
  mp_uint(&m, 0x1000);
  mp_uint(&m, 0x1000);
  mp_byte(&m, 0xd9);
  mp_byte(&m, 8);
  mp_raw(&m, "inactive", 8);
  mp_byte(&m, 0xc0);
  mp_uint(&m, 0);
  mp_uint(&m, 0);
  mp_byte(&m, 0xdc); /* a row as array16 */
  mp_be(&m, 7, 2);
  mp_uint(&m, 0x11000);
  mp_uint(&m, 0x2000);
  mp_uint(&m, 0x2000);
  mp_byte(&m, 0xcf);
  mp_be(&m, 1, 8);
  mp_byte(&m, 0xc0);
  mp_uint(&m, 0);
  mp_uint(&m, 0);
  mp_finish(&m);
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(decode(m.b, m.n, &r, &eb), MS_OK, "%s", eb.msg);
  const ms_snap_segment_t *g = &r->segments[0];
  cr_assert_eq(g->device, -1);
  cr_assert_eq(g->address, 0x10000);
  cr_assert_eq(g->total_size, 0x3000);
  cr_assert_eq(g->stream, 7);
  cr_assert(g->is_large && !g->is_expandable);
  cr_assert_eq(g->pool_id[0], -5);
  cr_assert_eq(g->pool_id[1], -32);
  cr_assert_eq(g->stack, MS_SNAP_NO_STACK);
  cr_assert_eq(g->nblocks, 2);
  cr_assert_eq(r->blocks[0].state, MS_BLOCK_INACTIVE);
  cr_assert_str_eq(r->blocks[0].state_name, "inactive");
  cr_assert_eq(r->blocks[1].state, MS_BLOCK_ACTIVE_ALLOCATED);
  cr_assert_eq(r->blocks[1].size, 0x2000);
  ms_snapshot_free(r);
}

/* A segment of two 0x1000 blocks whose first block row has a string as its size; `tail` adds
 * what follows that row inside the chunk. @return the offset of the bad size. */
static size_t bad_block_file(mp_t *m, void (*tail)(mp_t *)) {
  const uint64_t counts[9] = {0, 0, 1, 2, 0, 0, 0, 0, 0};
  mp_start(m, 1, counts);
  mp_arr(m, 2);
  mp_uint(m, 3);
  mp_segment_row(m, 0x2000, 2, -1);
  mp_arr(m, 3);
  mp_uint(m, 4);
  mp_arr(m, 7);
  mp_uint(m, 0x10000);
  size_t off = m->n;
  mp_str(m, "x");
  mp_uint(m, 0x1000);
  mp_uint(m, 1);
  mp_byte(m, 0xc0);
  mp_uint(m, 0);
  mp_uint(m, 0);
  tail(m);
  return off;
}

static void tail_good_row(mp_t *m) {
  mp_block_row(m, 0x11000, 0x1000);
  mp_finish(m);
}
static void tail_c1(mp_t *m) {
  mp_arr(m, 7);
  mp_byte(m, 0xc1);
}
static void tail_huge_str(mp_t *m) {
  mp_arr(m, 7);
  mp_byte(m, 0xdb);
  mp_be(m, 0xfffffff0u, 4);
  mp_raw(m, "abcd", 4);
}
static void tail_cut(mp_t *m) {
  mp_arr(m, 7);
  mp_uint(m, 0x11000);
}

Test(serialize, guard_findings_come_before_row_errors) {
  /* The rows of a chunk are decoded while it is read; an error in an early row must still give
   * way to what the guard finds later in the same chunk, in every read size. */
  static const size_t pieces[] = {0, 1, 5, 40};
  for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
    mp_t m;
    char want[200];
    size_t off = bad_block_file(&m, tail_good_row);
    snprintf(want, sizeof want,
             "offset %zu: segments[0].blocks[0].size: expected unsigned integer, got string", off);
    ms_snapshot_t *r = NULL;
    ms_errbuf_t eb;
    cr_assert_eq(decode_pieces(m.b, m.n, pieces[k], &r, &eb), MS_EFORMAT);
    cr_assert_str_eq(eb.msg, want, "pieces of %zu", pieces[k]);

    bad_block_file(&m, tail_c1);
    snprintf(want, sizeof want, "offset %zu: invalid msgpack type byte 0xc1", m.n - 1);
    cr_assert_eq(decode_pieces(m.b, m.n, pieces[k], &r, &eb), MS_EFORMAT);
    cr_assert_str_eq(eb.msg, want, "pieces of %zu", pieces[k]);

    bad_block_file(&m, tail_huge_str);
    snprintf(want, sizeof want,
             "offset %zu: declared length 4294967280 exceeds the limit of 67108864 bytes per "
             "object",
             m.n - 9);
    cr_assert_eq(decode_pieces(m.b, m.n, pieces[k], &r, &eb), MS_ELIMIT);
    cr_assert_str_eq(eb.msg, want, "pieces of %zu", pieces[k]);

    /* the chunk's header: array, tag, row's array, 9-byte address, then the bad size */
    size_t chunk = bad_block_file(&m, tail_cut) - 1 - 1 - 1 - 9;
    snprintf(want, sizeof want,
             "offset %zu: truncated input in a table chunk (object at offset %zu is incomplete)",
             m.n, chunk);
    cr_assert_eq(decode_pieces(m.b, m.n, pieces[k], &r, &eb), MS_ETRUNCATED);
    cr_assert_str_eq(eb.msg, want, "pieces of %zu", pieces[k]);
    cr_assert_null(r);
  }
}

Test(serialize, too_many_values_in_a_chunk) {
  /* one frame, then a stack of 2^21 frame indices: 2^21 + 3 values in the chunk */
  const uint64_t counts[9] = {1, 1, 0, 0, 0, 0, 0, 0, 0};
  mp_t m;
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 1);
  mp_arr(&m, 3);
  mp_str(&m, "f");
  mp_str(&m, "g");
  mp_uint(&m, 1);
  mp_arr(&m, 2);
  mp_uint(&m, 2);
  mp_byte(&m, 0xdd);
  mp_be(&m, 1u << 21, 4);
  size_t n = (1u << 21) + 64;
  char *buf = malloc(m.n + n);
  cr_assert_not_null(buf);
  memcpy(buf, m.b, m.n);
  memset(buf + m.n, 0, n);
  /* values: the chunk, its tag, the stack's array, then the indices (one byte each, from m.n):
   * value 2^21 + 1, the first over the limit, is index number 2^21 - 2 */
  char want[160];
  snprintf(want, sizeof want, "offset %zu: more than 2097152 values in one object",
           m.n + (1u << 21) - 3);
  ms_snapshot_t *r = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(decode_pieces(buf, m.n + n, 0, &r, &eb), MS_ELIMIT, "%s", eb.msg);
  cr_assert_str_eq(eb.msg, want);
  cr_assert_eq(decode_pieces(buf, m.n + n, 100000, &r, &eb), MS_ELIMIT, "%s", eb.msg);
  cr_assert_str_eq(eb.msg, want);
  free(buf);
}

Test(serialize, results_do_not_depend_on_read_sizes, .timeout = 120) {
  /* Every single-byte corruption of a small file gives the same code and message (and, when
   * accepted, the same model) whether the input arrives at once or in small pieces (1-byte
   * pieces at every third byte only: this test must stay short under the sanitizers). */
  th_synth_opts_t o = {2, 3, 4, 3, 3, 1, 11};
  ms_snapshot_t *s = th_synth(&o);
  th_memsink_t m;
  encode(s, 0, &m);
  static const unsigned char types[] = {0x00, 0xc1, 0xcf};
  static const size_t pieces[] = {1, 13};
  char *buf = malloc(m.len);
  for (size_t i = 0; i < m.len; i++) {
    for (size_t t = 0; t < sizeof types; t++) {
      memcpy(buf, m.data, m.len);
      buf[i] = (char)types[t];
      ms_snapshot_t *a = NULL;
      ms_errbuf_t ea;
      int ra = decode_pieces(buf, m.len, 0, &a, &ea);
      for (size_t k = i % 3 ? 1 : 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        ms_snapshot_t *b = NULL;
        ms_errbuf_t eb;
        int rb = decode_pieces(buf, m.len, pieces[k], &b, &eb);
        cr_assert_eq(ra, rb, "byte %zu = 0x%02x, pieces of %zu: '%s' vs '%s'", i, types[t],
                     pieces[k], ea.msg, eb.msg);
        if (ra == MS_OK) {
          TH_ASSERT_SNAP_EQ(a, b);
          ms_snapshot_free(b);
        } else {
          cr_assert_str_eq(ea.msg, eb.msg, "byte %zu = 0x%02x, pieces of %zu", i, types[t],
                           pieces[k]);
        }
      }
      ms_snapshot_free(a);
    }
  }
  free(buf);
  th_memsink_free(&m);
  ms_snapshot_free(s);
}

Test(serialize, long_strings_across_reads) {
  /* Trace rows with strings longer than the intern limit, read in pieces that cut them. */
  th_synth_opts_t o = {4, 10, 10, 10, 300, 1, 21};
  ms_snapshot_t *s = th_synth(&o);
  static char longs[3][700];
  for (int k = 0; k < 3; k++) {
    memset(longs[k], 'a' + k, sizeof longs[k] - 1);
    longs[k][sizeof longs[k] - 1] = 0;
  }
  /* extras of the test's own (kept while s is used): the long strings on top of each entry's
   * own fields */
  ms_snap_trace_extra_t *xs = calloc(s->ntrace ? s->ntrace : 1, sizeof *xs);
  cr_assert_not_null(xs);
  for (size_t i = 0; i < s->ntrace; i++) {
    if (i % 3 != 0 && i % 5 != 0) continue;
    xs[i] = ms__trace_extra_of(&s->trace[i]);
    if (i % 3 == 0) xs[i].compile_context = longs[i % 2];
    if (i % 5 == 0) xs[i].user_metadata = longs[2];
    s->trace[i].extra = &xs[i];
  }
  th_memsink_t m;
  encode(s, 0, &m);
  static const size_t pieces[] = {0, 3, 100, 1000, 4099};
  for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
    ms_snapshot_t *r = NULL;
    ms_errbuf_t eb;
    cr_assert_eq(decode_pieces(m.data, m.len, pieces[k], &r, &eb), MS_OK, "%s", eb.msg);
    TH_ASSERT_SNAP_EQ(s, r);
    ms_snapshot_free(r);
  }
  th_memsink_free(&m);
  ms_snapshot_free(s);
  free(xs);
}

Test(serialize, unsigned_columns_refuse_negative_integers) {
  const uint64_t counts[9] = {0, 0, 1, 1, 0, 0, 0, 0, 0};
  mp_t m;
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 3);
  mp_segment_row(&m, 0x1000, 1, -1);
  mp_arr(&m, 2);
  mp_uint(&m, 4);
  mp_arr(&m, 7);
  mp_uint(&m, 0x10000);
  mp_uint(&m, 0x1000);
  mp_uint(&m, 0x1000);
  size_t off = m.n;
  mp_byte(&m, 0xd0); /* state: int8 -3 */
  mp_byte(&m, 0xfd);
  mp_byte(&m, 0xc0);
  mp_uint(&m, 0);
  mp_uint(&m, 0);
  mp_finish(&m);
  char want[200];
  snprintf(want, sizeof want,
           "offset %zu: segments[0].blocks[0].state: expected state number or string, got "
           "negative integer",
           off);
  expect_error(&m, MS_EFORMAT, want);
}

Test(serialize, row_longer_than_a_read) {
  /* A stack of 30,000 frame indices in 9-byte encodings (270 KB, one row): read in small pieces,
   * the row is cut again and again; the reader lets the guard buffer it whole. */
  const uint64_t counts[9] = {1, 1, 0, 0, 0, 0, 0, 0, 0};
  mp_t m;
  mp_start(&m, 1, counts);
  mp_arr(&m, 2);
  mp_uint(&m, 1);
  mp_arr(&m, 3);
  mp_str(&m, "f");
  mp_str(&m, "g");
  mp_uint(&m, 1);
  mp_arr(&m, 2);
  mp_uint(&m, 2);
  mp_byte(&m, 0xdc);
  mp_be(&m, 30000, 2);
  size_t n = 30000 * 9, tail = 8;
  char *buf = calloc(1, m.n + n + tail);
  cr_assert_not_null(buf);
  memcpy(buf, m.b, m.n);
  for (size_t i = 0; i < 30000; i++)
    buf[m.n + 9 * i] = (char)0xcf;
  size_t len = m.n + n;
  memcpy(buf + len, "\x92\x09\x80\x91\x00", 5); /* settings {}, end */
  len += 5;
  static const size_t pieces[] = {0, 1000, 70000};
  for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
    ms_snapshot_t *r = NULL;
    ms_errbuf_t eb;
    cr_assert_eq(decode_pieces(buf, len, pieces[k], &r, &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(r->nstacks, 1);
    cr_assert_eq(r->stacks[0].nframes, 30000);
    cr_assert_eq(ms_snap_frame_index(r, 29999), 0);
    ms_snapshot_free(r);
  }
  free(buf);
}

/* The gzip sink (memsnap/serialize.h): switching deflate's strategy in the middle keeps one valid
 * stream that inflates to what was written; the trial says the default search beats runs on a
 * repeated pattern with no runs in it, and chooses the default for an empty sample. */
Test(serialize, gzip_sink_strategy_switches) {
  th_memsink_t m;
  ms_sink_t inner, gz;
  th_memsink_init(&inner, &m);
  ms_gzip_sink_t *z = NULL;
  cr_assert_eq(ms_gzip_sink_create(&inner, 6, &z, &gz), MS_OK);
  static unsigned char data[3][40000];
  uint32_t x = 7;
  for (size_t i = 0; i < sizeof data[0]; i++) {
    x = x * 1103515245u + 12345u;
    data[0][i] = "abcdefg"[i % 7];               /* a pattern: the default search wins */
    data[1][i] = (unsigned char)((x >> 16) & 3); /* few values, no order */
    data[2][i] = (unsigned char)(i / 1000);      /* runs */
  }
  cr_assert_not(ms_gzip_sink_rle_better(z, data[0], sizeof data[0]));
  cr_assert_not(ms_gzip_sink_rle_better(z, data[0], 0));
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(ms_gzip_sink_rle(z, k == 1), MS_OK);
    cr_assert_eq(gz.write(gz.ctx, (const char *)data[k], 20000), MS_OK);
    cr_assert_eq(ms_gzip_sink_rle(z, k != 1), MS_OK);
    cr_assert_eq(gz.write(gz.ctx, (const char *)data[k] + 20000, 20000), MS_OK);
  }
  cr_assert_eq(ms_gzip_sink_finish(z), MS_OK);
  ms_gzip_sink_destroy(z);
  unsigned char *back = malloc(sizeof data + 1);
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  cr_assert_eq(inflateInit2(&zs, 16 + MAX_WBITS), Z_OK);
  zs.next_in = (Bytef *)m.data;
  zs.avail_in = (uInt)m.len;
  zs.next_out = back;
  zs.avail_out = sizeof data + 1;
  cr_assert_eq(inflate(&zs, Z_FINISH), Z_STREAM_END, "one gzip stream");
  cr_assert_eq(zs.total_out, sizeof data);
  cr_assert(memcmp(back, data, sizeof data) == 0);
  inflateEnd(&zs);
  free(back);
  th_memsink_free(&m);
}
