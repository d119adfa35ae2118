/* Server streams against a raw client that speaks the wire (docs/PROTOCOL.md,
 * "Streams"): every receiver rule of the server for the stream frames, and
 * the server's side of server, client and bidirectional streams: windows
 * both ways, HEADERS and trailers, CANCEL, deadline, drain, send pressure,
 * statistics. TCP. The raw client records every frame it receives. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include <verbrpc/transport.h>
#include "rpc/rndv.h"
#include "rpc/wire.h"
#include "rpc_test.pb-c.h"

#include "stream_srv_peer.h"

/* ---- tests ---------------------------------------------------------------------- */

/* Large server messages: MESSAGE|RNDV, read by the client, one at a time
 * (the next waits for the DONE), in order with a small one. */
static void t_large_server_messages(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_big.id, 0);
    send_msg(&r, ID(0), 0, VRPC_FF_END);
    struct vrpc_buf *lb;
    assert_int_equal(vrpc_lbuf_get(r.tp, 1 << 20, &lb), 0);
    for (uint64_t seq = 1; seq <= 2; seq++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 5000);
        assert_non_null(m);
        assert_int_equal(m->h.flags, VRPC_FF_RNDV);
        assert_true(m->h.payload_len > BIG);
        /* the next large one waits for our DONE (a small one may come: it follows) */
        struct frame *early = take(&r, VRPC_FT_MESSAGE, ID(0), 200);
        if (early && (early->h.flags & VRPC_FF_RNDV))
            fail_msg("large message %llu: another large one came before its DONE", (unsigned long long)seq);
        if (early) {
            assert_int_equal(seq, 2);
            assert_int_equal(reply_seq(early), 3);
            early->taken = false; /* checked below */
        }
        struct vrpc_wire_desc d;
        assert_int_equal(vrpc_wire_desc_decode(m->body, m->h.payload_len, &d), 0);
        unsigned n0 = __atomic_load_n(&r.nreads, __ATOMIC_ACQUIRE);
        assert_int_equal(vrpc_ep_read(r.ep, lb, 0, m->h.payload_len, d.addr, d.rkey, 1), 0);
        for (int i = 0; i < 5000 && __atomic_load_n(&r.nreads, __ATOMIC_ACQUIRE) == n0; i++)
            usleep(1000);
        assert_int_equal(__atomic_load_n(&r.nreads, __ATOMIC_ACQUIRE), n0 + 1);
        assert_int_equal(r.read_status, 0);
        Vrpctest__EchoReply *rep = vrpctest__echo_reply__unpack(NULL, m->h.payload_len, lb->data);
        assert_non_null(rep);
        assert_int_equal(rep->seq, seq);
        assert_int_equal(rep->payload.len, BIG);
        assert_int_equal(rep->payload.data[0], 0xa7);
        assert_int_equal(rep->payload.data[BIG - 1], 0xa7);
        vrpctest__echo_reply__free_unpacked(rep, NULL);
        send_simple(&r, VRPC_FT_DONE, ID(0));
    }
    struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 5000);
    assert_non_null(m);
    assert_int_equal(m->h.flags, 0);
    assert_int_equal(reply_seq(m), 3);
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(0), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    send_simple(&r, VRPC_FT_DONE, ID(0)); /* no large message outstanding: protocol error */
    assert_true(wait_disconnected(&r, 5000));
    vrpc_lbuf_put(lb);
    rc_close(&r);
}

/* A large client message (RNDV) inside a stream: read by the server, DONE,
 * delivered in order with the small ones around it. */
