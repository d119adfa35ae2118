/* Unit tests of the RPC core pieces that need no transport: wire header and
 * metadata codecs, the pending-call table (including the decide race), the
 * timing wheel, the unpack arena and the protobuf-c guards. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rpc/arena.h"
#include "rpc/pbutil.h"
#include "rpc/pending.h"
#include "rpc/status.h"
#include "rpc/timer.h"
#include "rpc/wire.h"
#include <verbrpc/stream.h>
#include "rpc_test.pb-c.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SCALE 10 /* sanitizer builds run 1/10 of the rounds */
#else
#define SCALE 1
#endif

static void test_hdr_roundtrip_and_byte_order(void **state)
{
    (void)state;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_REQUEST,
                              .flags = VRPC_FF_DEADLINE,
                              .method_id = 0x11223344,
                              .request_id = 0x0102030405060708ull,
                              .budget_us = 0x71727374,
                              .payload_len = 3,
                              .md_len = 2};
    uint8_t f[VRPC_WIRE_HDR_LEN + 5] = {0};
    assert_int_equal(VRPC_WIRE_HDR_LEN, 28);
    vrpc_wire_hdr_encode(f, &h);
    static const uint8_t expect[VRPC_WIRE_HDR_LEN] = {
        'V', 'R', 3, 3, 1, 0, 2, 0, 8, 7, 6, 5, 4, 3, 2, 1, 0x44, 0x33, 0x22, 0x11, 0x74, 0x73, 0x72, 0x71, 3, 0, 0, 0};
    assert_memory_equal(f, expect, sizeof(expect));
    struct vrpc_wire_hdr d;
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), 0);
    assert_int_equal(d.type, VRPC_FT_REQUEST);
    assert_int_equal(d.flags, VRPC_FF_DEADLINE);
    assert_int_equal(d.method_id, 0x11223344);
    assert_true(d.request_id == h.request_id && d.budget_us == h.budget_us);
    assert_int_equal(d.payload_len, 3);
    assert_int_equal(d.md_len, 2);

    /* budgets: microseconds below 2^31, then whole milliseconds rounded up,
     * capped at 2^31 - 1 ms */
    static const uint64_t in[] = {0, 1, 0x7fffffffull, 0x80000000ull, 0x80000000ull + 1000, 5000000000ull, UINT64_MAX};
    static const uint64_t out[] = {
        0, 1, 0x7fffffffull, 2147484000ull, 2147485000ull, 5000000000ull, 0x7fffffffull * 1000};
    for (unsigned i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
        h.budget_us = in[i];
        vrpc_wire_hdr_encode(f, &h);
        assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), 0);
        assert_true(d.budget_us == out[i]);
        assert_true(d.budget_us >= in[i] || in[i] > 0x7fffffffull * 1000);
    }
}

static void test_hdr_rejects_bad_frames(void **state)
{
    (void)state;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_RESPONSE, .request_id = 5, .status = 3};
    uint8_t f[VRPC_WIRE_HDR_LEN + 4];
    struct vrpc_wire_hdr d;

    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), 0);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN - 1, &d), -EPROTO); /* short */
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN + 4, &d), -EPROTO); /* len mismatch */
    f[0] ^= 1;
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTO); /* magic */
    f[0] ^= 1;
    f[2] = 1; /* version 1 had a 40-byte header */
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTONOSUPPORT);
    f[2] = 2; /* version 2: no streams */
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTONOSUPPORT);
    f[2] = VRPC_WIRE_VERSION;
    f[3] = 99;
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTO); /* type */
    f[3] = 0;
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTO);
    h.status = 17;
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTO); /* status */
    h.status = 0;
    h.request_id = 0;
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTO); /* id 0 */
    h = (struct vrpc_wire_hdr){.version = VRPC_WIRE_VERSION, .type = VRPC_FT_REQUEST, .request_id = 1, .flags = 0x80};
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTO); /* flags */
    h = (struct vrpc_wire_hdr){.version = VRPC_WIRE_VERSION, .type = VRPC_FT_CANCEL, .request_id = 1, .payload_len = 4};
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), -EPROTO); /* cancel body */
    h = (struct vrpc_wire_hdr){.version = VRPC_WIRE_VERSION,
                               .type = VRPC_FT_REQUEST,
                               .request_id = 1,
                               .payload_len = 0xffffffffu,
                               .md_len = 0xffff};
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), -EPROTO); /* 4 GiB claim */
}

/* VRPC_STATUS_UNPROCESSED: set only by vrpc_status_set_unprocessed, cleared
 * by every other setter (a slot's status is reused call after call); on the
 * wire VRPC_FF_REFUSED is a RESPONSE flag with a status other than OK, and
 * the HELLO feature bit that gates it survives the round trip. */
