/* The client side: a channel holds one connection at a time to one server,
 * with its pending-call table, its deadline wheel and its CQ poller. Calls
 * from any number of threads go out through it; responses are matched to
 * calls by request id on the poller, which only copies bytes, decides the
 * outcome and wakes the caller (sync) or submits the completion to the
 * scheduler (async): no user code runs on the poller, except callbacks
 * asked for there (VRPC_CALL_CB_ON_POLLER, for calls and streams). This file holds the
 * channel's public API: create, destroy, options, state, connect; the
 * other parts are named in rpc/channel_internal.h. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <verbrpc/stream.h>
#include "rpc/channel_internal.h"
#include "rpc/lb.h"

#define RECV_BUFS VRPC_CHANNEL_RECV_BUFS

enum vrpc_channel_state vrpc_channel_state(const struct vrpc_channel *ch)
{
    if (ch->lb)
        return vrpc_lb_state(ch->lb);
    return (enum vrpc_channel_state)__atomic_load_n(&ch->state, __ATOMIC_ACQUIRE);
}

void vrpc_channel_opts_init(struct vrpc_channel_opts *o) { memset(o, 0, sizeof(*o)); }

struct vrpc_transport *vrpc_channel_transport(const struct vrpc_channel *ch) { return ch->tp; }

/* The channel's table handed to the renderer (rpc/metrics.c reads no channel). */
int vrpc_channel_metrics_text(const struct vrpc_channel *ch, char **out, size_t *len)
{
    if (!ch || !out || !len)
        return -EINVAL;
    if (ch->lb)
        return vrpc_lb_metrics_text(ch->lb, out, len);
    return vrpc_method_table_text(ch->mt, "vrpc_client_", ch->tp, ch->turi, out, len);
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
    if (ch->lb)
        return vrpc_lb_connect(ch->lb, timeout_ms);
    for (;;) {
        rc = vrpc_ch_get_conn(ch, end, true, &c);
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

/* ---- create / destroy ------------------------------------------------------ */

/* The channel's locks, lists and options (defaults filled in). */
static void channel_init(struct vrpc_channel *ch, const struct vrpc_channel_opts *opts)
{
    pthread_mutex_init(&ch->conn_lock, NULL);
    vrpc_offer_q_init(&ch->offers, &vrpc_ch_request_offer_ops, &ch->conn_lock);
    pthread_mutex_init(&ch->connect_mu, NULL);
    pthread_mutex_init(&ch->qlock, NULL);
    pthread_mutex_init(&ch->slock, NULL);
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
    if (!ch->o.stream_window)
        ch->o.stream_window = VRPC_STREAM_WINDOW_DEFAULT;
    if (ch->o.stream_window > VRPC_STREAM_WINDOW_MAX)
        ch->o.stream_window = VRPC_STREAM_WINDOW_MAX;
    set_state(ch, VRPC_CHANNEL_IDLE);
}

/* The large-message limits, then the transport (ch->tname). */
static int channel_transport(struct vrpc_channel *ch)
{
    struct vrpc_transport_attr ta;
    int rc;

    if ((rc = vrpc_rndv_limits("channel", &ch->o.max_msg_size, &ch->o.max_pinned, &ch->o.hold_timeout_ms)))
        return rc;
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
        return rc;
    ch->own_max_payload = ch->o.max_msg_size;
    return 0;
}

/* The pending-call table; a freed slot pumps the async backlog. */
static int channel_pending(struct vrpc_channel *ch)
{
    struct vrpc_rpc_spin sp;
    int rc;

    if ((rc = vrpc_pending_create(ch->o.max_outstanding, &ch->pend)))
        return rc;
    if (!(ch->streams = calloc(ch->o.max_outstanding, sizeof(ch->streams[0]))))
        return -ENOMEM;
    vrpc_rpc_spin_mode(ch->o.no_spin, ch->o.spin_us, &sp);
    ch->pend->spin = sp.wait;
    ch->pend->spin_ns = sp.wait_ns;
    ch->pend->spin_cap_ns = sp.wait_cap_ns;
    /* pinned: callers are expected on the poller's CPU (rpc.h, cpu_mask) */
    ch->pend->poller_cpu = ch->o.cpu_mask ? __builtin_ctzll(ch->o.cpu_mask) : -1; /* as ca.cpu below */
    ch->pend->on_free = vrpc_ch_pump;
    ch->pend->on_free_arg = ch;
    return 0;
}

/* The scheduler async completions run on (the caller's or our own), and
 * the poller's producer ring into it. */
static int channel_sched(struct vrpc_channel *ch)
{
    struct vrpc_rpc_spin sp;
    int rc;

    if (ch->o.sched) {
        ch->sched = ch->o.sched;
    } else {
        struct vrpc_sched_config sc;
        vrpc_sched_config_init(&sc);
        sc.nworkers = ch->o.threads;
        vrpc_rpc_spin_mode(ch->o.no_spin, ch->o.spin_us, &sp);
        sc.spin_us = sp.sched_spin_us;
        /* async completions unpack into the worker's arenas: create them
         * and their first blocks now, not on the worker's first completion
         * (which may come late: an idle worker that is still spinning takes
         * new tasks without waking the others) */
        sc.worker_start = vrpc_rpc_worker_start;
        sc.cpu_mask = ch->o.cpu_mask;
        sc.spin_yield = ch->o.cpu_mask != 0; /* they share the poller's CPU */
        if ((rc = vrpc_sched_create(&sc, &ch->sched)))
            return rc;
        ch->own_sched = true;
    }
    return vrpc_sched_producer_create(ch->sched, &ch->prod);
}

/* The message pools, the CQ and its poller, and the posted receives. */
static int channel_cq(struct vrpc_channel *ch)
{
    struct vrpc_rpc_spin sp;
    struct vrpc_cq_attr ca;
    uint32_t eager = vrpc_transport_eager_size(ch->tp);
    int rc;

    if ((rc = vrpc_pool_create(ch->tp, eager, ch->o.max_outstanding + ch->o.max_queued + 64, &ch->send_pool)))
        return rc;
    if ((rc = vrpc_pool_create(ch->tp, eager, RECV_BUFS, &ch->recv_pool)))
        return rc;
    vrpc_cq_attr_init(&ca);
    ca.cb = vrpc_ch_cq_cb;
    ca.cb_arg = ch;
    vrpc_rpc_spin_mode(ch->o.no_spin, ch->o.spin_us, &sp);
    ca.busy_poll_us = sp.poll_us;
    ca.busy_poll_max_us = sp.poll_max_us;
    ca.max_recv = RECV_BUFS;
    ca.name = "vrpc-ch-poll";
    ca.cpu = ch->o.cpu_mask ? __builtin_ctzll(ch->o.cpu_mask) : -1;
    if ((rc = vrpc_cq_create(ch->tp, &ca, &ch->cq)))
        return rc;
    for (unsigned i = 0; i < RECV_BUFS; i++) {
        struct vrpc_buf *b = vrpc_pool_get(ch->recv_pool);
        if (!b || vrpc_cq_post_recv(ch->cq, &b, NULL, 1)) {
            if (b)
                vrpc_pool_put(b);
            break;
        }
        __atomic_add_fetch(&ch->posted, 1, __ATOMIC_RELAXED);
    }
    return 0;
}

int vrpc_channel_create(const char *uri, const struct vrpc_channel_opts *opts, struct vrpc_channel **out)
{
    struct vrpc_channel *ch;
    int rc;

    if (!uri || !out)
        return -EINVAL;
    if (vrpc_resolver_is_target(uri))
        return vrpc_lb_create(uri, opts, out);
    ch = calloc(1, sizeof(*ch));
    if (!ch)
        return -ENOMEM;
    channel_init(ch, opts);
    if (!(ch->mt = calloc(1, sizeof(*ch->mt)))) {
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = vrpc_rpc_parse_uri(uri, ch->tname, sizeof(ch->tname), ch->turi, sizeof(ch->turi))))
        goto fail;
    if ((rc = channel_transport(ch)))
        goto fail;
    if ((rc = channel_pending(ch)))
        goto fail;
    if ((rc = vrpc_ch_queue_init(ch)))
        goto fail;
    if ((rc = vrpc_timer_wheel_create(1000, &ch->wheel)))
        goto fail;
    if ((rc = channel_sched(ch)))
        goto fail;
    if ((rc = channel_cq(ch)))
        goto fail;
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
    if (ch->lb) {
        vrpc_lb_destroy(ch);
        return;
    }
    set_state(ch, VRPC_CHANNEL_SHUTDOWN);
    vrpc_ch_queue_close(ch); /* queued async calls complete once, with CANCELLED */
    if (ch->pend) {
        vrpc_pending_close(ch->pend);
        /* every pending call completes once, with CANCELLED */
        vrpc_ch_fail_pending(ch, NULL, VRPC_CANCELLED, "channel destroyed", false);
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
        while (ch->pend->in_use || ch->pend->freeing)
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
    free(ch->streams);
    pthread_mutex_destroy(&ch->slock);
    pthread_mutex_destroy(&ch->qlock);
    vrpc_transport_destroy(ch->tp);
    pthread_mutex_destroy(&ch->conn_lock);
    pthread_mutex_destroy(&ch->connect_mu);
    free(ch->mt);
    free(ch);
}
