/* End-to-end tests of the RPC core over a real transport (--backend
 * tcp|verbs): concurrent calls on one channel, deadlines, cancellation races,
 * server drain, connection loss and reconnect, every kind of bad input (from
 * raw-frame clients and a raw-frame server), and no malloc in steady state.
 * VRPC_TEST_SCALE=N divides the round counts (set under sanitizers). */
#define _GNU_SOURCE /* pthread_setaffinity_np, CPU_* */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "verbs_setup.h"
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>
#include "rpc/wire.h"
#include "raw_peer.h"
#include "rpc_test.pb-c.h"

/* ---- allocation counting (not under sanitizers, which own malloc) -------- */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define COUNT_MALLOC 1
#include <execinfo.h>
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
static int g_count_on;
static unsigned long g_allocs;
/* The first few allocations counted keep their call stack, to name the culprit. */
static void *g_where[4][8];
static int g_where_n[4];
static void counted(void)
{
    if (__atomic_load_n(&g_count_on, __ATOMIC_RELAXED)) {
        unsigned long k = __atomic_fetch_add(&g_allocs, 1, __ATOMIC_RELAXED);
        if (k < 4)
            g_where_n[k] = backtrace(g_where[k], 8);
    }
}
void *malloc(size_t n)
{
    counted();
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    counted();
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    counted();
    return __libc_realloc(p, n);
}
void *aligned_alloc(size_t al, size_t n)
{
    counted();
    return __libc_memalign(al, n);
}
int posix_memalign(void **out, size_t al, size_t n)
{
    counted();
    void *p = __libc_memalign(al, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}
#endif

static struct {
    const char *backend, *setup;
    const char *server_ip, *client_ip;
    unsigned scale;
} g_opt;

/* ---- methods -------------------------------------------------------------- */

#define M(name, in, out)                                                                                               \
    {                                                                                                                  \
        "/vrpctest.Test/" name, 0, &vrpctest__##in##__descriptor, &vrpctest__##out##__descriptor, NULL,                \
            VRPC_METHOD_UNARY                                                                                          \
    }
static struct vrpc_method_desc m_echo = M("Echo", echo_request, echo_reply);
static struct vrpc_method_desc m_nest = M("Nest", node, echo_reply);
static struct vrpc_method_desc m_missing = M("Missing", echo_request, echo_reply);

enum mode {
    MODE_ECHO = 0,         /* answer at once */
    MODE_DEFERRED = 1,     /* answer from the deferral thread after sleep_ms */
    MODE_METADATA = 2,     /* answer with the value of metadata "x-echo" */
    MODE_WRONG_TYPE = 3,   /* answer with the wrong message type */
    MODE_FAIL = 4,         /* fail NOT_FOUND */
    MODE_WAIT_CANCEL = 5,  /* deferral thread waits until the call is cancelled */
    MODE_DEADLINE = 6,     /* answer with the remaining deadline in seq (us) */
    MODE_LATE = 7,         /* as DEFERRED, and record what the late answer saw (g_late) */
    MODE_NEVER = 8,        /* keep the call in g_never and do not answer */
    MODE_THREAD = 9,       /* answer with the name of the thread the handler runs on */
    MODE_SYNC_INSIDE = 10, /* make a synchronous call (g_inner) and answer its code in seq */
};

static struct vrpc_channel *g_inner; /* MODE_SYNC_INSIDE's channel */

static unsigned g_handler_runs;
static unsigned g_saw_cancel;

/* What a MODE_LATE answer saw: the call's cancelled flag just before it
 * answered, and what respond returned. */
static struct {
    unsigned done; /* atomic: answers given */
    bool cancelled;
    int rc;
} g_late;

/* Calls a MODE_NEVER handler kept. */
static struct {
    struct vrpc_server_call *call[4];
    unsigned n; /* atomic */
} g_never;

static int echo_answer(struct vrpc_server_call *call, const Vrpctest__EchoRequest *r)
{
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.payload = r->payload;
    rep.seq = r->seq;
    return vrpc_server_call_respond(call, &rep.base);
}

/* The deferral thread: answers calls later, from a thread that is not a worker. */
struct deferred {
    struct vrpc_server_call *call;
    Vrpctest__EchoRequest *req;
    int64_t due;
    enum mode mode;
};
#define DEFER_MAX 4096
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct deferred q[DEFER_MAX];
    unsigned n;
    bool stop;
    pthread_t thread;
} g_defer = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *defer_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_defer.lock);
    while (!g_defer.stop || g_defer.n) {
        int64_t now = vrpc_now_ns();
        bool did = false;
        for (unsigned i = 0; i < g_defer.n; i++) {
            struct deferred d = g_defer.q[i];
            bool ready =
                d.mode == MODE_WAIT_CANCEL ? (vrpc_server_call_is_cancelled(d.call) || now >= d.due) : now >= d.due;
            if (!ready && !g_defer.stop)
                continue;
            g_defer.q[i] = g_defer.q[--g_defer.n];
            pthread_mutex_unlock(&g_defer.lock);
            if (d.mode == MODE_WAIT_CANCEL && vrpc_server_call_is_cancelled(d.call))
                __atomic_add_fetch(&g_saw_cancel, 1, __ATOMIC_RELAXED);
            if (d.mode == MODE_LATE) {
                g_late.cancelled = vrpc_server_call_is_cancelled(d.call);
                g_late.rc = echo_answer(d.call, d.req);
                __atomic_add_fetch(&g_late.done, 1, __ATOMIC_RELEASE);
            } else {
                echo_answer(d.call, d.req);
            }
            pthread_mutex_lock(&g_defer.lock);
            did = true;
            break;
        }
        if (!did) {
            pthread_mutex_unlock(&g_defer.lock);
            usleep(500);
            pthread_mutex_lock(&g_defer.lock);
        }
    }
    pthread_mutex_unlock(&g_defer.lock);
    return NULL;
}

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    __atomic_add_fetch(&g_handler_runs, 1, __ATOMIC_RELAXED);
    switch ((enum mode)r->mode) {
    case MODE_ECHO:
        echo_answer(call, r);
        return;
    case MODE_NEVER: {
        unsigned k = __atomic_load_n(&g_never.n, __ATOMIC_RELAXED);
        assert_true(k < 4);
        g_never.call[k] = call;
        __atomic_store_n(&g_never.n, k + 1, __ATOMIC_RELEASE);
        return;
    }
    case MODE_DEFERRED:
    case MODE_LATE:
    case MODE_WAIT_CANCEL: {
        pthread_mutex_lock(&g_defer.lock);
        assert_true(g_defer.n < DEFER_MAX);
        g_defer.q[g_defer.n++] = (struct deferred){call, (Vrpctest__EchoRequest *)r,
                                                   vrpc_now_ns() + (int64_t)r->sleep_ms * 1000000, (enum mode)r->mode};
        pthread_mutex_unlock(&g_defer.lock);
        return;
    }
    case MODE_METADATA: {
        const void *v;
        size_t len;
        Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
        if (vrpc_server_call_metadata_get(call, "x-echo", &v, &len) == 0) {
            rep.payload.data = (uint8_t *)v;
            rep.payload.len = len;
        }
        rep.seq = vrpc_server_call_metadata_count(call);
        vrpc_server_call_respond(call, &rep.base);
        return;
    }
    case MODE_WRONG_TYPE: {
        Vrpctest__Node n = VRPCTEST__NODE__INIT;
        assert_int_equal(vrpc_server_call_respond(call, &n.base), -EINVAL);
        return;
    }
    case MODE_FAIL:
        vrpc_server_call_fail(call, VRPC_NOT_FOUND, "no such thing");
        return;
    case MODE_SYNC_INSIDE: {
        Vrpctest__Node n = VRPCTEST__NODE__INIT;
        Vrpctest__EchoReply *in, rep = VRPCTEST__ECHO_REPLY__INIT;
        struct vrpc_status st;
        rep.seq = (uint64_t)vrpc_call(g_inner, &m_nest, &n.base, (ProtobufCMessage **)&in, NULL, &st);
        vrpc_server_call_respond(call, &rep.base);
        return;
    }
    case MODE_THREAD: {
        char name[16] = "";
        pthread_getname_np(pthread_self(), name, sizeof(name));
        Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
        rep.payload.data = (uint8_t *)name;
        rep.payload.len = strlen(name);
        rep.seq = r->seq;
        vrpc_server_call_respond(call, &rep.base);
        return;
    }
    case MODE_DEADLINE: {
        Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
        int64_t d = vrpc_server_call_deadline(call);
        rep.seq = d == VRPC_NO_DEADLINE ? 0 : (uint64_t)((d - vrpc_now_ns()) / 1000);
        vrpc_server_call_respond(call, &rep.base);
        return;
    }
    }
    vrpc_server_call_fail(call, VRPC_INVALID_ARGUMENT, "bad mode");
}

static void h_nest(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)msg;
    (void)user;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    vrpc_server_call_respond(call, &rep.base);
}

/* ---- fixtures ----------------------------------------------------------------- */

#define SERVER_MAX_MSG 6000

static struct vrpc_server *g_srv;
static char g_uri[VRPC_URI_MAX];

static char *listen_uri(char *buf, size_t len, unsigned port)
{
    const char *ip = g_opt.server_ip;
    snprintf(buf, len, "%s://%s%s%s:%u", g_opt.backend, strchr(ip, ':') ? "[" : "", ip, strchr(ip, ':') ? "]" : "",
             port);
    return buf;
}

static struct vrpc_server *start_server(const char *uri, uint32_t max_concurrent)
{
    struct vrpc_server_opts o;
    struct vrpc_server *s;
    vrpc_server_opts_init(&o);
    o.max_msg_size = SERVER_MAX_MSG;
    o.max_concurrent = max_concurrent;
    o.max_depth = 32;
    assert_int_equal(vrpc_server_create(&o, &s), 0);
    assert_int_equal(vrpc_server_register(s, &m_echo, h_echo, NULL), 0);
    assert_int_equal(vrpc_server_register(s, &m_echo, h_echo, NULL), -EEXIST);
    assert_int_equal(vrpc_server_register(s, &m_nest, h_nest, NULL), 0);
    struct vrpc_method_desc bad = m_echo;
    bad.id ^= 1;
    assert_int_equal(vrpc_server_register(s, &bad, h_echo, NULL), -EINVAL);
    assert_int_equal(vrpc_server_start(s, uri), 0);
    assert_int_equal(vrpc_server_register(s, &m_missing, h_echo, NULL), -EBUSY);
    return s;
}

