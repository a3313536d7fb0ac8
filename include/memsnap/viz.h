/* SPDX-License-Identifier: MIT
 * memsnap: flame graphs (folded stacks in, interactive SVG or folded text out).
 *
 * Vocabulary. A *stack* is a list of frame names, root first, as in a folded line `a;b;c 123`.
 * A *value* is a non-negative count (bytes by default). The builder merges the stacks it is
 * given into a frame tree in which every frame has a *total* (its value plus its descendants')
 * and a *self* value (what stacks ending exactly at it added). A *differential* builder holds two
 * values per stack, *before* and *after*; it is drawn as one graph over the union of both trees
 * with each frame as wide as the larger of its two totals (widened where its children need more
 * room), coloured by the change of its total: grew, shrank, new or gone.
 *
 * Pipeline: add stacks -> (layout at write time: x, width, depth; frames narrower than
 * `minwidth` are gathered into one "[N small frames]" frame per parent that keeps their value)
 * -> SVG (flamegraph.pl's page contract: ids title, details, unzoom, search, ignorecase, matched;
 * <g id="frames">; ?x=&y=&s= URL state) or folded text. Output is byte-for-byte deterministic:
 * children are ordered by name (or by input order for flame charts) and colours come from a hash
 * of the name, so one frame has the same colour in every graph. docs/flamegraph.md describes the
 * page.
 *
 * Names are data: any byte string is accepted. In the SVG, invalid UTF-8 becomes U+FFFD, control
 * bytes become their visible Unicode control pictures (U+2400 + byte), and all markup is escaped
 * by the XML writer; the page's script reads names with textContent only.
 *
 * Thread-safety: an ms_flame_t is used by one thread at a time; distinct builders share nothing.
 */
#ifndef MEMSNAP_VIZ_H
#define MEMSNAP_VIZ_H

#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"

MS_EXTERN_C_BEGIN

/* Colour palettes, as flamegraph.pl's --colors (same names, same hue ranges). */
typedef enum ms_flame_palette {
  MS_FLAME_PALETTE_HOT = 0, /* default: red-yellow */
  MS_FLAME_PALETTE_MEM,     /* green */
  MS_FLAME_PALETTE_IO,      /* blue-purple */
  MS_FLAME_PALETTE_WAKEUP,  /* aqua-blue */
  MS_FLAME_PALETTE_CHAIN,   /* aqua for "_[w]" waker frames, blue otherwise (flamegraph.pl) */
  MS_FLAME_PALETTE_JAVA,    /* multi: by annotation suffix or name pattern */
  MS_FLAME_PALETTE_JS,      /* multi */
  MS_FLAME_PALETTE_PERL,    /* multi */
  MS_FLAME_PALETTE_RED,
  MS_FLAME_PALETTE_GREEN,
  MS_FLAME_PALETTE_BLUE,
  MS_FLAME_PALETTE_AQUA,
  MS_FLAME_PALETTE_YELLOW,
  MS_FLAME_PALETTE_PURPLE,
  MS_FLAME_PALETTE_ORANGE,
  MS_FLAME_PALETTE_COUNT_ /* number of palettes; not a palette */
} ms_flame_palette;

/* Looks a palette up by flamegraph.pl's name ("hot", "mem", ...).
 * @return MS_OK and *out set, or MS_ENOTFOUND (*out untouched). */
MS_API MS_NODISCARD int ms_flame_palette_parse(const char *name, ms_flame_palette *out);
/* @return the palette's name ("hot" ...), or "unknown"; static storage. */
MS_API const char *ms_flame_palette_name(ms_flame_palette p);

/* Rendering options. Initialise with ms_flame_options_init() and change what you need; the
 * builder copies the strings it is given. Field comments give the unit and the default. */
typedef struct ms_flame_options_s {
  const char *title;     /* NULL (default): "Flame Graph", "Icicle Graph" when inverted,
                            "Flame Chart" with flamechart, "Differential Flame Graph" for diffs */
  const char *subtitle;  /* second line under the title; NULL (default): none */
  unsigned width;        /* image width in px (1200); 0 means the default */
  unsigned frame_height; /* height of one frame in px (16); 0 means the default */
  const char *font_type; /* CSS font family ("Verdana") */
  double font_size;      /* px (12) */
  double font_width;     /* mean glyph width as a fraction of font_size, to fit labels (0.59) */
  double minwidth;       /* px (0.1): narrower frames are gathered into "[N small frames]" */
  double minwidth_pct;   /* if > 0, overrides minwidth: percent of the root's value (0) */
  const char *countname; /* unit of values in tooltips ("bytes"; "bytes" adds KiB/MiB/GiB) */
  const char *nametype;  /* prefix of the details line ("Function:") */
  ms_flame_palette colors; /* palette (MS_FLAME_PALETTE_HOT) */
  int hash;       /* 1: flamegraph.pl's --hash (early characters weigh more, so similar names get
                     similar colours); 0 (default): a hash of the whole name. Both deterministic */
  int inverted;   /* 1: icicle graph, root at the top (0) */
  int reverse;    /* 1: reverse every stack before merging, leaf first (0) */
  int flamechart; /* 1: keep input order and merge only adjacent equal frames (0) */
  int memory;     /* 1: allocator flavour: block states (active_allocated, active_pending_free,
                     inactive), <non-python>, <no-context>, <gaps>, only_before, only_after,
                     stream_N and seg_N frames get colours of their own (0) */
} ms_flame_options_t;

