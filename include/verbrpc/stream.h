/* verbrpc streaming RPCs: server streaming, client streaming and
 * bidirectional streaming, with gRPC's semantics (docs/PROTOCOL.md, "Streams").
 *
 * A stream is a call: one request id, one deadline covering the whole stream,
 * request metadata, optional initial metadata from the server, any number of
 * messages each way (as the method's shape allows), in order and exactly
 * once, and one final status with trailing metadata. Streams and unary calls
 * share a connection; each stream holds one call slot until its end.
 *
 * Flow control, two levels: the transport's credits per connection (as for
 * unary calls: a message is copied out of its receive buffer on arrival, so
 * a stream never holds them), and a window per stream and direction counted
 * in messages: a writer may have at most `stream_window` messages that the
 * reader's application has not yet consumed (read returned it, or the read
 * callback returned). A reader that stops reading therefore stops its writer
 * after `stream_window` messages; nothing queues without bound.
 *
 * Threads: as in rpc.h. Callbacks run on scheduler workers, never on a
 * poller. Reads of one stream are delivered one at a time, in order.
 * Return conventions: 0 or a negative errno, except where a function says it
 * returns a status code. */
#ifndef VERBRPC_STREAM_H
#define VERBRPC_STREAM_H

#include <verbrpc/rpc.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Messages per stream and direction a reader accepts before it returns
 * window (vrpc_channel_opts.stream_window, vrpc_server_opts.stream_window;
 * 0 there means this default). */
#define VRPC_STREAM_WINDOW_DEFAULT 64u
#define VRPC_STREAM_WINDOW_MAX (1u << 20)
/* Asynchronous writes one stream may have outstanding (accepted, write
 * callback not yet run); one more returns -EAGAIN. */
#define VRPC_STREAM_ASYNC_WRITES_MAX 64u

/* ---- client ----------------------------------------------------------------*/

struct vrpc_stream;

/* Completion of one asynchronous write: 0 once the message was handed to
 * the transport ("sent" means that, not that the peer read it), or a
 * negative errno: -EPIPE (the stream ended before it could be sent; its
 * status is the stream's). Runs exactly once per accepted write, on a
 * worker (or the poller: VRPC_CALL_CB_ON_POLLER, struct vrpc_stream_cbs), in
 * the order the writes were made. */
typedef void (*vrpc_stream_write_cb)(struct vrpc_stream *s, int rc, void *arg);

/* Asynchronous reading: set in vrpc_stream_opts to have messages delivered
 * to on_read instead of vrpc_stream_read. The callbacks run on a worker (the
 * stream's task), or, with VRPC_CALL_CB_ON_POLLER in the stream's
 * call.flags, on_read runs on the channel's poller, right where a message
 * arrives, whenever the stream's task is not running (else on the task:
 * either way one at a time and in order), and the queued small async writes
 * the server's window lets go are sent from there (a WINDOW's arrival sends
 * them too), their write callbacks run there; on_done, large messages and
 * whatever would wait stay on the task. The contract is the unary flag's (rpc.h): return within
 * microseconds, never block. From a callback on a poller, vrpc_stream_write
 * and vrpc_stream_read return -EWOULDBLOCK and vrpc_stream_finish
 * FAILED_PRECONDITION at once (they would wait for what the poller brings);
 * vrpc_stream_write_async, vrpc_stream_close_send (its HALF_CLOSE goes from
 * the task), vrpc_stream_cancel and vrpc_stream_destroy work; a
 * vrpc_stream_start there never waits for a connection, a call credit or a
 * send buffer (the stream ends UNAVAILABLE instead). The window a poller
 * returns is sent without waiting (by the task when no buffer or credit is
 * free at that moment). */
struct vrpc_stream_cbs {
    /* Each message from the server, in order, one at a time per stream. msg
     * is valid only during the callback; the message counts as consumed
     * (its window returns) when the callback returns. May be NULL for a
     * client-streaming method (its one response goes to on_done). */
    void (*on_read)(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg);
    /* The end, exactly once, after the last on_read: st is the final status,
     * resp the response of a client-streaming method on VRPC_OK (else NULL);
     * both valid only during the callback. The stream stays the caller's
     * until vrpc_stream_destroy (which may be called from here). */
    void (*on_done)(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg);
    void *arg;
};

struct vrpc_stream_opts {
    struct vrpc_call_opts call;        /* deadline (covers the whole stream), request
                                         metadata, call_id (vrpc_channel_cancel works
                                         on streams), flags */
    const struct vrpc_stream_cbs *cbs; /* NULL: synchronous reads (vrpc_stream_read);
                                         copied */
};

/* Open a stream of method m (m->kind not VRPC_METHOD_UNARY, else -EINVAL).
 * Waits for the channel's connect and for a call slot, like vrpc_call (at
 * most until the deadline); returns 0 and *out once the stream's REQUEST is
 * out. A stream that cannot open (UNAVAILABLE, DEADLINE_EXCEEDED, ...) still
 * returns 0: its first read, write or finish reports it (and on_done runs).
 * On a channel over many servers (a resolver target, rpc.h) the policy
 * picks one server for the whole stream (hash_key as for a call): -EAGAIN
 * when no server is known.
 * -EINVAL (bad arguments), -ESHUTDOWN (channel being destroyed): *out not
 * written. o may be NULL. The stream is the caller's until
 * vrpc_stream_destroy. */
