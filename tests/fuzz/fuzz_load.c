/* SPDX-License-Identifier: MIT
 * libFuzzer target for ms_snapshot_load's format detection and its two ways of reading (issue #16
 * item 25): any bytes as a file (rewindable: a pickle whose trace cannot be skipped is read
 * again from the start) and as standard input (one pass, never a seek), through the loader's
 * stream entry point ms__snapshot_load_fp (lib/common/internal.h), which ms_snapshot_load_ex calls
 * for a path and for "-". The detection sees memsnap files, gzip-compressed memsnap files,
 * pickles and gzip-compressed pickles (the gzip magic is checked by inflating the head).
 * The first byte chooses the flags (MS_LOAD_NO_TRACE or none); the rest is the file. For every
 * input:
 *  - each way answers MS_OK or an error whose message names the input ("'NAME': ...");
 *  - without flags, the file and standard input give the same answer (the same message, or
 *    snapshots of the same sizes), and ms_format_detect agrees with what was read;
 *  - with MS_LOAD_NO_TRACE the file is accepted whenever it is without flags (and maybe more: the
 *    entries of a skipped trace are not type-checked), with the same segments and blocks;
 *    standard input may refuse (MS_EUNSUPPORTED) what needs a second pass;
 *  - with MS_LOAD_NO_TRACE, the skipped entries read whole (pickle_skim.c) or by the general
 *    loop give the same answer, to the words of its message;
 *  - one input in 16 is also read for a window of its trace (ms_snapshot_load_window, through a
 *    real file), which must accept whatever the full read accepts, with the same tables;
 *  - one input in 8 also goes through a real file and ms_snapshot_load_ex(path), which reads a
 *    pickle through mapped windows instead of a buffer: it must agree with the stream, to the
 *    words of its message;
 *  - one input in 8 is also read (in full, or without the frees' or the trace's stacks) with the
 *    reader's objects all kept to the end (ms__pickle_recycle false) and with those that cannot
 *    be named again freed (pickle_retire.c): the same answer, to the words of its message, and
 *    the same trace;
 *  - one input in 4 is also read (in full, or without the frees' or the trace's stacks) with a
 *    kept trace's entries read whole (pickle_entry.c) and by the general loop
 *    (ms__pickle_fast false): the same answer, to the words of its message, and the same trace,
 *    field by field;
 *  - one input in 16 also goes through a real file read without the frees' stacks, at once and
 *    with the allocations' stacks left for later (MS_LOAD_DEFER_STACKS, snapshot/deferred.h): the
 *    same answer, to the words of its message, and the same trace but for those stacks; then
 *    every entry's stack is read from the file (ms__snapshot_fill_stacks: MS_OK, the file being
 *    unchanged) and each allocation's stack is the one read at once, frame by frame.
 *
 * Built and run by scripts/fuzz.sh (make fuzz); seeds in tests/fuzz/corpus/fuzz_load/. The
 * retire-shared-list*.seed inputs are made by hand (a flags byte, then the small pickle of
 * tests/test_pickle_retire.c whose memoized frames list is named again after its entry was
 * freed), and so is deferred-two-allocs.seed (the flags byte 8, which sends it through the
 * deferred read, then tests/test_deferred.c's two allocs: the second's frames list is a run of
 * gets of a frame met before, its stack left for later), not third-party data; the PyTorch
 * fixtures are added by the script from ../shared/fixtures/torch.
 * fuzz-flags: -max_len=16384
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/internal.h"
#include "fuzz_util.h"
#include "snapshot/deferred.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int load(const uint8_t *data, size_t size, const char *name, bool rewindable, unsigned flags,
                ms_snapshot_t **out, ms_errbuf_t *eb) {
  FILE *fp = fz_fopen(fz_in(data, size));
  FZ_CHECK(fp != NULL, "cannot open a memory stream");
  eb->msg[0] = 0;
  *out = NULL;
  int rc = ms__snapshot_load_fp(fp, name, rewindable, flags, out, eb);
  fclose(fp);
  if (rc != MS_OK) {
    FZ_CHECK(*out == NULL, "out-parameter set on failure");
    char want[64];
    snprintf(want, sizeof want, "'%s': ", name);
    FZ_CHECK(strncmp(eb->msg, want, strlen(want)) == 0 && eb->msg[strlen(want)] != 0,
             "message '%s' does not name the input", eb->msg);
  } else {
    FZ_CHECK(*out != NULL, "MS_OK without a snapshot");
  }
  return rc;
}

static int same_sizes(const ms_snapshot_t *a, const ms_snapshot_t *b) {
  return a->nsegments == b->nsegments && a->nblocks == b->nblocks && a->ntrace == b->ntrace &&
         a->nframes == b->nframes && a->ndevices == b->ndevices && a->nhistory == b->nhistory;
}

/* Through a real file and the public path entry point: the same answer as the stream. */
static void via_path(const uint8_t *data, size_t size, unsigned flags, int rc,
                     const ms_snapshot_t *s, const char *msg) {
  char path[] = "/tmp/memsnap-fuzz-load-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return;
  FZ_CHECK(size == 0 || write(fd, data, size) == (ssize_t)size, "write");
  close(fd);
  ms_snapshot_t *p = NULL;
  ms_errbuf_t eb = {{0}};
  int rp = ms_snapshot_load_ex(path, flags, &p, &eb);
  unlink(path);
  FZ_CHECK(rp == rc, "path %d, stream %d (%s)", rp, rc, eb.msg);
  if (rp == MS_OK) FZ_CHECK(same_sizes(p, s), "path and stream: other sizes");
  size_t pl = strlen(path) + 2, sl = strlen("'file'");
  if (rp != MS_OK)
    FZ_CHECK(strlen(eb.msg) >= pl && strcmp(eb.msg + pl, msg + sl) == 0,
             "path and stream: '%s' / '%s'", eb.msg, msg);
  ms_snapshot_free(p);
}

