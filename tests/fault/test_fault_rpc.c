/* The RPC core under the fault-injecting transport (transport/fault/fault.h):
 * for each seed, a server and a channel over fault+tcp (or fault+verbs) run
 * mixed unary load from several threads (sync and async calls, deadlines,
 * cancels, small and large payloads over the rendezvous path) while the layer
 * loses connections, stalls, fails sends and reads, refuses grants and holds
 * back receive buffers. Asserted: every call ends exactly once with a status
 * the RPC contract allows, a response that says OK carries the right bytes,
 * nothing leaks (large-buffer cache in_use back to 0 on both sides, every
 * buffer handed to the backend completed, fds back to the start), the layer
 * saw no contract violation from the backend, and the server still serves a
 * clean channel afterwards. A failing seed is printed with the command that
 * replays it (VRPC_FAULT_SEED=N). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "verbs_setup.h"
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>
#include "rpc/rndv.h"
#include "transport/fault/fault.h"
#include "rpc_test.pb-c.h"

static struct {
    const char *backend, *setup, *server_ip, *client_ip, *self;
    unsigned ms, threads, scale;
    const char *spec; /* rates, without the seed */
} g = {.backend = "tcp", .setup = "single", .ms = 2000, .threads = 4, .scale = 1};

/* The CI rates: each kind of fault fires a few to a few hundred times per
 * seed at this load. */
#define DEFAULT_SPEC                                                                                                   \
    "loss=0.002,connect=0.1,accept=0.1,delay=0.01,delay_us=3000,send_delay=0.01,send_delay_us=300,"                    \
    "eagain=0.02,send_err=0.002,read_err=0.03,grant_refuse=0.05,starve=0.01,starve_us=5000,"                           \
    "cpl_delay=0.02,cpl_delay_us=3000"

static const uint64_t ci_seeds[] = {1, 2, 3, 42, 1234, 99991};

static struct vrpc_method_desc m_echo = {"/vrpctest.Test/Echo", 0, &vrpctest__echo_request__descriptor,
                                         &vrpctest__echo_reply__descriptor, NULL, VRPC_METHOD_UNARY};

/* ---- payloads both ends can check ---------------------------------------- */

static void fill(uint8_t *p, size_t n, uint64_t key)
{
    uint64_t x = key * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        if (!(i & 7))
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)(x >> (8 * (i & 7)));
    }
}

static bool payload_ok(const uint8_t *p, size_t n, uint64_t key)
{
    uint64_t x = key * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        if (!(i & 7))
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (p[i] != (uint8_t)(x >> (8 * (i & 7))))
            return false;
    }
    return true;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- server --------------------------------------------------------------- */

/* mode 0: echo the payload; 1: sleep sleep_ms (watching for cancel), empty */
static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    if (r->mode == 1)
        for (uint32_t i = 0; i < r->sleep_ms && !vrpc_server_call_is_cancelled(call); i++)
            usleep(1000);
    else
        rep.payload = r->payload;
    rep.seq = r->seq;
    vrpc_server_call_respond(call, &rep.base);
}

/* ---- bookkeeping of the calls ------------------------------------------------ */

static unsigned g_by_code[VRPC_CODE_COUNT];
static unsigned g_bad_code, g_bad_payload, g_double_end, g_sync_calls, g_async_calls, g_cancels;
static char g_bad_msg[256];

/* What a call may end with under connection loss, stalls and read errors:
 * a READ refused (-EACCES, which the layer injects) reads as INTERNAL. */
static bool code_allowed(int code, const struct vrpc_status *st)
{
    if (code == VRPC_INTERNAL)
        return st && !strncmp(st->message, "large-message read failed", 25);
    switch (code) {
    case VRPC_OK:
    case VRPC_CANCELLED:
    case VRPC_DEADLINE_EXCEEDED:
    case VRPC_UNAVAILABLE:
    case VRPC_RESOURCE_EXHAUSTED: /* a large transfer's buffer or grant not to be had */
        return true;
    default:
        return false;
    }
}

