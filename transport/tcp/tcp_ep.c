/* The TCP backend's endpoints: allocation, close (a FIN once every send is
 * out) and abort (RST from the poller), teardown (flush, give back credits,
 * DISCONNECTED) and the idle, close, read and credit timeouts. */
#define _GNU_SOURCE
#include "transport/tcp/tcp.h"

struct tcp_ep *vrpc_tcp_ep_alloc(struct vrpc_transport *tp, struct tcp_cq *cq, int fd, void *user, int refs)
{
    struct tcp_ep *ep = calloc(1, sizeof *ep);
    if (!ep)
        return NULL;
    vrpc_ep_base_init(&ep->base, tp, &cq->base, user, refs);
    ep->cq = cq;
    ep->fd = fd;
    pthread_mutex_init(&ep->lock, NULL);
    ep->max_queued = tp->attr.max_queued;
    ep->cr.target = ep->cr.keep = tp->attr.credits;
    ep->ctrl.data = ep->ctrl_space + HDR_LEN;
    ep->errf.data = ep->err_space + HDR_LEN;
    atomic_init(&ep->nreads, 0);
    atomic_init(&ep->read_ns, 0);
    atomic_init(&ep->state, S_HANDSHAKE);
    return ep;
}

void vrpc_tcp_ep_free(struct vrpc_ep *base)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    pthread_mutex_destroy(&ep->lock);
    free(ep->rslots);
    free(ep->jobs);
    free(ep);
}

int vrpc_tcp_ep_close(struct vrpc_ep *base)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    pthread_mutex_lock(&ep->lock);
    if (atomic_load(&ep->state) != S_OPEN) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    atomic_store(&ep->state, S_CLOSING);
    atomic_store(&ep->close_ns, vrpc_tp_now_ns());
    /* Sends waiting for credits still go as credits arrive (the peer keeps
     * reading until our FIN); the write side shuts once both queues drain. */
    vrpc_tcp_msg_tx_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    tcp_cq_wake(ep->cq);
    return 0;
}

/* Any thread: stop writing, then hand ep to its poller, which tears it down
 * (RST) on its next pass. The list holds a reference until then, so a
 * DISCONNECTED delivered meanwhile cannot free ep under it. */
int vrpc_tcp_ep_abort(struct vrpc_ep *base, int status)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    struct tcp_ep *old;
    int st;
    pthread_mutex_lock(&ep->lock);
    st = atomic_load(&ep->state);
    if (st == S_ABORTING || st == S_DEAD) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    ep->abort_status = status;
    ep->werr = true; /* nothing more goes on the wire */
    atomic_store(&ep->state, S_ABORTING);
    pthread_mutex_unlock(&ep->lock);
    atomic_fetch_add_explicit(&ep->base.refs, 1, memory_order_relaxed);
    old = atomic_load(&ep->cq->aborts);
    do
        ep->xnext = old;
    while (!atomic_compare_exchange_weak(&ep->cq->aborts, &old, ep));
    tcp_cq_wake(ep->cq);
    return 0;
}

/* Poller: tear down the endpoints of an abort list taken before adopt() (so
 * every one of them has been adopted), and drop the list's references. */
void vrpc_tcp_ep_run_aborts(struct tcp_cq *cq, struct tcp_ep *ep)
{
    struct tcp_ep *n;
    for (; ep; ep = n) {
        n = ep->xnext;
        vrpc_tcp_ep_teardown(cq, ep, ep->abort_status, NULL);
        vrpc_ep_unref(&ep->base);
    }
}

static void ep_list_remove(struct tcp_cq *cq, struct tcp_ep *ep)
{
    if (ep->prev)
        ep->prev->next = ep->next;
    else if (cq->eps == ep)
        cq->eps = ep->next;
    if (ep->next)
        ep->next->prev = ep->prev;
    ep->prev = ep->next = NULL;
    cq->neps--;
}

/* End a connection: flush its sends, give back its promises and partial
 * receive, and queue its DISCONNECTED (or free it, if never reported). */
