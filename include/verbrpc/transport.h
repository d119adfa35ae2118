/* verbrpc transport: reliable connections that move messages between hosts,
 * shaped after RDMA verbs (queue pairs, shared receive queues, completion
 * queues) so that the verbs backend is thin and the TCP backend emulates verbs.
 *
 * Objects
 *   vrpc_transport  one backend instance (one device on verbs). Created by
 *                   backend name: "tcp", "verbs", or "auto" (verbs where a
 *                   usable RDMA device exists, else tcp).
 *   vrpc_cq         a completion queue, its shared receive queue (SRQ) and
 *                   exactly one poller thread. No other thread ever polls it.
 *   vrpc_listener   accepts connections and spreads them over a set of CQs.
 *   vrpc_ep         one reliable, ordered, message-preserving connection,
 *                   bound to one CQ for all its completions.
 *   vrpc_mr         registered memory (a real memory region on verbs).
 *   vrpc_pool       fixed-size message buffers carved from one vrpc_mr.
 *
 * URIs (vrpc_listen, vrpc_connect, vrpc_listener_uri):
 *   tcp://HOST:PORT        HOST is an IPv4 literal, a bracketed IPv6 literal
 *   verbs://HOST:PORT      ("tcp://[::1]:7000") or a name resolved with
 *                          getaddrinfo. On verbs, HOST selects the RDMA device
 *                          (the one owning that IP). PORT 0 on listen picks a
 *                          free port; vrpc_listener_uri() reports the bound one.
 *   The scheme must name the transport's backend (after "auto" resolved it,
 *   see vrpc_transport_name()); "auto://HOST:PORT" is accepted by any backend.
 *
 * Completions
 *   Every operation's outcome arrives as a struct vrpc_wc on a CQ, handed in
 *   batches to the callback given at vrpc_cq_create(), on the CQ's poller
 *   thread. The callback belongs to the layer above (it should only hand work
 *   on, e.g. to the scheduler); it may call any function of this header except
 *   the _destroy functions of the CQ it runs on, its transport, and of pools or
 *   MRs with buffers in flight. It must not block.
 *   Exactly-once: a call that returns 0 produces exactly one completion; a call
 *   that returns an error produces none and the caller keeps what it passed.
 *   Endpoint lifecycle events travel through the same completions:
 *     VRPC_WC_ACCEPTED   first completion of an accepted endpoint, on the CQ it
 *                        was assigned to, before any of its receives.
 *     VRPC_WC_DISCONNECTED  exactly one per endpoint that was ever connected
 *                        (returned by vrpc_connect or reported ACCEPTED), and
 *                        the last completion that names it: every send, read
 *                        and receive of it has completed before. status 0:
 *                        closed by either side gracefully; negative errno:
 *                        connection lost or protocol error (-ECONNRESET,
 *                        -EPROTO, -ETIMEDOUT, ...). The peer's departure is
 *                        a loss, -ECONNRESET, when it cuts off an operation
 *                        of ours under way: a vrpc_ep_read() not finished (a
 *                        closing TCP peer serves our reads first; a verbs
 *                        close cannot wait for them), or on verbs a send
 *                        that left and was not acknowledged. Sends still
 *                        queued for credits just flush, status 0 stays.
 *                        When an error completion broke the connection (a
 *                        READ refused: -EACCES), that error is the status,
 *                        whichever side or thread saw the end first. A peer
 *                        process that died with nothing of ours under way
 *                        reads as a close (0): rdma_cm's disconnect and
 *                        TCP's FIN look the same for both.
 *   Sends (and reads) still queued or in flight when an endpoint dies complete
 *   with status -ECANCELED (flush); the buffer is handed back in wc.buf.
 *
 * Credits and the shared receive queue (the rule every backend implements)
 *   Receive buffers are posted to a CQ, not to an endpoint: all endpoints of a
 *   CQ draw from them, so receive memory is what the user posts, not a
 *   per-connection queue. A sender never has more messages in flight to a
 *   peer than the peer has promised receive buffers for it:
 *   1. A credit is the receiver's promise that one posted buffer of its CQ is
 *      kept for that sender. A CQ never promises more credits in total than it
 *      has receive buffers posted and not yet consumed ("promised <= posted").
 *   2. Each endpoint has a reservation: the credits its peer holds plus those
 *      it consumed that are not yet paid back. It starts at 2 (carried in the
 *      handshake); a CQ with fewer than 2 unpromised buffers refuses the
 *      connection (-ENOBUFS at connect, logged and refused at accept). So each
 *      connection needs at least 2 posted buffers on its CQ, and connections
 *      can never starve each other: a reservation is never taken away.
 *   3. A message consumes one credit at the sender and one posted buffer at the
 *      receiver. Unpromised posted buffers (e.g. ones the user reposts) pay the
 *      consumers back, oldest debt first. While more than a quarter of the
 *      posted buffers stay unpromised, each payback also grows that endpoint's
 *      reservation by one, up to vrpc_transport_attr.credits: busy connections
 *      get deep pipelines, idle ones keep what they have, and a quarter stays
 *      for new connections.
 *   4. Returned credits travel in-band: piggybacked on every message, and as an
 *      explicit credit-only message once half the reservation (at least 1) has
 *      accumulated or the peer holds none. A credit-only message never needs
 *      a credit. On TCP it uses no receive buffer. On verbs, where it
 *      consumes a receive, each connection is given one extra posted buffer
 *      for credit-only messages beside its data reservation (so verbs takes 1
 *      data buffer + 1 control buffer at the handshake where TCP takes 2):
 *      a sender has at most one credit-only message the peer has not yet
 *      confirmed (every header carries the count of those reposted), and the
 *      receiver reposts that buffer itself. Credits returned by a
 *      credit-only message are only piggybacked or accumulated: they never by
 *      themselves trigger another credit-only message (no credit ping-pong,
 *      no deadlock).
 *   5. Without credits, vrpc_ep_send() queues the message in the endpoint (in
 *      order, never dropped); queued messages leave as credits arrive. The queue
 *      is bounded (vrpc_ep_attr.max_queued): when full, vrpc_ep_send() returns
 *      -EAGAIN and the caller retries after one of that endpoint's send
 *      completions (back-pressure). Per-endpoint order of successful sends is
 *      the order of delivery at the peer.
 *   6. A peer that stops returning credits cannot keep our sends (and the
 *      buffers they hold) forever: once a send has waited for credits
 *      vrpc_transport_attr.credit_timeout_ms with no credit arriving
 *      meanwhile, the endpoint fails with -ETIMEDOUT (logged: "peer returned
 *      no credits for N ms"); its sends flush as for any failure.
 *   7. Reservations shrink with demand: a connection whose peer sent fewer
 *      messages in the last vrpc_transport_attr.shrink_ms (1000 ms; checked
 *      every 100 ms or so) than its reservation is cut back to the number it
 *      sent, but never below the minimum of rule 2 (TCP 2, verbs 1 data
 *      credit + its control buffer), so every connection can always make
 *      progress. It cannot have had more messages in flight than it sent, so
 *      the cut never slows it; a busy one keeps its reservation and grows as
 *      by rule 3. Credits the peer holds are never taken back (nothing
 *      changes on the wire): what it consumed and was not paid back yet is
 *      dropped at once, the rest as the peer spends it (those messages are
 *      not paid back). The buffers so freed stay unpromised on the CQ, for
 *      other and new connections. Limitation: a peer that stays silent
 *      while holding credits keeps them until it sends or leaves (at most
 *      attr.credits each). VRPC_SHRINK_NEVER turns this off.
 *   What bounds reservations is the number of connections
 *   (vrpc_listen_attr.max_conns) times attr.credits, the quarter of posted
 *   buffers rule 3 keeps for new connections, and rule 7; a server that
 *   must never refuse a connection below max_conns posts 2 more buffers per
 *   connection as connections arrive (the RPC server does).
 *   Sizing: post at least 2 buffers per connection on a CQ, plus what busy
 *   connections should pipeline (about active peers x credits).
 *
 * Handshake minimums (both backends, both directions): a peer whose
 * handshake grants fewer credits than the backend's minimum reservation (TCP
 * 2; verbs 1 data credit, its control buffer being separate) or announces an
 * eager size below VRPC_EAGER_MIN is refused, with the reason logged: a
 * refused accept is never reported (the client's vrpc_connect() fails
 * -ECONNREFUSED), a client refusing the server's answer fails -EPROTO.
 *
 * Threads: all functions are thread-safe unless stated; vrpc_ep_send() may be
 * called by several threads on one endpoint (their messages interleave, each
 * thread's own order is kept).
 */
