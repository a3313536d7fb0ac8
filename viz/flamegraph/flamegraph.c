/* SPDX-License-Identifier: MIT
 * memsnap viz: the flame-graph builder of include/memsnap/viz.h, and the page it writes.
 *
 * The page keeps flamegraph.pl's geometry (10 px side padding, a title band of three font
 * heights, frames of frame_height - 1 px with rounded corners, labels cut to fit with "..") and
 * its page contract (see page.c). Everything that varies with the input goes into attributes or
 * text nodes written by the XML writer (svg.c): names, the title, the count name and the name
 * type are never part of the CSS or the script. Output is a pure function of the stacks and the
 * options, so the same input gives the same bytes.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flamegraph/internal.h"

#define FG_XPAD 10.0

int ms__viz_errbuf(ms_errbuf_t *eb, int err, const char *fmt, ...) {
  if (eb) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
    va_end(ap);
  }
  return err;
}

/* ---- options and lifetime ---- */

static const char *const fg_palette_names[MS_FLAME_PALETTE_COUNT_] = {
    "hot", "mem",   "io",    "wakeup", "chain",  "java",   "js",     "perl",
    "red", "green", "blue",  "aqua",   "yellow", "purple", "orange",
};

int ms_flame_palette_parse(const char *name, ms_flame_palette *out) {
  if (!name || !out) return MS_EINVAL;
  for (int i = 0; i < MS_FLAME_PALETTE_COUNT_; i++) {
    if (strcmp(name, fg_palette_names[i]) == 0) {
      *out = (ms_flame_palette)i;
      return MS_OK;
    }
  }
  return MS_ENOTFOUND;
}

const char *ms_flame_palette_name(ms_flame_palette p) {
  return (unsigned)p < MS_FLAME_PALETTE_COUNT_ ? fg_palette_names[p] : "unknown";
}

void ms_flame_options_init(ms_flame_options_t *o) {
  memset(o, 0, sizeof *o);
  o->width = 1200;
  o->frame_height = 16;
  o->font_type = "Verdana";
  o->font_size = 12;
  o->font_width = 0.59;
  o->minwidth = 0.1;
  o->countname = "bytes";
  o->nametype = "Function:";
  o->colors = MS_FLAME_PALETTE_HOT;
}

static int fg_dup(const char *s, char **out) {
  if (!s) {
    *out = NULL;
    return MS_OK;
  }
  *out = strdup(s);
  return *out ? MS_OK : MS_ENOMEM;
}

int ms_flame_create(const ms_flame_options_t *opts, ms_flame_t **out) {
  ms_flame_options_t o;
  if (!out) return MS_EINVAL;
  if (opts) o = *opts;
  else ms_flame_options_init(&o);
  if (o.width == 0) o.width = 1200;
  if (o.frame_height == 0) o.frame_height = 16;
  if (o.width < 2 * FG_XPAD + 1 || o.width > 1000000 || o.frame_height > 10000) return MS_EINVAL;
  if (!(o.font_size > 0 && o.font_size <= 1000) || !(o.font_width > 0 && o.font_width <= 10))
    return MS_EINVAL;
  if (!(o.minwidth >= 0 && o.minwidth <= 1e9) || !(o.minwidth_pct >= 0 && o.minwidth_pct <= 100))
    return MS_EINVAL;
  if ((unsigned)o.colors >= MS_FLAME_PALETTE_COUNT_) return MS_EINVAL;
  ms_flame_t *fl = calloc(1, sizeof *fl);
  if (!fl) return MS_ENOMEM;
  int err = fg_dup(o.title, &fl->title);
  if (!err) err = fg_dup(o.subtitle, &fl->subtitle);
  if (!err) err = fg_dup(o.font_type ? o.font_type : "Verdana", &fl->font_type);
  if (!err) err = fg_dup(o.countname ? o.countname : "bytes", &fl->countname);
  if (!err) err = fg_dup(o.nametype ? o.nametype : "Function:", &fl->nametype);
  if (!err) err = ms__ftree_init(&fl->tree, o.flamechart != 0);
  if (err) {
    ms_flame_destroy(fl);
    return err;
  }
  /* The tooltip's statistics are " (...)" after the name and the page strips them to find the
   * name, so they must hold no parentheses: a count name's become brackets. */
  for (char *c = fl->countname; *c; c++) {
    if (*c == '(') *c = '[';
    if (*c == ')') *c = ']';
  }
  o.title = fl->title;
  o.subtitle = fl->subtitle;
  o.font_type = fl->font_type;
  o.countname = fl->countname;
  o.nametype = fl->nametype;
  fl->opts = o;
  *out = fl;
  return MS_OK;
}

