/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap convert IN OUT [--to FORMAT]` (issue #4): a snapshot from one file format
 * to another. IN is any format memsnap reads (recognised from its content); OUT's format comes
 * from --to or else from OUT's name: .pickle/.pkl -> PyTorch pickle (protocol 4, loadable by
 * _memory_viz.py and pytorch.org/memory_viz); .msnap/.msgpack/.memsnap -> memsnap; the same
 * followed by .gz, or .msnapz -> memsnap, compressed. OUT is written complete or not at all.
 * docs/pytorch.md says what each direction keeps.
 */
#include <stdbool.h>
#include <string.h>

#include "cli.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"

static const char convert_usage[] =
    "usage: memsnap convert IN OUT [--to memsnap|memsnap-z|pickle]\n"
    "\n"
    "Converts a snapshot between memsnap's format and PyTorch's pickle (the format of\n"
    "torch.cuda.memory._dump_snapshot(), which _memory_viz.py and pytorch.org/memory_viz read).\n"
    "IN's format is recognised from its content ('-' reads standard input). OUT's format is\n"
    "--to, or else follows OUT's name:\n"
    "  .pickle .pkl                        PyTorch pickle (protocol 4)\n"
    "  .msnap .msgpack .memsnap            memsnap\n"
    "  .msnap.gz .msgpack.gz .msnapz .gz   memsnap, compressed\n"
    "OUT ('-' is standard output) is written complete or not at all.\n"
    "\n"
    "options:\n"
    "  --to FORMAT  memsnap, memsnap-z (compressed) or pickle\n"
    "  -h, --help   show this help\n";

static bool convert_ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* @return the format named by --to or by the output's name, MS_FORMAT_UNKNOWN if neither. */
static ms_format convert_format(const char *to, const char *out) {
  if (to) {
    if (strcmp(to, "memsnap") == 0) return MS_FORMAT_MEMSNAP;
    if (strcmp(to, "memsnap-z") == 0) return MS_FORMAT_MEMSNAP_Z;
    if (strcmp(to, "pickle") == 0) return MS_FORMAT_PICKLE;
    return MS_FORMAT_UNKNOWN;
  }
  static const struct {
    const char *suffix;
    ms_format f;
  } by_name[] = {
      {".pickle", MS_FORMAT_PICKLE},   {".pkl", MS_FORMAT_PICKLE},
      {".msnap", MS_FORMAT_MEMSNAP},   {".msgpack", MS_FORMAT_MEMSNAP},
      {".memsnap", MS_FORMAT_MEMSNAP}, {".msnapz", MS_FORMAT_MEMSNAP_Z},
      {".gz", MS_FORMAT_MEMSNAP_Z},
  };
  for (size_t i = 0; i < sizeof by_name / sizeof by_name[0]; i++)
    if (convert_ends_with(out, by_name[i].suffix)) return by_name[i].f;
  return MS_FORMAT_UNKNOWN;
}

int cmd_convert(int argc, char **argv) {
  const char *to = NULL;
  const struct cli_opt opts[] = {{"to", 0, NULL, &to}, {NULL, 0, NULL, NULL}};
  char *pos[2];
  int npos = 0;
  int rc = cli_parse_options("convert", convert_usage, opts, argc, argv, pos, 2, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos != 2) return cli_usage_error("convert", "'convert' needs an input and an output file");
  const char *in = pos[0], *out = pos[1];
  ms_format fmt = convert_format(to, out);
  if (fmt == MS_FORMAT_UNKNOWN) {
    if (to)
      return cli_usage_error("convert", "unknown format '%s' (memsnap, memsnap-z or pickle)", to);
    return cli_usage_error("convert", "cannot tell the output format from '%s'; use --to",
                           cli_output_name(out));
  }
  ms_snapshot_t *snap = NULL;
  if (cli_load(in, &snap) != CLI_OK) return CLI_FAILURE;
  cli_out_t o;
  if (cli_out_open(&o, out) != CLI_OK) {
    ms_snapshot_free(snap);
    return CLI_FAILURE;
  }
  ms_errbuf_t eb = {{0}};
  int err;
  cli_progress_start("writing '%s'", cli_output_name(out));
  if (fmt == MS_FORMAT_PICKLE) {
    err = ms_pickle_write(snap, &o.sink, &eb);
  } else {
    ms_write_opts_t wo = {fmt == MS_FORMAT_MEMSNAP_Z ? 6 : 0};
    err = ms_snapshot_write(snap, &wo, &o.sink, &eb);
  }
  cli_progress_stop();
  ms_snapshot_free(snap);
  if (err != MS_OK) return cli_out_fail(&o, err, &eb);
  return cli_out_commit(&o);
}
