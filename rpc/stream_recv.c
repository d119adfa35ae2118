/* The client's streams, the receiving side: the poller's MESSAGE, HEADERS
 * and WINDOW entries, the stream's RESPONSE and end, and the stream task
 * that runs callbacks, sends async writes and returned window, and releases
 * the stream's slot and connection (rpc/stream_internal.h). The poller
 * copies bytes and wakes or submits; user code runs on it only for a stream
 * opened with VRPC_CALL_CB_ON_POLLER (poller_run). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/status.h"
#include "rpc/stream_internal.h"

void vrpc_ch_stream_slot_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    (void)st;
    (void)resp;
    (void)arg;
}

/* ---- the poller ----------------------------------------------------------- */

/* The stream a frame of c names, with ch->slock held (the caller unlocks),
 * or NULL with *err set for a protocol error (NULL, *err NULL: the stream
 * ended here, the frame crossed our CANCEL: dropped). unary: for a unary
 * call's id *unary is its slot and NULL returned without an error. */
static struct vrpc_stream *frame_stream(struct vrpc_channel *ch, struct vrpc_conn *c, const struct vrpc_wire_hdr *h,
                                        const char *what, struct vrpc_pending_slot **unary, const char **err)
{
    struct vrpc_pending_slot *slot = vrpc_pending_lookup(ch->pend, h->request_id);
    *err = NULL;
    if (unary)
        *unary = NULL;
    pthread_mutex_lock(&ch->slock);
    if (!slot || __atomic_load_n((struct vrpc_conn **)&slot->conn, __ATOMIC_ACQUIRE) != c ||
        ((uint32_t)__atomic_load_n(&slot->xfer, __ATOMIC_ACQUIRE) & VRPC_PEND_XFER_SEEN)) {
        *err = what;
        return NULL;
    }
    if (!slot_is_stream(slot)) {
        if (unary)
            *unary = slot;
        else
            *err = what;
        return NULL;
    }
    struct vrpc_stream *s = ch->streams[slot->index];
    if (!s || s->id != h->request_id)
        return NULL;
    return s;
}

/* A stream whose callbacks may run on the poller (VRPC_CALL_CB_ON_POLLER)
 * and whose task is not running: the poller claims the task's place
 * (task_sched) to deliver what it queued and send queued writes, after it
 * let go of ch->slock (poller_run). s->mu held. */
static bool poller_claim_locked(struct vrpc_stream *s)
{
    if (!s->cb_on_poller || s->task_sched || s->rel_done || s->free_on_return || s->ended)
        return false;
    s->task_sched = true;
    return true;
}

/* A received message into the stream (s->mu held): queued, or dropped
 * while finishing (its window returns). NULL or a protocol error; *oom:
 * no memory for it (the stream fails, the connection stays); *run: the
 * poller delivers it itself (poller_claim_locked). */
static const char *message_in_locked(struct vrpc_stream *s, const uint8_t *payload, uint32_t len, bool *oom,
                                     bool *run)
{
    if (s->rx_got >= s->rx_allowed)
        return "stream MESSAGE beyond the window";
    s->rx_got++;
    s->got_msg = true;
    if (s->ended)
        return NULL;
    if (s->draining && s->m->kind != VRPC_METHOD_CLIENT_STREAMING) {
        s->rx_unreported++;
        vrpc_stream_kick_locked(s, true);
        return NULL;
    }
    struct smsg *n = vrpc_stream_node_locked(s, len);
    if (!n) {
        *oom = true;
        return NULL;
    }
    memcpy(n->data, payload, len);
    n->len = len;
    if (s->large_busy) { /* in order: after the large one being read */
        smq_push(&s->rx_hold, n);
        return NULL;
    }
    smq_push(&s->rx, n);
    rx_signal_locked(s);
    if (s->has_cbs && !(*run = poller_claim_locked(s)))
        vrpc_stream_kick_locked(s, true);
    return NULL;
}

static void poller_run(struct vrpc_stream *s);

