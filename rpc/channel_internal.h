/* The channel's private header: the objects its files share (the channel,
 * its connections, the queue entries of calls waiting for a slot, a call
 * being started), the small helpers the call path inlines, and the
 * functions one file of the channel calls in another:
 *   rpc/channel.c       create, destroy, options, connect: the public channel API
 *   rpc/channel_conn.c  connections: connecting, the handshake, GOAWAY, loss,
 *                       the client's frame table and the poller
 *   rpc/call.c          a call's life: start, send, response, completion,
 *                       deadline, cancel
 *   rpc/call_queue.c    async calls queued for lack of a slot
 *   rpc/call_large.c    large messages: request offers (grant, hold timer,
 *                       DONE, revoke), zero-copy requests, response reads
 *   rpc/stream*.c       streams (their own private header, rpc/stream_internal.h)
 * Nothing here is part of the public API. */
#ifndef VRPC_RPC_CHANNEL_INTERNAL_H
#define VRPC_RPC_CHANNEL_INTERNAL_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
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
#include "rpc/timer.h"
#include "rpc/wire.h"

struct vrpc_conn {
    struct vrpc_conn_base b; /* first (rpc/conn.h). refs: the ep (until
                                DISCONNECTED), the channel's current pointer,
                                and each call using it; goaway: the server
                                said GOAWAY; gone under conn_lock */
    struct vrpc_channel *ch;
    bool gather;                   /* the transport grants gathered windows (vrpc_ep_grant_segs):
                             requests may be sent from the caller's memory */
    struct vrpc_conn *next, *prev; /* channel's list of live endpoints, under conn_lock */
    uint32_t stream_window;        /* the server's (HELLO_ACK): MESSAGEs we may send per
                                      stream before it returns window */
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
    uint32_t qgen;    /* under qlock, never 0 */
    uint8_t state;    /* Q_*, under qlock */
    uint64_t slot_id; /* LAUNCHED: the request id it was sent with (under qlock) */
    const struct vrpc_method_desc *m;
    vrpc_call_cb cb;
    void *arg;
    bool cb_on_poller; /* VRPC_CALL_CB_ON_POLLER */
    int64_t deadline;
    struct vrpc_timer timer; /* its deadline while queued */
    struct vrpc_resp_md *resp_md;
    struct vrpc_task task; /* runs cb when it failed while queued */
    struct vrpc_status st;
};

struct vrpc_lb;
struct vrpc_channel {
    struct vrpc_lb *lb; /* a channel over many servers (rpc/lb.h): only this and
                           state are set, every call goes to rpc/lb_call.c */
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

    pthread_mutex_t qlock; /* the async backlog: queue, free list, qclosed */
    struct queued *qents;  /* nqents = max_queued + max_outstanding entries: a
                                sent call keeps its entry (one per slot at most) */
    uint32_t nqents;
    struct queued *qfree; /* free entries (singly linked through next) */
    struct queued qhead;  /* queue head (sentinel) */
    bool qclosed;
    uint32_t qlen;   /* QUEUED entries: written under qlock, read without it */
    uint32_t qtasks; /* futex: failure callbacks of entries not yet run */

    uint32_t live_eps;            /* futex: endpoints whose DISCONNECTED has not arrived */
    struct vrpc_conn live;        /* list head of those endpoints' conns (under conn_lock) */
    uint32_t posted;              /* receive buffers posted, for destroy */
    struct vrpc_rndv_retry retry; /* reads/revokes to retry (poller only) */
    struct vrpc_offer_q offers;   /* request offers waiting for a grant (lock: conn_lock) */
    struct vrpc_method_table *mt; /* per-method call metrics (rpc/metrics.h) */
    pthread_mutex_t slock;        /* streams[] (rpc/stream_internal.h) */
    struct vrpc_stream **streams; /* by slot index: the open stream of that slot, or NULL */
};

/* A call being started: start_call's arguments and what its steps work
 * out (only the fields named are set before a step reads them). */
