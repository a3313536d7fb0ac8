/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap check SNAP [--baseline B] --limit FIGURE<=VALUE ... [--replay] [--json]`
 * (issue #28, docs/compare.md): a memory gate for CI. Exit 0 when every limit holds, 1 with one
 * line per broken limit (the figure, its value, the limit, the top three sources of the excess),
 * 2 on a usage error (a malformed limit, an unknown figure, a relative limit without --baseline).
 * The figures and limits are the library's (memsnap/compare.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/replay.h"

static const char check_usage[] =
    "usage: memsnap check SNAP --limit FIGURE<=VALUE [--limit ...] [--baseline B] [--device N]\n"
    "                     [--replay [--config STR] [--capacity SIZE]] [--json] [--jobs N]\n"
    "\n"
    "A memory gate for CI: checks limits on SNAP's figures. Exit status 0 when every limit\n"
    "holds; 1 when one is broken (one line each: the figure, its value, the limit and the three\n"
    "sources that grew most), or when a figure cannot be computed; 2 on a usage error.\n"
    "\n"
    "A limit is FIGURE OP VALUE, OP one of <=, <, >=, >. VALUE is absolute (20GiB, 512M, 3) or,\n"
    "with a sign, relative to the --baseline snapshot's figure (+5%, -10%, +512MiB). Units: K, M,\n"
    "G, T (binary, KiB... too) and B. Figures: peak_reserved, peak_allocated, peak_requested,\n"
    "unallocated_at_peak_reserved, device_mallocs, device_frees, alloc_retries, ooms,\n"
    "final_reserved, final_allocated, and the peak of each category: peak_parameter,\n"
    "peak_optimizer_state, peak_input, peak_temporary, peak_activation, peak_gradient,\n"
    "peak_autograd_detail, peak_unknown.\n"
    "\n"
    "options:\n"
    "  --limit L        a limit (repeat for more)\n"
    "  --baseline B     the snapshot relative limits compare with (e.g. the main branch's)\n"
    "  --device N       device N of both (default: the device with the longest trace)\n"
    "  --replay         figures from a replay of the trace through a fresh allocator (the\n"
    "                   live memory when recording began allocated anew, no cached segments):\n"
    "                   reserved memory that does not depend on the pool's earlier history\n"
    "  --config STR     with --replay: MEMSNAP_ALLOC_CONF settings over the recorded ones\n"
    "  --capacity SIZE  with --replay: the device's size (default: recorded, else inferred\n"
    "                   from an OOM, else unlimited)\n"
    "  --json           the result as JSON\n"
    "  --jobs N         with --baseline: 2 reads SNAP and B at once, each on a thread, 1 one\n"
    "                   after the other (default: at once when there are two cores and memory\n"
    "                   for both)\n"
    "  -h, --help       show this help\n";

#define CHECK_MAX_LIMITS 64

/* Takes every `--limit X` / `--limit=X` out of argv. @return their number, or -1 (too many, or
 * one without its value). */
static int check_take_limits(int *argc, char **argv, const char **lim) {
  int n = 0, k = 1;
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      while (i < *argc) argv[k++] = argv[i++];
      break;
    }
    const char *v = NULL;
    if (strcmp(argv[i], "--limit") == 0) {
      if (i + 1 >= *argc) return -1;
      v = argv[++i];
    } else if (strncmp(argv[i], "--limit=", 8) == 0) {
      v = argv[i] + 8;
    } else {
      argv[k++] = argv[i];
      continue;
    }
    if (n >= CHECK_MAX_LIMITS) return -1;
    lim[n++] = v;
  }
  *argc = k;
  argv[k] = NULL;
  return n;
}

typedef struct check_result_s {
  ms_gate_limit_t limit;
  uint64_t value, baseline, bound;
  bool holds;
  ms_compare_row_t top[3];
  char top_key[3][256];
  size_t ntop;
} check_result_t;

static void check_value_text(ms_gate_figure f, uint64_t v, char *buf) {
  if (ms_gate_figure_is_bytes(f)) cli_format_ubytes(v, buf);
  else snprintf(buf, CLI_BYTES_BUFSZ, "%" PRIu64, v);
}

/* The sources that grew most towards the figure's moment: from the baseline's moment of the
 * same figure, else from the start of the trace. */
static void check_sources(const ms_snapshot_t *snap, const ms_gate_figures_t *f,
                          const ms_snapshot_t *base, const ms_gate_figures_t *bf,
                          check_result_t *res) {
  ms_gate_figure fig = res->limit.figure;
  if (f->step[fig] < 0) return;
  ms_compare_options_t o;
  ms_compare_options_init(&o);
  o.device = (int)f->device;
  o.leaks = false;
  o.nrows = 0;
  o.has_moment[0] = o.has_moment[1] = true;
  o.moment[1] = (ms_tl_moment_t){MS_TL_MOMENT_ENTRY, f->step[fig] - 1};
  o.moment[0] = (ms_tl_moment_t){MS_TL_MOMENT_ENTRY, -1};
  if (base && bf->step[fig] >= 0) o.moment[0].value = bf->step[fig] - 1;
  else base = snap;
  if (base != snap && bf->device != f->device) return;
  ms_compare_t *c = NULL;
  ms_errbuf_t eb;
  if (ms_compare_run(base, snap, &o, &c, &eb) != MS_OK) return;
  bool cat = fig >= MS_FIG_CATEGORY0;
  for (size_t i = 0; i < c->nsource && res->ntop < 3; i++) {
    const ms_compare_row_t *r = &c->by_source[i];
    if (r->change <= 0) continue;
    if (cat && r->category != (ms_category)(fig - MS_FIG_CATEGORY0)) continue;
    res->top[res->ntop] = *r;
    snprintf(res->top_key[res->ntop], sizeof res->top_key[0], "%s", r->key);
    res->ntop++;
  }
  ms_compare_free(c);
}

static void check_text(const char *name, const check_result_t *res, size_t n, size_t broken,
                       const ms_gate_figures_t *f) {
  char v[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ], c[CLI_BYTES_BUFSZ];
  for (size_t i = 0; i < n; i++) {
    const check_result_t *r = &res[i];
    ms_gate_figure fig = r->limit.figure;
    check_value_text(fig, r->value, v);
    check_value_text(fig, r->bound, b);
    if (ms_gate_figure_is_bytes(fig) && strcmp(v, b) == 0 && r->value != r->bound) {
      /* the rounded sizes look alike: the exact bytes tell them apart */
      snprintf(v, sizeof v, "%" PRIu64 " B", r->value);
      snprintf(b, sizeof b, "%" PRIu64 " B", r->bound);
    }
    printf("%s %s: %s, limit %s (%s", r->holds ? "ok  " : "FAIL", ms_gate_figure_name(fig), v, b,
           r->limit.text);
    if (r->limit.relative) {
      check_value_text(fig, r->baseline, c);
      printf(", baseline %s", c);
    }
    printf(")");
    if (!r->holds) {
      printf("; sources that grew most: ");
      if (!r->ntop) printf("-");
      for (size_t k = 0; k < r->ntop; k++) {
        printf("%s+%s ", k ? ", " : "", cli_format_ubytes((uint64_t)r->top[k].change, c));
        cli_fputs_escaped(r->top_key[k], stdout);
      }
    }
    putchar('\n');
  }
  printf("memsnap check: '%s'%s: %zu of %zu limit%s broken\n", name,
         f->replayed ? " (replayed from a fresh allocator)" : "", broken, n, n == 1 ? "" : "s");
}

static int check_json(const char *name, const check_result_t *res, size_t n, size_t broken,
                      const ms_gate_figures_t *f) {
  cli_out_t o;
  int rc = cli_out_open(&o, "-");
  if (rc != CLI_OK) return rc;
  cli_json_t j = {&o.sink, 0};
  cli_json_lit(&j, "{\"command\": \"check\", \"file\": ");
  cli_json_str(&j, name);
  cli_json_lit(&j, ", \"device\": ");
  cli_json_u64(&j, f->device);
  cli_json_lit(&j, f->replayed ? ", \"replayed\": true" : ", \"replayed\": false");
  cli_json_lit(&j, ", \"broken\": ");
  cli_json_u64(&j, broken);
  cli_json_lit(&j, ", \"limits\": [");
  for (size_t i = 0; i < n; i++) {
    const check_result_t *r = &res[i];
    cli_json_lit(&j, i ? ", {\"limit\": " : "{\"limit\": ");
    cli_json_str(&j, r->limit.text);
    cli_json_lit(&j, ", \"figure\": ");
    cli_json_str(&j, ms_gate_figure_name(r->limit.figure));
    cli_json_lit(&j, ", \"value\": ");
    cli_json_u64(&j, r->value);
    cli_json_lit(&j, ", \"bound\": ");
    cli_json_u64(&j, r->bound);
    cli_json_lit(&j, ", \"baseline\": ");
    if (r->limit.relative) cli_json_u64(&j, r->baseline);
    else cli_json_lit(&j, "null");
    cli_json_lit(&j, r->holds ? ", \"holds\": true" : ", \"holds\": false");
    cli_json_lit(&j, ", \"sources\": [");
    for (size_t k = 0; k < r->ntop; k++) {
      cli_json_lit(&j, k ? ", {\"source\": " : "{\"source\": ");
      cli_json_str(&j, r->top_key[k]);
      cli_json_lit(&j, ", \"change\": ");
      cli_json_i64(&j, r->top[k].change);
      cli_json_lit(&j, "}");
    }
    cli_json_lit(&j, "]}");
  }
  cli_json_lit(&j, "]}\n");
  if (j.err != MS_OK) return cli_out_fail(&o, j.err, NULL);
  return cli_out_commit(&o);
}

/* One file, SNAP (side 0) or the baseline (side 1): read, and its figures computed. */
typedef struct check_side_s {
  const char *path, *name;
  const ms_gate_options_t *go;
  ms_snapshot_t *snap;
  ms_gate_figures_t f;
} check_side_t;

/* Side k of ctx (cli_side_fn): errors printed. */
static bool check_side_run(void *ctx, int k) {
  check_side_t *s = (check_side_t *)ctx + k;
  ms_cache_key_t key;
  /* the categories read every allocation's frames from the file, the sources of an excess the
   * stacks of the blocks that show it (MS_LOAD_DEFER_STACKS); a replay reads the allocations'
   * stacks (what released a burst of segments) */
  unsigned flags = MS_LOAD_NO_FREE_STACKS | (s->go->replay ? 0 : MS_LOAD_DEFER_STACKS);
  if (cli_load_keyed(s->path, flags, &s->snap, &key) != CLI_OK) return false;
  ms_errbuf_t eb = {{0}};
  int err = ms_gate_figures(s->snap, s->go, &s->f, &eb);
  if (err == MS_OK) return true;
  cli_error("'%s': %s", s->name, eb.msg[0] ? eb.msg : ms_strerror(err));
  return false;
}

/* SNAP's figures, and the baseline's when there is one (both read at once or in turn, jobs as
 * --jobs says: cli_two_sides). @return CLI_OK, or CLI_FAILURE (printed). */
static int check_read(check_side_t side[2], bool baseline, unsigned jobs) {
  char what[1200];
  if (!baseline) { /* its messages printed once the progress line is gone */
    cli_note_input(side[0].path);
    cli_msg_held_t held;
    cli_msg_hold(&held);
    cli_progress_start("checking '%s'", side[0].name);
    bool ok = check_side_run(side, 0);
    cli_progress_stop();
    cli_msg_hold_end(&held);
    cli_msg_release(&held, true);
    return ok ? CLI_OK : CLI_FAILURE;
  }
  snprintf(what, sizeof what, "checking '%s' against '%s'", side[0].name, side[1].name);
  const char *paths[2] = {side[0].path, side[1].path};
  return cli_two_sides(paths, jobs, what, check_side_run, side) ? CLI_OK : CLI_FAILURE;
}

/* Evaluates the limits: CLI_OK (all hold), CLI_FAILURE (one broken or unknown). */
static int check_eval(const ms_snapshot_t *snap, const char *name, const ms_gate_figures_t *f,
                      const ms_snapshot_t *base, const char *bname, const ms_gate_figures_t *bf,
                      check_result_t *res, size_t n, bool json) {
  size_t broken = 0;
  for (size_t i = 0; i < n; i++) {
    ms_gate_figure fig = res[i].limit.figure;
    if (!f->known[fig] || (res[i].limit.relative && !bf->known[fig])) {
      const char *who = !f->known[fig] ? name : bname;
      const char *why = !f->known[fig] ? f->note : bf->note;
      cli_error("'%s': %s is not known: %s", who, ms_gate_figure_name(fig),
                why[0] ? why : "the snapshot does not record it");
      return CLI_FAILURE;
    }
    res[i].value = f->value[fig];
    res[i].baseline = res[i].limit.relative ? bf->value[fig] : 0;
    res[i].holds = ms_gate_holds(&res[i].limit, res[i].value, res[i].baseline, &res[i].bound);
    if (!res[i].holds) {
      broken++;
      check_sources(snap, f, base, bf, &res[i]);
    }
  }
  int rc = json ? check_json(name, res, n, broken, f) : (check_text(name, res, n, broken, f), CLI_OK);
  return rc != CLI_OK ? rc : broken ? CLI_FAILURE : CLI_OK;
}

/* Options into *go and the limits into res; usage errors printed. */
static int check_parse(const char **lim, int nlim, const char *baseline, const char *device_s,
                       int replay, const char *config, const char *capacity_s,
                       ms_gate_options_t *go, check_result_t *res) {
  ms_gate_options_init(go);
  if (nlim == 0) return cli_usage_error("check", "no --limit given (e.g. --limit 'peak_allocated<=20GiB')");
  for (int i = 0; i < nlim; i++) {
    ms_errbuf_t eb = {{0}};
    memset(&res[i], 0, sizeof res[i]);
    if (ms_gate_limit_parse(lim[i], &res[i].limit, &eb) != MS_OK)
      return cli_usage_error("check", "--limit '%s': %s", lim[i], eb.msg);
    if (res[i].limit.relative && !baseline)
      return cli_usage_error("check", "--limit '%s' is relative: it needs --baseline B", lim[i]);
  }
  if (device_s) {
    uint64_t d;
    if (!cli_parse_u64(device_s, &d) || d > 4096)
      return cli_usage_error("check", "option '--device' needs a device number, not '%s'", device_s);
    go->device = (int)d;
  }
  if ((config || capacity_s) && !replay)
    return cli_usage_error("check", "--config and --capacity apply to --replay");
  go->replay = replay != 0;
  go->config = config;
  if (capacity_s) {
    size_t cap = 0;
    ms_errbuf_t eb = {{0}};
    if (ms_replay_parse_capacity(capacity_s, &cap, &eb) != MS_OK)
      return cli_usage_error("check", "invalid size '%s' for --capacity: %s", capacity_s, eb.msg);
    go->capacity = cap;
  }
  return CLI_OK;
}

int cmd_check(int argc, char **argv) {
  int json = 0, replay = 0;
  const char *baseline = NULL, *device_s = NULL, *config = NULL, *capacity_s = NULL;
  const char *jobs_s = NULL;
  const struct cli_opt opts[] = {
      {"json", 0, &json, NULL},           {"jobs", 0, NULL, &jobs_s},
      {"replay", 0, &replay, NULL},       {"baseline", 0, NULL, &baseline},
      {"device", 0, NULL, &device_s},     {"config", 0, NULL, &config},
      {"capacity", 0, NULL, &capacity_s}, {NULL, 0, NULL, NULL}};
  const char *lim[CHECK_MAX_LIMITS];
  int nlim = check_take_limits(&argc, argv, lim);
  if (nlim < 0)
    return cli_usage_error("check", "option '--limit' needs a value (at most %d limits)",
                           CHECK_MAX_LIMITS);
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options("check", check_usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error("check", "missing SNAP");
  check_result_t res[CHECK_MAX_LIMITS];
  ms_gate_options_t go;
  rc = check_parse(lim, nlim, baseline, device_s, replay, config, capacity_s, &go, res);
  if (rc != CLI_OK) return rc;
  if (baseline && strcmp(baseline, "-") == 0 && strcmp(pos[0], "-") == 0)
    return cli_usage_error("check", "only one of SNAP and --baseline can be '-'");
  unsigned jobs = 0; /* 0: as the machine allows */
  if (jobs_s && !baseline) return cli_usage_error("check", "--jobs applies to --baseline");
  if (jobs_s && (rc = cli_parse_jobs("check", jobs_s, 1024, &jobs)) != CLI_OK) return rc;
  const char *name = cli_display_name(pos[0]), *bname = baseline ? cli_display_name(baseline) : "";
  check_side_t side[2];
  memset(side, 0, sizeof side);
  side[0] = (check_side_t){.path = pos[0], .name = name, .go = &go};
  side[1] = (check_side_t){.path = baseline, .name = bname, .go = &go};
  cli_classify_on_read(NULL); /* the category figures' classifier has the default rules */
  rc = check_read(side, baseline != NULL, jobs);
  const ms_gate_figures_t *f = &side[0].f, *bf = &side[1].f;
  if (rc == CLI_OK && baseline && bf->device != f->device)
    cli_warning("checking device %zu of '%s' against device %zu of '%s' (--device N picks one)",
                f->device, name, bf->device, bname);
  if (rc == CLI_OK)
    rc = check_eval(side[0].snap, name, f, side[1].snap, bname, bf, res, (size_t)nlim, json);
  ms_snapshot_free(side[1].snap);
  ms_snapshot_free(side[0].snap);
  return rc;
}
