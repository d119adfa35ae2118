/* Comparisons of our protobuf codec with protobuf-c: see pb_compare.h. */
#include "pb_compare.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/pbutil.h"
#include "rpc_test.pb-c.h"

static char why[256];

static const char *differ(const ProtobufCFieldDescriptor *f, const char *what)
{
    if (f)
        snprintf(why, sizeof why, "field %s (%u): %s", f->name, f->id, what);
    else
        snprintf(why, sizeof why, "%s", what);
    return why;
}

static size_t elem_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default: /* 32-bit integers, float, bool, enum */
        return 4;
    }
}

/* One value of f at ma and mb. */
static const char *value_diff(const ProtobufCFieldDescriptor *f, const char *ma, const char *mb)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *sa = *(char *const *)ma, *sb = *(char *const *)mb;
        if ((sa == NULL) != (sb == NULL))
            return differ(f, "string NULL on one side only");
        if ((sa == f->default_value) != (sb == f->default_value))
            return differ(f, "string is the default pointer on one side only");
        if (sa && strcmp(sa, sb))
            return differ(f, "string values");
        return NULL;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *ba = (const void *)ma, *bb = (const void *)mb;
        if (ba->len != bb->len)
            return differ(f, "bytes lengths");
        if ((ba->data == NULL) != (bb->data == NULL))
            return differ(f, "bytes data NULL on one side only");
        if (ba->len && memcmp(ba->data, bb->data, ba->len))
            return differ(f, "bytes values");
        return NULL;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *ca = *(ProtobufCMessage *const *)ma, *cb = *(ProtobufCMessage *const *)mb;
        if ((ca == NULL) != (cb == NULL))
            return differ(f, "sub-message present on one side only");
        return ca ? pbc_diff_fields(ca, cb) : NULL;
    }
    default:
        return memcmp(ma, mb, elem_size(f)) ? differ(f, "values") : NULL;
    }
}

const char *pbc_diff_fields(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
    const ProtobufCMessageDescriptor *d = a->descriptor;
    if (a->descriptor != b->descriptor)
        return differ(NULL, "descriptors");
    if (a->n_unknown_fields != b->n_unknown_fields)
        return differ(NULL, "unknown field counts");
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *ma = (const char *)a + f->offset, *mb = (const char *)b + f->offset;
        const char *r;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t na = *(const size_t *)((const char *)a + f->quantifier_offset);
            if (na != *(const size_t *)((const char *)b + f->quantifier_offset))
                return differ(f, "repeated counts");
            for (size_t k = 0; k < na; k++)
                if ((r = value_diff(f, *(char *const *)ma + k * elem_size(f), *(char *const *)mb + k * elem_size(f))))
                    return r;
            continue;
        }
        if (f->quantifier_offset && *(const uint32_t *)((const char *)a + f->quantifier_offset) !=
                                        *(const uint32_t *)((const char *)b + f->quantifier_offset))
            return differ(f, "presence (has_ or oneof case)");
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)((const char *)a + f->quantifier_offset) != f->id)
            continue;
        if ((r = value_diff(f, ma, mb)))
            return r;
    }
    return NULL;
}

const char *pbc_pack_both(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *x = malloc(n + 1), *y = malloc(n + 1);
    const char *r = NULL;
    if (!x || !y) {
        r = "no memory";
        goto out;
    }
    memset(y, 0xee, n + 1);
    if (vrpc_pb_size(msg, n) != (long)n)
        r = differ(NULL, "vrpc_pb_size is not protobuf-c's packed size");
    else if (n && vrpc_pb_size(msg, n - 1) != -EMSGSIZE)
        r = differ(NULL, "vrpc_pb_size accepts a cap one byte short");
    else if (protobuf_c_message_pack(msg, x) != n)
        r = differ(NULL, "protobuf-c packs another size than it said");
    else if (vrpc_pb_pack_sized(msg, y) != n)
        r = differ(NULL, "vrpc_pb_pack_sized length");
    else if (memcmp(x, y, n))
        r = differ(NULL, "packed bytes");
    else if (y[n] != 0xee)
        r = differ(NULL, "vrpc_pb_pack_sized wrote past the size");
out:
    free(x);
    free(y);
    return r;
}

/* protobuf-c packs a and b to the same bytes. */
static const char *same_encoding(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
    size_t na = protobuf_c_message_get_packed_size(a), nb = protobuf_c_message_get_packed_size(b);
    uint8_t *x = malloc(na + 1), *y = malloc(nb + 1);
    const char *r = NULL;
    if (!x || !y)
        r = "no memory";
    else if (na != nb || protobuf_c_message_pack(a, x) != na || protobuf_c_message_pack(b, y) != nb || memcmp(x, y, na))
        r = differ(NULL, "the two decoded messages pack to different bytes");
    free(x);
    free(y);
    return r;
}

