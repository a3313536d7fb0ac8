/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap view FILE [-o OUT.html] [--device N]` (issue #13): the offline HTML
 * viewer (memsnap/view.h), and `trace_plot` / `segment_plot`, the same page opened on the view
 * _memory_viz.py's commands of those names open.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/cache.h"
#include "memsnap/replay.h"
#include "memsnap/view.h"

static const char view_usage[] =
    "usage: memsnap view FILE... [-o OUT.html] [--device N] [--view NAME] [--budget SIZE]\n"
    "                            [--explain | --no-replay]\n"
    "       memsnap view DIR [...]\n"
    "\n"
    "Writes one self-contained HTML page (no network: open it by double-click) with the views\n"
    "of PyTorch's memory viewer: Active Memory Timeline, Allocated Memory (incl. Private\n"
    "Pools), Active Cached Segment Timeline, Allocator State History, Allocator Settings, and a\n"
    "flame graph of what is alive at a chosen moment, and Explain (why it ran out or peaked,\n"
    "as memsnap explain says). Every allocation is drawn (no 15,000 cut) up to the page's\n"
    "budget (64 MiB of points, or 384 bytes per trace entry), past which the smallest are\n"
    "summarized and the page says so. See docs/view.md.\n"
    "FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input). Several\n"
    "FILEs, or a directory DIR (its .pickle, .pkl, .msnap, .msgpack and .memsnap files, by\n"
    "name), make one page with a file selector and two files side by side (ranks, runs).\n"
    "\n"
    "options:\n"
    "  -o, --output OUT   the page to write (default: FILE's name with .view.html for its\n"
    "                     extension, in the current directory; DIR.view.html for a directory,\n"
    "                     files.view.html for several files; '-' = standard output)\n"
    "  -d, --device N     the device shown first (default: the one with the longest trace;\n"
    "                     every device with a trace or segments is in the page)\n"
    "  --view NAME        the view opened first: timeline, pools, segments, history,\n"
    "                     settings, flame, explain, memory (memory over time), diff (two\n"
    "                     moments compared), files (two files side by side)\n"
    "  --budget SIZE      the most each timeline's points may take (64M, 2G, ...; default\n"
    "                     64 MiB or 384 bytes per trace entry, whichever is more)\n"
    "  --explain          replay the remedies of the Explain panel for every device (default:\n"
    "                     for the devices that had an OOM)\n"
    "  --no-replay        replay none (the panel gives the verdict and the state only)\n"
    "  -h, --help         show this help\n";

static const char trace_plot_usage[] =
    "usage: memsnap trace_plot FILE [-o OUT.html] [-s] [-f] [-d N]\n"
    "\n"
    "_memory_viz.py's trace_plot: the page of `memsnap view` opened on the Active Memory\n"
    "Timeline (-s: the Active Cached Segment Timeline).\n"
    "\n"
    "options:\n"
    "  -o, --output OUT     the page to write (default: output.html)\n"
    "  -s, --segments       open the segment timeline\n"
    "  -f, --filter-freed   leave out allocations freed within the trace (and their frees):\n"
    "                       only what is still alive at the end is drawn\n"
    "  -d, --device N       the device shown first (default: the one with the longest trace)\n"
    "  -h, --help           show this help\n";

static const char segment_plot_usage[] =
    "usage: memsnap segment_plot FILE [-o OUT.html] [-d N]\n"
    "\n"
    "_memory_viz.py's segment_plot: the page of `memsnap view` opened on the Allocator State\n"
    "History.\n"
    "\n"
    "options:\n"
    "  -o, --output OUT     the page to write (default: output.html)\n"
    "  -d, --device N       the device shown first (default: the one with the longest trace)\n"
    "  -h, --help           show this help\n";

/* ---- --filter_freed -------------------------------------------------------------------------- */

/* An open-addressing set of addresses with the entry index kept for each. */
typedef struct view_map_s {
  uint64_t *keys;
  int64_t *vals; /* -1 = empty slot */
  size_t cap;
} view_map_t;

static size_t view_slot(const view_map_t *m, uint64_t k) {
  size_t i = (size_t)((k >> 4) * 0x9e3779b97f4a7c15ull) & (m->cap - 1);
  while (m->vals[i] != -1 && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
  return i;
}

/* Slot of k after deleting: backward-shift deletion keeps probe chains whole. */
static void view_del(view_map_t *m, size_t i) {
  size_t j = i;
  m->vals[i] = -1;
  for (;;) {
    j = (j + 1) & (m->cap - 1);
    if (m->vals[j] == -1) return;
    size_t h = (size_t)((m->keys[j] >> 4) * 0x9e3779b97f4a7c15ull) & (m->cap - 1);
    bool between = i <= j ? (i < h && h <= j) : (i < h || h <= j);
    if (between) continue;
    m->keys[i] = m->keys[j];
    m->vals[i] = m->vals[j];
    m->vals[j] = -1;
    i = j;
  }
}

/* _memory_viz.py's _filter_freed on device d's entries: an alloc whose address later gets a
 * free_requested goes, with that free_requested, and the free_completed that follows it. */
static size_t view_filter_device(const ms_snap_trace_t *in, size_t n, ms_snap_trace_t *out,
                                 view_map_t *alloc, view_map_t *freed, bool *keep) {
  for (size_t i = 0; i < n; i++) keep[i] = true;
  for (size_t i = 0; i < n; i++) {
    const ms_snap_trace_t *e = &in[i];
    if (e->action == MS_TRACE_ALLOC) {
      size_t s = view_slot(alloc, e->addr);
      alloc->keys[s] = e->addr;
      alloc->vals[s] = (int64_t)i;
    } else if (e->action == MS_TRACE_FREE_REQUESTED) {
      size_t s = view_slot(alloc, e->addr);
      if (alloc->vals[s] != -1) {
        keep[alloc->vals[s]] = false;
        keep[i] = false;
        view_del(alloc, s);
        size_t f = view_slot(freed, e->addr);
        freed->keys[f] = e->addr;
        freed->vals[f] = (int64_t)i;
      }
    } else if (e->action == MS_TRACE_FREE_COMPLETED) {
      size_t f = view_slot(freed, e->addr);
      if (freed->vals[f] != -1) {
        keep[i] = false;
        view_del(freed, f);
      }
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (keep[i]) out[k++] = in[i];
  return k;
}

/* A shallow copy of snap whose traces are filtered; *trace and *devices are the caller's to free
 * (the copy borrows everything else and must not be passed to ms_snapshot_free). */
static int view_filter_freed(const ms_snapshot_t *snap, ms_snapshot_t *copy,
                             ms_snap_trace_t **trace, ms_snap_device_t **devices) {
  *copy = *snap;
  size_t cap = 16;
  while (cap < 2 * snap->ntrace + 2) cap *= 2;
  ms_snap_trace_t *t = malloc((snap->ntrace + 1) * sizeof *t);
  ms_snap_device_t *d = malloc((snap->ndevices + 1) * sizeof *d);
  bool *keep = malloc(snap->ntrace + 1);
  view_map_t a = {malloc(cap * sizeof(uint64_t)), malloc(cap * sizeof(int64_t)), cap};
  view_map_t f = {malloc(cap * sizeof(uint64_t)), malloc(cap * sizeof(int64_t)), cap};
  int rc = MS_OK;
  if (!t || !d || !keep || !a.keys || !a.vals || !f.keys || !f.vals) {
    rc = MS_ENOMEM;
  } else {
    size_t k = 0;
    for (size_t dev = 0; dev < snap->ndevices; dev++) {
      memset(a.vals, 0xff, cap * sizeof(int64_t));
      memset(f.vals, 0xff, cap * sizeof(int64_t));
      d[dev] = snap->devices[dev];
      d[dev].first_trace = (uint32_t)k;
      const ms_snap_device_t *sd = &snap->devices[dev];
      /* not NULL + 0 */
      const ms_snap_trace_t *in = sd->ntrace ? snap->trace + sd->first_trace : NULL;
      d[dev].ntrace = (uint32_t)view_filter_device(in, sd->ntrace, t + k, &a, &f, keep);
      k += d[dev].ntrace;
    }
    copy->trace = t;
    copy->ntrace = k;
    copy->devices = d;
  }
  free(keep);
  free(a.keys);
  free(a.vals);
  free(f.keys);
  free(f.vals);
  if (rc != MS_OK) {
    free(t);
    free(d);
    t = NULL;
    d = NULL;
  }
  *trace = t;
  *devices = d;
  return rc;
}

/* ---- the commands ---------------------------------------------------------------------------- */

/* `view`'s default output: the input's name without its last extension, then ".view.html", in
 * the current directory (snap.pickle -> snap.view.html); standard input: output.html. */
static const char *view_default_name(const char *path, char *buf, size_t cap) {
  if (strcmp(path, "-") == 0) return "output.html";
  const char *base = cli_base_name(path);
  const char *dot = strrchr(base, '.');
  size_t stem = dot && dot != base ? (size_t)(dot - base) : strlen(base);
  snprintf(buf, cap, "%.*s.view.html", (int)stem, base);
  return buf;
}

/* ---- the page through the cache ------------------------------------------------------------ */

/* A sink that hands everything on to out and keeps a copy (up to max bytes) for the cache. */
typedef struct view_tee_s {
  ms_sink_t *out;
  char *buf;
  size_t len, cap, max;
  bool over; /* past max, or out of memory: nothing is kept */
} view_tee_t;

static int view_tee_write(void *ctx, const char *p, size_t n) {
  view_tee_t *t = ctx;
  if (!t->over && (n > t->max || t->len > t->max - n)) t->over = true;
  if (!t->over && t->len + n > t->cap) {
    size_t cap = t->cap ? t->cap : (size_t)1 << 20;
    while (cap < t->len + n) cap = cap > SIZE_MAX / 2 ? t->len + n : cap * 2;
    char *b = realloc(t->buf, cap);
    if (!b) t->over = true;
    else {
      t->buf = b;
      t->cap = cap;
    }
  }
  if (!t->over) {
    memcpy(t->buf + t->len, p, n);
    t->len += n;
  } else if (t->buf) {
    free(t->buf);
    t->buf = NULL;
  }
  return t->out->write(t->out->ctx, p, n);
}

/* The key a page of path is filed under (the content's, load flags 0, as cli_load files the
 * snapshot) and its tag; false when it is not cacheable. */
static bool view_page_key(const char *path, const ms_viewer_opts_t *vo, bool filter_freed,
                          ms_cache_key_t *key, uint64_t *tag) {
  struct stat st;
  if (!cli_cache_enabled() || strcmp(path, "-") == 0 || stat(path, &st) != 0 ||
      !S_ISREG(st.st_mode) || ms_cache_hash_file(path, &key->hash, &key->size) != MS_OK)
    return false;
  key->flags = 0;
  *tag = ms_viewer_page_tag(vo) ^ (filter_freed ? 0x66696c7465726564ULL : 0);
  return true;
}

/* Writes the page of use to o, keeping a copy in tee. The page builds its time index in memory:
 * storing it (261 MB for the 937 MB synthetic pickle, an index of view's own snapshot, which no
 * other command loads) would serve only the first `view` with other options, the page itself
 * being stored. */
static int view_write(const char *name, const char *out_path, const ms_snapshot_t *use,
                      const ms_viewer_opts_t *vo, cli_out_t *o, view_tee_t *tee) {
  ms_sink_t sink = {view_tee_write, tee};
  tee->out = &o->sink;
  ms_errbuf_t eb = {{0}};
  cli_progress_count(cli_out_bytes_written, 0);
  cli_progress_start("writing '%s'", out_path);
  int err = ms_viewer_write_html(use, vo, &sink, &eb);
  cli_progress_stop();
  if (err != MS_OK && o->werr) /* the output's own error: "no space left on device" */
    return cli_out_fail(o, err, NULL);
  if (err != MS_OK) {
    cli_out_abort(o);
    if (eb.msg[0]) cli_error("'%s': %s", name, eb.msg);
    else cli_error("cannot write '%s': %s", out_path, ms_strerror(err));
    return CLI_FAILURE;
  }
  return cli_out_commit(o);
}

/* out_path NULL: the default, def (NULL: view_default_name). */
static int view_run(const char *cmd, const char *path, const char *out_path, const char *def,
                    const char *device_s, const char *view, bool filter_freed, uint64_t budget,
                    int explain) {
  char defbuf[4096];
  if (!out_path) {
    out_path = def ? def : view_default_name(path, defbuf, sizeof defbuf);
    cli_out_note_default(out_path);
  }
  if (strcmp(out_path, "-") == 0 && isatty(STDOUT_FILENO))
    return cli_usage_error(cmd, "refusing to write an HTML page to a terminal; redirect it "
                                "(-o - > out.html) or name a file (-o out.html)");
  ms_viewer_opts_t vo;
  ms_viewer_opts_init(&vo);
  vo.timeline_budget_bytes = budget;
  vo.explain = explain;
  if (device_s) {
    uint64_t v;
    if (!cli_parse_u64(device_s, &v) || v > 1u << 20)
      return cli_usage_error(cmd, "option '--device' needs a device number, not '%s'", device_s);
    vo.device = (size_t)v;
  }
  vo.view = view;
  const char *name = cli_display_name(path);
  const char *slash = strrchr(name, '/');
  vo.title = slash ? slash + 1 : name;
  /* a page written before for the same content and options is written again from the cache,
   * without reading the snapshot */
  ms_cache_key_t key;
  uint64_t tag = 0;
  bool cached = view_page_key(path, &vo, filter_freed, &key, &tag);
  cli_out_t o;
  int rc;
  if (cached) {
    cli_note_input(path);
    if ((rc = cli_out_open(&o, out_path)) != CLI_OK) return rc;
    int err = ms_cache_blob_get(&key, tag, NULL, &o.sink);
    if (err == MS_OK) return cli_out_commit(&o);
    if (err != MS_ENOTFOUND) return cli_out_fail(&o, err, NULL);
    cli_out_abort(&o);
  }
  /* the page is what a later view needs: view's own snapshot (every stack, 640 MB for the 937 MB
   * synthetic pickle) is read from the cache when another command stored it, not stored */
  ms_snapshot_t *snap = NULL;
  rc = cli_load_unstored(path, &snap);
  if (rc != CLI_OK) return rc;
  ms_snapshot_t filtered;
  ms_snap_trace_t *ftrace = NULL;
  ms_snap_device_t *fdevs = NULL;
  const ms_snapshot_t *use = snap;
  if (filter_freed) {
    if (view_filter_freed(snap, &filtered, &ftrace, &fdevs) != MS_OK) {
      ms_snapshot_free(snap);
      cli_error("out of memory");
      return CLI_FAILURE;
    }
    use = &filtered;
  }
  view_tee_t tee = {NULL, NULL, 0, 0, cached ? (size_t)ms_cache_max_bytes() : 0, !cached};
  if ((rc = cli_out_open(&o, out_path)) == CLI_OK) {
    rc = view_write(name, out_path, use, &vo, &o, &tee);
    if (rc == CLI_OK && !tee.over) (void)!ms_cache_blob_put(&key, tag, NULL, tee.buf, tee.len);
  }
  free(tee.buf);
  free(ftrace);
  free(fdevs);
  ms_snapshot_free(snap);
  return rc;
}

/* ---- several files ------------------------------------------------------------------------- */

#define VIEW_MAX_FILES 64

/* A snapshot file's name by its extension (a directory's files that `view DIR` takes). */
static bool view_is_snapshot_name(const char *name) {
  static const char *const ext[] = {".pickle", ".pkl", ".msnap", ".msgpack", ".memsnap"};
  if (name[0] == '.') return false;
  const char *dot = strrchr(name, '.');
  for (size_t i = 0; dot && i < sizeof ext / sizeof *ext; i++)
    if (strcmp(dot, ext[i]) == 0) return true;
  return false;
}

static int view_name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The snapshot files of directory dir, sorted by name, into paths (malloc'd; at most
 * VIEW_MAX_FILES). @return their number, or -1 after printing the error. */
static int view_list_dir(const char *dir, char **paths) {
  DIR *d = opendir(dir);
  if (!d) {
    cli_error("cannot read directory '%s': %s", dir, strerror(errno));
    return -1;
  }
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!view_is_snapshot_name(e->d_name)) continue;
    if (n == VIEW_MAX_FILES) {
      cli_error("directory '%s' has more than %d snapshot files; name the ones to show",
                dir, VIEW_MAX_FILES);
      n = -1;
      break;
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    if (!(paths[n] = malloc(len))) {
      cli_error("out of memory");
      n = -1;
      break;
    }
    snprintf(paths[n], len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", e->d_name);
    n++;
  }
  closedir(d);
  if (n < 0) return -1;
  if (n == 0) {
    cli_error("no snapshot file (.pickle, .pkl, .msnap, .msgpack, .memsnap) in directory '%s'", dir);
    return -1;
  }
  qsort(paths, (size_t)n, sizeof *paths, view_name_cmp);
  return n;
}

/* The page of several files (every one loaded first). */
static int view_run_files(char *const *paths, int n, const char *out_path, const char *def,
                          const ms_viewer_opts_t *vo) {
  if (!out_path) {
    out_path = def;
    cli_out_note_default(out_path);
  }
  if (strcmp(out_path, "-") == 0 && isatty(STDOUT_FILENO))
    return cli_usage_error("view", "refusing to write an HTML page to a terminal; redirect it "
                                   "(-o - > out.html) or name a file (-o out.html)");
  ms_viewer_file_t files[VIEW_MAX_FILES];
  int rc = CLI_OK, loaded = 0;
  for (int i = 0; i < n && rc == CLI_OK; i++) {
    if (strcmp(paths[i], "-") == 0) {
      rc = cli_usage_error("view", "standard input ('-') is one file alone, not one of several");
      break;
    }
    ms_snapshot_t *snap = NULL;
    if ((rc = cli_load(paths[i], &snap)) != CLI_OK) break;
    files[loaded].snap = snap;
    files[loaded++].title = cli_base_name(paths[i]);
  }
  cli_out_t o;
  if (rc == CLI_OK && (rc = cli_out_open(&o, out_path)) == CLI_OK) {
    ms_errbuf_t eb = {{0}};
    cli_progress_count(cli_out_bytes_written, 0);
    cli_progress_start("writing '%s'", out_path);
    int err = ms_viewer_write_html_files(files, (size_t)n, vo, &o.sink, &eb);
    cli_progress_stop();
    if (err != MS_OK && o.werr) {
      rc = cli_out_fail(&o, err, NULL);
    } else if (err != MS_OK) {
      cli_out_abort(&o);
      if (eb.msg[0]) cli_error("%s", eb.msg);
      else cli_error("cannot write '%s': %s", out_path, ms_strerror(err));
      rc = CLI_FAILURE;
    } else {
      rc = cli_out_commit(&o);
    }
  }
  for (int i = 0; i < loaded; i++) ms_snapshot_free((ms_snapshot_t *)files[i].snap);
  return rc;
}

int cmd_view(int argc, char **argv) {
  const char *out = NULL, *device_s = NULL, *view = NULL, *budget_s = NULL;
  int explain = 0, no_replay = 0;
  const struct cli_opt opts[] = {{"output", 'o', NULL, &out},
                                 {"device", 0, NULL, &device_s},
                                 {"view", 0, NULL, &view},
                                 {"budget", 0, NULL, &budget_s},
                                 {"explain", 0, &explain, NULL},
                                 {"no-replay", 0, &no_replay, NULL},
                                 {NULL, 0, NULL, NULL}};
  char *pos[VIEW_MAX_FILES];
  int npos = 0;
  int rc = cli_parse_options("view", view_usage, opts, argc, argv, pos, VIEW_MAX_FILES, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error("view", "missing FILE");
  if (view && strcmp(view, "timeline") && strcmp(view, "pools") && strcmp(view, "segments") &&
      strcmp(view, "history") && strcmp(view, "settings") && strcmp(view, "flame") &&
      strcmp(view, "explain") && strcmp(view, "memory") && strcmp(view, "diff") &&
      strcmp(view, "files"))
    return cli_usage_error("view", "unknown view '%s' (timeline, pools, segments, history, "
                                   "settings, flame, explain, memory, diff, files)", view);
  if (explain && no_replay)
    return cli_usage_error("view", "options '--explain' and '--no-replay' exclude each other");
  size_t budget = 0; /* the default (ms_tlv_default_budget) */
  ms_errbuf_t eb = {{0}};
  if (budget_s && ms_replay_parse_capacity(budget_s, &budget, &eb) != MS_OK)
    return cli_usage_error("view", "option '--budget' needs a size such as 64M or 2G: %s", eb.msg);
  struct stat st;
  bool dir = npos == 1 && strcmp(pos[0], "-") != 0 && stat(pos[0], &st) == 0 && S_ISDIR(st.st_mode);
  if (npos == 1 && !dir)
    return view_run("view", pos[0], out, NULL, device_s, view, false, budget,
                    explain ? 1 : no_replay ? 0 : -1);
  ms_viewer_opts_t vo;
  ms_viewer_opts_init(&vo);
  vo.timeline_budget_bytes = budget;
  vo.explain = explain ? 1 : no_replay ? 0 : -1;
  vo.view = view;
  if (device_s) {
    uint64_t v;
    if (!cli_parse_u64(device_s, &v) || v > 1u << 20)
      return cli_usage_error("view", "option '--device' needs a device number, not '%s'", device_s);
    vo.device = (size_t)v;
  }
  if (!dir) return view_run_files(pos, npos, out, "files.view.html", &vo);
  char *paths[VIEW_MAX_FILES], def[4096];
  int n = view_list_dir(pos[0], paths);
  if (n < 0) return CLI_FAILURE;
  char base[1024];
  snprintf(base, sizeof base, "%s", pos[0]);
  for (size_t l = strlen(base); l > 1 && base[l - 1] == '/'; l--) base[l - 1] = 0;
  snprintf(def, sizeof def, "%s.view.html", cli_base_name(base));
  rc = view_run_files(paths, n, out, def, &vo);
  for (int i = 0; i < n; i++) free(paths[i]);
  return rc;
}

int cmd_trace_plot(int argc, char **argv) {
  const char *out = NULL, *device_s = NULL;
  int segments = 0, filter = 0;
  const struct cli_opt opts[] = {{"output", 'o', NULL, &out},
                                 {"segments", 's', &segments, NULL},
                                 {"filter-freed", 'f', &filter, NULL},
                                 {"device", 'd', NULL, &device_s},
                                 {NULL, 0, NULL, NULL}};
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options("trace_plot", trace_plot_usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error("trace_plot", "missing FILE");
  return view_run("trace_plot", pos[0], out, "output.html", device_s,
                  segments ? "segments" : "timeline", filter != 0, 0, -1);
}

int cmd_segment_plot(int argc, char **argv) {
  const char *out = NULL, *device_s = NULL;
  const struct cli_opt opts[] = {{"output", 'o', NULL, &out},
                                 {"device", 'd', NULL, &device_s},
                                 {NULL, 0, NULL, NULL}};
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options("segment_plot", segment_plot_usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error("segment_plot", "missing FILE");
  return view_run("segment_plot", pos[0], out, "output.html", device_s, "history", false,
                  0, -1);
}
