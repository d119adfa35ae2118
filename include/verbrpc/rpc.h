/* verbrpc RPC core: status codes, method descriptors, channels (client) and
 * servers. Messages are protobuf-c messages; the wire format is in
 * docs/PROTOCOL.md. This header is the contract the generated stubs
 * (protoc-gen-verbrpc) are written against.
 *
 * Threads, in one paragraph: any number of threads may call through one
 * channel at once. A synchronous call blocks its own thread on its own waiter.
 * An asynchronous call's callback and every server handler run on a worker of
 * the scheduler (include/verbrpc/sched.h), not on a transport poller, unless
 * asked to for short, never-blocking code (VRPC_CALL_CB_ON_POLLER,
 * vrpc_server_run_on_poller). A handler may answer later, from any thread.
 *
 * Return conventions: functions return 0 or a negative errno and write output
 * pointers only on success, EXCEPT vrpc_call(), which returns the call's
 * status code (enum vrpc_code, 0 = VRPC_OK, never negative) because a call's
 * outcome is an RPC status, not a local error. */
#ifndef VERBRPC_RPC_H
#define VERBRPC_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include <verbrpc/common.h>
#include <verbrpc/sched.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ---------------------------------------------------------------
 * gRPC's sixteen codes, same numbers and meanings. */
enum vrpc_code {
    VRPC_OK = 0,
    VRPC_CANCELLED = 1,
    VRPC_UNKNOWN = 2,
    VRPC_INVALID_ARGUMENT = 3,
    VRPC_DEADLINE_EXCEEDED = 4,
    VRPC_NOT_FOUND = 5,
    VRPC_ALREADY_EXISTS = 6,
    VRPC_PERMISSION_DENIED = 7,
    VRPC_RESOURCE_EXHAUSTED = 8,
    VRPC_FAILED_PRECONDITION = 9,
    VRPC_ABORTED = 10,
    VRPC_OUT_OF_RANGE = 11,
    VRPC_UNIMPLEMENTED = 12,
    VRPC_INTERNAL = 13,
    VRPC_UNAVAILABLE = 14,
    VRPC_DATA_LOSS = 15,
    VRPC_UNAUTHENTICATED = 16,
};
#define VRPC_CODE_COUNT 17

/* Longest status message kept, including the NUL; longer messages are cut. */
#define VRPC_STATUS_MSG_MAX 160

/* struct vrpc_status flags. */
/* The server did not process the request: it never left this client (no
 * connection, back-off, the send failed, the channel is shutting down), or
 * the server refused it unread (after its GOAWAY, while draining, out of
 * memory or over its limits) and said so on the wire. The request had no
 * effect anywhere, so it is safe to retry on any server, idempotent or not;
 * a channel over many servers retries such calls transparently. Never set
 * with VRPC_OK. A server without the wire feature never says so: its
 * refusals then come without the flag (treated as possibly processed). */
#define VRPC_STATUS_UNPROCESSED 0x1u

/* A call's outcome. Fixed size: filling one never allocates. */
struct vrpc_status {
    enum vrpc_code code;
    uint32_t flags;                    /* VRPC_STATUS_* */
    char message[VRPC_STATUS_MSG_MAX]; /* NUL-terminated, "" when none */
};

/* "OK", "CANCELLED", ... as gRPC spells them; "UNKNOWN_CODE" for values out of range. */
VRPC_API const char *vrpc_code_name(enum vrpc_code code);

/* ---- methods --------------------------------------------------------------
 * One per RPC method; the generator emits them as static const data. */

/* A .proto file's description, embedded by protoc-gen-verbrpc in the
 * generated code and served by every server's reflection service
 * (idl/verbrpc/reflection.proto) for the files of its registered methods.
 * Static const data; never freed. */
struct vrpc_file_desc {
    const char *name;    /* "pkg/file.proto", as protoc names it */
    const uint8_t *data; /* serialized google.protobuf.FileDescriptorProto
                                                (without source_code_info) */
    size_t len;
    const char *const *symbols; /* fully-qualified names of its messages (nested
                                                too), enums, services and methods
                                                ("pkg.Service.Method"), no leading dot */
    size_t n_symbols;
    const struct vrpc_file_desc *const *deps; /* the files it imports, each embedded too */
    size_t n_deps;
};

/* A method's shape, as written in the .proto. Streaming methods are served
 * and called through <verbrpc/stream.h>; vrpc_call on one fails
 * UNIMPLEMENTED without sending. */
enum vrpc_method_kind {
    VRPC_METHOD_UNARY = 0,            /* rpc M(Req) returns (Resp) */
    VRPC_METHOD_SERVER_STREAMING = 1, /* rpc M(Req) returns (stream Resp) */
    VRPC_METHOD_CLIENT_STREAMING = 2, /* rpc M(stream Req) returns (Resp) */
    VRPC_METHOD_BIDI_STREAMING = 3,   /* rpc M(stream Req) returns (stream Resp) */
};

struct vrpc_method_desc {
    const char *full_name;                    /* "/pkg.Service/Method", as gRPC spells it */
    uint32_t id;                              /* vrpc_method_id(full_name) */
    const ProtobufCMessageDescriptor *input;  /* request type */
    const ProtobufCMessageDescriptor *output; /* response type */
    const struct vrpc_file_desc *file;        /* the .proto that declares it, for reflection;
                                                 NULL: none (the method is still listed) */
    enum vrpc_method_kind kind;               /* 0 (omitted): unary */
};

