/* The verbs engine: device context (PD, send slab, rdma_cm thread), completion
 * queues (CQ + SRQ + receive slab + one poller thread each), and RC endpoints
 * with credit-based flow control. See verbs.h for the contracts.
 *
 * Threads: the CM thread of a context handles every rdma_cm event and the
 * device's async events, and tears endpoints down. A CQ's poller is the only
 * thread that polls its CQ; it runs the completion callback. Senders post from
 * their own thread under the endpoint lock.
 *
 * Wire: every message is a SEND_WITH_IMM of [struct hdr][payload]; the header
 * returns credits in-band. A peer may post a data message only while it holds
 * at least two credits; the last credit is kept for a credit-only message,
 * which returns every credit owed. So neither side can be left waiting for
 * credits the other cannot send, and a receive buffer is always posted for
 * each message in flight: RNR cannot happen (the tests run with rnr_retry 0). */
#define _GNU_SOURCE
#include "transport/verbs/verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define HELLO_MAGIC 0x56525043u /* "VRPC" */
#define RECV_BATCH 16
#define POLL_BATCH 32
#define ACK_BATCH 64
#define BACKLOG 1024
#define CM_TIMEOUT_MS 2000
/* receive wr_ids carry this bit: error completions have no valid opcode */
#define WRID_RECV (1ull << 63)

/* ---- small helpers --------------------------------------------------------- */

static void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void vlog(const char *fmt, ...)
{
	va_list ap;
	char line[512];
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "verbrpc verbs: %s\n", line);
}

/* The -1 + errno and NULL + errno conventions. */
static int err_errno(void) { return errno > 0 ? -errno : -EIO; }

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void addr_str(const struct sockaddr *sa, char *s, size_t n)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)sa;
		inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
		port = ntohs(a->sin_port);
		snprintf(s, n, "%s:%u", ip, port);
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)sa;
		inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
		port = ntohs(a->sin6_port);
		snprintf(s, n, "[%s]:%u", ip, port);
	} else {
		snprintf(s, n, "?");
	}
}

static socklen_t sa_len(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static long env_long(const char *name, long dflt)
{
	const char *v = getenv(name);
	char *end;
	long x;
	if (!v || !*v)
		return dflt;
	x = strtol(v, &end, 0);
	return *end ? dflt : x;
}

void vrpc_verbs_cfg_default(struct vrpc_verbs_cfg *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->eager_size = 4096;
	cfg->credits = 16;
	cfg->recv_bufs = 4096;
	cfg->send_bufs = 1024;
	cfg->rnr_retry = (uint8_t)env_long("VRPC_VERBS_RNR_RETRY", 7);
	cfg->ack_timeout = 14;
	cfg->retry_cnt = 7;
	cfg->gid_index = (int)env_long("VRPC_VERBS_GID_INDEX", -1);
	cfg->busy_poll_us = (uint32_t)env_long("VRPC_VERBS_BUSY_POLL_US", 50);
	cfg->connect_timeout_ms = 10000;
	cfg->proto_version = VRPC_VERBS_PROTO_VERSION;
}

/* ---- wire formats ------------------------------------------------------------ */

struct hdr {
	uint16_t credits; /* credits returned to the receiver of this message */
	uint16_t flags;
	uint32_t rsvd;
};
#define HDR_CREDIT_ONLY 1u

/* Connect (and accept) private data: at most 56 bytes on RDMA_PS_TCP. */
struct hello {
	uint32_t magic;
	uint16_t version;
	uint16_t credits;
	uint32_t eager_size;
	uint32_t rsvd;
};
/* Reject private data: why, readable, for the other side's error. */
struct rejectmsg {
	uint32_t magic;
	uint16_t version;
	uint16_t code;
	char why[48];
};
_Static_assert(sizeof(struct hello) <= 56, "connect private data is at most 56 bytes");
_Static_assert(sizeof(struct rejectmsg) <= 56, "reject private data kept within 56 bytes");

/* ---- registered slabs -------------------------------------------------------- */

struct slab {
	char *mem;
	size_t slot;
	uint32_t n;
	struct ibv_mr *mr;
	pthread_mutex_t lock;
	uint32_t *free;
	uint32_t nfree;
};

static int memlock_error(size_t bytes, int err, const char *dev)
{
	struct rlimit rl;
	char lim[32] = "unknown";
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		if (rl.rlim_cur == RLIM_INFINITY)
			snprintf(lim, sizeof(lim), "unlimited");
		else
			snprintf(lim, sizeof(lim), "%llu KiB", (unsigned long long)rl.rlim_cur / 1024);
	}
	vlog("cannot register %zu bytes on %s: %s. The locked-memory limit (ulimit -l) is %s; "
	     "raise it: `ulimit -l unlimited`, memlock in /etc/security/limits.conf, "
	     "or LimitMEMLOCK=infinity for a systemd service",
	     bytes, dev, strerror(-err), lim);
	return err;
}

static void slab_destroy(struct slab *s)
{
	if (s->mr)
		ibv_dereg_mr(s->mr);
	free(s->mem);
	free(s->free);
	pthread_mutex_destroy(&s->lock);
	memset(s, 0, sizeof(*s));
}

static int slab_create(struct slab *s, struct ibv_pd *pd, uint32_t n, size_t payload, int access)
{
	size_t bytes;
	int err;
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	s->slot = (sizeof(struct hdr) + payload + 63) & ~(size_t)63;
	s->n = n;
	bytes = s->slot * n;
	if (posix_memalign((void **)&s->mem, 4096, bytes)) {
		s->mem = NULL;
		err = -ENOMEM;
		goto fail;
	}
	memset(s->mem, 0, bytes);
	s->free = calloc(n, sizeof(*s->free));
	if (!s->free) {
		err = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < n; i++)
		s->free[i] = n - 1 - i;
	s->nfree = n;
	s->mr = ibv_reg_mr(pd, s->mem, bytes, access);
	if (!s->mr) {
		err = err_errno();
		if (err == -ENOMEM || err == -EPERM || err == -EAGAIN)
			err = memlock_error(bytes, err, ibv_get_device_name(pd->context->device));
		else
			vlog("ibv_reg_mr(%zu bytes): %s", bytes, strerror(-err));
		goto fail;
	}
	return 0;
fail:
	slab_destroy(s);
	return err;
}

static char *slab_slot(const struct slab *s, uint32_t i) { return s->mem + (size_t)i * s->slot; }

static uint32_t slab_index(const struct slab *s, const void *p)
{
	return (uint32_t)(((const char *)p - s->mem) / s->slot);
}

static bool slab_owns(const struct slab *s, const void *p)
{
	return (const char *)p >= s->mem && (const char *)p < s->mem + s->slot * s->n;
}

/* ---- objects ------------------------------------------------------------------ */

enum obj_kind { OBJ_EP = 1, OBJ_LISTENER };
enum ep_state { EP_CONNECTING, EP_ACCEPTING, EP_CONNECTED, EP_FAILED };

struct sent {
	uint64_t wr_id;
	char *slot; /* slot base (header), NULL for credit-only */
	uint32_t len;
	uint32_t imm;
	bool ctl;
};

struct vrpc_verbs_ep {
	enum obj_kind kind; /* first: rdma_cm id->context points here */
	struct vrpc_verbs_ctx *ctx;
	struct vrpc_verbs_cq *cq;
	struct vrpc_verbs_listener *listener; /* server side, until accepted */
	struct rdma_cm_id *id;
	struct ibv_qp *qp;
	uint32_t qpn;
	atomic_int refs;
	void *user;

	pthread_mutex_t lock; /* everything below */
	pthread_cond_t cond;
	enum ep_state state;
	int err;
	char why[128];
	bool closed_locally, err_reported, reaping, in_svc, granted;
	uint32_t window;       /* the peer's grant at connect */
	uint32_t peer_eager;
	uint32_t credits;      /* messages we may still send */
	uint32_t owed;         /* reposted receive buffers not yet returned as credit */
	uint32_t max_inline;
	uint32_t unsignaled;   /* posted since the last signalled send */
	uint32_t sig_every;
	/* posted sends, in post order: ring[(head..tail) & mask] */
	struct sent *ring;
	uint32_t ring_mask, head, tail;
	uint64_t seq_head;     /* send sequence of ring[head] */
	/* sends waiting for credits */
	struct sent *backlog;
	uint32_t bl_mask, bl_head, bl_tail;

	struct vrpc_verbs_ep *next_svc, *next_reap, *next_accept;
	struct vrpc_verbs_ep *next_all, *prev_all;
};

struct vrpc_verbs_listener {
	enum obj_kind kind;
	struct vrpc_verbs_ctx *ctx;
	struct vrpc_verbs_cq *cq;
	struct rdma_cm_id *id;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct vrpc_verbs_ep *accq_head, *accq_tail;
	bool closing;
};

