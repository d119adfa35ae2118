/* The server's poller side: the frame table (HELLO, REQUEST, DONE, CANCEL),
 * admission of a request and its hand-off to a worker, reading large request
 * payloads, accepting connections within their limit, DISCONNECTED, and the
 * HELLO and idle timeouts' sweep. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/server_internal.h"

static void request_read_done(struct poller *pl, struct vrpc_rndv_in *in, int status);

/* A header-only RESPONSE from the poller (request refused before it got a
 * call object). unread: refused without processing (draining, out of
 * memory, over a limit that may pass), marked VRPC_FF_REFUSED for a client
 * that reads it (VRPC_FEAT_REFUSED) so it may retry anywhere. Never waits:
 * without a send buffer the answer is dropped and logged (the client's
 * deadline covers it). */
static void vrefuse(struct sconn *c, uint64_t id, enum vrpc_code code, bool unread, const char *fmt, va_list ap)
{
    char msg[VRPC_STATUS_MSG_MAX];
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(msg))
        n = sizeof(msg) - 1;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_RESPONSE,
                              .flags = vrpc_srv_refused_flag(c, unread),
                              .status = (uint32_t)code,
                              .request_id = id};
    if (vrpc_srv_conn_send_simple(c, &h, msg, (uint32_t)n, false) == -ENOBUFS &&
        !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
        vrpc_rpc_log("no send buffer to answer %s to a request; answer dropped", vrpc_code_name(code));
}

