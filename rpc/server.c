/* The server side: method registry, per-connection call tables bounded by
 * the credits granted in HELLO_ACK, the poller path that validates a request
 * and hands it to a scheduler worker, handlers answering from any thread,
 * per-method statistics, and graceful shutdown (GOAWAY, drain, close). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
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
#include "rpc/rndv.h"
#include "rpc/server_core.h"
#include "rpc/status.h"
#include "rpc/timer.h"
#include "rpc/wire.h"

#define SERVER_RECV_BUFS VRPC_SERVER_RECV_BUFS
/* Receive buffers each connection adds to its poller's (see on_accepted),
 * posted in chunks of RECV_CHUNK from pools made as connections arrive. The
 * transport reserves 2 per connection (TCP; verbs 1 + 1 control). */
#define RECV_PER_CONN 2u
#define RECV_CHUNK 64u
#define MAX_CONNECTIONS_DEFAULT 1024u
#define HELLO_TIMEOUT_DEFAULT_MS 5000u
#define IDLE_TIMEOUT_DEFAULT_MS 300000u
#define SERVER_SEND_BUFS VRPC_SERVER_SEND_BUFS

struct method_entry {
    const struct vrpc_method_desc *m;
    vrpc_handler_fn fn;
    void *user;
    struct vrpc_call_metrics cm; /* statistics (rpc/metrics.h) */
    struct vrpc_lathist lh;
};

struct sconn;

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
    struct sconn *conn;   /* valid while RUN and not DETACHED (the call holds a reference) */
    struct method_entry *me;
    const struct vrpc_method_desc *method;
    uint64_t state;       /* atomic, see above */
    uint32_t refs;        /* atomic */
    uint32_t cancelled;   /* atomic: client cancel, connection loss, deadline, detach */
    int detach_rc;        /* what a detached call's late answer returns (set before DETACHED) */
    uint64_t req_id;
    int64_t arrival_ns, deadline_ns;
    struct vrpc_timer timer;  /* server-side deadline while the call runs */
    uint8_t *buf;       /* copy of metadata + payload */
    uint32_t cap, len, md_len;
    size_t nmd;
    struct vrpc_metadata *md; /* VRPC_MD_MAX entries, allocated on first use */
    struct vrpc_arena arena;
    struct vrpc_rndv_in in;   /* a large request payload being read (poller) */
    /* The read's time limit, armed at the announcement (transfer_expired):
     * xfer is XFER_READING from then until the read is over (poller: CAS to
     * XFER_NONE) or the limit passed (timer: CAS to XFER_EXPIRING, then, once
     * it has decided the call's outcome, XFER_EXPIRED); the armed timer holds
     * a reference. */
    uint32_t xfer;            /* atomic */
    int64_t xfer_start_ns;
    struct vrpc_timer xfer_timer;
    struct vrpc_buf *req_lb;  /* the large request payload, read: unpacked then put back */
};

struct poller {
    struct vrpc_server *s;
    struct vrpc_cq *cq;
    struct vrpc_sched_producer *prod; /* this poller thread's ring */
    struct vrpc_rndv_retry retry;     /* reads/revokes to retry (this poller only) */
    struct vrpc_offer_q offers;       /* response offers of its connections waiting
                                         for a grant (lock: s->lock) */
    /* Receive buffers beyond SERVER_RECV_BUFS (poller only): */
    uint32_t nconns;                  /* connections of this poller, accepted and not gone */
    uint32_t extra;                   /* buffers posted for them (never unposted) */
    struct vrpc_pool **grow;          /* pools of RECV_CHUNK buffers behind them */
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
    struct vrpc_rndv_out *rsp; /* ncalls: large responses until the client's DONE
                                  (by slot; state moves as in rpc/rndv.h) */
    /* Send quota (see conn_buf): frames handed to the transport on this
     * connection whose SEND completion has not come (atomic), and the last
     * sign of progress while more than half the quota is out (atomic; read
     * and written only then, so the common case reads no clock). */
    uint32_t sends;
    int64_t send_progress_ns;
    uint64_t rd_pinned;        /* bytes of large requests being read (poller only) */
    struct sconn *next, *prev; /* server list, under s->lock */
    /* Lifecycle watch (conn_sweep, under s->lock): */
    int64_t accepted_ns;
    uint32_t hello_seen;       /* atomic: the RPC HELLO arrived */
    uint32_t calls_seen;       /* atomic: REQUEST frames received (poller writes) */
    uint32_t sweep_calls;      /* calls_seen at sweep_ns */
    int64_t sweep_ns;          /* last time the sweep saw it busy or active */
};

struct vrpc_server {
    struct vrpc_server_opts o;
    uint32_t max_payload;
    uint32_t send_quota, send_half; /* o.max_sends_per_conn and half of it */
    struct method_entry *methods; /* registration order */
    size_t nmethods, capmethods;
    struct method_entry **index;  /* open addressing by id, built at start */
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
    pthread_mutex_t lock;  /* conns list, shutdown, grants vs DISCONNECTED */
    struct sconn conns;    /* list head */
    uint32_t nconns;       /* futex: sconns not yet freed */
    uint32_t inflight;     /* futex: calls arrived and not yet answered */
    uint32_t tasks;        /* futex: call tasks submitted and not yet finished */
    uint32_t shutting;     /* atomic */
    bool shut_done;
    int shut_rc;
    struct vrpc_timer sweep; /* conn_sweep: HELLO and idle timeouts */
    int64_t sweep_every_ns;
    char metrics_addr[VRPC_URI_MAX]; /* opts.metrics_addr, copied; "": none */
    struct vrpc_metrics_http *http;  /* its endpoint (rpc/metrics_http.c) */
};

/* ---- statistics ------------------------------------------------------------ */

static void record(struct method_entry *me, enum vrpc_code code, int64_t arrival_ns)
{
    if (!me)
        return;
    int64_t d = vrpc_now_ns() - arrival_ns;
    uint64_t ns = d > 0 ? (uint64_t)d : 0;
    vrpc_call_metrics_record(&me->cm, code, ns);
    vrpc_lathist_record(&me->lh, ns / 1000);
}

int vrpc_server_stats(const struct vrpc_server *s, struct vrpc_method_stats *out, size_t cap, size_t *n)
{
    static const double qs[3] = {0.50, 0.90, 0.99};
    if (!s || (cap && !out) || !n)
        return -EINVAL;
    for (size_t i = 0; i < s->nmethods && i < cap; i++) {
        const struct method_entry *me = &s->methods[i];
        struct vrpc_method_stats *o = &out[i];
        uint64_t q[3];
        memset(o, 0, sizeof(*o));
        o->method = me->m;
        for (int c = 0; c < VRPC_CODE_COUNT; c++)
            o->calls += o->by_code[c] = __atomic_load_n(&me->cm.by_code[c], __ATOMIC_RELAXED);
        o->latency_max_us = vrpc_call_metrics_max_us(&me->cm); /* after by_code: bounds what they counted */
        vrpc_lathist_quantiles(&me->lh, qs, q, 3, o->latency_max_us);
        o->latency_p50_us = q[0];
        o->latency_p90_us = q[1];
        o->latency_p99_us = q[2];
    }
    *n = s->nmethods;
    return 0;
}

