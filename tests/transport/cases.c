/* Conformance cases: credits and back-pressure, many connections, peer close
 * and crash, close during traffic, listener close with pending accepts. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cases.h"
#include "harness.h"

#define WAIT_MS 20000

static unsigned scaled(unsigned n)
{
    unsigned v = n / g_opt.scale_div;
    return v ? v : 1;
}

static uint32_t ref_csum(size_t n, uint32_t seed)
{
    unsigned char ref[64];
    fill(ref, n, seed);
    return csum(ref, n);
}

static uint32_t ref_csum_big(size_t n, uint32_t seed)
{
    static unsigned char ref[VRPC_EAGER_MAX];
    fill(ref, n, seed);
    return csum(ref, n);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool wait_until(atomic_ulong *v, unsigned long want, int ms)
{
    int i;
    for (i = 0; i < ms && atomic_load(v) < want; i++)
        usleep(1000);
    return atomic_load(v) >= want;
}

/* ---- credits and back-pressure ------------------------------------------ */

#define BURST_THREADS 4

struct burst {
    struct vrpc_pool *pool;
    struct vrpc_ep *ep;
    unsigned thread, per;
    unsigned long eagain;
    int fail;
};

struct order {
    uint32_t next[BURST_THREADS];
    unsigned long bad;
};

static void burst_check(struct echo *e, const struct vrpc_wc *w)
{
    struct order *o = e->arg;
    uint32_t t = w->imm >> 24, seq = w->imm & 0xffffff, pl[2];
    memcpy(pl, w->buf->data, sizeof pl);
    if (t >= BURST_THREADS || w->byte_len != sizeof pl || pl[0] != t || pl[1] != seq || o->next[t] != seq)
        o->bad++;
    else
        o->next[t]++;
}

static void *burst_sender(void *arg)
{
    struct burst *b = arg;
    unsigned seq;
    for (seq = 0; seq < b->per; seq++) {
        struct vrpc_buf *buf;
        uint32_t pl[2] = { b->thread, seq };
        int rc;
        while (!(buf = vrpc_pool_get(b->pool)))
            sched_yield();
        memcpy(buf->data, pl, sizeof pl);
        while ((rc = vrpc_ep_send(b->ep, buf, sizeof pl, b->thread << 24 | seq, seq, 0)) == -EAGAIN) {
            b->eagain++;
            sched_yield();
        }
        if (rc) {
            b->fail = rc;
            vrpc_pool_put(buf);
            return NULL;
        }
    }
    return NULL;
}

/* 4 threads burst on one endpoint to a receiver with few credits and few
 * buffers: sends queue and push back (-EAGAIN), nothing is lost or failed,
 * each thread's order is kept. */
void t_credits_burst(void **state)
{
    struct vrpc_transport_attr sa, ca;
    struct echo e;
    struct order o;
    struct echo_cfg ec = { .ncq = 1, .nbufs = 32, .tattr = &sa, .repost_only = true, .on_recv = burst_check, .arg = &o };
    struct client c;
    struct counts k;
    struct burst b[BURST_THREADS];
    pthread_t th[BURST_THREADS];
    unsigned total = scaled(g_opt.burst) / BURST_THREADS * BURST_THREADS, i;
    unsigned long eagain = 0;

    vrpc_transport_attr_init(&sa);
    sa.credits = 8;
    vrpc_transport_attr_init(&ca);
    ca.max_queued = 64;
    memset(&o, 0, sizeof o);
    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, &ca, 1024, 8, 0, counts_cb, &k), 0);
    struct vrpc_ep *ep;
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    for (i = 0; i < BURST_THREADS; i++) {
        b[i] = (struct burst){ .pool = c.pool, .ep = ep, .thread = i, .per = total / BURST_THREADS };
        assert_int_equal(pthread_create(&th[i], NULL, burst_sender, &b[i]), 0);
    }
    for (i = 0; i < BURST_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(b[i].fail, 0);
        eagain += b[i].eagain;
    }
    assert_true(wait_until(&e.recvs, total, 60000));
    assert_true(wait_until(&k.send_ok, total, 10000));
    printf("  burst: %u messages, %lu -EAGAIN retries, receiver credits %u, %u buffers\n", total, eagain,
           sa.credits, ec.nbufs);
    assert_int_equal(atomic_load(&e.recvs), total);
    assert_int_equal(o.bad, 0);
    for (i = 0; i < BURST_THREADS; i++)
        assert_int_equal(o.next[i], total / BURST_THREADS);
    assert_int_equal(atomic_load(&k.send_ok), total);
    assert_int_equal(atomic_load(&k.send_err), 0);
    vrpc_ep_destroy(ep);
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    assert_int_equal(atomic_load(&k.disc_status), 0);
    client_stop(&c);
    echo_stop(&e);
}

