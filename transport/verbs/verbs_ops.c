/* The verbs backend behind the transport interface (vrpc_verbs_ops): rdma_cm
 * connections, RC queue pairs sending SEND_WITH_IMM, one SRQ per CQ fed with
 * the user's posted buffers, credits per transport.h's rule, selective
 * signalling and inline sends; chunked RDMA READs (vrpc_ep_read) and one-shot
 * read keys from type-2B memory windows (vrpc_ep_grant/revoke) on the same
 * send queue. A transport instance binds to one device, the
 * first one an address names (listen host, connect source or route); MRs, CQs
 * and posted receives made before that wait for the binding.
 * rdma-core's error conventions become -errno here and nowhere above. */
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
	uint32_t srq_limit;  /* see VRPC_VERBS_SRQ_LIMIT */
	uint32_t rd_chunk, rd_window; /* VRPC_VERBS_READ_CHUNK / _WINDOW; 0: the attr's */
	uint32_t rd_chunk_bulk;       /* VRPC_VERBS_READ_CHUNK_BULK; 0: the default */
};

/* The knobs' ranges and defaults are in common/env.c's table. */
static void qp_cfg_init(struct qp_cfg *cfg)
{
	long pv = vrpc_env_long(VRPC_ENV_VERBS_PROTO_VERSION);
	cfg->rnr_retry = (uint8_t)vrpc_env_long(VRPC_ENV_VERBS_RNR_RETRY);
	cfg->ack_timeout = (uint8_t)vrpc_env_long(VRPC_ENV_VERBS_ACK_TIMEOUT);
	cfg->retry_cnt = 7;
	cfg->gid_index = (int)vrpc_env_long(VRPC_ENV_VERBS_GID_INDEX);
	cfg->proto_version = (uint16_t)(pv < 0 ? PROTO_VERSION : pv);
	cfg->srq_limit = (uint32_t)vrpc_env_long(VRPC_ENV_VERBS_SRQ_LIMIT);
	cfg->rd_chunk = (uint32_t)vrpc_env_long(VRPC_ENV_VERBS_READ_CHUNK);
	cfg->rd_window = (uint32_t)vrpc_env_long(VRPC_ENV_VERBS_READ_WINDOW);
	cfg->rd_chunk_bulk = (uint32_t)vrpc_env_long(VRPC_ENV_VERBS_READ_CHUNK_BULK);
}

/* rdma-core returns a positive errno from some calls: ours is negative. */
static int err_pos(int rc) { return rc > 0 ? -rc : rc; }

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
 * the veth backlog (see above). */
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

/* ---- objects ----------------------------------------------------------------- */

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
	int status;            /* DISCONNECTED status */
	bool by_cm;            /* status from an rdma_cm DISCONNECTED event (the
				  poller may still learn a truer one: see
				  final_status) */
	char why[128];
	uint32_t credits;      /* we may send this many */
	uint32_t unsignaled, sig_every;
	struct sent *ring;     /* posted sends in order */
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
	/* how the connection really ended (poller only, read when DISCONNECTED
	 * is staged, after every completion of ep was polled): */
	int wc_err;       /* first error completion (not a flush) of ep */
	uint32_t flushed; /* posted work requests the QP flushed, reads cut off */
	uint32_t ctl_sent, peer_ctl_seen; /* ep->lock */
	bool cm_up; /* ep->lock: rdma_cm has the connection established */
	atomic_uint ctl_rcvd;
	struct vep *tnext, *wnext;
	struct vep *anext; /* CM thread lists */
	struct vep *dnext, *xnext; /* deadline watch (tp->lock), expired (CM thread) */
	uint64_t deadline_ns;      /* tp->lock */
	bool watched;              /* tp->lock */
	struct vtp_listener *lst;
	struct vconns *nconns; /* accepted: counted there (holds a reference) */
	uint64_t accept_user;

	/* reads and grants (ep->lock) */
	struct rjob *rjobs, *rfree;       /* all jobs (rd_njobs); the free ones */
	uint32_t rd_njobs;
	struct rjob *rq_head, *rq_tail;   /* jobs with chunks left to post */
	uint32_t rd_inflight, rd_window;  /* chunks posted; at most this many */
	int32_t rd_unmatched;             /* messages received minus reads started,
					     at least 0 (see READ_CHUNK_BULK) */
	uint64_t rd_unmatched_ns;         /* first seen above 0 then; 0: not */
	uint64_t rd_small_until;          /* small chunks until then (ns) */
	atomic_ullong rd_deadline;        /* chunks in flight: next completion due by
					     then (else the watchdog fails ep); 0: none */
	struct vmw *grants;               /* windows bound on this QP */
	uint32_t mw_inflight;             /* BIND_MW / LOCAL_INV not completed */
	bool gone;                        /* DISCONNECTED staged: revoke says -ENOTCONN */
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
	struct vep *todo;           /* endpoints that need the poller */
	struct vep **map;           /* qpn -> endpoint */
	uint32_t map_mask;
	struct vcq *next; /* tp's list */
	atomic_int async_err; /* a device error of this CQ or its SRQ, for the CM thread */

	/* poller only */
	struct vrpc_wc *stage;
	unsigned st_head, st_tail, st_cap;
	struct vep *reap_wait; /* drained; torn down once the CQ was seen empty */
	atomic_int reading;    /* endpoints with a read deadline set */
	uint64_t rd_scan_ns;   /* next read watchdog scan */
	uint64_t cw_scan_ns;   /* next credit watchdog scan */
	atomic_int waiting;    /* endpoints with wait_ns set */
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

static void vconns_unref(struct vconns *c)
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
	struct vtp *gnext;         /* g_tps */

	pthread_mutex_t lock; /* binding, lists, cmd */
	pthread_cond_t cond;
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	struct ibv_device_attr dattr;
	struct vmr *mrs;
	struct vcq *cqs;
	struct vep *reap;
	struct vep *watch; /* endpoints with a handshake or close deadline */
	uint32_t rd_window, rd_chunk; /* per endpoint, clamped to the device at binding */
	uint32_t rd_chunk_bulk;       /* > rd_chunk: bulk chunks while no small messages */
	bool mw_ok;                   /* device has type-2B memory windows */
	atomic_bool mw_warned;
	pthread_mutex_t mw_lock;      /* mw_free */
	struct vmw *mw_free;
	void (*cmd)(void *);
	void *cmd_arg;
	bool cmd_done;
};

/* ---- helpers ----------------------------------------------------------------- */

static int err_errno(void) { return errno > 0 ? -errno : -EIO; }

static int g_trace = -1; /* VRPC_VERBS_TRACE=1: log completions and credits */
#define TRACE(...)                                                                                  \
	do {                                                                                        \
		if (g_trace < 0)                                                                    \
			g_trace = vrpc_env_flag(VRPC_ENV_VERBS_TRACE);                              \
		if (g_trace)                                                                        \
			trace_log(__VA_ARGS__);                                                     \
	} while (0)

/* A trace line stamped with CLOCK_MONOTONIC in microseconds (the clock of
 * vrpc_now_ns, so that a program's own timestamps line up with it). */
static void trace_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace_log(const char *fmt, ...)
{
	char line[224];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	vrpc_tp_log("%llu %s", (unsigned long long)(vrpc_tp_now_ns() / 1000u), line);
}

static void wake(int fd)
{
	uint64_t one = 1;
	ssize_t r = write(fd, &one, sizeof(one));
	(void)r;
}

static void drain(int fd)
{
	uint64_t v;
	ssize_t r = read(fd, &v, sizeof(v));
	(void)r;
}

static uint32_t pow2(uint32_t x)
{
	uint32_t p = 1;
	while (p < x)
		p <<= 1;
	return p;
}

static int memlock_error(size_t bytes, int err, const char *dev)
{
	struct rlimit rl;
	char why[256];
	vrpc_tp_log("verbs: cannot register %zu bytes on %s: %s", bytes, dev, strerror(-err));
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
		struct vrpc_verbs_diag d = { .have = rl.rlim_cur, .need = rl.rlim_cur + bytes };
		vrpc_tp_log("verbs: %s", vrpc_verbs_advice(VRPC_VP_MEMLOCK, &d, why, sizeof(why)));
	}
	return -ENOMEM;
}

/* ---- binding the transport to its device --------------------------------------- */

static int mr_register(struct vtp *tp, struct vmr *m)
{
	/* a GRANT region has no remote access of its own: peers reach it only
	 * through a window bound over part of it (vrpc_ep_grant) */
	int acc = IBV_ACCESS_LOCAL_WRITE | ((m->base.access & VRPC_ACCESS_REMOTE_READ) ? IBV_ACCESS_REMOTE_READ : 0) |
		  ((m->base.access & VRPC_ACCESS_GRANT) ? IBV_ACCESS_MW_BIND : 0);
	m->mr = ibv_reg_mr(tp->pd, m->base.addr, m->base.len, acc);
	if (!m->mr) {
		int err = err_errno();
		if (err == -ENOMEM || err == -EPERM || err == -EAGAIN)
			return memlock_error(m->base.len, err, ibv_get_device_name(tp->verbs->device));
		vrpc_tp_log("verbs: ibv_reg_mr(%zu bytes): %s", m->base.len, strerror(-err));
		return err;
	}
	m->base.lkey = m->mr->lkey;
	m->base.rkey = m->mr->rkey;
	return 0;
}

/* Posted receives are linked through priv[2]/priv[3] (cq->lock) so that
 * cq_flush can hand each back exactly once. */
static void posted_link(struct vcq *cq, struct vrpc_buf *b)
{
	b->priv[2] = 0;
	b->priv[3] = (uintptr_t)cq->posted_list;
	if (cq->posted_list)
		cq->posted_list->priv[2] = (uintptr_t)b;
	cq->posted_list = b;
}

static void posted_unlink(struct vcq *cq, struct vrpc_buf *b)
{
	struct vrpc_buf *prev = (struct vrpc_buf *)(uintptr_t)b->priv[2], *next = (struct vrpc_buf *)(uintptr_t)b->priv[3];
	if (prev)
		prev->priv[3] = (uintptr_t)next;
	else
		cq->posted_list = next;
	if (next)
		next->priv[2] = (uintptr_t)prev;
}

/* cq->lock held. */
static int post_srq(struct vcq *cq, struct vrpc_buf *list)
{
	struct ibv_recv_wr wrs[16], *bad;
	struct ibv_sge sges[16];
	int rc = 0;
	while (list && !rc) {
		unsigned n = 0;
		for (; list && n < 16; list = list->next, n++) {
			posted_link(cq, list);
			sges[n].addr = (uintptr_t)list->data - HDR_LEN;
			sges[n].length = list->cap + HDR_LEN;
			sges[n].lkey = list->mr->lkey;
			wrs[n].wr_id = (uintptr_t)list | WRID_RECV;
			wrs[n].sg_list = &sges[n];
			wrs[n].num_sge = 1;
			wrs[n].next = n ? NULL : NULL;
			if (n)
				wrs[n - 1].next = &wrs[n];
		}
		rc = err_pos(ibv_post_srq_recv(cq->srq, wrs, &bad));
	}
	return rc;
}

static int cq_bind(struct vtp *tp, struct vcq *cq)
{
	struct ibv_srq_init_attr sa;
	int cqe = (int)cq->max_recv * 2 + 1024, rc;
	struct vrpc_buf *pend;
	if (cqe > tp->dattr.max_cqe)
		cqe = tp->dattr.max_cqe;
	cq->chan = ibv_create_comp_channel(tp->verbs);
	if (!cq->chan)
		return err_errno();
	fcntl(cq->chan->fd, F_SETFL, fcntl(cq->chan->fd, F_GETFL) | O_NONBLOCK);
	cq->cq = ibv_create_cq(tp->verbs, cqe, cq, cq->chan, 0);
	if (!cq->cq)
		return err_errno();
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = cq->max_recv < (uint32_t)tp->dattr.max_srq_wr ? cq->max_recv : (uint32_t)tp->dattr.max_srq_wr;
	sa.attr.max_sge = 1;
	sa.srq_context = cq; /* names it in asynchronous events */
	cq->srq = ibv_create_srq(tp->pd, &sa);
	if (!cq->srq)
		return err_errno();
	pthread_mutex_lock(&cq->lock);
	pend = cq->pend_head;
	cq->pend_head = NULL;
	rc = post_srq(cq, pend);
	pthread_mutex_unlock(&cq->lock);
	if (rc)
		return rc;
	if (tp->cfg.srq_limit && tp->cfg.srq_limit < sa.attr.max_wr) {
		struct ibv_srq_attr la = { .srq_limit = tp->cfg.srq_limit };
		if ((rc = err_pos(ibv_modify_srq(cq->srq, &la, IBV_SRQ_LIMIT))))
			vrpc_tp_log("verbs: cannot arm the receive queue's limit: %s", strerror(-rc));
	}
	atomic_store(&cq->bound, true);
	wake(cq->evfd);
	return 0;
}

/* Binds tp to `verbs` once: PD, pending MRs, pending CQs. -EXDEV when tp is
 * already on another device. */
