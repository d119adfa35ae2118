/* Server streams, the server's side (include/verbrpc/stream.h, docs/PROTOCOL.md
 * "Streams"): a stream is a call (its call object's state word, deadline
 * timer, slot and statistics, as for unary calls), plus this state: the
 * client's messages queued in order for the stream's own task, which runs
 * start / on_read / on_half_close / on_cancel one at a time on a worker and
 * returns window as the callbacks consume (for a method run on the poller,
 * the poller runs on_read and the small writes in the idle task's place:
 * poller_run); the window the client gave us;
 * the asynchronous writes waiting for it. The end is exactly once, by the
 * call's claim (the application's finish) or detach (deadline, CANCEL,
 * connection loss, a per-stream error of the client). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "rpc/pbutil.h"
#include "rpc/server_stream.h"
#include "rpc/spare.h"

static struct vrpc_server_stream *stream_new(struct vrpc_server_call *call, struct sconn *c)
{
    struct vrpc_server_stream *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&st->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&st->lock, NULL);
    st->call = call;
    struct vrpc_server *s = call->s;
    struct vrpc_rpc_spin sp;
    vrpc_rpc_spin_mode(s->o.no_spin, s->o.spin_us, &sp);
    /* not where workers share CPUs with pinned pollers (they must sleep there) */
    if (sp.wait && !s->o.cpu_mask)
        st->linger_ns = sp.wait_ns < VRPC_RPC_BUSY_POLL_US * 1000ull ? sp.wait_ns : VRPC_RPC_BUSY_POLL_US * 1000ull;
    vrpc_arena_init(&st->arena, (size_t)vrpc_ep_eager_size(c->b.ep) * 2 + 4096,
                    (size_t)call->s->max_payload * 8 + 65536);
    return st;
}

void vrpc_srv_stream_drop_in_locked(struct vrpc_server_stream *st)
{
    while (st->in_head) {
        struct srv_msg *m = st->in_head;
        st->in_head = m->next;
        if (m == st->rd_node) {
            m->orphan = true; /* its read's completion frees it */
            continue;
        }
        vrpc_lbuf_put(m->lb);
        free(m);
    }
    st->in_tail = NULL;
}

void vrpc_srv_stream_trim_locked(struct vrpc_server_stream *st)
{
    while (st->out_spare) {
        struct srv_out *o = st->out_spare;
        st->out_spare = o->next;
        free(o);
    }
    while (st->in_spare) {
        struct srv_msg *m = st->in_spare;
        st->in_spare = m->next;
        free(m);
    }
}

/* A node for a client message of len bytes: from in_spare (the first few
 * looked at: a stream's messages are mostly of one size), else new. */
static struct srv_msg *msg_node_locked(struct vrpc_server_stream *st, uint32_t len)
{
    struct srv_msg *m;
    VRPC_SPARE_GET(struct srv_msg, &st->in_spare, len, m);
    return m;
}

