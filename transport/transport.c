/* Transport core: backend selection, the public entry points (argument checks,
 * then the backend's ops), endpoint reference counting, and the generic poller
 * thread each CQ runs (poll -> busy-poll -> arm -> poll -> wait). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "common/log_internal.h"
#include "common/spin.h"
#include "transport/lbuf.h"
#include "transport/transport_ops.h"

/* Every backend, in "auto" preference order (layers, which "auto" never
 * picks, last); verbs also when the build leaves it out (its table then has
 * only a name: verbs/verbs_absent.c). */
static const struct vrpc_transport_ops *const backends[] = {
    &vrpc_verbs_ops,
    &vrpc_tcp_ops,
#ifdef VRPC_BACKEND_FAULT
    &vrpc_fault_ops,
#endif
};

/* ---- transport ------------------------------------------------------------ */

void vrpc_transport_attr_init(struct vrpc_transport_attr *attr)
{
    memset(attr, 0, sizeof *attr);
    attr->eager_size = 8192;
    attr->credits = 32;
    attr->max_queued = 1024;
    attr->idle_timeout_ms = 10000;
    attr->connect_timeout_ms = 5000;
    attr->read_chunk = 0; /* backend's choice: see transport.h */
    attr->read_window = 2;
    attr->max_pinned = (uint64_t)256 << 20;
    attr->shrink_ms = 1000;
}

static void apply_defaults(struct vrpc_transport_attr *a, const struct vrpc_transport_attr *in)
{
    struct vrpc_transport_attr d;
    vrpc_transport_attr_init(&d);
    *a = in ? *in : d;
    if (!a->eager_size)
        a->eager_size = d.eager_size;
    if (!a->credits)
        a->credits = d.credits;
    if (a->credits > 65535)
        a->credits = 65535;
    if (!a->max_queued)
        a->max_queued = d.max_queued;
    if (!a->idle_timeout_ms)
        a->idle_timeout_ms = d.idle_timeout_ms;
    if (!a->connect_timeout_ms)
        a->connect_timeout_ms = d.connect_timeout_ms;
    if (!a->read_window)
        a->read_window = d.read_window;
    if (!a->max_pinned)
        a->max_pinned = d.max_pinned;
    if (!a->credit_timeout_ms)
        a->credit_timeout_ms = a->idle_timeout_ms;
    if (!a->shrink_ms)
        a->shrink_ms = d.shrink_ms;
}

/* The backend (or layer) whose name is the first len bytes of name; a
 * table of another layout version is not searched (its name may be elsewhere). */
static const struct vrpc_transport_ops *find_backend(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (backends[i]->abi == VRPC_TP_OPS_ABI && strlen(backends[i]->name) == len &&
            !strncmp(name, backends[i]->name, len))
            return backends[i];
    return NULL;
}

/* A table that can be opened (transport_ops.h, abi and size): compiled in,
 * every required member inside its size, and each capability that needs an
 * optional operation with that operation. */
static bool ops_usable(const struct vrpc_transport_ops *ops)
{
    if (ops->abi != VRPC_TP_OPS_ABI || !ops->tp_create ||
        ops->size < offsetof(struct vrpc_transport_ops, ep_free) + sizeof ops->ep_free)
        return false;
    return !(ops->caps & VRPC_TP_CAP_GATHER) || VRPC_TP_OP(ops, grant_segs);
}

int vrpc_transport_scheme_check(const char *scheme)
{
    const char *plus;
    const struct vrpc_transport_ops *ops, *low;
    if (!scheme)
        return -ENOENT;
    if (!strcmp(scheme, "auto"))
        return 0;
    plus = strchr(scheme, '+');
    ops = find_backend(scheme, plus ? (size_t)(plus - scheme) : strlen(scheme));
    if (!ops || ops->layer != (plus != NULL)) /* a layer only as layer+backend */
        return -ENOENT;
    if (!plus || !strcmp(plus + 1, "auto"))
        return 0;
    low = find_backend(plus + 1, strlen(plus + 1));
    return low && !low->layer ? 0 : -ENOENT;
}