/* FNV-1a 32-bit hash of full_name (offset basis 2166136261, prime 16777619),
 * over the bytes of the string without its NUL. This is the method id on the
 * wire. */
VRPC_API uint32_t vrpc_method_id(const char *full_name);

/* ---- metadata -------------------------------------------------------------
 * Key/value pairs sent with a request, like gRPC's headers. Keys are 1-255
 * bytes of [a-z0-9-_.] (lowercase, as in HTTP/2); values are any bytes (up to
 * 65535). At most VRPC_MD_MAX entries per call, whose encoding (4 + key
 * length + 1 + value length bytes each) is at most 65535 bytes in all; it
 * also counts against the message size limit. */
#define VRPC_MD_MAX 32
struct vrpc_metadata {
    const char *key;   /* NUL-terminated */
    const void *value; /* value_len bytes, need not be NUL-terminated */
    size_t value_len;
};

/* ---- time -----------------------------------------------------------------
 * All deadlines are CLOCK_MONOTONIC nanoseconds. */
#define VRPC_NO_DEADLINE INT64_MAX
VRPC_API int64_t vrpc_now_ns(void);

/* ---- message size -----------------------------------------------------------
 * Each side states the largest payload it accepts (max_msg_size in the
 * options) and learns the peer's at connect time. Payloads that do not fit
 * the transport's eager size (8 KiB frames) travel by rendezvous: the sender
 * packs into a registered large buffer and the receiver reads it (RDMA READ
 * on verbs), see docs/PROTOCOL.md. A request above the server's limit fails
 * on the client with RESOURCE_EXHAUSTED and both figures in the message,
 * without being sent; a response above the client's limit makes
 * vrpc_server_call_respond return -EMSGSIZE and the client gets
 * RESOURCE_EXHAUSTED. */
#define VRPC_MSG_SIZE_DEFAULT (16u << 20)
#define VRPC_MSG_SIZE_MAX (1u << 30)

/* ---- client ---------------------------------------------------------------*/

struct vrpc_channel;

/* gRPC's connectivity states. */
enum vrpc_channel_state {
    VRPC_CHANNEL_IDLE = 0,              /* no connection yet; the first call connects */
    VRPC_CHANNEL_CONNECTING = 1,        /* a connect (and handshake) is in progress */
    VRPC_CHANNEL_READY = 2,             /* connected; calls go out at once */
    VRPC_CHANNEL_TRANSIENT_FAILURE = 3, /* last connect failed or the connection was
                                           lost; calls fail fast with UNAVAILABLE until
                                           the back-off has passed, then one reconnects */
    VRPC_CHANNEL_SHUTDOWN = 4,          /* vrpc_channel_destroy() has begun */
};
VRPC_API const char *vrpc_channel_state_name(enum vrpc_channel_state st);

/* Latency modes (vrpc_channel_opts.spin_us, vrpc_server_opts.spin_us): how
 * long the threads that wait for the network busy-wait before they sleep.
 * Spinning saves the wake-up a sleeper pays when its message comes (an epoll
 * or futex wake, on an idle CPU of a VM a wake from idle: tens of us); it
 * costs the CPU it spins on, while nothing comes.
 *
 * VRPC_SPIN_ADAPTIVE (0): pollers spin twice the recent gaps between their
 * completions and synchronous callers twice the recent round trips (EWMAs),
 * at least 50 us and at most VRPC_SPIN_ADAPTIVE_MAX_US per wait; when most
 * recent waits were longer than that (sparse traffic, slow handlers), 50 us.
 * Idle workers adapt between 12.5 and 200 us (vrpc_sched_config.spin_us).
 * On a fast link this is the fixed 50 us of earlier versions; on a slow one
 * (a VM, emulated RDMA) it follows the round trip instead of paying a wake-up
 * per message. Idle, nothing spins.
 * VRPC_SPIN_ALWAYS: never sleep. The poller busy-polls, idle workers spin
 * and waiting callers spin until answered: every core they run on is busy
 * all the time, idle or not. For dedicated cores, as perftest and HPC
 * frameworks run; with fewer cores than spinning threads it is slower, not
 * faster (they take turns). A caller running on its pinned poller's CPU
 * (cpu_mask) still sleeps at once.
 * N: a fixed window of N microseconds for the poller and callers (workers
 * adapt around it, as vrpc_sched_config.spin_us says). */
#define VRPC_SPIN_ADAPTIVE 0u
#define VRPC_SPIN_ALWAYS UINT32_MAX
#define VRPC_SPIN_ADAPTIVE_MAX_US 1000u

