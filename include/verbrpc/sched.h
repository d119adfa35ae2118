/* verbrpc scheduler: N worker threads with work stealing. Transport pollers
 * and other non-worker threads feed it; its workers run RPC handlers and
 * completion callbacks. Nothing here knows about RDMA or protobuf.
 *
 * Threads and contracts:
 *  - Worker threads are created by vrpc_sched_create() and joined by
 *    vrpc_sched_destroy(). A task's function runs exactly once, on one worker
 *    (or, for tasks still queued at destroy, on the destroying thread, see
 *    vrpc_sched_destroy), unless it is cancelled at destroy.
 *  - vrpc_sched_submit() may be called from any thread. From a worker of the
 *    same scheduler it pushes onto that worker's own deque (no atomic
 *    read-modify-write). From any other thread it takes the lock-free
 *    injection path (a CAS on a shared list head).
 *  - A thread that submits often and is not a worker (a transport poller)
 *    should register as a producer: vrpc_sched_producer_create() gives it a
 *    private single-producer ring, so its submissions never contend with other
 *    producers. A producer handle is owned by one thread at a time.
 *  - Tasks are intrusive: the caller embeds struct vrpc_task in its own object
 *    and owns its memory; the scheduler never allocates per task. The task
 *    must stay valid until its function has started; the function may free or
 *    resubmit it. A task may be queued only once at a time.
 *  - No ordering between tasks is promised. In practice a worker runs the
 *    tasks it spawned newest first (cache-warm), idle workers steal the
 *    oldest, and tasks from non-workers are taken roughly in FIFO order.
 *  - Idle workers spin, then sleep on a futex (ck_ec event count). Each
 *    worker adapts its spin between spin_us / 4 and 4 * spin_us: it doubles
 *    after a spin that found work, halves after one that did not. Submitting
 *    to a scheduler with a parked worker wakes one, unless another idle
 *    worker is still spinning (it will take the task without a wake-up).
 *    Sleeping workers use no CPU.
 *
 * Design notes (queues, fences, the parking protocol) are in sched/deque.h,
 * sched/ring.h and sched/sched.c.
 */
#ifndef VERBRPC_SCHED_H
#define VERBRPC_SCHED_H

#include <stdbool.h>
#include <stdint.h>
#include <verbrpc/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vrpc_task;
typedef void (*vrpc_task_fn)(struct vrpc_task *task);

/* Embed in your object; recover it with container_of in the function. */
struct vrpc_task {
    vrpc_task_fn fn;
    struct vrpc_task *next; /* private to the scheduler while queued */
};

static inline void vrpc_task_init(struct vrpc_task *t, vrpc_task_fn fn)
{
    t->fn = fn;
    t->next = 0;
}

struct vrpc_sched;
struct vrpc_sched_producer;

/* vrpc_sched_config.spin_us: idle workers spin for ever. */
#define VRPC_SCHED_SPIN_ALWAYS UINT32_MAX

struct vrpc_sched_config {
    unsigned nworkers;      /* 0: number of online CPUs */
    unsigned deque_size;    /* per-worker deque slots, power of two; 0: 4096 */
    unsigned spin_us;       /* how long an idle worker keeps looking for work before it
                               sleeps (adapted between spin_us / 4 and 4 * spin_us;
                               with spin_yield, always 4 * spin_us); 0: 50 us;
                               VRPC_SCHED_SPIN_ALWAYS: idle workers never sleep
                               (all of them may spin at once): for workers that
                               have cores to themselves */
    bool pin_cpus;          /* pin worker i to the (i mod n)-th CPU the process may run on */
    uint64_t cpu_mask;      /* if nonzero: pin worker i to the (i mod n)-th CPU set in
                               it instead (bit c = CPU c, CPUs 0..63), whatever
                               pin_cpus says */
    bool spin_yield;        /* an idle worker yields its CPU (sched_yield) between looks
                               while it spins: for workers pinned to a CPU they share
                               with the thread that feeds them (a transport poller),
                               which then runs at once instead of after the spin */
    bool cancel_on_destroy; /* destroy drops queued tasks instead of running them;
                               each dropped task's cancel_fn is called (if set) */
    /* Called on the thread running vrpc_sched_destroy, once per dropped task;
     * it owns the task again and may free it. */
    void (*cancel_fn)(struct vrpc_task *task, void *arg);
    void *cancel_arg;
    /* If set, called once on each worker thread before it runs any task, with
     * the worker's index: lets a user create thread-local caches up front
     * rather than on a worker's first task. */
    void (*worker_start)(unsigned worker, void *arg);
    void *worker_start_arg;
};

