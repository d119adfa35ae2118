/* Large messages, the client's side of the rendezvous: a large request is
 * packed into a large buffer (or a gathered window of the caller's memory,
 * zero-copy) and offered to the server through the offer machine
 * (rpc/offer.h: grant, park, hold timer, DONE, revoke); a large response is
 * read from the server's grant, within a time limit, and acknowledged with
 * DONE. Not on the small-call path. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/stream_internal.h"
#include "rpc/status.h"

/* The caller's memory is no longer granted (any thread; once per call). */
void vrpc_ch_zc_release(struct vrpc_channel *ch, struct vrpc_pending_slot *s, bool on_poller)
{
    if (!__atomic_load_n(&s->out.zc, __ATOMIC_ACQUIRE))
        return;
    uint32_t old = __atomic_exchange_n(&s->out.zc, 0, __ATOMIC_ACQ_REL);
    if (old & ZC_SLEEP)
        vrpc_futex_wake_all(&s->out.zc);
    if (old & ZC_CB)
        vrpc_ch_complete_submit(ch, s, on_poller);
}

/* ---- large messages: the client's side of the rendezvous ------------------ */

/* DONE for a RNDV response. From the poller, never waiting; without a buffer
 * or credit the server would hold its payload until its hold timeout, so the
 * connection is closed instead. */
