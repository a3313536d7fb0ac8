/* SPDX-License-Identifier: MIT
 * memsnap core: ms_strerror() and ms_err_name(), generated from MS_ERROR_MAP. */
#include "memsnap/error.h"

const char *ms_strerror(int err) {
  switch (err) {
  case MS_OK:
    return "success";
#define MS__ERR_STR(name, value, msg) \
  case MS_E##name:                    \
    return msg;
    MS_ERROR_MAP(MS__ERR_STR)
#undef MS__ERR_STR
  default:
    return "unknown error";
  }
}

const char *ms_err_name(int err) {
  switch (err) {
  case MS_OK:
    return "OK";
#define MS__ERR_NAME(name, value, msg) \
  case MS_E##name:                     \
    return #name;
    MS_ERROR_MAP(MS__ERR_NAME)
#undef MS__ERR_NAME
  default:
    return "UNKNOWN";
  }
}