void vrpc_srv_stream_free(struct vrpc_server_stream *st)
{
    if (!st)
        return;
    vrpc_srv_stream_drop_in_locked(st);
    while (st->out_head) { /* (never left with callbacks due: see finish) */
        struct srv_out *o = st->out_head;
        st->out_head = o->next;
        vrpc_lbuf_put(o->lb);
        free(o);
    }
    while (st->out_free) {
        struct srv_out *o = st->out_free;
        st->out_free = o->next;
        free(o);
    }
    vrpc_srv_stream_trim_locked(st);
    vrpc_arena_fini(&st->arena);
    pthread_cond_destroy(&st->cond);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

int vrpc_srv_stream_open(struct vrpc_server_call *call, struct method_entry *me, uint64_t id, uint32_t gen)
{
    struct sconn *c = call->conn;
    struct vrpc_server_stream *st = call->st;
    /* release: the hold timer's thread may look for st's grant record
     * (vrpc_srv_stream_owns_offer) */
    if (!st && (st = stream_new(call, c)))
        __atomic_store_n(&call->st, st, __ATOMIC_RELEASE);
    if (!st)
        return -ENOMEM;
    pthread_mutex_lock(&st->lock);
    /* The object's last stream is over (its call is not RUN); its task may
     * still be on its way out: it then starts this one (start_pending). */
    st->ops = me->sops;
    st->on_poller = me->on_poller;
    st->user = me->user;
    st->ctx = NULL;
    st->kind = me->m->kind;
    st->id = id;
    st->gen = gen;
    st->open = true;
    st->start_pending = true;
    st->started = st->ended = st->finished = st->half_closed = st->hc_pending = st->cancel_pending = false;
    st->sending = st->md_sent = false;
    st->nin = st->nout = st->consumed = 0;
    __atomic_store_n(&st->nqueued, 0, __ATOMIC_RELAXED); /* write_async peeks at it */
    st->window = st->recv_avail = call->s->o.stream_window;
    st->send_avail = c->peer_window;
    st->conn = c;
    vrpc_conn_ref(&c->b); /* the stream's, until it is released */
    pthread_mutex_unlock(&st->lock);
    return 0;
}

void vrpc_srv_stream_release_conn(struct vrpc_server_stream *st)
{
    struct sconn *c = st->conn;
    vrpc_srv_sconn_unref(c); /* may free c, its slot table and this object: last */
}

static void stream_task(struct vrpc_task *t);

void vrpc_srv_stream_kick_locked(struct vrpc_server_stream *st, struct vrpc_sched_producer *prod)
{
    if (st->running) { /* a lingering task looks again */
        __atomic_store_n(&st->kick_seq, st->kick_seq + 1, __ATOMIC_RELEASE);
        return;
    }
    struct vrpc_server_call *call = st->call;
    struct vrpc_server *s = call->s;
    st->running = true;
    __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* the task's */
    __atomic_add_fetch(&s->tasks, 1, __ATOMIC_RELAXED);
    vrpc_task_init(&st->task, stream_task);
    int rc = prod ? vrpc_sched_producer_submit(prod, &st->task) : vrpc_sched_submit(s->sched, &st->task);
    if (rc) { /* the scheduler is going: no callback will run (the refs above are not the last) */
        st->running = false;
        __atomic_sub_fetch(&call->refs, 1, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&s->tasks, 1, __ATOMIC_RELAXED);
    }
}

void vrpc_srv_stream_detached(struct vrpc_server_call *call, uint32_t gen)
{
    struct vrpc_server_stream *st = call->st;
    pthread_mutex_lock(&st->lock);
    if (st->open && st->gen == gen && !st->ended) {
        st->ended = true;
        st->cancel_pending = st->ops->on_cancel != NULL;
        pthread_cond_broadcast(&st->cond);
        vrpc_srv_stream_kick_locked(st, NULL);
    }
    pthread_mutex_unlock(&st->lock);
}

bool vrpc_srv_stream_hold_end(struct vrpc_server_call *call, uint32_t gen, struct sconn *c, uint64_t id,
                              enum vrpc_code code, const char *msg)
{
    struct vrpc_server_stream *st = call->st;
    if (!st)
        return false;
    pthread_mutex_lock(&st->lock);
    /* ended is set (the detach): no sender enters, so 0 stays 0 */
    bool hold = st->open && st->gen == gen && st->wire_busy > 0;
    if (hold) {
        st->end_held = true;
        st->end_conn = c;
        st->end_id = id;
        st->end_code = code;
        snprintf(st->end_msg, sizeof(st->end_msg), "%s", msg ? msg : "");
    }
    pthread_mutex_unlock(&st->lock);
    return hold;
}

void vrpc_srv_stream_wire_leave_locked(struct vrpc_server_stream *st)
{
    /* the last one out sends a held RESPONSE, still counted: finish (which
     * drops the stream's reference of the connection, maybe the last) waits */
    if (st->wire_busy == 1 && st->end_held) {
        st->end_held = false;
        struct sconn *c = st->end_conn;
        uint64_t id = st->end_id;
        enum vrpc_code code = st->end_code;
        char msg[VRPC_STATUS_MSG_MAX];
        memcpy(msg, st->end_msg, sizeof(msg));
        pthread_mutex_unlock(&st->lock);
        vrpc_srv_end_detached(c, id, code, msg);
        pthread_mutex_lock(&st->lock);
    }
    if (--st->wire_busy == 0)
        pthread_cond_broadcast(&st->cond); /* finish waits for it */
}

void vrpc_srv_stream_end(struct vrpc_server_stream *st, uint32_t gen, enum vrpc_code code, const char *msg)
{
    uint64_t id;
    struct sconn *c = vrpc_srv_call_detach(st->call, gen, code, -ECONNRESET, false, &id);
    if (c && !vrpc_srv_stream_hold_end(st->call, gen, c, id, code, msg))
        vrpc_srv_end_detached(c, id, code, msg);
}

void vrpc_srv_stream_cancel(struct vrpc_server_call *call, uint32_t gen)
{
    vrpc_srv_stream_end(call->st, gen, VRPC_CANCELLED, "cancelled by the client");
}

/* ---- the stream's task: callbacks in order, one at a time (a worker) ------- */

/* Run callback fn of st with the lock dropped (in_cb set meanwhile). */
#define RUN_CB(st, call_expr)                                                                                          \
    do {                                                                                                               \
        (st)->in_cb = true;                                                                                            \
        pthread_mutex_unlock(&(st)->lock);                                                                             \
        call_expr;                                                                                                     \
        pthread_mutex_lock(&(st)->lock);                                                                               \
        (st)->in_cb = false;                                                                                           \
        pthread_cond_broadcast(&(st)->cond);                                                                           \
    } while (0)

/* Return the consumed messages' window once a batch of max(1, window / 4)
 * is due (lock held, dropped while sending). On a poller only with a send
 * buffer to spare: else the task sends it (task_due_locked, step_locked),
 * so a WINDOW is never dropped for want of a buffer there. True if sent. */
static bool window_flush_locked(struct vrpc_server_stream *st)
{
    uint32_t batch = st->window / 4 ? st->window / 4 : 1;
    if (st->consumed < batch || st->half_closed || (vrpc_rpc_on_poller && !vrpc_pool_avail(st->conn->s->send_pool)) ||
        !vrpc_srv_stream_wire_enter_locked(st))
        return false;
    uint32_t give = st->consumed;
    st->consumed = 0;
    st->recv_avail += give; /* before the WINDOW is out: the client may use it at once */
    uint8_t p[VRPC_WIRE_WINDOW_LEN];
    vrpc_wire_window_encode(p, give);
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_WINDOW,
                              .request_id = st->id,
                              .payload_len = VRPC_WIRE_WINDOW_LEN};
    struct sconn *c = st->conn;
    pthread_mutex_unlock(&st->lock);
    if (!vrpc_conn_is_dead(&c->b))
        vrpc_srv_conn_send_simple(c, &h, p, sizeof(p), true);
    pthread_mutex_lock(&st->lock);
    vrpc_srv_stream_wire_leave_locked(st);
    return true;
}