static int tp_bind(struct vtp *tp, struct ibv_context *verbs)
{
	int rc = 0;
	pthread_mutex_lock(&tp->lock);
	if (tp->verbs) {
		rc = tp->verbs == verbs ? 0 : -EXDEV;
		if (rc)
			vrpc_tp_log("verbs: address is on device %s, this transport uses %s (one device per transport)",
				    ibv_get_device_name(verbs->device), ibv_get_device_name(tp->verbs->device));
		goto out;
	}
	if ((rc = err_pos(ibv_query_device(verbs, &tp->dattr))))
		goto out;
	tp->pd = ibv_alloc_pd(verbs);
	if (!tp->pd) {
		rc = err_errno();
		goto out;
	}
	tp->verbs = verbs;
	tp->rd_chunk = tp->cfg.rd_chunk ? tp->cfg.rd_chunk : tp->base.attr.read_chunk;
	/* a chunk fixed by the attribute or the environment stays fixed */
	tp->rd_chunk_bulk = tp->cfg.rd_chunk_bulk ? tp->cfg.rd_chunk_bulk : tp->rd_chunk ? 0 : READ_CHUNK_BULK;
	if (!tp->rd_chunk)
		tp->rd_chunk = tp->dattr.vendor_id == RXE_VENDOR_ID ? READ_CHUNK_SOFT : READ_CHUNK_HW;
	tp->rd_window = tp->cfg.rd_window ? tp->cfg.rd_window : tp->base.attr.read_window;
	if (tp->dattr.max_qp_init_rd_atom > 0 && tp->rd_window > (uint32_t)tp->dattr.max_qp_init_rd_atom)
		tp->rd_window = (uint32_t)tp->dattr.max_qp_init_rd_atom;
	tp->mw_ok = (tp->dattr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
	{
		/* the device's asynchronous events: read on the CM thread */
		struct epoll_event ee = { .events = EPOLLIN, .data.fd = verbs->async_fd };
		fcntl(verbs->async_fd, F_SETFL, fcntl(verbs->async_fd, F_GETFL) | O_NONBLOCK);
		if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, verbs->async_fd, &ee))
			vrpc_tp_log("verbs: cannot watch %s's asynchronous events: %s",
				    ibv_get_device_name(verbs->device), strerror(errno));
	}
	for (struct vmr *m = tp->mrs; m && !rc; m = m->next)
		rc = mr_register(tp, m);
	for (struct vcq *c = tp->cqs; c && !rc; c = c->next)
		rc = cq_bind(tp, c);
	if (rc)
		vrpc_tp_log("verbs: cannot set up device %s: %s", ibv_get_device_name(verbs->device), strerror(-rc));
out:
	pthread_mutex_unlock(&tp->lock);
	return rc;
}

/* ---- completion staging (poller only) ---------------------------------------- */

static void stage(struct vcq *cq, uint32_t op, struct vep *ep, struct vrpc_buf *buf, uint64_t wr_id, int status,
		  uint32_t len, uint32_t imm)
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

/* ---- credits (the core's, credit.h; poller only, except credit_ret) ---------------- */

static void send_credit_locked(struct vep *ep);

/* vrpc_credit_distribute's hook: a credit-only message for e's endpoint. */
static void credit_send(struct vrpc_credit_ep *e)
{
	struct vep *ep = container_of(e, struct vep, cr);
	pthread_mutex_lock(&ep->lock);
	ep->pending_ctl_min = 1;
	send_credit_locked(ep);
	pthread_mutex_unlock(&ep->lock);
}

/* ---- sending (ep->lock) ------------------------------------------------------------ */

static uint32_t ring_used(const struct vep *ep) { return ep->tail - ep->head; }

/* Nothing of ep's is on its send queue or waiting to go there: sends, read
 * chunks, window operations (ep->lock). */
static bool sq_idle_locked(const struct vep *ep)
{
	return ep->head == ep->tail && !ep->rd_inflight && !ep->rq_head && !ep->mw_inflight;
}

static int post_locked(struct vep *ep, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id, bool more)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	struct hdr ctl, *h = buf ? (struct hdr *)((char *)buf->data - HDR_LEN) : &ctl;
	int rc;
	h->credits = htons((uint16_t)atomic_exchange(&ep->cr.credit_ret, 0));
	h->flags = htons(buf ? 0 : HDR_CREDIT_ONLY);
	h->ctl_seen = htonl(atomic_load(&ep->ctl_rcvd));
	memset(&wr, 0, sizeof(wr));
	sge.addr = (uintptr_t)h;
	sge.length = HDR_LEN + len;
	sge.lkey = buf ? buf->mr->lkey : 0;
	wr.wr_id = (ep->seq_head + ring_used(ep)) << WRID_SEQ_SHIFT;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htonl(imm);
	if (sge.length <= ep->max_inline)
		wr.send_flags |= IBV_SEND_INLINE;
	/* selective signalling: a signalled completion retires every earlier
	 * send of the QP; signal every sig_every, when nothing follows, and
	 * before the ring could fill */
	if (!more || ep->unsignaled + 1 >= ep->sig_every || ring_used(ep) + 2 > ep->ring_mask) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		ep->unsignaled = 0;
	} else {
		ep->unsignaled++;
	}
	rc = ibv_post_send(ep->qp, &wr, &bad);
	TRACE("verbs: post qpn %u len %u credits %u ret %u ctl %d rc %d", ep->qpn, len, ep->credits, ntohs(h->credits),
	      !buf, rc);
	if (rc) {
		atomic_fetch_add(&ep->cr.credit_ret, ntohs(h->credits));
		return err_pos(rc);
	}
	ep->ring[ep->tail & ep->ring_mask] = (struct sent){ .buf = buf, .wr_id = wr_id };
	ep->tail++;
	if (buf)
		ep->credits--;
	else
		ep->ctl_sent++;
	return 0;
}

/* Graceful close: once every send accepted before vrpc_ep_close() has been
 * acknowledged (and every read and window operation has completed), the
 * DREQ goes out; both sides then see DISCONNECTED. A healthy endpoint cannot
 * be torn down while its lock is held, so the id is valid.
 * The DREQ waits for rdma_cm's ESTABLISHED too: a server may close on the
 * client's first message, which can arrive before the RTU, and rdma_cm drops a
 * disconnect in that state (REP sent), leaving both sides waiting forever. */
static void close_progress_locked(struct vep *ep)
{
	if (ep->state == S_CLOSING && ep->cm_up && !ep->disc_sent && !ep->wq_head && sq_idle_locked(ep) && ep->id) {
		ep->disc_sent = true;
		rdma_disconnect(ep->id);
	}
}

/* The credit clock (credit_watchdog, ep->lock): runs while sends wait with
 * no credit left (not while they wait for send-queue room); fresh: credits
 * just came, so a wait that goes on starts again from now. */
static void wait_clock_locked(struct vep *ep, bool fresh)
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

static bool can_post_data(const struct vep *ep) { return ep->credits >= 1 && ring_used(ep) < ep->ring_mask; }

static void pump_locked(struct vep *ep)
{
	if (ep->state != S_OPEN && ep->state != S_CLOSING)
		return;
	while (ep->wq_head && can_post_data(ep)) {
		struct vrpc_buf *b = ep->wq_head;
		bool more = b->next && ep->credits > 1;
		if (post_locked(ep, b, b->len, (uint32_t)b->priv[1], b->priv[0], more))
			return;
		ep->wq_head = b->next;
		if (!ep->wq_head)
			ep->wq_tail = NULL;
		ep->nwait--;
	}
	if (ep->wq_head || atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
		wait_clock_locked(ep, false);
}

/* A credit-only message, on the last credit if need be. */
static void send_credit_locked(struct vep *ep)
{
	if ((ep->state != S_OPEN && ep->state != S_CLOSING) || !atomic_load(&ep->cr.credit_ret))
		return;
	pump_locked(ep); /* queued data carries the credits if it can go */
	if (!atomic_load(&ep->cr.credit_ret) || ep->ctl_sent - ep->peer_ctl_seen >= CTL_RESV ||
	    ring_used(ep) >= ep->ring_mask)
		return;
	if (post_locked(ep, NULL, 0, 0, 0, false))
		vrpc_tp_log("verbs: cannot send a credit update");
	else
		ep->pending_ctl_min = 0;
}

/* ---- endpoint failure and teardown -------------------------------------------------- */

static void todo_add(struct vep *ep)
{
	struct vcq *cq = ep->cq;
	pthread_mutex_lock(&cq->lock);
	if (!ep->in_todo) {
		ep->in_todo = true;
		ep->tnext = cq->todo;
		cq->todo = ep;
	}
	pthread_mutex_unlock(&cq->lock);
	wake(cq->evfd);
}

/* ep->lock held, ep not dead: mark it dead with status, QP to error. */
static void dead_locked(struct vep *ep, int status)
{
	ep->state = S_DEAD;
	ep->status = status;
	if (ep->qp) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
		ibv_modify_qp(ep->qp, &a, IBV_QP_STATE);
	}
	pthread_cond_broadcast(&ep->cond);
}

/* Fails the endpoint once (any thread but the CM thread's teardown): QP to
 * error so posted sends flush; the poller flushes the queued ones. ep->lock
 * held; true when it did (the caller then logs and calls todo_add). */
static bool fail_locked(struct vep *ep, int status, const char *fmt, va_list ap)
{
	if (ep->state == S_DEAD)
		return false;
	vsnprintf(ep->why, sizeof(ep->why), fmt, ap);
	dead_locked(ep, status);
	return true;
}

static void failed(struct vep *ep, int status)
{
	/* accepted ones too: the server's operator hears of half-open peers */
	if (status && status != -ECANCELED && (ep->reported || ep->lst))
		vrpc_tp_log("verbs: connection %s failed: %s", ep->base.peer_uri, ep->why);
	todo_add(ep);
}

/* ep_fail and ep_fail_cm: fails ep once, by_cm recording that the verdict
 * is the CM's; when it did, logs and hands ep to the poller. */
static void ep_fail_va(struct vep *ep, bool by_cm, int status, const char *fmt, va_list ap)
{
	bool did;
	pthread_mutex_lock(&ep->lock);
	did = fail_locked(ep, status, fmt, ap);
	if (did && by_cm)
		ep->by_cm = true;
	pthread_mutex_unlock(&ep->lock);
	if (did)
		failed(ep, status);
}

