/* SPDX-License-Identifier: MIT
 * memsnap: error codes.
 *
 * Every fallible function returns int: MS_OK (0) on success or a negative enum ms_err value.
 * Out-parameters are left untouched on failure. The values below are pinned: new codes are
 * added at the end of the map with new numbers, never renumbered.
 *
 * Functions that can describe a failure in more detail (a parser naming the offset, the OOM
 * message) also fill a caller-provided ms_errbuf_t.
 */
#ifndef MEMSNAP_ERROR_H
#define MEMSNAP_ERROR_H

#include "memsnap/common.h"

MS_EXTERN_C_BEGIN

/* XX(name, value, message) */
#define MS_ERROR_MAP(XX)                                                              \
  XX(NOMEM, -1, "out of host memory")                                                \
  XX(OOM, -2, "out of device memory")                                                \
  XX(INVAL, -3, "invalid argument")                                                  \
  XX(CONFIG, -4, "invalid configuration")                                            \
  XX(IO, -5, "input/output error")                                                   \
  XX(FORMAT, -6, "malformed input")                                                  \
  XX(TRUNCATED, -7, "truncated input")                                               \
  XX(UNSUPPORTED, -8, "unsupported feature or format version")                       \
  XX(LIMIT, -9, "input exceeds a limit")                                             \
  XX(BACKEND, -10, "device backend error")                                           \
  XX(NODEVICE, -11, "no such device")                                                \
  XX(NOTFOUND, -12, "not found")                                                     \
  XX(STATE, -13, "operation not valid in the current state")                         \
  XX(VERSION, -14, "version mismatch")                                               \
  XX(REFUSED, -15, "refused unsafe input")

enum ms_err {
  MS_OK = 0,
#define MS__ERR_ENUM(name, value, msg) MS_E##name = (value),
  MS_ERROR_MAP(MS__ERR_ENUM)
#undef MS__ERR_ENUM
};

/* @return a static English description of err ("unknown error" for unknown values). */
MS_API const char *ms_strerror(int err);
/* @return the static name of err without prefix, e.g. "OOM"; "UNKNOWN" for unknown values. */
MS_API const char *ms_err_name(int err);

/* A caller-owned buffer that receives a one-line description of the last failure of the call it
 * was passed to (no prefix, no trailing newline). msg[0] == 0 when nothing was written. */
typedef struct ms_errbuf_s {
  char msg[512];
} ms_errbuf_t;

MS_EXTERN_C_END

#endif /* MEMSNAP_ERROR_H */
