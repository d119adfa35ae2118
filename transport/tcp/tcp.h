/* The TCP backend: emulates the verbs model (shared receive queue per CQ,
 * credits, completions) over non-blocking sockets with length-prefixed frames.
 * Senders write straight from the calling thread (writev under the endpoint
 * lock); the CQ's poller reads straight into posted receive buffers, handles
 * credits and failures, and is the only thread that ever produces completions.
 * Wire format: tcp_wire.h. Graceful close is a FIN at a frame boundary.
 *
 * Reads (vrpc_ep_read, vrpc_ep_grant/revoke) are served by the peer's
 * transport: the reader sends READ_REQ (no credit) and readv's the READ_RESP
 * chunks straight into its buffer; the owner checks the request against the
 * transport's grant table and streams the granted memory in read_chunk
 * frames with sendmsg (header + slice, no copy of ours; a gathered grant,
 * vrpc_ep_grant_segs, is one iovec per segment the chunk spans; the
 * memory may be the RPC caller's own), driven by its poller
 * on EPOLLOUT, one chunk at a time round-robin over the endpoint's read jobs,
 * with the endpoint's small frames going first between chunks. Any bad
 * request: READ_ERR, log, the connection fails (-EPROTO), as a bad key kills
 * a verbs connection. docs/design/large-messages.md, section 7.
 *
 * The backend's private header: the objects (transport, endpoint, CQ,
 * listener, grant, read slot and job), the hot helpers shared by its files
 * (static inline, so that send, poll and readv gain no calls) and the
 * functions one file calls in another. One file per object: tcp_tp.c
 * (transport, ops table), tcp_cm.c (connections), tcp_ep.c (endpoints),
 * tcp_cq.c (completion queue, progress), tcp_msg.c (messages), tcp_rma.c
 * (grants, reads), tcp_mr.c (memory registration). Include it first, after
 * _GNU_SOURCE. */
#ifndef VRPC_TRANSPORT_TCP_TCP_H
#define VRPC_TRANSPORT_TCP_TCP_H

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/credit.h"
#include "transport/disconnect.h"
#include "transport/grant.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport_ops.h"

#define HDR_LEN VRPC_TCP_HDR_LEN
#define MAGIC VRPC_TCP_MAGIC
#define VERSION VRPC_TCP_VERSION

#define MAX_EVENTS 64

enum {
    F_DATA = VRPC_TCP_DATA,
    F_CREDIT = VRPC_TCP_CREDIT,
    F_HELLO = VRPC_TCP_HELLO,
    F_HELLO_ACK = VRPC_TCP_HELLO_ACK,
    F_READ_REQ = VRPC_TCP_READ_REQ,
    F_READ_RESP = VRPC_TCP_READ_RESP,
    F_READ_ERR = VRPC_TCP_READ_ERR
};

#define OP_INTERNAL 0u /* frames of our own (credit, read request/error): no completion */

#define READ_REQ_MARK 1u /* priv[P_IMM] of an internal frame that is a slot's READ_REQ */

/* What the body of the frame being received is. */
enum { K_NONE, K_DATA, K_RREQ, K_RRESP };

/* S_ABORTING: vrpc_ep_abort was called; the poller tears it down next pass. */
enum ep_state { S_HANDSHAKE, S_OPEN, S_CLOSING, S_ABORTING, S_DEAD };

/* A queue of buffers linked through vrpc_buf.next. */
struct tcp_fifo {
    struct vrpc_buf *head, *tail;
};

struct tcp_cq;
struct tcp_listener;
struct tcp_ep;

/* Reader side: one vrpc_ep_read in flight. Fields set by vrpc_ep_read under
 * the endpoint lock; done and the receive state by the poller. */
struct tcp_rslot {
    struct vrpc_buf req; /* its READ_REQ frame while queued (internal) */
    char req_space[HDR_LEN + VRPC_TCP_READ_REQ_LEN];
    struct vrpc_buf cpl; /* carries its READ completion */
    struct vrpc_buf *buf;
    uint64_t wr_id;
    uint32_t off, len, done;
    uint16_t gen;     /* tag = gen << 16 | index */
    bool finished;    /* completion staged (under lock) */
    bool queued;      /* req not fully written yet (under lock): no answer can be valid */
    atomic_bool used; /* from vrpc_ep_read until its completion is polled */
};

struct tcp_tp {
    struct vrpc_transport base;
    struct vrpc_grant_table grants; /* the core's (grant.h); ep_grants: VRPC_TCP_TEST_EP_GRANTS */
    bool no_flow_busy;              /* VRPC_TCP_NO_FLOW_BUSY=1 (diagnostics, A/B runs):
                             pollers sleep after their busy window even while
                             a large transfer moves bytes (see tcp_cq_wait) */
};

