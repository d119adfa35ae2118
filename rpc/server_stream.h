/* Private to the server's streams (rpc/server_stream.c: opening, the
 * client's frames, the task that runs the callbacks; rpc/server_stream_api.c:
 * the functions of <verbrpc/stream.h> a handler calls). Not installed. */
#ifndef VRPC_RPC_SERVER_STREAM_H
#define VRPC_RPC_SERVER_STREAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "rpc/server_internal.h"

/* A client message, copied out of its receive buffer on arrival, or a large
 * one (RNDV) in lb once read: pending until then (later messages wait behind
 * it), failed if the read did not complete; orphan: dropped from the queue
 * while its read runs (the read's completion frees it). */
struct srv_msg {
    struct srv_msg *next;
    struct vrpc_buf *lb;
    bool pending, failed, orphan;
    uint32_t len;
    uint32_t cap; /* bytes of data; nodes go to in_spare once delivered */
    uint8_t data[];
};

/* An accepted asynchronous write, packed, waiting for window and its turn.
 * Nodes of messages up to SRV_OUT_SMALL bytes have that room and are kept
 * on the stream's out_free list for its next writes (at most
 * VRPC_STREAM_ASYNC_WRITES_MAX of them, freed with the stream object);
 * nodes of bigger messages that fit a frame go to out_spare, reused by the
 * stream's later writes that fit them and freed when it finishes: a steady
 * async writer allocates nothing per message. */
#define SRV_OUT_SMALL 256
struct srv_out {
    struct srv_out *next;
    struct vrpc_buf *lb; /* a large message: packed here (data unused) */
    vrpc_server_stream_write_cb cb;
    void *arg;
    uint32_t len;
    uint32_t cap; /* bytes of data: SRV_OUT_SMALL (out_free), more (out_spare),
                     0 (a large message's node: freed when sent) */
    int rc;       /* on the sent list: the outcome its callback gets */
    uint8_t data[];
};

/* One per call object that carried a stream, reused by the object's later
 * streams. Everything below `lock` is under it. Threads: the poller (frames
 * of the client), the stream's task on a worker (callbacks, asynchronous
 * writes, WINDOW returns), any thread of the application (writes, finish),
 * the deadline timer and whoever detaches the call (the end). No lock the
 * poller needs is held while a writer waits: the poller takes `lock` only
 * briefly. */
struct vrpc_server_stream {
    struct vrpc_server_call *call; /* never changes */
    struct vrpc_task task;         /* the stream's own task (not the call's) */
    struct vrpc_arena arena;       /* client messages, decoded, one at a time */
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC: window, send turn, callbacks over */
    struct sconn *conn;  /* referenced from open until the stream is released */
    const struct vrpc_server_stream_ops *ops;
    void *user, *ctx;
    enum vrpc_method_kind kind;
    uint64_t id;
    uint32_t gen;
    bool open;                    /* from open until finish (or release unstarted) */
    bool start_pending;           /* start has not run */
    bool started;                 /* start ran */
    bool ended;                   /* the server ended it (detach): no more frames out */
    bool finished;                /* the application called finish: no more callbacks */
    bool half_closed;             /* the client half-closed */
    bool hc_pending;              /* on_half_close to deliver (after the queued messages) */
    bool cancel_pending;          /* on_cancel to deliver */
    bool running;                 /* the task is queued or running, or the poller delivers
                                     in its place (vrpc_server_run_on_poller: poller_run) */
    bool on_poller;               /* the method runs on the poller (on_read and the sends
                                     that need no wait; the rest on the task) */
    bool in_cb;                   /* the task runs a callback now */
    bool sending;                 /* a message is being handed to the transport */
    bool md_sent;                 /* HEADERS went out (or the first message did) */
    pthread_t runner;             /* the task's thread while running */
    uint32_t kick_seq;            /* bumped (atomically, under lock) by a kick that finds
                                     the task running: a lingering task watches it */
    uint64_t linger_ns;           /* how long the task waits for more before it ends
                                     (the latency mode's, at most 50 us; 0: never) */
    uint32_t nin, nout;           /* client messages received, messages written */
    uint32_t recv_avail;          /* client messages still accepted before a WINDOW of ours */
    uint32_t consumed;            /* consumed and not yet returned */
    uint32_t window;              /* our stream_window */
    uint64_t send_avail;          /* messages we may still send */
    uint32_t nqueued;             /* async writes accepted, callback not run (stored atomically
                                     under lock: write_async peeks at it without) */
    bool wr_offering;             /* a large message of ours is being offered (until its descriptor is out) */
    int wr_rc;                    /* that offer's outcome */
    struct vrpc_rndv_out out_rec; /* our large messages' grant: one at a time (DONE, revoke, then the next) */
    bool rd_busy;                 /* a large client message is being read (into call->in): at most one */
    struct sconn *rd_conn;        /* the read's limit timer's connection (a reference), see
                                     vrpc_srv_stream_read_limit */
    struct srv_msg *rd_node;      /* its queue entry */
    struct srv_msg *in_head, *in_tail;
    struct srv_msg *in_spare; /* delivered nodes for the next messages (at most a
                                 window's worth), freed at finish */
    struct srv_out *out_head, *out_tail;
    struct srv_out *sent_head, *sent_tail; /* handed over by a batch, callback not yet run */
    struct srv_out *out_free;              /* small nodes for reuse (see srv_out) */
    struct srv_out *out_spare;             /* bigger nodes for reuse, until finish */
    /* No frame of a stream may follow its RESPONSE on the wire (the client
     * frees the id at the RESPONSE). wire_busy counts the frames of this
     * stream being handed to the transport (entered only while neither ended
     * nor finished); a detacher (CANCEL, deadline, a per-stream error) that
     * finds it nonzero leaves its RESPONSE here (end_held) and the last of
     * those senders sends it; finish waits for it to reach 0. */
    uint32_t wire_busy;
    bool end_held;
    struct sconn *end_conn; /* referenced by the detach, answered once sent */
    uint64_t end_id;
    enum vrpc_code end_code;
    char end_msg[VRPC_STATUS_MSG_MAX];
};