static void t_large_client_message(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_bidi.id, 0);
    send_msg(&r, ID(0), 1, 0);
    Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
    static uint8_t big[200000];
    memset(big, 0x5a, sizeof big);
    q.payload.data = big;
    q.payload.len = sizeof big;
    q.seq = 2;
    size_t n = vrpctest__echo_request__get_packed_size(&q);
    assert_int_equal(vrpc_lbuf_get(r.tp, n, &r.lb), 0);
    vrpctest__echo_request__pack(&q, r.lb->data);
    uint32_t rkey;
    assert_int_equal(vrpc_ep_grant(r.ep, r.lb->mr, r.lb->data, (uint32_t)n, &rkey), 0);
    uint8_t desc[VRPC_WIRE_DESC_LEN];
    vrpc_wire_desc_encode(desc, &(struct vrpc_wire_desc){.addr = (uint64_t)(uintptr_t)r.lb->data, .rkey = rkey});
    send_frame(&r,
               &(struct vrpc_wire_hdr){
                   .type = VRPC_FT_MESSAGE, .flags = VRPC_FF_RNDV, .request_id = ID(0), .payload_len = (uint32_t)n},
               NULL, desc);
    send_msg(&r, ID(0), 3, 0); /* small, behind the large one */
    struct frame *d = take(&r, VRPC_FT_DONE, ID(0), 10000);
    assert_non_null(d);
    assert_int_equal(d->h.status, 0);
    for (uint64_t i = 1; i <= 3; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 5000);
        assert_non_null(m);
        assert_int_equal(reply_seq(m), i);
    }
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(0), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    rc_close(&r);
}

/* Unary response metadata: HEADERS before the RESPONSE, trailers in it, on
 * success and on failure; a call without any sends neither. */
static void t_unary_response_metadata(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    for (uint32_t mode = 2; mode <= 4; mode++) {
        uint64_t id = ID(mode);
        Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
        q.mode = mode;
        q.seq = 5;
        uint8_t buf[16];
        size_t n = vrpctest__echo_request__pack(&q, buf);
        send_frame(&r,
                   &(struct vrpc_wire_hdr){
                       .type = VRPC_FT_REQUEST, .request_id = id, .method_id = m_echo.id, .payload_len = (uint32_t)n},
                   NULL, buf);
        struct frame *f = take(&r, VRPC_FT_RESPONSE, id, 5000);
        assert_non_null(f);
        struct frame *hd = take(&r, VRPC_FT_HEADERS, id, 100);
        assert_non_null(hd);
        assert_true(idx(&r, hd) < idx(&r, f));
        struct vrpc_metadata md[4];
        assert_int_equal(vrpc_wire_md_decode(hd->body, hd->h.md_len, md, 4), 1);
        assert_string_equal(md[0].key, "initial");
        assert_memory_equal(md[0].value, "i1", 2);
        assert_int_equal(vrpc_wire_md_decode(f->body, f->h.md_len, md, 4), 2);
        assert_string_equal(md[0].key, "trailer");
        assert_string_equal(md[1].key, "n");
        if (mode == 4) { /* large: RNDV, the trailers inline before the descriptor */
            assert_int_equal(f->h.status, VRPC_OK);
            assert_int_equal(f->h.flags, VRPC_FF_RNDV);
            assert_true(f->h.payload_len > BIG);
            struct vrpc_wire_desc d;
            assert_int_equal(vrpc_wire_desc_decode(f->body + f->h.md_len, f->h.payload_len, &d), 0);
            send_simple(&r, VRPC_FT_DONE, id);
        } else if (mode == 2) {
            assert_int_equal(f->h.status, VRPC_OK);
            Vrpctest__EchoReply *rep = vrpctest__echo_reply__unpack(NULL, f->h.payload_len, f->body + f->h.md_len);
            assert_non_null(rep);
            assert_int_equal(rep->seq, 5);
            vrpctest__echo_reply__free_unpacked(rep, NULL);
        } else {
            char msg[64];
            resp_text(f, msg, sizeof msg);
            assert_int_equal(f->h.status, VRPC_NOT_FOUND);
            assert_string_equal(msg, "no such key");
        }
    }
    assert_unary_ok(&r, ID(1));
    assert_int_equal(count(&r, VRPC_FT_HEADERS, ID(1)), 0);
    struct frame *f = take(&r, VRPC_FT_RESPONSE, 0, 0);
    assert_null(f);
    rc_close(&r);
}

