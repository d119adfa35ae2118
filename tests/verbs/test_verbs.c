/* Verbs-only tests of the verbs backend through the public transport API, on a
 * real device (Soft-RoCE in the VM): what the conformance suite cannot say
 * about RDMA. A burst with RNR retry 0 shows no RNR, 200 connections share
 * one receive queue with flat registered memory, a peer killed with SIGKILL
 * flushes every send exactly once, a server restart lets a client reconnect,
 * a wrong protocol version is refused with a clear message on both sides,
 * and so are hellos below the handshake minimums (credits, eager size).
 *   test_verbs --setup single|veth    (addresses from VRPC_VERBS_IP*)
 * Test hooks are the backend's documented environment variables:
 * VRPC_VERBS_RNR_RETRY=0 (set here for every case and child) and
 * VRPC_VERBS_PROTO_VERSION (the wrong-version case). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/env.h"
#include "transport/harness.h"
#include "verbs_setup.h"

#define WAIT_MS 20000

static unsigned scaled(unsigned n)
{
    unsigned v = n / g_opt.scale_div;
    return v ? v : 1;
}

static bool wait_until(atomic_ulong *v, unsigned long want, int ms)
{
    for (int i = 0; i < ms && atomic_load(v) < want; i++)
        usleep(1000);
    return atomic_load(v) >= want;
}

/* rxe device of each side (for its counters); NULL when unknown. */
static const char *dev_of(bool server)
{
    if (!strcmp(g_opt.setup, "single"))
        return getenv("VRPC_VERBS_DEV");
    return getenv(server ? "VRPC_VERBS_DEV_B" : "VRPC_VERBS_DEV_A");
}

/* A counter of port 1 of dev (rxe: hw_counters), -1 if absent. */
static long hw_counter(const char *dev, const char *name)
{
    char path[256];
    long v = -1;
    FILE *f;
    if (!dev)
        return -1;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/hw_counters/%s", dev, name);
    f = fopen(path, "r");
    if (!f)
        return -1;
    if (fscanf(f, "%ld", &v) != 1)
        v = -1;
    fclose(f);
    return v;
}

/* RNR events counted by the device(s) of both sides; -1 if not available. */
static long rnr_events(void)
{
    static const char *names[] = {"rcvd_rnr_err", "send_rnr_err", "retry_rnr_exceeded_err"};
    const char *a = dev_of(false), *b = dev_of(true);
    long sum = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        long x = hw_counter(a, names[i]), y = a && b && strcmp(a, b) ? hw_counter(b, names[i]) : 0;
        if (x < 0 || y < 0)
            return -1;
        sum += x + y;
    }
    return sum;
}

/* Memory this process has pinned for the device (registered MRs), kB, from
 * /proc/self/status VmPin; -1 if absent. */
