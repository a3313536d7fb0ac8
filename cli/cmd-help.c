/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap help`, `memsnap version`, the list of commands and "did you mean" for a
 * mistyped command. The command table itself is main.c's: main() hands it over through
 * cli_command_table before dispatching, so that this file never calls back into main.c.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "memsnap/common.h"

const struct cli_cmd *cli_command_table;

const struct cli_cmd *cli_find_command(const char *name) {
  for (const struct cli_cmd *c = cli_command_table; c && c->name; c++)
    if (strcmp(c->name, name) == 0) return c;
  return NULL;
}

/* "'stat' is not a memsnap command; did you mean 'stats'?" (git's help_unknown_cmd). */
int cli_unknown_command(const char *name) {
  const char *names[64] = {NULL};
  size_t n = 0;
  for (const struct cli_cmd *c = cli_command_table; c && c->name && n < 64; c++) names[n++] = c->name;
  const char *s = cli_suggest(name, strlen(name), names, n);
  if (!s) /* a prefix of one command alone: `memsnap seg` */
    for (size_t i = 0; i < n; i++)
      if (strncmp(names[i], name, strlen(name)) == 0) {
        if (s) {
          s = NULL;
          break;
        }
        s = names[i];
      }
  if (s) return cli_usage_error(NULL, "'%s' is not a memsnap command; did you mean '%s'?", name, s);
  return cli_usage_error(NULL, "'%s' is not a memsnap command", name);
}

void cli_main_usage(FILE *fp) {
  fprintf(fp,
          "usage: memsnap [--version] [--help] <command> [<args>]\n"
          "\n"
          "GPU memory snapshots: statistics, traces and interactive flame graphs, for\n"
          "memsnap snapshots and PyTorch's torch.cuda.memory._dump_snapshot() pickles.\n"
          "\n"
          "commands:\n");
  for (const struct cli_cmd *c = cli_command_table; c && c->name; c++)
    fprintf(fp, "   %-13s %s\n", c->name, c->summary); /* segment_plot and two spaces */
  fprintf(fp, "\nRun 'memsnap help <command>' (or 'memsnap <command> --help') for its options.\n");
}

static const char version_usage[] =
    "usage: memsnap version\n"
    "\n"
    "Prints memsnap's version, e.g. `memsnap 1.2.3` (also `memsnap --version`, `memsnap -V`).\n"
    "\n"
    "options:\n"
    "  -h, --help  show this help\n";

static const char help_usage[] =
    "usage: memsnap help [COMMAND]\n"
    "\n"
    "Without COMMAND, lists memsnap's commands; with one, prints its help, exactly what\n"
    "`memsnap COMMAND --help` prints.\n"
    "\n"
    "options:\n"
    "  -h, --help  show this help\n";

static bool is_help_option(const char *a) {
  return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

int cmd_version(int argc, char **argv) {
  if (argc == 2 && is_help_option(argv[1])) {
    cli_print_help(version_usage, stdout);
    return CLI_OK;
  }
  if (argc > 1) return cli_usage_error("version", "'version' takes no arguments");
  printf("memsnap %s\n", ms_version_string());
  return CLI_OK;
}

int cmd_help(int argc, char **argv) {
  if (argc < 2) {
    cli_main_usage(stdout);
    return CLI_OK;
  }
  for (int i = 1; i < argc; i++)
    if (is_help_option(argv[i])) {
      cli_print_help(help_usage, stdout);
      return CLI_OK;
    }
  if (argc > 2) return cli_usage_error("help", "'help' takes at most one command name");
  const struct cli_cmd *c = cli_find_command(argv[1]);
  if (!c) return cli_unknown_command(argv[1]);
  if (c->fn == cmd_help) { /* `memsnap help help` = `memsnap help --help` */
    cli_print_help(help_usage, stdout);
    return CLI_OK;
  }
  char *sub[] = {argv[1], "--help", NULL};
  return c->fn(2, sub);
}
