/* rpc_bench --payload LIST: bandwidth of large messages (rendezvous) through
 * verbrpc: unary calls carrying `size` bytes in the request (reply empty) at
 * 1 and 4 outstanding, against a plain blocking-socket stream of `size`-byte
 * frames (TCP only; on verbs, perftest's ib_read_bw/ib_send_bw run by
 * bench/softroce are the baselines). Rounds alternate baseline and RPC; each
 * case reports the median round, with bytes_per_s besides ops_per_s/p50/p99,
 * and CPU seconds per GiB moved (the whole process: both ends; steadier than
 * wall time on a shared machine), and a summary line gives RPC / baseline per
 * size (bandwidth: the better of 1 and 4 outstanding; CPU: 1 outstanding).
 * Both sides move the same bytes and check them the same way: every payload
 * starts with its own sequence number (so a stale buffer cannot pass) and
 * the receiver checks it plus one word per 4 KiB against the pattern; the
 * warm-up compares every byte. VRPC_BENCH_ROUNDS=N (odd, <= 15)
 * sets the number of alternating rounds (default 3). Placement
 * (cfg->ccpu/scpu) is the same for RPC and baseline: sender side on one CPU,
 * receiver side on the other. */
#define _GNU_SOURCE /* pthread_setaffinity_np, CPU_SET */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>
#include "common/bench.h"
#include "rpc/futex.h"
#include "rpc_bench_large.h"
#include "rpc_test.pb-c.h"

#define MAX_ROUNDS 15
#define MAX_SIZES 8
#define MAX_OUT 4

static struct vrpc_method_desc m_echo = {"/vrpctest.Test/Echo", 0, &vrpctest__echo_request__descriptor,
                                         &vrpctest__echo_reply__descriptor, NULL, VRPC_METHOD_UNARY};

static const struct rpc_bench_large_cfg *C;
static uint8_t *g_data;         /* the pattern; the sources below are copies of it */
static uint8_t *g_src[MAX_OUT]; /* one per outstanding call (its seq in front) */
static int ROUNDS = 3;
static int g_full;     /* atomic: check every byte (warm-up) */
static uint64_t g_bad; /* atomic: payloads that failed the check */

static uint8_t pat(size_t i) { return (uint8_t)(i * 131 + 7); }

/* Check a received payload: its sequence number, then every byte (full) or
 * one 8-byte word per 4 KiB against the pattern. Same on both sides. */
static bool payload_ok(const uint8_t *p, size_t len, uint64_t seq)
{
    uint64_t got;
    if (len < 64)
        return false;
    memcpy(&got, p, 8);
    if (got != seq)
        return false;
    if (__atomic_load_n(&g_full, __ATOMIC_RELAXED))
        return !memcmp(p + 8, g_data + 8, len - 8);
    for (size_t i = 4096; i + 8 <= len; i += 4096)
        if (memcmp(p + i, g_data + i, 8))
            return false;
    return !memcmp(p + len - 8, g_data + len - 8, 8);
}

struct res {
    double ops, p50, p99, bps;
    double cpu_per_gib; /* CPU seconds of the whole process (both ends) per GiB moved:
                           steadier than wall time on a shared machine */
};

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec +
           ((double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_usec) / 1e6;
}

static int cmp_res(const void *a, const void *b)
{
    double x = ((const struct res *)a)->bps, y = ((const struct res *)b)->bps;
    return x < y ? -1 : x > y;
}

static void label(char *out, size_t len, size_t size)
{
    if (size % (1u << 20) == 0)
        snprintf(out, len, "%zuMiB", size >> 20);
    else if (size % 1024 == 0)
        snprintf(out, len, "%zuKiB", size >> 10);
    else
        snprintf(out, len, "%zuB", size);
}

static void report(const char *name, size_t size, unsigned out, const struct res *r)
{
    char extra[256];
    snprintf(extra, sizeof(extra),
             "\"backend\":\"%s\",\"payload\":%zu,\"outstanding\":%u,\"rounds\":%d,\"bytes_per_s\":%.0f,"
             "\"cpu_s_per_GiB\":%.3f",
             C->backend, size, out, ROUNDS, r->bps, r->cpu_per_gib);
    vrpc_bench_report(C->bo, name, r->ops, r->p50, r->p99, extra);
}