struct vrpc_channel_opts {
    struct vrpc_sched *sched;    /* workers for async callbacks; NULL: the channel
                                    creates its own with `threads` workers. A caller's
                                    scheduler must outlive the channel. */
    unsigned threads;            /* workers of the channel's own scheduler; 0: 2.
                                    (A channel to one URI holds one connection and
                                    one poller; one over many servers holds
                                    conns_per_addr per server, each with its own.) */
    int64_t default_timeout_us;  /* deadline of calls whose opts say 0; 0: none */
    uint32_t max_msg_size;       /* largest response payload (metadata + message)
                                    accepted; 0: VRPC_MSG_SIZE_DEFAULT; at most
                                    VRPC_MSG_SIZE_MAX. Requests are bounded by the
                                    server's own limit (learnt at connect). */
    uint32_t max_outstanding;    /* pending calls at once (further sync calls wait
                                    for a slot, async ones queue); the server's limit
                                    lowers it; 0: 256 */
    uint32_t connect_timeout_ms; /* per attempt, including the handshake; 0: 5000 */
    uint32_t backoff_initial_ms; /* first reconnect delay after a failure; 0: 100 */
    uint32_t backoff_max_ms;     /* cap of the doubling delay; 0: 5000 */
    const char *src_addr;        /* bind the local side to this IP literal (on verbs
                                    it picks the device); NULL: any. Copied. */
    bool no_spin;                /* never busy-wait (poller, own workers, synchronous
                                    waiters sleep at once): lower latency is traded
                                    for CPU; for CPU accounting, e.g. under callgrind.
                                    Overrides spin_us. */
    uint32_t spin_us;            /* the latency mode: how long the channel's poller,
                                    its synchronous callers waiting for a response
                                    and the idle workers of its own scheduler spin
                                    before they sleep (a caller's scheduler keeps its
                                    own setting). VRPC_SPIN_ADAPTIVE (0, the default):
                                    about as long as recent waits took, see
                                    VRPC_SPIN_ADAPTIVE; VRPC_SPIN_ALWAYS: never sleep,
                                    the lowest latency for a poller and workers that
                                    keep their CPUs busy even when idle (dedicated
                                    cores); N: that many microseconds each */
    uint64_t max_pinned;         /* bytes the channel's large-message buffers may
                                    keep registered (vrpc_transport_attr.max_pinned);
                                    0: 256 MiB; must be >= max_msg_size */
    uint32_t hold_timeout_ms;    /* a server that neither read (DONE) nor answered a
                                    large request (or a large stream message of
                                    ours) this long after it was offered
                                    loses its connection (aborted); 0: 60000 */
    uint32_t min_transfer_rate;  /* bytes/s: a large response (or a large stream
                                    message from the server) must be read within
                                    transfer_floor_ms + its size at this rate,
                                    counted from its announcement (the server's
                                    rule for large requests, vrpc_server_opts).
                                    A stream message's stream ends the same way.
                                    A slower one is abandoned: the call ends
                                    RESOURCE_EXHAUSTED naming this limit (unless
                                    its deadline or a cancel ended it first: the
                                    call's deadline covers the read as always),
                                    the buffer returns and the connection is
                                    aborted with a logged reason ("large transfer
                                    too slow"), failing its other calls
                                    UNAVAILABLE; the next call reconnects.
                                    0: 1 MiB/s */
    uint32_t transfer_floor_ms;  /* the fixed part of that limit; 0: 10000 */
    uint32_t stream_window;      /* messages per stream the channel accepts from a
                                    server before its application consumed them
                                    (<verbrpc/stream.h>); 0: VRPC_STREAM_WINDOW_DEFAULT */
    uint32_t max_queued;         /* async calls queued, in order, while max_outstanding
                                    are pending; beyond them (and for a large request
                                    without a slot) vrpc_call_async returns -EAGAIN;
                                    0: max_outstanding */
    uint64_t cpu_mask;           /* CPU placement, bit i = CPU i (CPUs 0..63): the
                                    channel's poller runs on the lowest CPU of the mask
                                    and the workers of its own scheduler are pinned
                                    round-robin over the mask's CPUs (a caller's
                                    scheduler keeps its own placement). 0: no pinning.
                                    Pin the threads that call to the same CPUs: a
                                    hand-off between threads of one CPU costs a few
                                    microseconds, waking a thread on an idle CPU of a
                                    VM can cost tens (rpc_bench --placement). Pinned,
                                    the poller busy-polls without yielding its CPU
                                    until it delivers, then yields: waiting callers
                                    sleep at once (the poller wakes them), idle
                                    workers spin by yielding the CPU (sched_yield). */
    /* Many servers behind one channel (a resolver target such as
     * "list://h1:p1,h2:p2", rpc/resolver.h; docs/GUIDE.md "Many servers"). A
     * plain URI ignores these fields. */
    unsigned lb_policy;                    /* enum vrpc_lb_policy; 0: round robin */
    unsigned conns_per_addr;               /* connections (each with its own poller)
                                              per server address; 0: 1, at most 16 */
    uint32_t health_check_ms;              /* follow each server's Health.Watch
                                              (reopened this long after it ends), or
                                              poll its Health.Check this often where
                                              Watch is UNIMPLEMENTED; NOT_SERVING takes
                                              it out of rotation until it serves
                                              again; 0: off */
    uint32_t outlier_failures;             /* consecutive failed calls (UNAVAILABLE,
                                              INTERNAL, UNKNOWN, DEADLINE_EXCEEDED)
                                              that eject a server; 0: 5 */
    uint32_t outlier_eject_ms;             /* first ejection time, doubled for each
                                              further ejection up to 10x; 0: 1000 */
    const struct vrpc_retry_policy *retry; /* n_retry per-method retry policies
                                              (copied at create); NULL: none (only
                                              transparent retries, see below) */
    size_t n_retry;
    uint32_t retry_max_tokens;        /* the retry budget (gRPC's retry
                                              throttling): a token bucket of this
                                              many tokens, one taken per failed
                                              attempt, retry_token_ratio_milli/1000
                                              given back per success; retries stop
                                              while it is at half or below; 0: 10 */
    uint32_t retry_token_ratio_milli; /* 0: 100 (0.1 token per success) */
};