const char *pbc_unpack_both(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, struct vrpc_arena *a,
                            bool *accepted, bool *looped)
{
    ProtobufCMessage *fast = NULL;
    const char *r = NULL;
    *accepted = false;
    *looped = false;
    vrpc_arena_reset(a);
    int rc = vrpc_pb_unpack(d, buf, len, 0, a, &fast);
    if (rc == -ELOOP) {
        *looped = true;
        return NULL;
    }
    ProtobufCMessage *ref = protobuf_c_message_unpack(d, NULL, len, buf);
    if (!ref)
        return rc == -EBADMSG ? NULL : differ(NULL, "protobuf-c refuses, vrpc_pb_unpack does not say -EBADMSG");
    if (rc)
        r = differ(NULL, "protobuf-c accepts, vrpc_pb_unpack refuses");
    else if (!(r = pbc_diff_fields(fast, ref)) && !(r = pbc_pack_both(fast)) && !(r = pbc_pack_both(ref)))
        r = same_encoding(fast, ref);
    *accepted = r == NULL;
    protobuf_c_message_free_unpacked(ref, NULL);
    return r;
}

/* ---- random messages ---------------------------------------------------------- */

static uint64_t next_u64(uint64_t (*next)(void *), void *ctx)
{
    static const uint64_t edge[] = {0,           1,
                                    127,         128,
                                    16383,       16384,
                                    0x7fffffff,  0x80000000,
                                    0xffffffff,  0x100000000ull,
                                    INT64_MAX,   (uint64_t)INT64_MIN,
                                    UINT64_MAX,  (uint64_t)-1 - 1,
                                    (uint64_t)-3};
    switch (next(ctx) % 4) {
    case 0:
        return edge[next(ctx) % (sizeof(edge) / sizeof(edge[0]))];
    case 1:
        return next(ctx) % 300;
    case 2:
        return next(ctx) >> (next(ctx) % 64);
    default:
        return next(ctx);
    }
}

static char strpool[64][48];
static uint8_t bytepool[64][48];
static unsigned pooled;

static void next_string_bytes(uint64_t (*next)(void *), void *ctx, char **s, ProtobufCBinaryData *b)
{
    unsigned k = pooled++ % 64, n = (unsigned)(next(ctx) % 40);
    if (next(ctx) % 5 == 0)
        n = 0;
    for (unsigned i = 0; i < n; i++) {
        strpool[k][i] = (char)(1 + next(ctx) % 255); /* any byte but NUL, invalid UTF-8 included */
        bytepool[k][i] = (uint8_t)next(ctx);
    }
    strpool[k][n] = 0;
    if (s)
        *s = strpool[k];
    if (b) {
        b->len = n;
        b->data = n || next(ctx) % 2 ? bytepool[k] : NULL;
    }
}

void pbc_fill(ProtobufCMessage *msg, uint64_t (*next)(void *), void *ctx)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *m = (char *)msg + f->offset;
        if (next(ctx) % 4 == 0)
            continue;                                /* leave as initialised */
        if (f->label == PROTOBUF_C_LABEL_REPEATED) { /* NotFlat: repeated int32 */
            static int32_t rv[3] = {1, -1, 300};
            if (f->type != PROTOBUF_C_TYPE_INT32)
                continue;
            *(size_t *)((char *)msg + f->quantifier_offset) = (size_t)(next(ctx) % 4);
            *(int32_t **)m = rv;
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) { /* Node: a child with a value */
            static Vrpctest__Node child = VRPCTEST__NODE__INIT;
            child.value = 5;
            if (f->descriptor != &vrpctest__node__descriptor)
                continue;
            *(ProtobufCMessage **)m = next(ctx) % 2 ? &child.base : NULL;
            continue;
        }
        uint64_t v = next_u64(next, ctx);
        switch (f->type) {
        case PROTOBUF_C_TYPE_FLOAT: {
            static const float fe[] = {0.0f, -0.0f, 1.5f, -2.25f, 1e30f, INFINITY, NAN};
            float x = fe[next(ctx) % 7];
            memcpy(m, &x, 4);
            break;
        }
        case PROTOBUF_C_TYPE_DOUBLE: {
            static const double de[] = {0.0, -0.0, 1.5, -2.25, 1e300, -INFINITY, NAN};
            double x = de[next(ctx) % 7];
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
        case PROTOBUF_C_TYPE_BOOL: /* any non-zero is true */
            *(protobuf_c_boolean *)m = (protobuf_c_boolean)(next(ctx) % 3 ? next(ctx) % 2 : 2 + next(ctx) % 300);
            break;
        case PROTOBUF_C_TYPE_ENUM: {
            static const int32_t ev[] = {0, 1, -3, -2, 7};
            *(int32_t *)m = ev[next(ctx) % 5];
            break;
        }
        case PROTOBUF_C_TYPE_STRING:
            if (next(ctx) % 6 == 0)
                *(char **)m = NULL;
            else
                next_string_bytes(next, ctx, (char **)m, NULL);
            break;
        case PROTOBUF_C_TYPE_BYTES:
            next_string_bytes(next, ctx, NULL, (ProtobufCBinaryData *)m);
            break;
        default: { /* 32-bit integers */
            uint32_t x = (uint32_t)v;
            memcpy(m, &x, 4);
            break;
        }
        }
        if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset)
            *(protobuf_c_boolean *)((char *)msg + f->quantifier_offset) = (protobuf_c_boolean)(next(ctx) % 3 != 0);
    }
}
