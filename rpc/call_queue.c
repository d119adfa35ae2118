/* The client's async backlog: calls that found every slot taken wait here,
 * packed in a send buffer, and go out in order as slots free (the pump);
 * their ids, deadlines and cancels work while they wait and after they
 * were sent. */
#include <errno.h>
#include <stdlib.h>
#include "rpc/channel_internal.h"
#include "rpc/status.h"

/* ---- the async backlog ---------------------------------------------------- */

int vrpc_ch_queue_init(struct vrpc_channel *ch)
{
    ch->nqents = ch->o.max_queued + ch->o.max_outstanding;
    if (ch->nqents >= QID_BIT || !(ch->qents = calloc(ch->nqents, sizeof(*ch->qents))))
        return -ENOMEM;
    for (uint32_t i = ch->nqents; i-- > 0;) {
        ch->qents[i].ch = ch;
        ch->qents[i].qgen = 1;
        ch->qents[i].next = ch->qfree;
        ch->qfree = &ch->qents[i];
    }
    return 0;
}

static void queued_fail_task(struct vrpc_task *t)
{
    struct queued *e = container_of(t, struct queued, task);
    struct vrpc_channel *ch = e->ch;
    e->cb(&e->st, NULL, e->arg);
    vrpc_ch_queued_release(ch, e);
    /* last: the channel's destroy waits for this before freeing the entries */
    if (__atomic_sub_fetch(&ch->qtasks, 1, __ATOMIC_ACQ_REL) == 0)
        vrpc_futex_wake_all(&ch->qtasks);
}

/* The call of entry e is over: back to the free list, its id dead. */
void vrpc_ch_queued_release(struct vrpc_channel *ch, struct queued *e)
{
    pthread_mutex_lock(&ch->qlock);
    e->state = Q_FREE;
    e->qgen = e->qgen + 1 ? e->qgen + 1 : 1;
    e->next = ch->qfree;
    ch->qfree = e;
    pthread_mutex_unlock(&ch->qlock);
}

/* Fail an entry that has left the queue (FAILING): its callback runs on a
 * worker, then the entry is released. */
static void queued_fail(struct queued *e, enum vrpc_code code, const char *why)
{
    struct vrpc_channel *ch = e->ch;
    vrpc_pool_put(e->buf);
    e->buf = NULL;
    vrpc_status_set_unprocessed(&e->st, code, "%s", why); /* every queued call fails unsent */
    vrpc_task_init(&e->task, queued_fail_task);
    __atomic_add_fetch(&ch->qtasks, 1, __ATOMIC_RELAXED);
    if (vrpc_sched_submit(ch->sched, &e->task))
        queued_fail_task(&e->task); /* the scheduler is shutting down: run here rather than lose it */
}

/* Under qlock: take e out of the queue (it is QUEUED) into state st. */
static void queued_unlink_locked(struct vrpc_channel *ch, struct queued *e, uint8_t st)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
    e->next = e->prev = NULL;
    e->state = st;
    __atomic_sub_fetch(&ch->qlen, 1, __ATOMIC_RELAXED);
    if (e->deadline != VRPC_NO_DEADLINE)
        vrpc_timer_cancel(ch->wheel, &e->timer); /* if it is firing, it finds e no longer QUEUED */
}

static uint64_t queued_id(const struct vrpc_channel *ch, const struct queued *e)
{
    return (uint64_t)e->qgen << 32 | QID_BIT | (uint32_t)(e - ch->qents);
}

/* vrpc_channel_cancel for an id of a call that was queued. */
int vrpc_ch_cancel_queued(struct vrpc_channel *ch, uint64_t id)
{
    uint32_t idx = vrpc_wire_id_slot(id) & ~QID_BIT;
    if (idx >= ch->nqents)
        return -ENOENT;
    struct queued *e = &ch->qents[idx];
    pthread_mutex_lock(&ch->qlock);
    if (e->qgen != vrpc_wire_id_gen(id) || (e->state != Q_QUEUED && e->state != Q_LAUNCHED)) {
        pthread_mutex_unlock(&ch->qlock);
        return -ENOENT;
    }
    if (e->state == Q_LAUNCHED) {
        /* sent: its slot was opened before it became LAUNCHED, so the slot
         * id decides (a call completed since fails the generation check) */
        uint64_t sid = e->slot_id;
        pthread_mutex_unlock(&ch->qlock);
        return vrpc_channel_cancel(ch, sid);
    }
    queued_unlink_locked(ch, e, Q_FAILING);
    pthread_mutex_unlock(&ch->qlock);
    queued_fail(e, VRPC_CANCELLED, "cancelled by the client while queued for a slot (never sent)");
    return 0;
}