#ifndef VERBRPC_TRANSPORT_H
#define VERBRPC_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <verbrpc/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vrpc_transport;
struct vrpc_cq;
struct vrpc_listener;
struct vrpc_ep;
struct vrpc_mr;
struct vrpc_pool;

/* Largest eager message any backend accepts (per-connection eager size is
 * negotiated as the minimum of both sides' vrpc_transport_attr.eager_size). */
#define VRPC_EAGER_MAX (1u << 20)
/* Smallest eager size any backend accepts, from its own attr (else -EINVAL)
 * or announced by a peer at the handshake (see "Handshake minimums"). The RPC
 * layer's small frames (a header, metadata, small messages) fit in it, so a
 * peer cannot force every small response into a large-message buffer. */
#define VRPC_EAGER_MIN 4096u
/* Longest URI vrpc_listener_uri()/vrpc_ep_peer_uri() write, with the NUL. */
#define VRPC_URI_MAX 80

/* A message buffer. Buffers come from a vrpc_pool; the pool fills every field
 * but len. The user writes the payload at data[0..len). */
struct vrpc_buf {
    void *data;             /* payload start; headroom (if any) lies before it */
    uint32_t cap;           /* payload capacity in bytes */
    uint32_t len;           /* payload length (set by the transport on receive) */
    struct vrpc_mr *mr;     /* the registered memory holding the buffer */
    struct vrpc_pool *pool; /* owning pool */
    struct vrpc_buf *next;  /* free for the owner's use while it holds the buffer;
                               the transport uses it while it owns the buffer */
    uint64_t priv[4];       /* the transport's, while it owns the buffer */
};

