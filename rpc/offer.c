/* The rendezvous sender's offer machine (rpc/offer.h), shared by the
 * channel's requests and the server's responses. */
#include <errno.h>
#include <string.h>
#include "rpc/internal.h"
#include "rpc/offer.h"

void vrpc_offer_q_init(struct vrpc_offer_q *q, const struct vrpc_offer_ops *ops, pthread_mutex_t *lock)
{
    q->ops = ops;
    q->lock = lock;
    q->parked = NULL;
    q->nparked = 0;
}

int vrpc_offer_start(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, enum vrpc_send_ctx ctx)
{
    pthread_mutex_lock(q->lock);
    int rc = q->ops->grant_locked(q, o, false);
    if (rc == -ENOSPC) {
        vrpc_rndv_park(&q->parked, o);
        __atomic_add_fetch(&q->nparked, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(q->lock);
    if (rc == -ENOSPC) {
        /* what freed a grant before we parked announced nothing to us */
        vrpc_offer_run(q, VRPC_SEND_NOWAIT);
        return 0;
    }
    o->p_rc = rc;
    return q->ops->done(q, o, ctx);
}

void vrpc_offer_run(struct vrpc_offer_q *q, enum vrpc_send_ctx ctx)
{
    struct vrpc_rndv_out *done = NULL, **tail = &done;
    pthread_mutex_lock(q->lock);
    for (struct vrpc_rndv_out **pp = &q->parked; *pp;) {
        struct vrpc_rndv_out *o = *pp;
        int rc = q->ops->grant_locked(q, o, true);
        if (rc == -ENOSPC) {
            pp = &o->p_next;
            continue;
        }
        *pp = o->p_next;
        o->p_rc = rc;
        o->p_next = NULL;
        *tail = o;
        tail = &o->p_next;
        __atomic_sub_fetch(&q->nparked, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(q->lock);
    while (done) {
        struct vrpc_rndv_out *o = done;
        done = o->p_next;
        /* (cleared only now: until its descriptor is out no request may
         * come on a server's slot) */
        __atomic_store_n(&o->parked, 0, __ATOMIC_RELEASE);
        q->ops->done(q, o, ctx);
    }
}

int vrpc_offer_grant_locked(struct vrpc_conn_base *c, struct vrpc_rndv_out *o)
{
    if (c->gone || vrpc_conn_is_dead(c))
        return -ENOTCONN;
    int rc = o->p_nsegs ? vrpc_rndv_grant_segs(o, c->ep, o->p_lb, o->p_segs, o->p_nsegs, o->p_len, o->p_id)
                        : vrpc_rndv_grant(o, c->ep, o->p_lb, o->p_len, o->p_id);
    if (rc == 0)
        vrpc_conn_ref(c); /* the grant's: the endpoint outlives the key */
    return rc;
}

void vrpc_offer_hold_fired(void *ctx, uint64_t arg)
{
    struct vrpc_offer_q *q = ctx;
    const struct vrpc_offer_ops *ops = q->ops;
    struct vrpc_offer_held h;
    pthread_mutex_lock(q->lock);
    bool found = ops->hold_find_locked(q, arg, &h);
    pthread_mutex_unlock(q->lock);
    if (!found)
        return;
    char peer[VRPC_URI_MAX] = "?";
    vrpc_ep_peer_uri(h.c->ep, peer, sizeof(peer));
    vrpc_rpc_log("%s %s held the %u-byte %s of call %#llx for %u ms without reading it%s; aborting the connection",
                 ops->hold_peer, peer, h.len, h.what ? h.what : ops->hold_what, (unsigned long long)h.id, h.hold_ms,
                 ops->hold_note);
    ops->hold_kill(h.c);
    vrpc_ep_abort(h.c->ep, -ECONNABORTED);
    ops->conn_unref(h.c);
}

void vrpc_offer_revoke(struct vrpc_rndv_retry *r, struct vrpc_rndv_out *o, const char *what)
{
    int rc = vrpc_rndv_revoke(o);
    if (rc == -ENOSPC)
        vrpc_rndv_revoke_later(r, o);
    else if (rc && rc != -EALREADY)
        vrpc_rpc_log("revoking a large %s's key failed (%s); released with the connection", what, strerror(-rc));
}

void vrpc_offer_revoked(struct vrpc_offer_q *q, struct vrpc_timer_wheel *w, struct vrpc_rndv_out *o)
{
    vrpc_timer_cancel(w, &o->hold_timer);
    pthread_mutex_lock(q->lock);
    vrpc_rndv_revoked(o);
    pthread_mutex_unlock(q->lock);
}

bool vrpc_offer_drop(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, const struct vrpc_ep *ep, uint64_t *id)
{
    pthread_mutex_lock(q->lock);
    if (id)
        *id = o->id;
    bool dropped = vrpc_rndv_drop(o, ep);
    pthread_mutex_unlock(q->lock);
    return dropped;
}
