/* Streaming RPCs end to end over a real transport (--backend tcp|verbs), the
 * data path: a million small messages per shape, checksummed and counted in
 * order; every message size from 0 to several MiB, client to server
 * (rendezvous inside a stream; the server does not write large stream
 * messages yet, so the other direction is not covered); asynchronous reads
 * and writes; a reader that stops reading (the writer stops, memory stays
 * flat, unary calls on the same connection still complete); 1,000
 * concurrent streams on one connection; 16 bidi echoes at once on one
 * connection (async writes round-robin, the server echoing from on_read);
 * read callbacks on the channel's poller (VRPC_CALL_CB_ON_POLLER).
 * VRPC_TEST_SCALE=N divides the message counts (not the 1,000 streams). */
#define _GNU_SOURCE
#include "stream_fixture.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct vrpc_server *g_server;
static char g_uri[VRPC_URI_MAX];

static double secs_since(int64_t t0) { return (double)(vrpc_now_ns() - t0) / 1e9; }

static int write_msg(struct vrpc_stream *s, uint64_t seq, const uint8_t *p, size_t len)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.seq = seq;
    r.payload.data = (uint8_t *)p;
    r.payload.len = len;
    return vrpc_stream_write(s, &r.base);
}

/* Read one reply; true if it is message seq with its fill(). */
static bool read_msg(struct vrpc_stream *s, uint64_t seq, uint64_t *sum)
{
    ProtobufCMessage *m;
    int rc = vrpc_stream_read(s, &m);
    if (rc) {
        printf("# read %lu: %s\n", (unsigned long)seq, strerror(-rc));
        return false;
    }
    const Vrpctest__EchoReply *r = (const Vrpctest__EchoReply *)m;
    if (r->seq != seq || !check(r->payload.data, r->payload.len, seq)) {
        printf("# read %lu: got seq %lu len %zu (%s); the server saw %lu messages, %u out of order\n",
               (unsigned long)seq, (unsigned long)r->seq, r->payload.len, r->seq == seq ? "corrupt" : "out of order",
               LOAD(g_srv.received), LOAD(g_srv.bad_order));
        return false;
    }
    if (sum)
        *sum = sum_add(*sum, seq, r->payload.data, r->payload.len);
    return true;
}

static void unary_calls(struct vrpc_channel *ch, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        Vrpctest__EchoReply *rep;
        struct vrpc_status st;
        struct vrpc_call_opts o = {.timeout_us = 5000000};
        r.seq = i + 1;
        assert_int_equal(vrpc_call(ch, &m_unary, &r.base, (ProtobufCMessage **)&rep, &o, &st), VRPC_OK);
        assert_int_equal(rep->seq, i + 1);
    }
}

/* ---- a million small messages per shape ------------------------------------------ */

#define SMALL 16

static void test_million_server_streaming(void **state)
{
    (void)state;
    unsigned long n = 1000000 / g_opt.scale;
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    struct vrpc_stream *s = fx_open(ch, &m_sstream, "gen", n, SMALL, 0, NULL);
    Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
    uint64_t sum = 0, srv_sum = 0;
    ProtobufCMessage *m;
    struct vrpc_status st;
    const void *v;
    size_t len;
    int64_t t0 = vrpc_now_ns();

    assert_int_equal(vrpc_stream_write(s, &req.base), 0);
    assert_int_equal(vrpc_stream_write(s, &req.base), -EINVAL); /* one request only */
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(vrpc_stream_close_send(s), -EALREADY);
    for (unsigned long i = 0; i < n; i++)
        assert_true(read_msg(s, i, &sum));
    assert_int_equal(vrpc_stream_read(s, &m), -ENODATA);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK); /* again: the same */
    double t = secs_since(t0);
    printf("# server streaming: %lu messages of %d B in %.2f s (%.0f msg/s)\n", n, SMALL, t, (double)n / t);
    assert_true(trailer_u64(s, "x-sum", &srv_sum));
    assert_true(srv_sum == sum);
    assert_int_equal(vrpc_stream_initial_metadata_get(s, "x-hello", &v, &len), 0);
    assert_int_equal(len, 1);
    assert_int_equal(vrpc_stream_initial_metadata_get(s, "x-none", &v, &len), -ENOENT);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
}

