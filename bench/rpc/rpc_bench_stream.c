/* rpc_bench_stream: verbrpc streaming message rates (issue 19) against the
 * transport's own one-way message rate and gRPC C++ streaming, measured in
 * the same run, rounds alternating (transport, verbrpc, gRPC, again ...), the
 * targets checked on the median of the per-round ratios:
 *   one-way, server streaming: the server writes 32 B / 4 KiB messages
 *     (write_async, refilled from the write callbacks) as fast as the
 *     client's window lets it, the client reads them (sync read on one
 *     stream, read callbacks on one and on 16 streams); counted at the reader.
 *     Target: >= 0.8 of the transport's one-way rate on one stream.
 *   bidi echo: the client writes (write_async on 1 or 16 streams, refilled
 *     from the write callbacks, as the server streaming pump), the server
 *     writes every message back from its read callback; echoes counted at
 *     the client.
 *   gRPC (grpc_stream_bench, a child process, when built): server streaming
 *     and bidi echo, same sizes and stream counts. Target: >= 5x gRPC's
 *     streaming message rate (same shape, same size, same streams). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include <verbrpc/transport.h>
#include "common/bench.h"
#include "rpc_bench_tprate.h"
#include "rpc_test.pb-c.h"

#define D(name, kind)                                                                                                  \
    {                                                                                                                  \
        "/vrpctest.Stream/" name, 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,     \
            kind                                                                                                       \
    }
static struct vrpc_method_desc m_sstream = D("ServerStream", VRPC_METHOD_SERVER_STREAMING);
static struct vrpc_method_desc m_bidi = D("Bidi", VRPC_METHOD_BIDI_STREAMING);

#define ROUNDS_MAX 9
#define STREAMS_MAX 16

static struct {
    struct vrpc_bench_opts bo;
    const char *backend, *server_ip, *client_ip;
    unsigned duration_ms, rounds;
    uint32_t window;
    bool no_grpc;
    bool no_spin;     /* channel and server never busy-wait (callgrind: spinning is not work) */
    unsigned threads; /* --threads: workers of the server's and each channel's own scheduler; 0: the default */
    bool on_poller;   /* --on-poller: the client's read callbacks on its poller (VRPC_CALL_CB_ON_POLLER),
                         the server's methods on its (vrpc_server_run_on_poller) */
    bool no_baseline; /* skip the transport's rate (callgrind: only the streams' instructions) */
    const char *only; /* run the cases whose name contains it (and their sizes' baselines) */
} g = {.backend = "tcp", .server_ip = "127.0.0.1", .duration_ms = 1000, .rounds = 3};

static uint8_t g_payload[4096];

/* ---- the server -------------------------------------------------------------------- */

struct sctx {
    struct sctx *next;
    struct vrpc_server_stream *s;
    pthread_mutex_t mu; /* recursive: the pump runs from write callbacks too */
    size_t size;
    unsigned long accepted, completed;
    bool stop, finished, pumping;
};

static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sctx *g_ctxs;

static void pump(struct sctx *c);

static void wrote(struct vrpc_server_stream *s, int rc, void *arg)
{
    (void)s;
    struct sctx *c = arg;
    pthread_mutex_lock(&c->mu);
    c->completed++;
    c->stop |= rc != 0;
    pthread_mutex_unlock(&c->mu);
    pump(c);
}

static void pump(struct sctx *c)
{
    pthread_mutex_lock(&c->mu);
    while (c->pumping && !c->stop) {
        Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
        rep.seq = c->accepted;
        rep.payload.data = g_payload;
        rep.payload.len = c->size;
        int rc = vrpc_server_stream_write_async(c->s, &rep.base, wrote, c);
        if (rc == -EAGAIN)
            break;
        if (rc)
            c->stop = true;
        else
            c->accepted++;
    }
    if (c->stop && !c->finished && c->completed == c->accepted) {
        c->finished = true;
        vrpc_server_stream_finish(c->s, VRPC_CANCELLED, NULL, NULL, 0);
    }
    pthread_mutex_unlock(&c->mu);
}

static void s_start(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct sctx *c = calloc(1, sizeof(*c));
    pthread_mutexattr_t a;
    if (!c)
        abort();
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&c->mu, &a);
    pthread_mutexattr_destroy(&a);
    c->s = s;
    pthread_mutex_lock(&g_ctx_lock);
    c->next = g_ctxs;
    g_ctxs = c;
    pthread_mutex_unlock(&g_ctx_lock);
    vrpc_server_stream_set_ctx(s, c);
}

