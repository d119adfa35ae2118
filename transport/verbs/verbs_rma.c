/* RDMA READ (vrpc_ep_read): a read split into chunks posted round-robin
 * within the endpoint's window, the adaptive chunk size, completions, the
 * flush of a dead endpoint's reads and the read watchdog. */
#include "transport/verbs/verbs.h"

static void rq_push(struct vep *ep, struct rjob *j)
{
    j->next = NULL;
    j->queued = true;
    if (ep->rq_tail)
        ep->rq_tail->next = j;
    else
        ep->rq_head = j;
    ep->rq_tail = j;
}

static struct rjob *rq_pop(struct vep *ep)
{
    struct rjob *j = ep->rq_head;
    if (j) {
        ep->rq_head = j->next;
        if (!ep->rq_head)
            ep->rq_tail = NULL;
        j->queued = false;
    }
    return j;
}

/* Rare (a failed job): a scan of the queue. */
static void rq_remove(struct vep *ep, struct rjob *j)
{
    struct rjob *prev = NULL;
    for (struct rjob *x = ep->rq_head; x; prev = x, x = x->next)
        if (x == j) {
            if (prev)
                prev->next = j->next;
            else
                ep->rq_head = j->next;
            if (ep->rq_tail == j)
                ep->rq_tail = prev;
            j->queued = false;
            return;
        }
}

/* A READ that never completes and never fails (e.g. a peer that left its
 * QP in error, as rxe does when a window is invalidated while a READ
 * response is being sent) would hold the read forever: the next completion
 * of a busy read window is due within the idle timeout (ep->lock). */
static void rd_deadline_update(struct vep *ep)
{
    uint64_t old = atomic_load(&ep->rd_deadline), d = 0;
    if (ep->rd_inflight)
        d = vrpc_tp_now_ns() + (uint64_t)ep->tp->base.attr.idle_timeout_ms * 1000000ull;
    atomic_store(&ep->rd_deadline, d);
    if (!old && d)
        atomic_fetch_add(&ep->cq->reading, 1);
    else if (old && !d)
        atomic_fetch_sub(&ep->cq->reading, 1);
}

/* The chunk for the next READs (see READ_CHUNK_BULK; ep->lock). A message
 * is taken for a small one once it has stayed unmatched from one call to a
 * call SMALL_AGE_NS later; calls come with every read started and every
 * chunk completed, so while reading at most a chunk's time later. */
static uint32_t read_chunk_locked(struct vep *ep)
{
    const struct vtp *tp = ep->tp;
    uint64_t now;
    if (tp->rd_chunk_bulk <= tp->rd_chunk)
        return tp->rd_chunk;
    now = vrpc_tp_now_ns();
    if (!ep->rd_unmatched) {
        ep->rd_unmatched_ns = 0;
    } else if (!ep->rd_unmatched_ns) {
        ep->rd_unmatched_ns = now;
    } else if (now - ep->rd_unmatched_ns >= SMALL_AGE_NS) {
        if (now >= ep->rd_small_until)
            TRACE("verbs: qpn %u reads in small chunks: %d message(s) unmatched for %llu us", ep->qpn, ep->rd_unmatched,
                  (unsigned long long)(now - ep->rd_unmatched_ns) / 1000);
        ep->rd_small_until = now + SMALL_HOLD_NS;
        ep->rd_unmatched = 0;
        ep->rd_unmatched_ns = 0;
    }
    return now < ep->rd_small_until ? tp->rd_chunk : tp->rd_chunk_bulk;
}

/* Posts read chunks while the endpoint's window has room, one chunk per job
 * in turn, so a short read waits behind at most one chunk of a long one.
 * A failed post (the send queue is sized for the window, so it means the QP
 * is broken) gives the job its error and is returned, for the caller to fail
 * the endpoint outside the lock; the job completes when that flushes it. */
static int pump_reads_locked(struct vep *ep)
{
    uint32_t chunk;
    if (ep->state != S_OPEN && ep->state != S_CLOSING)
        return 0;
    if (!ep->rq_head || ep->rd_inflight >= ep->rd_window)
        return 0;
    chunk = read_chunk_locked(ep);
    while (ep->rq_head && ep->rd_inflight < ep->rd_window) {
        struct rjob *j = ep->rq_head;
        struct ibv_send_wr wr, *bad;
        struct ibv_sge sge;
        uint32_t n = j->len - j->posted < chunk ? j->len - j->posted : chunk;
        int rc;
        memset(&wr, 0, sizeof(wr));
        sge.addr = (uintptr_t)(j->laddr + j->posted);
        sge.length = n;
        sge.lkey = j->lkey;
        wr.wr_id = (uintptr_t)j | WRID_READ;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_READ;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = j->raddr + j->posted;
        wr.wr.rdma.rkey = j->rkey;
        rc = verbs_err_pos(ibv_post_send(ep->qp, &wr, &bad));
        if (rc) {
            if (!j->status)
                j->status = rc;
            return rc;
        }
        TRACE("verbs: read post qpn %u len %u inflight %u", ep->qpn, n, ep->rd_inflight + 1);
        rq_pop(ep);
        j->posted += n;
        j->outstanding++;
        if (!ep->rd_inflight++)
            rd_deadline_update(ep);
        if (j->posted < j->len)
            rq_push(ep, j);
    }
    return 0;
}

/* Poller, endpoint dead: jobs not yet fully posted end here (those with
 * chunks in flight end with the last of those, in on_read), revokes of dead
 * windows complete -ECANCELED. */
