/* The client side: a channel holds one connection at a time to one server,
 * with its pending-call table, its deadline wheel and its CQ poller. Calls
 * from any number of threads go out through it; responses are matched to
 * calls by request id on the poller, which only copies bytes, decides the
 * outcome and wakes the caller (sync) or submits the completion to the
 * scheduler (async): no user code runs on the poller. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <verbrpc/rpc.h>
#include <verbrpc/sched.h>
#include <verbrpc/transport.h>
#include "rpc/conn.h"
#include "rpc/futex.h"
#include "rpc/internal.h"
#include "rpc/metrics.h"
#include "rpc/offer.h"
#include "rpc/pbutil.h"
#include "rpc/pending.h"
#include "rpc/rndv.h"
#include "rpc/status.h"
#include "rpc/timer.h"
#include "rpc/wire.h"

#define RECV_BUFS VRPC_CHANNEL_RECV_BUFS
#define HELLO_WAIT VRPC_CONN_HELLO_WAIT
#define HELLO_OK VRPC_CONN_HELLO_OK
#define HELLO_FAILED VRPC_CONN_HELLO_FAILED

struct vrpc_conn {
    struct vrpc_conn_base b; /* first (rpc/conn.h). refs: the ep (until
                                DISCONNECTED), the channel's current pointer,
                                and each call using it; goaway: the server
                                said GOAWAY; gone under conn_lock */
    struct vrpc_channel *ch;
    bool gather;          /* the transport grants gathered windows (vrpc_ep_grant_segs):
                             requests may be sent from the caller's memory */
    struct vrpc_conn *next, *prev; /* channel's list of live endpoints, under conn_lock */
};

/* An asynchronous call waiting for a slot: all max_outstanding are pending.
 * Its request is already packed (metadata and message behind room for the
 * header) in a send buffer; it goes out, in order, when a slot frees. Entries
 * live in one array of the channel (never freed before it).
 * The call's id (vrpc_call_opts.call_id) names the entry: qgen << 32 |
 * QID_BIT | index, QID_BIT never set in a request id (slot indices are far
 * below 2^31). The entry stays the call's until the call completes, also
 * after it was sent (LAUNCHED: slot_id says where it went), so the id keeps
 * working for vrpc_channel_cancel; qgen is bumped when it goes back to the
 * free list, so a stale id, deadline timer or pump finds it changed. */
#define QID_BIT 0x80000000u
enum { Q_FREE, Q_QUEUED, Q_LAUNCHED, Q_FAILING };
struct queued {
    struct queued *next, *prev; /* the queue, or the free list (next), under qlock */
    struct vrpc_channel *ch;
    struct vrpc_buf *buf;
    uint32_t mdsz, plen;
    uint32_t qgen;  /* under qlock, never 0 */
    uint8_t state;  /* Q_*, under qlock */
    uint64_t slot_id; /* LAUNCHED: the request id it was sent with (under qlock) */
    const struct vrpc_method_desc *m;
    vrpc_call_cb cb;
    void *arg;
    int64_t deadline;
    struct vrpc_timer timer; /* its deadline while queued */
    struct vrpc_task task;   /* runs cb when it failed while queued */
    struct vrpc_status st;
};

struct vrpc_channel {
    char tname[16];
    char turi[VRPC_URI_MAX + 16];
    struct vrpc_channel_opts o;
    char src_addr[64];
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *send_pool, *recv_pool;
    struct vrpc_sched *sched;
    bool own_sched;
    struct vrpc_sched_producer *prod; /* used by the poller thread only */
    struct vrpc_timer_wheel *wheel;
    struct vrpc_pending *pend;
    uint32_t own_max_payload;

    pthread_mutex_t conn_lock; /* conn pointer and its reference */
    struct vrpc_conn *conn;
    pthread_mutex_t connect_mu; /* one connect attempt at a time; backoff fields */
    int64_t next_attempt_ns;
    uint32_t backoff_ms;
    int last_err;
    int state; /* atomic enum vrpc_channel_state */

    pthread_mutex_t qlock;   /* the async backlog: queue, free list, qclosed */
    struct queued *qents;    /* nqents = max_queued + max_outstanding entries: a
                                sent call keeps its entry (one per slot at most) */
    uint32_t nqents;
    struct queued *qfree;    /* free entries (singly linked through next) */
    struct queued qhead;     /* queue head (sentinel) */
    bool qclosed;
    uint32_t qlen;           /* QUEUED entries: written under qlock, read without it */
    uint32_t qtasks;         /* futex: failure callbacks of entries not yet run */

    uint32_t live_eps; /* futex: endpoints whose DISCONNECTED has not arrived */
    struct vrpc_conn live; /* list head of those endpoints' conns (under conn_lock) */
    uint32_t posted;   /* receive buffers posted, for destroy */
    struct vrpc_rndv_retry retry; /* reads/revokes to retry (poller only) */
    struct vrpc_offer_q offers;   /* request offers waiting for a grant (lock: conn_lock) */
    struct vrpc_method_table *mt; /* per-method call metrics (rpc/metrics.h) */
};

/* Completion of an asynchronous call that failed before it got a slot. */
struct early_fail {
    struct vrpc_task task;
    vrpc_call_cb cb;
    void *arg;
    struct vrpc_status st;
};

static void set_state(struct vrpc_channel *ch, enum vrpc_channel_state st)
{
    __atomic_store_n(&ch->state, (int)st, __ATOMIC_RELEASE);
}

enum vrpc_channel_state vrpc_channel_state(const struct vrpc_channel *ch)
{
    return (enum vrpc_channel_state)__atomic_load_n(&ch->state, __ATOMIC_ACQUIRE);
}

void vrpc_channel_opts_init(struct vrpc_channel_opts *o) { memset(o, 0, sizeof(*o)); }

struct vrpc_transport *vrpc_channel_transport(const struct vrpc_channel *ch) { return ch->tp; }

/* The channel's table handed to the renderer (rpc/metrics.c reads no channel). */
int vrpc_channel_metrics_text(const struct vrpc_channel *ch, char **out, size_t *len)
{
    if (!ch || !out || !len)
        return -EINVAL;
    return vrpc_method_table_text(ch->mt, "vrpc_client_", ch->tp, ch->turi, out, len);
}

/* A call's outcome into the metrics; start_ns 0: refused before it had a slot (untimed). */
static inline void call_metrics(struct vrpc_channel *ch, const struct vrpc_method_desc *m, int code, int64_t start_ns)
{
    vrpc_method_table_done(ch->mt, m, (enum vrpc_code)code, start_ns);
}

/* The last reference destroys the endpoint: only then can no other thread
 * be sending on it (the transport forbids any call after vrpc_ep_destroy). */
static void conn_unref(struct vrpc_conn *c)
{
    if (c && vrpc_conn_unref_last(&c->b)) {
        vrpc_ep_destroy(c->b.ep);
        free(c);
    }
}

static void conn_ref(struct vrpc_conn *c) { vrpc_conn_ref(&c->b); }

/* ---- a call's wire side and its transfers (see pending.h, xfer) ---------- */

static void slot_hold(struct vrpc_pending_slot *s) { __atomic_add_fetch(&s->xfer, 1, __ATOMIC_RELAXED); }

/* Drop one hold; the last one after the response ends the wire side. */
static void slot_drop(struct vrpc_pending_slot *s, uint32_t gen)
{
    if ((uint32_t)__atomic_sub_fetch(&s->xfer, 1, __ATOMIC_ACQ_REL) == VRPC_PEND_XFER_SEEN)
        vrpc_pending_wire_done(s, gen);
}

/* The server can send nothing more for this call (its RESPONSE came or the
 * connection died). True the first time. */
