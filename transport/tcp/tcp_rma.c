/* The TCP backend's grants and reads: the transport's grant table (key =
 * index << 8 | generation, valid on one endpoint, range-checked), the reader
 * side of vrpc_ep_read and the owner side that streams READ_RESP chunks with
 * sendmsg straight from granted memory (design: tcp.h, top). */
#define _GNU_SOURCE
#include "transport/tcp/tcp.h"

#define READ_CHUNK_DEFAULT (256u << 10) /* bytes per READ_RESP frame */
#define PUMP_CHUNKS 16                  /* chunks one EPOLLOUT event streams at most */

static void grant_unref(struct tcp_ep *ep, struct vrpc_grant *g);

/* iovecs for bytes [off, off + len) of g's window (within it): one per
 * segment touched, at most VRPC_GRANT_SEGS_MAX. The caller holds a
 * reference on g, so its segments stay as granted. */
static size_t grant_iov(const struct vrpc_grant *g, uint32_t off, uint32_t len, struct iovec *iov)
{
    return vrpc_tcp_segs_iov(g->segs, g->nsegs, off, len, iov);
}

/* A job ends (last chunk written, or dropped): its grant reference goes. */
static void job_end_locked(struct tcp_ep *ep, struct tcp_rjob *j)
{
    grant_unref(ep, j->g);
    j->g = NULL;
    j->next = ep->jfree;
    ep->jfree = j;
    ep->njobs--;
}

/* Write the rest of the chunk being streamed, straight from the granted
 * memory. true: the chunk is out (its job moved to the back of the
 * round-robin, or ended); false: the socket is full (EPOLLOUT armed) or
 * failed. */
bool vrpc_tcp_rma_tx_chunk_locked(struct tcp_ep *ep)
{
    struct tcp_rjob *j = ep->cur;
    while (ep->cur_off < HDR_LEN + ep->cur_len) {
        struct iovec iov[1 + VRPC_GRANT_SEGS_MAX];
        struct msghdr msg = {.msg_iov = iov};
        ssize_t w;
        if (ep->cur_off < HDR_LEN) {
            iov[0].iov_base = ep->cur_hdr + ep->cur_off;
            iov[0].iov_len = HDR_LEN - ep->cur_off;
            msg.msg_iovlen = 1 + grant_iov(j->g, j->off, ep->cur_len, iov + 1);
        } else {
            uint32_t done = ep->cur_off - HDR_LEN;
            msg.msg_iovlen = grant_iov(j->g, j->off + done, ep->cur_len - done, iov);
        }
        w = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                tcp_ep_set_pollout_locked(ep, true);
            else
                ep->werr = true;
            return false;
        }
        ep->cur_off += (uint32_t)w;
        ep->chunk_bytes += (uint64_t)w;
    }
    ep->cur = NULL;
    j->off += ep->cur_len;
    j->left -= ep->cur_len;
    if (!j->left) {
        job_end_locked(ep, j);
    } else {
        j->next = NULL;
        if (ep->jtail)
            ep->jtail->next = j;
        else
            ep->jhead = j;
        ep->jtail = j;
    }
    return true;
}

/* ---- grants (the core's table, transport/grant.h; its lock after an endpoint lock) ---- */

/* The table's complete hook (its lock held): hand the REVOKE completion to
 * the endpoint's poller. */
void vrpc_tcp_rma_grant_complete(struct vrpc_grant *g, int status)
{
    struct tcp_ep *ep = container_of(g->ep, struct tcp_ep, gr);
    g->cpl.len = 0;
    g->cpl.priv[P_WRID] = g->wr_id;
    tcp_cq_stage_fill(&g->cpl, VRPC_WC_REVOKE, status, ep, 0);
    tcp_mpsc_push(&ep->cq->done, &g->cpl, &g->cpl);
    tcp_cq_wake(ep->cq);
}

static void grant_unref(struct tcp_ep *ep, struct vrpc_grant *g) { vrpc_grant_unref(&tcp_tp_of(ep)->grants, g); }

/* A grant of the window segs[0..n) (len bytes in all; checked by the core). */
static int grant_new(struct tcp_ep *ep, const struct vrpc_seg *segs, unsigned n, uint32_t len, uint32_t *rkey)
{
    struct tcp_tp *t = tcp_tp_of(ep);
    int rc;

    pthread_mutex_lock(&t->grants.mu);
    /* under the table lock: a teardown marking this endpoint's grants dead
     * either comes after (and sees this one) or made us see S_DEAD here */
    if (atomic_load(&ep->state) != S_OPEN)
        rc = -ENOTCONN;
    else
        rc = vrpc_grant_new_locked(&t->grants, &ep->gr, segs, n, len, rkey);
    pthread_mutex_unlock(&t->grants.mu);
    return rc;
}

