/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap trace FILE`, `_memory_viz.py trace` (docs/cli.md, `trace`):
 * each device's trace as pseudo-code, allocations named a..z, a1..z1, ... in order of first use.
 *
 * Kept from PyTorch, on purpose: names are never reused (its recycling code looks the name up in
 * the address-keyed dict); an alloc is placed in the first earlier `segment_alloc` whose range
 * holds it, else in the snapshot segment `seg_<i>` whose [address, address + allocated_size) holds
 * it, else in `MEM` at its absolute address; other actions print Python's repr of the entry.
 * Changed: PyTorch's final `TOTAL MEM` is meaningless (its byte counter is overwritten by the loop
 * index); memsnap prints the true total, the bytes allocated minus the bytes whose free completed
 * within the trace (docs/cli.md).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/snapshot.h"

static const char trace_usage[] =
    "usage: memsnap trace FILE [--json] [--at MOMENT] [--device N] [--range A:B] [--stream S]\n"
    "                          [--pool A,B]\n"
    "\n"
    "Prints the allocator trace of each device of FILE as pseudo-code (a = cudaMalloc(...),\n"
    "b = a[offset:size], del b, ...), as PyTorch's `_memory_viz.py trace`, except that the last\n"
    "line, TOTAL MEM, is the true net of the allocations and completed frees in the trace.\n"
    "FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input).\n"
    "\n"
    "options:\n"
    "  --json            the entries as JSON records (docs/cli.md, JSON outputs)\n"
    "  --at MOMENT       the trace up to MOMENT:    peak (of allocated bytes), peak-reserved,\n"
    "                    end, an entry index N (after trace entry N; -1 = before the first),\n"
    "                    or a time in microseconds: t=1700000000123456 or 1700000000123456us\n"
    "  -d, --device N    only device N (with --at: default the device with the longest trace)\n"
    "  --range A:B       with --at: peaks within trace entries A to B; alone: the state after B\n"
    "                    (or t=T0:T1 by time_us, step=N[:M] by ProfilerStep#N)\n"
    "  --stream S        only entries of stream S  (a raw handle, decimal or 0x...)\n"
    "  --pool A,B        only entries of private pool (A, B); 0,0 is the default pool\n"
    "  -h, --help  show this help\n";

/* ---- an address -> name map (open addressing; names are indices into the name counter) ---- */

typedef struct trace_map_s {
  uint64_t *keys;
  uint64_t *vals; /* name number + 1; 0 = empty slot */
  size_t cap;
  size_t len;
} trace_map_t;

static uint64_t trace_hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

static bool trace_map_get(const trace_map_t *m, uint64_t key, uint64_t *val) {
  if (!m->cap) return false;
  for (size_t i = trace_hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (!m->vals[i]) return false;
    if (m->keys[i] == key) {
      *val = m->vals[i] - 1;
      return true;
    }
  }
}

static int trace_map_put(trace_map_t *m, uint64_t key, uint64_t val) {
  if ((m->len + 1) * 2 > m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uint64_t *nk = calloc(ncap, sizeof *nk), *nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
      free(nk);
      free(nv);
      return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->vals[i]) continue;
      size_t j = trace_hash(m->keys[i]) & (ncap - 1);
      while (nv[j]) j = (j + 1) & (ncap - 1);
      nk[j] = m->keys[i];
      nv[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
  }
  size_t i = trace_hash(key) & (m->cap - 1);
  while (m->vals[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
  if (!m->vals[i]) m->len++;
  m->keys[i] = key;
  m->vals[i] = val + 1;
  return 0;
}

static void trace_map_free(trace_map_t *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* Decimal digits of v at w (no NUL); returns the end. */
static char *trace_put_u64(char *w, uint64_t v) {
  char t[24];
  int k = 0;
  do {
    t[k++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (k) *w++ = t[--k];
  return w;
}

/* `_name()`: a..z, a1..z1, a2, ... */
static const char *trace_name(uint64_t n, char buf[32]) {
  uint64_t r = n / 26, m = n % 26;
  char *w = buf;
  *w++ = (char)('a' + m);
  if (r) w = trace_put_u64(w, r);
  *w = 0;
  return buf;
}

/* One output line, assembled without printf (a trace has millions): pieces appended in order,
 * then written at once. Every piece is short (names, numbers, formatted sizes). */
typedef struct trace_line_s {
  char b[512];
  char *w;
} trace_line_t;

static void tl_str(trace_line_t *l, const char *s) {
  size_t n = strlen(s);
  memcpy(l->w, s, n);
  l->w += n;
}

static void tl_u64(trace_line_t *l, uint64_t v) { l->w = trace_put_u64(l->w, v); }



/* ---- Python's repr ------------------------------------------------------------------------------
 */

/* repr(str): single quotes unless the text has ' and no "; escapes as Python does for the
 * characters it considers unprintable (control bytes; non-ASCII UTF-8 is kept as is). */
static void trace_repr_str(FILE *out, const char *s) {
  char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
  fputc(q, out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    unsigned char c = *p;
    if (c == (unsigned char)q || c == '\\')
      fprintf(out, "\\%c", c);
    else if (c == '\n')
      fputs("\\n", out);
    else if (c == '\r')
      fputs("\\r", out);
    else if (c == '\t')
      fputs("\\t", out);
    else if (c < 0x20 || c == 0x7f)
      fprintf(out, "\\x%02x", c);
    else
      fputc(c, out);
  }
  fputc(q, out);
}

/* repr(entry) of a trace entry, with the keys in the order PyTorch's C++ inserts them. */
static void trace_repr_entry(FILE *out, const ms_snapshot_t *s, const ms_snap_trace_t *e) {
  const char *action =
      ms_snap_trace_action_name(e) && ms_snap_trace_action_name(e)[0] ? ms_snap_trace_action_name(e) : ms_trace_action_name(e->action);
  fputs("{'action': ", out);
  trace_repr_str(out, action);
  fprintf(out, ", '%s': %" PRIu64 ", 'size': %" PRIu64 ", 'stream': %" PRIu64,
          e->action == MS_TRACE_OOM ? "device_free" : "addr", e->addr, e->size,
          ms_snap_trace_stream(e));
  if (e->present & MS_TRACE_HAS_TIME) fprintf(out, ", 'time_us': %" PRId64, e->time_us);
  if (e->present & MS_TRACE_HAS_COMPILE_CONTEXT) {
    fputs(", 'compile_context': ", out);
    trace_repr_str(out, ms_snap_trace_compile_context(e));
  }
  if (e->present & MS_TRACE_HAS_USER_METADATA) {
    fputs(", 'user_metadata': ", out);
    trace_repr_str(out, ms_snap_trace_user_metadata(e));
  }
  if ((e->present & MS_TRACE_HAS_FRAMES) || e->stack != MS_SNAP_NO_STACK) {
    fputs(", 'frames': [", out);
    uint32_t depth = ms_snap_stack_depth(s, e->stack);
    for (uint32_t i = 0; i < depth; i++) {
      const ms_snap_frame_t *f = ms_snap_stack_frame(s, e->stack, i);
      fputs(i ? ", {'name': " : "{'name': ", out);
      trace_repr_str(out, f->name);
      fputs(", 'filename': ", out);
      trace_repr_str(out, f->filename);
      fprintf(out, ", 'line': %" PRId64 "}", f->line);
    }
    fputc(']', out);
  }
  fputs("}\n", out);
}

/* ---- the trace --------------------------------------------------------------------------------
 */

typedef struct trace_interval_s {
  uint64_t name;
  uint64_t addr;
  uint64_t size;
} trace_interval_t;

/* [lo, last] of the address space whose first segment_alloc'd range (in trace order) is
 * ivals[iv]: the covers are disjoint and sorted, so `find_segment` is a binary search. A range
 * added later only covers what no earlier one did (the first match never changes). */
typedef struct trace_cover_s {
  uint64_t lo, last;
  size_t iv;
} trace_cover_t;

typedef struct trace_state_s {
  const ms_snapshot_t *snap;
  trace_interval_t *ivals; /* segment_alloc'd ranges, in order */
  size_t nivals, civals;
  trace_cover_t *covers;
  size_t ncovers, ccovers;
  char *obuf; /* lines not yet written (TRACE_OBUF bytes; one fwrite per buffer, not per line) */
  size_t olen;
  trace_map_t allocs;   /* address -> name of the allocation */
  trace_map_t segnames; /* address -> name of the segment_alloc */
  uint64_t next_name;
} trace_state_t;

/* The first cover whose last address is >= addr (ncovers when none). */
static size_t trace_cover_at(const trace_state_t *t, uint64_t addr) {
  size_t lo = 0, hi = t->ncovers;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->covers[mid].last < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Records ivals[iv] (just appended) in the covers: the parts of its range not yet covered. */
static int trace_cover_add(trace_state_t *t, size_t iv) {
  const trace_interval_t *r = &t->ivals[iv];
  if (r->size == 0) return 0;
  uint64_t cur = r->addr;
  uint64_t last = r->size - 1 > UINT64_MAX - r->addr ? UINT64_MAX : r->addr + (r->size - 1);
  for (size_t i = trace_cover_at(t, cur);;) {
    if (i < t->ncovers && t->covers[i].lo <= cur) { /* covered already: skip past it */
      if (t->covers[i].last >= last) return 0;
      cur = t->covers[i].last + 1;
      i++;
      continue;
    }
    uint64_t end = i < t->ncovers && t->covers[i].lo - 1 < last ? t->covers[i].lo - 1 : last;
    if (t->ncovers == t->ccovers) {
      size_t nc = t->ccovers ? t->ccovers * 2 : 16;
      trace_cover_t *p = realloc(t->covers, nc * sizeof *p);
      if (!p) return -1;
      t->covers = p;
      t->ccovers = nc;
    }
    memmove(t->covers + i + 1, t->covers + i, (t->ncovers - i) * sizeof *t->covers);
    t->covers[i] = (trace_cover_t){cur, end, iv};
    t->ncovers++;
    if (end >= last) return 0;
    cur = end + 1;
    i++;
  }
}

#define TRACE_OBUF ((size_t)1 << 20)

/* Writes the buffered lines; call before writing to out directly. */
static void trace_flush(trace_state_t *t, FILE *out) {
  if (t->olen) fwrite(t->obuf, 1, t->olen, out);
  t->olen = 0;
}

static void tl_end(trace_line_t *l, trace_state_t *t, FILE *out) {
  *l->w++ = '\n';
  size_t n = (size_t)(l->w - l->b);
  if (TRACE_OBUF - t->olen < n) trace_flush(t, out);
  memcpy(t->obuf + t->olen, l->b, n);
  t->olen += n;
}

/* `find_segment(addr)`: writes the segment's name into buf and its base into *base. */
static bool trace_find_segment(trace_state_t *t, uint64_t addr, char buf[32], uint64_t *base) {
  size_t c = trace_cover_at(t, addr);
  if (c < t->ncovers && t->covers[c].lo <= addr) {
    const trace_interval_t *iv = &t->ivals[t->covers[c].iv];
    trace_name(iv->name, buf);
    *base = iv->addr;
    return true;
  }
  for (size_t i = 0; i < t->snap->nsegments; i++) {
    const ms_snap_segment_t *seg = &t->snap->segments[i];
    if (addr >= seg->address && addr - seg->address < seg->allocated_size) {
      snprintf(buf, 32, "seg_%zu", i);
      *base = seg->address;
      return true;
    }
  }
  return false;
}

/* TOTAL MEM is exact, as Python's int is: a hostile trace's sizes (up to 2^64 - 1 each) may sum
 * past int64_t, never past 128 bits. */
__extension__ typedef __int128 trace_total_t;

static int trace_device(FILE *out, trace_state_t *t, const ms_snap_trace_t *entries, size_t n) {
  char nb[32], sb[32], b1[CLI_BYTES_BUFSZ], b2[CLI_BYTES_BUFSZ];
  trace_total_t total = 0;
  fprintf(out, "%zu entries\n", n);
  for (size_t k = 0; k < n; k++) {
    const ms_snap_trace_t *e = &entries[k];
    uint64_t name;
    switch (e->action) {
      case MS_TRACE_ALLOC: {
        uint64_t base = 0;
        name = t->next_name++;
        trace_name(name, nb);
        trace_line_t l = {.w = NULL};
        l.w = l.b;
        tl_str(&l, nb);
        if (trace_find_segment(t, e->addr, sb, &base)) {
          tl_str(&l, " = ");
          tl_str(&l, sb);
          tl_str(&l, "[");
          tl_u64(&l, e->addr - base);
        } else {
          tl_str(&l, " = MEM[");
          tl_u64(&l, e->addr);
        }
        tl_str(&l, ":");
        tl_str(&l, cli_format_ubytes(e->size, b1));
        tl_str(&l, "]");
        tl_end(&l, t, out);
        if (trace_map_put(&t->allocs, e->addr, name) != 0) goto nomem;
        total += e->size;
        break;
      }
      case MS_TRACE_FREE_REQUESTED:
      case MS_TRACE_FREE_COMPLETED: {
        const char *who = trace_map_get(&t->allocs, e->addr, &name)
                              ? trace_name(name, nb)
                              : (snprintf(nb, sizeof nb, "%" PRIu64, e->addr), nb);
        trace_line_t l = {.w = NULL};
        l.w = l.b;
        if (e->action == MS_TRACE_FREE_REQUESTED) {
          tl_str(&l, "del ");
          tl_str(&l, who);
          tl_str(&l, " # ");
        } else {
          tl_str(&l, "# free completed for ");
          tl_str(&l, who);
          tl_str(&l, " ");
          total -= e->size;
        }
        tl_str(&l, cli_format_ubytes(e->size, b1));
        tl_end(&l, t, out);
        break;
      }
      case MS_TRACE_SEGMENT_ALLOC: {
        name = t->next_name++;
        trace_flush(t, out);
        fprintf(out, "%s = cudaMalloc(%" PRIu64 ", %s)\n", trace_name(name, nb), e->addr,
                cli_format_ubytes(e->size, b1));
        if (t->nivals == t->civals) {
          size_t nc = t->civals ? t->civals * 2 : 16;
          trace_interval_t *p = realloc(t->ivals, nc * sizeof *p);
          if (!p) goto nomem;
          t->ivals = p;
          t->civals = nc;
        }
        t->ivals[t->nivals++] = (trace_interval_t){name, e->addr, e->size};
        if (trace_cover_add(t, t->nivals - 1) != 0) goto nomem;
        if (trace_map_put(&t->segnames, e->addr, name) != 0) goto nomem;
        break;
      }
      case MS_TRACE_SEGMENT_FREE: {
        const char *who = trace_map_get(&t->segnames, e->addr, &name)
                              ? trace_name(name, nb)
                              : (snprintf(nb, sizeof nb, "%" PRIu64, e->addr), nb);
        trace_flush(t, out);
        fprintf(out, "cudaFree(%s) # %s\n", who, cli_format_ubytes(e->size, b1));
        break;
      }
      case MS_TRACE_OOM:
        trace_flush(t, out);
        fprintf(out, "raise OutOfMemoryError # %s requested, %s free in CUDA\n",
                cli_format_ubytes(e->size, b1), cli_format_ubytes(e->addr, b2));
        break;
      default:
        trace_flush(t, out);
        trace_repr_entry(out, t->snap, e);
        break;
    }
  }
  trace_flush(t, out);
  fprintf(out, "TOTAL MEM: %s",
          total >= INT64_MIN && total <= INT64_MAX ? cli_format_bytes((int64_t)total, b1)
                                                   : cli_format_bytes_double((double)total, b1));
  return CLI_OK;
nomem:
  cli_error("out of memory");
  return CLI_FAILURE;
}

static int trace_run(FILE *out, const ms_snapshot_t *s, const ms_tl_filter_t *filter,
                     size_t only_dev) {
  int rc = CLI_OK;
  for (size_t d = 0; d < s->ndevices && rc == CLI_OK; d++) {
    const ms_snap_device_t *dev = &s->devices[d];
    if (dev->ntrace == 0 || (only_dev != SIZE_MAX && d != only_dev)) continue;
    const ms_snap_trace_t *entries = &s->trace[dev->first_trace];
    size_t n = dev->ntrace;
    ms_snap_trace_t *kept = NULL;
    if (filter && (filter->has_stream || filter->has_pool)) { /* the matching entries only */
      kept = malloc(n * sizeof *kept);
      if (!kept) {
        cli_error("out of memory");
        return CLI_FAILURE;
      }
      size_t k = 0;
      for (size_t i = 0; i < n; i++)
        if (cli_trace_entry_kept(filter, &entries[i])) kept[k++] = entries[i];
      entries = kept;
      n = k;
      if (n == 0) {
        free(kept);
        continue;
      }
    }
    fprintf(out, "Device %zu ----------------\n", d);
    /* each device starts afresh, as `format(d)` does */
    trace_state_t t = {.snap = s, .obuf = malloc(TRACE_OBUF)};
    if (!t.obuf) {
      free(kept);
      cli_error("out of memory");
      return CLI_FAILURE;
    }
    rc = trace_device(out, &t, entries, n);
    free(kept);
    free(t.ivals);
    free(t.covers);
    free(t.obuf);
    trace_map_free(&t.allocs);
    trace_map_free(&t.segnames);
  }
  fputc('\n', out); /* print() */
  return rc;
}

int cmd_trace(int argc, char **argv) {
  const char *at_s = NULL, *device_s = NULL, *range_s = NULL, *stream_s = NULL, *pool_s = NULL;
  int json = 0;
  const struct cli_opt opts[] = {{"json", 0, &json, NULL},
                                 {"at", 0, NULL, &at_s},         {"device", 0, NULL, &device_s},
                                 {"range", 0, NULL, &range_s},   {"stream", 0, NULL, &stream_s},
                                 {"pool", 0, NULL, &pool_s},     {NULL, 0, NULL, NULL}};
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options("trace", trace_usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error("trace", "missing FILE");
  cli_tl_args_t ta;
  if ((rc = cli_tl_args_parse("trace", &ta, device_s, range_s, stream_s, pool_s, at_s)) != CLI_OK)
    return rc;
  ms_snapshot_t *snap = NULL, *view = NULL;
  /* The text names the entries it prints; only the others (segment_map, snapshot...) print their
   * frames, so the stacks of the rest are not built (--json prints every entry's frames). */
  if ((rc = cli_load_range(pos[0], json ? 0 : MS_LOAD_NO_TRACE_STACKS, &ta, &snap)) != CLI_OK) return rc;
  const char *name = cli_display_name(pos[0]);
  size_t dev = SIZE_MAX;
  if (ta.has_at || ta.has_range) {
    /* the trace up to the moment, and the segments as they were then */
    cli_tl_args_t whole = ta;
    whole.filter.has_stream = whole.filter.has_pool = false;
    rc = cli_at_snapshot(snap, name, &whole, false, &view, &dev, NULL);
  } else if (ta.has_device) {
    rc = cli_tl_device(snap, name, &ta, &dev);
  }
  if (rc == CLI_OK && snap->ntrace == 0) /* the text stays _memory_viz.py's (a blank line) */
    cli_warning("'%s' holds no allocator trace: record one with "
                "torch.cuda.memory._record_memory_history() before the code to trace (PyTorch), "
                "or take it with `memsnap run` or a history recorder (memsnap)",
                name);
  /* --range A:B: the view's trace of dev begins at entry A (cli_at_snapshot moves its first_trace
   * over the same entries), and --json numbers the entries as the whole trace does (issue #31) */
  size_t first = 0;
  if (view && dev < view->ndevices && dev < snap->ndevices &&
      view->devices[dev].first_trace >= snap->devices[dev].first_trace)
    first = view->devices[dev].first_trace - snap->devices[dev].first_trace;
  if (rc == CLI_OK && json)
    rc = cli_trace_json(stdout, view ? view : snap, name, &ta.filter, dev, first);
  else if (rc == CLI_OK)
    rc = trace_run(stdout, view ? view : snap, &ta.filter, dev);
  ms_snapshot_free(view);
  ms_snapshot_free(snap);
  return rc;
}