static long vm_pin_kb(void)
{
    char line[256];
    long v = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmPin: %ld kB", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* ---- RNR-free burst --------------------------------------------------------- */

/* One sender bursts far beyond the receiver's 16 buffers with RNR retry 0:
 * one receiver-not-ready NAK would fail the queue pair, so every message
 * arriving, in order, with no send error proves the credits kept a buffer
 * posted for each; the device's RNR counters do not move either. */
static void t_rnr_burst(void **state)
{
    struct vrpc_transport_attr sa;
    struct echo_cfg ec = {.ncq = 1, .nbufs = 16, .repost_only = true, .tattr = &sa};
    struct echo e;
    struct client c;
    struct counts k;
    struct vrpc_ep *ep;
    unsigned n = scaled(5000), sent = 0, again = 0;
    long rnr0, rnr1;
    (void)state;

    vrpc_transport_attr_init(&sa);
    sa.credits = 8;
    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 64, 8, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    rnr0 = rnr_events();
    while (sent < n) {
        struct vrpc_buf *b = vrpc_pool_get(c.pool);
        int rc;
        if (!b) {
            usleep(100); /* every buffer in flight: wait for send completions */
            continue;
        }
        *(uint32_t *)b->data = sent;
        rc = vrpc_ep_send(ep, b, 64, sent, sent, 0);
        if (rc == -EAGAIN) {
            vrpc_pool_put(b);
            again++;
            usleep(100);
            continue;
        }
        assert_int_equal(rc, 0);
        sent++;
    }
    assert_true(wait_until(&e.recvs, n, WAIT_MS));
    assert_true(wait_until(&k.send_ok, n, WAIT_MS));
    rnr1 = rnr_events();
    printf("  %u messages to 16 receive buffers (credits 8), %u -EAGAIN; RNR counters %ld -> %ld\n", n, again, rnr0,
           rnr1);
    assert_int_equal(atomic_load(&k.send_err), 0);
    assert_int_equal(atomic_load(&k.disc), 0);
    assert_int_equal(atomic_load(&e.disc_err), 0);
    if (rnr0 >= 0)
        assert_int_equal(rnr1, rnr0);
    else
        printf("  (the device has no RNR counters: the RNR-retry-0 queue pairs alone prove it)\n");
    assert_int_equal(vrpc_ep_close(ep), 0);
    assert_true(wait_until(&k.disc, 1, WAIT_MS));
    assert_int_equal(atomic_load(&k.disc_status), 0);
    vrpc_ep_destroy(ep);
    client_stop(&c);
    echo_stop(&e);
}

/* ---- many connections, one receive queue ----------------------------------- */

/* 200 connections to one server CQ (one SRQ) from one client CQ: each
 * carries a message there and back through the shared receive buffers, and
 * the memory pinned for the device (VmPin: registered MRs) is the same with
 * 1 connection as with 200: no per-connection receive memory. */
static void t_many_connections(void **state)
{
    enum { NCONN = 200 };
    struct echo_cfg ec = {.ncq = 1, .nbufs = 2 * NCONN + 64};
    struct echo e;
    struct client c;
    struct counts k;
    struct vrpc_ep **eps = calloc(NCONN, sizeof(*eps));
    long pin1, pin_all;
    (void)state;

    assert_non_null(eps);
    memset(&k, 0, sizeof k);
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 3 * NCONN + 32, 2 * NCONN + 16, 0, counts_cb, &k), 0);
    assert_int_equal(client_connect(&c, e.uri, &eps[0]), 0);
    pin1 = vm_pin_kb(); /* both sides are bound to their device now */
    for (unsigned i = 1; i < NCONN; i++)
        assert_int_equal(client_connect(&c, e.uri, &eps[i]), 0);
    assert_true(wait_until(&e.accepted, NCONN, WAIT_MS));
    pin_all = vm_pin_kb();
    printf("  pinned for the device: %ld kB with 1 connection, %ld kB with %d\n", pin1, pin_all, NCONN);
    if (pin1 >= 0) {
        assert_true(pin1 > 0); /* the pools are registered: VmPin sees them */
        assert_int_equal(pin_all, pin1);
    }
    for (unsigned i = 0; i < NCONN; i++) {
        struct vrpc_buf *b = vrpc_pool_get(c.pool);
        assert_non_null(b);
        assert_int_equal(vrpc_ep_send(eps[i], b, 16, i, i, 0), 0);
    }
    assert_true(wait_until(&k.recv_ok, NCONN, WAIT_MS));
    assert_int_equal(atomic_load(&e.recvs), NCONN);
    assert_int_equal(atomic_load(&k.send_err), 0);
    for (unsigned i = 0; i < NCONN; i++)
        assert_int_equal(vrpc_ep_close(eps[i]), 0);
    assert_true(wait_until(&k.disc, NCONN, WAIT_MS));
    assert_true(wait_until(&e.disconnected, NCONN, WAIT_MS));
    assert_int_equal(atomic_load(&e.disc_err), 0);
    for (unsigned i = 0; i < NCONN; i++)
        vrpc_ep_destroy(eps[i]);
    free(eps);
    client_stop(&c);
    echo_stop(&e);
}

/* ---- child processes ----------------------------------------------------------
 * Children are fresh processes (fork + exec of this program): librdmacm opens
 * the devices once per process, so a forked copy would share them and killing
 * it would not tear its queue pairs down. */

static pid_t g_children[4];

static pid_t spawn(const char *role, const char *uri, char *line, size_t len)
{
    int pfd[2];
    pid_t pid;
    FILE *f;
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        execl("/proc/self/exe", "test_verbs", "--setup", g_opt.setup, role, uri, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    for (size_t i = 0; i < sizeof(g_children) / sizeof(g_children[0]); i++)
        if (!g_children[i]) {
            g_children[i] = pid;
            break;
        }
    f = fdopen(pfd[0], "r");
    assert_non_null(f);
    assert_non_null(fgets(line, (int)len, f)); /* the child is ready */
    fclose(f);
    line[strcspn(line, "\n")] = 0;
    return pid;
}

static void reap(pid_t pid)
{
    int status;
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    for (size_t i = 0; i < sizeof(g_children) / sizeof(g_children[0]); i++)
        if (g_children[i] == pid)
            g_children[i] = 0;
}

/* No child may outlive a failed case (it would hold ctest's output open). */
static int kill_children(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(g_children) / sizeof(g_children[0]); i++)
        if (g_children[i])
            reap(g_children[i]);
    return 0;
}