int vrpc_tcp_rma_grant(struct vrpc_ep *base, struct vrpc_mr *mr, const void *addr, uint32_t len, uint32_t *rkey)
{
    struct vrpc_seg seg = {.addr = addr, .len = len};
    if (mr->tp != base->tp)
        return -EINVAL;
    return grant_new(container_of(base, struct tcp_ep, base), &seg, 1, len, rkey);
}

int vrpc_tcp_rma_grant_segs(struct vrpc_ep *base, const struct vrpc_seg *segs, unsigned n, uint32_t len, uint32_t *rkey)
{
    return grant_new(container_of(base, struct tcp_ep, base), segs, n, len, rkey);
}

int vrpc_tcp_rma_revoke(struct vrpc_ep *base, uint32_t rkey, uint64_t wr_id)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    struct tcp_tp *t = tcp_tp_of(ep);
    int rc;

    pthread_mutex_lock(&t->grants.mu);
    /* under the table lock: teardown marks the endpoint dead before it takes
     * the lock to free its grants, so a revoke that sees it alive completes
     * before the DISCONNECTED, and one that comes later finds every key dead */
    if (atomic_load(&ep->state) == S_DEAD)
        rc = -ENOTCONN;
    else
        rc = vrpc_grant_revoke_locked(&t->grants, &ep->gr, rkey, wr_id);
    pthread_mutex_unlock(&t->grants.mu);
    return rc;
}

/* Poller, at teardown (state already S_DEAD): the endpoint's grants die and
 * are freed (the user revokes nothing after DISCONNECTED: -ENOTCONN); a
 * revoke waiting for a job completes -ECANCELED when the job is dropped,
 * before the DISCONNECTED. */
void vrpc_tcp_rma_grants_ep_dead(struct tcp_ep *ep) { vrpc_grant_ep_dead(&tcp_tp_of(ep)->grants, &ep->gr); }

/* Owner, poller: validate a READ_REQ (section 7 of the design) and take a
 * reference on its grant. 0, or -EPROTO with *why set. */
static int grant_ref(struct tcp_ep *ep, uint64_t raddr, uint32_t key, uint32_t length, struct vrpc_grant **out)
{
    const char *why = vrpc_grant_ref(&tcp_tp_of(ep)->grants, &ep->gr, raddr, key, length, out);
    if (why)
        snprintf(ep->why, sizeof ep->why, "bad read request (%s: key %#x, addr %#llx, length %u)", why, key,
                 (unsigned long long)raddr, length);
    return why ? -EPROTO : 0;
}

/* ---- reads: reader side ------------------------------------------------------- */

int vrpc_tcp_rma_read(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr,
                      uint32_t rkey, uint64_t wr_id)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    struct vrpc_tcp_read_req r = {.raddr = htole64(raddr), .rkey = htole32(rkey), .length = htole32(len)};
    struct tcp_rslot *s = NULL;
    unsigned i;
    bool idle;

    pthread_mutex_lock(&ep->lock);
    if (atomic_load(&ep->state) != S_OPEN) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    if (!ep->rslots) {
        unsigned n = base->tp->attr.read_window * 2;
        if (n > VRPC_TCP_MAX_READS)
            n = VRPC_TCP_MAX_READS;
        ep->rslots = calloc(n, sizeof *ep->rslots);
        if (!ep->rslots) {
            pthread_mutex_unlock(&ep->lock);
            return -ENOMEM;
        }
        ep->nrslots = n;
        for (i = 0; i < n; i++) {
            ep->rslots[i].req.data = ep->rslots[i].req_space + HDR_LEN;
            ep->rslots[i].req.priv[P_IMM] = READ_REQ_MARK;
            atomic_init(&ep->rslots[i].used, false);
        }
    }
    for (i = 0; i < ep->nrslots && !s; i++)
        if (!atomic_load(&ep->rslots[i].used))
            s = &ep->rslots[i];
    if (!s) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOSPC;
    }
    s->gen++;
    s->buf = buf;
    s->wr_id = wr_id;
    s->off = off;
    s->len = len;
    s->done = 0;
    s->finished = false;
    atomic_store(&s->used, true);
    atomic_store(&ep->read_ns, vrpc_tp_now_ns()); /* before nreads: the timeout scan sees both */
    atomic_fetch_add(&ep->nreads, 1);
    memcpy(s->req_space + HDR_LEN, &r, sizeof r);
    tcp_msg_build_hdr(s->req_space, F_READ_REQ, sizeof r, (uint32_t)s->gen << 16 | (uint32_t)(s - ep->rslots),
                      vrpc_credit_take_ret(&ep->cr));
    s->req.len = sizeof r;
    s->queued = true;
    idle = !ep->wq.head;
    tcp_fifo_push(&ep->wq, &s->req);
    if (idle)
        vrpc_tcp_msg_tx_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    return 0;
}