/* A frame of st goes to the transport now (lock held): false if the stream
 * ended or finished (its RESPONSE is out or on its way: send nothing). */
static inline bool vrpc_srv_stream_wire_enter_locked(struct vrpc_server_stream *st)
{
    if (st->ended || st->finished)
        return false;
    st->wire_busy++;
    return true;
}
/* That frame was handed over (lock held; dropped and retaken while the
 * last one sends a held RESPONSE). */
void vrpc_srv_stream_wire_leave_locked(struct vrpc_server_stream *st);

/* Queue the stream's task unless it is queued or running (lock held). prod:
 * the poller's ring when on the poller, else NULL. */
void vrpc_srv_stream_kick_locked(struct vrpc_server_stream *st, struct vrpc_sched_producer *prod);
/* Hand one packed message (bytes, len <= the eager room) to the transport
 * as a MESSAGE, waiting for room in the connection's send quota (never
 * above a quarter of it, so unary answers and other streams keep moving).
 * 0, -ECONNRESET (ended or connection lost), -ETIMEDOUT (deadline). No lock held. */
int vrpc_srv_stream_send_bytes(struct vrpc_server_stream *st, const uint8_t *bytes, uint32_t len);
/* Wait for room in the connection's send quota (see send_bytes). */
int vrpc_srv_stream_wait_room(struct vrpc_server_stream *st);
/* The same for a large message packed in lb (len bytes; lb is given up):
 * waits for the previous large one's revoke, offers it (grant, MESSAGE|RNDV)
 * and returns once the descriptor is out. */
int vrpc_srv_stream_send_large(struct vrpc_server_stream *st, struct vrpc_buf *lb, uint32_t len);
/* Poller, as the read of a large client MESSAGE (call->in, len bytes) starts:
 * arm its limit, as a large request's (rpc/dispatch.c request_read_start):
 * transfer_floor_ms + len at min_transfer_rate from now, whatever trickles
 * in. At the limit (the wheel's thread) the stream ends RESOURCE_EXHAUSTED
 * and the connection is failed, which ends the read (its buffer comes back
 * at the flushed completion). The state is call->xfer (server_internal.h). */
void vrpc_srv_stream_read_limit(struct sconn *c, struct vrpc_server_call *call, uint32_t len, uint32_t gen);
/* Poller, at that read's completion, before anything else: disarm the limit,
 * or wait for the expiry that won to finish. Returns status, or -ETIMEDOUT
 * for a read that succeeded too late. */
int vrpc_srv_stream_read_unlimit(struct vrpc_server_call *call, int status);
/* Send the first queued async write (lock held, st->sending false; drops
 * and retakes the lock; runs its callback). */
void vrpc_srv_stream_out_one_locked(struct vrpc_server_stream *st);
/* On a poller: the queued small async writes that may go now (window,
 * the connection's quota, send buffers to spare) in one list, their
 * callbacks run; nothing that could wait. False if none could go (lock
 * held; dropped and retaken). */
bool vrpc_srv_stream_out_poller_locked(struct vrpc_server_stream *st);
/* Send the first queued async writes together when at least two small ones
 * may go now (window and connection quota), in one vrpc_ep_send_list (one
 * sendmsg on TCP instead of one each), then run their callbacks in order
 * from the sent list (lock held, st->sending false; drops and retakes the
 * lock). A callback that writes with a blocking write or finishes runs the
 * rest of the list first, so callbacks keep the order of the writes and none
 * runs after finish. False when it sent nothing: out_one_locked then sends
 * the first alone. */
bool vrpc_srv_stream_out_batch_locked(struct vrpc_server_stream *st);
/* Run the callback of the first write on the sent list (lock held, dropped
 * and retaken; on the task's thread, or finish's on it). False if none. */
bool vrpc_srv_stream_run_sent_locked(struct vrpc_server_stream *st);
/* A sent (or failed) async write's node back for reuse, or freed (lock held). */
void vrpc_srv_stream_out_put_locked(struct vrpc_server_stream *st, struct srv_out *o);
/* True on the stream's own task thread (lock held). */
static inline bool vrpc_srv_stream_on_task(const struct vrpc_server_stream *st)
{
    return st->running && pthread_equal(st->runner, pthread_self());
}
/* The server ends the stream with code (per-stream error); any thread, no lock held. */
void vrpc_srv_stream_end(struct vrpc_server_stream *st, uint32_t gen, enum vrpc_code code, const char *msg);
/* Free the nodes kept for reuse (out_spare, in_spare), lock held: at finish,
 * so that an idle stream object keeps only its small write nodes. */
void vrpc_srv_stream_trim_locked(struct vrpc_server_stream *st);
/* Free the queued client messages (lock held). */
void vrpc_srv_stream_drop_in_locked(struct vrpc_server_stream *st);
/* Release the application's hold after the end (conn reference). */
void vrpc_srv_stream_release_conn(struct vrpc_server_stream *st);

#endif
