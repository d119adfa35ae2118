/* Large-message (rendezvous) descriptor handling: what decides an announced
 * large message before any byte of it moves.
 *   - the RPC side (rpc/wire.c, rpc/rndv.c): a RNDV REQUEST or RESPONSE
 *     frame, its descriptor (address, key, size: no zero key, no overflow of
 *     address + size), and vrpc_rndv_send_limit, the largest payload a side
 *     may send for the peer's announced limit, features and eager size;
 *   - the TCP owner's side (transport/tcp/tcp_wire.h): whether a read request
 *     (address, length) falls inside a grant, and the segment list walk that
 *     maps an accepted read onto the granted segments (gathered grants), both
 *     checked against a model in 128-bit arithmetic.
 * Input: u8 nsegs, nsegs x u32 segment lengths, u64 read offset from the
 * window start (may be anything), u32 read length, u32 peer max, u32 peer
 * features, u32 eager size, then the RPC frame. */
#include <errno.h>
#include <string.h>
#include "fuzz_common.h"
#include "rpc/rndv.h"
#include "rpc/wire.h"
#include "transport/tcp/tcp_wire.h"

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

static void check_window(const struct vrpc_seg *segs, uint32_t n, uint64_t glen, uint64_t base, uint64_t raddr,
                         uint32_t length)
{
    struct iovec iov[VRPC_GRANT_SEGS_MAX];
    unsigned __int128 end = (unsigned __int128)raddr + length, wend = (unsigned __int128)base + glen;
    bool model = length >= 1 && raddr >= base && end <= wend;
    bool got = vrpc_tcp_read_in_grant(base, (uint32_t)glen, raddr, length);
    FUZZ_CHECK(got == model, "read [%#llx, +%u) in grant [%#llx, +%llu): says %d", (unsigned long long)raddr, length,
               (unsigned long long)base, (unsigned long long)glen, got);
    if (!got)
        return;
    uint32_t off = (uint32_t)(raddr - base);
    size_t k = vrpc_tcp_segs_iov(segs, n, off, length, iov);
    FUZZ_CHECK(k >= 1 && k <= n, "%zu iovecs for %u segments", k, n);
    /* the iovecs are the window's bytes [off, off + length) in order */
    uint64_t pos = 0, want = off, sum = 0;
    uint32_t i = 0;
    for (size_t j = 0; j < k; j++) {
        while (i < n && pos + segs[i].len <= want)
            pos += segs[i++].len;
        FUZZ_CHECK(i < n, "iovec %zu beyond the window", j);
        const char *at = (const char *)segs[i].addr + (want - pos);
        FUZZ_CHECK(iov[j].iov_base == at, "iovec %zu starts at the wrong byte", j);
        FUZZ_CHECK(iov[j].iov_len >= 1 && want - pos + iov[j].iov_len <= segs[i].len, "iovec %zu leaves segment %u", j,
                   i);
        want += iov[j].iov_len;
        sum += iov[j].iov_len;
    }
    FUZZ_CHECK(sum == length, "iovecs cover %llu bytes of %u", (unsigned long long)sum, length);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct in s = {data, size};
    struct vrpc_seg segs[VRPC_GRANT_SEGS_MAX];
    uint32_t n = 1 + (uint32_t)(take(&s, 1) % VRPC_GRANT_SEGS_MAX);
    uint64_t glen = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)take(&s, 4);
        segs[i].len = l ? l : 1;
        /* addresses are only compared, never dereferenced */
        segs[i].addr = (const void *)(uintptr_t)(((uint64_t)i + 1) << 40);
        glen += segs[i].len;
    }
    uint64_t roff = take(&s, 8);
    uint32_t length = (uint32_t)take(&s, 4);
    uint32_t peer_max = (uint32_t)take(&s, 4), peer_feat = (uint32_t)take(&s, 4), eager = (uint32_t)take(&s, 4);

    /* vrpc_rndv_send_limit: the caller's eager size holds at least a header */
    if (eager < VRPC_WIRE_HDR_LEN)
        eager = VRPC_WIRE_HDR_LEN;
    uint32_t lim = vrpc_rndv_send_limit(peer_max, peer_feat, eager);
    if (vrpc_rndv_features & peer_feat & VRPC_FEAT_LARGE)
        FUZZ_CHECK(lim == peer_max, "both sides do large messages: limit %u, peer's %u", lim, peer_max);
    else
        FUZZ_CHECK(lim <= peer_max && lim <= eager - VRPC_WIRE_HDR_LEN &&
                       (lim == peer_max || lim == eager - VRPC_WIRE_HDR_LEN),
                   "eager only: limit %u for peer max %u, eager %u", lim, peer_max, eager);

    /* the frame and its descriptor */
    struct vrpc_wire_hdr h;
    uint64_t base = (uint64_t)(uintptr_t)segs[0].addr;
    if (vrpc_wire_hdr_decode(s.p, s.n, &h) == 0 && (h.flags & VRPC_FF_RNDV)) {
        struct vrpc_wire_desc d;
        /* wire version 3: a stream's MESSAGE may be large too (PROTOCOL.md, "Large
         * messages in a stream") */
        FUZZ_CHECK((h.type == VRPC_FT_REQUEST || h.type == VRPC_FT_RESPONSE || h.type == VRPC_FT_MESSAGE) &&
                       h.payload_len >= 1 && s.n == VRPC_WIRE_HDR_LEN + h.md_len + VRPC_WIRE_DESC_LEN,
                   "RNDV frame accepted with type %u, payload %u, %zu bytes", h.type, h.payload_len, s.n);
        if (vrpc_wire_desc_decode(s.p + VRPC_WIRE_HDR_LEN + h.md_len, h.payload_len, &d) == 0) {
            FUZZ_CHECK(d.rkey && (unsigned __int128)d.addr + h.payload_len <= UINT64_MAX,
                       "descriptor accepted with key %#x, addr %#llx + %u", d.rkey, (unsigned long long)d.addr,
                       h.payload_len);
            /* the announced window as the owner would grant it: reads of
             * the announced size at the announced address */
            if (glen <= UINT32_MAX)
                check_window(segs, n, glen, d.addr, d.addr + roff % ((uint64_t)h.payload_len + 1), length);
            base = d.addr;
        }
    }
    if (glen <= UINT32_MAX)
        check_window(segs, n, glen, base, base + roff, length);
    return 0;
}
