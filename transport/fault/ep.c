/* The fault layer's listeners and endpoints: each wraps one of the backend
 * below and forwards to it, injecting connection loss, send and grant
 * errors, and send delays on the calling side. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport/fault/fault.h"

static struct fault_ep *fep(struct vrpc_ep *ep) { return container_of(ep, struct fault_ep, base); }

static struct vrpc_cq *lower_cq(struct vrpc_cq *cq) { return container_of(cq, struct fault_cq, base)->lower; }

struct fault_ep *fault_ep_new(struct fault_tp *t, struct vrpc_cq *cq, void *user)
{
    struct fault_ep *e = calloc(1, sizeof *e);
    uint64_t i;
    if (!e)
        return NULL;
    vrpc_ep_base_init(&e->base, &t->base, cq, user, 2);
    pthread_mutex_init(&e->mu, NULL);
    i = atomic_fetch_add(&t->next_ep, 1);
    fault_rng_seed(&e->rng_api, t->spec.seed, t->index, 2 * i);
    fault_rng_seed(&e->rng_cpl, t->spec.seed, t->index, 2 * i + 1);
    return e;
}

void fault_uri(char *dst, const char *lower_uri)
{
    size_t n = strlen(lower_uri);
    if (n + 6 >= VRPC_URI_MAX)
        n = VRPC_URI_MAX - 7;
    memcpy(dst, "fault+", 6);
    memcpy(dst + 6, lower_uri, n);
    dst[6 + n] = 0;
}

void fault_ep_kill(struct fault_ep *e, int status)
{
    int zero = 0;
    if (!atomic_compare_exchange_strong(&e->dead, &zero, status))
        return;
    /* a graceful close below: the peer sees the connection end; what is
     * still queued here leaves or flushes, each with its completion */
    e->lower->tp->ops->close(e->lower);
}

void fault_ep_free(struct vrpc_ep *ep)
{
    struct fault_ep *e = fep(ep);
    vrpc_ep_destroy(e->lower); /* its DISCONNECTED came before ours */
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int fault_listen(struct vrpc_transport *tp, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
                 struct vrpc_listener **out)
{
    struct fault_tp *t = fault_tp_of(tp);
    struct fault_listener *l = calloc(1, sizeof *l);
    struct vrpc_listen_attr la = *attr;
    struct vrpc_addr a = *addr;
    int rc = -ENOMEM;

    if (!l || !(l->lcqs = calloc(attr->ncqs, sizeof *l->lcqs)))
        goto err;
    for (unsigned i = 0; i < attr->ncqs; i++) {
        if (attr->cqs[i]->tp != tp) {
            rc = -EINVAL;
            goto err;
        }
        l->lcqs[i] = lower_cq(attr->cqs[i]);
    }
    la.cqs = l->lcqs; /* ACCEPTED keeps attr->user as its wr_id */
    snprintf(a.scheme, sizeof a.scheme, "%s", t->lower->name);
    if ((rc = t->lower->ops->listen(t->lower, &a, &la, &l->lower)))
        goto err;
    l->base.tp = tp;
    fault_uri(l->base.uri, l->lower->uri);
    *out = &l->base;
    return 0;
err:
    if (l)
        free(l->lcqs);
    free(l);
    return rc;
}

void fault_listener_destroy(struct vrpc_listener *base)
{
    struct fault_listener *l = container_of(base, struct fault_listener, base);
    l->lower->tp->ops->listener_destroy(l->lower);
    free(l->lcqs);
    free(l);
}

int fault_connect(struct vrpc_transport *tp, const struct vrpc_addr *dst, const struct vrpc_addr *src,
                  const struct vrpc_ep_attr *attr, struct vrpc_ep **out)
{
    struct fault_tp *t = fault_tp_of(tp);
    struct vrpc_ep_attr la = *attr;
    struct vrpc_addr d = *dst;
    struct fault_ep *e;
    bool refuse;
    int rc;

    pthread_mutex_lock(&t->mu);
    refuse = fault_rng_hit(&t->rng, FAULT_P(t, connect));
    pthread_mutex_unlock(&t->mu);
    if (refuse) {
        fault_count(t, VRPC_FAULT_CONNECT_REFUSED);
        return -ECONNREFUSED;
    }
    if (!(e = fault_ep_new(t, attr->cq, attr->user)))
        return -ENOMEM;
    /* every completion of the endpoint below finds e through its user */
    la.cq = lower_cq(attr->cq);
    la.user = e;
    snprintf(d.scheme, sizeof d.scheme, "%s", t->lower->name);
    rc = t->lower->ops->connect(t->lower, &d, src, &la, &e->lower);
    if (rc) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        return rc;
    }
    e->base.eager = vrpc_ep_eager_size(e->lower);
    fault_uri(e->base.peer_uri, e->lower->peer_uri);
    *out = &e->base;
    return 0;
}

/* Caller's side decisions of one operation, drawn together so that the
 * stream advances the same way whatever the outcome. */
struct api_draw {
    bool loss, before, eagain, delay, refuse;
    uint32_t delay_us;
};

