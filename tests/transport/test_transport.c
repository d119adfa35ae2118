/* The transport conformance suite: one program, every backend
 * (--backend tcp|verbs). Each case states the contract of
 * include/verbrpc/transport.h it checks. TCP-only bad-peer cases live in
 * bad_peer.c and run only with --backend tcp. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "verbs_setup.h"
#include "harness.h"
#include "cases.h"

#define WAIT_MS 10000

/* connect/accept: the server sees ACCEPTED, both ends close gracefully and
 * each gets exactly one DISCONNECTED with status 0, after nothing else. */
static void t_connect_accept(void **state)
{
    struct echo e;
    struct echo_cfg ec = {.ncq = 1, .nbufs = 64};
    struct client c;
    struct vrpc_ep *ep;
    struct vrpc_wc w;
    char peer[VRPC_URI_MAX];

    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 16, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    assert_int_equal(vrpc_ep_peer_uri(ep, peer, sizeof peer), 0);
    assert_string_equal(peer, e.uri);
    assert_true(vrpc_ep_eager_size(ep) == vrpc_transport_eager_size(c.tp));
    for (int i = 0; i < 500 && atomic_load(&e.accepted) == 0; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&e.accepted), 1);
    assert_int_equal(vrpc_ep_close(ep), 0);
    assert_int_equal(vrpc_ep_close(ep), -ENOTCONN);
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, ep, WAIT_MS, &w));
    assert_int_equal(w.status, 0);
    for (int i = 0; i < 500 && atomic_load(&e.disconnected) == 0; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&e.disconnected), 1);
    assert_int_equal(atomic_load(&e.disc_err), 0);
    /* nothing follows DISCONNECTED */
    usleep(50000);
    assert_int_equal(coll_count(&c.coll, VRPC_WC_DISCONNECTED, ep), 0);
    assert_int_equal(vrpc_ep_send(ep, vrpc_pool_get(c.pool), 1, 0, 0, 0), -ENOTCONN);
    vrpc_ep_destroy(ep);
    client_stop(&c);
    echo_stop(&e);
}

/* Capabilities (vrpc_transport_caps): what each backend declares, the same
 * under the fault layer as without it, and the operations they cover agree:
 * vrpc_ep_grant_segs is -ENOSYS exactly without VRPC_TP_CAP_GATHER (checked
 * before its arguments), vrpc_mr_reg with VRPC_ACCESS_REMOTE_READ exactly
 * without VRPC_TP_CAP_REMOTE_READ. vrpc_transport_scheme_check knows every
 * backend name, compiled in or not, and a layer only as layer+backend. */
static void t_caps(void **state)
{
    struct echo e;
    struct echo_cfg ec = {.ncq = 1, .nbufs = 64};
    struct client c;
    struct vrpc_ep *ep;
    struct vrpc_mr *mr = NULL;
    static char region[4096];
    uint32_t key, caps;
    const char *b = strncmp(g_opt.backend, "fault+", 6) ? g_opt.backend : g_opt.backend + 6;

    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 16, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    caps = vrpc_transport_caps(c.tp);
    if (!strcmp(b, "tcp"))
        assert_int_equal(caps, VRPC_TP_CAP_GATHER);
    else
        assert_int_equal(caps, VRPC_TP_CAP_REMOTE_READ | VRPC_TP_CAP_PINS_MEMORY);
    assert_int_equal(vrpc_ep_grant_segs(ep, NULL, 0, &key), (caps & VRPC_TP_CAP_GATHER) ? -EINVAL : -ENOSYS);
    int rc = vrpc_mr_reg(c.tp, region, sizeof region, VRPC_ACCESS_REMOTE_READ, &mr);
    if (caps & VRPC_TP_CAP_REMOTE_READ) {
        assert_int_equal(rc, 0);
        vrpc_mr_dereg(mr);
    } else {
        assert_int_equal(rc, -ENOSYS);
    }
    vrpc_ep_destroy(ep);
    client_stop(&c);
    echo_stop(&e);

    const char *known[] = {"auto", "tcp", "verbs", "fault+tcp", "fault+verbs", "fault+auto"};
    const char *unknown[] = {"", "foo", "fault", "fault+fault", "tcp+tcp", "fault+", "tcpx", NULL};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strncmp(known[i], "fault+", 6) || !strncmp(g_opt.backend, "fault+", 6))
            assert_int_equal(vrpc_transport_scheme_check(known[i]), 0);
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
        assert_int_equal(vrpc_transport_scheme_check(unknown[i]), -ENOENT);
}

