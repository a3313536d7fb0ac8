/* SPDX-License-Identifier: MIT
 * Tests of the `memsnap` program's files and messages as a user meets them (issue #16), run as
 * a user runs them: the built binary ($MEMSNAP_BIN) started with fork/exec in a fresh directory,
 * its stdout, stderr and exit status checked.
 *
 *  - no command writes over one of its inputs: the same name, a symbolic link, a hard link;
 *  - `-o` to a FIFO, a device or a symbolic link writes through and never renames over it;
 *  - SIGTERM/SIGINT while the hidden temporary file exists remove it;
 *  - a full device: "no space left on device while writing OUT", nothing left behind.
 * The snapshots are synthetic (tests/helpers.c), so every test runs without the fixtures.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "snapshot/zio.h"

/* ---- running the program ---------------------------------------------------------------------
 */

typedef struct run_s {
  int status; /* exit status, or 128 + signal */
  char *out;  /* stdout (NUL-terminated) */
  size_t out_len;
  char *err; /* stderr */
} run_t;

static char *dir;

static const char *bin(void) {
  const char *b = getenv("MEMSNAP_BIN");
  return b && *b ? b : MS_TEST_BINARY_DIR "/bin/memsnap";
}

static char *path_in(const char *name) {
  static char buf[4][600];
  static int k;
  char *p = buf[k++ & 3];
  snprintf(p, sizeof buf[0], "%s/%s", dir, name);
  return p;
}

/* The whole file, NUL-terminated; NULL if it cannot be read. */
static char *read_all(const char *path, size_t *len) {
  size_t n = 0;
  char *p = th_read_file(path, &n);
  if (!p) return NULL;
  char *z = realloc(p, n + 1);
  if (!z) {
    free(p);
    return NULL;
  }
  z[n] = 0;
  if (len) *len = n;
  return z;
}

/* Runs memsnap with args (NULL-terminated) in dir; stdin from in_path (NULL: /dev/null); stdout
 * to a terminal (a pty) when tty, else to a file; tty 2: stderr too (r.out holds both). */
static run_t run_ex(const char *in_path, int tty, const char *const *args) {
  char outp[700], errp[700];
  snprintf(outp, sizeof outp, "%s/.stdout", dir);
  snprintf(errp, sizeof errp, "%s/.stderr", dir);
  const char *argv[32];
  int n = 0;
  argv[n++] = bin();
  for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  int master = -1;
  pid_t pid = tty ? forkpty(&master, NULL, NULL, NULL) : fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    int in = open(in_path ? in_path : "/dev/null", O_RDONLY);
    int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int out = tty ? 1 : open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0 || chdir(dir) != 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    if (tty != 2) dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  run_t r = {0};
  if (tty) {
    size_t cap = 1 << 16, len = 0;
    r.out = malloc(cap + 1);
    for (;;) { /* until the child closes the pty (EIO on Linux) */
      if (len == cap) r.out = realloc(r.out, (cap *= 2) + 1);
      ssize_t k = read(master, r.out + len, cap - len);
      if (k <= 0) break;
      len += (size_t)k;
    }
    r.out[len] = 0;
    r.out_len = len;
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  if (tty) close(master); /* after the wait: a hang-up would send SIGHUP to the child */
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (!tty) r.out = read_all(outp, &r.out_len);
  r.err = read_all(errp, NULL);
  unlink(outp);
  unlink(errp);
  cr_assert(r.out && r.err);
  return r;
}

#define RUN(...) run_ex(NULL, 0, (const char *const[]){__VA_ARGS__, NULL})

static void run_free(run_t *r) {
  free(r->out);
  free(r->err);
}

/* Entries of dir other than the run's own .stdout/.stderr. */
static int count_files(void) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ".stdout") &&
        strcmp(e->d_name, ".stderr"))
      n++;
  closedir(d);
  return n;
}

/* A hidden temporary output left in dir (".NAME.tmp-XXXXXX"), or NULL. */
static char *find_tmp(void) {
  static char name[300];
  DIR *d = opendir(dir);
  struct dirent *e;
  char *found = NULL;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp-")) {
      snprintf(name, sizeof name, "%s", e->d_name);
      found = name;
    }
  closedir(d);
  return found;
}

/* Writes a synthetic snapshot (memsnap format) to dir/name. */
static void write_snapshot(const char *name, const th_synth_opts_t *opts) {
  char why[512];
  cr_assert_eq(th_write_synth(path_in(name), opts, why, sizeof why), 0, "%s", why);
}

static void setup(void) {
  dir = th_tmpdir();
  cr_assert(dir);
  cr_assert(access(bin(), X_OK) == 0, "memsnap binary not found at %s", bin());
}

static void teardown(void) {
  th_rmdir(dir);
  free(dir);
}

TestSuite(cli_files, .init = setup, .fini = teardown, .timeout = 120);

/* ---- 1. inputs are never written over ----------------------------------------------------- */

/* Runs args, which name OUT as their output: it must fail with the refusal, leave IN's bytes as
 * they were and leave no file behind. */
static void expect_refused(const char *in, const char *const *args) {
  size_t len0, len1;
  char *before = read_all(path_in(in), &len0);
  int files = count_files();
  run_t r = run_ex(NULL, 0, args);
  cr_expect_eq(r.status, 1, "%s %s: status %d, %s", args[0], args[1], r.status, r.err);
  cr_expect(strstr(r.err, "memsnap: error: refusing to write the output"), "%s", r.err);
  cr_expect(strstr(r.err, in), "the message does not name the input: %s", r.err);
  char *after = read_all(path_in(in), &len1);
  cr_expect(len0 == len1 && memcmp(before, after, len0) == 0, "%s: the input changed", args[0]);
  cr_expect_eq(count_files(), files, "%s: a file was left behind", args[0]);
  cr_expect_null(find_tmp());
  run_free(&r);
  free(before);
  free(after);
}

Test(cli_files, no_command_writes_over_its_input) {
  write_snapshot("a.msnap", NULL);
  write_snapshot("b.msnap", NULL);
  cr_assert_eq(symlink("a.msnap", path_in("link.svg")), 0);
  cr_assert_eq(link(path_in("a.msnap"), path_in("hard.svg")), 0);
  run_t r = RUN("memory", "a.msnap", "--folded", "-o", "a.folded");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  cr_assert_eq(symlink("a.folded", path_in("flink")), 0);
  /* the output under the input's own name, through a symbolic link and through a hard link */
  const char *const outs[] = {"a.msnap", "link.svg", "hard.svg", "./a.msnap"};
  for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) {
    const char *o = outs[i];
    expect_refused("a.msnap", (const char *const[]){"memory", "a.msnap", "-o", o, NULL});
    expect_refused("a.msnap", (const char *const[]){"memory", "a.msnap", "--folded", "-o", o, NULL});
    expect_refused("a.msnap", (const char *const[]){"segments", "a.msnap", "-o", o, NULL});
    expect_refused("a.msnap", (const char *const[]){"compare", "b.msnap", "a.msnap", "-o", o, NULL});
    expect_refused("a.msnap", (const char *const[]){"compare", "a.msnap", "b.msnap", "--stacks",
                                                    "-o", o, NULL});
    expect_refused("a.msnap", (const char *const[]){"convert", "a.msnap", o, "--to", "pickle", NULL});
  }
  expect_refused("a.folded", (const char *const[]){"flamegraph", "a.folded", "-o", "a.folded", NULL});
  expect_refused("a.folded", (const char *const[]){"flamegraph", "a.folded", "-o", "flink", NULL});
  /* standard input that is the file: `memsnap convert - a.msnap < a.msnap` */
  r = run_ex(path_in("a.msnap"), 0,
             (const char *const[]){"convert", "-", "a.msnap", "--to", "pickle", NULL});
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect(strstr(r.err, "refusing to write the output 'a.msnap' over the input '<stdin>'"), "%s",
            r.err);
  run_free(&r);
  /* a different file is written as before */
  r = RUN("convert", "a.msnap", "c.pickle");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
}