VRPC_API int vrpc_stream_start(struct vrpc_channel *ch, const struct vrpc_method_desc *m,
                               const struct vrpc_stream_opts *o, struct vrpc_stream **out);

/* Send one message (packed before return; msg stays the caller's). Blocks
 * while the stream's window is closed. Server-streaming methods take
 * exactly one message (then vrpc_stream_close_send): a second is -EINVAL.
 * Returns 0 when handed to the transport, -EPIPE if the stream has ended
 * (vrpc_stream_finish tells why) or was half-closed, -EINVAL for a message
 * not of the method's input type or above the server's message limit (the
 * stream goes on), -ETIMEDOUT if its deadline passed while waiting (the
 * stream then ends DEADLINE_EXCEEDED). Any thread; writes of one stream
 * must not run concurrently with each other. */
VRPC_API int vrpc_stream_write(struct vrpc_stream *s, const ProtobufCMessage *msg);

/* Send one message without waiting: packed before return, queued if the
 * window is closed, cb(s, rc, arg) runs once it was handed to the transport
 * (or the stream ended). -EAGAIN when VRPC_STREAM_ASYNC_WRITES_MAX writes are
 * outstanding (cb will not run), other errors as vrpc_stream_write. */
VRPC_API int vrpc_stream_write_async(struct vrpc_stream *s, const ProtobufCMessage *msg, vrpc_stream_write_cb cb,
                                     void *arg);

/* Half-close: no more messages from this side (after the queued ones).
 * 0, -EALREADY if already half-closed, -EPIPE if the stream has ended. */
VRPC_API int vrpc_stream_close_send(struct vrpc_stream *s);

/* Synchronous read of the next message from the server (streams opened
 * without cbs). Blocks until a message, the end, or the deadline. Returns
 * 0 with *msg valid until the next read or finish on this stream (in the
 * stream's own memory; never freed by the caller), -ENODATA at the end of
 * the stream (no more messages: vrpc_stream_finish gives the status),
 * -EINVAL if the stream reads through callbacks. One reader at a time. */
VRPC_API int vrpc_stream_read(struct vrpc_stream *s, ProtobufCMessage **msg);

/* Wait for the end and return the final status code (0 = VRPC_OK; st, if
 * not NULL, gets code and message). Messages not read are dropped (their
 * window returns). For a client-streaming method, *resp (if resp is not
 * NULL) gets the response on VRPC_OK, valid until vrpc_stream_destroy. Half-closes first if
 * the caller has not. May be called again: returns the same status. */
VRPC_API int vrpc_stream_finish(struct vrpc_stream *s, ProtobufCMessage **resp, struct vrpc_status *st);

/* Cancel: the stream ends CANCELLED at once (unless it had ended), the server
 * is told. Any thread, any number of times. */
VRPC_API void vrpc_stream_cancel(struct vrpc_stream *s);

/* The server's initial metadata (once the first message or the end has
 * been read) and trailing metadata (after the end). -ENOENT if absent.
 * Pointers valid until vrpc_stream_destroy. */
VRPC_API int vrpc_stream_initial_metadata_get(const struct vrpc_stream *s, const char *key, const void **value,
                                              size_t *value_len);
VRPC_API int vrpc_stream_trailing_metadata_get(const struct vrpc_stream *s, const char *key, const void **value,
                                               size_t *value_len);

/* Free the stream; cancels it first if it has not ended (on_done then runs,
 * CANCELLED, before this returns, unless it is the caller). Waits for the
 * stream's running callbacks, except the one it is called from. Called from
 * one of s's own callbacks it returns at once: no callback of s runs after
 * that one (not even on_done, if it was on_read) and s is freed once the
 * stream has let go of its connection. Safe on NULL. Not concurrently with
 * other calls on s; after vrpc_channel_destroy of its channel it is still
 * valid (that destroy ended the stream). */
VRPC_API void vrpc_stream_destroy(struct vrpc_stream *s);

/* ---- server ----------------------------------------------------------------*/

struct vrpc_server_stream;

/* A server's handling of one streaming method. start runs on a worker when
 * a stream opens (request metadata and deadline are readable from then on);
 * then on_read for each client message in order, one at a time (msg valid
 * during the callback, consumed when it returns), on_half_close once the
 * client will send no more, on_cancel once if the stream is cancelled (client
 * CANCEL, deadline, connection lost, server shutdown). Only start is
 * required. The application ends the stream with vrpc_server_stream_finish
 * exactly once, now or later from any thread, also after on_cancel (then it
 * only releases the stream); no callback runs after finish returns, and s
 * is invalid after.
 * With vrpc_server_run_on_poller for the method, on_read runs on the poller
 * that received the message whenever the stream's task is idle (else on the
 * task: one at a time and in order either way), and the queued small
 * write_async messages go from that poller with their callbacks, where no
 * wait is needed; start, on_half_close, on_cancel, large messages and writes
 * that must wait for room stay on the task. The poller delivers a message
 * only while the stream can take one more write_async, so an on_read that
 * writes once never meets -EAGAIN there. From a callback on the poller,
 * vrpc_server_stream_write returns -EWOULDBLOCK at once (it may wait for
 * window the poller brings), and so does vrpc_server_stream_finish while
 * writes are queued or being sent, or a large client message is being read
 * (finish then from on_half_close, another thread, or the last write's
 * callback); a finish there never waits for a send buffer (with the shared
 * pool empty its RESPONSE is dropped and logged, as an answer of a unary
 * handler on the poller; the client's deadline covers it). */
