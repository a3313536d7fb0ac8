/* SPDX-License-Identifier: MIT
 * Tests of the flame-graph pipeline (include/memsnap/viz.h, viz/): the SVG is parsed back with
 * libxml2 and checked for its invariants (the root's value is the sum of the counts; every frame
 * equals its children plus its self value; gathering small frames keeps totals), for hostile
 * names coming out as text, for byte-identical output, for the folded reader's errors (by line
 * number) and for differential colours.
 */
#include <criterion/criterion.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <libxml/xpath.h>
#include <libxml/xpathInternals.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flamegraph/internal.h"
#include "helpers.h"
#include "memsnap/viz.h"

/* ---- helpers ---- */

static char *render(ms_flame_t *fl, size_t *len) {
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  int err = ms_flame_write_svg(fl, &sink, &eb);
  cr_assert_eq(err, MS_OK, "write_svg: %s (%s)", ms_strerror(err), eb.msg);
  if (len) *len = m.len;
  return m.data;
}

static char *folded_out(ms_flame_t *fl) {
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  cr_assert_eq(ms_flame_write_folded(fl, &sink, NULL), MS_OK);
  return m.data ? m.data : strdup("");
}

static ms_flame_t *flame_from(const char *text, const ms_flame_options_t *o) {
  ms_flame_t *fl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_flame_create(o, &fl), MS_OK);
  int err = ms_flame_add_folded(fl, text, strlen(text), &eb);
  cr_assert_eq(err, MS_OK, "add_folded: %s", eb.msg);
  cr_assert_eq(ms_flame_finish_folded(fl, &eb), MS_OK, "finish: %s", eb.msg);
  cr_assert(ms__ftree_is_valid(&fl->tree));
  return fl;
}

typedef struct pframe {
  char *title, *name, *label, *fill, *cls;
  double x, y, w;
  unsigned long long o, v, b, a;
  int depth, parent;
} pframe_t;

typedef struct psvg {
  xmlDocPtr doc;
  pframe_t *f;
  int n;
  int scripts;
  double height;
} psvg_t;

static char *attr(xmlNodePtr n, const char *name) {
  xmlChar *v = xmlGetProp(n, BAD_CAST name);
  char *s = v ? strdup((const char *)v) : NULL;
  xmlFree(v);
  return s;
}

static char *content(xmlNodePtr n) {
  xmlChar *v = xmlNodeGetContent(n);
  char *s = strdup(v ? (const char *)v : "");
  xmlFree(v);
  return s;
}

static unsigned long long ull_attr(xmlNodePtr n, const char *name) {
  char *s = attr(n, name);
  unsigned long long v = s ? strtoull(s, NULL, 10) : 0;
  free(s);
  return v;
}

static double dbl_attr(xmlNodePtr n, const char *name) {
  char *s = attr(n, name);
  double v = s ? strtod(s, NULL) : 0;
  free(s);
  return v;
}

static int elem_is(xmlNodePtr n, const char *name) {
  return n->type == XML_ELEMENT_NODE && strcmp((const char *)n->name, name) == 0;
}

static int count_elements(xmlNodePtr n, const char *name) {
  int c = 0;
  for (; n; n = n->next) {
    if (elem_is(n, name)) c++;
    c += count_elements(n->children, name);
  }
  return c;
}

/* Parses an SVG strictly (no network, no entity expansion) and extracts its frames. */
static psvg_t parse_svg(const char *data, size_t len, int inverted) {
  psvg_t p = {0};
  p.doc = xmlReadMemory(data, (int)len, "mem.svg", NULL, XML_PARSE_NONET);
  cr_assert(p.doc, "the SVG is not well-formed XML");
  xmlNodePtr root = xmlDocGetRootElement(p.doc);
  cr_assert(elem_is(root, "svg"));
  p.height = dbl_attr(root, "height");
  p.scripts = count_elements(root, "script");
  xmlNodePtr frames = NULL;
  for (xmlNodePtr c = root->children; c; c = c->next) {
    char *id = elem_is(c, "g") ? attr(c, "id") : NULL;
    if (id && strcmp(id, "frames") == 0) frames = c;
    free(id);
  }
  cr_assert(frames, "no <g id=\"frames\">");
  int cap = 16;
  p.f = calloc((size_t)cap, sizeof *p.f);
  for (xmlNodePtr g = frames->children; g; g = g->next) {
    if (!elem_is(g, "g")) continue;
    if (p.n == cap) {
      cap *= 2;
      p.f = realloc(p.f, (size_t)cap * sizeof *p.f);
    }
    pframe_t *f = &p.f[p.n++];
    memset(f, 0, sizeof *f);
    xmlNodePtr first = g->children;
    while (first && first->type != XML_ELEMENT_NODE) first = first->next;
    cr_assert(first && elem_is(first, "title"), "a frame's first child must be <title>");
    f->title = content(first);
    f->cls = attr(g, "class");
    for (xmlNodePtr c = first->next; c; c = c->next) {
      if (elem_is(c, "rect")) {
        f->x = dbl_attr(c, "x");
        f->y = dbl_attr(c, "y");
        f->w = dbl_attr(c, "width");
        f->o = ull_attr(c, "data-o");
        f->v = ull_attr(c, "data-v");
        f->b = ull_attr(c, "data-b");
        f->a = ull_attr(c, "data-a");
        f->fill = attr(c, "fill");
      } else if (elem_is(c, "text")) {
        f->label = content(c);
      }
    }
    /* The name: the title without its " (...)" statistics. */
    char *paren = strrchr(f->title, '(');
    cr_assert(paren && paren > f->title && paren[-1] == ' ');
    f->name = strndup(f->title, (size_t)(paren - 1 - f->title));
  }
  /* Depth from y (one row per depth; root at the bottom unless inverted), parent from pre-order. */
  for (int i = 0; i < p.n; i++) {
    int d = 0;
    double ys[4096];
    int ny = 0;
    for (int j = 0; j < p.n; j++) {
      int seen = 0;
      for (int k = 0; k < ny; k++) seen |= ys[k] == p.f[j].y;
      if (!seen && ny < 4096) ys[ny++] = p.f[j].y;
    }
    for (int k = 0; k < ny; k++)
      if (inverted ? ys[k] < p.f[i].y : ys[k] > p.f[i].y) d++;
    p.f[i].depth = d;
    p.f[i].parent = -1;
    for (int j = i - 1; j >= 0 && d > 0; j--) {
      if (p.f[j].depth == d - 1) {
        p.f[i].parent = j;
        break;
      }
    }
  }
  return p;
}

static void psvg_free(psvg_t *p) {
  for (int i = 0; i < p->n; i++) {
    free(p->f[i].title);
    free(p->f[i].name);
    free(p->f[i].label);
    free(p->f[i].fill);
    free(p->f[i].cls);
  }
  free(p->f);
  xmlFreeDoc(p->doc);
}