static void test_million_client_streaming(void **state)
{
    (void)state;
    unsigned long n = 1000000 / g_opt.scale;
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    struct vrpc_stream *s = fx_open(ch, &m_cstream, "echo", 0, 0, 0, NULL);
    uint8_t buf[SMALL];
    uint64_t sum = 0, cnt = 0;
    ProtobufCMessage *resp = NULL;
    struct vrpc_status st;
    int64_t t0 = vrpc_now_ns();

    for (unsigned long i = 0; i < n; i++) {
        fill(buf, sizeof(buf), i);
        assert_int_equal(write_msg(s, i, buf, sizeof(buf)), 0);
        sum = sum_add(sum, i, buf, sizeof(buf));
    }
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(write_msg(s, n, buf, sizeof(buf)), -EPIPE); /* half-closed */
    assert_int_equal(vrpc_stream_finish(s, &resp, &st), VRPC_OK);
    double t = secs_since(t0);
    printf("# client streaming: %lu messages of %d B in %.2f s (%.0f msg/s)\n", n, SMALL, t, (double)n / t);
    assert_non_null(resp);
    const Vrpctest__EchoReply *r = (const Vrpctest__EchoReply *)resp;
    assert_int_equal(r->seq, n);
    assert_int_equal(r->payload.len, 8);
    uint64_t got = 0;
    for (int i = 0; i < 8; i++)
        got |= (uint64_t)r->payload.data[i] << (8 * i);
    assert_true(got == sum);
    assert_true(trailer_u64(s, "x-count", &cnt));
    assert_int_equal(cnt, n);
    assert_int_equal(LOAD(g_srv.bad_order), 0);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
}

/* A writer thread for bidi streams: sizes[i % nsizes] bytes for message i. */
struct writer {
    struct vrpc_stream *s;
    unsigned long n;
    const size_t *sizes;
    size_t nsizes;
    uint8_t *buf;
    uint64_t sum;
    unsigned long written; /* atomic */
    int rc;
    bool close;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    for (unsigned long i = 0; i < w->n; i++) {
        size_t len = w->sizes[i % w->nsizes];
        fill(w->buf, len, i);
        if ((w->rc = write_msg(w->s, i, w->buf, len)) != 0)
            return NULL;
        w->sum = sum_add(w->sum, i, w->buf, len);
        __atomic_store_n(&w->written, i + 1, __ATOMIC_RELEASE);
    }
    if (w->close)
        w->rc = vrpc_stream_close_send(w->s);
    return NULL;
}

/* Bidi echo of n messages (sizes cycled), written by a thread, read here. */
static void bidi_echo(struct vrpc_channel *ch, unsigned long n, const size_t *sizes, size_t nsizes, size_t maxlen)
{
    struct vrpc_stream *s = fx_open(ch, &m_bidi, "echo", 0, 0, 0, NULL);
    struct writer w = {s, n, sizes, nsizes, malloc(maxlen ? maxlen : 1), 0, 0, 0, true};
    uint64_t sum = 0, srv_sum = 0;
    ProtobufCMessage *m;
    struct vrpc_status st;
    pthread_t t;
    assert_non_null(w.buf);
    assert_int_equal(pthread_create(&t, NULL, writer_main, &w), 0);
    for (unsigned long i = 0; i < n; i++)
        assert_true(read_msg(s, i, &sum));
    pthread_join(t, NULL);
    assert_int_equal(w.rc, 0);
    assert_int_equal(vrpc_stream_read(s, &m), -ENODATA);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK);
    assert_true(sum == w.sum);
    assert_true(trailer_u64(s, "x-sum", &srv_sum));
    assert_true(srv_sum == sum);
    free(w.buf);
    vrpc_stream_destroy(s);
}

static void test_million_bidi(void **state)
{
    (void)state;
    unsigned long n = 1000000 / g_opt.scale;
    static const size_t small[] = {SMALL};
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    int64_t t0 = vrpc_now_ns();
    bidi_echo(ch, n, small, 1, SMALL);
    double t = secs_since(t0);
    printf("# bidi echo: %lu messages of %d B each way in %.2f s (%.0f msg/s)\n", n, SMALL, t, (double)n / t);
    assert_int_equal(LOAD(g_srv.bad_order), 0);
    vrpc_channel_destroy(ch);
}

static void finish_cstream(struct vrpc_stream *s, unsigned long n, uint64_t sum);

/* ---- every size from 0 to several MiB ------------------------------------------------ */

static void test_message_sizes(void **state)
{
    (void)state;
    enum { MAXS = 2048 };
    static size_t sizes[MAXS];
    size_t n = 0, maxlen = 1;
    for (size_t i = 0; i <= 300; i++) /* every small size */
        sizes[n++] = i;
    for (size_t i = 7900; i <= 8300; i += g_opt.scale) /* every size around the eager limit (8 KiB) */
        sizes[n++] = i;
    for (size_t p = 512; p <= (6u << 20); p *= 2) /* powers of two and their neighbours */
        for (int d = -1; d <= 1; d++)
            sizes[n++] = p + (size_t)d;
    sizes[n++] = 5u << 20;
    sizes[n++] = (5u << 20) + 12345;
    for (size_t i = 0; i < n; i++)
        maxlen = sizes[i] > maxlen ? sizes[i] : maxlen;
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    struct vrpc_stream *s = fx_open(ch, &m_cstream, "echo", 0, 0, 0, NULL);
    uint8_t *buf = malloc(maxlen);
    uint64_t sum = 0;
    int64_t t0 = vrpc_now_ns();
    assert_non_null(buf);
    fx_counts_reset();
    /* Every size once, in order of size, client to server (small ones eager,
     * large ones by rendezvous, the writer running ahead up to the window);
     * the server checks each message's order and content and sums them. */
    for (size_t i = 0; i < n; i++) {
        fill(buf, sizes[i], i);
        assert_int_equal(write_msg(s, i, buf, sizes[i]), 0);
        sum = sum_add(sum, i, buf, sizes[i]);
    }
    finish_cstream(s, n, sum);
    printf("# client streaming of %zu sizes from 0 to %zu B in %.2f s\n", n, maxlen, secs_since(t0));
    assert_int_equal(LOAD(g_srv.bad_order), 0);
    assert_int_equal(LOAD(g_srv.received), n);
    free(buf);
    vrpc_channel_destroy(ch);
}

