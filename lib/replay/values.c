/* SPDX-License-Identifier: MIT
 * memsnap core: the values `memsnap replay` takes on its command line, parsed here rather than in
 * the CLI so that they are tested and fuzzed as a library (tests/fuzz/fuzz_cli_values.c):
 * --capacity SIZE (ms_replay_parse_capacity) and --sweep SPEC (ms_replay_sweep_parse).
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/replay.h"

/* ---- --capacity ------------------------------------------------------------------------------ */

int ms_replay_parse_capacity(const char *s, size_t *out, ms_errbuf_t *eb) {
  static const char grammar[] = "digits with an optional K, M, G or T";
  if (!s || !out) return ms__errbuf_set(eb, MS_EINVAL, "no size");
  if (!isdigit((unsigned char)*s))
    return ms__errbuf_set(eb, MS_EINVAL, "expected %s at offset 0", grammar);
  /* The whole part exactly (a double would round 2^53 + 1), the fraction as a double. */
  const char *q = s;
  uint64_t whole = 0;
  bool big = false;
  for (; isdigit((unsigned char)*q); q++) {
    unsigned d = (unsigned)(*q - '0');
    if (whole > (UINT64_MAX - d) / 10)
      big = true;
    else
      whole = whole * 10 + d;
  }
  const char *frac = NULL;
  if (*q == '.') {
    if (!isdigit((unsigned char)q[1]))
      return ms__errbuf_set(eb, MS_EINVAL, "expected a digit after the point at offset %zu",
                            (size_t)(q + 1 - s));
    frac = q;
    for (q++; isdigit((unsigned char)*q); q++) {
    }
  }
  static const char units[] = "KMGT"; /* powers of 1024 */
  const char *u = *q ? strchr(units, toupper((unsigned char)*q)) : NULL;
  unsigned shift = u ? 10u * (unsigned)(u - units + 1) : 0;
  if (u) q++;
  if (shift && (q[0] == 'i' || q[0] == 'I') && (q[1] == 'B' || q[1] == 'b'))
    q += 2;
  else if (q[0] == 'B' || q[0] == 'b')
    q++;
  if (*q)
    return ms__errbuf_set(eb, MS_EINVAL, "expected %s at offset %zu", grammar, (size_t)(q - s));
  if (big || (shift && whole > (UINT64_MAX >> shift)))
    return ms__errbuf_set(eb, MS_ELIMIT, "%s is 2^64 bytes or more", s);
  uint64_t v = whole << shift;
  if (frac) {
    /* strtod stops at the unit; the fraction is < 1, so its share is < 2^shift. */
    uint64_t part = (uint64_t)(strtod(frac, NULL) * (double)(UINT64_C(1) << shift));
    if (part > UINT64_MAX - v) return ms__errbuf_set(eb, MS_ELIMIT, "%s is 2^64 bytes or more", s);
    v += part;
  }
  if (v == 0) return ms__errbuf_set(eb, MS_EINVAL, "%s is less than one byte", s);
  if (v > SIZE_MAX) return ms__errbuf_set(eb, MS_ELIMIT, "%s does not fit in size_t", s);
  *out = (size_t)v;
  return MS_OK;
}

/* ---- --sweep --------------------------------------------------------------------------------- */

enum { SWEEP_MAXK = 8, SWEEP_MAXV = 32, SWEEP_MAX_ROWS = 256, SWEEP_MAX_LEN = 1023 };

/* The next separator sep of s outside brackets (a value such as [256:1,>:4] holds commas), or
 * NULL; an unbalanced bracket sets *bad. */
static char *sweep_split(char *s, char sep, bool *bad) {
  int depth = 0;
  for (; *s; s++) {
    if (*s == '[')
      depth++;
    else if (*s == ']' && --depth < 0)
      break;
    else if (*s == sep && depth == 0)
      return s;
  }
  if (depth != 0) *bad = true;
  return NULL;
}

typedef struct sweep_grid_s {
  char *keys[SWEEP_MAXK];
  char *vals[SWEEP_MAXK][SWEEP_MAXV];
  size_t nv[SWEEP_MAXK];
  size_t nk;
} sweep_grid_t;

static const char sweep_expected[] = "expected 'key=v1,v2;key2=v3,...'";

