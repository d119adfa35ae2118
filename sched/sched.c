/* verbrpc scheduler: worker threads, work stealing, the submission paths from
 * non-worker threads, parking on ck_ec event counts, and shutdown. The
 * contract is in include/verbrpc/sched.h; the lock-free queues it is built
 * from are in sched/deque.h and sched/ring.h. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <verbrpc/log.h>
#include <verbrpc/sched.h>

#include <ck_ec.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/env.h"
#include "sched/cpu.h"
#include "sched/atomic.h"
#include "sched/deque.h"
#include "sched/ring.h"

#define BATCH 32     /* most tasks a worker takes from a producer ring at once */
#define STREAM_WAIT 8 /* looks (of 8 pauses each) a worker waits for a streaming producer to fill a batch */
#define FAIR_TICK 61 /* every FAIR_TICK-th task comes from the shared queues first */
#define MAX_WORKERS 4096
#define SPIN_ALWAYS_NS (UINT64_C(1) << 60) /* VRPC_SCHED_SPIN_ALWAYS: 36 years */

/* One per worker thread: its deque, the event count it sleeps on (one per
 * worker, so that a waker wakes exactly the worker whose idle bit it claimed),
 * and state only the worker itself touches. */
struct vrpc_worker {
    struct vrpc_deque dq;
    _Alignas(64) struct ck_ec32 ec; /* bumped by the claimer of our idle bit, and by destroy */
    /* Owner-private from here on (and the deque's bottom). */
    _Alignas(64) struct vrpc_sched *s;
    unsigned idx;
    bool started;
    pthread_t thread;
    struct vrpc_task *ovf_head, *ovf_tail; /* overflow FIFO when the deque is full */
    uint64_t rng;
    uint64_t tick;
    uint64_t spin_ns;                        /* current spin budget, adapted between spin_ns/4 and 4 * spin_ns */
    struct vrpc_sched_producer *prod_cursor; /* round robin over producer rings */
    unsigned ring_streak;                    /* the last looks at the rings found tasks (saturates at 2) */
    /* Written by the owner only (relaxed), read by anyone. */
    uint64_t executed, stolen, parked, woken;
};

struct vrpc_sched_producer {
    struct vrpc_ring ring;
    struct vrpc_sched *s;
    struct vrpc_sched_producer *next; /* immutable once the node is published */
    bool in_use;                      /* under s->prod_lock */
};

struct vrpc_sched {
    struct vrpc_inject inject;          /* unregistered submitters, ring overflow */
    _Alignas(64) uint64_t ext_inflight; /* unregistered submits in progress */
    /* Read-mostly from here to nspinning. */
    _Alignas(64) uint32_t stopping;        /* destroy began: non-worker submits fail */
    uint32_t exiting;                      /* workers must return */
    struct vrpc_sched_producer *producers; /* append-at-head list, nodes live until destroy */
    struct vrpc_worker *w;
    uint64_t *idle; /* bit i set: worker i is parked or about to park */
    unsigned nidle_words;
    unsigned n;     /* workers */
    unsigned ninit; /* workers whose deque is initialised */
    unsigned max_spinning;
    uint64_t spin_ns;
    bool asym_fence; /* parking workers call membarrier(); producers need no fence */
    struct vrpc_sched_config cfg;
    _Alignas(64) uint32_t nspinning; /* idle workers spinning before they park */
    pthread_mutex_t prod_lock;
};

/* initial-exec: one load instead of a __tls_get_addr call per submit in the
 * shared library; a pointer fits the static TLS that glibc reserves for
 * libraries loaded with dlopen. */
static __thread struct vrpc_worker *tls_worker __attribute__((tls_model("initial-exec")));

/* ---- ck_ec glue: futexes ------------------------------------------------ */

static int ec_gettime(const struct ck_ec_ops *ops, struct timespec *out)
{
    (void)ops;
    vrpc_clock_mono_ts(out);
    return 0;
}

