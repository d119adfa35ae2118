/* sched_bench: the scheduler's throughput on empty tasks (spawned by workers;
 * submitted by an external thread) and its submit-to-start latency with the
 * workers awake and parked, next to baselines measured in the same run: a
 * thread pool with one mutex+condvar queue, and a bare futex wake between two
 * threads. Prints what it measured; targets are reported, not asserted.
 * Throughput cases report ops_per_s (median over the rounds) and no
 * percentiles; latency cases report p50/p99 and, as ops_per_s, 1 / mean
 * latency. x_baseline and p50_x_futex are the ratios the targets are about. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <verbrpc/sched.h>

#include "common/bench.h"

static struct vrpc_bench_opts opts;
static unsigned ncpu;

static void die(const char *what, int rc)
{
    fprintf(stderr, "sched_bench: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    exit(1);
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    nanosleep(&ts, NULL);
}

/* ---- the baseline pool: one intrusive FIFO under a mutex, one condvar ------ */

struct mpool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct vrpc_task *head, *tail;
    unsigned nwaiting;
    bool stop;
    unsigned n;
    pthread_t th[64];
    uint64_t executed[64][8]; /* one cache line per worker */
};

static void mpool_submit(struct mpool *p, struct vrpc_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->tail)
        p->tail->next = t;
    else
        p->head = t;
    p->tail = t;
    if (p->nwaiting)
        pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

struct mpool_arg {
    struct mpool *p;
    unsigned idx;
};
static struct mpool_arg mpool_args[64];

static void *mpool_worker(void *arg)
{
    struct mpool_arg *a = arg;
    struct mpool *p = a->p;

    for (;;) {
        struct vrpc_task *t;
        pthread_mutex_lock(&p->mu);
        while (!p->head && !p->stop) {
            p->nwaiting++;
            pthread_cond_wait(&p->cv, &p->mu);
            p->nwaiting--;
        }
        t = p->head;
        if (!t) { /* stop, and nothing left */
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        p->head = t->next;
        if (!p->head)
            p->tail = NULL;
        pthread_mutex_unlock(&p->mu);
        t->fn(t);
        __atomic_store_n(&p->executed[a->idx][0], p->executed[a->idx][0] + 1, __ATOMIC_RELAXED);
    }
}

static struct mpool *mpool_create(unsigned n)
{
    struct mpool *p = calloc(1, sizeof(*p));
    if (!p)
        die("calloc", ENOMEM);
    if (n > 64)
        n = 64;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->n = n;
    for (unsigned i = 0; i < n; i++) {
        mpool_args[i] = (struct mpool_arg){p, i};
        int rc = pthread_create(&p->th[i], NULL, mpool_worker, &mpool_args[i]);
        if (rc)
            die("pthread_create", rc);
    }
    return p;
}

static uint64_t mpool_executed(struct mpool *p)
{
    uint64_t sum = 0;
    for (unsigned i = 0; i < p->n; i++)
        sum += __atomic_load_n(&p->executed[i][0], __ATOMIC_RELAXED);
    return sum;
}

static void mpool_destroy(struct mpool *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n; i++)
        pthread_join(p->th[i], NULL);
    free(p);
}

/* ---- one interface over both, for the workloads ---------------------------- */

struct engine {
    struct vrpc_sched *s;
    struct mpool *p;
    struct vrpc_sched_producer *prod; /* sched: the external thread's ring, if registered */
};

static struct engine eng;

static void eng_submit(struct vrpc_task *t)
{
    if (eng.p)
        mpool_submit(eng.p, t);
    else if (eng.prod && vrpc_sched_current_worker(eng.s) < 0)
        vrpc_sched_producer_submit(eng.prod, t);
    else
        vrpc_sched_submit(eng.s, t);
}

static uint64_t eng_executed(void)
{
    struct vrpc_sched_worker_stats ws;
    uint64_t sum = 0;

    if (eng.p)
        return mpool_executed(eng.p);
    for (unsigned i = 0; i < vrpc_sched_nworkers(eng.s); i++)
        if (vrpc_sched_worker_stats(eng.s, i, &ws) == 0)
            sum += ws.executed;
    return sum;
}

static void eng_wait_executed(uint64_t want)
{
    while (eng_executed() < want)
        sleep_ns(100000);
}