/* connect: wait until READY. */
static struct vrpc_channel *new_channel(const char *uri, uint32_t max_outstanding, bool connect)
{
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&o);
    o.max_outstanding = max_outstanding;
    o.src_addr = g_opt.client_ip;
    o.backoff_initial_ms = 500; /* long enough that "fails fast during back-off"
                                   holds on a loaded machine */
    o.backoff_max_ms = 1000;
    o.connect_timeout_ms = 3000;
    assert_int_equal(vrpc_channel_create(uri, &o, &ch), 0);
    if (connect)
        assert_int_equal(vrpc_channel_connect(ch, 10000), 0);
    return ch;
}

static int group_setup(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    m_echo.id = vrpc_method_id(m_echo.full_name);
    m_nest.id = vrpc_method_id(m_nest.full_name);
    m_missing.id = vrpc_method_id(m_missing.full_name);
    pthread_create(&g_defer.thread, NULL, defer_main, NULL);
    g_srv = start_server(listen_uri(uri, sizeof(uri), 0), 256);
    assert_int_equal(vrpc_server_uri(g_srv, g_uri, sizeof(g_uri)), 0);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    vrpc_server_destroy(g_srv);
    pthread_mutex_lock(&g_defer.lock);
    g_defer.stop = true;
    pthread_mutex_unlock(&g_defer.lock);
    pthread_join(g_defer.thread, NULL);
    return 0;
}

static int call_echo(struct vrpc_channel *ch, const void *data, size_t len, uint64_t seq, enum mode mode,
                     uint32_t sleep_ms, const struct vrpc_call_opts *o, Vrpctest__EchoReply **rep,
                     struct vrpc_status *st)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.payload.data = (uint8_t *)data;
    r.payload.len = len;
    r.seq = seq;
    r.mode = mode;
    r.sleep_ms = sleep_ms;
    return vrpc_call(ch, &m_echo, &r.base, (ProtobufCMessage **)rep, o, st);
}

/* ---- basic ---------------------------------------------------------------------- */

static void test_basic_calls(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_channel(g_uri, 64, false);
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;

    assert_int_equal(vrpc_channel_state(ch), VRPC_CHANNEL_IDLE);
    assert_int_equal(call_echo(ch, "hello", 5, 7, MODE_ECHO, 0, NULL, &rep, &st), VRPC_OK);
    assert_int_equal(vrpc_channel_state(ch), VRPC_CHANNEL_READY);
    assert_int_equal(rep->seq, 7);
    assert_int_equal(rep->payload.len, 5);
    assert_memory_equal(rep->payload.data, "hello", 5);

    struct vrpc_metadata md[2] = {{"x-echo", "meta!", 5}, {"x-other", "1", 1}};
    struct vrpc_call_opts o = {.md = md, .md_count = 2};
    assert_int_equal(call_echo(ch, NULL, 0, 0, MODE_METADATA, 0, &o, &rep, &st), VRPC_OK);
    assert_int_equal(rep->payload.len, 5);
    assert_memory_equal(rep->payload.data, "meta!", 5);
    assert_int_equal(rep->seq, 2);

    assert_int_equal(call_echo(ch, NULL, 0, 0, MODE_FAIL, 0, NULL, &rep, &st), VRPC_NOT_FOUND);
    assert_string_equal(st.message, "no such thing");
    assert_int_equal(call_echo(ch, NULL, 0, 0, MODE_WRONG_TYPE, 0, NULL, &rep, &st), VRPC_INTERNAL);

    /* the server sees the deadline as a budget from arrival */
    o = (struct vrpc_call_opts){.timeout_us = 5000000};
    assert_int_equal(call_echo(ch, NULL, 0, 0, MODE_DEADLINE, 0, &o, &rep, &st), VRPC_OK);
    assert_true(rep->seq > 4000000 && rep->seq <= 5000000);
    assert_int_equal(call_echo(ch, NULL, 0, 0, MODE_DEADLINE, 0, NULL, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, 0);

    /* unknown method: UNIMPLEMENTED */
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    assert_int_equal(vrpc_call(ch, &m_missing, &r.base, (ProtobufCMessage **)&rep, NULL, &st), VRPC_UNIMPLEMENTED);
    /* a request over the server's limit fails on the client already */
    static uint8_t big[SERVER_MAX_MSG + 10];
    assert_int_equal(call_echo(ch, big, sizeof(big), 0, MODE_ECHO, 0, NULL, &rep, &st), VRPC_RESOURCE_EXHAUSTED);
    /* bad metadata and bad arguments */
    struct vrpc_metadata badmd = {"Bad Key", "", 0};
    o = (struct vrpc_call_opts){.md = &badmd, .md_count = 1};
    assert_int_equal(call_echo(ch, NULL, 0, 0, MODE_ECHO, 0, &o, &rep, &st), VRPC_INVALID_ARGUMENT);
    Vrpctest__Node n = VRPCTEST__NODE__INIT;
    assert_int_equal(vrpc_call(ch, &m_echo, &n.base, (ProtobufCMessage **)&rep, NULL, &st), VRPC_INVALID_ARGUMENT);

    size_t nm = 0, ie = 0;
    struct vrpc_method_stats ms[8];
    assert_int_equal(vrpc_server_stats(g_srv, ms, 8, &nm), 0);
    /* the test's two methods and the built-ins: Health.Check, Health.Watch,
     * Stats.Get and Reflection's ListServices, FileContainingSymbol,
     * FileByFilename */
    assert_int_equal(nm, 8);
    while (ie < nm && ms[ie].method != &m_echo)
        ie++;
    assert_true(ie < nm);
    assert_true(ms[ie].calls >= 5);
    assert_true(ms[ie].by_code[VRPC_NOT_FOUND] >= 1);
    assert_true(ms[ie].latency_p50_us <= ms[ie].latency_p99_us);
    vrpc_channel_destroy(ch);
}

/* ---- 8 threads, 100,000 calls on one channel ------------------------------------ */

struct worker_arg {
    struct vrpc_channel *ch;
    unsigned id, calls;
    unsigned errors;
};

static void *caller_main(void *arg)
{
    struct worker_arg *w = arg;
    uint8_t buf[256];
    for (unsigned i = 0; i < w->calls; i++) {
        uint64_t seq = ((uint64_t)w->id << 32) | i;
        size_t len = (seq * 2654435761u) % sizeof(buf);
        for (size_t k = 0; k < len; k++)
            buf[k] = (uint8_t)(seq + k * 31);
        Vrpctest__EchoReply *rep;
        struct vrpc_status st;
        if (call_echo(w->ch, buf, len, seq, MODE_ECHO, 0, NULL, &rep, &st) != VRPC_OK || rep->seq != seq ||
            rep->payload.len != len || (len && memcmp(rep->payload.data, buf, len) != 0))
            w->errors++;
    }
    return NULL;
}

static void test_concurrent_calls(void **state)
{
    (void)state;
    enum { THREADS = 8 };
    unsigned total = 100000 / g_opt.scale;
    struct vrpc_channel *ch = new_channel(g_uri, 64, true);
    struct worker_arg w[THREADS];
    pthread_t t[THREADS];
    int64_t t0 = vrpc_now_ns();
    for (unsigned i = 0; i < THREADS; i++) {
        w[i] = (struct worker_arg){ch, i, total / THREADS, 0};
        pthread_create(&t[i], NULL, caller_main, &w[i]);
    }
    unsigned errors = 0;
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    printf("# %u calls from %d threads on one channel in %.2f s, %u mismatches\n", total, THREADS,
           (double)(vrpc_now_ns() - t0) / 1e9, errors);
    assert_int_equal(errors, 0);
    vrpc_channel_destroy(ch);
}

/* ---- async calls, many outstanding ---------------------------------------------- */

struct async_state {
    unsigned done, ok, bad;
    uint64_t seen_sum;
    struct vrpc_status last_bad;
};

static void async_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct async_state *a = arg;
    if (st->code == VRPC_OK && resp) {
        __atomic_add_fetch(&a->ok, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&a->seen_sum, ((const Vrpctest__EchoReply *)resp)->seq, __ATOMIC_RELAXED);
    } else {
        if (__atomic_add_fetch(&a->bad, 1, __ATOMIC_RELAXED) == 1)
            a->last_bad = *st;
    }
    __atomic_add_fetch(&a->done, 1, __ATOMIC_RELEASE);
}

static void test_async_calls(void **state)
{
    (void)state;
    unsigned n = 20000 / g_opt.scale;
    struct vrpc_channel *ch = new_channel(g_uri, 64, true);
    struct async_state a = {0};
    uint64_t sum = 0;
    unsigned pushed_back = 0;
    for (unsigned i = 0; i < n; i++) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        r.seq = i + 1;
        sum += i + 1;
        int rc;
        /* 64 slots and 64 queued: beyond that the channel pushes back */
        while ((rc = vrpc_call_async(ch, &m_echo, &r.base, NULL, async_cb, &a)) == -EAGAIN) {
            pushed_back++;
            usleep(100);
        }
        assert_int_equal(rc, 0);
    }
    printf("# %u async calls, pushed back %u times\n", n, pushed_back);
    while (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) < n)
        usleep(1000);
    assert_int_equal(a.ok, n);
    assert_int_equal(a.seen_sum, sum);
    assert_int_equal(vrpc_call_async(ch, &m_echo, NULL, NULL, async_cb, &a), -EINVAL);
    vrpc_channel_destroy(ch);
}

/* An async call never blocks: without a free slot it is queued (its deadline
 * running), beyond the queue it is refused with -EAGAIN at once. */
struct timed_cb {
    unsigned calls;
    int code;
    int64_t at;
    char msg[VRPC_STATUS_MSG_MAX];
};

static void timed_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct timed_cb *t = arg;
    (void)resp;
    t->code = st->code;
    t->at = vrpc_now_ns();
    snprintf(t->msg, sizeof(t->msg), "%s", st->message);
    __atomic_add_fetch(&t->calls, 1, __ATOMIC_RELEASE);
}

/* A channel to g_uri with max_outstanding slots and max_queued places to
 * wait for one, connected (READY). */
static struct vrpc_channel *new_queued_channel(uint32_t max_outstanding, uint32_t max_queued)
{
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&o);
    o.max_outstanding = max_outstanding;
    o.max_queued = max_queued;
    o.src_addr = g_opt.client_ip;
    assert_int_equal(vrpc_channel_create(g_uri, &o, &ch), 0);
    assert_int_equal(vrpc_channel_connect(ch, 10000), 0);
    return ch;
}

