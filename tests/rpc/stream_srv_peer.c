/* The raw client and the test server of test_stream_server_raw.c
 * (stream_srv_peer.h). Failures are cmocka assertions. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rpc_test.pb-c.h"
#include "stream_srv_peer.h"

/* ---- the raw client ---------------------------------------------------------- */

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
        } else if (w->opcode == VRPC_WC_READ) {
            r->read_status = w->status;
            __atomic_add_fetch(&r->nreads, 1, __ATOMIC_RELEASE);
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

void send_frame(struct rc *r, const struct vrpc_wire_hdr *h0, const void *md, const void *payload)
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
void rc_open(struct rc *r, const char *uri, uint32_t window)
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

void rc_close(struct rc *r)
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
struct frame *take(struct rc *r, uint8_t type, uint64_t id, int ms)
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

unsigned count(struct rc *r, uint8_t type, uint64_t id)
{
    unsigned n = 0;
    pthread_mutex_lock(&r->lock);
    for (unsigned i = 0; i < r->n; i++)
        n += r->f[i].h.type == type && (!id || r->f[i].h.request_id == id);
    pthread_mutex_unlock(&r->lock);
    return n;
}

bool wait_disconnected(struct rc *r, int ms)
{
    for (int i = 0; i < ms; i++) {
        if (__atomic_load_n(&r->disconnected, __ATOMIC_ACQUIRE))
            return true;
        usleep(1000);
    }
    return false;
}

/* The index of a frame (for ordering checks). */
unsigned idx(struct rc *r, const struct frame *f) { return (unsigned)(f - r->f); }

/* ---- frames the tests send -------------------------------------------------- */

uint64_t ID(uint32_t slot) { return vrpc_wire_make_id(slot, 1); }

void open_stream(struct rc *r, uint64_t id, uint32_t method, uint64_t budget_us)
{
    send_frame(r,
               &(struct vrpc_wire_hdr){.type = VRPC_FT_REQUEST,
                                       .flags = VRPC_FF_STREAM | (budget_us ? VRPC_FF_DEADLINE : 0),
                                       .request_id = id,
                                       .method_id = method,
                                       .budget_us = budget_us},
               NULL, NULL);
}

void send_msg(struct rc *r, uint64_t id, uint64_t seq, uint16_t flags)
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

void send_simple(struct rc *r, uint8_t type, uint64_t id)
{
    send_frame(r, &(struct vrpc_wire_hdr){.type = type, .request_id = id}, NULL, NULL);
}

void send_window(struct rc *r, uint64_t id, uint32_t n)
{
    uint8_t p[4];
    vrpc_wire_window_encode(p, n);
    send_frame(r, &(struct vrpc_wire_hdr){.type = VRPC_FT_WINDOW, .request_id = id, .payload_len = 4}, NULL, p);
}

void unary_call(struct rc *r, uint64_t id, uint32_t method, uint64_t seq)
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

uint64_t reply_seq(const struct frame *f)
{
    Vrpctest__EchoReply *rep = vrpctest__echo_reply__unpack(NULL, f->h.payload_len, f->body);
    assert_non_null(rep);
    uint64_t s = rep->seq;
    vrpctest__echo_reply__free_unpacked(rep, NULL);
    return s;
}

/* The RESPONSE's status message (after its metadata). */
void resp_text(const struct frame *f, char *out, size_t cap)
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
struct vrpc_method_desc m_echo = DESC("/vrpctest.Test/Echo", VRPC_METHOD_UNARY);
struct vrpc_method_desc m_count = DESC("/vrpctest.Stream/Count", VRPC_METHOD_SERVER_STREAMING);
struct vrpc_method_desc m_acount = DESC("/vrpctest.Stream/AsyncCount", VRPC_METHOD_SERVER_STREAMING);
struct vrpc_method_desc m_bidi = DESC("/vrpctest.Stream/Echo", VRPC_METHOD_BIDI_STREAMING);
struct vrpc_method_desc m_sum = DESC("/vrpctest.Stream/Sum", VRPC_METHOD_CLIENT_STREAMING);
struct vrpc_method_desc m_gate = DESC("/vrpctest.Stream/Gate", VRPC_METHOD_BIDI_STREAMING);
struct vrpc_method_desc m_big = DESC("/vrpctest.Stream/Big", VRPC_METHOD_SERVER_STREAMING);
struct vrpc_method_desc m_big_once = DESC("/vrpctest.Stream/BigOnce", VRPC_METHOD_SERVER_STREAMING);

unsigned gate_open = 1; /* atomic: Gate's on_read and Echo mode 1 wait while 0 (at most 5 s) */
unsigned n_cancel;      /* atomic: on_cancel calls */

void gate_wait(void)
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
    if (q->mode >= 2 && q->mode <= 4) { /* response metadata, then OK, NOT_FOUND, or a large OK */
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
        if (q->mode == 4) {
            static uint8_t big[BIG];
            rep.payload.data = big;
            rep.payload.len = sizeof big;
        }
    }
    rep.seq = q->seq;
    vrpc_server_call_respond(call, &rep.base);
}

void write_seq(struct vrpc_server_stream *s, uint64_t seq)
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
    /* -ECONNRESET: the stream already ended before this start ran (a test's
     * bad input ends it on the poller while a slow worker, e.g. under TSan,
     * has yet to run the start: 3 runs in 20 failed here before) */
    int rc = vrpc_server_stream_send_metadata(s, &md, 1);
    if (rc != -ECONNRESET)
        assert_int_equal(rc, 0);
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

