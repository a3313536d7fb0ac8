/* SPDX-License-Identifier: MIT
 * memsnap CLI: helpers shared by the snapshot commands (cli.h): option parsing in argparse's
 * manner, loading a snapshot with a clear error and a progress line, output files written
 * complete-or-not-at-all, and `_memory_viz.py`'s byte formatter.
 *
 * The progress line is drawn by a helper thread that sleeps until the operation has taken more
 * than a second; it is drawn only when stderr is a terminal, and erased before anything else is
 * printed, so pipes and logs never see it.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/views.h"
#include "memsnap/viz.h"

/* ---- options ----------------------------------------------------------------------------------
 */

/* Whether the long name typed[0..len) is the option name, or (prefix) begins it; `_` and `-`
 * are one character (`--filter_freed` is `--filter-freed`). */
static bool cli_opt_name_match(const char *name, const char *typed, size_t len, bool prefix) {
  size_t i = 0;
  for (; i < len && name[i]; i++) {
    char a = name[i] == '_' ? '-' : name[i], b = typed[i] == '_' ? '-' : typed[i];
    if (a != b) return false;
  }
  return i == len && (prefix || name[i] == 0);
}

/* The option a long name typed[0..len) stands for: its exact name, else the one option it is a
 * prefix of. NULL with *help set when it is --help (or a prefix of it alone); NULL with *nmatch
 * 0 when unknown, > 1 when ambiguous. */
static const struct cli_opt *cli_opt_find_long(const struct cli_opt *opts, const char *typed,
                                               size_t len, bool *help, int *nmatch) {
  *help = false;
  *nmatch = 0;
  if (len == 0) return NULL;
  for (const struct cli_opt *o = opts; o && o->name; o++)
    if (cli_opt_name_match(o->name, typed, len, false)) {
      *nmatch = 1;
      return o;
    }
  if (cli_opt_name_match("help", typed, len, false)) {
    *help = true;
    return NULL;
  }
  const struct cli_opt *found = NULL;
  for (const struct cli_opt *o = opts; o && o->name; o++)
    if (cli_opt_name_match(o->name, typed, len, true)) {
      /* two names of one option (an alias) are one candidate */
      if (found && found->flag == o->flag && found->value == o->value) continue;
      found = o;
      ++*nmatch;
    }
  if (cli_opt_name_match("help", typed, len, true)) {
    if (*nmatch == 0) *help = true;
    ++*nmatch;
  }
  return *nmatch == 1 ? found : NULL;
}

static const struct cli_opt *cli_opt_find_short(const struct cli_opt *opts, char c) {
  for (const struct cli_opt *o = opts; o && o->name; o++)
    if (o->short_name && o->short_name == c) return o;
  if (c == 'd') /* -d is --device in every command that has one */
    for (const struct cli_opt *o = opts; o && o->name; o++)
      if (strcmp(o->name, "device") == 0) return o;
  return NULL;
}

static void cli_opt_set_flag(const struct cli_opt *o) {
  if (o->flag) *o->flag = 1;
}

/* The options every command has (where its table has none of the name): --quiet, --force. */
static bool cli_opt_common(const char *typed, size_t len) {
  if (cli_opt_name_match("quiet", typed, len, false)) {
    cli_quiet = true;
    return true;
  }
  if (cli_opt_name_match("force", typed, len, false)) {
    cli_force = true;
    return true;
  }
  return false;
}

/* "option '--s' is ambiguous; possibilities: '--segments' '--stream'" (getopt_long's words). */
static int cli_opt_ambiguous(const char *cmd, const struct cli_opt *opts, const char *typed,
                             size_t len) {
  char list[1024];
  size_t k = 0;
  list[0] = 0;
  const struct cli_opt *prev = NULL;
  for (const struct cli_opt *o = opts; o && o->name; o++) {
    if (!cli_opt_name_match(o->name, typed, len, true)) continue;
    if (prev && prev->flag == o->flag && prev->value == o->value) continue;
    prev = o;
    int w = snprintf(list + k, sizeof list - k, " '--%s'", o->name);
    if (w > 0 && (size_t)w < sizeof list - k) k += (size_t)w;
  }
  if (cli_opt_name_match("help", typed, len, true) && k + 10 < sizeof list)
    strcpy(list + k, " '--help'");
  return cli_usage_error(cmd, "option '--%.*s' is ambiguous; possibilities:%s", (int)len, typed,
                         list);
}

