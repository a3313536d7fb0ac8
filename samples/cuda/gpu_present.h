/* SPDX-License-Identifier: MIT
 * Whether an NVIDIA GPU is present on this machine, asked of the kernel driver rather than of
 * CUDA (issue #15: GPU tests may skip only when no GPU is present; a present GPU whose CUDA calls
 * fail, e.g. with a driver too old for the runtime, must FAIL, not skip).
 *
 * A GPU is present when the NVIDIA kernel driver lists one in /proc/driver/nvidia/gpus/ or a
 * device node /dev/nvidia<N> exists, or when MEMSNAP_REQUIRE_GPU is set to a non-empty value
 * other than "0" (scripts/gpu-verify.sh sets it, so that nothing there can skip).
 *
 * Header-only (static functions), for tests/test_cuda.c and bench/bench_cuda.c.
 */
#ifndef MEMSNAP_SAMPLES_CUDA_GPU_PRESENT_H
#define MEMSNAP_SAMPLES_CUDA_GPU_PRESENT_H

#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* @return whether a GPU is present; why (size n, may be NULL) receives how it was found or
 * "no NVIDIA GPU: ..." when none was. */
static inline bool ms_gpu_present(char *why, size_t n) {
  char dummy[8];
  if (!why) why = dummy, n = sizeof dummy;
  const char *req = getenv("MEMSNAP_REQUIRE_GPU");
  if (req && *req && strcmp(req, "0") != 0) {
    snprintf(why, n, "MEMSNAP_REQUIRE_GPU=%s", req);
    return true;
  }
  DIR *d = opendir("/proc/driver/nvidia/gpus");
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      snprintf(why, n, "/proc/driver/nvidia/gpus/%.200s", e->d_name);
      closedir(d);
      return true;
    }
    closedir(d);
  }
  d = opendir("/dev");
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      const char *s = e->d_name;
      if (strncmp(s, "nvidia", 6) != 0 || !isdigit((unsigned char)s[6])) continue;
      bool digits = true;
      for (const char *p = s + 6; *p; p++)
        digits &= isdigit((unsigned char)*p) != 0;
      if (!digits) continue;
      snprintf(why, n, "/dev/%.200s", s);
      closedir(d);
      return true;
    }
    closedir(d);
  }
  snprintf(why, n, "no NVIDIA GPU: no /proc/driver/nvidia/gpus/* and no /dev/nvidia<N>");
  return false;
}

#endif /* MEMSNAP_SAMPLES_CUDA_GPU_PRESENT_H */