static void quiet_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    (void)cq;
    (void)wc;
    (void)n;
    (void)arg;
}

/* Child: connects to uri with 4 receive buffers that it never reposts, says
 * "ok", waits to be killed. */
static int child_client(const char *uri)
{
    struct vrpc_transport *tp;
    struct vrpc_pool *pool;
    struct vrpc_cq_attr ca;
    struct vrpc_cq *cq;
    struct vrpc_ep_attr ea;
    struct vrpc_ep *ep;
    if (vrpc_transport_create("verbs", NULL, &tp) || vrpc_pool_create(tp, vrpc_transport_eager_size(tp), 4, &pool))
        return 3;
    vrpc_cq_attr_init(&ca);
    ca.cb = quiet_cb;
    if (vrpc_cq_create(tp, &ca, &cq))
        return 3;
    for (int i = 0; i < 4; i++) {
        struct vrpc_buf *b = vrpc_pool_get(pool);
        if (vrpc_cq_post_recv(cq, &b, NULL, 1))
            return 3;
    }
    vrpc_ep_attr_init(&ea);
    ea.cq = cq;
    ea.src_addr = g_opt.client_ip;
    if (vrpc_connect(tp, uri, &ea, &ep))
        return 4;
    printf("ok\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* Child: an echo server on uri (its port may be fixed); prints its URI. */
static void child_echo_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    (void)arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        if (w->opcode == VRPC_WC_RECV && !w->status && !vrpc_ep_send(w->ep, w->buf, w->byte_len, w->imm, 0, 0))
            continue;
        if ((w->opcode == VRPC_WC_RECV || w->opcode == VRPC_WC_SEND) && vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
            vrpc_pool_put(w->buf);
        if (w->opcode == VRPC_WC_DISCONNECTED)
            vrpc_ep_destroy(w->ep);
    }
}

static int child_server(const char *uri)
{
    struct vrpc_transport *tp;
    struct vrpc_pool *pool;
    struct vrpc_cq_attr ca;
    struct vrpc_cq *cq;
    struct vrpc_listen_attr la;
    struct vrpc_listener *l;
    char bound[VRPC_URI_MAX];
    if (vrpc_transport_create("verbs", NULL, &tp) || vrpc_pool_create(tp, vrpc_transport_eager_size(tp), 32, &pool))
        return 3;
    vrpc_cq_attr_init(&ca);
    ca.cb = child_echo_cb;
    if (vrpc_cq_create(tp, &ca, &cq))
        return 3;
    for (int i = 0; i < 32; i++) {
        struct vrpc_buf *b = vrpc_pool_get(pool);
        if (vrpc_cq_post_recv(cq, &b, NULL, 1))
            return 3;
    }
    memset(&la, 0, sizeof la);
    la.cqs = &cq;
    la.ncqs = 1;
    if (vrpc_listen(tp, uri, &la, &l) || vrpc_listener_uri(l, bound, sizeof bound))
        return 4;
    printf("%s\n", bound);
    fflush(stdout);
    for (;;)
        pause();
}

/* ---- a peer killed with SIGKILL ---------------------------------------------- */

/* The client process is killed while the server has sends on the wire and
 * many more queued for credits the client never returns: every send
 * completes exactly once (by wr_id: delivered or flushed -ECANCELED), one
 * DISCONNECTED follows them, and nothing names the endpoint after it. */
static void t_sigkill_flush(void **state)
{
    enum { NSEND = 60 };
    struct client s;
    struct vrpc_listen_attr la;
    struct vrpc_listener *l;
    struct vrpc_wc w;
    struct vrpc_ep *sep;
    char uri[VRPC_URI_MAX], line[64];
    unsigned char seen[NSEND] = {0};
    unsigned ok = 0, flushed = 0, after = 0, disc = 0;
    int disc_status = 0;
    pid_t pid;
    (void)state;

    assert_int_equal(client_start(&s, NULL, NSEND + 16, 8, 0, NULL, NULL), 0);
    memset(&la, 0, sizeof la);
    la.cqs = &s.cq;
    la.ncqs = 1;
    listen_uri(uri, sizeof uri);
    assert_int_equal(vrpc_listen(s.tp, uri, &la, &l), 0);
    assert_int_equal(vrpc_listener_uri(l, uri, sizeof uri), 0);
    pid = spawn("--child-client", uri, line, sizeof line);
    assert_string_equal(line, "ok");
    assert_true(coll_wait(&s.coll, VRPC_WC_ACCEPTED, NULL, WAIT_MS, &w));
    sep = w.ep;
    for (uint32_t i = 0; i < NSEND; i++) {
        struct vrpc_buf *b = vrpc_pool_get(s.pool);
        assert_non_null(b);
        assert_int_equal(vrpc_ep_send(sep, b, 8, i, i, 0), 0);
    }
    usleep(200000); /* what the child's 4 buffers take is delivered */
    reap(pid);
    assert_true(coll_wait_n(&s.coll, VRPC_WC_DISCONNECTED, 1, WAIT_MS));
    usleep(100000); /* anything wrongly after it would show */
    pthread_mutex_lock(&s.coll.mu);
    for (size_t i = 0; i < s.coll.n; i++) {
        const struct vrpc_wc *x = &s.coll.wc[i];
        if (x->ep != sep)
            continue;
        if (disc)
            after++;
        if (x->opcode == VRPC_WC_DISCONNECTED) {
            disc++;
            disc_status = x->status;
        } else if (x->opcode == VRPC_WC_SEND) {
            assert_true(x->wr_id < NSEND);
            assert_int_equal(seen[x->wr_id], 0); /* exactly once */
            seen[x->wr_id] = 1;
            if (x->status == 0)
                ok++;
            else if (x->status == -ECANCELED)
                flushed++;
        }
    }
    pthread_mutex_unlock(&s.coll.mu);
    printf("  peer killed: %u sends delivered, %u flushed, DISCONNECTED status %d (%s)\n", ok, flushed, disc_status,
           strerror(-disc_status));
    assert_int_equal(ok + flushed, NSEND);
    assert_true(ok <= 4);
    assert_int_equal(disc, 1);
    assert_int_equal(after, 0);
    vrpc_ep_destroy(sep);
    vrpc_listener_destroy(l);
    client_stop(&s);
}

/* ---- server restart ------------------------------------------------------------ */

static void echo_once(struct client *c, struct vrpc_ep *ep, uint32_t v)
{
    struct vrpc_buf *b = vrpc_pool_get(c->pool);
    struct vrpc_wc w;
    assert_non_null(b);
    *(uint32_t *)b->data = v;
    assert_int_equal(vrpc_ep_send(ep, b, 4, v, v, 0), 0);
    assert_true(coll_wait(&c->coll, VRPC_WC_RECV, ep, WAIT_MS, &w));
    assert_int_equal(w.status, 0);
    assert_int_equal(w.imm, v);
    assert_int_equal(*(uint32_t *)w.buf->data, v);
    assert_int_equal(vrpc_cq_post_recv(c->cq, &w.buf, NULL, 1), 0);
}

/* The server process dies and a new one starts on the same port: the client's
 * endpoint gets its DISCONNECTED, and a new connection to the same URI works. */
static void t_server_restart(void **state)
{
    struct client c;
    struct vrpc_ep *ep;
    struct vrpc_wc w;
    char lu[VRPC_URI_MAX], uri[VRPC_URI_MAX], again[VRPC_URI_MAX];
    int rc = -1, tries = 0;
    pid_t pid;
    (void)state;

    listen_uri(lu, sizeof lu);
    pid = spawn("--child-server", lu, uri, sizeof uri);
    assert_int_equal(client_start(&c, NULL, 32, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&c, uri, &ep), 0);
    echo_once(&c, ep, 1);
    reap(pid);
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, ep, WAIT_MS, &w));
    printf("  server killed: DISCONNECTED status %d (%s)\n", w.status, strerror(-w.status));
    vrpc_ep_destroy(ep);

    pid = spawn("--child-server", uri, again, sizeof again);
    assert_string_equal(again, uri); /* same port */
    for (; tries < 50 && rc; tries++) {
        rc = client_connect(&c, uri, &ep);
        if (rc)
            usleep(100000);
    }
    printf("  reconnected after %d attempt(s)\n", tries);
    assert_int_equal(rc, 0);
    echo_once(&c, ep, 2);
    assert_int_equal(vrpc_ep_close(ep), 0);
    assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, ep, WAIT_MS, &w));
    assert_int_equal(w.status, 0);
    vrpc_ep_destroy(ep);
    reap(pid);
    client_stop(&c);
}