/* Every frame's value is its children's plus a non-negative self value; children lie inside. */
static void check_nesting(const psvg_t *p) {
  for (int i = 0; i < p->n; i++) {
    unsigned long long sum = 0;
    for (int j = 0; j < p->n; j++) {
      if (p->f[j].parent != i) continue;
      sum += p->f[j].v;
      cr_assert(p->f[j].o >= p->f[i].o && p->f[j].o + p->f[j].v <= p->f[i].o + p->f[i].v,
                "child '%s' outside '%s'", p->f[j].name, p->f[i].name);
    }
    cr_assert(sum <= p->f[i].v, "children of '%s' exceed it: %llu > %llu", p->f[i].name, sum,
              p->f[i].v);
  }
}

static const pframe_t *find(const psvg_t *p, const char *name) {
  for (int i = 0; i < p->n; i++)
    if (strcmp(p->f[i].name, name) == 0) return &p->f[i];
  return NULL;
}

static ms_flame_options_t opts_minwidth(double mw) {
  ms_flame_options_t o;
  ms_flame_options_init(&o);
  o.minwidth = mw;
  return o;
}

/* ---- SVG invariants ---- */

static const char basic_folded[] = "main;alloc;cudaMalloc 1000\n"
                                   "main;alloc;cudaMalloc 24\n"
                                   "main;alloc 100\n"
                                   "main;compute;gemm 3000\n"
                                   "main;compute;relu 500\n"
                                   "other 7\n"
                                   "main 11\n";

Test(viz, root_is_sum_and_frames_are_children_plus_self) {
  ms_flame_options_t o = opts_minwidth(0);
  ms_flame_t *fl = flame_from(basic_folded, &o);
  cr_assert_eq(ms_flame_total(fl), 4642);
  size_t len;
  char *svg = render(fl, &len);
  psvg_t p = parse_svg(svg, len, 0);
  cr_assert_eq(p.n, 8);
  cr_assert_str_eq(p.f[0].name, "all");
  cr_assert_eq(p.f[0].v, 1000 + 24 + 100 + 3000 + 500 + 7 + 11);
  check_nesting(&p);
  /* Exact totals and self values, from the input. */
  const struct {
    const char *name;
    unsigned long long total, self;
  } want[] = {{"main", 4635, 11},   {"alloc", 1124, 100}, {"cudaMalloc", 1024, 1024},
              {"compute", 3500, 0}, {"gemm", 3000, 3000}, {"relu", 500, 500},
              {"other", 7, 7}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const pframe_t *f = find(&p, want[i].name);
    cr_assert(f, "frame %s missing", want[i].name);
    cr_expect_eq(f->v, want[i].total, "%s: %llu", want[i].name, f->v);
    unsigned long long kids = 0;
    for (int j = 0; j < p.n; j++)
      if (p.f[j].parent == f - p.f) kids += p.f[j].v;
    cr_expect_eq(f->v - kids, want[i].self, "self of %s", want[i].name);
  }
  /* Children sorted by name, left to right. */
  const pframe_t *alloc = find(&p, "alloc"), *compute = find(&p, "compute");
  cr_assert_lt(alloc->o, compute->o);
  cr_assert_lt(find(&p, "gemm")->o, find(&p, "relu")->o);
  /* Tooltip: name, human and exact bytes, share of all and of the parent. */
  cr_assert_str_eq(find(&p, "gemm")->title,
                   "gemm (2.9 KiB, 3,000 bytes, 64.63% of all, 85.71% of parent)");
  cr_assert_str_eq(p.f[0].title, "all (4.5 KiB, 4,642 bytes, 100.00% of all)");
  cr_assert_eq(p.scripts, 1);
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
}

Test(viz, page_contract_ids_and_no_markup_building) {
  ms_flame_t *fl = flame_from(basic_folded, NULL);
  size_t len;
  char *svg = render(fl, &len);
  const char *ids[] = {"id=\"title\"",  "id=\"details\"", "id=\"unzoom\"", "id=\"search\"",
                       "id=\"ignorecase\"", "id=\"matched\"", "<g id=\"frames\">",
                       "onload=\"init(evt)\""};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    cr_expect(strstr(svg, ids[i]), "missing %s", ids[i]);
  cr_expect_null(strstr(ms__page_script, "innerHTML"));
  cr_expect_null(strstr(ms__page_script, "outerHTML"));
  cr_expect_null(strstr(ms__page_script, "insertAdjacentHTML"));
  cr_expect_null(strstr(ms__page_script, "eval("));
  cr_expect_null(strstr(svg, "http://cdn"));
  cr_expect_null(strstr(svg, "src="), "the page must not load anything");
  cr_expect(strstr(svg, "location.search"), "URL state");
  free(svg);
  ms_flame_destroy(fl);
}

Test(viz, small_frames_are_gathered_and_keep_their_bytes) {
  /* One wide stack and 300 narrow siblings: at 1200 px, 0.1 px is 1/11800 of the total. */
  char *text = malloc(64 * 1024);
  size_t n = 0;
  n += (size_t)sprintf(text + n, "root;big 100000000\n");
  unsigned long long small_sum = 0;
  for (int i = 0; i < 300; i++) {
    n += (size_t)sprintf(text + n, "root;tiny_%03d;leaf 10\n", i);
    small_sum += 10;
  }
  n += (size_t)sprintf(text + n, "root 5\n");
  ms_flame_t *fl = flame_from(text, NULL);
  size_t len;
  char *svg = render(fl, &len);
  psvg_t p = parse_svg(svg, len, 0);
  const pframe_t *root = find(&p, "root");
  cr_assert(root);
  cr_assert_eq(root->v, 100000000ULL + small_sum + 5);
  const pframe_t *small = find(&p, "[300 small frames]");
  cr_assert(small, "no gathered frame");
  cr_assert_str_eq(small->cls, "small");
  cr_assert_eq(small->v, small_sum);
  cr_assert_eq(small->parent, root - p.f);
  cr_assert_null(find(&p, "tiny_000"));
  cr_assert_eq(p.f[0].v, 100000000ULL + small_sum + 5);
  check_nesting(&p);
  cr_assert_eq(p.n, 4); /* all, root, big, [300 small frames] */
  /* --minwidth 0 keeps them all. */
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
  ms_flame_options_t o = opts_minwidth(0);
  fl = flame_from(text, &o);
  svg = render(fl, &len);
  p = parse_svg(svg, len, 0);
  cr_assert_eq(p.n, 3 + 600);
  cr_assert_null(find(&p, "[300 small frames]"));
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
  /* A percentage threshold: 50% gathers everything below the root's half. */
  ms_flame_options_init(&o);
  o.minwidth_pct = 50;
  fl = flame_from("r;a 30\nr;b 30\nr;c 40\n", &o);
  svg = render(fl, &len);
  p = parse_svg(svg, len, 0);
  const pframe_t *g = find(&p, "[3 small frames]");
  cr_assert(g);
  cr_assert_eq(g->v, 100);
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
  free(text);
}

