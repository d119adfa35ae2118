/* Unit tests of the credit core (transport/credit.{c,h}) without a backend:
 * reserve and release, payback oldest first with growth up to the target
 * while a quarter of the posted buffers stays unpromised, and rule 7
 * (vrpc_credit_shrink): a quiet connection is cut back to the minimum, one
 * that sent a few messages to those, a busy one keeps its reservation;
 * credits the peer holds are never taken back (granted unchanged by the
 * shrink, cut later as the peer spends them), the freed buffers stay in
 * avail, and the endpoint grows again on demand once the cut is done.
 * Shrink window 0 (VRPC_SHRINK_NEVER) never cuts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "transport/credit.h"

#define MS 1000000ull
#define WIN (1000 * MS)

static unsigned sends;
static void count_send(struct vrpc_credit_ep *e)
{
    (void)e;
    sends++;
}

/* A pool of nposted receives (TCP's reservation: 2 + 0). */
static void pool(struct vrpc_credit_pool *p, int nposted)
{
    vrpc_credit_pool_init(p, 2, 0);
    atomic_store(&p->avail, nposted);
    atomic_store(&p->posted, nposted);
}

/* A connection admitted as a backend's handshake does. */
static void admit(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e, uint32_t target)
{
    assert_int_equal(vrpc_credit_reserve(p), 2);
    vrpc_credit_ep_init(e, 2, target);
}

/* The peer sends one message (consumes a receive), the user reposts it. */
static void one_message(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e)
{
    assert_true(e->granted > 0);
    vrpc_credit_consumed(p, e);
    atomic_fetch_add(&p->avail, 1); /* reposted: unpromised again */
    vrpc_credit_distribute(p, count_send);
}

/* Grow e to its full target by traffic. */
static void grow(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e)
{
    for (int i = 0; i < 200 && e->resv < e->target; i++)
        one_message(p, e);
    assert_int_equal(e->resv, e->target);
    assert_int_equal(e->granted, e->resv);
}

static void t_reserve_release(void **state)
{
    struct vrpc_credit_pool p;
    struct vrpc_credit_ep a, b, c;
    (void)state;
    pool(&p, 4);
    admit(&p, &a, 32);
    admit(&p, &b, 32);
    assert_int_equal(atomic_load(&p.avail), 0);
    assert_int_equal(vrpc_credit_reserve(&p), 0); /* refused */
    vrpc_credit_ep_release(&p, &a);
    assert_int_equal(atomic_load(&p.avail), 2);
    admit(&p, &c, 32);
    (void)b;
}

static void t_growth_keeps_a_quarter(void **state)
{
    struct vrpc_credit_pool p;
    struct vrpc_credit_ep a;
    (void)state;
    pool(&p, 64);
    admit(&p, &a, 100);
    for (int i = 0; i < 500; i++)
        one_message(&p, &a);
    /* growth stops once no more than a quarter (16) stays unpromised */
    assert_true(atomic_load(&p.avail) <= 16);
    assert_true(atomic_load(&p.avail) >= 15);
    assert_int_equal(a.granted + (uint32_t)atomic_load(&p.avail), 64);
}

static void t_quiet_shrinks_to_min(void **state)
{
    struct vrpc_credit_pool p;
    struct vrpc_credit_ep a;
    uint64_t t = 5 * MS;
    (void)state;
    pool(&p, 200);
    admit(&p, &a, 32);
    grow(&p, &a);
    int avail0 = atomic_load(&p.avail);
    assert_int_equal(vrpc_credit_shrink(&p, &a, t, WIN), 0); /* starts the window */
    assert_int_equal(vrpc_credit_shrink(&p, &a, t + WIN - 1, WIN), 0);
    assert_int_equal(a.resv, 32);
    /* quiet for a window: the peer holds all 32, none is taken back */
    assert_int_equal(vrpc_credit_shrink(&p, &a, t + WIN, WIN), 0);
    assert_int_equal(a.granted, 32);
    assert_int_equal(a.resv, 32);
    assert_int_equal(a.keep, 2);
    /* as the peer spends them, they are not paid back: 30 go to the pool */
    for (int i = 0; i < 30; i++)
        one_message(&p, &a);
    assert_int_equal(a.resv, 2);
    assert_int_equal(a.granted, 2);
    assert_int_equal(a.keep, 32); /* cut done: may grow again */
    assert_int_equal(atomic_load(&p.avail), avail0 + 30);
    assert_int_equal(a.granted + (uint32_t)atomic_load(&p.avail), 200);
    /* and it does grow on demand */
    grow(&p, &a);
}

