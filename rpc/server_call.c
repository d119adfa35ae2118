/* A server call's life: its object and state word, the race between the
 * handler's answer and the server's (deadline, connection loss), the worker
 * task that runs the handler, answering (vrpc_server_call_respond / _fail),
 * large responses through the offer machine with their hold timer, and the
 * handler's accessors. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/pbutil.h"
#include "rpc/server_internal.h"
#include "rpc/status.h"

struct vrpc_server_call *vrpc_srv_call_new(struct vrpc_server *s, struct sconn *c)
{
    struct vrpc_server_call *call = calloc(1, sizeof(*call));
    if (!call)
        return NULL;
    call->s = s;
    call->conn = c;
    call->refs = 1; /* the slot table's */
    call->state = ST_WORD(1, 0);
    /* decoded messages are rarely more than twice their encoding; the first
     * block fits an eager request, large ones grow it */
    vrpc_arena_init(&call->arena, (size_t)vrpc_ep_eager_size(c->b.ep) * 2 + 4096, (size_t)s->max_payload * 8 + 65536);
    return call;
}

/* Touches nothing but the object: the last reference may be dropped by a
 * handler answering after its server was destroyed. */
void vrpc_srv_call_unref(struct vrpc_server_call *call)
{
    if (!call || __atomic_sub_fetch(&call->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    vrpc_lbuf_put(call->req_lb);
    vrpc_srv_stream_free(call->st);
    free(call->initial);
    free(call->trailers);
    free(call->buf);
    free(call->md);
    vrpc_arena_fini(&call->arena);
    free(call);
}

/* Decide the call's outcome for the server, not its handler (deadline passed,
 * connection lost): exactly one of this and the handler's claim wins. On a
 * win the call no longer holds its connection: returns it, still referenced,
 * so the caller can send the status, then calls vrpc_srv_answered(); *id is the call's
 * request id. NULL: lost. by_timer: called by the call's own deadline timer
 * (otherwise an armed timer is cancelled here). */
struct sconn *vrpc_srv_call_detach(struct vrpc_server_call *call, uint32_t gen, enum vrpc_code code, int rc,
                                   bool by_timer, uint64_t *id)
{
    uint64_t w = ST_WORD(gen, CALL_RUN);
    /* Read before the CAS: once it publishes the detach, the handler may let
     * go and the poller reuse the object. The reads are atomic because they
     * may meet the poller's writes for a later call; the CAS then fails. */
    struct sconn *c = call->conn; /* never changes */
    uint64_t rid = __atomic_load_n(&call->req_id, __ATOMIC_RELAXED);
    struct method_entry *me = __atomic_load_n(&call->me, __ATOMIC_RELAXED);
    int64_t arrival = __atomic_load_n(&call->arrival_ns, __ATOMIC_RELAXED);
    int64_t deadline = __atomic_load_n(&call->deadline_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&call->detach_rc, rc, __ATOMIC_RELAXED); /* read after DETACHED is seen */
    if (!__atomic_compare_exchange_n(&call->state, &w, ST_WORD(gen, CALL_RUN | CALL_DECIDED | CALL_DETACHED), false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return NULL;
    __atomic_store_n(&call->cancelled, 1, __ATOMIC_RELEASE);
    vrpc_srv_record(me, code, arrival);
    /* The call stays RUN until its handler lets go, so the timer cannot be
     * re-armed meanwhile: cancelling here is safe. */
    if (!by_timer && deadline != VRPC_NO_DEADLINE && vrpc_timer_cancel(c->s->wheel, &call->timer))
        vrpc_srv_call_unref(call);
    if (id)
        *id = rid;
    if (call->st)
        vrpc_srv_stream_detached(call, gen);
    return c;
}

/* ---- unary response metadata --------------------------------------------------- */

/* The call's answer is decided: its response metadata goes (no allocation
 * unless the handler set some). */
static void md_reset(struct vrpc_server_call *call)
{
    free(call->initial);
    free(call->trailers);
    call->initial = call->trailers = NULL;
    call->initial_len = call->trailers_len = 0;
    call->md_flags = 0;
}

static int md_store(struct vrpc_server_call *call, uint32_t flag, const struct vrpc_metadata *md, size_t n)
{
    if (!call)
        return -EINVAL;
    if (call->md_flags & flag)
        return -EALREADY;
    long sz = vrpc_wire_md_size(md, n);
    /* (must fit one frame of any connection, with room for a status message) */
    if (sz < 0 || sz > (long)(VRPC_EAGER_MIN - VRPC_WIRE_HDR_LEN - VRPC_STATUS_MSG_MAX - VRPC_WIRE_DESC_LEN))
        return -EINVAL;
    uint8_t *b = malloc(sz ? (size_t)sz : 1);
    if (!b)
        return -ENOMEM;
    vrpc_wire_md_encode(b, md, n);
    if (flag == CALL_MD_INITIAL)
        call->initial = b, call->initial_len = (uint32_t)sz;
    else
        call->trailers = b, call->trailers_len = (uint32_t)sz;
    call->md_flags |= flag;
    return 0;
}

int vrpc_server_call_send_metadata(struct vrpc_server_call *call, const struct vrpc_metadata *md, size_t n)
{
    return md_store(call, CALL_MD_INITIAL, md, n);
}

int vrpc_server_call_set_trailers(struct vrpc_server_call *call, const struct vrpc_metadata *md, size_t n)
{
    return md_store(call, CALL_MD_TRAILERS, md, n);
}

/* Claimed, before the RESPONSE: the HEADERS frame of the initial metadata. */
static void md_send_initial(struct vrpc_server_call *call, struct sconn *c, uint64_t id)
{
    struct vrpc_buf *b;
    if (!(call->md_flags & CALL_MD_INITIAL) || vrpc_conn_is_dead(&c->b) || !(b = vrpc_srv_conn_buf(c, true)))
        return;
    struct vrpc_wire_hdr h = {
        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_HEADERS, .request_id = id, .md_len = call->initial_len};
    vrpc_wire_hdr_encode(b->data, &h);
    memcpy(b->data + VRPC_WIRE_HDR_LEN, call->initial, call->initial_len);
    vrpc_srv_conn_send(c, b, VRPC_WIRE_HDR_LEN + call->initial_len);
}

/* ---- calls: worker side ----------------------------------------------------- */

/* After the call's outcome went to the transport (or could not): one call
 * fewer in flight (the drain in vrpc_server_shutdown closes connections only
 * after this), and the call's hold on its connection ends. */
void vrpc_srv_answered(struct sconn *c)
{
    struct vrpc_server *s = c->s;
    if (__atomic_sub_fetch(&s->inflight, 1, __ATOMIC_ACQ_REL) == 0 && __atomic_load_n(&s->shutting, __ATOMIC_ACQUIRE))
        vrpc_futex_wake_all(&s->inflight);
    vrpc_srv_sconn_unref(c);
}

/* The handler's side of the race with vrpc_srv_call_detach. 0: the handler decides the
 * outcome (the caller answers, then finish_call). Otherwise the server has
 * already answered for it (deadline) or its connection is gone: the handler's
 * hold on the call ends here and the detach reason is returned (-ETIMEDOUT,
 * -ECONNRESET); only the call object is touched, so this is safe after the
 * server was destroyed. -EINVAL: answered twice. */
int vrpc_srv_call_claim(struct vrpc_server_call *call)
{
    uint64_t w = __atomic_load_n(&call->state, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t f = ST_FLAGS(w);
        if (!(f & CALL_RUN) || (f & CALL_DECIDED && !(f & CALL_DETACHED)))
            return -EINVAL;
        if (f & CALL_DETACHED) {
            int rc = __atomic_load_n(&call->detach_rc, __ATOMIC_RELAXED);
            vrpc_arena_reset(&call->arena); /* the handler is done with req */
            if (call->md_flags)
                md_reset(call);
            /* release: the poller may reuse the object (if it is still in its
             * slot) once it sees RUN cleared */
            __atomic_store_n(&call->state, ST_WORD(ST_GEN(w), 0), __ATOMIC_RELEASE);
            vrpc_srv_call_unref(call);
            return rc;
        }
        if (__atomic_compare_exchange_n(&call->state, &w, w | CALL_DECIDED, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 0;
    }
}

/* After a successful claim, once the response is packed: release the call
 * object (before the response is sent, so the client may reuse the slot the
 * moment it sees the response). Returns the connection, still referenced:
 * the caller sends, then calls vrpc_srv_answered(). */
static struct sconn *finish_call_norecord(struct vrpc_server_call *call)
{
    struct sconn *c = call->conn;
    if (call->deadline_ns != VRPC_NO_DEADLINE && vrpc_timer_cancel(call->s->wheel, &call->timer))
        vrpc_srv_call_unref(call); /* not armed any more: the timer's reference (the object keeps the slot's) */
    vrpc_arena_reset(&call->arena);
    if (call->md_flags)
        md_reset(call);
    uint64_t w = __atomic_load_n(&call->state, __ATOMIC_RELAXED);
    __atomic_store_n(&call->state, ST_WORD(ST_GEN(w), 0), __ATOMIC_RELEASE);
    vrpc_srv_call_unref(call); /* the handler's; the slot table keeps the object */
    return c;
}

static struct sconn *finish_call(struct vrpc_server_call *call, enum vrpc_code code)
{
    vrpc_srv_record(call->me, code, call->arrival_ns);
    return finish_call_norecord(call);
}

struct sconn *vrpc_srv_finish_call(struct vrpc_server_call *call, enum vrpc_code code)
{
    return finish_call(call, code);
}

void vrpc_srv_end_detached(struct sconn *c, uint64_t id, enum vrpc_code code, const char *msg)
{
    if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
        struct vrpc_wire_hdr h = {
            .version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE, .status = (uint32_t)code, .request_id = id};
        vrpc_srv_conn_send_simple(c, &h, msg, msg ? (uint32_t)strlen(msg) : 0, false);
    }
    vrpc_srv_answered(c);
}

/* answer_status for a call with response metadata: HEADERS, then the
 * RESPONSE with the trailers (both built before the call is released). */
static int answer_status_md(struct vrpc_server_call *call, enum vrpc_code code, const char *msg)
{
    uint64_t id = call->req_id;
    struct sconn *c = call->conn;
    struct vrpc_buf *b = NULL;
    uint32_t len = 0, tl = call->trailers_len;
    if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
        md_send_initial(call, c, id);
        b = vrpc_srv_conn_buf(c, true);
    }
    if (b) {
        uint32_t ml = msg ? (uint32_t)strnlen(msg, VRPC_STATUS_MSG_MAX - 1) : 0;
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                                  .type = VRPC_FT_RESPONSE,
                                  .status = (uint32_t)code,
                                  .request_id = id,
                                  .md_len = tl,
                                  .payload_len = ml};
        vrpc_wire_hdr_encode(b->data, &h);
        memcpy(b->data + VRPC_WIRE_HDR_LEN, call->trailers, tl);
        memcpy(b->data + VRPC_WIRE_HDR_LEN + tl, msg, ml);
        len = VRPC_WIRE_HDR_LEN + tl + ml;
    }
    finish_call(call, code);
    int rc = b ? (vrpc_srv_conn_send(c, b, len) ? -ECONNRESET : 0) : -ECONNRESET;
    vrpc_srv_answered(c);
    return rc;
}

/* Claimed: answer with a status and no message body. */
static int answer_status(struct vrpc_server_call *call, enum vrpc_code code, const char *msg)
{
    if (call->md_flags)
        return answer_status_md(call, code, msg);
    uint64_t id = call->req_id;
    struct sconn *c = finish_call(call, code);
    int rc = -ECONNRESET;
    if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
        struct vrpc_wire_hdr h = {
            .version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE, .status = (uint32_t)code, .request_id = id};
        rc = vrpc_srv_conn_send_simple(c, &h, msg, msg ? (uint32_t)strlen(msg) : 0, true);
        if (rc)
            rc = -ECONNRESET;
    }
    vrpc_srv_answered(c);
    return rc;
}

/* The call's deadline passed while its handler runs (wheel thread): answer
 * DEADLINE_EXCEEDED for the handler, which sees the call cancelled and whose
 * late answer is dropped (-ETIMEDOUT). The client has timed out locally by
 * now; this answer frees its slot and credit. */
void vrpc_srv_deadline_fired(void *ctx, uint64_t gen)
{
    struct vrpc_server_call *call = ctx;
    uint64_t id;
    struct sconn *c = vrpc_srv_call_detach(call, (uint32_t)gen, VRPC_DEADLINE_EXCEEDED, -ETIMEDOUT, true, &id);
    static const char msg[] = "deadline exceeded while the handler ran";
    if (c && !vrpc_srv_stream_hold_end(call, (uint32_t)gen, c, id, VRPC_DEADLINE_EXCEEDED, msg)) {
        if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
            struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                                      .type = VRPC_FT_RESPONSE,
                                      .status = VRPC_DEADLINE_EXCEEDED,
                                      .request_id = id};
            vrpc_srv_conn_send_simple(c, &h, msg, sizeof(msg) - 1, true);
        }
        vrpc_srv_answered(c);
    }
    vrpc_srv_call_unref(call); /* the timer's reference */
}