Test(viz, hostile_names_render_as_text) {
  char longname[10001];
  memset(longname, 'x', 10000);
  longname[10000] = 0;
  const char *names[] = {
      "</title><script>alert(1)</script>",
      "<img src=x onerror=alert(2)>",
      "quote\"s and 'single' & ampersand &amp; ]]> <![CDATA[",
      "ctl\x01\x1b[31m\x7f",
      "bad\xff\xfe utf8 \xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80",
      longname,
  };
  ms_flame_t *fl = NULL;
  cr_assert_eq(ms_flame_create(NULL, &fl), MS_OK);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *stack[] = {"top", names[i]};
    cr_assert_eq(ms_flame_add(fl, stack, 2, 1000 + i), MS_OK);
  }
  size_t len;
  char *svg = render(fl, &len);
  cr_assert_null(strstr(svg, "<script>alert"));
  cr_assert_null(strstr(svg, "<img"));
  psvg_t p = parse_svg(svg, len, 0);
  cr_assert_eq(p.scripts, 1, "only the page's own script");
  cr_assert(find(&p, "</title><script>alert(1)</script>"), "name not kept as text");
  cr_assert(find(&p, "<img src=x onerror=alert(2)>"));
  cr_assert(find(&p, "quote\"s and 'single' & ampersand &amp; ]]> <![CDATA["));
  /* Controls become control pictures: U+2401, U+241B, U+2421. */
  cr_assert(find(&p, "ctl\xe2\x90\x81\xe2\x90\x9b[31m\xe2\x90\xa1"));
  /* Invalid UTF-8 becomes U+FFFD, byte by byte. */
  cr_assert(find(&p, "bad\xef\xbf\xbd\xef\xbf\xbd utf8 \xef\xbf\xbd( "
                     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd "
                     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"));
  const pframe_t *lf = find(&p, longname);
  cr_assert(lf, "the 10,000-character name is kept whole in the tooltip");
  cr_assert_lt(strlen(lf->label), 300, "the label is cut to fit");
  cr_assert(strstr(lf->label, ".."));
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
}

Test(viz, hostile_options_are_data) {
  ms_flame_options_t o;
  ms_flame_options_init(&o);
  o.title = "</text><script>alert(3)</script>";
  o.subtitle = "\"><script>alert(4)</script>";
  o.countname = "\"; alert(5); \"";
  o.nametype = "</script><script>alert(6)</script>";
  o.font_type = "Verdana; } * { display: none";
  ms_flame_t *fl = flame_from("a;b 1\n", &o);
  size_t len;
  char *svg = render(fl, &len);
  cr_assert_null(strstr(svg, "<script>alert"));
  psvg_t p = parse_svg(svg, len, 0);
  cr_assert_eq(p.scripts, 1);
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
}

Test(viz, output_is_byte_identical_and_order_independent) {
  ms_flame_t *a = flame_from(basic_folded, NULL);
  ms_flame_t *b = flame_from(basic_folded, NULL);
  /* The same lines in another order. */
  ms_flame_t *c = flame_from("main 11\nother 7\nmain;compute;relu 500\nmain;compute;gemm 3000\n"
                             "main;alloc 100\nmain;alloc;cudaMalloc 24\n"
                             "main;alloc;cudaMalloc 1000\n",
                             NULL);
  size_t la, lb, lc;
  char *sa = render(a, &la), *sb = render(b, &lb), *sc = render(c, &lc);
  char *sa2 = render(a, NULL);
  cr_assert_eq(la, lb);
  cr_assert(memcmp(sa, sb, la) == 0);
  cr_assert_str_eq(sa, sa2);
  cr_assert_eq(la, lc);
  cr_assert(memcmp(sa, sc, la) == 0);
  free(sa);
  free(sb);
  free(sc);
  free(sa2);
  ms_flame_destroy(a);
  ms_flame_destroy(b);
  ms_flame_destroy(c);
}

Test(viz, colours_are_deterministic_per_name) {
  ms_flame_t *a = flame_from("x;shared_name 10\nx;other 5\n", NULL);
  ms_flame_t *b = flame_from("y;z;shared_name 99\n", NULL);
  size_t la, lb;
  char *sa = render(a, &la), *sb = render(b, &lb);
  psvg_t pa = parse_svg(sa, la, 0), pb = parse_svg(sb, lb, 0);
  cr_assert_str_eq(find(&pa, "shared_name")->fill, find(&pb, "shared_name")->fill);
  /* The hot palette: red 205-255, green 0-230, blue 0-55. */
  int r, g, bl;
  cr_assert_eq(sscanf(find(&pa, "other")->fill, "rgb(%d,%d,%d)", &r, &g, &bl), 3);
  cr_assert(r >= 205 && r <= 255 && g >= 0 && g <= 230 && bl >= 0 && bl <= 55);
  psvg_free(&pa);
  psvg_free(&pb);
  free(sa);
  free(sb);
  ms_flame_destroy(a);
  ms_flame_destroy(b);
  /* The memory flavour gives block states and <gaps> colours of their own. */
  ms_flame_options_t o;
  ms_flame_options_init(&o);
  o.memory = 1;
  ms_flame_t *m = flame_from("stream_0;active_allocated;f 10\nstream_0;inactive;<gaps> 5\n"
                             "stream_0;active_pending_free;g 3\n", &o);
  char *sm = render(m, &la);
  psvg_t pm = parse_svg(sm, la, 0);
  cr_assert_str_eq(find(&pm, "active_allocated")->fill, "rgb(224,82,62)");
  cr_assert_str_eq(find(&pm, "inactive")->fill, "rgb(110,168,222)");
  cr_assert_str_eq(find(&pm, "active_pending_free")->fill, "rgb(245,166,35)");
  cr_assert_str_eq(find(&pm, "<gaps>")->fill, "rgb(150,150,150)");
  psvg_free(&pm);
  free(sm);
  ms_flame_destroy(m);
}

Test(viz, inverted_reverse_and_flamechart) {
  ms_flame_options_t o = opts_minwidth(0);
  o.inverted = 1;
  ms_flame_t *fl = flame_from("a;b;c 10\na;d 5\n", &o);
  size_t len;
  char *svg = render(fl, &len);
  psvg_t p = parse_svg(svg, len, 1);
  cr_assert_lt(find(&p, "all")->y, find(&p, "a")->y, "icicle: root at the top");
  cr_assert_lt(find(&p, "a")->y, find(&p, "c")->y);
  cr_assert(strstr(svg, ">Icicle Graph<"));
  check_nesting(&p);
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);

  o = opts_minwidth(0);
  o.reverse = 1;
  fl = flame_from("a;b;c 10\nx;b;c 5\n", &o);
  char *fo = folded_out(fl);
  cr_assert_str_eq(fo, "c;b;a 10\nc;b;x 5\n");
  free(fo);
  ms_flame_destroy(fl);

  o = opts_minwidth(0);
  o.flamechart = 1;
  fl = flame_from("z;a 1\nz;a 2\nb 3\nz 4\n", &o);
  fo = folded_out(fl);
  cr_assert_str_eq(fo, "z;a 3\nb 3\nz 4\n", "got %s", fo);
  free(fo);
  svg = render(fl, &len);
  p = parse_svg(svg, len, 0);
  cr_assert_eq(p.n, 5); /* all, z, a, b, z */
  cr_assert_lt(find(&p, "b")->o, p.f[4].o);
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
}

