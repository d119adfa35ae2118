/* Connection management (the CM thread): the rdma_cm event loop, listeners,
 * connect and accept, each rdma_cm event of an endpoint, and the deadlines
 * of handshakes and graceful closes. */
#include "transport/verbs/verbs.h"

/* ---- deadlines (CM thread) ----------------------------------------------------------
 * A peer that vanishes mid-handshake (after CONNECT_REQUEST, before
 * ESTABLISHED) or mid-close (never drains our sends, never answers the DREQ)
 * would hold an endpoint forever: rdma_cm's own retries may take minutes or
 * never end. Such endpoints sit on tp->watch with a deadline (accept:
 * connect_timeout_ms, close: idle_timeout_ms); the CM thread fails them with
 * -ETIMEDOUT once it passes, and what is left flushes. */

void verbs_cm_watch_add(struct vep *ep, uint64_t deadline_ns)
{
    struct vtp *tp = ep->tp;
    pthread_mutex_lock(&tp->lock);
    ep->deadline_ns = deadline_ns;
    if (!ep->watched) {
        ep->watched = true;
        ep->dnext = tp->watch;
        tp->watch = ep;
    }
    pthread_mutex_unlock(&tp->lock);
    verbs_wake(tp->wakefd); /* the CM thread's sleep may end before the deadline */
}

/* tp->lock held. */
void verbs_cm_watch_del_locked(struct vtp *tp, struct vep *ep)
{
    if (!ep->watched)
        return;
    for (struct vep **pp = &tp->watch; *pp; pp = &(*pp)->dnext)
        if (*pp == ep) {
            *pp = ep->dnext;
            break;
        }
    ep->watched = false;
}

/* CM thread: fails the endpoints whose deadline passed; returns the ms until
 * the next deadline (at most cap). Endpoints are only torn down (and freed
 * later) on this thread, so the expired ones stay valid while failed. */
static int watch_scan(struct vtp *tp, int cap)
{
    uint64_t now = vrpc_tp_now_ns(), next = now + (uint64_t)cap * 1000000u;
    struct vep *expired = NULL;
    pthread_mutex_lock(&tp->lock);
    for (struct vep **pp = &tp->watch; *pp;) {
        struct vep *ep = *pp;
        if (ep->deadline_ns <= now) {
            *pp = ep->dnext;
            ep->watched = false;
            ep->xnext = expired;
            expired = ep;
        } else {
            if (ep->deadline_ns < next)
                next = ep->deadline_ns;
            pp = &ep->dnext;
        }
    }
    pthread_mutex_unlock(&tp->lock);
    for (struct vep *ep = expired; ep; ep = ep->xnext) {
        verbs_ep_fail_in(ep, S_ACCEPTING, -ETIMEDOUT, "accept handshake not completed within %u ms",
                         ep->tp->base.attr.connect_timeout_ms);
        verbs_ep_fail_in(ep, S_CLOSING, -ETIMEDOUT,
                         "peer did not complete the graceful close within the idle timeout (%u ms)",
                         ep->tp->base.attr.idle_timeout_ms);
    }
    return (int)((next - now + 999999u) / 1000000u);
}

/* The READs this side may have outstanding to the peer, from its connect or
 * accept (event data is from the receiver's point of view): the window is
 * clamped to it. A peer that grants none (it asked rdma_cm for no responder
 * resources) would let every READ hang, so reads to it fail at once. */
static void ep_set_read_depth(struct vep *ep, const struct rdma_conn_param *pc)
{
    pthread_mutex_lock(&ep->lock);
    if (pc->initiator_depth < ep->rd_window)
        ep->rd_window = pc->initiator_depth;
    pthread_mutex_unlock(&ep->lock);
    TRACE("verbs: %s read depth: peer allows %u, window %u", ep->base.peer_uri, pc->initiator_depth, ep->rd_window);
}