/* ---- asynchronous reads and writes --------------------------------------------------- */

struct async_rd {
    unsigned long reads, bad;
    uint64_t sum;
    unsigned done; /* atomic: on_done calls */
    int code;
    unsigned long writes_done, write_bad; /* atomic */
    /* read callbacks on the poller: blocking calls tried from on_read,
     * refused there (-EWOULDBLOCK) or answered otherwise than on a worker */
    unsigned long refused, other;
    int finish_code; /* vrpc_stream_finish from on_read on the poller */
};

/* Message r, the next one read: in order and intact, into the checksum. */
static void a_take(struct async_rd *a, const Vrpctest__EchoReply *r)
{
    if (r->seq != a->reads || !check(r->payload.data, r->payload.len, r->seq))
        a->bad++;
    a->sum = sum_add(a->sum, r->seq, r->payload.data, r->payload.len);
}

static void a_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    (void)s;
    struct async_rd *a = arg;
    a_take(a, (const Vrpctest__EchoReply *)msg);
    __atomic_store_n(&a->reads, a->reads + 1, __ATOMIC_RELEASE);
}

static void a_done(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    (void)s;
    (void)resp;
    struct async_rd *a = arg;
    a->code = st->code;
    __atomic_add_fetch(&a->done, 1, __ATOMIC_RELEASE);
}

static struct async_rd g_ard;

static void a_wrote(struct vrpc_stream *s, int rc, void *arg)
{
    (void)s;
    unsigned long seq = (unsigned long)(uintptr_t)arg;
    if (rc != 0 || seq != __atomic_load_n(&g_ard.writes_done, __ATOMIC_RELAXED))
        __atomic_add_fetch(&g_ard.write_bad, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_ard.writes_done, 1, __ATOMIC_RELEASE);
}

/* n echo requests (sizes 0-63, fill()ed) through write_async with a_wrote
 * (its arg the message's index), yielding while VRPC_STREAM_ASYNC_WRITES_MAX
 * are outstanding (counted in *pushed_back); their checksum. */
static uint64_t write_async_echoes(struct vrpc_stream *s, unsigned long n, unsigned long *pushed_back)
{
    uint8_t buf[64];
    uint64_t sum = 0;
    for (unsigned long i = 0; i < n; i++) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        size_t len = i % sizeof(buf);
        fill(buf, len, i);
        r.seq = i;
        r.payload.data = buf;
        r.payload.len = len;
        int rc;
        while ((rc = vrpc_stream_write_async(s, &r.base, a_wrote, (void *)(uintptr_t)i)) == -EAGAIN) {
            (*pushed_back)++;
            sched_yield();
        }
        assert_int_equal(rc, 0);
        sum = sum_add(sum, i, buf, len);
    }
    return sum;
}

static void test_async_bidi(void **state)
{
    (void)state;
    unsigned long n = 200000 / g_opt.scale, pushed_back = 0;
    struct vrpc_stream_cbs cbs = {a_read, a_done, &g_ard};
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    int64_t t0 = vrpc_now_ns();
    memset(&g_ard, 0, sizeof(g_ard));
    struct vrpc_stream *s = fx_open(ch, &m_bidi, "echo", 0, 0, 0, &cbs);
    ProtobufCMessage *m;
    assert_int_equal(vrpc_stream_read(s, &m), -EINVAL); /* reads go to the callbacks */
    uint64_t sum = write_async_echoes(s, n, &pushed_back);
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(fx_wait_at_least(&g_ard.done, 1, 60000), 1);
    printf("# async bidi: %lu messages each way in %.2f s, pushed back %lu times\n", n, secs_since(t0), pushed_back);
    assert_int_equal(g_ard.code, VRPC_OK);
    assert_int_equal(__atomic_load_n(&g_ard.reads, __ATOMIC_ACQUIRE), n);
    assert_int_equal(g_ard.bad, 0);
    assert_true(g_ard.sum == sum);
    assert_int_equal(__atomic_load_n(&g_ard.writes_done, __ATOMIC_ACQUIRE), n);
    assert_int_equal(g_ard.write_bad, 0);
    struct vrpc_status st;
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK);
    vrpc_stream_destroy(s);
    usleep(100000);
    assert_int_equal(LOAD(g_ard.done), 1); /* exactly once */
    vrpc_channel_destroy(ch);
}

