/* The server stream functions of <verbrpc/stream.h> a handler calls: writes
 * (blocking and asynchronous, both within the client's window and the
 * connection's send room), initial metadata, finish, accessors. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "rpc/pbutil.h"
#include "rpc/server_stream.h"
#include "rpc/spare.h"

/* Wait on st->cond until `until` (ns, CLOCK_MONOTONIC) or 50 ms at most:
 * -ETIMEDOUT once until has passed. */
static int wait_locked(struct vrpc_server_stream *st, int64_t until)
{
    int64_t now = vrpc_now_ns(), to = now + 50000000;
    if (until != VRPC_NO_DEADLINE && until <= now)
        return -ETIMEDOUT;
    if (until != VRPC_NO_DEADLINE && until < to)
        to = until;
    struct timespec ts = {.tv_sec = to / 1000000000, .tv_nsec = to % 1000000000};
    pthread_cond_timedwait(&st->cond, &st->lock, &ts);
    return 0;
}

/* Room in the connection's send quota for one more stream frame: at most a
 * quarter of max_sends_per_conn goes to stream messages, so a client that
 * reads slowly throttles its streams (the writer waits) instead of losing
 * its connection, and unary answers keep their room. */
int vrpc_srv_stream_wait_room(struct vrpc_server_stream *st)
{
    struct sconn *c = st->conn;
    uint32_t lim = c->s->send_half / 2 ? c->s->send_half / 2 : 1;
    int64_t dl = st->call->deadline_ns;
    while (__atomic_load_n(&c->sends, __ATOMIC_RELAXED) >= lim) {
        if (vrpc_conn_is_dead(&c->b) || __atomic_load_n(&st->call->cancelled, __ATOMIC_ACQUIRE))
            return -ECONNRESET;
        if (dl != VRPC_NO_DEADLINE && vrpc_now_ns() >= dl)
            return -ETIMEDOUT;
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
    return 0;
}

/* The connection's send quota has room for a stream frame now (the test
 * vrpc_srv_stream_wait_room waits on). */
static bool room_now(const struct vrpc_server_stream *st)
{
    const struct sconn *c = st->conn;
    uint32_t lim = c->s->send_half / 2 ? c->s->send_half / 2 : 1;
    return __atomic_load_n(&c->sends, __ATOMIC_RELAXED) < lim;
}

/* Hand one MESSAGE to the transport, the stream's wire entered (no lock). */
static int send_frame(struct vrpc_server_stream *st, const uint8_t *bytes, uint32_t len)
{
    struct sconn *c = st->conn;
    struct vrpc_buf *b = vrpc_conn_is_dead(&c->b) ? NULL : vrpc_srv_conn_buf(c, true);
    if (!b)
        return -ECONNRESET;
    struct vrpc_wire_hdr h = {
        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_MESSAGE, .request_id = st->id, .payload_len = len};
    vrpc_wire_hdr_encode(b->data, &h);
    memcpy(b->data + VRPC_WIRE_HDR_LEN, bytes, len);
    return vrpc_srv_conn_send(c, b, VRPC_WIRE_HDR_LEN + len) ? -ECONNRESET : 0;
}

int vrpc_srv_stream_send_bytes(struct vrpc_server_stream *st, const uint8_t *bytes, uint32_t len)
{
    int rc = vrpc_srv_stream_wait_room(st);
    if (rc)
        return rc;
    pthread_mutex_lock(&st->lock);
    bool go = vrpc_srv_stream_wire_enter_locked(st);
    pthread_mutex_unlock(&st->lock);
    if (!go)
        return -ECONNRESET;
    rc = send_frame(st, bytes, len);
    pthread_mutex_lock(&st->lock);
    vrpc_srv_stream_wire_leave_locked(st); /* a RESPONSE held for this frame goes after it */
    pthread_mutex_unlock(&st->lock);
    return rc;
}

void vrpc_srv_stream_out_one_locked(struct vrpc_server_stream *st)
{
    struct srv_out *o = st->out_head;
    if (!(st->out_head = o->next))
        st->out_tail = NULL;
    bool ended = st->ended;
    if (!ended)
        st->send_avail--;
    st->sending = true;
    /* The common case enters the wire under the lock held here and leaves
     * it under the one taken after the send (vrpc_srv_stream_send_bytes
     * takes both again); no room in the connection's quota, or a large
     * message, goes the way that waits. */
    bool entered = !ended && !o->lb && room_now(st) && vrpc_srv_stream_wire_enter_locked(st);
    pthread_mutex_unlock(&st->lock);
    int rc;
    if (ended) {
        vrpc_lbuf_put(o->lb);
        rc = -ECONNRESET;
    } else if (entered) {
        rc = send_frame(st, o->data, o->len);
    } else {
        rc = o->lb ? vrpc_srv_stream_send_large(st, o->lb, o->len) : vrpc_srv_stream_send_bytes(st, o->data, o->len);
    }
    if (rc)
        rc = -ECONNRESET;
    pthread_mutex_lock(&st->lock);
    if (entered)
        vrpc_srv_stream_wire_leave_locked(st); /* a RESPONSE held for this frame goes after it */
    st->sending = false;
    __atomic_store_n(&st->nqueued, st->nqueued - 1, __ATOMIC_RELAXED); /* (its callback may write again) */
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    o->cb(st, rc, o->arg); /* may finish st (the task's reference keeps the object) */
    pthread_mutex_lock(&st->lock);
    vrpc_srv_stream_out_put_locked(st, o);
}

void vrpc_srv_stream_out_put_locked(struct vrpc_server_stream *st, struct srv_out *o)
{
    struct srv_out **list = o->cap == SRV_OUT_SMALL ? &st->out_free : o->cap ? &st->out_spare : NULL;
    if (!list) {
        free(o);
        return;
    }
    o->next = *list;
    *list = o;
}

/* A node of out_spare with room for size bytes, or NULL (lock held). A
 * stream writes mostly one size: the first few nodes are enough to look at. */
static struct srv_out *out_spare_take_locked(struct vrpc_server_stream *st, size_t size)
{
    struct srv_out *o;
    VRPC_SPARE_TAKE(struct srv_out, &st->out_spare, size, o);
    return o;
}

/* Queued async writes handed to the transport in one vrpc_ep_send_list, at most. */
#define OUT_BATCH 32

/* How many queued writes at the head may go together now (lock held): small
 * (not large messages), within the client's window and the connection's
 * stream quota (room_now for each), at most OUT_BATCH. */
static unsigned out_batchable_locked(const struct vrpc_server_stream *st)
{
    const struct sconn *c = st->conn;
    uint32_t lim = c->s->send_half / 2 ? c->s->send_half / 2 : 1;
    uint32_t sends = __atomic_load_n(&c->sends, __ATOMIC_RELAXED);
    uint64_t max = sends < lim ? lim - sends : 0;
    if (max > st->send_avail)
        max = st->send_avail;
    if (max > OUT_BATCH)
        max = OUT_BATCH;
    unsigned k = 0;
    for (const struct srv_out *o = st->out_head; o && k < max && !o->lb; o = o->next)
        k++;
    return k;
}

/* The frames of outs[0..k) handed over in one list (no lock; the wire
 * entered): rc[i] is each one's outcome. A frame whose buffer cannot be had
 * fails alone, those before it go first, as single sends would have. */
static void out_batch_send(struct vrpc_server_stream *st, struct srv_out *const *outs, unsigned k, int *rc)
{
    struct sconn *c = st->conn;
    struct vrpc_send_wr wrs[OUT_BATCH];
    unsigned n = 0, first = 0;
    for (unsigned i = 0; i <= k; i++) {
        struct vrpc_buf *b = i < k && !vrpc_conn_is_dead(&c->b) ? vrpc_srv_conn_buf(c, true) : NULL;
        if (b) {
            struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                                      .type = VRPC_FT_MESSAGE,
                                      .request_id = st->id,
                                      .payload_len = outs[i]->len};
            vrpc_wire_hdr_encode(b->data, &h);
            memcpy(b->data + VRPC_WIRE_HDR_LEN, outs[i]->data, outs[i]->len);
            wrs[n++] = (struct vrpc_send_wr){.buf = b, .len = VRPC_WIRE_HDR_LEN + outs[i]->len};
            continue;
        }
        unsigned sent = n ? vrpc_srv_conn_send_list(c, wrs, n) : 0;
        for (unsigned j = 0; j < n; j++)
            rc[first + j] = j < sent ? 0 : -ECONNRESET;
        if (i < k)
            rc[i] = -ECONNRESET;
        first = i + 1;
        n = 0;
    }
}

