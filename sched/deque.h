/* Per-worker work-stealing deque: a bounded Chase-Lev deque on ck_pr atomics,
 * with the orderings of Le, Pop, Cohen and Zappa Nardelli, "Correct and
 * efficient work-stealing for weak memory models" (PPoPP 2013).
 *
 * Why not ck_ring in SPMC mode (CK 0.7.1 has no deque)? ck_ring is sound as a
 * work-stealing queue, but its owner is just another consumer: every take is a
 * CAS on the shared head and the owner gets the oldest task. Tasks spawned by
 * a worker are usually continuations of what it is running, so the newest one
 * is the one whose data is hot in this core's cache. Chase-Lev gives the owner
 * LIFO takes with no atomic read-modify-write except on the last element, and
 * thieves FIFO steals of the oldest (coldest) tasks. It also lets the slot
 * hand-over be expressed with accesses ThreadSanitizer can check (atomic.h),
 * which ck_ring's memcpy of a slot before its CAS is not. The cost is ~60
 * lines we own; the deque is bounded (no buffer growth, so no memory
 * reclamation problem) and a full deque makes push fail: the scheduler then
 * spills to the worker's private overflow list.
 *
 * Thread contract:
 *  - vrpc_deque_push() and vrpc_deque_take(): the owning worker only.
 *  - vrpc_deque_steal() and vrpc_deque_size(): any thread.
 *  - init/fini: while no other thread can reach the deque.
 * Indices are 64-bit and only grow (top) or move by one (bottom); they never
 * wrap in practice. Signed differences compare them. */
#ifndef VRPC_SCHED_DEQUE_H
#define VRPC_SCHED_DEQUE_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <verbrpc/sched.h>

#include "sched/atomic.h"

struct vrpc_deque {
    _Alignas(64) uint64_t top;    /* next task to steal; advanced by CAS (thieves, and the owner on the last task) */
    _Alignas(64) uint64_t bottom; /* next free slot; written by the owner only */
    struct vrpc_task **buf;       /* size slots, size a power of two */
    uint64_t mask;                /* size - 1 */
};

/* size must be a power of two >= 2. Returns 0 or -ENOMEM / -EINVAL. */
static inline int vrpc_deque_init(struct vrpc_deque *d, unsigned size)
{
    if (size < 2 || (size & (size - 1)) != 0)
        return -EINVAL;
    d->buf = calloc(size, sizeof(*d->buf));
    if (!d->buf)
        return -ENOMEM;
    d->top = 0;
    d->bottom = 0;
    d->mask = size - 1;
    return 0;
}

static inline void vrpc_deque_fini(struct vrpc_deque *d)
{
    free(d->buf);
    d->buf = NULL;
}

/* Owner only. false when the deque is full (the task is not queued). */
static inline bool vrpc_deque_push(struct vrpc_deque *d, struct vrpc_task *t)
{
    uint64_t b = vs_load_64(&d->bottom);
    uint64_t top = vs_load_64(&d->top);
    /* The top load before the slot store below: a thief reads the slot it
     * steals before its CAS moves top past it, so once we have seen that top,
     * the slot we may now overwrite is no longer being read. */
    ck_pr_fence_load_store();
    if (b - top > d->mask)
        return false; /* a stale top only makes this conservative */
    vs_store_ptr((void **)&d->buf[b & d->mask], t);
    /* The slot store (and the caller's stores to *t) before the bottom store
     * that makes the slot visible to thieves. */
    ck_pr_fence_store();
    vs_store_64(&d->bottom, b + 1);
    return true;
}

/* Owner only. The newest task, or NULL when empty. */
static inline struct vrpc_task *vrpc_deque_take(struct vrpc_deque *d)
{
    uint64_t b = vs_load_64(&d->bottom) - 1;
    struct vrpc_task *x;
    uint64_t t;

    /* The bottom store must be ordered before the top load (store-load, the
     * one ordering x86 does not give for free): it pairs with the fence in
     * steal, so that for the last task either the thief sees the lowered
     * bottom or we see its advanced top. An exchange is the store: a locked
     * instruction orders like mfence on x86 at a third of its cost here. */
    vs_fas_64(&d->bottom, b);
    /* The exchange before the top load, on CPUs where atomics do not order
     * later loads by themselves (no-op on x86). */
    ck_pr_fence_atomic_load();
    t = vs_load_64(&d->top);
    if ((int64_t)(b - t) < 0) { /* empty: restore bottom */
        vs_store_64(&d->bottom, b + 1);
        return NULL;
    }
    x = vs_load_ptr((void *const *)&d->buf[b & d->mask]);
    if (b != t)
        return x; /* more than one task: thieves cannot reach slot b */
    /* Last task: race the thieves for it on top. */
    if (!vs_cas_64(&d->top, t, t + 1))
        x = NULL;
    vs_store_64(&d->bottom, b + 1);
    return x;
}

enum vrpc_steal_result { VRPC_STEAL_EMPTY, VRPC_STEAL_LOST, VRPC_STEAL_OK };

/* Any thread. Takes the oldest task. VRPC_STEAL_LOST means another thread won
 * a race for it: the deque may still hold work. */
static inline enum vrpc_steal_result vrpc_deque_steal(struct vrpc_deque *d, struct vrpc_task **out)
{
    uint64_t t = vs_load_64(&d->top);
    uint64_t b;
    struct vrpc_task *x;

    /* Cheap early exit for the common empty case (idle workers probing
     * victims), before paying for the fence. A stale read only delays. */
    if ((int64_t)(vs_load_64(&d->bottom) - t) <= 0)
        return VRPC_STEAL_EMPTY;
    /* The top load before the bottom load: pairs with the exchange in take
     * (Le et al. use a seq_cst fence here). Paid only when the victim looks
     * non-empty. */
    ck_pr_fence_memory();
    b = vs_load_64(&d->bottom);
    /* The bottom load before the slot load: the owner stored the slot before
     * publishing bottom. */
    ck_pr_fence_load();
    if ((int64_t)(b - t) <= 0)
        return VRPC_STEAL_EMPTY;
    x = vs_load_ptr((void *const *)&d->buf[t & d->mask]);
    if (!vs_cas_64(&d->top, t, t + 1))
        return VRPC_STEAL_LOST;
    *out = x;
    return VRPC_STEAL_OK;
}

/* Any thread; approximate while others operate on the deque. */
static inline uint64_t vrpc_deque_size(const struct vrpc_deque *d)
{
    uint64_t t = vs_load_64(&d->top);
    uint64_t b = vs_load_64(&d->bottom);
    return (int64_t)(b - t) > 0 ? b - t : 0;
}

#endif
