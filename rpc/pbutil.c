/* protobuf-c guards: depth pre-check, arena unpack, bounded pack. */
#include "rpc/pbutil.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static int read_varint(const uint8_t *p, size_t len, size_t *off, uint64_t *v)
{
    uint64_t r = 0;
    for (unsigned i = 0; i < 10; i++) {
        if (*off >= len)
            return -EBADMSG;
        uint8_t b = p[(*off)++];
        r |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return -EBADMSG;
}

static int check(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, unsigned depth,
                 unsigned max_depth)
{
    size_t off = 0;

    if (depth > max_depth)
        return -ELOOP;
    while (off < len) {
        uint64_t tag, v;
        if (read_varint(p, len, &off, &tag))
            return -EBADMSG;
        uint64_t field = tag >> 3;
        if (field == 0 || field > 0x1fffffff)
            return -EBADMSG;
        switch (tag & 7) {
        case 0:
            if (read_varint(p, len, &off, &v))
                return -EBADMSG;
            break;
        case 1:
            if (len - off < 8)
                return -EBADMSG;
            off += 8;
            break;
        case 5:
            if (len - off < 4)
                return -EBADMSG;
            off += 4;
            break;
        case 2: {
            if (read_varint(p, len, &off, &v) || v > len - off)
                return -EBADMSG;
            const ProtobufCFieldDescriptor *f =
                d ? protobuf_c_message_descriptor_get_field(d, (unsigned)field) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                int rc = check(f->descriptor, p + off, (size_t)v, depth + 1, max_depth);
                if (rc)
                    return rc;
            }
            off += (size_t)v;
            break;
        }
        default: /* groups (3, 4) and reserved wire types */
            return -EBADMSG;
        }
    }
    return 0;
}

int vrpc_pb_check_depth(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                        unsigned max_depth)
{
    return check(d, buf, len, 1, max_depth ? max_depth : VRPC_PB_DEFAULT_MAX_DEPTH);
}

/* ---- flat messages ----------------------------------------------------------
 * A flat message type has only singular fields (not repeated, not in a
 * oneof) of scalar, enum, string or bytes type, at most FLAT_MAX_FIELDS of
 * them: the shape of most requests and replies. For these, size, pack and
 * unpack run here instead of through protobuf-c's generic code, which was
 * about 1,000 of the ~4,500-5,000 user-space instructions per side of a 32 B
 * echo call (callgrind). The rules are protobuf-c 1.4.1's and the results
 * the same, byte for byte and field for field (test_pbflat checks every type
 * against protobuf-c, on random messages and on random and mutated input).
 * Unpacking, anything unusual (an unknown field, a wire type that does not
 * match, an over-long varint or tag, a missing required field) hands the
 * whole input to protobuf-c, which decides as it always did. */

#define FLAT_MAX_FIELDS 32

static inline bool flat_field(const ProtobufCFieldDescriptor *f)
{
    return f->label != PROTOBUF_C_LABEL_REPEATED && !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
           f->type != PROTOBUF_C_TYPE_MESSAGE;
}

bool vrpc_pb_flat(const ProtobufCMessageDescriptor *d)
{
    if (d->n_fields > FLAT_MAX_FIELDS)
        return false;
    for (unsigned i = 0; i < d->n_fields; i++)
        if (!flat_field(&d->fields[i]))
            return false;
    return true;
}

static inline size_t vsize(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint32_t zz32(int32_t v) { return ((uint32_t)v << 1) ^ (uint32_t)(v >> 31); }
static inline uint64_t zz64(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline unsigned wire_type(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return 5;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 1;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
        return 2;
    default:
        return 0;
    }
}

/* Whether protobuf-c packs the field: required always; optional by its has_
 * member, or for a string by a pointer that is neither NULL nor the default;
 * proto3's unlabelled fields unless zero, empty or NULL. */
static inline __attribute__((always_inline)) bool flat_present(const ProtobufCFieldDescriptor *f, const char *msg)
{
    const char *m = msg + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REQUIRED)
        return true;
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            const char *str = *(char *const *)m;
            return str && str != f->default_value;
        }
        return *(const protobuf_c_boolean *)(msg + f->quantifier_offset) != 0;
    }
    switch (f->type) {
    case PROTOBUF_C_TYPE_FLOAT:
        return *(const float *)m != 0;
    case PROTOBUF_C_TYPE_DOUBLE:
        return *(const double *)m != 0;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return *(const uint64_t *)m != 0;
    case PROTOBUF_C_TYPE_STRING: {
        const char *str = *(char *const *)m;
        return str && *str;
    }
    case PROTOBUF_C_TYPE_BYTES:
        return ((const ProtobufCBinaryData *)m)->len != 0;
    default: /* 32-bit integers, bool, enum */
        return *(const uint32_t *)m != 0;
    }
}