int vrpc_transport_create(const char *name, const struct vrpc_transport_attr *attr, struct vrpc_transport **out)
{
    const struct vrpc_transport_ops *ops = NULL;
    struct vrpc_transport_attr a;
    struct vrpc_transport *tp, *lower = NULL;
    const char *plus;
    size_t i;
    int rc;

    if (!name || !out)
        return -EINVAL;
    apply_defaults(&a, attr);
    if (a.eager_size > VRPC_EAGER_MAX || a.eager_size < VRPC_EAGER_MIN)
        return -EINVAL;
    plus = strchr(name, '+');
    if (!strcmp(name, "auto")) {
        for (i = 0; i < sizeof backends / sizeof backends[0]; i++)
            if (!backends[i]->layer && ops_usable(backends[i]) && backends[i]->probe() == 0) {
                ops = backends[i];
                break;
            }
        if (!ops)
            return -ENODEV;
    } else {
        ops = find_backend(name, plus ? (size_t)(plus - name) : strlen(name));
        if (!ops || (plus && !ops->layer))
            return -ENOENT;
        if (!ops_usable(ops)) /* left out of this build, or a table of another layout */
            return -ENOTSUP;
    }
    if (ops->layer) {
        /* "fault+tcp": the transport below first; the layer owns it then */
        rc = vrpc_transport_create(plus ? plus + 1 : "auto", attr, &lower);
        if (rc)
            return rc;
        if (lower->lower) { /* one layer at a time */
            vrpc_transport_destroy(lower);
            return -EINVAL;
        }
        tp = lower;
    }
    rc = ops->tp_create(&a, &tp);
    if (rc)
        return rc;
    tp->ops = ops;
    tp->attr = a;
    tp->lower = lower;
    tp->caps = lower ? ops->caps & lower->caps : ops->caps;
    /* "fault+verbs" is the longest name: every one fits */
    size_t nl = strlen(ops->name);
    memcpy(tp->name, ops->name, nl + 1);
    if (lower && nl + 1 + strlen(lower->name) < sizeof tp->name) {
        tp->name[nl] = '+';
        memcpy(tp->name + nl + 1, lower->name, strlen(lower->name) + 1);
    }
    tp->lbuf = NULL;
    pthread_mutex_init(&tp->cq_mu, NULL);
    tp->cqs = NULL;
    memset(&tp->retired, 0, sizeof tp->retired);
    tp->credit_waits = tp->connects = tp->grants = 0;
    rc = vrpc_lbuf_cache_create(tp, &tp->lbuf);
    if (rc) {
        ops->tp_destroy(tp);
        return rc;
    }
    *out = tp;
    return 0;
}

void vrpc_transport_destroy(struct vrpc_transport *tp)
{
    if (!tp)
        return;
    /* its buffers' MRs go before the backend's protection domain */
    vrpc_lbuf_cache_destroy(tp->lbuf);
    pthread_mutex_destroy(&tp->cq_mu);
    tp->ops->tp_destroy(tp);
}

const char *vrpc_transport_name(const struct vrpc_transport *tp) { return tp->name; }

uint32_t vrpc_transport_caps(const struct vrpc_transport *tp) { return tp->caps; }

uint32_t vrpc_transport_headroom(const struct vrpc_transport *tp) { return tp->headroom; }

uint32_t vrpc_transport_eager_size(const struct vrpc_transport *tp) { return tp->attr.eager_size; }

/* ---- memory ----------------------------------------------------------------- */

int vrpc_mr_reg(struct vrpc_transport *tp, void *addr, size_t len, unsigned access, struct vrpc_mr **out)
{
    if (!tp || !addr || !len || !out)
        return -EINVAL;
    if ((access & VRPC_ACCESS_REMOTE_READ) && !(tp->caps & VRPC_TP_CAP_REMOTE_READ))
        return -ENOSYS;
    return tp->ops->mr_reg(tp, addr, len, access, out);
}

void vrpc_mr_dereg(struct vrpc_mr *mr)
{
    if (mr)
        mr->tp->ops->mr_dereg(mr);
}

uint32_t vrpc_mr_rkey(const struct vrpc_mr *mr) { return mr->rkey; }

/* ---- CQ and its poller ----------------------------------------------------- */