/* The wheel's thread: a large request's read is not over at its limit (see
 * on_request). The call is answered for it, and its connection failed: only
 * that ends the read, and the buffer comes back at the read's (flushed)
 * completion. */
void vrpc_srv_transfer_expired(void *ctx, uint64_t gen)
{
    struct vrpc_server_call *call = ctx;
    uint32_t want = XFER_READING;
    if (!__atomic_compare_exchange_n(&call->xfer, &want, XFER_EXPIRING, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        vrpc_srv_call_unref(call); /* the read finished first; the timer's reference */
        return;
    }
    int64_t now = vrpc_now_ns();
    int64_t dl = __atomic_load_n(&call->deadline_ns, __ATOMIC_RELAXED);
    long long ms = (long long)((now - call->xfer_start_ns) / 1000000);
    uint32_t len = call->in.len;
    bool late = dl != VRPC_NO_DEADLINE && now >= dl;
    enum vrpc_code code = late ? VRPC_DEADLINE_EXCEEDED : VRPC_RESOURCE_EXHAUSTED;
    uint64_t id;
    struct sconn *c = vrpc_srv_call_detach(call, (uint32_t)gen, code, -ECONNRESET, false, &id);
    if (c) {
        char msg[VRPC_STATUS_MSG_MAX];
        if (late)
            snprintf(msg, sizeof(msg), "deadline passed while the %u-byte request was being read", len);
        else
            snprintf(msg, sizeof(msg),
                     "large transfer too slow: %u bytes not read in %lld ms (min_transfer_rate "
                     "%u B/s, transfer_floor_ms %u)",
                     len, ms, c->s->o.min_transfer_rate, c->s->o.transfer_floor_ms);
        struct vrpc_wire_hdr h = {
            .version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE, .status = (uint32_t)code, .request_id = id};
        if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
            vrpc_srv_conn_send_simple(c, &h, msg, (uint32_t)strlen(msg), false);
        vrpc_srv_conn_fail(c, "large transfer too slow: %u bytes in %lld ms%s", len, ms,
                           late ? " (the call's deadline passed)" : "");
        vrpc_srv_answered(c);
    }
    /* release: the read's completion may now let go of the call */
    __atomic_store_n(&call->xfer, XFER_EXPIRED, __ATOMIC_RELEASE);
    vrpc_srv_call_unref(call); /* the timer's reference */
}

void vrpc_srv_call_task(struct vrpc_task *t)
{
    struct vrpc_server_call *call = container_of(t, struct vrpc_server_call, task);
    struct vrpc_server *s = call->s;
    ProtobufCMessage *req;
    int rc;

    /* a large request's payload is in req_lb until unpacked: then the
     * call's arena holds it (or it goes back) */
    struct vrpc_buf *lb = call->req_lb;
    call->req_lb = NULL;
    /* Checked first: a detached call's connection (and, at destroy, its
     * server's queues) may be gone, and no handler runs for it. */
    if (ST_FLAGS(__atomic_load_n(&call->state, __ATOMIC_ACQUIRE)) & CALL_DETACHED) {
        vrpc_lbuf_put(lb);
        vrpc_srv_call_claim(call);
        goto out;
    }
    if (__atomic_load_n(&call->cancelled, __ATOMIC_ACQUIRE)) {
        vrpc_lbuf_put(lb);
        if (vrpc_srv_call_claim(call) == 0)
            answer_status(call, VRPC_CANCELLED, "cancelled by the client");
        goto out;
    }
    if (call->deadline_ns != VRPC_NO_DEADLINE && vrpc_now_ns() >= call->deadline_ns) {
        vrpc_lbuf_put(lb);
        if (vrpc_srv_call_claim(call) == 0)
            answer_status(call, VRPC_DEADLINE_EXCEEDED, "deadline passed before the handler started");
        goto out;
    }
    if (lb) {
        /* big bytes values stay in the large buffer: the arena keeps it
         * until the call is answered (finish_call / vrpc_srv_call_claim reset it) */
        rc = vrpc_pb_unpack_ref(call->method->input, lb->data, call->len - call->md_len, s->o.max_depth, &call->arena,
                                &req);
        if (rc)
            vrpc_lbuf_put(lb);
        else
            vrpc_arena_hold(&call->arena, lb);
    } else {
        rc = vrpc_pb_unpack(call->method->input, call->buf + call->md_len, call->len - call->md_len, s->o.max_depth,
                            &call->arena, &req);
    }
    if (rc) {
        char msg[VRPC_STATUS_MSG_MAX];
        snprintf(msg, sizeof(msg), "request does not decode as %s: %s", call->method->input->name,
                 rc == -ELOOP    ? "nested too deeply"
                 : rc == -ENOMEM ? "too large when decoded"
                                 : "malformed");
        if (vrpc_srv_call_claim(call) == 0)
            answer_status(call, VRPC_INVALID_ARGUMENT, msg);
        goto out;
    }
    call->me->fn(call, req, call->me->user);
out:
    /* Last: vrpc_server_destroy frees s once no task is left. Only destroy
     * waits for tasks, after the shutdown began, in 10 ms naps: no wake (a
     * syscall) per call before that; a task that read shutting just before
     * it was set only leaves destroy a nap late. */
    if (!__atomic_load_n(&s->shutting, __ATOMIC_ACQUIRE))
        __atomic_sub_fetch(&s->tasks, 1, __ATOMIC_ACQ_REL);
    else if (__atomic_sub_fetch(&s->tasks, 1, __ATOMIC_ACQ_REL) == 0)
        vrpc_futex_wake_all(&s->tasks);
}

/* The offer machine's grant of a response payload (rpc/offer.h). Under
 * s->lock, against on_disconnected: it sees the grant or we see `gone`.
 * -ENOSPC also while o still revokes the slot's previous payload (the
 * client may reuse a slot once it has sent DONE). */
static int response_grant_locked(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, bool retry)
{
    struct vrpc_server *s = container_of(q, struct poller, offers)->s;
    struct sconn *c = o->p_conn;
    (void)retry;
    if (!c->b.gone && !vrpc_conn_is_dead(&c->b) && __atomic_load_n(&o->state, __ATOMIC_ACQUIRE) != VRPC_RNDV_IDLE)
        return -ENOSPC;
    int rc = vrpc_offer_grant_locked(&c->b, o); /* -ENOTCONN when gone or dead */
    if (rc == 0)
        vrpc_timer_arm(s->wheel, &o->hold_timer, vrpc_now_ns() + (int64_t)s->o.hold_timeout_ms * 1000000,
                       vrpc_offer_hold_fired, q, (uint64_t)(uintptr_t)o);
    return rc;
}

/* A response offer off the parked list (or never parked): its descriptor
 * goes out if it got its grant; if not, and the connection still stands,
 * the client is answered UNAVAILABLE. Ends the call's hold on c. */
static int response_offer_done(struct vrpc_offer_q *q, struct vrpc_rndv_out *o, enum vrpc_send_ctx ctx)
{
    struct sconn *c = o->p_conn;
    int rc = o->p_rc;
    (void)q;
    if (vrpc_srv_stream_is_offer(c, o))
        return vrpc_srv_stream_offer_done(o);
    if (rc == 0) {
        vrpc_rndv_offer_desc(o);
        /* a failed send leaves the grant to the endpoint's DISCONNECTED */
        rc = vrpc_srv_conn_send(c, o->p_frame, o->p_frame_len) ? -ECONNRESET : 0;
    } else {
        vrpc_lbuf_put(o->p_lb);
        vrpc_pool_put(o->p_frame);
        __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED); /* the frame's quota */
        if (rc != -ENOTCONN && !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
            static const char msg[] = "a large response could not be offered";
            struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                                      .type = VRPC_FT_RESPONSE,
                                      .status = VRPC_UNAVAILABLE,
                                      .request_id = o->p_id};
            vrpc_srv_conn_send_simple(c, &h, msg, sizeof(msg) - 1, ctx == VRPC_SEND_WAIT);
        }
        rc = -ECONNRESET;
    }
    vrpc_srv_answered(c);
    return rc;
}

