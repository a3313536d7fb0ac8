/* SPDX-License-Identifier: MIT
 * memsnap CLI: what the commands share about categories and sources (issue #27,
 * memsnap/attribution.h): reading a --categories rules file, building the classifier with a
 * clear error.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/attribution.h"

/* Reads at most max + 1 bytes of path (so that "too big" is seen without reading it all). */
static int cli_rules_read(const char *path, size_t max, char **out, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    cli_error("cannot read the rules file '%s': %s", path, strerror(errno));
    return CLI_FAILURE;
  }
  char *buf = malloc(max + 2);
  if (!buf) {
    fclose(fp);
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  size_t n = fread(buf, 1, max + 1, fp);
  int bad = ferror(fp);
  fclose(fp);
  if (bad) {
    free(buf);
    cli_error("cannot read the rules file '%s'", path);
    return CLI_FAILURE;
  }
  buf[n] = 0;
  *out = buf;
  *len = n;
  return CLI_OK;
}

int cli_attr_open(const ms_snapshot_t *snap, const ms_timeline_t *tl, const char *rules_path,
                  ms_attr_t **out) {
  ms_attr_config_t cfg;
  ms_attr_config_init(&cfg);
  char *text = NULL;
  if (rules_path) {
    size_t len;
    /* one byte more than the library takes, so that it names the limit */
    int rc = cli_rules_read(rules_path, (1u << 20), &text, &len);
    if (rc != CLI_OK) return rc;
    cli_note_input(rules_path);
    cfg.rules = text;
    cfg.rules_len = len;
    cfg.rules_name = rules_path;
  }
  ms_errbuf_t eb = {{0}};
  int err = ms_attr_create(snap, tl, &cfg, out, &eb);
  free(text);
  if (err != MS_OK) {
    cli_error("%s", eb.msg[0] ? eb.msg : ms_strerror(err));
    return CLI_FAILURE;
  }
  return CLI_OK;
}

bool cli_attr_by_parse(const char *s, ms_attr_by *by) {
  static const char *const names[] = {"category", "source", "stack"};
  for (int i = 0; i < 3; i++)
    if (strcmp(s, names[i]) == 0) {
      *by = (ms_attr_by)i;
      return true;
    }
  return false;
}

/* ---- memory --by category: the flame graph whose first level is the category ---------------- */

typedef struct cli_catview_s {
  const ms_timeline_t *tl;
  const ms_attr_t *a;
  const ms_tl_filter_t *filter; /* NULL: every segment */
  size_t dev;                   /* SIZE_MAX: every device at its end */
  size_t step;
} cli_catview_t;

/* Emits category;frames... (kept by PyTorch's filter, outermost first) with the block's size
 * for every allocated block of device dev at step. */
static int cli_catview_dev(const cli_catview_t *cv, size_t dev, size_t step, ms_view_emit_fn *emit,
                           void *ctx) {
  const ms_snapshot_t *s = ms_timeline_snapshot(cv->tl);
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int err = ms_timeline_state_at(cv->tl, dev, step, &st);
  const char **fr = NULL;
  char *text = NULL;
  size_t k = 0;
  for (size_t g = 0; g < st.nsegments && err == MS_OK; g++) {
    const ms_tl_segment_t *seg = &st.segments[g];
    bool keep = !cv->filter || ((!cv->filter->has_stream || seg->stream == cv->filter->stream) &&
                                (!cv->filter->has_pool || (seg->pool_id[0] == cv->filter->pool_id[0] &&
                                                           seg->pool_id[1] == cv->filter->pool_id[1])));
    for (; k < st.nblocks && st.blocks[k].address < seg->address + seg->size && err == MS_OK; k++) {
      const ms_tl_block_t *b = &st.blocks[k];
      if (!keep || b->state != MS_BLOCK_ACTIVE_ALLOCATED) continue;
      uint32_t stack = b->stack < s->nstacks && !(b->alloc_entry < 0 &&
                       (b->flags & MS_TL_BLOCK_ALLOC_UNRECORDED)) ? b->stack : MS_SNAP_NO_STACK;
      if (b->alloc_entry >= 0) stack = ms_timeline_entry(cv->tl, dev, (size_t)b->alloc_entry)->stack;
      uint32_t depth = ms_snap_stack_depth(s, stack);
      const char **nf = realloc(fr, (depth + 2) * sizeof *fr);
      char *nt = realloc(text, (size_t)(depth + 1) * 1024);
      if (!nf || !nt) {
        free(nf ? (void *)nf : (void *)fr);
        free(nt ? nt : text);
        fr = NULL;
        text = NULL;
        err = MS_ENOMEM;
        break;
      }
      fr = nf;
      text = nt;
      size_t n = 0;
      fr[n++] = ms_category_name(ms_attr_block_category(cv->a, dev, b));
      for (uint32_t j = depth; j-- > 0;) {
        const ms_snap_frame_t *f = ms_snap_stack_frame(s, stack, j);
        if (!ms_view_frame_kept(f->name, f->filename)) continue;
        ms_view_frame_format(text + n * 1024, 1024, f);
        fr[n] = text + n * 1024;
        n++;
      }
      if (n == 1) fr[n++] = depth == 0 ? "<non-python>" : "";
      err = emit(ctx, fr, n, b->size);
    }
  }
  free(fr);
  free(text);
  ms_timeline_state_release(&st);
  return err;
}

