/* SPDX-License-Identifier: MIT
 * memsnap core: return addresses to {name, filename, line} (the only user of libdw).
 *
 * Symbolisation runs only when a snapshot is taken, once per distinct address (each result is
 * remembered). With elfutils' libdw (MS_HAVE_LIBDW), the process's modules are reported from
 * /proc/self/maps; names come from each module's full symbol table (.symtab, so static functions
 * are named too, which dladdr cannot do) and file:line from its DWARF line table, read in-process
 * (no addr2line process per frame: docs/dev/measurements.md, "Symbolisation"). Without libdw, or
 * for a module libdw cannot read, dladdr(3) gives the exported names. Where nothing names an
 * address, the frame reads "module+0xoffset" (the offset of the return address from the module's
 * load base, as backtrace_symbols(3) prints it), with the module's path as its filename.
 *
 * The call site of a return address pc is looked up at pc - 1, so that the line is the line of
 * the call, and a call at the very end of a function is not attributed to the next one.
 * With DWARF, functions inlined at that call site are expanded into frames of their own
 * (innermost first, each with the file and line where it was inlined into the next), as
 * `addr2line -i` shows them: one address can give several frames.
 * Modules loaded after the symbolizer was created are picked up: on a miss, when the dynamic
 * linker's load/unload counters changed, the modules are reported again.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MS_HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#endif

#include "history/history_internal.h"
#include "common/internal.h"
#include "common/hash.h"

typedef struct sym_ent_s {
  uintptr_t pc;        /* 0 = empty slot */
  const ms__sym_t *syms; /* innermost first */
  size_t n;
} sym_ent_t;

typedef struct sym_chunk_s {
  struct sym_chunk_s *next;
  size_t used, cap;
  _Alignas(8) char data[];
} sym_chunk_t;

struct ms__symbolizer_s {
  sym_ent_t *tab;
  size_t cap, count;
  sym_chunk_t *chunks;
#ifdef MS_HAVE_LIBDW
  Dwfl *dwfl;
  unsigned long long adds, subs; /* dl_iterate_phdr counters at the last report */
#endif
};

const char *ms__symbolizer_kind(void) {
#ifdef MS_HAVE_LIBDW
  return "libdw";
#else
  return "dladdr";
#endif
}

/* Arena memory, 8-byte aligned; lives until the symbolizer is destroyed. */
static void *sym_alloc(ms__symbolizer_t *s, size_t n) {
  n = (n + 7) & ~(size_t)7;
  sym_chunk_t *c = s->chunks;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > 16384 ? n : 16384;
    sym_chunk_t *nc = malloc(sizeof *nc + cap);
    if (!nc) return NULL;
    nc->used = 0;
    nc->cap = cap;
    nc->next = c;
    s->chunks = c = nc;
  }
  void *p = c->data + c->used;
  c->used += n;
  return p;
}

static const char *sym_strdup(ms__symbolizer_t *s, const char *str, size_t n) {
  char *p = sym_alloc(s, n + 1);
  if (!p) return NULL;
  memcpy(p, str, n);
  p[n] = 0;
  return p;
}

#ifdef MS_HAVE_LIBDW
static char *dw_debuginfo_path = NULL;
static const Dwfl_Callbacks dw_callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .debuginfo_path = &dw_debuginfo_path,
};

static int dl_counters_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  unsigned long long *c = arg;
  c[0] = info->dlpi_adds;
  c[1] = info->dlpi_subs;
  return 1; /* the counters are the same in every entry: stop at the first */
}

static void dw_report(ms__symbolizer_t *s, int add) {
  unsigned long long c[2] = {0, 0};
  dl_iterate_phdr(dl_counters_cb, c);
  s->adds = c[0];
  s->subs = c[1];
  if (add)
    dwfl_report_begin_add(s->dwfl);
  else
    dwfl_report_begin(s->dwfl);
  if (dwfl_linux_proc_report(s->dwfl, getpid()) != 0)
    ms__warning("symbolize: cannot read this process's modules: %s", dwfl_errmsg(-1));
  dwfl_report_end(s->dwfl, NULL, NULL);
}

static int dw_modules_changed(ms__symbolizer_t *s) {
  unsigned long long c[2] = {0, 0};
  dl_iterate_phdr(dl_counters_cb, c);
  return c[0] != s->adds || c[1] != s->subs;
}
#endif

int ms__symbolizer_create(ms__symbolizer_t **out) {
  ms__symbolizer_t *s = calloc(1, sizeof *s);
  if (!s) return MS_ENOMEM;
#ifdef MS_HAVE_LIBDW
  s->dwfl = dwfl_begin(&dw_callbacks);
  if (s->dwfl)
    dw_report(s, 0);
  else
    ms__warning("symbolize: libdw unavailable (%s); using dladdr", dwfl_errmsg(-1));
#endif
  *out = s;
  return MS_OK;
}