/* ---- logs: stderr captured ------------------------------------------------------- */

/* For tests that check what the transport logged: stderr goes to a temporary
 * file between capture_start and capture_stop. */
struct capture {
    FILE *f;
    int saved; /* the real stderr */
};

static void capture_start(struct capture *c)
{
    c->f = tmpfile();
    assert_non_null(c->f);
    fflush(stderr);
    c->saved = dup(2);
    dup2(fileno(c->f), 2);
}

/* What was logged so far, into log (NUL-terminated, truncated to len - 1). */
static void capture_read(struct capture *c, char *log, size_t len)
{
    size_t n;
    fflush(stderr);
    rewind(c->f);
    n = fread(log, 1, len - 1, c->f);
    log[n] = 0;
}

/* stderr back; then, when log is not NULL, all that was logged into it. */
static void capture_stop(struct capture *c, char *log, size_t len)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    if (log)
        capture_read(c, log, len);
    fclose(c->f);
}

/* ---- wrong protocol version ------------------------------------------------------ */

/* A client claiming protocol version 99 is refused: vrpc_connect() fails
 * -EPROTO and both sides log why (the server: it refuses; the client: the
 * server's reason); the server reports no ACCEPTED and keeps serving. */
static void t_wrong_version(void **state)
{
    struct echo_cfg ec = {.ncq = 1, .nbufs = 16};
    struct echo e;
    struct client bad, good;
    struct vrpc_ep *ep = NULL;
    char log[4096] = "";
    struct capture cap;
    int rc;
    (void)state;

    assert_int_equal(echo_start(&e, &ec), 0);
    setenv("VRPC_VERBS_PROTO_VERSION", "99", 1);
    vrpc_env_reload(); /* the environment is read once */
    rc = client_start(&bad, NULL, 8, 4, 0, NULL, NULL);
    unsetenv("VRPC_VERBS_PROTO_VERSION");
    vrpc_env_reload();
    assert_int_equal(rc, 0);
    capture_start(&cap);
    rc = client_connect(&bad, e.uri, &ep);
    capture_stop(&cap, log, sizeof(log));
    printf("  connect: %d (%s); logged:\n%s", rc, strerror(-rc), log);
    assert_int_equal(rc, -EPROTO);
    assert_non_null(strstr(log, "refusing a connection: protocol version 99 not supported"));
    assert_non_null(strstr(log, "failed: refused by the server: protocol version 99 not supported"));
    usleep(100000);
    assert_int_equal(atomic_load(&e.accepted), 0);
    client_stop(&bad);

    assert_int_equal(client_start(&good, NULL, 8, 4, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&good, e.uri, &ep), 0);
    echo_once(&good, ep, 7);
    vrpc_ep_destroy(ep);
    client_stop(&good);
    echo_stop(&e);
}

