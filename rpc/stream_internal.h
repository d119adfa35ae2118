/* The client's streams (include/verbrpc/stream.h), private: the stream
 * object and the functions its two files share:
 *   rpc/stream.c       the public API: start, write, close_send, read,
 *                      finish, cancel, metadata, destroy
 *   rpc/stream_recv.c  the poller's side (MESSAGE, HEADERS, WINDOW, the
 *                      stream's RESPONSE, its end) and the stream's task
 *
 * A stream is a call: it holds one pending slot (rpc/pending.h) whose
 * outcome is decided exactly once (RESPONSE, deadline, cancel, connection
 * loss, channel destroy), like a unary call's. The slot's cb is
 * vrpc_ch_stream_slot_cb (never called: a marker) and its cb_arg the stream,
 * so the decide winner's vrpc_ch_complete ends the stream
 * (vrpc_ch_stream_end) instead of completing a call.
 *
 * Who reaches the stream: its owner (the API, one reader and one writer at a
 * time), the poller (through ch->streams[slot index] under ch->slock, until
 * the stream's release clears it), the decide winner (through the slot, once)
 * and the stream's task (s->task, on the channel's scheduler; at most one
 * instance: task_sched). State is under s->mu; lock order ch->slock, then
 * s->mu; no lock is held while sending or running user callbacks.
 *
 * Release (the task, once the stream ended, no API call is sending on it and
 * the callbacks have run): the deadline timer off, the stream out of
 * ch->streams, its connection reference dropped, the slot's owner side done
 * (the slot frees once the server's RESPONSE came, as a unary call's). After
 * release the stream touches nothing of the channel: vrpc_stream_destroy may
 * run after vrpc_channel_destroy (which waits for every release). */
#ifndef VRPC_RPC_STREAM_INTERNAL_H
#define VRPC_RPC_STREAM_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <verbrpc/stream.h>
#include "rpc/arena.h"
#include "rpc/channel_internal.h"

/* One message: received (payload bytes, copied out of the receive buffer)
 * or an async write waiting for window (payload packed, cb to run). Nodes
 * are kept on the stream's spare list once used, so a stream in steady state
 * allocates nothing per message. */
struct smsg {
    struct smsg *next;
    uint32_t len, cap;
    vrpc_stream_write_cb cb;
    void *arg;
    uint8_t data[];
};

struct smq {
    struct smsg *head, *tail;
    uint32_t n;
};

struct vrpc_stream {
    struct vrpc_channel *ch;   /* a subchannel's channel when lb_sub is set */
    struct vrpc_lb *lb;        /* the many-server channel that picked ch, or NULL */
    struct vrpc_subch *lb_sub; /* its server, referenced until the stream is freed */
    const struct vrpc_method_desc *m;
    struct vrpc_conn *c;            /* referenced until release; NULL: never opened. Only
                                       read while the stream cannot be released (users
                                       counted, or the task): release drops it */
    uint32_t max_payload;           /* c's, copied at open: writes check it without c */
    struct vrpc_pending_slot *slot; /* NULL: never opened */
    uint64_t id;
    uint32_t gen;
    bool has_cbs;
    bool cb_on_poller; /* VRPC_CALL_CB_ON_POLLER: on_read and the queued small writes
                          run on the poller when the task is not running
                          (rpc/stream_recv.c, poller_run) */
    struct vrpc_stream_cbs cbs;
    int64_t start_ns;
    struct vrpc_task task;

    pthread_mutex_t mu;
    pthread_cond_t cond; /* any change an API call or destroy waits for */
    /* under mu: */
    struct smq rx;          /* received, not yet consumed */
    struct smq tx;          /* async writes waiting for window */
    uint32_t tx_busy;       /* writes the task took off tx and has not yet run
                               the callbacks of (outstanding, ahead of later writes) */
    struct smq rx_hold;     /* received behind a large MESSAGE being read */
    bool large_busy;        /* a large MESSAGE is being read (rpc/stream_large.c) */
    struct smsg *spare;     /* free nodes */
    uint32_t rx_seq;        /* bumped (atomically, under mu) when rx grows, the stream
                               ends or a kick finds the task scheduled: a spinning
                               reader or lingering task watches it without the lock */
    uint32_t rx_window;     /* ours (the HELLO's stream_window) */
    uint64_t rx_allowed;    /* MESSAGEs the server may send: window + returned */
    uint64_t rx_got;        /* MESSAGEs received */
    uint32_t rx_unreported; /* consumed, window not yet returned */
    uint64_t tx_allowed;    /* the server's window + its WINDOW increments */
    uint64_t tx_sent;       /* MESSAGEs sent (or being sent) */
    uint32_t users;         /* API calls sending on c right now */
    uint32_t writes;        /* messages written (server-streaming: at most 1) */
    bool half_closed;       /* close_send was called */
    bool hc_sent;           /* HALF_CLOSE went out (or is going) */
    bool draining;          /* finish: drop arriving messages, return window */
    bool got_headers, got_msg;
    bool ended;          /* the outcome is decided: st holds it */
    bool done_delivered; /* cbs: on_done ran (or is running) */
    bool rel_claimed, rel_done;
    bool task_sched;     /* s->task submitted and not finished, or the poller
                            running in its place (poller_run) */
    bool free_on_return; /* destroyed from its own callback */
    struct vrpc_status st;