static bool slot_seen(struct vrpc_pending_slot *s, uint32_t gen)
{
    uint64_t old = __atomic_load_n(&s->xfer, __ATOMIC_ACQUIRE);
    do { /* only generation gen's word: the slot may have moved on */
        if ((uint32_t)(old >> 32) != gen || ((uint32_t)old & VRPC_PEND_XFER_SEEN))
            return false;
    } while (!__atomic_compare_exchange_n(&s->xfer, &old, old | VRPC_PEND_XFER_SEEN, false, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    if ((uint32_t)old == 0)
        vrpc_pending_wire_done(s, gen);
    return true;
}

/* ---- zero-copy requests ------------------------------------------------------
 * A large request packed as a gathered window (c->gather; a synchronous call,
 * or an async one with VRPC_CALL_REQ_HELD) has its big bytes values granted
 * to the server from the caller's own memory. From the offer until the grant
 * is revoked (REVOKE completion) or dropped (the endpoint's DISCONNECTED), or
 * until the offer fails without a grant, the server may read that memory, so
 * the call must not end for its owner before: s->out.zc holds ZC_BUSY from
 * the owner's set-up (written before the slot is published) until
 * zc_release. A synchronous caller waits for it in vrpc_call (ZC_SLEEP: it
 * sleeps on the word); an async call's callback is deferred (ZC_CB: complete
 * found it busy, zc_release submits the completion task). */
#define ZC_BUSY 1u
#define ZC_SLEEP 2u
#define ZC_CB 4u

static void complete_submit(struct vrpc_channel *ch, struct vrpc_pending_slot *s, bool on_poller);

/* The caller's memory is no longer granted (any thread; once per call). */
static void zc_release(struct vrpc_channel *ch, struct vrpc_pending_slot *s, bool on_poller)
{
    if (!__atomic_load_n(&s->out.zc, __ATOMIC_ACQUIRE))
        return;
    uint32_t old = __atomic_exchange_n(&s->out.zc, 0, __ATOMIC_ACQ_REL);
    if (old & ZC_SLEEP)
        vrpc_futex_wake_all(&s->out.zc);
    if (old & ZC_CB)
        complete_submit(ch, s, on_poller);
}

/* Synchronous owner: wait until the server can no longer read our memory. */
static void zc_wait(struct vrpc_pending_slot *s)
{
    uint32_t v;
    for (int i = 0; i < 64; i++) {
        if (!(__atomic_load_n(&s->out.zc, __ATOMIC_ACQUIRE) & ZC_BUSY))
            return;
        sched_yield();
    }
    while ((v = __atomic_load_n(&s->out.zc, __ATOMIC_ACQUIRE)) & ZC_BUSY) {
        if (!(v & ZC_SLEEP) &&
            !__atomic_compare_exchange_n(&s->out.zc, &v, v | ZC_SLEEP, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        vrpc_futex_wait(&s->out.zc, v | ZC_SLEEP);
    }
}

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

/* ---- completing a call ------------------------------------------------- */

static void queued_release(struct vrpc_channel *ch, struct queued *e);

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
            vrpc_status_set(&s->st, VRPC_INTERNAL, "response does not decode as %s (%d)",
                            s->method->output->name, rc);
        else
            msg = m;
    }
    call_metrics(ch, s->method, s->st.code, s->start_ns);
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
        queued_release(ch, s->qent);
    vrpc_pending_owner_done(s, gen);
}

/* Hand the decided outcome to its owner. on_poller: we run on the CQ poller
 * and may use the channel's producer ring. */
static void complete_submit(struct vrpc_channel *ch, struct vrpc_pending_slot *s, bool on_poller)
{
    vrpc_task_init(&s->task, async_done_task);
    int rc = on_poller ? vrpc_sched_producer_submit(ch->prod, &s->task) : vrpc_sched_submit(ch->sched, &s->task);
    if (rc) /* the scheduler is shutting down: run here rather than lose it */
        async_done_task(&s->task);
}

static void complete(struct vrpc_channel *ch, struct vrpc_pending_slot *s, uint32_t gen, bool on_poller)
{
    if (s->cb) {
        /* a request still granted from the caller's memory: zc_release runs
         * the callback (exactly one of the two sees the other's bit) */
        if (__atomic_load_n(&s->out.zc, __ATOMIC_ACQUIRE) &&
            (__atomic_fetch_or(&s->out.zc, ZC_CB, __ATOMIC_ACQ_REL) & ZC_BUSY))
            return;
        complete_submit(ch, s, on_poller);
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

static void deadline_fired(void *ctx, uint64_t id)
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
    complete(ch, s, gen, false);
}

static int cancel_queued(struct vrpc_channel *ch, uint64_t id);

int vrpc_channel_cancel(struct vrpc_channel *ch, uint64_t id)
{
    uint32_t idx = vrpc_wire_id_slot(id), gen = vrpc_wire_id_gen(id);
    if (ch && (idx & QID_BIT))
        return cancel_queued(ch, id);
    if (!ch || id == 0 || idx >= ch->pend->n)
        return -ENOENT;
    struct vrpc_pending_slot *s = &ch->pend->slots[idx];
    if (!vrpc_pending_decide(s, gen))
        return -ENOENT;
    vrpc_status_set(&s->st, VRPC_CANCELLED, "cancelled by the client");
    send_cancel(ch, __atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_ACQUIRE), id);
    complete(ch, s, gen, false);
    return 0;
}

/* Fail every call pending on c with code (exactly once each, by decide) and
 * mark their wire side done: no response will come on a dead connection. */
static void fail_pending(struct vrpc_channel *ch, struct vrpc_conn *c, enum vrpc_code code,
                         const char *why, bool on_poller)
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
            complete(ch, s, gen, on_poller);
        }
        if (c)
            slot_seen(s, gen);
    }
}

/* The connection is unusable from now on: fail its calls (once). */
static void conn_fail(struct vrpc_conn *c, const char *why, bool on_poller)
{
    /* An RMW on dead, like start_call's: all RMWs of dead are totally
     * ordered, so either start_call's read sees 1, or it came first and this
     * exchange (acquire) sees everything before it, i.e. the slot it
     * published, in the scan below. */
    if (!vrpc_conn_kill(&c->b))
        return;
    if (__atomic_load_n(&c->b.hello, __ATOMIC_ACQUIRE) == HELLO_WAIT)
        vrpc_conn_hello_end(&c->b, HELLO_FAILED);
    fail_pending(c->ch, c, VRPC_UNAVAILABLE, why, on_poller);
    struct vrpc_channel *ch = c->ch;
    struct vrpc_conn *drop = NULL;
    pthread_mutex_lock(&ch->conn_lock);
    if (ch->conn == c) {
        ch->conn = NULL;
        drop = c;
        if (vrpc_channel_state(ch) != VRPC_CHANNEL_SHUTDOWN) {
            /* The first reconnect after losing a working connection is
             * immediate; back-off applies to failed attempts. No connect_mu
             * here: a connector holding it may be waiting for this poller. */
            __atomic_store_n(&ch->next_attempt_ns, vrpc_now_ns(), __ATOMIC_RELAXED);
            __atomic_store_n(&ch->last_err, -ECONNRESET, __ATOMIC_RELAXED);
            set_state(ch, VRPC_CHANNEL_TRANSIENT_FAILURE);
        }
    }
    pthread_mutex_unlock(&ch->conn_lock);
    conn_unref(drop);
}

/* ---- the poller ----------------------------------------------------------- */

static void protocol_error(struct vrpc_conn *c, const char *what, int rc)
{
    char peer[VRPC_URI_MAX] = "?";
    vrpc_ep_peer_uri(c->b.ep, peer, sizeof(peer));
    vrpc_rpc_log("protocol error from server %s: %s (%s); closing the connection", peer, what,
                 rc == -EPROTONOSUPPORT ? "unsupported version" : "malformed");
    conn_fail(c, "connection closed after a protocol error from the server", true);
    vrpc_ep_close(c->b.ep);
}

/* ---- large messages: the client's side of the rendezvous ------------------ */

/* DONE for a RNDV response. From the poller, never waiting; without a buffer
 * or credit the server would hold its payload until its hold timeout, so the
 * connection is closed instead. */