void vrpc_ch_on_message(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_conn *c = client_conn(b);
    struct vrpc_channel *ch = c->ch;
    const char *err;
    bool oom = false, run = false;

    if (h->flags & VRPC_FF_END) {
        vrpc_ch_protocol_error(c, "stream MESSAGE with END from a server", -EPROTO);
        return;
    }
    struct vrpc_stream *s = frame_stream(ch, c, h, "stream MESSAGE for a request id not in use", NULL, &err);
    if (s && (h->flags & VRPC_FF_RNDV)) {
        pthread_mutex_lock(&s->mu);
        bool beyond = s->rx_got >= s->rx_allowed;
        if (!beyond)
            s->rx_got++;
        pthread_mutex_unlock(&s->mu);
        err = beyond ? "stream MESSAGE beyond the window" : vrpc_ch_stream_large_in(s, h, body + h->md_len);
    } else if (s) {
        pthread_mutex_lock(&s->mu);
        err = message_in_locked(s, body + h->md_len, h->payload_len, &oom, &run);
        pthread_mutex_unlock(&s->mu);
        if (oom)
            vrpc_stream_fail(s, VRPC_RESOURCE_EXHAUSTED, "out of memory for a stream message");
    }
    if (!s && !err && (h->flags & VRPC_FF_RNDV)) /* ended here: the server's grant ends now */
        vrpc_ch_send_done(ch, c, h->request_id, VRPC_CANCELLED);
    pthread_mutex_unlock(&ch->slock);
    if (run) /* (s stays: its release needs the task's place, which we hold) */
        poller_run(s);
    if (err)
        vrpc_ch_protocol_error(c, err, -EPROTO);
}

/* A metadata block copied and decoded into buf / md (cap VRPC_MD_MAX):
 * the count, or -EPROTO / -ENOMEM. */
static int md_copy(const uint8_t *src, uint32_t len, uint8_t **buf, struct vrpc_metadata *md)
{
    uint8_t *p = malloc(len ? len : 1);
    if (!p)
        return -ENOMEM;
    memcpy(p, src, len);
    int n = vrpc_wire_md_decode(p, len, md, VRPC_MD_MAX);
    if (n < 0) {
        free(p);
        return n;
    }
    *buf = p;
    return n;
}

void vrpc_ch_on_headers(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_conn *c = client_conn(b);
    struct vrpc_channel *ch = c->ch;
    const char *err;
    struct vrpc_pending_slot *unary;

    struct vrpc_stream *s = frame_stream(ch, c, h, "HEADERS for a request id not in use", &unary, &err);
    if (s) {
        pthread_mutex_lock(&s->mu);
        if (s->got_headers || s->got_msg) {
            err = "HEADERS twice or after a stream MESSAGE";
        } else {
            s->got_headers = true;
            int n = md_copy(body, h->md_len, &s->imd_buf, s->imd);
            if (n == -EPROTO)
                err = "malformed metadata in HEADERS";
            s->n_imd = n > 0 ? n : 0;
        }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&ch->slock);
    if (err)
        vrpc_ch_protocol_error(c, err, -EPROTO);
    else if (unary) /* a unary call's initial metadata */
        vrpc_ch_unary_headers(c, unary, h, body);
}

void vrpc_ch_on_window(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body)
{
    struct vrpc_conn *c = client_conn(b);
    struct vrpc_channel *ch = c->ch;
    const char *err;
    uint32_t n;
    bool run = false;

    if (vrpc_wire_window_decode(body + h->md_len, h->payload_len, &n)) {
        vrpc_ch_protocol_error(c, "malformed WINDOW", -EPROTO);
        return;
    }
    struct vrpc_stream *s = frame_stream(ch, c, h, "WINDOW for a request id not in use or a unary call", NULL, &err);
    if (s) {
        pthread_mutex_lock(&s->mu);
        if (s->tx_allowed + n > VRPC_WIRE_WINDOW_SUM_MAX) {
            err = "WINDOW overflows the stream's window";
        } else {
            s->tx_allowed += n;
            pthread_cond_broadcast(&s->cond);
            if (s->tx.n && !(run = poller_claim_locked(s)))
                vrpc_stream_kick_locked(s, true);
        }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&ch->slock);
    if (run) /* the queued writes go from here */
        poller_run(s);
    if (err)
        vrpc_ch_protocol_error(c, err, -EPROTO);
}