/* Fills opts with the defaults above. */
MS_API void ms_flame_options_init(ms_flame_options_t *opts);

/* The builder: an opaque frame tree plus the options it will be drawn with. */
typedef struct ms_flame_s ms_flame_t;

/* Creates an empty builder. opts may be NULL (defaults); strings are copied.
 * @return MS_OK, MS_EINVAL (width, frame height or font size out of range; NaN), MS_ENOMEM.
 * *out is untouched on failure. */
MS_API MS_NODISCARD int ms_flame_create(const ms_flame_options_t *opts, ms_flame_t **out);
/* Frees everything the builder owns. Accepts NULL. */
MS_API void ms_flame_destroy(ms_flame_t *fl);

/* Adds one stack, frames root first (nframes may be 0: the value goes to the root itself).
 * Names are byte strings (NUL-terminated; not required to be UTF-8). Adding to a builder that
 * already holds differential values is MS_ESTATE. A value of 0 adds the frames with no width.
 * @return MS_OK, MS_EINVAL (NULL frames with nframes > 0), MS_ESTATE, MS_ELIMIT (total value
 * would overflow 2^63 or more than 2^31 frames), MS_ENOMEM. On failure nothing was added. */
MS_API MS_NODISCARD int ms_flame_add(ms_flame_t *fl, const char *const *frames, size_t nframes,
                                     uint64_t value);

/* Adds one stack with its value before and after, making the builder differential (it must not
 * hold plain values: MS_ESTATE). Same errors as ms_flame_add. */
MS_API MS_NODISCARD int ms_flame_add_diff(ms_flame_t *fl, const char *const *frames,
                                          size_t nframes, uint64_t before, uint64_t after);

/* Parses folded text and adds every line: `frame;frame;...;leaf COUNT` (COUNT = the last
 * space-separated field, a decimal integer). A line `STACK BEFORE AFTER` (two counts, as written
 * by difffolded.pl) makes the builder differential; plain and two-count lines cannot be mixed.
 * Empty lines and trailing CR are ignored. Lines whose count is negative (PyTorch's stale <gaps>
 * sizes; flamegraph.pl drops them) are skipped and counted (ms_flame_lines_skipped()).
 * The text may be fed in pieces: a line split across calls is completed by the next call, and
 * ms_flame_finish_folded() ends the input (a last line without a newline).
 * @return MS_OK, MS_EFORMAT (eb: "line N: ..." naming what is wrong), MS_ESTATE, MS_ELIMIT
 * (a line longer than 64 MiB, values overflowing), MS_ENOMEM. On failure the lines before the bad
 * one stay added. eb may be NULL. */
MS_API MS_NODISCARD int ms_flame_add_folded(ms_flame_t *fl, const char *text, size_t len,
                                            ms_errbuf_t *eb);
/* Parses the unterminated last line given to ms_flame_add_folded(), if any. Same returns. */
MS_API MS_NODISCARD int ms_flame_finish_folded(ms_flame_t *fl, ms_errbuf_t *eb);
/* @return how many folded lines were skipped for a negative count. */
MS_API size_t ms_flame_lines_skipped(const ms_flame_t *fl);

/* @return the root's value (the sum of all values added; for diffs, the root's drawn width). */
MS_API uint64_t ms_flame_total(const ms_flame_t *fl);
/* @return 1 if the builder holds differential values, else 0. */
MS_API int ms_flame_is_diff(const ms_flame_t *fl);

/* Writes the interactive SVG (self-contained: CSS and script inline, nothing fetched). With no
 * stacks, a small valid SVG that says "No stacks" is written and MS_OK returned.
 * @return MS_OK, the sink's error, MS_ENOMEM. eb (may be NULL) describes a failure. */
MS_API MS_NODISCARD int ms_flame_write_svg(ms_flame_t *fl, ms_sink_t *sink, ms_errbuf_t *eb);

/* Writes the merged stacks as folded text, one line per frame with a non-zero self value, in the
 * graph's order (by name; input order for flame charts): `a;b;c 123\n`, or
 * `a;b;c BEFORE AFTER\n` for diffs. Names are written as given.
 * @return MS_OK, the sink's error, MS_ENOMEM. */
MS_API MS_NODISCARD int ms_flame_write_folded(ms_flame_t *fl, ms_sink_t *sink, ms_errbuf_t *eb);

MS_EXTERN_C_END

#endif /* MEMSNAP_VIZ_H */