/* One message consumed: its window returns with the batch (window_flush_locked). */
static void consumed_locked(struct vrpc_server_stream *st)
{
    st->consumed++;
    window_flush_locked(st);
}

/* Decode and deliver one client message (lock held on entry and exit). */
static void deliver_locked(struct vrpc_server_stream *st, struct srv_msg *m)
{
    struct vrpc_server_call *call = st->call;
    const struct vrpc_method_desc *md = call->method;
    uint32_t gen = st->gen;
    ProtobufCMessage *msg = NULL;
    if (m->failed) { /* its read failed: the stream is ending; it counts as consumed */
        free(m);
        consumed_locked(st);
        return;
    }
    pthread_mutex_unlock(&st->lock);
    int rc;
    if (m->lb) {
        rc = vrpc_pb_unpack_ref(md->input, m->lb->data, m->len, call->s->o.max_depth, &st->arena, &msg);
        if (rc)
            vrpc_lbuf_put(m->lb);
        else
            vrpc_arena_hold(&st->arena, m->lb); /* back at the arena's reset */
        free(m);
        m = NULL;
    } else { /* big bytes fields point into m, kept until the callback returned */
        rc = vrpc_pb_unpack_ref(md->input, m->data, m->len, call->s->o.max_depth, &st->arena, &msg);
    }
    if (rc) {
        free(m);
        char why[VRPC_STATUS_MSG_MAX];
        snprintf(why, sizeof(why), "stream message does not decode as %s: %s", md->input->name,
                 rc == -ELOOP    ? "nested too deeply"
                 : rc == -ENOMEM ? "too large when decoded"
                                 : "malformed");
        vrpc_arena_reset(&st->arena);
        vrpc_srv_stream_end(st, gen, VRPC_INVALID_ARGUMENT, why);
        pthread_mutex_lock(&st->lock);
        return;
    }
    pthread_mutex_lock(&st->lock);
    if (st->ops->on_read && !st->finished)
        RUN_CB(st, st->ops->on_read(st, msg, st->user));
    vrpc_arena_reset(&st->arena);
    if (m) {
        m->next = st->in_spare;
        st->in_spare = m;
    }
    consumed_locked(st);
}

