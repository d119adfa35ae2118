/* read_bench: vrpc_ep_read throughput and latency on one backend
 * (--backend tcp|verbs) for large payloads, with a plain blocking-socket
 * stream of the same message sizes as the baseline, measured in alternating
 * rounds of the same run (the machine is shared and noisy: the median round
 * is reported, and the ratio to the baseline's median).
 *
 * The reader keeps --depth reads (default 2) of one granted large buffer in
 * flight, each into its own large buffer, reissuing from its CQ callback;
 * latency is from vrpc_ep_read to its completion. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <verbrpc/transport.h>

#include "common/bench.h"

#define ROUNDS 3
#define MAX_DEPTH 8

static struct {
    struct vrpc_bench_opts o;
    const char *backend, *ip;
    double secs;
    unsigned depth;
} g;

static void die(const char *what, int rc)
{
    fprintf(stderr, "read_bench: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    exit(1);
}

struct result {
    double bytes_per_s, ops, p50, p99;
    double cpu_ns_per_kib; /* user + system CPU of the whole process (both sides) per KiB moved */
};

/* CPU time of the process (every thread), ns: less sensitive than wall time
 * to the other work sharing this machine. */
static uint64_t cpu_ns(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return ((uint64_t)u.ru_utime.tv_sec + (uint64_t)u.ru_stime.tv_sec) * 1000000000u +
           ((uint64_t)u.ru_utime.tv_usec + (uint64_t)u.ru_stime.tv_usec) * 1000u;
}

static int by_bw(const void *a, const void *b)
{
    const struct result *x = a, *y = b;
    return x->bytes_per_s < y->bytes_per_s ? -1 : x->bytes_per_s > y->bytes_per_s;
}

/* ---- the transport's read ---- */

struct reader {
    struct vrpc_ep *ep;
    struct vrpc_buf *dst[MAX_DEPTH];
    uint64_t start[MAX_DEPTH];
    uint64_t raddr, until;
    uint32_t key, size;
    struct vrpc_bench_samples lat;
    unsigned long done;
    unsigned inflight;
    int err;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_bool accepted;
    struct vrpc_ep *sep;
};

static void issue(struct reader *r, unsigned i)
{
    int rc;
    r->start[i] = vrpc_bench_now_ns();
    rc = vrpc_ep_read(r->ep, r->dst[i], 0, r->size, r->raddr, r->key, i);
    if (rc)
        die("vrpc_ep_read", rc);
    r->inflight++;
}

static void client_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct reader *r = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        if (w->opcode != VRPC_WC_READ)
            continue;
        pthread_mutex_lock(&r->mu);
        r->inflight--;
        if (w->status && !r->err)
            r->err = w->status;
        if (!w->status) {
            uint64_t now = vrpc_bench_now_ns();
            r->done++;
            if (r->lat.n < r->lat.cap)
                vrpc_bench_samples_add(&r->lat, now - r->start[w->wr_id]);
            if (now < r->until && !r->err)
                issue(r, (unsigned)w->wr_id);
        }
        if (!r->inflight)
            pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
}

static void server_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct reader *r = arg;
    for (unsigned i = 0; i < n; i++)
        if (wc[i].opcode == VRPC_WC_ACCEPTED) {
            r->sep = wc[i].ep;
            atomic_store(&r->accepted, true);
        }
}