/* The first k queued writes (k >= min, from out_batchable_locked) in one
 * list; false if fewer may go. */
static bool out_batch_min_locked(struct vrpc_server_stream *st, unsigned min)
{
    unsigned k = st->ended ? 0 : out_batchable_locked(st);
    if (k < min || !vrpc_srv_stream_wire_enter_locked(st))
        return false; /* one at a time: out_one_locked */
    struct srv_out *outs[OUT_BATCH];
    int rc[OUT_BATCH];
    for (unsigned i = 0; i < k; i++) {
        outs[i] = st->out_head;
        st->out_head = outs[i]->next;
    }
    if (!st->out_head)
        st->out_tail = NULL;
    st->send_avail -= k;
    st->sending = true;
    pthread_mutex_unlock(&st->lock);
    out_batch_send(st, outs, k, rc);
    pthread_mutex_lock(&st->lock);
    vrpc_srv_stream_wire_leave_locked(st); /* a RESPONSE held for these frames goes after them */
    st->sending = false;
    for (unsigned i = 0; i < k; i++) {
        outs[i]->rc = rc[i];
        outs[i]->next = NULL;
        if (st->sent_tail)
            st->sent_tail->next = outs[i];
        else
            st->sent_head = outs[i];
        st->sent_tail = outs[i];
    }
    pthread_cond_broadcast(&st->cond);
    while (vrpc_srv_stream_run_sent_locked(st))
        ;
    return true;
}