static void note_end(int code, const struct vrpc_status *st, const ProtobufCMessage *resp, size_t len, uint64_t key,
                     uint64_t seq)
{
    if (code < 0 || code >= VRPC_CODE_COUNT || !code_allowed(code, st)) {
        if (__atomic_fetch_add(&g_bad_code, 1, __ATOMIC_RELAXED) == 0)
            snprintf(g_bad_msg, sizeof g_bad_msg, "status %d (%s): %s", code, vrpc_code_name(code),
                     st ? st->message : "");
        return;
    }
    __atomic_add_fetch(&g_by_code[code], 1, __ATOMIC_RELAXED);
    if (code == VRPC_OK) {
        const Vrpctest__EchoReply *r = (const Vrpctest__EchoReply *)resp;
        if (!r || r->seq != seq || (len && (r->payload.len != len || !payload_ok(r->payload.data, len, key))))
            __atomic_add_fetch(&g_bad_payload, 1, __ATOMIC_RELAXED);
    }
}

#define SLOTS 16
struct acall {
    int ends; /* callbacks run (atomic): must end at exactly 1 */
    uint64_t id, key, seq;
    size_t len;
    uint8_t *buf;
};

static void on_async(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct acall *a = arg;
    note_end(st->code, st, resp, a->len, a->key, a->seq);
    if (__atomic_add_fetch(&a->ends, 1, __ATOMIC_ACQ_REL) != 1)
        __atomic_add_fetch(&g_double_end, 1, __ATOMIC_RELAXED);
}

struct worker {
    pthread_t th;
    struct vrpc_channel *ch;
    uint64_t rng;
    int64_t until;
    unsigned idx;
    struct acall a[SLOTS];
};

/* A payload size: mostly small, a quarter above the eager size (rendezvous),
 * a few up to 1 MiB. */
static size_t pick_len(uint64_t *r)
{
    uint64_t x = rnd(r) % 100;
    if (x < 70)
        return rnd(r) % 1024;
    if (x < 95)
        return 9000 + rnd(r) % (120 * 1024);
    return 256 * 1024 + rnd(r) % (768 * 1024);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    uint8_t *sbuf = malloc(1 << 20);
    uint64_t seq = (uint64_t)w->idx << 40;
    while (vrpc_now_ns() < w->until) {
        Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
        struct vrpc_call_opts o = {0};
        uint64_t x = rnd(&w->rng) % 100;
        size_t len = pick_len(&w->rng);
        uint64_t key = rnd(&w->rng);
        req.seq = ++seq;
        o.timeout_us = 20000 + (int64_t)(rnd(&w->rng) % 1500000);
        if (x < 10) { /* a slow call, often past its deadline */
            req.mode = 1;
            req.sleep_ms = (uint32_t)(rnd(&w->rng) % 60);
            o.timeout_us = 5000 + (int64_t)(rnd(&w->rng) % 50000);
            len = 0;
        }
        if (x < 45) { /* synchronous */
            ProtobufCMessage *resp = NULL;
            struct vrpc_status st;
            fill(sbuf, len, key);
            req.payload.data = sbuf;
            req.payload.len = len;
            int code = vrpc_call(w->ch, &m_echo, &req.base, &resp, &o, &st);
            note_end(code, &st, resp, len, key, req.seq);
            __atomic_add_fetch(&g_sync_calls, 1, __ATOMIC_RELAXED);
            continue;
        }
        /* asynchronous, in a free slot; some cancelled right away */
        struct acall *a = NULL;
        for (int i = 0; i < SLOTS && !a; i++) {
            struct acall *c = &w->a[(rnd(&w->rng) + (uint64_t)i) % SLOTS];
            if (__atomic_load_n(&c->ends, __ATOMIC_ACQUIRE) == 1 || !c->buf)
                a = c;
        }
        if (!a) {
            usleep(200);
            continue;
        }
        if (!a->buf && !(a->buf = malloc(1 << 20)))
            break;
        a->len = len;
        a->key = key;
        a->seq = req.seq;
        fill(a->buf, len, key);
        req.payload.data = a->buf;
        req.payload.len = len;
        a->id = 0;
        __atomic_store_n(&a->ends, 0, __ATOMIC_RELEASE);
        o.call_id = &a->id;
        int rc = vrpc_call_async(w->ch, &m_echo, &req.base, &o, on_async, a);
        if (rc) {
            __atomic_store_n(&a->ends, 1, __ATOMIC_RELEASE); /* not accepted: no callback */
            if (rc != -EAGAIN)
                __atomic_add_fetch(&g_bad_code, 1, __ATOMIC_RELAXED);
            continue;
        }
        __atomic_add_fetch(&g_async_calls, 1, __ATOMIC_RELAXED);
        if (rnd(&w->rng) % 100 < 8) {
            if (rnd(&w->rng) & 1)
                usleep((useconds_t)(rnd(&w->rng) % 2000));
            vrpc_channel_cancel(w->ch, __atomic_load_n(&a->id, __ATOMIC_ACQUIRE));
            __atomic_add_fetch(&g_cancels, 1, __ATOMIC_RELAXED);
        }
    }
    free(sbuf);
    return NULL;
}