static void test_unprocessed_status(void **state)
{
    (void)state;
    struct vrpc_status st;
    memset(&st, 0xff, sizeof(st));
    vrpc_status_set_unprocessed(&st, VRPC_UNAVAILABLE, "connect failed: %s", "refused");
    assert_int_equal(st.code, VRPC_UNAVAILABLE);
    assert_int_equal(st.flags, VRPC_STATUS_UNPROCESSED);
    assert_string_equal(st.message, "connect failed: refused");
    vrpc_status_set(&st, VRPC_UNAVAILABLE, "connect failed: %s", "refused"); /* same words, no flag */
    assert_int_equal(st.flags, 0);
    vrpc_status_set_unprocessed(&st, VRPC_UNAVAILABLE, NULL);
    assert_int_equal(st.flags, VRPC_STATUS_UNPROCESSED);
    assert_string_equal(st.message, "");
    vrpc_status_set_bytes(&st, VRPC_INTERNAL, "abc", 3);
    assert_int_equal(st.flags, 0);
    vrpc_status_set_unprocessed(NULL, VRPC_UNAVAILABLE, "x"); /* no-op */

    uint8_t f[VRPC_WIRE_HDR_LEN + 8];
    struct vrpc_wire_hdr d, h = {.version = VRPC_WIRE_VERSION,
                                 .type = VRPC_FT_RESPONSE,
                                 .flags = VRPC_FF_REFUSED,
                                 .status = VRPC_UNAVAILABLE,
                                 .request_id = 9,
                                 .payload_len = 8};
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), 0);
    assert_int_equal(d.flags, VRPC_FF_REFUSED);
    assert_int_equal(d.status, VRPC_UNAVAILABLE);
    h.status = VRPC_OK; /* an answer was processed by definition */
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), -EPROTO);
    h = (struct vrpc_wire_hdr){.version = VRPC_WIRE_VERSION,
                               .type = VRPC_FT_REQUEST,
                               .flags = VRPC_FF_REFUSED,
                               .request_id = 9,
                               .payload_len = 8};
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), -EPROTO); /* RESPONSE only */
    h.type = VRPC_FT_MESSAGE;
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), -EPROTO);

    uint8_t p[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello hs = {.max_msg_size = 4096, .max_concurrent = 8, .features = VRPC_FEAT_REFUSED}, hd;
    vrpc_wire_hello_encode(p, &hs);
    assert_int_equal(vrpc_wire_hello_decode(p, sizeof(p), &hd), 0);
    assert_int_equal(hd.features, VRPC_FEAT_REFUSED);
}

static void test_metadata_codec(void **state)
{
    (void)state;
    struct vrpc_metadata md[2] = {{"x-trace", "abc", 3}, {"k", "\0\1", 2}};
    long sz = vrpc_wire_md_size(md, 2);
    assert_int_equal(sz, (4 + 7 + 1 + 3) + (4 + 1 + 1 + 2));
    uint8_t buf[64];
    vrpc_wire_md_encode(buf, md, 2);
    struct vrpc_metadata out[4];
    assert_int_equal(vrpc_wire_md_decode(buf, (size_t)sz, out, 4), 2);
    assert_string_equal(out[0].key, "x-trace");
    assert_int_equal(out[0].value_len, 3);
    assert_memory_equal(out[0].value, "abc", 3);
    assert_string_equal(out[1].key, "k");
    assert_memory_equal(out[1].value, "\0\1", 2);
    assert_int_equal(vrpc_wire_md_decode(buf, (size_t)sz - 1, out, 4), -EPROTO); /* truncated */
    assert_int_equal(vrpc_wire_md_decode(buf, (size_t)sz, out, 1), -EPROTO);     /* too many */
    buf[4] = 'X';                                                                /* uppercase key */
    assert_int_equal(vrpc_wire_md_decode(buf, (size_t)sz, out, 4), -EPROTO);
    struct vrpc_metadata bad[1] = {{"Bad Key", "", 0}};
    assert_int_equal(vrpc_wire_md_size(bad, 1), -EINVAL);
    assert_int_equal(vrpc_wire_md_size(md, VRPC_MD_MAX + 1), -EINVAL);
    /* the whole block fits md_len's 16 bits */
    static char big[VRPC_WIRE_MD_VAL_MAX];
    struct vrpc_metadata two[2] = {{"a", big, 32000}, {"b", big, 65535 - 4 - 2 - 32000 - 6}};
    assert_int_equal(vrpc_wire_md_size(two, 2), 65535);
    two[1].value_len++;
    assert_int_equal(vrpc_wire_md_size(two, 2), -EINVAL);
    assert_int_equal(vrpc_wire_md_decode(buf, 0, out, 4), 0);
}