void ms__symbolizer_destroy(ms__symbolizer_t *s) {
  if (!s) return;
#ifdef MS_HAVE_LIBDW
  if (s->dwfl) dwfl_end(s->dwfl);
#endif
  for (sym_chunk_t *c = s->chunks, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  free(s->tab);
  free(s);
}

/* GCC's clones keep the function's name with a suffix (foo.constprop.0, foo.isra.0, foo.part.0,
 * foo.cold): a flame graph should see one function. */
static size_t name_len_without_clone_suffix(const char *name) {
  const char *dot = strchr(name, '.');
  if (!dot || dot == name) return strlen(name);
  static const char *const suffixes[] = {".constprop", ".isra", ".part", ".cold", ".lto_priv",
                                         ".localalias"};
  for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++)
    if (strncmp(dot, suffixes[i], strlen(suffixes[i])) == 0) return (size_t)(dot - name);
  return strlen(name);
}

static const char *base_name(const char *path) {
  const char *b = strrchr(path, '/');
  return b ? b + 1 : path;
}

/* One frame being built (strings borrowed from libdw or dladdr until copied). */
typedef struct raw_frame_s {
  const char *name;
  char file[1024];
  int64_t line;
} raw_frame_t;

#define SYM_MAX_FRAMES (MS__SYM_MAX_INLINE + 1)

#ifdef MS_HAVE_LIBDW
/* The name of a function's DIE (following abstract origins); the linkage name first, so that
 * C++ names match the symbol table's. */
static const char *dw_die_name(Dwarf_Die *d) {
  Dwarf_Attribute a;
  const char *n = NULL;
  if (dwarf_attr_integrate(d, DW_AT_linkage_name, &a)) n = dwarf_formstring(&a);
  if (!n && dwarf_attr_integrate(d, DW_AT_MIPS_linkage_name, &a)) n = dwarf_formstring(&a);
  if (!n && dwarf_attr_integrate(d, DW_AT_name, &a)) n = dwarf_formstring(&a);
  return n;
}

/* Sets f->file to path, joined to the CU's compilation directory when it is relative. */
static void dw_set_file(raw_frame_t *f, Dwarf_Die *cu, const char *path) {
  Dwarf_Attribute a;
  const char *dir = NULL;
  if (path[0] != '/' && dwarf_attr(cu, DW_AT_comp_dir, &a)) dir = dwarf_formstring(&a);
  if (dir && *dir)
    snprintf(f->file, sizeof f->file, "%s/%s", dir, path);
  else
    snprintf(f->file, sizeof f->file, "%s", path);
}

/* Expands the functions inlined at `site` (module address space: site - bias) into fr[0..k):
 * fr[0] gets the innermost inlined function with the line of the address (already in fr[0].file
 * and .line), each later frame the function it was inlined into with the call's file and line.
 * @return the number of frames filled; the last one is the containing function, whose name the
 * caller fills from the symbol table when it has one. */
static size_t dw_inline_frames(Dwfl_Module *m, uintptr_t site, raw_frame_t *fr, size_t cap) {
  Dwarf_Addr bias = 0;
  Dwarf_Die *cu = dwfl_module_addrdie(m, (Dwarf_Addr)site, &bias);
  if (!cu) return 1;
  Dwarf_Die *scopes = NULL;
  int ns = dwarf_getscopes(cu, (Dwarf_Addr)site - bias, &scopes);
  size_t k = 0;
  for (int i = 0; i < ns && k + 1 < cap; i++) {
    int tag = dwarf_tag(&scopes[i]);
    if (tag == DW_TAG_subprogram) {
      fr[k].name = dw_die_name(&scopes[i]);
      break;
    }
    if (tag != DW_TAG_inlined_subroutine) continue;
    /* frame k is this inlined function; frame k + 1 is where it was inlined */
    fr[k].name = dw_die_name(&scopes[i]);
    Dwarf_Attribute a;
    Dwarf_Word idx = 0, line = 0;
    fr[k + 1].name = NULL;
    fr[k + 1].file[0] = 0;
    fr[k + 1].line = 0;
    if (dwarf_attr(&scopes[i], DW_AT_call_file, &a) && dwarf_formudata(&a, &idx) == 0) {
      Dwarf_Files *files;
      size_t nf;
      if (dwarf_getsrcfiles(cu, &files, &nf) == 0 && idx < nf) {
        const char *f = dwarf_filesrc(files, idx, NULL, NULL);
        if (f) dw_set_file(&fr[k + 1], cu, f);
      }
    }
    if (dwarf_attr(&scopes[i], DW_AT_call_line, &a) && dwarf_formudata(&a, &line) == 0)
      fr[k + 1].line = (int64_t)line;
    k++;
  }
  free(scopes);
  return k + 1;
}
#endif

/* Resolves one address (not cached) into frames, innermost first; strings are copied into s's
 * arena. */
