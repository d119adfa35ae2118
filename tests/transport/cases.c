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
        uint32_t pl[2] = {b->thread, seq};
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
    struct echo_cfg ec = {.ncq = 1, .nbufs = 32, .tattr = &sa, .repost_only = true, .on_recv = burst_check, .arg = &o};
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
        b[i] = (struct burst){.pool = c.pool, .ep = ep, .thread = i, .per = total / BURST_THREADS};
        assert_int_equal(pthread_create(&th[i], NULL, burst_sender, &b[i]), 0);
    }
    for (i = 0; i < BURST_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(b[i].fail, 0);
        eagain += b[i].eagain;
    }
    assert_true(wait_until(&e.recvs, total, 60000));
    assert_true(wait_until(&k.send_ok, total, 10000));
    printf("  burst: %u messages, %lu -EAGAIN retries, receiver credits %u, %u buffers\n", total, eagain, sa.credits,
           ec.nbufs);
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
    struct mixed m = {0};
    struct echo_cfg ec = {.ncq = 1, .nbufs = 128, .repost_only = true, .on_recv = mixed_check, .arg = &m};
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
    struct echo_cfg ec = {.ncq = 2, .nbufs = 2 * n + 256};
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
    struct echo_cfg ec = {.ncq = 1, .nbufs = 4, .tattr = &sa, .hold = true}; /* fewer than we send */
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
    struct echo_cfg ec = {.ncq = 1, .nbufs = 4, .hold = true, .repost_only = true};
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
    struct echo_cfg ec = {.ncq = 1, .nbufs = 4, .hold = true, .repost_only = true};
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
static void child_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg) {}

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
    struct echo_cfg ec = {.ncq = 1, .nbufs = 64};
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
        t[i] = (struct traffic){.pool = c.pool, .ep = ep};
        assert_int_equal(pthread_create(&th[i], NULL, traffic_sender, &t[i]), 0);
    }
    /* traffic is flowing (on a loaded machine the senders may take a while
     * to get a CPU: wait for it rather than for a fixed time) */
    assert_true(wait_until(&k.send_ok, 1, WAIT_MS));
    usleep(20000);
    assert_int_equal(vrpc_ep_close(ep), 0);
    for (i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].last, -ENOTCONN);
    }
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    usleep(50000);
    printf("  %lu sends accepted before the close: %lu completed, %lu flushed; %lu echoes received\n",
           t[0].accepted + t[1].accepted, atomic_load(&k.send_ok), atomic_load(&k.send_err), atomic_load(&k.recv_ok));
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
    struct echo_cfg ec = {.ncq = 1, .nbufs = 1024};
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

/* ---- reads, grants and revokes (large messages) ---------------------------------- */

#define CHUNK (64u << 10) /* read_chunk of both sides: several chunks per case, fast */

/* A grant of [p, p+len) of b on ep, or skip the case when the backend has no
 * grants yet (-ENOSYS): the verbs backend gains them separately. */
