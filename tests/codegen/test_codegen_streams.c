/* Generated streaming stubs at run time, and the health service's Watch: a
 * server implementing protos/stream/feeds.proto's Ticker through its
 * generated impl table (server streaming, client streaming, bidi and a
 * unary method side by side), and a client driving each shape through the
 * synchronous and the asynchronous stubs, checking every message's content
 * and order. Then verbrpc.health.v1.Health/Watch against
 * vrpc_server_set_serving_status and a server drain.
 *   test_codegen_streams [--backend tcp|verbs] [--setup single|veth] */
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
#include <time.h>

#include "verbs_setup.h"
#include <verbrpc/health.h>
#include <verbrpc/health.vrpc.h>
#include <verbrpc/verbrpc.h>

#include "stream/feeds.vrpc.h"

#define N_TICKS 300 /* several stream windows (VRPC_STREAM_WINDOW_DEFAULT) */

static struct {
    char listen[128];
    const char *src;
    struct vrpc_server *server;
    struct vrpc_channel *ch;
    char uri[256];
} g;

/* ---- the server ----------------------------------------------------------- */

static void quote(struct vrpc_server_call *call, const Cg__Stream__V1__Symbol *req, void *user)
{
    Cg__Stream__V1__Tick t = CG__STREAM__V1__TICK__INIT;

    (void)user;
    t.symbol = req->name;
    t.price_micros = 42;
    cg__stream__v1__ticker__quote__respond(call, &t);
}

static void noop_start(struct vrpc_server_stream *s, void *user)
{
    (void)s;
    (void)user;
}

/* Subscribe: N_TICKS ticks of the symbol, price i, then OK; "fail" ends
 * FAILED_PRECONDITION after 3 ticks. Blocking writes from the worker. */
static void subscribe_read(struct vrpc_server_stream *s, const Cg__Stream__V1__Symbol *req, void *user)
{
    bool fail = strcmp(req->name, "fail") == 0;
    int n = fail ? 3 : N_TICKS;

    (void)user;
    vrpc_server_stream_set_ctx(s, s); /* the request arrived: this handler finishes */
    for (int i = 0; i < n; i++) {
        Cg__Stream__V1__Tick t = CG__STREAM__V1__TICK__INIT;

        t.symbol = req->name;
        t.price_micros = i;
        if (cg__stream__v1__ticker__subscribe__send(s, &t) != 0)
            break; /* cancelled: the finish below only releases it */
    }
    vrpc_server_stream_finish(s, fail ? VRPC_FAILED_PRECONDITION : VRPC_OK, fail ? "asked to fail" : NULL, NULL, 0);
}

/* A stream's callbacks run one at a time: a stream whose on_read finished it
 * gets no on_cancel; one cancelled before (ctx unset) is finished here. */
static void finish_cancelled(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
}

static void subscribe_cancel(struct vrpc_server_stream *s, void *user)
{
    if (!vrpc_server_stream_ctx(s))
        finish_cancelled(s, user);
}

/* Upload: count and sum; checks the ticks arrive in order (price = index). */
struct upload_ctx {
    uint64_t count;
    int64_t sum;
    bool in_order;
};

static void upload_start(struct vrpc_server_stream *s, void *user)
{
    struct upload_ctx *u = calloc(1, sizeof(*u));

    (void)user;
    u->in_order = true;
    vrpc_server_stream_set_ctx(s, u);
}

static void upload_read(struct vrpc_server_stream *s, const Cg__Stream__V1__Tick *t, void *user)
{
    struct upload_ctx *u = vrpc_server_stream_ctx(s);

    (void)user;
    u->in_order &= t->price_micros == (int64_t)u->count;
    u->count++;
    u->sum += t->price_micros;
}

static void upload_half_close(struct vrpc_server_stream *s, void *user)
{
    struct upload_ctx *u = vrpc_server_stream_ctx(s);
    Cg__Stream__V1__Summary sum = CG__STREAM__V1__SUMMARY__INIT;

    (void)user;
    sum.count = u->count;
    sum.sum_micros = u->in_order ? u->sum : -1;
    free(u);
    cg__stream__v1__ticker__upload__respond(s, &sum);
}