void vrpc_cq_attr_init(struct vrpc_cq_attr *attr)
{
    memset(attr, 0, sizeof *attr);
    attr->depth = 64;
    attr->max_recv = 4096;
    attr->cpu = -1;
}

/* Poller only: the poller is the one writer of cq->counts, so a relaxed
 * load and store count without a locked instruction. */
#define COUNT(field, v)                                                                                                \
    atomic_store_explicit(&(field), atomic_load_explicit(&(field), memory_order_relaxed) + (v), memory_order_relaxed)

_Static_assert(VRPC_WC_REVOKE < VRPC_WC_OPS && !(VRPC_WC_OPS & (VRPC_WC_OPS - 1)),
               "struct vrpc_cq_counts holds every opcode, indexed by op & (VRPC_WC_OPS - 1)");

static void deliver(struct vrpc_cq *cq, unsigned n)
{
    unsigned i;
    cq->attr.cb(cq, cq->wc, n, cq->attr.cb_arg);
    for (i = 0; i < n; i++) {
        const struct vrpc_wc *w = &cq->wc[i];
        unsigned op = w->opcode;
        /* Counted after the callback, in the loop it needs anyway: wc itself
         * is unchanged (byte_len is the length for SEND too, transport.h). */
        if (__builtin_expect(w->status != 0, 0) && op != VRPC_WC_DISCONNECTED)
            continue;
        COUNT(cq->counts.n[op & (VRPC_WC_OPS - 1)], 1);
        COUNT(cq->counts.bytes[op & (VRPC_WC_OPS - 1)], w->byte_len);
        /* The transport's reference of an endpoint ends with its
         * DISCONNECTED, once the layer above has seen it. */
        if (op == VRPC_WC_DISCONNECTED)
            vrpc_ep_unref(w->ep);
    }
}

/* A pinned poller busy-polling without completions yields its CPU at most
 * this often (see poller_main). Every such yield costs a context switch pair
 * when an idle worker spins on the same CPU (spin_yield workers always do
 * after a task), which under emulation is ~10 us: at 20 us, a pinned poller
 * in the Soft-RoCE VM could spend half of a request gap switching, and
 * rpc_bench's 32 B p50s were 18-20% higher than at 100 us (ping-pong 60.6 vs
 * 48.8 us, RPC 81.8 vs 66.8 us, medians of 10 alternations in one boot; TCP
 * on the host unchanged). */
#define PINNED_YIELD_NS 100000u

/* The poller's busy window (vrpc_cq_attr.busy_poll_us and busy_poll_max_us):
 * fixed, for ever, or adaptive (common/spin.h: twice the recent gaps between
 * completion batches, between the two bounds). Poller only. */
struct busy_window {
    uint64_t floor_ns, cap_ns; /* cap_ns > floor_ns: adaptive */
    uint64_t ns;               /* the current window; UINT64_MAX: always */
    uint64_t last_batch;       /* when the previous batch was delivered */
    struct vrpc_spin_est est;
};

static void busy_window_init(struct busy_window *bw, const struct vrpc_cq_attr *a, uint64_t now)
{
    memset(bw, 0, sizeof *bw);
    bw->floor_ns = (uint64_t)a->busy_poll_us * 1000u;
    bw->cap_ns = a->busy_poll_max_us > a->busy_poll_us && a->busy_poll_us ? (uint64_t)a->busy_poll_max_us * 1000u : 0;
    bw->ns = a->busy_poll_us == VRPC_BUSY_POLL_ALWAYS ? UINT64_MAX : bw->floor_ns;
    bw->last_batch = now;
}

/* A batch was delivered at now: the gap since the last one is a sample. */
static inline void busy_window_batch(struct busy_window *bw, uint64_t now)
{
    if (!bw->cap_ns)
        return;
    vrpc_spin_est_add(&bw->est, now - bw->last_batch, bw->cap_ns);
    bw->ns = vrpc_spin_window_ns(&bw->est, bw->floor_ns, bw->cap_ns);
    bw->last_batch = now;
}

