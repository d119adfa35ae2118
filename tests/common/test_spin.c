/* The adaptive busy-wait window (common/spin.h) and what each latency mode
 * (vrpc_channel_opts.spin_us) means for pollers, callers and workers
 * (vrpc_rpc_spin_mode). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <verbrpc/verbrpc.h>
#include "common/spin.h"
#include "rpc/internal.h"

#define US 1000u
#define FLOOR (50 * US)
#define CAP (1000 * US)

static void feed(struct vrpc_spin_est *e, uint64_t ns, int times)
{
    for (int i = 0; i < times; i++)
        vrpc_spin_est_add(e, ns, CAP);
}

/* No samples yet: the floor, as the fixed window always was. */
static void test_empty_is_floor(void **state)
{
    struct vrpc_spin_est e = {0};
    (void)state;
    assert_int_equal(vrpc_spin_window_ns(&e, FLOOR, CAP), FLOOR);
}

/* Fast round trips below half the floor keep the floor. */
static void test_fast_waits_keep_floor(void **state)
{
    struct vrpc_spin_est e = {0};
    (void)state;
    feed(&e, 10 * US, 50);
    assert_int_equal(vrpc_spin_window_ns(&e, FLOOR, CAP), FLOOR);
}

/* Round trips of 300 us (a VM's emulated RDMA): about twice that, within
 * a few samples of the EWMA. */
static void test_follows_round_trip(void **state)
{
    struct vrpc_spin_est e = {0};
    (void)state;
    feed(&e, 300 * US, 50);
    uint64_t w = vrpc_spin_window_ns(&e, FLOOR, CAP);
    assert_true(w >= 590 * US && w <= 610 * US);
    /* then faster ones: the window comes down */
    feed(&e, 100 * US, 50);
    w = vrpc_spin_window_ns(&e, FLOOR, CAP);
    assert_true(w >= 195 * US && w <= 215 * US);
}

/* Never above the cap, whatever the fast samples say. */
static void test_capped(void **state)
{
    struct vrpc_spin_est e = {0};
    (void)state;
    feed(&e, 900 * US, 50);
    assert_int_equal(vrpc_spin_window_ns(&e, FLOOR, CAP), CAP);
}

/* Mostly slow waits (idle peer, slow handler): back to the floor, and back
 * up once the waits are fast again. Occasional slow ones (a call now and
 * then, its round trip fast) do not matter. */
static void test_slow_waits_fall_back(void **state)
{
    struct vrpc_spin_est e = {0};
    (void)state;
    feed(&e, 300 * US, 20);
    feed(&e, 50 * 1000 * US, 20);
    assert_int_equal(vrpc_spin_window_ns(&e, FLOOR, CAP), FLOOR);
    feed(&e, 300 * US, 20);
    assert_true(vrpc_spin_window_ns(&e, FLOOR, CAP) > 500 * US);
    for (int i = 0; i < 30; i++) { /* one slow gap in three */
        feed(&e, 300 * US, 2);
        feed(&e, 10 * 1000 * US, 1);
    }
    assert_true(vrpc_spin_window_ns(&e, FLOOR, CAP) > 500 * US);
}

static void test_modes(void **state)
{
    struct vrpc_rpc_spin sp;
    (void)state;

    vrpc_rpc_spin_mode(false, VRPC_SPIN_ADAPTIVE, &sp);
    assert_int_equal(sp.poll_us, VRPC_RPC_BUSY_POLL_US);
    assert_int_equal(sp.poll_max_us, VRPC_SPIN_ADAPTIVE_MAX_US);
    assert_int_equal(sp.sched_spin_us, 0);
    assert_true(sp.wait);
    assert_true(sp.wait_cap_ns > sp.wait_ns && sp.wait_ns == VRPC_RPC_BUSY_POLL_US * US);

    vrpc_rpc_spin_mode(false, VRPC_SPIN_ALWAYS, &sp);
    assert_int_equal(sp.poll_us, VRPC_BUSY_POLL_ALWAYS);
    assert_int_equal(sp.sched_spin_us, VRPC_SCHED_SPIN_ALWAYS);
    assert_true(sp.wait && sp.wait_ns == UINT64_MAX && sp.wait_cap_ns == 0);

    vrpc_rpc_spin_mode(false, 200, &sp);
    assert_int_equal(sp.poll_us, 200);
    assert_int_equal(sp.poll_max_us, 0);
    assert_int_equal(sp.sched_spin_us, 200);
    assert_true(sp.wait && sp.wait_ns == 200 * US && sp.wait_cap_ns == 0);

    /* no_spin wins over any spin_us */
    vrpc_rpc_spin_mode(true, VRPC_SPIN_ALWAYS, &sp);
    assert_int_equal(sp.poll_us, 0);
    assert_int_equal(sp.sched_spin_us, 1);
    assert_false(sp.wait);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_is_floor),       cmocka_unit_test(test_fast_waits_keep_floor),
        cmocka_unit_test(test_follows_round_trip),   cmocka_unit_test(test_capped),
        cmocka_unit_test(test_slow_waits_fall_back), cmocka_unit_test(test_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