/* Server streaming: HEADERS first, the messages in order, then RESPONSE OK
 * with the trailer; one call in the statistics. */
static void t_server_streaming(void **state)
{
    (void)state;
    struct rc r;
    struct vrpc_method_stats st[8];
    size_t n;
    assert_int_equal(vrpc_server_stats(g_srv, st, 8, &n), 0);
    size_t k = 0;
    while (k < n && k < 8 && st[k].method != &m_count)
        k++;
    assert_true(k < n && k < 8);
    uint64_t before = st[k].by_code[VRPC_OK];
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_count.id, 0);
    send_msg(&r, ID(0), 10, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(0), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    struct vrpc_metadata md[4];
    assert_int_equal(vrpc_wire_md_decode(end->body, end->h.md_len, md, 4), 1);
    assert_string_equal(md[0].key, "count");
    assert_memory_equal(md[0].value, "10", 2);
    struct frame *hd = take(&r, VRPC_FT_HEADERS, ID(0), 100);
    assert_non_null(hd);
    assert_int_equal(vrpc_wire_md_decode(hd->body, hd->h.md_len, md, 4), 1);
    assert_string_equal(md[0].key, "initial");
    unsigned last = idx(&r, hd);
    for (uint64_t i = 0; i < 10; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 100);
        assert_non_null(m);
        assert_true(idx(&r, m) > last && idx(&r, m) < idx(&r, end));
        last = idx(&r, m);
        assert_int_equal(reply_seq(m), i);
    }
    assert_null(take(&r, VRPC_FT_MESSAGE, ID(0), 50));
    assert_int_equal(vrpc_server_stats(g_srv, st, 8, &n), 0);
    assert_ptr_equal(st[k].method, &m_count);
    assert_int_equal(st[k].by_code[VRPC_OK], before + 1); /* a stream is one call */
    assert_int_equal(st[k].calls, before + 1);
    assert_unary_ok(&r, ID(1));
    rc_close(&r);
}

/* The client's window bounds the server's writes; WINDOW opens it. */
static void t_client_window_bounds_writes(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 3);
    open_stream(&r, ID(0), m_count.id, 0);
    send_msg(&r, ID(0), 10, VRPC_FF_END);
    for (int i = 0; i < 3; i++)
        assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    assert_null(take(&r, VRPC_FT_MESSAGE, ID(0), 300)); /* window closed */
    assert_unary_ok(&r, ID(1));                         /* and the connection moves */
    send_window(&r, ID(0), 3);
    for (int i = 0; i < 3; i++)
        assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    assert_null(take(&r, VRPC_FT_MESSAGE, ID(0), 200));
    send_window(&r, ID(0), 4);
    for (int i = 0; i < 4; i++)
        assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(0), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    rc_close(&r);
}

/* Bidi: the server returns window as its handler consumes (server window 4,
 * batches of 1), so the client may go on sending past 4. */
static void t_bidi_window_returned(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(2), m_bidi.id, 0);
    uint32_t credit = 4;
    for (uint64_t i = 0; i < 40; i++) {
        while (credit == 0) {
            struct frame *w = take(&r, VRPC_FT_WINDOW, ID(2), 5000);
            assert_non_null(w);
            uint32_t k;
            assert_int_equal(vrpc_wire_window_decode(w->body, w->h.payload_len, &k), 0);
            credit += k;
        }
        send_msg(&r, ID(2), i, 0);
        credit--;
    }
    for (uint64_t i = 0; i < 40; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(2), 5000);
        assert_non_null(m);
        assert_int_equal(reply_seq(m), i);
    }
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(2));
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(2), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    assert_false(__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE));
    rc_close(&r);
}

