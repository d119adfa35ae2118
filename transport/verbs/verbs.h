/* The verbs backend's private header: the objects (transport, CQ, endpoint,
 * listener, MR, memory window, read job), the wire structs of the connect
 * private data and the message header, the hot helpers every file of the
 * backend inlines (send posting, completion staging, the QP number map) and
 * the functions one file of the backend calls in another. Files, one object
 * each, after libfabric's prov/verbs/src: verbs_dev.c (the device: binding,
 * async events, create/destroy, the ops table), verbs_cm.c (rdma_cm),
 * verbs_hello.c (the private-data handshake), verbs_ep.c (endpoints and
 * their QPs), verbs_cq.c (completion queues, the poller), verbs_msg.c
 * (sends), verbs_rma.c (RDMA READ), verbs_mr.c (MRs and memory windows).
 * Every function here runs on the thread its comment names; ep->lock,
 * cq->lock and tp->lock are taken in that order.
 * rdma-core's error conventions become -errno in this folder and nowhere
 * above it. */
#ifndef VRPC_TRANSPORT_VERBS_VERBS_H
#define VRPC_TRANSPORT_VERBS_VERBS_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "transport/credit.h"
#include "transport/disconnect.h"
#include "transport/transport_ops.h"
#include "transport/verbs/verbs_diag.h"

/* Wire protocol version carried in the connect private data. */
#define PROTO_VERSION 1u

/* Queue-pair settings. The environment overrides some, for tests and odd
 * set-ups (read once per process, table in common/env.c, docs/ENV.md):
 *   VRPC_VERBS_GID_INDEX=N     source GID index (default: the one rdma_cm
 *                              picks from the bound address)
 *   VRPC_VERBS_RNR_RETRY=N     receiver-not-ready retries, 0..7 (7 = forever,
 *                              the default), on our queue pairs and asked of
 *                              the peer's in the connect parameters. The
 *                              verbs tests use 0: credits must make RNR
 *                              impossible, so any RNR fails the connection
 *   VRPC_VERBS_PROTO_VERSION=N test only: the protocol version this side
 *                              claims in its handshake (the rejection tests)
 *   VRPC_VERBS_SRQ_LIMIT=N     log (once per CQ) when fewer than N receive
 *                              buffers are left posted on a CQ: the device's
 *                              SRQ limit event (default 0: not armed). Also
 *                              what shows the asynchronous events are read
 *   VRPC_VERBS_ACK_TIMEOUT=N   local ACK timeout exponent, 14..31 (4.096 us
 *                              << N; default: rdma_cm's, at least 14)
 *   VRPC_VERBS_READ_CHUNK=N    bytes per READ work request, and
 *   VRPC_VERBS_READ_WINDOW=N   READs in flight per endpoint: override the
 *                              transport attributes (measurements)
 *   VRPC_VERBS_READ_CHUNK_BULK=N  bytes per READ while the connection
 *                              carries no small messages (see
 *                              READ_CHUNK_BULK; N <= the chunk: no switching)
 *   VRPC_VERBS_TRACE=1         log every post, completion and rdma_cm event */
struct qp_cfg {
    uint8_t rnr_retry;   /* see VRPC_VERBS_RNR_RETRY */
    uint8_t ack_timeout; /* local ACK timeout exponent; 0: rdma_cm's, at least 14 (lossy links) */
    uint8_t retry_cnt;   /* transport retries: 7 */
    int gid_index;       /* -1: rdma_cm's */
    uint16_t proto_version;
    uint32_t srq_limit;           /* see VRPC_VERBS_SRQ_LIMIT */
    uint32_t rd_chunk, rd_window; /* VRPC_VERBS_READ_CHUNK / _WINDOW; 0: the attr's */
    uint32_t rd_chunk_bulk;       /* VRPC_VERBS_READ_CHUNK_BULK; 0: the default */
};

/* rdma-core returns a positive errno from some calls: ours is negative. */
static inline int verbs_err_pos(int rc) { return rc > 0 ? -rc : rc; }

#define HDR_LEN 8u

#define MIN_RESV 1u

/* Receive buffers each connection keeps unpromised for the peer's
 * credit-only messages, which take no credit. The receiver reposts such a
 * buffer at once and counts it; every header carries that count (ctl_seen),
 * and a sender never has more than CTL_RESV credit-only messages the peer has
 * not confirmed. So returning credits never needs a credit (no deadlock, no
 * credit ping-pong) and never finds the receive queue empty (no RNR). */
#define CTL_RESV 1u

#define CM_TIMEOUT_MS 2000

#define ACK_BATCH 64

/* Work request ids: the low two bits say what completed. Receives carry the
 * buffer pointer, reads their job, window operations their window; sends the
 * sequence number shifted left by two. */
#define WRID_RECV 1ull

