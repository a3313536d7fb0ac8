/* SPDX-License-Identifier: MIT
 * memsnap core: allocator statistics (docs/pytorch-allocator.md, "Statistics"): initialisation,
 * PyTorch's resets, merge, the flat key view of torch.cuda.memory_stats(), memory_summary()'s
 * table and the amount formatters. Everything that walks the fields is generated from
 * MS_STAT_FIELDS, so the struct, the resets, the keys and the printer cannot disagree.
 * The hot-path updates are inline in stats_internal.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "alloc/stats_internal.h"

void ms_stats_init(ms_stats_t *st) {
  ms_assert(st != NULL);
  memset(st, 0, sizeof *st);
  st->size = sizeof *st;
  st->version = MS_STATS_VERSION;
}

int ms_stats_check(const ms_stats_t *st) {
  MS_RETURN_IF(st == NULL, MS_EINVAL);
  MS_RETURN_IF(st->size != sizeof(ms_stats_t) || st->version != MS_STATS_VERSION, MS_EVERSION);
  return MS_OK;
}

static void stats_reset_peak_one(ms_stat_t *s) { s->peak = s->current; }

static void stats_reset_accumulated_one(ms_stat_t *s) {
  s->allocated = 0;
  s->freed = 0;
}

#define STATS_RESET_PEAK_ARRAY(name)                                                         \
  for (int i = 0; i < MS_STAT_NUM_TYPES; i++) stats_reset_peak_one(&st->name[i]);
#define STATS_RESET_PEAK_STAT(name) stats_reset_peak_one(&st->name);
#define STATS_RESET_PEAK_COUNTER(name)
#define STATS_RESET_PEAK(kind, name) STATS_RESET_PEAK_##kind(name)

void ms_stats_reset_peak(ms_stats_t *st) {
  ms_assert(st != NULL);
  MS_STAT_FIELDS(STATS_RESET_PEAK)
}

#define STATS_RESET_ACC_ARRAY(name)                                                          \
  for (int i = 0; i < MS_STAT_NUM_TYPES; i++) stats_reset_accumulated_one(&st->name[i]);
#define STATS_RESET_ACC_STAT(name) stats_reset_accumulated_one(&st->name);
#define STATS_RESET_ACC_COUNTER(name)
#define STATS_RESET_ACC(kind, name) STATS_RESET_ACC_##kind(name)

void ms_stats_reset_accumulated(ms_stats_t *st) {
  ms_assert(st != NULL);
  MS_STAT_FIELDS(STATS_RESET_ACC)
  /* Every counter except the max_split_size setting (PyTorch's resetAccumulatedStats). */
  st->num_alloc_retries = 0;
  st->num_ooms = 0;
  st->num_sync_all_streams = 0;
  st->num_device_alloc = 0;
  st->num_device_free = 0;
}

static void stats_merge_one(ms_stat_t *d, const ms_stat_t *s) {
  d->current += s->current;
  d->peak += s->peak;
  d->allocated += s->allocated;
  d->freed += s->freed;
}

#define STATS_MERGE_ARRAY(name)                                                              \
  for (int i = 0; i < MS_STAT_NUM_TYPES; i++) stats_merge_one(&dst->name[i], &src->name[i]);
#define STATS_MERGE_STAT(name) stats_merge_one(&dst->name, &src->name);
#define STATS_MERGE_COUNTER(name) dst->name += src->name;
#define STATS_MERGE(kind, name) STATS_MERGE_##kind(name)

void ms_stats_merge(ms_stats_t *dst, const ms_stats_t *src) {
  ms_assert(dst != NULL && src != NULL);
  int64_t split = dst->max_split_size != 0 ? dst->max_split_size : src->max_split_size;
  MS_STAT_FIELDS(STATS_MERGE)
  dst->max_split_size = split;
}

/* ------------------------------------------------------------------------------------------ */
/* The flat key view                                                                           */

typedef struct stats_key_s {
  const char *name;
  size_t offset; /* of the int64_t in ms_stats_t */
} stats_key_t;

#define STATS_KEY(name, member) {name, offsetof(ms_stats_t, member)},
#define STATS_KEYS_GAUGE(prefix, member)                                                     \
  STATS_KEY(prefix ".current", member.current)                                               \
  STATS_KEY(prefix ".peak", member.peak)                                                     \
  STATS_KEY(prefix ".allocated", member.allocated)                                           \
  STATS_KEY(prefix ".freed", member.freed)