/* deadline is absolute on CLOCK_MONOTONIC (FUTEX_WAIT_BITSET's default clock). */
static void ec_wait32(const struct ck_ec_wait_state *st, const uint32_t *addr, uint32_t expected,
                      const struct timespec *deadline)
{
    (void)st;
    syscall(SYS_futex, addr, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected, deadline, NULL, FUTEX_BITSET_MATCH_ANY);
}

static void ec_wake32(const struct ck_ec_ops *ops, const uint32_t *addr)
{
    (void)ops;
    syscall(SYS_futex, addr, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, NULL, NULL, 0);
}

/* Multi-producer mode (a locked RMW per wake) never loses ck_ec's waiter flag,
 * so its defensive timed backoff is not needed: the first timed sleep is 1 s,
 * after which ck_ec sleeps without a deadline. A parked worker thus wakes at
 * most once, after 1 s, without cause: about 0% CPU when idle.
 * busy_loop_iter: ck_ec spins 100 looks (its default) before the futex.
 * idle_wait has already spun as long as the configuration asks (not at all
 * with no_spin), so that second spin only burns CPU: ~1,500 instructions per
 * park, a quarter of a no_spin server's instructions per call (callgrind). */
static const struct ck_ec_ops ec_ops = {
    .gettime = ec_gettime,
    .wait32 = ec_wait32,
    .wake32 = ec_wake32,
    .busy_loop_iter = 1,
    .initial_wait_ns = 1000000000u,
};
static const struct ck_ec_mode ec_mode = {.ops = &ec_ops, .single_producer = false};

/* ---- asymmetric fence ------------------------------------------------------
 * The parking protocol is a Dekker handshake: a parking worker stores its idle
 * bit then loads the queues, a producer stores a task then loads the idle
 * bits, and each side needs a store-load fence between the two. Producers are
 * the hot side. By default each side pays its own fence: an mfence per
 * submit. Opt-in (VRPC_SCHED_MEMBARRIER=1, where the kernel offers
 * membarrier(PRIVATE_EXPEDITED)) the parking worker pays for both: the call
 * makes every running thread of the process execute a full barrier, which is
 * what the producer's fence would have done, and producer_submit needs only a
 * compiler barrier. That is not the default because the call interrupts every
 * CPU running the process: under RPC load workers park once per call or so,
 * and on a 2-vCPU VM the IPIs cost more than the fences they save (rpc_bench,
 * 64 outstanding: 3.2x gRPC's calls/s with membarrier, 4.6-4.9x without). */

static bool membarrier_registered;

static void membarrier_register(void)
{
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
        syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
        membarrier_registered = true;
}

static bool membarrier_available(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, membarrier_register);
    return membarrier_registered;
}

static uint64_t now_ns(void) { return (uint64_t)vrpc_clock_mono_ns(); }

/* ---- idle workers ------------------------------------------------------- */

static inline bool any_idle(const struct vrpc_sched *s)
{
    for (unsigned i = 0; i < s->nidle_words; i++)
        if (vs_load_64(&s->idle[i]))
            return true;
    return false;
}

/* Claims one parked worker's idle bit and bumps its event count. */
static void wake_one(struct vrpc_sched *s)
{
    for (unsigned i = 0; i < s->nidle_words; i++) {
        uint64_t m = vs_load_64(&s->idle[i]);
        while (m) {
            unsigned bit = (unsigned)__builtin_ctzll(m);
            if (vs_btr_64(&s->idle[i], bit)) {
                ck_ec32_inc(&s->w[i * 64 + bit].ec, &ec_mode);
                return;
            }
            m &= m - 1;
        }
    }
}

/* After a submitter published a task and saw a parked worker: wake it unless
 * an idle worker is spinning, i.e. will look at every shared queue again
 * before it parks (idle_wait), or is already on its way to run a task and
 * checks the queues once more (spin_found). Waking a parked worker costs the
 * submitter a futex syscall and, on a virtual machine whose other vCPU is
 * halted, tens of microseconds before the wakee runs; the spinner takes the
 * task within a cache miss. Only reached when idle bits are set, so the fence
 * is paid only where a syscall would otherwise be. */
