/* A channel over many servers: create and destroy, the resolver's updates
 * (the set of subchannels and its hash ring), the channel's state and
 * connect. See rpc/lb.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include "rpc/channel_internal.h"
#include <verbrpc/stream.h>
#include "rpc/lb.h"

/* ---- subchannels ------------------------------------------------------------- */

static void sub_close(struct vrpc_subch *s)
{
    if (s->watch) /* first: its callbacks use s */
        vrpc_stream_destroy(s->watch);
    s->watch = NULL;
    for (unsigned i = 0; i < s->nch; i++)
        vrpc_channel_destroy(s->ch[i]);
    s->nch = 0;
}

void vrpc_lb_sub_free(struct vrpc_subch *s)
{
    sub_close(s);
    free(s);
}

static struct vrpc_subch *sub_new(struct vrpc_lb *lb, const char *uri)
{
    struct vrpc_subch *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    snprintf(s->uri, sizeof(s->uri), "%s", uri);
    s->lb = lb;
    s->refs = 1; /* the set's */
    unsigned k = lb->o.conns_per_addr;
    for (s->nch = 0; s->nch < k; s->nch++) {
        int rc = vrpc_channel_create(uri, &lb->inner, &s->ch[s->nch]);
        if (rc) {
            vrpc_rpc_log("channel %s: server %s left out: cannot create its channel (%d)", lb->target, uri, rc);
            vrpc_lb_sub_free(s);
            return NULL;
        }
    }
    return s;
}

enum vrpc_channel_state vrpc_lb_sub_state(const struct vrpc_subch *s)
{
    static const int rank[] = {[VRPC_CHANNEL_READY] = 4,
                               [VRPC_CHANNEL_CONNECTING] = 3,
                               [VRPC_CHANNEL_IDLE] = 2,
                               [VRPC_CHANNEL_TRANSIENT_FAILURE] = 1,
                               [VRPC_CHANNEL_SHUTDOWN] = 0};
    enum vrpc_channel_state best = VRPC_CHANNEL_SHUTDOWN;
    for (unsigned i = 0; i < s->nch; i++) {
        enum vrpc_channel_state st = vrpc_channel_state(s->ch[i]);
        if (rank[st] > rank[best])
            best = st;
    }
    return best;
}

struct vrpc_channel *vrpc_lb_sub_channel_any(struct vrpc_subch *s)
{
    uint32_t start = __atomic_fetch_add(&s->next_ch, 1, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < s->nch; i++) {
        struct vrpc_channel *c = s->ch[(start + i) % s->nch];
        if (vrpc_channel_state(c) == VRPC_CHANNEL_READY)
            return c;
    }
    return s->ch[start % s->nch];
}

struct vrpc_subch *vrpc_lb_sub_get(struct vrpc_lb *lb, bool has_key, uint64_t key)
{
    struct vrpc_subch *s = vrpc_lb_pick(lb, lb_read_begin(lb), has_key, key);
    if (s)
        __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
    lb_read_end(lb);
    return s;
}

struct lb_set *lb_set_replace(struct vrpc_lb *lb, struct lb_set *set)
{
    struct lb_set *old = __atomic_exchange_n(&lb->set, set, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&lb->readers, __ATOMIC_ACQUIRE))
        sched_yield(); /* a reader's look is a few hundred instructions */
    return old;
}

void vrpc_lb_kick(struct vrpc_lb *lb)
{
    pthread_mutex_lock(&lb->mu);
    lb->kick = true;
    pthread_cond_signal(&lb->cond);
    pthread_mutex_unlock(&lb->mu);
}

/* ---- the resolver's updates --------------------------------------------------- */

static struct vrpc_subch *find_sub(const struct lb_set *set, const char *uri)
{
    for (size_t i = 0; set && i < set->n; i++)
        if (strcmp(set->subs[i]->uri, uri) == 0)
            return set->subs[i];
    return NULL;
}

