/* The verbs backend's connect-time decoding (transport/verbs/verbs_hello.c),
 * the steps that read what the peer put in rdma_cm's private data:
 * verbs_hello_check and verbs_hello_set_peer (the HELLO of a connect request
 * or accept: magic, version, initial credits, eager size) and
 * verbs_hello_reject_reason (the reason text of a REJECT). No device is
 * needed: the file is included here whole so its decode functions can be
 * called with a fake transport and endpoint; nothing else of the backend
 * runs (the harness links no verbs transport of the library: this object
 * defines the handshake's symbols).
 * Input: u8 mode, u16 our protocol version, u32 our eager size, u32 our
 * credits attribute, i32 rdma_cm status, then the private data (at most
 * 255 bytes: private_data_len is 8 bits), copied to a buffer of exactly its
 * length so a read past it is caught. */
#include "transport/verbs/verbs_hello.c"

#include "fuzz_common.h"

struct in {
    const uint8_t *p;
    size_t n;
};

static uint64_t take(struct in *s, size_t k)
{
    uint64_t v = 0;
    k = s->n < k ? s->n : k;
    memcpy(&v, s->p, k);
    s->p += k;
    s->n -= k;
    return v;
}

static void check_why(const char *why, size_t n)
{
    FUZZ_CHECK(memchr(why, 0, n) != NULL, "reason not NUL-terminated");
    FUZZ_CHECK(why[0] != 0, "empty reason");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct vtp tp;
    static struct vep ep;
    struct in s = {data, size};
    char why[128];
    unsigned mode = (unsigned)take(&s, 1) % 2;
    tp.cfg.proto_version = (uint16_t)take(&s, 2);
    tp.base.attr.eager_size = (uint32_t)take(&s, 4);
    tp.base.attr.credits = (uint32_t)take(&s, 4);
    int status = (int)take(&s, 4);
    uint8_t len = (uint8_t)(s.n > 255 ? 255 : s.n);
    uint8_t *pd = len ? malloc(len) : NULL;
    if (len)
        memcpy(pd, s.p, len);

    memset(why, 0x5a, sizeof why);
    if (mode == 0) {
        int rc = verbs_hello_check(&tp, pd, len, why, sizeof why);
        FUZZ_CHECK(rc == 0 || rc == -EPROTO, "verbs_hello_check returned %d", rc);
        if (rc) {
            check_why(why, sizeof why);
        } else {
            struct hello h;
            FUZZ_CHECK(len >= sizeof h, "hello of %u bytes accepted", len);
            memcpy(&h, pd, sizeof h);
            FUZZ_CHECK(ntohl(h.magic) == HELLO_MAGIC && ntohs(h.version) == tp.cfg.proto_version &&
                           ntohs(h.credits) >= MIN_RESV,
                       "bad hello accepted");
            ep.tp = &tp;
            verbs_hello_set_peer(&ep, pd);
            uint32_t peer = ntohl(h.eager_size), want = peer < tp.base.attr.eager_size ? peer : tp.base.attr.eager_size;
            FUZZ_CHECK(ep.base.eager == want, "eager %u, want min(peer %u, ours %u)", ep.base.eager, peer,
                       tp.base.attr.eager_size);
            FUZZ_CHECK(ep.credits == ntohs(h.credits) && ep.sig_every >= 1, "credits %u, sig_every %u",
                       (unsigned)ep.credits, (unsigned)ep.sig_every);
        }
    } else {
        struct rdma_cm_event ev;
        memset(&ev, 0, sizeof ev);
        ev.status = status;
        ev.param.conn.private_data = pd;
        ev.param.conn.private_data_len = len;
        int rc = verbs_hello_reject_reason(&ev, why, sizeof why);
        FUZZ_CHECK(rc == -EPROTO || rc == -ECONNREFUSED, "verbs_hello_reject_reason returned %d", rc);
        check_why(why, sizeof why);
    }
    free(pd);
    return 0;
}
