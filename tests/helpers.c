/* SPDX-License-Identifier: MIT
 * memsnap tests: shared helpers (see helpers.h). Plain C, no Criterion: the synthetic snapshot
 * builder, deep model equality, a memory sink and temporary-file utilities.
 */
#include "helpers.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/internal.h"
#include "memsnap/pickle.h"
#include "model/snapbuild.h"

/* ---- synthetic snapshot --------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
  /* splitmix64: deterministic, good enough spread for test data. */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

#define TRY(expr)                 \
  do {                            \
    if ((expr) != MS_OK) goto fail; \
  } while (0)

static int synth_settings(ms__snapbuild_t *b) {
  const char *s;
  ms_snap_kv_t kv;
  /* top level: int, str, bool, float, none, and a map with a nested map */
  memset(&kv, 0, sizeof kv);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "max_split_size", 14, &kv.key));
  kv.kind = MS_SNAP_VAL_INT, kv.i = -1, kv.s = "";
  MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting(b, &kv));
  memset(&kv, 0, sizeof kv);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "backend", 7, &kv.key));
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "native", 6, &s));
  kv.kind = MS_SNAP_VAL_STR, kv.s = s;
  MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting(b, &kv));
  memset(&kv, 0, sizeof kv);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "expandable_segments", 19, &kv.key));
  kv.kind = MS_SNAP_VAL_BOOL, kv.b = true, kv.s = "";
  MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting(b, &kv));
  memset(&kv, 0, sizeof kv);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "garbage_collection_threshold", 28, &kv.key));
  kv.kind = MS_SNAP_VAL_FLOAT, kv.f = 0.75, kv.s = "";
  MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting(b, &kv));
  memset(&kv, 0, sizeof kv);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "pinned_use_host_register", 24, &kv.key));
  kv.kind = MS_SNAP_VAL_NONE, kv.s = "";
  MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting(b, &kv));
  /* roundup_power2_divisions: {"1": 4, "nested": {"x": "y"}, "z": 2} */
  ms_snap_kv_t c[3];
  memset(c, 0, sizeof c);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "1", 1, &c[0].key));
  c[0].kind = MS_SNAP_VAL_INT, c[0].i = 4, c[0].s = "";
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "nested", 6, &c[1].key));
  c[1].kind = MS_SNAP_VAL_MAP, c[1].s = "";
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "z", 1, &c[2].key));
  c[2].kind = MS_SNAP_VAL_INT, c[2].i = 2, c[2].s = "";
  uint32_t first = 0, idx;
  for (int i = 0; i < 3; i++) {
    MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting_child(b, &c[i], &idx));
    if (i == 0) first = idx;
  }
  ms_snap_kv_t g;
  memset(&g, 0, sizeof g);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "x", 1, &g.key));
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "y", 1, &g.s));
  g.kind = MS_SNAP_VAL_STR;
  MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting_child(b, &g, &idx));
  b->settings_children.ptr[first + 1].first = idx;
  b->settings_children.ptr[first + 1].count = 1;
  memset(&kv, 0, sizeof kv);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "roundup_power2_divisions", 24, &kv.key));
  kv.kind = MS_SNAP_VAL_MAP, kv.first = first, kv.count = 3, kv.s = "";
  return ms__snapbuild_add_setting(b, &kv);
}

