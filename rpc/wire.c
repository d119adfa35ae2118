/* Encode/decode of the verbrpc frame header, metadata block and HELLO
 * settings. Every multi-byte field is little-endian on the wire; the
 * accessors convert explicitly, so the code is right on any host. */
#include "rpc/wire.h"

#include <verbrpc/stream.h>

#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>

/* Little-endian accessors: memcpy plus htole/letoh, which compile to plain
 * loads and stores on little-endian hosts and to byte swaps elsewhere. */
static void put16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, 2);
}
static void put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}
static void put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}
static uint16_t get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

/* Header layout (docs/PROTOCOL.md):
 *   0 magic u16 | 2 version u8 | 3 type u8 | 4 flags u8 | 5 status u8 |
 *   6 md_len u16 | 8 request_id u64 | 16 method_id u32 | 20 budget u32 |
 *   24 payload_len u32 | 28 */
static uint32_t budget_encode(uint64_t us)
{
    if (us < VRPC_WIRE_BUDGET_MS)
        return (uint32_t)us;
    uint64_t ms = us / 1000 + (us % 1000 != 0); /* never earlier than the caller's */
    return VRPC_WIRE_BUDGET_MS | (uint32_t)(ms < VRPC_WIRE_BUDGET_MS ? ms : VRPC_WIRE_BUDGET_MS - 1);
}

static uint64_t budget_decode(uint32_t v)
{
    return v & VRPC_WIRE_BUDGET_MS ? (uint64_t)(v & ~VRPC_WIRE_BUDGET_MS) * 1000 : v;
}

void vrpc_wire_hdr_encode(uint8_t out[VRPC_WIRE_HDR_LEN], const struct vrpc_wire_hdr *h)
{
    put16(out + 0, VRPC_WIRE_MAGIC);
    out[2] = h->version;
    out[3] = h->type;
    out[4] = (uint8_t)h->flags;
    out[5] = (uint8_t)h->status;
    put16(out + 6, (uint16_t)h->md_len);
    put64(out + 8, h->request_id);
    put32(out + 16, h->method_id);
    put32(out + 20, budget_encode(h->budget_us));
    put32(out + 24, h->payload_len);
}

/* Per-type rules of a stream frame (MESSAGE, HALF_CLOSE, WINDOW, HEADERS):
 * a request id, no method, status or budget; md only on HEADERS. */
static int stream_frame_check(const struct vrpc_wire_hdr *h)
{
    if (h->request_id == 0 || h->status != 0 || h->method_id != 0 || h->budget_us != 0)
        return -EPROTO;
    switch (h->type) {
    case VRPC_FT_MESSAGE:
        return (h->flags & ~(VRPC_FF_RNDV | VRPC_FF_END)) || h->md_len != 0 ? -EPROTO : 0;
    case VRPC_FT_HALF_CLOSE:
        return h->flags != 0 || h->md_len != 0 || h->payload_len != 0 ? -EPROTO : 0;
    case VRPC_FT_WINDOW:
        return h->flags != 0 || h->md_len != 0 || h->payload_len != VRPC_WIRE_WINDOW_LEN ? -EPROTO : 0;
    default: /* VRPC_FT_HEADERS */
        return h->flags != 0 || h->payload_len != 0 ? -EPROTO : 0;
    }
}

/* Per-type rules of the other frames. */
static int frame_check(const struct vrpc_wire_hdr *h)
{
    switch (h->type) {
    case VRPC_FT_REQUEST:
        if (h->request_id == 0 || h->status != 0 || (h->flags & (VRPC_FF_END | VRPC_FF_REFUSED)))
            return -EPROTO;
        if ((h->flags & VRPC_FF_STREAM) && ((h->flags & VRPC_FF_RNDV) || h->payload_len != 0))
            return -EPROTO;
        return 0;
    case VRPC_FT_RESPONSE: /* md: the call's trailing metadata */
        if (h->request_id == 0 || h->status >= VRPC_CODE_COUNT || (h->flags & ~(VRPC_FF_RNDV | VRPC_FF_REFUSED)) ||
            h->method_id != 0 || ((h->flags & VRPC_FF_REFUSED) && h->status == VRPC_OK))
            return -EPROTO;
        return 0;
    case VRPC_FT_CANCEL:
        if (h->request_id == 0 || h->flags != 0 || h->status != 0 || h->md_len != 0 || h->payload_len != 0)
            return -EPROTO;
        return 0;
    case VRPC_FT_DONE:
        if (h->request_id == 0 || h->flags != 0 || h->status >= VRPC_CODE_COUNT || h->method_id != 0 ||
            h->md_len != 0 || h->payload_len != 0 || h->budget_us != 0)
            return -EPROTO;
        return 0;
    case VRPC_FT_HELLO:
    case VRPC_FT_HELLO_ACK:
        if (h->request_id != 0 || h->flags != 0 || h->status != 0 || h->md_len != 0 ||
            h->payload_len != VRPC_WIRE_HELLO_LEN)
            return -EPROTO;
        return 0;
    case VRPC_FT_GOAWAY:
        return h->request_id != 0 || h->flags != 0 || h->md_len != 0 ? -EPROTO : 0;
    default:
        return stream_frame_check(h);
    }
}

