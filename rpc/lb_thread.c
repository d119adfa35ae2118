/* The thread of a channel over many servers: it has the subchannels'
 * channels that are not READY connected (each after its own back-off: the
 * channel's, rpc/channel_conn.c) by job threads, one subchannel's job at a
 * time each, so a slow or blackholed address delays no other; follows their
 * health (Health.Watch, or Check polled
 * where Watch is UNIMPLEMENTED), reaps the subchannels the
 * resolver removed once no attempt uses them, and starts the retries whose
 * back-off has passed. See rpc/lb.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "rpc/channel_internal.h"
#include "rpc/health_hook.h"
#include <verbrpc/stream.h>
#include "rpc/lb.h"

#define LB_TICK_NS 50000000 /* at least this often: back-offs, health, ejections, reaping */

static bool wants_connect(struct vrpc_channel *ch)
{
    enum vrpc_channel_state st = vrpc_channel_state(ch);
    return st == VRPC_CHANNEL_IDLE || st == VRPC_CHANNEL_TRANSIENT_FAILURE;
}

/* Connect ch if it is not READY and its back-off has passed (blocks up to
 * connect_timeout_ms: a job thread's). */
static void connect_if_due(struct vrpc_channel *ch)
{
    if (!wants_connect(ch))
        return;
    struct vrpc_conn *c;
    if (vrpc_ch_get_conn(ch, VRPC_NO_DEADLINE, false, &c) == 0)
        conn_unref(c);
}

/* vrpc_health_probe, vrpc_health_watch: installed by idl/health.c. */
vrpc_health_probe_fn vrpc_health_probe;
vrpc_health_watch_fn vrpc_health_watch;

static void health_set(struct vrpc_subch *s, int h)
{
    int was = __atomic_exchange_n(&s->health, h, __ATOMIC_RELAXED);
    if (was != h && h == LB_HEALTH_NOT_SERVING)
        vrpc_rpc_log("channel %s: server %s is NOT_SERVING: out of rotation", s->lb->target, s->uri);
}

/* A status from s's Watch stream (a worker): it takes effect at once. */
static void watch_update(void *arg, int serving)
{
    health_set(arg, serving ? LB_HEALTH_SERVING : LB_HEALTH_NOT_SERVING);
}

/* s's Watch stream ended (a worker): the lb thread destroys it, and polls
 * Check from then on if the server has no Watch. */
static void watch_done(void *arg, int code)
{
    struct vrpc_subch *s = arg;
    __atomic_store_n(&s->watch_end, code == VRPC_UNIMPLEMENTED ? LB_WATCH_UNIMPLEMENTED : LB_WATCH_ENDED,
                     __ATOMIC_RELEASE);
    vrpc_lb_kick(s->lb);
}

/* s's health (READY): a Watch stream while it lasts (opened again one
 * period after it ends), else one Health.Check per period. */
static void health_check(struct vrpc_lb *lb, struct vrpc_subch *s, int64_t now)
{
    if (!lb->o.health_check_ms)
        return;
    int64_t period = (int64_t)lb->o.health_check_ms * 1000000;
    if (s->watch) {
        int end = __atomic_load_n(&s->watch_end, __ATOMIC_ACQUIRE);
        if (end == LB_WATCH_RUNNING)
            return;
        vrpc_stream_destroy(s->watch);
        s->watch = NULL;
        if (end == LB_WATCH_UNIMPLEMENTED) {
            s->check_only = true;
            s->next_health_ns = now; /* the first Check now */
        } else {
            s->next_health_ns = now + period;
        }
    }
    if (now < s->next_health_ns || vrpc_channel_state(s->ch[0]) != VRPC_CHANNEL_READY)
        return; /* (a subchannel that becomes READY is checked at once) */
    s->next_health_ns = now + period;
    vrpc_health_watch_fn watch = __atomic_load_n(&vrpc_health_watch, __ATOMIC_ACQUIRE);
    if (!s->check_only && watch) {
        __atomic_store_n(&s->watch_end, LB_WATCH_RUNNING, __ATOMIC_RELAXED);
        if (watch(s->ch[0], watch_update, watch_done, s, &s->watch) == 0)
            return;
        s->watch = NULL; /* not opened: a Check this time */
    }
    __atomic_store_n(&s->probe_due, true, __ATOMIC_RELAXED); /* a blocking Check: s's job runs it */
}

