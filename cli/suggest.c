/* SPDX-License-Identifier: MIT
 * memsnap CLI: "did you mean" (git's help.c, help_unknown_cmd): the candidate nearest to what the
 * user typed, by the optimal-string-alignment distance (an insertion, a deletion, a substitution
 * or a swap of two neighbours each count one), suggested only when it is near enough to be a typo
 * and no other candidate is as near. */
#include <stddef.h>
#include <string.h>

#include "cli.h"

/* The distance between a[0..n) and b[0..m), both at most 63 bytes (longer: SIZE_MAX). */
static size_t suggest_distance(const char *a, size_t n, const char *b, size_t m) {
  enum { MAX = 64 };
  if (n >= MAX || m >= MAX) return (size_t)-1;
  size_t d[MAX][MAX];
  for (size_t i = 0; i <= n; i++) d[i][0] = i;
  for (size_t j = 0; j <= m; j++) d[0][j] = j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      size_t v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  return d[n][m];
}

const char *cli_suggest(const char *typed, size_t len, const char *const *cands, size_t n) {
  /* a typo of one or two characters, but not a word of two replaced wholesale */
  size_t limit = len <= 3 ? 1 : 2;
  size_t best = (size_t)-1;
  const char *pick = NULL;
  bool tie = false;
  for (size_t i = 0; i < n; i++) {
    if (!cands[i]) continue;
    size_t dist = suggest_distance(typed, len, cands[i], strlen(cands[i]));
    if (dist < best) {
      best = dist;
      pick = cands[i];
      tie = false;
    } else if (dist == best && pick && strcmp(pick, cands[i]) != 0) {
      tie = true;
    }
  }
  return best <= limit && !tie ? pick : NULL;
}