/* Owner side: one read request of the peer being served (under the endpoint
 * lock). A job holds a reference on its grant until it ends. */
struct tcp_rjob {
    struct vrpc_grant *g;
    uint32_t off; /* next byte to send: offset in the grant's window */
    uint32_t left, tag;
    struct tcp_rjob *next;
};

struct tcp_ep {
    struct vrpc_ep base;
    struct tcp_cq *cq;
    atomic_int state; /* enum ep_state; changed under lock */
    int fd;           /* -1 once dead; closed by the poller under lock */

    /* Send side, under lock (any thread). */
    pthread_mutex_t lock;
    struct tcp_fifo wq;    /* admitted frames (header built), not fully written */
    uint32_t wq_off;       /* bytes of wq.head already written */
    struct tcp_fifo waitq; /* sends waiting for credits, in order */
    uint32_t nwait, max_queued;
    uint32_t send_credits; /* messages we may still send */
    atomic_bool pollout;   /* EPOLLOUT armed (written under lock; the poller peeks without) */
    bool shut_wr;
    bool werr;
    bool ctrl_queued;
    struct vrpc_buf ctrl; /* the one pending credit-only frame */
    char ctrl_space[HDR_LEN];
    _Atomic uint64_t close_ns; /* when vrpc_ep_close was called, 0 if not */
    int abort_status;          /* vrpc_ep_abort's status (under lock, set once) */
    struct tcp_ep *xnext;      /* abort list (MPSC) */
    _Atomic uint64_t wait_ns;  /* sends wait for credits since (the last credits
                                  that arrived), 0: none waits */

    /* Reads, under lock. Reader: slots (allocated at the first read). */
    struct tcp_rslot *rslots;
    unsigned nrslots;
    atomic_uint nreads;       /* slots in use; while nonzero the poller reads headers alone */
    _Atomic uint64_t read_ns; /* last progress of our reads (a read issued, a chunk in) */
    /* Owner: jobs (allocated at the first request), round-robin list, the
     * chunk being written (cur: its job; header and payload bytes written). */
    struct tcp_rjob *jobs, *jfree, *jhead, *jtail;
    unsigned njobs;
    struct tcp_rjob *cur;
    uint32_t cur_len, cur_off;
    uint64_t chunk_bytes; /* READ_RESP bytes written, ever (pump: did it move?) */
    char cur_hdr[HDR_LEN];
    bool err_queued;
    struct vrpc_grant_ep gr; /* its grants (under the grant table lock) */
    bool pump_queued;        /* on cq->pumpq (poller) */
    bool pumping;            /* vrpc_tcp_rma_pump() is streaming (under lock): it arms
                               EPOLLOUT itself if it stops with jobs left */
    struct tcp_ep *pnext;
    struct vrpc_buf errf; /* the one READ_ERR frame */
    char err_space[HDR_LEN];

    /* Receive side and accounting: poller only. */
    union {
        struct vrpc_tcp_hdr h;
        uint8_t b[HDR_LEN];
    } rhdr;
    uint32_t rhdr_got;
    struct vrpc_buf *rbuf;   /* posted buffer being filled (K_DATA) */
    char *rdst;              /* where the current frame's body goes; NULL between frames */
    uint8_t rkind;           /* K_* of that body */
    struct tcp_rslot *rslot; /* K_RRESP: the read it belongs to */
    union {
        struct vrpc_tcp_read_req r;
        uint8_t b[VRPC_TCP_READ_REQ_LEN];
    } rreq; /* K_RREQ body */
    uint32_t rgot, rlen, rimm;
    uint32_t lowat;           /* SO_RCVLOWAT set on fd (rx_lowat); 0: the default (1) */
    char why[160];            /* a formatted reason for teardown's log line */
    uint64_t frame_ns;        /* when the current partial frame (or handshake) began; 0: idle */
    struct vrpc_credit_ep cr; /* credits (the core's, credit.h; poller, credit_ret any thread) */
    bool reported;            /* the user knows it (connect returned / ACCEPTED) */
    int disc_status;
    struct tcp_ep *prev, *next;   /* all endpoints of the CQ */
    struct tcp_ep *anext;         /* adopt list (MPSC) */
    struct tcp_ep *dnext;         /* dead list / free list */
    struct tcp_listener *lst;     /* while handshaking on the accept side */
    struct tcp_listener *counted; /* accepted: counted in its nconns (holds a ref) */
    uint64_t accept_user;
    struct vrpc_buf ev_acc, ev_disc; /* pseudo-buffers carrying the lifecycle completions */
};

