/* Client pending-call table, see pending.h for the slot state machine. */
#define _GNU_SOURCE /* sched_getcpu */
#include "rpc/pending.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include "rpc/futex.h"
#include "rpc/wire.h"

#define GEN(w) ((uint32_t)((w) >> 32))
#define FLAGS(w) ((uint32_t)(w))
#define WORD(g, f) (((uint64_t)(g) << 32) | (f))

static uint32_t next_gen(uint32_t g) { return g + 1 ? g + 1 : 1; }

int vrpc_pending_create(uint32_t n, struct vrpc_pending **out)
{
    struct vrpc_pending *p;
    pthread_condattr_t ca;

    if (n == 0)
        return -EINVAL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->slots = calloc(n, sizeof(*p->slots));
    p->free = calloc(n, sizeof(*p->free));
    if (!p->slots || !p->free) {
        vrpc_pending_destroy(p);
        return -ENOMEM;
    }
    p->n = p->limit = p->nfree = n;
    p->spin = true;
    p->poller_cpu = -1;
    for (uint32_t i = 0; i < n; i++) {
        p->slots[i].index = i;
        p->slots[i].table = p;
        p->slots[i].word = WORD(1, 0);
        p->free[i] = n - 1 - i; /* top of stack (end) holds index 0 */
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cond, &ca);
    pthread_condattr_destroy(&ca);
    *out = p;
    return 0;
}

void vrpc_pending_destroy(struct vrpc_pending *p)
{
    if (!p)
        return;
    if (p->slots) {
        for (uint32_t i = 0; i < p->n; i++) {
            free(p->slots[i].resp);
            free(p->slots[i].md);
        }
        pthread_mutex_destroy(&p->lock);
        pthread_cond_destroy(&p->cond);
    }
    free(p->slots);
    free(p->free);
    free(p);
}