static void echoed(struct vrpc_server_stream *s, int rc, void *arg)
{
    (void)s;
    struct sctx *c = arg;
    if (rc != 0) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_mutex_unlock(&c->mu);
    }
}

static void s_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    struct sctx *c = vrpc_server_stream_ctx(s);
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    if (vrpc_server_stream_method(s)->kind == VRPC_METHOD_SERVER_STREAMING) {
        c->size = r->payload.len; /* the request says the size */
        pthread_mutex_lock(&c->mu);
        c->pumping = true;
        pthread_mutex_unlock(&c->mu);
        pump(c);
        return;
    }
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.seq = r->seq;
    rep.payload = r->payload;
    /* As stream.h advises handlers that stream a lot: write_async (packed
     * before it returns; the worker sends what its callbacks queued as one
     * list), the blocking write only when VRPC_STREAM_ASYNC_WRITES_MAX are
     * outstanding. */
    pthread_mutex_lock(&c->mu);
    if (!c->finished) {
        int rc = vrpc_server_stream_write_async(s, &rep.base, echoed, c);
        if (rc == -EAGAIN)
            rc = vrpc_server_stream_write(s, &rep.base);
        if (rc != 0)
            c->stop = true;
    }
    pthread_mutex_unlock(&c->mu);
}

static void s_cancel(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct sctx *c = vrpc_server_stream_ctx(s);
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    bool pumping = c->pumping;
    pthread_mutex_unlock(&c->mu);
    if (pumping) {
        pump(c); /* finishes once its writes completed */
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->finished) {
        c->finished = true;
        vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
    }
    pthread_mutex_unlock(&c->mu);
}

static void s_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct sctx *c = vrpc_server_stream_ctx(s);
    pthread_mutex_lock(&c->mu);
    if (!c->finished && !c->pumping) {
        c->finished = true;
        vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
    }
    pthread_mutex_unlock(&c->mu);
}

static const struct vrpc_server_stream_ops g_ops = {s_start, s_read, s_half_close, s_cancel};

static struct vrpc_server *server_start(char *uri, size_t len)
{
    struct vrpc_server_opts o;
    struct vrpc_server *s;
    char listen[VRPC_URI_MAX];
    int rc;
    bool v6 = strchr(g.server_ip, ':') != NULL;
    vrpc_server_opts_init(&o);
    o.stream_window = g.window;
    o.no_spin = g.no_spin;
    o.threads = g.threads;
    snprintf(listen, sizeof(listen), "%s://%s%s%s:0", g.backend, v6 ? "[" : "", g.server_ip, v6 ? "]" : "");
    if ((rc = vrpc_server_create(&o, &s)) || (rc = vrpc_server_register_stream(s, &m_sstream, &g_ops, NULL)) ||
        (rc = vrpc_server_register_stream(s, &m_bidi, &g_ops, NULL)) ||
        (g.on_poller && ((rc = vrpc_server_run_on_poller(s, m_sstream.full_name)) ||
                         (rc = vrpc_server_run_on_poller(s, m_bidi.full_name)))) ||
        (rc = vrpc_server_start(s, listen)) ||
        (rc = vrpc_server_uri(s, uri, len))) {
        fprintf(stderr, "rpc_bench_stream: server on %s: %s\n", listen, strerror(-rc));
        exit(1);
    }
    return s;
}

static void server_destroy(struct vrpc_server *s)
{
    vrpc_server_destroy(s);
    while (g_ctxs) {
        struct sctx *c = g_ctxs;
        g_ctxs = c->next;
        pthread_mutex_destroy(&c->mu);
        free(c);
    }
}

/* ---- the client --------------------------------------------------------------------- */

static unsigned long g_reads; /* atomic: messages read, every stream */

static void c_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    (void)s;
    (void)msg;
    (void)arg;
    __atomic_add_fetch(&g_reads, 1, __ATOMIC_RELAXED);
}

static void c_done(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    (void)s;
    (void)st;
    (void)resp;
    (void)arg;
}

static const struct vrpc_stream_cbs g_cbs = {c_read, c_done, NULL};

enum shape { ONEWAY_SYNC, ONEWAY, BIDI };

struct reader {
    struct vrpc_stream *s;
    volatile bool stop;
};

static void *sync_reader(void *arg)
{
    struct reader *r = arg;
    ProtobufCMessage *m;
    while (!r->stop && vrpc_stream_read(r->s, &m) == 0)
        __atomic_add_fetch(&g_reads, 1, __ATOMIC_RELAXED);
    return NULL;
}