static void send_done(struct vrpc_channel *ch, struct vrpc_conn *c, uint64_t id, enum vrpc_code code)
{
    if (__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
        return;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_DONE, .request_id = id,
                              .status = (uint32_t)code};
    int rc = vrpc_rpc_send_simple(c->b.ep, ch->send_pool, &h, NULL, 0, false);
    if (rc && rc != -ENOTCONN) {
        vrpc_rpc_log("cannot send DONE for a large response (%s); closing the connection", strerror(-rc));
        conn_fail(c, "connection closed: could not acknowledge a large response", true);
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

/* End the grant of the call's request payload (poller): DONE or the RESPONSE
 * came. The buffer goes back on the REVOKE completion. */
static void request_revoke(struct vrpc_channel *ch, struct vrpc_pending_slot *s)
{
    vrpc_offer_revoke(&ch->retry, &s->out, "request");
}

/* Poller: the REVOKE completion of the call's grant: buffer back, the
 * grant's connection reference and slot hold dropped. */
static void request_revoked(struct vrpc_channel *ch, struct vrpc_pending_slot *s)
{
    struct vrpc_rndv_out *o = &s->out;
    struct vrpc_conn *c = vrpc_ep_user(o->ep);
    uint32_t gen = vrpc_wire_id_gen(o->id);
    /* under conn_lock: hold_fired takes its own reference only while GRANTED */
    vrpc_offer_revoked(&ch->offers, ch->wheel, o);
    zc_release(ch, s, true);
    conn_unref(c);
    slot_drop(s, gen);
}

/* The wheel's thread: a server that holds our request payload past the hold
 * timeout (no DONE, no RESPONSE) loses the connection, which ends the key. */
static void hold_fired(void *ctx, uint64_t id)
{
    struct vrpc_channel *ch = ctx;
    uint32_t idx = vrpc_wire_id_slot(id);
    if (idx >= ch->pend->n)
        return;
    struct vrpc_rndv_out *o = &ch->pend->slots[idx].out;
    struct vrpc_conn *c = NULL;
    uint32_t len = 0;
    pthread_mutex_lock(&ch->conn_lock);
    if (vrpc_offer_granted(o, id)) {
        c = vrpc_ep_user(o->ep);
        len = o->len;
        conn_ref(c); /* safe: the grant holds one until it goes IDLE under this lock */
    }
    pthread_mutex_unlock(&ch->conn_lock);
    if (!c)
        return;
    char peer[VRPC_URI_MAX] = "?";
    vrpc_ep_peer_uri(c->b.ep, peer, sizeof(peer));
    vrpc_rpc_log("server %s held the %u-byte payload of call %#llx for %u ms without reading it; "
                 "aborting the connection", peer, len, (unsigned long long)id, ch->o.hold_timeout_ms);
    conn_fail(c, "connection closed: the server did not read a large request in time", false);
    vrpc_ep_abort(c->b.ep, -ECONNABORTED);
    conn_unref(c);
}

/* Poller: the read of a response payload finished (or could not start). */
static void response_read_done(struct vrpc_channel *ch, struct vrpc_rndv_in *in, int status)
{
    struct vrpc_pending_slot *s = container_of(in, struct vrpc_pending_slot, in);
    struct vrpc_conn *c = vrpc_ep_user(in->ep);
    uint32_t gen = vrpc_wire_id_gen(in->id);
    uint64_t want = (uint64_t)gen << 32 | VRPC_RD_READING;
    if (!__atomic_compare_exchange_n(&s->rd_xfer, &want, (uint64_t)gen << 32 | VRPC_RD_NONE, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        /* Too late: the limit decided the call and aborted c. Let it finish
         * (a few non-blocking steps on the wheel's thread) before this
         * completion lets go of the slot; no DONE on an aborted connection. */
        while (__atomic_load_n(&s->rd_xfer, __ATOMIC_ACQUIRE) != ((uint64_t)gen << 32 | VRPC_RD_EXPIRED))
            sched_yield();
        vrpc_lbuf_put(in->lb);
        in->lb = NULL;
        slot_drop(s, gen);
        return;
    }
    vrpc_timer_cancel(ch->wheel, &s->rd_timer); /* if it fires anyway, it finds NONE */
    struct vrpc_buf *lb = in->lb;
    in->lb = NULL;
    if (status == 0) {
        if (vrpc_pending_decide(s, gen)) {
            s->resp_lb = lb;
            s->resp_len = in->len;
            s->st.code = VRPC_OK;
            s->st.message[0] = 0;
            send_done(ch, c, in->id, VRPC_OK);
            complete(ch, s, gen, true);
        } else { /* cancelled or timed out while the read ran */
            vrpc_lbuf_put(lb);
            send_done(ch, c, in->id, gave_up_code(s));
        }
    } else {
        vrpc_lbuf_put(lb);
        if (vrpc_pending_decide(s, gen)) {
            if (status == -EACCES)
                vrpc_status_set(&s->st, VRPC_INTERNAL, "large-message read failed: remote access error");
            else
                vrpc_status_set(&s->st, VRPC_UNAVAILABLE, "connection lost while reading a large response (%s)",
                                strerror(-status));
            complete(ch, s, gen, true);
        }
        if (status == -EACCES)
            protocol_error(c, "its large-response descriptor could not be read (bad key or range)", -EPROTO);
    }
    slot_drop(s, gen);
}

/* The wheel's thread: a large response's read is not over at its limit
 * (on_large_response). The call ends RESOURCE_EXHAUSTED (if nothing ended it
 * before), and the connection is aborted: that ends the read at once, and the
 * buffer comes back at its (flushed) completion. */
static void response_xfer_expired(void *ctx, uint64_t id)
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
    if (vrpc_pending_decide(s, gen)) {
        vrpc_status_set(&s->st, VRPC_RESOURCE_EXHAUSTED,
                        "large transfer too slow: the %u-byte response was not read in %lld ms (min_transfer_rate "
                        "%u B/s, transfer_floor_ms %u)", len, ms, ch->o.min_transfer_rate, ch->o.transfer_floor_ms);
        complete(ch, s, gen, false);
    }
    char peer[VRPC_URI_MAX] = "?";
    vrpc_ep_peer_uri(c->b.ep, peer, sizeof(peer));
    vrpc_rpc_log("server %s: large transfer too slow: %u-byte response of call %#llx not read in %lld ms; "
                 "aborting the connection", peer, len, (unsigned long long)id, ms);
    conn_fail(c, "connection aborted: a large response was too slow (min_transfer_rate)", false);
    vrpc_ep_abort(c->b.ep, -ECONNABORTED);
    __atomic_store_n(&s->rd_xfer, (uint64_t)gen << 32 | VRPC_RD_EXPIRED, __ATOMIC_RELEASE);
}

static void response_read_failed(struct vrpc_rndv_in *in, int rc, void *arg)
{
    response_read_done(arg, in, rc);
}

/* RESPONSE|RNDV: read the payload (unless the call is already over). */
static void on_large_response(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                              const struct vrpc_wire_hdr *h, const uint8_t *descp)
{
    uint32_t gen = vrpc_wire_id_gen(h->request_id);
    struct vrpc_wire_desc d;
    char why[VRPC_STATUS_MSG_MAX];
    struct vrpc_buf *lb;

    if ((uint64_t)VRPC_WIRE_HDR_LEN + h->payload_len <= vrpc_ep_eager_size(c->b.ep)) {
        protocol_error(c, "rendezvous response for a payload that fits a frame", -EPROTO);
        return;
    }
    if (h->payload_len > ch->own_max_payload) {
        protocol_error(c, "large response above our max_msg_size", -EPROTO);
        return;
    }
    if (vrpc_wire_desc_decode(descp, h->payload_len, &d)) {
        protocol_error(c, "bad rendezvous descriptor", -EPROTO);
        return;
    }
    uint64_t w = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE);
    if ((uint32_t)w & VRPC_PEND_DECIDED) { /* cancelled or timed out: do not read */
        send_done(ch, c, h->request_id, gave_up_code(s));
        slot_seen(s, gen);
        return;
    }
    if (vrpc_rndv_buf(ch->tp, ch->o.max_pinned, h->payload_len, &lb, why, sizeof(why))) {
        if (vrpc_pending_decide(s, gen)) {
            vrpc_status_set(&s->st, VRPC_RESOURCE_EXHAUSTED, "%s", why);
            complete(ch, s, gen, true);
        }
        send_done(ch, c, h->request_id, VRPC_RESOURCE_EXHAUSTED);
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
    /* the read's limit, from the announcement: the floor, and the size at
     * min_transfer_rate (the call's deadline ends the call on its own) */
    s->rd_start_ns = vrpc_now_ns();
    __atomic_store_n(&s->rd_xfer, (uint64_t)gen << 32 | VRPC_RD_READING, __ATOMIC_RELEASE);
    vrpc_timer_arm(ch->wheel, &s->rd_timer,
                   s->rd_start_ns + ((int64_t)ch->o.transfer_floor_ms +
                                     (int64_t)h->payload_len * 1000 / ch->o.min_transfer_rate) * 1000000,
                   response_xfer_expired, ch, h->request_id);
    int rc = vrpc_rndv_read(in);
    if (rc == -ENOSPC)
        vrpc_rndv_read_later(&ch->retry, in);
    else if (rc)
        response_read_done(ch, in, rc);
}

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
        protocol_error(c, "response to a request id that is not pending", -EPROTO);
        return;
    }
    uint32_t gen = vrpc_wire_id_gen(h->request_id);
    /* a RESPONSE also ends the grant of a request payload the server did not read */
    if (vrpc_offer_granted(&s->out, h->request_id))
        request_revoke(ch, s);
    if (h->flags & VRPC_FF_RNDV) {
        on_large_response(ch, c, s, h, payload);
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
            s->st.message[0] = 0;
        } else {
            vrpc_status_set_bytes(&s->st, (enum vrpc_code)h->status, payload, h->payload_len);
            if (h->status == VRPC_UNIMPLEMENTED)
                name_unimplemented(&s->st, s->method);
        }
    done:
        slot_seen(s, gen);
        complete(ch, s, gen, true);
    } else {
        slot_seen(s, gen); /* late answer to a cancelled/timed-out call */
    }
}

/* DONE from the server: it has read (or given up on) our request payload. */
static void on_done(struct vrpc_channel *ch, struct vrpc_conn *c, const struct vrpc_wire_hdr *h)
{
    struct vrpc_pending_slot *s = vrpc_pending_lookup(ch->pend, h->request_id);
    if (!s || __atomic_load_n((struct vrpc_conn **)&s->conn, __ATOMIC_ACQUIRE) != c ||
        !vrpc_offer_granted(&s->out, h->request_id)) {
        protocol_error(c, "DONE for a request with no payload outstanding", -EPROTO);
        return;
    }
    request_revoke(ch, s);
}

/* The endpoint's DISCONNECTED (poller): its keys died with it; give back the
 * buffers of grants not revoked, and fail reads still waiting to start. */