static void on_connect_request(struct vtp_listener *l, struct rdma_cm_event *ev)
{
    struct vtp *tp = l->tp;
    struct rdma_cm_id *id = ev->id;
    struct vcq *cq = l->cqs[l->rr++ % l->ncqs];
    struct vep *ep;
    struct rdma_conn_param p;
    struct hello h;
    char why[128];
    int rc;

    rc = verbs_hello_check(tp, ev->param.conn.private_data, ev->param.conn.private_data_len, why, sizeof(why));
    /* the first connection binds the transport to the listener's device */
    if (!rc && (verbs_dev_bind(tp, id->verbs) || !atomic_load(&cq->bound))) {
        snprintf(why, sizeof(why), "request arrived on another device");
        rc = -EXDEV;
    }
    if (!rc && l->nconns->max && atomic_fetch_add(&l->nconns->n, 1) >= l->nconns->max) {
        atomic_fetch_sub(&l->nconns->n, 1);
        snprintf(why, sizeof(why), "the listener has %u connections, its limit (max_conns)", l->nconns->max);
        rc = -ECONNREFUSED;
    } else if (!rc && !l->nconns->max) {
        atomic_fetch_add(&l->nconns->n, 1);
    }
    if (!rc && !vrpc_credit_reserve(&cq->cr)) {
        snprintf(why, sizeof(why), "no receive buffers to reserve");
        atomic_fetch_sub(&l->nconns->n, 1);
        rc = -ENOBUFS;
    }
    if (rc) {
        vrpc_tp_log("verbs: refusing a connection: %s", why);
        verbs_hello_reject(id, tp, rc, why);
        id->context = NULL;
        return;
    }
    ep = verbs_ep_new(tp, cq, NULL, 0);
    if (!ep) {
        atomic_fetch_add(&cq->cr.avail, MIN_RESV + CTL_RESV);
        atomic_fetch_sub(&l->nconns->n, 1);
        verbs_hello_reject(id, tp, -ENOMEM, "server out of memory");
        id->context = NULL;
        return;
    }
    ep->counted = true;
    ep->nconns = l->nconns;
    atomic_fetch_add(&l->nconns->refs, 1);
    ep->id = id;
    ep->lst = l;
    ep->accept_user = l->user;
    ep->state = S_ACCEPTING;
    id->context = &ep->kind;
    vrpc_addr_format("verbs", rdma_get_peer_addr(id), ep->base.peer_uri, sizeof(ep->base.peer_uri));
    verbs_hello_set_peer(ep, ev->param.conn.private_data);
    rc = verbs_ep_setup_qp(ep, true);
    if (!rc) {
        ep_set_read_depth(ep, &ev->param.conn);
        verbs_hello_conn_param(ep, &p, &h);
        if (rdma_accept(id, &p))
            rc = verbs_err_errno();
    }
    if (!rc)
        verbs_cm_watch_add(ep, verbs_ms_from_now(tp->base.attr.connect_timeout_ms));
    if (rc) {
        vrpc_tp_log("verbs: cannot accept %s: %s", ep->base.peer_uri, strerror(-rc));
        verbs_hello_reject(id, tp, rc, "server could not set up a queue pair");
        ep->id = NULL;
        id->context = NULL;
        verbs_ep_fail(ep, rc, "accept failed");
    }
}

/* ADDR_RESOLVED (client): the first connection binds the transport to the
 * route's device; then the route. */
static void on_addr_resolved(struct vep *ep)
{
    int rc = verbs_dev_bind(ep->tp, ep->id->verbs);
    if (!rc && !atomic_load(&ep->cq->bound))
        rc = -EIO;
    if (!rc && rdma_resolve_route(ep->id, CM_TIMEOUT_MS))
        rc = verbs_err_errno();
    if (rc)
        verbs_ep_fail(ep, rc == -EXDEV ? -EHOSTUNREACH : rc, "cannot use the route's device: %s", strerror(-rc));
}

