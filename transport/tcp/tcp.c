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
 * a verbs connection. docs/design/large-messages.md, section 7. */
#define _GNU_SOURCE
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
#include "transport/tcp/tcp_wire.h"
#include "transport/transport_ops.h"

#define HDR_LEN VRPC_TCP_HDR_LEN
#define MAGIC VRPC_TCP_MAGIC
#define VERSION VRPC_TCP_VERSION
#define MAX_IOV 64
#define MAX_EVENTS 64
#define SCAN_NS 100000000ull /* how often the poller checks timeouts */
#define DIRECT_EPS 4         /* a busy-polling CQ with at most this many endpoints reads them directly */
#define DIRECT_EPOLL_EVERY 16 /* ... and still asks epoll every so many polls */

enum { F_DATA = VRPC_TCP_DATA, F_CREDIT = VRPC_TCP_CREDIT, F_HELLO = VRPC_TCP_HELLO, F_HELLO_ACK = VRPC_TCP_HELLO_ACK,
       F_READ_REQ = VRPC_TCP_READ_REQ, F_READ_RESP = VRPC_TCP_READ_RESP, F_READ_ERR = VRPC_TCP_READ_ERR };

#define OP_INTERNAL 0u                    /* frames of our own (credit, read request/error): no completion */
#define READ_CHUNK_DEFAULT (256u << 10)   /* bytes per READ_RESP frame */
#define PUMP_CHUNKS 16                    /* chunks one EPOLLOUT event streams at most */
#define READ_REQ_MARK 1u                  /* priv[P_IMM] of an internal frame that is a slot's READ_REQ */

/* What the body of the frame being received is. */
enum { K_NONE, K_DATA, K_RREQ, K_RRESP };

/* S_ABORTING: vrpc_ep_abort was called; the poller tears it down next pass. */
enum ep_state { S_HANDSHAKE, S_OPEN, S_CLOSING, S_ABORTING, S_DEAD };

/* A queue of buffers linked through vrpc_buf.next. */
struct fifo {
    struct vrpc_buf *head, *tail;
};

struct tcp_cq;
struct tcp_listener;
struct tcp_ep;

/* Reader side: one vrpc_ep_read in flight. Fields set by vrpc_ep_read under
 * the endpoint lock; done and the receive state by the poller. */
struct rslot {
    struct vrpc_buf req; /* its READ_REQ frame while queued (internal) */
    char req_space[HDR_LEN + VRPC_TCP_READ_REQ_LEN];
    struct vrpc_buf cpl; /* carries its READ completion */
    struct vrpc_buf *buf;
    uint64_t wr_id;
    uint32_t off, len, done;
    uint16_t gen;        /* tag = gen << 16 | index */
    bool finished;       /* completion staged (under lock) */
    bool queued;         /* req not fully written yet (under lock): no answer can be valid */
    atomic_bool used;    /* from vrpc_ep_read until its completion is polled */
};

/* Grant table entry (transport-wide, under tcp_tp.gmu). Entries never move.
 * G_ORPHAN: its endpoint died while a job still streamed from it; freed when
 * the last job lets go (never reused while a reference may read segs). */
enum { G_FREE, G_LIVE, G_REVOKING, G_DONE, G_ORPHAN };

struct grant {
    struct vrpc_buf cpl;   /* carries the REVOKE completion */
    struct tcp_ep *ep;     /* the only endpoint whose peer may use the key */
    const char *addr;      /* where the window starts for the peer (segs[0]) */
    uint32_t len;          /* window length: the sum of the segments */
    uint32_t nsegs;
    struct vrpc_seg segs[VRPC_GRANT_SEGS_MAX]; /* set at grant, read by jobs holding a reference */
    uint32_t refs;         /* read jobs streaming from it */
    uint32_t idx;          /* its own index */
    uint32_t next_free;    /* index + 1 of the next free entry, 0: none */
    uint8_t gen;           /* key = index << 8 | gen, gen never 0 */
    uint8_t state;
    int status;            /* of the REVOKE completion, once revoked */
    uint64_t wr_id;
};

#define GBLOCK 1024u
#define GMAX_BLOCKS 1024u /* at most 1 Mi grants alive per transport */

struct tcp_tp {
    struct vrpc_transport base;
    pthread_mutex_t gmu;
    struct grant *blocks[GMAX_BLOCKS];
    uint32_t nblocks, hw; /* hw: entries ever used */
    uint32_t free_head;   /* index + 1, 0: none */
    uint32_t ep_grants;   /* most live grants per endpoint, 0: no limit (test
                             only: VRPC_TCP_TEST_EP_GRANTS, forces -ENOSPC) */
    bool no_flow_busy;    /* VRPC_TCP_NO_FLOW_BUSY=1 (diagnostics, A/B runs):
                             pollers sleep after their busy window even while
                             a large transfer moves bytes (see tcp_cq_wait) */
};

/* Owner side: one read request of the peer being served (under the endpoint
 * lock). A job holds a reference on its grant until it ends. */
struct rjob {
    struct grant *g;
    uint32_t off;  /* next byte to send: offset in the grant's window */
    uint32_t left, tag;
    struct rjob *next;
};

struct tcp_ep {
    struct vrpc_ep base;
    struct tcp_cq *cq;
    atomic_int state;   /* enum ep_state; changed under lock */
    int fd;             /* -1 once dead; closed by the poller under lock */

    /* Send side, under lock (any thread). */
    pthread_mutex_t lock;
    struct fifo wq;       /* admitted frames (header built), not fully written */
    uint32_t wq_off;      /* bytes of wq.head already written */
    struct fifo waitq;    /* sends waiting for credits, in order */
    uint32_t nwait, max_queued;
    uint32_t send_credits; /* messages we may still send */
    atomic_bool pollout;   /* EPOLLOUT armed (written under lock; the poller peeks without) */
    bool shut_wr;
    bool werr;
    bool ctrl_queued;
    struct vrpc_buf ctrl;  /* the one pending credit-only frame */
    char ctrl_space[HDR_LEN];
    _Atomic uint64_t close_ns; /* when vrpc_ep_close was called, 0 if not */
    int abort_status;          /* vrpc_ep_abort's status (under lock, set once) */
    struct tcp_ep *xnext;      /* abort list (MPSC) */
    _Atomic uint64_t wait_ns;  /* sends wait for credits since (the last credits
                                  that arrived), 0: none waits */

    /* Reads, under lock. Reader: slots (allocated at the first read). */
    struct rslot *rslots;
    unsigned nrslots;
    atomic_uint nreads;     /* slots in use; while nonzero the poller reads headers alone */
    _Atomic uint64_t read_ns; /* last progress of our reads (a read issued, a chunk in) */
    /* Owner: jobs (allocated at the first request), round-robin list, the
     * chunk being written (cur: its job; header and payload bytes written). */
    struct rjob *jobs, *jfree, *jhead, *jtail;
    unsigned njobs;
    struct rjob *cur;
    uint32_t cur_len, cur_off;
    uint64_t chunk_bytes;   /* READ_RESP bytes written, ever (pump: did it move?) */
    char cur_hdr[HDR_LEN];
    bool err_queued;
    bool granted_any;       /* under the grant table lock */
    uint32_t ngrants;       /* grants not freed yet (under the grant table lock) */
    bool pump_queued;       /* on cq->pumpq (poller) */
    bool pumping;           /* pump() is streaming (under lock): it arms
                               EPOLLOUT itself if it stops with jobs left */
    struct tcp_ep *pnext;
    struct vrpc_buf errf;   /* the one READ_ERR frame */
    char err_space[HDR_LEN];

    /* Receive side and accounting: poller only. */
    union {
        struct vrpc_tcp_hdr h;
        uint8_t b[HDR_LEN];
    } rhdr;
    uint32_t rhdr_got;
    struct vrpc_buf *rbuf; /* posted buffer being filled (K_DATA) */
    char *rdst;            /* where the current frame's body goes; NULL between frames */
    uint8_t rkind;         /* K_* of that body */
    struct rslot *rslot;   /* K_RRESP: the read it belongs to */
    union {
        struct vrpc_tcp_read_req r;
        uint8_t b[VRPC_TCP_READ_REQ_LEN];
    } rreq;                /* K_RREQ body */
    uint32_t rgot, rlen, rimm;
    char why[160];         /* a formatted reason for teardown's log line */
    uint64_t frame_ns;     /* when the current partial frame (or handshake) began; 0: idle */
    struct vrpc_credit_ep cr; /* credits (the core's, credit.h; poller, credit_ret any thread) */
    bool reported;         /* the user knows it (connect returned / ACCEPTED) */
    int disc_status;
    struct tcp_ep *prev, *next;    /* all endpoints of the CQ */
    struct tcp_ep *anext;          /* adopt list (MPSC) */
    struct tcp_ep *dnext;          /* dead list / free list */
    struct tcp_listener *lst;      /* while handshaking on the accept side */
    struct tcp_listener *counted;  /* accepted: counted in its nconns (holds a ref) */
    uint64_t accept_user;
    struct vrpc_buf ev_acc, ev_disc; /* pseudo-buffers carrying the lifecycle completions */
};

struct tcp_cq {
    struct vrpc_cq base;
    int epfd, evfd;
    atomic_int sleeping;              /* poller armed: producers must kick evfd */
    _Atomic(struct vrpc_buf *) done;  /* MPSC: finished sends and flushes (LIFO) */
    _Atomic(struct vrpc_buf *) posted_in; /* MPSC: newly posted receives (LIFO) */
    _Atomic(struct tcp_ep *) adopt;   /* MPSC: new endpoints for this poller */
    _Atomic(struct tcp_ep *) aborts;  /* MPSC: aborted endpoints, each holding a reference */
    struct vrpc_credit_pool cr;       /* receive accounting, hungry list (credit.h) */

    /* Poller only. */
    struct vrpc_buf *free;            /* posted receive buffers at hand (stack) */
    struct fifo out;                  /* staged completions */
    struct tcp_ep *eps;               /* every adopted endpoint */
    unsigned neps;
    struct tcp_ep *dead;              /* torn down this pass: DISCONNECTED after the drain */
    struct tcp_ep *reap;              /* never reported: free after this pass */
    struct tcp_ep *pumpq;             /* got read requests this pass: pump them (empty between passes) */
    struct epoll_event ev[MAX_EVENTS];
    int nev;                          /* stashed by cq_wait for the next cq_poll */
    unsigned polls;                   /* busy polls, for DIRECT_EPOLL_EVERY */
    uint64_t next_scan;
    uint64_t flow_ns;                 /* last time a large transfer moved bytes
                                         here (READ_RESP in, or a chunk out) */
};

struct tcp_listener {
    struct vrpc_listener base;
    int fd, evfd;
    pthread_t thread;
    bool started;
    struct tcp_cq **cqs;
    unsigned ncqs, rr;
    uint64_t user;
    atomic_int refs;     /* the owner's + one per handshaking or counted endpoint */
    atomic_bool closed;
    unsigned max_conns;  /* vrpc_listen_attr.max_conns, 0: no limit */
    atomic_uint nconns;  /* accepted (handshake done) and not torn down */
};

/* Completion encoding in vrpc_buf.priv while staged. */
enum { P_WRID, P_EP, P_OPST, P_IMM };

static void stage_fill(struct vrpc_buf *b, uint32_t op, int status, struct tcp_ep *ep, uint32_t imm)
{
    b->priv[P_EP] = (uint64_t)(uintptr_t)ep;
    b->priv[P_OPST] = op | (uint64_t)(uint32_t)status << 32;
    b->priv[P_IMM] = imm;
}