static void test_async_never_blocks(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_queued_channel(2, 2);

    static struct timed_cb t[5];
    memset(t, 0, sizeof(t));
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.mode = MODE_DEFERRED;
    r.sleep_ms = 600;
    struct vrpc_call_opts quick = {.timeout_us = 50000};
    uint64_t id = 99;
    struct vrpc_call_opts with_id = {.call_id = &id};
    int64_t t0 = vrpc_now_ns();
    /* two take the slots, one queues with a short deadline, one queues */
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, timed_cb, &t[0]), 0);
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, timed_cb, &t[1]), 0);
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, &quick, timed_cb, &t[2]), 0);
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, &with_id, timed_cb, &t[3]), 0);
    assert_true(id != 0 && id != 99); /* queued: it has an id all the same */
    /* the queue is full: refused at once, its callback never runs */
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, timed_cb, &t[4]), -EAGAIN);
    int64_t took = vrpc_now_ns() - t0;
    assert_true(took < 400000000); /* nothing waited for the 600 ms handlers */

    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 20000 && !__atomic_load_n(&t[k].calls, __ATOMIC_ACQUIRE); i++)
            usleep(1000);
    for (int k = 0; k < 4; k++)
        assert_int_equal(__atomic_load_n(&t[k].calls, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(t[0].code, VRPC_OK);
    assert_int_equal(t[1].code, VRPC_OK);
    /* the short deadline expired in the queue, before any slot came free */
    assert_int_equal(t[2].code, VRPC_DEADLINE_EXCEEDED);
    assert_non_null(strstr(t[2].msg, "slot"));
    assert_true(t[2].at < t[0].at && t[2].at < t[1].at);
    /* the other one went out when a slot freed */
    assert_int_equal(t[3].code, VRPC_OK);
    assert_true(t[3].at >= t[0].at || t[3].at >= t[1].at);
    assert_int_equal(t[4].calls, 0);

    /* queued calls still waiting at destroy complete once, CANCELLED */
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, timed_cb, &t[0]), 0);
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, timed_cb, &t[1]), 0);
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, timed_cb, &t[2]), 0);
    vrpc_channel_destroy(ch);
    assert_int_equal(t[0].calls, 2);
    assert_int_equal(t[2].calls, 2);
    assert_int_equal(t[2].code, VRPC_CANCELLED);
}

/* Wait (up to 30 s) until the server's handlers have started `target` calls
 * in all: a call is in flight at the server only once it has arrived, and on
 * an emulated RDMA link arrival can take far longer than on loopback TCP. */
static void wait_handler_runs(unsigned target)
{
    for (int i = 0; i < 30000 && __atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED) < target; i++)
        usleep(1000);
    assert_true(__atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED) >= target);
}

/* A call queued for lack of a slot has an id that cancels it: it completes
 * CANCELLED at once and is never sent; once sent, the same id still works. */
static void wait_calls(const struct timed_cb *t, unsigned n, int ms)
{
    for (int i = 0; i < ms && __atomic_load_n(&t->calls, __ATOMIC_ACQUIRE) < n; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&t->calls, __ATOMIC_ACQUIRE), n);
}

static void test_cancel_queued_call(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_queued_channel(1, 4);
    unsigned runs0 = __atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED);

    static struct timed_cb ta, tb, tc, td;
    memset(&ta, 0, sizeof(ta)), memset(&tb, 0, sizeof(tb)), memset(&tc, 0, sizeof(tc)), memset(&td, 0, sizeof(td));
    uint64_t idb = 0, idc = 0, idd = 0;
    struct vrpc_call_opts ob = {.call_id = &idb}, oc = {.call_id = &idc}, od = {.call_id = &idd};
    Vrpctest__EchoRequest slow = VRPCTEST__ECHO_REQUEST__INIT, held = VRPCTEST__ECHO_REQUEST__INIT,
                          quick = VRPCTEST__ECHO_REQUEST__INIT;
    slow.mode = MODE_DEFERRED;
    slow.sleep_ms = 1000;
    held.mode = MODE_WAIT_CANCEL;
    held.sleep_ms = 5000;
    /* A takes the only slot; B and C queue behind it */
    assert_int_equal(vrpc_call_async(ch, &m_echo, &slow.base, NULL, timed_cb, &ta), 0);
    assert_int_equal(vrpc_call_async(ch, &m_echo, &quick.base, &ob, timed_cb, &tb), 0);
    assert_int_equal(vrpc_call_async(ch, &m_echo, &held.base, &oc, timed_cb, &tc), 0);
    assert_true(idb != 0 && idc != 0 && idb != idc);

    /* B: cancelled while queued, completes at once (A still holds the slot) */
    assert_int_equal(vrpc_channel_cancel(ch, idb), 0);
    wait_calls(&tb, 1, 900);
    assert_int_equal(tb.code, VRPC_CANCELLED);
    assert_non_null(strstr(tb.msg, "never sent"));
    assert_int_equal(__atomic_load_n(&ta.calls, __ATOMIC_ACQUIRE), 0);
    assert_int_equal(vrpc_channel_cancel(ch, idb), -ENOENT);
    /* D may reuse B's queue entry: B's old id stays dead */
    assert_int_equal(vrpc_call_async(ch, &m_echo, &quick.base, &od, timed_cb, &td), 0);
    assert_true(idd != 0 && idd != idb);
    assert_int_equal(vrpc_channel_cancel(ch, idb), -ENOENT);

    /* A answers; C goes out on the freed slot and its queued-time id still
     * cancels it (the server's handler sees the cancel) */
    wait_calls(&ta, 1, 30000);
    assert_int_equal(ta.code, VRPC_OK);
    wait_handler_runs(runs0 + 2);
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(vrpc_channel_cancel(ch, idc), 0);
    wait_calls(&tc, 1, 3000);
    assert_int_equal(tc.code, VRPC_CANCELLED);
    assert_true(tc.at - t0 < 3000000000);
    assert_int_equal(vrpc_channel_cancel(ch, idc), -ENOENT);
    /* D is sent once the server has answered C's cancel */
    wait_calls(&td, 1, 30000);
    assert_int_equal(td.code, VRPC_OK);
    assert_int_equal(vrpc_channel_cancel(ch, idd), -ENOENT);
    /* B never reached the server: A, C and D did */
    usleep(20000);
    assert_int_equal(__atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED), runs0 + 3);
    assert_int_equal(tb.calls, 1);
    vrpc_channel_destroy(ch);
}

/* ---- deadlines ---------------------------------------------------------------------- */

static void test_deadline_exceeded(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_channel(g_uri, 64, true);
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    struct vrpc_call_opts o = {.timeout_us = 30000};
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(call_echo(ch, "x", 1, 1, MODE_DEFERRED, 500, &o, &rep, &st), VRPC_DEADLINE_EXCEEDED);
    int64_t el = vrpc_now_ns() - t0;
    assert_true(el >= 30000000 && el < 2000000000); /* generous: the machine may be loaded */
    /* the channel still works, and the late answer was dropped quietly */
    o.timeout_us = 2000000;
    assert_int_equal(call_echo(ch, "y", 1, 2, MODE_ECHO, 0, &o, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, 2);
    /* async deadline */
    struct async_state a = {0};
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.mode = MODE_DEFERRED;
    r.sleep_ms = 500;
    o.timeout_us = 20000;
    assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, &o, async_cb, &a), 0);
    while (!__atomic_load_n(&a.done, __ATOMIC_ACQUIRE))
        usleep(1000);
    assert_int_equal(a.bad, 1);
    vrpc_channel_destroy(ch);
}

/* ---- cancellation ------------------------------------------------------------------- */

/* One async call's outcome, for call_rec_cb. A record used for exactly one
 * call also shows a second completion (someone else's callback run with our
 * arg) in calls. */
struct call_rec {
    unsigned calls; /* atomic */
    int code;
};

static void call_rec_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct call_rec *r = arg;
    (void)resp;
    r->code = st->code;
    __atomic_add_fetch(&r->calls, 1, __ATOMIC_RELEASE);
}

static void test_cancel_races_response(void **state)
{
    (void)state;
    unsigned rounds = 10000 / g_opt.scale, cancelled = 0, completed = 0;
    struct vrpc_channel *ch = new_channel(g_uri, 64, true);
    static struct call_rec r[10000];
    memset(r, 0, sizeof(r));
    for (unsigned i = 0; i < rounds; i++) {
        uint64_t id = 0;
        struct vrpc_call_opts o = {.call_id = &id};
        Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
        req.seq = i;
        assert_int_equal(vrpc_call_async(ch, &m_echo, &req.base, &o, call_rec_cb, &r[i]), 0);
        if (i % 3)
            usleep((i * 7) % 40); /* vary who wins */
        int rc = vrpc_channel_cancel(ch, __atomic_load_n(&id, __ATOMIC_ACQUIRE));
        while (!__atomic_load_n(&r[i].calls, __ATOMIC_ACQUIRE))
            ;
        assert_true(rc == 0 || rc == -ENOENT);
        assert_int_equal(r[i].code, rc == 0 ? VRPC_CANCELLED : VRPC_OK);
        rc == 0 ? cancelled++ : completed++;
    }
    usleep(20000);
    for (unsigned i = 0; i < rounds; i++)
        assert_int_equal(r[i].calls, 1); /* exactly one outcome each, never a second */
    printf("# %u rounds: %u cancelled first, %u answered first\n", rounds, cancelled, completed);
    assert_int_equal(vrpc_channel_cancel(ch, 12345), -ENOENT);
    vrpc_channel_destroy(ch);
}

struct sync_cancel {
    struct vrpc_channel *ch;
    uint64_t id;
    int code;
    int64_t took;
};

static void *sync_cancel_main(void *arg)
{
    struct sync_cancel *sc = arg;
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    struct vrpc_call_opts o = {.call_id = &sc->id};
    int64_t t0 = vrpc_now_ns();
    sc->code = call_echo(sc->ch, NULL, 0, 0, MODE_WAIT_CANCEL, 5000, &o, &rep, &st);
    sc->took = vrpc_now_ns() - t0;
    return NULL;
}

static void test_cancel_reaches_server(void **state)
{
    (void)state;
    struct sync_cancel sc = {.ch = new_channel(g_uri, 64, true)};
    unsigned before = __atomic_load_n(&g_saw_cancel, __ATOMIC_RELAXED);
    unsigned runs0 = __atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED);
    pthread_t t;
    pthread_create(&t, NULL, sync_cancel_main, &sc);
    while (!__atomic_load_n(&sc.id, __ATOMIC_ACQUIRE))
        usleep(100);
    /* cancel once the handler runs: a cancel that arrives before it starts
     * answers CANCELLED without running it (slow under sanitizers) */
    for (int i = 0; i < 30000 && __atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED) == runs0; i++)
        usleep(1000);
    usleep(5000);
    assert_int_equal(vrpc_channel_cancel(sc.ch, sc.id), 0);
    pthread_join(t, NULL);
    assert_int_equal(sc.code, VRPC_CANCELLED);
    assert_true(sc.took < 4000000000); /* the handler would have waited 5 s */
    /* the server handler observes the cancel and answers; then the slot frees */
    for (int i = 0; i < 2000 && __atomic_load_n(&g_saw_cancel, __ATOMIC_RELAXED) == before; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&g_saw_cancel, __ATOMIC_RELAXED), before + 1);
    vrpc_channel_destroy(sc.ch);
}