static void set_free(struct lb_set *set)
{
    if (set) {
        free(set->subs);
        free(set->ring);
        free(set);
    }
}

/* The new set: kept subchannels, new ones for new addresses (duplicates once). */
static struct lb_set *set_build(struct vrpc_lb *lb, const struct lb_set *old, const char *const *uris, size_t n)
{
    struct lb_set *set = calloc(1, sizeof(*set));
    if (!set || !(set->subs = calloc(n ? n : 1, sizeof(*set->subs)))) {
        free(set);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (find_sub(set, uris[i]))
            continue;
        struct vrpc_subch *s = find_sub(old, uris[i]);
        if (s)
            __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED); /* the new set's */
        else if (!(s = sub_new(lb, uris[i])))
            continue;
        set->subs[set->n++] = s;
    }
    if (vrpc_lb_ring_build(set)) {
        for (size_t i = 0; i < set->n; i++)
            if (__atomic_sub_fetch(&set->subs[i]->refs, 1, __ATOMIC_ACQ_REL) == 0)
                vrpc_lb_sub_free(set->subs[i]); /* a new one nobody saw */
        set_free(set);
        return NULL;
    }
    return set;
}

static void on_update(void *arg, const char *const *uris, size_t n)
{
    struct vrpc_lb *lb = arg;
    struct lb_set *old = __atomic_load_n(&lb->set, __ATOMIC_ACQUIRE); /* only this thread replaces it */
    struct lb_set *set = set_build(lb, old, uris, n);
    if (!set) {
        vrpc_rpc_log("channel %s: out of memory for a new set of %zu servers; the last set stays", lb->target, n);
        return;
    }
    lb_set_replace(lb, set);
    /* the old set's references: a subchannel no longer named goes to the
     * graveyard, reaped by the lb thread once its attempts are over */
    pthread_mutex_lock(&lb->mu);
    for (size_t i = 0; old && i < old->n; i++) {
        struct vrpc_subch *s = old->subs[i];
        if (find_sub(set, s->uri)) {
            __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL);
            continue;
        }
        s->next_dead = lb->dead;
        lb->dead = s;
        __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL);
    }
    lb->kick = true;
    pthread_cond_signal(&lb->cond);
    pthread_mutex_unlock(&lb->mu);
    set_free(old);
}

/* ---- the channel -------------------------------------------------------------- */

static int lb_opts(struct vrpc_lb *lb, const struct vrpc_channel_opts *o)
{
    if (o)
        lb->o = *o;
    if (!lb->o.conns_per_addr)
        lb->o.conns_per_addr = 1;
    if (lb->o.conns_per_addr > VRPC_LB_MAX_CONNS || lb->o.lb_policy > VRPC_LB_RING_HASH) {
        vrpc_rpc_log("channel %s: conns_per_addr %u (at most %u) or lb_policy %u unknown", lb->target,
                     lb->o.conns_per_addr, VRPC_LB_MAX_CONNS, lb->o.lb_policy);
        return -EINVAL;
    }
    if (!lb->o.outlier_failures)
        lb->o.outlier_failures = 5;
    if (!lb->o.outlier_eject_ms)
        lb->o.outlier_eject_ms = 1000;
    if (!lb->o.retry_max_tokens)
        lb->o.retry_max_tokens = 10;
    if (!lb->o.retry_token_ratio_milli)
        lb->o.retry_token_ratio_milli = 100;
    lb->tokens_milli = (int64_t)lb->o.retry_max_tokens * 1000;
    if (lb->o.n_retry && !lb->o.retry)
        return -EINVAL;
    if (lb->o.n_retry && !(lb->retry = calloc(lb->o.n_retry, sizeof(*lb->retry))))
        return -ENOMEM;
    for (size_t i = 0; i < lb->o.n_retry; i++) {
        struct vrpc_retry_policy *p = &lb->retry[i];
        *p = lb->o.retry[i];
        if (!p->method || !(p->method = strdup(p->method)))
            return p->method ? -ENOMEM : -EINVAL;
        if (p->max_attempts > VRPC_LB_MAX_ATTEMPTS)
            p->max_attempts = VRPC_LB_MAX_ATTEMPTS;
        if (!p->initial_backoff_ms)
            p->initial_backoff_ms = 50;
        if (!p->max_backoff_ms)
            p->max_backoff_ms = 1000;
        if (!p->backoff_multiplier_pct)
            p->backoff_multiplier_pct = 200;
        if (!p->retryable_codes)
            p->retryable_codes = VRPC_CODE_BIT(VRPC_UNAVAILABLE);
        if (strcmp(p->method, "*") == 0)
            lb->retry_any = p;
    }
    lb->o.retry = lb->retry;
    lb->inner = lb->o;
    lb->inner.retry = NULL;
    lb->inner.n_retry = 0;
    return 0;
}

