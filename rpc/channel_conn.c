/* The channel's connections: one connect attempt (endpoint, HELLO, the
 * wait for HELLO_ACK), reconnect with back-off, the client's frame table
 * (rpc/conn.h: HELLO_ACK, RESPONSE, DONE, GOAWAY), a connection's loss and
 * protocol errors, and the poller's completion callback. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/stream_internal.h"

#define HELLO_WAIT VRPC_CONN_HELLO_WAIT
#define HELLO_OK VRPC_CONN_HELLO_OK
#define HELLO_FAILED VRPC_CONN_HELLO_FAILED

/* ---- a connection's loss and protocol errors ------------------------------- */

/* The connection is unusable from now on: fail its calls (once). */
void vrpc_ch_conn_fail(struct vrpc_conn *c, const char *why, bool on_poller)
{
    /* An RMW on dead, like start_call's (rpc/call.c): all RMWs of dead are totally
     * ordered, so either start_call's read sees 1, or it came first and this
     * exchange (acquire) sees everything before it, i.e. the slot it
     * published, in the scan below. */
    if (!vrpc_conn_kill(&c->b))
        return;
    if (__atomic_load_n(&c->b.hello, __ATOMIC_ACQUIRE) == HELLO_WAIT)
        vrpc_conn_hello_end(&c->b, HELLO_FAILED);
    vrpc_ch_fail_pending(c->ch, c, VRPC_UNAVAILABLE, why, on_poller);
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

void vrpc_ch_protocol_error(struct vrpc_conn *c, const char *what, int rc)
{
    char peer[VRPC_URI_MAX] = "?";
    vrpc_ep_peer_uri(c->b.ep, peer, sizeof(peer));
    vrpc_rpc_log("protocol error from server %s: %s (%s); closing the connection", peer, what,
                 rc == -EPROTONOSUPPORT ? "unsupported version" : "malformed");
    vrpc_ch_conn_fail(c, "connection closed after a protocol error from the server", true);
    vrpc_ep_close(c->b.ep);
}

/* ---- the client's frame table (rpc/conn.h): poller thread --------------- */

static void client_protocol_error(struct vrpc_conn_base *b, const char *what, int rc)
{
    vrpc_ch_protocol_error(client_conn(b), what, rc);
}

static void client_on_hello_ack(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_conn *c = client_conn(b);
    struct vrpc_wire_hello st;
    if (__atomic_load_n(&c->b.hello, __ATOMIC_ACQUIRE) != HELLO_WAIT ||
        vrpc_wire_hello_decode(body + h->md_len, h->payload_len, &st)) {
        vrpc_ch_protocol_error(c, "unexpected or malformed HELLO_ACK", -EPROTO);
        return;
    }
    if (st.stream_window == 0 || st.stream_window > VRPC_STREAM_WINDOW_MAX) {
        vrpc_ch_protocol_error(c, "HELLO_ACK with a stream window of 0 or above the maximum", -EPROTO);
        return;
    }
    c->stream_window = st.stream_window;
    vrpc_conn_hello_apply(&c->b, &st);
    vrpc_pending_set_limit(c->ch->pend, st.max_concurrent);
    vrpc_conn_hello_end(&c->b, HELLO_OK);
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
    .on_frame =
        {
            [VRPC_FT_HELLO_ACK] = client_on_hello_ack, /* a second one: refused there */
            [VRPC_FT_RESPONSE] = vrpc_ch_on_response,
            [VRPC_FT_DONE] = vrpc_ch_on_done,
            [VRPC_FT_GOAWAY] = client_on_goaway,
            [VRPC_FT_MESSAGE] = vrpc_ch_on_message,
            [VRPC_FT_WINDOW] = vrpc_ch_on_window,
            [VRPC_FT_HEADERS] = vrpc_ch_on_headers,
        },
};

/* ---- the poller ----------------------------------------------------------- */

void vrpc_ch_cq_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct vrpc_channel *ch = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        switch (w->opcode) {
        case VRPC_WC_RECV:
            if (w->status == 0 && w->ep)
                vrpc_conn_recv(&client_role, &((struct vrpc_conn *)vrpc_ep_user(w->ep))->b, w->buf->data, w->byte_len);
            if (w->status == -ECANCELED || vrpc_cq_post_recv(cq, &w->buf, NULL, 1)) {
                vrpc_pool_put(w->buf);
                __atomic_sub_fetch(&ch->posted, 1, __ATOMIC_RELAXED);
            }
            break;
        case VRPC_WC_SEND:
            vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_READ:
            vrpc_ch_response_read_done(ch, (struct vrpc_rndv_in *)(uintptr_t)w->wr_id, w->status);
            break;
        case VRPC_WC_REVOKE:
            vrpc_ch_request_revoked(
                ch, container_of((struct vrpc_rndv_out *)(uintptr_t)w->wr_id, struct vrpc_pending_slot, out));
            break;
        case VRPC_WC_DISCONNECTED: {
            struct vrpc_conn *c = vrpc_ep_user(w->ep);
            vrpc_ch_conn_fail(c, w->status ? "connection lost" : "connection closed", true);
            pthread_mutex_lock(&ch->conn_lock);
            c->b.gone = true; /* no grant starts on it from here on (start_call) */
            if (c->next) {
                c->prev->next = c->next;
                c->next->prev = c->prev;
            }
            pthread_mutex_unlock(&ch->conn_lock);
            vrpc_ch_release_transfers(ch, w->ep);
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
        vrpc_rndv_retry_run(&ch->retry, vrpc_ch_response_read_failed, ch);
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
    struct vrpc_wire_hello hs = {.max_msg_size = ch->own_max_payload,
                                 .max_concurrent = ch->pend->n,
                                 .features = vrpc_rndv_features | VRPC_FEAT_STREAM | VRPC_FEAT_REFUSED,
                                 .stream_window = ch->o.stream_window};
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
        vrpc_ch_conn_fail(c, "handshake failed", false);
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
int vrpc_ch_get_conn(struct vrpc_channel *ch, int64_t deadline_ns, bool force, struct vrpc_conn **out)
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
    /* A call from a handler or callback run on a poller never waits for a
     * connect (on this channel's own poller it would wait for itself). */
    if (vrpc_rpc_on_poller)
        return -EDEADLK;

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
        __atomic_store_n(&ch->next_attempt_ns, vrpc_now_ns() + (int64_t)ch->backoff_ms * 1000000, __ATOMIC_RELAXED);
        if (vrpc_channel_state(ch) != VRPC_CHANNEL_SHUTDOWN)
            set_state(ch, VRPC_CHANNEL_TRANSIENT_FAILURE);
        break;
    }
    pthread_mutex_unlock(&ch->connect_mu);
    return rc;
}