/* A stream that ended before its start ran: nobody holds it but the server. */
static void release_unstarted_locked(struct vrpc_server_stream *st)
{
    st->open = false;
    st->finished = true;
    vrpc_srv_stream_drop_in_locked(st);
    pthread_mutex_unlock(&st->lock);
    vrpc_srv_call_claim(st->call); /* detached: the handler's hold ends */
    vrpc_srv_stream_release_conn(st);
    pthread_mutex_lock(&st->lock);
}

/* One step of the task; false when there is nothing to do. */
static bool step_locked(struct vrpc_server_stream *st)
{
    if (st->start_pending) {
        st->start_pending = false;
        if (st->ended)
            release_unstarted_locked(st);
        else {
            RUN_CB(st, st->ops->start(st, st->user));
            st->started = true;
        }
        return true;
    }
    if (!st->started || st->finished)
        return false;
    if (st->cancel_pending) {
        st->cancel_pending = false;
        RUN_CB(st, st->ops->on_cancel(st, st->user));
        return true;
    }
    if (st->ended && st->in_head) {
        vrpc_srv_stream_drop_in_locked(st);
        return true;
    }
    if (st->in_head && !st->in_head->pending) {
        struct srv_msg *m = st->in_head;
        if (!(st->in_head = m->next))
            st->in_tail = NULL;
        deliver_locked(st, m);
        return true;
    }
    if (window_flush_locked(st)) /* one a poller left (no buffer to spare then) */
        return true;
    if (st->hc_pending && !st->ended && !st->in_head) {
        st->hc_pending = false;
        if (st->ops->on_half_close)
            RUN_CB(st, st->ops->on_half_close(st, st->user));
        return true;
    }
    if (st->out_head && !st->sending && (st->send_avail > 0 || st->ended)) {
        if (!vrpc_srv_stream_out_batch_locked(st))
            vrpc_srv_stream_out_one_locked(st);
        return true;
    }
    return false;
}

/* A task with nothing to do stays a while for the next kick (lock dropped)
 * before it ends, while the stream can still get work from the client (a
 * message, or WINDOW for queued writes): the poller then only appends and
 * bumps kick_seq, and the worker is not put to sleep and woken per message
 * (as the client's stream task, rpc/stream_recv.c). It yields between looks
 * (the poller may need the CPU). True if a kick came. */
static bool linger_locked(struct vrpc_server_stream *st)
{
    if (!st->linger_ns || !st->started || st->finished || st->ended || (st->half_closed && !st->out_head) ||
        st->on_poller) /* (its poller takes over) */
        return false;
    uint32_t seq = st->kick_seq;
    pthread_mutex_unlock(&st->lock);
    vrpc_rpc_watch(&st->kick_seq, seq, st->linger_ns);
    pthread_mutex_lock(&st->lock);
    return st->kick_seq != seq; /* under the lock: a kick just after the spin is seen */
}

/* The task (or a poller in its place) is done with call: its reference
 * and its count in s->tasks go (no lock held). */
static void task_leave(struct vrpc_server_call *call)
{
    struct vrpc_server *s = call->s;
    vrpc_srv_call_unref(call); /* the task's */
    if (!__atomic_load_n(&s->shutting, __ATOMIC_ACQUIRE))
        __atomic_sub_fetch(&s->tasks, 1, __ATOMIC_ACQ_REL);
    else if (__atomic_sub_fetch(&s->tasks, 1, __ATOMIC_ACQ_REL) == 0)
        vrpc_futex_wake_all(&s->tasks);
}

