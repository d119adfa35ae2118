/* Calls on a channel over many servers: pick a subchannel, run the attempt
 * on one of its channels, retry after gRPC's design (per-method policy,
 * back-off with jitter, one deadline, the retry budget; transparent retry of
 * what the server did not process, VRPC_STATUS_UNPROCESSED), cancel. See rpc/lb.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "rpc/channel_internal.h"
#include "rpc/lb.h"
#include "rpc/status.h"

#define LB_INLINE 512         /* packed request copied inline for retries */
#define LB_MAX_TRANSPARENT 10 /* transparent retries of one call */

/* How far a call's retries have gone. */
struct lb_try {
    uint32_t attempts;    /* attempts made */
    uint32_t transparent; /* of them, transparent retries */
    uint64_t bound_ms;    /* the back-off bound of the next retry */
};

/* A call context: every async call, and a synchronous one whose id the
 * caller wants (cancel). In chunks of the channel, never freed before it. */
struct lb_call {
    struct lb_call *next; /* free list or delayed list (under pool_mu / lb->mu) */
    struct vrpc_lb *lb;
    uint32_t index, gen;
    pthread_mutex_t mu; /* cancelled, ach and the attempt's id */
    bool cancelled;
    struct vrpc_channel *ach; /* the attempt's channel while it runs */
    uint64_t inner_id;        /* its id there (written by the channel) */
    uint32_t refs;            /* atomic: the call's own + one per attempt being started */
    const struct vrpc_method_desc *m;
    const struct vrpc_retry_policy *pol;
    const ProtobufCMessage *req; /* the caller's (held), else NULL after the first attempt */
    uint8_t *packed;             /* a packed copy for retries, or NULL */
    size_t plen;
    uint8_t inl[LB_INLINE];
    struct vrpc_call_opts uo; /* the caller's (md only while req is held) */
    bool has_key;
    uint64_t key;
    int64_t deadline;
    struct lb_try tr;
    struct vrpc_subch *sub; /* the attempt's subchannel */
    vrpc_call_cb cb;
    void *arg;
    int64_t due;           /* delayed: when the next attempt starts */
    struct vrpc_task task; /* a failure completed on a worker */
    struct vrpc_status st; /* its status */
    char peer[VRPC_LB_URI_MAX];
};

/* ---- contexts ----------------------------------------------------------------- */

static struct lb_call *call_get(struct vrpc_lb *lb)
{
    pthread_mutex_lock(&lb->pool_mu);
    struct lb_call *c = lb->free_calls;
    if (!c && lb->nchunks < VRPC_LB_CHUNKS) {
        struct lb_call *k = calloc(VRPC_LB_CHUNK, sizeof(*k));
        if (k) {
            for (uint32_t i = 0; i < VRPC_LB_CHUNK; i++) {
                k[i].lb = lb;
                k[i].index = lb->nchunks * VRPC_LB_CHUNK + i;
                k[i].gen = 1;
                pthread_mutex_init(&k[i].mu, NULL);
                k[i].next = i + 1 < VRPC_LB_CHUNK ? &k[i + 1] : NULL;
            }
            __atomic_store_n(&lb->chunks[lb->nchunks], k, __ATOMIC_RELEASE);
            __atomic_store_n(&lb->nchunks, lb->nchunks + 1, __ATOMIC_RELEASE);
            c = k;
        }
    }
    if (c)
        lb->free_calls = c->next;
    pthread_mutex_unlock(&lb->pool_mu);
    if (!c)
        return NULL;
    __atomic_add_fetch(&lb->live_calls, 1, __ATOMIC_RELAXED);
    c->cancelled = false;
    c->ach = NULL;
    c->inner_id = 0;
    c->refs = 1;
    c->packed = NULL;
    c->sub = NULL;
    c->tr = (struct lb_try){0};
    return c;
}

