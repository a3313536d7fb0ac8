/* SPDX-License-Identifier: MIT
 * memsnap core: the memory gate (memsnap/compare.h, docs/compare.md): limits parsed and held, and
 * a snapshot's named figures, as recorded or replayed through a fresh allocator.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "explain/compare_internal.h"
#include "memsnap/replay.h"

/* In ms_gate_figure order; the categories' as ms_category_name() spells them (the figures test
 * checks that they agree). */
static const char *const gate_names[MS_FIG_COUNT] = {
    "peak_reserved",        "peak_allocated",       "peak_requested",
    "unallocated_at_peak_reserved",                 "device_mallocs",
    "device_frees",         "alloc_retries",        "ooms",
    "final_reserved",       "final_allocated",      "peak_parameter",
    "peak_optimizer_state", "peak_input",           "peak_temporary",
    "peak_activation",      "peak_gradient",        "peak_autograd_detail",
    "peak_unknown"};

const char *ms_gate_figure_name(ms_gate_figure f) {
  return (int)f >= 0 && f < MS_FIG_COUNT ? gate_names[f] : "?";
}

bool ms_gate_figure_is_bytes(ms_gate_figure f) {
  return !(f == MS_FIG_DEVICE_MALLOCS || f == MS_FIG_DEVICE_FREES || f == MS_FIG_ALLOC_RETRIES ||
           f == MS_FIG_OOMS);
}

void ms_gate_options_init(ms_gate_options_t *o) {
  memset(o, 0, sizeof *o);
  o->device = -1;
}

/* ---- limits ---------------------------------------------------------------------------------- */

static ms_gate_figure gate_figure_parse(const char *s, size_t n) {
  for (int f = 0; f < MS_FIG_COUNT; f++)
    if (strlen(gate_names[f]) == n && memcmp(gate_names[f], s, n) == 0) return (ms_gate_figure)f;
  return MS_FIG_COUNT;
}

/* The value: [sign] digits [. digits] [unit | %]. */
static int gate_value_parse(const char *v, ms_gate_limit_t *l, ms_errbuf_t *eb) {
  const char *p = v;
  int sign = 0;
  if (*p == '+' || *p == '-') sign = *p++ == '-' ? -1 : 1;
  if (*p < '0' || *p > '9')
    return ms__errbuf_set(eb, MS_EINVAL, "expected a number after the operator, got '%s'", v);
  uint64_t ip = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (ip > (UINT64_MAX - 9) / 10) return ms__errbuf_set(eb, MS_EINVAL, "'%s' is too large", v);
    ip = ip * 10 + (uint64_t)(*p - '0');
  }
  uint64_t frac = 0, scale = 1;
  if (*p == '.') {
    p++;
    if (*p < '0' || *p > '9')
      return ms__errbuf_set(eb, MS_EINVAL, "expected digits after the point in '%s'", v);
    for (; *p >= '0' && *p <= '9'; p++)
      if (scale < 1000000000ull) {
        frac = frac * 10 + (uint64_t)(*p - '0');
        scale *= 10;
      }
  }
  uint64_t unit = 1;
  if (*p == '%') {
    if (!sign)
      return ms__errbuf_set(eb, MS_EINVAL, "a percentage is relative to the baseline: write "
                            "'+%s' or '-%s'", v, v);
    l->percent = true;
    unit = 100; /* hundredths of a percent */
    p++;
  } else if (*p) {
    static const char units[] = "KMGT";
    const char *u = strchr(units, *p >= 'a' ? *p - 32 : *p);
    if (u && *p) {
      unit = 1ull << (10 * (1 + (u - units)));
      p++;
      if (p[0] == 'i' && p[1] == 'B') p += 2;
      else if (p[0] == 'B') p++;
    } else if (*p == 'B') {
      p++;
    }
  }
  if (*p)
    return ms__errbuf_set(eb, MS_EINVAL, "unexpected '%s' in the value '%s' (units: K, M, G, T, "
                          "KiB, MiB, GiB, TiB, B; a relative value may end in %%)", p, v);
  if (ip > (uint64_t)INT64_MAX / unit) return ms__errbuf_set(eb, MS_EINVAL, "'%s' is too large", v);
  uint64_t x = ip * unit + (uint64_t)((double)frac / (double)scale * (double)unit);
  if (x > (uint64_t)INT64_MAX) return ms__errbuf_set(eb, MS_EINVAL, "'%s' is too large", v);
  l->relative = sign != 0;
  l->value = sign < 0 ? -(int64_t)x : (int64_t)x;
  return MS_OK;
}

