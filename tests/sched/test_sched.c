/* The scheduler through its public API: every task runs exactly once with
 * external producers and spawning tasks, idle workers steal, no wake-up is
 * lost when a submission races a worker going to sleep, and destroy runs or
 * cancels what is still queued. */
#define _GNU_SOURCE /* pthread_getaffinity_np, CPU_* */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <verbrpc/sched.h>

#include "common/env.h"
#include "sched/sched_test.h"

static uint64_t failures; /* bumped by worker threads; checked by the test */

static void fail_async(void) { __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED); }

static struct vrpc_sched_worker_stats total_stats(struct vrpc_sched *s)
{
    struct vrpc_sched_worker_stats sum = {0}, w;
    for (unsigned i = 0; i < vrpc_sched_nworkers(s); i++) {
        assert_int_equal(vrpc_sched_worker_stats(s, i, &w), 0);
        sum.executed += w.executed;
        sum.stolen += w.stolen;
        sum.parked += w.parked;
        sum.woken += w.woken;
    }
    return sum;
}

/* Polls until the workers have executed `want` tasks; false on timeout. */
static bool wait_executed(struct vrpc_sched *s, uint64_t want, unsigned timeout_s)
{
    uint64_t end = test_now_ns() + timeout_s * 1000000000ull;
    while (total_stats(s).executed < want) {
        if (test_now_ns() > end)
            return false;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return true;
}

/* ---- exactly once ----------------------------------------------------------- */

#define NPROD 4
#define CHILDREN 4

struct eo_item {
    struct vrpc_task t;
    uint32_t id;
};

static struct {
    struct vrpc_sched *s;
    struct eo_item *items;
    uint8_t *seen;
    uint32_t roots_per_producer; /* roots: ids [0, NPROD*R); children after */
} eo;

static void eo_child(struct vrpc_task *t)
{
    struct eo_item *it = (struct eo_item *)t;
    __atomic_fetch_add(&eo.seen[it->id], 1, __ATOMIC_RELAXED);
}

static void eo_root(struct vrpc_task *t)
{
    struct eo_item *it = (struct eo_item *)t;
    uint32_t base = NPROD * eo.roots_per_producer + it->id * CHILDREN;

    __atomic_fetch_add(&eo.seen[it->id], 1, __ATOMIC_RELAXED);
    if (vrpc_sched_current_worker(eo.s) < 0)
        fail_async();
    for (uint32_t c = 0; c < CHILDREN; c++)
        if (vrpc_sched_submit(eo.s, &eo.items[base + c].t) != 0)
            fail_async();
}

static void *eo_producer(void *arg)
{
    unsigned p = (unsigned)(uintptr_t)arg;
    struct vrpc_sched_producer *prod = NULL;

    /* Producers 0 and 1 register (private rings); 2 and 3 take the
     * unregistered path (injection stack). */
    if (p < 2 && vrpc_sched_producer_create(eo.s, &prod) != 0) {
        fail_async();
        return NULL;
    }
    for (uint32_t k = 0; k < eo.roots_per_producer; k++) {
        struct eo_item *it = &eo.items[p * eo.roots_per_producer + k];
        int rc = prod ? vrpc_sched_producer_submit(prod, &it->t) : vrpc_sched_submit(eo.s, &it->t);
        if (rc != 0)
            fail_async();
    }
    vrpc_sched_producer_destroy(prod);
    return NULL;
}

static void test_exactly_once(void **state)
{
    uint32_t r = 100000 / test_scale_div();
    uint32_t total = NPROD * r * (1 + CHILDREN); /* 2,000,000 in the normal build */
    pthread_t th[NPROD];
    struct vrpc_sched_config cfg;
    (void)state;

    vrpc_sched_config_init(&cfg);
    cfg.deque_size = 1024; /* small: exercise the overflow paths too */
    assert_int_equal(vrpc_sched_create(&cfg, &eo.s), 0);
    eo.roots_per_producer = r;
    eo.items = calloc(total, sizeof(*eo.items));
    eo.seen = calloc(total, 1);
    assert_non_null(eo.items);
    assert_non_null(eo.seen);
    for (uint32_t i = 0; i < total; i++) {
        vrpc_task_init(&eo.items[i].t, i < NPROD * r ? eo_root : eo_child);
        eo.items[i].id = i;
    }
    failures = 0;
    for (unsigned p = 0; p < NPROD; p++)
        assert_int_equal(pthread_create(&th[p], NULL, eo_producer, (void *)(uintptr_t)p), 0);
    for (unsigned p = 0; p < NPROD; p++)
        pthread_join(th[p], NULL);
    assert_true(wait_executed(eo.s, total, 120));
    struct vrpc_sched_worker_stats st = total_stats(eo.s);
    print_message("exactly_once: %u tasks on %u workers: stolen %llu, parked %llu\n", total, vrpc_sched_nworkers(eo.s),
                  (unsigned long long)st.stolen, (unsigned long long)st.parked);
    assert_int_equal(st.executed, total);
    vrpc_sched_destroy(eo.s);
    assert_int_equal(failures, 0);
    for (uint32_t i = 0; i < total; i++)
        if (eo.seen[i] != 1)
            fail_msg("task %u ran %u times", i, eo.seen[i]);
    free(eo.items);
    free(eo.seen);
}

/* ---- stealing ----------------------------------------------------------------- */

struct st_item {
    struct vrpc_task t;
};

static struct {
    struct vrpc_sched *s;
    struct st_item *items;
    uint32_t n;
    int seeded_on;
} st;

static void st_work(struct vrpc_task *t)
{
    (void)t;
    test_busy_ns(2000);
}

/* Puts all the work into its own worker's deque, then stays busy until the
 * other worker has taken 1% of it (or 10 s pass), so that on a loaded
 * machine the share does not depend on when the thief gets a CPU. */
static void st_seed(struct vrpc_task *t)
{
    int me = vrpc_sched_current_worker(st.s);
    struct vrpc_sched_worker_stats ws;
    uint64_t deadline = test_now_ns() + 10000000000ull;
    (void)t;

    __atomic_store_n(&st.seeded_on, me, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < st.n; i++)
        if (vrpc_sched_submit(st.s, &st.items[i].t) != 0)
            fail_async();
    do {
        if (vrpc_sched_worker_stats(st.s, me == 0 ? 1 : 0, &ws) != 0)
            fail_async();
    } while (ws.stolen < st.n / 100 && test_now_ns() < deadline);
}

static void test_stealing(void **state)
{
    struct vrpc_sched_config cfg;
    struct vrpc_task seed;
    (void)state;

    vrpc_sched_config_init(&cfg);
    cfg.nworkers = 2; /* even on one CPU */
    cfg.deque_size = 32768;
    st.n = 20000; /* ~40 ms of work on one core */
    st.items = calloc(st.n, sizeof(*st.items));
    assert_non_null(st.items);
    for (uint32_t i = 0; i < st.n; i++)
        vrpc_task_init(&st.items[i].t, st_work);
    failures = 0;
    assert_int_equal(vrpc_sched_create(&cfg, &st.s), 0);
    vrpc_task_init(&seed, st_seed);
    assert_int_equal(vrpc_sched_submit(st.s, &seed), 0);
    assert_true(wait_executed(st.s, st.n + 1, 60));
    assert_int_equal(failures, 0);
    int seeded_on = __atomic_load_n(&st.seeded_on, __ATOMIC_RELAXED);
    assert_true(seeded_on >= 0);
    struct vrpc_sched_worker_stats ws[2];
    for (unsigned i = 0; i < 2; i++)
        assert_int_equal(vrpc_sched_worker_stats(st.s, i, &ws[i]), 0);
    unsigned thief = seeded_on == 0 ? 1 : 0;
    print_message("stealing: seeded on worker %d; thief ran %llu of %u (stole %llu)\n", seeded_on,
                  (unsigned long long)ws[thief].executed, st.n, (unsigned long long)ws[thief].stolen);
    /* All work sat in one deque: whatever the other worker ran, it stole. */
    assert_true(ws[thief].stolen > 0);
    assert_true(ws[thief].executed >= st.n / 100); /* a measurable share: >= 1% */
    vrpc_sched_destroy(st.s);
    free(st.items);
}

/* ---- no lost wake-up ----------------------------------------------------------- */

static uint32_t lw_done;

static void lw_task(struct vrpc_task *t)
{
    (void)t;
    __atomic_store_n(&lw_done, 1, __ATOMIC_RELEASE);
}

/* fences: 0 to let producers rely on the parking worker's membarrier() (the
 * default where the kernel has it), 1 to force a fence on both sides. */
static void no_lost_wakeup(bool fences)
{
    struct vrpc_sched_config cfg;
    struct vrpc_sched *s;
    struct vrpc_sched_producer *p;
    struct vrpc_task t;
    uint32_t iters = 100000 / test_scale_div();
    uint64_t rng = 88172645463325252ull;

    vrpc_sched_config_init(&cfg);
    cfg.nworkers = 2;
    cfg.spin_us = 1; /* park almost at once, so that submissions race the parking */
    if (!fences)
        setenv("VRPC_SCHED_MEMBARRIER", "1", 1); /* read by create only */
    vrpc_env_reload();                           /* the environment is read once */
    assert_int_equal(vrpc_sched_create(&cfg, &s), 0);
    unsetenv("VRPC_SCHED_MEMBARRIER");
    vrpc_env_reload();
    assert_int_equal(vrpc_sched_producer_create(s, &p), 0);
    vrpc_task_init(&t, lw_task);
    for (uint32_t i = 0; i < iters; i++) {
        __atomic_store_n(&lw_done, 0, __ATOMIC_RELAXED);
        assert_int_equal(i % 2 ? vrpc_sched_producer_submit(p, &t) : vrpc_sched_submit(s, &t), 0);
        uint64_t deadline = test_now_ns() + 10000000000ull;
        while (!__atomic_load_n(&lw_done, __ATOMIC_ACQUIRE)) {
            if (test_now_ns() > deadline)
                fail_msg("iteration %u: task not run within 10 s: lost wake-up", i);
        }
        /* Submit the next task 0-8 us after this one ran: before, during and
         * after the worker's 1 us spin, bit set, recheck and futex wait. */
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        test_busy_ns(rng % 8000);
    }
    struct vrpc_sched_worker_stats sum = total_stats(s);
    print_message("no_lost_wakeup%s: %u submissions, %llu parks, %llu wake-ups\n", fences ? " (fences)" : "", iters,
                  (unsigned long long)sum.parked, (unsigned long long)sum.woken);
    assert_true(sum.parked > 0);
    assert_true(sum.woken > 0);
    vrpc_sched_producer_destroy(p);
    vrpc_sched_destroy(s);
}

static void test_no_lost_wakeup(void **state)
{
    (void)state;
    no_lost_wakeup(false);
}

static void test_no_lost_wakeup_fences(void **state)
{
    (void)state;
    no_lost_wakeup(true);
}

/* ---- shutdown with work queued ------------------------------------------------- */

struct sd_item {
    struct vrpc_task t;
    uint32_t id;
};

static struct {
    struct vrpc_sched *s;
    struct sd_item *items;
    uint8_t *ran, *cancelled;
    uint32_t n, spawners;
    uint32_t release; /* the blocker task waits for this */
    uint32_t blocker_started;
} sd;

static void sd_child(struct vrpc_task *t)
{
    __atomic_fetch_add(&sd.ran[((struct sd_item *)t)->id], 1, __ATOMIC_RELAXED);
}

/* The first `spawners` queued tasks submit a child each while destroy runs. */
static void sd_spawner(struct vrpc_task *t)
{
    struct sd_item *it = (struct sd_item *)t;
    __atomic_fetch_add(&sd.ran[it->id], 1, __ATOMIC_RELAXED);
    if (vrpc_sched_submit(sd.s, &sd.items[sd.n + it->id].t) != 0)
        fail_async();
}

static void sd_blocker(struct vrpc_task *t)
{
    (void)t;
    __atomic_store_n(&sd.blocker_started, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&sd.release, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void sd_cancel(struct vrpc_task *t, void *arg)
{
    if (arg != &sd)
        fail_async();
    __atomic_fetch_add(&sd.cancelled[((struct sd_item *)t)->id], 1, __ATOMIC_RELAXED);
}

static void *sd_destroyer(void *arg)
{
    (void)arg;
    vrpc_sched_destroy(sd.s);
    return NULL;
}

#define LATE_MAX 1000

static void shutdown_with_queued_work(bool cancel)
{
    struct vrpc_sched_config cfg;
    struct vrpc_sched_producer *p;
    struct vrpc_task blocker;
    pthread_t th;
    uint32_t total;
    int rc;

    sd.n = 10000;
    sd.spawners = cancel ? 0 : 1000;
    total = sd.n + sd.spawners;
    sd.items = calloc(total + LATE_MAX, sizeof(*sd.items));
    sd.ran = calloc(total + LATE_MAX, 1);
    sd.cancelled = calloc(total + LATE_MAX, 1);
    assert_true(sd.items && sd.ran && sd.cancelled);
    for (uint32_t i = 0; i < total + LATE_MAX; i++) {
        vrpc_task_init(&sd.items[i].t, i < sd.spawners ? sd_spawner : sd_child);
        sd.items[i].id = i;
    }
    sd.release = sd.blocker_started = 0;
    failures = 0;

    vrpc_sched_config_init(&cfg);
    cfg.nworkers = 1;
    cfg.deque_size = 64;
    cfg.cancel_on_destroy = cancel;
    cfg.cancel_fn = sd_cancel;
    cfg.cancel_arg = &sd;
    assert_int_equal(vrpc_sched_create(&cfg, &sd.s), 0);
    vrpc_task_init(&blocker, sd_blocker);
    assert_int_equal(vrpc_sched_submit(sd.s, &blocker), 0);
    while (!__atomic_load_n(&sd.blocker_started, __ATOMIC_ACQUIRE))
        sched_yield();
    /* The only worker is busy: everything below stays queued. */
    assert_int_equal(vrpc_sched_producer_create(sd.s, &p), 0);
    for (uint32_t i = 0; i < sd.n; i++)
        assert_int_equal(
            i % 2 ? vrpc_sched_producer_submit(p, &sd.items[i].t) : vrpc_sched_submit(sd.s, &sd.items[i].t), 0);
    vrpc_sched_producer_destroy(p);

    assert_int_equal(pthread_create(&th, NULL, sd_destroyer, NULL), 0);
    /* Destroy cannot finish while the blocker runs, so sd.s stays valid: once
     * it has begun, submissions from non-workers are refused. */
    /* Wait for destroy to begin: until then submissions are accepted (each
     * with a fresh task, which must then run or be cancelled like the rest). */
    uint32_t late = 0;
    while ((rc = vrpc_sched_submit(sd.s, &sd.items[total + late].t)) == 0) {
        assert_true(++late < LATE_MAX);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(rc, -ESHUTDOWN);
    __atomic_store_n(&sd.release, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);

    assert_int_equal(failures, 0);
    for (uint32_t i = 0; i < total + LATE_MAX; i++) {
        unsigned r = sd.ran[i], c = sd.cancelled[i];
        /* queued before destroy, accepted late, or spawned during destroy */
        unsigned expect = i < total || (i >= total && i < total + late);
        if (cancel ? r + c != expect : r != expect || c != 0)
            fail_msg("task %u: ran %u, cancelled %u, expected %u", i, r, c, expect);
    }
    free(sd.items);
    free(sd.ran);
    free(sd.cancelled);
}

static void test_shutdown_runs_queued(void **state)
{
    (void)state;
    shutdown_with_queued_work(false);
}

static void test_shutdown_cancels_queued(void **state)
{
    (void)state;
    shutdown_with_queued_work(true);
}

/* ---- small API contracts ----------------------------------------------------- */

static void test_api_contracts(void **state)
{
    struct vrpc_sched_config cfg;
    struct vrpc_sched *s = (struct vrpc_sched *)&cfg;
    struct vrpc_sched_worker_stats ws;
    (void)state;

    vrpc_sched_config_init(&cfg);
    cfg.deque_size = 1000; /* not a power of two */
    assert_int_equal(vrpc_sched_create(&cfg, &s), -EINVAL);
    assert_ptr_equal(s, (struct vrpc_sched *)&cfg); /* untouched on failure */
    assert_int_equal(vrpc_sched_create(NULL, NULL), -EINVAL);
    assert_int_equal(vrpc_sched_create(NULL, &s), 0);
    assert_true(vrpc_sched_nworkers(s) >= 1);
    assert_int_equal(vrpc_sched_current_worker(s), -1);
    assert_int_equal(vrpc_sched_worker_stats(s, vrpc_sched_nworkers(s), &ws), -EINVAL);
    assert_int_equal(vrpc_sched_worker_stats(s, 0, &ws), 0);
    struct vrpc_task t = {0};
    assert_int_equal(vrpc_sched_submit(s, &t), -EINVAL); /* no function */
    assert_int_equal(vrpc_sched_submit(s, NULL), -EINVAL);
    assert_int_equal(vrpc_sched_submit(NULL, &t), -EINVAL);
    assert_int_equal(vrpc_sched_producer_submit(NULL, &t), -EINVAL);
    assert_int_equal(vrpc_sched_producer_create(s, NULL), -EINVAL);
    vrpc_sched_destroy(s);
    vrpc_sched_destroy(NULL);
    vrpc_sched_producer_destroy(NULL);
}

/* cfg.cpu_mask pins every worker to one of the mask's CPUs. */
struct pin_probe {
    struct vrpc_task t;
    cpu_set_t got;
    int rc;
    uint32_t done; /* atomic */
};

static void pin_probe_fn(struct vrpc_task *t)
{
    struct pin_probe *p = (struct pin_probe *)t;
    p->rc = pthread_getaffinity_np(pthread_self(), sizeof(p->got), &p->got);
    __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
}

static void test_cpu_mask_pins_workers(void **state)
{
    (void)state;
    cpu_set_t allowed;
    int cpu = -1;
    assert_int_equal(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    for (int c = 63; c >= 0 && cpu < 0; c--) /* the highest CPU we may use (below 64) */
        if (CPU_ISSET(c, &allowed))
            cpu = c;
    if (cpu < 0)
        skip();
    struct vrpc_sched_config cfg;
    struct vrpc_sched *s;
    vrpc_sched_config_init(&cfg);
    cfg.nworkers = 2;
    cfg.cpu_mask = 1ull << cpu;
    assert_int_equal(vrpc_sched_create(&cfg, &s), 0);
    struct pin_probe p[8];
    memset(p, 0, sizeof(p));
    for (int i = 0; i < 8; i++) {
        vrpc_task_init(&p[i].t, pin_probe_fn);
        assert_int_equal(vrpc_sched_submit(s, &p[i].t), 0);
    }
    vrpc_sched_destroy(s); /* runs what is left; joins the workers */
    for (int i = 0; i < 8; i++) {
        assert_int_equal(p[i].done, 1);
        assert_int_equal(p[i].rc, 0);
        /* a worker ran it pinned to {cpu}, or destroy ran it on this thread */
        if (CPU_COUNT(&p[i].got) == 1)
            assert_true(CPU_ISSET(cpu, &p[i].got));
        else
            assert_true(CPU_EQUAL(&p[i].got, &allowed));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api_contracts),        cmocka_unit_test(test_cpu_mask_pins_workers),
        cmocka_unit_test(test_exactly_once),         cmocka_unit_test(test_stealing),
        cmocka_unit_test(test_no_lost_wakeup),       cmocka_unit_test(test_no_lost_wakeup_fences),
        cmocka_unit_test(test_shutdown_runs_queued), cmocka_unit_test(test_shutdown_cancels_queued),
    };
    return cmocka_run_group_tests_name("sched", tests, NULL, NULL);
}