struct rslot { /* receive slab slot metadata */
	struct vrpc_verbs_ep *ep; /* who filled it (holds a ref) while the user has it */
};

struct vrpc_verbs_cq {
	struct vrpc_verbs_ctx *ctx;
	vrpc_verbs_cq_cb cb;
	vrpc_verbs_ep_err_cb ecb;
	void *arg;
	struct ibv_comp_channel *chan;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct slab rslab;
	struct rslot *rmeta;
	uint32_t granted; /* credits granted to all endpoints on this CQ (under lock) */
	int wakefd;
	pthread_t poller;
	bool poller_started;
	atomic_bool stop, sleeping;
	unsigned unacked;
	atomic_int neps; /* endpoints not yet reaped */

	pthread_mutex_t lock; /* the fields below */
	uint32_t *repost;     /* slot indexes released, waiting to be posted */
	uint32_t nrepost;
	struct vrpc_verbs_ep *svc; /* endpoints whose queued sends must be flushed */
	/* qpn -> endpoint, open addressing */
	struct vrpc_verbs_ep **map;
	uint32_t map_mask;
};

struct vrpc_verbs_ctx {
	struct vrpc_verbs_cfg cfg;
	struct rdma_event_channel *ech;
	struct rdma_cm_id *bind_id; /* bound to the local address: gives the device */
	struct sockaddr_storage local;
	bool has_local;
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	struct ibv_device_attr dattr;
	struct slab sslab;
	atomic_size_t reg_bytes;
	int epfd, wakefd;
	pthread_t cm_thread;
	bool cm_started;
	atomic_bool stop;
	bool debug; /* VRPC_VERBS_DEBUG=1: log rdma_cm events */

	pthread_mutex_t lock; /* fields below */
	pthread_cond_t cond;
	struct vrpc_verbs_ep *reap;
	struct vrpc_verbs_ep *all;
	/* one command run on the CM thread (listener teardown) */
	void (*cmd)(void *);
	void *cmd_arg;
	bool cmd_done;
};

/* ---- qpn map (cq->lock) ------------------------------------------------------- */

static void map_put(struct vrpc_verbs_cq *cq, struct vrpc_verbs_ep *ep)
{
	uint32_t i = ep->qpn & cq->map_mask;
	while (cq->map[i])
		i = (i + 1) & cq->map_mask;
	cq->map[i] = ep;
}

static struct vrpc_verbs_ep *map_get(struct vrpc_verbs_cq *cq, uint32_t qpn)
{
	for (uint32_t i = qpn & cq->map_mask;; i = (i + 1) & cq->map_mask) {
		if (!cq->map[i])
			return NULL;
		if (cq->map[i]->qpn == qpn)
			return cq->map[i];
	}
}

static void map_del(struct vrpc_verbs_cq *cq, struct vrpc_verbs_ep *ep)
{
	uint32_t i = ep->qpn & cq->map_mask, j;
	while (cq->map[i] && cq->map[i] != ep)
		i = (i + 1) & cq->map_mask;
	if (!cq->map[i])
		return;
	cq->map[i] = NULL;
	/* re-insert the rest of the cluster (linear probing deletion) */
	for (j = (i + 1) & cq->map_mask; cq->map[j]; j = (j + 1) & cq->map_mask) {
		struct vrpc_verbs_ep *e = cq->map[j];
		cq->map[j] = NULL;
		map_put(cq, e);
	}
}

/* ---- wake-ups ------------------------------------------------------------------- */

static void wake(int fd)
{
	uint64_t one = 1;
	ssize_t r = write(fd, &one, sizeof(one));
	(void)r;
}

static void drain_fd(int fd)
{
	uint64_t v;
	ssize_t r = read(fd, &v, sizeof(v));
	(void)r;
}

/* ---- endpoint lifetime ------------------------------------------------------------- */

void vrpc_verbs_ep_get(struct vrpc_verbs_ep *ep) { atomic_fetch_add(&ep->refs, 1); }

static void ep_free(struct vrpc_verbs_ep *ep)
{
	struct vrpc_verbs_ctx *ctx = ep->ctx;
	pthread_mutex_lock(&ctx->lock);
	if (ep->prev_all)
		ep->prev_all->next_all = ep->next_all;
	else if (ctx->all == ep)
		ctx->all = ep->next_all;
	if (ep->next_all)
		ep->next_all->prev_all = ep->prev_all;
	pthread_mutex_unlock(&ctx->lock);
	free(ep->ring);
	free(ep->backlog);
	pthread_mutex_destroy(&ep->lock);
	pthread_cond_destroy(&ep->cond);
	free(ep);
}

void vrpc_verbs_ep_put(struct vrpc_verbs_ep *ep)
{
	if (atomic_fetch_sub(&ep->refs, 1) == 1)
		ep_free(ep);
}

static uint32_t pow2(uint32_t x)
{
	uint32_t p = 1;
	while (p < x)
		p <<= 1;
	return p;
}

static struct vrpc_verbs_ep *ep_new(struct vrpc_verbs_ctx *ctx, struct vrpc_verbs_cq *cq)
{
	struct vrpc_verbs_ep *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return NULL;
	ep->kind = OBJ_EP;
	ep->ctx = ctx;
	ep->cq = cq;
	atomic_init(&ep->refs, 1); /* the connection's own reference, dropped by the reaper */
	pthread_mutex_init(&ep->lock, NULL);
	pthread_cond_init(&ep->cond, NULL);
	ep->ring_mask = pow2(2u * ctx->cfg.credits + 4) - 1;
	ep->bl_mask = BACKLOG - 1;
	ep->ring = calloc(ep->ring_mask + 1, sizeof(*ep->ring));
	ep->backlog = calloc(BACKLOG, sizeof(*ep->backlog));
	if (!ep->ring || !ep->backlog) {
		free(ep->ring);
		free(ep->backlog);
		free(ep);
		return NULL;
	}
	atomic_fetch_add(&cq->neps, 1);
	pthread_mutex_lock(&ctx->lock);
	ep->next_all = ctx->all;
	if (ctx->all)
		ctx->all->prev_all = ep;
	ctx->all = ep;
	pthread_mutex_unlock(&ctx->lock);
	return ep;
}

/* Queue ep for the poller: its backlog must be completed with flush status. */
static void svc_locked_ep(struct vrpc_verbs_ep *ep)
{
	struct vrpc_verbs_cq *cq = ep->cq;
	if (ep->in_svc)
		return;
	ep->in_svc = true;
	vrpc_verbs_ep_get(ep);
	pthread_mutex_lock(&cq->lock);
	ep->next_svc = cq->svc;
	cq->svc = ep;
	pthread_mutex_unlock(&cq->lock);
	wake(cq->wakefd);
}

/* Fails the endpoint once: records why, moves the QP to error so that every
 * posted send flushes, and lets the poller flush the queued ones. */
static void ep_fail(struct vrpc_verbs_ep *ep, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ep_fail(struct vrpc_verbs_ep *ep, int err, const char *fmt, ...)
{
	va_list ap;
	bool report;
	pthread_mutex_lock(&ep->lock);
	if (ep->state == EP_FAILED) {
		pthread_mutex_unlock(&ep->lock);
		return;
	}
	ep->state = EP_FAILED;
	ep->err = err;
	va_start(ap, fmt);
	vsnprintf(ep->why, sizeof(ep->why), fmt, ap);
	va_end(ap);
	if (ep->ctx->debug)
		vlog("endpoint %p failed: %s (%s)", (void *)ep, ep->why, strerror(-err));
	report = !ep->closed_locally && !ep->err_reported && !ep->listener;
	ep->err_reported = true;
	if (ep->qp) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
		ibv_modify_qp(ep->qp, &a, IBV_QP_STATE);
	}
	svc_locked_ep(ep);
	pthread_cond_broadcast(&ep->cond);
	pthread_mutex_unlock(&ep->lock);
	if (report && ep->cq->ecb)
		ep->cq->ecb(ep->cq->arg, ep, err, ep->why);
}

/* Poller: once failed and every posted send has completed, hand the endpoint
 * to the CM thread for teardown. Called with ep->lock held. */
static void maybe_reap_locked(struct vrpc_verbs_ep *ep)
{
	struct vrpc_verbs_ctx *ctx = ep->ctx;
	if (ep->state != EP_FAILED || ep->reaping || ep->head != ep->tail || ep->bl_head != ep->bl_tail ||
	    ep->in_svc)
		return;
	ep->reaping = true;
	pthread_mutex_lock(&ctx->lock);
	ep->next_reap = ctx->reap;
	ctx->reap = ep;
	pthread_mutex_unlock(&ctx->lock);
	wake(ctx->wakefd);
}

