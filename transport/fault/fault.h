/* The fault-injecting transport layer ("fault"): TEST MACHINERY. A layer in
 * the manner of libfabric's hooking providers (prov/hook): it wraps another
 * backend ("fault+tcp", "fault+verbs", "fault+auto"; URIs fault+tcp://h:p),
 * forwards every operation to it and, seeded and reproducibly, injects what a
 * real backend can produce, always within the contract of
 * include/verbrpc/transport.h (one completion per accepted operation,
 * DISCONNECTED last, ACCEPTED first):
 *   - connection loss: before or after a send, while a read is under way,
 *     after a receive completion, at connect (-ECONNREFUSED, nothing
 *     connected) and at accept (the connection is closed at once and never
 *     reported). A loss closes the connection below (its peer sees a close);
 *     here every later receive of it is dropped (its buffer reposted), reads
 *     completing after the loss read -ECANCELED, new operations get
 *     -ENOTCONN, and DISCONNECTED carries the loss's status (-ECONNRESET, or
 *     the READ error that caused it);
 *   - delays: the CQ stalls (nothing completes, nothing progresses) for up to
 *     delay_us after a batch of completions; a send's caller is held up to
 *     send_delay_us before the send is passed down (a preempted thread);
 *     an endpoint's SEND, READ and REVOKE completions are deferred up to
 *     cpl_delay_us (in their order, and its DISCONNECTED behind them), so
 *     receives of it overtake them: a response may arrive before the
 *     request's send completed, as on verbs when the ACK is late;
 *   - send errors: -EAGAIN from vrpc_ep_send while the endpoint has sends in
 *     flight (so a completion follows to retry after), and SEND completions
 *     failed with -ECANCELED, the connection then lost (-ECONNRESET);
 *   - READ errors: a READ completion failed with -EACCES or -ETIMEDOUT, the
 *     connection then lost with that status (as a refused READ does on both
 *     backends); grants refused with -ENOSPC while the endpoint has
 *     operations in flight (a completion follows to retry after);
 *   - credit starvation: posted receive buffers held back for up to
 *     starve_us before they reach the CQ below, so the peers' credits (which
 *     only posted buffers pay back) and every credit-bearing frame wait.
 *
 * Configuration: a spec string, from vrpc_fault_configure() (wins) or the
 * environment variable VRPC_FAULT (read once, docs/ENV.md), taken when a fault
 * transport is created.
 * Grammar: KEY=VALUE[,KEY=VALUE]...; probabilities in [0,1], durations in
 * microseconds; unknown keys or bad values: vrpc_transport_create fails
 * -EINVAL (logged).
 *   seed=N           PRNG seed (u64; default 1)
 *   loss=P           connection loss per send (half before, half after it),
 *                    per receive completion and per read
 *   connect=P        a connect refused (-ECONNREFUSED) before it starts
 *   accept=P         an accepted connection dropped before it is reported
 *   delay=P          after a completion batch, the CQ stalls ...
 *   delay_us=N       ... for 1..N us (default 500)
 *   send_delay=P     a send's caller held ...
 *   send_delay_us=N  ... for 1..N us (default 100)
 *   cpl_delay=P      a SEND/READ/REVOKE completion deferred ...
 *   cpl_delay_us=N   ... for 1..N us (default 2000)
 *   eagain=P         -EAGAIN from a send while others are in flight
 *   send_err=P       a SEND completion failed, the connection lost
 *   read_err=P       a READ completion failed, the connection lost
 *   grant_refuse=P   a grant refused (-ENOSPC) while operations are in flight
 *   starve=P         a vrpc_cq_post_recv's buffers held back ...
 *   starve_us=N      ... for 1..N us (default 2000)
 *   all=P            shorthand: every probability above set to P (later
 *                    keys override)
 * An empty spec injects nothing (a pure pass-through).
 *
 * Reproducibility: every decision is drawn from a PRNG (splitmix64) whose
 * seed is derived from the spec's seed and the place that draws: the fault
 * transport's creation order since the last vrpc_fault_configure() (or the
 * process start; so one seed of a sequence replays alone), then the endpoint's creation
 * order in its transport (connects and accepts counted together) or the CQ's,
 * and one stream for the calling side of an endpoint (send, read, grant)
 * apart from its completion side (poller). So the n-th decision of a stream
 * is a function of the seed alone. What is NOT fixed by the seed: which
 * operation is the n-th when several threads call on one endpoint, how
 * completions batch, and so the interleaving of timers, deadlines and
 * retries; a replay with the same seed follows the same decision sequence
 * per stream, and a failure found with one seed usually recurs with it, but
 * it is not a deterministic replay of a multi-threaded run.
 *
 * Threads: as the backend below. The layer's CQ is polled by the core's
 * poller thread, which drives the CQ below directly (the CQ below has no
 * thread of its own); it also releases held-back buffers and deferred
 * completions when due (its wait is bounded by the next due time). At
 * vrpc_cq_destroy, deferred completions go out first and held-back buffers
 * complete as flushed (RECV, -ECANCELED, ep NULL), as the backend's own. */