static void wake_if_needed(struct vrpc_sched *s)
{
    /* The caller's task publication before the nspinning load (store-load;
     * pairs with the read-modify-write of nspinning in idle_wait/spin_found,
     * which is followed by the spinner's own queue loads). Callers published
     * with a locked instruction followed by fence_atomic_load, which already
     * orders this load; only a producer under the asymmetric fence did not
     * (a parking worker's membarrier() does not help here: spinners do not
     * call it). */
    if (s->asym_fence)
        ck_pr_fence_store_load();
    if (vs_load_32(&s->nspinning) == 0)
        wake_one(s);
}

static inline void stat_inc(uint64_t *c) { vs_store_stat(c, vs_load_stat(c) + 1); }

/* ---- a worker's local queues -------------------------------------------- */

static void ovf_push(struct vrpc_worker *w, struct vrpc_task *t)
{
    t->next = NULL;
    if (w->ovf_tail)
        w->ovf_tail->next = t;
    else
        w->ovf_head = t;
    w->ovf_tail = t;
}

static inline void local_push(struct vrpc_worker *w, struct vrpc_task *t)
{
    if (!vrpc_deque_push(&w->dq, t))
        ovf_push(w, t);
}

/* Oldest overflow task; refills the deque from the overflow list (up to half
 * its size) so that thieves can reach that work again. */
static struct vrpc_task *ovf_refill(struct vrpc_worker *w)
{
    struct vrpc_task *t = w->ovf_head, *x;
    uint64_t room = (w->dq.mask + 1) / 2;

    if (!t)
        return NULL;
    w->ovf_head = t->next;
    while ((x = w->ovf_head) && room--) {
        struct vrpc_task *next = x->next; /* read before a thief can own x */
        if (!vrpc_deque_push(&w->dq, x))
            break;
        w->ovf_head = next;
    }
    if (!w->ovf_head)
        w->ovf_tail = NULL;
    return t;
}

static inline struct vrpc_task *take_local(struct vrpc_worker *w)
{
    struct vrpc_task *t = vrpc_deque_take(&w->dq);
    return t ? t : ovf_refill(w);
}

/* ---- shared queues and stealing ----------------------------------------- */

/* Takes a batch from the next non-empty producer ring (round robin): runs the
 * oldest task now, queues the rest locally where thieves can reach them. */
static struct vrpc_task *take_from_producers(struct vrpc_worker *w)
{
    struct vrpc_sched *s = w->s;
    struct vrpc_sched_producer *first = vs_load_ptr((void *const *)&s->producers);
    struct vrpc_sched_producer *p, *start;
    struct vrpc_task *batch[BATCH];

