/* The client's streams, the API of include/verbrpc/stream.h: start (connect,
 * slot, REQUEST|STREAM), writes within the server's window, half-close,
 * synchronous reads that return window as they consume, finish, cancel,
 * metadata and destroy. The receiving side and the stream task are in
 * rpc/stream_recv.c (rpc/stream_internal.h says who touches what). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/clock.h"
#include "rpc/status.h"
#include "rpc/lb.h"
#include "rpc/stream_internal.h"
#include "rpc/spare.h"

#define STREAM_ARENA_INITIAL 4096u

/* ---- plumbing shared with rpc/stream_recv.c -------------------------------- */

struct smsg *vrpc_stream_node_locked(struct vrpc_stream *s, uint32_t len)
{
    struct smsg *n;
    VRPC_SPARE_GET(struct smsg, &s->spare, len, n);
    return n;
}

int vrpc_stream_unpack(struct vrpc_stream *s, const ProtobufCMessageDescriptor *d, const struct smsg *n,
                       ProtobufCMessage **out)
{
    vrpc_arena_reset(&s->arena);
    return vrpc_pb_unpack(d, n->data, n->len, 0, &s->arena, out);
}

int vrpc_stream_unpack_ref(struct vrpc_stream *s, const ProtobufCMessageDescriptor *d, struct smsg *n,
                           ProtobufCMessage **out)
{
    vrpc_arena_reset(&s->arena);
    return vrpc_pb_unpack_ref(d, n->data, n->len, 0, &s->arena, out);
}

/* While waiting for send room: -EPIPE once the stream ended, -ENOTCONN once
 * its connection died, -ENOBUFS after VRPC_STREAM_ROOM_WAIT_MS, else 0 (after
 * a short nap). On a poller (vrpc_rpc_on_poller) -EAGAIN at once: the room
 * it would wait for comes through that poller, so what needs it is left to
 * the stream's task. */
static int room_wait(struct vrpc_stream *s, int64_t *end)
{
    if (vrpc_rpc_on_poller)
        return -EAGAIN;
    int64_t now = vrpc_now_ns();
    if (!*end)
        *end = now + (int64_t)VRPC_STREAM_ROOM_WAIT_MS * 1000000;
    pthread_mutex_lock(&s->mu);
    bool ended = s->ended;
    pthread_mutex_unlock(&s->mu);
    if (ended)
        return -EPIPE;
    if (vrpc_conn_is_dead(&s->c->b))
        return -ENOTCONN;
    if (now >= *end)
        return -ENOBUFS;
    struct timespec nap = {0, 50000};
    nanosleep(&nap, NULL);
    return 0;
}

int vrpc_stream_buf(struct vrpc_stream *s, bool msg, struct vrpc_buf **out)
{
    struct vrpc_pool *pool = s->ch->send_pool;
    const struct vrpc_channel_opts *o = &s->ch->o;
    uint32_t reserve = msg ? (o->max_outstanding + o->max_queued + 64) / 4 : 0; /* channel.c's pool size */
    int64_t end = 0;
    int rc;
    for (;;) {
        struct vrpc_buf *b = vrpc_pool_avail(pool) > reserve ? vrpc_pool_get(pool) : NULL;
        if (b) {
            *out = b;
            return 0;
        }
        if ((rc = room_wait(s, &end)))
            return rc;
    }
}

int vrpc_stream_send_buf(struct vrpc_stream *s, struct vrpc_buf *b, uint32_t len)
{
    int64_t end = 0;
    int rc = vrpc_conn_is_dead(&s->c->b) ? -ENOTCONN : vrpc_ep_send(s->c->b.ep, b, len, 0, 0, 0);
    while (rc == -EAGAIN && !(rc = room_wait(s, &end)))
        rc = vrpc_ep_send(s->c->b.ep, b, len, 0, 0, 0);
    if (rc)
        vrpc_pool_put(b);
    return rc;
}

int vrpc_stream_send_list(struct vrpc_stream *s, const struct vrpc_send_wr *wrs, unsigned n, unsigned *sent)
{
    int64_t end = 0;
    unsigned done = 0, k = 0;
    int rc = vrpc_conn_is_dead(&s->c->b) ? -ENOTCONN : 0;
    while (!rc && done < n) {
        rc = vrpc_ep_send_list(s->c->b.ep, wrs + done, n - done, 0, &k);
        done += k;
        if (rc == -EAGAIN) /* the credit queue is full: wait as send_buf does, then the rest */
            rc = room_wait(s, &end);
    }
    for (unsigned i = done; i < n; i++)
        vrpc_pool_put(wrs[i].buf);
    *sent = done;
    return rc;
}