static void *poller_main(void *arg)
{
    struct vrpc_cq *cq = arg;
    const struct vrpc_transport_ops *ops = cq->tp->ops;
    uint64_t idle_since = vrpc_tp_now_ns();
    uint64_t yielded = idle_since, now;
    struct busy_window bw;
    int n;

    busy_window_init(&bw, &cq->attr, idle_since);
    for (;;) {
        n = ops->cq_poll(cq, cq->wc, cq->attr.depth);
        if (n > 0) {
            deliver(cq, (unsigned)n);
            if (bw.ns) {
                idle_since = vrpc_tp_now_ns();
                busy_window_batch(&bw, idle_since);
            }
            /* pinned: the callback likely readied a thread of this CPU (a
             * worker, a waiting caller); let it run before polling again */
            if (cq->attr.cpu >= 0) {
                sched_yield();
                yielded = vrpc_tp_now_ns();
            }
            continue;
        }
        if (atomic_load_explicit(&cq->stopping, memory_order_acquire))
            break;
        /* (bw.ns == UINT64_MAX, always: the test below always holds) */
        if (bw.ns && (now = vrpc_tp_now_ns()) - idle_since < bw.ns) {
            /* Spinning. Unpinned: let a runnable thread of this CPU go first
             * (on an oversubscribed machine the peer we wait for may be one).
             * Pinned: the threads it serves on its CPU sleep (or spin by
             * yielding) until it delivers, and it yields after delivering, so
             * a yield per poll would only take turns with them (a context
             * switch pair each) and delay the poll that finds their answer.
             * It still yields every PINNED_YIELD_NS, so that other threads of
             * its CPU wait that long at most, not its whole busy window. */
            if (cq->attr.cpu < 0 || now - yielded >= PINNED_YIELD_NS) {
                sched_yield();
                yielded = now;
            }
            continue;
        }
        /* poll -> arm -> poll: a completion landing between the last poll
         * and the arm is found by the second poll instead of being slept on. */
        ops->cq_arm(cq);
        n = ops->cq_poll(cq, cq->wc, cq->attr.depth);
        if (n > 0) {
            deliver(cq, (unsigned)n);
            idle_since = vrpc_tp_now_ns();
            busy_window_batch(&bw, idle_since);
            continue;
        }
        if (atomic_load_explicit(&cq->stopping, memory_order_acquire))
            break;
        ops->cq_wait(cq, -1);
        idle_since = vrpc_tp_now_ns();
    }
    ops->cq_flush(cq);
    while ((n = ops->cq_poll(cq, cq->wc, cq->attr.depth)) > 0)
        deliver(cq, (unsigned)n);
    return NULL;
}

static void add_counts(struct vrpc_cq_counts *to, const struct vrpc_cq_counts *c)
{
    for (unsigned i = 0; i < VRPC_WC_OPS; i++) {
        COUNT(to->n[i], atomic_load_explicit(&c->n[i], memory_order_relaxed));
        COUNT(to->bytes[i], atomic_load_explicit(&c->bytes[i], memory_order_relaxed));
    }
}

void vrpc_transport_counters(const struct vrpc_transport *ctp, struct vrpc_transport_counters *out)
{
    struct vrpc_transport *tp = (struct vrpc_transport *)ctp; /* its mutex */
    struct vrpc_cq_counts c;
    size_t pinned = 0, in_use = 0;

    pthread_mutex_lock(&tp->cq_mu);
    c = tp->retired;
    for (struct vrpc_cq *cq = tp->cqs; cq; cq = cq->next)
        add_counts(&c, &cq->counts);
    pthread_mutex_unlock(&tp->cq_mu);
    memset(out, 0, sizeof *out);
    out->msgs_in = c.n[VRPC_WC_RECV];
    out->bytes_in = c.bytes[VRPC_WC_RECV];
    out->msgs_out = c.n[VRPC_WC_SEND];
    out->bytes_out = c.bytes[VRPC_WC_SEND];
    out->reads = c.n[VRPC_WC_READ];
    out->read_bytes = c.bytes[VRPC_WC_READ];
    out->accepted = c.n[VRPC_WC_ACCEPTED];
    out->disconnected = c.n[VRPC_WC_DISCONNECTED];
    out->connected = atomic_load_explicit(&tp->connects, memory_order_relaxed);
    out->grants = atomic_load_explicit(&tp->grants, memory_order_relaxed);
    out->credit_waits = atomic_load_explicit(&tp->credit_waits, memory_order_relaxed);
    /* a DISCONNECTED counted before its connect's increment is read: no wrap */
    out->connections =
        out->accepted + out->connected > out->disconnected ? out->accepted + out->connected - out->disconnected : 0;
    vrpc_lbuf_stats(tp, &pinned, &in_use);
    out->pinned_bytes = pinned;
    out->large_in_use_bytes = in_use;
}

