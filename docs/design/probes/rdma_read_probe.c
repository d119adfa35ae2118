/* Probe for issue 7 (large messages): answers, on the Soft-RoCE VM, whether
 * type-2 memory windows work on rdma_rxe, what per-transfer registration
 * costs, what a READ with a dead key does to the connection, what read depth
 * rdma_cm negotiates, and how fast RDMA READ moves 1 MiB messages.
 * Documentation, not built by CMake:
 *   gcc -O2 -Wall -Wextra -o rdma_read_probe rdma_read_probe.c -libverbs -lrdmacm
 *   tests/softroce/vm.sh --net single -- ./rdma_read_probe 10.99.0.1
 * One process, two RC QPs on one device (rxe loopback), connected by rdma_cm:
 * side a reads (the receiver of a large message), side b owns the buffer. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PORT 17777
#define MIB (1u << 20)

struct side {
    struct rdma_cm_id *id;
    struct ibv_cq *cq;
};
struct pair {
    struct side a, b; /* a: connector and reader; b: accepted, owns the memory */
};

static struct rdma_event_channel *ec_l, *ec_c;
static struct rdma_cm_id *listener;
static struct ibv_pd *pd;
static struct sockaddr_in dst;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what)
{
    fprintf(stderr, "FATAL %s: %s\n", what, strerror(errno));
    exit(1);
}

/* Next CM event; it must be `want`. Returns the event's id (the new id for
 * CONNECT_REQUEST) and copies the connection parameters. */
static struct rdma_cm_id *wait_ev(struct rdma_event_channel *ec, enum rdma_cm_event_type want,
                                  struct rdma_conn_param *param)
{
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ec, &ev))
        die("rdma_get_cm_event");
    if (ev->event != want) {
        fprintf(stderr, "FATAL cm event %s (status %d), wanted %s\n", rdma_event_str(ev->event), ev->status,
                rdma_event_str(want));
        exit(1);
    }
    struct rdma_cm_id *id = ev->id;
    if (param)
        *param = ev->param.conn;
    rdma_ack_cm_event(ev);
    return id;
}

static void make_qp(struct side *s)
{
    struct ibv_qp_init_attr ia;
    if (!(s->cq = ibv_create_cq(s->id->verbs, 256, NULL, NULL, 0)))
        die("ibv_create_cq");
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = s->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 128;
    ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    if (rdma_create_qp(s->id, pd, &ia))
        die("rdma_create_qp");
}

static const char *state_name(enum ibv_qp_state s)
{
    static const char *n[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
    return s <= IBV_QPS_ERR ? n[s] : "?";
}

static void qp_show(const char *who, struct side *s)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (ibv_query_qp(s->id->qp, &a,
                     IBV_QP_STATE | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ACCESS_FLAGS |
                         IBV_QP_PATH_MTU,
                     &ia))
        die("ibv_query_qp");
    printf("  %s: state %s max_rd_atomic %u max_dest_rd_atomic %u access 0x%x path_mtu %d\n", who,
           state_name(a.qp_state), a.max_rd_atomic, a.max_dest_rd_atomic, a.qp_access_flags, 128 << a.path_mtu);
}