ms_snapshot_t *th_synth(const th_synth_opts_t *opts) {
  th_synth_opts_t o = {4, 5, 12, 10, 6, 1, 42};
  if (opts) o = *opts;
  uint64_t rs = o.seed ? o.seed : 1;
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  ms_snapshot_t *snap = NULL;
  char buf[128];
  uint32_t *frame_idx = NULL, *stack_idx = NULL;
  size_t nstack_idx = 0;

  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_SETTINGS | MS_SNAP_HAS_ANNOTATIONS |
                  MS_SNAP_HAS_PROCESS | MS_SNAP_HAS_RANK;
  b.hdr.pid = 4242;
  TRY(ms__snapbuild_str(&b, "synth-host", 10, &b.hdr.hostname));
  b.hdr.rank = 3;
  b.hdr.time_us = 1700000000123456LL;

  frame_idx = calloc(o.nframes + 1, sizeof *frame_idx);
  stack_idx = calloc(o.nstacks + 1, sizeof *stack_idx);
  if (!frame_idx || !stack_idx) goto fail;
  for (size_t i = 0; i < o.nframes; i++) {
    char name[64], file[64];
    int nl = snprintf(name, sizeof name, "fn_%zu(int, char const*)", i);
    int fl = i % 3 == 0 ? 0 : snprintf(file, sizeof file, "/src/module_%zu.py", i % 7);
    TRY(ms__snapbuild_frame(&b, name, (size_t)nl, fl ? file : "", (size_t)fl,
                            i % 5 == 0 ? 0 : (int64_t)(i * 7 + 1), &frame_idx[i]));
  }
  for (size_t i = 0; i < o.nstacks && o.nframes; i++) {
    uint32_t fr[12];
    size_t depth = 1 + rng_next(&rs) % 12;
    for (size_t k = 0; k < depth; k++) fr[k] = frame_idx[rng_next(&rs) % o.nframes];
    TRY(ms__snapbuild_stack(&b, fr, depth, &stack_idx[nstack_idx++]));
  }
  if (o.nstacks) TRY(ms__snapbuild_stack(&b, NULL, 0, &stack_idx[nstack_idx++])); /* empty */

#define PICK_STACK() \
  (nstack_idx && rng_next(&rs) % 4 ? stack_idx[rng_next(&rs) % nstack_idx] : MS_SNAP_NO_STACK)

  for (size_t sgi = 0; sgi < o.nsegments; sgi++) {
    ms_snap_segment_t g;
    memset(&g, 0, sizeof g);
    g.device = (int64_t)(sgi % 2);
    g.address = 0x7f0000000000ULL + (uint64_t)sgi * (1ULL << 30);
    g.stream = sgi % 3 == 0 ? 0 : 0x55550000ULL + sgi;
    g.is_large = sgi % 2 == 0;
    g.is_expandable = sgi % 5 == 4;
    g.pool_id[0] = sgi % 4 == 3 ? 1 : 0;
    g.pool_id[1] = sgi % 4 == 3 ? -(int64_t)sgi : 0;
    g.stack = PICK_STACK();
    g.first_block = (uint32_t)b.blocks.len;
    g.present = (uint32_t)(rng_next(&rs) & 0x1f);
    uint64_t addr = g.address;
    for (size_t k = 0; k < o.blocks_per_segment; k++) {
      ms_snap_block_t blk;
      memset(&blk, 0, sizeof blk);
      blk.address = addr;
      blk.size = 512 * (1 + rng_next(&rs) % 4096);
      blk.requested_size = blk.size - rng_next(&rs) % 512;
      unsigned st = (unsigned)(rng_next(&rs) % 16);
      if (st == 15) {
        blk.state = MS_BLOCK_STATE_OTHER;
        TRY(ms__snapbuild_str(&b, "future_state", 12, &blk.state_name));
      } else {
        blk.state = (ms_block_state)(st % 3);
        blk.state_name = ms_block_state_name(blk.state);
      }
      blk.stack = PICK_STACK();
      blk.present = (uint32_t)(rng_next(&rs) & 0xf);
      blk.first_history = (uint32_t)b.history.len;
      if (o.history && k % 3 == 1) {
        size_t nh = 1 + k % 2;
        for (size_t h = 0; h < nh; h++) {
          ms_snap_history_t he = {addr + h * 16, blk.requested_size - h, PICK_STACK(),
                                  (uint32_t)(h & 1)};
          TRY(ms__snapbuild_add_history(&b, &he));
        }
        blk.nhistory = (uint32_t)nh;
      }
      if (blk.state == MS_BLOCK_ACTIVE_ALLOCATED) g.allocated_size += blk.size;
      if (blk.state == MS_BLOCK_ACTIVE_ALLOCATED || blk.state == MS_BLOCK_ACTIVE_PENDING_FREE) {
        g.active_size += blk.size;
        g.requested_size += blk.requested_size;
      }
      g.total_size += blk.size;
      addr += blk.size;
      TRY(ms__snapbuild_add_block(&b, &blk));
    }
    g.nblocks = (uint32_t)o.blocks_per_segment;
    TRY(ms__snapbuild_add_segment(&b, &g));
  }

  for (int d = 0; d < 2; d++) {
    ms_snap_device_t dev;
    memset(&dev, 0, sizeof dev);
    dev.first_trace = (uint32_t)b.trace.len;
    dev.first_stat = (uint32_t)b.stats.len;
    dev.present = MS_DEV_HAS_CAPACITY | MS_DEV_HAS_STATS;
    dev.capacity = (80ULL << 30) + (uint64_t)d;
    dev.trace_dropped = (uint64_t)d * 17;
    for (size_t t = 0; t < o.ntrace; t++) {
      ms_snap_trace_t te;
      memset(&te, 0, sizeof te);
      unsigned a = (unsigned)(rng_next(&rs) % (MS_TRACE_OTHER + 1));
      te.action = (uint8_t)a;
      ms_snap_trace_extra_t tx = ms__trace_extra_of(&te);
      if (te.action == MS_TRACE_OTHER)
        TRY(ms__snapbuild_str(&b, "custom_action", 13, &tx.action_name));
      te.addr = 0x7f0000000000ULL + rng_next(&rs) % (1ULL << 34);
      te.size = rng_next(&rs) % (1ULL << 31);
      tx.stream = t % 2 ? 0x5555ULL : 0;
      te.time_us = 1700000000000000LL + (int64_t)t * 13;
      tx.pool_id[0] = (int64_t)(t % 3);
      tx.pool_id[1] = -(int64_t)(t % 2);
      te.stack = PICK_STACK();
      if (t % 4 == 1) {
        int n = snprintf(buf, sizeof buf, "torch/_dynamo step %zu", t);
        TRY(ms__snapbuild_str(&b, buf, (size_t)n, &tx.compile_context));
      }
      if (t % 5 == 2) TRY(ms__snapbuild_str(&b, "{\"tag\": 1}", 10, &tx.user_metadata));
      TRY(ms__snapbuild_trace_extra(&b, &te, &tx));
      te.present = (uint16_t)(rng_next(&rs) & 0x3f);
      TRY(ms__snapbuild_add_trace(&b, &te));
    }
    dev.ntrace = (uint32_t)o.ntrace;
    static const char *const keys[] = {"allocated_bytes.all.current", "num_ooms",
                                       "fragmentation", "label", "requested_bytes.all.peak"};
    for (int k = 0; k < 5; k++) {
      ms_snap_kv_t kv;
      memset(&kv, 0, sizeof kv);
      TRY(ms__snapbuild_str(&b, keys[k], strlen(keys[k]), &kv.key));
      kv.s = "";
      switch (k) {
      case 0: kv.kind = MS_SNAP_VAL_INT, kv.i = 123456789 + d; break;
      case 1: kv.kind = MS_SNAP_VAL_INT, kv.i = -d; break;
      case 2: kv.kind = MS_SNAP_VAL_FLOAT, kv.f = 0.125 * d; break;
      case 3: kv.kind = MS_SNAP_VAL_STR; TRY(ms__snapbuild_str(&b, "dev", 3, &kv.s)); break;
      default: kv.kind = d ? MS_SNAP_VAL_BOOL : MS_SNAP_VAL_NONE, kv.b = d != 0; break;
      }
      TRY(ms__snapbuild_add_stat(&b, &kv));
    }
    dev.nstats = 5;
    TRY(ms__snapbuild_add_device(&b, &dev));
  }

  for (int i = 0; i < 3; i++) {
    ms_snap_annotation_t an;
    memset(&an, 0, sizeof an);
    TRY(ms__snapbuild_str(&b, "Optimizer.step#AdamW.step", 25, &an.name));
    an.stage = i % 2 ? "END" : "START";
    an.device = i % 2;
    an.time_us = 1700000000000000LL + i;
    TRY(ms__snapbuild_add_annotation(&b, &an));
  }
  TRY(synth_settings(&b));

  ms_errbuf_t eb;
  TRY(ms__snapbuild_finish(&b, &snap, &eb));
  free(frame_idx);
  free(stack_idx);
  return snap;
fail:
  free(frame_idx);
  free(stack_idx);
  ms__snapbuild_release(&b);
  return NULL;
}

