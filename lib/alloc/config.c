/* SPDX-License-Identifier: MIT
 * memsnap core: the allocator configuration (MEMSNAP_ALLOC_CONF), with the syntax, keys, limits
 * and re-parse resets of PyTorch's PYTORCH_CUDA_ALLOC_CONF, and the size-class formulas that
 * depend on it (docs/pytorch-allocator.md, "Configuration keys", "Sizes and rounding").
 *
 * The tokenizer is PyTorch's ([2025+] ConfigTokenizer): ',' ':' '[' ']' are one-character tokens,
 * any other run of non-whitespace characters is one token, whitespace separates tokens and is
 * dropped. Unlike PyTorch, which ignores the result of its separator checks, the parser below is
 * strict: every misplaced separator, missing value, malformed number and unknown key is an error
 * naming the key, the character offset of the offending token and what was expected.
 * Range errors use PyTorch's own message texts, so that they can be searched for.
 */
#include <locale.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/config.h"

/* ------------------------------------------------------------------------------------------ */
/* Defaults and size formulas                                                                  */

void ms_alloc_config_init(ms_alloc_config_t *c) {
  ms_assert(c != NULL);
  memset(c, 0, sizeof *c);
  c->max_split_size = SIZE_MAX;
  c->large_segment_size = MS_LARGE_BUFFER;
  c->max_non_split_rounding_size = MS_LARGE_BUFFER;
  c->garbage_collection_threshold = 0.0;
  c->per_process_memory_fraction = 1.0;
  c->pinned_num_register_threads = 1;
  c->last_allocator_settings[0] = '\0';
}

static bool config_is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

static unsigned config_floor_log2(uint64_t v) {
  return v == 0 ? 0u : 63u - (unsigned)__builtin_clzll((unsigned long long)v);
}

size_t ms_alloc_roundup_divisions_for(const ms_alloc_config_t *c, size_t size) {
  int idx = (int)config_floor_log2(size) - 20;
  if (idx < 0) idx = 0;
  if (idx > MS_ROUNDUP_POWER2_INTERVALS - 1) idx = MS_ROUNDUP_POWER2_INTERVALS - 1;
  return c->roundup_power2_divisions[idx];
}

/* PyTorch's roundup_power2_next_division; d is a power of two >= 2. Returns 0 on overflow. */
static size_t config_next_division(size_t size, size_t d) {
  if (config_is_pow2(size)) return size;
  size_t f = (size_t)1 << config_floor_log2(size);
  size_t step = f >> config_floor_log2(d);
  if (step == 0) return f > SIZE_MAX / 2 ? 0 : 2 * f;
  size_t lo = size & ~(step - 1);
  if (lo == size) return lo;
  return lo > SIZE_MAX - step ? 0 : lo + step;
}

size_t ms_alloc_round_size(const ms_alloc_config_t *c, size_t size) {
  if (size < MS_MIN_BLOCK_SIZE) return MS_MIN_BLOCK_SIZE;
  size_t d = ms_alloc_roundup_divisions_for(c, size);
  /* size > 512 * d, written so that it cannot overflow. */
  if (d > 1 && d <= SIZE_MAX / MS_MIN_BLOCK_SIZE && size > MS_MIN_BLOCK_SIZE * d)
    return config_next_division(size, d);
  if (size > SIZE_MAX - (MS_MIN_BLOCK_SIZE - 1)) return 0;
  return (size + MS_MIN_BLOCK_SIZE - 1) / MS_MIN_BLOCK_SIZE * MS_MIN_BLOCK_SIZE;
}

size_t ms_alloc_allocation_size(const ms_alloc_config_t *c, size_t rounded) {
  if (rounded <= MS_SMALL_SIZE) return MS_SMALL_BUFFER;
  if (rounded < MS_MIN_LARGE_ALLOC) return c->large_segment_size;
  if (rounded > SIZE_MAX - (MS_ROUND_LARGE - 1)) return 0;
  return (rounded + MS_ROUND_LARGE - 1) / MS_ROUND_LARGE * MS_ROUND_LARGE;
}

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                   */

