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
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/arena.h"
#include "rpc/pbflat.h"
#include "rpc/pbutil.h"
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

/* A value with the edges over-represented. */
static uint64_t rnd_u64(void)
{
    static const uint64_t edge[] = {0, 1, 127, 128, 16383, 16384, 0x7fffffff, 0x80000000, 0xffffffff,
                                    0x100000000ull, INT64_MAX, (uint64_t)INT64_MIN, UINT64_MAX,
                                    (uint64_t)-1 - 1, (uint64_t)-3};
    switch (rnd() % 4) {
    case 0:
        return edge[rnd() % (sizeof(edge) / sizeof(edge[0]))];
    case 1:
        return rnd() % 300;
    case 2:
        return rnd() >> (rnd() % 64);
    default:
        return rnd();
    }
}

static char strpool[64][48];
static uint8_t bytepool[64][48];
static unsigned pooled;

static void rnd_string_bytes(char **s, ProtobufCBinaryData *b)
{
    unsigned k = pooled++ % 64, n = (unsigned)(rnd() % 40);
    if (rnd() % 5 == 0)
        n = 0;
    for (unsigned i = 0; i < n; i++) {
        strpool[k][i] = (char)(1 + rnd() % 255); /* any byte but NUL, invalid UTF-8 included */
        bytepool[k][i] = (uint8_t)rnd();
    }
    strpool[k][n] = 0;
    if (s)
        *s = strpool[k];
    if (b) {
        b->len = n;
        b->data = n || rnd() % 2 ? bytepool[k] : NULL;
    }
}

/* Fill every field of a flat message with random values and presence. */
static void fill(ProtobufCMessage *msg)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *m = (char *)msg + f->offset;
        if (rnd() % 4 == 0)
            continue; /* leave as initialised */
        if (f->label == PROTOBUF_C_LABEL_REPEATED) { /* NotFlat: repeated int32 */
            static int32_t rv[3] = {1, -1, 300};
            *(size_t *)((char *)msg + f->quantifier_offset) = (size_t)(rnd() % 4);
            *(int32_t **)m = rv;
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) { /* Node: a child with a value */
            static Vrpctest__Node child = VRPCTEST__NODE__INIT;
            child.value = 5;
            *(ProtobufCMessage **)m = rnd() % 2 ? &child.base : NULL;
            continue;
        }
        uint64_t v = rnd_u64();
        switch (f->type) {
        case PROTOBUF_C_TYPE_FLOAT: {
            static const float fe[] = {0.0f, -0.0f, 1.5f, -2.25f, 1e30f, INFINITY, NAN};
            float x = fe[rnd() % 7];
            memcpy(m, &x, 4);
            break;
        }
        case PROTOBUF_C_TYPE_DOUBLE: {
            static const double de[] = {0.0, -0.0, 1.5, -2.25, 1e300, -INFINITY, NAN};
            double x = de[rnd() % 7];
            memcpy(m, &x, 8);
            break;
        }
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_SFIXED64:
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
            memcpy(m, &v, 8);
            break;
        case PROTOBUF_C_TYPE_BOOL:
            *(protobuf_c_boolean *)m = (protobuf_c_boolean)(rnd() % 3 ? rnd() % 2 : 2 + rnd() % 300); /* any non-zero is true */
            break;
        case PROTOBUF_C_TYPE_ENUM: {
            static const int32_t ev[] = {0, 1, -3, -2, 7};
            *(int32_t *)m = ev[rnd() % 5];
            break;
        }
        case PROTOBUF_C_TYPE_STRING:
            if (rnd() % 6 == 0)
                *(char **)m = NULL;
            else
                rnd_string_bytes((char **)m, NULL);
            break;
        case PROTOBUF_C_TYPE_BYTES:
            rnd_string_bytes(NULL, (ProtobufCBinaryData *)m);
            break;
        default: { /* 32-bit integers */
            uint32_t x = (uint32_t)v;
            memcpy(m, &x, 4);
            break;
        }
        }
        if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset)
            *(protobuf_c_boolean *)((char *)msg + f->quantifier_offset) = (protobuf_c_boolean)(rnd() % 3 != 0);
    }
}

