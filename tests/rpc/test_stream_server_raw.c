/* Server streams against a raw client that speaks the wire (docs/PROTOCOL.md,
 * "Streams"): every receiver rule of the server for the stream frames, and
 * the server's side of server, client and bidirectional streams: windows
 * both ways, HEADERS and trailers, CANCEL, deadline, drain, send pressure,
 * statistics. TCP. The raw client records every frame it receives. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include <verbrpc/transport.h>
#include "rpc/wire.h"
#include "rpc_test.pb-c.h"

/* ---- the raw client ---------------------------------------------------------- */

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
};

static void rc_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct rc *r = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        if (w->opcode == VRPC_WC_RECV) {
            if (w->status == 0) {
                pthread_mutex_lock(&r->lock);
                if (r->n < MAXF) {
                    struct frame *f = &r->f[r->n];
                    if (vrpc_wire_hdr_decode(w->buf->data, w->byte_len, &f->h) == 0) {
                        f->blen = w->byte_len - VRPC_WIRE_HDR_LEN < BODY ? w->byte_len - VRPC_WIRE_HDR_LEN : BODY;
                        memcpy(f->body, w->buf->data + VRPC_WIRE_HDR_LEN, f->blen);
                        f->taken = false;
                        r->n++;
                    }
                }
                pthread_cond_broadcast(&r->cond);
                pthread_mutex_unlock(&r->lock);
            }
            if (w->status == -ECANCELED || vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
        } else if (w->opcode == VRPC_WC_SEND) {
            vrpc_pool_put(w->buf);
        } else if (w->opcode == VRPC_WC_DISCONNECTED) {
            pthread_mutex_lock(&r->lock);
            __atomic_store_n(&r->disconnected, 1, __ATOMIC_RELEASE);
            pthread_cond_broadcast(&r->cond);
            pthread_mutex_unlock(&r->lock);
        }
    }
}

static void send_frame(struct rc *r, const struct vrpc_wire_hdr *h0, const void *md, const void *payload)
{
    struct vrpc_wire_hdr h = *h0;
    h.version = VRPC_WIRE_VERSION;
    struct vrpc_buf *b = NULL;
    for (int i = 0; i < 5000 && !(b = vrpc_pool_get(r->pool)); i++)
        usleep(1000);
    assert_non_null(b);
    vrpc_wire_hdr_encode(b->data, &h);
    uint32_t plen = (h.flags & VRPC_FF_RNDV) ? VRPC_WIRE_DESC_LEN : h.payload_len;
    if (h.md_len)
        memcpy(b->data + VRPC_WIRE_HDR_LEN, md, h.md_len);
    if (plen)
        memcpy(b->data + VRPC_WIRE_HDR_LEN + h.md_len, payload, plen);
    int rc;
    for (int i = 0; i < 5000 && (rc = vrpc_ep_send(r->ep, b, VRPC_WIRE_HDR_LEN + h.md_len + plen, 0, 0, 0)) == -EAGAIN;
         i++)
        usleep(1000);
    if (rc)
        vrpc_pool_put(b);
}

/* Connect and handshake: HELLO with this stream window, HELLO_ACK back. */
static void rc_open(struct rc *r, const char *uri, uint32_t window)
{
    memset(r, 0, sizeof(*r));
    r->f = calloc(MAXF, sizeof(*r->f));
    assert_non_null(r->f);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond, NULL);
    assert_int_equal(vrpc_transport_create("tcp", NULL, &r->tp), 0);
    assert_int_equal(vrpc_pool_create(r->tp, vrpc_transport_eager_size(r->tp), 256, &r->pool), 0);
    struct vrpc_cq_attr ca;
    vrpc_cq_attr_init(&ca);
    ca.cb = rc_cb;
    ca.cb_arg = r;
    assert_int_equal(vrpc_cq_create(r->tp, &ca, &r->cq), 0);
    for (int i = 0; i < 64; i++) {
        struct vrpc_buf *b = vrpc_pool_get(r->pool);
        assert_int_equal(vrpc_cq_post_recv(r->cq, &b, NULL, 1), 0);
    }
    struct vrpc_ep_attr ea;
    vrpc_ep_attr_init(&ea);
    ea.cq = r->cq;
    assert_int_equal(vrpc_connect(r->tp, uri, &ea, &r->ep), 0);
    uint8_t p[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello hs = {.max_msg_size = 1 << 20,
                                 .max_concurrent = 2048,
                                 .features = VRPC_FEAT_STREAM | VRPC_FEAT_LARGE,
                                 .stream_window = window};
    vrpc_wire_hello_encode(p, &hs);
    send_frame(r, &(struct vrpc_wire_hdr){.type = VRPC_FT_HELLO, .payload_len = VRPC_WIRE_HELLO_LEN}, NULL, p);
}

static void rc_close(struct rc *r)
{
    vrpc_ep_close(r->ep);
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < 100 && !__atomic_load_n(&r->disconnected, __ATOMIC_ACQUIRE); i++) {
        pthread_mutex_unlock(&r->lock);
        usleep(100000);
        pthread_mutex_lock(&r->lock);
    }
    pthread_mutex_unlock(&r->lock);
    vrpc_ep_destroy(r->ep);
    vrpc_lbuf_put(r->lb); /* its grant died with the endpoint */
    vrpc_cq_destroy(r->cq);
    vrpc_pool_destroy(r->pool);
    vrpc_transport_destroy(r->tp);
    free(r->f);
}

