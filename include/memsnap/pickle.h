/* SPDX-License-Identifier: MIT
 * memsnap: PyTorch memory-snapshot pickles, read and written (issue #4; docs/pytorch.md).
 *
 * torch.cuda.memory._dump_snapshot() pickles the dict returned by _snapshot(). The reader accepts
 * every era PyTorch has written (a bare list of segments before 2.0; per-block `history` in 2.0;
 * `frames`, `device_traces`, `time_us`, `compile_context`, `user_metadata`, `allocator_settings`
 * and `external_annotations` later), in pickle protocols 2 to 5, and fills the snapshot model
 * (memsnap/snapshot.h) directly while it streams the input: there is no intermediate object tree
 * and the input is never held in memory as a whole.
 *
 * Safety: the reader never executes anything. Opcodes that would import or call Python code
 * (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT1/2/4)
 * and out-of-band buffers are refused with MS_EREFUSED and a message naming the opcode and its
 * byte offset. Stack depth, memo size and declared lengths are bounded; a declared length is only
 * ever backed by memory as the input actually delivers the bytes.
 *
 * Error messages have the shape "offset N: <key path>: <what>", e.g.
 * "offset 1234: segments[3].blocks[7].size: expected int, got str".
 *
 * Thread-safety: the functions share no state; distinct calls may run concurrently.
 */
#ifndef MEMSNAP_PICKLE_H
#define MEMSNAP_PICKLE_H

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"

MS_EXTERN_C_BEGIN

/* Reads a PyTorch snapshot pickle from src and builds a snapshot.
 * @return MS_OK and *out (free it with ms_snapshot_free()), or on failure a negative ms_err with
 * *out untouched and a description in eb (may be NULL):
 *   MS_ETRUNCATED   the input ended early (or inside a declared length);
 *   MS_EREFUSED     an opcode that would run code (GLOBAL, REDUCE, ...);
 *   MS_EFORMAT      not a snapshot's structure, or a field of the wrong type;
 *   MS_ELIMIT       stack depth, memo index or a length beyond the reader's bounds;
 *   MS_EUNSUPPORTED a pickle protocol above 5 or an opcode of protocol 0 the reader lacks;
 *   an error returned by src->read (usually MS_EIO); MS_ENOMEM. */
MS_API MS_NODISCARD int ms_pickle_read(ms_source_t *src, ms_snapshot_t **out, ms_errbuf_t *eb);

/* ms_pickle_read() that may leave out what flags (MS_LOAD_*, memsnap/serialize.h) say:
 * MS_LOAD_NO_TRACE: the entries of device_traces are parsed as pickle opcodes (so a truncated or
 * malformed pickle is still an error) but not built or examined (their fields are not
 * type-checked); the snapshot lists the devices with no trace entries and has MS_SNAP_TRACE_SKIPPED in `present`.
 * A file that shares a container of device_traces with a later part through the memo cannot be
 * read so: MS_EUNSUPPORTED (ms_snapshot_load_ex then reads it again in full).
 * MS_LOAD_NO_TRACE_STACKS: see memsnap/serialize.h. A file that shares a frames list through the
 * memo between an entry whose stack is left out and a place that keeps its stack, or that names
 * an entry's action again after its frames, cannot be read so: MS_EUNSUPPORTED (likewise).
 * @return as ms_pickle_read(); MS_EINVAL for unknown flags. */
MS_API MS_NODISCARD int ms_pickle_read_ex(ms_source_t *src, unsigned flags, ms_snapshot_t **out,
                                          ms_errbuf_t *eb);

/* Writes snap as a pickle (protocol 4, with FRAME opcodes, as Python's pickle.dump) that
 * PyTorch's _memory_viz.py and its web viewer (pytorch.org/memory_viz) load.
 * Era: a snapshot read from a PyTorch pickle is written back in its own era (its `present` bits
 * say which keys it had: a 2.0 file stays a 2.0 file, a bare list stays a bare list); a memsnap
 * snapshot is written in the newest format. Frame dicts and frame lists that occur more than once
 * are written once and then referenced through the memo, as PyTorch does, so files stay small.
 * memsnap's additions that PyTorch's format has no place for (statistics, capacity, process
 * identity) are not written. Memory use is bounded (one 64 KiB frame plus the memo tables).
 * @return MS_OK, an error returned by sink->write, or MS_ENOMEM; eb (may be NULL) says what. */
MS_API MS_NODISCARD int ms_pickle_write(const ms_snapshot_t *snap, ms_sink_t *sink,
                                        ms_errbuf_t *eb);

/* ms_pickle_write() into path, atomically (temporary file in the same directory, fsync, rename:
 * see ms_atomic_file_open()); "-" writes to standard output. On failure the final name is
 * untouched. */
MS_API MS_NODISCARD int ms_pickle_write_file(const ms_snapshot_t *snap, const char *path,
                                             ms_errbuf_t *eb);

MS_EXTERN_C_END

#endif /* MEMSNAP_PICKLE_H */