/* ROUTE_RESOLVED (client): the QP, and the connect request with our HELLO. */
static void on_route_resolved(struct vep *ep)
{
    struct rdma_conn_param p;
    struct hello h;
    int rc;
    /* without a reservation the connect still goes out, so that a
	 * refusal is reported as such; an accept is then rejected here */
    ep->counted = vrpc_credit_reserve(&ep->cq->cr);
    rc = verbs_ep_setup_qp(ep, false);
    if (!rc) {
        verbs_hello_conn_param(ep, &p, &h);
        if (rdma_connect(ep->id, &p))
            rc = verbs_err_errno();
    }
    if (rc)
        verbs_ep_fail(ep, rc, "cannot connect: %s", strerror(-rc));
}

/* CONNECT_RESPONSE (client): the server's HELLO; the QP to RTS, then RTU. */
static void on_connect_response(struct vep *ep, struct rdma_cm_event *ev)
{
    struct vtp *tp = ep->tp;
    char why[128];
    int rc;
    rc = verbs_hello_check(tp, ev->param.conn.private_data, ev->param.conn.private_data_len, why, sizeof(why));
    if (!rc && !ep->counted) {
        snprintf(why, sizeof(why), "fewer than %u unpromised receive buffers on the client's CQ", MIN_RESV + CTL_RESV);
        rc = -ENOBUFS;
    }
    if (rc) {
        verbs_hello_reject(ep->id, tp, rc, why);
        verbs_ep_fail(ep, rc, "server's reply refused: %s", why);
        return;
    }
    pthread_mutex_lock(&ep->lock);
    verbs_hello_set_peer(ep, ev->param.conn.private_data);
    pthread_mutex_unlock(&ep->lock);
    ep_set_read_depth(ep, &ev->param.conn);
    rc = verbs_ep_qp_modify(ep, IBV_QPS_RTR);
    if (!rc)
        rc = verbs_ep_qp_modify(ep, IBV_QPS_RTS);
    if (!rc && rdma_establish(ep->id))
        rc = verbs_err_errno();
    if (rc) {
        verbs_ep_fail(ep, rc, "cannot complete the connection: %s", strerror(-rc));
        return;
    }
    pthread_mutex_lock(&ep->lock);
    ep->cm_up = true;
    if (ep->state == S_CONNECTING)
        ep->state = S_OPEN;
    pthread_cond_broadcast(&ep->cond);
    pthread_mutex_unlock(&ep->lock);
}

/* ESTABLISHED (either side). */
static void on_established(struct vep *ep)
{
    pthread_mutex_lock(&ep->lock);
    ep->cm_up = true;
    if (ep->state == S_ACCEPTING || ep->state == S_CONNECTING)
        ep->state = S_OPEN;
    verbs_ep_close_progress_locked(ep); /* a close that waited for it */
    pthread_cond_broadcast(&ep->cond);
    pthread_mutex_unlock(&ep->lock);
    if (ep->lst)
        verbs_ep_todo_add(ep); /* the poller reports ACCEPTED */
}

/* DISCONNECTED (either side): the CM's verdict (see verbs_ep_fail_cm). */
static void on_disconnected(struct vep *ep)
{
    bool local, busy;
    uint32_t sends, reads, mws, queued;
    pthread_mutex_lock(&ep->lock);
    local = ep->state == S_CLOSING;
    busy = ep->state != S_DEAD && !verbs_ep_sq_idle_locked(ep);
    sends = verbs_msg_ring_used(ep);
    reads = ep->rd_inflight;
    mws = ep->mw_inflight;
    queued = ep->nwait;
    pthread_mutex_unlock(&ep->lock);
    /* what the disconnect cuts off (error path: the peer left mid-work) */
    if (busy && ep->reported)
        vrpc_tp_log("verbs: qpn %u to %s: peer disconnected with %u sends unacknowledged, %u READ chunks and %u "
                    "window operations in flight, %u sends queued for credits",
                    ep->qpn, ep->base.peer_uri, sends, reads, mws, queued);
    /* a graceful close by either side, or a peer process that died;
	 * but a QP already in error (nothing here moves it there before
	 * ep_fail) means the connection broke first: e.g. this side
	 * refused the peer's RDMA READ (bad key or range), which sets
	 * both QPs in error and reaches this side only as the peer's
	 * disconnect */
    if (!local && verbs_ep_qp_in_error(ep))
        verbs_ep_fail_cm(ep, -ECONNRESET,
                         "queue pair in error (an RDMA READ of the peer refused, or a transport error)");
    else
        verbs_ep_fail_cm(ep, 0, "%s", local ? "closed" : "peer disconnected");
}

