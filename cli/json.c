/* SPDX-License-Identifier: MIT
 * memsnap CLI: JSON output (issue #16 item 5). A small writer over an ms_sink_t (strings escaped
 * as RFC 8259 asks; bytes that are not UTF-8 become U+FFFD, so the output is always valid JSON)
 * and the `--json` form of the flame-graph views: the records the folded text carries, one
 * object per stack (of a two-sided view, `compare --stacks`, one per distinct stack with its
 * bytes on each side, as the merged folded text). The schema is in docs/cli.md ("JSON outputs").
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cli_json_raw(cli_json_t *j, const char *s, size_t n) {
  if (!j->err && n) j->err = j->sink->write(j->sink->ctx, s, n);
}

void cli_json_lit(cli_json_t *j, const char *s) {
  cli_json_raw(j, s, strlen(s));
}

void cli_json_u64(cli_json_t *j, uint64_t v) {
  char b[32];
  cli_json_raw(j, b, (size_t)snprintf(b, sizeof b, "%" PRIu64, v));
}

void cli_json_i64(cli_json_t *j, int64_t v) {
  char b[32];
  cli_json_raw(j, b, (size_t)snprintf(b, sizeof b, "%" PRId64, v));
}

/* The length of the valid UTF-8 sequence at p (1 to 4 bytes), or 0. */
static size_t cli_json_utf8(const unsigned char *p) {
  if (p[0] < 0x80) return 1;
  size_t n = p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : p[0] >= 0xe0 && p[0] <= 0xef ? 3
               : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : 0;
  if (!n) return 0;
  unsigned cp = p[0] & (0x7f >> n);
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if (cp >= 0xd800 && cp <= 0xdfff) return 0;
  return n;
}

void cli_json_str(cli_json_t *j, const char *s) {
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  cli_json_raw(j, "\"", 1);
  while (*p) {
    const unsigned char *q = p;
    while (*q >= 0x20 && *q < 0x80 && *q != '"' && *q != '\\') q++;
    cli_json_raw(j, (const char *)p, (size_t)(q - p));
    p = q;
    if (!*p) break;
    char b[8];
    size_t n;
    if (*p == '"' || *p == '\\') {
      b[0] = '\\';
      b[1] = (char)*p;
      cli_json_raw(j, b, 2);
      p++;
    } else if (*p < 0x20) {
      cli_json_raw(j, b, (size_t)snprintf(b, sizeof b, "\\u%04x", *p));
      p++;
    } else if ((n = cli_json_utf8(p)) != 0) {
      cli_json_raw(j, (const char *)p, n);
      p += n;
    } else {
      cli_json_lit(j, "\\ufffd"); /* not UTF-8 */
      p++;
    }
  }
  cli_json_raw(j, "\"", 1);
}

/* ---- the views as records ------------------------------------------------------------------ */

/* A distinct stack of a two-sided view: its frames (each with its NUL, one after the other, in
 * the key arena) and its bytes on each side. */
typedef struct cli_json_stack_s {
  size_t key, len, nframes;
  uint64_t bytes[2];
} cli_json_stack_t;

typedef struct cli_json_view_s {
  cli_json_t j;
  size_t nrecords;
  int side; /* -1: a plain view; 0: BEFORE's stacks; 1: AFTER's */
  /* the two-sided view's stacks, merged (issue #31: one record per stack, not per block) */
  cli_json_stack_t *stacks;
  size_t nstacks, cap;
  size_t *slots; /* open addressing over stacks: index + 1, 0 empty */
  size_t nslots;
  char *keys;
  size_t keys_len, keys_cap;
} cli_json_view_t;

static uint64_t cli_json_hash(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return h;
}

static bool cli_json_grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t n = *cap ? *cap : 64;
  while (n < need) n *= 2;
  void *q = realloc(*p, n * elem);
  if (!q) return false;
  *p = q;
  *cap = n;
  return true;
}

/* Adds count bytes to the stack's side, the stack made on its first sight. @return MS_OK or
 * MS_ENOMEM. */
