/* SPDX-License-Identifier: MIT
 * memsnap core: the classifier's internals (memsnap/attribution.h). rules.c: the rules text (the
 * defaults and the parser) and glob matching; stacks.c: per-frame and per-stack features;
 * classify.c: the phase spans of each device, a block's category, the category series; source.c:
 * the source of a stack and the rows of ms_attr_aggregate.
 */
#ifndef MEMSNAP_LIB_ATTRIBUTION_INTERNAL_H
#define MEMSNAP_LIB_ATTRIBUTION_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/internal.h"
#include "memsnap/attribution.h"

#define ATTR_MAX_TEXT (1u << 20)  /* bytes of a rules text */
#define ATTR_MAX_LINE 4096        /* bytes of one line */
#define ATTR_MAX_RULES 1024
#define ATTR_MAX_PATTERNS 256
#define ATTR_PW (ATTR_MAX_PATTERNS / 64) /* words of a pattern set */
#define ATTR_NONE UINT32_MAX
/* The stack of a block freed in the trace whose alloc is not in it: none is known. */
#define ATTR_STACK_UNRECORDED (UINT32_MAX - 1)

/* The phases. ATTR_PH_UNSET: an entry no stack or annotation classifies. */
typedef enum attr_phase {
  ATTR_PH_NONE = 0,
  ATTR_PH_FORWARD,
  ATTR_PH_BACKWARD,
  ATTR_PH_OPTIMIZER,
  ATTR_PH_INIT,
  ATTR_PH_COUNT,
  ATTR_PH_UNSET = 0xff
} attr_phase;

/* What a pattern is matched against. */
typedef enum attr_pkind { ATTR_P_FUNC = 0, ATTR_P_FILE, ATTR_P_FRAME, ATTR_P_ANNOTATION } attr_pkind;

typedef struct attr_pattern_s {
  attr_pkind kind;
  char *glob;  /* FUNC/FILE/ANNOTATION: the glob; FRAME: the function's glob */
  char *glob2; /* FRAME: the file's glob */
} attr_pattern_t;

/* What a rule's line is. */
typedef enum attr_rkind { ATTR_R_CATEGORY = 0, ATTR_R_PHASE, ATTR_R_SKIP, ATTR_R_PREFER } attr_rkind;

/* Lifetime conditions (values of freed=). */
enum { ATTR_FREED_ANY = 0, ATTR_FREED_WITHIN, ATTR_FREED_AFTER, ATTR_FREED_NEVER };
enum { ATTR_ALLOC_ANY = 0, ATTR_ALLOC_RECORDED, ATTR_ALLOC_UNRECORDED };

typedef struct attr_rule_s {
  attr_rkind kind;
  uint8_t target;    /* CATEGORY: ms_category; PHASE: attr_phase */
  uint8_t phase;     /* phase=: 1 << attr_phase, 0 = any */
  uint8_t prev, next; /* prev=/next=: 1 << attr_phase, 0 = any */
  uint8_t freed;     /* ATTR_FREED_* */
  uint8_t alloc;     /* ATTR_ALLOC_* */
  int8_t nostack;    /* stack=none: 1, stack=some: 0, any: -1 */
  bool matches_gradient;
  uint64_t need[ATTR_PW];   /* patterns some frame must match (each) */
  uint64_t forbid[ATTR_PW]; /* patterns no frame may match */
  bool has_frames;          /* need or forbid is not empty */
  uint32_t annotation;      /* PHASE by annotation: the pattern, else ATTR_NONE */
  uint32_t line;
} attr_rule_t;

typedef struct attr_rules_s {
  attr_pattern_t *pat;
  size_t npat;
  attr_rule_t *rules;
  size_t nrules;
  bool no_defaults; /* a `defaults none` line was read */
} attr_rules_t;

/* The words of a pattern set that rules r need (at least one). */
static inline size_t attr_pattern_words(const attr_rules_t *r) {
  return r->npat ? (r->npat + 63) / 64 : 1;
}

static inline bool attr_set_eq(const uint64_t *x, const uint64_t *y, size_t pw) {
  for (size_t w = 0; w < pw; w++)
    if (x[w] != y[w]) return false;
  return true;
}

