/* Private to the server (rpc/server.c, registry.c, dispatch.c, server_conn.c,
 * server_call.c, server_stats.c): the server, its pollers, connections and
 * call objects, and the functions those files share. Not installed. */
#ifndef VRPC_RPC_SERVER_INTERNAL_H
#define VRPC_RPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <verbrpc/rpc.h>
#include <verbrpc/sched.h>
#include <verbrpc/stream.h>
#include <verbrpc/transport.h>
#include "rpc/arena.h"
#include "rpc/conn.h"
#include "rpc/futex.h"
#include "rpc/internal.h"
#include "rpc/metrics.h"
#include "rpc/offer.h"
#include "rpc/rndv.h"
#include "rpc/server_core.h"
#include "rpc/timer.h"
#include "rpc/wire.h"

#define SERVER_RECV_BUFS VRPC_SERVER_RECV_BUFS
/* Receive buffers each connection adds to its poller's (see on_accepted),
 * posted in chunks of RECV_CHUNK from pools made as connections arrive. The
 * transport reserves 2 per connection (TCP; verbs 1 + 1 control). */
#define RECV_PER_CONN 2u
#define RECV_CHUNK 64u
#define SERVER_SEND_BUFS VRPC_SERVER_SEND_BUFS

struct method_entry {
    const struct vrpc_method_desc *m;
    vrpc_handler_fn fn;                        /* unary: the handler; streams: NULL */
    const struct vrpc_server_stream_ops *sops; /* streams (m->kind not unary): the ops */
    void *user;
    struct vrpc_call_metrics cm; /* statistics (rpc/metrics.h) */
    struct vrpc_lathist lh;
    bool on_poller; /* unary: the handler runs on the poller (vrpc_server_run_on_poller) */
};

struct sconn;
struct poller;
struct vrpc_server_stream; /* rpc/server_stream.c, one per call object that carried a stream */

/* A call object's state word (atomic): generation << 32 | CALL_* flags. The
 * generation counts the calls the object has carried, so that a deadline
 * timer of an earlier call can never touch a later one.
 *   0 --request arrives (poller)--> RUN
 *   RUN --the handler answers (claim: CAS)--> RUN|DECIDED --sent--> 0
 *   RUN --deadline passes, or the connection is lost (detach: CAS)-->
 *       RUN|DECIDED|DETACHED: the server answered for the handler (or nobody
 *       can be answered); the handler's later answer only ends its hold:
 *   RUN|DECIDED|DETACHED --the handler answers--> 0
 * A detached object that is still RUN when the client reuses its slot id is
 * replaced in the slot table by a fresh object (poller), and freed when its
 * handler lets go. Lifetime is a reference count: one for the slot table,
 * one from arrival until the handler answers (or the call is refused before
 * a handler ran), one while a deadline timer is armed or firing. */
#define CALL_RUN 0x1u
#define CALL_DECIDED 0x2u
#define CALL_DETACHED 0x4u

enum { XFER_NONE = 0, XFER_READING = 1, XFER_EXPIRING = 2, XFER_EXPIRED = 3 };