/* Client streaming: messages, END on the last; one reply then OK. */
static void t_client_streaming(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(3), m_sum.id, 0);
    for (uint64_t i = 1; i <= 4; i++) /* the server's window */
        send_msg(&r, ID(3), i, 0);
    assert_non_null(take(&r, VRPC_FT_WINDOW, ID(3), 5000)); /* consumed: room for one more */
    send_msg(&r, ID(3), 5, VRPC_FF_END);
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(3), 5000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(3), 100);
    assert_non_null(m);
    assert_int_equal(reply_seq(m), 15);
    rc_close(&r);
}

/* Asynchronous writes, bounded per stream, each callback queueing the next. */
static void t_async_writes(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 1u << 20);
    open_stream(&r, ID(4), m_acount.id, 0);
    send_msg(&r, ID(4), 500, VRPC_FF_END);
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(4), 10000);
    if (!end)
        fail_msg("no end; %u messages, %u windows", count(&r, VRPC_FT_MESSAGE, ID(4)), count(&r, VRPC_FT_WINDOW, 0));
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    for (uint64_t i = 0; i < 500; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(4), 100);
        assert_non_null(m);
        assert_int_equal(reply_seq(m), i);
    }
    rc_close(&r);
}

/* A write callback finishes the stream while later writes are queued or
 * already handed over together with its own: their callbacks all run before
 * that finish returns (none after), and the client gets the messages sent,
 * in order, then OK. */
static void t_async_finish_early(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 1u << 20);
    open_stream(&r, ID(5), m_acount.id, 0);
    send_msg(&r, ID(5), 500 | 5ull << 32, VRPC_FF_END); /* 500 writes, finish from the 5th callback */
    struct frame *end = take(&r, VRPC_FT_RESPONSE, ID(5), 10000);
    assert_non_null(end);
    assert_int_equal(end->h.status, VRPC_OK);
    unsigned got = count(&r, VRPC_FT_MESSAGE, ID(5));
    assert_true(got >= 5 && got <= 500);
    for (uint64_t i = 0; i < got; i++) {
        struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(5), 100);
        assert_non_null(m);
        assert_int_equal(reply_seq(m), i);
    }
    usleep(50000); /* a late callback would come now */
    assert_int_equal(__atomic_load_n(&acount_early_ok, __ATOMIC_RELAXED), 1);
    assert_int_equal(__atomic_load_n(&acount_late, __ATOMIC_RELAXED), 0);
    rc_close(&r);
}

/* Open a Gate stream on a fresh connection, with the gate closed so the
 * server's handler consumes nothing (no WINDOW comes back). */
static void gate_stream(struct rc *r, uint64_t id)
{
    connect_g(r, 64);
    __atomic_store_n(&gate_open, 0, __ATOMIC_RELEASE);
    open_stream(r, id, m_gate.id, 0);
}

static void gate_release(void) { __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE); }

/* Protocol errors: the connection closes (and only it: the next connection
 * is served). */
static void expect_closed(struct rc *r, const char *what)
{
    if (!wait_disconnected(r, 5000))
        fail_msg("%s did not close the connection", what);
    gate_release();
    rc_close(r);
    struct rc r2;
    connect_g(&r2, 64);
    assert_unary_ok(&r2, ID(9));
    rc_close(&r2);
}

static void t_message_beyond_window(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    for (uint64_t i = 0; i < 5; i++) /* the server's window is 4 */
        send_msg(&r, ID(0), i, 0);
    expect_closed(&r, "a MESSAGE beyond the window");
}