void ms_flame_destroy(ms_flame_t *fl) {
  if (!fl) return;
  ms__ftree_release(&fl->tree);
  ms__folded_release(&fl->folded);
  free(fl->title);
  free(fl->subtitle);
  free(fl->font_type);
  free(fl->countname);
  free(fl->nametype);
  free(fl);
}

/* ---- adding stacks ---- */

static int fg_add(ms_flame_t *fl, const char *const *frames, size_t n, uint64_t before,
                  uint64_t after) {
  ms__folded_t *f = &fl->folded;
  if (n > MS__VIZ_MAX_NODES) return MS_ELIMIT;
  for (size_t i = 0; i < n; i++)
    if (!frames[i]) return MS_EINVAL;
  if (n > f->fcap) {
    size_t cap = f->fcap ? f->fcap : 64;
    while (cap < n) cap *= 2;
    const char **p = realloc(f->fptr, cap * sizeof *p);
    if (!p) return MS_ENOMEM;
    f->fptr = p;
    size_t *l = realloc(f->flen, cap * sizeof *l);
    if (!l) return MS_ENOMEM;
    f->flen = l;
    f->fcap = cap;
  }
  for (size_t i = 0; i < n; i++) {
    f->fptr[i] = frames[i];
    f->flen[i] = strlen(frames[i]);
  }
  f->prev_frames = 0; /* the tree's path scratch no longer holds the last folded line */
  f->prev_ext = NULL;
  return ms__ftree_add(&fl->tree, f->fptr, f->flen, n, 0, fl->opts.reverse, before, after);
}

int ms_flame_add(ms_flame_t *fl, const char *const *frames, size_t nframes, uint64_t value) {
  if (!fl || (!frames && nframes)) return MS_EINVAL;
  if (fl->tree.diff) return MS_ESTATE;
  MS_FORWARD_ERR(fg_add(fl, frames, nframes, 0, value));
  fl->has_plain = 1;
  return MS_OK;
}

int ms_flame_add_diff(ms_flame_t *fl, const char *const *frames, size_t nframes, uint64_t before,
                      uint64_t after) {
  if (!fl || (!frames && nframes)) return MS_EINVAL;
  if (fl->has_plain) return MS_ESTATE;
  MS_FORWARD_ERR(ms__ftree_make_diff(&fl->tree));
  return fg_add(fl, frames, nframes, before, after);
}

int ms_flame_is_diff(const ms_flame_t *fl) { return fl && fl->tree.diff; }

uint64_t ms_flame_total(const ms_flame_t *fl) {
  if (!fl) return 0;
  if (!fl->tree.diff) return fl->tree.total[0];
  uint64_t *w = malloc(fl->tree.n * sizeof *w);
  if (!w) return fl->tree.total[0] > fl->tree.btotal[0] ? fl->tree.total[0] : fl->tree.btotal[0];
  ms__ftree_widths(&fl->tree, w);
  uint64_t v = w[0];
  free(w);
  return v;
}

/* ---- the SVG page ---- */

typedef struct fg_page {
  const ms_flame_t *fl;
  const ms__layout_t *lo;
  ms__svg_t *w;
  double W, H, ypad1, ypad2, scale; /* scale: px per value unit */
  uint64_t max_delta;
  ms__legend_t legend; /* drawn under the details line; legend.height adds to ypad2 */
  int bytes; /* countname is "bytes": add human units */
  char *nbuf; /* sanitized name */
  size_t ncap;
} fg_page_t;