/* The first frame not yet taken of this type (and id, if nonzero), waiting up
 * to ms; NULL if none came. */
static struct frame *take(struct rc *r, uint8_t type, uint64_t id, int ms)
{
    struct frame *got = NULL;
    int64_t end = vrpc_now_ns() + (int64_t)ms * 1000000;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        for (unsigned i = 0; i < r->n && !got; i++)
            if (!r->f[i].taken && r->f[i].h.type == type && (!id || r->f[i].h.request_id == id))
                got = &r->f[i];
        if (got || vrpc_now_ns() >= end)
            break;
        pthread_mutex_unlock(&r->lock);
        usleep(1000);
        pthread_mutex_lock(&r->lock);
    }
    if (got)
        got->taken = true;
    pthread_mutex_unlock(&r->lock);
    return got;
}

static unsigned count(struct rc *r, uint8_t type, uint64_t id)
{
    unsigned n = 0;
    pthread_mutex_lock(&r->lock);
    for (unsigned i = 0; i < r->n; i++)
        n += r->f[i].h.type == type && (!id || r->f[i].h.request_id == id);
    pthread_mutex_unlock(&r->lock);
    return n;
}

static bool wait_disconnected(struct rc *r, int ms)
{
    for (int i = 0; i < ms; i++) {
        if (__atomic_load_n(&r->disconnected, __ATOMIC_ACQUIRE))
            return true;
        usleep(1000);
    }
    return false;
}

/* The index of a frame (for ordering checks). */
static unsigned idx(struct rc *r, const struct frame *f) { return (unsigned)(f - r->f); }

/* ---- frames the tests send -------------------------------------------------- */

static uint64_t ID(uint32_t slot) { return vrpc_wire_make_id(slot, 1); }

static void open_stream(struct rc *r, uint64_t id, uint32_t method, uint64_t budget_us)
{
    send_frame(r,
               &(struct vrpc_wire_hdr){.type = VRPC_FT_REQUEST,
                                       .flags = VRPC_FF_STREAM | (budget_us ? VRPC_FF_DEADLINE : 0),
                                       .request_id = id,
                                       .method_id = method,
                                       .budget_us = budget_us},
               NULL, NULL);
}

static void send_msg(struct rc *r, uint64_t id, uint64_t seq, uint16_t flags)
{
    Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
    q.seq = seq;
    uint8_t buf[64];
    size_t n = vrpctest__echo_request__pack(&q, buf);
    send_frame(
        r,
        &(struct vrpc_wire_hdr){.type = VRPC_FT_MESSAGE, .flags = flags, .request_id = id, .payload_len = (uint32_t)n},
        NULL, buf);
}

static void send_simple(struct rc *r, uint8_t type, uint64_t id)
{
    send_frame(r, &(struct vrpc_wire_hdr){.type = type, .request_id = id}, NULL, NULL);
}

static void send_window(struct rc *r, uint64_t id, uint32_t n)
{
    uint8_t p[4];
    vrpc_wire_window_encode(p, n);
    send_frame(r, &(struct vrpc_wire_hdr){.type = VRPC_FT_WINDOW, .request_id = id, .payload_len = 4}, NULL, p);
}

static void unary_call(struct rc *r, uint64_t id, uint32_t method, uint64_t seq)
{
    Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
    q.seq = seq;
    uint8_t buf[64];
    size_t n = vrpctest__echo_request__pack(&q, buf);
    send_frame(r,
               &(struct vrpc_wire_hdr){
                   .type = VRPC_FT_REQUEST, .request_id = id, .method_id = method, .payload_len = (uint32_t)n},
               NULL, buf);
}

static uint64_t reply_seq(const struct frame *f)
{
    Vrpctest__EchoReply *rep = vrpctest__echo_reply__unpack(NULL, f->h.payload_len, f->body);
    assert_non_null(rep);
    uint64_t s = rep->seq;
    vrpctest__echo_reply__free_unpacked(rep, NULL);
    return s;
}

/* The RESPONSE's status message (after its metadata). */
static void resp_text(const struct frame *f, char *out, size_t cap)
{
    size_t n = f->h.payload_len < cap - 1 ? f->h.payload_len : cap - 1;
    memcpy(out, f->body + f->h.md_len, n);
    out[n] = 0;
}

/* ---- the test server ----------------------------------------------------------- */

#define DESC(name, kind)                                                                                               \
    {                                                                                                                  \
        name, 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL, kind                    \
    }
static struct vrpc_method_desc m_echo = DESC("/vrpctest.Test/Echo", VRPC_METHOD_UNARY);
static struct vrpc_method_desc m_count = DESC("/vrpctest.Stream/Count", VRPC_METHOD_SERVER_STREAMING);
static struct vrpc_method_desc m_acount = DESC("/vrpctest.Stream/AsyncCount", VRPC_METHOD_SERVER_STREAMING);
static struct vrpc_method_desc m_bidi = DESC("/vrpctest.Stream/Echo", VRPC_METHOD_BIDI_STREAMING);
static struct vrpc_method_desc m_sum = DESC("/vrpctest.Stream/Sum", VRPC_METHOD_CLIENT_STREAMING);
static struct vrpc_method_desc m_gate = DESC("/vrpctest.Stream/Gate", VRPC_METHOD_BIDI_STREAMING);

