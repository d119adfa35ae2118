/* The verbs backend's engine: RC queue pairs over rdma_cm, one shared receive
 * queue and one poller thread per completion queue, registered slab pools,
 * credit-based flow control. Private to transport/verbs/; the ops table in
 * verbs_ops.c adapts it to the transport interface.
 *
 * rdma-core's three error conventions (positive errno, NULL + errno,
 * -1 + errno) are converted to 0 / -errno in this folder only. */
#ifndef VRPC_TRANSPORT_VERBS_H
#define VRPC_TRANSPORT_VERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Wire protocol version carried in the connect private data. */
#define VRPC_VERBS_PROTO_VERSION 1u

struct vrpc_verbs_ctx;
struct vrpc_verbs_cq;
struct vrpc_verbs_ep;
struct vrpc_verbs_listener;

struct vrpc_verbs_cfg {
	uint32_t eager_size;   /* largest payload of one message, bytes */
	uint16_t credits;      /* receive buffers granted to each peer (window) */
	uint32_t recv_bufs;    /* receive buffers in each CQ's shared receive queue */
	uint32_t send_bufs;    /* registered send buffers per context */
	uint8_t rnr_retry;     /* 0 in the tests: credits must make RNR impossible */
	uint8_t ack_timeout;   /* QP local ACK timeout exponent, at least 14 */
	uint8_t retry_cnt;     /* transport retries, 7 */
	int gid_index;         /* -1: the GID rdma_cm picked from the address */
	uint32_t busy_poll_us; /* poller spins this long before arming and sleeping */
	uint32_t connect_timeout_ms;
	uint16_t proto_version; /* VRPC_VERBS_PROTO_VERSION except in tests */
};

/* Defaults, then the environment: VRPC_VERBS_GID_INDEX, VRPC_VERBS_RNR_RETRY,
 * VRPC_VERBS_BUSY_POLL_US override the matching fields. */
void vrpc_verbs_cfg_default(struct vrpc_verbs_cfg *cfg);

enum vrpc_verbs_op { VRPC_VERBS_OP_SEND = 1, VRPC_VERBS_OP_RECV = 2 };

/* One completion, as handed to the CQ's callback on its poller thread.
 * status 0 = success, else a negative errno (-ECANCELED: flushed because the
 * endpoint closed or failed). For RECV, buf points at the payload; the
 * receiver owns the buffer until it gives it back with
 * vrpc_verbs_recv_release(). For SEND, buf is the caller's send buffer, which
 * is the caller's again. */
struct vrpc_verbs_wc {
	struct vrpc_verbs_ep *ep;
	uint64_t wr_id;
	enum vrpc_verbs_op op;
	int status;
	uint32_t byte_len;
	uint32_t imm;
	void *buf;
};
typedef void (*vrpc_verbs_cq_cb)(void *arg, const struct vrpc_verbs_wc *wc);
/* Called once per endpoint (on the CM or poller thread) when it fails or the
 * peer disconnects; err is a negative errno, why a readable reason. */
typedef void (*vrpc_verbs_ep_err_cb)(void *arg, struct vrpc_verbs_ep *ep, int err, const char *why);

/* Context: one device, picked by the local address `local` (NULL: the first
 * device rdma_cm lists). Owns the PD, the send slab and the CM thread. */
int vrpc_verbs_ctx_create(const struct sockaddr *local, const struct vrpc_verbs_cfg *cfg,
			  struct vrpc_verbs_ctx **out);
void vrpc_verbs_ctx_destroy(struct vrpc_verbs_ctx *ctx);
/* Bytes of memory registered with the device (slabs of every pool). */
size_t vrpc_verbs_ctx_registered_bytes(const struct vrpc_verbs_ctx *ctx);
const char *vrpc_verbs_ctx_device_name(const struct vrpc_verbs_ctx *ctx);

/* Completion queue + its shared receive queue + its poller thread. */
int vrpc_verbs_cq_create(struct vrpc_verbs_ctx *ctx, vrpc_verbs_cq_cb cb, vrpc_verbs_ep_err_cb ecb,
			 void *arg, struct vrpc_verbs_cq **out);
void vrpc_verbs_cq_destroy(struct vrpc_verbs_cq *cq);

/* Send buffers: eager_size bytes each, from the context's registered slab.
 * get returns -ENOBUFS when the slab is empty. */
int vrpc_verbs_buf_get(struct vrpc_verbs_ctx *ctx, void **buf);
void vrpc_verbs_buf_put(struct vrpc_verbs_ctx *ctx, void *buf);
/* Gives a received buffer back; it is reposted to the SRQ in a batch and its
 * credit returned to the endpoint that filled it. Any thread. */
void vrpc_verbs_recv_release(struct vrpc_verbs_cq *cq, void *buf);

int vrpc_verbs_listen(struct vrpc_verbs_ctx *ctx, struct vrpc_verbs_cq *cq, const struct sockaddr *addr,
		      struct vrpc_verbs_listener **out);
/* Port the listener is bound to (host order). */
uint16_t vrpc_verbs_listener_port(const struct vrpc_verbs_listener *l);
/* Waits up to timeout_ms (-1 forever) for an established connection.
 * -ETIMEDOUT, -ECANCELED after listener close. */
int vrpc_verbs_accept(struct vrpc_verbs_listener *l, int timeout_ms, struct vrpc_verbs_ep **out);
/* Closes the listener; established but unaccepted endpoints are closed. */
void vrpc_verbs_listener_destroy(struct vrpc_verbs_listener *l);

/* Blocking connect from the context's address. Errors: -ECONNREFUSED (no
 * listener, or rejected: the reason is logged and in errmsg), -EPROTO
 * (protocol mismatch), -EHOSTUNREACH, -ETIMEDOUT, -ENETUNREACH. */
int vrpc_verbs_connect(struct vrpc_verbs_ctx *ctx, struct vrpc_verbs_cq *cq, const struct sockaddr *dst,
		       struct vrpc_verbs_ep **out, char *errmsg, size_t errlen);

/* Sends len bytes of buf (a buffer from vrpc_verbs_buf_get) with immediate
 * imm. The buffer belongs to the endpoint until its SEND completion. Without
 * credits the send is queued (order kept); -EAGAIN when that queue is full,
 * -ENOTCONN / the endpoint's error once it failed. */
int vrpc_verbs_send(struct vrpc_verbs_ep *ep, void *buf, uint32_t len, uint32_t imm, uint64_t wr_id);
/* Disconnects; every posted or queued buffer then completes exactly once
 * with -ECANCELED. The endpoint is freed after its last completion and the
 * last vrpc_verbs_ep_put. */
void vrpc_verbs_ep_close(struct vrpc_verbs_ep *ep);
void vrpc_verbs_ep_get(struct vrpc_verbs_ep *ep);
void vrpc_verbs_ep_put(struct vrpc_verbs_ep *ep);
/* Peer's window and eager size as negotiated. */
uint32_t vrpc_verbs_ep_eager(const struct vrpc_verbs_ep *ep);
void vrpc_verbs_ep_set_user(struct vrpc_verbs_ep *ep, void *user);
void *vrpc_verbs_ep_user(const struct vrpc_verbs_ep *ep);
/* 0 while healthy, else the negative errno that failed it. */
int vrpc_verbs_ep_error(const struct vrpc_verbs_ep *ep);

/* Converts an rdma-core return to ours: the three conventions. */
static inline int vrpc_verbs_err_pos(int rc) { return rc > 0 ? -rc : rc; }

#endif
