/* Completion queues and the poller: the SRQ and its posted receives, the
 * endpoints handed to the poller, send and receive completions, the credit
 * watchdog, poll/arm/wait, flush, create/destroy and post_recv. */
#include "transport/verbs/verbs.h"

/* Posted receives are linked through priv[2]/priv[3] (cq->lock) so that
 * cq_flush can hand each back exactly once. */
static void posted_link(struct vcq *cq, struct vrpc_buf *b)
{
    b->priv[2] = 0;
    b->priv[3] = (uintptr_t)cq->posted_list;
    if (cq->posted_list)
        cq->posted_list->priv[2] = (uintptr_t)b;
    cq->posted_list = b;
}

static void posted_unlink(struct vcq *cq, struct vrpc_buf *b)
{
    struct vrpc_buf *prev = (struct vrpc_buf *)(uintptr_t)b->priv[2], *next = (struct vrpc_buf *)(uintptr_t)b->priv[3];
    if (prev)
        prev->priv[3] = (uintptr_t)next;
    else
        cq->posted_list = next;
    if (next)
        next->priv[2] = (uintptr_t)prev;
}

/* cq->lock held. */
static int post_srq(struct vcq *cq, struct vrpc_buf *list)
{
    struct ibv_recv_wr wrs[16], *bad;
    struct ibv_sge sges[16];
    int rc = 0;
    while (list && !rc) {
        unsigned n = 0;
        for (; list && n < 16; list = list->next, n++) {
            posted_link(cq, list);
            sges[n].addr = (uintptr_t)list->data - HDR_LEN;
            sges[n].length = list->cap + HDR_LEN;
            sges[n].lkey = list->mr->lkey;
            wrs[n].wr_id = (uintptr_t)list | WRID_RECV;
            wrs[n].sg_list = &sges[n];
            wrs[n].num_sge = 1;
            wrs[n].next = n ? NULL : NULL;
            if (n)
                wrs[n - 1].next = &wrs[n];
        }
        rc = verbs_err_pos(ibv_post_srq_recv(cq->srq, wrs, &bad));
    }
    return rc;
}

int verbs_cq_bind(struct vtp *tp, struct vcq *cq)
{
    struct ibv_srq_init_attr sa;
    int cqe = (int)cq->max_recv * 2 + 1024, rc;
    struct vrpc_buf *pend;
    if (cqe > tp->dattr.max_cqe)
        cqe = tp->dattr.max_cqe;
    cq->chan = ibv_create_comp_channel(tp->verbs);
    if (!cq->chan)
        return verbs_err_errno();
    fcntl(cq->chan->fd, F_SETFL, fcntl(cq->chan->fd, F_GETFL) | O_NONBLOCK);
    cq->cq = ibv_create_cq(tp->verbs, cqe, cq, cq->chan, 0);
    if (!cq->cq)
        return verbs_err_errno();
    memset(&sa, 0, sizeof(sa));
    sa.attr.max_wr = cq->max_recv < (uint32_t)tp->dattr.max_srq_wr ? cq->max_recv : (uint32_t)tp->dattr.max_srq_wr;
    sa.attr.max_sge = 1;
    sa.srq_context = cq; /* names it in asynchronous events */
    cq->srq = ibv_create_srq(tp->pd, &sa);
    if (!cq->srq)
        return verbs_err_errno();
    pthread_mutex_lock(&cq->lock);
    pend = cq->pend_head;
    cq->pend_head = NULL;
    rc = post_srq(cq, pend);
    pthread_mutex_unlock(&cq->lock);
    if (rc)
        return rc;
    if (tp->cfg.srq_limit && tp->cfg.srq_limit < sa.attr.max_wr) {
        struct ibv_srq_attr la = {.srq_limit = tp->cfg.srq_limit};
        if ((rc = verbs_err_pos(ibv_modify_srq(cq->srq, &la, IBV_SRQ_LIMIT))))
            vrpc_tp_log("verbs: cannot arm the receive queue's limit: %s", strerror(-rc));
    }
    atomic_store(&cq->bound, true);
    verbs_wake(cq->evfd);
    return 0;
}

