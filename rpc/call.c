/* A call's life on the client: start (connect, slot, pack, send), the
 * response and its outcome, completion (wake the synchronous caller or
 * submit the async callback), deadlines, cancel, and failing the calls of a
 * lost connection. The poller only copies bytes, decides the outcome and
 * wakes or submits: no user code runs on it, except the callbacks of calls
 * made with VRPC_CALL_CB_ON_POLLER. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/channel_internal.h"
#include "rpc/lb.h"
#include "rpc/status.h"
#include "rpc/stream_internal.h"

/* Completion of an asynchronous call that failed before it got a slot. */
struct early_fail {
    struct vrpc_task task;
    vrpc_call_cb cb;
    void *arg;
    struct vrpc_status st;
};

/* Unpack the call's response (OK) into the arena: from its copy, or from the
 * large buffer it was read into. That buffer goes back to the cache here,
 * unless *held is given: then big bytes values are not copied but point into
 * it, the arena keeps it (written to *held; the caller puts it back with
 * vrpc_arena_unhold once the message is dead). */
static int unpack_response(struct vrpc_pending_slot *s, struct vrpc_arena *a, ProtobufCMessage **out,
                           struct vrpc_buf **held)
{
    struct vrpc_buf *lb = s->resp_lb;
    int rc = -ENOMEM;
    s->resp_lb = NULL;
    if (a) {
        vrpc_arena_reset(a);
        if (lb && held) {
            rc = vrpc_pb_unpack_ref(s->method->output, lb->data, s->resp_len, 0, a, out);
            if (rc == 0) {
                vrpc_arena_hold(a, lb);
                *held = lb;
                return 0;
            }
        } else {
            rc = vrpc_pb_unpack(s->method->output, lb ? lb->data : s->resp, s->resp_len, 0, a, out);
        }
    }
    vrpc_lbuf_put(lb);
    return rc;
}

/* ---- response metadata (vrpc_call_opts.resp_md) ----------------------------- */

/* Poller: append a metadata block to the slot's copy. False: no memory
 * (the metadata is then dropped, the call goes on). */
static bool md_append(struct vrpc_pending_slot *s, const uint8_t *md, uint32_t len)
{
    if (s->md_len + len > s->md_cap) {
        uint32_t cap = s->md_len + len < 256 ? 256 : s->md_len + len;
        uint8_t *nb = realloc(s->md, cap);
        if (!nb)
            return false;
        s->md = nb;
        s->md_cap = cap;
    }
    memcpy(s->md + s->md_len, md, len);
    s->md_len += len;
    return true;
}

void vrpc_ch_unary_headers(struct vrpc_conn *c, struct vrpc_pending_slot *s, const struct vrpc_wire_hdr *h,
                           const uint8_t *md)
{
    if (s->hdrs) {
        vrpc_ch_protocol_error(c, "HEADERS twice for one call", -EPROTO);
        return;
    }
    s->hdrs = true;
    if (s->resp_md && h->md_len && md_append(s, md, h->md_len))
        s->imd_len = h->md_len;
}

/* Entries of one block into r (up to its cap; the rest counted dropped). */
static size_t md_block_out(struct vrpc_resp_md *r, size_t at, const uint8_t *p, uint32_t len)
{
    struct vrpc_metadata tmp[VRPC_MD_MAX];
    int n = len ? vrpc_wire_md_decode(p, len, tmp, VRPC_MD_MAX) : 0;
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (at + k < r->cap)
            r->entries[at + k++] = tmp[i];
        else
            r->n_dropped++;
    }
    return k;
}

/* The owner, once the outcome is published: fill the caller's resp_md. a:
 * copy the blocks into this arena (a synchronous call's: the slot's copy
 * is reused once the slot frees); NULL: point into the slot (an async
 * callback's, valid while it runs). */
static void resp_md_fill(struct vrpc_pending_slot *s, struct vrpc_arena *a)
{
    struct vrpc_resp_md *r = s->resp_md;
    if (!r)
        return;
    r->n_initial = r->n_trailing = r->n_dropped = 0;
    if (!__atomic_load_n(&s->md_final, __ATOMIC_ACQUIRE) || !s->md_len)
        return;
    uint8_t *p = s->md;
    if (a) {
        if (!(p = vrpc_arena_alloc(a, s->md_len)))
            return;
        memcpy(p, s->md, s->md_len);
    }
    r->n_initial = md_block_out(r, 0, p, s->imd_len);
    r->n_trailing = md_block_out(r, r->n_initial, p + s->imd_len, s->md_len - s->imd_len);
}