static uint32_t grant_or_skip(struct vrpc_ep *ep, struct vrpc_buf *b, const void *p, uint32_t len)
{
    uint32_t key = 0;
    int rc = vrpc_ep_grant(ep, b->mr, p, len, &key);
    if (rc == -ENOSYS) {
        printf("  SKIP: backend %s has no vrpc_ep_grant yet\n", g_opt.backend);
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_not_equal(key, 0);
    return key;
}

static void revoke_wait(struct rig *r, struct vrpc_ep *sep, uint32_t key, int want_status)
{
    struct vrpc_wc w;
    assert_int_equal(vrpc_ep_revoke(sep, key, 0x5e5e), 0);
    assert_true(coll_wait(&r->s.coll, VRPC_WC_REVOKE, sep, WAIT_MS, &w));
    assert_int_equal(w.wr_id, 0x5e5e);
    if (want_status != 1)
        assert_int_equal(w.status, want_status);
}

static void read_wait(struct rig *r, struct vrpc_ep *cep, uint64_t wr_id, int *status, struct vrpc_wc *out)
{
    assert_true(coll_wait(&r->c.coll, VRPC_WC_READ, cep, WAIT_MS, out));
    assert_int_equal(out->wr_id, wr_id);
    *status = out->status;
}

static void assert_lbuf_idle(struct vrpc_transport *tp)
{
    size_t pinned, in_use;
    vrpc_lbuf_stats(tp, &pinned, &in_use);
    assert_int_equal(in_use, 0);
}

/* Reads of 1 byte, chunk-1, chunk, chunk+1 and 3.5 chunks, from an offset
 * of the grant into an offset of the destination: one READ completion each
 * (wr_id, buf, byte_len), the bytes exactly those granted; each grant's
 * revoke completes 0; every large buffer goes back. */
void t_read_sizes(void **state)
{
    static const uint32_t sizes[] = {1, CHUNK - 1, CHUNK, CHUNK + 1, CHUNK * 7 / 2};
    struct rig r;
    struct vrpc_ep *cep, *sep;
    struct vrpc_buf *src, *dst;
    struct vrpc_wc w;
    unsigned i;
    int st;

    assert_int_equal(rig_start(&r, CHUNK), 0);
    assert_int_equal(rig_connect(&r, &cep, &sep), 0);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, 4 * CHUNK, &src), 0);
    assert_int_equal(vrpc_lbuf_get(r.c.tp, 4 * CHUNK, &dst), 0);
    fill(src->data, src->cap, 77);
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint32_t len = sizes[i], goff = 100 + i, doff = 7 * i, key;
        const char *gp = (const char *)src->data + 3;
        key = grant_or_skip(sep, src, gp, len + goff);
        memset(dst->data, 0xee, dst->cap);
        assert_int_equal(vrpc_ep_read(cep, dst, doff, len, (uint64_t)(uintptr_t)(gp + goff), key, 1000 + i), 0);
        read_wait(&r, cep, 1000 + i, &st, &w);
        assert_int_equal(st, 0);
        assert_ptr_equal(w.buf, dst);
        assert_int_equal(w.byte_len, len);
        assert_ptr_equal(w.ep, cep);
        assert_memory_equal((char *)dst->data + doff, gp + goff, len);
        assert_int_equal(((unsigned char *)dst->data)[doff + len], 0xee); /* nothing beyond */
        if (doff)
            assert_int_equal(((unsigned char *)dst->data)[doff - 1], 0xee);
        revoke_wait(&r, sep, key, 0);
    }
    /* bad arguments: no completion */
    assert_int_equal(vrpc_ep_read(cep, dst, 0, 0, (uint64_t)(uintptr_t)src->data, 1, 0), -EINVAL);
    assert_int_equal(vrpc_ep_read(cep, dst, 1, dst->cap, (uint64_t)(uintptr_t)src->data, 1, 0), -EINVAL);
    assert_int_equal(vrpc_ep_revoke(sep, 0, 0), -EINVAL);
    vrpc_lbuf_put(src);
    vrpc_lbuf_put(dst);
    assert_lbuf_idle(r.s.tp);
    assert_lbuf_idle(r.c.tp);
    vrpc_ep_destroy(cep);
    assert_true(coll_wait(&r.c.coll, VRPC_WC_DISCONNECTED, cep, WAIT_MS, &w));
    assert_int_equal(w.status, 0);
    vrpc_ep_destroy(sep);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep, WAIT_MS, &w));
    rig_stop(&r);
}

/* Grant, read, revoke, read again with the dead key: -EACCES, and the
 * connection fails on both sides (DISCONNECTED with an error), after which
 * nothing names it. */