static void fifo_push(struct fifo *f, struct vrpc_buf *b)
{
    b->next = NULL;
    if (f->tail)
        f->tail->next = b;
    else
        f->head = b;
    f->tail = b;
}

static struct vrpc_buf *fifo_pop(struct fifo *f)
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
static void kick(struct tcp_cq *cq)
{
    uint64_t one = 1;
    if (atomic_load(&cq->sleeping) && atomic_exchange(&cq->sleeping, 0)) {
        ssize_t r = write(cq->evfd, &one, sizeof one);
        (void)r;
    }
}

/* Push a chain first..last (linked by next) onto an MPSC LIFO. */
static void mpsc_push(_Atomic(struct vrpc_buf *) *head, struct vrpc_buf *first, struct vrpc_buf *last)
{
    struct vrpc_buf *old = atomic_load(head);
    do
        last->next = old;
    while (!atomic_compare_exchange_weak(head, &old, first));
}

/* Take a whole MPSC LIFO and return it in FIFO order. */
static struct vrpc_buf *mpsc_take_fifo(_Atomic(struct vrpc_buf *) *head)
{
    struct vrpc_buf *b = atomic_exchange(head, NULL), *r = NULL, *n;
    for (; b; b = n) {
        n = b->next;
        b->next = r;
        r = b;
    }
    return r;
}

/* ---- send side (any thread, ep->lock held) ------------------------------------ */

static void build_hdr(void *at, uint32_t type, uint32_t len, uint32_t imm, uint32_t credits)
{
    struct vrpc_tcp_hdr h = vrpc_tcp_hdr_make((uint8_t)type, len, imm, (uint16_t)credits);
    memcpy(at, &h, sizeof h);
}

static void set_pollout_locked(struct tcp_ep *ep, bool on)
{
    struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.ptr = ep };
    if (ep->pollout == on || ep->fd < 0)
        return;
    ep->pollout = on;
    epoll_ctl(ep->cq->epfd, EPOLL_CTL_MOD, ep->fd, &e);
}

static void grant_unref(struct tcp_ep *ep, struct grant *g);
static void teardown(struct tcp_cq *cq, struct tcp_ep *ep, int status, const char *why);

/* iovecs for bytes [off, off + len) of g's window (within it): one per
 * segment touched, at most VRPC_GRANT_SEGS_MAX. The caller holds a
 * reference on g, so its segments stay as granted. */
static size_t grant_iov(const struct grant *g, uint32_t off, uint32_t len, struct iovec *iov)
{
    return vrpc_tcp_segs_iov(g->segs, g->nsegs, off, len, iov);
}

/* A job ends (last chunk written, or dropped): its grant reference goes. */
static void job_end_locked(struct tcp_ep *ep, struct rjob *j)
{
    grant_unref(ep, j->g);
    j->g = NULL;
    j->next = ep->jfree;
    ep->jfree = j;
    ep->njobs--;
}

/* Write the rest of the chunk being streamed, straight from the granted
 * memory. true: the chunk is out (its job moved to the back of the
 * round-robin, or ended); false: the socket is full (EPOLLOUT armed) or
 * failed. */
static bool tx_chunk_locked(struct tcp_ep *ep)
{
    struct rjob *j = ep->cur;
    while (ep->cur_off < HDR_LEN + ep->cur_len) {
        struct iovec iov[1 + VRPC_GRANT_SEGS_MAX];
        struct msghdr msg = { .msg_iov = iov };
        ssize_t w;
        if (ep->cur_off < HDR_LEN) {
            iov[0].iov_base = ep->cur_hdr + ep->cur_off;
            iov[0].iov_len = HDR_LEN - ep->cur_off;
            msg.msg_iovlen = 1 + grant_iov(j->g, j->off, ep->cur_len, iov + 1);
        } else {
            uint32_t done = ep->cur_off - HDR_LEN;
            msg.msg_iovlen = grant_iov(j->g, j->off + done, ep->cur_len - done, iov);
        }
        w = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                set_pollout_locked(ep, true);
            else
                ep->werr = true;
            return false;
        }
        ep->cur_off += (uint32_t)w;
        ep->chunk_bytes += (uint64_t)w;
    }
    ep->cur = NULL;
    j->off += ep->cur_len;
    j->left -= ep->cur_len;
    if (!j->left) {
        job_end_locked(ep, j);
    } else {
        j->next = NULL;
        if (ep->jtail)
            ep->jtail->next = j;
        else
            ep->jhead = j;
        ep->jtail = j;
    }
    return true;
}

/* Write as much as the socket takes: first the rest of a chunk being
 * streamed (a frame is never cut), then wq. Frames fully written complete
 * (status 0) through the CQ's done list; internal frames just leave. New
 * chunks of read jobs are started only by the poller (pump), so a sender's
 * call never streams more than the rest of one chunk. */
static void tx_locked(struct tcp_ep *ep)
{
    struct vrpc_buf *first = NULL, *last = NULL;
    bool blocked = false;
    while (!blocked && !ep->werr && ep->fd >= 0) {
        struct iovec iov[MAX_IOV];
        struct msghdr msg = { .msg_iov = iov };
        struct vrpc_buf *b;
        size_t want = 0, off = ep->wq_off;
        ssize_t w;
        int n = 0;

        if (ep->cur) {
            if (!tx_chunk_locked(ep))
                break;
            continue;
        }
        if (!ep->wq.head)
            break;
        for (b = ep->wq.head; b && n < MAX_IOV; b = b->next, n++) {
            iov[n].iov_base = (char *)b->data - HDR_LEN + off;
            iov[n].iov_len = HDR_LEN + b->len - off;
            want += iov[n].iov_len;
            off = 0;
        }
        msg.msg_iovlen = (size_t)n;
        w = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                set_pollout_locked(ep, true);
            else
                ep->werr = true; /* the poller sees the socket error and tears down */
            break;
        }
        while (w > 0) {
            size_t rem;
            b = ep->wq.head;
            rem = HDR_LEN + b->len - ep->wq_off;
            if ((size_t)w < rem) {
                ep->wq_off += (uint32_t)w;
                break;
            }
            w -= (ssize_t)rem;
            ep->wq_off = 0;
            fifo_pop(&ep->wq);
            if (b == &ep->ctrl)
                ep->ctrl_queued = false;
            if ((uint32_t)b->priv[P_OPST] == OP_INTERNAL) {
                if (b->priv[P_IMM] == READ_REQ_MARK)
                    container_of(b, struct rslot, req)->queued = false;
                continue;
            }
            if (last)
                last->next = b;
            else
                first = b;
            last = b;
            b->next = NULL;
        }
        if ((size_t)w < want && ep->wq.head) {
            set_pollout_locked(ep, true);
            blocked = true;
        }
    }
    if (!ep->wq.head && !ep->cur) {
        if (ep->jhead) {
            if (!ep->pumping)
                set_pollout_locked(ep, true); /* the poller streams the next chunks */
        } else {
            set_pollout_locked(ep, false);
            /* a graceful close ends the stream once every accepted send is
             * out, every read of the peer served and every read of ours
             * answered (the peer stops serving at our FIN) */
            if (atomic_load(&ep->state) == S_CLOSING && !ep->waitq.head && !ep->shut_wr && ep->fd >= 0 &&
                !atomic_load(&ep->nreads)) {
                shutdown(ep->fd, SHUT_WR);
                ep->shut_wr = true;
            }
        }
    }
    if (first) {
        mpsc_push(&ep->cq->done, first, last);
        kick(ep->cq);
    }
}

/* Give b (len, imm in place) its header and credits, and queue it for the wire. */
static void admit_locked(struct tcp_ep *ep, struct vrpc_buf *b)
{
    ep->send_credits--;
    build_hdr((char *)b->data - HDR_LEN, F_DATA, b->len, (uint32_t)b->priv[P_IMM], vrpc_credit_take_ret(&ep->cr));
    fifo_push(&ep->wq, b);
}

/* Credits arrived: admit waiting sends in order, then write. */
static void add_credits_locked(struct tcp_ep *ep, uint32_t c)
{
    ep->send_credits += c;
    while (ep->send_credits && ep->waitq.head) {
        ep->nwait--;
        admit_locked(ep, fifo_pop(&ep->waitq));
    }
    /* the peer is returning credits: what still waits starts a new clock
     * (no store on the common path, where nothing waited) */
    if (ep->waitq.head)
        atomic_store_explicit(&ep->wait_ns, vrpc_tp_now_ns(), memory_order_relaxed);
    else if (atomic_load_explicit(&ep->wait_ns, memory_order_relaxed))
        atomic_store_explicit(&ep->wait_ns, 0, memory_order_relaxed);
    tx_locked(ep);
}

/* Queue a credit-only frame carrying whatever credit_ret holds. */
static void send_credit_locked(struct tcp_ep *ep)
{
    uint32_t c;
    if (ep->ctrl_queued || ep->fd < 0 || ep->shut_wr)
        return;
    c = vrpc_credit_take_ret(&ep->cr);
    if (!c)
        return;
    build_hdr(ep->ctrl_space, F_CREDIT, 0, 0, c);
    ep->ctrl.len = 0;
    ep->ctrl_queued = true;
    fifo_push(&ep->wq, &ep->ctrl);
    if (ep->wq.head == &ep->ctrl)
        tx_locked(ep);
}

static int tcp_send(struct vrpc_ep *base, struct vrpc_buf *b, uint32_t len, uint32_t imm, uint64_t wr_id,
                    unsigned flags)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    bool idle;

    b->len = len;
    b->priv[P_WRID] = wr_id;
    stage_fill(b, VRPC_WC_SEND, 0, ep, imm);
    pthread_mutex_lock(&ep->lock);
    if (atomic_load(&ep->state) != S_OPEN) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    if (ep->waitq.head || !ep->send_credits) {
        if (ep->nwait >= ep->max_queued) {
            pthread_mutex_unlock(&ep->lock);
            return -EAGAIN;
        }
        if (!ep->waitq.head)
            atomic_store_explicit(&ep->wait_ns, vrpc_tp_now_ns(), memory_order_relaxed);
        ep->nwait++;
        vrpc_tp_note_credit_wait(base);
        fifo_push(&ep->waitq, b);
        pthread_mutex_unlock(&ep->lock);
        return 0;
    }
    idle = !ep->wq.head;
    admit_locked(ep, b);
    if (idle)
        tx_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    return 0;
}

/* Move every queued send to the done list with -ECANCELED (lock held). */
static void flush_sends_locked(struct tcp_ep *ep)
{
    struct vrpc_buf *first = NULL, *last = NULL, *b;
    struct fifo *qs[2] = { &ep->wq, &ep->waitq }; /* admission order */
    int i;
    for (i = 0; i < 2; i++) {
        while ((b = fifo_pop(qs[i]))) {
            if (b == &ep->ctrl)
                ep->ctrl_queued = false;
            if ((uint32_t)b->priv[P_OPST] == OP_INTERNAL) {
                if (b->priv[P_IMM] == READ_REQ_MARK)
                    container_of(b, struct rslot, req)->queued = false;
                continue;
            }
            stage_fill(b, VRPC_WC_SEND, -ECANCELED, ep, 0);
            b->len = 0;
            if (last)
                last->next = b;
            else
                first = b;
            last = b;
        }
    }
    ep->nwait = 0;
    ep->wq_off = 0;
    if (first) {
        mpsc_push(&ep->cq->done, first, last);
        kick(ep->cq);
    }
}