typedef struct config_tok_s {
  const char *s; /* NULL at the end of the string */
  size_t len;
  size_t off; /* character offset in the whole string (the string's length at the end) */
} config_tok_t;

typedef struct config_lexer_s {
  const char *str;
  size_t pos;
} config_lexer_t;

static bool config_is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

static bool config_is_sep(char ch) { return ch == ',' || ch == ':' || ch == '[' || ch == ']'; }

static config_tok_t config_next(config_lexer_t *lx) {
  const char *s = lx->str;
  size_t i = lx->pos;
  while (s[i] != '\0' && config_is_space(s[i])) i++;
  config_tok_t t = {NULL, 0, i};
  if (s[i] == '\0') {
    lx->pos = i;
    return t;
  }
  t.s = s + i;
  if (config_is_sep(s[i])) {
    t.len = 1;
  } else {
    size_t j = i;
    while (s[j] != '\0' && !config_is_space(s[j]) && !config_is_sep(s[j])) j++;
    t.len = j - i;
  }
  lx->pos = i + t.len;
  return t;
}

static config_tok_t config_peek(const config_lexer_t *lx) {
  config_lexer_t copy = *lx;
  return config_next(&copy);
}

static bool config_tok_is(config_tok_t t, const char *word) {
  size_t n = strlen(word);
  return t.s != NULL && t.len == n && memcmp(t.s, word, n) == 0;
}

/* Quotes a token for a message: 'tok' (at most 40 characters, non-printable bytes as '?'), or
 * "end of string". */
static const char *config_quote(config_tok_t t, char *buf, size_t cap) {
  if (t.s == NULL) return "end of string";
  size_t n = t.len > 40 ? 40 : t.len;
  size_t k = 0;
  buf[k++] = '\'';
  for (size_t i = 0; i < n && k + 5 < cap; i++) {
    unsigned char ch = (unsigned char)t.s[i];
    buf[k++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
  }
  if (n < t.len && k + 5 < cap) {
    memcpy(buf + k, "...", 3);
    k += 3;
  }
  buf[k++] = '\'';
  buf[k] = '\0';
  return buf;
}

/* ------------------------------------------------------------------------------------------ */
/* Parser                                                                                      */

typedef struct config_parser_s {
  config_lexer_t lx;
  ms_errbuf_t *eb;
  char key[48]; /* the key being parsed, for messages */
} config_parser_t;

static int config_fail(config_parser_t *p, size_t off, const char *fmt, ...) MS_PRINTF(3, 4);

static int config_fail(config_parser_t *p, size_t off, const char *fmt, ...) {
  if (p->eb) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (p->key[0])
      ms__errbuf_set(p->eb, MS_ECONFIG, "key '%s' at offset %zu: %s", p->key, off, what);
    else
      ms__errbuf_set(p->eb, MS_ECONFIG, "at offset %zu: %s", off, what);
  }
  MS__TRACE_ERR(MS_ECONFIG);
  return MS_ECONFIG;
}

static int config_expect(config_parser_t *p, const char *sep, const char *what) {
  config_tok_t t = config_next(&p->lx);
  if (config_tok_is(t, sep)) return MS_OK;
  char q[64];
  return config_fail(p, t.off, "expected %s, got %s", what, config_quote(t, q, sizeof q));
}

/* Reads a non-negative decimal integer token (digits only) into *v. */
static int config_uint(config_parser_t *p, config_tok_t *out, uint64_t *v) {
  config_tok_t t = config_next(&p->lx);
  *out = t;
  char q[64];
  bool ok = t.s != NULL && t.len > 0;
  uint64_t x = 0;
  for (size_t i = 0; ok && i < t.len; i++) {
    char ch = t.s[i];
    if (ch < '0' || ch > '9') {
      ok = false;
      break;
    }
    unsigned digit = (unsigned)(ch - '0');
    if (x > (UINT64_MAX - digit) / 10) {
      return config_fail(p, t.off, "expected a non-negative integer of at most %llu, got %s",
                         (unsigned long long)UINT64_MAX, config_quote(t, q, sizeof q));
    }
    x = x * 10 + digit;
  }
  if (!ok)
    return config_fail(p, t.off, "expected a non-negative integer, got %s",
                       config_quote(t, q, sizeof q));
  *v = x;
  return MS_OK;
}