static void t_message_after_half_close(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    send_msg(&r, ID(0), 1, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    send_msg(&r, ID(0), 2, 0);
    expect_closed(&r, "a MESSAGE after HALF_CLOSE");
}

static void t_second_half_close(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    expect_closed(&r, "a second HALF_CLOSE");
}

static void t_half_close_after_end(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    send_msg(&r, ID(0), 1, VRPC_FF_END);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    expect_closed(&r, "HALF_CLOSE after a MESSAGE with END");
}

static void t_window_overflow(void **state)
{
    (void)state;
    struct rc r;
    gate_stream(&r, ID(0));
    send_window(&r, ID(0), 0x7fffffffu - 64); /* 64 + this: exactly the most */
    assert_false(wait_disconnected(&r, 200));
    send_window(&r, ID(0), 1);
    expect_closed(&r, "a WINDOW overflowing 2^31 - 1");
    gate_stream(&r, ID(0));
    send_frame(&r, &(struct vrpc_wire_hdr){.type = VRPC_FT_WINDOW, .request_id = ID(0), .payload_len = 4}, NULL,
               "\0\0\0\0");
    expect_closed(&r, "a WINDOW of 0");
}

static void t_stream_frames_on_unary_call(void **state)
{
    (void)state;
    static const uint8_t types[] = {VRPC_FT_MESSAGE, VRPC_FT_HALF_CLOSE, VRPC_FT_WINDOW};
    for (unsigned i = 0; i < sizeof(types); i++) {
        struct rc r;
        connect_g(&r, 64);
        __atomic_store_n(&gate_open, 0, __ATOMIC_RELEASE);
        Vrpctest__EchoRequest q = VRPCTEST__ECHO_REQUEST__INIT;
        q.mode = 1; /* the handler holds the call in flight */
        uint8_t buf[16];
        size_t n = vrpctest__echo_request__pack(&q, buf);
        send_frame(
            &r,
            &(struct vrpc_wire_hdr){
                .type = VRPC_FT_REQUEST, .request_id = ID(0), .method_id = m_echo.id, .payload_len = (uint32_t)n},
            NULL, buf);
        usleep(50000);
        if (types[i] == VRPC_FT_WINDOW)
            send_window(&r, ID(0), 1);
        else if (types[i] == VRPC_FT_MESSAGE)
            send_msg(&r, ID(0), 1, 0);
        else
            send_simple(&r, types[i], ID(0));
        expect_closed(&r, "a stream frame for a unary call");
    }
}

/* Frames for ids not in flight are ignored (they may cross the RESPONSE). */
static void t_unknown_ids_ignored(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    send_msg(&r, ID(5), 1, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(6));
    send_window(&r, ID(7), 3);
    send_msg(&r, vrpc_wire_make_id(100000, 1), 1, 0); /* beyond the slots */
    /* an ended stream too */
    open_stream(&r, ID(8), m_bidi.id, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(8));
    assert_non_null(take(&r, VRPC_FT_RESPONSE, ID(8), 5000));
    send_msg(&r, ID(8), 1, 0);
    send_window(&r, ID(8), 1);
    assert_unary_ok(&r, ID(1));
    rc_close(&r);
}

/* Per-stream errors: RESPONSE with a code, the connection stays. */
static void expect_status(struct rc *r, uint64_t id, enum vrpc_code code, const char *text)
{
    struct frame *f = take(r, VRPC_FT_RESPONSE, id, 5000);
    assert_non_null(f);
    char msg[256];
    resp_text(f, msg, sizeof msg);
    if (f->h.status != (uint32_t)code || !strstr(msg, text))
        fail_msg("got %s \"%s\", expected %s \"...%s...\"", vrpc_code_name((enum vrpc_code)f->h.status), msg,
                 vrpc_code_name(code), text);
}

static void t_server_streaming_bad_input(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_count.id, 0);
    send_msg(&r, ID(0), 1, 0);
    send_msg(&r, ID(0), 2, 0);
    expect_status(&r, ID(0), VRPC_INVALID_ARGUMENT, "second client message");
    open_stream(&r, ID(1), m_count.id, 0);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(1));
    expect_status(&r, ID(1), VRPC_INVALID_ARGUMENT, "before the request message");
    open_stream(&r, ID(2), m_bidi.id, 0);
    send_frame(&r, &(struct vrpc_wire_hdr){.type = VRPC_FT_MESSAGE, .request_id = ID(2), .payload_len = 2}, NULL,
               "\x0b\x0c");
    expect_status(&r, ID(2), VRPC_INVALID_ARGUMENT, "does not decode");
    assert_unary_ok(&r, ID(3));
    rc_close(&r);
}

