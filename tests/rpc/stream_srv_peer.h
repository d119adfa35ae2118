/* The peer and the server of test_stream_server_raw.c: a raw client that
 * speaks the wire (docs/PROTOCOL.md) and records every frame it receives,
 * the frames the tests send, and a test server with one method of each
 * stream shape (plus a gate to hold handlers and a counter of on_cancel). */
#ifndef VRPC_TESTS_STREAM_SRV_PEER_H
#define VRPC_TESTS_STREAM_SRV_PEER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include <verbrpc/transport.h>
#include "rpc/wire.h"

#define MAXF 16384
#define BODY 512

struct frame {
    struct vrpc_wire_hdr h;
    uint32_t blen;
    uint8_t body[BODY];
    bool taken;
};

struct rc {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_ep *ep;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct frame *f;
    unsigned n;
    unsigned disconnected;
    struct vrpc_buf *lb; /* a large buffer granted to the server, put back at rc_close */
    unsigned nreads;     /* READ completions (atomic) */
    int read_status;     /* of the last one (written before nreads) */
};

#define BIG 150000 /* payload bytes of the Big method's large messages */

/* the raw client (TCP): connect + HELLO with this stream window; close */
void rc_open(struct rc *r, const char *uri, uint32_t window);
void rc_close(struct rc *r);
/* send one frame: header h (version filled), md_len bytes of md, the payload (RNDV: the descriptor) */
void send_frame(struct rc *r, const struct vrpc_wire_hdr *h0, const void *md, const void *payload);
/* the first frame not yet taken of this type (and id, if nonzero), waiting up to ms; NULL if none */
struct frame *take(struct rc *r, uint8_t type, uint64_t id, int ms);
unsigned count(struct rc *r, uint8_t type, uint64_t id);
bool wait_disconnected(struct rc *r, int ms);
unsigned idx(struct rc *r, const struct frame *f);
/* frames */
uint64_t ID(uint32_t slot);
void open_stream(struct rc *r, uint64_t id, uint32_t method, uint64_t budget_us);
void send_msg(struct rc *r, uint64_t id, uint64_t seq, uint16_t flags);
void send_simple(struct rc *r, uint8_t type, uint64_t id);
void send_window(struct rc *r, uint64_t id, uint32_t n);
void unary_call(struct rc *r, uint64_t id, uint32_t method, uint64_t seq);
uint64_t reply_seq(const struct frame *f);
void resp_text(const struct frame *f, char *out, size_t cap);

/* the test server: methods (ids set by srv_start) */
extern struct vrpc_method_desc m_echo, m_count, m_acount, m_bidi, m_sum, m_gate, m_big, m_big_once;
extern int big_once_rc;    /* atomic: BigOnce's write outcome (1 until it returns) */
extern unsigned gate_open; /* atomic: Gate's on_read and Echo mode 1 wait while 0 (at most 5 s) */
extern unsigned n_cancel;  /* atomic: on_cancel calls */
extern unsigned long acount_late, acount_early_ok; /* AsyncCount's early finish (see there) */
void gate_wait(void);
struct vrpc_server *srv_start(const struct vrpc_server_opts *o0, char *uri);
/* the group's server (stream_window 4) */
extern struct vrpc_server *g_srv;
extern char g_uri[VRPC_URI_MAX];
int group_setup(void **state);
int group_teardown(void **state);
/* a raw client on g_srv, HELLO_ACK checked */
void connect_g(struct rc *r, uint32_t window);
/* a unary call still works on r (the connection stands) */
void assert_unary_ok(struct rc *r, uint64_t id);

#endif
