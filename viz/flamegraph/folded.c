/* SPDX-License-Identifier: MIT
 * memsnap viz: the folded-stack text reader (`a;b;c 123` per line), streaming.
 *
 * Input is hostile until proven otherwise: every line is checked (a count is a decimal integer
 * below 2^63; a line has a stack; two-count lines are not mixed with one-count lines), errors name
 * the line number, and memory is bounded by the longest line (at most 64 MiB) plus the tree.
 * Text may arrive in pieces of any size; an incomplete last line is carried to the next call.
 *
 * Speed: consecutive lines of folded files usually share a prefix (they are sorted, or written
 * by walking a tree). The previous line's stack text and node path are kept, and frames inside
 * the common prefix reuse their nodes without hashing (the 200,000-line benchmark in
 * bench/bench_flamegraph.c depends on it).
 */
#include <stdlib.h>
#include <string.h>

#include "flamegraph/internal.h"

#define FOLDED_MAX_LINE ((size_t)64 << 20)

void ms__folded_release(ms__folded_t *f) {
  free(f->carry);
  free(f->prev);
  free(f->fptr);
  free(f->flen);
  memset(f, 0, sizeof *f);
}

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* Parses a count field. @return 1 valid (*neg, *v set), 0 not a number, -1 out of range;
 * *neg and *v are set only when valid (a stack whose last word is "-3ain" is not negative). */
static int folded_count(const char *s, size_t len, int *neg, uint64_t *v) {
  int minus = 0;
  if (len && (s[0] == '-' || s[0] == '+')) {
    minus = s[0] == '-';
    s++;
    len--;
  }
  if (len == 0) return 0;
  uint64_t x = 0;
  int range = 1;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return 0;
    unsigned d = (unsigned)(s[i] - '0');
    if (x > (((uint64_t)1 << 63) - 1 - d) / 10) range = 0;
    else x = x * 10 + d;
  }
  if (!range) return -1;
  *neg = minus;
  *v = x;
  return 1;
}

/* The last blank-separated field of s[0..len): sets *start; the field is s[*start..len). */
static size_t last_field(const char *s, size_t len) {
  size_t i = len;
  while (i > 0 && !is_blank(s[i - 1])) i--;
  return i;
}

static int folded_grow_frames(ms__folded_t *f, size_t n) {
  if (n <= f->fcap) return MS_OK;
  size_t cap = f->fcap ? f->fcap : 64;
  while (cap < n) cap *= 2;
  const char **p = realloc(f->fptr, cap * sizeof *p);
  if (!p) return MS_ENOMEM;
  f->fptr = p;
  size_t *l = realloc(f->flen, cap * sizeof *l);
  if (!l) return MS_ENOMEM;
  f->flen = l;
  f->fcap = cap;
  return MS_OK;
}

static int folded_bad_count(ms_errbuf_t *eb, size_t lineno, const char *s, size_t len, int rc) {
  int shown = len > 40 ? 40 : (int)len;
  if (rc < 0)
    return ms__viz_errbuf(eb, MS_ELIMIT, "line %zu: count '%.*s%s' is too large (limit 2^63-1)",
                          lineno, shown, s, len > 40 ? "..." : "");
  return ms__viz_errbuf(eb, MS_EFORMAT, "line %zu: count '%.*s%s' is not a whole number", lineno,
                        shown, s, len > 40 ? "..." : "");
}