/* An rdma_cm event of an endpoint: one step per kind. */
static void on_ep_event(struct vep *ep, struct rdma_cm_event *ev)
{
    char why[128];
    int rc;

    switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        on_addr_resolved(ep);
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        on_route_resolved(ep);
        break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        on_connect_response(ep, ev);
        break;
    case RDMA_CM_EVENT_ESTABLISHED:
        on_established(ep);
        break;
    case RDMA_CM_EVENT_REJECTED:
        rc = verbs_hello_reject_reason(ev, why, sizeof(why));
        verbs_ep_fail(ep, rc, "%s", why);
        break;
    case RDMA_CM_EVENT_ADDR_ERROR:
        verbs_ep_fail(ep, -EHOSTUNREACH, "cannot resolve the address (ADDR_ERROR %d)", ev->status);
        break;
    case RDMA_CM_EVENT_ROUTE_ERROR:
        verbs_ep_fail(ep, -EHOSTUNREACH, "no route to the peer (ROUTE_ERROR %d)", ev->status);
        break;
    case RDMA_CM_EVENT_UNREACHABLE:
        verbs_ep_fail(ep, ev->status == -ETIMEDOUT ? -ETIMEDOUT : -EHOSTUNREACH, "peer unreachable (status %d)",
                      ev->status);
        break;
    case RDMA_CM_EVENT_CONNECT_ERROR:
        verbs_ep_fail(ep, -ECONNREFUSED, "connection failed (CONNECT_ERROR %d)", ev->status);
        break;
    case RDMA_CM_EVENT_DISCONNECTED:
        on_disconnected(ep);
        break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        verbs_ep_fail(ep, -ENODEV, "RDMA device removed");
        break;
    default:
        break;
    }
}

static void handle_cm_event(struct vtp *tp, struct rdma_cm_event *ev)
{
    TRACE("verbs: cm event %s status %d", rdma_event_str(ev->event), ev->status);
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        enum obj_kind *k = ev->listen_id->context;
        struct vtp_listener *l = k ? container_of(k, struct vtp_listener, kind) : NULL;
        struct rdma_cm_id *id = ev->id;
        if (l && !l->closing) {
            on_connect_request(l, ev);
        } else {
            verbs_hello_reject(id, tp, -ECONNREFUSED, "listener closing");
            id->context = NULL;
        }
        rdma_ack_cm_event(ev);
        if (!id->context)
            rdma_destroy_id(id);
        return;
    }
    if (ev->id->context && *(enum obj_kind *)ev->id->context == K_EP)
        on_ep_event(container_of((enum obj_kind *)ev->id->context, struct vep, kind), ev);
    rdma_ack_cm_event(ev);
}

