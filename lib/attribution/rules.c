/* SPDX-License-Identifier: MIT
 * memsnap core: the rules text of the classifier (attribution/internal.h, docs/categories.md):
 * the default rules, the parser, glob matching.
 *
 * A rules text is lines; `#` first on a line or after a blank starts a comment; blank lines are
 * ignored; a glob cannot hold a blank (`?` matches one). Each line is a kind and
 * conditions, separated by blanks:
 *   CATEGORY COND...      a category rule: the first whose conditions all hold names the block
 *   phase PHASE COND...   a phase rule: the first whose frame conditions hold names a stack's
 *                         phase; `phase PHASE annotation=GLOB` forces the phase of the entries
 *                         inside every annotation range whose name matches
 *   skip COND...          frames that are never the source (the user's own code is elsewhere)
 *   prefer COND...        C++ frames that name a stack without Python frames before others
 *   defaults none         the default rules are not used (else they follow the text's rules)
 * Conditions: func=GLOB, file=GLOB, frame=FUNCGLOB@FILEGLOB (some frame matches; `!` in front:
 * no frame matches), phase=P[,P], prev=P[,P], next=P[,P], freed=within|after|never,
 * alloc=recorded|unrecorded, stack=none|some, matches=gradient.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"

static const char attr_defaults[] =
    "# memsnap's default rules (docs/categories.md). First match wins.\n"
    "#\n"
    "# Frames that are never a block's source: torch's own Python code, the interpreter, the\n"
    "# unwinder, the allocator and the dispatcher's glue, memsnap's own allocator.\n"
    "skip file=*/torch/*\n"
    "skip file=torch/*\n"
    "skip file=<frozen?*\n"
    "skip file=*/Python/*\n"
    "skip file=*/Objects/*\n"
    "skip file=*/Include/*\n"
    "skip file=*/Modules/main.c\n"
    "skip file=Register*.cpp\n"
    "skip file=*/Register*.cpp\n"
    "skip file=VariableType*.cpp\n"
    "skip file=python_*.cpp\n"
    "skip file=*/csu/*\n"
    "skip func=torch::unwind::*\n"
    "skip func=torch::CapturedTraceback::*\n"
    "skip func=torch::cuda::*gather*\n"
    "skip func=*CUDACachingAllocator::*\n"
    "skip func=c10::impl::*\n"
    "skip func=c10::Dispatcher::*\n"
    "skip func=at::_ops::*\n"
    "skip func=at::detail::*\n"
    "skip func=*at::detail::_empty*\n"
    "skip func=at::empty*\n"
    "skip func=at::native::empty*\n"
    "skip func=at::native::*_empty*\n"
    "skip func=torch::autograd::VariableType::*\n"
    "skip func=*THPVariable*\n"
    "skip func=torch::autograd::THP*\n"
    "skip func=torch::autograd::dispatch_*\n"
    "skip func=_Py*\n"
    "skip func=Py_*\n"
    "skip func=PyEval_*\n"
    "skip func=PyObject_*\n"
    "skip func=PyMethod_*\n"
    "skip func=PyVectorcall_*\n"
    "skip func=pyrun_*\n"
    "skip func=pymain_*\n"
    "skip func=*_vectorcall*\n"
    "skip func=cfunction_call*\n"
    "skip func=cfunction_vectorcall*\n"
    "skip func=run_mod\n"
    "skip func=run_eval_code_obj\n"
    "skip func=__libc_start*\n"
    "skip func=_start\n"
    "skip func=<unwind?unsupported>\n"
    "skip func=??\n"
    "skip func=ms_allocator_*\n"
    "skip func=ms__*\n"
    "skip func=alloc_gather\n"
    "skip func=backtrace\n"
    "#\n"
    "# C++ frames that name a stack without a Python frame first: autograd's nodes.\n"
    "prefer func=*Backward*::apply*\n"
    "prefer func=*AccumulateGrad*\n"
    "#\n"
    "# Phases, from the stacks of allocations (the first that matches) and annotation ranges.\n"
    "phase backward func=torch::autograd::Engine::*\n"
    "phase backward func=*Backward*::apply*\n"
    "phase backward func=*AccumulateGrad*\n"
    "phase backward frame=_engine_run_backward@*torch/autograd/graph.py\n"
    "phase backward file=*torch/autograd/__init__.py\n"
    "phase optimizer file=*torch/optim/*\n"
    "phase init frame=_apply@*torch/nn/modules/module.py\n"
    "phase init frame=load_state_dict@*torch/nn/modules/module.py\n"
    "phase init frame=_load_from_state_dict@*torch/nn/modules/module.py\n"
    "phase init func=reset_parameters\n"
    "phase init file=*torch/nn/init.py\n"
    "phase forward frame=_call_impl@*torch/nn/modules/module.py\n"
    "phase forward frame=__call__@*torch/nn/modules/module.py\n"
    "phase optimizer annotation=Optimizer.step#*\n"
    "phase forward annotation=*##?forward?##*\n"
    "phase backward annotation=*##?backward?##*\n"
    "phase optimizer annotation=*##?optimizer?##*\n"
    "#\n"
    "# Categories: the first rule whose conditions all hold; none: unknown.\n"
    "gradient func=*AccumulateGrad*\n"
    "gradient func=*accumulate_grad*\n"
    "gradient phase=backward freed=after\n"
    "autograd_detail phase=backward\n"
    "optimizer_state phase=optimizer freed=after\n"
    "temporary phase=optimizer\n"
    "parameter phase=init\n"
    "parameter alloc=unrecorded freed=never matches=gradient\n"
    "temporary freed=within\n"
    "activation phase=forward\n"
    "input phase=none alloc=recorded next=forward\n"
    "activation phase=none prev=forward\n";

