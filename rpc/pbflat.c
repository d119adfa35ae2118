/* Flat-message codec: see pbflat.h.
 *
 * protobuf-c's pack and unpack interpret the message descriptor field by
 * field (label, type, presence rules, a scan pass and a parse pass when
 * unpacking). Most RPC messages are flat, so this file compiles each type's
 * descriptor once into a plan (per field: member offsets, a presence rule, a
 * value kind, the encoded tag) kept in a small lock-free table, and sizes,
 * packs and unpacks from it. The rules are protobuf-c 1.4.1's, and so are
 * the results, byte for byte and field for field: tests/rpc/test_pbflat.c
 * checks every field type against protobuf-c on random messages and on
 * random and mutated input. Anything this code does not handle exactly as
 * protobuf-c would goes to protobuf-c. */
#include "rpc/pbflat.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Under emulation (the Soft-RoCE VM runs qemu TCG) an indirect jump costs a
 * lookup of the translated target, so the per-field switches here compile to
 * compare trees instead of jump tables. */
#if defined(__clang__)
#define NO_JUMP_TABLES /* clang has no per-function switch for it (-fno-jump-tables is per file) */
#else
#define NO_JUMP_TABLES __attribute__((optimize("no-jump-tables")))
#endif

enum kind { K_I32, K_U32, K_S32, K_64, K_S64, K_F32, K_F64, K_BOOL, K_STR, K_BYTES, K_OTHER };

/* When protobuf-c packs a field: required always; optional by its has_
 * member, or for a string by a pointer neither NULL nor the default; proto3's
 * unlabelled fields unless zero, empty or NULL. */
enum pres { P_ALWAYS, P_HAS, P_STRPTR, P_NZ32, P_NZ64, P_NZF, P_NZD, P_NZSTR, P_NZBYTES, P_NEVER };

struct fop {
    uint32_t off;  /* the member */
    uint32_t qoff; /* an optional field's has_ member, else 0 */
    uint32_t id;
    uint8_t kind, pres, wt, taglen;
    uint8_t tag[5];   /* (id << 3 | wire type) as a varint */
    const void *dflt; /* P_STRPTR: the default string */
};

struct plan {
    const ProtobufCMessageDescriptor *d;
    bool packable;   /* every field flat */
    bool plain_init; /* no defaults: the initial message is zeroes */
    uint8_t n;
    uint32_t req_mask; /* required fields, by index */
    int8_t by_id[64];  /* field index of id < 64, or -1 */
    struct fop f[VRPC_PBFLAT_MAX_FIELDS];
};

/* ---- plans -------------------------------------------------------------------
 * Open addressing over descriptor addresses, filled under a mutex once per
 * type, read without locks (a slot is published with release, never
 * changed). Types that find no slot go to protobuf-c. */

#define PLAN_SLOTS 256u
#define PLAN_PROBE 16u

static struct plan *plans[PLAN_SLOTS];
static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

/* Per field type: value kind, wire type, and presence of a proto3
 * (unlabelled) field. */
static const struct type_rule {
    uint8_t kind, wt, pres;
} by_type[] = {
    [PROTOBUF_C_TYPE_INT32] = {K_I32, 0, P_NZ32},    [PROTOBUF_C_TYPE_SINT32] = {K_S32, 0, P_NZ32},
    [PROTOBUF_C_TYPE_SFIXED32] = {K_F32, 5, P_NZ32}, [PROTOBUF_C_TYPE_INT64] = {K_64, 0, P_NZ64},
    [PROTOBUF_C_TYPE_SINT64] = {K_S64, 0, P_NZ64},   [PROTOBUF_C_TYPE_SFIXED64] = {K_F64, 1, P_NZ64},
    [PROTOBUF_C_TYPE_UINT32] = {K_U32, 0, P_NZ32},   [PROTOBUF_C_TYPE_FIXED32] = {K_F32, 5, P_NZ32},
    [PROTOBUF_C_TYPE_UINT64] = {K_64, 0, P_NZ64},    [PROTOBUF_C_TYPE_FIXED64] = {K_F64, 1, P_NZ64},
    [PROTOBUF_C_TYPE_FLOAT] = {K_F32, 5, P_NZF},     [PROTOBUF_C_TYPE_DOUBLE] = {K_F64, 1, P_NZD},
    [PROTOBUF_C_TYPE_BOOL] = {K_BOOL, 0, P_NZ32},    [PROTOBUF_C_TYPE_ENUM] = {K_I32, 0, P_NZ32},
    [PROTOBUF_C_TYPE_STRING] = {K_STR, 2, P_NZSTR},  [PROTOBUF_C_TYPE_BYTES] = {K_BYTES, 2, P_NZBYTES},
};