/* CM thread. */
static void ep_teardown(struct vrpc_verbs_ep *ep)
{
	struct vrpc_verbs_cq *cq = ep->cq;
	if (ep->qp) {
		pthread_mutex_lock(&cq->lock);
		map_del(cq, ep);
		pthread_mutex_unlock(&cq->lock);
		ibv_destroy_qp(ep->qp);
		ep->qp = NULL;
	}
	if (ep->granted) {
		pthread_mutex_lock(&cq->lock);
		cq->granted -= ep->ctx->cfg.credits;
		pthread_mutex_unlock(&cq->lock);
	}
	if (ep->id) {
		rdma_disconnect(ep->id); /* harmless when already disconnected */
		rdma_destroy_id(ep->id);
		ep->id = NULL;
	}
	atomic_fetch_sub(&cq->neps, 1);
	vrpc_verbs_ep_put(ep);
}

/* ---- QP ------------------------------------------------------------------------------ */

static int qp_create(struct vrpc_verbs_ep *ep)
{
	struct vrpc_verbs_ctx *ctx = ep->ctx;
	static const uint32_t inl[] = { 256, 128, 64, 0 };
	struct ibv_qp_init_attr ia;
	int err = -EINVAL;
	for (size_t i = 0; i < sizeof(inl) / sizeof(inl[0]); i++) {
		memset(&ia, 0, sizeof(ia));
		ia.send_cq = ep->cq->cq;
		ia.recv_cq = ep->cq->cq;
		ia.srq = ep->cq->srq;
		ia.qp_type = IBV_QPT_RC;
		ia.sq_sig_all = 0;
		ia.cap.max_send_wr = ep->ring_mask + 1;
		ia.cap.max_send_sge = 1;
		ia.cap.max_inline_data = inl[i];
		ep->qp = ibv_create_qp(ctx->pd, &ia);
		if (ep->qp)
			break;
		err = err_errno();
		if (err != -EINVAL)
			break;
	}
	if (!ep->qp) {
		vlog("ibv_create_qp: %s", strerror(-err));
		return err;
	}
	ep->qpn = ep->qp->qp_num;
	ep->max_inline = ia.cap.max_inline_data;
	pthread_mutex_lock(&ep->cq->lock);
	map_put(ep->cq, ep);
	pthread_mutex_unlock(&ep->cq->lock);
	return 0;
}

/* Moves the QP to `state` with the attributes rdma_cm computed (path, GID,
 * remote QPN) plus ours: ACK timeout >= cfg, retry 7, RNR retry cfg, and the
 * GID index override. */
static int qp_modify(struct vrpc_verbs_ep *ep, enum ibv_qp_state state)
{
	const struct vrpc_verbs_cfg *cfg = &ep->ctx->cfg;
	struct ibv_qp_attr a;
	int mask = 0, rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	if (rdma_init_qp_attr(ep->id, &a, &mask))
		return err_errno();
	if (state == IBV_QPS_INIT) {
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
		mask |= IBV_QP_ACCESS_FLAGS;
	} else if (state == IBV_QPS_RTR) {
		if (cfg->gid_index >= 0)
			a.ah_attr.grh.sgid_index = (uint8_t)cfg->gid_index;
		a.max_dest_rd_atomic = 0;
	} else if (state == IBV_QPS_RTS) {
		if (a.timeout < cfg->ack_timeout)
			a.timeout = cfg->ack_timeout;
		a.retry_cnt = cfg->retry_cnt;
		a.rnr_retry = cfg->rnr_retry;
		a.max_rd_atomic = 0;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
	}
	rc = ibv_modify_qp(ep->qp, &a, mask);
	return vrpc_verbs_err_pos(rc);
}

static void hello_fill(const struct vrpc_verbs_ctx *ctx, struct hello *h)
{
	memset(h, 0, sizeof(*h));
	h->magic = htonl(HELLO_MAGIC);
	h->version = htons(ctx->cfg.proto_version);
	h->credits = htons(ctx->cfg.credits);
	h->eager_size = htonl(ctx->cfg.eager_size);
}

/* Checks the peer's hello; on mismatch writes the reason and returns -EPROTO. */
static int hello_check(const struct vrpc_verbs_ctx *ctx, const void *data, uint8_t len, char *why, size_t n)
{
	struct hello h;
	if (!data || len < sizeof(h)) {
		snprintf(why, n, "no verbrpc hello in the connect data (%u bytes)", len);
		return -EPROTO;
	}
	memcpy(&h, data, sizeof(h));
	if (ntohl(h.magic) != HELLO_MAGIC) {
		snprintf(why, n, "peer is not verbrpc (magic 0x%08x)", ntohl(h.magic));
		return -EPROTO;
	}
	if (ntohs(h.version) != ctx->cfg.proto_version) {
		snprintf(why, n, "protocol version %u not supported (speaks %u)", ntohs(h.version),
			 ctx->cfg.proto_version);
		return -EPROTO;
	}
	if (ntohl(h.eager_size) != ctx->cfg.eager_size) {
		snprintf(why, n, "eager size %u, expected %u", ntohl(h.eager_size),
			 ctx->cfg.eager_size);
		return -EPROTO;
	}
	if (ntohs(h.credits) < 2) {
		snprintf(why, n, "initial credits %u, at least 2 needed", ntohs(h.credits));
		return -EPROTO;
	}
	return 0;
}

static void conn_param(const struct vrpc_verbs_ep *ep, struct rdma_conn_param *p, struct hello *h)
{
	hello_fill(ep->ctx, h);
	memset(p, 0, sizeof(*p));
	p->private_data = h;
	p->private_data_len = sizeof(*h);
	p->retry_count = ep->ctx->cfg.retry_cnt;
	p->rnr_retry_count = ep->ctx->cfg.rnr_retry;
	p->qp_num = ep->qpn;
	p->srq = 1;
}

static void ep_set_peer(struct vrpc_verbs_ep *ep, const void *data)
{
	struct hello h;
	memcpy(&h, data, sizeof(h));
	ep->window = ntohs(h.credits);
	ep->credits = ep->window;
	ep->peer_eager = ntohl(h.eager_size);
	ep->sig_every = ep->window / 4 ? ep->window / 4 : 1;
}

/* ---- sending (ep->lock held) ------------------------------------------------------------- */

static int slab_get(struct slab *s, uint32_t *idx);
static void slab_put(struct slab *s, uint32_t idx);

static uint32_t ring_used(const struct vrpc_verbs_ep *ep) { return ep->tail - ep->head; }

static int post_locked(struct vrpc_verbs_ep *ep, const struct sent *s, bool more)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	struct hdr ctl_hdr, *h = s->slot ? (struct hdr *)s->slot : &ctl_hdr;
	uint32_t idx = ep->tail & ep->ring_mask;
	int rc;

	h->credits = htons((uint16_t)ep->owed);
	h->flags = htons(s->ctl ? HDR_CREDIT_ONLY : 0);
	h->rsvd = 0;
	memset(&wr, 0, sizeof(wr));
	sge.addr = (uintptr_t)h;
	sge.length = (uint32_t)sizeof(*h) + s->len;
	sge.lkey = s->slot ? ep->ctx->sslab.mr->lkey : 0; /* no slot: inline */
	wr.wr_id = ep->seq_head + ring_used(ep);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htonl(s->imm);
	if (sge.length <= ep->max_inline)
		wr.send_flags |= IBV_SEND_INLINE;
	/* Selective signalling: a signalled completion retires every earlier
	 * send on this QP. Signal every sig_every posts, when nothing follows,
	 * and before the ring could fill. */
	if (!more || ep->unsignaled + 1 >= ep->sig_every || ring_used(ep) + 2 > ep->ring_mask) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		ep->unsignaled = 0;
	} else {
		ep->unsignaled++;
	}
	rc = ibv_post_send(ep->qp, &wr, &bad);
	if (rc)
		return vrpc_verbs_err_pos(rc);
	ep->ring[idx] = *s;
	ep->tail++;
	ep->credits--;
	ep->owed = 0;
	return 0;
}

static bool can_post_data(const struct vrpc_verbs_ep *ep)
{
	return ep->credits >= 2 && ring_used(ep) < ep->ring_mask;
}

/* Posts queued sends while credits last; then, if credits are owed and nothing
 * carried them, a credit-only message (it may use the last credit). */
static void pump_locked(struct vrpc_verbs_ep *ep)
{
	if (ep->state != EP_CONNECTED)
		return;
	while (ep->bl_head != ep->bl_tail && can_post_data(ep)) {
		struct sent *s = &ep->backlog[ep->bl_head & ep->bl_mask];
		bool more = ep->bl_head + 1 != ep->bl_tail && ep->credits > 2;
		int err = post_locked(ep, s, more);
		if (err) {
			vlog("ibv_post_send: %s", strerror(-err));
			return;
		}
		ep->bl_head++;
	}
	if (ep->owed >= (ep->ctx->cfg.credits + 1u) / 2 && ep->credits >= 1 && ring_used(ep) < ep->ring_mask) {
		struct sent s = { .ctl = true };
		uint32_t idx = 0;
		int err = 0;
		/* a device without inline data needs a registered header */
		if (ep->max_inline < sizeof(struct hdr)) {
			err = slab_get(&ep->ctx->sslab, &idx);
			if (!err)
				s.slot = slab_slot(&ep->ctx->sslab, idx);
		}
		if (!err)
			err = post_locked(ep, &s, false);
		if (err) {
			if (s.slot)
				slab_put(&ep->ctx->sslab, idx);
			vlog("cannot send a credit update: %s", strerror(-err));
		}
	}
}

