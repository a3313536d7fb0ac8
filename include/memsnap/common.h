/* SPDX-License-Identifier: MIT
 * memsnap: common macros shared by every public header.
 *
 * This header defines the export and attribute macros (MS_API, MS_NODISCARD, MS_PRINTF), the
 * output hook through which the library reports warnings and errors (it never writes to stdout
 * or stderr on its own), and the version of the library.
 */
#ifndef MEMSNAP_COMMON_H
#define MEMSNAP_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define MS_EXTERN_C_BEGIN extern "C" {
#define MS_EXTERN_C_END }
#else
#define MS_EXTERN_C_BEGIN
#define MS_EXTERN_C_END
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MS_API __attribute__((visibility("default")))
#define MS_NODISCARD __attribute__((warn_unused_result))
#define MS_PRINTF(fmt, first) __attribute__((format(printf, fmt, first)))
#else
#define MS_API
#define MS_NODISCARD
#define MS_PRINTF(fmt, first)
#endif

#define MS_VERSION_MAJOR 0
#define MS_VERSION_MINOR 1
#define MS_VERSION_PATCH 0
/* MS_VERSION = major*10000 + minor*100 + patch. */
#define MS_VERSION (MS_VERSION_MAJOR * 10000 + MS_VERSION_MINOR * 100 + MS_VERSION_PATCH)

MS_EXTERN_C_BEGIN

/* @return MS_VERSION of the library actually linked (may differ from the header's). */
MS_API int ms_version(void);
/* @return the version as "major.minor.patch"; static storage. */
MS_API const char *ms_version_string(void);

/* Receives every message the library emits: one complete line without the trailing newline,
 * already prefixed with "memsnap: warning: " or "memsnap: error: ".
 * Thread-safety: may be called from any thread that calls into the library. */
typedef void ms_output_fn(const char *msg, void *arg);

/* Installs the output hook; NULL restores the default (write the line to stderr).
 * Thread-safety: call before other threads use the library. */
MS_API void ms_set_output(ms_output_fn *fn, void *arg);

MS_EXTERN_C_END

#endif /* MEMSNAP_COMMON_H */