struct vrpc_server_stream_ops {
    void (*start)(struct vrpc_server_stream *s, void *user);
    void (*on_read)(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user);
    void (*on_half_close)(struct vrpc_server_stream *s, void *user);
    void (*on_cancel)(struct vrpc_server_stream *s, void *user);
};

/* Register a streaming method (m->kind not VRPC_METHOD_UNARY, else
 * -EINVAL); otherwise as vrpc_server_register. ops and user must outlive
 * the server. */
VRPC_API int vrpc_server_register_stream(struct vrpc_server *srv, const struct vrpc_method_desc *m,
                                         const struct vrpc_server_stream_ops *ops, void *user);

/* Per-stream user data, for the callbacks. */
VRPC_API void vrpc_server_stream_set_ctx(struct vrpc_server_stream *s, void *ctx);
VRPC_API void *vrpc_server_stream_ctx(const struct vrpc_server_stream *s);

/* Initial metadata, at most once, before the first write (otherwise it goes
 * out with the first write or the finish). Copied. 0, -EALREADY, -EINVAL, or
 * -ECONNRESET when the stream has already ended (finished, cancelled, its
 * deadline passed or its connection lost: also before a start callback
 * that runs late). */
VRPC_API int vrpc_server_stream_send_metadata(struct vrpc_server_stream *s, const struct vrpc_metadata *md, size_t n);

/* Write one message (packed before return), blocking while the client's
 * window is closed, and while the connection's send queue holds a quarter
 * of max_sends_per_conn (stream writes wait for room there instead of
 * costing a slow client its connection): from a worker this holds the
 * worker, so handlers that stream a lot should prefer write_async. A
 * message above the eager size goes by rendezvous, one at a time per
 * stream ("handed to the transport" is then: its descriptor is out; the
 * next large one waits for the client's DONE). 0 once handed to the transport;
 * -ECONNRESET if the stream was cancelled or its connection lost; -EINVAL
 * for a message not of the method's output type, above the client's limit,
 * or a second message of a client-streaming method; -ETIMEDOUT if the
 * deadline passed while waiting. Any thread; not concurrently with another
 * write of s. */
VRPC_API int vrpc_server_stream_write(struct vrpc_server_stream *s, const ProtobufCMessage *msg);

/* Write without waiting, as vrpc_stream_write_async (same bound,
 * VRPC_STREAM_ASYNC_WRITES_MAX; -EAGAIN beyond; a callback may write again).
 * cb(rc, arg) runs on a worker (the stream's, between its other callbacks)
 * once handed to the transport, or with -ECONNRESET if the stream ended
 * first (then possibly on the thread calling finish). Do not wait in a
 * callback of s for its own queued writes: they are sent by the same
 * worker after the callback returns (a blocking write or finish from a
 * callback does send them first). */
typedef void (*vrpc_server_stream_write_cb)(struct vrpc_server_stream *s, int rc, void *arg);
VRPC_API int vrpc_server_stream_write_async(struct vrpc_server_stream *s, const ProtobufCMessage *msg,
                                            vrpc_server_stream_write_cb cb, void *arg);

/* End the stream with a status (code VRPC_OK: success; msg may be NULL) and
 * trailing metadata (md may be NULL), after the queued writes (which may
 * wait for the client's window, at most until the deadline). Exactly once;
 * releases s. For a client-streaming method with VRPC_OK, the response is
 * the message written (exactly one must have been). Returns 0, -ECONNRESET
 * if the stream had been cancelled or its connection lost (s is still
 * released), -EINVAL for bad metadata (the client gets INTERNAL). */
VRPC_API int vrpc_server_stream_finish(struct vrpc_server_stream *s, enum vrpc_code code, const char *msg,
                                       const struct vrpc_metadata *md, size_t n);

/* Accessors, valid until finish. */
VRPC_API const struct vrpc_method_desc *vrpc_server_stream_method(const struct vrpc_server_stream *s);
VRPC_API int64_t vrpc_server_stream_deadline(const struct vrpc_server_stream *s);
VRPC_API bool vrpc_server_stream_is_cancelled(const struct vrpc_server_stream *s);
VRPC_API int vrpc_server_stream_metadata_get(const struct vrpc_server_stream *s, const char *key, const void **value,
                                             size_t *value_len);

#ifdef __cplusplus
}
#endif
#endif