static void test_hello_and_ids(void **state)
{
    (void)state;
    uint8_t b[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello h = {.max_msg_size = 1 << 20, .max_concurrent = 64}, d;
    vrpc_wire_hello_encode(b, &h);
    assert_int_equal(vrpc_wire_hello_decode(b, sizeof(b), &d), 0);
    assert_int_equal(d.max_msg_size, 1 << 20);
    assert_int_equal(d.max_concurrent, 64);
    assert_int_equal(d.stream_window, VRPC_STREAM_WINDOW_DEFAULT); /* 0 encodes as the default */
    h.stream_window = 7;
    h.features = VRPC_FEAT_LARGE | VRPC_FEAT_STREAM;
    vrpc_wire_hello_encode(b, &h);
    assert_int_equal(b[12], 7); /* little-endian at offset 12 */
    assert_int_equal(vrpc_wire_hello_decode(b, sizeof(b), &d), 0);
    assert_int_equal(d.stream_window, 7);
    assert_int_equal(d.features, VRPC_FEAT_LARGE | VRPC_FEAT_STREAM);
    memset(b + 12, 0, 4); /* a window of 0 on the wire */
    assert_int_equal(vrpc_wire_hello_decode(b, sizeof(b), &d), -EPROTO);
    memset(b + 12, 0xff, 4); /* beyond 2^31 - 1 */
    assert_int_equal(vrpc_wire_hello_decode(b, sizeof(b), &d), -EPROTO);
    h.max_concurrent = 0;
    vrpc_wire_hello_encode(b, &h);
    assert_int_equal(vrpc_wire_hello_decode(b, sizeof(b), &d), -EPROTO);
    uint64_t id = vrpc_wire_make_id(7, 9);
    assert_int_equal(vrpc_wire_id_slot(id), 7);
    assert_int_equal(vrpc_wire_id_gen(id), 9);
    /* FNV-1a 32 reference values */
    assert_int_equal(vrpc_method_id(""), 2166136261u);
    assert_int_equal(vrpc_method_id("a"), 0xe40c292cu);
    assert_string_equal(vrpc_code_name(VRPC_UNAVAILABLE), "UNAVAILABLE");
    assert_string_equal(vrpc_code_name((enum vrpc_code)99), "UNKNOWN_CODE");
}

/* Encode h with md_len/payload_len as given and a frame of exactly the
 * length the header claims (RNDV: a descriptor), and decode it. */
static int stream_decode(struct vrpc_wire_hdr h, struct vrpc_wire_hdr *d)
{
    static uint8_t f[VRPC_WIRE_HDR_LEN + 64 + VRPC_WIRE_DESC_LEN];
    memset(f, 0, sizeof(f));
    h.version = VRPC_WIRE_VERSION;
    vrpc_wire_hdr_encode(f, &h);
    size_t len = VRPC_WIRE_HDR_LEN + h.md_len + ((h.flags & VRPC_FF_RNDV) ? VRPC_WIRE_DESC_LEN : h.payload_len);
    assert_true(len <= sizeof(f));
    return vrpc_wire_hdr_decode(f, len, d);
}

/* Version 3's stream frames: MESSAGE (RNDV, END), HALF_CLOSE, WINDOW,
 * HEADERS, REQUEST|STREAM, metadata on RESPONSE; each with what it may
 * not carry. */
static void test_stream_frames(void **state)
{
    (void)state;
    struct vrpc_wire_hdr d;
    typedef struct vrpc_wire_hdr H;
    /* MESSAGE */
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .request_id = 3, .payload_len = 9}, &d), 0);
    assert_int_equal(d.type, VRPC_FT_MESSAGE);
    assert_int_equal(d.payload_len, 9);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .request_id = 3}, &d), 0); /* empty message */
    assert_int_equal(
        stream_decode((H){.type = VRPC_FT_MESSAGE, .flags = VRPC_FF_END, .request_id = 3, .payload_len = 1}, &d), 0);
    assert_int_equal(d.flags, VRPC_FF_END);
    assert_int_equal(
        stream_decode(
            (H){.type = VRPC_FT_MESSAGE, .flags = VRPC_FF_RNDV | VRPC_FF_END, .request_id = 3, .payload_len = 1u << 24},
            &d),
        0);
    assert_int_equal(d.payload_len, 1u << 24);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .payload_len = 1}, &d), -EPROTO); /* id 0 */
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .request_id = 3, .md_len = 4}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .request_id = 3, .method_id = 1}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .request_id = 3, .status = 1}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .request_id = 3, .budget_us = 5}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .flags = VRPC_FF_STREAM, .request_id = 3}, &d),
                     -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .flags = VRPC_FF_DEADLINE, .request_id = 3}, &d),
                     -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_MESSAGE, .flags = VRPC_FF_RNDV, .request_id = 3}, &d),
                     -EPROTO); /* empty rendezvous */
    /* HALF_CLOSE */
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HALF_CLOSE, .request_id = 3}, &d), 0);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HALF_CLOSE, .request_id = 3, .payload_len = 1}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HALF_CLOSE, .flags = VRPC_FF_END, .request_id = 3}, &d),
                     -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HALF_CLOSE}, &d), -EPROTO);
    /* WINDOW: a 4-byte increment */
    assert_int_equal(stream_decode((H){.type = VRPC_FT_WINDOW, .request_id = 3, .payload_len = 4}, &d), 0);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_WINDOW, .request_id = 3, .payload_len = 8}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_WINDOW, .request_id = 3}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_WINDOW, .payload_len = 4}, &d), -EPROTO);
    uint8_t w[VRPC_WIRE_WINDOW_LEN];
    uint32_t n = 0;
    vrpc_wire_window_encode(w, 0x01020304u);
    assert_int_equal(w[0], 4);
    assert_int_equal(vrpc_wire_window_decode(w, sizeof(w), &n), 0);
    assert_int_equal(n, 0x01020304u);
    vrpc_wire_window_encode(w, 0);
    assert_int_equal(vrpc_wire_window_decode(w, sizeof(w), &n), -EPROTO);
    vrpc_wire_window_encode(w, 0x80000000u);
    assert_int_equal(vrpc_wire_window_decode(w, sizeof(w), &n), -EPROTO);
    vrpc_wire_window_encode(w, VRPC_WIRE_WINDOW_SUM_MAX);
    assert_int_equal(vrpc_wire_window_decode(w, sizeof(w), &n), 0);
    assert_int_equal(vrpc_wire_window_decode(w, 3, &n), -EPROTO);
    /* HEADERS: a metadata block, no payload */
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HEADERS, .request_id = 3, .md_len = 12}, &d), 0);
    assert_int_equal(d.md_len, 12);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HEADERS, .request_id = 3, .payload_len = 2}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HEADERS, .request_id = 3, .status = 2}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HEADERS, .md_len = 12}, &d), -EPROTO);
    /* REQUEST|STREAM: no message, no rendezvous; END only on MESSAGE */
    assert_int_equal(stream_decode((H){.type = VRPC_FT_REQUEST,
                                       .flags = VRPC_FF_STREAM | VRPC_FF_DEADLINE,
                                       .request_id = 3,
                                       .method_id = 5,
                                       .budget_us = 1000,
                                       .md_len = 10},
                                   &d),
                     0);
    assert_int_equal(d.flags, VRPC_FF_STREAM | VRPC_FF_DEADLINE);
    assert_int_equal(
        stream_decode((H){.type = VRPC_FT_REQUEST, .flags = VRPC_FF_STREAM, .request_id = 3, .payload_len = 1}, &d),
        -EPROTO);
    assert_int_equal(
        stream_decode(
            (H){.type = VRPC_FT_REQUEST, .flags = VRPC_FF_STREAM | VRPC_FF_RNDV, .request_id = 3, .payload_len = 100},
            &d),
        -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_REQUEST, .flags = VRPC_FF_END, .request_id = 3}, &d), -EPROTO);
    /* RESPONSE: trailing metadata allowed; END/STREAM not */
    assert_int_equal(
        stream_decode((H){.type = VRPC_FT_RESPONSE, .request_id = 3, .md_len = 9, .payload_len = 2, .status = 5}, &d),
        0);
    assert_int_equal(d.md_len, 9);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_RESPONSE, .flags = VRPC_FF_END, .request_id = 3}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_RESPONSE, .flags = VRPC_FF_STREAM, .request_id = 3}, &d),
                     -EPROTO);
    /* END and STREAM on other types; type 12 unknown */
    assert_int_equal(stream_decode((H){.type = VRPC_FT_CANCEL, .flags = VRPC_FF_END, .request_id = 3}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_DONE, .flags = VRPC_FF_STREAM, .request_id = 3}, &d), -EPROTO);
    assert_int_equal(stream_decode((H){.type = VRPC_FT_HEADERS + 1, .request_id = 3}, &d), -EPROTO);
}

