/* SPDX-License-Identifier: MIT
 * memsnap CLI: helpers shared by the snapshot commands (cli.h): option parsing in argparse's
 * manner, and loading a snapshot with a clear error and a progress line. (Byte formatting is
 * format.c's; views to files view-main.c's.)
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/attribution.h"
#include "memsnap/cache.h"
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

/* --no-cache was given (docs/performance.md): snapshots are read from their files only. */
static bool cli_no_cache;

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
    if (strcmp(a, "--no-cache") == 0) { /* every command's: cli_load_ex skips the cache */
      cli_no_cache = true;
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
  cli_progress_count_fn *count, *next_count; /* bytes done so far (NULL: time only) */
  uint64_t total, next_total, base;          /* bytes in all (0: unknown), count() at start */
} cli_progress = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

void cli_progress_count(cli_progress_count_fn *count, uint64_t total) {
  cli_progress.next_count = count;
  cli_progress.next_total = total;
}

uint64_t cli_proc_value(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[256];
  size_t n = strlen(key);
  unsigned long long v = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%llu", &v) == 1)
      break;
  fclose(f);
  return v;
}

uint64_t cli_bytes_read(void) {
  return cli_proc_value("/proc/self/io", "rchar");
}

/* "45% (412.3MiB of 912.0MiB), " or "123.4MiB, ": what is done, when a count was given. */
static void cli_progress_done(char *buf, size_t cap) {
  buf[0] = 0;
  if (!cli_progress.count) return;
  uint64_t now = cli_progress.count();
  uint64_t d = now > cli_progress.base ? now - cli_progress.base : 0;
  char a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ];
  if (cli_progress.total) {
    double pct = 100.0 * (double)d / (double)cli_progress.total;
    snprintf(buf, cap, "%.0f%% (%s of %s), ", pct > 100 ? 100.0 : pct,
             cli_format_ubytes(d < cli_progress.total ? d : cli_progress.total, a),
             cli_format_ubytes(cli_progress.total, b));
  } else {
    snprintf(buf, cap, "%s, ", cli_format_ubytes(d, a));
  }
}

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
      char done[160];
      cli_progress_done(done, sizeof done);
      fprintf(stderr, "\rmemsnap: %s... %s%.0f s\033[K", cli_progress.what, done,
              cli_now() - start);
      fflush(stderr);
      cli_progress.shown = true;
      wait_s = 0.5;
    }
  }
  pthread_mutex_unlock(&cli_progress.lock);
  return NULL;
}