#define TCP_RX_CARRY (64u << 10) /* tcp_cq.carry */

struct tcp_cq {
    struct vrpc_cq base;
    int epfd, evfd;
    atomic_int sleeping;                  /* poller armed: producers must kick evfd */
    _Atomic(struct vrpc_buf *) done;      /* MPSC: finished sends and flushes (LIFO) */
    _Atomic(struct vrpc_buf *) posted_in; /* MPSC: newly posted receives (LIFO) */
    _Atomic(struct tcp_ep *) adopt;       /* MPSC: new endpoints for this poller */
    _Atomic(struct tcp_ep *) aborts;      /* MPSC: aborted endpoints, each holding a reference */
    struct vrpc_credit_pool cr;           /* receive accounting, hungry list (credit.h) */

    /* Poller only. */
    struct vrpc_buf *free; /* posted receive buffers at hand (stack) */
    struct tcp_fifo out;   /* staged completions */
    struct tcp_ep *eps;    /* every adopted endpoint */
    unsigned neps;
    struct tcp_ep *dead;  /* torn down this pass: DISCONNECTED after the drain */
    struct tcp_ep *reap;  /* never reported: free after this pass */
    struct tcp_ep *pumpq; /* got read requests this pass: pump them (empty between passes) */
    struct epoll_event ev[MAX_EVENTS];
    int nev;        /* stashed by cq_wait for the next cq_poll */
    unsigned polls; /* busy polls, for DIRECT_EPOLL_EVERY */
    uint64_t next_scan;
    uint64_t flow_ns; /* last time a large transfer moved bytes
                                         here (READ_RESP in, or a chunk out) */
    /* The tail of a read: the bytes after the frame being read, when the
     * peer has more queued (tcp_cq.c, rx_frames), parsed on from here. */
    char *carry; /* TCP_RX_CARRY bytes, allocated with the CQ */
};

struct tcp_listener {
    struct vrpc_listener base;
    int fd, evfd;
    pthread_t thread;
    bool started;
    struct tcp_cq **cqs;
    unsigned ncqs, rr;
    uint64_t user;
    atomic_int refs; /* the owner's + one per handshaking or counted endpoint */
    atomic_bool closed;
    unsigned max_conns; /* vrpc_listen_attr.max_conns, 0: no limit */
    atomic_uint nconns; /* accepted (handshake done) and not torn down */
};

/* Every connection keeps a reservation of at least MIN_RESV promised
 * receives; a CQ that cannot reserve that many refuses the connection
 * (the credit core's min_resv for TCP, credit.h). */
#define MIN_RESV 2u

/* ---- functions shared between the files (names: vrpc_tcp_<object>_) ------ */

/* A name ending in _locked wants ep->lock held; a function taking a tcp_cq
 * runs on that CQ's poller (teardown, pump, the receive handlers); the ops
 * (named in tcp_tp.c's table) keep the contracts of transport_ops.h. Each
 * definition says more. */

/* messages (tcp_msg.c): framing, the tx queue and writev, credit-only frames */
void vrpc_tcp_msg_tx_locked(struct tcp_ep *ep);
void vrpc_tcp_msg_flush_locked(struct tcp_ep *ep);
void vrpc_tcp_msg_credit_send(struct vrpc_credit_ep *e);
int vrpc_tcp_msg_send(struct vrpc_ep *base, struct vrpc_buf *b, uint32_t len, uint32_t imm, uint64_t wr_id,
                      unsigned flags);
int vrpc_tcp_msg_send_list(struct vrpc_ep *base, const struct vrpc_send_wr *wrs, unsigned n, unsigned *sent);

/* endpoints (tcp_ep.c): state, close/abort, teardown, idle timeouts */
struct tcp_ep *vrpc_tcp_ep_alloc(struct vrpc_transport *tp, struct tcp_cq *cq, int fd, void *user, int refs);
void vrpc_tcp_ep_free(struct vrpc_ep *base);
int vrpc_tcp_ep_close(struct vrpc_ep *base);
int vrpc_tcp_ep_abort(struct vrpc_ep *base, int status);
void vrpc_tcp_ep_run_aborts(struct tcp_cq *cq, struct tcp_ep *ep);
void vrpc_tcp_ep_teardown(struct tcp_cq *cq, struct tcp_ep *ep, int status, const char *why);
void vrpc_tcp_ep_teardown_eof(struct tcp_cq *cq, struct tcp_ep *ep);
void vrpc_tcp_ep_scan_timeouts(struct tcp_cq *cq, uint64_t now);