void *verbs_cm_main(void *arg)
{
    struct vtp *tp = arg;
    int tmo = 500;
    while (!atomic_load(&tp->stop)) {
        struct epoll_event evs[4];
        int n = epoll_wait(tp->epfd, evs, 4, tmo);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.fd == tp->ech->fd) {
                struct rdma_cm_event *ev;
                while (rdma_get_cm_event(tp->ech, &ev) == 0)
                    handle_cm_event(tp, ev);
            } else if (tp->verbs && evs[i].data.fd == tp->verbs->async_fd) {
                verbs_dev_read_async_events(tp->verbs);
            } else {
                verbs_drain(tp->wakefd);
            }
        }
        for (;;) {
            struct vep *ep;
            pthread_mutex_lock(&tp->lock);
            ep = tp->reap;
            if (ep)
                tp->reap = ep->anext;
            pthread_mutex_unlock(&tp->lock);
            if (!ep)
                break;
            verbs_ep_teardown(ep);
        }
        tmo = watch_scan(tp, 500);
        verbs_dev_async_fail_pending(tp);
        pthread_mutex_lock(&tp->lock);
        if (tp->cmd && !tp->cmd_done) {
            void (*fn)(void *) = tp->cmd;
            void *a = tp->cmd_arg;
            pthread_mutex_unlock(&tp->lock);
            fn(a);
            pthread_mutex_lock(&tp->lock);
            tp->cmd_done = true;
            pthread_cond_broadcast(&tp->cond);
        }
        pthread_mutex_unlock(&tp->lock);
    }
    return NULL;
}

/* Runs fn(arg) on the CM thread, so that it never races event handling. */
static void run_on_cm(struct vtp *tp, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&tp->lock);
    while (tp->cmd)
        pthread_cond_wait(&tp->cond, &tp->lock);
    tp->cmd = fn;
    tp->cmd_arg = arg;
    tp->cmd_done = false;
    verbs_wake(tp->wakefd);
    while (!tp->cmd_done)
        pthread_cond_wait(&tp->cond, &tp->lock);
    tp->cmd = NULL;
    pthread_cond_broadcast(&tp->cond);
    pthread_mutex_unlock(&tp->lock);
}

static void listener_close_cm(void *arg)
{
    struct vtp_listener *l = arg;
    l->closing = true;
    if (l->id)
        rdma_destroy_id(l->id);
    l->id = NULL;
}

void verbs_cm_listener_destroy(struct vrpc_listener *base)
{
    struct vtp_listener *l = container_of(base, struct vtp_listener, base);
    run_on_cm(l->tp, listener_close_cm, l);
    /* handshakes still in progress keep l->lst until ESTABLISHED; they are
	 * reported (ACCEPTED) without it being dereferenced */
    verbs_conns_unref(l->nconns);
    free(l->cqs);
    free(l);
}

/* An address rdma_cm cannot place on a device: no device at all, or not on
 * an RDMA netdev (the same sentences as `verbrpc doctor`). */
static void addr_advice(const struct vrpc_addr *a)
{
    char ip[INET6_ADDRSTRLEN + 8] = "?", why[256];
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    struct vrpc_verbs_diag d = {.addr = ip};
    if (l)
        ibv_free_device_list(l);
    if (a->ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)&a->ss)->sin_addr, ip, sizeof(ip));
    else if (a->ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)&a->ss)->sin6_addr, ip, sizeof(ip));
    vrpc_tp_log("verbs: %s",
                vrpc_verbs_advice(n > 0 ? VRPC_VP_NOT_RDMA_ADDR : VRPC_VP_NO_DEVICE, &d, why, sizeof(why)));
}

