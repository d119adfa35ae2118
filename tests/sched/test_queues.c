/* The scheduler's lock-free queues on their own: the Chase-Lev deque's
 * owner/thief semantics, and exactly-once delivery through the deque, the
 * producer ring and the injection stack under concurrent consumers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "sched/deque.h"
#include "sched/ring.h"
#include "sched/sched_test.h"

static void nop(struct vrpc_task *t) { (void)t; }

static void test_deque_owner_lifo_thief_fifo(void **state)
{
    struct vrpc_deque d;
    struct vrpc_task t[8], *x;
    (void)state;

    assert_int_equal(vrpc_deque_init(&d, 6), -EINVAL);
    assert_int_equal(vrpc_deque_init(&d, 4), 0);
    for (int i = 0; i < 8; i++)
        vrpc_task_init(&t[i], nop);
    assert_null(vrpc_deque_take(&d));
    assert_int_equal(vrpc_deque_steal(&d, &x), VRPC_STEAL_EMPTY);
    for (int i = 0; i < 4; i++)
        assert_true(vrpc_deque_push(&d, &t[i]));
    assert_false(vrpc_deque_push(&d, &t[4])); /* full: all 4 slots usable */
    assert_int_equal(vrpc_deque_size(&d), 4);
    assert_ptr_equal(vrpc_deque_take(&d), &t[3]); /* owner: newest */
    assert_int_equal(vrpc_deque_steal(&d, &x), VRPC_STEAL_OK);
    assert_ptr_equal(x, &t[0]); /* thief: oldest */
    assert_ptr_equal(vrpc_deque_take(&d), &t[2]);
    assert_ptr_equal(vrpc_deque_take(&d), &t[1]); /* last one, through the CAS */
    assert_null(vrpc_deque_take(&d));
    assert_int_equal(vrpc_deque_size(&d), 0);
    /* wrap around the buffer many times */
    for (int r = 0; r < 100; r++) {
        assert_true(vrpc_deque_push(&d, &t[r % 8]));
        assert_true(vrpc_deque_push(&d, &t[(r + 1) % 8]));
        assert_int_equal(vrpc_deque_steal(&d, &x), VRPC_STEAL_OK);
        assert_ptr_equal(x, &t[r % 8]);
        assert_ptr_equal(vrpc_deque_take(&d), &t[(r + 1) % 8]);
    }
    vrpc_deque_fini(&d);
}

/* ---- concurrent exactly-once ---------------------------------------------- */

struct item {
    struct vrpc_task t;
    uint32_t id;
};

struct qctx {
    struct item *items;
    uint8_t *seen;
    uint32_t n;
    uint32_t done; /* producer finished */
    uint64_t taken;
    struct vrpc_deque dq;
    struct vrpc_ring ring;
    struct vrpc_inject inj;
};

static void mark(struct qctx *c, struct vrpc_task *t)
{
    struct item *it = (struct item *)t;
    __atomic_fetch_add(&c->seen[it->id], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->taken, 1, __ATOMIC_RELAXED);
}

static bool all_taken(struct qctx *c) { return __atomic_load_n(&c->taken, __ATOMIC_ACQUIRE) == c->n; }

static struct qctx *qctx_new(uint32_t n)
{
    struct qctx *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->n = n;
    c->items = calloc(n, sizeof(*c->items));
    c->seen = calloc(n, 1);
    assert_non_null(c->items);
    assert_non_null(c->seen);
    for (uint32_t i = 0; i < n; i++) {
        vrpc_task_init(&c->items[i].t, nop);
        c->items[i].id = i;
    }
    return c;
}

static void qctx_check_free(struct qctx *c)
{
    for (uint32_t i = 0; i < c->n; i++)
        if (c->seen[i] != 1)
            fail_msg("item %u seen %u times", i, c->seen[i]);
    free(c->items);
    free(c->seen);
    free(c);
}

static void *deque_thief(void *arg)
{
    struct qctx *c = arg;
    struct vrpc_task *t;
    while (!all_taken(c)) {
        if (vrpc_deque_steal(&c->dq, &t) == VRPC_STEAL_OK)
            mark(c, t);
    }
    return NULL;
}

