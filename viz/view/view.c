/* SPDX-License-Identifier: MIT
 * memsnap viewer: the HTML page (memsnap/viewer.h). The page is the style, a skeleton, three
 * JSON data elements and the script; view.js draws everything from the data.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/timeline.h"
#include "memsnap/viewer.h"
#include "writer.h"

/* The page's script and style (view.js, view.css), embedded at build time (assets.cmake). */
extern const char ms__view_js[];
extern const size_t ms__view_js_len;
extern const char ms__view_css[];
extern const size_t ms__view_css_len;

void ms_viewer_opts_init(ms_viewer_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->device = SIZE_MAX;
}

static int view_no_device(ms_errbuf_t *eb, size_t dev) {
  if (!eb) return MS_EINVAL;
  if (dev == SIZE_MAX)
    snprintf(eb->msg, sizeof eb->msg, "no device has a trace or segments: nothing to show");
  else
    snprintf(eb->msg, sizeof eb->msg, "device %zu has no trace and no segments", dev);
  return MS_EINVAL;
}

static void view_settings(vw_t *w, const ms_snapshot_t *s, size_t first, size_t count) {
  vw_raw(w, "{", 1);
  for (size_t i = 0; i < count && first + i < s->nsettings; i++) {
    const ms_snap_kv_t *kv = &s->settings[first + i];
    if (i) vw_raw(w, ",", 1);
    vw_str(w, kv->key);
    vw_raw(w, ":", 1);
    switch (kv->kind) {
    case MS_SNAP_VAL_BOOL: vw_puts(w, kv->b ? "true" : "false"); break;
    case MS_SNAP_VAL_INT: vw_i64(w, kv->i); break;
    case MS_SNAP_VAL_FLOAT: {
      char b[40];
      snprintf(b, sizeof b, "%.17g", kv->f);
      /* JSON has no inf/nan: write those as strings */
      if (strspn(b, "0123456789+-.e") != strlen(b)) vw_str(w, b);
      else vw_puts(w, b);
      break;
    }
    case MS_SNAP_VAL_STR: vw_str(w, kv->s); break;
    case MS_SNAP_VAL_MAP: view_settings(w, s, kv->first, kv->count); break;
    default: vw_puts(w, "null");
    }
  }
  vw_raw(w, "}", 1);
}

/* The trace of device dev as columns. */
static void view_trace(vw_t *w, const ms_snapshot_t *s, size_t dev) {
  const ms_snap_device_t *d = dev < s->ndevices ? &s->devices[dev] : NULL;
  size_t n = d ? d->ntrace : 0;
  const ms_snap_trace_t *t = d ? s->trace + d->first_trace : NULL;
  static const char *const cols[] = {"action", "addr", "size", "stream", "time", "stack", "pool"};
  vw_puts(w, "{");
  for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
    vw_puts(w, c ? "],\n\"" : "\"");
    vw_puts(w, cols[c]);
    vw_puts(w, "\":[");
    for (size_t i = 0; i < n; i++) {
      const ms_snap_trace_t *e = &t[i];
      if (i) vw_raw(w, ",", 1);
      switch (c) {
      case 0: vw_i64(w, (int64_t)e->action); break;
      case 1: vw_hexstr(w, e->addr); break;
      case 2: vw_u64(w, e->size); break;
      case 3: vw_u64(w, e->stream); break;
      case 4: vw_i64(w, e->present & MS_TRACE_HAS_TIME ? e->time_us : -1); break;
      case 5: vw_i64(w, e->stack == MS_SNAP_NO_STACK ? -1 : (int64_t)e->stack); break;
      default:
        if (e->present & MS_TRACE_HAS_POOL_ID) {
          vw_raw(w, "[", 1);
          vw_i64(w, e->pool_id[0]);
          vw_raw(w, ",", 1);
          vw_i64(w, e->pool_id[1]);
          vw_raw(w, "]", 1);
        } else {
          vw_puts(w, "null");
        }
      }
    }
  }
  vw_puts(w, "]}");
}