/* ---- read callbacks on the poller (VRPC_CALL_CB_ON_POLLER) ----------------------------- */

static void p_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    struct async_rd *a = arg;
    a_take(a, (const Vrpctest__EchoReply *)msg);
    if (a->reads % 997 == 0) {
        /* the stream is half-closed: -EPIPE on a worker; on the poller the
         * write (which may wait for window) is refused before anything */
        Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
        int rc = vrpc_stream_write(s, &q.base);
        if (rc == -EWOULDBLOCK) {
            a->refused++;
            struct vrpc_status st;
            if (!a->finish_code)
                a->finish_code = vrpc_stream_finish(s, NULL, &st);
        } else if (rc != -EPIPE) {
            a->other++;
        }
    }
    __atomic_store_n(&a->reads, a->reads + 1, __ATOMIC_RELEASE);
}

/* Server streaming read through callbacks that may run on the channel's
 * poller: every message once and in order (far more than the window, so
 * the window a poller returns keeps the server going), the blocking calls
 * refused from the poller, and on_done once. */
static void test_read_callbacks_on_poller(void **state)
{
    (void)state;
    unsigned long n = 200000 / g_opt.scale;
    struct async_rd *a = &g_ard;
    memset(a, 0, sizeof(*a));
    struct vrpc_stream_cbs cbs = {p_read, a_done, a};
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
    uint64_t srv_sum = 0;
    int64_t t0 = vrpc_now_ns();
    struct vrpc_stream *s = fx_open_flags(ch, &m_sstream, "gen", n, SMALL, 0, &cbs, VRPC_CALL_CB_ON_POLLER);
    assert_int_equal(vrpc_stream_write(s, &req.base), 0);
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(fx_wait_at_least(&a->done, 1, 60000), 1);
    printf("# read callbacks on the poller: %lu messages in %.2f s; of %lu blocking writes tried from on_read, "
           "%lu were refused (on the poller)\n",
           n, secs_since(t0), (n + 996) / 997, a->refused);
    assert_int_equal(a->code, VRPC_OK);
    assert_int_equal(__atomic_load_n(&a->reads, __ATOMIC_ACQUIRE), n);
    assert_int_equal(a->bad, 0);
    assert_int_equal(a->other, 0);
    assert_true(a->refused > 0); /* most messages arrive while the task is idle */
    assert_int_equal(a->finish_code, VRPC_FAILED_PRECONDITION);
    struct vrpc_status st;
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK);
    assert_true(trailer_u64(s, "x-sum", &srv_sum));
    assert_true(srv_sum == a->sum);
    vrpc_stream_destroy(s);
    usleep(100000);
    assert_int_equal(LOAD(a->done), 1); /* exactly once */
    unary_calls(ch, 10); /* the connection is as good as before */
    vrpc_channel_destroy(ch);
}

/* A bidi echo whose server method runs on the poller (vrpc_server_run_on_poller)
 * and whose client reads on its poller too: every echo once, in order and
 * intact; the server's on_read echoes with write_async and never meets
 * -EAGAIN there (the poller delivers only while a write fits); a blocking
 * write, and a finish with a write queued, are refused from the poller. */
static struct {
    unsigned long next, bad, on_poller, on_task, eagain_on_poller, sync_writes, wrote, wrote_bad; /* the server's */
    int finish_probe;
} g_pe;

/* The client's side of it: echoes in order, and where on_read ran (a write
 * of nothing is refused before its checks on a poller: no side effect). */
static void pb_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    struct async_rd *a = arg;
    a_take(a, (const Vrpctest__EchoReply *)msg);
    int rc = vrpc_stream_write(s, NULL);
    if (rc == -EWOULDBLOCK)
        a->refused++;
    else if (rc != -EINVAL)
        a->other++;
    __atomic_store_n(&a->reads, a->reads + 1, __ATOMIC_RELEASE);
}

static void pe_start(struct vrpc_server_stream *s, void *user) { (void)s, (void)user; }

static void pe_wrote(struct vrpc_server_stream *s, int rc, void *arg)
{
    (void)s, (void)arg;
    if (rc)
        __atomic_add_fetch(&g_pe.wrote_bad, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_pe.wrote, 1, __ATOMIC_RELAXED);
}

static void pe_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    if (r->seq != g_pe.next++ || !check(r->payload.data, r->payload.len, r->seq))
        g_pe.bad++;
    /* where are we: a write of nothing is refused before its checks on a poller */
    bool poller = vrpc_server_stream_write(s, NULL) == -EWOULDBLOCK;
    if (poller)
        g_pe.on_poller++;
    else
        g_pe.on_task++;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.seq = r->seq;
    rep.payload = r->payload;
    int rc = vrpc_server_stream_write_async(s, &rep.base, pe_wrote, NULL);
    if (rc == -EAGAIN) {
        if (poller)
            g_pe.eagain_on_poller++;
        if (!(rc = vrpc_server_stream_write(s, &rep.base)))
            g_pe.sync_writes++;
    }
    if (rc)
        g_pe.bad++;
    /* with that write queued, a finish on the poller would wait: refused,
     * nothing ends */
    if (poller && !rc && !g_pe.finish_probe)
        g_pe.finish_probe = vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}