static void stream_task(struct vrpc_task *t)
{
    struct vrpc_server_stream *st = container_of(t, struct vrpc_server_stream, task);
    struct vrpc_server_call *call = st->call;
    pthread_mutex_lock(&st->lock);
    st->runner = pthread_self();
    do
        while (step_locked(st))
            ;
    while (linger_locked(st));
    st->running = false;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    task_leave(call);
}

/* ---- a method run on the poller (vrpc_server_run_on_poller) ----------------- */

/* The poller may run the stream itself, in the task's place (lock held):
 * the method asks for it, the task is idle, start has run and nothing
 * ended. Takes the task's references (running, call->refs, s->tasks) as a
 * kick does. */
static bool poller_claim_locked(struct vrpc_server_stream *st)
{
    if (!st->on_poller || st->running || !st->started || st->finished || st->ended || st->cancel_pending)
        return false;
    st->running = true;
    __atomic_add_fetch(&st->call->refs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st->call->s->tasks, 1, __ATOMIC_RELAXED);
    return true;
}

/* One step a poller may take (lock held): deliver a message (its window
 * returns without waiting) while the stream can take a write (an echoing
 * on_read's write_async then does not meet -EAGAIN for its first write;
 * with VRPC_STREAM_ASYNC_WRITES_MAX queued the task delivers, and its
 * blocking write may wait), or send queued small writes without waiting. */
static bool poller_step_locked(struct vrpc_server_stream *st)
{
    if (!st->started || st->finished || st->ended || st->cancel_pending)
        return false;
    if (st->in_head && !st->in_head->pending && st->nqueued < VRPC_STREAM_ASYNC_WRITES_MAX) {
        struct srv_msg *m = st->in_head;
        if (!(st->in_head = m->next))
            st->in_tail = NULL;
        deliver_locked(st, m);
        return true;
    }
    return st->send_avail > 0 && vrpc_srv_stream_out_poller_locked(st);
}

/* What the task still has to do after a poller ran in its place (lock
 * held): step_locked's work. */
static bool task_due_locked(const struct vrpc_server_stream *st)
{
    uint32_t batch = st->window / 4 ? st->window / 4 : 1;
    if (st->start_pending)
        return true;
    if (!st->started || st->finished)
        return false;
    return st->cancel_pending || (st->in_head && (!st->in_head->pending || st->ended)) ||
           (st->hc_pending && !st->ended) || (st->out_head && !st->sending && (st->send_avail > 0 || st->ended)) ||
           (st->consumed >= batch && !st->half_closed && !st->ended);
}

/* The poller in the task's place (poller_claim_locked, lock not held):
 * what it may do without waiting, with vrpc_rpc_on_poller set (the
 * blocking stream calls refuse), then the task for the rest. */
static void poller_run(struct vrpc_server_stream *st, struct vrpc_sched_producer *prod)
{
    struct vrpc_server_call *call = st->call;
    bool was = vrpc_rpc_on_poller;
    vrpc_rpc_on_poller = true;
    pthread_mutex_lock(&st->lock);
    st->runner = pthread_self();
    while (poller_step_locked(st))
        ;
    st->running = false;
    if (task_due_locked(st))
        vrpc_srv_stream_kick_locked(st, prod);
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    vrpc_rpc_on_poller = was;
    task_leave(call);
}

void vrpc_srv_stream_go(struct poller *pl, struct vrpc_server_call *call, uint32_t gen)
{
    struct vrpc_server_stream *st = call->st;
    if (call->deadline_ns != VRPC_NO_DEADLINE) {
        __atomic_add_fetch(&call->refs, 1, __ATOMIC_RELAXED); /* the armed timer's */
        vrpc_timer_arm(pl->s->wheel, &call->timer, call->deadline_ns, vrpc_srv_deadline_fired, call, gen);
    }
    pthread_mutex_lock(&st->lock);
    vrpc_srv_stream_kick_locked(st, pl->prod);
    if (!st->running) { /* the scheduler is going: nobody will start it */
        pthread_mutex_unlock(&st->lock);
        vrpc_srv_stream_end(st, gen, VRPC_UNAVAILABLE, "server is shutting down");
        pthread_mutex_lock(&st->lock);
        st->start_pending = false;
        release_unstarted_locked(st);
    }
    pthread_mutex_unlock(&st->lock);
}