/* ---- a handshake that never completes --------------------------------------- */

/* The verbs backend's handshake data (transport/verbs/verbs.h struct
 * hello, network order), as a raw rdma_cm client sends it. */
struct raw_hello {
    uint32_t magic;
    uint16_t version;
    uint16_t credits;
    uint32_t eager_size;
    uint32_t rsvd;
};

/* Waits up to ms for the next rdma_cm event on ch; true when it is `want`. */
static bool raw_cm_wait(struct rdma_event_channel *ch, enum rdma_cm_event_type want, int ms)
{
    struct pollfd p = {.fd = ch->fd, .events = POLLIN};
    struct rdma_cm_event *ev;
    enum rdma_cm_event_type got;
    if (poll(&p, 1, ms) != 1 || rdma_get_cm_event(ch, &ev))
        return false;
    got = ev->event;
    rdma_ack_cm_event(ev);
    if (got != want)
        printf("  raw client: rdma_cm event %s, expected %s\n", rdma_event_str(got), rdma_event_str(want));
    return got == want;
}

/* A raw rdma_cm client sends a valid connect request to uri, gets the
 * server's accept (CONNECT_RESPONSE) and never completes the handshake (no
 * rdma_establish: no RTU, no message). */
static void raw_half_open(const char *uri, struct rdma_event_channel **chp, struct rdma_cm_id **idp)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id;
    struct addrinfo hints, *dst, *src;
    struct rdma_conn_param p;
    struct raw_hello h;
    const char *port = strrchr(uri, ':');
    assert_non_null(ch);
    assert_non_null(port);
    assert_int_equal(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), 0);
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_NUMERICHOST;
    assert_int_equal(getaddrinfo(g_opt.server_ip, port + 1, &hints, &dst), 0);
    assert_int_equal(getaddrinfo(g_opt.client_ip, NULL, &hints, &src), 0);
    assert_int_equal(rdma_resolve_addr(id, src->ai_addr, dst->ai_addr, 2000), 0);
    freeaddrinfo(dst);
    freeaddrinfo(src);
    assert_true(raw_cm_wait(ch, RDMA_CM_EVENT_ADDR_RESOLVED, WAIT_MS));
    assert_int_equal(rdma_resolve_route(id, 2000), 0);
    assert_true(raw_cm_wait(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, WAIT_MS));
    h = (struct raw_hello){
        .magic = htonl(0x56525043u), .version = htons(1), .credits = htons(1), .eager_size = htonl(8192)};
    memset(&p, 0, sizeof p);
    p.private_data = &h;
    p.private_data_len = sizeof h;
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p.qp_num = 0x4242; /* no QP behind it: nothing will ever be sent */
    p.srq = 1;
    assert_int_equal(rdma_connect(id, &p), 0);
    assert_true(raw_cm_wait(ch, RDMA_CM_EVENT_CONNECT_RESPONSE, WAIT_MS));
    *chp = ch;
    *idp = id;
}