    if (!first)
        return NULL;
    /* The list head load before the loads of the node's fields (published
     * after them, see producer_create). */
    ck_pr_fence_load();
    p = start = w->prod_cursor ? w->prod_cursor : first;
    do {
        uint64_t avail = vrpc_ring_size(&p->ring);
        bool streaming = false;
        /* The last looks found tasks every time, and less than a batch is
         * queued: the producer is submitting as fast as we take. Let it fill
         * a batch (four slot lines) before we read it, rather than pull its
         * lines over for a task or two at a time. Bounded: STREAM_WAIT looks,
         * and none for a task that comes after a quiet spell (its latency).
         * 1 worker and the producer pinned, 2M empty tasks, 3 alternating
         * runs of 3: no wait 20 M/s (50 ns a submit); wait for one line, 4
         * looks, 35 M/s (28 ns); for a batch, 8 looks, 52 M/s (19 ns). */
        if (avail && avail < BATCH && w->ring_streak >= 2) {
            streaming = true;
            for (unsigned i = 0; i < STREAM_WAIT && avail < BATCH; i++) {
                for (unsigned j = 0; j < 8; j++)
                    ck_pr_stall();
                avail = vrpc_ring_size_want(&p->ring, BATCH);
            }
        }
        if (avail) {
            /* All that is queued, up to BATCH: what this worker does not run
             * at once goes on its deque, where idle workers steal it, so the
             * ring's lines see one consumer at a time. */
            unsigned n = vrpc_ring_pop_batch_lines(&p->ring, batch, avail > BATCH ? BATCH : (unsigned)avail, streaming);
            if (n) {
                if (w->ring_streak < 2)
                    w->ring_streak++;
                w->prod_cursor = p->next; /* NULL: restart at the head */
                /* The producer wrote these tasks on another core: start
                 * fetching them now rather than one miss per task later. */
                for (unsigned i = 0; i < n; i++)
                    __builtin_prefetch(batch[i]);
                /* Pushed newest first, so this worker's LIFO takes run them oldest first. */
                for (unsigned i = n - 1; i >= 1; i--)
                    local_push(w, batch[i]);
                if (avail > 1 && any_idle(s))
                    wake_one(s);
                return batch[0];
            }
        }
        p = p->next ? p->next : first;
    } while (p != start);
    w->ring_streak = 0;
    return NULL;
}

/* Takes everything from the injection stack (newest first) into the local
 * queues. Pushing the list in its order makes this worker's LIFO takes run
 * the oldest first, so the stack behaves as a FIFO without a reversal pass. */
static struct vrpc_task *take_from_inject(struct vrpc_worker *w)
{
    struct vrpc_task *l = vrpc_inject_take_all(&w->s->inject);
    bool many;

    if (!l)
        return NULL;
    many = l->next != NULL;
    while (l) {
        struct vrpc_task *next = l->next; /* read before a thief can own l */
        local_push(w, l);
        l = next;
    }
    if (many && any_idle(w->s))
        wake_one(w->s);
    return take_local(w);
}

static inline struct vrpc_task *take_shared(struct vrpc_worker *w)
{
    struct vrpc_task *t = take_from_producers(w);
    return t ? t : take_from_inject(w);
}

static inline uint64_t xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* Steals the oldest task of a random victim, trying every other worker once
 * (twice if a steal was lost to another thief). */
static struct vrpc_task *steal_any(struct vrpc_worker *w)
{
    struct vrpc_sched *s = w->s;
    unsigned n = s->n, start;

    if (n < 2)
        return NULL;
    start = (unsigned)(xorshift64(&w->rng) % n);
    for (int round = 0; round < 2; round++) {
        bool lost = false;
        for (unsigned i = 0; i < n; i++) {
            unsigned v = (start + i) % n;
            struct vrpc_task *t;
            if (v == w->idx)
                continue;
            switch (vrpc_deque_steal(&s->w[v].dq, &t)) {
            case VRPC_STEAL_OK:
                stat_inc(&w->stolen);
                /* More left there: another idle worker may help. */
                if (vrpc_deque_size(&s->w[v].dq) > 0 && any_idle(s))
                    wake_one(s);
                return t;
            case VRPC_STEAL_LOST:
                lost = true;
                break;
            case VRPC_STEAL_EMPTY:
                break;
            }
        }
        if (!lost)
            break;
    }
    return NULL;
}

static struct vrpc_task *find_work(struct vrpc_worker *w)
{
    struct vrpc_task *t;

    /* Fairness: a worker whose tasks keep spawning tasks still serves the
     * shared queues now and then. */
    if (++w->tick % FAIR_TICK == 0 && (t = take_shared(w)))
        return t;
    if ((t = take_local(w)))
        return t;
    if ((t = take_shared(w)))
        return t;
    return steal_any(w);
}

static inline void run_task(struct vrpc_worker *w, struct vrpc_task *t)
{
    t->fn(t); /* t may be freed from here on */
    stat_inc(&w->executed);
}