static void view_segments(vw_t *w, const ms_snapshot_t *s, size_t dev) {
  vw_puts(w, "[");
  bool first = true;
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    if (g->device != (int64_t)dev) continue;
    vw_puts(w, first ? "\n{\"addr\":" : ",\n{\"addr\":");
    first = false;
    vw_hexstr(w, g->address);
    vw_puts(w, ",\"size\":");
    vw_u64(w, g->total_size);
    vw_puts(w, ",\"stream\":");
    vw_u64(w, g->stream);
    vw_puts(w, ",\"pool\":[");
    vw_i64(w, g->pool_id[0]);
    vw_raw(w, ",", 1);
    vw_i64(w, g->pool_id[1]);
    vw_puts(w, g->is_expandable ? "],\"expandable\":true" : "],\"expandable\":false");
    vw_puts(w, ",\"stack\":");
    vw_i64(w, g->stack == MS_SNAP_NO_STACK ? -1 : (int64_t)g->stack);
    vw_puts(w, ",\"index\":");
    vw_u64(w, i);
    vw_puts(w, ",\"first_block\":");
    vw_u64(w, g->first_block);
    /* blocks: [size, requested, state (0 inactive, 1 allocated, 2 pending free), stack] */
    vw_puts(w, ",\"blocks\":[");
    for (uint32_t b = 0; b < g->nblocks; b++) {
      const ms_snap_block_t *k = &s->blocks[g->first_block + b];
      vw_puts(w, b ? ",[" : "[");
      vw_u64(w, k->size);
      vw_raw(w, ",", 1);
      vw_u64(w, k->requested_size);
      vw_raw(w, ",", 1);
      vw_i64(w, k->state == MS_BLOCK_ACTIVE_ALLOCATED      ? 1
                : k->state == MS_BLOCK_ACTIVE_PENDING_FREE ? 2
                                                           : 0);
      vw_raw(w, ",", 1);
      vw_i64(w, k->stack == MS_SNAP_NO_STACK ? -1 : (int64_t)k->stack);
      vw_raw(w, "]", 1);
    }
    vw_puts(w, "]}");
  }
  vw_puts(w, "]");
}

/* Frames as "file:line:name" (as the viewer formats them) and stacks as frame indices. */
static void view_frames(vw_t *w, const ms_snapshot_t *s) {
  vw_puts(w, "\"frames\":[");
  for (size_t i = 0; i < s->nframes; i++) {
    if (i) vw_puts(w, ",\n");
    const ms_snap_frame_t *f = &s->frames[i];
    vw_puts(w, "[");
    vw_str(w, f->filename);
    vw_raw(w, ",", 1);
    vw_i64(w, f->line);
    vw_raw(w, ",", 1);
    vw_str(w, f->name);
    vw_puts(w, "]");
  }
  vw_puts(w, "],\n\"stacks\":[");
  for (size_t i = 0; i < s->nstacks; i++) {
    vw_puts(w, i ? ",[" : "[");
    for (uint32_t k = 0; k < s->stacks[i].nframes; k++) {
      if (k) vw_raw(w, ",", 1);
      vw_u64(w, s->stack_frames[s->stacks[i].first + k]);
    }
    vw_puts(w, "]");
  }
  vw_puts(w, "]");
}

static void view_sources(vw_t *w, const char *key, const ms_tlv_t *v) {
  vw_puts(w, ",\n\"");
  vw_puts(w, key);
  vw_puts(w, "\":[");
  for (size_t i = 0; i < v->elements_length; i++) {
    if (i) vw_raw(w, ",", 1);
    vw_i64(w, v->element_source[i]);
  }
  vw_puts(w, "]");
}

static void view_data(vw_t *w, const ms_snapshot_t *s, const ms_viewer_opts_t *o, size_t dev,
                      const size_t *devs, size_t ndevs, const ms_tlv_t *tl,
                      const ms_tlv_t *seg) {
  vw_puts(w, "{\"format\":1,\"title\":");
  vw_str(w, o->title ? o->title : "");
  vw_puts(w, ",\"view\":");
  vw_str(w, o->view ? o->view : "timeline");
  vw_puts(w, ",\"device\":");
  vw_u64(w, dev);
  vw_puts(w, ",\"devices\":[");
  for (size_t i = 0; i < ndevs; i++) {
    if (i) vw_raw(w, ",", 1);
    vw_u64(w, devs[i]);
  }
  vw_puts(w, "],\"capacity\":");
  const ms_snap_device_t *d = dev < s->ndevices ? &s->devices[dev] : NULL;
  vw_u64(w, d && (d->present & MS_DEV_HAS_CAPACITY) ? d->capacity : 0);
  vw_puts(w, ",\"trace_dropped\":");
  vw_u64(w, d ? d->trace_dropped : 0);
  vw_puts(w, ",\"has_settings\":");
  vw_puts(w, s->present & MS_SNAP_HAS_SETTINGS ? "true" : "false");
  vw_puts(w, ",\"settings\":");
  view_settings(w, s, 0, s->nsettings_top);
  vw_puts(w, ",\n\"actions\":[");
  for (int a = 0; a < MS_TRACE_ACTION_COUNT; a++) {
    if (a) vw_raw(w, ",", 1);
    vw_str(w, a == MS_TRACE_OTHER ? "other" : ms_trace_action_name((ms_trace_action)a));
  }
  vw_puts(w, "],\n\"trace\":");
  view_trace(w, s, dev);
  vw_puts(w, ",\n\"segments\":");
  view_segments(w, s, dev);
  vw_puts(w, ",\n");
  view_frames(w, s);
  view_sources(w, "tl_sources", tl);
  view_sources(w, "seg_sources", seg);
  vw_puts(w, "}");
}