/* Rendezvous frames: RNDV on REQUEST/RESPONSE with a 16-byte descriptor in
 * place of the payload, the DONE frame, the descriptor and feature codecs. */
static void test_rndv_and_done_frames(void **state)
{
    (void)state;
    uint8_t f[VRPC_WIRE_HDR_LEN + 8 + VRPC_WIRE_DESC_LEN] = {0};
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_REQUEST,
                              .flags = VRPC_FF_RNDV | VRPC_FF_DEADLINE,
                              .method_id = 1,
                              .request_id = 9,
                              .payload_len = 1u << 30,
                              .md_len = 8},
                         d;
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f), &d), 0);
    assert_int_equal(d.payload_len, 1u << 30);
    assert_int_equal(vrpc_wire_hdr_decode(f, sizeof(f) - 1, &d), -EPROTO); /* length */
    h.type = VRPC_FT_RESPONSE, h.flags = VRPC_FF_RNDV, h.method_id = 0, h.md_len = 0;
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN + VRPC_WIRE_DESC_LEN, &d), 0);
    h.status = VRPC_NOT_FOUND; /* RNDV only with OK */
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN + VRPC_WIRE_DESC_LEN, &d), -EPROTO);
    h.status = 0, h.payload_len = 0; /* empty rendezvous */
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN + VRPC_WIRE_DESC_LEN, &d), -EPROTO);
    h = (struct vrpc_wire_hdr){
        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_CANCEL, .flags = VRPC_FF_RNDV, .request_id = 1, .payload_len = 5};
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN + VRPC_WIRE_DESC_LEN, &d), -EPROTO);

    h = (struct vrpc_wire_hdr){
        .version = VRPC_WIRE_VERSION, .type = VRPC_FT_DONE, .request_id = 77, .status = VRPC_CANCELLED};
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), 0);
    assert_int_equal(d.type, VRPC_FT_DONE);
    assert_int_equal(d.status, VRPC_CANCELLED);
    h.request_id = 0;
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTO); /* id 0 */
    h.request_id = 77, h.payload_len = 4;
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN + 4, &d), -EPROTO); /* body */
    h.payload_len = 0, h.status = 17;
    vrpc_wire_hdr_encode(f, &h);
    assert_int_equal(vrpc_wire_hdr_decode(f, VRPC_WIRE_HDR_LEN, &d), -EPROTO); /* status */

    struct vrpc_wire_desc dd = {.addr = 0x1122334455667788ull, .rkey = 0xabcd}, de;
    uint8_t b[VRPC_WIRE_DESC_LEN];
    vrpc_wire_desc_encode(b, &dd);
    assert_int_equal(b[0], 0x88);
    assert_int_equal(vrpc_wire_desc_decode(b, 100, &de), 0);
    assert_true(de.addr == dd.addr && de.rkey == dd.rkey);
    dd.rkey = 0;
    vrpc_wire_desc_encode(b, &dd);
    assert_int_equal(vrpc_wire_desc_decode(b, 100, &de), -EPROTO); /* rkey 0 */
    dd = (struct vrpc_wire_desc){.addr = UINT64_MAX - 10, .rkey = 1};
    vrpc_wire_desc_encode(b, &dd);
    assert_int_equal(vrpc_wire_desc_decode(b, 10, &de), 0);
    assert_int_equal(vrpc_wire_desc_decode(b, 11, &de), -EPROTO); /* wraps */

    struct vrpc_wire_hello hh = {.max_msg_size = 16u << 20, .max_concurrent = 4, .features = VRPC_FEAT_LARGE}, hd;
    uint8_t hb[VRPC_WIRE_HELLO_LEN];
    vrpc_wire_hello_encode(hb, &hh);
    assert_int_equal(vrpc_wire_hello_decode(hb, sizeof(hb), &hd), 0);
    assert_int_equal(hd.features, VRPC_FEAT_LARGE);
    assert_int_equal(hd.max_msg_size, 16u << 20);
}