/* ---- pipelined frames of mixed sizes --------------------------------------- */

struct mixed {
    uint32_t eager, next;
    unsigned long bad;
};

static uint32_t mixed_size(uint32_t seq, uint32_t eager)
{
    /* small and large, zero and eager-sized, in a scrambled order */
    return seq % 5 == 0 ? 0 : seq % 7 == 0 ? eager : (seq * 7919u) % (eager + 1);
}

static void mixed_check(struct echo *e, const struct vrpc_wc *w)
{
    struct mixed *m = e->arg;
    uint32_t want = mixed_size(m->next, m->eager);
    if (w->imm != m->next || w->byte_len != want || csum(w->buf->data, want) != ref_csum_big(want, m->next))
        m->bad++;
    m->next++;
}

/* Back-to-back frames of every size class from one sender: the receiver's
 * reads span frame boundaries (one read may hold the end of one frame and the
 * start of several more); every message arrives whole, in order, intact. */
void t_pipelined_sizes(void **state)
{
    struct mixed m = { 0 };
    struct echo_cfg ec = { .ncq = 1, .nbufs = 128, .repost_only = true, .on_recv = mixed_check, .arg = &m };
    struct echo e;
    struct client c;
    struct counts k;
    struct vrpc_ep *ep;
    unsigned total = scaled(4000), seq;

    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 256, 8, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    m.eager = vrpc_ep_eager_size(ep);
    for (seq = 0; seq < total; seq++) {
        uint32_t size = mixed_size(seq, m.eager);
        struct vrpc_buf *b;
        int rc;
        while (!(b = vrpc_pool_get(c.pool)))
            sched_yield();
        fill(b->data, size, seq);
        while ((rc = vrpc_ep_send(ep, b, size, seq, seq, 0)) == -EAGAIN)
            sched_yield();
        assert_int_equal(rc, 0);
    }
    assert_true(wait_until(&e.recvs, total, 60000));
    assert_int_equal(m.bad, 0);
    assert_int_equal(m.next, total);
    assert_true(wait_until(&k.send_ok, total, WAIT_MS));
    vrpc_ep_destroy(ep);
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    client_stop(&c);
    echo_stop(&e);
}

/* ---- many connections ------------------------------------------------------- */

/* g_opt.conns connections to one server with far fewer receive buffers than
 * connections x credits (each connection reserves at least one): every
 * connection's message is echoed on that connection, all close cleanly. */