static void call_put(struct vrpc_lb *lb, struct lb_call *c)
{
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (c->packed && c->packed != c->inl)
        free(c->packed);
    pthread_mutex_lock(&c->mu);
    if (++c->gen == 0)
        c->gen = 1;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&lb->pool_mu);
    c->next = lb->free_calls;
    lb->free_calls = c;
    pthread_mutex_unlock(&lb->pool_mu);
    if (__atomic_sub_fetch(&lb->live_calls, 1, __ATOMIC_RELEASE) == 0)
        vrpc_futex_wake_all(&lb->live_calls);
}

static uint64_t call_id(const struct lb_call *c) { return (uint64_t)c->gen << 32 | LB_ID_BIT | c->index; }

void vrpc_lb_calls_free(struct vrpc_lb *lb)
{
    for (uint32_t i = 0; lb->chunks && i < lb->nchunks; i++) {
        for (uint32_t k = 0; k < VRPC_LB_CHUNK; k++)
            pthread_mutex_destroy(&lb->chunks[i][k].mu);
        free(lb->chunks[i]);
    }
    free(lb->chunks);
}

int vrpc_lb_cancel(struct vrpc_lb *lb, uint64_t id)
{
    uint32_t idx = (uint32_t)id & ~LB_ID_BIT, gen = (uint32_t)(id >> 32);
    if (!((uint32_t)id & LB_ID_BIT) || idx / VRPC_LB_CHUNK >= __atomic_load_n(&lb->nchunks, __ATOMIC_ACQUIRE))
        return -ENOENT;
    struct lb_call *c = &__atomic_load_n(&lb->chunks[idx / VRPC_LB_CHUNK], __ATOMIC_ACQUIRE)[idx % VRPC_LB_CHUNK];
    int rc = -ENOENT;
    pthread_mutex_lock(&c->mu);
    if (c->gen == gen && !c->cancelled && __atomic_load_n(&c->refs, __ATOMIC_ACQUIRE)) {
        c->cancelled = true;
        rc = 0;
        uint64_t iid = __atomic_load_n(&c->inner_id, __ATOMIC_ACQUIRE);
        if (c->ach && iid)
            vrpc_channel_cancel(c->ach, iid); /* its callback follows on a worker */
    }
    pthread_mutex_unlock(&c->mu);
    if (rc == 0)
        vrpc_lb_kick(lb); /* a delayed one ends now */
    return rc;
}

/* ---- retry decisions --------------------------------------------------------------- */

static const struct vrpc_retry_policy *policy_of(const struct vrpc_lb *lb, const struct vrpc_method_desc *m)
{
    for (size_t i = 0; i < lb->o.n_retry; i++)
        if (strcmp(lb->retry[i].method, m->full_name) == 0)
            return &lb->retry[i];
    return lb->retry_any;
}

/* The server did not process the attempt (VRPC_STATUS_UNPROCESSED: the
 * channel never sent it, or the server refused it unread and said so with
 * VRPC_FF_REFUSED): a transparent retry, whatever the method. A cancel or
 * the deadline ends the call all the same. */
static bool unprocessed(const struct vrpc_status *st)
{
    return (st->flags & VRPC_STATUS_UNPROCESSED) && st->code != VRPC_CANCELLED && st->code != VRPC_DEADLINE_EXCEEDED;
}

static void budget_success(struct vrpc_lb *lb)
{
    int64_t max = (int64_t)lb->o.retry_max_tokens * 1000;
    if (__atomic_load_n(&lb->tokens_milli, __ATOMIC_RELAXED) >= max)
        return;
    if (__atomic_add_fetch(&lb->tokens_milli, lb->o.retry_token_ratio_milli, __ATOMIC_RELAXED) > max)
        __atomic_store_n(&lb->tokens_milli, max, __ATOMIC_RELAXED);
}

/* A failed attempt: take a token; true if retries are still allowed. */
static bool budget_fail(struct vrpc_lb *lb)
{
    int64_t t = __atomic_sub_fetch(&lb->tokens_milli, 1000, __ATOMIC_RELAXED);
    if (t < 0)
        __atomic_store_n(&lb->tokens_milli, 0, __ATOMIC_RELAXED);
    return t > (int64_t)lb->o.retry_max_tokens * 500;
}

