/* Streaming RPCs end to end (--backend tcp|verbs), how streams end: cancel
 * from either side mid-stream, deadline mid-stream, the peer killed with
 * SIGKILL mid-stream on either side (the peer is this program re-executed),
 * server drain with open streams. Each stream ends exactly once, with the
 * right status on both sides: the client's status (finish, and on_done
 * counted), the server's (on_cancel and finish counted in g_srv). */
#define _GNU_SOURCE
#include "stream_fixture.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct vrpc_server *g_server;
static char g_uri[VRPC_URI_MAX];

struct done_rec {
    unsigned calls; /* atomic */
    int code;
    char msg[VRPC_STATUS_MSG_MAX];
};

static void on_done(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    (void)s;
    (void)resp;
    struct done_rec *d = arg;
    d->code = st->code;
    snprintf(d->msg, sizeof(d->msg), "%s", st->message);
    __atomic_add_fetch(&d->calls, 1, __ATOMIC_RELEASE);
}

static void on_read_ignore(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    (void)s;
    (void)msg;
    (void)arg;
}

static double secs_since(int64_t t0) { return (double)(vrpc_now_ns() - t0) / 1e9; }

static int write_seq(struct vrpc_stream *s, uint64_t seq)
{
    uint8_t buf[24];
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    fill(buf, sizeof(buf), seq);
    r.seq = seq;
    r.payload.data = buf;
    r.payload.len = sizeof(buf);
    return vrpc_stream_write(s, &r.base);
}

static void read_n(struct vrpc_stream *s, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        ProtobufCMessage *m;
        assert_int_equal(vrpc_stream_read(s, &m), 0);
        assert_int_equal(((Vrpctest__EchoReply *)m)->seq, i);
    }
}

/* Open a server-streaming gen stream that never ends by itself. */
static struct vrpc_stream *open_endless(struct vrpc_channel *ch)
{
    struct vrpc_stream *s = fx_open(ch, &m_sstream, "gen", 0, 32, 0, NULL);
    Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
    assert_int_equal(vrpc_stream_write(s, &req.base), 0);
    assert_int_equal(vrpc_stream_close_send(s), 0);
    return s;
}

/* The server side ended `n` streams, each once, the way expected: between
 * `cmin` and `cmax` on_cancel calls (a stream whose writer saw its write
 * fail may finish before its on_cancel could run, and then none runs),
 * `reset` finishes that only released a cancelled stream. */
static void expect_server_ends(unsigned n, unsigned cmin, unsigned cmax, unsigned reset)
{
    assert_int_equal(fx_wait_at_least(&g_srv.ended, n, 15000), n);
    fx_wait_at_least(&g_srv.cancels, cmax, 2000);
    usleep(200000); /* nothing more comes */
    printf("# server: %u ended (%u ok, %u released after cancel), %u on_cancel, %u writes reset\n", LOAD(g_srv.ended),
           LOAD(g_srv.finish_ok), LOAD(g_srv.finish_reset), LOAD(g_srv.cancels), LOAD(g_srv.write_reset));
    assert_int_equal(LOAD(g_srv.ended), n);
    assert_in_range(LOAD(g_srv.cancels), cmin, cmax);
    assert_int_equal(LOAD(g_srv.finish_reset), reset);
    assert_int_equal(LOAD(g_srv.finish_ok), n - reset);
}

/* ---- cancel ----------------------------------------------------------------------- */

static void test_client_cancels(void **state)
{
    (void)state;
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    struct vrpc_status st;
    ProtobufCMessage *m;
    fx_counts_reset();
    /* synchronous: the server is writing (blocked on the window) */
    struct vrpc_stream *s = open_endless(ch);
    read_n(s, 100);
    vrpc_stream_cancel(s);
    vrpc_stream_cancel(s); /* any number of times */
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_CANCELLED);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_CANCELLED);
    while (vrpc_stream_read(s, &m) == 0) /* at most what had arrived */
        ;
    assert_int_equal(vrpc_stream_read(s, &m), -ENODATA);
    vrpc_stream_destroy(s);
    /* asynchronous: a bidi stream the server holds */
    struct done_rec d = {0};
    struct vrpc_stream_cbs cbs = {on_read_ignore, on_done, &d};
    s = fx_open(ch, &m_bidi, "hold", 0, 0, 0, &cbs);
    assert_int_equal(write_seq(s, 0), 0);
    assert_int_equal(fx_wait_at_least(&g_srv.started, 2, 10000), 2);
    vrpc_stream_cancel(s);
    assert_int_equal(fx_wait_at_least(&d.calls, 1, 5000), 1);
    assert_int_equal(d.code, VRPC_CANCELLED);
    vrpc_stream_cancel(s);
    vrpc_stream_destroy(s);
    assert_int_equal(LOAD(d.calls), 1);
    /* destroy cancels a stream that has not ended: on_done runs before it returns */
    struct done_rec d2 = {0};
    cbs.arg = &d2;
    s = fx_open(ch, &m_bidi, "hold", 0, 0, 0, &cbs);
    assert_int_equal(write_seq(s, 0), 0);
    assert_int_equal(fx_wait_at_least(&g_srv.started, 3, 10000), 3);
    vrpc_stream_destroy(s);
    assert_int_equal(LOAD(d2.calls), 1);
    assert_int_equal(d2.code, VRPC_CANCELLED);
    expect_server_ends(3, 2, 3, 3);            /* the gen stream's writer may finish first */
    assert_true(LOAD(g_srv.write_reset) >= 1); /* the gen writer saw its stream go */
    vrpc_channel_destroy(ch);
}

