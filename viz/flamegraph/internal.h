/* SPDX-License-Identifier: MIT
 * memsnap viz: internal declarations shared by the files of viz/ (never installed).
 *
 * The flame-graph pipeline has three layers (style.md §15):
 *  - frametree.c: interned names and the frame tree (node 0 is the root "all"); every node has
 *    a total and a self value, and, for differential trees, the same two values "before";
 *  - layout.c: which nodes are drawn, where (value offset, width, depth), in which order, the
 *    "[N small frames]" frames that gather what is narrower than minwidth, and colours;
 *  - svg.c: a thin wrapper over libxml2's xmlTextWriter (the only libxml2 user), driven by
 *    flamegraph.c, which implements include/memsnap/viz.h and writes the page.
 * Invariants of the tree: a parent's index is smaller than its children's (nodes are appended),
 * and total[n] == self[n] + sum(total[children]) for both value sets.
 *
 * Thread-safety: none; a tree belongs to one builder, used by one thread at a time.
 */
#ifndef MEMSNAP_VIZ_INTERNAL_H
#define MEMSNAP_VIZ_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/viz.h"

#define MS__VIZ_NONE UINT32_MAX

/* Returns the error of expr, if any, from the calling function. */
#define MS_FORWARD_ERR(expr)         \
  do {                               \
    int ms__viz_e = (expr);          \
    if (ms__viz_e != MS_OK) return ms__viz_e; \
  } while (0)
/* At most this many nodes or distinct names (indices are uint32_t; NONE is reserved). */
#define MS__VIZ_MAX_NODES ((size_t)INT32_MAX)

/* A 64-bit hash of a byte string (multiply-fold over 8-byte words). */
static inline uint64_t ms__viz_mum(uint64_t a, uint64_t b) {
  __uint128_t r = (__uint128_t)a * b;
  return (uint64_t)r ^ (uint64_t)(r >> 64);
}
static inline uint64_t ms__viz_hash(const void *data, size_t len) {
  const unsigned char *p = (const unsigned char *)data;
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)len * 0xa0761d6478bd642fULL);
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = ms__viz_mum(h ^ w, 0xe7037ed1a0b428dbULL);
    p += 8;
    len -= 8;
  }
  uint64_t w = 0;
  for (size_t i = 0; i < len; i++) w |= (uint64_t)p[i] << (8 * i);
  return ms__viz_mum(h ^ w ^ 0x8ebc6af09c88c6e3ULL, 0x589965cc75374cc3ULL);
}

/* A name: bytes in the tree's arena, not NUL-terminated. */
typedef struct ms__viz_str {
  const char *ptr;
  size_t len;
} ms__viz_str_t;

/* The topology of one node; values live in parallel arrays of the tree. */
typedef struct ms__fnode {
  uint32_t name;    /* interned name id */
  uint32_t parent;  /* MS__VIZ_NONE for the root */
  uint32_t child;   /* most recently added child, or NONE */
  uint32_t sibling; /* next older sibling, or NONE */
} ms__fnode_t;

typedef struct ms__ftree {
  /* Names: one arena of bytes in chunks, an offset/length per id, and an open-addressing table. */
  char **chunks;
  size_t nchunks, chunk_used, chunk_cap;
  ms__viz_str_t *names;
  size_t nnames, names_cap;
  uint32_t *name_slots; /* id + 1, 0 = empty */
  size_t name_slot_cap; /* power of two */
  /* Nodes. */
  ms__fnode_t *nodes;
  uint64_t *total, *self;         /* values ("after" for diffs) */
  uint64_t *btotal, *bself;       /* "before" values; NULL unless diff */
  size_t n, cap;
  uint8_t *nkids;                 /* children of each node, counted up to FT_LIST_MAX */
  uint32_t *child_slots; /* (parent, name) -> node + 1, 0 = empty, for the children of nodes
                            with FT_LIST_MAX children or more; NULL for flame charts */
  size_t child_slot_cap, child_hashed;
  int diff;       /* values are differential (btotal/bself allocated) */
  int flamechart; /* merge a frame only with its parent's most recent child */
  uint32_t *path; /* scratch: the node path of the stack being added */
  size_t path_cap;
} ms__ftree_t;

