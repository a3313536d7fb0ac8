/* SPDX-License-Identifier: MIT
 * libFuzzer target for the folded-stack reader and the SVG writer (memsnap/viz.h; issue #16
 * item 25): folded text -> frame tree -> the interactive SVG and the merged folded text, in
 * memory. The first two bytes choose the rendering options (inverted, reverse, flame chart,
 * memory colours, hash, palette, minwidth as a percentage) and the size of the pieces the text
 * is fed in; the rest is the folded text. For every input:
 *  - ms_flame_add_folded / ms_flame_finish_folded answer MS_OK or an error with a message
 *    ("line N: ..."); fed in pieces they give the same answer and the same total as fed whole;
 *  - an accepted text writes an SVG (MS_OK) that is one document ending in "</svg>" (and newlines)
 * and holds no control byte but tab, CR and newline (names are escaped), and folded text that, read
 *    back, gives the same total and the same differential flag (where the folded format can carry
 *    the graph back: folded_lossy);
 *  - a sink that fails part-way makes both writers fail with that error, never crash (one input
 *    in four, chosen by the option bytes).
 *
 * Built and run by scripts/fuzz.sh (make fuzz); seeds in tests/fuzz/corpus/fuzz_folded/.
 * fuzz-flags: -max_len=2048 -dict=tests/fuzz/folded.dict
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "memsnap/viz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Builds a flame from text fed in pieces of `piece` bytes (0: at once). @return the status;
 * *out the builder (also on failure: the lines before the bad one stay added). */
static int folded_build(const ms_flame_options_t *o, const char *text, size_t len, size_t piece,
                        ms_flame_t **out, ms_errbuf_t *eb) {
  ms_flame_t *fl = NULL;
  FZ_CHECK(ms_flame_create(o, &fl) == MS_OK, "create");
  eb->msg[0] = 0;
  int rc = MS_OK;
  for (size_t at = 0; at < len && rc == MS_OK;) {
    size_t n = piece && piece < len - at ? piece : len - at;
    rc = ms_flame_add_folded(fl, text + at, n, eb);
    at += n;
  }
  if (rc == MS_OK) rc = ms_flame_finish_folded(fl, eb);
  if (rc != MS_OK) {
    FZ_CHECK(rc == MS_EFORMAT || rc == MS_ELIMIT || rc == MS_ESTATE || rc == MS_ENOMEM,
             "add_folded returned %d", rc);
    FZ_DESCRIBED(rc, *eb);
  }
  *out = fl;
  return rc;
}

static void folded_check_svg(const fz_buf_t *b) {
  FZ_CHECK(fz_svg_complete(b), "the SVG does not end with </svg>");
  FZ_CHECK(strstr(b->p, "<svg") != NULL, "no <svg element");
  for (size_t i = 0; i < b->n; i++) {
    unsigned char c = (unsigned char)b->p[i];
    FZ_CHECK(c >= 0x20 || c == '\n' || c == '\t' || c == '\r',
             "control byte 0x%02x at %zu of the SVG", c, i);
  }
}

/* What the folded format cannot carry back, line by line of the written text:
 * bit 1: a stack that itself ends in a blank and a number ("x 12 4"), which reads back as a
 * two-count line (three fields for a differential graph); bit 2: a last frame that ends in a blank
 * ("x  4"): the reader trims the blanks before the counts, so "x " reads back as "x" (and may merge
 * with it, which changes a differential graph's drawn widths, never a plain graph's total).
 * @return the bits (1, 2) of what was found. */
static int folded_lossy(const fz_buf_t *b, int diff) {
  if (!b->p) return 0;
  int found = 0;
  const char *p = b->p, *end = b->p + b->n;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *e = nl ? nl : end;
    size_t gap = 0;
    for (int field = 0; field < (diff ? 2 : 1); field++) { /* drop the counts */
      while (e > p && e[-1] != ' ' && e[-1] != '\t')
        e--;
      const char *g = e;
      while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
      gap = (size_t)(g - e);
    }
    if (gap > 1) found |= 2;
    const char *d = e;
    while (d > p && d[-1] >= '0' && d[-1] <= '9')
      d--;
    if (d < e && d > p && (d[-1] == '+' || d[-1] == '-')) d--;
    if (d < e && d > p && (d[-1] == ' ' || d[-1] == '\t')) found |= 1;
    p = nl ? nl + 1 : end;
  }
  return found;
}