    uint8_t *imd_buf, *tmd_buf; /* the initial / trailing metadata blocks */
    struct vrpc_metadata imd[VRPC_MD_MAX], tmd[VRPC_MD_MAX];
    int n_imd, n_tmd;

    struct vrpc_arena arena; /* read's *msg, finish's *resp */

    /* The synchronous reader's own (one reader at a time, no lock): the
     * messages it took off rx under one lock, the nodes it consumed and the
     * count it has not yet put into rx_unreported (rpc/stream.c, rd_flush). */
    struct smq rd, rd_used;
    struct smsg *rd_last; /* the node of the message read returned last: its big
                             bytes fields point into it (vrpc_stream_unpack_ref),
                             so it is kept until the next read or finish */
    uint32_t rd_consumed;
    uint32_t rd_seq;     /* rx_seq when it last took rx */
    uint64_t rd_spin_ns; /* how long it spins for more before sleeping: 0 none */
    int rd_poller_cpu;   /* the channel's pinned poller's CPU (no spin on it), -1 */
};

/* The marker in a stream slot's cb (never called). */
void vrpc_ch_stream_slot_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg);
static inline bool slot_is_stream(const struct vrpc_pending_slot *s) { return s->cb == vrpc_ch_stream_slot_cb; }

/* ---- rpc/stream_recv.c ---------------------------------------------------- */

/* The decide winner of a stream slot (vrpc_ch_complete): s->st is final. */
void vrpc_ch_stream_end(struct vrpc_channel *ch, struct vrpc_pending_slot *s, bool on_poller);
/* Poller: the RESPONSE of a stream (the end; trailing metadata). */
void vrpc_ch_stream_on_response(struct vrpc_channel *ch, struct vrpc_conn *c, struct vrpc_pending_slot *s,
                                const struct vrpc_wire_hdr *h, const uint8_t *md, const uint8_t *payload);
/* The client's MESSAGE, HEADERS and WINDOW entries (poller). */
void vrpc_ch_on_message(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body);
void vrpc_ch_on_headers(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body);
void vrpc_ch_on_window(struct vrpc_conn_base *b, const struct vrpc_wire_hdr *h, const uint8_t *body);

/* ---- rpc/stream_large.c: large MESSAGEs from the server ------------------- */

/* Poller, ch->slock held: MESSAGE|RNDV of stream s (window counted by the
 * caller): read it into a large buffer through the slot's rndv_in. NULL or
 * a protocol error. */
const char *vrpc_ch_stream_large_in(struct vrpc_stream *s, const struct vrpc_wire_hdr *h, const uint8_t *descp);
/* Send one large MESSAGE (packed from msg, or the bytes given) by
 * rendezvous: waits for the previous one's DONE (and revoke), packs it into a
 * large buffer, grants it through the slot's rndv_out (the channel's offer
 * queue and hold timer, as a request's) and sends the descriptor. The
 * caller holds a window credit and is counted in users (or is the task).
 * 0, or a negative errno after which the stream has failed (-ETIMEDOUT: it
 * ended DEADLINE_EXCEEDED). */
int vrpc_stream_write_large(struct vrpc_stream *s, const ProtobufCMessage *msg, const uint8_t *bytes, uint32_t len);
/* Poller: the READ of a large stream MESSAGE finished (or failed to start). */
void vrpc_ch_stream_read_done(struct vrpc_channel *ch, struct vrpc_pending_slot *slot, int status);
/* Any thread: fail the stream of request id, if it is still the slot's
 * (vrpc_stream_fail under ch->slock). */
void vrpc_ch_stream_fail_id(struct vrpc_channel *ch, uint64_t id, enum vrpc_code code, const char *why);

/* The stream task: callbacks, async writes, window, release (s->mu held:
 * submits s->task unless it is scheduled; on_poller: through the
 * channel's producer ring). */
void vrpc_stream_kick_locked(struct vrpc_stream *s, bool on_poller);
/* Decide the stream's outcome from here (cancel, a failed send, a message
 * that does not decode): code + why, CANCEL to the server. No lock held. */
void vrpc_stream_fail(struct vrpc_stream *s, enum vrpc_code code, const char *why);
/* Send a header-only frame (+ payload) of this stream on its connection,
 * waiting for a buffer and credit (vrpc_stream_buf). Caller counted
 * in users (or the task). */