enum vrpc_wc_opcode {
    VRPC_WC_RECV = 1,     /* a message arrived in wc.buf (posted with wc.wr_id) */
    VRPC_WC_SEND,         /* a vrpc_ep_send() finished; wc.buf is the caller's again */
    VRPC_WC_READ,         /* a vrpc_ep_read() finished */
    VRPC_WC_ACCEPTED,     /* wc.ep is a new endpoint; wc.wr_id = listener attr user */
    VRPC_WC_DISCONNECTED, /* wc.ep's final completion; wc.status says why */
    VRPC_WC_REVOKE,       /* a vrpc_ep_revoke() finished: the key is dead (wr_id) */
};

/* One completion. For RECV: buf, byte_len (= buf->len), imm, ep (the sender's
 * endpoint here). For SEND/READ: the wr_id and buf given to the call, and
 * byte_len = the length sent or read (the core counts it). status is
 * 0 or a negative errno; on error byte_len and imm are 0 and, for RECV,
 * ep is NULL (-ECANCELED: the buffer was flushed by vrpc_cq_destroy()). */
struct vrpc_wc {
    uint64_t wr_id;
    struct vrpc_ep *ep;
    struct vrpc_buf *buf;
    uint32_t opcode; /* enum vrpc_wc_opcode */
    uint32_t byte_len;
    uint32_t imm;
    int32_t status;
};

/* ---- counters ------------------------------------------------------------
 * What a transport has carried, for metrics (rpc.h renders them as
 * Prometheus text). Kept in the core: each CQ's poller counts what it
 * delivers, without atomic read-modify-write; a snapshot taken while traffic
 * runs is approximate but never torn per field. Monotonic unless marked. */
struct vrpc_transport_counters {
    uint64_t msgs_in, bytes_in;                /* RECV completions delivered (status 0), their byte_len */
    uint64_t msgs_out, bytes_out;              /* SEND completions delivered (status 0), their byte_len */
    uint64_t reads, read_bytes;                /* vrpc_ep_read()s completed (status 0): rendezvous pulls */
    uint64_t grants;                           /* vrpc_ep_grant/_grant_segs that succeeded: offers to be pulled */
    uint64_t accepted;                         /* endpoints delivered as ACCEPTED */
    uint64_t connected;                        /* vrpc_connect()s that succeeded */
    uint64_t disconnected;                     /* DISCONNECTED completions delivered */
    uint64_t connections;                      /* now: accepted + connected - disconnected (gauge) */
    uint64_t credit_waits;                     /* sends queued for lack of credits */
    uint64_t pinned_bytes, large_in_use_bytes; /* now: vrpc_lbuf_stats (gauges) */
};
/* Any thread, while tp exists. Sums the counters of its CQs, the destroyed
 * ones included. */
VRPC_API void vrpc_transport_counters(const struct vrpc_transport *tp, struct vrpc_transport_counters *out);

/* ---- transport (context) ------------------------------------------------ */

struct vrpc_transport_attr {
    uint32_t eager_size;         /* largest message this side sends or receives;
                            0: 8192. VRPC_EAGER_MIN to VRPC_EAGER_MAX. */
    uint32_t credits;            /* most credits one peer's reservation grows to; 0: 32 */
    uint32_t max_queued;         /* default vrpc_ep_attr.max_queued; 0: 1024 */
    uint32_t idle_timeout_ms;    /* a connection whose incoming frame, or whose
                            graceful close, is not complete this long after it
                            began is failed with -ETIMEDOUT (slow or stuck
                            peers); 0: 10000 */
    uint32_t connect_timeout_ms; /* vrpc_connect() and the accept handshake; 0: 5000 */
    uint32_t read_chunk;         /* bytes per READ work request (verbs) or per read
                            response frame (TCP) of one vrpc_ep_read();
                            0: TCP 256 KiB; verbs 32 KiB on a software
                            device (rxe), 64 KiB on hardware, while small
                            messages share the connection, else 256 KiB
                            (an endpoint switches by itself). On verbs,
                            read_chunk x read_window is what a small message
                            on the connection may wait behind */
    uint32_t read_window;        /* read chunks in flight per endpoint; 0: 2 */
    uint64_t max_pinned;         /* bound on the bytes the large-buffer cache keeps
                            registered (in use + idle); 0: 256 MiB. On verbs
                            it is lowered to RLIMIT_MEMLOCK (one log line). */
    uint32_t credit_timeout_ms;  /* a send waiting for credits this long, with
                            no credit from the peer meanwhile, fails the
                            connection (-ETIMEDOUT, rule 6 of "Credits");
                            0: idle_timeout_ms */
    uint32_t shrink_ms;          /* a connection whose peer sent fewer messages in
                            this long than its reservation is cut back to what
                            it sent, at least the minimum (rule 7 of
                            "Credits"); 0: 1000, VRPC_SHRINK_NEVER: never */
};

