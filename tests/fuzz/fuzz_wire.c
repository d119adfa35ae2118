/* RPC wire decoders (rpc/wire.c): the input is one RPC frame as a transport
 * delivers it. vrpc_wire_hdr_decode, then whatever the RPC layer decodes in
 * its body: the metadata block (REQUEST, RESPONSE, HEADERS), the rendezvous
 * descriptor (RNDV REQUEST/RESPONSE/MESSAGE), the HELLO settings
 * (HELLO/HELLO_ACK, with the stream window), the WINDOW increment. Beyond "no crash,
 * no sanitizer report" each accepted part must survive a round trip:
 * decode(encode(decoded)) is the decoded header, a metadata block re-encodes
 * to its own bytes, the descriptor and HELLO settings to theirs. */
#include <errno.h>
#include <string.h>
#include "fuzz_common.h"
#include "rpc/wire.h"

static void check_hdr(const uint8_t *data, size_t size, const struct vrpc_wire_hdr *h)
{
    uint8_t frame[VRPC_WIRE_HDR_LEN + VRPC_WIRE_MD_BLOCK_MAX + VRPC_WIRE_DESC_LEN];
    struct vrpc_wire_hdr h2;
    bool rndv = h->flags & VRPC_FF_RNDV;
    size_t body = h->md_len + (rndv ? VRPC_WIRE_DESC_LEN : h->payload_len);

    FUZZ_CHECK(size == VRPC_WIRE_HDR_LEN + body, "accepted frame of %zu bytes, header says %zu", size,
               VRPC_WIRE_HDR_LEN + body);
    FUZZ_CHECK(h->version == VRPC_WIRE_VERSION && h->type >= VRPC_FT_HELLO && h->type <= VRPC_FT_MAX &&
                   !(h->flags & ~VRPC_FF_KNOWN) && h->status < 256,
               "accepted header fields out of range");
    vrpc_wire_hdr_encode(frame, h);
    memcpy(frame + VRPC_WIRE_HDR_LEN, data + VRPC_WIRE_HDR_LEN, body);
    FUZZ_CHECK(vrpc_wire_hdr_decode(frame, size, &h2) == 0, "re-encoded header refused");
    FUZZ_CHECK(h->type == h2.type && h->flags == h2.flags && h->status == h2.status && h->md_len == h2.md_len &&
                   h->request_id == h2.request_id && h->method_id == h2.method_id && h->payload_len == h2.payload_len,
               "header round trip");
    FUZZ_CHECK(h->budget_us == h2.budget_us, "budget %llu us came back as %llu us", (unsigned long long)h->budget_us,
               (unsigned long long)h2.budget_us);
    /* every other field is bit-exact on the wire */
    FUZZ_CHECK(!memcmp(frame + 2, data + 2, 18) && !memcmp(frame + 24, data + 24, 4),
               "header fields re-encode differently");
}

static void check_md(const uint8_t *md, size_t len)
{
    struct vrpc_metadata e[VRPC_MD_MAX];
    uint8_t out[VRPC_WIRE_MD_BLOCK_MAX];
    int n = vrpc_wire_md_decode(md, len, e, VRPC_MD_MAX);
    if (n < 0) {
        FUZZ_CHECK(n == -EPROTO, "md decode returned %d", n);
        return;
    }
    long sz = vrpc_wire_md_size(e, (size_t)n);
    FUZZ_CHECK(sz == (long)len, "decoded metadata sizes to %ld, block is %zu", sz, len);
    vrpc_wire_md_encode(out, e, (size_t)n);
    FUZZ_CHECK(!memcmp(out, md, len), "metadata block re-encodes differently");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct vrpc_wire_hdr h;
    int rc = vrpc_wire_hdr_decode(data, size, &h);
    if (rc) {
        FUZZ_CHECK(rc == -EPROTO || rc == -EPROTONOSUPPORT, "header decode returned %d", rc);
        return 0;
    }
    check_hdr(data, size, &h);
    const uint8_t *body = data + VRPC_WIRE_HDR_LEN;
    if (h.md_len)
        check_md(body, h.md_len);
    if (h.flags & VRPC_FF_RNDV) {
        struct vrpc_wire_desc d;
        uint8_t out[VRPC_WIRE_DESC_LEN];
        if (vrpc_wire_desc_decode(body + h.md_len, h.payload_len, &d) == 0) {
            FUZZ_CHECK(d.rkey != 0 && d.addr <= UINT64_MAX - h.payload_len, "bad descriptor accepted");
            vrpc_wire_desc_encode(out, &d);
            FUZZ_CHECK(!memcmp(out, body + h.md_len, 12), "descriptor re-encodes differently");
        }
    }
    if (h.type == VRPC_FT_HELLO || h.type == VRPC_FT_HELLO_ACK) {
        struct vrpc_wire_hello s;
        uint8_t out[VRPC_WIRE_HELLO_LEN];
        if (vrpc_wire_hello_decode(body, h.payload_len, &s) == 0) {
            FUZZ_CHECK(s.max_concurrent != 0, "HELLO with 0 slots accepted");
            FUZZ_CHECK(s.stream_window != 0 && s.stream_window <= VRPC_WIRE_WINDOW_SUM_MAX,
                       "HELLO with stream window %u accepted", s.stream_window);
            vrpc_wire_hello_encode(out, &s);
            FUZZ_CHECK(!memcmp(out, body, 16), "HELLO settings re-encode differently");
        }
    }
    if (h.type == VRPC_FT_WINDOW) {
        uint32_t n;
        uint8_t out[VRPC_WIRE_WINDOW_LEN];
        if (vrpc_wire_window_decode(body, h.payload_len, &n) == 0) {
            FUZZ_CHECK(n != 0 && n <= VRPC_WIRE_WINDOW_SUM_MAX, "WINDOW of %u accepted", n);
            vrpc_wire_window_encode(out, n);
            FUZZ_CHECK(!memcmp(out, body, VRPC_WIRE_WINDOW_LEN), "WINDOW re-encodes differently");
        }
    }
    if (h.type == VRPC_FT_REQUEST && (h.flags & VRPC_FF_STREAM))
        FUZZ_CHECK(h.payload_len == 0 && !(h.flags & VRPC_FF_RNDV), "REQUEST|STREAM with a message accepted");
    if (h.flags & VRPC_FF_END)
        FUZZ_CHECK(h.type == VRPC_FT_MESSAGE, "END accepted on frame type %u", h.type);
    return 0;
}