/* ---- 18. -o to a FIFO, a device, a symbolic link ------------------------------------------ */

Test(cli_files, output_to_a_fifo_is_written_through) {
  write_snapshot("a.msnap", NULL);
  run_t r = RUN("memory", "a.msnap", "--folded", "-o", "want.folded");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  size_t want_len;
  char *want = read_all(path_in("want.folded"), &want_len);
  cr_assert_eq(mkfifo(path_in("fifo"), 0644), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) { /* the writer: memsnap, whose open() waits for the reader below */
    char *argv[] = {(char *)bin(), "memory", "a.msnap", "--folded", "-o", "fifo", NULL};
    if (chdir(dir) != 0) _exit(126);
    execv(argv[0], argv);
    _exit(127);
  }
  int fd = open(path_in("fifo"), O_RDONLY);
  cr_assert_geq(fd, 0);
  size_t cap = want_len + 4096, n = 0;
  char *got = malloc(cap);
  ssize_t k;
  while ((k = read(fd, got + n, cap - n)) > 0) n += (size_t)k;
  close(fd);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  cr_expect(n == want_len && memcmp(got, want, n) == 0, "the reader got %zu bytes of %zu", n,
            want_len);
  struct stat sb;
  cr_expect(lstat(path_in("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
  cr_expect_null(find_tmp());
  free(got);
  free(want);
}

Test(cli_files, output_to_a_device_is_written_through) {
  write_snapshot("a.msnap", NULL);
  /* a null device of our own (c 1 3), so that a wrong rename cannot destroy the system's */
  if (mknod(path_in("null"), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    cr_log_warn("SKIP output_to_a_device: mknod: %s", strerror(errno));
    printf("SKIP output_to_a_device_is_written_through: cannot create a device (%s)\n",
           strerror(errno));
    return;
  }
  int fd = open(path_in("null"), O_WRONLY);
  if (fd < 0) { /* a file system mounted nodev */
    printf("SKIP output_to_a_device_is_written_through: cannot open a device here (%s)\n",
           strerror(errno));
    unlink(path_in("null"));
    return;
  }
  close(fd);
  const char *const cmds[][8] = {
      {"memory", "a.msnap", "-o", "null", NULL},
      {"segments", "a.msnap", "--folded", "-o", "null", NULL},
      {"convert", "a.msnap", "null", "--to", "pickle", NULL},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    run_t r = run_ex(NULL, 0, cmds[i]);
    cr_expect_eq(r.status, 0, "%s: %s", cmds[i][0], r.err);
    run_free(&r);
    struct stat sb;
    cr_expect(lstat(path_in("null"), &sb) == 0 && S_ISCHR(sb.st_mode),
              "%s: the device was replaced by a file", cmds[i][0]);
    cr_expect_null(find_tmp());
  }
}

Test(cli_files, output_through_a_symbolic_link) {
  write_snapshot("a.msnap", NULL);
  cr_assert_eq(mkdir(path_in("sub"), 0755), 0);
  cr_assert_eq(th_write_file(path_in("sub/target.folded"), "old", 3), 0);
  cr_assert_eq(symlink("sub/target.folded", path_in("link.folded")), 0);
  run_t r = RUN("memory", "a.msnap", "--folded", "-o", "link.folded");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  struct stat sb;
  cr_expect(lstat(path_in("link.folded"), &sb) == 0 && S_ISLNK(sb.st_mode),
            "the symbolic link was replaced");
  r = RUN("memory", "a.msnap", "--folded", "-o", "-");
  size_t n;
  char *got = read_all(path_in("sub/target.folded"), &n);
  cr_expect(n == r.out_len && memcmp(got, r.out, n) == 0, "the link's target was not written");
  free(got);
  run_free(&r);
  /* a dangling link creates its target, as cp does */
  cr_assert_eq(symlink("sub/new.svg", path_in("dangling.svg")), 0);
  r = RUN("memory", "a.msnap", "-o", "dangling.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  cr_expect(lstat(path_in("dangling.svg"), &sb) == 0 && S_ISLNK(sb.st_mode));
  cr_expect(stat(path_in("sub/new.svg"), &sb) == 0 && sb.st_size > 0);
  th_rmdir(path_in("sub"));
}

/* ---- 19. a signal while the temporary file exists ------------------------------------------ */

/* Starts `memsnap memory big.msnap --folded -o out.folded`, waits (inotify) for its hidden
 * temporary file to appear and sends sig. @return the run's status (128 + signal when killed). */
/* Runs memsnap with argv (argv[0] replaced by the binary), sends sig once a temporary file
 * whose name contains tmp_mark appears; @return the exit status (128 + signal when killed). */
static int kill_while_running(int sig, char **argv, const char *tmp_mark) {
  int in = inotify_init1(IN_CLOEXEC);
  cr_assert_geq(in, 0);
  cr_assert_geq(inotify_add_watch(in, dir, IN_CREATE), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    argv[0] = (char *)bin();
    int null = open("/dev/null", O_RDWR);
    if (chdir(dir) != 0 || null < 0) _exit(126);
    dup2(null, 1);
    dup2(null, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  char buf[4096] __attribute__((aligned(8)));
  int seen = 0;
  while (!seen) {
    struct pollfd p = {in, POLLIN, 0};
    cr_assert_eq(poll(&p, 1, 60000), 1, "no temporary file appeared");
    ssize_t n = read(in, buf, sizeof buf);
    cr_assert_gt(n, 0);
    for (char *q = buf; q < buf + n;) {
      struct inotify_event *ev = (struct inotify_event *)q;
      if (ev->len && strstr(ev->name, tmp_mark)) seen = 1;
      q += sizeof *ev + ev->len;
    }
  }
  kill(pid, sig);
  close(in);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int kill_while_writing(int sig) {
  char *argv[] = {NULL, "memory", "big.msnap", "--folded", "-o", "out.folded", NULL};
  return kill_while_running(sig, argv, ".out.folded.tmp-");
}

/* `export --sqlite` wrote its temporary database outside the CLI's output handling, and a signal
 * left it behind (issue #35 item 3: 29 of 29 trials) */
Test(cli_files, signals_remove_the_temporary_database) {
  th_synth_opts_t o = {.nsegments = 3000, .blocks_per_segment = 40, .nframes = 4000,
                       .nstacks = 60000, .ntrace = 20000, .seed = 7};
  write_snapshot("big.msnap", &o);
  const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    int status = 0;
    for (int tries = 0; tries < 5 && status == 0; tries++) {
      unlink(path_in("out.db"));
      char *argv[] = {NULL, "export", "big.msnap", "--sqlite", "out.db", NULL};
      status = kill_while_running(sigs[i], argv, ".out.db.tmp-");
    }
    cr_expect_eq(status, 128 + sigs[i], "signal %d: status %d", sigs[i], status);
    cr_expect_null(find_tmp(), "signal %d left the temporary database behind", sigs[i]);
    struct stat sb;
    cr_expect(stat(path_in("out.db"), &sb) != 0, "signal %d: a database was left", sigs[i]);
  }
}

Test(cli_files, signals_remove_the_temporary_file) {
  /* big enough that writing the folded text (tens of MB) outlasts the signal's delivery */
  th_synth_opts_t o = {.nsegments = 3000, .blocks_per_segment = 40, .nframes = 4000,
                       .nstacks = 60000, .ntrace = 1, .seed = 7};
  write_snapshot("big.msnap", &o);
  const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    int status = 0;
    /* a run that finished before the signal arrived proves nothing: try again */
    for (int tries = 0; tries < 5 && status == 0; tries++) {
      unlink(path_in("out.folded"));
      status = kill_while_writing(sigs[i]);
    }
    /* ended by the signal itself (the handler re-raises it), not by an exit status */
    cr_expect_eq(status, 128 + sigs[i], "signal %d: status %d", sigs[i], status);
    cr_expect_null(find_tmp(), "signal %d left the temporary file behind", sigs[i]);
    struct stat sb;
    cr_expect(stat(path_in("out.folded"), &sb) != 0, "signal %d: an output was left", sigs[i]);
  }
}

/* ---- 2. a full device ------------------------------------------------------------------------ */

/* Runs memsnap with args (NULL-terminated) in dir, standard output on /dev/full; r.out is NULL. */
static run_t run_to_full(const char *const *args) {
  char errp[700];
  snprintf(errp, sizeof errp, "%s/.err2", dir);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    int full = open("/dev/full", O_WRONLY);
    int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const char *argv[16] = {bin()};
    for (int k = 0; args[k] && k < 14; k++) argv[k + 1] = args[k];
    if (full < 0 || err < 0 || chdir(dir) != 0) _exit(126);
    dup2(full, 1); /* `memsnap ... > /dev/full` */
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  run_t r = {.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)};
  r.err = read_all(errp, NULL);
  unlink(errp);
  cr_assert(r.err);
  return r;
}

static void expect_enospc(run_t r, const char *out) {
  char want[300];
  snprintf(want, sizeof want, "memsnap: error: no space left on device while writing '%s'\n", out);
  cr_expect_eq(r.status, 1, "%s", r.err);
  /* the last line (compare's lists go to stderr when the graph goes to stdout) */
  size_t n = strlen(r.err), m = strlen(want);
  cr_expect(n >= m && strcmp(r.err + n - m, want) == 0, "want %s, got %s", want, r.err);
}

Test(cli_files, a_full_device_says_no_space_and_leaves_nothing) {
  write_snapshot("a.msnap", NULL);
  th_synth_opts_t ob = {.nsegments = 6, .blocks_per_segment = 4, .nframes = 10, .nstacks = 8,
                        .ntrace = 2, .seed = 99};
  write_snapshot("b.msnap", &ob);
  /* standard output on /dev/full: named <stdout> */
  const char *const to_stdout[][8] = {
      {"memory", "a.msnap", "--folded", "-o", "-", NULL},
      {"convert", "a.msnap", "-", "--to", "pickle", NULL},
      {"compare", "a.msnap", "b.msnap", "--stacks", "--folded", "-o", "-", NULL},
  };
  for (size_t i = 0; i < sizeof to_stdout / sizeof *to_stdout; i++) {
    run_t r = run_to_full(to_stdout[i]);
    expect_enospc(r, "<stdout>");
    free(r.err);
  }

  /* a full device of our own (c 1 7) as -o: written through, the device kept */
  if (mknod(path_in("full"), S_IFCHR | 0666, makedev(1, 7)) != 0) {
    printf("SKIP a_full_device (write-through): cannot create a device (%s)\n", strerror(errno));
  } else {
    run_t r = RUN("memory", "a.msnap", "-o", "full");
    expect_enospc(r, "full");
    run_free(&r);
    r = RUN("convert", "a.msnap", "full", "--to", "memsnap");
    expect_enospc(r, "full");
    run_free(&r);
    struct stat sb;
    cr_expect(lstat(path_in("full"), &sb) == 0 && S_ISCHR(sb.st_mode), "the device was replaced");
    unlink(path_in("full"));
  }

  /* the atomic path: a 64 KiB file system, an output that does not fit */
  cr_assert_eq(mkdir(path_in("small"), 0755), 0);
  if (mount("tmpfs", path_in("small"), "tmpfs", 0, "size=64k") != 0) {
    printf("SKIP a_full_device (temporary file): cannot mount a small tmpfs (%s)\n",
           strerror(errno));
  } else {
    th_synth_opts_t o = {.nsegments = 200, .blocks_per_segment = 20, .nframes = 400,
                         .nstacks = 2000, .ntrace = 1, .seed = 3};
    write_snapshot("mid.msnap", &o);
    cr_expect_eq(th_write_file(path_in("small/old.folded"), "old", 3), 0);
    run_t r = RUN("memory", "mid.msnap", "--folded", "-o", "small/old.folded");
    expect_enospc(r, "small/old.folded");
    run_free(&r);
    r = RUN("convert", "mid.msnap", "small/new.pickle");
    expect_enospc(r, "small/new.pickle");
    run_free(&r);
    size_t n;
    char *kept = read_all(path_in("small/old.folded"), &n);
    cr_expect(kept && n == 3 && memcmp(kept, "old", 3) == 0, "the old output was touched");
    free(kept);
    DIR *d = opendir(path_in("small"));
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));) entries += e->d_name[0] != '.' || strstr(e->d_name, ".tmp-");
    closedir(d);
    cr_expect_eq(entries, 1, "a temporary file was left on the full file system");
    cr_expect_eq(umount(path_in("small")), 0);
  }
  rmdir(path_in("small"));
}

/* The page and the exports said "input/output error" on a full device (issue #35 item 13): their
 * write error went through their own message, not the output's. Outputs larger than stdio's
 * buffer, so that the error comes while writing, not at the end. */
Test(cli_files, a_full_device_says_no_space_for_pages_and_exports) {
  char fx[1024]; /* a consistent trace, which the exports need (the synthetic one is not) */
  snprintf(fx, sizeof fx, "%s/cranberrii_ftcourse.pickle", th_fixture_dir());
  if (access(fx, R_OK) != 0) {
    printf("SKIP a_full_device_says_no_space_for_pages_and_exports: no fixture %s\n", fx);
    return;
  }
  const char *const cmds[][8] = {
      {"view", fx, "-o", "-", NULL},
      {"trace_plot", fx, "-o", "-", NULL},
      {"export", fx, "--pprof", "-", "--at", "end", NULL},
      {"export", fx, "--perfetto", "-", NULL},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    run_t r = run_to_full(cmds[i]);
    expect_enospc(r, "<stdout>");
    cr_expect(!strstr(r.err, "input/output error"), "%s: %s", cmds[i][0], r.err);
    free(r.err);
  }
}

/* ---- 3. outputs where users expect them --------------------------------------------------- */

Test(cli_files, folded_text_goes_to_stdout_svgs_to_output_svg) {
  write_snapshot("a.msnap", NULL);
  th_synth_opts_t ob = {.nsegments = 6, .blocks_per_segment = 4, .nframes = 10, .nstacks = 8,
                        .ntrace = 2, .seed = 99};
  write_snapshot("b.msnap", &ob);
  const char *const cmds[][8] = {
      {"memory", "a.msnap", "--folded", NULL},
      {"segments", "a.msnap", "--folded", NULL},
      {"compare", "a.msnap", "b.msnap", "--folded", NULL},
      {"compare", "a.msnap", "b.msnap", "--stacks", "--folded", NULL},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    int files = count_files();
    run_t r = run_ex(NULL, 0, cmds[i]);
    cr_expect_eq(r.status, 0, "%s: %s", cmds[i][0], r.err);
    cr_expect_eq(count_files(), files, "%s --folded without -o wrote a file", cmds[i][0]);
    /* the same text as -o - */
    const char *with_o[10];
    int n = 0;
    for (; cmds[i][n]; n++) with_o[n] = cmds[i][n];
    with_o[n++] = "-o";
    with_o[n++] = "-";
    with_o[n] = NULL;
    run_t w = run_ex(NULL, 0, with_o);
    cr_expect_eq(w.status, 0);
    cr_expect_gt(r.out_len, 0, "%s --folded: nothing on stdout", cmds[i][0]);
    cr_expect(r.out_len == w.out_len && memcmp(r.out, w.out, r.out_len) == 0,
              "%s --folded: stdout differs from -o -", cmds[i][0]);
    run_free(&r);
    run_free(&w);
  }
  run_t r = RUN("memory", "a.msnap", "--folded", "-o", "a.folded");
  cr_assert_eq(r.status, 0);
  run_free(&r);
  r = RUN("flamegraph", "a.folded", "--folded");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(r.out_len > 0 && strstr(r.out, " "), "flamegraph --folded: nothing on stdout");
  run_free(&r);
  cr_expect_neq(access(path_in("output.svg"), F_OK), 0);
  /* an SVG still defaults to output.svg, with nothing on stdout */
  r = RUN("memory", "a.msnap");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_eq(r.out_len, 0);
  run_free(&r);
  size_t n;
  char *svg = read_all(path_in("output.svg"), &n);
  cr_expect(svg && strstr(svg, "<svg"), "no output.svg");
  free(svg);
}

Test(cli_files, an_svg_is_not_written_to_a_terminal) {
  write_snapshot("a.msnap", NULL);
  run_t r = RUN("memory", "a.msnap", "--folded", "-o", "a.folded");
  cr_assert_eq(r.status, 0);
  run_free(&r);
  const char *const cmds[][8] = {
      {"memory", "a.msnap", "-o", "-", NULL},
      {"segments", "a.msnap", "-o", "-", NULL},
      {"compare", "a.msnap", "a.msnap", "--stacks", "-o", "-", NULL},
      {"flamegraph", "a.folded", "-o", "-", NULL},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    r = run_ex(NULL, 1, cmds[i]);
    cr_expect_eq(r.status, 2, "%s: %d %s", cmds[i][0], r.status, r.err);
    cr_expect(strstr(r.err, "memsnap: error: refusing to write an SVG to a terminal; redirect it"),
              "%s: %s", cmds[i][0], r.err);
    cr_expect(!strstr(r.out, "<svg"), "%s: the SVG reached the terminal", cmds[i][0]);
    run_free(&r);
    /* to a file or a pipe it is written */
    r = run_ex(NULL, 0, cmds[i]);
    cr_expect_eq(r.status, 0, "%s: %s", cmds[i][0], r.err);
    cr_expect(strstr(r.out, "<svg"), "%s: no SVG on stdout", cmds[i][0]);
    run_free(&r);
  }
  /* nor the viewer's HTML page (#32 item 4) */
  const char *const pages[][8] = {
      {"view", "a.msnap", "-o", "-", NULL},
      {"trace_plot", "a.msnap", "-o", "-", NULL},
      {"segment_plot", "a.msnap", "-o", "-", NULL},
  };
  for (size_t i = 0; i < sizeof pages / sizeof *pages; i++) {
    r = run_ex(NULL, 1, pages[i]);
    cr_expect_eq(r.status, 2, "%s: %d %s", pages[i][0], r.status, r.err);
    char want[512];
    snprintf(want, sizeof want,
             "memsnap: error: refusing to write an HTML page to a terminal; redirect it (-o - > "
             "out.html) or name a file (-o out.html)\nRun 'memsnap %s --help' for usage.\n",
             pages[i][0]);
    cr_expect_str_eq(r.err, want);
    cr_expect(!strstr(r.out, "<html"), "%s: the page reached the terminal", pages[i][0]);
    run_free(&r);
  }
  /* folded text to a terminal is fine */
  r = run_ex(NULL, 1, (const char *const[]){"memory", "a.msnap", "--folded", NULL});
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_gt(r.out_len, 0);
  run_free(&r);
}

/* ---- 7. every command's help is its own ----------------------------------------------------- */

Test(cli_files, every_command_has_its_own_help_and_help_cmd_equals_it) {
  /* the commands as `memsnap --help` lists them, so that a new one is covered too */
  run_t top = RUN("--help");
  cr_assert_eq(top.status, 0);
  const char *list = strstr(top.out, "commands:\n");
  cr_assert(list);
  char names[32][32];
  char *texts[32];
  int n = 0;
  for (const char *p = list + 10; *p == ' ' && n < 32;) {
    cr_assert_eq(sscanf(p, " %31s", names[n]), 1);
    n++;
    p = strchr(p, '\n');
    if (!p) break;
    p++;
  }
  cr_assert_geq(n, 13, "only %d commands listed", n);
  for (int i = 0; i < n; i++) {
    char head[1100];
    snprintf(head, sizeof head, "usage: memsnap %s", names[i]);
    run_t a = run_ex(NULL, 0, (const char *const[]){names[i], "--help", NULL});
    run_t h = run_ex(NULL, 0, (const char *const[]){names[i], "-h", NULL});
    run_t b = run_ex(NULL, 0, (const char *const[]){"help", names[i], NULL});
    cr_expect_eq(a.status, 0, "%s --help: %d %s", names[i], a.status, a.err);
    cr_expect_str_eq(a.err, "", "%s --help", names[i]);
    cr_expect(strncmp(a.out, head, strlen(head)) == 0 && strchr(" \n", a.out[strlen(head)]),
              "'memsnap %s --help' is not its own: %.80s", names[i], a.out);
    cr_expect_str_eq(h.out, a.out, "%s -h", names[i]);
    cr_expect_eq(b.status, 0, "help %s: %s", names[i], b.err);
    cr_expect_str_eq(b.out, a.out, "'memsnap help %s' differs from 'memsnap %s --help'", names[i],
                     names[i]);
    for (int j = 0; j < i; j++)
      cr_expect_str_neq(texts[j], a.out, "%s and %s print the same help", names[j], names[i]);
    texts[i] = a.out;
    a.out = NULL;
    run_free(&a);
    run_free(&h);
    run_free(&b);
  }
  for (int i = 0; i < n; i++) free(texts[i]);
  run_free(&top);
}

/* ---- 4. a snapshot given to flamegraph ------------------------------------------------------ */

Test(cli_files, flamegraph_names_the_command_for_a_snapshot) {
  write_snapshot("a.msnap", NULL);
  run_t r = RUN("convert", "a.msnap", "a.pickle");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  r = RUN("convert", "a.msnap", "a.msnapz");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  cr_assert_eq(th_write_file(path_in("text.gz"), "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10), 0);
  static const struct {
    const char *file, *want;
  } cases[] = {
      {"a.pickle", "memsnap: error: 'a.pickle' is a snapshot (a PyTorch pickle), not folded "
                   "stacks: draw it with 'memsnap memory a.pickle' (or segments, compare)\n"},
      {"a.msnap", "memsnap: error: 'a.msnap' is a snapshot (memsnap's format), not folded "
                  "stacks: draw it with 'memsnap memory a.msnap' (or segments, compare)\n"},
      {"a.msnapz", "memsnap: error: 'a.msnapz' is a snapshot (memsnap's format), not folded "
                   "stacks: draw it with 'memsnap memory a.msnapz' (or segments, compare)\n"},
      {"text.gz", "memsnap: error: 'text.gz' is gzip-compressed, not folded text: decompress it "
                  "first (zcat FILE | memsnap flamegraph -), or draw a compressed snapshot with "
                  "'memsnap memory'\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    r = RUN("flamegraph", cases[i].file, "-o", "x.svg");
    cr_expect_eq(r.status, 1, "%s", cases[i].file);
    cr_expect_str_eq(r.err, cases[i].want);
    cr_expect_neq(access(path_in("x.svg"), F_OK), 0);
    run_free(&r);
  }
  r = run_ex(path_in("a.pickle"), 0, (const char *const[]){"flamegraph", "-", "-o", "x.svg", NULL});
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "'<stdin>' is a snapshot (a PyTorch pickle), not folded stacks: draw it "
                          "with 'memsnap memory -'"),
            "%s", r.err);
  run_free(&r);
}

/* ---- 21. messages never copy raw input bytes to the terminal ----------------------------- */

/* Every byte of s is printable ASCII or a newline (the tests' messages quote nothing else). */
static void expect_printable(const char *what, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '\n') continue;
    cr_expect(*p >= 0x20 && *p < 0x7f, "%s: raw byte 0x%02x in %s", what, *p, s);
    if (*p < 0x20 || *p >= 0x7f) break;
  }
}

Test(cli_files, messages_escape_non_printable_input_bytes) {
  /* a count carrying an escape sequence (set the title, clear the screen), a C1 CSI and bytes
   * of invalid UTF-8 */
  const char evil[] = "a;b 1\x1b]0;pwned\x07\x1b[2J\xc2\x9b\xff\xfe\n";
  cr_assert_eq(th_write_file(path_in("evil.folded"), evil, sizeof evil - 1), 0);
  run_t r = RUN("flamegraph", "evil.folded", "-o", "x.svg");
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "'1\\x1b]0;pwned\\x07\\x1b[2J\\xc2\\x9b\\xff\\xfe'"), "%s", r.err);
  expect_printable("flamegraph", r.err);
  run_free(&r);
  /* valid UTF-8 stays as it is */
  const char utf[] = "a;b 1\xc3\xa9\xe2\x80\xa6\n";
  cr_assert_eq(th_write_file(path_in("utf.folded"), utf, sizeof utf - 1), 0);
  r = RUN("flamegraph", "utf.folded", "-o", "x.svg");
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "'1\xc3\xa9\xe2\x80\xa6'"), "%s", r.err);
  run_free(&r);
  /* a file name quoted by a message */
  r = RUN("stats", "x\x1b[2J\x07.pickle");
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "cannot open 'x\\x1b[2J\\x07.pickle'"), "%s", r.err);
  expect_printable("stats", r.err);
  run_free(&r);
  /* an option value quoted by a usage error */
  r = RUN("memory", "a.msnap", "--at", "\x1b[31mred");
  cr_expect_eq(r.status, 2);
  expect_printable("--at", r.err);
  run_free(&r);
}

