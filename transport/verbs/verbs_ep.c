/* Endpoints: the object and its QP (create, state transitions, the QP
 * number map), failure (once, from any thread), teardown on the CM thread,
 * the DISCONNECTED status (the core's rule), close and abort. */
#include "transport/verbs/verbs.h"

static uint32_t pow2(uint32_t x)
{
    uint32_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

void verbs_ep_todo_add(struct vep *ep)
{
    struct vcq *cq = ep->cq;
    pthread_mutex_lock(&cq->lock);
    if (!ep->in_todo) {
        ep->in_todo = true;
        ep->tnext = cq->todo;
        cq->todo = ep;
    }
    pthread_mutex_unlock(&cq->lock);
    verbs_wake(cq->evfd);
}

/* ep->lock held, ep not dead: mark it dead with status, QP to error. */
static void dead_locked(struct vep *ep, int status)
{
    ep->state = S_DEAD;
    ep->status = status;
    if (ep->qp) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        ibv_modify_qp(ep->qp, &a, IBV_QP_STATE);
    }
    pthread_cond_broadcast(&ep->cond);
}

/* Fails the endpoint once (any thread but the CM thread's teardown): QP to
 * error so posted sends flush; the poller flushes the queued ones. ep->lock
 * held; true when it did (the caller then logs and calls todo_add). */
static bool fail_locked(struct vep *ep, int status, const char *fmt, va_list ap)
{
    if (ep->state == S_DEAD)
        return false;
    vsnprintf(ep->why, sizeof(ep->why), fmt, ap);
    dead_locked(ep, status);
    return true;
}

static void failed(struct vep *ep, int status)
{
    /* accepted ones too: the server's operator hears of half-open peers */
    if (status && status != -ECANCELED && (ep->reported || ep->lst))
        vrpc_tp_log("verbs: connection %s (qpn %u) failed: %s", ep->base.peer_uri, ep->qpn, ep->why);
    verbs_ep_todo_add(ep);
}

/* ep_fail and ep_fail_cm: fails ep once, by_cm recording that the verdict
 * is the CM's; when it did, logs and hands ep to the poller. */
static void ep_fail_va(struct vep *ep, bool by_cm, int status, const char *fmt, va_list ap)
{
    bool did;
    pthread_mutex_lock(&ep->lock);
    did = fail_locked(ep, status, fmt, ap);
    if (did && by_cm)
        ep->by_cm = true;
    pthread_mutex_unlock(&ep->lock);
    if (did)
        failed(ep, status);
}

void verbs_ep_fail(struct vep *ep, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ep_fail_va(ep, false, status, fmt, ap);
    va_end(ap);
}

/* The rdma_cm DISCONNECTED event's verdict (CM thread). It may come before
 * the poller has seen completions that tell more (an RDMA READ refused, our
 * sends never acknowledged): final_status settles it once they are polled. */
void verbs_ep_fail_cm(struct vep *ep, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ep_fail_va(ep, true, status, fmt, ap);
    va_end(ap);
}

/* Fails the endpoint only while it is still in `state` (a deadline that a
 * state change has made moot is ignored). */
