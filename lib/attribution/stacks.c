/* SPDX-License-Identifier: MIT
 * memsnap core: the classifier's per-frame and per-stack features (attribution/internal.h): which
 * patterns each frame matches, each allocation stack's pattern set (from the snapshot's stacks,
 * or from the frames of the stacks a read left for later, read from the file again without
 * interning them), the distinct sets with the rules they meet, and the sources' operators.
 *
 * Cost: every distinct function and file string is matched once against every pattern (a frame's
 * set is its function's and its file's); every allocation's stack is read once (its frames'
 * pattern sets ORed, several frames at a time; its source from its frames up to the first Python
 * one); the rules are evaluated once per distinct set, a few dozen in a training trace.
 */
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "common/hash.h"
#include "snapshot/deferred.h"

/* ---- frames and stacks --------------------------------------------------------------------- */

/* The patterns str matches: a function (file false) or a file (attr_strbits_t). */
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
  size_t i =
      (size_t)(ms_hash_mum((uint64_t)(uintptr_t)str, 0x9e3779b97f4a7c15ull) >> 7) & (m->cap - 1);
  while (m->key[i] && m->key[i] != str)
    i = (i + 1) & (m->cap - 1);
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

void ms__attr_strbits_free(attr_strbits_t *m) {
  free(m->key);
  free(m->bits);
  *m = (attr_strbits_t){0};
}

bool ms__attr_frame_features(const ms_attr_t *a, const ms_snap_frame_t *f, attr_strbits_t *names,
                             attr_strbits_t *files, uint64_t *set, uint8_t *flags) {
  const uint64_t *nb = attr_strbits_get(a, names, f->name, false);
  const uint64_t *fb = nb ? attr_strbits_get(a, files, f->filename, true) : NULL;
  if (!nb || !fb) return false;
  uint64_t frame_pat[ATTR_PW] = {0}; /* frame= patterns: both sides must match */
  for (size_t p = 0; p < a->rules.npat; p++)
    if (a->rules.pat[p].kind == ATTR_P_FRAME) frame_pat[p / 64] |= 1ull << (p % 64);
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
  *flags = fl;
  return true;
}

int ms__attr_frames(ms_attr_t *a) {
  const ms_snapshot_t *s = a->snap;
  a->pw = attr_pattern_words(&a->rules);
  size_t nf = s->nframes ? s->nframes : 1;
  a->fflags = calloc(nf, 1);
  a->fpat = calloc(nf * a->pw, sizeof *a->fpat);
  if (!a->fflags || !a->fpat) return MS_ENOMEM;
  attr_strbits_t names = {0}, files = {0};
  int rc = MS_OK;
  for (size_t i = 0; i < s->nframes && rc == MS_OK; i++)
    if (!ms__attr_frame_features(a, &s->frames[i], &names, &files, &a->fpat[i * a->pw],
                                 &a->fflags[i]))
      rc = MS_ENOMEM;
  ms__attr_strbits_free(&names);
  ms__attr_strbits_free(&files);
  return rc;
}

/* A pattern set's hash: every word mixed in, so that sets differing in any bit (the high
 * patterns' words too) spread over the lookup table's slots. */
static uint64_t attr_set_hash(const uint64_t *set, size_t pw) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t w = 0; w < pw; w++)
    h = ms_hash_step(h, set[w]);
  return h;
}

/* The rules whose frame conditions pattern set `set` meets (bits: a->rw words), and the phase
 * the phase rules give it (ATTR_PH_UNSET: none), returned. */