/* ---- the server: mode 1 answers empty (upload), else echoes ---------------- */

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    if (!payload_ok(r->payload.data, r->payload.len, r->seq))
        __atomic_add_fetch(&g_bad, 1, __ATOMIC_RELAXED);
    if (r->mode != 1)
        rep.payload = r->payload;
    rep.seq = r->seq;
    vrpc_server_call_respond(call, &rep.base);
}

/* ---- RPC cases ------------------------------------------------------------ */

struct win {
    struct vrpc_channel *ch;
    size_t size;
    int stop;
    uint64_t outstanding, n, cap;
    uint64_t *lat;
    uint32_t idle;
};

struct slot {
    struct win *w;
    uint64_t t0, seq;
    uint8_t *src;
};

static void start(struct slot *s);

static void done(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct slot *s = arg;
    struct win *w = s->w;
    (void)resp;
    if (st->code != VRPC_OK) {
        fprintf(stderr, "rpc_bench: large call failed: %s: %s\n", vrpc_code_name(st->code), st->message);
        exit(1);
    }
    uint64_t k = __atomic_fetch_add(&w->n, 1, __ATOMIC_RELAXED);
    if (k < w->cap)
        w->lat[k] = vrpc_bench_now_ns() - s->t0;
    if (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
        start(s);
    } else if (__atomic_sub_fetch(&w->outstanding, 1, __ATOMIC_ACQ_REL) == 0) {
        __atomic_store_n(&w->idle, 1, __ATOMIC_RELEASE);
        vrpc_futex_wake_all(&w->idle);
    }
}

/* The request stays valid until the callback (VRPC_CALL_REQ_HELD): src is
 * this slot's own, rewritten only by the next start, from the callback. */
static void start(struct slot *s)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    struct vrpc_call_opts o = {.flags = VRPC_CALL_REQ_HELD};
    s->seq += MAX_OUT;
    memcpy(s->src, &s->seq, 8);
    r.payload.data = s->src;
    r.payload.len = s->w->size;
    r.seq = s->seq;
    r.mode = 1;
    s->t0 = vrpc_bench_now_ns();
    if (vrpc_call_async(s->w->ch, &m_echo, &r.base, &o, done, s)) {
        fprintf(stderr, "rpc_bench: vrpc_call_async refused\n");
        exit(1);
    }
}

/* 1 outstanding: synchronous calls from this thread. */
static void sync_loop(struct win *w, uint64_t t0)
{
    uint64_t seq = 0;
    uint8_t *src = g_src[0];
    while (vrpc_bench_now_ns() - t0 < (uint64_t)C->duration_ms * 1000000) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        ProtobufCMessage *resp;
        struct vrpc_status st;
        seq += MAX_OUT;
        memcpy(src, &seq, 8);
        r.payload.data = src;
        r.payload.len = w->size;
        r.seq = seq;
        r.mode = 1;
        uint64_t c0 = vrpc_bench_now_ns();
        if (vrpc_call(w->ch, &m_echo, &r.base, &resp, NULL, &st) != VRPC_OK) {
            fprintf(stderr, "rpc_bench: large call failed: %s: %s\n", vrpc_code_name(st.code), st.message);
            exit(1);
        }
        if (w->n < w->cap)
            w->lat[w->n] = vrpc_bench_now_ns() - c0;
        w->n++;
    }
}

/* One round: outstanding 1 is a loop of synchronous calls, more are async
 * calls with VRPC_CALL_REQ_HELD, each restarted from its callback. */