/* Field-by-field equality of two decoded messages of one type. */
static void assert_same_fields(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
    const ProtobufCMessageDescriptor *d = a->descriptor;
    assert_ptr_equal(a->descriptor, b->descriptor);
    assert_int_equal(a->n_unknown_fields, b->n_unknown_fields);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *ma = (const char *)a + f->offset, *mb = (const char *)b + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) { /* int32 only here */
            size_t na = *(const size_t *)((const char *)a + f->quantifier_offset);
            assert_int_equal(na, *(const size_t *)((const char *)b + f->quantifier_offset));
            if (na)
                assert_memory_equal(*(int32_t *const *)ma, *(int32_t *const *)mb, na * sizeof(int32_t));
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            const ProtobufCMessage *ca = *(ProtobufCMessage *const *)ma, *cb = *(ProtobufCMessage *const *)mb;
            assert_int_equal(ca == NULL, cb == NULL);
            if (ca)
                assert_same_fields(ca, cb);
            continue;
        }
        if (f->quantifier_offset)
            assert_int_equal(*(const protobuf_c_boolean *)((const char *)a + f->quantifier_offset),
                             *(const protobuf_c_boolean *)((const char *)b + f->quantifier_offset));
        switch (f->type) {
        case PROTOBUF_C_TYPE_STRING: {
            const char *sa = *(char *const *)ma, *sb = *(char *const *)mb;
            assert_int_equal(sa == NULL, sb == NULL);
            assert_int_equal(sa == f->default_value, sb == f->default_value);
            if (sa)
                assert_string_equal(sa, sb);
            break;
        }
        case PROTOBUF_C_TYPE_BYTES: {
            const ProtobufCBinaryData *ba = (const void *)ma, *bb = (const void *)mb;
            assert_int_equal(ba->len, bb->len);
            assert_int_equal(ba->data == NULL, bb->data == NULL);
            if (ba->len)
                assert_memory_equal(ba->data, bb->data, ba->len);
            break;
        }
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_SFIXED64:
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
        case PROTOBUF_C_TYPE_DOUBLE:
            assert_memory_equal(ma, mb, 8);
            break;
        default:
            assert_memory_equal(ma, mb, 4);
            break;
        }
    }
}

static const ProtobufCMessageDescriptor *const types[] = {
    &vrpcflat2__all2__descriptor,
    &vrpcflat3__all3__descriptor,
    &vrpctest__echo_request__descriptor,
    &vrpctest__echo_reply__descriptor,
    &vrpcflat3__not_flat__descriptor, /* not flat: protobuf-c packs, and unpacks a repeated field */
    &vrpctest__node__descriptor,
};
#define NTYPES (sizeof(types) / sizeof(types[0]))

static void new_msg(const ProtobufCMessageDescriptor *d, ProtobufCMessage *m)
{
    d->message_init(m);
}

/* Unpack buf with both and compare outcomes. Returns whether they accepted. */
static bool unpack_both(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                        struct vrpc_arena *a)
{
    ProtobufCMessage *fast = NULL;
    ProtobufCMessage *ref = protobuf_c_message_unpack(d, NULL, len, buf);
    vrpc_arena_reset(a);
    int rc = vrpc_pb_unpack(d, buf, len, 0, a, &fast);
    if (!ref) {
        assert_int_equal(rc, -EBADMSG);
        return false;
    }
    assert_int_equal(rc, 0);
    assert_same_fields(fast, ref);
    if (ref->n_unknown_fields == 0) {
        /* and they pack back to the same bytes */
        uint8_t x[4096], y[4096];
        size_t nx = protobuf_c_message_get_packed_size(ref);
        assert_true(nx <= sizeof(x));
        assert_int_equal(vrpc_pb_size(fast, sizeof(y)), (long)nx);
        assert_int_equal(protobuf_c_message_pack(ref, x), nx);
        assert_int_equal(vrpc_pb_pack_sized(fast, y), nx);
        assert_memory_equal(x, y, nx);
    }
    protobuf_c_message_free_unpacked(ref, NULL);
    return true;
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
        uint8_t x[4096], y[4096];
        size_t n = protobuf_c_message_get_packed_size(m);
        assert_true(n <= sizeof(x));
        assert_int_equal(vrpc_pb_size(m, sizeof(y)), (long)n);
        assert_int_equal(protobuf_c_message_pack(m, x), n);
        memset(y, 0xee, sizeof(y));
        assert_int_equal(vrpc_pb_pack_sized(m, y), n);
        assert_memory_equal(x, y, n);
        assert_int_equal(y[n], 0xee); /* nothing past the size */
        if (n)
            assert_int_equal(vrpc_pb_size(m, n - 1), -EMSGSIZE);
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