static void eng_start(bool pool, unsigned nworkers, unsigned spin_us, bool producer)
{
    memset(&eng, 0, sizeof(eng));
    if (pool) {
        eng.p = mpool_create(nworkers);
        return;
    }
    struct vrpc_sched_config cfg;
    int rc;
    vrpc_sched_config_init(&cfg);
    cfg.nworkers = nworkers;
    cfg.spin_us = spin_us;
    if ((rc = vrpc_sched_create(&cfg, &eng.s)) != 0)
        die("vrpc_sched_create", rc);
    if (producer && (rc = vrpc_sched_producer_create(eng.s, &eng.prod)) != 0)
        die("vrpc_sched_producer_create", rc);
}

static void eng_stop(void)
{
    if (eng.p)
        mpool_destroy(eng.p);
    vrpc_sched_producer_destroy(eng.prod);
    vrpc_sched_destroy(eng.s);
    memset(&eng, 0, sizeof(eng));
}

/* ---- throughput: tasks spawned by workers ----------------------------------- */

/* CHAINS chains; each task re-submits itself from its worker until its chain
 * is done, so all but CHAINS of the submissions come from workers. */
#define CHAINS 256

struct chain {
    struct vrpc_task t;
    uint32_t left;
};

static void chain_fn(struct vrpc_task *t)
{
    struct chain *c = (struct chain *)t;
    if (--c->left)
        eng_submit(t);
}

static double run_spawn(bool pool, uint64_t total)
{
    static struct chain chains[CHAINS];
    uint64_t t0, t1;

    eng_start(pool, ncpu, 0, false);
    for (unsigned i = 0; i < CHAINS; i++) {
        vrpc_task_init(&chains[i].t, chain_fn);
        chains[i].left = (uint32_t)(total / CHAINS);
    }
    t0 = vrpc_bench_now_ns();
    for (unsigned i = 0; i < CHAINS; i++)
        eng_submit(&chains[i].t);
    eng_wait_executed(total / CHAINS * CHAINS);
    t1 = vrpc_bench_now_ns();
    eng_stop();
    return (double)(total / CHAINS * CHAINS) * 1e9 / (double)(t1 - t0);
}

/* ---- throughput: tasks submitted by one external thread --------------------- */

static void empty_fn(struct vrpc_task *t) { (void)t; }

static double run_submit(bool pool, bool producer, struct vrpc_task *tasks, uint64_t total)
{
    uint64_t t0, t1;

    eng_start(pool, ncpu, 0, producer);
    for (uint64_t i = 0; i < total; i++)
        vrpc_task_init(&tasks[i], empty_fn);
    t0 = vrpc_bench_now_ns();
    for (uint64_t i = 0; i < total; i++)
        eng_submit(&tasks[i]);
    eng_wait_executed(total);
    t1 = vrpc_bench_now_ns();
    eng_stop();
    return (double)total * 1e9 / (double)(t1 - t0);
}

/* ---- latency: submit to start ------------------------------------------------- */

struct lat_task {
    struct vrpc_task t;
    uint64_t t0;
};
static uint64_t lat_ns; /* written by the task */
static uint32_t lat_done;

static void lat_fn(struct vrpc_task *t)
{
    uint64_t now = vrpc_bench_now_ns();
    __atomic_store_n(&lat_ns, now - ((struct lat_task *)t)->t0, __ATOMIC_RELAXED);
    __atomic_store_n(&lat_done, 1, __ATOMIC_RELEASE);
}

/* Submit-to-start latency with the worker awake (spinning between tasks). */
static void run_awake_latency(unsigned nworkers, unsigned n, struct vrpc_bench_samples *out)
{
    struct lat_task lt;

    /* Workers spin for up to a second between tasks: they never park here. */
    eng_start(false, nworkers, 1000000, true);
    vrpc_task_init(&lt.t, lat_fn);
    for (unsigned i = 0; i < n + n / 10; i++) { /* the first 10% warm up */
        __atomic_store_n(&lat_done, 0, __ATOMIC_RELAXED);
        lt.t0 = vrpc_bench_now_ns();
        eng_submit(&lt.t);
        while (!__atomic_load_n(&lat_done, __ATOMIC_ACQUIRE))
            ;
        if (i >= n / 10)
            vrpc_bench_samples_add(out, __atomic_load_n(&lat_ns, __ATOMIC_RELAXED));
    }
    eng_stop();
}

