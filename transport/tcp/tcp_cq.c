/* The TCP backend's completion queue and progress (the poller side): the
 * epoll set, the readv receive path with its speculative fast path, frame
 * parsing, staged completions, flow busy-waiting and the CQ's ops. */
#define _GNU_SOURCE
#include "transport/tcp/tcp.h"

#define SCAN_NS 100000000ull  /* how often the poller checks timeouts */
#define DIRECT_EPS 4          /* a busy-polling CQ with at most this many endpoints reads them directly */
#define DIRECT_EPOLL_EVERY 16 /* ... and still asks epoll every so many polls */

/* handle_hdr's DATA frame of len bytes: checked against the eager size and
 * the credits, it takes a posted buffer (*spec if the payload is in it). */
static int data_hdr(struct tcp_cq *cq, struct tcp_ep *ep, uint32_t len, uint32_t imm, struct vrpc_buf **spec,
                    const char **why)
{
    struct vrpc_buf *b;

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
        b = tcp_cq_get_posted(cq);
    }
    if (!b) { /* cannot happen while promised <= posted holds */
        *why = "no receive buffer for a credited message";
        return -ENOBUFS;
    }
    vrpc_credit_consumed(&cq->cr, &ep->cr);
    atomic_fetch_sub(&cq->cr.posted, 1);
    b->len = len;
    if (!len) {
        tcp_cq_stage_fill(b, VRPC_WC_RECV, 0, ep, imm);
        tcp_cq_stage(cq, b);
        ep->frame_ns = 0;
        return 0;
    }
    ep->rbuf = b;
    ep->rdst = b->data;
    ep->rkind = K_DATA;
    ep->rgot = 0;
    ep->rlen = len;
    ep->rimm = imm;
    return 0;
}