/* ---- deep equality -------------------------------------------------------------------------- */

static const char *nz(const char *s) { return s ? s : "(null)"; }

#define DIFF_U(field, fmt_name, i)                                                              \
  if (a_->field != b_->field)                                                                   \
    return snprintf(why, cap, "%s[%zu]." #field ": %" PRIu64 " != %" PRIu64, fmt_name, (size_t)(i), \
                    (uint64_t)a_->field, (uint64_t)b_->field), 1
#define DIFF_S(field, fmt_name, i)                                                              \
  if (strcmp(nz(a_->field), nz(b_->field)) != 0)                                                \
    return snprintf(why, cap, "%s[%zu]." #field ": '%s' != '%s'", fmt_name, (size_t)(i),        \
                    nz(a_->field), nz(b_->field)), 1

static int kv_diff(const ms_snap_kv_t *a_, const ms_snap_kv_t *b_, const char *tab, size_t i,
                   char *why, size_t cap) {
  DIFF_S(key, tab, i);
  DIFF_U(kind, tab, i);
  switch (a_->kind) {
  case MS_SNAP_VAL_BOOL: DIFF_U(b, tab, i); break;
  case MS_SNAP_VAL_INT: DIFF_U(i, tab, i); break;
  case MS_SNAP_VAL_FLOAT:
    if (memcmp(&a_->f, &b_->f, sizeof a_->f) != 0)
      return snprintf(why, cap, "%s[%zu].f: %g != %g", tab, i, a_->f, b_->f), 1;
    break;
  case MS_SNAP_VAL_STR: DIFF_S(s, tab, i); break;
  case MS_SNAP_VAL_MAP:
    DIFF_U(first, tab, i);
    DIFF_U(count, tab, i);
    break;
  default: break;
  }
  return 0;
}

