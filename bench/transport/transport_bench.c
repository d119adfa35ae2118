/* transport_bench: the transport's ping-pong latency and message rate on one
 * backend (--backend tcp|verbs), with a plain blocking-socket TCP ping-pong
 * and stream of our own measured in the same run as the baselines.
 *
 * Ping-pong: the client's CQ callback sends the next message as soon as the
 * echo arrives, and the server echoes from its CQ callback, so each side has
 * one thread that sleeps in the kernel between messages, exactly like the
 * blocking-socket baseline (busy-poll variants are reported separately).
 * Message rate: 1 or 2 sender threads, one endpoint each, to a server that
 * reposts every buffer; counted at the receiver. The _list variants (one
 * thread) send up to LIST_N messages per vrpc_ep_send_list (on verbs one
 * chain of work requests, one ibv_post_send: doorbell batching). */
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
#include <sys/socket.h>
#include <unistd.h>

#include <verbrpc/transport.h>

#include "common/bench.h"

struct cfg {
    struct vrpc_bench_opts o;
    const char *backend, *server_ip, *client_ip;
    unsigned iters;
    double rate_secs;
    uint32_t busy_us;   /* busy-poll window of the _busypoll variants */
    bool pingpong_only; /* only the 32 B ping-pong pair (alternating with perftest) */
    int rounds;         /* alternating rounds of each ping-pong pair, 1..ROUNDS_MAX */
};
static struct cfg g;

static void die(const char *what, int rc)
{
    fprintf(stderr, "transport_bench: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    exit(1);
}

static void uri_for(char *buf, size_t len, const char *scheme, const char *ip, unsigned port)
{
    bool v6 = strchr(ip, ':') != NULL;
    snprintf(buf, len, "%s://%s%s%s:%u", scheme, v6 ? "[" : "", ip, v6 ? "]" : "", port);
}

/* ---- the transport side ------------------------------------------------------ */

struct server {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_listener *l;
    char uri[VRPC_URI_MAX];
    bool echo;
    atomic_ulong recvs;
    pthread_mutex_t mu;
    struct vrpc_ep *eps[8];
    unsigned neps;
};

static void server_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct server *s = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        switch (w->opcode) {
        case VRPC_WC_ACCEPTED:
            pthread_mutex_lock(&s->mu);
            if (s->neps < 8)
                s->eps[s->neps++] = w->ep;
            pthread_mutex_unlock(&s->mu);
            break;
        case VRPC_WC_RECV:
            if (w->status) {
                vrpc_pool_put(w->buf);
                break;
            }
            atomic_fetch_add_explicit(&s->recvs, 1, memory_order_relaxed);
            if (!s->echo || vrpc_ep_send(w->ep, w->buf, w->byte_len, w->imm, 0, 0))
                if (vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                    vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_SEND:
            if (vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_DISCONNECTED:
            vrpc_ep_destroy(w->ep);
            break;
        }
    }
}

static void server_start(struct server *s, bool echo, uint32_t busy_us)
{
    struct vrpc_cq_attr ca;
    struct vrpc_listen_attr la;
    char uri[VRPC_URI_MAX];
    int rc;

    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->echo = echo;
    if ((rc = vrpc_transport_create(g.backend, NULL, &s->tp)))
        die("server transport", rc);
    if ((rc = vrpc_pool_create(s->tp, vrpc_transport_eager_size(s->tp), 512, &s->pool)))
        die("server pool", rc);
    vrpc_cq_attr_init(&ca);
    ca.cb = server_cb;
    ca.cb_arg = s;
    ca.busy_poll_us = busy_us;
    ca.name = "bench-srv";
    if ((rc = vrpc_cq_create(s->tp, &ca, &s->cq)))
        die("server cq", rc);
    for (int i = 0; i < 512; i++) {
        struct vrpc_buf *b = vrpc_pool_get(s->pool);
        if ((rc = vrpc_cq_post_recv(s->cq, &b, NULL, 1)))
            die("server post", rc);
    }
    memset(&la, 0, sizeof la);
    la.cqs = &s->cq;
    la.ncqs = 1;
    uri_for(uri, sizeof uri, g.backend, g.server_ip, 0);
    if ((rc = vrpc_listen(s->tp, uri, &la, &s->l)) || (rc = vrpc_listener_uri(s->l, s->uri, sizeof s->uri)))
        die("listen", rc);
}

static void server_stop(struct server *s)
{
    vrpc_listener_destroy(s->l);
    vrpc_cq_destroy(s->cq);
    vrpc_pool_destroy(s->pool);
    vrpc_transport_destroy(s->tp);
    pthread_mutex_destroy(&s->mu);
}

/* Ping-pong client: everything happens in its CQ callback. */
struct pp {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_ep *ep;
    uint32_t size;
    unsigned left, warmup;
    uint64_t t_sent, t_start, t_end;
    struct vrpc_bench_samples s;
    atomic_int done;
    int err;
};

static void pp_send(struct pp *p)
{
    struct vrpc_buf *b = vrpc_pool_get(p->pool);
    int rc;
    if (!b) {
        p->err = -ENOBUFS;
        atomic_store(&p->done, 1);
        return;
    }
    memset(b->data, 0x5a, p->size);
    p->t_sent = vrpc_bench_now_ns();
    if ((rc = vrpc_ep_send(p->ep, b, p->size, p->left, 0, 0))) {
        vrpc_pool_put(b);
        p->err = rc;
        atomic_store(&p->done, 1);
    }
}

static void pp_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct pp *p = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        if (w->opcode == VRPC_WC_SEND) {
            vrpc_pool_put(w->buf);
        } else if (w->opcode == VRPC_WC_RECV) {
            uint64_t now = vrpc_bench_now_ns();
            if (w->status) {
                vrpc_pool_put(w->buf);
                continue;
            }
            if (vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
            if (p->warmup) {
                if (--p->warmup == 0)
                    p->t_start = now;
            } else {
                vrpc_bench_samples_add(&p->s, now - p->t_sent);
                if (--p->left == 0) {
                    p->t_end = now;
                    atomic_store(&p->done, 1);
                    continue;
                }
            }
            pp_send(p);
        }
    }
}

