/* The verbs transport on its device: the queue-pair settings read from the
 * environment, binding the transport to the first device an address names
 * (PD, pending MRs and CQs), the device's asynchronous events (shared by
 * every transport on the device), create/destroy and the ops table. */
#include "transport/verbs/verbs.h"

int vrpc_verbs_trace = -1;

/* A trace line stamped with CLOCK_MONOTONIC in microseconds (the clock of
 * vrpc_now_ns, so that a program's own timestamps line up with it). */
void vrpc_verbs_trace_log(const char *fmt, ...)
{
    char line[224];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    vrpc_tp_log("%llu %s", (unsigned long long)(vrpc_tp_now_ns() / 1000u), line);
}

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

/* Binds tp to `verbs` once: PD, pending MRs, pending CQs. -EXDEV when tp is
 * already on another device. */
int verbs_dev_bind(struct vtp *tp, struct ibv_context *verbs)
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
    if ((rc = verbs_err_pos(ibv_query_device(verbs, &tp->dattr))))
        goto out;
    tp->pd = ibv_alloc_pd(verbs);
    if (!tp->pd) {
        rc = verbs_err_errno();
        goto out;
    }
    tp->verbs = verbs;
    tp->rd_chunk = tp->cfg.rd_chunk ? tp->cfg.rd_chunk : tp->base.attr.read_chunk;
    /* a chunk fixed by the attribute or the environment stays fixed; a
     * software device reads in bulk chunks only when told to (see
     * READ_CHUNK_BULK: they overflow its netdev under concurrent reads) */
    tp->rd_chunk_bulk = tp->cfg.rd_chunk_bulk                                  ? tp->cfg.rd_chunk_bulk
                        : tp->rd_chunk || tp->dattr.vendor_id == RXE_VENDOR_ID ? 0
                                                                               : READ_CHUNK_BULK;
    if (!tp->rd_chunk)
        tp->rd_chunk = tp->dattr.vendor_id == RXE_VENDOR_ID ? READ_CHUNK_SOFT : READ_CHUNK_HW;
    tp->rd_window = tp->cfg.rd_window ? tp->cfg.rd_window : tp->base.attr.read_window;
    if (tp->dattr.max_qp_init_rd_atom > 0 && tp->rd_window > (uint32_t)tp->dattr.max_qp_init_rd_atom)
        tp->rd_window = (uint32_t)tp->dattr.max_qp_init_rd_atom;
    tp->mw_ok = (tp->dattr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
    {
        /* the device's asynchronous events: read on the CM thread */
        struct epoll_event ee = {.events = EPOLLIN, .data.fd = verbs->async_fd};
        fcntl(verbs->async_fd, F_SETFL, fcntl(verbs->async_fd, F_GETFL) | O_NONBLOCK);
        if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, verbs->async_fd, &ee))
            vrpc_tp_log("verbs: cannot watch %s's asynchronous events: %s", ibv_get_device_name(verbs->device),
                        strerror(errno));
    }
    for (struct vmr *m = tp->mrs; m && !rc; m = m->next)
        rc = verbs_mr_register(tp, m);
    for (struct vcq *c = tp->cqs; c && !rc; c = c->next)
        rc = verbs_cq_bind(tp, c);
    if (rc)
        vrpc_tp_log("verbs: cannot set up device %s: %s", ibv_get_device_name(verbs->device), strerror(-rc));
out:
    pthread_mutex_unlock(&tp->lock);
    return rc;
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
            verbs_ep_fail(ep, status, "%s", why);
            pthread_mutex_lock(&cq->lock);
        }
        pthread_mutex_unlock(&cq->lock);
    }
    pthread_mutex_unlock(&tp->lock);
}

/* The owner's CM thread: failures asked for by async events. */
void verbs_dev_async_fail_pending(struct vtp *tp)
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
    verbs_wake(tp->wakefd);
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
        /* logged here too: ep_fail says nothing when ep had failed before */
        vrpc_tp_log("verbs: device %s reports %s on qpn %u (to %s)", dev, name, ev->element.qp->qp_num,
                    ep->base.peer_uri);
        verbs_ep_fail(ep, status, "queue pair error reported by the device: %s (qpn %u)", name, ev->element.qp->qp_num);
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

void verbs_dev_read_async_events(struct ibv_context *ctx)
{
    struct ibv_async_event ev;
    while (ibv_get_async_event(ctx, &ev) == 0) {
        TRACE("verbs: async event %s", ibv_event_type_str(ev.event_type));
        on_async_event(ctx, &ev);
        ibv_ack_async_event(&ev);
    }
}

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
        verbs_wake(tp->wakefd);
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
    struct epoll_event ee = {.events = EPOLLIN};
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
        struct vrpc_verbs_diag d = {.err = errno};
        char why[256];
        rc = -ENODEV;
        vrpc_tp_log("verbs: %s", vrpc_verbs_advice(VRPC_VP_NO_RDMA, &d, why, sizeof(why)));
        goto err;
    }
    fcntl(tp->ech->fd, F_SETFL, fcntl(tp->ech->fd, F_GETFL) | O_NONBLOCK);
    tp->epfd = epoll_create1(EPOLL_CLOEXEC);
    tp->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->epfd < 0 || tp->wakefd < 0) {
        rc = verbs_err_errno();
        goto err;
    }
    ee.data.fd = tp->ech->fd;
    epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->ech->fd, &ee);
    ee.data.fd = tp->wakefd;
    epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->wakefd, &ee);
    rc = -pthread_create(&tp->cm, NULL, verbs_cm_main, tp);
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

static int verbs_dev_probe(void)
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
    .probe = verbs_dev_probe,
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
    .post_recv = verbs_cq_post_recv,
    .listen = verbs_cm_listen,
    .listener_destroy = verbs_cm_listener_destroy,
    .connect = verbs_cm_connect,
    .send = verbs_msg_send,
    .send_list = verbs_msg_send_list,
    .read = verbs_rma_read,
    .grant = verbs_mw_grant,
    .revoke = verbs_mw_revoke,
    .close = verbs_ep_close,
    .abort = verbs_ep_abort,
    .ep_free = verbs_ep_free,
};
