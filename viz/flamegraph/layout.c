/* SPDX-License-Identifier: MIT
 * memsnap viz: flame-graph layout and colours.
 *
 * Layout walks the frame tree from the root, depth first, and places each drawn frame at a value
 * offset with a width (pixels come later, in flamegraph.c). Children sit left-aligned in their
 * parent, sorted by name (flame graphs) or in input order (flame charts); the parent's self value
 * is the free space on the right. Children narrower than the minimum are not dropped as in
 * flamegraph.pl: they are gathered, with their whole subtrees, into one "[N small frames]" frame
 * at the right of their kept siblings, so every byte stays visible and searchable.
 * Only drawn frames are visited, so the cost follows the output size, not the tree size.
 *
 * Colours are a pure function of the name (a hash), so a frame has the same colour in every
 * graph and every run; palettes use flamegraph.pl's hue ranges.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flamegraph/internal.h"

typedef struct lo_pending {
  uint32_t node, parent, depth, nsmall;
  ms__fkind kind;
  uint64_t offset, width, before, after;
} lo_pending_t;

static int lo_cmp_name(const void *a, const void *b, void *ctx) {
  const ms__ftree_t *t = ctx;
  ms__viz_str_t x = ms__ftree_name(t, *(const uint32_t *)a);
  ms__viz_str_t y = ms__ftree_name(t, *(const uint32_t *)b);
  size_t n = x.len < y.len ? x.len : y.len;
  int c = n ? memcmp(x.ptr, y.ptr, n) : 0;
  if (c) return c;
  if (x.len != y.len) return x.len < y.len ? -1 : 1;
  /* Equal names happen only in flame charts (not sorted); keep the order total anyway. */
  uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
  return i < j ? -1 : i > j;
}

static int lo_push_frame(ms__layout_t *lo, const lo_pending_t *p) {
  if (lo->n == lo->cap) {
    size_t cap = lo->cap ? lo->cap * 2 : 256;
    ms__frame_t *f = realloc(lo->frames, cap * sizeof *f);
    if (!f) return MS_ENOMEM;
    lo->frames = f;
    lo->cap = cap;
  }
  lo->frames[lo->n++] = (ms__frame_t){.node = p->node, .parent = p->parent, .depth = p->depth,
                                      .nsmall = p->nsmall, .kind = p->kind, .offset = p->offset,
                                      .width = p->width, .before = p->before, .after = p->after};
  if (p->depth > lo->max_depth) lo->max_depth = p->depth;
  return MS_OK;
}