/* Poller: the read of slot s is over; its completion goes out with status. */
void vrpc_tcp_rma_complete_read(struct tcp_cq *cq, struct tcp_ep *ep, struct tcp_rslot *s, int status)
{
    s->cpl.len = status ? 0 : s->len;
    s->cpl.priv[P_WRID] = s->wr_id;
    tcp_cq_stage_fill(&s->cpl, VRPC_WC_READ, status, ep, 0);
    s->cpl.priv[P_IMM] = (uint64_t)(uintptr_t)s->buf; /* wc.buf; imm stays 0 */
    tcp_fifo_push(&cq->out, &s->cpl);
    atomic_fetch_sub(&ep->nreads, 1);
}

/* Poller: every read not yet finished completes -ECANCELED (teardown). */
void vrpc_tcp_rma_flush_reads(struct tcp_cq *cq, struct tcp_ep *ep)
{
    unsigned i;
    pthread_mutex_lock(&ep->lock);
    for (i = 0; i < ep->nrslots; i++) {
        struct tcp_rslot *s = &ep->rslots[i];
        if (atomic_load(&s->used) && !s->finished) {
            s->finished = true;
            vrpc_tcp_rma_complete_read(cq, ep, s, -ECANCELED);
        }
    }
    pthread_mutex_unlock(&ep->lock);
}

/* ---- reads: owner side ----------------------------------------------------------- */

/* Queue the one READ_ERR of this endpoint (it fails right after). */
static void queue_read_err_locked(struct tcp_ep *ep, uint32_t tag)
{
    if (ep->err_queued || ep->shut_wr || ep->fd < 0)
        return;
    ep->err_queued = true;
    tcp_msg_build_hdr(ep->err_space, F_READ_ERR, 0, tag, 0);
    ep->errf.len = 0;
    tcp_fifo_push(&ep->wq, &ep->errf);
}

/* Drop every read job (teardown); their grants' pending revokes complete. */
void vrpc_tcp_rma_drop_jobs_locked(struct tcp_ep *ep)
{
    struct tcp_rjob *j;
    if (ep->cur) {
        job_end_locked(ep, ep->cur);
        ep->cur = NULL;
    }
    while ((j = ep->jhead)) {
        ep->jhead = j->next;
        job_end_locked(ep, j);
    }
    ep->jtail = NULL;
}

/* Poller, on EPOLLOUT: write what is pending, then stream up to PUMP_CHUNKS
 * new chunks, one per job in turn, each after the endpoint's queued small
 * frames. A job whose grant was revoked meanwhile stops: READ_ERR, and the
 * connection fails (the peer's read can never complete). */
void vrpc_tcp_rma_pump(struct tcp_cq *cq, struct tcp_ep *ep)
{
    struct tcp_tp *t = tcp_tp_of(ep);
    uint32_t chunk = ep->base.tp->attr.read_chunk ? ep->base.tp->attr.read_chunk : READ_CHUNK_DEFAULT;
    unsigned budget = PUMP_CHUNKS;
    bool fail = false;
    uint64_t moved;

    pthread_mutex_lock(&ep->lock);
    moved = ep->chunk_bytes;
    ep->pumping = true;
    for (;;) {
        struct tcp_rjob *j;
        bool live;
        vrpc_tcp_msg_tx_locked(ep);
        if (fail || ep->cur || ep->wq.head || !ep->jhead || ep->werr || ep->fd < 0 || !budget--)
            break;
        j = ep->jhead;
        ep->jhead = j->next;
        if (!ep->jhead)
            ep->jtail = NULL;
        live = vrpc_grant_live(&t->grants, j->g);
        if (!live) {
            queue_read_err_locked(ep, j->tag);
            job_end_locked(ep, j);
            snprintf(ep->why, sizeof ep->why, "a grant was revoked while the peer was reading it");
            fail = true;
            continue;
        }
        ep->cur = j;
        ep->cur_len = j->left < chunk ? j->left : chunk;
        ep->cur_off = 0;
        tcp_msg_build_hdr(ep->cur_hdr, F_READ_RESP, ep->cur_len, j->tag, vrpc_credit_take_ret(&ep->cr));
    }
    ep->pumping = false;
    /* Stopped with chunks left (budget spent; a full socket armed EPOLLOUT
     * already): EPOLLOUT brings the poller back. A socket that took every
     * chunk never had it armed: no epoll_ctl pair per read. */
    if (!fail && ep->jhead && !ep->cur && !ep->wq.head && !ep->werr && ep->fd >= 0)
        tcp_ep_set_pollout_locked(ep, true);
    moved = ep->chunk_bytes - moved;
    pthread_mutex_unlock(&ep->lock);
    if (moved)
        cq->flow_ns = vrpc_tp_now_ns();
    if (fail)
        vrpc_tcp_ep_teardown(cq, ep, -EPROTO, ep->why);
}