int vrpc_verbs_send(struct vrpc_verbs_ep *ep, void *buf, uint32_t len, uint32_t imm, uint64_t wr_id)
{
	struct sent s = { .wr_id = wr_id, .slot = (char *)buf - sizeof(struct hdr), .len = len, .imm = imm };
	int err = 0;
	if (len > ep->ctx->cfg.eager_size || !slab_owns(&ep->ctx->sslab, buf))
		return -EINVAL;
	pthread_mutex_lock(&ep->lock);
	if (ep->state == EP_FAILED) {
		err = ep->err ? ep->err : -ENOTCONN;
	} else if (ep->state != EP_CONNECTED) {
		err = -ENOTCONN;
	} else if (ep->bl_head == ep->bl_tail && can_post_data(ep)) {
		err = post_locked(ep, &s, false);
	} else if (ep->bl_tail - ep->bl_head > ep->bl_mask) {
		err = -EAGAIN;
	} else {
		ep->backlog[ep->bl_tail & ep->bl_mask] = s;
		ep->bl_tail++;
	}
	pthread_mutex_unlock(&ep->lock);
	return err;
}

/* ---- send buffers ---------------------------------------------------------------------- */

static int slab_get(struct slab *s, uint32_t *idx)
{
	int err = -ENOBUFS;
	pthread_mutex_lock(&s->lock);
	if (s->nfree) {
		*idx = s->free[--s->nfree];
		err = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return err;
}

static void slab_put(struct slab *s, uint32_t idx)
{
	pthread_mutex_lock(&s->lock);
	s->free[s->nfree++] = idx;
	pthread_mutex_unlock(&s->lock);
}

int vrpc_verbs_buf_get(struct vrpc_verbs_ctx *ctx, void **buf)
{
	uint32_t i;
	int err = slab_get(&ctx->sslab, &i);
	if (err)
		return err;
	*buf = slab_slot(&ctx->sslab, i) + sizeof(struct hdr);
	return 0;
}

void vrpc_verbs_buf_put(struct vrpc_verbs_ctx *ctx, void *buf)
{
	slab_put(&ctx->sslab, slab_index(&ctx->sslab, buf));
}

/* ---- receive buffers ------------------------------------------------------------------- */

/* Posts the released buffers to the SRQ in one chain, then returns their
 * credits to the endpoints that filled them. Any thread. */
static void repost_flush(struct vrpc_verbs_cq *cq)
{
	struct ibv_recv_wr wrs[RECV_BATCH], *bad;
	struct ibv_sge sges[RECV_BATCH];
	struct vrpc_verbs_ep *eps[RECV_BATCH];
	uint32_t n;
	int rc;

	for (;;) {
		pthread_mutex_lock(&cq->lock);
		n = cq->nrepost < RECV_BATCH ? cq->nrepost : RECV_BATCH;
		if (!n) {
			pthread_mutex_unlock(&cq->lock);
			return;
		}
		for (uint32_t i = 0; i < n; i++) {
			uint32_t idx = cq->repost[--cq->nrepost];
			sges[i].addr = (uintptr_t)slab_slot(&cq->rslab, idx);
			sges[i].length = (uint32_t)cq->rslab.slot;
			sges[i].lkey = cq->rslab.mr->lkey;
			wrs[i].wr_id = WRID_RECV | idx;
			wrs[i].sg_list = &sges[i];
			wrs[i].num_sge = 1;
			wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
			eps[i] = cq->rmeta[idx].ep;
			cq->rmeta[idx].ep = NULL;
		}
		rc = ibv_post_srq_recv(cq->srq, wrs, &bad);
		pthread_mutex_unlock(&cq->lock);
		if (rc)
			vlog("ibv_post_srq_recv: %s", strerror(rc));
		for (uint32_t i = 0; i < n; i++) {
			struct vrpc_verbs_ep *ep = eps[i];
			if (!ep)
				continue;
			pthread_mutex_lock(&ep->lock);
			ep->owed++;
			if (i + 1 == n || eps[i + 1] != ep)
				pump_locked(ep);
			pthread_mutex_unlock(&ep->lock);
			vrpc_verbs_ep_put(ep);
		}
	}
}

static void recv_release_idx(struct vrpc_verbs_cq *cq, uint32_t idx, bool flush_now)
{
	uint32_t n;
	pthread_mutex_lock(&cq->lock);
	cq->repost[cq->nrepost++] = idx;
	n = cq->nrepost;
	pthread_mutex_unlock(&cq->lock);
	if (flush_now || n >= RECV_BATCH)
		repost_flush(cq);
	else if (atomic_load(&cq->sleeping))
		wake(cq->wakefd);
}

void vrpc_verbs_recv_release(struct vrpc_verbs_cq *cq, void *buf)
{
	recv_release_idx(cq, slab_index(&cq->rslab, (char *)buf - sizeof(struct hdr)), false);
}

/* ---- the poller ---------------------------------------------------------------------------- */

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

static void deliver(struct vrpc_verbs_cq *cq, struct vrpc_verbs_wc *w)
{
	cq->cb(cq->arg, w);
}

static void on_send_wc(struct vrpc_verbs_cq *cq, struct vrpc_verbs_ep *ep, const struct ibv_wc *wc)
{
	struct sent done[64];
	int st = wc_status(wc->status);
	bool found = false;

	if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
		ep_fail(ep, st, "send failed: %s (vendor error 0x%x)", ibv_wc_status_str(wc->status),
			wc->vendor_err);
	while (!found) {
		uint32_t n = 0;
		int hit = -1;
		pthread_mutex_lock(&ep->lock);
		/* retire every send up to and including the one this completion
		 * names: the earlier ones were unsignalled and finished already */
		while (n < 64 && ep->head != ep->tail && hit < 0) {
			if (ep->seq_head == wc->wr_id)
				hit = (int)n;
			done[n++] = ep->ring[ep->head & ep->ring_mask];
			ep->head++;
			ep->seq_head++;
		}
		found = hit >= 0 || ep->head == ep->tail;
		pump_locked(ep);
		maybe_reap_locked(ep);
		pthread_mutex_unlock(&ep->lock);
		for (uint32_t i = 0; i < n; i++) {
			struct vrpc_verbs_wc w = { .ep = ep, .op = VRPC_VERBS_OP_SEND };
			if (done[i].ctl) {
				if (done[i].slot)
					slab_put(&ep->ctx->sslab, slab_index(&ep->ctx->sslab, done[i].slot));
				continue;
			}
			w.wr_id = done[i].wr_id;
			w.byte_len = done[i].len;
			w.imm = done[i].imm;
			w.buf = done[i].slot + sizeof(struct hdr);
			w.status = (int)i == hit ? st : 0;
			deliver(cq, &w);
		}
	}
}

static void on_recv_wc(struct vrpc_verbs_cq *cq, struct vrpc_verbs_ep *ep, const struct ibv_wc *wc)
{
	uint32_t idx = (uint32_t)(wc->wr_id & ~WRID_RECV);
	struct hdr *h = (struct hdr *)slab_slot(&cq->rslab, idx);
	struct vrpc_verbs_wc w = { .ep = ep, .op = VRPC_VERBS_OP_RECV };

	if (wc->status != IBV_WC_SUCCESS) {
		/* SRQ receives do not flush with a QP; this is a real error */
		if (ep)
			ep_fail(ep, wc_status(wc->status), "receive failed: %s", ibv_wc_status_str(wc->status));
		recv_release_idx(cq, idx, false);
		return;
	}
	if (!ep || wc->byte_len < sizeof(*h)) {
		if (ep)
			ep_fail(ep, -EPROTO, "runt message of %u bytes", wc->byte_len);
		recv_release_idx(cq, idx, false);
		return;
	}
	pthread_mutex_lock(&ep->lock);
	/* data before ESTABLISHED: the client is connected (as COMM_EST) */
	if (ep->state == EP_ACCEPTING)
		ep->state = EP_CONNECTED;
	ep->credits += ntohs(h->credits);
	if (ep->credits > ep->window) {
		pthread_mutex_unlock(&ep->lock);
		ep_fail(ep, -EPROTO, "peer returned more credits than granted");
		recv_release_idx(cq, idx, false);
		return;
	}
	pump_locked(ep);
	pthread_mutex_unlock(&ep->lock);
	/* the buffer's credit goes back to ep when it is reposted */
	vrpc_verbs_ep_get(ep);
	cq->rmeta[idx].ep = ep;
	if (ntohs(h->flags) & HDR_CREDIT_ONLY) {
		recv_release_idx(cq, idx, false);
		return;
	}
	w.byte_len = wc->byte_len - (uint32_t)sizeof(*h);
	w.imm = (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0;
	w.buf = h + 1;
	w.wr_id = idx;
	deliver(cq, &w);
}

static void handle_wcs(struct vrpc_verbs_cq *cq, struct ibv_wc *wcs, int n)
{
	for (int i = 0; i < n; i++) {
		struct vrpc_verbs_ep *ep;
		pthread_mutex_lock(&cq->lock);
		ep = map_get(cq, wcs[i].qp_num);
		if (ep)
			vrpc_verbs_ep_get(ep);
		pthread_mutex_unlock(&cq->lock);
		if (wcs[i].wr_id & WRID_RECV)
			on_recv_wc(cq, ep, &wcs[i]);
		else if (ep)
			on_send_wc(cq, ep, &wcs[i]);
		if (ep)
			vrpc_verbs_ep_put(ep);
	}
}

/* Completes the queued (never posted) sends of failed endpoints with
 * -ECANCELED, on the poller thread. */
static void service(struct vrpc_verbs_cq *cq)
{
	struct vrpc_verbs_ep *ep, *next;
	pthread_mutex_lock(&cq->lock);
	ep = cq->svc;
	cq->svc = NULL;
	pthread_mutex_unlock(&cq->lock);
	for (; ep; ep = next) {
		next = ep->next_svc;
		for (;;) {
			struct sent s;
			struct vrpc_verbs_wc w = { .ep = ep, .op = VRPC_VERBS_OP_SEND, .status = -ECANCELED };
			pthread_mutex_lock(&ep->lock);
			if (ep->bl_head == ep->bl_tail) {
				ep->in_svc = false;
				maybe_reap_locked(ep);
				pthread_mutex_unlock(&ep->lock);
				break;
			}
			s = ep->backlog[ep->bl_head++ & ep->bl_mask];
			pthread_mutex_unlock(&ep->lock);
			w.wr_id = s.wr_id;
			w.byte_len = s.len;
			w.imm = s.imm;
			w.buf = s.slot + sizeof(struct hdr);
			deliver(cq, &w);
		}
		vrpc_verbs_ep_put(ep);
	}
}

static void *poller_main(void *arg)
{
	struct vrpc_verbs_cq *cq = arg;
	struct ibv_wc wcs[POLL_BATCH];
	uint64_t idle_since = now_us();
	uint64_t busy = cq->ctx->cfg.busy_poll_us;

	while (!atomic_load(&cq->stop)) {
		int n = ibv_poll_cq(cq->cq, POLL_BATCH, wcs);
		if (n < 0) {
			vlog("ibv_poll_cq failed (%d): the completion queue is unusable", n);
			break;
		}
		if (n > 0) {
			handle_wcs(cq, wcs, n);
			idle_since = now_us();
			continue;
		}
		repost_flush(cq);
		service(cq);
		if (now_us() - idle_since < busy)
			continue;
		/* poll -> arm -> poll: a completion that landed between the last
		 * poll and the arm is caught by the second poll */
		if (ibv_req_notify_cq(cq->cq, 0)) {
			vlog("ibv_req_notify_cq failed");
			break;
		}
		n = ibv_poll_cq(cq->cq, POLL_BATCH, wcs);
		if (n > 0) {
			handle_wcs(cq, wcs, n);
			idle_since = now_us();
			continue;
		}
		atomic_store(&cq->sleeping, true);
		/* recheck after publishing `sleeping`: a release that saw it false
		 * did not wake us, so its buffer is in the list */
		pthread_mutex_lock(&cq->lock);
		bool pending = cq->nrepost || cq->svc;
		pthread_mutex_unlock(&cq->lock);
		if (!pending && !atomic_load(&cq->stop)) {
			struct pollfd p[2] = { { .fd = cq->chan->fd, .events = POLLIN }, { .fd = cq->wakefd, .events = POLLIN } };
			poll(p, 2, 1000);
			if (p[1].revents & POLLIN)
				drain_fd(cq->wakefd);
			if (p[0].revents & POLLIN) {
				struct ibv_cq *ev_cq;
				void *ev_ctx;
				if (ibv_get_cq_event(cq->chan, &ev_cq, &ev_ctx) == 0 && ++cq->unacked >= ACK_BATCH) {
					ibv_ack_cq_events(cq->cq, cq->unacked);
					cq->unacked = 0;
				}
			}
		}
		atomic_store(&cq->sleeping, false);
		idle_since = now_us();
	}
	return NULL;
}

/* ---- CQ ------------------------------------------------------------------------------------ */

int vrpc_verbs_cq_create(struct vrpc_verbs_ctx *ctx, vrpc_verbs_cq_cb cb, vrpc_verbs_ep_err_cb ecb, void *arg,
			 struct vrpc_verbs_cq **out)
{
	struct vrpc_verbs_cq *cq;
	struct ibv_srq_init_attr sa;
	uint32_t nrecv = ctx->cfg.recv_bufs;
	int err, cqe;

	if ((int)nrecv > ctx->dattr.max_srq_wr)
		nrecv = (uint32_t)ctx->dattr.max_srq_wr;
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return -ENOMEM;
	cq->ctx = ctx;
	cq->cb = cb;
	cq->ecb = ecb;
	cq->arg = arg;
	cq->wakefd = -1;
	pthread_mutex_init(&cq->lock, NULL);
	cq->map_mask = 4095;
	cq->map = calloc(cq->map_mask + 1, sizeof(*cq->map));
	cq->repost = calloc(nrecv, sizeof(*cq->repost));
	cq->rmeta = calloc(nrecv, sizeof(*cq->rmeta));
	if (!cq->map || !cq->repost || !cq->rmeta) {
		err = -ENOMEM;
		goto fail;
	}
	cq->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (cq->wakefd < 0) {
		err = err_errno();
		goto fail;
	}
	cq->chan = ibv_create_comp_channel(ctx->verbs);
	if (!cq->chan) {
		err = err_errno();
		goto fail;
	}
	/* room for every receive plus the sends of all endpoints */
	cqe = (int)nrecv * 2;
	if (cqe > ctx->dattr.max_cqe)
		cqe = ctx->dattr.max_cqe;
	cq->cq = ibv_create_cq(ctx->verbs, cqe, cq, cq->chan, 0);
	if (!cq->cq) {
		err = err_errno();
		vlog("ibv_create_cq(%d): %s", cqe, strerror(-err));
		goto fail;
	}
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = nrecv;
	sa.attr.max_sge = 1;
	cq->srq = ibv_create_srq(ctx->pd, &sa);
	if (!cq->srq) {
		err = err_errno();
		vlog("ibv_create_srq(%u): %s", nrecv, strerror(-err));
		goto fail;
	}
	err = slab_create(&cq->rslab, ctx->pd, nrecv, ctx->cfg.eager_size, IBV_ACCESS_LOCAL_WRITE);
	if (err)
		goto fail;
	atomic_fetch_add(&ctx->reg_bytes, cq->rslab.slot * cq->rslab.n);
	for (uint32_t i = 0; i < nrecv; i++)
		cq->repost[cq->nrepost++] = i;
	repost_flush(cq);
	if (ibv_req_notify_cq(cq->cq, 0)) {
		err = -EIO;
		goto fail;
	}
	err = -pthread_create(&cq->poller, NULL, poller_main, cq);
	if (err)
		goto fail;
	cq->poller_started = true;
	*out = cq;
	return 0;
fail:
	vrpc_verbs_cq_destroy(cq);
	return err;
}

void vrpc_verbs_cq_destroy(struct vrpc_verbs_cq *cq)
{
	if (!cq)
		return;
	if (cq->poller_started) {
		/* let endpoints on this CQ drain (their flushes need the poller) */
		for (int i = 0; i < 2000 && atomic_load(&cq->neps) > 0; i++)
			usleep(5000);
		if (atomic_load(&cq->neps) > 0)
			vlog("destroying a completion queue with %d endpoints still open", atomic_load(&cq->neps));
		atomic_store(&cq->stop, true);
		wake(cq->wakefd);
		pthread_join(cq->poller, NULL);
	}
	if (cq->unacked)
		ibv_ack_cq_events(cq->cq, cq->unacked);
	if (cq->srq)
		ibv_destroy_srq(cq->srq);
	if (cq->rslab.mr)
		atomic_fetch_sub(&cq->ctx->reg_bytes, cq->rslab.slot * cq->rslab.n);
	slab_destroy(&cq->rslab);
	if (cq->cq)
		ibv_destroy_cq(cq->cq);
	if (cq->chan)
		ibv_destroy_comp_channel(cq->chan);
	if (cq->wakefd >= 0)
		close(cq->wakefd);
	free(cq->map);
	free(cq->repost);
	free(cq->rmeta);
	pthread_mutex_destroy(&cq->lock);
	free(cq);
}

/* ---- rdma_cm events (CM thread) --------------------------------------------------------------- */

static int reject_reason(const struct rdma_cm_event *ev, char *why, size_t n)
{
	struct rejectmsg r;
	if (ev->param.conn.private_data && ev->param.conn.private_data_len >= sizeof(r)) {
		memcpy(&r, ev->param.conn.private_data, sizeof(r));
		if (ntohl(r.magic) == HELLO_MAGIC) {
			r.why[sizeof(r.why) - 1] = 0;
			snprintf(why, n, "rejected by the server: %s", r.why);
			return -(int)ntohs(r.code);
		}
	}
	if (ev->status == 8) /* IB_CM_REJ_INVALID_SERVICE_ID: nobody listens */
		snprintf(why, n, "connection refused: no listener on that port");
	else
		snprintf(why, n, "connection rejected (rdma_cm status %d)", ev->status);
	return -ECONNREFUSED;
}

static void send_reject(struct rdma_cm_id *id, const struct vrpc_verbs_ctx *ctx, int code, const char *why)
{
	struct rejectmsg r;
	memset(&r, 0, sizeof(r));
	r.magic = htonl(HELLO_MAGIC);
	r.version = htons(ctx->cfg.proto_version);
	r.code = htons((uint16_t)-code);
	snprintf(r.why, sizeof(r.why), "%s", why);
	rdma_reject(id, &r, sizeof(r));
}

static void on_connect_request(struct vrpc_verbs_listener *l, struct rdma_cm_event *ev)
{
	struct vrpc_verbs_ctx *ctx = l->ctx;
	struct rdma_cm_id *id = ev->id;
	struct vrpc_verbs_ep *ep = NULL;
	struct rdma_conn_param p;
	struct hello h;
	char why[128], peer[64];
	int err;

	addr_str(rdma_get_peer_addr(id), peer, sizeof(peer));
	err = hello_check(ctx, ev->param.conn.private_data, ev->param.conn.private_data_len, why, sizeof(why));
	if (!err && id->verbs != ctx->verbs) {
		snprintf(why, sizeof(why), "request arrived on another device");
		err = -EXDEV;
	}
	if (!err) {
		pthread_mutex_lock(&l->cq->lock);
		if (l->cq->granted + ctx->cfg.credits > l->cq->rslab.n) {
			snprintf(why, sizeof(why), "receive queue full (%u buffers granted)", l->cq->granted);
			err = -ENOBUFS;
		} else {
			l->cq->granted += ctx->cfg.credits;
		}
		pthread_mutex_unlock(&l->cq->lock);
	}
	if (err) {
		vlog("rejecting a connection from %s: %s", peer, why);
		send_reject(id, ctx, err, why);
		goto destroy_id;
	}
	ep = ep_new(ctx, l->cq);
	if (!ep) {
		err = -ENOMEM;
		goto ungrant;
	}
	ep->id = id;
	ep->granted = true;
	ep->listener = l;
	ep->state = EP_ACCEPTING;
	id->context = ep;
	ep_set_peer(ep, ev->param.conn.private_data);
	err = qp_create(ep);
	if (!err)
		err = qp_modify(ep, IBV_QPS_INIT);
	if (!err)
		err = qp_modify(ep, IBV_QPS_RTR);
	if (!err)
		err = qp_modify(ep, IBV_QPS_RTS);
	if (err) {
		vlog("cannot set up a queue pair for %s: %s", peer, strerror(-err));
		send_reject(id, ctx, err, "server could not create a queue pair");
		ep->state = EP_FAILED;
		ep->err = err;
		ep->reaping = true;
		ep->id = NULL;
		id->context = NULL; /* destroyed by the caller once the event is acked */
		ep_teardown(ep);
		return;
	}
	conn_param(ep, &p, &h);
	if (rdma_accept(id, &p)) {
		err = err_errno();
		ep_fail(ep, err, "rdma_accept: %s", strerror(-err));
	}
	return;
ungrant:
	pthread_mutex_lock(&l->cq->lock);
	l->cq->granted -= ctx->cfg.credits;
	pthread_mutex_unlock(&l->cq->lock);
	send_reject(id, ctx, err, "server out of memory");
destroy_id:
	/* the id of a rejected request is destroyed after its event is acked */
	id->context = NULL;
}

static void on_ep_event(struct vrpc_verbs_ep *ep, struct rdma_cm_event *ev)
{
	struct vrpc_verbs_ctx *ctx = ep->ctx;
	char why[128];
	int err;

	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (ep->id->verbs != ctx->verbs) {
			ep_fail(ep, -EXDEV, "the destination is reached through device %s, not %s",
				ibv_get_device_name(ep->id->verbs->device), ibv_get_device_name(ctx->verbs->device));
			break;
		}
		if (rdma_resolve_route(ep->id, CM_TIMEOUT_MS)) {
			err = err_errno();
			ep_fail(ep, err, "rdma_resolve_route: %s", strerror(-err));
		}
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED: {
		struct rdma_conn_param p;
		struct hello h;
		err = qp_create(ep);
		if (!err)
			err = qp_modify(ep, IBV_QPS_INIT);
		if (err) {
			ep_fail(ep, err, "cannot create the queue pair: %s", strerror(-err));
			break;
		}
		conn_param(ep, &p, &h);
		if (rdma_connect(ep->id, &p)) {
			err = err_errno();
			ep_fail(ep, err, "rdma_connect: %s", strerror(-err));
		}
		break;
	}
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		err = hello_check(ctx, ev->param.conn.private_data, ev->param.conn.private_data_len, why, sizeof(why));
		if (err) {
			send_reject(ep->id, ctx, err, why);
			ep_fail(ep, err, "server's reply refused: %s", why);
			break;
		}
		pthread_mutex_lock(&ep->lock);
		ep_set_peer(ep, ev->param.conn.private_data);
		pthread_mutex_unlock(&ep->lock);
		err = qp_modify(ep, IBV_QPS_RTR);
		if (!err)
			err = qp_modify(ep, IBV_QPS_RTS);
		if (!err && rdma_establish(ep->id))
			err = err_errno();
		if (err) {
			ep_fail(ep, err, "cannot complete the connection: %s", strerror(-err));
			break;
		}
		pthread_mutex_lock(&ep->lock);
		if (ep->state == EP_CONNECTING)
			ep->state = EP_CONNECTED;
		pthread_cond_broadcast(&ep->cond);
		pthread_mutex_unlock(&ep->lock);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		pthread_mutex_lock(&ep->lock);
		if (ep->state == EP_ACCEPTING || ep->state == EP_CONNECTING)
			ep->state = EP_CONNECTED;
		pthread_cond_broadcast(&ep->cond);
		pthread_mutex_unlock(&ep->lock);
		if (ep->listener) {
			struct vrpc_verbs_listener *l = ep->listener;
			pthread_mutex_lock(&l->lock);
			ep->next_accept = NULL;
			if (l->accq_tail)
				l->accq_tail->next_accept = ep;
			else
				l->accq_head = ep;
			l->accq_tail = ep;
			vrpc_verbs_ep_get(ep); /* the accept queue's reference */
			pthread_cond_broadcast(&l->cond);
			pthread_mutex_unlock(&l->lock);
		}
		break;
	case RDMA_CM_EVENT_REJECTED:
		err = reject_reason(ev, why, sizeof(why));
		ep_fail(ep, err, "%s", why);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
		ep_fail(ep, -EHOSTUNREACH, "cannot resolve the address (rdma_cm ADDR_ERROR, status %d)", ev->status);
		break;
	case RDMA_CM_EVENT_ROUTE_ERROR:
		ep_fail(ep, -ENETUNREACH, "no route to the peer (rdma_cm ROUTE_ERROR, status %d)", ev->status);
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
		ep_fail(ep, -EHOSTUNREACH, "peer unreachable (rdma_cm UNREACHABLE, status %d)", ev->status);
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		ep_fail(ep, -ECONNABORTED, "connection failed (rdma_cm CONNECT_ERROR, status %d)", ev->status);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		rdma_disconnect(ep->id);
		ep_fail(ep, -ECONNRESET, "peer disconnected");
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		ep_fail(ep, -ENODEV, "RDMA device %s removed", ibv_get_device_name(ctx->verbs->device));
		break;
	default:
		break;
	}
}

static void handle_cm_event(struct vrpc_verbs_ctx *ctx, struct rdma_cm_event *ev)
{
	enum obj_kind *kind = ev->id->context;
	if (ctx->debug)
		vlog("cm event %s (status %d) on %p", rdma_event_str(ev->event), ev->status, (void *)kind);
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		struct vrpc_verbs_listener *l = ev->listen_id->context;
		struct rdma_cm_id *id = ev->id;
		if (l && !l->closing) {
			on_connect_request(l, ev);
		} else {
			send_reject(id, ctx, -ECONNREFUSED, "listener closing");
			id->context = NULL;
		}
		if (!id->context) {
			rdma_ack_cm_event(ev);
			rdma_destroy_id(id);
			return;
		}
	} else if (kind && *kind == OBJ_EP) {
		on_ep_event((struct vrpc_verbs_ep *)kind, ev);
	} else if (kind && *kind == OBJ_LISTENER && ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
		vlog("RDMA device removed under a listener");
	}
	rdma_ack_cm_event(ev);
}