/* The server's methods handed to the renderer (rpc/metrics.c reads no server). */
int vrpc_server_metrics_text(const struct vrpc_server *s, char **out, size_t *len)
{
    struct vrpc_prom_method *v;
    int rc;

    if (!s || !out || !len)
        return -EINVAL;
    v = calloc(s->nmethods ? s->nmethods : 1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < s->nmethods; i++) {
        v[i].method = s->methods[i].m->full_name;
        v[i].m = &s->methods[i].cm;
        v[i].lh = &s->methods[i].lh;
    }
    rc = vrpc_metrics_text("vrpc_server_", s->tp, NULL, v, s->nmethods, out, len);
    free(v);
    return rc;
}

int vrpc_server_metrics_uri(const struct vrpc_server *s, char *buf, size_t len)
{
    const char *uri = s && s->http ? vrpc_metrics_http_uri(s->http) : NULL;

    if (!uri)
        return -ENOTCONN;
    if (strlen(uri) >= len)
        return -ENOSPC;
    memcpy(buf, uri, strlen(uri) + 1);
    return 0;
}

/* ---- registry ---------------------------------------------------------------- */

void vrpc_server_opts_init(struct vrpc_server_opts *o) { memset(o, 0, sizeof(*o)); }

struct vrpc_transport *vrpc_server_transport(const struct vrpc_server *s) { return s->tp; }

int vrpc_server_register(struct vrpc_server *s, const struct vrpc_method_desc *m, vrpc_handler_fn fn,
                         void *user)
{
    if (!s || !m || !fn || !m->full_name || !m->input || !m->output ||
        m->id != vrpc_method_id(m->full_name))
        return -EINVAL;
    if (s->started)
        return -EBUSY;
    for (size_t i = 0; i < s->nmethods; i++)
        if (s->methods[i].m->id == m->id)
            return -EEXIST;
    if (s->nmethods == s->capmethods) {
        size_t nc = s->capmethods ? s->capmethods * 2 : 8;
        struct method_entry *nm = realloc(s->methods, nc * sizeof(*nm));
        if (!nm)
            return -ENOMEM;
        s->methods = nm;
        s->capmethods = nc;
    }
    struct method_entry *me = &s->methods[s->nmethods++];
    memset(me, 0, sizeof(*me));
    me->m = m;
    me->fn = fn;
    me->user = user;
    return 0;
}

static int build_index(struct vrpc_server *s)
{
    uint32_t size = 16;
    while (size < s->nmethods * 2)
        size *= 2;
    s->index = calloc(size, sizeof(*s->index));
    if (!s->index)
        return -ENOMEM;
    s->index_mask = size - 1;
    for (size_t i = 0; i < s->nmethods; i++) {
        uint32_t h = s->methods[i].m->id & s->index_mask;
        while (s->index[h])
            h = (h + 1) & s->index_mask;
        s->index[h] = &s->methods[i];
    }
    return 0;
}

static struct method_entry *lookup(const struct vrpc_server *s, uint32_t id)
{
    for (uint32_t h = id & s->index_mask;; h = (h + 1) & s->index_mask) {
        struct method_entry *me = s->index[h];
        if (!me || me->m->id == id)
            return me;
    }
}

/* ---- call objects ------------------------------------------------------------- */

#define ST_GEN(w) ((uint32_t)((w) >> 32))
#define ST_FLAGS(w) ((uint32_t)(w))
#define ST_WORD(g, f) (((uint64_t)(g) << 32) | (f))

static struct vrpc_server_call *call_new(struct vrpc_server *s, struct sconn *c)
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
static void call_unref(struct vrpc_server_call *call)
{
    if (!call || __atomic_sub_fetch(&call->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    vrpc_lbuf_put(call->req_lb);
    free(call->buf);
    free(call->md);
    vrpc_arena_fini(&call->arena);
    free(call);
}

/* ---- connections ------------------------------------------------------------- */

static void sconn_unref(struct sconn *c)
{
    if (!c || !vrpc_conn_unref_last(&c->b))
        return;
    struct vrpc_server *s = c->s;
    vrpc_ep_destroy(c->b.ep);
    for (uint32_t i = 0; i < c->ncalls; i++)
        call_unref(c->calls[i]); /* the slot table's reference */
    free(c->calls);
    free(c->rsp);
    free(c);
    __atomic_sub_fetch(&s->nconns, 1, __ATOMIC_RELEASE);
    vrpc_futex_wake_all(&s->nconns);
}

static void conn_protocol_error(struct sconn *c, const char *what, int rc)
{
    char peer[VRPC_URI_MAX] = "?";
    if (!vrpc_conn_kill(&c->b))
        return;
    vrpc_ep_peer_uri(c->b.ep, peer, sizeof(peer));
    vrpc_rpc_log("protocol error from client %s: %s (%s); closing the connection", peer, what,
                 rc == -EPROTONOSUPPORT ? "unsupported version" : "malformed");
    vrpc_ep_close(c->b.ep);
}

/* Fail c for a reason of its own making (it does not read, a transfer is too
 * slow): the reason is logged once with the client's address, c takes no new
 * work, and the connection is aborted (vrpc_ep_abort: its queued sends, reads
 * and send buffers come back at once, with its DISCONNECTED, instead of after
 * a graceful close the client would not finish). Any thread. */
static void conn_fail(struct sconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_fail(struct sconn *c, const char *fmt, ...)
{
    char peer[VRPC_URI_MAX] = "?", why[256];
    if (!vrpc_conn_kill(&c->b))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    vrpc_ep_peer_uri(c->b.ep, peer, sizeof(peer));
    vrpc_rpc_log("client %s: %s; aborting the connection", peer, why);
    vrpc_ep_abort(c->b.ep, -ECONNABORTED);
}

/* ---- sending: the per-connection send quota ----------------------------------
 * Every frame the server sends on a connection takes one buffer of the shared
 * send pool until its SEND completion: while the client returns no credits or
 * does not read its socket, the transport holds them (queued, in order). No
 * connection may hold more than s->send_quota of them: the one that would
 * exceed it, or that keeps more than half of it out with no send completing
 * for o.send_stall_ms, is not reading its responses and loses its
 * connection. Nobody waits on one connection: -EAGAIN from the transport
 * (its queue is longer than the quota: the peer is stuck) fails the
 * connection too; only an empty shared pool is waited for, at most
 * VRPC_RPC_SEND_WAIT_MS (the pool holds four quotas, so that takes several
 * stuck connections at once, each of which is being closed). */

/* A send buffer for a frame on c, counted against its quota; NULL when c is
 * over it (c is then failed) or the pool stayed empty (with wait: for
 * VRPC_RPC_SEND_WAIT_MS). The caller sends it with conn_send. */
static struct vrpc_buf *conn_buf(struct sconn *c, bool wait)
{
    struct vrpc_server *s = c->s;
    uint32_t n = __atomic_add_fetch(&c->sends, 1, __ATOMIC_RELAXED);
    if (n > s->send_half) {
        int64_t now = vrpc_now_ns();
        int64_t since = __atomic_load_n(&c->send_progress_ns, __ATOMIC_RELAXED);
        if (n == s->send_half + 1 || !since) {
            __atomic_store_n(&c->send_progress_ns, now, __ATOMIC_RELAXED);
            since = now;
        }
        long long ms = (long long)((now - since) / 1000000);
        if (n > s->send_quota || ms >= (long long)s->o.send_stall_ms) {
            __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED);
            conn_fail(c, "client does not read: %u responses waiting for %lld ms (max_sends_per_conn %u, "
                      "send_stall_ms %u)", n - 1, ms, s->send_quota, s->o.send_stall_ms);
            return NULL;
        }
    }
    struct vrpc_buf *b = vrpc_rpc_buf_get(s->send_pool, wait);
    if (!b) {
        __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED);
        vrpc_rpc_log("server send buffers all in use (stuck connections being closed hold at most %u each); "
                     "a frame to a client is dropped", s->send_quota);
    }
    return b;
}

/* Poller: a SEND completion of c (also a flushed one). */
static void conn_sent(struct sconn *c)
{
    uint32_t left = __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED);
    if (left >= c->s->send_half) /* still loaded: the client reads, slowly */
        __atomic_store_n(&c->send_progress_ns, vrpc_now_ns(), __ATOMIC_RELAXED);
}