/* Connect a to b. res/depth go in both rdma_connect and rdma_accept. */
static void pair_connect(struct pair *p, uint8_t res, uint8_t depth)
{
    struct rdma_conn_param cp, got;
    memset(p, 0, sizeof(*p));
    if (rdma_create_id(ec_c, &p->a.id, NULL, RDMA_PS_TCP))
        die("rdma_create_id");
    if (rdma_resolve_addr(p->a.id, NULL, (struct sockaddr *)&dst, 2000))
        die("rdma_resolve_addr");
    wait_ev(ec_c, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
    if (rdma_resolve_route(p->a.id, 2000))
        die("rdma_resolve_route");
    wait_ev(ec_c, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
    make_qp(&p->a);
    memset(&cp, 0, sizeof(cp));
    cp.responder_resources = res;
    cp.initiator_depth = depth;
    cp.retry_count = 7;
    cp.rnr_retry_count = 7;
    if (rdma_connect(p->a.id, &cp))
        die("rdma_connect");
    p->b.id = wait_ev(ec_l, RDMA_CM_EVENT_CONNECT_REQUEST, &got);
    printf("  connect request seen by b: responder_resources %u initiator_depth %u\n", got.responder_resources,
           got.initiator_depth);
    make_qp(&p->b);
    if (rdma_accept(p->b.id, &cp))
        die("rdma_accept");
    /* the connector's librdmacm moves its QP to RTS and sends the RTU inside
	 * rdma_get_cm_event: take its event first, or the acceptor waits forever */
    wait_ev(ec_c, RDMA_CM_EVENT_ESTABLISHED, NULL);
    wait_ev(ec_l, RDMA_CM_EVENT_ESTABLISHED, NULL);
}

/* Tear down without waiting for DISCONNECTED (the QPs may be in error). */
static void pair_drop(struct pair *p)
{
    rdma_disconnect(p->a.id);
    rdma_destroy_qp(p->a.id);
    rdma_destroy_qp(p->b.id);
    ibv_destroy_cq(p->a.cq);
    ibv_destroy_cq(p->b.cq);
    rdma_destroy_id(p->a.id);
    rdma_destroy_id(p->b.id);
    /* the DISCONNECTED/TIMEWAIT events of destroyed ids are dropped by librdmacm */
}

/* Poll one completion; 0 on success, -ETIMEDOUT after ms. */
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
    double end = now_us() + ms * 1000.0;
    for (;;) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n < 0)
            die("ibv_poll_cq");
        if (n == 1)
            return 0;
        if (now_us() > end)
            return -ETIMEDOUT;
        sched_yield();
    }
}

static int post_read(struct side *s, struct ibv_mr *lmr, void *laddr, uint32_t len, uint64_t raddr, uint32_t rkey,
                     uint64_t wr_id)
{
    struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = lmr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(s->id->qp, &wr, &bad);
}

/* One READ, waited for; prints and returns the completion status (-1 timeout). */
static int read_once(const char *what, struct side *s, struct ibv_mr *lmr, void *laddr, uint32_t len, uint64_t raddr,
                     uint32_t rkey, int ms)
{
    struct ibv_wc wc;
    if (post_read(s, lmr, laddr, len, raddr, rkey, 1)) {
        printf("  %s: post failed: %s\n", what, strerror(errno));
        return -2;
    }
    if (poll1(s->cq, &wc, ms)) {
        printf("  %s: no completion within %d ms\n", what, ms);
        return -1;
    }
    printf("  %s: %s (vendor_err 0x%x)\n", what, ibv_wc_status_str(wc.status), wc.vendor_err);
    return wc.status;
}

/* After a failed READ: what both QPs look like and what each CQ reports. */
static void show_aftermath(struct pair *p)
{
    struct ibv_wc wc;
    struct ibv_send_wr wr, *bad;
    qp_show("reader a", &p->a);
    qp_show("owner  b", &p->b);
    while (ibv_poll_cq(p->b.cq, 1, &wc) == 1)
        printf("  owner b completion: opcode %d %s\n", wc.opcode, ibv_wc_status_str(wc.status));
    memset(&wr, 0, sizeof(wr));
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr_id = 9;
    if (ibv_post_send(p->a.id->qp, &wr, &bad))
        printf("  reader a: a later post fails: %s\n", strerror(errno));
    else if (poll1(p->a.cq, &wc, 2000) == 0)
        printf("  reader a: a later SEND completes %s\n", ibv_wc_status_str(wc.status));
    struct ibv_async_event ae;
    int fl = fcntl(p->a.id->verbs->async_fd, F_GETFL);
    fcntl(p->a.id->verbs->async_fd, F_SETFL, fl | O_NONBLOCK);
    while (ibv_get_async_event(p->a.id->verbs, &ae) == 0) {
        printf("  async event: %s (qp %s)\n", ibv_event_type_str(ae.event_type),
               ae.element.qp == p->a.id->qp   ? "a"
               : ae.element.qp == p->b.id->qp ? "b"
                                              : "other");
        ibv_ack_async_event(&ae);
    }
    fcntl(p->a.id->verbs->async_fd, F_SETFL, fl);
}

static void *alloc_touched(size_t n, int c)
{
    void *m;
    if (posix_memalign(&m, 4096, n))
        die("posix_memalign");
    memset(m, c, n);
    return m;
}