int th_snapshot_diff(const ms_snapshot_t *a, const ms_snapshot_t *b, char *why, size_t cap) {
  why[0] = 0;
  if (!a || !b) return snprintf(why, cap, "NULL snapshot"), 1;
  {
    const ms_snapshot_t *a_ = a, *b_ = b;
    DIFF_U(origin, "snapshot", 0);
    DIFF_U(present, "snapshot", 0);
    DIFF_U(pid, "snapshot", 0);
    DIFF_S(hostname, "snapshot", 0);
    DIFF_U(rank, "snapshot", 0);
    DIFF_U(time_us, "snapshot", 0);
    DIFF_U(nsegments, "snapshot", 0);
    DIFF_U(nblocks, "snapshot", 0);
    DIFF_U(nhistory, "snapshot", 0);
    DIFF_U(ndevices, "snapshot", 0);
    DIFF_U(ntrace, "snapshot", 0);
    DIFF_U(nframes, "snapshot", 0);
    DIFF_U(nstacks, "snapshot", 0);
    DIFF_U(nstack_frames, "snapshot", 0);
    DIFF_U(nsettings_top, "snapshot", 0);
    DIFF_U(nsettings, "snapshot", 0);
    DIFF_U(nstats, "snapshot", 0);
    DIFF_U(nannotations, "snapshot", 0);
  }
  for (size_t i = 0; i < a->nsegments; i++) {
    const ms_snap_segment_t *a_ = &a->segments[i], *b_ = &b->segments[i];
    DIFF_U(device, "segments", i);
    DIFF_U(address, "segments", i);
    DIFF_U(total_size, "segments", i);
    DIFF_U(allocated_size, "segments", i);
    DIFF_U(active_size, "segments", i);
    DIFF_U(requested_size, "segments", i);
    DIFF_U(stream, "segments", i);
    DIFF_U(is_large, "segments", i);
    DIFF_U(is_expandable, "segments", i);
    DIFF_U(pool_id[0], "segments", i);
    DIFF_U(pool_id[1], "segments", i);
    DIFF_U(stack, "segments", i);
    DIFF_U(first_block, "segments", i);
    DIFF_U(nblocks, "segments", i);
    DIFF_U(present, "segments", i);
  }
  for (size_t i = 0; i < a->nblocks; i++) {
    const ms_snap_block_t *a_ = &a->blocks[i], *b_ = &b->blocks[i];
    DIFF_U(address, "blocks", i);
    DIFF_U(size, "blocks", i);
    DIFF_U(requested_size, "blocks", i);
    DIFF_U(state, "blocks", i);
    DIFF_S(state_name, "blocks", i);
    DIFF_U(stack, "blocks", i);
    DIFF_U(first_history, "blocks", i);
    DIFF_U(nhistory, "blocks", i);
    DIFF_U(present, "blocks", i);
  }
  for (size_t i = 0; i < a->nhistory; i++) {
    const ms_snap_history_t *a_ = &a->history[i], *b_ = &b->history[i];
    DIFF_U(addr, "history", i);
    DIFF_U(real_size, "history", i);
    DIFF_U(stack, "history", i);
    DIFF_U(present, "history", i);
  }
  for (size_t i = 0; i < a->ndevices; i++) {
    const ms_snap_device_t *a_ = &a->devices[i], *b_ = &b->devices[i];
    DIFF_U(first_trace, "devices", i);
    DIFF_U(ntrace, "devices", i);
    DIFF_U(trace_dropped, "devices", i);
    DIFF_U(capacity, "devices", i);
    DIFF_U(first_stat, "devices", i);
    DIFF_U(nstats, "devices", i);
    DIFF_U(present, "devices", i);
  }
  for (size_t i = 0; i < a->ntrace; i++) {
    const ms_snap_trace_t *a_ = &a->trace[i], *b_ = &b->trace[i];
    DIFF_U(action, "trace", i);
    {
      const char *an = ms_snap_trace_action_name(a_), *bn = ms_snap_trace_action_name(b_);
      if (strcmp(an, bn) != 0)
        return snprintf(why, cap, "trace[%zu].action_name: '%s' != '%s'", i, an, bn), 1;
      const char *ac = ms_snap_trace_compile_context(a_), *bc = ms_snap_trace_compile_context(b_);
      if (strcmp(ac, bc) != 0)
        return snprintf(why, cap, "trace[%zu].compile_context: '%s' != '%s'", i, ac, bc), 1;
      const char *au = ms_snap_trace_user_metadata(a_), *bu = ms_snap_trace_user_metadata(b_);
      if (strcmp(au, bu) != 0)
        return snprintf(why, cap, "trace[%zu].user_metadata: '%s' != '%s'", i, au, bu), 1;
      const char *ak = ms_snap_trace_category(a_), *bk = ms_snap_trace_category(b_);
      if (strcmp(ak, bk) != 0)
        return snprintf(why, cap, "trace[%zu].category: '%s' != '%s'", i, ak, bk), 1;
      for (int k = 0; k < 2; k++)
        if (ms_snap_trace_pool(a_, k) != ms_snap_trace_pool(b_, k))
          return snprintf(why, cap, "trace[%zu].pool_id[%d]: %" PRId64 " != %" PRId64, i, k,
                          ms_snap_trace_pool(a_, k), ms_snap_trace_pool(b_, k)), 1;
    }
    DIFF_U(addr, "trace", i);
    DIFF_U(size, "trace", i);
    if (ms_snap_trace_stream(a_) != ms_snap_trace_stream(b_))
      return snprintf(why, cap, "trace[%zu].stream: %" PRIu64 " != %" PRIu64, i,
                      ms_snap_trace_stream(a_), ms_snap_trace_stream(b_)),
             1;
    DIFF_U(time_us, "trace", i);
    DIFF_U(stack, "trace", i);
    DIFF_U(present, "trace", i);
  }
  for (size_t i = 0; i < a->nframes; i++) {
    const ms_snap_frame_t *a_ = &a->frames[i], *b_ = &b->frames[i];
    DIFF_S(name, "frames", i);
    DIFF_S(filename, "frames", i);
    DIFF_U(line, "frames", i);
  }
  for (size_t i = 0; i < a->nstacks; i++) {
    const ms_snap_stack_t *a_ = &a->stacks[i], *b_ = &b->stacks[i];
    DIFF_U(first, "stacks", i);
    DIFF_U(nframes, "stacks", i);
  }
  for (size_t i = 0; i < a->nstack_frames; i++)
    if (ms_snap_frame_index(a, i) != ms_snap_frame_index(b, i))
      return snprintf(why, cap, "stack_frames[%zu]: %u != %u", i, ms_snap_frame_index(a, i),
                      ms_snap_frame_index(b, i)), 1;
  for (size_t i = 0; i < a->nsettings; i++)
    if (kv_diff(&a->settings[i], &b->settings[i], "settings", i, why, cap)) return 1;
  for (size_t i = 0; i < a->nstats; i++)
    if (kv_diff(&a->stats[i], &b->stats[i], "stats", i, why, cap)) return 1;
  for (size_t i = 0; i < a->nannotations; i++) {
    const ms_snap_annotation_t *a_ = &a->annotations[i], *b_ = &b->annotations[i];
    DIFF_S(name, "annotations", i);
    DIFF_S(stage, "annotations", i);
    DIFF_U(device, "annotations", i);
    DIFF_U(time_us, "annotations", i);
  }
  return 0;
}