/* Bytes of the field's value (without its tag). */
static inline size_t flat_value_size(const ProtobufCFieldDescriptor *f, const char *m)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_ENUM: {
        int32_t v = *(const int32_t *)m;
        return v < 0 ? 10 : vsize((uint32_t)v);
    }
    case PROTOBUF_C_TYPE_SINT32:
        return vsize(zz32(*(const int32_t *)m));
    case PROTOBUF_C_TYPE_UINT32:
        return vsize(*(const uint32_t *)m);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT64:
        return vsize(*(const uint64_t *)m);
    case PROTOBUF_C_TYPE_SINT64:
        return vsize(zz64(*(const int64_t *)m));
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return 4;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return 1;
    case PROTOBUF_C_TYPE_STRING: {
        const char *str = *(char *const *)m;
        size_t n = str ? strlen(str) : 0;
        return vsize(n) + n;
    }
    default: { /* BYTES */
        const ProtobufCBinaryData *bd = (const ProtobufCBinaryData *)m;
        return vsize(bd->len) + bd->len;
    }
    }
}

/* The packed size, or protobuf-c's if the message is not flat. */
static size_t flat_size(const ProtobufCMessage *msg)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    size_t n = 0;
    if (msg->n_unknown_fields || d->n_fields > FLAT_MAX_FIELDS)
        return protobuf_c_message_get_packed_size(msg);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (!flat_field(f))
            return protobuf_c_message_get_packed_size(msg);
        if (flat_present(f, (const char *)msg))
            n += vsize((uint64_t)f->id << 3) + flat_value_size(f, (const char *)msg + f->offset);
    }
    return n;
}

/* Pack, or have protobuf-c pack if the message is not flat. What was
 * written by then is the same prefix protobuf-c writes again (same fields,
 * same order), so the caller's size check holds either way. */
static size_t flat_pack(const ProtobufCMessage *msg, uint8_t *out)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    uint8_t *p = out;
    if (msg->n_unknown_fields || d->n_fields > FLAT_MAX_FIELDS)
        return protobuf_c_message_pack(msg, out);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *m = (const char *)msg + f->offset;
        if (!flat_field(f))
            return protobuf_c_message_pack(msg, out);
        if (!flat_present(f, (const char *)msg))
            continue;
        p = put_varint(p, ((uint64_t)f->id << 3) | wire_type(f->type));
        switch (f->type) {
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_ENUM: /* negative: sign-extended, 10 bytes */
            p = put_varint(p, (uint64_t)(int64_t) * (const int32_t *)m);
            break;
        case PROTOBUF_C_TYPE_SINT32:
            p = put_varint(p, zz32(*(const int32_t *)m));
            break;
        case PROTOBUF_C_TYPE_UINT32:
            p = put_varint(p, *(const uint32_t *)m);
            break;
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_UINT64:
            p = put_varint(p, *(const uint64_t *)m);
            break;
        case PROTOBUF_C_TYPE_SINT64:
            p = put_varint(p, zz64(*(const int64_t *)m));
            break;
        case PROTOBUF_C_TYPE_SFIXED32:
        case PROTOBUF_C_TYPE_FIXED32:
        case PROTOBUF_C_TYPE_FLOAT: /* little-endian hosts (x86-64, arm64), as protobuf-c's memcpy */
            memcpy(p, m, 4);
            p += 4;
            break;
        case PROTOBUF_C_TYPE_SFIXED64:
        case PROTOBUF_C_TYPE_FIXED64:
        case PROTOBUF_C_TYPE_DOUBLE:
            memcpy(p, m, 8);
            p += 8;
            break;
        case PROTOBUF_C_TYPE_BOOL:
            *p++ = *(const protobuf_c_boolean *)m ? 1 : 0;
            break;
        case PROTOBUF_C_TYPE_STRING: {
            const char *str = *(char *const *)m;
            size_t n = str ? strlen(str) : 0;
            p = put_varint(p, n);
            if (n)
                memcpy(p, str, n);
            p += n;
            break;
        }
        default: { /* BYTES */
            const ProtobufCBinaryData *bd = (const ProtobufCBinaryData *)m;
            p = put_varint(p, bd->len);
            if (bd->len)
                memcpy(p, bd->data, bd->len);
            p += bd->len;
            break;
        }
        }
    }
    return (size_t)(p - out);
}

