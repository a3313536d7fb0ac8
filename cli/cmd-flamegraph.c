/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap flamegraph FOLDED [-o OUT] [options]`: any folded-stack file (one
 * `frame;frame;leaf COUNT` per line, or `STACK BEFORE AFTER` for a differential graph) to an
 * interactive SVG, with flamegraph.pl's common options, so it serves beyond snapshots and can be
 * compared with flamegraph.pl and inferno on the same input (docs/flamegraph.md).
 *
 * The input is streamed in 1 MiB pieces (memory follows the merged tree, not the file), and the
 * output is written complete-or-not-at-all (cli_out_open).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/viz.h"

static const char flamegraph_usage[] =
    "usage: memsnap flamegraph FOLDED [-o OUT] [options]\n"
    "\n"
    "Draws an interactive flame graph (SVG) of a folded-stack file: one `a;b;c COUNT` line per\n"
    "stack, as written by `memsnap memory --folded`, flamegraph.pl's stackcollapse tools or\n"
    "perf. Lines `a;b;c BEFORE AFTER` (difffolded.pl) give a differential graph. FOLDED '-'\n"
    "reads standard input.\n"
    "\n"
    "options:\n"
    "  -o, --output OUT    write to OUT ('-' = standard output; default: output.svg, and\n"
    "                      standard output with --folded; an SVG is not written to a terminal)\n"
    "  --folded            write the merged folded stacks instead of an SVG\n"
    "  --title TEXT        title (default: \"Flame Graph\")\n"
    "  --subtitle TEXT     second title line\n"
    "  --width PX          image width (default: 1200)\n"
    "  --height PX         height of one frame (default: 16)\n"
    "  --fonttype FONT     font family (default: Verdana)\n"
    "  --fontsize PX       font size (default: 12)\n"
    "  --fontwidth F       mean glyph width / font size, to fit labels (default: 0.59)\n"
    "  --minwidth PX|N%    gather frames narrower than this into \"[N small frames]\"\n"
    "                      (default: 0.1 px; N% is a share of the total)\n"
    "  --countname NAME    unit of the counts (default: bytes, shown also as KiB, MiB...)\n"
    "  --nametype TEXT     prefix of the details line (default: \"Function:\")\n"
    "  --colors PALETTE    hot (default), mem, io, wakeup, chain, java, js, perl, red,\n"
    "                      green, blue, aqua, yellow, purple, orange\n"
    "  --hash              colour by the first characters of names (similar names alike)\n"
    "  --memory            allocator colours for block states, <gaps> and segments\n"
    "  --inverted          icicle graph (root at the top)\n"
    "  --reverse           reverse every stack (leaf first) before merging\n"
    "  --flamechart        keep the input order; merge only adjacent equal frames\n"
    "  -h, --help          show this help\n";

/* Parses a positive number for option name. @return 1 or 0 after printing a usage error. */
static int fg_parse_num(const char *name, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    cli_usage_error("flamegraph", "option '--%s' needs a number from %.10g to %.10g, not '%s'",
                    name, lo, hi, s);
    return 0;
  }
  *out = v;
  return 1;
}

/* Whether the first bytes of FOLDED are a snapshot or compressed data rather than folded text;
 * then prints which command reads it (never the bytes themselves). */
static bool fg_not_folded(const char *head, size_t n, const char *shown) {
  ms_format f = ms_format_detect(head, n);
  if (f == MS_FORMAT_PICKLE || f == MS_FORMAT_MEMSNAP || f == MS_FORMAT_MEMSNAP_Z) {
    cli_error("'%s' is a snapshot (%s), not folded stacks: draw it with 'memsnap memory %s' "
              "(or segments, compare)",
              shown, f == MS_FORMAT_PICKLE ? "a PyTorch pickle" : "memsnap's format",
              shown[0] == '<' ? "-" : shown);
    return true;
  }
  if (n >= 2 && (unsigned char)head[0] == 0x1f && (unsigned char)head[1] == 0x8b) {
    cli_error("'%s' is gzip-compressed, not folded text: decompress it first (zcat FILE | "
              "memsnap flamegraph -), or draw a compressed snapshot with 'memsnap memory'",
              shown);
    return true;
  }
  return false;
}

/* Streams the file into the builder. @return CLI_OK or CLI_FAILURE after printing the error. */
static int fg_read(ms_flame_t *fl, const char *path) {
  const char *shown = cli_display_name(path);
  cli_note_input(path);
  FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (!fp) {
    cli_error("cannot open '%s': %s", shown, strerror(errno));
    return CLI_FAILURE;
  }
  size_t cap = (size_t)1 << 20;
  char *buf = malloc(cap);
  int rc = CLI_OK;
  ms_errbuf_t eb = {{0}};
  if (!buf) {
    cli_error("cannot read '%s': %s", shown, ms_strerror(MS_ENOMEM));
    rc = CLI_FAILURE;
  }
  cli_progress_start("reading '%s'", shown);
  for (bool first = true; rc == CLI_OK; first = false) {
    size_t n = fread(buf, 1, cap, fp);
    if (first && fg_not_folded(buf, n, shown)) {
      rc = CLI_FAILURE;
      break;
    }
    if (n > 0 && ms_flame_add_folded(fl, buf, n, &eb) != MS_OK) {
      rc = CLI_FAILURE;
      break;
    }
    if (n < cap) {
      if (ferror(fp)) {
        cli_progress_stop();
        cli_error("cannot read '%s': %s", shown, strerror(errno ? errno : EIO));
        rc = CLI_FAILURE;
        eb.msg[0] = 0;
        break;
      }
      if (ms_flame_finish_folded(fl, &eb) != MS_OK) rc = CLI_FAILURE;
      break;
    }
  }
  cli_progress_stop();
  if (rc != CLI_OK && eb.msg[0]) cli_error("cannot parse '%s': %s", shown, eb.msg);
  free(buf);
  if (fp != stdin) fclose(fp);
  return rc;
}

int cmd_flamegraph(int argc, char **argv) {
  const char *out_path = NULL, *title = NULL, *subtitle = NULL, *width = NULL;
  const char *height = NULL, *minwidth = NULL, *countname = NULL, *nametype = NULL;
  const char *colors = NULL, *fonttype = NULL, *fontsize = NULL, *fontwidth = NULL;
  int folded = 0, hash = 0, inverted = 0, reverse = 0, flamechart = 0, memory = 0;
  const struct cli_opt opts[] = {
      {"output", 'o', NULL, &out_path},
      {"folded", 0, &folded, NULL},
      {"title", 0, NULL, &title},
      {"subtitle", 0, NULL, &subtitle},
      {"width", 0, NULL, &width},
      {"height", 0, NULL, &height},
      {"fonttype", 0, NULL, &fonttype},
      {"fontsize", 0, NULL, &fontsize},
      {"fontwidth", 0, NULL, &fontwidth},
      {"minwidth", 0, NULL, &minwidth},
      {"countname", 0, NULL, &countname},
      {"nametype", 0, NULL, &nametype},
      {"colors", 0, NULL, &colors},
      {"hash", 0, &hash, NULL},
      {"memory", 0, &memory, NULL},
      {"inverted", 0, &inverted, NULL},
      {"reverse", 0, &reverse, NULL},
      {"flamechart", 0, &flamechart, NULL},
      {NULL, 0, NULL, NULL},
  };
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options("flamegraph", flamegraph_usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos != 1) return cli_usage_error("flamegraph", "expected one FOLDED file ('-' for stdin)");
  if ((rc = cli_output_default("flamegraph", &out_path, !folded)) != CLI_OK) return rc;

  ms_flame_options_t o;
  ms_flame_options_init(&o);
  double v;
  if (width) {
    if (!fg_parse_num("width", width, 21, 1000000, &v)) return CLI_USAGE;
    o.width = (unsigned)v;
  }
  if (height) {
    if (!fg_parse_num("height", height, 1, 10000, &v)) return CLI_USAGE;
    o.frame_height = (unsigned)v;
  }
  if (fontsize && !fg_parse_num("fontsize", fontsize, 0.1, 1000, &o.font_size)) return CLI_USAGE;
  if (fontwidth && !fg_parse_num("fontwidth", fontwidth, 0.01, 10, &o.font_width))
    return CLI_USAGE;
  if (minwidth) {
    size_t len = strlen(minwidth);
    if (len > 1 && minwidth[len - 1] == '%') {
      char num[64];
      snprintf(num, sizeof num, "%.*s", (int)(len - 1), minwidth);
      if (!fg_parse_num("minwidth", num, 0, 100, &o.minwidth_pct)) return CLI_USAGE;
      if (o.minwidth_pct == 0) o.minwidth = 0;
    } else if (!fg_parse_num("minwidth", minwidth, 0, 1e9, &o.minwidth)) {
      return CLI_USAGE;
    }
  }
  if (colors && ms_flame_palette_parse(colors, &o.colors) != MS_OK)
    return cli_usage_error("flamegraph", "unknown palette '%s' for '--colors'", colors);
  if (title) o.title = title;
  if (subtitle) o.subtitle = subtitle;
  if (fonttype) o.font_type = fonttype;
  if (countname) o.countname = countname;
  if (nametype) o.nametype = nametype;
  o.hash = hash;
  o.memory = memory;
  o.inverted = inverted;
  o.reverse = reverse;
  o.flamechart = flamechart;

  ms_flame_t *fl = NULL;
  int err = ms_flame_create(&o, &fl);
  if (err != MS_OK) {
    cli_error("cannot create the flame graph: %s", ms_strerror(err));
    return err == MS_EINVAL ? CLI_USAGE : CLI_FAILURE;
  }
  if (fg_read(fl, pos[0]) != CLI_OK) {
    ms_flame_destroy(fl);
    return CLI_FAILURE;
  }
  size_t skipped = ms_flame_lines_skipped(fl);
  if (skipped)
    cli_warning("'%s': ignored %zu line%s with a negative count", cli_display_name(pos[0]),
                skipped, skipped == 1 ? "" : "s");
  if (ms_flame_total(fl) == 0)
    cli_warning("'%s': no stacks with a positive count", cli_display_name(pos[0]));

  cli_out_t out;
  if (cli_out_open(&out, out_path) != CLI_OK) {
    ms_flame_destroy(fl);
    return CLI_FAILURE;
  }
  ms_errbuf_t eb = {{0}};
  cli_progress_start("writing '%s'", out_path);
  err = folded ? ms_flame_write_folded(fl, &out.sink, &eb) : ms_flame_write_svg(fl, &out.sink, &eb);
  cli_progress_stop();
  ms_flame_destroy(fl);
  if (err != MS_OK) return cli_out_fail(&out, err, &eb);
  return cli_out_commit(&out);
}