void vrpc_ch_send_done(struct vrpc_channel *ch, struct vrpc_conn *c, uint64_t id, enum vrpc_code code)
{
    if (__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
        return;
    struct vrpc_wire_hdr h = {
        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_DONE, .request_id = id, .status = (uint32_t)code};
    int rc = vrpc_rpc_send_simple(c->b.ep, ch->send_pool, &h, NULL, 0, false);
    if (rc && rc != -ENOTCONN) {
        vrpc_rpc_log("cannot send DONE for a large response (%s); closing the connection", strerror(-rc));
        vrpc_ch_conn_fail(c, "connection closed: could not acknowledge a large response", true);
        vrpc_ep_close(c->b.ep);
    }
}

/* DONE's status for a response payload given up without reading it, because
 * the call ended first: DEADLINE_EXCEEDED once its deadline has passed (the
 * timer decided it, or would have), else CANCELLED (vrpc_channel_cancel).
 * deadline_ns was set before the request went out. */
static enum vrpc_code gave_up_code(const struct vrpc_pending_slot *s)
{
    return s->deadline_ns != VRPC_NO_DEADLINE && vrpc_now_ns() >= s->deadline_ns ? VRPC_DEADLINE_EXCEEDED
                                                                                 : VRPC_CANCELLED;
}
/* Poller: the REVOKE completion of the call's grant: buffer back, the
 * grant's connection reference and slot hold dropped. */
void vrpc_ch_request_revoked(struct vrpc_channel *ch, struct vrpc_pending_slot *s)
{
    struct vrpc_rndv_out *o = &s->out;
    struct vrpc_conn *c = vrpc_ep_user(o->ep);
    uint32_t gen = vrpc_wire_id_gen(o->id);
    /* under conn_lock: the hold timer takes its own reference only while GRANTED */
    vrpc_offer_revoked(&ch->offers, ch->wheel, o);
    vrpc_ch_zc_release(ch, s, true);
    conn_unref(c);
    slot_drop(s, gen);
}

/* Poller: the read of a response payload finished (or could not start). */
void vrpc_ch_response_read_done(struct vrpc_channel *ch, struct vrpc_rndv_in *in, int status)
{
    struct vrpc_pending_slot *s = container_of(in, struct vrpc_pending_slot, in);
    if (slot_is_stream(s)) { /* a large stream MESSAGE (rpc/stream_large.c) */
        vrpc_ch_stream_read_done(ch, s, status);
        return;
    }
    struct vrpc_conn *c = vrpc_ep_user(in->ep);
    uint32_t gen = vrpc_wire_id_gen(in->id);
    if (!vrpc_ch_read_unlimit(ch, s, gen)) { /* no DONE on an aborted connection */
        vrpc_lbuf_put(in->lb);
        in->lb = NULL;
        slot_drop(s, gen);
        return;
    }
    struct vrpc_buf *lb = in->lb;
    in->lb = NULL;
    if (status == 0) {
        if (vrpc_pending_decide(s, gen)) {
            s->resp_lb = lb;
            s->resp_len = in->len;
            s->st.code = VRPC_OK;
            s->st.flags = 0;
            s->st.message[0] = 0;
            vrpc_ch_send_done(ch, c, in->id, VRPC_OK);
            vrpc_ch_complete(ch, s, gen, true);
        } else { /* cancelled or timed out while the read ran */
            vrpc_lbuf_put(lb);
            vrpc_ch_send_done(ch, c, in->id, gave_up_code(s));
        }
    } else {
        vrpc_lbuf_put(lb);
        if (vrpc_pending_decide(s, gen)) {
            if (status == -EACCES)
                vrpc_status_set(&s->st, VRPC_INTERNAL, "large-message read failed: remote access error");
            else
                vrpc_status_set(&s->st, VRPC_UNAVAILABLE, "connection lost while reading a large response (%s)",
                                strerror(-status));
            vrpc_ch_complete(ch, s, gen, true);
        }
        if (status == -EACCES)
            vrpc_ch_protocol_error(c, "its large-response descriptor could not be read (bad key or range)", -EPROTO);
    }
    slot_drop(s, gen);
}

/* The wheel's thread: a large response's (or stream MESSAGE's) read is not
 * over at its limit (vrpc_ch_read_limit). The call ends RESOURCE_EXHAUSTED
 * (the stream fails so) if nothing ended it before, and the connection is
 * aborted: that ends the read at once, and the buffer comes back at its
 * (flushed) completion. */
static void read_limit_expired(void *ctx, uint64_t id)
{
    struct vrpc_channel *ch = ctx;
    uint32_t idx = vrpc_wire_id_slot(id), gen = vrpc_wire_id_gen(id);
    if (idx >= ch->pend->n)
        return;
    struct vrpc_pending_slot *s = &ch->pend->slots[idx];
    uint64_t want = (uint64_t)gen << 32 | VRPC_RD_READING;
    if (!__atomic_compare_exchange_n(&s->rd_xfer, &want, (uint64_t)gen << 32 | VRPC_RD_EXPIRING, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return; /* the read finished first (or the slot moved on) */
    /* the read's completion waits for EXPIRED: the slot, its endpoint and
     * connection stay as they are until then */
    struct vrpc_conn *c = vrpc_ep_user(s->in.ep);
    long long ms = (long long)((vrpc_now_ns() - s->rd_start_ns) / 1000000);
    uint32_t len = s->in.len;
    bool stream = slot_is_stream(s);
    const char *what = stream ? "stream message" : "response";
    char msg[VRPC_STATUS_MSG_MAX];
    snprintf(msg, sizeof(msg),
             "large transfer too slow: the %u-byte %s was not read in %lld ms (min_transfer_rate %u B/s, "
             "transfer_floor_ms %u)",
             len, what, ms, ch->o.min_transfer_rate, ch->o.transfer_floor_ms);
    if (stream) {
        vrpc_ch_stream_fail_id(ch, id, VRPC_RESOURCE_EXHAUSTED, msg);
    } else if (vrpc_pending_decide(s, gen)) {
        vrpc_status_set(&s->st, VRPC_RESOURCE_EXHAUSTED, "%s", msg);
        vrpc_ch_complete(ch, s, gen, false);
    }
    char peer[VRPC_URI_MAX] = "?";
    vrpc_ep_peer_uri(c->b.ep, peer, sizeof(peer));
    vrpc_rpc_log("server %s: large transfer too slow: %u-byte %s of call %#llx not read in %lld ms; "
                 "aborting the connection",
                 peer, len, what, (unsigned long long)id, ms);
    vrpc_ch_conn_fail(c,
                      stream ? "connection aborted: a large stream message was too slow (min_transfer_rate)"
                             : "connection aborted: a large response was too slow (min_transfer_rate)",
                      false);
    vrpc_ep_abort(c->b.ep, -ECONNABORTED);
    __atomic_store_n(&s->rd_xfer, (uint64_t)gen << 32 | VRPC_RD_EXPIRED, __ATOMIC_RELEASE);
}

void vrpc_ch_read_limit(struct vrpc_channel *ch, struct vrpc_pending_slot *s, const struct vrpc_wire_hdr *h)
{
    s->rd_start_ns = vrpc_now_ns();
    __atomic_store_n(&s->rd_xfer, (uint64_t)vrpc_wire_id_gen(h->request_id) << 32 | VRPC_RD_READING, __ATOMIC_RELEASE);
    vrpc_timer_arm(ch->wheel, &s->rd_timer,
                   s->rd_start_ns +
                       ((int64_t)ch->o.transfer_floor_ms + (int64_t)h->payload_len * 1000 / ch->o.min_transfer_rate) *
                           1000000,
                   read_limit_expired, ch, h->request_id);
}

bool vrpc_ch_read_unlimit(struct vrpc_channel *ch, struct vrpc_pending_slot *s, uint32_t gen)
{
    uint64_t want = (uint64_t)gen << 32 | VRPC_RD_READING;
    if (__atomic_compare_exchange_n(&s->rd_xfer, &want, (uint64_t)gen << 32 | VRPC_RD_NONE, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        vrpc_timer_cancel(ch->wheel, &s->rd_timer); /* if it fires anyway, it finds NONE */
        return true;
    }
    /* Too late: the limit decided and aborted the connection. Let it finish
     * (a few non-blocking steps on the wheel's thread) before this
     * completion lets go of the slot. */
    while (__atomic_load_n(&s->rd_xfer, __ATOMIC_ACQUIRE) != ((uint64_t)gen << 32 | VRPC_RD_EXPIRED))
        sched_yield();
    return false;
}

void vrpc_ch_response_read_failed(struct vrpc_rndv_in *in, int rc, void *arg)
{
    vrpc_ch_response_read_done(arg, in, rc);
}

/* RESPONSE|RNDV: read the payload (unless the call is already over). */
void vrpc_ch_on_large_response(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                               const struct vrpc_wire_hdr *h, const uint8_t *descp)
{
    uint32_t gen = vrpc_wire_id_gen(h->request_id);
    struct vrpc_wire_desc d;
    char why[VRPC_STATUS_MSG_MAX];
    struct vrpc_buf *lb;

    if ((uint64_t)VRPC_WIRE_HDR_LEN + h->payload_len <= vrpc_ep_eager_size(c->b.ep)) {
        vrpc_ch_protocol_error(c, "rendezvous response for a payload that fits a frame", -EPROTO);
        return;
    }
    if (h->payload_len > ch->own_max_payload) {
        vrpc_ch_protocol_error(c, "large response above our max_msg_size", -EPROTO);
        return;
    }
    if (vrpc_wire_desc_decode(descp, h->payload_len, &d)) {
        vrpc_ch_protocol_error(c, "bad rendezvous descriptor", -EPROTO);
        return;
    }
    uint64_t w = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE);
    if ((uint32_t)w & VRPC_PEND_DECIDED) { /* cancelled or timed out: do not read */
        vrpc_ch_send_done(ch, c, h->request_id, gave_up_code(s));
        slot_seen(s, gen);
        return;
    }
    if (vrpc_rndv_buf(ch->tp, ch->o.max_pinned, h->payload_len, &lb, why, sizeof(why))) {
        if (vrpc_pending_decide(s, gen)) {
            vrpc_status_set(&s->st, VRPC_RESOURCE_EXHAUSTED, "%s", why);
            vrpc_ch_complete(ch, s, gen, true);
        }
        vrpc_ch_send_done(ch, c, h->request_id, VRPC_RESOURCE_EXHAUSTED);
        slot_seen(s, gen);
        return;
    }
    struct vrpc_rndv_in *in = &s->in;
    in->lb = lb;
    in->ep = c->b.ep;
    in->addr = d.addr;
    in->rkey = d.rkey;
    in->len = h->payload_len;
    in->id = h->request_id;
    slot_hold(s); /* before seen: the read keeps the slot */
    slot_seen(s, gen);
    vrpc_ch_read_limit(ch, s, h);
    int rc = vrpc_rndv_read(in);
    if (rc == -ENOSPC)
        vrpc_rndv_read_later(&ch->retry, in);
    else if (rc)
        vrpc_ch_response_read_done(ch, in, rc);
}
/* DONE from the server: it has read (or given up on) our request payload. */
static void on_done(struct vrpc_channel *ch, struct vrpc_conn *c, const struct vrpc_wire_hdr *h)
{
    struct vrpc_pending_slot *s = vrpc_pending_lookup(ch->pend, h->request_id);
    if (!s || __atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_ACQUIRE) != c ||
        !vrpc_offer_granted(&s->out, h->request_id)) {
        vrpc_ch_protocol_error(c, "DONE for a request with no payload outstanding", -EPROTO);
        return;
    }
    request_revoke(ch, s);
}

/* The endpoint's DISCONNECTED (poller): its keys died with it; give back the
 * buffers of grants not revoked, and fail reads still waiting to start. */
void vrpc_ch_release_transfers(struct vrpc_channel *ch, struct vrpc_ep *ep)
{
    vrpc_rndv_retry_forget(&ch->retry, ep, vrpc_ch_response_read_failed, ch);
    for (uint32_t i = 0; i < ch->pend->n; i++) {
        struct vrpc_pending_slot *s = &ch->pend->slots[i];
        /* REVOKING too: vrpc_ch_request_go's revoke of a grant whose descriptor
         * could not be sent holds GRANTED -> REVOKING -> GRANTED (failed)
         * under conn_lock, so the state is decided under the lock */
        uint32_t st = __atomic_load_n(&s->out.state, __ATOMIC_ACQUIRE);
        if ((st != VRPC_RNDV_GRANTED && st != VRPC_RNDV_REVOKING) || s->out.ep != ep)
            continue;
        struct vrpc_conn *c = vrpc_ep_user(ep);
        uint64_t id;
        bool dropped = vrpc_offer_drop(&ch->offers, &s->out, ep, &id);
        uint32_t gen = vrpc_wire_id_gen(id);
        if (dropped) {
            vrpc_timer_cancel(ch->wheel, &s->out.hold_timer);
            vrpc_ch_zc_release(ch, s, true);
            conn_unref(c);
            slot_drop(s, gen);
        }
    }
}

void vrpc_ch_on_done(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    (void)body;
    on_done(client_conn(b)->ch, client_conn(b), h);
}

/* ---- request offers (rpc/offer.h) ------------------------------------------ */

/* The offer machine's grant of a request payload (rpc/offer.h): under
 * conn_lock, against the endpoint's DISCONNECTED (vrpc_ch_release_transfers): either
 * it sees the grant, or we see `gone` and grant nothing. A parked offer
 * whose call was decided meanwhile (deadline, cancel) is not granted at all:
 * -ECANCELED. */
static int request_grant_locked(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, bool retry)
{
    struct vrpc_channel *ch = container_of(q, struct vrpc_channel, offers);
    struct vrpc_pending_slot *s = container_of(o, struct vrpc_pending_slot, out);
    struct vrpc_conn *c = o->p_conn;
    if (retry && ((uint32_t)__atomic_load_n(&s->word, __ATOMIC_ACQUIRE) & VRPC_PEND_DECIDED))
        return -ECANCELED;
    int rc = vrpc_offer_grant_locked(&c->b, o);
    if (rc == 0) {
        slot_hold(s); /* the grant's */
        vrpc_timer_arm(ch->wheel, &o->hold_timer, vrpc_now_ns() + (int64_t)ch->o.hold_timeout_ms * 1000000,
                       vrpc_offer_hold_fired, q, o->p_id);
    }
    return rc;
}

/* A request offer off the parked list (or never parked): its descriptor
 * goes out if it got its grant. A call decided while its offer was parked
 * (deadline, cancel) is not sent at all. Drops the offer's reference of c. */
static int request_offer_done(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, enum vrpc_send_ctx ctx)
{
    struct vrpc_channel *ch = container_of(q, struct vrpc_channel, offers);
    struct vrpc_pending_slot *s = container_of(o, struct vrpc_pending_slot, out);
    struct vrpc_conn *c = o->p_conn;
    uint32_t gen = vrpc_wire_id_gen(o->p_id);
    bool async = s->cb != NULL;
    if (o->p_rc == 0) {
        vrpc_rndv_offer_desc(o);
    } else {
        vrpc_lbuf_put(o->p_lb);
        vrpc_ch_zc_release(ch, s, ctx == VRPC_SEND_POLLER); /* never granted */
    }
    if (o->p_rc == -ECANCELED) { /* the server never hears of it */
        vrpc_pool_put(o->p_frame);
        slot_seen(s, gen);
        slot_drop(s, gen);
        if (async)
            conn_unref(c);
    } else {
        vrpc_ch_request_go(ch, c, s, gen, o->p_frame, o->p_frame_len, o->p_rc, ctx);
    }
    conn_unref(c);
    return 0;
}

/* The hold timer (rpc/offer.h), under conn_lock: a server that holds our
 * request payload past the hold timeout (no DONE, no RESPONSE). */
static bool request_hold_find_locked(struct vrpc_offer_q *q, uint64_t id, struct vrpc_offer_held *h)
{
    struct vrpc_channel *ch = container_of(q, struct vrpc_channel, offers);
    uint32_t idx = vrpc_wire_id_slot(id);
    if (idx >= ch->pend->n)
        return false;
    struct vrpc_rndv_out *o = &ch->pend->slots[idx].out;
    if (!vrpc_offer_granted(o, id))
        return false;
    struct vrpc_conn *c = vrpc_ep_user(o->ep);
    conn_ref(c); /* safe: the grant holds one until it goes IDLE under this lock */
    *h = (struct vrpc_offer_held){.c = &c->b, .len = o->len, .id = id, .hold_ms = ch->o.hold_timeout_ms};
    return true;
}

static void request_hold_kill(struct vrpc_conn_base *b)
{
    vrpc_ch_conn_fail(client_conn(b), "connection closed: the server did not read a large request in time", false);
}

static void request_conn_unref(struct vrpc_conn_base *b) { conn_unref(client_conn(b)); }

const struct vrpc_offer_ops vrpc_ch_request_offer_ops = {
    .grant_locked = request_grant_locked,
    .done = request_offer_done,
    .hold_find_locked = request_hold_find_locked,
    .hold_kill = request_hold_kill,
    .conn_unref = request_conn_unref,
    .hold_peer = "server",
    .hold_what = "payload",
    .hold_note = "",
};

/* Offer the packed request payload (s->out.p_*, frame b with its header
 * written) to the server (caller's thread): grant and send, or park the
 * offer when the transport has no grant left for now. */
void vrpc_ch_offer_request(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                           enum vrpc_send_ctx ctx)
{
    conn_ref(c); /* the offer's */
    s->out.p_conn = c;
    vrpc_offer_start(&ch->offers, &s->out, ctx);
}

/* A request above the eager size: pack it straight into a large buffer
 * (cs->lb), offered to the server by rendezvous (the descriptor goes in
 * place of the payload); gathered (cs->gat) when the request stays valid
 * and unchanged until the call ends for its owner (synchronous, or
 * REQ_HELD) and c can gather: big bytes values are then sent from where
 * they are (zero-copy requests, rpc/channel_internal.h). 0, or the status code with st
 * filled and nothing held. */
int vrpc_ch_pack_large(struct vrpc_channel *ch, const struct vrpc_conn *c, struct call_start *cs,
                       struct vrpc_status *st)
{
    char why[VRPC_STATUS_MSG_MAX];
    if (VRPC_WIRE_HDR_LEN + (size_t)cs->mdsz + VRPC_WIRE_DESC_LEN > vrpc_ep_eager_size(c->b.ep)) {
        vrpc_status_set(st, VRPC_RESOURCE_EXHAUSTED,
                        "metadata of %ld bytes does not fit one frame "
                        "with a large message (at most %u bytes)",
                        cs->mdsz, vrpc_ep_eager_size(c->b.ep) - VRPC_WIRE_HDR_LEN - VRPC_WIRE_DESC_LEN);
        return VRPC_RESOURCE_EXHAUSTED;
    }
    bool held = !cs->cb || (cs->o && (cs->o->flags & VRPC_CALL_REQ_HELD));
    struct vrpc_pb_gather *gat = &cs->gat;
    if (held && c->gather) {
        vrpc_pb_pack_gather(cs->req, VRPC_PB_GATHER_MIN, NULL, 0, gat); /* measure */
        if (gat->nrefs == 0)
            gat->nsegs = 0; /* nothing to reference: pack as usual */
    }
    if (vrpc_rndv_buf(ch->tp, ch->o.max_pinned, gat->nsegs ? gat->copied : cs->plen, &cs->lb, why, sizeof(why))) {
        vrpc_status_set(st, VRPC_RESOURCE_EXHAUSTED, "%s", why);
        return VRPC_RESOURCE_EXHAUSTED;
    }
    if (gat->nsegs) {
        size_t copied = gat->copied;
        if (vrpc_pb_pack_gather(cs->req, VRPC_PB_GATHER_MIN, cs->lb->data, copied, gat) || gat->copied != copied ||
            gat->total != cs->plen) {
            vrpc_lbuf_put(cs->lb);
            cs->lb = NULL;
            vrpc_status_set(st, VRPC_INTERNAL, "request changed while it was being packed");
            return VRPC_INTERNAL;
        }
    } else {
        cs->plen = vrpc_pb_pack_sized(cs->req, cs->lb->data);
    }
    return 0;
}