int vrpc_stream_send(struct vrpc_stream *s, uint8_t type, uint16_t flags, const void *payload, uint32_t len)
{
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = type, .flags = flags, .request_id = s->id};
    struct vrpc_buf *b;
    if (vrpc_conn_is_dead(&s->c->b))
        return -ENOTCONN;
    int rc = vrpc_stream_buf(s, type == VRPC_FT_MESSAGE, &b);
    if (rc)
        return rc;
    return vrpc_stream_send_buf(s, b, vrpc_rpc_frame_fill(b, &h, payload, len));
}

void vrpc_stream_fail(struct vrpc_stream *s, enum vrpc_code code, const char *why)
{
    /* an ended stream may be released, its channel gone: not even its slot */
    pthread_mutex_lock(&s->mu);
    bool ended = s->ended;
    pthread_mutex_unlock(&s->mu);
    if (ended || !s->slot || !vrpc_pending_decide(s->slot, s->gen))
        return;
    vrpc_status_set(&s->slot->st, code, "%s", why);
    if (!vrpc_conn_is_dead(&s->c->b)) {
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_CANCEL, .request_id = s->id};
        vrpc_rpc_send_simple(s->c->b.ep, s->ch->send_pool, &h, NULL, 0, false); /* best effort */
    }
    vrpc_ch_complete(s->ch, s->slot, s->gen, false);
}

/* An API call is done sending (s->mu held): the release may be due. The
 * stream's task releases an ended stream only once it has no users, so the
 * last user to leave must kick it (the task may have run, and found users,
 * while this one was sending). */
static void leave_locked(struct vrpc_stream *s)
{
    if (--s->users == 0 && s->ended)
        vrpc_stream_kick_locked(s, false);
}

bool vrpc_stream_window_locked(struct vrpc_stream *s, bool force)
{
    uint32_t thresh = s->rx_window / 4 ? s->rx_window / 4 : 1;
    if (s->ended || !s->rx_unreported || (!force && s->rx_unreported < thresh))
        return false;
    uint32_t k = s->rx_unreported;
    uint8_t le[VRPC_WIRE_WINDOW_LEN];
    vrpc_wire_window_encode(le, k);
    s->rx_unreported = 0;
    s->rx_allowed += k;
    s->users++;
    pthread_mutex_unlock(&s->mu);
    bool poller = vrpc_rpc_on_poller;
    int rc = vrpc_stream_send(s, VRPC_FT_WINDOW, 0, le, sizeof le);
    if (rc && !(poller && rc == -EAGAIN))
        vrpc_stream_fail(s, VRPC_UNAVAILABLE, "stream send failed (WINDOW)");
    pthread_mutex_lock(&s->mu);
    if (rc == -EAGAIN && poller) { /* no buffer or credit now: the task returns it (vrpc_stream_task_due_locked) */
        s->rx_unreported += k;
        s->rx_allowed -= k;
    }
    leave_locked(s); /* a reader's thread may be the last user of an ended stream */
    return !(rc == -EAGAIN && poller);
}

/* ---- start ------------------------------------------------------------------ */