static void t_method_kind_mismatch(void **state)
{
    (void)state;
    struct rc r;
    unsigned before = __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE);
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_echo.id, 0);
    expect_status(&r, ID(0), VRPC_UNIMPLEMENTED, "is unary");
    unary_call(&r, ID(1), m_count.id, 1);
    expect_status(&r, ID(1), VRPC_UNIMPLEMENTED, "is streaming");
    open_stream(&r, ID(2), 12345, 0);
    expect_status(&r, ID(2), VRPC_UNIMPLEMENTED, "unknown method");
    assert_unary_ok(&r, ID(3));
    assert_int_equal(__atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE), before);
    rc_close(&r);
}

static void t_bad_stream_frames(void **state)
{
    (void)state;
    struct rc r;
    connect_g(&r, 64);
    /* REQUEST|STREAM carrying a message */
    send_frame(&r,
               &(struct vrpc_wire_hdr){.type = VRPC_FT_REQUEST,
                                       .flags = VRPC_FF_STREAM,
                                       .request_id = ID(0),
                                       .method_id = m_bidi.id,
                                       .payload_len = 2},
               NULL, "\x10\x01");
    expect_closed(&r, "REQUEST|STREAM with a payload");
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_gate.id, 0);
    static const uint8_t md[] = {1, 0, 0, 0, 'a', 0};
    send_frame(&r, &(struct vrpc_wire_hdr){.type = VRPC_FT_HEADERS, .request_id = ID(0), .md_len = sizeof md}, md,
               NULL);
    expect_closed(&r, "HEADERS from a client");
}

static void t_cancel(void **state)
{
    (void)state;
    struct rc r;
    unsigned before = __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE);
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_bidi.id, 0);
    send_msg(&r, ID(0), 5, 0);
    assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    send_simple(&r, VRPC_FT_CANCEL, ID(0));
    expect_status(&r, ID(0), VRPC_CANCELLED, "cancelled");
    for (int i = 0; i < 5000 && __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE) == before; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE), before + 1);
    assert_null(take(&r, VRPC_FT_RESPONSE, ID(0), 100)); /* exactly one end */
    assert_unary_ok(&r, ID(1));
    rc_close(&r);
}

static void t_deadline(void **state)
{
    (void)state;
    struct rc r;
    unsigned before = __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE);
    connect_g(&r, 64);
    int64_t t0 = vrpc_now_ns();
    open_stream(&r, ID(0), m_gate.id, 200000);
    send_msg(&r, ID(0), 1, 0);
    expect_status(&r, ID(0), VRPC_DEADLINE_EXCEEDED, "deadline");
    assert_true(vrpc_now_ns() - t0 >= 150000000);
    for (int i = 0; i < 5000 && __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE) == before; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE), before + 1);
    assert_null(take(&r, VRPC_FT_RESPONSE, ID(0), 100));
    assert_unary_ok(&r, ID(1));
    rc_close(&r);
}