static void upload_cancel(struct vrpc_server_stream *s, void *user)
{
    free(vrpc_server_stream_ctx(s));
    finish_cancelled(s, user);
}

/* Trade: each order answered by one fill (order_id = id, qty = 2 * qty). */
static void trade_read(struct vrpc_server_stream *s, const Cg__Stream__V1__Order *o, void *user)
{
    Cg__Stream__V1__Order__Fill f = CG__STREAM__V1__ORDER__FILL__INIT;

    (void)user;
    f.order_id = o->id;
    f.qty = 2 * o->qty;
    cg__stream__v1__ticker__trade__send(s, &f);
}

static void trade_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}

static const Cg__Stream__V1__Ticker_VrpcImpl ticker_impl = {
    .quote = quote,
    .subscribe = {.start = noop_start, .on_read = subscribe_read, .on_cancel = subscribe_cancel},
    .upload = {.start = upload_start,
               .on_read = upload_read,
               .on_half_close = upload_half_close,
               .on_cancel = upload_cancel},
    .trade = {.start = noop_start,
              .on_read = trade_read,
              .on_half_close = trade_half_close,
              .on_cancel = finish_cancelled},
};

/* ---- waiting for an asynchronous end -------------------------------------- */

struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    enum vrpc_code code;
    long reads;     /* on_read calls */
    bool in_order;  /* every read carried the expected index */
    uint64_t count; /* client streaming: the response's count */
    int64_t sum;
    long written, write_errors; /* write callbacks */
};

static void waiter_init(struct waiter *w)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->in_order = true;
}

static void waiter_end(struct waiter *w, enum vrpc_code code)
{
    pthread_mutex_lock(&w->mu);
    w->code = code;
    w->done = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits (at most 60 s, a bound for a hung test, not a timing target). */
static bool waiter_wait(struct waiter *w)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    pthread_mutex_lock(&w->mu);
    while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0)
        ;
    pthread_mutex_unlock(&w->mu);
    return w->done;
}

