/* A raw peer for the RPC tests: a transport endpoint that writes hand-made
 * frames to a channel or server and records what comes back, so tests can
 * send what no correct peer would. Shared by test_rpc.c and test_rpc_large.c.
 * Failures are cmocka assertions. */
#ifndef VRPC_TESTS_RAW_PEER_H
#define VRPC_TESTS_RAW_PEER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <verbrpc/transport.h>

struct raw {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_ep *ep;      /* raw_connect's endpoint (a raw client) */
    struct vrpc_listener *l; /* set by the test for a raw server */
    pthread_mutex_t lock;    /* guards last/last_len */
    uint8_t last[512];       /* the first bytes of the last frame received */
    uint32_t last_len;
    unsigned nrecv;           /* frames received (atomic) */
    unsigned disconnected;    /* DISCONNECTED completions (atomic) */
    struct vrpc_ep *accepted; /* the endpoint a raw server accepted (atomic) */
    unsigned nreads;          /* READ completions (atomic) */
    int read_status;          /* status of the last one (written before nreads) */
};

/* Transport of the named backend, a pool, a CQ with 32 receives posted. */
void raw_open(struct raw *r, const char *backend);
/* Connect r->ep to uri from src_ip (NULL: any). */
void raw_connect(struct raw *r, const char *uri, const char *src_ip);
/* Wait up to ms milliseconds for *counter to reach n; whether it did. */
bool raw_wait(const unsigned *counter, unsigned n, int ms);
/* Send len bytes (at most the eager size) as one message on ep. */
void raw_send_bytes(struct raw *r, struct vrpc_ep *ep, const void *bytes, size_t len);
/* Close the endpoints (waiting for DISCONNECTED), then free everything. */
void raw_close(struct raw *r);

#endif