static void queued_expired(void *ctx, uint64_t qgen)
{
    struct queued *e = ctx;
    struct vrpc_channel *ch = e->ch;
    pthread_mutex_lock(&ch->qlock);
    if (e->state != Q_QUEUED || e->qgen != (uint32_t)qgen) {
        pthread_mutex_unlock(&ch->qlock);
        return;
    }
    queued_unlink_locked(ch, e, Q_FAILING);
    pthread_mutex_unlock(&ch->qlock);
    queued_fail(e, VRPC_DEADLINE_EXCEEDED, "deadline exceeded waiting for a call slot");
}

/* Under qlock: put queued call e on slot s of connection c (taking over the
 * caller's reference of c) and publish the slot, so that from here on e's id
 * cancels it through the slot. Returns the request id. */
static uint64_t launch_open_locked(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                                   struct queued *e)
{
    uint64_t id = vrpc_wire_make_id(s->index, vrpc_pending_gen(s));
    s->method = e->m;
    s->cb = e->cb;
    s->cb_on_poller = e->cb_on_poller;
    s->cb_arg = e->arg;
    s->cb_ch = ch;
    s->qent = e;
    s->resp_md = e->resp_md;
    s->deadline_ns = e->deadline;
    s->start_ns = vrpc_metrics_now_ns();
    s->out.zc = 0;
    conn_ref(c); /* ours while launch_queued sends: see call_open (rpc/call.c) */
    open_call(ch, s, id);
    e->state = Q_LAUNCHED;
    e->slot_id = id;
    return id;
}

/* Send the queued call opened on slot s (no lock held): as start_call's
 * eager path, never waiting. b holds the packed request. */
static void launch_queued(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s, struct vrpc_buf *b,
                          uint32_t mdsz, uint32_t plen, uint32_t method_id, uint64_t id, int64_t deadline)
{
    uint32_t gen = vrpc_wire_id_gen(id);
    check_expired(ch, deadline, id);
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_REQUEST,
                              .method_id = method_id,
                              .request_id = id,
                              .md_len = mdsz,
                              .payload_len = plen};
    if (deadline != VRPC_NO_DEADLINE) {
        int64_t left = deadline - vrpc_now_ns();
        h.flags = VRPC_FF_DEADLINE;
        h.budget_us = left > 0 ? (uint64_t)(left / 1000) : 0;
    }
    vrpc_wire_hdr_encode(b->data, &h);
    /* a queued call is async: drops launch_open_locked's reference of c */
    vrpc_ch_request_go(ch, c, s, gen, b, VRPC_WIRE_HDR_LEN + mdsz + plen, 0, VRPC_SEND_NOWAIT);
}

/* Send queued calls while slots are free, oldest first. Runs after every
 * enqueue and after every slot is freed (pending's on_free), on whatever
 * thread did that: both sides look at queue and slots under qlock after
 * their own change, so a queued call is never left behind a free slot. */
void vrpc_ch_pump(void *arg)
{
    struct vrpc_channel *ch = arg;
    /* Without the lock when nothing is queued (every call frees a slot): an
     * enqueuer counts its entry before its own pump tries for a slot, and a
     * slot freed after that try is freed before this load (both under the
     * table's lock), so the count is seen. */
    while (__atomic_load_n(&ch->qlen, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&ch->qlock);
        struct queued *e = ch->qhead.next;
        if (e == &ch->qhead || ch->qclosed) {
            pthread_mutex_unlock(&ch->qlock);
            return;
        }
        struct vrpc_conn *c;
        pthread_mutex_lock(&ch->conn_lock);
        c = ch->conn;
        if (c && !__atomic_load_n(&c->b.dead, __ATOMIC_ACQUIRE) && !__atomic_load_n(&c->b.goaway, __ATOMIC_ACQUIRE))
            conn_ref(c);
        else
            c = NULL;
        pthread_mutex_unlock(&ch->conn_lock);
        if (!c) {
            /* never connect here (this may be the poller): fail it */
            queued_unlink_locked(ch, e, Q_FAILING);
            pthread_mutex_unlock(&ch->qlock);
            queued_fail(e, VRPC_UNAVAILABLE, "connection lost while the call waited for a slot");
            continue;
        }
        if (e->mdsz + e->plen > c->b.max_payload) { /* a new connection with a lower limit */
            queued_unlink_locked(ch, e, Q_FAILING);
            pthread_mutex_unlock(&ch->qlock);
            conn_unref(c);
            queued_fail(e, VRPC_RESOURCE_EXHAUSTED, "request exceeds the server's limit");
            continue;
        }
        struct vrpc_pending_slot *s;
        if (vrpc_pending_try_alloc(ch->pend, c, &s)) {
            /* no slot (the next free will pump again) or closing (destroy
             * fails the queue) */
            pthread_mutex_unlock(&ch->qlock);
            conn_unref(c);
            return;
        }
        queued_unlink_locked(ch, e, Q_LAUNCHED);
        struct vrpc_buf *b = e->buf;
        uint32_t mdsz = e->mdsz, plen = e->plen, method_id = e->m->id;
        int64_t deadline = e->deadline;
        e->buf = NULL;
        /* opened under qlock: a cancel by e's id that finds it LAUNCHED
         * finds the slot INUSE (the entry is released with the call) */
        uint64_t id = launch_open_locked(ch, c, s, e);
        pthread_mutex_unlock(&ch->qlock);
        launch_queued(ch, c, s, b, mdsz, plen, method_id, id, deadline);
    }
}