static void ep_fail(struct vep *ep, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ep_fail(struct vep *ep, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ep_fail_va(ep, false, status, fmt, ap);
	va_end(ap);
}

/* The rdma_cm DISCONNECTED event's verdict (CM thread). It may come before
 * the poller has seen completions that tell more (an RDMA READ refused, our
 * sends never acknowledged): final_status settles it once they are polled. */
static void ep_fail_cm(struct vep *ep, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ep_fail_cm(struct vep *ep, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ep_fail_va(ep, true, status, fmt, ap);
	va_end(ap);
}

/* Fails the endpoint only while it is still in `state` (a deadline that a
 * state change has made moot is ignored). */
static void ep_fail_in(struct vep *ep, enum ep_state state, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void ep_fail_in(struct vep *ep, enum ep_state state, int status, const char *fmt, ...)
{
	va_list ap;
	bool did = false;
	pthread_mutex_lock(&ep->lock);
	if (ep->state == state) {
		va_start(ap, fmt);
		did = fail_locked(ep, status, fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&ep->lock);
	if (did)
		failed(ep, status);
}

/* ---- deadlines (CM thread) ----------------------------------------------------------
 * A peer that vanishes mid-handshake (after CONNECT_REQUEST, before
 * ESTABLISHED) or mid-close (never drains our sends, never answers the DREQ)
 * would hold an endpoint forever: rdma_cm's own retries may take minutes or
 * never end. Such endpoints sit on tp->watch with a deadline (accept:
 * connect_timeout_ms, close: idle_timeout_ms); the CM thread fails them with
 * -ETIMEDOUT once it passes, and what is left flushes. */

static uint64_t ms_from_now(uint32_t ms) { return vrpc_tp_now_ns() + (uint64_t)ms * 1000000u; }

static void watch_add(struct vep *ep, uint64_t deadline_ns)
{
	struct vtp *tp = ep->tp;
	pthread_mutex_lock(&tp->lock);
	ep->deadline_ns = deadline_ns;
	if (!ep->watched) {
		ep->watched = true;
		ep->dnext = tp->watch;
		tp->watch = ep;
	}
	pthread_mutex_unlock(&tp->lock);
	wake(tp->wakefd); /* the CM thread's sleep may end before the deadline */
}

/* tp->lock held. */
static void watch_del_locked(struct vtp *tp, struct vep *ep)
{
	if (!ep->watched)
		return;
	for (struct vep **pp = &tp->watch; *pp; pp = &(*pp)->dnext)
		if (*pp == ep) {
			*pp = ep->dnext;
			break;
		}
	ep->watched = false;
}

/* CM thread: fails the endpoints whose deadline passed; returns the ms until
 * the next deadline (at most cap). Endpoints are only torn down (and freed
 * later) on this thread, so the expired ones stay valid while failed. */
static int watch_scan(struct vtp *tp, int cap)
{
	uint64_t now = vrpc_tp_now_ns(), next = now + (uint64_t)cap * 1000000u;
	struct vep *expired = NULL;
	pthread_mutex_lock(&tp->lock);
	for (struct vep **pp = &tp->watch; *pp;) {
		struct vep *ep = *pp;
		if (ep->deadline_ns <= now) {
			*pp = ep->dnext;
			ep->watched = false;
			ep->xnext = expired;
			expired = ep;
		} else {
			if (ep->deadline_ns < next)
				next = ep->deadline_ns;
			pp = &ep->dnext;
		}
	}
	pthread_mutex_unlock(&tp->lock);
	for (struct vep *ep = expired; ep; ep = ep->xnext) {
		ep_fail_in(ep, S_ACCEPTING, -ETIMEDOUT, "accept handshake not completed within %u ms",
			   ep->tp->base.attr.connect_timeout_ms);
		ep_fail_in(ep, S_CLOSING, -ETIMEDOUT,
			   "peer did not complete the graceful close within the idle timeout (%u ms)",
			   ep->tp->base.attr.idle_timeout_ms);
	}
	return (int)((next - now + 999999u) / 1000000u);
}

/* ---- QP ------------------------------------------------------------------------------ */

static int qp_create(struct vep *ep)
{
	struct vtp *tp = ep->tp;
	static const uint32_t inl[] = { 256, 128, 64, 16 };
	struct ibv_qp_init_attr ia;
	int err = -EINVAL;
	for (size_t i = 0; i < sizeof(inl) / sizeof(inl[0]); i++) {
		memset(&ia, 0, sizeof(ia));
		ia.send_cq = ep->cq->cq;
		ia.recv_cq = ep->cq->cq;
		ia.srq = ep->cq->srq;
		ia.qp_type = IBV_QPT_RC;
		ia.qp_context = ep; /* names it in asynchronous events */
		/* sends, read chunks and window operations share the send queue */
		ia.cap.max_send_wr = ep->ring_mask + 1 + tp->rd_window + MW_SLOTS;
		ia.cap.max_send_sge = 1;
		ia.cap.max_inline_data = inl[i];
		ep->qp = ibv_create_qp(tp->pd, &ia);
		if (ep->qp)
			break;
		err = err_errno();
		if (err != -EINVAL)
			break;
	}
	if (!ep->qp) {
		vrpc_tp_log("verbs: ibv_create_qp: %s (credit-only messages need inline data)", strerror(-err));
		return err;
	}
	ep->qpn = ep->qp->qp_num;
	ep->max_inline = ia.cap.max_inline_data;
	ep->rd_window = tp->rd_window;
	pthread_mutex_lock(&ep->cq->lock);
	for (uint32_t i = ep->qpn & ep->cq->map_mask;; i = (i + 1) & ep->cq->map_mask)
		if (!ep->cq->map[i]) {
			ep->cq->map[i] = ep;
			break;
		}
	pthread_mutex_unlock(&ep->cq->lock);
	return 0;
}

static void map_del(struct vcq *cq, struct vep *ep)
{
	uint32_t i = ep->qpn & cq->map_mask, j;
	while (cq->map[i] && cq->map[i] != ep)
		i = (i + 1) & cq->map_mask;
	if (!cq->map[i])
		return;
	cq->map[i] = NULL;
	for (j = (i + 1) & cq->map_mask; cq->map[j]; j = (j + 1) & cq->map_mask) {
		struct vep *e = cq->map[j];
		uint32_t k;
		cq->map[j] = NULL;
		for (k = e->qpn & cq->map_mask; cq->map[k]; k = (k + 1) & cq->map_mask)
			;
		cq->map[k] = e;
	}
}

static struct vep *map_get(struct vcq *cq, uint32_t qpn)
{
	for (uint32_t i = qpn & cq->map_mask;; i = (i + 1) & cq->map_mask) {
		if (!cq->map[i])
			return NULL;
		if (cq->map[i]->qpn == qpn)
			return cq->map[i];
	}
}

static int qp_modify(struct vep *ep, enum ibv_qp_state state)
{
	const struct qp_cfg *cfg = &ep->tp->cfg;
	struct ibv_qp_attr a;
	int mask = 0;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	if (rdma_init_qp_attr(ep->id, &a, &mask))
		return err_errno();
	if (state == IBV_QPS_INIT) {
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
		mask |= IBV_QP_ACCESS_FLAGS;
	} else if (state == IBV_QPS_RTR) {
		if (cfg->gid_index >= 0)
			a.ah_attr.grh.sgid_index = (uint8_t)cfg->gid_index;
	} else if (state == IBV_QPS_RTS) {
		if (cfg->ack_timeout)
			a.timeout = cfg->ack_timeout;
		else if (a.timeout < 14)
			a.timeout = 14;
		a.retry_cnt = cfg->retry_cnt;
		a.rnr_retry = cfg->rnr_retry;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
		TRACE("verbs: qpn %u RTS timeout %u retry %u rd_atomic %u", ep->qpn, a.timeout, a.retry_cnt,
		      a.max_rd_atomic);
	}
	return err_pos(ibv_modify_qp(ep->qp, &a, mask));
}

static void hello_fill(const struct vtp *tp, struct hello *h, uint32_t credits)
{
	memset(h, 0, sizeof(*h));
	h->magic = htonl(HELLO_MAGIC);
	h->version = htons(tp->cfg.proto_version);
	h->credits = htons((uint16_t)credits);
	h->eager_size = htonl(tp->base.attr.eager_size);
}

static int hello_check(const struct vtp *tp, const void *data, uint8_t len, char *why, size_t n)
{
	struct hello h;
	if (!data || len < sizeof(h)) {
		snprintf(why, n, "no verbrpc hello in the connect data");
		return -EPROTO;
	}
	memcpy(&h, data, sizeof(h));
	if (ntohl(h.magic) != HELLO_MAGIC) {
		snprintf(why, n, "peer is not verbrpc");
		return -EPROTO;
	}
	if (ntohs(h.version) != tp->cfg.proto_version) {
		snprintf(why, n, "protocol version %u not supported (speaks %u)", ntohs(h.version), tp->cfg.proto_version);
		return -EPROTO;
	}
	if (ntohs(h.credits) < MIN_RESV) {
		snprintf(why, n, "initial credits %u, at least %u needed", ntohs(h.credits), MIN_RESV);
		return -EPROTO;
	}
	if (ntohl(h.eager_size) < VRPC_EAGER_MIN) {
		snprintf(why, n, "eager size %u below the minimum %u", ntohl(h.eager_size), VRPC_EAGER_MIN);
		return -EPROTO;
	}
	return 0;
}

static void ep_set_peer(struct vep *ep, const void *data)
{
	struct hello h;
	uint32_t e;
	memcpy(&h, data, sizeof(h));
	ep->credits = ntohs(h.credits);
	e = ntohl(h.eager_size);
	ep->base.eager = e < ep->tp->base.attr.eager_size ? e : ep->tp->base.attr.eager_size;
	ep->sig_every = ep->tp->base.attr.credits / 4 ? ep->tp->base.attr.credits / 4 : 1;
}

static void conn_param(struct vep *ep, struct rdma_conn_param *p, struct hello *h)
{
	hello_fill(ep->tp, h, MIN_RESV);
	memset(p, 0, sizeof(*p));
	p->private_data = h;
	p->private_data_len = sizeof(*h);
	p->retry_count = ep->tp->cfg.retry_cnt;
	p->rnr_retry_count = ep->tp->cfg.rnr_retry;
	/* RDMA READ depth both ways, as much as the device allows (librdmacm
	 * clamps these two values to it). With 0/0, the default, a READ never
	 * completes and never fails: it hangs. */
	p->responder_resources = RDMA_MAX_RESP_RES;
	p->initiator_depth = RDMA_MAX_INIT_DEPTH;
	p->qp_num = ep->qpn;
	p->srq = 1;
}

/* The READs this side may have outstanding to the peer, from its connect or
 * accept (event data is from the receiver's point of view): the window is
 * clamped to it. A peer that grants none (it asked rdma_cm for no responder
 * resources) would let every READ hang, so reads to it fail at once. */
static void ep_set_read_depth(struct vep *ep, const struct rdma_conn_param *pc)
{
	pthread_mutex_lock(&ep->lock);
	if (pc->initiator_depth < ep->rd_window)
		ep->rd_window = pc->initiator_depth;
	pthread_mutex_unlock(&ep->lock);
	TRACE("verbs: %s read depth: peer allows %u, window %u", ep->base.peer_uri, pc->initiator_depth,
	      ep->rd_window);
}

static void send_reject(struct rdma_cm_id *id, const struct vtp *tp, int code, const char *why)
{
	struct rejectmsg r;
	memset(&r, 0, sizeof(r));
	r.magic = htonl(HELLO_MAGIC);
	r.version = htons(tp->cfg.proto_version);
	r.code = htons((uint16_t)-code);
	snprintf(r.why, sizeof(r.why), "%.*s", (int)sizeof(r.why) - 1, why); /* cut to fit */
	rdma_reject(id, &r, sizeof(r));
}

static int reject_reason(const struct rdma_cm_event *ev, char *why, size_t n)
{
	struct rejectmsg r;
	if (ev->param.conn.private_data && ev->param.conn.private_data_len >= sizeof(r)) {
		memcpy(&r, ev->param.conn.private_data, sizeof(r));
		if (ntohl(r.magic) == HELLO_MAGIC) {
			r.why[sizeof(r.why) - 1] = 0;
			snprintf(why, n, "refused by the server: %s", r.why);
			return ntohs(r.code) == EPROTO ? -EPROTO : -ECONNREFUSED;
		}
	}
	if (ev->status == 8) /* IB_CM_REJ_INVALID_SERVICE_ID */
		snprintf(why, n, "connection refused: no listener on that port");
	else
		snprintf(why, n, "connection rejected (rdma_cm status %d)", ev->status);
	return -ECONNREFUSED;
}

/* ---- reads and windows: queue helpers (ep->lock) ------------------------------------------- */

static void rq_push(struct vep *ep, struct rjob *j)
{
	j->next = NULL;
	j->queued = true;
	if (ep->rq_tail)
		ep->rq_tail->next = j;
	else
		ep->rq_head = j;
	ep->rq_tail = j;
}

static struct rjob *rq_pop(struct vep *ep)
{
	struct rjob *j = ep->rq_head;
	if (j) {
		ep->rq_head = j->next;
		if (!ep->rq_head)
			ep->rq_tail = NULL;
		j->queued = false;
	}
	return j;
}

/* Rare (a failed job): a scan of the queue. */
static void rq_remove(struct vep *ep, struct rjob *j)
{
	struct rjob *prev = NULL;
	for (struct rjob *x = ep->rq_head; x; prev = x, x = x->next)
		if (x == j) {
			if (prev)
				prev->next = j->next;
			else
				ep->rq_head = j->next;
			if (ep->rq_tail == j)
				ep->rq_tail = prev;
			j->queued = false;
			return;
		}
}

/* A READ that never completes and never fails (e.g. a peer that left its
 * QP in error, as rxe does when a window is invalidated while a READ
 * response is being sent) would hold the read forever: the next completion
 * of a busy read window is due within the idle timeout (ep->lock). */
static void rd_deadline_update(struct vep *ep)
{
	uint64_t old = atomic_load(&ep->rd_deadline), d = 0;
	if (ep->rd_inflight)
		d = vrpc_tp_now_ns() + (uint64_t)ep->tp->base.attr.idle_timeout_ms * 1000000ull;
	atomic_store(&ep->rd_deadline, d);
	if (!old && d)
		atomic_fetch_add(&ep->cq->reading, 1);
	else if (old && !d)
		atomic_fetch_sub(&ep->cq->reading, 1);
}

/* The chunk for the next READs (see READ_CHUNK_BULK; ep->lock). A message
 * is taken for a small one once it has stayed unmatched from one call to a
 * call SMALL_AGE_NS later; calls come with every read started and every
 * chunk completed, so while reading at most a chunk's time later. */
static uint32_t read_chunk_locked(struct vep *ep)
{
	const struct vtp *tp = ep->tp;
	uint64_t now;
	if (tp->rd_chunk_bulk <= tp->rd_chunk)
		return tp->rd_chunk;
	now = vrpc_tp_now_ns();
	if (!ep->rd_unmatched) {
		ep->rd_unmatched_ns = 0;
	} else if (!ep->rd_unmatched_ns) {
		ep->rd_unmatched_ns = now;
	} else if (now - ep->rd_unmatched_ns >= SMALL_AGE_NS) {
		if (now >= ep->rd_small_until)
			TRACE("verbs: qpn %u reads in small chunks: %d message(s) unmatched for %llu us", ep->qpn,
			      ep->rd_unmatched, (unsigned long long)(now - ep->rd_unmatched_ns) / 1000);
		ep->rd_small_until = now + SMALL_HOLD_NS;
		ep->rd_unmatched = 0;
		ep->rd_unmatched_ns = 0;
	}
	return now < ep->rd_small_until ? tp->rd_chunk : tp->rd_chunk_bulk;
}

/* Posts read chunks while the endpoint's window has room, one chunk per job
 * in turn, so a short read waits behind at most one chunk of a long one.
 * A failed post (the send queue is sized for the window, so it means the QP
 * is broken) gives the job its error and is returned, for the caller to fail
 * the endpoint outside the lock; the job completes when that flushes it. */
static int pump_reads_locked(struct vep *ep)
{
	uint32_t chunk;
	if (ep->state != S_OPEN && ep->state != S_CLOSING)
		return 0;
	if (!ep->rq_head || ep->rd_inflight >= ep->rd_window)
		return 0;
	chunk = read_chunk_locked(ep);
	while (ep->rq_head && ep->rd_inflight < ep->rd_window) {
		struct rjob *j = ep->rq_head;
		struct ibv_send_wr wr, *bad;
		struct ibv_sge sge;
		uint32_t n = j->len - j->posted < chunk ? j->len - j->posted : chunk;
		int rc;
		memset(&wr, 0, sizeof(wr));
		sge.addr = (uintptr_t)(j->laddr + j->posted);
		sge.length = n;
		sge.lkey = j->lkey;
		wr.wr_id = (uintptr_t)j | WRID_READ;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_RDMA_READ;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = j->raddr + j->posted;
		wr.wr.rdma.rkey = j->rkey;
		rc = err_pos(ibv_post_send(ep->qp, &wr, &bad));
		if (rc) {
			if (!j->status)
				j->status = rc;
			return rc;
		}
		TRACE("verbs: read post qpn %u len %u inflight %u", ep->qpn, n, ep->rd_inflight + 1);
		rq_pop(ep);
		j->posted += n;
		j->outstanding++;
		if (!ep->rd_inflight++)
			rd_deadline_update(ep);
		if (j->posted < j->len)
			rq_push(ep, j);
	}
	return 0;
}

/* A window of a dead endpoint is deallocated before its revoke completes:
 * once the caller has the REVOKE, no window holds its MR (so the MR can be
 * deregistered) and none ever will. */
static void mw_kill(struct vmw *w)
{
	w->state = MW_DEAD;
	if (w->mw) {
		ibv_dealloc_mw(w->mw);
		w->mw = NULL;
	}
}

/* Poller, endpoint dead: jobs not yet fully posted end here (those with
 * chunks in flight end with the last of those, in on_read), revokes of dead
 * windows complete -ECANCELED. */
static void flush_reads_revokes_locked(struct vcq *cq, struct vep *ep)
{
	struct rjob *j;
	while ((j = rq_pop(ep))) {
		if (!j->status) {
			j->status = -ECANCELED;
			ep->flushed++; /* a read cut off: see final_status */
		}
		if (!j->outstanding) {
			stage(cq, VRPC_WC_READ, ep, j->buf, j->wr_id, j->status, 0, 0);
			j->next = ep->rfree;
			ep->rfree = j;
		}
	}
	for (struct vmw *w = ep->grants; w; w = w->next)
		if (w->state == MW_CANCEL) {
			mw_kill(w);
			stage(cq, VRPC_WC_REVOKE, ep, NULL, w->wr_id, -ECANCELED, 0, 0);
		}
}

/* CM thread, before the QP is destroyed: a bound window holds its QP, so
 * every window of the endpoint is deallocated first (never reused: its
 * state on a dead QP is not worth reasoning about). The records stay on the
 * grant list until DISCONNECTED, so that a revoke still finds its key. */
static void grants_dealloc(struct vep *ep)
{
	pthread_mutex_lock(&ep->lock);
	for (struct vmw *w = ep->grants; w; w = w->next)
		if (w->mw) {
			ibv_dealloc_mw(w->mw);
			w->mw = NULL;
		}
	pthread_mutex_unlock(&ep->lock);
}

static struct vmw *mw_get(struct vtp *tp, int *err)
{
	struct vmw *w;
	pthread_mutex_lock(&tp->mw_lock);
	w = tp->mw_free;
	if (w)
		tp->mw_free = w->next;
	pthread_mutex_unlock(&tp->mw_lock);
	if (w)
		return w;
	w = calloc(1, sizeof(*w));
	if (!w) {
		*err = -ENOMEM;
		return NULL;
	}
	w->mw = ibv_alloc_mw(tp->pd, IBV_MW_TYPE_2);
	if (!w->mw) {
		*err = err_errno();
		vrpc_tp_log("verbs: ibv_alloc_mw: %s", strerror(-*err));
		free(w);
		return NULL;
	}
	w->rkey = w->mw->rkey;
	return w;
}

static void mw_put(struct vtp *tp, struct vmw *w)
{
	pthread_mutex_lock(&tp->mw_lock);
	w->next = tp->mw_free;
	tp->mw_free = w;
	pthread_mutex_unlock(&tp->mw_lock);
}

/* ---- endpoint objects ------------------------------------------------------------------ */

static struct vep *ep_new(struct vtp *tp, struct vcq *cq, void *user, uint32_t max_queued)
{
	struct vep *ep = calloc(1, sizeof(*ep));
	uint32_t nj;
	if (!ep)
		return NULL;
	vrpc_ep_base_init(&ep->base, &tp->base, &cq->base, user, 2);
	ep->kind = K_EP;
	ep->tp = tp;
	ep->cq = cq;
	pthread_mutex_init(&ep->lock, NULL);
	pthread_cond_init(&ep->cond, NULL);
	ep->ring_mask = pow2(2 * tp->base.attr.credits + 8) - 1;
	ep->ring = calloc(ep->ring_mask + 1, sizeof(*ep->ring));
	ep->max_queued = max_queued ? max_queued : tp->base.attr.max_queued;
	vrpc_credit_ep_init(&ep->cr, MIN_RESV, tp->base.attr.credits);
	nj = 2 * tp->base.attr.credits < 8 ? 8 : 2 * tp->base.attr.credits;
	ep->rjobs = calloc(nj, sizeof(*ep->rjobs));
	if (!ep->ring || !ep->rjobs) {
		free(ep->ring);
		free(ep->rjobs);
		free(ep);
		return NULL;
	}
	ep->rd_njobs = nj;
	for (uint32_t i = 0; i < nj; i++) {
		ep->rjobs[i].next = ep->rfree;
		ep->rfree = &ep->rjobs[i];
	}
	return ep;
}

static void verbs_ep_free(struct vrpc_ep *base)
{
	struct vep *ep = container_of(base, struct vep, base);
	for (struct vmw *w = ep->grants, *n; w; w = n) {
		n = w->next;
		if (w->mw)
			ibv_dealloc_mw(w->mw);
		free(w);
	}
	free(ep->rjobs);
	free(ep->ring);
	pthread_mutex_destroy(&ep->lock);
	pthread_cond_destroy(&ep->cond);
	free(ep);
}

/* CM thread: QP and id go; then the poller reports DISCONNECTED. */
static void ep_teardown(struct vep *ep)
{
	pthread_mutex_lock(&ep->tp->lock);
	watch_del_locked(ep->tp, ep);
	pthread_mutex_unlock(&ep->tp->lock);
	if (ep->qp) {
		grants_dealloc(ep);
		pthread_mutex_lock(&ep->cq->lock);
		map_del(ep->cq, ep);
		pthread_mutex_unlock(&ep->cq->lock);
		ibv_destroy_qp(ep->qp);
		ep->qp = NULL;
	}
	if (ep->id) {
		rdma_disconnect(ep->id);
		rdma_destroy_id(ep->id);
		ep->id = NULL;
	}
	ep->torn = true;
	todo_add(ep);
}

/* ---- the poller's side ----------------------------------------------------------------- */

static void reap_request(struct vep *ep)
{
	struct vtp *tp = ep->tp;
	pthread_mutex_lock(&tp->lock);
	ep->anext = tp->reap;
	tp->reap = ep;
	pthread_mutex_unlock(&tp->lock);
	wake(tp->wakefd);
}

/* Poller, torn endpoint: its DISCONNECTED status. Every completion of ep has
 * been polled by now (it was torn down only once its send queue was idle and
 * a poll then found the CQ empty), so this is where the rdma_cm thread's
 * verdict, which may have raced the completions, is corrected:
 *  - an error completion (a READ refused, retries exceeded) is the cause of
 *    the peer's disconnect, or of the QP error found there: it wins;
 *  - a disconnect that cut off work of ours (a send the peer never
 *    acknowledged, a vrpc_ep_read not finished, a window operation) lost
 *    the connection, it did not close it: -ECONNRESET. Our own close never
 *    does that (its DREQ waits for our send queue to be idle); the peer's
 *    does when it closes while we read its memory or send (a verbs close
 *    cannot wait for either), and so does a peer process that died (the
 *    kernel disconnects its ids like a close). Sends still queued for
 *    credits flush without this: they never left (as on TCP).
 * A local failure (timeouts, protocol errors, CQ destroyed) keeps its own. */
static int final_status(struct vep *ep)
{
	int st = vrpc_tp_disc_status(ep->status, ep->by_cm, ep->wc_err, ep->flushed != 0);
	if (st == ep->status)
		return st;
	if (st == ep->wc_err) {
		snprintf(ep->why, sizeof(ep->why), "%s before the peer disconnected", strerror(-ep->wc_err));
		if (ep->reported)
			vrpc_tp_log("verbs: connection %s failed: %s", ep->base.peer_uri, ep->why);
	} else {
		snprintf(ep->why, sizeof(ep->why), "peer disconnected while our operations were in flight");
		if (ep->reported)
			vrpc_tp_log("verbs: connection %s lost: %s", ep->base.peer_uri, ep->why);
	}
	return st;
}

/* A completion's error, for final_status (poller). */
static void note_wc(struct vep *ep, enum ibv_wc_status st, int err)
{
	if (st == IBV_WC_WR_FLUSH_ERR)
		ep->flushed++;
	else if (st != IBV_WC_SUCCESS && !ep->wc_err)
		ep->wc_err = err;
}

/* Poller: work on an endpoint handed over by another thread. */
static void service_ep(struct vcq *cq, struct vep *ep)
{
	struct vrpc_buf *wq;
	bool drained;
	if (ep->torn) {
		struct vmw *dead;
		pthread_mutex_lock(&ep->lock);
		flush_reads_revokes_locked(cq, ep);
		ep->gone = true; /* revokes from now on: -ENOTCONN, the keys died with the QP */
		dead = ep->grants;
		ep->grants = NULL;
		pthread_mutex_unlock(&ep->lock);
		for (struct vmw *n; dead; dead = n) {
			n = dead->next;
			if (dead->mw)
				ibv_dealloc_mw(dead->mw);
			free(dead);
		}
		if (ep->counted) {
			/* promised buffers nobody can consume any more */
			vrpc_credit_ep_release(&cq->cr, &ep->cr);
			ep->counted = false;
		}
		if (ep->nconns) {
			atomic_fetch_sub(&ep->nconns->n, 1);
			vconns_unref(ep->nconns);
			ep->nconns = NULL;
		}
		pthread_mutex_lock(&ep->lock); /* against wait_clock_locked */
		if (atomic_load_explicit(&ep->wait_ns, memory_order_relaxed)) {
			atomic_store_explicit(&ep->wait_ns, 0, memory_order_relaxed);
			atomic_fetch_sub(&cq->waiting, 1);
		}
		pthread_mutex_unlock(&ep->lock);
		vrpc_credit_hungry_remove(&cq->cr, &ep->cr);
		if (ep->reported) {
			stage(cq, VRPC_WC_DISCONNECTED, ep, NULL, 0, final_status(ep), 0, 0);
		} else {
			vrpc_ep_unref(&ep->base);
			vrpc_ep_unref(&ep->base);
		}
		return;
	}
	pthread_mutex_lock(&ep->lock);
	if (!ep->reported && (ep->state == S_OPEN || ep->state == S_CLOSING) && ep->lst) {
		ep->reported = true;
		stage(cq, VRPC_WC_ACCEPTED, ep, NULL, ep->accept_user, 0, 0, 0);
	}
	if (ep->state == S_DEAD) {
		wq = ep->wq_head;
		ep->wq_head = ep->wq_tail = NULL;
		ep->nwait = 0;
		flush_reads_revokes_locked(cq, ep);
	} else {
		wq = NULL;
	}
	drained = ep->state == S_DEAD && sq_idle_locked(ep);
	pthread_mutex_unlock(&ep->lock);
	for (struct vrpc_buf *b = wq, *n; b; b = n) {
		n = b->next;
		stage(cq, VRPC_WC_SEND, ep, b, b->priv[0], -ECANCELED, 0, 0);
	}
	if (drained && !ep->reaping) {
		/* receives of it may still sit in the CQ: tear down (after which
		 * DISCONNECTED is its last completion) once a poll found it empty */
		ep->reaping = true;
		ep->wnext = cq->reap_wait;
		cq->reap_wait = ep;
	}
}

static void reap_waiting(struct vcq *cq)
{
	while (cq->reap_wait) {
		struct vep *ep = cq->reap_wait;
		cq->reap_wait = ep->wnext;
		reap_request(ep);
	}
}

static void take_todo(struct vcq *cq)
{
	struct vep *ep, *next;
	pthread_mutex_lock(&cq->lock);
	ep = cq->todo;
	cq->todo = NULL;
	for (struct vep *e = ep; e; e = e->tnext)
		e->in_todo = false;
	pthread_mutex_unlock(&cq->lock);
	for (; ep; ep = next) {
		next = ep->tnext;
		service_ep(cq, ep);
	}
}

static int wc_status(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS: return 0;
	case IBV_WC_WR_FLUSH_ERR: return -ECANCELED;
	case IBV_WC_RETRY_EXC_ERR: return -ETIMEDOUT;
	case IBV_WC_RNR_RETRY_EXC_ERR: return -ENOBUFS;
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_LOC_PROT_ERR: return -EACCES;
	default: return -EIO;
	}
}

static void on_send(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
	int st = wc_status(wc->status);
	uint64_t seq = wc->wr_id >> WRID_SEQ_SHIFT;
	bool drained = false;
	TRACE("verbs: send wc qpn %u status %d seq %llu", wc->qp_num, wc->status, (unsigned long long)seq);
	note_wc(ep, wc->status, st);
	if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
		ep_fail(ep, st, "send failed: %s", ibv_wc_status_str(wc->status));
	for (;;) {
		struct sent s;
		bool hit;
		pthread_mutex_lock(&ep->lock);
		if (ep->head == ep->tail) {
			pthread_mutex_unlock(&ep->lock);
			break;
		}
		s = ep->ring[ep->head & ep->ring_mask];
		hit = ep->seq_head == seq;
		ep->head++;
		ep->seq_head++;
		if (hit) {
			pump_locked(ep);
			close_progress_locked(ep);
			drained = ep->state == S_DEAD && sq_idle_locked(ep);
		}
		pthread_mutex_unlock(&ep->lock);
		/* the ones before this completion finished unsignalled */
		if (s.buf)
			stage(cq, VRPC_WC_SEND, ep, s.buf, s.wr_id, hit ? st : 0, s.buf->len, 0);
		if (hit)
			break;
	}
	if (drained)
		todo_add(ep);
}

static void on_recv(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
	struct vrpc_buf *b = (struct vrpc_buf *)(uintptr_t)(wc->wr_id & ~WRID_RECV);
	struct hdr *h = (struct hdr *)((char *)b->data - HDR_LEN);
	uint32_t c;
	TRACE("verbs: recv qpn %u status %d len %u ep %p", wc->qp_num, wc->status, wc->byte_len, (void *)ep);
	pthread_mutex_lock(&cq->lock);
	posted_unlink(cq, b);
	pthread_mutex_unlock(&cq->lock);
	atomic_fetch_sub(&cq->cr.posted, 1);
	if (wc->status != IBV_WC_SUCCESS || !ep || ep->torn || wc->byte_len < HDR_LEN) {
		if (ep && wc->status == IBV_WC_SUCCESS) {
			ep_fail(ep, -EPROTO, "runt message");
		} else if (ep && !ep->torn && wc->status != IBV_WC_WR_FLUSH_ERR) {
			/* e.g. a message longer than the buffer: the QP is in error */
			note_wc(ep, wc->status, wc_status(wc->status));
			ep_fail(ep, wc_status(wc->status), "receive failed: %s", ibv_wc_status_str(wc->status));
		}
		if (ep && ep->counted && ep->cr.granted)
			ep->cr.granted--; /* its promise was used */
		b->len = 0;
		stage(cq, VRPC_WC_RECV, NULL, b, b->priv[0], -ECANCELED, 0, 0);
		return;
	}
	if (!ep->reported && ep->lst) {
		ep->reported = true;
		stage(cq, VRPC_WC_ACCEPTED, ep, NULL, ep->accept_user, 0, 0, 0);
	}
	c = ntohs(h->credits);
	if (ntohs(h->flags) & HDR_CREDIT_ONLY) {
		/* it used one of the connection's CTL_RESV buffers: repost it at
		 * once, and count it before anything we send carries the count */
		b->next = NULL;
		pthread_mutex_lock(&cq->lock);
		if (post_srq(cq, b) == 0)
			atomic_fetch_add(&cq->cr.posted, 1);
		pthread_mutex_unlock(&cq->lock);
		atomic_fetch_add(&ep->ctl_rcvd, 1);
	}
	pthread_mutex_lock(&ep->lock);
	if (ep->state == S_ACCEPTING)
		ep->state = S_OPEN; /* data before ESTABLISHED: the client is connected */
	ep->credits += c;
	ep->peer_ctl_seen = ntohl(h->ctl_seen);
	if (!(ntohs(h->flags) & HDR_CREDIT_ONLY) && (ep->rq_head || ep->rd_inflight) && ep->rd_unmatched < (1 << 20))
		ep->rd_unmatched++; /* while reading: see READ_CHUNK_BULK */
	pump_locked(ep);
	if (c && atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
		wait_clock_locked(ep, true); /* the peer returns credits: a new clock */
	close_progress_locked(ep);
	if (ep->pending_ctl_min)
		send_credit_locked(ep); /* one may have waited for the peer's confirmation */
	pthread_mutex_unlock(&ep->lock);
	if (ntohs(h->flags) & HDR_CREDIT_ONLY)
		return;
	vrpc_credit_consumed(&cq->cr, &ep->cr);
	b->len = wc->byte_len - HDR_LEN;
	stage(cq, VRPC_WC_RECV, ep, b, b->priv[0], 0, b->len,
	      (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0);
	vrpc_credit_distribute(&cq->cr, credit_send);
}

/* A READ chunk completed: the job completes with its last chunk, carrying its
 * first error; the window's freed slot goes to the next job in turn. */
static void on_read(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
	struct rjob *j = (struct rjob *)(uintptr_t)(wc->wr_id & ~WRID_TAG);
	int st = wc_status(wc->status), prc;
	bool drained;
	TRACE("verbs: read wc qpn %u status %d", wc->qp_num, wc->status);
	note_wc(ep, wc->status, st);
	pthread_mutex_lock(&ep->lock);
	j->outstanding--;
	ep->rd_inflight--;
	rd_deadline_update(ep);
	if (st && !j->status)
		j->status = st;
	if (j->status && j->queued)
		rq_remove(ep, j);
	if (!j->queued && !j->outstanding) {
		stage(cq, VRPC_WC_READ, ep, j->buf, j->wr_id, j->status, j->len, 0);
		j->next = ep->rfree;
		ep->rfree = j;
	}
	prc = pump_reads_locked(ep);
	close_progress_locked(ep);
	drained = ep->state == S_DEAD && sq_idle_locked(ep);
	pthread_mutex_unlock(&ep->lock);
	/* a refused READ leaves both QPs in error: the connection is lost */
	if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
		ep_fail(ep, st, "RDMA READ failed: %s", ibv_wc_status_str(wc->status));
	else if (wc->status == IBV_WC_WR_FLUSH_ERR)
		ep_fail(ep, -ECONNRESET, "queue pair in error"); /* no-op when ep failed first */
	else if (prc)
		ep_fail(ep, prc, "cannot post an RDMA READ: %s", strerror(-prc));
	if (drained)
		todo_add(ep);
}

/* A BIND_MW or LOCAL_INV completed (a window's completions arrive in the
 * order they were posted: its bind's first). */
static void on_mw(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
	struct vmw *w = (struct vmw *)(uintptr_t)(wc->wr_id & ~WRID_TAG);
	const char *what = "memory window bind";
	bool put = false, drained;
	TRACE("verbs: mw wc qpn %u status %d", wc->qp_num, wc->status);
	note_wc(ep, wc->status, wc_status(wc->status));
	pthread_mutex_lock(&ep->lock);
	ep->mw_inflight--;
	if (w->bind_pending) {
		w->bind_pending = false;
	} else {
		/* vrpc_ep_revoke's LOCAL_INV: done, the window can serve again;
		 * flushed, the key dies with the QP and the window with it */
		what = "memory window invalidation";
		if (wc->status == IBV_WC_SUCCESS) {
			for (struct vmw **pp = &ep->grants; *pp; pp = &(*pp)->next)
				if (*pp == w) {
					*pp = w->next;
					break;
				}
			put = true;
		} else {
			mw_kill(w);
		}
		stage(cq, VRPC_WC_REVOKE, ep, NULL, w->wr_id, put ? 0 : -ECANCELED, 0, 0);
	}
	close_progress_locked(ep);
	drained = ep->state == S_DEAD && sq_idle_locked(ep);
	pthread_mutex_unlock(&ep->lock);
	if (put)
		mw_put(ep->tp, w);
	if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
		ep_fail(ep, wc_status(wc->status), "%s failed: %s", what, ibv_wc_status_str(wc->status));
	else if (wc->status == IBV_WC_WR_FLUSH_ERR)
		ep_fail(ep, -ECONNRESET, "queue pair in error"); /* no-op when ep failed first */
	if (drained)
		todo_add(ep);
}

static void on_wc(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
	switch (wc->wr_id & WRID_TAG) {
	case WRID_RECV:
		on_recv(cq, ep, wc);
		break;
	case WRID_READ:
		if (ep)
			on_read(cq, ep, wc);
		break;
	case WRID_MW:
		if (ep)
			on_mw(cq, ep, wc);
		break;
	default:
		if (ep)
			on_send(cq, ep, wc);
		break;
	}
}

/* Poller: fails endpoints whose read window made no progress within the
 * idle timeout (-ETIMEDOUT; their reads then flush). At most every 200 ms,
 * and only while some endpoint of the CQ reads. */
static void read_watchdog(struct vcq *cq)
{
	struct vep *late[16];
	unsigned n = 0;
	uint64_t now;
	if (!atomic_load(&cq->reading))
		return;
	now = vrpc_tp_now_ns();
	if (now < cq->rd_scan_ns)
		return;
	cq->rd_scan_ns = now + 200000000ull;
	pthread_mutex_lock(&cq->lock);
	for (uint32_t i = 0; i <= cq->map_mask && n < 16; i++) {
		uint64_t d = cq->map[i] ? atomic_load(&cq->map[i]->rd_deadline) : 0;
		if (d && d < now)
			late[n++] = cq->map[i];
	}
	pthread_mutex_unlock(&cq->lock);
	/* still allocated: only this poller releases them, after DISCONNECTED */
	for (unsigned i = 0; i < n; i++) {
		struct vep *ep = late[i];
		pthread_mutex_lock(&ep->lock);
		for (uint32_t k = 0; k < ep->rd_njobs; k++)
			if (ep->rjobs[k].outstanding && !ep->rjobs[k].status)
				ep->rjobs[k].status = -ETIMEDOUT; /* their flush says why */
		pthread_mutex_unlock(&ep->lock);
		ep_fail(ep, -ETIMEDOUT, "RDMA READ made no progress for %u ms", ep->tp->base.attr.idle_timeout_ms);
	}
}

/* Rule 6 of transport.h's credits: a peer that returns no credits while our
 * sends wait for them loses the connection after credit_timeout_ms. Every
 * 200 ms, and only while some endpoint of the CQ waits. */
static void credit_watchdog(struct vcq *cq)
{
	struct vep *late[16];
	unsigned n = 0;
	uint64_t now, lim;
	if (!atomic_load(&cq->waiting))
		return;
	now = vrpc_tp_now_ns();
	if (now < cq->cw_scan_ns)
		return;
	cq->cw_scan_ns = now + 200000000ull;
	lim = (uint64_t)cq->tp->base.attr.credit_timeout_ms * 1000000ull;
	pthread_mutex_lock(&cq->lock);
	for (uint32_t i = 0; i <= cq->map_mask && n < 16; i++) {
		uint64_t w = cq->map[i] ? atomic_load(&cq->map[i]->wait_ns) : 0;
		if (vrpc_credit_wait_expired(w, now, lim))
			late[n++] = cq->map[i];
	}
	pthread_mutex_unlock(&cq->lock);
	/* still allocated: only this poller releases them, after DISCONNECTED */
	for (unsigned i = 0; i < n; i++)
		ep_fail(late[i], -ETIMEDOUT, "peer returned no credits for %u ms", cq->tp->base.attr.credit_timeout_ms);
}

/* The CQ whose poller this thread is (set by its first poll): a receive
 * reposted from the CQ's own callback needs no wake-up, the poller
 * distributes credits on its next poll anyway. */
static _Thread_local struct vcq *tl_poller_of;

static int verbs_cq_poll(struct vrpc_cq *base, struct vrpc_wc *wc, unsigned max)
{
	struct vcq *cq = container_of(base, struct vcq, base);
	unsigned n = 0;
	tl_poller_of = cq;
	if (cq->st_head == cq->st_tail) {
		take_todo(cq);
		if (atomic_load(&cq->bound)) {
			int k = ibv_poll_cq(cq->cq, 32, cq->wcs);
			for (int i = 0; i < k; i++) {
				struct ibv_wc *w = &cq->wcs[i];
				struct vep *ep;
				pthread_mutex_lock(&cq->lock);
				ep = map_get(cq, w->qp_num);
				pthread_mutex_unlock(&cq->lock);
				on_wc(cq, ep, w);
			}
			/* the CQ was found empty: the drained endpoints have
			 * nothing left in it. Only after the completions just
			 * polled were handled: the teardown unmaps the QP, and a
			 * message that arrived just before the peer's DREQ must
			 * still find its endpoint (else it would be dropped as
			 * flushed: the lost last message of a graceful close) */
			if (k >= 0 && k < 32)
				reap_waiting(cq);
		} else {
			reap_waiting(cq);
		}
		vrpc_credit_distribute(&cq->cr, credit_send);
		read_watchdog(cq);
		credit_watchdog(cq);
	}
	while (n < max && cq->st_head != cq->st_tail)
		wc[n++] = cq->stage[cq->st_head++ % cq->st_cap];
	if (n)
		atomic_store(&cq->sleeping, 0);
	return (int)n;
}

static void verbs_cq_arm(struct vrpc_cq *base)
{
	struct vcq *cq = container_of(base, struct vcq, base);
	atomic_store(&cq->sleeping, 1);
	if (atomic_load(&cq->bound))
		ibv_req_notify_cq(cq->cq, 0);
}

static void verbs_cq_wait(struct vrpc_cq *base, int timeout_ms)
{
	struct vcq *cq = container_of(base, struct vcq, base);
	struct pollfd p[2] = { { .fd = cq->evfd, .events = POLLIN }, { .fd = -1, .events = POLLIN } };
	if (!atomic_load(&cq->sleeping))
		return;
	if (atomic_load(&cq->bound))
		p[1].fd = cq->chan->fd;
	poll(p, 2, timeout_ms < 0 || timeout_ms > 200 ? 200 : timeout_ms);
	if (p[0].revents & POLLIN)
		drain(cq->evfd);
	if (p[1].revents & POLLIN) {
		struct ibv_cq *ecq;
		void *ectx;
		if (ibv_get_cq_event(cq->chan, &ecq, &ectx) == 0 && ++cq->unacked >= ACK_BATCH) {
			ibv_ack_cq_events(cq->cq, cq->unacked);
			cq->unacked = 0;
		}
	}
	atomic_store(&cq->sleeping, 0);
}

static void verbs_cq_kick(struct vrpc_cq *base)
{
	struct vcq *cq = container_of(base, struct vcq, base);
	wake(cq->evfd);
}

/* Poller, at stop: fail every endpoint, wait for their teardown, then flush
 * the SRQ's buffers by destroying it (receives complete -ECANCELED). */
static void verbs_cq_flush(struct vrpc_cq *base)
{
	struct vcq *cq = container_of(base, struct vcq, base);
	uint64_t deadline = vrpc_tp_now_ns() + 10000000000ull;
	for (;;) {
		bool any = false;
		pthread_mutex_lock(&cq->lock);
		for (uint32_t i = 0; i <= cq->map_mask; i++)
			if (cq->map[i]) {
				struct vep *ep = cq->map[i];
				pthread_mutex_unlock(&cq->lock);
				ep_fail(ep, -ECANCELED, "completion queue destroyed");
				pthread_mutex_lock(&cq->lock);
				any = true;
			}
		pthread_mutex_unlock(&cq->lock);
		if (!any || vrpc_tp_now_ns() > deadline)
			break;
		/* let the flushes come in and the CM thread tear down */
		if (atomic_load(&cq->bound)) {
			int k = ibv_poll_cq(cq->cq, 32, cq->wcs);
			for (int i = 0; i < k; i++) {
				struct vep *ep;
				pthread_mutex_lock(&cq->lock);
				ep = map_get(cq, cq->wcs[i].qp_num);
				pthread_mutex_unlock(&cq->lock);
				on_wc(cq, ep, &cq->wcs[i]);
			}
		}
		take_todo(cq);
		reap_waiting(cq);
		usleep(1000);
	}
	take_todo(cq);
	/* receives still posted: no QP uses the SRQ any more, so they never
	 * complete on their own; each is handed back once, flushed */
	pthread_mutex_lock(&cq->lock);
	for (struct vrpc_buf *b = cq->posted_list, *n; b; b = n) {
		n = (struct vrpc_buf *)(uintptr_t)b->priv[3];
		b->len = 0;
		stage(cq, VRPC_WC_RECV, NULL, b, b->priv[0], -ECANCELED, 0, 0);
	}
	cq->posted_list = NULL;
	pthread_mutex_unlock(&cq->lock);
	pthread_mutex_lock(&cq->lock);
	for (struct vrpc_buf *b = cq->pend_head, *n; b; b = n) {
		n = b->next;
		b->len = 0;
		stage(cq, VRPC_WC_RECV, NULL, b, b->priv[0], -ECANCELED, 0, 0);
	}
	cq->pend_head = NULL;
	pthread_mutex_unlock(&cq->lock);
}

/* ---- CQ create/destroy, post_recv ---------------------------------------------------------- */

static void verbs_cq_destroy(struct vrpc_cq *base)
{
	struct vcq *cq = container_of(base, struct vcq, base);
	struct vtp *tp = cq->tp;
	pthread_mutex_lock(&tp->lock);
	for (struct vcq **pp = &tp->cqs; *pp; pp = &(*pp)->next)
		if (*pp == cq) {
			*pp = cq->next;
			break;
		}
	pthread_mutex_unlock(&tp->lock);
	if (cq->unacked)
		ibv_ack_cq_events(cq->cq, cq->unacked);
	if (cq->srq)
		ibv_destroy_srq(cq->srq);
	if (cq->cq)
		ibv_destroy_cq(cq->cq);
	if (cq->chan)
		ibv_destroy_comp_channel(cq->chan);
	if (cq->evfd >= 0)
		close(cq->evfd);
	free(cq->map);
	free(cq->stage);
	pthread_mutex_destroy(&cq->lock);
	free(cq);
}

static int verbs_cq_create(struct vrpc_transport *tbase, const struct vrpc_cq_attr *attr, struct vrpc_cq **out)
{
	struct vtp *tp = container_of(tbase, struct vtp, base);
	struct vcq *cq = calloc(1, sizeof(*cq));
	int rc = 0;
	if (!cq)
		return -ENOMEM;
	cq->tp = tp;
	/* a credit-only message consumes a receive: one kept per connection */
	vrpc_credit_pool_init(&cq->cr, MIN_RESV, CTL_RESV);
	cq->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	cq->max_recv = attr->max_recv;
	cq->map_mask = 8191;
	cq->map = calloc(cq->map_mask + 1, sizeof(*cq->map));
	cq->st_cap = 1024;
	cq->stage = calloc(cq->st_cap, sizeof(*cq->stage));
	pthread_mutex_init(&cq->lock, NULL);
	if (cq->evfd < 0 || !cq->map || !cq->stage) {
		verbs_cq_destroy(&cq->base);
		return -ENOMEM;
	}
	pthread_mutex_lock(&tp->lock);
	cq->next = tp->cqs;
	tp->cqs = cq;
	pthread_mutex_unlock(&tp->lock);
	if (tp->verbs) {
		pthread_mutex_lock(&tp->lock);
		rc = cq_bind(tp, cq);
		pthread_mutex_unlock(&tp->lock);
	}
	if (rc) {
		verbs_cq_destroy(&cq->base);
		return rc;
	}
	*out = &cq->base;
	return 0;
}

static int verbs_post_recv(struct vrpc_cq *base, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n)
{
	struct vcq *cq = container_of(base, struct vcq, base);
	struct vrpc_buf *list = NULL;
	int rc = 0;
	if (atomic_load(&cq->cr.posted) + (int)n > (int)cq->max_recv)
		return -ENOSPC;
	for (unsigned i = n; i-- > 0;) {
		bufs[i]->priv[0] = wr_ids ? wr_ids[i] : 0;
		bufs[i]->next = list;
		list = bufs[i];
	}
	pthread_mutex_lock(&cq->lock);
	if (atomic_load(&cq->bound)) {
		rc = post_srq(cq, list);
	} else {
		struct vrpc_buf *last = list;
		while (last->next)
			last = last->next;
		last->next = cq->pend_head;
		cq->pend_head = list;
	}
	pthread_mutex_unlock(&cq->lock);
	if (rc)
		return rc;
	atomic_fetch_add(&cq->cr.posted, (int)n);
	atomic_fetch_add(&cq->cr.avail, (int)n);
	/* the poller pays debts back; before the device is bound no endpoint
	 * can owe any, and its own callback needs no wake-up */
	if (atomic_load(&cq->bound) && tl_poller_of != cq && (cq->cr.hungry_head || atomic_load(&cq->sleeping)))
		wake(cq->evfd);
	return 0;
}

/* ---- rdma_cm events (CM thread) ---------------------------------------------------------------- */

static int ep_setup_qp(struct vep *ep, bool passive)
{
	int rc = qp_create(ep);
	if (!rc)
		rc = qp_modify(ep, IBV_QPS_INIT);
	if (!rc && passive)
		rc = qp_modify(ep, IBV_QPS_RTR);
	if (!rc && passive)
		rc = qp_modify(ep, IBV_QPS_RTS);
	return rc;
}

static void on_connect_request(struct vtp_listener *l, struct rdma_cm_event *ev)
{
	struct vtp *tp = l->tp;
	struct rdma_cm_id *id = ev->id;
	struct vcq *cq = l->cqs[l->rr++ % l->ncqs];
	struct vep *ep;
	struct rdma_conn_param p;
	struct hello h;
	char why[128];
	int rc;

	rc = hello_check(tp, ev->param.conn.private_data, ev->param.conn.private_data_len, why, sizeof(why));
	/* the first connection binds the transport to the listener's device */
	if (!rc && (tp_bind(tp, id->verbs) || !atomic_load(&cq->bound))) {
		snprintf(why, sizeof(why), "request arrived on another device");
		rc = -EXDEV;
	}
	if (!rc && l->nconns->max && atomic_fetch_add(&l->nconns->n, 1) >= l->nconns->max) {
		atomic_fetch_sub(&l->nconns->n, 1);
		snprintf(why, sizeof(why), "the listener has %u connections, its limit (max_conns)", l->nconns->max);
		rc = -ECONNREFUSED;
	} else if (!rc && !l->nconns->max) {
		atomic_fetch_add(&l->nconns->n, 1);
	}
	if (!rc && !vrpc_credit_reserve(&cq->cr)) {
		snprintf(why, sizeof(why), "no receive buffers to reserve");
		atomic_fetch_sub(&l->nconns->n, 1);
		rc = -ENOBUFS;
	}
	if (rc) {
		vrpc_tp_log("verbs: refusing a connection: %s", why);
		send_reject(id, tp, rc, why);
		id->context = NULL;
		return;
	}
	ep = ep_new(tp, cq, NULL, 0);
	if (!ep) {
		atomic_fetch_add(&cq->cr.avail, MIN_RESV + CTL_RESV);
		atomic_fetch_sub(&l->nconns->n, 1);
		send_reject(id, tp, -ENOMEM, "server out of memory");
		id->context = NULL;
		return;
	}
	ep->counted = true;
	ep->nconns = l->nconns;
	atomic_fetch_add(&l->nconns->refs, 1);
	ep->id = id;
	ep->lst = l;
	ep->accept_user = l->user;
	ep->state = S_ACCEPTING;
	id->context = &ep->kind;
	vrpc_addr_format("verbs", rdma_get_peer_addr(id), ep->base.peer_uri, sizeof(ep->base.peer_uri));
	ep_set_peer(ep, ev->param.conn.private_data);
	rc = ep_setup_qp(ep, true);
	if (!rc) {
		ep_set_read_depth(ep, &ev->param.conn);
		conn_param(ep, &p, &h);
		if (rdma_accept(id, &p))
			rc = err_errno();
	}
	if (!rc)
		watch_add(ep, ms_from_now(tp->base.attr.connect_timeout_ms));
	if (rc) {
		vrpc_tp_log("verbs: cannot accept %s: %s", ep->base.peer_uri, strerror(-rc));
		send_reject(id, tp, rc, "server could not set up a queue pair");
		ep->id = NULL;
		id->context = NULL;
		ep_fail(ep, rc, "accept failed");
	}
}

/* CM thread (which alone destroys QPs). */
static bool qp_in_error(struct vep *ep)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	return ep->qp && ibv_query_qp(ep->qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_ERR;
}

static void on_ep_event(struct vep *ep, struct rdma_cm_event *ev)
{
	struct vtp *tp = ep->tp;
	struct rdma_conn_param p;
	struct hello h;
	char why[128];
	int rc;

	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		rc = tp_bind(tp, ep->id->verbs);
		if (!rc && !atomic_load(&ep->cq->bound))
			rc = -EIO;
		if (!rc && rdma_resolve_route(ep->id, CM_TIMEOUT_MS))
			rc = err_errno();
		if (rc)
			ep_fail(ep, rc == -EXDEV ? -EHOSTUNREACH : rc, "cannot use the route's device: %s", strerror(-rc));
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		/* without a reservation the connect still goes out, so that a
		 * refusal is reported as such; an accept is then rejected here */
		ep->counted = vrpc_credit_reserve(&ep->cq->cr);
		rc = ep_setup_qp(ep, false);
		if (!rc) {
			conn_param(ep, &p, &h);
			if (rdma_connect(ep->id, &p))
				rc = err_errno();
		}
		if (rc)
			ep_fail(ep, rc, "cannot connect: %s", strerror(-rc));
		break;
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		rc = hello_check(tp, ev->param.conn.private_data, ev->param.conn.private_data_len, why, sizeof(why));
		if (!rc && !ep->counted) {
			snprintf(why, sizeof(why), "fewer than %u unpromised receive buffers on the client's CQ",
				 MIN_RESV + CTL_RESV);
			rc = -ENOBUFS;
		}
		if (rc) {
			send_reject(ep->id, tp, rc, why);
			ep_fail(ep, rc, "server's reply refused: %s", why);
			break;
		}
		pthread_mutex_lock(&ep->lock);
		ep_set_peer(ep, ev->param.conn.private_data);
		pthread_mutex_unlock(&ep->lock);
		ep_set_read_depth(ep, &ev->param.conn);
		rc = qp_modify(ep, IBV_QPS_RTR);
		if (!rc)
			rc = qp_modify(ep, IBV_QPS_RTS);
		if (!rc && rdma_establish(ep->id))
			rc = err_errno();
		if (rc) {
			ep_fail(ep, rc, "cannot complete the connection: %s", strerror(-rc));
			break;
		}
		pthread_mutex_lock(&ep->lock);
		ep->cm_up = true;
		if (ep->state == S_CONNECTING)
			ep->state = S_OPEN;
		pthread_cond_broadcast(&ep->cond);
		pthread_mutex_unlock(&ep->lock);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		pthread_mutex_lock(&ep->lock);
		ep->cm_up = true;
		if (ep->state == S_ACCEPTING || ep->state == S_CONNECTING)
			ep->state = S_OPEN;
		close_progress_locked(ep); /* a close that waited for it */
		pthread_cond_broadcast(&ep->cond);
		pthread_mutex_unlock(&ep->lock);
		if (ep->lst)
			todo_add(ep); /* the poller reports ACCEPTED */
		break;
	case RDMA_CM_EVENT_REJECTED:
		rc = reject_reason(ev, why, sizeof(why));
		ep_fail(ep, rc, "%s", why);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
		ep_fail(ep, -EHOSTUNREACH, "cannot resolve the address (ADDR_ERROR %d)", ev->status);
		break;
	case RDMA_CM_EVENT_ROUTE_ERROR:
		ep_fail(ep, -EHOSTUNREACH, "no route to the peer (ROUTE_ERROR %d)", ev->status);
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
		ep_fail(ep, ev->status == -ETIMEDOUT ? -ETIMEDOUT : -EHOSTUNREACH, "peer unreachable (status %d)",
			ev->status);
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		ep_fail(ep, -ECONNREFUSED, "connection failed (CONNECT_ERROR %d)", ev->status);
		break;
	case RDMA_CM_EVENT_DISCONNECTED: {
		bool local;
		pthread_mutex_lock(&ep->lock);
		local = ep->state == S_CLOSING;
		pthread_mutex_unlock(&ep->lock);
		/* a graceful close by either side, or a peer process that died;
		 * but a QP already in error (nothing here moves it there before
		 * ep_fail) means the connection broke first: e.g. this side
		 * refused the peer's RDMA READ (bad key or range), which sets
		 * both QPs in error and reaches this side only as the peer's
		 * disconnect */
		if (!local && qp_in_error(ep))
			ep_fail_cm(ep, -ECONNRESET,
				   "queue pair in error (an RDMA READ of the peer refused, or a transport error)");
		else
			ep_fail_cm(ep, 0, "%s", local ? "closed" : "peer disconnected");
		break;
	}
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		ep_fail(ep, -ENODEV, "RDMA device removed");
		break;
	default:
		break;
	}
}

static void handle_cm_event(struct vtp *tp, struct rdma_cm_event *ev)
{
	TRACE("verbs: cm event %s status %d", rdma_event_str(ev->event), ev->status);
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		enum obj_kind *k = ev->listen_id->context;
		struct vtp_listener *l = k ? container_of(k, struct vtp_listener, kind) : NULL;
		struct rdma_cm_id *id = ev->id;
		if (l && !l->closing) {
			on_connect_request(l, ev);
		} else {
			send_reject(id, tp, -ECONNREFUSED, "listener closing");
			id->context = NULL;
		}
		rdma_ack_cm_event(ev);
		if (!id->context)
			rdma_destroy_id(id);
		return;
	}
	if (ev->id->context && *(enum obj_kind *)ev->id->context == K_EP)
		on_ep_event(container_of((enum obj_kind *)ev->id->context, struct vep, kind), ev);
	rdma_ack_cm_event(ev);
}

/* ---- asynchronous device events (CM threads) --------------------------------------------
 * Errors the device reports outside any completion: a QP-level fatal error
 * fails that endpoint with a clear error (its work then flushes); an error of
 * a CQ or SRQ fails the endpoints using it; a fatal device error fails them
 * all; port changes and an SRQ below its limit are logged.
 * rdma_cm opens each device once per process, so every transport on a
 * device shares its one event queue: whichever transport's CM thread reads
 * an event handles it for the owner, found through the object's context
 * (QP: the endpoint, CQ and SRQ: the vcq). Each event is acknowledged once
 * handled: destroying a QP, CQ or SRQ waits for the acknowledgement of every
 * event of it that was read, so the object an event names (and its endpoint
 * or vcq) is alive while it is handled. Failing a single endpoint is safe
 * from any thread; failing many walks the owner's maps, which only the
 * owner's CM thread may do: it is asked through async_err / dev_fatal. */

static pthread_mutex_t g_tps_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vtp *g_tps; /* every transport, for device-wide events */

/* Fails every endpoint of `only`, or of every CQ when it is NULL (the
 * transport's own CM thread: the maps change only there, so they hold still
 * while cq->lock is dropped for ep_fail, which takes ep->lock, then
 * cq->lock). */
static void fail_all(struct vtp *tp, struct vcq *only, int status, const char *why)
{
	pthread_mutex_lock(&tp->lock);
	for (struct vcq *cq = tp->cqs; cq; cq = cq->next) {
		if (only && cq != only)
			continue;
		pthread_mutex_lock(&cq->lock);
		for (uint32_t i = 0; i <= cq->map_mask; i++) {
			struct vep *ep = cq->map[i];
			if (!ep)
				continue;
			pthread_mutex_unlock(&cq->lock);
			ep_fail(ep, status, "%s", why);
			pthread_mutex_lock(&cq->lock);
		}
		pthread_mutex_unlock(&cq->lock);
	}
	pthread_mutex_unlock(&tp->lock);
}

/* The owner's CM thread: failures asked for by async events. */
static void async_fail_pending(struct vtp *tp)
{
	struct vcq *failed_cqs[16];
	int st[16];
	unsigned n = 0;
	if (!atomic_exchange(&tp->async_pending, false))
		return;
	if (atomic_exchange(&tp->dev_fatal, false))
		fail_all(tp, NULL, -ENODEV, "fatal device error");
	pthread_mutex_lock(&tp->lock);
	for (struct vcq *cq = tp->cqs; cq && n < 16; cq = cq->next)
		if ((st[n] = atomic_exchange(&cq->async_err, 0)))
			failed_cqs[n++] = cq;
	pthread_mutex_unlock(&tp->lock);
	/* fail_all only compares these with the CQs still listed: one the
	 * user destroyed meanwhile is skipped, never dereferenced */
	for (unsigned i = 0; i < n; i++)
		fail_all(tp, failed_cqs[i], st[i], "completion or receive queue error reported by the device");
}

static void async_ask(struct vtp *tp)
{
	atomic_store(&tp->async_pending, true);
	wake(tp->wakefd);
}

static void on_async_event(struct ibv_context *ctx, const struct ibv_async_event *ev)
{
	const char *name = ibv_event_type_str(ev->event_type), *dev = ibv_get_device_name(ctx->device);
	struct vep *ep;
	struct vcq *cq;
	int status = -EIO;
	switch (ev->event_type) {
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_PATH_MIG_ERR:
		if (ev->event_type == IBV_EVENT_QP_ACCESS_ERR)
			status = -EACCES;
		else if (ev->event_type == IBV_EVENT_QP_REQ_ERR)
			status = -EPROTO;
		else if (ev->event_type == IBV_EVENT_PATH_MIG_ERR)
			status = -ENETUNREACH;
		ep = ev->element.qp->qp_context;
		ep_fail(ep, status, "queue pair error reported by the device: %s", name);
		break;
	case IBV_EVENT_CQ_ERR:
	case IBV_EVENT_SRQ_ERR:
		cq = ev->event_type == IBV_EVENT_CQ_ERR ? ev->element.cq->cq_context : ev->element.srq->srq_context;
		vrpc_tp_log("verbs: device %s reports %s: the connections of that completion queue fail", dev, name);
		atomic_store(&cq->async_err, -EIO);
		async_ask(cq->tp);
		break;
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		/* the device disarmed the limit: once per CQ */
		cq = ev->element.srq->srq_context;
		vrpc_tp_log("verbs: fewer than %u receive buffers left posted on a completion queue (%d now; %s): "
			    "post more, or the peers wait for credits",
			    cq->tp->cfg.srq_limit, atomic_load(&cq->cr.posted), name);
		break;
	case IBV_EVENT_DEVICE_FATAL:
		vrpc_tp_log("verbs: device %s reports a fatal error: every connection on it fails", dev);
		pthread_mutex_lock(&g_tps_lock);
		for (struct vtp *tp = g_tps; tp; tp = tp->gnext)
			if (tp->verbs == ctx) {
				atomic_store(&tp->dev_fatal, true);
				async_ask(tp);
			}
		pthread_mutex_unlock(&g_tps_lock);
		break;
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_PORT_ACTIVE:
		vrpc_tp_log("verbs: device %s port %d: %s%s", dev, ev->element.port_num, name,
			    ev->event_type == IBV_EVENT_PORT_ERR ? " (its connections fail if it stays down)" : "");
		break;
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		/* routine: rdma_cm reports establishment, a QP in error
		 * reports the rest through its completions */
		TRACE("verbs: async event %s on qpn %u", name, ev->element.qp->qp_num);
		break;
	default:
		vrpc_tp_log("verbs: device %s: asynchronous event %s", dev, name);
		break;
	}
}

static void read_async_events(struct ibv_context *ctx)
{
	struct ibv_async_event ev;
	while (ibv_get_async_event(ctx, &ev) == 0) {
		TRACE("verbs: async event %s", ibv_event_type_str(ev.event_type));
		on_async_event(ctx, &ev);
		ibv_ack_async_event(&ev);
	}
}

static void *cm_main(void *arg)
{
	struct vtp *tp = arg;
	int tmo = 500;
	while (!atomic_load(&tp->stop)) {
		struct epoll_event evs[4];
		int n = epoll_wait(tp->epfd, evs, 4, tmo);
		for (int i = 0; i < n; i++) {
			if (evs[i].data.fd == tp->ech->fd) {
				struct rdma_cm_event *ev;
				while (rdma_get_cm_event(tp->ech, &ev) == 0)
					handle_cm_event(tp, ev);
			} else if (tp->verbs && evs[i].data.fd == tp->verbs->async_fd) {
				read_async_events(tp->verbs);
			} else {
				drain(tp->wakefd);
			}
		}
		for (;;) {
			struct vep *ep;
			pthread_mutex_lock(&tp->lock);
			ep = tp->reap;
			if (ep)
				tp->reap = ep->anext;
			pthread_mutex_unlock(&tp->lock);
			if (!ep)
				break;
			ep_teardown(ep);
		}
		tmo = watch_scan(tp, 500);
		async_fail_pending(tp);
		pthread_mutex_lock(&tp->lock);
		if (tp->cmd && !tp->cmd_done) {
			void (*fn)(void *) = tp->cmd;
			void *a = tp->cmd_arg;
			pthread_mutex_unlock(&tp->lock);
			fn(a);
			pthread_mutex_lock(&tp->lock);
			tp->cmd_done = true;
			pthread_cond_broadcast(&tp->cond);
		}
		pthread_mutex_unlock(&tp->lock);
	}
	return NULL;
}

/* Runs fn(arg) on the CM thread, so that it never races event handling. */
static void run_on_cm(struct vtp *tp, void (*fn)(void *), void *arg)
{
	pthread_mutex_lock(&tp->lock);
	while (tp->cmd)
		pthread_cond_wait(&tp->cond, &tp->lock);
	tp->cmd = fn;
	tp->cmd_arg = arg;
	tp->cmd_done = false;
	wake(tp->wakefd);
	while (!tp->cmd_done)
		pthread_cond_wait(&tp->cond, &tp->lock);
	tp->cmd = NULL;
	pthread_cond_broadcast(&tp->cond);
	pthread_mutex_unlock(&tp->lock);
}

/* ---- listeners ------------------------------------------------------------------------------------ */

static void listener_close_cm(void *arg)
{
	struct vtp_listener *l = arg;
	l->closing = true;
	if (l->id)
		rdma_destroy_id(l->id);
	l->id = NULL;
}

static void verbs_listener_destroy(struct vrpc_listener *base)
{
	struct vtp_listener *l = container_of(base, struct vtp_listener, base);
	run_on_cm(l->tp, listener_close_cm, l);
	/* handshakes still in progress keep l->lst until ESTABLISHED; they are
	 * reported (ACCEPTED) without it being dereferenced */
	vconns_unref(l->nconns);
	free(l->cqs);
	free(l);
}

/* An address rdma_cm cannot place on a device: no device at all, or not on
 * an RDMA netdev (the same sentences as `verbrpc doctor`). */
static void addr_advice(const struct vrpc_addr *a)
{
	char ip[INET6_ADDRSTRLEN + 8] = "?", why[256];
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	struct vrpc_verbs_diag d = { .addr = ip };
	if (l)
		ibv_free_device_list(l);
	if (a->ss.ss_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)&a->ss)->sin_addr, ip, sizeof(ip));
	else if (a->ss.ss_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)&a->ss)->sin6_addr, ip, sizeof(ip));
	vrpc_tp_log("verbs: %s", vrpc_verbs_advice(n > 0 ? VRPC_VP_NOT_RDMA_ADDR : VRPC_VP_NO_DEVICE, &d, why,
						       sizeof(why)));
}