/* How a channel over many servers picks one per call (vrpc_channel_opts.lb_policy).
 * Only servers READY, healthy (Health) and not ejected (outlier detection) are
 * candidates; when there are none, the policy's choice among all others is
 * tried (which connects it). */
enum vrpc_lb_policy {
    VRPC_LB_ROUND_ROBIN = 0,       /* each in turn */
    VRPC_LB_PICK_FIRST = 1,        /* the first usable one in the target's order */
    VRPC_LB_LEAST_OUTSTANDING = 2, /* the fewer calls outstanding of two chosen at random */
    VRPC_LB_RING_HASH = 3,         /* consistent hashing of vrpc_call_opts.hash_key on a
                                      ring (100 points per server): the same key goes to
                                      the same server on every channel with the same
                                      set; adding or removing one of N moves ~1/N of the
                                      keys; calls without a key go to a random one */
};

/* A retry policy for one method, after gRPC's retry design. An attempt that
 * ends with one of retryable_codes is retried after a back-off (the first
 * random in [0, initial_backoff_ms], then each bound multiplied by
 * backoff_multiplier_pct/100 up to max_backoff_ms, jittered the same way),
 * within the call's one deadline and the channel's retry budget, up to
 * max_attempts attempts in all; only if idempotent, because the server may
 * have run it. A call the server never received (refused by GOAWAY, no
 * connection, the send failed) is retried transparently on another server,
 * whatever its policy (also without one), within the deadline. */
#define VRPC_CODE_BIT(code) (1u << (code))
struct vrpc_retry_policy {
    const char *method;              /* full name "/pkg.Service/Method", or "*": every
                                        method without its own entry. Copied. */
    uint32_t max_attempts;           /* including the first; 0 or 1: no retry; at most 5 */
    uint32_t initial_backoff_ms;     /* 0: 50 */
    uint32_t max_backoff_ms;         /* 0: 1000 */
    uint32_t backoff_multiplier_pct; /* 0: 200 */
    uint32_t retryable_codes;        /* VRPC_CODE_BIT(VRPC_UNAVAILABLE) | ...; 0: UNAVAILABLE */
    bool idempotent;                 /* retrying after the server may have run it is safe */
};

/* One server of a channel over many (vrpc_channel_subchannels). */
struct vrpc_subchannel_info {
    char uri[96];                  /* "tcp://10.0.0.1:5000" */
    enum vrpc_channel_state state; /* the best of its connections */
    bool healthy;                  /* not NOT_SERVING (Health) */
    bool ejected;                  /* out of rotation after consecutive failures */
    uint32_t outstanding;          /* calls in flight on it now */
    uint64_t calls, failures, ejections;
};
/* Up to cap entries into out, in the target's order; returns how many the
 * channel has (also when > cap), 0 for a plain channel. Any thread. */
VRPC_API size_t vrpc_channel_subchannels(const struct vrpc_channel *ch, struct vrpc_subchannel_info *out, size_t cap);

/* Fill *o with the defaults above (all zeros mean defaults, too). */
VRPC_API void vrpc_channel_opts_init(struct vrpc_channel_opts *o);

/* Create a channel to `uri`: "tcp://host:port", "verbs://ip:port",
 * "auto://host:port" or a bare "host:port" (= auto: verbs where a usable RDMA
 * device exists, else TCP); IPv6 hosts in brackets. The channel starts IDLE
 * and connects on the first call (or vrpc_channel_connect). o may be NULL.
 * -EINVAL for a malformed URI (the syntax of vrpc_uri_check in transport.h,
 * or a scheme that names no backend; logged with the reason), also for
 * max_msg_size above VRPC_MSG_SIZE_MAX or above max_pinned (logged with both
 * figures). A host name is resolved at connect time: one that does not
 * resolve fails the calls with UNAVAILABLE "cannot resolve the host name".
 * A resolver target ("list://h1:p1,h2:p2", "dns://name:port", "file:///path",
 * "etcd://host:port/prefix"; docs/GUIDE.md section 16) makes a channel over
 * every server it names, following the set as it changes: each call goes to
 * one of them by o->lb_policy, with health checks, outlier ejection and
 * retries (vrpc_retry_policy); every function on channels works on it the
 * same way. -ENOTSUP for a scheme this build lacks (etcd without libcurl). */
VRPC_API int vrpc_channel_create(const char *uri, const struct vrpc_channel_opts *o, struct vrpc_channel **out);

/* Fail every pending call with CANCELLED (each callback runs once), close the
 * connection and free the channel. Must not run concurrently with calls being
 * started on ch, nor from one of ch's callbacks. Safe on NULL. */
VRPC_API void vrpc_channel_destroy(struct vrpc_channel *ch);

VRPC_API enum vrpc_channel_state vrpc_channel_state(const struct vrpc_channel *ch);

/* Connect now (if not READY) and wait up to timeout_ms for READY.
 * 0, -ETIMEDOUT, or another negative errno of the last attempt. Errors that
 * waiting does not cure end it at once: -ECONNREFUSED (nothing listens),
 * -ENXIO (the host name does not resolve), -EINVAL, -EADDRNOTAVAIL (e.g. a
 * verbs address on no RDMA device), -EAFNOSUPPORT. */
VRPC_API int vrpc_channel_connect(struct vrpc_channel *ch, int timeout_ms);

