/* The fault layer's completion queue: drives the CQ below from the core's
 * poller thread (the CQ below has no thread of its own), rewrites its
 * completions onto the layer's endpoints and injects completion faults,
 * stalls, and held-back receive buffers (credit starvation). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport/fault/fault.h"

static struct fault_cq *fcq(struct vrpc_cq *cq) { return container_of(cq, struct fault_cq, base); }

int fault_cq_create(struct vrpc_transport *tp, const struct vrpc_cq_attr *attr, struct vrpc_cq **out)
{
    struct fault_tp *t = fault_tp_of(tp);
    struct fault_cq *q = calloc(1, sizeof *q);
    struct vrpc_cq *lower;
    pthread_condattr_t ca;
    int rc;

    if (!q)
        return -ENOMEM;
    /* what vrpc_cq_create does, without starting a poller: ours polls it */
    rc = t->lower->ops->cq_create(t->lower, attr, &lower);
    if (rc) {
        free(q);
        return rc;
    }
    lower->tp = t->lower;
    lower->attr = *attr;
    atomic_init(&lower->stopping, false);
    lower->thread_started = false;
    lower->wc = NULL;
    q->lower = lower;
    uint64_t i = atomic_fetch_add(&t->next_cq, 1);
    fault_rng_seed(&q->rng, t->spec.seed, t->index, (UINT64_MAX - 1) - 2 * i);
    fault_rng_seed(&q->rng_post, t->spec.seed, t->index, (UINT64_MAX - 2) - 2 * i);
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    q->held_tail = &q->held;
    q->dq_cap = 4096; /* beyond it nothing more is deferred */
    if (!(q->dq = calloc(q->dq_cap, sizeof *q->dq))) {
        fault_cq_destroy(&q->base);
        return -ENOMEM;
    }
    *out = &q->base;
    return 0;
}