static struct res rpc_round(struct vrpc_channel *ch, size_t size, unsigned outstanding)
{
    struct win w = {.ch = ch, .size = size, .outstanding = outstanding, .cap = 1000000};
    struct slot s[MAX_OUT];
    w.lat = malloc(w.cap * sizeof(*w.lat));
    double c0 = cpu_s();
    uint64_t t0 = vrpc_bench_now_ns();
    if (outstanding == 1)
        sync_loop(&w, t0);
    for (unsigned i = 0; outstanding > 1 && i < outstanding; i++) {
        s[i].w = &w;
        s[i].seq = i;
        s[i].src = g_src[i];
        start(&s[i]);
    }
    while (outstanding > 1 && vrpc_bench_now_ns() - t0 < (uint64_t)C->duration_ms * 1000000)
        usleep(2000);
    __atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
    while (outstanding > 1 && !__atomic_load_n(&w.idle, __ATOMIC_ACQUIRE))
        vrpc_futex_wait(&w.idle, 0);
    uint64_t t1 = vrpc_bench_now_ns();
    double c1 = cpu_s();
    uint64_t n = w.n < w.cap ? w.n : w.cap;
    struct vrpc_bench_samples smp = {.v = w.lat, .n = n, .cap = n};
    struct res r;
    r.ops = (double)w.n * 1e9 / (double)(t1 - t0);
    r.bps = r.ops * (double)size;
    r.p50 = vrpc_bench_pct_us(&smp, 50);
    r.p99 = vrpc_bench_pct_us(&smp, 99);
    r.cpu_per_gib = w.n ? (c1 - c0) / ((double)w.n * (double)size / (1u << 30)) : 0;
    free(w.lat);
    return r;
}

/* Pin the calling thread to cpu (-1: leave it as it is). */
static void pin_to(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
}

static uint64_t cpu_bit(int cpu) { return cpu >= 0 && cpu < 64 ? 1ull << cpu : 0; }

/* ---- baseline: blocking-socket stream of size-byte frames ---------------- */

struct sink {
    int lfd;
    size_t size;
    atomic_ulong frames;
    pthread_t th;
};

static int full(int fd, void *buf, size_t len, bool wr)
{
    size_t d = 0;
    while (d < len) {
        ssize_t k = wr ? send(fd, (char *)buf + d, len - d, MSG_NOSIGNAL) : recv(fd, (char *)buf + d, len - d, 0);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return -1;
        }
        d += (size_t)k;
    }
    return 0;
}

static void *sink_main(void *arg)
{
    struct sink *s = arg;
    pin_to(C->scpu);
    uint8_t *buf = malloc(s->size);
    int fd = accept(s->lfd, NULL, NULL);
    for (uint64_t seq = 1;; seq++) {
        uint32_t len;
        if (full(fd, &len, 4, false) || len != s->size || full(fd, buf, len, false))
            break;
        if (!payload_ok(buf, len, seq))
            __atomic_add_fetch(&g_bad, 1, __ATOMIC_RELAXED);
        atomic_fetch_add_explicit(&s->frames, 1, memory_order_relaxed);
    }
    close(fd);
    free(buf);
    return NULL;
}

static struct res stream_round(size_t size)
{
    struct sink s = {.size = size};
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof(a);
    int one = 1;
    atomic_init(&s.frames, 0);
    inet_pton(AF_INET, C->server_ip, &a.sin_addr);
    s.lfd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(s.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (s.lfd < 0 || bind(s.lfd, (void *)&a, al) || listen(s.lfd, 1) || getsockname(s.lfd, (void *)&a, &al)) {
        perror("rpc_bench: baseline listen");
        exit(1);
    }
    pthread_create(&s.th, NULL, sink_main, &s);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (void *)&a, al)) {
        perror("rpc_bench: baseline connect");
        exit(1);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint32_t len = (uint32_t)size;
    uint64_t dur = (uint64_t)C->duration_ms * 1000000, t0 = vrpc_bench_now_ns(), seq = 0;
    uint8_t *src = g_src[0];
    while (vrpc_bench_now_ns() - t0 < dur / 10) { /* warm-up */
        seq++;
        memcpy(src, &seq, 8);
        if (full(fd, &len, 4, true) || full(fd, src, size, true))
            break;
    }
    unsigned long f0 = atomic_load(&s.frames);
    double c0 = cpu_s();
    t0 = vrpc_bench_now_ns();
    while (vrpc_bench_now_ns() - t0 < dur) {
        seq++;
        memcpy(src, &seq, 8);
        if (full(fd, &len, 4, true) || full(fd, src, size, true))
            break;
    }
    unsigned long f1 = atomic_load(&s.frames);
    uint64_t t1 = vrpc_bench_now_ns();
    double c1 = cpu_s();
    shutdown(fd, SHUT_WR);
    pthread_join(s.th, NULL);
    close(fd);
    close(s.lfd);
    struct res r = {.p50 = VRPC_BENCH_NONE, .p99 = VRPC_BENCH_NONE};
    r.ops = (double)(f1 - f0) * 1e9 / (double)(t1 - t0);
    r.bps = r.ops * (double)size;
    r.cpu_per_gib = f1 > f0 ? (c1 - c0) / ((double)(f1 - f0) * (double)size / (1u << 30)) : 0;
    return r;
}