void t_read_after_revoke(void **state)
{
    struct rig r;
    struct vrpc_ep *cep, *sep;
    struct vrpc_buf *src, *dst;
    struct vrpc_wc w;
    uint32_t key;
    int st;

    assert_int_equal(rig_start(&r, CHUNK), 0);
    assert_int_equal(rig_connect(&r, &cep, &sep), 0);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, CHUNK, &src), 0);
    assert_int_equal(vrpc_lbuf_get(r.c.tp, CHUNK, &dst), 0);
    fill(src->data, CHUNK, 5);
    key = grant_or_skip(sep, src, src->data, CHUNK);
    assert_int_equal(vrpc_ep_read(cep, dst, 0, CHUNK, (uint64_t)(uintptr_t)src->data, key, 1), 0);
    read_wait(&r, cep, 1, &st, &w);
    assert_int_equal(st, 0);
    revoke_wait(&r, sep, key, 0);
    assert_int_equal(vrpc_ep_revoke(sep, key, 0), -EINVAL); /* already revoked */
    assert_int_equal(vrpc_ep_read(cep, dst, 0, CHUNK, (uint64_t)(uintptr_t)src->data, key, 2), 0);
    read_wait(&r, cep, 2, &st, &w);
    assert_int_equal(st, -EACCES);
    assert_true(coll_wait(&r.c.coll, VRPC_WC_DISCONNECTED, cep, WAIT_MS, &w));
    assert_int_not_equal(w.status, 0);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep, WAIT_MS, &w));
    assert_int_not_equal(w.status, 0);
    assert_int_equal(vrpc_ep_read(cep, dst, 0, 1, (uint64_t)(uintptr_t)src->data, key, 3), -ENOTCONN);
    vrpc_lbuf_put(src);
    vrpc_lbuf_put(dst);
    vrpc_ep_destroy(cep);
    vrpc_ep_destroy(sep);
    usleep(20000);
    assert_int_equal(coll_count(&r.c.coll, VRPC_WC_READ, NULL), 0);
    rig_stop(&r);
}

/* A key granted on connection 1 used on connection 2 (same two transports):
 * -EACCES on connection 2, which fails; connection 1 still reads with it. */
void t_read_wrong_endpoint(void **state)
{
    struct rig r;
    struct vrpc_ep *cep1, *sep1, *cep2, *sep2;
    struct vrpc_buf *src, *dst;
    struct vrpc_wc w;
    uint32_t key;
    int st;

    assert_int_equal(rig_start(&r, CHUNK), 0);
    assert_int_equal(rig_connect(&r, &cep1, &sep1), 0);
    assert_int_equal(rig_connect(&r, &cep2, &sep2), 0);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, CHUNK, &src), 0);
    assert_int_equal(vrpc_lbuf_get(r.c.tp, CHUNK, &dst), 0);
    fill(src->data, CHUNK, 9);
    key = grant_or_skip(sep1, src, src->data, CHUNK);
    assert_int_equal(vrpc_ep_read(cep2, dst, 0, 4096, (uint64_t)(uintptr_t)src->data, key, 1), 0);
    read_wait(&r, cep2, 1, &st, &w);
    assert_int_equal(st, -EACCES);
    assert_true(coll_wait(&r.c.coll, VRPC_WC_DISCONNECTED, cep2, WAIT_MS, &w));
    assert_int_not_equal(w.status, 0);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep2, WAIT_MS, &w));
    /* connection 1 is untouched */
    assert_int_equal(vrpc_ep_read(cep1, dst, 0, CHUNK, (uint64_t)(uintptr_t)src->data, key, 2), 0);
    read_wait(&r, cep1, 2, &st, &w);
    assert_int_equal(st, 0);
    assert_memory_equal(dst->data, src->data, CHUNK);
    revoke_wait(&r, sep1, key, 0);
    vrpc_lbuf_put(src);
    vrpc_lbuf_put(dst);
    vrpc_ep_destroy(cep1);
    vrpc_ep_destroy(cep2);
    vrpc_ep_destroy(sep1);
    vrpc_ep_destroy(sep2);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep1, WAIT_MS, &w));
    rig_stop(&r);
}

/* A read reaching past the granted buffer (its whole MR granted): -EACCES
 * and the connection fails; the owner's memory is not written. */