/* ---- the load ------------------------------------------------------------------ */

static void reset_tallies(void)
{
    memset(g_by_code, 0, sizeof g_by_code);
    g_bad_code = g_bad_payload = g_double_end = g_sync_calls = g_async_calls = g_cancels = 0;
    g_bad_msg[0] = 0;
}

static void free_workers(struct worker *w)
{
    for (unsigned i = 0; i < g.threads; i++)
        for (int k = 0; k < SLOTS; k++)
            free(w[i].a[k].buf);
    free(w);
}

/* g.threads threads of mixed calls on ch for ms; then waits (at most 15 s)
 * for every async call to end. Returns how many never did; *wout: the
 * workers (free_workers). */
static unsigned run_load(struct vrpc_channel *ch, uint64_t seed, unsigned ms, struct worker **wout)
{
    struct worker *w = calloc(g.threads, sizeof *w);
    unsigned open_calls = 0;
    if (!w)
        abort();
    int64_t until = vrpc_now_ns() + (int64_t)ms * 1000000;
    for (unsigned i = 0; i < g.threads; i++) {
        w[i].ch = ch;
        w[i].rng = seed * 1000003u + i;
        w[i].until = until;
        w[i].idx = i + 1;
        for (int k = 0; k < SLOTS; k++)
            w[i].a[k].ends = 1;
        if (pthread_create(&w[i].th, NULL, worker_main, &w[i]))
            abort();
    }
    for (unsigned i = 0; i < g.threads; i++)
        pthread_join(w[i].th, NULL);
    /* every async call ends by its deadline (at most 1.5 s) or the
     * channel's hold timeout: wait for them, then check each ended once */
    for (int t = 0; t < 15000; t++) {
        open_calls = 0;
        for (unsigned i = 0; i < g.threads; i++)
            for (int k = 0; k < SLOTS; k++)
                open_calls += __atomic_load_n(&w[i].a[k].ends, __ATOMIC_ACQUIRE) == 0;
        if (!open_calls)
            break;
        usleep(1000);
    }
    *wout = w;
    return open_calls;
}

static void print_tallies(const char *who)
{
    printf("%s: %u sync + %u async calls (%u cancels); OK %u, CANCELLED %u, DEADLINE_EXCEEDED %u, "
           "UNAVAILABLE %u, RESOURCE_EXHAUSTED %u, INTERNAL (read refused) %u\n",
           who, g_sync_calls, g_async_calls, g_cancels, g_by_code[VRPC_OK], g_by_code[VRPC_CANCELLED],
           g_by_code[VRPC_DEADLINE_EXCEEDED], g_by_code[VRPC_UNAVAILABLE], g_by_code[VRPC_RESOURCE_EXHAUSTED],
           g_by_code[VRPC_INTERNAL]);
}