static struct result bench_read(uint32_t size)
{
    struct vrpc_transport *st, *ct;
    struct vrpc_cq *scq, *ccq;
    struct vrpc_cq_attr ca;
    struct vrpc_listen_attr la;
    struct vrpc_listener *l;
    struct vrpc_ep_attr ea;
    struct vrpc_pool *sp, *cp;
    struct vrpc_buf *src;
    struct reader r;
    struct result res;
    char uri[VRPC_URI_MAX];
    uint64_t t0, t1, c0, c1;
    bool v6 = strchr(g.ip, ':') != NULL;
    unsigned i;
    int rc;

    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    vrpc_bench_samples_init(&r.lat, 1u << 16);
    if ((rc = vrpc_transport_create(g.backend, NULL, &st)) || (rc = vrpc_transport_create(g.backend, NULL, &ct)))
        die("transport", rc);
    if ((rc = vrpc_pool_create(st, vrpc_transport_eager_size(st), 8, &sp)) ||
        (rc = vrpc_pool_create(ct, vrpc_transport_eager_size(ct), 8, &cp)))
        die("pool", rc);
    vrpc_cq_attr_init(&ca);
    ca.cb = server_cb;
    ca.cb_arg = &r;
    if ((rc = vrpc_cq_create(st, &ca, &scq)))
        die("cq", rc);
    ca.cb = client_cb;
    if ((rc = vrpc_cq_create(ct, &ca, &ccq)))
        die("cq", rc);
    for (i = 0; i < 8; i++) {
        struct vrpc_buf *b = vrpc_pool_get(sp), *c = vrpc_pool_get(cp);
        if ((rc = vrpc_cq_post_recv(scq, &b, NULL, 1)) || (rc = vrpc_cq_post_recv(ccq, &c, NULL, 1)))
            die("post", rc);
    }
    memset(&la, 0, sizeof la);
    la.cqs = &scq;
    la.ncqs = 1;
    snprintf(uri, sizeof uri, "%s://%s%s%s:0", g.backend, v6 ? "[" : "", g.ip, v6 ? "]" : "");
    if ((rc = vrpc_listen(st, uri, &la, &l)) || (rc = vrpc_listener_uri(l, uri, sizeof uri)))
        die("listen", rc);
    vrpc_ep_attr_init(&ea);
    ea.cq = ccq;
    if ((rc = vrpc_connect(ct, uri, &ea, &r.ep)))
        die("connect", rc);
    while (!atomic_load(&r.accepted))
        usleep(1000);
    if ((rc = vrpc_lbuf_get(st, size, &src)))
        die("lbuf (source)", rc);
    memset(src->data, 0x5a, size);
    for (i = 0; i < g.depth; i++)
        if ((rc = vrpc_lbuf_get(ct, size, &r.dst[i])))
            die("lbuf (destination)", rc);
    if ((rc = vrpc_ep_grant(r.sep, src->mr, src->data, size, &r.key)))
        die("grant", rc);
    r.raddr = (uint64_t)(uintptr_t)src->data;
    r.size = size;

    /* warm-up: one read per buffer (faults, socket buffers) */
    pthread_mutex_lock(&r.mu);
    r.until = 0;
    for (i = 0; i < g.depth; i++)
        issue(&r, i);
    while (r.inflight)
        pthread_cond_wait(&r.cv, &r.mu);
    r.done = 0;
    r.lat.n = 0;
    r.lat.sorted = false;
    c0 = cpu_ns();
    t0 = vrpc_bench_now_ns();
    r.until = t0 + (uint64_t)(g.secs * 1e9);
    for (i = 0; i < g.depth; i++)
        issue(&r, i);
    while (r.inflight)
        pthread_cond_wait(&r.cv, &r.mu);
    t1 = vrpc_bench_now_ns();
    c1 = cpu_ns();
    pthread_mutex_unlock(&r.mu);
    if (r.err)
        die("read completion", r.err);
    res.ops = (double)r.done * 1e9 / (double)(t1 - t0);
    res.bytes_per_s = res.ops * size;
    res.p50 = vrpc_bench_pct_us(&r.lat, 50);
    res.p99 = vrpc_bench_pct_us(&r.lat, 99);
    res.cpu_ns_per_kib = (double)(c1 - c0) / ((double)r.done * size / 1024.0);

    vrpc_ep_revoke(r.sep, r.key, 0);
    vrpc_ep_destroy(r.ep);
    vrpc_ep_destroy(r.sep);
    vrpc_listener_destroy(l);
    vrpc_cq_destroy(ccq);
    vrpc_cq_destroy(scq); /* the REVOKE completion has been delivered by now */
    vrpc_lbuf_put(src);
    for (i = 0; i < g.depth; i++)
        vrpc_lbuf_put(r.dst[i]);
    vrpc_pool_destroy(sp);
    vrpc_pool_destroy(cp);
    vrpc_transport_destroy(st);
    vrpc_transport_destroy(ct);
    vrpc_bench_samples_free(&r.lat);
    return res;
}

/* ---- the baseline: a plain blocking socket stream of size-byte messages ---- */

struct sink {
    int lfd, fd;
    uint32_t size;
    pthread_t th;
};

static void *sink_main(void *arg)
{
    struct sink *s = arg;
    char *buf = malloc(s->size);
    int fd = accept(s->lfd, NULL, NULL);
    size_t got;
    ssize_t n;
    if (!buf || fd < 0)
        die("sink", errno);
    for (;;) { /* read whole messages into one buffer, like a receiver would */
        for (got = 0; got < s->size; got += (size_t)n)
            if ((n = read(fd, buf + got, s->size - got)) <= 0)
                goto out;
    }
out:
    close(fd);
    free(buf);
    return NULL;
}