/* ---- completing a call ------------------------------------------------- */

/* Async completion on a worker: unpack, run the callback, release. */
static void async_done_task(struct vrpc_task *t)
{
    struct vrpc_pending_slot *s = container_of(t, struct vrpc_pending_slot, task);
    struct vrpc_channel *ch = s->cb_ch;
    uint32_t gen = vrpc_pending_gen(s);
    const ProtobufCMessage *msg = NULL;
    struct vrpc_buf *held = NULL;

    if (s->st.code == VRPC_OK) {
        ProtobufCMessage *m = NULL;
        int rc = unpack_response(s, vrpc_rpc_tls_arena_of(VRPC_ARENA_CB), &m, &held);
        if (rc)
            vrpc_status_set(&s->st, VRPC_INTERNAL, "response does not decode as %s (%d)", s->method->output->name, rc);
        else
            msg = m;
    }
    call_metrics(ch, s->method, s->st.code, s->start_ns);
    resp_md_fill(s, NULL);
    s->cb(&s->st, msg, s->cb_arg);
    /* resp was valid only during the callback: its large buffer goes back
     * now rather than at this worker's next unpack */
    if (held)
        vrpc_arena_unhold(vrpc_rpc_tls_arena_of(VRPC_ARENA_CB), held);
    if (s->deadline_ns != VRPC_NO_DEADLINE)
        vrpc_timer_cancel(ch->wheel, &s->timer);
    /* unref before owner_done: once every slot is free the channel's destroy
     * may go on to destroy the CQ, and our reference must be gone by then */
    conn_unref(__atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_RELAXED));
    if (s->qent) /* before owner_done: destroy frees the entries once every slot is free */
        vrpc_ch_queued_release(ch, s->qent);
    vrpc_pending_owner_done(s, gen);
}

/* Hand the decided outcome to its owner. on_poller: we run on the CQ poller
 * and may use the channel's producer ring. */
void vrpc_ch_complete_submit(struct vrpc_channel *ch, struct vrpc_pending_slot *s, bool on_poller)
{
    vrpc_task_init(&s->task, async_done_task);
    if (on_poller && s->cb_on_poller) { /* VRPC_CALL_CB_ON_POLLER: here, now */
        vrpc_rpc_on_poller = true;
        async_done_task(&s->task);
        vrpc_rpc_on_poller = false;
        return;
    }
    int rc = on_poller ? vrpc_sched_producer_submit(ch->prod, &s->task) : vrpc_sched_submit(ch->sched, &s->task);
    if (rc) /* the scheduler is shutting down: run here rather than lose it */
        async_done_task(&s->task);
}

void vrpc_ch_complete(struct vrpc_channel *ch, struct vrpc_pending_slot *s, uint32_t gen, bool on_poller)
{
    if (s->cb) {
        if (slot_is_stream(s)) {
            vrpc_ch_stream_end(ch, s, on_poller);
            return;
        }
        /* a request still granted from the caller's memory: vrpc_ch_zc_release runs
         * the callback (exactly one of the two sees the other's bit) */
        if (__atomic_load_n(&s->out.zc, __ATOMIC_ACQUIRE) &&
            (__atomic_fetch_or(&s->out.zc, ZC_CB, __ATOMIC_ACQ_REL) & ZC_BUSY))
            return;
        vrpc_ch_complete_submit(ch, s, on_poller);
    } else {
        vrpc_pending_publish(s, gen);
    }
}

static void send_cancel(struct vrpc_channel *ch, struct vrpc_conn *c, uint64_t id)
{
    if (!c || __atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
        return;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_CANCEL, .request_id = id};
    /* Best effort and never blocking: without a buffer the server simply
     * finishes the call and its response is dropped. */
    vrpc_rpc_send_simple(c->b.ep, ch->send_pool, &h, NULL, 0, false);
}