/* ---- memory sink ---------------------------------------------------------------------------- */

static int memsink_write(void *ctx, const char *buf, size_t len) {
  th_memsink_t *m = ctx;
  if (m->fail_after && m->len + len > m->fail_after) return MS_EIO;
  if (len >= m->cap - m->len) { /* one byte kept for the NUL after the text */
    size_t ncap = m->cap ? m->cap : 4096;
    while (ncap - m->len <= len) ncap *= 2;
    char *p = realloc(m->data, ncap);
    if (!p) return MS_ENOMEM;
    m->data = p;
    m->cap = ncap;
  }
  memcpy(m->data + m->len, buf, len);
  m->len += len;
  m->data[m->len] = 0;
  return MS_OK;
}

void th_memsink_init(ms_sink_t *sink, th_memsink_t *m) {
  memset(m, 0, sizeof *m);
  sink->write = memsink_write;
  sink->ctx = m;
}

void th_memsink_free(th_memsink_t *m) {
  free(m->data);
  memset(m, 0, sizeof *m);
}

/* ---- files ---------------------------------------------------------------------------------- */

char *th_tmpdir(void) {
  const char *t = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/memsnap-test-XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(path)) return NULL;
  return strdup(path);
}

char *th_cache_tmp;

void th_cache_setup(void) {
  th_cache_tmp = th_tmpdir();
  char d[4200];
  if (!th_cache_tmp || snprintf(d, sizeof d, "%s/xdg", th_cache_tmp) >= (int)sizeof d ||
      mkdir(d, 0700) != 0) {
    fprintf(stderr, "cannot make the cache test's folder\n");
    abort();
  }
  setenv("XDG_CACHE_HOME", d, 1);
  unsetenv("MEMSNAP_CACHE");
  unsetenv("MEMSNAP_CACHE_MAX");
}