bool vrpc_srv_stream_out_batch_locked(struct vrpc_server_stream *st) { return out_batch_min_locked(st, 2); }

bool vrpc_srv_stream_out_poller_locked(struct vrpc_server_stream *st)
{
    /* a large message (offer, READ) and a full quota (wait_room) need the
     * task; the buffers: out_batch_send takes them without waiting here,
     * so only go with a batch's worth to spare */
    if (!st->out_head || st->sending || st->out_head->lb ||
        vrpc_pool_avail(st->conn->s->send_pool) < OUT_BATCH)
        return false;
    return out_batch_min_locked(st, 1);
}

bool vrpc_srv_stream_run_sent_locked(struct vrpc_server_stream *st)
{
    struct srv_out *o = st->sent_head;
    if (!o)
        return false;
    if (!(st->sent_head = o->next))
        st->sent_tail = NULL;
    /* counted out just before its callback, as out_one does */
    __atomic_store_n(&st->nqueued, st->nqueued - 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&st->lock);
    o->cb(st, o->rc, o->arg); /* may finish st (the task's reference keeps the object) */
    pthread_mutex_lock(&st->lock);
    vrpc_srv_stream_out_put_locked(st, o);
    pthread_cond_broadcast(&st->cond); /* a finish on another thread waits for the list */
    return true;
}

/* A message too large for one frame: it goes by rendezvous. */
static bool large(const struct vrpc_server_stream *st, size_t size)
{
    return VRPC_WIRE_HDR_LEN + size > vrpc_ep_eager_size(st->conn->b.ep);
}

static bool write_type_ok(const struct vrpc_server_stream *st, const ProtobufCMessage *msg)
{
    return st && msg && msg->descriptor == st->call->method->output;
}