void t_many_connections(void **state)
{
    struct echo e;
    unsigned n = scaled(g_opt.conns), i, got = 0;
    struct echo_cfg ec = { .ncq = 2, .nbufs = 2 * n + 256 };
    struct client c;
    struct vrpc_ep **eps = calloc(n, sizeof *eps);
    unsigned char *seen = calloc(n, 1);
    struct vrpc_wc w;

    assert_non_null(eps);
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 3 * n + 256, 2 * n + 128, 0, NULL, NULL), 0);
    for (i = 0; i < n; i++) {
        struct vrpc_ep_attr a;
        vrpc_ep_attr_init(&a);
        a.cq = c.cq;
        a.src_addr = g_opt.client_ip;
        a.user = (void *)(uintptr_t)(i + 1);
        int rc = vrpc_connect(c.tp, e.uri, &a, &eps[i]);
        if (rc)
            printf("  connection %u of %u failed: %s (server accepted %lu)\n", i, n, strerror(-rc),
                   atomic_load(&e.accepted));
        assert_int_equal(rc, 0);
    }
    assert_true(wait_until(&e.accepted, n, WAIT_MS));
    for (i = 0; i < n; i++) {
        struct vrpc_buf *b = vrpc_pool_get(c.pool);
        assert_non_null(b);
        fill(b->data, 16, i);
        assert_int_equal(vrpc_ep_send(eps[i], b, 16, i, i, 0), 0);
    }
    while (got < n) {
        uintptr_t idx;
        assert_true(coll_wait(&c.coll, VRPC_WC_RECV, NULL, WAIT_MS, &w));
        assert_int_equal(w.status, 0);
        idx = (uintptr_t)vrpc_ep_user(w.ep) - 1;
        assert_true(idx < n);
        assert_int_equal(w.imm, idx);
        assert_int_equal(seen[idx], 0);
        seen[idx] = 1;
        assert_int_equal(csum(w.buf->data, 16), ref_csum(16, (uint32_t)idx));
        assert_int_equal(vrpc_cq_post_recv(c.cq, &w.buf, NULL, 1), 0);
        got++;
    }
    assert_true(coll_wait_n(&c.coll, VRPC_WC_SEND, n, WAIT_MS));
    for (i = 0; i < n; i++)
        assert_int_equal(vrpc_ep_close(eps[i]), 0);
    assert_true(coll_wait_n(&c.coll, VRPC_WC_DISCONNECTED, n, WAIT_MS));
    for (i = 0; i < n; i++)
        vrpc_ep_destroy(eps[i]);
    assert_true(wait_until(&e.disconnected, n, WAIT_MS));
    assert_int_equal(atomic_load(&e.disc_err), 0);
    printf("  %u connections, server: 2 CQs sharing %u receive buffers\n", n, ec.nbufs);
    client_stop(&c);
    echo_stop(&e);
    free(eps);
    free(seen);
}

/* ---- peer close ----------------------------------------------------------- */

/* The peer closes while we have sends waiting for credits: those flush with
 * -ECANCELED, the ones on the wire complete with 0, exactly once each, then one
 * DISCONNECTED (status 0). At CQ destroy every posted receive is flushed once. */