/* completion queue and progress (tcp_cq.c): the ops of a CQ */
int vrpc_tcp_cq_poll(struct vrpc_cq *base, struct vrpc_wc *wc, unsigned max);
void vrpc_tcp_cq_arm(struct vrpc_cq *base);
void vrpc_tcp_cq_wait(struct vrpc_cq *base, int timeout_ms);
void vrpc_tcp_cq_kick(struct vrpc_cq *base);
void vrpc_tcp_cq_flush(struct vrpc_cq *base);
int vrpc_tcp_cq_post_recv(struct vrpc_cq *base, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n);
void vrpc_tcp_cq_destroy(struct vrpc_cq *base);
int vrpc_tcp_cq_create(struct vrpc_transport *tp, const struct vrpc_cq_attr *attr, struct vrpc_cq **out);

/* connection management (tcp_cm.c): listen, accept, connect, the HELLO handshake */
int vrpc_tcp_cm_handle_hello(struct tcp_cq *cq, struct tcp_ep *ep, const struct vrpc_tcp_hdr *h, const char **why);
int vrpc_tcp_cm_connect(struct vrpc_transport *tp, const struct vrpc_addr *dst, const struct vrpc_addr *src,
                        const struct vrpc_ep_attr *attr, struct vrpc_ep **out);
void vrpc_tcp_cm_listener_unref(struct tcp_listener *l);
void vrpc_tcp_cm_listener_destroy(struct vrpc_listener *base);
int vrpc_tcp_cm_listen(struct vrpc_transport *tp, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
                       struct vrpc_listener **out);

/* grants and reads (tcp_rma.c): the grant table, READ_REQ/READ_RESP/READ_ERR on both sides */
bool vrpc_tcp_rma_tx_chunk_locked(struct tcp_ep *ep);
void vrpc_tcp_rma_grant_complete(struct vrpc_grant *g, int status);
int vrpc_tcp_rma_grant(struct vrpc_ep *base, struct vrpc_mr *mr, const void *addr, uint32_t len, uint32_t *rkey);
int vrpc_tcp_rma_grant_segs(struct vrpc_ep *base, const struct vrpc_seg *segs, unsigned n, uint32_t len,
                            uint32_t *rkey);
int vrpc_tcp_rma_revoke(struct vrpc_ep *base, uint32_t rkey, uint64_t wr_id);
void vrpc_tcp_rma_grants_ep_dead(struct tcp_ep *ep);
int vrpc_tcp_rma_read(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr,
                      uint32_t rkey, uint64_t wr_id);
void vrpc_tcp_rma_complete_read(struct tcp_cq *cq, struct tcp_ep *ep, struct tcp_rslot *s, int status);
void vrpc_tcp_rma_flush_reads(struct tcp_cq *cq, struct tcp_ep *ep);
void vrpc_tcp_rma_drop_jobs_locked(struct tcp_ep *ep);
void vrpc_tcp_rma_pump(struct tcp_cq *cq, struct tcp_ep *ep);
int vrpc_tcp_rma_handle_read_req(struct tcp_ep *ep, const char **why);
int vrpc_tcp_rma_handle_read_hdr(struct tcp_cq *cq, struct tcp_ep *ep, uint8_t type, uint32_t len, uint32_t tag,
                                 const char **why);

/* memory registration (tcp_mr.c) */
int vrpc_tcp_mr_reg(struct vrpc_transport *tp, void *addr, size_t len, unsigned access, struct vrpc_mr **out);
void vrpc_tcp_mr_dereg(struct vrpc_mr *mr);

/* Completion encoding in vrpc_buf.priv while staged. */
enum { P_WRID, P_EP, P_OPST, P_IMM };

static inline void tcp_cq_stage_fill(struct vrpc_buf *b, uint32_t op, int status, struct tcp_ep *ep, uint32_t imm)
{
    b->priv[P_EP] = (uint64_t)(uintptr_t)ep;
    b->priv[P_OPST] = op | (uint64_t)(uint32_t)status << 32;
    b->priv[P_IMM] = imm;
}

static inline void tcp_fifo_push(struct tcp_fifo *f, struct vrpc_buf *b)
{
    b->next = NULL;
    if (f->tail)
        f->tail->next = b;
    else
        f->head = b;
    f->tail = b;
}