/* vrpc_transport_attr.shrink_ms: reservations never shrink. */
#define VRPC_SHRINK_NEVER UINT32_MAX

/* Fill *attr with the defaults (all zero means default, too). */
VRPC_API void vrpc_transport_attr_init(struct vrpc_transport_attr *attr);

/* Open a backend: name "tcp", "verbs" or "auto". attr may be NULL.
 * Errors: -ENOENT unknown name, -ENODEV no usable device (verbs),
 * -ENOTSUP backend not compiled in. */
VRPC_API int vrpc_transport_create(const char *name, const struct vrpc_transport_attr *attr,
                                   struct vrpc_transport **out);
/* Destroy after every CQ, listener, endpoint, pool and MR of it. Safe on NULL. */
VRPC_API void vrpc_transport_destroy(struct vrpc_transport *tp);
/* "tcp" or "verbs" (what "auto" resolved to). */
VRPC_API const char *vrpc_transport_name(const struct vrpc_transport *tp);
/* What a backend can do beyond the verbs model every backend has (send,
 * receive, vrpc_ep_read of a vrpc_ep_grant, revoke, abort). Ask with
 * vrpc_transport_caps instead of calling an operation to see whether it fails:
 * an operation whose capability is absent returns -ENOSYS. */
enum vrpc_tp_cap {
    /* vrpc_ep_grant_segs works (TCP: read responses are written from the
     * segments; verbs: absent, grant one registered buffer instead). */
    VRPC_TP_CAP_GATHER = 1 << 0,
    /* vrpc_mr_reg accepts VRPC_ACCESS_REMOTE_READ: long-lived rkeys a peer
     * reads with vrpc_ep_read (verbs). */
    VRPC_TP_CAP_REMOTE_READ = 1 << 1,
    /* Registration locks memory (verbs): RLIMIT_MEMLOCK bounds what can be
     * registered, so the large-buffer cache lowers max_pinned to it. */
    VRPC_TP_CAP_PINS_MEMORY = 1 << 2,
};
/* enum vrpc_tp_cap bits of tp's backend (of the backend below a layer such as
 * "fault+tcp"). Fixed for the transport's life; any thread. */
VRPC_API uint32_t vrpc_transport_caps(const struct vrpc_transport *tp);
/* 0 when scheme (NUL-terminated, as in a URI before "://") names what
 * vrpc_transport_create can be asked for: "auto", a backend's name, or
 * layer+backend ("fault+tcp", "fault+auto"), compiled in or not (opening a
 * backend left out of the build then fails with -ENOTSUP); else -ENOENT. */
VRPC_API int vrpc_transport_scheme_check(const char *scheme);
/* Bytes the transport keeps before vrpc_buf.data in pool buffers. */
VRPC_API uint32_t vrpc_transport_headroom(const struct vrpc_transport *tp);
/* The eager size from attr (after defaults). */
VRPC_API uint32_t vrpc_transport_eager_size(const struct vrpc_transport *tp);

/* ---- registered memory and pools ----------------------------------------- */

enum vrpc_access {
    VRPC_ACCESS_LOCAL = 0,            /* send from / receive into it */
    VRPC_ACCESS_REMOTE_READ = 1 << 0, /* a peer may vrpc_ep_read() it with its
                                         long-lived rkey (VRPC_TP_CAP_REMOTE_READ:
                                         verbs; else -ENOSYS) */
    VRPC_ACCESS_GRANT = 1 << 1,       /* no remote access of its own, but parts of
                                         it may be lent to one peer for one
                                         transfer with vrpc_ep_grant() (verbs:
                                         IBV_ACCESS_MW_BIND | LOCAL_WRITE) */
};

/* Register [addr, addr+len) (the caller keeps owning the memory and frees it
 * after vrpc_mr_dereg). access: enum vrpc_access bits. Errors: -ENOMEM, and on
 * verbs -ENOMEM naming `ulimit -l` when locking fails; -ENOSYS for
 * VRPC_ACCESS_REMOTE_READ without VRPC_TP_CAP_REMOTE_READ. */