/* "frametree.c" */
/* pre: t zeroed. Creates the root "all". @return MS_OK or MS_ENOMEM. */
int ms__ftree_init(ms__ftree_t *t, int flamechart);
void ms__ftree_release(ms__ftree_t *t);
/* Switches an empty tree to differential values. @return MS_OK, MS_ESTATE (holds plain values),
 * MS_ENOMEM. */
int ms__ftree_make_diff(ms__ftree_t *t);
/* Interns a name. @return MS_OK and *id, MS_ELIMIT, MS_ENOMEM. */
int ms__ftree_intern(ms__ftree_t *t, const char *s, size_t len, uint32_t *id);
/* The child of parent named name (merging as the tree's mode says), created if absent.
 * @return MS_OK and *out, MS_ELIMIT, MS_ENOMEM. */
int ms__ftree_child(ms__ftree_t *t, uint32_t parent, uint32_t name, uint32_t *out);
/* Adds value(s) along a path of nodes path[0..depth-1] (path[0] is a child of the root; the last
 * one gets the self value). pre: the root totals do not overflow (ms__ftree_can_add). */
void ms__ftree_credit(ms__ftree_t *t, const uint32_t *path, size_t depth, uint64_t before,
                      uint64_t after);
/* Adds one stack given as n slices (root first; reverse: leaf first) with its values. The first
 * `reuse` frames are taken from t->path (the caller's previous stack shared them).
 * @return MS_OK, MS_ELIMIT (root totals would reach 2^63), MS_ENOMEM. On failure no value was
 * added (nodes may have been created with zero values, which are never drawn or written). */
int ms__ftree_add(ms__ftree_t *t, const char *const *fptr, const size_t *flen, size_t n,
                  size_t reuse, int reverse, uint64_t before, uint64_t after);
/* @return 1 if adding before/after keeps the root totals below 2^63, else 0. */
int ms__ftree_can_add(const ms__ftree_t *t, uint64_t before, uint64_t after);
static inline ms__viz_str_t ms__ftree_name(const ms__ftree_t *t, uint32_t node) {
  return t->names[t->nodes[node].name];
}
/* Computes the drawn width of every node into w[0..n-1]: the total for plain trees; for diffs
 * max(before, after, sum of the children's widths), so children always fit in their parent. */
void ms__ftree_widths(const ms__ftree_t *t, uint64_t *w);
/* Walks every node and checks the invariants of the header (MS_DEBUG >= 3 callers). */
int ms__ftree_is_valid(const ms__ftree_t *t);

/* "layout.c" */
typedef enum ms__fkind {
  MS__FRAME_NODE = 0, /* a tree node */
  MS__FRAME_SMALL,    /* "[N small frames]": siblings narrower than minwidth, gathered */
} ms__fkind;

/* One drawn frame. Offsets and widths are in value units from the root's left edge. */
typedef struct ms__frame {
  uint32_t node;   /* tree node (for SMALL: the parent node whose children were gathered) */
  uint32_t parent; /* index of the parent frame in the layout, NONE for the root */
  uint32_t depth;  /* 0 = root */
  uint32_t nsmall; /* SMALL: number of gathered frames (their whole subtrees count as one) */
  ms__fkind kind;
  uint64_t offset;
  uint64_t width;  /* drawn width (value units) */
  uint64_t before, after; /* totals (before = after = width for plain trees; SMALL: sums) */
} ms__frame_t;

typedef struct ms__layout {
  ms__frame_t *frames; /* pre-order: a parent comes before its children */
  size_t n, cap;
  uint32_t max_depth;
  uint64_t root_width;
} ms__layout_t;

/* Lays t out. minfrac: frames narrower than this fraction of the root's width are gathered (0
 * keeps all with a non-zero width; zero-width frames are never drawn). by_name: children sorted
 * by name (else in insertion order, for flame charts).
 * @return MS_OK or MS_ENOMEM (*lo released). */
