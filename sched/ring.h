/* Submission queues from threads that are not workers (private header).
 *
 * vrpc_ring: bounded single-producer / multi-consumer ring, one per registered
 * producer (a transport poller). The producer never waits for anyone
 * (wait-free); workers take batches with one CAS on head (lock-free). This is
 * ck_ring's SPMC protocol, written on atomic.h so that ThreadSanitizer can see
 * the hand-over. ck_ring's multi-producer enqueue is deliberately not used:
 * its producers commit in ticket order and spin on each other, which collapses
 * when producers outnumber cores.
 *
 * vrpc_inject: unbounded intrusive multi-producer stack for everybody else
 * (unregistered threads, and producers whose ring is full): push is a CAS loop
 * (lock-free), and a worker takes everything at once with one exchange
 * (wait-free), the shape of ck_stack's push_upmc/batch_pop_upmc. Taking the
 * whole list means there is no ABA problem and no node is ever read after
 * another thread could have freed it.
 *
 * Thread contract:
 *  - vrpc_ring_push(): the ring's one producer thread at a time (ownership may
 *    move between threads only through a lock or other happens-before edge).
 *  - vrpc_ring_pop_batch(), vrpc_ring_pop_batch_lines(), vrpc_ring_size(),
 *    vrpc_ring_size_want():
 *    any thread.
 *  - vrpc_inject_push(): any thread. vrpc_inject_take_all(): any thread. */
#ifndef VRPC_SCHED_RING_H
#define VRPC_SCHED_RING_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <verbrpc/sched.h>

#include "sched/atomic.h"

/* Two cache lines: the consumers' (head) and the producer's (tail). Each
 * side keeps its own copy of buf and mask and a possibly stale copy of the
 * other side's index, so that a consumer that only wants to know how much is
 * queued, or that takes a batch it already knows is there, does not pull the
 * producer's line away from it: every such pull makes the producer's next
 * publishing exchange wait for the line to come back (measured on the 2-vCPU
 * VM: 7-8 ns a submit when the consumers lag behind, 20-55 ns when they keep
 * up and read the tail after every task). The slots are 64-byte aligned, so
 * that slot i & ~7 starts a line (see vrpc_ring_pop_batch's line_only). */
struct vrpc_ring {
    _Alignas(64) uint64_t head; /* next slot to consume; CAS by consumers */
    uint64_t tail_seen;         /* consumers: a tail some consumer loaded (<= tail) */
    struct vrpc_task **cbuf;    /* consumers' copy of buf */
    uint64_t cmask;             /* consumers' copy of mask */
    _Alignas(64) uint64_t tail; /* next slot to fill; written by the producer */
    uint64_t head_cache;        /* producer-private: last head seen */
    struct vrpc_task **buf;
    uint64_t mask;
};

#define VRPC_RING_LINE 8 /* slots per 64-byte cache line */

static inline int vrpc_ring_init(struct vrpc_ring *r, unsigned size)
{
    if (size < 2 || (size & (size - 1)) != 0)
        return -EINVAL;
    r->buf = aligned_alloc(64, size * sizeof(*r->buf) < 64 ? 64 : size * sizeof(*r->buf));
    if (!r->buf)
        return -ENOMEM;
    for (unsigned i = 0; i < size; i++)
        r->buf[i] = NULL;
    r->head = r->tail = r->head_cache = r->tail_seen = 0;
    r->mask = r->cmask = size - 1;
    r->cbuf = r->buf;
    return 0;
}

static inline void vrpc_ring_fini(struct vrpc_ring *r)
{
    free(r->buf);
    r->buf = r->cbuf = NULL;
}

/* Producer only. false when full (the task is not queued). With full_fence
 * the tail is published by an exchange, a locked instruction on x86 and so a
 * full barrier: the caller's later loads (the idle bits) are ordered after
 * the task's publication without a separate store-load fence. That is how
 * compilers emit a C11 seq_cst store (xchg, not mov + mfence), and it matters
 * for a producer that submits millions of tasks a second: MFENCE also waits
 * for every earlier instruction and holds back later ones (it is dispatch
 * serializing on AMD Zen), and here it would wait on each submit for the
 * tail's cache line, which the consumers polling the ring keep pulling away;
 * a locked instruction orders memory just the same and lets the independent
 * work around it proceed (Linux's smp_mb() is a locked add for this reason,
 * and GCC emits one for a seq_cst fence). Measured on a 2-CPU AMD EPYC VM:
 * 4-7 M submits/s with mov + mfence, 50-60 M/s with a locked instruction
 * (see sched/README.md). */
static inline bool vrpc_ring_push(struct vrpc_ring *r, struct vrpc_task *t, bool full_fence)
{
    uint64_t tl = r->tail; /* only this thread writes tail */

    if (tl - r->head_cache > r->mask) {
        r->head_cache = vs_load_64(&r->head);
        /* The head load before the slot store: consumers read a slot before
         * their CAS moves head past it, so the slot is free to overwrite. */
        ck_pr_fence_load_store();
        if (tl - r->head_cache > r->mask)
            return false;
    }
    vs_store_ptr((void **)&r->buf[tl & r->mask], t);
    /* The slot store (and the caller's stores to *t) before the tail store
     * that publishes them. */
    ck_pr_fence_store();
    if (full_fence)
        vs_fas_64(&r->tail, tl + 1);
    else
        vs_store_64(&r->tail, tl + 1);
    return true;
}