#define WRID_READ 2ull

#define WRID_MW 3ull

#define WRID_TAG 3ull

#define WRID_SEQ_SHIFT 2

/* BIND_MW and LOCAL_INV work requests one endpoint may have on its send queue
 * (the send queue is sized for them besides sends and read_window reads). */
#define MW_SLOTS 16u

/* The default READ chunk: with read_window (2) it is the READ bytes one
 * connection has in flight, and a small message on that connection waits
 * behind them. rxe (Soft-RoCE) answers a READ in one softirq burst (every
 * response packet built, checksummed and, on one device, received and copied
 * in it) that holds its CPU; the peer's small SEND and the pollers and
 * workers wait for the bursts in flight. In the Soft-RoCE VM a 1-byte call
 * during four 16 MiB uploads took 27-43 ms at its median with 256 KiB chunks,
 * 8-13 ms with 64 KiB, 4-5 ms with 32 KiB (the request leg, roughly
 * proportional to the bytes in flight; bench/softroce/hol_bench,
 * hol-in-vm.sh). The price is about a tenth of the large-message bandwidth
 * (the quietest A/B, one boot, rpc_bench --payload: 1 MiB 36.0 vs 40.4 MB/s,
 * 16 MiB 36.1 vs 39.1 MB/s, ib_read_bw 40 MB/s; a window of 4 such chunks
 * did not buy it back). So 32 KiB on a software device. On hardware the NIC answers READs without the CPU, and a chunk's
 * wire time must cover the turnaround of the next READ: 64 KiB (5 us at
 * 100 Gb/s) keeps two in flight busy while holding a small message back by
 * at most ~10 us. Chunks over 256 KiB are a bad idea on rxe across a veth
 * pair: 1 MiB chunks overflowed the netdev backlog (1000 packets) and each
 * loss cost the ACK timeout (rdma_cm's on RoCE: exponent 19, 2.1 s). */
#define READ_CHUNK_SOFT (32u << 10)

#define READ_CHUNK_HW (64u << 10)

/* The chunk while the connection carries only bulk traffic. The small chunk
 * above costs about a tenth of the bandwidth (the A/B above; one-round A/Bs
 * of 1 MiB calls ranged 0.75-0.98 of ib_read_bw, the 256 KiB ones on top;
 * perftest's own READs at 32 KiB, two in flight, are as fast as at 1 MiB, so
 * the price is in our per-chunk path: completion, poller, re-post). Only
 * small messages need the small chunk, so an endpoint reads in bulk chunks
 * until it sees one: a message received while it reads that no read
 * follows. The RPC layer starts one read per received descriptor, so
 * "messages received while reading minus reads started" (rd_unmatched)
 * counts messages that were not descriptors; one that stays unmatched for
 * SMALL_AGE_NS (longer than the server takes to turn a descriptor into a
 * read, registering a new large buffer included) switches the endpoint to the
 * small chunk for SMALL_HOLD_NS, renewed by every further one. Messages that
 * arrive while the endpoint reads nothing (the RPC handshake, calls between
 * transfers) wait behind no READ and are not counted. The first small
 * message after a bulk-only stretch still meets bulk chunks in flight (at
 * most read_window of them, and more are posted until it has aged); every
 * later one within the hold meets small ones. Not when attr.read_chunk or
 * VRPC_VERBS_READ_CHUNK fixes the chunk. 256 KiB: larger chunks overflowed
 * the veth backlog (see above).
 * Not on a software device (rxe) unless VRPC_VERBS_READ_CHUNK_BULK asks for
 * it: there several endpoints reading bulk chunks at once (2 x 256 packets
 * each, answered in one burst) overflow the netdev backlog anyway; rxe then
 * fails to send ACKs and READ responses ("rdma_rxe: Failed sending ACK") and
 * its recovery (retries, RNR NAKs, replays) left QPs stalled or in error with
 * no completion (issue 16: in test_fault_rpc_verbs_veth, seed 99991, one VM
 * boot alternating, bulk chunks failed 6 of 30 runs, 15 with ACK send
 * failures, 702 rxe send errors and 782 retries in all; 32 KiB chunks passed
 * 30 of 30 with no send error and 17 retries). */
#define READ_CHUNK_BULK (256u << 10)

#define SMALL_AGE_NS 10000000ull

#define SMALL_HOLD_NS 200000000ull

/* rxe's vendor id (kernel rxe_param.h RXE_VENDOR_ID): a software device */
#define RXE_VENDOR_ID 0xffffffu

struct hdr {
    uint16_t credits;
    uint16_t flags;
    uint32_t ctl_seen; /* credit-only messages of the peer received and reposted */
};

#define HDR_CREDIT_ONLY 1u

struct hello {
    uint32_t magic;
    uint16_t version;
    uint16_t credits;
    uint32_t eager_size;
    uint32_t rsvd;
};

