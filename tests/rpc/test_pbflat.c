/* rpc/pbutil.c's own codec for flat messages against protobuf-c 1.4.1, which
 * it must match: for random messages of every field type (proto2 required
 * and optional with defaults, proto3 unlabelled), vrpc_pb_size and
 * vrpc_pb_pack_sized give protobuf-c's size and bytes; unpacking those bytes
 * gives protobuf-c's fields; and for random and mutated input (flipped,
 * truncated, extended bytes, unknown fields, wrong wire types) vrpc_pb_unpack
 * and protobuf_c_message_unpack accept and refuse the same inputs and, when
 * they accept, decode the same fields. Types that are not flat (a repeated
 * field, a message field) are in the mix: pbutil.c's code hands them over. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/arena.h"
#include "rpc/pbflat.h"
#include "rpc/pbutil.h"
#include "pb_compare.h"
#include "pb_flat2.pb-c.h"
#include "pb_flat3.pb-c.h"
#include "rpc_test.pb-c.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define ROUNDS 3000
#else
#define ROUNDS 30000
#endif

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static uint64_t rnd_next(void *ctx)
{
    (void)ctx;
    return rnd();
}

static void fill(ProtobufCMessage *msg) { pbc_fill(msg, rnd_next, NULL); }

static const ProtobufCMessageDescriptor
    *const
        types[] =
            {
                &vrpcflat2__all2__descriptor,        &vrpcflat3__all3__descriptor,
                &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor,
                &vrpcflat3__not_flat__descriptor, /* not flat: protobuf-c packs, and unpacks a repeated field */
                &vrpctest__node__descriptor,
};
#define NTYPES (sizeof(types) / sizeof(types[0]))

static void new_msg(const ProtobufCMessageDescriptor *d, ProtobufCMessage *m) { d->message_init(m); }

/* Unpack buf with both and compare outcomes (pb_compare.c). Returns whether
 * they accepted. */
static bool unpack_both(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, struct vrpc_arena *a)
{
    bool ok, looped;
    const char *why = pbc_unpack_both(d, buf, len, a, &ok, &looped);
    if (why)
        fail_msg("%s", why);
    assert_false(looped);
    return ok;
}

/* Random messages: same size, same bytes, same fields back. */
static void test_pack_unpack_match_protobuf_c(void **state)
{
    (void)state;
    struct vrpc_arena a;
    vrpc_arena_init(&a, 4096, 1 << 20);
    for (unsigned t = 0; t < 4; t++)
        assert_true(vrpc_pbflat_type(types[t]));
    assert_false(vrpc_pbflat_type(&vrpcflat3__not_flat__descriptor));
    assert_false(vrpc_pbflat_type(&vrpctest__node__descriptor));
    unsigned accepted = 0;
    for (unsigned r = 0; r < ROUNDS; r++) {
        const ProtobufCMessageDescriptor *d = types[r % NTYPES];
        _Alignas(16) char mem[1024];
        ProtobufCMessage *m = (ProtobufCMessage *)mem;
        assert_true(d->sizeof_message <= sizeof(mem));
        new_msg(d, m);
        fill(m);
        if (d == &vrpcflat2__all2__descriptor && !((Vrpcflat2__All2 *)m)->r_str)
            ((Vrpcflat2__All2 *)m)->r_str = "req"; /* protobuf-c cannot pack a NULL required string */
        uint8_t x[4096];
        size_t n = protobuf_c_message_get_packed_size(m);
        assert_true(n <= sizeof(x));
        const char *why = pbc_pack_both(m); /* same size and bytes, nothing past the size */
        if (why)
            fail_msg("%s", why);
        assert_int_equal(protobuf_c_message_pack(m, x), n);
        accepted += unpack_both(d, x, n, &a);
    }
    assert_int_equal(accepted, ROUNDS);
    vrpc_arena_fini(&a);
}