/* Through a real file and ms_snapshot_load_window (a window from the option byte): whatever a
 * full read accepts is accepted (a window the reader cannot honour reads the file again in
 * full), with the same tables. */
static void via_window(const uint8_t *data, size_t size, uint8_t opt, int rc,
                       const ms_snapshot_t *s) {
  char path[] = "/tmp/memsnap-fuzz-window-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return;
  FZ_CHECK(size == 0 || write(fd, data, size) == (ssize_t)size, "write");
  close(fd);
  ms_load_window_t w = {(opt & 0x20) ? MS_LOAD_WINDOW_TIMES : MS_LOAD_WINDOW_ENTRIES,
                        (uint64_t)(opt >> 6), (int64_t)(opt >> 6) - 1};
  ms_snapshot_t *p = NULL;
  ms_errbuf_t eb = {{0}};
  int rp = ms_snapshot_load_window(path, (opt & 0x10) ? MS_LOAD_NO_FREE_STACKS : 0, &w, &p, &eb);
  unlink(path);
  if (rc == MS_OK) FZ_CHECK(rp == MS_OK, "windowed read refused what a full read took: %s", eb.msg);
  if (rp == MS_OK && rc == MS_OK) FZ_CHECK(same_sizes(p, s), "windowed and full: other sizes");
  ms_snapshot_free(p);
}

/* Whether stack sa of a and sb of b hold the same frames (or are both absent). */
static bool same_stack(const ms_snapshot_t *a, uint32_t sa, const ms_snapshot_t *b, uint32_t sb) {
  bool na = sa >= a->nstacks, nb = sb >= b->nstacks;
  if (na || nb) return na && nb;
  const ms_snap_stack_t *x = &a->stacks[sa], *y = &b->stacks[sb];
  if (x->nframes != y->nframes) return false;
  for (uint32_t k = 0; k < x->nframes; k++) {
    const ms_snap_frame_t *f = &a->frames[ms_snap_frame_index(a, x->first + k)];
    const ms_snap_frame_t *g = &b->frames[ms_snap_frame_index(b, y->first + k)];
    if (strcmp(f->name, g->name) != 0 || strcmp(f->filename, g->filename) != 0 ||
        f->line != g->line)
      return false;
  }
  return true;
}

/* Through a real file without the frees' stacks, the allocations' read at once and left for
 * later: the same answer; every stack read later is the one read at once. */