/* Whether an attempt that ended with st is retried, and after how long
 * (*delay_ns). can_resend: the request is still at hand. */
static bool retry_decide(struct vrpc_lb *lb, const struct vrpc_retry_policy *pol, const struct vrpc_status *st,
                         struct lb_try *tr, int64_t deadline, bool can_resend, int64_t *delay_ns)
{
    *delay_ns = 0;
    if (st->code == VRPC_OK || __atomic_load_n(&lb->parent->state, __ATOMIC_ACQUIRE) == VRPC_CHANNEL_SHUTDOWN ||
        !can_resend || (deadline != VRPC_NO_DEADLINE && vrpc_now_ns() >= deadline))
        return false;
    if (unprocessed(st)) {
        if (tr->transparent >= LB_MAX_TRANSPARENT)
            return false;
        tr->transparent++;
        return true;
    }
    if (!pol || !(pol->retryable_codes & VRPC_CODE_BIT(st->code)))
        return false;
    bool allowed = budget_fail(lb); /* every retryable failure counts, as in gRPC */
    if (!pol->idempotent || tr->attempts - tr->transparent >= pol->max_attempts || !allowed)
        return false;
    if (!tr->bound_ms)
        tr->bound_ms = pol->initial_backoff_ms;
    *delay_ns = (int64_t)(vrpc_lb_rand() % (tr->bound_ms * 1000000 + 1));
    tr->bound_ms = tr->bound_ms * pol->backoff_multiplier_pct / 100;
    if (tr->bound_ms > pol->max_backoff_ms)
        tr->bound_ms = pol->max_backoff_ms;
    if (deadline != VRPC_NO_DEADLINE && vrpc_now_ns() + *delay_ns >= deadline)
        return false;
    return true;
}

static int64_t lb_deadline(const struct vrpc_lb *lb, const struct vrpc_call_opts *o)
{
    int64_t t = o ? o->timeout_us : 0;
    if (t == 0)
        t = lb->o.default_timeout_us;
    return t <= 0 ? VRPC_NO_DEADLINE : vrpc_now_ns() + t * 1000;
}

/* The attempt's options: the caller's, with what is left of the deadline. */
static bool attempt_opts(const struct vrpc_call_opts *o, int64_t deadline, uint64_t *id, struct vrpc_call_opts *io)
{
    if (o)
        *io = *o;
    else
        memset(io, 0, sizeof(*io));
    io->call_id = id;
    io->peer = NULL;
    if (deadline == VRPC_NO_DEADLINE) {
        io->timeout_us = VRPC_NO_TIMEOUT;
        return true;
    }
    int64_t left = (deadline - vrpc_now_ns()) / 1000;
    io->timeout_us = left > 0 ? left : 1;
    return left > 0;
}

static void copy_peer(const struct vrpc_call_opts *o, const char *uri)
{
    if (o && o->peer && o->peer_cap)
        snprintf(o->peer, o->peer_cap, "%s", uri);
}

static void sleep_ns(int64_t ns)
{
    if (ns > 0) {
        struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
        nanosleep(&ts, NULL);
    }
}

static void no_server(const struct vrpc_lb *lb, struct vrpc_status *st)
{
    vrpc_status_set(st, VRPC_UNAVAILABLE, "no server known for %s", lb->target);
}

/* ---- synchronous calls ---------------------------------------------------------------- */

/* One attempt of a synchronous call on a subchannel from
 * vrpc_lb_attempt_get, which it ends (the caller no longer touches sub). */