/* ---- the client's frames (poller) -------------------------------------------- */

/* The stream a MESSAGE/HALF_CLOSE/WINDOW names, locked, or NULL: not in
 * flight (ignored; it may have crossed the RESPONSE) or a unary call
 * (protocol error). */
static struct vrpc_server_stream *frame_stream(struct sconn *c, const struct vrpc_wire_hdr *h, uint32_t *gen)
{
    uint32_t slot = vrpc_wire_id_slot(h->request_id);
    if (slot >= c->ncalls)
        return NULL;
    struct vrpc_server_call *call = c->calls[slot];
    uint64_t w = __atomic_load_n(&call->state, __ATOMIC_ACQUIRE);
    if (!(ST_FLAGS(w) & CALL_RUN) || (ST_FLAGS(w) & CALL_DETACHED) || call->req_id != h->request_id)
        return NULL;
    if (!call->me->sops) {
        vrpc_srv_conn_protocol_error(c, "stream frame for a unary call", -EPROTO);
        return NULL;
    }
    struct vrpc_server_stream *st = call->st;
    pthread_mutex_lock(&st->lock);
    if (!st->open || st->id != h->request_id || st->gen != ST_GEN(w) || st->ended) {
        pthread_mutex_unlock(&st->lock);
        return NULL;
    }
    *gen = st->gen;
    return st;
}

/* Poller: answer a RNDV MESSAGE we will not read with DONE(code). */
static void refuse_rndv(struct sconn *c, uint64_t id, enum vrpc_code code)
{
    struct vrpc_wire_hdr d = {
        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_DONE, .request_id = id, .status = (uint32_t)code};
    vrpc_srv_conn_send_simple(c, &d, NULL, 0, false);
}

/* The checks of a client MESSAGE (lock held): 0 to queue it, else the
 * stream or connection was dealt with (lock dropped). */
static int message_check_locked(struct sconn *c, struct vrpc_server_stream *st, const struct vrpc_wire_hdr *h,
                                uint32_t gen)
{
    const char *perr = NULL, *serr = NULL;
    enum vrpc_code code = VRPC_INVALID_ARGUMENT;
    char why[VRPC_STATUS_MSG_MAX];
    if (st->half_closed)
        perr = "MESSAGE after the client half-closed";
    else if (st->recv_avail == 0)
        perr = "MESSAGE beyond the stream window";
    else if (st->kind == VRPC_METHOD_SERVER_STREAMING && st->nin >= 1)
        serr = "a second client message on a server-streaming method";
    else if ((h->flags & VRPC_FF_RNDV) && !c->b.large)
        perr = "large-message MESSAGE on a connection without large messages";
    else if ((h->flags & VRPC_FF_RNDV) && (uint64_t)VRPC_WIRE_HDR_LEN + h->payload_len <= vrpc_ep_eager_size(c->b.ep))
        perr = "bad rendezvous MESSAGE (fits a frame)";
    else if (h->payload_len > c->s->max_payload) {
        snprintf(why, sizeof(why), "stream message of %u bytes exceeds the server's limit of %u bytes", h->payload_len,
                 c->s->max_payload);
        serr = why;
        code = VRPC_RESOURCE_EXHAUSTED;
    } else if ((h->flags & VRPC_FF_RNDV) && st->rd_busy)
        perr = "a second large MESSAGE before the DONE of the first";
    if (!perr && !serr)
        return 0;
    pthread_mutex_unlock(&st->lock);
    if (perr) {
        vrpc_srv_conn_protocol_error(c, perr, -EPROTO);
        return -1;
    }
    if (h->flags & VRPC_FF_RNDV)
        refuse_rndv(c, h->request_id, code);
    vrpc_srv_stream_end(st, gen, code, serr);
    return -1;
}

/* Append m to the client's messages (lock held). True: the poller runs
 * the stream itself once it lets go of the lock (poller_run). */
