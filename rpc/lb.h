/* A channel over many servers (issue 20): the private header of
 *   rpc/lb.c        create/destroy, the resolver's updates (the set of
 *                   subchannels), the channel's state, connect
 *   rpc/lb_thread.c the channel's own thread: connecting subchannels that
 *                   are not READY (each backs off on its own), health
 *                   checks, reaping removed subchannels, delayed retries
 *   rpc/lb_pick.c   the policies (round robin, pick first, least
 *                   outstanding, ring hash) and outlier ejection
 *   rpc/lb_call.c   calls: pick, attempt, retry (policy, budget,
 *                   transparent), cancel
 *   rpc/lb_stats.c  vrpc_channel_subchannels and the metrics text
 * A subchannel is one server address; behind it conns_per_addr ordinary
 * channels (rpc/channel.c: one connection each, with its own connectivity
 * state, back-off and poller), sharing the parent's scheduler. The parent is
 * a struct vrpc_channel with only lb set (and state): the public functions
 * of rpc/channel.c and rpc/call.c hand it here (one branch on ch->lb).
 * Nothing here is part of the public API. */
#ifndef VRPC_RPC_LB_H
#define VRPC_RPC_LB_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <verbrpc/rpc.h>
#include <verbrpc/sched.h>
#include "rpc/channel_internal.h" /* the inline pick below reads a channel's state */
#include "rpc/resolver.h"

#define VRPC_LB_MAX_CONNS 16
#define VRPC_LB_RING_POINTS 100 /* ring points per server */
#define VRPC_LB_MAX_ATTEMPTS 5
#define VRPC_LB_URI_MAX 96
#define VRPC_LB_JOB_THREADS 8 /* connect/health job threads per channel, at most */

enum { LB_HEALTH_UNKNOWN = 0, LB_HEALTH_SERVING = 1, LB_HEALTH_NOT_SERVING = 2 };
enum { LB_WATCH_RUNNING = 0, LB_WATCH_ENDED = 1, LB_WATCH_UNIMPLEMENTED = 2 };

struct vrpc_subch {
    char uri[VRPC_LB_URI_MAX];
    struct vrpc_channel *ch[VRPC_LB_MAX_CONNS]; /* ordinary channels to uri */
    unsigned nch;
    uint32_t refs;    /* atomic: the set's, a stream's, the lb thread's and its jobs' */
    uint32_t next_ch; /* atomic: round robin over ch[] */
    /* atomic: attempts (unary calls) in flight, each also a reference: a
     * removed subchannel is reaped at refs 0 and outstanding 0 (one count
     * per attempt where there were two, a reference and this) */
    uint32_t outstanding;
    uint64_t calls, failures, ejections; /* atomic counters */
    uint32_t consec_fail;                /* atomic */
    uint32_t eject_level;                /* atomic: ejections since it last served */
    int64_t ejected_until;               /* atomic, ns (vrpc_now_ns); 0: not ejected */
    int health;                          /* atomic LB_HEALTH_* */
    int64_t next_health_ns;              /* lb thread only */
    struct vrpc_lb *lb;
    struct vrpc_stream *watch;    /* the Health/Watch stream or NULL (lb thread; destroy) */
    int watch_end;                /* atomic LB_WATCH_*: how the stream ended */
    bool check_only;              /* Watch is UNIMPLEMENTED there: poll Check (lb thread) */
    bool probe_due;               /* atomic: its job runs one Check */
    bool job_queued;              /* under lb->mu: a connect/health job is queued or running */
    struct vrpc_subch *next_job;  /* the job queue (under lb->mu) */
    struct vrpc_subch *next_dead; /* the graveyard (under mu) */
};

/* The current set, immutable once published (swapped under lock). */
struct lb_set {
    size_t n;
    struct vrpc_subch **subs; /* the target's order */
    size_t nring;
    /* sorted by h, then ring[nring]: a sentinel (h UINT64_MAX, ring[0]'s
     * sub) that ends every scan; one allocation with bucket */
    struct lb_point {
        uint64_t h;
        uint32_t sub;
    } * ring;
    /* bucket[h >> bucket_shift]: the first ring index whose point is >= the
     * bucket's lowest hash (nring if none), so that a lookup scans from
     * there instead of a binary search (about one step: twice as many
     * buckets as points) */
    uint32_t *bucket;
    unsigned bucket_shift;
};