void vrpc_ch_deadline_fired(void *ctx, uint64_t id)
{
    struct vrpc_channel *ch = ctx;
    uint32_t idx = vrpc_wire_id_slot(id), gen = vrpc_wire_id_gen(id);
    if (idx >= ch->pend->n)
        return;
    struct vrpc_pending_slot *s = &ch->pend->slots[idx];
    if (!vrpc_pending_decide(s, gen))
        return;
    vrpc_status_set(&s->st, VRPC_DEADLINE_EXCEEDED, "deadline exceeded");
    send_cancel(ch, __atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_ACQUIRE), id);
    vrpc_ch_complete(ch, s, gen, false);
}

int vrpc_channel_cancel(struct vrpc_channel *ch, uint64_t id)
{
    uint32_t idx = vrpc_wire_id_slot(id), gen = vrpc_wire_id_gen(id);
    if (ch && ch->lb)
        return vrpc_lb_cancel(ch->lb, id);
    if (ch && (idx & QID_BIT))
        return vrpc_ch_cancel_queued(ch, id);
    if (!ch || id == 0 || idx >= ch->pend->n)
        return -ENOENT;
    struct vrpc_pending_slot *s = &ch->pend->slots[idx];
    if (!vrpc_pending_decide(s, gen))
        return -ENOENT;
    vrpc_status_set(&s->st, VRPC_CANCELLED, "cancelled by the client");
    send_cancel(ch, __atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_ACQUIRE), id);
    vrpc_ch_complete(ch, s, gen, false);
    return 0;
}

/* Fail every call pending on c with code (exactly once each, by decide) and
 * mark their wire side done: no response will come on a dead connection. */
void vrpc_ch_fail_pending(struct vrpc_channel *ch, struct vrpc_conn *c, enum vrpc_code code, const char *why,
                          bool on_poller)
{
    struct vrpc_pending *p = ch->pend;
    for (uint32_t i = 0; i < p->n; i++) {
        struct vrpc_pending_slot *s = &p->slots[i];
        uint64_t w = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE);
        if (!((uint32_t)w & VRPC_PEND_INUSE))
            continue;
        if (c && __atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_ACQUIRE) != c)
            continue;
        uint32_t gen = (uint32_t)(w >> 32);
        if (vrpc_pending_decide(s, gen)) {
            vrpc_status_set(&s->st, code, "%s", why);
            vrpc_ch_complete(ch, s, gen, on_poller);
        }
        if (c)
            slot_seen(s, gen);
    }
}

/* ---- responses (poller) --------------------------------------------------- */

/* The request carries only the method's id: the client names the method in
 * the server's UNIMPLEMENTED, which can name only methods it registered. */
static void name_unimplemented(struct vrpc_status *st, const struct vrpc_method_desc *m)
{
    char srv[VRPC_STATUS_MSG_MAX];
    memcpy(srv, st->message, sizeof srv);
    vrpc_status_set(st, VRPC_UNIMPLEMENTED, "method %s is not implemented by the server (%s)", m->full_name,
                    srv[0] ? srv : "no message");
}