int vrpc_wire_hdr_decode(const uint8_t *frame, size_t frame_len, struct vrpc_wire_hdr *out)
{
    struct vrpc_wire_hdr h;

    if (frame_len < VRPC_WIRE_HDR_LEN || get16(frame) != VRPC_WIRE_MAGIC)
        return -EPROTO;
    h.version = frame[2];
    h.type = frame[3];
    h.flags = frame[4];
    h.status = frame[5];
    h.md_len = get16(frame + 6);
    h.request_id = get64(frame + 8);
    h.method_id = get32(frame + 16);
    h.budget_us = budget_decode(get32(frame + 20));
    h.payload_len = get32(frame + 24);
    if (h.version != VRPC_WIRE_VERSION)
        return -EPROTONOSUPPORT;
    if (h.type < VRPC_FT_HELLO || h.type > VRPC_FT_MAX || (h.flags & ~VRPC_FF_KNOWN))
        return -EPROTO;
    bool rndv = h.flags & VRPC_FF_RNDV;
    if (rndv && ((h.type != VRPC_FT_REQUEST && h.type != VRPC_FT_RESPONSE && h.type != VRPC_FT_MESSAGE) ||
                 h.status != 0 || h.payload_len == 0))
        return -EPROTO;
    if ((uint64_t)VRPC_WIRE_HDR_LEN + h.md_len + (rndv ? VRPC_WIRE_DESC_LEN : h.payload_len) != frame_len)
        return -EPROTO;
    if (frame_check(&h) != 0)
        return -EPROTO;
    *out = h;
    return 0;
}

static int key_valid(const char *k, size_t len)
{
    if (len == 0 || len > VRPC_WIRE_MD_KEY_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = k[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

/* Entry: u16 key_len, u16 value_len, key bytes, one 0 byte, value bytes. */
long vrpc_wire_md_size(const struct vrpc_metadata *md, size_t n)
{
    long total = 0;

    if (n > VRPC_MD_MAX || (n && !md))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        size_t kl = md[i].key ? strlen(md[i].key) : 0;
        if (!key_valid(md[i].key, kl) || md[i].value_len > VRPC_WIRE_MD_VAL_MAX || (md[i].value_len && !md[i].value))
            return -EINVAL;
        total += 4 + (long)kl + 1 + (long)md[i].value_len;
    }
    return total > VRPC_WIRE_MD_BLOCK_MAX ? -EINVAL : total;
}

void vrpc_wire_md_encode(uint8_t *out, const struct vrpc_metadata *md, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(md[i].key);
        put16(out, (uint16_t)kl);
        put16(out + 2, (uint16_t)md[i].value_len);
        memcpy(out + 4, md[i].key, kl);
        out[4 + kl] = 0;
        if (md[i].value_len)
            memcpy(out + 5 + kl, md[i].value, md[i].value_len);
        out += 5 + kl + md[i].value_len;
    }
}

int vrpc_wire_md_decode(const uint8_t *buf, size_t len, struct vrpc_metadata *out, size_t cap)
{
    size_t off = 0;
    int n = 0;

    while (off < len) {
        if (len - off < 5 || (size_t)n >= cap)
            return -EPROTO;
        size_t kl = get16(buf + off), vl = get16(buf + off + 2);
        if (len - off - 4 < kl + 1 + vl)
            return -EPROTO;
        const char *key = (const char *)buf + off + 4;
        if (!key_valid(key, kl) || key[kl] != 0)
            return -EPROTO;
        out[n].key = key;
        out[n].value = buf + off + 5 + kl;
        out[n].value_len = vl;
        n++;
        off += 5 + kl + vl;
    }
    return n;
}

void vrpc_wire_desc_encode(uint8_t out[VRPC_WIRE_DESC_LEN], const struct vrpc_wire_desc *d)
{
    put64(out, d->addr);
    put32(out + 8, d->rkey);
    put32(out + 12, 0);
}

int vrpc_wire_desc_decode(const uint8_t *buf, uint32_t payload_len, struct vrpc_wire_desc *d)
{
    uint64_t addr = get64(buf);
    uint32_t rkey = get32(buf + 8);
    if (rkey == 0 || addr > UINT64_MAX - payload_len)
        return -EPROTO;
    d->addr = addr;
    d->rkey = rkey;
    return 0;
}

void vrpc_wire_hello_encode(uint8_t out[VRPC_WIRE_HELLO_LEN], const struct vrpc_wire_hello *h)
{
    put32(out, h->max_msg_size);
    put32(out + 4, h->max_concurrent);
    put32(out + 8, h->features);
    put32(out + 12, h->stream_window ? h->stream_window : VRPC_STREAM_WINDOW_DEFAULT);
}

int vrpc_wire_hello_decode(const uint8_t *buf, size_t len, struct vrpc_wire_hello *h)
{
    if (len != VRPC_WIRE_HELLO_LEN)
        return -EPROTO;
    h->max_msg_size = get32(buf);
    h->max_concurrent = get32(buf + 4);
    h->features = get32(buf + 8);
    h->stream_window = get32(buf + 12);
    if (h->max_concurrent == 0 || h->stream_window == 0 || h->stream_window > VRPC_WIRE_WINDOW_SUM_MAX)
        return -EPROTO;
    return 0;
}

void vrpc_wire_window_encode(uint8_t out[VRPC_WIRE_WINDOW_LEN], uint32_t n) { put32(out, n); }

int vrpc_wire_window_decode(const uint8_t *buf, size_t len, uint32_t *n)
{
    if (len != VRPC_WIRE_WINDOW_LEN)
        return -EPROTO;
    uint32_t v = get32(buf);
    if (v == 0 || v > VRPC_WIRE_WINDOW_SUM_MAX)
        return -EPROTO;
    *n = v;
    return 0;
}