struct lb_call; /* rpc/lb_call.c */

struct vrpc_lb {
    struct vrpc_channel *parent;
    char target[256];
    struct vrpc_channel_opts o;     /* the parent's, defaults filled */
    struct vrpc_channel_opts inner; /* what each subchannel's channels get */
    struct vrpc_sched *sched;
    bool own_sched;
    struct vrpc_retry_policy *retry;           /* o.n_retry, names copied */
    const struct vrpc_retry_policy *retry_any; /* the "*" entry or NULL */

    struct lb_set *set; /* atomic; read between lb_read_begin/end */
    uint32_t readers;   /* atomic: threads between lb_read_begin and lb_read_end */
    uint32_t rr;        /* atomic round-robin counter */

    pthread_mutex_t mu; /* graveyard, delayed list, thread wake-up */
    pthread_cond_t cond;
    struct vrpc_subch *dead; /* removed from the set, reaped at refs 0 and outstanding 0 */
    struct lb_call *delayed; /* calls waiting for a retry back-off */
    bool stop, kick;
    pthread_t thr;
    bool thr_started;
    /* Connect and health jobs (rpc/lb_thread.c), one per subchannel at a
     * time, so a blackholed address delays no other: a queue (under mu)
     * served by up to VRPC_LB_JOB_THREADS threads the lb thread starts as
     * needed and vrpc_lb_destroy joins. */
    struct vrpc_subch *jobs, **jobs_tail;
    pthread_cond_t job_cond;
    pthread_t job_thr[VRPC_LB_JOB_THREADS];
    unsigned njob_thr; /* started (the lb thread writes it; destroy reads it after joining it) */
    unsigned job_idle; /* job threads waiting (under mu) */
    struct vrpc_resolver *res;

    int64_t tokens_milli; /* atomic: the retry budget, in 1/1000 tokens */

    pthread_mutex_t pool_mu; /* call contexts */
    struct lb_call *free_calls;
    struct lb_call **chunks; /* VRPC_LB_CHUNKS chunks of VRPC_LB_CHUNK */
    uint32_t nchunks;
    uint32_t live_calls; /* atomic (futex): contexts in use, for destroy */
};

#define VRPC_LB_CHUNK 256u
#define VRPC_LB_CHUNKS 256u
/* Ids of calls on a channel over many servers: gen << 32 | LB_ID_BIT | index
 * (LB_ID_BIT, bit 30, apart from the queue's QID_BIT of a plain channel). */
#define LB_ID_BIT 0x40000000u

/* ---- rpc/lb.c ---------------------------------------------------------------- */
int vrpc_lb_create(const char *target, const struct vrpc_channel_opts *o, struct vrpc_channel **out);
void vrpc_lb_destroy(struct vrpc_channel *parent);
enum vrpc_channel_state vrpc_lb_state(const struct vrpc_lb *lb);
int vrpc_lb_connect(struct vrpc_lb *lb, int timeout_ms);
/* The policy's choice (key: the call's hash key, if has_key) with a
 * reference, dropped by vrpc_lb_sub_put; NULL when no server is known. */
struct vrpc_subch *vrpc_lb_sub_get(struct vrpc_lb *lb, bool has_key, uint64_t key);
/* Wake the channel's thread (new subchannels, a failure, a cancel). */
void vrpc_lb_kick(struct vrpc_lb *lb);
static inline void vrpc_lb_sub_put(struct vrpc_lb *lb, struct vrpc_subch *s)
{
    /* never the last reference here: the lb thread reaps removed
     * subchannels (a channel must not be destroyed from its callbacks) */
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0)
        vrpc_lb_kick(lb);
}
void vrpc_lb_sub_free(struct vrpc_subch *s);
/* One of s's channels, READY ones first. */
struct vrpc_channel *vrpc_lb_sub_channel_any(struct vrpc_subch *s);
static inline struct vrpc_channel *vrpc_lb_sub_channel(struct vrpc_subch *s)
{
    return s->nch == 1 ? s->ch[0] : vrpc_lb_sub_channel_any(s);
}

/* The current set, for a short look (no blocking in between): the set
 * replaced under a reader is freed only once every reader that may have seen
 * it has ended (lb_set_replace waits for readers to be 0). */