/* As protobuf-c's unpack initialises a message: zeroes, then each field's
 * default value, if it has one. */
static void flat_init(const ProtobufCMessageDescriptor *d, ProtobufCMessage *msg)
{
    memset(msg, 0, d->sizeof_message);
    msg->descriptor = d;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *m = (char *)msg + f->offset;
        const void *dv = f->default_value;
        if (!dv || f->label == PROTOBUF_C_LABEL_REPEATED)
            continue;
        switch (f->type) {
        case PROTOBUF_C_TYPE_SFIXED64:
        case PROTOBUF_C_TYPE_FIXED64:
        case PROTOBUF_C_TYPE_DOUBLE:
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_UINT64:
            memcpy(m, dv, 8);
            break;
        case PROTOBUF_C_TYPE_BYTES:
            memcpy(m, dv, sizeof(ProtobufCBinaryData));
            break;
        case PROTOBUF_C_TYPE_STRING:
        case PROTOBUF_C_TYPE_MESSAGE:
            *(const void **)m = dv;
            break;
        default: /* 32-bit integers, float, bool, enum */
            memcpy(m, dv, 4);
            break;
        }
    }
}

/* A varint of at most max bytes at p[*off..len): its value, and whether any
 * of its 7-bit groups is non-zero (protobuf-c's bool, which also counts bits
 * beyond the 64th). 0, or 1 (over-long or truncated). */
static inline int flat_varint(const uint8_t *p, size_t len, size_t *off, unsigned max, uint64_t *v, bool *nz)
{
    uint64_t r = 0;
    unsigned orbits = 0;
    for (unsigned i = 0; i < max && *off < len; i++) {
        uint8_t b = p[(*off)++];
        orbits |= b & 0x7f;
        r |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = r;
            *nz = orbits != 0;
            return 0;
        }
    }
    return 1;
}

#define FLAT_FALLBACK 1

/* Unpack a message whose fields on the wire are all flat (of any type of at
 * most FLAT_MAX_FIELDS fields: absent repeated, message and oneof fields are
 * left as protobuf-c leaves them, empty) into the arena; string and bytes
 * values are copied, except bytes values of at least ref_min bytes (0:
 * none), which point into buf. 0, -ENOMEM, or FLAT_FALLBACK (nothing kept
 * in the arena). */
static int flat_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, size_t ref_min,
                       struct vrpc_arena *a, ProtobufCMessage **out)
{
    const uint8_t *val[FLAT_MAX_FIELDS];
    size_t vlen[FLAT_MAX_FIELDS];
    uint32_t seen = 0, strs = 0;
    size_t mark = a->used, off = 0;
    struct vrpc_arena_chunk *extra = a->extra;
    ProtobufCMessage *msg;

