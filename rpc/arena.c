/* Arena allocator for protobuf-c unpack, see arena.h. */
#include "rpc/arena.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

struct vrpc_arena_chunk {
    struct vrpc_arena_chunk *next;
    size_t size;
    _Alignas(16) unsigned char data[];
};

#define ALIGN16(n) (((n) + 15) & ~(size_t)15)

static void *pb_alloc(void *data, size_t n) { return vrpc_arena_alloc(data, n); }
static void pb_free(void *data, void *p)
{
    (void)data;
    (void)p;
}

void vrpc_arena_init(struct vrpc_arena *a, size_t initial, size_t limit)
{
    a->base = NULL;
    a->cap = ALIGN16(initial ? initial : 4096);
    a->used = 0;
    a->extra = NULL;
    a->extra_total = 0;
    a->limit = limit;
    a->held = NULL;
    a->pb.alloc = pb_alloc;
    a->pb.free = pb_free;
    a->pb.allocator_data = a;
}

int vrpc_arena_warm(struct vrpc_arena *a)
{
    if (!a->base && !(a->base = aligned_alloc(16, a->cap)))
        return -ENOMEM;
    return 0;
}

void *vrpc_arena_alloc(struct vrpc_arena *a, size_t n)
{
    n = ALIGN16(n ? n : 1);
    if (a->limit && a->used + a->extra_total + n > a->limit)
        return NULL;
    if (!a->base) {
        a->base = aligned_alloc(16, a->cap);
        if (!a->base)
            return NULL;
    }
    if (n <= a->cap - a->used) {
        void *p = a->base + a->used;
        a->used += n;
        return p;
    }
    struct vrpc_arena_chunk *c = malloc(sizeof(*c) + n);
    if (!c)
        return NULL;
    c->next = a->extra;
    c->size = n;
    a->extra = c;
    a->extra_total += n;
    return c->data;
}

void vrpc_arena_hold(struct vrpc_arena *a, struct vrpc_buf *lb)
{
    if (a->held)
        vrpc_lbuf_put(a->held);
    a->held = lb;
}

void vrpc_arena_unhold(struct vrpc_arena *a, struct vrpc_buf *lb)
{
    if (lb && a->held == lb) {
        a->held = NULL;
        vrpc_lbuf_put(lb);
    }
}

void vrpc_arena_reset(struct vrpc_arena *a)
{
    if (a->held) {
        vrpc_lbuf_put(a->held);
        a->held = NULL;
    }
    if (a->extra) {
        size_t want = ALIGN16(a->cap + a->extra_total);
        /* Regrow only up to a bound: a large message now and then (tens of
         * MiB, rendezvous) should not pin that much per arena for ever. */
        if (want > VRPC_ARENA_KEEP_MAX)
            want = a->cap > VRPC_ARENA_KEEP_MAX ? a->cap : VRPC_ARENA_KEEP_MAX;
        while (a->extra) {
            struct vrpc_arena_chunk *c = a->extra;
            a->extra = c->next;
            free(c);
        }
        a->extra_total = 0;
        unsigned char *nb = want > a->cap ? aligned_alloc(16, want) : NULL;
        if (nb) {
            free(a->base);
            a->base = nb;
            a->cap = want;
        }
    }
    a->used = 0;
}

void vrpc_arena_fini(struct vrpc_arena *a)
{
    vrpc_arena_reset(a);
    free(a->base);
    a->base = NULL;
    a->used = 0;
}