static struct vrpc_stream *stream_new(struct vrpc_channel *ch, const struct vrpc_method_desc *m,
                                      const struct vrpc_stream_opts *o)
{
    struct vrpc_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->ch = ch;
    s->m = m;
    if (o && o->cbs) {
        s->has_cbs = true;
        s->cbs = *o->cbs;
        s->cb_on_poller = (o->call.flags & VRPC_CALL_CB_ON_POLLER) != 0;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    vrpc_arena_init(&s->arena, STREAM_ARENA_INITIAL, 0);
    s->rx_window = ch->o.stream_window;
    s->rx_allowed = s->rx_window;
    s->rd_spin_ns = ch->pend->spin ? ch->pend->spin_ns : 0; /* the latency mode's fixed window */
    s->rd_poller_cpu = ch->pend->poller_cpu;
    return s;
}

/* The stream could not open: it ends at once with st (its on_done runs). */
static void stream_refused(struct vrpc_stream *s, const struct vrpc_status *st)
{
    pthread_mutex_lock(&s->mu);
    s->st = *st;
    s->ended = true;
    s->rel_claimed = true; /* nothing to release */
    if (s->has_cbs)
        vrpc_stream_kick_locked(s, false); /* on_done */
    s->rel_done = true;
    pthread_mutex_unlock(&s->mu);
}

/* The REQUEST|STREAM frame of s. Its length. */
static uint32_t stream_request(struct vrpc_stream *s, const struct vrpc_stream_opts *o, long mdsz, int64_t deadline,
                               struct vrpc_buf *b)
{
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_REQUEST,
                              .flags = VRPC_FF_STREAM,
                              .method_id = s->m->id,
                              .request_id = s->id,
                              .md_len = (uint32_t)mdsz};
    if (deadline != VRPC_NO_DEADLINE) {
        int64_t left = deadline - vrpc_now_ns();
        h.flags |= VRPC_FF_DEADLINE;
        h.budget_us = left > 0 ? (uint64_t)(left / 1000) : 0;
    }
    if (mdsz)
        vrpc_wire_md_encode(b->data + VRPC_WIRE_HDR_LEN, o->call.md, o->call.md_count);
    vrpc_wire_hdr_encode(b->data, &h);
    return VRPC_WIRE_HDR_LEN + (uint32_t)mdsz;
}

/* Slot fields, publication and the REQUEST (the slot is reserved). */
static void stream_open(struct vrpc_stream *s, const struct vrpc_stream_opts *o, long mdsz, int64_t deadline)
{
    struct vrpc_channel *ch = s->ch;
    struct vrpc_pending_slot *slot = s->slot;
    /* Our own reference for the send below: once the stream is published a
     * connection loss may end and release it (its conn_unref) on the
     * poller, before this thread has sent its request. */
    struct vrpc_conn *c = s->c;
    conn_ref(c);
    s->gen = vrpc_pending_gen(slot);
    s->id = vrpc_wire_make_id(slot->index, s->gen);
    s->tx_allowed = s->c->stream_window;
    s->max_payload = s->c->b.max_payload;
    s->start_ns = vrpc_metrics_now_ns();
    slot->method = s->m;
    slot->cb = vrpc_ch_stream_slot_cb;
    slot->cb_arg = s;
    slot->cb_ch = ch;
    slot->deadline_ns = deadline;
    slot->start_ns = s->start_ns;
    slot->out.zc = 0;
    slot->qent = NULL;
    slot->resp_md = NULL;
    pthread_mutex_lock(&ch->slock);
    ch->streams[slot->index] = s;
    pthread_mutex_unlock(&ch->slock);
    open_call(ch, slot, s->id);
    if (o && o->call.call_id)
        __atomic_store_n(o->call.call_id, s->id, __ATOMIC_RELEASE);
    int rc = -ENOBUFS;
    bool wait = !vrpc_rpc_on_poller; /* (started from a callback on a poller: never waits) */
    struct vrpc_buf *b = vrpc_rpc_buf_get(ch->send_pool, wait);
    if (b) {
        uint32_t flen = stream_request(s, o, mdsz, deadline, b);
        rc = vrpc_conn_dead_rmw(&c->b) ? -ENOTCONN : 0;
        if (!rc)
            rc = vrpc_rpc_send(c->b.ep, b, flen, wait);
        else
            vrpc_pool_put(b);
    }
    if (rc) {
        if (vrpc_pending_decide(slot, s->gen)) {
            vrpc_status_set_unprocessed(&slot->st, VRPC_UNAVAILABLE, "send failed: %s", strerror(-rc));
            vrpc_ch_complete(ch, slot, s->gen, false);
        }
        slot_seen(slot, s->gen);
    }
    slot_drop(slot, s->gen); /* the owner's set-up hold */
    check_expired(ch, deadline, s->id);
    conn_unref(c);
}

/* A channel over many servers: the policy picks one server for the whole
 * stream (hash_key as for a call), whose subchannel the stream holds until
 * it is freed. -EAGAIN when no server is known. */
