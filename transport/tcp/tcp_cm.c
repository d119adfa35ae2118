/* The TCP backend's connection management: the listener thread (accept with
 * backoff), the connecting side, and the HELLO/HELLO_ACK handshake with its
 * refusals (transport.h, "Handshake minimums"). */
#define _GNU_SOURCE
#include "transport/tcp/tcp.h"

/* What a peer announces at the handshake must leave it a working connection
 * that cannot hold our resources cheaply (transport.h, "Handshake minimums"):
 * at least MIN_RESV credits and an eager size of at least VRPC_EAGER_MIN.
 * NULL when acceptable, else the reason (written into ep->why). */
static const char *hello_refusal(struct tcp_ep *ep, uint32_t credits, uint32_t eager)
{
    if (credits < MIN_RESV)
        snprintf(ep->why, sizeof ep->why, "refused: the peer grants %u credits, at least %u needed", credits, MIN_RESV);
    else if (eager < VRPC_EAGER_MIN)
        snprintf(ep->why, sizeof ep->why, "refused: the peer's eager size %u is below the minimum %u", eager,
                 VRPC_EAGER_MIN);
    else
        return NULL;
    return ep->why;
}

int vrpc_tcp_cm_handle_hello(struct tcp_cq *cq, struct tcp_ep *ep, const struct vrpc_tcp_hdr *h, const char **why)
{
    uint32_t eager = le32toh(h->imm), grant, n;
    struct tcp_listener *l = ep->lst;
    char ack[HDR_LEN];
    ssize_t w;

    *why = "unexpected HELLO";
    if (atomic_load(&ep->state) != S_HANDSHAKE || !l)
        return -EPROTO;
    if (le32toh(h->len)) { /* a HELLO has no payload: its "payload" would be read as the next header */
        snprintf(ep->why, sizeof ep->why, "refused: the peer's HELLO claims %u payload bytes (a HELLO has none)",
                 le32toh(h->len));
        *why = ep->why;
        return -EPROTO;
    }
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
    tcp_msg_build_hdr(ack, F_HELLO_ACK, 0, ep->base.eager, grant);
    w = send(ep->fd, ack, HDR_LEN, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w != HDR_LEN)
        return w < 0 ? -errno : -EIO;
    ep->base.user = NULL;
    vrpc_tcp_cm_listener_unref(ep->lst);
    ep->lst = NULL;
    atomic_store(&ep->state, S_OPEN);
    ep->reported = true;
    ep->frame_ns = 0;
    atomic_store(&ep->base.refs, 2); /* the user's, from ACCEPTED on, and ours */
    ep->ev_acc.len = 0;
    ep->ev_acc.priv[P_WRID] = ep->accept_user;
    tcp_cq_stage_fill(&ep->ev_acc, VRPC_WC_ACCEPTED, 0, ep, 0);
    tcp_cq_stage(cq, &ep->ev_acc);
    return 0;
}

static void hand_to_poller(struct tcp_cq *cq, struct tcp_ep *ep)
{
    struct tcp_ep *old = atomic_load(&cq->adopt);
    do
        ep->anext = old;
    while (!atomic_compare_exchange_weak(&cq->adopt, &old, ep));
    tcp_cq_wake(cq);
}

