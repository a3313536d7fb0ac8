/* SPDX-License-Identifier: MIT
 * memsnap core: the classifier (memsnap/attribution.h, attribution/internal.h): per-frame
 * features, per-stack features, each device's phase spans, the gradient sizes that name the
 * parameters allocated before recording, a block's category, and the category series.
 *
 * Cost: every distinct function and file string is matched once against every pattern (a frame's
 * set is its function's and its file's); every allocation's stack is read once (its frames'
 * pattern sets ORed, several frames at a time; its source from its frames up to the first Python
 * one); spans are one pass over each trace. Classifying a block is a binary search over its
 * device's spans and a walk of the category rules (a few dozen).
 */
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "common/hash.h"
#include "snapshot/deferred.h"
#include "timeline/internal.h"

/* ---- frames and stacks --------------------------------------------------------------------- */

/* Which patterns a frame's function (name side: func= and the function of frame=) or its file
 * (file side: file= and the file of frame=) matches, remembered by the string's address: a
 * function or a file is one stored string shared by all of its frames (its other lines), so each
 * is matched against the patterns once. */
typedef struct attr_strbits_s {
  const char **key; /* NULL: an empty slot */
  uint64_t *bits;   /* pw words a slot */
  size_t cap, len;
} attr_strbits_t;

static void attr_strbits_match(const ms_attr_t *a, const char *str, bool file, uint64_t *bits) {
  memset(bits, 0, a->pw * sizeof *bits);
  for (size_t p = 0; p < a->rules.npat; p++) {
    const attr_pattern_t *pt = &a->rules.pat[p];
    bool hit = false;
    if (!file && (pt->kind == ATTR_P_FUNC || pt->kind == ATTR_P_FRAME))
      hit = ms__attr_glob(pt->glob, str, false);
    else if (file && pt->kind == ATTR_P_FILE)
      hit = ms__attr_glob(pt->glob, str, true);
    else if (file && pt->kind == ATTR_P_FRAME)
      hit = ms__attr_glob(pt->glob2, str, true);
    if (hit) bits[p / 64] |= 1ull << (p % 64);
  }
}

static size_t attr_strbits_slot(const attr_strbits_t *m, const char *str) {
  size_t i = (size_t)(ms_hash_mum((uint64_t)(uintptr_t)str, 0x9e3779b97f4a7c15ull) >> 7) &
             (m->cap - 1);
  while (m->key[i] && m->key[i] != str) i = (i + 1) & (m->cap - 1);
  return i;
}

/* The bits of str (computed when first asked); NULL when out of memory. */
static const uint64_t *attr_strbits_get(const ms_attr_t *a, attr_strbits_t *m, const char *str,
                                        bool file) {
  if ((m->len + 1) * 2 > m->cap) {
    attr_strbits_t g = {NULL, NULL, m->cap ? m->cap * 2 : 256, m->len};
    g.key = calloc(g.cap, sizeof *g.key);
    g.bits = malloc(g.cap * a->pw * sizeof *g.bits);
    if (!g.key || !g.bits) {
      free(g.key);
      free(g.bits);
      return NULL;
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->key[i]) continue;
      size_t j = attr_strbits_slot(&g, m->key[i]);
      g.key[j] = m->key[i];
      memcpy(&g.bits[j * a->pw], &m->bits[i * a->pw], a->pw * sizeof *g.bits);
    }
    free(m->key);
    free(m->bits);
    *m = g;
  }
  size_t i = attr_strbits_slot(m, str);
  if (!m->key[i]) {
    m->key[i] = str;
    m->len++;
    attr_strbits_match(a, str, file, &m->bits[i * a->pw]);
  }
  return &m->bits[i * a->pw];
}

static bool attr_set_holds(const attr_rule_t *ru, const uint64_t *set, size_t pw) {
  for (size_t w = 0; w < pw; w++)
    if ((set[w] & ru->need[w]) != ru->need[w] || (set[w] & ru->forbid[w])) return false;
  return true;
}

static bool attr_ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

int ms__attr_frames(ms_attr_t *a) {
  const ms_snapshot_t *s = a->snap;
  a->pw = (a->rules.npat + 63) / 64;
  if (a->pw == 0) a->pw = 1;
  size_t nf = s->nframes ? s->nframes : 1;
  a->fflags = calloc(nf, 1);
  a->fpat = calloc(nf * a->pw, sizeof *a->fpat);
  if (!a->fflags || !a->fpat) return MS_ENOMEM;
  uint64_t frame_pat[ATTR_PW] = {0}; /* frame= patterns: both sides must match */
  for (size_t p = 0; p < a->rules.npat; p++)
    if (a->rules.pat[p].kind == ATTR_P_FRAME) frame_pat[p / 64] |= 1ull << (p % 64);
  attr_strbits_t names = {0}, files = {0};
  int rc = MS_OK;
  for (size_t i = 0; i < s->nframes && rc == MS_OK; i++) {
    const ms_snap_frame_t *f = &s->frames[i];
    uint64_t *set = &a->fpat[i * a->pw];
    const uint64_t *nb = attr_strbits_get(a, &names, f->name, false);
    const uint64_t *fb = nb ? attr_strbits_get(a, &files, f->filename, true) : NULL;
    if (!nb || !fb) {
      rc = MS_ENOMEM;
      break;
    }
    for (size_t w = 0; w < a->pw; w++)
      set[w] = ((nb[w] | fb[w]) & ~frame_pat[w]) | (nb[w] & fb[w] & frame_pat[w]);
    uint8_t fl = 0;
    if (attr_ends_with(f->filename, ".py")) fl |= ATTR_F_PYTHON;
    if (strncmp(f->name, "at::_ops::", 10) == 0 && strstr(f->name, "::call(")) fl |= ATTR_F_OP;
    for (size_t r = 0; r < a->rules.nrules; r++) {
      const attr_rule_t *ru = &a->rules.rules[r];
      if (ru->kind == ATTR_R_SKIP && !(fl & ATTR_F_SKIP) && attr_set_holds(ru, set, a->pw))
        fl |= ATTR_F_SKIP;
      if (ru->kind == ATTR_R_PREFER && !(fl & ATTR_F_PREFER) && attr_set_holds(ru, set, a->pw))
        fl |= ATTR_F_PREFER;
    }
    a->fflags[i] = fl;
  }
  free(names.key);
  free(names.bits);
  free(files.key);
  free(files.bits);
  return rc;
}