/* Singular, not in a oneof, of a type in by_type (not a message, nor a type
 * a later protobuf-c might add). */
static inline bool flat_field(const ProtobufCFieldDescriptor *f)
{
    return f->label != PROTOBUF_C_LABEL_REPEATED && !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
           (unsigned)f->type < sizeof(by_type) / sizeof(by_type[0]);
}

bool vrpc_pbflat_type(const ProtobufCMessageDescriptor *d)
{
    if (d->n_fields > VRPC_PBFLAT_MAX_FIELDS)
        return false;
    for (unsigned i = 0; i < d->n_fields; i++)
        if (!flat_field(&d->fields[i]))
            return false;
    return true;
}

static void compile(struct plan *p, const ProtobufCMessageDescriptor *d)
{
    p->d = d;
    p->n = (uint8_t)d->n_fields;
    p->packable = true;
    p->plain_init = true;
    memset(p->by_id, -1, sizeof(p->by_id));
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        struct fop *op = &p->f[i];
        op->off = f->offset;
        op->id = f->id;
        if (f->default_value && f->label != PROTOBUF_C_LABEL_REPEATED)
            p->plain_init = false;
        if (f->id < 64)
            p->by_id[f->id] = (int8_t)i;
        if (!flat_field(f)) {
            op->kind = K_OTHER;
            op->pres = P_NEVER;
            p->packable = false;
            continue;
        }
        const struct type_rule *r = &by_type[f->type];
        op->kind = r->kind, op->wt = r->wt, op->pres = r->pres;
        if (f->label == PROTOBUF_C_LABEL_REQUIRED) {
            op->pres = P_ALWAYS;
            p->req_mask |= 1u << i;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
            op->qoff = f->quantifier_offset;
            if (f->type == PROTOBUF_C_TYPE_STRING)
                op->pres = P_STRPTR, op->dflt = f->default_value;
            else
                op->pres = P_HAS;
        }
        uint32_t t = f->id << 3 | op->wt;
        op->taglen = 0;
        while (t >= 0x80) {
            op->tag[op->taglen++] = (uint8_t)(t | 0x80);
            t >>= 7;
        }
        op->tag[op->taglen++] = (uint8_t)t;
    }
}

static const struct plan *plan_build(const ProtobufCMessageDescriptor *d, unsigned h)
{
    const struct plan *found = NULL;
    pthread_mutex_lock(&plan_lock);
    for (unsigned k = 0; k < PLAN_PROBE; k++) {
        struct plan *p = plans[(h + k) % PLAN_SLOTS];
        if (p && p->d == d) {
            found = p;
            break;
        }
        if (!p) {
            struct plan *np = calloc(1, sizeof(*np));
            if (np) {
                compile(np, d);
                __atomic_store_n(&plans[(h + k) % PLAN_SLOTS], np, __ATOMIC_RELEASE);
            }
            found = np;
            break;
        }
    }
    pthread_mutex_unlock(&plan_lock);
    return found;
}