static void release_transfers(struct vrpc_channel *ch, struct vrpc_ep *ep)
{
    vrpc_rndv_retry_forget(&ch->retry, ep, response_read_failed, ch);
    for (uint32_t i = 0; i < ch->pend->n; i++) {
        struct vrpc_pending_slot *s = &ch->pend->slots[i];
        /* REVOKING too: request_go's revoke of a grant whose descriptor
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
            zc_release(ch, s, true);
            conn_unref(c);
            slot_drop(s, gen);
        }
    }
}

/* ---- the client's frame table (rpc/conn.h): poller thread --------------- */

static struct vrpc_conn *client_conn(struct vrpc_conn_base *b) { return container_of(b, struct vrpc_conn, b); }

static void client_protocol_error(struct vrpc_conn_base *b, const char *what, int rc)
{
    protocol_error(client_conn(b), what, rc);
}

static void client_on_hello_ack(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_conn *c = client_conn(b);
    struct vrpc_wire_hello st;
    if (__atomic_load_n(&c->b.hello, __ATOMIC_ACQUIRE) != HELLO_WAIT ||
        vrpc_wire_hello_decode(body + h->md_len, h->payload_len, &st)) {
        protocol_error(c, "unexpected or malformed HELLO_ACK", -EPROTO);
        return;
    }
    vrpc_conn_hello_apply(&c->b, &st);
    vrpc_pending_set_limit(c->ch->pend, st.max_concurrent);
    vrpc_conn_hello_end(&c->b, HELLO_OK);
}

static void client_on_response(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_conn *c = client_conn(b);
    if ((h->flags & VRPC_FF_RNDV) && !c->b.large) {
        protocol_error(c, "large-message response on a connection without large messages", -EPROTO);
        return;
    }
    on_response(c->ch, c, h, body + h->md_len);
}

static void client_on_done(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    (void)body;
    on_done(client_conn(b)->ch, client_conn(b), h);
}

static void client_on_goaway(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_conn *c = client_conn(b);
    struct vrpc_channel *ch = c->ch;
    (void)h;
    (void)body;
    __atomic_store_n(&c->b.goaway, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&ch->conn_lock);
    if (ch->conn == c) {
        ch->conn = NULL;
        set_state(ch, VRPC_CHANNEL_IDLE);
        pthread_mutex_unlock(&ch->conn_lock);
        conn_unref(c);
    } else {
        pthread_mutex_unlock(&ch->conn_lock);
    }
}

static const struct vrpc_conn_role client_role = {
    .hello_type = VRPC_FT_HELLO_ACK,
    .before_hello = "frame before HELLO_ACK",
    .bad_type = "frame type a server must not send",
    .on_hello = client_on_hello_ack,
    .protocol_error = client_protocol_error,
    .on_frame = {
        [VRPC_FT_HELLO_ACK] = client_on_hello_ack, /* a second one: refused there */
        [VRPC_FT_RESPONSE] = client_on_response,
        [VRPC_FT_DONE] = client_on_done,
        [VRPC_FT_GOAWAY] = client_on_goaway,
    },
};

static void channel_cq_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct vrpc_channel *ch = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        switch (w->opcode) {
        case VRPC_WC_RECV:
            if (w->status == 0 && w->ep)
                vrpc_conn_recv(&client_role, &((struct vrpc_conn *)vrpc_ep_user(w->ep))->b, w->buf->data,
                               w->byte_len);
            if (w->status == -ECANCELED || vrpc_cq_post_recv(cq, &w->buf, NULL, 1)) {
                vrpc_pool_put(w->buf);
                __atomic_sub_fetch(&ch->posted, 1, __ATOMIC_RELAXED);
            }
            break;
        case VRPC_WC_SEND:
            vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_READ:
            response_read_done(ch, (struct vrpc_rndv_in *)(uintptr_t)w->wr_id, w->status);
            break;
        case VRPC_WC_REVOKE:
            request_revoked(ch, container_of((struct vrpc_rndv_out *)(uintptr_t)w->wr_id,
                                             struct vrpc_pending_slot, out));
            break;
        case VRPC_WC_DISCONNECTED: {
            struct vrpc_conn *c = vrpc_ep_user(w->ep);
            conn_fail(c, w->status ? "connection lost" : "connection closed", true);
            pthread_mutex_lock(&ch->conn_lock);
            c->b.gone = true; /* no grant starts on it from here on (start_call) */
            if (c->next) {
                c->prev->next = c->next;
                c->next->prev = c->prev;
            }
            pthread_mutex_unlock(&ch->conn_lock);
            release_transfers(ch, w->ep);
            conn_unref(c); /* the endpoint's reference */
            __atomic_sub_fetch(&ch->live_eps, 1, __ATOMIC_RELEASE);
            vrpc_futex_wake_all(&ch->live_eps);
            break;
        }
        default:
            break;
        }
    }
    if (ch->retry.reads || ch->retry.revokes)
        vrpc_rndv_retry_run(&ch->retry, response_read_failed, ch);
    if (vrpc_offer_any_parked(&ch->offers))
        vrpc_offer_run(&ch->offers, VRPC_SEND_POLLER);
}

/* ---- connecting ---------------------------------------------------------- */

/* One connect attempt (connect_mu held). Returns 0 with ch->conn set. */
static int connect_once(struct vrpc_channel *ch, int64_t deadline_ns)
{
    struct vrpc_conn *c = calloc(1, sizeof(*c));
    struct vrpc_ep_attr ea;
    int rc;

    if (!c)
        return -ENOMEM;
    c->ch = ch;
    c->b.refs = 2; /* ours (handed to ch->conn on success) and the endpoint's
                    (dropped when its DISCONNECTED arrives) */
    set_state(ch, VRPC_CHANNEL_CONNECTING);
    int64_t now = vrpc_now_ns();
    int64_t budget_ms = ch->o.connect_timeout_ms;
    if (deadline_ns != VRPC_NO_DEADLINE && (deadline_ns - now) / 1000000 < budget_ms)
        budget_ms = (deadline_ns - now) / 1000000;
    if (budget_ms < 1)
        budget_ms = 1;
    vrpc_ep_attr_init(&ea);
    ea.cq = ch->cq;
    ea.user = c;
    ea.timeout_ms = (uint32_t)budget_ms;
    ea.src_addr = ch->src_addr[0] ? ch->src_addr : NULL;
    __atomic_add_fetch(&ch->live_eps, 1, __ATOMIC_RELAXED);
    rc = vrpc_connect(ch->tp, ch->turi, &ea, &c->b.ep);
    if (rc) {
        __atomic_sub_fetch(&ch->live_eps, 1, __ATOMIC_RELAXED);
        free(c);
        return rc;
    }
    /* Gathered grants where the backend has them. VRPC_NO_GATHER=1 (diagnosis, A/B runs):
     * large requests are always copied into a large buffer. */
    c->gather = (vrpc_transport_caps(ch->tp) & VRPC_TP_CAP_GATHER) && !vrpc_env_flag(VRPC_ENV_NO_GATHER);
    pthread_mutex_lock(&ch->conn_lock);
    if (!c->b.gone) { /* its DISCONNECTED may already have come and gone */
        c->next = ch->live.next;
        c->prev = &ch->live;
        ch->live.next->prev = c;
        ch->live.next = c;
    }
    pthread_mutex_unlock(&ch->conn_lock);
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO};
    uint8_t hp[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello hs = {.max_msg_size = ch->own_max_payload, .max_concurrent = ch->pend->n,
                                 .features = vrpc_rndv_features};
    vrpc_wire_hello_encode(hp, &hs);
    h.payload_len = sizeof(hp);
    rc = vrpc_rpc_send_simple(c->b.ep, ch->send_pool, &h, hp, sizeof(hp), true);
    int64_t end = now + budget_ms * 1000000;
    uint32_t hv;
    while (!rc && (hv = __atomic_load_n(&c->b.hello, __ATOMIC_ACQUIRE)) == HELLO_WAIT) {
        int64_t left = end - vrpc_now_ns();
        if (left <= 0) {
            rc = -ETIMEDOUT;
            break;
        }
        vrpc_rpc_futex_wait_ns(&c->b.hello, HELLO_WAIT, left);
    }
    if (!rc && __atomic_load_n(&c->b.hello, __ATOMIC_ACQUIRE) != HELLO_OK)
        rc = -ECONNRESET;
    if (rc) {
        conn_fail(c, "handshake failed", false);
        vrpc_ep_close(c->b.ep);
        conn_unref(c);
        return rc;
    }
    pthread_mutex_lock(&ch->conn_lock);
    struct vrpc_conn *old = ch->conn;
    ch->conn = c; /* takes our reference */
    set_state(ch, VRPC_CHANNEL_READY);
    pthread_mutex_unlock(&ch->conn_lock);
    conn_unref(old);
    return 0;
}

/* A referenced usable connection, connecting if needed. -EAGAIN means the
 * channel is backing off after failed attempts. */
static int get_conn(struct vrpc_channel *ch, int64_t deadline_ns, bool force, struct vrpc_conn **out)
{
    struct vrpc_conn *c;
    int rc;

    pthread_mutex_lock(&ch->conn_lock);
    c = ch->conn;
    if (c && !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE) && !__atomic_load_n(&c->b.goaway, __ATOMIC_ACQUIRE)) {
        conn_ref(c);
        pthread_mutex_unlock(&ch->conn_lock);
        *out = c;
        return 0;
    }
    pthread_mutex_unlock(&ch->conn_lock);

    pthread_mutex_lock(&ch->connect_mu);
    for (;;) {
        if (vrpc_channel_state(ch) == VRPC_CHANNEL_SHUTDOWN) {
            rc = -ESHUTDOWN;
            break;
        }
        pthread_mutex_lock(&ch->conn_lock);
        c = ch->conn; /* another thread may have connected meanwhile */
        if (c && !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE) && !__atomic_load_n(&c->b.goaway, __ATOMIC_ACQUIRE)) {
            conn_ref(c);
            pthread_mutex_unlock(&ch->conn_lock);
            *out = c;
            rc = 0;
            break;
        }
        pthread_mutex_unlock(&ch->conn_lock);
        if (!force && vrpc_now_ns() < __atomic_load_n(&ch->next_attempt_ns, __ATOMIC_RELAXED)) {
            rc = -EAGAIN;
            break;
        }
        rc = connect_once(ch, deadline_ns);
        if (rc == 0) {
            ch->backoff_ms = 0;
            __atomic_store_n(&ch->next_attempt_ns, 0, __ATOMIC_RELAXED);
            continue; /* pick it up (with a reference) above */
        }
        __atomic_store_n(&ch->last_err, rc, __ATOMIC_RELAXED);
        ch->backoff_ms = ch->backoff_ms ? ch->backoff_ms * 2 : ch->o.backoff_initial_ms;
        if (ch->backoff_ms > ch->o.backoff_max_ms)
            ch->backoff_ms = ch->o.backoff_max_ms;
        __atomic_store_n(&ch->next_attempt_ns, vrpc_now_ns() + (int64_t)ch->backoff_ms * 1000000,
                         __ATOMIC_RELAXED);
        if (vrpc_channel_state(ch) != VRPC_CHANNEL_SHUTDOWN)
            set_state(ch, VRPC_CHANNEL_TRANSIENT_FAILURE);
        break;
    }
    pthread_mutex_unlock(&ch->connect_mu);
    return rc;
}