static void reap_request(struct vep *ep)
{
    struct vtp *tp = ep->tp;
    pthread_mutex_lock(&tp->lock);
    ep->anext = tp->reap;
    tp->reap = ep;
    pthread_mutex_unlock(&tp->lock);
    verbs_wake(tp->wakefd);
}

/* Poller: work on an endpoint handed over by another thread. */
static void service_ep(struct vcq *cq, struct vep *ep)
{
    struct vrpc_buf *wq;
    bool drained;
    if (ep->torn) {
        struct vmw *dead;
        pthread_mutex_lock(&ep->lock);
        verbs_rma_flush_locked(cq, ep);
        ep->gone = true; /* revokes from now on: -ENOTCONN, the keys died with the QP */
        dead = ep->grants;
        ep->grants = NULL;
        pthread_mutex_unlock(&ep->lock);
        for (struct vmw *n; dead; dead = n) {
            n = dead->next;
            if (dead->mw)
                ibv_dealloc_mw(dead->mw);
            free(dead);
        }
        if (ep->counted) {
            /* promised buffers nobody can consume any more */
            vrpc_credit_ep_release(&cq->cr, &ep->cr);
            ep->counted = false;
        }
        if (ep->nconns) {
            atomic_fetch_sub(&ep->nconns->n, 1);
            verbs_conns_unref(ep->nconns);
            ep->nconns = NULL;
        }
        pthread_mutex_lock(&ep->lock); /* against wait_clock_locked */
        if (atomic_load_explicit(&ep->wait_ns, memory_order_relaxed)) {
            atomic_store_explicit(&ep->wait_ns, 0, memory_order_relaxed);
            atomic_fetch_sub(&cq->waiting, 1);
        }
        pthread_mutex_unlock(&ep->lock);
        vrpc_credit_hungry_remove(&cq->cr, &ep->cr);
        if (ep->reported) {
            verbs_cq_stage(cq, VRPC_WC_DISCONNECTED, ep, NULL, 0, verbs_ep_final_status(ep), 0, 0);
        } else {
            vrpc_ep_unref(&ep->base);
            vrpc_ep_unref(&ep->base);
        }
        return;
    }
    pthread_mutex_lock(&ep->lock);
    if (!ep->reported && (ep->state == S_OPEN || ep->state == S_CLOSING) && ep->lst) {
        ep->reported = true;
        verbs_cq_stage(cq, VRPC_WC_ACCEPTED, ep, NULL, ep->accept_user, 0, 0, 0);
    }
    if (ep->state == S_DEAD) {
        wq = ep->wq_head;
        ep->wq_head = ep->wq_tail = NULL;
        ep->nwait = 0;
        verbs_rma_flush_locked(cq, ep);
    } else {
        wq = NULL;
    }
    drained = ep->state == S_DEAD && verbs_ep_sq_idle_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    for (struct vrpc_buf *b = wq, *n; b; b = n) {
        n = b->next;
        verbs_cq_stage(cq, VRPC_WC_SEND, ep, b, b->priv[0], -ECANCELED, 0, 0);
    }
    if (drained && !ep->reaping) {
        /* receives of it may still sit in the CQ: tear down (after which
		 * DISCONNECTED is its last completion) once a poll found it empty */
        ep->reaping = true;
        ep->wnext = cq->reap_wait;
        cq->reap_wait = ep;
    }
}

static void reap_waiting(struct vcq *cq)
{
    while (cq->reap_wait) {
        struct vep *ep = cq->reap_wait;
        cq->reap_wait = ep->wnext;
        reap_request(ep);
    }
}

static void take_todo(struct vcq *cq)
{
    struct vep *ep, *next;
    pthread_mutex_lock(&cq->lock);
    ep = cq->todo;
    cq->todo = NULL;
    for (struct vep *e = ep; e; e = e->tnext)
        e->in_todo = false;
    pthread_mutex_unlock(&cq->lock);
    for (; ep; ep = next) {
        next = ep->tnext;
        service_ep(cq, ep);
    }
}