static int sync_attempt(struct vrpc_lb *lb, struct vrpc_subch *sub, struct lb_call *c, bool first,
                        const struct vrpc_method_desc *m, const ProtobufCMessage *req, ProtobufCMessage **resp,
                        const struct vrpc_call_opts *o, int64_t deadline, struct vrpc_status *st)
{
    struct vrpc_channel *ch = vrpc_lb_sub_channel(sub);
    struct vrpc_call_opts io, *iop = NULL;
    copy_peer(o, sub->uri);
    /* the first attempt of a call without options: the channel's own
     * default deadline is the same as ours */
    if ((o || c || !first) && !attempt_opts(o, deadline, c ? &c->inner_id : NULL, iop = &io)) {
        vrpc_lb_attempt_drop(sub);
        vrpc_status_set(st, VRPC_DEADLINE_EXCEEDED, "deadline exceeded");
        return VRPC_DEADLINE_EXCEEDED;
    }
    if (c) {
        pthread_mutex_lock(&c->mu);
        bool x = c->cancelled;
        c->ach = ch;
        __atomic_store_n(&c->inner_id, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&c->mu);
        if (x) {
            vrpc_lb_attempt_drop(sub);
            vrpc_status_set(st, VRPC_CANCELLED, "cancelled by the client");
            return VRPC_CANCELLED;
        }
    }
    int code = vrpc_call(ch, m, req, resp, iop, st);
    vrpc_lb_attempt_end(lb, sub, code);
    if (c) {
        pthread_mutex_lock(&c->mu);
        c->ach = NULL;
        pthread_mutex_unlock(&c->mu);
    }
    return code;
}

/* The attempts of a synchronous call from tr (tr.attempts made so far, the
 * last ending with code), until one succeeds or no retry is left. */
static __attribute__((noinline)) int sync_call(struct vrpc_lb *lb, const struct vrpc_method_desc *m,
                                               const ProtobufCMessage *req, ProtobufCMessage **resp,
                                               const struct vrpc_call_opts *o, struct vrpc_status *st,
                                               const struct vrpc_retry_policy *pol, int64_t deadline, bool has_key,
                                               uint64_t key, struct lb_call *c, struct lb_try tr, int code)
{
    for (;;) {
        if (tr.attempts) { /* the last attempt ended with code */
            if (code == VRPC_OK)
                break;
            int64_t delay;
            bool cancelled = false;
            if (c) {
                pthread_mutex_lock(&c->mu);
                cancelled = c->cancelled;
                pthread_mutex_unlock(&c->mu);
            }
            if (code == VRPC_CANCELLED || cancelled || !retry_decide(lb, pol, st, &tr, deadline, true, &delay))
                break;
            sleep_ns(delay);
        }
        struct vrpc_subch *sub = vrpc_lb_attempt_get(lb, has_key, key);
        if (!sub) {
            no_server(lb, st);
            code = VRPC_UNAVAILABLE;
            break;
        }
        tr.attempts++;
        code = sync_attempt(lb, sub, c, tr.attempts == 1, m, req, resp, o, deadline, st);
    }
    if (code == VRPC_OK && pol)
        budget_success(lb);
    if (c)
        call_put(lb, c);
    return code;
}

/* Everything but vrpc_lb_call's common case: options, no status, a failed
 * first attempt (then first_code is its code and tr.attempts 1). */
static __attribute__((noinline)) int lb_call_slow(struct vrpc_lb *lb, const struct vrpc_method_desc *m,
                                                  const ProtobufCMessage *req, ProtobufCMessage **resp,
                                                  const struct vrpc_call_opts *o, struct vrpc_status *st)
{
    const struct vrpc_retry_policy *pol = lb->o.n_retry ? policy_of(lb, m) : NULL;
    int64_t deadline = lb_deadline(lb, o);
    struct vrpc_status local;
    if (!st)
        st = &local;
    uint64_t key;
    bool has_key = vrpc_lb_call_key(o, &key);
    struct lb_call *c = NULL;
    if (o && o->call_id) {
        if (!(c = call_get(lb))) {
            vrpc_status_set(st, VRPC_RESOURCE_EXHAUSTED, "too many calls on the channel");
            return VRPC_RESOURCE_EXHAUSTED;
        }
        __atomic_store_n(o->call_id, call_id(c), __ATOMIC_RELEASE);
    }
    copy_peer(o, "");
    return sync_call(lb, m, req, resp, o, st, pol, deadline, has_key, key, c, (struct lb_try){0}, 0);
}

