/* SPDX-License-Identifier: MIT
 * libFuzzer target for the values of `memsnap replay --capacity SIZE` and `--sweep SPEC`
 * (memsnap/replay.h: ms_replay_parse_capacity, ms_replay_sweep_parse; issue #16 item 25). The
 * input is the option's value (a NUL ends it early), given to both parsers as the CLI gives it:
 *  - capacity: MS_OK with a size >= 1 only for text of the documented grammar (digits, optional
 *    fraction, optional K/M/G/T[iB] or B), with the exact value for whole numbers; otherwise an
 *    error with a message and the out-parameter untouched;
 *  - sweep: MS_OK with 1 to 256 configurations, each no longer than the spec, each then given to
 *    ms_alloc_config_parse as `replay` does; otherwise an error with a message and *out
 *    untouched.
 *
 *  - a limit of `memsnap check --limit` (memsnap/compare.h: ms_gate_limit_parse, issue #28): MS_OK
 *    only with a known figure, an operator, and a value whose sign says relative, '%' only when
 *    relative; otherwise MS_EINVAL or MS_ENOTFOUND with a message and *out untouched; and
 *    ms_gate_holds never fails on what it parsed.
 *
 * Built and run by scripts/fuzz.sh (make fuzz); seeds in tests/fuzz/corpus/fuzz_cli_values/.
 * fuzz-flags: -max_len=1100
 */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "memsnap/compare.h"
#include "memsnap/config.h"
#include "memsnap/replay.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The grammar, independently: the shift of the unit, or -1 when s is not a size. */
static int capacity_shape(const char *s, int *has_frac) {
  const char *q = s;
  if (!isdigit((unsigned char)*q)) return -1;
  while (isdigit((unsigned char)*q))
    q++;
  *has_frac = 0;
  if (*q == '.') {
    q++;
    if (!isdigit((unsigned char)*q)) return -1;
    while (isdigit((unsigned char)*q))
      q++;
    *has_frac = 1;
  }
  int shift = 0;
  const char *units = "KMGT";
  const char *u = *q ? strchr(units, toupper((unsigned char)*q)) : NULL;
  if (u) {
    shift = 10 * (int)(u - units + 1);
    q++;
    if ((q[0] == 'i' || q[0] == 'I') && (q[1] == 'B' || q[1] == 'b'))
      q += 2;
    else if (*q == 'B' || *q == 'b')
      q++;
  } else if (*q == 'B' || *q == 'b') {
    q++;
  }
  return *q ? -1 : shift;
}

static void fuzz_capacity(const char *s) {
  size_t v = 12345;
  ms_errbuf_t eb = {{0}};
  int rc = ms_replay_parse_capacity(s, &v, &eb);
  int frac = 0, shift = capacity_shape(s, &frac);
  if (rc != MS_OK) {
    FZ_CHECK(rc == MS_EINVAL || rc == MS_ELIMIT, "capacity: returned %d", rc);
    FZ_DESCRIBED(rc, eb);
    FZ_CHECK(v == 12345, "capacity: out-parameter set on failure");
    if (shift >= 0 && !frac) {
      /* a whole number refused: zero or too large */
      uint64_t w = 0;
      int big = 0;
      for (const char *q = s; isdigit((unsigned char)*q); q++) {
        unsigned d = (unsigned)(*q - '0');
        if (w > (UINT64_MAX - d) / 10)
          big = 1;
        else
          w = w * 10 + d;
      }
      FZ_CHECK(w == 0 || big || w > (UINT64_MAX >> shift), "capacity '%s' refused: %s", s, eb.msg);
    }
    return;
  }
  FZ_CHECK(shift >= 0, "capacity '%s' accepted outside the grammar", s);
  FZ_CHECK(v >= 1, "capacity '%s' accepted as 0 bytes", s);
  if (!frac) {
    unsigned long long w = strtoull(s, NULL, 10);
    FZ_CHECK((uint64_t)v == (uint64_t)w << shift, "capacity '%s' = %zu", s, v);
  } else {
    /* between the whole part's size and the next unit's */
    unsigned long long w = strtoull(s, NULL, 10);
    FZ_CHECK((uint64_t)v >= (uint64_t)w << shift && (uint64_t)v <= ((uint64_t)w + 1) << shift,
             "capacity '%s' = %zu", s, v);
  }
}

static void fuzz_sweep(const char *s) {
  ms_replay_sweep_t sw = {777, NULL};
  ms_errbuf_t eb = {{0}};
  int rc = ms_replay_sweep_parse(s, &sw, &eb);
  if (rc != MS_OK) {
    FZ_CHECK(rc == MS_EINVAL || rc == MS_ELIMIT || rc == MS_ENOMEM, "sweep: returned %d", rc);
    FZ_DESCRIBED(rc, eb);
    FZ_CHECK(sw.n == 777 && sw.configs == NULL, "sweep: out-parameter set on failure");
    return;
  }
  FZ_CHECK(sw.n >= 1 && sw.n <= 256 && sw.configs, "sweep: %zu configurations", sw.n);
  size_t len = strlen(s);
  for (size_t i = 0; i < sw.n; i++) {
    FZ_CHECK(sw.configs[i] && strlen(sw.configs[i]) <= len,
             "sweep: configuration %zu longer than the spec", i);
    FZ_CHECK(strchr(sw.configs[i], ':') != NULL, "sweep: configuration '%s' without a key",
             sw.configs[i]);
    ms_alloc_config_t c;
    ms_alloc_config_init(&c);
    ms_errbuf_t ce = {{0}};
    int r = ms_alloc_config_parse(&c, sw.configs[i], &ce);
    FZ_CHECK(r == MS_OK || (r == MS_ECONFIG && ce.msg[0]), "sweep: config parse %d", r);
  }
  ms_replay_sweep_release(&sw);
  FZ_CHECK(sw.n == 0 && sw.configs == NULL, "sweep: release did not zero");
}

static void fuzz_limit(const char *s) {
  ms_gate_limit_t l, keep;
  memset(&l, 0x5a, sizeof l);
  keep = l;
  ms_errbuf_t eb = {{0}};
  int rc = ms_gate_limit_parse(s, &l, &eb);
  if (rc != MS_OK) {
    FZ_CHECK(rc == MS_EINVAL || rc == MS_ENOTFOUND, "limit: unexpected error %d", rc);
    FZ_DESCRIBED(rc, eb);
    FZ_CHECK(memcmp(&l, &keep, sizeof l) == 0, "limit: out-parameter set on failure");
    return;
  }
  FZ_CHECK((int)l.figure >= 0 && l.figure < MS_FIG_COUNT, "limit: figure %d", (int)l.figure);
  FZ_CHECK(strpbrk(s, "<>") != NULL, "limit: accepted without an operator");
  FZ_CHECK(!l.percent || l.relative, "limit: an absolute percentage");
  FZ_CHECK(l.relative || l.value >= 0, "limit: a negative absolute bound");
  FZ_CHECK(strncmp(l.text, s, sizeof l.text - 1) == 0, "limit: text not kept");
  uint64_t bound = 0;
  (void)ms_gate_holds(&l, UINT64_MAX, UINT64_MAX, &bound);
  (void)ms_gate_holds(&l, 0, 0, &bound);
  FZ_CHECK(l.relative || bound == (uint64_t)l.value, "limit: absolute bound %llu",
           (unsigned long long)bound);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = fz_cstr(fz_in(data, size), 0);
  if (!s) return 0;
  fuzz_capacity(s);
  fuzz_sweep(s);
  fuzz_limit(s);
  free(s);
  return 0;
}