/* One Health.Check of s, if the lb thread asked for it (s's job). */
static void probe_if_due(struct vrpc_lb *lb, struct vrpc_subch *s)
{
    vrpc_health_probe_fn probe = __atomic_load_n(&vrpc_health_probe, __ATOMIC_ACQUIRE);
    if (!__atomic_exchange_n(&s->probe_due, false, __ATOMIC_RELAXED) || !probe)
        return;
    int r = probe(s->ch[0], (int64_t)(lb->o.health_check_ms < 1000 ? lb->o.health_check_ms : 1000) * 1000);
    if (r >= 0)
        health_set(s, r ? LB_HEALTH_SERVING : LB_HEALTH_NOT_SERVING);
}

/* ---- the job threads: what blocks, one subchannel at a time --------------- */

static void *job_thread(void *arg)
{
    struct vrpc_lb *lb = arg;
    pthread_mutex_lock(&lb->mu);
    for (;;) {
        while (!lb->stop && !lb->jobs) {
            lb->job_idle++;
            pthread_cond_wait(&lb->job_cond, &lb->mu);
            lb->job_idle--;
        }
        if (lb->stop)
            break;
        struct vrpc_subch *s = lb->jobs;
        if (!(lb->jobs = s->next_job))
            lb->jobs_tail = &lb->jobs;
        pthread_mutex_unlock(&lb->mu);
        for (unsigned k = 0; k < s->nch; k++)
            connect_if_due(s->ch[k]);
        probe_if_due(lb, s);
        pthread_mutex_lock(&lb->mu);
        s->job_queued = false;
        pthread_mutex_unlock(&lb->mu);
        vrpc_lb_sub_put(lb, s);
        pthread_mutex_lock(&lb->mu);
    }
    pthread_mutex_unlock(&lb->mu);
    vrpc_thread_release(); /* the Checks' response arena */
    return NULL;
}

/* Queue s's job unless it has one (lb thread), starting a job thread when
 * none is idle and fewer than VRPC_LB_JOB_THREADS run; with all of them busy
 * it waits its turn. */
static void job_queue(struct vrpc_lb *lb, struct vrpc_subch *s)
{
    pthread_mutex_lock(&lb->mu);
    if (s->job_queued || lb->stop) {
        pthread_mutex_unlock(&lb->mu);
        return;
    }
    s->job_queued = true;
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED); /* the job's */
    s->next_job = NULL;
    *lb->jobs_tail = s;
    lb->jobs_tail = &s->next_job;
    bool start = lb->job_idle == 0 && lb->njob_thr < VRPC_LB_JOB_THREADS;
    pthread_cond_signal(&lb->job_cond);
    pthread_mutex_unlock(&lb->mu);
    if (start && pthread_create(&lb->job_thr[lb->njob_thr], NULL, job_thread, lb) == 0)
        lb->njob_thr++;
}

void vrpc_lb_jobs_stop(struct vrpc_lb *lb)
{
    pthread_mutex_lock(&lb->mu);
    lb->stop = true;
    pthread_cond_broadcast(&lb->job_cond);
    pthread_mutex_unlock(&lb->mu);
    for (unsigned i = 0; i < lb->njob_thr; i++)
        pthread_join(lb->job_thr[i], NULL);
    lb->njob_thr = 0;
    for (struct vrpc_subch *s = lb->jobs; s; s = s->next_job)
        __atomic_sub_fetch(&s->refs, 1, __ATOMIC_RELAXED);
    lb->jobs = NULL;
    lb->jobs_tail = &lb->jobs;
}