/* ---- 5. --json ------------------------------------------------------------------------------ */

/* Decodes the JSON string at *p (just past its opening quote) into out, as UTF-8; leaves *p past
 * the closing quote. Only what cli_json_str writes: \" \\ \uXXXX (BMP). */
static void json_string(const char **p, char *out, size_t cap) {
  size_t n = 0;
  const char *s = *p;
  while (*s && *s != '"') {
    unsigned c = (unsigned char)*s++;
    if (c == '\\') {
      char e = *s++;
      if (e == 'u') {
        unsigned cp = 0;
        cr_assert_eq(sscanf(s, "%4x", &cp), 1);
        s += 4;
        if (cp < 0x80) {
          out[n++] = (char)cp;
        } else if (cp < 0x800) {
          out[n++] = (char)(0xc0 | cp >> 6);
          out[n++] = (char)(0x80 | (cp & 0x3f));
        } else {
          out[n++] = (char)(0xe0 | cp >> 12);
          out[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
          out[n++] = (char)(0x80 | (cp & 0x3f));
        }
        continue;
      }
      cr_assert(e == '"' || e == '\\', "unexpected escape \\%c", e);
      c = (unsigned char)e;
    }
    cr_assert(c >= 0x20, "raw control byte 0x%02x in a JSON string", c);
    out[n++] = (char)c;
    cr_assert_lt(n, cap - 4);
  }
  cr_assert_eq(*s, '"');
  out[n] = 0;
  *p = s + 1;
}

/* The records of a view document as folded lines ("a;b;c N\n"), in order. */
static char *json_records_as_folded(const char *doc) {
  size_t cap = strlen(doc) + 64, n = 0;
  char *out = malloc(cap), frame[8192];
  const char *p = strstr(doc, "\"records\": [");
  cr_assert(p, "no records in %.200s", doc);
  while ((p = strstr(p, "{\"frames\": ["))) {
    p += 12;
    int first = 1;
    while (*p == '"') {
      p++;
      json_string(&p, frame, sizeof frame);
      n += (size_t)snprintf(out + n, cap - n, "%s%s", first ? "" : ";", frame);
      first = 0;
      if (strncmp(p, ", ", 2) == 0) p += 2;
    }
    if (strncmp(p, "], \"before\": ", 13) == 0) { /* a two-sided view: "stack before after" */
      char *end;
      unsigned long long b = strtoull(p + 13, &end, 10);
      cr_assert(strncmp(end, ", \"after\": ", 11) == 0, "%.80s", end);
      n += (size_t)snprintf(out + n, cap - n, " %llu %llu\n", b, strtoull(end + 11, NULL, 10));
      continue;
    }
    cr_assert(strncmp(p, "], \"bytes\": ", 12) == 0, "%.80s", p);
    p += 12;
    n += (size_t)snprintf(out + n, cap - n, " %llu\n", strtoull(p, NULL, 10));
  }
  return out;
}

static int line_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* text's lines sorted (text is changed and returned). */
static char *sorted_lines(char *text) {
  size_t n = 0, cap = 16;
  char **lines = malloc(cap * sizeof *lines);
  for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (n == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
    lines[n++] = l;
  }
  qsort(lines, n, sizeof *lines, line_cmp);
  size_t len = 0;
  for (size_t i = 0; i < n; i++) len += strlen(lines[i]) + 1;
  char *out = calloc(1, len + 1);
  for (size_t i = 0; i < n; i++) strcat(strcat(out, lines[i]), "\n");
  free(lines);
  free(text);
  return out;
}

/* The folded text with each stack's trailing empty frame ("a;b; N") dropped, as JSON drops it. */
static char *folded_without_empty_tail(const char *folded) {
  char *out = strdup(folded), *w = out;
  for (const char *p = folded; *p; p++) {
    if (*p == ';' && p[1] == ' ') continue;
    *w++ = *p;
  }
  *w = 0;
  return out;
}

Test(cli_files, json_views_hold_the_folded_records) {
  write_snapshot("a.msnap", NULL);
  th_synth_opts_t ob = {.nsegments = 6, .blocks_per_segment = 4, .nframes = 10, .nstacks = 8,
                        .ntrace = 2, .seed = 99};
  write_snapshot("b.msnap", &ob);
  const char *const cmds[][8] = {
      {"memory", "a.msnap", NULL},
      {"segments", "a.msnap", NULL},
      {"compare", "a.msnap", "b.msnap", "--segments", NULL},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    const char *args[10];
    int n = 0;
    for (; cmds[i][n]; n++) args[n] = cmds[i][n];
    args[n] = "--folded";
    args[n + 1] = "-o";
    args[n + 2] = "want.folded";
    args[n + 3] = NULL;
    run_t f = run_ex(NULL, 0, args);
    cr_assert_eq(f.status, 0, "%s", f.err);
    run_free(&f);
    args[n] = "--json";
    args[n + 1] = NULL;
    run_t r = run_ex(NULL, 0, args);
    cr_expect_eq(r.status, 0, "%s --json: %s", cmds[i][0], r.err);
    char head[64];
    snprintf(head, sizeof head, "{\"command\": \"%s\", ", cmds[i][0]);
    cr_expect(strncmp(r.out, head, strlen(head)) == 0, "%.100s", r.out);
    cr_expect(r.out_len > 3 && strcmp(r.out + r.out_len - 3, "]}\n") == 0);
    char *want_raw = read_all(path_in("want.folded"), NULL);
    char *want = folded_without_empty_tail(want_raw);
    char *got = json_records_as_folded(r.out);
    cr_expect_str_eq(got, want, "%s --json: the records differ from --folded", cmds[i][0]);
    free(got);
    free(want);
    free(want_raw);
    run_free(&r);
  }
  /* compare's segment lists are fields of the document, not text on stdout */
  run_t r = RUN("compare", "a.msnap", "b.msnap", "--segments", "--json");
  cr_expect(strstr(r.out, "\"view\": \"segments\", \"before\": \"a.msnap\", \"after\": \"b.msnap\", "
                          "\"only_before\": ["),
            "%.200s", r.out);
  cr_expect(!strstr(r.out, "only_before = ["));
  run_free(&r);
  /* compare --stacks: one record per distinct stack with its bytes on each side, the lines of
   * the merged folded text (issue #31: not one record per block of each side) */
  r = RUN("compare", "a.msnap", "b.msnap", "--stacks", "--json");
  cr_expect_eq(r.status, 0);
  cr_expect(strstr(r.out, "\"view\": \"stacks\"") && !strstr(r.out, "\"side\""), "%.200s", r.out);
  char *got = sorted_lines(json_records_as_folded(r.out));
  run_free(&r);
  r = RUN("compare", "a.msnap", "b.msnap", "--stacks", "--folded", "-o", "merged.folded");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char *want = sorted_lines(read_all(path_in("merged.folded"), NULL));
  cr_expect_str_eq(got, want, "compare --stacks --json differs from --folded");
  cr_expect(strchr(want, '\n') && strchr(strchr(want, '\n') + 1, '\n'), "%s", want);
  free(got);
  free(want);
  /* a file name that JSON must escape: quote, backslash, a control byte, a byte not UTF-8 */
  cr_assert_eq(symlink("a.msnap", path_in("q\"b\\c\x01\xff.msnap")), 0);
  r = RUN("memory", "q\"b\\c\x01\xff.msnap", "--json");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.out, "\"file\": \"q\\\"b\\\\c\\u0001\\ufffd.msnap\""), "%.200s", r.out);
  run_free(&r);
  /* --json and --folded together: a usage error */
  r = RUN("memory", "a.msnap", "--json", "--folded");
  cr_expect_eq(r.status, 2);
  run_free(&r);
}