void vrpc_tp_note_credit_wait(struct vrpc_ep *ep)
{
    atomic_fetch_add_explicit(&ep->tp->credit_waits, 1, memory_order_relaxed);
}

int vrpc_cq_create(struct vrpc_transport *tp, const struct vrpc_cq_attr *attr, struct vrpc_cq **out)
{
    struct vrpc_cq_attr a;
    struct vrpc_cq *cq;
    char name[16];
    int rc;

    if (!tp || !attr || !attr->cb || !out)
        return -EINVAL;
    a = *attr;
    if (!a.depth)
        a.depth = 64;
    if (!a.max_recv)
        a.max_recv = 4096;
    snprintf(name, sizeof name, "%s", a.name ? a.name : "vrpc-cq");
    a.name = NULL;
    rc = tp->ops->cq_create(tp, &a, &cq);
    if (rc)
        return rc;
    cq->tp = tp;
    cq->attr = a;
    memset(&cq->counts, 0, sizeof cq->counts);
    atomic_init(&cq->stopping, false);
    cq->thread_started = false;
    cq->wc = calloc(a.depth, sizeof *cq->wc);
    if (!cq->wc) {
        rc = -ENOMEM;
        goto err_cq;
    }
    rc = -pthread_create(&cq->thread, NULL, poller_main, cq);
    if (rc)
        goto err_wc;
    cq->thread_started = true;
    pthread_mutex_lock(&tp->cq_mu);
    cq->next = tp->cqs;
    tp->cqs = cq;
    pthread_mutex_unlock(&tp->cq_mu);
    pthread_setname_np(cq->thread, name);
    if (a.cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(a.cpu, &set);
        pthread_setaffinity_np(cq->thread, sizeof set, &set);
    }
    *out = cq;
    return 0;
err_wc:
    free(cq->wc);
err_cq:
    tp->ops->cq_destroy(cq);
    return rc;
}

void vrpc_cq_destroy(struct vrpc_cq *cq)
{
    if (!cq)
        return;
    if (cq->thread_started) {
        struct vrpc_transport *tp = cq->tp;
        atomic_store_explicit(&cq->stopping, true, memory_order_release);
        cq->tp->ops->cq_kick(cq);
        pthread_join(cq->thread, NULL);
        pthread_mutex_lock(&tp->cq_mu);
        for (struct vrpc_cq **pp = &tp->cqs; *pp; pp = &(*pp)->next)
            if (*pp == cq) {
                *pp = cq->next;
                break;
            }
        add_counts(&tp->retired, &cq->counts);
        pthread_mutex_unlock(&tp->cq_mu);
    }
    free(cq->wc);
    cq->tp->ops->cq_destroy(cq);
}

int vrpc_cq_post_recv(struct vrpc_cq *cq, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n)
{
    unsigned i;
    if (!cq || (!bufs && n))
        return -EINVAL;
    for (i = 0; i < n; i++)
        if (!bufs[i] || bufs[i]->cap < cq->tp->attr.eager_size)
            return -EINVAL;
    if (!n)
        return 0;
    return cq->tp->ops->post_recv(cq, bufs, wr_ids, n);
}

/* ---- listeners and endpoints ------------------------------------------------ */

static int check_scheme(struct vrpc_transport *tp, const struct vrpc_addr *a)
{
    const char *plus = strchr(a->scheme, '+');
    const struct vrpc_transport_ops *ops;
    if (!strcmp(a->scheme, "auto") || !strcmp(a->scheme, tp->name))
        return 0;
    /* a scheme of another backend (also one left out of the build) or layer+backend */
    ops = find_backend(a->scheme, plus ? (size_t)(plus - a->scheme) : strlen(a->scheme));
    if (ops && (!plus || ops->layer))
        return -EPROTONOSUPPORT;
    return -EINVAL;
}