/* Connect errors that waiting does not cure: nothing listens (refused), the
 * name does not resolve, the address is malformed or on no usable device. */
static bool connect_err_permanent(int rc)
{
    return rc == -ECONNREFUSED || rc == -ENXIO || rc == -EINVAL || rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT;
}

int vrpc_channel_connect(struct vrpc_channel *ch, int timeout_ms)
{
    struct vrpc_conn *c;
    int64_t end = vrpc_now_ns() + (int64_t)timeout_ms * 1000000;
    int rc;
    for (;;) {
        rc = get_conn(ch, end, true, &c);
        if (rc == 0) {
            conn_unref(c);
            return 0;
        }
        if (rc == -ESHUTDOWN || connect_err_permanent(rc) || vrpc_now_ns() >= end)
            return rc == -EAGAIN ? -ETIMEDOUT : rc;
        int64_t wait = __atomic_load_n(&ch->next_attempt_ns, __ATOMIC_RELAXED) - vrpc_now_ns();
        if (wait > end - vrpc_now_ns())
            wait = end - vrpc_now_ns();
        if (wait > 0) {
            struct timespec ts = {.tv_sec = wait / 1000000000, .tv_nsec = wait % 1000000000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- calls ------------------------------------------------------------------ */

static void early_fail_task(struct vrpc_task *t)
{
    struct early_fail *e = container_of(t, struct early_fail, task);
    e->cb(&e->st, NULL, e->arg);
    free(e);
}

static int64_t call_deadline(const struct vrpc_channel *ch, const struct vrpc_call_opts *o)
{
    int64_t t = o ? o->timeout_us : 0;
    if (t == 0)
        t = ch->o.default_timeout_us;
    if (t <= 0)
        return VRPC_NO_DEADLINE;
    return vrpc_now_ns() + t * 1000;
}

/* The offer machine's grant of a request payload (rpc/offer.h): under
 * conn_lock, against the endpoint's DISCONNECTED (release_transfers): either
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
                       hold_fired, ch, o->p_id);
    }
    return rc;
}

/* The end of sending a request (start_call's, a parked offer's or a queued
 * call's): send the frame b unless rc already says why not, fail the call if
 * it could not go, end the owner's set-up hold. Drops an async call's own
 * reference of c (see start_call). ctx: the thread (an async call's never
 * waits for credits). */
static void request_go(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s, uint32_t gen,
                       struct vrpc_buf *b, uint32_t flen, int rc, enum vrpc_send_ctx ctx)
{
    /* (s->cb is the owner's until the set-up hold is dropped, below) */
    bool async = s->cb != NULL, on_poller = ctx == VRPC_SEND_POLLER;
    /* Read dead with an RMW (release): pairs with conn_fail's exchange, see
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
        pthread_mutex_lock(&ch->conn_lock); /* against release_transfers: see there */
        if (__atomic_load_n(&s->out.state, __ATOMIC_ACQUIRE) == VRPC_RNDV_GRANTED &&
            s->out.id == vrpc_wire_make_id(s->index, gen))
            vrpc_rndv_revoke(&s->out);
        pthread_mutex_unlock(&ch->conn_lock);
        if (vrpc_pending_decide(s, gen)) {
            vrpc_status_set(&s->st, VRPC_UNAVAILABLE, "send failed: %s", strerror(-rc));
            complete(ch, s, gen, on_poller);
        }
        slot_seen(s, gen);
    }
    slot_drop(s, gen); /* the owner's set-up hold (pending.h) */
    if (async)
        conn_unref(c);
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
        zc_release(ch, s, ctx == VRPC_SEND_POLLER); /* never granted */
    }
    if (o->p_rc == -ECANCELED) { /* the server never hears of it */
        vrpc_pool_put(o->p_frame);
        slot_seen(s, gen);
        slot_drop(s, gen);
        if (async)
            conn_unref(c);
    } else {
        request_go(ch, c, s, gen, o->p_frame, o->p_frame_len, o->p_rc, ctx);
    }
    conn_unref(c);
    return 0;
}

static const struct vrpc_offer_ops request_offer_ops = {
    .grant_locked = request_grant_locked,
    .done = request_offer_done,
};

/* Offer the packed request payload (s->out.p_*, frame b with its header
 * written) to the server (caller's thread): grant and send, or park the
 * offer when the transport has no grant left for now. */
static void offer_request(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                          enum vrpc_send_ctx ctx)
{
    conn_ref(c); /* the offer's */
    s->out.p_conn = c;
    vrpc_offer_start(&ch->offers, &s->out, ctx);
}

/* Publish a reserved slot whose call fields the owner has written: arm its
 * deadline, then INUSE (release, pending.h "Publication of a call"): a loss
 * scan, cancel or deadline that sees the slot completes it with these fields,
 * never with the previous occupant's callback. The timer is armed before, so
 * an owner's completion (which may run on a worker before start_call
 * returns) always finds it armed and cancels it; a deadline that fired in
 * between found the slot not yet open and did nothing, so the check after
 * open decides it here (decide makes it exactly once). */
static void open_call(struct vrpc_channel *ch, struct vrpc_pending_slot *s, uint64_t id)
{
    if (s->deadline_ns != VRPC_NO_DEADLINE)
        vrpc_timer_arm(ch->wheel, &s->timer, s->deadline_ns, deadline_fired, ch, id);
    vrpc_pending_open(s);
}

/* After open_call, with no lock held: the deadline may have passed already. */
static void check_expired(struct vrpc_channel *ch, int64_t deadline, uint64_t id)
{
    if (deadline != VRPC_NO_DEADLINE && vrpc_now_ns() >= deadline)
        deadline_fired(ch, id);
}

/* Under qlock: put queued call e on slot s of connection c (taking over the
 * caller's reference of c) and publish the slot, so that from here on e's id
 * cancels it through the slot. Returns the request id. */
static uint64_t launch_open_locked(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                                   struct queued *e)
{
    uint64_t id = vrpc_wire_make_id(s->index, vrpc_pending_gen(s));
    s->method = e->m;
    s->cb = e->cb;
    s->cb_arg = e->arg;
    s->cb_ch = ch;
    s->qent = e;
    s->deadline_ns = e->deadline;
    s->start_ns = vrpc_metrics_now_ns();
    s->out.zc = 0;
    conn_ref(c); /* ours while launch_queued sends: see start_call */
    open_call(ch, s, id);
    e->state = Q_LAUNCHED;
    e->slot_id = id;
    return id;
}

/* Send the queued call opened on slot s (no lock held): as start_call's
 * eager path, never waiting. b holds the packed request. */
static void launch_queued(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                          struct vrpc_buf *b, uint32_t mdsz, uint32_t plen, uint32_t method_id, uint64_t id,
                          int64_t deadline)
{
    uint32_t gen = vrpc_wire_id_gen(id);
    check_expired(ch, deadline, id);
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_REQUEST,
                              .method_id = method_id, .request_id = id, .md_len = mdsz, .payload_len = plen};
    if (deadline != VRPC_NO_DEADLINE) {
        int64_t left = deadline - vrpc_now_ns();
        h.flags = VRPC_FF_DEADLINE;
        h.budget_us = left > 0 ? (uint64_t)(left / 1000) : 0;
    }
    vrpc_wire_hdr_encode(b->data, &h);
    /* a queued call is async: drops launch_open_locked's reference of c */
    request_go(ch, c, s, gen, b, VRPC_WIRE_HDR_LEN + mdsz + plen, 0, VRPC_SEND_NOWAIT);
}

/* ---- the async backlog ---------------------------------------------------- */

static void queued_fail_task(struct vrpc_task *t)
{
    struct queued *e = container_of(t, struct queued, task);
    struct vrpc_channel *ch = e->ch;
    e->cb(&e->st, NULL, e->arg);
    queued_release(ch, e);
    /* last: the channel's destroy waits for this before freeing the entries */
    if (__atomic_sub_fetch(&ch->qtasks, 1, __ATOMIC_ACQ_REL) == 0)
        vrpc_futex_wake_all(&ch->qtasks);
}

/* The call of entry e is over: back to the free list, its id dead. */
static void queued_release(struct vrpc_channel *ch, struct queued *e)
{
    pthread_mutex_lock(&ch->qlock);
    e->state = Q_FREE;
    e->qgen = e->qgen + 1 ? e->qgen + 1 : 1;
    e->next = ch->qfree;
    ch->qfree = e;
    pthread_mutex_unlock(&ch->qlock);
}

/* Fail an entry that has left the queue (FAILING): its callback runs on a
 * worker, then the entry is released. */
static void queued_fail(struct queued *e, enum vrpc_code code, const char *why)
{
    struct vrpc_channel *ch = e->ch;
    vrpc_pool_put(e->buf);
    e->buf = NULL;
    vrpc_status_set(&e->st, code, "%s", why);
    vrpc_task_init(&e->task, queued_fail_task);
    __atomic_add_fetch(&ch->qtasks, 1, __ATOMIC_RELAXED);
    if (vrpc_sched_submit(ch->sched, &e->task))
        queued_fail_task(&e->task); /* the scheduler is shutting down: run here rather than lose it */
}

/* Under qlock: take e out of the queue (it is QUEUED) into state st. */
static void queued_unlink_locked(struct vrpc_channel *ch, struct queued *e, uint8_t st)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
    e->next = e->prev = NULL;
    e->state = st;
    __atomic_sub_fetch(&ch->qlen, 1, __ATOMIC_RELAXED);
    if (e->deadline != VRPC_NO_DEADLINE)
        vrpc_timer_cancel(ch->wheel, &e->timer); /* if it is firing, it finds e no longer QUEUED */
}