/* Consumers: a tail no older than the last one any consumer loaded; reads the
 * producer's line only when the copy shows fewer than want tasks after h. */
static inline uint64_t vrpc_ring_tail_(struct vrpc_ring *r, uint64_t h, uint64_t want)
{
    uint64_t tl = vs_load_64(&r->tail_seen);
    if ((int64_t)(tl - h) < (int64_t)want) {
        tl = vs_load_64(&r->tail);
        /* Acquire (the slots the producer stored before that tail) and
         * release (before the copy's store), so that a consumer that reads
         * the copy, then slots below it, finds them stored: the hand-over
         * passes through this consumer, which needs both halves where memory
         * is not TSO (a no-op on x86). Copies may be stored out of order by
         * racing consumers: any of them is <= tail. */
        ck_pr_fence_acqrel();
        vs_store_64(&r->tail_seen, tl);
    }
    return tl;
}

/* Any thread. Takes up to max (>= 1) of the oldest tasks into out[], returns
 * how many (0: empty). With line_only, and at least one whole cache line of
 * slots queued, stops at the last line boundary instead: the slot line the
 * producer is still filling stays with it. Retries when another consumer
 * wins the race. */
static inline unsigned vrpc_ring_pop_batch_lines(struct vrpc_ring *r, struct vrpc_task **out, unsigned max,
                                                 bool line_only)
{
    for (;;) {
        uint64_t h = vs_load_64(&r->head);
        uint64_t tl, n;
        /* The head load before the tail loads, so that tail >= head. */
        ck_pr_fence_load();
        tl = vrpc_ring_tail_(r, h, max);
        /* The tail load before the slot loads: slots were stored before tail. */
        ck_pr_fence_load();
        if ((int64_t)(tl - h) <= 0)
            return 0;
        if (line_only && (tl & ~(uint64_t)(VRPC_RING_LINE - 1)) > h)
            tl &= ~(uint64_t)(VRPC_RING_LINE - 1);
        n = tl - h;
        if (n > max)
            n = max;
        for (uint64_t i = 0; i < n; i++)
            out[i] = vs_load_ptr((void *const *)&r->cbuf[(h + i) & r->cmask]);
        /* The CAS succeeds only if no consumer took these slots meanwhile, so
         * the producer cannot have overwritten them (it waits for head). */
        if (vs_cas_64(&r->head, h, h + n))
            return (unsigned)n;
        ck_pr_stall();
    }
}

static inline unsigned vrpc_ring_pop_batch(struct vrpc_ring *r, struct vrpc_task **out, unsigned max)
{
    return vrpc_ring_pop_batch_lines(r, out, max, false);
}

/* Any thread; a hint (may be stale). How many tasks are queued, read from
 * the consumers' copy of the tail if that shows at least want of them (then
 * possibly fewer than are queued), else from the producer's tail itself. */
static inline uint64_t vrpc_ring_size_want(struct vrpc_ring *r, uint64_t want)
{
    uint64_t h = vs_load_64(&r->head);
    /* The head load before the tail loads, so that tail >= head. */
    ck_pr_fence_load();
    uint64_t tl = vrpc_ring_tail_(r, h, want);
    return (int64_t)(tl - h) > 0 ? tl - h : 0;
}

/* Any thread; a hint. Zero only if the producer's tail showed no task. */
static inline uint64_t vrpc_ring_size(struct vrpc_ring *r) { return vrpc_ring_size_want(r, 1); }

struct vrpc_inject {
    _Alignas(64) struct vrpc_task *head; /* newest first, linked through task->next */
};

/* Any thread. Lock-free. */
static inline void vrpc_inject_push(struct vrpc_inject *q, struct vrpc_task *t)
{
    struct vrpc_task *old;
    do {
        old = vs_load_ptr((void *const *)&q->head);
        t->next = old;
        /* ->next and the caller's stores to *t before the CAS that publishes t. */
        ck_pr_fence_store_atomic();
    } while (!vs_cas_ptr((void **)&q->head, old, t));
}

/* Any thread. Wait-free. Everything queued, newest first (NULL when empty);
 * the caller owns the list and walks it through ->next. */
static inline struct vrpc_task *vrpc_inject_take_all(struct vrpc_inject *q)
{
    if (!vs_load_ptr((void *const *)&q->head))
        return NULL; /* cheap check: no exchange (no cache line steal) when empty */
    struct vrpc_task *l = vs_fas_ptr((void **)&q->head, NULL);
    /* The exchange before the loads of the tasks' ->next and fields: they were
     * stored before the pushers' CAS (atomic RMWs are barriers on x86). */
    ck_pr_fence_atomic_load();
    return l;
}

static inline bool vrpc_inject_empty(const struct vrpc_inject *q)
{
    return vs_load_ptr((void *const *)&q->head) == NULL;
}

#endif