/* Queue an async call for lack of a slot; b holds its packed request (mdsz +
 * plen bytes behind the header's room) and belongs to the queue on 0.
 * 0 (queued), -EAGAIN (the backlog is full), -ESHUTDOWN. */
static int enqueue(struct vrpc_channel *ch, struct vrpc_buf *b, uint32_t mdsz, uint32_t plen,
                   const struct vrpc_method_desc *m, const struct vrpc_call_opts *o, vrpc_call_cb cb, void *arg,
                   int64_t deadline)
{
    struct queued *e;
    pthread_mutex_lock(&ch->qlock);
    if (ch->qclosed) {
        pthread_mutex_unlock(&ch->qlock);
        return -ESHUTDOWN;
    }
    if (__atomic_load_n(&ch->qlen, __ATOMIC_RELAXED) >= ch->o.max_queued || !(e = ch->qfree)) {
        pthread_mutex_unlock(&ch->qlock);
        return -EAGAIN;
    }
    ch->qfree = e->next;
    e->state = Q_FAILING; /* taken, not queued yet: its id cancels nothing */
    pthread_mutex_unlock(&ch->qlock);
    e->plen = plen;
    e->mdsz = mdsz;
    e->buf = b;
    e->m = m;
    e->resp_md = o ? o->resp_md : NULL;
    e->cb = cb;
    e->arg = arg;
    e->cb_on_poller = o && (o->flags & VRPC_CALL_CB_ON_POLLER);
    e->deadline = deadline;
    if (o && o->call_id) /* before it is queued, i.e. before it can complete */
        __atomic_store_n(o->call_id, queued_id(ch, e), __ATOMIC_RELEASE);
    pthread_mutex_lock(&ch->qlock);
    e->state = Q_QUEUED;
    e->next = &ch->qhead;
    e->prev = ch->qhead.prev;
    ch->qhead.prev->next = e;
    ch->qhead.prev = e;
    __atomic_add_fetch(&ch->qlen, 1, __ATOMIC_RELEASE);
    if (deadline != VRPC_NO_DEADLINE) /* under qlock: a pump cannot take it before it is armed */
        vrpc_timer_arm(ch->wheel, &e->timer, deadline, queued_expired, e, e->qgen);
    pthread_mutex_unlock(&ch->qlock);
    vrpc_ch_pump(ch);
    return 0;
}

/* An async call without a slot (or behind calls already queued, to keep
 * their order): queue it packed in a send buffer. A large request is not
 * queued (its grant would pin memory while it waits): refused. Drops our
 * reference of c. start_call's result (0: queued). */
int vrpc_ch_start_queued(struct vrpc_channel *ch, struct vrpc_conn *c, struct call_start *cs, struct vrpc_status *st)
{
    const struct vrpc_call_opts *o = cs->o;
    struct vrpc_buf *qb = cs->lb ? NULL : vrpc_pool_get(ch->send_pool);
    conn_unref(c);
    if (!qb) {
        vrpc_lbuf_put(cs->lb);
        return -EAGAIN;
    }
    if (cs->mdsz)
        vrpc_wire_md_encode((uint8_t *)qb->data + VRPC_WIRE_HDR_LEN, o->md, o->md_count);
    size_t plen = vrpc_pb_pack_sized(cs->req, (uint8_t *)qb->data + VRPC_WIRE_HDR_LEN + cs->mdsz);
    int rc = enqueue(ch, qb, (uint32_t)cs->mdsz, (uint32_t)plen, cs->m, o, cs->cb, cs->arg, cs->deadline);
    if (rc == 0)
        return 0;
    vrpc_pool_put(qb);
    if (rc == -EAGAIN)
        return -EAGAIN;
    vrpc_status_set_unprocessed(st, VRPC_UNAVAILABLE, "channel is shutting down");
    return VRPC_UNAVAILABLE;
}

void vrpc_ch_queue_close(struct vrpc_channel *ch)
{
    /* queued async calls complete once, with CANCELLED; no pump sends more */
    pthread_mutex_lock(&ch->qlock);
    ch->qclosed = true;
    struct queued *flush = NULL;
    while (ch->qhead.next != &ch->qhead) {
        struct queued *e = ch->qhead.next;
        queued_unlink_locked(ch, e, Q_FAILING);
        e->next = flush;
        flush = e;
    }
    pthread_mutex_unlock(&ch->qlock);
    while (flush) {
        struct queued *e = flush;
        flush = e->next;
        queued_fail(e, VRPC_CANCELLED, "channel destroyed");
    }
}