static void client_open(struct vrpc_transport **tp, struct vrpc_cq **cq, struct vrpc_pool **pool, vrpc_cq_cb cb,
                        void *arg, uint32_t busy_us, const char *uri, struct vrpc_ep **ep)
{
    struct vrpc_cq_attr ca;
    struct vrpc_ep_attr ea;
    int rc;
    if ((rc = vrpc_transport_create(g.backend, NULL, tp)))
        die("client transport", rc);
    if ((rc = vrpc_pool_create(*tp, vrpc_transport_eager_size(*tp), 1024, pool)))
        die("client pool", rc);
    vrpc_cq_attr_init(&ca);
    ca.cb = cb;
    ca.cb_arg = arg;
    ca.busy_poll_us = busy_us;
    ca.name = "bench-cli";
    if ((rc = vrpc_cq_create(*tp, &ca, cq)))
        die("client cq", rc);
    for (int i = 0; i < 64; i++) {
        struct vrpc_buf *b = vrpc_pool_get(*pool);
        if ((rc = vrpc_cq_post_recv(*cq, &b, NULL, 1)))
            die("client post", rc);
    }
    vrpc_ep_attr_init(&ea);
    ea.cq = *cq;
    ea.src_addr = g.client_ip;
    if ((rc = vrpc_connect(*tp, uri, &ea, ep)))
        die("connect", rc);
}

struct result {
    double ops, p50, p99;
};

static struct result bench_pingpong(uint32_t size, uint32_t busy_us)
{
    struct result r;
    struct server s;
    struct pp p;