Test(viz, folded_export_round_trips) {
  ms_flame_t *a = flame_from(basic_folded, NULL);
  char *fo = folded_out(a);
  cr_assert_str_eq(fo, "main 11\nmain;alloc 100\nmain;alloc;cudaMalloc 1024\n"
                       "main;compute;gemm 3000\nmain;compute;relu 500\nother 7\n");
  ms_flame_t *b = flame_from(fo, NULL);
  size_t la, lb;
  char *sa = render(a, &la), *sb = render(b, &lb);
  cr_assert_eq(la, lb);
  cr_assert(memcmp(sa, sb, la) == 0);
  free(sa);
  free(sb);
  free(fo);
  ms_flame_destroy(a);
  ms_flame_destroy(b);
}

/* ---- the folded reader ---- */

static int folded_error(const char *text, char *msg, size_t cap) {
  ms_flame_t *fl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_flame_create(NULL, &fl), MS_OK);
  int err = ms_flame_add_folded(fl, text, strlen(text), &eb);
  if (err == MS_OK) err = ms_flame_finish_folded(fl, &eb);
  snprintf(msg, cap, "%s", eb.msg);
  cr_assert(ms__ftree_is_valid(&fl->tree));
  ms_flame_destroy(fl);
  return err;
}

Test(viz, folded_errors_name_the_line) {
  const struct {
    const char *text;
    int err;
    const char *msg;
  } cases[] = {
      {"a;b\n", MS_EFORMAT, "line 1: no count (expected 'STACK COUNT')"},
      {"a;b 1\na;b x\n", MS_EFORMAT, "line 2: count 'x' is not a whole number"},
      {"a 1\n\nb 1.5\n", MS_EFORMAT, "line 3: count '1.5' is not a whole number"},
      {"a 1\nb 12abc", MS_EFORMAT, "line 2: count '12abc' is not a whole number"},
      {"   5\n", MS_EFORMAT, "line 1: empty stack"},
      {"a 99999999999999999999\n", MS_ELIMIT,
       "line 1: count '99999999999999999999' is too large (limit 2^63-1)"},
      {"a 9223372036854775807\nb 1\n", MS_ELIMIT, "line 2: values overflow (sum reaches 2^63)"},
      {"a 1 2\nb 3\n", MS_EFORMAT,
       "line 2: expected two counts (STACK BEFORE AFTER) like the first line"},
      {"a -\n", MS_EFORMAT, "line 1: count '-' is not a whole number"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char msg[600];
    int err = folded_error(cases[i].text, msg, sizeof msg);
    cr_expect_eq(err, cases[i].err, "case %zu: %s", i, ms_strerror(err));
    cr_expect_str_eq(msg, cases[i].msg, "case %zu", i);
  }
}

Test(viz, folded_accepts_crlf_blank_lines_and_skips_negative_counts) {
  const char *text = "a;b 3\r\n\r\n  \nstream_0;inactive;<gaps> -512\na;c 4\t\nlast 5";
  ms_flame_t *fl = flame_from(text, NULL);
  cr_assert_eq(ms_flame_total(fl), 12);
  cr_assert_eq(ms_flame_lines_skipped(fl), 1);
  char *fo = folded_out(fl);
  cr_assert_str_eq(fo, "a;b 3\na;c 4\nlast 5\n");
  free(fo);
  ms_flame_destroy(fl);
}

/* A first line whose stack ends in a word that starts with '-' ("... -3ain;k 3") was dropped as
 * a line with a negative count: the sign of the word looked at for a second count stuck
 * (found by tests/fuzz/fuzz_folded.c, issue #16 item 25). */
Test(viz, folded_first_line_word_with_a_minus_is_not_a_negative_count) {
  ms_flame_t *fl = flame_from("m> -3ain;k 3\nx 5\n", NULL);
  cr_expect_eq(ms_flame_total(fl), 8);
  cr_expect_eq(ms_flame_lines_skipped(fl), 0);
  char *fo = folded_out(fl);
  cr_expect_str_eq(fo, "m> -3ain;k 3\nx 5\n");
  free(fo);
  ms_flame_destroy(fl);
  fl = flame_from("a -b 1 2\nc 3 -4\n", NULL); /* differential: the real negative is skipped */
  cr_expect_eq(ms_flame_lines_skipped(fl), 1);
  cr_expect(ms_flame_is_diff(fl));
  ms_flame_destroy(fl);
}

Test(viz, folded_in_pieces_equals_whole) {
  /* Every split point, and byte-at-a-time feeding, give the same tree. */
  const char *text = basic_folded;
  size_t n = strlen(text);
  ms_flame_t *whole = flame_from(text, NULL);
  char *want = folded_out(whole);
  for (size_t cut = 0; cut <= n; cut++) {
    ms_flame_t *fl = NULL;
    cr_assert_eq(ms_flame_create(NULL, &fl), MS_OK);
    cr_assert_eq(ms_flame_add_folded(fl, text, cut, NULL), MS_OK);
    cr_assert_eq(ms_flame_add_folded(fl, text + cut, n - cut, NULL), MS_OK);
    cr_assert_eq(ms_flame_finish_folded(fl, NULL), MS_OK);
    char *got = folded_out(fl);
    cr_assert_str_eq(got, want, "cut at %zu", cut);
    free(got);
    ms_flame_destroy(fl);
  }
  ms_flame_t *fl = NULL;
  cr_assert_eq(ms_flame_create(NULL, &fl), MS_OK);
  for (size_t i = 0; i < n; i++) cr_assert_eq(ms_flame_add_folded(fl, text + i, 1, NULL), MS_OK);
  cr_assert_eq(ms_flame_finish_folded(fl, NULL), MS_OK);
  char *got = folded_out(fl);
  cr_assert_str_eq(got, want);
  free(got);
  free(want);
  ms_flame_destroy(fl);
  ms_flame_destroy(whole);
}

Test(viz, folded_prefix_cache_is_exact) {
  /* Prefixes that share bytes but not frame boundaries must not share nodes. */
  const char *text = "ab;c 1\nab 2\nabc;c 4\nab;cd 8\nab;c;d 16\na 32\nab;c 64\n";
  ms_flame_options_t o = opts_minwidth(0);
  ms_flame_t *fl = flame_from(text, &o);
  char *fo = folded_out(fl);
  cr_assert_str_eq(fo, "a 32\nab 2\nab;c 65\nab;c;d 16\nab;cd 8\nabc;c 4\n", "got %s", fo);
  free(fo);
  ms_flame_destroy(fl);
}

Test(viz, folded_survives_every_truncation) {
  const char *text = "x;y;z 10\nx;y 20 30\n";
  size_t n = strlen(text);
  for (size_t cut = 0; cut <= n; cut++) {
    char *part = strndup(text, cut);
    char msg[600];
    int err = folded_error(part, msg, sizeof msg);
    cr_assert(err == MS_OK || err == MS_EFORMAT, "cut %zu: %s", cut, ms_strerror(err));
    if (err) cr_assert(strncmp(msg, "line ", 5) == 0, "cut %zu: %s", cut, msg);
    free(part);
  }
}

Test(viz, deep_stacks_and_empty_frames) {
  /* 100,000 frames deep: layout and export are iterative. */
  size_t depth = 100000;
  char *text = malloc(depth * 2 + 32);
  size_t n = 0;
  for (size_t i = 0; i < depth; i++) {
    text[n++] = 'f';
    text[n++] = ';';
  }
  n--;
  n += (size_t)sprintf(text + n, " 7\n");
  ms_flame_options_t o = opts_minwidth(0);
  ms_flame_t *fl = flame_from(text, &o);
  cr_assert_eq(fl->tree.n, depth + 1);
  size_t len;
  char *svg = render(fl, &len);
  cr_assert_gt(len, depth * 100);
  free(svg);
  char *fo = folded_out(fl);
  cr_assert_eq(strlen(fo), n);
  free(fo);
  ms_flame_destroy(fl);
  free(text);
  /* Empty names are names. */
  fl = flame_from("a;;b 1\n;x 2\n", NULL);
  fo = folded_out(fl);
  cr_assert_str_eq(fo, ";x 2\na;;b 1\n");
  free(fo);
  ms_flame_destroy(fl);
}

/* ---- differential graphs ---- */

Test(viz, differential_colours_widths_and_tooltips) {
  ms_flame_options_t o = opts_minwidth(0);
  ms_flame_t *fl = NULL;
  cr_assert_eq(ms_flame_create(&o, &fl), MS_OK);
  const char *grew[] = {"s", "grew"}, *shrank[] = {"s", "shrank"}, *fresh[] = {"s", "new"},
             *gone[] = {"s", "gone"}, *same[] = {"s", "same"};
  cr_assert_eq(ms_flame_add_diff(fl, grew, 2, 1000, 3000), MS_OK);
  cr_assert_eq(ms_flame_add_diff(fl, shrank, 2, 2000, 500), MS_OK);
  cr_assert_eq(ms_flame_add_diff(fl, fresh, 2, 0, 700), MS_OK);
  cr_assert_eq(ms_flame_add_diff(fl, gone, 2, 900, 0), MS_OK);
  cr_assert_eq(ms_flame_add_diff(fl, same, 2, 50, 50), MS_OK);
  cr_assert(ms_flame_is_diff(fl));
  cr_assert_eq(ms_flame_add(fl, grew, 2, 1), MS_ESTATE);
  cr_assert(ms__ftree_is_valid(&fl->tree));
  size_t len;
  char *svg = render(fl, &len);
  psvg_t p = parse_svg(svg, len, 0);
  check_nesting(&p);
  const pframe_t *g = find(&p, "grew"), *s = find(&p, "shrank"), *nw = find(&p, "new"),
                 *gn = find(&p, "gone"), *sm = find(&p, "same");
  cr_assert(g && s && nw && gn && sm);
  /* Each frame as wide as the larger of its sizes. */
  cr_assert_eq(g->v, 3000);
  cr_assert_eq(s->v, 2000);
  cr_assert_eq(nw->v, 700);
  cr_assert_eq(gn->v, 900);
  cr_assert_eq(g->b, 1000);
  cr_assert_eq(g->a, 3000);
  /* Four clearly different colours, plus unchanged. */
  int r, gg, b;
  cr_assert_eq(sscanf(g->fill, "rgb(%d,%d,%d)", &r, &gg, &b), 3);
  cr_assert(r == 255 && gg < 200 && gg == b, "grew is red: %s", g->fill);
  cr_assert_eq(sscanf(s->fill, "rgb(%d,%d,%d)", &r, &gg, &b), 3);
  cr_assert(b == 255 && r < 200 && r == gg, "shrank is blue: %s", s->fill);
  cr_assert_str_eq(nw->fill, "rgb(46,170,72)");
  cr_assert_str_eq(gn->fill, "rgb(140,140,140)");
  cr_assert_str_eq(sm->fill, "rgb(238,238,238)");
  cr_assert_str_eq(g->title, "grew (before 1000 B, 1,000 bytes; after 2.9 KiB, 3,000 bytes; "
                             "change +2.0 KiB, +2,000 bytes, +200.00%; grew)");
  cr_assert_str_eq(gn->title, "gone (before 900 B, 900 bytes; after 0 B, 0 bytes; "
                              "change -900 B, -900 bytes, -100.00%; gone)");
  cr_assert(strstr(nw->title, "; new)"));
  /* The parent is as wide as the union of its children needs. */
  const pframe_t *root = find(&p, "s");
  cr_assert_eq(root->b, 1000 + 2000 + 0 + 900 + 50);
  cr_assert_eq(root->a, 3000 + 500 + 700 + 0 + 50);
  cr_assert_eq(root->v, 3000 + 2000 + 700 + 900 + 50);
  cr_assert(strstr(svg, ">Differential Flame Graph<"));
  psvg_free(&p);
  free(svg);
  char *fo = folded_out(fl);
  cr_assert_str_eq(fo, "s;gone 900 0\ns;grew 1000 3000\ns;new 0 700\ns;same 50 50\n"
                       "s;shrank 2000 500\n");
  /* The folded diff reads back into the same graph. */
  ms_flame_t *back = flame_from(fo, &o);
  cr_assert(ms_flame_is_diff(back));
  size_t lb;
  char *sb = render(back, &lb);
  svg = render(fl, &len);
  cr_assert_eq(len, lb);
  cr_assert(memcmp(svg, sb, len) == 0);
  free(sb);
  free(svg);
  free(fo);
  ms_flame_destroy(back);
  ms_flame_destroy(fl);
}

/* ---- the legend ---- */

/* The legend of an SVG as "FILL LABEL\n" lines (NULL without <g id="legend">); checks that every
 * swatch lies inside the image, below every frame and below the details line. */
static char *legend_of(const char *svg, size_t len) {
  xmlDocPtr doc = xmlReadMemory(svg, (int)len, "mem.svg", NULL, XML_PARSE_NONET);
  cr_assert(doc);
  xmlNodePtr root = xmlDocGetRootElement(doc), legend = NULL;
  double width = dbl_attr(root, "width"), height = dbl_attr(root, "height"), lowest = 0;
  double details_y = 0;
  for (xmlNodePtr c = root->children; c; c = c->next) {
    char *id = elem_is(c, "g") || elem_is(c, "text") ? attr(c, "id") : NULL;
    if (id && strcmp(id, "legend") == 0) legend = c;
    if (id && strcmp(id, "details") == 0) details_y = dbl_attr(c, "y");
    if (id && strcmp(id, "frames") == 0)
      for (xmlNodePtr g = c->children; g; g = g->next)
        for (xmlNodePtr r = elem_is(g, "g") ? g->children : NULL; r; r = r->next)
          if (elem_is(r, "rect") && dbl_attr(r, "y") + dbl_attr(r, "height") > lowest)
            lowest = dbl_attr(r, "y") + dbl_attr(r, "height");
    free(id);
  }
  char *out = NULL;
  if (legend) {
    size_t cap = 4096, n = 0;
    out = calloc(cap, 1);
    for (xmlNodePtr e = legend->children; e; e = e->next) {
      if (!elem_is(e, "g")) continue;
      xmlNodePtr r = e->children, t = r ? r->next : NULL;
      cr_assert(r && elem_is(r, "rect") && t && elem_is(t, "text"), "an entry is a rect and a text");
      double x = dbl_attr(r, "x"), y = dbl_attr(r, "y");
      cr_expect(x >= 10 && x + dbl_attr(r, "width") <= width - 10, "swatch x %g in %g", x, width);
      cr_expect(y > lowest && y > details_y && y + dbl_attr(r, "height") <= height,
                "swatch y %g: frames end at %g, details at %g, height %g", y, lowest, details_y,
                height);
      char *fill = attr(r, "fill"), *label = content(t);
      n += (size_t)snprintf(out + n, cap - n, "%s %s\n", fill, label);
      cr_assert_lt(n, cap);
      free(fill);
      free(label);
    }
  }
  xmlFreeDoc(doc);
  return out;
}

static char *legend_of_graph(ms_flame_t *fl) {
  size_t len;
  char *svg = render(fl, &len);
  char *l = legend_of(svg, len);
  free(svg);
  return l;
}

Test(viz, legend_of_a_differential_graph) {
  ms_flame_options_t o = opts_minwidth(0);
  ms_flame_t *fl = NULL;
  cr_assert_eq(ms_flame_create(&o, &fl), MS_OK);
  const char *grew[] = {"s", "grew"}, *shrank[] = {"s", "shrank"}, *fresh[] = {"s", "new"},
             *gone[] = {"s", "gone"}, *same[] = {"s", "same"};
  cr_assert_eq(ms_flame_add_diff(fl, grew, 2, 1000, 3000), MS_OK);
  cr_assert_eq(ms_flame_add_diff(fl, shrank, 2, 2000, 500), MS_OK);
  char *l = legend_of_graph(fl);
  cr_assert_str_eq(l, "rgb(255,103,103) grew (deeper: more)\n"
                      "rgb(103,103,255) shrank (deeper: more)\n");
  free(l);
  cr_assert_eq(ms_flame_add_diff(fl, fresh, 2, 0, 700), MS_OK);
  cr_assert_eq(ms_flame_add_diff(fl, gone, 2, 900, 0), MS_OK);
  cr_assert_eq(ms_flame_add_diff(fl, same, 2, 50, 50), MS_OK);
  /* the swatches are the frames' colours: new, gone and unchanged exactly */
  l = legend_of_graph(fl);
  cr_assert_str_eq(l, "rgb(255,103,103) grew (deeper: more)\n"
                      "rgb(103,103,255) shrank (deeper: more)\n"
                      "rgb(46,170,72) new\n"
                      "rgb(140,140,140) gone\n"
                      "rgb(238,238,238) unchanged\n");
  free(l);
  ms_flame_destroy(fl);
  /* a narrow image: the entries wrap into rows, all inside it (legend_of checks), and the
   * page grows by the rows */
  for (int k = 0; k < 2; k++) {
    o.width = k ? 200 : 1200;
    cr_assert_eq(ms_flame_create(&o, &fl), MS_OK);
    cr_assert_eq(ms_flame_add_diff(fl, grew, 2, 1000, 3000), MS_OK);
    cr_assert_eq(ms_flame_add_diff(fl, shrank, 2, 2000, 500), MS_OK);
    cr_assert_eq(ms_flame_add_diff(fl, fresh, 2, 0, 700), MS_OK);
    size_t len;
    char *svg = render(fl, &len);
    l = legend_of(svg, len);
    cr_assert(l);
    psvg_t p = parse_svg(svg, len, 0);
    /* 3 depths of 16 px, the title band (36), the details band (34) and 1 or 3 legend rows */
    cr_expect_eq(p.height, k ? 48 + 36 + 34 + 3 * 18 + 4 : 48 + 36 + 34 + 18 + 4);
    psvg_free(&p);
    free(l);
    free(svg);
    ms_flame_destroy(fl);
  }
}

Test(viz, legend_of_the_memory_colours) {
  ms_flame_options_t o = opts_minwidth(0);
  o.memory = 1;
  ms_flame_t *fl = flame_from("stream_0;active_allocated;a.py:1:f 100\n"
                              "stream_0;inactive;<gaps> 50\n"
                              "stream_0;active_pending_free;<no-context> 30\n"
                              "only_after;stream_7;seg_4096;active_allocated 20\n",
                              &o);
  char *l = legend_of_graph(fl);
  cr_assert_str_eq(l, "rgb(224,82,62) allocated\n"
                      "rgb(245,166,35) pending free\n"
                      "rgb(110,168,222) inactive (cached)\n"
                      "rgb(150,150,150) gaps (not requested)\n"
                      "rgb(196,184,150) no stack\n"
                      "rgb(52,168,83) only after\n"
                      "rgb(160,160,196) stream\n"
                      "rgb(186,186,214) segment\n");
  free(l);
  ms_flame_destroy(fl);
  /* gathered small frames get the last entry */
  o = opts_minwidth(0);
  o.memory = 1;
  o.minwidth_pct = 5;
  fl = flame_from("stream_0;active_allocated;a.py:1:f 1000\nstream_0;active_allocated;b 1\n"
                  "stream_0;active_allocated;c 1\n",
                  &o);
  l = legend_of_graph(fl);
  cr_assert_str_eq(l, "rgb(224,82,62) allocated\nrgb(160,160,196) stream\n"
                      "rgb(222,212,186) small frames, gathered\n");
  free(l);
  ms_flame_destroy(fl);
}

Test(viz, legend_of_the_palettes_that_mean_something) {
  const char *text = "java/lang/Thread.run;foo::bar;native_x 10\nmain;do_sys_open_[k] 5\n"
                     "main;inl_[i];jit_[j] 3\n";
  ms_flame_options_t o = opts_minwidth(0);
  o.colors = MS_FLAME_PALETTE_JAVA;
  ms_flame_t *fl = flame_from(text, &o);
  char *l = legend_of_graph(fl);
  cr_assert_str_eq(l, "rgb(227,90,90) native\nrgb(202,202,60) C++\n"
                      "rgb(80,227,80) Java, JIT (_[j])\nrgb(80,192,192) inlined (_[i])\n"
                      "rgb(222,122,0) kernel (_[k])\n");
  free(l);
  ms_flame_destroy(fl);
  o.colors = MS_FLAME_PALETTE_CHAIN;
  fl = flame_from("sleep;--;wake_[w] 4\n", &o);
  l = legend_of_graph(fl);
  cr_assert_str_eq(l, "rgb(80,192,192) waker (_[w])\nrgb(110,110,230) off-CPU\n");
  free(l);
  ms_flame_destroy(fl);
  /* the palettes that colour by a hash mean nothing by colour: no legend, small frames or not */
  static const ms_flame_palette plain[] = {MS_FLAME_PALETTE_HOT, MS_FLAME_PALETTE_MEM,
                                           MS_FLAME_PALETTE_WAKEUP, MS_FLAME_PALETTE_AQUA};
  for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
    o = opts_minwidth(0);
    o.colors = plain[i];
    o.minwidth_pct = 5;
    fl = flame_from("a;b 1000\na;c 1\na;d 1\n", &o);
    size_t len;
    char *svg = render(fl, &len);
    cr_expect_null(legend_of(svg, len), "palette %s", ms_flame_palette_name(plain[i]));
    cr_expect_null(strstr(svg, "legend"), "palette %s", ms_flame_palette_name(plain[i]));
    free(svg);
    ms_flame_destroy(fl);
  }
}