/* "1.5 MiB, 1,572,864 bytes" or "1,234 samples" */
static void fg_amount(const fg_page_t *pg, uint64_t v, const char *sign, char *buf, size_t cap) {
  char c[40], h[40];
  ms__fmt_count(v, c, sizeof c);
  if (pg->bytes) {
    ms__fmt_bytes(v, h, sizeof h);
    snprintf(buf, cap, "%s%s, %s%s bytes", sign, h, sign, c);
  } else {
    snprintf(buf, cap, "%s%s %s", sign, c, pg->fl->countname);
  }
}

/* The tooltip's statistics, without parentheses (the script strips " (...)" to get the name). */
static void fg_stats(const fg_page_t *pg, const ms__frame_t *f, char *buf, size_t cap) {
  char a[160], b[160], d[160];
  if (!pg->fl->tree.diff) {
    fg_amount(pg, f->width, "", a, sizeof a);
    double pr = pg->lo->root_width ? 100.0 * (double)f->width / (double)pg->lo->root_width : 0;
    if (f->parent == MS__VIZ_NONE) {
      snprintf(buf, cap, " (%s, %.2f%% of all)", a, pr);
    } else {
      uint64_t pw = pg->lo->frames[f->parent].width;
      double pp = pw ? 100.0 * (double)f->width / (double)pw : 0;
      snprintf(buf, cap, " (%s, %.2f%% of all, %.2f%% of parent)", a, pr, pp);
    }
    return;
  }
  fg_amount(pg, f->before, "", a, sizeof a);
  fg_amount(pg, f->after, "", b, sizeof b);
  const char *what;
  char pct[48];
  if (f->after > f->before) {
    fg_amount(pg, f->after - f->before, "+", d, sizeof d);
    what = f->before == 0 ? "new" : "grew";
  } else if (f->after < f->before) {
    fg_amount(pg, f->before - f->after, "-", d, sizeof d);
    what = f->after == 0 ? "gone" : "shrank";
  } else {
    fg_amount(pg, 0, "", d, sizeof d);
    what = "unchanged";
  }
  if (f->before == 0) snprintf(pct, sizeof pct, "%s", "");
  else
    snprintf(pct, sizeof pct, ", %+.2f%%",
             100.0 * ((double)f->after - (double)f->before) / (double)f->before);
  snprintf(buf, cap, " (before %s; after %s; change %s%s; %s)", a, b, d, pct, what);
}