static void pe_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    if (vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0))
        g_pe.bad++;
}

static void pe_cancel(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
}

static const struct vrpc_server_stream_ops pe_ops = {pe_start, pe_read, pe_half_close, pe_cancel};

static void test_bidi_both_sides_on_poller(void **state)
{
    (void)state;
    unsigned long n = 200000 / g_opt.scale, pushed_back = 0;
    struct vrpc_server_opts so;
    struct vrpc_server *srv;
    char luri[VRPC_URI_MAX], uri[VRPC_URI_MAX];
    fx_listen_uri(luri, sizeof(luri));
    memset(&g_pe, 0, sizeof(g_pe));
    vrpc_server_opts_init(&so);
    assert_int_equal(vrpc_server_create(&so, &srv), 0);
    assert_int_equal(vrpc_server_register_stream(srv, &m_bidi, &pe_ops, NULL), 0);
    assert_int_equal(vrpc_server_run_on_poller(srv, m_bidi.full_name), 0);
    assert_int_equal(vrpc_server_run_on_poller(srv, "/no.Such/Method"), -ENOENT);
    assert_int_equal(vrpc_server_start(srv, luri), 0);
    assert_int_equal(vrpc_server_uri(srv, uri, sizeof(uri)), 0);

    struct async_rd *a = &g_ard;
    memset(a, 0, sizeof(*a));
    struct vrpc_stream_cbs cbs = {pb_read, a_done, a};
    struct vrpc_channel *ch = fx_channel(uri, 16, 0);
    int64_t t0 = vrpc_now_ns();
    struct vrpc_stream *s = fx_open_flags(ch, &m_bidi, "echo", 0, 0, 0, &cbs, VRPC_CALL_CB_ON_POLLER);
    uint64_t sum = write_async_echoes(s, n, &pushed_back);
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(fx_wait_at_least(&a->done, 1, 60000), 1);
    printf("# bidi, both sides on the poller: %lu echoes in %.2f s (writer pushed back %lu times); on_read ran "
           "%lu times on the server's poller and %lu on its task, %lu times on the client's poller of %lu\n",
           n, secs_since(t0), pushed_back, g_pe.on_poller, g_pe.on_task, a->refused, n);
    assert_int_equal(a->code, VRPC_OK);
    assert_int_equal(__atomic_load_n(&a->reads, __ATOMIC_ACQUIRE), n);
    assert_int_equal(a->bad, 0);
    assert_true(a->sum == sum);
    assert_int_equal(a->other, 0);
    assert_true(a->refused > 0);
    assert_int_equal(__atomic_load_n(&a->writes_done, __ATOMIC_ACQUIRE), n); /* every write callback, in order */
    assert_int_equal(a->write_bad, 0);
    assert_int_equal(g_pe.bad, 0);
    assert_int_equal(g_pe.next, n);
    assert_true(g_pe.on_poller > 0);
    assert_int_equal(g_pe.eagain_on_poller, 0);
    assert_int_equal(g_pe.finish_probe, -EWOULDBLOCK);
    assert_int_equal(__atomic_load_n(&g_pe.wrote, __ATOMIC_ACQUIRE) + g_pe.sync_writes, n);
    assert_int_equal(g_pe.wrote_bad, 0);
    struct vrpc_status st;
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(srv);
}

/* ---- a reader that stops reading ---------------------------------------------------- */

#define BIG 4096
#define FLAT_BYTES (4u << 20) /* RSS and heap growth allowed while a writer is stuck */