void vrpc_tcp_ep_teardown(struct tcp_cq *cq, struct tcp_ep *ep, int status, const char *why)
{
    bool aborted;
    int fd;
    if (atomic_load(&ep->state) == S_DEAD)
        return;
    pthread_mutex_lock(&ep->lock);
    aborted = atomic_load(&ep->state) == S_ABORTING;
    if (aborted) { /* the user's abort decides the status, whatever ended it first */
        status = ep->abort_status;
        why = NULL;
    }
    if (why)
        vrpc_tp_log("tcp: connection %s: %s (%s)", ep->base.peer_uri[0] ? ep->base.peer_uri : "(accepting)", why,
                    strerror(status < 0 ? -status : 0));
    atomic_store(&ep->state, S_DEAD);
    vrpc_tcp_msg_flush_locked(ep);
    vrpc_tcp_rma_grants_ep_dead(ep); /* before the jobs go: their pending revokes complete -ECANCELED */
    vrpc_tcp_rma_drop_jobs_locked(ep);
    fd = ep->fd;
    ep->fd = -1;
    pthread_mutex_unlock(&ep->lock);
    epoll_ctl(cq->epfd, EPOLL_CTL_DEL, fd, NULL);
    if (aborted) { /* reset: the kernel drops what is unsent at once */
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
    if (ep->rbuf) { /* a posted receive again, promised to no one */
        tcp_cq_put_posted(cq, ep->rbuf);
        ep->rbuf = NULL;
        atomic_fetch_add(&cq->cr.posted, 1);
        atomic_fetch_add(&cq->cr.avail, 1);
    }
    ep->rdst = NULL;
    ep->rkind = K_NONE;
    ep->rslot = NULL;
    vrpc_tcp_rma_flush_reads(cq, ep);
    vrpc_credit_hungry_remove(&cq->cr, &ep->cr);
    vrpc_credit_ep_release(&cq->cr, &ep->cr);
    ep->cr.granted = 0;
    ep_list_remove(cq, ep);
    if (ep->lst) {
        vrpc_tcp_cm_listener_unref(ep->lst);
        ep->lst = NULL;
    }
    if (ep->counted) {
        atomic_fetch_sub(&ep->counted->nconns, 1);
        vrpc_tcp_cm_listener_unref(ep->counted);
        ep->counted = NULL;
    }
    ep->disc_status = status;
    if (ep->reported) {
        ep->dnext = cq->dead;
        cq->dead = ep;
    } else {
        ep->dnext = cq->reap;
        cq->reap = ep;
    }
}

/* The peer's FIN between frames: a graceful close, unless a read of ours was
 * still unanswered (a closing peer serves every read before its FIN): then
 * the peer died or gave up, and the connection was lost (transport.h). */
void vrpc_tcp_ep_teardown_eof(struct tcp_cq *cq, struct tcp_ep *ep)
{
    int st = vrpc_tp_disc_status(0, true, 0, atomic_load(&ep->nreads) != 0);
    vrpc_tcp_ep_teardown(cq, ep, st, st ? "peer closed with a read of ours unanswered" : NULL);
}

void vrpc_tcp_ep_scan_timeouts(struct tcp_cq *cq, uint64_t now)
{
    struct tcp_ep *ep, *n;
    const struct vrpc_transport_attr *a = &cq->base.tp->attr;
    uint64_t idle = (uint64_t)a->idle_timeout_ms * 1000000u, hs = (uint64_t)a->connect_timeout_ms * 1000000u;
    uint64_t ctmo = (uint64_t)a->credit_timeout_ms * 1000000u;
    uint64_t shrink = a->shrink_ms == VRPC_SHRINK_NEVER ? 0 : (uint64_t)a->shrink_ms * 1000000u;
    for (ep = cq->eps; ep; ep = n) {
        uint64_t c = atomic_load(&ep->close_ns);
        n = ep->next;
        /* (times taken after now are not late: compare as now > t + limit) */
        if (atomic_load(&ep->state) == S_HANDSHAKE && now > ep->frame_ns + hs)
            vrpc_tcp_ep_teardown(cq, ep, -ETIMEDOUT, "handshake timed out");
        else if (ep->frame_ns && now > ep->frame_ns + idle)
            vrpc_tcp_ep_teardown(cq, ep, -ETIMEDOUT,
                                 "frame not completed within the idle timeout (slow or stuck peer)");
        else if (c && now > c + idle)
            vrpc_tcp_ep_teardown(cq, ep, -ETIMEDOUT, "peer did not finish the close");
        else if (atomic_load(&ep->nreads) && now > atomic_load(&ep->read_ns) + idle)
            vrpc_tcp_ep_teardown(cq, ep, -ETIMEDOUT,
                                 "our read got no data within the idle timeout (slow or stuck peer)");
        else if (vrpc_credit_wait_expired(atomic_load_explicit(&ep->wait_ns, memory_order_relaxed), now, ctmo)) {
            snprintf(ep->why, sizeof ep->why, "peer returned no credits for %u ms", a->credit_timeout_ms);
            vrpc_tcp_ep_teardown(cq, ep, -ETIMEDOUT, ep->why);
        } else if (atomic_load(&ep->state) != S_HANDSHAKE) {
            vrpc_credit_shrink(&cq->cr, &ep->cr, now, shrink); /* rule 7 */
        }
    }
}