/* ---- leak checks ------------------------------------------------------------- */

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static size_t in_use_after(struct vrpc_transport *tp, int ms)
{
    size_t pinned, in_use = 1;
    for (int i = 0; i < ms && in_use; i++) {
        vrpc_lbuf_stats(tp, &pinned, &in_use);
        if (in_use)
            usleep(1000);
    }
    return in_use;
}

/* ---- one seed ------------------------------------------------------------------ */

static void replay_line(uint64_t seed)
{
    printf("REPLAY: VRPC_FAULT_SEED=%llu %s --backend %s --setup %s --ms %u --threads %u%s%s%s\n",
           (unsigned long long)seed, g.self, g.backend, g.setup, g.ms, g.threads, g.spec ? " --spec '" : "",
           g.spec ? g.spec : "", g.spec ? "'" : "");
    fflush(stdout);
}

/* A failed check is printed and remembered; the seed's run goes on to tear
 * everything down (so the next seed starts clean) and fails at its end with
 * the replay command. */
static int g_failed;
#define CHECK(seed, cond, ...)                                                                                         \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            print_error("seed %llu: check failed: %s: ", (unsigned long long)(seed), #cond);                           \
            print_error(__VA_ARGS__);                                                                                  \
            print_error("\n");                                                                                         \
            g_failed++;                                                                                                \
        }                                                                                                              \
    } while (0)