/* ---- 1. memory windows ----------------------------------------------------- */

static int bind_mw(struct side *s, struct ibv_mw *mw, struct ibv_mr *mr, void *addr, size_t len, uint32_t *rkey)
{
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    uint32_t k = ibv_inc_rkey(mw->rkey);
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 2;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = k;
    wr.bind_mw.bind_info.mr = mr;
    wr.bind_mw.bind_info.addr = (uintptr_t)addr;
    wr.bind_mw.bind_info.length = len;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
    if (ibv_post_send(s->id->qp, &wr, &bad))
        return -errno;
    if (poll1(s->cq, &wc, 2000))
        return -ETIMEDOUT;
    if (wc.status != IBV_WC_SUCCESS) {
        printf("  bind completion: %s\n", ibv_wc_status_str(wc.status));
        return -EIO;
    }
    mw->rkey = k;
    *rkey = k;
    return 0;
}

static int local_inv(struct side *s, uint32_t rkey)
{
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 3;
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = rkey;
    if (ibv_post_send(s->id->qp, &wr, &bad))
        return -errno;
    if (poll1(s->cq, &wc, 2000))
        return -ETIMEDOUT;
    if (wc.status != IBV_WC_SUCCESS) {
        printf("  local invalidate completion: %s\n", ibv_wc_status_str(wc.status));
        return -EIO;
    }
    return 0;
}