static int tcp_close(struct vrpc_ep *base)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    pthread_mutex_lock(&ep->lock);
    if (atomic_load(&ep->state) != S_OPEN) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    atomic_store(&ep->state, S_CLOSING);
    atomic_store(&ep->close_ns, vrpc_tp_now_ns());
    /* Sends waiting for credits still go as credits arrive (the peer keeps
     * reading until our FIN); the write side shuts once both queues drain. */
    tx_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    kick(ep->cq);
    return 0;
}

/* Any thread: stop writing, then hand ep to its poller, which tears it down
 * (RST) on its next pass. The list holds a reference until then, so a
 * DISCONNECTED delivered meanwhile cannot free ep under it. */
static int tcp_abort(struct vrpc_ep *base, int status)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    struct tcp_ep *old;
    int st;
    pthread_mutex_lock(&ep->lock);
    st = atomic_load(&ep->state);
    if (st == S_ABORTING || st == S_DEAD) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    ep->abort_status = status;
    ep->werr = true; /* nothing more goes on the wire */
    atomic_store(&ep->state, S_ABORTING);
    pthread_mutex_unlock(&ep->lock);
    atomic_fetch_add_explicit(&ep->base.refs, 1, memory_order_relaxed);
    old = atomic_load(&ep->cq->aborts);
    do
        ep->xnext = old;
    while (!atomic_compare_exchange_weak(&ep->cq->aborts, &old, ep));
    kick(ep->cq);
    return 0;
}

/* Poller: tear down the endpoints of an abort list taken before adopt() (so
 * every one of them has been adopted), and drop the list's references. */
static void run_aborts(struct tcp_cq *cq, struct tcp_ep *ep)
{
    struct tcp_ep *n;
    for (; ep; ep = n) {
        n = ep->xnext;
        teardown(cq, ep, ep->abort_status, NULL);
        vrpc_ep_unref(&ep->base);
    }
}

/* ---- grants (any thread; the table lock, taken after an endpoint lock) ---- */

static struct tcp_tp *tcp_tp_of(struct tcp_ep *ep)
{
    return container_of(ep->base.tp, struct tcp_tp, base);
}

static struct grant *grant_at(struct tcp_tp *t, uint32_t idx)
{
    return &t->blocks[idx / GBLOCK][idx % GBLOCK];
}

/* The live-or-not entry a key names, or NULL when the key names nothing. */
static struct grant *grant_lookup(struct tcp_tp *t, uint32_t key)
{
    uint32_t idx = key >> 8;
    struct grant *g;
    if (!key || idx >= t->hw)
        return NULL;
    g = grant_at(t, idx);
    return g->gen == (uint8_t)key ? g : NULL;
}

/* gmu held: hand the REVOKE completion to the endpoint's poller. */
static void grant_complete(struct grant *g, int status)
{
    struct tcp_ep *ep = g->ep;
    g->state = G_DONE;
    g->cpl.len = 0;
    g->cpl.priv[P_WRID] = g->wr_id;
    stage_fill(&g->cpl, VRPC_WC_REVOKE, status, ep, 0);
    mpsc_push(&ep->cq->done, &g->cpl, &g->cpl);
    kick(ep->cq);
}

static void grant_free_locked(struct tcp_tp *t, struct grant *g);

static void grant_unref(struct tcp_ep *ep, struct grant *g)
{
    struct tcp_tp *t = tcp_tp_of(ep);
    pthread_mutex_lock(&t->gmu);
    if (--g->refs == 0) {
        if (g->state == G_REVOKING)
            grant_complete(g, g->status);
        else if (g->state == G_ORPHAN)
            grant_free_locked(t, g);
    }
    pthread_mutex_unlock(&t->gmu);
}

/* gmu held: the entry is free; its key names nothing any more. */
static void grant_free_locked(struct tcp_tp *t, struct grant *g)
{
    if (g->ep)
        g->ep->ngrants--;
    g->state = G_FREE;
    g->ep = NULL;
    g->addr = NULL;
    if (++g->gen == 0)
        g->gen = 1;
    g->next_free = t->free_head;
    t->free_head = g->idx + 1;
}

/* Poller, when the REVOKE completion has been taken. */
static void grant_release(struct tcp_tp *t, struct grant *g)
{
    pthread_mutex_lock(&t->gmu);
    grant_free_locked(t, g);
    pthread_mutex_unlock(&t->gmu);
}

/* A grant of the window segs[0..n) (len bytes in all; checked by the core). */
static int grant_new(struct tcp_ep *ep, const struct vrpc_seg *segs, unsigned n, uint32_t len, uint32_t *rkey)
{
    struct tcp_tp *t = tcp_tp_of(ep);
    struct grant *g;
    uint32_t idx;

    pthread_mutex_lock(&t->gmu);
    /* under gmu: a teardown marking this endpoint's grants dead either
     * comes after (and sees this one) or made us see S_DEAD here */
    if (atomic_load(&ep->state) != S_OPEN) {
        pthread_mutex_unlock(&t->gmu);
        return -ENOTCONN;
    }
    if (t->ep_grants && ep->ngrants >= t->ep_grants) {
        pthread_mutex_unlock(&t->gmu);
        return -ENOSPC;
    }
    if (t->free_head) {
        idx = t->free_head - 1;
        g = grant_at(t, idx);
        t->free_head = g->next_free;
    } else {
        if (t->hw == t->nblocks * GBLOCK) {
            if (t->nblocks == GMAX_BLOCKS || !(t->blocks[t->nblocks] = calloc(GBLOCK, sizeof(struct grant)))) {
                pthread_mutex_unlock(&t->gmu);
                return t->nblocks == GMAX_BLOCKS ? -ENOSPC : -ENOMEM;
            }
            t->nblocks++;
        }
        idx = t->hw++;
        g = grant_at(t, idx);
        g->idx = idx;
        g->gen = 1;
    }
    g->ep = ep;
    g->addr = segs[0].addr;
    g->len = len;
    g->nsegs = n;
    memcpy(g->segs, segs, n * sizeof(*segs));
    g->refs = 0;
    g->state = G_LIVE;
    g->status = 0;
    ep->granted_any = true;
    ep->ngrants++;
    *rkey = idx << 8 | g->gen;
    pthread_mutex_unlock(&t->gmu);
    return 0;
}

static int tcp_grant(struct vrpc_ep *base, struct vrpc_mr *mr, const void *addr, uint32_t len, uint32_t *rkey)
{
    struct vrpc_seg seg = {.addr = addr, .len = len};
    if (mr->tp != base->tp)
        return -EINVAL;
    return grant_new(container_of(base, struct tcp_ep, base), &seg, 1, len, rkey);
}

static int tcp_grant_segs(struct vrpc_ep *base, const struct vrpc_seg *segs, unsigned n, uint32_t len,
                          uint32_t *rkey)
{
    return grant_new(container_of(base, struct tcp_ep, base), segs, n, len, rkey);
}

static int tcp_revoke(struct vrpc_ep *base, uint32_t rkey, uint64_t wr_id)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    struct tcp_tp *t = tcp_tp_of(ep);
    struct grant *g;

    pthread_mutex_lock(&t->gmu);
    /* under gmu: teardown marks the endpoint dead before it takes gmu to
     * free its grants, so a revoke that sees it alive completes before the
     * DISCONNECTED, and one that comes later finds every key dead */
    if (atomic_load(&ep->state) == S_DEAD) {
        pthread_mutex_unlock(&t->gmu);
        return -ENOTCONN;
    }
    g = grant_lookup(t, rkey);
    if (!g || g->ep != ep || g->state != G_LIVE) {
        pthread_mutex_unlock(&t->gmu);
        return -EINVAL;
    }
    g->wr_id = wr_id;
    if (!g->refs)
        grant_complete(g, 0);
    else
        g->state = G_REVOKING; /* completes when the job streaming it stops */
    pthread_mutex_unlock(&t->gmu);
    return 0;
}

/* Poller, at teardown (state already S_DEAD): the endpoint's grants die and
 * are freed (the user revokes nothing after DISCONNECTED: -ENOTCONN); a
 * revoke waiting for a job completes -ECANCELED when the job is dropped,
 * before the DISCONNECTED. */
static void grants_ep_dead(struct tcp_ep *ep)
{
    struct tcp_tp *t = tcp_tp_of(ep);
    uint32_t i;
    pthread_mutex_lock(&t->gmu);
    if (ep->granted_any)
        for (i = 0; i < t->hw; i++) {
            struct grant *g = grant_at(t, i);
            if (g->ep != ep)
                continue;
            if (g->state == G_LIVE && g->refs)
                g->state = G_ORPHAN; /* its job is dropped right after: then freed */
            else if (g->state == G_LIVE)
                grant_free_locked(t, g);
            else if (g->state == G_REVOKING)
                g->status = -ECANCELED;
        }
    pthread_mutex_unlock(&t->gmu);
}

/* Owner, poller: validate a READ_REQ (section 7 of the design) and take a
 * reference on its grant. 0, or -EPROTO with *why set. */
static int grant_ref(struct tcp_ep *ep, uint64_t raddr, uint32_t key, uint32_t length, struct grant **out)
{
    struct tcp_tp *t = tcp_tp_of(ep);
    const char *why = NULL;
    struct grant *g;

    pthread_mutex_lock(&t->gmu);
    g = grant_lookup(t, key);
    if (!g || (g->state != G_LIVE && g->state != G_REVOKING))
        why = "unknown or revoked key";
    else if (g->ep != ep)
        why = "key granted on another connection";
    else if (g->state != G_LIVE)
        why = "revoked key";
    else if (!length)
        why = "zero length";
    else if (!vrpc_tcp_read_in_grant((uint64_t)(uintptr_t)g->addr, g->len, raddr, length))
        why = "range outside the grant";
    if (!why) {
        g->refs++;
        *out = g;
    }
    pthread_mutex_unlock(&t->gmu);
    if (why)
        snprintf(ep->why, sizeof ep->why, "bad read request (%s: key %#x, addr %#llx, length %u)", why, key,
                 (unsigned long long)raddr, length);
    return why ? -EPROTO : 0;
}

/* ---- reads: reader side ------------------------------------------------------- */

static int tcp_read(struct vrpc_ep *base, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr,
                    uint32_t rkey, uint64_t wr_id)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    struct vrpc_tcp_read_req r = { .raddr = htole64(raddr), .rkey = htole32(rkey), .length = htole32(len) };
    struct rslot *s = NULL;
    unsigned i;
    bool idle;

    pthread_mutex_lock(&ep->lock);
    if (atomic_load(&ep->state) != S_OPEN) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    if (!ep->rslots) {
        unsigned n = base->tp->attr.read_window * 2;
        if (n > VRPC_TCP_MAX_READS)
            n = VRPC_TCP_MAX_READS;
        ep->rslots = calloc(n, sizeof *ep->rslots);
        if (!ep->rslots) {
            pthread_mutex_unlock(&ep->lock);
            return -ENOMEM;
        }
        ep->nrslots = n;
        for (i = 0; i < n; i++) {
            ep->rslots[i].req.data = ep->rslots[i].req_space + HDR_LEN;
            ep->rslots[i].req.priv[P_IMM] = READ_REQ_MARK;
            atomic_init(&ep->rslots[i].used, false);
        }
    }
    for (i = 0; i < ep->nrslots && !s; i++)
        if (!atomic_load(&ep->rslots[i].used))
            s = &ep->rslots[i];
    if (!s) {
        pthread_mutex_unlock(&ep->lock);
        return -ENOSPC;
    }
    s->gen++;
    s->buf = buf;
    s->wr_id = wr_id;
    s->off = off;
    s->len = len;
    s->done = 0;
    s->finished = false;
    atomic_store(&s->used, true);
    atomic_store(&ep->read_ns, vrpc_tp_now_ns()); /* before nreads: the timeout scan sees both */
    atomic_fetch_add(&ep->nreads, 1);
    memcpy(s->req_space + HDR_LEN, &r, sizeof r);
    build_hdr(s->req_space, F_READ_REQ, sizeof r, (uint32_t)s->gen << 16 | (uint32_t)(s - ep->rslots),
              vrpc_credit_take_ret(&ep->cr));
    s->req.len = sizeof r;
    s->queued = true;
    idle = !ep->wq.head;
    fifo_push(&ep->wq, &s->req);
    if (idle)
        tx_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    return 0;
}