/* Reads a decimal floating-point token (C syntax, '.' as decimal point whatever the locale). */
static int config_double(config_parser_t *p, config_tok_t *out, double *v) {
  config_tok_t t = config_next(&p->lx);
  *out = t;
  char q[64];
  char buf[64];
  bool ok = t.s != NULL && t.len > 0 && t.len < sizeof buf;
  for (size_t i = 0; ok && i < t.len; i++) {
    char ch = t.s[i];
    if (!((ch >= '0' && ch <= '9') || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' ||
          ch == '-'))
      ok = false;
  }
  double x = 0;
  if (ok) {
    memcpy(buf, t.s, t.len);
    buf[t.len] = '\0';
    /* strtod follows LC_NUMERIC; the configuration syntax does not. */
    const char *dp = localeconv()->decimal_point;
    if (dp && dp[0] && dp[0] != '.' && dp[1] == '\0') {
      for (size_t i = 0; i < t.len; i++)
        if (buf[i] == '.') buf[i] = dp[0];
    }
    char *end = NULL;
    x = strtod(buf, &end);
    ok = end == buf + t.len && isfinite(x);
  }
  if (!ok)
    return config_fail(p, t.off, "expected a decimal number, got %s", config_quote(t, q, sizeof q));
  *v = x;
  return MS_OK;
}

static int config_bool(config_parser_t *p, bool *v) {
  config_tok_t t = config_next(&p->lx);
  if (config_tok_is(t, "True")) {
    *v = true;
    return MS_OK;
  }
  if (config_tok_is(t, "False")) {
    *v = false;
    return MS_OK;
  }
  char q[64];
  return config_fail(p, t.off, "expected 'True' or 'False', got %s", config_quote(t, q, sizeof q));
}

/* A size in MiB; values whose byte count does not fit in size_t are refused. */
static int config_mib(config_parser_t *p, config_tok_t *t, uint64_t *mib) {
  MS_FORWARD_IF_ERROR(config_uint(p, t, mib));
  if (*mib > SIZE_MAX / MS_MIB)
    return config_fail(p, t->off, "expected a size of at most %zu MiB, got %llu",
                       SIZE_MAX / MS_MIB, (unsigned long long)*mib);
  return MS_OK;
}

/* roundup_power2_divisions: a scalar power of two, or [k:v,...,>:v] ("Configuration keys", [2025+]
 * fill rule). */
