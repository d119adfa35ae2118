/* The connection base shared by the channel and the server (rpc/conn.h):
 * the receive path's header decode, handshake gate and dispatch by frame
 * type, and the handshake's limits. */
#include <errno.h>
#include "rpc/conn.h"
#include "rpc/futex.h"
#include "rpc/rndv.h"

void vrpc_conn_recv(const struct vrpc_conn_role *r, struct vrpc_conn_base *c, const uint8_t *f, uint32_t len)
{
    struct vrpc_wire_hdr h;
    int rc;

    if (vrpc_conn_is_dead(c))
        return;
    if ((rc = vrpc_wire_hdr_decode(f, len, &h))) {
        r->protocol_error(c, "bad frame header", rc);
        return;
    }
    const uint8_t *body = f + VRPC_WIRE_HDR_LEN;
    if (__atomic_load_n(&c->hello, __ATOMIC_ACQUIRE) != VRPC_CONN_HELLO_OK) {
        if (h.type != r->hello_type)
            r->protocol_error(c, r->before_hello, -EPROTO);
        else
            r->on_hello(c, &h, body);
        return;
    }
    /* (decode admits only types up to VRPC_FT_MAX) */
    vrpc_conn_frame_fn fn = h.type <= VRPC_FT_MAX ? r->on_frame[h.type] : NULL;
    if (fn)
        fn(c, &h, body);
    else
        r->protocol_error(c, r->bad_type, -EPROTO);
}

void vrpc_conn_hello_apply(struct vrpc_conn_base *c, const struct vrpc_wire_hello *peer)
{
    c->peer_max = peer->max_msg_size;
    c->peer_features = peer->features;
    c->max_payload = vrpc_rndv_send_limit(peer->max_msg_size, peer->features, vrpc_ep_eager_size(c->ep));
    c->large = (peer->features & vrpc_rndv_features & VRPC_FEAT_LARGE) != 0;
}

void vrpc_conn_hello_end(struct vrpc_conn_base *c, uint32_t state)
{
    __atomic_store_n(&c->hello, state, __ATOMIC_RELEASE);
    vrpc_futex_wake_all(&c->hello);
}