/* The hold timer (rpc/offer.h), under s->lock: the record arg names, a
 * response's (c->rsp) or a stream message's (a stream's out_rec), if its
 * client has not sent DONE within the hold timeout. The record is looked
 * up among the live connections' before it is read: it may be gone. */
static bool response_hold_find_locked(struct vrpc_offer_q *q, uint64_t arg, struct vrpc_offer_held *h)
{
    struct vrpc_server *s = container_of(q, struct poller, offers)->s;
    struct vrpc_rndv_out *o = (struct vrpc_rndv_out *)(uintptr_t)arg;
    for (struct sconn *c = s->conns.next; c != &s->conns; c = c->next) {
        bool rsp = c->rsp && o >= c->rsp && o < c->rsp + c->ncalls;
        if (rsp || vrpc_srv_stream_owns_offer(c, o)) {
            /* the grant's reference on c is dropped only under s->lock (response_released) */
            if (__atomic_load_n(&o->state, __ATOMIC_ACQUIRE) != VRPC_RNDV_GRANTED ||
                vrpc_now_ns() - o->sent_ns < (int64_t)s->o.hold_timeout_ms * 1000000)
                return false;
            __atomic_add_fetch(&c->b.refs, 1, __ATOMIC_RELAXED);
            *h = (struct vrpc_offer_held){.c = &c->b,
                                          .len = o->len,
                                          .id = o->id,
                                          .hold_ms = s->o.hold_timeout_ms,
                                          .what = rsp ? NULL : "stream message"};
            return true;
        }
    }
    return false;
}