/* Parses text (len bytes) into r, appending to what r holds. name is used in messages.
 * @return MS_OK, MS_EINVAL or MS_ELIMIT (eb: "NAME:LINE: what"), MS_ENOMEM. */
int ms__attr_rules_parse(attr_rules_t *r, const char *text, size_t len, const char *name,
                         ms_errbuf_t *eb);
void ms__attr_rules_free(attr_rules_t *r);
/* Glob match of text against pat (`*`, `?`, everything else literal; in `file` patterns a '\'
 * of the text matches '/'), in O(|pat| * |text|) time at worst. */
bool ms__attr_glob(const char *pat, const char *text, bool path);

/* One device's phase spans: contiguous, covering entries [0, n). */
typedef struct attr_span_s {
  uint32_t first; /* first entry */
  uint8_t phase;
} attr_span_t;

typedef struct attr_dev_s {
  size_t n;
  attr_span_t *spans;
  size_t nspans;
  uint64_t *grad_addr; /* sorted addresses of the blocks that matches=gradient selects */
  size_t ngrad_addr;
  uint64_t *end_addr, *end_size; /* the blocks alive at the end, by address, and their sizes */
  size_t nend;
  bool has_old;        /* a block alive at the end was allocated before recording and never freed
                          (only such blocks read matches=gradient) */
  /* per entry: the category of what an alloc entry allocated (0xff: not an alloc); a cache built
   * on first whole-trace use (ms__attr_ecat_ready), ecat_ready set (release) once it is whole */
  uint8_t *ecat;
  atomic_int ecat_ready;
} attr_dev_t;

enum {
  ATTR_F_PYTHON = 1u << 0, /* a Python source file (.py) */
  ATTR_F_SKIP = 1u << 1,   /* the skip list names it */
  ATTR_F_PREFER = 1u << 2, /* a prefer line names it */
  ATTR_F_OP = 1u << 3,     /* at::_ops::OP::call */
};

/* What a read found of the records whose stacks it left for later, for one rules text (seed.c). */
typedef struct attr_seed_s attr_seed_t;

/* The distinct pattern sets as they are found (stacks.c): ms__attr_set_index's lookup table, and
 * the last set asked with its index (allocations in a row mostly share theirs: no lookup then).
 * Zero it, with last_id ATTR_NONE; free tab. */
typedef struct attr_setq_s {
  uint32_t *tab;
  size_t cap;
  uint64_t last[ATTR_PW];
  uint32_t last_id;
} attr_setq_t;

struct ms_attr_s {
  const ms_snapshot_t *snap;
  const ms_timeline_t *tl;
  attr_rules_t rules;
  size_t pw;              /* words of a pattern set in use */
  uint8_t *fflags;        /* per frame: ATTR_F_* */
  uint64_t *fpat;         /* per frame: pattern set (pw words) */
  size_t rw;              /* words of a rule set */
  uint32_t *sset;         /* per stack: its pattern set (ATTR_NONE: not an allocation's) */
  uint64_t *set_pat;      /* per distinct pattern set: the set (pw words) */
  uint64_t *set_rules;    /* per set: the rules whose frame conditions hold (rw words) */
  uint8_t *set_phase;     /* per set: the phase by the phase rules (ATTR_PH_UNSET: none) */
  size_t nsets;
  /* Sources are computed on first use (timeline --by category needs none): under src_mu,
   * src_state 0 = not yet, 1 = done, else the error. */
  pthread_mutex_t src_mu;
  int src_state;
  uint32_t *ssrc;         /* per stack: the source frame (ATTR_NONE: none; for a stack no
                             allocation has, found when asked) */
  uint32_t *sop;          /* per stack: the op frame shown beside it (ATTR_NONE: none) */
  uint8_t *smulti;        /* per frame: allocations with it as their source go through several
                             ops (their op is shown) */
  size_t nst;             /* the snapshot's stacks when the classifier was made: sset, ssrc and
                             sop hold those (a stack read from the file later is read when
                             asked) */
  /* A snapshot read with stacks left for later (snapshot/deferred.h): per trace record whose stack
   * was still to read, the pattern set of its frames, read from the file again without interning
   * the stack (ATTR_NONE: the record's `stack` says); NULL when no record was. dfirst and dmulti
   * (per frame): what those records add to ms__attr_sources_link's first_op and multi. */
  uint32_t *eset;
  /* The same from a seed (seed.c), kept as the read made it: per record [0, neset8) a byte, the
   * index among the seed's sets (ATTR_SEED_NONE: the record's `stack` says), eset_map the set
   * each index is among a's (a 4-byte copy would cost 5 M records 20 MB of fresh pages and a
   * pass over them). At most one of eset and eset8 is set. */
  uint8_t *eset8;
  uint32_t *eset_map;
  size_t neset8;
  uint32_t *dfirst;
  uint8_t *dmulti;
  attr_seed_t *seed; /* what the read found of those records for these rules (seed.c), while the
                        classifier is made; NULL: they are read from the file again */
  attr_dev_t *dev;
  size_t ndev;
  /* The entries' categories (attr_dev_t.ecat) are built on first whole-trace use, under ecat_mu;
   * until then a block's category is found from its alloc entry alone (ms__attr_classify), and
   * after ATTR_DIRECT_MAX such answers the whole cache is built. */
  pthread_mutex_t ecat_mu;
  atomic_size_t ndirect;
};