/* Cancelling streams the server is writing to (window open: the client
 * reads as they come) leaves their connection up: the server's MESSAGEs and
 * WINDOWs crossing our CANCEL are dropped, and its RESPONSE ends each stream
 * after its last frame. A bidi echo stream and unary calls on the same
 * connection keep working through every round (was: "stream MESSAGE for a
 * request id not in use", the connection closed under them). */
#define CK_ROUNDS 8
#define CK_STREAMS 16

struct count_rec {
    struct done_rec d; /* first: on_done's arg */
    unsigned reads;    /* atomic */
};

static void on_read_count(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    (void)s;
    (void)msg;
    __atomic_add_fetch(&((struct count_rec *)arg)->reads, 1, __ATOMIC_RELEASE);
}

static void echo_and_call(struct vrpc_channel *ch, struct vrpc_stream *b, uint64_t seq)
{
    ProtobufCMessage *m;
    struct vrpc_status st;
    assert_int_equal(write_seq(b, seq), 0);
    assert_int_equal(vrpc_stream_read(b, &m), 0);
    assert_int_equal(((Vrpctest__EchoReply *)m)->seq, seq);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    Vrpctest__EchoReply *rep;
    struct vrpc_call_opts o = {.timeout_us = 5000000};
    r.seq = seq;
    assert_int_equal(vrpc_call(ch, &m_unary, &r.base, (ProtobufCMessage **)&rep, &o, &st), VRPC_OK);
    assert_int_equal(rep->seq, seq);
}

static void test_cancel_keeps_connection(void **state)
{
    (void)state;
    struct vrpc_channel *ch = fx_channel(g_uri, 64, 0);
    struct vrpc_status st;
    fx_counts_reset();
    struct vrpc_stream *b = fx_open(ch, &m_bidi, "echo", 0, 0, 0, NULL);
    echo_and_call(ch, b, 0);
    for (unsigned r = 0; r < CK_ROUNDS; r++) {
        struct vrpc_stream *s[CK_STREAMS];
        struct count_rec cr[CK_STREAMS];
        memset(cr, 0, sizeof(cr));
        for (unsigned i = 0; i < CK_STREAMS; i++) {
            struct vrpc_stream_cbs cbs = {on_read_count, on_done, &cr[i]};
            Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
            s[i] = fx_open(ch, &m_sstream, (r + i) % 2 ? "agen" : "gen", 0, 32, 0, &cbs);
            assert_int_equal(vrpc_stream_write(s[i], &req.base), 0);
            assert_int_equal(vrpc_stream_close_send(s[i]), 0);
        }
        for (unsigned i = 0; i < CK_STREAMS; i++) /* every server writer is going */
            assert_true(fx_wait_at_least(&cr[i].reads, 50, 10000) >= 50);
        for (unsigned i = 0; i < CK_STREAMS; i++) {
            vrpc_stream_cancel(s[i]);
            vrpc_stream_destroy(s[i]);
            assert_int_equal(LOAD(cr[i].d.calls), 1);
            assert_int_equal(cr[i].d.code, VRPC_CANCELLED);
        }
        echo_and_call(ch, b, r + 1);
    }
    assert_int_equal(vrpc_stream_close_send(b), 0);
    assert_int_equal(vrpc_stream_finish(b, NULL, &st), VRPC_OK);
    vrpc_stream_destroy(b);
    unsigned n = CK_ROUNDS * CK_STREAMS + 1;
    assert_int_equal(fx_wait_at_least(&g_srv.ended, n, 15000), n);
    printf("# %u rounds of %u cancelled streams: the bidi stream and unary calls on their connection kept "
           "working; server: %u on_cancel, %u writes reset\n",
           CK_ROUNDS, CK_STREAMS, LOAD(g_srv.cancels), LOAD(g_srv.write_reset));
    assert_int_equal(LOAD(g_srv.finish_ok), 1); /* the echo; every cancelled one was only released */
    vrpc_channel_destroy(ch);
}

