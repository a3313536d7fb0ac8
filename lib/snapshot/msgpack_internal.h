/* SPDX-License-Identifier: MIT
 * memsnap core: internals of the snapshot file format (msgpack_*.c) that the benchmark uses.
 */
#ifndef MEMSNAP_LIB_SERIALIZE_INTERNAL_H
#define MEMSNAP_LIB_SERIALIZE_INTERNAL_H

#include <stddef.h>

/* Baseline for bench_snapshot: runs msgpack-c's streaming unpacker alone over len bytes (fed in
 * 256 KiB pieces, the zone cleared after each top-level object, no validation, no model): the
 * most a reader that converts msgpack-c's object tree could reach, which is why
 * ms_snapshot_read() decodes the hot tables' rows itself. @return the number of top-level
 * objects, or -1 on a parse error. */
long ms__serialize_unpack_only(const void *data, size_t len);

#endif /* MEMSNAP_LIB_SERIALIZE_INTERNAL_H */