/* The plan of d, or NULL (not a type this codec takes, or no slot left). */
static inline const struct plan *plan_get(const ProtobufCMessageDescriptor *d)
{
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    (void)d;
    return NULL; /* fixed-width values are copied as they are in memory */
#else
    if (d->n_fields > VRPC_PBFLAT_MAX_FIELDS)
        return NULL;
    uint64_t x = (uint64_t)(uintptr_t)d * 0x9e3779b97f4a7c15ull;
    unsigned h = (unsigned)(x >> 56);
    for (unsigned k = 0; k < PLAN_PROBE; k++) {
        const struct plan *p = __atomic_load_n(&plans[(h + k) % PLAN_SLOTS], __ATOMIC_ACQUIRE);
        if (!p)
            return plan_build(d, h);
        if (p->d == d)
            return p;
    }
    return NULL;
#endif
}

/* ---- size and pack ------------------------------------------------------------ */

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

static inline NO_JUMP_TABLES bool present(const struct fop *op, const char *msg)
{
    const char *m = msg + op->off;
    switch (op->pres) {
    case P_ALWAYS:
        return true;
    case P_HAS:
        return *(const protobuf_c_boolean *)(msg + op->qoff) != 0;
    case P_STRPTR: {
        const char *s = *(char *const *)m;
        return s && s != op->dflt;
    }
    case P_NZ32:
        return *(const uint32_t *)m != 0;
    case P_NZ64:
        return *(const uint64_t *)m != 0;
    case P_NZF:
        return *(const float *)m != 0;
    case P_NZD:
        return *(const double *)m != 0;
    case P_NZSTR: {
        const char *s = *(char *const *)m;
        return s && *s;
    }
    case P_NZBYTES:
        return ((const ProtobufCBinaryData *)m)->len != 0;
    default:
        return false;
    }
}

/* What a varint-kind field puts on the wire: int32 and enum sign-extended
 * (a negative value takes 10 bytes), sint zigzagged, bool 0 or 1. */
static inline NO_JUMP_TABLES uint64_t varint_of(const struct fop *op, const char *m)
{
    switch (op->kind) {
    case K_I32:
        return (uint64_t)(int64_t) * (const int32_t *)m;
    case K_U32:
        return *(const uint32_t *)m;
    case K_S32:
        return zz32(*(const int32_t *)m);
    case K_S64:
        return zz64(*(const int64_t *)m);
    case K_BOOL:
        return *(const protobuf_c_boolean *)m ? 1 : 0;
    default: /* K_64 */
        return *(const uint64_t *)m;
    }
}

NO_JUMP_TABLES size_t vrpc_pbflat_size(const ProtobufCMessage *msg)
{
    const struct plan *p = plan_get(msg->descriptor);
    size_t n = 0;
    if (!p || !p->packable || msg->n_unknown_fields)
        return (size_t)-1;
    for (unsigned i = 0; i < p->n; i++) {
        const struct fop *op = &p->f[i];
        const char *m = (const char *)msg + op->off;
        if (!present(op, (const char *)msg))
            continue;
        n += op->taglen;
        switch (op->kind) {
        case K_F32:
            n += 4;
            break;
        case K_F64:
            n += 8;
            break;
        case K_STR: {
            const char *s = *(char *const *)m;
            size_t l = s ? strlen(s) : 0;
            n += vsize(l) + l;
            break;
        }
        case K_BYTES: {
            size_t l = ((const ProtobufCBinaryData *)m)->len;
            n += vsize(l) + l;
            break;
        }
        default:
            n += vsize(varint_of(op, m));
            break;
        }
    }
    return n;
}