void t_read_past_buffer(void **state)
{
    struct rig r;
    struct vrpc_ep *cep, *sep;
    struct vrpc_buf *src, *dst;
    struct vrpc_wc w;
    uint32_t key;
    int st;

    assert_int_equal(rig_start(&r, CHUNK), 0);
    assert_int_equal(rig_connect(&r, &cep, &sep), 0);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, CHUNK, &src), 0);
    assert_int_equal(vrpc_lbuf_get(r.c.tp, 2 * CHUNK, &dst), 0);
    fill(src->data, src->cap, 3);
    key = grant_or_skip(sep, src, src->data, src->cap);
    assert_int_equal(vrpc_ep_read(cep, dst, 0, 8192, (uint64_t)(uintptr_t)src->data + src->cap - 4096, key, 1), 0);
    read_wait(&r, cep, 1, &st, &w);
    assert_int_equal(st, -EACCES);
    assert_true(coll_wait(&r.c.coll, VRPC_WC_DISCONNECTED, cep, WAIT_MS, &w));
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep, WAIT_MS, &w));
    assert_int_equal(csum(src->data, src->cap), csum(src->data, src->cap)); /* still mapped */
    /* after its DISCONNECTED: -ENOTCONN, the key died with the endpoint
     * (TCP still accepts it and completes -ECANCELED; to be aligned) */
    {
        int rc = vrpc_ep_revoke(sep, key, 0x5e5e);
        assert_true(rc == 0 || rc == -ENOTCONN);
        if (rc == 0) {
            assert_true(coll_wait(&r.s.coll, VRPC_WC_REVOKE, sep, WAIT_MS, &w));
            assert_int_equal(w.status, -ECANCELED);
        }
    }
    vrpc_lbuf_put(src);
    vrpc_lbuf_put(dst);
    vrpc_ep_destroy(cep);
    vrpc_ep_destroy(sep);
    rig_stop(&r);
}

/* Tail zeroing seen from the peer: a cache buffer that held 1.2 MiB of 0xAA,
 * reused for a 1.05 MiB payload and granted whole: a read of all of it sees
 * the payload, then zeros only. */
void t_read_tail_zeroed(void **state)
{
    struct rig r;
    struct vrpc_ep *cep, *sep;
    struct vrpc_buf *src, *dst;
    struct vrpc_wc w;
    size_t old = 1200u << 10, plen = 1050u << 10, i;
    const unsigned char *p;
    uint32_t key;
    int st;

    assert_int_equal(rig_start(&r, 0), 0);
    assert_int_equal(rig_connect(&r, &cep, &sep), 0);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, old, &src), 0);
    memset(src->data, 0xaa, old);
    vrpc_lbuf_put(src);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, plen, &src), 0);
    fill(src->data, plen, 11);
    assert_int_equal(vrpc_lbuf_get(r.c.tp, src->cap, &dst), 0);
    key = grant_or_skip(sep, src, src->data, src->cap);
    assert_int_equal(vrpc_ep_read(cep, dst, 0, src->cap, (uint64_t)(uintptr_t)src->data, key, 1), 0);
    read_wait(&r, cep, 1, &st, &w);
    assert_int_equal(st, 0);
    p = dst->data;
    assert_int_equal(csum(p, plen), csum(src->data, plen));
    for (i = plen; i < src->cap; i++)
        if (p[i])
            fail_msg("byte %zu of the granted buffer is %#x, not zero (payload %zu bytes)", i, p[i], plen);
    revoke_wait(&r, sep, key, 0);
    vrpc_lbuf_put(src);
    vrpc_lbuf_put(dst);
    vrpc_ep_destroy(cep);
    vrpc_ep_destroy(sep);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep, WAIT_MS, &w));
    rig_stop(&r);
}

/* How many READ completions of ep the CQ delivered before its first RECV
 * (the collector keeps delivery order; nothing else takes from it here). */
static unsigned reads_delivered_before_recv(struct coll *c, struct vrpc_ep *ep)
{
    unsigned n = 0;
    size_t i;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->n && !(c->wc[i].opcode == VRPC_WC_RECV && c->wc[i].ep == ep); i++)
        n += c->wc[i].opcode == VRPC_WC_READ && c->wc[i].ep == ep;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Several large reads queued on one endpoint while small messages flow both
 * ways: a small message from the owner (the direction the read data flows)
 * arrives while the reads are still running, i.e. before the last READ
 * completion; every read's bytes are right. Order is asserted, not time. */