/* A client that gets the server's accept and then never completes the
 * handshake holds the server's resources only until connect_timeout_ms: the
 * server has receive buffers for two connections; one is live, the
 * half-open one holds the other reservation, so a third is refused; after
 * the deadline the half-open connection is gone (never reported ACCEPTED,
 * one log line says why), its buffers are free for a new connection, and
 * the live one echoed throughout. */
static void t_accept_deadline(void **state)
{
    struct vrpc_transport_attr ta;
    struct echo_cfg ec = {.ncq = 1, .nbufs = 4, .tattr = &ta};
    struct echo e;
    struct client c;
    struct vrpc_ep *live, *late = NULL;
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct timespec t0, t1;
    char log[4096] = "";
    struct capture cap;
    int rc = -1;
    double s;
    (void)state;

    vrpc_transport_attr_init(&ta);
    ta.connect_timeout_ms = 1000;
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 16, 8, 0, NULL, NULL), 0);
    /* no message on it yet: its reservation would grow into the rest */
    assert_int_equal(client_connect(&c, e.uri, &live), 0);
    raw_half_open(e.uri, &ch, &id);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    capture_start(&cap);
    /* both reservations are taken */
    rc = client_connect(&c, e.uri, &late);
    assert_int_equal(rc, -ECONNREFUSED);
    echo_once(&c, live, 2);
    echo_once(&c, live, 3);
    for (int i = 0; i < WAIT_MS / 100; i++) {
        rc = client_connect(&c, e.uri, &late);
        if (rc != -ECONNREFUSED)
            break;
        usleep(100000);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    capture_stop(&cap, log, sizeof(log));
    s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("  new connection %d (%s) %.2f s after the half-open one; logged:\n%s", rc, strerror(-rc), s, log);
    assert_int_equal(rc, 0);
    assert_true(s >= 0.9);
    assert_non_null(strstr(log, "accept handshake not completed within 1000 ms"));
    echo_once(&c, late, 4);
    echo_once(&c, live, 5);
    assert_int_equal(atomic_load(&e.accepted), 2);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    vrpc_ep_destroy(live);
    vrpc_ep_destroy(late);
    client_stop(&c);
    echo_stop(&e);
}

/* ---- handshake minimums --------------------------------------------------------- */

/* A raw rdma_cm client whose private data (the verbrpc hello) grants
 * `credits` with eager size `eager`: the rdma_cm event the server's answer
 * produced (CONNECT_RESPONSE: accepted; REJECTED: refused). */