/* A complete header is in ep->rhdr. Returns 0 or a negative errno (protocol error). */
static int handle_hdr(struct tcp_cq *cq, struct tcp_ep *ep, struct vrpc_buf **spec, const char **why)
{
    struct vrpc_tcp_hdr h = ep->rhdr.h;
    uint32_t len = le32toh(h.len), credits = le16toh(h.credits);

    ep->rhdr_got = 0;
    if (le32toh(h.magic) != MAGIC || h.version != VERSION) {
        *why = "bad frame header (garbage or another protocol)";
        return -EPROTO;
    }
    if (h.type == F_HELLO)
        return vrpc_tcp_cm_handle_hello(cq, ep, &h, why);
    if (atomic_load(&ep->state) == S_HANDSHAKE) {
        *why = "frame before handshake";
        return -EPROTO;
    }
    if (credits) {
        pthread_mutex_lock(&ep->lock);
        tcp_msg_add_credits_locked(ep, credits);
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
        return vrpc_tcp_rma_handle_read_hdr(cq, ep, h.type, len, le32toh(h.imm), why);
    if (h.type != F_DATA) {
        *why = "unknown frame type";
        return -EPROTO;
    }
    return data_hdr(cq, ep, len, le32toh(h.imm), spec, why);
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
        tcp_cq_stage_fill(b, VRPC_WC_RECV, 0, ep, ep->rimm);
        tcp_cq_stage(cq, b);
        return 0;
    }
    if (k == K_RREQ)
        return vrpc_tcp_rma_handle_read_req(ep, why);
    {
        struct tcp_rslot *r = ep->rslot;
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
            vrpc_tcp_rma_complete_read(cq, ep, r, 0);
            if (atomic_load(&ep->state) == S_CLOSING) { /* the close may have waited for it */
                pthread_mutex_lock(&ep->lock);
                vrpc_tcp_msg_tx_locked(ep);
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
    struct vrpc_buf *spec = tcp_cq_get_posted(cq);
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
        tcp_cq_put_posted(cq, spec);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0)
            vrpc_tcp_ep_teardown(cq, ep, -errno, "read failed");
        else if (ep->rhdr_got)
            vrpc_tcp_ep_teardown(cq, ep, -EPROTO, "peer closed in the middle of a frame");
        else
            vrpc_tcp_ep_teardown_eof(cq, ep);
        return;
    }
    if ((size_t)n <= hrem) {
        tcp_cq_put_posted(cq, spec);
        ep->rhdr_got += (uint32_t)n;
        if (!ep->frame_ns)
            ep->frame_ns = now;
        if ((size_t)n == hrem && (rc = handle_hdr(cq, ep, NULL, &why)))
            vrpc_tcp_ep_teardown(cq, ep, rc, why); /* a whole header, nothing after it yet */
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
        tcp_cq_put_posted(cq, spec);
    if (rc) {
        vrpc_tcp_ep_teardown(cq, ep, rc, why);
        return;
    }
    if (!ep->rdst && !ep->rhdr_got)
        ep->frame_ns = 0;
    else if (!ep->frame_ns)
        ep->frame_ns = now;
    /* One read per readiness report: level-triggered epoll reports the socket
     * again if more is waiting, and other connections get their turn. */
}

/* Bodies of at least this many bytes still to come (READ_RESP chunks of a
 * large read) are waited for whole: SO_RCVLOWAT makes the socket readable
 * (epoll) only once that much has arrived, at most LOWAT_MAX. Without it the
 * poller is woken, or finds the socket readable, for every few segments the
 * peer's sends put on the wire: on loopback a 1 MiB read cost ~20 wake-ups
 * and readv calls (~300 while spinning), each wake-up an IPI to the reading
 * CPU. A peer that sends less than it announced stalls the body as before
 * (the upper layers' transfer limits end it). */
#define LOWAT_MIN (64u << 10)
#define LOWAT_MAX (256u << 10)

static void rx_lowat(struct tcp_ep *ep)
{
    uint32_t left = ep->rdst && ep->rkind == K_RRESP ? ep->rlen - ep->rgot : 0;
    uint32_t want = left >= LOWAT_MIN ? (left < LOWAT_MAX ? left : LOWAT_MAX) : 0;
    if (want == ep->lowat)
        return;
    int v = want ? (int)want : 1;
    if (setsockopt(ep->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0)
        ep->lowat = want;
}

#define CARRY_FRAMES 16u

static size_t carry_len(uint32_t body)
{
    size_t n = (size_t)CARRY_FRAMES * (body + HDR_LEN);
    return n < TCP_RX_CARRY ? n : TCP_RX_CARRY;
}

/* Read what the socket has for ep, a bounded amount per call (level-triggered
 * epoll calls again), straight into the posted buffer, the next header after. */
static void rx_frames(struct tcp_cq *cq, struct tcp_ep *ep, uint64_t now)
{
    int rounds;
    for (rounds = 0; rounds < 32 && ep->fd >= 0; rounds++) {
        struct iovec iov[2];
        size_t want;
        ssize_t n;
        int niov;
        bool carry = false;

        if (!ep->rdst && ep->rhdr_got == HDR_LEN) {
            const char *why = NULL;
            int rc = handle_hdr(cq, ep, NULL, &why);
            if (rc) {
                vrpc_tcp_ep_teardown(cq, ep, rc, why);
                return;
            }
            continue;
        }
        if (ep->rdst) {
            iov[0].iov_base = ep->rdst + ep->rgot;
            iov[0].iov_len = ep->rlen - ep->rgot;
            /* After a message, what else is queued, into the carry: a
             * backlog of frames costs one read, not one per frame. At most
             * CARRY_FRAMES frames of this one's size (and the carry's size):
             * what one pass parses for one connection stays in proportion to
             * the messages it sends (a peer that follows a small message
             * with 64 KiB of header-only frames would hold the poller from
             * the other connections ~10x longer than a read of one message
             * does). After a large read's chunk only the next header, so
             * that the next chunk goes straight into the reader's buffer. */
            carry = ep->rkind != K_RRESP;
            iov[1].iov_base = carry ? (void *)cq->carry : (void *)ep->rhdr.b;
            iov[1].iov_len = carry ? carry_len(ep->rlen) : HDR_LEN;
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
            vrpc_tcp_ep_teardown(cq, ep, -errno, "read failed");
            return;
        }
        if (n == 0) {
            if (ep->rdst || ep->rhdr_got)
                vrpc_tcp_ep_teardown(cq, ep, -EPROTO, "peer closed in the middle of a frame");
            else if (atomic_load(&ep->state) == S_HANDSHAKE)
                vrpc_tcp_ep_teardown(cq, ep, -ECONNRESET, "peer closed during the handshake");
            else
                vrpc_tcp_ep_teardown_eof(cq, ep);
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
            if (!carry)
                ep->rhdr_got = (uint32_t)((size_t)n - p);
            if (ep->rgot == ep->rlen) {
                const char *why = NULL;
                int rc = body_done(cq, ep, &why);
                if (!rc && carry && (size_t)n > p)
                    rc = consume(cq, ep, cq->carry, (size_t)n - p, now, NULL, &why);
                if (rc) {
                    vrpc_tcp_ep_teardown(cq, ep, rc, why);
                    return;
                }
                ep->frame_ns = ep->rdst || ep->rhdr_got ? now : 0;
                if (carry && (size_t)n > p)
                    return; /* one carry's worth of frames per readiness report, as rx_spec */
            }
        } else {
            ep->rhdr_got += (uint32_t)n;
        }
        if ((size_t)n < want && !(ep->rhdr_got == HDR_LEN && !ep->rdst))
            return; /* drained for now */
    }
}

/* rx_frames, then the socket's low mark for what is left of the body (on
 * every way out: a mark left over from a finished body would hide the next
 * frames). */
static void rx(struct tcp_cq *cq, struct tcp_ep *ep, uint64_t now)
{
    rx_frames(cq, ep, now);
    if (ep->fd >= 0 && atomic_load(&ep->state) != S_DEAD)
        rx_lowat(ep);
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
            vrpc_tcp_ep_teardown(cq, ep, -err, "socket error");
            return;
        }
    }
    if (events & EPOLLOUT) {
        vrpc_tcp_rma_pump(cq, ep);
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
        struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = ep};
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
            vrpc_tcp_ep_teardown(cq, ep, rc, "epoll_ctl failed");
            continue;
        }
        if (atomic_load(&ep->state) == S_HANDSHAKE)
            ep->frame_ns = vrpc_tp_now_ns();
        else if (ep->cr.granted < ep->cr.resv)
            vrpc_credit_hungry_add(&cq->cr, &ep->cr);
    }
}