int ms_gate_limit_parse(const char *text, ms_gate_limit_t *out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!text || !out, MS_EINVAL);
  ms_gate_limit_t l;
  memset(&l, 0, sizeof l);
  snprintf(l.text, sizeof l.text, "%s", text);
  const char *op = strpbrk(text, "<>=");
  if (!op || *op == '=')
    return ms__errbuf_set(eb, MS_EINVAL, "'%s' is not FIGURE<=VALUE (operators: <=, <, >=, >)",
                          text);
  const char *fs = text, *fe = op;
  while (*fs == ' ') fs++;
  while (fe > fs && fe[-1] == ' ') fe--;
  if (fe == fs) return ms__errbuf_set(eb, MS_EINVAL, "'%s' names no figure before '%c'", text, *op);
  bool eq = op[1] == '=';
  l.op = *op == '<' ? (eq ? MS_GATE_LE : MS_GATE_LT) : (eq ? MS_GATE_GE : MS_GATE_GT);
  const char *v = op + 1 + eq;
  while (*v == ' ') v++;
  char val[64];
  size_t vn = strlen(v);
  while (vn && v[vn - 1] == ' ') vn--;
  if (vn == 0 || vn >= sizeof val)
    return ms__errbuf_set(eb, MS_EINVAL, "'%s' has %s value after the operator", text,
                          vn ? "too long a" : "no");
  memcpy(val, v, vn);
  val[vn] = 0;
  l.figure = gate_figure_parse(fs, (size_t)(fe - fs));
  if (l.figure == MS_FIG_COUNT) {
    char names[1024];
    size_t n = 0;
    for (int f = 0; f < MS_FIG_COUNT && n < sizeof names; f++)
      n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", f ? ", " : "",
                            ms_gate_figure_name((ms_gate_figure)f));
    return ms__errbuf_set(eb, MS_ENOTFOUND, "unknown figure '%.*s' (figures: %s)",
                          (int)(fe - fs), fs, names);
  }
  MS_FORWARD_IF_ERROR(gate_value_parse(val, &l, eb));
  *out = l;
  return MS_OK;
}

bool ms_gate_holds(const ms_gate_limit_t *l, uint64_t value, uint64_t baseline, uint64_t *bound) {
  uint64_t b = (uint64_t)l->value;
  if (l->relative) {
    long double d = l->percent ? (long double)baseline * (long double)l->value / 10000.0L
                               : (long double)l->value;
    long double x = (long double)baseline + d;
    b = x <= 0 ? 0 : x >= 18446744073709551615.0L ? UINT64_MAX : (uint64_t)x;
  }
  if (bound) *bound = b;
  switch (l->op) {
  case MS_GATE_LE: return value <= b;
  case MS_GATE_LT: return value < b;
  case MS_GATE_GE: return value >= b;
  case MS_GATE_GT: return value > b;
  }
  return false;
}

/* ---- figures --------------------------------------------------------------------------------- */

static void gate_set(ms_gate_figures_t *f, ms_gate_figure k, uint64_t v, int64_t step) {
  f->known[k] = true;
  f->value[k] = v;
  f->step[k] = step;
}