#define STATS_KEYS_ARRAY(name)                                                               \
  STATS_KEYS_GAUGE(#name ".all", name[MS_STAT_ALL])                                          \
  STATS_KEYS_GAUGE(#name ".small_pool", name[MS_STAT_SMALL_POOL])                            \
  STATS_KEYS_GAUGE(#name ".large_pool", name[MS_STAT_LARGE_POOL])
#define STATS_KEYS_STAT(name) STATS_KEYS_GAUGE(#name, name)
#define STATS_KEYS_COUNTER(name) STATS_KEY(#name, name)
#define STATS_KEYS(kind, name) STATS_KEYS_##kind(name)

/* In declaration order; ms_stats_flat sorts. */
static const stats_key_t stats_keys[] = {MS_STAT_FIELDS(STATS_KEYS)};

_Static_assert(sizeof stats_keys / sizeof stats_keys[0] == MS_STATS_NKEYS,
               "MS_STATS_NKEYS must match MS_STAT_FIELDS");

static int64_t stats_value_at(const ms_stats_t *st, size_t offset) {
  int64_t v;
  memcpy(&v, (const char *)st + offset, sizeof v);
  return v;
}

static int stats_kv_cmp(const void *a, const void *b) {
  return strcmp(((const ms_stat_kv_t *)a)->name, ((const ms_stat_kv_t *)b)->name);
}

int ms_stats_flat(const ms_stats_t *st, ms_stat_kv_t *out, size_t cap, size_t *n) {
  MS_RETURN_IF(st == NULL || out == NULL || n == NULL, MS_EINVAL);
  MS_RETURN_IF(cap < MS_STATS_NKEYS, MS_ELIMIT);
  for (size_t i = 0; i < MS_STATS_NKEYS; i++) {
    out[i].name = stats_keys[i].name;
    out[i].value = stats_value_at(st, stats_keys[i].offset);
  }
  qsort(out, MS_STATS_NKEYS, sizeof *out, stats_kv_cmp);
  *n = MS_STATS_NKEYS;
  return MS_OK;
}

int ms_stats_get(const ms_stats_t *st, const char *name, int64_t *value) {
  MS_RETURN_IF(st == NULL || name == NULL || value == NULL, MS_EINVAL);
  for (size_t i = 0; i < MS_STATS_NKEYS; i++) {
    if (strcmp(stats_keys[i].name, name) == 0) {
      *value = stats_value_at(st, stats_keys[i].offset);
      return MS_OK;
    }
  }
  return MS_ENOTFOUND;
}

/* ------------------------------------------------------------------------------------------ */
/* Amount formatters                                                                           */

static int stats_finish(int n, size_t cap) {
  if (n < 0) return MS_EINVAL;
  return (size_t)n >= cap ? MS_ELIMIT : n;
}

static int stats_format_size_double(double v, char *dst, size_t cap) {
  static const char *const units[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (v > -1024.0 && v < 1024.0) return stats_finish(snprintf(dst, cap, "%.1f%sB", v, units[i]), cap);
    v /= 1024.0;
  }
  return stats_finish(snprintf(dst, cap, "%.1fYiB", v), cap);
}

int ms_format_size(uint64_t bytes, char *dst, size_t cap) {
  MS_RETURN_IF(dst == NULL || cap == 0, MS_EINVAL);
  return stats_format_size_double((double)bytes, dst, cap);
}

int ms_format_size_signed(int64_t bytes, char *dst, size_t cap) {
  MS_RETURN_IF(dst == NULL || cap == 0, MS_EINVAL);
  return stats_format_size_double((double)bytes, dst, cap);
}

/* Python's floor division by a positive divisor. */
static int64_t stats_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && (a < 0)) q -= 1;
  return q;
}

int ms_format_size_cell(int64_t value, int64_t pref, char *dst, size_t cap) {
  MS_RETURN_IF(dst == NULL || cap == 0, MS_EINVAL);
  static const char *const units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  /* pref_sz /= 1024 is a true (float) division in PyTorch. */
  double p = (double)pref;
  size_t u = 0;
  while (u + 1 < sizeof units / sizeof units[0] && !(p < 768.0 * 1024.0)) {
    u++;
    value = stats_floordiv(value, 1024);
    p /= 1024.0;
  }
  return stats_finish(snprintf(dst, cap, "%6lld %s", (long long)value, units[u]), cap);
}

int ms_format_count_cell(int64_t value, int64_t pref, char *dst, size_t cap) {
  MS_RETURN_IF(dst == NULL || cap == 0, MS_EINVAL);
  static const char *const units[] = {" ", "K", "M"};
  double p = (double)pref;
  size_t u = 0;
  while (u + 1 < sizeof units / sizeof units[0] && !(p < 750.0 * 1000.0)) {
    u++;
    value = stats_floordiv(value, 1000);
    p /= 1000.0;
  }
  return stats_finish(snprintf(dst, cap, "%7lld %s ", (long long)value, units[u]), cap);
}

/* ------------------------------------------------------------------------------------------ */
/* memory_summary                                                                              */

typedef struct stats_text_s {
  char *buf;
  size_t len, cap;
  bool failed;
} stats_text_t;

static void stats_text_put(stats_text_t *t, const char *fmt, ...) MS_PRINTF(2, 3);

static void stats_text_put(stats_text_t *t, const char *fmt, ...) {
  if (t->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = true;
      return;
    }
    if ((size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    size_t ncap = t->cap * 2 + (size_t)n;
    char *nb = realloc(t->buf, ncap);
    if (nb == NULL) {
      t->failed = true;
      return;
    }
    t->buf = nb;
    t->cap = ncap;
  }
}

/* One table line: "|" + content + "|\n". */
#define STATS_RULE_EQ "==========================================================================="
#define STATS_RULE_DASH "---------------------------------------------------------------------------"

typedef int stats_cell_fn(int64_t value, int64_t pref, char *dst, size_t cap);

static void stats_summary_row(stats_text_t *t, const char *name, const ms_stat_t *s,
                              const ms_stat_t *pref, stats_cell_fn *cell) {
  char c[4][48];
  (void)cell(s->current, pref->current, c[0], sizeof c[0]);
  (void)cell(s->peak, pref->peak, c[1], sizeof c[1]);
  (void)cell(s->allocated, pref->allocated, c[2], sizeof c[2]);
  (void)cell(s->freed, pref->freed, c[3], sizeof c[3]);
  stats_text_put(t, "| %-21s | %s | %s | %s | %s |\n", name, c[0], c[1], c[2], c[3]);
}

static void stats_summary_metric(stats_text_t *t, const char *name, const ms_stat_t arr[3],
                                 bool abbreviated, stats_cell_fn *cell) {
  stats_text_put(t, "|%s|\n", STATS_RULE_DASH);
  stats_summary_row(t, name, &arr[MS_STAT_ALL], &arr[MS_STAT_ALL], cell);
  if (!abbreviated) {
    stats_summary_row(t, "      from large pool", &arr[MS_STAT_LARGE_POOL], &arr[MS_STAT_ALL], cell);
    stats_summary_row(t, "      from small pool", &arr[MS_STAT_SMALL_POOL], &arr[MS_STAT_ALL], cell);
  }
}

int ms_stats_memory_summary(const ms_stats_t *st, int device, bool abbreviated, char **out) {
  MS_RETURN_IF(st == NULL || out == NULL, MS_EINVAL);
  stats_text_t t = {NULL, 0, 4096, false};
  t.buf = malloc(t.cap);
  MS_RETURN_IF(t.buf == NULL, MS_ENOMEM);
  t.buf[0] = '\0';

  /* Header: PyTorch's templates " {_:16} PyTorch CUDA memory summary, device ID {device:<17d} "
   * and "  {_:9} CUDA OOMs: {num_ooms:<12d} | {_:6} cudaMalloc retries: {num_alloc_retries:<8d}  "
   * with _ = "" (so 16, 9 and 6 spaces). */
  stats_text_put(&t, "|%s|\n", STATS_RULE_EQ);
  stats_text_put(&t, "| %16s PyTorch CUDA memory summary, device ID %-17d |\n", "", device);
  stats_text_put(&t, "|%s|\n", STATS_RULE_DASH);
  stats_text_put(&t, "|  %9s CUDA OOMs: %-12lld | %6s cudaMalloc retries: %-8lld  |\n", "",
                 (long long)st->num_ooms, "", (long long)st->num_alloc_retries);
  stats_text_put(&t, "|%s|\n", STATS_RULE_EQ);
  stats_text_put(&t, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n");

  stats_summary_metric(&t, "Allocated memory", st->allocated_bytes, abbreviated, ms_format_size_cell);
  stats_summary_metric(&t, "Active memory", st->active_bytes, abbreviated, ms_format_size_cell);
  stats_summary_metric(&t, "Requested memory", st->requested_bytes, abbreviated,
                       ms_format_size_cell);
  stats_summary_metric(&t, "GPU reserved memory", st->reserved_bytes, abbreviated,
                       ms_format_size_cell);
  stats_summary_metric(&t, "Non-releasable memory", st->inactive_split_bytes, abbreviated,
                       ms_format_size_cell);
  stats_summary_metric(&t, "Allocations", st->allocation, abbreviated, ms_format_count_cell);
  stats_summary_metric(&t, "Active allocs", st->active, abbreviated, ms_format_count_cell);
  stats_summary_metric(&t, "GPU reserved segments", st->segment, abbreviated, ms_format_count_cell);
  stats_summary_metric(&t, "Non-releasable allocs", st->inactive_split, abbreviated,
                       ms_format_count_cell);

  stats_text_put(&t, "|%s|\n", STATS_RULE_DASH);
  stats_summary_row(&t, "Oversize allocations", &st->oversize_allocations,
                    &st->oversize_allocations, ms_format_count_cell);
  stats_text_put(&t, "|%s|\n", STATS_RULE_DASH);
  stats_summary_row(&t, "Oversize GPU segments", &st->oversize_segments, &st->oversize_segments,
                    ms_format_count_cell);
  stats_text_put(&t, "|%s|\n", STATS_RULE_EQ);

  if (t.failed) {
    free(t.buf);
    MS__TRACE_ERR(MS_ENOMEM);
    return MS_ENOMEM;
  }
  *out = t.buf;
  return MS_OK;
}

void ms_stats_text_free(char *text) { free(text); }
