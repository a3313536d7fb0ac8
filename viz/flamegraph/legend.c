/* SPDX-License-Identifier: MIT
 * memsnap viz: the legend of a flame graph whose colours mean something (issue #16, item 10).
 *
 * A graph's colours mean something when it is differential (grew, shrank, new, gone, unchanged),
 * drawn with the memory colours (block states, <gaps>, streams, segments, only_before/after) or
 * with a palette that picks its hue by name (java, js, perl, chain). Such a graph gets a legend
 * row at the bottom of the page, under the details line: one swatch (a rounded rect, as the
 * frames) and one label per colour the graph's frames use, in ms__legend_key order, with
 * "[N small frames]" last when some were gathered. The other palettes colour by a hash of the
 * name, which means nothing, and get no legend. The legend lies outside <g id="frames">: the
 * page's script, zoom and search never see it.
 */
#include <stdio.h>

#include "flamegraph/internal.h"

#define LEG_GAP 16.0 /* px between two entries */

static int leg_multi(ms_flame_palette pal) {
  return pal == MS_FLAME_PALETTE_JAVA || pal == MS_FLAME_PALETTE_JS ||
         pal == MS_FLAME_PALETTE_PERL || pal == MS_FLAME_PALETTE_CHAIN;
}

static const char *leg_label(int key, ms_flame_palette pal) {
  static const char *const fixed[MS__LEG_HUE_RED] = {
      "grew (deeper: more)", "shrank (deeper: more)", "new", "gone", "unchanged",
      "allocated", "pending free", "inactive (cached)", "gaps (not requested)", "no stack",
      "only before", "only after", "stream", "segment"};
  if (key < MS__LEG_HUE_RED) return fixed[key];
  if (key == MS__LEG_SMALL) return "small frames, gathered";
  if (pal == MS_FLAME_PALETTE_CHAIN) return key == MS__LEG_HUE_AQUA ? "waker (_[w])" : "off-CPU";
  switch (key) {
  case MS__LEG_HUE_RED: return "native";
  case MS__LEG_HUE_YELLOW: return pal == MS_FLAME_PALETTE_PERL ? "C" : "C++";
  case MS__LEG_HUE_GREEN:
    return pal == MS_FLAME_PALETTE_JAVA ? "Java, JIT (_[j])"
           : pal == MS_FLAME_PALETTE_JS ? "JavaScript, JIT (_[j])"
                                        : "Perl, JIT (_[j])";
  case MS__LEG_HUE_AQUA: return "inlined (_[i])";
  case MS__LEG_HUE_ORANGE: return "kernel (_[k])";
  default: return "";
  }
}

static const ms_flame_palette leg_hues[] = {MS_FLAME_PALETTE_RED,  MS_FLAME_PALETTE_YELLOW,
                                            MS_FLAME_PALETTE_GREEN, MS_FLAME_PALETTE_AQUA,
                                            MS_FLAME_PALETTE_BLUE, MS_FLAME_PALETTE_ORANGE};

static void leg_color(int key, char *buf, size_t cap) {
  switch (key) {
  case MS__LEG_GREW:
  case MS__LEG_SHRANK: ms__color_change(key == MS__LEG_GREW, 0.5, buf, cap); return;
  case MS__LEG_NEW: snprintf(buf, cap, MS__COLOR_NEW); return;
  case MS__LEG_GONE: snprintf(buf, cap, MS__COLOR_GONE); return;
  case MS__LEG_UNCHANGED: snprintf(buf, cap, MS__COLOR_UNCHANGED); return;
  case MS__LEG_SMALL: snprintf(buf, cap, MS__COLOR_SMALL); return;
  default: break;
  }
  if (key < MS__LEG_HUE_RED) snprintf(buf, cap, "%s", ms__color_memory_rgb(key));
  else ms__color_shade(leg_hues[key - MS__LEG_HUE_RED], 0.5, 0.5, 0.5, buf, cap);
}

/* The key of a frame's colour, or MS__LEG_NONE when it means nothing. */
static int leg_key(const ms_flame_t *fl, const ms__frame_t *f) {
  if (f->kind == MS__FRAME_SMALL) return MS__LEG_SMALL;
  if (fl->tree.diff) return ms__color_diff_key(f->before, f->after);
  if (f->depth == 0) return MS__LEG_NONE; /* "all": no view's name */
  ms__viz_str_t s = ms__ftree_name(&fl->tree, f->node);
  if (fl->opts.memory) {
    int k = ms__color_memory_key(s.ptr, s.len);
    if (k != MS__LEG_NONE) return k;
  }
  if (!leg_multi(fl->opts.colors)) return MS__LEG_NONE;
  if ((s.len == 1 && s.ptr[0] == '-') || (s.len == 2 && s.ptr[0] == '-' && s.ptr[1] == '-'))
    return MS__LEG_NONE; /* separators */
  ms_flame_palette hue = ms__color_hue(fl->opts.colors, s.ptr, s.len);
  for (size_t i = 0; i < sizeof leg_hues / sizeof *leg_hues; i++)
    if (leg_hues[i] == hue) return MS__LEG_HUE_RED + (int)i;
  return MS__LEG_NONE;
}