void t_reads_with_small_sends(void **state)
{
    enum { NREADS = 4 };
    const uint32_t big = scaled(8) < 1 ? 1u << 20 : scaled(8) << 20; /* 8 MiB, 2 under sanitizers */
    struct rig r;
    struct vrpc_ep *cep, *sep;
    struct vrpc_buf *src, *dst[NREADS], *b;
    struct vrpc_wc w;
    uint32_t key, sum;
    unsigned i, issued = 0, done = 0, reads_before_recv;
    int rc;

    assert_int_equal(rig_start(&r, 0), 0);
    assert_int_equal(rig_connect(&r, &cep, &sep), 0);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, big, &src), 0);
    fill(src->data, big, 21);
    sum = csum(src->data, big);
    for (i = 0; i < NREADS; i++)
        assert_int_equal(vrpc_lbuf_get(r.c.tp, big, &dst[i]), 0);
    key = grant_or_skip(sep, src, src->data, big);
    while (issued < NREADS) {
        rc = vrpc_ep_read(cep, dst[issued], 0, big, (uint64_t)(uintptr_t)src->data, key, issued);
        if (rc == -ENOSPC) { /* the backend's queue bound: go on after a completion */
            assert_true(issued > 0);
            assert_true(coll_wait_n(&r.c.coll, VRPC_WC_READ, done + 1, WAIT_MS));
            done++;
            continue;
        }
        assert_int_equal(rc, 0);
        issued++;
        if (issued == 1) {
            /* one small message each way while the first read is in flight */
            b = vrpc_pool_get(r.s.pool);
            memcpy(b->data, "small", 5);
            assert_int_equal(vrpc_ep_send(sep, b, 5, 42, 7, 0), 0);
            b = vrpc_pool_get(r.c.pool);
            memcpy(b->data, "tiny", 4);
            assert_int_equal(vrpc_ep_send(cep, b, 4, 43, 8, 0), 0);
        }
    }
    assert_true(coll_wait_n(&r.c.coll, VRPC_WC_RECV, 1, WAIT_MS));
    reads_before_recv = reads_delivered_before_recv(&r.c.coll, cep);
    assert_true(coll_wait(&r.c.coll, VRPC_WC_RECV, cep, WAIT_MS, &w));
    assert_int_equal(w.imm, 42);
    assert_memory_equal(w.buf->data, "small", 5);
    assert_int_equal(vrpc_cq_post_recv(r.c.cq, &w.buf, NULL, 1), 0);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_RECV, sep, WAIT_MS, &w));
    assert_int_equal(w.imm, 43);
    assert_int_equal(vrpc_cq_post_recv(r.s.cq, &w.buf, NULL, 1), 0);
    printf("  %u reads of %u MiB queued; the owner's small message arrived after %u of them completed\n", NREADS,
           big >> 20, reads_before_recv);
    assert_true(reads_before_recv < NREADS);
    for (i = 0; i < NREADS; i++) {
        assert_true(coll_wait(&r.c.coll, VRPC_WC_READ, cep, WAIT_MS, &w));
        assert_int_equal(w.status, 0);
        assert_true(w.wr_id < NREADS);
        assert_ptr_equal(w.buf, dst[w.wr_id]);
        assert_int_equal(csum(dst[w.wr_id]->data, big), sum);
    }
    assert_true(coll_wait(&r.s.coll, VRPC_WC_SEND, sep, WAIT_MS, &w));
    vrpc_pool_put(w.buf);
    assert_true(coll_wait(&r.c.coll, VRPC_WC_SEND, cep, WAIT_MS, &w));
    vrpc_pool_put(w.buf);
    revoke_wait(&r, sep, key, 0);
    vrpc_lbuf_put(src);
    for (i = 0; i < NREADS; i++)
        vrpc_lbuf_put(dst[i]);
    assert_lbuf_idle(r.s.tp);
    assert_lbuf_idle(r.c.tp);
    vrpc_ep_destroy(cep);
    vrpc_ep_destroy(sep);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep, WAIT_MS, &w));
    rig_stop(&r);
}

/* Revoke while the peer reads (two reads of the grant in flight): exactly
 * one REVOKE completion and one READ completion per read. Once REVOKE has
 * completed no read touches the memory: the owner scribbles over it, and a
 * read that still succeeds carries only the original bytes. A read cut
 * short fails (-EACCES, or -ECANCELED when the connection died first), and
 * then the connection fails: DISCONNECTED after both reads. */
