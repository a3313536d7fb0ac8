/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap run [options] -- PROGRAM [ARGS...]` (issue #18, docs/run.md): runs an
 * unmodified CUDA program with memsnap's interposer (libmemsnap_preload.so) prepended to
 * LD_PRELOAD, its options passed in MEMSNAP_RUN_* variables, and returns the program's exit
 * status (128 + N when a signal N killed it). The interposer writes the snapshots (at exit, on
 * OOM, on SIGUSR1, every N seconds); this command checks what it can before the program starts:
 * the pattern, the output directory, and whether the program can be interposed at all (a program
 * linked statically, or one that contains the CUDA runtime itself, cannot).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/config.h"
#include "memsnap/history.h"

#ifndef MS_PRELOAD_NAME
#define MS_PRELOAD_NAME "libmemsnap_preload.so"
#endif
#ifndef MS_INSTALL_LIBDIR
#define MS_INSTALL_LIBDIR "lib"
#endif
#ifndef MS_INSTALL_FULL_LIBDIR
#define MS_INSTALL_FULL_LIBDIR "/usr/local/lib"
#endif

static const char run_usage[] =
    "usage: memsnap run [--observe | --cache] [-o PATTERN] [--every SECONDS] [--stacks N]\n"
    "                   [--no-stacks] [--unwind fp|backtrace] [--max-entries N]\n"
    "                   [--max-oom-snapshots N] [--no-signal] [--quiet] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Runs PROGRAM with memsnap's interposer in LD_PRELOAD: its CUDA device-memory calls\n"
    "(cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync, the memory-pool calls,\n"
    "cudaMallocManaged, cudaMallocPitch, cudaMalloc3D) are recorded with their stacks, and\n"
    "memsnap snapshots are written at exit, on an out-of-memory error, on SIGUSR1 and every\n"
    "N seconds. Every memsnap command reads them. Exits with PROGRAM's exit status (128 + N\n"
    "if signal N killed it). docs/run.md has the details.\n"
    "\n"
    "options:\n"
    "  --observe          record every call, change nothing (default)\n"
    "  --cache            serve cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync from\n"
    "                     memsnap's caching allocator (configured by MEMSNAP_ALLOC_CONF)\n"
    "  -o PATTERN         snapshot file names: %p process id, %n sequence number (0, 1, ...),\n"
    "                     %d device (one file per device), %% a percent sign\n"
    "                     (default memsnap-%p-%n.msgpack)\n"
    "  --every SECONDS    also write a snapshot every SECONDS (e.g. 10, 0.5)\n"
    "  --stacks N         frames kept per stack, 1..128 (default 32)\n"
    "  --no-stacks        record no stacks\n"
    "  --unwind KIND      fp: frame-pointer walk, checked, falling back to backtrace(3) "
    "(default);\n"
    "                     backtrace: backtrace(3) always\n"
    "  --max-entries N    trace entries kept, oldest dropped first (default 1000000)\n"
    "  --max-oom-snapshots N  OOM snapshots (and messages) written at most; later OOMs are\n"
    "                     in the trace only (default 10)\n"
    "  --no-signal        SIGUSR1 keeps its default meaning (terminate)\n"
    "  --quiet            no 'snapshot written' lines (OOM messages are always printed)\n"
    "  -h, --help         show this help\n"
    "\n"
    "environment: MEMSNAP_PRELOAD_LIB names the interposer library to use.\n";

/* ---- finding things ------------------------------------------------------------------------- */

static bool run_is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The interposer: $MEMSNAP_PRELOAD_LIB, else next to this executable (build tree: ../lib; an
 * installation: ../<libdir>), else the installation's library directory. */
static int run_find_preload(char *dst, size_t cap) {
  const char *env = getenv("MEMSNAP_PRELOAD_LIB");
  if (env && *env) {
    if (!run_is_file(env)) {
      cli_error("cannot use MEMSNAP_PRELOAD_LIB='%s': %s", env, strerror(errno ? errno : ENOENT));
      return CLI_FAILURE;
    }
    if (!realpath(env, dst)) snprintf(dst, cap, "%s", env);
    return CLI_OK;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    const char *rel[] = {"../lib", "../" MS_INSTALL_LIBDIR};
    for (size_t i = 0; i < 2; i++) {
      char cand[PATH_MAX + 64];
      snprintf(cand, sizeof cand, "%s/%s/%s", exe, rel[i], MS_PRELOAD_NAME);
      if (run_is_file(cand) && realpath(cand, dst)) return CLI_OK;
    }
  }
  char cand[PATH_MAX];
  snprintf(cand, sizeof cand, "%s/%s", MS_INSTALL_FULL_LIBDIR, MS_PRELOAD_NAME);
  if (run_is_file(cand)) {
    snprintf(dst, cap, "%s", cand);
    return CLI_OK;
  }
  cli_error("cannot find the interposer '%s' next to memsnap or in '%s'; set "
            "MEMSNAP_PRELOAD_LIB to its path",
            MS_PRELOAD_NAME, MS_INSTALL_FULL_LIBDIR);
  return CLI_FAILURE;
}

/* PROGRAM as execvp would find it. */
static int run_find_program(const char *prog, char *dst, size_t cap) {
  if (strchr(prog, '/')) {
    if (access(prog, F_OK) != 0) {
      cli_error("cannot run '%s': %s", prog, strerror(errno));
      return CLI_FAILURE;
    }
    if (access(prog, X_OK) != 0 || !run_is_file(prog)) {
      cli_error("cannot run '%s': %s", prog, strerror(errno ? errno : EACCES));
      return CLI_FAILURE;
    }
    snprintf(dst, cap, "%s", prog);
    return CLI_OK;
  }
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
  for (const char *p = path; *p;) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    char cand[PATH_MAX];
    if (len == 0)
      snprintf(cand, sizeof cand, "./%s", prog);
    else
      snprintf(cand, sizeof cand, "%.*s/%s", (int)len, p, prog);
    if (run_is_file(cand) && access(cand, X_OK) == 0) {
      snprintf(dst, cap, "%s", cand);
      return CLI_OK;
    }
    p += len + (colon ? 1 : 0);
  }
  cli_error("cannot run '%s': not found in PATH", prog);
  return CLI_FAILURE;
}

/* ---- can the program be interposed? ---------------------------------------------------------- */

typedef enum run_link {
  RUN_LINK_DYNAMIC = 0, /* dynamically linked, CUDA runtime not inside: interposable */
  RUN_LINK_NOT_ELF,     /* a script or something else: interposed through its interpreter */
  RUN_LINK_STATIC,      /* no dynamic loader at all: LD_PRELOAD is ignored */
  RUN_LINK_CUDART,      /* contains the CUDA runtime (libcudart_static) */
} run_link;

#define RUN_RD16(p) ((uint16_t)((p)[0] | (p)[1] << 8))
#define RUN_RD32(p) ((uint32_t)RUN_RD16(p) | (uint32_t)RUN_RD16((p) + 2) << 16)
#define RUN_RD64(p) ((uint64_t)RUN_RD32(p) | (uint64_t)RUN_RD32((p) + 4) << 32)

/* Looks through a 64-bit little-endian ELF file (mapped at m, len bytes) for a PT_INTERP and a
 * definition of cudaMalloc in .symtab or .dynsym; a stripped file (no .symtab) is searched for
 * the CUDA runtime's own error name "cudaErrorCudartUnloading", which a program linked against
 * the shared runtime never contains. Every offset is checked against len. */
static run_link run_elf_link(const unsigned char *m, size_t len) {
  if (len < 64 || memcmp(m, "\177ELF", 4) != 0 || m[4] != 2 || m[5] != 1) return RUN_LINK_NOT_ELF;
  uint64_t phoff = RUN_RD64(m + 32), shoff = RUN_RD64(m + 40);
  uint16_t phentsize = RUN_RD16(m + 54), phnum = RUN_RD16(m + 56);
  uint16_t shentsize = RUN_RD16(m + 58), shnum = RUN_RD16(m + 60);
  bool interp = false;
  if (phentsize >= 56 && phoff < len && (uint64_t)phnum * phentsize <= len - phoff)
    for (uint16_t i = 0; i < phnum; i++)
      if (RUN_RD32(m + phoff + (uint64_t)i * phentsize) == 3 /* PT_INTERP */) interp = true;
  bool have_symtab = false, defines = false;
  if (shentsize >= 64 && shoff < len && (uint64_t)shnum * shentsize <= len - shoff) {
    for (uint16_t i = 0; i < shnum && !defines; i++) {
      const unsigned char *sh = m + shoff + (uint64_t)i * shentsize;
      uint32_t type = RUN_RD32(sh + 4);
      if (type != 2 /* SHT_SYMTAB */ && type != 11 /* SHT_DYNSYM */) continue;
      if (type == 2) have_symtab = true;
      uint64_t off = RUN_RD64(sh + 24), size = RUN_RD64(sh + 32), entsize = RUN_RD64(sh + 56);
      uint32_t link = RUN_RD32(sh + 40);
      if (entsize < 24 || off > len || size > len - off || link >= shnum) continue;
      const unsigned char *ssh = m + shoff + (uint64_t)link * shentsize;
      uint64_t soff = RUN_RD64(ssh + 24), ssize = RUN_RD64(ssh + 32);
      if (soff > len || ssize > len - soff) continue;
      for (uint64_t k = 0; k + entsize <= size; k += entsize) {
        const unsigned char *sym = m + off + k;
        uint32_t name = RUN_RD32(sym);
        uint16_t shndx = RUN_RD16(sym + 6);
        if (shndx == 0 || name >= ssize) continue;
        const char *nm = (const char *)m + soff + name;
        size_t room = ssize - name;
        if (room > 10 && memcmp(nm, "cudaMalloc", 11) == 0) {
          defines = true;
          break;
        }
      }
    }
  }
  if (defines) return RUN_LINK_CUDART;
  if (!have_symtab && memmem(m, len, "cudaErrorCudartUnloading", 24)) return RUN_LINK_CUDART;
  return interp ? RUN_LINK_DYNAMIC : RUN_LINK_STATIC;
}

static run_link run_program_link(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return RUN_LINK_NOT_ELF;
  struct stat st;
  run_link r = RUN_LINK_NOT_ELF;
  if (fstat(fd, &st) == 0 && st.st_size >= 64) {
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      r = run_elf_link(m, (size_t)st.st_size);
      munmap(m, (size_t)st.st_size);
    }
  }
  close(fd);
  return r;
}

/* ---- running --------------------------------------------------------------------------------- */

static volatile sig_atomic_t run_child_pid;

static void run_forward(int sig) {
  pid_t pid = (pid_t)run_child_pid;
  if (pid > 0) kill(pid, sig);
}

static bool run_parse_uint(const char *s, unsigned long long max, unsigned long long *out) {
  if (!s || !*s || *s == '-' || *s == '+') return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > max) return false;
  *out = v;
  return true;
}

/* Checks that the directory of the pattern's first file exists and is writable. */
static int run_check_output(const char *pattern) {
  char path[PATH_MAX];
  int err = ms_oom_path_format(pattern, 0, 0, path, sizeof path);
  if (err != MS_OK) {
    return cli_usage_error("run", "invalid output pattern '%s': %s", pattern,
                           err == MS_ELIMIT ? "too long" : "use %p, %n, %d or %%");
  }
  char *slash = strrchr(path, '/');
  const char *dir = ".";
  if (slash == path)
    dir = "/";
  else if (slash) {
    *slash = 0;
    dir = path;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    cli_error("cannot write snapshots into '%s': %s", dir, strerror(errno));
    return CLI_FAILURE;
  }
  return CLI_OK;
}

/* The options of `memsnap run` (run_usage). */
typedef struct run_args_s {
  const char *mode, *pattern, *every, *unwind;
  unsigned long long stacks, max_entries, max_oom;
  bool max_oom_given, no_stacks, stacks_given, quiet, no_signal;
  int prog; /* argv index of the program */
} run_args_t;

/* Parses the options up to the program. @return CLI_OK, CLI_HELP_SHOWN or a usage error. */
static int run_parse_args(int argc, char **argv, run_args_t *o) {
  memset(o, 0, sizeof *o);
  o->stacks = 32;
  o->max_oom = 10;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-' || a[1] == 0) break; /* the program */
    const char *val = NULL;
    char name[32];
    const char *eq = strchr(a, '=');
    if (a[1] == '-' && eq) {
      snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
      val = eq + 1;
    } else if (a[1] != '-' && a[2] != 0) { /* -oVALUE */
      snprintf(name, sizeof name, "%.2s", a);
      val = a + 2;
    } else {
      snprintf(name, sizeof name, "%s", a);
    }
    bool takes = strcmp(name, "-o") == 0 || strcmp(name, "--output") == 0 ||
                 strcmp(name, "--every") == 0 || strcmp(name, "--stacks") == 0 ||
                 strcmp(name, "--unwind") == 0 || strcmp(name, "--max-entries") == 0 ||
                 strcmp(name, "--max-oom-snapshots") == 0;
    if (takes && !val) {
      if (i + 1 >= argc) return cli_usage_error("run", "option '%s' needs a value", name);
      val = argv[++i];
    } else if (!takes && val) {
      return cli_usage_error("run", "option '%s' takes no value", name);
    }
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) {
      cli_print_help(run_usage, stdout);
      return CLI_HELP_SHOWN;
    } else if (strcmp(name, "--observe") == 0 || strcmp(name, "--cache") == 0) {
      const char *m = strcmp(name, "--cache") == 0 ? "cache" : "observe";
      if (o->mode && strcmp(o->mode, m) != 0)
        return cli_usage_error("run", "--observe and --cache exclude each other");
      o->mode = m;
    } else if (strcmp(name, "-o") == 0 || strcmp(name, "--output") == 0) {
      o->pattern = val;
    } else if (strcmp(name, "--every") == 0) {
      char *end;
      double v = strtod(val, &end);
      if (!*val || *end || !(v > 0) || v > 1e9)
        return cli_usage_error("run", "--every wants a positive number of seconds, not '%s'", val);
      o->every = val;
    } else if (strcmp(name, "--stacks") == 0) {
      if (!run_parse_uint(val, MS_HISTORY_MAX_FRAMES, &o->stacks) || o->stacks == 0)
        return cli_usage_error("run", "--stacks wants 1..%d frames, not '%s'",
                               MS_HISTORY_MAX_FRAMES, val);
      o->stacks_given = true;
    } else if (strcmp(name, "--no-stacks") == 0) {
      o->no_stacks = true;
    } else if (strcmp(name, "--unwind") == 0) {
      if (strcmp(val, "fp") != 0 && strcmp(val, "backtrace") != 0)
        return cli_usage_error("run", "--unwind wants fp or backtrace, not '%s'", val);
      o->unwind = val;
    } else if (strcmp(name, "--max-entries") == 0) {
      if (!run_parse_uint(val, 1ULL << 32, &o->max_entries) || o->max_entries == 0)
        return cli_usage_error("run", "--max-entries wants 1..4294967296, not '%s'", val);
    } else if (strcmp(name, "--max-oom-snapshots") == 0) {
      if (!run_parse_uint(val, 1000000, &o->max_oom))
        return cli_usage_error("run", "--max-oom-snapshots wants 0..1000000, not '%s'", val);
      o->max_oom_given = true;
    } else if (strcmp(name, "--quiet") == 0) {
      o->quiet = true;
    } else if (strcmp(name, "--no-signal") == 0) {
      o->no_signal = true;
    } else {
      return cli_usage_error("run", "unknown option '%s'", a);
    }
  }
  if (i >= argc) return cli_usage_error("run", "no program to run");
  if (o->no_stacks && o->stacks_given)
    return cli_usage_error("run", "--stacks and --no-stacks exclude each other");
  if (o->mode &&
      strcmp(o->mode, "cache") == 0) { /* the allocators read MEMSNAP_ALLOC_CONF: check it now */
    ms_alloc_config_t conf;
    ms_errbuf_t eb = {{0}};
    ms_alloc_config_init(&conf);
    if (ms_alloc_config_from_env(&conf, &eb) != MS_OK) return cli_usage_error("run", "%s", eb.msg);
  }
  if (!o->pattern) o->pattern = "memsnap-%p-%n.msgpack";
  o->prog = i;
  return CLI_OK;
}

/* Finds the interposer and the program (prog), and warns when the program cannot be
 * intercepted (a static CUDA runtime, a static program). @return CLI_OK or CLI_FAILURE. */
static bool run_link_warned; /* said already that no snapshot will be written */

static int run_prepare(const char *name, char *preload, size_t pcap, char *prog, size_t cap) {
  int rc;
  if ((rc = run_find_preload(preload, pcap)) != CLI_OK) return rc;
  if (strpbrk(preload, " :\t")) {
    cli_error("the interposer's path '%s' contains a space or a colon, which LD_PRELOAD cannot "
              "carry; set MEMSNAP_PRELOAD_LIB to a copy of it whose path has none",
              preload);
    return CLI_FAILURE;
  }
  if ((rc = run_find_program(name, prog, cap)) != CLI_OK) return rc;
  switch (run_program_link(prog)) {
  case RUN_LINK_CUDART:
    cli_warning("'%s' contains the CUDA runtime (linked with libcudart_static): its cudaMalloc "
                "calls stay inside it and cannot be intercepted, so no snapshot will be written. "
                "Relink it with the shared runtime (nvcc -cudart shared, or -lcudart instead of "
                "-lcudart_static; CMake: set CUDA_RUNTIME_LIBRARY Shared) and run it again",
                name);
    break;
  case RUN_LINK_STATIC:
    cli_warning("'%s' is linked statically: the dynamic loader never runs, so LD_PRELOAD cannot "
                "intercept anything and no snapshot will be written; link it dynamically",
                name);
    break;
  default:
    return CLI_OK;
  }
  run_link_warned = true;
  return CLI_OK;
}

/* In the child: the interposer first in LD_PRELOAD, and the options in MEMSNAP_RUN_*. */
static void run_child_env(const run_args_t *o, const char *ld) {
  char stacks_s[32], entries_s[32], oom_s[32];
  snprintf(oom_s, sizeof oom_s, "%llu", o->max_oom);
  snprintf(stacks_s, sizeof stacks_s, "%llu", o->no_stacks ? 0ULL : o->stacks);
  snprintf(entries_s, sizeof entries_s, "%llu", o->max_entries);
  setenv("LD_PRELOAD", ld, 1);
  setenv("MEMSNAP_RUN_MODE", o->mode ? o->mode : "observe", 1);
  setenv("MEMSNAP_RUN_OUTPUT", o->pattern, 1);
  setenv("MEMSNAP_RUN_STACKS", stacks_s, 1);
  if (o->every)
    setenv("MEMSNAP_RUN_EVERY", o->every, 1);
  else
    unsetenv("MEMSNAP_RUN_EVERY");
  if (o->unwind)
    setenv("MEMSNAP_RUN_UNWIND", o->unwind, 1);
  else
    unsetenv("MEMSNAP_RUN_UNWIND");
  if (o->max_entries)
    setenv("MEMSNAP_RUN_MAX_ENTRIES", entries_s, 1);
  else
    unsetenv("MEMSNAP_RUN_MAX_ENTRIES");
  if (o->max_oom_given)
    setenv("MEMSNAP_RUN_MAX_OOM", oom_s, 1);
  else
    unsetenv("MEMSNAP_RUN_MAX_OOM");
  setenv("MEMSNAP_RUN_QUIET", o->quiet ? "1" : "0", 1);
  setenv("MEMSNAP_RUN_SIGNAL", o->no_signal ? "0" : "1", 1);
}

/* Waits for the program. @return its exit status, 128 + N when signal N killed it. */
/* A file that the interposer appends a byte to whenever a process of the program writes a
 * snapshot (MEMSNAP_RUN_SEEN); *path is "" when none could be made (then nothing is said). */
static void run_seen_create(char *path, size_t cap) {
  const char *t = getenv("TMPDIR");
  snprintf(path, cap, "%s/.memsnap-run-XXXXXX", t && *t ? t : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) {
    path[0] = 0;
    return;
  }
  close(fd);
}

/* After the program: when no process of it wrote a snapshot, says why that may be. */
static void run_seen_report(const char *path, const char *name) {
  struct stat st;
  if (!path[0]) return;
  bool seen = stat(path, &st) != 0 || st.st_size > 0;
  unlink(path);
  if (seen || run_link_warned) return;
  cli_warning("no CUDA call was seen in '%s', so no snapshot was written: it made no "
              "device-memory calls, or it is linked with the static CUDA runtime (nvcc's "
              "default; build it with -cudart shared), whose calls cannot be interposed",
              name);
}

static int run_status(int status, const char *name) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    cli_warning("'%s' was killed by signal %d (%s)", name, sig, strsignal(sig));
    return 128 + sig;
  }
  return CLI_FAILURE;
}

int cmd_run(int argc, char **argv) {
  run_args_t o;
  int rc = run_parse_args(argc, argv, &o);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  int i = o.prog;
  if ((rc = run_check_output(o.pattern)) != CLI_OK) return rc;
  char preload[PATH_MAX], prog[PATH_MAX];
  if ((rc = run_prepare(argv[i], preload, sizeof preload, prog, sizeof prog)) != CLI_OK) return rc;

  /* The environment of the program. */
  const char *old = getenv("LD_PRELOAD");
  size_t need = strlen(preload) + (old ? strlen(old) + 2 : 1);
  char *ld = malloc(need);
  if (!ld) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  snprintf(ld, need, "%s%s%s", preload, old && *old ? ":" : "", old && *old ? old : "");

  struct sigaction fwd, ign, old_int, old_quit, old_sig[4];
  memset(&fwd, 0, sizeof fwd);
  fwd.sa_handler = run_forward;
  fwd.sa_flags = SA_RESTART;
  sigemptyset(&fwd.sa_mask);
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  static const int fwd_sigs[4] = {SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

  for (int k = 0; k < 4; k++)
    sigaction(fwd_sigs[k], &fwd, &old_sig[k]); /* reset by exec */
  char seen[PATH_MAX];
  run_seen_create(seen, sizeof seen);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    if (seen[0]) unlink(seen);
    cli_error("cannot run '%s': fork: %s", argv[i], strerror(errno));
    for (int k = 0; k < 4; k++)
      sigaction(fwd_sigs[k], &old_sig[k], NULL);
    free(ld);
    return CLI_FAILURE;
  }
  if (pid == 0) {
    run_child_env(&o, ld);
    if (seen[0]) setenv("MEMSNAP_RUN_SEEN", seen, 1);
    execv(prog, argv + i);
    int e = errno;
    fprintf(stderr, "memsnap: error: cannot run '%s': %s\n", argv[i], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
  }
  free(ld);
  run_child_pid = pid;
  /* Like system(3): the terminal's interrupt reaches the program itself; we wait for it. Other
   * signals sent to memsnap are passed on to the program (kill -USR1 <memsnap's pid> works). */
  sigaction(SIGINT, &ign, &old_int);
  sigaction(SIGQUIT, &ign, &old_quit);
  int status = 0;
  pid_t w;
  do
    w = waitpid(pid, &status, 0);
  while (w < 0 && errno == EINTR);
  run_child_pid = 0;
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGQUIT, &old_quit, NULL);
  for (int k = 0; k < 4; k++)
    sigaction(fwd_sigs[k], &old_sig[k], NULL);
  if (w < 0) {
    if (seen[0]) unlink(seen);
    cli_error("cannot wait for '%s': %s", argv[i], strerror(errno));
    return CLI_FAILURE;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) >= 126) /* not run: already said */
    unlink(seen);
  else
    run_seen_report(seen, argv[i]);
  return run_status(status, argv[i]);
}