static int verbs_listen(struct vrpc_transport *tbase, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
			struct vrpc_listener **out)
{
	struct vtp *tp = container_of(tbase, struct vtp, base);
	struct vtp_listener *l = calloc(1, sizeof(*l));
	int rc;
	if (!l)
		return -ENOMEM;
	l->base.tp = tbase;
	l->kind = K_LISTENER;
	l->tp = tp;
	l->user = attr->user;
	l->ncqs = attr->ncqs;
	l->cqs = calloc(attr->ncqs, sizeof(*l->cqs));
	l->nconns = calloc(1, sizeof(*l->nconns));
	if (!l->cqs || !l->nconns) {
		free(l->cqs);
		free(l->nconns);
		free(l);
		return -ENOMEM;
	}
	atomic_init(&l->nconns->refs, 1);
	l->nconns->max = attr->max_conns;
	for (unsigned i = 0; i < attr->ncqs; i++)
		l->cqs[i] = container_of(attr->cqs[i], struct vcq, base);
	if (rdma_create_id(tp->ech, &l->id, &l->kind, RDMA_PS_TCP)) {
		rc = err_errno();
		goto err;
	}
	if (rdma_bind_addr(l->id, (struct sockaddr *)&addr->ss)) {
		rc = err_errno();
		goto err;
	}
	if (!l->id->verbs) {
		vrpc_tp_log("verbs: cannot listen on a wildcard address: name the device's IP");
		rc = -EADDRNOTAVAIL;
		goto err;
	}
	if (rdma_listen(l->id, attr->backlog > 0 ? attr->backlog : 1024)) {
		rc = err_errno();
		goto err;
	}
	vrpc_addr_format("verbs", rdma_get_local_addr(l->id), l->base.uri, sizeof(l->base.uri));
	*out = &l->base;
	return 0;
err:
	if (rc == -ENODEV) {
		rc = -EADDRNOTAVAIL; /* the address is not on an RDMA device */
		addr_advice(addr);
	}
	if (l->id)
		rdma_destroy_id(l->id);
	vconns_unref(l->nconns);
	free(l->cqs);
	free(l);
	return rc;
}