static void run_seed(void **state)
{
    uint64_t seed = (uint64_t)(uintptr_t)*state;
    char spec[512], uri[VRPC_URI_MAX + 16], curi[VRPC_URI_MAX + 16];
    struct vrpc_server_opts so;
    struct vrpc_channel_opts co;
    struct vrpc_server *srv;
    struct vrpc_channel *ch;
    struct vrpc_fault_counts fc;
    int fds0 = count_fds();

    reset_tallies();
    g_failed = 0;
    snprintf(spec, sizeof spec, "seed=%llu,%s", (unsigned long long)seed, g.spec ? g.spec : DEFAULT_SPEC);
    assert_int_equal(vrpc_fault_configure(spec), 0);
    struct vrpc_fault_counts before;
    vrpc_fault_totals(&before);

    vrpc_server_opts_init(&so);
    so.pollers = 2;
    assert_int_equal(vrpc_server_create(&so, &srv), 0);
    assert_int_equal(vrpc_server_register(srv, &m_echo, h_echo, NULL), 0);
    snprintf(uri, sizeof uri, "fault+%s://%s%s%s:0", g.backend, strchr(g.server_ip, ':') ? "[" : "", g.server_ip,
             strchr(g.server_ip, ':') ? "]" : "");
    assert_int_equal(vrpc_server_start(srv, uri), 0);
    assert_int_equal(vrpc_server_uri(srv, uri, sizeof uri), 0);

    vrpc_channel_opts_init(&co);
    co.backoff_initial_ms = 5;
    co.backoff_max_ms = 50;
    co.connect_timeout_ms = 2000;
    co.hold_timeout_ms = 3000;
    co.src_addr = g.client_ip;
    assert_int_equal(vrpc_channel_create(uri, &co, &ch), 0);

    struct worker *w;
    unsigned open_calls = run_load(ch, seed, g.ms, &w);
    struct vrpc_transport *ctp = vrpc_channel_transport(ch), *stp = vrpc_server_transport(srv);
    assert_int_equal(vrpc_fault_counts(ctp, &fc), 0);
    char who[32];
    snprintf(who, sizeof who, "seed %llu", (unsigned long long)seed);
    print_tallies(who);
    CHECK(seed, open_calls == 0, "%u async calls never ended", open_calls);
    CHECK(seed, g_double_end == 0, "%u async calls ended twice", g_double_end);
    CHECK(seed, g_bad_code == 0, "%u calls ended with a status not allowed (first: %s)", g_bad_code, g_bad_msg);
    CHECK(seed, g_bad_payload == 0, "%u OK responses with wrong bytes", g_bad_payload);
    /* over TCP thousands of calls run, and some must get through; in the
     * emulated VM a seed's first connects can eat its whole 2 s */
    if (!strcmp(g.backend, "tcp"))
        CHECK(seed, g_by_code[VRPC_OK] > 0, "no call succeeded at all");
    else if (!g_by_code[VRPC_OK])
        printf("seed %llu: no call succeeded under the faults (the clean calls below must)\n",
               (unsigned long long)seed);

    /* the server survives: quiet its faults, a clean channel gets OK */
    assert_int_equal(vrpc_fault_set_quiet(stp, true), 0);
    assert_int_equal(vrpc_fault_set_quiet(ctp, true), 0);
    snprintf(curi, sizeof curi, "%s", uri + strlen("fault+"));
    struct vrpc_channel *clean;
    co.default_timeout_us = 10000000;
    assert_int_equal(vrpc_channel_create(curi, &co, &clean), 0);
    uint8_t *big = malloc(300000);
    assert_non_null(big);
    for (int i = 0; i < 20; i++) {
        Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        struct vrpc_status st;
        size_t len = i % 2 ? 300000 : 100;
        fill(big, len, (uint64_t)i);
        req.payload.data = big;
        req.payload.len = len;
        req.seq = (uint64_t)i;
        int code = vrpc_call(clean, &m_echo, &req.base, &resp, NULL, &st);
        CHECK(seed, code == VRPC_OK, "clean call %d after the faults: %s %s", i, vrpc_code_name(code), st.message);
        if (code != VRPC_OK)
            break;
        const Vrpctest__EchoReply *r = (const Vrpctest__EchoReply *)resp;
        if (code == VRPC_OK)
            CHECK(seed, r->payload.len == len && payload_ok(r->payload.data, len, (uint64_t)i),
                  "clean call %d: bad bytes", i);
    }
    free(big);
    vrpc_channel_destroy(clean);

    /* a read racing a revoke may take the idle timeout (10 s) to fail on
     * rdma_rxe (transport.h, vrpc_ep_revoke): wait longer than that */
    size_t c_in_use = in_use_after(ctp, 15000);
    CHECK(seed, c_in_use == 0, "channel: %zu large-buffer bytes still in use", c_in_use);
    vrpc_channel_destroy(ch);
    size_t s_in_use = in_use_after(stp, 15000);
    CHECK(seed, s_in_use == 0, "server: %zu large-buffer bytes still in use", s_in_use);
    free_workers(w);
    vrpc_server_destroy(srv);
    vrpc_thread_release();

    struct vrpc_fault_counts after;
    vrpc_fault_totals(&after);
    printf("seed %llu injected (client and server):", (unsigned long long)seed);
    uint64_t total = 0;
    for (int k = 0; k < VRPC_FAULT_KINDS; k++) {
        uint64_t d = after.n[k] - before.n[k];
        total += d;
        if (d)
            printf(" %s=%llu", vrpc_fault_kind_name((enum vrpc_fault_kind)k), (unsigned long long)d);
    }
    printf("\n");
    CHECK(seed, total > 0, "nothing was injected");
    CHECK(seed, after.check[VRPC_FAULT_BAD_DISCONNECT] == before.check[VRPC_FAULT_BAD_DISCONNECT],
          "a DISCONNECTED came with operations in flight");
    CHECK(seed, after.check[VRPC_FAULT_BUFS_OUT] == before.check[VRPC_FAULT_BUFS_OUT],
          "buffers handed to the backend never completed");
    int fds = fds0;
    for (int t = 0; t < 3000 && (fds = count_fds()) > fds0; t++)
        usleep(1000);
    CHECK(seed, fds == fds0, "fds: %d at the start, %d at the end", fds0, fds);
    vrpc_fault_configure(NULL);
    if (g_failed) {
        replay_line(seed);
        fail_msg("seed %llu: %d checks failed", (unsigned long long)seed, g_failed);
    }
}

/* ---- soak modes (scripts/soak.sh): a server process, client processes ----------- */