static inline struct lb_set *lb_read_begin(struct vrpc_lb *lb)
{
    __atomic_add_fetch(&lb->readers, 1, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&lb->set, __ATOMIC_SEQ_CST);
}
static inline void lb_read_end(struct vrpc_lb *lb) { __atomic_sub_fetch(&lb->readers, 1, __ATOMIC_RELEASE); }
/* Publish set (one writer at a time); returns the old one, no reader's any more. */
struct lb_set *lb_set_replace(struct vrpc_lb *lb, struct lb_set *set);
/* The best state of s's channels. */
enum vrpc_channel_state vrpc_lb_sub_state(const struct vrpc_subch *s);

/* A plain channel's URI into o->peer (rpc/call.c). */
void vrpc_ch_copy_peer(const struct vrpc_channel *ch, const struct vrpc_call_opts *o);
/* vrpc_call on a plain channel, arguments already checked (rpc/call.c). */
int vrpc_ch_call(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                 ProtobufCMessage **resp, const struct vrpc_call_opts *o, struct vrpc_status *st);

/* ---- rpc/lb_pick.c ----------------------------------------------------------- */
/* The policy's choice in set (under the read lock), or NULL if set is empty. */
struct vrpc_subch *vrpc_lb_pick(struct vrpc_lb *lb, const struct lb_set *set, bool has_key, uint64_t key);
/* Round robin's choice for turn (the counter's value, taken once). */
struct vrpc_subch *vrpc_lb_pick_rr(const struct lb_set *set, uint32_t turn);

/* Whether s takes calls now: not NOT_SERVING, not ejected, READY. */
static inline __attribute__((always_inline)) bool vrpc_lb_usable(const struct vrpc_subch *s)
{
    if (__atomic_load_n(&s->health, __ATOMIC_RELAXED) == LB_HEALTH_NOT_SERVING)
        return false;
    int64_t until = __atomic_load_n(&s->ejected_until, __ATOMIC_RELAXED);
    if (until && vrpc_now_ns() < until)
        return false;
    if (s->nch == 1) /* a subchannel's channels are plain ones: their own state */
        return __atomic_load_n(&s->ch[0]->state, __ATOMIC_ACQUIRE) == VRPC_CHANNEL_READY;
    return vrpc_lb_sub_state(s) == VRPC_CHANNEL_READY;
}

/* Build set->ring and set->bucket from set->subs (-ENOMEM). */
int vrpc_lb_ring_build(struct lb_set *set);
/* The first ring index whose point is >= h; set->nring if none (the ring
 * wraps to 0: the sentinel there has ring[0]'s owner). set->nring > 0. */
