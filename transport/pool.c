/* Message buffer pools: count fixed-size buffers carved from one registered
 * region. The free list is a lock-free stack of buffer indices whose 64-bit
 * head packs (tag << 32 | index); the tag changes on every update, so a
 * pop that read a stale head fails its CAS (no ABA). Any thread may get/put. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "transport/transport_ops.h"

#define NIL 0xffffffffu

struct vrpc_pool {
    struct vrpc_transport *tp;
    struct vrpc_mr *mr;
    void *mem;
    uint32_t count;
    _Atomic uint64_t head;  /* tag << 32 | index of the top free buffer */
    atomic_uint avail;      /* statistics only */
    _Atomic uint32_t *next; /* next[i]: index below buffer i on the stack */
    struct vrpc_buf *bufs;
};

static void push(struct vrpc_pool *p, uint32_t idx)
{
    uint64_t h = atomic_load_explicit(&p->head, memory_order_relaxed), nh;
    do {
        atomic_store_explicit(&p->next[idx], (uint32_t)h, memory_order_relaxed);
        nh = ((h >> 32) + 1) << 32 | idx;
        /* release: next[idx] and the buffer's contents are visible to the popper. */
    } while (!atomic_compare_exchange_weak_explicit(&p->head, &h, nh, memory_order_release, memory_order_relaxed));
    atomic_fetch_add_explicit(&p->avail, 1, memory_order_relaxed);
}

static uint32_t pop(struct vrpc_pool *p)
{
    uint64_t h = atomic_load_explicit(&p->head, memory_order_acquire), nh;
    uint32_t idx;
    do {
        idx = (uint32_t)h;
        if (idx == NIL)
            return NIL;
        /* next[idx] may be stale if idx was popped meanwhile: then the tag
         * changed and the CAS below fails. */
        nh = ((h >> 32) + 1) << 32 | atomic_load_explicit(&p->next[idx], memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(&p->head, &h, nh, memory_order_acquire, memory_order_acquire));
    atomic_fetch_sub_explicit(&p->avail, 1, memory_order_relaxed);
    return idx;
}

int vrpc_pool_create(struct vrpc_transport *tp, uint32_t buf_size, uint32_t count, struct vrpc_pool **out)
{
    struct vrpc_pool *p;
    size_t stride, total;
    uint32_t i;
    int rc = -ENOMEM;

    if (!tp || !count || count >= NIL || !out)
        return -EINVAL;
    /* Cache-line aligned strides keep neighbouring buffers off each other's lines. */
    stride = ((size_t)buf_size + tp->headroom + 63) & ~(size_t)63;
    total = stride * count;
    p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->tp = tp;
    p->count = count;
    p->next = calloc(count, sizeof *p->next);
    p->bufs = calloc(count, sizeof *p->bufs);
    if (!p->next || !p->bufs || posix_memalign(&p->mem, 4096, total ? total : 64))
        goto err;
    rc = vrpc_mr_reg(tp, p->mem, total ? total : 64, VRPC_ACCESS_LOCAL, &p->mr);
    if (rc)
        goto err;
    atomic_init(&p->head, NIL);
    atomic_init(&p->avail, 0);
    for (i = count; i-- > 0;) {
        struct vrpc_buf *b = &p->bufs[i];
        b->data = (char *)p->mem + stride * i + tp->headroom;
        b->cap = buf_size;
        b->mr = p->mr;
        b->pool = p;
        push(p, i);
    }
    *out = p;
    return 0;
err:
    vrpc_pool_destroy(p);
    return rc;
}

void vrpc_pool_destroy(struct vrpc_pool *p)
{
    if (!p)
        return;
    vrpc_mr_dereg(p->mr);
    free(p->mem);
    free(p->bufs);
    free(p->next);
    free(p);
}

struct vrpc_buf *vrpc_pool_get(struct vrpc_pool *p)
{
    uint32_t idx = pop(p);
    struct vrpc_buf *b;
    if (idx == NIL)
        return NULL;
    b = &p->bufs[idx];
    b->len = 0;
    b->next = NULL;
    return b;
}

void vrpc_pool_put(struct vrpc_buf *b)
{
    struct vrpc_pool *p = b->pool;
    push(p, (uint32_t)(b - p->bufs));
}

uint32_t vrpc_pool_avail(const struct vrpc_pool *p)
{
    return atomic_load_explicit(&((struct vrpc_pool *)p)->avail, memory_order_relaxed);
}