static unsigned gate_open = 1; /* atomic: Gate's on_read and Echo mode 1 wait while 0 (at most 5 s) */
static unsigned n_cancel;      /* atomic: on_cancel calls */

static void gate_wait(void)
{
    for (int i = 0; i < 5000 && !__atomic_load_n(&gate_open, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
}

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    const Vrpctest__EchoRequest *q = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    (void)user;
    if (q->mode == 1)
        gate_wait();
    if (q->mode == 2 || q->mode == 3) { /* response metadata, then OK or NOT_FOUND */
        struct vrpc_metadata i = {"initial", "i1", 2}, t[2] = {{"trailer", "t1", 2}, {"n", "", 0}};
        struct vrpc_metadata bad = {"Bad Key", "", 0};
        assert_int_equal(vrpc_server_call_send_metadata(call, &bad, 1), -EINVAL);
        assert_int_equal(vrpc_server_call_send_metadata(call, &i, 1), 0);
        assert_int_equal(vrpc_server_call_send_metadata(call, &i, 1), -EALREADY);
        assert_int_equal(vrpc_server_call_set_trailers(call, t, 2), 0);
        assert_int_equal(vrpc_server_call_set_trailers(call, t, 2), -EALREADY);
        if (q->mode == 3) {
            vrpc_server_call_fail(call, VRPC_NOT_FOUND, "no such key");
            return;
        }
    }
    rep.seq = q->seq;
    vrpc_server_call_respond(call, &rep.base);
}

static void write_seq(struct vrpc_server_stream *s, uint64_t seq)
{
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.seq = seq;
    vrpc_server_stream_write(s, &rep.base);
}

static void on_cancel_finish(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    __atomic_add_fetch(&n_cancel, 1, __ATOMIC_RELEASE);
    assert_true(vrpc_server_stream_is_cancelled(s));
    vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
}

/* Count: the request's seq N, then N replies 0..N-1 and OK with a trailer. */
static void count_start(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct vrpc_metadata md = {"initial", "yes", 3};
    assert_int_equal(vrpc_server_stream_send_metadata(s, &md, 1), 0);
    assert_int_equal(vrpc_server_stream_send_metadata(s, &md, 1), -EALREADY);
}
static void count_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    vrpc_server_stream_set_ctx(s, (void *)(uintptr_t)((const Vrpctest__EchoRequest *)msg)->seq);
}
static void count_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    uint64_t n = (uintptr_t)vrpc_server_stream_ctx(s);
    for (uint64_t i = 0; i < n; i++)
        write_seq(s, i);
    char v[24];
    snprintf(v, sizeof v, "%llu", (unsigned long long)n);
    struct vrpc_metadata md = {"count", v, strlen(v)};
    vrpc_server_stream_finish(s, VRPC_OK, NULL, &md, 1);
}
static const struct vrpc_server_stream_ops count_ops = {count_start, count_read, count_half_close, on_cancel_finish};

/* AsyncCount: as Count, with write_async, each callback queueing the next. */
struct actx {
    uint64_t n, queued, done;
};
static void acount_done(struct vrpc_server_stream *s, int rc, void *arg);
static void acount_more(struct vrpc_server_stream *s, struct actx *a)
{
    while (a->queued < a->n) {
        Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
        rep.seq = a->queued;
        int rc = vrpc_server_stream_write_async(s, &rep.base, acount_done, a);
        if (rc == -EAGAIN)
            return; /* a callback queues the rest */
        assert_int_equal(rc, 0);
        a->queued++;
    }
}
static void acount_done(struct vrpc_server_stream *s, int rc, void *arg)
{
    struct actx *a = arg;
    assert_int_equal(rc, 0);
    if (++a->done == a->n) {
        free(a);
        vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
        return;
    }
    acount_more(s, a);
}
static void acount_start(struct vrpc_server_stream *s, void *user) { (void)s, (void)user; }
static void acount_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct actx *a = calloc(1, sizeof(*a));
    a->n = (uintptr_t)vrpc_server_stream_ctx(s);
    vrpc_server_stream_set_ctx(s, a);
    acount_more(s, a);
}
static const struct vrpc_server_stream_ops acount_ops = {acount_start, count_read, acount_half_close, NULL};

/* Echo (bidi): each message back; OK at the half-close. */
static void bidi_start(struct vrpc_server_stream *s, void *user) { (void)s, (void)user; }
static void bidi_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    write_seq(s, ((const Vrpctest__EchoRequest *)msg)->seq);
}
static void bidi_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}
static const struct vrpc_server_stream_ops bidi_ops = {bidi_start, bidi_read, bidi_half_close, on_cancel_finish};

/* Sum (client streaming): one reply, the sum of the seqs. */
static void sum_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    uintptr_t v = (uintptr_t)vrpc_server_stream_ctx(s) + ((const Vrpctest__EchoRequest *)msg)->seq;
    vrpc_server_stream_set_ctx(s, (void *)v);
}
static void sum_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    write_seq(s, (uintptr_t)vrpc_server_stream_ctx(s));
    vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}