/* A pattern set's hash: every word mixed in, so that sets differing in any bit (the high
 * patterns' words too) spread over the lookup table's slots. */
static uint64_t attr_set_hash(const uint64_t *set, size_t pw) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t w = 0; w < pw; w++) h = ms_hash_step(h, set[w]);
  return h;
}

static bool attr_set_eq(const uint64_t *x, const uint64_t *y, size_t pw) {
  for (size_t w = 0; w < pw; w++)
    if (x[w] != y[w]) return false;
  return true;
}

/* The rules whose frame conditions pattern set `set` meets (bits: a->rw words), and the phase
 * the phase rules give it (ATTR_PH_UNSET: none), returned. */
static uint8_t attr_set_eval(const ms_attr_t *a, const uint64_t *set, uint64_t *bits) {
  memset(bits, 0, a->rw * sizeof *bits);
  uint8_t ph = ATTR_PH_UNSET;
  for (size_t r = 0; r < a->rules.nrules; r++) {
    const attr_rule_t *ru = &a->rules.rules[r];
    if (ru->kind != ATTR_R_CATEGORY && ru->kind != ATTR_R_PHASE) continue;
    if (ru->annotation != ATTR_NONE) continue;
    if (ru->has_frames && !attr_set_holds(ru, set, a->pw)) continue;
    bits[r / 64] |= 1ull << (r % 64);
    if (ru->kind == ATTR_R_PHASE && ph == ATTR_PH_UNSET) ph = ru->target;
  }
  return ph;
}

/* The index of pattern set `set` among the distinct ones (added with its rule bits and phase when
 * new): stacks share few sets (every forward stack matches the same patterns), so the rules are
 * evaluated once per set and a stack holds only its set's index. */
static int attr_set_index(ms_attr_t *a, const uint64_t *set, uint32_t **tab, size_t *cap,
                          uint32_t *out) {
  uint64_t h = attr_set_hash(set, a->pw);
  if ((a->nsets + 1) * 2 > *cap) { /* grow the lookup table */
    size_t ncap = *cap ? *cap * 2 : 256;
    uint32_t *nt = malloc(ncap * sizeof *nt);
    if (!nt) return MS_ENOMEM;
    memset(nt, 0xff, ncap * sizeof *nt);
    for (size_t i = 0; i < a->nsets; i++) {
      size_t j = (size_t)attr_set_hash(&a->set_pat[i * a->pw], a->pw) & (ncap - 1);
      while (nt[j] != ATTR_NONE) j = (j + 1) & (ncap - 1);
      nt[j] = (uint32_t)i;
    }
    free(*tab);
    *tab = nt;
    *cap = ncap;
  }
  size_t j = (size_t)h & (*cap - 1);
  for (; (*tab)[j] != ATTR_NONE; j = (j + 1) & (*cap - 1))
    if (attr_set_eq(&a->set_pat[(size_t)(*tab)[j] * a->pw], set, a->pw)) {
      *out = (*tab)[j];
      return MS_OK;
    }
  size_t n = a->nsets;
  uint64_t *np = realloc(a->set_pat, (n + 1) * a->pw * sizeof *np);
  if (np) a->set_pat = np;
  uint64_t *nr = np ? realloc(a->set_rules, (n + 1) * a->rw * sizeof *nr) : NULL;
  if (nr) a->set_rules = nr;
  uint8_t *nph = nr ? realloc(a->set_phase, n + 1) : NULL;
  if (!nph) return MS_ENOMEM;
  a->set_phase = nph;
  memcpy(&np[n * a->pw], set, a->pw * sizeof *set);
  nph[n] = attr_set_eval(a, set, &nr[n * a->rw]);
  (*tab)[j] = (uint32_t)n;
  a->nsets = n + 1;
  *out = (uint32_t)n;
  return MS_OK;
}

/* The union of the pattern sets of frames fi[0..n) (one word per set, a->pw == 1), four frames at a
 * time in independent registers. */
static uint64_t attr_or1(const uint64_t *fp, const uint16_t *fi, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 |= fp[fi[j]];
    s1 |= fp[fi[j + 1]];
    s2 |= fp[fi[j + 2]];
    s3 |= fp[fi[j + 3]];
  }
  for (; j < n; j++) s0 |= fp[fi[j]];
  return s0 | s1 | s2 | s3;
}

#if defined(__GNUC__) || defined(__clang__)
/* Both words of a two-word set in one 16-byte register (the sets lie pairwise in fpat). */
typedef uint64_t attr_v2_t __attribute__((vector_size(16)));

static inline attr_v2_t attr_v2_at(const uint64_t *fp, uint16_t f) {
  attr_v2_t v;
  memcpy(&v, &fp[2 * (size_t)f], sizeof v);
  return v;
}

/* attr_or1 for two-word sets (a->pw == 2): set[0..2). */
static void attr_or2(const uint64_t *fp, const uint16_t *fi, size_t n, uint64_t *set) {
  attr_v2_t a = {0, 0}, b = {0, 0};
  size_t j = 0;
  for (; j + 2 <= n; j += 2) {
    a |= attr_v2_at(fp, fi[j]);
    b |= attr_v2_at(fp, fi[j + 1]);
  }
  if (j < n) a |= attr_v2_at(fp, fi[j]);
  a |= b;
  set[0] = a[0];
  set[1] = a[1];
}
#else
static void attr_or2(const uint64_t *fp, const uint16_t *fi, size_t n, uint64_t *set) {
  uint64_t s0 = 0, s1 = 0;
  for (size_t j = 0; j < n; j++) {
    s0 |= fp[2 * (size_t)fi[j]];
    s1 |= fp[2 * (size_t)fi[j] + 1];
  }
  set[0] = s0;
  set[1] = s1;
}
#endif

/* The pattern set of stack st (the union of its frames'); with src, also its source frame and op
 * frame (*src, *op: source.c's attr_stack_source, the frames up to its first Python frame). */