VRPC_API int vrpc_mr_reg(struct vrpc_transport *tp, void *addr, size_t len, unsigned access, struct vrpc_mr **out);
/* Deregister; nothing of it may be in flight. Safe on NULL. */
VRPC_API void vrpc_mr_dereg(struct vrpc_mr *mr);
/* Remote key to hand to a peer for vrpc_ep_read() (0 on TCP). */
VRPC_API uint32_t vrpc_mr_rkey(const struct vrpc_mr *mr);

/* A pool of count buffers of buf_size payload bytes each (plus the transport's
 * headroom), in one registered region. get/put are lock-free and allocate
 * nothing, from any thread. */
VRPC_API int vrpc_pool_create(struct vrpc_transport *tp, uint32_t buf_size, uint32_t count, struct vrpc_pool **out);
/* Destroy; every buffer must have been put back. Safe on NULL. */
VRPC_API void vrpc_pool_destroy(struct vrpc_pool *pool);
/* A free buffer (len 0), or NULL when the pool is empty. The caller owns it. */
VRPC_API struct vrpc_buf *vrpc_pool_get(struct vrpc_pool *pool);
/* Give a buffer back to its pool (buf->pool). The caller no longer owns it. */
VRPC_API void vrpc_pool_put(struct vrpc_buf *buf);
/* Buffers currently in the pool (a snapshot, for tests and statistics). */
VRPC_API uint32_t vrpc_pool_avail(const struct vrpc_pool *pool);

/* ---- completion queues --------------------------------------------------- */

/* Called on the CQ's poller thread with n >= 1 completions; see "Completions". */
typedef void (*vrpc_cq_cb)(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg);

/* vrpc_cq_attr.busy_poll_us: busy-poll for ever, never sleep. */
#define VRPC_BUSY_POLL_ALWAYS UINT32_MAX

struct vrpc_cq_attr {
    vrpc_cq_cb cb; /* required */
    void *cb_arg;
    uint32_t busy_poll_us; /* spin this long without completions before arming
                              and sleeping; 0: sleep right away (poll, arm,
                              poll, sleep); VRPC_BUSY_POLL_ALWAYS: never arm
                              nor sleep (the poller keeps its CPU busy: for a
                              dedicated core). TCP: bytes of a large transfer
                              (vrpc_ep_read data in or out) count as activity
                              too, so a poller does not sleep while one runs */
    uint32_t depth;        /* completions per callback batch, at most; 0: 64 */
    uint32_t max_recv;     /* receive buffers postable at once (SRQ size); 0: 4096 */
    int cpu;               /* pin the poller to this CPU; -1: don't. A pinned
                              poller yields its CPU after each callback batch (a
                              thread it readied there runs first) and, while
                              busy-polling, only every 100 us (unpinned: between
                              polls): threads of its CPU that wait for it should
                              sleep, not spin. */
    const char *name;      /* poller thread name (<=15 chars); NULL: "vrpc-cq" */
    /* Adaptive window if > busy_poll_us (> 0): the poller spins twice the
     * recent gaps between its completion batches (an EWMA of the gaps up to
     * this long), at least busy_poll_us and at most this; when most recent
     * gaps were longer (sparse traffic), busy_poll_us. 0: fixed busy_poll_us. */
    uint32_t busy_poll_max_us;
};

VRPC_API void vrpc_cq_attr_init(struct vrpc_cq_attr *attr);

/* Create a CQ and start its poller thread. */
VRPC_API int vrpc_cq_create(struct vrpc_transport *tp, const struct vrpc_cq_attr *attr, struct vrpc_cq **out);
/* Stop the poller after delivering, through the callback, every outstanding
 * completion: endpoints still open on this CQ are failed (their operations
 * flush, then DISCONNECTED with -ECANCELED), then each still-posted receive
 * buffer completes with -ECANCELED. The user still vrpc_ep_destroy()s such
 * endpoints (the callback may do it). Listeners assigning to this CQ must be
 * destroyed first. Safe on NULL. Not from this CQ's own callback. */
VRPC_API void vrpc_cq_destroy(struct vrpc_cq *cq);

/* Post n receive buffers (bufs[i] with wr_ids[i]; wr_ids may be NULL for 0)
 * to the CQ's shared receive queue. Each must have cap >= the transport's
 * eager size (else -EINVAL). On 0 the transport owns every buffer until its
 * RECV completion; on error (-EINVAL, -ENOSPC beyond max_recv, -ESHUTDOWN)
 * none was posted and the caller keeps them all. Any thread. */
VRPC_API int vrpc_cq_post_recv(struct vrpc_cq *cq, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n);

/* ---- listeners ----------------------------------------------------------- */

