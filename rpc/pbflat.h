/* The flat-message codec behind rpc/pbutil.h: size, pack and unpack of
 * protobuf-c messages whose fields are singular scalars, enums, strings and
 * bytes, with protobuf-c 1.4.1's rules and results, from a plan compiled
 * once per message type. Internal to rpc/; any thread. */
#ifndef VRPC_RPC_PBFLAT_H
#define VRPC_RPC_PBFLAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include "rpc/arena.h"

/* At most this many fields in a type the codec takes. */
#define VRPC_PBFLAT_MAX_FIELDS 32

/* Returned by vrpc_pbflat_unpack when protobuf-c must decide. */
#define VRPC_PBFLAT_FALLBACK 1

/* Whether every field of d is flat (and d has at most 32 of them). */
bool vrpc_pbflat_type(const ProtobufCMessageDescriptor *d);

/* Packed size of msg, or (size_t)-1 when protobuf-c must size it (the type
 * is not flat, or msg keeps unknown fields). */
size_t vrpc_pbflat_size(const ProtobufCMessage *msg);

/* Pack msg into out, which the caller sized with vrpc_pbflat_size (or
 * protobuf-c); (size_t)-1 when protobuf-c must pack it (nothing written). */
size_t vrpc_pbflat_pack(const ProtobufCMessage *msg, uint8_t *out);

/* Unpack into the arena if every field on the wire is a flat field of d (a
 * type of at most 32 fields; repeated, message and oneof fields that are
 * absent are left empty, as protobuf-c leaves them). String and bytes values
 * are copied into the arena, except bytes values of at least ref_min bytes
 * (0: none), which point into buf. 0, -ENOMEM, or VRPC_PBFLAT_FALLBACK for
 * anything unusual (unknown field, mismatched wire type, over-long varint or
 * tag, truncation, a missing required field): then nothing stays allocated
 * in the arena and protobuf-c must decide. */
int vrpc_pbflat_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, size_t ref_min,
                       struct vrpc_arena *a, ProtobufCMessage **out);

#endif