/* ---- driver ------------------------------------------------------------------ */

int rpc_bench_large(const struct rpc_bench_large_cfg *cfg)
{
    size_t sizes[MAX_SIZES], nsizes = 0, max = 0;
    C = cfg;
    for (const char *p = cfg->payloads; p && *p && nsizes < MAX_SIZES;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v == 0 || v > VRPC_MSG_SIZE_MAX - 4096) {
            fprintf(stderr, "rpc_bench: bad --payload list '%s' (sizes in bytes, comma-separated)\n", cfg->payloads);
            return 2;
        }
        sizes[nsizes++] = (size_t)v;
        if (v > max)
            max = (size_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (!nsizes)
        return 2;
    const char *er = getenv("VRPC_BENCH_ROUNDS");
    if (er && atoi(er) >= 1)
        ROUNDS = atoi(er) > MAX_ROUNDS ? MAX_ROUNDS : atoi(er);
    m_echo.id = vrpc_method_id(m_echo.full_name);
    g_data = malloc(max);
    if (!g_data)
        return 1;
    for (size_t i = 0; i < max; i++)
        g_data[i] = pat(i);
    for (int i = 0; i < MAX_OUT; i++) {
        if (!(g_src[i] = malloc(max)))
            return 1;
        memcpy(g_src[i], g_data, max);
    }
    bool tcp = !strcmp(cfg->backend, "tcp");

    uint32_t limit = (uint32_t)max + 4096;
    uint64_t pinned = (uint64_t)limit * 12 + (64u << 20); /* 4 in flight each way, plus slack */
    struct vrpc_server_opts so;
    struct vrpc_server *srv;
    char listen[VRPC_URI_MAX], uri[VRPC_URI_MAX];
    vrpc_server_opts_init(&so);
    so.max_msg_size = limit;
    so.max_pinned = pinned;
    so.cpu_mask = cpu_bit(cfg->scpu);
    so.no_spin = cfg->no_spin;
    snprintf(listen, sizeof(listen), "%s://%s:0", cfg->backend, cfg->server_ip);
    int rc;
    if ((rc = vrpc_server_create(&so, &srv)) || (rc = vrpc_server_register(srv, &m_echo, h_echo, NULL)) ||
        (rc = vrpc_server_start(srv, listen)) || (rc = vrpc_server_uri(srv, uri, sizeof(uri)))) {
        fprintf(stderr, "rpc_bench: server on %s: %s\n", listen, strerror(-rc));
        return 1;
    }
    struct vrpc_channel_opts co;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&co);
    co.max_msg_size = limit;
    co.max_pinned = pinned;
    co.cpu_mask = cpu_bit(cfg->ccpu);
    co.no_spin = cfg->no_spin;
    pin_to(cfg->ccpu); /* the caller and the stream's sender */
    co.src_addr = cfg->client_ip;
    if ((rc = vrpc_channel_create(uri, &co, &ch)) || (rc = vrpc_channel_connect(ch, 10000))) {
        fprintf(stderr, "rpc_bench: channel to %s: %s\n", uri, strerror(-rc));
        return 1;
    }

    if (cfg->bo->json)
        printf("{\"name\":\"info:placement\",\"ops_per_s\":null,\"p50_us\":null,\"p99_us\":null,"
               "\"placement\":\"%s\",\"client_cpu\":%d,\"server_cpu\":%d,\"rounds\":%d}\n",
               cfg->ccpu >= 0 ? "split" : "none", cfg->ccpu, cfg->scpu, ROUNDS);
    else if (cfg->ccpu >= 0)
        printf("placement split: client side (caller, channel threads, stream sender) on CPU %d, server side "
               "(server threads, stream sink) on CPU %d; %d alternating rounds\n",
               cfg->ccpu, cfg->scpu, ROUNDS);
    else
        printf("placement none: threads unpinned; %d alternating rounds\n", ROUNDS);
    if (!cfg->bo->json)
        printf("RPC: 1 outstanding = synchronous vrpc_call in a loop; 4 outstanding = vrpc_call_async with "
               "VRPC_CALL_REQ_HELD (the request valid until its callback), so on TCP both send the payload "
               "from the caller's memory\n");
    fflush(stdout);
    char summary[1024];
    int sl = snprintf(summary, sizeof(summary), "\"backend\":\"%s\"", cfg->backend);
    for (size_t i = 0; i < nsizes; i++) {
        size_t size = sizes[i];
        char lab[32], name[96];
        struct res base[MAX_ROUNDS], r1[MAX_ROUNDS], r4[MAX_ROUNDS];
        label(lab, sizeof(lab), size);
        __atomic_store_n(&g_full, 1, __ATOMIC_RELAXED);
        rpc_round(ch, size, 1); /* warm-up: fills both sides' buffer caches */
        if (tcp)
            stream_round(size);
        __atomic_store_n(&g_full, 0, __ATOMIC_RELAXED);
        for (int r = 0; r < ROUNDS; r++) {
            if (tcp)
                base[r] = stream_round(size);
            r1[r] = rpc_round(ch, size, 1);
            r4[r] = rpc_round(ch, size, 4);
        }
        qsort(r1, ROUNDS, sizeof(r1[0]), cmp_res);
        qsort(r4, ROUNDS, sizeof(r4[0]), cmp_res);
        snprintf(name, sizeof(name), "rpc:upload_%s_out1", lab);
        report(name, size, 1, &r1[ROUNDS / 2]);
        snprintf(name, sizeof(name), "rpc:upload_%s_out4", lab);
        report(name, size, 4, &r4[ROUNDS / 2]);
        if (tcp) {
            qsort(base, ROUNDS, sizeof(base[0]), cmp_res);
            snprintf(name, sizeof(name), "baseline:tcp_stream_%s", lab);
            report(name, size, 1, &base[ROUNDS / 2]);
            double best = r4[ROUNDS / 2].bps > r1[ROUNDS / 2].bps ? r4[ROUNDS / 2].bps : r1[ROUNDS / 2].bps;
            sl += snprintf(summary + sl, sizeof(summary) - (size_t)sl,
                           ",\"rpc_over_tcp_stream_%s\":%.2f,\"rpc_cpu_per_byte_over_tcp_stream_%s\":%.2f"
                           ",\"rpc_out4_cpu_per_byte_over_tcp_stream_%s\":%.2f",
                           lab, best / base[ROUNDS / 2].bps, lab, r1[ROUNDS / 2].cpu_per_gib / base[ROUNDS / 2].cpu_per_gib,
                           lab, r4[ROUNDS / 2].cpu_per_gib / base[ROUNDS / 2].cpu_per_gib);
        }
    }
    if (cfg->bo->json)
        printf("{\"name\":\"summary:large_%s\",\"ops_per_s\":null,\"p50_us\":null,\"p99_us\":null,%s}\n", cfg->backend,
               summary);
    else
        printf("summary (large, %s): %s\ntarget: >= 0.70 of the TCP stream at 1 MiB and above (verbs: >= 0.80 of "
               "ib_read_bw, bench/softroce)\n",
               cfg->backend, summary);
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(srv);
    free(g_data);
    for (int i = 0; i < MAX_OUT; i++)
        free(g_src[i]);
    if (__atomic_load_n(&g_bad, __ATOMIC_RELAXED)) {
        fprintf(stderr, "rpc_bench: %llu payloads arrived damaged\n",
                (unsigned long long)__atomic_load_n(&g_bad, __ATOMIC_RELAXED));
        return 1;
    }
    return 0;
}