static const struct vrpc_server_stream_ops sum_ops = {bidi_start, sum_read, sum_half_close, on_cancel_finish};

/* Gate: reads wait for the gate; only a cancel ends it. */
static void gate_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)s, (void)msg, (void)user;
    gate_wait();
}
static const struct vrpc_server_stream_ops gate_ops = {bidi_start, gate_read, NULL, on_cancel_finish};

static struct vrpc_server *srv_start(const struct vrpc_server_opts *o0, char *uri)
{
    struct vrpc_server_opts o;
    struct vrpc_server *s;
    if (o0)
        o = *o0;
    else
        vrpc_server_opts_init(&o);
    struct vrpc_method_desc *ms[] = {&m_echo, &m_count, &m_acount, &m_bidi, &m_sum, &m_gate};
    for (unsigned i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
        ms[i]->id = vrpc_method_id(ms[i]->full_name);
    assert_int_equal(vrpc_server_create(&o, &s), 0);
    assert_int_equal(vrpc_server_register(s, &m_echo, h_echo, NULL), 0);
    assert_int_equal(vrpc_server_register(s, &m_count, h_echo, NULL), -EINVAL);          /* streaming: not here */
    assert_int_equal(vrpc_server_register_stream(s, &m_echo, &bidi_ops, NULL), -EINVAL); /* unary: not here */
    assert_int_equal(vrpc_server_register_stream(s, &m_count, &count_ops, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(s, &m_acount, &acount_ops, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(s, &m_bidi, &bidi_ops, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(s, &m_sum, &sum_ops, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(s, &m_gate, &gate_ops, NULL), 0);
    assert_int_equal(vrpc_server_start(s, "tcp://127.0.0.1:0"), 0);
    assert_int_equal(vrpc_server_uri(s, uri, VRPC_URI_MAX), 0);
    return s;
}

static struct vrpc_server *g_srv; /* stream_window 4 */
static char g_uri[VRPC_URI_MAX];

static int group_setup(void **state)
{
    (void)state;
    struct vrpc_server_opts o;
    vrpc_server_opts_init(&o);
    o.stream_window = 4;
    g_srv = srv_start(&o, g_uri);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    vrpc_server_destroy(g_srv);
    return 0;
}

static void connect_g(struct rc *r, uint32_t window)
{
    rc_open(r, g_uri, window);
    struct frame *a = take(r, VRPC_FT_HELLO_ACK, 0, 5000);
    assert_non_null(a);
    struct vrpc_wire_hello hs;
    assert_int_equal(vrpc_wire_hello_decode(a->body, a->h.payload_len, &hs), 0);
    assert_true(hs.features & VRPC_FEAT_STREAM);
    assert_int_equal(hs.stream_window, 4);
}

/* A unary call still works on r (the connection stands). */
static void assert_unary_ok(struct rc *r, uint64_t id)
{
    unary_call(r, id, m_echo.id, 77);
    struct frame *f = take(r, VRPC_FT_RESPONSE, id, 5000);
    assert_non_null(f);
    assert_int_equal(f->h.status, VRPC_OK);
    assert_int_equal(reply_seq(f), 77);
    assert_false(__atomic_load_n(&r->disconnected, __ATOMIC_ACQUIRE));
}

/* ---- tests ---------------------------------------------------------------------- */

/* A large client message (RNDV) inside a stream: read by the server, DONE,
 * delivered in order with the small ones around it. */
static void t_large_client_message(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_bidi.id, 0);
    send_msg(&r, ID(0), 1, 0);
    Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
    static uint8_t big[200000];
    memset(big, 0x5a, sizeof big);
    q.payload.data = big;
    q.payload.len = sizeof big;
    q.seq = 2;
    size_t n = vrpctest__echo_request__get_packed_size(&q);
    assert_int_equal(vrpc_lbuf_get(r.tp, n, &r.lb), 0);
    vrpctest__echo_request__pack(&q, r.lb->data);
    uint32_t rkey;
    assert_int_equal(vrpc_ep_grant(r.ep, r.lb->mr, r.lb->data, (uint32_t)n, &rkey), 0);
    uint8_t desc[VRPC_WIRE_DESC_LEN];
    vrpc_wire_desc_encode(desc, &(struct vrpc_wire_desc){.addr = (uint64_t)(uintptr_t)r.lb->data, .rkey = rkey});
    send_frame(&r,
               &(struct vrpc_wire_hdr){
                   .type = VRPC_FT_MESSAGE, .flags = VRPC_FF_RNDV, .request_id = ID(0), .payload_len = (uint32_t)n},
               NULL, desc);
    send_msg(&r, ID(0), 3, 0); /* small, behind the large one */
    struct frame *d = take(&r, VRPC_FT_DONE, ID(0), 10000);
    assert_non_null(d);
    assert_int_equal(d->h.status, 0);
    for (uint64_t i = 1; i <= 3; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 5000);
        assert_non_null(m);
        assert_int_equal(reply_seq(m), i);
    }
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(0), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    rc_close(&r);
}

/* Unary response metadata: HEADERS before the RESPONSE, trailers in it, on
 * success and on failure; a call without any sends neither. */
static void t_unary_response_metadata(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    for (uint32_t mode = 2; mode <= 3; mode++) {
        uint64_t id = ID(mode);
        Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
        q.mode = mode;
        q.seq = 5;
        uint8_t buf[16];
        size_t n = vrpctest__echo_request__pack(&q, buf);
        send_frame(&r,
                   &(struct vrpc_wire_hdr){
                       .type = VRPC_FT_REQUEST, .request_id = id, .method_id = m_echo.id, .payload_len = (uint32_t)n},
                   NULL, buf);
        struct frame *f = take(&r, VRPC_FT_RESPONSE, id, 5000);
        assert_non_null(f);
        struct frame *hd = take(&r, VRPC_FT_HEADERS, id, 100);
        assert_non_null(hd);
        assert_true(idx(&r, hd) < idx(&r, f));
        struct vrpc_metadata md[4];
        assert_int_equal(vrpc_wire_md_decode(hd->body, hd->h.md_len, md, 4), 1);
        assert_string_equal(md[0].key, "initial");
        assert_memory_equal(md[0].value, "i1", 2);
        assert_int_equal(vrpc_wire_md_decode(f->body, f->h.md_len, md, 4), 2);
        assert_string_equal(md[0].key, "trailer");
        assert_string_equal(md[1].key, "n");
        if (mode == 2) {
            assert_int_equal(f->h.status, VRPC_OK);
            Vrpctest__EchoReply *rep = vrpctest__echo_reply__unpack(NULL, f->h.payload_len, f->body + f->h.md_len);
            assert_non_null(rep);
            assert_int_equal(rep->seq, 5);
            vrpctest__echo_reply__free_unpacked(rep, NULL);
        } else {
            char msg[64];
            resp_text(f, msg, sizeof msg);
            assert_int_equal(f->h.status, VRPC_NOT_FOUND);
            assert_string_equal(msg, "no such key");
        }
    }
    assert_unary_ok(&r, ID(1));
    assert_int_equal(count(&r, VRPC_FT_HEADERS, ID(1)), 0);
    struct frame *f = take(&r, VRPC_FT_RESPONSE, 0, 0);
    assert_null(f);
    rc_close(&r);
}

/* Server streaming: HEADERS first, the messages in order, then RESPONSE OK
 * with the trailer; one call in the statistics. */
static void t_server_streaming(void **state)
{
    (void)state;
    struct rc r;
    struct vrpc_method_stats st[8];
    size_t n;
    assert_int_equal(vrpc_server_stats(g_srv, st, 8, &n), 0);
    size_t k = 0;
    while (k < n && k < 8 && st[k].method != &m_count)
        k++;
    assert_true(k < n && k < 8);
    uint64_t before = st[k].by_code[VRPC_OK];
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_count.id, 0);
    send_msg(&r, ID(0), 10, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(0), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    struct vrpc_metadata md[4];
    assert_int_equal(vrpc_wire_md_decode(end->body, end->h.md_len, md, 4), 1);
    assert_string_equal(md[0].key, "count");
    assert_memory_equal(md[0].value, "10", 2);
    struct frame *hd = take(&r, VRPC_FT_HEADERS, ID(0), 100);
    assert_non_null(hd);
    assert_int_equal(vrpc_wire_md_decode(hd->body, hd->h.md_len, md, 4), 1);
    assert_string_equal(md[0].key, "initial");
    unsigned last = idx(&r, hd);
    for (uint64_t i = 0; i < 10; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 100);
        assert_non_null(m);
        assert_true(idx(&r, m) > last && idx(&r, m) < idx(&r, end));
        last = idx(&r, m);
        assert_int_equal(reply_seq(m), i);
    }
    assert_null(take(&r, VRPC_FT_MESSAGE, ID(0), 50));
    assert_int_equal(vrpc_server_stats(g_srv, st, 8, &n), 0);
    assert_ptr_equal(st[k].method, &m_count);
    assert_int_equal(st[k].by_code[VRPC_OK], before + 1); /* a stream is one call */
    assert_int_equal(st[k].calls, before + 1);
    assert_unary_ok(&r, ID(1));
    rc_close(&r);
}

/* The client's window bounds the server's writes; WINDOW opens it. */
static void t_client_window_bounds_writes(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 3);
    open_stream(&r, ID(0), m_count.id, 0);
    send_msg(&r, ID(0), 10, VRPC_FF_END);
    for (int i = 0; i < 3; i++)
        assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    assert_null(take(&r, VRPC_FT_MESSAGE, ID(0), 300)); /* window closed */
    assert_unary_ok(&r, ID(1));                         /* and the connection moves */
    send_window(&r, ID(0), 3);
    for (int i = 0; i < 3; i++)
        assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    assert_null(take(&r, VRPC_FT_MESSAGE, ID(0), 200));
    send_window(&r, ID(0), 4);
    for (int i = 0; i < 4; i++)
        assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(0), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    rc_close(&r);
}

/* Bidi: the server returns window as its handler consumes (server window 4,
 * batches of 1), so the client may go on sending past 4. */
static void t_bidi_window_returned(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(2), m_bidi.id, 0);
    uint32_t credit = 4;
    for (uint64_t i = 0; i < 40; i++) {
        while (credit == 0) {
            struct frame *w = take(&r, VRPC_FT_WINDOW, ID(2), 5000);
            assert_non_null(w);
            uint32_t k;
            assert_int_equal(vrpc_wire_window_decode(w->body, w->h.payload_len, &k), 0);
            credit += k;
        }
        send_msg(&r, ID(2), i, 0);
        credit--;
    }
    for (uint64_t i = 0; i < 40; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(2), 5000);
        assert_non_null(m);
        assert_int_equal(reply_seq(m), i);
    }
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(2));
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(2), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    assert_false(__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE));
    rc_close(&r);
}