/* ---- endpoints --------------------------------------------------------------------------------------- */

static int verbs_connect(struct vrpc_transport *tbase, const struct vrpc_addr *dst, const struct vrpc_addr *src,
			 const struct vrpc_ep_attr *attr, struct vrpc_ep **out)
{
	struct vtp *tp = container_of(tbase, struct vtp, base);
	struct vcq *cq = container_of(attr->cq, struct vcq, base);
	uint32_t tmo = attr->timeout_ms ? attr->timeout_ms : tbase->attr.connect_timeout_ms;
	struct timespec dl;
	struct vep *ep;
	int rc;

	ep = ep_new(tp, cq, attr->user, attr->max_queued);
	if (!ep)
		return -ENOMEM;
	ep->state = S_CONNECTING;
	vrpc_addr_format("verbs", (const struct sockaddr *)&dst->ss, ep->base.peer_uri, sizeof(ep->base.peer_uri));
	if (rdma_create_id(tp->ech, &ep->id, &ep->kind, RDMA_PS_TCP)) {
		rc = err_errno();
		verbs_ep_free(&ep->base);
		return rc;
	}
	if (rdma_resolve_addr(ep->id, src ? (struct sockaddr *)&src->ss : NULL, (struct sockaddr *)&dst->ss,
			      CM_TIMEOUT_MS)) {
		rc = err_errno();
		rdma_destroy_id(ep->id);
		verbs_ep_free(&ep->base);
		if (rc == -ENODEV)
			addr_advice(src ? src : dst);
		return rc == -ENODEV ? -EHOSTUNREACH : rc;
	}
	vrpc_clock_real_ts(&dl); /* ep->cond has the default clock */
	dl.tv_sec += tmo / 1000;
	dl.tv_nsec += (long)(tmo % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&ep->lock);
	while (ep->state == S_CONNECTING)
		if (pthread_cond_timedwait(&ep->cond, &ep->lock, &dl) == ETIMEDOUT)
			break;
	rc = ep->state == S_OPEN ? 0 : ep->state == S_DEAD ? (ep->status ? ep->status : -ECONNRESET) : -ETIMEDOUT;
	pthread_mutex_unlock(&ep->lock);
	if (rc) {
		if (rc == -ETIMEDOUT)
			ep_fail(ep, rc, "connect timed out");
		if (rc == -EPROTO) /* a mismatch someone must fix: say why, here too */
			vrpc_tp_log("verbs: connect to %s failed: %s", ep->base.peer_uri, ep->why);
		TRACE("verbs: connect to %s failed: %s", ep->base.peer_uri, ep->why);
		return rc; /* never handed out: no DISCONNECTED; the teardown frees it */
	}
	ep->reported = true;
	*out = &ep->base;
	return 0;
}