/* The checks every write makes: 0 and the packed size, or -EINVAL. */
static int write_check(struct vrpc_server_stream *st, const ProtobufCMessage *msg, size_t *size)
{
    if (!write_type_ok(st, msg))
        return -EINVAL;
    size_t n = vrpc_pb_packed_size(msg);
    struct sconn *c = st->conn;
    if (n > c->b.max_payload)
        return -EINVAL; /* above the client's limit (or, without large messages, one frame) */
    *size = n;
    return 0;
}

/* Wait for the turn of a blocking write: the queued async writes out,
 * window open (lock held). 0, -ECONNRESET, -ETIMEDOUT. */
static int write_turn_locked(struct vrpc_server_stream *st)
{
    for (;;) {
        if (st->ended || st->finished)
            return -ECONNRESET;
        if (!st->out_head && !st->sending && st->send_avail > 0)
            return 0;
        if (st->sent_head && vrpc_srv_stream_on_task(st)) {
            vrpc_srv_stream_run_sent_locked(st); /* earlier writes' callbacks first */
            continue;
        }
        if (st->out_head && !st->sending && st->send_avail > 0 && vrpc_srv_stream_on_task(st)) {
            vrpc_srv_stream_out_one_locked(st); /* the task is this thread: flush here */
            continue;
        }
        if (wait_locked(st, st->call->deadline_ns))
            return -ETIMEDOUT;
    }
}

int vrpc_server_stream_write(struct vrpc_server_stream *st, const ProtobufCMessage *msg)
{
    size_t size;
    if (vrpc_rpc_on_poller) /* it may wait for window or room the poller brings */
        return -EWOULDBLOCK;
    int rc = write_check(st, msg, &size);
    if (rc)
        return rc;
    uint8_t stackbuf[1024];
    struct vrpc_buf *lb = NULL;
    uint8_t *bytes = stackbuf;
    bool big = large(st, size);
    if (big) {
        char why[VRPC_STATUS_MSG_MAX];
        if (vrpc_rndv_buf(st->call->s->tp, st->call->s->o.max_pinned, size, &lb, why, sizeof(why)))
            return -ENOMEM;
        bytes = lb->data;
    } else if (size > sizeof(stackbuf) && !(bytes = malloc(size))) {
        return -ENOMEM;
    }
    vrpc_pb_pack_sized(msg, bytes);
    pthread_mutex_lock(&st->lock);
    if (st->kind == VRPC_METHOD_CLIENT_STREAMING && st->nout >= 1)
        rc = -EINVAL;
    else
        rc = write_turn_locked(st);
    if (rc == 0) {
        st->send_avail--;
        st->nout++;
        st->md_sent = true;
        st->sending = true;
    }
    pthread_mutex_unlock(&st->lock);
    if (rc == 0) {
        if (lb)
            rc = vrpc_srv_stream_send_large(st, lb, (uint32_t)size), lb = NULL;
        else
            rc = vrpc_srv_stream_send_bytes(st, bytes, (uint32_t)size);
        pthread_mutex_lock(&st->lock);
        st->sending = false;
        pthread_cond_broadcast(&st->cond);
        if (st->out_head && st->send_avail > 0)
            vrpc_srv_stream_kick_locked(st, NULL);
        pthread_mutex_unlock(&st->lock);
    }
    if (lb) /* not sent: still ours */
        vrpc_lbuf_put(lb);
    else if (!big && bytes != stackbuf)
        free(bytes);
    return rc;
}

/* The node of a write above SRV_OUT_SMALL bytes (no lock held): one of
 * out_spare that fits it, else a new one; a large message's with its large
 * buffer. NULL: out of memory. */