static int stream_start_lb(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const struct vrpc_stream_opts *o,
                           struct vrpc_stream **out)
{
    uint64_t key;
    bool has_key = vrpc_lb_call_key(o ? &o->call : NULL, &key);
    struct vrpc_subch *sub = vrpc_lb_sub_get(ch->lb, has_key, key);
    if (!sub)
        return -EAGAIN;
    int rc = vrpc_stream_start(vrpc_lb_sub_channel(sub), m, o, out);
    if (rc) {
        vrpc_lb_sub_put(ch->lb, sub);
        return rc;
    }
    (*out)->lb = ch->lb;
    (*out)->lb_sub = sub;
    return 0;
}

int vrpc_stream_start(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const struct vrpc_stream_opts *o,
                      struct vrpc_stream **out)
{
    struct vrpc_status st;
    long mdsz = 0;

    if (!ch || !m || !out || m->kind == VRPC_METHOD_UNARY || (o && o->cbs && !o->cbs->on_done))
        return -EINVAL;
    if (ch->lb)
        return stream_start_lb(ch, m, o, out);
    if (o && o->call.md_count && (mdsz = vrpc_wire_md_size(o->call.md, o->call.md_count)) < 0)
        return -EINVAL;
    if (vrpc_channel_state(ch) == VRPC_CHANNEL_SHUTDOWN)
        return -ESHUTDOWN;
    struct vrpc_stream *s = stream_new(ch, m, o);
    if (!s)
        return -ENOMEM;
    int64_t deadline = vrpc_ch_call_deadline(ch, o ? &o->call : NULL);
    int rc = vrpc_ch_get_conn(ch, deadline, false, &s->c);
    if (rc) {
        vrpc_ch_conn_refused(ch, rc, &st);
        s->c = NULL;
    } else if (!(s->c->b.peer_features & VRPC_FEAT_STREAM)) {
        vrpc_status_set(&st, VRPC_UNIMPLEMENTED, "the server does not serve streams (method %s)", m->full_name);
        rc = -ENOTSUP;
    } else if (VRPC_WIRE_HDR_LEN + (size_t)mdsz > vrpc_ep_eager_size(s->c->b.ep)) {
        vrpc_status_set(&st, VRPC_RESOURCE_EXHAUSTED, "stream metadata of %ld bytes does not fit one frame", mdsz);
        rc = -EMSGSIZE;
    } else if ((rc = vrpc_rpc_on_poller ? vrpc_pending_try_alloc(ch->pend, s->c, &s->slot)
                                        : vrpc_pending_alloc(ch->pend, deadline, s->c, &s->slot))) {
        s->slot = NULL;
        vrpc_status_set(&st, rc == -ETIMEDOUT ? VRPC_DEADLINE_EXCEEDED : VRPC_UNAVAILABLE, "%s",
                        rc == -ETIMEDOUT ? "deadline exceeded waiting for a call credit"
                        : rc == -EAGAIN  ? "no call credit free (a stream started on a poller does not wait for one)"
                                         : "channel is shutting down");
    }
    if (rc) {
        if (s->c)
            conn_unref(s->c);
        s->c = NULL;
        call_metrics(ch, m, st.code, 0);
        stream_refused(s, &st);
    } else {
        stream_open(s, o, mdsz, deadline);
    }
    *out = s;
    return 0;
}

/* ---- writes ---------------------------------------------------------------- */

/* The packed size of msg, or a negative errno for a message this stream
 * cannot send. Not s->c: the stream may end and be released (its
 * connection freed) at any time before the caller is counted in users. */
static long write_size(const struct vrpc_stream *s, const ProtobufCMessage *msg)
{
    if (!msg || msg->descriptor != s->m->input)
        return -EINVAL;
    size_t plen = vrpc_pb_packed_size(msg);
    if (!s->slot) /* never opened: the write fails as ended */
        return (long)plen;
    if (plen > s->max_payload) /* the server's limit, or one frame without large messages */
        return -EINVAL;
    return (long)plen;
}

/* Checks common to both writes (s->mu held): 0 or the errno. */
static int write_check_locked(struct vrpc_stream *s)
{
    if (s->ended)
        return stream_ended_rc(s);
    if (s->half_closed)
        return -EPIPE;
    if (s->m->kind == VRPC_METHOD_SERVER_STREAMING && s->writes >= 1)
        return -EINVAL;
    return 0;
}