static uint64_t queued_id(const struct vrpc_channel *ch, const struct queued *e)
{
    return (uint64_t)e->qgen << 32 | QID_BIT | (uint32_t)(e - ch->qents);
}

/* vrpc_channel_cancel for an id of a call that was queued. */
static int cancel_queued(struct vrpc_channel *ch, uint64_t id)
{
    uint32_t idx = vrpc_wire_id_slot(id) & ~QID_BIT;
    if (idx >= ch->nqents)
        return -ENOENT;
    struct queued *e = &ch->qents[idx];
    pthread_mutex_lock(&ch->qlock);
    if (e->qgen != vrpc_wire_id_gen(id) || (e->state != Q_QUEUED && e->state != Q_LAUNCHED)) {
        pthread_mutex_unlock(&ch->qlock);
        return -ENOENT;
    }
    if (e->state == Q_LAUNCHED) {
        /* sent: its slot was opened before it became LAUNCHED, so the slot
         * id decides (a call completed since fails the generation check) */
        uint64_t sid = e->slot_id;
        pthread_mutex_unlock(&ch->qlock);
        return vrpc_channel_cancel(ch, sid);
    }
    queued_unlink_locked(ch, e, Q_FAILING);
    pthread_mutex_unlock(&ch->qlock);
    queued_fail(e, VRPC_CANCELLED, "cancelled by the client while queued for a slot (never sent)");
    return 0;
}

static void queued_expired(void *ctx, uint64_t qgen)
{
    struct queued *e = ctx;
    struct vrpc_channel *ch = e->ch;
    pthread_mutex_lock(&ch->qlock);
    if (e->state != Q_QUEUED || e->qgen != (uint32_t)qgen) {
        pthread_mutex_unlock(&ch->qlock);
        return;
    }
    queued_unlink_locked(ch, e, Q_FAILING);
    pthread_mutex_unlock(&ch->qlock);
    queued_fail(e, VRPC_DEADLINE_EXCEEDED, "deadline exceeded waiting for a call slot");
}

/* Send queued calls while slots are free, oldest first. Runs after every
 * enqueue and after every slot is freed (pending's on_free), on whatever
 * thread did that: both sides look at queue and slots under qlock after
 * their own change, so a queued call is never left behind a free slot. */
static void pump(void *arg)
{
    struct vrpc_channel *ch = arg;
    /* Without the lock when nothing is queued (every call frees a slot): an
     * enqueuer counts its entry before its own pump tries for a slot, and a
     * slot freed after that try is freed before this load (both under the
     * table's lock), so the count is seen. */
    while (__atomic_load_n(&ch->qlen, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&ch->qlock);
        struct queued *e = ch->qhead.next;
        if (e == &ch->qhead || ch->qclosed) {
            pthread_mutex_unlock(&ch->qlock);
            return;
        }
        struct vrpc_conn *c;
        pthread_mutex_lock(&ch->conn_lock);
        c = ch->conn;
        if (c && !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE) && !__atomic_load_n(&c->b.goaway, __ATOMIC_ACQUIRE))
            conn_ref(c);
        else
            c = NULL;
        pthread_mutex_unlock(&ch->conn_lock);
        if (!c) {
            /* never connect here (this may be the poller): fail it */
            queued_unlink_locked(ch, e, Q_FAILING);
            pthread_mutex_unlock(&ch->qlock);
            queued_fail(e, VRPC_UNAVAILABLE, "connection lost while the call waited for a slot");
            continue;
        }
        if (e->mdsz + e->plen > c->b.max_payload) { /* a new connection with a lower limit */
            queued_unlink_locked(ch, e, Q_FAILING);
            pthread_mutex_unlock(&ch->qlock);
            conn_unref(c);
            queued_fail(e, VRPC_RESOURCE_EXHAUSTED, "request exceeds the server's limit");
            continue;
        }
        struct vrpc_pending_slot *s;
        if (vrpc_pending_try_alloc(ch->pend, c, &s)) {
            /* no slot (the next free will pump again) or closing (destroy
             * fails the queue) */
            pthread_mutex_unlock(&ch->qlock);
            conn_unref(c);
            return;
        }
        queued_unlink_locked(ch, e, Q_LAUNCHED);
        struct vrpc_buf *b = e->buf;
        uint32_t mdsz = e->mdsz, plen = e->plen, method_id = e->m->id;
        int64_t deadline = e->deadline;
        e->buf = NULL;
        /* opened under qlock: a cancel by e's id that finds it LAUNCHED
         * finds the slot INUSE (the entry is released with the call) */
        uint64_t id = launch_open_locked(ch, c, s, e);
        pthread_mutex_unlock(&ch->qlock);
        launch_queued(ch, c, s, b, mdsz, plen, method_id, id, deadline);
    }
}

/* Queue an async call for lack of a slot; b holds its packed request (mdsz +
 * plen bytes behind the header's room) and belongs to the queue on 0.
 * 0 (queued), -EAGAIN (the backlog is full), -ESHUTDOWN. */
static int enqueue(struct vrpc_channel *ch, struct vrpc_buf *b, uint32_t mdsz, uint32_t plen,
                   const struct vrpc_method_desc *m, const struct vrpc_call_opts *o, vrpc_call_cb cb, void *arg,
                   int64_t deadline)
{
    struct queued *e;
    pthread_mutex_lock(&ch->qlock);
    if (ch->qclosed) {
        pthread_mutex_unlock(&ch->qlock);
        return -ESHUTDOWN;
    }
    if (__atomic_load_n(&ch->qlen, __ATOMIC_RELAXED) >= ch->o.max_queued || !(e = ch->qfree)) {
        pthread_mutex_unlock(&ch->qlock);
        return -EAGAIN;
    }
    ch->qfree = e->next;
    e->state = Q_FAILING; /* taken, not queued yet: its id cancels nothing */
    pthread_mutex_unlock(&ch->qlock);
    e->plen = plen;
    e->mdsz = mdsz;
    e->buf = b;
    e->m = m;
    e->cb = cb;
    e->arg = arg;
    e->deadline = deadline;
    if (o && o->call_id) /* before it is queued, i.e. before it can complete */
        __atomic_store_n(o->call_id, queued_id(ch, e), __ATOMIC_RELEASE);
    pthread_mutex_lock(&ch->qlock);
    e->state = Q_QUEUED;
    e->next = &ch->qhead;
    e->prev = ch->qhead.prev;
    ch->qhead.prev->next = e;
    ch->qhead.prev = e;
    __atomic_add_fetch(&ch->qlen, 1, __ATOMIC_RELEASE);
    if (deadline != VRPC_NO_DEADLINE) /* under qlock: a pump cannot take it before it is armed */
        vrpc_timer_arm(ch->wheel, &e->timer, deadline, queued_expired, e, e->qgen);
    pthread_mutex_unlock(&ch->qlock);
    pump(ch);
    return 0;
}

static bool backlog_empty(struct vrpc_channel *ch)
{
    return __atomic_load_n(&ch->qlen, __ATOMIC_ACQUIRE) == 0;
}

/* A call being started: start_call's arguments and what its steps work
 * out (only the fields named are set before a step reads them). */
struct call_start {
    const struct vrpc_method_desc *m;
    const ProtobufCMessage *req;
    const struct vrpc_call_opts *o;
    vrpc_call_cb cb; /* NULL: synchronous */
    void *arg;
    int64_t deadline;
    long mdsz;               /* metadata bytes */
    size_t plen;             /* message bytes */
    struct vrpc_buf *lb;     /* a large request packed for rendezvous, else NULL */
    struct vrpc_pb_gather gat; /* gat.nsegs > 0: lb holds the copied pieces of a gathered window */
};

/* get_conn's failure as the call's status; returns its code. */
static int conn_refused(struct vrpc_channel *ch, int rc, struct vrpc_status *st)
{
    if (rc == -ESHUTDOWN)
        vrpc_status_set(st, VRPC_UNAVAILABLE, "channel is shutting down");
    else if (rc == -EAGAIN && __atomic_load_n(&ch->last_err, __ATOMIC_RELAXED) == -ENXIO)
        vrpc_status_set(st, VRPC_UNAVAILABLE, "channel in back-off after: cannot resolve the host name of %s",
                        ch->turi);
    else if (rc == -EAGAIN)
        vrpc_status_set(st, VRPC_UNAVAILABLE, "channel in back-off after: %s", strerror(-__atomic_load_n(&ch->last_err, __ATOMIC_RELAXED)));
    else if (rc == -ENXIO)
        vrpc_status_set(st, VRPC_UNAVAILABLE, "connect failed: cannot resolve the host name of %s", ch->turi);
    else if (rc == -EINVAL)
        vrpc_status_set(st, VRPC_INVALID_ARGUMENT, "connect to %s failed: invalid argument", ch->turi);
    else
        vrpc_status_set(st, VRPC_UNAVAILABLE, "connect failed: %s", strerror(-rc));
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
                        "connection (no large-message support on one side)", need, c->b.max_payload);
    return VRPC_RESOURCE_EXHAUSTED;
}