void vrpc_ch_stream_on_response(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *slot,
                                const struct vrpc_wire_hdr *h, const uint8_t *md, const uint8_t *payload)
{
    uint32_t gen = vrpc_wire_id_gen(h->request_id);
    int n = 0;

    if (h->flags & VRPC_FF_RNDV) {
        vrpc_ch_protocol_error(c, "large-message RESPONSE ending a stream", -EPROTO);
        return;
    }
    pthread_mutex_lock(&ch->slock);
    struct vrpc_stream *s = ch->streams[slot->index];
    if (s && s->id == h->request_id && h->md_len) {
        pthread_mutex_lock(&s->mu);
        if (!s->ended && (n = md_copy(md, h->md_len, &s->tmd_buf, s->tmd)) > 0)
            s->n_tmd = n;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&ch->slock);
    if (n == -EPROTO) {
        vrpc_ch_protocol_error(c, "malformed trailing metadata in a RESPONSE", -EPROTO);
        return;
    }
    bool won = vrpc_pending_decide(slot, gen);
    if (won) {
        vrpc_status_set_bytes(&slot->st, (enum vrpc_code)h->status, payload, h->payload_len);
        if (h->flags & VRPC_FF_REFUSED) /* the server refused the stream unread */
            slot->st.flags = VRPC_STATUS_UNPROCESSED;
    }
    slot_seen(slot, gen);
    if (won)
        vrpc_ch_complete(ch, slot, gen, true);
}

void vrpc_ch_stream_end(struct vrpc_channel *ch, struct vrpc_pending_slot *slot, bool on_poller)
{
    struct vrpc_stream *s = slot->cb_arg;
    (void)ch;
    pthread_mutex_lock(&s->mu);
    s->st = slot->st;
    s->ended = true;
    rx_signal_locked(s);
    vrpc_stream_kick_locked(s, on_poller);
    pthread_mutex_unlock(&s->mu);
}

/* ---- the stream task ------------------------------------------------------- */

static __thread struct vrpc_stream *cb_running; /* the stream whose callback runs here */

bool vrpc_stream_in_callback(const struct vrpc_stream *s) { return cb_running == s; }

static void stream_task(struct vrpc_task *t);

void vrpc_stream_kick_locked(struct vrpc_stream *s, bool on_poller)
{
    if (s->task_sched || s->rel_done) {
        if (s->task_sched) /* a lingering task (linger_locked) looks again */
            __atomic_store_n(&s->rx_seq, s->rx_seq + 1, __ATOMIC_RELEASE);
        return;
    }
    s->task_sched = true;
    vrpc_task_init(&s->task, stream_task);
    int rc = on_poller ? vrpc_sched_producer_submit(s->ch->prod, &s->task) : vrpc_sched_submit(s->ch->sched, &s->task);
    if (rc) {
        s->task_sched = false;
        vrpc_rpc_log("stream %s: its scheduler refused a task (%d)", s->m->full_name, rc);
    }
}

/* The nodes of k delivered messages back to the spare list, counted as
 * consumed, and window returned if enough was (s->mu held, dropped while
 * sending it). */
static void delivered_locked(struct vrpc_stream *s, struct smq *used)
{
    struct smsg *n;
    s->rx_unreported += used->n;
    while ((n = smq_pop(used)))
        spare_put_locked(s, n);
    vrpc_stream_window_locked(s, false);
}

/* Every received message to on_read (true if any), with s->mu held: the
 * whole of rx is taken under this one acquisition and delivered without the
 * lock, so the poller appending more meets the lock once per batch, not
 * twice per message. Every quarter window the consumed ones go back (and
 * window with them), so a long batch does not stall the server. A
 * callback that destroys the stream (free_on_return, set by this thread)
 * stops the delivery; the rest goes to the spare list, freed with the
 * stream. */