static void test_server_ends_stream(void **state)
{
    (void)state;
    enum { N = 50 };
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    struct vrpc_status st;
    ProtobufCMessage *m;
    fx_counts_reset();
    struct vrpc_stream *s = fx_open(ch, &m_bidi, "abort", N, 0, 0, NULL);
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(write_seq(s, i), 0);
        assert_int_equal(vrpc_stream_read(s, &m), 0);
        assert_int_equal(((Vrpctest__EchoReply *)m)->seq, i);
    }
    assert_int_equal(vrpc_stream_read(s, &m), -ENODATA);
    assert_int_equal(write_seq(s, N), -EPIPE);
    assert_int_equal(vrpc_stream_close_send(s), -EPIPE);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_ABORTED);
    assert_string_equal(st.message, "server gave up");
    vrpc_stream_destroy(s);
    /* the same, read asynchronously: on_done once, after the reads */
    struct done_rec d = {0};
    struct vrpc_stream_cbs cbs = {on_read_ignore, on_done, &d};
    s = fx_open(ch, &m_bidi, "abort", N, 0, 0, &cbs);
    for (unsigned i = 0; i < N; i++) {
        int rc = write_seq(s, i);
        assert_true(rc == 0 || (rc == -EPIPE && i == N - 1));
    }
    assert_int_equal(fx_wait_at_least(&d.calls, 1, 10000), 1);
    assert_int_equal(d.code, VRPC_ABORTED);
    assert_string_equal(d.msg, "server gave up");
    vrpc_stream_destroy(s);
    assert_int_equal(LOAD(d.calls), 1);
    expect_server_ends(2, 0, 0, 0);
    vrpc_channel_destroy(ch);
}

/* ---- deadline ------------------------------------------------------------------------ */

static void test_deadline_mid_stream(void **state)
{
    (void)state;
    const int64_t budget_us = 400000;
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    struct vrpc_status st;
    ProtobufCMessage *m;
    fx_counts_reset();
    int64_t t0 = vrpc_now_ns();
    struct vrpc_stream *s = fx_open(ch, &m_bidi, "echo", 0, 0, budget_us, NULL);
    unsigned i = 0;
    int wrc = 0, rrc = 0;
    for (; secs_since(t0) < 10; i++) {
        if ((wrc = write_seq(s, i)) != 0 || (rrc = vrpc_stream_read(s, &m)) != 0)
            break;
        usleep(10000);
    }
    double t = secs_since(t0);
    printf("# deadline %.1f s: %u round trips, then write %d read %d at %.3f s\n", (double)budget_us / 1e6, i, wrc, rrc,
           t);
    assert_true(i >= 1);
    assert_true(wrc == -ETIMEDOUT || wrc == -EPIPE || rrc == -ENODATA);
    assert_true(t >= (double)budget_us / 1e6 && t < (double)budget_us / 1e6 + 3.0);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_DEADLINE_EXCEEDED);
    vrpc_stream_destroy(s);
    /* read asynchronously, the server silent: on_done once, at the deadline */
    struct done_rec d = {0};
    struct vrpc_stream_cbs cbs = {on_read_ignore, on_done, &d};
    t0 = vrpc_now_ns();
    s = fx_open(ch, &m_bidi, "hold", 0, 0, budget_us, &cbs);
    assert_int_equal(fx_wait_at_least(&d.calls, 1, 10000), 1);
    t = secs_since(t0);
    assert_int_equal(d.code, VRPC_DEADLINE_EXCEEDED);
    assert_true(t >= (double)budget_us / 1e6 && t < (double)budget_us / 1e6 + 3.0);
    vrpc_stream_destroy(s);
    assert_int_equal(LOAD(d.calls), 1);
    expect_server_ends(2, 2, 2, 2);
    vrpc_channel_destroy(ch);
}

/* ---- the peer killed ------------------------------------------------------------------- */

static void test_server_killed(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX + 8];
    int pid = fx_spawn("server", "-", uri, sizeof(uri));
    int wst;
    struct vrpc_status st;
    ProtobufCMessage *m;
    assert_true(strlen(uri) > 0);
    struct vrpc_channel *ch = fx_channel(uri, 16, 0);
    struct vrpc_stream *s = open_endless(ch);
    struct done_rec d = {0};
    struct vrpc_stream_cbs cbs = {on_read_ignore, on_done, &d};
    struct vrpc_stream *a = fx_open(ch, &m_bidi, "echo", 0, 0, 0, &cbs);
    assert_int_equal(write_seq(a, 0), 0);
    read_n(s, 100);
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    unsigned more = 0;
    while (vrpc_stream_read(s, &m) == 0 && more < 100000)
        more++;
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_UNAVAILABLE);
    assert_int_equal(fx_wait_at_least(&d.calls, 1, 15000), 1);
    printf("# server killed: the stream ended UNAVAILABLE after %.3f s (%u buffered messages read): %s\n",
           secs_since(t0), more, st.message);
    assert_true(more <= VRPC_STREAM_WINDOW_DEFAULT);
    assert_int_equal(d.code, VRPC_UNAVAILABLE);
    assert_int_equal(write_seq(a, 1), -EPIPE); /* after the loss: s->c is gone (was a use-after-free) */
    vrpc_stream_destroy(s);
    vrpc_stream_destroy(a);
    assert_int_equal(LOAD(d.calls), 1);
    vrpc_channel_destroy(ch);
}