static int config_divisions(config_parser_t *p, size_t div[MS_ROUNDUP_POWER2_INTERVALS]) {
  config_tok_t t = config_peek(&p->lx);
  uint64_t v;
  if (!config_tok_is(t, "[")) {
    MS_FORWARD_IF_ERROR(config_uint(p, &t, &v));
    if (!config_is_pow2(v))
      return config_fail(p, t.off, "For roundups, the divisions has to be power of 2, got %llu",
                         (unsigned long long)v);
    for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++) div[i] = (size_t)v;
    return MS_OK;
  }
  size_t open_off = t.off;
  (void)config_next(&p->lx);
  bool first = true;
  size_t last_index = 0;
  char q[64];
  for (;;) {
    config_tok_t k = config_next(&p->lx);
    if (k.s == NULL)
      return config_fail(p, open_off, "expected closing bracket ']' but reached end of config");
    if (config_tok_is(k, "]")) break;
    bool fill_rest = config_tok_is(k, ">");
    uint64_t boundary = 0;
    if (!fill_rest) {
      bool digits = k.len > 0;
      for (size_t i = 0; i < k.len; i++)
        if (k.s[i] < '0' || k.s[i] > '9') digits = false;
      if (!digits)
        return config_fail(p, k.off, "expected an interval start in MiB or '>', got %s",
                           config_quote(k, q, sizeof q));
      /* Re-read the key as a number, with the overflow check. */
      p->lx.pos = k.off;
      MS_FORWARD_IF_ERROR(config_uint(p, &k, &boundary));
      if (!config_is_pow2(boundary))
        return config_fail(p, k.off, "For roundups, the intervals have to be power of 2, got %llu",
                           (unsigned long long)boundary);
    }
    MS_FORWARD_IF_ERROR(config_expect(p, ":", "':' after the interval"));
    config_tok_t vt;
    MS_FORWARD_IF_ERROR(config_uint(p, &vt, &v));
    if (v != 0 && !config_is_pow2(v))
      return config_fail(p, vt.off,
                         "For roundups, the divisions has to be power of 2 or 0 to disable "
                         "roundup, got %llu",
                         (unsigned long long)v);
    if (fill_rest) {
      for (size_t i = last_index + 1; i < MS_ROUNDUP_POWER2_INTERVALS; i++) div[i] = (size_t)v;
    } else {
      size_t index = config_floor_log2(boundary);
      if (index > MS_ROUNDUP_POWER2_INTERVALS - 1) index = MS_ROUNDUP_POWER2_INTERVALS - 1;
      if (first) {
        for (size_t i = 0; i < index; i++) div[i] = (size_t)v;
        first = false;
      }
      div[index] = (size_t)v;
      last_index = index;
    }
    config_tok_t sep = config_next(&p->lx);
    if (config_tok_is(sep, "]")) break;
    if (sep.s == NULL)
      return config_fail(p, open_off, "expected closing bracket ']' but reached end of config");
    if (!config_tok_is(sep, ","))
      return config_fail(p, sep.off, "expected ',' or ']' in the list, got %s",
                         config_quote(sep, q, sizeof q));
  }
  return MS_OK;
}

/* Offsets of values whose limits depend on another key, checked after the whole string. */
typedef struct config_pending_s {
  bool has_split, has_nonsplit;
  uint64_t split_mib, nonsplit_mib;
  size_t split_off, nonsplit_off;
} config_pending_t;

#define MS_CONFIG_KEY_MAX 48
static const char config_key_list[] =
    "max_split_size_mb, max_non_split_rounding_mb, large_segment_size_mb, "
    "roundup_power2_divisions, garbage_collection_threshold, per_process_memory_fraction, "
    "expandable_segments, release_lock_on_cudamalloc, graph_capture_record_stream_reuse, backend, "
    "pinned_use_cuda_host_register, pinned_num_register_threads, pinned_use_background_threads, "
    "pinned_reserve_segment_size_mb";

/* The key of config_key_list nearest to t when it is a likely typo (one or two characters off,
 * by the optimal-string-alignment distance, as the CLI's "did you mean"); else NULL. */
static const char *config_suggest_key(config_tok_t t, char *buf, size_t cap) {
  enum { MAX = 48 };
  if (!t.s || t.len == 0 || t.len >= MAX) return NULL;
  size_t best = SIZE_MAX, limit = t.len <= 3 ? 1 : 2;
  const char *p = config_key_list;
  while (*p) {
    size_t m = strcspn(p, ",");
    if (m < MAX) {
      size_t d[MAX][MAX];
      for (size_t i = 0; i <= t.len; i++) d[i][0] = i;
      for (size_t j = 0; j <= m; j++) d[0][j] = j;
      for (size_t i = 1; i <= t.len; i++)
        for (size_t j = 1; j <= m; j++) {
          size_t v = d[i - 1][j - 1] + (t.s[i - 1] == p[j - 1] ? 0 : 1);
          if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
          if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
          if (i > 1 && j > 1 && t.s[i - 1] == p[j - 2] && t.s[i - 2] == p[j - 1] &&
              d[i - 2][j - 2] + 1 < v)
            v = d[i - 2][j - 2] + 1;
          d[i][j] = v;
        }
      if (d[t.len][m] < best && m < cap) {
        best = d[t.len][m];
        memcpy(buf, p, m);
        buf[m] = '\0';
      }
    }
    p += m;
    while (*p == ',' || *p == ' ') p++;
  }
  return best <= limit ? buf : NULL;
}