Test(cli_files, json_stats_and_trace_hold_the_snapshot_numbers) {
  th_synth_opts_t o = {.nsegments = 5, .blocks_per_segment = 4, .nframes = 12, .nstacks = 9,
                       .ntrace = 7, .history = 0, .seed = 5};
  write_snapshot("a.msnap", &o);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_load(path_in("a.msnap"), &s, &eb), MS_OK, "%s", eb.msg);

  run_t r = RUN("stats", "a.msnap", "--json");
  cr_assert_eq(r.status, 0, "%s", r.err);
  const char head[] = "{\"command\": \"stats\", \"file\": \"a.msnap\", \"segments\": [";
  cr_expect(strncmp(r.out, head, sizeof head - 1) == 0, "%.100s", r.out);
  uint64_t reserved = 0;
  size_t nseg = 0;
  for (const char *p = r.out; (p = strstr(p, "{\"device\": ")); p++, nseg++) {
    long long dev;
    unsigned long long addr, stream, total;
    long long alloc, ext, in;
    cr_assert_eq(sscanf(p,
                        "{\"device\": %lld, \"address\": %llu, \"stream\": %llu, \"total_size\": "
                        "%llu, \"allocated\": %lld, \"free_external\": %lld, \"free_internal\": %lld}",
                        &dev, &addr, &stream, &total, &alloc, &ext, &in),
                 7, "%.200s", p);
    cr_assert_lt(nseg, s->nsegments);
    cr_expect_eq(addr, s->segments[nseg].address);
    cr_expect_eq(total, s->segments[nseg].total_size);
    cr_expect_eq((unsigned long long)(alloc + ext + in), total, "segment %zu: parts != total", nseg);
    reserved += total;
  }
  cr_expect_eq(nseg, s->nsegments);
  char want[128];
  snprintf(want, sizeof want, "\"total_segments\": %zu, \"total_reserved\": %llu, ", s->nsegments,
           (unsigned long long)reserved);
  cr_expect(strstr(r.out, want), "%s not in %s", want, r.out);
  run_free(&r);
  r = RUN("stats", "a.msnap", "--json", "--summary");
  cr_expect_eq(r.status, 2);
  run_free(&r);

  r = RUN("trace", "a.msnap", "--json");
  cr_assert_eq(r.status, 0, "%s", r.err);
  const char *p = r.out;
  for (size_t d = 0; d < s->ndevices; d++) {
    if (s->devices[d].ntrace == 0) continue;
    char dev[64];
    snprintf(dev, sizeof dev, "{\"device\": %zu, \"entries\": [", d);
    p = strstr(p, dev);
    cr_assert(p, "device %zu missing", d);
    for (size_t i = 0; i < s->devices[d].ntrace; i++) {
      const ms_snap_trace_t *e = &s->trace[s->devices[d].first_trace + i];
      char ent[256];
      snprintf(ent, sizeof ent, "{\"index\": %zu, \"action\": \"%s\", \"addr\": %llu, \"size\": %llu, ",
               i, e->action == MS_TRACE_OTHER ? ms_snap_trace_action_name(e) : ms_trace_action_name(e->action),
               (unsigned long long)e->addr,
               (unsigned long long)e->size);
      const char *q = strstr(p, ent);
      cr_assert(q, "device %zu entry %zu: %s not found", d, i, ent);
      p = q + 1;
    }
  }
  run_free(&r);
  ms_snapshot_free(s);
}