int vrpc_listen(struct vrpc_transport *tp, const char *uri, const struct vrpc_listen_attr *attr,
                struct vrpc_listener **out)
{
    struct vrpc_addr a;
    int rc;
    if (!tp || !uri || !attr || !attr->cqs || !attr->ncqs || !out)
        return -EINVAL;
    if ((rc = vrpc_addr_parse(uri, &a)) || (rc = check_scheme(tp, &a)))
        return rc;
    return tp->ops->listen(tp, &a, attr, out);
}

void vrpc_listener_destroy(struct vrpc_listener *l)
{
    if (l)
        l->tp->ops->listener_destroy(l);
}

int vrpc_listener_uri(const struct vrpc_listener *l, char *buf, size_t len)
{
    if (strlen(l->uri) >= len)
        return -ENOSPC;
    memcpy(buf, l->uri, strlen(l->uri) + 1);
    return 0;
}

void vrpc_ep_attr_init(struct vrpc_ep_attr *attr) { memset(attr, 0, sizeof *attr); }

int vrpc_connect(struct vrpc_transport *tp, const char *uri, const struct vrpc_ep_attr *attr, struct vrpc_ep **out)
{
    struct vrpc_addr dst, src;
    int rc;
    if (!tp || !uri || !attr || !attr->cq || attr->cq->tp != tp || !out)
        return -EINVAL;
    if ((rc = vrpc_addr_parse(uri, &dst)) || (rc = check_scheme(tp, &dst)))
        return rc;
    if (attr->src_addr) {
        if ((rc = vrpc_addr_parse_ip(attr->src_addr, &src)))
            return rc;
        if (src.ss.ss_family != dst.ss.ss_family)
            return -EINVAL;
    }
    rc = tp->ops->connect(tp, &dst, attr->src_addr ? &src : NULL, attr, out);
    if (rc == 0)
        atomic_fetch_add_explicit(&tp->connects, 1, memory_order_relaxed);
    return rc;
}

void vrpc_ep_base_init(struct vrpc_ep *ep, struct vrpc_transport *tp, struct vrpc_cq *cq, void *user, int refs)
{
    ep->tp = tp;
    ep->cq = cq;
    ep->user = user;
    ep->eager = tp->attr.eager_size;
    atomic_init(&ep->refs, refs);
    ep->peer_uri[0] = 0;
}

void vrpc_ep_unref(struct vrpc_ep *ep)
{
    /* acq_rel: the last dropper sees every write of the other reference's owner. */
    if (atomic_fetch_sub_explicit(&ep->refs, 1, memory_order_acq_rel) == 1)
        ep->tp->ops->ep_free(ep);
}

/* What vrpc_ep_send and each element of vrpc_ep_send_list refuse before the
 * backend sees them (ep checked by the caller). */
static int send_check(const struct vrpc_ep *ep, const struct vrpc_buf *buf, uint32_t len)
{
    if (!buf || len > buf->cap)
        return -EINVAL;
    return len > ep->eager ? -EMSGSIZE : 0;
}

int vrpc_ep_send(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id, unsigned flags)
{
    if (!ep || flags)
        return -EINVAL;
    int rc = send_check(ep, buf, len);
    return rc ? rc : ep->tp->ops->send(ep, buf, len, imm, wr_id, flags);
}