static void t_debt_cut_at_once(void **state)
{
    struct vrpc_credit_pool p;
    struct vrpc_credit_ep a;
    uint64_t t = 5 * MS;
    (void)state;
    pool(&p, 200);
    admit(&p, &a, 32);
    grow(&p, &a);
    vrpc_credit_shrink(&p, &a, t, WIN);
    /* the peer sends 20 the user holds (not reposted): a debt of 20 */
    for (int i = 0; i < 20; i++)
        vrpc_credit_consumed(&p, &a);
    atomic_fetch_sub(&p.posted, 20);
    assert_true(a.hungry);
    /* 20 < 32 sent in the window: cut to 20, all of it from the debt */
    assert_int_equal(vrpc_credit_shrink(&p, &a, t + WIN, WIN), 12);
    assert_int_equal(a.resv, 20);
    assert_int_equal(a.granted, 12);
    assert_int_equal(a.keep, 32); /* nothing waits for the peer */
    assert_true(a.hungry);
    /* a quiet window later: the remaining debt (8) goes, then 10 of the 12 held */
    assert_int_equal(vrpc_credit_shrink(&p, &a, t + 2 * WIN, WIN), 8);
    assert_int_equal(a.resv, 12);
    assert_false(a.hungry);
    assert_int_equal(a.keep, 2);
    /* the user reposts the 20: none is owed, the pool has them */
    int avail0 = atomic_load(&p.avail);
    atomic_fetch_add(&p.avail, 20);
    atomic_fetch_add(&p.posted, 20);
    vrpc_credit_distribute(&p, count_send);
    assert_int_equal(atomic_load(&p.avail), avail0 + 20);
    assert_int_equal(a.granted, 12);
}

static void t_busy_keeps(void **state)
{
    struct vrpc_credit_pool p;
    struct vrpc_credit_ep a, b;
    uint64_t t = 5 * MS;
    (void)state;
    pool(&p, 200);
    admit(&p, &a, 32);
    admit(&p, &b, 32);
    grow(&p, &a);
    grow(&p, &b);
    vrpc_credit_shrink(&p, &a, t, WIN);
    vrpc_credit_shrink(&p, &b, t, WIN);
    for (int w = 1; w <= 8; w++) {
        for (int i = 0; i < 40; i++)
            one_message(&p, &a); /* busy: more than its reservation */
        for (int i = 0; i < 5; i++)
            one_message(&p, &b); /* a few: cut to 5 */
        vrpc_credit_shrink(&p, &a, t + w * WIN, WIN);
        vrpc_credit_shrink(&p, &b, t + w * WIN, WIN);
        assert_int_equal(a.resv, 32);
        assert_int_equal(a.keep, 32);
    }
    /* b: cut towards 5 by 5 a window (as it spends what it holds), then
     * around 5: it grows on demand after a cut is done, is cut again */
    assert_true(b.resv >= 5 && b.resv <= 10);
    assert_int_equal(b.granted, b.resv);
    assert_int_equal(a.granted + b.granted + (uint32_t)atomic_load(&p.avail), 200);
}

static void t_never(void **state)
{
    struct vrpc_credit_pool p;
    struct vrpc_credit_ep a;
    (void)state;
    pool(&p, 200);
    admit(&p, &a, 32);
    grow(&p, &a);
    for (int w = 0; w < 5; w++)
        assert_int_equal(vrpc_credit_shrink(&p, &a, (uint64_t)(w + 1) * WIN, 0), 0);
    for (int i = 0; i < 64; i++)
        one_message(&p, &a);
    assert_int_equal(a.resv, 32);
    assert_int_equal(a.keep, 32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_reserve_release),      cmocka_unit_test(t_growth_keeps_a_quarter),
        cmocka_unit_test(t_quiet_shrinks_to_min), cmocka_unit_test(t_debt_cut_at_once),
        cmocka_unit_test(t_busy_keeps),           cmocka_unit_test(t_never),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