static int verbs_send(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id,
		      unsigned flags)
{
	struct vep *ep = container_of(base, struct vep, base);
	int rc = 0;
	(void)flags;
	buf->len = len;
	pthread_mutex_lock(&ep->lock);
	if (ep->state != S_OPEN) {
		rc = -ENOTCONN;
	} else if (!ep->wq_head && can_post_data(ep)) {
		rc = post_locked(ep, buf, len, imm, wr_id, false);
	} else if (ep->nwait >= ep->max_queued) {
		rc = -EAGAIN;
	} else {
		buf->priv[0] = wr_id;
		buf->priv[1] = imm;
		buf->next = NULL;
		if (ep->wq_tail)
			ep->wq_tail->next = buf;
		else
			ep->wq_head = buf;
		ep->wq_tail = buf;
		ep->nwait++;
		if (!atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
			wait_clock_locked(ep, false);
		vrpc_tp_note_credit_wait(base);
	}
	TRACE("verbs: send qpn %u len %u state %d credits %u nwait %u rc %d", ep->qpn, len, ep->state, ep->credits,
	      ep->nwait, rc);
	pthread_mutex_unlock(&ep->lock);
	return rc;
}

static int verbs_read(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr,
		      uint32_t rkey, uint64_t wr_id)
{
	struct vep *ep = container_of(base, struct vep, base);
	int rc = 0, prc = 0;
	pthread_mutex_lock(&ep->lock);
	if (ep->state != S_OPEN) {
		rc = -ENOTCONN;
	} else if (!ep->rd_window) {
		rc = -EOPNOTSUPP;
	} else if (!ep->rfree) {
		rc = -ENOSPC;
	} else {
		struct rjob *j = ep->rfree;
		ep->rfree = j->next;
		j->buf = buf;
		j->wr_id = wr_id;
		j->raddr = raddr;
		j->laddr = (char *)buf->data + off;
		j->lkey = buf->mr->lkey;
		j->rkey = rkey;
		j->len = len;
		j->posted = j->outstanding = 0;
		j->status = 0;
		if (ep->rd_unmatched)
			ep->rd_unmatched--; /* the descriptor's message, presumably */
		rq_push(ep, j);
		prc = pump_reads_locked(ep);
	}
	pthread_mutex_unlock(&ep->lock);
	if (rc == -EOPNOTSUPP)
		vrpc_tp_log("verbs: %s allows no RDMA READ from it (it connected with no responder resources)",
			    base->peer_uri);
	if (prc)
		ep_fail(ep, prc, "cannot post an RDMA READ: %s", strerror(-prc));
	return rc;
}

static int verbs_grant(struct vrpc_ep *base, struct vrpc_mr *mbase, const void *addr, uint32_t len, uint32_t *rkey)
{
	struct vep *ep = container_of(base, struct vep, base);
	struct vmr *m = container_of(mbase, struct vmr, base);
	struct vtp *tp = ep->tp;
	struct vmw *w;
	uint32_t key = 0;
	int rc = 0;
	if (!tp->mw_ok) {
		if (!atomic_exchange(&tp->mw_warned, true))
			vrpc_tp_log("verbs: device %s has no type-2B memory windows: vrpc_ep_grant (large messages) "
				    "is not supported on it",
				    ibv_get_device_name(tp->verbs->device));
		return -ENOTSUP;
	}
	if (!m->mr)
		return -EINVAL;
	w = mw_get(tp, &rc);
	if (!w)
		return rc;
	pthread_mutex_lock(&ep->lock);
	if (ep->state != S_OPEN) {
		rc = -ENOTCONN;
	} else if (ep->mw_inflight >= MW_SLOTS) {
		rc = -ENOSPC;
	} else {
		struct ibv_send_wr wr, *bad;
		key = ibv_inc_rkey(w->rkey); /* a stale descriptor's key never matches a later bind */
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = (uintptr_t)w | WRID_MW;
		wr.opcode = IBV_WR_BIND_MW;
		/* signalled, so that its send-queue slot is known to be free */
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.bind_mw.mw = w->mw;
		wr.bind_mw.rkey = key;
		wr.bind_mw.bind_info.mr = m->mr;
		wr.bind_mw.bind_info.addr = (uintptr_t)addr;
		wr.bind_mw.bind_info.length = len;
		wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
		rc = err_pos(ibv_post_send(ep->qp, &wr, &bad));
		if (!rc) {
			/* the provider names the window by its current key */
			w->mw->rkey = key;
			w->rkey = key;
			w->state = MW_LIVE;
			w->bind_pending = true;
			w->next = ep->grants;
			ep->grants = w;
			ep->mw_inflight++;
		}
	}
	pthread_mutex_unlock(&ep->lock);
	if (rc) {
		mw_put(tp, w);
		return rc;
	}
	*rkey = key;
	return 0;
}

static int verbs_revoke(struct vrpc_ep *base, uint32_t rkey, uint64_t wr_id)
{
	struct vep *ep = container_of(base, struct vep, base);
	struct vmw *w = NULL;
	bool later = false;
	int rc = 0;
	pthread_mutex_lock(&ep->lock);
	if (!ep->gone)
		for (w = ep->grants; w && !(w->rkey == rkey && w->state == MW_LIVE); w = w->next)
			;
	if (ep->gone) {
		rc = -ENOTCONN;
	} else if (!w) {
		rc = -EINVAL;
	} else if (ep->state == S_DEAD) {
		/* the key is dead with the QP: the poller says so */
		w->state = MW_CANCEL;
		w->wr_id = wr_id;
		later = true;
	} else if (ep->mw_inflight >= MW_SLOTS) {
		rc = -ENOSPC;
	} else {
		struct ibv_send_wr wr, *bad;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = (uintptr_t)w | WRID_MW;
		wr.opcode = IBV_WR_LOCAL_INV;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.invalidate_rkey = rkey;
		rc = err_pos(ibv_post_send(ep->qp, &wr, &bad));
		if (!rc) {
			w->state = MW_INV;
			w->wr_id = wr_id;
			ep->mw_inflight++;
		}
	}
	pthread_mutex_unlock(&ep->lock);
	if (later)
		todo_add(ep);
	return rc;
}

static int verbs_close(struct vrpc_ep *base)
{
	struct vep *ep = container_of(base, struct vep, base);
	int rc = 0;
	pthread_mutex_lock(&ep->lock);
	if (ep->state == S_OPEN || ep->state == S_ACCEPTING) {
		ep->state = S_CLOSING;
		close_progress_locked(ep); /* else after the last send's completion */
	} else {
		rc = -ENOTCONN;
	}
	pthread_mutex_unlock(&ep->lock);
	if (!rc)
		watch_add(ep, ms_from_now(ep->tp->base.attr.idle_timeout_ms));
	return rc;
}

/* Abortive close: fail now (QP to error, so what was posted flushes; the
 * poller flushes what is queued and tears down, rdma_disconnect without
 * waiting for the peer). Not logged: the caller says why. */
static int verbs_abort(struct vrpc_ep *base, int status)
{
	struct vep *ep = container_of(base, struct vep, base);
	bool did = false;
	pthread_mutex_lock(&ep->lock);
	if (ep->state != S_DEAD) {
		snprintf(ep->why, sizeof(ep->why), "aborted by the user");
		dead_locked(ep, status);
		did = true;
	}
	pthread_mutex_unlock(&ep->lock);
	if (!did)
		return -ENOTCONN;
	todo_add(ep);
	return 0;
}

/* ---- memory --------------------------------------------------------------------------------------------- */

static int verbs_mr_reg(struct vrpc_transport *tbase, void *addr, size_t len, unsigned access, struct vrpc_mr **out)
{
	struct vtp *tp = container_of(tbase, struct vtp, base);
	struct vmr *m = calloc(1, sizeof(*m));
	int rc = 0;
	if (!m)
		return -ENOMEM;
	m->base.tp = tbase;
	m->base.addr = addr;
	m->base.len = len;
	m->base.access = access;
	pthread_mutex_lock(&tp->lock);
	if (tp->verbs)
		rc = mr_register(tp, m);
	if (!rc) {
		m->next = tp->mrs;
		tp->mrs = m;
	}
	pthread_mutex_unlock(&tp->lock);
	if (rc) {
		free(m);
		return rc;
	}
	*out = &m->base;
	return 0;
}

static void verbs_mr_dereg(struct vrpc_mr *base)
{
	struct vmr *m = container_of(base, struct vmr, base);
	struct vtp *tp = container_of(base->tp, struct vtp, base);
	pthread_mutex_lock(&tp->lock);
	for (struct vmr **pp = &tp->mrs; *pp; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	pthread_mutex_unlock(&tp->lock);
	if (m->mr)
		ibv_dereg_mr(m->mr);
	free(m);
}

/* ---- transport ------------------------------------------------------------------------------------------ */

static void verbs_tp_destroy(struct vrpc_transport *tbase)
{
	struct vtp *tp = container_of(tbase, struct vtp, base);
	pthread_mutex_lock(&g_tps_lock);
	for (struct vtp **pp = &g_tps; *pp; pp = &(*pp)->gnext)
		if (*pp == tp) {
			*pp = tp->gnext;
			break;
		}
	pthread_mutex_unlock(&g_tps_lock);
	if (tp->cm_started) {
		for (int i = 0; i < 400; i++) {
			pthread_mutex_lock(&tp->lock);
			bool busy = tp->reap != NULL;
			pthread_mutex_unlock(&tp->lock);
			if (!busy)
				break;
			usleep(5000);
		}
		atomic_store(&tp->stop, true);
		wake(tp->wakefd);
		pthread_join(tp->cm, NULL);
	}
	for (struct vmw *w = tp->mw_free, *n; w; w = n) {
		n = w->next;
		ibv_dealloc_mw(w->mw);
		free(w);
	}
	if (tp->pd)
		ibv_dealloc_pd(tp->pd);
	if (tp->ech)
		rdma_destroy_event_channel(tp->ech);
	if (tp->epfd >= 0)
		close(tp->epfd);
	if (tp->wakefd >= 0)
		close(tp->wakefd);
	pthread_mutex_destroy(&tp->lock);
	pthread_mutex_destroy(&tp->mw_lock);
	pthread_cond_destroy(&tp->cond);
	free(tp);
}

static int verbs_tp_create(const struct vrpc_transport_attr *attr, struct vrpc_transport **out)
{
	struct vtp *tp = calloc(1, sizeof(*tp));
	struct epoll_event ee = { .events = EPOLLIN };
	int rc;
	if (!tp)
		return -ENOMEM;
	tp->base.attr = *attr;
	tp->base.headroom = HDR_LEN;
	qp_cfg_init(&tp->cfg);
	tp->epfd = tp->wakefd = -1;
	pthread_mutex_init(&tp->lock, NULL);
	pthread_mutex_init(&tp->mw_lock, NULL);
	pthread_cond_init(&tp->cond, NULL);
	tp->ech = rdma_create_event_channel();
	if (!tp->ech) {
		struct vrpc_verbs_diag d = { .err = errno };
		char why[256];
		rc = -ENODEV;
		vrpc_tp_log("verbs: %s", vrpc_verbs_advice(VRPC_VP_NO_RDMA, &d, why, sizeof(why)));
		goto err;
	}
	fcntl(tp->ech->fd, F_SETFL, fcntl(tp->ech->fd, F_GETFL) | O_NONBLOCK);
	tp->epfd = epoll_create1(EPOLL_CLOEXEC);
	tp->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (tp->epfd < 0 || tp->wakefd < 0) {
		rc = err_errno();
		goto err;
	}
	ee.data.fd = tp->ech->fd;
	epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->ech->fd, &ee);
	ee.data.fd = tp->wakefd;
	epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->wakefd, &ee);
	rc = -pthread_create(&tp->cm, NULL, cm_main, tp);
	if (rc)
		goto err;
	tp->cm_started = true;
	pthread_mutex_lock(&g_tps_lock);
	tp->gnext = g_tps;
	g_tps = tp;
	pthread_mutex_unlock(&g_tps_lock);
	*out = &tp->base;
	return 0;
err:
	verbs_tp_destroy(&tp->base);
	return rc;
}