/* What a call without options needs only if its first attempt fails: kept
 * in the frame, not in registers saved across the attempt. */
struct lb_first {
    const struct vrpc_method_desc *m;
    const ProtobufCMessage *req;
    ProtobufCMessage **resp;
    struct vrpc_status *st;
    int64_t deadline; /* set only with a default timeout (lb->o.default_timeout_us > 0) */
};

/* The first attempt of a call without options (f) failed with code on sub:
 * its end, then the retries as sync_call's (the deadline counts from the
 * call's start: the first attempt had the channel's default timeout on its
 * own). */
static __attribute__((noinline, cold)) int lb_call_retry(struct vrpc_lb *lb, struct vrpc_subch *sub,
                                                         const struct lb_first *f, int code)
{
    vrpc_lb_attempt_end(lb, sub, code);
    const struct vrpc_retry_policy *pol = lb->o.n_retry ? policy_of(lb, f->m) : NULL;
    int64_t deadline = lb->o.default_timeout_us > 0 ? f->deadline : VRPC_NO_DEADLINE;
    return sync_call(lb, f->m, f->req, f->resp, NULL, f->st, pol, deadline, false, 0, NULL,
                     (struct lb_try){.attempts = 1}, code);
}

/* The first attempt of a call without options succeeded on sub (counted
 * in calls) and there is more to do than end it: the outcome's slow part
 * (vrpc_lb_ok_work), the retry budget's share. */
static __attribute__((noinline)) int lb_call_ok_slow(struct vrpc_lb *lb, struct vrpc_subch *sub,
                                                     const struct vrpc_method_desc *m)
{
    if (vrpc_lb_ok_work(sub))
        vrpc_lb_outcome_slow(lb, sub, VRPC_OK);
    vrpc_lb_attempt_drop(sub);
    if (lb->o.n_retry && policy_of(lb, m))
        budget_success(lb);
    return VRPC_OK;
}

int vrpc_lb_call(struct vrpc_lb *lb, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                 ProtobufCMessage **resp, const struct vrpc_call_opts *o, struct vrpc_status *st)
{
    if (o || !st)
        return lb_call_slow(lb, m, req, resp, o, st);
    /* the common call, no options (no id, key nor peer): its first attempt
     * here, as sync_call's (sync_attempt without options); the deadline is
     * lb_deadline's, only read if there is one */
    struct lb_first f; /* deadline left unset without a default timeout: no store */
    f.m = m;
    f.req = req;
    f.resp = resp;
    f.st = st;
    if (lb->o.default_timeout_us > 0)
        f.deadline = lb_deadline(lb, NULL);
    /* f from the frame from here on: no register keeps a copy across the
     * calls (the pick's slow paths, the attempt), which would cost a save
     * and a restore each */
    __asm__("" : "+m"(f));
    struct vrpc_subch *sub = vrpc_lb_attempt_pick(lb, false, 0);
    if (__builtin_expect(!sub, 0))
        return lb_call_slow(lb, f.m, f.req, f.resp, NULL, f.st);
    struct vrpc_channel *ch = vrpc_lb_sub_channel(sub);
    __asm__("" : "+m"(f));
    int code = vrpc_ch_call(ch, f.m, f.req, f.resp, NULL, f.st);
    if (__builtin_expect(code != VRPC_OK, 0))
        return lb_call_retry(lb, sub, &f, code);
    /* vrpc_lb_attempt_end of a success, its rare parts out of line */
    __atomic_add_fetch(&sub->calls, 1, __ATOMIC_RELAXED);
    if (__builtin_expect(vrpc_lb_ok_work(sub) | lb->o.n_retry, 0))
        return lb_call_ok_slow(lb, sub, f.m);
    vrpc_lb_attempt_drop(sub);
    return VRPC_OK;
}

/* ---- asynchronous calls ------------------------------------------------------------------ */

static void attempt_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg);