void vrpc_pending_set_limit(struct vrpc_pending *p, uint32_t limit)
{
    pthread_mutex_lock(&p->lock);
    p->limit = limit < 1 ? 1 : limit > p->n ? p->n : limit;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

static struct vrpc_pending_slot *take_locked(struct vrpc_pending *p, void *conn)
{
    struct vrpc_pending_slot *s = &p->slots[p->free[--p->nfree]];
    p->in_use++;
    /* RESERVED: the word stays FREE-looking (flags 0) until vrpc_pending_open */
    __atomic_store_n(&s->conn, conn, __ATOMIC_RELAXED);
    /* the owner's hold, see pending.h; the call's generation is the word's */
    __atomic_store_n(&s->xfer, (__atomic_load_n(&s->word, __ATOMIC_RELAXED) & ~0xffffffffull) | 1, __ATOMIC_RELAXED);
    return s;
}

void vrpc_pending_open(struct vrpc_pending_slot *s)
{
    uint64_t w = __atomic_load_n(&s->word, __ATOMIC_RELAXED);
    /* release: every call field the owner wrote (conn, xfer, cb, ...) is
     * visible to a thread that acquires this INUSE (the loss scan, cancel) */
    __atomic_store_n(&s->word, WORD(GEN(w), VRPC_PEND_INUSE), __ATOMIC_RELEASE);
}

int vrpc_pending_alloc(struct vrpc_pending *p, int64_t deadline_ns, void *conn, struct vrpc_pending_slot **out)
{
    int rc = 0;

    pthread_mutex_lock(&p->lock);
    while (!p->closed && (p->in_use >= p->limit || p->nfree == 0)) {
        if (deadline_ns == VRPC_NO_DEADLINE) {
            pthread_cond_wait(&p->cond, &p->lock);
        } else {
            struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
            if (pthread_cond_timedwait(&p->cond, &p->lock, &ts) == ETIMEDOUT &&
                (p->in_use >= p->limit || p->nfree == 0)) {
                rc = -ETIMEDOUT;
                break;
            }
        }
    }
    if (!rc && p->closed)
        rc = -ESHUTDOWN;
    if (!rc)
        *out = take_locked(p, conn);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int vrpc_pending_try_alloc(struct vrpc_pending *p, void *conn, struct vrpc_pending_slot **out)
{
    int rc = 0;

    pthread_mutex_lock(&p->lock);
    if (p->closed)
        rc = -ESHUTDOWN;
    else if (p->in_use >= p->limit || p->nfree == 0)
        rc = -EAGAIN;
    else
        *out = take_locked(p, conn);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void vrpc_pending_close(struct vrpc_pending *p)
{
    pthread_mutex_lock(&p->lock);
    p->closed = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

static void slot_free(struct vrpc_pending_slot *s)
{
    struct vrpc_pending *p = s->table;

    pthread_mutex_lock(&p->lock);
    p->free[p->nfree++] = s->index;
    p->in_use--;
    if (p->closed)
        pthread_cond_broadcast(&p->cond); /* the destroyer waits for in_use == 0 */
    else
        pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    if (p->on_free)
        p->on_free(p->on_free_arg);
}

uint64_t vrpc_pending_id(const struct vrpc_pending_slot *s) { return vrpc_wire_make_id(s->index, vrpc_pending_gen(s)); }

struct vrpc_pending_slot *vrpc_pending_lookup(struct vrpc_pending *p, uint64_t id)
{
    uint32_t idx = vrpc_wire_id_slot(id), gen = vrpc_wire_id_gen(id);
    if (idx >= p->n)
        return NULL;
    struct vrpc_pending_slot *s = &p->slots[idx];
    uint64_t w = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE);
    if (GEN(w) != gen || !(FLAGS(w) & VRPC_PEND_INUSE) || (FLAGS(w) & VRPC_PEND_WIRE_DONE))
        return NULL;
    return s;
}

bool vrpc_pending_decide(struct vrpc_pending_slot *s, uint32_t gen)
{
    uint64_t w = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE);
    for (;;) {
        if (GEN(w) != gen || !(FLAGS(w) & VRPC_PEND_INUSE) || (FLAGS(w) & VRPC_PEND_DECIDED))
            return false;
        /* acq_rel: the winner sees the owner's call fields; losers learn nothing. */
        if (__atomic_compare_exchange_n(&s->word, &w, w | VRPC_PEND_DECIDED, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return true;
    }
}

void vrpc_pending_publish(struct vrpc_pending_slot *s, uint32_t gen)
{
    /* seq_cst store then seq_cst load of `sleeping` pairs with the waiter's
     * seq_cst store of `sleeping` then load of `done` (Dekker): either the
     * waiter sees done == gen or we see it sleeping and wake it. The store is
     * also the release that makes the outcome fields visible. */
    __atomic_store_n(&s->done, gen, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->sleeping, __ATOMIC_SEQ_CST))
        vrpc_futex_wake_all(&s->done);
}

/* How long a synchronous waiter spins before sleeping on its futex: most
 * responses on a fast transport arrive within it and save a wake-up (2000
 * pauses are about 37 us on this machine's EPYC). A waiter running on its
 * poller's CPU sleeps at once instead: the pinned poller busy-polls without
 * yielding to it (transport.c), wakes it and yields right after delivering;
 * spinning, even by yielding, would only take turns with the poller and delay
 * the poll that finds the response (rpc_bench, split placement: p75 of a 32 B
 * echo 24.9 -> 19.7 us). */
#define WAIT_SPINS 2000

void vrpc_pending_wait(struct vrpc_pending_slot *s, uint32_t gen)
{
    bool spin = s->table->spin && (s->table->poller_cpu < 0 || sched_getcpu() != s->table->poller_cpu);
    for (uint32_t i = 0; spin && i < WAIT_SPINS; i++) {
        if (__atomic_load_n(&s->done, __ATOMIC_ACQUIRE) == gen)
            return;
        __builtin_ia32_pause();
    }
    __atomic_store_n(&s->sleeping, 1, __ATOMIC_SEQ_CST);
    uint32_t v;
    while ((v = __atomic_load_n(&s->done, __ATOMIC_SEQ_CST)) != gen)
        vrpc_futex_wait(&s->done, v);
    __atomic_store_n(&s->sleeping, 0, __ATOMIC_RELAXED);
}

/* Set bit in generation gen's word; free the slot when both done bits are set. */
static bool set_done_bit(struct vrpc_pending_slot *s, uint32_t gen, uint32_t bit, uint32_t other)
{
    uint64_t w = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE), nw;
    for (;;) {
        if (GEN(w) != gen || !(FLAGS(w) & VRPC_PEND_INUSE) || (FLAGS(w) & bit))
            return false;
        nw = (FLAGS(w) & other) ? WORD(next_gen(gen), 0) : (w | bit);
        if (__atomic_compare_exchange_n(&s->word, &w, nw, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            break;
    }
    if (FLAGS(nw) == 0)
        slot_free(s);
    return true;
}

bool vrpc_pending_wire_done(struct vrpc_pending_slot *s, uint32_t gen)
{
    return set_done_bit(s, gen, VRPC_PEND_WIRE_DONE, VRPC_PEND_OWNER_DONE);
}

void vrpc_pending_owner_done(struct vrpc_pending_slot *s, uint32_t gen)
{
    set_done_bit(s, gen, VRPC_PEND_OWNER_DONE, VRPC_PEND_WIRE_DONE);
}
