/* The rendezvous sender's offer machine, written once for requests (the
 * channel) and responses (the server): grant a packed payload to the peer,
 * park the offer when the transport has no grant left for now, retry the
 * parked ones after each completion batch, send the descriptor (or fail
 * the offer), end the grant on DONE with a revoke (retried after -ENOSPC),
 * and release it on the REVOKE completion. The role supplies the small
 * differences in a struct vrpc_offer_ops: its conditions on a grant (and
 * the hold timer it arms), and what sending the descriptor or failing the
 * offer means. The p_* fields of struct vrpc_rndv_out (rpc/rndv.h) carry
 * an offer. Not on the small-call path. */
#ifndef VRPC_RPC_OFFER_H
#define VRPC_RPC_OFFER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "rpc/conn.h"
#include "rpc/rndv.h"
#include "rpc/timer.h"

struct vrpc_offer_q;

/* What the hold timer found (ops->hold_find_locked). */
struct vrpc_offer_held {
    struct vrpc_conn_base *c; /* the offer's connection, a reference taken for the timer */
    uint32_t len;             /* the payload's bytes */
    uint64_t id;              /* its call id */
    uint32_t hold_ms;         /* the role's hold timeout */
    const char *what;         /* what was held, for the log line; NULL: the ops' hold_what */
};

struct vrpc_offer_ops {
    /* Under *q->lock: grant offer o (p_* written), usually through
     * vrpc_offer_grant_locked, and arm its hold timer. retry: o is on the
     * parked list. 0 granted; -ENOSPC: not now (o is, or stays, parked);
     * anything else: the offer fails with it (o->p_rc). */
    int (*grant_locked)(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, bool retry);
    /* No lock held: o is off the list (or never was on it) with the grant's
     * outcome in o->p_rc: send the descriptor or fail the offer; ctx says
     * which thread this is (rpc/conn.h). Returns the role's outcome
     * (vrpc_offer_start). */
    int (*done)(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, enum vrpc_send_ctx ctx);
    /* The hold timer (vrpc_offer_hold_fired), under *q->lock: the offer the
     * timer's arg names, if the peer still holds its grant past the hold
     * timeout: fill *h, taking a reference of its connection; false if not. */
    bool (*hold_find_locked)(struct vrpc_offer_q *q, uint64_t arg, struct vrpc_offer_held *h);
    /* The role's consequence, no lock held, before the endpoint is aborted
     * (-ECONNABORTED): c is dead from now on. */
    void (*hold_kill)(struct vrpc_conn_base *c);
    /* Drop the reference hold_find_locked took (no lock held). */
    void (*conn_unref)(struct vrpc_conn_base *c);
    /* The log line's words: the peer ("server"), what it held ("payload"),
     * a note after "without reading it" ("" or " (no DONE)"). */
    const char *hold_peer, *hold_what, *hold_note;
};

/* One owner's parked offers (the channel's; each server poller's). */
struct vrpc_offer_q {
    const struct vrpc_offer_ops *ops;
    pthread_mutex_t *lock;        /* the owner's grant lock (conn_lock; the server's lock) */
    struct vrpc_rndv_out *parked; /* FIFO, under *lock */
    uint32_t nparked;             /* their count (atomic: the poller looks without the lock) */
};

void vrpc_offer_q_init(struct vrpc_offer_q *q, const struct vrpc_offer_ops *ops, pthread_mutex_t *lock);

/* Offer o (p_* and p_conn written; no lock held; ctx VRPC_SEND_WAIT or
 * VRPC_SEND_NOWAIT, for ops->done): grant and
 * hand it to ops->done, or park it and try the parked list once (what freed
 * a grant before we parked announced nothing to us). Returns 0 when parked,
 * else what ops->done returned. */
int vrpc_offer_start(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, enum vrpc_send_ctx ctx);

/* Try the parked offers again, oldest first; the ones that got a grant (or
 * failed for good) go to ops->done. Any thread (ctx VRPC_SEND_NOWAIT, or
 * VRPC_SEND_POLLER on the poller); never waits. */
void vrpc_offer_run(struct vrpc_offer_q *q, enum vrpc_send_ctx ctx);

static inline bool vrpc_offer_any_parked(struct vrpc_offer_q *q)
{
    return __atomic_load_n(&q->nparked, __ATOMIC_ACQUIRE) != 0;
}

/* Under the owner's grant lock, against the endpoint's DISCONNECTED (which
 * sets c->gone under it): grant o's payload (gathered if o->p_nsegs) on c's
 * endpoint, or -ENOTCONN when c is gone or dead. On success takes the
 * grant's reference of c (the endpoint outlives the key). */
int vrpc_offer_grant_locked(struct vrpc_conn_base *c, struct vrpc_rndv_out *o);

/* The hold timer's callback (the wheel's thread), armed by the role's
 * grant_locked with ctx = q and an arg its hold_find_locked understands: a
 * peer that holds a grant past the hold timeout (no DONE) loses the
 * connection, which ends the key: logged, ops->hold_kill, the endpoint
 * aborted with -ECONNABORTED, the timer's reference dropped. */
void vrpc_offer_hold_fired(void *ctx, uint64_t arg);

/* o's payload is granted for call id (the check DONE and RESPONSE make). */
static inline bool vrpc_offer_granted(const struct vrpc_rndv_out *o, uint64_t id)
{
    return __atomic_load_n(&o->state, __ATOMIC_ACQUIRE) == VRPC_RNDV_GRANTED && o->id == id;
}

/* Poller: end the grant (DONE came): post the revoke, or queue it on r after
 * -ENOSPC; what names the payload in the log line ("request", "response"). */
void vrpc_offer_revoke(struct vrpc_rndv_retry *r, struct vrpc_rndv_out *o, const char *what);

/* Poller: o's REVOKE completion: its hold timer cancelled, its buffer back
 * (IDLE, under *q->lock: the hold timer looks grants up there). The role
 * then drops the grant's references. */
void vrpc_offer_revoked(struct vrpc_offer_q *q, struct vrpc_timer_wheel *w, struct vrpc_rndv_out *o);

/* Poller, at ep's DISCONNECTED: under *q->lock, put back the buffer of o if
 * it is granted on ep (IDLE); true if it was. *id (if given): o's call id,
 * read under the lock. */
bool vrpc_offer_drop(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, const struct vrpc_ep *ep, uint64_t *id);

#endif