struct rejectmsg {
    uint32_t magic;
    uint16_t version;
    uint16_t code;
    char why[48];
};

#define HELLO_MAGIC 0x56525043u

_Static_assert(sizeof(struct hello) <= 56, "connect private data is at most 56 bytes");

_Static_assert(sizeof(struct hdr) == HDR_LEN, "header size");

enum obj_kind { K_EP = 1, K_LISTENER };
enum ep_state { S_CONNECTING, S_ACCEPTING, S_OPEN, S_CLOSING, S_DEAD };

struct vtp;
struct vcq;

struct sent {
    struct vrpc_buf *buf; /* NULL: credit-only */
    uint64_t wr_id;
};

/* One vrpc_ep_read(): split into READ work requests of at most the
 * transport's chunk, posted round-robin with the endpoint's other reads. */
struct rjob {
    struct vrpc_buf *buf;
    uint64_t wr_id, raddr;
    char *laddr;
    uint32_t lkey, rkey, len;
    uint32_t posted;      /* bytes covered by posted chunks */
    uint32_t outstanding; /* chunks posted and not completed */
    int status;           /* first error */
    bool queued;          /* on the endpoint's round-robin queue */
    struct rjob *next;
};

/* A type-2 memory window: on the transport's free list, or bound on one
 * endpoint's QP (on that endpoint's grant list) until its LOCAL_INV
 * completes (back to the free list) or the endpoint dies (deallocated). */
enum mw_state {
    MW_LIVE = 1, /* bound (or being bound): the key works */
    MW_INV,      /* LOCAL_INV posted by vrpc_ep_revoke */
    MW_CANCEL,   /* revoked on a dead endpoint: REVOKE -ECANCELED to stage */
    MW_DEAD,     /* revoke completed -ECANCELED; window deallocated */
};

struct vmw {
    struct ibv_mw *mw;
    uint32_t rkey; /* the key of the last bind */
    /* the last bind's MR and range, for the log of a failed bind only (the
     * MR may be gone by then: found again in tp->mrs before it is used) */
    const struct vmr *bind_mr;
    uint32_t bind_lkey, bind_len;
    uintptr_t bind_addr;
    enum mw_state state;
    bool bind_pending; /* the bind's completion has not been seen */
    uint64_t wr_id;    /* the revoke's */
    struct vmw *next;
};

struct vep {
    struct vrpc_ep base;
    enum obj_kind kind; /* id->context points here */
    struct vtp *tp;
    struct vcq *cq;
    struct rdma_cm_id *id;
    struct ibv_qp *qp;
    uint32_t qpn, max_inline;

    pthread_mutex_t lock; /* send side and state */
    pthread_cond_t cond;
    enum ep_state state;
    int status; /* DISCONNECTED status */
    bool by_cm; /* status from an rdma_cm DISCONNECTED event (the
				  poller may still learn a truer one: see
				  final_status) */
    char why[128];
    uint32_t credits; /* we may send this many */
    uint32_t unsignaled, sig_every;
    struct sent *ring; /* posted sends in order */
    uint32_t ring_mask, head, tail;
    uint64_t seq_head;
    struct vrpc_buf *wq_head, *wq_tail; /* sends waiting for credits */
    uint32_t nwait, max_queued;
    _Atomic uint64_t wait_ns; /* sends wait for credits since (the last credits
				     that arrived); 0: none waits (see credit_watchdog) */
    struct vrpc_credit_ep cr; /* credits (the core's, credit.h; poller only, except
				     cr.credit_ret: credits to return, any message carries them) */

    /* poller only */
    uint32_t pending_ctl_min; /* credit_ret that still wants a credit-only message; 0: none */
    bool reported, torn, in_todo, counted, reaping, disc_sent;
    bool flush_logged; /* verbs_cq_fail_flushed said it once */
    /* how the connection really ended (poller only, read when DISCONNECTED
	 * is staged, after every completion of ep was polled): */
    int wc_err;                       /* first error completion (not a flush) of ep */
    uint32_t flushed;                 /* posted work requests the QP flushed, reads cut off */
    uint32_t ctl_sent, peer_ctl_seen; /* ep->lock */
    bool cm_up;                       /* ep->lock: rdma_cm has the connection established */
    atomic_uint ctl_rcvd;
    struct vep *tnext, *wnext;
    struct vep *anext;         /* CM thread lists */
    struct vep *dnext, *xnext; /* deadline watch (tp->lock), expired (CM thread) */
    uint64_t deadline_ns;      /* tp->lock */
    bool watched;              /* tp->lock */
    struct vtp_listener *lst;
    struct vconns *nconns; /* accepted: counted there (holds a reference) */
    uint64_t accept_user;