/* ---- API contracts ---- */

Test(viz, api_contracts) {
  ms_flame_t *fl = (ms_flame_t *)0x1;
  ms_flame_options_t o;
  ms_flame_options_init(&o);
  o.font_size = 0;
  cr_assert_eq(ms_flame_create(&o, &fl), MS_EINVAL);
  cr_assert_eq(fl, (ms_flame_t *)0x1, "out untouched on failure");
  ms_flame_options_init(&o);
  o.minwidth = -1;
  cr_assert_eq(ms_flame_create(&o, &fl), MS_EINVAL);
  ms_flame_options_init(&o);
  o.colors = MS_FLAME_PALETTE_COUNT_;
  cr_assert_eq(ms_flame_create(&o, &fl), MS_EINVAL);
  ms_flame_destroy(NULL);

  ms_flame_palette pal = MS_FLAME_PALETTE_HOT;
  cr_assert_eq(ms_flame_palette_parse("aqua", &pal), MS_OK);
  cr_assert_eq(pal, MS_FLAME_PALETTE_AQUA);
  cr_assert_eq(ms_flame_palette_parse("nope", &pal), MS_ENOTFOUND);
  cr_assert_eq(pal, MS_FLAME_PALETTE_AQUA);
  for (int i = 0; i < MS_FLAME_PALETTE_COUNT_; i++) {
    cr_assert_eq(ms_flame_palette_parse(ms_flame_palette_name((ms_flame_palette)i), &pal), MS_OK);
    cr_assert_eq((int)pal, i);
  }

  cr_assert_eq(ms_flame_create(NULL, &fl), MS_OK);
  const char *st[] = {"a"};
  cr_assert_eq(ms_flame_add(fl, NULL, 1, 5), MS_EINVAL);
  cr_assert_eq(ms_flame_add(fl, st, 1, (uint64_t)1 << 62), MS_OK);
  cr_assert_eq(ms_flame_add(fl, st, 1, (uint64_t)1 << 62), MS_ELIMIT);
  cr_assert_eq(ms_flame_total(fl), (uint64_t)1 << 62, "nothing added on failure");
  cr_assert_eq(ms_flame_add_diff(fl, st, 1, 1, 2), MS_ESTATE);
  /* A failing sink fails the write with its own error. */
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  m.fail_after = 3000;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_flame_write_svg(fl, &sink, &eb), MS_EIO);
  cr_assert(eb.msg[0]);
  free(m.data);
  ms_flame_destroy(fl);

  /* No stacks: a valid page that says so. */
  cr_assert_eq(ms_flame_create(NULL, &fl), MS_OK);
  size_t len;
  char *svg = render(fl, &len);
  psvg_t p = parse_svg(svg, len, 0);
  cr_assert_eq(p.n, 0);
  cr_assert(strstr(svg, ">No stacks<"));
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
}