static void response_hold_kill(struct vrpc_conn_base *b) { __atomic_store_n(&b->dead, 1, __ATOMIC_RELEASE); }

static void response_conn_unref(struct vrpc_conn_base *b) { vrpc_srv_sconn_unref(container_of(b, struct sconn, b)); }

const struct vrpc_offer_ops vrpc_srv_response_offer_ops = {
    .grant_locked = response_grant_locked,
    .done = response_offer_done,
    .hold_find_locked = response_hold_find_locked,
    .hold_kill = response_hold_kill,
    .conn_unref = response_conn_unref,
    .hold_peer = "client",
    .hold_what = "response",
    .hold_note = " (no DONE)",
};

/* A response above the eager size: pack straight into a large buffer and
 * offer it to the client (grant + descriptor); the record then waits for
 * DONE. Without a grant for now the offer is parked, not waited for. */
static int respond_large(struct vrpc_server_call *call, const ProtobufCMessage *resp, size_t size)
{
    struct sconn *c = call->conn;
    struct vrpc_server *s = c->s;
    char why[VRPC_STATUS_MSG_MAX];
    struct vrpc_buf *lb;
    uint64_t id = call->req_id;
    struct vrpc_rndv_out *o = &c->rsp[vrpc_wire_id_slot(id)];

    if (vrpc_rndv_buf(s->tp, s->o.max_pinned, size, &lb, why, sizeof(why))) {
        answer_status(call, VRPC_RESOURCE_EXHAUSTED, why);
        return -ENOBUFS;
    }
    uint32_t plen = (uint32_t)vrpc_pb_pack_sized(resp, lb->data), tl = call->trailers_len;
    if (call->md_flags)
        md_send_initial(call, c, id);
    struct vrpc_buf *b = vrpc_srv_conn_buf(c, true);
    if (!b) {
        vrpc_lbuf_put(lb);
        finish_call(call, VRPC_UNAVAILABLE);
        vrpc_srv_answered(c);
        return -ECONNRESET;
    }
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_RESPONSE,
                              .flags = VRPC_FF_RNDV,
                              .request_id = id,
                              .payload_len = plen,
                              .md_len = tl};
    vrpc_wire_hdr_encode(b->data, &h);
    if (tl)
        memcpy(b->data + VRPC_WIRE_HDR_LEN, call->trailers, tl);
    o->p_lb = lb;
    o->p_frame = b;
    o->p_len = plen;
    o->p_frame_len = VRPC_WIRE_HDR_LEN + tl + VRPC_WIRE_DESC_LEN;
    o->p_id = id;
    o->p_conn = c;
    finish_call(call, VRPC_OK); /* the call's hold on c goes with the offer (answered) */
    return vrpc_offer_start(&c->poller->offers, o, VRPC_SEND_WAIT); /* 0 when parked */
}

