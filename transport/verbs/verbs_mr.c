/* Memory: registration (pending until the device is bound) and the
 * type-2B memory windows behind vrpc_ep_grant/revoke (pool, BIND_MW,
 * LOCAL_INV, their completions). */
#include "transport/verbs/verbs.h"

static int memlock_error(size_t bytes, int err, const char *dev)
{
    struct rlimit rl;
    char why[256];
    vrpc_tp_log("verbs: cannot register %zu bytes on %s: %s", bytes, dev, strerror(-err));
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        struct vrpc_verbs_diag d = {.have = rl.rlim_cur, .need = rl.rlim_cur + bytes};
        vrpc_tp_log("verbs: %s", vrpc_verbs_advice(VRPC_VP_MEMLOCK, &d, why, sizeof(why)));
    }
    return -ENOMEM;
}

int verbs_mr_register(struct vtp *tp, struct vmr *m)
{
    /* a GRANT region has no remote access of its own: peers reach it only
	 * through a window bound over part of it (vrpc_ep_grant) */
    int acc = IBV_ACCESS_LOCAL_WRITE | ((m->base.access & VRPC_ACCESS_REMOTE_READ) ? IBV_ACCESS_REMOTE_READ : 0) |
              ((m->base.access & VRPC_ACCESS_GRANT) ? IBV_ACCESS_MW_BIND : 0);
    m->mr = ibv_reg_mr(tp->pd, m->base.addr, m->base.len, acc);
    if (!m->mr) {
        int err = verbs_err_errno();
        if (err == -ENOMEM || err == -EPERM || err == -EAGAIN)
            return memlock_error(m->base.len, err, ibv_get_device_name(tp->verbs->device));
        vrpc_tp_log("verbs: ibv_reg_mr(%zu bytes): %s", m->base.len, strerror(-err));
        return err;
    }
    m->base.lkey = m->mr->lkey;
    m->base.rkey = m->mr->rkey;
    return 0;
}

/* A window of a dead endpoint is deallocated before its revoke completes:
 * once the caller has the REVOKE, no window holds its MR (so the MR can be
 * deregistered) and none ever will. */
void verbs_mw_kill(struct vmw *w)
{
    w->state = MW_DEAD;
    if (w->mw) {
        ibv_dealloc_mw(w->mw);
        w->mw = NULL;
    }
}

/* CM thread, before the QP is destroyed: a bound window holds its QP, so
 * every window of the endpoint is deallocated first (never reused: its
 * state on a dead QP is not worth reasoning about). The records stay on the
 * grant list until DISCONNECTED, so that a revoke still finds its key. */
void verbs_mw_dealloc_grants(struct vep *ep)
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
        *err = verbs_err_errno();
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

/* A failed bind (poller, error path): which MR and range it was over, and
 * whether that MR is still registered (a window bound over a deregistered or
 * re-registered MR fails, and its QP goes to error). The window's record is
 * the poller's until its completion is handled; the MR is looked up in
 * tp->mrs before anything of it is read. */
static void bind_error_log(struct vep *ep, const struct vmw *w, const struct ibv_wc *wc)
{
    struct vtp *tp = ep->tp;
    char mr[160] = "no longer registered (not in the transport's list)";
    pthread_mutex_lock(&tp->lock);
    for (const struct vmr *m = tp->mrs; m; m = m->next)
        if (m == w->bind_mr) {
            snprintf(mr, sizeof(mr), "still registered: [%p, +%zu), lkey now %#x%s", m->base.addr, m->base.len,
                     m->mr ? m->mr->lkey : 0u, m->mr && m->mr->lkey == w->bind_lkey ? "" : " (NOT the bound lkey)");
            break;
        }
    pthread_mutex_unlock(&tp->lock);
    vrpc_tp_log("verbs: qpn %u: bind of window rkey %#x over MR lkey %#x [%#llx, +%u) failed (%s); the MR is %s",
                wc->qp_num, w->rkey, w->bind_lkey, (unsigned long long)w->bind_addr, w->bind_len,
                ibv_wc_status_str(wc->status), mr);
}

/* A BIND_MW or LOCAL_INV completed (a window's completions arrive in the
 * order they were posted: its bind's first). */
void verbs_mw_on_wc(struct vcq *cq, struct vep *ep, const struct ibv_wc *wc)
{
    struct vmw *w = (struct vmw *)(uintptr_t)(wc->wr_id & ~WRID_TAG);
    const char *what = "memory window bind";
    bool put = false, drained;
    TRACE("verbs: mw wc qpn %u status %d", wc->qp_num, wc->status);
    verbs_ep_note_wc(ep, wc->status, verbs_wc_status(wc->status));
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
            verbs_mw_kill(w);
        }
        verbs_cq_stage(cq, VRPC_WC_REVOKE, ep, NULL, w->wr_id, put ? 0 : -ECANCELED, 0, 0);
    }
    verbs_ep_close_progress_locked(ep);
    drained = ep->state == S_DEAD && verbs_ep_sq_idle_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    if (put)
        mw_put(ep->tp, w);
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR) {
        verbs_cq_log_wc(ep, wc, what);
        if (!strcmp(what, "memory window bind"))
            bind_error_log(ep, w, wc);
        verbs_ep_fail(ep, verbs_wc_status(wc->status), "%s failed on qpn %u: %s", what, wc->qp_num,
                      ibv_wc_status_str(wc->status));
    } else if (wc->status == IBV_WC_WR_FLUSH_ERR) {
        verbs_cq_fail_flushed(ep, wc, what, true);
        verbs_ep_fail(ep, -ECONNRESET, "queue pair in error"); /* no-op when ep failed first */
    }
    if (drained)
        verbs_ep_todo_add(ep);
}

int verbs_mw_grant(struct vrpc_ep *base, struct vrpc_mr *mbase, const void *addr, uint32_t len, uint32_t *rkey)
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
        rc = verbs_err_pos(ibv_post_send(ep->qp, &wr, &bad));
        if (!rc) {
            /* the provider names the window by its current key */
            w->mw->rkey = key;
            w->rkey = key;
            w->bind_mr = m;
            w->bind_lkey = m->mr->lkey;
            w->bind_addr = (uintptr_t)addr;
            w->bind_len = len;
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

int verbs_mw_revoke(struct vrpc_ep *base, uint32_t rkey, uint64_t wr_id)
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
        rc = verbs_err_pos(ibv_post_send(ep->qp, &wr, &bad));
        if (!rc) {
            w->state = MW_INV;
            w->wr_id = wr_id;
            ep->mw_inflight++;
        }
    }
    pthread_mutex_unlock(&ep->lock);
    if (later)
        verbs_ep_todo_add(ep);
    return rc;
}

int verbs_mr_reg(struct vrpc_transport *tbase, void *addr, size_t len, unsigned access, struct vrpc_mr **out)
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
        rc = verbs_mr_register(tp, m);
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

void verbs_mr_dereg(struct vrpc_mr *base)
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
    if (m->mr) {
        uint32_t lkey = m->mr->lkey;
        int rc = verbs_err_pos(ibv_dereg_mr(m->mr));
        /* e.g. rxe's -EINVAL for an MR that memory windows are still bound
         * to: it stays registered (leaked), and the windows keep working */
        if (rc)
            vrpc_tp_log("verbs: ibv_dereg_mr(lkey %#x, [%p, +%zu)): %s", lkey, m->base.addr, m->base.len,
                        strerror(-rc));
    }
    free(m);
}