Test(viz, labels_fit_their_frames) {
  ms_flame_options_t o = opts_minwidth(0);
  ms_flame_t *fl = flame_from("a_rather_long_function_name_that_cannot_fit 1\nw 2000\n", &o);
  size_t len;
  char *svg = render(fl, &len);
  psvg_t p = parse_svg(svg, len, 0);
  const pframe_t *f = find(&p, "a_rather_long_function_name_that_cannot_fit");
  cr_assert(f);
  cr_assert_str_eq(f->label, "", "too narrow for 3 characters: no label");
  const pframe_t *w = find(&p, "w");
  cr_assert_str_eq(w->label, "w");
  for (int i = 0; i < p.n; i++) {
    double chars = p.f[i].w / (12 * 0.59);
    cr_assert_leq((double)strlen(p.f[i].label), chars + 0.5, "%s", p.f[i].name);
  }
  psvg_free(&p);
  free(svg);
  ms_flame_destroy(fl);
}

/* ---- the command: memsnap flamegraph ---- */

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct cmd_result {
  int status;
  char out[4096], err[4096];
} cmd_result_t;

static void slurp(const char *path, char *buf, size_t cap) {
  FILE *fp = fopen(path, "rb");
  size_t n = fp ? fread(buf, 1, cap - 1, fp) : 0;
  buf[n] = 0;
  if (fp) fclose(fp);
}

