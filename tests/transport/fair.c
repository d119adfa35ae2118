/* Conformance cases for the fair-share rules of transport.h (every backend):
 * a listener's connection limit refuses one connection more at the
 * handshake and lets one in again once a connection left; a peer that
 * returns no credits while our sends wait for them costs us the connection
 * after credit_timeout_ms (rule 6), not forever; an eager size below
 * VRPC_EAGER_MIN is refused at create. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cases.h"
#include "harness.h"

#define WAIT_MS 20000

static bool wait_count(atomic_ulong *v, unsigned long want, int ms)
{
    for (int i = 0; i < ms && atomic_load(v) < want; i++)
        usleep(1000);
    return atomic_load(v) >= want;
}

/* max_conns 2: two clients in, a third refused before it is ever reported
 * (the server's ACCEPTED count stays 2), then in once one of the two left. */
void t_fair_max_conns(void **state)
{
    struct echo_cfg ec = {.ncq = 1, .nbufs = 32, .max_conns = 2};
    struct echo e;
    struct client c;
    struct vrpc_ep *a, *b, *x = NULL;
    struct vrpc_wc w;
    (void)state;
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 16, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&c, e.uri, &a), 0);
    assert_int_equal(client_connect(&c, e.uri, &b), 0);
    assert_int_equal(client_connect(&c, e.uri, &x), -ECONNREFUSED);
    assert_true(wait_count(&e.accepted, 2, WAIT_MS));
    assert_int_equal(atomic_load(&e.accepted), 2);
    vrpc_ep_destroy(a);
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, a, WAIT_MS, &w));
    assert_true(wait_count(&e.disconnected, 1, WAIT_MS));
    assert_int_equal(client_connect(&c, e.uri, &x), 0);
    assert_true(wait_count(&e.accepted, 3, WAIT_MS));
    vrpc_ep_destroy(b);
    vrpc_ep_destroy(x);
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, b, WAIT_MS, &w));
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, x, WAIT_MS, &w));
    client_stop(&c);
    echo_stop(&e);
}

/* The server holds every message it gets and has 4 receive buffers posted:
 * once they are all consumed (never reposted) it returns no credits, so the
 * client's sends beyond them wait, and credit_timeout_ms (500) later the client's endpoint fails with
 * -ETIMEDOUT; every send completes exactly once (sent or flushed). Before
 * rule 6 the sends waited, holding their buffers, as long as the peer
 * stayed. */
void t_fair_credit_timeout(void **state)
{
    struct echo_cfg ec = {.ncq = 1, .nbufs = 4, .hold = true};
    struct vrpc_transport_attr ta;
    struct echo e;
    struct client c;
    struct vrpc_ep *ep;
    struct vrpc_wc w;
    struct timespec t0, t1;
    const unsigned n = 12;
    (void)state;
    vrpc_transport_attr_init(&ta);
    ta.credit_timeout_ms = 500;
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, &ta, 32, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0; i < n; i++) {
        struct vrpc_buf *b = vrpc_pool_get(c.pool);
        assert_non_null(b);
        fill(b->data, 64, i);
        assert_int_equal(vrpc_ep_send(ep, b, 64, i, i, 0), 0);
    }
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, ep, WAIT_MS, &w));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("  %u sends to a peer that returns no credits: DISCONNECTED %d (%s) after %.2f s, %lu delivered\n", n,
           w.status, strerror(-w.status), s, atomic_load(&e.recvs));
    assert_int_equal(w.status, -ETIMEDOUT);
    assert_true(s >= 0.45);
    assert_true(atomic_load(&e.recvs) < n);
    assert_true(coll_wait_n(&c.coll, VRPC_WC_SEND, n, WAIT_MS));
    assert_int_equal(coll_count(&c.coll, VRPC_WC_SEND, NULL), n);
    while (coll_wait(&c.coll, VRPC_WC_SEND, NULL, 0, &w))
        vrpc_pool_put(w.buf);
    vrpc_ep_destroy(ep);
    echo_release(&e);
    client_stop(&c);
    echo_stop(&e);
}