static void test_client_killed(void **state)
{
    (void)state;
    char line[64];
    int wst;
    fx_counts_reset();
    int pid = fx_spawn("client", g_uri, line, sizeof(line));
    assert_string_equal(line, "ready");
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    expect_server_ends(1, 0, 1, 1); /* the writer may see it first */
    printf("# client killed: its stream ended on the server within %.3f s\n", secs_since(t0));
    assert_int_equal(LOAD(g_srv.write_reset), 1); /* the writer saw it, once */
}

/* ---- server drain --------------------------------------------------------------------- */

struct shut {
    struct vrpc_server *srv;
    int timeout_ms, rc;
};

static void *shutdown_main(void *arg)
{
    struct shut *x = arg;
    x->rc = vrpc_server_shutdown(x->srv, x->timeout_ms);
    return NULL;
}

static void test_drain_with_open_streams(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    struct vrpc_status st;
    ProtobufCMessage *m;
    fx_counts_reset();
    struct vrpc_server *srv = fx_server_start(NULL, uri, sizeof(uri));
    struct vrpc_channel *ch = fx_channel(uri, 16, 0);
    struct vrpc_stream *endless = open_endless(ch);
    struct vrpc_stream *polite = fx_open(ch, &m_bidi, "echo", 0, 0, 0, NULL);
    struct done_rec d = {0};
    struct vrpc_stream_cbs cbs = {on_read_ignore, on_done, &d};
    struct vrpc_stream *held = fx_open(ch, &m_bidi, "hold", 0, 0, 0, &cbs);
    read_n(endless, 10);
    assert_int_equal(write_seq(polite, 0), 0);
    assert_int_equal(vrpc_stream_read(polite, &m), 0);
    assert_int_equal(fx_wait_at_least(&g_srv.started, 3, 10000), 3);

    struct shut x = {srv, 1500, 0};
    pthread_t t;
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(pthread_create(&t, NULL, shutdown_main, &x), 0);
    usleep(100000);
    /* a stream that ends during the drain ends normally */
    assert_int_equal(write_seq(polite, 1), 0);
    assert_int_equal(vrpc_stream_read(polite, &m), 0);
    assert_int_equal(((Vrpctest__EchoReply *)m)->seq, 1);
    assert_int_equal(vrpc_stream_close_send(polite), 0);
    assert_int_equal(vrpc_stream_finish(polite, NULL, &st), VRPC_OK);
    pthread_join(t, NULL);
    printf("# drain: shutdown returned %d after %.3f s\n", x.rc, secs_since(t0));
    assert_int_equal(x.rc, -ETIMEDOUT); /* two streams never ended by themselves */
    /* the others are dropped when the drain times out */
    while (vrpc_stream_read(endless, &m) == 0)
        ;
    assert_int_equal(vrpc_stream_finish(endless, NULL, &st), VRPC_UNAVAILABLE);
    assert_int_equal(fx_wait_at_least(&d.calls, 1, 10000), 1);
    assert_int_equal(d.code, VRPC_UNAVAILABLE);
    expect_server_ends(3, 1, 2, 2); /* the same for the endless one */
    vrpc_stream_destroy(endless);
    vrpc_stream_destroy(polite);
    vrpc_stream_destroy(held);
    assert_int_equal(LOAD(d.calls), 1);
    vrpc_channel_destroy(ch);
    fx_server_destroy(srv);
}

static int group_setup(void **state)
{
    (void)state;
    g_server = fx_server_start(NULL, g_uri, sizeof(g_uri));
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    fx_server_destroy(g_server);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    int rc = fx_parse(argc, argv);
    if (rc)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_cancels),          cmocka_unit_test(test_server_ends_stream),
        cmocka_unit_test(test_deadline_mid_stream),     cmocka_unit_test(test_server_killed),
        cmocka_unit_test(test_client_killed),           cmocka_unit_test(test_drain_with_open_streams),
        cmocka_unit_test(test_cancel_keeps_connection),
    };
    return fx_run("stream_fail", tests, sizeof(tests) / sizeof(tests[0]), group_setup, group_teardown);
}