int vrpc_ep_send_list(struct vrpc_ep *ep, const struct vrpc_send_wr *wrs, unsigned n, unsigned flags, unsigned *sent)
{
    unsigned ok = 0, done = 0;
    int rc = 0, bad = 0;
    if (!sent && n > 1)
        return -EINVAL;
    if (sent)
        *sent = 0;
    if (!ep || (n && !wrs) || flags)
        return -EINVAL;
    /* the valid prefix goes to the backend; the first invalid one is refused after it */
    for (; ok < n && !(bad = send_check(ep, wrs[ok].buf, wrs[ok].len)); ok++)
        ;
    int (*list)(struct vrpc_ep *, const struct vrpc_send_wr *, unsigned, unsigned *) =
        VRPC_TP_OP(ep->tp->ops, send_list);
    if (ok && list) {
        rc = list(ep, wrs, ok, &done);
    } else {
        for (; done < ok; done++)
            if ((rc = ep->tp->ops->send(ep, wrs[done].buf, wrs[done].len, wrs[done].imm, wrs[done].wr_id, 0)))
                break;
    }
    if (sent)
        *sent = done;
    return rc ? rc : bad;
}

int vrpc_ep_read(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
                 uint64_t wr_id)
{
    if (!ep || !buf || !buf->mr || len == 0 || off > buf->cap || len > buf->cap - off)
        return -EINVAL;
    return ep->tp->ops->read(ep, buf, off, len, raddr, rkey, wr_id);
}

int vrpc_ep_grant(struct vrpc_ep *ep, struct vrpc_mr *mr, const void *addr, uint32_t len, uint32_t *rkey)
{
    const char *p = addr, *base;
    if (!ep || !mr || !addr || !rkey || len == 0 || !(mr->access & VRPC_ACCESS_GRANT))
        return -EINVAL;
    base = mr->addr;
    if (p < base || (size_t)(p - base) > mr->len || len > mr->len - (size_t)(p - base))
        return -EINVAL;
    int rc = ep->tp->ops->grant(ep, mr, addr, len, rkey);
    if (rc == 0)
        atomic_fetch_add_explicit(&ep->tp->grants, 1, memory_order_relaxed);
    return rc;
}

int vrpc_ep_grant_segs(struct vrpc_ep *ep, const struct vrpc_seg *segs, unsigned n, uint32_t *rkey)
{
    uint64_t len = 0;
    if (!ep)
        return -EINVAL;
    if (!(ep->tp->caps & VRPC_TP_CAP_GATHER)) /* a layer's: of the one below too */
        return -ENOSYS;
    if (!segs || !rkey || n == 0 || n > VRPC_GRANT_SEGS_MAX)
        return -EINVAL;
    for (unsigned i = 0; i < n; i++) {
        if (!segs[i].addr || segs[i].len == 0)
            return -EINVAL;
        len += segs[i].len;
    }
    if (len > UINT32_MAX)
        return -EINVAL;
    int rc = ep->tp->ops->grant_segs(ep, segs, n, (uint32_t)len, rkey);
    if (rc == 0)
        atomic_fetch_add_explicit(&ep->tp->grants, 1, memory_order_relaxed);
    return rc;
}

int vrpc_ep_revoke(struct vrpc_ep *ep, uint32_t rkey, uint64_t wr_id)
{
    if (!ep || rkey == 0)
        return -EINVAL;
    return ep->tp->ops->revoke(ep, rkey, wr_id);
}

int vrpc_ep_close(struct vrpc_ep *ep)
{
    if (!ep)
        return -EINVAL;
    return ep->tp->ops->close(ep);
}

int vrpc_ep_abort(struct vrpc_ep *ep, int status)
{
    if (!ep || status >= 0)
        return -EINVAL;
    return ep->tp->ops->abort(ep, status);
}

void vrpc_ep_destroy(struct vrpc_ep *ep)
{
    if (!ep)
        return;
    ep->tp->ops->close(ep);
    vrpc_ep_unref(ep);
}

void *vrpc_ep_user(const struct vrpc_ep *ep) { return ep->user; }

void vrpc_ep_set_user(struct vrpc_ep *ep, void *user) { ep->user = user; }

uint32_t vrpc_ep_eager_size(const struct vrpc_ep *ep) { return ep->eager; }

int vrpc_ep_peer_uri(const struct vrpc_ep *ep, char *buf, size_t len)
{
    if (strlen(ep->peer_uri) >= len)
        return -ENOSPC;
    memcpy(buf, ep->peer_uri, strlen(ep->peer_uri) + 1);
    return 0;
}

struct vrpc_cq *vrpc_ep_cq(const struct vrpc_ep *ep) { return ep->cq; }