struct shut {
    struct vrpc_server *s;
    int rc;
    unsigned done; /* atomic */
};
static void *shut_thread(void *arg)
{
    struct shut *sh = arg;
    sh->rc = vrpc_server_shutdown(sh->s, 10000);
    __atomic_store_n(&sh->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* GOAWAY and drain: vrpc_server_shutdown waits for an open stream, which
 * goes on (new streams are refused) and ends normally. */
static void t_drain_waits_for_streams(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    struct vrpc_server *s = srv_start(NULL, uri);
    struct rc r;
    rc_open(&r, uri, 64);
    assert_non_null(take(&r, VRPC_FT_HELLO_ACK, 0, 5000));
    open_stream(&r, ID(0), m_bidi.id, 0);
    send_msg(&r, ID(0), 1, 0);
    assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    struct shut sh = {.s = s};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, shut_thread, &sh), 0);
    assert_non_null(take(&r, VRPC_FT_GOAWAY, 0, 5000));
    open_stream(&r, ID(1), m_bidi.id, 0);
    expect_status(&r, ID(1), VRPC_UNAVAILABLE, "shutting down");
    usleep(300000);
    assert_false(__atomic_load_n(&sh.done, __ATOMIC_ACQUIRE)); /* the stream holds the drain */
    send_msg(&r, ID(0), 2, 0);
    struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 5000);
    assert_non_null(m);
    assert_int_equal(reply_seq(m), 2);
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    expect_status(&r, ID(0), VRPC_OK, "");
    pthread_join(t, NULL);
    assert_int_equal(sh.rc, 0);
    rc_close(&r);
    vrpc_server_destroy(s);
}

/* The idle timeout does not close a connection whose only activity is an
 * open stream. */
static void t_idle_timeout_spares_streams(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    struct vrpc_server_opts o;
    vrpc_server_opts_init(&o);
    o.idle_timeout_ms = 100;
    struct vrpc_server *s = srv_start(&o, uri);
    struct rc r;
    rc_open(&r, uri, 64);
    assert_non_null(take(&r, VRPC_FT_HELLO_ACK, 0, 5000));
    open_stream(&r, ID(0), m_bidi.id, 0);
    usleep(800000);
    assert_int_equal(count(&r, VRPC_FT_GOAWAY, 0), 0);
    assert_false(__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE));
    send_msg(&r, ID(0), 3, 0);
    assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    send_simple(&r, VRPC_FT_HALF_CLOSE, ID(0));
    expect_status(&r, ID(0), VRPC_OK, "");
    /* with nothing open, it does go */
    assert_non_null(take(&r, VRPC_FT_GOAWAY, 0, 5000));
    rc_close(&r);
    vrpc_server_destroy(s);
}

/* Send pressure: many streams writing at once on one connection with a
 * small max_sends_per_conn wait for send room instead of having the
 * connection killed, as long as the client reads. */
#define PRESSURE_STREAMS 300
#define PRESSURE_MSGS 20
static void t_send_pressure(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    struct vrpc_server_opts o;
    vrpc_server_opts_init(&o);
    o.max_concurrent = 1024;
    o.max_sends_per_conn = 16;
    o.threads = 4;
    struct vrpc_server *s = srv_start(&o, uri);
    struct rc r;
    rc_open(&r, uri, 64);
    assert_non_null(take(&r, VRPC_FT_HELLO_ACK, 0, 5000));
    for (uint32_t i = 0; i < PRESSURE_STREAMS; i++) {
        open_stream(&r, ID(i), m_count.id, 0);
        send_msg(&r, ID(i), PRESSURE_MSGS, VRPC_FF_END);
    }
    for (uint32_t i = 0; i < PRESSURE_STREAMS; i++) {
        struct frame *f = take(&r, VRPC_FT_RESPONSE, ID(i), 30000);
        assert_non_null(f);
        assert_int_equal(f->h.status, VRPC_OK);
        assert_int_equal(count(&r, VRPC_FT_MESSAGE, ID(i)), PRESSURE_MSGS);
    }
    assert_false(__atomic_load_n(&r.disconnected, __ATOMIC_ACQUIRE));
    rc_close(&r);
    vrpc_server_destroy(s);
}

/* A client that never reads a large stream message (no READ, no DONE)
 * holds the server's large buffer only for the hold timeout: then it loses
 * its connection and the buffer comes back. The writer's blocking write has
 * returned 0 long before: a write is complete once handed to the transport
 * (the descriptor sent), so a client that never reads cannot hold it. */
