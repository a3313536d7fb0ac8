/* SPDX-License-Identifier: MIT
 * memsnap CLI: the command table and shared helpers (git's builtin.h pattern).
 *
 * Adding a subcommand (docs/adding-a-subcommand.md): write cli/cmd-<name>.c with
 * `int cmd_<name>(int argc, char **argv)` returning an exit status, declare it below, add a row
 * to the table in main.c, add the file to cli/CMakeLists.txt, document it in docs/cli.md and
 * test it in tests/test_cli*.c.
 */
#ifndef MEMSNAP_CLI_H
#define MEMSNAP_CLI_H

#include <stdio.h>

#include "memsnap/common.h"

enum cli_exit {
  CLI_OK = 0,      /* success */
  CLI_FAILURE = 1, /* run-time failure */
  CLI_USAGE = 2,   /* usage error (as argparse) */
};

struct cli_cmd {
  const char *name;
  int (*fn)(int argc, char **argv); /* argv[0] is the subcommand's name */
  const char *summary;              /* one line for `memsnap --help` */
};

/* Subcommands (cli/cmd-<name>.c). */
int cmd_help(int argc, char **argv);
int cmd_version(int argc, char **argv);

/* The table, NULL-terminated (main.c). */
extern const struct cli_cmd cli_commands[];
/* @return the command named name, or NULL. */
const struct cli_cmd *cli_find_command(const char *name);

/* Messages in git's style, to stderr: "memsnap: error: ..." / "memsnap: warning: ...". */
void cli_error(const char *fmt, ...) MS_PRINTF(1, 2);
void cli_warning(const char *fmt, ...) MS_PRINTF(1, 2);
/* Prints "memsnap: error: <msg>" and a hint to run `memsnap CMD --help`; @return CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) MS_PRINTF(2, 3);

#endif /* MEMSNAP_CLI_H */
