/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap cache [--clear]` (issue #33): where the snapshot cache is, how many
 * entries it holds and how big they are, its bound; --clear empties it.
 */
#include <inttypes.h>
#include <stdio.h>

#include "cli.h"
#include "memsnap/cache.h"
#include "memsnap/error.h"

static const char cache_usage[] =
    "usage: memsnap cache [--clear]\n"
    "\n"
    "Shows the snapshot cache: its directory ($XDG_CACHE_HOME/memsnap, else ~/.cache/memsnap),\n"
    "its entries and their size, and its bound (MEMSNAP_CACHE_MAX, default 4G; the least\n"
    "recently used entries are evicted beyond it). The first command on a snapshot file stores\n"
    "what it read there; later commands on the same bytes read that instead of the file.\n"
    "MEMSNAP_CACHE=0 or any command's --no-cache leaves the cache alone.\n"
    "\n"
    "options:\n"
    "  --clear     remove every entry\n"
    "  -h, --help  show this help\n";

int cmd_cache(int argc, char **argv) {
  int clear = 0;
  const struct cli_opt opts[] = {{"clear", 0, &clear, NULL}, {NULL, 0, NULL, NULL}};
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options("cache", cache_usage, opts, argc, argv, pos, 0, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  char dir[4096];
  if (ms_cache_dir(dir, sizeof dir) != MS_OK) {
    cli_error("no cache directory: set XDG_CACHE_HOME or HOME");
    return CLI_FAILURE;
  }
  if (clear) {
    size_t removed = 0;
    if (ms_cache_clear(dir, &removed) != MS_OK) {
      cli_error("cannot clear the cache '%s'", dir);
      return CLI_FAILURE;
    }
    printf("removed %zu cache %s from %s\n", removed, removed == 1 ? "entry" : "entries", dir);
    return CLI_OK;
  }
  size_t n = 0;
  uint64_t bytes = 0;
  if (ms_cache_usage(dir, &n, &bytes) != MS_OK) {
    cli_error("cannot read the cache '%s'", dir);
    return CLI_FAILURE;
  }
  char b1[CLI_BYTES_BUFSZ], b2[CLI_BYTES_BUFSZ];
  printf("directory: %s\n", dir);
  printf("entries:   %zu\n", n);
  printf("size:      %s (%" PRIu64 " bytes)\n", cli_format_ubytes(bytes, b1), bytes);
  printf("bound:     %s\n", cli_format_ubytes(ms_cache_max_bytes(), b2));
  printf("enabled:   %s\n", ms_cache_env_enabled() ? "yes" : "no (MEMSNAP_CACHE)");
  return CLI_OK;
}