/* Poller: the read of slot s is over; its completion goes out with status. */
static void complete_read(struct tcp_cq *cq, struct tcp_ep *ep, struct rslot *s, int status)
{
    s->cpl.len = status ? 0 : s->len;
    s->cpl.priv[P_WRID] = s->wr_id;
    stage_fill(&s->cpl, VRPC_WC_READ, status, ep, 0);
    s->cpl.priv[P_IMM] = (uint64_t)(uintptr_t)s->buf; /* wc.buf; imm stays 0 */
    fifo_push(&cq->out, &s->cpl);
    atomic_fetch_sub(&ep->nreads, 1);
}

/* Poller: every read not yet finished completes -ECANCELED (teardown). */
static void flush_reads(struct tcp_cq *cq, struct tcp_ep *ep)
{
    unsigned i;
    pthread_mutex_lock(&ep->lock);
    for (i = 0; i < ep->nrslots; i++) {
        struct rslot *s = &ep->rslots[i];
        if (atomic_load(&s->used) && !s->finished) {
            s->finished = true;
            complete_read(cq, ep, s, -ECANCELED);
        }
    }
    pthread_mutex_unlock(&ep->lock);
}

/* ---- reads: owner side ----------------------------------------------------------- */

/* Queue the one READ_ERR of this endpoint (it fails right after). */
static void queue_read_err_locked(struct tcp_ep *ep, uint32_t tag)
{
    if (ep->err_queued || ep->shut_wr || ep->fd < 0)
        return;
    ep->err_queued = true;
    build_hdr(ep->err_space, F_READ_ERR, 0, tag, 0);
    ep->errf.len = 0;
    fifo_push(&ep->wq, &ep->errf);
}

/* Drop every read job (teardown); their grants' pending revokes complete. */
static void drop_jobs_locked(struct tcp_ep *ep)
{
    struct rjob *j;
    if (ep->cur) {
        job_end_locked(ep, ep->cur);
        ep->cur = NULL;
    }
    while ((j = ep->jhead)) {
        ep->jhead = j->next;
        job_end_locked(ep, j);
    }
    ep->jtail = NULL;
}

/* Poller, on EPOLLOUT: write what is pending, then stream up to PUMP_CHUNKS
 * new chunks, one per job in turn, each after the endpoint's queued small
 * frames. A job whose grant was revoked meanwhile stops: READ_ERR, and the
 * connection fails (the peer's read can never complete). */
static void pump(struct tcp_cq *cq, struct tcp_ep *ep)
{
    struct tcp_tp *t = tcp_tp_of(ep);
    uint32_t chunk = ep->base.tp->attr.read_chunk ? ep->base.tp->attr.read_chunk : READ_CHUNK_DEFAULT;
    unsigned budget = PUMP_CHUNKS;
    bool fail = false;
    uint64_t moved;

    pthread_mutex_lock(&ep->lock);
    moved = ep->chunk_bytes;
    ep->pumping = true;
    for (;;) {
        struct rjob *j;
        bool live;
        tx_locked(ep);
        if (fail || ep->cur || ep->wq.head || !ep->jhead || ep->werr || ep->fd < 0 || !budget--)
            break;
        j = ep->jhead;
        ep->jhead = j->next;
        if (!ep->jhead)
            ep->jtail = NULL;
        pthread_mutex_lock(&t->gmu);
        live = j->g->state == G_LIVE;
        pthread_mutex_unlock(&t->gmu);
        if (!live) {
            queue_read_err_locked(ep, j->tag);
            job_end_locked(ep, j);
            snprintf(ep->why, sizeof ep->why, "a grant was revoked while the peer was reading it");
            fail = true;
            continue;
        }
        ep->cur = j;
        ep->cur_len = j->left < chunk ? j->left : chunk;
        ep->cur_off = 0;
        build_hdr(ep->cur_hdr, F_READ_RESP, ep->cur_len, j->tag, vrpc_credit_take_ret(&ep->cr));
    }
    ep->pumping = false;
    /* Stopped with chunks left (budget spent; a full socket armed EPOLLOUT
     * already): EPOLLOUT brings the poller back. A socket that took every
     * chunk never had it armed: no epoll_ctl pair per read. */
    if (!fail && ep->jhead && !ep->cur && !ep->wq.head && !ep->werr && ep->fd >= 0)
        set_pollout_locked(ep, true);
    moved = ep->chunk_bytes - moved;
    pthread_mutex_unlock(&ep->lock);
    if (moved)
        cq->flow_ns = vrpc_tp_now_ns();
    if (fail)
        teardown(cq, ep, -EPROTO, ep->why);
}

/* Poller: a complete READ_REQ body is in ep->rreq. Valid: a job is queued and
 * EPOLLOUT armed (pump streams it). Else READ_ERR and -EPROTO. */
static int handle_read_req(struct tcp_ep *ep, const char **why)
{
    uint64_t raddr = le64toh(ep->rreq.r.raddr);
    uint32_t key = le32toh(ep->rreq.r.rkey), length = le32toh(ep->rreq.r.length), tag = ep->rimm, i;
    struct grant *g = NULL;
    struct rjob *j;
    int rc = grant_ref(ep, raddr, key, length, &g);

    pthread_mutex_lock(&ep->lock);
    if (!rc && ep->shut_wr) {
        snprintf(ep->why, sizeof ep->why, "read request after our side finished its close");
        rc = -EPROTO;
    }
    if (!rc && ep->njobs >= VRPC_TCP_MAX_READS) {
        snprintf(ep->why, sizeof ep->why, "more than %u read requests outstanding", VRPC_TCP_MAX_READS);
        rc = -EPROTO;
    }
    if (!rc && !ep->jobs) {
        ep->jobs = calloc(VRPC_TCP_MAX_READS, sizeof *ep->jobs);
        if (!ep->jobs) {
            snprintf(ep->why, sizeof ep->why, "no memory for read jobs");
            rc = -ENOMEM;
        } else {
            for (i = 0; i < VRPC_TCP_MAX_READS; i++) {
                ep->jobs[i].next = ep->jfree;
                ep->jfree = &ep->jobs[i];
            }
        }
    }
    if (rc) {
        queue_read_err_locked(ep, tag);
        tx_locked(ep);
        pthread_mutex_unlock(&ep->lock);
        if (g)
            grant_unref(ep, g);
        *why = ep->why;
        return rc;
    }
    j = ep->jfree;
    ep->jfree = j->next;
    j->g = g;
    j->off = (uint32_t)(raddr - (uint64_t)(uintptr_t)g->addr);
    j->left = length;
    j->tag = tag;
    j->next = NULL;
    if (ep->jtail)
        ep->jtail->next = j;
    else
        ep->jhead = j;
    ep->jtail = j;
    ep->njobs++;
    pthread_mutex_unlock(&ep->lock);
    /* streamed once this pass's events are handled (pump_pending), not
     * from inside the receive path, which must not see a teardown */
    if (!ep->pump_queued) {
        ep->pump_queued = true;
        ep->pnext = ep->cq->pumpq;
        ep->cq->pumpq = ep;
    }
    return 0;
}

/* ---- CQ bookkeeping (poller) ------------------------------------------------ */

/* Every connection keeps a reservation of at least MIN_RESV promised
 * receives; a CQ that cannot reserve that many refuses the connection
 * (the credit core's min_resv for TCP, credit.h). */
#define MIN_RESV 2u

/* vrpc_credit_distribute's hook: a credit-only frame for e's endpoint. */
static void credit_send(struct vrpc_credit_ep *e)
{
    struct tcp_ep *ep = container_of(e, struct tcp_ep, cr);
    pthread_mutex_lock(&ep->lock);
    send_credit_locked(ep);
    pthread_mutex_unlock(&ep->lock);
}

static void take_posted(struct tcp_cq *cq)
{
    struct vrpc_buf *b = atomic_exchange(&cq->posted_in, NULL), *n;
    for (; b; b = n) {
        n = b->next;
        b->next = cq->free;
        cq->free = b;
    }
}

static struct vrpc_buf *get_posted(struct tcp_cq *cq)
{
    struct vrpc_buf *b;
    if (!cq->free)
        take_posted(cq);
    b = cq->free;
    if (b)
        cq->free = b->next;
    return b;
}

static void put_posted(struct tcp_cq *cq, struct vrpc_buf *b)
{
    b->next = cq->free;
    cq->free = b;
}

static void ep_list_remove(struct tcp_cq *cq, struct tcp_ep *ep)
{
    if (ep->prev)
        ep->prev->next = ep->next;
    else if (cq->eps == ep)
        cq->eps = ep->next;
    if (ep->next)
        ep->next->prev = ep->prev;
    ep->prev = ep->next = NULL;
    cq->neps--;
}

static void listener_unref(struct tcp_listener *l);

/* End a connection: flush its sends, give back its promises and partial
 * receive, and queue its DISCONNECTED (or free it, if never reported). */