static double leg_entry_width(const ms_flame_options_t *o, int key) {
  const char *label = leg_label(key, o->colors);
  size_t ncp = 0;
  for (const char *p = label; *p; p++) ncp++; /* the labels are ASCII */
  return o->font_size + 4 + (double)ncp * o->font_size * o->font_width;
}

/* Places the entries in rows (x of each entry; a row ends where the next entry would pass the
 * right margin) and @return the number of rows. */
static int leg_place(const ms__legend_t *lg, const ms_flame_options_t *o, double *x, int *row) {
  double pos = 10, right = o->width - 10.0;
  int rows = 1;
  for (int i = 0; i < lg->n; i++) {
    double wd = leg_entry_width(o, lg->keys[i]);
    if (i > 0 && pos + wd > right) {
      rows++;
      pos = 10;
    }
    if (x) x[i] = pos;
    if (row) row[i] = rows - 1;
    pos += wd + LEG_GAP;
  }
  return rows;
}

void ms__legend_collect(const ms_flame_t *fl, const ms__layout_t *lo, ms__legend_t *lg) {
  memset(lg, 0, sizeof *lg);
  uint8_t present[MS__LEG_COUNT_] = {0};
  if (lo->root_width > 0)
    for (size_t i = 0; i < lo->n; i++) {
      int k = leg_key(fl, &lo->frames[i]);
      if (k != MS__LEG_NONE) present[k] = 1;
    }
  int meaning = 0;
  for (int k = 0; k < MS__LEG_SMALL; k++) meaning |= present[k];
  if (!meaning) return; /* no colour means anything (small frames say what they are) */
  for (int k = 0; k < MS__LEG_COUNT_; k++)
    if (present[k]) lg->keys[lg->n++] = k;
  const ms_flame_options_t *o = &fl->opts;
  lg->row_h = o->font_size + 6;
  lg->height = leg_place(lg, o, NULL, NULL) * lg->row_h + 4;
}

int ms__legend_write(ms__svg_t *w, const ms__legend_t *lg, const ms_flame_options_t *o,
                     double top) {
  if (lg->n == 0) return MS_OK;
  double x[MS__LEG_COUNT_];
  int row[MS__LEG_COUNT_];
  leg_place(lg, o, x, row);
  double fs = o->font_size;
  MS_FORWARD_ERR(ms__svg_start(w, "g"));
  MS_FORWARD_ERR(ms__svg_attr(w, "id", "legend"));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  for (int i = 0; i < lg->n; i++) {
    char fill[32];
    leg_color(lg->keys[i], fill, sizeof fill);
    const char *label = leg_label(lg->keys[i], o->colors);
    double y = top + row[i] * lg->row_h;
    MS_FORWARD_ERR(ms__svg_start(w, "g"));
    MS_FORWARD_ERR(ms__svg_start(w, "rect"));
    MS_FORWARD_ERR(ms__svg_attrf(w, "x", "%.1f", x[i]));
    MS_FORWARD_ERR(ms__svg_attrf(w, "y", "%.1f", y));
    MS_FORWARD_ERR(ms__svg_attrf(w, "width", "%g", fs));
    MS_FORWARD_ERR(ms__svg_attrf(w, "height", "%g", fs));
    MS_FORWARD_ERR(ms__svg_attr(w, "fill", fill));
    MS_FORWARD_ERR(ms__svg_attr(w, "rx", "2"));
    MS_FORWARD_ERR(ms__svg_attr(w, "ry", "2"));
    MS_FORWARD_ERR(ms__svg_end(w));
    MS_FORWARD_ERR(ms__svg_start(w, "text"));
    MS_FORWARD_ERR(ms__svg_attrf(w, "x", "%.1f", x[i] + fs + 4));
    MS_FORWARD_ERR(ms__svg_attrf(w, "y", "%.1f", y + fs - 2));
    MS_FORWARD_ERR(ms__svg_text(w, label, strlen(label)));
    MS_FORWARD_ERR(ms__svg_end(w)); /* text */
    MS_FORWARD_ERR(ms__svg_end(w)); /* g */
    MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  }
  MS_FORWARD_ERR(ms__svg_end(w)); /* legend */
  return ms__svg_raw(w, "\n");
}
