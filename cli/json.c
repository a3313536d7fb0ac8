/* SPDX-License-Identifier: MIT
 * memsnap CLI: JSON output (issue #16 item 5). A small writer over an ms_sink_t (strings escaped
 * as RFC 8259 asks; bytes that are not UTF-8 become U+FFFD, so the output is always valid JSON)
 * and the `--json` form of the flame-graph views: the records the folded text carries, one
 * object per stack. The schema is in docs/cli.md ("JSON outputs").
 */
#include <inttypes.h>
#include <stdio.h>
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

typedef struct cli_json_view_s {
  cli_json_t j;
  size_t nrecords;
  int side; /* -1: a plain view; 0: BEFORE's stacks; 1: AFTER's */
} cli_json_view_t;

static int cli_json_emit(void *ctx, const char *const *frames, size_t nframes, uint64_t count) {
  cli_json_view_t *v = ctx;
  /* a trailing empty frame (every frame of the stack filtered) carries no name, as in the SVG */
  if (nframes > 0 && frames[nframes - 1][0] == 0) nframes--;
  cli_json_lit(&v->j, v->nrecords++ ? ",\n  {" : "\n  {");
  if (v->side >= 0) cli_json_lit(&v->j, v->side ? "\"side\": \"after\", " : "\"side\": \"before\", ");
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
  cli_json_view_t v = {{&o.sink, 0}, 0, -1};
  cli_json_lit(&v.j, "{\"command\": ");
  cli_json_str(&v.j, cmd);
  if (head) head(&v.j, head_arg);
  cli_json_lit(&v.j, ", \"records\": [");
  int err = v.j.err ? v.j.err : view(arg, cli_json_emit, &v, &v.side);
  cli_json_lit(&v.j, v.nrecords ? "\n]}\n" : "]}\n");
  if (!err) err = v.j.err;
  if (err != MS_OK) return cli_out_fail(&o, err, NULL);
  return cli_out_commit(&o);
}