static const char *qp_state_str(enum ibv_qp_state st)
{
    switch (st) {
    case IBV_QPS_RESET:
        return "RESET";
    case IBV_QPS_INIT:
        return "INIT";
    case IBV_QPS_RTR:
        return "RTR";
    case IBV_QPS_RTS:
        return "RTS";
    case IBV_QPS_SQD:
        return "SQD";
    case IBV_QPS_SQE:
        return "SQE";
    case IBV_QPS_ERR:
        return "ERR";
    default:
        return "?";
    }
}

/* Error paths only. */
void verbs_cq_log_wc(struct vep *ep, const struct ibv_wc *wc, const char *what)
{
    char why[200] = "";
    if (ep) {
        pthread_mutex_lock(&ep->lock);
        if (ep->state == S_DEAD)
            snprintf(why, sizeof(why), "; the connection had failed before: %s", ep->why);
        pthread_mutex_unlock(&ep->lock);
    }
    vrpc_tp_log("verbs: qpn %u%s%s: %s completion failed: %s (status %d, opcode %d, vendor_err %#x, wr_id %#llx)%s",
                wc->qp_num, ep ? " to " : " (no endpoint: the QP is unmapped)", ep ? ep->base.peer_uri : "", what,
                ibv_wc_status_str(wc->status), (int)wc->status, (int)wc->opcode, wc->vendor_err,
                (unsigned long long)wc->wr_id, why);
}

void verbs_cq_fail_flushed(struct vep *ep, const struct ibv_wc *wc, const char *what, bool fail)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    const char *st = "?";
    bool quiet;
    pthread_mutex_lock(&ep->lock);
    /* the usual cases: ep failed first and said why, or our own
     * rdma_disconnect moved the QP to error */
    quiet = ep->state == S_DEAD || ep->disc_sent;
    pthread_mutex_unlock(&ep->lock);
    if (quiet || ep->flush_logged)
        return;
    ep->flush_logged = true;
    /* the QP is alive: only the CM thread destroys it, after ep failed */
    if (ep->qp && ibv_query_qp(ep->qp, &a, IBV_QP_STATE, &ia) == 0)
        st = qp_state_str(a.qp_state);
    if (fail)
        verbs_ep_fail(ep, -ECONNRESET,
                      "queue pair in error (qpn %u, state %s): a flushed %s was the first sign, no error "
                      "completion or event came before it",
                      wc->qp_num, st, what);
    else
        vrpc_tp_log("verbs: qpn %u to %s: a flushed %s is the first sign of the queue pair in error (state %s)",
                    wc->qp_num, ep->base.peer_uri, what, st);
}

static void on_send(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
    int st = verbs_wc_status(wc->status);
    uint64_t seq = wc->wr_id >> WRID_SEQ_SHIFT;
    bool drained = false;
    TRACE("verbs: send wc qpn %u status %d seq %llu", wc->qp_num, wc->status, (unsigned long long)seq);
    verbs_ep_note_wc(ep, wc->status, st);
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR) {
        verbs_cq_log_wc(ep, wc, "send");
        verbs_ep_fail(ep, st, "send failed on qpn %u: %s", wc->qp_num, ibv_wc_status_str(wc->status));
    } else if (wc->status == IBV_WC_WR_FLUSH_ERR) {
        verbs_cq_fail_flushed(ep, wc, "send", false);
    }
    for (;;) {
        struct sent s;
        bool hit;
        pthread_mutex_lock(&ep->lock);
        if (ep->head == ep->tail) {
            pthread_mutex_unlock(&ep->lock);
            break;
        }
        s = ep->ring[ep->head & ep->ring_mask];
        hit = ep->seq_head == seq;
        ep->head++;
        ep->seq_head++;
        if (hit) {
            verbs_msg_pump_locked(ep);
            verbs_ep_close_progress_locked(ep);
            drained = ep->state == S_DEAD && verbs_ep_sq_idle_locked(ep);
        }
        pthread_mutex_unlock(&ep->lock);
        /* the ones before this completion finished unsignalled */
        if (s.buf)
            verbs_cq_stage(cq, VRPC_WC_SEND, ep, s.buf, s.wr_id, hit ? st : 0, s.buf->len, 0);
        if (hit)
            break;
    }
    if (drained)
        verbs_ep_todo_add(ep);
}