uint8_t ms__attr_set_eval(const ms_attr_t *a, const uint64_t *set, uint64_t *bits) {
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
int ms__attr_set_index(ms_attr_t *a, const uint64_t *set, uint32_t **tab, size_t *cap,
                       uint32_t *out) {
  uint64_t h = attr_set_hash(set, a->pw);
  if ((a->nsets + 1) * 2 > *cap) { /* grow the lookup table */
    size_t ncap = *cap ? *cap * 2 : 256;
    uint32_t *nt = malloc(ncap * sizeof *nt);
    if (!nt) return MS_ENOMEM;
    memset(nt, 0xff, ncap * sizeof *nt);
    for (size_t i = 0; i < a->nsets; i++) {
      size_t j = (size_t)attr_set_hash(&a->set_pat[i * a->pw], a->pw) & (ncap - 1);
      while (nt[j] != ATTR_NONE)
        j = (j + 1) & (ncap - 1);
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
  nph[n] = ms__attr_set_eval(a, set, &nr[n * a->rw]);
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
  for (; j < n; j++)
    s0 |= fp[fi[j]];
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
void ms__attr_stack_set(const ms_attr_t *a, uint32_t st, uint64_t *set, uint32_t *src,
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
      for (size_t x = 0; x < a->pw; x++)
        set[x] |= fs[x];
      if (!found) found = attr_srcwalk_frame(&w, a->fflags[f], f);
    }
  }
  if (src) attr_srcwalk_end(&w, src, op);
}

/* The pattern set of the frames fr[0..n) (frame indices), and with src, their source and op
 * frame: attr_stack_set for a stack not interned. */
void ms__attr_frames_set(const ms_attr_t *a, const uint32_t *fr, size_t n, uint64_t *set,
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
  attr_setq_t *q;
} attr_scan_t;

int ms__attr_setq_index(ms_attr_t *a, attr_setq_t *q, const uint64_t *set, uint32_t *out) {
  if (q->last_id != ATTR_NONE && attr_set_eq(set, q->last, a->pw)) {
    *out = q->last_id;
    return MS_OK;
  }
  MS_FORWARD_IF_ERROR(ms__attr_set_index(a, set, &q->tab, &q->cap, out));
  q->last_id = *out;
  memcpy(q->last, set, a->pw * sizeof *set);
  return MS_OK;
}

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
  ms__attr_frames_set(a, fr, n, set, &src, &op);
  attr_note_op(a->dfirst, a->dmulti, src, op);
  return ms__attr_setq_index(a, c->q, set, &a->eset[rec]);
}

/* The records of a snapshot read with stacks left for later: their sets, from their frames read
 * from the file again (no stack interned: 5 M of them would cost the read a third more). */
static int attr_stacks_deferred(ms_attr_t *a, attr_setq_t *q, ms_errbuf_t *eb) {
  const ms_snapshot_t *s = a->snap;
  size_t nt = s->ntrace ? s->ntrace : 1, nf = s->nframes ? s->nframes : 1;
  a->eset = ms__big_malloc(nt * sizeof *a->eset);
  a->dfirst = malloc(nf * sizeof *a->dfirst);
  a->dmulti = calloc(nf, 1);
  if (!a->eset || !a->dfirst || !a->dmulti) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  memset(a->eset, 0xff, nt * sizeof *a->eset);
  for (size_t f = 0; f < nf; f++)
    a->dfirst[f] = ATTR_OP_UNSEEN;
  attr_scan_t c = {a, eb, q};
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
  uint64_t set[ATTR_PW];
  attr_setq_t q = {NULL, 0, {0}, ATTR_NONE};
  int rc = MS_OK;
  for (size_t st = 0; st < s->nstacks && rc == MS_OK; st++) {
    if (a->sset[st] != mark) {
      if (sources) ms__attr_stack_later(a, (uint32_t)st);
      continue;
    }
    ms__attr_stack_set(a, (uint32_t)st, set, sources ? &a->ssrc[st] : NULL,
                       sources ? &a->sop[st] : NULL);
    rc = ms__attr_setq_index(a, &q, set, &a->sset[st]); /* stacks in a row: one op's set */
  }
  /* the records whose stacks the read left for later: what it found of them as it read them, else
   * their frames read from the file again */
  if (rc == MS_OK && ms__snapshot_has_deferred(s))
    rc = a->seed ? ms__attr_seed_take(a, a->seed, &q) : attr_stacks_deferred(a, &q, eb);
  a->seed = NULL;
  free(q.tab);
  if (sources && rc == MS_OK) {
    ms__attr_sources_link(a, first_op, multi);
    a->src_state = 1;
  } else {
    free(multi);
  }
  free(first_op);
  return rc;
}
