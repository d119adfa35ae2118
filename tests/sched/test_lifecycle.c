/* Create and destroy a scheduler 1,000 times in one process, each time with a
 * little work and a producer, so that leaks or half-freed state show up under
 * AddressSanitizer (and thread start/stop races under ThreadSanitizer). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <sched.h>
#include <verbrpc/sched.h>

#include "sched/sched_test.h"

static uint64_t ran;

static void count(struct vrpc_task *t)
{
    (void)t;
    __atomic_fetch_add(&ran, 1, __ATOMIC_RELAXED);
}

static void test_create_destroy_1000(void **state)
{
    unsigned rounds = test_tsan_extra_div() > 1 ? 250 : 1000; /* TSan: thread start/stop is slow */
    struct vrpc_task t[8];
    (void)state;

    ran = 0;
    for (unsigned r = 0; r < rounds; r++) {
        struct vrpc_sched_config cfg;
        struct vrpc_sched *s;
        struct vrpc_sched_producer *p;

        vrpc_sched_config_init(&cfg);
        cfg.nworkers = 1 + r % 3;
        cfg.deque_size = 16u << (r % 4);
        cfg.pin_cpus = r % 5 == 0;
        assert_int_equal(vrpc_sched_create(&cfg, &s), 0);
        assert_int_equal(vrpc_sched_producer_create(s, &p), 0);
        for (unsigned i = 0; i < 8; i++) {
            vrpc_task_init(&t[i], count);
            assert_int_equal(i % 2 ? vrpc_sched_producer_submit(p, &t[i]) : vrpc_sched_submit(s, &t[i]), 0);
        }
        vrpc_sched_producer_destroy(p);
        if (r % 2) /* half the time destroy at once, with the tasks maybe still queued */
            while (__atomic_load_n(&ran, __ATOMIC_RELAXED) < 8ull * (r + 1))
                sched_yield();
        vrpc_sched_destroy(s);
        assert_int_equal(__atomic_load_n(&ran, __ATOMIC_RELAXED), 8ull * (r + 1));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_destroy_1000),
    };
    return cmocka_run_group_tests_name("sched_lifecycle", tests, NULL, NULL);
}