static void worker_arena(unsigned worker, void *arg)
{
    (void)worker;
    (void)arg;
    vrpc_rpc_tls_arena();
}

static int lb_sched(struct vrpc_lb *lb)
{
    if (lb->o.sched) {
        lb->sched = lb->o.sched;
    } else {
        struct vrpc_sched_config cfg; /* as rpc/channel.c makes its own */
        vrpc_sched_config_init(&cfg);
        cfg.nworkers = lb->o.threads ? lb->o.threads : 2;
        if (lb->o.no_spin)
            cfg.spin_us = 1;
        cfg.worker_start = worker_arena;
        cfg.cpu_mask = lb->o.cpu_mask;
        cfg.spin_yield = lb->o.cpu_mask != 0;
        int rc = vrpc_sched_create(&cfg, &lb->sched);
        if (rc)
            return rc;
        lb->own_sched = true;
    }
    lb->inner.sched = lb->sched;
    return 0;
}

int vrpc_lb_create(const char *target, const struct vrpc_channel_opts *o, struct vrpc_channel **out)
{
    struct vrpc_channel *ch = calloc(1, sizeof(*ch));
    struct vrpc_lb *lb = calloc(1, sizeof(*lb));
    int rc;
    if (!ch || !lb) {
        free(ch);
        free(lb);
        return -ENOMEM;
    }
    ch->lb = lb;
    lb->parent = ch;
    snprintf(lb->target, sizeof(lb->target), "%s", target);
    pthread_mutex_init(&lb->mu, NULL);
    pthread_cond_init(&lb->cond, NULL);
    pthread_cond_init(&lb->job_cond, NULL);
    lb->jobs_tail = &lb->jobs;
    pthread_mutex_init(&lb->pool_mu, NULL);
    set_state(ch, VRPC_CHANNEL_IDLE);
    if ((rc = lb_opts(lb, o)) || (rc = lb_sched(lb)))
        goto fail;
    if (!(lb->chunks = calloc(VRPC_LB_CHUNKS, sizeof(*lb->chunks)))) {
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = vrpc_resolver_create(target, on_update, lb, &lb->res)))
        goto fail;
    if ((rc = -pthread_create(&lb->thr, NULL, vrpc_lb_thread, lb)))
        goto fail;
    lb->thr_started = true;
    *out = ch;
    return 0;
fail:
    vrpc_lb_destroy(ch);
    return rc;
}