static void t_large_message_never_read(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX];
    struct vrpc_server_opts o;
    vrpc_server_opts_init(&o);
    o.hold_timeout_ms = 300;
    struct vrpc_server *s = srv_start(&o, uri);
    size_t pinned = 0, base = 0, held = 0;
    vrpc_lbuf_stats(vrpc_server_transport(s), &pinned, &base);
    __atomic_store_n(&big_once_rc, 1, __ATOMIC_RELEASE);
    struct rc r;
    rc_open(&r, uri, 64);
    assert_non_null(take(&r, VRPC_FT_HELLO_ACK, 0, 5000));
    open_stream(&r, ID(0), m_big_once.id, 0);
    send_msg(&r, ID(0), 0, VRPC_FF_END);
    int64_t t0 = vrpc_now_ns();
    struct frame *m = take(&r, VRPC_FT_MESSAGE, ID(0), 5000);
    assert_non_null(m);
    assert_int_equal(m->h.flags, VRPC_FF_RNDV);
    vrpc_lbuf_stats(vrpc_server_transport(s), &pinned, &held);
    assert_true(held > base); /* the payload waits in a large buffer for our read */
    for (int i = 0; i < 5000 && __atomic_load_n(&big_once_rc, __ATOMIC_ACQUIRE) == 1; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&big_once_rc, __ATOMIC_ACQUIRE), 0);
    assert_true(wait_disconnected(&r, 10000));
    long long ms = (long long)((vrpc_now_ns() - t0) / 1000000);
    printf("never-read large stream message: connection aborted after %lld ms (hold_timeout_ms 300)\n", ms);
    assert_true(ms >= 250);
    size_t now = held;
    for (int i = 0; i < 5000 && now > base; i++) {
        usleep(1000);
        vrpc_lbuf_stats(vrpc_server_transport(s), &pinned, &now);
    }
    assert_int_equal(now, base);
    rc_close(&r);
    vrpc_server_destroy(s);
}

/* Connection loss mid-stream: on_cancel runs, the server frees the stream. */
static void t_connection_lost(void **state)
{
    (void)state;
    unsigned before = __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE);
    struct rc r;
    connect_g(&r, 64);
    open_stream(&r, ID(0), m_bidi.id, 0);
    send_msg(&r, ID(0), 1, 0);
    assert_non_null(take(&r, VRPC_FT_MESSAGE, ID(0), 5000));
    rc_close(&r);
    for (int i = 0; i < 5000 && __atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE) == before; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&n_cancel, __ATOMIC_ACQUIRE), before + 1);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_unary_response_metadata),
        cmocka_unit_test(t_large_client_message),
        cmocka_unit_test(t_large_server_messages),
        cmocka_unit_test(t_large_message_never_read),
        cmocka_unit_test(t_server_streaming),
        cmocka_unit_test(t_client_window_bounds_writes),
        cmocka_unit_test(t_bidi_window_returned),
        cmocka_unit_test(t_client_streaming),
        cmocka_unit_test(t_async_writes),
        cmocka_unit_test(t_async_finish_early),
        cmocka_unit_test(t_message_beyond_window),
        cmocka_unit_test(t_message_after_half_close),
        cmocka_unit_test(t_second_half_close),
        cmocka_unit_test(t_half_close_after_end),
        cmocka_unit_test(t_window_overflow),
        cmocka_unit_test(t_stream_frames_on_unary_call),
        cmocka_unit_test(t_unknown_ids_ignored),
        cmocka_unit_test(t_server_streaming_bad_input),
        cmocka_unit_test(t_method_kind_mismatch),
        cmocka_unit_test(t_bad_stream_frames),
        cmocka_unit_test(t_cancel),
        cmocka_unit_test(t_deadline),
        cmocka_unit_test(t_connection_lost),
        cmocka_unit_test(t_drain_waits_for_streams),
        cmocka_unit_test(t_idle_timeout_spares_streams),
        cmocka_unit_test(t_send_pressure),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