int ms__layout_build(const ms__ftree_t *t, double minfrac, int by_name, ms__layout_t *lo);
void ms__layout_release(ms__layout_t *lo);

/* Colours: "rgb(r,g,b)" into buf (at least 24 bytes). */
void ms__color_name(ms_flame_palette pal, int flamegraph_hash, int memory, const char *name,
                    size_t len, char *buf, size_t cap);
/* Diff colour by change of the total: grew (red), shrank (blue), new (green), gone (grey),
 * unchanged (near white); intensity grows with |delta| / max_delta. */
void ms__color_diff(uint64_t before, uint64_t after, uint64_t max_delta, char *buf, size_t cap);
/* The red (grew) or blue (shrank) of a change that is the fraction f (0..1) of the largest. */
void ms__color_change(int grew, double f, char *buf, size_t cap);
#define MS__COLOR_NEW "rgb(46,170,72)"
#define MS__COLOR_GONE "rgb(140,140,140)"
#define MS__COLOR_UNCHANGED "rgb(238,238,238)"
/* The colour of "[N small frames]" frames. */
#define MS__COLOR_SMALL "rgb(222,212,186)"

/* What a frame's colour means, where it means something (the legend's entries, in its order):
 * a diff's change, a memory view's fixed names, a multi palette's hue, the small frames. */
typedef enum ms__legend_key {
  MS__LEG_NONE = -1,
  MS__LEG_GREW = 0,
  MS__LEG_SHRANK,
  MS__LEG_NEW,
  MS__LEG_GONE,
  MS__LEG_UNCHANGED,
  MS__LEG_ALLOCATED, /* the memory views' names, in ms__color_memory_key's table order */
  MS__LEG_PENDING,
  MS__LEG_INACTIVE,
  MS__LEG_GAPS,
  MS__LEG_NOSTACK, /* <non-python> and <no-context> */
  MS__LEG_ONLY_BEFORE,
  MS__LEG_ONLY_AFTER,
  MS__LEG_STREAM,
  MS__LEG_SEGMENT,
  MS__LEG_HUE_RED, /* the hues of the java, js, perl and chain palettes */
  MS__LEG_HUE_YELLOW,
  MS__LEG_HUE_GREEN,
  MS__LEG_HUE_AQUA,
  MS__LEG_HUE_BLUE,
  MS__LEG_HUE_ORANGE,
  MS__LEG_SMALL,
  MS__LEG_COUNT_
} ms__legend_key;
/* The diff class of a frame: MS__LEG_GREW .. MS__LEG_UNCHANGED. */
int ms__color_diff_key(uint64_t before, uint64_t after);
/* The memory views' fixed name s is, or MS__LEG_NONE; and the colour of such a key. */
int ms__color_memory_key(const char *s, size_t len);
const char *ms__color_memory_rgb(int key);
/* The hue a palette gives name s (the palette itself unless it picks hues by name). */
ms_flame_palette ms__color_hue(ms_flame_palette pal, const char *s, size_t len);
/* A colour of hue pal at the shades v1, v2, v3 (0..1), as flamegraph.pl's ranges. */
void ms__color_shade(ms_flame_palette pal, double v1, double v2, double v3, char *buf,
                     size_t cap);

#define MS__COLOR_SEARCH "rgb(230,0,230)"

/* Text helpers. */
/* Makes s displayable: valid UTF-8, invalid sequences -> U+FFFD, C0 controls and DEL -> Unicode
 * control pictures (U+2400 + byte, U+2421). Writes into *buf (grown with realloc) and returns
 * the length, or (size_t)-1 on ENOMEM. *ncp receives the number of code points. */
size_t ms__text_sanitize(const char *s, size_t len, char **buf, size_t *cap, size_t *ncp);
/* @return the byte length of the first ncp code points of valid UTF-8 s. */
size_t ms__text_prefix(const char *s, size_t len, size_t ncp);
/* "1,234,567" */
void ms__fmt_count(uint64_t v, char *buf, size_t cap);
/* "512 B", "1.5 KiB", "3.0 GiB" */
void ms__fmt_bytes(uint64_t v, char *buf, size_t cap);