void t_revoke_during_read(void **state)
{
    const uint32_t big = scaled(8) < 2 ? 2u << 20 : scaled(8) << 20;
    struct rig r;
    struct vrpc_ep *cep, *sep;
    struct vrpc_buf *src, *dst[2];
    struct vrpc_wc w;
    uint32_t key, sum;
    unsigned i, failed = 0;

    assert_int_equal(rig_start(&r, 0), 0);
    assert_int_equal(rig_connect(&r, &cep, &sep), 0);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, big, &src), 0);
    fill(src->data, big, 31);
    sum = csum(src->data, big);
    key = grant_or_skip(sep, src, src->data, big);
    for (i = 0; i < 2; i++) {
        assert_int_equal(vrpc_lbuf_get(r.c.tp, big, &dst[i]), 0);
        assert_int_equal(vrpc_ep_read(cep, dst[i], 0, big, (uint64_t)(uintptr_t)src->data, key, i), 0);
    }
    usleep(1000);
    revoke_wait(&r, sep, key, 1);
    memset(src->data, 0xee, big);
    for (i = 0; i < 2; i++) {
        assert_true(coll_wait(&r.c.coll, VRPC_WC_READ, cep, WAIT_MS, &w));
        assert_true(w.wr_id < 2);
        printf("  read %u completed %d (%s) after the revoke\n", (unsigned)w.wr_id, w.status, strerror(-w.status));
        if (w.status == 0) {
            assert_int_equal(csum(dst[w.wr_id]->data, big), sum);
        } else {
            /* verbs on rxe: a window invalidated while a READ response is
             * sent leaves that READ without completion until the read
             * watchdog (idle timeout) fails it */
            assert_true(w.status == -EACCES || w.status == -ECANCELED || w.status == -ETIMEDOUT);
            failed++;
        }
    }
    if (failed)
        assert_true(coll_wait(&r.c.coll, VRPC_WC_DISCONNECTED, cep, WAIT_MS, &w));
    usleep(20000);
    assert_int_equal(coll_count(&r.c.coll, VRPC_WC_READ, NULL), 0); /* once each */
    vrpc_lbuf_put(src);
    for (i = 0; i < 2; i++)
        vrpc_lbuf_put(dst[i]);
    vrpc_ep_destroy(cep);
    vrpc_ep_destroy(sep);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep, WAIT_MS, &w));
    rig_stop(&r);
}

/* ---- abortive close ----------------------------------------------------------- */

/* Scan the collector for ep's completions: counts per opcode and status, and
 * whether DISCONNECTED is the last one of ep. */
struct ep_tally {
    unsigned sends, send_cancel, reads, read_cancel, disc, other;
    int disc_status;
    bool disc_last;
};