static void teardown(struct tcp_cq *cq, struct tcp_ep *ep, int status, const char *why)
{
    bool aborted;
    int fd;
    if (atomic_load(&ep->state) == S_DEAD)
        return;
    pthread_mutex_lock(&ep->lock);
    aborted = atomic_load(&ep->state) == S_ABORTING;
    if (aborted) { /* the user's abort decides the status, whatever ended it first */
        status = ep->abort_status;
        why = NULL;
    }
    if (why)
        vrpc_tp_log("tcp: connection %s: %s (%s)", ep->base.peer_uri[0] ? ep->base.peer_uri : "(accepting)",
                    why, strerror(status < 0 ? -status : 0));
    atomic_store(&ep->state, S_DEAD);
    flush_sends_locked(ep);
    grants_ep_dead(ep); /* before the jobs go: their pending revokes complete -ECANCELED */
    drop_jobs_locked(ep);
    fd = ep->fd;
    ep->fd = -1;
    pthread_mutex_unlock(&ep->lock);
    epoll_ctl(cq->epfd, EPOLL_CTL_DEL, fd, NULL);
    if (aborted) { /* reset: the kernel drops what is unsent at once */
        struct linger lg = { .l_onoff = 1, .l_linger = 0 };
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
    if (ep->rbuf) { /* a posted receive again, promised to no one */
        put_posted(cq, ep->rbuf);
        ep->rbuf = NULL;
        atomic_fetch_add(&cq->cr.posted, 1);
        atomic_fetch_add(&cq->cr.avail, 1);
    }
    ep->rdst = NULL;
    ep->rkind = K_NONE;
    ep->rslot = NULL;
    flush_reads(cq, ep);
    vrpc_credit_hungry_remove(&cq->cr, &ep->cr);
    vrpc_credit_ep_release(&cq->cr, &ep->cr);
    ep->cr.granted = 0;
    ep_list_remove(cq, ep);
    if (ep->lst) {
        listener_unref(ep->lst);
        ep->lst = NULL;
    }
    if (ep->counted) {
        atomic_fetch_sub(&ep->counted->nconns, 1);
        listener_unref(ep->counted);
        ep->counted = NULL;
    }
    ep->disc_status = status;
    if (ep->reported) {
        ep->dnext = cq->dead;
        cq->dead = ep;
    } else {
        ep->dnext = cq->reap;
        cq->reap = ep;
    }
}

/* The peer's FIN between frames: a graceful close, unless a read of ours was
 * still unanswered (a closing peer serves every read before its FIN): then
 * the peer died or gave up, and the connection was lost (transport.h). */
static void teardown_eof(struct tcp_cq *cq, struct tcp_ep *ep)
{
    int st = vrpc_tp_disc_status(0, true, 0, atomic_load(&ep->nreads) != 0);
    teardown(cq, ep, st, st ? "peer closed with a read of ours unanswered" : NULL);
}

/* ---- receive side (poller) -------------------------------------------------- */

static void stage(struct tcp_cq *cq, struct vrpc_buf *b)
{
    fifo_push(&cq->out, b);
}

/* What a peer announces at the handshake must leave it a working connection
 * that cannot hold our resources cheaply (transport.h, "Handshake minimums"):
 * at least MIN_RESV credits and an eager size of at least VRPC_EAGER_MIN.
 * NULL when acceptable, else the reason (written into ep->why). */
static const char *hello_refusal(struct tcp_ep *ep, uint32_t credits, uint32_t eager)
{
    if (credits < MIN_RESV)
        snprintf(ep->why, sizeof ep->why, "refused: the peer grants %u credits, at least %u needed", credits,
                 MIN_RESV);
    else if (eager < VRPC_EAGER_MIN)
        snprintf(ep->why, sizeof ep->why, "refused: the peer's eager size %u is below the minimum %u", eager,
                 VRPC_EAGER_MIN);
    else
        return NULL;
    return ep->why;
}

static int handle_hello(struct tcp_cq *cq, struct tcp_ep *ep, const struct vrpc_tcp_hdr *h, const char **why)
{
    uint32_t eager = le32toh(h->imm), grant, n;
    struct tcp_listener *l = ep->lst;
    char ack[HDR_LEN];
    ssize_t w;

    *why = "unexpected HELLO";
    if (atomic_load(&ep->state) != S_HANDSHAKE || !l)
        return -EPROTO;
    *why = "refused: the listener is closed";
    if (atomic_load(&l->closed))
        return -ECONNREFUSED;
    if ((*why = hello_refusal(ep, le16toh(h->credits), eager)))
        return -EPROTO;
    /* counted before the reservation: a refusal here costs no buffers */
    n = atomic_fetch_add(&l->nconns, 1);
    if (l->max_conns && n >= l->max_conns) {
        atomic_fetch_sub(&l->nconns, 1);
        snprintf(ep->why, sizeof ep->why, "refused: the listener has %u connections, its limit (max_conns)",
                 l->max_conns);
        *why = ep->why;
        return -ECONNREFUSED;
    }
    atomic_fetch_add(&l->refs, 1);
    ep->counted = l;
    if (eager < ep->base.eager)
        ep->base.eager = eager;
    ep->send_credits = le16toh(h->credits);
    grant = vrpc_credit_reserve(&cq->cr);
    *why = "refused: no receive buffers left on the CQ to reserve for it (post more receives)";
    if (!grant)
        return -ENOBUFS;
    *why = "cannot send HELLO_ACK";
    ep->cr.resv = ep->cr.granted = grant;
    build_hdr(ack, F_HELLO_ACK, 0, ep->base.eager, grant);
    w = send(ep->fd, ack, HDR_LEN, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w != HDR_LEN)
        return w < 0 ? -errno : -EIO;
    ep->base.user = NULL;
    listener_unref(ep->lst);
    ep->lst = NULL;
    atomic_store(&ep->state, S_OPEN);
    ep->reported = true;
    ep->frame_ns = 0;
    atomic_store(&ep->base.refs, 2); /* the user's, from ACCEPTED on, and ours */
    ep->ev_acc.len = 0;
    ep->ev_acc.priv[P_WRID] = ep->accept_user;
    stage_fill(&ep->ev_acc, VRPC_WC_ACCEPTED, 0, ep, 0);
    stage(cq, &ep->ev_acc);
    return 0;
}

/* Reader: a READ_RESP or READ_ERR header for tag. RESP: the body goes
 * straight into the read's buffer. ERR: that read completes -EACCES and the
 * connection fails (the peer closes it too). */
static int handle_read_hdr(struct tcp_cq *cq, struct tcp_ep *ep, uint8_t type, uint32_t len, uint32_t tag,
                           const char **why)
{
    uint32_t idx = tag & 0xffffu;
    struct rslot *r = NULL;
    char *dst = NULL;
    bool ok;

    pthread_mutex_lock(&ep->lock);
    if (idx < ep->nrslots)
        r = &ep->rslots[idx];
    /* (an answer before its request is out is a peer guessing tags) */
    ok = r && atomic_load(&r->used) && !r->finished && !r->queued && r->gen == (uint16_t)(tag >> 16);
    if (ok && type == F_READ_RESP) {
        ok = len >= 1 && len <= r->len - r->done;
        dst = (char *)r->buf->data + r->off + r->done;
    } else if (ok) {
        ok = len == 0;
        if (ok)
            r->finished = true;
    }
    pthread_mutex_unlock(&ep->lock);
    if (!ok) {
        *why = type == F_READ_RESP ? "read response for no outstanding read, or beyond its length"
                                   : "read error for no outstanding read";
        return -EPROTO;
    }
    if (type == F_READ_ERR) {
        complete_read(cq, ep, r, -EACCES);
        *why = "the peer refused a read (bad or revoked key, or range)";
        return -EACCES;
    }
    ep->rkind = K_RRESP;
    ep->rslot = r;
    ep->rdst = dst;
    ep->rgot = 0;
    ep->rlen = len;
    ep->rimm = tag;
    return 0;
}

/* A complete header is in ep->rhdr. Returns 0 or a negative errno (protocol error). */
static int handle_hdr(struct tcp_cq *cq, struct tcp_ep *ep, struct vrpc_buf **spec, const char **why)
{
    struct vrpc_tcp_hdr h = ep->rhdr.h;
    uint32_t len = le32toh(h.len), credits = le16toh(h.credits);
    struct vrpc_buf *b;

    ep->rhdr_got = 0;
    if (le32toh(h.magic) != MAGIC || h.version != VERSION) {
        *why = "bad frame header (garbage or another protocol)";
        return -EPROTO;
    }
    if (h.type == F_HELLO)
        return handle_hello(cq, ep, &h, why);
    if (atomic_load(&ep->state) == S_HANDSHAKE) {
        *why = "frame before handshake";
        return -EPROTO;
    }
    if (credits) {
        pthread_mutex_lock(&ep->lock);
        add_credits_locked(ep, credits);
        pthread_mutex_unlock(&ep->lock);
    }
    if (h.type == F_CREDIT) {
        if (len) {
            *why = "credit frame with payload";
            return -EPROTO;
        }
        ep->frame_ns = 0;
        return 0;
    }
    if (h.type == F_READ_REQ) {
        if (len != VRPC_TCP_READ_REQ_LEN) {
            *why = "read request of the wrong length";
            return -EPROTO;
        }
        ep->rkind = K_RREQ;
        ep->rdst = (char *)ep->rreq.b;
        ep->rgot = 0;
        ep->rlen = len;
        ep->rimm = le32toh(h.imm);
        return 0;
    }
    if (h.type == F_READ_RESP || h.type == F_READ_ERR)
        return handle_read_hdr(cq, ep, h.type, len, le32toh(h.imm), why);
    if (h.type != F_DATA) {
        *why = "unknown frame type";
        return -EPROTO;
    }
    if (len > ep->base.eager) {
        *why = "frame larger than the negotiated eager size";
        return -EMSGSIZE;
    }
    if (!ep->cr.granted) {
        *why = "peer sent without credits";
        return -EPROTO;
    }
    if (spec && *spec) { /* the buffer the payload was read into already */
        b = *spec;
        *spec = NULL;
    } else {
        b = get_posted(cq);
    }
    if (!b) { /* cannot happen while promised <= posted holds */
        *why = "no receive buffer for a credited message";
        return -ENOBUFS;
    }
    vrpc_credit_consumed(&cq->cr, &ep->cr);
    atomic_fetch_sub(&cq->cr.posted, 1);
    b->len = len;
    if (!len) {
        stage_fill(b, VRPC_WC_RECV, 0, ep, le32toh(h.imm));
        stage(cq, b);
        ep->frame_ns = 0;
        return 0;
    }
    ep->rbuf = b;
    ep->rdst = b->data;
    ep->rkind = K_DATA;
    ep->rgot = 0;
    ep->rlen = len;
    ep->rimm = le32toh(h.imm);
    return 0;
}

/* The body of the current frame is complete: deliver it. 0 or a protocol
 * error (a bad read request). */
static int body_done(struct tcp_cq *cq, struct tcp_ep *ep, const char **why)
{
    uint8_t k = ep->rkind;
    ep->rdst = NULL;
    ep->rkind = K_NONE;
    ep->frame_ns = 0;
    if (k == K_DATA) {
        struct vrpc_buf *b = ep->rbuf;
        ep->rbuf = NULL;
        stage_fill(b, VRPC_WC_RECV, 0, ep, ep->rimm);
        stage(cq, b);
        return 0;
    }
    if (k == K_RREQ)
        return handle_read_req(ep, why);
    {
        struct rslot *r = ep->rslot;
        bool last;
        ep->rslot = NULL;
        r->done += ep->rlen;
        atomic_store(&ep->read_ns, vrpc_tp_now_ns());
        pthread_mutex_lock(&ep->lock);
        last = r->done == r->len;
        if (last)
            r->finished = true;
        pthread_mutex_unlock(&ep->lock);
        if (last) {
            complete_read(cq, ep, r, 0);
            if (atomic_load(&ep->state) == S_CLOSING) { /* the close may have waited for it */
                pthread_mutex_lock(&ep->lock);
                tx_locked(ep);
                pthread_mutex_unlock(&ep->lock);
            }
        }
    }
    return 0;
}

/* Bytes already read from ep's stream (the carry of a speculative read) go
 * where the socket's bytes would have gone: header, then payload buffers.
 * *spec, if not NULL, is the posted buffer holding the carry itself: it is
 * owed to the next DATA frame (the credit for that frame may be exactly that
 * buffer), so the carry moves to its front (memmove) when one comes. */
static int consume(struct tcp_cq *cq, struct tcp_ep *ep, const char *p, size_t len, uint64_t now,
                   struct vrpc_buf **spec, const char **why)
{
    while (len) {
        size_t k;
        if (ep->rdst) {
            k = ep->rlen - ep->rgot < len ? ep->rlen - ep->rgot : len;
            if (ep->rdst + ep->rgot != p)
                memcpy(ep->rdst + ep->rgot, p, k);
            ep->rgot += (uint32_t)k;
        } else {
            k = HDR_LEN - ep->rhdr_got < len ? HDR_LEN - ep->rhdr_got : len;
            memcpy(ep->rhdr.b + ep->rhdr_got, p, k);
            ep->rhdr_got += (uint32_t)k;
        }
        p += k;
        len -= k;
        if (ep->rdst && ep->rgot == ep->rlen) {
            int rc = body_done(cq, ep, why);
            if (rc)
                return rc;
        } else if (!ep->rdst && ep->rhdr_got == HDR_LEN) {
            struct vrpc_buf *had = spec ? *spec : NULL;
            int rc = handle_hdr(cq, ep, spec, why);
            if (rc)
                return rc;
            if (had && !*spec) {
                /* that frame took the carry's own buffer: slide the rest of
                 * the carry to its front, where the payload belongs */
                memmove(had->data, p, len);
                p = had->data;
                spec = NULL;
            }
        }
    }
    if ((ep->rdst || ep->rhdr_got) && !ep->frame_ns)
        ep->frame_ns = now;
    return 0;
}

/* Header read with a speculative payload: one readv into the header and a
 * posted buffer, so a small message costs one read, not two. Bytes beyond
 * that frame (pipelined frames) are copied on to where they belong. */
static void rx_spec(struct tcp_cq *cq, struct tcp_ep *ep, uint64_t now)
{
    struct vrpc_buf *spec = get_posted(cq);
    struct iovec iov[2];
    size_t hrem = HDR_LEN - ep->rhdr_got, extra, used = 0;
    const char *why = NULL;
    char *base;
    ssize_t n;
    int rc;

    if (!spec)
        return; /* cannot happen while granted > 0; the plain path would catch it */
    base = spec->data;
    iov[0].iov_base = ep->rhdr.b + ep->rhdr_got;
    iov[0].iov_len = hrem;
    iov[1].iov_base = base;
    iov[1].iov_len = spec->cap;
    do
        n = readv(ep->fd, iov, 2);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
        put_posted(cq, spec);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0)
            teardown(cq, ep, -errno, "read failed");
        else if (ep->rhdr_got)
            teardown(cq, ep, -EPROTO, "peer closed in the middle of a frame");
        else
            teardown_eof(cq, ep);
        return;
    }
    if ((size_t)n <= hrem) {
        put_posted(cq, spec);
        ep->rhdr_got += (uint32_t)n;
        if (!ep->frame_ns)
            ep->frame_ns = now;
        if ((size_t)n == hrem && (rc = handle_hdr(cq, ep, NULL, &why)))
            teardown(cq, ep, rc, why); /* a whole header, nothing after it yet */
        return; /* level-triggered epoll reports the socket again when more arrives */
    }
    extra = (size_t)n - hrem;
    ep->rhdr_got = HDR_LEN;
    rc = handle_hdr(cq, ep, &spec, &why);
    if (!rc && !spec) {
        /* a DATA frame took spec: it holds this frame's payload from offset 0 */
        if (ep->rdst) {
            used = extra < ep->rlen ? extra : ep->rlen;
            ep->rgot = (uint32_t)used;
        }
        /* (zero-length DATA was staged with spec; used stays 0) */
        if (ep->rdst && ep->rgot == ep->rlen)
            rc = body_done(cq, ep, &why);
    }
    /* what follows the frame is copied on before anyone sees the buffer */
    if (!rc && extra > used)
        rc = consume(cq, ep, base + used, extra - used, now, spec ? &spec : NULL, &why);
    if (spec)
        put_posted(cq, spec);
    if (rc) {
        teardown(cq, ep, rc, why);
        return;
    }
    if (!ep->rdst && !ep->rhdr_got)
        ep->frame_ns = 0;
    else if (!ep->frame_ns)
        ep->frame_ns = now;
    /* One read per readiness report: level-triggered epoll reports the socket
     * again if more is waiting, and other connections get their turn. */
}

