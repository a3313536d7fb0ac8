/* SPDX-License-Identifier: MIT
 * libFuzzer target for the allocator configuration parser (memsnap/config.h): the strings of
 * MEMSNAP_ALLOC_CONF and of `memsnap replay --config` (issue #16 item 25). The input is the
 * configuration string (a NUL ends it early). For every input:
 *  - parsed on PyTorch's defaults and on a non-default base (as replay --config parses on top of
 *    the recorded settings): MS_OK, or MS_ECONFIG with a message and the struct untouched;
 *  - an accepted configuration validates, formats to its canonical string, and that string parses
 *    back to the same fields; parsing it a second time gives the same result (the re-parse resets);
 *  - through the environment (ms_alloc_config_from_env, one input in 16) it gives the same
 *    result, the message prefixed by "MEMSNAP_ALLOC_CONF: ";
 *  - an accepted configuration makes a small allocator (sim backend, 64 MiB), unless expandable
 *    pages are not whole multiples of 2 MiB (refused, with the reason), and drives it through
 *    a fixed workload: every call answers MS_OK or MS_EOOM; after the last free nothing is
 *    allocated and no more than the device is reserved.
 *
 * Built and run by scripts/fuzz.sh (make fuzz); seeds in tests/fuzz/corpus/fuzz_alloc_conf/.
 * fuzz-flags: -max_len=2048 -dict=tests/fuzz/alloc_conf.dict
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "memsnap/allocator.h"
#include "memsnap/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every field but last_allocator_settings (compared field by field: padding is not data). */
static int conf_same(const ms_alloc_config_t *a, const ms_alloc_config_t *b) {
  return a->max_split_size == b->max_split_size &&
         a->max_non_split_rounding_size == b->max_non_split_rounding_size &&
         a->large_segment_size == b->large_segment_size &&
         a->garbage_collection_threshold == b->garbage_collection_threshold &&
         memcmp(a->roundup_power2_divisions, b->roundup_power2_divisions,
                sizeof a->roundup_power2_divisions) == 0 &&
         a->per_process_memory_fraction == b->per_process_memory_fraction &&
         a->expandable_segments == b->expandable_segments &&
         a->release_lock_on_cudamalloc == b->release_lock_on_cudamalloc &&
         a->graph_capture_record_stream_reuse == b->graph_capture_record_stream_reuse &&
         a->pinned_use_cuda_host_register == b->pinned_use_cuda_host_register &&
         a->pinned_use_background_threads == b->pinned_use_background_threads &&
         a->pinned_num_register_threads == b->pinned_num_register_threads &&
         a->pinned_reserve_segment_size == b->pinned_reserve_segment_size;
}

/* Parses str on top of base; checks the contract. @return MS_OK or the error; *out the result. */
static int conf_parse(const ms_alloc_config_t *base, const char *str, ms_alloc_config_t *out,
                      ms_errbuf_t *eb) {
  ms_alloc_config_t c = *base;
  eb->msg[0] = 0;
  int rc = ms_alloc_config_parse(&c, str, eb);
  if (rc != MS_OK) {
    FZ_CHECK(rc == MS_ECONFIG, "parse returned %d", rc);
    FZ_DESCRIBED(rc, *eb);
    FZ_CHECK(memcmp(&c, base, sizeof c) == 0, "a failed parse changed the struct ('%s')", str);
    return rc;
  }
  ms_errbuf_t vb = {{0}};
  FZ_CHECK(ms_alloc_config_validate(&c, &vb) == MS_OK, "'%s' accepted but invalid: %s", str,
           vb.msg);
  FZ_CHECK(strcmp(c.last_allocator_settings, str) == 0,
           "last_allocator_settings is not the string");
  *out = c;
  return MS_OK;
}

/* The canonical string of c parses back to c; so does parsing it twice. */
static void conf_roundtrip(const ms_alloc_config_t *c) {
  char canon[4096];
  int n = ms_alloc_config_format(c, canon, sizeof canon);
  FZ_CHECK(n >= 0, "format failed (%d) on an accepted configuration", n);
  ms_alloc_config_t fresh, back, twice;
  ms_alloc_config_init(&fresh);
  ms_errbuf_t eb;
  FZ_CHECK(conf_parse(&fresh, canon, &back, &eb) == MS_OK, "canonical '%s' refused: %s", canon,
           eb.msg);
  FZ_CHECK(conf_same(c, &back), "canonical '%s' parses to other fields", canon);
  FZ_CHECK(conf_parse(&back, canon, &twice, &eb) == MS_OK && conf_same(&back, &twice),
           "canonical '%s' parsed twice differs", canon);
}

