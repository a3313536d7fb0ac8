/* SPDX-License-Identifier: MIT
 * memsnap: what each allocation is (issue #27): its *source* (the innermost frame of the user's
 * own code) and its *category* (parameter, gradient, optimizer state, activation, temporary,
 * input, autograd detail, unknown), inferred from its stack and its lifetime over the time index.
 * docs/categories.md describes every category, the signals behind it and the rules file format.
 *
 * Vocabulary:
 *  - A *classifier* (ms_attr_t) is built once per snapshot and its time index, with rules (the
 *    defaults, optionally replaced or extended by a rules text). It is immutable afterwards: any
 *    number of threads may query it. The snapshot and the index must outlive it.
 *  - A *phase* is a span of a device's trace entries: the stacks of its allocations say forward,
 *    backward, optimizer or init (model construction), and annotation ranges (e.g.
 *    `Optimizer.step#AdamW.step`) may force one; the entries between two spans of different
 *    phases form a `none` span. Every entry lies in exactly one span.
 *  - A block's category depends on its allocation stack, the phase span of its alloc entry, and
 *    where its free entry falls (within the span, after it, never). It never depends on the
 *    moment at which it is asked: a block has one category over its whole life.
 *  - The *source* of a stack: the innermost frame of a Python file the skip list does not name,
 *    as `FILE:LINE FUNC` (FILE without the directories up to `site-packages/`); where two stacks
 *    share that line but allocate through different operators, ` → at::OP` is added (the
 *    outermost `at::_ops::OP::call` frame). A stack without such a Python frame is named by its
 *    innermost meaningful C++ frame (an autograd node such as `MulBackward0`, `AccumulateGrad`, or
 *    the innermost frame the skip list does not name). `<no frame>`: the stack is empty or every
 *    frame is skipped; `<no stack recorded>`: the block has no stack at all.
 */
#ifndef MEMSNAP_ATTRIBUTION_H
#define MEMSNAP_ATTRIBUTION_H

#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

MS_EXTERN_C_BEGIN

/* The categories, in the order of PyTorch's profiler legend, unknown last. */
typedef enum ms_category {
  MS_CAT_PARAMETER = 0,
  MS_CAT_OPTIMIZER_STATE,
  MS_CAT_INPUT,
  MS_CAT_TEMPORARY,
  MS_CAT_ACTIVATION,
  MS_CAT_GRADIENT,
  MS_CAT_AUTOGRAD_DETAIL,
  MS_CAT_UNKNOWN,
  MS_CAT_COUNT
} ms_category;

/* @return "parameter", "optimizer_state", "input", "temporary", "activation", "gradient",
 * "autograd_detail", "unknown" ("?" otherwise). */
MS_API const char *ms_category_name(ms_category c);
/* @return the category named s (as ms_category_name), or MS_CAT_COUNT when none is. */
MS_API ms_category ms_category_parse(const char *s);
/* @return the colour PyTorch's profiler gives c ("darkgreen", ...; "grey" for unknown). */
MS_API const char *ms_category_color(ms_category c);

typedef struct ms_attr_s ms_attr_t;

typedef struct ms_attr_config_s {
  const char *rules;     /* a rules text (docs/categories.md), or NULL for the defaults only */
  size_t rules_len;      /* its length in bytes */
  const char *rules_name; /* its name in error messages (e.g. the file name); NULL: "rules" */
  bool replace;          /* the text replaces the default rules (else they follow it, so that
                            its rules are tried first; a `defaults none` line in the text
                            replaces them too) */
} ms_attr_config_t;

/* Fills the defaults (no rules text). */
MS_API void ms_attr_config_init(ms_attr_config_t *cfg);

/* @return the default rules text (a valid rules file, documented line by line). */
MS_API const char *ms_attr_default_rules(void);

/* Builds the classifier of snap over its time index tl (built from snap). cfg may be NULL.
 * A rules text over 1 MiB, a line over 4096 bytes, more than 1024 rules or more than 256 patterns
 * is refused; a syntax error names the line ("rules:12: unknown condition 'phse=forward'").
 * Patterns are globs (`*`, `?`), matched in time linear in the pattern times the text: no input
 * makes matching slow. @return MS_OK, MS_EINVAL (bad rules, eb says where), MS_ELIMIT (too big,
 * eb says what), MS_ENOMEM. *out untouched on failure. */
MS_API MS_NODISCARD int ms_attr_create(const ms_snapshot_t *snap, const ms_timeline_t *tl,
                                       const ms_attr_config_t *cfg, ms_attr_t **out,
                                       ms_errbuf_t *eb);
/* Frees a classifier. Accepts NULL. */
MS_API void ms_attr_destroy(ms_attr_t *a);

