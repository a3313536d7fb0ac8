/* SPDX-License-Identifier: MIT
 * memsnap CLI: a command's answer through the snapshot cache (cli.h, "stored answers";
 * docs/performance.md). A second `top`, `timeline`, `explain`, `memory` or `segments` of the same
 * bytes with the same question prints (or writes) the answer the first one stored, without
 * reading the snapshot, its time index or classifying a stack: a blob entry of the snapshot
 * cache (memsnap/cache.h), filed under the file's key (with the command's load flags) and a tag
 * of everything else the answer depends on (the command, the options as given, the
 * --categories file's content, the default rules, memsnap's version). The entry's body is that
 * description, a NUL, then the answer: a description that differs (another question whose tag
 * collides) is a miss. An answer written to a file (memory's and segments' -o) is served into
 * that file through cli_out_t, and kept as cli_out_t writes it (cli_out_keep).
 *
 * The messages printed while the answer is computed (cli_msg_keep: a load's warnings, the
 * command's own) are part of it: after the description's NUL, the body holds the length of a
 * message section in decimal and a newline, the section (per line printed, "OFFSET LEN\n" and
 * the line's LEN bytes, OFFSET being how many bytes of the answer were written before it), then
 * the answer. A served answer prints each line to stderr at its offset, so that stdout and
 * stderr come out in the order they first did. A body not of that form is a miss.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "memsnap/attribution.h"
#include "memsnap/cache.h"

/* Answers past this size are printed, not stored (a --steps series of millions of entries). */
#define ANSWER_MAX ((size_t)16 << 20)
/* The messages kept with an answer, at most (past them the answer is not stored). */
#define ANSWER_MSGS_MAX ((size_t)1 << 20)

static uint64_t answer_fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

static void answer_desc_opt(FILE *d, const char *name, const char *v) {
  if (v) fprintf(d, "%s %zu:%s\n", name, strlen(v), v);
  else fprintf(d, "%s -\n", name);
}