/* ---- 6. gzip-compressed pickles --------------------------------------------------------------- */

/* Writes src gzip-compressed to dst, keeping its first keep bytes of the result (0: all). */
static void gzip_file(const char *src, const char *dst, size_t keep) {
  size_t n;
  char *data = read_all(path_in(src), &n);
  cr_assert(data);
  th_memsink_t m;
  ms_sink_t inner, gz;
  th_memsink_init(&inner, &m);
  ms__zsink_t *z = NULL;
  cr_assert_eq(ms__zsink_create(&inner, 6, &z, &gz), MS_OK);
  cr_assert_eq(gz.write(gz.ctx, data, n), MS_OK);
  cr_assert_eq(ms__zsink_finish(z), MS_OK);
  ms__zsink_destroy(z);
  cr_assert_eq(th_write_file(path_in(dst), m.data, keep && keep < m.len ? keep : m.len), 0);
  th_memsink_free(&m);
  free(data);
}

Test(cli_files, gzip_pickles_read_transparently) {
  th_synth_opts_t o = {.nsegments = 12, .blocks_per_segment = 6, .nframes = 40, .nstacks = 30,
                       .ntrace = 40, .history = 0, .seed = 11};
  write_snapshot("a.msnap", &o);
  run_t r = RUN("convert", "a.msnap", "a.pickle");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  gzip_file("a.pickle", "a.pickle.gz", 0);
  gzip_file("a.pickle", "any-name", 0); /* by content, not by name */
  const char *const cmds[][6] = {
      {"stats", NULL}, {"trace", NULL}, {"memory", "--folded", NULL}, {"segments", "--folded", NULL},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    const char *args[8] = {cmds[i][0], "a.pickle"};
    int n = 2;
    for (int k = 1; cmds[i][k]; k++) args[n++] = cmds[i][k];
    args[n] = NULL;
    run_t want = run_ex(NULL, 0, args);
    cr_assert_eq(want.status, 0, "%s: %s", cmds[i][0], want.err);
    const char *const names[] = {"a.pickle.gz", "any-name"};
    for (size_t k = 0; k < 2; k++) {
      args[1] = names[k];
      run_t got = run_ex(NULL, 0, args);
      cr_expect_eq(got.status, 0, "%s %s: %s", cmds[i][0], names[k], got.err);
      cr_expect(got.out_len == want.out_len && memcmp(got.out, want.out, want.out_len) == 0,
                "%s %s: the output differs from the plain pickle's", cmds[i][0], names[k]);
      run_free(&got);
    }
    args[1] = "-"; /* standard input */
    run_t got = run_ex(path_in("a.pickle.gz"), 0, args);
    cr_expect_eq(got.status, 0, "%s -: %s", cmds[i][0], got.err);
    cr_expect(got.out_len == want.out_len && memcmp(got.out, want.out, want.out_len) == 0,
              "%s - (gzip on stdin): the output differs", cmds[i][0]);
    run_free(&got);
    run_free(&want);
  }
  /* truncated and followed by junk: exit 1 naming the gzip problem (and no hang) */
  size_t full;
  char *gz = read_all(path_in("a.pickle.gz"), &full);
  gzip_file("a.pickle", "cut.gz", full / 2);
  r = RUN("stats", "cut.gz");
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "memsnap: error: 'cut.gz': gzip: compressed stream is truncated"), "%s",
            r.err);
  run_free(&r);
  r = run_ex(path_in("cut.gz"), 0, (const char *const[]){"memory", "-", "--folded", NULL});
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "'<stdin>': gzip: compressed stream is truncated"), "%s", r.err);
  run_free(&r);
  char *junk = malloc(full + 4);
  memcpy(junk, gz, full);
  memcpy(junk + full, "junk", 4);
  cr_assert_eq(th_write_file(path_in("junk.gz"), junk, full + 4), 0);
  r = RUN("stats", "junk.gz");
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "gzip: trailing data after the compressed stream"), "%s", r.err);
  run_free(&r);
  free(junk);
  free(gz);
}

