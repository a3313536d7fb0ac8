/* SPDX-License-Identifier: MIT
 * memsnap core: the allocations classified as the file is read (ms_attr_load,
 * memsnap/attribution.h).
 *
 * A classifier needs every allocation's frames: their pattern set (a category's frame
 * conditions), and their source and op (a source line's operators). A read that leaves the
 * stacks for later (MS_LOAD_DEFER_STACKS) does not intern them, so ms_attr_create used to read
 * the frames of those records from the file a second time (ms__snapshot_scan_deferred): 0.25 s of
 * a 1 GB pickle. Here the read shows a watch each record's frames as it reads them
 * (snapshot/deferred.h), already mapped to frames, and the watch keeps what the scan would have
 * found: per record its pattern set's index among the sets met so far, per frame what the records
 * say of its operators. The snapshot keeps that (ms__snapshot_defer_keep) until the first
 * classifier with the same rules takes it: the sets are then added to the classifier's in the
 * order the records met them, which is the order the scan would have added them in, so that the
 * classifier is the same either way.
 *
 * The frames' features are found as frames appear (a frame's depend only on its own strings). A
 * failure while reading (out of memory, a frame not read yet) only drops what was found: the
 * classifier then reads the file again, as without a watch.
 */
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "common/internal.h"
#include "snapshot/deferred.h"

#define SEED_NONE ATTR_SEED_NONE /* eset: a record not left for later */

struct attr_seed_s {
  ms_attr_t a;        /* the rules; fpat and fflags of frames [0, nfeat); the sets the records
                         met, in that order (set_pat, set_rules, set_phase, nsets) */
  size_t nfeat, capf; /* frames with features; room for them */
  attr_strbits_t names, files;
  attr_setq_t q; /* the sets' lookup */
  uint8_t *eset; /* per record: its set (SEED_NONE: not left for later); an ms__big_* array
                    with room for `room`, [0, nrec) written, which the classifier takes as it is
                    (ms_attr_t.eset8). A byte a record: the sets of a trace are a few dozen,
                    and a 255th drops the seed */
  size_t nrec, room;
  uint32_t *dfirst; /* per frame [0, nfeat): as ms_attr_t's */
  uint8_t *dmulti;
  bool broken; /* something failed: nothing here is used */
  bool taken;  /* a classifier took it */
  /* the configuration, to know the classifier it serves */
  char *rules;
  size_t rules_len;
  bool has_rules, replace;
};

static void seed_free(void *p) {
  attr_seed_t *z = p;
  if (!z) return;
  ms__attr_rules_free(&z->a.rules);
  free(z->a.fflags);
  free(z->a.fpat);
  free(z->a.set_pat);
  free(z->a.set_rules);
  free(z->a.set_phase);
  ms__attr_strbits_free(&z->names);
  ms__attr_strbits_free(&z->files);
  free(z->q.tab);
  ms__big_free(z->eset);
  free(z->dfirst);
  free(z->dmulti);
  free(z->rules);
  free(z);
}

/* Features for frames [nfeat, nftab). */
static bool seed_features(attr_seed_t *z, const ms_snap_frame_t *ftab, size_t nftab) {
  ms_attr_t *a = &z->a;
  if (nftab > z->capf) {
    size_t cap = z->capf ? z->capf : 1024;
    while (cap < nftab)
      cap *= 2;
    uint8_t *fl = realloc(a->fflags, cap);
    if (fl) a->fflags = fl;
    uint64_t *fp = fl ? realloc(a->fpat, cap * a->pw * sizeof *fp) : NULL;
    if (fp) a->fpat = fp;
    uint32_t *df = fp ? realloc(z->dfirst, cap * sizeof *df) : NULL;
    if (df) z->dfirst = df;
    uint8_t *dm = df ? realloc(z->dmulti, cap) : NULL;
    if (!dm) return false;
    z->dmulti = dm;
    z->capf = cap;
  }
  for (size_t f = z->nfeat; f < nftab; f++) {
    if (!ms__attr_frame_features(a, &ftab[f], &z->names, &z->files, &a->fpat[f * a->pw],
                                 &a->fflags[f]))
      return false;
    z->dfirst[f] = ATTR_OP_UNSEEN;
    z->dmulti[f] = 0;
  }
  z->nfeat = nftab;
  return true;
}

/* Room in eset for record rec (doubling: records come in their order). */
static bool seed_room(attr_seed_t *z, size_t rec) {
  size_t room = z->room ? z->room * 2 : (size_t)1 << 16;
  while (room <= rec)
    room *= 2;
  uint8_t *e = ms__big_realloc(z->eset, room * sizeof *e);
  if (!e) return false;
  z->eset = e;
  z->room = room;
  return true;
}