/* A fixed workload on a 64 MiB simulated device under c. */
static void conf_drive(const ms_alloc_config_t *c) {
  ms_sim_config_t sc = {1, (size_t)64 << 20, false, true, 0};
  ms_backend_t *be = NULL;
  FZ_CHECK(ms_backend_sim_create(&sc, &be) == MS_OK, "sim backend");
  ms_allocator_config_t ac = {be, 0, c, false};
  ms_allocator_t *a = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms_allocator_create(&ac, &a, &eb);
  if (rc == MS_ECONFIG && c->expandable_segments && c->large_segment_size % ((size_t)2 << 20)) {
    /* expandable pages must be multiples of the device's granularity (2 MiB on the sim) */
    FZ_CHECK(strstr(eb.msg, "granularity") != NULL, "refused without the reason: %s", eb.msg);
    ms_backend_destroy(be);
    return;
  }
  FZ_CHECK(rc == MS_OK, "allocator refused an accepted configuration: %s", eb.msg);
  static const size_t sizes[] = {1,        511,           513,     4096,
                                 1 << 20,  (1 << 20) + 1, 3 << 20, (10 << 20) - 1,
                                 10 << 20, 21 << 20,      100,     70 << 20};
  ms_devptr_t p[sizeof sizes / sizeof *sizes] = {0};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    rc = ms_allocator_malloc(a, sizes[i], (ms_stream_t)(i % 2), &p[i]);
    FZ_CHECK(rc == MS_OK || rc == MS_EOOM, "malloc(%zu) returned %d", sizes[i], rc);
    if (i % 3 == 2 && p[i - 1]) {
      FZ_CHECK(ms_allocator_free(a, p[i - 1]) == MS_OK, "free");
      p[i - 1] = 0;
    }
  }
  for (size_t i = 0; i < sizeof p / sizeof *p; i++)
    if (p[i]) FZ_CHECK(ms_allocator_free(a, p[i]) == MS_OK, "free");
  ms_stats_t st;
  ms_stats_init(&st);
  FZ_CHECK(ms_allocator_get_stats(a, &st) == MS_OK, "stats");
  int64_t alloc = -1, reserved = -1;
  FZ_CHECK(ms_stats_get(&st, "allocated_bytes.all.current", &alloc) == MS_OK &&
               ms_stats_get(&st, "reserved_bytes.all.current", &reserved) == MS_OK,
           "stats names");
  FZ_CHECK(alloc == 0, "%lld bytes still allocated after every free", (long long)alloc);
  FZ_CHECK(reserved >= 0 && reserved <= (int64_t)64 << 20, "%lld bytes reserved on 64 MiB",
           (long long)reserved);
  FZ_CHECK(ms_allocator_empty_cache(a) == MS_OK, "empty_cache");
  ms_allocator_destroy(a);
  ms_backend_destroy(be);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *str = fz_cstr(fz_in(data, size), MS_ALLOC_CONF_MAX + 63);
  if (!str) return 0;
  if (size > MS_ALLOC_CONF_MAX + 63) size = MS_ALLOC_CONF_MAX + 63;

  ms_alloc_config_t def, base, c1, c2;
  ms_alloc_config_init(&def);
  ms_errbuf_t eb;
  FZ_CHECK(ms_alloc_config_parse(&def, "", &eb) == MS_OK, "empty string refused");
  /* the base that replay --config parses on: a recorded run's non-default settings */
  ms_alloc_config_init(&base);
  FZ_CHECK(ms_alloc_config_parse(&base,
                                 "expandable_segments:True,large_segment_size_mb:64,"
                                 "pinned_num_register_threads:8,max_split_size_mb:256",
                                 &eb) == MS_OK,
           "base refused: %s", eb.msg);
  ms_alloc_config_t def0 = def;
  int rc1 = conf_parse(&def, str, &c1, &eb);
  char msg1[sizeof eb.msg];
  memcpy(msg1, eb.msg, sizeof msg1);
  (void)conf_parse(&base, str, &c2, &eb);
  if (rc1 == MS_OK) {
    conf_roundtrip(&c1);
    conf_drive(&c1);
  }
  /* The environment gives the same answer, the message prefixed. One input in 16: glibc keeps
   * every string ever given to setenv (getenv's pointers stay valid), so memory grows with it. */
  if ((size + (size ? data[0] : 0u)) % 16 == 0 && setenv(MS_ALLOC_CONF_ENV, str, 1) == 0) {
    ms_alloc_config_t e = def0;
    ms_errbuf_t ee = {{0}};
    int rce = ms_alloc_config_from_env(&e, &ee);
    FZ_CHECK(rce == rc1, "from_env %d, parse %d", rce, rc1);
    if (rce == MS_OK)
      FZ_CHECK(conf_same(&e, &c1), "from_env gives other fields");
    else {
      char want[sizeof ee.msg + 32];
      snprintf(want, sizeof want, "MEMSNAP_ALLOC_CONF: %s", msg1);
      size_t got = strlen(ee.msg);
      FZ_CHECK(strncmp(ee.msg, want, got) == 0 && (got == strlen(want) || got == sizeof ee.msg - 1),
               "from_env message '%s' vs '%s'", ee.msg, want);
    }
    unsetenv(MS_ALLOC_CONF_ENV);
  }
  free(str);
  return 0;
}