/* ---- drain, connection loss, reconnect, back-off ---------------------------------- */

static unsigned uri_port(const char *uri)
{
    const char *p = strrchr(uri, ':');
    return p ? (unsigned)atoi(p + 1) : 0;
}

static void test_server_drain(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX], bound[VRPC_URI_MAX];
    struct vrpc_server *s = start_server(listen_uri(uri, sizeof(uri), 0), 64);
    assert_int_equal(vrpc_server_uri(s, bound, sizeof(bound)), 0);
    struct vrpc_channel *ch = new_channel(bound, 64, true);
    struct async_state a = {0};
    enum { N = 20 };
    unsigned runs0 = __atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < N; i++) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        r.mode = MODE_DEFERRED;
        r.sleep_ms = 100;
        r.seq = 1;
        assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, async_cb, &a), 0);
    }
    wait_handler_runs(runs0 + N); /* in flight = the server has them */
    assert_int_equal(vrpc_server_shutdown(s, 5000), 0);
    assert_int_equal(vrpc_server_shutdown(s, 5000), 0); /* idempotent */
    while (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) < N)
        usleep(1000);
    if (a.ok != N)
        fail_msg("%u of %d calls failed, first with %s: %s", a.bad, N, vrpc_code_name(a.last_bad.code),
                 a.last_bad.message);
    /* new calls find no server */
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    assert_int_equal(call_echo(ch, NULL, 0, 0, MODE_ECHO, 0, NULL, &rep, &st), VRPC_UNAVAILABLE);
    vrpc_server_destroy(s);
    vrpc_channel_destroy(ch);

    /* drain with a timeout shorter than the handlers: -ETIMEDOUT, calls fail UNAVAILABLE */
    s = start_server(listen_uri(uri, sizeof(uri), 0), 64);
    assert_int_equal(vrpc_server_uri(s, bound, sizeof(bound)), 0);
    ch = new_channel(bound, 64, true);
    memset(&a, 0, sizeof(a));
    runs0 = __atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < N; i++) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        r.mode = MODE_DEFERRED;
        r.sleep_ms = 400;
        assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, async_cb, &a), 0);
    }
    wait_handler_runs(runs0 + N);
    assert_int_equal(vrpc_server_shutdown(s, 50), -ETIMEDOUT);
    while (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) < N)
        usleep(1000);
    assert_int_equal(a.bad, N);
    vrpc_server_destroy(s); /* the deferred handlers' late answers are refused */
    vrpc_channel_destroy(ch);
}

/* A deadline that passes while the handler runs: the server answers
 * DEADLINE_EXCEEDED itself (so the client's slot and credit come back at
 * once), the handler sees the call cancelled, and its late answer is dropped
 * with -ETIMEDOUT. */
/* A MODE_LATE call the server answered for (its deadline passed): the
 * handler's late answer comes (the late0 + 1st), saw the call cancelled and
 * was refused; then the slot serves a new call with sequence number seq. */
static void late_answer_refused(struct vrpc_channel *ch, unsigned late0, uint64_t seq)
{
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    for (int i = 0; i < 10000 && __atomic_load_n(&g_late.done, __ATOMIC_ACQUIRE) == late0; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&g_late.done, __ATOMIC_ACQUIRE), late0 + 1);
    assert_true(g_late.cancelled);
    assert_int_equal(g_late.rc, -ETIMEDOUT);
    assert_int_equal(call_echo(ch, "z", 1, seq, MODE_ECHO, 0, NULL, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, seq);
}

static void test_server_deadline_while_handler_runs(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_channel(g_uri, 1, true); /* one slot: the next call needs it back */
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    struct method_count {
        uint64_t deadline;
    } before = {0}, after = {0};
    struct vrpc_method_stats ms[8];
    size_t nm;
    assert_int_equal(vrpc_server_stats(g_srv, ms, 8, &nm), 0);
    for (size_t i = 0; i < nm && i < 8; i++)
        if (ms[i].method == &m_echo)
            before.deadline = ms[i].by_code[VRPC_DEADLINE_EXCEEDED];
    unsigned late0 = __atomic_load_n(&g_late.done, __ATOMIC_ACQUIRE);

    /* long enough that the handler has started when it passes, also on a
     * loaded machine (else the call is answered without running it) */
    struct vrpc_call_opts o = {.timeout_us = 500000};
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(call_echo(ch, "x", 1, 1, MODE_LATE, 3000, &o, &rep, &st), VRPC_DEADLINE_EXCEEDED);
    /* the only slot is free again long before the handler answers (3 s) */
    assert_int_equal(call_echo(ch, "y", 1, 2, MODE_ECHO, 0, NULL, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, 2);
    assert_true(vrpc_now_ns() - t0 < 2500000000); /* generous: the machine may be loaded */
    assert_int_equal(__atomic_load_n(&g_late.done, __ATOMIC_ACQUIRE), late0);

    assert_int_equal(vrpc_server_stats(g_srv, ms, 8, &nm), 0);
    for (size_t i = 0; i < nm && i < 8; i++)
        if (ms[i].method == &m_echo)
            after.deadline = ms[i].by_code[VRPC_DEADLINE_EXCEEDED];
    assert_int_equal(after.deadline, before.deadline + 1);

    /* the handler's late answer: it saw the call cancelled, respond refused;
     * and the slot's new call object serves on */
    late_answer_refused(ch, late0, 3);
    vrpc_channel_destroy(ch);
}

/* ---- handlers on the poller (vrpc_server_run_on_poller) ------------------------- */

/* The thread a call's handler ran on, by name. */
static void handler_thread(struct vrpc_channel *ch, size_t payload, char *name, size_t len)
{
    static uint8_t big[96 * 1024];
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    assert_true(payload <= sizeof(big));
    assert_int_equal(call_echo(ch, big, payload, 5, MODE_THREAD, 0, NULL, &rep, &st), VRPC_OK);
    assert_true(rep->payload.len < len);
    memcpy(name, rep->payload.data, rep->payload.len);
    name[rep->payload.len] = 0;
}

/* A method run on the poller: its handler runs on the server's poller
 * thread (a worker's otherwise, and for a request that arrives by
 * rendezvous); calls from many threads all come back right; a handler that
 * keeps the call and answers later from another thread gets its deadline
 * enforced (armed when the handler returned) and its answer through; the
 * registration's errors. */
static void test_handlers_on_poller(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX], bound[VRPC_URI_MAX], name[16];
    struct vrpc_server_opts so;
    struct vrpc_server *s;
    vrpc_server_opts_init(&so);
    so.max_msg_size = 256 * 1024; /* large requests come by rendezvous */
    assert_int_equal(vrpc_server_create(&so, &s), 0);
    assert_int_equal(vrpc_server_register(s, &m_echo, h_echo, NULL), 0);
    assert_int_equal(vrpc_server_run_on_poller(NULL, m_echo.full_name), -EINVAL);
    assert_int_equal(vrpc_server_run_on_poller(s, NULL), -EINVAL);
    assert_int_equal(vrpc_server_run_on_poller(s, m_missing.full_name), -ENOENT);
    /* streams too (their on_read and small writes): the built-in Health/Watch */
    assert_int_equal(vrpc_server_run_on_poller(s, "/verbrpc.health.v1.Health/Watch"), 0);
    assert_int_equal(vrpc_server_run_on_poller(s, m_echo.full_name), 0);
    assert_int_equal(vrpc_server_start(s, listen_uri(uri, sizeof(uri), 0)), 0);
    assert_int_equal(vrpc_server_run_on_poller(s, m_echo.full_name), -EBUSY);
    assert_int_equal(vrpc_server_uri(s, bound, sizeof(bound)), 0);

    struct vrpc_channel *ch = new_channel(bound, 64, true);
    handler_thread(ch, 16, name, sizeof(name));
    assert_string_equal(name, "vrpc-srv-poll");
    handler_thread(ch, 64 * 1024, name, sizeof(name)); /* rendezvous: a worker */
    assert_memory_equal(name, "vrpc-w", 6);
    struct vrpc_channel *plain = new_channel(g_uri, 4, true); /* the group's server: a worker */
    handler_thread(plain, 16, name, sizeof(name));
    assert_memory_equal(name, "vrpc-w", 6);
    vrpc_channel_destroy(plain);

    /* 8 threads share the channel; every reply is its own request's */
    enum { THREADS = 8 };
    struct worker_arg w[THREADS];
    pthread_t t[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        w[i] = (struct worker_arg){ch, i, 20000 / g_opt.scale / THREADS, 0};
        pthread_create(&t[i], NULL, caller_main, &w[i]);
    }
    unsigned errors = 0;
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    assert_int_equal(errors, 0);

    /* kept and answered later from another thread: the answer arrives */
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    /* a synchronous call from a handler on the poller is refused at once; on
     * a worker it goes through */
    g_inner = new_channel(g_uri, 4, true);
    assert_int_equal(call_echo(ch, NULL, 0, 10, MODE_SYNC_INSIDE, 0, NULL, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, VRPC_FAILED_PRECONDITION);
    plain = new_channel(g_uri, 4, true);
    assert_int_equal(call_echo(plain, NULL, 0, 10, MODE_SYNC_INSIDE, 0, NULL, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, VRPC_OK);
    vrpc_channel_destroy(plain);
    vrpc_channel_destroy(g_inner);
    assert_int_equal(call_echo(ch, "d", 1, 11, MODE_DEFERRED, 20, NULL, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, 11);
    /* kept past its deadline: DEADLINE_EXCEEDED from the server's timer,
     * long before the late answer, which then finds the call cancelled */
    unsigned late0 = __atomic_load_n(&g_late.done, __ATOMIC_ACQUIRE);
    struct vrpc_call_opts o = {.timeout_us = 200000};
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(call_echo(ch, "x", 1, 12, MODE_LATE, 1500, &o, &rep, &st), VRPC_DEADLINE_EXCEEDED);
    assert_true(vrpc_now_ns() - t0 < 1200000000);
    late_answer_refused(ch, late0, 13);
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(s);
}

/* Async callbacks on the channel's poller (VRPC_CALL_CB_ON_POLLER). */
struct onpoll {
    struct vrpc_channel *ch;
    unsigned left;  /* calls still to chain from the callback */
    unsigned done;  /* atomic: set when the chain ended */
    unsigned wrong; /* callbacks off the poller, bad replies */
    int sync_code;  /* what a synchronous call from the callback returned */
    char sync_msg[VRPC_STATUS_MSG_MAX];
    char name[16];             /* the last callback's thread */
    int code;                  /* the last callback's code */
    struct vrpc_channel *idle; /* not connected: a call on it from the poller */
    int idle_rc;
    unsigned idle_done; /* atomic */
    int idle_code;
    char idle_msg[VRPC_STATUS_MSG_MAX];
};

static void idle_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    (void)resp;
    struct onpoll *p = arg;
    p->idle_code = st->code;
    snprintf(p->idle_msg, sizeof(p->idle_msg), "%s", st->message);
    __atomic_store_n(&p->idle_done, 1, __ATOMIC_RELEASE);
}

static void onpoll_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct onpoll *p = arg;
    pthread_getname_np(pthread_self(), p->name, sizeof(p->name));
    p->code = st->code;
    if (st->code != VRPC_OK || !resp || ((const Vrpctest__EchoReply *)resp)->seq != p->left ||
        strcmp(p->name, "vrpc-ch-poll"))
        p->wrong++;
    if (p->sync_code < 0) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        Vrpctest__EchoReply *rep;
        struct vrpc_status s2;
        p->sync_code = vrpc_call(p->ch, &m_echo, &r.base, (ProtobufCMessage **)&rep, NULL, &s2);
        snprintf(p->sync_msg, sizeof(p->sync_msg), "%s", s2.message);
        p->idle_rc = vrpc_call_async(p->idle, &m_echo, &r.base, NULL, idle_cb, p);
    }
    if (st->code == VRPC_OK && p->left > 0) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        struct vrpc_call_opts o = {.flags = VRPC_CALL_CB_ON_POLLER};
        r.seq = --p->left;
        if (vrpc_call_async(p->ch, &m_echo, &r.base, &o, onpoll_cb, p) == 0)
            return;
        p->wrong++;
    }
    __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
}