void verbs_ep_fail_in(struct vep *ep, enum ep_state state, int status, const char *fmt, ...)
{
    va_list ap;
    bool did = false;
    pthread_mutex_lock(&ep->lock);
    if (ep->state == state) {
        va_start(ap, fmt);
        did = fail_locked(ep, status, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&ep->lock);
    if (did)
        failed(ep, status);
}

static int qp_create(struct vep *ep)
{
    struct vtp *tp = ep->tp;
    static const uint32_t inl[] = {256, 128, 64, 16};
    struct ibv_qp_init_attr ia;
    int err = -EINVAL;
    for (size_t i = 0; i < sizeof(inl) / sizeof(inl[0]); i++) {
        memset(&ia, 0, sizeof(ia));
        ia.send_cq = ep->cq->cq;
        ia.recv_cq = ep->cq->cq;
        ia.srq = ep->cq->srq;
        ia.qp_type = IBV_QPT_RC;
        ia.qp_context = ep; /* names it in asynchronous events */
        /* sends, read chunks and window operations share the send queue */
        ia.cap.max_send_wr = ep->ring_mask + 1 + tp->rd_window + MW_SLOTS;
        ia.cap.max_send_sge = 1;
        ia.cap.max_inline_data = inl[i];
        ep->qp = ibv_create_qp(tp->pd, &ia);
        if (ep->qp)
            break;
        err = verbs_err_errno();
        if (err != -EINVAL)
            break;
    }
    if (!ep->qp) {
        vrpc_tp_log("verbs: ibv_create_qp: %s (credit-only messages need inline data)", strerror(-err));
        return err;
    }
    ep->qpn = ep->qp->qp_num;
    ep->max_inline = ia.cap.max_inline_data;
    ep->rd_window = tp->rd_window;
    pthread_mutex_lock(&ep->cq->lock);
    for (uint32_t i = ep->qpn & ep->cq->map_mask;; i = (i + 1) & ep->cq->map_mask)
        if (!ep->cq->map[i]) {
            ep->cq->map[i] = ep;
            break;
        }
    pthread_mutex_unlock(&ep->cq->lock);
    return 0;
}

static void map_del(struct vcq *cq, struct vep *ep)
{
    uint32_t i = ep->qpn & cq->map_mask, j;
    while (cq->map[i] && cq->map[i] != ep)
        i = (i + 1) & cq->map_mask;
    if (!cq->map[i])
        return;
    cq->map[i] = NULL;
    for (j = (i + 1) & cq->map_mask; cq->map[j]; j = (j + 1) & cq->map_mask) {
        struct vep *e = cq->map[j];
        uint32_t k;
        cq->map[j] = NULL;
        for (k = e->qpn & cq->map_mask; cq->map[k]; k = (k + 1) & cq->map_mask)
            ;
        cq->map[k] = e;
    }
}

int verbs_ep_qp_modify(struct vep *ep, enum ibv_qp_state state)
{
    const struct qp_cfg *cfg = &ep->tp->cfg;
    struct ibv_qp_attr a;
    int mask = 0;
    memset(&a, 0, sizeof(a));
    a.qp_state = state;
    if (rdma_init_qp_attr(ep->id, &a, &mask))
        return verbs_err_errno();
    if (state == IBV_QPS_INIT) {
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
        mask |= IBV_QP_ACCESS_FLAGS;
    } else if (state == IBV_QPS_RTR) {
        if (cfg->gid_index >= 0)
            a.ah_attr.grh.sgid_index = (uint8_t)cfg->gid_index;
    } else if (state == IBV_QPS_RTS) {
        if (cfg->ack_timeout)
            a.timeout = cfg->ack_timeout;
        else if (a.timeout < 14)
            a.timeout = 14;
        a.retry_cnt = cfg->retry_cnt;
        a.rnr_retry = cfg->rnr_retry;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
        TRACE("verbs: qpn %u RTS timeout %u retry %u rd_atomic %u", ep->qpn, a.timeout, a.retry_cnt, a.max_rd_atomic);
    }
    return verbs_err_pos(ibv_modify_qp(ep->qp, &a, mask));
}

struct vep *verbs_ep_new(struct vtp *tp, struct vcq *cq, void *user, uint32_t max_queued)
{
    struct vep *ep = calloc(1, sizeof(*ep));
    uint32_t nj;
    if (!ep)
        return NULL;
    vrpc_ep_base_init(&ep->base, &tp->base, &cq->base, user, 2);
    ep->kind = K_EP;
    ep->tp = tp;
    ep->cq = cq;
    pthread_mutex_init(&ep->lock, NULL);
    pthread_cond_init(&ep->cond, NULL);
    ep->ring_mask = pow2(2 * tp->base.attr.credits + 8) - 1;
    ep->ring = calloc(ep->ring_mask + 1, sizeof(*ep->ring));
    ep->max_queued = max_queued ? max_queued : tp->base.attr.max_queued;
    vrpc_credit_ep_init(&ep->cr, MIN_RESV, tp->base.attr.credits);
    nj = 2 * tp->base.attr.credits < 8 ? 8 : 2 * tp->base.attr.credits;
    ep->rjobs = calloc(nj, sizeof(*ep->rjobs));
    if (!ep->ring || !ep->rjobs) {
        free(ep->ring);
        free(ep->rjobs);
        free(ep);
        return NULL;
    }
    ep->rd_njobs = nj;
    for (uint32_t i = 0; i < nj; i++) {
        ep->rjobs[i].next = ep->rfree;
        ep->rfree = &ep->rjobs[i];
    }
    return ep;
}

void verbs_ep_free(struct vrpc_ep *base)
{
    struct vep *ep = container_of(base, struct vep, base);
    for (struct vmw *w = ep->grants, *n; w; w = n) {
        n = w->next;
        if (w->mw)
            ibv_dealloc_mw(w->mw);
        free(w);
    }
    free(ep->rjobs);
    free(ep->ring);
    pthread_mutex_destroy(&ep->lock);
    pthread_cond_destroy(&ep->cond);
    free(ep);
}

/* CM thread: QP and id go; then the poller reports DISCONNECTED. */
void verbs_ep_teardown(struct vep *ep)
{
    pthread_mutex_lock(&ep->tp->lock);
    verbs_cm_watch_del_locked(ep->tp, ep);
    pthread_mutex_unlock(&ep->tp->lock);
    if (ep->qp) {
        verbs_mw_dealloc_grants(ep);
        pthread_mutex_lock(&ep->cq->lock);
        map_del(ep->cq, ep);
        pthread_mutex_unlock(&ep->cq->lock);
        ibv_destroy_qp(ep->qp);
        ep->qp = NULL;
    }
    if (ep->id) {
        rdma_disconnect(ep->id);
        rdma_destroy_id(ep->id);
        ep->id = NULL;
    }
    ep->torn = true;
    verbs_ep_todo_add(ep);
}

/* Poller, torn endpoint: its DISCONNECTED status. Every completion of ep has
 * been polled by now (it was torn down only once its send queue was idle and
 * a poll then found the CQ empty), so this is where the rdma_cm thread's
 * verdict, which may have raced the completions, is corrected:
 *  - an error completion (a READ refused, retries exceeded) is the cause of
 *    the peer's disconnect, or of the QP error found there: it wins;
 *  - a disconnect that cut off work of ours (a send the peer never
 *    acknowledged, a vrpc_ep_read not finished, a window operation) lost
 *    the connection, it did not close it: -ECONNRESET. Our own close never
 *    does that (its DREQ waits for our send queue to be idle); the peer's
 *    does when it closes while we read its memory or send (a verbs close
 *    cannot wait for either), and so does a peer process that died (the
 *    kernel disconnects its ids like a close). Sends still queued for
 *    credits flush without this: they never left (as on TCP).
 * A local failure (timeouts, protocol errors, CQ destroyed) keeps its own. */
int verbs_ep_final_status(struct vep *ep)
{
    int st = vrpc_tp_disc_status(ep->status, ep->by_cm, ep->wc_err, ep->flushed != 0);
    if (st == ep->status)
        return st;
    if (st == ep->wc_err) {
        snprintf(ep->why, sizeof(ep->why), "%s before the peer disconnected", strerror(-ep->wc_err));
        if (ep->reported)
            vrpc_tp_log("verbs: connection %s (qpn %u) failed: %s", ep->base.peer_uri, ep->qpn, ep->why);
    } else {
        snprintf(ep->why, sizeof(ep->why), "peer disconnected while our operations were in flight");
        if (ep->reported)
            vrpc_tp_log("verbs: connection %s (qpn %u) lost: %s", ep->base.peer_uri, ep->qpn, ep->why);
    }
    return st;
}

int verbs_ep_setup_qp(struct vep *ep, bool passive)
{
    int rc = qp_create(ep);
    if (!rc)
        rc = verbs_ep_qp_modify(ep, IBV_QPS_INIT);
    if (!rc && passive)
        rc = verbs_ep_qp_modify(ep, IBV_QPS_RTR);
    if (!rc && passive)
        rc = verbs_ep_qp_modify(ep, IBV_QPS_RTS);
    return rc;
}

/* CM thread (which alone destroys QPs). */
bool verbs_ep_qp_in_error(struct vep *ep)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    return ep->qp && ibv_query_qp(ep->qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_ERR;
}

int verbs_ep_close(struct vrpc_ep *base)
{
    struct vep *ep = container_of(base, struct vep, base);
    int rc = 0;
    pthread_mutex_lock(&ep->lock);
    if (ep->state == S_OPEN || ep->state == S_ACCEPTING) {
        ep->state = S_CLOSING;
        verbs_ep_close_progress_locked(ep); /* else after the last send's completion */
    } else {
        rc = -ENOTCONN;
    }
    pthread_mutex_unlock(&ep->lock);
    if (!rc)
        verbs_cm_watch_add(ep, verbs_ms_from_now(ep->tp->base.attr.idle_timeout_ms));
    return rc;
}

/* Abortive close: fail now (QP to error, so what was posted flushes; the
 * poller flushes what is queued and tears down, rdma_disconnect without
 * waiting for the peer). Not logged: the caller says why. */
int verbs_ep_abort(struct vrpc_ep *base, int status)
{
    struct vep *ep = container_of(base, struct vep, base);
    bool did = false;
    pthread_mutex_lock(&ep->lock);
    if (ep->state != S_DEAD) {
        snprintf(ep->why, sizeof(ep->why), "aborted by the user");
        dead_locked(ep, status);
        did = true;
    }
    pthread_mutex_unlock(&ep->lock);
    if (!did)
        return -ENOTCONN;
    verbs_ep_todo_add(ep);
    return 0;
}