static int sym_resolve(ms__symbolizer_t *s, uintptr_t pc, ms__sym_t **out, size_t *nout) {
  uintptr_t site = pc - 1;
  const char *symname = NULL, *module = NULL;
  raw_frame_t fr[SYM_MAX_FRAMES];
  size_t n = 1;
  fr[0].name = NULL;
  fr[0].file[0] = 0;
  fr[0].line = 0;
  uintptr_t base = 0;
  int have_base = 0;
#ifdef MS_HAVE_LIBDW
  if (s->dwfl) {
    Dwfl_Module *m = dwfl_addrmodule(s->dwfl, (Dwarf_Addr)site);
    if (!m && dw_modules_changed(s)) {
      dw_report(s, 1);
      m = dwfl_addrmodule(s->dwfl, (Dwarf_Addr)site);
    }
    if (m) {
      module = dwfl_module_info(m, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
      GElf_Off off = 0;
      GElf_Sym sym;
      symname = dwfl_module_addrinfo(m, (GElf_Addr)site, &off, &sym, NULL, NULL, NULL);
      Dwfl_Line *l = dwfl_module_getsrc(m, (Dwarf_Addr)site);
      if (l) {
        int lineno = 0;
        const char *f = dwfl_lineinfo(l, NULL, &lineno, NULL, NULL, NULL);
        if (f && *f) {
          snprintf(fr[0].file, sizeof fr[0].file, "%s", f);
          fr[0].line = lineno;
          n = dw_inline_frames(m, site, fr, SYM_MAX_FRAMES);
        }
      }
    }
  }
#endif
  Dl_info di;
  if ((!symname || !module) && dladdr((void *)site, &di) != 0) {
    if (!symname && di.dli_sname && di.dli_saddr) symname = di.dli_sname;
    if (!module && di.dli_fname) module = di.dli_fname;
    base = (uintptr_t)di.dli_fbase;
    have_base = 1;
  }
  /* The containing function is named from the symbol table when it has the address. */
  if (symname) fr[n - 1].name = symname;
  if (!module) module = "";
  ms__sym_t *syms = sym_alloc(s, n * sizeof *syms);
  if (!syms) return MS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const char *name = fr[i].name;
    if (name) {
      syms[i].name = sym_strdup(s, name, name_len_without_clone_suffix(name));
    } else {
      char tmp[512];
      if (!have_base && dladdr((void *)site, &di) != 0) {
        base = (uintptr_t)di.dli_fbase;
        have_base = 1;
      }
      if (*module && have_base)
        snprintf(tmp, sizeof tmp, "%s+0x%" PRIxPTR, base_name(module), pc - base);
      else
        snprintf(tmp, sizeof tmp, "0x%" PRIxPTR, pc);
      syms[i].name = sym_strdup(s, tmp, strlen(tmp));
    }
    const char *file = fr[i].file[0] ? fr[i].file : *module ? module : "??";
    syms[i].filename = sym_strdup(s, file, strlen(file));
    syms[i].module = sym_strdup(s, module, strlen(module));
    syms[i].line = fr[i].file[0] ? fr[i].line : 0;
    if (!syms[i].name || !syms[i].filename || !syms[i].module) return MS_ENOMEM;
  }
  *out = syms;
  *nout = n;
  return MS_OK;
}

int ms__symbolize(ms__symbolizer_t *s, uintptr_t pc, const ms__sym_t **out, size_t *n) {
  if ((s->count + 1) * 2 > s->cap) {
    size_t ncap = s->cap ? s->cap * 2 : 1024;
    sym_ent_t *nt = calloc(ncap, sizeof *nt);
    if (!nt) return MS_ENOMEM;
    for (size_t i = 0; i < s->cap; i++) {
      if (!s->tab[i].pc) continue;
      size_t j = (size_t)ms_hash_u64(s->tab[i].pc) & (ncap - 1);
      while (nt[j].pc) j = (j + 1) & (ncap - 1);
      nt[j] = s->tab[i];
    }
    free(s->tab);
    s->tab = nt;
    s->cap = ncap;
  }
  /* 0 marks an empty slot, so pc 0 (never a real return address) is stored under UINTPTR_MAX. */
  uintptr_t key = pc ? pc : UINTPTR_MAX;
  size_t mask = s->cap - 1, j = (size_t)ms_hash_u64(key) & mask;
  for (; s->tab[j].pc; j = (j + 1) & mask)
    if (s->tab[j].pc == key) {
      *out = s->tab[j].syms;
      *n = s->tab[j].n;
      return MS_OK;
    }
  ms__sym_t *syms;
  size_t k;
  MS_FORWARD_IF_ERROR(sym_resolve(s, pc, &syms, &k));
  s->tab[j].pc = key;
  s->tab[j].syms = syms;
  s->tab[j].n = k;
  s->count++;
  *out = syms;
  *n = k;
  return MS_OK;
}