/* The caller's callback, then the context goes back. */
static void finish(struct lb_call *c, const struct vrpc_status *st, const ProtobufCMessage *resp)
{
    struct vrpc_lb *lb = c->lb;
    if (st->code == VRPC_OK && c->pol)
        budget_success(lb);
    pthread_mutex_lock(&c->mu);
    c->cancelled = true; /* a cancel from now on finds nothing to do */
    pthread_mutex_unlock(&c->mu);
    copy_peer(&c->uo, c->peer);
    c->cb(st, resp, c->arg);
    call_put(lb, c);
}

static void finish_task(struct vrpc_task *t)
{
    struct lb_call *c = container_of(t, struct lb_call, task);
    finish(c, &c->st, NULL);
}

/* Fail the call on a worker (the caller's callback never runs on the
 * thread that started it, nor on the lb thread). */
static void finish_later(struct lb_call *c)
{
    vrpc_task_init(&c->task, finish_task);
    if (vrpc_sched_submit(c->lb->sched, &c->task))
        finish_task(&c->task);
}

/* Start the next attempt (any thread but inside no channel lock). Failures
 * that leave no attempt running complete the call (on a worker). */
/* Returns 0, or for the first attempt (first set) the channel's refusal
 * -EAGAIN (back-pressure) / -ESHUTDOWN: the caller's call is then not
 * accepted and nothing was completed. */
static int attempt_start(struct lb_call *c, const ProtobufCMessage *first)
{
    struct vrpc_lb *lb = c->lb;
    const ProtobufCMessage *req = first ? first : c->req, *copy = NULL;
    if (!req && c->packed)
        req = copy = protobuf_c_message_unpack(c->m->input, NULL, c->plen, c->packed);
    struct vrpc_subch *sub = req ? vrpc_lb_attempt_get(lb, c->has_key, c->key) : NULL;
    struct vrpc_call_opts io;
    if (!sub) {
        if (req)
            no_server(lb, &c->st);
        else
            vrpc_status_set(&c->st, VRPC_RESOURCE_EXHAUSTED, "out of memory for a retry");
        goto fail;
    }
    if (!attempt_opts(&c->uo, c->deadline, &c->inner_id, &io)) {
        vrpc_lb_attempt_drop(sub);
        vrpc_status_set(&c->st, VRPC_DEADLINE_EXCEEDED, "deadline exceeded");
        goto fail;
    }
    if (!first && !c->req) { /* the caller's metadata only while req is held */
        io.md_count = 0;
        io.md = NULL;
    }
    struct vrpc_channel *ch = vrpc_lb_sub_channel(sub);
    c->sub = sub;
    c->tr.attempts++;
    snprintf(c->peer, sizeof c->peer, "%s", sub->uri);
    pthread_mutex_lock(&c->mu);
    c->ach = ch;
    __atomic_store_n(&c->inner_id, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->mu);
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED); /* ours, until the cancel check below */
    int rc = vrpc_call_async(ch, c->m, req, &io, attempt_cb, c);
    if (copy)
        protobuf_c_message_free_unpacked((ProtobufCMessage *)copy, NULL);
    if (rc) { /* not accepted: the callback will not run */
        c->sub = NULL;
        vrpc_lb_attempt_drop(sub);
        call_put(lb, c);
        if (first && (rc == -EAGAIN || rc == -ESHUTDOWN))
            return rc; /* as a plain channel's: the caller retries later */
        vrpc_status_set_unprocessed(&c->st, rc == -EAGAIN ? VRPC_RESOURCE_EXHAUSTED : VRPC_UNAVAILABLE,
                                    "attempt refused: %s", strerror(-rc));
        finish_later(c);
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    uint64_t iid = __atomic_load_n(&c->inner_id, __ATOMIC_ACQUIRE);
    if (c->cancelled && c->ach == ch && iid)
        vrpc_channel_cancel(ch, iid);
    pthread_mutex_unlock(&c->mu);
    call_put(lb, c);
    return 0;
fail:
    if (copy)
        protobuf_c_message_free_unpacked((ProtobufCMessage *)copy, NULL);
    finish_later(c);
    return 0;
}

