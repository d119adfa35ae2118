/* The flat codec (rpc/pbflat.c) against protobuf-c 1.4.1, differentially,
 * over the flat types of the test protos (All2: proto2 required, optional and
 * defaults; All3: proto3, every scalar type; EchoRequest, EchoReply). The
 * first input byte picks the type and the mode:
 *  - unpack: the rest is a message: vrpc_pb_unpack and protobuf-c accept
 *    and refuse alike, decode the same fields, pack back to the same bytes;
 *  - pack: the rest feeds pbc_fill, which sets every field (in-memory states
 *    no decoder produces: bools of 2..255, strings NULL or the default
 *    pointer, has_ flags off over non-zero values): vrpc_pb_size and
 *    vrpc_pb_pack_sized give protobuf-c's size and bytes, which then unpack
 *    alike.
 * The comparisons are tests/rpc/pb_compare.c's, shared with test_pbflat. */
#include <errno.h>
#include <string.h>
#include "fuzz_common.h"
#include "pb_compare.h"
#include "pb_flat2.pb-c.h"
#include "pb_flat3.pb-c.h"
#include "rpc/pbflat.h"
#include "rpc_test.pb-c.h"

static const ProtobufCMessageDescriptor *const types[] = {
    &vrpcflat2__all2__descriptor,
    &vrpcflat3__all3__descriptor,
    &vrpctest__echo_request__descriptor,
    &vrpctest__echo_reply__descriptor,
};
#define NTYPES (sizeof(types) / sizeof(types[0]))

struct src {
    const uint8_t *p;
    size_t n;
};

/* The next 8 input bytes (zeroes once it runs out). */
static uint64_t next(void *ctx)
{
    struct src *s = ctx;
    uint64_t v = 0;
    size_t k = s->n < 8 ? s->n : 8;
    memcpy(&v, s->p, k);
    s->p += k;
    s->n -= k;
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct vrpc_arena a;
    static bool init;
    if (!init) {
        vrpc_arena_init(&a, 4096, 1 << 24);
        for (unsigned t = 0; t < NTYPES; t++)
            FUZZ_CHECK(vrpc_pbflat_type(types[t]), "%s is not flat", types[t]->short_name);
        init = true;
    }
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *d = types[data[0] % NTYPES];
    bool pack = data[0] & 0x80, accepted, looped;
    const char *why;

    if (!pack) {
        why = pbc_unpack_both(d, data + 1, size - 1, &a, &accepted, &looped);
        FUZZ_CHECK(!why, "%s: unpack: %s", d->short_name, why);
        FUZZ_CHECK(!looped, "a flat type cannot nest");
        return 0;
    }
    _Alignas(16) char mem[1024];
    ProtobufCMessage *m = (ProtobufCMessage *)mem;
    struct src s = {data + 1, size - 1};
    FUZZ_CHECK(d->sizeof_message <= sizeof mem, "message too big for the harness");
    d->message_init(m);
    pbc_fill(m, next, &s);
    if (d == &vrpcflat2__all2__descriptor && !((Vrpcflat2__All2 *)m)->r_str)
        ((Vrpcflat2__All2 *)m)->r_str = "req"; /* protobuf-c cannot pack a NULL required string */
    why = pbc_pack_both(m);
    FUZZ_CHECK(!why, "%s: pack: %s", d->short_name, why);
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n + 1);
    protobuf_c_message_pack(m, buf);
    why = pbc_unpack_both(d, buf, n, &a, &accepted, &looped);
    FUZZ_CHECK(!why && accepted, "%s: unpack of a packed message: %s", d->short_name, why ? why : "refused");
    free(buf);
    return 0;
}