static void probe_mw(uint8_t depth)
{
    struct pair p;
    uint32_t len = MIB, rkey;
    char *own = alloc_touched(2 * len, 'o'), *dstb = alloc_touched(len, 0);
    struct ibv_mr *omr, *dmr;
    struct ibv_mw *mw;
    int err;

    printf("\n== 1. type-2 memory window over the middle MiB of a 2 MiB MR (MR without remote access)\n");
    pair_connect(&p, depth, depth);
    omr = ibv_reg_mr(pd, own, 2 * len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    dmr = ibv_reg_mr(pd, dstb, len, IBV_ACCESS_LOCAL_WRITE);
    if (!omr || !dmr)
        die("ibv_reg_mr (MW_BIND)");
    mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    if (!mw) {
        printf("  ibv_alloc_mw(TYPE_2): %s\n", strerror(errno));
        goto out;
    }
    printf("  ibv_alloc_mw(TYPE_2): ok, rkey 0x%x\n", mw->rkey);
    err = bind_mw(&p.b, mw, omr, own + len / 2, len, &rkey);
    printf("  bind (IBV_WR_BIND_MW on b's QP): %s, rkey 0x%x\n", err ? strerror(-err) : "ok", rkey);
    if (err)
        goto out_mw;
    if (read_once("READ 1 MiB through the window", &p.a, dmr, dstb, len, (uintptr_t)own + len / 2, rkey, 5000) ==
        IBV_WC_SUCCESS)
        printf("  data %s\n", memcmp(dstb, own + len / 2, len) ? "DIFFERS" : "matches");

    /* cost of one bind + one local invalidate, the per-transfer price of a one-shot key */
    int n = 200;
    double t0 = now_us(), tb = 0, ti = 0;
    err = local_inv(&p.b, rkey);
    printf("  IBV_WR_LOCAL_INV: %s\n", err ? strerror(-err) : "ok");
    for (int i = 0; i < n && !err; i++) {
        double t1 = now_us();
        err = bind_mw(&p.b, mw, omr, own + len / 2, len, &rkey);
        double t2 = now_us();
        if (!err)
            err = local_inv(&p.b, rkey);
        ti += now_us() - t2;
        tb += t2 - t1;
    }
    printf("  %d x (bind + local invalidate): bind %.1f us, invalidate %.1f us each (%s), total %.0f ms\n", n, tb / n,
           ti / n, err ? strerror(-err) : "ok", (now_us() - t0) / 1000);
    read_once("READ with the locally invalidated rkey", &p.a, dmr, dstb, 4096, (uintptr_t)own + len / 2, rkey, 3000);
    show_aftermath(&p);
    pair_drop(&p);

    printf("\n== 1b. invalidation by the reader: SEND_WITH_INV\n");
    pair_connect(&p, depth, depth);
    {
        struct ibv_recv_wr rwr, *rbad;
        struct ibv_sge rs = {.addr = (uintptr_t)dstb, .length = 64, .lkey = dmr->lkey};
        struct ibv_send_wr wr, *bad;
        struct ibv_wc wc;
        memset(&rwr, 0, sizeof(rwr));
        rwr.wr_id = 7;
        rwr.sg_list = &rs;
        rwr.num_sge = 1;
        /* dmr is b's too here: one PD for both sides */
        if (ibv_post_recv(p.b.id->qp, &rwr, &rbad))
            die("ibv_post_recv");
        err = bind_mw(&p.b, mw, omr, own + len / 2, len, &rkey);
        printf("  bind on the new connection: %s, rkey 0x%x\n", err ? strerror(-err) : "ok", rkey);
        if (err)
            goto out_mw;
        read_once("READ 1 MiB", &p.a, dmr, dstb + 0, len, (uintptr_t)own + len / 2, rkey, 5000);
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = 8;
        wr.opcode = IBV_WR_SEND_WITH_INV;
        wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        wr.invalidate_rkey = rkey;
        if (ibv_post_send(p.a.id->qp, &wr, &bad))
            printf("  post SEND_WITH_INV: %s\n", strerror(errno));
        else if (poll1(p.a.cq, &wc, 3000) == 0)
            printf("  reader a: SEND_WITH_INV completes %s\n", ibv_wc_status_str(wc.status));
        if (poll1(p.b.cq, &wc, 3000) == 0)
            printf("  owner b: receive %s, wc_flags 0x%x (WITH_INV %s), invalidated_rkey 0x%x\n",
                   ibv_wc_status_str(wc.status), wc.wc_flags, (wc.wc_flags & IBV_WC_WITH_INV) ? "yes" : "no",
                   wc.invalidated_rkey);
        read_once("READ with the rkey the reader invalidated", &p.a, dmr, dstb, 4096, (uintptr_t)own + len / 2, rkey,
                  3000);
        show_aftermath(&p);
    }
    pair_drop(&p);

    printf("\n== 1c. READ one byte past the window's end\n");
    pair_connect(&p, depth, depth);
    err = bind_mw(&p.b, mw, omr, own + len / 2, len, &rkey);
    if (!err) {
        read_once("READ [end-4096, end+1) of the window", &p.a, dmr, dstb, 4097, (uintptr_t)own + len / 2 + len - 4096,
                  rkey, 3000);
        show_aftermath(&p);
    }
    pair_drop(&p);
out_mw:
    ibv_dealloc_mw(mw);
out:
    ibv_dereg_mr(omr);
    ibv_dereg_mr(dmr);
    free(own);
    free(dstb);
}

/* ---- 1d. who enforces bounds: the window, the MR, the QP association ------ */

/* One READ on a fresh connection (a failed READ kills it); ok = success. */
static void bounds_case(const char *what, uint8_t depth, struct ibv_mw *mw, struct ibv_mr *mr, char *win, size_t winlen,
                        uint64_t raddr, uint32_t len, bool use_mr_key)
{
    struct pair p;
    uint32_t rkey = 0;
    char *d = alloc_touched(len, 0);
    pair_connect(&p, depth, depth);
    struct ibv_mr *dmr = ibv_reg_mr(pd, d, len, IBV_ACCESS_LOCAL_WRITE);
    if (use_mr_key)
        rkey = mr->rkey;
    else if (bind_mw(&p.b, mw, mr, win, winlen, &rkey))
        die("bind");
    read_once(what, &p.a, dmr, d, len, raddr, rkey, 3000);
    if (!use_mr_key)
        local_inv(&p.b, rkey);
    pair_drop(&p);
    ibv_dereg_mr(dmr);
    free(d);
}

static void probe_bounds(uint8_t depth)
{
    size_t len = MIB;
    char *own = alloc_touched(2 * len, 'o');
    char *win = own + len / 2, *wend = win + len;
    struct ibv_mr *bmr = ibv_reg_mr(pd, own, 2 * len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    struct ibv_mr *rmr = ibv_reg_mr(pd, win, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    if (!bmr || !rmr || !mw)
        die("bounds setup");
    printf("\n== 1d. bounds: window = middle MiB of a 2 MiB MW_BIND MR; remote MR = exactly that MiB\n");
    bounds_case("window key, 4 KiB at window end + 64 KiB (inside the MR)", depth, mw, bmr, win, len,
                (uintptr_t)wend + 65536, 4096, false);
    bounds_case("window key, 4 KiB ending 4 KiB before the window start", depth, mw, bmr, win, len,
                (uintptr_t)win - 8192, 4096, false);
    bounds_case("window key, [start-1, start+4095)", depth, mw, bmr, win, len, (uintptr_t)win - 1, 4096, false);
    bounds_case("MR key, [end-4096, end+1)", depth, NULL, rmr, NULL, 0, (uintptr_t)wend - 4096, 4097, true);
    bounds_case("MR key, 4 KiB at end + 64 KiB", depth, NULL, rmr, NULL, 0, (uintptr_t)wend + 65536, 4096, true);
    {
        struct pair p1, p2;
        uint32_t rkey;
        char *d = alloc_touched(4096, 0);
        pair_connect(&p1, depth, depth);
        pair_connect(&p2, depth, depth);
        struct ibv_mr *dmr = ibv_reg_mr(pd, d, 4096, IBV_ACCESS_LOCAL_WRITE);
        if (bind_mw(&p1.b, mw, bmr, win, len, &rkey))
            die("bind");
        read_once("window bound on connection 1, READ from connection 2", &p2.a, dmr, d, 4096, (uintptr_t)win, rkey,
                  3000);
        read_once("same key from connection 1 (control)", &p1.a, dmr, d, 4096, (uintptr_t)win, rkey, 3000);
        local_inv(&p1.b, rkey);
        pair_drop(&p1);
        pair_drop(&p2);
        ibv_dereg_mr(dmr);
        free(d);
    }
    ibv_dealloc_mw(mw);
    ibv_dereg_mr(rmr);
    ibv_dereg_mr(bmr);
    free(own);
}

/* ---- 1'. registration per transfer ----------------------------------------- */

static void probe_reg(uint8_t depth)
{
    static const uint32_t sizes[] = {64 * 1024, MIB, 16 * MIB};
    static const int iters[] = {100, 30, 6};
    struct pair p;
    printf("\n== 1'. ibv_reg_mr/ibv_dereg_mr per transfer vs a cached MR (buffers already touched)\n");
    pair_connect(&p, depth, depth);
    for (int s = 0; s < 3; s++) {
        uint32_t len = sizes[s];
        char *own = alloc_touched(len, 'r'), *d = alloc_touched(len, 0);
        struct ibv_mr *dmr = ibv_reg_mr(pd, d, len, IBV_ACCESS_LOCAL_WRITE), *mr;
        double treg = 0, tdereg = 0, tread = 0, tcold;
        struct ibv_wc wc;
        if (!dmr)
            die("ibv_reg_mr");
        for (int i = 0; i < iters[s]; i++) {
            double t0 = now_us();
            mr = ibv_reg_mr(pd, own, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
            double t1 = now_us();
            if (!mr)
                die("ibv_reg_mr");
            ibv_dereg_mr(mr);
            tdereg += now_us() - t1;
            treg += t1 - t0;
        }
        mr = ibv_reg_mr(pd, own, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        for (int i = 0; i < iters[s]; i++) {
            double t0 = now_us();
            if (post_read(&p.a, dmr, d, len, (uintptr_t)own, mr->rkey, 1) || poll1(p.a.cq, &wc, 20000) || wc.status)
                die("cached READ");
            tread += now_us() - t0;
        }
        ibv_dereg_mr(mr);
        /* a never-touched buffer: registration faults every page in */
        char *cold = malloc(len);
        double t0 = now_us();
        mr = ibv_reg_mr(pd, cold, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        tcold = now_us() - t0;
        ibv_dereg_mr(mr);
        free(cold);
        printf("  %8u B: reg %8.1f us  dereg %8.1f us  (cold reg %8.1f us)  READ with cached MR %9.1f us"
               "  -> reg+dereg = %5.1f%% of the READ\n",
               len, treg / iters[s], tdereg / iters[s], tcold, tread / iters[s], 100.0 * (treg + tdereg) / tread);
        ibv_dereg_mr(dmr);
        free(own);
        free(d);
    }
    pair_drop(&p);

    printf("\n== 1''. READ with a key whose MR was deregistered\n");
    pair_connect(&p, depth, depth);
    {
        uint32_t len = MIB;
        char *own = alloc_touched(len, 'x'), *d = alloc_touched(len, 0);
        struct ibv_mr *dmr = ibv_reg_mr(pd, d, len, IBV_ACCESS_LOCAL_WRITE);
        struct ibv_mr *mr = ibv_reg_mr(pd, own, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        uint32_t rkey = mr->rkey;
        read_once("READ while registered", &p.a, dmr, d, len, (uintptr_t)own, rkey, 5000);
        ibv_dereg_mr(mr);
        read_once("READ after ibv_dereg_mr", &p.a, dmr, d, 4096, (uintptr_t)own, rkey, 3000);
        show_aftermath(&p);
        ibv_dereg_mr(dmr);
        free(own);
        free(d);
    }
    pair_drop(&p);
}

/* ---- 2. read depth and bandwidth ------------------------------------------- */

static void probe_depth(const struct ibv_device_attr *da)
{
    struct pair p;
    printf("\n== 2. read depth negotiated by rdma_cm\n");
    printf(" responder_resources = initiator_depth = 0 (what the verbs backend passes today):\n");
    pair_connect(&p, 0, 0);
    qp_show("a", &p.a);
    qp_show("b", &p.b);
    {
        char *own = alloc_touched(4096, 'z'), *d = alloc_touched(4096, 0);
        struct ibv_mr *mr = ibv_reg_mr(pd, own, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        struct ibv_mr *dmr = ibv_reg_mr(pd, d, 4096, IBV_ACCESS_LOCAL_WRITE);
        if (read_once("READ 4 KiB on that connection", &p.a, dmr, d, 4096, (uintptr_t)own, mr->rkey, 3000) !=
            IBV_WC_SUCCESS)
            show_aftermath(&p);
        pair_drop(&p);
        ibv_dereg_mr(mr);
        ibv_dereg_mr(dmr);
        free(own);
        free(d);
    }
    printf(" RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH (0xff: the device maximum):\n");
    pair_connect(&p, RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH);
    qp_show("a", &p.a);
    qp_show("b", &p.b);
    pair_drop(&p);
    printf(" device max_qp_rd_atom %d, max_qp_init_rd_atom %d + 1 (one more than the device allows):\n",
           da->max_qp_rd_atom, da->max_qp_init_rd_atom);
    {
        struct rdma_cm_id *id;
        struct rdma_conn_param cp;
        if (rdma_create_id(ec_c, &id, NULL, RDMA_PS_TCP) || rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000))
            die("resolve");
        wait_ev(ec_c, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
        rdma_resolve_route(id, 2000);
        wait_ev(ec_c, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
        struct side s = {.id = id};
        make_qp(&s);
        memset(&cp, 0, sizeof(cp));
        cp.responder_resources = (uint8_t)(da->max_qp_rd_atom + 1);
        cp.initiator_depth = (uint8_t)(da->max_qp_init_rd_atom + 1);
        printf("  rdma_connect: %s\n", rdma_connect(id, &cp) ? strerror(errno) : "accepted by librdmacm");
        rdma_destroy_qp(id);
        ibv_destroy_cq(s.cq);
        rdma_destroy_id(id);
    }
}

/* Reads `total` bytes as messages of `msg` bytes, each split into `chunk`-byte
 * READs, keeping `inflight` READs posted. */
static void bw_case(struct pair *p, struct ibv_mr *smr, struct ibv_mr *dmr, uint32_t msg, uint32_t chunk, int inflight,
                    uint64_t total)
{
    uint64_t posted = 0, done = 0;
    int out = 0;
    struct ibv_wc wc[16];
    double t0 = now_us();
    while (done < total) {
        while (out < inflight && posted < total) {
            uint32_t off = (uint32_t)(posted % msg);
            if (post_read(&p->a, dmr, (char *)dmr->addr + off, chunk, (uintptr_t)smr->addr + off, smr->rkey, chunk))
                die("post READ");
            posted += chunk;
            out++;
        }
        int n = ibv_poll_cq(p->a.cq, 16, wc);
        for (int i = 0; i < n; i++) {
            if (wc[i].status)
                die("READ completion");
            done += wc[i].wr_id;
            out--;
        }
        if (!n)
            sched_yield();
    }
    double us = now_us() - t0;
    printf("  msg %7u B chunk %7u B inflight %2d: %6.1f MB/s (%.2f Gb/s), %.0f us per message\n", msg, chunk, inflight,
           total / us, total * 8 / us / 1000, us / (total / msg));
}

static void probe_bw(uint8_t depth, uint64_t total)
{
    struct pair p;
    uint32_t msg = MIB;
    printf("\n== 2b. RDMA READ bandwidth, 1 MiB messages, %llu MiB per case (cached MRs)\n",
           (unsigned long long)(total / MIB));
    pair_connect(&p, depth, depth);
    qp_show("a", &p.a);
    char *own = alloc_touched(msg, 'b'), *d = alloc_touched(msg, 0);
    struct ibv_mr *smr = ibv_reg_mr(pd, own, msg, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    struct ibv_mr *dmr = ibv_reg_mr(pd, d, msg, IBV_ACCESS_LOCAL_WRITE);
    bw_case(&p, smr, dmr, msg, msg, 1, total);
    bw_case(&p, smr, dmr, msg, msg, 2, total);
    bw_case(&p, smr, dmr, msg, msg, depth, total);
    bw_case(&p, smr, dmr, msg, 256 * 1024, 4, total);
    bw_case(&p, smr, dmr, msg, 64 * 1024, 16, total);
    ibv_dereg_mr(smr);
    ibv_dereg_mr(dmr);
    free(own);
    free(d);
    pair_drop(&p);
}

int main(int argc, char **argv)
{
    struct ibv_device_attr da;
    struct sockaddr_in la;
    uint64_t total = (argc > 2 ? strtoull(argv[2], NULL, 0) : 32) * MIB;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: %s IP [MiB per bandwidth case]\n", argv[0]);
        return 2;
    }
    memset(&dst, 0, sizeof(dst));
    dst.sin_family = AF_INET;
    dst.sin_port = htons(PORT);
    if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1)
        return 2;
    la = dst;
    if (!(ec_l = rdma_create_event_channel()) || !(ec_c = rdma_create_event_channel()))
        die("rdma_create_event_channel");
    if (rdma_create_id(ec_l, &listener, NULL, RDMA_PS_TCP) || rdma_bind_addr(listener, (struct sockaddr *)&la) ||
        rdma_listen(listener, 16))
        die("listen");
    if (ibv_query_device(listener->verbs, &da))
        die("ibv_query_device");
    if (!(pd = ibv_alloc_pd(listener->verbs)))
        die("ibv_alloc_pd");
    printf("== device %s fw %s: max_mw %d, MEM_WINDOW %s, TYPE_2A %s, TYPE_2B %s, max_qp_rd_atom %d, "
           "max_qp_init_rd_atom %d, max_res_rd_atom %d, max_mr_size %llu, max_mr %d\n",
           ibv_get_device_name(listener->verbs->device), da.fw_ver, da.max_mw,
           (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) ? "yes" : "no",
           (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A) ? "yes" : "no",
           (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) ? "yes" : "no", da.max_qp_rd_atom,
           da.max_qp_init_rd_atom, da.max_res_rd_atom, (unsigned long long)da.max_mr_size, da.max_mr);
    uint8_t depth = (uint8_t)(da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom : da.max_qp_init_rd_atom);
    const char *only = getenv("PROBE_ONLY"); /* depth, mw, bounds, reg or bw */
    if (!only || !strcmp(only, "depth"))
        probe_depth(&da);
    if (!only || !strcmp(only, "mw"))
        probe_mw(depth);
    if (!only || !strcmp(only, "bounds"))
        probe_bounds(depth);
    if (!only || !strcmp(only, "reg"))
        probe_reg(depth);
    if (!only || !strcmp(only, "bw"))
        probe_bw(depth, total);
    rdma_destroy_id(listener);
    return 0;
}