const char *ms_attr_default_rules(void) { return attr_defaults; }

/* ---- glob ---------------------------------------------------------------------------------- */

static bool attr_ch_eq(char p, char t, bool path) {
  return p == t || (path && p == '/' && t == '\\');
}

/* The classic two-cursor wildcard match: on a mismatch after a '*', the star absorbs one more
 * character and matching resumes; each text position is retried at most once per star, so the
 * time is O(|pat| * |text|) whatever the input. */
bool ms__attr_glob(const char *pat, const char *text, bool path) {
  const char *p = pat, *t = text, *star = NULL, *mark = NULL;
  while (*t) {
    if (*p == '*') {
      while (*p == '*') p++;
      if (!*p) return true;
      star = p;
      mark = t;
    } else if (*p && (*p == '?' || attr_ch_eq(*p, *t, path))) {
      p++;
      t++;
    } else if (star) {
      p = star;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (*p == '*') p++;
  return !*p;
}

/* ---- the parser ---------------------------------------------------------------------------- */

typedef struct attr_parse_s {
  attr_rules_t *r;
  const char *name;
  uint32_t line;
  ms_errbuf_t *eb;
} attr_parse_t;

static int attr_err(attr_parse_t *ps, int err, const char *what, const char *tok, size_t toklen) {
  if (toklen > 80) toklen = 80;
  if (tok)
    return ms__errbuf_set(ps->eb, err, "%s:%u: %s '%.*s'", ps->name, ps->line, what, (int)toklen,
                          tok);
  return ms__errbuf_set(ps->eb, err, "%s:%u: %s", ps->name, ps->line, what);
}

static const char *const attr_phase_names[ATTR_PH_COUNT] = {"none", "forward", "backward",
                                                             "optimizer", "init"};

static int attr_phase_of(const char *s, size_t len) {
  for (int i = 0; i < ATTR_PH_COUNT; i++)
    if (strlen(attr_phase_names[i]) == len && memcmp(attr_phase_names[i], s, len) == 0) return i;
  return -1;
}

/* A comma-separated list of phases into a bit set; 0 on a bad name. */
static uint8_t attr_phase_set(const char *s, size_t len) {
  uint8_t set = 0;
  while (len > 0) {
    const char *c = memchr(s, ',', len);
    size_t l = c ? (size_t)(c - s) : len;
    int ph = attr_phase_of(s, l);
    if (ph < 0) return 0;
    set |= (uint8_t)(1u << ph);
    if (!c) break;
    len -= l + 1;
    s = c + 1;
    if (len == 0) return 0;
  }
  return set;
}

static char *attr_dup(const char *s, size_t len) {
  char *d = malloc(len + 1);
  if (d) {
    memcpy(d, s, len);
    d[len] = 0;
  }
  return d;
}

/* Finds or adds a pattern; *idx = its index. */
static int attr_pattern(attr_parse_t *ps, attr_pkind kind, const char *v, size_t len,
                        uint32_t *idx) {
  attr_rules_t *r = ps->r;
  const char *at = kind == ATTR_P_FRAME ? memchr(v, '@', len) : NULL;
  if (kind == ATTR_P_FRAME && !at) return attr_err(ps, MS_EINVAL, "frame= needs FUNC@FILE, not", v, len);
  size_t l1 = at ? (size_t)(at - v) : len;
  for (size_t i = 0; i < r->npat; i++) {
    const attr_pattern_t *p = &r->pat[i];
    if (p->kind != kind || strlen(p->glob) != l1 || memcmp(p->glob, v, l1) != 0) continue;
    if (at && (strlen(p->glob2) != len - l1 - 1 || memcmp(p->glob2, at + 1, len - l1 - 1) != 0))
      continue;
    *idx = (uint32_t)i;
    return MS_OK;
  }
  if (r->npat >= ATTR_MAX_PATTERNS)
    return attr_err(ps, MS_ELIMIT, "too many distinct patterns (at most 256)", NULL, 0);
  attr_pattern_t *np = realloc(r->pat, (r->npat + 1) * sizeof *np);
  if (!np) return MS_ENOMEM;
  r->pat = np;
  attr_pattern_t *p = &np[r->npat];
  p->kind = kind;
  p->glob = attr_dup(v, l1);
  p->glob2 = at ? attr_dup(at + 1, len - l1 - 1) : NULL;
  if (!p->glob || (at && !p->glob2)) {
    free(p->glob);
    free(p->glob2);
    return MS_ENOMEM;
  }
  *idx = (uint32_t)r->npat++;
  return MS_OK;
}

static bool attr_is(const char *s, size_t len, const char *lit) {
  return strlen(lit) == len && memcmp(s, lit, len) == 0;
}

/* One condition KEY=VALUE of a rule. */
static int attr_cond(attr_parse_t *ps, attr_rule_t *ru, const char *tok, size_t len) {
  bool neg = len > 0 && tok[0] == '!';
  const char *k = tok + neg;
  const char *eq = memchr(k, '=', len - neg);
  if (!eq || eq == k || eq + 1 == tok + len)
    return attr_err(ps, MS_EINVAL, "a condition is KEY=VALUE, not", tok, len);
  size_t kl = (size_t)(eq - k), vl = (size_t)(tok + len - eq - 1);
  const char *v = eq + 1;
  int pk = attr_is(k, kl, "func") ? ATTR_P_FUNC : attr_is(k, kl, "file") ? ATTR_P_FILE
           : attr_is(k, kl, "frame") ? ATTR_P_FRAME : attr_is(k, kl, "annotation")
                                         ? ATTR_P_ANNOTATION : -1;
  if (neg && (pk < 0 || pk == ATTR_P_ANNOTATION))
    return attr_err(ps, MS_EINVAL, "only func=, file= and frame= take '!':", tok, len);
  if (pk >= 0) {
    uint32_t idx = 0;
    int rc = attr_pattern(ps, (attr_pkind)pk, v, vl, &idx);
    if (rc != MS_OK) return rc;
    if (pk == ATTR_P_ANNOTATION) {
      if (ru->kind != ATTR_R_PHASE || ru->annotation != ATTR_NONE || ru->has_frames)
        return attr_err(ps, MS_EINVAL, "annotation= stands alone, in a phase rule:", tok, len);
      ru->annotation = idx;
      return MS_OK;
    }
    if (ru->annotation != ATTR_NONE)
      return attr_err(ps, MS_EINVAL, "annotation= stands alone, in a phase rule:", tok, len);
    (neg ? ru->forbid : ru->need)[idx / 64] |= 1ull << (idx % 64);
    ru->has_frames = true;
    return MS_OK;
  }
  bool frame_only = ru->kind != ATTR_R_CATEGORY;
  uint8_t set;
  if (attr_is(k, kl, "phase") || attr_is(k, kl, "prev") || attr_is(k, kl, "next")) {
    if (frame_only) goto only_frames;
    if (!(set = attr_phase_set(v, vl)))
      return attr_err(ps, MS_EINVAL, "unknown phase (none, forward, backward, optimizer, init):",
                      tok, len);
    *(k[0] == 'p' && k[1] == 'h' ? &ru->phase : k[0] == 'p' ? &ru->prev : &ru->next) = set;
  } else if (attr_is(k, kl, "freed")) {
    if (frame_only) goto only_frames;
    ru->freed = attr_is(v, vl, "within") ? ATTR_FREED_WITHIN : attr_is(v, vl, "after")
                ? ATTR_FREED_AFTER : attr_is(v, vl, "never") ? ATTR_FREED_NEVER : ATTR_FREED_ANY;
    if (ru->freed == ATTR_FREED_ANY)
      return attr_err(ps, MS_EINVAL, "freed= takes within, after or never, not", tok, len);
  } else if (attr_is(k, kl, "alloc")) {
    if (frame_only) goto only_frames;
    ru->alloc = attr_is(v, vl, "recorded") ? ATTR_ALLOC_RECORDED
                : attr_is(v, vl, "unrecorded") ? ATTR_ALLOC_UNRECORDED : ATTR_ALLOC_ANY;
    if (ru->alloc == ATTR_ALLOC_ANY)
      return attr_err(ps, MS_EINVAL, "alloc= takes recorded or unrecorded, not", tok, len);
  } else if (attr_is(k, kl, "stack")) {
    if (frame_only) goto only_frames;
    ru->nostack = attr_is(v, vl, "none") ? 1 : attr_is(v, vl, "some") ? 0 : -2;
    if (ru->nostack == -2) return attr_err(ps, MS_EINVAL, "stack= takes none or some, not", tok, len);
  } else if (attr_is(k, kl, "matches")) {
    if (frame_only) goto only_frames;
    if (!attr_is(v, vl, "gradient"))
      return attr_err(ps, MS_EINVAL, "matches= takes gradient, not", tok, len);
    ru->matches_gradient = true;
  } else {
    return attr_err(ps, MS_EINVAL, "unknown condition", tok, len);
  }
  return MS_OK;
only_frames:
  return attr_err(ps, MS_EINVAL, "this kind of rule takes only func=, file=, frame= (and "
                  "annotation= for phase), not", tok, len);
}

/* Splits off the next token of [*s, end): blanks separate tokens. */
static bool attr_token(const char **s, const char *end, const char **tok, size_t *len) {
  const char *p = *s;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  if (p >= end) return false;
  const char *q = p;
  while (q < end && *q != ' ' && *q != '\t') q++;
  *tok = p;
  *len = (size_t)(q - p);
  *s = q;
  return true;
}

static int attr_line(attr_parse_t *ps, const char *s, const char *end) {
  for (const char *h = s; h < end; h++) /* a comment: '#' first on the line or after a blank */
    if (*h == '#' && (h == s || h[-1] == ' ' || h[-1] == '\t')) {
      end = h;
      break;
    }
  const char *tok;
  size_t len;
  if (!attr_token(&s, end, &tok, &len)) return MS_OK;
  attr_rule_t ru;
  memset(&ru, 0, sizeof ru);
  ru.nostack = -1;
  ru.annotation = ATTR_NONE;
  ru.line = ps->line;
  if (attr_is(tok, len, "defaults")) {
    if (!attr_token(&s, end, &tok, &len) || !attr_is(tok, len, "none") ||
        attr_token(&s, end, &tok, &len))
      return attr_err(ps, MS_EINVAL, "the only defaults line is 'defaults none'", NULL, 0);
    ps->r->no_defaults = true;
    return MS_OK;
  }
  if (attr_is(tok, len, "skip")) {
    ru.kind = ATTR_R_SKIP;
  } else if (attr_is(tok, len, "prefer")) {
    ru.kind = ATTR_R_PREFER;
  } else if (attr_is(tok, len, "phase")) {
    ru.kind = ATTR_R_PHASE;
    if (!attr_token(&s, end, &tok, &len)) return attr_err(ps, MS_EINVAL, "phase needs a phase", NULL, 0);
    int ph = attr_phase_of(tok, len);
    if (ph < 0) return attr_err(ps, MS_EINVAL, "unknown phase", tok, len);
    ru.target = (uint8_t)ph;
  } else {
    char name[32];
    if (len >= sizeof name) return attr_err(ps, MS_EINVAL, "unknown category or kind of line", tok, len);
    memcpy(name, tok, len);
    name[len] = 0;
    ms_category c = ms_category_parse(name);
    if (c == MS_CAT_COUNT)
      return attr_err(ps, MS_EINVAL, "unknown category or kind of line (categories: parameter, "
                      "optimizer_state, input, temporary, activation, gradient, autograd_detail, "
                      "unknown; or skip, prefer, phase):", tok, len);
    ru.kind = ATTR_R_CATEGORY;
    ru.target = (uint8_t)c;
  }
  int n = 0;
  while (attr_token(&s, end, &tok, &len)) {
    int rc = attr_cond(ps, &ru, tok, len);
    if (rc != MS_OK) return rc;
    n++;
  }
  if (ru.kind != ATTR_R_CATEGORY && !ru.has_frames && ru.annotation == ATTR_NONE)
    return attr_err(ps, MS_EINVAL, "this rule needs a func=, file= or frame= condition", NULL, 0);
  if (ps->r->nrules >= ATTR_MAX_RULES)
    return attr_err(ps, MS_ELIMIT, "too many rules (at most 1024)", NULL, 0);
  attr_rule_t *nr = realloc(ps->r->rules, (ps->r->nrules + 1) * sizeof *nr);
  if (!nr) return MS_ENOMEM;
  ps->r->rules = nr;
  nr[ps->r->nrules++] = ru;
  (void)n;
  return MS_OK;
}

int ms__attr_rules_parse(attr_rules_t *r, const char *text, size_t len, const char *name,
                         ms_errbuf_t *eb) {
  attr_parse_t ps = {r, name ? name : "rules", 0, eb};
  if (len > ATTR_MAX_TEXT)
    return ms__errbuf_set(eb, MS_ELIMIT, "%s: more than 1 MiB, more than a rules text may have",
                          ps.name);
  const char *s = text, *end = text + len;
  while (s < end) {
    ps.line++;
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    const char *le = nl ? nl : end;
    if ((size_t)(le - s) > ATTR_MAX_LINE)
      return attr_err(&ps, MS_ELIMIT, "line longer than 4096 bytes", NULL, 0);
    if (memchr(s, 0, (size_t)(le - s)))
      return attr_err(&ps, MS_EINVAL, "a NUL byte: not a text file", NULL, 0);
    const char *lend = le > s && le[-1] == '\r' ? le - 1 : le;
    int rc = attr_line(&ps, s, lend);
    if (rc != MS_OK) return rc;
    s = nl ? nl + 1 : end;
  }
  return MS_OK;
}

void ms__attr_rules_free(attr_rules_t *r) {
  for (size_t i = 0; i < r->npat; i++) {
    free(r->pat[i].glob);
    free(r->pat[i].glob2);
  }
  free(r->pat);
  free(r->rules);
  memset(r, 0, sizeof *r);
}

/* ---- categories ---------------------------------------------------------------------------- */

static const char *const attr_cat_names[MS_CAT_COUNT] = {
    "parameter", "optimizer_state", "input", "temporary",
    "activation", "gradient", "autograd_detail", "unknown"};
static const char *const attr_cat_colors[MS_CAT_COUNT] = {
    "darkgreen", "goldenrod", "black", "mediumpurple", "red", "mediumblue", "royalblue", "grey"};

const char *ms_category_name(ms_category c) {
  return (unsigned)c < MS_CAT_COUNT ? attr_cat_names[c] : "?";
}

const char *ms_category_color(ms_category c) {
  return (unsigned)c < MS_CAT_COUNT ? attr_cat_colors[c] : "?";
}

ms_category ms_category_parse(const char *s) {
  for (int i = 0; i < MS_CAT_COUNT; i++)
    if (strcmp(s, attr_cat_names[i]) == 0) return (ms_category)i;
  return MS_CAT_COUNT;
}