/* The bidi client's writes: as the server's pump (and as stream.h advises
 * writers that stream a lot), write_async refilled from the write callbacks
 * (they run on the stream's task, between its read callbacks), up to
 * VRPC_STREAM_ASYNC_WRITES_MAX outstanding; the first write of each stream
 * comes from the case itself. No thread spins or sleeps for room. */
struct bidi_writer {
    size_t size;
    volatile bool stop;
    unsigned long seq; /* atomic */
};

static void bidi_refill(struct vrpc_stream *s, struct bidi_writer *w);

static void wrote_c(struct vrpc_stream *s, int rc, void *arg)
{
    struct bidi_writer *w = arg;
    if (rc == 0)
        bidi_refill(s, w);
}

/* Write until the stream has VRPC_STREAM_ASYNC_WRITES_MAX outstanding (or
 * the case stops): 0, or the first error other than -EAGAIN. */
static int bidi_write(struct vrpc_stream *s, struct bidi_writer *w)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.seq = __atomic_fetch_add(&w->seq, 1, __ATOMIC_RELAXED);
    r.payload.data = g_payload;
    r.payload.len = w->size;
    return vrpc_stream_write_async(s, &r.base, wrote_c, w);
}

static void bidi_refill(struct vrpc_stream *s, struct bidi_writer *w)
{
    while (!w->stop && bidi_write(s, w) == 0)
        ;
}

static struct vrpc_channel *channel_open(const char *uri)
{
    struct vrpc_channel_opts co;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&co);
    co.src_addr = g.client_ip;
    co.stream_window = g.window;
    co.no_spin = g.no_spin;
    co.threads = g.threads;
    if (vrpc_channel_create(uri, &co, &ch) || vrpc_channel_connect(ch, 10000)) {
        fprintf(stderr, "rpc_bench_stream: cannot connect to %s\n", uri);
        exit(1);
    }
    return ch;
}

/* One measurement: messages per second read by the client, on a channel
 * (connection) of its own, so that no case inherits another's state. */
/* Context switches of the whole process (client and server), voluntary and
 * not: per message, beside each case's rate. */
static long ctx_switches(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_nvcsw + ru.ru_nivcsw;
}

static double stream_case(const char *uri, enum shape shape, size_t size, unsigned nstreams, double *cs_per_msg)
{
    struct vrpc_channel *ch = channel_open(uri);
    struct vrpc_stream *s[STREAMS_MAX];
    struct reader rd = {0};
    struct bidi_writer bw = {size, false, 0};
    pthread_t th;
    for (unsigned i = 0; i < nstreams; i++) {
        struct vrpc_stream_opts o = {
            .call = {.timeout_us = VRPC_NO_TIMEOUT, .flags = g.on_poller ? VRPC_CALL_CB_ON_POLLER : 0},
            .cbs = shape == ONEWAY_SYNC ? NULL : &g_cbs};
        if (vrpc_stream_start(ch, shape == BIDI ? &m_bidi : &m_sstream, &o, &s[i]) != 0) {
            fprintf(stderr, "rpc_bench_stream: cannot open a stream\n");
            exit(1);
        }
        if (shape != BIDI) {
            Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
            req.payload.data = g_payload;
            req.payload.len = size;
            if (vrpc_stream_write(s[i], &req.base) || vrpc_stream_close_send(s[i])) {
                fprintf(stderr, "rpc_bench_stream: the stream's request failed\n");
                exit(1);
            }
        }
    }
    if (shape == ONEWAY_SYNC) {
        rd.s = s[0];
        pthread_create(&th, NULL, sync_reader, &rd);
    } else if (shape == BIDI) {
        for (unsigned i = 0; i < nstreams; i++) /* its callback writes the rest */
            if (bidi_write(s[i], &bw) != 0) {
                fprintf(stderr, "rpc_bench_stream: the first bidi write failed\n");
                exit(1);
            }
    }
    usleep(100000); /* warm up */
    unsigned long r0 = __atomic_load_n(&g_reads, __ATOMIC_RELAXED);
    long cs0 = ctx_switches();
    uint64_t t0 = vrpc_bench_now_ns();
    usleep(g.duration_ms * 1000u);
    unsigned long r1 = __atomic_load_n(&g_reads, __ATOMIC_RELAXED);
    uint64_t t1 = vrpc_bench_now_ns();
    long cs1 = ctx_switches();
    *cs_per_msg = r1 > r0 ? (double)(cs1 - cs0) / (double)(r1 - r0) : 0;
    rd.stop = true;
    bw.stop = true;
    for (unsigned i = 0; i < nstreams; i++)
        vrpc_stream_cancel(s[i]); /* wakes a blocked sync read */
    if (shape == ONEWAY_SYNC)
        pthread_join(th, NULL);
    for (unsigned i = 0; i < nstreams; i++)
        vrpc_stream_destroy(s[i]);
    vrpc_channel_destroy(ch);
    return (double)(r1 - r0) * 1e9 / (double)(t1 - t0);
}

