/* SPDX-License-Identifier: MIT
 * memsnap CLI: what the commands share about categories and sources (issue #27,
 * memsnap/attribution.h): reading a --categories rules file, building the classifier with a
 * clear error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/attribution.h"

/* Reads at most max + 1 bytes of path (so that "too big" is seen without reading it all). */
static int cli_rules_read(const char *path, size_t max, char **out, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    cli_error("cannot read the rules file '%s': %s", path, strerror(errno));
    return CLI_FAILURE;
  }
  char *buf = malloc(max + 2);
  if (!buf) {
    fclose(fp);
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  size_t n = fread(buf, 1, max + 1, fp);
  int bad = ferror(fp);
  fclose(fp);
  if (bad) {
    free(buf);
    cli_error("cannot read the rules file '%s'", path);
    return CLI_FAILURE;
  }
  buf[n] = 0;
  *out = buf;
  *len = n;
  return CLI_OK;
}

int cli_attr_open(const ms_snapshot_t *snap, const ms_timeline_t *tl, const char *rules_path,
                  ms_attr_t **out) {
  ms_attr_config_t cfg;
  ms_attr_config_init(&cfg);
  char *text = NULL;
  if (rules_path) {
    size_t len;
    /* one byte more than the library takes, so that it names the limit */
    int rc = cli_rules_read(rules_path, (1u << 20), &text, &len);
    if (rc != CLI_OK) return rc;
    cli_note_input(rules_path);
    cfg.rules = text;
    cfg.rules_len = len;
    cfg.rules_name = rules_path;
  }
  ms_errbuf_t eb = {{0}};
  int err = ms_attr_create(snap, tl, &cfg, out, &eb);
  free(text);
  if (err != MS_OK) {
    cli_error("%s", eb.msg[0] ? eb.msg : ms_strerror(err));
    return CLI_FAILURE;
  }
  return CLI_OK;
}

bool cli_attr_by_parse(const char *s, ms_attr_by *by) {
  static const char *const names[] = {"category", "source", "stack"};
  for (int i = 0; i < 3; i++)
    if (strcmp(s, names[i]) == 0) {
      *by = (ms_attr_by)i;
      return true;
    }
  return false;
}