/* The recorded figures from the index and the trace. */
static void gate_recorded(const ms_snapshot_t *snap, const ms_timeline_t *tl, ms_gate_figures_t *f) {
  size_t d = f->device, n = ms_timeline_nentries(tl, d);
  static const struct { ms_gate_figure f; ms_tl_metric m; } peaks[] = {
      {MS_FIG_PEAK_RESERVED, MS_TL_RESERVED},
      {MS_FIG_PEAK_ALLOCATED, MS_TL_ALLOCATED},
      {MS_FIG_PEAK_REQUESTED, MS_TL_REQUESTED}};
  for (size_t k = 0; k < sizeof peaks / sizeof *peaks; k++) {
    ms_tl_peak_t p;
    if (ms_timeline_peak(tl, d, peaks[k].m, 0, n, &p) == MS_OK)
      gate_set(f, peaks[k].f, p.bytes, (int64_t)p.step);
  }
  uint64_t at[MS_TL_METRIC_COUNT], end[MS_TL_METRIC_COUNT];
  size_t s = f->known[MS_FIG_PEAK_RESERVED] ? (size_t)f->step[MS_FIG_PEAK_RESERVED] : 0;
  if (f->known[MS_FIG_PEAK_RESERVED] && ms_timeline_totals_at(tl, d, s, at) == MS_OK &&
      ms_timeline_totals_at(tl, d, n, end) == MS_OK) {
    uint64_t res = at[MS_TL_RESERVED], alc = at[MS_TL_ALLOCATED];
    gate_set(f, MS_FIG_UNALLOCATED_AT_PEAK_RESERVED, res - (alc < res ? alc : res), (int64_t)s);
    gate_set(f, MS_FIG_FINAL_RESERVED, end[MS_TL_RESERVED], (int64_t)n);
    gate_set(f, MS_FIG_FINAL_ALLOCATED, end[MS_TL_ALLOCATED], (int64_t)n);
  }
  uint64_t mallocs = 0, frees = 0, ooms = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t a = ms_timeline_entry(tl, d, i)->action;
    mallocs += a == MS_TRACE_SEGMENT_ALLOC || a == MS_TRACE_SEGMENT_MAP;
    frees += a == MS_TRACE_SEGMENT_FREE || a == MS_TRACE_SEGMENT_UNMAP;
    ooms += a == MS_TRACE_OOM;
  }
  gate_set(f, MS_FIG_DEVICE_MALLOCS, mallocs, -1);
  gate_set(f, MS_FIG_DEVICE_FREES, frees, -1);
  gate_set(f, MS_FIG_OOMS, ooms, -1);
  const ms_snap_device_t *dv = d < snap->ndevices ? &snap->devices[d] : NULL;
  for (uint32_t i = 0; dv && (dv->present & MS_DEV_HAS_STATS) && i < dv->nstats; i++) {
    const ms_snap_kv_t *kv = &snap->stats[dv->first_stat + i];
    if (kv->key && strcmp(kv->key, "num_alloc_retries") == 0 && kv->kind == MS_SNAP_VAL_INT &&
        kv->i >= 0)
      gate_set(f, MS_FIG_ALLOC_RETRIES, (uint64_t)kv->i, -1);
  }
}

/* The figures of the fresh-start what-if replay (replacing the recorded ones it has). */
static int gate_replayed(const ms_snapshot_t *snap, const ms_gate_options_t *o,
                         ms_gate_figures_t *f, ms_errbuf_t *eb) {
  ms_replay_options_t ro;
  ms_replay_options_init(&ro);
  ro.whatif = true;
  ro.fresh_start = true;
  ro.config = o->config;
  ro.capacity = (size_t)o->capacity;
  ro.device = (int)f->device;
  ms_replay_report_t *rep = NULL;
  MS_FORWARD_IF_ERROR(ms_replay_run(snap, &ro, &rep, eb));
  int r = MS_OK;
  const ms_replay_device_t *d = rep->ndevices ? &rep->devices[0] : NULL;
  const ms_replay_usage_t *u = d ? &d->replayed : NULL;
  if (!d || d->verdict == MS_REPLAY_UNREPLAYABLE) {
    r = ms__errbuf_set(eb, MS_EINVAL, "device %zu cannot be replayed: %s", f->device,
                       d ? d->reason : "no trace");
  } else if (u->start_short) {
    r = ms__errbuf_set(eb, MS_EINVAL, "device %zu: the live memory when the trace began does not "
                       "fit the capacity by %" PRIu64 " bytes", f->device, u->start_short);
  } else if (!u->valid) {
    r = ms__errbuf_set(eb, MS_EINVAL, "device %zu: the replay stopped early", f->device);
  } else {
    gate_set(f, MS_FIG_PEAK_RESERVED, u->peak_reserved, u->peak_reserved_index + 1);
    gate_set(f, MS_FIG_PEAK_ALLOCATED, u->peak_allocated, u->peak_allocated_index + 1);
    gate_set(f, MS_FIG_PEAK_REQUESTED, u->peak_requested, u->peak_requested_index + 1);
    gate_set(f, MS_FIG_UNALLOCATED_AT_PEAK_RESERVED, u->unallocated_at_peak_reserved,
             u->peak_reserved_index + 1);
    gate_set(f, MS_FIG_DEVICE_MALLOCS, u->device_mallocs, -1);
    gate_set(f, MS_FIG_DEVICE_FREES, u->device_frees, -1);
    gate_set(f, MS_FIG_ALLOC_RETRIES, u->alloc_retries, -1);
    gate_set(f, MS_FIG_OOMS, u->ooms, -1);
    gate_set(f, MS_FIG_FINAL_RESERVED, u->final_reserved, (int64_t)d->entries);
    gate_set(f, MS_FIG_FINAL_ALLOCATED, u->final_allocated, (int64_t)d->entries);
    f->replayed = true;
  }
  ms_replay_report_free(rep);
  return r;
}