static int fg_frame(fg_page_t *pg, const ms__frame_t *f) {
  const ms_flame_t *fl = pg->fl;
  const ms_flame_options_t *o = &fl->opts;
  ms__svg_t *w = pg->w;
  char small[64], stats[600], fill[32];
  const char *name;
  size_t len;
  if (f->kind == MS__FRAME_SMALL) {
    snprintf(small, sizeof small, "[%u small frame%s]", f->nsmall, f->nsmall == 1 ? "" : "s");
    name = small;
    len = strlen(small);
  } else {
    ms__viz_str_t s = ms__ftree_name(&fl->tree, f->node);
    name = s.ptr;
    len = s.len;
    if (len == 0) { /* an empty frame name (heaptrack writes them) reads as flamegraph.pl's */
      name = "[unknown]";
      len = strlen(name);
    }
  }
  size_t ncp = 0;
  size_t slen = ms__text_sanitize(name, len, &pg->nbuf, &pg->ncap, &ncp);
  if (slen == (size_t)-1) return MS_ENOMEM;

  double x = FG_XPAD + (double)f->offset * pg->scale;
  double wpx = (double)f->width * pg->scale;
  double fh = o->frame_height, y1, y2;
  if (o->inverted) {
    y1 = pg->ypad1 + f->depth * fh;
    y2 = pg->ypad1 + (f->depth + 1) * fh - 1;
  } else {
    y1 = pg->H - pg->ypad2 - (f->depth + 1) * fh + 1;
    y2 = pg->H - pg->ypad2 - f->depth * fh;
  }
  if (f->kind == MS__FRAME_SMALL) snprintf(fill, sizeof fill, "%s", MS__COLOR_SMALL);
  else if (fl->tree.diff) ms__color_diff(f->before, f->after, pg->max_delta, fill, sizeof fill);
  else ms__color_name(o->colors, o->hash, o->memory, name, len, fill, sizeof fill);
  fg_stats(pg, f, stats, sizeof stats);

  MS_FORWARD_ERR(ms__svg_start(w, "g"));
  if (f->kind == MS__FRAME_SMALL) MS_FORWARD_ERR(ms__svg_attr(w, "class", "small"));
  MS_FORWARD_ERR(ms__svg_start(w, "title"));
  MS_FORWARD_ERR(ms__svg_text(w, pg->nbuf, slen));
  MS_FORWARD_ERR(ms__svg_text(w, stats, strlen(stats)));
  MS_FORWARD_ERR(ms__svg_end(w));
  MS_FORWARD_ERR(ms__svg_start(w, "rect"));
  MS_FORWARD_ERR(ms__svg_attrf(w, "x", "%.1f", x));
  MS_FORWARD_ERR(ms__svg_attrf(w, "y", "%.1f", y1));
  MS_FORWARD_ERR(ms__svg_attrf(w, "width", "%.1f", wpx));
  MS_FORWARD_ERR(ms__svg_attrf(w, "height", "%.1f", y2 - y1));
  MS_FORWARD_ERR(ms__svg_attr(w, "fill", fill));
  MS_FORWARD_ERR(ms__svg_attr(w, "rx", "2"));
  MS_FORWARD_ERR(ms__svg_attr(w, "ry", "2"));
  MS_FORWARD_ERR(ms__svg_attrf(w, "data-o", "%llu", (unsigned long long)f->offset));
  MS_FORWARD_ERR(ms__svg_attrf(w, "data-v", "%llu", (unsigned long long)f->width));
  if (fl->tree.diff) {
    MS_FORWARD_ERR(ms__svg_attrf(w, "data-b", "%llu", (unsigned long long)f->before));
    MS_FORWARD_ERR(ms__svg_attrf(w, "data-a", "%llu", (unsigned long long)f->after));
  }
  MS_FORWARD_ERR(ms__svg_end(w));
  MS_FORWARD_ERR(ms__svg_start(w, "text"));
  MS_FORWARD_ERR(ms__svg_attrf(w, "x", "%.1f", x + 3));
  MS_FORWARD_ERR(ms__svg_attrf(w, "y", "%.1f", 3 + (y1 + y2) / 2));
  /* The label: the name cut to what fits, as flamegraph.pl estimates glyph widths. */
  double chars = floor(wpx / (o->font_size * o->font_width));
  if (chars >= 3) {
    if ((double)ncp <= chars) {
      MS_FORWARD_ERR(ms__svg_text(w, pg->nbuf, slen));
    } else {
      size_t keep = ms__text_prefix(pg->nbuf, slen, (size_t)chars - 2);
      MS_FORWARD_ERR(ms__svg_text(w, pg->nbuf, keep));
      MS_FORWARD_ERR(ms__svg_text(w, "..", 2));
    }
  }
  MS_FORWARD_ERR(ms__svg_end(w)); /* text */
  MS_FORWARD_ERR(ms__svg_end(w)); /* g */
  return ms__svg_raw(w, "\n");
}

static int fg_text(ms__svg_t *w, const char *id, const char *cls, double x, double y,
                   const char *text, char **buf, size_t *cap) {
  MS_FORWARD_ERR(ms__svg_start(w, "text"));
  MS_FORWARD_ERR(ms__svg_attr(w, "id", id));
  if (cls) MS_FORWARD_ERR(ms__svg_attr(w, "class", cls));
  MS_FORWARD_ERR(ms__svg_attrf(w, "x", "%.2f", x));
  MS_FORWARD_ERR(ms__svg_attrf(w, "y", "%.2f", y));
  size_t n = ms__text_sanitize(text, strlen(text), buf, cap, NULL);
  if (n == (size_t)-1) return MS_ENOMEM;
  MS_FORWARD_ERR(ms__svg_text(w, *buf, n));
  MS_FORWARD_ERR(ms__svg_end(w));
  return ms__svg_raw(w, "\n");
}

