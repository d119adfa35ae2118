/* A server connection's failure paths (protocol error, abort with a logged
 * reason) and its send quota: every frame the server sends goes through
 * vrpc_srv_conn_buf and vrpc_srv_conn_send. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include "rpc/server_internal.h"

void vrpc_srv_conn_protocol_error(struct sconn *c, const char *what, int rc)
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
void vrpc_srv_conn_fail(struct sconn *c, const char *fmt, ...)
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
 * stuck connections at once, each of which is being closed), and never by a
 * handler run on the poller (vrpc_rpc_on_poller). */

/* A send buffer for a frame on c, counted against its quota; NULL when c is
 * over it (c is then failed) or the pool stayed empty (with wait: for
 * VRPC_RPC_SEND_WAIT_MS). The caller sends it with vrpc_srv_conn_send. */
struct vrpc_buf *vrpc_srv_conn_buf(struct sconn *c, bool wait)
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
            vrpc_srv_conn_fail(c,
                               "client does not read: %u responses waiting for %lld ms (max_sends_per_conn %u, "
                               "send_stall_ms %u)",
                               n - 1, ms, s->send_quota, s->o.send_stall_ms);
            return NULL;
        }
    }
    struct vrpc_buf *b = vrpc_rpc_buf_get(s->send_pool, wait && !vrpc_rpc_on_poller);
    if (!b) {
        __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED);
        vrpc_rpc_log("server send buffers all in use (stuck connections being closed hold at most %u each); "
                     "a frame to a client is dropped",
                     s->send_quota);
    }
    return b;
}

/* Send b (from vrpc_srv_conn_buf) on c. Never waits: a full credit queue means the
 * client is stuck (see above) and fails c. On error b goes back. */
int vrpc_srv_conn_send(struct sconn *c, struct vrpc_buf *b, uint32_t len)
{
    int rc = vrpc_ep_send(c->b.ep, b, len, 0, 0, 0);
    if (rc) {
        vrpc_pool_put(b);
        __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED);
        if (rc == -EAGAIN)
            vrpc_srv_conn_fail(c, "client does not read: the transport's send queue is full (%u frames out)",
                               __atomic_load_n(&c->sends, __ATOMIC_RELAXED));
    }
    return rc;
}

unsigned vrpc_srv_conn_send_list(struct sconn *c, const struct vrpc_send_wr *wrs, unsigned n)
{
    unsigned sent = 0;
    int rc = vrpc_ep_send_list(c->b.ep, wrs, n, 0, &sent);
    if (rc) {
        for (unsigned i = sent; i < n; i++) {
            vrpc_pool_put(wrs[i].buf);
            __atomic_sub_fetch(&c->sends, 1, __ATOMIC_RELAXED);
        }
        if (rc == -EAGAIN)
            vrpc_srv_conn_fail(c, "client does not read: the transport's send queue is full (%u frames out)",
                               __atomic_load_n(&c->sends, __ATOMIC_RELAXED));
    }
    return sent;
}

/* A header-only frame (plus a short payload) on c through its quota. */
int vrpc_srv_conn_send_simple(struct sconn *c, const struct vrpc_wire_hdr *h, const void *payload, uint32_t payload_len,
                              bool wait)
{
    struct vrpc_buf *b = vrpc_srv_conn_buf(c, wait);
    if (!b)
        return -ENOBUFS;
    return vrpc_srv_conn_send(c, b, vrpc_rpc_frame_fill(b, h, payload, payload_len));
}