static void test_client_stops_reading(void **state)
{
    (void)state;
    enum { WINDOW = 32 };
    unsigned long n = 4000;
    fx_counts_reset();
    struct vrpc_channel *ch = fx_channel(g_uri, 16, WINDOW);
    struct vrpc_stream *s = fx_open(ch, &m_sstream, "agen", n, BIG, 0, NULL);
    Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
    assert_int_equal(vrpc_stream_write(s, &req.base), 0);
    assert_int_equal(vrpc_stream_close_send(s), 0);
    /* The server writes asynchronously as fast as it may; nobody reads. */
    int64_t end = vrpc_now_ns() + 10000000000ll;
    while (__atomic_load_n(&g_srv.written, __ATOMIC_ACQUIRE) < WINDOW && vrpc_now_ns() < end)
        usleep(1000);
    usleep(300000);
    unsigned long w1 = __atomic_load_n(&g_srv.written, __ATOMIC_ACQUIRE);
    unsigned long a1 = __atomic_load_n(&g_srv.accepted, __ATOMIC_ACQUIRE);
    size_t r1 = rss_bytes(), h1 = heap_bytes();
    int64_t t0 = vrpc_now_ns();
    unary_calls(ch, 200); /* the same connection still serves calls */
    printf("# 200 unary calls beside the stuck stream in %.3f s\n", secs_since(t0));
    usleep(700000);
    unsigned long w2 = __atomic_load_n(&g_srv.written, __ATOMIC_ACQUIRE);
    unsigned long a2 = __atomic_load_n(&g_srv.accepted, __ATOMIC_ACQUIRE);
    size_t r2 = rss_bytes(), h2 = heap_bytes();
    printf("# reader stopped: server writes completed %lu -> %lu, accepted %lu -> %lu (window %d, async max %u), "
           "RSS %zu -> %zu KiB, heap %zu -> %zu KiB\n",
           w1, w2, a1, a2, WINDOW, VRPC_STREAM_ASYNC_WRITES_MAX, r1 >> 10, r2 >> 10, h1 >> 10, h2 >> 10);
    assert_int_equal(w1, WINDOW);
    assert_int_equal(w2, w1);
    assert_true(a1 <= w1 + VRPC_STREAM_ASYNC_WRITES_MAX);
    assert_int_equal(a2, a1);
    assert_true(h2 < h1 + FLAT_BYTES);
    assert_true(!RSS_MEANINGFUL || r2 < r1 + FLAT_BYTES);
    /* Reading again: everything arrives, in order. */
    uint64_t sum = 0, srv_sum = 0;
    struct vrpc_status st;
    for (unsigned long i = 0; i < n; i++)
        assert_true(read_msg(s, i, &sum));
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK);
    assert_true(trailer_u64(s, "x-sum", &srv_sum));
    assert_true(srv_sum == sum);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
}

struct awriter {
    struct vrpc_stream *s;
    unsigned long n, accepted; /* atomic */
    unsigned done;             /* atomic: callbacks */
    uint64_t sum;
    int rc;
};

static void aw_cb(struct vrpc_stream *s, int rc, void *arg)
{
    (void)s;
    struct awriter *w = arg;
    if (rc)
        w->rc = rc;
    __atomic_add_fetch(&w->done, 1, __ATOMIC_RELEASE);
}

static void *awriter_main(void *arg)
{
    struct awriter *w = arg;
    uint8_t buf[BIG];
    int64_t end = vrpc_now_ns() + 60000000000ll;
    for (unsigned long i = 0; i < w->n && vrpc_now_ns() < end;) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        fill(buf, sizeof(buf), i);
        r.seq = i;
        r.payload.data = buf;
        r.payload.len = sizeof(buf);
        int rc = vrpc_stream_write_async(w->s, &r.base, aw_cb, w);
        if (rc == -EAGAIN) {
            usleep(200);
            continue;
        }
        if (rc) {
            w->rc = rc;
            return NULL;
        }
        w->sum = sum_add(w->sum, i, buf, sizeof(buf));
        __atomic_store_n(&w->accepted, ++i, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void finish_cstream(struct vrpc_stream *s, unsigned long n, uint64_t sum)
{
    ProtobufCMessage *resp = NULL;
    struct vrpc_status st;
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(vrpc_stream_finish(s, &resp, &st), VRPC_OK);
    const Vrpctest__EchoReply *r = (const Vrpctest__EchoReply *)resp;
    assert_non_null(r);
    assert_int_equal(r->seq, n);
    uint64_t got = 0;
    for (int i = 0; i < 8 && r->payload.len == 8; i++)
        got |= (uint64_t)r->payload.data[i] << (8 * i);
    assert_true(got == sum);
    vrpc_stream_destroy(s);
}

static void test_server_stops_reading(void **state)
{
    (void)state;
    unsigned long n = 2000;
    fx_counts_reset();
    stall_arm();
    struct vrpc_channel *ch = fx_channel(g_uri, 16, 0);
    struct writer w = {
        fx_open(ch, &m_cstream, "stall", 0, 0, 0, NULL), n, (const size_t[]){BIG}, 1, malloc(BIG), 0, 0, 0, false};
    struct awriter aw = {fx_open(ch, &m_cstream, "stall", 0, 0, 0, NULL), n, 0, 0, 0, 0};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, writer_main, &w), 0);
    assert_int_equal(pthread_create(&t2, NULL, awriter_main, &aw), 0);
    assert_int_equal(fx_wait_at_least(&g_srv.stalled, 2, 10000), 2);
    usleep(500000);
    unsigned long s1 = __atomic_load_n(&w.written, __ATOMIC_ACQUIRE);
    unsigned d1 = __atomic_load_n(&aw.done, __ATOMIC_ACQUIRE);
    unsigned long c1 = __atomic_load_n(&aw.accepted, __ATOMIC_ACQUIRE);
    size_t r1 = rss_bytes(), h1 = heap_bytes();
    int64_t t0 = vrpc_now_ns();
    unary_calls(ch, 200);
    printf("# 200 unary calls beside two stuck streams in %.3f s\n", secs_since(t0));
    usleep(700000);
    unsigned long s2 = __atomic_load_n(&w.written, __ATOMIC_ACQUIRE);
    unsigned d2 = __atomic_load_n(&aw.done, __ATOMIC_ACQUIRE);
    size_t r2 = rss_bytes(), h2 = heap_bytes();
    printf("# server stopped reading: sync writes %lu -> %lu, async writes completed %u -> %u (accepted %lu), "
           "window %u, RSS %zu -> %zu KiB, heap %zu -> %zu KiB\n",
           s1, s2, d1, d2, c1, VRPC_STREAM_WINDOW_DEFAULT, r1 >> 10, r2 >> 10, h1 >> 10, h2 >> 10);
    assert_int_equal(s1, VRPC_STREAM_WINDOW_DEFAULT);
    assert_int_equal(s2, s1);
    assert_int_equal(d1, VRPC_STREAM_WINDOW_DEFAULT);
    assert_int_equal(d2, d1);
    assert_true(c1 <= d1 + VRPC_STREAM_ASYNC_WRITES_MAX);
    assert_true(h2 < h1 + FLAT_BYTES);
    assert_true(!RSS_MEANINGFUL || r2 < r1 + FLAT_BYTES);
    stall_release();
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    if (w.rc || aw.rc) { /* say why the stream ended */
        struct vrpc_status st1, st2;
        vrpc_stream_finish(w.s, NULL, &st1);
        vrpc_stream_finish(aw.s, NULL, &st2);
        printf(
            "# writers failed: sync rc %d written %lu: %s %s; async rc %d accepted %lu done %u: %s %s; received %lu\n",
            w.rc, w.written, vrpc_code_name(st1.code), st1.message, aw.rc, aw.accepted, aw.done,
            vrpc_code_name(st2.code), st2.message, LOAD(g_srv.received));
    }
    assert_int_equal(w.rc, 0);
    assert_int_equal(aw.rc, 0);
    finish_cstream(w.s, n, w.sum);
    assert_int_equal(fx_wait_at_least(&aw.done, (unsigned)n, 10000), n);
    finish_cstream(aw.s, n, aw.sum);
    free(w.buf);
    assert_int_equal(LOAD(g_srv.bad_order), 0);
    vrpc_channel_destroy(ch);
}