static int config_value(config_parser_t *p, config_tok_t key, ms_alloc_config_t *c,
                        config_pending_t *pend) {
  config_tok_t t;
  uint64_t u;
  double d;
  char q[64];
  if (config_tok_is(key, "max_split_size_mb")) {
    MS_FORWARD_IF_ERROR(config_uint(p, &t, &u));
    pend->has_split = true;
    pend->split_mib = u;
    pend->split_off = t.off;
  } else if (config_tok_is(key, "max_non_split_rounding_mb")) {
    MS_FORWARD_IF_ERROR(config_mib(p, &t, &u));
    pend->has_nonsplit = true;
    pend->nonsplit_mib = u;
    pend->nonsplit_off = t.off;
  } else if (config_tok_is(key, "large_segment_size_mb")) {
    MS_FORWARD_IF_ERROR(config_mib(p, &t, &u));
    if (u <= 10)
      return config_fail(p, t.off, "CachingAllocator option large_segment_size_mb must be > 10 MB");
    c->large_segment_size = (size_t)u * MS_MIB;
  } else if (config_tok_is(key, "roundup_power2_divisions")) {
    MS_FORWARD_IF_ERROR(config_divisions(p, c->roundup_power2_divisions));
  } else if (config_tok_is(key, "garbage_collection_threshold")) {
    MS_FORWARD_IF_ERROR(config_double(p, &t, &d));
    if (!(d > 0.0 && d < 1.0))
      return config_fail(p, t.off, "garbage_collect_threshold is invalid, set it in (0.0, 1.0)");
    c->garbage_collection_threshold = d;
  } else if (config_tok_is(key, "per_process_memory_fraction")) {
    MS_FORWARD_IF_ERROR(config_double(p, &t, &d));
    if (!(d >= 0.0 && d <= 1.0))
      return config_fail(p, t.off, "per_process_memory_fraction is invalid, set it in [0.0, 1.0]");
    c->per_process_memory_fraction = d;
  } else if (config_tok_is(key, "expandable_segments")) {
    MS_FORWARD_IF_ERROR(config_bool(p, &c->expandable_segments));
  } else if (config_tok_is(key, "release_lock_on_cudamalloc") ||
             config_tok_is(key, "release_lock_on_hipmalloc")) {
    MS_FORWARD_IF_ERROR(config_bool(p, &c->release_lock_on_cudamalloc));
  } else if (config_tok_is(key, "graph_capture_record_stream_reuse")) {
    MS_FORWARD_IF_ERROR(config_bool(p, &c->graph_capture_record_stream_reuse));
  } else if (config_tok_is(key, "backend")) {
    t = config_next(&p->lx);
    if (config_tok_is(t, "cudaMallocAsync") || config_tok_is(t, "hipMallocAsync"))
      return config_fail(p, t.off,
                         "backend %s is not supported: memsnap implements the native allocator "
                         "only (expected 'native')",
                         config_quote(t, q, sizeof q));
    if (!config_tok_is(t, "native"))
      return config_fail(p, t.off,
                         "Unknown allocator backend, options are native and cudaMallocAsync "
                         "(got %s)",
                         config_quote(t, q, sizeof q));
  } else if (config_tok_is(key, "pinned_use_cuda_host_register") ||
             config_tok_is(key, "pinned_use_hip_host_register")) {
    MS_FORWARD_IF_ERROR(config_bool(p, &c->pinned_use_cuda_host_register));
  } else if (config_tok_is(key, "pinned_num_register_threads")) {
    MS_FORWARD_IF_ERROR(config_uint(p, &t, &u));
    if (!config_is_pow2(u))
      return config_fail(p, t.off, "Number of register threads has to be power of 2, got %llu",
                         (unsigned long long)u);
    if (u > 128)
      return config_fail(p, t.off,
                         "Number of register threads should be less than or equal to 128, got %llu",
                         (unsigned long long)u);
    c->pinned_num_register_threads = (size_t)u;
  } else if (config_tok_is(key, "pinned_use_background_threads")) {
    MS_FORWARD_IF_ERROR(config_bool(p, &c->pinned_use_background_threads));
  } else if (config_tok_is(key, "pinned_reserve_segment_size_mb")) {
    MS_FORWARD_IF_ERROR(config_mib(p, &t, &u));
    if (u == 0) return config_fail(p, t.off, "Pinned reserve segment size has to be greater than 0");
    c->pinned_reserve_segment_size = (size_t)u * MS_MIB;
  } else {
    char near[MS_CONFIG_KEY_MAX];
    if (config_suggest_key(key, near, sizeof near))
      return config_fail(p, key.off, "unrecognized key; did you mean '%s'? expected one of: %s",
                         near, config_key_list);
    return config_fail(p, key.off, "unrecognized key, expected one of: %s", config_key_list);
  }
  return MS_OK;
}

