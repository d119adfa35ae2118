/* The TCP backend's transport (context): create/destroy, its options from
 * the environment table, and the ops table that names every other file's
 * operations. Design and file map: tcp.h. */
#define _GNU_SOURCE
#include "transport/tcp/tcp.h"

static int tcp_tp_create(const struct vrpc_transport_attr *attr, struct vrpc_transport **out)
{
    struct tcp_tp *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    vrpc_grant_table_init(&t->grants, (uint32_t)vrpc_env_long(VRPC_ENV_TCP_TEST_EP_GRANTS),
                          vrpc_tcp_rma_grant_complete);
    t->no_flow_busy = vrpc_env_flag(VRPC_ENV_TCP_NO_FLOW_BUSY);
    t->base.headroom = HDR_LEN; /* the frame header is written in front of the payload */
    *out = &t->base;
    return 0;
}

static void tcp_tp_destroy(struct vrpc_transport *tp)
{
    struct tcp_tp *t = container_of(tp, struct tcp_tp, base);
    vrpc_grant_table_destroy(&t->grants);
    free(t);
}

static int tcp_probe(void) { return 0; }

const struct vrpc_transport_ops vrpc_tcp_ops = {
    VRPC_TP_OPS_HEAD,
    .name = "tcp",
    .caps = VRPC_TP_CAP_GATHER,
    .probe = tcp_probe,
    .tp_create = tcp_tp_create,
    .tp_destroy = tcp_tp_destroy,
    .mr_reg = vrpc_tcp_mr_reg,
    .mr_dereg = vrpc_tcp_mr_dereg,
    .cq_create = vrpc_tcp_cq_create,
    .cq_destroy = vrpc_tcp_cq_destroy,
    .cq_poll = vrpc_tcp_cq_poll,
    .cq_arm = vrpc_tcp_cq_arm,
    .cq_wait = vrpc_tcp_cq_wait,
    .cq_kick = vrpc_tcp_cq_kick,
    .cq_flush = vrpc_tcp_cq_flush,
    .post_recv = vrpc_tcp_cq_post_recv,
    .listen = vrpc_tcp_cm_listen,
    .listener_destroy = vrpc_tcp_cm_listener_destroy,
    .connect = vrpc_tcp_cm_connect,
    .send = vrpc_tcp_msg_send,
    .read = vrpc_tcp_rma_read,
    .grant = vrpc_tcp_rma_grant,
    .revoke = vrpc_tcp_rma_revoke,
    .grant_segs = vrpc_tcp_rma_grant_segs,
    .send_list = vrpc_tcp_msg_send_list,
    .close = vrpc_tcp_ep_close,
    .abort = vrpc_tcp_ep_abort,
    .ep_free = vrpc_tcp_ep_free,
};