/* ---- 1,000 concurrent streams on one connection --------------------------------------- */

static void test_thousand_streams(void **state)
{
    (void)state;
    enum { ROUNDS = 3 };
    unsigned n = 1000; /* not scaled: cheap, and the point */
    struct vrpc_stream **s = calloc(n, sizeof(*s));
    struct vrpc_channel *ch = fx_channel(g_uri, 1024, 0);
    uint8_t buf[32];
    int64_t t0 = vrpc_now_ns();
    fx_counts_reset();
    assert_non_null(s);
    for (unsigned i = 0; i < n; i++)
        s[i] = fx_open(ch, &m_bidi, "echo", 0, 0, 0, NULL);
    assert_int_equal(fx_wait_at_least(&g_srv.started, n, 30000), n);
    printf("# %u streams open on one connection in %.2f s\n", n, secs_since(t0));
    unary_calls(ch, 10);
    for (unsigned r = 0; r < ROUNDS; r++) {
        for (unsigned i = 0; i < n; i++) {
            fill(buf, (i + r) % sizeof(buf), r);
            assert_int_equal(write_msg(s[i], r, buf, (i + r) % sizeof(buf)), 0);
        }
        for (unsigned i = 0; i < n; i++)
            assert_true(read_msg(s[i], r, NULL));
    }
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(vrpc_stream_close_send(s[i]), 0);
    for (unsigned i = 0; i < n; i++) {
        struct vrpc_status st;
        uint64_t cnt = 0;
        assert_int_equal(vrpc_stream_finish(s[i], NULL, &st), VRPC_OK);
        assert_true(trailer_u64(s[i], "x-count", &cnt));
        assert_int_equal(cnt, ROUNDS);
        vrpc_stream_destroy(s[i]);
    }
    printf("# %u streams x %d round trips, closed, in %.2f s\n", n, ROUNDS, secs_since(t0));
    assert_int_equal(fx_wait_at_least(&g_srv.ended, n, 10000), n);
    assert_int_equal(LOAD(g_srv.finish_ok), n);
    assert_int_equal(LOAD(g_srv.bad_order), 0);
    free(s);
    vrpc_channel_destroy(ch);
}

/* ---- 16 bidi echoes at once on one connection ---------------------------------------- */

#define ECHO16_STREAMS 16
#define ECHO16_SIZE 4096
#define ECHO16_WAIT_MS 60000 /* generous: the bug stalled for good, not slowly */

struct echo16 {
    unsigned long reads, bad; /* atomic: echoes heard, out of order or corrupt */
    unsigned done;            /* atomic: on_done */
    int code;
};

static void e16_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    (void)s;
    struct echo16 *e = arg;
    const Vrpctest__EchoReply *r = (const Vrpctest__EchoReply *)msg;
    if (r->seq != e->reads || !check(r->payload.data, r->payload.len, r->seq))
        e->bad++;
    __atomic_store_n(&e->reads, e->reads + 1, __ATOMIC_RELEASE);
}