struct call_start {
    const struct vrpc_method_desc *m;
    const ProtobufCMessage *req;
    const struct vrpc_call_opts *o;
    vrpc_call_cb cb; /* NULL: synchronous */
    void *arg;
    int64_t deadline;
    long mdsz;                 /* metadata bytes */
    size_t plen;               /* message bytes */
    struct vrpc_buf *lb;       /* a large request packed for rendezvous, else NULL */
    struct vrpc_pb_gather gat; /* gat.nsegs > 0: lb holds the copied pieces of a gathered window */
};

static inline void set_state(struct vrpc_channel *ch, enum vrpc_channel_state st)
{
    __atomic_store_n(&ch->state, (int)st, __ATOMIC_RELEASE);
}

/* A call's outcome into the metrics; start_ns 0: refused before it had a slot (untimed). */
static inline void call_metrics(struct vrpc_channel *ch, const struct vrpc_method_desc *m, int code, int64_t start_ns)
{
    vrpc_method_table_done(ch->mt, m, (enum vrpc_code)code, start_ns);
}

/* The last reference destroys the endpoint: only then can no other thread
 * be sending on it (the transport forbids any call after vrpc_ep_destroy). */
static inline void conn_unref(struct vrpc_conn *c)
{
    if (c && vrpc_conn_unref_last(&c->b)) {
        vrpc_ep_destroy(c->b.ep);
        free(c);
    }
}

static inline void conn_ref(struct vrpc_conn *c) { vrpc_conn_ref(&c->b); }

/* ---- a call's wire side and its transfers (see pending.h, xfer) ---------- */

static inline void slot_hold(struct vrpc_pending_slot *s) { __atomic_add_fetch(&s->xfer, 1, __ATOMIC_RELAXED); }

/* Drop one hold; the last one after the response ends the wire side. */
static inline void slot_drop(struct vrpc_pending_slot *s, uint32_t gen)
{
    if ((uint32_t)__atomic_sub_fetch(&s->xfer, 1, __ATOMIC_ACQ_REL) == VRPC_PEND_XFER_SEEN)
        vrpc_pending_wire_done(s, gen);
}

/* The server can send nothing more for this call (its RESPONSE came or the
 * connection died). True the first time. */
static inline bool slot_seen(struct vrpc_pending_slot *s, uint32_t gen)
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
 * vrpc_ch_zc_release. A synchronous caller waits for it in vrpc_call (ZC_SLEEP: it
 * sleeps on the word); an async call's callback is deferred (ZC_CB: complete
 * found it busy, vrpc_ch_zc_release submits the completion task). */
#define ZC_BUSY 1u
#define ZC_SLEEP 2u
#define ZC_CB 4u

/* Synchronous owner: wait until the server can no longer read our memory. */
static inline void zc_wait(struct vrpc_pending_slot *s)
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

/* No async call is queued for a slot (read without qlock). */
static inline bool backlog_empty(struct vrpc_channel *ch) { return __atomic_load_n(&ch->qlen, __ATOMIC_ACQUIRE) == 0; }

/* The channel's connection of a connection base (rpc/conn.h). */
static inline struct vrpc_conn *client_conn(struct vrpc_conn_base *b) { return container_of(b, struct vrpc_conn, b); }

/* ---- rpc/call.c: a call's life ------------------------------------------- */

/* Hand the decided outcome to its owner. on_poller: we run on the CQ poller
 * and may use the channel's producer ring. */
void vrpc_ch_complete_submit(struct vrpc_channel *ch, struct vrpc_pending_slot *s, bool on_poller);
/* The decided outcome of slot s (generation gen) to its owner: wake the
 * synchronous caller or submit the async completion (deferred while the
 * request is still granted from the caller's memory). */