struct vrpc_listen_attr {
    struct vrpc_cq *const *cqs; /* accepted endpoints are spread round-robin */
    unsigned ncqs;              /* over these CQs (at least one) */
    uint64_t user;              /* reported as wc.wr_id of VRPC_WC_ACCEPTED */
    int backlog;                /* 0: 1024 */
    unsigned max_conns;         /* connections accepted through it and not yet
                                   disconnected, at most: one more is refused
                                   at the handshake (logged "its limit
                                   (max_conns)"; the peer's vrpc_connect fails)
                                   before any receive buffer is reserved for
                                   it; 0: no limit */
};

/* Listen on uri (port 0: any free port). Each accepted connection appears as a
 * VRPC_WC_ACCEPTED completion on its CQ; the user then owns the endpoint (and
 * must vrpc_ep_destroy() it). Errors: -EADDRINUSE, -EADDRNOTAVAIL, -EINVAL
 * (bad URI), -EPROTONOSUPPORT (scheme of another backend). */
VRPC_API int vrpc_listen(struct vrpc_transport *tp, const char *uri, const struct vrpc_listen_attr *attr,
                         struct vrpc_listener **out);
/* Stop accepting. Connections whose handshake has not finished are refused
 * (their peers' vrpc_connect() fails); endpoints already reported ACCEPTED are
 * not affected. Safe on NULL. */
VRPC_API void vrpc_listener_destroy(struct vrpc_listener *l);
/* The bound address as a URI ("tcp://127.0.0.1:41234"), NUL-terminated, into
 * buf of len bytes (VRPC_URI_MAX is enough). -ENOSPC if it does not fit. */
VRPC_API int vrpc_listener_uri(const struct vrpc_listener *l, char *buf, size_t len);

/* ---- endpoints ----------------------------------------------------------- */

struct vrpc_ep_attr {
    struct vrpc_cq *cq;   /* required: where all completions of it go */
    void *user;           /* vrpc_ep_user() from the start */
    const char *src_addr; /* bind the local side to this IP literal (source
                               address; on verbs it picks the device); NULL: any */
    uint32_t max_queued;  /* sends queued for credits before -EAGAIN;
                               0: transport attr */
    uint32_t timeout_ms;  /* connect timeout; 0: transport attr */
};

VRPC_API void vrpc_ep_attr_init(struct vrpc_ep_attr *attr);

/* Check a URI's syntax without resolving anything: "scheme://host:port" or a
 * bare "host:port"; scheme [a-z]+ or name+backend ([a-z]+\+[a-z]+, e.g.
 * "fault+tcp"); host an IPv4 literal, a name ([A-Za-z0-9._-]) or an IPv6
 * literal in brackets (optional %zone); port 0..65535 in decimal and nothing
 * after it. Whether the scheme names a backend is not checked here. Returns 0
 * or -EINVAL with the reason in why (NUL-terminated, cut to why_len; why may
 * be NULL). The channel, the server and vrpc_connect/vrpc_listen all use it. */
VRPC_API int vrpc_uri_check(const char *uri, char *why, size_t why_len);

/* Connect to uri; blocks until the connection is established (handshake
 * done: eager size and credits agreed) or has failed. Errors: -ECONNREFUSED
 * (nothing listens there, or the server refused: listener closing, no
 * receive buffers to reserve), -ETIMEDOUT, -EHOSTUNREACH, -ENXIO (the host
 * name does not resolve; logged with the resolver's reason), -EPROTO (handshake:
 * version/size mismatch), -EINVAL (bad URI), -EPROTONOSUPPORT, -ENOBUFS
 * (attr->cq has fewer than 2 unpromised receive buffers). On success the
 * endpoint's completions start on attr->cq; no completion marks the connect. */
VRPC_API int vrpc_connect(struct vrpc_transport *tp, const char *uri, const struct vrpc_ep_attr *attr,
                          struct vrpc_ep **out);

/* Send buf->data[0..len) with immediate imm. len <= vrpc_ep_eager_size(ep).
 * On 0 the transport owns buf until the VRPC_WC_SEND completion (wr_id) on the
 * endpoint's CQ; status 0 means the bytes were handed to the peer's transport
 * (TCP: written to the socket; verbs: acknowledged), -ECANCELED a flush.
 * Errors (caller keeps buf, no completion): -EMSGSIZE len too big, -EAGAIN the
 * credit queue is full (retry after a send completion of this endpoint),
 * -ENOTCONN closed or dead. Never blocks. flags: 0. */
VRPC_API int vrpc_ep_send(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id,
                          unsigned flags);

/* One message of vrpc_ep_send_list: the arguments of one vrpc_ep_send. */
struct vrpc_send_wr {
    struct vrpc_buf *buf;
    uint32_t len;
    uint32_t imm;
    uint64_t wr_id;
};