void t_peer_close(void **state)
{
    struct vrpc_transport_attr sa;
    struct echo e;
    struct echo_cfg ec = { .ncq = 1, .nbufs = 4, .tattr = &sa, .hold = true }; /* fewer than we send */
    struct client c;
    struct counts k;
    struct vrpc_ep *ep, *sep;
    struct vrpc_transport_attr ca;
    unsigned i, nsend = 0, nrecv = 8, held;
    int rc = 0;

    vrpc_transport_attr_init(&sa);
    sa.credits = 4;
    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    vrpc_transport_attr_init(&ca);
    ca.max_queued = 6;
    assert_int_equal(client_start(&c, &ca, 32, nrecv, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    /* Back-pressure: the server has 4 buffers and keeps them, we may queue 6:
     * sends are accepted until the queue is full, then -EAGAIN (buffer kept). */
    for (i = 0; i < 100; i++) {
        struct vrpc_buf *b = vrpc_pool_get(c.pool);
        rc = vrpc_ep_send(ep, b, 8, i, i, 0);
        if (rc) {
            vrpc_pool_put(b);
            break;
        }
        nsend++;
    }
    assert_int_equal(rc, -EAGAIN);
    assert_true(nsend >= ca.max_queued && nsend <= ca.max_queued + ec.nbufs);
    assert_true(wait_until(&e.recvs, 1, WAIT_MS));
    usleep(50000);
    /* the receiver holds its buffers: credits hold the rest back */
    held = (unsigned)atomic_load(&e.recvs);
    assert_true(held >= 1 && held <= ec.nbufs);
    /* under e.mu the endpoint cannot be destroyed by the echo callback */
    pthread_mutex_lock(&e.mu);
    assert_int_equal(e.neps, 1);
    sep = e.eps[0];
    assert_int_equal(vrpc_ep_close(sep), 0);
    pthread_mutex_unlock(&e.mu);
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    usleep(20000);
    assert_int_equal(atomic_load(&k.disc), 1);
    assert_int_equal(atomic_load(&k.disc_status), 0);
    assert_int_equal(atomic_load(&k.send_ok), held);
    assert_int_equal(atomic_load(&k.send_err), nsend - held);
    assert_int_equal(atomic_load(&k.after_disc), 0);
    assert_int_equal(vrpc_ep_send(ep, vrpc_pool_get(c.pool), 8, 0, 0, 0), -ENOTCONN);
    vrpc_ep_destroy(ep);
    vrpc_cq_destroy(c.cq);
    c.cq = NULL;
    assert_int_equal(atomic_load(&k.recv_flush), nrecv);
    client_stop(&c);
    assert_true(wait_until(&e.disconnected, 1, WAIT_MS));
    echo_stop(&e);
    assert_int_equal(atomic_load(&e.flushed_recvs), ec.nbufs - held);
}

/* A graceful close with sends still waiting for credits: they are delivered
 * (in order) once the peer frees buffers, then DISCONNECTED (status 0). */
void t_close_delivers_queued(void **state)
{
    struct echo_cfg ec = { .ncq = 1, .nbufs = 4, .hold = true, .repost_only = true };
    struct echo e;
    struct client c;
    struct counts k;
    struct vrpc_ep *ep;
    unsigned i, nsend = 12;

    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 32, 8, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    for (i = 0; i < nsend; i++)
        assert_int_equal(vrpc_ep_send(ep, vrpc_pool_get(c.pool), 8, i, i, 0), 0);
    assert_true(wait_until(&e.recvs, 1, WAIT_MS));
    assert_int_equal(vrpc_ep_close(ep), 0);
    usleep(50000);
    assert_true(atomic_load(&e.recvs) <= ec.nbufs); /* the rest waits for credits */
    assert_int_equal(atomic_load(&k.disc), 0);
    echo_release(&e); /* buffers come back: credits flow, the queue drains */
    assert_true(wait_until(&e.recvs, nsend, WAIT_MS));
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    assert_int_equal(atomic_load(&k.disc_status), 0);
    assert_int_equal(atomic_load(&k.send_ok), nsend);
    assert_int_equal(atomic_load(&k.send_err), 0);
    vrpc_ep_destroy(ep);
    client_stop(&c);
    echo_stop(&e);
}

/* A graceful close the peer never lets finish (it holds its buffers, so our
 * queued sends never get credits): after the idle timeout the endpoint fails
 * with -ETIMEDOUT, every send completes exactly once (the queued ones flush)
 * and DISCONNECTED is the last completion. */
void t_close_timeout(void **state)
{
    struct echo_cfg ec = { .ncq = 1, .nbufs = 4, .hold = true, .repost_only = true };
    struct vrpc_transport_attr ca;
    struct echo e;
    struct client c;
    struct counts k;
    struct vrpc_ep *ep;
    unsigned i, nsend = 12;
    uint64_t t0, ms;

    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    vrpc_transport_attr_init(&ca);
    ca.idle_timeout_ms = 1000;
    assert_int_equal(client_start(&c, &ca, 32, 8, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    for (i = 0; i < nsend; i++)
        assert_int_equal(vrpc_ep_send(ep, vrpc_pool_get(c.pool), 8, i, i, 0), 0);
    assert_true(wait_until(&e.recvs, 1, WAIT_MS));
    t0 = now_ms();
    assert_int_equal(vrpc_ep_close(ep), 0);
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    ms = now_ms() - t0;
    usleep(20000);
    printf("  close timed out after %llu ms: DISCONNECTED status %d\n", (unsigned long long)ms,
           atomic_load(&k.disc_status));
    assert_true(ms >= 900);
    assert_int_equal(atomic_load(&k.disc), 1);
    assert_int_equal(atomic_load(&k.disc_status), -ETIMEDOUT);
    assert_int_equal(atomic_load(&k.send_ok) + atomic_load(&k.send_err), nsend);
    assert_true(atomic_load(&k.send_err) >= nsend - ec.nbufs);
    assert_int_equal(atomic_load(&k.after_disc), 0);
    vrpc_ep_destroy(ep);
    client_stop(&c);
    echo_stop(&e);
}

/* ---- peer crash ------------------------------------------------------------ */

/* Child: a server that accepts, receives into few buffers and never reposts,
 * then waits to be killed. Prints its URI on stdout. */
static void child_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
}

int peer_child_main(const char *backend, const char *uri)
{
    struct vrpc_transport_attr a;
    struct vrpc_transport *tp;
    struct vrpc_cq_attr ca;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_listener *l;
    struct vrpc_listen_attr la;
    char bound[VRPC_URI_MAX];
    unsigned i;

    vrpc_transport_attr_init(&a);
    a.credits = 4;
    if (vrpc_transport_create(backend, &a, &tp) || vrpc_pool_create(tp, vrpc_transport_eager_size(tp), 4, &pool))
        return 1;
    vrpc_cq_attr_init(&ca);
    ca.cb = child_cb;
    if (vrpc_cq_create(tp, &ca, &cq))
        return 1;
    for (i = 0; i < 4; i++) { /* so at most 4 messages get in */
        struct vrpc_buf *b = vrpc_pool_get(pool);
        if (vrpc_cq_post_recv(cq, &b, NULL, 1))
            return 1;
    }
    memset(&la, 0, sizeof la);
    la.cqs = &cq;
    la.ncqs = 1;
    if (vrpc_listen(tp, uri, &la, &l) || vrpc_listener_uri(l, bound, sizeof bound))
        return 1;
    printf("%s\n", bound);
    fflush(stdout);
    for (;;)
        pause();
}

/* A peer process killed with SIGKILL while we have sends on the wire and
 * queued: every send completes exactly once (0 or -ECANCELED), one
 * DISCONNECTED follows, and every receive posted here is flushed once at CQ
 * destroy. */
void t_peer_crash(void **state)
{
    struct client c;
    struct counts k;
    struct vrpc_ep *ep;
    char uri[VRPC_URI_MAX], lu[VRPC_URI_MAX];
    int pfd[2], status;
    unsigned i, nsend = 12, nrecv = 8;
    pid_t pid;
    FILE *f;

    listen_uri(lu, sizeof lu);
    assert_int_equal(pipe(pfd), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        execl("/proc/self/exe", "test_transport", "--peer-child", g_opt.backend, lu, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    f = fdopen(pfd[0], "r");
    assert_non_null(f);
    assert_non_null(fgets(uri, sizeof uri, f));
    fclose(f);
    uri[strcspn(uri, "\n")] = 0;

    memset(&k, 0, sizeof k);
    assert_int_equal(client_start(&c, NULL, 32, nrecv, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, uri, &ep), 0);
    for (i = 0; i < nsend; i++)
        assert_int_equal(vrpc_ep_send(ep, vrpc_pool_get(c.pool), 8, i, i, 0), 0);
    assert_true(wait_until(&k.send_ok, 1, WAIT_MS));
    usleep(50000); /* whatever the child's credits let through is on the wire */
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    usleep(20000);
    printf("  peer killed: DISCONNECTED status %d (%s)\n", atomic_load(&k.disc_status),
           strerror(-atomic_load(&k.disc_status)));
    assert_int_equal(atomic_load(&k.disc), 1);
    assert_int_equal(atomic_load(&k.send_ok) + atomic_load(&k.send_err), nsend);
    assert_true(atomic_load(&k.send_err) >= nsend - 4); /* the child has 4 receive buffers */
    assert_int_equal(atomic_load(&k.after_disc), 0);
    vrpc_ep_destroy(ep);
    vrpc_cq_destroy(c.cq);
    c.cq = NULL;
    assert_int_equal(atomic_load(&k.recv_flush), nrecv);
    assert_int_equal(atomic_load(&k.recv_ok), 0);
    client_stop(&c);
}

/* ---- close during traffic ---------------------------------------------------- */

struct traffic {
    struct vrpc_pool *pool;
    struct vrpc_ep *ep;
    unsigned long accepted; /* sends that returned 0 */
    int last;
};

static void *traffic_sender(void *arg)
{
    struct traffic *t = arg;
    for (;;) {
        struct vrpc_buf *b = vrpc_pool_get(t->pool);
        int rc;
        if (!b) {
            sched_yield();
            continue;
        }
        rc = vrpc_ep_send(t->ep, b, 64, 0, 0, 0);
        if (rc == 0) {
            t->accepted++;
            continue;
        }
        vrpc_pool_put(b);
        if (rc == -EAGAIN) {
            sched_yield();
            continue;
        }
        t->last = rc;
        return NULL;
    }
}

/* Closing an endpoint while two threads send and the peer echoes: every send
 * that returned 0 completes exactly once, later sends get -ENOTCONN, nothing
 * names the endpoint after its DISCONNECTED. */
void t_close_during_traffic(void **state)
{
    struct echo e;
    struct echo_cfg ec = { .ncq = 1, .nbufs = 64 };
    struct client c;
    struct counts k;
    struct traffic t[2];
    pthread_t th[2];
    struct vrpc_ep *ep;
    int i;

    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 256, 64, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    for (i = 0; i < 2; i++) {
        t[i] = (struct traffic){ .pool = c.pool, .ep = ep };
        assert_int_equal(pthread_create(&th[i], NULL, traffic_sender, &t[i]), 0);
    }
    usleep(100000);
    assert_int_equal(vrpc_ep_close(ep), 0);
    for (i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].last, -ENOTCONN);
    }
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    usleep(50000);
    printf("  %lu sends accepted before the close: %lu completed, %lu flushed; %lu echoes received\n",
           t[0].accepted + t[1].accepted, atomic_load(&k.send_ok), atomic_load(&k.send_err),
           atomic_load(&k.recv_ok));
    assert_true(t[0].accepted + t[1].accepted > 0);
    assert_int_equal(atomic_load(&k.send_ok) + atomic_load(&k.send_err), t[0].accepted + t[1].accepted);
    assert_int_equal(atomic_load(&k.disc), 1);
    assert_int_equal(atomic_load(&k.after_disc), 0);
    vrpc_ep_destroy(ep);
    client_stop(&c);
    echo_stop(&e);
}

/* ---- listener close with pending accepts -------------------------------------- */

#define CONNECT_MAX 150

struct connector {
    struct client *c;
    const char *uri;
    atomic_ulong *total_ok;
    unsigned ok, refused, other;
    int other_rc;
    struct vrpc_ep *eps[CONNECT_MAX];
};

/* Connect until refused (then a few more, all refused), at most CONNECT_MAX. */
static void *connector_main(void *arg)
{
    struct connector *x = arg;
    unsigned i;
    for (i = 0; i < CONNECT_MAX && x->refused < 5; i++) {
        struct vrpc_ep *ep;
        int rc = client_connect(x->c, x->uri, &ep);
        if (rc == 0) {
            x->eps[x->ok++] = ep;
            atomic_fetch_add(x->total_ok, 1);
        } else if (rc == -ECONNREFUSED || rc == -ECONNRESET) {
            x->refused++;
        } else {
            x->other++;
            x->other_rc = rc;
        }
    }
    return NULL;
}

void t_listener_close_pending(void **state)
{
    struct echo e;
    struct echo_cfg ec = { .ncq = 1, .nbufs = 1024 };
    struct client c;
    struct connector x[3];
    pthread_t th[3];
    atomic_ulong total_ok = 0;
    unsigned i, j, ok = 0, refused = 0;

    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 1040, 1024, 0, NULL, NULL), 0);
    for (i = 0; i < 3; i++) {
        memset(&x[i], 0, sizeof x[i]);
        x[i].c = &c;
        x[i].uri = e.uri;
        x[i].total_ok = &total_ok;
        assert_int_equal(pthread_create(&th[i], NULL, connector_main, &x[i]), 0);
    }
    /* destroy the listener while the connectors are busy */
    assert_true(wait_until(&total_ok, 8, WAIT_MS));
    vrpc_listener_destroy(e.l);
    e.l = NULL;
    for (i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        if (x[i].other)
            printf("  unexpected connect error: %s\n", strerror(-x[i].other_rc));
        assert_int_equal(x[i].other, 0);
        ok += x[i].ok;
        refused += x[i].refused;
    }
    printf("  %u connects succeeded, %u refused around the listener's destruction\n", ok, refused);
    assert_true(ok >= 8);
    assert_true(refused > 0);
    assert_true(wait_until(&e.accepted, ok, WAIT_MS));
    usleep(20000);
    assert_int_equal(atomic_load(&e.accepted), ok);
    for (i = 0; i < 3; i++)
        for (j = 0; j < x[i].ok; j++)
            vrpc_ep_destroy(x[i].eps[j]);
    assert_true(coll_wait_n(&c.coll, VRPC_WC_DISCONNECTED, ok, WAIT_MS));
    client_stop(&c);
    echo_stop(&e);
}