/* A port where nothing listens gives -ECONNREFUSED, quickly, with no endpoint. */
static void t_connect_refused(void **state)
{
    struct client c;
    struct vrpc_ep *ep = NULL;
    struct vrpc_transport *tp;
    struct vrpc_listener *l;
    struct vrpc_listen_attr la;
    char uri[VRPC_URI_MAX];
    int rc;

    assert_int_equal(client_start(&c, NULL, 4, 0, 0, NULL, NULL), 0);
    /* Learn a free port by listening and closing again. */
    assert_int_equal(vrpc_transport_create(g_opt.backend, NULL, &tp), 0);
    memset(&la, 0, sizeof la);
    la.cqs = &c.cq;
    la.ncqs = 1;
    listen_uri(uri, sizeof uri);
    assert_int_equal(vrpc_listen(c.tp, uri, &la, &l), 0);
    assert_int_equal(vrpc_listener_uri(l, uri, sizeof uri), 0);
    vrpc_listener_destroy(l);
    vrpc_transport_destroy(tp);
    rc = client_connect(&c, uri, &ep);
    assert_int_equal(rc, -ECONNREFUSED);
    assert_null(ep);
    /* malformed URIs and foreign schemes are refused before any I/O */
    assert_int_equal(client_connect(&c, "tcp//127.0.0.1:1", &ep), -EINVAL);
    assert_int_equal(client_connect(&c, "tcp://127.0.0.1:99999", &ep), -EINVAL);
    assert_int_equal(client_connect(&c, "tcp://::1:80", &ep), -EINVAL);
    assert_int_equal(
        client_connect(&c, !strcmp(g_opt.backend, "tcp") ? "verbs://127.0.0.1:1" : "tcp://127.0.0.1:1", &ep),
        -EPROTONOSUPPORT);
    client_stop(&c);
}

/* IPv6 URIs: tcp://[::1]:0 listens, reports a bracketed URI, and carries a
 * message. (TCP only: the verbs set-ups are IPv4.) */
static void t_ipv6_uri(void **state)
{
    struct vrpc_transport *tp;
    struct vrpc_listener *l;
    struct vrpc_listen_attr la;
    struct client c;
    struct vrpc_ep *ep;
    struct vrpc_wc w;
    char uri[VRPC_URI_MAX];
    int rc;

    if (strcmp(g_opt.backend, "tcp"))
        skip();
    assert_int_equal(client_start(&c, NULL, 16, 8, 0, NULL, NULL), 0);
    memset(&la, 0, sizeof la);
    la.cqs = &c.cq;
    la.ncqs = 1;
    tp = c.tp;
    rc = vrpc_listen(tp, "tcp://[::1]:0", &la, &l);
    if (rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT) {
        client_stop(&c);
        printf("  no IPv6 loopback here: %s\n", strerror(-rc));
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(vrpc_listener_uri(l, uri, sizeof uri), 0);
    assert_memory_equal(uri, "tcp://[::1]:", 12);
    /* one CQ serves both ends: the accepted side and the connecting side */
    assert_int_equal(client_connect(&c, uri, &ep), 0);
    assert_true(coll_wait(&c.coll, VRPC_WC_ACCEPTED, NULL, WAIT_MS, &w));
    struct vrpc_ep *sep = w.ep;
    struct vrpc_buf *b = vrpc_pool_get(c.pool);
    memcpy(b->data, "v6", 2);
    assert_int_equal(vrpc_ep_send(ep, b, 2, 6, 0, 0), 0);
    assert_true(coll_wait(&c.coll, VRPC_WC_RECV, sep, WAIT_MS, &w));
    assert_int_equal(w.byte_len, 2);
    assert_memory_equal(w.buf->data, "v6", 2);
    assert_int_equal(vrpc_cq_post_recv(c.cq, &w.buf, NULL, 1), 0);
    vrpc_listener_destroy(l);
    vrpc_ep_destroy(ep);
    vrpc_ep_destroy(sep);
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, ep, WAIT_MS, &w));
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, sep, WAIT_MS, &w));
    client_stop(&c);
}

/* Ping-pong with checksummed payloads of every size 0..eager: boundaries and
 * immediates kept, the echo is byte-identical. */
static void t_pingpong_sizes(void **state)
{
    struct echo e;
    struct echo_cfg ec = {.ncq = 1, .nbufs = 64};
    struct client c;
    struct vrpc_ep *ep;
    struct vrpc_wc w;
    uint32_t eager, size, step;
    struct vrpc_buf *b;

    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 16, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    eager = vrpc_ep_eager_size(ep);
    /* every size; under sanitizers every size near the edges and a stride */
    step = g_opt.scale_div > 1 ? 7 : 1;
    for (size = 0; size <= eager; size += (size < 64 || size > eager - 64) ? 1 : step) {
        uint32_t sum;
        b = vrpc_pool_get(c.pool);
        assert_non_null(b);
        fill(b->data, size, size);
        sum = csum(b->data, size);
        assert_int_equal(vrpc_ep_send(ep, b, size, size ^ 0xa5a5a5a5u, size, 0), 0);
        assert_true(coll_wait(&c.coll, VRPC_WC_RECV, ep, WAIT_MS, &w));
        assert_int_equal(w.status, 0);
        assert_int_equal(w.byte_len, size);
        assert_int_equal(w.buf->len, size);
        assert_int_equal(w.imm, size ^ 0xa5a5a5a5u);
        assert_int_equal(csum(w.buf->data, size), sum);
        assert_int_equal(vrpc_cq_post_recv(c.cq, &w.buf, NULL, 1), 0);
        assert_true(coll_wait(&c.coll, VRPC_WC_SEND, ep, WAIT_MS, &w));
        assert_int_equal(w.status, 0);
        assert_ptr_equal(w.buf, b);
        assert_int_equal(w.wr_id, size);
        vrpc_pool_put(b);
    }
    /* one byte over the eager size is refused and the buffer stays ours */
    b = vrpc_pool_get(c.pool);
    assert_int_equal(vrpc_ep_send(ep, b, eager + 1, 0, 0, 0), b->cap < eager + 1 ? -EINVAL : -EMSGSIZE);
    vrpc_pool_put(b);
    vrpc_ep_destroy(ep);
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, ep, WAIT_MS, &w));
    client_stop(&c);
    echo_stop(&e);
}