static void onpoll_wait(struct onpoll *p)
{
    for (int i = 0; i < 20000 && !__atomic_load_n(&p->done, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&p->done, __ATOMIC_ACQUIRE), 1);
}

/* A chain of calls, each started from the previous one's callback, all run
 * on the channel's poller; a synchronous call from there fails
 * FAILED_PRECONDITION at once (naming the reason); a callback whose outcome
 * the deadline decided runs on a worker; without the flag, on a worker. */
static void test_callbacks_on_poller(void **state)
{
    (void)state;
    struct onpoll p = {.left = 2000 / g_opt.scale, .sync_code = -1, .idle_rc = 1};
    p.ch = new_channel(g_uri, 4, true);
    p.idle = new_channel(g_uri, 4, false);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    struct vrpc_call_opts o = {.flags = VRPC_CALL_CB_ON_POLLER};
    r.seq = p.left;
    assert_int_equal(vrpc_call_async(p.ch, &m_echo, &r.base, &o, onpoll_cb, &p), 0);
    onpoll_wait(&p);
    assert_int_equal(p.wrong, 0);
    assert_int_equal(p.left, 0);
    assert_int_equal(p.sync_code, VRPC_FAILED_PRECONDITION);
    assert_non_null(strstr(p.sync_msg, "poller"));
    /* an async call from the poller on a channel with no connection fails
     * UNAVAILABLE at once rather than connect there */
    assert_int_equal(p.idle_rc, 0);
    for (int i = 0; i < 5000 && !__atomic_load_n(&p.idle_done, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&p.idle_done, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(p.idle_code, VRPC_UNAVAILABLE);
    assert_non_null(strstr(p.idle_msg, "poller"));
    vrpc_channel_destroy(p.idle);

    /* decided by the deadline (the timer's thread): on a worker */
    struct onpoll q = {.sync_code = 0};
    struct vrpc_call_opts od = {.flags = VRPC_CALL_CB_ON_POLLER, .timeout_us = 50000};
    r.mode = MODE_DEFERRED;
    r.sleep_ms = 400;
    assert_int_equal(vrpc_call_async(p.ch, &m_echo, &r.base, &od, onpoll_cb, &q), 0);
    onpoll_wait(&q);
    assert_int_equal(q.code, VRPC_DEADLINE_EXCEEDED);
    assert_memory_equal(q.name, "vrpc-w", 6);
    /* no flag: a worker */
    struct onpoll w = {.sync_code = 0};
    r.mode = MODE_ECHO;
    r.seq = 0;
    assert_int_equal(vrpc_call_async(p.ch, &m_echo, &r.base, NULL, onpoll_cb, &w), 0);
    onpoll_wait(&w);
    assert_int_equal(w.code, VRPC_OK);
    assert_memory_equal(w.name, "vrpc-w", 6);
    usleep(500000); /* the deferred answer of the expired call comes and goes */
    vrpc_channel_destroy(p.ch);
}

/* A handler that never answers does not hold up the server's destruction:
 * its call fails UNAVAILABLE on the client, and answering it after the
 * server is gone returns -ECONNRESET without touching freed memory (ASan). */
static void test_destroy_with_unanswered_call(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX], bound[VRPC_URI_MAX];
    struct vrpc_server *s = start_server(listen_uri(uri, sizeof(uri), 0), 64);
    assert_int_equal(vrpc_server_uri(s, bound, sizeof(bound)), 0);
    struct vrpc_channel *ch = new_channel(bound, 64, true);
    struct call_rec r = {0};
    Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
    req.mode = MODE_NEVER;
    req.payload.data = (uint8_t *)"kept";
    req.payload.len = 4;
    memset(&g_never, 0, sizeof(g_never));
    assert_int_equal(vrpc_call_async(ch, &m_echo, &req.base, NULL, call_rec_cb, &r), 0);
    for (int i = 0; i < 30000 && !__atomic_load_n(&g_never.n, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&g_never.n, __ATOMIC_ACQUIRE), 1);
    struct vrpc_server_call *kept = g_never.call[0];
    assert_false(vrpc_server_call_is_cancelled(kept));

    int64_t t0 = vrpc_now_ns();
    assert_int_equal(vrpc_server_shutdown(s, 100), -ETIMEDOUT); /* graceful: waits its timeout */
    vrpc_server_destroy(s);
    assert_true(vrpc_now_ns() - t0 < 10000000000); /* it used to wait forever */
    for (int i = 0; i < 10000 && !__atomic_load_n(&r.calls, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.code, VRPC_UNAVAILABLE);

    /* the handler still holds its call and request; answering now is refused */
    assert_true(vrpc_server_call_is_cancelled(kept));
    assert_int_equal(vrpc_server_call_metadata_count(kept), 0);
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.payload.data = (uint8_t *)"late";
    rep.payload.len = 4;
    assert_int_equal(vrpc_server_call_respond(kept, &rep.base), -ECONNRESET);
    vrpc_channel_destroy(ch);
}

static void test_connection_loss_and_reconnect(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX], bound[VRPC_URI_MAX];
    struct vrpc_server *s = start_server(listen_uri(uri, sizeof(uri), 0), 64);
    assert_int_equal(vrpc_server_uri(s, bound, sizeof(bound)), 0);
    unsigned port = uri_port(bound);
    struct vrpc_channel *ch = new_channel(bound, 64, true);
    static struct call_rec r[16];
    memset(r, 0, sizeof(r));
    for (unsigned i = 0; i < 16; i++) {
        Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
        req.mode = MODE_DEFERRED;
        req.sleep_ms = 300;
        assert_int_equal(vrpc_call_async(ch, &m_echo, &req.base, NULL, call_rec_cb, &r[i]), 0);
    }
    usleep(30000);
    vrpc_server_shutdown(s, 0); /* closes the connection under the calls */
    for (unsigned i = 0; i < 16; i++) {
        while (!__atomic_load_n(&r[i].calls, __ATOMIC_ACQUIRE))
            usleep(1000);
    }
    usleep(400000); /* the deferred answers come and go: nothing more arrives */
    for (unsigned i = 0; i < 16; i++) {
        assert_int_equal(r[i].calls, 1);
        assert_int_equal(r[i].code, VRPC_UNAVAILABLE);
    }
    vrpc_server_destroy(s);
    /* IDLE if the GOAWAY arrived before the close, else TRANSIENT_FAILURE */
    assert_true(vrpc_channel_state(ch) == VRPC_CHANNEL_TRANSIENT_FAILURE ||
                vrpc_channel_state(ch) == VRPC_CHANNEL_IDLE);

    /* nobody listens: fails, then fails fast during back-off */
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    assert_int_equal(call_echo(ch, NULL, 0, 1, MODE_ECHO, 0, NULL, &rep, &st), VRPC_UNAVAILABLE);
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(call_echo(ch, NULL, 0, 1, MODE_ECHO, 0, NULL, &rep, &st), VRPC_UNAVAILABLE);
    assert_true(vrpc_now_ns() - t0 < 300000000);
    assert_non_null(strstr(st.message, "back-off"));
    assert_int_equal(vrpc_channel_state(ch), VRPC_CHANNEL_TRANSIENT_FAILURE);

    /* the server comes back on the same port: the channel reconnects */
    s = start_server(listen_uri(uri, sizeof(uri), port), 64);
    assert_int_equal(vrpc_channel_connect(ch, 3000), 0);
    assert_int_equal(vrpc_channel_state(ch), VRPC_CHANNEL_READY);
    assert_int_equal(call_echo(ch, "z", 1, 9, MODE_ECHO, 0, NULL, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, 9);
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(s);
}

/* ---- raw-frame peers ------------------------------------------------------------- */

static size_t frame(uint8_t *out, const struct vrpc_wire_hdr *h, const void *md, const void *payload)
{
    vrpc_wire_hdr_encode(out, h);
    if (h->md_len && md)
        memcpy(out + VRPC_WIRE_HDR_LEN, md, h->md_len);
    if (h->payload_len && payload)
        memcpy(out + VRPC_WIRE_HDR_LEN + h->md_len, payload, h->payload_len);
    return VRPC_WIRE_HDR_LEN + h->md_len + h->payload_len;
}

static void raw_hello(struct raw *r, struct vrpc_ep *ep, uint8_t type)
{
    uint8_t f[64], p[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello hs = {.max_msg_size = 4096, .max_concurrent = 8};
    vrpc_wire_hello_encode(p, &hs);
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = type, .payload_len = sizeof(p)};
    raw_send_bytes(r, ep, f, frame(f, &h, NULL, p));
}

/* Wait for the n-th received frame and decode it as a RESPONSE. */
static void raw_wait_response(struct raw *r, unsigned n, struct vrpc_wire_hdr *h)
{
    for (int i = 0; i < 5000 && __atomic_load_n(&r->nrecv, __ATOMIC_ACQUIRE) < n; i++)
        usleep(1000);
    pthread_mutex_lock(&r->lock);
    assert_int_equal(r->nrecv, n);
    assert_int_equal(vrpc_wire_hdr_decode(r->last, r->last_len, h), 0);
    pthread_mutex_unlock(&r->lock);
}

static void raw_expect_status(struct raw *r, unsigned *n, const struct vrpc_wire_hdr *req, const void *md,
                              const void *payload, enum vrpc_code code)
{
    uint8_t f[8192];
    struct vrpc_wire_hdr h;
    raw_send_bytes(r, r->ep, f, frame(f, req, md, payload));
    raw_wait_response(r, ++*n, &h);
    assert_int_equal(h.type, VRPC_FT_RESPONSE);
    assert_true(h.request_id == req->request_id);
    if (h.status != (uint32_t)code)
        fail_msg("expected %s, got %s", vrpc_code_name(code), vrpc_code_name((enum vrpc_code)h.status));
}

static void test_bad_requests_get_status(void **state)
{
    (void)state;
    struct raw r;
    unsigned n = 0;
    struct vrpc_wire_hdr h;
    raw_open(&r, g_opt.backend);
    raw_connect(&r, g_uri, g_opt.client_ip);
    raw_hello(&r, r.ep, VRPC_FT_HELLO);
    raw_wait_response(&r, ++n, &h);
    assert_int_equal(h.type, VRPC_FT_HELLO_ACK);

    uint8_t good[16];
    Vrpctest__EchoRequest er = VRPCTEST__ECHO_REQUEST__INIT;
    er.seq = 5;
    size_t glen = protobuf_c_message_pack(&er.base, good);
    struct vrpc_wire_hdr req = {.version = VRPC_WIRE_VERSION,
                                .type = VRPC_FT_REQUEST,
                                .method_id = m_echo.id,
                                .request_id = vrpc_wire_make_id(0, 1),
                                .payload_len = (uint32_t)glen};
    raw_expect_status(&r, &n, &req, NULL, good, VRPC_OK);

    /* unknown method */
    req.method_id = m_missing.id;
    req.request_id = vrpc_wire_make_id(1, 1);
    raw_expect_status(&r, &n, &req, NULL, good, VRPC_UNIMPLEMENTED);

    /* undecodable payload */
    static const uint8_t junk[] = {0x0a, 0x7f, 1, 2};
    req.method_id = m_echo.id;
    req.payload_len = sizeof(junk);
    raw_expect_status(&r, &n, &req, NULL, junk, VRPC_INVALID_ARGUMENT);

    /* nested deeper than the server's limit (32) */
    uint8_t nest[2048];
    size_t len = 2;
    nest[0] = 0x10, nest[1] = 1;
    for (int d = 1; d < 200; d++) {
        memmove(nest + 3, nest, len);
        nest[0] = 0x0a;
        nest[1] = (uint8_t)(0x80 | (len & 0x7f));
        nest[2] = (uint8_t)(len >> 7);
        len += 3;
    }
    req.method_id = m_nest.id;
    req.payload_len = (uint32_t)len;
    raw_expect_status(&r, &n, &req, NULL, nest, VRPC_INVALID_ARGUMENT);

    /* oversized (server limit SERVER_MAX_MSG, within the transport's eager size) */
    static uint8_t big[SERVER_MAX_MSG + 100];
    req.method_id = m_echo.id;
    req.payload_len = sizeof(big);
    raw_expect_status(&r, &n, &req, NULL, big, VRPC_RESOURCE_EXHAUSTED);

    /* deadline already past on arrival: the handler does not run */
    unsigned runs = __atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED);
    req.payload_len = (uint32_t)glen;
    req.flags = VRPC_FF_DEADLINE;
    req.budget_us = 0;
    raw_expect_status(&r, &n, &req, NULL, good, VRPC_DEADLINE_EXCEEDED);
    assert_int_equal(__atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED), runs);

    /* metadata reaches the handler */
    struct vrpc_metadata md = {"x-echo", "raw", 3};
    uint8_t mdb[64];
    vrpc_wire_md_encode(mdb, &md, 1);
    er.mode = MODE_METADATA;
    glen = protobuf_c_message_pack(&er.base, good);
    req.flags = 0;
    req.md_len = (uint32_t)vrpc_wire_md_size(&md, 1);
    req.payload_len = (uint32_t)glen;
    raw_expect_status(&r, &n, &req, mdb, good, VRPC_OK);

    /* a CANCEL for an id not in flight is ignored; the connection stays */
    struct vrpc_wire_hdr c = {
        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_CANCEL, .request_id = vrpc_wire_make_id(3, 3)};
    uint8_t f[64];
    raw_send_bytes(&r, r.ep, f, frame(f, &c, NULL, NULL));
    req.md_len = 0;
    er.mode = MODE_ECHO;
    glen = protobuf_c_message_pack(&er.base, good);
    req.payload_len = (uint32_t)glen;
    raw_expect_status(&r, &n, &req, NULL, good, VRPC_OK);
    assert_int_equal(__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE), 0);
    raw_close(&r);
}