/* ---- gRPC (grpc_stream_bench, beside this program) ------------------------------------- */

/* [shape 0 server streaming, 1 bidi][size 32, 4096][streams 1, 16] */
struct grpc_res {
    double r[2][2][2];
    bool have;
    char impl[64];
};

static int size_idx(unsigned size) { return size == 32 ? 0 : size == 4096 ? 1 : -1; }
static int streams_idx(unsigned n) { return n == 1 ? 0 : n == 16 ? 1 : -1; }

static void run_grpc(struct grpc_res *gr)
{
    char self[4096], cmd[4400], line[1024];
    ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);
    memset(gr, 0, sizeof(*gr));
    if (g.no_grpc || l <= 0)
        return;
    self[l] = 0;
    char *slash = strrchr(self, '/');
    if (!slash)
        return;
    *slash = 0;
    snprintf(cmd, sizeof(cmd), "%s/grpc_stream_bench", self);
    if (access(cmd, X_OK) != 0)
        return;
    snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), " --run --json --duration-ms %u --server-ip %s",
             g.duration_ms, g.server_ip);
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    while (fgets(line, sizeof(line), p)) {
        char shape[16];
        unsigned size, n;
        char *q;
        if (sscanf(line, "{\"name\":\"baseline:grpc_stream_%15[a-z]_%uB_s%u\"", shape, &size, &n) != 3)
            continue;
        int sh = !strcmp(shape, "server") ? 0 : !strcmp(shape, "bidi") ? 1 : -1;
        int si = size_idx(size), ni = streams_idx(n);
        if (sh < 0 || si < 0 || ni < 0 || !(q = strstr(line, "\"ops_per_s\":")))
            continue;
        gr->r[sh][si][ni] = atof(q + 12);
        gr->have = true;
        if ((q = strstr(line, "\"impl\":\"")))
            sscanf(q + 8, "%63[^\"]", gr->impl);
    }
    pclose(p);
}

/* ---- rounds, ratios, targets ------------------------------------------------------------ */

enum { C_SYNC1, C_ASYNC1, C_ASYNC16, C_BIDI1, C_BIDI16, C_N };
static const char *const case_names[C_N] = {"oneway_sync_s1", "oneway_s1", "oneway_s16", "bidi_s1", "bidi_s16"};
static const enum shape case_shape[C_N] = {ONEWAY_SYNC, ONEWAY, ONEWAY, BIDI, BIDI};
static const unsigned case_streams[C_N] = {1, 1, 16, 1, 16};

/* --only: the case's name as its report names it, "oneway_s1_32B". */
static bool case_selected(int c, unsigned size)
{
    char name[64];
    if (!g.only)
        return true;
    snprintf(name, sizeof(name), "%s_%uB", case_names[c], size);
    return strstr(name, g.only) != NULL;
}

struct round {
    double tp[2];       /* [size] */
    double v[2][C_N];   /* [size][case] */
    struct grpc_res gr; /* this round's gRPC */
};