int ms_alloc_config_parse(ms_alloc_config_t *c, const char *str, ms_errbuf_t *eb) {
  ms_assert(c != NULL && str != NULL);
  config_parser_t p = {{str, 0}, eb, {0}};
  size_t len = strlen(str);
  if (len > MS_ALLOC_CONF_MAX)
    return config_fail(&p, MS_ALLOC_CONF_MAX, "configuration string too long (%zu characters, "
                       "expected at most %d)", len, MS_ALLOC_CONF_MAX);

  /* PyTorch's re-parse resets ("Configuration keys"); other keys keep their values unless given. */
  ms_alloc_config_t tmp = *c;
  tmp.max_split_size = SIZE_MAX;
  tmp.garbage_collection_threshold = 0.0;
  memset(tmp.roundup_power2_divisions, 0, sizeof tmp.roundup_power2_divisions);
  config_pending_t pend = {0};
  char q[64];

  for (;;) {
    p.key[0] = '\0';
    config_tok_t key = config_next(&p.lx);
    if (key.s == NULL) break;
    if (config_is_sep(key.s[0]))
      return config_fail(&p, key.off, "expected a key, got %s", config_quote(key, q, sizeof q));
    size_t klen = key.len < sizeof p.key ? key.len : sizeof p.key - 1;
    for (size_t i = 0; i < klen; i++) {
      unsigned char ch = (unsigned char)key.s[i];
      p.key[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    p.key[klen] = '\0';
    MS_FORWARD_IF_ERROR(config_expect(&p, ":", "':' after the key"));
    MS_FORWARD_IF_ERROR(config_value(&p, key, &tmp, &pend));
    config_tok_t sep = config_next(&p.lx);
    if (sep.s == NULL) break;
    if (!config_tok_is(sep, ","))
      return config_fail(&p, sep.off, "expected ',' or the end of the string after the value, "
                         "got %s", config_quote(sep, q, sizeof q));
  }

  /* Limits that depend on large_segment_size, whose key may come later in the string (PyTorch
   * parses large_segment_size_mb in a first pass). */
  size_t lss_mib = tmp.large_segment_size / MS_MIB;
  if (pend.has_split) {
    snprintf(p.key, sizeof p.key, "%s", "max_split_size_mb");
    if (pend.split_mib < lss_mib)
      return config_fail(&p, pend.split_off,
                         "CachingAllocator option max_split_size_mb too small, must be >= %zu",
                         lss_mib);
    uint64_t mib = pend.split_mib > SIZE_MAX / MS_MIB ? SIZE_MAX / MS_MIB : pend.split_mib;
    tmp.max_split_size = (size_t)mib * MS_MIB;
  }
  if (pend.has_nonsplit) {
    snprintf(p.key, sizeof p.key, "%s", "max_non_split_rounding_mb");
    if (pend.nonsplit_mib < lss_mib)
      return config_fail(&p, pend.nonsplit_off,
                         "CachingAllocator option max_non_split_rounding_mb too small, must be "
                         ">= %zu",
                         lss_mib);
    tmp.max_non_split_rounding_size = (size_t)pend.nonsplit_mib * MS_MIB;
  } else {
    tmp.max_non_split_rounding_size = tmp.large_segment_size;
  }
  memcpy(tmp.last_allocator_settings, str, len + 1);
  *c = tmp;
  return MS_OK;
}

int ms_alloc_config_from_env(ms_alloc_config_t *c, ms_errbuf_t *eb) {
  const char *s = getenv(MS_ALLOC_CONF_ENV);
  if (s == NULL) return MS_OK;
  ms_errbuf_t local;
  local.msg[0] = '\0';
  int rc = ms_alloc_config_parse(c, s, &local);
  if (rc != MS_OK) ms__errbuf_set(eb, rc, "%s: %s", MS_ALLOC_CONF_ENV, local.msg);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Validation and the canonical string                                                         */

int ms_alloc_config_validate(const ms_alloc_config_t *c, ms_errbuf_t *eb) {
  if (c == NULL) return ms__errbuf_set(eb, MS_EINVAL, "no configuration");
  if (c->large_segment_size <= 10 * MS_MIB)
    return ms__errbuf_set(eb, MS_ECONFIG, "large_segment_size is %zu bytes, expected > 10 MiB",
                          c->large_segment_size);
  if (c->max_split_size < c->large_segment_size)
    return ms__errbuf_set(eb, MS_ECONFIG,
                          "max_split_size is %zu bytes, expected >= large_segment_size (%zu)",
                          c->max_split_size, c->large_segment_size);
  if (c->max_non_split_rounding_size < c->large_segment_size)
    return ms__errbuf_set(eb, MS_ECONFIG,
                          "max_non_split_rounding_size is %zu bytes, expected >= "
                          "large_segment_size (%zu)",
                          c->max_non_split_rounding_size, c->large_segment_size);
  for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++) {
    size_t d = c->roundup_power2_divisions[i];
    if (d != 0 && !config_is_pow2(d))
      return ms__errbuf_set(eb, MS_ECONFIG,
                            "roundup_power2_divisions[%d] is %zu, expected 0 or a power of 2", i, d);
  }
  double g = c->garbage_collection_threshold;
  if (!(g == 0.0 || (g > 0.0 && g < 1.0)))
    return ms__errbuf_set(eb, MS_ECONFIG,
                          "garbage_collection_threshold is %g, expected 0 (off) or in (0.0, 1.0)",
                          g);
  double f = c->per_process_memory_fraction;
  if (!(f >= 0.0 && f <= 1.0))
    return ms__errbuf_set(eb, MS_ECONFIG,
                          "per_process_memory_fraction is %g, expected in [0.0, 1.0]", f);
  size_t n = c->pinned_num_register_threads;
  if (!config_is_pow2(n) || n > 128)
    return ms__errbuf_set(eb, MS_ECONFIG,
                          "pinned_num_register_threads is %zu, expected a power of 2 <= 128", n);
  if (memchr(c->last_allocator_settings, '\0', sizeof c->last_allocator_settings) == NULL)
    return ms__errbuf_set(eb, MS_ECONFIG, "last_allocator_settings is not NUL-terminated");
  return MS_OK;
}

typedef struct config_out_s {
  char buf[2048];
  size_t len;
  bool first;
} config_out_t;

static void config_put(config_out_t *o, const char *fmt, ...) MS_PRINTF(2, 3);

static void config_put(config_out_t *o, const char *fmt, ...) {
  if (o->len >= sizeof o->buf) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(o->buf + o->len, sizeof o->buf - o->len, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  o->len += (size_t)n;
  if (o->len > sizeof o->buf) o->len = sizeof o->buf;
}

static void config_put_key(config_out_t *o, const char *key) {
  config_put(o, "%s%s:", o->first ? "" : ",", key);
  o->first = false;
}

/* Shortest "%g" form that reads back as the same double, with '.' whatever the locale. */
static void config_put_double(config_out_t *o, double v) {
  char tmp[64];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (strtod(tmp, NULL) == v) break;
  }
  const char *dp = localeconv()->decimal_point;
  if (dp && dp[0] && dp[0] != '.' && dp[1] == '\0') {
    for (char *s = tmp; *s; s++)
      if (*s == dp[0]) *s = '.';
  }
  config_put(o, "%s", tmp);
}

int ms_alloc_config_format(const ms_alloc_config_t *c, char *dst, size_t cap) {
  if (dst && cap) dst[0] = '\0';
  MS_RETURN_IF(c == NULL || dst == NULL, MS_EINVAL);
  MS_RETURN_IF(ms_alloc_config_validate(c, NULL) != MS_OK, MS_EINVAL);
  ms_alloc_config_t def;
  ms_alloc_config_init(&def);
  MS_RETURN_IF(c->large_segment_size % MS_MIB != 0, MS_EINVAL);
  MS_RETURN_IF(c->max_non_split_rounding_size % MS_MIB != 0, MS_EINVAL);
  MS_RETURN_IF(c->pinned_reserve_segment_size % MS_MIB != 0, MS_EINVAL);
  /* An unlimited max_split_size is written by leaving the key out; a finite one is in MiB. The
   * largest whole number of MiB stands for itself, not for "unlimited". */
  MS_RETURN_IF(c->max_split_size != SIZE_MAX && c->max_split_size % MS_MIB != 0, MS_EINVAL);

  config_out_t o;
  o.len = 0;
  o.first = true;
  o.buf[0] = '\0';
  if (c->max_split_size != SIZE_MAX) {
    config_put_key(&o, "max_split_size_mb");
    config_put(&o, "%zu", c->max_split_size / MS_MIB);
  }
  if (c->max_non_split_rounding_size != c->large_segment_size) {
    config_put_key(&o, "max_non_split_rounding_mb");
    config_put(&o, "%zu", c->max_non_split_rounding_size / MS_MIB);
  }
  if (c->large_segment_size != def.large_segment_size) {
    config_put_key(&o, "large_segment_size_mb");
    config_put(&o, "%zu", c->large_segment_size / MS_MIB);
  }
  bool all_equal = true, all_zero = true;
  for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++) {
    if (c->roundup_power2_divisions[i] != c->roundup_power2_divisions[0]) all_equal = false;
    if (c->roundup_power2_divisions[i] != 0) all_zero = false;
  }
  if (!all_zero) {
    config_put_key(&o, "roundup_power2_divisions");
    if (all_equal) {
      config_put(&o, "%zu", c->roundup_power2_divisions[0]);
    } else {
      for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++)
        config_put(&o, "%s%zu:%zu", i == 0 ? "[" : ",", (size_t)1 << i,
                   c->roundup_power2_divisions[i]);
      config_put(&o, "]");
    }
  }
  if (c->garbage_collection_threshold != def.garbage_collection_threshold) {
    config_put_key(&o, "garbage_collection_threshold");
    config_put_double(&o, c->garbage_collection_threshold);
  }
  if (c->per_process_memory_fraction != def.per_process_memory_fraction) {
    config_put_key(&o, "per_process_memory_fraction");
    config_put_double(&o, c->per_process_memory_fraction);
  }
  if (c->expandable_segments) {
    config_put_key(&o, "expandable_segments");
    config_put(&o, "True");
  }
  if (c->release_lock_on_cudamalloc) {
    config_put_key(&o, "release_lock_on_cudamalloc");
    config_put(&o, "True");
  }
  if (c->graph_capture_record_stream_reuse) {
    config_put_key(&o, "graph_capture_record_stream_reuse");
    config_put(&o, "True");
  }
  if (c->pinned_use_cuda_host_register) {
    config_put_key(&o, "pinned_use_cuda_host_register");
    config_put(&o, "True");
  }
  if (c->pinned_num_register_threads != def.pinned_num_register_threads) {
    config_put_key(&o, "pinned_num_register_threads");
    config_put(&o, "%zu", c->pinned_num_register_threads);
  }
  if (c->pinned_use_background_threads) {
    config_put_key(&o, "pinned_use_background_threads");
    config_put(&o, "True");
  }
  if (c->pinned_reserve_segment_size != 0) {
    config_put_key(&o, "pinned_reserve_segment_size_mb");
    config_put(&o, "%zu", c->pinned_reserve_segment_size / MS_MIB);
  }
  if (o.len >= sizeof o.buf || o.len + 1 > cap) return MS_ELIMIT;
  memcpy(dst, o.buf, o.len + 1);
  return (int)o.len;
}