/* Runs $MEMSNAP_BIN with args (NULL-terminated) in dir, stdin from in_path (or /dev/null). */
static cmd_result_t run_memsnap(const char *dir, const char *in_path, const char *const *args) {
  cmd_result_t r = {0};
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || access(bin, X_OK) != 0)
    cr_skip_test("SKIP: MEMSNAP_BIN is not set (run the test through ctest)");
  char out[512], err[512];
  snprintf(out, sizeof out, "%s/.stdout", dir);
  snprintf(err, sizeof err, "%s/.stderr", dir);
  const char *argv[32] = {bin};
  int n = 1;
  for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    if (chdir(dir) != 0) _exit(126);
    if (!freopen(in_path ? in_path : "/dev/null", "rb", stdin)) _exit(126);
    if (!freopen(out, "wb", stdout) || !freopen(err, "wb", stderr)) _exit(126);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  slurp(out, r.out, sizeof r.out);
  slurp(err, r.err, sizeof r.err);
  unlink(out);
  unlink(err);
  return r;
}

static void write_file(const char *path, const char *text) {
  FILE *fp = fopen(path, "wb");
  cr_assert(fp);
  fputs(text, fp);
  fclose(fp);
}

static int dir_entries(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
  FILE *p = popen(cmd, "r");
  int n = -1;
  if (p) {
    if (fscanf(p, "%d", &n) != 1) n = -1;
    pclose(p);
  }
  return n;
}