struct vrpc_server_call {
    struct vrpc_task task;
    struct vrpc_server *s;
    struct sconn *conn; /* valid while RUN and not DETACHED (the call holds a reference) */
    struct method_entry *me;
    const struct vrpc_method_desc *method;
    uint64_t state;     /* atomic, see above */
    uint32_t refs;      /* atomic */
    uint32_t cancelled; /* atomic: client cancel, connection loss, deadline, detach */
    int detach_rc;      /* what a detached call's late answer returns (set before DETACHED) */
    uint64_t req_id;
    int64_t arrival_ns, deadline_ns;
    struct vrpc_timer timer; /* server-side deadline while the call runs */
    uint8_t *buf;            /* copy of metadata + payload */
    uint32_t cap, len, md_len;
    size_t nmd;
    struct vrpc_metadata *md; /* VRPC_MD_MAX entries, allocated on first use */
    struct vrpc_arena arena;
    struct vrpc_rndv_in in; /* a large request payload being read (poller) */
    /* The read's time limit, armed at the announcement (vrpc_srv_transfer_expired):
     * xfer is XFER_READING from then until the read is over (poller: CAS to
     * XFER_NONE) or the limit passed (timer: CAS to XFER_EXPIRING, then, once
     * it has decided the call's outcome, XFER_EXPIRED); the armed timer holds
     * a reference. */
    uint32_t xfer; /* atomic */
    int64_t xfer_start_ns;
    struct vrpc_timer xfer_timer;
    struct vrpc_buf *req_lb;       /* the large request payload, read: unpacked then put back */
    struct vrpc_server_stream *st; /* the stream state, made for the first stream on this
                                      object and kept (freed with the object); NULL: never */
    /* Unary response metadata, encoded (malloc), set by the handler and sent
     * with the answer (HEADERS first, trailers in the RESPONSE); freed when
     * the call ends. md_flags: CALL_MD_* set (the handler's thread). */
    uint8_t *initial, *trailers;
    uint32_t initial_len, trailers_len;
    uint32_t md_flags;
};
#define CALL_MD_INITIAL 0x1u
#define CALL_MD_TRAILERS 0x2u

struct poller {
    struct vrpc_server *s;
    struct vrpc_cq *cq;
    struct vrpc_sched_producer *prod; /* this poller thread's ring */
    struct vrpc_rndv_retry retry;     /* reads/revokes to retry (this poller only) */
    struct vrpc_offer_q offers;       /* response offers of its connections waiting
                                         for a grant (lock: s->lock) */
    /* Receive buffers beyond SERVER_RECV_BUFS (poller only): */
    uint32_t nconns;         /* connections of this poller, accepted and not gone */
    uint32_t extra;          /* buffers posted for them (never unposted) */
    struct vrpc_pool **grow; /* pools of RECV_CHUNK buffers behind them */
    uint32_t ngrow, capgrow;
};

struct sconn {
    struct vrpc_conn_base b; /* first (rpc/conn.h). refs: the endpoint (until
                                DISCONNECTED) + each busy call; max_payload:
                                md + message bytes we may send back; peer_max:
                                the client's max_msg_size; gone: DISCONNECTED
                                seen (under s->lock): no new grant */
    struct vrpc_server *s;
    struct poller *poller;
    uint32_t ncalls;
    struct vrpc_server_call **calls; /* slot table: written by the poller only */
    struct vrpc_rndv_out *rsp;       /* ncalls: large responses until the client's DONE
                                  (by slot; state moves as in rpc/rndv.h) */
    /* Send quota (see vrpc_srv_conn_buf): frames handed to the transport on this
     * connection whose SEND completion has not come (atomic), and the last
     * sign of progress while more than half the quota is out (atomic; read
     * and written only then, so the common case reads no clock). */
    uint32_t sends;
    int64_t send_progress_ns;
    uint64_t rd_pinned;        /* bytes of large requests being read (poller only) */
    uint32_t peer_window;      /* the client's stream_window (HELLO) */
    struct sconn *next, *prev; /* server list, under s->lock */
    /* Lifecycle watch (vrpc_srv_conn_sweep, under s->lock): */
    int64_t accepted_ns;
    uint32_t hello_seen;  /* atomic: the RPC HELLO arrived */
    uint32_t calls_seen;  /* atomic: REQUEST frames received (poller writes) */
    uint32_t sweep_calls; /* calls_seen at sweep_ns */
    int64_t sweep_ns;     /* last time the sweep saw it busy or active */
};

struct vrpc_server {
    struct vrpc_server_opts o;
    uint32_t max_payload;
    uint32_t send_quota, send_half; /* o.max_sends_per_conn and half of it */
    struct method_entry *methods;   /* registration order */
    size_t nmethods, capmethods;
    struct method_entry **index; /* open addressing by id, built at start */
    uint32_t index_mask;
    bool started;