enum vrpc_channel_state vrpc_lb_state(const struct vrpc_lb *lb)
{
    if (__atomic_load_n(&lb->parent->state, __ATOMIC_ACQUIRE) == VRPC_CHANNEL_SHUTDOWN)
        return VRPC_CHANNEL_SHUTDOWN;
    static const int rank[] = {[VRPC_CHANNEL_READY] = 4,
                               [VRPC_CHANNEL_CONNECTING] = 3,
                               [VRPC_CHANNEL_IDLE] = 2,
                               [VRPC_CHANNEL_TRANSIENT_FAILURE] = 1,
                               [VRPC_CHANNEL_SHUTDOWN] = 0};
    enum vrpc_channel_state best = VRPC_CHANNEL_IDLE;
    struct vrpc_lb *l = (struct vrpc_lb *)lb;
    struct lb_set *set = lb_read_begin(l);
    if (set && set->n) {
        best = VRPC_CHANNEL_SHUTDOWN;
        for (size_t i = 0; i < set->n; i++) {
            enum vrpc_channel_state st = vrpc_lb_sub_state(set->subs[i]);
            if (rank[st] > rank[best])
                best = st;
        }
    }
    lb_read_end(l);
    return best == VRPC_CHANNEL_SHUTDOWN ? VRPC_CHANNEL_TRANSIENT_FAILURE : best;
}

int vrpc_lb_connect(struct vrpc_lb *lb, int timeout_ms)
{
    int64_t end = vrpc_now_ns() + (int64_t)timeout_ms * 1000000;
    vrpc_lb_kick(lb);
    for (;;) {
        enum vrpc_channel_state st = vrpc_lb_state(lb);
        if (st == VRPC_CHANNEL_READY)
            return 0;
        if (st == VRPC_CHANNEL_SHUTDOWN)
            return -ESHUTDOWN;
        if (vrpc_now_ns() >= end)
            return -ETIMEDOUT;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

void vrpc_lb_destroy(struct vrpc_channel *parent)
{
    struct vrpc_lb *lb = parent->lb;
    set_state(parent, VRPC_CHANNEL_SHUTDOWN); /* no retry starts from here on */
    if (lb->thr_started) {
        pthread_mutex_lock(&lb->mu);
        lb->stop = true;
        pthread_cond_signal(&lb->cond);
        pthread_mutex_unlock(&lb->mu);
        pthread_join(lb->thr, NULL); /* it completed the delayed calls (CANCELLED) */
    }
    vrpc_lb_jobs_stop(lb);          /* a connect under way ends within connect_timeout_ms */
    vrpc_resolver_destroy(lb->res); /* no update from here on (the thread refreshed it) */
    /* the subchannels' channels complete their calls with CANCELLED (the
     * parent is SHUTDOWN: no retry); a subchannel's memory stays until the
     * last callback using it is over */
    struct lb_set *set = lb_set_replace(lb, NULL);
    for (size_t i = 0; set && i < set->n; i++) {
        set->subs[i]->next_dead = lb->dead;
        lb->dead = set->subs[i];
    }
    set_free(set);
    for (struct vrpc_subch *s = lb->dead; s; s = s->next_dead)
        sub_close(s);
    uint32_t v; /* callbacks still running (early failures, a caller's scheduler) */
    while ((v = __atomic_load_n(&lb->live_calls, __ATOMIC_ACQUIRE)) != 0) {
        vrpc_lb_run_delayed(lb, 0, true); /* one a callback delayed as the thread stopped */
        vrpc_rpc_futex_wait_ns(&lb->live_calls, v, 10000000);
    }
    for (struct vrpc_subch *s = lb->dead, *nx; s; s = nx) {
        nx = s->next_dead;
        free(s);
    }
    if (lb->own_sched)
        vrpc_sched_destroy(lb->sched);
    vrpc_lb_calls_free(lb);
    for (size_t i = 0; lb->retry && i < lb->o.n_retry; i++)
        free((char *)lb->retry[i].method);
    free(lb->retry);
    pthread_mutex_destroy(&lb->mu);
    pthread_cond_destroy(&lb->cond);
    pthread_cond_destroy(&lb->job_cond);
    pthread_mutex_destroy(&lb->pool_mu);
    free(lb);
    free(parent);
}

void vrpc_ch_copy_peer(const struct vrpc_channel *ch, const struct vrpc_call_opts *o)
{
    if (o->peer_cap)
        snprintf(o->peer, o->peer_cap, "%s", ch->turi);
}
