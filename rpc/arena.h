/* Bump-pointer arena used as the protobuf-c allocator for unpacking: frees
 * are no-ops and the whole arena is reset at once. After warm-up a reset
 * arena holds one block big enough for the largest use seen, so a call in
 * steady state allocates nothing. Not thread-safe: one owner at a time. */
#ifndef VRPC_RPC_ARENA_H
#define VRPC_RPC_ARENA_H

#include <stddef.h>
#include <protobuf-c/protobuf-c.h>
#include <verbrpc/transport.h>

struct vrpc_arena_chunk;

/* The main block regrows at most to this; beyond, overflow blocks are
 * allocated per use and freed at reset. */
#define VRPC_ARENA_KEEP_MAX ((size_t)4 << 20)

struct vrpc_arena {
    unsigned char *base; /* main block */
    size_t cap, used;
    struct vrpc_arena_chunk *extra; /* overflow blocks since the last reset */
    size_t extra_total;
    size_t limit;          /* total bytes this arena may hold; 0: unlimited */
    struct vrpc_buf *held; /* a large buffer the unpacked message points into
                              (vrpc_pb_unpack_ref), put back at reset */
    ProtobufCAllocator pb; /* allocator_data = this arena */
};

/* initial: size of the first block (allocated lazily); limit as above. */
void vrpc_arena_init(struct vrpc_arena *a, size_t initial, size_t limit);
/* Allocate the first block now rather than on the first vrpc_arena_alloc:
 * for an arena whose owner must not allocate later (a worker's response
 * arenas, see vrpc_rpc_tls_arenas_warm). 0 or -ENOMEM. */
int vrpc_arena_warm(struct vrpc_arena *a);
/* 16-byte aligned memory valid until the next reset; NULL if over the limit
 * or out of memory. */
void *vrpc_arena_alloc(struct vrpc_arena *a, size_t n);
/* A point to roll back to: allocations after it are given back by
 * vrpc_arena_rollback, as long as none needed an overflow block (those stay
 * until the next reset). */
struct vrpc_arena_mark {
    size_t used;
    struct vrpc_arena_chunk *extra;
};
static inline struct vrpc_arena_mark vrpc_arena_mark(const struct vrpc_arena *a)
{
    return (struct vrpc_arena_mark){a->used, a->extra};
}
static inline void vrpc_arena_rollback(struct vrpc_arena *a, struct vrpc_arena_mark m)
{
    if (a->extra == m.extra)
        a->used = m.used;
}
/* Forget every allocation. If overflow blocks were needed, they are freed and
 * the main block is regrown once to cover them next time. */
void vrpc_arena_reset(struct vrpc_arena *a);
/* Keep the large buffer lb (vrpc_lbuf_get) until the next reset or fini,
 * which put it back: a message unpacked with vrpc_pb_unpack_ref from lb
 * lives as long as the arena's other memory. The arena takes lb. */
void vrpc_arena_hold(struct vrpc_arena *a, struct vrpc_buf *lb);
/* Put lb back now if the arena still holds it (the message is dead). */
void vrpc_arena_unhold(struct vrpc_arena *a, struct vrpc_buf *lb);
void vrpc_arena_fini(struct vrpc_arena *a);

#endif
