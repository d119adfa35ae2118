/* The TCP backend's messages: the frame header on each send, the endpoint's
 * tx queue written with one sendmsg (writev) from the calling thread (a
 * send list's frames all in one), the credit-only frame and the credit
 * core's send hook. */
#define _GNU_SOURCE
#include "transport/tcp/tcp.h"

#define MAX_IOV 64

/* Add b to a chain for the CQ's done list, newest first: the list is a
 * LIFO the poller takes whole and reverses, so a chain pushed newest first
 * comes out oldest first and an endpoint's SEND completions keep the order
 * of its sends (as a verbs send queue's do). */
static void chain_prepend(struct vrpc_buf **first, struct vrpc_buf **last, struct vrpc_buf *b)
{
    b->next = *first;
    *first = b;
    if (!*last)
        *last = b;
}

/* tx_locked's last step, when nothing is left to write: EPOLLOUT stays armed
 * only for read jobs still to stream; a closing endpoint shuts its write side. */
static void tx_drained_locked(struct tcp_ep *ep)
{
    if (ep->jhead) {
        if (!ep->pumping)
            tcp_ep_set_pollout_locked(ep, true); /* the poller streams the next chunks */
    } else {
        tcp_ep_set_pollout_locked(ep, false);
        /* a graceful close ends the stream once every accepted send is
         * out, every read of the peer served and every read of ours
         * answered (the peer stops serving at our FIN) */
        if (atomic_load(&ep->state) == S_CLOSING && !ep->waitq.head && !ep->shut_wr && ep->fd >= 0 &&
            !atomic_load(&ep->nreads)) {
            shutdown(ep->fd, SHUT_WR);
            ep->shut_wr = true;
        }
    }
}

/* Write as much as the socket takes: first the rest of a chunk being
 * streamed (a frame is never cut), then wq. Frames fully written complete
 * (status 0) through the CQ's done list; internal frames just leave. New
 * chunks of read jobs are started only by the poller (pump), so a sender's
 * call never streams more than the rest of one chunk. */
void vrpc_tcp_msg_tx_locked(struct tcp_ep *ep)
{
    struct vrpc_buf *first = NULL, *last = NULL;
    bool blocked = false;
    while (!blocked && !ep->werr && ep->fd >= 0) {
        struct iovec iov[MAX_IOV];
        struct msghdr msg = {.msg_iov = iov};
        struct vrpc_buf *b;
        size_t want = 0, off = ep->wq_off;
        ssize_t w;
        int n = 0;

        if (ep->cur) {
            if (!vrpc_tcp_rma_tx_chunk_locked(ep))
                break;
            continue;
        }
        if (!ep->wq.head)
            break;
        for (b = ep->wq.head; b && n < MAX_IOV; b = b->next, n++) {
            iov[n].iov_base = (char *)b->data - HDR_LEN + off;
            iov[n].iov_len = HDR_LEN + b->len - off;
            want += iov[n].iov_len;
            off = 0;
        }
        msg.msg_iovlen = (size_t)n;
        w = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                tcp_ep_set_pollout_locked(ep, true);
            else
                ep->werr = true; /* the poller sees the socket error and tears down */
            break;
        }
        while (w > 0) {
            size_t rem;
            b = ep->wq.head;
            rem = HDR_LEN + b->len - ep->wq_off;
            if ((size_t)w < rem) {
                ep->wq_off += (uint32_t)w;
                break;
            }
            w -= (ssize_t)rem;
            ep->wq_off = 0;
            tcp_fifo_pop(&ep->wq);
            if (b == &ep->ctrl)
                ep->ctrl_queued = false;
            if ((uint32_t)b->priv[P_OPST] == OP_INTERNAL) {
                if (b->priv[P_IMM] == READ_REQ_MARK)
                    container_of(b, struct tcp_rslot, req)->queued = false;
                continue;
            }
            chain_prepend(&first, &last, b);
        }
        if ((size_t)w < want && ep->wq.head) {
            tcp_ep_set_pollout_locked(ep, true);
            blocked = true;
        }
    }
    if (!ep->wq.head && !ep->cur)
        tx_drained_locked(ep);
    if (first) {
        tcp_mpsc_push(&ep->cq->done, first, last);
        tcp_cq_wake(ep->cq);
    }
}

/* Queue a credit-only frame carrying whatever credit_ret holds. */
static void send_credit_locked(struct tcp_ep *ep)
{
    uint32_t c;
    if (ep->ctrl_queued || ep->fd < 0 || ep->shut_wr)
        return;
    c = vrpc_credit_take_ret(&ep->cr);
    if (!c)
        return;
    tcp_msg_build_hdr(ep->ctrl_space, F_CREDIT, 0, 0, c);
    ep->ctrl.len = 0;
    ep->ctrl_queued = true;
    tcp_fifo_push(&ep->wq, &ep->ctrl);
    if (ep->wq.head == &ep->ctrl)
        vrpc_tcp_msg_tx_locked(ep);
}