static void test_arena_steady_state(void **state)
{
    (void)state;
    struct vrpc_arena a;
    vrpc_arena_init(&a, 256, 1 << 20);
    for (int i = 0; i < 100; i++) {
        void *p = vrpc_arena_alloc(&a, 100);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        memset(p, 0xab, 100);
    }
    assert_non_null(a.extra); /* needed overflow the first time */
    vrpc_arena_reset(&a);
    assert_null(a.extra);
    assert_true(a.cap >= 100 * 112);
    for (int i = 0; i < 100; i++)
        assert_non_null(vrpc_arena_alloc(&a, 100));
    assert_null(a.extra);                       /* second round fits the regrown block */
    assert_null(vrpc_arena_alloc(&a, 2 << 20)); /* over the limit */
    vrpc_arena_fini(&a);
}

/* Encode a chain of `depth` nested Nodes by hand (field 1, wire type 2). */
static size_t encode_chain(uint8_t *buf, size_t cap, unsigned depth)
{
    size_t len = 0;
    /* innermost: value = 1 */
    uint8_t tmp[4096];
    tmp[0] = 0x10, tmp[1] = 1;
    len = 2;
    for (unsigned d = 1; d < depth; d++) {
        assert_true(len + 3 <= sizeof(tmp) && len < 16384);
        memmove(tmp + 3, tmp, len);
        tmp[0] = 0x0a;
        tmp[1] = (uint8_t)(0x80 | (len & 0x7f));
        tmp[2] = (uint8_t)(len >> 7);
        len += 3;
    }
    assert_true(len <= cap);
    memcpy(buf, tmp, len);
    return len;
}

/* vrpc_pb_unpack_ref: big singular bytes values point into the input,
 * small ones are copied, the last occurrence of a field wins, and what the
 * plain unpack refuses it refuses too. */