static void attr_stack_set(const ms_attr_t *a, uint32_t st, uint64_t *set, uint32_t *src,
                           uint32_t *op) {
  const ms_snapshot_t *s = a->snap;
  const ms_snap_stack_t *k = &s->stacks[st];
  attr_srcwalk_t w;
  attr_srcwalk_init(&w);
  memset(set, 0, ATTR_PW * sizeof *set);
  if (s->stack_frames16 && a->pw <= 2) { /* the common case, tight loops (5 M stacks) */
    const uint16_t *fi = &s->stack_frames16[k->first];
    if (src) { /* the source: the walk stops at the first Python frame */
      const uint8_t *fl = a->fflags;
      for (uint32_t j = 0; j < k->nframes; j++)
        if (attr_srcwalk_frame(&w, fl[fi[j]], fi[j])) break;
    }
    if (a->pw == 1)
      set[0] = attr_or1(a->fpat, fi, k->nframes);
    else
      attr_or2(a->fpat, fi, k->nframes, set);
  } else {
    bool found = src == NULL; /* no source asked: nothing to find */
    for (uint32_t j = 0; j < k->nframes; j++) {
      uint32_t f = ms_snap_frame_index(s, k->first + j);
      const uint64_t *fs = &a->fpat[(size_t)f * a->pw];
      for (size_t x = 0; x < a->pw; x++) set[x] |= fs[x];
      if (!found) found = attr_srcwalk_frame(&w, a->fflags[f], f);
    }
  }
  if (src) attr_srcwalk_end(&w, src, op);
}

/* The pattern set of the frames fr[0..n) (frame indices), and with src, their source and op
 * frame: attr_stack_set for a stack not interned. */
static void attr_frames_set(const ms_attr_t *a, const uint32_t *fr, size_t n, uint64_t *set,
                            uint32_t *src, uint32_t *op) {
  memset(set, 0, ATTR_PW * sizeof *set);
  const uint64_t *fp = a->fpat;
  if (a->pw == 1) { /* the common case: four frames at a time in independent registers */
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
      s0 |= fp[fr[j]];
      s1 |= fp[fr[j + 1]];
      s2 |= fp[fr[j + 2]];
      s3 |= fp[fr[j + 3]];
    }
    for (; j < n; j++)
      s0 |= fp[fr[j]];
    set[0] = s0 | s1 | s2 | s3;
  } else if (a->pw == 2) { /* the default rules' */
    uint64_t s0 = 0, s1 = 0, t0 = 0, t1 = 0;
    size_t j = 0;
    for (; j + 2 <= n; j += 2) {
      s0 |= fp[2 * (size_t)fr[j]];
      s1 |= fp[2 * (size_t)fr[j] + 1];
      t0 |= fp[2 * (size_t)fr[j + 1]];
      t1 |= fp[2 * (size_t)fr[j + 1] + 1];
    }
    if (j < n) {
      s0 |= fp[2 * (size_t)fr[j]];
      s1 |= fp[2 * (size_t)fr[j] + 1];
    }
    set[0] = s0 | t0;
    set[1] = s1 | t1;
  } else {
    for (size_t j = 0; j < n; j++) {
      const uint64_t *fs = &fp[(size_t)fr[j] * a->pw];
      for (size_t x = 0; x < a->pw; x++)
        set[x] |= fs[x];
    }
  }
  if (!src) return;
  attr_srcwalk_t w;
  attr_srcwalk_init(&w);
  for (size_t j = 0; j < n; j++)
    if (attr_srcwalk_frame(&w, a->fflags[fr[j]], fr[j])) break;
  attr_srcwalk_end(&w, src, op);
}

/* The scan of the records whose stacks a read left for later (ms__snapshot_scan_deferred): each
 * record's pattern set into eset, its source and op into dfirst and dmulti. */
typedef struct attr_scan_s {
  ms_attr_t *a;
  ms_errbuf_t *eb;
  uint32_t **tab;
  size_t *cap;
  uint64_t last[ATTR_PW];
  uint32_t last_index;
} attr_scan_t;

static int attr_scan_record(void *ctx, size_t rec, const uint32_t *fr, uint32_t n) {
  attr_scan_t *c = ctx;
  ms_attr_t *a = c->a;
  const ms_snapshot_t *s = a->snap;
  if (rec >= s->ntrace) return MS_OK; /* only alloc entries' stacks are left for later */
  uint32_t top = 0;
  for (uint32_t j = 0; j < n; j++)
    top = fr[j] > top ? fr[j] : top;
  if (top >= s->nframes) /* never: the read interned every one */
    return ms__errbuf_set(c->eb, MS_EFORMAT, "trace entry %zu: a frame the snapshot lacks", rec);
  uint64_t set[ATTR_PW];
  uint32_t src, op;
  attr_frames_set(a, fr, n, set, &src, &op);
  if (src != ATTR_NONE) {
    if (a->dfirst[src] == ATTR_OP_UNSEEN)
      a->dfirst[src] = op;
    else if (a->dfirst[src] != op)
      a->dmulti[src] = 1;
  }
  if (c->last_index != ATTR_NONE && attr_set_eq(set, c->last, a->pw)) {
    a->eset[rec] = c->last_index;
    return MS_OK;
  }
  MS_FORWARD_IF_ERROR(attr_set_index(a, set, c->tab, c->cap, &a->eset[rec]));
  c->last_index = a->eset[rec];
  memcpy(c->last, set, sizeof c->last);
  return MS_OK;
}

/* The records of a snapshot read with stacks left for later: their sets, from their frames read
 * from the file again (no stack interned: 5 M of them would cost the read a third more). */
static int attr_stacks_deferred(ms_attr_t *a, uint32_t **tab, size_t *cap, ms_errbuf_t *eb) {
  const ms_snapshot_t *s = a->snap;
  size_t nt = s->ntrace ? s->ntrace : 1, nf = s->nframes ? s->nframes : 1;
  a->eset = ms__big_malloc(nt * sizeof *a->eset);
  a->dfirst = malloc(nf * sizeof *a->dfirst);
  a->dmulti = calloc(nf, 1);
  if (!a->eset || !a->dfirst || !a->dmulti) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  memset(a->eset, 0xff, nt * sizeof *a->eset);
  for (size_t f = 0; f < nf; f++)
    a->dfirst[f] = ATTR_OP_UNSEEN;
  attr_scan_t c = {a, eb, tab, cap, {0}, ATTR_NONE};
  int rc = ms__snapshot_scan_deferred(s, attr_scan_record, &c, eb);
  if (rc == MS_ENOMEM) ms__errbuf_set(eb, rc, "out of memory");
  return rc;
}