int vrpc_stream_send(struct vrpc_stream *s, uint8_t type, uint16_t flags, const void *payload, uint32_t len);
/* The longest a stream frame waits for send room (a buffer of the channel's
 * send pool, the transport's credit queue) while its stream lives and its
 * connection is up: the room comes back with the poller's send completions
 * and the server's credits, so the sender waits instead of failing the
 * stream at the VRPC_RPC_SEND_WAIT_MS of unary sends (16 streams' windows
 * are more frames than the pool holds). Past it the stream fails. On a
 * poller (vrpc_rpc_on_poller) nothing waits: the functions below return
 * -EAGAIN where they would, and the caller leaves the frame to the task. */
#define VRPC_STREAM_ROOM_WAIT_MS 10000
/* A send buffer for a frame of s. A MESSAGE (msg) leaves a quarter of the
 * pool to unary calls and control frames (WINDOW, HALF_CLOSE). Waits as
 * above: 0, -EPIPE (the stream ended), -ENOTCONN, -ENOBUFS (timed out). No
 * lock held; the caller is counted in users (or is the task). */
int vrpc_stream_buf(struct vrpc_stream *s, bool msg, struct vrpc_buf **out);
/* Send frame b (len bytes) of s, waiting as above while the credit queue is
 * full; b is the transport's on 0, back in its pool otherwise. */
int vrpc_stream_send_buf(struct vrpc_stream *s, struct vrpc_buf *b, uint32_t len);
/* The same for the frames wrs[0..n) in one vrpc_ep_send_list (the rest of
 * the list again after each wait): 0, or the error that stopped it, with
 * *sent the frames the transport took (the others back in their pool). */
int vrpc_stream_send_list(struct vrpc_stream *s, const struct vrpc_send_wr *wrs, unsigned n, unsigned *sent);
/* Return window if enough was consumed (or all of it, with force): s->mu
 * held, dropped while sending. True if it sent (or tried: a failure fails
 * the stream). On a poller, with no send buffer or credit free right now
 * (-EAGAIN), the window stays unreported, for the stream's task, and it
 * returns false. */
bool vrpc_stream_window_locked(struct vrpc_stream *s, bool force);
/* A node of at least len bytes (from the spare list, else malloc); NULL:
 * out of memory. s->mu held. */
struct smsg *vrpc_stream_node_locked(struct vrpc_stream *s, uint32_t len);
/* Unpack a node into the stream's arena (reset first) as type d. */
int vrpc_stream_unpack(struct vrpc_stream *s, const ProtobufCMessageDescriptor *d, const struct smsg *n,
                       ProtobufCMessage **out);
/* The same, but bytes fields of at least VRPC_PB_REF_MIN bytes point into
 * the node instead of being copied (vrpc_pb_unpack_ref): for a message
 * whose node outlives its use (a read callback's; a synchronous read's,
 * held in rd_last). */
int vrpc_stream_unpack_ref(struct vrpc_stream *s, const ProtobufCMessageDescriptor *d, struct smsg *n,
                           ProtobufCMessage **out);

/* Watch s->rx_seq (no lock held) until it differs from seq (true) or the
 * latency mode's window (at most max_ns) passed (false; at once with
 * no_spin or on the pinned poller's CPU), yielding between looks
 * (rpc/stream.c). */
bool vrpc_stream_spin(const struct vrpc_stream *s, uint32_t seq, uint64_t max_ns);

/* True on the thread running one of s's callbacks. */
bool vrpc_stream_in_callback(const struct vrpc_stream *s);
/* Free the stream's memory (released, no task). */
void vrpc_stream_free(struct vrpc_stream *s);

static inline void smq_push(struct smq *q, struct smsg *n)
{
    n->next = NULL;
    if (q->tail)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    q->n++;
}

static inline void smq_push_front(struct smq *q, struct smsg *n)
{
    n->next = q->head;
    q->head = n;
    if (!q->tail)
        q->tail = n;
    q->n++;
}

static inline struct smsg *smq_pop(struct smq *q)
{
    struct smsg *n = q->head;
    if (n) {
        q->head = n->next;
        if (!q->head)
            q->tail = NULL;
        q->n--;
    }
    return n;
}

/* Nodes above this go back to malloc, not to the spare list. */
#define SMSG_SPARE_MAX (64u << 10)
static inline void spare_put_locked(struct vrpc_stream *s, struct smsg *n)
{
    if (n->cap > SMSG_SPARE_MAX) {
        free(n);
        return;
    }
    n->next = s->spare;
    s->spare = n;
}

/* rx grew or the stream ended (s->mu held): wake a reader, sleeping or
 * spinning. */
static inline void rx_signal_locked(struct vrpc_stream *s)
{
    __atomic_store_n(&s->rx_seq, s->rx_seq + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&s->cond);
}

/* The errno of an API call on an ended stream. */
static inline int stream_ended_rc(const struct vrpc_stream *s)
{
    return s->st.code == VRPC_DEADLINE_EXCEEDED ? -ETIMEDOUT : -EPIPE;
}

#endif