void cli_progress_start(const char *fmt, ...) {
  cli_progress.count = cli_progress.next_count;
  cli_progress.total = cli_progress.next_total;
  cli_progress.next_count = NULL;
  cli_progress.next_total = 0;
  if (cli_progress.running || !isatty(STDERR_FILENO)) return;
  cli_progress.base = cli_progress.count ? cli_progress.count() : 0;
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

/* The cache keys of the snapshots loaded through the cache (cli_cache_key): a few slots, since a
 * command holds at most a few snapshots at a time; a load replaces its pointer's slot, so a freed
 * snapshot's key is never found for a later one at the same address. */
#define CLI_KEYS 16
static struct {
  const ms_snapshot_t *snap;
  const ms_snap_trace_t *trace; /* and what it held: another snapshot at a freed one's address */
  size_t ntrace, nstacks;       /* does not pass for it */
  ms_cache_key_t key;
} cli_keys[CLI_KEYS];
static size_t cli_keys_next;

void cli_cache_key_note(const ms_snapshot_t *snap, const ms_cache_key_t *key) {
  for (size_t i = 0; i < CLI_KEYS; i++)
    if (cli_keys[i].snap == snap) cli_keys[i].snap = NULL;
  if (!key || (!key->hash && !key->size)) return;
  cli_keys[cli_keys_next].snap = snap;
  cli_keys[cli_keys_next].trace = snap->trace;
  cli_keys[cli_keys_next].ntrace = snap->ntrace;
  cli_keys[cli_keys_next].nstacks = snap->nstacks;
  cli_keys[cli_keys_next].key = *key;
  cli_keys_next = (cli_keys_next + 1) % CLI_KEYS;
}

const ms_cache_key_t *cli_cache_key(const ms_snapshot_t *snap) {
  for (size_t i = 0; snap && i < CLI_KEYS; i++)
    if (cli_keys[i].snap == snap && cli_keys[i].trace == snap->trace &&
        cli_keys[i].ntrace == snap->ntrace && cli_keys[i].nstacks == snap->nstacks)
      return &cli_keys[i].key;
  return NULL;
}

bool cli_cache_enabled(void) { return !cli_no_cache && ms_cache_env_enabled(); }

int cli_load(const char *path, ms_snapshot_t **out) {
  return cli_load_ex(path, 0, out);
}

static int cli_load_opts(const char *path, unsigned flags, const ms_cache_options_t *co,
                         const ms_load_window_t *window, ms_snapshot_t **out);

int cli_load_window(const char *path, unsigned flags, const ms_load_window_t *window,
                    ms_snapshot_t **out) {
  return cli_load_opts(path, flags, NULL, window, out);
}

int cli_load_ex(const char *path, unsigned flags, ms_snapshot_t **out) {
  return cli_load_opts(path, flags, NULL, NULL, out);
}

int cli_load_unstored(const char *path, ms_snapshot_t **out) {
  const ms_cache_options_t co = {NULL, 0, true};
  return cli_load_opts(path, 0, &co, NULL, out);
}

char *cli_rules_text(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  char *buf = fp ? malloc((1u << 20) + 2) : NULL;
  size_t n = buf ? fread(buf, 1, (1u << 20) + 1, fp) : 0;
  if (fp && (ferror(fp) || !buf)) {
    free(buf);
    buf = NULL;
  }
  if (fp) fclose(fp);
  if (!buf) return NULL;
  buf[n] = 0;
  *len = n;
  return buf;
}

/* cli_classify_on_read's: whether reads classify, and with which rules file (NULL: defaults). */
static bool cli_classify;
static const char *cli_classify_rules;

void cli_classify_on_read(const char *rules_path) {
  cli_classify = true;
  cli_classify_rules = rules_path;
}

/* ms_snapshot_load_ex(), classifying as it reads when cli_classify_on_read asked for it. */
static int cli_load_plain(const char *path, unsigned flags, ms_snapshot_t **out, ms_errbuf_t *eb) {
  if (!cli_classify || !(flags & MS_LOAD_DEFER_STACKS))
    return ms_snapshot_load_ex(path, flags, out, eb);
  ms_attr_config_t cfg;
  ms_attr_config_init(&cfg);
  char *text = NULL;
  if (cli_classify_rules) {
    size_t len = 0;
    if (!(text = cli_rules_text(cli_classify_rules, &len)))
      return ms_snapshot_load_ex(path, flags, out, eb);
    cfg.rules = text;
    cfg.rules_len = len;
    cfg.rules_name = cli_classify_rules;
  }
  int err = ms_attr_load(path, flags, &cfg, out, eb);
  free(text);
  return err;
}

/* The read itself: no progress line, no note of the input or of the key. On failure, the error
 * to print is in why (printed by the caller, once a progress line is gone). */
static int cli_load_core(const char *path, unsigned flags, const ms_cache_options_t *co,
                         const ms_load_window_t *window, ms_snapshot_t **out, ms_cache_key_t *key,
                         char *why, size_t cap) {
  ms_errbuf_t eb = {{0}};
  ms_snapshot_t *snap = NULL;
  /* through the snapshot cache (memsnap/cache.h) unless --no-cache or MEMSNAP_CACHE=0: the same
   * snapshot, errors and messages either way; a window's snapshot is never cached */
  memset(key, 0, sizeof *key);
  int err = window ? ms_snapshot_load_window(path, flags, window, &snap, &eb)
            : !cli_no_cache && ms_cache_env_enabled()
                ? ms_cache_load_keyed(path, flags, co, &snap, NULL, key, &eb)
                : cli_load_plain(path, flags, &snap, &eb);
  if (err != MS_OK) {
    const char *what = eb.msg[0] ? eb.msg : ms_strerror(err);
    const char *name = cli_display_name(path);
    /* The loader's messages name the file ("cannot open 'x': ...", "'x': ..."); name it where
     * one does not. */
    char quoted[600];
    snprintf(quoted, sizeof quoted, "'%s'", name);
    if (strstr(what, quoted))
      snprintf(why, cap, "%s", what);
    else
      snprintf(why, cap, "'%s': %s", name, what);
    return CLI_FAILURE;
  }
  *out = snap;
  return CLI_OK;
}

int cli_load_keyed(const char *path, unsigned flags, ms_snapshot_t **out, ms_cache_key_t *key) {
  char why[1200];
  int rc = cli_load_core(path, flags, NULL, NULL, out, key, why, sizeof why);
  if (rc != CLI_OK) cli_error("%s", why);
  return rc;
}

/* ---- two files at once ------------------------------------------------------------------- */

/* The file's size in bytes as a read may need them: 8 x for a gzip or zlib stream, whose content
 * is larger than the file; 0 when it is not a regular file. */
static uint64_t cli_read_bytes(const char *path) {
  struct stat st;
  if (strcmp(path, "-") == 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  unsigned char m[2] = {0, 0};
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(m, 1, 2, f) : 0;
  if (f) fclose(f);
  bool packed =
      n == 2 && ((m[0] == 0x1f && m[1] == 0x8b) || (m[0] == 0x78 && (m[0] * 256 + m[1]) % 31 == 0));
  return (uint64_t)st.st_size * (packed ? 8 : 1);
}

/* Whether two files are read at once (cli_two_sides). */
static bool cli_two_at_once(const char *paths[2], unsigned jobs) {
  if (jobs) return jobs > 1;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  uint64_t need[2] = {cli_read_bytes(paths[0]), cli_read_bytes(paths[1])};
  if (ncpu < 2 || !need[0] || !need[1]) return false;
  uint64_t avail = cli_proc_value("/proc/meminfo", "MemAvailable") * 1024; /* kB */
  return need[0] <= avail / 4 && need[1] <= avail / 4 - need[0];
}

typedef struct cli_side_s {
  cli_side_fn *fn;
  void *ctx;
  int k;
  bool ok;
  cli_msg_held_t held;
} cli_side_t;

static void *cli_side_main(void *arg) {
  cli_side_t *s = arg;
  cli_msg_hold(&s->held);
  s->ok = s->fn(s->ctx, s->k);
  cli_msg_hold_end(&s->held);
  return NULL;
}

bool cli_two_sides(const char *paths[2], unsigned jobs, const char *what, cli_side_fn *fn,
                   void *ctx) {
  cli_side_t side[2];
  memset(side, 0, sizeof side);
  uint64_t total = 0;
  for (int k = 0; k < 2; k++) {
    side[k].fn = fn;
    side[k].ctx = ctx;
    side[k].k = k;
    cli_note_input(paths[k]);
    struct stat st;
    if (strcmp(paths[k], "-") != 0 && stat(paths[k], &st) == 0 && S_ISREG(st.st_mode))
      total += (uint64_t)st.st_size;
  }
  cli_progress_count(cli_bytes_read, total);
  cli_progress_start("%s", what);
  pthread_t th;
  bool threaded =
      cli_two_at_once(paths, jobs) && pthread_create(&th, NULL, cli_side_main, &side[1]) == 0;
  cli_side_main(&side[0]);
  if (threaded)
    pthread_join(th, NULL);
  else if (side[0].ok)
    cli_side_main(&side[1]);
  cli_progress_stop();
  cli_msg_release(&side[0].held, true);
  cli_msg_release(&side[1].held, side[0].ok);
  return side[0].ok && side[1].ok;
}

static int cli_load_opts(const char *path, unsigned flags, const ms_cache_options_t *co,
                         const ms_load_window_t *window, ms_snapshot_t **out) {
  cli_note_input(path);
  struct stat st;
  bool sized = strcmp(path, "-") != 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode);
  cli_progress_count(cli_bytes_read, sized ? (uint64_t)st.st_size : 0);
  cli_progress_start("reading '%s'", cli_display_name(path));
  ms_cache_key_t key;
  char why[1200];
  int rc = cli_load_core(path, flags, co, window, out, &key, why, sizeof why);
  cli_progress_stop();
  if (rc == CLI_OK)
    cli_cache_key_note(*out, &key);
  else
    cli_error("%s", why);
  return rc;
}