static int verbs_probe(void)
{
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (l)
		ibv_free_device_list(l);
	return l && n > 0 ? 0 : -ENODEV;
}

const struct vrpc_transport_ops vrpc_verbs_ops = {
	VRPC_TP_OPS_HEAD,
	.name = "verbs",
	.caps = VRPC_TP_CAP_REMOTE_READ | VRPC_TP_CAP_PINS_MEMORY,
	.probe = verbs_probe,
	.tp_create = verbs_tp_create,
	.tp_destroy = verbs_tp_destroy,
	.mr_reg = verbs_mr_reg,
	.mr_dereg = verbs_mr_dereg,
	.cq_create = verbs_cq_create,
	.cq_destroy = verbs_cq_destroy,
	.cq_poll = verbs_cq_poll,
	.cq_arm = verbs_cq_arm,
	.cq_wait = verbs_cq_wait,
	.cq_kick = verbs_cq_kick,
	.cq_flush = verbs_cq_flush,
	.post_recv = verbs_post_recv,
	.listen = verbs_listen,
	.listener_destroy = verbs_listener_destroy,
	.connect = verbs_connect,
	.send = verbs_send,
	.read = verbs_read,
	.grant = verbs_grant,
	.revoke = verbs_revoke,
	.close = verbs_close,
	.abort = verbs_abort,
	.ep_free = verbs_ep_free,
};
