/* SPDX-License-Identifier: MIT
 * memsnap: the offline HTML viewer (issue #13). One self-contained page (no network: the script
 * and the style are memsnap's own, embedded at build time) that shows a snapshot's memory over
 * time as PyTorch's web viewer (MemoryViz.js) does: "Active Memory Timeline", "Active Cached
 * Segment Timeline", "Allocator State History", "Allocator Settings", and a flame graph of what is
 * alive at a chosen moment. docs/view.md describes the page.
 *
 * The page holds its data in two script elements: id "ms-bin", typed binary sections (the
 * timelines of every listed device as ms_tlv_compute_budget gives them, with nothing summarized
 * within the budget, each
 * device's trace as columns, the stacks) gzipped and written as base64, which the page inflates with the browser's own
 * DecompressionStream; and id "ms-data", JSON (title, device, settings, segments and blocks,
 * frames, and the table of the sections). docs/view.md describes both. Every '<', '>', '&' and
 * "'" inside the JSON is written as a \u escape, so no name in the data can end the script
 * element or open markup; the page's script shows names as text only.
 *
 * Thread-safety: none needed (reads an immutable snapshot).
 */
#ifndef MEMSNAP_VIEW_H
#define MEMSNAP_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"

MS_EXTERN_C_BEGIN

typedef struct ms_viewer_opts_s {
  size_t device;     /* the device shown first (every listed device is in the page); SIZE_MAX:
                        the viewer's default (ms_tl_viewer_devices) */
  const char *view;  /* the view shown first: "timeline", "segments", "history", "settings",
                        "flame" (NULL: "timeline") */
  const char *title; /* the file's name shown in the page (data: escaped) */
  int explain;       /* the Explain panel (memsnap/explain.h): 1 replays the remedies of every
                        device's answer, 0 gives the verdict only, -1 (default) replays on the
                        devices that had an OOM */
  uint64_t timeline_budget_bytes; /* each timeline's budget (ms_tlv_budget_t.bytes; 0: the
                                     default, MS_TLV_BUDGET_BYTES): past it the smallest
                                     allocations are drawn in the summarized band, and the page
                                     says so */
} ms_viewer_opts_t;

/* Fills the defaults. */
MS_API void ms_viewer_opts_init(ms_viewer_opts_t *o);

/* A tag of everything but the snapshot that the page depends on: the options, this program's
 * version and the page's script and style. Two writes of one snapshot with options of one tag give the same bytes (so a page can be
 * cached under the snapshot's key and this tag: memsnap/cache.h's blobs). */
MS_API uint64_t ms_viewer_page_tag(const ms_viewer_opts_t *o);

/* Writes the page for snap. @return MS_OK; MS_EINVAL when the device is not one the viewer lists
 * (eb says so; a snapshot with no device listed is MS_EINVAL too); MS_ENOMEM; the sink's error. */
MS_API MS_NODISCARD int ms_viewer_write_html(const ms_snapshot_t *snap,
                                             const ms_viewer_opts_t *opts, ms_sink_t *sink,
                                             ms_errbuf_t *eb);

/* One file of a page of several (ms_viewer_write_html_files). */
typedef struct ms_viewer_file_s {
  const ms_snapshot_t *snap;
  const char *title; /* its name in the page's file selector (data: escaped) */
} ms_viewer_file_t;

/* Writes one page holding the nfiles snapshots (several ranks, several runs), with a file
 * selector and a view of two of them side by side (docs/view.md, "Several files"); the first
 * file is shown first. opts->title is the page's title (NULL: the first file's); opts->device
 * is the device shown first of every file that lists it (the first file must). @return as
 * ms_viewer_write_html (eb names the file); MS_EINVAL for no file. */
MS_API MS_NODISCARD int ms_viewer_write_html_files(const ms_viewer_file_t *files, size_t nfiles,
                                                   const ms_viewer_opts_t *opts,
                                                   ms_sink_t *sink, ms_errbuf_t *eb);

MS_EXTERN_C_END

#endif /* MEMSNAP_VIEW_H */