int ms__folded_line(ms_flame_t *fl, const char *line, size_t len, ms_errbuf_t *eb) {
  ms__folded_t *f = &fl->folded;
  size_t lineno = ++f->lineno;
  while (len && (line[len - 1] == '\r' || is_blank(line[len - 1]))) len--;
  if (len == 0) return MS_OK;

  size_t cs = last_field(line, len);
  if (cs == 0)
    return ms__viz_errbuf(eb, MS_EFORMAT, "line %zu: no count (expected 'STACK COUNT')", lineno);
  int neg_a = 0, neg_b = 0;
  uint64_t after = 0, before = 0;
  int rc = folded_count(line + cs, len - cs, &neg_a, &after);
  if (rc != 1) return folded_bad_count(eb, lineno, line + cs, len - cs, rc);
  size_t se = cs;
  while (se && is_blank(line[se - 1])) se--;

  /* A second count before the last one makes a differential line (difffolded.pl's format).
   * The first data line decides the mode; a one-count file never looks for a second count, so
   * frames that end in " 12" stay part of the stack. */
  size_t bs = last_field(line, se);
  int two = 0;
  if (f->mode != 1 && bs > 0 && folded_count(line + bs, se - bs, &neg_b, &before) == 1) two = 1;
  if (f->mode == 0) f->mode = two ? 2 : 1;
  if (f->mode == 2 && !two) {
    return ms__viz_errbuf(eb, MS_EFORMAT,
                          "line %zu: expected two counts (STACK BEFORE AFTER) like the first line",
                          lineno);
  }
  if (two) {
    rc = folded_count(line + bs, se - bs, &neg_b, &before);
    if (rc != 1) return folded_bad_count(eb, lineno, line + bs, se - bs, rc);
    se = bs;
    while (se && is_blank(line[se - 1])) se--;
  }
  if (se == 0) return ms__viz_errbuf(eb, MS_EFORMAT, "line %zu: empty stack", lineno);
  if (neg_a || neg_b) {
    f->skipped++;
    return MS_OK;
  }
  if (two && !fl->tree.diff) {
    if (fl->has_plain)
      return ms__viz_errbuf(eb, MS_ESTATE,
                            "line %zu: two counts, but the graph already holds plain values",
                            lineno);
    MS_FORWARD_ERR(ms__ftree_make_diff(&fl->tree));
  } else if (!two && fl->tree.diff) {
    return ms__viz_errbuf(eb, MS_ESTATE,
                          "line %zu: one count, but the graph holds differential values", lineno);
  }

  /* Split the stack into frames. */
  size_t n = 0;
  const char *p = line, *end = line + se;
  for (;;) {
    const char *semi = memchr(p, ';', (size_t)(end - p));
    const char *stop = semi ? semi : end;
    if (n == f->fcap) MS_FORWARD_ERR(folded_grow_frames(f, n + 1));
    f->fptr[n] = p;
    f->flen[n] = (size_t)(stop - p);
    n++;
    if (!semi) break;
    p = semi + 1;
  }

  /* Frames fully inside the prefix shared with the previous line reuse its nodes. */
  size_t reuse = 0;
  if (!fl->opts.reverse && f->prev_frames) {
    const char *prev = f->prev_ext ? f->prev_ext : f->prev;
    size_t l = 0, m = se < f->prev_len ? se : f->prev_len;
    while (l + 8 <= m) {
      uint64_t x, y;
      memcpy(&x, line + l, 8);
      memcpy(&y, prev + l, 8);
      if (x != y) break;
      l += 8;
    }
    while (l < m && line[l] == prev[l]) l++;
    int prev_boundary = l == f->prev_len || prev[l] == ';';
    for (size_t k = 0; k < n && k < f->prev_frames; k++) {
      size_t fend = (size_t)(f->fptr[k] - line) + f->flen[k];
      if (fend < l || (fend == l && prev_boundary)) reuse = k + 1;
      else break;
    }
  }
  int err = ms__ftree_add(&fl->tree, f->fptr, f->flen, n, reuse, fl->opts.reverse, before, after);
  f->prev_frames = 0;
  f->prev_ext = NULL;
  if (err) {
    if (err == MS_ELIMIT)
      return ms__viz_errbuf(eb, err, "line %zu: values overflow (sum reaches 2^63)", lineno);
    return ms__viz_errbuf(eb, err, "line %zu: %s", lineno, ms_strerror(err));
  }
  if (!two) fl->has_plain = 1;
  if (!fl->opts.reverse) {
    /* The line stays valid until the caller's call returns: keep a pointer, and copy it only
     * when the call ends (folded_keep_prev). */
    f->prev_ext = line;
    f->prev_len = se;
    f->prev_frames = n;
  }
  return MS_OK;
}