static inline size_t vrpc_lb_ring_find(const struct lb_set *set, uint64_t h)
{
    size_t i = set->bucket[h >> set->bucket_shift];
    while (set->ring[i].h < h) /* the sentinel stops it */
        i++;
    return i;
}
/* A random number (xorshift64*, per thread; not for cryptography). */
/* initial-exec: no __tls_get_addr call from the (PIC) library, as tls_worker in sched/sched.c */
extern __thread uint64_t vrpc_lb_rand_x __attribute__((tls_model("initial-exec")));
uint64_t vrpc_lb_rand_seed(void);
static inline uint64_t vrpc_lb_rand(void)
{
    uint64_t x = vrpc_lb_rand_x;
    if (__builtin_expect(!x, 0))
        x = vrpc_lb_rand_seed();
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    vrpc_lb_rand_x = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Least outstanding's draw: two distinct servers (a and b) at random. */
static inline void vrpc_lb_least_draw(size_t n, uint64_t r, size_t *a, size_t *b)
{
    *a = r % n;
    *b = n > 1 ? (*a + 1 + (r >> 32) % (n - 1)) % n : *a; /* != a */
}

/* Whether s is usable (vrpc_lb_usable) by what costs a few loads: healthy,
 * never ejected or forgiven since, its first channel READY (then so is the
 * best of them, vrpc_lb_sub_state). false says nothing: the slow path looks
 * again with vrpc_lb_usable (an ejection over but not yet forgiven, another
 * of its channels READY). */
static inline __attribute__((always_inline)) bool vrpc_lb_usable_fast(const struct vrpc_subch *s)
{
    return __atomic_load_n(&s->health, __ATOMIC_RELAXED) != LB_HEALTH_NOT_SERVING &&
           !__atomic_load_n(&s->ejected_until, __ATOMIC_RELAXED) &&
           __atomic_load_n(&s->ch[0]->state, __ATOMIC_ACQUIRE) == VRPC_CHANNEL_READY;
}

/* s (or NULL) for an attempt: counted, and the read section ends. */
static inline __attribute__((always_inline)) struct vrpc_subch *vrpc_lb_attempt_counted(struct vrpc_lb *lb,
                                                                                        struct vrpc_subch *s)
{
    if (s)
        __atomic_add_fetch(&s->outstanding, 1, __ATOMIC_RELAXED);
    lb_read_end(lb);
    return s;
}

/* vrpc_lb_attempt_pick's slow paths (rpc/lb_pick.c), each the policy's
 * whole choice from where the fast path left it (the same draw, turn or
 * ring index), counted. */
struct vrpc_subch *vrpc_lb_attempt_any(struct vrpc_lb *lb, const struct lb_set *set, bool has_key, uint64_t key);
struct vrpc_subch *vrpc_lb_attempt_rr(struct vrpc_lb *lb, const struct lb_set *set, uint32_t turn);
struct vrpc_subch *vrpc_lb_attempt_least(struct vrpc_lb *lb, const struct lb_set *set, size_t a, size_t b);
struct vrpc_subch *vrpc_lb_attempt_ring(struct vrpc_lb *lb, const struct lb_set *set, size_t lo);

/* An attempt's subchannel (a unary call's, on the calling thread's hot
 * path): the policy's choice, the same as vrpc_lb_sub_get's, with the
 * attempt counted in its outstanding, which holds it instead of a reference
 * until vrpc_lb_attempt_end/_drop. Counted inside the set's read section: a
 * set replaced meanwhile waits for it before the subchannel goes to the
 * graveyard, where the lb thread frees it only at refs 0 and outstanding 0
 * (by its next tick, LB_TICK_NS: an attempt's end wakes no thread). NULL
 * when no server is known.
 * Each policy's first choice inline when vrpc_lb_usable_fast says it is
 * usable; the slow paths decide the rest as vrpc_lb_pick would from the same
 * draw. Least outstanding looks at the less busy of its two first: usable,
 * it is the choice whether or not the other one is. */
static inline __attribute__((always_inline)) struct vrpc_subch *vrpc_lb_attempt_pick(struct vrpc_lb *lb, bool has_key,
                                                                                     uint64_t key)
{
    const struct lb_set *set = lb_read_begin(lb);
    size_t n = set ? set->n : 0;
    struct vrpc_subch *s;
    if (n <= 1) {
        if (!n)
            return vrpc_lb_attempt_counted(lb, NULL);
        s = set->subs[0]; /* every policy's choice if usable */
        return vrpc_lb_usable_fast(s) ? vrpc_lb_attempt_counted(lb, s) : vrpc_lb_attempt_any(lb, set, has_key, key);
    }
    switch (lb->o.lb_policy) {
    case VRPC_LB_ROUND_ROBIN: {
        uint32_t turn = __atomic_fetch_add(&lb->rr, 1, __ATOMIC_RELAXED);
        s = set->subs[turn % n];
        return vrpc_lb_usable_fast(s) ? vrpc_lb_attempt_counted(lb, s) : vrpc_lb_attempt_rr(lb, set, turn);
    }
    case VRPC_LB_LEAST_OUTSTANDING: {
        if (__builtin_expect(!vrpc_lb_rand_x, 0))
            break; /* vrpc_lb_pick seeds it */
        size_t a, b;
        vrpc_lb_least_draw(n, vrpc_lb_rand(), &a, &b);
        struct vrpc_subch *x = set->subs[a], *y = set->subs[b];
        s = __atomic_load_n(&x->outstanding, __ATOMIC_RELAXED) <= __atomic_load_n(&y->outstanding, __ATOMIC_RELAXED)
                ? x
                : y;
        return vrpc_lb_usable_fast(s) ? vrpc_lb_attempt_counted(lb, s) : vrpc_lb_attempt_least(lb, set, a, b);
    }
    case VRPC_LB_RING_HASH: {
        if (!has_key && __builtin_expect(!vrpc_lb_rand_x, 0))
            break;
        size_t lo = vrpc_lb_ring_find(set, has_key ? key : vrpc_lb_rand());
        s = set->subs[set->ring[lo].sub]; /* lo == nring: the sentinel's, ring[0]'s */
        return vrpc_lb_usable_fast(s) ? vrpc_lb_attempt_counted(lb, s) : vrpc_lb_attempt_ring(lb, set, lo);
    }
    }
    return vrpc_lb_attempt_any(lb, set, has_key, key);
}
/* vrpc_lb_attempt_pick, not inline (the paths that are not the hot one). */
struct vrpc_subch *vrpc_lb_attempt_get(struct vrpc_lb *lb, bool has_key, uint64_t key);
/* The end of an attempt from vrpc_lb_attempt_get that never ran (refused,
 * past its deadline, cancelled): its count goes, the attempt's last touch
 * of s (a removed one may be freed from here on). */
static inline void vrpc_lb_attempt_drop(struct vrpc_subch *s)
{
    __atomic_sub_fetch(&s->outstanding, 1, __ATOMIC_RELEASE);
}
uint64_t vrpc_lb_hash(const void *p, size_t len);
/* A call's (or stream's) ring-hash key from its options: true and *key =
 * the hash of o->hash_key when it has one; else false and *key = 0. */
static inline bool vrpc_lb_call_key(const struct vrpc_call_opts *o, uint64_t *key)
{
    bool has = o && o->hash_key;
    *key = has ? vrpc_lb_hash(o->hash_key, o->hash_key_len) : 0;
    return has;
}
/* An attempt on s ended with code: counters and outlier ejection. */
void vrpc_lb_outcome_slow(struct vrpc_lb *lb, struct vrpc_subch *s, int code);
/* Nonzero if a success on s has more to do than count: a failure since the
 * last success, or an ejection to forgive (one branch for both). */
static inline uint64_t vrpc_lb_ok_work(const struct vrpc_subch *s)
{
    return __atomic_load_n(&s->consec_fail, __ATOMIC_RELAXED) |
           (uint64_t)__atomic_load_n(&s->ejected_until, __ATOMIC_RELAXED);
}
static inline void vrpc_lb_outcome(struct vrpc_lb *lb, struct vrpc_subch *s, int code)
{
    __atomic_add_fetch(&s->calls, 1, __ATOMIC_RELAXED);
    if (code == VRPC_OK && !vrpc_lb_ok_work(s))
        return;
    vrpc_lb_outcome_slow(lb, s, code);
}
/* An attempt from vrpc_lb_attempt_get ended with code: its outcome, then as
 * vrpc_lb_attempt_drop. */
static inline void vrpc_lb_attempt_end(struct vrpc_lb *lb, struct vrpc_subch *s, int code)
{
    vrpc_lb_outcome(lb, s, code);
    vrpc_lb_attempt_drop(s);
}

/* ---- rpc/lb_call.c ----------------------------------------------------------- */
int vrpc_lb_call(struct vrpc_lb *lb, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                 ProtobufCMessage **resp, const struct vrpc_call_opts *o, struct vrpc_status *st);
int vrpc_lb_call_async(struct vrpc_lb *lb, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                       const struct vrpc_call_opts *o, vrpc_call_cb cb, void *arg);
int vrpc_lb_cancel(struct vrpc_lb *lb, uint64_t id);
/* The lb thread: start the delayed calls now due (or cancelled); returns
 * the time of the next one (INT64_MAX: none). */
int64_t vrpc_lb_run_delayed(struct vrpc_lb *lb, int64_t now, bool all);
void vrpc_lb_calls_free(struct vrpc_lb *lb);

/* ---- rpc/lb_thread.c --------------------------------------------------------- */
void *vrpc_lb_thread(void *arg);
/* After the lb thread was joined (stop set): join the job threads, forget
 * the jobs still queued (their subchannels' references go with the set). */
void vrpc_lb_jobs_stop(struct vrpc_lb *lb);

/* ---- rpc/lb_stats.c ---------------------------------------------------------- */
int vrpc_lb_metrics_text(const struct vrpc_lb *lb, char **out, size_t *len);

#endif