    if (d->n_fields > FLAT_MAX_FIELDS)
        return FLAT_FALLBACK;
    if (!(msg = vrpc_arena_alloc(a, d->sizeof_message)))
        return -ENOMEM;
    flat_init(d, msg);
    while (off < len) {
        uint64_t t, v;
        bool nz;
        if (flat_varint(buf, len, &off, 5, &t, &nz))
            goto fallback;
        uint32_t id = (uint32_t)(t >> 3);
        unsigned i = 0;
        while (i < d->n_fields && d->fields[i].id != id)
            i++;
        if (i == d->n_fields || id == 0)
            goto fallback; /* unknown: protobuf-c keeps it */
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *m = (char *)msg + f->offset;
        if (!flat_field(f) || (t & 7) != wire_type(f->type))
            goto fallback;
        switch (t & 7) {
        case 0:
            if (flat_varint(buf, len, &off, 10, &v, &nz))
                goto fallback;
            switch (f->type) {
            case PROTOBUF_C_TYPE_SINT32: {
                uint32_t u = (uint32_t)v;
                *(int32_t *)m = (int32_t)((u >> 1) ^ (0u - (u & 1)));
                break;
            }
            case PROTOBUF_C_TYPE_SINT64:
                *(int64_t *)m = (int64_t)((v >> 1) ^ (0ull - (v & 1)));
                break;
            case PROTOBUF_C_TYPE_INT64:
            case PROTOBUF_C_TYPE_UINT64:
                *(uint64_t *)m = v;
                break;
            case PROTOBUF_C_TYPE_BOOL:
                *(protobuf_c_boolean *)m = nz;
                break;
            default: /* int32, uint32, enum: the low 32 bits */
                *(uint32_t *)m = (uint32_t)v;
                break;
            }
            break;
        case 1:
            if (len - off < 8)
                goto fallback;
            memcpy(m, buf + off, 8);
            off += 8;
            break;
        case 5:
            if (len - off < 4)
                goto fallback;
            memcpy(m, buf + off, 4);
            off += 4;
            break;
        default: /* 2: string or bytes, copied below (the last occurrence wins) */
            if (flat_varint(buf, len, &off, 5, &v, &nz) || v > len - off)
                goto fallback;
            val[i] = buf + off;
            vlen[i] = (size_t)v;
            strs |= 1u << i;
            off += (size_t)v;
            break;
        }
        seen |= 1u << i;
    }
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (!(seen & (1u << i))) {
            if (f->label == PROTOBUF_C_LABEL_REQUIRED)
                goto fallback; /* protobuf-c refuses it */
            continue;
        }
        if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset)
            *(protobuf_c_boolean *)((char *)msg + f->quantifier_offset) = 1;
        if (!(strs & (1u << i)))
            continue;
        char *m = (char *)msg + f->offset;
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            char *str = vrpc_arena_alloc(a, vlen[i] + 1);
            if (!str)
                return -ENOMEM;
            memcpy(str, val[i], vlen[i]);
            str[vlen[i]] = 0;
            *(char **)m = str;
        } else {
            ProtobufCBinaryData *bd = (ProtobufCBinaryData *)m;
            bd->len = vlen[i];
            if (!vlen[i]) {
                bd->data = NULL;
            } else if (ref_min && vlen[i] >= ref_min) {
                bd->data = (uint8_t *)val[i];
            } else {
                if (!(bd->data = vrpc_arena_alloc(a, vlen[i])))
                    return -ENOMEM;
                memcpy(bd->data, val[i], vlen[i]);
            }
        }
    }
    *out = msg;
    return 0;
fallback:
    if (a->extra == extra)
        a->used = mark; /* give the message's memory back */
    return FLAT_FALLBACK;
}

/* A message type without message-typed fields cannot nest: its unpack
 * recursion is one level deep whatever the bytes say. */
static int may_nest(const ProtobufCMessageDescriptor *d)
{
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].type == PROTOBUF_C_TYPE_MESSAGE)
            return 1;
    return 0;
}

int vrpc_pb_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                   unsigned max_depth, struct vrpc_arena *a, ProtobufCMessage **out)
{
    int rc;
    if ((rc = flat_unpack(d, buf, len, 0, a, out)) != FLAT_FALLBACK)
        return rc;
    rc = may_nest(d) ? vrpc_pb_check_depth(d, buf, len, max_depth) : 0;
    if (rc)
        return rc;
    ProtobufCMessage *m = protobuf_c_message_unpack(d, &a->pb, len, buf);
    if (!m)
        return a->limit && a->used + a->extra_total >= a->limit ? -ENOMEM : -EBADMSG;
    *out = m;
    return 0;
}