static struct srv_out *out_node_get(struct vrpc_server_stream *st, size_t size, bool big)
{
    struct srv_out *o = NULL;
    if (!big) {
        pthread_mutex_lock(&st->lock);
        o = out_spare_take_locked(st, size);
        pthread_mutex_unlock(&st->lock);
    }
    if (!o) {
        if (!(o = malloc(sizeof(*o) + (big ? 0 : size))))
            return NULL;
        o->cap = big ? 0 : (uint32_t)size;
    }
    o->lb = NULL;
    if (big) {
        char why[VRPC_STATUS_MSG_MAX];
        if (vrpc_rndv_buf(st->call->s->tp, st->call->s->o.max_pinned, size, &o->lb, why, sizeof(why))) {
            free(o);
            return NULL;
        }
    }
    return o;
}

int vrpc_server_stream_write_async(struct vrpc_server_stream *st, const ProtobufCMessage *msg,
                                   vrpc_server_stream_write_cb cb, void *arg)
{
    size_t size;
    int rc;
    if (!write_type_ok(st, msg) || !cb)
        return -EINVAL;
    /* No room: refused before anything is sized, allocated or packed (a
     * writer refilling from its callbacks meets this once per message
     * when the window is what limits it). The count is read without the
     * lock (only this test, and nqueued is only stored under it): a full one
     * is confirmed under the lock, so a stale value never refuses a write
     * that has room. */
    if (__atomic_load_n(&st->nqueued, __ATOMIC_RELAXED) >= VRPC_STREAM_ASYNC_WRITES_MAX) {
        pthread_mutex_lock(&st->lock);
        rc = st->ended || st->finished ? -ECONNRESET : st->nqueued >= VRPC_STREAM_ASYNC_WRITES_MAX ? -EAGAIN : 0;
        pthread_mutex_unlock(&st->lock);
        if (rc)
            return rc;
    }
    if ((rc = write_check(st, msg, &size)))
        return rc;
    bool big = large(st, size);
    bool small = !big && size <= SRV_OUT_SMALL;
    uint8_t packed[SRV_OUT_SMALL];
    struct srv_out *o = NULL;
    if (small) { /* packed here; its node comes from out_free under the lock */
        vrpc_pb_pack_sized(msg, packed);
    } else {
        if (!(o = out_node_get(st, size, big)))
            return -ENOMEM;
        vrpc_pb_pack_sized(msg, big ? o->lb->data : o->data);
    }
    pthread_mutex_lock(&st->lock);
    if (st->ended || st->finished)
        rc = -ECONNRESET;
    else if (st->kind == VRPC_METHOD_CLIENT_STREAMING && st->nout >= 1)
        rc = -EINVAL;
    else if (st->nqueued >= VRPC_STREAM_ASYNC_WRITES_MAX)
        rc = -EAGAIN;
    if (rc == 0 && small) {
        if ((o = st->out_free))
            st->out_free = o->next;
        else if ((o = malloc(sizeof(*o) + SRV_OUT_SMALL))) /* (the stream's first writes only) */
            o->cap = SRV_OUT_SMALL, o->lb = NULL;
        else
            rc = -ENOMEM;
        if (o)
            memcpy(o->data, packed, size);
    }
    if (rc == 0) {
        o->next = NULL;
        o->cb = cb;
        o->arg = arg;
        o->len = (uint32_t)size;
        if (st->out_tail)
            st->out_tail->next = o;
        else
            st->out_head = o;
        st->out_tail = o;
        __atomic_store_n(&st->nqueued, st->nqueued + 1, __ATOMIC_RELAXED);
        st->nout++;
        st->md_sent = true;
        if (!st->sending && st->send_avail > 0)
            vrpc_srv_stream_kick_locked(st, NULL);
    }
    pthread_mutex_unlock(&st->lock);
    if (rc && o) { /* (a small write takes its node only when accepted) */
        vrpc_lbuf_put(o->lb);
        o->lb = NULL;
        pthread_mutex_lock(&st->lock);
        vrpc_srv_stream_out_put_locked(st, o);
        pthread_mutex_unlock(&st->lock);
    }
    return rc;
}