/* Send wrs[0..n) in this order, as n vrpc_ep_send calls from this thread
 * would, in one operation (a doorbell batch): TCP admits them under one
 * lock and writes them with one sendmsg; verbs posts those its credits
 * allow as chains of work requests, one ibv_post_send each; a backend
 * without a list of its own gets a loop of single sends from the core. Nothing else changes:
 * each message needs its credit and those without one queue (rule 5 of
 * "Credits", bounded by max_queued), each accepted message has exactly one
 * SEND completion, in order, and messages of other threads may come
 * between them. Returns 0 when all n were accepted (n = 0 included); else
 * the error of the first one refused, wrs[*sent] (vrpc_ep_send's: -EINVAL,
 * -EMSGSIZE, -EAGAIN, -ENOTCONN): wrs[0..*sent) were accepted, the caller
 * keeps wrs[*sent..n). sent may be NULL when n is 1. Never blocks. flags: 0. */
VRPC_API int vrpc_ep_send_list(struct vrpc_ep *ep, const struct vrpc_send_wr *wrs, unsigned n, unsigned flags,
                               unsigned *sent);

/* Read len bytes (>= 1) from the peer's memory at raddr, key rkey (from the
 * peer's vrpc_ep_grant() on its end of this connection, or a REMOTE_READ MR's
 * rkey on verbs) into buf->data + off; buf->mr must be registered (pool or
 * large buffer). On 0, exactly one VRPC_WC_READ completion (wr_id, buf,
 * byte_len = len) follows, however many chunks (attr.read_chunk, at most
 * attr.read_window in flight per endpoint, round-robin over its reads) the
 * transport splits it into; sends of the endpoint are not held back behind
 * it. Completion status: 0; -EACCES the peer refused the key or range (the
 * endpoint then fails: on verbs both queue pairs are in error); -ETIMEDOUT
 * retries exceeded; -ECANCELED flushed because the endpoint died. Both
 * backends: TCP asks the peer's transport for the bytes (never its user) and
 * the kernel copies them straight into buf. Errors (no completion):
 * -EINVAL, -ENOTCONN, -ENOSPC too many reads queued (retry after a READ
 * completion of this endpoint). */
VRPC_API int vrpc_ep_read(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr,
                          uint32_t rkey, uint64_t wr_id);

/* Let the peer of ep read [addr, addr+len) (len >= 1) of mr, registered with
 * VRPC_ACCESS_GRANT, until vrpc_ep_revoke(): a one-shot key, valid on this
 * endpoint only, written to *rkey (never 0) to send to the peer. verbs: a
 * type-2 memory window bound over the range by a work request on ep's queue
 * pair, ordered before every later send of ep, so a message carrying the key
 * may be sent right away. (rdma_rxe does not enforce a window's bounds, only
 * the MR's: register each grantable buffer as its own MR, see vrpc_lbuf.)
 * TCP: an entry of the transport's grant table, checked on every read request.
 * The memory must not change until the REVOKE completion. Errors: -EINVAL,
 * -ENOTCONN, -ENOSPC no send-queue slot or grant left (retry after a
 * completion of ep). */
VRPC_API int vrpc_ep_grant(struct vrpc_ep *ep, struct vrpc_mr *mr, const void *addr, uint32_t len, uint32_t *rkey);
/* One piece of a gathered grant (vrpc_ep_grant_segs). */
struct vrpc_seg {
    const void *addr;
    uint32_t len;
};
#define VRPC_GRANT_SEGS_MAX 16

/* As vrpc_ep_grant, for a window that is the concatenation of segs[0..n)
 * (1 <= n <= VRPC_GRANT_SEGS_MAX, every len >= 1, the sum <= UINT32_MAX):
 * memory of this process, registered or not. The peer addresses the window
 * as if it were contiguous from segs[0].addr (the raddr to send with the
 * key). The array is copied; the memory must stay valid and unchanged until
 * the REVOKE completion (or the endpoint's DISCONNECTED), and no byte of it is
 * read by the transport after that. TCP: read responses are written from
 * the segments with sendmsg (no copy of ours). -ENOSYS without
 * VRPC_TP_CAP_GATHER (verbs: grant one registered buffer instead; ask
 * vrpc_transport_caps first), checked before the arguments. Other errors as
 * vrpc_ep_grant. */
VRPC_API int vrpc_ep_grant_segs(struct vrpc_ep *ep, const struct vrpc_seg *segs, unsigned n, uint32_t *rkey);
/* End a grant of ep. Exactly one VRPC_WC_REVOKE completion (wr_id, ep) follows,
 * after which no read of the peer can touch the memory any more (verbs: the
 * window is invalidated, or deallocated with a dead queue pair; TCP: the grant
 * is dead and no read response streams from it). Status 0, or -ECANCELED when
 * the endpoint died first (the key is dead all the same); like every
 * completion of ep it comes before ep's DISCONNECTED. A revoke races a
 * read of the peer safely: the read then fails at the peer (-EACCES; on
 * rdma_rxe possibly -ETIMEDOUT, after the peer's idle timeout). Errors
 * (no completion): -EINVAL unknown key, -ENOSPC (retry after a completion),
 * -ENOTCONN ep died (its DISCONNECTED follows, or came): every key of it
 * died with it, the memory is the caller's again at DISCONNECTED. (A revoke
 * accepted before, or while the backend has not finished failing ep, still
 * completes -ECANCELED before DISCONNECTED.) */