static void view_tlv(vw_t *w, const char *id, const ms_tlv_t *v) {
  vw_puts(w, "<script type=\"application/json\" id=\"");
  vw_puts(w, id);
  vw_puts(w, "\">");
  ms_sink_t js;
  vw_json_sink(w, &js);
  int rc = ms_tlv_write_json(v, &js);
  if (rc != MS_OK && w->err == MS_OK) w->err = rc;
  vw_puts(w, "</script>\n");
}

static void view_page(vw_t *w, const ms_snapshot_t *s, const ms_viewer_opts_t *o, size_t dev,
                      const size_t *devs, size_t ndevs, const ms_tlv_t *tl,
                      const ms_tlv_t *seg) {
  vw_puts(w, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
             "<meta name=\"viewport\" content=\"width=device-width\">\n"
             "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
             "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
             "connect-src 'none'\">\n<title>memsnap view: ");
  vw_html(w, o->title ? o->title : "");
  vw_puts(w, "</title>\n<style>\n");
  vw_raw(w, ms__view_css, ms__view_css_len);
  vw_puts(w, "</style>\n</head>\n<body>\n<div id=\"app\"><noscript>This page needs "
             "JavaScript.</noscript></div>\n");
  view_tlv(w, "ms-tl", tl);
  view_tlv(w, "ms-seg", seg);
  vw_puts(w, "<script type=\"application/json\" id=\"ms-data\">");
  view_data(w, s, o, dev, devs, ndevs, tl, seg);
  vw_puts(w, "</script>\n<script>\n");
  vw_raw(w, ms__view_js, ms__view_js_len);
  vw_puts(w, "</script>\n</body>\n</html>\n");
}

int ms_viewer_write_html(const ms_snapshot_t *snap, const ms_viewer_opts_t *opts,
                         ms_sink_t *sink, ms_errbuf_t *eb) {
  ms_viewer_opts_t def;
  if (!opts) {
    ms_viewer_opts_init(&def);
    opts = &def;
  }
  size_t ndevs = ms_tl_viewer_devices(snap, NULL, 0, NULL), dev = 0;
  if (ndevs == 0)
    return view_no_device(eb, SIZE_MAX);
  size_t *devs = malloc(ndevs * sizeof *devs);
  if (!devs) return MS_ENOMEM;
  ms_tl_viewer_devices(snap, devs, ndevs, &dev);
  int rc = MS_OK;
  if (opts->device != SIZE_MAX) {
    bool listed = false;
    for (size_t i = 0; i < ndevs; i++) listed |= devs[i] == opts->device;
    if (!listed) {
      free(devs);
      return view_no_device(eb, opts->device);
    }
    dev = opts->device;
  }
  ms_tlv_t tl, seg;
  if ((rc = ms_tlv_compute(snap, dev, false, SIZE_MAX, 0, SIZE_MAX, NULL, &tl)) != MS_OK) {
    free(devs);
    return rc;
  }
  if ((rc = ms_tlv_compute(snap, dev, true, SIZE_MAX, 0, SIZE_MAX, NULL, &seg)) != MS_OK) {
    ms_tlv_release(&tl);
    free(devs);
    return rc;
  }
  vw_t *w = malloc(sizeof *w);
  if (!w) {
    rc = MS_ENOMEM;
  } else {
    vw_init(w, sink);
    view_page(w, snap, opts, dev, devs, ndevs, &tl, &seg);
    vw_flush(w);
    rc = w->err;
    free(w);
  }
  ms_tlv_release(&seg);
  ms_tlv_release(&tl);
  free(devs);
  return rc;
}