/* Client streaming: messages, END on the last; one reply then OK. */
static void t_client_streaming(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(3), m_sum.id, 0);
    for (uint64_t i = 1; i <= 4; i++) /* the server's window */
        send_msg(&r, ID(3), i, 0);
    assert_non_null(take(&r, VRPC_FT_WINDOW, ID(3), 5000)); /* consumed: room for one more */
    send_msg(&r, ID(3), 5, VRPC_FF_END);
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(3), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(3), 100);
    assert_non_null(m);
    assert_int_equal(reply_seq(m), 15);
    rc_close(&r);
}

/* Asynchronous writes, bounded per stream, each callback queueing the next. */
static void t_async_writes(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 1u << 20);
    open_stream(&r, ID(4), m_acount.id, 0);
    send_msg(&r, ID(4), 500, VRPC_FF_END);
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(4), 10000);
    if (!end)
        fail_msg("no end; %u messages, %u windows", count(&r, VRPC_FT_MESSAGE, ID(4)), count(&r, VRPC_FT_WINDOW, 0));
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    for (uint64_t i = 0; i < 500; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(4), 100);
        assert_non_null(m);
        assert_int_equal(reply_seq(m), i);
    }
    rc_close(&r);
}

/* Open a Gate stream on a fresh connection, with the gate closed so the
 * server's handler consumes nothing (no WINDOW comes back). */
