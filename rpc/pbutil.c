/* protobuf-c guards: depth pre-check, arena unpack, bounded pack. */
#include "rpc/pbutil.h"
#include "rpc/pbflat.h"

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

/* A tag as protobuf-c 1.4.1 reads one (parse_tag_and_wiretype): a varint of
 * at most 5 bytes, not a single byte 0..7; the field number is its value
 * >> 3, which may reach 2^32 - 1. Field numbers no .proto can declare
 * (above 2^29 - 1, or 0 written in more than one byte) are unknown fields to
 * protobuf-c, which keeps them, so they are tags here too. */
static int read_tag(const uint8_t *p, size_t len, size_t *off, uint32_t *field, unsigned *wt)
{
    uint64_t r = 0;
    if (*off >= len || p[*off] < 8)
        return -EBADMSG;
    for (unsigned i = 0; i < 5 && *off < len; i++) {
        uint8_t b = p[(*off)++];
        r |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *field = (uint32_t)(r >> 3);
            *wt = (unsigned)(r & 7);
            return 0;
        }
    }
    return -EBADMSG;
}

static int check(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, unsigned depth, unsigned max_depth)
{
    size_t off = 0;

    if (depth > max_depth)
        return -ELOOP;
    while (off < len) {
        uint64_t v;
        uint32_t field;
        unsigned wt;
        if (read_tag(p, len, &off, &field, &wt))
            return -EBADMSG;
        switch (wt) {
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
            const ProtobufCFieldDescriptor *f = d ? protobuf_c_message_descriptor_get_field(d, field) : NULL;
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

int vrpc_pb_check_depth(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, unsigned max_depth)
{
    return check(d, buf, len, 1, max_depth ? max_depth : VRPC_PB_DEFAULT_MAX_DEPTH);
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

int vrpc_pb_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, unsigned max_depth,
                   struct vrpc_arena *a, ProtobufCMessage **out)
{
    int rc;
    if ((rc = vrpc_pbflat_unpack(d, buf, len, 0, a, out)) != VRPC_PBFLAT_FALLBACK)
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

/* Finds the big values: one walk over the top level of buf. false if it is
 * malformed (left to the plain unpack to refuse); else big[0..*nbig) and the
 * bytes the compact copy saves, *cut. */
static bool find_big(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, struct big *big,
                     unsigned *nbig, size_t *cut)
{
    size_t off = 0;
    while (off < len) {
        size_t tag = off;
        uint64_t t, v;
        if (read_varint(buf, len, &off, &t))
            return false;
        uint32_t field = (uint32_t)(t >> 3);
        for (unsigned i = 0; i < *nbig; i++)
            if (big[i].f->id == field)
                big[i].last = false;
        switch (t & 7) {
        case 0:
            if (read_varint(buf, len, &off, &v))
                return false;
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
                return false;
            const ProtobufCFieldDescriptor *f =
                v >= VRPC_PB_REF_MIN && *nbig < MAX_BIG && field > 0 && field <= 0x1fffffff
                    ? protobuf_c_message_descriptor_get_field(d, field)
                    : NULL;
            if (referable(f)) {
                big[(*nbig)++] =
                    (struct big){.f = f, .tag = tag, .lenpos = lenpos, .data = off, .len = (size_t)v, .last = true};
                *cut += off - lenpos + (size_t)v - 1; /* the value and its length become one 0 byte */
            }
            off += (size_t)v;
            break;
        }
        default:
            return false;
        }
    }
    return off == len;
}

/* Unpacks a compact copy of buf (everything but the big values, each now
 * empty, clen bytes), then points the big values into buf. */
static int unpack_compact(const ProtobufCMessageDescriptor *d, uint8_t *buf, size_t len, size_t clen,
                          const struct big *big, unsigned nbig, struct vrpc_arena *a, ProtobufCMessage **out)
{
    size_t at = 0, from = 0;
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

int vrpc_pb_unpack_ref(const ProtobufCMessageDescriptor *d, uint8_t *buf, size_t len, unsigned max_depth,
                       struct vrpc_arena *a, ProtobufCMessage **out)
{
    struct big big[MAX_BIG];
    unsigned nbig = 0;
    size_t cut = 0;
    int rc;

    if ((rc = vrpc_pbflat_unpack(d, buf, len, VRPC_PB_REF_MIN, a, out)) != VRPC_PBFLAT_FALLBACK)
        return rc;
    if (!find_big(d, buf, len, big, &nbig, &cut) || !nbig)
        return vrpc_pb_unpack(d, buf, len, max_depth, a, out);
    rc = may_nest(d) ? vrpc_pb_check_depth(d, buf, len, max_depth) : 0;
    if (rc)
        return rc;
    return unpack_compact(d, buf, len, len - cut, big, nbig, a, out);
}

size_t vrpc_pb_packed_size(const ProtobufCMessage *msg)
{
    size_t n = vrpc_pbflat_size(msg);
    return n != (size_t)-1 ? n : protobuf_c_message_get_packed_size(msg);
}

long vrpc_pb_size(const ProtobufCMessage *msg, size_t cap)
{
    size_t n = vrpc_pb_packed_size(msg);
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
    size_t n = vrpc_pbflat_pack(msg, out);
    return n != (size_t)-1 ? n : protobuf_c_message_pack(msg, out);
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

int vrpc_pb_pack_gather(const ProtobufCMessage *msg, size_t min_ref, uint8_t *buf, size_t cap, struct vrpc_pb_gather *g)
{
    struct gbuf b = {.base = {.append = gather_append}, .g = g, .buf = buf, .cap = buf ? cap : 0};
    memset(g, 0, sizeof(*g));
    gather_candidates(&b, msg, min_ref ? min_ref : 1);
    protobuf_c_message_pack_to_buffer(msg, &b.base);
    return g->err;
}