static enum rdma_cm_event_type raw_hello_answer(const char *uri, uint16_t credits, uint32_t eager)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id;
    struct addrinfo hints, *dst, *src;
    struct rdma_conn_param p;
    struct raw_hello h;
    struct rdma_cm_event *ev;
    struct pollfd pf;
    enum rdma_cm_event_type got = RDMA_CM_EVENT_CONNECT_ERROR;
    const char *port = strrchr(uri, ':');
    assert_non_null(ch);
    assert_int_equal(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), 0);
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_NUMERICHOST;
    assert_int_equal(getaddrinfo(g_opt.server_ip, port + 1, &hints, &dst), 0);
    assert_int_equal(getaddrinfo(g_opt.client_ip, NULL, &hints, &src), 0);
    assert_int_equal(rdma_resolve_addr(id, src->ai_addr, dst->ai_addr, 2000), 0);
    freeaddrinfo(dst);
    freeaddrinfo(src);
    assert_true(raw_cm_wait(ch, RDMA_CM_EVENT_ADDR_RESOLVED, WAIT_MS));
    assert_int_equal(rdma_resolve_route(id, 2000), 0);
    assert_true(raw_cm_wait(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, WAIT_MS));
    h = (struct raw_hello){
        .magic = htonl(0x56525043u), .version = htons(1), .credits = htons(credits), .eager_size = htonl(eager)};
    memset(&p, 0, sizeof p);
    p.private_data = &h;
    p.private_data_len = sizeof h;
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p.qp_num = 0x4243; /* no QP behind it */
    p.srq = 1;
    assert_int_equal(rdma_connect(id, &p), 0);
    pf = (struct pollfd){.fd = ch->fd, .events = POLLIN};
    if (poll(&pf, 1, WAIT_MS) == 1 && rdma_get_cm_event(ch, &ev) == 0) {
        got = ev->event;
        rdma_ack_cm_event(ev);
    }
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    return got;
}

/* The server refuses a hello granting 0 credits or announcing an eager size
 * below VRPC_EAGER_MIN (44, 4095), logging why, and never reports it; a
 * hello at the minimums (1 credit, 4096) is accepted. A live connection
 * echoes throughout. */
static void t_handshake_minimums(void **state)
{
    struct vrpc_transport_attr ta;
    struct echo_cfg ec = {.ncq = 1, .nbufs = 16, .tattr = &ta};
    struct echo e;
    struct client c;
    struct vrpc_ep *live;
    char log[4096] = "";
    struct capture cap;
    enum rdma_cm_event_type r0, r44, r4095, rmin;
    (void)state;
    vrpc_transport_attr_init(&ta);
    ta.connect_timeout_ms = 1000; /* the accepted raw one never completes */
    assert_int_equal(echo_start(&e, &ec), 0);
    assert_int_equal(client_start(&c, NULL, 16, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&c, e.uri, &live), 0);
    capture_start(&cap);
    r0 = raw_hello_answer(e.uri, 0, 8192);
    r44 = raw_hello_answer(e.uri, 8, 44);
    r4095 = raw_hello_answer(e.uri, 8, VRPC_EAGER_MIN - 1);
    rmin = raw_hello_answer(e.uri, 1, VRPC_EAGER_MIN);
    echo_once(&c, live, 1);
    capture_stop(&cap, log, sizeof(log));
    printf("  0 credits: %s; eager 44: %s; eager 4095: %s; 1 credit + eager 4096: %s; logged:\n%s", rdma_event_str(r0),
           rdma_event_str(r44), rdma_event_str(r4095), rdma_event_str(rmin), log);
    assert_int_equal(r0, RDMA_CM_EVENT_REJECTED);
    assert_int_equal(r44, RDMA_CM_EVENT_REJECTED);
    assert_int_equal(r4095, RDMA_CM_EVENT_REJECTED);
    assert_int_equal(rmin, RDMA_CM_EVENT_CONNECT_RESPONSE);
    assert_non_null(strstr(log, "initial credits 0, at least 1 needed"));
    assert_non_null(strstr(log, "eager size 44 below the minimum 4096"));
    assert_int_equal(atomic_load(&e.accepted), 1);
    vrpc_ep_destroy(live);
    client_stop(&c);
    echo_stop(&e);
}

/* ---- asynchronous device events ------------------------------------------------ */

/* The device's asynchronous events reach the transport: with
 * VRPC_VERBS_SRQ_LIMIT=4 the server's receive queue is armed at 4, and a
 * server that holds the messages it gets lets it drop below; rdma_rxe raises
 * SRQ_LIMIT_REACHED, which the rdma_cm thread reads, acknowledges and logs
 * (once). rxe raises no QP-level event for a refused READ (checked with
 * VRPC_VERBS_TRACE=1), so the QP-fatal path is not provoked here. */