/* AsyncCount: as Count, with write_async, each callback queueing the next.
 * A request seq of N | K << 32 (K >= 1) finishes from the K-th callback,
 * with later writes still queued or handed over: every accepted write's
 * callback must run before that finish returns, none after. */
struct actx {
    uint64_t n, queued, done, stop_at;
    bool in_finish;
};
unsigned long acount_late;           /* atomic: callbacks after an early finish returned */
unsigned long acount_early_ok;       /* atomic: early finishes that returned with every callback run */
static struct actx *acount_finished; /* the context of the last early finish (compared, never read) */
static void acount_done(struct vrpc_server_stream *s, int rc, void *arg);
static void acount_more(struct vrpc_server_stream *s, struct actx *a)
{
    while (a->queued < a->n && !a->in_finish) {
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
    if (a == __atomic_load_n(&acount_finished, __ATOMIC_ACQUIRE)) {
        __atomic_add_fetch(&acount_late, 1, __ATOMIC_RELAXED);
        return;
    }
    assert_int_equal(rc, 0);
    ++a->done;
    if (a->in_finish)
        return;
    if (a->done == a->n || a->done == a->stop_at) {
        a->in_finish = true;
        vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
        if (a->stop_at) {
            if (a->done == a->queued)
                __atomic_add_fetch(&acount_early_ok, 1, __ATOMIC_RELAXED);
            __atomic_store_n(&acount_finished, a, __ATOMIC_RELEASE);
        }
        free(a);
        return;
    }
    acount_more(s, a);
}
static void acount_start(struct vrpc_server_stream *s, void *user) { (void)s, (void)user; }
static void acount_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct actx *a = calloc(1, sizeof(*a));
    uint64_t seq = (uintptr_t)vrpc_server_stream_ctx(s);
    a->n = seq & 0xffffffffu;
    a->stop_at = seq >> 32;
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

/* Big: a large message (blocking write), a large one written async, a
 * small one; then OK. */
static uint8_t big_payload[BIG];
/* A reply carrying BIG bytes of 0xa7, sequence number 1. */
static void big_reply(Vrpctest__EchoReply *rep)
{
    *rep = (Vrpctest__EchoReply)VRPCTEST__ECHO_REPLY__INIT;
    memset(big_payload, 0xa7, sizeof big_payload);
    rep->payload.data = big_payload;
    rep->payload.len = sizeof big_payload;
    rep->seq = 1;
}
static void big_done(struct vrpc_server_stream *s, int rc, void *arg)
{
    (void)s, (void)arg;
    assert_int_equal(rc, 0);
}
static void big_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    Vrpctest__EchoReply rep;
    big_reply(&rep);
    assert_int_equal(vrpc_server_stream_write(s, &rep.base), 0);
    rep.seq = 2;
    assert_int_equal(vrpc_server_stream_write_async(s, &rep.base, big_done, NULL), 0);
    write_seq(s, 3); /* after the queued one */
    vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}
static const struct vrpc_server_stream_ops big_ops = {bidi_start, NULL, big_half_close, on_cancel_finish};

/* BigOnce: one large message (blocking write, its outcome in big_once_rc),
 * then OK, whatever the write gave. */
int big_once_rc = 1;
static void big_once_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    Vrpctest__EchoReply rep;
    big_reply(&rep);
    __atomic_store_n(&big_once_rc, vrpc_server_stream_write(s, &rep.base), __ATOMIC_RELEASE);
    vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}
static const struct vrpc_server_stream_ops big_once_ops = {bidi_start, NULL, big_once_half_close, on_cancel_finish};

struct vrpc_server *srv_start(const struct vrpc_server_opts *o0, char *uri)
{
    struct vrpc_server_opts o;
    struct vrpc_server *s;
    if (o0)
        o = *o0;
    else
        vrpc_server_opts_init(&o);
    struct vrpc_method_desc *ms[] = {&m_echo, &m_count, &m_acount, &m_bidi, &m_sum, &m_gate, &m_big, &m_big_once};
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
    assert_int_equal(vrpc_server_register_stream(s, &m_big, &big_ops, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(s, &m_big_once, &big_once_ops, NULL), 0);
    assert_int_equal(vrpc_server_start(s, "tcp://127.0.0.1:0"), 0);
    assert_int_equal(vrpc_server_uri(s, uri, VRPC_URI_MAX), 0);
    return s;
}

struct vrpc_server *g_srv; /* stream_window 4 */
char g_uri[VRPC_URI_MAX];

int group_setup(void **state)
{
    (void)state;
    struct vrpc_server_opts o;
    vrpc_server_opts_init(&o);
    o.stream_window = 4;
    g_srv = srv_start(&o, g_uri);
    return 0;
}

int group_teardown(void **state)
{
    (void)state;
    vrpc_server_destroy(g_srv);
    return 0;
}

void connect_g(struct rc *r, uint32_t window)
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
void assert_unary_ok(struct rc *r, uint64_t id)
{
    unary_call(r, id, m_echo.id, 77);
    struct frame *f = take(r, VRPC_FT_RESPONSE, id, 5000);
    assert_non_null(f);
    assert_int_equal(f->h.status, VRPC_OK);
    assert_int_equal(reply_seq(f), 77);
    assert_false(__atomic_load_n(&r->disconnected, __ATOMIC_ACQUIRE));
}