/* Mutated and random input: accepted and refused alike, decoded alike. */
static void test_bad_input_matches_protobuf_c(void **state)
{
    (void)state;
    struct vrpc_arena a;
    unsigned accepted = 0, refused = 0;
    vrpc_arena_init(&a, 4096, 1 << 20);
    for (unsigned r = 0; r < ROUNDS; r++) {
        const ProtobufCMessageDescriptor *d = types[r % NTYPES];
        _Alignas(16) char mem[1024];
        ProtobufCMessage *m = (ProtobufCMessage *)mem;
        uint8_t buf[4096];
        size_t n;
        new_msg(d, m);
        fill(m);
        if (d == &vrpcflat2__all2__descriptor && !((Vrpcflat2__All2 *)m)->r_str)
            ((Vrpcflat2__All2 *)m)->r_str = "req";
        n = protobuf_c_message_pack(m, buf);
        switch (rnd() % 7) {
        case 0: /* flip bytes */
            for (unsigned k = 0, z = 1 + (unsigned)(rnd() % 3); n && k < z; k++)
                buf[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1: /* truncate */
            n = n ? (size_t)(rnd() % n) : 0;
            break;
        case 2: /* an unknown field (varint, 64-bit, length-delimited, 32-bit) */
            buf[n++] = (uint8_t)((99u << 3) | (unsigned)(rnd() % 2 ? 0 : 1 + (rnd() % 2) * 4));
            memset(buf + n, 0x01, 8);
            n += (buf[n - 1] & 7) == 0 ? 1 : (buf[n - 1] & 7) == 1 ? 8 : 4;
            break;
        case 3: /* a known field with the wrong wire type */
            buf[n++] = (uint8_t)((1u + (unsigned)(rnd() % 16)) << 3 | (unsigned)(rnd() % 6));
            buf[n++] = 1;
            buf[n++] = 0;
            break;
        case 4: /* random bytes */
            n = (size_t)(rnd() % 64);
            for (size_t k = 0; k < n; k++)
                buf[k] = (uint8_t)rnd();
            break;
        case 5: /* a field repeated: the last value wins */
            if (n) {
                memcpy(buf + n, buf, n);
                n *= 2;
            }
            break;
        default: /* over-long varints: 11 continuation bytes */
            buf[n++] = 0x08;
            for (int k = 0; k < 11; k++)
                buf[n++] = 0x80;
            buf[n++] = 0;
            break;
        }
        if (unpack_both(d, buf, n, &a))
            accepted++;
        else
            refused++;
    }
    /* both outcomes were exercised */
    assert_true(accepted > ROUNDS / 10);
    assert_true(refused > ROUNDS / 20);
    vrpc_arena_fini(&a);
}

/* Big bytes values are referenced by vrpc_pb_unpack_ref (flat path too),
 * small ones copied; a missing required field is refused; and a flat
 * unpack that falls back leaves the arena as it was. */
static void test_flat_ref_required_and_arena(void **state)
{
    (void)state;
    struct vrpc_arena a;
    static uint8_t big[3 * VRPC_PB_REF_MIN], buf[4 * VRPC_PB_REF_MIN];
    vrpc_arena_init(&a, 4096, 1 << 20);

    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    memset(big, 0x5a, sizeof(big));
    rep.payload.data = big;
    rep.payload.len = sizeof(big);
    rep.seq = 77;
    size_t n = vrpc_pb_pack_sized(&rep.base, buf);
    ProtobufCMessage *m;
    assert_int_equal(vrpc_pb_unpack_ref(&vrpctest__echo_reply__descriptor, buf, n, 0, &a, &m), 0);
    Vrpctest__EchoReply *r = (Vrpctest__EchoReply *)m;
    assert_int_equal(r->seq, 77);
    assert_int_equal(r->payload.len, sizeof(big));
    assert_true(r->payload.data > buf && r->payload.data < buf + n); /* referenced */
    assert_true(a.used < 1024);
    vrpc_arena_reset(&a);
    assert_int_equal(vrpc_pb_unpack(&vrpctest__echo_reply__descriptor, buf, n, 0, &a, &m), 0);
    r = (Vrpctest__EchoReply *)m;
    assert_true(r->payload.data < buf || r->payload.data >= buf + n); /* copied */
    assert_memory_equal(r->payload.data, big, sizeof(big));

    /* a bool whose only set bit is beyond the 64th of its 10-byte varint:
     * protobuf-c says true (any non-zero 7-bit group) */
    uint8_t b10[] = {13 << 3, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02};
    assert_true(unpack_both(&vrpcflat3__all3__descriptor, b10, sizeof(b10), &a));
    vrpc_arena_reset(&a);
    assert_int_equal(vrpc_pb_unpack(&vrpcflat3__all3__descriptor, b10, sizeof(b10), 0, &a, &m), 0);
    assert_true(((Vrpcflat3__All3 *)m)->b);

    /* All2 without its required r_str: protobuf-c refuses it, so do we */
    uint8_t req[] = {0x08, 0x05};
    vrpc_arena_reset(&a);
    assert_int_equal(vrpc_pb_unpack(&vrpcflat2__all2__descriptor, req, sizeof(req), 0, &a, &m), -EBADMSG);
    /* pbflat hands it over with the arena as it found it */
    vrpc_arena_reset(&a);
    assert_non_null(vrpc_arena_alloc(&a, 32));
    size_t before = a.used;
    assert_int_equal(vrpc_pbflat_unpack(&vrpcflat2__all2__descriptor, req, sizeof(req), 0, &a, &m),
                     VRPC_PBFLAT_FALLBACK);
    assert_int_equal(a.used, before);
    /* an unknown field: protobuf-c keeps it and packs it back */
    uint8_t unk[] = {0x08, 0x05, 0x12, 0x01, 'x', 0xf8, 0x06, 0x2a};
    vrpc_arena_reset(&a);
    assert_int_equal(vrpc_pb_unpack(&vrpcflat2__all2__descriptor, unk, sizeof(unk), 0, &a, &m), 0);
    assert_int_equal(m->n_unknown_fields, 1);
    uint8_t back[64];
    assert_int_equal(vrpc_pb_size(m, sizeof(back)), (long)sizeof(unk));
    assert_int_equal(vrpc_pb_pack_sized(m, back), sizeof(unk));
    assert_memory_equal(back, unk, sizeof(unk));
    vrpc_arena_fini(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_unpack_match_protobuf_c),
        cmocka_unit_test(test_bad_input_matches_protobuf_c),
        cmocka_unit_test(test_flat_ref_required_and_arena),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