/* eset8's mark of a record not left for later. */
#define ATTR_SEED_NONE UINT8_MAX

/* The pattern set of trace record rec from what the read of its file found (eset, eset8):
 * ATTR_NONE when that says nothing (the record's `stack` does). */
static inline uint32_t attr_record_set(const ms_attr_t *a, size_t rec) {
  if (a->eset8)
    return rec < a->neset8 && a->eset8[rec] != ATTR_SEED_NONE ? a->eset_map[a->eset8[rec]]
                                                              : ATTR_NONE;
  return a->eset ? a->eset[rec] : ATTR_NONE;
}

/* The unseen mark of ms__attr_sources_link's first_op (and of dfirst). */
#define ATTR_OP_UNSEEN (ATTR_NONE - 2)

/* Answers found without the entries' cache before the cache is built (classify.c). */
#define ATTR_DIRECT_MAX 4096

/* The walk of a stack's frames, innermost first, that finds its source frame (the first Python
 * frame the skip list keeps, else the first frame a prefer line names, else the first other kept
 * frame) and the op frame (at::_ops::OP::call) last passed before it. */
typedef struct attr_srcwalk_s {
  uint32_t py, pyop, prefer, prefop, cpp, cppop, lastop;
} attr_srcwalk_t;

static inline void attr_srcwalk_init(attr_srcwalk_t *w) {
  w->py = w->pyop = w->prefer = w->prefop = w->cpp = w->cppop = w->lastop = ATTR_NONE;
}

/* Reads frame f (flags fl: ATTR_F_*). @return true once the source is found: frames further out
 * cannot change it. */
static inline bool attr_srcwalk_frame(attr_srcwalk_t *w, uint8_t fl, uint32_t f) {
  if (fl & ATTR_F_OP) w->lastop = f;
  if (fl & ATTR_F_SKIP) return false;
  if (fl & ATTR_F_PYTHON) {
    w->py = f;
    w->pyop = w->lastop;
    return true;
  }
  if ((fl & ATTR_F_PREFER) && w->prefer == ATTR_NONE) {
    w->prefer = f;
    w->prefop = w->lastop;
  } else if (w->cpp == ATTR_NONE) {
    w->cpp = f;
    w->cppop = w->lastop;
  }
  return false;
}

/* The source frame and op frame the walk found (ATTR_NONE: none). */
static inline void attr_srcwalk_end(const attr_srcwalk_t *w, uint32_t *src, uint32_t *op) {
  if (w->py != ATTR_NONE) {
    *src = w->py;
    *op = w->pyop;
  } else if (w->prefer != ATTR_NONE) {
    *src = w->prefer;
    *op = w->prefop;
  } else {
    *src = w->cpp;
    *op = w->cppop;
  }
}

