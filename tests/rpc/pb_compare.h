/* rpc/pbutil.c and rpc/pbflat.c against protobuf-c 1.4.1, the comparisons
 * shared by test_pbflat (random messages) and the fuzzers (tests/fuzz/):
 * each returns NULL when both sides agree, else a static text saying what
 * differs, so a cmocka test asserts on it and a fuzzer aborts with it. Not
 * thread-safe (static scratch). */
#ifndef VRPC_TESTS_PB_COMPARE_H
#define VRPC_TESTS_PB_COMPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include "rpc/arena.h"

/* Field by field equality of two messages of one type: every field type,
 * repeated fields, nested messages, unknown field count. */
const char *pbc_diff_fields(const ProtobufCMessage *a, const ProtobufCMessage *b);

/* Pack msg with vrpc_pb_size / vrpc_pb_pack_sized and with protobuf-c: the
 * same size, the same bytes, nothing written past the size, and
 * vrpc_pb_size refuses one byte less. */
const char *pbc_pack_both(const ProtobufCMessage *msg);

/* Unpack buf with vrpc_pb_unpack (max_depth 0: the default, 64) into a
 * (reset first) and with protobuf-c: refused alike (-EBADMSG), or accepted
 * alike with the same fields, packing back to the same bytes.
 * *accepted: whether they accepted. A -ELOOP from vrpc_pb_unpack (too deep
 * for the guard) is not compared (protobuf-c would recurse that deep):
 * *accepted false, NULL returned, *looped true. */
const char *pbc_unpack_both(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, struct vrpc_arena *a,
                            bool *accepted, bool *looped);

/* Fill every field of a message of the test protos with values and presence
 * drawn from next(ctx), edges over-represented: a repeated field points at
 * a static int32 array, a message field at a static child Node. */
void pbc_fill(ProtobufCMessage *msg, uint64_t (*next)(void *), void *ctx);

#endif