/* Send b (from conn_buf) on c. Never waits: a full credit queue means the
 * client is stuck (see above) and fails c. On error b goes back. */
static int conn_send(struct sconn *c, struct vrpc_buf *b, uint32_t len)
{
    int rc = vrpc_ep_send(c->b.ep, b, len, 0, 0, 0);
    if (rc) {
        vrpc_pool_put(b);
        __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED);
        if (rc == -EAGAIN)
            conn_fail(c, "client does not read: the transport's send queue is full (%u frames out)",
                      __atomic_load_n(&c->sends, __ATOMIC_RELAXED));
    }
    return rc;
}

/* A header-only frame (plus a short payload) on c through its quota. */
static int conn_send_simple(struct sconn *c, const struct vrpc_wire_hdr *h, const void *payload,
                            uint32_t payload_len, bool wait)
{
    struct vrpc_buf *b = conn_buf(c, wait);
    if (!b)
        return -ENOBUFS;
    return conn_send(c, b, vrpc_rpc_frame_fill(b, h, payload, payload_len));
}

/* A header-only RESPONSE from the poller (request refused before it got a
 * call object). Never waits: without a send buffer the answer is dropped and
 * logged (the client's deadline covers it). */
static void refuse(struct sconn *c, uint64_t id, enum vrpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(struct sconn *c, uint64_t id, enum vrpc_code code, const char *fmt, ...)
{
    char msg[VRPC_STATUS_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(msg))
        n = sizeof(msg) - 1;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE,
                              .status = (uint32_t)code, .request_id = id};
    if (conn_send_simple(c, &h, msg, (uint32_t)n, false) == -ENOBUFS &&
        !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
        vrpc_rpc_log("no send buffer to answer %s to a request; answer dropped", vrpc_code_name(code));
}

static void call_task(struct vrpc_task *t);
static void request_read_done(struct poller *pl, struct vrpc_rndv_in *in, int status);
static void deadline_fired(void *ctx, uint64_t gen);
static void transfer_expired(void *ctx, uint64_t gen);
static void answered(struct sconn *c);
static int call_claim(struct vrpc_server_call *call);

/* Decide the call's outcome for the server, not its handler (deadline passed,
 * connection lost): exactly one of this and the handler's claim wins. On a
 * win the call no longer holds its connection: returns it, still referenced,
 * so the caller can send the status, then calls answered(); *id is the call's
 * request id. NULL: lost. by_timer: called by the call's own deadline timer
 * (otherwise an armed timer is cancelled here). */
static struct sconn *call_detach(struct vrpc_server_call *call, uint32_t gen, enum vrpc_code code, int rc,
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
    if (!__atomic_compare_exchange_n(&call->state, &w, ST_WORD(gen, CALL_RUN | CALL_DECIDED | CALL_DETACHED),
                                     false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return NULL;
    __atomic_store_n(&call->cancelled, 1, __ATOMIC_RELEASE);
    record(me, code, arrival);
    /* The call stays RUN until its handler lets go, so the timer cannot be
     * re-armed meanwhile: cancelling here is safe. */
    if (!by_timer && deadline != VRPC_NO_DEADLINE && vrpc_timer_cancel(c->s->wheel, &call->timer))
        call_unref(call);
    if (id)
        *id = rid;
    return c;
}


/* Poller: the request is complete: arm its deadline and hand it to a worker. */
static void call_submit(struct poller *pl, struct vrpc_server_call *call, uint32_t gen)
{
    struct vrpc_server *s = pl->s;
    if (call->deadline_ns != VRPC_NO_DEADLINE) {
        __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* the armed timer's */
        vrpc_timer_arm(s->wheel, &call->timer, call->deadline_ns, deadline_fired, call, gen);
    }
    __atomic_add_fetch(&s->tasks, 1, __ATOMIC_RELAXED);
    if (vrpc_sched_producer_submit(pl->prod, &call->task)) {
        /* The scheduler is shutting down: no handler may run on a poller, so
         * answer here without one. */
        uint64_t id;
        struct sconn *dc = call_detach(call, gen, VRPC_UNAVAILABLE, -ECONNRESET, false, &id);
        if (dc) {
            struct vrpc_wire_hdr r = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE,
                                      .status = VRPC_UNAVAILABLE, .request_id = id};
            conn_send_simple(dc, &r, "server is shutting down", 23, false);
            answered(dc);
        }
        call_task(&call->task); /* sees DETACHED: only lets go of the call */
    }
}

/* The call object of the REQUEST's slot, ready for a new call: a fresh one
 * if the client reused the id of a detached call whose handler still holds
 * it. NULL when the request is refused (answered or the connection failed). */
static struct vrpc_server_call *request_slot(struct sconn *c, const struct vrpc_wire_hdr *h, uint64_t *stp)
{
    uint32_t slot = vrpc_wire_id_slot(h->request_id);
    if (slot >= c->ncalls) {
        conn_protocol_error(c, "request beyond the granted call credits", -EPROTO);
        return NULL;
    }
    struct vrpc_server_call *call = c->calls[slot];
    uint64_t st = __atomic_load_n(&call->state, __ATOMIC_ACQUIRE);
    if ((ST_FLAGS(st) & CALL_RUN) && !(ST_FLAGS(st) & CALL_DETACHED)) {
        conn_protocol_error(c, "request id reuses a call still in flight", -EPROTO);
        return NULL;
    }
    if (ST_FLAGS(st) & CALL_RUN) {
        /* The server answered this slot's last call early (its deadline
         * passed) and the client reused the id while the handler still holds
         * the call: the handler keeps that object, the slot gets a new one. */
        struct vrpc_server_call *fresh = call_new(c->s, c);
        if (!fresh) {
            refuse(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "server out of memory");
            return NULL;
        }
        c->calls[slot] = fresh;
        call_unref(call);
        call = fresh;
        st = __atomic_load_n(&call->state, __ATOMIC_RELAXED);
    }
    if (__atomic_load_n(&c->rsp[slot].state, __ATOMIC_ACQUIRE) == VRPC_RNDV_GRANTED ||
        __atomic_load_n(&c->rsp[slot].parked, __ATOMIC_ACQUIRE)) {
        /* (a parked response has not been sent: the client cannot have it) */
        conn_protocol_error(c, "request on a slot whose large response has had no DONE", -EPROTO);
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
        conn_protocol_error(c, "bad rendezvous request (fits a frame, zero key or range overflow)", -EPROTO);
        return NULL;
    }
    if (__atomic_load_n(&c->b.goaway, __ATOMIC_ACQUIRE)) {
        refuse(c, h->request_id, VRPC_UNAVAILABLE, "server is shutting down");
        return NULL;
    }
    struct method_entry *me = lookup(s, h->method_id);
    *now = vrpc_now_ns();
    if (!me) {
        refuse(c, h->request_id, VRPC_UNIMPLEMENTED, "unknown method id 0x%08x (not registered on this server)",
               h->method_id);
        return NULL;
    }
    uint64_t size = (uint64_t)h->md_len + h->payload_len;
    if (size > s->max_payload) {
        record(me, VRPC_RESOURCE_EXHAUSTED, *now);
        refuse(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "request of %llu bytes exceeds the server's limit of %u bytes",
               (unsigned long long)size, s->max_payload);
        return NULL;
    }
    if ((h->flags & VRPC_FF_DEADLINE) && h->budget_us == 0) {
        record(me, VRPC_DEADLINE_EXCEEDED, *now);
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
            refuse(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "server out of memory");
            return -1;
        }
        call->buf = nb;
        call->cap = want;
    }
    memcpy(call->buf, body, inline_len);
    if (h->md_len && !call->md && !(call->md = malloc(VRPC_MD_MAX * sizeof(*call->md)))) {
        refuse(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "server out of memory");
        return -1;
    }
    int nmd = h->md_len ? vrpc_wire_md_decode(call->buf, h->md_len, call->md, VRPC_MD_MAX) : 0;
    if (nmd < 0) {
        conn_protocol_error(c, "malformed metadata", nmd);
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
        record(me, VRPC_RESOURCE_EXHAUSTED, now);
        refuse(c, h->request_id, VRPC_RESOURCE_EXHAUSTED,
               "large requests of this connection being read: %.1f MiB of %.1f MiB allowed "
               "(max_pinned_per_conn), %.1f MiB more asked", (double)c->rd_pinned / (1 << 20),
               (double)s->o.max_pinned_per_conn / (1 << 20), (double)h->payload_len / (1 << 20));
        return false;
    }
    if (vrpc_rndv_buf(s->tp, s->o.max_pinned, h->payload_len, &call->in.lb, why, sizeof(why))) {
        record(me, VRPC_RESOURCE_EXHAUSTED, now);
        refuse(c, h->request_id, VRPC_RESOURCE_EXHAUSTED, "%s", why);
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
static void request_read_start(struct sconn *c, struct vrpc_server_call *call, uint32_t len, int64_t now,
                               uint32_t gen)
{
    struct vrpc_server *s = c->s;
    int64_t lim = now + ((int64_t)s->o.transfer_floor_ms + (int64_t)len * 1000 / s->o.min_transfer_rate) * 1000000;
    int64_t dl = __atomic_load_n(&call->deadline_ns, __ATOMIC_RELAXED);
    call->xfer_start_ns = now;
    __atomic_store_n(&call->xfer, XFER_READING, __ATOMIC_RELAXED);
    __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* the armed timer's */
    vrpc_timer_arm(s->wheel, &call->xfer_timer, dl < lim ? dl : lim, transfer_expired, call, gen);
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
    /* atomic: call_detach may read these of an earlier call (see there) */
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
    __atomic_store_n(&call->cancelled, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* until the handler answers */
    __atomic_add_fetch(&c->b.refs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->inflight, 1, __ATOMIC_RELAXED);
    /* release: the fields above are visible to whoever sees RUN */
    __atomic_store_n(&call->state, ST_WORD(gen, CALL_RUN), __ATOMIC_RELEASE);
    vrpc_task_init(&call->task, call_task);
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
    struct sconn *dc = call_detach(call, ST_GEN(st), VRPC_UNAVAILABLE, -ECONNRESET, false, NULL);
    if (dc) /* else already detached by the connection's loss */
        answered(dc);
    call_claim(call); /* no handler will: let go of the call here */
}

/* Poller: the read of a request payload finished (or could not start). On
 * success: DONE to the client, then the handler as for an eager request. */
static void request_read_done(struct poller *pl, struct vrpc_rndv_in *in, int status)
{
    struct vrpc_server_call *call = container_of(in, struct vrpc_server_call, in);
    struct sconn *c = call->conn;
    struct vrpc_buf *lb = in->lb;
    in->lb = NULL;
    c->rd_pinned -= in->len;
    uint32_t want = XFER_READING;
    if (__atomic_compare_exchange_n(&call->xfer, &want, XFER_NONE, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        if (vrpc_timer_cancel(c->s->wheel, &call->xfer_timer))
            call_unref(call); /* else the firing timer sees XFER_NONE and lets go */
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
            conn_protocol_error(c, "its large-request descriptor could not be read (bad key or range)", -EPROTO);
        abandon_call(call);
        return;
    }
    call->req_lb = lb;
    if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_DONE, .request_id = in->id};
        int rc = conn_send_simple(c, &h, NULL, 0, false);
        if (rc && rc != -ENOTCONN && !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
            conn_protocol_error(c, "no send buffer or credit for DONE (closing rather than holding the client)", rc);
    }
    call_submit(pl, call, ST_GEN(__atomic_load_n(&call->state, __ATOMIC_ACQUIRE)));
}

static void request_read_failed(struct vrpc_rndv_in *in, int rc, void *arg)
{
    request_read_done(arg, in, rc);
}


/* DONE from the client: it has read (or given up on) our response payload. */
static void on_done(struct sconn *c, const struct vrpc_wire_hdr *h)
{
    uint32_t slot = vrpc_wire_id_slot(h->request_id);
    struct vrpc_rndv_out *o = slot < c->ncalls ? &c->rsp[slot] : NULL;
    if (!o || !vrpc_offer_granted(o, h->request_id)) {
        conn_protocol_error(c, "DONE for a response with no payload outstanding", -EPROTO);
        return;
    }
    vrpc_offer_revoke(&c->poller->retry, o, "response");
}

/* The wheel's thread: the record's client has not sent DONE within the hold
 * timeout: close its connection (which ends the key). arg is the record. */
static void hold_fired(void *ctx, uint64_t arg)
{
    struct vrpc_server *s = ctx;
    struct vrpc_rndv_out *o = (struct vrpc_rndv_out *)(uintptr_t)arg;
    struct sconn *found = NULL;
    uint32_t len = 0;
    uint64_t id = 0;
    pthread_mutex_lock(&s->lock);
    for (struct sconn *c = s->conns.next; c != &s->conns; c = c->next) {
        if (c->rsp && o >= c->rsp && o < c->rsp + c->ncalls) {
            /* the grant's reference on c is dropped only under s->lock (response_released) */
            if (__atomic_load_n(&o->state, __ATOMIC_ACQUIRE) == VRPC_RNDV_GRANTED &&
                vrpc_now_ns() - o->sent_ns >= (int64_t)s->o.hold_timeout_ms * 1000000) {
                __atomic_add_fetch(&c->b.refs, 1, __ATOMIC_RELAXED);
                found = c;
                len = o->len;
                id = o->id;
            }
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (!found)
        return;
    char peer[VRPC_URI_MAX] = "?";
    vrpc_ep_peer_uri(found->b.ep, peer, sizeof(peer));
    vrpc_rpc_log("client %s held the %u-byte response of call %#llx for %u ms without reading it (no DONE); "
                 "aborting the connection", peer, len, (unsigned long long)id, s->o.hold_timeout_ms);
    __atomic_store_n(&found->b.dead, 1, __ATOMIC_RELEASE);
    vrpc_ep_abort(found->b.ep, -ECONNABORTED);
    sconn_unref(found);
}

static void on_cancel(struct sconn *c, uint64_t id)
{
    uint32_t slot = vrpc_wire_id_slot(id);
    if (slot >= c->ncalls)
        return;
    struct vrpc_server_call *call = c->calls[slot];
    /* req_id is written by this poller thread only, so reading it is safe;
     * RUN tells whether it is still the call in flight */
    if ((ST_FLAGS(__atomic_load_n(&call->state, __ATOMIC_ACQUIRE)) & CALL_RUN) && call->req_id == id)
        __atomic_store_n(&call->cancelled, 1, __ATOMIC_RELEASE);
}

static void on_hello(struct sconn *c, const struct vrpc_wire_hdr *h, const uint8_t *payload)
{
    struct vrpc_server *s = c->s;
    struct vrpc_wire_hello hs;
    if (vrpc_wire_hello_decode(payload, h->payload_len, &hs)) {
        conn_protocol_error(c, "malformed HELLO", -EPROTO);
        return;
    }
    vrpc_conn_hello_apply(&c->b, &hs);
    c->calls = calloc(s->o.max_concurrent, sizeof(*c->calls));
    c->rsp = calloc(s->o.max_concurrent, sizeof(*c->rsp));
    if (!c->calls || !c->rsp) {
        conn_protocol_error(c, "out of memory for the call table", -ENOMEM);
        return;
    }
    for (c->ncalls = 0; c->ncalls < s->o.max_concurrent; c->ncalls++) {
        if (!(c->calls[c->ncalls] = call_new(s, c))) {
            conn_protocol_error(c, "out of memory for the call table", -ENOMEM);
            return;
        }
    }
    vrpc_conn_hello_end(&c->b, VRPC_CONN_HELLO_OK);
    struct vrpc_wire_hdr a = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO_ACK};
    uint8_t p[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello ack = {.max_msg_size = s->max_payload, .max_concurrent = c->ncalls,
                                  .features = vrpc_rndv_features};
    vrpc_wire_hello_encode(p, &ack);
    if (conn_send_simple(c, &a, p, sizeof(p), false))
        conn_protocol_error(c, "cannot send HELLO_ACK", -ENOBUFS);
}

/* ---- the server's frame table (rpc/conn.h): poller thread --------------- */

static struct sconn *server_conn(struct vrpc_conn_base *b) { return container_of(b, struct sconn, b); }

static void server_protocol_error(struct vrpc_conn_base *b, const char *what, int rc)
{
    conn_protocol_error(server_conn(b), what, rc);
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
        conn_protocol_error(c, "large-message request on a connection without large messages", -EPROTO);
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

static const struct vrpc_conn_role server_role = {
    .hello_type = VRPC_FT_HELLO,
    .before_hello = "first frame is not HELLO",
    .bad_type = "frame type a client must not send",
    .on_hello = server_on_hello,
    .protocol_error = server_protocol_error,
    .on_frame = {
        [VRPC_FT_REQUEST] = server_on_request,
        [VRPC_FT_DONE] = server_on_done,
        [VRPC_FT_CANCEL] = server_on_cancel,
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
        struct sconn *dc = call_detach(call, ST_GEN(st), VRPC_UNAVAILABLE, -ECONNRESET, false, NULL);
        if (dc)
            answered(dc);
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
                sconn_unref(c); /* the grant's reference */
        }
    }
    sconn_unref(c); /* the endpoint's reference */
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
                     "be refused", pl->extra, want, pl->nconns);
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

static void server_cq_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct poller *pl = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        switch (w->opcode) {
        case VRPC_WC_RECV:
            if (w->status == 0 && w->ep)
                vrpc_conn_recv(&server_role, &((struct sconn *)vrpc_ep_user(w->ep))->b, w->buf->data,
                               w->byte_len);
            if (w->status == -ECANCELED || vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_SEND:
            vrpc_pool_put(w->buf);
            if (w->ep && vrpc_ep_user(w->ep))
                conn_sent(vrpc_ep_user(w->ep));
            break;
        case VRPC_WC_READ:
            request_read_done(pl, (struct vrpc_rndv_in *)(uintptr_t)w->wr_id, w->status);
            break;
        case VRPC_WC_REVOKE: {
            struct vrpc_rndv_out *o = (struct vrpc_rndv_out *)(uintptr_t)w->wr_id;
            struct sconn *c = vrpc_ep_user(o->ep);
            /* under s->lock: hold_fired looks grants up there */
            vrpc_offer_revoked(&pl->offers, c->s->wheel, o);
            sconn_unref(c); /* the grant's reference */
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
static void conn_sweep(void *ctx, uint64_t arg)
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
        vrpc_rpc_log("aborting %u connection%s that sent no HELLO within %u ms (hello_timeout_ms), client %s%s",
                     nhello, nhello == 1 ? "" : "s", s->o.hello_timeout_ms, peer[0], nhello > 1 ? " and others" : "");
    if (nidle)
        vrpc_rpc_log("GOAWAY and closing %u connection%s with no call for %u ms (idle_timeout_ms), client %s%s",
                     nidle, nidle == 1 ? "" : "s", s->o.idle_timeout_ms, peer[1], nidle > 1 ? " and others" : "");
    vrpc_timer_arm(s->wheel, &s->sweep, now + s->sweep_every_ns, conn_sweep, s, 0);
}

/* ---- calls: worker side ----------------------------------------------------- */

/* After the call's outcome went to the transport (or could not): one call
 * fewer in flight (the drain in vrpc_server_shutdown closes connections only
 * after this), and the call's hold on its connection ends. */
static void answered(struct sconn *c)
{
    struct vrpc_server *s = c->s;
    if (__atomic_sub_fetch(&s->inflight, 1, __ATOMIC_ACQ_REL) == 0 && __atomic_load_n(&s->shutting, __ATOMIC_ACQUIRE))
        vrpc_futex_wake_all(&s->inflight);
    sconn_unref(c);
}

/* The handler's side of the race with call_detach. 0: the handler decides the
 * outcome (the caller answers, then finish_call). Otherwise the server has
 * already answered for it (deadline) or its connection is gone: the handler's
 * hold on the call ends here and the detach reason is returned (-ETIMEDOUT,
 * -ECONNRESET); only the call object is touched, so this is safe after the
 * server was destroyed. -EINVAL: answered twice. */
static int call_claim(struct vrpc_server_call *call)
{
    uint64_t w = __atomic_load_n(&call->state, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t f = ST_FLAGS(w);
        if (!(f & CALL_RUN) || (f & CALL_DECIDED && !(f & CALL_DETACHED)))
            return -EINVAL;
        if (f & CALL_DETACHED) {
            int rc = __atomic_load_n(&call->detach_rc, __ATOMIC_RELAXED);
            vrpc_arena_reset(&call->arena); /* the handler is done with req */
            /* release: the poller may reuse the object (if it is still in its
             * slot) once it sees RUN cleared */
            __atomic_store_n(&call->state, ST_WORD(ST_GEN(w), 0), __ATOMIC_RELEASE);
            call_unref(call);
            return rc;
        }
        if (__atomic_compare_exchange_n(&call->state, &w, w | CALL_DECIDED, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return 0;
    }
}

/* After a successful claim, once the response is packed: release the call
 * object (before the response is sent, so the client may reuse the slot the
 * moment it sees the response). Returns the connection, still referenced:
 * the caller sends, then calls answered(). */
static struct sconn *finish_call_norecord(struct vrpc_server_call *call)
{
    struct sconn *c = call->conn;
    if (call->deadline_ns != VRPC_NO_DEADLINE && vrpc_timer_cancel(call->s->wheel, &call->timer))
        call_unref(call); /* not armed any more: the timer's reference (the object keeps the slot's) */
    vrpc_arena_reset(&call->arena);
    uint64_t w = __atomic_load_n(&call->state, __ATOMIC_RELAXED);
    __atomic_store_n(&call->state, ST_WORD(ST_GEN(w), 0), __ATOMIC_RELEASE);
    call_unref(call); /* the handler's; the slot table keeps the object */
    return c;
}

static struct sconn *finish_call(struct vrpc_server_call *call, enum vrpc_code code)
{
    record(call->me, code, call->arrival_ns);
    return finish_call_norecord(call);
}

/* Claimed: answer with a status and no message body. */
static int answer_status(struct vrpc_server_call *call, enum vrpc_code code, const char *msg)
{
    uint64_t id = call->req_id;
    struct sconn *c = finish_call(call, code);
    int rc = -ECONNRESET;
    if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE,
                                  .status = (uint32_t)code, .request_id = id};
        rc = conn_send_simple(c, &h, msg, msg ? (uint32_t)strlen(msg) : 0, true);
        if (rc)
            rc = -ECONNRESET;
    }
    answered(c);
    return rc;
}

/* The call's deadline passed while its handler runs (wheel thread): answer
 * DEADLINE_EXCEEDED for the handler, which sees the call cancelled and whose
 * late answer is dropped (-ETIMEDOUT). The client has timed out locally by
 * now; this answer frees its slot and credit. */
static void deadline_fired(void *ctx, uint64_t gen)
{
    struct vrpc_server_call *call = ctx;
    uint64_t id;
    struct sconn *c = call_detach(call, (uint32_t)gen, VRPC_DEADLINE_EXCEEDED, -ETIMEDOUT, true, &id);
    if (c) {
        if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
            static const char msg[] = "deadline exceeded while the handler ran";
            struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE,
                                      .status = VRPC_DEADLINE_EXCEEDED, .request_id = id};
            conn_send_simple(c, &h, msg, sizeof(msg) - 1, true);
        }
        answered(c);
    }
    call_unref(call); /* the timer's reference */
}

/* The wheel's thread: a large request's read is not over at its limit (see
 * on_request). The call is answered for it, and its connection failed: only
 * that ends the read, and the buffer comes back at the read's (flushed)
 * completion. */
static void transfer_expired(void *ctx, uint64_t gen)
{
    struct vrpc_server_call *call = ctx;
    uint32_t want = XFER_READING;
    if (!__atomic_compare_exchange_n(&call->xfer, &want, XFER_EXPIRING, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        call_unref(call); /* the read finished first; the timer's reference */
        return;
    }
    int64_t now = vrpc_now_ns();
    int64_t dl = __atomic_load_n(&call->deadline_ns, __ATOMIC_RELAXED);
    long long ms = (long long)((now - call->xfer_start_ns) / 1000000);
    uint32_t len = call->in.len;
    bool late = dl != VRPC_NO_DEADLINE && now >= dl;
    enum vrpc_code code = late ? VRPC_DEADLINE_EXCEEDED : VRPC_RESOURCE_EXHAUSTED;
    uint64_t id;
    struct sconn *c = call_detach(call, (uint32_t)gen, code, -ECONNRESET, false, &id);
    if (c) {
        char msg[VRPC_STATUS_MSG_MAX];
        if (late)
            snprintf(msg, sizeof(msg), "deadline passed while the %u-byte request was being read", len);
        else
            snprintf(msg, sizeof(msg), "large transfer too slow: %u bytes not read in %lld ms (min_transfer_rate "
                     "%u B/s, transfer_floor_ms %u)", len, ms, c->s->o.min_transfer_rate, c->s->o.transfer_floor_ms);
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE,
                                  .status = (uint32_t)code, .request_id = id};
        if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
            conn_send_simple(c, &h, msg, (uint32_t)strlen(msg), false);
        conn_fail(c, "large transfer too slow: %u bytes in %lld ms%s", len, ms,
                  late ? " (the call's deadline passed)" : "");
        answered(c);
    }
    /* release: the read's completion may now let go of the call */
    __atomic_store_n(&call->xfer, XFER_EXPIRED, __ATOMIC_RELEASE);
    call_unref(call); /* the timer's reference */
}

static void call_task(struct vrpc_task *t)
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
        call_claim(call);
        goto out;
    }
    if (__atomic_load_n(&call->cancelled, __ATOMIC_ACQUIRE)) {
        vrpc_lbuf_put(lb);
        if (call_claim(call) == 0)
            answer_status(call, VRPC_CANCELLED, "cancelled by the client");
        goto out;
    }
    if (call->deadline_ns != VRPC_NO_DEADLINE && vrpc_now_ns() >= call->deadline_ns) {
        vrpc_lbuf_put(lb);
        if (call_claim(call) == 0)
            answer_status(call, VRPC_DEADLINE_EXCEEDED, "deadline passed before the handler started");
        goto out;
    }
    if (lb) {
        /* big bytes values stay in the large buffer: the arena keeps it
         * until the call is answered (finish_call / call_claim reset it) */
        rc = vrpc_pb_unpack_ref(call->method->input, lb->data, call->len - call->md_len, s->o.max_depth,
                                &call->arena, &req);
        if (rc)
            vrpc_lbuf_put(lb);
        else
            vrpc_arena_hold(&call->arena, lb);
    } else {
        rc = vrpc_pb_unpack(call->method->input, call->buf + call->md_len, call->len - call->md_len,
                            s->o.max_depth, &call->arena, &req);
    }
    if (rc) {
        char msg[VRPC_STATUS_MSG_MAX];
        snprintf(msg, sizeof(msg), "request does not decode as %s: %s", call->method->input->name,
                 rc == -ELOOP ? "nested too deeply" : rc == -ENOMEM ? "too large when decoded" : "malformed");
        if (call_claim(call) == 0)
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
                       hold_fired, s, (uint64_t)(uintptr_t)o);
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
    if (rc == 0) {
        vrpc_rndv_offer_desc(o);
        /* a failed send leaves the grant to the endpoint's DISCONNECTED */
        rc = conn_send(c, o->p_frame, o->p_frame_len) ? -ECONNRESET : 0;
    } else {
        vrpc_lbuf_put(o->p_lb);
        vrpc_pool_put(o->p_frame);
        __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED); /* the frame's quota */
        if (rc != -ENOTCONN && !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
            static const char msg[] = "a large response could not be offered";
            struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE,
                                      .status = VRPC_UNAVAILABLE, .request_id = o->p_id};
            conn_send_simple(c, &h, msg, sizeof(msg) - 1, ctx == VRPC_SEND_WAIT);
        }
        rc = -ECONNRESET;
    }
    answered(c);
    return rc;
}

static const struct vrpc_offer_ops response_offer_ops = {
    .grant_locked = response_grant_locked,
    .done = response_offer_done,
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
    uint32_t plen = (uint32_t)vrpc_pb_pack_sized(resp, lb->data);
    struct vrpc_buf *b = conn_buf(c, true);
    if (!b) {
        vrpc_lbuf_put(lb);
        finish_call(call, VRPC_UNAVAILABLE);
        answered(c);
        return -ECONNRESET;
    }
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE, .flags = VRPC_FF_RNDV,
                              .request_id = id, .payload_len = plen};
    vrpc_wire_hdr_encode(b->data, &h);
    o->p_lb = lb;
    o->p_frame = b;
    o->p_len = plen;
    o->p_frame_len = VRPC_WIRE_HDR_LEN + VRPC_WIRE_DESC_LEN;
    o->p_id = id;
    o->p_conn = c;
    finish_call(call, VRPC_OK); /* the call's hold on c goes with the offer (answered) */
    return vrpc_offer_start(&c->poller->offers, o, VRPC_SEND_WAIT); /* 0 when parked */
}

int vrpc_server_call_respond(struct vrpc_server_call *call, const ProtobufCMessage *resp)
{
    if (!call || !resp)
        return -EINVAL;
    int rc = call_claim(call);
    if (rc)
        return rc;
    if (resp->descriptor != call->method->output) {
        answer_status(call, VRPC_INTERNAL, "handler answered with the wrong message type");
        return -EINVAL;
    }
    struct sconn *c = call->conn;
    uint32_t limit = c->b.max_payload;
    size_t size = vrpc_pb_packed_size(resp);
    if (size > limit) {
        char msg[VRPC_STATUS_MSG_MAX];
        if (limit == c->b.peer_max)
            snprintf(msg, sizeof(msg), "response of %zu bytes exceeds the client's limit of %u bytes", size, limit);
        else
            snprintf(msg, sizeof(msg), "response of %zu bytes exceeds %u bytes, the most one frame carries on "
                     "this connection (no large-message support on one side)", size, limit);
        answer_status(call, VRPC_RESOURCE_EXHAUSTED, msg);
        return -EMSGSIZE;
    }
    if (__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE)) {
        answer_status(call, VRPC_UNAVAILABLE, NULL);
        return -ECONNRESET;
    }
    if (VRPC_WIRE_HDR_LEN + size > vrpc_ep_eager_size(c->b.ep))
        return respond_large(call, resp, size);
    struct vrpc_buf *b = conn_buf(c, true);
    if (!b) { /* c does not read (and is failed), or no buffer came back in time */
        finish_call(call, VRPC_UNAVAILABLE);
        answered(c);
        return -ECONNRESET;
    }
    uint8_t *p = b->data;
    /* size <= client_max_payload <= eager - header = room in b: checked above */
    size_t plen = vrpc_pb_pack_sized(resp, p + VRPC_WIRE_HDR_LEN);
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE,
                              .request_id = call->req_id, .payload_len = (uint32_t)plen};
    vrpc_wire_hdr_encode(p, &h);
    /* The statistics (a clock read and four atomics) wait until the response
     * is on its way; the method entry outlives the call until answered(). */
    struct method_entry *me = call->me;
    int64_t arrival = call->arrival_ns;
    finish_call_norecord(call); /* resp may live in the call's arena: packed above */
    rc = conn_send(c, b, VRPC_WIRE_HDR_LEN + (uint32_t)plen) ? -ECONNRESET : 0;
    record(me, VRPC_OK, arrival);
    answered(c);
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
    int rc = call_claim(call);
    return rc ? rc : answer_status(call, code, m);
}