/* ms_attr_create() that, with sources set, also finds every allocation stack's source while
 * ms__attr_stacks reads the stack for its pattern set (its frames up to the first Python one,
 * still in cache), rather than in a second walk on first use (ms__attr_sources): for callers that
 * ask for sources anyway (compare's report). The classifier answers the same either way. */
int ms__attr_create_ex(const ms_snapshot_t *snap, const ms_timeline_t *tl,
                       const ms_attr_config_t *cfg, bool sources, ms_attr_t **out,
                       ms_errbuf_t *eb);

/* The rules of cfg: its text, then the default rules unless it replaces them (attr.c). */
int ms__attr_rules_load(attr_rules_t *r, const ms_attr_config_t *cfg, ms_errbuf_t *eb);

/* seed.c: the seed snap's read kept for the rules of cfg (NULL: none, or one for other rules, or
 * one a classifier took already). */
attr_seed_t *ms__attr_seed_match(const ms_snapshot_t *snap, const ms_attr_config_t *cfg);
/* Gives a (its sets so far made by its snapshot's stacks) what seed z found: eset, dfirst,
 * dmulti, its sets added in the order the records met them (through q, a's). Once: z is taken.
 * MS_ENOMEM. */
int ms__attr_seed_take(ms_attr_t *a, attr_seed_t *z, attr_setq_t *q);

/* stacks.c */

/* Which patterns a function (name side: func= and the function of frame=) or a file (file side:
 * file= and the file of frame=) matches, remembered by the string's address: a function or a file
 * is one stored string shared by all of its frames, so each is matched once. */
typedef struct attr_strbits_s {
  const char **key; /* NULL: an empty slot */
  uint64_t *bits;   /* pw words a slot */
  size_t cap, len;
} attr_strbits_t;
void ms__attr_strbits_free(attr_strbits_t *m);
/* Frame f's pattern set (set: a->pw words) and flags (ATTR_F_*) under a's rules; names and files
 * remember what each string matched. false: out of memory. */
bool ms__attr_frame_features(const ms_attr_t *a, const ms_snap_frame_t *f, attr_strbits_t *names,
                             attr_strbits_t *files, uint64_t *set, uint8_t *flags);
/* Every frame's features of a's snapshot (fpat, fflags). */
int ms__attr_frames(ms_attr_t *a);
/* The pattern set of frames fr[0..n) (indices into a->fpat and a->fflags), and with src, their
 * source and op frame (as ms__attr_stack_set's for a stack of those frames). */
void ms__attr_frames_set(const ms_attr_t *a, const uint32_t *fr, size_t n, uint64_t *set,
                         uint32_t *src, uint32_t *op);
/* The index of pattern set `set` among a's distinct sets, added (with its rules and phase) when
 * new; *tab (*cap slots, grown here) is the lookup table. MS_ENOMEM. */
int ms__attr_set_index(ms_attr_t *a, const uint64_t *set, uint32_t **tab, size_t *cap,
                       uint32_t *out);
/* ms__attr_set_index through q. */
int ms__attr_setq_index(ms_attr_t *a, attr_setq_t *q, const uint64_t *set, uint32_t *out);
/* What an allocation whose source frame is src (ATTR_NONE: none) and op frame op adds to
 * first_op and multi (ms__attr_sources_link's, and the records' dfirst and dmulti). */
static inline void attr_note_op(uint32_t *first_op, uint8_t *multi, uint32_t src, uint32_t op) {
  if (src == ATTR_NONE) return;
  if (first_op[src] == ATTR_OP_UNSEEN)
    first_op[src] = op;
  else if (first_op[src] != op)
    multi[src] = 1;
}
/* Every allocation stack's pattern set (sset) and, with sources, its source (ssrc, sop, smulti:
 * as ms__attr_sources gives them; src_state set). A snapshot read with stacks left for later has
 * those records read from its file again (eset, dfirst, dmulti): MS_EIO or MS_EFORMAT (eb says
 * why) when the file changed since. */
int ms__attr_stacks(ms_attr_t *a, bool sources, ms_errbuf_t *eb);
/* The rules whose frame conditions pattern set `set` meets (bits: a->rw words); @return the phase
 * the phase rules give it (ATTR_PH_UNSET: none). */