/* Poller: a complete READ_REQ body is in ep->rreq. Valid: a job is queued and
 * EPOLLOUT armed (pump streams it). Else READ_ERR and -EPROTO. */
int vrpc_tcp_rma_handle_read_req(struct tcp_ep *ep, const char **why)
{
    uint64_t raddr = le64toh(ep->rreq.r.raddr);
    uint32_t key = le32toh(ep->rreq.r.rkey), length = le32toh(ep->rreq.r.length), tag = ep->rimm, i;
    struct vrpc_grant *g = NULL;
    struct tcp_rjob *j;
    int rc = grant_ref(ep, raddr, key, length, &g);

    pthread_mutex_lock(&ep->lock);
    if (!rc && ep->shut_wr) {
        snprintf(ep->why, sizeof ep->why, "read request after our side finished its close");
        rc = -EPROTO;
    }
    if (!rc && ep->njobs >= VRPC_TCP_MAX_READS) {
        snprintf(ep->why, sizeof ep->why, "more than %u read requests outstanding", VRPC_TCP_MAX_READS);
        rc = -EPROTO;
    }
    if (!rc && !ep->jobs) {
        ep->jobs = calloc(VRPC_TCP_MAX_READS, sizeof *ep->jobs);
        if (!ep->jobs) {
            snprintf(ep->why, sizeof ep->why, "no memory for read jobs");
            rc = -ENOMEM;
        } else {
            for (i = 0; i < VRPC_TCP_MAX_READS; i++) {
                ep->jobs[i].next = ep->jfree;
                ep->jfree = &ep->jobs[i];
            }
        }
    }
    if (rc) {
        queue_read_err_locked(ep, tag);
        vrpc_tcp_msg_tx_locked(ep);
        pthread_mutex_unlock(&ep->lock);
        if (g)
            grant_unref(ep, g);
        *why = ep->why;
        return rc;
    }
    j = ep->jfree;
    ep->jfree = j->next;
    j->g = g;
    j->off = (uint32_t)(raddr - (uint64_t)(uintptr_t)g->addr);
    j->left = length;
    j->tag = tag;
    j->next = NULL;
    if (ep->jtail)
        ep->jtail->next = j;
    else
        ep->jhead = j;
    ep->jtail = j;
    ep->njobs++;
    pthread_mutex_unlock(&ep->lock);
    /* streamed once this pass's events are handled (pump_pending), not
     * from inside the receive path, which must not see a teardown */
    if (!ep->pump_queued) {
        ep->pump_queued = true;
        ep->pnext = ep->cq->pumpq;
        ep->cq->pumpq = ep;
    }
    return 0;
}

/* Reader: a READ_RESP or READ_ERR header for tag. RESP: the body goes
 * straight into the read's buffer. ERR: that read completes -EACCES and the
 * connection fails (the peer closes it too). */
int vrpc_tcp_rma_handle_read_hdr(struct tcp_cq *cq, struct tcp_ep *ep, uint8_t type, uint32_t len, uint32_t tag,
                                 const char **why)
{
    uint32_t idx = tag & 0xffffu;
    struct tcp_rslot *r = NULL;
    char *dst = NULL;
    bool ok;

    pthread_mutex_lock(&ep->lock);
    if (idx < ep->nrslots)
        r = &ep->rslots[idx];
    /* (an answer before its request is out is a peer guessing tags) */
    ok = r && atomic_load(&r->used) && !r->finished && !r->queued && r->gen == (uint16_t)(tag >> 16);
    if (ok && type == F_READ_RESP) {
        ok = len >= 1 && len <= r->len - r->done;
        dst = (char *)r->buf->data + r->off + r->done;
    } else if (ok) {
        ok = len == 0;
        if (ok)
            r->finished = true;
    }
    pthread_mutex_unlock(&ep->lock);
    if (!ok) {
        *why = type == F_READ_RESP ? "read response for no outstanding read, or beyond its length"
                                   : "read error for no outstanding read";
        return -EPROTO;
    }
    if (type == F_READ_ERR) {
        vrpc_tcp_rma_complete_read(cq, ep, r, -EACCES);
        *why = "the peer refused a read (bad or revoked key, or range)";
        return -EACCES;
    }
    ep->rkind = K_RRESP;
    ep->rslot = r;
    ep->rdst = dst;
    ep->rgot = 0;
    ep->rlen = len;
    ep->rimm = tag;
    return 0;
}