NO_JUMP_TABLES size_t vrpc_pbflat_pack(const ProtobufCMessage *msg, uint8_t *out)
{
    const struct plan *p = plan_get(msg->descriptor);
    uint8_t *o = out;
    if (!p || !p->packable || msg->n_unknown_fields)
        return (size_t)-1;
    for (unsigned i = 0; i < p->n; i++) {
        const struct fop *op = &p->f[i];
        const char *m = (const char *)msg + op->off;
        if (!present(op, (const char *)msg))
            continue;
        if (op->taglen == 1)
            *o++ = op->tag[0];
        else
            memcpy(o, op->tag, op->taglen), o += op->taglen;
        switch (op->kind) {
        case K_F32: /* little-endian host: as protobuf-c's memcpy */
            memcpy(o, m, 4);
            o += 4;
            break;
        case K_F64:
            memcpy(o, m, 8);
            o += 8;
            break;
        case K_STR: {
            const char *s = *(char *const *)m;
            size_t l = s ? strlen(s) : 0;
            o = put_varint(o, l);
            if (l)
                memcpy(o, s, l);
            o += l;
            break;
        }
        case K_BYTES: {
            const ProtobufCBinaryData *bd = (const ProtobufCBinaryData *)m;
            o = put_varint(o, bd->len);
            if (bd->len)
                memcpy(o, bd->data, bd->len);
            o += bd->len;
            break;
        }
        default:
            o = put_varint(o, varint_of(op, m));
            break;
        }
    }
    return (size_t)(o - out);
}

/* ---- unpack -------------------------------------------------------------------- */

/* As protobuf-c's unpack initialises a message: zeroes, then each
 * non-repeated field's default value, if it has one. */
static void init_defaults(const ProtobufCMessageDescriptor *d, ProtobufCMessage *msg)
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
 * beyond the 64th). false if over-long or truncated. */
static inline bool get_varint(const uint8_t *p, size_t len, size_t *off, unsigned max, uint64_t *v, bool *nz)
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
            return true;
        }
    }
    return false;
}

/* The index in p->f of field number id, or -1. */
static inline int field_index(const struct plan *p, uint64_t id)
{
    int idx = -1;
    if (id < 64)
        return p->by_id[id];
    for (unsigned i = 0; i < p->n; i++)
        if (p->f[i].id == id)
            idx = (int)i;
    return idx;
}

/* A string or bytes value at buf[*off..len) into m: 0, -ENOMEM, or
 * VRPC_PBFLAT_FALLBACK if truncated. Bytes of at least ref_min (when not 0)
 * point into buf instead of being copied. */
static inline NO_JUMP_TABLES int unpack_len(const struct fop *op, char *m, const uint8_t *buf, size_t len, size_t *off,
                                            size_t ref_min, struct vrpc_arena *a)
{
    uint64_t v;
    bool nz;
    if (!get_varint(buf, len, off, 5, &v, &nz) || v > len - *off)
        return VRPC_PBFLAT_FALLBACK;
    if (op->kind == K_STR) {
        char *s = vrpc_arena_alloc(a, (size_t)v + 1);
        if (!s)
            return -ENOMEM;
        memcpy(s, buf + *off, (size_t)v);
        s[v] = 0;
        *(char **)m = s;
    } else {
        ProtobufCBinaryData *bd = (ProtobufCBinaryData *)m;
        bd->len = (size_t)v;
        if (!v) {
            bd->data = NULL;
        } else if (ref_min && v >= ref_min) {
            bd->data = (uint8_t *)buf + *off;
        } else {
            if (!(bd->data = vrpc_arena_alloc(a, (size_t)v)))
                return -ENOMEM;
            memcpy(bd->data, buf + *off, (size_t)v);
        }
    }
    *off += (size_t)v;
    return 0;
}

/* A varint-encoded value at buf[*off..len) into m, as its kind stores it;
 * false if over-long or truncated. */
static inline NO_JUMP_TABLES bool unpack_varint(const struct fop *op, char *m, const uint8_t *buf, size_t len,
                                                size_t *off)
{
    uint64_t v;
    bool nz;
    if (!get_varint(buf, len, off, 10, &v, &nz))
        return false;
    switch (op->kind) {
    case K_S32: {
        uint32_t u = (uint32_t)v;
        *(int32_t *)m = (int32_t)((u >> 1) ^ (0u - (u & 1)));
        break;
    }
    case K_S64:
        *(int64_t *)m = (int64_t)((v >> 1) ^ (0ull - (v & 1)));
        break;
    case K_64:
        *(uint64_t *)m = v;
        break;
    case K_BOOL:
        *(protobuf_c_boolean *)m = nz;
        break;
    default: /* int32, uint32, enum: the low 32 bits */
        *(uint32_t *)m = (uint32_t)v;
        break;
    }
    return true;
}