static int configure_seed(uint64_t seed)
{
    char spec[512];
    snprintf(spec, sizeof spec, "seed=%llu,%s", (unsigned long long)seed, g.spec ? g.spec : DEFAULT_SPEC);
    return vrpc_fault_configure(spec);
}

static bool checks_clean(void)
{
    struct vrpc_fault_counts c;
    vrpc_fault_totals(&c);
    return !c.check[VRPC_FAULT_BAD_DISCONNECT] && !c.check[VRPC_FAULT_BUFS_OUT];
}

/* --serve URI: serve echo under faults until SIGTERM or SIGINT; prints
 * "URI <bound uri>" first. Exit 0 if the layer saw no contract violation. */
static int serve_main(const char *uri, uint64_t seed)
{
    struct vrpc_server_opts so;
    struct vrpc_server *srv;
    char bound[VRPC_URI_MAX];
    sigset_t set;
    int sig;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread starts */
    if (configure_seed(seed))
        return 2;
    vrpc_server_opts_init(&so);
    so.pollers = 2;
    if (vrpc_server_create(&so, &srv) || vrpc_server_register(srv, &m_echo, h_echo, NULL) ||
        vrpc_server_start(srv, uri) || vrpc_server_uri(srv, bound, sizeof bound)) {
        fprintf(stderr, "cannot start the server on %s\n", uri);
        return 1;
    }
    printf("URI %s\n", bound);
    fflush(stdout);
    /* once a second, what the large-buffer cache keeps registered: it may
     * grow to max_pinned with the peak of concurrent large messages, and the
     * soak tells that apart from a leak */
    for (;;) {
        struct timespec one = {1, 0};
        size_t pinned, in_use;
        sig = sigtimedwait(&set, NULL, &one);
        if (sig == SIGTERM || sig == SIGINT)
            break;
        vrpc_lbuf_stats(vrpc_server_transport(srv), &pinned, &in_use);
        printf("STATS pinned_kb %zu in_use_kb %zu\n", pinned >> 10, in_use >> 10);
        fflush(stdout);
    }
    vrpc_server_destroy(srv);
    return checks_clean() ? 0 : 1;
}

/* --connect URI: g.ms of load through one channel, then the same checks as
 * a seed's run on the client side. Exit 0 when they hold. */
static int client_main(const char *uri, uint64_t seed)
{
    struct vrpc_channel_opts co;
    struct vrpc_channel *ch;
    struct worker *w;
    char who[48];

    if (configure_seed(seed))
        return 2;
    vrpc_channel_opts_init(&co);
    co.backoff_initial_ms = 5;
    co.backoff_max_ms = 50;
    co.connect_timeout_ms = 2000;
    co.hold_timeout_ms = 3000;
    co.src_addr = g.client_ip;
    if (vrpc_channel_create(uri, &co, &ch))
        return 1;
    unsigned open_calls = run_load(ch, seed, g.ms, &w);
    size_t in_use = in_use_after(vrpc_channel_transport(ch), 15000);
    vrpc_channel_destroy(ch);
    free_workers(w);
    vrpc_thread_release();
    snprintf(who, sizeof who, "client seed %llu", (unsigned long long)seed);
    print_tallies(who);
    bool ok = open_calls == 0 && g_double_end == 0 && g_bad_code == 0 && g_bad_payload == 0 && in_use == 0 &&
              checks_clean() && g_by_code[VRPC_OK] > 0;
    if (!ok) {
        printf("FAILED: %u calls never ended, %u ended twice, %u bad status (%s), %u bad payloads, %zu bytes in use, "
               "contract checks %s\n",
               open_calls, g_double_end, g_bad_code, g_bad_msg, g_bad_payload, in_use,
               checks_clean() ? "clean" : "FAILED");
        replay_line(seed);
    }
    return ok ? 0 : 1;
}

/* One clean call over the plain backend before the seeds: libraries that
 * open descriptors for good on first use (librdmacm opens every RDMA device
 * at its first connect or listen) do it here, outside the fds' baseline. */
