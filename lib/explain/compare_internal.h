/* SPDX-License-Identifier: MIT
 * memsnap core: what the comparison's files share (memsnap/compare.h). compare.c: the sides, the
 * change by source and category, the settings; compare_leaks.c: the leak suspects; gate.c: the
 * gate's limits and figures.
 */
#ifndef MEMSNAP_LIB_EXPLAIN_COMPARE_INTERNAL_H
#define MEMSNAP_LIB_EXPLAIN_COMPARE_INTERNAL_H

#include "common/internal.h"
#include "common/vec.h"
#include "memsnap/attribution.h"
#include "memsnap/compare.h"

/* The strings a result owns. */
typedef struct cmp_strings_s {
  MS_VEC(char *) v;
} cmp_strings_t;
/* @return a copy of text owned by s, or NULL (out of memory). */
const char *ms__cmp_strdup(cmp_strings_t *s, const char *text);
void ms__cmp_strings_free(cmp_strings_t *s);

/* A side's top-level allocator setting: its key and its value as text ("True", "{1: 4}"). */
typedef struct cmp_setting_text_s {
  const char *key, *text;
} cmp_setting_text_t;
typedef struct cmp_settings_s {
  MS_VEC(cmp_setting_text_t) v;
} cmp_settings_t;

/* One side of a comparison, open: its index, the state at its moment, its classifier. */
typedef struct cmp_side_s {
  const ms_snapshot_t *snap;
  ms_timeline_t *tl;
  ms_tl_state_t st;
  ms_attr_t *attr;
  bool borrowed; /* tl and attr belong to another side (the same snapshot) */
  bool given_tl; /* tl is the caller's (ms_compare_add_indexed) */
  ms_compare_side_t fig;
} cmp_side_t;

/* Whether device dev has allocation history (not only a `snapshot` entry or a lone free). */
bool ms__cmp_has_trace(const ms_snapshot_t *snap, size_t dev);
/* The device: want (>= 0, which must have a trace or segments) or the viewer's default; side
 * names the snapshot in errors. */
int ms__cmp_device(const ms_snapshot_t *snap, int want, const char *side, size_t *dev,
                   ms_errbuf_t *eb);
/* Opens a side at moment m (NULL: the peak of allocated, or the end without a trace); share (may
 * be NULL) is an open side of the same snapshot whose index and classifier it borrows; tl (may be
 * NULL) is snap's index (default configuration) to read instead of building one. */
int ms__cmp_side_open(const ms_snapshot_t *snap, int device, const ms_tl_moment_t *m,
                      const char *name, const cmp_side_t *share, const ms_timeline_t *tl,
                      cmp_side_t *s, ms_errbuf_t *eb);
void ms__cmp_side_close(cmp_side_t *s);

/* The leak suspects of side s (AFTER) into c->leaks, c->steps. @return MS_OK or MS_ENOMEM. */
int ms__cmp_leaks(ms_compare_t *c, cmp_strings_t *strs, const cmp_side_t *s, double tolerance);

#endif /* MEMSNAP_LIB_EXPLAIN_COMPARE_INTERNAL_H */