int ms__attr_stacks(ms_attr_t *a, bool sources, ms_errbuf_t *eb) {
  const ms_snapshot_t *s = a->snap;
  a->rw = (a->rules.nrules + 63) / 64;
  if (a->rw == 0) a->rw = 1;
  a->nst = s->nstacks;
  size_t ns = s->nstacks ? s->nstacks : 1;
  a->sset = ms__big_malloc(ns * sizeof *a->sset); /* per stack: reuses a read's pages */
  if (!a->sset) return MS_ENOMEM;
  memset(a->sset, 0xff, ns * sizeof *a->sset);
  /* only allocations' stacks are ever classified (frees' are not read): mark them */
  const uint32_t mark = ATTR_NONE - 1;
  for (size_t i = 0; i < s->ntrace; i++)
    if (s->trace[i].action == MS_TRACE_ALLOC && s->trace[i].stack < s->nstacks)
      a->sset[s->trace[i].stack] = mark;
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].stack < s->nstacks) a->sset[s->blocks[i].stack] = mark;
  for (size_t i = 0; i < s->nhistory; i++)
    if (s->history[i].stack < s->nstacks) a->sset[s->history[i].stack] = mark;
  uint32_t *first_op = NULL;
  uint8_t *multi = NULL;
  if (sources) MS_FORWARD_IF_ERROR(ms__attr_sources_alloc(a, &first_op, &multi));
  uint64_t set[ATTR_PW], last[ATTR_PW];
  uint32_t *tab = NULL, last_index = ATTR_NONE;
  size_t cap = 0;
  int rc = MS_OK;
  for (size_t st = 0; st < s->nstacks && rc == MS_OK; st++) {
    if (a->sset[st] != mark) {
      if (sources) ms__attr_stack_later(a, (uint32_t)st);
      continue;
    }
    attr_stack_set(a, (uint32_t)st, set, sources ? &a->ssrc[st] : NULL,
                   sources ? &a->sop[st] : NULL);
    /* stacks in a row mostly share their set (one op's): no lookup then */
    if (last_index != ATTR_NONE && attr_set_eq(set, last, a->pw)) {
      a->sset[st] = last_index;
      continue;
    }
    rc = attr_set_index(a, set, &tab, &cap, &a->sset[st]);
    last_index = a->sset[st];
    memcpy(last, set, sizeof last);
  }
  if (rc == MS_OK && ms__snapshot_has_deferred(s)) rc = attr_stacks_deferred(a, &tab, &cap, eb);
  free(tab);
  if (sources && rc == MS_OK) {
    ms__attr_sources_link(a, first_op, multi);
    a->src_state = 1;
  } else {
    free(multi);
  }
  free(first_op);
  return rc;
}

/* ---- what the rules read of an allocation's stack ---------------------------------------- */

/* An allocation's stack as the category rules read it. */
typedef struct attr_key_s {
  const uint64_t *bits; /* the rules whose frame conditions hold (rw words; NULL: none) */
  uint32_t set;         /* its pattern set's index; a->nsets: none, or a set not in the table */
  uint8_t phase;        /* by the phase rules (ATTR_PH_UNSET: none) */
  bool nostack;         /* no stack recorded, or an empty one */
  uint64_t own[ATTR_MAX_RULES / 64]; /* bits for a set not in the table */
} attr_key_t;

static void attr_key_of_set(const ms_attr_t *a, uint32_t set, bool nostack, attr_key_t *k) {
  k->nostack = nostack;
  if (set < a->nsets) {
    k->set = set;
    k->bits = &a->set_rules[(size_t)set * a->rw];
    k->phase = a->set_phase[set];
  } else {
    k->set = (uint32_t)a->nsets;
    k->bits = NULL;
    k->phase = ATTR_PH_UNSET;
  }
}

/* Stack `stack` (MS_SNAP_NO_STACK, ATTR_STACK_UNRECORDED: none). */
static void attr_stack_key(const ms_attr_t *a, uint32_t stack, attr_key_t *k) {
  const ms_snapshot_t *s = a->snap;
  if (stack >= s->nstacks) {
    attr_key_of_set(a, ATTR_NONE, true, k);
    return;
  }
  bool nostack = s->stacks[stack].nframes == 0;
  if (stack < a->nst) {
    attr_key_of_set(a, a->sset[stack], nostack, k);
    return;
  }
  /* a stack read from the file since the classifier was made: its set found now */
  uint64_t set[ATTR_PW];
  attr_stack_set(a, stack, set, NULL, NULL);
  k->nostack = nostack;
  k->set = (uint32_t)a->nsets;
  k->phase = attr_set_eval(a, set, k->own);
  k->bits = k->own;
}

/* The stack of entry i of device dev: the set its frames had when they were read from the file
 * (eset), else its record's stack. */
static void attr_entry_key(const ms_attr_t *a, size_t dev, size_t i, attr_key_t *k) {
  const ms_snap_trace_t *t = &a->tl->dev[dev].trace[i];
  if (a->eset) {
    uintptr_t base = (uintptr_t)a->snap->trace, at = (uintptr_t)t;
    size_t rec = (size_t)((at - base) / sizeof *t);
    if (at >= base && rec < a->snap->ntrace && a->eset[rec] != ATTR_NONE) {
      attr_key_of_set(a, a->eset[rec], false, k);
      return;
    }
  }
  attr_stack_key(a, t->stack, k);
}

/* ---- phase spans --------------------------------------------------------------------------- */

/* Whether rule ru, a phase rule with an annotation= pattern, names range x of device dev, a range
 * that ended. */
static bool attr_rule_names(const ms_attr_t *a, const attr_rule_t *ru, size_t dev,
                            const ms_tl_range_t *x) {
  return ru->kind == ATTR_R_PHASE && ru->annotation != ATTR_NONE && x->device == (int64_t)dev &&
         x->has_end && x->end_us != INT64_MAX &&
         ms__attr_glob(a->rules.pat[ru->annotation].glob, x->name, false);
}

