/* The client's streams: large MESSAGEs from the server (flag RNDV), read
 * through the rendezvous like a large response (rpc/rndv.h), into a large
 * buffer, then copied into the stream's own memory so the pinned buffer goes
 * back at once, and answered with DONE keyed by the stream's request id. At
 * most one is outstanding per stream (docs/PROTOCOL.md), so the slot's
 * rndv_in record serves it. The read holds the slot (slot_hold) until its
 * completion; the stream's deadline or cancel ends the stream meanwhile as
 * always (the read's bytes are then dropped). The read has the limit of a
 * large response's (vrpc_ch_read_limit, rpc/call_large.c): a server that
 * trickles it fails the stream RESOURCE_EXHAUSTED and loses the connection. */
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include "rpc/status.h"
#include "rpc/stream_internal.h"

static bool large_deliver(struct vrpc_stream *s, const struct vrpc_buf *lb, uint32_t len);

void vrpc_ch_stream_fail_id(struct vrpc_channel *ch, uint64_t id, enum vrpc_code code, const char *why)
{
    pthread_mutex_lock(&ch->slock);
    struct vrpc_stream *s = ch->streams[vrpc_wire_id_slot(id)];
    if (s && s->id == id)
        vrpc_stream_fail(s, code, why);
    pthread_mutex_unlock(&ch->slock);
}

const char *vrpc_ch_stream_large_in(struct vrpc_stream *s, const struct vrpc_wire_hdr *h, const uint8_t *descp)
{
    struct vrpc_channel *ch = s->ch;
    struct vrpc_conn *c = s->c;
    struct vrpc_pending_slot *slot = s->slot;
    struct vrpc_wire_desc d;
    char why[VRPC_STATUS_MSG_MAX];
    struct vrpc_buf *lb;

    if (!c->b.large)
        return "large stream MESSAGE on a connection without large messages";
    if ((uint64_t)VRPC_WIRE_HDR_LEN + h->payload_len <= vrpc_ep_eager_size(c->b.ep))
        return "rendezvous stream MESSAGE for a payload that fits a frame";
    if (h->payload_len > ch->own_max_payload)
        return "large stream MESSAGE above our max_msg_size";
    if (vrpc_wire_desc_decode(descp, h->payload_len, &d))
        return "bad rendezvous descriptor";
    if (slot->in.lb)
        return "a second large stream MESSAGE before our DONE";
    pthread_mutex_lock(&s->mu);
    bool ended = s->ended;
    pthread_mutex_unlock(&s->mu);
    if (ended) { /* the stream is over here: do not read */
        vrpc_ch_send_done(ch, c, h->request_id, VRPC_CANCELLED);
        return NULL;
    }
    if (vrpc_rndv_buf(ch->tp, ch->o.max_pinned, h->payload_len, &lb, why, sizeof(why))) {
        vrpc_ch_send_done(ch, c, h->request_id, VRPC_RESOURCE_EXHAUSTED);
        vrpc_stream_fail(s, VRPC_RESOURCE_EXHAUSTED, why);
        return NULL;
    }
    struct vrpc_rndv_in *in = &slot->in;
    in->lb = lb;
    in->ep = c->b.ep;
    in->addr = d.addr;
    in->rkey = d.rkey;
    in->len = h->payload_len;
    in->id = h->request_id;
    slot_hold(slot); /* the read keeps the slot (its wire side) */
    pthread_mutex_lock(&s->mu);
    s->large_busy = true;
    pthread_mutex_unlock(&s->mu);
    int rc = vrpc_rndv_read(in);
    if (rc == 0 || rc == -ENOSPC) /* (its completion is this poller's, later) */
        vrpc_ch_read_limit(ch, slot, h);
    if (rc == -ENOSPC) {
        vrpc_rndv_read_later(&ch->retry, in);
    } else if (rc) { /* as vrpc_ch_stream_read_done, but ch->slock is ours already */
        in->lb = NULL;
        vrpc_lbuf_put(lb);
        large_deliver(s, NULL, 0);
        vrpc_stream_fail(s, VRPC_UNAVAILABLE, "cannot read a large stream message");
        slot_drop(slot, vrpc_wire_id_gen(h->request_id));
    }
    return NULL;
}

/* The read's bytes (lb NULL: it failed) into stream s (ch->slock held):
 * queued, then what arrived behind it; dropped if the stream ended or
 * finishes. False: no memory. */