static void via_deferred(const uint8_t *data, size_t size) {
  char path[] = "/tmp/memsnap-fuzz-defer-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return;
  FZ_CHECK(size == 0 || write(fd, data, size) == (ssize_t)size, "write");
  close(fd);
  ms_snapshot_t *a = NULL, *b = NULL;
  ms_errbuf_t ea = {{0}}, eb = {{0}};
  int ra = ms_snapshot_load_ex(path, MS_LOAD_NO_FREE_STACKS, &a, &ea);
  int rb = ms_snapshot_load_ex(path, MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS, &b, &eb);
  FZ_CHECK(ra == rb, "deferred: at once %d, later %d (%s / %s)", ra, rb, ea.msg, eb.msg);
  if (ra != MS_OK) {
    FZ_CHECK(strcmp(ea.msg, eb.msg) == 0, "deferred: '%s' / '%s'", ea.msg, eb.msg);
  } else {
    FZ_CHECK(same_sizes(a, b), "deferred: other sizes");
    size_t *idx = malloc((b->ntrace ? b->ntrace : 1) * sizeof *idx);
    FZ_CHECK(idx != NULL, "out of memory");
    for (size_t i = 0; i < b->ntrace; i++) {
      const ms_snap_trace_t *x = &a->trace[i], *y = &b->trace[i];
      FZ_CHECK(x->action == y->action && x->addr == y->addr && x->size == y->size &&
                   ms_snap_trace_stream(x) == ms_snap_trace_stream(y) && x->time_us == y->time_us &&
                   x->present == y->present,
               "deferred: trace entry %zu differs", i);
      idx[i] = b->ntrace - 1 - i; /* backwards: the fill sorts what it is asked */
    }
    ms_errbuf_t ef = {{0}};
    int rf = ms__snapshot_fill_stacks(b, idx, b->ntrace, &ef);
    FZ_CHECK(rf == MS_OK, "deferred: the fill of an unchanged file: %d (%s)", rf, ef.msg);
    FZ_CHECK(!ms__snapshot_has_deferred(b), "deferred: stacks left after the fill");
    /* a read that could not leave a stack for later read the file again in full (the frees'
     * stacks too): the allocations' stacks are the same either way */
    for (size_t i = 0; i < b->ntrace; i++) {
      uint32_t x = a->trace[i].stack, y = b->trace[i].stack;
      if (a->trace[i].action == MS_TRACE_ALLOC || (x < a->nstacks && y < b->nstacks))
        FZ_CHECK(same_stack(a, x, b, y), "deferred: entry %zu's stack differs", i);
      else
        FZ_CHECK(x >= a->nstacks, "deferred: entry %zu lost its stack", i);
    }
    free(idx);
  }
  unlink(path);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
}

/* Read with a switch of the reader on and off: with the objects that cannot be named again freed
 * (pickle_retire.c) or all kept (ms__pickle_recycle), with a kept trace's entries read whole
 * (pickle_entry.c) or by the general loop (ms__pickle_fast): the same answer, to the words of
 * its message, and the same trace, field by field. */