static void on_response(struct vrpc_channel *ch, struct vrpc_conn *c, const struct vrpc_wire_hdr *h,
                        const uint8_t *payload)
{
    struct vrpc_pending_slot *s = vrpc_pending_lookup(ch->pend, h->request_id);
    if (!s || __atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_ACQUIRE) != c ||
        ((uint32_t)__atomic_load_n(&s->xfer, __ATOMIC_ACQUIRE) & VRPC_PEND_XFER_SEEN)) {
        vrpc_ch_protocol_error(c, "response to a request id that is not pending", -EPROTO);
        return;
    }
    uint32_t gen = vrpc_wire_id_gen(h->request_id);
    if (s->resp_md) { /* the trailers, then md is complete (resp_md_fill) */
        if (h->md_len)
            md_append(s, payload - h->md_len, h->md_len);
        __atomic_store_n(&s->md_final, true, __ATOMIC_RELEASE);
    }
    /* a RESPONSE also ends the grant of a request payload the server did not read */
    if (vrpc_offer_granted(&s->out, h->request_id))
        request_revoke(ch, s);
    if (slot_is_stream(s)) {
        vrpc_ch_stream_on_response(ch, c, s, h, payload - h->md_len, payload);
        return;
    }
    if (h->flags & VRPC_FF_RNDV) {
        vrpc_ch_on_large_response(ch, c, s, h, payload);
        return;
    }
    if (vrpc_pending_decide(s, gen)) {
        if (h->status == VRPC_OK) {
            if (!s->resp || h->payload_len > s->resp_cap) {
                /* sized once for the largest eager response, so a slot never
                 * regrows in steady state (larger ones come by rendezvous) */
                uint32_t fit = vrpc_ep_eager_size(c->b.ep) - VRPC_WIRE_HDR_LEN;
                uint32_t want = h->payload_len > fit ? h->payload_len : fit;
                uint8_t *nb = realloc(s->resp, want);
                if (!nb) {
                    vrpc_status_set(&s->st, VRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
                    goto done;
                }
                s->resp = nb;
                s->resp_cap = want;
            }
            memcpy(s->resp, payload, h->payload_len);
            s->resp_len = h->payload_len;
            s->st.code = VRPC_OK;
            s->st.flags = 0;
            s->st.message[0] = 0;
        } else {
            vrpc_status_set_bytes(&s->st, (enum vrpc_code)h->status, payload, h->payload_len);
            if (h->flags & VRPC_FF_REFUSED) /* the server refused it unread */
                s->st.flags = VRPC_STATUS_UNPROCESSED;
            if (h->status == VRPC_UNIMPLEMENTED)
                name_unimplemented(&s->st, s->method);
        }
    done:
        slot_seen(s, gen);
        vrpc_ch_complete(ch, s, gen, true);
    } else {
        slot_seen(s, gen); /* late answer to a cancelled/timed-out call */
    }
}

void vrpc_ch_on_response(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_conn *c = client_conn(b);
    if ((h->flags & VRPC_FF_RNDV) && !c->b.large) {
        vrpc_ch_protocol_error(c, "large-message response on a connection without large messages", -EPROTO);
        return;
    }
    on_response(c->ch, c, h, body + h->md_len);
}

/* ---- calls ------------------------------------------------------------------ */

static void early_fail_task(struct vrpc_task *t)
{
    struct early_fail *e = container_of(t, struct early_fail, task);
    e->cb(&e->st, NULL, e->arg);
    free(e);
}

int64_t vrpc_ch_call_deadline(const struct vrpc_channel *ch, const struct vrpc_call_opts *o)
{
    int64_t t = o ? o->timeout_us : 0;
    if (t == 0)
        t = ch->o.default_timeout_us;
    if (t <= 0)
        return VRPC_NO_DEADLINE;
    return vrpc_now_ns() + t * 1000;
}

/* The end of sending a request (start_call's, a parked offer's or a queued
 * call's): send the frame b unless rc already says why not, fail the call if
 * it could not go, end the owner's set-up hold. Drops an async call's own
 * reference of c (see start_call). ctx: the thread (an async call's never
 * waits for credits). */
void vrpc_ch_request_go(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s, uint32_t gen,
                        struct vrpc_buf *b, uint32_t flen, int rc, enum vrpc_send_ctx ctx)
{
    /* (s->cb is the owner's until the set-up hold is dropped, below) */
    bool async = s->cb != NULL, on_poller = ctx == VRPC_SEND_POLLER;
    /* Read dead with an RMW (release): pairs with vrpc_ch_conn_fail's exchange, see
     * there; a plain load could miss it while the scan misses our slot. */
    if (!rc)
        rc = vrpc_conn_dead_rmw(&c->b) ? -ENOTCONN : 0;
    if (!rc)
        rc = vrpc_rpc_send(c->b.ep, b, flen, ctx == VRPC_SEND_WAIT);
    else
        vrpc_pool_put(b);
    if (rc) {
        /* The server never got the descriptor: end a grant made for it now
         * (its REVOKE completion releases it); one that cannot be revoked
         * (-ENOSPC, a dying endpoint) stays until the endpoint's
         * DISCONNECTED or the hold timeout releases it. */
        pthread_mutex_lock(&ch->conn_lock); /* against vrpc_ch_release_transfers: see there */
        if (__atomic_load_n(&s->out.state, __ATOMIC_ACQUIRE) == VRPC_RNDV_GRANTED &&
            s->out.id == vrpc_wire_make_id(s->index, gen))
            vrpc_rndv_revoke(&s->out);
        pthread_mutex_unlock(&ch->conn_lock);
        if (vrpc_pending_decide(s, gen)) {
            vrpc_status_set_unprocessed(&s->st, VRPC_UNAVAILABLE, "send failed: %s", strerror(-rc));
            vrpc_ch_complete(ch, s, gen, on_poller);
        }
        slot_seen(s, gen);
    }
    slot_drop(s, gen); /* the owner's set-up hold (pending.h) */
    if (async)
        conn_unref(c);
}