Test(viz, command_flamegraph) {
  char dir[] = "/tmp/test_viz.XXXXXX";
  cr_assert(mkdtemp(dir));
  char in[600], svg[600], bad[600];
  snprintf(in, sizeof in, "%s/in.folded", dir);
  snprintf(svg, sizeof svg, "%s/output.svg", dir);
  snprintf(bad, sizeof bad, "%s/bad.folded", dir);
  write_file(in, basic_folded);
  write_file(bad, "a;b 1\na;b 2\nc;d twelve\n");

  /* Default output name, the SVG equals the library's. */
  cmd_result_t r = run_memsnap(dir, NULL, (const char *[]){"flamegraph", "in.folded", NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  /* the one line that says what was written (#32 item 4) */
  cr_assert(strncmp(r.err, "memsnap: wrote 'output.svg' (", 29) == 0, "%s", r.err);
  cr_assert(strstr(r.err, "); open it in a web browser\n") && !strchr(r.err, '\n')[1], "%s", r.err);
  struct stat st;
  cr_assert_eq(stat(svg, &st), 0);
  ms_flame_t *fl = flame_from(basic_folded, NULL);
  size_t len;
  char *want = render(fl, &len);
  cr_assert_eq((size_t)st.st_size, len);
  ms_flame_destroy(fl);
  free(want);

  /* Standard input and output, options. */
  r = run_memsnap(dir, in,
                  (const char *[]){"flamegraph", "-", "-o", "-", "--folded", "--reverse", NULL});
  cr_assert_eq(r.status, 0);
  cr_assert(strstr(r.out, "cudaMalloc;alloc;main 1024\n"), "%s", r.out);
  r = run_memsnap(dir, NULL,
                  (const char *[]){"flamegraph", "in.folded", "-o", "t.svg", "--title=T <&>",
                                   "--colors", "mem", "--inverted", "--minwidth", "1%",
                                   "--countname", "samples", "--width", "800", NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);

  /* --help on stdout, exit 0. */
  r = run_memsnap(dir, NULL, (const char *[]){"flamegraph", "--help", NULL});
  cr_assert_eq(r.status, 0);
  cr_assert(strncmp(r.out, "usage: memsnap flamegraph FOLDED", 32) == 0);

  /* Usage errors: exit 2. */
  const char *const *usage[] = {
      (const char *[]){"flamegraph", NULL},
      (const char *[]){"flamegraph", "a", "b", NULL},
      (const char *[]){"flamegraph", "in.folded", "--width", "wide", NULL},
      (const char *[]){"flamegraph", "in.folded", "--colors", "plaid", NULL},
      (const char *[]){"flamegraph", "in.folded", "--minwidth", "-3", NULL},
      (const char *[]){"flamegraph", "in.folded", "--bogus", NULL},
  };
  for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
    r = run_memsnap(dir, NULL, usage[i]);
    cr_expect_eq(r.status, 2, "case %zu", i);
    cr_expect(strncmp(r.err, "memsnap: error: ", 16) == 0, "case %zu: %s", i, r.err);
  }

  /* Run-time errors: exit 1, named file and line, and an existing output left untouched. */
  int before = dir_entries(dir);
  r = run_memsnap(dir, NULL, (const char *[]){"flamegraph", "bad.folded", NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_str_eq(r.err, "memsnap: error: cannot parse 'bad.folded': line 3: count 'twelve' is "
                          "not a whole number\n");
  cr_assert_eq(stat(svg, &st), 0);
  cr_assert_eq((size_t)st.st_size, len, "output.svg untouched");
  r = run_memsnap(dir, NULL, (const char *[]){"flamegraph", "missing.folded", NULL});
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "memsnap: error: cannot open 'missing.folded': No such file"), "%s",
            r.err);
  r = run_memsnap(dir, NULL,
                  (const char *[]){"flamegraph", "in.folded", "-o", "no/such/dir/x.svg", NULL});
  cr_assert_eq(r.status, 1);
  cr_assert(strncmp(r.err, "memsnap: error: ", 16) == 0);
  cr_assert_eq(dir_entries(dir), before, "no temporary file left behind");

  /* Negative counts: skipped with a warning. */
  write_file(bad, "a 5\nstream_0;inactive;<gaps> -512\n");
  r = run_memsnap(dir, NULL, (const char *[]){"flamegraph", "bad.folded", "-q", "-o", "n.svg", NULL});
  cr_assert_eq(r.status, 0);
  cr_assert_str_eq(r.err,
                   "memsnap: warning: 'bad.folded': ignored 1 line with a negative count\n");
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

Test(viz, folded_line_longer_than_the_limit) {
  /* 65 MiB without a newline, fed in 1 MiB pieces: refused, not buffered without bound. */
  size_t piece = (size_t)1 << 20;
  char *buf = malloc(piece);
  memset(buf, 'a', piece);
  ms_flame_t *fl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_flame_create(NULL, &fl), MS_OK);
  cr_assert_eq(ms_flame_add_folded(fl, "x 1\n", 4, &eb), MS_OK);
  int err = MS_OK;
  for (int i = 0; i < 65 && err == MS_OK; i++) err = ms_flame_add_folded(fl, buf, piece, &eb);
  cr_assert_eq(err, MS_ELIMIT);
  cr_assert_str_eq(eb.msg, "line 2: longer than 64 MiB");
  cr_assert_eq(ms_flame_total(fl), 1);
  ms_flame_destroy(fl);
  free(buf);
}