static int warm_up(void)
{
    struct vrpc_server *srv;
    struct vrpc_channel *ch;
    struct vrpc_channel_opts co;
    char uri[VRPC_URI_MAX + 16];
    Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp;
    int code = -1;

    snprintf(uri, sizeof uri, "%s://%s%s%s:0", g.backend, strchr(g.server_ip, ':') ? "[" : "", g.server_ip,
             strchr(g.server_ip, ':') ? "]" : "");
    if (vrpc_server_create(NULL, &srv) || vrpc_server_register(srv, &m_echo, h_echo, NULL) ||
        vrpc_server_start(srv, uri) || vrpc_server_uri(srv, uri, sizeof uri))
        return -1;
    vrpc_channel_opts_init(&co);
    co.src_addr = g.client_ip;
    if (!vrpc_channel_create(uri, &co, &ch)) {
        code = vrpc_call(ch, &m_echo, &req.base, &resp, NULL, NULL);
        vrpc_channel_destroy(ch);
    }
    vrpc_server_destroy(srv);
    vrpc_thread_release();
    return code;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--backend tcp|verbs] [--setup single|veth] [--ms N] [--threads N] [--spec RATES]\n"
            "          [--serve URI | --connect URI]   (soak processes, scripts/soak.sh)\n"
            "  seeds: the CI list, or VRPC_FAULT_SEED=N (one seed, to replay). RATES: the fault spec\n"
            "  without seed= (transport/fault/fault.h); default " DEFAULT_SPEC "\n"
            "  VRPC_TEST_SCALE=N divides the load time by N (sanitizer builds)\n",
            argv0);
}

int main(int argc, char **argv)
{
    const char *serve = NULL, *connect_to = NULL;
    g.self = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            g.backend = argv[++i];
        else if (!strcmp(argv[i], "--setup") && i + 1 < argc)
            g.setup = argv[++i];
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc)
            g.ms = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            g.threads = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--spec") && i + 1 < argc)
            g.spec = argv[++i];
        else if (!strcmp(argv[i], "--serve") && i + 1 < argc)
            serve = argv[++i];
        else if (!strcmp(argv[i], "--connect") && i + 1 < argc)
            connect_to = argv[++i];
        else {
            usage(argv[0]);
            return 2;
        }
    }
    const char *sc = getenv("VRPC_TEST_SCALE");
    if (sc && atoi(sc) > 1)
        g.ms /= (unsigned)atoi(sc);
    if (g.ms < 200)
        g.ms = 200;
    if (!g.threads)
        g.threads = 1;
    int rc = vrpc_test_backend_addrs(g.backend, g.setup, &g.server_ip, &g.client_ip);
    if (rc)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    m_echo.id = vrpc_method_id(m_echo.full_name);

    const char *one = getenv("VRPC_FAULT_SEED");
    if (serve || connect_to) {
        uint64_t seed = one ? strtoull(one, NULL, 0) : 1;
        return serve ? serve_main(serve, seed) : client_main(connect_to, seed);
    }
    if (warm_up() != VRPC_OK) {
        fprintf(stderr, "a clean call over %s failed: no fault runs\n", g.backend);
        return 1;
    }
    size_t n = one ? 1 : sizeof ci_seeds / sizeof ci_seeds[0];
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    char(*names)[32] = calloc(n, sizeof *names);
    if (!tests || !names)
        return 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = one ? strtoull(one, NULL, 0) : ci_seeds[i];
        snprintf(names[i], sizeof names[i], "seed_%llu", (unsigned long long)s);
        tests[i].name = names[i];
        tests[i].test_func = run_seed;
        tests[i].initial_state = (void *)(uintptr_t)s;
    }
    printf("fault runs: backend fault+%s, setup %s, %u threads x %u ms per seed, rates %s\n", g.backend, g.setup,
           g.threads, g.ms, g.spec ? g.spec : DEFAULT_SPEC);
    rc = _cmocka_run_group_tests("fault", tests, n, NULL, NULL);
    free(tests);
    free(names);
    return rc ? 1 : 0;
}
