/* Helpers shared by the scheduler tests: sizing under sanitizers, clocks,
 * and a failure counter that worker threads can bump (cmocka's asserts are
 * only safe on the test's own thread). */
#ifndef VRPC_TESTS_SCHED_TEST_H
#define VRPC_TESTS_SCHED_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Loop sizes are divided by this: 1 in the normal build, 4 under ASan, 5
 * under TSan (5-15x slower), or VRPC_TEST_SCALE_DIV if set. */
static inline unsigned test_scale_div(void)
{
    const char *e = getenv("VRPC_TEST_SCALE_DIV");
    if (e && atoi(e) > 0)
        return (unsigned)atoi(e);
#if defined(__SANITIZE_THREAD__)
    return 5;
#elif defined(__SANITIZE_ADDRESS__)
    return 4;
#else
    return 1;
#endif
}

/* Busy-polling loops suffer most under TSan: shrink them this much more. */
static inline unsigned test_tsan_extra_div(void)
{
#if defined(__SANITIZE_THREAD__)
    return 4;
#else
    return 1;
#endif
}

static inline uint64_t test_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void test_busy_ns(uint64_t ns)
{
    uint64_t end = test_now_ns() + ns;
    while (test_now_ns() < end)
        ;
}

#endif