void fault_cq_destroy(struct vrpc_cq *cq)
{
    struct fault_cq *q = fcq(cq);
    /* the poller has flushed both (or never started: nothing was posted) */
    q->lower->tp->ops->cq_destroy(q->lower);
    free(q->dq);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

/* Poller: post the held-back receive buffers whose time has come (all with
 * all). Returns the next due time, or 0 when none is held. */
static uint64_t release_held(struct fault_cq *q, uint64_t now, bool all)
{
    struct fault_tp *t = fault_tp_of(q->base.tp);
    struct vrpc_buf *ready = NULL, **tail = &ready;
    uint64_t next = 0;

    pthread_mutex_lock(&q->mu);
    while (q->held && (all || q->held->priv[1] <= now)) {
        struct vrpc_buf *b = q->held;
        q->held = b->next;
        *tail = b;
        tail = &b->next;
    }
    if (!q->held) {
        q->held_tail = &q->held;
        atomic_store_explicit(&q->nheld, 0, memory_order_relaxed);
    } else {
        next = q->held->priv[1];
    }
    *tail = NULL;
    pthread_mutex_unlock(&q->mu);
    while (ready) {
        struct vrpc_buf *b = ready;
        uint64_t wr_id = b->priv[0];
        ready = b->next;
        if (t->lower->ops->post_recv(q->lower, &b, &wr_id, 1)) {
            /* only at shutdown: it completes as flushed (cq_flush) */
            pthread_mutex_lock(&q->mu);
            b->next = NULL;
            *q->held_tail = b;
            q->held_tail = &b->next;
            atomic_fetch_add_explicit(&q->nheld, 1, memory_order_relaxed);
            pthread_mutex_unlock(&q->mu);
        }
    }
    return next;
}

int fault_post_recv(struct vrpc_cq *cq, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n)
{
    struct fault_cq *q = fcq(cq);
    struct fault_tp *t = fault_tp_of(cq->tp);
    uint64_t due;
    int rc;

    pthread_mutex_lock(&q->mu);
    if (!q->flushing && !atomic_load_explicit(&cq->stopping, memory_order_acquire) &&
        fault_rng_hit(&q->rng_post, FAULT_P(t, starve))) {
        due = vrpc_tp_now_ns() + (uint64_t)fault_rng_upto(&q->rng_post, t->spec.starve_us) * 1000u;
        /* keep due order: a later hold may end earlier, it waits behind */
        if (q->held && due < (uint64_t)container_of(q->held_tail, struct vrpc_buf, next)->priv[1])
            due = container_of(q->held_tail, struct vrpc_buf, next)->priv[1];
        for (unsigned i = 0; i < n; i++) {
            bufs[i]->priv[0] = wr_ids ? wr_ids[i] : 0;
            bufs[i]->priv[1] = due;
            bufs[i]->next = NULL;
            *q->held_tail = bufs[i];
            q->held_tail = &bufs[i]->next;
        }
        atomic_fetch_add(&t->bufs_out, n);
        atomic_fetch_add_explicit(&q->nheld, 1, memory_order_relaxed);
        pthread_mutex_unlock(&q->mu);
        fault_count(t, VRPC_FAULT_RECV_HELD);
        fault_cq_kick(cq); /* the poller's wait must end by the due time */
        return 0;
    }
    pthread_mutex_unlock(&q->mu);
    rc = t->lower->ops->post_recv(q->lower, bufs, wr_ids, n);
    if (!rc)
        atomic_fetch_add(&t->bufs_out, n);
    return rc;
}

/* Poller: a receive buffer that must not reach the layer above goes back
 * below; false (swallow it) unless the CQ is going down, where it is handed
 * up as flushed. */
static bool repost(struct fault_cq *q, struct fault_tp *t, struct vrpc_wc *w)
{
    if (t->lower->ops->post_recv(q->lower, &w->buf, &w->wr_id, 1) == 0)
        return false;
    /* the CQ is going down: hand it up as flushed */
    atomic_fetch_sub(&t->bufs_out, 1);
    w->ep = NULL;
    w->status = -ECANCELED;
    w->byte_len = w->imm = 0;
    return true;
}

/* Poller: an ACCEPTED from below: wrap the new endpoint x (or close it),
 * and draw whether the accept is dropped. */
static bool rewrite_accepted(struct fault_cq *q, struct fault_tp *t, struct vrpc_wc *w)
{
    struct vrpc_ep *x = w->ep;
    struct fault_ep *e = fault_ep_new(t, &q->base, NULL);

    if (!e) {
        vrpc_tp_log("fault: out of memory for an accepted connection; closed");
        vrpc_ep_set_user(x, NULL); /* its DISCONNECTED: user NULL, unref there */
        vrpc_ep_destroy(x);
        return false;
    }
    e->lower = x;
    e->base.eager = vrpc_ep_eager_size(x);
    fault_uri(e->base.peer_uri, x->peer_uri);
    vrpc_ep_set_user(x, e);
    if (fault_rng_hit(&e->rng_cpl, FAULT_P(t, accept))) {
        e->hidden = true;
        fault_count(t, VRPC_FAULT_ACCEPT_DROPPED);
        fault_ep_kill(e, -ECONNRESET);
        return false;
    }
    w->ep = &e->base;
    return true;
}

/* Poller: a RECV of e: dropped (reposted) when e is hidden or dead, else
 * handed up, with a loss drawn. */
static bool rewrite_recv(struct fault_cq *q, struct fault_tp *t, struct fault_ep *e, struct vrpc_wc *w)
{
    if (e->hidden || atomic_load(&e->dead)) {
        fault_count(t, VRPC_FAULT_RECV_DROPPED);
        return repost(q, t, w);
    }
    atomic_fetch_sub(&t->bufs_out, 1);
    if (fault_rng_hit(&e->rng_cpl, FAULT_P(t, loss))) {
        fault_count(t, VRPC_FAULT_LOSS_RECV);
        fault_ep_kill(e, -ECONNRESET);
    }
    return true;
}

/* Poller: a READ of e, failed when e died meanwhile or when an error is
 * drawn. */
static bool rewrite_read(struct fault_tp *t, struct fault_ep *e, struct vrpc_wc *w)
{
    atomic_fetch_sub(&t->bufs_out, 1);
    atomic_fetch_sub(&e->inflight, 1);
    if (!w->status && atomic_load(&e->dead)) {
        w->status = -ECANCELED; /* cut off by the loss */
    } else if (!w->status && fault_rng_hit(&e->rng_cpl, FAULT_P(t, read_err))) {
        fault_count(t, VRPC_FAULT_READ_ERROR);
        w->status = fault_rng_next(&e->rng_cpl) & 1 ? -EACCES : -ETIMEDOUT;
        fault_ep_kill(e, w->status);
    }
    if (w->status)
        w->byte_len = w->imm = 0;
    return !e->hidden;
}

/* Poller: the DISCONNECTED of e (x below): checks nothing is in flight,
 * gives the status of e's death, drops the lower reference, and frees a
 * hidden e. */
static bool rewrite_disconnected(struct fault_tp *t, struct fault_ep *e, struct vrpc_ep *x, struct vrpc_wc *w)
{
    int dead = atomic_load(&e->dead);
    /* inflight counts operations once accepted below, and the poller
     * runs their completions: above 0 here, one of them comes after the
     * DISCONNECTED (below 0 for a moment is an acceptance not yet
     * counted by its caller) */
    if (atomic_load(&e->inflight) > 0) {
        char what[96];
        snprintf(what, sizeof what, "DISCONNECTED with %d operations in flight (below: %s)", atomic_load(&e->inflight),
                 t->lower->name);
        fault_check_failed(t, VRPC_FAULT_BAD_DISCONNECT, what);
    }
    if (dead)
        w->status = dead;
    vrpc_ep_unref(x); /* the lower transport's reference; ours stays with e */
    if (e->hidden) {
        vrpc_ep_unref(&e->base); /* the user's, as if destroyed */
        vrpc_ep_unref(&e->base); /* the transport's: frees e, which destroys x */
        return false;
    }
    return true;
}

/* Poller: one completion from below, rewritten in place for the layer above.
 * false: swallow it. */
static bool rewrite(struct fault_cq *q, struct vrpc_wc *w)
{
    struct fault_tp *t = fault_tp_of(q->base.tp);
    struct vrpc_ep *x = w->ep;
    struct fault_ep *e;

    if (w->opcode == VRPC_WC_RECV && !x) { /* flushed by the CQ's destroy */
        atomic_fetch_sub(&t->bufs_out, 1);
        return true;
    }
    if (w->opcode == VRPC_WC_ACCEPTED)
        return rewrite_accepted(q, t, w);
    e = vrpc_ep_user(x);
    if (!e) { /* an accepted connection we could not wrap */
        if (w->opcode == VRPC_WC_DISCONNECTED)
            vrpc_ep_unref(x);
        else if (w->opcode == VRPC_WC_RECV)
            return repost(q, t, w);
        return false;
    }
    w->ep = &e->base;
    switch (w->opcode) {
    case VRPC_WC_RECV:
        return rewrite_recv(q, t, e, w);
    case VRPC_WC_SEND:
        atomic_fetch_sub(&t->bufs_out, 1);
        atomic_fetch_sub(&e->inflight, 1);
        if (!w->status && fault_rng_hit(&e->rng_cpl, FAULT_P(t, send_err))) {
            fault_count(t, VRPC_FAULT_SEND_ERROR);
            w->status = -ECANCELED;
            fault_ep_kill(e, -ECONNRESET);
        }
        return !e->hidden;
    case VRPC_WC_READ:
        return rewrite_read(t, e, w);
    case VRPC_WC_REVOKE:
        atomic_fetch_sub(&e->inflight, 1);
        return !e->hidden;
    case VRPC_WC_DISCONNECTED:
        return rewrite_disconnected(t, e, x, w);
    default:
        return true;
    }
}

/* Poller: defer w (a rewritten completion of a reported endpoint) when it
 * is drawn to be, or when earlier completions of its endpoint are deferred
 * (their order, and DISCONNECTED last, stay). true: it went to the ring. */
static bool defer(struct fault_cq *q, const struct vrpc_wc *w, uint64_t now)
{
    struct fault_tp *t = fault_tp_of(q->base.tp);
    struct fault_ep *e;
    uint64_t due;

    if (!w->ep || w->opcode == VRPC_WC_RECV || w->opcode == VRPC_WC_ACCEPTED || q->flushing)
        return false;
    e = container_of(w->ep, struct fault_ep, base);
    if (!e->ndeferred) {
        if (w->opcode == VRPC_WC_DISCONNECTED || q->dq_len == q->dq_cap ||
            !fault_rng_hit(&q->rng, FAULT_P(t, cpl_delay)))
            return false;
        fault_count(t, VRPC_FAULT_CPL_DEFERRED);
        due = now + (uint64_t)fault_rng_upto(&q->rng, t->spec.cpl_delay_us) * 1000u;
    } else if (q->dq_len == q->dq_cap) {
        /* full: behind its own it must go, so the ring grows */
        struct fault_deferred *n = calloc(2 * q->dq_cap, sizeof *n);
        if (!n)
            abort(); /* test machinery: cannot keep the order otherwise */
        for (unsigned i = 0; i < q->dq_len; i++)
            n[i] = q->dq[(q->dq_head + i) % q->dq_cap];
        free(q->dq);
        q->dq = n;
        q->dq_head = 0;
        q->dq_cap *= 2;
        due = now;
    } else {
        due = now;
    }
    /* the ring stays in due order: nothing leaves before what is ahead */
    if (q->dq_len) {
        uint64_t last = q->dq[(q->dq_head + q->dq_len - 1) % q->dq_cap].due_ns;
        if (due < last)
            due = last;
    }
    q->dq[(q->dq_head + q->dq_len) % q->dq_cap] = (struct fault_deferred){*w, due};
    q->dq_len++;
    e->ndeferred++;
    return true;
}

/* Poller: deferred completions due by now (all while flushing) into wc. */
static unsigned release_deferred(struct fault_cq *q, struct vrpc_wc *wc, unsigned max, uint64_t now)
{
    unsigned k = 0;
    while (q->dq_len && k < max && (q->flushing || q->dq[q->dq_head].due_ns <= now)) {
        wc[k] = q->dq[q->dq_head].wc;
        container_of(wc[k].ep, struct fault_ep, base)->ndeferred--;
        k++;
        q->dq_head = (q->dq_head + 1) % q->dq_cap;
        q->dq_len--;
    }
    return k;
}

int fault_cq_poll(struct vrpc_cq *cq, struct vrpc_wc *wc, unsigned max)
{
    struct fault_cq *q = fcq(cq);
    struct fault_tp *t = fault_tp_of(cq->tp);
    uint64_t now = vrpc_tp_now_ns();
    int n, k = 0;

    if (q->flushing) {
        if ((k = (int)release_deferred(q, wc, max, now)) > 0)
            return k;
        n = t->lower->ops->cq_poll(q->lower, wc, max);
        for (int i = 0; i < n; i++)
            if (rewrite(q, &wc[i]))
                wc[k++] = wc[i];
        if (n > 0)
            return k ? k : fault_cq_poll(cq, wc, max);
        /* below is drained: the held-back buffers complete as flushed */
        pthread_mutex_lock(&q->mu);
        while (q->held && (unsigned)k < max) {
            struct vrpc_buf *b = q->held;
            q->held = b->next;
            memset(&wc[k], 0, sizeof wc[k]);
            wc[k].wr_id = b->priv[0];
            wc[k].buf = b;
            b->len = 0;
            wc[k].opcode = VRPC_WC_RECV;
            wc[k].status = -ECANCELED;
            k++;
        }
        if (!q->held) {
            q->held_tail = &q->held;
            atomic_store_explicit(&q->nheld, 0, memory_order_relaxed);
        }
        pthread_mutex_unlock(&q->mu);
        atomic_fetch_sub(&t->bufs_out, k);
        return k;
    }
    if (atomic_load_explicit(&q->nheld, memory_order_relaxed))
        release_held(q, now, false);
    if (now < q->stall_until_ns)
        return 0;
    k = (int)release_deferred(q, wc, max, now);
    if ((unsigned)k == max)
        return k;
    n = t->lower->ops->cq_poll(q->lower, wc + k, max - (unsigned)k);
    for (int i = k, end = k + n; i < end; i++)
        if (rewrite(q, &wc[i]) && !defer(q, &wc[i], now))
            wc[k++] = wc[i];
    if (n > 0 && fault_rng_hit(&q->rng, FAULT_P(t, delay))) {
        q->stall_until_ns = now + (uint64_t)fault_rng_upto(&q->rng, t->spec.delay_us) * 1000u;
        fault_count(t, VRPC_FAULT_CQ_STALL);
    }
    return k;
}

void fault_cq_arm(struct vrpc_cq *cq)
{
    struct fault_cq *q = fcq(cq);
    if (q->flushing || vrpc_tp_now_ns() < q->stall_until_ns)
        return;
    q->lower->tp->ops->cq_arm(q->lower);
    q->lower_armed = true;
}

void fault_cq_wait(struct vrpc_cq *cq, int timeout_ms)
{
    struct fault_cq *q = fcq(cq);
    uint64_t now = vrpc_tp_now_ns(), until = q->stall_until_ns, held;
    struct timespec ts;

    pthread_mutex_lock(&q->mu);
    held = q->held ? q->held->priv[1] : 0;
    pthread_mutex_unlock(&q->mu);
    if (q->dq_len && (!held || q->dq[q->dq_head].due_ns < held))
        held = q->dq[q->dq_head].due_ns; /* a deferred completion is due then */
    if (now < until || !q->lower_armed) {
        /* stalled (the CQ below is not armed): sleep on our own until the
         * stall ends or a kick; not stalled but unarmed: return, the core
         * polls, arms and waits again */
        if (now >= until)
            return;
        if (timeout_ms >= 0 && until > now + (uint64_t)timeout_ms * 1000000u)
            until = now + (uint64_t)timeout_ms * 1000000u;
        ts.tv_sec = (time_t)(until / 1000000000u);
        ts.tv_nsec = (long)(until % 1000000000u);
        pthread_mutex_lock(&q->mu);
        while (!q->kicked && vrpc_tp_now_ns() < until)
            if (pthread_cond_timedwait(&q->cv, &q->mu, &ts))
                break;
        q->kicked = false;
        pthread_mutex_unlock(&q->mu);
        return;
    }
    if (held) { /* wake for the next held-back buffer or deferred completion */
        int ms = held > now ? (int)((held - now + 999999) / 1000000) : 0;
        if (timeout_ms < 0 || ms < timeout_ms)
            timeout_ms = ms;
    }
    q->lower_armed = false;
    if (timeout_ms == 0)
        return;
    q->lower->tp->ops->cq_wait(q->lower, timeout_ms);
    pthread_mutex_lock(&q->mu);
    q->kicked = false;
    pthread_mutex_unlock(&q->mu);
}

void fault_cq_kick(struct vrpc_cq *cq)
{
    struct fault_cq *q = fcq(cq);
    pthread_mutex_lock(&q->mu);
    q->kicked = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    q->lower->tp->ops->cq_kick(q->lower);
}

void fault_cq_flush(struct vrpc_cq *cq)
{
    struct fault_cq *q = fcq(cq);
    pthread_mutex_lock(&q->mu);
    q->flushing = true;
    pthread_mutex_unlock(&q->mu);
    q->stall_until_ns = 0;
    release_held(q, 0, true); /* what the CQ below still takes, it flushes */
    atomic_store_explicit(&q->lower->stopping, true, memory_order_release);
    q->lower->tp->ops->cq_flush(q->lower);
}