int vrpc_stream_write(struct vrpc_stream *s, const ProtobufCMessage *msg)
{
    if (!s)
        return -EINVAL;
    if (vrpc_rpc_on_poller) /* it may wait for window the poller brings */
        return -EWOULDBLOCK;
    long plen = write_size(s, msg);
    if (plen < 0)
        return (int)plen;
    pthread_mutex_lock(&s->mu);
    int rc;
    while (!(rc = write_check_locked(s)) && (s->tx.head || s->tx_busy || s->tx_sent >= s->tx_allowed))
        pthread_cond_wait(&s->cond, &s->mu);
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    s->writes++;
    s->tx_sent++;
    s->users++;
    pthread_mutex_unlock(&s->mu);
    struct vrpc_wire_hdr h = {
        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_MESSAGE, .request_id = s->id, .payload_len = (uint32_t)plen};
    bool large = VRPC_WIRE_HDR_LEN + (size_t)plen > vrpc_ep_eager_size(s->c->b.ep);
    struct vrpc_buf *b = NULL;
    if (large) {
        rc = vrpc_stream_write_large(s, msg, NULL, (uint32_t)plen);
    } else if (!(rc = vrpc_stream_buf(s, true, &b))) {
        vrpc_wire_hdr_encode(b->data, &h);
        vrpc_pb_pack_sized(msg, b->data + VRPC_WIRE_HDR_LEN);
        rc = vrpc_stream_send_buf(s, b, VRPC_WIRE_HDR_LEN + (uint32_t)plen);
    }
    if (rc) {
        vrpc_stream_fail(s, VRPC_UNAVAILABLE, "stream send failed");
        pthread_mutex_lock(&s->mu);
        rc = rc == -ETIMEDOUT || (s->ended && stream_ended_rc(s) == -ETIMEDOUT) ? -ETIMEDOUT : -EPIPE;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    leave_locked(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int vrpc_stream_write_async(struct vrpc_stream *s, const ProtobufCMessage *msg, vrpc_stream_write_cb cb, void *arg)
{
    if (!s || !cb)
        return -EINVAL;
    long plen = write_size(s, msg);
    if (plen < 0)
        return (int)plen;
    pthread_mutex_lock(&s->mu);
    int rc = write_check_locked(s);
    if (!rc && s->tx.n + s->tx_busy >= VRPC_STREAM_ASYNC_WRITES_MAX)
        rc = -EAGAIN;
    struct smsg *n = rc ? NULL : vrpc_stream_node_locked(s, (uint32_t)plen);
    if (!rc && !n)
        rc = -ENOMEM;
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    /* packed under mu: a concurrent write of the same stream is the
     * caller's error anyway, and the node is not yet visible */
    n->len = (uint32_t)vrpc_pb_pack_sized(msg, n->data);
    n->cb = cb;
    n->arg = arg;
    s->writes++;
    smq_push(&s->tx, n);
    if (s->tx_sent < s->tx_allowed)
        vrpc_stream_kick_locked(s, false);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int vrpc_stream_close_send(struct vrpc_stream *s)
{
    if (!s)
        return -EINVAL;
    pthread_mutex_lock(&s->mu);
    int rc = s->ended ? -EPIPE : s->half_closed ? -EALREADY : 0;
    if (!rc) {
        s->half_closed = true;
        if (s->tx.head || s->tx_busy || vrpc_rpc_on_poller) { /* after the queued writes, or
                                                                   not to wait on a poller: the task sends it */
            vrpc_stream_kick_locked(s, false);
        } else {
            s->hc_sent = true;
            s->users++;
            pthread_mutex_unlock(&s->mu);
            if (vrpc_stream_send(s, VRPC_FT_HALF_CLOSE, 0, NULL, 0))
                vrpc_stream_fail(s, VRPC_UNAVAILABLE, "stream send failed (HALF_CLOSE)");
            pthread_mutex_lock(&s->mu);
            leave_locked(s);
        }
    }
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- reads and the end ----------------------------------------------------- */

/* The reader gives back what it consumed (s->mu held): the nodes to the
 * spare list, the count to rx_unreported, and window if enough was. */
static void rd_flush_locked(struct vrpc_stream *s)
{
    struct smsg *n;
    while ((n = smq_pop(&s->rd_used)))
        spare_put_locked(s, n);
    s->rx_unreported += s->rd_consumed;
    s->rd_consumed = 0;
    vrpc_stream_window_locked(s, false);
    if (s->ended && !s->users)
        vrpc_stream_kick_locked(s, false);
}

/* Before sleeping for more, the reader watches rx_seq for the latency
 * mode's fixed window (the synchronous caller's, vrpc_pending.spin_ns; none
 * with no_spin, or on the CPU of a pinned poller, as vrpc_pending_wait):
 * on a busy stream the next message usually comes sooner than a futex
 * sleep and wake-up would take. It yields between looks (about every
 * microsecond): the threads that bring the next message (the poller, the
 * server) may need this CPU, and a reader that spun without yielding
 * halved the rate on 2 loaded CPUs (rpc_bench_stream oneway_sync_s1_32B,
 * 0.12 of the transport against 0.24 without spinning and 0.50 yielding;
 * with idle CPUs a yield returns at once). True if something came. */
bool vrpc_stream_spin(const struct vrpc_stream *s, uint32_t seq, uint64_t max_ns)
{
    uint64_t win = s->rd_spin_ns < max_ns ? s->rd_spin_ns : max_ns;
    if (!win || (s->rd_poller_cpu >= 0 && sched_getcpu() == s->rd_poller_cpu))
        return false;
    return vrpc_rpc_watch(&s->rx_seq, seq, win);
}

/* The reader takes every received message under one lock acquisition
 * (into s->rd, its own) and reads them without it; what it consumed goes
 * back at its next visit, or once a quarter of the window was consumed, so
 * the server's window returns as before. The poller and the reader thus
 * meet on s->mu about once per batch, not twice per message. */
int vrpc_stream_read(struct vrpc_stream *s, ProtobufCMessage **msg)
{
    if (!s || !msg || s->has_cbs)
        return -EINVAL;
    if (vrpc_rpc_on_poller)
        return -EWOULDBLOCK;
    if (s->rd_last) { /* the previous message is the caller's no longer */
        smq_push(&s->rd_used, s->rd_last);
        s->rd_last = NULL;
    }
    struct smsg *n = smq_pop(&s->rd);
    if (!n) {
        pthread_mutex_lock(&s->mu);
        rd_flush_locked(s);
        if (!s->rx.head && !s->ended) {
            s->rd_seq = s->rx_seq;
            pthread_mutex_unlock(&s->mu);
            vrpc_stream_spin(s, s->rd_seq, UINT64_MAX); /* its own thread */
            pthread_mutex_lock(&s->mu);
        }
        while (!s->rx.head && !s->ended)
            pthread_cond_wait(&s->cond, &s->mu);
        s->rd = s->rx;
        s->rx = (struct smq){0};
        n = smq_pop(&s->rd);
        pthread_mutex_unlock(&s->mu);
        if (!n)
            return -ENODATA;
    }
    int rc = vrpc_stream_unpack_ref(s, s->m->output, n, msg);
    s->rd_last = n; /* *msg may point into it: kept until the next read */
    uint32_t thresh = s->rx_window / 4 ? s->rx_window / 4 : 1;
    if (++s->rd_consumed >= thresh) {
        pthread_mutex_lock(&s->mu);
        rd_flush_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
    if (rc) {
        vrpc_stream_fail(s, VRPC_INTERNAL, "a stream message does not decode as its type");
        return -ENODATA;
    }
    return 0;
}

/* finish: drop what was not read (its window returns; a client-streaming
 * method's response stays), s->mu held. */
static void drain_locked(struct vrpc_stream *s)
{
    bool keep = s->m->kind == VRPC_METHOD_CLIENT_STREAMING;
    s->draining = true;
    if (!s->has_cbs) { /* finish runs on the reader's side: its batch is dropped too */
        struct smsg *n;
        while ((n = smq_pop(&s->rd))) {
            spare_put_locked(s, n);
            s->rx_unreported++;
        }
        while ((n = smq_pop(&s->rd_used)))
            spare_put_locked(s, n);
        if (s->rd_last) /* finish: its message is over */
            spare_put_locked(s, s->rd_last);
        s->rd_last = NULL;
        s->rx_unreported += s->rd_consumed;
        s->rd_consumed = 0;
    }
    while (s->rx.head && !keep) {
        spare_put_locked(s, smq_pop(&s->rx));
        s->rx_unreported++;
    }
    vrpc_stream_window_locked(s, true);
}

int vrpc_stream_finish(struct vrpc_stream *s, ProtobufCMessage **resp, struct vrpc_status *st)
{
    if (!s)
        return VRPC_INVALID_ARGUMENT;
    if (vrpc_rpc_on_poller) { /* it waits for the end, which a poller brings */
        if (st)
            vrpc_status_set(st, VRPC_FAILED_PRECONDITION,
                            "vrpc_stream_finish from a callback that runs on a poller: it would block the poller");
        return VRPC_FAILED_PRECONDITION;
    }
    pthread_mutex_lock(&s->mu);
    bool hc = !s->half_closed && !s->ended;
    pthread_mutex_unlock(&s->mu);
    if (hc)
        vrpc_stream_close_send(s);
    pthread_mutex_lock(&s->mu);
    if (!s->has_cbs)
        drain_locked(s);
    while (!s->ended || (s->has_cbs && !s->done_delivered && !vrpc_stream_in_callback(s)))
        pthread_cond_wait(&s->cond, &s->mu);
    if (!s->has_cbs)
        drain_locked(s);
    struct vrpc_status out = s->st;
    struct smsg *n = NULL;
    if (resp && out.code == VRPC_OK && !s->has_cbs && s->m->kind == VRPC_METHOD_CLIENT_STREAMING)
        n = s->rx.head;
    pthread_mutex_unlock(&s->mu);
    if (n && vrpc_stream_unpack(s, s->m->output, n, resp))
        vrpc_status_set(&out, VRPC_INTERNAL, "the response does not decode as %s", s->m->output->name);
    else if (!n && resp && out.code == VRPC_OK && !s->has_cbs && s->m->kind == VRPC_METHOD_CLIENT_STREAMING)
        vrpc_status_set(&out, VRPC_INTERNAL, "the server sent no response message");
    if (st)
        *st = out;
    return out.code;
}

void vrpc_stream_cancel(struct vrpc_stream *s)
{
    if (s)
        vrpc_stream_fail(s, VRPC_CANCELLED, "cancelled by the client");
}

/* ---- metadata and destroy ---------------------------------------------------- */

static int md_find(const struct vrpc_metadata *md, int n, const char *key, const void **value, size_t *value_len)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(md[i].key, key) == 0) {
            if (value)
                *value = md[i].value;
            if (value_len)
                *value_len = md[i].value_len;
            return 0;
        }
    }
    return -ENOENT;
}

int vrpc_stream_initial_metadata_get(const struct vrpc_stream *s, const char *key, const void **value,
                                     size_t *value_len)
{
    if (!s || !key)
        return -EINVAL;
    struct vrpc_stream *w = (struct vrpc_stream *)s; /* the lock only */
    pthread_mutex_lock(&w->mu);
    int rc = md_find(s->imd, s->n_imd, key, value, value_len);
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int vrpc_stream_trailing_metadata_get(const struct vrpc_stream *s, const char *key, const void **value,
                                      size_t *value_len)
{
    if (!s || !key)
        return -EINVAL;
    struct vrpc_stream *w = (struct vrpc_stream *)s;
    pthread_mutex_lock(&w->mu);
    int rc = s->ended ? md_find(s->tmd, s->n_tmd, key, value, value_len) : -ENOENT;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

void vrpc_stream_free(struct vrpc_stream *s)
{
    struct smsg *n;
    while ((n = smq_pop(&s->rx)) || (n = smq_pop(&s->rx_hold)) || (n = smq_pop(&s->rd)) || (n = smq_pop(&s->rd_used)))
        free(n);
    free(s->rd_last);
    while ((n = s->spare)) {
        s->spare = n->next;
        free(n);
    }
    free(s->imd_buf);
    free(s->tmd_buf);
    if (s->lb_sub)
        vrpc_lb_sub_put(s->lb, s->lb_sub);
    vrpc_arena_fini(&s->arena);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cond);
    free(s);
}

void vrpc_stream_destroy(struct vrpc_stream *s)
{
    if (!s)
        return;
    vrpc_stream_cancel(s);
    pthread_mutex_lock(&s->mu);
    if (vrpc_stream_in_callback(s)) { /* the task frees it once released */
        s->free_on_return = true;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    while (!s->rel_done || s->task_sched)
        pthread_cond_wait(&s->cond, &s->mu);
    pthread_mutex_unlock(&s->mu);
    vrpc_stream_free(s);
}