/* ---- 8. progress while sweeping ------------------------------------------------------------ */

Test(cli_files, replay_shows_progress_only_on_a_terminal) {
  char fx[1024];
  snprintf(fx, sizeof fx, "%s/cranberrii_ftcourse.pickle", th_fixture_dir());
  if (access(fx, R_OK) != 0) {
    printf("SKIP replay_shows_progress_only_on_a_terminal: no fixture %s\n", fx);
    return;
  }
  const char *const args[] = {"replay", fx, "--sweep",
                              "max_split_size_mb=100,200,400;roundup_power2_divisions=1,2,4,8",
                              NULL};
  setenv("MEMSNAP_PROGRESS_DELAY", "0", 1); /* draw at once: the run is short */
  int seen = 0;
  for (int tries = 0; tries < 5 && !seen; tries++) {
    run_t r = run_ex(NULL, 2, args);
    cr_expect_eq(r.status, 0, "%s", r.out);
    seen = strstr(r.out, "\rmemsnap: replaying '") && strstr(r.out, "' under 12 configurations...");
    if (seen) cr_expect(strstr(r.out, "\r\033[K"), "the progress line was not erased");
    run_free(&r);
  }
  cr_expect(seen, "no progress line while sweeping");
  run_t r = run_ex(NULL, 0, args); /* stderr not a terminal: nothing */
  unsetenv("MEMSNAP_PROGRESS_DELAY");
  cr_expect_eq(r.status, 0);
  cr_expect_str_eq(r.err, "");
  run_free(&r);
}