/* A top-level bytes value vrpc_pb_unpack_ref references instead of copying. */
struct big {
    const ProtobufCFieldDescriptor *f;
    size_t tag, lenpos, data, len; /* offsets in buf: the tag, its length varint, the value */
    bool last;                     /* no later occurrence of the field: its value wins */
};
#define MAX_BIG 8

static bool referable(const ProtobufCFieldDescriptor *f)
{
    return f && f->type == PROTOBUF_C_TYPE_BYTES && f->label != PROTOBUF_C_LABEL_REPEATED &&
           !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF);
}

int vrpc_pb_unpack_ref(const ProtobufCMessageDescriptor *d, uint8_t *buf, size_t len, unsigned max_depth,
                       struct vrpc_arena *a, ProtobufCMessage **out)
{
    struct big big[MAX_BIG];
    unsigned nbig = 0;
    size_t off = 0, cut = 0;
    int frc;

    if ((frc = flat_unpack(d, buf, len, VRPC_PB_REF_MIN, a, out)) != FLAT_FALLBACK)
        return frc;

    /* Find the big values: one walk over the top level. A malformed message
     * is left to the plain unpack to refuse. */
    while (off < len) {
        size_t tag = off;
        uint64_t t, v;
        if (read_varint(buf, len, &off, &t))
            return vrpc_pb_unpack(d, buf, len, max_depth, a, out);
        uint32_t field = (uint32_t)(t >> 3);
        for (unsigned i = 0; i < nbig; i++)
            if (big[i].f->id == field)
                big[i].last = false;
        switch (t & 7) {
        case 0:
            if (read_varint(buf, len, &off, &v))
                return vrpc_pb_unpack(d, buf, len, max_depth, a, out);
            break;
        case 1:
            off += 8;
            break;
        case 5:
            off += 4;
            break;
        case 2: {
            size_t lenpos = off;
            if (read_varint(buf, len, &off, &v) || v > len - off)
                return vrpc_pb_unpack(d, buf, len, max_depth, a, out);
            const ProtobufCFieldDescriptor *f =
                v >= VRPC_PB_REF_MIN && nbig < MAX_BIG && field > 0 && field <= 0x1fffffff
                    ? protobuf_c_message_descriptor_get_field(d, field) : NULL;
            if (referable(f)) {
                big[nbig++] = (struct big){.f = f, .tag = tag, .lenpos = lenpos, .data = off, .len = (size_t)v,
                                           .last = true};
                cut += off - lenpos + (size_t)v - 1; /* the value and its length become one 0 byte */
            }
            off += (size_t)v;
            break;
        }
        default:
            return vrpc_pb_unpack(d, buf, len, max_depth, a, out);
        }
    }
    if (off != len || !nbig)
        return vrpc_pb_unpack(d, buf, len, max_depth, a, out);
    int rc = may_nest(d) ? vrpc_pb_check_depth(d, buf, len, max_depth) : 0;
    if (rc)
        return rc;
    /* The compact copy: everything but the big values, each now empty. */
    size_t clen = len - cut, at = 0, from = 0;
    uint8_t *c = vrpc_arena_alloc(a, clen ? clen : 1);
    if (!c)
        return -ENOMEM;
    for (unsigned i = 0; i < nbig; i++) {
        memcpy(c + at, buf + from, big[i].lenpos - from);
        at += big[i].lenpos - from;
        c[at++] = 0;
        from = big[i].data + big[i].len;
    }
    memcpy(c + at, buf + from, len - from);
    ProtobufCMessage *m = protobuf_c_message_unpack(d, &a->pb, clen, c);
    if (!m)
        return a->limit && a->used + a->extra_total >= a->limit ? -ENOMEM : -EBADMSG;
    for (unsigned i = 0; i < nbig; i++) {
        if (!big[i].last)
            continue; /* a later occurrence of the field gave its value */
        ProtobufCBinaryData *bd = (ProtobufCBinaryData *)((char *)m + big[i].f->offset);
        bd->data = buf + big[i].data;
        bd->len = big[i].len;
    }
    *out = m;
    return 0;
}

size_t vrpc_pb_packed_size(const ProtobufCMessage *msg)
{
    return flat_size(msg);
}