/* The current subchannels, each with a reference (*n of them). */
static struct vrpc_subch **snapshot(struct vrpc_lb *lb, size_t *n)
{
    struct vrpc_subch **v = NULL;
    *n = 0;
    size_t want = 0;
    for (;;) { /* no allocation while reading */
        struct lb_set *set = lb_read_begin(lb);
        size_t have = set ? set->n : 0;
        if (v && have <= want) {
            *n = have;
            for (size_t i = 0; i < have; i++) {
                v[i] = set->subs[i];
                __atomic_add_fetch(&v[i]->refs, 1, __ATOMIC_RELAXED);
            }
        }
        lb_read_end(lb);
        if (!have || (v && have <= want))
            return v;
        free(v);
        want = have;
        if (!(v = malloc(want * sizeof(*v))))
            return NULL;
    }
    return v;
}

/* Removed subchannels nothing uses any more: no reference (a stream's, a
 * job's) and no attempt, which holds its subchannel by its count in
 * outstanding (none can start: the set that named it is gone). */
static void reap(struct vrpc_lb *lb)
{
    struct vrpc_subch *gone = NULL;
    pthread_mutex_lock(&lb->mu);
    for (struct vrpc_subch **pp = &lb->dead; *pp;) {
        struct vrpc_subch *s = *pp;
        if (__atomic_load_n(&s->refs, __ATOMIC_ACQUIRE) == 0 &&
            __atomic_load_n(&s->outstanding, __ATOMIC_ACQUIRE) == 0) {
            *pp = s->next_dead;
            s->next_dead = gone;
            gone = s;
        } else {
            pp = &s->next_dead;
        }
    }
    pthread_mutex_unlock(&lb->mu);
    while (gone) {
        struct vrpc_subch *s = gone;
        gone = s->next_dead;
        vrpc_lb_sub_free(s);
    }
}

static bool stopping(struct vrpc_lb *lb)
{
    pthread_mutex_lock(&lb->mu);
    bool st = lb->stop;
    pthread_mutex_unlock(&lb->mu);
    return st;
}

static void tend(struct vrpc_lb *lb)
{
    size_t n;
    struct vrpc_subch **v = snapshot(lb, &n);
    bool failing = false;
    for (size_t i = 0; i < n && !stopping(lb); i++) {
        health_check(lb, v[i], vrpc_now_ns());
        bool job = __atomic_load_n(&v[i]->probe_due, __ATOMIC_RELAXED);
        for (unsigned k = 0; k < v[i]->nch && !job; k++)
            job = wants_connect(v[i]->ch[k]);
        if (job)
            job_queue(lb, v[i]);
        failing |= vrpc_lb_sub_state(v[i]) == VRPC_CHANNEL_TRANSIENT_FAILURE;
    }
    if (failing) /* a server gone: perhaps the source knows (the resolver limits the rate) */
        vrpc_resolver_refresh(lb->res);
    for (size_t i = 0; i < n; i++)
        vrpc_lb_sub_put(lb, v[i]);
    free(v);
    reap(lb);
}

void *vrpc_lb_thread(void *arg)
{
    struct vrpc_lb *lb = arg;
    for (;;) {
        tend(lb);
        int64_t now = vrpc_now_ns();
        int64_t next = vrpc_lb_run_delayed(lb, now, false);
        if (next > now + LB_TICK_NS)
            next = now + LB_TICK_NS;
        pthread_mutex_lock(&lb->mu);
        if (!lb->kick && !lb->stop && next > now) {
            /* the condition variable's clock is CLOCK_REALTIME: wait a relative time */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (next - now);
            ts.tv_sec = t / 1000000000;
            ts.tv_nsec = t % 1000000000;
            pthread_cond_timedwait(&lb->cond, &lb->mu, &ts);
        }
        lb->kick = false;
        bool stop = lb->stop;
        pthread_mutex_unlock(&lb->mu);
        if (stop)
            break;
    }
    vrpc_lb_run_delayed(lb, vrpc_now_ns(), true);
    vrpc_thread_release(); /* the health checks' response arena */
    return NULL;
}