void vrpc_ch_complete(struct vrpc_channel *ch, struct vrpc_pending_slot *s, uint32_t gen, bool on_poller);
/* The wheel's thread (or the caller, check_expired): call id's deadline. */
void vrpc_ch_deadline_fired(void *ctx, uint64_t id);
/* Fail every call pending on c (all calls if c is NULL) with code (exactly
 * once each, by decide) and mark their wire side done. */
void vrpc_ch_fail_pending(struct vrpc_channel *ch, struct vrpc_conn *c, enum vrpc_code code, const char *why,
                          bool on_poller);
/* The end of sending a request: send frame b (flen bytes) unless rc already
 * says why not, fail the call if it could not go, end the owner's set-up
 * hold. Drops an async call's own reference of c. */
void vrpc_ch_request_go(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s, uint32_t gen,
                        struct vrpc_buf *b, uint32_t flen, int rc, enum vrpc_send_ctx ctx);
/* Poller: HEADERS for a unary call's slot s (its initial metadata). */
void vrpc_ch_unary_headers(struct vrpc_conn *c, struct vrpc_pending_slot *s, const struct vrpc_wire_hdr *h,
                           const uint8_t *md);
/* The client's RESPONSE entry (poller). */
void vrpc_ch_on_response(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body);

/* Publish a reserved slot whose call fields the owner has written: arm its
 * deadline, then INUSE (release, pending.h "Publication of a call"): a loss
 * scan, cancel or deadline that sees the slot completes it with these fields,
 * never with the previous occupant's callback. The timer is armed before, so
 * an owner's completion (which may run on a worker before start_call
 * returns) always finds it armed and cancels it; a deadline that fired in
 * between found the slot not yet open and did nothing, so the check after
 * open decides it here (decide makes it exactly once). */
static inline void open_call(struct vrpc_channel *ch, struct vrpc_pending_slot *s, uint64_t id)
{
    s->hdrs = false;
    if (s->resp_md) {
        s->md_len = s->imd_len = 0;
        s->md_final = false;
    }
    if (s->deadline_ns != VRPC_NO_DEADLINE)
        vrpc_timer_arm(ch->wheel, &s->timer, s->deadline_ns, vrpc_ch_deadline_fired, ch, id);
    vrpc_pending_open(s);
}

/* After open_call, with no lock held: the deadline may have passed already. */
static inline void check_expired(struct vrpc_channel *ch, int64_t deadline, uint64_t id)
{
    if (deadline != VRPC_NO_DEADLINE && vrpc_now_ns() >= deadline)
        vrpc_ch_deadline_fired(ch, id);
}

/* A call's deadline from its options (VRPC_NO_DEADLINE: none). */
int64_t vrpc_ch_call_deadline(const struct vrpc_channel *ch, const struct vrpc_call_opts *o);
/* vrpc_ch_get_conn's failure rc as a call's status; returns its code. */
int vrpc_ch_conn_refused(struct vrpc_channel *ch, int rc, struct vrpc_status *st);

/* ---- rpc/channel_conn.c: connections and the poller ---------------------- */

/* The connection is unusable from now on: fail its calls (once). */
void vrpc_ch_conn_fail(struct vrpc_conn *c, const char *why, bool on_poller);
/* Poller: a protocol error from the server: log, fail, close. */
void vrpc_ch_protocol_error(struct vrpc_conn *c, const char *what, int rc);
/* A referenced usable connection, connecting if needed. -EAGAIN means the
 * channel is backing off after failed attempts. */
int vrpc_ch_get_conn(struct vrpc_channel *ch, int64_t deadline_ns, bool force, struct vrpc_conn **out);
/* The channel's CQ poller callback. */
void vrpc_ch_cq_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg);

/* ---- rpc/call_queue.c: async calls waiting for a slot -------------------- */

/* The entries and their free list (vrpc_channel_create). 0 or -ENOMEM. */
int vrpc_ch_queue_init(struct vrpc_channel *ch);
/* Close the queue (vrpc_channel_destroy): queued calls complete once, with
 * CANCELLED; no pump sends more. */