/* Both writers into a sink that fails after `limit` bytes: an error, never a crash. */
static void folded_failing_sink(ms_flame_t *fl, size_t limit) {
  fz_buf_t b = {0};
  b.limit = limit;
  ms_sink_t sink = {fz_buf_write, &b};
  ms_errbuf_t eb = {{0}};
  int rc = ms_flame_write_svg(fl, &sink, &eb);
  FZ_CHECK(rc == MS_EIO, "SVG into a failing sink: %d", rc);
  fz_buf_reset(&b);
  b.limit = limit;
  rc = ms_flame_write_folded(fl, &sink, &eb);
  FZ_CHECK(rc == MS_OK || rc == MS_EIO, "folded into a failing sink: %d", rc);
  fz_buf_reset(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in_t in = fz_in(data, size);
  uint8_t f, g;
  if (!fz_take(&in, &f) || !fz_take(&in, &g)) return 0;
  const char *text = (const char *)in.p;
  size_t len = in.n;
  ms_flame_options_t o;
  ms_flame_options_init(&o);
  o.inverted = f & 1;
  o.reverse = (f >> 1) & 1;
  o.flamechart = (f >> 2) & 1;
  o.memory = (f >> 3) & 1;
  o.hash = (f >> 4) & 1;
  if (f & 0x20) o.minwidth_pct = (double)(g & 7) * 0.5;
  if (f & 0x40) o.width = 21 + (unsigned)g * 7;
  o.colors = (ms_flame_palette)((f >> 7 | (g >> 3) << 1) % MS_FLAME_PALETTE_COUNT_);
  size_t piece = 1 + (g >> 2) % 61;

  ms_errbuf_t eb, eb2;
  ms_flame_t *fl = NULL, *fp = NULL;
  int rc = folded_build(&o, text, len, 0, &fl, &eb);
  int rp = folded_build(&o, text, len, piece, &fp, &eb2);
  FZ_CHECK(rc == rp, "whole %d, in pieces of %zu %d", rc, piece, rp);
  if (rc != MS_OK)
    FZ_CHECK(strcmp(eb.msg, eb2.msg) == 0, "messages differ: '%s' / '%s'", eb.msg, eb2.msg);
  FZ_CHECK(ms_flame_total(fl) == ms_flame_total(fp), "whole and in pieces: other totals");
  ms_flame_destroy(fp);
  if (rc != MS_OK) {
    ms_flame_destroy(fl);
    return 0;
  }

  fz_buf_t svg = {0}, folded = {0};
  ms_sink_t s1 = {fz_buf_write, &svg}, s2 = {fz_buf_write, &folded};
  rc = ms_flame_write_svg(fl, &s1, &eb);
  FZ_CHECK(rc == MS_OK, "write_svg: %d %s", rc, eb.msg);
  folded_check_svg(&svg);
  rc = ms_flame_write_folded(fl, &s2, &eb);
  FZ_CHECK(rc == MS_OK, "write_folded: %d %s", rc, eb.msg);

  /* A differential graph's drawn width depends on the tree's shape: only without flame-chart
   * order (read back, equal frames merge by name) and without frames the reader trims. */
  int diff = ms_flame_is_diff(fl), lossy = folded_lossy(&folded, diff);
  if (!(lossy & 1) && !(diff && ((lossy & 2) || o.flamechart))) {
    ms_flame_options_t plain;
    ms_flame_options_init(&plain);
    ms_flame_t *back = NULL;
    rc = folded_build(&plain, folded.p ? folded.p : "", folded.n, 0, &back, &eb);
    FZ_CHECK(rc == MS_OK, "the written folded text is refused: %s", eb.msg);
    FZ_CHECK(ms_flame_total(back) == ms_flame_total(fl), "read back: total %llu, was %llu",
             (unsigned long long)ms_flame_total(back), (unsigned long long)ms_flame_total(fl));
    FZ_CHECK(ms_flame_is_diff(back) == ms_flame_is_diff(fl) || ms_flame_total(fl) == 0,
             "read back: differential flag changed");
    ms_flame_destroy(back);
  }

  if ((g & 3) == 0) folded_failing_sink(fl, svg.n / 2); /* one input in four: the SVG is costly */
  fz_buf_reset(&svg);
  fz_buf_reset(&folded);
  ms_flame_destroy(fl);
  return 0;
}