/* Forces the phase of the entries of device dev inside the annotation ranges that phase rules
 * name (entries with times; times must not decrease, else annotations are not used): the ranges
 * the index paired (ms_tl_ranges_build), the first rule that names a range winning. Each rule
 * is matched against each range once; the table of forced entries (a trace's length) is made,
 * and the order of the times checked, at the first range that a rule names, so that a device
 * with none costs no pass over its trace. */
static int attr_annotations(const ms_attr_t *a, size_t dev, const ms_tl_ranges_t *rs,
                            const ms_snap_trace_t *tr, size_t n, uint8_t *ph) {
  uint8_t *forced = NULL;
  for (size_t r = 0; r < a->rules.nrules; r++) {
    const attr_rule_t *ru = &a->rules.rules[r];
    if (ru->kind != ATTR_R_PHASE || ru->annotation == ATTR_NONE) continue;
    for (size_t k = 0; k < rs->n; k++) {
      const ms_tl_range_t *x = &rs->ranges[k];
      if (!attr_rule_names(a, ru, dev, x)) continue;
      if (!forced) {
        for (size_t i = 1; i < n; i++)
          if ((tr[i].present & MS_TRACE_HAS_TIME) && (tr[i - 1].present & MS_TRACE_HAS_TIME) &&
              tr[i].time_us < tr[i - 1].time_us)
            return MS_OK;
        if (!(forced = ms__big_calloc(n, 1))) return MS_ENOMEM;
      }
      size_t lo = 0, hi = n; /* first entry with a time >= start */
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((tr[mid].present & MS_TRACE_HAS_TIME) && tr[mid].time_us >= x->start_us)
          hi = mid;
        else
          lo = mid + 1;
      }
      for (size_t i = lo; i < n && tr[i].time_us <= x->end_us; i++) {
        if (!(tr[i].present & MS_TRACE_HAS_TIME) || forced[i]) continue;
        ph[i] = ru->target;
        forced[i] = 1;
      }
    }
  }
  ms__big_free(forced);
  return MS_OK;
}

typedef MS_VEC(attr_span_t) attr_spanvec_t;

static int attr_span_push(attr_spanvec_t *sp, size_t first, uint8_t phase) {
  attr_span_t x = {sp->len == 0 ? 0 : (uint32_t)first, phase}; /* the first starts at 0 */
  return MS_VEC_PUSH(sp, x) ? MS_ENOMEM : MS_OK;
}

/* Spans of device dev. Classified entries (allocations whose stack has a phase, entries inside
 * an annotation range of a phase rule) start a span when their phase differs from the current
 * one; allocations without a phase between two spans of one phase belong to it, and between
 * spans of different phases form a `none` span. Other entries (frees) belong to the span before
 * them, so that a free just after an op's last allocation stays within the op's phase. */
static int attr_dev_spans(ms_attr_t *a, size_t dev) {
  attr_dev_t *ad = &a->dev[dev];
  size_t n = ms_timeline_nentries(a->tl, dev);
  ad->n = n;
  if (n == 0) return MS_OK;
  const ms_snap_trace_t *tr = ms_timeline_entry(a->tl, dev, 0);
  const ms_tl_ranges_t *rs = a->snap->nannotations ? ms__tl_ranges(a->tl) : NULL;
  if (a->snap->nannotations && !rs) return MS_ENOMEM;
  uint8_t *ph = ms__big_malloc(n); /* a trace's length */
  if (!ph) return MS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    ph[i] = ATTR_PH_UNSET;
    if (tr[i].action != MS_TRACE_ALLOC) continue;
    attr_key_t k;
    attr_entry_key(a, dev, i, &k);
    ph[i] = k.phase != ATTR_PH_UNSET ? k.phase : ATTR_PH_NONE;
  }
  int rc = rs ? attr_annotations(a, dev, rs, tr, n, ph) : MS_OK;
  attr_spanvec_t sp = {0};
  uint8_t cur = ATTR_PH_UNSET;
  size_t pending = SIZE_MAX; /* the first phaseless allocation since the last classified entry */
  for (size_t i = 0; i < n && rc == MS_OK; i++) {
    if (ph[i] == ATTR_PH_UNSET) continue;
    if (ph[i] == ATTR_PH_NONE) {
      if (pending == SIZE_MAX) pending = i;
      continue;
    }
    if (ph[i] != cur) {
      if (pending != SIZE_MAX) rc = attr_span_push(&sp, pending, ATTR_PH_NONE);
      if (rc == MS_OK) rc = attr_span_push(&sp, i, ph[i]);
      cur = ph[i];
    }
    pending = SIZE_MAX;
  }
  if (rc == MS_OK && (pending != SIZE_MAX || sp.len == 0))
    rc = attr_span_push(&sp, pending == SIZE_MAX ? 0 : pending, ATTR_PH_NONE);
  ms__big_free(ph);
  ad->spans = sp.ptr;
  ad->nspans = sp.len;
  return rc;
}

/* The blocks alive at the end of device dev (their sizes are the snapshot's). */
static int attr_dev_end(ms_attr_t *a, size_t dev) {
  attr_dev_t *ad = &a->dev[dev];
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(a->tl, dev, ad->n, &st);
  size_t n = rc == MS_OK ? st.nblocks : 0;
  ad->end_addr = malloc((n ? n : 1) * sizeof *ad->end_addr);
  ad->end_size = malloc((n ? n : 1) * sizeof *ad->end_size);
  if (rc == MS_OK && (!ad->end_addr || !ad->end_size)) rc = MS_ENOMEM;
  for (size_t k = 0; k < n && rc == MS_OK; k++) {
    ad->end_addr[k] = st.blocks[k].address;
    ad->end_size[k] = st.blocks[k].size;
    if (st.blocks[k].alloc_entry < 0 && st.blocks[k].free_entry < 0) ad->has_old = true;
  }
  ad->nend = rc == MS_OK ? n : 0;
  ms_timeline_state_release(&st);
  return rc;
}