/* vrpc_ch_get_conn's failure as the call's status (never sent: marked
 * VRPC_STATUS_UNPROCESSED); returns its code. */
int vrpc_ch_conn_refused(struct vrpc_channel *ch, int rc, struct vrpc_status *st)
{
    if (rc == -ESHUTDOWN)
        vrpc_status_set_unprocessed(st, VRPC_UNAVAILABLE, "channel is shutting down");
    else if (rc == -EAGAIN && __atomic_load_n(&ch->last_err, __ATOMIC_RELAXED) == -ENXIO)
        vrpc_status_set_unprocessed(st, VRPC_UNAVAILABLE,
                                    "channel in back-off after: cannot resolve the host name of %s", ch->turi);
    else if (rc == -EAGAIN)
        vrpc_status_set_unprocessed(st, VRPC_UNAVAILABLE, "channel in back-off after: %s",
                                    strerror(-__atomic_load_n(&ch->last_err, __ATOMIC_RELAXED)));
    else if (rc == -ENXIO)
        vrpc_status_set_unprocessed(st, VRPC_UNAVAILABLE, "connect failed: cannot resolve the host name of %s",
                                    ch->turi);
    else if (rc == -EINVAL)
        vrpc_status_set_unprocessed(st, VRPC_INVALID_ARGUMENT, "connect to %s failed: invalid argument", ch->turi);
    else if (rc == -EDEADLK)
        vrpc_status_set_unprocessed(st, VRPC_UNAVAILABLE,
                                    "channel to %s not connected, and a call from a poller thread does not wait "
                                    "for a connect",
                                    ch->turi);
    else
        vrpc_status_set_unprocessed(st, VRPC_UNAVAILABLE, "connect failed: %s", strerror(-rc));
    return rc == -EINVAL ? VRPC_INVALID_ARGUMENT : VRPC_UNAVAILABLE;
}

/* A request of need bytes above what c may send: its status and code. */
static int request_too_big(const struct vrpc_conn *c, size_t need, struct vrpc_status *st)
{
    if (c->b.max_payload == c->b.peer_max)
        vrpc_status_set(st, VRPC_RESOURCE_EXHAUSTED, "request of %zu bytes exceeds the server's limit of %u bytes",
                        need, c->b.max_payload);
    else
        vrpc_status_set(st, VRPC_RESOURCE_EXHAUSTED,
                        "request of %zu bytes exceeds %u bytes, the most one frame carries on this "
                        "connection (no large-message support on one side)",
                        need, c->b.max_payload);
    return VRPC_RESOURCE_EXHAUSTED;
}

/* The call's slot: *sp set and 0, or start_call's result with c's
 * reference and cs->lb dropped (*sp NULL and 0: queued). A synchronous call
 * waits for a slot until its deadline; an async one does not. */
static int call_slot(struct vrpc_channel *ch, struct vrpc_conn *c, struct call_start *cs, struct vrpc_status *st,
                     struct vrpc_pending_slot **sp)
{
    int rc;
    if (cs->cb) {
        rc = backlog_empty(ch) ? vrpc_pending_try_alloc(ch->pend, c, sp) : -EAGAIN;
        if (rc == -EAGAIN)
            return vrpc_ch_start_queued(ch, c, cs, st);
    } else {
        rc = vrpc_pending_alloc(ch->pend, cs->deadline, c, sp);
    }
    if (rc) {
        vrpc_lbuf_put(cs->lb);
        conn_unref(c);
        if (rc == -ETIMEDOUT) {
            vrpc_status_set(st, VRPC_DEADLINE_EXCEEDED, "deadline exceeded waiting for a call credit");
            return VRPC_DEADLINE_EXCEEDED;
        }
        vrpc_status_set_unprocessed(st, VRPC_UNAVAILABLE, "channel is shutting down");
        return VRPC_UNAVAILABLE;
    }
    return 0;
}