/* Read what the socket has for ep, a bounded amount per call (level-triggered
 * epoll calls again), straight into the posted buffer, the next header after. */
static void rx(struct tcp_cq *cq, struct tcp_ep *ep, uint64_t now)
{
    int rounds;
    for (rounds = 0; rounds < 32 && ep->fd >= 0; rounds++) {
        struct iovec iov[2];
        size_t want;
        ssize_t n;
        int niov;

        if (!ep->rdst && ep->rhdr_got == HDR_LEN) {
            const char *why = NULL;
            int rc = handle_hdr(cq, ep, NULL, &why);
            if (rc) {
                teardown(cq, ep, rc, why);
                return;
            }
            continue;
        }
        if (ep->rdst) {
            iov[0].iov_base = ep->rdst + ep->rgot;
            iov[0].iov_len = ep->rlen - ep->rgot;
            iov[1].iov_base = ep->rhdr.b;
            iov[1].iov_len = HDR_LEN;
            niov = 2;
        } else {
            /* (not while our reads are out: their chunks go straight
             * into the reader's buffer, not through a posted one) */
            if (ep->cr.granted && atomic_load(&ep->state) != S_HANDSHAKE && !atomic_load(&ep->nreads)) {
                rx_spec(cq, ep, now);
                return;
            }
            iov[0].iov_base = ep->rhdr.b + ep->rhdr_got;
            iov[0].iov_len = HDR_LEN - ep->rhdr_got;
            niov = 1;
        }
        want = iov[0].iov_len + (niov == 2 ? iov[1].iov_len : 0);
        n = readv(ep->fd, iov, niov);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            teardown(cq, ep, -errno, "read failed");
            return;
        }
        if (n == 0) {
            if (ep->rdst || ep->rhdr_got)
                teardown(cq, ep, -EPROTO, "peer closed in the middle of a frame");
            else if (atomic_load(&ep->state) == S_HANDSHAKE)
                teardown(cq, ep, -ECONNRESET, "peer closed during the handshake");
            else
                teardown_eof(cq, ep);
            return;
        }
        if (!ep->frame_ns)
            ep->frame_ns = now;
        if (ep->rkind == K_RRESP)
            cq->flow_ns = now;
        if (ep->rdst) {
            size_t p = ep->rlen - ep->rgot;
            if ((size_t)n < p)
                p = (size_t)n;
            ep->rgot += (uint32_t)p;
            ep->rhdr_got = (uint32_t)((size_t)n - p);
            if (ep->rgot == ep->rlen) {
                const char *why = NULL;
                int rc = body_done(cq, ep, &why);
                if (rc) {
                    teardown(cq, ep, rc, why);
                    return;
                }
                ep->frame_ns = ep->rhdr_got ? now : 0;
            }
        } else {
            ep->rhdr_got += (uint32_t)n;
        }
        if ((size_t)n < want && !(ep->rhdr_got == HDR_LEN && !ep->rdst))
            return; /* drained for now */
    }
}

static void on_event(struct tcp_cq *cq, struct tcp_ep *ep, uint32_t events, uint64_t now)
{
    if (atomic_load(&ep->state) == S_DEAD)
        return;
    if (events & EPOLLERR) {
        int err = 0;
        socklen_t l = sizeof err;
        getsockopt(ep->fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err) {
            teardown(cq, ep, -err, "socket error");
            return;
        }
    }
    if (events & EPOLLOUT) {
        pump(cq, ep);
        if (atomic_load(&ep->state) == S_DEAD)
            return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP | EPOLLERR))
        rx(cq, ep, now);
}

/* ---- CQ ops --------------------------------------------------------------------- */

static void adopt(struct tcp_cq *cq)
{
    struct tcp_ep *ep = atomic_exchange(&cq->adopt, NULL), *n;
    for (; ep; ep = n) {
        struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = ep };
        int rc;
        n = ep->anext;
        ep->next = cq->eps;
        ep->prev = NULL;
        if (cq->eps)
            cq->eps->prev = ep;
        cq->eps = ep;
        cq->neps++;
        /* A sender may have hit a full socket before we got here (its
         * EPOLL_CTL_MOD then failed): register EPOLLOUT for it now. */
        pthread_mutex_lock(&ep->lock);
        if (ep->pollout)
            e.events |= EPOLLOUT;
        rc = epoll_ctl(cq->epfd, EPOLL_CTL_ADD, ep->fd, &e) ? -errno : 0;
        pthread_mutex_unlock(&ep->lock);
        if (rc) {
            teardown(cq, ep, rc, "epoll_ctl failed");
            continue;
        }
        if (atomic_load(&ep->state) == S_HANDSHAKE)
            ep->frame_ns = vrpc_tp_now_ns();
        else if (ep->cr.granted < ep->cr.resv)
            vrpc_credit_hungry_add(&cq->cr, &ep->cr);
    }
}

static void scan_timeouts(struct tcp_cq *cq, uint64_t now)
{
    struct tcp_ep *ep, *n;
    const struct vrpc_transport_attr *a = &cq->base.tp->attr;
    uint64_t idle = (uint64_t)a->idle_timeout_ms * 1000000u, hs = (uint64_t)a->connect_timeout_ms * 1000000u;
    uint64_t ctmo = (uint64_t)a->credit_timeout_ms * 1000000u;
    for (ep = cq->eps; ep; ep = n) {
        uint64_t c = atomic_load(&ep->close_ns);
        n = ep->next;
        /* (times taken after now are not late: compare as now > t + limit) */
        if (atomic_load(&ep->state) == S_HANDSHAKE && now > ep->frame_ns + hs)
            teardown(cq, ep, -ETIMEDOUT, "handshake timed out");
        else if (ep->frame_ns && now > ep->frame_ns + idle)
            teardown(cq, ep, -ETIMEDOUT, "frame not completed within the idle timeout (slow or stuck peer)");
        else if (c && now > c + idle)
            teardown(cq, ep, -ETIMEDOUT, "peer did not finish the close");
        else if (atomic_load(&ep->nreads) && now > atomic_load(&ep->read_ns) + idle)
            teardown(cq, ep, -ETIMEDOUT, "our read got no data within the idle timeout (slow or stuck peer)");
        else if (vrpc_credit_wait_expired(atomic_load_explicit(&ep->wait_ns, memory_order_relaxed), now, ctmo)) {
            snprintf(ep->why, sizeof ep->why, "peer returned no credits for %u ms", a->credit_timeout_ms);
            teardown(cq, ep, -ETIMEDOUT, ep->why);
        }
    }
}

static void drain_done(struct tcp_cq *cq)
{
    struct vrpc_buf *b = mpsc_take_fifo(&cq->done), *n;
    for (; b; b = n) {
        n = b->next;
        stage(cq, b);
    }
}

static void finish_dead(struct tcp_cq *cq)
{
    struct tcp_ep *ep, *n;
    /* Everything the dead endpoints' senders pushed is in the done list
     * (pushed under the endpoint lock before teardown marked them dead). */
    drain_done(cq);
    for (ep = cq->dead; ep; ep = n) {
        n = ep->dnext;
        ep->ev_disc.len = 0;
        ep->ev_disc.priv[P_WRID] = 0;
        stage_fill(&ep->ev_disc, VRPC_WC_DISCONNECTED, ep->disc_status, ep, 0);
        stage(cq, &ep->ev_disc);
    }
    cq->dead = NULL;
    for (ep = cq->reap; ep; ep = n) {
        n = ep->dnext;
        vrpc_ep_unref(&ep->base);
    }
    cq->reap = NULL;
}