static double median(double *v, unsigned n)
{
    for (unsigned i = 1; i < n; i++)
        for (unsigned j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n ? v[n / 2] : VRPC_BENCH_NONE;
}

static void report_ratio(const char *name, double *per_round, unsigned n, double target)
{
    char extra[256];
    double m = median(per_round, n);
    snprintf(extra, sizeof(extra), "\"backend\":\"%s\",\"ratio\":%.3f,\"target\":%.1f,\"met\":%s,\"rounds\":%u",
             g.backend, m, target, m >= target ? "true" : "false", n);
    if (g.bo.json) {
        vrpc_bench_report(&g.bo, name, VRPC_BENCH_NONE, VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
    } else {
        printf("%-44s %8.3f  (target >= %.1f: %s, median of %u rounds)\n", name, m, target,
               m >= target ? "met" : "NOT met", n);
        fflush(stdout);
    }
}

static void one_round(const char *uri, unsigned round, struct round *r)
{
    static const unsigned sizes[2] = {32, 4096};
    char name[96], extra[192];
    for (int si = 0; si < 2; si++) {
        bool any = false;
        for (int c = 0; c < C_N; c++)
            any |= case_selected(c, sizes[si]);
        if (!any)
            continue;
        r->tp[si] = g.no_baseline
                        ? VRPC_BENCH_NONE
                        : vrpc_bench_tp_rate(g.backend, g.server_ip, g.client_ip, sizes[si], g.duration_ms / 1000.0);
        snprintf(name, sizeof(name), "baseline:transport_%s_oneway_%uB", g.backend, sizes[si]);
        snprintf(extra, sizeof(extra), "\"backend\":\"%s\",\"payload\":%u,\"round\":%u", g.backend, sizes[si], round);
        if (!g.no_baseline)
            vrpc_bench_report(&g.bo, name, r->tp[si], VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
        for (int c = 0; c < C_N; c++) {
            if (!case_selected(c, sizes[si]))
                continue;
            double cs;
            r->v[si][c] = stream_case(uri, case_shape[c], sizes[si], case_streams[c], &cs);
            snprintf(name, sizeof(name), "rpc:stream_%s_%uB", case_names[c], sizes[si]);
            snprintf(extra, sizeof(extra),
                     "\"backend\":\"%s\",\"payload\":%u,\"streams\":%u,\"round\":%u,\"cs_per_msg\":%.3f", g.backend,
                     sizes[si], case_streams[c], round, cs);
            vrpc_bench_report(&g.bo, name, r->v[si][c], VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
        }
    }
    if (!g.only)
        run_grpc(&r->gr);
    for (int sh = 0; sh < 2 && r->gr.have; sh++)
        for (int si = 0; si < 2; si++)
            for (int ni = 0; ni < 2; ni++) {
                snprintf(name, sizeof(name), "baseline:grpc_stream_%s_%uB_s%u", sh ? "bidi" : "server", sizes[si],
                         ni ? 16u : 1u);
                snprintf(extra, sizeof(extra), "\"payload\":%u,\"streams\":%u,\"round\":%u,\"impl\":\"%s\"", sizes[si],
                         ni ? 16u : 1u, round, r->gr.impl);
                vrpc_bench_report(&g.bo, name, r->gr.r[sh][si][ni], VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
            }
}

static void summarise(struct round *r, unsigned n)
{
    static const unsigned sizes[2] = {32, 4096};
    double v[ROUNDS_MAX];
    char name[96];
    for (int si = 0; si < 2; si++) {
        /* one stream against the transport: the better of sync and async reads
         * (of those run; an unselected case's rate stays 0) */
        if (case_selected(C_SYNC1, sizes[si]) || case_selected(C_ASYNC1, sizes[si])) {
            for (unsigned k = 0; k < n; k++)
                v[k] = (r[k].v[si][C_SYNC1] > r[k].v[si][C_ASYNC1] ? r[k].v[si][C_SYNC1] : r[k].v[si][C_ASYNC1]) /
                       r[k].tp[si];
            snprintf(name, sizeof(name), "ratio:stream_s1_vs_transport_%uB", sizes[si]);
            report_ratio(name, v, n, 0.8);
        }
        if (case_selected(C_ASYNC16, sizes[si])) {
            for (unsigned k = 0; k < n; k++)
                v[k] = r[k].v[si][C_ASYNC16] / r[k].tp[si];
            snprintf(name, sizeof(name), "ratio:stream_s16_vs_transport_%uB", sizes[si]);
            report_ratio(name, v, n, 0.8);
        }
        if (!r[0].gr.have)
            continue;
        static const struct {
            const char *label;
            int c, sh, ni;
        } cmp[] = {{"server_s1", C_ASYNC1, 0, 0},
                   {"server_s16", C_ASYNC16, 0, 1},
                   {"bidi_s1", C_BIDI1, 1, 0},
                   {"bidi_s16", C_BIDI16, 1, 1}};
        for (unsigned j = 0; j < sizeof(cmp) / sizeof(cmp[0]); j++) {
            unsigned m = 0;
            for (unsigned k = 0; k < n; k++)
                if (r[k].gr.have && r[k].gr.r[cmp[j].sh][si][cmp[j].ni] > 0)
                    v[m++] = r[k].v[si][cmp[j].c] / r[k].gr.r[cmp[j].sh][si][cmp[j].ni];
            snprintf(name, sizeof(name), "ratio:stream_%s_vs_grpc_%uB", cmp[j].label, sizes[si]);
            report_ratio(name, v, m, 5.0);
        }
    }
    if (!r[0].gr.have && !g.bo.json && !g.only)
        printf("(gRPC streaming baseline not run: grpc_stream_bench is built with libgrpc++-dev and\n"
               " protobuf-compiler-grpc, scripts/install-deps.sh --bench; or --no-grpc was given)\n");
}

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--json] [--quick] [--backend tcp|verbs] [--server-ip IP] [--client-ip IP]\n"
            "          [--duration-ms N] [--rounds N] [--window N] [--no-grpc] [--only SUBSTRING]\n"
            "          [--no-spin] [--no-baseline] [--threads N] [--on-poller]\n"
            "  verbrpc streaming message rates (one-way server streaming on 1 and 16 streams,\n"
            "  bidi echo) against the transport's one-way rate and gRPC C++ streaming,\n"
            "  measured in the same run, rounds alternating; targets on the median ratios\n"
            "  (>= 0.8 of the transport on one stream, >= 5x gRPC).\n"
            "  --only: the cases whose name (oneway_sync_s1, oneway_s1, oneway_s16, bidi_s1,\n"
            "  bidi_s16, then _32B or _4096B) contains SUBSTRING, with their sizes' transport\n"
            "  baselines; gRPC is not run. --no-spin: nothing busy-waits (for callgrind);\n"
            "  --no-baseline: no transport rate and no ratios. --threads: workers of the\n"
            "  server's and of each channel's own scheduler (default 0: the library's, 2).\n"
            "  --on-poller: the client's streams run their read callbacks and small writes on\n"
            "  the channel's poller (VRPC_CALL_CB_ON_POLLER) and the server runs both methods\n"
            "  on its poller (vrpc_server_run_on_poller), whenever a stream's task is idle.\n",
            argv0);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            g.bo.json = true;
        else if (!strcmp(a, "--quick"))
            g.bo.quick = true;
        else if (!strcmp(a, "--no-grpc"))
            g.no_grpc = true;
        else if (!strcmp(a, "--backend") && v)
            g.backend = argv[++i];
        else if (!strcmp(a, "--server-ip") && v)
            g.server_ip = argv[++i];
        else if (!strcmp(a, "--client-ip") && v)
            g.client_ip = argv[++i];
        else if (!strcmp(a, "--duration-ms") && v)
            g.duration_ms = (unsigned)atoi(argv[++i]);
        else if (!strcmp(a, "--rounds") && v)
            g.rounds = (unsigned)atoi(argv[++i]);
        else if (!strcmp(a, "--no-spin"))
            g.no_spin = true;
        else if (!strcmp(a, "--on-poller"))
            g.on_poller = true;
        else if (!strcmp(a, "--no-baseline"))
            g.no_baseline = true;
        else if (!strcmp(a, "--only") && v)
            g.only = argv[++i];
        else if (!strcmp(a, "--window") && v)
            g.window = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && v)
            g.threads = (unsigned)atoi(argv[++i]);
        else {
            bool help = !strcmp(a, "--help") || !strcmp(a, "-h");
            usage(help ? stdout : stderr, argv[0]);
            return help ? 0 : 2;
        }
    }
    if (g.bo.quick) {
        g.duration_ms = 200;
        g.rounds = 1;
    }
    if (g.rounds < 1 || g.rounds > ROUNDS_MAX || g.duration_ms < 50) {
        usage(stderr, argv[0]);
        return 2;
    }
    m_sstream.id = vrpc_method_id(m_sstream.full_name);
    m_bidi.id = vrpc_method_id(m_bidi.full_name);
    memset(g_payload, 0x5a, sizeof(g_payload));
    char uri[VRPC_URI_MAX];
    struct vrpc_server *srv = server_start(uri, sizeof(uri));
    if (!g.bo.json)
        printf("# rpc_bench_stream: backend %s, %u rounds of %u ms per case, stream window %u\n", g.backend, g.rounds,
               g.duration_ms, g.window ? g.window : VRPC_STREAM_WINDOW_DEFAULT);
    static struct round r[ROUNDS_MAX];
    for (unsigned k = 0; k < g.rounds; k++)
        one_round(uri, k, &r[k]);
    if (!g.no_baseline)
        summarise(r, g.rounds);
    else if (!g.bo.json) /* callgrind: instructions over messages, warm-up and teardown included */
        printf("# messages read in all: %lu\n", __atomic_load_n(&g_reads, __ATOMIC_RELAXED));
    server_destroy(srv);
    return 0;
}
