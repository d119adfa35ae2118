/* The transport's one-way message rate: see rpc_bench_tprate.h. The same
 * measurement as bench/transport/transport_bench.c's bench_rate, one sender. */
#include "rpc_bench_tprate.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <verbrpc/transport.h>
#include "common/bench.h"

#define SRV_BUFS 512

struct side {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
};

struct tp_server {
    struct side s;
    struct vrpc_listener *l;
    char uri[VRPC_URI_MAX];
    atomic_ulong recvs;
};

static void die(const char *what, int rc)
{
    fprintf(stderr, "rpc_bench_stream: transport baseline: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    exit(1);
}

static void srv_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct tp_server *s = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        if (w->opcode == VRPC_WC_RECV || w->opcode == VRPC_WC_SEND) {
            if (w->opcode == VRPC_WC_RECV && !w->status)
                atomic_fetch_add_explicit(&s->recvs, 1, memory_order_relaxed);
            struct vrpc_buf *b = w->buf;
            if (vrpc_cq_post_recv(cq, &b, NULL, 1))
                vrpc_pool_put(b);
        } else if (w->opcode == VRPC_WC_DISCONNECTED) {
            vrpc_ep_destroy(w->ep);
        }
    }
}

static void cli_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    (void)arg;
    for (unsigned i = 0; i < n; i++)
        if (wc[i].buf && wc[i].opcode == VRPC_WC_SEND)
            vrpc_pool_put(wc[i].buf);
        else if (wc[i].buf && wc[i].opcode == VRPC_WC_RECV && vrpc_cq_post_recv(cq, &wc[i].buf, NULL, 1))
            vrpc_pool_put(wc[i].buf);
}

static void side_open(struct side *x, const char *backend, vrpc_cq_cb cb, void *arg, unsigned bufs, unsigned posts)
{
    struct vrpc_cq_attr ca;
    int rc;
    if ((rc = vrpc_transport_create(backend, NULL, &x->tp)))
        die("transport", rc);
    if ((rc = vrpc_pool_create(x->tp, vrpc_transport_eager_size(x->tp), bufs, &x->pool)))
        die("pool", rc);
    vrpc_cq_attr_init(&ca);
    ca.cb = cb;
    ca.cb_arg = arg;
    ca.name = "tprate";
    if ((rc = vrpc_cq_create(x->tp, &ca, &x->cq)))
        die("cq", rc);
    for (unsigned i = 0; i < posts; i++) {
        struct vrpc_buf *b = vrpc_pool_get(x->pool);
        if ((rc = vrpc_cq_post_recv(x->cq, &b, NULL, 1)))
            die("post", rc);
    }
}

static void side_close(struct side *x)
{
    vrpc_cq_destroy(x->cq);
    vrpc_pool_destroy(x->pool);
    vrpc_transport_destroy(x->tp);
}

struct sender {
    struct side c;
    struct vrpc_ep *ep;
    uint32_t size;
    atomic_int stop;
};

static void *sender_main(void *arg)
{
    struct sender *x = arg;
    while (!atomic_load_explicit(&x->stop, memory_order_relaxed)) {
        struct vrpc_buf *b = vrpc_pool_get(x->c.pool);
        if (!b) {
            sched_yield();
            continue;
        }
        memset(b->data, 0x33, x->size);
        if (vrpc_ep_send(x->ep, b, x->size, 0, 0, 0)) {
            vrpc_pool_put(b);
            sched_yield();
        }
    }
    return NULL;
}

double vrpc_bench_tp_rate(const char *backend, const char *server_ip, const char *client_ip, uint32_t size, double secs)
{
    static struct tp_server s;
    static struct sender x;
    struct vrpc_listen_attr la;
    struct vrpc_ep_attr ea;
    char uri[VRPC_URI_MAX];
    pthread_t th;
    int rc;

    memset(&s, 0, sizeof(s));
    memset(&x, 0, sizeof(x));
    side_open(&s.s, backend, srv_cb, &s, SRV_BUFS, SRV_BUFS);
    memset(&la, 0, sizeof(la));
    la.cqs = &s.s.cq;
    la.ncqs = 1;
    bool v6 = strchr(server_ip, ':') != NULL;
    snprintf(uri, sizeof(uri), "%s://%s%s%s:0", backend, v6 ? "[" : "", server_ip, v6 ? "]" : "");
    if ((rc = vrpc_listen(s.s.tp, uri, &la, &s.l)) || (rc = vrpc_listener_uri(s.l, s.uri, sizeof(s.uri))))
        die("listen", rc);
    side_open(&x.c, backend, cli_cb, &x, 1024, 64);
    x.size = size;
    vrpc_ep_attr_init(&ea);
    ea.cq = x.c.cq;
    ea.src_addr = client_ip;
    if ((rc = vrpc_connect(x.c.tp, s.uri, &ea, &x.ep)))
        die("connect", rc);
    pthread_create(&th, NULL, sender_main, &x);
    usleep(100000); /* warm up */
    unsigned long r0 = atomic_load(&s.recvs);
    uint64_t t0 = vrpc_bench_now_ns();
    usleep((useconds_t)(secs * 1e6));
    unsigned long r1 = atomic_load(&s.recvs);
    uint64_t t1 = vrpc_bench_now_ns();
    atomic_store(&x.stop, 1);
    pthread_join(th, NULL);
    vrpc_ep_destroy(x.ep);
    side_close(&x.c);
    vrpc_listener_destroy(s.l);
    side_close(&s.s);
    return (double)(r1 - r0) * 1e9 / (double)(t1 - t0);
}