/* Write the call's fields into its reserved slot s and publish it
 * (open_call). From open on, an async call can be completed by another
 * thread (loss scan, cancel) whose callback task drops the call's reference
 * of c before we have sent: keep one of our own until we are done with c
 * (vrpc_ch_request_go drops it). A synchronous call completes on this thread, after
 * start_call returns. */
static void call_open(struct vrpc_channel *ch, struct vrpc_conn *c, const struct call_start *cs,
                      struct vrpc_pending_slot *s, uint64_t id)
{
    s->method = cs->m;
    s->cb = cs->cb;
    s->cb_on_poller = cs->cb && cs->o && (cs->o->flags & VRPC_CALL_CB_ON_POLLER);
    s->cb_arg = cs->arg;
    s->cb_ch = ch;
    s->deadline_ns = cs->deadline;
    s->start_ns = vrpc_metrics_now_ns();
    s->out.zc = cs->gat.nsegs ? ZC_BUSY : 0; /* before open: vrpc_ch_complete() looks at it */
    if (cs->cb)
        conn_ref(c);
    s->qent = NULL;
    s->resp_md = cs->o ? cs->o->resp_md : NULL;
    open_call(ch, s, id);
    check_expired(ch, cs->deadline, id);
}

/* No send buffer for the open call's request: it fails UNAVAILABLE. */
static void call_no_buf(struct vrpc_channel *ch, struct vrpc_conn *c, const struct call_start *cs,
                        struct vrpc_pending_slot *s, uint32_t gen)
{
    vrpc_lbuf_put(cs->lb);
    vrpc_ch_zc_release(ch, s, false); /* never granted */
    if (vrpc_pending_decide(s, gen)) {
        vrpc_status_set_unprocessed(&s->st, VRPC_UNAVAILABLE, "no send buffer free");
        vrpc_ch_complete(ch, s, gen, false);
    }
    slot_seen(s, gen);
    slot_drop(s, gen);
    if (cs->cb)
        conn_unref(c);
}

/* The REQUEST frame of the open call into b: header, metadata, and the
 * message (eager) or room for the descriptor (large). Its length. */
static uint32_t request_frame(const struct call_start *cs, struct vrpc_buf *b, uint64_t id)
{
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_REQUEST,
                              .method_id = cs->m->id,
                              .request_id = id,
                              .md_len = (uint32_t)cs->mdsz};
    if (cs->deadline != VRPC_NO_DEADLINE) {
        int64_t left = cs->deadline - vrpc_now_ns();
        h.flags = VRPC_FF_DEADLINE;
        h.budget_us = left > 0 ? (uint64_t)(left / 1000) : 0;
    }
    uint8_t *p = b->data;
    if (cs->mdsz)
        vrpc_wire_md_encode(p + VRPC_WIRE_HDR_LEN, cs->o->md, cs->o->md_count);
    uint32_t flen = VRPC_WIRE_HDR_LEN + (uint32_t)cs->mdsz;
    size_t plen = cs->plen;
    if (cs->lb) {
        /* the descriptor goes in once granted (vrpc_ch_offer_request) */
        flen += VRPC_WIRE_DESC_LEN;
        h.flags |= VRPC_FF_RNDV;
    } else {
        /* need <= eager - header = room in b: checked by start_call */
        plen = vrpc_pb_pack_sized(cs->req, p + flen);
        flen += (uint32_t)plen;
    }
    h.payload_len = (uint32_t)plen;
    vrpc_wire_hdr_encode(p, &h);
    return flen;
}

/* Send the open call's request (frame b): offered by rendezvous when large,
 * else straight out. */