    /* reads and grants (ep->lock) */
    struct rjob *rjobs, *rfree; /* all jobs (rd_njobs); the free ones */
    uint32_t rd_njobs;
    struct rjob *rq_head, *rq_tail;  /* jobs with chunks left to post */
    uint32_t rd_inflight, rd_window; /* chunks posted; at most this many */
    int32_t rd_unmatched;            /* messages received minus reads started,
					     at least 0 (see READ_CHUNK_BULK) */
    uint64_t rd_unmatched_ns;        /* first seen above 0 then; 0: not */
    uint64_t rd_small_until;         /* small chunks until then (ns) */
    atomic_ullong rd_deadline;       /* chunks in flight: next completion due by
					     then (else the watchdog fails ep); 0: none */
    struct vmw *grants;              /* windows bound on this QP */
    uint32_t mw_inflight;            /* BIND_MW / LOCAL_INV not completed */
    bool gone;                       /* DISCONNECTED staged: revoke says -ENOTCONN */
};

struct vcq {
    struct vrpc_cq base;
    struct vtp *tp;
    int evfd;
    atomic_int sleeping;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    struct ibv_srq *srq;
    atomic_bool bound;
    unsigned unacked;
    struct vrpc_credit_pool cr; /* posted receives; of which unpromised; hungry list (credit.h) */
    uint32_t max_recv;

    pthread_mutex_t lock;
    struct vrpc_buf *pend_head; /* posted before the device was bound */
    struct vrpc_buf *posted_list;
    struct vep *todo; /* endpoints that need the poller */
    struct vep **map; /* qpn -> endpoint */
    uint32_t map_mask;
    struct vcq *next;     /* tp's list */
    atomic_int async_err; /* a device error of this CQ or its SRQ, for the CM thread */

    /* poller only */
    struct vrpc_wc *stage;
    unsigned st_head, st_tail, st_cap;
    struct vep *reap_wait;   /* drained; torn down once the CQ was seen empty */
    atomic_int reading;      /* endpoints with a read deadline set */
    uint64_t rd_scan_ns;     /* next read watchdog scan */
    uint64_t cw_scan_ns;     /* next credit watchdog scan */
    uint64_t shrink_scan_ns; /* next reservation shrink scan (rule 7) */
    atomic_int waiting;      /* endpoints with wait_ns set */
    struct ibv_wc wcs[32];
};

/* A listener's count of the connections it accepted that are not torn
 * down yet (vrpc_listen_attr.max_conns). Shared by the listener and each
 * counted endpoint (refs), since endpoints outlive their listener. */
struct vconns {
    atomic_uint n;
    atomic_int refs;
    unsigned max; /* 0: no limit */
};

static inline void verbs_conns_unref(struct vconns *c)
{
    if (c && atomic_fetch_sub(&c->refs, 1) == 1)
        free(c);
}

struct vtp_listener {
    struct vrpc_listener base;
    enum obj_kind kind;
    struct vtp *tp;
    struct rdma_cm_id *id;
    struct vcq **cqs;
    unsigned ncqs, rr;
    uint64_t user;
    bool closing;
    struct vconns *nconns;
};

struct vmr {
    struct vrpc_mr base;
    struct ibv_mr *mr;
    struct vmr *next;
};

struct vtp {
    struct vrpc_transport base;
    struct qp_cfg cfg;
    struct rdma_event_channel *ech;
    int epfd, wakefd;
    pthread_t cm;
    bool cm_started;
    atomic_bool stop;
    atomic_bool async_pending; /* some async_err or dev_fatal is set */
    atomic_bool dev_fatal;
    struct vtp *gnext; /* g_tps */

    pthread_mutex_t lock; /* binding, lists, cmd */
    pthread_cond_t cond;
    struct ibv_context *verbs;
    struct ibv_pd *pd;
    struct ibv_device_attr dattr;
    struct vmr *mrs;
    struct vcq *cqs;
    struct vep *reap;
    struct vep *watch;            /* endpoints with a handshake or close deadline */
    uint32_t rd_window, rd_chunk; /* per endpoint, clamped to the device at binding */
    uint32_t rd_chunk_bulk;       /* > rd_chunk: bulk chunks while no small messages */
    bool mw_ok;                   /* device has type-2B memory windows */
    atomic_bool mw_warned;
    pthread_mutex_t mw_lock; /* mw_free */
    struct vmw *mw_free;
    void (*cmd)(void *);
    void *cmd_arg;
    bool cmd_done;
};

/* ---- functions of one file the others call ---------------------------------------- *
 * The ops table's entries (verbs_dev.c lists them) keep the contracts of
 * transport_ops.h; the others say their thread and lock beside their
 * definition. In short: verbs_dev_*, verbs_cm_main, verbs_ep_teardown,
 * verbs_mw_dealloc_grants and verbs_ep_qp_in_error run on the CM thread;
 * verbs_*_on_wc, verbs_rma_flush_locked, verbs_ep_final_status and the
 * watchdogs on the CQ's poller; *_locked with ep->lock held (but
 * verbs_cm_watch_del_locked: tp->lock); verbs_ep_fail* and
 * verbs_ep_todo_add on any thread, without ep->lock. */