/* Writes an attribute whose value comes from the user: sanitized like names. */
static int fg_attr_data(fg_page_t *pg, const char *name, const char *value) {
  size_t n = ms__text_sanitize(value, strlen(value), &pg->nbuf, &pg->ncap, NULL);
  if (n == (size_t)-1) return MS_ENOMEM;
  return ms__svg_attr(pg->w, name, pg->nbuf);
}

/* The search result line, right-aligned at the margin, so that a long "Matched: 222.0 MiB,
 * 232,783,872 bytes, 100.00%" stays inside the image (flamegraph.pl starts its short one 100 px
 * before the margin); the page's script shortens it when it is too long. */
static int fg_matched(ms__svg_t *w, double x, double y) {
  MS_FORWARD_ERR(ms__svg_start(w, "text"));
  MS_FORWARD_ERR(ms__svg_attr(w, "id", "matched"));
  MS_FORWARD_ERR(ms__svg_attr(w, "class", "hide"));
  MS_FORWARD_ERR(ms__svg_attrf(w, "x", "%.2f", x));
  MS_FORWARD_ERR(ms__svg_attrf(w, "y", "%.2f", y));
  MS_FORWARD_ERR(ms__svg_attr(w, "text-anchor", "end"));
  MS_FORWARD_ERR(ms__svg_text(w, " ", 1));
  MS_FORWARD_ERR(ms__svg_end(w));
  return ms__svg_raw(w, "\n");
}