static inline struct vrpc_buf *tcp_fifo_pop(struct tcp_fifo *f)
{
    struct vrpc_buf *b = f->head;
    if (b) {
        f->head = b->next;
        if (!f->head)
            f->tail = NULL;
        b->next = NULL;
    }
    return b;
}

/* ---- poller wake-up --------------------------------------------------------- */

/* Any thread, after publishing work for the poller. Pairs with cq_arm: the
 * producer publishes then reads sleeping, the poller sets sleeping then reads
 * the lists (all seq_cst), so one of them always sees the other. */
static inline void tcp_cq_wake(struct tcp_cq *cq)
{
    uint64_t one = 1;
    if (atomic_load(&cq->sleeping) && atomic_exchange(&cq->sleeping, 0)) {
        ssize_t r = write(cq->evfd, &one, sizeof one);
        (void)r;
    }
}

/* Push a chain first..last (linked by next) onto an MPSC LIFO. */
static inline void tcp_mpsc_push(_Atomic(struct vrpc_buf *) *head, struct vrpc_buf *first, struct vrpc_buf *last)
{
    struct vrpc_buf *old = atomic_load(head);
    do
        last->next = old;
    while (!atomic_compare_exchange_weak(head, &old, first));
}

/* Take a whole MPSC LIFO and return it in FIFO order. */
static inline struct vrpc_buf *tcp_mpsc_take_fifo(_Atomic(struct vrpc_buf *) *head)
{
    struct vrpc_buf *b = atomic_exchange(head, NULL), *r = NULL, *n;
    for (; b; b = n) {
        n = b->next;
        b->next = r;
        r = b;
    }
    return r;
}

static inline void tcp_msg_build_hdr(void *at, uint32_t type, uint32_t len, uint32_t imm, uint32_t credits)
{
    struct vrpc_tcp_hdr h = vrpc_tcp_hdr_make((uint8_t)type, len, imm, (uint16_t)credits);
    memcpy(at, &h, sizeof h);
}

static inline void tcp_ep_set_pollout_locked(struct tcp_ep *ep, bool on)
{
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.ptr = ep};
    if (ep->pollout == on || ep->fd < 0)
        return;
    ep->pollout = on;
    epoll_ctl(ep->cq->epfd, EPOLL_CTL_MOD, ep->fd, &e);
}

static inline struct tcp_tp *tcp_tp_of(struct tcp_ep *ep) { return container_of(ep->base.tp, struct tcp_tp, base); }

static inline void tcp_cq_take_posted(struct tcp_cq *cq)
{
    struct vrpc_buf *b = atomic_exchange(&cq->posted_in, NULL), *n;
    for (; b; b = n) {
        n = b->next;
        b->next = cq->free;
        cq->free = b;
    }
}

static inline struct vrpc_buf *tcp_cq_get_posted(struct tcp_cq *cq)
{
    struct vrpc_buf *b;
    if (!cq->free)
        tcp_cq_take_posted(cq);
    b = cq->free;
    if (b)
        cq->free = b->next;
    return b;
}

static inline void tcp_cq_put_posted(struct tcp_cq *cq, struct vrpc_buf *b)
{
    b->next = cq->free;
    cq->free = b;
}

static inline void tcp_cq_stage(struct tcp_cq *cq, struct vrpc_buf *b) { tcp_fifo_push(&cq->out, b); }

/* Give b (len, imm in place) its header and credits, and queue it for the wire. */
static inline void tcp_msg_admit_locked(struct tcp_ep *ep, struct vrpc_buf *b)
{
    ep->send_credits--;
    tcp_msg_build_hdr((char *)b->data - HDR_LEN, F_DATA, b->len, (uint32_t)b->priv[P_IMM],
                      vrpc_credit_take_ret(&ep->cr));
    tcp_fifo_push(&ep->wq, b);
}

/* Credits arrived: admit waiting sends in order, then write. */
static inline void tcp_msg_add_credits_locked(struct tcp_ep *ep, uint32_t c)
{
    ep->send_credits += c;
    while (ep->send_credits && ep->waitq.head) {
        ep->nwait--;
        tcp_msg_admit_locked(ep, tcp_fifo_pop(&ep->waitq));
    }
    /* the peer is returning credits: what still waits starts a new clock
     * (no store on the common path, where nothing waited) */
    if (ep->waitq.head)
        atomic_store_explicit(&ep->wait_ns, vrpc_tp_now_ns(), memory_order_relaxed);
    else if (atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
        atomic_store_explicit(&ep->wait_ns, 0, memory_order_relaxed);
    vrpc_tcp_msg_tx_locked(ep);
}

#endif /* VRPC_TRANSPORT_TCP_TCP_H */
