/* Large messages the server writes on a stream (docs/PROTOCOL.md, "Large
 * messages in a stream"): packed into a large buffer, offered to the client
 * through the server's offer machine (rpc/offer.h) with the stream's own
 * grant record (struct vrpc_server_stream.out_rec, never one of c->rsp: that
 * is how the machine's callbacks tell them apart), one at a time: the next
 * waits until the client's DONE and our revoke are over. And the time limit
 * of reading a large message the client sends. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include "rpc/server_stream.h"

/* The wheel's thread: the read of a large client message is not over at
 * its limit (vrpc_srv_stream_read_limit). ctx: the call (the timer's
 * reference), gen: the stream's generation. */
static void read_limit_expired(void *ctx, uint64_t gen)
{
    struct vrpc_server_call *call = ctx;
    struct vrpc_server_stream *st = call->st;
    struct sconn *c = st->rd_conn;
    uint32_t want = XFER_READING;
    if (__atomic_compare_exchange_n(&call->xfer, &want, XFER_EXPIRING, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        struct vrpc_server *s = c->s;
        long long ms = (long long)((vrpc_now_ns() - call->xfer_start_ns) / 1000000);
        char msg[VRPC_STATUS_MSG_MAX];
        snprintf(msg, sizeof(msg),
                 "large transfer too slow: the %u-byte stream message was not read in %lld ms (min_transfer_rate "
                 "%u B/s, transfer_floor_ms %u)",
                 call->in.len, ms, s->o.min_transfer_rate, s->o.transfer_floor_ms);
        vrpc_srv_stream_end(st, (uint32_t)gen, VRPC_RESOURCE_EXHAUSTED, msg);
        vrpc_srv_conn_fail(c, "large transfer too slow: a %u-byte stream message in %lld ms", call->in.len, ms);
        /* release: the read's completion may now go on */
        __atomic_store_n(&call->xfer, XFER_EXPIRED, __ATOMIC_RELEASE);
    }
    /* else the read finished first and left the timer's references to us */
    vrpc_srv_sconn_unref(c);
    vrpc_srv_call_unref(call);
}

void vrpc_srv_stream_read_limit(struct sconn *c, struct vrpc_server_call *call, uint32_t len, uint32_t gen)
{
    struct vrpc_server *s = c->s;
    int64_t now = vrpc_now_ns();
    int64_t lim = now + ((int64_t)s->o.transfer_floor_ms + (int64_t)len * 1000 / s->o.min_transfer_rate) * 1000000;
    call->xfer_start_ns = now;
    call->st->rd_conn = c;
    __atomic_store_n(&call->xfer, XFER_READING, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->b.refs, 1, __ATOMIC_RELAXED);  /* the timer's, */
    __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* both */
    vrpc_timer_arm(s->wheel, &call->xfer_timer, lim, read_limit_expired, call, gen);
}

int vrpc_srv_stream_read_unlimit(struct vrpc_server_call *call, int status)
{
    struct sconn *c = call->st->rd_conn;
    uint32_t want = XFER_READING;
    if (__atomic_compare_exchange_n(&call->xfer, &want, XFER_NONE, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        if (vrpc_timer_cancel(c->s->wheel, &call->xfer_timer)) {
            vrpc_srv_sconn_unref(c); /* not the last: c's endpoint delivered this completion */
            vrpc_srv_call_unref(call);
        } /* else the firing timer sees XFER_NONE and lets go */
        return status;
    }
    if (want == XFER_NONE) /* never armed */
        return status;
    /* Too late: the limit ends the stream and fails c. Let it finish
     * deciding (a few non-blocking steps on the wheel's thread) before this
     * completion goes on. */
    while (__atomic_load_n(&call->xfer, __ATOMIC_ACQUIRE) != XFER_EXPIRED)
        sched_yield();
    return status ? status : -ETIMEDOUT;
}

static struct vrpc_server_stream *rec_stream(struct vrpc_rndv_out *o)
{
    return container_of(o, struct vrpc_server_stream, out_rec);
}

bool vrpc_srv_stream_is_offer(const struct sconn *c, const struct vrpc_rndv_out *o)
{
    return !c->rsp || o < c->rsp || o >= c->rsp + c->ncalls;
}

bool vrpc_srv_stream_owns_offer(const struct sconn *c, const struct vrpc_rndv_out *o)
{
    for (uint32_t i = 0; i < c->ncalls; i++) {
        const struct vrpc_server_stream *st = __atomic_load_n(&c->calls[i]->st, __ATOMIC_ACQUIRE);
        if (st && &st->out_rec == o)
            return true;
    }
    return false;
}

/* Wait (lock held) until the previous large message is over: its record
 * idle and not parked. 0, -ECONNRESET, -ETIMEDOUT. */
static int large_turn_locked(struct vrpc_server_stream *st)
{
    struct vrpc_rndv_out *o = &st->out_rec;
    while (__atomic_load_n(&o->state, __ATOMIC_ACQUIRE) != VRPC_RNDV_IDLE ||
           __atomic_load_n(&o->parked, __ATOMIC_ACQUIRE) || st->wr_offering) {
        if (st->ended || vrpc_conn_is_dead(&st->conn->b))
            return -ECONNRESET;
        int64_t dl = st->call->deadline_ns, now = vrpc_now_ns(), to = now + 50000000;
        if (dl != VRPC_NO_DEADLINE && dl <= now)
            return -ETIMEDOUT;
        if (dl != VRPC_NO_DEADLINE && dl < to)
            to = dl;
        struct timespec ts = {.tv_sec = to / 1000000000, .tv_nsec = to % 1000000000};
        pthread_cond_timedwait(&st->cond, &st->lock, &ts);
    }
    return 0;
}

int vrpc_srv_stream_send_large(struct vrpc_server_stream *st, struct vrpc_buf *lb, uint32_t len)
{
    struct sconn *c = st->conn;
    struct vrpc_rndv_out *o = &st->out_rec;
    pthread_mutex_lock(&st->lock);
    int rc = large_turn_locked(st);
    pthread_mutex_unlock(&st->lock);
    struct vrpc_buf *b = NULL;
    if (rc == 0 && (rc = vrpc_srv_stream_wait_room(st)) == 0 && !(b = vrpc_srv_conn_buf(c, true)))
        rc = -ECONNRESET;
    if (rc) {
        vrpc_lbuf_put(lb);
        return rc;
    }
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_MESSAGE,
                              .flags = VRPC_FF_RNDV,
                              .request_id = st->id,
                              .payload_len = len};
    vrpc_wire_hdr_encode(b->data, &h);
    o->p_lb = lb;
    o->p_frame = b;
    o->p_len = len;
    o->p_frame_len = VRPC_WIRE_HDR_LEN + VRPC_WIRE_DESC_LEN;
    o->p_id = st->id;
    o->p_conn = c;
    o->p_nsegs = 0;
    pthread_mutex_lock(&st->lock);
    st->wr_offering = true;
    pthread_mutex_unlock(&st->lock);
    vrpc_offer_start(&c->poller->offers, o, VRPC_SEND_WAIT);
    pthread_mutex_lock(&st->lock);
    while (st->wr_offering) /* parked: the poller offers it again after its completions */
        pthread_cond_wait(&st->cond, &st->lock);
    rc = st->wr_rc;
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int vrpc_srv_stream_offer_done(struct vrpc_rndv_out *o)
{
    struct vrpc_server_stream *st = rec_stream(o);
    struct sconn *c = o->p_conn;
    int rc = o->p_rc;
    if (rc == 0) {
        vrpc_rndv_offer_desc(o);
        /* a failed send leaves the grant to the endpoint's DISCONNECTED */
        rc = vrpc_srv_conn_send(c, o->p_frame, o->p_frame_len) ? -ECONNRESET : 0;
    } else {
        vrpc_lbuf_put(o->p_lb);
        vrpc_pool_put(o->p_frame);
        __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED); /* the frame's quota */
        rc = -ECONNRESET;
    }
    pthread_mutex_lock(&st->lock);
    st->wr_offering = false;
    st->wr_rc = rc;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

void vrpc_srv_stream_offer_revoked(struct vrpc_rndv_out *o)
{
    struct vrpc_server_stream *st = rec_stream(o);
    pthread_mutex_lock(&st->lock);
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
}

bool vrpc_srv_stream_on_done(struct sconn *c, const struct vrpc_wire_hdr *h)
{
    struct vrpc_server_call *call = c->calls[vrpc_wire_id_slot(h->request_id)];
    if (!call->st || !vrpc_offer_granted(&call->st->out_rec, h->request_id))
        return false;
    vrpc_offer_revoke(&c->poller->retry, &call->st->out_rec, "stream message");
    return true;
}

void vrpc_srv_stream_conn_lost(struct sconn *c)
{
    for (uint32_t i = 0; i < c->ncalls; i++) {
        struct vrpc_server_stream *st = c->calls[i]->st;
        if (!st || __atomic_load_n(&st->out_rec.state, __ATOMIC_ACQUIRE) != VRPC_RNDV_GRANTED)
            continue;
        vrpc_timer_cancel(c->s->wheel, &st->out_rec.hold_timer);
        if (vrpc_offer_drop(&c->poller->offers, &st->out_rec, c->b.ep, NULL))
            vrpc_srv_sconn_unref(c); /* the grant's reference */
        pthread_mutex_lock(&st->lock);
        pthread_cond_broadcast(&st->cond);
        pthread_mutex_unlock(&st->lock);
    }
}
