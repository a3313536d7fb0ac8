/* A program built against an installed memsnap (tests/consumer/run.sh). */
#include <memsnap.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  if (ms_version() != MS_VERSION) {
    fprintf(stderr, "header version %d, library %d\n", MS_VERSION, ms_version());
    return 1;
  }
  if (strcmp(ms_strerror(MS_EOOM), "out of device memory") != 0) return 1;
  printf("memsnap %s\n", ms_version_string());
  return 0;
}