/* Each bad frame closes only its own connection; a channel alongside carries on. */
/* The n-th received frame, decoded (any type). */
static void raw_frame_n(struct raw *r, unsigned n, struct vrpc_wire_hdr *h)
{
    for (int i = 0; i < 5000 && __atomic_load_n(&r->nrecv, __ATOMIC_ACQUIRE) < n; i++)
        usleep(1000);
    pthread_mutex_lock(&r->lock);
    assert_true(r->nrecv >= n);
    assert_int_equal(vrpc_wire_hdr_decode(r->last, r->last_len, h), 0);
    pthread_mutex_unlock(&r->lock);
}

static void *shutdown_thread(void *arg) { return (void *)(intptr_t)vrpc_server_shutdown(arg, 5000); }

/* After its GOAWAY a draining server refuses new requests unread, and says
 * so with VRPC_FF_REFUSED to a client that offered VRPC_FEAT_REFUSED (in
 * its HELLO_ACK too); a client that did not gets the same refusal without
 * the flag (it would reject the frame). A call that never leaves a channel
 * (nothing listens) carries VRPC_STATUS_UNPROCESSED. */
static void test_refused_after_goaway(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX], bound[VRPC_URI_MAX];
    struct vrpc_server *s = start_server(listen_uri(uri, sizeof(uri), 0), 64);
    assert_int_equal(vrpc_server_uri(s, bound, sizeof(bound)), 0);
    struct raw r[2];
    uint8_t f[256], p[VRPC_WIRE_HELLO_LEN], body[32];
    unsigned runs0 = __atomic_load_n(&g_handler_runs, __ATOMIC_RELAXED);
    Vrpctest__EchoRequest er = VRPCTEST__ECHO_REQUEST__INIT;
    er.mode = MODE_DEFERRED; /* keeps the drain waiting */
    er.sleep_ms = 500;
    size_t slow_len = protobuf_c_message_pack(&er.base, body);
    for (int i = 0; i < 2; i++) {
        raw_open(&r[i], g_opt.backend);
        raw_connect(&r[i], bound, g_opt.client_ip);
        struct vrpc_wire_hello hs = {
            .max_msg_size = 4096, .max_concurrent = 8, .features = i == 0 ? VRPC_FEAT_REFUSED : 0};
        vrpc_wire_hello_encode(p, &hs);
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO, .payload_len = sizeof(p)};
        raw_send_bytes(&r[i], r[i].ep, f, frame(f, &h, NULL, p));
        raw_frame_n(&r[i], 1, &h);
        assert_int_equal(h.type, VRPC_FT_HELLO_ACK);
        struct vrpc_wire_hello ack;
        pthread_mutex_lock(&r[i].lock);
        assert_int_equal(vrpc_wire_hello_decode(r[i].last + VRPC_WIRE_HDR_LEN, h.payload_len, &ack), 0);
        pthread_mutex_unlock(&r[i].lock);
        assert_true(ack.features & VRPC_FEAT_REFUSED);
        struct vrpc_wire_hdr req = {.version = VRPC_WIRE_VERSION,
                                    .type = VRPC_FT_REQUEST,
                                    .method_id = m_echo.id,
                                    .request_id = vrpc_wire_make_id(0, 1),
                                    .payload_len = (uint32_t)slow_len};
        raw_send_bytes(&r[i], r[i].ep, f, frame(f, &req, NULL, body));
    }
    wait_handler_runs(runs0 + 2); /* both slow calls run: the drain waits for them */
    pthread_t t;
    pthread_create(&t, NULL, shutdown_thread, s);
    er.mode = MODE_ECHO;
    er.sleep_ms = 0;
    size_t len = protobuf_c_message_pack(&er.base, body);
    for (int i = 0; i < 2; i++) {
        struct vrpc_wire_hdr h;
        raw_frame_n(&r[i], 2, &h);
        assert_int_equal(h.type, VRPC_FT_GOAWAY);
        struct vrpc_wire_hdr req = {.version = VRPC_WIRE_VERSION,
                                    .type = VRPC_FT_REQUEST,
                                    .method_id = m_echo.id,
                                    .request_id = vrpc_wire_make_id(1, 1),
                                    .payload_len = (uint32_t)len};
        raw_send_bytes(&r[i], r[i].ep, f, frame(f, &req, NULL, body));
        raw_frame_n(&r[i], 3, &h);
        assert_int_equal(h.type, VRPC_FT_RESPONSE);
        assert_true(h.request_id == req.request_id);
        assert_int_equal(h.status, VRPC_UNAVAILABLE);
        assert_int_equal(h.flags, i == 0 ? VRPC_FF_REFUSED : 0);
    }
    void *rc;
    pthread_join(t, &rc);
    assert_int_equal((intptr_t)rc, 0); /* the slow calls were answered */
    for (int i = 0; i < 2; i++) {
        struct vrpc_wire_hdr h;
        raw_frame_n(&r[i], 4, &h);
        assert_int_equal(h.type, VRPC_FT_RESPONSE);
        assert_int_equal(h.status, VRPC_OK);
        assert_int_equal(h.flags, 0);
        raw_close(&r[i]);
    }
    vrpc_server_destroy(s);

    /* nothing listens there now: never sent */
    struct vrpc_channel *ch = new_channel(bound, 64, false);
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    assert_int_equal(call_echo(ch, NULL, 0, 0, MODE_ECHO, 0, NULL, &rep, &st), VRPC_UNAVAILABLE);
    assert_int_equal(st.flags, VRPC_STATUS_UNPROCESSED);
    vrpc_channel_destroy(ch);
}