static int cli_catview(void *arg, ms_view_emit_fn *emit, void *ctx, int *side) {
  (void)side;
  const cli_catview_t *cv = arg;
  if (cv->dev != SIZE_MAX) return cli_catview_dev(cv, cv->dev, cv->step, emit, ctx);
  for (size_t d = 0; d < ms_timeline_ndevices(cv->tl); d++) {
    int err = cli_catview_dev(cv, d, ms_timeline_nentries(cv->tl, d), emit, ctx);
    if (err != MS_OK) return err;
  }
  return MS_OK;
}

int cli_memory_by_category(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                           const char *rules, const char *output, cli_render_mode mode,
                           const ms_flame_options_t *fo, bool json) {
  cli_tl_args_t ta2 = *ta; /* the index counts every segment; the view applies the filter */
  memset(&ta2.filter, 0, sizeof ta2.filter);
  ms_timeline_t *tl = NULL;
  int rc = cli_tl_open(snap, name, &ta2, &tl);
  if (rc != CLI_OK) return rc;
  cli_catview_t cv = {tl, NULL, ta->filter.has_stream || ta->filter.has_pool ? &ta->filter : NULL,
                      SIZE_MAX, 0};
  if (ta->has_at || ta->has_range || ta->has_device) {
    size_t from, to;
    rc = cli_tl_device(snap, name, ta, &cv.dev);
    if (rc == CLI_OK) rc = cli_tl_steps(tl, name, ta, cv.dev, &from, &to);
    ms_tl_moment_t end = {MS_TL_MOMENT_END, 0};
    ms_errbuf_t eb = {{0}};
    if (rc == CLI_OK && ms_timeline_moment_step(tl, cv.dev, ta->has_at ? &ta->at : &end, from,
                                                to, &cv.step, &eb) != MS_OK) {
      cli_error("'%s': --at %s: %s", name, ta->has_at ? ta->at_text : "end", eb.msg);
      rc = CLI_FAILURE;
    }
  }
  ms_attr_t *a = NULL;
  if (rc == CLI_OK) rc = cli_attr_open(snap, tl, rules, &a);
  cv.a = a;
  if (rc == CLI_OK)
    rc = json ? cli_render_json(output, "memory", cli_json_head_file, (void *)name, cli_catview,
                                &cv)
              : cli_render(output, mode, fo, cli_catview, &cv);
  ms_attr_destroy(a);
  ms_timeline_destroy(tl);
  return rc;
}

/* ---- timeline --by category ------------------------------------------------------------------ */

int cli_timeline_categories(FILE *out, cli_json_t *j, const ms_timeline_t *tl,
                            const ms_attr_t *a, size_t dev, size_t from, size_t to) {
  ms_tl_peak_t pk;
  if (ms_timeline_peak(tl, dev, MS_TL_ALLOCATED, from, to, &pk) != MS_OK) return CLI_OK;
  ms_attr_peaks_t ps;
  if (ms_attr_category_peaks(a, dev, from, to, pk.step, &ps) != MS_OK) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  const uint64_t *peak = ps.peak;
  const size_t *peak_step = ps.peak_step;
  const uint64_t *mix = ps.at;
  char b1[CLI_BYTES_BUFSZ], b2[CLI_BYTES_BUFSZ];
  if (j) {
    cli_json_lit(j, ",\n  \"categories\": [");
    for (int c = 0; c < MS_CAT_COUNT; c++) {
      cli_json_lit(j, c ? ",\n    {\"category\": " : "\n    {\"category\": ");
      cli_json_str(j, ms_category_name((ms_category)c));
      cli_json_lit(j, ", \"peak_bytes\": ");
      cli_json_u64(j, peak[c]);
      cli_json_lit(j, ", \"peak_entry\": ");
      if (peak[c]) cli_json_i64(j, (int64_t)peak_step[c] - 1);
      else cli_json_lit(j, "null");
      cli_json_lit(j, ", \"at_peak_bytes\": ");
      cli_json_u64(j, mix[c]);
      cli_json_lit(j, "}");
    }
    cli_json_lit(j, "]");
  } else {
    fprintf(out, "  by category (allocated bytes): at the peak of allocated (after entry %" PRId64
                 "), and each one's own peak:\n",
            pk.entry);
    for (int c = 0; c < MS_CAT_COUNT; c++) {
      fprintf(out, "    %-16s %10s %5.1f%%   ", ms_category_name((ms_category)c),
              cli_format_bytes((int64_t)mix[c], b1),
              pk.bytes ? 100.0 * (double)mix[c] / (double)pk.bytes : 0.0);
      if (peak[c])
        fprintf(out, "peak %10s after entry %" PRId64 "\n", cli_format_bytes((int64_t)peak[c], b2),
                (int64_t)peak_step[c] - 1);
      else
        fputs("never held\n", out);
    }
  }
  return CLI_OK;
}