int ms__attr_spans(ms_attr_t *a) {
  a->ndev = ms_timeline_ndevices(a->tl);
  a->dev = calloc(a->ndev ? a->ndev : 1, sizeof *a->dev);
  if (!a->dev) return MS_ENOMEM;
  for (size_t d = 0; d < a->ndev; d++) {
    atomic_init(&a->dev[d].ecat_ready, 0);
    MS_FORWARD_IF_ERROR(attr_dev_spans(a, d));
    MS_FORWARD_IF_ERROR(attr_dev_end(a, d));
  }
  return MS_OK;
}

uint64_t ms__attr_entry_size(const ms_attr_t *a, size_t dev, size_t i) {
  const tl_dev_t *td = &a->tl->dev[dev];
  if (td->pair[i] != TL_NONE) return td->bsize[i];
  const attr_dev_t *ad = &a->dev[dev];
  uint64_t addr = td->trace[i].addr;
  size_t lo = 0, hi = ad->nend;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ad->end_addr[mid] < addr) lo = mid + 1; else hi = mid;
  }
  return lo < ad->nend && ad->end_addr[lo] == addr ? ad->end_size[lo] : td->bsize[i];
}

/* ---- a block's category -------------------------------------------------------------------- */

static size_t attr_span_of(const attr_dev_t *ad, size_t entry) {
  size_t lo = 0, hi = ad->nspans;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (ad->spans[mid].first <= entry)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

static bool attr_grad_addr(const attr_dev_t *ad, uint64_t addr) {
  size_t lo = 0, hi = ad->ngrad_addr;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ad->grad_addr[mid] < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < ad->ngrad_addr && ad->grad_addr[lo] == addr;
}

/* ms__attr_classify with the span of the alloc entry known (SIZE_MAX: look it up). */
static ms_category attr_classify_in(const ms_attr_t *a, size_t dev, size_t span,
                                    int64_t alloc_entry, int64_t free_entry, const attr_key_t *key,
                                    uint64_t address, bool ignore_matches) {
  const attr_dev_t *ad = dev < a->ndev ? &a->dev[dev] : NULL;
  bool recorded = alloc_entry >= 0 && ad && (size_t)alloc_entry < ad->n && ad->nspans > 0;
  uint8_t phase = ATTR_PH_NONE, prev = ATTR_PH_UNSET, next = ATTR_PH_UNSET;
  int freed;
  if (recorded) {
    size_t k = span != SIZE_MAX ? span : attr_span_of(ad, (size_t)alloc_entry);
    phase = ad->spans[k].phase;
    if (k > 0) prev = ad->spans[k - 1].phase;
    if (k + 1 < ad->nspans) next = ad->spans[k + 1].phase;
    size_t end = k + 1 < ad->nspans ? ad->spans[k + 1].first : ad->n;
    freed = free_entry < 0 ? ATTR_FREED_NEVER
            : (size_t)free_entry < end ? ATTR_FREED_WITHIN : ATTR_FREED_AFTER;
  } else {
    if (key->phase != ATTR_PH_UNSET) phase = key->phase;
    freed = free_entry < 0 ? ATTR_FREED_NEVER : ATTR_FREED_AFTER;
  }
  bool nostack = key->nostack;
  const uint64_t *bits = key->bits;
  for (size_t r = 0; r < a->rules.nrules; r++) {
    const attr_rule_t *ru = &a->rules.rules[r];
    if (ru->kind != ATTR_R_CATEGORY) continue;
    if (ru->has_frames && (!bits || !(bits[r / 64] >> (r % 64) & 1))) continue;
    if (ru->phase && !(ru->phase >> phase & 1)) continue;
    if (ru->prev && (prev == ATTR_PH_UNSET || !(ru->prev >> prev & 1))) continue;
    if (ru->next && (next == ATTR_PH_UNSET || !(ru->next >> next & 1))) continue;
    if (ru->freed == ATTR_FREED_WITHIN && freed != ATTR_FREED_WITHIN) continue;
    if (ru->freed == ATTR_FREED_AFTER && freed == ATTR_FREED_WITHIN) continue;
    if (ru->freed == ATTR_FREED_NEVER && freed != ATTR_FREED_NEVER) continue;
    if (ru->alloc == ATTR_ALLOC_RECORDED && !recorded) continue;
    if (ru->alloc == ATTR_ALLOC_UNRECORDED && recorded) continue;
    if (ru->nostack >= 0 && (ru->nostack == 1) != nostack) continue;
    if (ru->matches_gradient &&
        (ignore_matches || recorded || free_entry >= 0 || !ad || !attr_grad_addr(ad, address)))
      continue;
    return (ms_category)ru->target;
  }
  return MS_CAT_UNKNOWN;
}

ms_category ms__attr_entry_alone(const ms_attr_t *a, size_t dev, size_t i) {
  const tl_dev_t *td = &a->tl->dev[dev];
  const char *given = ms_snap_trace_category(&td->trace[i]);
  ms_category gc = given[0] ? ms_category_parse(given) : MS_CAT_COUNT;
  if (gc < MS_CAT_COUNT) return gc;
  uint32_t fe = td->pair[i];
  attr_key_t k;
  attr_entry_key(a, dev, i, &k);
  return attr_classify_in(a, dev, SIZE_MAX, (int64_t)i, fe == TL_NONE ? -1 : (int64_t)fe, &k,
                          td->trace[i].addr, true);
}

/* The category of alloc entry i of device dev: from the cache when it is built; else alone, and
 * the cache is built first when `whole` (a walk over the trace asks) or after ATTR_DIRECT_MAX
 * answers found alone (many blocks asked one by one). */
static ms_category attr_entry_cat(const ms_attr_t *a, size_t dev, size_t i, bool whole) {
  const attr_dev_t *ad = &a->dev[dev];
  if (atomic_load_explicit(&ad->ecat_ready, memory_order_acquire) == 1)
    return (ms_category)ad->ecat[i];
  atomic_size_t *nd = (atomic_size_t *)(uintptr_t)&a->ndirect; /* a counter, not the answers */
  if ((whole || atomic_fetch_add_explicit(nd, 1, memory_order_relaxed) >= ATTR_DIRECT_MAX) &&
      ms__attr_ecat_ready(a, dev))
    return (ms_category)ad->ecat[i];
  return ms__attr_entry_alone(a, dev, i);
}

ms_category ms__attr_classify(const ms_attr_t *a, size_t dev, int64_t alloc_entry,
                              int64_t free_entry, uint32_t stack, uint64_t address,
                              bool ignore_matches) {
  /* an alloc entry freed where the index pairs it: its entry's category (matches= holds only for
   * blocks older than the trace, so it is the same with ignore_matches) */
  if (alloc_entry >= 0 && dev < a->ndev && (size_t)alloc_entry < a->dev[dev].n) {
    const tl_dev_t *td = &a->tl->dev[dev];
    size_t i = (size_t)alloc_entry;
    if (td->trace[i].action == MS_TRACE_ALLOC &&
        free_entry == (td->pair[i] == TL_NONE ? -1 : (int64_t)td->pair[i]))
      return attr_entry_cat(a, dev, i, false);
  }
  /* an alloc entry's stack is its record's (stack says the same, unless the record's was read
   * from the file after the classifier was made) */
  attr_key_t k;
  if (alloc_entry >= 0 && dev < a->ndev && (size_t)alloc_entry < a->dev[dev].n &&
      a->tl->dev[dev].trace[alloc_entry].action == MS_TRACE_ALLOC)
    attr_entry_key(a, dev, (size_t)alloc_entry, &k);
  else
    attr_stack_key(a, stack, &k);
  return attr_classify_in(a, dev, SIZE_MAX, alloc_entry, free_entry, &k, address, ignore_matches);
}

/* Memo of attr_dev_ecat: within one span, an alloc entry's category (matches= ignored) depends
 * only on its stack's pattern set (or none), whether its stack is empty, and whether it is freed
 * within the span, after it or never; one walk of the rules per such key and span. The slots are
 * stamped with the span (+ 1) that filled them, so moving to the next span clears nothing. */
#define ATTR_MEMO_MAX_SETS 65536 /* more distinct sets: no memo */

typedef struct attr_memo_s {
  uint32_t *stamp;
  uint8_t *cat;
  size_t nsets;
} attr_memo_t;

/* The memo's slot of an alloc entry whose stack is key (freed: ATTR_FREED_*), or SIZE_MAX:
 * none. */
static size_t attr_memo_slot(const attr_memo_t *m, const attr_key_t *key, int freed) {
  if (!m->stamp) return SIZE_MAX;
  size_t set = key->set < m->nsets ? key->set : m->nsets;
  return (set * 2 + key->nostack) * 4 + (size_t)freed;
}

/* The category of every alloc entry of device dev, in one pass (spans followed in order). */
static int attr_dev_ecat(ms_attr_t *a, size_t dev) {
  attr_dev_t *ad = &a->dev[dev];
  const tl_dev_t *td = &a->tl->dev[dev];
  if (ad->n == 0) return MS_OK;
  ad->ecat = ms__big_malloc(ad->n ? ad->n : 1);
  if (!ad->ecat) return MS_ENOMEM;
  attr_memo_t m = {NULL, NULL, a->nsets};
  if (a->nsets <= ATTR_MEMO_MAX_SETS && ad->nspans < UINT32_MAX) {
    size_t slots = (a->nsets + 1) * 8;
    m.stamp = calloc(slots, sizeof *m.stamp);
    m.cat = malloc(slots);
    if (!m.stamp || !m.cat) {
      free(m.stamp); /* classify without the memo */
      free(m.cat);
      m.stamp = NULL;
    }
  }
  size_t k = 0, end = ad->nspans > 1 ? ad->spans[1].first : ad->n;
  for (size_t i = 0; i < ad->n; i++) {
    while (k + 1 < ad->nspans && ad->spans[k + 1].first <= i) {
      k++;
      end = k + 1 < ad->nspans ? ad->spans[k + 1].first : ad->n;
    }
    if (td->trace[i].action != MS_TRACE_ALLOC) {
      ad->ecat[i] = 0xff;
      continue;
    }
    /* a category the snapshot carries (made from PyTorch's profiler) wins over the rules */
    const char *given = ms_snap_trace_category(&td->trace[i]);
    ms_category gc = given[0] ? ms_category_parse(given) : MS_CAT_COUNT;
    if (gc < MS_CAT_COUNT) {
      ad->ecat[i] = (uint8_t)gc;
      continue;
    }
    uint32_t fe = td->pair[i];
    int freed = fe == TL_NONE ? ATTR_FREED_NEVER : fe < end ? ATTR_FREED_WITHIN : ATTR_FREED_AFTER;
    attr_key_t key;
    attr_entry_key(a, dev, i, &key);
    size_t slot = key.bits == key.own ? SIZE_MAX : attr_memo_slot(&m, &key, freed);
    if (slot != SIZE_MAX && m.stamp[slot] == (uint32_t)k + 1) {
      ad->ecat[i] = m.cat[slot];
      continue;
    }
    ad->ecat[i] = (uint8_t)attr_classify_in(a, dev, k, (int64_t)i, fe == TL_NONE ? -1 : (int64_t)fe,
                                            &key, td->trace[i].addr, true);
    if (slot != SIZE_MAX) {
      m.stamp[slot] = (uint32_t)k + 1;
      m.cat[slot] = ad->ecat[i];
    }
  }
  free(m.stamp);
  free(m.cat);
  return MS_OK;
}

bool ms__attr_ecat_ready(const ms_attr_t *ca, size_t dev) {
  ms_attr_t *a = (ms_attr_t *)(uintptr_t)ca; /* a cache filled once: the classifier stays
                                                immutable to its users */
  attr_dev_t *ad = &a->dev[dev];
  int st = atomic_load_explicit(&ad->ecat_ready, memory_order_acquire);
  if (st) return st == 1;
  pthread_mutex_lock(&a->ecat_mu);
  st = atomic_load_explicit(&ad->ecat_ready, memory_order_relaxed);
  if (!st) {
    st = attr_dev_ecat(a, dev) == MS_OK ? 1 : 2; /* 2: no memory, answers found alone */
    atomic_store_explicit(&ad->ecat_ready, st, memory_order_release);
  }
  pthread_mutex_unlock(&a->ecat_mu);
  return st == 1;
}

/* The stack that a block's category reads: its alloc entry's, the snapshot's block's when it
 * was alive at the end, none when only its free was recorded. */
uint32_t ms__attr_block_stack(const ms_attr_t *a, size_t dev, const ms_tl_block_t *b) {
  if (b->alloc_entry >= 0 && (size_t)b->alloc_entry < ms_timeline_nentries(a->tl, dev))
    return ms_timeline_entry(a->tl, dev, (size_t)b->alloc_entry)->stack;
  if (b->flags & MS_TL_BLOCK_FROM_SNAPSHOT) return b->stack;
  if (b->flags & MS_TL_BLOCK_ALLOC_UNRECORDED) return ATTR_STACK_UNRECORDED;
  return b->stack;
}

ms_category ms__attr_entry_category(const ms_attr_t *a, size_t dev, size_t i) {
  if (dev >= a->ndev || i >= a->dev[dev].n || a->tl->dev[dev].trace[i].action != MS_TRACE_ALLOC)
    return MS_CAT_UNKNOWN;
  return attr_entry_cat(a, dev, i, true);
}

ms_category ms_attr_entry_category(const ms_attr_t *a, size_t dev, size_t entry) {
  if (dev >= a->ndev || entry >= a->dev[dev].n ||
      a->tl->dev[dev].trace[entry].action != MS_TRACE_ALLOC)
    return MS_CAT_UNKNOWN;
  return ms__attr_entry_category(a, dev, entry);
}

ms_category ms_attr_block_category(const ms_attr_t *a, size_t dev, const ms_tl_block_t *b) {
  return ms__attr_classify(a, dev, b->alloc_entry, b->free_entry,
                           ms__attr_block_stack(a, dev, b), b->address, false);
}

/* ---- the gradient sizes -------------------------------------------------------------------- */

typedef struct attr_gs_s {
  uint64_t span; /* UINT64_MAX: allocated before recording */
  uint64_t size;
} attr_gs_t;

static int attr_gs_cmp(const void *x, const void *y) {
  const attr_gs_t *a = x, *b = y;
  if (a->size != b->size) return a->size < b->size ? -1 : 1;
  return a->span < b->span ? -1 : a->span > b->span;
}

static int attr_u64_cmp(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* matches=gradient on device dev: per requested size (a parameter and its gradient have the
 * same; their blocks may not, when the allocator leaves a large block's tail unsplit), the most
 * gradient blocks of that size allocated in one phase span (or alive before recording); then the
 * blocks alive over the whole trace, in address order, take those counts. */
static int attr_dev_grad(ms_attr_t *a, size_t dev) {
  attr_dev_t *ad = &a->dev[dev];
  const tl_dev_t *td = &a->tl->dev[dev];
  MS_VEC(attr_gs_t) gs = {0};
  if (!ms__attr_ecat_ready(a, dev)) return MS_ENOMEM;
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(a->tl, dev, ad->n, &st);
  for (size_t i = 0; i < ad->n && rc == MS_OK; i++) {
    if (ad->ecat[i] != MS_CAT_GRADIENT) continue;
    attr_gs_t g = {attr_span_of(ad, i), td->trace[i].size}; /* the requested size */
    if (MS_VEC_PUSH(&gs, g)) rc = MS_ENOMEM;
  }
  MS_VEC(uint64_t) cand = {0}; /* (size, address) of blocks alive throughout */
  for (size_t k = 0; k < st.nblocks && rc == MS_OK; k++) {
    const ms_tl_block_t *b = &st.blocks[k];
    if (b->alloc_entry >= 0 || b->free_entry >= 0) continue;
    if (ms__attr_classify(a, dev, -1, -1, ms__attr_block_stack(a, dev, b), 0, true) ==
        MS_CAT_GRADIENT) {
      attr_gs_t g = {UINT64_MAX, b->requested_size};
      if (MS_VEC_PUSH(&gs, g)) rc = MS_ENOMEM;
    }
    if (rc == MS_OK &&
        (MS_VEC_PUSH(&cand, b->requested_size) || MS_VEC_PUSH(&cand, b->address)))
      rc = MS_ENOMEM;
  }
  ms_timeline_state_release(&st);
  if (rc == MS_OK && gs.len > 0 && cand.len > 0) {
    qsort(gs.ptr, gs.len, sizeof *gs.ptr, attr_gs_cmp);
    /* per size, in gs.ptr[m]: its cap (span field) = the longest run of one span */
    size_t m = 0;
    uint64_t psize = 0, pspan = 0, run = 0;
    for (size_t j = 0; j < gs.len; j++) {
      attr_gs_t g = gs.ptr[j];
      run = j > 0 && g.size == psize && g.span == pspan ? run + 1 : 1;
      if (m > 0 && gs.ptr[m - 1].size == g.size) {
        if (run > gs.ptr[m - 1].span) gs.ptr[m - 1].span = run;
      } else {
        gs.ptr[m].size = g.size;
        gs.ptr[m++].span = run;
      }
      psize = g.size;
      pspan = g.span;
    }
    ad->grad_addr = malloc(cand.len / 2 * sizeof *ad->grad_addr);
    if (!ad->grad_addr) rc = MS_ENOMEM;
    for (size_t c = 0; c < cand.len && rc == MS_OK; c += 2) { /* in address order */
      size_t lo = 0, hi = m;
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (gs.ptr[mid].size < cand.ptr[c]) lo = mid + 1; else hi = mid;
      }
      if (lo >= m || gs.ptr[lo].size != cand.ptr[c] || gs.ptr[lo].span == 0) continue;
      gs.ptr[lo].span--;
      ad->grad_addr[ad->ngrad_addr++] = cand.ptr[c + 1];
    }
    if (rc == MS_OK) qsort(ad->grad_addr, ad->ngrad_addr, sizeof *ad->grad_addr, attr_u64_cmp);
  }
  MS_VEC_FREE(&gs);
  MS_VEC_FREE(&cand);
  return rc;
}

int ms__attr_gradient_sizes(ms_attr_t *a) {
  bool used = false;
  for (size_t r = 0; r < a->rules.nrules; r++)
    used |= a->rules.rules[r].kind == ATTR_R_CATEGORY && a->rules.rules[r].matches_gradient;
  if (!used) return MS_OK;
  for (size_t d = 0; d < a->ndev; d++) /* only blocks older than the trace read the sizes */
    if (a->dev[d].has_old) MS_FORWARD_IF_ERROR(attr_dev_grad(a, d));
  return MS_OK;
}