static void gate_stream(struct rc *r, uint64_t id)
{
    connect_g(r, 64);
    __atomic_store_n(&gate_open, 0, __ATOMIC_RELEASE);
    open_stream(r, id, m_gate.id, 0);
}

static void gate_release(void) { __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE); }

/* Protocol errors: the connection closes (and only it: the next connection
 * is served). */
static void expect_closed(struct rc *r, const char *what)
{
    if (!wait_disconnected(r, 5000))
        fail_msg("%s did not close the connection", what);
    gate_release();
    rc_close(r);
    struct rc r2;
    connect_g(&r2, 64);
    assert_unary_ok(&r2, ID(9));
    rc_close(&r2);
}

static void t_message_beyond_window(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    for (uint64_t i = 0; i < 5; i++) /* the server's window is 4 */
        send_msg(&r, ID(0), i, 0);
    expect_closed(&r, "a MESSAGE beyond the window");
}

static void t_message_after_half_close(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    send_msg(&r, ID(0), 1, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    send_msg(&r, ID(0), 2, 0);
    expect_closed(&r, "a MESSAGE after HALF_CLOSE");
}

static void t_second_half_close(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    expect_closed(&r, "a second HALF_CLOSE");
}

static void t_half_close_after_end(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    send_msg(&r, ID(0), 1, VRPC_FF_END);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    expect_closed(&r, "HALF_CLOSE after a MESSAGE with END");
}

static void t_window_overflow(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    send_window(&r, ID(0), 0x7fffffffu - 64); /* 64 + this: exactly the most */
    assert_false(wait_disconnected(&r, 200));
    send_window(&r, ID(0), 1);
    expect_closed(&r, "a WINDOW overflowing 2^31 - 1");
    gate_stream(&r, ID(0));
    send_frame(&r, &(struct vrpc_wire_hdr){.type = VRPC_FT_WINDOW, .request_id = ID(0), .payload_len = 4}, NULL,
               "\0\0\0\0");
    expect_closed(&r, "a WINDOW of 0");
}

static void t_stream_frames_on_unary_call(void **state)
{
    (void)state;
    static const uint8_t types[] = {VRPC_FT_MESSAGE, VRPC_FT_HALF_CLOSE, VRPC_FT_WINDOW};
    for (unsigned i = 0; i < sizeof(types); i++) {
        struct rc r;
        connect_g(&r, 64);
        __atomic_store_n(&gate_open, 0, __ATOMIC_RELEASE);
        Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
        q.mode = 1; /* the handler holds the call in flight */
        uint8_t buf[16];
        size_t n = vrpctest__echo_request__pack(&q, buf);
        send_frame(
            &r,
            &(struct vrpc_wire_hdr){
                .type = VRPC_FT_REQUEST, .request_id = ID(0), .method_id = m_echo.id, .payload_len = (uint32_t)n},
            NULL, buf);
        usleep(50000);
        if (types[i] == VRPC_FT_WINDOW)
            send_window(&r, ID(0), 1);
        else if (types[i] == VRPC_FT_MESSAGE)
            send_msg(&r, ID(0), 1, 0);
        else
            send_simple(&r, types[i], ID(0));
        expect_closed(&r, "a stream frame for a unary call");
    }
}

/* Frames for ids not in flight are ignored (they may cross the RESPONSE). */
static void t_unknown_ids_ignored(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    send_msg(&r, ID(5), 1, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(6));
    send_window(&r, ID(7), 3);
    send_msg(&r, vrpc_wire_make_id(100000, 1), 1, 0); /* beyond the slots */
    /* an ended stream too */
    open_stream(&r, ID(8), m_bidi.id, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(8));
    assert_non_null(take(&r, VRPC_FT_RESPONSE, ID(8), 5000));
    send_msg(&r, ID(8), 1, 0);
    send_window(&r, ID(8), 1);
    assert_unary_ok(&r, ID(1));
    rc_close(&r);
}

/* Per-stream errors: RESPONSE with a code, the connection stays. */
static void expect_status(struct rc *r, uint64_t id, enum vrpc_code code, const char *text)
{
    struct frame *f = take(r, VRPC_FT_RESPONSE, id, 5000);
    assert_non_null(f);
    char msg[256];
    resp_text(f, msg, sizeof msg);
    if (f->h.status != (uint32_t)code || !strstr(msg, text))
        fail_msg("got %s \"%s\", expected %s \"...%s...\"", vrpc_code_name((enum vrpc_code)f->h.status), msg,
                 vrpc_code_name(code), text);
}

static void t_server_streaming_bad_input(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_count.id, 0);
    send_msg(&r, ID(0), 1, 0);
    send_msg(&r, ID(0), 2, 0);
    expect_status(&r, ID(0), VRPC_INVALID_ARGUMENT, "second client message");
    open_stream(&r, ID(1), m_count.id, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(1));
    expect_status(&r, ID(1), VRPC_INVALID_ARGUMENT, "before the request message");
    open_stream(&r, ID(2), m_bidi.id, 0);
    send_frame(&r, &(struct vrpc_wire_hdr){.type = VRPC_FT_MESSAGE, .request_id = ID(2), .payload_len = 2}, NULL,
               "\x0b\x0c");
    expect_status(&r, ID(2), VRPC_INVALID_ARGUMENT, "does not decode");
    assert_unary_ok(&r, ID(3));
    rc_close(&r);
}