/* Response metadata of a unary call: the caller gives the array, the call
 * fills entries[0 .. n_initial) with the server's initial metadata and the
 * next n_trailing with its trailing metadata (entries beyond cap are
 * dropped, counted in n_dropped). Keys and values point into the memory of
 * the response (a synchronous call: the thread's arena, valid as *resp;
 * asynchronous: valid during the callback). Written on every outcome. */
struct vrpc_resp_md {
    struct vrpc_metadata *entries; /* cap entries, the caller's */
    size_t cap;
    size_t n_initial, n_trailing, n_dropped; /* out */
};

/* Per-call options. A zeroed struct (or NULL) means defaults. */
#define VRPC_NO_TIMEOUT (-1)
struct vrpc_call_opts {
    int64_t timeout_us;             /* 0: channel default; VRPC_NO_TIMEOUT: none;
                                           > 0: deadline = now + timeout_us */
    const struct vrpc_metadata *md; /* md_count entries, copied into the request
                                           before the call function returns */
    size_t md_count;
    uint64_t *call_id;            /* if set, the call's id is stored here (atomically,
                                           with release order) before the call can complete
                                           and before the request is sent (an async call
                                           queued for lack of a slot gets its id when it is
                                           queued and keeps it when it is sent), so another
                                           thread can pass it to vrpc_channel_cancel. Ids
                                           are opaque; 0 is never an id. */
    unsigned flags;               /* VRPC_CALL_* below; 0: none */
    struct vrpc_resp_md *resp_md; /* if set, receives the server's initial and
                                           trailing metadata (see below) */
    const void *hash_key;         /* VRPC_LB_RING_HASH: hash_key_len bytes that place */
    size_t hash_key_len;          /*   the call on a server (copied into no state) */
    char *peer;                   /* if set, receives the URI of the server the (last
                                     attempt of the) call went to, NUL-terminated,
                                     truncated to peer_cap bytes (a synchronous call:
                                     before it returns; async: before the callback);
                                     "" when it went nowhere */
    size_t peer_cap;
};

/* vrpc_call_opts.flags: for vrpc_call_async, req and every byte it points to
 * stay valid and unchanged until the callback runs (not just until the call
 * function returns). A large request may then be sent from the caller's
 * memory without a copy, as a synchronous call's is (see vrpc_call). */
#define VRPC_CALL_REQ_HELD 0x1u
/* vrpc_call_opts.flags: for vrpc_call_async, run the callback on the
 * channel's poller thread, right where the response arrives, instead of
 * handing it to a worker: eRPC's continuations. It saves the hand-off (a
 * queue, and a wake-up or a context switch) per call; an asynchronous client
 * that issues its next call from the callback then keeps the poller's CPU
 * the whole round trip, as perftest's and libfabric's ping-pongs do.
 * The contract, as for vrpc_server_run_on_poller: the callback returns
 * within microseconds and never blocks, since the poller receives nothing
 * for its connection while it runs. It may call vrpc_call_async, which never
 * waits: from a poller it fails UNAVAILABLE at once (through its callback)
 * where the channel has no connection, rather than connect; a synchronous
 * vrpc_call from it fails FAILED_PRECONDITION at once.
 * The callback runs where its outcome is decided: on the poller for a
 * response, and for a connection loss the poller detects (UNAVAILABLE); on a
 * worker for a deadline, a cancel or a call that failed before it was sent,
 * and for every call of a channel over many servers. The flag is a request,
 * not a promise about the thread. In a stream's call options it has the
 * stream's on_read run on the poller (stream.h, struct vrpc_stream_cbs). */
#define VRPC_CALL_CB_ON_POLLER 0x2u

/* Synchronous unary call. Blocks the calling thread on its own waiter until
 * the response, the deadline, a cancel or the connection's loss, whichever
 * comes first. Returns the status code (0 = VRPC_OK); if st is not NULL it
 * gets the code and message.
 * Ownership: req stays the caller's; it must not change while the call runs.
 * Big bytes values (16 KiB and more, in top-level bytes fields) of a request
 * above the eager size may be sent straight from the caller's memory (TCP),
 * so the call returns only once the server can no longer read them: also
 * after a deadline, a cancel or a failure, it waits until the server has
 * finished (or refused, or given up) reading the request, the connection
 * is gone, or the channel's hold_timeout_ms has passed.
 * On VRPC_OK *resp points to the response, unpacked into an arena owned by the
 * calling thread: it stays valid until this thread's next vrpc_call (on any
 * channel) or vrpc_thread_release(), and must not be freed by the caller.
 * Async callbacks' responses live in a separate arena of the worker: a
 * vrpc_call made inside a callback leaves the callback's resp intact.
 * On any other code *resp is not written. */
VRPC_API int vrpc_call(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                       ProtobufCMessage **resp, const struct vrpc_call_opts *opts, struct vrpc_status *st);

/* Release the calling thread's response arena (the memory behind the last
 * vrpc_call's *resp). Optional: it is also freed when the thread exits. */
VRPC_API void vrpc_thread_release(void);

/* Completion of an asynchronous call. Runs exactly once per accepted call, on
 * a scheduler worker (or on the poller: VRPC_CALL_CB_ON_POLLER). resp is NULL unless st->code == VRPC_OK; it and st are
 * valid only during the callback (unpacked into the worker's arena). */
typedef void (*vrpc_call_cb)(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg);