static void waiter_free(struct waiter *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

/* ---- client: each shape ---------------------------------------------------- */

static void test_descriptors_and_unary(void **state)
{
    Cg__Stream__V1__Symbol sym = CG__STREAM__V1__SYMBOL__INIT;
    Cg__Stream__V1__Tick *t = NULL;
    struct vrpc_stream *s = NULL;
    struct vrpc_status st;

    (void)state;
    assert_int_equal(cg__stream__v1__ticker__quote__method.kind, VRPC_METHOD_UNARY);
    assert_int_equal(cg__stream__v1__ticker__subscribe__method.kind, VRPC_METHOD_SERVER_STREAMING);
    assert_int_equal(cg__stream__v1__ticker__upload__method.kind, VRPC_METHOD_CLIENT_STREAMING);
    assert_int_equal(cg__stream__v1__ticker__trade__method.kind, VRPC_METHOD_BIDI_STREAMING);
    assert_int_equal(verbrpc__health__v1__health__watch__method.kind, VRPC_METHOD_SERVER_STREAMING);
    sym.name = "Q";
    assert_int_equal(cg__stream__v1__ticker__quote__call(g.ch, &sym, &t, NULL, &st), VRPC_OK);
    assert_string_equal(t->symbol, "Q");
    assert_int_equal(t->price_micros, 42);
    /* a unary method cannot be opened as a stream, nor a stream called */
    assert_int_equal(vrpc_stream_start(g.ch, &cg__stream__v1__ticker__quote__method, NULL, &s), -EINVAL);
    assert_int_equal(vrpc_call(g.ch, &cg__stream__v1__ticker__subscribe__method, (const ProtobufCMessage *)&sym,
                               (ProtobufCMessage **)&t, NULL, &st),
                     VRPC_UNIMPLEMENTED);
    assert_int_equal(cg__stream__v1__ticker__subscribe__start(g.ch, NULL, NULL, &s), -EINVAL);
}

static void test_server_streaming_sync(void **state)
{
    Cg__Stream__V1__Symbol sym = CG__STREAM__V1__SYMBOL__INIT;
    Cg__Stream__V1__Tick *t;
    struct vrpc_stream *s = NULL;
    struct vrpc_status st;

    (void)state;
    sym.name = "ABC";
    assert_int_equal(cg__stream__v1__ticker__subscribe__start(g.ch, &sym, NULL, &s), 0);
    for (int i = 0; i < N_TICKS; i++) {
        assert_int_equal(cg__stream__v1__ticker__subscribe__read(s, &t), 0);
        assert_string_equal(t->symbol, "ABC");
        assert_int_equal(t->price_micros, i);
    }
    assert_int_equal(cg__stream__v1__ticker__subscribe__read(s, &t), -ENODATA);
    assert_int_equal(cg__stream__v1__ticker__subscribe__finish(s, &st), VRPC_OK);
    vrpc_stream_destroy(s);

    /* the server's status reaches the client after its messages */
    sym.name = "fail";
    assert_int_equal(cg__stream__v1__ticker__subscribe__start(g.ch, &sym, NULL, &s), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cg__stream__v1__ticker__subscribe__read(s, &t), 0);
    assert_int_equal(cg__stream__v1__ticker__subscribe__read(s, &t), -ENODATA);
    assert_int_equal(cg__stream__v1__ticker__subscribe__finish(s, &st), VRPC_FAILED_PRECONDITION);
    assert_string_equal(st.message, "asked to fail");
    vrpc_stream_destroy(s);

    /* cancelled mid-stream by the client */
    sym.name = "CXL";
    assert_int_equal(cg__stream__v1__ticker__subscribe__start(g.ch, &sym, NULL, &s), 0);
    assert_int_equal(cg__stream__v1__ticker__subscribe__read(s, &t), 0);
    vrpc_stream_cancel(s);
    assert_int_equal(cg__stream__v1__ticker__subscribe__finish(s, &st), VRPC_CANCELLED);
    vrpc_stream_destroy(s);
}

static void sub_read(struct vrpc_stream *s, const Cg__Stream__V1__Tick *t, void *arg)
{
    struct waiter *w = arg;

    (void)s;
    pthread_mutex_lock(&w->mu);
    w->in_order &= t->price_micros == w->reads;
    w->reads++;
    pthread_mutex_unlock(&w->mu);
}

static void sub_done(struct vrpc_stream *s, const struct vrpc_status *st, void *arg)
{
    (void)s;
    waiter_end(arg, st->code);
}

static void test_server_streaming_async(void **state)
{
    Cg__Stream__V1__Symbol sym = CG__STREAM__V1__SYMBOL__INIT;
    Cg__Stream__V1__Ticker_Subscribe_Async a = {.on_read = sub_read, .done = sub_done};
    struct vrpc_stream *s = NULL;
    struct waiter w;

    (void)state;
    waiter_init(&w);
    a.arg = &w;
    sym.name = "ASY";
    assert_int_equal(cg__stream__v1__ticker__subscribe__start_async(g.ch, &sym, NULL, &a, &s), 0);
    assert_true(waiter_wait(&w));
    assert_int_equal(w.code, VRPC_OK);
    assert_int_equal(w.reads, N_TICKS);
    assert_true(w.in_order);
    vrpc_stream_destroy(s);
    waiter_free(&w);
}

static void test_client_streaming_sync(void **state)
{
    Cg__Stream__V1__Summary *sum = NULL;
    struct vrpc_stream *s = NULL;
    struct vrpc_status st;

    (void)state;
    assert_int_equal(cg__stream__v1__ticker__upload__start(g.ch, NULL, &s), 0);
    for (int i = 0; i < N_TICKS; i++) {
        Cg__Stream__V1__Tick t = CG__STREAM__V1__TICK__INIT;

        t.symbol = "UP";
        t.price_micros = i;
        assert_int_equal(cg__stream__v1__ticker__upload__write(s, &t), 0);
    }
    assert_int_equal(cg__stream__v1__ticker__upload__finish(s, &sum, &st), VRPC_OK);
    assert_non_null(sum);
    assert_int_equal(sum->count, N_TICKS);
    assert_int_equal(sum->sum_micros, (int64_t)N_TICKS * (N_TICKS - 1) / 2);
    /* finish again: the same status */
    assert_int_equal(cg__stream__v1__ticker__upload__finish(s, NULL, &st), VRPC_OK);
    vrpc_stream_destroy(s);
}

static void up_written(struct vrpc_stream *s, int rc, void *arg)
{
    struct waiter *w = arg;

    (void)s;
    pthread_mutex_lock(&w->mu);
    w->written++;
    w->write_errors += rc != 0;
    pthread_mutex_unlock(&w->mu);
}

static void up_done(struct vrpc_stream *s, const struct vrpc_status *st, const Cg__Stream__V1__Summary *sum, void *arg)
{
    struct waiter *w = arg;

    (void)s;
    if (sum) {
        w->count = sum->count;
        w->sum = sum->sum_micros;
    }
    waiter_end(w, st->code);
}

static void test_client_streaming_async(void **state)
{
    Cg__Stream__V1__Ticker_Upload_Async a = {.done = up_done};
    struct vrpc_stream *s = NULL;
    struct waiter w;
    long again = 0;

    (void)state;
    waiter_init(&w);
    a.arg = &w;
    assert_int_equal(cg__stream__v1__ticker__upload__start_async(g.ch, NULL, &a, &s), 0);
    for (int i = 0; i < N_TICKS;) {
        Cg__Stream__V1__Tick t = CG__STREAM__V1__TICK__INIT;
        int rc;

        t.symbol = "UPA";
        t.price_micros = i;
        rc = cg__stream__v1__ticker__upload__write_async(s, &t, up_written, &w);
        if (rc == -EAGAIN) { /* VRPC_STREAM_ASYNC_WRITES_MAX outstanding */
            struct timespec ts = {0, 1000000};

            assert_true(++again < 60000); /* a bound for a hung test */
            nanosleep(&ts, NULL);
            continue;
        }
        assert_int_equal(rc, 0);
        i++;
    }
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(vrpc_stream_close_send(s), -EALREADY);
    assert_true(waiter_wait(&w));
    assert_int_equal(w.code, VRPC_OK);
    assert_int_equal(w.count, N_TICKS);
    assert_int_equal(w.sum, (int64_t)N_TICKS * (N_TICKS - 1) / 2);
    vrpc_stream_destroy(s);
    assert_int_equal(w.written, N_TICKS); /* every write's callback ran, before the end */
    assert_int_equal(w.write_errors, 0);
    waiter_free(&w);
}

static void test_bidi_sync(void **state)
{
    Cg__Stream__V1__Order__Fill *f;
    struct vrpc_stream *s = NULL;
    struct vrpc_status st;

    (void)state;
    assert_int_equal(cg__stream__v1__ticker__trade__start(g.ch, NULL, &s), 0);
    for (int i = 0; i < N_TICKS; i++) { /* ping-pong: one order, its fill */
        Cg__Stream__V1__Order o = CG__STREAM__V1__ORDER__INIT;

        o.id = (uint64_t)i;
        o.qty = i;
        assert_int_equal(cg__stream__v1__ticker__trade__write(s, &o), 0);
        assert_int_equal(cg__stream__v1__ticker__trade__read(s, &f), 0);
        assert_int_equal(f->order_id, i);
        assert_int_equal(f->qty, 2 * i);
    }
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(cg__stream__v1__ticker__trade__read(s, &f), -ENODATA);
    assert_int_equal(cg__stream__v1__ticker__trade__finish(s, &st), VRPC_OK);
    vrpc_stream_destroy(s);
}

static void trade_on_read(struct vrpc_stream *s, const Cg__Stream__V1__Order__Fill *f, void *arg)
{
    struct waiter *w = arg;

    (void)s;
    pthread_mutex_lock(&w->mu);
    w->in_order &= f->order_id == (uint64_t)w->reads && f->qty == 2 * w->reads;
    w->reads++;
    pthread_mutex_unlock(&w->mu);
}

static void trade_done(struct vrpc_stream *s, const struct vrpc_status *st, void *arg)
{
    (void)s;
    waiter_end(arg, st->code);
}

static void test_bidi_async(void **state)
{
    Cg__Stream__V1__Ticker_Trade_Async a = {.on_read = trade_on_read, .done = trade_done};
    struct vrpc_stream *s = NULL;
    struct waiter w;

    (void)state;
    waiter_init(&w);
    a.arg = &w;
    assert_int_equal(cg__stream__v1__ticker__trade__start_async(g.ch, NULL, &a, &s), 0);
    for (int i = 0; i < N_TICKS; i++) { /* all orders first: fills flow back meanwhile */
        Cg__Stream__V1__Order o = CG__STREAM__V1__ORDER__INIT;

        o.id = (uint64_t)i;
        o.qty = i;
        assert_int_equal(cg__stream__v1__ticker__trade__write(s, &o), 0);
    }
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_true(waiter_wait(&w));
    assert_int_equal(w.code, VRPC_OK);
    assert_int_equal(w.reads, N_TICKS);
    assert_true(w.in_order);
    vrpc_stream_destroy(s);
    waiter_free(&w);
}

/* ---- Health/Watch ------------------------------------------------------------ */

static int watch_next(struct vrpc_stream *s)
{
    Verbrpc__Health__V1__HealthCheckResponse *r;
    int rc = verbrpc__health__v1__health__watch__read(s, &r);

    return rc == 0 ? (int)r->status : rc;
}

static int check_status(struct vrpc_channel *ch, const char *service)
{
    Verbrpc__Health__V1__HealthCheckRequest req = VERBRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Verbrpc__Health__V1__HealthCheckResponse *r;
    struct vrpc_status st;
    int code;

    req.service = (char *)service;
    code = verbrpc__health__v1__health__check__call(ch, &req, &r, NULL, &st);
    return code == VRPC_OK ? (int)r->status : -code;
}

static struct vrpc_stream *watch(struct vrpc_channel *ch, const char *service)
{
    Verbrpc__Health__V1__HealthCheckRequest req = VERBRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    struct vrpc_stream *s = NULL;

    req.service = (char *)service;
    assert_int_equal(verbrpc__health__v1__health__watch__start(ch, &req, NULL, &s), 0);
    return s;
}

static void end_watch(struct vrpc_stream *s)
{
    struct vrpc_status st;

    vrpc_stream_cancel(s);
    assert_int_equal(verbrpc__health__v1__health__watch__finish(s, &st), VRPC_CANCELLED);
    vrpc_stream_destroy(s);
}

static void test_health_watch(void **state)
{
    struct vrpc_stream *all, *ticker, *other;

    (void)state;
    all = watch(g.ch, "");
    ticker = watch(g.ch, "cg.stream.v1.Ticker");
    other = watch(g.ch, "cg.stream.v1.Later");
    /* the current status at once */
    assert_int_equal(watch_next(all), VRPC_HEALTH_SERVING);
    assert_int_equal(watch_next(ticker), VRPC_HEALTH_SERVING); /* it has methods */
    assert_int_equal(watch_next(other), VRPC_HEALTH_SERVICE_UNKNOWN);
    assert_int_equal(check_status(g.ch, "cg.stream.v1.Later"), -VRPC_NOT_FOUND);

    /* then each change, to the watchers of that service only */
    assert_int_equal(vrpc_server_set_serving_status(g.server, "", VRPC_HEALTH_NOT_SERVING), 0);
    assert_int_equal(watch_next(all), VRPC_HEALTH_NOT_SERVING);
    assert_int_equal(check_status(g.ch, ""), VRPC_HEALTH_NOT_SERVING);
    assert_int_equal(vrpc_server_set_serving_status(g.server, "cg.stream.v1.Later", VRPC_HEALTH_SERVING), 0);
    assert_int_equal(watch_next(other), VRPC_HEALTH_SERVING);
    assert_int_equal(check_status(g.ch, "cg.stream.v1.Later"), VRPC_HEALTH_SERVING);
    assert_int_equal(vrpc_server_set_serving_status(g.server, "cg.stream.v1.Ticker", VRPC_HEALTH_NOT_SERVING), 0);
    assert_int_equal(watch_next(ticker), VRPC_HEALTH_NOT_SERVING);
    /* the same status again is no change */
    assert_int_equal(vrpc_server_set_serving_status(g.server, "cg.stream.v1.Ticker", VRPC_HEALTH_NOT_SERVING), 0);
    assert_int_equal(vrpc_server_set_serving_status(g.server, "cg.stream.v1.Ticker", VRPC_HEALTH_SERVING), 0);
    assert_int_equal(watch_next(ticker), VRPC_HEALTH_SERVING);
    assert_int_equal(vrpc_server_set_serving_status(g.server, "", VRPC_HEALTH_SERVING), 0);
    assert_int_equal(watch_next(all), VRPC_HEALTH_SERVING);
    end_watch(all);
    end_watch(ticker);
    end_watch(other);

    /* bad arguments */
    assert_int_equal(vrpc_server_set_serving_status(NULL, "", VRPC_HEALTH_SERVING), -EINVAL);
    assert_int_equal(vrpc_server_set_serving_status(g.server, NULL, VRPC_HEALTH_SERVING), -EINVAL);
    assert_int_equal(vrpc_server_set_serving_status(g.server, "", VRPC_HEALTH_SERVICE_UNKNOWN), -EINVAL);
    assert_int_equal(vrpc_server_set_serving_status(g.server, "", (enum vrpc_serving_status)77), -EINVAL);
}

/* A slow watcher gets the latest status, not a queue of every step. */
static void test_health_watch_coalesces(void **state)
{
    struct vrpc_stream *s;
    int last = 0;

    (void)state;
    s = watch(g.ch, "cg.stream.v1.Flappy");
    assert_int_equal(watch_next(s), VRPC_HEALTH_SERVICE_UNKNOWN);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(vrpc_server_set_serving_status(g.server, "cg.stream.v1.Flappy",
                                                        i % 2 ? VRPC_HEALTH_SERVING : VRPC_HEALTH_NOT_SERVING),
                         0);
    /* the last one set (i = 999: SERVING) arrives, after at most 999 others */
    for (int n = 0; n < 1000 && last != VRPC_HEALTH_SERVING; n++) {
        last = watch_next(s);
        assert_true(last == VRPC_HEALTH_SERVING || last == VRPC_HEALTH_NOT_SERVING);
    }
    assert_int_equal(last, VRPC_HEALTH_SERVING);
    end_watch(s);
}

/* While the server drains: NOT_SERVING to the watchers, then their end, so
 * that the drain completes; no status can be set any more. on_poller: the
 * built-in Watch runs on the server's poller (vrpc_server_run_on_poller: its
 * request's on_read and the first status written from there). */
static void health_drain(bool on_poller)
{
    struct vrpc_server *srv = NULL;
    struct vrpc_channel *ch = NULL;
    struct vrpc_channel_opts co;
    struct vrpc_stream *s;
    struct vrpc_status st;
    char uri[256];

    assert_int_equal(vrpc_server_create(NULL, &srv), 0);
    if (on_poller)
        assert_int_equal(vrpc_server_run_on_poller(srv, verbrpc__health__v1__health__watch__method.full_name), 0);
    assert_int_equal(vrpc_server_start(srv, g.listen), 0);
    assert_int_equal(vrpc_server_uri(srv, uri, sizeof(uri)), 0);
    vrpc_channel_opts_init(&co);
    co.src_addr = g.src;
    assert_int_equal(vrpc_channel_create(uri, &co, &ch), 0);
    s = watch(ch, "");
    assert_int_equal(watch_next(s), VRPC_HEALTH_SERVING);
    assert_int_equal(vrpc_server_shutdown(srv, 30000), 0); /* drained: the watch did not hold it */
    assert_int_equal(watch_next(s), VRPC_HEALTH_NOT_SERVING);
    assert_int_equal(watch_next(s), -ENODATA);
    assert_int_equal(verbrpc__health__v1__health__watch__finish(s, &st), VRPC_UNAVAILABLE);
    vrpc_stream_destroy(s);
    assert_int_equal(vrpc_server_set_serving_status(srv, "", VRPC_HEALTH_SERVING), -ESHUTDOWN);
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(srv);
}

static void test_health_drain(void **state)
{
    (void)state;
    health_drain(false);
}

static void test_health_drain_watch_on_poller(void **state)
{
    (void)state;
    health_drain(true);
}

int main(int argc, char **argv)
{
    const char *backend = "tcp", *setup_name = "single", *ip = "127.0.0.1";
    struct vrpc_channel_opts co;
    int rc;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            backend = argv[++i];
        } else if (!strcmp(argv[i], "--setup") && i + 1 < argc) {
            setup_name = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--backend tcp|verbs] [--setup single|veth]\n", argv[0]);
            return 2;
        }
    }
    if (!strcmp(backend, "verbs")) {
        struct vrpc_transport *tp;

        rc = vrpc_test_verbs_addrs(setup_name, &ip, &g.src);
        if (rc)
            return rc == -ENOENT ? 77 : 2;
        rc = vrpc_transport_create("verbs", NULL, &tp);
        if (rc != 0) {
            printf("SKIP: the verbs backend is unavailable here: %s\n", strerror(-rc));
            return 77;
        }
        vrpc_transport_destroy(tp);
    } else if (strcmp(backend, "tcp") != 0) {
        fprintf(stderr, "%s: unknown backend %s\n", argv[0], backend);
        return 2;
    }
    snprintf(g.listen, sizeof(g.listen), "%s://%s:0", backend, ip);

    rc = vrpc_server_create(NULL, &g.server);
    if (rc == 0)
        rc = cg__stream__v1__ticker__vrpc_register(g.server, &ticker_impl);
    if (rc == 0)
        rc = vrpc_server_start(g.server, g.listen);
    if (rc == 0)
        rc = vrpc_server_uri(g.server, g.uri, sizeof(g.uri));
    vrpc_channel_opts_init(&co);
    co.src_addr = g.src;
    if (rc == 0)
        rc = vrpc_channel_create(g.uri, &co, &g.ch);
    if (rc != 0) {
        fprintf(stderr, "%s: cannot set up a server on %s: %s\n", argv[0], g.listen, strerror(-rc));
        vrpc_server_destroy(g.server);
        return 1;
    }
    printf("generated stream stubs over %s (setup %s)\n", g.uri, setup_name);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptors_and_unary),
        cmocka_unit_test(test_server_streaming_sync),
        cmocka_unit_test(test_server_streaming_async),
        cmocka_unit_test(test_client_streaming_sync),
        cmocka_unit_test(test_client_streaming_async),
        cmocka_unit_test(test_bidi_sync),
        cmocka_unit_test(test_bidi_async),
        cmocka_unit_test(test_health_watch),
        cmocka_unit_test(test_health_watch_coalesces),
        cmocka_unit_test(test_health_drain),
        cmocka_unit_test(test_health_drain_watch_on_poller),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    vrpc_channel_destroy(g.ch);
    vrpc_server_destroy(g.server);
    vrpc_thread_release();
    return rc;
}