/* The peak of each category over the recorded trace. */
static int gate_categories(const ms_snapshot_t *snap, const ms_timeline_t *tl,
                           ms_gate_figures_t *f, ms_errbuf_t *eb) {
  ms_attr_t *a = NULL;
  uint64_t *series = NULL;
  MS_FORWARD_IF_ERROR(ms_attr_create(snap, tl, NULL, &a, eb));
  int r = ms_attr_category_series(a, f->device, &series);
  size_t n = ms_timeline_nentries(tl, f->device);
  for (int c = 0; r == MS_OK && c < MS_CAT_COUNT; c++) {
    uint64_t best = 0;
    size_t at = 0;
    for (size_t s = 0; s <= n; s++)
      if (series[s * MS_CAT_COUNT + (size_t)c] > best) {
        best = series[s * MS_CAT_COUNT + (size_t)c];
        at = s;
      }
    gate_set(f, (ms_gate_figure)(MS_FIG_CATEGORY0 + c), best, (int64_t)at);
  }
  free(series);
  ms_attr_destroy(a);
  return r;
}

int ms_gate_figures(const ms_snapshot_t *snap, const ms_gate_options_t *opt,
                    ms_gate_figures_t *out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!snap || !out, MS_EINVAL);
  ms_gate_options_t o;
  if (opt) o = *opt;
  else ms_gate_options_init(&o);
  ms_gate_figures_t f;
  memset(&f, 0, sizeof f);
  for (int k = 0; k < MS_FIG_COUNT; k++)
    f.step[k] = -1;
  MS_FORWARD_IF_ERROR(ms__cmp_device(snap, o.device, "the snapshot", &f.device, eb));
  bool has_trace = ms__cmp_has_trace(snap, f.device);
  if (o.replay && !has_trace)
    return ms__errbuf_set(eb, MS_EINVAL, "device %zu has no allocation trace: --replay needs one "
                          "(record with history on)", f.device);
  ms_timeline_t *tl = NULL;
  ms_timeline_config_t cfg;
  ms_timeline_config_init(&cfg);
  MS_FORWARD_IF_ERROR(ms_timeline_create(snap, &cfg, &tl, eb));
  gate_recorded(snap, tl, &f);
  int r = gate_categories(snap, tl, &f, eb);
  if (r == MS_OK && !has_trace) {
    /* the end state only: no peak, no count is known; final figures are */
    for (int k = 0; k < MS_FIG_COUNT; k++)
      if (k != MS_FIG_FINAL_RESERVED && k != MS_FIG_FINAL_ALLOCATED) f.known[k] = false;
    snprintf(f.note, sizeof f.note, "device %zu has no allocation trace: only final_reserved and "
             "final_allocated are known", f.device);
  } else if (r == MS_OK && !f.known[MS_FIG_ALLOC_RETRIES]) {
    snprintf(f.note, sizeof f.note, "alloc_retries is not recorded in this snapshot: --replay "
             "counts them");
  }
  if (r == MS_OK && o.replay) r = gate_replayed(snap, &o, &f, eb);
  ms_timeline_destroy(tl);
  if (r == MS_OK) *out = f;
  return r;
}