static void e16_done(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    (void)s;
    (void)resp;
    struct echo16 *e = arg;
    e->code = st->code;
    if (st->code != VRPC_OK)
        printf("# 16 bidi echoes: a stream ended %d: %s\n", st->code, st->message);
    __atomic_add_fetch(&e->done, 1, __ATOMIC_RELEASE);
}

static void e16_wrote(struct vrpc_stream *s, int rc, void *arg)
{
    (void)s;
    (void)rc;
    (void)arg;
}

/* One writer round-robin over 16 bidi streams of one connection by
 * write_async (-EAGAIN: the next stream), the server echoing each message
 * with the blocking write from on_read on its workers, the client hearing
 * the echoes in on_read: every stream must get all its echoes back. */
static void test_sixteen_bidi_echo(void **state)
{
    (void)state;
    unsigned long n = 4000 / g_opt.scale, written[ECHO16_STREAMS] = {0}, total = 0;
    static struct echo16 e[ECHO16_STREAMS];
    struct vrpc_stream_cbs cbs[ECHO16_STREAMS];
    struct vrpc_stream *s[ECHO16_STREAMS];
    struct vrpc_channel *ch = fx_channel(g_uri, 64, 0);
    static uint8_t buf[ECHO16_SIZE];
    int64_t t0 = vrpc_now_ns(), end = t0 + (int64_t)ECHO16_WAIT_MS * 1000000;
    fx_counts_reset();
    memset(e, 0, sizeof(e));
    for (unsigned i = 0; i < ECHO16_STREAMS; i++) {
        cbs[i] = (struct vrpc_stream_cbs){e16_read, e16_done, &e[i]};
        s[i] = fx_open(ch, &m_bidi, "echo", 0, 0, 0, &cbs[i]);
    }
    while (total < n * ECHO16_STREAMS && vrpc_now_ns() < end) {
        bool any = false;
        for (unsigned i = 0; i < ECHO16_STREAMS; i++) {
            if (written[i] == n)
                continue;
            Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
            size_t len = (written[i] * 7 + i) % (ECHO16_SIZE + 1);
            fill(buf, len, written[i]);
            r.seq = written[i];
            r.payload.data = buf;
            r.payload.len = len;
            int rc = vrpc_stream_write_async(s[i], &r.base, e16_wrote, NULL);
            if (rc == -EAGAIN)
                continue;
            assert_int_equal(rc, 0);
            written[i]++, total++, any = true;
        }
        if (!any)
            sched_yield();
    }
    unsigned long heard = 0;
    for (unsigned i = 0; i < ECHO16_STREAMS; i++) {
        while (LOAD(e[i].reads) < written[i] && vrpc_now_ns() < end)
            usleep(1000);
        heard += LOAD(e[i].reads);
    }
    printf("# 16 bidi echoes: %lu of %lu written, %lu of them heard back, in %.2f s (server saw %lu)\n", total,
           n * ECHO16_STREAMS, heard, secs_since(t0), LOAD(g_srv.received));
    for (unsigned i = 0; i < ECHO16_STREAMS; i++) {
        assert_int_equal(written[i], n);
        assert_int_equal(LOAD(e[i].reads), n);
        assert_int_equal(e[i].bad, 0);
        assert_int_equal(vrpc_stream_close_send(s[i]), 0);
    }
    for (unsigned i = 0; i < ECHO16_STREAMS; i++) {
        assert_int_equal(fx_wait_at_least(&e[i].done, 1, 10000), 1);
        assert_int_equal(e[i].code, VRPC_OK);
        vrpc_stream_destroy(s[i]);
    }
    assert_int_equal(LOAD(g_srv.bad_order), 0);
    vrpc_channel_destroy(ch);
}

static int group_setup(void **state)
{
    (void)state;
    struct srv_cfg c = {.max_concurrent = 1100, .threads = 4};
    g_server = fx_server_start(&c, g_uri, sizeof(g_uri));
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    stall_release(); /* a failed case may have left handlers stalled */
    fx_server_destroy(g_server);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = fx_parse(argc, argv);
    if (rc)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_million_server_streaming),
        cmocka_unit_test(test_million_client_streaming),
        cmocka_unit_test(test_million_bidi),
        cmocka_unit_test(test_message_sizes),
        cmocka_unit_test(test_async_bidi),
        cmocka_unit_test(test_read_callbacks_on_poller),
        cmocka_unit_test(test_bidi_both_sides_on_poller),
        cmocka_unit_test(test_client_stops_reading),
        cmocka_unit_test(test_server_stops_reading),
        cmocka_unit_test(test_thousand_streams),
        cmocka_unit_test(test_sixteen_bidi_echo),
    };
    return fx_run("stream", tests, sizeof(tests) / sizeof(tests[0]), group_setup, group_teardown);
}