static struct api_draw draw(struct fault_ep *e, struct fault_tp *t)
{
    struct api_draw d;
    pthread_mutex_lock(&e->mu);
    d.loss = fault_rng_hit(&e->rng_api, FAULT_P(t, loss));
    d.before = d.loss && (fault_rng_next(&e->rng_api) & 1);
    d.eagain = fault_rng_hit(&e->rng_api, FAULT_P(t, eagain));
    d.delay = fault_rng_hit(&e->rng_api, FAULT_P(t, send_delay));
    d.delay_us = d.delay ? fault_rng_upto(&e->rng_api, t->spec.send_delay_us) : 0;
    d.refuse = fault_rng_hit(&e->rng_api, FAULT_P(t, grant_refuse));
    pthread_mutex_unlock(&e->mu);
    return d;
}

int fault_send(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id, unsigned flags)
{
    struct fault_ep *e = fep(ep);
    struct fault_tp *t = fault_tp_of(ep->tp);
    struct api_draw d;
    int rc;

    if (atomic_load(&e->dead))
        return -ENOTCONN;
    d = draw(e, t);
    if (d.loss && d.before) {
        fault_count(t, VRPC_FAULT_LOSS_SEND_BEFORE);
        fault_ep_kill(e, -ECONNRESET);
        return -ENOTCONN;
    }
    /* only while a completion of this endpoint's sends is to come: the
     * caller retries after one (transport.h) */
    if (d.eagain && atomic_load(&e->inflight) > 0) {
        fault_count(t, VRPC_FAULT_SEND_EAGAIN);
        return -EAGAIN;
    }
    if (d.delay) {
        struct timespec ts = {0, (long)d.delay_us * 1000};
        fault_count(t, VRPC_FAULT_SEND_DELAY);
        nanosleep(&ts, NULL);
    }
    /* counted once accepted below (the completion may be counted first:
     * inflight dips below zero for a moment, never above the truth) */
    rc = e->lower->tp->ops->send(e->lower, buf, len, imm, wr_id, flags);
    if (rc)
        return rc;
    atomic_fetch_add(&e->inflight, 1);
    atomic_fetch_add(&t->bufs_out, 1);
    if (d.loss) {
        fault_count(t, VRPC_FAULT_LOSS_SEND_AFTER);
        fault_ep_kill(e, -ECONNRESET);
    }
    return 0;
}

int fault_read(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
               uint64_t wr_id)
{
    struct fault_ep *e = fep(ep);
    struct fault_tp *t = fault_tp_of(ep->tp);
    struct api_draw d;
    int rc;

    if (atomic_load(&e->dead))
        return -ENOTCONN;
    d = draw(e, t);
    rc = e->lower->tp->ops->read(e->lower, buf, off, len, raddr, rkey, wr_id);
    if (rc)
        return rc;
    atomic_fetch_add(&e->inflight, 1);
    atomic_fetch_add(&t->bufs_out, 1);
    if (d.loss) { /* mid-read: the read completes -ECANCELED */
        fault_count(t, VRPC_FAULT_LOSS_READ);
        fault_ep_kill(e, -ECONNRESET);
    }
    return 0;
}

/* A refused grant (-ENOSPC) only while a completion of ep is to come, after
 * which the caller retries (transport.h). */
static int grant_check(struct fault_ep *e, struct fault_tp *t)
{
    if (atomic_load(&e->dead))
        return -ENOTCONN;
    if (FAULT_P(t, grant_refuse) > 0 && draw(e, t).refuse && atomic_load(&e->inflight) > 0) {
        fault_count(t, VRPC_FAULT_GRANT_REFUSED);
        return -ENOSPC;
    }
    return 0;
}

int fault_grant(struct vrpc_ep *ep, struct vrpc_mr *mr, const void *addr, uint32_t len, uint32_t *rkey)
{
    struct fault_ep *e = fep(ep);
    int rc = grant_check(e, fault_tp_of(ep->tp));
    return rc ? rc : e->lower->tp->ops->grant(e->lower, mr, addr, len, rkey);
}

int fault_grant_segs(struct vrpc_ep *ep, const struct vrpc_seg *segs, unsigned n, uint32_t len, uint32_t *rkey)
{
    struct fault_ep *e = fep(ep);
    int rc = grant_check(e, fault_tp_of(ep->tp));
    return rc ? rc : e->lower->tp->ops->grant_segs(e->lower, segs, n, len, rkey);
}

int fault_revoke(struct vrpc_ep *ep, uint32_t rkey, uint64_t wr_id)
{
    struct fault_ep *e = fep(ep);
    int rc;
    rc = e->lower->tp->ops->revoke(e->lower, rkey, wr_id);
    if (!rc)
        atomic_fetch_add(&e->inflight, 1);
    return rc;
}

int fault_close(struct vrpc_ep *ep)
{
    struct fault_ep *e = fep(ep);
    return e->lower->tp->ops->close(e->lower);
}

/* Forwarded: the backend flushes and resets. The abort's status is the one
 * the DISCONNECTED reports (transport.h), also over a loss injected before
 * it, so it takes e->dead's place. */
int fault_abort(struct vrpc_ep *ep, int status)
{
    struct fault_ep *e = fep(ep);
    int rc = e->lower->tp->ops->abort(e->lower, status);
    if (!rc)
        atomic_store(&e->dead, status);
    return rc;
}