static int fg_page(fg_page_t *pg) {
  const ms_flame_t *fl = pg->fl;
  const ms_flame_options_t *o = &fl->opts;
  const ms__layout_t *lo = pg->lo;
  ms__svg_t *w = pg->w;
  double fs = o->font_size;
  const char *title = o->title;
  if (!title) {
    title = fl->tree.diff ? "Differential Flame Graph"
            : o->flamechart ? "Flame Chart"
            : o->inverted   ? "Icicle Graph"
                            : "Flame Graph";
  }
  MS_FORWARD_ERR(ms__svg_doctype(w, "svg", "-//W3C//DTD SVG 1.1//EN",
                                 "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd"));
  MS_FORWARD_ERR(ms__svg_start(w, "svg"));
  MS_FORWARD_ERR(ms__svg_attr(w, "version", "1.1"));
  MS_FORWARD_ERR(ms__svg_attrf(w, "width", "%u", o->width));
  MS_FORWARD_ERR(ms__svg_attrf(w, "height", "%.0f", pg->H));
  MS_FORWARD_ERR(ms__svg_attr(w, "onload", "init(evt)"));
  MS_FORWARD_ERR(ms__svg_attrf(w, "viewBox", "0 0 %u %.0f", o->width, pg->H));
  MS_FORWARD_ERR(ms__svg_attr(w, "xmlns", "http://www.w3.org/2000/svg"));
  MS_FORWARD_ERR(ms__svg_attr(w, "xmlns:xlink", "http://www.w3.org/1999/xlink"));
  MS_FORWARD_ERR(fg_attr_data(pg, "font-family", o->font_type));
  MS_FORWARD_ERR(ms__svg_attrf(w, "font-size", "%g", fs));
  MS_FORWARD_ERR(ms__svg_attrf(w, "data-xpad", "%g", FG_XPAD));
  MS_FORWARD_ERR(ms__svg_attrf(w, "data-fontsize", "%g", fs));
  MS_FORWARD_ERR(ms__svg_attrf(w, "data-fontwidth", "%g", o->font_width));
  MS_FORWARD_ERR(ms__svg_attrf(w, "data-total", "%llu", (unsigned long long)lo->root_width));
  MS_FORWARD_ERR(ms__svg_attr(w, "data-inverted", o->inverted ? "1" : "0"));
  MS_FORWARD_ERR(ms__svg_attr(w, "data-diff", fl->tree.diff ? "1" : "0"));
  MS_FORWARD_ERR(fg_attr_data(pg, "data-countname", o->countname));
  MS_FORWARD_ERR(fg_attr_data(pg, "data-nametype", o->nametype));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  MS_FORWARD_ERR(ms__svg_comment(w, " Flame graph written by memsnap; see docs/flamegraph.md "));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  MS_FORWARD_ERR(ms__svg_start(w, "defs"));
  MS_FORWARD_ERR(ms__svg_start(w, "linearGradient"));
  MS_FORWARD_ERR(ms__svg_attr(w, "id", "background"));
  MS_FORWARD_ERR(ms__svg_attr(w, "y1", "0"));
  MS_FORWARD_ERR(ms__svg_attr(w, "y2", "1"));
  MS_FORWARD_ERR(ms__svg_attr(w, "x1", "0"));
  MS_FORWARD_ERR(ms__svg_attr(w, "x2", "0"));
  static const char *const stops[2][2] = {{"#eeeeee", "5%"}, {"#eeeeb0", "95%"}};
  for (int i = 0; i < 2; i++) {
    MS_FORWARD_ERR(ms__svg_start(w, "stop"));
    MS_FORWARD_ERR(ms__svg_attr(w, "stop-color", stops[i][0]));
    MS_FORWARD_ERR(ms__svg_attr(w, "offset", stops[i][1]));
    MS_FORWARD_ERR(ms__svg_end(w));
  }
  MS_FORWARD_ERR(ms__svg_end(w)); /* linearGradient */
  MS_FORWARD_ERR(ms__svg_end(w)); /* defs */
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  MS_FORWARD_ERR(ms__svg_start(w, "style"));
  MS_FORWARD_ERR(ms__svg_attr(w, "type", "text/css"));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  MS_FORWARD_ERR(ms__svg_cdata(w, ms__page_css));
  MS_FORWARD_ERR(ms__svg_end(w));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  MS_FORWARD_ERR(ms__svg_start(w, "script"));
  MS_FORWARD_ERR(ms__svg_attr(w, "type", "text/ecmascript"));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  MS_FORWARD_ERR(ms__svg_cdata(w, ms__page_script));
  MS_FORWARD_ERR(ms__svg_end(w));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  MS_FORWARD_ERR(ms__svg_start(w, "rect"));
  MS_FORWARD_ERR(ms__svg_attr(w, "x", "0"));
  MS_FORWARD_ERR(ms__svg_attr(w, "y", "0"));
  MS_FORWARD_ERR(ms__svg_attrf(w, "width", "%u", o->width));
  MS_FORWARD_ERR(ms__svg_attrf(w, "height", "%.0f", pg->H));
  MS_FORWARD_ERR(ms__svg_attr(w, "fill", "url(#background)"));
  MS_FORWARD_ERR(ms__svg_end(w));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));

  /* Controls (ids as flamegraph.pl's). */
  MS_FORWARD_ERR(ms__svg_start(w, "text"));
  MS_FORWARD_ERR(ms__svg_attr(w, "id", "title"));
  MS_FORWARD_ERR(ms__svg_attrf(w, "x", "%.2f", o->width / 2.0));
  MS_FORWARD_ERR(ms__svg_attrf(w, "y", "%.2f", fs * 2));
  MS_FORWARD_ERR(ms__svg_attrf(w, "font-size", "%g", fs + 5));
  size_t n = ms__text_sanitize(title, strlen(title), &pg->nbuf, &pg->ncap, NULL);
  if (n == (size_t)-1) return MS_ENOMEM;
  MS_FORWARD_ERR(ms__svg_text(w, pg->nbuf, n));
  MS_FORWARD_ERR(ms__svg_end(w));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  if (o->subtitle)
    MS_FORWARD_ERR(fg_text(w, "subtitle", NULL, o->width / 2.0, fs * 4, o->subtitle, &pg->nbuf,
                           &pg->ncap));
  /* the details line sits in the bottom band above the legend */
  double bottom = pg->H - pg->legend.height - (pg->ypad2 - pg->legend.height) / 2;
  MS_FORWARD_ERR(fg_text(w, "details", NULL, FG_XPAD, bottom, " ", &pg->nbuf, &pg->ncap));
  MS_FORWARD_ERR(fg_text(w, "unzoom", "hide", FG_XPAD, fs * 2, "Reset Zoom", &pg->nbuf,
                         &pg->ncap));
  MS_FORWARD_ERR(fg_text(w, "search", NULL, o->width - FG_XPAD - 100, fs * 2, "Search",
                         &pg->nbuf, &pg->ncap));
  MS_FORWARD_ERR(fg_text(w, "ignorecase", NULL, o->width - FG_XPAD - 16, fs * 2, "ic",
                         &pg->nbuf, &pg->ncap));
  MS_FORWARD_ERR(fg_matched(w, o->width - FG_XPAD, bottom));
  if (lo->root_width == 0)
    MS_FORWARD_ERR(fg_text(w, "nostacks", NULL, FG_XPAD, pg->ypad1 + fs, "No stacks", &pg->nbuf,
                           &pg->ncap));

  MS_FORWARD_ERR(ms__legend_write(w, &pg->legend, o, pg->H - pg->legend.height + 2));
  MS_FORWARD_ERR(ms__svg_start(w, "g"));
  MS_FORWARD_ERR(ms__svg_attr(w, "id", "frames"));
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  if (lo->root_width > 0) {
    for (size_t i = 0; i < lo->n; i++) MS_FORWARD_ERR(fg_frame(pg, &lo->frames[i]));
  }
  MS_FORWARD_ERR(ms__svg_end(w)); /* frames */
  MS_FORWARD_ERR(ms__svg_raw(w, "\n"));
  MS_FORWARD_ERR(ms__svg_end(w)); /* svg */
  return ms__svg_raw(w, "\n");
}