int ms__layout_build(const ms__ftree_t *t, double minfrac, int by_name, ms__layout_t *lo) {
  int err = MS_OK;
  lo_pending_t *stack = NULL;
  size_t sn = 0, scap = 0;
  uint32_t *kids = NULL;
  size_t kcap = 0;
  uint64_t *w = malloc(t->n * sizeof *w);
  memset(lo, 0, sizeof *lo);
  if (!w) return MS_ENOMEM;
  ms__ftree_widths(t, w);
  lo->root_width = w[0];
  double minval = minfrac * (double)w[0];

  scap = 64;
  stack = malloc(scap * sizeof *stack);
  if (!stack) goto nomem;
  stack[sn++] = (lo_pending_t){.node = 0, .parent = MS__VIZ_NONE, .width = w[0],
                               .before = t->diff ? t->btotal[0] : t->total[0],
                               .after = t->total[0]};
  while (sn > 0) {
    lo_pending_t cur = stack[--sn];
    if ((err = lo_push_frame(lo, &cur)) != MS_OK) goto out;
    if (cur.kind == MS__FRAME_SMALL) continue;
    uint32_t self_index = (uint32_t)(lo->n - 1);
    /* Collect the drawable children; gather the narrow ones. */
    size_t nk = 0, nsmall = 0;
    uint64_t small_w = 0, small_b = 0, small_a = 0;
    for (uint32_t c = t->nodes[cur.node].child; c != MS__VIZ_NONE; c = t->nodes[c].sibling) {
      if (w[c] == 0) continue;
      if ((double)w[c] < minval) {
        nsmall++;
        small_w += w[c];
        small_b += t->diff ? t->btotal[c] : t->total[c];
        small_a += t->total[c];
        continue;
      }
      if (nk == kcap) {
        size_t cap = kcap ? kcap * 2 : 64;
        uint32_t *k = realloc(kids, cap * sizeof *k);
        if (!k) goto nomem;
        kids = k;
        kcap = cap;
      }
      kids[nk++] = c;
    }
    if (by_name) {
      if (nk > 1) qsort_r(kids, nk, sizeof *kids, lo_cmp_name, (void *)t);
    } else {
      /* Children are stored newest first: reverse to input order. */
      for (size_t i = 0; i < nk / 2; i++) {
        uint32_t tmp = kids[i];
        kids[i] = kids[nk - 1 - i];
        kids[nk - 1 - i] = tmp;
      }
    }
    size_t need = sn + nk + 1;
    if (need > scap) {
      size_t cap = scap;
      while (cap < need) cap *= 2;
      lo_pending_t *s = realloc(stack, cap * sizeof *s);
      if (!s) goto nomem;
      stack = s;
      scap = cap;
    }
    /* Offsets left to right; pushed right to left so that the leftmost is laid out first. */
    uint64_t off = cur.offset;
    for (size_t i = 0; i < nk; i++) off += w[kids[i]];
    if (nsmall) {
      stack[sn++] = (lo_pending_t){.node = cur.node, .parent = self_index, .depth = cur.depth + 1,
                                   .nsmall = (uint32_t)(nsmall > UINT32_MAX ? UINT32_MAX : nsmall),
                                   .kind = MS__FRAME_SMALL, .offset = off, .width = small_w,
                                   .before = small_b, .after = small_a};
    }
    for (size_t i = nk; i-- > 0;) {
      uint32_t c = kids[i];
      off -= w[c];
      stack[sn++] = (lo_pending_t){.node = c, .parent = self_index, .depth = cur.depth + 1,
                                   .offset = off, .width = w[c],
                                   .before = t->diff ? t->btotal[c] : t->total[c],
                                   .after = t->total[c]};
    }
  }
  goto out;
nomem:
  err = MS_ENOMEM;
out:
  free(w);
  free(stack);
  free(kids);
  if (err) ms__layout_release(lo);
  return err;
}

void ms__layout_release(ms__layout_t *lo) {
  free(lo->frames);
  memset(lo, 0, sizeof *lo);
}

/* ---- colours ---- */

static int ends_with(const char *s, size_t len, const char *suffix) {
  size_t n = strlen(suffix);
  return len >= n && memcmp(s + len - n, suffix, n) == 0;
}

static int contains(const char *s, size_t len, const char *needle) {
  size_t n = strlen(needle);
  if (n > len) return 0;
  for (size_t i = 0; i + n <= len; i++)
    if (memcmp(s + i, needle, n) == 0) return 1;
  return 0;
}

/* flamegraph.pl's --hash idea: the first three characters decide, the earlier the heavier, so
 * names that start alike get alike colours. from_end reads the name backwards. */
static double lo_early_hash(const char *s, size_t len, int from_end) {
  double vector = 0, weight = 1, max = 1;
  unsigned mod = 10;
  for (size_t i = 0; i < 3 && i < len; i++) {
    unsigned char c = (unsigned char)(from_end ? s[len - 1 - i] : s[i]);
    vector += ((double)(c % mod) / (double)(mod - 1)) * weight;
    mod++;
    max += weight;
    weight *= 0.70;
  }
  return 1.0 - vector / max;
}

static void lo_rgb(char *buf, size_t cap, double r, double g, double b) {
  snprintf(buf, cap, "rgb(%d,%d,%d)", (int)r, (int)g, (int)b);
}

/* The fixed colours of the memory views' frames (stream, segment, block state, only_*),
 * indexed by ms__legend_key - MS__LEG_ALLOCATED. */
