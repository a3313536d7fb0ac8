/* SPDX-License-Identifier: MIT
 * memsnap run: whether some loaded object besides the interposer defines a function (issue #35
 * item 11). The interposer's exported CUDA functions are GNU indirect functions (preload.c): the
 * dynamic loader asks their resolver for the address whenever it binds one (a program's call,
 * dlsym), and the resolver answers the hook only when a CUDA runtime defines the function too,
 * else NULL. So a program without CUDA that looks cudaMalloc up with dlsym(RTLD_DEFAULT) finds
 * nothing, as without memsnap, and a program with a runtime (linked, or loaded later, privately
 * too) gets the hook.
 *
 * The resolvers can run while the loader relocates the program at start, before libc is
 * initialised, so this file calls no function at all: it walks the loader's list of objects
 * (_r_debug) and looks the name up in each one's dynamic symbol table through its GNU or SysV
 * hash table, as the loader itself does. Only defined functions count (a reference to cudaMalloc
 * from the program is no definition).
 */
#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "interpose/run_internal.h"

extern ElfW(Dyn) _DYNAMIC[] __attribute__((visibility("hidden"))); /* the interposer's own */

static bool vis_name_eq(const char *a, const char *b) {
  while (*a && *a == *b)
    a++, b++;
  return *a == *b;
}

static uint32_t vis_gnu_hash(const char *s) {
  uint32_t h = 5381;
  for (; *s; s++)
    h = h * 33 + (unsigned char)*s;
  return h;
}

static uint32_t vis_sysv_hash(const char *s) {
  uint32_t h = 0;
  for (; *s; s++) {
    h = (h << 4) + (unsigned char)*s;
    uint32_t g = h & 0xf0000000u;
    if (g) h ^= g >> 24;
    h &= ~g;
  }
  return h;
}

/* The loader rewrites an object's dynamic pointers as addresses when it loads it, except where
 * that section is read-only (the vDSO): there they stay offsets from the load address. */
static uintptr_t vis_ptr(const struct link_map *lm, ElfW(Addr) v) {
  return v < lm->l_addr ? lm->l_addr + v : v;
}

static bool vis_is_definition(const ElfW(Sym) *s) {
  int type = ELF64_ST_TYPE(s->st_info), bind = ELF64_ST_BIND(s->st_info); /* same in ELF32 */
  return s->st_shndx != SHN_UNDEF && (type == STT_FUNC || type == STT_GNU_IFUNC) &&
         (bind == STB_GLOBAL || bind == STB_WEAK);
}

static const ElfW(Sym) *vis_gnu_lookup(const uint32_t *gh, const ElfW(Sym) *symtab,
                                       const char *strtab, const char *name) {
  uint32_t nbuckets = gh[0], symoffset = gh[1], bloom_size = gh[2], bloom_shift = gh[3];
  if (!nbuckets || !bloom_size) return NULL;
  const ElfW(Addr) *bloom = (const ElfW(Addr) *)(const void *)&gh[4];
  const uint32_t *buckets = (const uint32_t *)(const void *)&bloom[bloom_size];
  const uint32_t *chain = &buckets[nbuckets];
  const unsigned bits = sizeof(ElfW(Addr)) * 8;
  uint32_t h = vis_gnu_hash(name);
  ElfW(Addr) word = bloom[(h / bits) % bloom_size];
  ElfW(Addr) mask = ((ElfW(Addr))1 << (h % bits)) | ((ElfW(Addr))1 << ((h >> bloom_shift) % bits));
  if ((word & mask) != mask) return NULL;
  uint32_t i = buckets[h % nbuckets];
  if (i < symoffset) return NULL;
  for (;; i++) {
    uint32_t h2 = chain[i - symoffset];
    if ((h | 1) == (h2 | 1) && vis_name_eq(name, strtab + symtab[i].st_name)) return &symtab[i];
    if (h2 & 1) return NULL;
  }
}

static const ElfW(Sym) *vis_sysv_lookup(const uint32_t *hash, const ElfW(Sym) *symtab,
                                        const char *strtab, const char *name) {
  uint32_t nbucket = hash[0];
  if (!nbucket) return NULL;
  const uint32_t *bucket = &hash[2], *chain = &hash[2 + nbucket];
  for (uint32_t i = bucket[vis_sysv_hash(name) % nbucket]; i != STN_UNDEF; i = chain[i])
    if (vis_name_eq(name, strtab + symtab[i].st_name)) return &symtab[i];
  return NULL;
}

static bool vis_defines(const struct link_map *lm, const char *name) {
  const ElfW(Sym) *symtab = NULL;
  const char *strtab = NULL;
  const uint32_t *gnu = NULL, *sysv = NULL;
  for (const ElfW(Dyn) *d = lm->l_ld; d && d->d_tag != DT_NULL; d++) {
    if (d->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)vis_ptr(lm, d->d_un.d_ptr);
    if (d->d_tag == DT_STRTAB) strtab = (const char *)vis_ptr(lm, d->d_un.d_ptr);
    if (d->d_tag == DT_GNU_HASH) gnu = (const uint32_t *)vis_ptr(lm, d->d_un.d_ptr);
    if (d->d_tag == DT_HASH) sysv = (const uint32_t *)vis_ptr(lm, d->d_un.d_ptr);
  }
  if (!symtab || !strtab) return false;
  const ElfW(Sym) *s = gnu    ? vis_gnu_lookup(gnu, symtab, strtab, name)
                       : sysv ? vis_sysv_lookup(sysv, symtab, strtab, name)
                              : NULL;
  return s && vis_is_definition(s);
}

bool ms__run_defined_elsewhere(const char *name) {
  for (const struct link_map *lm = _r_debug.r_map; lm; lm = lm->l_next)
    if (lm->l_ld != _DYNAMIC && vis_defines(lm, name)) return true;
  return false;
}