static void tally(struct coll *c, struct vrpc_ep *ep, struct ep_tally *t)
{
    size_t i;
    memset(t, 0, sizeof *t);
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->n; i++) {
        const struct vrpc_wc *w = &c->wc[i];
        if (w->ep != ep)
            continue;
        t->disc_last = false;
        if (w->opcode == VRPC_WC_SEND) {
            t->sends++;
            t->send_cancel += w->status == -ECANCELED;
            t->other += w->status && w->status != -ECANCELED;
        } else if (w->opcode == VRPC_WC_READ) {
            t->reads++;
            t->read_cancel += w->status == -ECANCELED;
            t->other += w->status && w->status != -ECANCELED;
        } else if (w->opcode == VRPC_WC_DISCONNECTED) {
            t->disc++;
            t->disc_status = w->status;
            t->disc_last = true;
        } else {
            t->other++;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* vrpc_ep_abort on an endpoint with sends queued for credits (the peer holds
 * every buffer it received), a large read in flight and a grant of its own:
 * at once (well within the idle timeout a graceful close would wait for),
 * every send and the read complete exactly once (0, or -ECANCELED for what
 * had not finished), DISCONNECTED comes last with the abort's status, the
 * key is dead, and nothing new is accepted. The peer loses its connection. */
void t_abort(void **state)
{
    const uint32_t big = scaled(8) < 2 ? 2u << 20 : scaled(8) << 20;
    const unsigned nsend = 48; /* more than the server's 32 buffers, which it keeps */
    struct vrpc_pool *pool;
    struct rig r;
    struct vrpc_ep *cep, *sep;
    struct vrpc_buf *src, *dst, *mine, *b;
    struct ep_tally t;
    struct vrpc_wc w;
    uint32_t key, mykey;
    uint64_t t0, ms;
    unsigned i;

    assert_int_equal(rig_start(&r, 0), 0);
    assert_int_equal(rig_connect(&r, &cep, &sep), 0);
    assert_int_equal(vrpc_lbuf_get(r.s.tp, big, &src), 0);
    fill(src->data, big, 41);
    key = grant_or_skip(sep, src, src->data, big);
    assert_int_equal(vrpc_lbuf_get(r.c.tp, big, &dst), 0);
    assert_int_equal(vrpc_lbuf_get(r.c.tp, 4096, &mine), 0);
    mykey = grant_or_skip(cep, mine, mine->data, 4096);
    assert_int_equal(vrpc_pool_create(r.c.tp, 64, nsend + 1, &pool), 0);
    for (i = 0; i < nsend; i++) {
        assert_non_null(b = vrpc_pool_get(pool));
        assert_int_equal(vrpc_ep_send(cep, b, 8, i, i, 0), 0);
    }
    /* the server keeps what it receives: past its credits (at most its 32
     * posted buffers; the backends differ in how many they promise at
     * first), the rest waits for credits that never come */
    assert_true(coll_wait_n(&r.s.coll, VRPC_WC_RECV, 1, WAIT_MS));
    usleep(200000);
    assert_int_equal(vrpc_ep_read(cep, dst, 0, big, (uint64_t)(uintptr_t)src->data, key, 7), 0);
    t0 = now_ms();
    assert_int_equal(vrpc_ep_abort(cep, -ECONNABORTED), 0);
    assert_int_equal(vrpc_ep_abort(cep, -EPROTO), -ENOTCONN); /* idempotent */
    assert_non_null(b = vrpc_pool_get(pool));
    assert_int_equal(vrpc_ep_send(cep, b, 8, 0, 99, 0), -ENOTCONN);
    vrpc_pool_put(b);
    assert_true(coll_wait_n(&r.c.coll, VRPC_WC_DISCONNECTED, 1, WAIT_MS));
    ms = now_ms() - t0;
    usleep(50000); /* anything after DISCONNECTED would show up now */
    tally(&r.c.coll, cep, &t);
    printf("  abort: DISCONNECTED %d after %llu ms; %u sends (%u flushed), %u read (%u flushed)\n", t.disc_status,
           (unsigned long long)ms, t.sends, t.send_cancel, t.reads, t.read_cancel);
    assert_true(ms < 5000); /* a graceful close would wait for the idle timeout (10 s) */
    assert_int_equal(t.disc, 1);
    assert_true(t.disc_last);
    assert_int_equal(t.disc_status, -ECONNABORTED);
    assert_int_equal(t.sends, nsend);
    assert_true(t.send_cancel >= 1); /* some were still queued for credits */
    assert_int_equal(t.reads, 1);
    assert_int_equal(t.other, 0);
    assert_int_equal(vrpc_ep_revoke(cep, mykey, 1), -ENOTCONN); /* the key died with it */
    assert_int_equal(vrpc_ep_abort(cep, -ECONNABORTED), -ENOTCONN);
    assert_true(coll_wait(&r.s.coll, VRPC_WC_DISCONNECTED, sep, WAIT_MS, &w));
    printf("  the peer's DISCONNECTED: %d (%s)\n", w.status, strerror(-w.status));
    while (coll_wait(&r.c.coll, VRPC_WC_SEND, cep, 0, &w))
        vrpc_pool_put(w.buf);
    vrpc_pool_destroy(pool);
    vrpc_ep_destroy(cep);
    vrpc_ep_destroy(sep);
    vrpc_lbuf_put(src);
    vrpc_lbuf_put(dst);
    vrpc_lbuf_put(mine);
    rig_stop(&r);
}