static const struct {
  const char *name;
  const char *rgb;
} lo_memory_fixed[] = {
    {"active_allocated", "rgb(224,82,62)"}, {"active_pending_free", "rgb(245,166,35)"},
    {"inactive", "rgb(110,168,222)"},       {"<gaps>", "rgb(150,150,150)"},
    {"<non-python>", "rgb(196,184,150)"},   {"only_before", "rgb(86,110,214)"},
    {"only_after", "rgb(52,168,83)"},       {"stream_", "rgb(160,160,196)"},
    {"seg_", "rgb(186,186,214)"},
};

int ms__color_memory_key(const char *s, size_t len) {
  for (size_t i = 0; i < 7; i++) {
    if (strlen(lo_memory_fixed[i].name) == len && memcmp(lo_memory_fixed[i].name, s, len) == 0)
      return MS__LEG_ALLOCATED + (int)i;
  }
  if (len == 12 && memcmp(s, "<no-context>", 12) == 0) return MS__LEG_NOSTACK;
  if (len > 7 && memcmp(s, "stream_", 7) == 0) return MS__LEG_STREAM;
  if (len > 4 && memcmp(s, "seg_", 4) == 0) return MS__LEG_SEGMENT;
  return MS__LEG_NONE;
}

const char *ms__color_memory_rgb(int key) {
  return lo_memory_fixed[key - MS__LEG_ALLOCATED].rgb;
}

ms_flame_palette ms__color_hue(ms_flame_palette pal, const char *s, size_t len) {
  if (pal == MS_FLAME_PALETTE_WAKEUP) return MS_FLAME_PALETTE_AQUA;
  if (pal == MS_FLAME_PALETTE_CHAIN)
    return ends_with(s, len, "_[w]") ? MS_FLAME_PALETTE_AQUA : MS_FLAME_PALETTE_BLUE;
  if (pal != MS_FLAME_PALETTE_JAVA && pal != MS_FLAME_PALETTE_JS && pal != MS_FLAME_PALETTE_PERL)
    return pal;
  /* Multi palettes pick a hue from annotations and name patterns. */
  if (ends_with(s, len, "_[k]")) return MS_FLAME_PALETTE_ORANGE;
  if (ends_with(s, len, "_[j]")) return MS_FLAME_PALETTE_GREEN;
  if (ends_with(s, len, "_[i]")) return MS_FLAME_PALETTE_AQUA;
  if (pal == MS_FLAME_PALETTE_JAVA)
    return (contains(s, len, "java/") || contains(s, len, "javax/") || contains(s, len, "jdk/") ||
            contains(s, len, "sun/") || contains(s, len, "org/") || contains(s, len, "com/"))
               ? MS_FLAME_PALETTE_GREEN
           : contains(s, len, "::") ? MS_FLAME_PALETTE_YELLOW
                                    : MS_FLAME_PALETTE_RED;
  if (pal == MS_FLAME_PALETTE_JS)
    return (contains(s, len, ".js") || contains(s, len, "/")) ? MS_FLAME_PALETTE_GREEN
           : contains(s, len, "::")                          ? MS_FLAME_PALETTE_YELLOW
                                                             : MS_FLAME_PALETTE_RED;
  /* perl */
  return (contains(s, len, ".pl") || contains(s, len, ".pm") || contains(s, len, "::"))
             ? MS_FLAME_PALETTE_GREEN
         : contains(s, len, ".c:") ? MS_FLAME_PALETTE_YELLOW
                                   : MS_FLAME_PALETTE_RED;
}