static void delay_call(struct lb_call *c, int64_t delay)
{
    struct vrpc_lb *lb = c->lb;
    c->due = vrpc_now_ns() + delay;
    pthread_mutex_lock(&lb->mu);
    c->next = lb->delayed;
    lb->delayed = c;
    lb->kick = true;
    pthread_cond_signal(&lb->cond);
    pthread_mutex_unlock(&lb->mu);
}

/* An attempt's outcome (on a worker). */
static void attempt_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct lb_call *c = arg;
    struct vrpc_lb *lb = c->lb;
    struct vrpc_subch *sub = c->sub;
    pthread_mutex_lock(&c->mu);
    c->ach = NULL;
    bool cancelled = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    c->sub = NULL;
    vrpc_lb_attempt_end(lb, sub, st->code);
    int64_t delay;
    if (!cancelled && retry_decide(lb, c->pol, st, &c->tr, c->deadline, c->req || c->packed, &delay)) {
        if (delay > 0)
            delay_call(c, delay);
        else
            attempt_start(c, NULL);
        return;
    }
    finish(c, st, resp);
}

/* A copy of the request for retries: the caller's own if it stays valid
 * (VRPC_CALL_REQ_HELD), else packed (inline when small; a larger one only
 * for a method with a retry policy). */
static void keep_request(struct lb_call *c, const ProtobufCMessage *req)
{
    if (c->uo.flags & VRPC_CALL_REQ_HELD)
        return;
    if (c->uo.md_count)
        return; /* its metadata would be gone */
    size_t n = protobuf_c_message_get_packed_size(req);
    if (n <= LB_INLINE)
        c->packed = c->inl;
    else if (!c->pol || !(c->packed = malloc(n)))
        return;
    c->plen = protobuf_c_message_pack(req, c->packed);
}

int vrpc_lb_call_async(struct vrpc_lb *lb, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                       const struct vrpc_call_opts *o, vrpc_call_cb cb, void *arg)
{
    if (__atomic_load_n(&lb->parent->state, __ATOMIC_ACQUIRE) == VRPC_CHANNEL_SHUTDOWN)
        return -ESHUTDOWN;
    struct lb_call *c = call_get(lb);
    if (!c)
        return -EAGAIN;
    c->m = m;
    c->pol = lb->o.n_retry ? policy_of(lb, m) : NULL;
    /* the caller's request only for the first attempt, unless held */
    c->req = o && (o->flags & VRPC_CALL_REQ_HELD) ? req : NULL;
    if (o)
        c->uo = *o;
    else
        memset(&c->uo, 0, sizeof(c->uo));
    c->has_key = vrpc_lb_call_key(o, &c->key);
    c->uo.hash_key = NULL;
    c->deadline = lb_deadline(lb, o);
    c->cb = cb;
    c->arg = arg;
    c->peer[0] = 0;
    keep_request(c, req);
    if (o && o->call_id)
        __atomic_store_n(o->call_id, call_id(c), __ATOMIC_RELEASE);
    int rc = attempt_start(c, req);
    if (rc)
        call_put(lb, c); /* not accepted: the callback never runs */
    return rc;
}

/* ---- the lb thread's part ----------------------------------------------------------------- */

int64_t vrpc_lb_run_delayed(struct vrpc_lb *lb, int64_t now, bool all)
{
    struct lb_call *due = NULL, **pp;
    int64_t next = INT64_MAX;
    pthread_mutex_lock(&lb->mu);
    for (pp = &lb->delayed; *pp;) {
        struct lb_call *c = *pp;
        if (all || c->cancelled || c->due <= now) {
            *pp = c->next;
            c->next = due;
            due = c;
        } else {
            if (c->due < next)
                next = c->due;
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&lb->mu);
    while (due) {
        struct lb_call *c = due;
        due = c->next;
        if (all || c->cancelled) {
            vrpc_status_set(&c->st, VRPC_CANCELLED, all ? "channel destroyed" : "cancelled by the client");
            finish_later(c);
        } else {
            attempt_start(c, NULL);
        }
    }
    return next;
}
