/* Safe wrappers around protobuf-c: a nesting-depth guard run before unpack
 * (protobuf-c 1.4.1 recurses without limit, so a deeply nested message would
 * overflow the stack), unpack into an arena, and pack with a size check
 * (protobuf_c_message_pack writes without bounds). Any thread. */
#ifndef VRPC_RPC_PBUTIL_H
#define VRPC_RPC_PBUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include <verbrpc/transport.h>
#include "rpc/arena.h"

#define VRPC_PB_DEFAULT_MAX_DEPTH 64

/* Walk the encoded message without decoding it and check that embedded
 * messages nest at most max_depth levels (the top level is 1). Besides depth
 * it refuses only what protobuf-c 1.4.1's unpack refuses too (truncated
 * fields, a tag longer than 5 bytes or a one-byte tag of field 0, groups and
 * reserved wire types), so whether a message is accepted never depends on
 * whether its type can nest: a field number protobuf-c takes as an unknown
 * field (above 2^29 - 1, or 0 in a longer tag) passes here as well.
 * 0, -ELOOP (too deep) or -EBADMSG (malformed). */
int vrpc_pb_check_depth(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, unsigned max_depth);

/* Depth check (skipped for types without message-typed fields, which cannot
 * nest), then unpack into the arena. buf stays the caller's and may be
 * reused after return (protobuf-c copies strings and bytes into the arena).
 * 0, -ELOOP, -EBADMSG (undecodable) or -ENOMEM (arena limit). */
int vrpc_pb_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, unsigned max_depth,
                   struct vrpc_arena *a, ProtobufCMessage **out);

/* Bytes fields at least this long are referenced, not copied, by
 * vrpc_pb_unpack_ref. */
#define VRPC_PB_REF_MIN 4096u

/* vrpc_pb_unpack without the copy of big payloads: every singular bytes
 * field of the top-level message (not repeated, not in a oneof) whose value
 * is at least VRPC_PB_REF_MIN bytes points into buf instead of into the
 * arena. protobuf-c always copies bytes fields, so the message is unpacked
 * from a compact copy of buf (in the arena) in which those values are
 * empty, and the fields are pointed at buf afterwards. buf must stay valid
 * and unchanged as long as the message is used: the caller keeps it with
 * the arena (vrpc_arena_hold). Results as vrpc_pb_unpack. */
int vrpc_pb_unpack_ref(const ProtobufCMessageDescriptor *d, uint8_t *buf, size_t len, unsigned max_depth,
                       struct vrpc_arena *a, ProtobufCMessage **out);

/* Size, pack and unpack use rpc/pbflat.c for flat messages (singular
 * scalar, enum, string and bytes fields: vrpc_pbflat_type), with
 * protobuf-c's rules and results, and protobuf-c for the rest. */

/* Packed size of msg (protobuf_c_message_get_packed_size, faster for flat
 * messages). */
size_t vrpc_pb_packed_size(const ProtobufCMessage *msg);
/* Packed size of msg, or -EMSGSIZE if it exceeds cap. */
long vrpc_pb_size(const ProtobufCMessage *msg, size_t cap);
/* Pack msg into out when the caller has already checked that its packed
 * size (vrpc_pb_size) fits: packing then cannot overrun. Returns the length. */
size_t vrpc_pb_pack_sized(const ProtobufCMessage *msg, uint8_t *out);
/* Pack msg into out (cap bytes). *len written on success. 0 or -EMSGSIZE. */
int vrpc_pb_pack(const ProtobufCMessage *msg, uint8_t *out, size_t cap, size_t *len);

/* A message packed for a gathered grant (vrpc_ep_grant_segs): the window
 * segs[0..nsegs) is the message's encoding, made of pieces copied into the
 * caller's buffer and of big bytes values referenced where they are. */
struct vrpc_pb_gather {
    struct vrpc_seg segs[VRPC_GRANT_SEGS_MAX];
    unsigned nsegs;
    unsigned nrefs; /* segments that point into the message's memory */
    size_t copied;  /* bytes written (or, measuring, to write) into buf */
    size_t total;   /* the encoding's length */
    int err;
};

/* Bytes values at least this long are referenced by vrpc_pb_pack_gather. */
#define VRPC_PB_GATHER_MIN (16u << 10)

/* Pack msg as a gathered window: the value of every top-level bytes field
 * (singular or repeated; not in a oneof) of at least min_ref bytes is
 * referenced in place, as long as segments are left; every other byte of
 * the encoding (tags, lengths, other fields, nested messages, which
 * protobuf-c packs through a temporary buffer) is copied into buf. buf NULL:
 * measure only (g->copied is the size buf needs). Never writes past cap.
 * Deterministic: a measuring pass and a packing pass over the same unchanged
 * message make the same choices. 0, or -EMSGSIZE (buf too small: the message
 * changed between the passes). The referenced memory must stay valid and
 * unchanged as long as the window is used. */
int vrpc_pb_pack_gather(const ProtobufCMessage *msg, size_t min_ref, uint8_t *buf, size_t cap,
                        struct vrpc_pb_gather *g);

#endif