/* "unknown option '--outptu'; did you mean '--output'?" */
static int cli_opt_unknown(const char *cmd, const struct cli_opt *opts, const char *typed,
                           size_t len) {
  const char *names[128];
  size_t n = 0;
  for (const struct cli_opt *o = opts; o && o->name && n < 127; o++) names[n++] = o->name;
  names[n++] = "help";
  char norm[64];
  size_t m = len < sizeof norm ? len : sizeof norm - 1;
  for (size_t i = 0; i < m; i++) norm[i] = typed[i] == '_' ? '-' : typed[i];
  const char *s = cli_suggest(norm, m, names, n);
  if (s) return cli_usage_error(cmd, "unknown option '--%.*s'; did you mean '--%s'?", (int)len, typed, s);
  return cli_usage_error(cmd, "unknown option '--%.*s'", (int)len, typed);
}

int cli_parse_options(const char *cmd, const char *usage, const struct cli_opt *opts, int argc,
                      char **argv, char **pos, int maxpos, int *npos) {
  int n = 0;
  bool only_positional = false;
  for (int i = 1; i < argc; i++) {
    char *a = argv[i];
    if (only_positional || a[0] != '-' || strcmp(a, "-") == 0) {
      if (n >= maxpos) return cli_usage_error(cmd, "unexpected argument '%s'", a);
      pos[n++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_positional = true;
      continue;
    }
    if (strcmp(a, "-h") == 0) {
      cli_print_help(usage, stdout);
      return CLI_HELP_SHOWN;
    }
    const struct cli_opt *o;
    const char *value = NULL;
    char typed[80]; /* the option as the user wrote it, for the messages */
    if (a[1] == '-') {
      const char *name = a + 2;
      const char *eq = strchr(name, '=');
      size_t len = eq ? (size_t)(eq - name) : strlen(name);
      bool help;
      int nmatch;
      o = cli_opt_find_long(opts, name, len, &help, &nmatch);
      if (help) {
        cli_print_help(usage, stdout);
        return CLI_HELP_SHOWN;
      }
      if (nmatch > 1) return cli_opt_ambiguous(cmd, opts, name, len);
      if (!o && !eq && cli_opt_common(name, len)) continue;
      if (!o) return cli_opt_unknown(cmd, opts, name, len);
      snprintf(typed, sizeof typed, "--%.*s", (int)len, name);
      if (eq) {
        if (!o->value) return cli_usage_error(cmd, "option '%s' takes no value", typed);
        value = eq + 1;
      }
    } else {
      o = cli_opt_find_short(opts, a[1]);
      if (!o && !a[2] && (a[1] == 'q' || a[1] == 'f') && cli_opt_common(a[1] == 'q' ? "quiet" : "force", 5))
        continue;
      if (!o) return cli_usage_error(cmd, "unknown option '-%c'", a[1]);
      snprintf(typed, sizeof typed, "-%c", a[1]);
      if (a[2]) {
        if (!o->value) return cli_usage_error(cmd, "option '-%c' takes no value", a[1]);
        value = a + 2;
      }
    }
    if (o->value) {
      if (!value) {
        if (i + 1 >= argc) return cli_usage_error(cmd, "option '%s' needs a value", typed);
        value = argv[++i];
      }
      *o->value = value;
    } else {
      cli_opt_set_flag(o);
    }
  }
  *npos = n;
  return CLI_OK;
}

/* ---- the progress line ---------------------------------------------------------------------- */

static struct {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool running;
  bool stop;
  bool shown;
  char what[256];
} cli_progress = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *cli_progress_main(void *arg) {
  (void)arg;
  double start = cli_now();
  pthread_mutex_lock(&cli_progress.lock);
  double wait_s = 1.0;
  /* MEMSNAP_PROGRESS_DELAY (seconds) moves the threshold: tests use it to stay independent of how
   * loaded the machine is; users may silence the line with a large value. */
  const char *d = getenv("MEMSNAP_PROGRESS_DELAY");
  if (d && *d) {
    char *end;
    double v = strtod(d, &end);
    if (*end == 0 && v >= 0 && v <= 1e6) wait_s = v;
  }
  while (!cli_progress.stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_nsec * 1e-9 + wait_s;
    ts.tv_sec += (time_t)t;
    ts.tv_nsec = (long)((t - floor(t)) * 1e9);
    int rc = pthread_cond_timedwait(&cli_progress.cond, &cli_progress.lock, &ts);
    if (cli_progress.stop) break;
    if (rc == ETIMEDOUT) {
      fprintf(stderr, "\rmemsnap: %s... %.0f s", cli_progress.what, cli_now() - start);
      fflush(stderr);
      cli_progress.shown = true;
      wait_s = 0.5;
    }
  }
  pthread_mutex_unlock(&cli_progress.lock);
  return NULL;
}

void cli_progress_start(const char *fmt, ...) {
  if (cli_progress.running || !isatty(STDERR_FILENO)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cli_progress.what, sizeof cli_progress.what, fmt, ap);
  va_end(ap);
  cli_progress.stop = false;
  cli_progress.shown = false;
  if (pthread_create(&cli_progress.thread, NULL, cli_progress_main, NULL) == 0)
    cli_progress.running = true;
}

void cli_progress_stop(void) {
  if (!cli_progress.running) return;
  pthread_mutex_lock(&cli_progress.lock);
  cli_progress.stop = true;
  pthread_cond_signal(&cli_progress.cond);
  pthread_mutex_unlock(&cli_progress.lock);
  pthread_join(cli_progress.thread, NULL);
  cli_progress.running = false;
  if (cli_progress.shown) {
    fputs("\r\033[K", stderr); /* erase the line */
    fflush(stderr);
  }
}

/* ---- loading --------------------------------------------------------------------------------- */

const char *cli_display_name(const char *path) {
  return strcmp(path, "-") == 0 ? "<stdin>" : path;
}

int cli_load(const char *path, ms_snapshot_t **out) {
  return cli_load_ex(path, 0, out);
}

int cli_load_ex(const char *path, unsigned flags, ms_snapshot_t **out) {
  ms_errbuf_t eb = {{0}};
  ms_snapshot_t *snap = NULL;
  const char *name = cli_display_name(path);
  cli_note_input(path);
  cli_progress_start("reading '%s'", name);
  int err = ms_snapshot_load_ex(path, flags, &snap, &eb);
  cli_progress_stop();
  if (err != MS_OK) {
    const char *what = eb.msg[0] ? eb.msg : ms_strerror(err);
    /* The loader's messages name the file ("cannot open 'x': ...", "'x': ..."); name it where
     * one does not. */
    char quoted[600];
    snprintf(quoted, sizeof quoted, "'%s'", name);
    if (strstr(what, quoted))
      cli_error("%s", what);
    else
      cli_error("'%s': %s", name, what);
    return CLI_FAILURE;
  }
  *out = snap;
  return CLI_OK;
}

/* ---- formatting -------------------------------------------------------------------------------
 */

static const char *const units[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"};

const char *cli_format_bytes(int64_t n, char buf[CLI_BYTES_BUFSZ]) {
  if (n >= 0 && n < ((int64_t)1 << 53)) {
    /* The common case without printf (`memsnap trace` formats millions): n / 1024^i is exact in
     * a double, so "%.1f" of it is 10n / 2^(10i) rounded to nearest, ties to even, as glibc's
     * printf rounds an exact value. */
    uint64_t u = (uint64_t)n;
    unsigned i = 0;
    while ((u >> (10 * i)) >= 1024) i++;
    unsigned sh = 10 * i;
    uint64_t t = 10 * u, q = t >> sh;
    if (sh) {
      uint64_t rem = t & (((uint64_t)1 << sh) - 1), half = (uint64_t)1 << (sh - 1);
      if (rem > half || (rem == half && (q & 1))) q++;
    }
    char digits[24];
    int k = 0;
    uint64_t ip = q / 10;
    do {
      digits[k++] = (char)('0' + ip % 10);
      ip /= 10;
    } while (ip);
    char *w = buf;
    while (k) *w++ = digits[--k];
    *w++ = '.';
    *w++ = (char)('0' + q % 10);
    for (const char *p = units[i]; *p; p++) *w++ = *p;
    *w++ = 'B';
    *w = 0;
    return buf;
  }
  return cli_format_bytes_double((double)n, buf);
}

const char *cli_format_ubytes(uint64_t n, char buf[CLI_BYTES_BUFSZ]) {
  return n <= (uint64_t)INT64_MAX ? cli_format_bytes((int64_t)n, buf)
                                  : cli_format_bytes_double((double)n, buf);
}

const char *cli_format_bytes_double(double v, char buf[CLI_BYTES_BUFSZ]) {
  for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
    if (fabs(v) < 1024.0) {
      snprintf(buf, CLI_BYTES_BUFSZ, "%3.1f%sB", v, units[i]);
      return buf;
    }
    v /= 1024.0;
  }
  snprintf(buf, CLI_BYTES_BUFSZ, "%.1fYiB", v);
  return buf;
}

/* ---- views to files ----------------------------------------------------------------------------
 */

typedef struct cli_flame_sink_s {
  ms_flame_t *flame;
  int side; /* -1: plain values; 0: before; 1: after */
} cli_flame_sink_t;

/* Feeds a view's stacks to a flame builder; a trailing empty frame (every frame of the stack
 * filtered, PyTorch's "state; n") carries no name, so its bytes stay with the state. */
static int cli_flame_emit(void *ctx, const char *const *frames, size_t nframes, uint64_t count) {
  cli_flame_sink_t *fs = ctx;
  if (nframes > 0 && frames[nframes - 1][0] == 0) nframes--;
  if (fs->side < 0) return ms_flame_add(fs->flame, frames, nframes, count);
  return ms_flame_add_diff(fs->flame, frames, nframes, fs->side == 0 ? count : 0,
                           fs->side == 1 ? count : 0);
}

int cli_render(const char *out_path, cli_render_mode mode, const ms_flame_options_t *fopts,
               cli_view_fn *view, void *arg) {
  cli_out_t o;
  ms_errbuf_t eb = {{0}};
  int err;
  if (mode == CLI_RENDER_FOLDED) {
    if (cli_out_open(&o, out_path) != CLI_OK) return CLI_FAILURE;
    err = view(arg, ms_view_folded_emit, &o.sink, NULL);
    if (err != MS_OK) goto fail_out;
    return cli_out_commit(&o);
  }
  cli_flame_sink_t fs = {NULL, -1};
  if ((err = ms_flame_create(fopts, &fs.flame)) != MS_OK) {
    cli_error("cannot create the flame graph: %s", ms_strerror(err));
    return CLI_FAILURE;
  }
  cli_progress_start("building the flame graph");
  err = view(arg, cli_flame_emit, &fs, &fs.side);
  cli_progress_stop();
  if (err != MS_OK) {
    cli_error("cannot build the flame graph: %s", ms_strerror(err));
    ms_flame_destroy(fs.flame);
    return CLI_FAILURE;
  }
  if (cli_out_open(&o, out_path) != CLI_OK) {
    ms_flame_destroy(fs.flame);
    return CLI_FAILURE;
  }
  cli_progress_start("writing '%s'", out_path);
  err = mode == CLI_RENDER_MERGED ? ms_flame_write_folded(fs.flame, &o.sink, &eb)
                                  : ms_flame_write_svg(fs.flame, &o.sink, &eb);
  cli_progress_stop();
  ms_flame_destroy(fs.flame);
  if (err != MS_OK) goto fail_out;
  return cli_out_commit(&o);
fail_out:
  return cli_out_fail(&o, err, &eb);
}

/* ---- memory and segments -----------------------------------------------------------------------
 */

typedef struct cli_view_arg_s {
  const ms_snapshot_t *snap;
  ms_view_kind kind;
} cli_view_arg_t;

static int cli_view_one(void *arg, ms_view_emit_fn *emit, void *ctx, int *side) {
  (void)side;
  cli_view_arg_t *a = arg;
  return ms_view_emit(a->snap, a->kind, emit, ctx);
}

int cli_view_main(const char *cmd, const char *usage, ms_view_kind kind, int argc, char **argv) {
  int folded = 0, json = 0;
  const char *output = NULL;
  cli_view_opts_t vo = {NULL, NULL, NULL};
  const char *at_s = NULL, *device_s = NULL, *range_s = NULL, *stream_s = NULL, *pool_s = NULL;
  const struct cli_opt opts[] = {{"output", 'o', NULL, &output}, {"folded", 0, &folded, NULL},
                                 {"json", 0, &json, NULL},       {"at", 0, NULL, &at_s},         {"device", 0, NULL, &device_s},
                                 {"range", 0, NULL, &range_s},   {"stream", 0, NULL, &stream_s},
                                 {"pool", 0, NULL, &pool_s},     {"title", 0, NULL, &vo.title},
                                 {"width", 0, NULL, &vo.width},  {"minwidth", 0, NULL, &vo.minwidth},
                                 {NULL, 0, NULL, NULL}};
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options(cmd, usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error(cmd, "missing FILE");
  if (folded && json) return cli_usage_error(cmd, "--folded and --json exclude each other");
  if ((rc = cli_output_default(cmd, &output, !folded && !json)) != CLI_OK) return rc;
  ms_flame_options_t fo;
  ms_flame_options_init(&fo);
  if ((rc = cli_view_flame_options(cmd, &vo, &fo, NULL, 0)) != CLI_OK) return rc;
  cli_tl_args_t ta;
  if ((rc = cli_tl_args_parse(cmd, &ta, device_s, range_s, stream_s, pool_s, at_s)) != CLI_OK)
    return rc;
  ms_snapshot_t *snap = NULL, *view = NULL;
  /* the views at the end need no trace; a moment, a range or a filter does, read through the time
   * index (which never uses free_requested's stacks) */
  if ((rc = cli_load_ex(pos[0], cli_tl_args_need_trace(&ta) ? MS_LOAD_NO_FREE_STACKS : MS_LOAD_NO_TRACE,
                        &snap)) !=
      CLI_OK)
    return rc;
  if ((rc = cli_at_snapshot(snap, cli_display_name(pos[0]), &ta, true, &view, NULL, NULL)) !=
      CLI_OK) {
    ms_snapshot_free(snap);
    return rc;
  }
  fo.countname = "bytes";
  fo.memory = 1;
  char subtitle[512];
  snprintf(subtitle, sizeof subtitle, "%s: %s", cmd,
           kind == MS_VIEW_MEMORY ? "stream, block state and stack"
                                  : "stream, segment, block state and stack");
  fo.subtitle = subtitle;
  char title[600];
  if (ta.has_device)
    snprintf(title, sizeof title, "%s \u2014 %s (device %zu)", cmd,
             cli_base_name(cli_display_name(pos[0])), ta.device);
  else
    snprintf(title, sizeof title, "%s \u2014 %s", cmd, cli_base_name(cli_display_name(pos[0])));
  if (!vo.title) fo.title = title;
  cli_view_arg_t a = {view ? view : snap, kind};
  if (json)
    rc = cli_render_json(output, cmd, cli_json_head_file, (void *)cli_display_name(pos[0]),
                         cli_view_one, &a);
  else
    rc = cli_render(output, folded ? CLI_RENDER_FOLDED : CLI_RENDER_SVG, &fo, cli_view_one, &a);
  ms_snapshot_free(view);
  ms_snapshot_free(snap);
  return rc;
}