/* A request above the eager size: pack it straight into a large buffer
 * (cs->lb), offered to the server by rendezvous (the descriptor goes in
 * place of the payload); gathered (cs->gat) when the request stays valid
 * and unchanged until the call ends for its owner (synchronous, or
 * REQ_HELD) and c can gather: big bytes values are then sent from where
 * they are (zero-copy requests, above). 0, or the status code with st
 * filled and nothing held. */
static int pack_large(struct vrpc_channel *ch, const struct vrpc_conn *c, struct call_start *cs,
                      struct vrpc_status *st)
{
    char why[VRPC_STATUS_MSG_MAX];
    if (VRPC_WIRE_HDR_LEN + (size_t)cs->mdsz + VRPC_WIRE_DESC_LEN > vrpc_ep_eager_size(c->b.ep)) {
        vrpc_status_set(st, VRPC_RESOURCE_EXHAUSTED, "metadata of %ld bytes does not fit one frame "
                        "with a large message (at most %u bytes)", cs->mdsz,
                        vrpc_ep_eager_size(c->b.ep) - VRPC_WIRE_HDR_LEN - VRPC_WIRE_DESC_LEN);
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

/* An async call without a slot (or behind calls already queued, to keep
 * their order): queue it packed in a send buffer. A large request is not
 * queued (its grant would pin memory while it waits): refused. Drops our
 * reference of c. start_call's result (0: queued). */
static int start_queued(struct vrpc_channel *ch, struct vrpc_conn *c, struct call_start *cs, struct vrpc_status *st)
{
    const struct vrpc_call_opts *o = cs->o;
    struct vrpc_buf *qb = cs->lb ? NULL : vrpc_pool_get(ch->send_pool);
    conn_unref(c);
    if (!qb) {
        vrpc_lbuf_put(cs->lb);
        return -EAGAIN;
    }
    if (cs->mdsz)
        vrpc_wire_md_encode((uint8_t *)qb->data + VRPC_WIRE_HDR_LEN, o->md, o->md_count);
    size_t plen = vrpc_pb_pack_sized(cs->req, (uint8_t *)qb->data + VRPC_WIRE_HDR_LEN + cs->mdsz);
    int rc = enqueue(ch, qb, (uint32_t)cs->mdsz, (uint32_t)plen, cs->m, o, cs->cb, cs->arg, cs->deadline);
    if (rc == 0)
        return 0;
    vrpc_pool_put(qb);
    if (rc == -EAGAIN)
        return -EAGAIN;
    vrpc_status_set(st, VRPC_UNAVAILABLE, "channel is shutting down");
    return VRPC_UNAVAILABLE;
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
            return start_queued(ch, c, cs, st);
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
        vrpc_status_set(st, VRPC_UNAVAILABLE, "channel is shutting down");
        return VRPC_UNAVAILABLE;
    }
    return 0;
}

/* Write the call's fields into its reserved slot s and publish it
 * (open_call). From open on, an async call can be completed by another
 * thread (loss scan, cancel) whose callback task drops the call's reference
 * of c before we have sent: keep one of our own until we are done with c
 * (request_go drops it). A synchronous call completes on this thread, after
 * start_call returns. */
static void call_open(struct vrpc_channel *ch, struct vrpc_conn *c, const struct call_start *cs,
                      struct vrpc_pending_slot *s, uint64_t id)
{
    s->method = cs->m;
    s->cb = cs->cb;
    s->cb_arg = cs->arg;
    s->cb_ch = ch;
    s->deadline_ns = cs->deadline;
    s->start_ns = vrpc_metrics_now_ns();
    s->out.zc = cs->gat.nsegs ? ZC_BUSY : 0; /* before open: complete() looks at it */
    if (cs->cb)
        conn_ref(c);
    s->qent = NULL;
    open_call(ch, s, id);
    check_expired(ch, cs->deadline, id);
}

/* No send buffer for the open call's request: it fails UNAVAILABLE. */
static void call_no_buf(struct vrpc_channel *ch, struct vrpc_conn *c, const struct call_start *cs,
                        struct vrpc_pending_slot *s, uint32_t gen)
{
    vrpc_lbuf_put(cs->lb);
    zc_release(ch, s, false); /* never granted */
    if (vrpc_pending_decide(s, gen)) {
        vrpc_status_set(&s->st, VRPC_UNAVAILABLE, "no send buffer free");
        complete(ch, s, gen, false);
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
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_REQUEST,
                              .method_id = cs->m->id, .request_id = id, .md_len = (uint32_t)cs->mdsz};
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
        /* the descriptor goes in once granted (offer_request) */
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
static void call_send(struct vrpc_channel *ch, struct vrpc_conn *c, struct call_start *cs,
                      struct vrpc_pending_slot *s, struct vrpc_buf *b, uint64_t id, uint32_t gen)
{
    uint32_t flen = request_frame(cs, b, id);
    enum vrpc_send_ctx ctx = cs->cb ? VRPC_SEND_NOWAIT : VRPC_SEND_WAIT; /* async: never waits for credits */
    if (cs->o && cs->o->call_id)
        __atomic_store_n(cs->o->call_id, id, __ATOMIC_RELEASE);
    if (!cs->lb) {
        request_go(ch, c, s, gen, b, flen, 0, ctx);
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
    offer_request(ch, c, s, ctx);
}

/* Start a call: connect, take a slot, pack and send. Returns 0 with *out set
 * (the slot's outcome will be decided by someone), 0 with *out NULL for an
 * async call queued for lack of a slot, -EAGAIN for an async call refused
 * (the backlog is full, or a large request finds no slot), or fills st and
 * returns its code (nothing pending). An async call (cb set) does not wait
 * for a slot or a send buffer. */
static int start_call(struct vrpc_channel *ch, const struct vrpc_method_desc *m,
                      const ProtobufCMessage *req, const struct vrpc_call_opts *o, vrpc_call_cb cb,
                      void *arg, struct vrpc_status *st, struct vrpc_pending_slot **out)
{
    struct call_start cs;
    struct vrpc_conn *c;
    struct vrpc_pending_slot *s = NULL;
    int rc;

    cs.m = m;
    cs.req = req;
    cs.o = o;
    cs.cb = cb;
    cs.arg = arg;
    cs.deadline = call_deadline(ch, o);
    cs.mdsz = 0;
    cs.lb = NULL;
    cs.gat.nsegs = 0;
    cs.gat.nrefs = 0;
    if (o && o->md_count && (cs.mdsz = vrpc_wire_md_size(o->md, o->md_count)) < 0) {
        vrpc_status_set(st, VRPC_INVALID_ARGUMENT, "invalid metadata");
        return VRPC_INVALID_ARGUMENT;
    }
    rc = get_conn(ch, cs.deadline, false, &c);
    if (rc)
        return conn_refused(ch, rc, st);
    size_t need = vrpc_pb_packed_size(req) + (size_t)cs.mdsz;
    if (need > c->b.max_payload) {
        rc = request_too_big(c, need, st);
        conn_unref(c);
        return rc;
    }
    cs.plen = need - (size_t)cs.mdsz;
    if (VRPC_WIRE_HDR_LEN + need > vrpc_ep_eager_size(c->b.ep) && (rc = pack_large(ch, c, &cs, st))) {
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

int vrpc_call(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
              ProtobufCMessage **resp, const struct vrpc_call_opts *opts, struct vrpc_status *st)
{
    struct vrpc_status local;
    struct vrpc_pending_slot *s;
    int code;

    if (!st)
        st = &local;
    if (!ch || !m || !req || !resp || req->descriptor != m->input) {
        vrpc_status_set(st, VRPC_INVALID_ARGUMENT, "bad arguments to vrpc_call");
        return VRPC_INVALID_ARGUMENT;
    }
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
            st->message[0] = 0;
        }
    } else if (st != &local) {
        *st = s->st;
    }
    if (s->deadline_ns != VRPC_NO_DEADLINE)
        vrpc_timer_cancel(ch->wheel, &s->timer);
    call_metrics(ch, m, code, s->start_ns);
    conn_unref(c); /* before owner_done, see async_done_task */
    vrpc_pending_owner_done(s, gen);
    return code;
}

int vrpc_call_async(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                    const struct vrpc_call_opts *opts, vrpc_call_cb cb, void *arg)
{
    struct vrpc_pending_slot *s;
    struct vrpc_status st;

    if (!ch || !m || !req || !cb || req->descriptor != m->input)
        return -EINVAL;
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

/* ---- create / destroy ------------------------------------------------------ */

static void worker_arena(unsigned worker, void *arg)
{
    (void)worker;
    (void)arg;
    vrpc_rpc_tls_arena();
}

int vrpc_channel_create(const char *uri, const struct vrpc_channel_opts *opts, struct vrpc_channel **out)
{
    struct vrpc_channel *ch;
    struct vrpc_transport_attr ta;
    struct vrpc_cq_attr ca;
    int rc;

    if (!uri || !out)
        return -EINVAL;
    ch = calloc(1, sizeof(*ch));
    if (!ch)
        return -ENOMEM;
    pthread_mutex_init(&ch->conn_lock, NULL);
    vrpc_offer_q_init(&ch->offers, &request_offer_ops, &ch->conn_lock);
    pthread_mutex_init(&ch->connect_mu, NULL);
    pthread_mutex_init(&ch->qlock, NULL);
    ch->qhead.next = ch->qhead.prev = &ch->qhead;
    ch->live.next = ch->live.prev = &ch->live;
    if (opts)
        ch->o = *opts;
    if (ch->o.src_addr)
        snprintf(ch->src_addr, sizeof(ch->src_addr), "%s", ch->o.src_addr);
    ch->o.src_addr = NULL;
    if (!ch->o.threads)
        ch->o.threads = 2;
    if (!ch->o.max_outstanding)
        ch->o.max_outstanding = 256;
    if (!ch->o.max_queued)
        ch->o.max_queued = ch->o.max_outstanding;
    if (!ch->o.connect_timeout_ms)
        ch->o.connect_timeout_ms = 5000;
    if (!ch->o.backoff_initial_ms)
        ch->o.backoff_initial_ms = 100;
    if (!ch->o.backoff_max_ms)
        ch->o.backoff_max_ms = 5000;
    set_state(ch, VRPC_CHANNEL_IDLE);
    if (!(ch->mt = calloc(1, sizeof(*ch->mt)))) {
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = vrpc_rpc_parse_uri(uri, ch->tname, sizeof(ch->tname), ch->turi, sizeof(ch->turi))))
        goto fail;

    if ((rc = vrpc_rndv_limits("channel", &ch->o.max_msg_size, &ch->o.max_pinned, &ch->o.hold_timeout_ms)))
        goto fail;
    if (!ch->o.min_transfer_rate)
        ch->o.min_transfer_rate = VRPC_TRANSFER_RATE_DEFAULT;
    if (!ch->o.transfer_floor_ms)
        ch->o.transfer_floor_ms = VRPC_TRANSFER_FLOOR_DEFAULT_MS;
    vrpc_transport_attr_init(&ta);
    /* Eager frames stay small whatever the message limit: larger payloads go
     * by rendezvous, so pools and receive buffers do not grow with it. */
    ta.eager_size = VRPC_RPC_DEFAULT_EAGER;
    ta.max_pinned = ch->o.max_pinned;
    ta.max_queued = ch->o.max_outstanding * 2 + 64;
    ta.connect_timeout_ms = ch->o.connect_timeout_ms;
    if ((rc = vrpc_transport_create(ch->tname, &ta, &ch->tp)))
        goto fail;
    uint32_t eager = vrpc_transport_eager_size(ch->tp);
    ch->own_max_payload = ch->o.max_msg_size;

    if ((rc = vrpc_pending_create(ch->o.max_outstanding, &ch->pend)))
        goto fail;
    if (ch->o.no_spin)
        ch->pend->spin = false;
    /* pinned: callers are expected on the poller's CPU (rpc.h, cpu_mask) */
    ch->pend->poller_cpu = ch->o.cpu_mask ? __builtin_ctzll(ch->o.cpu_mask) : -1; /* as ca.cpu below */
    ch->pend->on_free = pump;
    ch->pend->on_free_arg = ch;
    ch->nqents = ch->o.max_queued + ch->o.max_outstanding;
    if (ch->nqents >= QID_BIT || !(ch->qents = calloc(ch->nqents, sizeof(*ch->qents)))) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t i = ch->nqents; i-- > 0;) {
        ch->qents[i].ch = ch;
        ch->qents[i].qgen = 1;
        ch->qents[i].next = ch->qfree;
        ch->qfree = &ch->qents[i];
    }
    if ((rc = vrpc_timer_wheel_create(1000, &ch->wheel)))
        goto fail;
    if (ch->o.sched) {
        ch->sched = ch->o.sched;
    } else {
        struct vrpc_sched_config sc;
        vrpc_sched_config_init(&sc);
        sc.nworkers = ch->o.threads;
        if (ch->o.no_spin)
            sc.spin_us = 1; /* the scheduler's minimum: 0 means its default */
        /* async completions unpack into the worker's arena: create it now,
         * not on the worker's first completion (which may come late: an idle
         * worker that is still spinning takes new tasks without waking the
         * others) */
        sc.worker_start = worker_arena;
        sc.cpu_mask = ch->o.cpu_mask;
        sc.spin_yield = ch->o.cpu_mask != 0; /* they share the poller's CPU */
        if ((rc = vrpc_sched_create(&sc, &ch->sched)))
            goto fail;
        ch->own_sched = true;
    }
    if ((rc = vrpc_sched_producer_create(ch->sched, &ch->prod)))
        goto fail;
    if ((rc = vrpc_pool_create(ch->tp, eager, ch->o.max_outstanding + ch->o.max_queued + 64, &ch->send_pool)))
        goto fail;
    if ((rc = vrpc_pool_create(ch->tp, eager, RECV_BUFS, &ch->recv_pool)))
        goto fail;
    vrpc_cq_attr_init(&ca);
    ca.cb = channel_cq_cb;
    ca.cb_arg = ch;
    ca.busy_poll_us = ch->o.no_spin ? 0 : VRPC_RPC_BUSY_POLL_US;
    ca.max_recv = RECV_BUFS;
    ca.name = "vrpc-ch-poll";
    ca.cpu = ch->o.cpu_mask ? __builtin_ctzll(ch->o.cpu_mask) : -1;
    if ((rc = vrpc_cq_create(ch->tp, &ca, &ch->cq)))
        goto fail;
    for (unsigned i = 0; i < RECV_BUFS; i++) {
        struct vrpc_buf *b = vrpc_pool_get(ch->recv_pool);
        if (!b || vrpc_cq_post_recv(ch->cq, &b, NULL, 1)) {
            if (b)
                vrpc_pool_put(b);
            break;
        }
        __atomic_add_fetch(&ch->posted, 1, __ATOMIC_RELAXED);
    }
    *out = ch;
    return 0;
fail:
    vrpc_channel_destroy(ch);
    return rc;
}

void vrpc_channel_destroy(struct vrpc_channel *ch)
{
    if (!ch)
        return;
    set_state(ch, VRPC_CHANNEL_SHUTDOWN);
    /* queued async calls complete once, with CANCELLED; no pump sends more */
    pthread_mutex_lock(&ch->qlock);
    ch->qclosed = true;
    struct queued *flush = NULL;
    while (ch->qhead.next != &ch->qhead) {
        struct queued *e = ch->qhead.next;
        queued_unlink_locked(ch, e, Q_FAILING);
        e->next = flush;
        flush = e;
    }
    pthread_mutex_unlock(&ch->qlock);
    while (flush) {
        struct queued *e = flush;
        flush = e->next;
        queued_fail(e, VRPC_CANCELLED, "channel destroyed");
    }
    if (ch->pend) {
        vrpc_pending_close(ch->pend);
        /* every pending call completes once, with CANCELLED */
        fail_pending(ch, NULL, VRPC_CANCELLED, "channel destroyed", false);
    }
    pthread_mutex_lock(&ch->connect_mu); /* no connect in progress from here on */
    pthread_mutex_lock(&ch->conn_lock);
    struct vrpc_conn *c = ch->conn;
    ch->conn = NULL;
    for (struct vrpc_conn *l = ch->live.next; l != &ch->live; l = l->next)
        vrpc_ep_close(l->b.ep); /* each one's DISCONNECTED follows */
    pthread_mutex_unlock(&ch->conn_lock);
    pthread_mutex_unlock(&ch->connect_mu);
    conn_unref(c);
    /* Wait for every endpoint's DISCONNECTED (it fails the wire side of the
     * calls on it), then for the owners of all slots to finish. */
    uint32_t v;
    while ((v = __atomic_load_n(&ch->live_eps, __ATOMIC_ACQUIRE)) != 0)
        vrpc_rpc_futex_wait_ns(&ch->live_eps, v, 10000000);
    if (ch->pend) {
        pthread_mutex_lock(&ch->pend->lock);
        while (ch->pend->in_use)
            pthread_cond_wait(&ch->pend->cond, &ch->pend->lock);
        pthread_mutex_unlock(&ch->pend->lock);
    }
    vrpc_cq_destroy(ch->cq); /* flushes the posted receive buffers to the pool */
    vrpc_sched_producer_destroy(ch->prod);
    if (ch->own_sched)
        vrpc_sched_destroy(ch->sched);
    /* the failure callbacks of queued calls (on a caller's scheduler they
     * may still be running) */
    while ((v = __atomic_load_n(&ch->qtasks, __ATOMIC_ACQUIRE)) != 0)
        vrpc_rpc_futex_wait_ns(&ch->qtasks, v, 10000000);
    vrpc_pool_destroy(ch->recv_pool);
    vrpc_pool_destroy(ch->send_pool);
    vrpc_timer_wheel_destroy(ch->wheel);
    vrpc_pending_destroy(ch->pend);
    free(ch->qents);
    pthread_mutex_destroy(&ch->qlock);
    vrpc_transport_destroy(ch->tp);
    pthread_mutex_destroy(&ch->conn_lock);
    pthread_mutex_destroy(&ch->connect_mu);
    free(ch->mt);
    free(ch);
}