int vrpc_server_call_respond(struct vrpc_server_call *call, const ProtobufCMessage *resp)
{
    if (!call || !resp)
        return -EINVAL;
    int rc = vrpc_srv_call_claim(call);
    if (rc)
        return rc;
    if (resp->descriptor != call->method->output) {
        answer_status(call, VRPC_INTERNAL, "handler answered with the wrong message type");
        return -EINVAL;
    }
    struct sconn *c = call->conn;
    uint32_t limit = c->b.max_payload, tl = call->trailers_len;
    size_t size = vrpc_pb_packed_size(resp);
    if (size + tl > limit) {
        char msg[VRPC_STATUS_MSG_MAX];
        if (limit == c->b.peer_max)
            snprintf(msg, sizeof(msg), "response of %zu bytes exceeds the client's limit of %u bytes", size, limit);
        else
            snprintf(msg, sizeof(msg),
                     "response of %zu bytes exceeds %u bytes, the most one frame carries on "
                     "this connection (no large-message support on one side)",
                     size, limit);
        answer_status(call, VRPC_RESOURCE_EXHAUSTED, msg);
        return -EMSGSIZE;
    }
    if (__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
        answer_status(call, VRPC_UNAVAILABLE, NULL);
        return -ECONNRESET;
    }
    if (VRPC_WIRE_HDR_LEN + tl + size > vrpc_ep_eager_size(c->b.ep))
        return respond_large(call, resp, size);
    if (call->md_flags)
        md_send_initial(call, c, call->req_id);
    struct vrpc_buf *b = vrpc_srv_conn_buf(c, true);
    if (!b) { /* c does not read (and is failed), or no buffer came back in time */
        finish_call(call, VRPC_UNAVAILABLE);
        vrpc_srv_answered(c);
        return -ECONNRESET;
    }
    uint8_t *p = b->data;
    /* size <= client_max_payload <= eager - header = room in b: checked above */
    size_t plen = vrpc_pb_pack_sized(resp, p + VRPC_WIRE_HDR_LEN + tl);
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_RESPONSE,
                              .request_id = call->req_id,
                              .payload_len = (uint32_t)plen,
                              .md_len = tl};
    vrpc_wire_hdr_encode(p, &h);
    if (tl)
        memcpy(p + VRPC_WIRE_HDR_LEN, call->trailers, tl);
    /* The statistics (a clock read and four atomics) wait until the response
     * is on its way; the method entry outlives the call until vrpc_srv_answered(). */
    struct method_entry *me = call->me;
    int64_t arrival = call->arrival_ns;
    finish_call_norecord(call); /* resp may live in the call's arena: packed above */
    rc = vrpc_srv_conn_send(c, b, VRPC_WIRE_HDR_LEN + tl + (uint32_t)plen) ? -ECONNRESET : 0;
    vrpc_srv_record(me, VRPC_OK, arrival);
    vrpc_srv_answered(c);
    return rc;
}