static void t_method_kind_mismatch(void **state)
{
    (void)state;
    struct rc r;
    unsigned before = __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE);
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_echo.id, 0);
    expect_status(&r, ID(0), VRPC_UNIMPLEMENTED, "is unary");
    unary_call(&r, ID(1), m_count.id, 1);
    expect_status(&r, ID(1), VRPC_UNIMPLEMENTED, "is streaming");
    open_stream(&r, ID(2), 12345, 0);
    expect_status(&r, ID(2), VRPC_UNIMPLEMENTED, "unknown method");
    assert_unary_ok(&r, ID(3));
    assert_int_equal(__atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE), before);
    rc_close(&r);
}

static void t_bad_stream_frames(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    /* REQUEST|STREAM carrying a message */
    send_frame(&r,
               &(struct vrpc_wire_hdr){.type = VRPC_FT_REQUEST,
                                       .flags = VRPC_FF_STREAM,
                                       .request_id = ID(0),
                                       .method_id = m_bidi.id,
                                       .payload_len = 2},
               NULL, "\x10\x01");
    expect_closed(&r, "REQUEST|STREAM with a payload");
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_gate.id, 0);
    static const uint8_t md[] = {1, 0, 0, 0, 'a', 0};
    send_frame(&r, &(struct vrpc_wire_hdr){.type = VRPC_FT_HEADERS, .request_id = ID(0), .md_len = sizeof md}, md,
               NULL);
    expect_closed(&r, "HEADERS from a client");
}

static void t_cancel(void **state)
{
    (void)state;
    struct rc r;
    unsigned before = __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE);
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_bidi.id, 0);
    send_msg(&r, ID(0), 5, 0);
    assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    send_simple(&r, VRPC_FT_CANCEL, ID(0));
    expect_status(&r, ID(0), VRPC_CANCELLED, "cancelled");
    for (int i = 0; i < 5000 && __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE) == before; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE), before + 1);
    assert_null(take(&r, VRPC_FT_RESPONSE, ID(0), 100)); /* exactly one end */
    assert_unary_ok(&r, ID(1));
    rc_close(&r);
}

static void t_deadline(void **state)
{
    (void)state;
    struct rc r;
    unsigned before = __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE);
    connect_g(&r, 64);
    int64_t t0 = vrpc_now_ns();
    open_stream(&r, ID(0), m_gate.id, 200000);
    send_msg(&r, ID(0), 1, 0);
    expect_status(&r, ID(0), VRPC_DEADLINE_EXCEEDED, "deadline");
    assert_true(vrpc_now_ns() - t0 >= 150000000);
    for (int i = 0; i < 5000 && __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE) == before; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE), before + 1);
    assert_null(take(&r, VRPC_FT_RESPONSE, ID(0), 100));
    assert_unary_ok(&r, ID(1));
    rc_close(&r);
}