static bool queue_locked(struct sconn *c, struct vrpc_server_stream *st, struct srv_msg *m, uint16_t flags)
{
    if (st->in_tail)
        st->in_tail->next = m;
    else
        st->in_head = m;
    st->in_tail = m;
    st->recv_avail--;
    st->nin++;
    if (flags & VRPC_FF_END)
        st->half_closed = st->hc_pending = true;
    if (!m->pending && poller_claim_locked(st))
        return true;
    vrpc_srv_stream_kick_locked(st, c->poller->prod);
    return false;
}

/* A large client MESSAGE: queued as pending while its payload is read into
 * a large buffer (the call's rndv_in, idle in a stream call); the read's
 * completion sends DONE (vrpc_srv_stream_read_done). Lock held; dropped. */
static void rndv_message_locked(struct sconn *c, struct vrpc_server_stream *st, const struct vrpc_wire_hdr *h,
                                const uint8_t *body, uint32_t gen)
{
    struct vrpc_server *s = c->s;
    struct vrpc_server_call *call = st->call;
    struct vrpc_wire_desc d;
    char why[VRPC_STATUS_MSG_MAX];
    struct vrpc_buf *lb = NULL;
    struct srv_msg *m = NULL;
    if (vrpc_wire_desc_decode(body, h->payload_len, &d)) {
        pthread_mutex_unlock(&st->lock);
        vrpc_srv_conn_protocol_error(c, "bad rendezvous MESSAGE (zero key or range overflow)", -EPROTO);
        return;
    }
    if (c->rd_pinned + h->payload_len > s->o.max_pinned_per_conn)
        snprintf(why, sizeof(why), "large messages being read on this connection would exceed max_pinned_per_conn");
    else if (!vrpc_rndv_buf(s->tp, s->o.max_pinned, h->payload_len, &lb, why, sizeof(why)) &&
             !(m = calloc(1, sizeof(*m))))
        snprintf(why, sizeof(why), "server out of memory");
    if (!m) {
        vrpc_lbuf_put(lb);
        pthread_mutex_unlock(&st->lock);
        refuse_rndv(c, h->request_id, VRPC_RESOURCE_EXHAUSTED);
        vrpc_srv_stream_end(st, gen, VRPC_RESOURCE_EXHAUSTED, why);
        return;
    }
    m->len = h->payload_len;
    m->pending = true;
    queue_locked(c, st, m, h->flags);
    st->rd_busy = true;
    st->rd_node = m;
    call->in = (struct vrpc_rndv_in){
        .lb = lb, .ep = c->b.ep, .addr = d.addr, .rkey = d.rkey, .len = h->payload_len, .id = h->request_id};
    c->rd_pinned += h->payload_len;
    pthread_mutex_unlock(&st->lock);
    vrpc_srv_stream_read_limit(c, call, h->payload_len, gen);
    int rc = vrpc_rndv_read(&call->in);
    if (rc == -ENOSPC)
        vrpc_rndv_read_later(&c->poller->retry, &call->in);
    else if (rc)
        vrpc_srv_stream_read_done(call, rc);
}

/* The DONE of a large client message, and the stream's end if its read failed. */
static void read_done_answer(struct sconn *c, struct vrpc_server_stream *st, int status, bool live, uint64_t id,
                             uint32_t gen)
{
    if (status == -EACCES) {
        vrpc_srv_conn_protocol_error(c, "its large-message descriptor could not be read (bad key or range)", -EPROTO);
        return;
    }
    if (vrpc_conn_is_dead(&c->b))
        return;
    struct vrpc_wire_hdr d = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_DONE,
                              .request_id = id,
                              .status = status ? VRPC_INTERNAL
                                        : live ? 0
                                               : VRPC_CANCELLED};
    vrpc_srv_conn_send_simple(c, &d, NULL, 0, false);
    if (status && live)
        vrpc_srv_stream_end(st, gen, VRPC_INTERNAL, "large stream message could not be read");
}