long vrpc_pb_size(const ProtobufCMessage *msg, size_t cap)
{
    size_t n = flat_size(msg);
    return n > cap ? -EMSGSIZE : (long)n;
}

int vrpc_pb_pack(const ProtobufCMessage *msg, uint8_t *out, size_t cap, size_t *len)
{
    long n = vrpc_pb_size(msg, cap);
    if (n < 0)
        return (int)n;
    *len = vrpc_pb_pack_sized(msg, out);
    return 0;
}

size_t vrpc_pb_pack_sized(const ProtobufCMessage *msg, uint8_t *out)
{
    return flat_pack(msg, out);
}

/* ---- gathered pack --------------------------------------------------------- */

#define GATHER_CAND_MAX (VRPC_GRANT_SEGS_MAX / 2)

struct gbuf {
    ProtobufCBuffer base;
    struct vrpc_pb_gather *g;
    uint8_t *buf;
    size_t cap;
    bool last_copy; /* the last segment is a copy piece that may grow */
    /* Top-level bytes values that may be referenced: protobuf-c appends a
     * bytes value by its own pointer, but a nested message through a
     * temporary buffer that is freed right after, so only an append of
     * exactly one of these (pointer and length) is taken by reference. */
    const ProtobufCBinaryData *cand[GATHER_CAND_MAX];
    unsigned ncand;
};

static bool gather_is_cand(const struct gbuf *b, size_t len, const uint8_t *data)
{
    for (unsigned i = 0; i < b->ncand; i++)
        if (b->cand[i]->data == data && b->cand[i]->len == len)
            return true;
    return false;
}

static void gather_append(ProtobufCBuffer *base, size_t len, const uint8_t *data)
{
    struct gbuf *b = (struct gbuf *)base;
    struct vrpc_pb_gather *g = b->g;
    if (len == 0 || g->err)
        return;
    g->total += len;
    /* a reference needs its own segment and leaves one for what follows */
    if (len <= UINT32_MAX && g->nsegs + 2 <= VRPC_GRANT_SEGS_MAX && gather_is_cand(b, len, data)) {
        g->segs[g->nsegs].addr = data;
        g->segs[g->nsegs].len = (uint32_t)len;
        g->nsegs++;
        g->nrefs++;
        b->last_copy = false;
        return;
    }
    if (len > b->cap - g->copied && b->buf) {
        g->err = -EMSGSIZE;
        return;
    }
    if (b->buf) {
        memcpy(b->buf + g->copied, data, len);
        if (b->last_copy) {
            g->segs[g->nsegs - 1].len += (uint32_t)len;
        } else {
            g->segs[g->nsegs].addr = b->buf + g->copied;
            g->segs[g->nsegs].len = (uint32_t)len;
            g->nsegs++;
        }
    } else if (!b->last_copy) {
        g->nsegs++;
    }
    b->last_copy = true;
    g->copied += len;
}

static void gather_candidates(struct gbuf *b, const ProtobufCMessage *msg, size_t min_ref)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    for (unsigned i = 0; i < d->n_fields && b->ncand < GATHER_CAND_MAX; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *member = (const char *)msg + f->offset;
        if (f->type != PROTOBUF_C_TYPE_BYTES || (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)((const char *)msg + f->quantifier_offset);
            const ProtobufCBinaryData *arr = *(const ProtobufCBinaryData *const *)member;
            for (size_t k = 0; k < n && b->ncand < GATHER_CAND_MAX; k++)
                if (arr[k].len >= min_ref)
                    b->cand[b->ncand++] = &arr[k];
        } else if (((const ProtobufCBinaryData *)member)->len >= min_ref) {
            b->cand[b->ncand++] = (const ProtobufCBinaryData *)member;
        }
    }
}

int vrpc_pb_pack_gather(const ProtobufCMessage *msg, size_t min_ref, uint8_t *buf, size_t cap,
                        struct vrpc_pb_gather *g)
{
    struct gbuf b = {.base = {.append = gather_append}, .g = g, .buf = buf, .cap = buf ? cap : 0};
    memset(g, 0, sizeof(*g));
    gather_candidates(&b, msg, min_ref ? min_ref : 1);
    protobuf_c_message_pack_to_buffer(msg, &b.base);
    return g->err;
}