void th_cache_teardown(void) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", th_cache_tmp);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", th_cache_tmp);
  free(th_cache_tmp);
  th_cache_tmp = NULL;
}

const char *th_cache_dir(void) {
  static char d[4200];
  snprintf(d, sizeof d, "%s/xdg/memsnap", th_cache_tmp);
  return d;
}

void th_rmdir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[4096];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

int th_dir_count(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

char *th_read_file(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n, fp);
    n += r;
    if (r == 0) break;
    if (n == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        buf = NULL;
      }
      buf = nb;
    }
  }
  fclose(fp);
  if (buf) *len = n;
  return buf;
}

int th_write_file(const char *path, const void *data, size_t len) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return -1;
  int bad = fwrite(data, 1, len, fp) != len;
  bad |= fclose(fp) != 0;
  return bad ? -1 : 0;
}

const char *th_fixture_dir(void) {
  const char *e = getenv("MEMSNAP_TORCH_FIXTURES");
  if (e && *e) return e;
#ifdef MS_TEST_FIXTURES_DEFAULT
  return MS_TEST_FIXTURES_DEFAULT;
#else
  return "";
#endif
}

void th_cut_and_flip(char *data, size_t len, const char *name,
                     void (*fn)(void *ctx, const char *bytes, size_t n, const char *what,
                                size_t k),
                     void *ctx) {
  char what[4200];
  size_t k = 0;
  for (size_t at = 0; at < len; at++) {
    snprintf(what, sizeof what, "%s cut at %zu", name, at);
    fn(ctx, data, at, what, k++);
  }
  for (size_t at = 0; at < len; at += 3) {
    for (unsigned bit = 0; bit < 8; bit += 7) {
      data[at] ^= (char)(1u << bit);
      snprintf(what, sizeof what, "%s byte %zu bit %u", name, at, bit);
      fn(ctx, data, len, what, k++);
      data[at] ^= (char)(1u << bit);
    }
  }
}

size_t th_fixture_pickles(char paths[][4096], size_t cap) {
  DIR *d = opendir(th_fixture_dir());
  size_t n = 0;
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
      size_t l = strlen(e->d_name);
      if (l > 7 && strcmp(e->d_name + l - 7, ".pickle") == 0)
        snprintf(paths[n++], 4096, "%s/%s", th_fixture_dir(), e->d_name);
    }
    closedir(d);
  }
  if (n == 0) {
    printf("SKIP: no PyTorch fixtures in %s (set MEMSNAP_TORCH_FIXTURES)\n", th_fixture_dir());
    fflush(stdout);
  }
  return n;
}

/* ---- running the program -------------------------------------------------------------------- */

char *th_read_text(const char *path, size_t *len) {
  size_t n = 0;
  char *p = th_read_file(path, &n);
  char *z = p ? realloc(p, n + 1) : NULL;
  if (!z) {
    free(p);
    return NULL;
  }
  z[n] = 0;
  if (len) *len = n;
  return z;
}

