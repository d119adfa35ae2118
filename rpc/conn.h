/* The connection base both roles embed as their first member (the channel's
 * struct vrpc_conn, the server's struct sconn): the endpoint, the reference
 * count, death, the handshake state and the limits it agreed, and the
 * receive path that decodes a frame header and dispatches on its type
 * through the role's table. Adding a frame type means the wire files
 * (rpc/wire.h, rpc/wire.c), one entry in a role's table and its handler. */
#ifndef VRPC_RPC_CONN_H
#define VRPC_RPC_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <verbrpc/transport.h>
#include "rpc/wire.h"

/* The handshake (hello, atomic): WAIT until the peer's HELLO (server) or
 * HELLO_ACK (client) was accepted (OK); FAILED: the client gave up waiting
 * (the connection died first). Writers: the poller (OK), whoever kills a
 * client connection (FAILED). Waiters sleep on the word (futex). */
enum { VRPC_CONN_HELLO_WAIT = 0, VRPC_CONN_HELLO_OK = 1, VRPC_CONN_HELLO_FAILED = 2 };

struct vrpc_conn_base {
    struct vrpc_ep *ep;
    uint32_t refs;   /* atomic; who holds one is the role's business */
    uint32_t dead;   /* atomic 0/1: lost, closing or protocol error */
    uint32_t goaway; /* atomic 0/1: GOAWAY sent (server) or received (client) */
    uint32_t hello;  /* atomic VRPC_CONN_HELLO_* (futex) */
    /* Agreed by the handshake (vrpc_conn_hello_apply; written by the poller
     * before hello goes OK, read after it): */
    uint32_t max_payload;   /* md + message bytes we may send */
    uint32_t peer_max;      /* the peer's max_msg_size */
    uint32_t peer_features; /* the peer's VRPC_FEAT_* */
    bool large;             /* both sides offer VRPC_FEAT_LARGE: rendezvous allowed */
    bool gone;              /* DISCONNECTED delivered: no grant starts on it
                               (under the role's grant lock) */
};

/* The thread a send (or an offer's end) runs on, which says what it may do. */
enum vrpc_send_ctx {
    VRPC_SEND_WAIT,   /* the caller's thread: may wait for a send buffer or credit */
    VRPC_SEND_NOWAIT, /* the caller's or another thread, not the poller: never waits */
    VRPC_SEND_POLLER, /* the owner's CQ poller: never waits */
};

/* A frame handler: poller thread, h decoded, body right after the header
 * (metadata first, h->md_len bytes, then the payload). */
typedef void (*vrpc_conn_frame_fn)(struct vrpc_conn_base *c, const struct vrpc_wire_hdr *h, const uint8_t *body);

/* What a role (client or server) fills: one table, const, static. */
struct vrpc_conn_role {
    uint8_t hello_type;          /* the frame that must come first */
    const char *before_hello;    /* protocol error for any other frame before it */
    const char *bad_type;        /* protocol error for a type with no entry */
    vrpc_conn_frame_fn on_hello; /* the first frame, while hello is not OK */
    /* The role's protocol error: log, kill, close (poller thread). */
    void (*protocol_error)(struct vrpc_conn_base *c, const char *what, int rc);
    vrpc_conn_frame_fn on_frame[VRPC_FT_MAX + 1]; /* after the handshake; NULL: not allowed */
};

/* Poller: one received frame of c (nothing if c is dead): header decode,
 * the handshake gate, then one lookup in r->on_frame. No lock held. */
void vrpc_conn_recv(const struct vrpc_conn_role *r, struct vrpc_conn_base *c, const uint8_t *f, uint32_t len);

/* Take a reference (the caller already holds one, or holds the lock that
 * guards a pointer holding one). Any thread. */
static inline void vrpc_conn_ref(struct vrpc_conn_base *c) { __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED); }
/* Drop a reference; true when it was the last: the caller then tears the
 * connection down (destroys the endpoint, frees). Any thread, no lock. */
static inline bool vrpc_conn_unref_last(struct vrpc_conn_base *c)
{
    return __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0;
}

static inline bool vrpc_conn_is_dead(const struct vrpc_conn_base *c)
{
    return __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE) != 0;
}
/* Mark c dead; true for the one caller that did it first. An RMW: all RMWs
 * of dead are totally ordered (see the channel's vrpc_ch_conn_fail). Any thread. */
static inline bool vrpc_conn_kill(struct vrpc_conn_base *c)
{
    return __atomic_exchange_n(&c->dead, 1, __ATOMIC_ACQ_REL) == 0;
}
/* Mark c dead without caring who was first (the endpoint is ending anyway). */
static inline void vrpc_conn_mark_dead(struct vrpc_conn_base *c) { __atomic_store_n(&c->dead, 1, __ATOMIC_RELEASE); }
/* Read dead with an RMW (acq_rel): ordered against vrpc_conn_kill, which a
 * plain load is not (the channel's vrpc_ch_request_go). */
static inline bool vrpc_conn_dead_rmw(struct vrpc_conn_base *c)
{
    return __atomic_fetch_or(&c->dead, 0, __ATOMIC_ACQ_REL) != 0;
}

/* Poller, on the peer's HELLO/HELLO_ACK settings: the limits this side
 * sends within (max_payload, large), before vrpc_conn_hello_end(OK). */
void vrpc_conn_hello_apply(struct vrpc_conn_base *c, const struct vrpc_wire_hello *peer);
/* The handshake is over (OK or FAILED): store and wake its waiters. */
void vrpc_conn_hello_end(struct vrpc_conn_base *c, uint32_t state);

#endif