/* The bare futex wake: a waiter sleeps on a word, the waker stamps the time,
 * bumps the word and FUTEX_WAKEs; the waiter records how long that took. */
static uint32_t fx_word;
static uint64_t fx_t0, fx_lat;
static uint32_t fx_seen, fx_stop;

static void *futex_waiter(void *arg)
{
    uint32_t last = 0;
    (void)arg;
    for (;;) {
        uint32_t v;
        while ((v = __atomic_load_n(&fx_word, __ATOMIC_ACQUIRE)) == last)
            syscall(SYS_futex, &fx_word, FUTEX_WAIT_PRIVATE, last, NULL, NULL, 0);
        uint64_t now = vrpc_bench_now_ns();
        last = v;
        if (__atomic_load_n(&fx_stop, __ATOMIC_ACQUIRE))
            return NULL;
        __atomic_store_n(&fx_lat, now - __atomic_load_n(&fx_t0, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        __atomic_store_n(&fx_seen, v, __ATOMIC_RELEASE);
    }
}

/* The k-th CPU this process may run on (k wraps), or -1. */
static int nth_allowed_cpu(unsigned k)
{
    cpu_set_t set;
    int n;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || (n = CPU_COUNT(&set)) == 0)
        return -1;
    k %= (unsigned)n;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &set) && k-- == 0)
            return cpu;
    return -1;
}

static void pin_thread(pthread_t th, int cpu)
{
    cpu_set_t one;
    if (cpu < 0)
        return;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(th, sizeof(one), &one);
}

/* Wake-from-sleep latency of the three contenders, sampled in turn (futex,
 * scheduler, pool, futex, ...) so that all see the same machine load; gap_ns
 * between samples lets the scheduler's worker spin out and park. With two or
 * more CPUs the waker (this thread) runs on the second allowed CPU and every
 * sleeper on the first, so that each wake crosses CPUs the same way (where a
 * sleeper lands otherwise decides whether a wake costs 5 or 70 us here). */
static void run_wake_latency(unsigned nworkers, unsigned n, uint64_t gap_ns, struct vrpc_bench_samples *fx,
                             struct vrpc_bench_samples *sched, struct vrpc_bench_samples *pool, uint64_t *parks)
{
    struct vrpc_sched_config cfg;
    struct vrpc_sched *s;
    struct vrpc_sched_producer *prod;
    struct vrpc_sched_worker_stats ws;
    struct mpool *mp;
    struct lat_task lt;
    pthread_t th;
    int rc;

    cpu_set_t saved;
    bool pin = ncpu >= 2 && sched_getaffinity(0, sizeof(saved), &saved) == 0;