/* Start streaming for endpoints that got read requests in this pass (an
 * idle socket takes the first chunks at once; EPOLLOUT is armed only when it
 * fills, so a read costs no epoll_ctl round when the socket keeps up). */
static void pump_pending(struct tcp_cq *cq)
{
    struct tcp_ep *ep;
    while ((ep = cq->pumpq)) {
        cq->pumpq = ep->pnext;
        ep->pump_queued = false;
        if (atomic_load(&ep->state) != S_DEAD)
            pump(cq, ep);
    }
}

/* A busy poll may read the sockets directly instead of asking epoll first
 * (one syscall per poll and per arrival instead of two) when there are few of
 * them and none waits for EPOLLOUT. The eventfd is not read then: producers
 * kick it only while the poller sleeps, and the lists it announces are taken
 * on every pass anyway; a stale count is drained by the next epoll_wait. */
static bool direct_poll_ok(struct tcp_cq *cq)
{
    struct tcp_ep *ep;
    if (cq->neps > DIRECT_EPS || ++cq->polls % DIRECT_EPOLL_EVERY == 0)
        return false;
    for (ep = cq->eps; ep; ep = ep->next)
        if (atomic_load_explicit(&ep->pollout, memory_order_relaxed))
            return false;
    return true;
}

static void progress(struct tcp_cq *cq)
{
    uint64_t now = vrpc_tp_now_ns();
    struct tcp_ep *ep, *next, *aborts;
    bool direct = false;
    int i, nev;

    nev = cq->nev;
    cq->nev = 0;
    /* Busy-polling CQs poll the sockets here; sleeping ones only in cq_wait
     * (level-triggered, so it returns at once while anything is ready): that
     * keeps a blocking round trip at about the syscalls of a blocking socket. */
    if (!nev && cq->base.attr.busy_poll_us) {
        direct = direct_poll_ok(cq);
        if (!direct)
            nev = epoll_wait(cq->epfd, cq->ev, MAX_EVENTS, 0);
    }
    /* Consume the kick before taking the lists it announces: a push that
     * kicked us is then visible below. (The other order loses a wake-up: a
     * push after adopt() whose kick is drained here would sleep forever.) */
    for (i = 0; i < nev; i++)
        if (!cq->ev[i].data.ptr) {
            uint64_t v;
            ssize_t r = read(cq->evfd, &v, sizeof v);
            (void)r;
        }
    aborts = atomic_exchange(&cq->aborts, NULL); /* before adopt: see run_aborts */
    adopt(cq);
    run_aborts(cq, aborts);
    for (i = 0; i < nev; i++)
        if (cq->ev[i].data.ptr)
            on_event(cq, cq->ev[i].data.ptr, cq->ev[i].events, now);
    for (ep = direct ? cq->eps : NULL; ep; ep = next) {
        next = ep->next; /* a teardown unlinks ep */
        rx(cq, ep, now);
    }
    pump_pending(cq);
    if (now >= cq->next_scan) {
        cq->next_scan = now + SCAN_NS;
        scan_timeouts(cq, now);
    }
    vrpc_credit_distribute(&cq->cr, credit_send);
    finish_dead(cq);
}

static int tcp_cq_poll(struct vrpc_cq *base, struct vrpc_wc *wc, unsigned max)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    unsigned n = 0;

    if (!cq->out.head)
        progress(cq);
    while (n < max && cq->out.head) {
        struct vrpc_buf *b = fifo_pop(&cq->out);
        uint32_t op = (uint32_t)b->priv[P_OPST];
        struct vrpc_wc *w = &wc[n++];
        w->wr_id = b->priv[P_WRID];
        w->ep = (struct vrpc_ep *)(uintptr_t)b->priv[P_EP];
        w->opcode = op;
        w->status = (int32_t)(uint32_t)(b->priv[P_OPST] >> 32);
        w->imm = (uint32_t)b->priv[P_IMM];
        w->byte_len = b->len;
        if (op <= VRPC_WC_SEND) {
            w->buf = b;
        } else if (op == VRPC_WC_READ) {
            /* the carrier is the slot's; the slot is free from now on */
            w->buf = (struct vrpc_buf *)(uintptr_t)b->priv[P_IMM];
            w->imm = 0;
            atomic_store(&container_of(b, struct rslot, cpl)->used, false);
        } else if (op == VRPC_WC_REVOKE) {
            w->buf = NULL;
            grant_release(container_of(cq->base.tp, struct tcp_tp, base), container_of(b, struct grant, cpl));
        } else {
            w->buf = NULL;
        }
    }
    if (n)
        atomic_store(&cq->sleeping, 0);
    return (int)n;
}

static void tcp_cq_arm(struct vrpc_cq *base)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    atomic_store(&cq->sleeping, 1);
}

static void tcp_cq_wait(struct vrpc_cq *base, int timeout_ms)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    int n;
    /* A kick between the arm and now reset sleeping, and the poll after the
     * arm may have drained its eventfd write: sleeping now would miss every
     * later push (their producers see sleeping == 0 and do not kick). */
    if (!atomic_load(&cq->sleeping))
        return;
    /* A large transfer moved bytes through this CQ within the busy window:
     * more are on their way (the rest of a chunk, the next chunk), so do not
     * sleep; the poller starts a new busy window. Sleeping here costs a
     * wake-up per arrival or per drained socket while the transfer runs
     * (an IPI to an idle CPU, or a turn behind whatever took it). */
    if (cq->base.attr.busy_poll_us && vrpc_tp_now_ns() - cq->flow_ns < (uint64_t)cq->base.attr.busy_poll_us * 1000u &&
        !container_of(cq->base.tp, struct tcp_tp, base)->no_flow_busy) {
        atomic_store(&cq->sleeping, 0);
        return;
    }
    /* Endpoints need their timeouts checked even when nothing happens. */
    if (cq->neps && (timeout_ms < 0 || timeout_ms > 100))
        timeout_ms = 100;
    n = epoll_wait(cq->epfd, cq->ev, MAX_EVENTS, timeout_ms);
    cq->nev = n > 0 ? n : 0;
    atomic_store(&cq->sleeping, 0);
}

static void tcp_cq_kick(struct vrpc_cq *base)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    uint64_t one = 1;
    ssize_t r = write(cq->evfd, &one, sizeof one);
    (void)r;
}

static void tcp_cq_flush(struct vrpc_cq *base)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    struct vrpc_buf *b;
    struct tcp_ep *ab = atomic_exchange(&cq->aborts, NULL);
    adopt(cq);
    run_aborts(cq, ab);
    /* Stage what is already done first, so per-endpoint order holds. */
    drain_done(cq);
    while (cq->eps)
        teardown(cq, cq->eps, -ECANCELED, NULL);
    finish_dead(cq);
    take_posted(cq);
    while ((b = cq->free)) {
        cq->free = b->next;
        b->len = 0;
        stage_fill(b, VRPC_WC_RECV, -ECANCELED, NULL, 0);
        stage(cq, b);
    }
    atomic_store(&cq->cr.posted, 0);
    atomic_store(&cq->cr.avail, 0);
}

static int tcp_post_recv(struct vrpc_cq *base, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    unsigned i;
    if (atomic_load_explicit(&base->stopping, memory_order_acquire))
        return -ESHUTDOWN;
    if (atomic_fetch_add(&cq->cr.posted, (int)n) + (int)n > (int)base->attr.max_recv) {
        atomic_fetch_sub(&cq->cr.posted, (int)n);
        return -ENOSPC;
    }
    for (i = 0; i < n; i++) {
        bufs[i]->priv[P_WRID] = wr_ids ? wr_ids[i] : 0;
        bufs[i]->next = i + 1 < n ? bufs[i + 1] : NULL;
    }
    mpsc_push(&cq->posted_in, bufs[0], bufs[n - 1]);
    atomic_fetch_add(&cq->cr.avail, (int)n);
    kick(cq);
    return 0;
}

static void tcp_cq_destroy(struct vrpc_cq *base)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    if (cq->epfd >= 0)
        close(cq->epfd);
    if (cq->evfd >= 0)
        close(cq->evfd);
    free(cq);
}

static int tcp_cq_create(struct vrpc_transport *tp, const struct vrpc_cq_attr *attr, struct vrpc_cq **out)
{
    struct tcp_cq *cq = calloc(1, sizeof *cq);
    struct epoll_event e = { .events = EPOLLIN, .data.ptr = NULL };
    int rc;
    if (!cq)
        return -ENOMEM;
    vrpc_credit_pool_init(&cq->cr, MIN_RESV, 0); /* a credit-only frame uses no receive */
    cq->epfd = epoll_create1(EPOLL_CLOEXEC);
    cq->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (cq->epfd < 0 || cq->evfd < 0 || epoll_ctl(cq->epfd, EPOLL_CTL_ADD, cq->evfd, &e)) {
        rc = -errno;
        tcp_cq_destroy(&cq->base);
        return rc;
    }
    *out = &cq->base;
    return 0;
}

/* ---- endpoints ---------------------------------------------------------------- */

static struct tcp_ep *ep_alloc(struct vrpc_transport *tp, struct tcp_cq *cq, int fd, void *user, int refs)
{
    struct tcp_ep *ep = calloc(1, sizeof *ep);
    if (!ep)
        return NULL;
    vrpc_ep_base_init(&ep->base, tp, &cq->base, user, refs);
    ep->cq = cq;
    ep->fd = fd;
    pthread_mutex_init(&ep->lock, NULL);
    ep->max_queued = tp->attr.max_queued;
    ep->cr.target = tp->attr.credits;
    ep->ctrl.data = ep->ctrl_space + HDR_LEN;
    ep->errf.data = ep->err_space + HDR_LEN;
    atomic_init(&ep->nreads, 0);
    atomic_init(&ep->read_ns, 0);
    atomic_init(&ep->state, S_HANDSHAKE);
    return ep;
}

static void tcp_ep_free(struct vrpc_ep *base)
{
    struct tcp_ep *ep = container_of(base, struct tcp_ep, base);
    pthread_mutex_destroy(&ep->lock);
    free(ep->rslots);
    free(ep->jobs);
    free(ep);
}

static void hand_to_poller(struct tcp_cq *cq, struct tcp_ep *ep)
{
    struct tcp_ep *old = atomic_load(&cq->adopt);
    do
        ep->anext = old;
    while (!atomic_compare_exchange_weak(&cq->adopt, &old, ep));
    kick(cq);
}

static void set_sock_opts(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Blocking helpers for the connecting thread, bounded by deadline_ns. */
static int wait_fd(int fd, short ev, uint64_t deadline_ns)
{
    struct pollfd p = { .fd = fd, .events = ev };
    for (;;) {
        uint64_t now = vrpc_tp_now_ns();
        int r;
        if (now >= deadline_ns)
            return -ETIMEDOUT;
        r = poll(&p, 1, (int)((deadline_ns - now) / 1000000u) + 1);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -errno;
    }
}

static int io_full(int fd, void *buf, size_t len, bool wr, uint64_t deadline_ns)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = wr ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL) : recv(fd, (char *)buf + done, len - done, 0);
        int rc;
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        if ((rc = wait_fd(fd, wr ? POLLOUT : POLLIN, deadline_ns)))
            return rc;
    }
    return 0;
}