/* ms_snapshot_load_ex(path, flags, out, eb) that, when flags hold MS_LOAD_DEFER_STACKS, also
 * finds as it reads them what a classifier of cfg (NULL: the defaults) needs of the allocations
 * whose stacks it leaves for later: the first ms_attr_create() on *out with the same rules text
 * and replace flag then does not read their frames from the file again (0.25 s of a 1 GB pickle).
 * The classifier is the same either way; another one, or one of other rules, reads the file
 * again. Rules that do not parse are not an error here (ms_attr_create says what is wrong with
 * them): the read is then ms_snapshot_load_ex's. As on any snapshot whose stacks are left for
 * later, classifiers of *out are made one at a time. @return as ms_snapshot_load_ex(). */
MS_API MS_NODISCARD int ms_attr_load(const char *path, unsigned flags, const ms_attr_config_t *cfg,
                                     ms_snapshot_t **out, ms_errbuf_t *eb);

/* Writes the source of stack (MS_SNAP_NO_STACK allowed) into buf (cap >= 1), NUL-terminated,
 * truncated to cap - 1 bytes. @return its length before truncation. */
MS_API size_t ms_attr_source(const ms_attr_t *a, uint32_t stack, char *buf, size_t cap);

/* The category of a live block of device dev (as ms_timeline_state_at gives it). */
MS_API ms_category ms_attr_block_category(const ms_attr_t *a, size_t dev, const ms_tl_block_t *b);

/* The category of the block that trace entry `entry` (an alloc) of device dev allocated, over
 * its whole life; MS_CAT_UNKNOWN for an unknown device or entry. */
MS_API ms_category ms_attr_entry_category(const ms_attr_t *a, size_t dev, size_t entry);

/* How the rows of ms_attr_aggregate group blocks. */
typedef enum ms_attr_by {
  MS_ATTR_BY_CATEGORY = 0, /* key: the category's name; every category has a row (0 bytes too) */
  MS_ATTR_BY_SOURCE,       /* key: the source */
  MS_ATTR_BY_STACK,        /* key: the stack's Python frames and the other frames that the
                              skip list keeps, outermost first, joined by ';'
                              (FILE:LINE:FUNC for Python frames) */
} ms_attr_by;

typedef struct ms_attr_row_s {
  const char *key;      /* owned by the rows (or the classifier) */
  uint64_t bytes;       /* allocated bytes */
  uint64_t blocks;      /* allocated blocks */
  uint32_t stack;       /* BY_STACK: the stack; BY_SOURCE: its biggest stack; else NO_STACK */
  ms_category category; /* BY_CATEGORY: the row's category; else the category of most bytes */
} ms_attr_row_t;

typedef struct ms_attr_rows_s {
  ms_attr_row_t *rows; /* bytes descending, then blocks descending, then key ascending */
  size_t nrows;
  uint64_t total_bytes, total_blocks; /* of every row */
  char *strings_;                     /* private */
} ms_attr_rows_t;

/* Groups the allocated (not pending-free) blocks of state st (of device st->device) by category,
 * source or stack. Only blocks inside segments that pass filter count (NULL: all).
 * @return MS_OK, MS_EINVAL (unknown by), MS_ENOMEM. *out untouched on failure. */
MS_API MS_NODISCARD int ms_attr_aggregate_state(const ms_attr_t *a, const ms_tl_state_t *st,
                                                const ms_tl_filter_t *filter, ms_attr_by by,
                                                ms_attr_rows_t *out);
/* The same at step `step` of device dev of the classifier's index. @return as above, and
 * MS_EINVAL for an unknown device or step. */
MS_API MS_NODISCARD int ms_attr_aggregate(const ms_attr_t *a, size_t dev, size_t step,
                                          const ms_tl_filter_t *filter, ms_attr_by by,
                                          ms_attr_rows_t *out);
/* Frees the rows. Accepts NULL and zeroed rows. */
MS_API void ms_attr_rows_free(ms_attr_rows_t *r);

/* Bytes per category of the allocated blocks at every step of device dev (for `timeline --by
 * category`): out[s * MS_CAT_COUNT + c] for steps 0..nentries, an array the caller frees with
 * free(). Walks the trace once. @return MS_OK, MS_EINVAL (unknown device), MS_ENOMEM. */
MS_API MS_NODISCARD int ms_attr_category_series(const ms_attr_t *a, size_t dev, uint64_t **out);

/* The peak of each category over steps [from, to] of device dev and the bytes of each at step
 * `at` (e.g. the peak of allocated), from one walk of the trace that keeps no series. */
typedef struct ms_attr_peaks_s {
  uint64_t peak[MS_CAT_COUNT];    /* the highest bytes of each category (0: never held) */
  size_t peak_step[MS_CAT_COUNT]; /* the first step where it is reached (from when never held) */
  uint64_t at[MS_CAT_COUNT];      /* the bytes of each category at step `at` */
} ms_attr_peaks_t;
/* @return MS_OK, MS_EINVAL (unknown device, from > to, at past the end), MS_ENOMEM. */
MS_API MS_NODISCARD int ms_attr_category_peaks(const ms_attr_t *a, size_t dev, size_t from,
                                               size_t to, size_t at, ms_attr_peaks_t *out);

MS_EXTERN_C_END

#endif /* MEMSNAP_ATTRIBUTION_H */