static bool large_deliver(struct vrpc_stream *s, const struct vrpc_buf *lb, uint32_t len)
{
    bool ok = true;
    pthread_mutex_lock(&s->mu);
    s->large_busy = false;
    if (s->ended || !lb) {
    } else if (s->draining && s->m->kind != VRPC_METHOD_CLIENT_STREAMING) {
        s->rx_unreported++;
        vrpc_stream_kick_locked(s, true);
    } else {
        struct smsg *n = vrpc_stream_node_locked(s, len);
        if (n) {
            memcpy(n->data, lb->data, len);
            n->len = len;
            s->got_msg = true;
            smq_push(&s->rx, n);
            pthread_cond_broadcast(&s->cond);
        }
        ok = n != NULL;
    }
    struct smsg *h;
    while ((h = smq_pop(&s->rx_hold)))
        smq_push(&s->rx, h);
    rx_signal_locked(s);
    if (s->has_cbs && s->rx.head)
        vrpc_stream_kick_locked(s, true);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void vrpc_ch_stream_read_done(struct vrpc_channel *ch, struct vrpc_pending_slot *slot, int status)
{
    struct vrpc_rndv_in *in = &slot->in;
    struct vrpc_conn *c = vrpc_ep_user(in->ep);
    uint32_t gen = vrpc_wire_id_gen(in->id);
    uint64_t id = in->id;
    if (!vrpc_ch_read_unlimit(ch, slot, gen) && !status)
        status = -ETIMEDOUT; /* over too late: the limit failed the stream */
    struct vrpc_buf *lb = in->lb;
    in->lb = NULL;
    pthread_mutex_lock(&ch->slock);
    struct vrpc_stream *s = ch->streams[slot->index];
    if (s && s->id != id)
        s = NULL;
    if (status == 0) {
        bool ok = !s || large_deliver(s, lb, in->len);
        vrpc_ch_send_done(ch, c, id, ok ? VRPC_OK : VRPC_RESOURCE_EXHAUSTED);
        if (!ok)
            vrpc_stream_fail(s, VRPC_RESOURCE_EXHAUSTED, "out of memory for a large stream message");
    } else if (s) {
        large_deliver(s, NULL, 0);
        vrpc_stream_fail(s, status == -EACCES ? VRPC_INTERNAL : VRPC_UNAVAILABLE,
                         status == -EACCES ? "large-message read failed: remote access error"
                                           : "connection lost while reading a large stream message");
    }
    pthread_mutex_unlock(&ch->slock);
    vrpc_lbuf_put(lb);
    if (status == -EACCES)
        vrpc_ch_protocol_error(c, "its large stream MESSAGE descriptor could not be read (bad key or range)", -EPROTO);
    slot_drop(slot, gen);
}

/* ---- large MESSAGEs to the server ------------------------------------------ */

/* Wait until the previous large MESSAGE's grant is over (DONE, then its
 * REVOKE completion), or the stream ended. 0 or the ended errno. */
static int wait_out_idle(struct vrpc_stream *s)
{
    struct vrpc_rndv_out *o = &s->slot->out;
    pthread_mutex_lock(&s->mu);
    while (!s->ended && __atomic_load_n(&o->state, __ATOMIC_ACQUIRE) != VRPC_RNDV_IDLE) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 1000000; /* the REVOKE completion does not signal us: look again soon */
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&s->cond, &s->mu, &ts);
    }
    int rc = s->ended ? stream_ended_rc(s) : 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Grant o's payload (p_* set) under conn_lock, with the hold timer a
 * request's grant gets; retried while the transport has no grant left. */
static int grant_out(struct vrpc_stream *s, struct vrpc_rndv_out *o)
{
    struct vrpc_channel *ch = s->ch;
    for (;;) {
        pthread_mutex_lock(&ch->conn_lock);
        int rc = vrpc_offer_grant_locked(&s->c->b, o);
        if (rc == 0) {
            slot_hold(s->slot); /* the grant's, dropped at its REVOKE completion */
            vrpc_timer_arm(ch->wheel, &o->hold_timer, vrpc_now_ns() + (int64_t)ch->o.hold_timeout_ms * 1000000,
                           vrpc_offer_hold_fired, &ch->offers, o->p_id);
        }
        pthread_mutex_unlock(&ch->conn_lock);
        if (rc != -ENOSPC)
            return rc;
        pthread_mutex_lock(&s->mu);
        bool ended = s->ended;
        pthread_mutex_unlock(&s->mu);
        if (ended)
            return stream_ended_rc(s);
        sched_yield();
    }
}

int vrpc_stream_write_large(struct vrpc_stream *s, const ProtobufCMessage *msg, const uint8_t *bytes, uint32_t len)
{
    struct vrpc_channel *ch = s->ch;
    struct vrpc_rndv_out *o = &s->slot->out;
    char why[VRPC_STATUS_MSG_MAX];
    struct vrpc_buf *lb;
    int rc = wait_out_idle(s);
    if (rc)
        return rc;
    if (vrpc_rndv_buf(ch->tp, ch->o.max_pinned, len, &lb, why, sizeof(why))) {
        vrpc_stream_fail(s, VRPC_RESOURCE_EXHAUSTED, why);
        return -EPIPE;
    }
    if (msg)
        vrpc_pb_pack_sized(msg, lb->data);
    else
        memcpy(lb->data, bytes, len);
    o->p_lb = lb;
    o->p_nsegs = 0;
    o->p_len = len;
    o->p_id = s->id;
    if ((rc = grant_out(s, o))) {
        vrpc_lbuf_put(lb);
        return rc;
    }
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_MESSAGE,
                              .flags = VRPC_FF_RNDV,
                              .request_id = s->id,
                              .payload_len = len};
    struct vrpc_wire_desc d = {.addr = o->raddr, .rkey = o->rkey};
    uint8_t desc[VRPC_WIRE_DESC_LEN];
    vrpc_wire_desc_encode(desc, &d);
    struct vrpc_buf *b;
    if (!(rc = vrpc_stream_buf(s, true, &b))) {
        vrpc_wire_hdr_encode(b->data, &h);
        memcpy(b->data + VRPC_WIRE_HDR_LEN, desc, sizeof desc);
        rc = vrpc_stream_send_buf(s, b, VRPC_WIRE_HDR_LEN + VRPC_WIRE_DESC_LEN);
    }
    if (rc) { /* the server never got the descriptor: end the grant (as vrpc_ch_request_go) */
        pthread_mutex_lock(&ch->conn_lock);
        if (__atomic_load_n(&o->state, __ATOMIC_ACQUIRE) == VRPC_RNDV_GRANTED && o->id == s->id)
            vrpc_rndv_revoke(o);
        pthread_mutex_unlock(&ch->conn_lock);
    }
    return rc;
}