static int tcp_connect(struct vrpc_transport *tp, const struct vrpc_addr *dst, const struct vrpc_addr *src,
                       const struct vrpc_ep_attr *attr, struct vrpc_ep **out)
{
    struct tcp_cq *cq = container_of(attr->cq, struct tcp_cq, base);
    uint32_t tmo = attr->timeout_ms ? attr->timeout_ms : tp->attr.connect_timeout_ms, grant;
    uint64_t deadline = vrpc_tp_now_ns() + (uint64_t)tmo * 1000000u;
    union {
        struct vrpc_tcp_hdr h;
        char b[HDR_LEN];
    } m;
    struct tcp_ep *ep;
    int fd, rc, err = 0;
    socklen_t l = sizeof err;

    fd = socket(dst->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (src && bind(fd, (const struct sockaddr *)&src->ss, src->len)) {
        rc = -errno;
        goto err_fd;
    }
    if (connect(fd, (const struct sockaddr *)&dst->ss, dst->len) && errno != EINPROGRESS) {
        rc = -errno;
        goto err_fd;
    }
    if ((rc = wait_fd(fd, POLLOUT, deadline))) {
        vrpc_tp_log("tcp: connect: no TCP connection within %u ms", tmo);
        goto err_fd;
    }
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
    if (err) {
        rc = -err;
        goto err_fd;
    }
    set_sock_opts(fd);
    grant = vrpc_credit_reserve(&cq->cr);
    if (!grant) {
        vrpc_tp_log("tcp: connect: no receive buffer left on the CQ to reserve for the peer: post more");
        rc = -ENOBUFS;
        goto err_fd;
    }
    build_hdr(m.b, F_HELLO, 0, tp->attr.eager_size, grant);
    if ((rc = io_full(fd, m.b, HDR_LEN, true, deadline)) || (rc = io_full(fd, m.b, HDR_LEN, false, deadline))) {
        if (rc == -ETIMEDOUT)
            vrpc_tp_log("tcp: connect: the server did not answer the handshake within %u ms", tmo);
        goto err_grant;
    }
    if (le32toh(m.h.magic) != MAGIC || m.h.version != VERSION || m.h.type != F_HELLO_ACK ||
        le32toh(m.h.imm) > tp->attr.eager_size) {
        rc = -EPROTO;
        goto err_grant;
    }
    if (le16toh(m.h.credits) < MIN_RESV || le32toh(m.h.imm) < VRPC_EAGER_MIN) {
        vrpc_tp_log("tcp: connect: refused the server's handshake: %u credits (at least %u needed), eager size %u "
                    "(at least %u)", le16toh(m.h.credits), MIN_RESV, le32toh(m.h.imm), VRPC_EAGER_MIN);
        rc = -EPROTO;
        goto err_grant;
    }
    ep = ep_alloc(tp, cq, fd, attr->user, 2);
    if (!ep) {
        rc = -ENOMEM;
        goto err_grant;
    }
    if (attr->max_queued)
        ep->max_queued = attr->max_queued;
    ep->base.eager = le32toh(m.h.imm);
    ep->send_credits = le16toh(m.h.credits);
    ep->cr.resv = ep->cr.granted = grant;
    ep->reported = true;
    atomic_store(&ep->state, S_OPEN);
    vrpc_addr_format("tcp", (const struct sockaddr *)&dst->ss, ep->base.peer_uri, sizeof ep->base.peer_uri);
    hand_to_poller(cq, ep);
    *out = &ep->base;
    return 0;
err_grant:
    atomic_fetch_add(&cq->cr.avail, (int)grant);
    kick(cq);
    if (rc == -ECONNRESET)
        rc = -ECONNREFUSED; /* the listener went away during the handshake */
err_fd:
    close(fd);
    return rc;
}

/* ---- listener --------------------------------------------------------------------- */

static void listener_unref(struct tcp_listener *l)
{
    if (atomic_fetch_sub(&l->refs, 1) == 1) {
        free(l->cqs);
        free(l);
    }
}

/* Out of descriptors (or memory) the pending connection stays queued and
 * the listen fd stays readable: instead of retrying at once, the listener
 * stops polling it for a while (ACCEPT_PAUSE_MIN_MS, doubling up to
 * ACCEPT_PAUSE_MAX_MS while it lasts) and logs once per ACCEPT_LOG_S with a
 * count. A destroy still wakes it through the eventfd. */
#define ACCEPT_PAUSE_MIN_MS 10
#define ACCEPT_PAUSE_MAX_MS 1000
#define ACCEPT_LOG_S 5

static void *listener_main(void *arg)
{
    struct tcp_listener *l = arg;
    struct pollfd p[2] = { { .fd = l->fd, .events = POLLIN }, { .fd = l->evfd, .events = POLLIN } };
    int pause_ms = 0;
    unsigned long fails = 0;
    uint64_t logged_ns = 0;
    while (!atomic_load(&l->closed)) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        struct tcp_cq *cq;
        struct tcp_ep *ep;
        int fd, e;

        /* while paused only the eventfd is watched (a negative fd is skipped) */
        p[0].fd = pause_ms ? -1 : l->fd;
        if (poll(p, 2, pause_ms ? pause_ms : -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        while ((fd = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
            pause_ms = 0;
            cq = l->cqs[l->rr++ % l->ncqs];
            set_sock_opts(fd);
            ep = ep_alloc(l->base.tp, cq, fd, NULL, 1);
            if (!ep) {
                close(fd);
                continue;
            }
            vrpc_addr_format("tcp", (struct sockaddr *)&ss, ep->base.peer_uri, sizeof ep->base.peer_uri);
            atomic_fetch_add(&l->refs, 1);
            ep->lst = l;
            ep->accept_user = l->user;
            hand_to_poller(cq, ep);
            sl = sizeof ss;
        }
        e = errno;
        if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
            uint64_t now = vrpc_tp_now_ns();
            fails++;
            if (!logged_ns || now - logged_ns >= (uint64_t)ACCEPT_LOG_S * 1000000000u) {
                vrpc_tp_log("tcp: accept: %s (%lu time%s since the last report; pausing accepts up to %d ms)",
                            strerror(e), fails, fails == 1 ? "" : "s", ACCEPT_PAUSE_MAX_MS);
                logged_ns = now;
                fails = 0;
            }
            pause_ms = pause_ms ? (pause_ms * 2 > ACCEPT_PAUSE_MAX_MS ? ACCEPT_PAUSE_MAX_MS : pause_ms * 2)
                                : ACCEPT_PAUSE_MIN_MS;
        } else if (e == EAGAIN || e == EWOULDBLOCK) {
            pause_ms = 0;
        }
    }
    return NULL;
}

static void tcp_listener_destroy(struct vrpc_listener *base)
{
    struct tcp_listener *l = container_of(base, struct tcp_listener, base);
    uint64_t one = 1;
    atomic_store(&l->closed, true);
    if (l->started) {
        ssize_t r = write(l->evfd, &one, sizeof one);
        (void)r;
        pthread_join(l->thread, NULL);
    }
    if (l->fd >= 0)
        close(l->fd);
    if (l->evfd >= 0)
        close(l->evfd);
    listener_unref(l);
}

static int tcp_listen(struct vrpc_transport *tp, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
                      struct vrpc_listener **out)
{
    struct tcp_listener *l = calloc(1, sizeof *l);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int one = 1, rc;
    unsigned i;

    if (!l)
        return -ENOMEM;
    l->base.tp = tp;
    l->fd = l->evfd = -1;
    atomic_init(&l->refs, 1);
    atomic_init(&l->closed, false);
    atomic_init(&l->nconns, 0);
    l->max_conns = attr->max_conns;
    l->user = attr->user;
    l->ncqs = attr->ncqs;
    l->cqs = calloc(attr->ncqs, sizeof *l->cqs);
    if (!l->cqs) {
        rc = -ENOMEM;
        goto err;
    }
    for (i = 0; i < attr->ncqs; i++) {
        if (!attr->cqs[i] || attr->cqs[i]->tp != tp) {
            rc = -EINVAL;
            goto err;
        }
        l->cqs[i] = container_of(attr->cqs[i], struct tcp_cq, base);
    }
    l->fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    l->evfd = eventfd(0, EFD_CLOEXEC);
    if (l->fd < 0 || l->evfd < 0) {
        rc = -errno;
        goto err;
    }
    setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l->fd, (const struct sockaddr *)&addr->ss, addr->len) ||
        listen(l->fd, attr->backlog > 0 ? attr->backlog : 1024) ||
        getsockname(l->fd, (struct sockaddr *)&ss, &sl)) {
        rc = -errno;
        goto err;
    }
    vrpc_addr_format("tcp", (struct sockaddr *)&ss, l->base.uri, sizeof l->base.uri);
    rc = -pthread_create(&l->thread, NULL, listener_main, l);
    if (rc)
        goto err;
    l->started = true;
    *out = &l->base;
    return 0;
err:
    tcp_listener_destroy(&l->base);
    return rc;
}

/* ---- transport and memory --------------------------------------------------------- */

static int tcp_tp_create(const struct vrpc_transport_attr *attr, struct vrpc_transport **out)
{
    struct tcp_tp *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    pthread_mutex_init(&t->gmu, NULL);
    t->no_flow_busy = vrpc_env_flag(VRPC_ENV_TCP_NO_FLOW_BUSY);
    t->ep_grants = (uint32_t)vrpc_env_long(VRPC_ENV_TCP_TEST_EP_GRANTS);
    t->base.headroom = HDR_LEN; /* the frame header is written in front of the payload */
    *out = &t->base;
    return 0;
}

static void tcp_tp_destroy(struct vrpc_transport *tp)
{
    struct tcp_tp *t = container_of(tp, struct tcp_tp, base);
    uint32_t i;
    for (i = 0; i < t->nblocks; i++)
        free(t->blocks[i]);
    pthread_mutex_destroy(&t->gmu);
    free(t);
}

static int tcp_mr_reg(struct vrpc_transport *tp, void *addr, size_t len, unsigned access, struct vrpc_mr **out)
{
    struct vrpc_mr *mr;
    if (access & VRPC_ACCESS_REMOTE_READ)
        return -ENOSYS;
    mr = calloc(1, sizeof *mr);
    if (!mr)
        return -ENOMEM;
    mr->tp = tp;
    mr->addr = addr;
    mr->len = len;
    mr->access = access;
    *out = mr;
    return 0;
}

static void tcp_mr_dereg(struct vrpc_mr *mr)
{
    free(mr);
}

static int tcp_probe(void)
{
    return 0;
}

const struct vrpc_transport_ops vrpc_tcp_ops = {
    VRPC_TP_OPS_HEAD,
    .name = "tcp",
    .caps = VRPC_TP_CAP_GATHER,
    .probe = tcp_probe,
    .tp_create = tcp_tp_create,
    .tp_destroy = tcp_tp_destroy,
    .mr_reg = tcp_mr_reg,
    .mr_dereg = tcp_mr_dereg,
    .cq_create = tcp_cq_create,
    .cq_destroy = tcp_cq_destroy,
    .cq_poll = tcp_cq_poll,
    .cq_arm = tcp_cq_arm,
    .cq_wait = tcp_cq_wait,
    .cq_kick = tcp_cq_kick,
    .cq_flush = tcp_cq_flush,
    .post_recv = tcp_post_recv,
    .listen = tcp_listen,
    .listener_destroy = tcp_listener_destroy,
    .connect = tcp_connect,
    .send = tcp_send,
    .read = tcp_read,
    .grant = tcp_grant,
    .revoke = tcp_revoke,
    .grant_segs = tcp_grant_segs,
    .close = tcp_close,
    .abort = tcp_abort,
    .ep_free = tcp_ep_free,
};
