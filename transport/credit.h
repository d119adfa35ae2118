/* Private to transport/: the credit core every backend embeds (credit rules 1
 * to 4 of include/verbrpc/transport.h). A backend embeds one
 * vrpc_credit_pool in each shared receive pool (its CQ: the receives posted
 * there) and one vrpc_credit_ep in each endpoint, and supplies only the
 * medium: how a credit-only message goes out (the send hook of
 * vrpc_credit_distribute) and where the returned credits ride (it takes
 * credit_ret with vrpc_credit_take_ret when it builds a header).
 *
 * Threads and locks: avail, posted and credit_ret are atomics any thread may
 * touch; everything else (the hungry list, granted, resv, target, keep,
 * used, win_ns, hungry) is
 * the pool's poller's alone, and the functions below that touch it run on
 * that poller with no lock held (vrpc_credit_distribute takes the endpoint's
 * lock only inside the backend's send hook). The hot ones are static inline:
 * the receive path calls them once per message. */
#ifndef VRPC_TRANSPORT_CREDIT_H
#define VRPC_TRANSPORT_CREDIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vrpc_credit_ep;

/* Per shared receive pool (a backend's CQ). */
struct vrpc_credit_pool {
    atomic_int avail;  /* posted receives not promised to any peer */
    atomic_int posted; /* posted receives not consumed (<= max_recv) */
    /* The reservation a connection takes from avail at the handshake: the
     * data credits it starts with (min_resv; the least a peer's handshake
     * may grant, the backend's handshake checks it) plus the receives kept
     * for its peer's credit-only messages (ctl_resv). Per backend, passed
     * to vrpc_credit_pool_init. Both take the 2 posted receives per
     * connection of credit rule 2 (transport.h); they split them
     * differently. TCP 2 + 0: a credit-only frame uses no receive buffer,
     * so both are data credits (and a TCP handshake granting fewer than 2
     * is refused, so the value is part of the TCP handshake). Verbs 1 + 1:
     * a credit-only message consumes a receive, so one of the two is kept
     * for those and the handshake promises 1 data credit. */
    uint32_t min_resv, ctl_resv;
    struct vrpc_credit_ep *hungry_head, *hungry_tail; /* owed credits, oldest first */
};

/* Per endpoint. */
struct vrpc_credit_ep {
    atomic_uint credit_ret; /* credits to return to the peer (any message takes them) */
    uint32_t granted;       /* credits the peer holds or will get (promised buffers) */
    uint32_t resv;          /* reservation: granted + consumed, not yet paid back */
    uint32_t target;        /* the most resv may grow to (credits attribute) */
    /* Shrinking (vrpc_credit_shrink): resv grows only below keep, and while
     * resv > keep each message consumed takes one off resv instead of
     * being owed (a cut waiting for credits the peer still holds). keep ==
     * target when no cut is pending. used: messages consumed since win_ns,
     * the start of the current shrink window (0: not started). */
    uint32_t keep;
    uint32_t used;
    uint64_t win_ns;
    bool hungry; /* on the pool's hungry list */
    struct vrpc_credit_ep *hnext;
};

/* Set up a pool with the backend's reservation (see min_resv above). Before
 * any receive is posted to it. */
void vrpc_credit_pool_init(struct vrpc_credit_pool *p, uint32_t min_resv, uint32_t ctl_resv);

/* Set up an endpoint's credits: resv = granted = grant (what its handshake
 * promises the peer), growing up to target. Before the endpoint is on a
 * poller. */
void vrpc_credit_ep_init(struct vrpc_credit_ep *e, uint32_t grant, uint32_t target);

/* Take exactly want credits from the pool's unpromised receives, or none:
 * returns want or 0. Any thread. */
static inline uint32_t vrpc_credit_take_avail_exact(struct vrpc_credit_pool *p, uint32_t want)
{
    int a = atomic_load(&p->avail);
    do {
        if (a < (int)want)
            return 0;
    } while (!atomic_compare_exchange_weak(&p->avail, &a, a - (int)want));
    return want;
}

/* Take up to want credits from the pool's unpromised receives; returns how
 * many. Any thread. */
static inline uint32_t vrpc_credit_take_avail(struct vrpc_credit_pool *p, uint32_t want)
{
    int a = atomic_load(&p->avail), t;
    do {
        if (a <= 0)
            return 0;
        t = a < (int)want ? a : (int)want;
    } while (!atomic_compare_exchange_weak(&p->avail, &a, a - t));
    return (uint32_t)t;
}

/* A new connection's reservation (min_resv + ctl_resv) from the pool's
 * unpromised receives, or 0 if it has not that many (the connection is
 * refused). Any thread. */
static inline uint32_t vrpc_credit_reserve(struct vrpc_credit_pool *p)
{
    return vrpc_credit_take_avail_exact(p, p->min_resv + p->ctl_resv);
}