    struct vrpc_transport *tp;
    struct poller *pollers;
    unsigned npollers;
    struct vrpc_listener *listener;
    struct vrpc_pool *send_pool, *recv_pool;
    struct vrpc_sched *sched;
    bool own_sched;
    char uri[VRPC_URI_MAX];

    struct vrpc_timer_wheel *wheel; /* hold timeouts of large responses, deadlines of
                                       calls whose handler runs */
    pthread_mutex_t lock;           /* conns list, shutdown, grants vs DISCONNECTED */
    struct sconn conns;             /* list head */
    uint32_t nconns;                /* futex: sconns not yet freed */
    uint32_t inflight;              /* futex: calls arrived and not yet answered */
    uint32_t tasks;                 /* futex: call tasks submitted and not yet finished */
    uint32_t shutting;              /* atomic */
    bool shut_done;
    int shut_rc;
    struct vrpc_timer sweep; /* vrpc_srv_conn_sweep: HELLO and idle timeouts */
    int64_t sweep_every_ns;
    char metrics_addr[VRPC_URI_MAX]; /* opts.metrics_addr, copied; "": none */
    struct vrpc_metrics_http *http;  /* its endpoint (rpc/metrics_http.c) */
    struct vrpc_server_hooks hooks;  /* the layer above's (server_core.h) */
};

#define ST_GEN(w) ((uint32_t)((w) >> 32))
#define ST_FLAGS(w) ((uint32_t)(w))
#define ST_WORD(g, f) (((uint64_t)(g) << 32) | (f))

/* ---- shared hot helpers (inline: they run on every call) ----------------- */

/* Statistics of one finished call of me (NULL: none). Any thread. */
static inline void vrpc_srv_record(struct method_entry *me, enum vrpc_code code, int64_t arrival_ns)
{
    if (!me)
        return;
    int64_t d = vrpc_now_ns() - arrival_ns;
    uint64_t ns = d > 0 ? (uint64_t)d : 0;
    vrpc_call_metrics_record(&me->cm, code, ns);
    vrpc_lathist_record(&me->lh, ns / 1000);
}

/* The method registered under id (vrpc_srv_build_index ran), or NULL. */
static inline struct method_entry *vrpc_srv_lookup(const struct vrpc_server *s, uint32_t id)
{
    for (uint32_t h = id & s->index_mask;; h = (h + 1) & s->index_mask) {
        struct method_entry *me = s->index[h];
        if (!me || me->m->id == id)
            return me;
    }
}

/* Poller: a SEND completion of c (also a flushed one). */
static inline void vrpc_srv_conn_sent(struct sconn *c)
{
    uint32_t left = __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED);
    if (left >= c->s->send_half) /* still loaded: the client reads, slowly */
        __atomic_store_n(&c->send_progress_ns, vrpc_now_ns(), __ATOMIC_RELAXED);
}

void vrpc_srv_call_unref(struct vrpc_server_call *call);

/* Drop a reference on c; the last one (the endpoint's or a call's) frees it.
 * Any thread. */
static inline void vrpc_srv_sconn_unref(struct sconn *c)
{
    if (!c || !vrpc_conn_unref_last(&c->b))
        return;
    struct vrpc_server *s = c->s;
    vrpc_ep_destroy(c->b.ep);
    for (uint32_t i = 0; i < c->ncalls; i++)
        vrpc_srv_call_unref(c->calls[i]); /* the slot table's reference */
    free(c->calls);
    free(c->rsp);
    free(c);
    __atomic_sub_fetch(&s->nconns, 1, __ATOMIC_RELEASE);
    vrpc_futex_wake_all(&s->nconns);
}

/* ---- registry.c ---------------------------------------------------------- */