/* verbs_dev.c: the transport on its device (binding, async events, create/destroy, the ops table).
 * verbs_dev_bind: -EXDEV when tp is already on another device. */
int verbs_dev_bind(struct vtp *tp, struct ibv_context *verbs);
void verbs_dev_async_fail_pending(struct vtp *tp);
void verbs_dev_read_async_events(struct ibv_context *ctx);

/* verbs_cm.c: connection management (CM thread, listen/connect/accept, deadlines) */
void verbs_cm_watch_add(struct vep *ep, uint64_t deadline_ns);
void verbs_cm_watch_del_locked(struct vtp *tp, struct vep *ep);
void *verbs_cm_main(void *arg);
void verbs_cm_listener_destroy(struct vrpc_listener *base);
int verbs_cm_listen(struct vrpc_transport *tbase, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
                    struct vrpc_listener **out);
int verbs_cm_connect(struct vrpc_transport *tbase, const struct vrpc_addr *dst, const struct vrpc_addr *src,
                     const struct vrpc_ep_attr *attr, struct vrpc_ep **out);

/* verbs_hello.c: the connect private data (HELLO, REJECT) */
int verbs_hello_check(const struct vtp *tp, const void *data, uint8_t len, char *why, size_t n);
void verbs_hello_set_peer(struct vep *ep, const void *data);
void verbs_hello_conn_param(struct vep *ep, struct rdma_conn_param *p, struct hello *h);
void verbs_hello_reject(struct rdma_cm_id *id, const struct vtp *tp, int code, const char *why);
int verbs_hello_reject_reason(const struct rdma_cm_event *ev, char *why, size_t n);