static void drain_done(struct tcp_cq *cq)
{
    struct vrpc_buf *b = tcp_mpsc_take_fifo(&cq->done), *n;
    for (; b; b = n) {
        n = b->next;
        tcp_cq_stage(cq, b);
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
        tcp_cq_stage_fill(&ep->ev_disc, VRPC_WC_DISCONNECTED, ep->disc_status, ep, 0);
        tcp_cq_stage(cq, &ep->ev_disc);
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
            vrpc_tcp_rma_pump(cq, ep);
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
        if (atomic_load_explicit(&ep->pollout, memory_order_relaxed) || ep->lowat)
            return false; /* (a body waited for whole: epoll says when it is there) */
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
    vrpc_tcp_ep_run_aborts(cq, aborts);
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
        vrpc_tcp_ep_scan_timeouts(cq, now);
    }
    vrpc_credit_distribute(&cq->cr, vrpc_tcp_msg_credit_send);
    finish_dead(cq);
}

int vrpc_tcp_cq_poll(struct vrpc_cq *base, struct vrpc_wc *wc, unsigned max)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    unsigned n = 0;

    if (!cq->out.head)
        progress(cq);
    while (n < max && cq->out.head) {
        struct vrpc_buf *b = tcp_fifo_pop(&cq->out);
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
            atomic_store(&container_of(b, struct tcp_rslot, cpl)->used, false);
        } else if (op == VRPC_WC_REVOKE) {
            w->buf = NULL;
            vrpc_grant_release(&container_of(cq->base.tp, struct tcp_tp, base)->grants,
                               container_of(b, struct vrpc_grant, cpl));
        } else {
            w->buf = NULL;
        }
    }
    if (n)
        atomic_store(&cq->sleeping, 0);
    return (int)n;
}

void vrpc_tcp_cq_arm(struct vrpc_cq *base)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    atomic_store(&cq->sleeping, 1);
}

void vrpc_tcp_cq_wait(struct vrpc_cq *base, int timeout_ms)
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

void vrpc_tcp_cq_kick(struct vrpc_cq *base)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    uint64_t one = 1;
    ssize_t r = write(cq->evfd, &one, sizeof one);
    (void)r;
}

void vrpc_tcp_cq_flush(struct vrpc_cq *base)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    struct vrpc_buf *b;
    struct tcp_ep *ab = atomic_exchange(&cq->aborts, NULL);
    adopt(cq);
    vrpc_tcp_ep_run_aborts(cq, ab);
    /* Stage what is already done first, so per-endpoint order holds. */
    drain_done(cq);
    while (cq->eps)
        vrpc_tcp_ep_teardown(cq, cq->eps, -ECANCELED, NULL);
    finish_dead(cq);
    tcp_cq_take_posted(cq);
    while ((b = cq->free)) {
        cq->free = b->next;
        b->len = 0;
        tcp_cq_stage_fill(b, VRPC_WC_RECV, -ECANCELED, NULL, 0);
        tcp_cq_stage(cq, b);
    }
    atomic_store(&cq->cr.posted, 0);
    atomic_store(&cq->cr.avail, 0);
}

int vrpc_tcp_cq_post_recv(struct vrpc_cq *base, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n)
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
    tcp_mpsc_push(&cq->posted_in, bufs[0], bufs[n - 1]);
    atomic_fetch_add(&cq->cr.avail, (int)n);
    tcp_cq_wake(cq);
    return 0;
}

void vrpc_tcp_cq_destroy(struct vrpc_cq *base)
{
    struct tcp_cq *cq = container_of(base, struct tcp_cq, base);
    if (cq->epfd >= 0)
        close(cq->epfd);
    if (cq->evfd >= 0)
        close(cq->evfd);
    free(cq->carry);
    free(cq);
}

int vrpc_tcp_cq_create(struct vrpc_transport *tp, const struct vrpc_cq_attr *attr, struct vrpc_cq **out)
{
    struct tcp_cq *cq = calloc(1, sizeof *cq);
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
    int rc;
    if (!cq)
        return -ENOMEM;
    vrpc_credit_pool_init(&cq->cr, MIN_RESV, 0); /* a credit-only frame uses no receive */
    cq->epfd = cq->evfd = -1;
    if (!(cq->carry = malloc(TCP_RX_CARRY))) {
        vrpc_tcp_cq_destroy(&cq->base);
        return -ENOMEM;
    }
    cq->epfd = epoll_create1(EPOLL_CLOEXEC);
    cq->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (cq->epfd < 0 || cq->evfd < 0 || epoll_ctl(cq->epfd, EPOLL_CTL_ADD, cq->evfd, &e)) {
        rc = -errno;
        vrpc_tcp_cq_destroy(&cq->base);
        return rc;
    }
    *out = &cq->base;
    return 0;
}