int vrpc_server_stream_send_metadata(struct vrpc_server_stream *st, const struct vrpc_metadata *md, size_t n)
{
    if (!st)
        return -EINVAL;
    long sz = vrpc_wire_md_size(md, n);
    struct sconn *c = st->conn;
    if (sz < 0 || VRPC_WIRE_HDR_LEN + (uint64_t)sz > vrpc_ep_eager_size(c->b.ep))
        return -EINVAL;
    pthread_mutex_lock(&st->lock);
    int rc = st->md_sent ? -EALREADY : !vrpc_srv_stream_wire_enter_locked(st) ? -ECONNRESET : 0;
    st->md_sent = true;
    pthread_mutex_unlock(&st->lock);
    if (rc)
        return rc;
    struct vrpc_buf *b = vrpc_srv_conn_buf(c, true);
    rc = -ECONNRESET;
    if (b) {
        struct vrpc_wire_hdr h = {
            .version = VRPC_WIRE_VERSION, .type = VRPC_FT_HEADERS, .request_id = st->id, .md_len = (uint32_t)sz};
        vrpc_wire_hdr_encode(b->data, &h);
        vrpc_wire_md_encode(b->data + VRPC_WIRE_HDR_LEN, md, n);
        rc = vrpc_srv_conn_send(c, b, VRPC_WIRE_HDR_LEN + (uint32_t)sz) ? -ECONNRESET : 0;
    }
    pthread_mutex_lock(&st->lock);
    vrpc_srv_stream_wire_leave_locked(st);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* Would finish_wait_locked wait (lock held)? A finish on a poller must not:
 * writes queued or being sent (the wait for room, a large message's READ),
 * a large client message being read (it ends on the poller), another
 * thread's frame or callback. */
static bool finish_would_wait_locked(const struct vrpc_server_stream *st)
{
    bool self = vrpc_srv_stream_on_task(st);
    return st->sending || (st->out_head && !st->ended) || (st->sent_head && !self) || st->rd_busy ||
           st->wire_busy || (st->in_cb && !self);
}

/* Finish: the queued writes out first (unless the stream ended), then no
 * callback may be running on another thread (lock held; returns with it). */
static void finish_wait_locked(struct vrpc_server_stream *st)
{
    bool self = vrpc_srv_stream_on_task(st);
    while (st->out_head || st->sending || st->sent_head) {
        if (st->sent_head && self) { /* the callbacks of writes already out, first */
            vrpc_srv_stream_run_sent_locked(st);
            continue;
        }
        if (!st->sending && !st->sent_head && (st->ended || (self && st->send_avail > 0))) {
            if (self || st->ended)
                vrpc_srv_stream_out_one_locked(st); /* ended: fails it (-ECONNRESET) */
            continue;
        }
        if (wait_locked(st, st->call->deadline_ns) && !st->ended) {
            pthread_mutex_unlock(&st->lock); /* the deadline ends it (the timer may be a tick late) */
            vrpc_srv_stream_end(st, st->gen, VRPC_DEADLINE_EXCEEDED, "deadline exceeded while writing");
            pthread_mutex_lock(&st->lock);
        }
    }
    st->finished = true;
    /* a large message's read ends on the poller; a WINDOW going out must
     * not follow our RESPONSE */
    while ((st->in_cb && !self) || st->rd_busy || st->wire_busy)
        pthread_cond_wait(&st->cond, &st->lock);
    vrpc_srv_stream_drop_in_locked(st);
    vrpc_srv_stream_trim_locked(st); /* the object may serve streams of other sizes next */
    st->open = false;
}

/* The final RESPONSE: status, message, trailing metadata. */
static int send_end(struct sconn *c, uint64_t id, enum vrpc_code code, const char *msg, const struct vrpc_metadata *md,
                    size_t n, long mdsz)
{
    struct vrpc_buf *b = vrpc_srv_conn_buf(c, true);
    if (!b)
        return -ECONNRESET;
    uint32_t room = vrpc_ep_eager_size(c->b.ep) - VRPC_WIRE_HDR_LEN;
    uint32_t ml = msg ? (uint32_t)strnlen(msg, VRPC_STATUS_MSG_MAX - 1) : 0;
    if (mdsz < 0 || (uint64_t)mdsz + ml > room)
        mdsz = 0, n = 0;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_RESPONSE,
                              .status = (uint32_t)code,
                              .request_id = id,
                              .md_len = (uint32_t)mdsz,
                              .payload_len = ml};
    vrpc_wire_hdr_encode(b->data, &h);
    if (n)
        vrpc_wire_md_encode(b->data + VRPC_WIRE_HDR_LEN, md, n);
    if (ml)
        memcpy(b->data + VRPC_WIRE_HDR_LEN + mdsz, msg, ml);
    return vrpc_srv_conn_send(c, b, VRPC_WIRE_HDR_LEN + (uint32_t)mdsz + ml) ? -ECONNRESET : 0;
}

int vrpc_server_stream_finish(struct vrpc_server_stream *st, enum vrpc_code code, const char *msg,
                              const struct vrpc_metadata *md, size_t n)
{
    if (!st)
        return -EINVAL;
    if ((unsigned)code >= VRPC_CODE_COUNT)
        code = VRPC_UNKNOWN;
    long mdsz = md || n ? vrpc_wire_md_size(md, n) : 0;
    char why[VRPC_STATUS_MSG_MAX];
    pthread_mutex_lock(&st->lock);
    if (vrpc_rpc_on_poller && finish_would_wait_locked(st)) {
        pthread_mutex_unlock(&st->lock);
        return -EWOULDBLOCK;
    }
    finish_wait_locked(st);
    uint32_t nout = st->nout;
    pthread_mutex_unlock(&st->lock);
    if (st->kind == VRPC_METHOD_CLIENT_STREAMING && code == VRPC_OK && nout != 1) {
        snprintf(why, sizeof(why), "client-streaming handler finished OK with %u responses written (1 needed)", nout);
        code = VRPC_INTERNAL, msg = why, mdsz = 0, n = 0;
    }
    if (mdsz < 0)
        code = VRPC_INTERNAL, msg = "handler set invalid trailing metadata", n = 0;
    struct vrpc_server_call *call = st->call;
    struct sconn *sc = st->conn; /* read first: a failed claim may free call and st */
    int rc = vrpc_srv_call_claim(call);
    if (rc) {                     /* ended for the server already (its RESPONSE is out): only let go */
        vrpc_srv_sconn_unref(sc); /* the stream's reference (vrpc_srv_stream_release_conn) */
        return -ECONNRESET;
    }
    uint64_t id = call->req_id;
    struct sconn *c = vrpc_srv_finish_call(call, code);
    rc = vrpc_conn_is_dead(&c->b) ? -ECONNRESET : send_end(c, id, code, msg, md, n, mdsz);
    vrpc_srv_answered(c);
    vrpc_srv_stream_release_conn(st);
    return mdsz < 0 ? -EINVAL : rc;
}

void vrpc_server_stream_set_ctx(struct vrpc_server_stream *st, void *ctx) { st->ctx = ctx; }
void *vrpc_server_stream_ctx(const struct vrpc_server_stream *st) { return st->ctx; }
const struct vrpc_method_desc *vrpc_server_stream_method(const struct vrpc_server_stream *st)
{
    return st->call->method;
}
int64_t vrpc_server_stream_deadline(const struct vrpc_server_stream *st) { return st->call->deadline_ns; }
bool vrpc_server_stream_is_cancelled(const struct vrpc_server_stream *st)
{
    return __atomic_load_n(&st->call->cancelled, __ATOMIC_ACQUIRE);
}
int vrpc_server_stream_metadata_get(const struct vrpc_server_stream *st, const char *key, const void **value,
                                    size_t *value_len)
{
    return vrpc_server_call_metadata_get(st->call, key, value, value_len);
}