static bool answer_same_stat(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
         a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* Appends p[0..n) to the copy *buf (*len bytes of *cap), growing it by doubling from `first`
 * bytes, unless it would pass `max`. @return false (nothing appended) past max or out of memory:
 * the caller gives the copy up. */
static bool answer_append(char **buf, size_t *len, size_t *cap, size_t first, size_t max,
                          const char *p, size_t n) {
  if (*len > max || n > max - *len) return false;
  if (n > *cap - *len) {
    size_t c = *cap ? *cap : first;
    while (c - *len < n) c *= 2;
    char *b = realloc(*buf, c);
    if (!b) return false;
    *buf = b;
    *cap = c;
  }
  if (n) memcpy(*buf + *len, p, n);
  *len += n;
  return true;
}

/* A message line printed while c is kept (cli_msg_keep): its record, at the answer's length so
 * far; NULL (a line that could not be copied), or past ANSWER_MSGS_MAX: nothing is stored. */
static int answer_msg(void *ctx, const char *p, size_t n) {
  cli_answer_t *c = ctx;
  char head[48];
  int hl = p ? snprintf(head, sizeof head, "%zu %zu\n", c->len, n) : -1;
  if (hl < 0 || n > ANSWER_MSGS_MAX - (size_t)hl ||
      !answer_append(&c->msgs, &c->msgs_len, &c->msgs_cap, 256, ANSWER_MSGS_MAX - n, head,
                     (size_t)hl) ||
      !answer_append(&c->msgs, &c->msgs_len, &c->msgs_cap, 256, ANSWER_MSGS_MAX, p, n))
    c->dropped = true;
  return MS_OK;
}

void cli_answer_open(cli_answer_t *c, const char *cmd, const char *file, unsigned flags,
                     size_t nopts, const char *const *names, const char *const *vals, bool json,
                     const char *rules) {
  memset(c, 0, sizeof *c);
  c->rules = rules;
  struct stat st;
  uint64_t rh = 0, rsize = 0;
  if (!cli_cache_enabled() || strcmp(file, "-") == 0 || stat(file, &st) != 0 ||
      !S_ISREG(st.st_mode))
    return;
  if (rules && (stat(rules, &c->rules_st) != 0 || !S_ISREG(c->rules_st.st_mode) ||
                ms_cache_hash_file(rules, &rh, &rsize) != MS_OK))
    return;
  FILE *d = open_memstream(&c->desc, &c->desc_len);
  if (!d) return;
  const char *def = ms_attr_default_rules();
  /* "answer 2": the body holds the messages (answers of before were the answer alone) */
  fprintf(d, "memsnap %s %d cache %u answer 2 defaults %016" PRIx64 "\n", cmd, ms_version(),
          MS_CACHE_VERSION, answer_fnv(0xcbf29ce484222325ULL, def, strlen(def)));
  for (size_t i = 0; i < nopts; i++) answer_desc_opt(d, names[i], vals[i]);
  fprintf(d, "json %d\nrules %016" PRIx64 "-%" PRIu64 "\n", json ? 1 : 0, rh, rsize);
  if (fclose(d) != 0 || !c->desc || ms_cache_hash_file(file, &c->key.hash, &c->key.size) != MS_OK) {
    free(c->desc);
    c->desc = NULL;
    return;
  }
  c->key.flags = flags;
  c->tag = answer_fnv(0xcbf29ce484222325ULL, c->desc, c->desc_len);
  c->on = true;
  cli_msg_keep = (ms_sink_t){answer_msg, c};
}

/* Stops keeping c's messages. */
static void answer_msgs_stop(cli_answer_t *c) {
  if (cli_msg_keep.ctx == c) cli_msg_keep = (ms_sink_t){NULL, NULL};
}

/* ---- a stored body: its description, its messages, its answer ------------------------------ */

typedef struct answer_parts_s {
  const char *msgs, *ans;
  size_t msgs_len, ans_len;
} answer_parts_t;

/* A decimal of 1 to 15 digits at p[*i] followed by `end`; *i moves past `end`. */
static bool answer_num(const char *p, size_t n, size_t *i, char end, size_t *v) {
  size_t k = *i, x = 0;
  while (k < n && k - *i < 15 && p[k] >= '0' && p[k] <= '9')
    x = x * 10 + (size_t)(p[k++] - '0');
  if (k == *i || k >= n || p[k] != end) return false;
  *v = x;
  *i = k + 1;
  return true;
}

/* Splits a stored body (p[0..n)) whose description is c's: MS_OK, else MS_ENOTFOUND (another
 * question's, or not of the form answer_store writes: every record is checked before anything
 * is printed). */
static int answer_split(const cli_answer_t *c, const char *p, size_t n, answer_parts_t *a) {
  size_t dl = c->desc_len + 1, i = 0, ml = 0;
  if (n < dl || memcmp(p, c->desc, dl) != 0) return MS_ENOTFOUND;
  p += dl;
  n -= dl;
  if (!answer_num(p, n, &i, '\n', &ml) || ml > n - i) return MS_ENOTFOUND;
  a->msgs = p + i;
  a->msgs_len = ml;
  a->ans = a->msgs + ml;
  a->ans_len = n - i - ml;
  size_t at = 0, prev = 0;
  while (at < ml) {
    size_t off = 0, len = 0;
    if (!answer_num(a->msgs, ml, &at, ' ', &off) || !answer_num(a->msgs, ml, &at, '\n', &len) ||
        off < prev || off > a->ans_len || len > ml - at)
      return MS_ENOTFOUND;
    at += len;
    prev = off;
  }
  return MS_OK;
}

/* Writes a's answer through put (stdout, or an output file) and its messages to stderr, each at
 * its offset. @return MS_OK or put's error. */
static int answer_replay(const answer_parts_t *a, int (*put)(void *, const char *, size_t),
                         void *ctx) {
  size_t at = 0, done = 0;
  while (at < a->msgs_len) {
    size_t off = 0, len = 0;
    (void)answer_num(a->msgs, a->msgs_len, &at, ' ', &off); /* checked by answer_split */
    (void)answer_num(a->msgs, a->msgs_len, &at, '\n', &len);
    int rc = put(ctx, a->ans + done, off - done);
    if (rc != MS_OK) return rc;
    fflush(stdout);
    (void)!fwrite(a->msgs + at, 1, len, stderr);
    at += len;
    done = off;
  }
  return put(ctx, a->ans + done, a->ans_len - done);
}

static int answer_put_stdout(void *ctx, const char *p, size_t n) {
  (void)ctx;
  return fwrite(p, 1, n, stdout) == n ? MS_OK : MS_EIO;
}

/* The blob's bytes: its description must be ours; then the answer goes to stdout. */
static int answer_write(void *ctx, const char *p, size_t n) {
  cli_answer_t *c = ctx;
  answer_parts_t a;
  if (answer_split(c, p, n, &a) != MS_OK) return MS_ENOTFOUND;
  c->served = true;
  return answer_replay(&a, answer_put_stdout, NULL);
}

bool cli_answer_serve(cli_answer_t *c) {
  if (!c->on) return false;
  ms_sink_t sink = {answer_write, c};
  int err = ms_cache_blob_get(&c->key, c->tag, NULL, &sink);
  if (err == MS_OK || c->served) { /* a failed write to stdout is main's to report */
    answer_msgs_stop(c);
    free(c->desc);
    c->desc = NULL;
    return true;
  }
  return false;
}

/* Appends p[0..n) to c's copy (given up past ANSWER_MAX, or out of memory). */
static void answer_keep(cli_answer_t *c, const char *p, size_t n) {
  /* too large to store (a --steps listing), or out of memory: given up */
  if (!c->dropped && !answer_append(&c->buf, &c->len, &c->cap, 4096, ANSWER_MAX, p, n))
    c->dropped = true;
  c->kept = true;
}

/* The answer's stream writes through to stdout at once (unbuffered: what the command prints and
 * its messages on stderr keep their order) and keeps a copy, up to ANSWER_MAX bytes. */
static ssize_t answer_tee(void *ctx, const char *p, size_t n) {
  cli_answer_t *c = ctx;
  answer_keep(c, p, n);
  /* a failed write to stdout is main's to report, as when the command writes there itself */
  (void)!fwrite(p, 1, n, stdout);
  return (ssize_t)n;
}

FILE *cli_answer_stream(cli_answer_t *c) {
  if (c->on && !c->out) {
    c->out = fopencookie(c, "w", (cookie_io_functions_t){NULL, answer_tee, NULL, NULL});
    if (c->out) setvbuf(c->out, NULL, _IONBF, 0);
  }
  return c->out ? c->out : stdout;
}

/* Stores the answer when the snapshot it came from was the one hashed (loaded: its key) and the
 * rules file did not change meanwhile. */
static void answer_store(const cli_answer_t *c, const ms_cache_key_t *loaded) {
  struct stat st;
  if (loaded->hash != c->key.hash || loaded->size != c->key.size ||
      loaded->flags != c->key.flags)
    return;
  if (c->rules && (stat(c->rules, &st) != 0 || !answer_same_stat(&st, &c->rules_st))) return;
  char ml[24];
  size_t dl = c->desc_len + 1, hl = (size_t)snprintf(ml, sizeof ml, "%zu\n", c->msgs_len);
  size_t n = dl + hl + c->msgs_len + c->len;
  char *body = malloc(n);
  if (!body) return;
  memcpy(body, c->desc, dl);
  memcpy(body + dl, ml, hl);
  if (c->msgs_len) memcpy(body + dl + hl, c->msgs, c->msgs_len);
  if (c->len) memcpy(body + dl + hl + c->msgs_len, c->buf, c->len);
  (void)!ms_cache_blob_put(&c->key, c->tag, NULL, body, n);
  free(body);
}

/* ---- an answer written to a file (-o) --------------------------------------------------------- */

static int answer_put_out(void *ctx, const char *p, size_t n) {
  cli_out_t *o = ctx;
  return n ? o->sink.write(o->sink.ctx, p, n) : MS_OK;
}

/* The blob's bytes: its description must be ours; then the answer goes to the output. */
static int answer_file_write(void *ctx, const char *p, size_t n) {
  void **x = ctx;
  cli_answer_t *c = x[0];
  answer_parts_t a;
  if (answer_split(c, p, n, &a) != MS_OK) return MS_ENOTFOUND;
  c->served = true;
  return answer_replay(&a, answer_put_out, x[1]);
}

int cli_answer_serve_file(cli_answer_t *c, const char *file, const char *out_path) {
  if (!c->on) return CLI_USAGE;
  cli_note_input(file);
  cli_out_t o;
  int rc = cli_out_open(&o, out_path);
  if (rc != CLI_OK) return rc;
  void *a[2] = {c, &o};
  ms_sink_t sink = {answer_file_write, a};
  int err = ms_cache_blob_get(&c->key, c->tag, NULL, &sink);
  if (err == MS_OK || c->served) answer_msgs_stop(c);
  if (err == MS_OK) return cli_out_commit(&o);
  if (c->served) return cli_out_fail(&o, err, NULL); /* the output's own error */
  cli_out_abort(&o);
  return CLI_USAGE;
}

static int answer_keep_write(void *ctx, const char *p, size_t n) {
  answer_keep(ctx, p, n);
  return MS_OK;
}

void cli_answer_capture(cli_answer_t *c) {
  if (c->on) cli_out_keep = (ms_sink_t){answer_keep_write, c};
}

void cli_answer_close(cli_answer_t *c, int rc, const ms_cache_key_t *loaded) {
  answer_msgs_stop(c);
  if (cli_out_keep.ctx == c) {
    cli_out_keep = (ms_sink_t){NULL, NULL};
    if (c->kept && !c->dropped && rc == CLI_OK && loaded) answer_store(c, loaded);
  }
  if (c->out) {
    bool whole = fclose(c->out) == 0 && !c->dropped;
    if (whole && rc == CLI_OK && loaded) answer_store(c, loaded);
  }
  free(c->buf);
  free(c->desc);
  free(c->msgs);
  memset(c, 0, sizeof *c);
}