/* A refusal the client must not retry blindly (the request is wrong here). */
static void refuse(struct sconn *c, uint64_t id, enum vrpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(struct sconn *c, uint64_t id, enum vrpc_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vrefuse(c, id, code, false, fmt, ap);
    va_end(ap);
}

/* A refusal of a request left unread: safe to retry anywhere. */
static void refuse_unread(struct sconn *c, uint64_t id, enum vrpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse_unread(struct sconn *c, uint64_t id, enum vrpc_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vrefuse(c, id, code, true, fmt, ap);
    va_end(ap);
}

/* Poller: the request is complete: arm its deadline and hand it to a worker
 * (or run it here: vrpc_server_run_on_poller). */
static void call_submit(struct poller *pl, struct vrpc_server_call *call, uint32_t gen)
{
    struct vrpc_server *s = pl->s;
    if (call->deadline_ns != VRPC_NO_DEADLINE) {
        __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* the armed timer's */
        vrpc_timer_arm(s->wheel, &call->timer, call->deadline_ns, vrpc_srv_deadline_fired, call, gen);
    }
    __atomic_add_fetch(&s->tasks, 1, __ATOMIC_RELAXED);
    if (call->me->on_poller && !call->req_lb) {
        /* vrpc_server_run_on_poller: the handler runs here, now (the same
         * task a worker would run); nothing it sends waits for a buffer */
        vrpc_rpc_on_poller = true;
        vrpc_srv_call_task(&call->task);
        vrpc_rpc_on_poller = false;
        return;
    }
    if (vrpc_sched_producer_submit(pl->prod, &call->task)) {
        /* The scheduler is shutting down: no handler may run on a poller, so
         * answer here without one. */
        uint64_t id;
        struct sconn *dc = vrpc_srv_call_detach(call, gen, VRPC_UNAVAILABLE, -ECONNRESET, false, &id);
        if (dc) {
            struct vrpc_wire_hdr r = {.version = VRPC_WIRE_VERSION,
                                      .type = VRPC_FT_RESPONSE,
                                      .flags = vrpc_srv_refused_flag(dc, true), /* no handler ran */
                                      .status = VRPC_UNAVAILABLE,
                                      .request_id = id};
            vrpc_srv_conn_send_simple(dc, &r, "server is shutting down", 23, false);
            vrpc_srv_answered(dc);
        }
        vrpc_srv_call_task(&call->task); /* sees DETACHED: only lets go of the call */
    }
}

/* The call object of the REQUEST's slot, ready for a new call: a fresh one
 * if the client reused the id of a detached call whose handler still holds
 * it. NULL when the request is refused (answered or the connection failed). */
static struct vrpc_server_call *request_slot(struct sconn *c, const struct vrpc_wire_hdr *h, uint64_t *stp)
{
    uint32_t slot = vrpc_wire_id_slot(h->request_id);
    if (slot >= c->ncalls) {
        vrpc_srv_conn_protocol_error(c, "request beyond the granted call credits", -EPROTO);
        return NULL;
    }
    struct vrpc_server_call *call = c->calls[slot];
    uint64_t st = __atomic_load_n(&call->state, __ATOMIC_ACQUIRE);
    if ((ST_FLAGS(st) & CALL_RUN) && !(ST_FLAGS(st) & CALL_DETACHED)) {
        vrpc_srv_conn_protocol_error(c, "request id reuses a call still in flight", -EPROTO);
        return NULL;
    }
    if (ST_FLAGS(st) & CALL_RUN) {
        /* The server answered this slot's last call early (its deadline
         * passed) and the client reused the id while the handler still holds
         * the call: the handler keeps that object, the slot gets a new one. */
        struct vrpc_server_call *fresh = vrpc_srv_call_new(c->s, c);
        if (!fresh) {
            refuse_unread(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "server out of memory");
            return NULL;
        }
        c->calls[slot] = fresh;
        vrpc_srv_call_unref(call);
        call = fresh;
        st = __atomic_load_n(&call->state, __ATOMIC_RELAXED);
    }
    if (__atomic_load_n(&c->rsp[slot].state, __ATOMIC_ACQUIRE) == VRPC_RNDV_GRANTED ||
        __atomic_load_n(&c->rsp[slot].parked, __ATOMIC_ACQUIRE)) {
        /* (a parked response has not been sent: the client cannot have it) */
        vrpc_srv_conn_protocol_error(c, "request on a slot whose large response has had no DONE", -EPROTO);
        return NULL;
    }
    *stp = st;
    return call;
}

/* The REQUEST's method, once the request is admitted (descriptor, shutdown,
 * method, size, deadline); NULL when it was refused. */
static struct method_entry *request_admit(struct sconn *c, const struct vrpc_wire_hdr *h, const uint8_t *body,
                                          struct vrpc_wire_desc *desc, int64_t *now)
{
    struct vrpc_server *s = c->s;
    bool rndv = h->flags & VRPC_FF_RNDV;
    if (rndv && ((uint64_t)VRPC_WIRE_HDR_LEN + h->md_len + h->payload_len <= vrpc_ep_eager_size(c->b.ep) ||
                 vrpc_wire_desc_decode(body + h->md_len, h->payload_len, desc))) {
        vrpc_srv_conn_protocol_error(c, "bad rendezvous request (fits a frame, zero key or range overflow)", -EPROTO);
        return NULL;
    }
    if (__atomic_load_n(&c->b.goaway, __ATOMIC_ACQUIRE)) {
        refuse_unread(c, h->request_id, VRPC_UNAVAILABLE, "server is shutting down");
        return NULL;
    }
    struct method_entry *me = vrpc_srv_lookup(s, h->method_id);
    *now = vrpc_now_ns();
    if (!me) {
        refuse(c, h->request_id, VRPC_UNIMPLEMENTED, "unknown method id 0x%08x (not registered on this server)",
               h->method_id);
        return NULL;
    }
    if (!(h->flags & VRPC_FF_STREAM) != !me->sops) {
        refuse(c, h->request_id, VRPC_UNIMPLEMENTED, "method %s is %s", me->m->full_name,
               me->sops ? "streaming" : "unary");
        return NULL;
    }
    uint64_t size = (uint64_t)h->md_len + h->payload_len;
    if (size > s->max_payload) {
        vrpc_srv_record(me, VRPC_RESOURCE_EXHAUSTED, *now);
        refuse(c, h->request_id, VRPC_RESOURCE_EXHAUSTED,
               "request of %llu bytes exceeds the server's limit of %u bytes", (unsigned long long)size,
               s->max_payload);
        return NULL;
    }
    if ((h->flags & VRPC_FF_DEADLINE) && h->budget_us == 0) {
        vrpc_srv_record(me, VRPC_DEADLINE_EXCEEDED, *now);
        refuse(c, h->request_id, VRPC_DEADLINE_EXCEEDED, "deadline already passed on arrival");
        return NULL;
    }
    return me;
}

/* Copy the frame's bytes (metadata, and the message unless large) into the
 * call and decode its metadata: the number of entries, or -1 when the
 * request was refused. */
static int request_copy(struct sconn *c, struct vrpc_server_call *call, const struct vrpc_wire_hdr *h,
                        const uint8_t *body)
{
    uint64_t size = (uint64_t)h->md_len + h->payload_len;
    uint32_t inline_len = (h->flags & VRPC_FF_RNDV) ? h->md_len : (uint32_t)size; /* bytes in this frame */
    if (!call->buf || inline_len > call->cap) {
        /* sized once for the largest eager request: no regrowth later */
        uint32_t fit = vrpc_ep_eager_size(c->b.ep) - VRPC_WIRE_HDR_LEN;
        uint32_t want = inline_len > fit ? inline_len : fit;
        uint8_t *nb = realloc(call->buf, want);
        if (!nb) {
            refuse_unread(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "server out of memory");
            return -1;
        }
        call->buf = nb;
        call->cap = want;
    }
    memcpy(call->buf, body, inline_len);
    if (h->md_len && !call->md && !(call->md = malloc(VRPC_MD_MAX * sizeof(*call->md)))) {
        refuse_unread(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "server out of memory");
        return -1;
    }
    int nmd = h->md_len ? vrpc_wire_md_decode(call->buf, h->md_len, call->md, VRPC_MD_MAX) : 0;
    if (nmd < 0) {
        vrpc_srv_conn_protocol_error(c, "malformed metadata", nmd);
        return -1;
    }
    return nmd;
}

/* A large request: take a large buffer for its payload and fill in the
 * read (not started yet). false when refused. */
static bool request_rndv_prepare(struct sconn *c, struct vrpc_server_call *call, const struct vrpc_wire_hdr *h,
                                 const struct vrpc_wire_desc *desc, struct method_entry *me, int64_t now)
{
    struct vrpc_server *s = c->s;
    char why[VRPC_STATUS_MSG_MAX];
    if (c->rd_pinned + h->payload_len > s->o.max_pinned_per_conn) {
        vrpc_srv_record(me, VRPC_RESOURCE_EXHAUSTED, now);
        refuse_unread(c, h->request_id, VRPC_RESOURCE_EXHAUSTED,
                      "large requests of this connection being read: %.1f MiB of %.1f MiB allowed "
                      "(max_pinned_per_conn), %.1f MiB more asked",
                      (double)c->rd_pinned / (1 << 20), (double)s->o.max_pinned_per_conn / (1 << 20),
                      (double)h->payload_len / (1 << 20));
        return false;
    }
    if (vrpc_rndv_buf(s->tp, s->o.max_pinned, h->payload_len, &call->in.lb, why, sizeof(why))) {
        vrpc_srv_record(me, VRPC_RESOURCE_EXHAUSTED, now);
        refuse_unread(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "%s", why);
        return false;
    }
    call->in.ep = c->b.ep;
    call->in.addr = desc->addr;
    call->in.rkey = desc->rkey;
    call->in.len = h->payload_len;
    call->in.id = h->request_id;
    c->rd_pinned += h->payload_len;
    return true;
}

/* Start reading the large request payload of the call just published (its
 * handler starts from the READ completion). The read's limit counts from
 * now, whatever trickles in: the call's deadline, and the size at
 * min_transfer_rate plus the floor. */
static void request_read_start(struct sconn *c, struct vrpc_server_call *call, uint32_t len, int64_t now, uint32_t gen)
{
    struct vrpc_server *s = c->s;
    int64_t lim = now + ((int64_t)s->o.transfer_floor_ms + (int64_t)len * 1000 / s->o.min_transfer_rate) * 1000000;
    int64_t dl = __atomic_load_n(&call->deadline_ns, __ATOMIC_RELAXED);
    call->xfer_start_ns = now;
    __atomic_store_n(&call->xfer, XFER_READING, __ATOMIC_RELAXED);
    __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* the armed timer's */
    vrpc_timer_arm(s->wheel, &call->xfer_timer, dl < lim ? dl : lim, vrpc_srv_transfer_expired, call, gen);
    int rc = vrpc_rndv_read(&call->in);
    if (rc == -ENOSPC)
        vrpc_rndv_read_later(&c->poller->retry, &call->in);
    else if (rc)
        request_read_done(c->poller, &call->in, rc);
}

static void on_request(struct sconn *c, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_server *s = c->s;
    uint64_t st;
    struct vrpc_wire_desc desc = {0};
    int64_t now;

    struct vrpc_server_call *call = request_slot(c, h, &st);
    if (!call)
        return;
    bool rndv = h->flags & VRPC_FF_RNDV;
    struct method_entry *me = request_admit(c, h, body, &desc, &now);
    if (!me)
        return;
    int nmd = request_copy(c, call, h, body);
    if (nmd < 0)
        return;
    if (rndv && !request_rndv_prepare(c, call, h, &desc, me, now))
        return;
    call->nmd = (size_t)nmd;
    call->len = h->md_len + h->payload_len; /* (within max_payload: request_admit) */
    call->md_len = h->md_len;
    call->method = me->m;
    /* atomic: vrpc_srv_call_detach may read these of an earlier call (see there) */
    __atomic_store_n(&call->me, me, __ATOMIC_RELAXED);
    __atomic_store_n(&call->req_id, h->request_id, __ATOMIC_RELAXED);
    __atomic_store_n(&call->arrival_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&call->deadline_ns,
                     (h->flags & VRPC_FF_DEADLINE)
                         ? (h->budget_us > (uint64_t)(INT64_MAX - now) / 1000 ? VRPC_NO_DEADLINE
                                                                              : now + (int64_t)h->budget_us * 1000)
                         : VRPC_NO_DEADLINE,
                     __ATOMIC_RELAXED);
    uint32_t gen = ST_GEN(st) + 1 ? ST_GEN(st) + 1 : 1;
    if (me->sops && vrpc_srv_stream_open(call, me, h->request_id, gen)) {
        refuse_unread(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "server out of memory");
        return;
    }
    __atomic_store_n(&call->cancelled, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* until the handler answers */
    __atomic_add_fetch(&c->b.refs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->inflight, 1, __ATOMIC_RELAXED);
    /* release: the fields above are visible to whoever sees RUN */
    __atomic_store_n(&call->state, ST_WORD(gen, CALL_RUN), __ATOMIC_RELEASE);
    if (me->sops) {
        vrpc_srv_stream_go(c->poller, call, gen);
        return;
    }
    vrpc_task_init(&call->task, vrpc_srv_call_task);
    if (rndv)
        request_read_start(c, call, h->payload_len, now, gen);
    else
        call_submit(c->poller, call, gen);
}

/* ---- large messages: the server's side of the rendezvous ------------------ */

/* Release a call that will never be answered (its connection is failing and
 * its request payload could not be read): no RESPONSE goes out. */
static void abandon_call(struct vrpc_server_call *call)
{
    uint64_t st = __atomic_load_n(&call->state, __ATOMIC_ACQUIRE);
    struct sconn *dc = vrpc_srv_call_detach(call, ST_GEN(st), VRPC_UNAVAILABLE, -ECONNRESET, false, NULL);
    if (dc) /* else already detached by the connection's loss */
        vrpc_srv_answered(dc);
    vrpc_srv_call_claim(call); /* no handler will: let go of the call here */
}

/* Poller: the read of a request payload finished (or could not start). On
 * success: DONE to the client, then the handler as for an eager request. */
static void request_read_done(struct poller *pl, struct vrpc_rndv_in *in, int status)
{
    struct vrpc_server_call *call = container_of(in, struct vrpc_server_call, in);
    if (call->st && vrpc_srv_stream_read_done(call, status))
        return;
    struct sconn *c = call->conn;
    struct vrpc_buf *lb = in->lb;
    in->lb = NULL;
    c->rd_pinned -= in->len;
    uint32_t want = XFER_READING;
    if (__atomic_compare_exchange_n(&call->xfer, &want, XFER_NONE, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        if (vrpc_timer_cancel(c->s->wheel, &call->xfer_timer))
            vrpc_srv_call_unref(call); /* else the firing timer sees XFER_NONE and lets go */
    } else {
        /* Too late: the limit answers the call and fails c. Let it finish
         * deciding (a few non-blocking steps on the wheel's thread) before
         * this completion lets go of the call. */
        while (__atomic_load_n(&call->xfer, __ATOMIC_ACQUIRE) != XFER_EXPIRED)
            sched_yield();
        if (!status)
            status = -ETIMEDOUT;
    }
    if (status) {
        vrpc_lbuf_put(lb);
        if (status == -EACCES && want == XFER_READING)
            vrpc_srv_conn_protocol_error(c, "its large-request descriptor could not be read (bad key or range)",
                                         -EPROTO);
        abandon_call(call);
        return;
    }
    call->req_lb = lb;
    if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_DONE, .request_id = in->id};
        int rc = vrpc_srv_conn_send_simple(c, &h, NULL, 0, false);
        if (rc && rc != -ENOTCONN && !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
            vrpc_srv_conn_protocol_error(
                c, "no send buffer or credit for DONE (closing rather than holding the client)", rc);
    }
    call_submit(pl, call, ST_GEN(__atomic_load_n(&call->state, __ATOMIC_ACQUIRE)));
}

static void request_read_failed(struct vrpc_rndv_in *in, int rc, void *arg) { request_read_done(arg, in, rc); }

/* DONE from the client: it has read (or given up on) our response payload. */
static void on_done(struct sconn *c, const struct vrpc_wire_hdr *h)
{
    uint32_t slot = vrpc_wire_id_slot(h->request_id);
    struct vrpc_rndv_out *o = slot < c->ncalls ? &c->rsp[slot] : NULL;
    if (o && !vrpc_offer_granted(o, h->request_id) && vrpc_srv_stream_on_done(c, h))
        return;
    if (!o || !vrpc_offer_granted(o, h->request_id)) {
        vrpc_srv_conn_protocol_error(c, "DONE for a response with no payload outstanding", -EPROTO);
        return;
    }
    vrpc_offer_revoke(&c->poller->retry, o, "response");
}

static void on_cancel(struct sconn *c, uint64_t id)
{
    uint32_t slot = vrpc_wire_id_slot(id);
    if (slot >= c->ncalls)
        return;
    struct vrpc_server_call *call = c->calls[slot];
    /* req_id is written by this poller thread only, so reading it is safe;
     * RUN tells whether it is still the call in flight */
    uint64_t st = __atomic_load_n(&call->state, __ATOMIC_ACQUIRE);
    if (!(ST_FLAGS(st) & CALL_RUN) || call->req_id != id)
        return;
    /* A stream is cancelled by its detach, which sets cancelled only once it
     * has won: a writer that sees the flag and gives up must find finish
     * losing the claim (-ECONNRESET), not winning it before the detach
     * (finish returned 0 and on_cancel never ran). A unary handler only
     * polls the flag. */
    if (call->me->sops)
        vrpc_srv_stream_cancel(call, ST_GEN(st));
    else
        __atomic_store_n(&call->cancelled, 1, __ATOMIC_RELEASE);
}

static void on_hello(struct sconn *c, const struct vrpc_wire_hdr *h, const uint8_t *payload)
{
    struct vrpc_server *s = c->s;
    struct vrpc_wire_hello hs;
    if (vrpc_wire_hello_decode(payload, h->payload_len, &hs)) {
        vrpc_srv_conn_protocol_error(c, "malformed HELLO", -EPROTO);
        return;
    }
    vrpc_conn_hello_apply(&c->b, &hs);
    c->peer_window = hs.stream_window;
    c->calls = calloc(s->o.max_concurrent, sizeof(*c->calls));
    c->rsp = calloc(s->o.max_concurrent, sizeof(*c->rsp));
    if (!c->calls || !c->rsp) {
        vrpc_srv_conn_protocol_error(c, "out of memory for the call table", -ENOMEM);
        return;
    }
    for (c->ncalls = 0; c->ncalls < s->o.max_concurrent; c->ncalls++) {
        if (!(c->calls[c->ncalls] = vrpc_srv_call_new(s, c))) {
            vrpc_srv_conn_protocol_error(c, "out of memory for the call table", -ENOMEM);
            return;
        }
    }
    vrpc_conn_hello_end(&c->b, VRPC_CONN_HELLO_OK);
    struct vrpc_wire_hdr a = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO_ACK};
    uint8_t p[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello ack = {.max_msg_size = s->max_payload,
                                  .max_concurrent = c->ncalls,
                                  .features = vrpc_rndv_features | VRPC_FEAT_STREAM | VRPC_FEAT_REFUSED,
                                  .stream_window = s->o.stream_window};
    vrpc_wire_hello_encode(p, &ack);
    if (vrpc_srv_conn_send_simple(c, &a, p, sizeof(p), false))
        vrpc_srv_conn_protocol_error(c, "cannot send HELLO_ACK", -ENOBUFS);
}

/* ---- the server's frame table (rpc/conn.h): poller thread --------------- */

static struct sconn *server_conn(struct vrpc_conn_base *b) { return container_of(b, struct sconn, b); }

static void server_protocol_error(struct vrpc_conn_base *b, const char *what, int rc)
{
    vrpc_srv_conn_protocol_error(server_conn(b), what, rc);
}

static void server_on_hello(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct sconn *c = server_conn(b);
    __atomic_store_n(&c->hello_seen, 1, __ATOMIC_RELEASE);
    on_hello(c, h, body);
}

static void server_on_request(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct sconn *c = server_conn(b);
    /* (one writer, the poller: the sweep only compares it) */
    __atomic_store_n(&c->calls_seen, c->calls_seen + 1, __ATOMIC_RELAXED);
    if ((h->flags & VRPC_FF_RNDV) && !c->b.large) {
        vrpc_srv_conn_protocol_error(c, "large-message request on a connection without large messages", -EPROTO);
        return;
    }
    on_request(c, h, body);
}

static void server_on_done(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    (void)body;
    on_done(server_conn(b), h);
}

static void server_on_cancel(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    (void)body;
    on_cancel(server_conn(b), h->request_id);
}

static void server_on_message(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    vrpc_srv_stream_on_message(server_conn(b), h, body);
}

static void server_on_half_close(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    (void)body;
    vrpc_srv_stream_on_half_close(server_conn(b), h);
}

static void server_on_window(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    vrpc_srv_stream_on_window(server_conn(b), h, body);
}

static const struct vrpc_conn_role server_role = {
    .hello_type = VRPC_FT_HELLO,
    .before_hello = "first frame is not HELLO",
    .bad_type = "frame type a client must not send",
    .on_hello = server_on_hello,
    .protocol_error = server_protocol_error,
    .on_frame =
        {
            [VRPC_FT_REQUEST] = server_on_request,
            [VRPC_FT_DONE] = server_on_done,
            [VRPC_FT_CANCEL] = server_on_cancel,
            [VRPC_FT_MESSAGE] = server_on_message,
            [VRPC_FT_HALF_CLOSE] = server_on_half_close,
            [VRPC_FT_WINDOW] = server_on_window,
        },
};

static void on_disconnected(struct sconn *c)
{
    struct vrpc_server *s = c->s;
    __atomic_store_n(&c->b.dead, 1, __ATOMIC_RELEASE);
    /* Nobody can be answered any more: detach every call still in flight, so
     * that the connection (and a server being destroyed) need not wait for
     * handlers that answer late or never. Their later answer returns
     * -ECONNRESET and touches nothing but the call object. */
    for (uint32_t i = 0; i < c->ncalls; i++) {
        struct vrpc_server_call *call = c->calls[i];
        uint64_t st = __atomic_load_n(&call->state, __ATOMIC_ACQUIRE);
        if (ST_FLAGS(st) != CALL_RUN)
            continue;
        struct sconn *dc = vrpc_srv_call_detach(call, ST_GEN(st), VRPC_UNAVAILABLE, -ECONNRESET, false, NULL);
        if (dc)
            vrpc_srv_answered(dc);
    }
    pthread_mutex_lock(&s->lock);
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->b.gone = true; /* no grant starts on it from here on (respond_large) */
    pthread_mutex_unlock(&s->lock);
    c->poller->nconns--;
    /* Its keys died with it: reads waiting to start fail, grants not
     * revoked give their buffers back. */
    vrpc_rndv_retry_forget(&c->poller->retry, c->b.ep, request_read_failed, c->poller);
    for (uint32_t i = 0; c->rsp && i < c->ncalls; i++) {
        if (__atomic_load_n(&c->rsp[i].state, __ATOMIC_ACQUIRE) == VRPC_RNDV_GRANTED) {
            vrpc_timer_cancel(s->wheel, &c->rsp[i].hold_timer);
            if (vrpc_offer_drop(&c->poller->offers, &c->rsp[i], c->b.ep, NULL))
                vrpc_srv_sconn_unref(c); /* the grant's reference */
        }
    }
    vrpc_srv_stream_conn_lost(c);
    vrpc_srv_sconn_unref(c); /* the endpoint's reference */
}

/* Keep RECV_PER_CONN posted receive buffers per connection of the poller
 * beyond the base SERVER_RECV_BUFS, so that what the transport reserves for
 * connections (and the growth of busy ones' reservations) never leaves a new
 * connection below max_connections without buffers (transport.h, "Credits").
 * Posted buffers are never taken back: after a peak of connections the
 * memory stays for the next one (at most max_connections x RECV_PER_CONN x
 * the eager size). Poller thread; allocates only when a new peak needs it. */
static void recv_grow(struct poller *pl)
{
    struct vrpc_server *s = pl->s;
    uint32_t want = pl->nconns * RECV_PER_CONN, bound = s->o.max_connections * RECV_PER_CONN;
    if (want > bound)
        want = bound;
    while (pl->extra < want) {
        struct vrpc_buf *b = NULL;
        for (uint32_t i = pl->ngrow; i > 0 && !b; i--)
            b = vrpc_pool_get(pl->grow[i - 1]);
        if (!b) {
            struct vrpc_pool *np;
            if (pl->ngrow == pl->capgrow) {
                uint32_t cap = pl->capgrow ? pl->capgrow * 2 : 8;
                struct vrpc_pool **g = realloc(pl->grow, cap * sizeof(*g));
                if (!g)
                    break;
                pl->grow = g;
                pl->capgrow = cap;
            }
            if (vrpc_pool_create(s->tp, vrpc_transport_eager_size(s->tp), RECV_CHUNK, &np))
                break;
            pl->grow[pl->ngrow++] = np;
            continue;
        }
        if (vrpc_cq_post_recv(pl->cq, &b, NULL, 1)) {
            vrpc_pool_put(b);
            break;
        }
        pl->extra++;
    }
    if (pl->extra < want)
        vrpc_rpc_log("cannot post more receive buffers (%u of %u for %u connections): new connections may "
                     "be refused",
                     pl->extra, want, pl->nconns);
}

static void on_accepted(struct poller *pl, struct vrpc_ep *ep)
{
    struct vrpc_server *s = pl->s;
    struct sconn *c = calloc(1, sizeof(*c));
    if (!c) {
        vrpc_rpc_log("out of memory accepting a connection; closing it");
        vrpc_ep_destroy(ep);
        return;
    }
    pl->nconns++;
    recv_grow(pl);
    c->s = s;
    c->b.ep = ep;
    c->poller = pl;
    c->b.refs = 1;
    c->accepted_ns = c->sweep_ns = vrpc_now_ns();
    vrpc_ep_set_user(ep, c);
    __atomic_add_fetch(&s->nconns, 1, __ATOMIC_RELAXED);
    /* (freed on its DISCONNECTED, which decrements pl->nconns) */
    pthread_mutex_lock(&s->lock);
    c->next = s->conns.next;
    c->prev = &s->conns;
    s->conns.next->prev = c;
    s->conns.next = c;
    bool shutting = __atomic_load_n(&s->shutting, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&s->lock);
    if (shutting) {
        __atomic_store_n(&c->b.dead, 1, __ATOMIC_RELEASE);
        vrpc_ep_close(ep);
    }
}

void vrpc_srv_cq_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct poller *pl = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        switch (w->opcode) {
        case VRPC_WC_RECV:
            if (w->status == 0 && w->ep)
                vrpc_conn_recv(&server_role, &((struct sconn *)vrpc_ep_user(w->ep))->b, w->buf->data, w->byte_len);
            if (w->status == -ECANCELED || vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_SEND:
            vrpc_pool_put(w->buf);
            if (w->ep && vrpc_ep_user(w->ep))
                vrpc_srv_conn_sent(vrpc_ep_user(w->ep));
            break;
        case VRPC_WC_READ:
            request_read_done(pl, (struct vrpc_rndv_in *)(uintptr_t)w->wr_id, w->status);
            break;
        case VRPC_WC_REVOKE: {
            struct vrpc_rndv_out *o = (struct vrpc_rndv_out *)(uintptr_t)w->wr_id;
            struct sconn *c = vrpc_ep_user(o->ep);
            /* under s->lock: the hold timer looks grants up there */
            vrpc_offer_revoked(&pl->offers, c->s->wheel, o);
            if (vrpc_srv_stream_is_offer(c, o))
                vrpc_srv_stream_offer_revoked(o);
            vrpc_srv_sconn_unref(c); /* the grant's reference */
            break;
        }
        case VRPC_WC_ACCEPTED:
            on_accepted(pl, w->ep);
            break;
        case VRPC_WC_DISCONNECTED:
            on_disconnected(vrpc_ep_user(w->ep));
            break;
        default:
            break;
        }
    }
    if (pl->retry.reads || pl->retry.revokes)
        vrpc_rndv_retry_run(&pl->retry, request_read_failed, pl);
    if (vrpc_offer_any_parked(&pl->offers))
        vrpc_offer_run(&pl->offers, VRPC_SEND_POLLER);
}

/* ---- connection lifecycle: HELLO and idle timeouts --------------------------- */

/* On the timer wheel's thread every sweep_every_ns: a connection that has not
 * sent its RPC HELLO within hello_timeout_ms of being accepted is closed; one
 * that had no call in flight (nothing holding it: refs == 1, the endpoint's)
 * and received no request for idle_timeout_ms gets GOAWAY and is closed
 * (gRPC's max_connection_idle; a channel reconnects on its next call). Both
 * are logged. Connections leave s->conns (under s->lock) before they are
 * freed, so every one seen here is alive. Up to one period late. */
void vrpc_srv_conn_sweep(void *ctx, uint64_t arg)
{
    struct vrpc_server *s = ctx;
    (void)arg;
    if (__atomic_load_n(&s->shutting, __ATOMIC_ACQUIRE))
        return;
    int64_t now = vrpc_now_ns(), hello = (int64_t)s->o.hello_timeout_ms * 1000000;
    int64_t idle = s->o.idle_timeout_ms == VRPC_SERVER_NO_IDLE_TIMEOUT ? 0 : (int64_t)s->o.idle_timeout_ms * 1000000;
    struct vrpc_wire_hdr g = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_GOAWAY};
    static const char why[] = "idle connection";
    char peer[2][VRPC_URI_MAX] = {"?", "?"};
    unsigned nhello = 0, nidle = 0; /* one log line each per sweep, naming the first */
    pthread_mutex_lock(&s->lock);
    for (struct sconn *c = s->conns.next; c != &s->conns; c = c->next) {
        if (__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
            continue;
        if (!__atomic_load_n(&c->hello_seen, __ATOMIC_ACQUIRE)) {
            if (now - c->accepted_ns <= hello || __atomic_exchange_n(&c->b.dead, 1, __ATOMIC_ACQ_REL))
                continue;
            if (!nhello++)
                vrpc_ep_peer_uri(c->b.ep, peer[0], sizeof(peer[0]));
            vrpc_ep_abort(c->b.ep, -ECONNABORTED); /* it holds its reservation, nothing to finish */
            continue;
        }
        uint32_t calls = __atomic_load_n(&c->calls_seen, __ATOMIC_RELAXED);
        if (!idle || __atomic_load_n(&c->b.refs, __ATOMIC_ACQUIRE) > 1 || calls != c->sweep_calls) {
            c->sweep_calls = calls;
            c->sweep_ns = now;
            continue;
        }
        if (now - c->sweep_ns <= idle || __atomic_exchange_n(&c->b.goaway, 1, __ATOMIC_ACQ_REL))
            continue;
        if (!nidle++)
            vrpc_ep_peer_uri(c->b.ep, peer[1], sizeof(peer[1]));
        vrpc_rpc_send_simple(c->b.ep, s->send_pool, &g, why, sizeof(why) - 1, false);
        __atomic_store_n(&c->b.dead, 1, __ATOMIC_RELEASE);
        vrpc_ep_close(c->b.ep);
    }
    pthread_mutex_unlock(&s->lock);
    if (nhello)
        vrpc_rpc_log("aborting %u connection%s that sent no HELLO within %u ms (hello_timeout_ms), client %s%s", nhello,
                     nhello == 1 ? "" : "s", s->o.hello_timeout_ms, peer[0], nhello > 1 ? " and others" : "");
    if (nidle)
        vrpc_rpc_log("GOAWAY and closing %u connection%s with no call for %u ms (idle_timeout_ms), client %s%s", nidle,
                     nidle == 1 ? "" : "s", s->o.idle_timeout_ms, peer[1], nidle > 1 ? " and others" : "");
    vrpc_timer_arm(s->wheel, &s->sweep, now + s->sweep_every_ns, vrpc_srv_conn_sweep, s, 0);
}