/* vrpc_credit_distribute's hook: a credit-only frame for e's endpoint. */
void vrpc_tcp_msg_credit_send(struct vrpc_credit_ep *e)
{
    struct tcp_ep *ep = container_of(e, struct tcp_ep, cr);
    pthread_mutex_lock(&ep->lock);
    send_credit_locked(ep);
    pthread_mutex_unlock(&ep->lock);
}

/* One send of a caller, its fields set (lock held): admitted to the wire
 * queue when a credit is at hand and nothing waits, else queued for
 * credits (rule 5), or -EAGAIN when that queue is full. */
static int send_one_locked(struct tcp_ep *ep, struct vrpc_buf *b)
{
    if (ep->waitq.head || !ep->send_credits) {
        if (ep->nwait >= ep->max_queued)
            return -EAGAIN;
        if (!ep->waitq.head)
            atomic_store_explicit(&ep->wait_ns, vrpc_tp_now_ns(), memory_order_relaxed);
        ep->nwait++;
        vrpc_tp_note_credit_wait(&ep->base);
        tcp_fifo_push(&ep->waitq, b);
        return 0;
    }
    tcp_msg_admit_locked(ep, b);
    return 0;
}

static void send_prepare(struct tcp_ep *ep, struct vrpc_buf *b, uint32_t len, uint32_t imm, uint64_t wr_id)
{
    b->len = len;
    b->priv[P_WRID] = wr_id;
    tcp_cq_stage_fill(b, VRPC_WC_SEND, 0, ep, imm);
}

int vrpc_tcp_msg_send(struct vrpc_ep *base, struct vrpc_buf *b, uint32_t len, uint32_t imm, uint64_t wr_id,
                      unsigned flags)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    (void)flags;
    send_prepare(ep, b, len, imm, wr_id);
    pthread_mutex_lock(&ep->lock);
    if (atomic_load(&ep->state) != S_OPEN) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    /* a non-empty wire queue is being written by the poller (the socket
     * was full): only an idle one is written from here */
    bool idle = !ep->wq.head;
    int rc = send_one_locked(ep, b);
    if (idle && ep->wq.head)
        vrpc_tcp_msg_tx_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    return rc;
}

/* vrpc_ep_send_list: every frame admitted (or queued for credits) under one
 * acquisition of the lock, then one sendmsg for all of them (up to MAX_IOV
 * frames per call) instead of one per frame. */
int vrpc_tcp_msg_send_list(struct vrpc_ep *base, const struct vrpc_send_wr *wrs, unsigned n, unsigned *sent)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    unsigned i;
    int rc = 0;
    for (i = 0; i < n; i++)
        send_prepare(ep, wrs[i].buf, wrs[i].len, wrs[i].imm, wrs[i].wr_id);
    pthread_mutex_lock(&ep->lock);
    if (atomic_load(&ep->state) != S_OPEN) {
        pthread_mutex_unlock(&ep->lock);
        *sent = 0;
        return -ENOTCONN;
    }
    bool idle = !ep->wq.head;
    for (i = 0; i < n; i++)
        if ((rc = send_one_locked(ep, wrs[i].buf)))
            break;
    if (idle && ep->wq.head)
        vrpc_tcp_msg_tx_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    *sent = i;
    return rc;
}

/* Move every queued send to the done list with -ECANCELED (lock held). */
void vrpc_tcp_msg_flush_locked(struct tcp_ep *ep)
{
    struct vrpc_buf *first = NULL, *last = NULL, *b;
    struct tcp_fifo *qs[2] = {&ep->wq, &ep->waitq}; /* admission order */
    int i;
    for (i = 0; i < 2; i++) {
        while ((b = tcp_fifo_pop(qs[i]))) {
            if (b == &ep->ctrl)
                ep->ctrl_queued = false;
            if ((uint32_t)b->priv[P_OPST] == OP_INTERNAL) {
                if (b->priv[P_IMM] == READ_REQ_MARK)
                    container_of(b, struct tcp_rslot, req)->queued = false;
                continue;
            }
            tcp_cq_stage_fill(b, VRPC_WC_SEND, -ECANCELED, ep, 0);
            b->len = 0;
            chain_prepend(&first, &last, b);
        }
    }
    ep->nwait = 0;
    ep->wq_off = 0;
    if (first) {
        tcp_mpsc_push(&ep->cq->done, first, last);
        tcp_cq_wake(ep->cq);
    }
}
