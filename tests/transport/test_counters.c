/* The transport core's counters (vrpc_transport_counters) on both ends of
 * one connection: messages and bytes in and out exactly as sent, sends
 * queued for credits counted, connections opened/accepted/closed.
 * --backend tcp|verbs (--setup single|veth for verbs, as verbs_setup.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "harness.h"
#include "verbs_setup.h"

static bool wait_until(atomic_ulong *v, unsigned long want, int ms)
{
    for (int i = 0; i < ms && atomic_load(v) < want; i++)
        usleep(1000);
    return atomic_load(v) >= want;
}

/* Poll tp's counters until field reaches want (5 s at most); returns the snapshot. */
#define WAIT_COUNTER(tp, field, want, snap)                                                                            \
    do {                                                                                                               \
        for (int i_ = 0; i_ < 5000; i_++) {                                                                            \
            vrpc_transport_counters((tp), &(snap));                                                                    \
            if ((snap).field >= (want))                                                                                \
                break;                                                                                                 \
            usleep(1000);                                                                                              \
        }                                                                                                              \
    } while (0)

static void test_counts_and_credit_waits(void **state)
{
    struct echo_cfg ec = {.ncq = 1, .nbufs = 4, .hold = true, .repost_only = true};
    struct echo e;
    struct client c;
    struct counts k;
    struct vrpc_ep *ep;
    struct vrpc_transport_counters cc, sc;
    const unsigned nsend = 12, len = 8;

    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 32, 8, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    vrpc_transport_counters(c.tp, &cc);
    assert_int_equal(cc.connected, 1);
    assert_int_equal(cc.connections, 1);
    assert_int_equal(cc.msgs_out, 0);
    for (unsigned i = 0; i < nsend; i++)
        assert_int_equal(vrpc_ep_send(ep, vrpc_pool_get(c.pool), len, i, i, 0), 0);
    assert_true(wait_until(&e.recvs, 1, 5000));
    usleep(50000);
    /* the receiver posted 4 buffers and holds them: it can have promised no
     * more than 4 credits, so at least nsend - 4 sends queued */
    vrpc_transport_counters(c.tp, &cc);
    assert_true(cc.credit_waits >= nsend - ec.nbufs);
    assert_true(cc.credit_waits <= nsend);
    echo_release(&e);
    assert_true(wait_until(&e.recvs, nsend, 5000));
    assert_true(wait_until(&k.send_ok, nsend, 5000));
    WAIT_COUNTER(c.tp, msgs_out, nsend, cc);
    WAIT_COUNTER(e.tp, msgs_in, nsend, sc);
    assert_int_equal(cc.msgs_out, nsend);
    assert_int_equal(cc.bytes_out, nsend * len);
    assert_int_equal(cc.msgs_in, 0);
    assert_int_equal(sc.msgs_in, nsend);
    assert_int_equal(sc.bytes_in, nsend * len);
    assert_int_equal(sc.msgs_out, 0);
    assert_int_equal(sc.accepted, 1);
    assert_int_equal(sc.connected, 0);
    assert_int_equal(sc.connections, 1);
    assert_int_equal(sc.reads + sc.grants + cc.reads + cc.grants, 0);
    vrpc_ep_destroy(ep);
    assert_true(wait_until(&k.disc, 1, 5000));
    WAIT_COUNTER(e.tp, disconnected, 1, sc);
    vrpc_transport_counters(c.tp, &cc);
    assert_int_equal(cc.disconnected, 1);
    assert_int_equal(cc.connections, 0);
    assert_int_equal(sc.disconnected, 1);
    assert_int_equal(sc.connections, 0);
    client_stop(&c);
    echo_stop(&e);
}

int main(int argc, char **argv)
{
    g_opt.backend = "tcp";
    g_opt.setup = "single";
    g_opt.scale_div = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--backend"))
            g_opt.backend = argv[i + 1];
        else if (!strcmp(argv[i], "--setup"))
            g_opt.setup = argv[i + 1];
    }
    int rc = vrpc_test_backend_addrs(g_opt.backend, g_opt.setup, &g_opt.server_ip, &g_opt.client_ip);
    if (rc)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_and_credit_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