bool vrpc_srv_stream_read_done(struct vrpc_server_call *call, int status)
{
    struct vrpc_server_stream *st = call->st;
    if (!st->rd_busy) /* (written by this poller only) */
        return false;
    status = vrpc_srv_stream_read_unlimit(call, status);
    struct sconn *c = st->conn;
    struct vrpc_buf *lb = call->in.lb;
    call->in.lb = NULL;
    c->rd_pinned -= call->in.len;
    pthread_mutex_lock(&st->lock);
    struct srv_msg *m = st->rd_node;
    st->rd_busy = false;
    st->rd_node = NULL;
    bool live = st->open && !st->ended && !st->finished && !m->orphan;
    uint32_t gen = st->gen;
    uint64_t id = st->id;
    if (m->orphan) {
        free(m);
    } else {
        m->pending = false;
        if (status == 0 && live)
            m->lb = lb, lb = NULL;
        else
            m->failed = true;
        vrpc_srv_stream_kick_locked(st, c->poller->prod);
    }
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    vrpc_lbuf_put(lb);
    read_done_answer(c, st, status, live, id, gen);
    return true;
}

void vrpc_srv_stream_on_message(struct sconn *c, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    uint32_t gen;
    struct vrpc_server_stream *st = frame_stream(c, h, &gen);
    if (!st) {
        if ((h->flags & VRPC_FF_RNDV) && !vrpc_conn_is_dead(&c->b))
            refuse_rndv(c, h->request_id, VRPC_CANCELLED); /* its reader is gone: DONE all the same */
        return;
    }
    if (message_check_locked(c, st, h, gen))
        return;
    if (h->flags & VRPC_FF_RNDV) {
        rndv_message_locked(c, st, h, body, gen);
        return;
    }
    struct srv_msg *m = msg_node_locked(st, h->payload_len);
    if (!m) {
        pthread_mutex_unlock(&st->lock);
        vrpc_srv_stream_end(st, gen, VRPC_RESOURCE_EXHAUSTED, "server out of memory");
        return;
    }
    *m = (struct srv_msg){.len = h->payload_len, .cap = m->cap};
    memcpy(m->data, body, h->payload_len);
    bool run = queue_locked(c, st, m, h->flags);
    pthread_mutex_unlock(&st->lock);
    if (run)
        poller_run(st, c->poller->prod);
}

void vrpc_srv_stream_on_half_close(struct sconn *c, const struct vrpc_wire_hdr *h)
{
    uint32_t gen;
    struct vrpc_server_stream *st = frame_stream(c, h, &gen);
    if (!st)
        return;
    if (st->half_closed) {
        pthread_mutex_unlock(&st->lock);
        vrpc_srv_conn_protocol_error(c, "a second HALF_CLOSE", -EPROTO);
        return;
    }
    if (st->kind == VRPC_METHOD_SERVER_STREAMING && st->nin == 0) {
        pthread_mutex_unlock(&st->lock);
        vrpc_srv_stream_end(st, gen, VRPC_INVALID_ARGUMENT,
                            "half-close before the request message of a server-streaming method");
        return;
    }
    st->half_closed = st->hc_pending = true;
    vrpc_srv_stream_kick_locked(st, c->poller->prod);
    pthread_mutex_unlock(&st->lock);
}

void vrpc_srv_stream_on_window(struct sconn *c, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    uint32_t n, gen;
    if (vrpc_wire_window_decode(body, h->payload_len, &n)) {
        vrpc_srv_conn_protocol_error(c, "WINDOW increment of 0 or above 2^31 - 1", -EPROTO);
        return;
    }
    struct vrpc_server_stream *st = frame_stream(c, h, &gen);
    if (!st)
        return;
    if (st->send_avail + n > VRPC_WIRE_WINDOW_SUM_MAX) {
        pthread_mutex_unlock(&st->lock);
        vrpc_srv_conn_protocol_error(c, "WINDOW sum overflows 2^31 - 1", -EPROTO);
        return;
    }
    st->send_avail += n;
    pthread_cond_broadcast(&st->cond);
    bool run = false;
    if (st->out_head && !st->sending && !(run = poller_claim_locked(st)))
        vrpc_srv_stream_kick_locked(st, c->poller->prod);
    pthread_mutex_unlock(&st->lock);
    if (run) /* the queued writes go from here */
        poller_run(st, c->poller->prod);
}