/* Eager sizes below VRPC_EAGER_MIN are refused at create; the minimum works. */
void t_fair_eager_min(void **state)
{
    struct vrpc_transport_attr ta;
    struct vrpc_transport *tp = NULL;
    (void)state;
    vrpc_transport_attr_init(&ta);
    ta.eager_size = VRPC_EAGER_MIN - 1;
    assert_int_equal(vrpc_transport_create(g_opt.backend, &ta, &tp), -EINVAL);
    ta.eager_size = 44;
    assert_int_equal(vrpc_transport_create(g_opt.backend, &ta, &tp), -EINVAL);
    ta.eager_size = VRPC_EAGER_MIN;
    assert_int_equal(vrpc_transport_create(g_opt.backend, &ta, &tp), 0);
    assert_int_equal(vrpc_transport_eager_size(tp), VRPC_EAGER_MIN);
    vrpc_transport_destroy(tp);
}

/* Rule 7 end to end. A server with 32 receive buffers on one CQ that
 * reposts what it gets: connections are made, each sending a burst of 16
 * messages (so its reservation grows, rule 3), until the server refuses
 * one. Then, for up to 6 s, every connection sends one message per 150 ms (a
 * light load, fewer messages per shrink_ms than the minimum reservation,
 * that spends the credits it holds) while one more connection is tried
 * each round, until 6 more are in. With shrink_ms 200 the light
 * connections are cut back to the minimum and new ones get in; with
 * VRPC_SHRINK_NEVER at most one does (a refusal of the fill can come while
 * its last burst still holds buffers). */
#define SHRINK_MAX_EPS 64

static void send_one(struct client *c, struct vrpc_ep *ep, uint32_t i)
{
    struct vrpc_buf *b;
    struct vrpc_wc w;
    int rc;
    while (!(b = vrpc_pool_get(c->pool))) {
        assert_true(coll_wait(&c->coll, VRPC_WC_SEND, NULL, WAIT_MS, &w));
        vrpc_pool_put(w.buf);
    }
    fill(b->data, 64, i);
    while ((rc = vrpc_ep_send(ep, b, 64, i, i, 0)) == -EAGAIN) {
        assert_true(coll_wait(&c->coll, VRPC_WC_SEND, NULL, WAIT_MS, &w));
        vrpc_pool_put(w.buf);
    }
    assert_int_equal(rc, 0);
}

static void shrink_case(uint32_t shrink_ms, unsigned *before, unsigned *after)
{
    struct vrpc_transport_attr ta;
    struct echo e;
    struct client c;
    struct vrpc_ep *eps[SHRINK_MAX_EPS];
    struct vrpc_wc w;
    unsigned n = 0, more = 0;
    uint32_t seq = 0;
    vrpc_transport_attr_init(&ta);
    ta.shrink_ms = shrink_ms;
    struct echo_cfg ec = {.tattr = &ta, .ncq = 1, .nbufs = 32, .repost_only = true};
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 512, 256, 0, NULL, NULL), 0);
    while (n < SHRINK_MAX_EPS && client_connect(&c, e.uri, &eps[n]) == 0) {
        for (int k = 0; k < 16; k++)
            send_one(&c, eps[n], seq++);
        n++;
    }
    *before = n;
    for (int round = 0; round < 40 && n < SHRINK_MAX_EPS && more < 6; round++) {
        for (unsigned i = 0; i < n; i++)
            send_one(&c, eps[i], seq++);
        while (coll_wait(&c.coll, VRPC_WC_SEND, NULL, 0, &w))
            vrpc_pool_put(w.buf);
        usleep(150000);
        if (client_connect(&c, e.uri, &eps[n]) == 0) {
            n++;
            more++;
        }
    }
    *after = more;
    for (unsigned i = 0; i < n; i++)
        vrpc_ep_destroy(eps[i]);
    for (unsigned i = 0; i < n; i++)
        coll_wait(&c.coll, VRPC_WC_DISCONNECTED, eps[i], WAIT_MS, &w);
    while (coll_wait(&c.coll, VRPC_WC_SEND, NULL, 0, &w))
        vrpc_pool_put(w.buf);
    client_stop(&c);
    echo_stop(&e);
}

void t_fair_shrink(void **state)
{
    unsigned before, after, nbefore, nafter;
    (void)state;
    shrink_case(200, &before, &after);
    shrink_case(VRPC_SHRINK_NEVER, &nbefore, &nafter);
    printf("  32 receive buffers: shrink_ms 200: %u connections in, %u more after the light load; "
           "VRPC_SHRINK_NEVER: %u in, %u more\n",
           before, after, nbefore, nafter);
    assert_true(before >= 1 && before < SHRINK_MAX_EPS);
    assert_true(nbefore >= 1 && nbefore < SHRINK_MAX_EPS);
    assert_true(after >= 4);
    assert_true(nafter <= 1); /* one refusal while the fill's last burst was in flight */
}