static void test_unpack_ref(void **state)
{
    (void)state;
    struct vrpc_arena a;
    vrpc_arena_init(&a, 4096, 0);
    enum { BIG = 3 * VRPC_PB_REF_MIN };
    uint8_t *big = malloc(BIG), *buf = malloc(2 * BIG);
    assert_non_null(big);
    assert_non_null(buf);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (uint8_t)(i * 7 + 1);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.payload.data = big;
    r.payload.len = BIG;
    r.seq = 42;
    r.mode = 3;
    size_t n = protobuf_c_message_pack(&r.base, buf);
    ProtobufCMessage *m;
    assert_int_equal(vrpc_pb_unpack_ref(&vrpctest__echo_request__descriptor, buf, n, 0, &a, &m), 0);
    Vrpctest__EchoRequest *q = (Vrpctest__EchoRequest *)m;
    assert_int_equal(q->seq, 42);
    assert_int_equal(q->mode, 3);
    assert_int_equal(q->payload.len, BIG);
    assert_true(q->payload.data > buf && q->payload.data + BIG <= buf + n); /* referenced */
    assert_memory_equal(q->payload.data, big, BIG);
    assert_true(a.used < 1024); /* the value was not copied into the arena */

    /* small: copied */
    vrpc_arena_reset(&a);
    r.payload.len = VRPC_PB_REF_MIN - 1;
    n = protobuf_c_message_pack(&r.base, buf);
    assert_int_equal(vrpc_pb_unpack_ref(&vrpctest__echo_request__descriptor, buf, n, 0, &a, &m), 0);
    q = (Vrpctest__EchoRequest *)m;
    assert_int_equal(q->payload.len, VRPC_PB_REF_MIN - 1);
    assert_true(q->payload.data + q->payload.len <= buf || q->payload.data >= buf + n);
    assert_memory_equal(q->payload.data, big, VRPC_PB_REF_MIN - 1);

    /* field 1 twice, big then small: the small one wins (copied) */
    vrpc_arena_reset(&a);
    r.payload.len = BIG;
    n = protobuf_c_message_pack(&r.base, buf);
    static const uint8_t tail[] = {0x0a, 0x03, 'a', 'b', 'c'};
    memcpy(buf + n, tail, sizeof(tail));
    assert_int_equal(vrpc_pb_unpack_ref(&vrpctest__echo_request__descriptor, buf, n + sizeof(tail), 0, &a, &m), 0);
    q = (Vrpctest__EchoRequest *)m;
    assert_int_equal(q->payload.len, 3);
    assert_memory_equal(q->payload.data, "abc", 3);
    assert_int_equal(q->seq, 42);

    /* small then big: the big one wins (referenced) */
    vrpc_arena_reset(&a);
    memcpy(buf, tail, sizeof(tail));
    n = protobuf_c_message_pack(&r.base, buf + sizeof(tail)) + sizeof(tail);
    assert_int_equal(vrpc_pb_unpack_ref(&vrpctest__echo_request__descriptor, buf, n, 0, &a, &m), 0);
    q = (Vrpctest__EchoRequest *)m;
    assert_int_equal(q->payload.len, BIG);
    assert_true(q->payload.data > buf && q->payload.data + BIG <= buf + n);
    assert_memory_equal(q->payload.data, big, BIG);

    /* truncated inside the big value, and a bad wire type after it: refused */
    vrpc_arena_reset(&a);
    n = protobuf_c_message_pack(&r.base, buf);
    assert_int_equal(vrpc_pb_unpack_ref(&vrpctest__echo_request__descriptor, buf, n - 10, 0, &a, &m), -EBADMSG);
    buf[n] = 0x0f; /* field 1, wire type 7 */
    assert_int_equal(vrpc_pb_unpack_ref(&vrpctest__echo_request__descriptor, buf, n + 1, 0, &a, &m), -EBADMSG);
    vrpc_arena_fini(&a);
    free(big);
    free(buf);
}

static void test_depth_guard(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct vrpc_arena a;
    ProtobufCMessage *m;

    vrpc_arena_init(&a, 1024, 1 << 20);
    size_t len = encode_chain(buf, sizeof(buf), 10);
    assert_int_equal(vrpc_pb_check_depth(&vrpctest__node__descriptor, buf, len, 64), 0);
    assert_int_equal(vrpc_pb_unpack(&vrpctest__node__descriptor, buf, len, 64, &a, &m), 0);
    Vrpctest__Node *n = (Vrpctest__Node *)m;
    for (int i = 0; i < 9; i++)
        n = n->child;
    assert_int_equal(n->value, 1);
    vrpc_arena_reset(&a);

    len = encode_chain(buf, sizeof(buf), 1000);
    assert_int_equal(vrpc_pb_check_depth(&vrpctest__node__descriptor, buf, len, 64), -ELOOP);
    assert_int_equal(vrpc_pb_unpack(&vrpctest__node__descriptor, buf, len, 64, &a, &m), -ELOOP);
    len = encode_chain(buf, sizeof(buf), 64);
    assert_int_equal(vrpc_pb_check_depth(&vrpctest__node__descriptor, buf, len, 64), 0);
    assert_int_equal(vrpc_pb_check_depth(&vrpctest__node__descriptor, buf, len, 63), -ELOOP);
    /* truncated and group wire types are rejected */
    assert_int_equal(vrpc_pb_check_depth(&vrpctest__node__descriptor, buf, len - 1, 64), -EBADMSG);
    static const uint8_t group[] = {0x0b, 0x0c};
    assert_int_equal(vrpc_pb_check_depth(&vrpctest__node__descriptor, group, 2, 64), -EBADMSG);
    static const uint8_t badvarint[] = {0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1};
    assert_int_equal(vrpc_pb_unpack(&vrpctest__node__descriptor, badvarint, sizeof(badvarint), 64, &a, &m), -EBADMSG);

    /* Tags protobuf-c takes as unknown fields (field 2^29, beyond what a
     * .proto may declare; field 0 written in two bytes) are accepted for a
     * type that can nest (Node, behind the depth guard) exactly as for one
     * that cannot (EchoRequest); a 6-byte tag is refused by all. */
    static const uint8_t big_field[] = {0x10, 0x05, 0x80, 0x80, 0x80, 0x80, 0x10, 0x01};
    static const uint8_t long_zero[] = {0x10, 0x05, 0x80, 0x00, 0x01};
    static const uint8_t six_byte[] = {0x10, 0x05, 0x90, 0x80, 0x80, 0x80, 0x80, 0x00, 0x01};
    const ProtobufCMessageDescriptor *both[] = {&vrpctest__node__descriptor, &vrpctest__echo_request__descriptor};
    for (unsigned t = 0; t < 2; t++) {
        const struct {
            const uint8_t *b;
            size_t n;
            bool ok;
        } in[] = {{big_field, sizeof(big_field), true},
                  {long_zero, sizeof(long_zero), true},
                  {six_byte, sizeof(six_byte), false}};
        for (unsigned k = 0; k < 3; k++) {
            ProtobufCMessage *ref = protobuf_c_message_unpack(both[t], NULL, in[k].n, in[k].b);
            assert_int_equal(ref != NULL, in[k].ok);
            if (ref)
                protobuf_c_message_free_unpacked(ref, NULL);
            vrpc_arena_reset(&a);
            assert_int_equal(vrpc_pb_unpack(both[t], in[k].b, in[k].n, 64, &a, &m), in[k].ok ? 0 : -EBADMSG);
            assert_int_equal(vrpc_pb_check_depth(both[t], in[k].b, in[k].n, 64), in[k].ok ? 0 : -EBADMSG);
            if (in[k].ok)
                assert_int_equal(m->n_unknown_fields, 1);
        }
    }
    vrpc_arena_fini(&a);
}