th_run_t th_run(const char *dir, const char *in_path, const char *const *env,
                const char *const *args) {
  th_run_t r = {-1, NULL, 0, NULL};
  char outp[4200], errp[4200];
  snprintf(outp, sizeof outp, "%s/.stdout", dir);
  snprintf(errp, sizeof errp, "%s/.stderr", dir);
  const char *argv[64];
  int n = 0;
  const char *b = getenv("MEMSNAP_BIN");
#ifdef MS_TEST_BINARY_DIR
  argv[n++] = b && *b ? b : MS_TEST_BINARY_DIR "/bin/memsnap";
#else
  argv[n++] = b && *b ? b : "memsnap";
#endif
  for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    int in = open(in_path ? in_path : "/dev/null", O_RDONLY);
    int out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0 || chdir(dir) != 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    for (size_t i = 0; env && env[i]; i++) putenv((char *)env[i]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = th_read_text(outp, &r.out_len);
  r.err = th_read_text(errp, NULL);
  unlink(outp);
  unlink(errp);
  return r;
}

void th_run_free(th_run_t *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

char th_workdir[256];

void th_workdir_setup(void) {
  char *d = th_tmpdir();
  snprintf(th_workdir, sizeof th_workdir, "%s", d ? d : "/nonexistent");
  free(d);
}

void th_workdir_teardown(void) {
  th_rmdir(th_workdir);
}

/* ---- bytes and hand-made pickles ---------------------------------------------------------- */

int th_pickle_read_mem(const void *data, size_t len, unsigned flags, ms_snapshot_t **out,
                       ms_errbuf_t *eb) {
  ms_membuf_t mb;
  ms_source_t src;
  ms_source_init_mem(&src, &mb, data, len);
  memset(eb, 0, sizeof *eb);
  return ms_pickle_read_ex(&src, flags, out, eb);
}

bool th_have_python(void) {
  return system("python3 -c 'import pickle, json' >/dev/null 2>&1") == 0;
}

void th_bytes_put(th_bytes_t *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->n + n) nc *= 2;
    char *q = realloc(b->p, nc);
    if (!q) abort(); /* a test without memory cannot go on */
    b->p = q;
    b->cap = nc;
  }
  if (n) memcpy(b->p + b->n, p, n);
  b->n += n;
}

void th_bytes_put_le(th_bytes_t *b, uint64_t x, int n) {
  for (int i = 0; i < n; i++) {
    unsigned char c = (unsigned char)(x >> (8 * i));
    th_bytes_put(b, &c, 1);
  }
}

int th_bytes_sink_write(void *ctx, const char *buf, size_t len) {
  th_bytes_put(ctx, buf, len);
  return MS_OK;
}

void th_bytes_free(th_bytes_t *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

void th_pickle_op(th_bytes_t *b, int op) {
  char c = (char)op;
  th_bytes_put(b, &c, 1);
}

void th_pickle_str(th_bytes_t *b, const char *s) {
  size_t n = strlen(s);
  th_pickle_op(b, 0x8c); /* SHORT_BINUNICODE */
  th_pickle_op(b, (int)n);
  th_bytes_put(b, s, n);
}

void th_pickle_int(th_bytes_t *b, int64_t x) {
  if (x >= 0 && x < 256) {
    th_pickle_op(b, 'K'); /* BININT1 */
    th_pickle_op(b, (int)x);
  } else {
    th_pickle_op(b, 0x8a); /* LONG1 of 8 bytes */
    th_pickle_op(b, 8);
    th_bytes_put_le(b, (uint64_t)x, 8);
  }
}

int th_write_snapshot(const ms_snapshot_t *s, const char *dir, const char *name, char *why,
                      size_t cap) {
  char path[4200];
  if (dir) snprintf(path, sizeof path, "%s/%s", dir, name);
  else snprintf(path, sizeof path, "%s", name);
  size_t n = strlen(name);
  bool pickle = n >= 7 && strcmp(name + n - 7, ".pickle") == 0;
  ms_errbuf_t eb = {{0}};
  int err = pickle ? ms_pickle_write_file(s, path, &eb) : ms_snapshot_write_file(s, path, NULL, &eb);
  if (err != MS_OK) {
    snprintf(why, cap, "%s: %s", path, eb.msg[0] ? eb.msg : ms_strerror(err));
    return -1;
  }
  return 0;
}

int th_write_synth(const char *path, const th_synth_opts_t *opts, char *why, size_t cap) {
  ms_snapshot_t *s = th_synth(opts);
  if (!s) {
    snprintf(why, cap, "th_synth failed");
    return -1;
  }
  int rc = th_write_snapshot(s, NULL, path, why, cap);
  ms_snapshot_free(s);
  return rc;
}

/* ---- recordings on the simulated device ---------------------------------------------------- */

int th_rec_open(th_rec_t *r, size_t capacity, int context, size_t max_entries) {
  memset(r, 0, sizeof *r);
  ms_sim_config_t sc = {.capacity = capacity};
  int rc = ms_backend_sim_create(&sc, &r->be);
  if (rc != MS_OK) return rc;
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  ms_allocator_config_t ac = {.backend = r->be, .alloc = &c};
  ms_errbuf_t eb;
  rc = ms_allocator_create(&ac, &r->al, &eb);
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.context = (ms_history_context)context;
  if (max_entries) hc.max_entries = max_entries;
  if (rc == MS_OK) rc = ms_allocator_record_history(r->al, &hc, &eb);
  if (rc != MS_OK) {
    ms_allocator_destroy(r->al);
    ms_backend_destroy(r->be);
    memset(r, 0, sizeof *r);
  }
  return rc;
}

ms_snapshot_t *th_rec_close(th_rec_t *r) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  if (ms_allocator_snapshot(&r->al, 1, &s, &eb) != MS_OK) s = NULL;
  ms_allocator_destroy(r->al);
  ms_backend_destroy(r->be);
  memset(r, 0, sizeof *r);
  return s;
}