static void on_recv(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
    struct vrpc_buf *b = (struct vrpc_buf *)(uintptr_t)(wc->wr_id & ~WRID_RECV);
    struct hdr *h = (struct hdr *)((char *)b->data - HDR_LEN);
    uint32_t c;
    TRACE("verbs: recv qpn %u status %d len %u ep %p", wc->qp_num, wc->status, wc->byte_len, (void *)ep);
    pthread_mutex_lock(&cq->lock);
    posted_unlink(cq, b);
    pthread_mutex_unlock(&cq->lock);
    atomic_fetch_sub(&cq->cr.posted, 1);
    if (wc->status != IBV_WC_SUCCESS || !ep || ep->torn || wc->byte_len < HDR_LEN) {
        if (ep && wc->status == IBV_WC_SUCCESS) {
            verbs_ep_fail(ep, -EPROTO, "runt message");
        } else if (ep && !ep->torn && wc->status != IBV_WC_WR_FLUSH_ERR) {
            /* e.g. a message longer than the buffer: the QP is in error */
            verbs_cq_log_wc(ep, wc, "receive");
            verbs_ep_note_wc(ep, wc->status, verbs_wc_status(wc->status));
            verbs_ep_fail(ep, verbs_wc_status(wc->status), "receive failed on qpn %u: %s", wc->qp_num,
                          ibv_wc_status_str(wc->status));
        } else if (!ep && wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR) {
            verbs_cq_log_wc(NULL, wc, "receive");
        }
        if (ep && ep->counted && ep->cr.granted)
            ep->cr.granted--; /* its promise was used */
        b->len = 0;
        verbs_cq_stage(cq, VRPC_WC_RECV, NULL, b, b->priv[0], -ECANCELED, 0, 0);
        return;
    }
    if (!ep->reported && ep->lst) {
        ep->reported = true;
        verbs_cq_stage(cq, VRPC_WC_ACCEPTED, ep, NULL, ep->accept_user, 0, 0, 0);
    }
    c = ntohs(h->credits);
    if (ntohs(h->flags) & HDR_CREDIT_ONLY) {
        /* it used one of the connection's CTL_RESV buffers: repost it at
		 * once, and count it before anything we send carries the count */
        b->next = NULL;
        pthread_mutex_lock(&cq->lock);
        if (post_srq(cq, b) == 0)
            atomic_fetch_add(&cq->cr.posted, 1);
        pthread_mutex_unlock(&cq->lock);
        atomic_fetch_add(&ep->ctl_rcvd, 1);
    }
    pthread_mutex_lock(&ep->lock);
    if (ep->state == S_ACCEPTING)
        ep->state = S_OPEN; /* data before ESTABLISHED: the client is connected */
    ep->credits += c;
    ep->peer_ctl_seen = ntohl(h->ctl_seen);
    if (!(ntohs(h->flags) & HDR_CREDIT_ONLY) && (ep->rq_head || ep->rd_inflight) && ep->rd_unmatched < (1 << 20))
        ep->rd_unmatched++; /* while reading: see READ_CHUNK_BULK */
    verbs_msg_pump_locked(ep);
    if (c && atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
        verbs_msg_wait_clock_locked(ep, true); /* the peer returns credits: a new clock */
    verbs_ep_close_progress_locked(ep);
    if (ep->pending_ctl_min)
        verbs_msg_send_credit_locked(ep); /* one may have waited for the peer's confirmation */
    pthread_mutex_unlock(&ep->lock);
    if (ntohs(h->flags) & HDR_CREDIT_ONLY)
        return;
    vrpc_credit_consumed(&cq->cr, &ep->cr);
    b->len = wc->byte_len - HDR_LEN;
    verbs_cq_stage(cq, VRPC_WC_RECV, ep, b, b->priv[0], 0, b->len,
                   (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0);
    vrpc_credit_distribute(&cq->cr, verbs_msg_credit_send);
}

static void on_wc(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
    static const char *const kind[] = {"send", "receive", "RDMA READ", "memory window operation"};
    if (!ep && (wc->wr_id & WRID_TAG) != WRID_RECV && wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
        verbs_cq_log_wc(NULL, wc, kind[wc->wr_id & WRID_TAG]); /* dropped below: say so */
    switch (wc->wr_id & WRID_TAG) {
    case WRID_RECV:
        on_recv(cq, ep, wc);
        break;
    case WRID_READ:
        if (ep)
            verbs_rma_on_wc(cq, ep, wc);
        break;
    case WRID_MW:
        if (ep)
            verbs_mw_on_wc(cq, ep, wc);
        break;
    default:
        if (ep)
            on_send(cq, ep, wc);
        break;
    }
}

/* Rule 6 of transport.h's credits: a peer that returns no credits while our
 * sends wait for them loses the connection after credit_timeout_ms. Every
 * 200 ms, and only while some endpoint of the CQ waits. */
static void credit_watchdog(struct vcq *cq)
{
    struct vep *late[16];
    unsigned n = 0;
    uint64_t now, lim;
    if (!atomic_load(&cq->waiting))
        return;
    now = vrpc_tp_now_ns();
    if (now < cq->cw_scan_ns)
        return;
    cq->cw_scan_ns = now + 200000000ull;
    lim = (uint64_t)cq->tp->base.attr.credit_timeout_ms * 1000000ull;
    pthread_mutex_lock(&cq->lock);
    for (uint32_t i = 0; i <= cq->map_mask && n < 16; i++) {
        uint64_t w = cq->map[i] ? atomic_load(&cq->map[i]->wait_ns) : 0;
        if (vrpc_credit_wait_expired(w, now, lim))
            late[n++] = cq->map[i];
    }
    pthread_mutex_unlock(&cq->lock);
    /* still allocated: only this poller releases them, after DISCONNECTED */
    for (unsigned i = 0; i < n; i++)
        verbs_ep_fail(late[i], -ETIMEDOUT, "peer returned no credits for %u ms", cq->tp->base.attr.credit_timeout_ms);
}

/* Rule 7 of transport.h's credits: reservations shrink with demand (the
 * core's vrpc_credit_shrink), looked at every 100 ms (the poller wakes at
 * least every 200 ms). */
static void shrink_scan(struct vcq *cq)
{
    uint32_t ms = cq->tp->base.attr.shrink_ms;
    uint64_t now;
    if (ms == VRPC_SHRINK_NEVER)
        return;
    now = vrpc_tp_now_ns();
    if (now < cq->shrink_scan_ns)
        return;
    cq->shrink_scan_ns = now + 100000000ull;
    pthread_mutex_lock(&cq->lock);
    for (uint32_t i = 0; i <= cq->map_mask; i++)
        if (cq->map[i] && cq->map[i]->counted)
            vrpc_credit_shrink(&cq->cr, &cq->map[i]->cr, now, (uint64_t)ms * 1000000ull);
    pthread_mutex_unlock(&cq->lock);
}

/* The CQ whose poller this thread is (set by its first poll): a receive
 * reposted from the CQ's own callback needs no wake-up, the poller
 * distributes credits on its next poll anyway. */
static _Thread_local struct vcq *tl_poller_of;

int verbs_cq_poll(struct vrpc_cq *base, struct vrpc_wc *wc, unsigned max)
{
    struct vcq *cq = container_of(base, struct vcq, base);
    unsigned n = 0;
    tl_poller_of = cq;
    if (cq->st_head == cq->st_tail) {
        take_todo(cq);
        if (atomic_load(&cq->bound)) {
            int k = ibv_poll_cq(cq->cq, 32, cq->wcs);
            for (int i = 0; i < k; i++) {
                struct ibv_wc *w = &cq->wcs[i];
                struct vep *ep;
                pthread_mutex_lock(&cq->lock);
                ep = verbs_cq_map_get(cq, w->qp_num);
                pthread_mutex_unlock(&cq->lock);
                on_wc(cq, ep, w);
            }
            /* the CQ was found empty: the drained endpoints have
			 * nothing left in it. Only after the completions just
			 * polled were handled: the teardown unmaps the QP, and a
			 * message that arrived just before the peer's DREQ must
			 * still find its endpoint (else it would be dropped as
			 * flushed: the lost last message of a graceful close) */
            if (k >= 0 && k < 32)
                reap_waiting(cq);
        } else {
            reap_waiting(cq);
        }
        vrpc_credit_distribute(&cq->cr, verbs_msg_credit_send);
        verbs_rma_watchdog(cq);
        credit_watchdog(cq);
        shrink_scan(cq);
    }
    while (n < max && cq->st_head != cq->st_tail)
        wc[n++] = cq->stage[cq->st_head++ % cq->st_cap];
    if (n)
        atomic_store(&cq->sleeping, 0);
    return (int)n;
}

void verbs_cq_arm(struct vrpc_cq *base)
{
    struct vcq *cq = container_of(base, struct vcq, base);
    atomic_store(&cq->sleeping, 1);
    if (atomic_load(&cq->bound))
        ibv_req_notify_cq(cq->cq, 0);
}

void verbs_cq_wait(struct vrpc_cq *base, int timeout_ms)
{
    struct vcq *cq = container_of(base, struct vcq, base);
    struct pollfd p[2] = {{.fd = cq->evfd, .events = POLLIN}, {.fd = -1, .events = POLLIN}};
    if (!atomic_load(&cq->sleeping))
        return;
    if (atomic_load(&cq->bound))
        p[1].fd = cq->chan->fd;
    poll(p, 2, timeout_ms < 0 || timeout_ms > 200 ? 200 : timeout_ms);
    if (p[0].revents & POLLIN)
        verbs_drain(cq->evfd);
    if (p[1].revents & POLLIN) {
        struct ibv_cq *ecq;
        void *ectx;
        if (ibv_get_cq_event(cq->chan, &ecq, &ectx) == 0 && ++cq->unacked >= ACK_BATCH) {
            ibv_ack_cq_events(cq->cq, cq->unacked);
            cq->unacked = 0;
        }
    }
    atomic_store(&cq->sleeping, 0);
}

void verbs_cq_kick(struct vrpc_cq *base)
{
    struct vcq *cq = container_of(base, struct vcq, base);
    verbs_wake(cq->evfd);
}

/* Poller, at stop: fail every endpoint, wait for their teardown, then flush
 * the SRQ's buffers by destroying it (receives complete -ECANCELED). */
void verbs_cq_flush(struct vrpc_cq *base)
{
    struct vcq *cq = container_of(base, struct vcq, base);
    uint64_t deadline = vrpc_tp_now_ns() + 10000000000ull;
    for (;;) {
        bool any = false;
        pthread_mutex_lock(&cq->lock);
        for (uint32_t i = 0; i <= cq->map_mask; i++)
            if (cq->map[i]) {
                struct vep *ep = cq->map[i];
                pthread_mutex_unlock(&cq->lock);
                verbs_ep_fail(ep, -ECANCELED, "completion queue destroyed");
                pthread_mutex_lock(&cq->lock);
                any = true;
            }
        pthread_mutex_unlock(&cq->lock);
        if (!any || vrpc_tp_now_ns() > deadline)
            break;
        /* let the flushes come in and the CM thread tear down */
        if (atomic_load(&cq->bound)) {
            int k = ibv_poll_cq(cq->cq, 32, cq->wcs);
            for (int i = 0; i < k; i++) {
                struct vep *ep;
                pthread_mutex_lock(&cq->lock);
                ep = verbs_cq_map_get(cq, cq->wcs[i].qp_num);
                pthread_mutex_unlock(&cq->lock);
                on_wc(cq, ep, &cq->wcs[i]);
            }
        }
        take_todo(cq);
        reap_waiting(cq);
        usleep(1000);
    }
    take_todo(cq);
    /* receives still posted: no QP uses the SRQ any more, so they never
	 * complete on their own; each is handed back once, flushed */
    pthread_mutex_lock(&cq->lock);
    for (struct vrpc_buf *b = cq->posted_list, *n; b; b = n) {
        n = (struct vrpc_buf *)(uintptr_t)b->priv[3];
        b->len = 0;
        verbs_cq_stage(cq, VRPC_WC_RECV, NULL, b, b->priv[0], -ECANCELED, 0, 0);
    }
    cq->posted_list = NULL;
    pthread_mutex_unlock(&cq->lock);
    pthread_mutex_lock(&cq->lock);
    for (struct vrpc_buf *b = cq->pend_head, *n; b; b = n) {
        n = b->next;
        b->len = 0;
        verbs_cq_stage(cq, VRPC_WC_RECV, NULL, b, b->priv[0], -ECANCELED, 0, 0);
    }
    cq->pend_head = NULL;
    pthread_mutex_unlock(&cq->lock);
}

void verbs_cq_destroy(struct vrpc_cq *base)
{
    struct vcq *cq = container_of(base, struct vcq, base);
    struct vtp *tp = cq->tp;
    pthread_mutex_lock(&tp->lock);
    for (struct vcq **pp = &tp->cqs; *pp; pp = &(*pp)->next)
        if (*pp == cq) {
            *pp = cq->next;
            break;
        }
    pthread_mutex_unlock(&tp->lock);
    if (cq->unacked)
        ibv_ack_cq_events(cq->cq, cq->unacked);
    if (cq->srq)
        ibv_destroy_srq(cq->srq);
    if (cq->cq)
        ibv_destroy_cq(cq->cq);
    if (cq->chan)
        ibv_destroy_comp_channel(cq->chan);
    if (cq->evfd >= 0)
        close(cq->evfd);
    free(cq->map);
    free(cq->stage);
    pthread_mutex_destroy(&cq->lock);
    free(cq);
}

int verbs_cq_create(struct vrpc_transport *tbase, const struct vrpc_cq_attr *attr, struct vrpc_cq **out)
{
    struct vtp *tp = container_of(tbase, struct vtp, base);
    struct vcq *cq = calloc(1, sizeof(*cq));
    int rc = 0;
    if (!cq)
        return -ENOMEM;
    cq->tp = tp;
    /* a credit-only message consumes a receive: one kept per connection */
    vrpc_credit_pool_init(&cq->cr, MIN_RESV, CTL_RESV);
    cq->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    cq->max_recv = attr->max_recv;
    cq->map_mask = 8191;
    cq->map = calloc(cq->map_mask + 1, sizeof(*cq->map));
    cq->st_cap = 1024;
    cq->stage = calloc(cq->st_cap, sizeof(*cq->stage));
    pthread_mutex_init(&cq->lock, NULL);
    if (cq->evfd < 0 || !cq->map || !cq->stage) {
        verbs_cq_destroy(&cq->base);
        return -ENOMEM;
    }
    pthread_mutex_lock(&tp->lock);
    cq->next = tp->cqs;
    tp->cqs = cq;
    pthread_mutex_unlock(&tp->lock);
    if (tp->verbs) {
        pthread_mutex_lock(&tp->lock);
        rc = verbs_cq_bind(tp, cq);
        pthread_mutex_unlock(&tp->lock);
    }
    if (rc) {
        verbs_cq_destroy(&cq->base);
        return rc;
    }
    *out = &cq->base;
    return 0;
}

int verbs_cq_post_recv(struct vrpc_cq *base, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n)
{
    struct vcq *cq = container_of(base, struct vcq, base);
    struct vrpc_buf *list = NULL;
    int rc = 0;
    if (atomic_load(&cq->cr.posted) + (int)n > (int)cq->max_recv)
        return -ENOSPC;
    for (unsigned i = n; i-- > 0;) {
        bufs[i]->priv[0] = wr_ids ? wr_ids[i] : 0;
        bufs[i]->next = list;
        list = bufs[i];
    }
    pthread_mutex_lock(&cq->lock);
    if (atomic_load(&cq->bound)) {
        rc = post_srq(cq, list);
    } else {
        struct vrpc_buf *last = list;
        while (last->next)
            last = last->next;
        last->next = cq->pend_head;
        cq->pend_head = list;
    }
    pthread_mutex_unlock(&cq->lock);
    if (rc)
        return rc;
    atomic_fetch_add(&cq->cr.posted, (int)n);
    atomic_fetch_add(&cq->cr.avail, (int)n);
    /* the poller pays debts back; before the device is bound no endpoint
	 * can owe any, and its own callback needs no wake-up */
    if (atomic_load(&cq->bound) && tl_poller_of != cq && (cq->cr.hungry_head || atomic_load(&cq->sleeping)))
        verbs_wake(cq->evfd);
    return 0;
}