/* Reading and writing say how far they are, in bytes and percent, not only in seconds (#32
 * item 5): view on a large fixture, its progress drawn at once. */
Test(cli_files, reading_and_writing_show_bytes_and_percent) {
  char fx[1024];
  snprintf(fx, sizeof fx, "%s/wedsonlin_cs336_medium_1024_training.pickle", th_fixture_dir());
  if (access(fx, R_OK) != 0) {
    printf("SKIP reading_and_writing_show_bytes_and_percent: no fixture %s\n", fx);
    return;
  }
  setenv("MEMSNAP_PROGRESS_DELAY", "0", 1);
  int read_seen = 0, write_seen = 0;
  for (int tries = 0; tries < 5 && !(read_seen && write_seen); tries++) {
    /* --no-cache: a page stored by an earlier try is written without reading the file */
    run_t r = run_ex(NULL, 2,
                     (const char *const[]){"view", fx, "-q", "--no-cache", "-o", "p.html", NULL});
    cr_expect_eq(r.status, 0, "%s", r.out);
    /* "\rmemsnap: reading 'F'... 45% (412.3MiB of 912.0MiB), 0 s" */
    char *rd = strstr(r.out, "\rmemsnap: reading '");
    if (rd && strstr(rd, "... ") && strstr(rd, "% (") && strstr(rd, "B of ")) read_seen = 1;
    char *wr = strstr(r.out, "\rmemsnap: writing 'p.html'... ");
    if (wr && strstr(wr, "B, ")) write_seen = 1;
    run_free(&r);
  }
  unsetenv("MEMSNAP_PROGRESS_DELAY");
  cr_expect(read_seen, "no read progress in bytes and percent");
  cr_expect(write_seen, "no write progress in bytes");
}

/* ---- 13. empty frame names ----------------------------------------------------------------- */