static void call_send(struct vrpc_channel *ch, struct vrpc_conn *c, struct call_start *cs, struct vrpc_pending_slot *s,
                      struct vrpc_buf *b, uint64_t id, uint32_t gen)
{
    uint32_t flen = request_frame(cs, b, id);
    enum vrpc_send_ctx ctx = cs->cb ? VRPC_SEND_NOWAIT : VRPC_SEND_WAIT; /* async: never waits for credits */
    if (cs->o && cs->o->call_id)
        __atomic_store_n(cs->o->call_id, id, __ATOMIC_RELEASE);
    if (!cs->lb) {
        vrpc_ch_request_go(ch, c, s, gen, b, flen, 0, ctx);
        return;
    }
    struct vrpc_rndv_out *out = &s->out;
    out->p_nsegs = cs->gat.nsegs;
    if (cs->gat.nsegs)
        memcpy(out->p_segs, cs->gat.segs, cs->gat.nsegs * sizeof(cs->gat.segs[0]));
    out->p_lb = cs->lb;
    out->p_frame = b;
    out->p_len = (uint32_t)cs->plen;
    out->p_frame_len = flen;
    out->p_id = id;
    vrpc_ch_offer_request(ch, c, s, ctx);
}

/* Start a call: connect, take a slot, pack and send. Returns 0 with *out set
 * (the slot's outcome will be decided by someone), 0 with *out NULL for an
 * async call queued for lack of a slot, -EAGAIN for an async call refused
 * (the backlog is full, or a large request finds no slot), or fills st and
 * returns its code (nothing pending). An async call (cb set) does not wait
 * for a slot or a send buffer. */
static int start_call(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                      const struct vrpc_call_opts *o, vrpc_call_cb cb, void *arg, struct vrpc_status *st,
                      struct vrpc_pending_slot **out)
{
    struct call_start cs;
    struct vrpc_conn *c;
    struct vrpc_pending_slot *s = NULL;
    int rc;

    if (m->kind != VRPC_METHOD_UNARY) {
        vrpc_status_set(st, VRPC_UNIMPLEMENTED, "method %s is streaming: call it through vrpc_stream_start",
                        m->full_name);
        return VRPC_UNIMPLEMENTED;
    }
    if (o && o->resp_md) /* every outcome writes it; a call that gets a slot fills it */
        o->resp_md->n_initial = o->resp_md->n_trailing = o->resp_md->n_dropped = 0;
    cs.m = m;
    cs.req = req;
    cs.o = o;
    cs.cb = cb;
    cs.arg = arg;
    cs.deadline = vrpc_ch_call_deadline(ch, o);
    cs.mdsz = 0;
    cs.lb = NULL;
    cs.gat.nsegs = 0;
    cs.gat.nrefs = 0;
    if (o && o->md_count && (cs.mdsz = vrpc_wire_md_size(o->md, o->md_count)) < 0) {
        vrpc_status_set(st, VRPC_INVALID_ARGUMENT, "invalid metadata");
        return VRPC_INVALID_ARGUMENT;
    }
    rc = vrpc_ch_get_conn(ch, cs.deadline, false, &c);
    if (rc)
        return vrpc_ch_conn_refused(ch, rc, st);
    size_t need = vrpc_pb_packed_size(req) + (size_t)cs.mdsz;
    if (need > c->b.max_payload) {
        rc = request_too_big(c, need, st);
        conn_unref(c);
        return rc;
    }
    cs.plen = need - (size_t)cs.mdsz;
    if (VRPC_WIRE_HDR_LEN + need > vrpc_ep_eager_size(c->b.ep) && (rc = vrpc_ch_pack_large(ch, c, &cs, st))) {
        conn_unref(c);
        return rc;
    }
    if ((rc = call_slot(ch, c, &cs, st, &s)) || !s) {
        if (!rc)
            *out = NULL; /* queued */
        return rc;
    }
    uint32_t gen = vrpc_pending_gen(s);
    uint64_t id = vrpc_wire_make_id(s->index, gen);
    call_open(ch, c, &cs, s, id);
    /* async: the pool holds max_outstanding + max_queued + spare buffers, so
     * it is empty only while many cancels are being sent: the call then
     * fails UNAVAILABLE through its callback rather than wait */
    struct vrpc_buf *b = vrpc_rpc_buf_get(ch->send_pool, cb == NULL);
    if (!b)
        call_no_buf(ch, c, &cs, s, gen);
    else
        call_send(ch, c, &cs, s, b, id, gen);
    *out = s;
    return 0;
}

/* A synchronous call on a plain channel (arguments checked by vrpc_call;
 * st may be NULL). Not inlined into vrpc_call: its frame (the local status)
 * would make vrpc_call's tail calls into plain calls for every channel. */