/* "svg.c": a minimal XML writer over a sink (libxml2's xmlTextWriter). Every function returns
 * MS_OK or an error (the sink's own error when the sink failed, else MS_EIO / MS_ENOMEM). */
typedef struct ms__svg ms__svg_t;
int ms__svg_open(ms_sink_t *sink, ms__svg_t **out);
/* Ends the document, flushes and frees; returns the first error of the whole write (also when
 * called after an error to clean up). Accepts NULL (returns MS_OK). */
int ms__svg_close(ms__svg_t *w);
int ms__svg_doctype(ms__svg_t *w, const char *name, const char *pubid, const char *sysid);
int ms__svg_start(ms__svg_t *w, const char *elem);
int ms__svg_end(ms__svg_t *w);
int ms__svg_attr(ms__svg_t *w, const char *name, const char *value);
int ms__svg_attrf(ms__svg_t *w, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Text content (escaped by the writer); s must be valid UTF-8 without control characters. */
int ms__svg_text(ms__svg_t *w, const char *s, size_t len);
int ms__svg_cdata(ms__svg_t *w, const char *s);
int ms__svg_comment(ms__svg_t *w, const char *s);
/* Writes whitespace/newline between elements for readability (raw, outside attributes). */
int ms__svg_raw(ms__svg_t *w, const char *s);

/* "page.c": the page's constant CSS and script (contain no data; the script reads everything
 * from attributes with getAttribute/textContent). */
extern const char ms__page_css[];
extern const char ms__page_script[];

/* "folded.c": the streaming folded-text parser state kept in the builder. */
typedef struct ms__folded {
  char *carry;        /* an incomplete line from the previous call */
  size_t carry_len, carry_cap;
  size_t lineno;      /* lines seen so far */
  size_t skipped;     /* lines skipped for a negative count */
  int mode;           /* 0 unknown, 1 one count per line, 2 two counts */
  /* Prefix cache: the previous stack's text; its node path is the tree's path scratch. */
  char *prev;           /* owned copy of the previous stack */
  const char *prev_ext; /* or, during one ms_flame_add_folded() call, where it lies */
  size_t prev_len, prev_cap;
  size_t prev_frames; /* frames of the previous stack (valid entries of tree.path) */
  const char **fptr;  /* frame slices of the current line */
  size_t *flen;
  size_t fcap;
} ms__folded_t;

/* The builder (include/memsnap/viz.h). Option strings point to the owned copies below. */
struct ms_flame_s {
  ms_flame_options_t opts;
  char *title, *subtitle, *font_type, *countname, *nametype;
  ms__ftree_t tree;
  ms__folded_t folded;
  int has_plain; /* plain values were added (no diff possible any more) */
};

/* Parses one complete line (without its newline) into fl. @return as ms_flame_add_folded. */
int ms__folded_line(ms_flame_t *fl, const char *line, size_t len, ms_errbuf_t *eb);
void ms__folded_release(ms__folded_t *f);
/* Formats "line N: <msg>" into eb (may be NULL) and returns err. */
int ms__viz_errbuf(ms_errbuf_t *eb, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "legend.c": the legend row of a graph whose colours mean something (diffs, memory colours,
 * the java/js/perl/chain palettes); n == 0 when there is none. */
typedef struct ms__legend {
  int keys[MS__LEG_COUNT_]; /* the entries, ms__legend_key order */
  int n;
  double row_h;  /* px per row */
  double height; /* px the legend adds at the bottom of the page (0 without one) */
} ms__legend_t;
/* Collects which meaningful colours the laid-out frames use, and the rows they take. */
void ms__legend_collect(const ms_flame_t *fl, const ms__layout_t *lo, ms__legend_t *lg);
/* Writes <g id="legend"> with its first row's swatches at y = top. */
int ms__legend_write(ms__svg_t *w, const ms__legend_t *lg, const ms_flame_options_t *o,
                     double top);

#endif /* MEMSNAP_VIZ_INTERNAL_H */