/* ---- two classifiers' answers ---------------------------------------------------------------- */

static bool th_rows_same(const ms_attr_t *a, const ms_attr_t *b, size_t dev, size_t step, char *why,
                         size_t cap) {
  for (int by = MS_ATTR_BY_CATEGORY; by <= MS_ATTR_BY_STACK; by++) {
    ms_attr_rows_t x = {0}, y = {0};
    bool same = ms_attr_aggregate(a, dev, step, NULL, (ms_attr_by)by, &x) == MS_OK &&
                ms_attr_aggregate(b, dev, step, NULL, (ms_attr_by)by, &y) == MS_OK;
    if (!same) snprintf(why, cap, "device %zu step %zu by %d: no rows", dev, step, by);
    if (same && (x.nrows != y.nrows || x.total_bytes != y.total_bytes)) {
      snprintf(why, cap,
               "device %zu step %zu by %d: %zu rows of %" PRIu64 " bytes, %zu of %" PRIu64, dev,
               step, by, x.nrows, x.total_bytes, y.nrows, y.total_bytes);
      same = false;
    }
    for (size_t r = 0; same && r < x.nrows; r++) {
      const ms_attr_row_t *p = &x.rows[r], *q = &y.rows[r];
      if (strcmp(p->key, q->key) != 0 || p->bytes != q->bytes || p->blocks != q->blocks ||
          p->category != q->category) {
        snprintf(why, cap, "device %zu step %zu by %d row %zu: '%s' %" PRIu64 " / '%s' %" PRIu64,
                 dev, step, by, r, p->key, p->bytes, q->key, q->bytes);
        same = false;
      }
    }
    ms_attr_rows_free(&x);
    ms_attr_rows_free(&y);
    if (!same) return false;
  }
  return true;
}

bool th_attr_same(const ms_timeline_t *ta, const ms_attr_t *a, const ms_timeline_t *tb,
                  const ms_attr_t *b, char *why, size_t cap) {
  size_t nd = ms_timeline_ndevices(ta);
  if (nd != ms_timeline_ndevices(tb)) {
    snprintf(why, cap, "%zu devices / %zu", nd, ms_timeline_ndevices(tb));
    return false;
  }
  for (size_t d = 0; d < nd; d++) {
    size_t n = ms_timeline_nentries(ta, d);
    if (n != ms_timeline_nentries(tb, d)) {
      snprintf(why, cap, "device %zu: %zu entries / %zu", d, n, ms_timeline_nentries(tb, d));
      return false;
    }
    for (size_t i = 0; i < n; i++) {
      if (ms_timeline_entry(ta, d, i)->action != MS_TRACE_ALLOC) continue;
      ms_category x = ms_attr_entry_category(a, d, i), y = ms_attr_entry_category(b, d, i);
      if (x != y) {
        snprintf(why, cap, "device %zu entry %zu: %s / %s", d, i, ms_category_name(x),
                 ms_category_name(y));
        return false;
      }
    }
    uint64_t *sa = NULL, *sb = NULL;
    bool same = ms_attr_category_series(a, d, &sa) == MS_OK &&
                ms_attr_category_series(b, d, &sb) == MS_OK &&
                memcmp(sa, sb, (n + 1) * MS_CAT_COUNT * sizeof *sa) == 0;
    free(sa);
    free(sb);
    if (!same) {
      snprintf(why, cap, "device %zu: the category series differ", d);
      return false;
    }
    ms_tl_peak_t p = {0};
    if (n && ms_timeline_peak(ta, d, MS_TL_ALLOCATED, 0, n, &p) != MS_OK) {
      snprintf(why, cap, "device %zu: no peak", d);
      return false;
    }
    if (!th_rows_same(a, b, d, p.step, why, cap) || !th_rows_same(a, b, d, n, why, cap))
      return false;
  }
  return true;
}