    server_start(&s, true, busy_us);
    memset(&p, 0, sizeof p);
    p.size = size;
    p.left = g.iters;
    p.warmup = g.iters / 10 + 1;
    vrpc_bench_samples_init(&p.s, g.iters);
    client_open(&p.tp, &p.cq, &p.pool, pp_cb, &p, busy_us, s.uri, &p.ep);
    pp_send(&p);
    while (!atomic_load(&p.done))
        usleep(1000);
    if (p.err)
        die("ping-pong", p.err);
    r.ops = (double)g.iters * 1e9 / (double)(p.t_end - p.t_start);
    r.p50 = vrpc_bench_pct_us(&p.s, 50);
    r.p99 = vrpc_bench_pct_us(&p.s, 99);
    vrpc_ep_destroy(p.ep);
    vrpc_cq_destroy(p.cq);
    vrpc_pool_destroy(p.pool);
    vrpc_transport_destroy(p.tp);
    vrpc_bench_samples_free(&p.s);
    server_stop(&s);
    return r;
}

/* Message rate: each sender thread owns one endpoint (and CQ). */
struct sender {
    const char *uri;
    uint32_t size;
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_ep *ep;
    atomic_int *stop;
    unsigned long sent;
    bool list; /* vrpc_ep_send_list, LIST_N at a time */
};

#define LIST_N 16

static void rate_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    for (unsigned i = 0; i < n; i++)
        if (wc[i].buf && wc[i].opcode == VRPC_WC_SEND)
            vrpc_pool_put(wc[i].buf);
        else if (wc[i].buf && wc[i].opcode == VRPC_WC_RECV && vrpc_cq_post_recv(cq, &wc[i].buf, NULL, 1))
            vrpc_pool_put(wc[i].buf);
}

/* As sender_main, LIST_N messages per vrpc_ep_send_list. */
static void sender_list(struct sender *x)
{
    struct vrpc_send_wr wrs[LIST_N];
    while (!atomic_load_explicit(x->stop, memory_order_relaxed)) {
        unsigned n = 0, sent = 0;
        for (; n < LIST_N; n++) {
            struct vrpc_buf *b = vrpc_pool_get(x->pool);
            if (!b)
                break;
            memset(b->data, 0x33, x->size);
            wrs[n] = (struct vrpc_send_wr){b, x->size, 0, 0};
        }
        if (n)
            vrpc_ep_send_list(x->ep, wrs, n, 0, &sent);
        x->sent += sent;
        for (unsigned i = sent; i < n; i++)
            vrpc_pool_put(wrs[i].buf);
        if (sent < LIST_N)
            sched_yield();
    }
}

static void *sender_main(void *arg)
{
    struct sender *x = arg;
    if (x->list) {
        sender_list(x);
        return NULL;
    }
    while (!atomic_load_explicit(x->stop, memory_order_relaxed)) {
        struct vrpc_buf *b = vrpc_pool_get(x->pool);
        if (!b) {
            sched_yield();
            continue;
        }
        memset(b->data, 0x33, x->size);
        if (vrpc_ep_send(x->ep, b, x->size, 0, 0, 0)) {
            vrpc_pool_put(b);
            sched_yield();
            continue;
        }
        x->sent++;
    }
    return NULL;
}

