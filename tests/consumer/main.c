/* A program built against an installed memsnap (tests/consumer/run.sh): it uses both libraries
 * and, through them, every dependency a static link must name (msgpack and the pickle reader
 * behind ms_snapshot_load, zlib behind the gzip sink, libxml2 behind the SVG writer). */
#include <memsnap.h>
#include <memsnap/viz.h>
#include <stdio.h>
#include <string.h>

static int sim_allocator(void) {
  ms_errbuf_t eb;
  ms_backend_t *backend = NULL;
  if (ms_backend_open("sim", &backend, &eb) != MS_OK) {
    fprintf(stderr, "consumer: %s\n", eb.msg);
    return 1;
  }
  ms_allocator_config_t cfg = {.backend = backend, .device = 0, .alloc = NULL};
  ms_allocator_t *alloc = NULL;
  ms_devptr_t p = 0;
  ms_stats_t st = MS_STATS_INIT;
  int r = ms_allocator_create(&cfg, &alloc, &eb);
  if (r == MS_OK) r = ms_allocator_malloc(alloc, 1000, 0, &p);
  if (r == MS_OK) r = ms_allocator_get_stats(alloc, &st);
  if (r == MS_OK)
    printf("sim: %lld bytes allocated, %lld reserved\n",
           (long long)st.allocated_bytes[MS_STAT_ALL].current,
           (long long)st.reserved_bytes[MS_STAT_ALL].current);
  if (p) (void)ms_allocator_free(alloc, p);
  ms_allocator_destroy(alloc);
  ms_backend_destroy(backend);
  return r != MS_OK;
}

/* A flame graph of two stacks, written gzip-compressed into a temporary file. */
static int gzipped_svg(void) {
  static const char folded[] = "main;train;forward 300\nmain;train;backward 700\n";
  ms_flame_t *fl = NULL;
  ms_gzip_sink_t *z = NULL;
  ms_sink_t file, gz;
  ms_errbuf_t eb = {{0}};
  FILE *fp = tmpfile();
  if (!fp) return 1;
  ms_sink_init_file(&file, fp);
  int r = ms_flame_create(NULL, &fl);
  if (r == MS_OK) r = ms_flame_add_folded(fl, folded, strlen(folded), &eb);
  if (r == MS_OK) r = ms_flame_finish_folded(fl, &eb);
  if (r == MS_OK) r = ms_gzip_sink_create(&file, 6, &z, &gz);
  if (r == MS_OK) r = ms_flame_write_svg(fl, &gz, &eb);
  if (r == MS_OK) r = ms_gzip_sink_finish(z);
  if (r == MS_OK) {
    unsigned char magic[2] = {0};
    rewind(fp);
    r = fread(magic, 1, 2, fp) == 2 && magic[0] == 0x1f && magic[1] == 0x8b ? MS_OK : MS_EIO;
  }
  if (r == MS_OK)
    printf("svg: %llu bytes of stacks, gzip-compressed\n", (unsigned long long)ms_flame_total(fl));
  else
    fprintf(stderr, "consumer: svg: %s (%s)\n", ms_strerror(r), eb.msg);
  ms_gzip_sink_destroy(z);
  ms_flame_destroy(fl);
  fclose(fp);
  return r != MS_OK;
}

int main(void) {
  if (ms_version() != MS_VERSION) {
    fprintf(stderr, "header version %d, library %d\n", MS_VERSION, ms_version());
    return 1;
  }
  if (strcmp(ms_strerror(MS_EOOM), "out of device memory") != 0) return 1;
  printf("memsnap %s\n", ms_version_string());
  if (sim_allocator() || gzipped_svg()) return 1;
  ms_snapshot_t *snap = NULL;
  ms_errbuf_t eb;
  int r = ms_snapshot_load("/nonexistent/snapshot.pickle", &snap, &eb);
  printf("load: %s\n", r == MS_OK ? "?" : ms_err_name(r));
  return r == MS_OK;
}