static bool deliver_locked(struct vrpc_stream *s)
{
    if (!s->has_cbs || s->free_on_return || !s->cbs.on_read || !s->rx.head ||
        s->m->kind == VRPC_METHOD_CLIENT_STREAMING)
        return false;
    struct smq batch = s->rx, used = {0};
    uint32_t thresh = s->rx_window / 4 ? s->rx_window / 4 : 1;
    s->rx = (struct smq){0};
    pthread_mutex_unlock(&s->mu);
    struct smsg *n;
    while ((n = smq_pop(&batch))) {
        ProtobufCMessage *msg = NULL;
        /* (n goes back to the spare list after the callback: msg may point into it) */
        int rc = s->free_on_return ? 0 : vrpc_stream_unpack_ref(s, s->m->output, n, &msg);
        if (rc == 0 && !s->free_on_return) {
            cb_running = s;
            s->cbs.on_read(s, msg, s->cbs.arg);
            cb_running = NULL;
        }
        smq_push(&used, n);
        if (rc)
            vrpc_stream_fail(s, VRPC_INTERNAL, "a stream message does not decode as its type");
        if (used.n >= thresh && batch.head) {
            pthread_mutex_lock(&s->mu);
            delivered_locked(s, &used);
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_mutex_lock(&s->mu);
    delivered_locked(s, &used);
    return true;
}

/* on_done once (true), with s->mu held (dropped during the callback). */
static bool done_locked(struct vrpc_stream *s)
{
    bool cs = s->m->kind == VRPC_METHOD_CLIENT_STREAMING;
    if (!s->has_cbs || !s->ended || s->done_delivered || (s->rx.head && s->cbs.on_read && !cs && !s->free_on_return))
        return false;
    s->done_delivered = true;
    if (s->free_on_return)
        return true;
    struct smsg *n = cs && s->st.code == VRPC_OK ? smq_pop(&s->rx) : NULL;
    struct vrpc_status st = s->st;
    pthread_mutex_unlock(&s->mu);
    ProtobufCMessage *resp = NULL;
    if (cs && st.code == VRPC_OK && (!n || vrpc_stream_unpack(s, s->m->output, n, &resp)))
        vrpc_status_set(&st, VRPC_INTERNAL, "%s", n ? "the response does not decode" : "no response message");
    cb_running = s;
    s->cbs.on_done(s, &st, st.code == VRPC_OK ? resp : NULL, s->cbs.arg);
    cb_running = NULL;
    pthread_mutex_lock(&s->mu);
    if (n)
        spare_put_locked(s, n);
    return true;
}

/* Queued async writes handed to the transport in one vrpc_ep_send_list, at most. */
#define TX_BATCH 32

/* The frames of batch[0..k) in one list (no lock; the writes counted in
 * tx_sent and tx_busy): the number the transport took. Fewer than k: the
 * stream failed (*failed), or, on a poller only, no send buffer or credit
 * was free right now (-EAGAIN from the functions that would wait). */
static unsigned tx_batch_send(struct vrpc_stream *s, struct smsg *const *batch, unsigned k, bool *failed)
{
    struct vrpc_send_wr wrs[TX_BATCH];
    unsigned got = 0, sent = 0;
    int rc = 0;
    for (; got < k; got++) {
        struct vrpc_buf *b;
        if ((rc = vrpc_stream_buf(s, true, &b)))
            break;
        struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_MESSAGE, .request_id = s->id};
        wrs[got] =
            (struct vrpc_send_wr){.buf = b, .len = vrpc_rpc_frame_fill(b, &h, batch[got]->data, batch[got]->len)};
    }
    int src = got ? vrpc_stream_send_list(s, wrs, got, &sent) : 0;
    *failed = (rc && rc != -EAGAIN) || (src && src != -EAGAIN);
    if (*failed)
        vrpc_stream_fail(s, VRPC_UNAVAILABLE, "stream send failed");
    return sent;
}

/* Several queued async writes at once (s->mu held, dropped while sending):
 * when at least min small ones may go now (the server's window), they go in
 * one vrpc_ep_send_list (one sendmsg on TCP instead of one each), then
 * their callbacks run in order. The task asks for 2 (one goes by
 * tx_one_locked, which also sends large ones); a poller for 1, and what it
 * could not hand over without waiting goes back to the head of tx, for its
 * next pass or the task. True if it sent (or the stream failed). */
static bool tx_batch_locked(struct vrpc_stream *s, unsigned min)
{
    if (s->ended || s->tx.n < min || s->tx_sent >= s->tx_allowed)
        return false;
    uint64_t room = s->tx_allowed - s->tx_sent;
    uint32_t fits = vrpc_ep_eager_size(s->c->b.ep) - VRPC_WIRE_HDR_LEN;
    struct smsg *batch[TX_BATCH];
    unsigned k = 0;
    bool failed;
    for (struct smsg *n = s->tx.head; n && k < TX_BATCH && k < room && n->len <= fits; n = n->next)
        k++;
    if (k < min)
        return false;
    for (unsigned i = 0; i < k; i++)
        batch[i] = smq_pop(&s->tx);
    s->tx_sent += k;
    s->tx_busy += k;
    pthread_mutex_unlock(&s->mu);
    unsigned sent = tx_batch_send(s, batch, k, &failed);
    unsigned ran = failed ? k : sent; /* not failed: the rest were not taken yet */
    for (unsigned i = 0; i < ran; i++) {
        batch[i]->cb(s, i < sent ? 0 : -EPIPE, batch[i]->arg);
        pthread_mutex_lock(&s->mu);
        s->tx_busy--;
        spare_put_locked(s, batch[i]);
        pthread_cond_broadcast(&s->cond); /* a write waiting behind them */
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    if (ran < k) { /* first in line again */
        for (unsigned i = k; i-- > ran;)
            smq_push_front(&s->tx, batch[i]);
        s->tx_sent -= k - ran;
        s->tx_busy -= k - ran;
    }
    return ran > 0;
}

/* One queued async write (or, once all went, the half-close), with s->mu
 * held (dropped while sending). True if it did something. */
static bool tx_one_locked(struct vrpc_stream *s)
{
    struct smsg *n = s->tx.head;
    if (n && (s->ended || s->tx_sent < s->tx_allowed)) {
        smq_pop(&s->tx);
        bool ended = s->ended;
        s->tx_sent++;
        s->tx_busy++; /* still outstanding, and ahead of any later write */
        pthread_mutex_unlock(&s->mu);
        int rc = ended ? -EPIPE
                 : VRPC_WIRE_HDR_LEN + n->len > vrpc_ep_eager_size(s->c->b.ep)
                     ? vrpc_stream_write_large(s, NULL, n->data, n->len)
                     : vrpc_stream_send(s, VRPC_FT_MESSAGE, 0, n->data, n->len);
        if (rc && !ended)
            vrpc_stream_fail(s, VRPC_UNAVAILABLE, "stream send failed");
        n->cb(s, rc ? -EPIPE : 0, n->arg);
        pthread_mutex_lock(&s->mu);
        s->tx_busy--;
        spare_put_locked(s, n);
        pthread_cond_broadcast(&s->cond); /* a write waiting behind it */
        return true;
    }
    if (!n && s->half_closed && !s->hc_sent && !s->ended) {
        s->hc_sent = true;
        pthread_mutex_unlock(&s->mu);
        if (vrpc_stream_send(s, VRPC_FT_HALF_CLOSE, 0, NULL, 0))
            vrpc_stream_fail(s, VRPC_UNAVAILABLE, "stream send failed");
        pthread_mutex_lock(&s->mu);
        return true;
    }
    return false;
}

/* The slot and connection back (once), with s->mu held (dropped). */
static bool release_locked(struct vrpc_stream *s)
{
    if (!s->ended || s->users || s->rel_claimed || s->tx.head ||
        (s->has_cbs && !s->done_delivered && !s->free_on_return))
        return false;
    s->rel_claimed = true;
    pthread_mutex_unlock(&s->mu);
    struct vrpc_channel *ch = s->ch;
    if (s->slot) {
        if (s->slot->deadline_ns != VRPC_NO_DEADLINE)
            vrpc_timer_cancel(ch->wheel, &s->slot->timer);
        pthread_mutex_lock(&ch->slock);
        ch->streams[s->slot->index] = NULL;
        pthread_mutex_unlock(&ch->slock);
        call_metrics(ch, s->m, s->st.code, s->start_ns);
        conn_unref(s->c); /* before owner_done, see async_done_task */
        vrpc_pending_owner_done(s->slot, s->gen);
    }
    pthread_mutex_lock(&s->mu);
    s->rel_done = true;
    pthread_cond_broadcast(&s->cond);
    return true;
}

/* A task of a stream that reads through callbacks stays a while for the
 * next message before it ends (vrpc_stream_spin, s->mu dropped): the poller
 * then only appends (the task is scheduled, no submit) and its worker is
 * not put to sleep and woken once per message. The latency mode's window,
 * but never longer than the adaptive mode's floor: the task holds a worker,
 * and with VRPC_SPIN_ALWAYS two idle streams would keep two workers for
 * ever. Any kick meanwhile (a message, an async write, WINDOW, the end)
 * bumps rx_seq, so nothing waits for the spin to run out. True if
 * something came. */
static bool linger_locked(struct vrpc_stream *s)
{
    if (!s->has_cbs || !s->cbs.on_read || s->ended || s->free_on_return || s->rx.head ||
        s->m->kind == VRPC_METHOD_CLIENT_STREAMING || s->cb_on_poller) /* (its poller takes over) */
        return false;
    uint32_t seq = s->rx_seq;
    pthread_mutex_unlock(&s->mu);
    vrpc_stream_spin(s, seq, (uint64_t)VRPC_RPC_BUSY_POLL_US * 1000u);
    pthread_mutex_lock(&s->mu);
    return s->rx_seq != seq; /* under the lock: a kick just after the spin is seen */
}

/* Work the task has to do after a poller delivered in its place (s->mu
 * held): writes to send, window the poller could not return, the
 * half-close, the end (on_done, release) or a destroy from a callback. */
static bool task_due_locked(const struct vrpc_stream *s)
{
    uint32_t thresh = s->rx_window / 4 ? s->rx_window / 4 : 1;
    return s->rx.head || s->ended || s->free_on_return || s->rx_unreported >= thresh ||
           (s->tx.head && s->tx_sent < s->tx_allowed) || (s->half_closed && !s->hc_sent);
}

/* The poller in the task's place (poller_claim_locked): every queued
 * message to on_read, its window back, the queued small writes out
 * (tx_batch_locked), none of it waiting, then the task for whatever else is
 * due. Callbacks run as on the task (one at a time, in order, cb_running
 * set), with vrpc_rpc_on_poller set: what would wait from them is refused
 * (stream.h), and the stream's sends return -EAGAIN instead (room_wait). */
static void poller_run(struct vrpc_stream *s)
{
    bool was = vrpc_rpc_on_poller;
    vrpc_rpc_on_poller = true;
    pthread_mutex_lock(&s->mu);
    while (deliver_locked(s) || tx_batch_locked(s, 1))
        ;
    s->task_sched = false;
    if (task_due_locked(s))
        vrpc_stream_kick_locked(s, true);
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    vrpc_rpc_on_poller = was;
}

static void stream_task(struct vrpc_task *t)
{
    struct vrpc_stream *s = container_of(t, struct vrpc_stream, task);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (deliver_locked(s) || tx_batch_locked(s, 2) || tx_one_locked(s) || vrpc_stream_window_locked(s, s->draining) ||
            done_locked(s) || release_locked(s) || linger_locked(s))
            continue;
        break;
    }
    bool free_it = s->free_on_return && s->rel_done;
    s->task_sched = false;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    if (free_it)
        vrpc_stream_free(s);
}