static void set_sock_opts(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Blocking helpers for the connecting thread, bounded by deadline_ns. */
static int wait_fd(int fd, short ev, uint64_t deadline_ns)
{
    struct pollfd p = {.fd = fd, .events = ev};
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
        ssize_t n =
            wr ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL) : recv(fd, (char *)buf + done, len - done, 0);
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

/* vrpc_tcp_cm_connect's first step: a TCP connection to dst (from src, if
 * given) by deadline. The connected socket's fd, or a negative errno. */
static int connect_socket(const struct vrpc_addr *dst, const struct vrpc_addr *src, uint64_t deadline, uint32_t tmo)
{
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
    return fd;
err_fd:
    close(fd);
    return rc;
}

/* vrpc_tcp_cm_connect's handshake: HELLO with our grant, then the server's
 * HELLO_ACK into *ack, checked against the handshake minimums. */
static int connect_hello(struct vrpc_transport *tp, int fd, uint32_t grant, uint64_t deadline, uint32_t tmo,
                         struct vrpc_tcp_hdr *ack)
{
    union {
        struct vrpc_tcp_hdr h;
        char b[HDR_LEN];
    } m;
    int rc;

    tcp_msg_build_hdr(m.b, F_HELLO, 0, tp->attr.eager_size, grant);
    if ((rc = io_full(fd, m.b, HDR_LEN, true, deadline)) || (rc = io_full(fd, m.b, HDR_LEN, false, deadline))) {
        if (rc == -ETIMEDOUT)
            vrpc_tp_log("tcp: connect: the server did not answer the handshake within %u ms", tmo);
        return rc;
    }
    if (le32toh(m.h.magic) != MAGIC || m.h.version != VERSION || m.h.type != F_HELLO_ACK ||
        le32toh(m.h.imm) > tp->attr.eager_size)
        return -EPROTO;
    if (le16toh(m.h.credits) < MIN_RESV || le32toh(m.h.imm) < VRPC_EAGER_MIN) {
        vrpc_tp_log("tcp: connect: refused the server's handshake: %u credits (at least %u needed), eager size %u "
                    "(at least %u)",
                    le16toh(m.h.credits), MIN_RESV, le32toh(m.h.imm), VRPC_EAGER_MIN);
        return -EPROTO;
    }
    *ack = m.h;
    return 0;
}

int vrpc_tcp_cm_connect(struct vrpc_transport *tp, const struct vrpc_addr *dst, const struct vrpc_addr *src,
                        const struct vrpc_ep_attr *attr, struct vrpc_ep **out)
{
    struct tcp_cq *cq = container_of(attr->cq, struct tcp_cq, base);
    uint32_t tmo = attr->timeout_ms ? attr->timeout_ms : tp->attr.connect_timeout_ms, grant;
    uint64_t deadline = vrpc_tp_now_ns() + (uint64_t)tmo * 1000000u;
    struct vrpc_tcp_hdr ack;
    struct tcp_ep *ep;
    int fd, rc;

    fd = connect_socket(dst, src, deadline, tmo);
    if (fd < 0)
        return fd;
    grant = vrpc_credit_reserve(&cq->cr);
    if (!grant) {
        vrpc_tp_log("tcp: connect: no receive buffer left on the CQ to reserve for the peer: post more");
        rc = -ENOBUFS;
        goto err_fd;
    }
    if ((rc = connect_hello(tp, fd, grant, deadline, tmo, &ack)))
        goto err_grant;
    ep = vrpc_tcp_ep_alloc(tp, cq, fd, attr->user, 2);
    if (!ep) {
        rc = -ENOMEM;
        goto err_grant;
    }
    if (attr->max_queued)
        ep->max_queued = attr->max_queued;
    ep->base.eager = le32toh(ack.imm);
    ep->send_credits = le16toh(ack.credits);
    ep->cr.resv = ep->cr.granted = grant;
    ep->reported = true;
    atomic_store(&ep->state, S_OPEN);
    vrpc_addr_format("tcp", (const struct sockaddr *)&dst->ss, ep->base.peer_uri, sizeof ep->base.peer_uri);
    hand_to_poller(cq, ep);
    *out = &ep->base;
    return 0;
err_grant:
    atomic_fetch_add(&cq->cr.avail, (int)grant);
    tcp_cq_wake(cq);
    if (rc == -ECONNRESET)
        rc = -ECONNREFUSED; /* the listener went away during the handshake */
err_fd:
    close(fd);
    return rc;
}

/* ---- listener --------------------------------------------------------------------- */

void vrpc_tcp_cm_listener_unref(struct tcp_listener *l)
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
    struct pollfd p[2] = {{.fd = l->fd, .events = POLLIN}, {.fd = l->evfd, .events = POLLIN}};
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
            ep = vrpc_tcp_ep_alloc(l->base.tp, cq, fd, NULL, 1);
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

void vrpc_tcp_cm_listener_destroy(struct vrpc_listener *base)
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
    vrpc_tcp_cm_listener_unref(l);
}

int vrpc_tcp_cm_listen(struct vrpc_transport *tp, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
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
        listen(l->fd, attr->backlog > 0 ? attr->backlog : 1024) || getsockname(l->fd, (struct sockaddr *)&ss, &sl)) {
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
    vrpc_tcp_cm_listener_destroy(&l->base);
    return rc;
}