uint8_t ms__attr_set_eval(const ms_attr_t *a, const uint64_t *set, uint64_t *bits);
/* The pattern set of stack st (the union of its frames'); with src, also its source and op frame
 * (*src, *op: the frames up to its first Python frame). */
void ms__attr_stack_set(const ms_attr_t *a, uint32_t st, uint64_t *set, uint32_t *src,
                        uint32_t *op);

/* classify.c */
int ms__attr_spans(ms_attr_t *a);
/* The category of a block by its lifetime; stack = its allocation stack (NO_STACK: none). */
ms_category ms__attr_classify(const ms_attr_t *a, size_t dev, int64_t alloc_entry,
                              int64_t free_entry, uint32_t stack, uint64_t address,
                              bool ignore_matches);
int ms__attr_gradient_sizes(ms_attr_t *a);
/* The category of the block that alloc entry i of device dev allocated (its free: the index's
 * pair; pre: entry i is an alloc). Builds device dev's cache of every entry's category first. */
ms_category ms__attr_entry_category(const ms_attr_t *a, size_t dev, size_t i);
/* The same found alone, without the cache: what the cache holds for it (a category the snapshot
 * carries wins over the rules). */
ms_category ms__attr_entry_alone(const ms_attr_t *a, size_t dev, size_t i);
/* Builds device dev's cache of every alloc entry's category once, whichever thread asks first
 * (a cache: where it cannot be built, for want of memory, each answer is found alone, the same).
 * @return whether the cache is whole. */
bool ms__attr_ecat_ready(const ms_attr_t *a, size_t dev);
/* The size of the block that alloc entry i of device dev allocated: the index's (inferred) size,
 * or the snapshot's when the block is alive at the end. */
uint64_t ms__attr_entry_size(const ms_attr_t *a, size_t dev, size_t i);
/* The allocation stack a block's category and source read (MS_SNAP_NO_STACK, or
 * ATTR_STACK_UNRECORDED when only its free was recorded). */
uint32_t ms__attr_block_stack(const ms_attr_t *a, size_t dev, const ms_tl_block_t *b);

/* attr.c: one row per block lifetime of a device (the SQLite export's allocations table): the
 * blocks alive before entry 0 (in address order), then every alloc entry in order. */
typedef struct attr_life_s {
  int64_t alloc_entry;  /* -1: allocated before recording */
  int64_t freq_entry;   /* free_requested: -2 none, -1 before recording */
  int64_t free_entry;   /* free_completed: -1 none (alive at the end) */
  int64_t time_us;      /* of the alloc entry, -1 unknown */
  uint64_t address, size, requested_size, stream;
  uint32_t stack;       /* allocation stack (MS_SNAP_NO_STACK, ATTR_STACK_UNRECORDED) */
  uint8_t category;
  int64_t free_time_us; /* of the free_completed entry, -1 unknown or none */
} attr_life_t;
int ms__attr_lifetimes(const ms_attr_t *a, size_t dev, attr_life_t **out, size_t *n);

/* source.c */
int ms__attr_sources(ms_attr_t *a);
/* The parts of ms__attr_sources: allocates ssrc and sop, and the work arrays first_op and multi
 * (per frame; first_op is freed by the caller, multi becomes smulti); marks stack st as one whose
 * source is found when asked; and, once every allocation stack has its source and op frame (the
 * others marked), decides which sources show their op and keeps multi as smulti. */
int ms__attr_sources_alloc(ms_attr_t *a, uint32_t **first_op, uint8_t **multi);
void ms__attr_stack_later(ms_attr_t *a, uint32_t st);
void ms__attr_sources_link(ms_attr_t *a, uint32_t *first_op, uint8_t *multi);
/* Computes the sources once, whichever thread asks first. @return MS_OK or MS_ENOMEM. */
int ms__attr_sources_ready(const ms_attr_t *a);
/* Writes the source of stack into buf (cap >= 1); @return its length (truncated to cap - 1). */
size_t ms__attr_source_fmt(const ms_attr_t *a, uint32_t stack, char *buf, size_t cap);

#endif /* MEMSNAP_LIB_ATTRIBUTION_INTERNAL_H */