static void t_async_srq_limit(void **state)
{
    struct echo_cfg ec = {.ncq = 1, .nbufs = 8, .hold = true};
    struct echo e;
    struct client c;
    struct vrpc_ep *ep;
    char log[4096] = "";
    struct capture cap;
    int rc;
    bool seen = false;
    (void)state;

    setenv("VRPC_VERBS_SRQ_LIMIT", "4", 1);
    vrpc_env_reload(); /* the environment is read once */
    rc = echo_start(&e, &ec);
    unsetenv("VRPC_VERBS_SRQ_LIMIT");
    vrpc_env_reload();
    assert_int_equal(rc, 0);
    assert_int_equal(client_start(&c, NULL, 16, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&c, e.uri, &ep), 0);
    capture_start(&cap);
    for (uint32_t i = 0; i < 6; i++) {
        struct vrpc_buf *b = vrpc_pool_get(c.pool);
        assert_non_null(b);
        assert_int_equal(vrpc_ep_send(ep, b, 8, i, i, 0), 0);
    }
    /* 8 posted, one kept for credit-only messages: 5 held leave 3 < 4 */
    for (int i = 0; i < WAIT_MS && atomic_load(&e.recvs) < 5; i++)
        usleep(1000);
    for (int i = 0; i < 5000 && !seen; i += 10) {
        capture_read(&cap, log, sizeof(log));
        seen = strstr(log, "receive buffers left posted") != NULL;
        if (!seen)
            usleep(10000);
    }
    capture_stop(&cap, NULL, 0);
    printf("  %lu messages held; logged:\n%s", atomic_load(&e.recvs), log);
    assert_true(atomic_load(&e.recvs) >= 5);
    assert_true(seen);
    assert_non_null(strstr(log, "fewer than 4 receive buffers"));
    echo_release(&e);
    vrpc_ep_destroy(ep);
    client_stop(&c);
    echo_stop(&e);
}

int main(int argc, char **argv)
{
    const char *filter = NULL, *scale = getenv("VRPC_TEST_SCALE");
    const char *child_role = NULL, *child_uri = NULL;
    struct rlimit rl;
    int rc;

    g_opt.backend = "verbs";
    g_opt.setup = "single";
    g_opt.scale_div = scale && atoi(scale) > 0 ? (unsigned)atoi(scale) : 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--setup") && i + 1 < argc)
            g_opt.setup = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            filter = argv[++i];
        else if ((!strcmp(argv[i], "--child-client") || !strcmp(argv[i], "--child-server")) && i + 1 < argc) {
            child_role = argv[i];
            child_uri = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: %s [--setup single|veth] [--filter GLOB]\n"
                    "--setup single reads VRPC_VERBS_IP; --setup veth reads VRPC_VERBS_IP_A\n"
                    "(client) and VRPC_VERBS_IP_B (server). VRPC_TEST_SCALE=N divides the burst.\n",
                    argv[0]);
            return 2;
        }
    }
    /* credits must make RNR impossible: any RNR NAK fails the connection */
    setenv("VRPC_VERBS_RNR_RETRY", "0", 0);
    vrpc_env_reload();
    if (child_role) {
        if (vrpc_test_verbs_addrs(g_opt.setup, &g_opt.server_ip, &g_opt.client_ip))
            return 2;
        return !strcmp(child_role, "--child-client") ? child_client(child_uri) : child_server(child_uri);
    }
    rc = vrpc_test_backend_addrs(g_opt.backend, g_opt.setup, &g_opt.server_ip, &g_opt.client_ip);
    if (rc)
        return rc;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max; /* 200 connections */
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    printf("verbs tests: setup %s, server %s, client src %s, RNR retry %s\n", g_opt.setup, g_opt.server_ip,
           g_opt.client_ip, getenv("VRPC_VERBS_RNR_RETRY"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_wrong_version),    cmocka_unit_test(t_rnr_burst),
        cmocka_unit_test(t_sigkill_flush),    cmocka_unit_test(t_server_restart),
        cmocka_unit_test(t_many_connections), cmocka_unit_test(t_accept_deadline),
        cmocka_unit_test(t_async_srq_limit),  cmocka_unit_test(t_handshake_minimums),
    };
    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name(g_opt.setup, tests, NULL, kill_children) ? 1 : 0;
}