int ms_flame_write_svg(ms_flame_t *fl, ms_sink_t *sink, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  if (!fl || !sink || !sink->write) return ms__viz_errbuf(eb, MS_EINVAL, "invalid argument");
  const ms_flame_options_t *o = &fl->opts;
  ms__layout_t lo;
  fg_page_t pg = {.fl = fl, .lo = &lo};
  double avail = o->width - 2 * FG_XPAD;
  double minfrac = o->minwidth_pct > 0 ? o->minwidth_pct / 100.0 : o->minwidth / avail;
  int err = ms__layout_build(&fl->tree, minfrac, !o->flamechart, &lo);
  if (err) return ms__viz_errbuf(eb, err, "laying out the flame graph: %s", ms_strerror(err));

  pg.bytes = strcmp(o->countname, "bytes") == 0;
  pg.ypad1 = o->font_size * 3 + (o->subtitle ? o->font_size * 2 : 0);
  ms__legend_collect(fl, &lo, &pg.legend);
  pg.ypad2 = o->font_size * 2 + 10 + pg.legend.height;
  uint32_t depths = lo.root_width ? lo.max_depth + 1 : 2;
  pg.H = ceil(depths * (double)o->frame_height + pg.ypad1 + pg.ypad2);
  pg.W = o->width;
  pg.scale = lo.root_width ? avail / (double)lo.root_width : 0;
  for (size_t i = 0; i < lo.n; i++) {
    uint64_t b = lo.frames[i].before, a = lo.frames[i].after;
    uint64_t d = a > b ? a - b : b - a;
    if (d > pg.max_delta) pg.max_delta = d;
  }
  err = ms__svg_open(sink, &pg.w);
  if (!err) err = fg_page(&pg);
  int cerr = ms__svg_close(pg.w); /* the first error of the whole write, if any */
  if (!err) err = cerr;
  ms__layout_release(&lo);
  free(pg.nbuf);
  if (err) return ms__viz_errbuf(eb, err, "writing the SVG: %s", ms_strerror(err));
  return MS_OK;
}

/* ---- folded export ---- */