static void *cm_main(void *arg)
{
	struct vrpc_verbs_ctx *ctx = arg;
	while (!atomic_load(&ctx->stop)) {
		struct epoll_event evs[4];
		int n = epoll_wait(ctx->epfd, evs, 4, 1000);
		for (int i = 0; i < n; i++) {
			if (evs[i].data.fd == ctx->ech->fd) {
				struct rdma_cm_event *ev;
				while (rdma_get_cm_event(ctx->ech, &ev) == 0)
					handle_cm_event(ctx, ev);
			} else if (evs[i].data.fd == ctx->verbs->async_fd) {
				struct ibv_async_event ae;
				if (ibv_get_async_event(ctx->verbs, &ae) == 0) {
					if (ae.event_type == IBV_EVENT_QP_FATAL || ae.event_type == IBV_EVENT_QP_ACCESS_ERR ||
					    ae.event_type == IBV_EVENT_DEVICE_FATAL || ae.event_type == IBV_EVENT_SRQ_ERR ||
					    ae.event_type == IBV_EVENT_CQ_ERR)
						vlog("async event: %s", ibv_event_type_str(ae.event_type));
					ibv_ack_async_event(&ae);
				}
			} else {
				drain_fd(ctx->wakefd);
			}
		}
		/* tear down drained endpoints */
		for (;;) {
			struct vrpc_verbs_ep *ep;
			pthread_mutex_lock(&ctx->lock);
			ep = ctx->reap;
			if (ep)
				ctx->reap = ep->next_reap;
			pthread_mutex_unlock(&ctx->lock);
			if (!ep)
				break;
			ep_teardown(ep);
		}
		pthread_mutex_lock(&ctx->lock);
		if (ctx->cmd && !ctx->cmd_done) {
			void (*fn)(void *) = ctx->cmd;
			void *arg2 = ctx->cmd_arg;
			pthread_mutex_unlock(&ctx->lock);
			fn(arg2);
			pthread_mutex_lock(&ctx->lock);
			ctx->cmd_done = true;
			pthread_cond_broadcast(&ctx->cond);
		}
		pthread_mutex_unlock(&ctx->lock);
	}
	return NULL;
}