struct shut {
    struct vrpc_server *s;
    int rc;
    unsigned done; /* atomic */
};
static void *shut_thread(void *arg)
{
    struct shut *sh = arg;
    sh->rc = vrpc_server_shutdown(sh->s, 10000);
    __atomic_store_n(&sh->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* GOAWAY and drain: vrpc_server_shutdown waits for an open stream, which
 * goes on (new streams are refused) and ends normally. */
static void t_drain_waits_for_streams(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    struct vrpc_server *s = srv_start(NULL, uri);
    struct rc r;
    rc_open(&r, uri, 64);
    assert_non_null(take(&r, VRPC_FT_HELLO_ACK, 0, 5000));
    open_stream(&r, ID(0), m_bidi.id, 0);
    send_msg(&r, ID(0), 1, 0);
    assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    struct shut sh = {.s = s};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, shut_thread, &sh), 0);
    assert_non_null(take(&r, VRPC_FT_GOAWAY, 0, 5000));
    open_stream(&r, ID(1), m_bidi.id, 0);
    expect_status(&r, ID(1), VRPC_UNAVAILABLE, "shutting down");
    usleep(300000);
    assert_false(__atomic_load_n(&sh.done, __ATOMIC_ACQUIRE)); /* the stream holds the drain */
    send_msg(&r, ID(0), 2, 0);
    struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 5000);
    assert_non_null(m);
    assert_int_equal(reply_seq(m), 2);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    expect_status(&r, ID(0), VRPC_OK, "");
    pthread_join(t, NULL);
    assert_int_equal(sh.rc, 0);
    rc_close(&r);
    vrpc_server_destroy(s);
}

/* The idle timeout does not close a connection whose only activity is an
 * open stream. */
static void t_idle_timeout_spares_streams(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    struct vrpc_server_opts o;
    vrpc_server_opts_init(&o);
    o.idle_timeout_ms = 100;
    struct vrpc_server *s = srv_start(&o, uri);
    struct rc r;
    rc_open(&r, uri, 64);
    assert_non_null(take(&r, VRPC_FT_HELLO_ACK, 0, 5000));
    open_stream(&r, ID(0), m_bidi.id, 0);
    usleep(800000);
    assert_int_equal(count(&r, VRPC_FT_GOAWAY, 0), 0);
    assert_false(__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE));
    send_msg(&r, ID(0), 3, 0);
    assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    expect_status(&r, ID(0), VRPC_OK, "");
    /* with nothing open, it does go */
    assert_non_null(take(&r, VRPC_FT_GOAWAY, 0, 5000));
    rc_close(&r);
    vrpc_server_destroy(s);
}

/* Send pressure: many streams writing at once on one connection with a
 * small max_sends_per_conn wait for send room instead of having the
 * connection killed, as long as the client reads. */
#define PRESSURE_STREAMS 300
#define PRESSURE_MSGS 20
static void t_send_pressure(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    struct vrpc_server_opts o;
    vrpc_server_opts_init(&o);
    o.max_concurrent = 1024;
    o.max_sends_per_conn = 16;
    o.threads = 4;
    struct vrpc_server *s = srv_start(&o, uri);
    struct rc r;
    rc_open(&r, uri, 64);
    assert_non_null(take(&r, VRPC_FT_HELLO_ACK, 0, 5000));
    for (uint32_t i = 0; i < PRESSURE_STREAMS; i++) {
        open_stream(&r, ID(i), m_count.id, 0);
        send_msg(&r, ID(i), PRESSURE_MSGS, VRPC_FF_END);
    }
    for (uint32_t i = 0; i < PRESSURE_STREAMS; i++) {
        struct frame *f = take(&r, VRPC_FT_RESPONSE, ID(i), 30000);
        assert_non_null(f);
        assert_int_equal(f->h.status, VRPC_OK);
        assert_int_equal(count(&r, VRPC_FT_MESSAGE, ID(i)), PRESSURE_MSGS);
    }
    assert_false(__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE));
    rc_close(&r);
    vrpc_server_destroy(s);
}

/* Connection loss mid-stream: on_cancel runs, the server frees the stream. */
static void t_connection_lost(void **state)
{
    (void)state;
    unsigned before = __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE);
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_bidi.id, 0);
    send_msg(&r, ID(0), 1, 0);
    assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    rc_close(&r);
    for (int i = 0; i < 5000 && __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE) == before; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE), before + 1);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_unary_response_metadata),
        cmocka_unit_test(t_large_client_message),
        cmocka_unit_test(t_server_streaming),
        cmocka_unit_test(t_client_window_bounds_writes),
        cmocka_unit_test(t_bidi_window_returned),
        cmocka_unit_test(t_client_streaming),
        cmocka_unit_test(t_async_writes),
        cmocka_unit_test(t_message_beyond_window),
        cmocka_unit_test(t_message_after_half_close),
        cmocka_unit_test(t_second_half_close),
        cmocka_unit_test(t_half_close_after_end),
        cmocka_unit_test(t_window_overflow),
        cmocka_unit_test(t_stream_frames_on_unary_call),
        cmocka_unit_test(t_unknown_ids_ignored),
        cmocka_unit_test(t_server_streaming_bad_input),
        cmocka_unit_test(t_method_kind_mismatch),
        cmocka_unit_test(t_bad_stream_frames),
        cmocka_unit_test(t_cancel),
        cmocka_unit_test(t_deadline),
        cmocka_unit_test(t_connection_lost),
        cmocka_unit_test(t_drain_waits_for_streams),
        cmocka_unit_test(t_idle_timeout_spares_streams),
        cmocka_unit_test(t_send_pressure),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