static void both_ways(const uint8_t *data, size_t size, uint8_t opt, bool *on, const char *what) {
  unsigned flags = (opt & 0x10)   ? MS_LOAD_NO_FREE_STACKS
                   : (opt & 0x20) ? MS_LOAD_NO_TRACE_STACKS
                                  : 0;
  ms_snapshot_t *a = NULL, *b = NULL;
  ms_errbuf_t ea, eb;
  int ra = load(data, size, "file", true, flags, &a, &ea);
  *on = false;
  int rb = load(data, size, "file", true, flags, &b, &eb);
  *on = true;
  FZ_CHECK(ra == rb, "%s: on %d, off %d (%s / %s)", what, ra, rb, ea.msg, eb.msg);
  if (ra != MS_OK) {
    FZ_CHECK(strcmp(ea.msg, eb.msg) == 0, "%s: '%s' / '%s'", what, ea.msg, eb.msg);
  } else {
    FZ_CHECK(same_sizes(a, b) && a->nstacks == b->nstacks && a->nframes == b->nframes,
             "%s: other sizes", what);
    for (size_t i = 0; i < a->ntrace; i++) {
      const ms_snap_trace_t *x = &a->trace[i], *y = &b->trace[i];
      FZ_CHECK(x->stack == y->stack && x->action == y->action && x->addr == y->addr &&
                   x->size == y->size && ms_snap_trace_stream(x) == ms_snap_trace_stream(y) &&
                   x->time_us == y->time_us && x->present == y->present &&
                   strcmp(ms_snap_trace_action_name(x), ms_snap_trace_action_name(y)) == 0 &&
                   strcmp(ms_snap_trace_compile_context(x), ms_snap_trace_compile_context(y)) ==
                       0 &&
                   strcmp(ms_snap_trace_user_metadata(x), ms_snap_trace_user_metadata(y)) == 0 &&
                   strcmp(ms_snap_trace_category(x), ms_snap_trace_category(y)) == 0,
               "%s: trace entry %zu differs", what, i);
    }
  }
  ms_snapshot_free(a);
  ms_snapshot_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in_t inp = fz_in(data, size);
  uint8_t opt;
  if (!fz_take(&inp, &opt)) return 0;
  unsigned flags = (opt & 1) ? MS_LOAD_NO_TRACE : 0;
  bool through_path = (opt >> 1) % 8 == 0;
  data = inp.p;
  size = inp.n;
  ms_snapshot_t *f = NULL, *in = NULL, *full = NULL;
  ms_errbuf_t ef, ei, eu;
  int rf = load(data, size, "file", true, flags, &f, &ef);
  int ri = load(data, size, "<stdin>", false, flags, &in, &ei);
  if (flags == 0) {
    FZ_CHECK(rf == ri, "file %d, stdin %d", rf, ri);
    if (rf == MS_OK)
      FZ_CHECK(same_sizes(f, in), "file and stdin: other sizes");
    else
      FZ_CHECK(strcmp(ef.msg + strlen("'file'"), ei.msg + strlen("'<stdin>'")) == 0,
               "file and stdin: '%s' / '%s'", ef.msg, ei.msg);
    ms_format fmt = ms_format_detect(data, size < 4096 ? size : 4096);
    if (rf == MS_OK && fmt == MS_FORMAT_UNKNOWN)
      FZ_CHECK(size >= 2 && data[0] == 0x1f && data[1] == 0x8b, "accepted an unknown format");
  } else {
    int ru = load(data, size, "file", true, 0, &full, &eu);
    /* without the trace, entries are not type-checked: it may accept what a full read refuses */
    FZ_CHECK(ru != MS_OK || rf == MS_OK, "without the trace %d, in full %d (%s)", rf, ru, ef.msg);
    if (rf == MS_OK && ru == MS_OK)
      FZ_CHECK(f->nsegments == full->nsegments && f->nblocks == full->nblocks &&
                   f->ndevices == full->ndevices,
               "without the trace: other segments or blocks");
    /* the skipped trace's entries read whole (pickle_skim.c) or by the general loop: the same
     * answer, to the words of its message */
    ms_snapshot_t *g = NULL;
    ms_errbuf_t eg;
    ms__pickle_skim = false;
    int rg = load(data, size, "file", true, flags, &g, &eg);
    ms__pickle_skim = true;
    FZ_CHECK(rg == rf, "entries read whole %d, by the general loop %d (%s)", rf, rg, eg.msg);
    if (rg == MS_OK)
      FZ_CHECK(same_sizes(f, g), "entries read whole: other sizes");
    else
      FZ_CHECK(strcmp(ef.msg, eg.msg) == 0, "entries read whole: '%s' / '%s'", ef.msg, eg.msg);
    ms_snapshot_free(g);
    if (ri == MS_OK)
      FZ_CHECK(rf == MS_OK && same_sizes(in, f), "stdin without the trace differs");
    else if (rf == MS_OK)
      FZ_CHECK(ri == MS_EUNSUPPORTED, "stdin refused what the file took: %s", ei.msg);
    ms_snapshot_free(full);
  }
  if (through_path) via_path(data, size, flags, rf, f, ef.msg);
  if (flags == 0 && (opt >> 1) % 8 == 1) via_window(data, size, opt, rf, f);
  if (flags == 0 && (opt >> 1) % 8 == 2) both_ways(data, size, opt, &ms__pickle_recycle, "freed");
  if (flags == 0 && (opt >> 1) % 4 == 3) both_ways(data, size, opt, &ms__pickle_fast, "whole");
  if (flags == 0 && (opt >> 1) % 8 == 4) via_deferred(data, size);
  ms_snapshot_free(f);
  ms_snapshot_free(in);
  return 0;
}