/* Copies the previous line into the parser's own buffer before the caller's text (or the carry
 * buffer) it points into goes away; without memory for it the cache is dropped. */
static void folded_keep_prev(ms__folded_t *f) {
  if (!f->prev_ext) return;
  if (f->prev_len > f->prev_cap) {
    size_t cap = f->prev_cap ? f->prev_cap : 256;
    while (cap < f->prev_len) cap *= 2;
    char *p = realloc(f->prev, cap);
    if (!p) {
      f->prev_frames = 0;
      f->prev_ext = NULL;
      return;
    }
    f->prev = p;
    f->prev_cap = cap;
  }
  memcpy(f->prev, f->prev_ext, f->prev_len);
  f->prev_ext = NULL;
}

int ms_flame_add_folded(ms_flame_t *fl, const char *text, size_t len, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  if (!fl || (!text && len)) return ms__viz_errbuf(eb, MS_EINVAL, "invalid argument");
  ms__folded_t *f = &fl->folded;
  size_t i = 0;
  if (f->carry_len) {
    const char *nl = memchr(text, '\n', len);
    size_t take = nl ? (size_t)(nl - text) : len;
    if (take > FOLDED_MAX_LINE - f->carry_len)
      return ms__viz_errbuf(eb, MS_ELIMIT, "line %zu: longer than 64 MiB", f->lineno + 1);
    if (f->carry_len + take > f->carry_cap) {
      size_t cap = f->carry_cap * 2;
      while (cap < f->carry_len + take) cap *= 2;
      char *c = realloc(f->carry, cap);
      if (!c) return ms__viz_errbuf(eb, MS_ENOMEM, "out of memory");
      f->carry = c;
      f->carry_cap = cap;
    }
    memcpy(f->carry + f->carry_len, text, take);
    f->carry_len += take;
    if (!nl) return MS_OK;
    size_t clen = f->carry_len;
    f->carry_len = 0;
    int err = ms__folded_line(fl, f->carry, clen, eb);
    folded_keep_prev(f); /* the carry buffer is reused below */
    if (err) return err;
    i = take + 1;
  }
  int err = MS_OK;
  while (i < len && !err) {
    const char *nl = memchr(text + i, '\n', len - i);
    if (!nl) {
      folded_keep_prev(f);
      size_t rest = len - i;
      if (rest > FOLDED_MAX_LINE)
        return ms__viz_errbuf(eb, MS_ELIMIT, "line %zu: longer than 64 MiB", f->lineno + 1);
      if (rest > f->carry_cap) {
        size_t cap = f->carry_cap ? f->carry_cap : 4096;
        while (cap < rest) cap *= 2;
        char *c = realloc(f->carry, cap);
        if (!c) return ms__viz_errbuf(eb, MS_ENOMEM, "out of memory");
        f->carry = c;
        f->carry_cap = cap;
      }
      memcpy(f->carry, text + i, rest);
      f->carry_len = rest;
      break;
    }
    err = ms__folded_line(fl, text + i, (size_t)(nl - (text + i)), eb);
    i = (size_t)(nl - text) + 1;
  }
  folded_keep_prev(f);
  return err;
}

int ms_flame_finish_folded(ms_flame_t *fl, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  if (!fl) return ms__viz_errbuf(eb, MS_EINVAL, "invalid argument");
  ms__folded_t *f = &fl->folded;
  if (!f->carry_len) return MS_OK;
  size_t clen = f->carry_len;
  f->carry_len = 0;
  int err = ms__folded_line(fl, f->carry, clen, eb);
  folded_keep_prev(f);
  return err;
}

size_t ms_flame_lines_skipped(const ms_flame_t *fl) { return fl ? fl->folded.skipped : 0; }