void vrpc_ch_queue_close(struct vrpc_channel *ch);
/* The call of entry e is over: back to the free list, its id dead. */
void vrpc_ch_queued_release(struct vrpc_channel *ch, struct queued *e);
/* vrpc_channel_cancel for an id of a call that was queued. */
int vrpc_ch_cancel_queued(struct vrpc_channel *ch, uint64_t id);
/* Send queued calls while slots are free (pending's on_free). */
void vrpc_ch_pump(void *arg);
/* start_call's step for an async call without a slot: queue it. */
int vrpc_ch_start_queued(struct vrpc_channel *ch, struct vrpc_conn *c, struct call_start *cs, struct vrpc_status *st);

/* ---- rpc/call_large.c: large messages ------------------------------------ */

/* The request offers' machine (rpc/offer.h), for vrpc_offer_q_init. */
extern const struct vrpc_offer_ops vrpc_ch_request_offer_ops;
/* The caller's memory is no longer granted (any thread; once per call). */
void vrpc_ch_zc_release(struct vrpc_channel *ch, struct vrpc_pending_slot *s, bool on_poller);
/* start_call's step for a request above the eager size: pack it into a
 * large buffer (cs->lb), gathered when it can be. 0, or the status code. */
int vrpc_ch_pack_large(struct vrpc_channel *ch, const struct vrpc_conn *c, struct call_start *cs,
                       struct vrpc_status *st);
/* Offer the packed request payload (s->out.p_*) to the server. */
void vrpc_ch_offer_request(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                           enum vrpc_send_ctx ctx);
/* Poller: RESPONSE|RNDV: read the payload (unless the call is already over). */
void vrpc_ch_on_large_response(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                               const struct vrpc_wire_hdr *h, const uint8_t *descp);
/* Poller: DONE with code for the RNDV payload of id (never waits; closes c
 * if it cannot go). */
void vrpc_ch_send_done(struct vrpc_channel *ch, struct vrpc_conn *c, uint64_t id, enum vrpc_code code);
/* The client's DONE entry (poller). */
void vrpc_ch_on_done(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body);
/* Poller: the REVOKE completion of the call's grant. */
void vrpc_ch_request_revoked(struct vrpc_channel *ch, struct vrpc_pending_slot *s);
/* Poller: the read of a response payload finished (or could not start). */
void vrpc_ch_response_read_done(struct vrpc_channel *ch, struct vrpc_rndv_in *in, int status);
/* The read retry list's failure callback (arg: the channel). */
void vrpc_ch_response_read_failed(struct vrpc_rndv_in *in, int rc, void *arg);
/* Poller, as the read of a large response or stream MESSAGE (frame h) into
 * s->in starts: arm its limit, transfer_floor_ms + the size at
 * min_transfer_rate from now, whatever trickles in (s->rd_xfer, s->rd_timer).
 * At the limit (the wheel's thread) the call ends RESOURCE_EXHAUSTED, or the
 * stream fails so, and the connection is aborted. */
void vrpc_ch_read_limit(struct vrpc_channel *ch, struct vrpc_pending_slot *s, const struct vrpc_wire_hdr *h);
/* Poller, at that read's completion: true when its limit was disarmed;
 * false when the limit won (the call or stream is over, the connection
 * aborted: no DONE), once the expiry has finished. */
bool vrpc_ch_read_unlimit(struct vrpc_channel *ch, struct vrpc_pending_slot *s, uint32_t gen);
/* Poller, at ep's DISCONNECTED: give back the buffers of grants not
 * revoked, and fail reads still waiting to start. */
void vrpc_ch_release_transfers(struct vrpc_channel *ch, struct vrpc_ep *ep);

/* End the grant of the call's request payload (poller): DONE or the RESPONSE
 * came. The buffer goes back on the REVOKE completion. */
static inline void request_revoke(struct vrpc_channel *ch, struct vrpc_pending_slot *s)
{
    vrpc_offer_revoke(&ch->retry, &s->out, "request");
}

#endif