int vrpc_server_call_fail(struct vrpc_server_call *call, enum vrpc_code code, const char *msg)
{
    if (!call)
        return -EINVAL;
    if (code == VRPC_OK || (unsigned)code >= VRPC_CODE_COUNT)
        code = VRPC_UNKNOWN;
    char m[VRPC_STATUS_MSG_MAX];
    snprintf(m, sizeof(m), "%s", msg ? msg : "");
    int rc = vrpc_srv_call_claim(call);
    return rc ? rc : answer_status(call, code, m);
}

const struct vrpc_method_desc *vrpc_server_call_method(const struct vrpc_server_call *call) { return call->method; }

int64_t vrpc_server_call_deadline(const struct vrpc_server_call *call) { return call->deadline_ns; }

bool vrpc_server_call_is_cancelled(const struct vrpc_server_call *call)
{
    return __atomic_load_n(&call->cancelled, __ATOMIC_ACQUIRE);
}

size_t vrpc_server_call_metadata_count(const struct vrpc_server_call *call) { return call->nmd; }

int vrpc_server_call_metadata_at(const struct vrpc_server_call *call, size_t i, struct vrpc_metadata *out)
{
    if (i >= call->nmd)
        return -ERANGE;
    *out = call->md[i];
    return 0;
}

int vrpc_server_call_metadata_get(const struct vrpc_server_call *call, const char *key, const void **value,
                                  size_t *value_len)
{
    for (size_t i = 0; i < call->nmd; i++) {
        if (strcmp(call->md[i].key, key) == 0) {
            *value = call->md[i].value;
            *value_len = call->md[i].value_len;
            return 0;
        }
    }
    return -ENOENT;
}

void *vrpc_server_call_alloc(struct vrpc_server_call *call, size_t size)
{
    return vrpc_arena_alloc(&call->arena, size);
}