static void test_pack_size_check(void **state)
{
    (void)state;
    uint8_t payload[100], out[64];
    memset(payload, 7, sizeof(payload));
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.payload.data = payload;
    r.payload.len = sizeof(payload);
    size_t len = 0;
    assert_int_equal(vrpc_pb_pack(&r.base, out, sizeof(out), &len), -EMSGSIZE);
    assert_int_equal(len, 0);
    r.payload.len = 10;
    r.seq = 42;
    assert_int_equal(vrpc_pb_pack(&r.base, out, sizeof(out), &len), 0);
    struct vrpc_arena a;
    ProtobufCMessage *m;
    vrpc_arena_init(&a, 0, 0);
    assert_int_equal(vrpc_pb_unpack(&vrpctest__echo_request__descriptor, out, len, 0, &a, &m), 0);
    assert_int_equal(((Vrpctest__EchoRequest *)m)->seq, 42);
    vrpc_arena_fini(&a);
}

static void test_pending_ids_and_limit(void **state)
{
    (void)state;
    struct vrpc_pending *p;
    struct vrpc_pending_slot *s[4], *x;
    assert_int_equal(vrpc_pending_create(8, &p), 0);
    vrpc_pending_set_limit(p, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(vrpc_pending_alloc(p, VRPC_NO_DEADLINE, NULL, &s[i]), 0);
        assert_true(s[i]->index < 3);
        /* reserved, not yet open: invisible to responses, cancels and scans */
        uint64_t rid = vrpc_pending_id(s[i]);
        assert_null(vrpc_pending_lookup(p, rid));
        assert_false(vrpc_pending_decide(s[i], vrpc_wire_id_gen(rid)));
        vrpc_pending_open(s[i]);
    }
    /* credits exhausted: times out */
    assert_int_equal(vrpc_pending_alloc(p, vrpc_now_ns() + 2000000, NULL, &x), -ETIMEDOUT);
    uint64_t id0 = vrpc_pending_id(s[0]);
    uint32_t g0 = vrpc_wire_id_gen(id0);
    assert_ptr_equal(vrpc_pending_lookup(p, id0), s[0]);
    assert_null(vrpc_pending_lookup(p, id0 + (1ull << 32)));         /* wrong generation */
    assert_null(vrpc_pending_lookup(p, vrpc_wire_make_id(100, g0))); /* out of range */
    /* cancel wins, response loses; slot stays until the wire is done */
    assert_true(vrpc_pending_decide(s[0], g0));
    assert_false(vrpc_pending_decide(s[0], g0));
    vrpc_pending_owner_done(s[0], g0);
    assert_int_equal(p->in_use, 3);
    assert_ptr_equal(vrpc_pending_lookup(p, id0), s[0]);
    assert_true(vrpc_pending_wire_done(s[0], g0));
    assert_false(vrpc_pending_wire_done(s[0], g0));
    assert_int_equal(p->in_use, 2);
    assert_null(vrpc_pending_lookup(p, id0)); /* freed: the old id is dead */
    assert_int_equal(vrpc_pending_alloc(p, VRPC_NO_DEADLINE, NULL, &x), 0);
    vrpc_pending_open(x);
    assert_ptr_equal(x, s[0]);
    assert_true(vrpc_pending_id(x) != id0);
    vrpc_pending_close(p);
    assert_int_equal(vrpc_pending_alloc(p, VRPC_NO_DEADLINE, NULL, &x), -ESHUTDOWN);
    vrpc_pending_destroy(p);
}

/* Four threads race to decide each round's call: exactly one may win. */
struct race {
    struct vrpc_pending_slot *slot;
    uint32_t gen;
    unsigned round;
    unsigned arrived;
    unsigned wins[4];
    pthread_barrier_t bar;
    unsigned rounds;
};

struct racer {
    struct race *r;
    int who;
};