/* Splits one `key=v1,v2` part (cut in place) into g. @return MS_OK or an error in eb. */
static int sweep_part(sweep_grid_t *g, char *part, ms_errbuf_t *eb) {
  char *eq = strchr(part, '=');
  if (!eq || eq == part) return ms__errbuf_set(eb, MS_EINVAL, "%s", sweep_expected);
  if (g->nk == SWEEP_MAXK)
    return ms__errbuf_set(eb, MS_ELIMIT, "more than %d keys", (int)SWEEP_MAXK);
  *eq = 0;
  for (size_t i = 0; i < g->nk; i++)
    if (strcmp(g->keys[i], part) == 0)
      return ms__errbuf_set(eb, MS_EINVAL, "key '%s' appears twice (list its values once: %s=a,b)",
                            part, part);
  size_t k = g->nk;
  g->keys[k] = part;
  g->nv[k] = 0;
  bool bad = false;
  for (char *v = eq + 1, *comma; v; v = comma ? comma + 1 : NULL) {
    comma = sweep_split(v, ',', &bad);
    if (bad)
      return ms__errbuf_set(eb, MS_EINVAL, "unbalanced brackets in the values of '%s'", part);
    if (comma) *comma = 0;
    if (!*v) return ms__errbuf_set(eb, MS_EINVAL, "%s", sweep_expected);
    if (g->nv[k] == SWEEP_MAXV)
      return ms__errbuf_set(eb, MS_ELIMIT, "more than %d values for '%s'", (int)SWEEP_MAXV, part);
    g->vals[k][g->nv[k]++] = v;
  }
  g->nk++;
  return MS_OK;
}

void ms_replay_sweep_release(ms_replay_sweep_t *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++)
    free(s->configs[i]);
  free(s->configs);
  s->configs = NULL;
  s->n = 0;
}

/* Writes every combination of g into out, the first key varying slowest. */
static int sweep_rows(const sweep_grid_t *g, size_t total, ms_replay_sweep_t *out,
                      ms_errbuf_t *eb) {
  ms_replay_sweep_t s = {0, calloc(total, sizeof(char *))};
  if (!s.configs) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  for (size_t r = 0; r < total; r++) {
    size_t idx[SWEEP_MAXK], rem = r, len = 0;
    for (size_t i = g->nk; i-- > 0;) {
      idx[i] = rem % g->nv[i];
      rem /= g->nv[i];
    }
    for (size_t i = 0; i < g->nk; i++)
      len += strlen(g->keys[i]) + 2 + strlen(g->vals[i][idx[i]]);
    char *c = malloc(len);
    if (!c) {
      ms_replay_sweep_release(&s);
      return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
    }
    size_t at = 0;
    for (size_t i = 0; i < g->nk; i++)
      at += (size_t)snprintf(c + at, len - at, "%s%s:%s", i ? "," : "", g->keys[i],
                             g->vals[i][idx[i]]);
    s.configs[s.n++] = c;
  }
  *out = s;
  return MS_OK;
}

int ms_replay_sweep_parse(const char *spec, ms_replay_sweep_t *out, ms_errbuf_t *eb) {
  if (!spec || !out) return ms__errbuf_set(eb, MS_EINVAL, "no sweep");
  size_t n = strlen(spec);
  if (n > SWEEP_MAX_LEN)
    return ms__errbuf_set(eb, MS_ELIMIT, "%zu bytes (at most %d)", n, (int)SWEEP_MAX_LEN);
  char buf[SWEEP_MAX_LEN + 1];
  memcpy(buf, spec, n + 1);
  sweep_grid_t g;
  g.nk = 0;
  bool bad = false;
  for (char *part = buf, *semi; part; part = semi ? semi + 1 : NULL) {
    semi = sweep_split(part, ';', &bad);
    if (bad) return ms__errbuf_set(eb, MS_EINVAL, "unbalanced brackets");
    if (semi) *semi = 0;
    while (*part == ' ')
      part++;
    if (!*part) continue;
    MS_FORWARD_IF_ERROR(sweep_part(&g, part, eb));
  }
  if (!g.nk) return ms__errbuf_set(eb, MS_EINVAL, "%s", sweep_expected);
  size_t total = 1;
  for (size_t i = 0; i < g.nk; i++)
    total *= g.nv[i]; /* at most 32^8 */
  if (total > SWEEP_MAX_ROWS)
    return ms__errbuf_set(eb, MS_ELIMIT, "%zu combinations (at most %d)", total,
                          (int)SWEEP_MAX_ROWS);
  return sweep_rows(&g, total, out, eb);
}