static void bench_rate(uint32_t size, unsigned nthreads, bool list, const char *name)
{
    struct server s;
    struct sender x[2];
    pthread_t th[2];
    atomic_int stop = 0;
    unsigned long r0, r1;
    uint64_t t0, t1;
    char extra[128];

    server_start(&s, false, 0);
    for (unsigned i = 0; i < nthreads; i++) {
        memset(&x[i], 0, sizeof x[i]);
        x[i].size = size;
        x[i].stop = &stop;
        x[i].list = list;
        client_open(&x[i].tp, &x[i].cq, &x[i].pool, rate_cb, &x[i], 0, s.uri, &x[i].ep);
    }
    for (unsigned i = 0; i < nthreads; i++)
        pthread_create(&th[i], NULL, sender_main, &x[i]);
    usleep(100000); /* warm up */
    r0 = atomic_load(&s.recvs);
    t0 = vrpc_bench_now_ns();
    usleep((useconds_t)(g.rate_secs * 1e6));
    r1 = atomic_load(&s.recvs);
    t1 = vrpc_bench_now_ns();
    atomic_store(&stop, 1);
    for (unsigned i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    snprintf(extra, sizeof extra, "\"backend\":\"%s\",\"size\":%u,\"threads\":%u,\"list\":%u", g.backend, size,
             nthreads, list ? LIST_N : 1u);
    vrpc_bench_report(&g.o, name, (double)(r1 - r0) * 1e9 / (double)(t1 - t0), VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
    for (unsigned i = 0; i < nthreads; i++) {
        vrpc_ep_destroy(x[i].ep);
        vrpc_cq_destroy(x[i].cq);
        vrpc_pool_destroy(x[i].pool);
        vrpc_transport_destroy(x[i].tp);
    }
    server_stop(&s);
}

/* ---- baseline: plain blocking sockets, length-prefixed frames ------------------ */

static int full(int fd, void *buf, size_t len, bool wr)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n =
            wr ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL) : recv(fd, (char *)buf + done, len - done, 0);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

struct plain_srv {
    int lfd;
    unsigned port;
    bool echo;
    atomic_ulong recvs;
    pthread_t th;
};

static void *plain_srv_main(void *arg)
{
    struct plain_srv *s = arg;
    static char buf[65536 + 4];
    int fd = accept(s->lfd, NULL, NULL), one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (;;) {
        uint32_t len;
        if (full(fd, &len, 4, false) || len > 65536 || full(fd, buf + 4, len, false))
            break;
        atomic_fetch_add_explicit(&s->recvs, 1, memory_order_relaxed);
        if (s->echo) {
            memcpy(buf, &len, 4);
            if (full(fd, buf, 4 + len, true))
                break;
        }
    }
    close(fd);
    return NULL;
}

static int plain_connect(struct plain_srv *s, bool echo)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd, one = 1, fam = strchr(g.server_ip, ':') ? AF_INET6 : AF_INET;

    memset(&ss, 0, sizeof ss);
    if (fam == AF_INET) {
        struct sockaddr_in *a = (void *)&ss;
        a->sin_family = AF_INET;
        inet_pton(AF_INET, g.server_ip, &a->sin_addr);
        sl = sizeof *a;
    } else {
        struct sockaddr_in6 *a = (void *)&ss;
        a->sin6_family = AF_INET6;
        inet_pton(AF_INET6, g.server_ip, &a->sin6_addr);
        sl = sizeof *a;
    }
    s->echo = echo;
    atomic_init(&s->recvs, 0);
    s->lfd = socket(fam, SOCK_STREAM, 0);
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s->lfd < 0 || bind(s->lfd, (void *)&ss, sl) || listen(s->lfd, 4) || getsockname(s->lfd, (void *)&ss, &sl))
        die("baseline listen", errno);
    pthread_create(&s->th, NULL, plain_srv_main, s);
    fd = socket(fam, SOCK_STREAM, 0);
    if (g.client_ip) {
        struct sockaddr_storage src;
        memset(&src, 0, sizeof src);
        if (fam == AF_INET) {
            ((struct sockaddr_in *)&src)->sin_family = AF_INET;
            inet_pton(AF_INET, g.client_ip, &((struct sockaddr_in *)&src)->sin_addr);
        } else {
            ((struct sockaddr_in6 *)&src)->sin6_family = AF_INET6;
            inet_pton(AF_INET6, g.client_ip, &((struct sockaddr_in6 *)&src)->sin6_addr);
        }
        if (bind(fd, (void *)&src, sl))
            die("baseline bind", errno);
    }
    if (connect(fd, (void *)&ss, sl))
        die("baseline connect", errno);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void plain_done(struct plain_srv *s, int fd)
{
    shutdown(fd, SHUT_WR);
    pthread_join(s->th, NULL);
    close(fd);
    close(s->lfd);
}

static struct result baseline_pingpong(uint32_t size)
{
    struct plain_srv s;
    struct vrpc_bench_samples smp;
    struct result r;
    char *buf = calloc(1, size + 4);
    unsigned warm = g.iters / 10 + 1;
    uint64_t t0 = 0, t1;
    int fd = plain_connect(&s, true);