/* The watch (ms__defer_watch_fn): what attr_scan_record finds of a record, as it is read. */
static void seed_record(void *ctx, size_t rec, const uint32_t *fr, uint32_t n,
                        const ms_snap_frame_t *ftab, size_t nftab) {
  attr_seed_t *z = ctx;
  if (z->broken) return;
  ms_attr_t *a = &z->a;
  /* records come in their order, each once, with frames the read has (fr[j] < nftab): the
   * frames read since the last record get their features first */
  if (rec < z->nrec || rec >= SIZE_MAX / 2 ||
      (nftab > z->nfeat && !seed_features(z, ftab, nftab)) ||
      (rec >= z->room && !seed_room(z, rec))) {
    z->broken = true;
    return;
  }
  for (size_t i = z->nrec; i < rec; i++)
    z->eset[i] = SEED_NONE;
  z->nrec = rec + 1;
  uint64_t set[ATTR_PW];
  uint32_t src, op;
  ms__attr_frames_set(a, fr, n, set, &src, &op);
  attr_note_op(z->dfirst, z->dmulti, src, op);
  uint32_t id;
  if (ms__attr_setq_index(a, &z->q, set, &id) != MS_OK || id >= SEED_NONE) {
    z->broken = true;
    return;
  }
  z->eset[rec] = (uint8_t)id;
}

/* A seed for the rules of cfg; NULL when they do not parse (ms_attr_create will say why) or out
 * of memory. */
static attr_seed_t *seed_new(const ms_attr_config_t *cfg) {
  attr_seed_t *z = calloc(1, sizeof *z);
  if (!z) return NULL;
  ms_errbuf_t eb = {{0}};
  if (ms__attr_rules_load(&z->a.rules, cfg, &eb) != MS_OK) {
    seed_free(z);
    return NULL;
  }
  z->a.pw = attr_pattern_words(&z->a.rules);
  z->a.rw = z->a.rules.nrules ? (z->a.rules.nrules + 63) / 64 : 1;
  z->q.last_id = ATTR_NONE;
  z->has_rules = cfg->rules != NULL;
  z->replace = cfg->replace;
  if (cfg->rules) {
    z->rules = malloc(cfg->rules_len ? cfg->rules_len : 1);
    if (!z->rules) {
      seed_free(z);
      return NULL;
    }
    memcpy(z->rules, cfg->rules, cfg->rules_len);
    z->rules_len = cfg->rules_len;
  }
  return z;
}

int ms_attr_load(const char *path, unsigned flags, const ms_attr_config_t *cfg, ms_snapshot_t **out,
                 ms_errbuf_t *eb) {
  ms_attr_config_t def;
  if (!cfg) {
    ms_attr_config_init(&def);
    cfg = &def;
  }
  attr_seed_t *z = (flags & MS_LOAD_DEFER_STACKS) ? seed_new(cfg) : NULL;
  if (!z) return ms_snapshot_load_ex(path, flags, out, eb);
  int rc = ms__snapshot_load_watched(path, flags, seed_record, z, out, eb);
  /* kept by a snapshot that has records left for later (a read made again in full has none, and
   * what the watch saw then is of no snapshot) */
  if (rc != MS_OK || z->broken || !ms__snapshot_has_deferred(*out) ||
      !ms__snapshot_defer_keep(*out, z, seed_free))
    seed_free(z);
  return rc;
}

attr_seed_t *ms__attr_seed_match(const ms_snapshot_t *snap, const ms_attr_config_t *cfg) {
  attr_seed_t *z = ms__snapshot_defer_kept(snap);
  if (!z || z->broken || z->taken || z->has_rules != (cfg->rules != NULL) ||
      z->replace != cfg->replace || z->nfeat > snap->nframes)
    return NULL;
  if (cfg->rules &&
      (z->rules_len != cfg->rules_len || memcmp(z->rules, cfg->rules, cfg->rules_len) != 0))
    return NULL;
  return z;
}

int ms__attr_seed_take(ms_attr_t *a, attr_seed_t *z, attr_setq_t *q) {
  const ms_snapshot_t *s = a->snap;
  /* the seed's sets, added to a's in the order the records met them */
  uint32_t *remap = malloc((z->a.nsets ? z->a.nsets : 1) * sizeof *remap);
  if (!remap) return MS_ENOMEM;
  for (size_t i = 0; i < z->a.nsets; i++) {
    int rc = ms__attr_setq_index(a, q, &z->a.set_pat[i * a->pw], &remap[i]);
    if (rc != MS_OK) {
      free(remap);
      return rc;
    }
  }
  size_t nf = s->nframes ? s->nframes : 1;
  uint32_t *df = realloc(z->dfirst, nf * sizeof *df);
  if (df) z->dfirst = df;
  uint8_t *dm = df ? realloc(z->dmulti, nf) : NULL;
  if (!dm) {
    free(remap);
    return MS_ENOMEM;
  }
  z->dmulti = dm;
  for (size_t f = z->nfeat; f < nf; f++) {
    z->dfirst[f] = ATTR_OP_UNSEEN;
    z->dmulti[f] = 0;
  }
  /* the records' sets stay a byte each, read through remap (attr_record_set); records past the
   * trace: none */
  a->eset8 = z->eset;
  a->eset_map = remap;
  a->neset8 = z->nrec < s->ntrace ? z->nrec : s->ntrace;
  a->dfirst = z->dfirst;
  a->dmulti = z->dmulti;
  z->eset = NULL;
  z->dfirst = NULL;
  z->dmulti = NULL;
  z->room = z->nrec = z->capf = 0;
  z->taken = true;
  return MS_OK;
}