/* Asynchronous unary call. Returns 0 when the call was accepted: cb will run
 * exactly once, also for failures such as UNAVAILABLE or DEADLINE_EXCEEDED.
 * Returns -EINVAL (bad arguments), -ESHUTDOWN (channel being destroyed) or
 * -EAGAIN (back-pressure: max_outstanding calls pending and max_queued more
 * queued; retry once some complete) when it was not accepted: cb will not
 * run. Never waits for a slot or a credit: a call without a free slot is
 * queued and sent, in order, when one frees (its deadline runs meanwhile,
 * and its id cancels it).
 * Only a channel that is not connected yet makes it wait, for the connect
 * (at most connect_timeout_ms or the deadline). req stays the caller's
 * (packed before return). */
VRPC_API int vrpc_call_async(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const ProtobufCMessage *req,
                             const struct vrpc_call_opts *opts, vrpc_call_cb cb, void *arg);

/* Cancel the call with this id (from vrpc_call_opts.call_id). If it is still
 * pending it completes at once with CANCELLED: an async call still queued for
 * a slot leaves the queue and is never sent; for a call already sent the
 * server is told. Returns 0 if this cancel decided the outcome, -ENOENT if the
 * call had already completed (or the id is unknown). Any thread. */
VRPC_API int vrpc_channel_cancel(struct vrpc_channel *ch, uint64_t call_id);

/* ---- server ---------------------------------------------------------------*/

struct vrpc_server;
struct vrpc_server_call;

/* A handler runs on a scheduler worker (or on a poller:
 * vrpc_server_run_on_poller). req is valid until the call is
 * answered (respond or fail) and belongs to the call. The handler must answer
 * exactly once, now or later from any thread. */
typedef void (*vrpc_handler_fn)(struct vrpc_server_call *call, const ProtobufCMessage *req, void *user);

struct vrpc_server_opts {
    struct vrpc_sched *sched; /* workers that run handlers; NULL: own scheduler */
    unsigned threads;         /* workers of the server's own scheduler; 0: 2 */
    unsigned pollers;         /* transport poller threads, each with its own
                                      completion queue; connections are spread over
                                      them; 0: 1 */
    uint32_t max_concurrent;  /* calls in flight per connection (credits granted
                                      to each client); 0: 256. This is also what
                                      bounds one connection's share of worker
                                      time: a client that floods has at most this
                                      many handlers queued or running (a request
                                      beyond it is a protocol error), behind which
                                      another client's call waits at worst
                                      (handlers are queued in arrival order) */
    uint32_t max_msg_size;    /* largest request payload (metadata + message)
                                      accepted; 0: VRPC_MSG_SIZE_DEFAULT; at most
                                      VRPC_MSG_SIZE_MAX. Responses are bounded by
                                      each client's own limit. */
    uint32_t max_depth;       /* protobuf nesting limit for requests; 0: 64 */
    bool no_spin;             /* never busy-wait (see vrpc_channel_opts) */
    uint32_t spin_us;         /* the latency mode of the server's pollers and of
                                 the idle workers of its own scheduler, as
                                 vrpc_channel_opts.spin_us (no_spin overrides it) */
    uint64_t max_pinned;      /* bytes the server's large-message buffers may
                                      keep registered; 0: 256 MiB; >= max_msg_size */
    uint32_t hold_timeout_ms; /* a client that has not read (DONE) a large
                                      response this long after it was offered loses
                                      its connection (aborted: the buffer returns at
                                      once); 0: 60000 */
    /* Fair shares: what one connection may hold of what all share. Hitting
     * a limit ends that connection or that call (logged with the client's
     * address and the option's name), never another client's. */
    uint32_t max_sends_per_conn;  /* frames (responses, statuses, DONEs) one
                                      connection may have handed to the transport
                                      and not yet sent, i.e. waiting for its
                                      client's credits or socket; a client at the
                                      limit does not read its responses and loses
                                      its connection ("client does not read").
                                      The shared send pool holds at least four of
                                      these (1024 buffers at least). A client
                                      within its call credits never reaches it.
                                      0: max_concurrent + 64 */
    uint32_t send_stall_ms;       /* a connection with more than half of
                                      max_sends_per_conn out and no send
                                      completing for this long is failed the
                                      same way; 0: 5000 */
    uint64_t max_pinned_per_conn; /* bytes of large requests one connection may
                                      have announced and not yet delivered (being
                                      read); a request above it is refused
                                      RESOURCE_EXHAUSTED naming this option
                                      (refused, not deferred: a deferred read
                                      would keep its slot and the client's
                                      deadline with no bound the server controls).
                                      0: max_pinned / 4, at least max_msg_size;
                                      at most max_pinned */
    uint32_t min_transfer_rate;   /* bytes/s: a large request (or a large
                                      stream message from the client) must be
                                      read within transfer_floor_ms + its size
                                      at this rate, counted from its
                                      announcement (and, a request, within the
                                      call's own deadline); a slower one is
                                      abandoned, answered RESOURCE_EXHAUSTED (or
                                      DEADLINE_EXCEEDED when the call's deadline
                                      came first) and its connection failed
                                      ("large transfer too slow"): aborted
                                      (vrpc_ep_abort), so the buffer returns
                                      at once. 0: 1 MiB/s */
    uint32_t transfer_floor_ms;   /* the fixed part of that limit; 0: 10000 */
    uint32_t stream_window;       /* messages per stream the server accepts from a
                                      client before its handler consumed them
                                      (<verbrpc/stream.h>); 0: VRPC_STREAM_WINDOW_DEFAULT */
    uint64_t cpu_mask;            /* CPU placement, bit i = CPU i (CPUs 0..63):
                                      poller i runs on the (i mod n)-th CPU of the
                                      mask, the workers of the server's own scheduler
                                      are pinned round-robin over it (a caller's
                                      scheduler keeps its own placement). 0: no
                                      pinning. See vrpc_channel_opts.cpu_mask. */
    /* Connections that hold resources while idle (each connection costs its
     * call table, and on its poller 2 posted receive buffers of the eager
     * size, 16 KiB by default, plus what its credits grew to while busy): */
    uint32_t max_connections;   /* connections at once; one more is refused at
                                      the transport handshake (logged; the client's
                                      connect fails, it backs off and retries).
                                      Receive buffers grow by 2 per connection up
                                      to this bound as connections arrive (and stay
                                      posted after); 0: 1024 */
    uint32_t hello_timeout_ms;  /* a client that has not sent its RPC HELLO this
                                      long after its transport connection was
                                      accepted is disconnected (logged); 0: 5000 */
    uint32_t idle_timeout_ms;   /* a connection with no call in flight and no
                                      request for this long gets GOAWAY and is
                                      closed (logged; gRPC's max_connection_idle:
                                      a channel reconnects on its next call). Up to
                                      a quarter of the smaller of the two timeouts
                                      (at most 1 s) late. 0: 300000 (5 min);
                                      VRPC_SERVER_NO_IDLE_TIMEOUT: never */
    uint32_t credit_timeout_ms; /* a client that returns no transport credits
                                      while answers wait for them this long loses
                                      its connection (vrpc_transport_attr
                                      .credit_timeout_ms); 0: 10000 */
    const char *metrics_addr;   /* serve the server's metrics as Prometheus text
                                      over HTTP (GET /metrics, <verbrpc/metrics.h>) on
                                      this "IP:port", e.g. "127.0.0.1:9464" (port 0:
                                      any; vrpc_server_metrics_uri tells); from start
                                      to destroy, on a thread of its own. Plain HTTP,
                                      no authentication: bind it to a private
                                      address. Copied. NULL: no endpoint. A malformed
                                      address fails vrpc_server_create with -EINVAL, a
                                      library built without the endpoint
                                      (VRPC_WITH_METRICS=OFF or no libmicrohttpd)
                                      with -ENOTSUP; an address in use fails
                                      vrpc_server_start. */
};
#define VRPC_SERVER_NO_IDLE_TIMEOUT UINT32_MAX
VRPC_API void vrpc_server_opts_init(struct vrpc_server_opts *o);