    fx_word = fx_seen = fx_stop = 0;
    if ((rc = pthread_create(&th, NULL, futex_waiter, NULL)) != 0)
        die("pthread_create", rc);
    vrpc_sched_config_init(&cfg);
    cfg.nworkers = nworkers;
    cfg.pin_cpus = pin; /* worker i on the i-th allowed CPU */
    if ((rc = vrpc_sched_create(&cfg, &s)) != 0 || (rc = vrpc_sched_producer_create(s, &prod)) != 0)
        die("vrpc_sched_create", rc);
    mp = mpool_create(nworkers);
    if (pin) {
        pin_thread(th, nth_allowed_cpu(0));
        for (unsigned i = 0; i < mp->n; i++)
            pin_thread(mp->th[i], nth_allowed_cpu(i));
        pin_thread(pthread_self(), nth_allowed_cpu(nworkers));
    }
    vrpc_task_init(&lt.t, lat_fn);
    *parks = 0;
    for (uint32_t i = 1; i <= n + n / 10; i++) { /* the first 10% warm up */
        bool keep = i > n / 10;

        sleep_ns(gap_ns);
        __atomic_store_n(&fx_t0, vrpc_bench_now_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(&fx_word, i, __ATOMIC_RELEASE);
        syscall(SYS_futex, &fx_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        while (__atomic_load_n(&fx_seen, __ATOMIC_ACQUIRE) != i)
            ;
        if (keep)
            vrpc_bench_samples_add(fx, __atomic_load_n(&fx_lat, __ATOMIC_RELAXED));

        sleep_ns(gap_ns);
        __atomic_store_n(&lat_done, 0, __ATOMIC_RELAXED);
        lt.t0 = vrpc_bench_now_ns();
        vrpc_sched_producer_submit(prod, &lt.t);
        while (!__atomic_load_n(&lat_done, __ATOMIC_ACQUIRE))
            ;
        if (keep)
            vrpc_bench_samples_add(sched, __atomic_load_n(&lat_ns, __ATOMIC_RELAXED));

        sleep_ns(gap_ns);
        __atomic_store_n(&lat_done, 0, __ATOMIC_RELAXED);
        lt.t0 = vrpc_bench_now_ns();
        mpool_submit(mp, &lt.t);
        while (!__atomic_load_n(&lat_done, __ATOMIC_ACQUIRE))
            ;
        if (keep)
            vrpc_bench_samples_add(pool, __atomic_load_n(&lat_ns, __ATOMIC_RELAXED));
    }
    for (unsigned i = 0; i < nworkers; i++)
        if (vrpc_sched_worker_stats(s, i, &ws) == 0)
            *parks += ws.parked;
    __atomic_store_n(&fx_stop, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&fx_word, n + n / 10 + 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &fx_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    pthread_join(th, NULL);
    mpool_destroy(mp);
    vrpc_sched_producer_destroy(prod);
    vrpc_sched_destroy(s);
    if (pin)
        pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
}

/* ---- idle CPU --------------------------------------------------------------- */

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec / 1e6;
}

/* Process CPU time over a wall-clock window while the workers have nothing to
 * do, in percent of one CPU. */
static double run_idle_cpu(uint64_t window_ns)
{
    eng_start(false, ncpu, 0, false);
    sleep_ns(100000000); /* let the workers park */
    double c0 = cpu_s();
    uint64_t t0 = vrpc_bench_now_ns();
    sleep_ns(window_ns);
    double pct = (cpu_s() - c0) * 1e9 / (double)(vrpc_bench_now_ns() - t0) * 100.0;
    eng_stop();
    return pct;
}

/* ---- main ----------------------------------------------------------------------- */

static double median(double *v, unsigned n)
{
    for (unsigned i = 1; i < n; i++) /* insertion sort: n <= 5 */
        for (unsigned j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void report_lat(const char *name, struct vrpc_bench_samples *s, const char *extra)
{
    double mean = vrpc_bench_mean_us(s);
    vrpc_bench_report(&opts, name, 1e6 / mean, vrpc_bench_pct_us(s, 50), vrpc_bench_pct_us(s, 99), extra);
}

int main(int argc, char **argv)
{
    char extra[256];
    int rc = vrpc_bench_parse(argc, argv, &opts,
                              "scheduler throughput and wake-up latency vs a mutex+condvar pool and a bare futex wake");
    if (rc)
        return rc > 0 ? 0 : 2;

    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    ncpu = nc > 0 ? (unsigned)nc : 1;
    uint64_t spawn_n = opts.quick ? 200000 : 4000000;
    uint64_t submit_n = opts.quick ? 100000 : 2000000;
    unsigned rounds = opts.quick ? 1 : 5;
    unsigned lat_n = opts.quick ? 300 : 3000;
    unsigned lat_awake_n = opts.quick ? 3000 : 50000;
    uint64_t gap = 300000;                          /* 300 us between wake samples: workers spin 50 us, then park */
    unsigned lat_workers = ncpu > 1 ? ncpu - 1 : 1; /* leave the submitter a CPU */

    struct vrpc_task *tasks = malloc(submit_n * sizeof(*tasks));
    if (!tasks)
        die("malloc", ENOMEM);
    if (!opts.json)
        printf("sched_bench: %u CPUs, %u workers (latency cases: %u)%s\n", ncpu, ncpu, lat_workers,
               opts.quick ? ", --quick" : "");

    /* Throughput: baseline and scheduler alternate for `rounds` rounds and
     * the median of each is reported, so that both see similar machine load. */
    double pool_spawn[5], sched_spawn[5], pool_sub[5], sched_sub[5], sched_sub_unreg[5];
    for (unsigned r = 0; r < rounds; r++) {
        pool_spawn[r] = run_spawn(true, spawn_n);
        sched_spawn[r] = run_spawn(false, spawn_n);
        pool_sub[r] = run_submit(true, false, tasks, submit_n);
        sched_sub[r] = run_submit(false, true, tasks, submit_n);
        sched_sub_unreg[r] = run_submit(false, false, tasks, submit_n);
    }
    double ps = median(pool_spawn, rounds), ss = median(sched_spawn, rounds);
    double pu = median(pool_sub, rounds), su = median(sched_sub, rounds), uu = median(sched_sub_unreg, rounds);
    snprintf(extra, sizeof(extra), "\"workers\":%u,\"tasks\":%llu,\"rounds\":%u", ncpu, (unsigned long long)spawn_n,
             rounds);
    vrpc_bench_report(&opts, "baseline:mutex_pool:spawn_empty", ps, VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
    snprintf(extra, sizeof(extra), "\"workers\":%u,\"tasks\":%llu,\"rounds\":%u,\"x_baseline\":%.1f", ncpu,
             (unsigned long long)spawn_n, rounds, ss / ps);
    vrpc_bench_report(&opts, "sched:spawn_empty", ss, VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
    snprintf(extra, sizeof(extra), "\"workers\":%u,\"tasks\":%llu,\"rounds\":%u", ncpu, (unsigned long long)submit_n,
             rounds);
    vrpc_bench_report(&opts, "baseline:mutex_pool:submit_empty", pu, VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
    snprintf(extra, sizeof(extra), "\"workers\":%u,\"tasks\":%llu,\"rounds\":%u,\"x_baseline\":%.1f", ncpu,
             (unsigned long long)submit_n, rounds, su / pu);
    vrpc_bench_report(&opts, "sched:submit_empty:producer", su, VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);
    snprintf(extra, sizeof(extra), "\"workers\":%u,\"tasks\":%llu,\"rounds\":%u,\"x_baseline\":%.1f", ncpu,
             (unsigned long long)submit_n, rounds, uu / pu);
    vrpc_bench_report(&opts, "sched:submit_empty:unregistered", uu, VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);

    /* Latency, submit to start. */
    struct vrpc_bench_samples fx, parked, awake, pool_parked;
    uint64_t parks = 0;
    vrpc_bench_samples_init(&fx, lat_n);
    vrpc_bench_samples_init(&parked, lat_n);
    vrpc_bench_samples_init(&pool_parked, lat_n);
    vrpc_bench_samples_init(&awake, lat_awake_n);
    run_wake_latency(lat_workers, lat_n, gap, &fx, &parked, &pool_parked, &parks);
    run_awake_latency(lat_workers, lat_awake_n, &awake);

    report_lat("baseline:futex_wake", &fx, "\"threads\":2");
    snprintf(extra, sizeof(extra), "\"workers\":%u", lat_workers);
    report_lat("baseline:mutex_pool:wake_parked", &pool_parked, extra);
    snprintf(extra, sizeof(extra), "\"workers\":%u,\"parks\":%llu,\"p50_x_futex\":%.2f", lat_workers,
             (unsigned long long)parks, vrpc_bench_pct_us(&parked, 50) / vrpc_bench_pct_us(&fx, 50));
    report_lat("sched:wake_parked", &parked, extra);
    snprintf(extra, sizeof(extra), "\"workers\":%u", lat_workers);
    report_lat("sched:wake_awake", &awake, extra);

    /* Idle CPU. */
    double idle = run_idle_cpu(opts.quick ? 300000000 : 1000000000);
    snprintf(extra, sizeof(extra), "\"workers\":%u,\"cpu_pct\":%.2f", ncpu, idle);
    vrpc_bench_report(&opts, "sched:idle_cpu", VRPC_BENCH_NONE, VRPC_BENCH_NONE, VRPC_BENCH_NONE, extra);

    if (!opts.json)
        printf("targets (reported, not asserted): spawn %.1fx and submit %.1fx the mutex pool (want >= 5x); "
               "wake from parked p50 %.2fx the bare futex wake (want <= 2x)\n",
               ss / ps, su / pu, vrpc_bench_pct_us(&parked, 50) / vrpc_bench_pct_us(&fx, 50));
    vrpc_bench_samples_free(&fx);
    vrpc_bench_samples_free(&parked);
    vrpc_bench_samples_free(&pool_parked);
    vrpc_bench_samples_free(&awake);
    free(tasks);
    return 0;
}
