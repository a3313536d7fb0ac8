/* SPDX-License-Identifier: MIT
 * memsnap core: internal helpers shared by every file of lib/ (never installed).
 *
 * Assertions come in three levels of cost selected by MS_DEBUG (0-3): ms_assert (1),
 * ms_assert_internal (2) and ms_assert_expensive (3, invariant walkers). Errors are returned with
 * MS_RETURN_IF / MS_FORWARD_IF_ERROR, which log the file and line in debug builds.
 * Prototypes are grouped by the file that defines them.
 */
#ifndef MEMSNAP_LIB_INTERNAL_H
#define MEMSNAP_LIB_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "memsnap/common.h"
#include "memsnap/error.h"

#ifndef MS_DEBUG
#define MS_DEBUG 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ms_likely(x) __builtin_expect(!!(x), 1)
#define ms_unlikely(x) __builtin_expect(!!(x), 0)
#define MS_NOINLINE __attribute__((noinline))
#define MS_ALWAYS_INLINE static inline __attribute__((always_inline))
/* A hot loop's function starts on a 64-byte boundary, so that its loops' place in the
 * instruction fetch does not move with the size of unrelated code before it (the skipped
 * trace's entry loop ran 15 % slower, with the same instructions, after code elsewhere grew) */
#define MS_HOT_ALIGN __attribute__((aligned(64)))
#else
#define ms_likely(x) (x)
#define ms_unlikely(x) (x)
#define MS_NOINLINE
#define MS_ALWAYS_INLINE static inline
#define MS_HOT_ALIGN
#endif

/* "pickle_vm.c": ms_pickle_read_ex() that also says (*cannot_skip, may be NULL) whether it
 * failed only because MS_LOAD_NO_TRACE could not be honoured (a value of the trace is used
 * elsewhere through the memo), so that a caller able to rewind reads the input again in full. */
struct ms_source_s;
struct ms_snapshot_s;
int ms__pickle_read(struct ms_source_s *src, unsigned flags, struct ms_snapshot_s **out,
                    ms_errbuf_t *eb, bool *cannot_skip);
/* ms__pickle_read() of the regular file open as fd, `size` bytes from its start, read through
 * windows mapped from the page cache instead of copies of them (the bytes are not copied; the
 * process's resident memory holds one window of the file at a time). A file that shrinks while
 * it is read fails with MS_EIO where the next window is mapped; one cut inside a window that is
 * being read ends the process with SIGBUS, as any program that maps its input. fd stays open,
 * the caller's. */
int ms__pickle_read_fd(int fd, uint64_t size, unsigned flags, struct ms_snapshot_s **out,
                       ms_errbuf_t *eb, bool *cannot_skip);
/* The mapped windows' size in bytes (8 MiB; at least 256 KiB is used): tests make it small so
 * that fixtures cross windows. */
extern size_t ms__pickle_map_window;
/* false: a skipped trace's entries go through the general loop only, not the one that reads an
 * entry whole (pickle_skim.c): tests compare the two. */
extern bool ms__pickle_skim;
/* false: a kept trace's entries go through the general loop only, not the one that reads an
 * entry whole (pickle_entry.c), and a batch of them is stored one by one (ms__pickle_appends):
 * tests compare the two. */
extern bool ms__pickle_fast;
/* false: the pickle reader keeps every container's object to the end of the read, as it did
 * before it freed those that cannot be named again (pickle_retire.c): tests compare the two. */
extern bool ms__pickle_recycle;
/* The most container objects the last pickle read of this thread held at once, and how many
 * frames lists it made again from the memo after freeing them (tests check that a long trace does
 * not keep one object per entry, and that the lists they name again come back). Per thread: two
 * threads may read at once (compare's two files). */
extern _Thread_local size_t ms__pickle_last_objs, ms__pickle_last_revived;
/* How many trace entries the last pickle read of this thread took whole (pickle_entry.c). */
extern _Thread_local size_t ms__pickle_last_whole;
/* "load.c": ms_snapshot_load_ex() on an open stream, named `name` in messages. rewindable false
 * reads it as standard input is read (one pass, never a seek); true may seek back to re-read a
 * pickle whose trace could not be skipped. fp stays open, the caller's. Also the entry point of
 * tests/fuzz/fuzz_load.c. */
int ms__snapshot_load_fp(FILE *fp, const char *name, bool rewindable, unsigned flags,
                         struct ms_snapshot_s **out, ms_errbuf_t *eb);

/* "bigmem.c": large arrays (1 MiB and more) whose pages a process reuses when the option
 * MS_REUSE_MEMORY is on (see the file comment). malloc/calloc/realloc/free semantics; an array
 * from these functions is freed by ms__big_free only, and nothing else may be passed to them.
 * ms__big_vec_reserve is ms__vec_reserve (common/vec.h) on such an array. */
void *ms__big_malloc(size_t bytes);
void *ms__big_calloc(size_t n, size_t elem);
void *ms__big_realloc(void *p, size_t bytes);
void ms__big_free(void *p);
int ms__big_vec_reserve(void **ptr, size_t *cap, size_t len, size_t extra, size_t elem);
/* Marks p (from these functions) as an array written only here and there (the pickle reader's
 * memo of values): it grows into untouched pages, never the kept resident ones, so that its
 * pages stay untouched where nothing is written, whatever a previous read left kept. */
void ms__big_sparse(void *p);

/* "output.c" */
void ms__message(const char *prefix, const char *fmt, ...) MS_PRINTF(2, 3);
void ms__warning(const char *fmt, ...) MS_PRINTF(1, 2);
void ms__error_msg(const char *fmt, ...) MS_PRINTF(1, 2);
void ms__assert_fail(const char *expr, const char *file, int line, const char *func);
void ms__debug_trace_error(int err, const char *file, int line);
/* Writes a printf-formatted message into eb (if not NULL), truncating; returns err. */
int ms__errbuf_set(ms_errbuf_t *eb, int err, const char *fmt, ...) MS_PRINTF(3, 4);

#if MS_DEBUG >= 1
#define ms_assert(expr) \
  ((expr) ? (void)0 : ms__assert_fail(#expr, __FILE__, __LINE__, __func__))
#else
#define ms_assert(expr) ((void)0)
#endif
#if MS_DEBUG >= 2
#define ms_assert_internal(expr) ms_assert(expr)
#else
#define ms_assert_internal(expr) ((void)0)
#endif
#if MS_DEBUG >= 3
#define ms_assert_expensive(expr) ms_assert(expr)
#else
#define ms_assert_expensive(expr) ((void)0)
#endif

#if MS_DEBUG >= 1
#define MS__TRACE_ERR(err) ms__debug_trace_error((err), __FILE__, __LINE__)
#else
#define MS__TRACE_ERR(err) ((void)0)
#endif

#define MS_RETURN_IF(cond, err) \
  do {                          \
    if (ms_unlikely(cond)) {    \
      MS__TRACE_ERR(err);       \
      return (err);             \
    }                           \
  } while (0)

#define MS_FORWARD_IF_ERROR(expr)     \
  do {                                \
    int ms__e = (expr);               \
    if (ms_unlikely(ms__e != MS_OK)) { \
      MS__TRACE_ERR(ms__e);           \
      return ms__e;                   \
    }                                 \
  } while (0)

#endif /* MEMSNAP_LIB_INTERNAL_H */