static struct result baseline_stream(uint32_t size)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    struct sink s = {.size = size};
    struct result res = {.p50 = VRPC_BENCH_NONE, .p99 = VRPC_BENCH_NONE};
    char *buf = calloc(1, size);
    unsigned long msgs = 0;
    uint64_t t0, t1, c0, c1;
    int fd, one = 1;

    inet_pton(AF_INET, strchr(g.ip, ':') ? "127.0.0.1" : g.ip, &sa.sin_addr);
    s.lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (!buf || s.lfd < 0 || bind(s.lfd, (struct sockaddr *)&sa, sizeof sa) || listen(s.lfd, 1) ||
        getsockname(s.lfd, (struct sockaddr *)&sa, &sl))
        die("baseline listen", errno);
    pthread_create(&s.th, NULL, sink_main, &s);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa))
        die("baseline connect", errno);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c0 = cpu_ns();
    t0 = vrpc_bench_now_ns();
    t1 = t0 + (uint64_t)(g.secs * 1e9);
    while (vrpc_bench_now_ns() < t1) {
        size_t put = 0;
        while (put < size) {
            ssize_t n = write(fd, buf + put, size - put);
            if (n <= 0)
                die("baseline write", errno);
            put += (size_t)n;
        }
        msgs++;
    }
    t1 = vrpc_bench_now_ns();
    close(fd);
    pthread_join(s.th, NULL);
    c1 = cpu_ns();
    close(s.lfd);
    free(buf);
    res.ops = (double)msgs * 1e9 / (double)(t1 - t0);
    res.bytes_per_s = res.ops * size;
    res.cpu_ns_per_kib = (double)(c1 - c0) / ((double)msgs * size / 1024.0);
    return res;
}

static int by_cpu(const void *a, const void *b)
{
    const struct result *x = a, *y = b;
    return x->cpu_ns_per_kib < y->cpu_ns_per_kib ? -1 : x->cpu_ns_per_kib > y->cpu_ns_per_kib;
}

static void run_size(uint32_t size, const char *label)
{
    struct result b[ROUNDS], t[ROUNDS];
    double bcpu, tcpu;
    char name[96], extra[320];
    int k;
    for (k = 0; k < ROUNDS; k++) {
        b[k] = baseline_stream(size);
        t[k] = bench_read(size);
    }
    qsort(b, ROUNDS, sizeof *b, by_cpu);
    qsort(t, ROUNDS, sizeof *t, by_cpu);
    bcpu = b[ROUNDS / 2].cpu_ns_per_kib;
    tcpu = t[ROUNDS / 2].cpu_ns_per_kib;
    qsort(b, ROUNDS, sizeof *b, by_bw);
    qsort(t, ROUNDS, sizeof *t, by_bw);
    snprintf(name, sizeof name, "baseline:tcp_stream_%s", label);
    snprintf(extra, sizeof extra, "\"size\":%u,\"rounds\":%d,\"bytes_per_s\":%.0f,\"cpu_ns_per_kib\":%.1f", size,
             ROUNDS, b[ROUNDS / 2].bytes_per_s, bcpu);
    vrpc_bench_report(&g.o, name, b[ROUNDS / 2].ops, VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
    snprintf(name, sizeof name, "transport:%s_read_%s", g.backend, label);
    snprintf(extra, sizeof extra,
             "\"backend\":\"%s\",\"size\":%u,\"depth\":%u,\"rounds\":%d,\"bytes_per_s\":%.0f,\"vs_baseline\":%.2f,"
             "\"cpu_ns_per_kib\":%.1f,\"cpu_vs_baseline\":%.2f",
             g.backend, size, g.depth, ROUNDS, t[ROUNDS / 2].bytes_per_s,
             t[ROUNDS / 2].bytes_per_s / b[ROUNDS / 2].bytes_per_s, tcpu, tcpu / bcpu);
    vrpc_bench_report(&g.o, name, t[ROUNDS / 2].ops, t[ROUNDS / 2].p50, t[ROUNDS / 2].p99, extra);
}

int main(int argc, char **argv)
{
    g.backend = "tcp";
    g.ip = "127.0.0.1";
    g.secs = 1.0;
    g.depth = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            g.o.json = true;
        else if (!strcmp(argv[i], "--quick"))
            g.o.quick = true;
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            g.backend = argv[++i];
        else if (!strcmp(argv[i], "--server") && i + 1 < argc)
            g.ip = argv[++i];
        else if (!strcmp(argv[i], "--secs") && i + 1 < argc)
            g.secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc)
            g.depth = (unsigned)atoi(argv[++i]);
        else {
            fprintf(strcmp(argv[i], "--help") ? stderr : stdout,
                    "usage: %s [--backend tcp|verbs] [--server IP] [--secs S] [--depth N] [--json] [--quick]\n"
                    "  vrpc_ep_read of 64 KiB, 1 MiB and 16 MiB (N reads in flight, default 2) against a\n"
                    "  plain blocking-socket stream of the same message sizes, alternating %d rounds.\n",
                    argv[0], ROUNDS);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (g.o.quick)
        g.secs = 0.2;
    if (!g.depth || g.depth > MAX_DEPTH)
        g.depth = 2;
    run_size(64u << 10, "64KiB");
    run_size(1u << 20, "1MiB");
    run_size(16u << 20, "16MiB");
    return 0;
}