/* Runs fn(arg) on the CM thread (so it cannot race with event handling). */
static void run_on_cm(struct vrpc_verbs_ctx *ctx, void (*fn)(void *), void *arg)
{
	pthread_mutex_lock(&ctx->lock);
	while (ctx->cmd)
		pthread_cond_wait(&ctx->cond, &ctx->lock);
	ctx->cmd = fn;
	ctx->cmd_arg = arg;
	ctx->cmd_done = false;
	wake(ctx->wakefd);
	while (!ctx->cmd_done)
		pthread_cond_wait(&ctx->cond, &ctx->lock);
	ctx->cmd = NULL;
	ctx->cmd_arg = NULL;
	pthread_cond_broadcast(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
}

/* ---- context ----------------------------------------------------------------------------------- */

int vrpc_verbs_ctx_create(const struct sockaddr *local, const struct vrpc_verbs_cfg *cfg, struct vrpc_verbs_ctx **out)
{
	struct vrpc_verbs_ctx *ctx;
	struct epoll_event ee;
	int err, flags;

	if (cfg->credits < 2 || cfg->eager_size == 0 || cfg->ack_timeout < 14 || cfg->retry_cnt > 7 ||
	    cfg->rnr_retry > 7)
		return -EINVAL;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	ctx->cfg = *cfg;
	ctx->debug = env_long("VRPC_VERBS_DEBUG", 0) != 0;
	ctx->epfd = ctx->wakefd = -1;
	pthread_mutex_init(&ctx->lock, NULL);
	pthread_cond_init(&ctx->cond, NULL);
	ctx->ech = rdma_create_event_channel();
	if (!ctx->ech) {
		err = err_errno();
		vlog("rdma_create_event_channel: %s (no RDMA device or no kernel RDMA support?)", strerror(-err));
		goto fail;
	}
	if (local) {
		memcpy(&ctx->local, local, sa_len(local));
		ctx->has_local = true;
		if (rdma_create_id(ctx->ech, &ctx->bind_id, NULL, RDMA_PS_TCP)) {
			err = err_errno();
			goto fail;
		}
		if (rdma_bind_addr(ctx->bind_id, (struct sockaddr *)local)) {
			char a[64];
			err = err_errno();
			addr_str(local, a, sizeof(a));
			vlog("cannot bind to %s: %s (is it an address of an RDMA device's netdev?)", a, strerror(-err));
			goto fail;
		}
		ctx->verbs = ctx->bind_id->verbs;
	}
	if (!ctx->verbs) {
		int n = 0;
		struct ibv_context **list = rdma_get_devices(&n);
		if (list && n > 0)
			ctx->verbs = list[0];
		if (list)
			rdma_free_devices(list);
	}
	if (!ctx->verbs) {
		vlog("no RDMA device found");
		err = -ENODEV;
		goto fail;
	}
	if ((err = vrpc_verbs_err_pos(ibv_query_device(ctx->verbs, &ctx->dattr))))
		goto fail;
	ctx->pd = ibv_alloc_pd(ctx->verbs);
	if (!ctx->pd) {
		err = err_errno();
		goto fail;
	}
	err = slab_create(&ctx->sslab, ctx->pd, cfg->send_bufs, cfg->eager_size, IBV_ACCESS_LOCAL_WRITE);
	if (err)
		goto fail;
	atomic_fetch_add(&ctx->reg_bytes, ctx->sslab.slot * ctx->sslab.n);

	ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
	ctx->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ctx->epfd < 0 || ctx->wakefd < 0) {
		err = err_errno();
		goto fail;
	}
	flags = fcntl(ctx->ech->fd, F_GETFL);
	fcntl(ctx->ech->fd, F_SETFL, flags | O_NONBLOCK);
	flags = fcntl(ctx->verbs->async_fd, F_GETFL);
	fcntl(ctx->verbs->async_fd, F_SETFL, flags | O_NONBLOCK);
	int fds[3] = { ctx->ech->fd, ctx->verbs->async_fd, ctx->wakefd };
	for (int i = 0; i < 3; i++) {
		ee.events = EPOLLIN;
		ee.data.fd = fds[i];
		if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fds[i], &ee)) {
			err = err_errno();
			goto fail;
		}
	}
	err = -pthread_create(&ctx->cm_thread, NULL, cm_main, ctx);
	if (err)
		goto fail;
	ctx->cm_started = true;
	*out = ctx;
	return 0;