/* One field's value (its tag read, its wire type checked) into m: 0,
 * -ENOMEM, or VRPC_PBFLAT_FALLBACK. */
static inline NO_JUMP_TABLES int unpack_value(const struct fop *op, char *m, const uint8_t *buf, size_t len,
                                              size_t *off, size_t ref_min, struct vrpc_arena *a)
{
    switch (op->kind) {
    case K_F32:
        if (len - *off < 4)
            return VRPC_PBFLAT_FALLBACK;
        memcpy(m, buf + *off, 4);
        *off += 4;
        return 0;
    case K_F64:
        if (len - *off < 8)
            return VRPC_PBFLAT_FALLBACK;
        memcpy(m, buf + *off, 8);
        *off += 8;
        return 0;
    case K_STR:
    case K_BYTES:
        return unpack_len(op, m, buf, len, off, ref_min, a);
    default: /* varints */
        return unpack_varint(op, m, buf, len, off) ? 0 : VRPC_PBFLAT_FALLBACK;
    }
}

/* The fields of buf into msg (initialised): 0, -ENOMEM, or
 * VRPC_PBFLAT_FALLBACK for what protobuf-c must decide. */
static inline NO_JUMP_TABLES int unpack_fields(const struct plan *p, ProtobufCMessage *msg, const uint8_t *buf,
                                               size_t len, size_t ref_min, struct vrpc_arena *a)
{
    size_t off = 0;
    uint32_t seen = 0;
    while (off < len) {
        uint64_t t;
        bool nz;
        if (buf[off] < 0x80)
            t = buf[off++];
        else if (!get_varint(buf, len, &off, 5, &t, &nz))
            return VRPC_PBFLAT_FALLBACK;
        uint64_t id = t >> 3;
        int idx = field_index(p, id);
        if (idx < 0 || id == 0)
            return VRPC_PBFLAT_FALLBACK; /* unknown: protobuf-c keeps it */
        const struct fop *op = &p->f[idx];
        if (op->kind == K_OTHER || (t & 7) != op->wt)
            return VRPC_PBFLAT_FALLBACK;
        int rc = unpack_value(op, (char *)msg + op->off, buf, len, &off, ref_min, a);
        if (rc)
            return rc;
        if (op->qoff)
            *(protobuf_c_boolean *)((char *)msg + op->qoff) = 1;
        seen |= 1u << idx;
    }
    if ((seen & p->req_mask) != p->req_mask)
        return VRPC_PBFLAT_FALLBACK; /* protobuf-c refuses it */
    return 0;
}

NO_JUMP_TABLES int vrpc_pbflat_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                                      size_t ref_min, struct vrpc_arena *a, ProtobufCMessage **out)
{
    const struct plan *p = plan_get(d);
    struct vrpc_arena_mark mark = vrpc_arena_mark(a);
    ProtobufCMessage *msg;

    if (!p)
        return VRPC_PBFLAT_FALLBACK;
    if (!(msg = vrpc_arena_alloc(a, d->sizeof_message)))
        return -ENOMEM;
    if (p->plain_init) {
        memset(msg, 0, d->sizeof_message);
        msg->descriptor = d;
    } else {
        init_defaults(d, msg);
    }
    int rc = unpack_fields(p, msg, buf, len, ref_min, a);
    if (rc == VRPC_PBFLAT_FALLBACK) {
        vrpc_arena_rollback(a, mark); /* give the arena back what was taken */
        return rc;
    }
    if (rc)
        return rc;
    *out = msg;
    return 0;
}