/* Build the lookup index of the registered methods (at start). 0 or -ENOMEM. */
int vrpc_srv_build_index(struct vrpc_server *s);

/* ---- server_conn.c: failing a connection, the per-connection send quota -- */

/* Log a protocol error of c's client once and close c. Poller thread. */
void vrpc_srv_conn_protocol_error(struct sconn *c, const char *what, int rc);
/* Log why c is failed (once) and abort it. Any thread. */
void vrpc_srv_conn_fail(struct sconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A send buffer counted against c's quota, or NULL (c failed, or the pool
 * stayed empty); send it with vrpc_srv_conn_send. */
struct vrpc_buf *vrpc_srv_conn_buf(struct sconn *c, bool wait);
/* Send b (from vrpc_srv_conn_buf) on c, never waiting; on error b goes back. */
int vrpc_srv_conn_send(struct sconn *c, struct vrpc_buf *b, uint32_t len);
/* Send wrs[0..n) (buffers from vrpc_srv_conn_buf) on c in one
 * vrpc_ep_send_list, never waiting. Returns how many the transport took;
 * the rest went back as vrpc_srv_conn_send's failures do. */
unsigned vrpc_srv_conn_send_list(struct sconn *c, const struct vrpc_send_wr *wrs, unsigned n);
/* A header-only frame (plus a short payload) on c through its quota. */
int vrpc_srv_conn_send_simple(struct sconn *c, const struct vrpc_wire_hdr *h, const void *payload, uint32_t payload_len,
                              bool wait);
/* The RESPONSE flags of a refusal: VRPC_FF_REFUSED when the request was left
 * unprocessed (unread) and c's client reads the flag (VRPC_FEAT_REFUSED in
 * its HELLO; an older client would reject the frame), else 0. */
static inline uint16_t vrpc_srv_refused_flag(const struct sconn *c, bool unread)
{
    return unread && (c->b.peer_features & VRPC_FEAT_REFUSED) ? VRPC_FF_REFUSED : 0;
}

/* ---- server_call.c: a call's life ------------------------------------------ */

/* A fresh call object for c's slot table (one reference: the table's). */
struct vrpc_server_call *vrpc_srv_call_new(struct vrpc_server *s, struct sconn *c);
/* Decide the call's outcome for the server (deadline, connection lost); see
 * there. Returns its connection, still referenced, or NULL when lost. */
struct sconn *vrpc_srv_call_detach(struct vrpc_server_call *call, uint32_t gen, enum vrpc_code code, int rc,
                                   bool by_timer, uint64_t *id);
/* One call fewer in flight; the call's hold on c ends. */
void vrpc_srv_answered(struct sconn *c);
/* The handler's side of the race with vrpc_srv_call_detach: 0 when it
 * decides the outcome, else the detach reason (or -EINVAL). */
int vrpc_srv_call_claim(struct vrpc_server_call *call);
/* The worker task of a call: checks, unpacks, runs the handler. */
void vrpc_srv_call_task(struct vrpc_task *t);
/* Timer callbacks (the wheel's thread): a call's deadline, a large request's
 * read limit. ctx is the call, the argument its generation. */
void vrpc_srv_deadline_fired(void *ctx, uint64_t gen);
void vrpc_srv_transfer_expired(void *ctx, uint64_t gen);
/* The offer machine's operations for large responses (rpc/offer.h). */
extern const struct vrpc_offer_ops vrpc_srv_response_offer_ops;

/* ---- server_stream.c: streams ------------------------------------------------ */

/* Poller, on REQUEST|STREAM admitted for a stream method: prepare call's
 * stream state for the new stream (allocates it for the object's first
 * stream). 0 or -ENOMEM. */
int vrpc_srv_stream_open(struct vrpc_server_call *call, struct method_entry *me, uint64_t id, uint32_t gen);
/* Poller: the stream call just published: arm its deadline, queue its task
 * (which runs start). */
