/* The client's streams against the real server (TCP): the three shapes
 * end to end with small windows on both sides, in order and counted, large
 * client messages among small ones, cancel and deadline mid-stream, and a
 * reader that stopped reading not holding up unary calls on the same
 * connection. (The full list, on both backends, is the stream tests'
 * and the bench's.) */
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
#include "rpc_test.pb-c.h"

#define MD(name, kind)                                                                                                 \
    {                                                                                                                  \
        "/vrpctest.Test/" name, 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL, kind  \
    }
static struct vrpc_method_desc m_bidi = MD("Bidi", VRPC_METHOD_BIDI_STREAMING);
static struct vrpc_method_desc m_watch = MD("Watch", VRPC_METHOD_SERVER_STREAMING);
static struct vrpc_method_desc m_upload = MD("Upload", VRPC_METHOD_CLIENT_STREAMING);
static struct vrpc_method_desc m_echo = MD("Echo", VRPC_METHOD_UNARY);

static struct vrpc_server *g_srv;
static char g_uri[128];
static unsigned g_cancels; /* server on_cancel calls (atomic) */

/* ---- the server's handlers ------------------------------------------------- */

static void reply(struct vrpc_server_stream *s, uint64_t seq)
{
    Vrpctest__EchoReply r = VRPCTEST__ECHO_REPLY__INIT;
    r.seq = seq;
    vrpc_server_stream_write(s, &r.base);
}

static void nop_start(struct vrpc_server_stream *s, void *user)
{
    (void)s;
    (void)user;
}

/* Bidi: each message echoed (its seq); the end on half-close. */
static void bidi_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    reply(s, ((const Vrpctest__EchoRequest *)msg)->seq);
}

static void bidi_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct vrpc_metadata md = {.key = "end", .value = "ok", .value_len = 2};
    vrpc_server_stream_finish(s, VRPC_OK, NULL, &md, 1);
}

static void on_cancel(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    __atomic_add_fetch(&g_cancels, 1, __ATOMIC_RELEASE);
    vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
}

/* Watch: seq messages 0 .. n-1 for a request of n (sleep_ms: pause after
 * each, so the client can end it mid-stream). */
static void watch_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    (void)user;
    for (uint64_t i = 0; i < r->seq; i++) {
        Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
        rep.seq = i;
        if (vrpc_server_stream_write(s, &rep.base))
            return; /* cancelled: on_cancel finishes it */
        if (r->sleep_ms)
            usleep(r->sleep_ms * 1000);
    }
    vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}

/* Upload: the sum of the seqs, as the one response. */
struct upload {
    uint64_t sum;
};
static void upload_start(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    vrpc_server_stream_set_ctx(s, calloc(1, sizeof(struct upload)));
}
static void upload_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    struct upload *u = vrpc_server_stream_ctx(s);
    u->sum += ((const Vrpctest__EchoRequest *)msg)->seq;
}
static void upload_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct upload *u = vrpc_server_stream_ctx(s);
    reply(s, u->sum);
    free(u);
    vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}
static void upload_cancel(struct vrpc_server_stream *s, void *user)
{
    free(vrpc_server_stream_ctx(s));
    on_cancel(s, user);
}

static void echo_handler(struct vrpc_server_call *call, const ProtobufCMessage *req, void *user)
{
    (void)user;
    Vrpctest__EchoReply r = VRPCTEST__ECHO_REPLY__INIT;
    r.seq = ((const Vrpctest__EchoRequest *)req)->seq;
    vrpc_server_call_respond(call, &r.base);
}

static const struct vrpc_server_stream_ops bidi_ops = {
    .start = nop_start, .on_read = bidi_read, .on_half_close = bidi_half_close, .on_cancel = on_cancel};
static const struct vrpc_server_stream_ops watch_ops = {
    .start = nop_start, .on_read = watch_read, .on_cancel = on_cancel};
static const struct vrpc_server_stream_ops upload_ops = {
    .start = upload_start, .on_read = upload_read, .on_half_close = upload_half_close, .on_cancel = upload_cancel};

/* ---- helpers ------------------------------------------------------------------ */

static struct vrpc_channel *new_channel(uint32_t window)
{
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&o);
    o.stream_window = window;
    assert_int_equal(vrpc_channel_create(g_uri, &o, &ch), 0);
    return ch;
}

struct writer {
    struct vrpc_stream *s;
    uint64_t n;
    size_t big_every; /* every big_every-th message carries a large payload (0: none) */
    int rc;
};
static void *writer_main(void *arg)
{
    struct writer *w = arg;
    size_t big = 200 << 10;
    uint8_t *pay = w->big_every ? calloc(1, big) : NULL;
    for (uint64_t i = 0; i < w->n && !w->rc; i++) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        r.seq = i;
        if (pay && i % w->big_every == 0) {
            r.payload.data = pay;
            r.payload.len = big;
        }
        w->rc = vrpc_stream_write(w->s, &r.base);
    }
    if (!w->rc)
        w->rc = vrpc_stream_close_send(w->s);
    free(pay);
    return NULL;
}

static unsigned scale(unsigned n)
{
    const char *e = getenv("VRPC_TEST_SCALE");
    unsigned d = e ? (unsigned)atoi(e) : 1;
    return d > 1 ? n / d : n;
}

/* ---- tests --------------------------------------------------------------------- */

/* Bidi echo of n messages (windows of 4 and 8: many WINDOWs each way),
 * every 500th with a 200 KiB payload (rendezvous): all back, in order. */