void verbs_rma_flush_locked(struct vcq *cq, struct vep *ep)
{
    struct rjob *j;
    while ((j = rq_pop(ep))) {
        if (!j->status) {
            j->status = -ECANCELED;
            ep->flushed++; /* a read cut off: see final_status */
        }
        if (!j->outstanding) {
            verbs_cq_stage(cq, VRPC_WC_READ, ep, j->buf, j->wr_id, j->status, 0, 0);
            j->next = ep->rfree;
            ep->rfree = j;
        }
    }
    for (struct vmw *w = ep->grants; w; w = w->next)
        if (w->state == MW_CANCEL) {
            verbs_mw_kill(w);
            verbs_cq_stage(cq, VRPC_WC_REVOKE, ep, NULL, w->wr_id, -ECANCELED, 0, 0);
        }
}

/* A READ chunk completed: the job completes with its last chunk, carrying its
 * first error; the window's freed slot goes to the next job in turn. */
void verbs_rma_on_wc(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
    struct rjob *j = (struct rjob *)(uintptr_t)(wc->wr_id & ~WRID_TAG);
    int st = verbs_wc_status(wc->status), prc;
    bool drained;
    TRACE("verbs: read wc qpn %u status %d", wc->qp_num, wc->status);
    verbs_ep_note_wc(ep, wc->status, st);
    pthread_mutex_lock(&ep->lock);
    j->outstanding--;
    ep->rd_inflight--;
    rd_deadline_update(ep);
    if (st && !j->status)
        j->status = st;
    if (j->status && j->queued)
        rq_remove(ep, j);
    if (!j->queued && !j->outstanding) {
        verbs_cq_stage(cq, VRPC_WC_READ, ep, j->buf, j->wr_id, j->status, j->len, 0);
        j->next = ep->rfree;
        ep->rfree = j;
    }
    prc = pump_reads_locked(ep);
    verbs_ep_close_progress_locked(ep);
    drained = ep->state == S_DEAD && verbs_ep_sq_idle_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    /* a refused READ leaves both QPs in error: the connection is lost */
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR) {
        verbs_cq_log_wc(ep, wc, "RDMA READ");
        verbs_ep_fail(ep, st, "RDMA READ failed on qpn %u: %s", wc->qp_num, ibv_wc_status_str(wc->status));
    } else if (wc->status == IBV_WC_WR_FLUSH_ERR) {
        verbs_cq_fail_flushed(ep, wc, "RDMA READ", true);
        verbs_ep_fail(ep, -ECONNRESET, "queue pair in error"); /* no-op when ep failed first */
    } else if (prc)
        verbs_ep_fail(ep, prc, "cannot post an RDMA READ: %s", strerror(-prc));
    if (drained)
        verbs_ep_todo_add(ep);
}

/* Poller: fails endpoints whose read window made no progress within the
 * idle timeout (-ETIMEDOUT; their reads then flush). At most every 200 ms,
 * and only while some endpoint of the CQ reads. */
void verbs_rma_watchdog_scan(struct vcq *cq)
{
    struct vep *late[16];
    unsigned n = 0;
    uint64_t now;
    now = vrpc_tp_now_ns();
    if (now < cq->rd_scan_ns)
        return;
    cq->rd_scan_ns = now + 200000000ull;
    pthread_mutex_lock(&cq->lock);
    for (uint32_t i = 0; i <= cq->map_mask && n < 16; i++) {
        uint64_t d = cq->map[i] ? atomic_load(&cq->map[i]->rd_deadline) : 0;
        if (d && d < now)
            late[n++] = cq->map[i];
    }
    pthread_mutex_unlock(&cq->lock);
    /* still allocated: only this poller releases them, after DISCONNECTED */
    for (unsigned i = 0; i < n; i++) {
        struct vep *ep = late[i];
        pthread_mutex_lock(&ep->lock);
        for (uint32_t k = 0; k < ep->rd_njobs; k++)
            if (ep->rjobs[k].outstanding && !ep->rjobs[k].status)
                ep->rjobs[k].status = -ETIMEDOUT; /* their flush says why */
        pthread_mutex_unlock(&ep->lock);
        verbs_ep_fail(ep, -ETIMEDOUT, "RDMA READ made no progress for %u ms", ep->tp->base.attr.idle_timeout_ms);
    }
}

int verbs_rma_read(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr,
                   uint32_t rkey, uint64_t wr_id)
{
    struct vep *ep = container_of(base, struct vep, base);
    int rc = 0, prc = 0;
    pthread_mutex_lock(&ep->lock);
    if (ep->state != S_OPEN) {
        rc = -ENOTCONN;
    } else if (!ep->rd_window) {
        rc = -EOPNOTSUPP;
    } else if (!ep->rfree) {
        rc = -ENOSPC;
    } else {
        struct rjob *j = ep->rfree;
        ep->rfree = j->next;
        j->buf = buf;
        j->wr_id = wr_id;
        j->raddr = raddr;
        j->laddr = (char *)buf->data + off;
        j->lkey = buf->mr->lkey;
        j->rkey = rkey;
        j->len = len;
        j->posted = j->outstanding = 0;
        j->status = 0;
        if (ep->rd_unmatched)
            ep->rd_unmatched--; /* the descriptor's message, presumably */
        rq_push(ep, j);
        prc = pump_reads_locked(ep);
    }
    pthread_mutex_unlock(&ep->lock);
    if (rc == -EOPNOTSUPP)
        vrpc_tp_log("verbs: %s allows no RDMA READ from it (it connected with no responder resources)", base->peer_uri);
    if (prc)
        verbs_ep_fail(ep, prc, "cannot post an RDMA READ: %s", strerror(-prc));
    return rc;
}