#ifndef VRPC_TRANSPORT_FAULT_H
#define VRPC_TRANSPORT_FAULT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport/transport_ops.h"

/* ---- what can be read by tests -------------------------------------------- */

/* Injections, counted per fault transport (and in process-wide totals). */
enum vrpc_fault_kind {
    VRPC_FAULT_LOSS_SEND_BEFORE, /* connection lost, the send refused -ENOTCONN */
    VRPC_FAULT_LOSS_SEND_AFTER,  /* connection lost right after a send was accepted */
    VRPC_FAULT_LOSS_RECV,        /* connection lost after a receive completion */
    VRPC_FAULT_LOSS_READ,        /* connection lost while a read is under way */
    VRPC_FAULT_CONNECT_REFUSED,
    VRPC_FAULT_ACCEPT_DROPPED,
    VRPC_FAULT_CQ_STALL,
    VRPC_FAULT_SEND_DELAY,
    VRPC_FAULT_SEND_EAGAIN,
    VRPC_FAULT_SEND_ERROR, /* SEND completion failed, connection lost */
    VRPC_FAULT_READ_ERROR, /* READ completion -EACCES/-ETIMEDOUT, connection lost */
    VRPC_FAULT_GRANT_REFUSED,
    VRPC_FAULT_RECV_HELD,    /* a post_recv batch held back (credit starvation) */
    VRPC_FAULT_RECV_DROPPED, /* a receive after a loss dropped, buffer reposted */
    VRPC_FAULT_CPL_DEFERRED, /* a SEND/READ/REVOKE completion deferred */
    VRPC_FAULT_KINDS
};

/* Contract checks the layer makes on the backend below and on itself; any
 * nonzero count is a bug (logged when it happens, too). */
enum vrpc_fault_check {
    VRPC_FAULT_BAD_DISCONNECT, /* DISCONNECTED with operations still in flight */
    VRPC_FAULT_BUFS_OUT,       /* at destroy: buffers given down and never completed */
    VRPC_FAULT_CHECKS
};

struct vrpc_fault_counts {
    uint64_t n[VRPC_FAULT_KINDS];
    uint64_t check[VRPC_FAULT_CHECKS];
};

/* Name of a kind, for logs ("loss_send_before", ...). */
const char *vrpc_fault_kind_name(enum vrpc_fault_kind k);
/* Spec used by fault transports created from now on (copied); NULL: back to
 * VRPC_FAULT. Also restarts the count of fault transports created, which
 * seeds their streams (see Reproducibility). 0, or -EINVAL (logged) if it
 * does not parse. Any thread. */
int vrpc_fault_configure(const char *spec);
/* Counts of one fault transport; -EINVAL if tp is not one. */
int vrpc_fault_counts(const struct vrpc_transport *tp, struct vrpc_fault_counts *out);
/* Stop (quiet) or resume injecting on one fault transport, e.g. to check
 * that a server which ran under faults still serves a clean client; what was
 * injected before (a stall, held buffers) still runs out. -EINVAL if tp is
 * not one. Any thread. */
int vrpc_fault_set_quiet(struct vrpc_transport *tp, bool quiet);
/* Sums over every fault transport of the process since it started (also
 * destroyed ones). */
void vrpc_fault_totals(struct vrpc_fault_counts *out);

extern const struct vrpc_transport_ops vrpc_fault_ops;

/* ---- private to transport/fault/ ------------------------------------------- */

struct fault_spec {
    uint64_t seed;
    double loss, connect, accept, delay, send_delay, eagain, send_err, read_err, grant_refuse, starve, cpl_delay;
    uint32_t delay_us, send_delay_us, starve_us, cpl_delay_us;
};

/* spec.c: parse a spec string (NULL or "": all zero) */
int fault_spec_parse(const char *s, struct fault_spec *out);
/* spec.c: the spec to use now (vrpc_fault_configure's, else VRPC_FAULT) */
int fault_spec_current(struct fault_spec *out);

/* A PRNG stream (splitmix64). Not thread-safe: each has one user, or a lock. */
struct fault_rng {
    uint64_t s;
};
void fault_rng_seed(struct fault_rng *r, uint64_t seed, uint64_t a, uint64_t b);
uint64_t fault_rng_next(struct fault_rng *r);
/* true with probability p (never draws when p == 0: a zero rate costs nothing
 * and does not shift the stream of the other decisions). */
bool fault_rng_hit(struct fault_rng *r, double p);
/* uniform in 1..max (max >= 1) */
uint32_t fault_rng_upto(struct fault_rng *r, uint32_t max);

struct fault_tp {
    struct vrpc_transport base;
    struct vrpc_transport *lower; /* owned */
    struct fault_spec spec;
    uint64_t index; /* creation order since vrpc_fault_configure */
    atomic_uint_fast64_t next_ep, next_cq;
    pthread_mutex_t mu;   /* rng */
    struct fault_rng rng; /* transport-level decisions (connect) */
    atomic_uint_fast64_t n[VRPC_FAULT_KINDS], check[VRPC_FAULT_CHECKS];
    atomic_int_fast64_t bufs_out; /* sends, reads, receives given down, not completed */
    atomic_bool quiet;            /* vrpc_fault_set_quiet: inject nothing */
};