void ms__color_shade(ms_flame_palette pal, double v1, double v2, double v3, char *buf,
                     size_t cap) {
  switch (pal) {
  case MS_FLAME_PALETTE_MEM: lo_rgb(buf, cap, 0, 190 + 50 * v2, 210 * v1); break;
  case MS_FLAME_PALETTE_IO: lo_rgb(buf, cap, 80 + 60 * v1, 80 + 60 * v1, 190 + 55 * v2); break;
  case MS_FLAME_PALETTE_RED: lo_rgb(buf, cap, 200 + 55 * v1, 50 + 80 * v1, 50 + 80 * v1); break;
  case MS_FLAME_PALETTE_GREEN: lo_rgb(buf, cap, 50 + 60 * v1, 200 + 55 * v1, 50 + 60 * v1); break;
  case MS_FLAME_PALETTE_BLUE: lo_rgb(buf, cap, 80 + 60 * v1, 80 + 60 * v1, 205 + 50 * v1); break;
  case MS_FLAME_PALETTE_YELLOW:
    lo_rgb(buf, cap, 175 + 55 * v1, 175 + 55 * v1, 50 + 20 * v1);
    break;
  case MS_FLAME_PALETTE_PURPLE:
    lo_rgb(buf, cap, 190 + 65 * v1, 80 + 60 * v1, 190 + 65 * v1);
    break;
  case MS_FLAME_PALETTE_AQUA: lo_rgb(buf, cap, 50 + 60 * v1, 165 + 55 * v1, 165 + 55 * v1); break;
  case MS_FLAME_PALETTE_ORANGE: lo_rgb(buf, cap, 190 + 65 * v1, 90 + 65 * v1, 0); break;
  case MS_FLAME_PALETTE_HOT:
  default: lo_rgb(buf, cap, 205 + 50 * v3, 230 * v1, 55 * v2); break;
  }
}

void ms__color_name(ms_flame_palette pal, int flamegraph_hash, int memory, const char *s,
                    size_t len, char *buf, size_t cap) {
  int key = memory ? ms__color_memory_key(s, len) : MS__LEG_NONE;
  if (key != MS__LEG_NONE) {
    snprintf(buf, cap, "%s", ms__color_memory_rgb(key));
    return;
  }
  if ((len == 1 && s[0] == '-') || (len == 2 && s[0] == '-' && s[1] == '-')) {
    lo_rgb(buf, cap, 160, 160, 160); /* flamegraph.pl's separator frames */
    return;
  }
  double v1, v2, v3;
  if (flamegraph_hash) {
    v1 = lo_early_hash(s, len, 0);
    v2 = v3 = lo_early_hash(s, len, 1);
  } else {
    uint64_t h = ms__viz_hash(s, len);
    v1 = (double)(h & 0xffff) / 65535.0;
    v2 = (double)((h >> 16) & 0xffff) / 65535.0;
    v3 = (double)((h >> 32) & 0xffff) / 65535.0;
  }
  ms__color_shade(ms__color_hue(pal, s, len), v1, v2, v3, buf, cap);
}

int ms__color_diff_key(uint64_t before, uint64_t after) {
  if (before == after) return MS__LEG_UNCHANGED;
  if (before == 0) return MS__LEG_NEW;
  if (after == 0) return MS__LEG_GONE;
  return after > before ? MS__LEG_GREW : MS__LEG_SHRANK;
}

void ms__color_diff(uint64_t before, uint64_t after, uint64_t max_delta, char *buf, size_t cap) {
  switch (ms__color_diff_key(before, after)) {
  case MS__LEG_NEW: snprintf(buf, cap, MS__COLOR_NEW); return;
  case MS__LEG_GONE: snprintf(buf, cap, MS__COLOR_GONE); return;
  case MS__LEG_UNCHANGED: snprintf(buf, cap, MS__COLOR_UNCHANGED); return;
  default: break;
  }
  uint64_t d = after > before ? after - before : before - after;
  double f = max_delta ? (double)d / (double)max_delta : 1.0;
  if (f > 1) f = 1;
  ms__color_change(after > before, f, buf, cap);
}

void ms__color_change(int grew, double f, char *buf, size_t cap) {
  double shade = 210.0 - 170.0 * (0.25 + 0.75 * f);
  if (grew) lo_rgb(buf, cap, 255, shade, shade);
  else lo_rgb(buf, cap, shade, shade, 255);
}