/* True if a producer ring or the injection stack holds a task. */
static bool shared_nonempty(struct vrpc_sched *s)
{
    struct vrpc_sched_producer *p = vs_load_ptr((void *const *)&s->producers);
    /* The list head load before the loads of the nodes' fields (as in
     * take_from_producers). */
    ck_pr_fence_load();
    for (; p; p = p->next)
        if (vrpc_ring_size(&p->ring))
            return true;
    return !vrpc_inject_empty(&s->inject);
}

/* A spinner found a task and left the spinners: a submitter that saw it
 * counted in nspinning just before did not wake anybody (wake_if_needed), so
 * look once more and pass what is queued to a parked worker rather than
 * leave it until this worker's task is done. */
static void spin_found(struct vrpc_sched *s)
{
    /* The nspinning decrement before the queue loads (store-load; pairs with
     * the fence in wake_if_needed). */
    ck_pr_fence_atomic_load();
    if (any_idle(s) && shared_nonempty(s))
        wake_one(s);
}

/* No work found: spin for spin_ns, then park. Returns a task, or NULL when the
 * caller should look again (woken, or exiting). */
static struct vrpc_task *idle_wait(struct vrpc_worker *w)
{
    struct vrpc_sched *s = w->s;
    uint64_t *word = &s->idle[w->idx / 64];
    unsigned bit = w->idx % 64;
    uint64_t deadline;
    struct vrpc_task *t;
    uint32_t snap;

    /* A worker that shares its CPU with the poller feeding it (spin_yield)
     * always spins the longest budget. Its spin yields to the poller at every
     * look, so it takes little from that CPU; parking instead makes the next
     * request pay a futex wake-up and the sleeper's return. And once one long
     * gap had halved its budget below the round trip of a steady stream of
     * requests, it would never find work while spinning again (the only
     * thing that grows the budget) and would park on every request: in the
     * Soft-RoCE VM, rpc_bench's server worker parked on 34-45% of calls;
     * spinning the longest budget, on 7-14%. */
    if (s->cfg.spin_yield)
        w->spin_ns = 4 * s->spin_ns;

    /* Spin only if fewer than half the workers (at least one) already do: on
     * a machine with more busy threads than CPUs a crowd of spinners would
     * steal time from the producers they wait for. (Yielding instead does not
     * work: the kernel's EEVDF scheduler charges a yielding thread, which then
     * waits hundreds of microseconds to run once woken.) */
    if (vs_faa_32(&s->nspinning, 1) < s->max_spinning) {
        deadline = now_ns() + w->spin_ns;
        do {
            if (s->cfg.spin_yield)
                sched_yield(); /* the poller we share a CPU with goes first */
            else
                ck_pr_stall();
            if ((t = find_work(w)) || vs_load_32(&s->exiting)) {
                vs_faa_32(&s->nspinning, -1);
                spin_found(s);
                /* Work came while spinning: spin longer next time, up to
                 * 4 * spin_us, so a steady stream of requests (each arriving
                 * a round trip after the last answer) finds a worker awake
                 * instead of paying a wake-up per request. */
                if (t && w->spin_ns < 4 * s->spin_ns)
                    w->spin_ns *= 2;
                return t;
            }
        } while (now_ns() < deadline);
        /* Spun for nothing: halve the budget (down to spin_us / 4), so that
         * sporadic traffic costs little idle CPU. */
        if (w->spin_ns > s->spin_ns / 4)
            w->spin_ns /= 2;
    }
    vs_faa_32(&s->nspinning, -1);

    snap = ck_ec32_value(&w->ec);
    vs_bts_64(word, bit);
    /* The idle bit store before the queue loads below (store-load). A
     * submitter publishes its task, fences, then loads the idle bits: either
     * it sees our bit and bumps our event count (after our snapshot, so the
     * wait below returns), or we see its task here. */
    ck_pr_fence_atomic_load();
    /* With the asymmetric fence, producers skip theirs: this call executes it
     * for them (see membarrier_register). It cannot fail once registered. */
    if (s->asym_fence)
        syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    if ((t = find_work(w)) || vs_load_32(&s->exiting)) {
        /* Take the bit back. If a waker claimed it first, its bump is spurious. */
        vs_btr_64(word, bit);
        return t;
    }
    stat_inc(&w->parked);
    ck_ec32_wait(&w->ec, &ec_mode, snap, NULL);
    stat_inc(&w->woken);
    vs_btr_64(word, bit); /* destroy bumps without claiming the bit */
    return NULL;
}

