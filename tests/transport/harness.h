/* Test harness for the transport conformance suite: options (backend, set-up,
 * addresses, scale), a completion collector that CQ callbacks feed and test
 * threads wait on, and an echo server that runs inside its CQ callback. */
#ifndef VRPC_TEST_TRANSPORT_HARNESS_H
#define VRPC_TEST_TRANSPORT_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <verbrpc/transport.h>

struct opts {
    const char *backend;   /* "tcp" or "verbs" */
    const char *setup;     /* "local" (tcp), "single" or "veth" (verbs) */
    const char *server_ip; /* where the server listens */
    const char *client_ip; /* client source address, NULL: any */
    unsigned conns;        /* concurrent connections case */
    unsigned burst;        /* messages in the burst case (over 4 threads) */
    unsigned scale_div;    /* counts divided by this (sanitizers) */
};
extern struct opts g_opt;

/* "scheme://ip:0" (brackets for IPv6) for listening on g_opt.server_ip. */
void listen_uri(char *buf, size_t len);

/* A growable list of completions, filled from CQ callbacks. */
struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct vrpc_wc *wc;
    size_t n, cap;
};

void coll_init(struct coll *c);
void coll_fini(struct coll *c);
/* A vrpc_cq_cb that appends to the struct coll in arg. */
void coll_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg);
/* Wait up to ms for a completion with this opcode (and ep, if not NULL);
 * remove and return it in *out. false on timeout. */
bool coll_wait(struct coll *c, uint32_t opcode, struct vrpc_ep *ep, int ms, struct vrpc_wc *out);
/* Completions currently held with this opcode (and ep, if not NULL). */
size_t coll_count(struct coll *c, uint32_t opcode, struct vrpc_ep *ep);

/* Echo server: every received message is sent back on its endpoint with the
 * same immediate; the buffer is reposted after the send completes. Counts what
 * it sees; accepted endpoints are destroyed when they disconnect. */
struct echo {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq[2];
    unsigned ncq;
    struct vrpc_pool *pool;
    struct vrpc_listener *l;
    char uri[VRPC_URI_MAX];
    bool no_echo;     /* receive only: hold the buffer (hold list) */
    bool repost_only; /* receive and repost, no echo */
    atomic_bool hold; /* keep received buffers until echo_release() */
    atomic_ulong accepted, disconnected, disc_err, recvs, flushed_recvs, send_err;
    atomic_int last_disc_status; /* written before disconnected is incremented */
    pthread_mutex_t mu;          /* protects the fields below */
    struct vrpc_ep **eps;        /* accepted, not yet disconnected */
    size_t neps, epcap;
    struct vrpc_buf **held;
    size_t nheld, heldcap;
    /* optional per-message hook, on the poller thread */
    void (*on_recv)(struct echo *e, const struct vrpc_wc *wc);
    void *arg;
};

struct echo_cfg {
    const struct vrpc_transport_attr *tattr; /* NULL: defaults */
    unsigned ncq;                            /* 1 or 2 */
    unsigned nbufs;                          /* receive buffers posted */
    uint32_t busy_poll_us;
    bool hold, repost_only; /* copied to struct echo before the poller starts */
    unsigned max_conns;     /* vrpc_listen_attr.max_conns (0: no limit) */
    void (*on_recv)(struct echo *e, const struct vrpc_wc *wc);
    void *arg;
};

/* Start an echo server listening on listen_uri(). */
int echo_start(struct echo *e, const struct echo_cfg *cfg);
/* Stop it: listener, remaining endpoints, CQs (flushing), pool, transport. */
void echo_stop(struct echo *e);
/* Repost every held buffer. */
void echo_release(struct echo *e);

/* A client side: transport, one CQ feeding a collector, a pool. */
struct client {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct coll coll;
};

/* cb NULL: completions go to c->coll; else to cb(arg). */
int client_start(struct client *c, const struct vrpc_transport_attr *tattr, unsigned nbufs, unsigned nrecv,
                 uint32_t busy_poll_us, vrpc_cq_cb cb, void *arg);

/* Wait until the collector holds at least n completions with this opcode. */
bool coll_wait_n(struct coll *c, uint32_t opcode, size_t n, int ms);

/* A counting CQ callback for traffic cases: sends go back to pool, receives
 * are reposted to cq (or put back when that fails), lifecycle is recorded. */
struct counts {
    struct vrpc_pool *pool;
    struct vrpc_cq *cq;
    atomic_ulong send_ok, send_err, recv_ok, recv_flush, disc, after_disc, accepted;
    atomic_int disc_status;
    struct vrpc_ep *dead; /* the endpoint whose DISCONNECTED was seen last */
    void (*on_recv)(struct counts *k, const struct vrpc_wc *wc);
    void *arg;
};
void counts_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg);
/* Connect to uri with g_opt.client_ip as source. */
int client_connect(struct client *c, const char *uri, struct vrpc_ep **ep);
void client_stop(struct client *c);

/* Two sides for read/grant/revoke cases: a server side (transport, CQ
 * feeding s.coll, listener) and a client side (c), separate transports. Both
 * with read_chunk = chunk (0: backend default). Accepted endpoints are the
 * test's to destroy. */
struct rig {
    struct client s, c;
    struct vrpc_listener *l;
    char uri[VRPC_URI_MAX];
};
int rig_start(struct rig *r, uint32_t chunk);
/* Connect c to s: *cep the client's endpoint, *sep the server's (ACCEPTED). */
int rig_connect(struct rig *r, struct vrpc_ep **cep, struct vrpc_ep **sep);
void rig_stop(struct rig *r);

/* FNV-1a over a buffer. */
uint32_t csum(const void *p, size_t n);
/* Deterministic payload for (seed, size). */
void fill(void *p, size_t n, uint32_t seed);

#endif