/* A probability of t's spec, 0 while t is quiet. */
#define FAULT_P(t, field) (atomic_load_explicit(&(t)->quiet, memory_order_relaxed) ? 0.0 : (t)->spec.field)

struct fault_cq {
    struct vrpc_cq base;
    struct vrpc_cq *lower;
    struct fault_rng rng;    /* poller only */
    uint64_t stall_until_ns; /* poller only */
    bool lower_armed;        /* poller only */
    bool flushing;           /* set under mu by cq_flush (poller) */
    pthread_mutex_t mu;      /* held list, rng_post, kicked */
    pthread_cond_t cv;
    bool kicked;
    struct fault_rng rng_post;          /* post_recv decisions */
    struct vrpc_buf *held, **held_tail; /* held back receive buffers, due order */
    atomic_uint nheld;                  /* batches held (written under mu), for the
                                           poller's unlocked look */
    /* deferred completions (poller only): a ring in due order */
    struct fault_deferred {
        struct vrpc_wc wc;
        uint64_t due_ns;
    } * dq;
    unsigned dq_head, dq_len, dq_cap;
};

struct fault_listener {
    struct vrpc_listener base;
    struct vrpc_listener *lower;
    struct vrpc_cq **lcqs;
};

struct fault_ep {
    struct vrpc_ep base;
    struct vrpc_ep *lower;    /* the user reference of it is ours */
    atomic_int dead;          /* 0, or the status of an injected loss */
    atomic_int inflight;      /* sends, reads, revokes accepted below, not completed
                                   (counted after the call returns: may dip below 0) */
    bool hidden;              /* accept dropped: never reported */
    unsigned ndeferred;       /* its completions in its CQ's deferred ring (poller) */
    pthread_mutex_t mu;       /* rng_api */
    struct fault_rng rng_api; /* send/read/grant decisions */
    struct fault_rng rng_cpl; /* completion decisions (poller) */
};

static inline struct fault_tp *fault_tp_of(struct vrpc_transport *tp)
{
    return container_of(tp, struct fault_tp, base);
}

/* tp.c */
void fault_tp_count_reset(void);
void fault_count(struct fault_tp *t, enum vrpc_fault_kind k);
void fault_check_failed(struct fault_tp *t, enum vrpc_fault_check c, const char *what);
/* ep.c: mark ep lost (first loss wins) and close the connection below */
void fault_ep_kill(struct fault_ep *e, int status);
/* ep.c: a new endpoint wrapping lower (refs 2), its streams seeded */
struct fault_ep *fault_ep_new(struct fault_tp *t, struct vrpc_cq *cq, void *user);

/* ep.c: "fault+" + a URI of the backend below into dst (VRPC_URI_MAX; the
 * longest, verbs://[IPv6]:port, fits) */
void fault_uri(char *dst, const char *lower_uri);

/* the ops, by file */
int fault_tp_create(const struct vrpc_transport_attr *attr, struct vrpc_transport **out);
void fault_tp_destroy(struct vrpc_transport *tp);
int fault_mr_reg(struct vrpc_transport *tp, void *addr, size_t len, unsigned access, struct vrpc_mr **out);
void fault_mr_dereg(struct vrpc_mr *mr);
int fault_cq_create(struct vrpc_transport *tp, const struct vrpc_cq_attr *attr, struct vrpc_cq **out);
void fault_cq_destroy(struct vrpc_cq *cq);
int fault_cq_poll(struct vrpc_cq *cq, struct vrpc_wc *wc, unsigned max);
void fault_cq_arm(struct vrpc_cq *cq);
void fault_cq_wait(struct vrpc_cq *cq, int timeout_ms);
void fault_cq_kick(struct vrpc_cq *cq);
void fault_cq_flush(struct vrpc_cq *cq);
int fault_post_recv(struct vrpc_cq *cq, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n);
int fault_listen(struct vrpc_transport *tp, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
                 struct vrpc_listener **out);
void fault_listener_destroy(struct vrpc_listener *l);
int fault_connect(struct vrpc_transport *tp, const struct vrpc_addr *dst, const struct vrpc_addr *src,
                  const struct vrpc_ep_attr *attr, struct vrpc_ep **out);
int fault_send(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id, unsigned flags);
int fault_read(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
               uint64_t wr_id);
int fault_grant(struct vrpc_ep *ep, struct vrpc_mr *mr, const void *addr, uint32_t len, uint32_t *rkey);
int fault_grant_segs(struct vrpc_ep *ep, const struct vrpc_seg *segs, unsigned n, uint32_t len, uint32_t *rkey);
int fault_revoke(struct vrpc_ep *ep, uint32_t rkey, uint64_t wr_id);
int fault_close(struct vrpc_ep *ep);
int fault_abort(struct vrpc_ep *ep, int status);
void fault_ep_free(struct vrpc_ep *ep);

#endif