static void *worker_main(void *arg)
{
    struct vrpc_worker *w = arg;
    struct vrpc_sched *s = w->s;
    char name[16];

    snprintf(name, sizeof(name), "vrpc-w%u", w->idx);
    pthread_setname_np(pthread_self(), name);
    if (s->cfg.pin_cpus || s->cfg.cpu_mask)
        vrpc_sched_pin_self(w->idx, s->cfg.cpu_mask);
    tls_worker = w;
    if (s->cfg.worker_start)
        s->cfg.worker_start(w->idx, s->cfg.worker_start_arg);
    while (!vs_load_32(&s->exiting)) {
        struct vrpc_task *t = find_work(w);
        if (!t)
            t = idle_wait(w);
        if (t)
            run_task(w, t);
    }
    tls_worker = NULL;
    return NULL;
}

/* ---- public API ----------------------------------------------------------- */

void vrpc_sched_config_init(struct vrpc_sched_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->deque_size = 4096;
    cfg->spin_us = 50;
}

static void *zalloc_aligned(size_t size)
{
    size = (size + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, size);
    if (p)
        memset(p, 0, size);
    return p;
}

int vrpc_sched_create(const struct vrpc_sched_config *cfg, struct vrpc_sched **out)
{
    struct vrpc_sched *s;
    int rc;

    if (!out)
        return -EINVAL;
    s = zalloc_aligned(sizeof(*s));
    if (!s)
        return -ENOMEM;
    if (cfg)
        s->cfg = *cfg;
    else
        vrpc_sched_config_init(&s->cfg);
    if (s->cfg.nworkers == 0)
        s->cfg.nworkers = vrpc_sched_online_cpus();
    if (s->cfg.deque_size == 0)
        s->cfg.deque_size = 4096;
    if (s->cfg.spin_us == 0)
        s->cfg.spin_us = 50;
    pthread_mutex_init(&s->prod_lock, NULL);
    if (s->cfg.nworkers > MAX_WORKERS || s->cfg.deque_size < 2 || (s->cfg.deque_size & (s->cfg.deque_size - 1)) != 0) {
        rc = -EINVAL;
        goto fail;
    }
    s->n = s->cfg.nworkers;
    s->spin_ns = (uint64_t)s->cfg.spin_us * 1000u;
    s->max_spinning = s->n / 2 ? s->n / 2 : 1;
    if (s->cfg.spin_us == VRPC_SCHED_SPIN_ALWAYS) {
        s->spin_ns = SPIN_ALWAYS_NS; /* 4 * it still fits, now + that too */
        s->max_spinning = s->n;      /* cores of their own: nobody to leave room for */
    }
    /* VRPC_SCHED_MEMBARRIER=1 selects the asymmetric fence (tests cover both). */
    s->asym_fence = vrpc_env_flag(VRPC_ENV_SCHED_MEMBARRIER) && membarrier_available();
    s->nidle_words = (s->n + 63) / 64;
    s->idle = zalloc_aligned(s->nidle_words * sizeof(*s->idle));
    s->w = zalloc_aligned(s->n * sizeof(*s->w));
    if (!s->idle || !s->w) {
        rc = -ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < s->n; i++, s->ninit++) {
        struct vrpc_worker *w = &s->w[i];
        if ((rc = vrpc_deque_init(&w->dq, s->cfg.deque_size)) != 0)
            goto fail;
        ck_ec32_init(&w->ec, 0);
        w->s = s;
        w->idx = i;
        w->rng = (i + 1) * UINT64_C(0x9E3779B97F4A7C15);
        w->spin_ns = s->spin_ns;
    }
    for (unsigned i = 0; i < s->n; i++) {
        if ((rc = pthread_create(&s->w[i].thread, NULL, worker_main, &s->w[i])) != 0) {
            rc = -rc;
            goto fail;
        }
        s->w[i].started = true;
    }
    *out = s;
    return 0;
fail:
    vrpc_sched_destroy(s);
    return rc;
}