/* o may be NULL. The server does nothing until vrpc_server_start(). -EINVAL
 * for max_msg_size above VRPC_MSG_SIZE_MAX or above max_pinned (logged). */
VRPC_API int vrpc_server_create(const struct vrpc_server_opts *o, struct vrpc_server **out);

/* Register a handler; only before vrpc_server_start (-EBUSY after). -EINVAL if
 * m->id != vrpc_method_id(m->full_name), a descriptor is missing, or m is a
 * streaming method (m->kind: see vrpc_server_register_stream); -EEXIST if
 * the id (name or hash collision) is already registered. m must outlive s. */
VRPC_API int vrpc_server_register(struct vrpc_server *s, const struct vrpc_method_desc *m, vrpc_handler_fn fn,
                                  void *user);

/* Run the handler of the method full_name ("/pkg.Service/Method",
 * registered before) on the poller thread that received its request, instead
 * of handing it to a worker: eRPC's dispatch-thread handlers. It saves the
 * hand-off (a queue, and a wake-up or a spinning worker: on a machine with
 * fewer cores than busy threads, a context switch) on every call, which is
 * most of a small call's latency over RDMA.
 * The contract, which the server cannot check: the handler returns within a
 * few microseconds and never blocks (no locks held long, no I/O, no
 * synchronous call, no blocking stream API), because while it runs the
 * poller receives nothing for any of its connections: a slow handler delays
 * every other client on that poller. It may still keep the call and answer
 * later from another thread. Its answers never wait for a send buffer (if
 * the shared pool is empty the answer is dropped and logged, as the poller's
 * own refusals are; the client's deadline covers it).
 * Large requests (those that arrive by rendezvous) still go to a worker, so
 * the poller never decodes more than one frame's worth per call.
 * A synchronous vrpc_call from such a handler fails FAILED_PRECONDITION at
 * once (use vrpc_call_async, with VRPC_CALL_CB_ON_POLLER or not).
 * For a streaming method, the stream's on_read and its queued small writes
 * run on the poller whenever its task is idle (stream.h, struct
 * vrpc_server_stream_ops); start and the rest stay on workers.
 * Only before vrpc_server_start (-EBUSY after); -ENOENT if no method of that
 * name is registered; -EINVAL for NULL arguments. */
VRPC_API int vrpc_server_run_on_poller(struct vrpc_server *s, const char *full_name);

/* Listen on uri (as for channels; port 0 picks a free port) and start serving.
 * -EINVAL for a malformed URI (logged with the reason, see vrpc_channel_create). */
VRPC_API int vrpc_server_start(struct vrpc_server *s, const char *uri);

/* The URI actually bound (with the real port) into buf (NUL-terminated).
 * -ENOSPC if len is too small, -ENOTCONN before start. */