int verbs_cm_listen(struct vrpc_transport *tbase, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
                    struct vrpc_listener **out)
{
    struct vtp *tp = container_of(tbase, struct vtp, base);
    struct vtp_listener *l = calloc(1, sizeof(*l));
    int rc;
    if (!l)
        return -ENOMEM;
    l->base.tp = tbase;
    l->kind = K_LISTENER;
    l->tp = tp;
    l->user = attr->user;
    l->ncqs = attr->ncqs;
    l->cqs = calloc(attr->ncqs, sizeof(*l->cqs));
    l->nconns = calloc(1, sizeof(*l->nconns));
    if (!l->cqs || !l->nconns) {
        free(l->cqs);
        free(l->nconns);
        free(l);
        return -ENOMEM;
    }
    atomic_init(&l->nconns->refs, 1);
    l->nconns->max = attr->max_conns;
    for (unsigned i = 0; i < attr->ncqs; i++)
        l->cqs[i] = container_of(attr->cqs[i], struct vcq, base);
    if (rdma_create_id(tp->ech, &l->id, &l->kind, RDMA_PS_TCP)) {
        rc = verbs_err_errno();
        goto err;
    }
    if (rdma_bind_addr(l->id, (struct sockaddr *)&addr->ss)) {
        rc = verbs_err_errno();
        goto err;
    }
    if (!l->id->verbs) {
        vrpc_tp_log("verbs: cannot listen on a wildcard address: name the device's IP");
        rc = -EADDRNOTAVAIL;
        goto err;
    }
    if (rdma_listen(l->id, attr->backlog > 0 ? attr->backlog : 1024)) {
        rc = verbs_err_errno();
        goto err;
    }
    vrpc_addr_format("verbs", rdma_get_local_addr(l->id), l->base.uri, sizeof(l->base.uri));
    *out = &l->base;
    return 0;
err:
    if (rc == -ENODEV) {
        rc = -EADDRNOTAVAIL; /* the address is not on an RDMA device */
        addr_advice(addr);
    }
    if (l->id)
        rdma_destroy_id(l->id);
    verbs_conns_unref(l->nconns);
    free(l->cqs);
    free(l);
    return rc;
}

int verbs_cm_connect(struct vrpc_transport *tbase, const struct vrpc_addr *dst, const struct vrpc_addr *src,
                     const struct vrpc_ep_attr *attr, struct vrpc_ep **out)
{
    struct vtp *tp = container_of(tbase, struct vtp, base);
    struct vcq *cq = container_of(attr->cq, struct vcq, base);
    uint32_t tmo = attr->timeout_ms ? attr->timeout_ms : tbase->attr.connect_timeout_ms;
    struct timespec dl;
    struct vep *ep;
    int rc;

    ep = verbs_ep_new(tp, cq, attr->user, attr->max_queued);
    if (!ep)
        return -ENOMEM;
    ep->state = S_CONNECTING;
    vrpc_addr_format("verbs", (const struct sockaddr *)&dst->ss, ep->base.peer_uri, sizeof(ep->base.peer_uri));
    if (rdma_create_id(tp->ech, &ep->id, &ep->kind, RDMA_PS_TCP)) {
        rc = verbs_err_errno();
        verbs_ep_free(&ep->base);
        return rc;
    }
    if (rdma_resolve_addr(ep->id, src ? (struct sockaddr *)&src->ss : NULL, (struct sockaddr *)&dst->ss,
                          CM_TIMEOUT_MS)) {
        rc = verbs_err_errno();
        rdma_destroy_id(ep->id);
        verbs_ep_free(&ep->base);
        if (rc == -ENODEV)
            addr_advice(src ? src : dst);
        return rc == -ENODEV ? -EHOSTUNREACH : rc;
    }
    vrpc_clock_real_ts(&dl); /* ep->cond has the default clock */
    dl.tv_sec += tmo / 1000;
    dl.tv_nsec += (long)(tmo % 1000) * 1000000;
    if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&ep->lock);
    while (ep->state == S_CONNECTING)
        if (pthread_cond_timedwait(&ep->cond, &ep->lock, &dl) == ETIMEDOUT)
            break;
    rc = ep->state == S_OPEN ? 0 : ep->state == S_DEAD ? (ep->status ? ep->status : -ECONNRESET) : -ETIMEDOUT;
    pthread_mutex_unlock(&ep->lock);
    if (rc) {
        if (rc == -ETIMEDOUT)
            verbs_ep_fail(ep, rc, "connect timed out");
        if (rc == -EPROTO) /* a mismatch someone must fix: say why, here too */
            vrpc_tp_log("verbs: connect to %s failed: %s", ep->base.peer_uri, ep->why);
        TRACE("verbs: connect to %s failed: %s", ep->base.peer_uri, ep->why);
        return rc; /* never handed out: no DISCONNECTED; the teardown frees it */
    }
    ep->reported = true;
    *out = &ep->base;
    return 0;
}
