/* SPDX-License-Identifier: MIT
 * memsnap: run-time options read lazily from the environment (style §6, after mimalloc's
 * options.c).
 *
 * Each option has a name NAME, an environment variable MS_<NAME> and a default. The variable is
 * read the first time the option is asked for (or by ms_options_init); ms_option_set overrides
 * it. Booleans accept 1/TRUE/YES/ON and 0/FALSE/NO/OFF (any case, surrounding blanks ignored).
 * An invalid value produces one warning through the output hook and keeps the default.
 *
 * The table is deliberately small: an option exists only when something in memsnap reads it.
 * Allocator settings are not options: they live in MEMSNAP_ALLOC_CONF (memsnap/config.h).
 *
 * Thread-safety: every function may be called from any thread. Setting an option while another
 * thread reads it is safe; which value that reader sees is unspecified.
 */
#ifndef MEMSNAP_OPTIONS_H
#define MEMSNAP_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "memsnap/common.h"

MS_EXTERN_C_BEGIN

typedef enum ms_option_e {
  /* MS_VERBOSE (bool, default off): ms_options_print() lists every option. */
  MS_OPTION_VERBOSE = 0,
  /* MS_TRACE_ERRORS (bool, default off): debug builds (MS_DEBUG >= 1) report the file and line
   * of every error return inside the library through the output hook. */
  MS_OPTION_TRACE_ERRORS,
  /* MS_REUSE_MEMORY (bool, default off; the memsnap command turns it on): large arrays the
   * library frees (1 MiB and more: a read's working tables, the time index's) are kept, and its
   * next large arrays take their pages, already resident, instead of fresh ones that the kernel
   * must zero (a third of the CPU time of indexing a 1 GB pickle). What is kept is held until the
   * process exits or the option is turned off (the next large allocation or free then gives it
   * all back): for short-lived processes. */
  MS_OPTION_REUSE_MEMORY,
  MS_OPTION_LAST /* number of options; not an option */
} ms_option_t;

/* @return the option's value (0/1 for booleans, bytes for sizes), reading MS_<NAME> on first use.
 * pre: option < MS_OPTION_LAST (an unknown option returns 0). */
MS_API int64_t ms_option_get(ms_option_t option);

/* @return ms_option_get(option) != 0. */
MS_API bool ms_option_is_enabled(ms_option_t option);

/* Sets the value; the environment is no longer consulted for this option. */
MS_API void ms_option_set(ms_option_t option, int64_t value);

/* Changes the default; has an effect only before the option is first read (the environment
 * still wins over it). */
MS_API void ms_option_set_default(ms_option_t option, int64_t value);

/* @return the option's name without prefix, e.g. "verbose" (static storage; NULL if unknown). */
MS_API const char *ms_option_name(ms_option_t option);

/* Reads every option from the environment now (otherwise each is read on first use). */
MS_API void ms_options_init(void);

/* In verbose mode (MS_VERBOSE), writes one line per option through the output hook:
 * "memsnap: option 'verbose': 1 (MS_VERBOSE)". Does nothing otherwise. */
MS_API void ms_options_print(void);

MS_EXTERN_C_END

#endif /* MEMSNAP_OPTIONS_H */