fail:
	vrpc_verbs_ctx_destroy(ctx);
	return err;
}

void vrpc_verbs_ctx_destroy(struct vrpc_verbs_ctx *ctx)
{
	if (!ctx)
		return;
	if (ctx->cm_started) {
		/* let the last teardowns run */
		for (int i = 0; i < 400; i++) {
			pthread_mutex_lock(&ctx->lock);
			bool busy = ctx->reap != NULL;
			pthread_mutex_unlock(&ctx->lock);
			if (!busy)
				break;
			usleep(5000);
		}
		atomic_store(&ctx->stop, true);
		wake(ctx->wakefd);
		pthread_join(ctx->cm_thread, NULL);
	}
	if (ctx->sslab.mr)
		atomic_fetch_sub(&ctx->reg_bytes, ctx->sslab.slot * ctx->sslab.n);
	slab_destroy(&ctx->sslab);
	if (ctx->pd)
		ibv_dealloc_pd(ctx->pd);
	if (ctx->bind_id)
		rdma_destroy_id(ctx->bind_id);
	if (ctx->ech)
		rdma_destroy_event_channel(ctx->ech);
	if (ctx->epfd >= 0)
		close(ctx->epfd);
	if (ctx->wakefd >= 0)
		close(ctx->wakefd);
	pthread_mutex_destroy(&ctx->lock);
	pthread_cond_destroy(&ctx->cond);
	free(ctx);
}

size_t vrpc_verbs_ctx_registered_bytes(const struct vrpc_verbs_ctx *ctx)
{
	return atomic_load(&((struct vrpc_verbs_ctx *)ctx)->reg_bytes);
}

const char *vrpc_verbs_ctx_device_name(const struct vrpc_verbs_ctx *ctx)
{
	return ibv_get_device_name(ctx->verbs->device);
}