/* Fill *cfg with the defaults. */
VRPC_API void vrpc_sched_config_init(struct vrpc_sched_config *cfg);

/* Start the workers. cfg may be NULL for the defaults. */
VRPC_API int vrpc_sched_create(const struct vrpc_sched_config *cfg, struct vrpc_sched **out);

/* Stop accepting work from non-workers (their submits now fail with
 * -ESHUTDOWN), let each worker finish the task it is running, join the
 * workers, then empty every queue on the calling thread: each task still
 * queued is run there (or cancelled when cfg.cancel_on_destroy) in no
 * particular order. While it runs them the calling thread counts as worker 0
 * (vrpc_sched_current_worker() returns 0), so tasks that submit more tasks
 * during destroy are accepted and run too. Finally frees everything.
 * Safe on NULL. Must not be called from a worker of this scheduler, nor
 * concurrently with a submit from a thread that could still be using s after
 * destroy returns. Producers must be destroyed first. */
VRPC_API void vrpc_sched_destroy(struct vrpc_sched *s);

/* Queue a task. Returns 0, -EINVAL (NULL s or t, or no t->fn), or -ESHUTDOWN
 * once destroy has begun and the caller is not a worker (the task is then not
 * queued and stays the caller's). Never
 * fails for lack of space: a full deque or ring spills to an unbounded
 * intrusive overflow list. */
VRPC_API int vrpc_sched_submit(struct vrpc_sched *s, struct vrpc_task *t);

/* A private submission ring (cfg.deque_size slots) for one non-worker thread,
 * e.g. a poller. Cheap to create and destroy: destroyed handles are recycled,
 * their memory is only freed by vrpc_sched_destroy. Returns 0, -EINVAL,
 * -ENOMEM, or -ESHUTDOWN once destroy has begun. */
VRPC_API int vrpc_sched_producer_create(struct vrpc_sched *s, struct vrpc_sched_producer **out);
/* Only the owning thread may call this. Same return values as vrpc_sched_submit. */
VRPC_API int vrpc_sched_producer_submit(struct vrpc_sched_producer *p, struct vrpc_task *t);
/* Tasks already submitted through p still run. Safe on NULL. */
VRPC_API void vrpc_sched_producer_destroy(struct vrpc_sched_producer *p);

/* Index of the calling thread's worker in s, or -1 if it is not one of s's workers. */
VRPC_API int vrpc_sched_current_worker(const struct vrpc_sched *s);
VRPC_API unsigned vrpc_sched_nworkers(const struct vrpc_sched *s);

struct vrpc_sched_worker_stats {
    uint64_t executed; /* tasks run by this worker */
    uint64_t stolen;   /* of those, taken from another worker's deque */
    uint64_t parked;   /* times the worker went to sleep */
    uint64_t woken;    /* times it was woken from sleep */
};
/* Counters are updated by the worker with relaxed stores; a snapshot taken
 * while workers run is approximate. Returns -EINVAL for a bad index. */
VRPC_API int vrpc_sched_worker_stats(const struct vrpc_sched *s, unsigned worker, struct vrpc_sched_worker_stats *out);

#ifdef __cplusplus
}
#endif
#endif