static void test_deque_exactly_once(void **state)
{
    uint32_t n = 1000000 / (test_scale_div() * test_tsan_extra_div());
    struct qctx *c = qctx_new(n);
    pthread_t th[2];
    struct vrpc_task *t;
    uint32_t next = 0;
    (void)state;

    assert_int_equal(vrpc_deque_init(&c->dq, 256), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, deque_thief, c), 0);
    /* Owner: push bursts, take some back, so that owner and thieves race for
     * the last element often. */
    while (next < n) {
        unsigned burst = 1 + next % 7;
        while (burst-- && next < n && vrpc_deque_push(&c->dq, &c->items[next].t))
            next++;
        if ((t = vrpc_deque_take(&c->dq)))
            mark(c, t);
    }
    while ((t = vrpc_deque_take(&c->dq)))
        mark(c, t);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    vrpc_deque_fini(&c->dq);
    qctx_check_free(c);
}

static void *ring_consumer(void *arg)
{
    struct qctx *c = arg;
    struct vrpc_task *b[8];
    while (!all_taken(c)) {
        unsigned k = vrpc_ring_pop_batch(&c->ring, b, 1 + (unsigned)(test_now_ns() % 8));
        for (unsigned i = 0; i < k; i++)
            mark(c, b[i]);
    }
    return NULL;
}

static void test_ring_exactly_once(void **state)
{
    uint32_t n = 1000000 / (test_scale_div() * test_tsan_extra_div());
    struct qctx *c = qctx_new(n);
    pthread_t th[3];
    (void)state;

    assert_int_equal(vrpc_ring_init(&c->ring, 64), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, ring_consumer, c), 0);
    for (uint32_t i = 0; i < n; i++)
        while (!vrpc_ring_push(&c->ring, &c->items[i].t, (i & 1) != 0)) /* both ways of publishing */
            ck_pr_stall();                                              /* full: consumers will make room */
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(vrpc_ring_size(&c->ring), 0);
    vrpc_ring_fini(&c->ring);
    qctx_check_free(c);
}

struct pusher {
    struct qctx *c;
    uint32_t from, to;
};

static void *inject_pusher(void *arg)
{
    struct pusher *p = arg;
    for (uint32_t i = p->from; i < p->to; i++)
        vrpc_inject_push(&p->c->inj, &p->c->items[i].t);
    return NULL;
}

static void test_inject_exactly_once(void **state)
{
    uint32_t n = 600000 / (test_scale_div() * test_tsan_extra_div());
    struct qctx *c = qctx_new(n);
    struct pusher p[3];
    pthread_t th[3];
    (void)state;

    for (int i = 0; i < 3; i++) {
        p[i] = (struct pusher){c, n / 3 * (uint32_t)i, i == 2 ? n : n / 3 * (uint32_t)(i + 1)};
        assert_int_equal(pthread_create(&th[i], NULL, inject_pusher, &p[i]), 0);
    }
    while (!all_taken(c)) {
        struct vrpc_task *l = vrpc_inject_take_all(&c->inj);
        /* newest first: per pusher, ids must come out strictly decreasing */
        uint32_t last[3] = {UINT32_MAX, UINT32_MAX, UINT32_MAX};
        for (; l; l = l->next) {
            uint32_t id = ((struct item *)l)->id;
            unsigned who = id / (n / 3) > 2 ? 2 : id / (n / 3);
            if (id >= last[who])
                fail_msg("pusher %u: id %u after %u in one batch", who, id, last[who]);
            last[who] = id;
            mark(c, l);
        }
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    assert_true(vrpc_inject_empty(&c->inj));
    qctx_check_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deque_owner_lifo_thief_fifo),
        cmocka_unit_test(test_deque_exactly_once),
        cmocka_unit_test(test_ring_exactly_once),
        cmocka_unit_test(test_inject_exactly_once),
    };
    return cmocka_run_group_tests_name("sched_queues", tests, NULL, NULL);
}