/* ---- listener ---------------------------------------------------------------------------------- */

int vrpc_verbs_listen(struct vrpc_verbs_ctx *ctx, struct vrpc_verbs_cq *cq, const struct sockaddr *addr,
		      struct vrpc_verbs_listener **out)
{
	struct vrpc_verbs_listener *l = calloc(1, sizeof(*l));
	char a[64];
	int err;
	if (!l)
		return -ENOMEM;
	l->kind = OBJ_LISTENER;
	l->ctx = ctx;
	l->cq = cq;
	pthread_mutex_init(&l->lock, NULL);
	pthread_cond_init(&l->cond, NULL);
	addr_str(addr, a, sizeof(a));
	if (rdma_create_id(ctx->ech, &l->id, l, RDMA_PS_TCP)) {
		err = err_errno();
		goto fail;
	}
	if (rdma_bind_addr(l->id, (struct sockaddr *)addr)) {
		err = err_errno();
		vlog("cannot listen on %s: %s", a, strerror(-err));
		goto fail;
	}
	if (l->id->verbs && l->id->verbs != ctx->verbs) {
		vlog("cannot listen on %s: it belongs to device %s, the context uses %s", a,
		     ibv_get_device_name(l->id->verbs->device), ibv_get_device_name(ctx->verbs->device));
		err = -EXDEV;
		goto fail;
	}
	if (rdma_listen(l->id, 128)) {
		err = err_errno();
		vlog("rdma_listen on %s: %s", a, strerror(-err));
		goto fail;
	}
	*out = l;
	return 0;
fail:
	if (l->id)
		rdma_destroy_id(l->id);
	pthread_mutex_destroy(&l->lock);
	pthread_cond_destroy(&l->cond);
	free(l);
	return err;
}

uint16_t vrpc_verbs_listener_port(const struct vrpc_verbs_listener *l)
{
	return ntohs(rdma_get_src_port(l->id));
}

int vrpc_verbs_accept(struct vrpc_verbs_listener *l, int timeout_ms, struct vrpc_verbs_ep **out)
{
	struct timespec dl;
	int err = 0;
	clock_gettime(CLOCK_REALTIME, &dl);
	if (timeout_ms >= 0) {
		dl.tv_sec += timeout_ms / 1000;
		dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (dl.tv_nsec >= 1000000000) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&l->lock);
	while (!l->accq_head && !l->closing && !err) {
		if (timeout_ms < 0)
			pthread_cond_wait(&l->cond, &l->lock);
		else if (pthread_cond_timedwait(&l->cond, &l->lock, &dl) == ETIMEDOUT)
			err = -ETIMEDOUT;
	}
	if (l->accq_head) {
		struct vrpc_verbs_ep *ep = l->accq_head;
		l->accq_head = ep->next_accept;
		if (!l->accq_head)
			l->accq_tail = NULL;
		pthread_mutex_lock(&ep->lock);
		ep->listener = NULL;
		pthread_mutex_unlock(&ep->lock);
		*out = ep; /* the accept queue's reference becomes the caller's */
		err = 0;
	} else if (!err) {
		err = -ECANCELED;
	}
	pthread_mutex_unlock(&l->lock);
	return err;
}

static void listener_teardown(void *arg)
{
	struct vrpc_verbs_listener *l = arg;
	struct vrpc_verbs_ctx *ctx = l->ctx;
	pthread_mutex_lock(&l->lock);
	l->closing = true;
	pthread_cond_broadcast(&l->cond);
	pthread_mutex_unlock(&l->lock);
	rdma_destroy_id(l->id);
	/* endpoints accepted by rdma_cm but not yet by the user, or mid-handshake */
	for (;;) {
		struct vrpc_verbs_ep *ep;
		pthread_mutex_lock(&ctx->lock);
		for (ep = ctx->all; ep && ep->listener != l; ep = ep->next_all)
			;
		if (ep) {
			vrpc_verbs_ep_get(ep);
			ep->listener = NULL;
		}
		pthread_mutex_unlock(&ctx->lock);
		if (!ep)
			break;
		pthread_mutex_lock(&ep->lock);
		ep->closed_locally = true;
		pthread_mutex_unlock(&ep->lock);
		ep_fail(ep, -ECANCELED, "listener closed before accept");
		vrpc_verbs_ep_put(ep);
	}
}

void vrpc_verbs_listener_destroy(struct vrpc_verbs_listener *l)
{
	if (!l)
		return;
	run_on_cm(l->ctx, listener_teardown, l);
	/* drop the accept queue's references */
	while (l->accq_head) {
		struct vrpc_verbs_ep *ep = l->accq_head;
		l->accq_head = ep->next_accept;
		vrpc_verbs_ep_put(ep);
	}
	pthread_mutex_destroy(&l->lock);
	pthread_cond_destroy(&l->cond);
	free(l);
}

/* ---- connect / close ------------------------------------------------------------------------------ */

int vrpc_verbs_connect(struct vrpc_verbs_ctx *ctx, struct vrpc_verbs_cq *cq, const struct sockaddr *dst,
		       struct vrpc_verbs_ep **out, char *errmsg, size_t errlen)
{
	struct vrpc_verbs_ep *ep;
	struct timespec dl;
	char a[64];
	int err;

	addr_str(dst, a, sizeof(a));
	pthread_mutex_lock(&cq->lock);
	if (cq->granted + ctx->cfg.credits > cq->rslab.n) {
		pthread_mutex_unlock(&cq->lock);
		snprintf(errmsg, errlen, "receive queue of this completion queue is fully granted");
		return -ENOBUFS;
	}
	cq->granted += ctx->cfg.credits;
	pthread_mutex_unlock(&cq->lock);
	ep = ep_new(ctx, cq);
	if (!ep) {
		pthread_mutex_lock(&cq->lock);
		cq->granted -= ctx->cfg.credits;
		pthread_mutex_unlock(&cq->lock);
		return -ENOMEM;
	}
	ep->granted = true; /* released at teardown */
	ep->state = EP_CONNECTING;
	vrpc_verbs_ep_get(ep); /* the caller's reference */
	if (rdma_create_id(ctx->ech, &ep->id, ep, RDMA_PS_TCP)) {
		err = err_errno();
		ep_fail(ep, err, "rdma_create_id: %s", strerror(-err));
	} else if (rdma_resolve_addr(ep->id, ctx->has_local ? (struct sockaddr *)&ctx->local : NULL,
				     (struct sockaddr *)dst, CM_TIMEOUT_MS)) {
		err = err_errno();
		ep_fail(ep, err, "cannot resolve %s: %s", a, strerror(-err));
	}
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += ctx->cfg.connect_timeout_ms / 1000;
	pthread_mutex_lock(&ep->lock);
	ep->closed_locally = true; /* no error callback while connecting: the caller gets it */
	while (ep->state == EP_CONNECTING) {
		if (pthread_cond_timedwait(&ep->cond, &ep->lock, &dl) == ETIMEDOUT)
			break;
	}
	err = ep->state == EP_CONNECTED ? 0 : ep->state == EP_FAILED ? ep->err : -ETIMEDOUT;
	if (!err)
		ep->closed_locally = false;
	else if (errmsg)
		snprintf(errmsg, errlen, "%s: %s", a, ep->state == EP_FAILED ? ep->why : "connect timed out");
	pthread_mutex_unlock(&ep->lock);
	if (err) {
		if (err == -ETIMEDOUT)
			ep_fail(ep, err, "connect timed out");
		vlog("connect to %s failed: %s", a, ep->why);
		vrpc_verbs_ep_put(ep);
		return err;
	}
	*out = ep;
	return 0;
}

void vrpc_verbs_ep_close(struct vrpc_verbs_ep *ep)
{
	pthread_mutex_lock(&ep->lock);
	ep->closed_locally = true;
	/* tell the peer first (DREQ), so its sends see a disconnect rather
	 * than retry timeouts; a healthy endpoint cannot be torn down while we
	 * hold its lock, so the id is valid */
	if (ep->state != EP_FAILED && ep->id)
		rdma_disconnect(ep->id);
	pthread_mutex_unlock(&ep->lock);
	ep_fail(ep, -ECANCELED, "closed locally");
	vrpc_verbs_ep_put(ep);
}

uint32_t vrpc_verbs_ep_eager(const struct vrpc_verbs_ep *ep) { return ep->peer_eager; }
void vrpc_verbs_ep_set_user(struct vrpc_verbs_ep *ep, void *user) { ep->user = user; }
void *vrpc_verbs_ep_user(const struct vrpc_verbs_ep *ep) { return ep->user; }

int vrpc_verbs_ep_error(const struct vrpc_verbs_ep *ep)
{
	struct vrpc_verbs_ep *e = (struct vrpc_verbs_ep *)ep;
	int err;
	pthread_mutex_lock(&e->lock);
	err = e->err;
	pthread_mutex_unlock(&e->lock);
	return err;
}