static void test_bidi_echo(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_channel(4);
    struct vrpc_stream *s;
    assert_int_equal(vrpc_stream_start(ch, &m_bidi, NULL, &s), 0);
    struct writer w = {.s = s, .n = scale(20000), .big_every = 500};
    pthread_t t;
    pthread_create(&t, NULL, writer_main, &w);
    ProtobufCMessage *msg;
    uint64_t want = 0;
    while (vrpc_stream_read(s, &msg) == 0) {
        if (((Vrpctest__EchoReply *)msg)->seq != want)
            fail_msg("message %llu came as %llu", (unsigned long long)want,
                     (unsigned long long)((Vrpctest__EchoReply *)msg)->seq);
        want++;
    }
    pthread_join(t, NULL);
    assert_int_equal(w.rc, 0);
    assert_int_equal(want, w.n);
    struct vrpc_status st;
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK);
    const void *v;
    size_t vl;
    assert_int_equal(vrpc_stream_trailing_metadata_get(s, "end", &v, &vl), 0);
    assert_int_equal(vl, 2);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
}

/* Server streaming and client streaming, counted and summed. */
static void test_watch_and_upload(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_channel(8);
    struct vrpc_stream *s;
    assert_int_equal(vrpc_stream_start(ch, &m_watch, NULL, &s), 0);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.seq = scale(10000);
    assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    assert_int_equal(vrpc_stream_close_send(s), 0);
    ProtobufCMessage *msg;
    uint64_t n = 0;
    while (vrpc_stream_read(s, &msg) == 0)
        assert_int_equal(((Vrpctest__EchoReply *)msg)->seq, n++);
    assert_int_equal(n, r.seq);
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_OK);
    vrpc_stream_destroy(s);

    assert_int_equal(vrpc_stream_start(ch, &m_upload, NULL, &s), 0);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < scale(5000); i++) {
        Vrpctest__EchoRequest u = VRPCTEST__ECHO_REQUEST__INIT;
        u.seq = i;
        sum += i;
        assert_int_equal(vrpc_stream_write(s, &u.base), 0);
    }
    ProtobufCMessage *resp = NULL;
    assert_int_equal(vrpc_stream_finish(s, &resp, NULL), VRPC_OK);
    assert_non_null(resp);
    assert_int_equal(((Vrpctest__EchoReply *)resp)->seq, sum);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
}

/* Cancel and deadline mid-stream: the client's status at once, the server's
 * on_cancel; the connection serves the next stream. */
static void test_cancel_and_deadline(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_channel(8);
    unsigned c0 = __atomic_load_n(&g_cancels, __ATOMIC_ACQUIRE);
    struct vrpc_stream *s;
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.seq = 1000000;
    r.sleep_ms = 1;
    assert_int_equal(vrpc_stream_start(ch, &m_watch, NULL, &s), 0);
    assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    ProtobufCMessage *msg;
    for (int i = 0; i < 10; i++)
        assert_int_equal(vrpc_stream_read(s, &msg), 0);
    vrpc_stream_cancel(s);
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_CANCELLED);
    vrpc_stream_destroy(s);

    struct vrpc_stream_opts o = {.call = {.timeout_us = 200000}};
    assert_int_equal(vrpc_stream_start(ch, &m_watch, &o, &s), 0);
    assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    while (vrpc_stream_read(s, &msg) == 0)
        ;
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_DEADLINE_EXCEEDED);
    vrpc_stream_destroy(s);
    for (int i = 0; i < 5000 && __atomic_load_n(&g_cancels, __ATOMIC_ACQUIRE) < c0 + 2; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&g_cancels, __ATOMIC_ACQUIRE), c0 + 2);
    /* the connection goes on */
    r.seq = 3;
    r.sleep_ms = 0;
    assert_int_equal(vrpc_stream_start(ch, &m_watch, NULL, &s), 0);
    assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    unsigned n = 0;
    while (vrpc_stream_read(s, &msg) == 0)
        n++;
    assert_int_equal(n, 3);
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_OK);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
}

/* A stream whose reader stopped: the server's writes stop at the window;
 * unary calls on the same connection still complete. */
static void test_stalled_reader_spares_calls(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_channel(4);
    struct vrpc_stream *s;
    assert_int_equal(vrpc_stream_start(ch, &m_watch, NULL, &s), 0);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.seq = 100000;
    assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    usleep(100000); /* the server fills the window and blocks */
    for (uint64_t i = 0; i < 200; i++) {
        Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
        ProtobufCMessage *resp;
        struct vrpc_status st;
        q.seq = i;
        assert_int_equal(vrpc_call(ch, &m_echo, &q.base, &resp, NULL, &st), VRPC_OK);
        assert_int_equal(((Vrpctest__EchoReply *)resp)->seq, i);
    }
    vrpc_stream_destroy(s); /* cancels it */
    vrpc_channel_destroy(ch);
}

static int setup(void **state)
{
    (void)state;
    struct vrpc_method_desc *ms[] = {&m_bidi, &m_watch, &m_upload, &m_echo};
    for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
        ms[i]->id = vrpc_method_id(ms[i]->full_name);
    struct vrpc_server_opts so;
    vrpc_server_opts_init(&so);
    so.stream_window = 8;
    if (vrpc_server_create(&so, &g_srv) || vrpc_server_register_stream(g_srv, &m_bidi, &bidi_ops, NULL) ||
        vrpc_server_register_stream(g_srv, &m_watch, &watch_ops, NULL) ||
        vrpc_server_register_stream(g_srv, &m_upload, &upload_ops, NULL) ||
        vrpc_server_register(g_srv, &m_echo, echo_handler, NULL) || vrpc_server_start(g_srv, "tcp://127.0.0.1:0") ||
        vrpc_server_uri(g_srv, g_uri, sizeof g_uri))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    vrpc_server_destroy(g_srv);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bidi_echo),
        cmocka_unit_test(test_watch_and_upload),
        cmocka_unit_test(test_cancel_and_deadline),
        cmocka_unit_test(test_stalled_reader_spares_calls),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