void vrpc_srv_stream_go(struct poller *pl, struct vrpc_server_call *call, uint32_t gen);
/* vrpc_srv_call_detach won for a stream call: the stream has ended for the
 * server (its RESPONSE is the detacher's); wakes writers, queues on_cancel.
 * Any thread. */
void vrpc_srv_stream_detached(struct vrpc_server_call *call, uint32_t gen);
/* Free the stream state of a call object being freed. */
void vrpc_srv_stream_free(struct vrpc_server_stream *st);
/* Poller: MESSAGE, HALF_CLOSE, WINDOW frames from the client (receiver rules
 * of docs/PROTOCOL.md). */
void vrpc_srv_stream_on_message(struct sconn *c, const struct vrpc_wire_hdr *h, const uint8_t *body);
void vrpc_srv_stream_on_half_close(struct sconn *c, const struct vrpc_wire_hdr *h);
void vrpc_srv_stream_on_window(struct sconn *c, const struct vrpc_wire_hdr *h, const uint8_t *body);
/* Poller: the read of a large client MESSAGE (into call->in) finished, or
 * failed with status; true if call->in was a stream's (else it is a request's). */
bool vrpc_srv_stream_read_done(struct vrpc_server_call *call, int status);
/* The offer of a stream's large message (o not in c->rsp) is off the
 * parked list (rpc/offer.h ops->done): its descriptor goes, or it fails. */
int vrpc_srv_stream_offer_done(struct vrpc_rndv_out *o);
/* Poller: o (not in c->rsp) is a stream's large-message grant: its REVOKE
 * completed (wake the writer), DONE for it came (revoke), c lost (drop). */
bool vrpc_srv_stream_is_offer(const struct sconn *c, const struct vrpc_rndv_out *o);
/* Any thread, c kept alive (the hold timer, under s->lock): o is the grant
 * record of one of c's streams. Reads only c's call objects, never o. */
bool vrpc_srv_stream_owns_offer(const struct sconn *c, const struct vrpc_rndv_out *o);
void vrpc_srv_stream_offer_revoked(struct vrpc_rndv_out *o);
bool vrpc_srv_stream_on_done(struct sconn *c, const struct vrpc_wire_hdr *h);
void vrpc_srv_stream_conn_lost(struct sconn *c);
/* Poller: CANCEL of a stream call in flight (generation gen). */
void vrpc_srv_stream_cancel(struct vrpc_server_call *call, uint32_t gen);
/* After vrpc_srv_call_detach won for call (generation gen, c and id from
 * it): true if call is that stream and a frame of it is being handed to the
 * transport; its RESPONSE (code, msg) is then sent by that sender, after
 * the frame, which also calls vrpc_srv_answered(c). False: the caller
 * sends the RESPONSE now. Any thread, no lock held. */
bool vrpc_srv_stream_hold_end(struct vrpc_server_call *call, uint32_t gen, struct sconn *c, uint64_t id,
                              enum vrpc_code code, const char *msg);

/* ---- server_call.c, for streams --------------------------------------------- */

/* After a successful claim: release the call object and record code; returns
 * its connection, still referenced (send, then vrpc_srv_answered). */
struct sconn *vrpc_srv_finish_call(struct vrpc_server_call *call, enum vrpc_code code);
/* The server ends the call (won detach) with code and msg: RESPONSE out
 * (never waiting), then vrpc_srv_answered. Any thread. */
void vrpc_srv_end_detached(struct sconn *c, uint64_t id, enum vrpc_code code, const char *msg);

/* ---- dispatch.c: the poller side ------------------------------------------- */

/* A poller's completion callback (cb_arg: its struct poller). */
void vrpc_srv_cq_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg);
/* The HELLO and idle timeouts' sweep (the wheel's thread; ctx: the server). */
void vrpc_srv_conn_sweep(void *ctx, uint64_t arg);

#endif
