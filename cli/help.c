/* SPDX-License-Identifier: MIT
 * memsnap CLI: printing a help text within 80 columns (git and argparse keep theirs there).
 *
 * The texts in the commands are written for the eye, and some of their lines are longer than 80
 * columns. Each line is printed as written when it fits; a longer one is broken at its last space
 * within 80 columns, and the rest is carried into the next line when that line continues the same
 * block (prose under prose, an option's description under its description), else printed on a
 * line of its own, indented as the block's continuation lines are:
 *  - "usage: memsnap CMD ..." and "       memsnap CMD ...": under the first argument;
 *  - an option ("  -o, --output OUT  text"): under the description;
 *  - an indented line: at its own indentation; prose: at column 0.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define HELP_COLUMNS 80

/* Display columns of s[0..n): UTF-8 code points. */
static size_t help_width(const char *s, size_t n) {
  size_t w = 0;
  for (size_t i = 0; i < n; i++)
    if (((unsigned char)s[i] & 0xC0) != 0x80) w++;
  return w;
}

static size_t help_lead(const char *s, size_t n) {
  size_t i = 0;
  while (i < n && s[i] == ' ') i++;
  return i;
}

/* The column where a wrapped line of this kind continues. */
static size_t help_indent(const char *s, size_t n) {
  size_t lead = help_lead(s, n);
  if ((n > 7 && strncmp(s, "usage: ", 7) == 0) || (lead == 7 && n > 15 && !strncmp(s + 7, "memsnap ", 8))) {
    size_t i = lead ? lead : 7, words = 0; /* past "memsnap CMD " */
    while (i < n && words < 2) {
      while (i < n && s[i] != ' ') i++;
      while (i < n && s[i] == ' ') i++;
      words++;
    }
    return i < n ? i : lead;
  }
  if (lead >= 1 && lead < n && s[lead] == '-') { /* an option: its description's column */
    const char *gap = NULL;
    for (size_t i = lead; i + 1 < n; i++)
      if (s[i] == ' ' && s[i + 1] == ' ') {
        gap = s + i;
        break;
      }
    if (gap) {
      size_t i = (size_t)(gap - s);
      while (i < n && s[i] == ' ') i++;
      if (i < n) return i;
    }
  }
  return lead;
}

/* Whether line (s, n) continues a block wrapped at indent: same indentation, not a new option,
 * heading, list item or blank line. */
static bool help_continues(const char *s, size_t n, size_t indent, bool usage) {
  size_t lead = help_lead(s, n);
  if (lead != indent || lead == n) return false;
  char c = s[lead];
  if (usage) return c == '[';
  if (c == '-' || c == '[' || c == '|') return false;
  if (indent == 0 && !(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && c != '(' && c != '`')
    return false;
  if (s[n - 1] == ':' && !memchr(s, ' ', n)) return false; /* "options:" */
  return true;
}

static bool help_is_usage(const char *s, size_t n) {
  return (n > 7 && strncmp(s, "usage: ", 7) == 0) ||
         (n > 15 && strncmp(s, "       memsnap ", 15) == 0);
}

void cli_print_help(const char *text, FILE *fp) {
  char *carry = NULL; /* text carried into the next line */
  size_t carry_indent = 0;
  bool carry_usage = false;
  const char *p = text;
  while (*p || carry) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    char *line;
    bool merged_usage = false;
    if (carry && n > 0 && help_continues(p, n, carry_indent, carry_usage)) {
      merged_usage = carry_usage;
      size_t lead = help_lead(p, n), cl = strlen(carry);
      line = malloc(lead + cl + 1 + (n - lead) + 1);
      if (!line) break;
      memset(line, ' ', lead);
      memcpy(line + lead, carry, cl);
      line[lead + cl] = ' ';
      memcpy(line + lead + cl + 1, p + lead, n - lead);
      n = lead + cl + 1 + (n - lead);
      line[n] = 0;
      p = nl ? nl + 1 : p + n;
    } else if (carry) { /* the carried text on a line of its own */
      size_t cl = strlen(carry);
      line = malloc(carry_indent + cl + 1);
      if (!line) break;
      memset(line, ' ', carry_indent);
      memcpy(line + carry_indent, carry, cl + 1);
      n = carry_indent + cl;
    } else {
      if (!*p) break;
      line = malloc(n + 1);
      if (!line) break;
      memcpy(line, p, n);
      line[n] = 0;
      p = nl ? nl + 1 : p + n;
    }
    free(carry);
    carry = NULL;
    if (help_width(line, n) > HELP_COLUMNS) {
      size_t indent = help_indent(line, n);
      carry_usage = merged_usage || help_is_usage(line, n);
      if (carry_usage) { /* under the usage's own continuation lines, when it has some */
        const char *nx = strchr(p, '\n');
        size_t nn = nx ? (size_t)(nx - p) : strlen(p), lead = help_lead(p, nn);
        if (lead > 0 && lead < nn && p[lead] == '[') indent = lead;
      }
      /* the last space within the limit, past the indentation and the option's own name */
      size_t cut = 0, cols = 0;
      for (size_t i = 0; i < n && cols <= HELP_COLUMNS; i++) {
        /* a usage is broken between its [options], not inside one */
        if (line[i] == ' ' && i > indent && cols <= HELP_COLUMNS &&
            (!carry_usage || (i + 1 < n && line[i + 1] == '[')))
          cut = i;
        if (((unsigned char)line[i] & 0xC0) != 0x80) cols++;
      }
      if (cut) {
        size_t rest = cut;
        while (rest < n && line[rest] == ' ') rest++;
        while (cut > 0 && line[cut - 1] == ' ') cut--;
        carry = strdup(line + rest);
        carry_indent = indent;
        n = cut;
      }
    }
    fwrite(line, 1, n, fp);
    fputc('\n', fp);
    free(line);
  }
  free(carry);
}