static void test_protocol_errors_close_connection(void **state)
{
    (void)state;
    struct vrpc_channel *ch = new_channel(g_uri, 64, true);
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    assert_int_equal(call_echo(ch, "a", 1, 1, MODE_ECHO, 0, NULL, &rep, &st), VRPC_OK);

    for (int kind = 0; kind < 7; kind++) {
        struct raw r;
        uint8_t f[256];
        size_t len;
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                                  .type = VRPC_FT_REQUEST,
                                  .method_id = m_echo.id,
                                  .request_id = vrpc_wire_make_id(0, 1)};
        raw_open(&r, g_opt.backend);
        raw_connect(&r, g_uri, g_opt.client_ip);
        if (kind != 6)
            raw_hello(&r, r.ep, VRPC_FT_HELLO);
        switch (kind) {
        case 0: /* garbage */
            memset(f, 0xa5, 100);
            len = 100;
            break;
        case 1: /* unknown frame type */
            h.type = 42;
            len = frame(f, &h, NULL, NULL);
            break;
        case 2: /* wrong version */
            h.version = 9;
            len = frame(f, &h, NULL, NULL);
            break;
        case 3: /* lengths that do not match the frame */
            h.payload_len = 1000;
            vrpc_wire_hdr_encode(f, &h);
            len = VRPC_WIRE_HDR_LEN + 10;
            break;
        case 4: /* request beyond the granted credits */
            h.request_id = vrpc_wire_make_id(100000, 1);
            len = frame(f, &h, NULL, NULL);
            break;
        case 5: /* malformed metadata */
            h.md_len = 6;
            memcpy(f + VRPC_WIRE_HDR_LEN, "\x09\x00\x00\x00xy", 6);
            vrpc_wire_hdr_encode(f, &h);
            len = VRPC_WIRE_HDR_LEN + 6;
            break;
        default: /* request before HELLO */
            len = frame(f, &h, NULL, NULL);
            break;
        }
        raw_send_bytes(&r, r.ep, f, len);
        for (int i = 0; i < 5000 && !__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE); i++)
            usleep(1000);
        if (!__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE))
            fail_msg("bad frame kind %d did not close the connection", kind);
        vrpc_ep_destroy(r.ep);
        r.ep = NULL;
        raw_close(&r);
        assert_int_equal(call_echo(ch, "b", 1, 2, MODE_ECHO, 0, NULL, &rep, &st), VRPC_OK);
    }
    vrpc_channel_destroy(ch);
}

/* A raw server answers a response for an id that is not pending: the channel
 * closes that connection, the call pending on it fails UNAVAILABLE once. */
struct bg_call {
    struct vrpc_channel *ch;
    int code;
    unsigned done;
};

static void *bg_call_main(void *arg)
{
    struct bg_call *b = arg;
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    b->code = call_echo(b->ch, NULL, 0, 1, MODE_ECHO, 0, NULL, &rep, &st);
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_bad_server_frames(void **state)
{
    (void)state;
    for (int kind = 0; kind < 3; kind++) {
        struct raw r;
        char uri[VRPC_URI_MAX], bound[VRPC_URI_MAX];
        struct vrpc_listen_attr la = {.cqs = NULL, .ncqs = 1};
        raw_open(&r, g_opt.backend);
        la.cqs = &r.cq;
        assert_int_equal(vrpc_listen(r.tp, listen_uri(uri, sizeof(uri), 0), &la, &r.l), 0);
        assert_int_equal(vrpc_listener_uri(r.l, bound, sizeof(bound)), 0);
        struct bg_call b = {.ch = new_channel(bound, 8, false)};
        pthread_t t;
        pthread_create(&t, NULL, bg_call_main, &b);
        /* HELLO arrives; answer it, then wait for the REQUEST */
        for (int i = 0; i < 5000 && __atomic_load_n(&r.nrecv, __ATOMIC_ACQUIRE) < 1; i++)
            usleep(1000);
        struct vrpc_ep *ep = __atomic_load_n(&r.accepted, __ATOMIC_ACQUIRE);
        assert_non_null(ep);
        raw_hello(&r, ep, VRPC_FT_HELLO_ACK);
        for (int i = 0; i < 5000 && __atomic_load_n(&r.nrecv, __ATOMIC_ACQUIRE) < 2; i++)
            usleep(1000);
        struct vrpc_wire_hdr rq;
        pthread_mutex_lock(&r.lock);
        assert_int_equal(vrpc_wire_hdr_decode(r.last, r.last_len, &rq), 0);
        pthread_mutex_unlock(&r.lock);
        assert_int_equal(rq.type, VRPC_FT_REQUEST);
        uint8_t f[64];
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE};
        if (kind == 0)
            h.request_id = rq.request_id + (1ull << 32); /* right slot, wrong generation */
        else if (kind == 1)
            h.request_id = vrpc_wire_make_id(5000, 1); /* no such slot */
        else
            h.type = VRPC_FT_REQUEST, h.request_id = 1; /* a frame a server must not send */
        raw_send_bytes(&r, ep, f, frame(f, &h, NULL, NULL));
        pthread_join(t, NULL);
        assert_int_equal(b.code, VRPC_UNAVAILABLE);
        for (int i = 0; i < 5000 && !__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE); i++)
            usleep(1000);
        assert_int_equal(__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE), 1);
        vrpc_channel_destroy(b.ch);
        raw_close(&r);
    }
}

/* ---- CPU placement ------------------------------------------------------------------ */

/* cpu_mask on both sides (and the caller pinned with its channel): the
 * pollers and workers share one CPU and hand work over by yielding it. */
static void test_pinned_placement(void **state)
{
    (void)state;
    cpu_set_t allowed, one;
    int cpu = -1;
    assert_int_equal(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    for (int c = 0; c < 64 && cpu < 0; c++)
        if (CPU_ISSET(c, &allowed))
            cpu = c;
    if (cpu < 0)
        skip();
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);

    char uri[VRPC_URI_MAX], bound[VRPC_URI_MAX];
    struct vrpc_server_opts so;
    struct vrpc_server *s;
    vrpc_server_opts_init(&so);
    so.cpu_mask = 1ull << cpu;
    assert_int_equal(vrpc_server_create(&so, &s), 0);
    assert_int_equal(vrpc_server_register(s, &m_echo, h_echo, NULL), 0);
    assert_int_equal(vrpc_server_start(s, listen_uri(uri, sizeof(uri), 0)), 0);
    assert_int_equal(vrpc_server_uri(s, bound, sizeof(bound)), 0);
    struct vrpc_channel_opts co;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&co);
    co.src_addr = g_opt.client_ip;
    co.cpu_mask = 1ull << cpu;
    assert_int_equal(vrpc_channel_create(bound, &co, &ch), 0);
    assert_int_equal(vrpc_channel_connect(ch, 10000), 0);

    unsigned n = 2000 / g_opt.scale;
    struct async_state a = {0};
    for (unsigned i = 0; i < n; i++) {
        Vrpctest__EchoReply *rep;
        struct vrpc_status st;
        assert_int_equal(call_echo(ch, "p", 1, i, MODE_ECHO, 0, NULL, &rep, &st), VRPC_OK);
        assert_int_equal(rep->seq, i);
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        r.seq = i;
        int rc;
        while ((rc = vrpc_call_async(ch, &m_echo, &r.base, NULL, async_cb, &a)) == -EAGAIN)
            usleep(100);
        assert_int_equal(rc, 0);
    }
    for (int i = 0; i < 30000 && __atomic_load_n(&a.done, __ATOMIC_ACQUIRE) < n; i++)
        usleep(1000);
    assert_int_equal(a.ok, n);
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(s);
    pthread_setaffinity_np(pthread_self(), sizeof(allowed), &allowed);
}

/* ---- calls racing connection loss ------------------------------------------------ */

/* A raw server that answers HELLO and answers every REQUEST OK (empty reply),
 * except that it closes the connection at every `every`-th request it gets:
 * the channel's connection-loss scan then runs again and again while other
 * threads are starting calls on fresh slots (the start_call race: a scan that
 * saw a slot in use before its callback fields were written would complete
 * the previous occupant's callback a second time, and lose this call). */
struct flaky {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_listener *l;
    unsigned every;
    unsigned requests;     /* poller only */
    unsigned drops;        /* atomic: connections it closed */
    unsigned disconnected; /* atomic */
    unsigned accepted;     /* atomic */
};

static void flaky_send(struct flaky *f, struct vrpc_ep *ep, const struct vrpc_wire_hdr *h, const void *p)
{
    struct vrpc_buf *b = vrpc_pool_get(f->pool);
    if (!b)
        return; /* the client's call then fails with the connection */
    uint32_t len = (uint32_t)frame(b->data, h, NULL, p);
    if (vrpc_ep_send(ep, b, len, 0, 0, 0))
        vrpc_pool_put(b);
}

static void flaky_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct flaky *f = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        struct vrpc_wire_hdr h;
        switch (w->opcode) {
        case VRPC_WC_RECV:
            if (w->status == 0 && vrpc_wire_hdr_decode(w->buf->data, w->byte_len, &h) == 0) {
                if (h.type == VRPC_FT_HELLO) {
                    uint8_t p[VRPC_WIRE_HELLO_LEN];
                    struct vrpc_wire_hello hs = {.max_msg_size = 4096, .max_concurrent = 32};
                    vrpc_wire_hello_encode(p, &hs);
                    struct vrpc_wire_hdr a = {
                        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO_ACK, .payload_len = sizeof(p)};
                    flaky_send(f, w->ep, &a, p);
                } else if (h.type == VRPC_FT_REQUEST) {
                    if (++f->requests % f->every == 0) {
                        if (vrpc_ep_close(w->ep) == 0)
                            __atomic_add_fetch(&f->drops, 1, __ATOMIC_RELAXED);
                    } else {
                        struct vrpc_wire_hdr a = {
                            .version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE, .request_id = h.request_id};
                        flaky_send(f, w->ep, &a, NULL);
                    }
                }
            }
            if (w->status == -ECANCELED || vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_SEND:
            vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_ACCEPTED:
            __atomic_add_fetch(&f->accepted, 1, __ATOMIC_RELAXED);
            break;
        case VRPC_WC_DISCONNECTED:
            vrpc_ep_destroy(w->ep);
            __atomic_add_fetch(&f->disconnected, 1, __ATOMIC_RELEASE);
            break;
        default:
            break;
        }
    }
}

struct loss_state {
    struct vrpc_channel *ch;
    struct call_rec *recs;
    unsigned per_thread;
    unsigned done;     /* atomic: async completions */
    unsigned sync_bad; /* atomic: sync calls with a code other than OK/UNAVAILABLE */
    unsigned sync_n;   /* atomic */
};

struct loss_thread {
    struct loss_state *st;
    unsigned idx;
};

