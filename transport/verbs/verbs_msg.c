/* Messages: vrpc_ep_send and the credit-only messages (the credit core's
 * hook). Posting itself (inline data, selective signalling, the header
 * with the credits) is inlined from verbs.h, since the poller posts too. */
#include "transport/verbs/verbs.h"

/* vrpc_credit_distribute's hook: a credit-only message for e's endpoint. */
void verbs_msg_credit_send(struct vrpc_credit_ep *e)
{
    struct vep *ep = container_of(e, struct vep, cr);
    pthread_mutex_lock(&ep->lock);
    ep->pending_ctl_min = 1;
    verbs_msg_send_credit_locked(ep);
    pthread_mutex_unlock(&ep->lock);
}

/* A credit-only message, on the last credit if need be. */
void verbs_msg_send_credit_locked(struct vep *ep)
{
    if ((ep->state != S_OPEN && ep->state != S_CLOSING) || !atomic_load(&ep->cr.credit_ret))
        return;
    verbs_msg_pump_locked(ep); /* queued data carries the credits if it can go */
    if (!atomic_load(&ep->cr.credit_ret) || ep->ctl_sent - ep->peer_ctl_seen >= CTL_RESV ||
        verbs_msg_ring_used(ep) >= ep->ring_mask)
        return;
    if (verbs_msg_post_locked(ep, NULL, 0, 0, 0, false))
        vrpc_tp_log("verbs: cannot send a credit update");
    else
        ep->pending_ctl_min = 0;
}

/* Queue one accepted message that waits for a credit or a ring slot (lock
 * held; the caller checked nwait < max_queued). */
static void wait_enqueue_locked(struct vep *ep, struct vrpc_buf *buf, uint32_t imm, uint64_t wr_id)
{
    buf->priv[0] = wr_id;
    buf->priv[1] = imm;
    buf->next = NULL;
    if (ep->wq_tail)
        ep->wq_tail->next = buf;
    else
        ep->wq_head = buf;
    ep->wq_tail = buf;
    ep->nwait++;
}

int verbs_msg_send(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id,
                   unsigned flags)
{
    struct vep *ep = container_of(base, struct vep, base);
    int rc = 0;
    (void)flags;
    buf->len = len;
    pthread_mutex_lock(&ep->lock);
    if (ep->state != S_OPEN) {
        rc = -ENOTCONN;
    } else if (!ep->wq_head && verbs_msg_can_post(ep)) {
        rc = verbs_msg_post_locked(ep, buf, len, imm, wr_id, false);
    } else if (ep->nwait >= ep->max_queued) {
        rc = -EAGAIN;
    } else {
        wait_enqueue_locked(ep, buf, imm, wr_id);
        if (!atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
            verbs_msg_wait_clock_locked(ep, false);
        vrpc_tp_note_credit_wait(base);
    }
    TRACE("verbs: send qpn %u len %u state %d credits %u nwait %u rc %d", ep->qpn, len, ep->state, ep->credits,
          ep->nwait, rc);
    pthread_mutex_unlock(&ep->lock);
    return rc;
}

/* vrpc_ep_send_list: what credits and ring slots allow goes as chains of
 * work requests, one ibv_post_send each (doorbell batching); the rest waits
 * for credits as single sends do, in order. */
int verbs_msg_send_list(struct vrpc_ep *base, const struct vrpc_send_wr *wrs, unsigned n, unsigned *sent)
{
    struct vep *ep = container_of(base, struct vep, base);
    unsigned i = 0, queued = 0;
    int rc = 0;
    for (unsigned j = 0; j < n; j++)
        wrs[j].buf->len = wrs[j].len;
    pthread_mutex_lock(&ep->lock);
    if (ep->state != S_OPEN) {
        rc = -ENOTCONN;
    } else {
        while (i < n && !ep->wq_head) {
            unsigned k = verbs_msg_room(ep, n - i < VERBS_POST_LIST_MAX ? n - i : VERBS_POST_LIST_MAX), posted;
            if (!k)
                break;
            bool more = i + k < n && ep->credits > k && verbs_msg_ring_used(ep) + k < ep->ring_mask;
            rc = verbs_msg_post_list_locked(ep, wrs + i, k, more, &posted);
            i += posted;
            if (rc)
                break;
        }
        for (; !rc && i < n; i++, queued++) {
            if (ep->nwait >= ep->max_queued) {
                rc = -EAGAIN;
                break;
            }
            wait_enqueue_locked(ep, wrs[i].buf, wrs[i].imm, wrs[i].wr_id);
            vrpc_tp_note_credit_wait(base); /* counted per message, as single sends are */
        }
        if (queued && !atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
            verbs_msg_wait_clock_locked(ep, false);
    }
    TRACE("verbs: send list qpn %u n %u accepted %u queued %u credits %u rc %d", ep->qpn, n, i, queued, ep->credits,
          rc);
    pthread_mutex_unlock(&ep->lock);
    *sent = i;
    return rc;
}