const struct vrpc_method_desc *vrpc_server_call_method(const struct vrpc_server_call *call)
{
    return call->method;
}

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

/* ---- create / start / shutdown ------------------------------------------------ */

int vrpc_server_core_create(const struct vrpc_server_opts *o, struct vrpc_server **out)
{
    if (!out)
        return -EINVAL;
    struct vrpc_server *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    if (o)
        s->o = *o;
    if (!s->o.threads)
        s->o.threads = 2;
    if (!s->o.pollers)
        s->o.pollers = 1;
    if (!s->o.max_concurrent)
        s->o.max_concurrent = 256;
    if (!s->o.max_depth)
        s->o.max_depth = VRPC_PB_DEFAULT_MAX_DEPTH;
    if (!s->o.max_sends_per_conn)
        s->o.max_sends_per_conn = s->o.max_concurrent + 64;
    if (!s->o.send_stall_ms)
        s->o.send_stall_ms = 5000;
    if (!s->o.min_transfer_rate)
        s->o.min_transfer_rate = VRPC_TRANSFER_RATE_DEFAULT;
    if (!s->o.transfer_floor_ms)
        s->o.transfer_floor_ms = VRPC_TRANSFER_FLOOR_DEFAULT_MS;
    s->send_quota = s->o.max_sends_per_conn;
    s->send_half = s->send_quota / 2;
    if (!s->o.max_connections)
        s->o.max_connections = MAX_CONNECTIONS_DEFAULT;
    if (!s->o.hello_timeout_ms)
        s->o.hello_timeout_ms = HELLO_TIMEOUT_DEFAULT_MS;
    if (!s->o.idle_timeout_ms)
        s->o.idle_timeout_ms = IDLE_TIMEOUT_DEFAULT_MS;
    if (vrpc_rndv_limits("server", &s->o.max_msg_size, &s->o.max_pinned, &s->o.hold_timeout_ms)) {
        free(s);
        return -EINVAL;
    }
    if (!s->o.max_pinned_per_conn) {
        s->o.max_pinned_per_conn = s->o.max_pinned / 4;
        if (s->o.max_pinned_per_conn < s->o.max_msg_size)
            s->o.max_pinned_per_conn = s->o.max_msg_size;
    }
    if (s->o.max_pinned_per_conn > s->o.max_pinned)
        s->o.max_pinned_per_conn = s->o.max_pinned;
    int mrc = vrpc_metrics_http_check(s->o.metrics_addr, s->metrics_addr, sizeof(s->metrics_addr));
    s->o.metrics_addr = NULL;
    if (mrc) {
        free(s);
        return mrc;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->conns.next = s->conns.prev = &s->conns;
    *out = s;
    return 0;
}

/* The (i mod n)-th CPU of mask (n CPUs set), -1 for an empty mask. */
static int nth_cpu(uint64_t mask, unsigned i)
{
    int n = __builtin_popcountll(mask);
    if (!n)
        return -1;
    for (int k = (int)(i % (unsigned)n), c = 0; c < 64; c++)
        if ((mask & (1ull << c)) && k-- == 0)
            return c;
    return -1;
}

int vrpc_server_start(struct vrpc_server *s, const char *uri)
{
    char tname[16], turi[VRPC_URI_MAX + 16];
    struct vrpc_transport_attr ta;
    int rc;

    if (!s || !uri)
        return -EINVAL;
    if (s->started)
        return -EBUSY;
    if ((rc = vrpc_rpc_parse_uri(uri, tname, sizeof(tname), turi, sizeof(turi))))
        return rc;
    if ((rc = build_index(s)))
        return rc;
    s->started = true;
    vrpc_transport_attr_init(&ta);
    /* eager frames stay small whatever the limit (see vrpc_channel_create) */
    ta.eager_size = VRPC_RPC_DEFAULT_EAGER;
    ta.max_pinned = s->o.max_pinned;
    ta.max_queued = s->o.max_concurrent * 2 + 64;
    if (ta.max_queued < s->send_quota + 64) /* the quota, not the queue, is what a stuck client meets */
        ta.max_queued = s->send_quota + 64;
    ta.credit_timeout_ms = s->o.credit_timeout_ms; /* 0: the transport's idle timeout */
    if ((rc = vrpc_transport_create(tname, &ta, &s->tp)))
        return rc;
    uint32_t eager = vrpc_transport_eager_size(s->tp);
    s->max_payload = s->o.max_msg_size;
    if ((rc = vrpc_timer_wheel_create(10000, &s->wheel))) /* 10 ms ticks: hold timeouts are seconds */
        return rc;
    if (s->o.sched) {
        s->sched = s->o.sched;
    } else {
        struct vrpc_sched_config sc;
        vrpc_sched_config_init(&sc);
        sc.nworkers = s->o.threads;
        if (s->o.no_spin)
            sc.spin_us = 1; /* the scheduler's minimum: 0 means its default */
        sc.cpu_mask = s->o.cpu_mask;
        sc.spin_yield = s->o.cpu_mask != 0; /* they share CPUs with the pollers */
        if ((rc = vrpc_sched_create(&sc, &s->sched)))
            return rc;
        s->own_sched = true;
    }
    /* four quotas at least: three stuck connections leave a quarter */
    uint32_t nsend = s->send_quota > SERVER_SEND_BUFS / 4 ? s->send_quota * 4 : SERVER_SEND_BUFS;
    if ((rc = vrpc_pool_create(s->tp, eager, nsend, &s->send_pool)))
        return rc;
    if ((rc = vrpc_pool_create(s->tp, eager, SERVER_RECV_BUFS * s->o.pollers, &s->recv_pool)))
        return rc;
    s->pollers = calloc(s->o.pollers, sizeof(*s->pollers));
    if (!s->pollers)
        return -ENOMEM;
    struct vrpc_cq *cqs[64];
    for (unsigned i = 0; i < s->o.pollers && i < 64; i++) {
        struct poller *pl = &s->pollers[i];
        struct vrpc_cq_attr ca;
        pl->s = s;
        vrpc_offer_q_init(&pl->offers, &response_offer_ops, &s->lock);
        if ((rc = vrpc_sched_producer_create(s->sched, &pl->prod)))
            return rc;
        vrpc_cq_attr_init(&ca);
        ca.cb = server_cq_cb;
        ca.cb_arg = pl;
        ca.busy_poll_us = s->o.no_spin ? 0 : VRPC_RPC_BUSY_POLL_US;
        ca.max_recv = SERVER_RECV_BUFS + RECV_PER_CONN * s->o.max_connections + RECV_CHUNK;
        ca.name = "vrpc-srv-poll";
        ca.cpu = nth_cpu(s->o.cpu_mask, i);
        if ((rc = vrpc_cq_create(s->tp, &ca, &pl->cq)))
            return rc;
        s->npollers++;
        cqs[i] = pl->cq;
        for (unsigned k = 0; k < SERVER_RECV_BUFS; k++) {
            struct vrpc_buf *b = vrpc_pool_get(s->recv_pool);
            if (!b)
                break;
            if (vrpc_cq_post_recv(pl->cq, &b, NULL, 1)) {
                vrpc_pool_put(b);
                break;
            }
        }
    }
    struct vrpc_listen_attr la = {.cqs = cqs, .ncqs = s->npollers, .max_conns = s->o.max_connections};
    if ((rc = vrpc_listen(s->tp, turi, &la, &s->listener)))
        return rc;
    uint32_t least = s->o.hello_timeout_ms;
    if (s->o.idle_timeout_ms != VRPC_SERVER_NO_IDLE_TIMEOUT && s->o.idle_timeout_ms < least)
        least = s->o.idle_timeout_ms;
    s->sweep_every_ns = (int64_t)(least / 4 < 10 ? 10 : least / 4 > 1000 ? 1000 : least / 4) * 1000000;
    vrpc_timer_arm(s->wheel, &s->sweep, vrpc_now_ns() + s->sweep_every_ns, conn_sweep, s, 0);
    if (s->metrics_addr[0] && (rc = vrpc_metrics_http_start(s, s->metrics_addr, vrpc_server_metrics_text, &s->http)))
        return rc;
    return vrpc_listener_uri(s->listener, s->uri, sizeof(s->uri));
}

int vrpc_server_uri(const struct vrpc_server *s, char *buf, size_t len)
{
    if (!s || !s->listener || !s->uri[0])
        return -ENOTCONN;
    size_t n = strlen(s->uri);
    if (n + 1 > len)
        return -ENOSPC;
    memcpy(buf, s->uri, n + 1);
    return 0;
}

int vrpc_server_shutdown(struct vrpc_server *s, int timeout_ms)
{
    if (!s)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    if (s->shut_done) {
        pthread_mutex_unlock(&s->lock);
        return s->shut_rc;
    }
    __atomic_store_n(&s->shutting, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->lock);

    vrpc_listener_destroy(s->listener);
    s->listener = NULL;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_GOAWAY};
    pthread_mutex_lock(&s->lock);
    for (struct sconn *c = s->conns.next; c != &s->conns; c = c->next) {
        __atomic_store_n(&c->b.goaway, 1, __ATOMIC_RELEASE);
        if (!__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE))
            conn_send_simple(c, &h, "server shutting down", 20, false);
    }
    pthread_mutex_unlock(&s->lock);

    int64_t end = vrpc_now_ns() + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
    uint32_t v;
    int rc = 0;
    while ((v = __atomic_load_n(&s->inflight, __ATOMIC_ACQUIRE)) != 0) {
        int64_t left = end - vrpc_now_ns();
        if (left <= 0) {
            rc = -ETIMEDOUT;
            break;
        }
        vrpc_rpc_futex_wait_ns(&s->inflight, v, left < 10000000 ? left : 10000000);
    }
    pthread_mutex_lock(&s->lock);
    for (struct sconn *c = s->conns.next; c != &s->conns; c = c->next) {
        /* dead first: an answer given while the close is under way is
         * dropped (-ECONNRESET), as rpc.h promises, not sent behind it */
        __atomic_store_n(&c->b.dead, 1, __ATOMIC_RELEASE);
        vrpc_ep_close(c->b.ep);
    }
    s->shut_done = true;
    s->shut_rc = rc;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void vrpc_server_destroy(struct vrpc_server *s)
{
    if (!s)
        return;
    vrpc_metrics_http_stop(s->http); /* no scrape reads s from here on */
    if (s->started)
        vrpc_server_shutdown(s, 0);
    /* Every connection is closing; wait until each is freed: its DISCONNECTED
     * has arrived, which detaches the calls still unanswered on it (their
     * handlers' late answers return -ECONNRESET), and every answer being sent
     * on it has gone to the transport. */
    uint32_t v;
    while ((v = __atomic_load_n(&s->nconns, __ATOMIC_ACQUIRE)) != 0)
        vrpc_rpc_futex_wait_ns(&s->nconns, v, 10000000);
    /* No grant is left and no deadline armed: every connection is gone, and a
     * call's timer is cancelled when it is answered or detached. */
    vrpc_timer_wheel_destroy(s->wheel);
    for (unsigned i = 0; i < s->npollers; i++)
        vrpc_cq_destroy(s->pollers[i].cq);
    /* the CQs gave every posted buffer back (-ECANCELED) */
    for (unsigned i = 0; s->pollers && i < s->o.pollers; i++) {
        for (uint32_t k = 0; k < s->pollers[i].ngrow; k++)
            vrpc_pool_destroy(s->pollers[i].grow[k]);
        free(s->pollers[i].grow);
    }
    for (unsigned i = 0; s->pollers && i < s->o.pollers; i++)
        vrpc_sched_producer_destroy(s->pollers[i].prod);
    /* Call tasks still queued see their calls detached and only let go of
     * them; wait for them (on a caller's scheduler they run there) before s
     * goes away. */
    if (s->own_sched)
        vrpc_sched_destroy(s->sched);
    while ((v = __atomic_load_n(&s->tasks, __ATOMIC_ACQUIRE)) != 0)
        vrpc_rpc_futex_wait_ns(&s->tasks, v, 10000000);
    vrpc_pool_destroy(s->recv_pool);
    vrpc_pool_destroy(s->send_pool);
    vrpc_transport_destroy(s->tp);
    free(s->pollers);
    free(s->index);
    free(s->methods);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