/* After the workers are joined: the calling thread acts as worker 0 and
 * empties every queue, running (or cancelling) each task. Tasks it runs may
 * submit; those land in worker 0's deque and are drained too. */
static void drain(struct vrpc_sched *s)
{
    struct vrpc_worker *saved = tls_worker, *w0 = &s->w[0];
    struct vrpc_task *t;

    memset(s->idle, 0, s->nidle_words * sizeof(*s->idle)); /* nobody to wake */
    for (unsigned i = 1; i < s->n; i++) {                  /* adopt the private overflow lists */
        while ((t = s->w[i].ovf_head)) {
            s->w[i].ovf_head = t->next;
            ovf_push(w0, t);
        }
        s->w[i].ovf_tail = NULL;
    }
    tls_worker = w0;
    for (;;) {
        if (!(t = take_local(w0)) && !(t = take_shared(w0)) && !(t = steal_any(w0)))
            break;
        if (s->cfg.cancel_on_destroy) {
            if (s->cfg.cancel_fn)
                s->cfg.cancel_fn(t, s->cfg.cancel_arg);
        } else {
            run_task(w0, t);
        }
    }
    tls_worker = saved;
}

void vrpc_sched_destroy(struct vrpc_sched *s)
{
    struct vrpc_sched_producer *p;

    if (!s)
        return;
    if (tls_worker && tls_worker->s == s) {
        vrpc_log(VRPC_LOG_ERROR, "sched",
                 "vrpc_sched_destroy: called from one of its own workers (it would join itself)");
        abort();
    }
    vs_store_32(&s->stopping, 1);
    /* The stopping store before the in-flight load: an unregistered submitter
     * increments, fences, then loads stopping, so it either sees stopping or
     * is counted here and waited for. */
    ck_pr_fence_memory();
    while (vs_load_64(&s->ext_inflight) != 0)
        sched_yield();
    vs_store_32(&s->exiting, 1);
    /* The exiting store before the event-count bumps: a parking worker loads
     * exiting after its snapshot of the count. */
    ck_pr_fence_store_atomic();
    for (unsigned i = 0; i < s->n && s->w; i++)
        if (s->w[i].started)
            ck_ec32_inc(&s->w[i].ec, &ec_mode);
    for (unsigned i = 0; i < s->n && s->w; i++)
        if (s->w[i].started)
            pthread_join(s->w[i].thread, NULL);
    if (s->w && s->idle && s->n > 0 && s->ninit == s->n)
        drain(s);
    while ((p = s->producers)) {
        s->producers = p->next;
        vrpc_ring_fini(&p->ring);
        free(p);
    }
    for (unsigned i = 0; i < s->ninit; i++)
        vrpc_deque_fini(&s->w[i].dq);
    free(s->w);
    free(s->idle);
    pthread_mutex_destroy(&s->prod_lock);
    free(s);
}

int vrpc_sched_submit(struct vrpc_sched *s, struct vrpc_task *t)
{
    struct vrpc_worker *w = tls_worker;

    if (!s || !t || !t->fn)
        return -EINVAL;
    if (w && w->s == s) {
        local_push(w, t);
        /* Best effort, no fence: the task cannot be lost, since this worker
         * runs it if nobody else does; an idle sibling is only a speed-up. */
        if (any_idle(s))
            wake_one(s);
        return 0;
    }
    vs_faa_64(&s->ext_inflight, 1);
    /* The in-flight increment before the stopping load (pairs with destroy). */
    ck_pr_fence_atomic_load();
    if (vs_load_32(&s->stopping)) {
        vs_faa_64(&s->ext_inflight, -1);
        return -ESHUTDOWN;
    }
    vrpc_inject_push(&s->inject, t);
    /* The CAS publishing t before the idle-bit loads (store-load; pairs with
     * the fence in idle_wait). */
    ck_pr_fence_atomic_load();
    if (any_idle(s))
        wake_if_needed(s);
    vs_faa_64(&s->ext_inflight, -1); /* last: destroy may free s after this */
    return 0;
}

