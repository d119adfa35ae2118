/* The fault layer's transport object: creation over the transport below,
 * the counters of injections (logged at destroy), memory registration
 * (forwarded: MRs are the lower backend's own, so buffers pass down as they
 * are), and the one ops table. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/fault/fault.h"

/* fault transports created since the last vrpc_fault_configure() (or the
 * process start): the first coordinate of every stream's seed */
static atomic_uint_fast64_t tp_count;

void fault_tp_count_reset(void) { atomic_store(&tp_count, 0); }
static atomic_uint_fast64_t totals[VRPC_FAULT_KINDS], check_totals[VRPC_FAULT_CHECKS];

static const char *const kind_names[VRPC_FAULT_KINDS] = {
    [VRPC_FAULT_LOSS_SEND_BEFORE] = "loss_send_before",
    [VRPC_FAULT_LOSS_SEND_AFTER] = "loss_send_after",
    [VRPC_FAULT_LOSS_RECV] = "loss_recv",
    [VRPC_FAULT_LOSS_READ] = "loss_read",
    [VRPC_FAULT_CONNECT_REFUSED] = "connect_refused",
    [VRPC_FAULT_ACCEPT_DROPPED] = "accept_dropped",
    [VRPC_FAULT_CQ_STALL] = "cq_stall",
    [VRPC_FAULT_SEND_DELAY] = "send_delay",
    [VRPC_FAULT_SEND_EAGAIN] = "send_eagain",
    [VRPC_FAULT_SEND_ERROR] = "send_error",
    [VRPC_FAULT_READ_ERROR] = "read_error",
    [VRPC_FAULT_GRANT_REFUSED] = "grant_refused",
    [VRPC_FAULT_RECV_HELD] = "recv_held",
    [VRPC_FAULT_RECV_DROPPED] = "recv_dropped",
    [VRPC_FAULT_CPL_DEFERRED] = "cpl_deferred",
};

const char *vrpc_fault_kind_name(enum vrpc_fault_kind k)
{
    return (unsigned)k < VRPC_FAULT_KINDS ? kind_names[k] : "?";
}

void fault_count(struct fault_tp *t, enum vrpc_fault_kind k)
{
    atomic_fetch_add_explicit(&t->n[k], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&totals[k], 1, memory_order_relaxed);
}

void fault_check_failed(struct fault_tp *t, enum vrpc_fault_check c, const char *what)
{
    atomic_fetch_add_explicit(&t->check[c], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&check_totals[c], 1, memory_order_relaxed);
    vrpc_tp_log("fault: CONTRACT VIOLATION: %s", what);
}

int vrpc_fault_counts(const struct vrpc_transport *tp, struct vrpc_fault_counts *out)
{
    if (!tp || !out || tp->ops != &vrpc_fault_ops)
        return -EINVAL;
    struct fault_tp *t = fault_tp_of((struct vrpc_transport *)tp);
    for (int k = 0; k < VRPC_FAULT_KINDS; k++)
        out->n[k] = atomic_load_explicit(&t->n[k], memory_order_relaxed);
    for (int c = 0; c < VRPC_FAULT_CHECKS; c++)
        out->check[c] = atomic_load_explicit(&t->check[c], memory_order_relaxed);
    return 0;
}

int vrpc_fault_set_quiet(struct vrpc_transport *tp, bool quiet)
{
    if (!tp || tp->ops != &vrpc_fault_ops)
        return -EINVAL;
    atomic_store_explicit(&fault_tp_of(tp)->quiet, quiet, memory_order_relaxed);
    return 0;
}

void vrpc_fault_totals(struct vrpc_fault_counts *out)
{
    for (int k = 0; k < VRPC_FAULT_KINDS; k++)
        out->n[k] = atomic_load_explicit(&totals[k], memory_order_relaxed);
    for (int c = 0; c < VRPC_FAULT_CHECKS; c++)
        out->check[c] = atomic_load_explicit(&check_totals[c], memory_order_relaxed);
}

static int fault_probe(void) { return -ENOSYS; /* test machinery: "auto" never picks it */ }

int fault_tp_create(const struct vrpc_transport_attr *attr, struct vrpc_transport **out)
{
    struct vrpc_transport *lower = *out; /* the core's hand-over (transport_ops.h, layer) */
    struct fault_tp *t;
    int rc;

    (void)attr;
    t = calloc(1, sizeof *t);
    if (!t) {
        rc = -ENOMEM;
        goto err;
    }
    if ((rc = fault_spec_current(&t->spec)))
        goto err;
    t->lower = lower;
    t->index = atomic_fetch_add(&tp_count, 1);
    pthread_mutex_init(&t->mu, NULL);
    fault_rng_seed(&t->rng, t->spec.seed, t->index, UINT64_MAX);
    t->base.headroom = lower->headroom;
    *out = &t->base;
    return 0;
err:
    free(t);
    vrpc_transport_destroy(lower);
    return rc;
}

void fault_tp_destroy(struct vrpc_transport *tp)
{
    struct fault_tp *t = fault_tp_of(tp);
    char line[320];
    size_t n = 0;
    int64_t out = atomic_load(&t->bufs_out);

    for (int k = 0; k < VRPC_FAULT_KINDS && n < sizeof line; k++) {
        uint64_t v = atomic_load(&t->n[k]);
        if (v)
            n += (size_t)snprintf(line + n, sizeof line - n, " %s=%llu", kind_names[k], (unsigned long long)v);
    }
    if (out)
        fault_check_failed(t, VRPC_FAULT_BUFS_OUT, "buffers given to the backend below never completed");
    vrpc_tp_log("fault: transport %llu (%s, seed %llu) destroyed; injected:%s%s", (unsigned long long)t->index,
                tp->name, (unsigned long long)t->spec.seed, n ? line : " nothing", out ? " (BUFFERS OUT)" : "");
    vrpc_transport_destroy(t->lower);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

int fault_mr_reg(struct vrpc_transport *tp, void *addr, size_t len, unsigned access, struct vrpc_mr **out)
{
    return vrpc_mr_reg(fault_tp_of(tp)->lower, addr, len, access, out);
}

void fault_mr_dereg(struct vrpc_mr *mr) { vrpc_mr_dereg(mr); /* never reached: mr->tp is the lower transport */ }

const struct vrpc_transport_ops vrpc_fault_ops = {
    VRPC_TP_OPS_HEAD,
    .name = "fault",
    /* all it forwards: the transport has those of the one below (transport_ops.h) */
    .caps = VRPC_TP_CAP_GATHER | VRPC_TP_CAP_REMOTE_READ | VRPC_TP_CAP_PINS_MEMORY,
    .layer = true,
    .probe = fault_probe,
    .tp_create = fault_tp_create,
    .tp_destroy = fault_tp_destroy,
    .mr_reg = fault_mr_reg,
    .mr_dereg = fault_mr_dereg,
    .cq_create = fault_cq_create,
    .cq_destroy = fault_cq_destroy,
    .cq_poll = fault_cq_poll,
    .cq_arm = fault_cq_arm,
    .cq_wait = fault_cq_wait,
    .cq_kick = fault_cq_kick,
    .cq_flush = fault_cq_flush,
    .post_recv = fault_post_recv,
    .listen = fault_listen,
    .listener_destroy = fault_listener_destroy,
    .connect = fault_connect,
    .send = fault_send,
    .read = fault_read,
    .grant = fault_grant,
    .grant_segs = fault_grant_segs,
    .revoke = fault_revoke,
    .close = fault_close,
    .abort = fault_abort,
    .ep_free = fault_ep_free,
};