/* verbs_ep.c: endpoints (QP, failure, teardown, final status, close/abort) */
void verbs_ep_todo_add(struct vep *ep);
void verbs_ep_fail(struct vep *ep, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void verbs_ep_fail_cm(struct vep *ep, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void verbs_ep_fail_in(struct vep *ep, enum ep_state state, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int verbs_ep_qp_modify(struct vep *ep, enum ibv_qp_state state);
struct vep *verbs_ep_new(struct vtp *tp, struct vcq *cq, void *user, uint32_t max_queued);
void verbs_ep_free(struct vrpc_ep *base);
void verbs_ep_teardown(struct vep *ep);
int verbs_ep_final_status(struct vep *ep);
int verbs_ep_setup_qp(struct vep *ep, bool passive);
bool verbs_ep_qp_in_error(struct vep *ep);
int verbs_ep_close(struct vrpc_ep *base);
int verbs_ep_abort(struct vrpc_ep *base, int status);

/* verbs_cq.c: completion queues and the poller (SRQ, staging, watchdogs).
 * verbs_cq_log_wc: logs an error completion (not a flush) of `what` with its
 * QP number, opcode, status and vendor error, and whether its endpoint had
 * already failed (and why), before anything else is done with it (poller; ep
 * may be NULL: a QP no longer mapped). verbs_cq_fail_flushed: the first
 * flushed completion (of `what`) of an endpoint that has not failed and did
 * not disconnect: the QP went to error with no error completion of ours and
 * no event first. With fail, fails ep (-ECONNRESET) with the QP's state in
 * the reason, else logs it (poller). */
void verbs_cq_log_wc(struct vep *ep, const struct ibv_wc *wc, const char *what);
void verbs_cq_fail_flushed(struct vep *ep, const struct ibv_wc *wc, const char *what, bool fail);
int verbs_cq_bind(struct vtp *tp, struct vcq *cq);
int verbs_cq_poll(struct vrpc_cq *base, struct vrpc_wc *wc, unsigned max);
void verbs_cq_arm(struct vrpc_cq *base);
void verbs_cq_wait(struct vrpc_cq *base, int timeout_ms);
void verbs_cq_kick(struct vrpc_cq *base);
void verbs_cq_flush(struct vrpc_cq *base);
void verbs_cq_destroy(struct vrpc_cq *base);
int verbs_cq_create(struct vrpc_transport *tbase, const struct vrpc_cq_attr *attr, struct vrpc_cq **out);
int verbs_cq_post_recv(struct vrpc_cq *base, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n);

/* verbs_msg.c: messages (send path, credit-only messages, the credit hook) */
void verbs_msg_credit_send(struct vrpc_credit_ep *e);
void verbs_msg_send_credit_locked(struct vep *ep);
int verbs_msg_send_list(struct vrpc_ep *base, const struct vrpc_send_wr *wrs, unsigned n, unsigned *sent);
int verbs_msg_send(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id,
                   unsigned flags);

/* verbs_rma.c: RDMA READ (chunks, window, watchdog) */
void verbs_rma_flush_locked(struct vcq *cq, struct vep *ep);
void verbs_rma_on_wc(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc);
void verbs_rma_watchdog_scan(struct vcq *cq);
int verbs_rma_read(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr,
                   uint32_t rkey, uint64_t wr_id);

/* verbs_mr.c: memory registration and memory windows (grant/revoke) */
int verbs_mr_register(struct vtp *tp, struct vmr *m);
void verbs_mw_kill(struct vmw *w);
void verbs_mw_dealloc_grants(struct vep *ep);
void verbs_mw_on_wc(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc);
int verbs_mw_grant(struct vrpc_ep *base, struct vrpc_mr *mbase, const void *addr, uint32_t len, uint32_t *rkey);
int verbs_mw_revoke(struct vrpc_ep *base, uint32_t rkey, uint64_t wr_id);
int verbs_mr_reg(struct vrpc_transport *tbase, void *addr, size_t len, unsigned access, struct vrpc_mr **out);
void verbs_mr_dereg(struct vrpc_mr *base);

/* The read watchdog (verbs_rma.c), from every poll: the scan only while
 * some endpoint of the CQ reads. */
static inline void verbs_rma_watchdog(struct vcq *cq)
{
    if (atomic_load(&cq->reading))
        verbs_rma_watchdog_scan(cq);
}

/* ---- helpers every file inlines ------------------------------------------------------ */

static inline int verbs_err_errno(void) { return errno > 0 ? -errno : -EIO; }

/* VRPC_VERBS_TRACE=1: log completions and credits (-1: not read yet;
 * defined in verbs_dev.c). */
extern int vrpc_verbs_trace;
#define TRACE(...)                                                                                                     \
    do {                                                                                                               \
        if (vrpc_verbs_trace < 0)                                                                                      \
            vrpc_verbs_trace = vrpc_env_flag(VRPC_ENV_VERBS_TRACE);                                                    \
        if (vrpc_verbs_trace)                                                                                          \
            vrpc_verbs_trace_log(__VA_ARGS__);                                                                         \
    } while (0)

/* A trace line stamped with CLOCK_MONOTONIC in microseconds (the clock of
 * vrpc_now_ns, so that a program's own timestamps line up with it). */
void vrpc_verbs_trace_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static inline void verbs_wake(int fd)
{
    uint64_t one = 1;
    ssize_t r = write(fd, &one, sizeof(one));
    (void)r;
}

static inline void verbs_drain(int fd)
{
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof(v));
    (void)r;
}

static inline void verbs_cq_stage(struct vcq *cq, uint32_t op, struct vep *ep, struct vrpc_buf *buf, uint64_t wr_id,
                                  int status, uint32_t len, uint32_t imm)
{
    struct vrpc_wc *w;
    if (cq->st_tail - cq->st_head == cq->st_cap) {
        /* grow (rare: only when one poll produces more than the ring holds) */
        unsigned ncap = cq->st_cap * 2, n = cq->st_tail - cq->st_head;
        struct vrpc_wc *ns = malloc(ncap * sizeof(*ns));
        if (!ns)
            abort();
        for (unsigned i = 0; i < n; i++)
            ns[i] = cq->stage[(cq->st_head + i) % cq->st_cap];
        free(cq->stage);
        cq->stage = ns;
        cq->st_cap = ncap;
        cq->st_head = 0;
        cq->st_tail = n;
    }
    w = &cq->stage[cq->st_tail++ % cq->st_cap];
    w->opcode = op;
    w->ep = ep ? &ep->base : NULL;
    w->buf = buf;
    w->wr_id = wr_id;
    w->status = status;
    w->byte_len = status ? 0 : len;
    w->imm = status ? 0 : imm;
}

static inline uint32_t verbs_msg_ring_used(const struct vep *ep) { return ep->tail - ep->head; }

/* Nothing of ep's is on its send queue or waiting to go there: sends, read
 * chunks, window operations (ep->lock). */
static inline bool verbs_ep_sq_idle_locked(const struct vep *ep)
{
    return ep->head == ep->tail && !ep->rd_inflight && !ep->rq_head && !ep->mw_inflight;
}

/* One message's work request (ep->lock): the header carries the credits we
 * owe (all of them go on the first message that asks), the k-th message
 * after those already on the ring gets the k-th ring slot's sequence number,
 * small ones go inline. Selective signalling: a signalled completion retires
 * every earlier send of the QP; signal every sig_every, when nothing follows
 * (more false), and before the ring could fill. */
static inline void verbs_msg_wr_fill(struct vep *ep, struct ibv_send_wr *wr, struct ibv_sge *sge, struct hdr *h,
                                     uint32_t lkey, uint32_t len, uint32_t imm, bool ctl, uint32_t k, bool more)
{
    h->credits = htons((uint16_t)atomic_exchange(&ep->cr.credit_ret, 0));
    h->flags = htons(ctl ? HDR_CREDIT_ONLY : 0);
    h->ctl_seen = htonl(atomic_load(&ep->ctl_rcvd));
    memset(wr, 0, sizeof(*wr));
    sge->addr = (uintptr_t)h;
    sge->length = HDR_LEN + len;
    sge->lkey = lkey;
    wr->wr_id = (ep->seq_head + verbs_msg_ring_used(ep) + k) << WRID_SEQ_SHIFT;
    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->opcode = IBV_WR_SEND_WITH_IMM;
    wr->imm_data = htonl(imm);
    if (sge->length <= ep->max_inline)
        wr->send_flags |= IBV_SEND_INLINE;
    if (!more || ep->unsignaled + 1 >= ep->sig_every || verbs_msg_ring_used(ep) + k + 2 > ep->ring_mask) {
        wr->send_flags |= IBV_SEND_SIGNALED;
        ep->unsignaled = 0;
    } else {
        ep->unsignaled++;
    }
}

/* A posted message onto the ring (ep->lock), in posting order. */
static inline void verbs_msg_ring_push(struct vep *ep, struct vrpc_buf *buf, uint64_t wr_id)
{
    ep->ring[ep->tail & ep->ring_mask] = (struct sent){.buf = buf, .wr_id = wr_id};
    ep->tail++;
    if (buf)
        ep->credits--;
    else
        ep->ctl_sent++;
}

/* One message (buf NULL: a credit-only one), one ibv_post_send. */
static inline int verbs_msg_post_locked(struct vep *ep, struct vrpc_buf *buf, uint32_t len, uint32_t imm,
                                        uint64_t wr_id, bool more)
{
    struct ibv_send_wr wr, *bad;
    struct ibv_sge sge;
    struct hdr ctl, *h = buf ? (struct hdr *)((char *)buf->data - HDR_LEN) : &ctl;
    int rc;
    verbs_msg_wr_fill(ep, &wr, &sge, h, buf ? buf->mr->lkey : 0, len, imm, !buf, 0, more);
    rc = ibv_post_send(ep->qp, &wr, &bad);
    TRACE("verbs: post qpn %u len %u credits %u ret %u ctl %d rc %d", ep->qpn, len, ep->credits, ntohs(h->credits),
          !buf, rc);
    if (rc) {
        atomic_fetch_add(&ep->cr.credit_ret, ntohs(h->credits));
        return verbs_err_pos(rc);
    }
    verbs_msg_ring_push(ep, buf, wr_id);
    return 0;
}

/* Doorbell batching: at most this many messages per ibv_post_send. */
#define VERBS_POST_LIST_MAX 32

/* wrs[0..k) (1 <= k <= VERBS_POST_LIST_MAX, each with a credit and a ring
 * slot: the caller checked) as one chain of work requests, one
 * ibv_post_send: one doorbell (on rxe one system call) instead of k. more:
 * another message is posted right after the last. *posted: how many went
 * (all of them on 0; on an error those before the provider's bad_wr). */
static inline int verbs_msg_post_list_locked(struct vep *ep, const struct vrpc_send_wr *wrs, unsigned k, bool more,
                                             unsigned *posted)
{
    struct ibv_send_wr wr[VERBS_POST_LIST_MAX], *bad = NULL;
    struct ibv_sge sge[VERBS_POST_LIST_MAX];
    unsigned i, ok;
    int rc;
    for (i = 0; i < k; i++) {
        struct vrpc_buf *b = wrs[i].buf;
        verbs_msg_wr_fill(ep, &wr[i], &sge[i], (struct hdr *)((char *)b->data - HDR_LEN), b->mr->lkey, wrs[i].len,
                          wrs[i].imm, false, i, i + 1 < k || more);
        wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
    }
    rc = ibv_post_send(ep->qp, wr, &bad);
    ok = !rc ? k : (bad >= wr && bad < wr + k) ? (unsigned)(bad - wr) : 0;
    TRACE("verbs: post list qpn %u n %u posted %u credits %u rc %d", ep->qpn, k, ok, ep->credits, rc);
    for (i = 0; i < ok; i++)
        verbs_msg_ring_push(ep, wrs[i].buf, wrs[i].wr_id);
    for (i = ok; i < k; i++) { /* the credits the unposted headers were to carry */
        struct hdr *h = (struct hdr *)((char *)wrs[i].buf->data - HDR_LEN);
        atomic_fetch_add(&ep->cr.credit_ret, ntohs(h->credits));
    }
    *posted = ok;
    return rc ? verbs_err_pos(rc) : 0;
}

/* How many messages may be posted now: credits and ring room, at most max. */
static inline unsigned verbs_msg_room(const struct vep *ep, unsigned max)
{
    uint32_t room = ep->ring_mask - verbs_msg_ring_used(ep);
    if (room > ep->credits)
        room = ep->credits;
    return room < max ? room : max;
}

/* Graceful close: once every send accepted before vrpc_ep_close() has been
 * acknowledged (and every read and window operation has completed), the
 * DREQ goes out; both sides then see DISCONNECTED. A healthy endpoint cannot
 * be torn down while its lock is held, so the id is valid.
 * The DREQ waits for rdma_cm's ESTABLISHED too: a server may close on the
 * client's first message, which can arrive before the RTU, and rdma_cm drops a
 * disconnect in that state (REP sent), leaving both sides waiting forever. */
static inline void verbs_ep_close_progress_locked(struct vep *ep)
{
    if (ep->state == S_CLOSING && ep->cm_up && !ep->disc_sent && !ep->wq_head && verbs_ep_sq_idle_locked(ep) &&
        ep->id) {
        ep->disc_sent = true;
        rdma_disconnect(ep->id);
    }
}

/* The credit clock (credit_watchdog, ep->lock): runs while sends wait with
 * no credit left (not while they wait for send-queue room); fresh: credits
 * just came, so a wait that goes on starts again from now. */
static inline void verbs_msg_wait_clock_locked(struct vep *ep, bool fresh)
{
    bool waiting = ep->wq_head && !ep->credits;
    uint64_t old = atomic_load_explicit(&ep->wait_ns, memory_order_relaxed);
    if (waiting && (!old || fresh)) {
        atomic_store_explicit(&ep->wait_ns, vrpc_tp_now_ns(), memory_order_relaxed);
        if (!old)
            atomic_fetch_add(&ep->cq->waiting, 1);
    } else if (!waiting && old) {
        atomic_store_explicit(&ep->wait_ns, 0, memory_order_relaxed);
        atomic_fetch_sub(&ep->cq->waiting, 1);
    }
}

static inline bool verbs_msg_can_post(const struct vep *ep) { return verbs_msg_room(ep, 1) != 0; }

static inline void verbs_msg_pump_locked(struct vep *ep)
{
    if (ep->state != S_OPEN && ep->state != S_CLOSING)
        return;
    /* the queue in chains: one doorbell per VERBS_POST_LIST_MAX messages */
    while (ep->wq_head) {
        struct vrpc_send_wr wrs[VERBS_POST_LIST_MAX];
        unsigned k = verbs_msg_room(ep, VERBS_POST_LIST_MAX), n = 0, posted;
        struct vrpc_buf *b = ep->wq_head;
        for (; b && n < k; b = b->next, n++)
            wrs[n] = (struct vrpc_send_wr){b, b->len, (uint32_t)b->priv[1], b->priv[0]};
        if (!n)
            break;
        /* another chain follows at once only if a message, credit and slot are left */
        bool more = b && ep->credits > n && verbs_msg_ring_used(ep) + n < ep->ring_mask;
        int rc = verbs_msg_post_list_locked(ep, wrs, n, more, &posted);
        for (unsigned i = 0; i < posted; i++) {
            ep->wq_head = ep->wq_head->next;
            ep->nwait--;
        }
        if (!ep->wq_head)
            ep->wq_tail = NULL;
        if (rc)
            return;
    }
    if (ep->wq_head || atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
        verbs_msg_wait_clock_locked(ep, false);
}

static inline uint64_t verbs_ms_from_now(uint32_t ms) { return vrpc_tp_now_ns() + (uint64_t)ms * 1000000u; }

static inline struct vep *verbs_cq_map_get(struct vcq *cq, uint32_t qpn)
{
    for (uint32_t i = qpn & cq->map_mask;; i = (i + 1) & cq->map_mask) {
        if (!cq->map[i])
            return NULL;
        if (cq->map[i]->qpn == qpn)
            return cq->map[i];
    }
}

/* A completion's error, for final_status (poller). */
static inline void verbs_ep_note_wc(struct vep *ep, enum ibv_wc_status st, int err)
{
    if (st == IBV_WC_WR_FLUSH_ERR)
        ep->flushed++;
    else if (st != IBV_WC_SUCCESS && !ep->wc_err)
        ep->wc_err = err;
}

static inline int verbs_wc_status(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS:
        return 0;
    case IBV_WC_WR_FLUSH_ERR:
        return -ECANCELED;
    case IBV_WC_RETRY_EXC_ERR:
        return -ETIMEDOUT;
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return -ENOBUFS;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
        return -EACCES;
    default:
        return -EIO;
    }
}

#endif