__attribute__((noinline)) int vrpc_ch_call(struct vrpc_channel *ch, const struct vrpc_method_desc *m,
                                           const ProtobufCMessage *req, ProtobufCMessage **resp,
                                           const struct vrpc_call_opts *opts, struct vrpc_status *st)
{
    struct vrpc_status local;
    struct vrpc_pending_slot *s;
    int code;

    if (!st)
        st = &local;
    if (opts && opts->peer)
        vrpc_ch_copy_peer(ch, opts);
    code = start_call(ch, m, req, opts, NULL, NULL, st, &s);
    if (code) {
        call_metrics(ch, m, code, 0);
        return code;
    }
    uint32_t gen = vrpc_pending_gen(s);
    vrpc_pending_wait(s, gen);
    zc_wait(s); /* the request is ours again only when the server can no longer read it */
    struct vrpc_conn *c = __atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_RELAXED);
    code = s->st.code;
    if (code == VRPC_OK) {
        ProtobufCMessage *msg = NULL;
        int rc = unpack_response(s, vrpc_rpc_tls_arena(), &msg, NULL);
        if (rc) {
            code = VRPC_INTERNAL;
            vrpc_status_set(st, VRPC_INTERNAL, "response does not decode as %s (%d)", m->output->name, rc);
        } else {
            *resp = msg;
            st->code = VRPC_OK;
            st->flags = 0;
            st->message[0] = 0;
        }
    } else if (st != &local) {
        *st = s->st;
    }
    resp_md_fill(s, vrpc_rpc_tls_arena());
    if (s->deadline_ns != VRPC_NO_DEADLINE)
        vrpc_timer_cancel(ch->wheel, &s->timer);
    call_metrics(ch, m, code, s->start_ns);
    conn_unref(c); /* before owner_done, see async_done_task */
    vrpc_pending_owner_done(s, gen);
    return code;
}

static __attribute__((noinline, cold)) int bad_call_args(struct vrpc_status *st)
{
    if (st)
        vrpc_status_set(st, VRPC_INVALID_ARGUMENT, "bad arguments to vrpc_call");
    return VRPC_INVALID_ARGUMENT;
}

static __attribute__((noinline, cold)) int on_poller_refused(struct vrpc_status *st)
{
    if (st)
        vrpc_status_set(st, VRPC_FAILED_PRECONDITION,
                        "synchronous call from a handler or callback that runs on a poller: it would block the "
                        "poller (use vrpc_call_async)");
    return VRPC_FAILED_PRECONDITION;
}

int vrpc_call(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
              ProtobufCMessage **resp, const struct vrpc_call_opts *opts, struct vrpc_status *st)
{
    if (!ch || !m || !req || !resp || req->descriptor != m->input)
        return bad_call_args(st);
    if (vrpc_rpc_on_poller)
        return on_poller_refused(st);
    if (ch->lb) /* both tail calls */
        return vrpc_lb_call(ch->lb, m, req, resp, opts, st);
    return vrpc_ch_call(ch, m, req, resp, opts, st);
}

int vrpc_call_async(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                    const struct vrpc_call_opts *opts, vrpc_call_cb cb, void *arg)
{
    struct vrpc_pending_slot *s;
    struct vrpc_status st;

    if (!ch || !m || !req || !cb || req->descriptor != m->input)
        return -EINVAL;
    if (ch->lb)
        return vrpc_lb_call_async(ch->lb, m, req, opts, cb, arg);
    if (opts && opts->peer)
        vrpc_ch_copy_peer(ch, opts);
    if (vrpc_channel_state(ch) == VRPC_CHANNEL_SHUTDOWN)
        return -ESHUTDOWN;
    int code = start_call(ch, m, req, opts, cb, arg, &st, &s);
    if (code == -EAGAIN)
        return -EAGAIN;
    if (code) {
        call_metrics(ch, m, code, 0);
        struct early_fail *e = malloc(sizeof(*e));
        if (!e)
            return -ENOMEM;
        vrpc_task_init(&e->task, early_fail_task);
        e->cb = cb;
        e->arg = arg;
        e->st = st;
        if (vrpc_sched_submit(ch->sched, &e->task)) {
            free(e);
            return -ESHUTDOWN;
        }
    }
    return 0;
}