    vrpc_bench_samples_init(&smp, g.iters);
    for (unsigned i = 0; i < warm + g.iters; i++) {
        uint64_t a = vrpc_bench_now_ns();
        uint32_t len = size;
        if (i == warm)
            t0 = a;
        memcpy(buf, &len, 4);
        if (full(fd, buf, 4 + size, true) || full(fd, buf, 4, false) || full(fd, buf + 4, size, false))
            die("baseline ping-pong", errno);
        if (i >= warm)
            vrpc_bench_samples_add(&smp, vrpc_bench_now_ns() - a);
    }
    t1 = vrpc_bench_now_ns();
    r.ops = (double)g.iters * 1e9 / (double)(t1 - t0);
    r.p50 = vrpc_bench_pct_us(&smp, 50);
    r.p99 = vrpc_bench_pct_us(&smp, 99);
    vrpc_bench_samples_free(&smp);
    plain_done(&s, fd);
    free(buf);
    return r;
}

static int by_p50(const void *a, const void *b)
{
    const struct result *x = a, *y = b;
    return x->p50 < y->p50 ? -1 : x->p50 > y->p50;
}

#define ROUNDS_MAX 9

/* The baseline and the transport ping-pong alternate g.rounds times (this
 * machine is shared and noisy); each reports its round with the median p50,
 * the transport case also its p50 over the baseline's. */
static void pingpong_pair(uint32_t size, const char *label)
{
    struct result b[ROUNDS_MAX], t[ROUNDS_MAX], tb[ROUNDS_MAX];
    const int R = g.rounds;
    char name[96], extra[192];
    for (int r = 0; r < R; r++) {
        b[r] = baseline_pingpong(size);
        t[r] = bench_pingpong(size, 0);
        tb[r] = bench_pingpong(size, g.busy_us);
    }
    qsort(b, (size_t)R, sizeof *b, by_p50);
    qsort(t, (size_t)R, sizeof *t, by_p50);
    qsort(tb, (size_t)R, sizeof *tb, by_p50);
    snprintf(name, sizeof name, "baseline:tcp_pingpong_%s", label);
    snprintf(extra, sizeof extra, "\"size\":%u,\"rounds\":%d", size, R);
    vrpc_bench_report(&g.o, name, b[R / 2].ops, b[R / 2].p50, b[R / 2].p99, extra);
    snprintf(name, sizeof name, "transport:%s_pingpong_%s", g.backend, label);
    snprintf(extra, sizeof extra,
             "\"backend\":\"%s\",\"size\":%u,\"busy_poll_us\":0,\"rounds\":%d,\"p50_vs_baseline\":%.2f", g.backend,
             size, R, t[R / 2].p50 / b[R / 2].p50);
    vrpc_bench_report(&g.o, name, t[R / 2].ops, t[R / 2].p50, t[R / 2].p99, extra);
    snprintf(name, sizeof name, "transport:%s_pingpong_%s_busypoll", g.backend, label);
    snprintf(extra, sizeof extra,
             "\"backend\":\"%s\",\"size\":%u,\"busy_poll_us\":%u,\"rounds\":%d,\"p50_vs_baseline\":%.2f", g.backend,
             size, g.busy_us, R, tb[R / 2].p50 / b[R / 2].p50);
    vrpc_bench_report(&g.o, name, tb[R / 2].ops, tb[R / 2].p50, tb[R / 2].p99, extra);
}