static int cli_json_merge(cli_json_view_t *v, const char *const *frames, size_t nframes,
                          uint64_t count) {
  size_t start = v->keys_len;
  for (size_t i = 0; i < nframes; i++) {
    size_t n = strlen(frames[i]) + 1;
    if (!cli_json_grow((void **)&v->keys, &v->keys_cap, v->keys_len + n, 1)) return MS_ENOMEM;
    memcpy(v->keys + v->keys_len, frames[i], n);
    v->keys_len += n;
  }
  size_t len = v->keys_len - start;
  if (v->nstacks * 2 >= v->nslots) { /* rehash at half full */
    size_t ns = v->nslots ? v->nslots * 2 : 256;
    size_t *sl = calloc(ns, sizeof *sl);
    if (!sl) return MS_ENOMEM;
    for (size_t i = 0; i < v->nstacks; i++) {
      size_t h = (size_t)cli_json_hash(v->keys + v->stacks[i].key, v->stacks[i].len) & (ns - 1);
      while (sl[h]) h = (h + 1) & (ns - 1);
      sl[h] = i + 1;
    }
    free(v->slots);
    v->slots = sl;
    v->nslots = ns;
  }
  size_t h = (size_t)cli_json_hash(v->keys + start, len) & (v->nslots - 1);
  for (; v->slots[h]; h = (h + 1) & (v->nslots - 1)) {
    cli_json_stack_t *k = &v->stacks[v->slots[h] - 1];
    if (k->len == len && memcmp(v->keys + k->key, v->keys + start, len) == 0) {
      k->bytes[v->side] += count;
      v->keys_len = start; /* the key is known */
      return MS_OK;
    }
  }
  if (!cli_json_grow((void **)&v->stacks, &v->cap, v->nstacks + 1, sizeof *v->stacks))
    return MS_ENOMEM;
  cli_json_stack_t *k = &v->stacks[v->nstacks++];
  *k = (cli_json_stack_t){start, len, nframes, {0, 0}};
  k->bytes[v->side] = count;
  v->slots[h] = v->nstacks;
  return MS_OK;
}

/* The merged stacks as records, in the order they were first seen: {"frames", "before",
 * "after"}. */
static void cli_json_merged(cli_json_view_t *v) {
  for (size_t i = 0; i < v->nstacks && !v->j.err; i++) {
    const cli_json_stack_t *k = &v->stacks[i];
    cli_json_lit(&v->j, v->nrecords++ ? ",\n  {\"frames\": [" : "\n  {\"frames\": [");
    const char *f = v->keys + k->key;
    for (size_t n = 0; n < k->nframes; n++, f += strlen(f) + 1) {
      if (n) cli_json_lit(&v->j, ", ");
      cli_json_str(&v->j, f);
    }
    cli_json_lit(&v->j, "], \"before\": ");
    cli_json_u64(&v->j, k->bytes[0]);
    cli_json_lit(&v->j, ", \"after\": ");
    cli_json_u64(&v->j, k->bytes[1]);
    cli_json_lit(&v->j, "}");
  }
}

static int cli_json_emit(void *ctx, const char *const *frames, size_t nframes, uint64_t count) {
  cli_json_view_t *v = ctx;
  /* a trailing empty frame (every frame of the stack filtered) carries no name, as in the SVG */
  if (nframes > 0 && frames[nframes - 1][0] == 0) nframes--;
  if (v->side >= 0) return cli_json_merge(v, frames, nframes, count);
  cli_json_lit(&v->j, v->nrecords++ ? ",\n  {" : "\n  {");
  cli_json_lit(&v->j, "\"frames\": [");
  for (size_t i = 0; i < nframes; i++) {
    if (i) cli_json_lit(&v->j, ", ");
    cli_json_str(&v->j, frames[i]);
  }
  cli_json_lit(&v->j, "], \"bytes\": ");
  cli_json_u64(&v->j, count);
  cli_json_lit(&v->j, "}");
  return v->j.err;
}

void cli_json_head_file(cli_json_t *j, void *name) {
  cli_json_lit(j, ", \"file\": ");
  cli_json_str(j, name);
}

int cli_render_json(const char *out_path, const char *cmd, cli_json_head_fn *head, void *head_arg,
                    cli_view_fn *view, void *arg) {
  cli_out_t o;
  if (cli_out_open(&o, out_path) != CLI_OK) return CLI_FAILURE;
  cli_json_view_t v;
  memset(&v, 0, sizeof v);
  v.j.sink = &o.sink;
  v.side = -1;
  cli_json_lit(&v.j, "{\"command\": ");
  cli_json_str(&v.j, cmd);
  if (head) head(&v.j, head_arg);
  cli_json_lit(&v.j, ", \"records\": [");
  int err = v.j.err ? v.j.err : view(arg, cli_json_emit, &v, &v.side);
  if (!err) cli_json_merged(&v);
  free(v.stacks);
  free(v.slots);
  free(v.keys);
  cli_json_lit(&v.j, v.nrecords ? "\n]}\n" : "]}\n");
  if (!err) err = v.j.err;
  if (err != MS_OK) return cli_out_fail(&o, err, NULL);
  return cli_out_commit(&o);
}