VRPC_API int vrpc_server_uri(const struct vrpc_server *s, char *buf, size_t len);

/* Graceful shutdown: stop accepting, send GOAWAY on every connection (clients
 * send new calls elsewhere), wait up to timeout_ms for calls in flight to be
 * answered, then close every connection (calls still unanswered then are
 * dropped: they read as cancelled, and their later respond/fail returns
 * -ECONNRESET and only releases the call, also after vrpc_server_destroy).
 * Returns 0 if everything drained in time, -ETIMEDOUT otherwise. Idempotent. */
VRPC_API int vrpc_server_shutdown(struct vrpc_server *s, int timeout_ms);

/* Shut down (timeout 0 if not done already) and free. Safe on NULL. Does not
 * wait for deferred calls to be answered (see shutdown), only for handlers
 * that are running right now to return. */
VRPC_API void vrpc_server_destroy(struct vrpc_server *s);

/* Answer with VRPC_OK and resp (packed before return; resp stays the
 * caller's). Any thread, once per call; the call object is invalid after.
 * Returns 0, -ECONNRESET if the connection is gone or the server shut down
 * (the call is still released; also when the client does not read its
 * responses and lost its connection for it, see max_sends_per_conn, or when
 * no send buffer of the server's came free within 20 ms: the answer is
 * dropped and logged), -ETIMEDOUT if the call's deadline passed while
 * the handler ran (the server has already answered DEADLINE_EXCEEDED; the
 * call is released), -EMSGSIZE if resp exceeds the client's message limit (the
 * client gets RESOURCE_EXHAUSTED naming both sizes instead; the call is
 * released), -ENOBUFS if a large response finds the server's large-buffer
 * memory bound (max_pinned) reached (the client gets RESOURCE_EXHAUSTED with
 * the figures), -EINVAL if resp is not of the method's output type (the client
 * gets INTERNAL). */
VRPC_API int vrpc_server_call_respond(struct vrpc_server_call *call, const ProtobufCMessage *resp);

/* Answer with a non-OK code and a message (may be NULL). Same contract as
 * respond. code VRPC_OK is turned into VRPC_UNKNOWN. */
VRPC_API int vrpc_server_call_fail(struct vrpc_server_call *call, enum vrpc_code code, const char *msg);

/* Accessors, valid from handler start until the call is answered. */
VRPC_API const struct vrpc_method_desc *vrpc_server_call_method(const struct vrpc_server_call *call);
/* Absolute deadline (CLOCK_MONOTONIC ns, from the client's budget at arrival)
 * or VRPC_NO_DEADLINE. */
VRPC_API int64_t vrpc_server_call_deadline(const struct vrpc_server_call *call);
/* True once the client cancelled the call, its connection was lost, the
 * server shut down under it, or its deadline passed while the handler ran
 * (then the server has answered DEADLINE_EXCEEDED for the handler, and a
 * late answer returns -ETIMEDOUT). A handler doing long work should poll it. */
VRPC_API bool vrpc_server_call_is_cancelled(const struct vrpc_server_call *call);
VRPC_API size_t vrpc_server_call_metadata_count(const struct vrpc_server_call *call);
/* i-th entry; pointers valid until the call is answered. -ERANGE if i is too big. */
VRPC_API int vrpc_server_call_metadata_at(const struct vrpc_server_call *call, size_t i, struct vrpc_metadata *out);
/* First value for key. -ENOENT if absent. */
VRPC_API int vrpc_server_call_metadata_get(const struct vrpc_server_call *call, const char *key, const void **value,
                                           size_t *value_len);
/* Response metadata of a unary call (copied): initial metadata, sent before
 * the answer, and trailing metadata, sent with it; each at most once, before
 * respond/fail. 0, -EALREADY (set before), -EINVAL (bad keys or values, more
 * than VRPC_MD_MAX entries). */
VRPC_API int vrpc_server_call_send_metadata(struct vrpc_server_call *call, const struct vrpc_metadata *md, size_t n);
VRPC_API int vrpc_server_call_set_trailers(struct vrpc_server_call *call, const struct vrpc_metadata *md, size_t n);
/* Memory from the call's arena (freed when the call is answered): lets a
 * handler build its response without malloc. NULL if out of memory. */
VRPC_API void *vrpc_server_call_alloc(struct vrpc_server_call *call, size_t size);

/* ---- server statistics ----------------------------------------------------
 * Counters are kept per registered method with relaxed atomics; a snapshot
 * taken while calls run is approximate but never torn per field. Latencies
 * are from request arrival to the transport having taken a response message
 * (a status-only or large response: to the answer being decided), from a
 * log-linear histogram (bucket error < 7%; a percentile is never reported
 * above latency_max_us). <verbrpc/metrics.h> renders these and more as
 * Prometheus text. */
struct vrpc_method_stats {
    const struct vrpc_method_desc *method;
    uint64_t calls;                    /* answered calls, any code */
    uint64_t by_code[VRPC_CODE_COUNT]; /* answered calls per status code */
    uint64_t latency_p50_us, latency_p90_us, latency_p99_us, latency_max_us;
};
/* Copies up to cap entries (registration order) into out and sets *n to the
 * number of registered methods (which may exceed cap). Any thread. */
VRPC_API int vrpc_server_stats(const struct vrpc_server *s, struct vrpc_method_stats *out, size_t cap, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