/* Give back what a dead connection was promised and can no longer consume:
 * granted plus the ctl_resv receives (the backend zeroes granted if it
 * still looks at it). Poller, no lock. */
static inline void vrpc_credit_ep_release(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e)
{
    atomic_fetch_add(&p->avail, (int)(e->granted + p->ctl_resv));
}

/* Queue e to be paid back (no-op if it already waits). Poller, no lock. */
static inline void vrpc_credit_hungry_add(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e)
{
    if (e->hungry)
        return;
    e->hungry = true;
    e->hnext = NULL;
    if (p->hungry_tail)
        p->hungry_tail->hnext = e;
    else
        p->hungry_head = e;
    p->hungry_tail = e;
}

/* Take e off the hungry list (no-op if it is not on it). Poller, no lock. */
void vrpc_credit_hungry_remove(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e);

/* A message of e's peer consumed one of its promised receives: one credit
 * less granted, counted in used, and e is owed one; or, while a cut is
 * pending (resv > keep), the reservation is one less instead (the buffer,
 * once reposted, is the pool's again). Poller, no lock. */
static inline void vrpc_credit_consumed(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e)
{
    e->granted--;
    e->used++;
    if (__builtin_expect(e->resv > e->keep, 0)) {
        if (--e->resv == e->keep)
            e->keep = e->target; /* cut done: may grow again on demand */
        return;
    }
    vrpc_credit_hungry_add(p, e);
}

/* Credit rule 7 (shrinking), once per window of shrink_ns (0: never; call
 * it at least every tenth of a window, from the pool's poller, no lock): a
 * connection whose peer sent fewer messages in the window just ended than
 * its reservation is cut back to what it sent (at least the pool's
 * min_resv). It cannot have had more in flight than it sent, so the cut
 * never slows it. Credits the peer holds are never taken back: what it
 * consumed and is not yet paid back is dropped at once, the rest as the
 * peer uses it (vrpc_credit_consumed); buffers not paid back stay in avail
 * for other (and new) connections. A busy connection (as many messages as
 * its reservation) keeps it. Returns how many credits were cut at once.
 * Out of line: not on the per-message path. */
uint32_t vrpc_credit_shrink(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e, uint64_t now, uint64_t shrink_ns);

/* The credits to piggyback on a header being built (all that piled up).
 * Any thread; the backend calls it where it builds headers (usually under
 * its endpoint lock). */
static inline uint32_t vrpc_credit_take_ret(struct vrpc_credit_ep *e)
{
    return atomic_exchange_explicit(&e->credit_ret, 0, memory_order_relaxed);
}

/* Pay reposted receives back to the endpoints that consumed them (below
 * their reservation), oldest first. While the pool has spare receives (more
 * than a quarter of those posted stay unpromised, kept for new
 * connections), a paid-back endpoint's reservation grows by one, up to its
 * target (keep, lower while a cut is pending): busy connections get deep pipelines, idle ones keep what they had.
 * An explicit update goes out (send_locked(e), which takes e's endpoint lock
 * itself and sends a credit-only message) once half the reservation (at
 * least 1) piled up, or when the peer holds nothing at all (everything
 * promised is still unsent). Poller, no lock held. Inline so that the
 * backend's hook is a direct call. */
static inline void vrpc_credit_distribute(struct vrpc_credit_pool *p, void (*send)(struct vrpc_credit_ep *e))
{
    while (p->hungry_head && atomic_load(&p->avail) > 0) {
        struct vrpc_credit_ep *e = p->hungry_head;
        uint32_t got = vrpc_credit_take_avail(p, e->resv - e->granted), cr;
        if (!got)
            break;
        e->granted += got;
        if (e->granted >= e->resv) {
            p->hungry_head = e->hnext;
            if (!p->hungry_head)
                p->hungry_tail = NULL;
            e->hungry = false;
            if (e->resv < e->keep && atomic_load(&p->avail) > atomic_load(&p->posted) / 4 &&
                vrpc_credit_take_avail_exact(p, 1)) {
                e->resv++;
                e->granted++;
                got++;
            }
        }
        cr = atomic_fetch_add(&e->credit_ret, got) + got;
        if (cr >= (e->resv / 2 ? e->resv / 2 : 1) || cr >= e->granted)
            send(e);
    }
}

/* Credit rule 6 (the credit watchdog): a send that has waited for credits
 * since wait_ns (0: none waits; reset whenever credits arrive) with none
 * arriving for limit_ns (credit_timeout_ms) fails its endpoint with
 * -ETIMEDOUT. True when that time has come at now; a wait_ns taken after now
 * is not late. Any thread. */
static inline bool vrpc_credit_wait_expired(uint64_t wait_ns, uint64_t now, uint64_t limit_ns)
{
    return wait_ns && now > wait_ns + limit_ns;
}

#endif