static void baseline_stream(uint32_t size, const char *name)
{
    struct plain_srv s;
    char *buf = calloc(1, size + 4), extra[96];
    uint64_t t0, t1;
    unsigned long r0, r1;
    int fd = plain_connect(&s, false);
    uint32_t len = size;

    memcpy(buf, &len, 4);
    t0 = vrpc_bench_now_ns() + (uint64_t)(g.rate_secs * 1e9) + 100000000u;
    while (vrpc_bench_now_ns() < t0 - (uint64_t)(g.rate_secs * 1e9))
        full(fd, buf, 4 + size, true);
    r0 = atomic_load(&s.recvs);
    t0 = vrpc_bench_now_ns();
    while (vrpc_bench_now_ns() - t0 < (uint64_t)(g.rate_secs * 1e9))
        full(fd, buf, 4 + size, true);
    r1 = atomic_load(&s.recvs);
    t1 = vrpc_bench_now_ns();
    snprintf(extra, sizeof extra, "\"size\":%u,\"threads\":1", size);
    vrpc_bench_report(&g.o, name, (double)(r1 - r0) * 1e9 / (double)(t1 - t0), VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
    plain_done(&s, fd);
    free(buf);
}

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--backend tcp|verbs] [--server IP] [--client-src IP] [--iters N] [--secs S]\n"
            "          [--busy-us N] [--rounds N] [--pingpong-only] [--json] [--quick]\n"
            "  Transport ping-pong latency (32 B, 4 KiB; blocking and busy-polling pollers) and\n"
            "  message rate (1 and 2 sender threads, and 1 thread sending lists of 16 with\n"
            "  vrpc_ep_send_list), against a plain blocking-socket TCP\n"
            "  ping-pong and stream measured in the same run. --server is where the server\n"
            "  listens (default 127.0.0.1), --client-src the client's source address.\n"
            "  --busy-us: the busy-poll variants' spin before sleeping (default 50 us).\n"
            "  --pingpong-only: just the 32 B ping-pong pair (for alternating with perftest).\n"
            "  --rounds: alternating rounds per ping-pong pair, median reported (default 5, max 9).\n",
            argv0);
}

int main(int argc, char **argv)
{
    char name[96];
    g.backend = "tcp";
    g.server_ip = "127.0.0.1";
    g.iters = 20000;
    g.rate_secs = 1.0;
    g.busy_us = 50;
    g.rounds = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            g.o.json = true;
        else if (!strcmp(argv[i], "--quick"))
            g.o.quick = true;
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            g.backend = argv[++i];
        else if (!strcmp(argv[i], "--server") && i + 1 < argc)
            g.server_ip = argv[++i];
        else if (!strcmp(argv[i], "--client-src") && i + 1 < argc)
            g.client_ip = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            g.iters = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--secs") && i + 1 < argc)
            g.rate_secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--busy-us") && i + 1 < argc)
            g.busy_us = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            g.rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pingpong-only"))
            g.pingpong_only = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, argv[0]);
            return 0;
        } else {
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (g.o.quick) {
        g.iters = 2000;
        g.rate_secs = 0.2;
    }
    if (!g.iters)
        g.iters = 1;
    if (g.rounds < 1 || g.rounds > ROUNDS_MAX)
        g.rounds = g.rounds < 1 ? 1 : ROUNDS_MAX;
    {
        struct vrpc_transport *tp;
        int rc = vrpc_transport_create(g.backend, NULL, &tp);
        if (rc)
            die(g.backend, rc);
        vrpc_transport_destroy(tp);
    }
    pingpong_pair(32, "32B");
    if (g.pingpong_only)
        return 0;
    pingpong_pair(4096, "4KiB");
    baseline_stream(32, "baseline:tcp_stream_32B");
    baseline_stream(4096, "baseline:tcp_stream_4KiB");
    for (unsigned t = 1; t <= 2; t++) {
        snprintf(name, sizeof name, "transport:%s_rate_32B_%ut", g.backend, t);
        bench_rate(32, t, false, name);
        snprintf(name, sizeof name, "transport:%s_rate_4KiB_%ut", g.backend, t);
        bench_rate(4096, t, false, name);
    }
    snprintf(name, sizeof name, "transport:%s_rate_list_32B_1t", g.backend);
    bench_rate(32, 1, true, name);
    snprintf(name, sizeof name, "transport:%s_rate_list_4KiB_1t", g.backend);
    bench_rate(4096, 1, true, name);
    return 0;
}