static void *racer_main(void *arg)
{
    struct racer *me = arg;
    struct race *r = me->r;
    for (unsigned i = 0; i < r->rounds; i++) {
        pthread_barrier_wait(&r->bar);
        if (vrpc_pending_decide(r->slot, r->gen)) {
            r->wins[me->who]++;
            vrpc_pending_publish(r->slot, r->gen);
        }
        if (me->who == 0)
            vrpc_pending_wire_done(r->slot, r->gen);
        pthread_barrier_wait(&r->bar);
    }
    return NULL;
}

static void test_pending_decide_race(void **state)
{
    (void)state;
    struct vrpc_pending *p;
    struct race r = {.rounds = 10000 / SCALE};
    struct racer rc[4];
    pthread_t t[4];

    assert_int_equal(vrpc_pending_create(1, &p), 0);
    pthread_barrier_init(&r.bar, NULL, 5);
    for (int i = 0; i < 4; i++) {
        rc[i] = (struct racer){&r, i};
        pthread_create(&t[i], NULL, racer_main, &rc[i]);
    }
    unsigned total_before = 0;
    for (unsigned i = 0; i < r.rounds; i++) {
        assert_int_equal(vrpc_pending_alloc(p, VRPC_NO_DEADLINE, NULL, &r.slot), 0);
        vrpc_pending_open(r.slot);
        r.gen = vrpc_pending_gen(r.slot);
        pthread_barrier_wait(&r.bar);
        pthread_barrier_wait(&r.bar);
        unsigned total = r.wins[0] + r.wins[1] + r.wins[2] + r.wins[3];
        assert_int_equal(total, total_before + 1);
        total_before = total;
        vrpc_pending_wait(r.slot, r.gen);
        vrpc_pending_owner_done(r.slot, r.gen); /* frees: wire already done */
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(p->in_use, 0);
    pthread_barrier_destroy(&r.bar);
    vrpc_pending_destroy(p);
}

struct fired {
    uint64_t arg;
    int64_t at;
    unsigned count;
};

static void on_fire(void *ctx, uint64_t arg)
{
    struct fired *f = ctx;
    f->arg = arg;
    __atomic_store_n(&f->at, vrpc_now_ns(), __ATOMIC_RELEASE);
    __atomic_add_fetch(&f->count, 1, __ATOMIC_RELEASE);
}

static void test_timer_wheel(void **state)
{
    (void)state;
    struct vrpc_timer_wheel *w;
    struct vrpc_timer t1 = {0}, t2 = {0};
    struct fired f1 = {0}, f2 = {0};
    assert_int_equal(vrpc_timer_wheel_create(1000, &w), 0);
    int64_t now = vrpc_now_ns();
    vrpc_timer_arm(w, &t1, now + 20000000, on_fire, &f1, 77);
    vrpc_timer_arm(w, &t2, now + 5000000, on_fire, &f2, 78);
    assert_int_equal(vrpc_timer_wheel_count(w), 2);
    assert_true(vrpc_timer_cancel(w, &t2));
    assert_false(vrpc_timer_cancel(w, &t2));
    while (!__atomic_load_n(&f1.count, __ATOMIC_ACQUIRE))
        usleep(1000);
    assert_true(__atomic_load_n(&f1.at, __ATOMIC_ACQUIRE) >= now + 20000000); /* never early */
    assert_int_equal(f1.arg, 77);
    usleep(10000);
    assert_int_equal(__atomic_load_n(&f2.count, __ATOMIC_ACQUIRE), 0);
    assert_false(vrpc_timer_cancel(w, &t1)); /* already fired */

    /* many timers, more than one wheel revolution apart and in the past */
    enum { N = 300 };
    static struct vrpc_timer ts[N];
    static struct fired fs;
    memset(ts, 0, sizeof(ts));
    memset(&fs, 0, sizeof(fs));
    now = vrpc_now_ns();
    for (int i = 0; i < N; i++)
        vrpc_timer_arm(w, &ts[i], now + (int64_t)(i % 3 == 0 ? -1000000 : (i % 60) * 1000000), on_fire, &fs,
                       (uint64_t)i);
    while (__atomic_load_n(&fs.count, __ATOMIC_ACQUIRE) < N)
        usleep(2000);
    assert_int_equal(vrpc_timer_wheel_count(w), 0);
    vrpc_timer_wheel_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hdr_roundtrip_and_byte_order),
        cmocka_unit_test(test_hdr_rejects_bad_frames),
        cmocka_unit_test(test_unprocessed_status),
        cmocka_unit_test(test_metadata_codec),
        cmocka_unit_test(test_hello_and_ids),
        cmocka_unit_test(test_rndv_and_done_frames),
        cmocka_unit_test(test_stream_frames),
        cmocka_unit_test(test_arena_steady_state),
        cmocka_unit_test(test_depth_guard),
        cmocka_unit_test(test_unpack_ref),
        cmocka_unit_test(test_pack_size_check),
        cmocka_unit_test(test_pending_ids_and_limit),
        cmocka_unit_test(test_pending_decide_race),
        cmocka_unit_test(test_timer_wheel),
    };
    return cmocka_run_group_tests_name("rpc_units", tests, NULL, NULL);
}