typedef struct fg_out {
  ms_sink_t *sink;
  char buf[1 << 16];
  size_t n;
} fg_out_t;

static int fg_out_flush(fg_out_t *out) {
  if (out->n == 0) return MS_OK;
  int err = out->sink->write(out->sink->ctx, out->buf, out->n);
  out->n = 0;
  return err < 0 ? err : err ? MS_EIO : MS_OK;
}

static int fg_out_put(fg_out_t *out, const char *s, size_t len) {
  while (len) {
    if (out->n == sizeof out->buf) MS_FORWARD_ERR(fg_out_flush(out));
    size_t k = sizeof out->buf - out->n;
    if (k > len) k = len;
    memcpy(out->buf + out->n, s, k);
    out->n += k;
    s += k;
    len -= k;
  }
  return MS_OK;
}

static int fg_cmp_name(const void *a, const void *b, void *ctx) {
  const ms__ftree_t *t = ctx;
  ms__viz_str_t x = ms__ftree_name(t, *(const uint32_t *)a);
  ms__viz_str_t y = ms__ftree_name(t, *(const uint32_t *)b);
  size_t n = x.len < y.len ? x.len : y.len;
  int c = n ? memcmp(x.ptr, y.ptr, n) : 0;
  if (c) return c;
  return x.len < y.len ? -1 : x.len > y.len;
}

typedef struct fg_visit {
  uint32_t node, depth;
} fg_visit_t;

int ms_flame_write_folded(ms_flame_t *fl, ms_sink_t *sink, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  if (!fl || !sink || !sink->write) return ms__viz_errbuf(eb, MS_EINVAL, "invalid argument");
  const ms__ftree_t *t = &fl->tree;
  int err = MS_OK;
  fg_out_t *out = malloc(sizeof *out);
  fg_visit_t *stack = malloc(t->n * sizeof *stack);
  uint32_t *path = malloc(t->n * sizeof *path); /* depth can reach n - 1 */
  uint32_t *kids = malloc(t->n * sizeof *kids);
  if (!out || !stack || !path || !kids) {
    err = MS_ENOMEM;
    goto out;
  }
  out->sink = sink;
  out->n = 0;
  size_t sn = 0;
  stack[sn++] = (fg_visit_t){0, 0};
  while (sn > 0 && !err) {
    fg_visit_t v = stack[--sn];
    path[v.depth] = v.node;
    uint64_t self = t->self[v.node], bself = t->diff ? t->bself[v.node] : 0;
    if (v.depth > 0 && (self || bself)) {
      for (uint32_t d = 1; d <= v.depth && !err; d++) {
        ms__viz_str_t s = ms__ftree_name(t, path[d]);
        if (d > 1) err = fg_out_put(out, ";", 1);
        if (!err) err = fg_out_put(out, s.ptr, s.len);
      }
      char num[64];
      int k = t->diff ? snprintf(num, sizeof num, " %llu %llu\n", (unsigned long long)bself,
                                 (unsigned long long)self)
                      : snprintf(num, sizeof num, " %llu\n", (unsigned long long)self);
      if (!err) err = fg_out_put(out, num, (size_t)k);
    }
    size_t nk = 0;
    for (uint32_t c = t->nodes[v.node].child; c != MS__VIZ_NONE; c = t->nodes[c].sibling)
      kids[nk++] = c;
    if (!fl->opts.flamechart && nk > 1) qsort_r(kids, nk, sizeof *kids, fg_cmp_name, (void *)t);
    /* Push so that the first child in graph order is popped first. */
    for (size_t i = 0; i < nk; i++) {
      size_t k = fl->opts.flamechart ? i : nk - 1 - i; /* flame-chart lists are newest first */
      stack[sn++] = (fg_visit_t){kids[k], v.depth + 1};
    }
  }
  if (!err) err = fg_out_flush(out);
out:
  free(out);
  free(stack);
  free(path);
  free(kids);
  if (err) return ms__viz_errbuf(eb, err, "writing folded stacks: %s", ms_strerror(err));
  return MS_OK;
}
