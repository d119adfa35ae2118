/* The server's public life: options and their defaults, create, start
 * (transport, scheduler, pollers, listener), graceful shutdown (GOAWAY,
 * drain, close) and destroy. The rest lives beside it: registry.c (methods),
 * dispatch.c (the poller side), server_call.c (a call's life),
 * server_conn.c (failing a connection, the send quota), server_stats.c. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <verbrpc/rpc.h>
#include <verbrpc/sched.h>
#include <verbrpc/transport.h>
#include "rpc/metrics.h"
#include "rpc/pbutil.h"
#include "rpc/server_core.h"
#include "rpc/server_internal.h"

#define MAX_CONNECTIONS_DEFAULT 1024u
#define HELLO_TIMEOUT_DEFAULT_MS 5000u
#define IDLE_TIMEOUT_DEFAULT_MS 300000u

void vrpc_server_opts_init(struct vrpc_server_opts *o) { memset(o, 0, sizeof(*o)); }

struct vrpc_transport *vrpc_server_transport(const struct vrpc_server *s) { return s->tp; }

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
    if (!s->o.stream_window)
        s->o.stream_window = VRPC_STREAM_WINDOW_DEFAULT;
    if (s->o.stream_window > VRPC_STREAM_WINDOW_MAX) {
        free(s);
        return -EINVAL;
    }
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

/* Start, step 1: the transport (its limits from the options) and the timer
 * wheel. */
static int start_transport(struct vrpc_server *s, const char *tname)
{
    struct vrpc_transport_attr ta;
    int rc;

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
    s->max_payload = s->o.max_msg_size;
    return vrpc_timer_wheel_create(10000, &s->wheel); /* 10 ms ticks: hold timeouts are seconds */
}

/* Start, step 2: the caller's scheduler, or one of our own. */
static int start_sched(struct vrpc_server *s)
{
    int rc;

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
    return 0;
}

/* Start, step 3: the send and receive pools, then the pollers (a CQ each,
 * with its base receive buffers posted); cqs[] gets their CQs. */
static int start_pollers(struct vrpc_server *s, struct vrpc_cq **cqs)
{
    uint32_t eager = vrpc_transport_eager_size(s->tp);
    int rc;

    /* four quotas at least: three stuck connections leave a quarter */
    uint32_t nsend = s->send_quota > SERVER_SEND_BUFS / 4 ? s->send_quota * 4 : SERVER_SEND_BUFS;
    if ((rc = vrpc_pool_create(s->tp, eager, nsend, &s->send_pool)))
        return rc;
    if ((rc = vrpc_pool_create(s->tp, eager, SERVER_RECV_BUFS * s->o.pollers, &s->recv_pool)))
        return rc;
    s->pollers = calloc(s->o.pollers, sizeof(*s->pollers));
    if (!s->pollers)
        return -ENOMEM;
    for (unsigned i = 0; i < s->o.pollers && i < 64; i++) {
        struct poller *pl = &s->pollers[i];
        struct vrpc_cq_attr ca;
        pl->s = s;
        vrpc_offer_q_init(&pl->offers, &vrpc_srv_response_offer_ops, &s->lock);
        if ((rc = vrpc_sched_producer_create(s->sched, &pl->prod)))
            return rc;
        vrpc_cq_attr_init(&ca);
        ca.cb = vrpc_srv_cq_cb;
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
    return 0;
}

/* Start, step 4: the listener on the pollers' CQs, the connection sweep and
 * the metrics endpoint; then s->uri. */
static int start_listen(struct vrpc_server *s, const char *turi, struct vrpc_cq **cqs)
{
    int rc;

    struct vrpc_listen_attr la = {.cqs = cqs, .ncqs = s->npollers, .max_conns = s->o.max_connections};
    if ((rc = vrpc_listen(s->tp, turi, &la, &s->listener)))
        return rc;
    uint32_t least = s->o.hello_timeout_ms;
    if (s->o.idle_timeout_ms != VRPC_SERVER_NO_IDLE_TIMEOUT && s->o.idle_timeout_ms < least)
        least = s->o.idle_timeout_ms;
    s->sweep_every_ns = (int64_t)(least / 4 < 10 ? 10 : least / 4 > 1000 ? 1000 : least / 4) * 1000000;
    vrpc_timer_arm(s->wheel, &s->sweep, vrpc_now_ns() + s->sweep_every_ns, vrpc_srv_conn_sweep, s, 0);
    if (s->metrics_addr[0] && (rc = vrpc_metrics_http_start(s, s->metrics_addr, vrpc_server_metrics_text, &s->http)))
        return rc;
    return vrpc_listener_uri(s->listener, s->uri, sizeof(s->uri));
}

int vrpc_server_start(struct vrpc_server *s, const char *uri)
{
    char tname[16], turi[VRPC_URI_MAX + 16];
    struct vrpc_cq *cqs[64];
    int rc;

    if (!s || !uri)
        return -EINVAL;
    if (s->started)
        return -EBUSY;
    if ((rc = vrpc_rpc_parse_uri(uri, tname, sizeof(tname), turi, sizeof(turi))))
        return rc;
    if ((rc = vrpc_srv_build_index(s)))
        return rc;
    s->started = true;
    if ((rc = start_transport(s, tname)) || (rc = start_sched(s)) || (rc = start_pollers(s, cqs)))
        return rc;
    return start_listen(s, turi, cqs);
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
            vrpc_srv_conn_send_simple(c, &h, "server shutting down", 20, false);
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