VRPC_API int vrpc_ep_revoke(struct vrpc_ep *ep, uint32_t rkey, uint64_t wr_id);

/* ---- large buffers: the registration cache ---------------------------------
 * Buffers for messages above the eager size, owned by the transport: each is
 * its own mapping with its own MR registered VRPC_ACCESS_GRANT, kept when
 * put back (so repeated large messages pay no registration), in size classes
 * of at most 25 % slack. The cache never keeps more than attr.max_pinned bytes
 * registered: get evicts idle buffers (least recently used first) and then
 * fails with -ENOBUFS rather than wait. A reused buffer's bytes from len (as
 * given to vrpc_lbuf_get) to cap that an earlier user wrote are zeroed by the
 * get, so a peer granted any part of it sees the new bytes or zeros, never an
 * earlier message, as long as the user writes (packs, or reads into) only
 * data[0..len). All three functions: any thread. */

/* A buffer with cap >= len (len >= 1), data page-aligned, mr set, pool NULL.
 * Errors: -ENOBUFS the bound is reached (nothing idle to evict), -ENOMEM,
 * -EINVAL len above 1 GiB. */
VRPC_API int vrpc_lbuf_get(struct vrpc_transport *tp, size_t len, struct vrpc_buf **out);
/* Back to the cache; the caller no longer owns it. Nothing of it may be in
 * flight or granted. Safe on NULL. */
VRPC_API void vrpc_lbuf_put(struct vrpc_buf *buf);
/* Bytes the cache has registered (in use + idle) and bytes in use now. */
VRPC_API void vrpc_lbuf_stats(const struct vrpc_transport *tp, size_t *pinned, size_t *in_use);

/* Start a graceful close: nothing new is accepted (-ENOTCONN); every send
 * accepted before is still delivered, in order, as the peer's credits allow
 * (the peer keeps receiving until the stream ends); then the write side
 * closes, and DISCONNECTED follows once the peer has closed too (status 0).
 * If that takes longer than the idle timeout, the endpoint fails with
 * -ETIMEDOUT and what is left flushes. Any thread; returns 0, or -ENOTCONN if
 * already closed or dead (idempotent). */
VRPC_API int vrpc_ep_close(struct vrpc_ep *ep);
/* Abortive close, for a peer that misbehaves: whatever it holds comes back
 * at once instead of after the close timeout. Nothing new is accepted
 * (-ENOTCONN); every send (queued for credits or written), read and revoke
 * of ep still pending completes with -ECANCELED, and DISCONNECTED follows,
 * last, with status (a negative errno, e.g. -ECONNABORTED), even if the
 * connection was lost meanwhile. Granted keys die with the connection. TCP resets the connection
 * (SO_LINGER 0: unsent and unread bytes are dropped at once); verbs
 * moves the QP to the error state and disconnects without waiting for the
 * peer. Also after vrpc_ep_close (it cuts the graceful close short). Any
 * thread, the CQ's completion callback included; never blocks; the
 * completions arrive on the CQ's poller as usual. Not after
 * vrpc_ep_destroy (the caller must hold its reference). Returns 0, -EINVAL
 * if status is not negative, or -ENOTCONN if ep is already aborted or dead
 * (idempotent: nothing changes, DISCONNECTED keeps the status it has). */
VRPC_API int vrpc_ep_abort(struct vrpc_ep *ep, int status);
/* Close if needed and drop the user's reference. The pointer stays valid as a
 * name in completions until its DISCONNECTED completion has been delivered;
 * afterwards the memory is freed. Do not call any other function on ep after.
 * Safe on NULL. */
VRPC_API void vrpc_ep_destroy(struct vrpc_ep *ep);

VRPC_API void *vrpc_ep_user(const struct vrpc_ep *ep);
/* Set the user pointer; call before handing ep to other threads (e.g. from the
 * ACCEPTED completion). */
VRPC_API void vrpc_ep_set_user(struct vrpc_ep *ep, void *user);
/* Negotiated per-connection eager size (largest message either way). */
VRPC_API uint32_t vrpc_ep_eager_size(const struct vrpc_ep *ep);
/* The peer's address as a URI, like vrpc_listener_uri(). */
VRPC_API int vrpc_ep_peer_uri(const struct vrpc_ep *ep, char *buf, size_t len);
/* The CQ the endpoint completes on. */
VRPC_API struct vrpc_cq *vrpc_ep_cq(const struct vrpc_ep *ep);

#ifdef __cplusplus
}
#endif
#endif
