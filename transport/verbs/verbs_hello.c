/* The connect-time handshake in rdma_cm's private data: the HELLO of a
 * connect request or accept (magic, version, initial credits, eager size)
 * and the REJECT with its reason. Decoding only reads the bytes given
 * (tests/fuzz/fuzz_verbs_hello.c includes this file). */
#include "transport/verbs/verbs.h"

static void hello_fill(const struct vtp *tp, struct hello *h, uint32_t credits)
{
    memset(h, 0, sizeof(*h));
    h->magic = htonl(HELLO_MAGIC);
    h->version = htons(tp->cfg.proto_version);
    h->credits = htons((uint16_t)credits);
    h->eager_size = htonl(tp->base.attr.eager_size);
}

int verbs_hello_check(const struct vtp *tp, const void *data, uint8_t len, char *why, size_t n)
{
    struct hello h;
    if (!data || len < sizeof(h)) {
        snprintf(why, n, "no verbrpc hello in the connect data");
        return -EPROTO;
    }
    memcpy(&h, data, sizeof(h));
    if (ntohl(h.magic) != HELLO_MAGIC) {
        snprintf(why, n, "peer is not verbrpc");
        return -EPROTO;
    }
    if (ntohs(h.version) != tp->cfg.proto_version) {
        snprintf(why, n, "protocol version %u not supported (speaks %u)", ntohs(h.version), tp->cfg.proto_version);
        return -EPROTO;
    }
    if (ntohs(h.credits) < MIN_RESV) {
        snprintf(why, n, "initial credits %u, at least %u needed", ntohs(h.credits), MIN_RESV);
        return -EPROTO;
    }
    if (ntohl(h.eager_size) < VRPC_EAGER_MIN) {
        snprintf(why, n, "eager size %u below the minimum %u", ntohl(h.eager_size), VRPC_EAGER_MIN);
        return -EPROTO;
    }
    return 0;
}

void verbs_hello_set_peer(struct vep *ep, const void *data)
{
    struct hello h;
    uint32_t e;
    memcpy(&h, data, sizeof(h));
    ep->credits = ntohs(h.credits);
    e = ntohl(h.eager_size);
    ep->base.eager = e < ep->tp->base.attr.eager_size ? e : ep->tp->base.attr.eager_size;
    ep->sig_every = ep->tp->base.attr.credits / 4 ? ep->tp->base.attr.credits / 4 : 1;
}

void verbs_hello_conn_param(struct vep *ep, struct rdma_conn_param *p, struct hello *h)
{
    hello_fill(ep->tp, h, MIN_RESV);
    memset(p, 0, sizeof(*p));
    p->private_data = h;
    p->private_data_len = sizeof(*h);
    p->retry_count = ep->tp->cfg.retry_cnt;
    p->rnr_retry_count = ep->tp->cfg.rnr_retry;
    /* RDMA READ depth both ways, as much as the device allows (librdmacm
	 * clamps these two values to it). With 0/0, the default, a READ never
	 * completes and never fails: it hangs. */
    p->responder_resources = RDMA_MAX_RESP_RES;
    p->initiator_depth = RDMA_MAX_INIT_DEPTH;
    p->qp_num = ep->qpn;
    p->srq = 1;
}

void verbs_hello_reject(struct rdma_cm_id *id, const struct vtp *tp, int code, const char *why)
{
    struct rejectmsg r;
    memset(&r, 0, sizeof(r));
    r.magic = htonl(HELLO_MAGIC);
    r.version = htons(tp->cfg.proto_version);
    r.code = htons((uint16_t)-code);
    snprintf(r.why, sizeof(r.why), "%.*s", (int)sizeof(r.why) - 1, why); /* cut to fit */
    rdma_reject(id, &r, sizeof(r));
}

int verbs_hello_reject_reason(const struct rdma_cm_event *ev, char *why, size_t n)
{
    struct rejectmsg r;
    if (ev->param.conn.private_data && ev->param.conn.private_data_len >= sizeof(r)) {
        memcpy(&r, ev->param.conn.private_data, sizeof(r));
        if (ntohl(r.magic) == HELLO_MAGIC) {
            r.why[sizeof(r.why) - 1] = 0;
            snprintf(why, n, "refused by the server: %s", r.why);
            return ntohs(r.code) == EPROTO ? -EPROTO : -ECONNREFUSED;
        }
    }
    if (ev->status == 8) /* IB_CM_REJ_INVALID_SERVICE_ID */
        snprintf(why, n, "connection refused: no listener on that port");
    else
        snprintf(why, n, "connection rejected (rdma_cm status %d)", ev->status);
    return -ECONNREFUSED;
}