static void *loss_async_main(void *arg)
{
    struct loss_thread *t = arg;
    struct loss_state *ls = t->st;
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    for (unsigned i = 0; i < ls->per_thread; i++) {
        struct call_rec *rec = &ls->recs[t->idx * ls->per_thread + i];
        uint64_t id = 0;
        struct vrpc_call_opts o = {.call_id = &id};
        int rc;
        while ((rc = vrpc_call_async(ls->ch, &m_echo, &r.base, &o, call_rec_cb, rec)) == -EAGAIN)
            usleep(50);
        assert_int_equal(rc, 0);
        /* every 5th is cancelled at once: queued, being sent or pending */
        if (i % 5 == 0) {
            rc = vrpc_channel_cancel(ls->ch, id);
            assert_true(rc == 0 || rc == -ENOENT);
        }
        /* a sync call every few, on the same slots (a slot's previous
         * occupant then has a callback, the new one has none) */
        if (i % 8 == 0) {
            Vrpctest__EchoReply *rep;
            struct vrpc_status st;
            int code = vrpc_call(ls->ch, &m_echo, &r.base, (ProtobufCMessage **)&rep, NULL, &st);
            if (code != VRPC_OK && code != VRPC_UNAVAILABLE)
                __atomic_add_fetch(&ls->sync_bad, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&ls->sync_n, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void test_calls_racing_connection_loss(void **state)
{
    (void)state;
    enum { THREADS = 4 };
    struct flaky f = {.every = 37};
    struct vrpc_cq_attr ca;
    char uri[VRPC_URI_MAX], bound[VRPC_URI_MAX];
    struct vrpc_listen_attr la = {.ncqs = 1};

    assert_int_equal(vrpc_transport_create(g_opt.backend, NULL, &f.tp), 0);
    assert_int_equal(vrpc_pool_create(f.tp, vrpc_transport_eager_size(f.tp), 512, &f.pool), 0);
    vrpc_cq_attr_init(&ca);
    ca.cb = flaky_cb;
    ca.cb_arg = &f;
    ca.max_recv = 128;
    assert_int_equal(vrpc_cq_create(f.tp, &ca, &f.cq), 0);
    for (int i = 0; i < 128; i++) {
        struct vrpc_buf *b = vrpc_pool_get(f.pool);
        assert_int_equal(vrpc_cq_post_recv(f.cq, &b, NULL, 1), 0);
    }
    la.cqs = &f.cq;
    assert_int_equal(vrpc_listen(f.tp, listen_uri(uri, sizeof(uri), 0), &la, &f.l), 0);
    assert_int_equal(vrpc_listener_uri(f.l, bound, sizeof(bound)), 0);

    struct loss_state ls = {.ch = new_channel(bound, 16, true), .per_thread = 6000 / g_opt.scale};
    unsigned total = THREADS * ls.per_thread;
    ls.recs = calloc(total, sizeof(*ls.recs));
    pthread_t th[THREADS];
    struct loss_thread lt[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        lt[i] = (struct loss_thread){&ls, i};
        pthread_create(&th[i], NULL, loss_async_main, &lt[i]);
    }
    for (unsigned i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    /* every accepted call completes exactly once: OK, UNAVAILABLE when its
     * connection was dropped under it, or CANCELLED */
    unsigned ok = 0, unavailable = 0, pending = total;
    for (int wait = 0; wait < 30000 && pending; wait++) {
        pending = 0;
        for (unsigned k = 0; k < total; k++)
            pending += __atomic_load_n(&ls.recs[k].calls, __ATOMIC_ACQUIRE) == 0;
        if (pending)
            usleep(1000);
    }
    for (unsigned k = 0; k < total; k++) {
        unsigned c = __atomic_load_n(&ls.recs[k].calls, __ATOMIC_ACQUIRE);
        if (c != 1)
            fail_msg("call %u completed %u times", k, c);
        if (ls.recs[k].code == VRPC_OK)
            ok++;
        else if (ls.recs[k].code == VRPC_UNAVAILABLE || ls.recs[k].code == VRPC_CANCELLED)
            unavailable++;
        else
            fail_msg("call %u: unexpected %s", k, vrpc_code_name((enum vrpc_code)ls.recs[k].code));
    }
    printf("# %u async + %u sync calls, %u connections dropped: %u ok, %u unavailable or cancelled\n", total, ls.sync_n,
           __atomic_load_n(&f.drops, __ATOMIC_RELAXED), ok, unavailable);
    assert_int_equal(ls.sync_bad, 0);
    assert_true(__atomic_load_n(&f.drops, __ATOMIC_RELAXED) > 0);
    assert_true(ok > 0);
    vrpc_channel_destroy(ls.ch);
    /* every connection the server accepted has gone (each DISCONNECTED destroyed its endpoint) */
    raw_wait(&f.disconnected, __atomic_load_n(&f.accepted, __ATOMIC_ACQUIRE), 10000);
    assert_int_equal(f.disconnected, f.accepted);
    /* the client's second completion of a record, if any, would land now */
    for (unsigned k = 0; k < total; k++)
        assert_int_equal(ls.recs[k].calls, 1);
    free(ls.recs);
    vrpc_listener_destroy(f.l);
    vrpc_cq_destroy(f.cq);
    vrpc_pool_destroy(f.pool);
    vrpc_transport_destroy(f.tp);
}

/* ---- no malloc in steady state --------------------------------------------------- */

static void test_no_malloc_steady_state(void **state)
{
    (void)state;
#ifdef COUNT_MALLOC
    struct vrpc_channel *ch = new_channel(g_uri, 64, true);
    uint8_t buf[200];
    memset(buf, 3, sizeof(buf));
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;
    struct vrpc_metadata md = {"x-echo", "m", 1};
    struct vrpc_call_opts o = {.timeout_us = 5000000, .md = &md, .md_count = 1};
    struct async_state a = {0};
    for (unsigned i = 0; i < 2000; i++) {
        assert_int_equal(call_echo(ch, buf, sizeof(buf), i, MODE_ECHO, 0, &o, &rep, &st), VRPC_OK);
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, &o, async_cb, &a), 0);
    }
    while (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) < 2000)
        usleep(1000);
    /* Per-slot buffers are allocated on a slot's first use: fill all 64 slots
     * at once so that warm-up has touched every one of them. */
    for (unsigned round = 0; round < 3; round++) {
        for (unsigned i = 0; i < 64; i++) {
            Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
            r.payload.data = buf;
            r.payload.len = sizeof(buf);
            r.mode = MODE_DEFERRED;
            r.sleep_ms = 20;
            assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, &o, async_cb, &a), 0);
        }
        while (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) < 2000 + 64 * (round + 1))
            usleep(1000);
    }
    unsigned base = 2000 + 3 * 64;
    void *warm[2];
    backtrace(warm, 2); /* loads the unwinder now, not while counting */
    __atomic_store_n(&g_allocs, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_count_on, 1, __ATOMIC_SEQ_CST);
    for (unsigned i = 0; i < 10000; i++) {
        if (call_echo(ch, buf, sizeof(buf), i, MODE_ECHO, 0, &o, &rep, &st) != VRPC_OK)
            break;
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        vrpc_call_async(ch, &m_echo, &r.base, &o, async_cb, &a);
    }
    while (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) < base + 10000)
        usleep(1000);
    __atomic_store_n(&g_count_on, 0, __ATOMIC_SEQ_CST);
    unsigned long n = __atomic_load_n(&g_allocs, __ATOMIC_RELAXED);
    printf("# allocations during 10,000 sync + 10,000 async calls after warm-up: %lu\n", n);
    for (unsigned long k = 0; k < n && k < 4; k++) {
        printf("# allocation %lu from:\n", k);
        fflush(stdout);
        backtrace_symbols_fd(g_where[k], g_where_n[k], 1);
    }
    assert_int_equal(a.ok, base + 10000);
    assert_int_equal(n, 0);
    vrpc_channel_destroy(ch);
#else
    skip();
#endif
}

int main(int argc, char **argv)
{
    g_opt.backend = "tcp";
    g_opt.setup = "local";
    g_opt.scale = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            g_opt.backend = argv[++i];
        else if (!strcmp(argv[i], "--setup") && i + 1 < argc)
            g_opt.setup = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--backend tcp|verbs] [--setup local|single|veth]\n"
                    "verbs: --setup single reads VRPC_VERBS_IP; --setup veth reads\n"
                    "VRPC_VERBS_IP_A (client) and VRPC_VERBS_IP_B (server).\n"
                    "VRPC_TEST_SCALE=N divides the round counts.\n",
                    argv[0]);
            return 2;
        }
    }
    const char *sc = getenv("VRPC_TEST_SCALE");
    if (sc && atoi(sc) > 0)
        g_opt.scale = (unsigned)atoi(sc);
    int setup_rc = vrpc_test_backend_addrs(g_opt.backend, g_opt.setup, &g_opt.server_ip, &g_opt.client_ip);
    if (setup_rc)
        return setup_rc;
    printf("# rpc tests: backend %s, setup %s, scale 1/%u\n", g_opt.backend, g_opt.setup, g_opt.scale);
    setenv("VRPC_LOG", getenv("VRPC_LOG") ? getenv("VRPC_LOG") : "1", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_calls),
        cmocka_unit_test(test_concurrent_calls),
        cmocka_unit_test(test_async_calls),
        cmocka_unit_test(test_async_never_blocks),
        cmocka_unit_test(test_deadline_exceeded),
        cmocka_unit_test(test_cancel_races_response),
        cmocka_unit_test(test_cancel_reaches_server),
        cmocka_unit_test(test_cancel_queued_call),
        cmocka_unit_test(test_server_drain),
        cmocka_unit_test(test_server_deadline_while_handler_runs),
        cmocka_unit_test(test_handlers_on_poller),
        cmocka_unit_test(test_callbacks_on_poller),
        cmocka_unit_test(test_destroy_with_unanswered_call),
        cmocka_unit_test(test_connection_loss_and_reconnect),
        cmocka_unit_test(test_calls_racing_connection_loss),
        cmocka_unit_test(test_pinned_placement),
        cmocka_unit_test(test_bad_requests_get_status),
        cmocka_unit_test(test_refused_after_goaway),
        cmocka_unit_test(test_protocol_errors_close_connection),
        cmocka_unit_test(test_bad_server_frames),
        cmocka_unit_test(test_no_malloc_steady_state),
    };
    /* VRPC_TEST_ONLY=a,b runs only the cases whose names contain a or b */
    struct CMUnitTest sel[sizeof(tests) / sizeof(tests[0])];
    size_t nsel = 0;
    const char *only = getenv("VRPC_TEST_ONLY");
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        bool take = !only;
        for (const char *p = only; p && *p && !take;) {
            const char *e = strchr(p, ',');
            size_t l = e ? (size_t)(e - p) : strlen(p);
            char part[64];
            snprintf(part, sizeof(part), "%.*s", (int)l, p);
            take = l && strstr(tests[i].name, part);
            p = e ? e + 1 : p + l;
        }
        if (take)
            sel[nsel++] = tests[i];
    }
    return _cmocka_run_group_tests("rpc", sel, nsel, group_setup, group_teardown);
}