int vrpc_sched_producer_create(struct vrpc_sched *s, struct vrpc_sched_producer **out)
{
    struct vrpc_sched_producer *p;
    int rc;

    if (!s || !out)
        return -EINVAL;
    if (vs_load_32(&s->stopping))
        return -ESHUTDOWN;
    pthread_mutex_lock(&s->prod_lock);
    for (p = s->producers; p; p = p->next) {
        if (!p->in_use) { /* recycle: a ring may still hold tasks, they keep their turn */
            p->in_use = true;
            pthread_mutex_unlock(&s->prod_lock);
            *out = p;
            return 0;
        }
    }
    p = zalloc_aligned(sizeof(*p));
    if (!p) {
        pthread_mutex_unlock(&s->prod_lock);
        return -ENOMEM;
    }
    if ((rc = vrpc_ring_init(&p->ring, s->cfg.deque_size)) != 0) {
        pthread_mutex_unlock(&s->prod_lock);
        free(p);
        return rc;
    }
    p->s = s;
    p->in_use = true;
    p->next = s->producers;
    /* The node's fields before the store that makes it reachable by workers. */
    ck_pr_fence_store();
    vs_store_ptr((void **)&s->producers, p);
    pthread_mutex_unlock(&s->prod_lock);
    *out = p;
    return 0;
}

int vrpc_sched_producer_submit(struct vrpc_sched_producer *p, struct vrpc_task *t)
{
    struct vrpc_sched *s;

    if (!p || !t || !t->fn)
        return -EINVAL;
    s = p->s;
    if (vs_load_32(&s->stopping))
        return -ESHUTDOWN;
    /* The store publishing t before the idle-bit loads (store-load, pairs
     * with idle_wait): the ring's tail exchange or the stack's CAS is a
     * locked instruction, i.e. that fence on x86 (see vrpc_ring_push for why
     * not an mfence), and fence_atomic_load emits whatever else a weaker
     * memory model needs. With the asymmetric fence a parking worker's
     * membarrier() fences us: a plain store and a compiler barrier. */
    if (!vrpc_ring_push(&p->ring, t, !s->asym_fence))
        vrpc_inject_push(&s->inject, t);
    if (s->asym_fence)
        ck_pr_barrier();
    else
        ck_pr_fence_atomic_load();
    if (any_idle(s))
        wake_if_needed(s);
    return 0;
}

void vrpc_sched_producer_destroy(struct vrpc_sched_producer *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->s->prod_lock);
    p->in_use = false;
    pthread_mutex_unlock(&p->s->prod_lock);
}

int vrpc_sched_current_worker(const struct vrpc_sched *s)
{
    struct vrpc_worker *w = tls_worker;
    return (w && w->s == s) ? (int)w->idx : -1;
}

unsigned vrpc_sched_nworkers(const struct vrpc_sched *s) { return s ? s->n : 0; }

int vrpc_sched_worker_stats(const struct vrpc_sched *s, unsigned worker, struct vrpc_sched_worker_stats *out)
{
    const struct vrpc_worker *w;

    if (!s || !out || worker >= s->n)
        return -EINVAL;
    w = &s->w[worker];
    out->executed = vs_load_stat(&w->executed);
    out->stolen = vs_load_stat(&w->stolen);
    out->parked = vs_load_stat(&w->parked);
    out->woken = vs_load_stat(&w->woken);
    return 0;
}