/* ---- main ---- */

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--backend tcp|verbs] [--setup local|single|veth] [--conns N] [--burst N]\n"
            "          [--quick] [--filter GLOB]\n"
            "verbs: --setup single reads VRPC_VERBS_IP (server and client on one device);\n"
            "       --setup veth reads VRPC_VERBS_IP_A (client source) and VRPC_VERBS_IP_B (server).\n"
            "VRPC_TEST_SCALE=N divides the case sizes by N (the sanitizer runs use it).\n",
            argv0);
}

int main(int argc, char **argv)
{
    const char *filter = NULL, *scale = getenv("VRPC_TEST_SCALE");
    struct rlimit rl;
    int i;

    g_opt.backend = "tcp";
    g_opt.setup = "local";
    g_opt.conns = 1000;
    g_opt.burst = 100000;
    g_opt.scale_div = scale && atoi(scale) > 0 ? (unsigned)atoi(scale) : 1;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            g_opt.backend = argv[++i];
        else if (!strcmp(argv[i], "--setup") && i + 1 < argc)
            g_opt.setup = argv[++i];
        else if (!strcmp(argv[i], "--conns") && i + 1 < argc)
            g_opt.conns = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--burst") && i + 1 < argc)
            g_opt.burst = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            g_opt.scale_div = 10;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            filter = argv[++i];
        else if (!strcmp(argv[i], "--peer-child") && i + 2 < argc)
            return peer_child_main(argv[i + 1], argv[i + 2]);
        else {
            usage(argv[0]);
            return 2;
        }
    }
    if (!strcmp(g_opt.backend, "tcp") || !strcmp(g_opt.backend, "fault+tcp")) {
        g_opt.server_ip = "127.0.0.1";
    } else if (!strcmp(g_opt.backend, "verbs") || !strcmp(g_opt.backend, "fault+verbs")) {
        int rc = vrpc_test_verbs_addrs(g_opt.setup, &g_opt.server_ip, &g_opt.client_ip);
        if (rc)
            return rc == -ENOENT ? 77 : 2;
    } else {
        usage(argv[0]);
        return 2;
    }
    {
        struct vrpc_transport *tp;
        int rc = vrpc_transport_create(g_opt.backend, NULL, &tp);
        if (rc == -ENODEV || rc == -ENOTSUP || rc == -ENOENT) {
            printf("SKIP: backend '%s' unavailable here: %s\n", g_opt.backend, strerror(-rc));
            return 77;
        }
        if (rc) {
            fprintf(stderr, "cannot open backend %s: %s\n", g_opt.backend, strerror(-rc));
            return 1;
        }
        vrpc_transport_destroy(tp);
    }
    /* The many-connections case needs two descriptors per connection. */
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    printf("transport conformance: backend %s, setup %s, server %s, client src %s, scale 1/%u\n", g_opt.backend,
           g_opt.setup, g_opt.server_ip, g_opt.client_ip ? g_opt.client_ip : "(any)", g_opt.scale_div);

    const struct CMUnitTest tests[] = {cmocka_unit_test(t_connect_accept), cmocka_unit_test(t_connect_refused),
                                       cmocka_unit_test(t_caps),           cmocka_unit_test(t_ipv6_uri),
                                       cmocka_unit_test(t_pingpong_sizes), CONFORMANCE_CASES FAIR_CASES};
    int fails;
    if (filter)
        cmocka_set_test_filter(filter);
    fails = cmocka_run_group_tests_name("transport conformance", tests, NULL, NULL);
#ifdef BAD_PEER_CASES
    if (!strcmp(g_opt.backend, "tcp")) {
        const struct CMUnitTest tcp_tests[] = {BAD_PEER_CASES};
        fails += cmocka_run_group_tests_name("tcp bad peers", tcp_tests, NULL, NULL);
    }
#endif
    return fails ? 1 : 0;
}