Test(cli_files, empty_frame_names_show_as_unknown) {
  cr_assert_eq(th_write_file(path_in("e.folded"), "main;;leaf 5\n;top 3\n", 20), 0);
  run_t r = RUN("flamegraph", "e.folded", "-o", "e.svg", "--minwidth", "0");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char *svg = read_all(path_in("e.svg"), NULL);
  cr_assert(svg);
  size_t unknown = 0;
  for (const char *p = svg; (p = strstr(p, "<title>[unknown] (")); p++) unknown++;
  cr_expect_eq(unknown, 2, "want two [unknown] frames (main;<here>;leaf and <here>;top)");
  cr_expect(!strstr(svg, "<title> ("), "a frame with an empty name was drawn");
  cr_expect(strstr(svg, "<title>leaf (") && strstr(svg, "<title>top ("));
  free(svg);
  /* the folded text keeps the names as they are */
  r = RUN("flamegraph", "e.folded", "--folded");
  cr_expect_str_eq(r.out, ";top 3\nmain;;leaf 5\n");
  run_free(&r);
}

/* ---- 22. a failed write to stdout is said even when the command failed too ------------------ */

Test(cli_files, stdout_write_errors_are_said_even_after_a_failure) {
  write_snapshot("a.msnap", NULL);
  th_synth_opts_t ob = {.nsegments = 6, .blocks_per_segment = 4, .nframes = 10, .nstacks = 8,
                        .ntrace = 2, .seed = 99};
  write_snapshot("b.msnap", &ob);
  /* compare prints its lists to stdout, then cannot create its output */
  run_t r = run_to_full(
      (const char *const[]){"compare", "a.msnap", "b.msnap", "-o", "/nonexistent/x.svg", NULL});
  cr_expect_eq(r.status, 1);
  cr_expect(strstr(r.err, "memsnap: error: cannot create '/nonexistent/x.svg'"), "%s", r.err);
  cr_expect(strstr(r.err, "memsnap: error: no space left on device while writing '<stdout>'\n"),
            "the lost standard output was not reported: %s", r.err);
  free(r.err);
  /* said once, not once by the output and once more at exit */
  r = run_to_full((const char *const[]){"memory", "a.msnap", "--folded", NULL});
  cr_expect_eq(r.status, 1);
  cr_expect_str_eq(r.err, "memsnap: error: no space left on device while writing '<stdout>'\n");
  free(r.err);
  r = run_to_full((const char *const[]){"stats", "a.msnap", NULL});
  cr_expect_eq(r.status, 1);
  cr_expect_str_eq(r.err, "memsnap: error: no space left on device while writing '<stdout>'\n");
  free(r.err);
}

/* ---- 23. --capacity takes digits with K/M/G/T, nothing strtod would also take -------------- */

Test(cli_files, capacity_is_digits_with_a_unit) {
  write_snapshot("a.msnap", NULL);
  const char *const bad[] = {"0x10", "1e3", "inf", "nan", "1.", ".5G", "16Q", "-1", "0",
                             "Unlimited", "unlimited2", "0.1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    run_t r = RUN("replay", "a.msnap", "--check", "--capacity", bad[i]);
    cr_expect_eq(r.status, 2, "--capacity %s: status %d", bad[i], r.status);
    char want[200];
    snprintf(want, sizeof want,
             "memsnap: error: invalid size '%s' for --capacity (digits with an optional K, M, G "
             "or T: 24GiB, 8000M, 123456789; or 'unlimited')\n",
             bad[i]);
    cr_expect(strncmp(r.err, want, strlen(want)) == 0, "%s", r.err);
    run_free(&r);
  }
  const char *const good[] = {"16", "1.5G", "24GiB", "8000M", "4k", "2TB", "unlimited"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    run_t r = RUN("replay", "a.msnap", "--check", "--capacity", good[i]);
    cr_expect_neq(r.status, 2, "--capacity %s refused: %s", good[i], r.err);
    run_free(&r);
  }
}

/* ---- 11. the title names the view and the file; flamegraph.pl's options -------------------- */

static char *svg_title(const char *file) {
  char *svg = read_all(path_in(file), NULL);
  cr_assert(svg, "no %s", file);
  const char *t = strstr(svg, "<text id=\"title\"");
  cr_assert(t);
  t = strchr(t, '>') + 1;
  char *out = strndup(t, (size_t)(strchr(t, '<') - t));
  free(svg);
  return out;
}

Test(cli_files, view_titles_and_flamegraph_options) {
  write_snapshot("step_5.msnap", NULL);
  th_synth_opts_t ob = {.nsegments = 6, .blocks_per_segment = 4, .nframes = 10, .nstacks = 8,
                        .ntrace = 2, .seed = 99};
  write_snapshot("b.msnap", &ob);
  static const struct {
    const char *args[10];
    const char *title;
  } cases[] = {
      {{"memory", "step_5.msnap", "-o", "x.svg", NULL}, "memory \u2014 step_5.msnap"},
      {{"memory", "step_5.msnap", "--device", "0", "-o", "x.svg", NULL},
       "memory \u2014 step_5.msnap (device 0)"},
      {{"segments", "step_5.msnap", "-o", "x.svg", NULL}, "segments \u2014 step_5.msnap"},
      {{"compare", "step_5.msnap", "b.msnap", "-o", "x.svg", NULL},
       "compare \u2014 step_5.msnap \u2192 b.msnap"},
      {{"compare", "step_5.msnap", "b.msnap", "--stacks", "-o", "x.svg", NULL},
       "compare \u2014 step_5.msnap \u2192 b.msnap"},
      {{"memory", "step_5.msnap", "--title", "a <b> & c", "-o", "x.svg", NULL},
       "a &lt;b&gt; &amp; c"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    run_t r = run_ex(NULL, 0, cases[i].args);
    cr_expect_eq(r.status, 0, "%s: %s", cases[i].args[0], r.err);
    run_free(&r);
    char *t = svg_title("x.svg");
    cr_expect_str_eq(t, cases[i].title);
    free(t);
  }
  /* --width sets the image's width; --minwidth 0 draws every frame (no [N small frames]) */
  run_t r = RUN("segments", "step_5.msnap", "--width", "800", "--minwidth", "0", "-o", "w.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char *svg = read_all(path_in("w.svg"), NULL);
  cr_expect(strstr(svg, "<svg version=\"1.1\" width=\"800\" "), "%.200s", svg);
  cr_expect(!strstr(svg, "<g class=\"small\">"), "--minwidth 0 gathered frames");
  free(svg);
  r = RUN("memory", "step_5.msnap", "--minwidth", "50%", "-o", "p.svg");
  cr_expect_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  svg = read_all(path_in("p.svg"), NULL);
  cr_expect(strstr(svg, "<g class=\"small\">"), "--minwidth 50%% gathered nothing");
  free(svg);
  r = RUN("compare", "step_5.msnap", "b.msnap", "--width", "5");
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "option '--width' needs a number from 21 to 1000000, not '5'"), "%s",
            r.err);
  run_free(&r);
}

/* ---- export --sqlite needs a regular file: a device or FIFO is refused, never written through */

Test(cli_files, export_sqlite_refuses_a_non_regular_output) {
  write_snapshot("a.msnap", NULL);
  cr_assert_eq(mkfifo(path_in("fifo"), 0644), 0);
  run_t r = RUN("export", "a.msnap", "--sqlite", "fifo");
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect(strstr(r.err, "memsnap: error: cannot write a SQLite database to 'fifo': not a regular "
                          "file"),
            "%s", r.err);
  run_free(&r);
  struct stat sb;
  cr_expect(lstat(path_in("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
  cr_expect_null(find_tmp());
}
